//! Routes each row to its tenant and runs the plugin calls off the async reactor. One
//! `wasmtime::Store` per tenant: tenants never share an instance, even when they share a file.
//! A tenant is a [`Tenant`] (see [`super::tenant`]); this module owns the tenant map, start-up
//! (with quarantine of tenants whose plugin cannot start), the cap on instances of tenants
//! without their own entry, and the status read API. Hot reload is in [`super::reload`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::encoding::MessageFormats;
use crate::model::{OutboxRow, TenantId};
use crate::model::{RowResult, TransformFailure};
use crate::plugin::budgets::InstanceBudgets;
use crate::plugin::keys::KeyScopes;
use crate::plugin::lanes::{self, Group, Ran};
use crate::plugin::settings::{
    LoadMode, PluginSource, PluginSpec, PluginsSettings, plugin_cache_dir,
};
use crate::plugin::supply::PluginSupply;
use crate::plugin::tenant::quota::InstanceQuota;
use crate::plugin::tenant::runner::TenantRunner;
use crate::plugin::tenant::status::{PluginInstances, TenantStatus};
use crate::plugin::tenant::template::{PluginCode, PluginInstance, TenantTemplate};
use crate::plugin::tenant::watch::Watch;
use crate::plugin::tenant::{Tenant, lock};
use crate::plugin::wasm::cache::CompileCache;
use crate::plugin::wasm::component::LoadedPlugin;
use crate::plugin::wasm::engine::{PluginEngine, max_pooled_instances, slot_reservation};
use crate::plugin::wasm::host_api::TenantShared;
use crate::plugin::{PluginError, RowTransformer, metrics};
use crate::problem::Problem;
use crate::telemetry::Metrics;
use crate::text::{MAX_LOGGED, bounded};

/// The tenants the router knows; `unconfigured` counts those without an entry.
#[derive(Default)]
struct TenantMap {
    map: HashMap<TenantId, Arc<Tenant>>,
    unconfigured: usize,
}

/// The plugin runtime of `sluice run`: tenant → plugin mapping plus live instances.
pub struct PluginRouter {
    /// Template for tenants without their own `[tenants.<name>]` entry.
    pub(super) default: Mutex<Option<Arc<TenantTemplate>>>,
    tenants: Mutex<TenantMap>,
    pub(super) engine: Arc<PluginEngine>,
    pub(super) cache: Option<CompileCache>,
    /// Fetches plugin files and OCI references and checks their signatures.
    /// Made anew when a live change brings keys of a section's own `trusted_keys`.
    supply: Mutex<Arc<PluginSupply>>,
    /// The keys of sections with their own `trusted_keys` the supply verifies with.
    pub(super) scoped_keys: Mutex<Vec<String>>,
    /// What each plugin file looked like when it was loaded, to notice replacements.
    pub(super) files: Mutex<HashMap<PathBuf, Option<FileStamp>>>,
    /// The budget for instances of tenants without their own entry.
    quota: Arc<InstanceQuota>,
    /// The budget for instances of tenants with their own entry (and rows without a tenant).
    pub(super) configured_quota: Arc<InstanceQuota>,
    /// The two budgets' sizes, and why (as written, or fit to the memory limit).
    budgets: InstanceBudgets,
    /// Advances once per batch; orders unconfigured tenants by last use.
    clock: AtomicU64,
    /// Where plugin calls are recorded, when metrics are on.
    metrics: OnceLock<Arc<Metrics>>,
    /// Blocking threads a batch's tenant groups run on (see [`lanes`]).
    lanes: usize,
    /// Which tenants claims leave out (see [`Watch`]).
    pub(super) watch: Arc<Watch>,
    /// `[plugins] load`: whether configured tenants' plugins wait for their first row.
    pub(super) load: LoadMode,
    /// Tenants whose plugin waits to be compiled ([`PluginCode::Pending`]) and was asked for
    /// by a row, and those being compiled now: left out of claims until they are loaded.
    pub(super) wanted: Mutex<Wanted>,
    /// Wakes the loader ([`PluginRouter::loads_wanted`]) when a row asks for a plugin.
    pub(super) loads: tokio::sync::Notify,
    /// Tenants whose rows wait, and why: removed from the configuration while running, or
    /// defined by a tenant file that does not check (and no version of theirs runs).
    pub(super) held: Mutex<BTreeMap<TenantId, String>>,
    /// Tenants running an older version because their latest change did not apply, and why.
    pub(super) kept: Mutex<BTreeMap<TenantId, String>>,
    /// The plugin settings applied last (to tell what a live change changes).
    pub(super) applied: Mutex<AppliedSpecs>,
}

/// The plugin settings a router runs with, as last applied.
#[derive(Debug, Clone)]
pub(crate) struct AppliedSpecs {
    pub(super) settings: PluginsSettings,
    pub(super) tenants: BTreeMap<String, PluginSpec>,
}

impl AppliedSpecs {
    pub(crate) fn new(plugins: &PluginsSettings, tenants: &BTreeMap<String, PluginSpec>) -> Self {
        Self {
            settings: plugins.clone(),
            tenants: tenants.clone(),
        }
    }

    /// Tenant `name`'s entry completed from `[plugins.default]`.
    pub(super) fn effective(&self, name: &str) -> Option<PluginSpec> {
        let spec = self.tenants.get(name)?;
        Some(spec.inherit(self.settings.default.as_ref()))
    }
}

/// Tenants whose plugin is to be compiled, and those being compiled now.
#[derive(Debug, Default)]
pub(super) struct Wanted {
    pub(super) queued: BTreeSet<TenantId>,
    pub(super) loading: BTreeSet<TenantId>,
}

/// Identity of a file's content as far as cheap metadata tells: replacing a file (new inode),
/// or rewriting it (new mtime or size), changes the stamp. A plugin's stamp includes its
/// signature file's, so a signature deployed after its component still triggers a reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FileStamp {
    file: MetaStamp,
    signature: Option<MetaStamp>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct MetaStamp {
    inode: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl MetaStamp {
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

impl FileStamp {
    pub(super) fn of(path: &std::path::Path) -> Option<Self> {
        Some(Self {
            file: MetaStamp::of(path)?,
            signature: MetaStamp::of(&crate::plugin::supply::signature_file(path)),
        })
    }
}

/// The compile cache `[plugins]` asks for (`SLUICE_PLUGIN_CACHE_DIR` overrides the
/// directory); `None` when caching is off.
pub(super) fn compile_cache(plugins: &PluginsSettings) -> Option<CompileCache> {
    plugin_cache_dir(plugins.cache_dir.as_deref()).map(|dir| CompileCache {
        dir,
        max_bytes: plugins.cache_max_mb.saturating_mul(1024 * 1024),
    })
}

/// The largest `memory_mb` (in bytes) of `[plugins.default]` and every tenant: the engine's
/// memory slots are sized to it. Limits that do not resolve are reported later, per tenant.
fn largest_memory(plugins: &PluginsSettings, tenants: &BTreeMap<String, PluginSpec>) -> u64 {
    let default = plugins.default.as_ref();
    let specs = tenants.values().map(|t| t.inherit(default));
    default
        .cloned()
        .into_iter()
        .chain(specs)
        .filter_map(|spec| spec.resolved_limits().ok())
        .map(|limits| u64::try_from(limits.memory_bytes).unwrap_or(u64::MAX))
        .max()
        .unwrap_or(0)
}

/// The tenant name used to try a template that no tenant uses yet (`[plugins.default]` when
/// every tenant has its own entry).
pub(super) fn probe_shared() -> Arc<TenantShared> {
    TenantShared::new(TenantId::none())
}

impl PluginRouter {
    /// Loads every plugin file named in `config` (each file once) and creates and configures
    /// an instance for every configured tenant, keeping those that fit
    /// `configured_instances_memory_mb` (the others are created again by their tenant's first
    /// row). A tenant whose plugin fails to load, instantiate or configure is quarantined —
    /// logged, its rows left unclaimed, retried with back-off and on reload — and the others
    /// run; with `[plugins] strict_startup = true` the first such failure is returned instead
    /// (and `sluice run` refuses to start).
    pub fn from_settings(
        plugins: &PluginsSettings,
        tenants: &BTreeMap<String, PluginSpec>,
    ) -> Result<Self, PluginError> {
        let strict = plugins.strict_startup;
        let lazy = plugins.load == LoadMode::Lazy;
        // Every configured tenant's instance, its replacement during a reload, and the
        // instances of tenants without an entry — as far as the pool reaches. Past it, the
        // configured tenants' live instances are counted too, against half of what the
        // tenants without an entry leave (the other half for replacements), and idle ones
        // make room for busy ones as they do for the memory budget.
        let wanted = tenants
            .len()
            .saturating_add(1)
            .saturating_mul(2)
            .saturating_add(plugins.max_unconfigured_instances);
        let largest_memory = largest_memory(plugins, tenants);
        let max_pooled = max_pooled_instances(slot_reservation(largest_memory));
        let pooled = wanted.min(max_pooled as usize);
        let configured_cap = if pooled < wanted {
            pooled.saturating_sub(plugins.max_unconfigured_instances) / 2
        } else {
            usize::MAX
        };
        let engine =
            PluginEngine::with_memory(u32::try_from(pooled).unwrap_or(u32::MAX), largest_memory)?;
        let cache = compile_cache(plugins);
        let keys = KeyScopes::new(plugins, tenants)?;
        let supply = PluginSupply::new(
            &plugins.trusted_keys,
            &plugins.registries,
            cache.as_ref().map(|c| c.dir.as_path()),
        )?
        .with_scoped_keys(&plugins.trusted_keys, keys.scoped_entries())?
        .with_cache_max_bytes(cache.as_ref().map_or(0, |c| c.max_bytes));
        // Each file is loaded once; its tenants share the loaded (or broken) code.
        let mut files: HashMap<PathBuf, PluginCode> = HashMap::new();
        // `lazy`: a file not loaded yet waits for its tenant's first row.
        let mut load = |source: &PluginSource, lazy: bool| -> Result<PluginCode, PluginError> {
            let path = match source {
                PluginSource::Builtin(name) => return Ok(PluginCode::Builtin(name.clone())),
                PluginSource::Wasm(path) => path,
            };
            if let Some(code) = files.get(path) {
                return Ok(code.clone());
            }
            if lazy {
                return Ok(PluginCode::Pending(path.clone()));
            }
            let loaded = supply.fetch(path).and_then(|fetched| {
                LoadedPlugin::load_fetched(&engine, path, fetched, cache.as_ref())
            });
            let code = match loaded {
                Ok(plugin) => PluginCode::Wasm(Arc::new(plugin)),
                Err(e) if strict => return Err(e),
                Err(e) => {
                    // The reason is reported as the plugin's (`plugin <path>: <reason>`): keep
                    // the path out of it.
                    let reason = match &e {
                        PluginError::BadPlugin { message, .. } => message.clone(),
                        other => other.to_string(),
                    };
                    PluginCode::Broken {
                        path: path.clone(),
                        reason: bounded(&reason, MAX_LOGGED).into_owned(),
                    }
                }
            };
            files.insert(path.clone(), code.clone());
            Ok(code)
        };
        let limits_err = |key: String| move |message: String| Problem::new(key.clone(), message);

        let watch = Arc::new(Watch::default());
        let default_spec = plugins.default.as_ref();
        let default = match default_spec {
            Some(spec) => Some(Arc::new(
                TenantTemplate::new(
                    load(
                        &spec.source().ok_or_else(|| {
                            Problem::new("plugins.default", "needs `path` or `builtin`")
                        })?,
                        false,
                    )?,
                    spec.config_pairs(),
                    spec.resolved_limits()
                        .map_err(limits_err("plugins.default".into()))?,
                )
                .with_declared_formats(formats_of(spec, "plugins.default")?)
                .pinned(spec.pin())
                .signed_by(keys.for_default())
                .watched_by(&watch),
            )),
            None => None,
        };

        let budgets = InstanceBudgets::of_this_process(plugins);
        let configured_quota = InstanceQuota::new(
            configured_cap,
            budgets.configured_bytes(),
            format!(
                "of tenants with their own [tenants.<name>] entry \
                 (configured_instances_memory_mb = {})",
                budgets.configured_mb
            ),
        );
        let mut known = TenantMap::default();
        for (name, tenant) in tenants {
            let spec = tenant.inherit(default_spec);
            let Some(source) = spec.source() else {
                return Err(Problem::new(
                    format!("tenants.{name}.path"),
                    "missing and no [plugins.default]",
                )
                .into());
            };
            let template = Arc::new(
                TenantTemplate::new(
                    load(&source, lazy)?,
                    spec.config_pairs(),
                    spec.resolved_limits()
                        .map_err(limits_err(format!("tenants.{name}")))?,
                )
                .with_declared_formats(formats_of(&spec, &format!("tenants.{name}"))?)
                .pinned(spec.pin())
                .signed_by(keys.for_tenant(name, tenant))
                .watched_by(&watch),
            );
            let id = TenantId::named(name.as_str());
            let tenant = start_tenant(id.clone(), template, &configured_quota, &watch, strict)?;
            known.map.insert(id, tenant);
        }
        // Rows without a tenant run the default plugin: started now, so a broken one is
        // reported at start-up rather than on the first such row.
        if let Some(template) = &default {
            let none = TenantId::none();
            let tenant = start_tenant(
                none.clone(),
                Arc::clone(template),
                &configured_quota,
                &watch,
                strict,
            )?;
            known.map.insert(none, tenant);
        }
        // Every plugin is loaded and holds its cache files: prune what else passes the bound
        // (a lowered cache_max_mb, or entries other relays left).
        if let Some(cache) = &cache {
            cache.prune_now();
        }
        let files = files
            .keys()
            .map(|path| (path.clone(), FileStamp::of(path)))
            .collect();
        Ok(Self {
            default: Mutex::new(default),
            tenants: Mutex::new(known),
            engine,
            cache,
            supply: Mutex::new(Arc::new(supply)),
            scoped_keys: Mutex::new(keys.scoped_entries().to_vec()),
            files: Mutex::new(files),
            quota: InstanceQuota::new(
                plugins.max_unconfigured_instances,
                budgets.unconfigured_bytes(),
                format!(
                    "for tenants without their own [tenants.<name>] entry \
                     (max_unconfigured_instances = {}, unconfigured_instances_memory_mb = {})",
                    plugins.max_unconfigured_instances, budgets.unconfigured_mb
                ),
            ),
            configured_quota,
            budgets,
            clock: AtomicU64::new(0),
            metrics: OnceLock::new(),
            lanes: std::thread::available_parallelism().map_or(2, usize::from),
            watch,
            load: plugins.load,
            wanted: Mutex::default(),
            loads: tokio::sync::Notify::new(),
            held: Mutex::default(),
            kept: Mutex::default(),
            applied: Mutex::new(AppliedSpecs::new(plugins, tenants)),
        })
    }

    /// The instance memory budgets this router runs with, and why (logged at start).
    pub fn instance_budgets(&self) -> &InstanceBudgets {
        &self.budgets
    }

    /// Records plugin calls (time and outcome per tenant and plugin) into `metrics` from now
    /// on, and starts the series of every tenant with its own entry (and rows without a
    /// tenant) at 0.
    pub fn record_into(&self, metrics: Arc<Metrics>) {
        let plugins: Vec<(Arc<str>, String)> = self
            .tenant_statuses()
            .into_iter()
            .filter(|s| {
                s.configured && s.tenant.name().is_none_or(|n| metrics.tenants().has_own(n))
            })
            .map(|s| (metrics.tenant(&s.tenant), s.plugin))
            .collect();
        metrics
            .plugin
            .initialise(plugins.iter().map(|(t, p)| (Arc::clone(t), p.as_str())));
        let _ = self.metrics.set(metrics);
    }

    /// `tenant`, created (without an instance) when seen for the first time and it runs the
    /// default plugin.
    fn tenant(&self, id: &TenantId, tick: u64) -> Option<Arc<Tenant>> {
        let mut known = lock(&self.tenants);
        if let Some(tenant) = known.map.get(id) {
            tenant.touch(tick);
            return Some(Arc::clone(tenant));
        }
        // Created lazily by its first row; counted against `max_unconfigured_instances`.
        let template = Arc::clone(lock(&self.default).as_ref()?);
        let quota = Some(Arc::clone(&self.quota));
        let runner = TenantRunner::new(id.clone(), template, None, quota, Arc::clone(&self.watch));
        let tenant = Tenant::new(runner, false);
        tenant.touch(tick);
        known.map.insert(id.clone(), Arc::clone(&tenant));
        known.unconfigured += 1;
        Some(tenant)
    }

    /// Keeps the map of tenants without their own entry within `max_unconfigured_instances`:
    /// past it, the least recently used ones outside this batch lose their instance and —
    /// unless paused, quarantined or busy — their place in the map. (Instances are evicted
    /// on demand, when a tenant needs one: see [`InstanceQuota`].)
    fn forget_idle(&self, batch: &BTreeMap<TenantId, Vec<usize>>) {
        let cap = self.quota.cap();
        let mut known = lock(&self.tenants);
        if known.unconfigured <= cap {
            return;
        }
        let mut candidates: Vec<(u64, TenantId, Arc<Tenant>)> = known
            .map
            .iter()
            .filter(|(id, t)| !t.configured && !batch.contains_key(*id))
            .map(|(id, t)| (t.last_used(), id.clone(), Arc::clone(t)))
            .collect();
        candidates.sort_by_key(|(tick, _, _)| *tick);
        let now = Instant::now();
        for (_, id, tenant) in candidates {
            if known.unconfigured <= cap {
                break;
            }
            let Some(mut runner) = tenant.try_runner() else {
                continue; // busy in another batch
            };
            runner.drop_instance();
            // A tenant whose log budget is not full again is kept: forgotten, its next row
            // would bring a fresh budget (an evicted attacker's burst back).
            let keep = tenant.health.unavailable(now)
                || tenant.health.tripped()
                || !tenant.health.shared.log_budget_at_rest(now);
            drop(runner);
            if !keep {
                known.map.remove(&id);
                known.unconfigured -= 1;
            }
        }
    }

    /// Every tenant the router knows, with its state.
    pub fn tenant_statuses(&self) -> Vec<TenantStatus> {
        let now = Instant::now();
        let tenants: Vec<(TenantId, Arc<Tenant>)> = lock(&self.tenants)
            .map
            .iter()
            .map(|(id, t)| (id.clone(), Arc::clone(t)))
            .collect();
        let mut statuses: Vec<TenantStatus> = tenants
            .into_iter()
            .map(|(tenant, t)| {
                let template = t.health.template();
                TenantStatus {
                    tenant,
                    plugin: template.describe().to_owned(),
                    digest: template.digest().map(str::to_owned),
                    source: template.source().map(str::to_owned),
                    signer: template.signer().map(|s| s.to_string()),
                    version: template.version().map(str::to_owned),
                    configured: t.configured,
                    state: t.health.state(now),
                    instance: t.health.has_instance(),
                    counters: t.health.shared.counters(),
                    instantiations: t.health.instantiations.snapshot(),
                    limit_hits: t.health.limit_hits.snapshot(),
                }
            })
            .collect();
        statuses.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        statuses
    }

    /// Live instances of tenants without their own entry, and the cap.
    pub fn unconfigured_instances(&self) -> (usize, usize) {
        (self.quota.live(), self.quota.cap())
    }

    /// What the two instance budgets hold now.
    pub fn instances(&self) -> PluginInstances {
        PluginInstances {
            configured: self.configured_quota.usage(),
            unconfigured: self.quota.usage(),
        }
    }

    /// Tenant `id`, if the router knows it.
    pub(super) fn known(&self, id: &TenantId) -> Option<Arc<Tenant>> {
        lock(&self.tenants).map.get(id).cloned()
    }

    /// Puts a tenant with its own entry in the map, in place of the same tenant without one.
    pub(super) fn insert_configured(&self, id: TenantId, tenant: Arc<Tenant>) {
        let mut known = lock(&self.tenants);
        if let Some(old) = known.map.insert(id, tenant)
            && !old.configured
        {
            known.unconfigured -= 1;
        }
    }

    /// Takes tenant `id` out of the map.
    pub(super) fn forget(&self, id: &TenantId) -> Option<Arc<Tenant>> {
        let mut known = lock(&self.tenants);
        let old = known.map.remove(id)?;
        if !old.configured {
            known.unconfigured -= 1;
        }
        Some(old)
    }

    /// Fetches plugin files and OCI references and checks their signatures.
    pub(super) fn supply(&self) -> Arc<PluginSupply> {
        Arc::clone(&lock(&self.supply))
    }

    /// Replaces the supply (see [`PluginRouter::apply`]).
    pub(super) fn set_supply(&self, supply: PluginSupply, scoped: Vec<String>) {
        *lock(&self.supply) = Arc::new(supply);
        *lock(&self.scoped_keys) = scoped;
    }

    /// Every tenant the router knows.
    pub(super) fn tenants(&self) -> Vec<Arc<Tenant>> {
        lock(&self.tenants).map.values().cloned().collect()
    }
}

/// Creates a configured tenant and its instance — kept while `quota` has room, an idle one
/// making way otherwise — or quarantines it (strict: fails). Every configured tenant's
/// `configure` runs once here, so a config its plugin rejects is reported at start-up even
/// when the instance is not kept.
pub(super) fn start_tenant(
    id: TenantId,
    template: Arc<TenantTemplate>,
    quota: &Arc<InstanceQuota>,
    watch: &Arc<Watch>,
    strict: bool,
) -> Result<Arc<Tenant>, PluginError> {
    let runner = TenantRunner::new(
        id.clone(),
        Arc::clone(&template),
        None,
        Some(Arc::clone(quota)),
        Arc::clone(watch),
    );
    let tenant = Tenant::new(runner, true);
    if template.pending() {
        return Ok(tenant); // compiled and configured on its first row
    }
    let created = PluginInstance::create(&template, &tenant.health.shared);
    match created {
        Ok(instance) => {
            tenant.runner().install_if_empty(instance);
            tenant.enlist_if_live();
        }
        // Not the plugin's fault: its first row makes room.
        Err(PluginError::PoolExhausted { .. }) => {}
        Err(e) => quarantine_or_fail(id.as_str(), &template, e, strict)?,
    }
    Ok(tenant)
}

fn quarantine_or_fail(
    tenant: &str,
    template: &TenantTemplate,
    error: PluginError,
    strict: bool,
) -> Result<(), PluginError> {
    if strict {
        return Err(error);
    }
    let reason = bounded(&error.to_string(), MAX_LOGGED).into_owned();
    tracing::error!(tenant = %bounded(tenant, MAX_LOGGED), plugin = %template.describe(), reason = %reason,
        "tenant quarantined: its plugin failed to start; its rows wait, the other tenants run \
         (retried with back-off and on reload)");
    template.quarantine.failed(reason, Instant::now());
    Ok(())
}

impl RowTransformer for PluginRouter {
    fn paused_tenants(&self) -> Vec<TenantId> {
        let mut paused = self.watch.unavailable(Instant::now(), || {
            let tenants = lock(&self.tenants);
            let all = tenants.map.iter();
            all.map(|(id, t)| (id.clone(), Arc::clone(&t.health)))
                .collect()
        });
        paused.extend(lock(&self.held).keys().cloned());
        let wanted = lock(&self.wanted);
        paused.extend(wanted.queued.iter().chain(&wanted.loading).cloned());
        paused
    }

    fn plugin_of(&self, tenant: &TenantId) -> Option<String> {
        let known = self.known(tenant)?;
        Some(known.health.template().describe().to_owned())
    }

    fn record_publish(&self, tenant: &TenantId, delivered: usize, refused: usize) {
        let known = lock(&self.tenants).map.get(tenant).cloned();
        if let Some(known) = known {
            known.health.record_publish(tenant, delivered, refused);
        }
    }

    async fn transform(&self, rows: Arc<[OutboxRow]>) -> Vec<RowResult> {
        let tick = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        let mut results: Vec<Option<RowResult>> = (0..rows.len()).map(|_| None).collect();
        let mut groups: BTreeMap<TenantId, Vec<usize>> = BTreeMap::new();
        for (index, row) in rows.iter().enumerate() {
            groups.entry(row.tenant.clone()).or_default().push(index);
        }
        let mut routed = Vec::with_capacity(groups.len());
        for (tenant, group) in &groups {
            let waits = lock(&self.held).get(tenant).cloned();
            if let Some(why) = waits {
                for &index in group {
                    results[index] = Some(Err(TransformFailure::Deferred(why.clone())));
                }
                continue;
            }
            match self.tenant(tenant, tick) {
                Some(known) if known.health.template().pending() => {
                    self.want(tenant);
                    let why = format!("tenant {tenant}'s plugin is being compiled");
                    for &index in group {
                        results[index] = Some(Err(TransformFailure::Deferred(why.clone())));
                    }
                }
                Some(known) => routed.push(Group {
                    tenant: known,
                    indices: group.clone(),
                }),
                None => {
                    for &index in group {
                        results[index] = Some(Err(TransformFailure::NoPlugin(tenant.clone())));
                    }
                    if let Some(m) = self.metrics.get() {
                        metrics::record_no_plugin(m, tenant, group.len());
                    }
                }
            }
        }
        self.forget_idle(&groups);

        for Ran {
            group,
            outputs,
            took,
        } in lanes::run(Arc::clone(&rows), routed, self.lanes).await
        {
            // One result per row, or the whole group fails cleanly.
            let outputs = if outputs.len() == group.indices.len() {
                outputs
            } else {
                let why = format!(
                    "plugin worker returned {} results for {} rows",
                    outputs.len(),
                    group.indices.len()
                );
                group
                    .indices
                    .iter()
                    .map(|_| Err(TransformFailure::Unavailable(why.clone())))
                    .collect()
            };
            if let Some(m) = self.metrics.get() {
                // The tenant, and its configured file (or builtin): a reload changes the
                // file's content, not its name.
                let health = &group.tenant.health;
                let template = health.template();
                metrics::record_group(
                    m,
                    health.shared.tenant(),
                    template.describe(),
                    took,
                    &outputs,
                );
            }
            for (index, output) in group.indices.into_iter().zip(outputs) {
                results[index] = Some(output);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(TransformFailure::Unavailable("no result".into()))))
            .collect()
    }
}

/// A section's `key_format`/`value_format`, checked and with its schema files read; the first
/// problem when they cannot work.
pub(super) fn formats_of(
    spec: &PluginSpec,
    key: &str,
) -> Result<Option<Arc<MessageFormats>>, Problem> {
    spec.formats.resolve(key).map_err(|problems| {
        problems
            .into_iter()
            .next()
            .unwrap_or_else(|| Problem::new(key, "invalid"))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::OutboxId;
    use crate::plugin::tenant::status::TenantState;

    /// The plugin part of a `sluice.toml`.
    #[derive(serde::Deserialize)]
    pub(crate) struct PluginTables {
        #[serde(default)]
        pub(crate) plugins: PluginsSettings,
        #[serde(default)]
        pub(crate) tenants: BTreeMap<String, PluginSpec>,
    }

    fn router(toml: &str) -> Result<PluginRouter, PluginError> {
        let tables: PluginTables = toml::from_str(toml).unwrap();
        PluginRouter::from_settings(&tables.plugins, &tables.tenants)
    }

    /// One row per entry of `tenants`, of that tenant (ids 1, 2, …; aggregate type `order`).
    pub(crate) fn rows(tenants: &[&str]) -> Arc<[OutboxRow]> {
        tenants
            .iter()
            .enumerate()
            .map(|(i, t)| OutboxRow {
                id: OutboxId::Int(i as i64 + 1),
                tenant: TenantId::named(*t),
                aggregate_type: "order".into(),
                aggregate_id: "o".into(),
                event_type: "E".into(),
                payload: b"{}".to_vec(),
                headers: Vec::new(),
                created_at: chrono::Utc::now(),
                attempts: 0,
                extra: Vec::new(),
                replay: None,
            })
            .collect()
    }

    const BUILTIN: &str = "[plugins.default]\nbuiltin = \"route-by-aggregate\"\n";

    #[tokio::test(flavor = "multi_thread")]
    async fn refused_publishes_pause_a_tenant_whose_transforms_all_succeed() {
        let router = router(&format!(
            "{BUILTIN}circuit_breaker_failures = 3\n[tenants.acme]\n"
        ))
        .unwrap();
        let acme = TenantId::named("acme");
        for _ in 0..3 {
            let results = router.transform(rows(&["acme"])).await;
            assert!(results[0].is_ok());
            router.record_publish(&acme, 0, 1);
        }
        assert!(router.paused_tenants().contains(&acme));
        assert!(!router.paused_tenants().contains(&TenantId::none()));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rows_without_a_tenant_and_a_tenant_named_default_are_different_tenants() {
        let toml = format!(
            "{BUILTIN}config = {{ topic_prefix = \"plain.\" }}\n\
             [tenants.default]\nconfig = {{ topic_prefix = \"named.\" }}\n"
        );
        let router = router(&toml).unwrap();
        let mut mixed: Vec<OutboxRow> = rows(&["default", "x"]).to_vec();
        mixed[1].tenant = TenantId::none();
        let results = router.transform(mixed.into()).await;
        let topic = |i: usize| results[i].as_ref().unwrap()[0].topic.clone();
        assert_eq!(
            topic(0),
            "named.order",
            "[tenants.default] is the tenant named default"
        );
        assert_eq!(
            topic(1),
            "plain.order",
            "rows without a tenant run [plugins.default]"
        );
        // Pausing one leaves the other alone.
        let named = TenantId::named("default");
        for _ in 0..5 {
            router.record_publish(&named, 0, 1);
        }
        assert_eq!(router.paused_tenants(), vec![named]);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_tenant_whose_plugin_cannot_start_is_quarantined_and_reported() {
        // The builtin refuses unknown config keys in `configure`.
        let toml = format!("{BUILTIN}[tenants.broken]\nconfig = {{ prefix = \"typo\" }}\n");
        let router = router(&toml).unwrap();
        let broken = TenantId::named("broken");
        assert_eq!(router.paused_tenants(), vec![broken.clone()]);
        let statuses = router.tenant_statuses();
        let status = statuses.iter().find(|s| s.tenant == broken).unwrap();
        let TenantState::Quarantined { reason, tries, .. } = &status.state else {
            panic!("{status:?}");
        };
        assert!(reason.contains("prefix"), "{reason}");
        assert_eq!(*tries, 1);
        assert!(!status.instance);
        // Its rows wait (no attempt); the others run.
        let results = router.transform(rows(&["broken", "other"])).await;
        assert!(matches!(
            &results[0],
            Err(TransformFailure::Paused {
                reason: crate::model::PauseReason::Quarantined(_),
                ..
            })
        ));
        assert!(results[1].is_ok());

        let strict = format!("[plugins]\nstrict_startup = true\n{toml}");
        let err = router_err(&strict);
        assert!(err.contains("broken") && err.contains("prefix"), "{err}");
    }

    fn router_err(toml: &str) -> String {
        match router(toml) {
            Ok(_) => panic!("started:\n{toml}"),
            Err(e) => e.to_string(),
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_tenant_with_its_own_plugin_gets_neither_the_default_config_nor_its_allow_list() {
        let toml = format!(
            "{BUILTIN}config = {{ topic_prefix = \"d.\" }}\nallowed_topics = [\"d.*\"]\n\
             [tenants.own]\nbuiltin = \"route-by-aggregate\"\n\
             [tenants.plain]\nmemory_mb = 16\n"
        );
        let results = router(&toml)
            .unwrap()
            .transform(rows(&["own", "plain", "other"]))
            .await;
        let topic = |i: usize| match &results[i] {
            Ok(messages) => messages[0].topic.clone(),
            Err(e) => panic!("row {i}: {e}"),
        };
        assert_eq!(
            topic(0),
            "outbox.event.order",
            "its own plugin with its own (empty) config, and no allow-list"
        );
        assert_eq!(
            topic(1),
            "d.order",
            "the default plugin with the default config"
        );
        assert_eq!(topic(2), "d.order");
        // Without its own plugin a tenant keeps the default's allow-list.
        let narrowed =
            format!("{BUILTIN}allowed_topics = [\"d.*\"]\n[tenants.plain]\nmemory_mb = 16\n");
        let results = router(&narrowed).unwrap().transform(rows(&["plain"])).await;
        assert!(
            matches!(&results[0], Err(TransformFailure::InvalidOutput(m)) if m.contains("allowed_topics")),
            "{:?}",
            results[0]
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_failing_default_plugin_quarantines_tenants_first_seen_later() {
        let toml = "[plugins.default]\nbuiltin = \"route-by-aggregate\"\nconfig = { nope = 1 }\n\
                    [tenants.own]\nbuiltin = \"route-by-aggregate\"\n";
        let router = router(toml).unwrap();
        let results = router
            .transform(rows(&["own", "default", "newcomer"]))
            .await;
        assert!(results[0].is_ok());
        for r in &results[1..] {
            assert!(matches!(r, Err(TransformFailure::Paused { .. })), "{r:?}");
        }
        let paused = router.paused_tenants();
        assert!(paused.contains(&TenantId::named("newcomer")), "{paused:?}");
    }

    /// Holds `tenant`'s lock on another thread (inside a call when `in_call`) until the
    /// returned sender is dropped or sent to.
    fn hold(
        tenant: Arc<Tenant>,
        in_call: bool,
    ) -> (std::thread::JoinHandle<()>, std::sync::mpsc::Sender<()>) {
        let (locked_tx, locked) = std::sync::mpsc::channel::<()>();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _held = tenant.try_runner().unwrap();
            let _stamp = in_call.then(|| tenant.health.stamp_call());
            locked_tx.send(()).unwrap();
            let _ = release_rx.recv();
        });
        locked.recv().unwrap();
        (holder, release)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn cold_tenants_take_the_place_of_idle_ones_instead_of_waiting() {
        let router = router(&format!(
            "[plugins]\nmax_unconfigured_instances = 2\n{BUILTIN}"
        ))
        .unwrap();
        let tenants: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
        let names: Vec<&str> = tenants.iter().map(String::as_str).collect();
        // Ten tenants, room for two instances: every row runs in this batch, none is put back.
        let results = router.transform(rows(&names)).await;
        for (tenant, result) in names.iter().zip(&results) {
            assert!(result.is_ok(), "{tenant}: {result:?}");
        }
        assert!(router.unconfigured_instances().0 <= 2);
        // The next batch forgets the least recently used idle tenants beyond the cap.
        let results = router.transform(rows(&["newcomer"])).await;
        assert!(results[0].is_ok());
        let unconfigured = router
            .tenant_statuses()
            .iter()
            .filter(|s| !s.configured)
            .count();
        assert!(unconfigured <= 2, "{unconfigured}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_evicted_tenant_keeps_its_used_log_budget() {
        let router = router(&format!(
            "[plugins]\nmax_unconfigured_instances = 1\n{BUILTIN}"
        ))
        .unwrap();
        let (loud, quiet) = (TenantId::named("loud"), TenantId::named("quiet"));
        assert!(router.transform(rows(&["loud"])).await[0].is_ok());
        // What a plugin logging its whole burst leaves (the builtin plugin does not log).
        let shared = Arc::clone(&router.tenant(&loud, 0).unwrap().health.shared);
        while shared.take_log_line() {}
        assert!(router.transform(rows(&["quiet"])).await[0].is_ok());
        assert!(router.transform(rows(&["other"])).await[0].is_ok());
        let known = |id: &TenantId| lock(&router.tenants).map.contains_key(id);
        assert!(
            !known(&quiet),
            "an idle tenant with a full budget is forgotten"
        );
        assert!(
            known(&loud),
            "the loud tenant is remembered, with its budget"
        );
        assert!(Arc::ptr_eq(
            &shared,
            &router.tenant(&loud, 0).unwrap().health.shared
        ));
        assert!(!shared.take_log_line(), "no fresh burst after eviction");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_cold_tenant_waits_only_when_every_instance_is_busy() {
        let router = router(&format!(
            "[plugins]\nmax_unconfigured_instances = 1\n{BUILTIN}"
        ))
        .unwrap();
        assert!(router.transform(rows(&["busy"])).await[0].is_ok());
        // `busy` keeps its instance and is in the middle of a call (its lock is held).
        let busy = router.tenant(&TenantId::named("busy"), 0).unwrap();
        let (holder, release) = hold(Arc::clone(&busy), false);
        let results = router.transform(rows(&["cold"])).await;
        assert!(
            matches!(&results[0], Err(TransformFailure::Deferred(why)) if why.contains("max_unconfigured_instances")),
            "{:?}",
            results[0]
        );
        drop(release);
        holder.join().unwrap();
        assert!(router.transform(rows(&["cold"])).await[0].is_ok());
        assert!(!busy.health.has_instance(), "the idle one made room");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_batch_of_many_tenants_runs_every_group_and_passes_over_a_busy_one() {
        let router = router(BUILTIN).unwrap();
        let tenants: Vec<String> = (0..300).map(|i| format!("t{i}")).collect();
        let names: Vec<&str> = tenants.iter().map(String::as_str).collect();
        assert!(
            router
                .transform(rows(&names))
                .await
                .iter()
                .all(Result::is_ok)
        );
        // t7 is busy in "another batch" for a while (not stalled: no call stamp), then free.
        let t7 = router.tenant(&TenantId::named("t7"), 0).unwrap();
        let (holder, release) = hold(t7, false);
        let transform = router.transform(rows(&names));
        let releaser = async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            release.send(()).unwrap();
        };
        let (results, ()) = tokio::join!(transform, releaser);
        holder.join().unwrap();
        assert!(
            results.iter().all(Result::is_ok),
            "the busy tenant's rows waited for it"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rows_of_a_tenant_stalled_in_another_batch_are_deferred() {
        let router = router(BUILTIN).unwrap();
        assert!(router.transform(rows(&["slow", "fast"])).await[0].is_ok());
        let slow = router.tenant(&TenantId::named("slow"), 0).unwrap();
        let (holder, release) = hold(slow, true);
        std::thread::sleep(crate::plugin::tenant::health::STALL_AFTER * 2);
        let results = router.transform(rows(&["slow", "fast"])).await;
        drop(release);
        holder.join().unwrap();
        assert!(
            matches!(&results[0], Err(TransformFailure::Deferred(_))),
            "{:?}",
            results[0]
        );
        assert!(results[1].is_ok());
    }

    #[test]
    fn more_configured_tenants_than_the_pool_holds_start_with_their_live_instances_counted() {
        // What 10,000 configured tenants ask for: the engine failed with "mmap failed to
        // reserve" when the pool was not bounded.
        let engine = PluginEngine::new(10_001 * 2 + 1_024);
        assert!(engine.is_ok(), "{:?}", engine.err());
        drop(engine);
        // Each needs an instance and a replacement: 2 × 16,001 + 1,024 > 32,768 pooled. (One
        // test: two such pools at once would take much of the address space.)
        let pooled = crate::plugin::wasm::engine::MAX_POOLED_INSTANCES as usize;
        let mut toml = BUILTIN.to_owned();
        for i in 0..16_000 {
            toml.push_str(&format!("[tenants.t{i}]\n"));
        }
        let many = router(&toml).unwrap();
        let usage = many.instances();
        assert_eq!(usage.configured.max_live, Some((pooled - 1_024) / 2));
        assert_eq!(usage.unconfigured.max_live, Some(1_024));
        drop(many);
        // Up to the pool, configured tenants' instances are bounded by memory only.
        let few = router(&format!("{BUILTIN}[tenants.a]\n[tenants.b]\n")).unwrap();
        assert_eq!(few.instances().configured.max_live, None);
    }
}
