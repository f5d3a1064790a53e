//! Routes each row to its tenant's plugin instance and runs the guest calls off the async
//! reactor. One Store per tenant: tenants never share an instance, even when they share a file.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::breaker::{CircuitBreaker, Gate, Transition};

use super::component::LoadedPlugin;
use super::engine::PluginEngine;
use super::instance::TenantInstance;
use super::limits::Limits;
use super::{PluginError, RowResult, RowTransformer, TransformFailure};
use crate::config::{Config, config_pairs, plugin_cache_dir};
use crate::outbox::{OutboxRow, TenantId};

/// Everything needed to (re)create a tenant's instance.
struct TenantTemplate {
    plugin: Arc<LoadedPlugin>,
    config: Vec<(String, String)>,
    limits: Limits,
}

/// A tenant's instance slot; `None` after a trap until the next row needs it.
struct TenantSlot {
    tenant: TenantId,
    template: Arc<TenantTemplate>,
    instance: Option<TenantInstance>,
    /// Shared with the router so the claim can skip paused tenants without waiting for this
    /// slot's lock (held while a guest call runs).
    breaker: Arc<Mutex<CircuitBreaker>>,
}

impl TenantSlot {
    fn new(
        tenant: TenantId,
        template: Arc<TenantTemplate>,
        instance: Option<TenantInstance>,
    ) -> Self {
        let limits = &template.limits;
        let breaker = CircuitBreaker::new(limits.breaker_failures, limits.breaker_cooldown);
        Self {
            tenant,
            template,
            instance,
            breaker: Arc::new(Mutex::new(breaker)),
        }
    }

    /// Runs a row unless the tenant is paused, and feeds the outcome to the breaker.
    fn transform(&mut self, row: &OutboxRow) -> RowResult {
        let now = Instant::now();
        if let Gate::Paused(until) = lock(&self.breaker).gate(now) {
            return Err(TransformFailure::Paused {
                tenant: self.tenant.clone(),
                remaining: until - now,
            });
        }
        let result = self.run(row);
        let mut breaker = lock(&self.breaker);
        let transition = match &result {
            Ok(_) => breaker.record_success(),
            Err(_) => breaker.record_failure(Instant::now()),
        };
        match transition {
            Transition::Opened => tracing::error!(
                tenant = %self.tenant,
                cooldown = ?self.template.limits.breaker_cooldown,
                "circuit breaker opened: tenant paused after repeated plugin failures"
            ),
            Transition::Closed => {
                tracing::warn!(tenant = %self.tenant, "circuit breaker closed: tenant resumed")
            }
            Transition::None => {}
        }
        result
    }

    fn run(&mut self, row: &OutboxRow) -> RowResult {
        if self.instance.is_none() {
            let t = &self.template;
            let instance = TenantInstance::create(&t.plugin, &self.tenant, &t.config, &t.limits)
                .map_err(|e| TransformFailure::Unavailable(e.to_string()))?;
            self.instance = Some(instance);
        }
        let Some(instance) = self.instance.as_mut() else {
            return Err(TransformFailure::Unavailable("instance missing".into()));
        };
        let result = instance.transform(row);
        if let Err(TransformFailure::Trapped(reason)) = &result {
            // The Store is poisoned after a trap: discard it, re-create on the next row.
            tracing::warn!(tenant = %self.tenant, row = %row.id, error.type = "trap", %reason,
                "plugin trapped; discarding the tenant's instance");
            self.instance = None;
        }
        result
    }
}

type SharedSlot = Arc<Mutex<TenantSlot>>;

/// The plugin runtime of `sluice run`: tenant → plugin mapping plus live instances.
pub struct PluginRouter {
    /// Template for tenants without their own `[tenants.<name>]` entry.
    default: Mutex<Option<Arc<TenantTemplate>>>,
    slots: Mutex<HashMap<TenantId, SharedSlot>>,
    engine: Arc<PluginEngine>,
    cache_dir: Option<PathBuf>,
    /// What each plugin file looked like when it was loaded, to notice replacements.
    files: Mutex<HashMap<PathBuf, Option<FileStamp>>>,
    breakers: Mutex<HashMap<TenantId, Arc<Mutex<CircuitBreaker>>>>,
}

impl PluginRouter {
    /// Loads every plugin file named in `config` (each file once) and creates and configures
    /// the instances of every configured tenant, so a broken plugin or a rejected config stops
    /// `sluice run` before it claims anything.
    pub fn from_config(config: &Config) -> Result<Self, PluginError> {
        let engine = PluginEngine::new()?;
        let cache_dir = plugin_cache_dir(config.plugins.cache_dir.as_deref());
        let mut files: HashMap<PathBuf, Arc<LoadedPlugin>> = HashMap::new();
        let mut load = |path: &PathBuf| -> Result<Arc<LoadedPlugin>, PluginError> {
            if let Some(p) = files.get(path) {
                return Ok(Arc::clone(p));
            }
            let plugin = Arc::new(LoadedPlugin::load_cached(
                &engine,
                path,
                cache_dir.as_deref(),
            )?);
            files.insert(path.clone(), Arc::clone(&plugin));
            Ok(plugin)
        };
        let limits_err = |key: String| {
            move |message: String| PluginError::Config {
                key: key.clone(),
                message,
            }
        };

        let default_spec = config.plugins.default.as_ref();
        let default = match default_spec {
            Some(spec) => Some(Arc::new(TenantTemplate {
                plugin: load(&spec.path)?,
                config: config_pairs(&spec.config),
                limits: Limits::resolve(&spec.limits())
                    .map_err(limits_err("plugins.default".into()))?,
            })),
            None => None,
        };

        let mut slots = HashMap::new();
        for (name, tenant) in &config.tenants {
            let default_limits = default_spec.map(|s| s.limits()).unwrap_or_default();
            let path = match (&tenant.path, default_spec) {
                (Some(p), _) => p,
                (None, Some(spec)) => &spec.path,
                (None, None) => {
                    return Err(PluginError::Config {
                        key: format!("tenants.{name}.path"),
                        message: "missing and no [plugins.default]".into(),
                    });
                }
            };
            let empty = BTreeMap::new();
            let table = tenant
                .config
                .as_ref()
                .or(default_spec.map(|s| &s.config))
                .unwrap_or(&empty);
            let template = Arc::new(TenantTemplate {
                plugin: load(path)?,
                config: config_pairs(table),
                limits: Limits::resolve(&tenant.limits().or(&default_limits))
                    .map_err(limits_err(format!("tenants.{name}")))?,
            });
            let id = TenantId(name.clone());
            slots.insert(id.clone(), new_slot(id, template)?);
        }
        if let Some(template) = &default {
            let id = TenantId(TenantId::DEFAULT.to_owned());
            if !slots.contains_key(&id) {
                slots.insert(id.clone(), new_slot(id, Arc::clone(template))?);
            }
        }
        let breakers = slots
            .iter()
            .map(|(id, slot): (&TenantId, &TenantSlot)| (id.clone(), Arc::clone(&slot.breaker)))
            .collect();
        let slots = slots
            .into_iter()
            .map(|(id, slot)| (id, Arc::new(Mutex::new(slot))))
            .collect();
        let files = files
            .keys()
            .map(|path| (path.clone(), FileStamp::of(path)))
            .collect();
        Ok(Self {
            default: Mutex::new(default),
            slots: Mutex::new(slots),
            breakers: Mutex::new(breakers),
            engine,
            cache_dir,
            files: Mutex::new(files),
        })
    }

    fn slot(&self, tenant: &TenantId) -> Option<SharedSlot> {
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots.get(tenant) {
            return Some(Arc::clone(slot));
        }
        // A tenant seen for the first time gets its own instance of the default plugin,
        // created lazily by its first row.
        let template = Arc::clone(lock(&self.default).as_ref()?);
        let slot = TenantSlot::new(tenant.clone(), template, None);
        lock(&self.breakers).insert(tenant.clone(), Arc::clone(&slot.breaker));
        let slot = Arc::new(Mutex::new(slot));
        slots.insert(tenant.clone(), Arc::clone(&slot));
        Some(slot)
    }
}

/// Identity of a file's content as far as cheap metadata tells: replacing a file (new inode),
/// or rewriting it (new mtime or size), changes the stamp.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    inode: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl FileStamp {
    fn of(path: &std::path::Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(Self {
            inode: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

impl PluginRouter {
    /// Reloads plugin files that changed on disk (all of them with `force`, as on SIGHUP).
    /// A new version is compiled and instantiated and configured for every tenant using it
    /// before anything is swapped; if any step fails the old version keeps running and the
    /// reason is logged. Tenants switch between two rows, never within one. Returns how many
    /// files were swapped.
    pub fn reload(&self, force: bool) -> usize {
        let changed: Vec<(PathBuf, Option<FileStamp>)> = lock(&self.files)
            .iter()
            .filter_map(|(path, old)| {
                let now = FileStamp::of(path);
                (force || now != *old).then(|| (path.clone(), now))
            })
            .collect();
        let mut swapped = 0;
        for (path, stamp) in changed {
            // Record the stamp first: a broken file is reported once, not every second.
            lock(&self.files).insert(path.clone(), stamp);
            match self.reload_file(&path) {
                Ok(tenants) => {
                    swapped += 1;
                    tracing::info!(plugin = %path.display(), tenants, "plugin reloaded");
                }
                Err(e) => tracing::error!(plugin = %path.display(), error = %e,
                    "new plugin version failed to load; the old version keeps running"),
            }
        }
        swapped
    }

    fn reload_file(&self, path: &std::path::Path) -> Result<usize, PluginError> {
        let plugin = Arc::new(LoadedPlugin::load_cached(
            &self.engine,
            path,
            self.cache_dir.as_deref(),
        )?);
        let renewed = |old: &TenantTemplate| {
            Arc::new(TenantTemplate {
                plugin: Arc::clone(&plugin),
                config: old.config.clone(),
                limits: old.limits.clone(),
            })
        };
        // Prepare every affected tenant's new instance before swapping any.
        let slots: Vec<SharedSlot> = lock(&self.slots).values().cloned().collect();
        let mut prepared = Vec::new();
        for slot in &slots {
            let guard = lock(slot);
            if guard.template.plugin.path() != path {
                continue;
            }
            let template = renewed(&guard.template);
            let instance =
                TenantInstance::create(&plugin, &guard.tenant, &template.config, &template.limits)?;
            prepared.push((Arc::clone(slot), template, instance));
        }
        let count = prepared.len();
        for (slot, template, instance) in prepared {
            let mut guard = lock(&slot);
            guard.template = template;
            guard.instance = Some(instance);
        }
        let mut default = lock(&self.default);
        if let Some(old) = default.as_ref().filter(|t| t.plugin.path() == path) {
            *default = Some(renewed(old));
        }
        Ok(count)
    }
}

fn new_slot(tenant: TenantId, template: Arc<TenantTemplate>) -> Result<TenantSlot, PluginError> {
    let instance = TenantInstance::create(
        &template.plugin,
        &tenant,
        &template.config,
        &template.limits,
    )?;
    Ok(TenantSlot::new(tenant, template, Some(instance)))
}

/// A poisoned lock only means another thread panicked mid-call; the slot data is still
/// consistent (at worst an instance that will trap again and be replaced).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RowTransformer for PluginRouter {
    fn paused_tenants(&self) -> Vec<TenantId> {
        let now = Instant::now();
        lock(&self.breakers)
            .iter()
            .filter(|(_, b)| matches!(lock(b).gate(now), Gate::Paused(_)))
            .map(|(id, _)| id.clone())
            .collect()
    }

    async fn transform(&self, rows: Arc<[OutboxRow]>) -> Vec<RowResult> {
        let mut results: Vec<Option<RowResult>> = (0..rows.len()).map(|_| None).collect();
        let mut groups: BTreeMap<TenantId, Vec<usize>> = BTreeMap::new();
        for (index, row) in rows.iter().enumerate() {
            groups.entry(row.tenant.clone()).or_default().push(index);
        }
        let mut tasks = Vec::with_capacity(groups.len());
        for (tenant, group) in groups {
            let Some(slot) = self.slot(&tenant) else {
                for index in group {
                    results[index] = Some(Err(TransformFailure::NoPlugin(tenant.clone())));
                }
                continue;
            };
            let indices = group.clone();
            let rows = Arc::clone(&rows);
            // Guest calls are synchronous CPU work: keep them off the reactor threads.
            let task = tokio::task::spawn_blocking(move || {
                let mut slot = lock(&slot);
                group
                    .into_iter()
                    .map(|index| slot.transform(&rows[index]))
                    .collect::<Vec<_>>()
            });
            tasks.push((indices, task));
        }
        for (indices, task) in tasks {
            match task.await {
                Ok(outputs) => {
                    for (index, output) in indices.into_iter().zip(outputs) {
                        results[index] = Some(output);
                    }
                }
                Err(e) => {
                    for index in indices {
                        results[index] = Some(Err(TransformFailure::Unavailable(format!(
                            "plugin worker failed: {e}"
                        ))));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(TransformFailure::Unavailable("no result".into()))))
            .collect()
    }
}
