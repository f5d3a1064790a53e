//! Routes each row to its tenant's plugin slot and runs the plugin calls off the async
//! reactor. One Store per tenant: tenants never share an instance, even when they share a file.
//! Slots are in [`super::slot`]; this module owns the tenant → slot map, start-up and hot
//! reload.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::component::LoadedPlugin;
use super::engine::PluginEngine;
use super::limits::Limits;
use super::slot::{
    PluginCode, Runner, SlotStatus, TenantSlot, TenantTemplate, lock, lock_unless_stalled,
};
use super::{PluginError, RowResult, RowTransformer, TransformFailure};
use crate::config::{Config, PluginSource, config_pairs, plugin_cache_dir};
use crate::outbox::{OutboxRow, TenantId};

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
    /// Each slot's status, readable while the slot's lock is held by a running call.
    statuses: Mutex<HashMap<TenantId, Arc<SlotStatus>>>,
}

impl PluginRouter {
    /// Loads every plugin file named in `config` (each file once) and creates and configures
    /// the instances of every configured tenant, so a broken plugin or a rejected config stops
    /// `sluice run` before it claims anything.
    pub fn from_config(config: &Config) -> Result<Self, PluginError> {
        let engine = PluginEngine::new()?;
        let cache_dir = plugin_cache_dir(config.plugins.cache_dir.as_deref());
        let mut files: HashMap<PathBuf, Arc<LoadedPlugin>> = HashMap::new();
        let mut load = |source: &PluginSource| -> Result<PluginCode, PluginError> {
            let path = match source {
                PluginSource::Builtin(name) => return Ok(PluginCode::Builtin(name.clone())),
                PluginSource::Wasm(path) => path,
            };
            if let Some(p) = files.get(path) {
                return Ok(PluginCode::Wasm(Arc::clone(p)));
            }
            let plugin = Arc::new(LoadedPlugin::load_cached(
                &engine,
                path,
                cache_dir.as_deref(),
            )?);
            files.insert(path.clone(), Arc::clone(&plugin));
            Ok(PluginCode::Wasm(plugin))
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
                code: load(&spec.source().ok_or_else(|| PluginError::Config {
                    key: "plugins.default".into(),
                    message: "needs `path` or `builtin`".into(),
                })?)?,
                config: config_pairs(&spec.config.clone().unwrap_or_default()),
                limits: Limits::resolve(&spec.limits())
                    .map_err(limits_err("plugins.default".into()))?,
            })),
            None => None,
        };

        let mut slots = HashMap::new();
        for (name, tenant) in &config.tenants {
            let default_limits = default_spec.map(|s| s.limits()).unwrap_or_default();
            let Some(source) = tenant
                .source()
                .or_else(|| default_spec.and_then(|s| s.source()))
            else {
                return Err(PluginError::Config {
                    key: format!("tenants.{name}.path"),
                    message: "missing and no [plugins.default]".into(),
                });
            };
            let empty = BTreeMap::new();
            let table = tenant
                .config
                .as_ref()
                .or(default_spec.and_then(|s| s.config.as_ref()))
                .unwrap_or(&empty);
            let template = Arc::new(TenantTemplate {
                code: load(&source)?,
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
        let statuses = slots
            .iter()
            .map(|(id, slot): (&TenantId, &TenantSlot)| (id.clone(), Arc::clone(&slot.status)))
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
            statuses: Mutex::new(statuses),
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
        lock(&self.statuses).insert(tenant.clone(), Arc::clone(&slot.status));
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
    fn status(&self, tenant: &TenantId) -> Option<Arc<SlotStatus>> {
        lock(&self.statuses).get(tenant).cloned()
    }

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
                code: PluginCode::Wasm(Arc::clone(&plugin)),
                config: old.config.clone(),
                limits: old.limits.clone(),
            })
        };
        // Prepare every affected tenant's new instance before swapping any.
        let slots: Vec<SharedSlot> = lock(&self.slots).values().cloned().collect();
        let mut prepared = Vec::new();
        for slot in &slots {
            let guard = lock(slot);
            if guard.template.path() != Some(path) {
                continue;
            }
            let template = renewed(&guard.template);
            let runner = Runner::create(&template, &guard.tenant)?;
            prepared.push((Arc::clone(slot), template, runner));
        }
        let count = prepared.len();
        for (slot, template, runner) in prepared {
            lock(&slot).replace(template, runner);
        }
        let mut default = lock(&self.default);
        if let Some(old) = default.as_ref().filter(|t| t.path() == Some(path)) {
            *default = Some(renewed(old));
        }
        Ok(count)
    }
}

fn new_slot(tenant: TenantId, template: Arc<TenantTemplate>) -> Result<TenantSlot, PluginError> {
    let runner = Runner::create(&template, &tenant)?;
    Ok(TenantSlot::new(tenant, template, Some(runner)))
}

impl RowTransformer for PluginRouter {
    fn paused_tenants(&self) -> Vec<TenantId> {
        let now = Instant::now();
        lock(&self.statuses)
            .iter()
            .filter(|(_, status)| status.unavailable(now))
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
            let status = self.status(&tenant);
            // Guest calls are synchronous CPU work: keep them off the reactor threads.
            let task = tokio::task::spawn_blocking(move || {
                let group: Vec<&OutboxRow> = group.iter().map(|&i| &rows[i]).collect();
                match status
                    .as_deref()
                    .map_or_else(|| Some(lock(&slot)), |s| lock_unless_stalled(&slot, s))
                {
                    Some(mut slot) => slot.run_group(&group),
                    None => group
                        .iter()
                        .map(|_| {
                            Err(TransformFailure::Deferred(
                                "the tenant's plugin is busy with a slow call in another batch"
                                    .into(),
                            ))
                        })
                        .collect(),
                }
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
