//! Tenants added, changed and removed while the relay runs ([`PluginRouter::apply`]), and
//! plugins compiled on their tenant's first row ([`PluginRouter::load_wanted`], with
//! `[plugins] load = "lazy"`).
//!
//! A change applies per tenant, like a hot reload of a plugin file: the new version is
//! built (loaded, instantiated, `configure`d) without the tenant's lock, then swapped in
//! between two groups of rows; a version that does not build leaves the running one in place,
//! and the reason is kept for `/status`. A removed tenant stops; its rows wait, unclaimed
//! (they are not failed: the tenant may come back). A tenant whose entry does not check (a
//! tenant file that does not parse, a bad value) keeps its running version, or, when none
//! runs, waits the same way.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::model::TenantId;
use crate::plugin::keys::{KeyScope, KeyScopes};
use crate::plugin::limits::Limits;
use crate::plugin::reload::swap;
use crate::plugin::router::{
    AppliedSpecs, FileStamp, PluginRouter, formats_of, probe_shared, start_tenant,
};
use crate::plugin::settings::{PluginSource, PluginSpec, PluginsSettings};
use crate::plugin::supply::PluginSupply;
use crate::plugin::tenant::template::{PluginCode, PluginInstance, TenantTemplate};
use crate::plugin::tenant::{Tenant, lock};
use crate::plugin::wasm::component::LoadedPlugin;
use crate::plugin::{LoadMode, PluginError};
use crate::problem::Problem;
use crate::text::{MAX_LOGGED, bounded};

/// Why the rows of a tenant removed while running wait.
const REMOVED: &str = "the tenant was removed from the configuration; its rows wait";

/// What a live change of the plugin settings did, tenant by tenant.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct TenantChanges {
    /// Tenants started (new entries).
    pub started: Vec<String>,
    /// Tenants now on their changed entry (plugin, `config`, pin, limits, allow-list, formats).
    pub changed: Vec<String>,
    /// Tenants stopped (entries removed); their rows wait.
    pub removed: Vec<String>,
    /// Tenants whose change did not apply, and why: the running version keeps running, or
    /// (a new tenant) its rows wait.
    pub refused: BTreeMap<String, String>,
    /// Whether `[plugins.default]` changed (tenants without an entry follow it).
    pub default_changed: bool,
    /// `[plugins]` keys whose change needs a restart.
    pub restart_needed: Vec<String>,
}

impl TenantChanges {
    /// Whether nothing changed and nothing was refused.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Tenants whose rows wait or whose latest change did not apply, for `/status`.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantChangeStatus {
    /// Tenants whose rows wait (removed, or new with an entry that does not check), and why.
    pub waiting: BTreeMap<String, String>,
    /// Tenants that run an older version because their latest change did not apply, and why.
    pub kept_old_version: BTreeMap<String, String>,
}

fn reason_of(error: &impl std::fmt::Display) -> String {
    bounded(&error.to_string(), MAX_LOGGED).into_owned()
}

/// The `[plugins]` keys that are read at start only, by name, when they differ.
fn restart_keys(old: &PluginsSettings, new: &PluginsSettings) -> Vec<String> {
    let mut keys = Vec::new();
    let mut differs = |key: &str, differ: bool| {
        if differ {
            keys.push(format!("plugins.{key}"));
        }
    };
    differs("cache_dir", old.cache_dir != new.cache_dir);
    differs("cache_max_mb", old.cache_max_mb != new.cache_max_mb);
    differs("strict_startup", old.strict_startup != new.strict_startup);
    differs("trusted_keys", old.trusted_keys != new.trusted_keys);
    differs("registries", old.registries != new.registries);
    differs("load", old.load != new.load);
    differs(
        "max_unconfigured_instances",
        old.max_unconfigured_instances != new.max_unconfigured_instances,
    );
    differs(
        "unconfigured_instances_memory_mb",
        old.unconfigured_instances_memory_mb != new.unconfigured_instances_memory_mb,
    );
    differs(
        "configured_instances_memory_mb",
        old.configured_instances_memory_mb != new.configured_instances_memory_mb,
    );
    differs("default", old.default.is_some() && new.default.is_none());
    keys
}

impl PluginRouter {
    /// Applies changed plugin settings: `[plugins.default]` and the tenants' entries
    /// (`tenants`, `[tenants.*]` and tenant files together). `refused` are the tenants whose
    /// new entry does not check, with why: they keep what runs (or wait). Blocking work
    /// (compiling, `configure`): call it off the async reactor.
    pub fn apply(
        &self,
        plugins: &PluginsSettings,
        tenants: &BTreeMap<String, PluginSpec>,
        refused: &BTreeMap<String, String>,
    ) -> TenantChanges {
        let old = lock(&self.applied).clone();
        let mut changes = TenantChanges {
            restart_needed: restart_keys(&old.settings, plugins),
            ..TenantChanges::default()
        };
        let keys = match self.rekey(&old.settings, plugins, tenants) {
            Ok(keys) => keys,
            Err(reason) => {
                tracing::error!(reason = %reason,
                    "changed trusted_keys cannot be used; every tenant keeps running as it is");
                changes.refused.insert("trusted_keys".into(), reason);
                return changes;
            }
        };
        let mut codes = self.loaded_codes();
        let mut next = AppliedSpecs {
            settings: old.settings.clone(),
            tenants: BTreeMap::new(),
        };
        // `[plugins.default]` first: tenants first seen from now on, and tenants without an
        // entry, run the new one. Removing it needs a restart (its tenants' rows would fail).
        if plugins.default.is_some() && plugins.default != old.settings.default {
            match self.apply_default(plugins, &keys, &mut codes) {
                Ok(()) => {
                    changes.default_changed = true;
                    next.settings.default = plugins.default.clone();
                }
                Err(reason) => {
                    tracing::error!(reason = %reason,
                        "changed [plugins.default] failed to start; the old version keeps running");
                    changes.refused.insert("plugins.default".into(), reason);
                }
            }
        }
        // Tenants whose rows wait are looked at too: one whose entry never applied and is
        // gone now is released.
        let waiting: Vec<String> = lock(&self.held)
            .keys()
            .filter_map(|id| id.name().map(str::to_owned))
            .collect();
        let names: BTreeSet<&String> = old
            .tenants
            .keys()
            .chain(tenants.keys())
            .chain(refused.keys())
            .chain(&waiting)
            .collect();
        for name in names {
            let id = TenantId::named(name.as_str());
            if let Some(reason) = refused.get(name) {
                if let Some(spec) = old.tenants.get(name) {
                    next.tenants.insert(name.clone(), spec.clone());
                }
                self.refuse(&id, name, reason, &mut changes);
                continue;
            }
            let before = old.effective(name);
            let after = tenants
                .get(name)
                .map(|t| t.inherit(next.settings.default.as_ref()));
            match (before, after) {
                (None, None) => {
                    let mut held = lock(&self.held);
                    if held.get(&id).is_some_and(|why| why != REMOVED) {
                        held.remove(&id);
                    }
                }
                (Some(_), None) => {
                    self.remove(&id);
                    changes.removed.push(name.clone());
                }
                (None, Some(spec)) => {
                    let scope = keys.for_tenant(name, &tenants[name]);
                    match self.add(&id, name, &spec, scope, &mut codes) {
                        Ok(()) => {
                            changes.started.push(name.clone());
                            next.tenants.insert(name.clone(), tenants[name].clone());
                        }
                        Err(reason) => {
                            self.refuse(&id, name, &reason, &mut changes);
                        }
                    }
                }
                (Some(before), Some(after)) => {
                    if before == after && !self.waits(&id) {
                        next.tenants.insert(name.clone(), tenants[name].clone());
                        lock(&self.kept).remove(&id);
                        continue;
                    }
                    let scope = keys.for_tenant(name, &tenants[name]);
                    match self.change(&id, name, &after, scope, &mut codes) {
                        Ok(()) => {
                            changes.changed.push(name.clone());
                            next.tenants.insert(name.clone(), tenants[name].clone());
                        }
                        Err(reason) => {
                            next.tenants.insert(name.clone(), old.tenants[name].clone());
                            self.refuse(&id, name, &reason, &mut changes);
                        }
                    }
                }
            }
        }
        *lock(&self.applied) = next;
        self.watch.changed();
        changes
    }

    /// Every compiled plugin file a tenant (or the default) runs now, by path.
    fn loaded_codes(&self) -> HashMap<PathBuf, PluginCode> {
        let default = lock(&self.default).clone();
        let mut codes = HashMap::new();
        for template in self
            .tenants()
            .into_iter()
            .map(|t| t.health.template())
            .chain(default)
        {
            if let PluginCode::Wasm(plugin) = &template.code {
                codes.insert(plugin.path().to_owned(), template.code.clone());
            }
        }
        codes
    }

    /// The code for `source`: a file already loaded, a builtin, a file loaded now — or, with
    /// `pending`, a file left for its tenant's first row.
    fn code_for(
        &self,
        source: &PluginSource,
        codes: &mut HashMap<PathBuf, PluginCode>,
        pending: bool,
    ) -> Result<PluginCode, PluginError> {
        let path = match source {
            PluginSource::Builtin(name) => return Ok(PluginCode::Builtin(name.clone())),
            PluginSource::Wasm(path) => path,
        };
        if let Some(code) = codes.get(path) {
            return Ok(code.clone());
        }
        if pending {
            return Ok(PluginCode::Pending(path.clone()));
        }
        let plugin = self.load_file(path)?;
        let code = PluginCode::Wasm(plugin);
        codes.insert(path.clone(), code.clone());
        Ok(code)
    }

    /// Loads a plugin file (its bytes fetched and checked), noting its stamp so a later
    /// replacement of the file is hot-reloaded.
    fn load_file(&self, path: &std::path::Path) -> Result<Arc<LoadedPlugin>, PluginError> {
        let plugin = LoadedPlugin::load_fetched(
            &self.engine,
            path,
            self.supply().fetch(path)?,
            self.cache.as_ref(),
        )?;
        lock(&self.files).insert(path.to_owned(), FileStamp::of(path));
        Ok(Arc::new(plugin))
    }

    /// The keys of every section, and a supply that verifies signatures by each of them:
    /// a tenant added with keys of its own brings keys the supply did not know.
    fn rekey(
        &self,
        old: &PluginsSettings,
        plugins: &PluginsSettings,
        tenants: &BTreeMap<String, PluginSpec>,
    ) -> Result<KeyScopes, String> {
        // `[plugins] trusted_keys` itself is read at start (named as needing a restart).
        let settings = PluginsSettings {
            trusted_keys: old.trusted_keys.clone(),
            ..plugins.clone()
        };
        let keys = KeyScopes::new(&settings, tenants).map_err(|e| reason_of(&e))?;
        if *lock(&self.scoped_keys) != keys.scoped_entries() {
            let supply = PluginSupply::new(
                &old.trusted_keys,
                &old.registries,
                self.cache.as_ref().map(|c| c.dir.as_path()),
            )
            .and_then(|s| s.with_scoped_keys(&old.trusted_keys, keys.scoped_entries()))
            .map_err(|e| reason_of(&e))?
            .with_cache_max_bytes(self.cache.as_ref().map_or(0, |c| c.max_bytes));
            self.set_supply(supply, keys.scoped_entries().to_vec());
        }
        Ok(keys)
    }

    /// Whether `limits`' memory fits the engine's memory slots, which were sized at start to
    /// the largest `memory_mb` then; why not.
    fn fits_slot(&self, limits: &Limits) -> Result<(), String> {
        let slot = self.engine.memory_slot();
        if u64::try_from(limits.memory_bytes).unwrap_or(u64::MAX) <= slot {
            return Ok(());
        }
        Err(format!(
            "more than the {} MiB the plugin engine's memory slots were sized to at start (the \
             largest memory_mb then): takes effect at the next restart",
            slot >> 20
        ))
    }

    /// The template of `spec` (tenant `name`'s entry, completed) with `code`, whose file
    /// `keys` may sign.
    fn template_of(
        &self,
        name: &str,
        spec: &PluginSpec,
        code: PluginCode,
        keys: Option<Arc<KeyScope>>,
    ) -> Result<TenantTemplate, PluginError> {
        let key = format!("tenants.{name}");
        let limits = spec
            .resolved_limits()
            .map_err(|message| Problem::new(key.clone(), message))?;
        self.fits_slot(&limits)
            .map_err(|message| Problem::new(format!("{key}.memory_mb"), message))?;
        Ok(TenantTemplate::new(code, spec.config_pairs(), limits)
            .with_declared_formats(formats_of(spec, &key)?)
            .pinned(spec.pin())
            .signed_by(keys)
            .watched_by(&self.watch))
    }

    fn apply_default(
        &self,
        plugins: &PluginsSettings,
        keys: &KeyScopes,
        codes: &mut HashMap<PathBuf, PluginCode>,
    ) -> Result<(), String> {
        let Some(spec) = &plugins.default else {
            return Ok(());
        };
        let source = spec
            .source()
            .ok_or_else(|| "needs `path` or `builtin`".to_owned())?;
        let code = self
            .code_for(&source, codes, false)
            .map_err(|e| reason_of(&e))?;
        let limits = spec.resolved_limits()?;
        self.fits_slot(&limits)
            .map_err(|message| format!("memory_mb: {message}"))?;
        let template = Arc::new(
            TenantTemplate::new(code, spec.config_pairs(), limits)
                .with_declared_formats(
                    formats_of(spec, "plugins.default").map_err(|e| reason_of(&e))?,
                )
                .pinned(spec.pin())
                .signed_by(keys.for_default())
                .watched_by(&self.watch),
        );
        // The rows without a tenant run it: their instance is the probe.
        let none = TenantId::none();
        let shared = self
            .known(&none)
            .map_or_else(probe_shared, |t| Arc::clone(&t.health.shared));
        let instance = PluginInstance::create(&template, &shared).map_err(|e| reason_of(&e))?;
        let old_default = lock(&self.default).replace(Arc::clone(&template));
        for tenant in self.tenants() {
            let current = tenant.health.template();
            let follows = old_default
                .as_ref()
                .is_some_and(|d| Arc::ptr_eq(d, &current));
            if !tenant.configured && follows {
                // Without an entry: the next row makes an instance of the new version.
                swap(&tenant, &current, Arc::clone(&template), None);
            }
        }
        let none_tenant = self.known(&none);
        match none_tenant {
            Some(tenant) => {
                let current = tenant.health.template();
                swap(&tenant, &current, template, Some(instance));
            }
            None => {
                let tenant = start_tenant(
                    none.clone(),
                    template,
                    &self.configured_quota,
                    &self.watch,
                    false,
                )
                .map_err(|e| reason_of(&e))?;
                self.insert_configured(none, tenant);
            }
        }
        Ok(())
    }

    /// Starts tenant `name` (a new entry).
    fn add(
        &self,
        id: &TenantId,
        name: &str,
        spec: &PluginSpec,
        keys: Option<Arc<KeyScope>>,
        codes: &mut HashMap<PathBuf, PluginCode>,
    ) -> Result<(), String> {
        let source = spec
            .source()
            .ok_or_else(|| "names no plugin, and there is no [plugins.default]".to_owned())?;
        let lazy = self.load == LoadMode::Lazy;
        let code = match self.code_for(&source, codes, lazy) {
            Ok(code) => code,
            // As at start-up: the tenant is quarantined and retried with back-off.
            Err(e) => PluginCode::Broken {
                path: match &source {
                    PluginSource::Wasm(path) => path.clone(),
                    PluginSource::Builtin(name) => PathBuf::from(format!("builtin:{name}")),
                },
                reason: reason_of(&e),
            },
        };
        let template = Arc::new(
            self.template_of(name, spec, code, keys)
                .map_err(|e| reason_of(&e))?,
        );
        let tenant = start_tenant(
            id.clone(),
            template,
            &self.configured_quota,
            &self.watch,
            false,
        )
        .map_err(|e| reason_of(&e))?;
        self.insert_configured(id.clone(), tenant);
        lock(&self.held).remove(id);
        lock(&self.kept).remove(id);
        tracing::info!(tenant = %bounded(name, MAX_LOGGED), "tenant added: it starts now");
        Ok(())
    }

    /// Moves tenant `name` to its changed entry, or says why it keeps the running version.
    fn change(
        &self,
        id: &TenantId,
        name: &str,
        spec: &PluginSpec,
        keys: Option<Arc<KeyScope>>,
        codes: &mut HashMap<PathBuf, PluginCode>,
    ) -> Result<(), String> {
        let Some(tenant) = self.known(id) else {
            // Waiting (its earlier entry never started): start it as new.
            return self.add(id, name, spec, keys, codes);
        };
        let old = tenant.health.template();
        let source = spec
            .source()
            .ok_or_else(|| "names no plugin, and there is no [plugins.default]".to_owned())?;
        // A tenant that never ran stays lazy; a running one is built now, so a version that
        // does not start is found while the old one still runs.
        let pending = old.pending() && !tenant.health.has_instance();
        let code = self
            .code_for(&source, codes, pending)
            .map_err(|e| reason_of(&e))?;
        let template = Arc::new(
            self.template_of(name, spec, code, keys)
                .map_err(|e| reason_of(&e))?,
        );
        if let PluginCode::Wasm(plugin) = &template.code
            && let Some(refused) = template.refuses(plugin, name)
        {
            return Err(reason_of(&refused));
        }
        let instance = if template.pending() {
            None
        } else {
            Some(
                PluginInstance::create(&template, &tenant.health.shared)
                    .map_err(|e| reason_of(&e))?,
            )
        };
        if !swap(&tenant, &old, template, instance) {
            return Err("another change replaced the tenant's plugin meanwhile".into());
        }
        lock(&self.kept).remove(id);
        tracing::info!(tenant = %bounded(name, MAX_LOGGED), "tenant changed: its new settings apply from the next batch");
        Ok(())
    }

    /// Stops tenant `id` (its entry was removed): its rows wait.
    fn remove(&self, id: &TenantId) {
        let removed = self.forget(id);
        lock(&self.held).insert(id.clone(), REMOVED.to_owned());
        lock(&self.kept).remove(id);
        if let Some(tenant) = removed {
            // Waits for a batch running the tenant's rows to finish with them.
            tenant.runner().drop_instance();
        }
        tracing::info!(tenant = %id, "tenant removed: it stops, its rows wait");
    }

    /// Tenant `name`'s new entry does not apply: the running version keeps running, or the
    /// tenant waits when none runs.
    fn refuse(&self, id: &TenantId, name: &str, reason: &str, changes: &mut TenantChanges) {
        let runs = self.known(id).is_some_and(|t| t.configured);
        let shown = bounded(name, MAX_LOGGED);
        if runs {
            tracing::error!(tenant = %shown, reason = %reason,
                "tenant's changed settings do not apply; its running version keeps running");
            lock(&self.kept).insert(id.clone(), reason.to_owned());
        } else {
            tracing::error!(tenant = %shown, reason = %reason,
                "tenant's settings do not apply; its rows wait until they do");
            lock(&self.held).insert(id.clone(), reason.to_owned());
        }
        changes.refused.insert(name.to_owned(), reason.to_owned());
    }

    /// Tenants whose entry does not check at start (a tenant file), with why: their rows wait
    /// until a change fixes it.
    pub fn hold(&self, refused: &BTreeMap<String, String>) {
        let mut held = lock(&self.held);
        for (name, why) in refused {
            held.insert(TenantId::named(name.as_str()), why.clone());
        }
    }

    /// Whether the rows of `id` wait (removed, or its entry never applied).
    fn waits(&self, id: &TenantId) -> bool {
        lock(&self.held).contains_key(id)
    }

    /// Tenants whose rows wait, and those running an older version, with why.
    pub fn change_status(&self) -> TenantChangeStatus {
        let named = |map: &BTreeMap<TenantId, String>| {
            map.iter()
                .map(|(id, why)| (id.to_string(), why.clone()))
                .collect()
        };
        TenantChangeStatus {
            waiting: named(&lock(&self.held)),
            kept_old_version: named(&lock(&self.kept)),
        }
    }

    /// Asks for tenant `id`'s plugin to be compiled (its row is deferred meanwhile).
    pub(super) fn want(&self, id: &TenantId) {
        let mut wanted = lock(&self.wanted);
        if !wanted.loading.contains(id) && wanted.queued.insert(id.clone()) {
            self.loads.notify_one();
        }
    }

    /// Waits until a row asks for a plugin to be compiled ([`PluginRouter::load_wanted`]).
    pub async fn loads_wanted(&self) {
        self.loads.notified().await;
    }

    /// Compiles and starts the plugins rows asked for (each file once), and moves their
    /// tenants onto them; a plugin that does not start quarantines its tenant, as at start-up.
    /// Blocking work. Returns how many tenants were started.
    pub fn load_wanted(&self) -> usize {
        let queued = {
            let mut wanted = lock(&self.wanted);
            let queued = std::mem::take(&mut wanted.queued);
            wanted.loading.extend(queued.iter().cloned());
            queued
        };
        let mut by_path: BTreeMap<PathBuf, Vec<Arc<Tenant>>> = BTreeMap::new();
        for id in &queued {
            let Some(tenant) = self.known(id) else {
                continue;
            };
            if let PluginCode::Pending(path) = &tenant.health.template().code {
                by_path.entry(path.clone()).or_default().push(tenant);
            }
        }
        let mut started = 0;
        let mut codes = self.loaded_codes();
        for (path, tenants) in by_path {
            let began = Instant::now();
            let code = match self.code_for(&PluginSource::Wasm(path.clone()), &mut codes, false) {
                Ok(code) => code,
                Err(e) => PluginCode::Broken {
                    path: path.clone(),
                    reason: reason_of(&e),
                },
            };
            tracing::info!(plugin = %path.display(), tenants = tenants.len(),
                took_ms = began.elapsed().as_millis() as u64, "plugin loaded for its first row");
            for tenant in tenants {
                let old = tenant.health.template();
                if !old.pending() {
                    continue;
                }
                let template = Arc::new(old.with_code(code.clone()).watched_by(&self.watch));
                match PluginInstance::create(&template, &tenant.health.shared) {
                    Ok(instance) => {
                        if swap(&tenant, &old, template, Some(instance)) {
                            started += 1;
                        }
                    }
                    Err(e) => {
                        let reason = reason_of(&e);
                        tracing::error!(tenant = %tenant.health.shared.tenant(), plugin = %path.display(), reason = %reason,
                            "tenant quarantined: its plugin failed to start; its rows wait (retried with back-off and on reload)");
                        template.quarantine.failed(reason, Instant::now());
                        swap(&tenant, &old, template, None);
                    }
                }
            }
        }
        let mut wanted = lock(&self.wanted);
        for id in &queued {
            wanted.loading.remove(id);
        }
        drop(wanted);
        self.watch.changed();
        started
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TransformFailure;
    use crate::plugin::RowTransformer;
    use crate::plugin::router::tests::{PluginTables, rows};

    fn tables(toml: &str) -> PluginTables {
        toml::from_str(toml).unwrap()
    }

    fn tenant(name: &str, prefix: &str) -> String {
        format!(
            "[tenants.{name}]\nbuiltin = \"route-by-aggregate\"\nconfig = {{ topic_prefix = \"{prefix}\" }}\n"
        )
    }

    async fn topics(router: &PluginRouter, tenants: &[&str]) -> Vec<String> {
        router
            .transform(rows(tenants))
            .await
            .into_iter()
            .map(|r| match r {
                Ok(messages) => messages[0].topic.clone(),
                Err(TransformFailure::Deferred(why)) => format!("deferred: {why}"),
                Err(other) => format!("failed: {other}"),
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn tenants_are_added_changed_and_removed_one_by_one() {
        let start = tables(&format!("{}{}", tenant("a", "a."), tenant("b", "b.")));
        let router = PluginRouter::from_settings(&start.plugins, &start.tenants).unwrap();
        assert_eq!(topics(&router, &["a", "b"]).await, ["a.order", "b.order"]);

        // a's config rotated, b removed, c added, d's entry does not check.
        let next = tables(&format!("{}{}", tenant("a", "a2."), tenant("c", "c.")));
        let refused = BTreeMap::from([("d".to_owned(), "d.toml: does not parse".to_owned())]);
        let changes = router.apply(&next.plugins, &next.tenants, &refused);
        assert_eq!(changes.started, ["c"]);
        assert_eq!(changes.changed, ["a"]);
        assert_eq!(changes.removed, ["b"]);
        assert_eq!(changes.refused.keys().collect::<Vec<_>>(), ["d"]);
        assert!(changes.restart_needed.is_empty());
        let got = topics(&router, &["a", "b", "c", "d"]).await;
        assert_eq!(got[0], "a2.order");
        assert!(
            got[1].starts_with("deferred: the tenant was removed"),
            "{got:?}"
        );
        assert_eq!(got[2], "c.order");
        assert!(got[3].starts_with("deferred: d.toml"), "{got:?}");
        let paused = router.paused_tenants();
        assert!(paused.contains(&TenantId::named("b")) && paused.contains(&TenantId::named("d")));
        assert!(!paused.contains(&TenantId::named("a")));

        // a's new entry does not start (the builtin refuses an unknown key): a keeps a2.
        let broken = tables(&format!(
            "[tenants.a]\nbuiltin = \"route-by-aggregate\"\nconfig = {{ prefx = \"x.\" }}\n{}",
            tenant("c", "c.")
        ));
        let changes = router.apply(&broken.plugins, &broken.tenants, &BTreeMap::new());
        assert!(changes.refused["a"].contains("prefx"), "{changes:?}");
        assert_eq!(topics(&router, &["a"]).await, ["a2.order"]);
        let status = router.change_status();
        assert!(status.kept_old_version["a"].contains("prefx"), "{status:?}");
        // b was removed: it waits; d's entry never applied and is gone now: released.
        assert_eq!(
            status.waiting.keys().collect::<Vec<_>>(),
            ["b"],
            "{status:?}"
        );

        // Fixed, and b back: everything runs, nothing waits.
        let fixed = tables(&format!(
            "{}{}{}{}",
            tenant("a", "a3."),
            tenant("b", "b."),
            tenant("c", "c."),
            tenant("d", "d.")
        ));
        let changes = router.apply(&fixed.plugins, &fixed.tenants, &BTreeMap::new());
        assert_eq!(changes.started, ["b", "d"]);
        assert_eq!(changes.changed, ["a"]);
        assert_eq!(
            topics(&router, &["a", "b", "c", "d"]).await,
            ["a3.order", "b.order", "c.order", "d.order"]
        );
        assert_eq!(router.change_status(), TenantChangeStatus::default());
        assert!(router.paused_tenants().is_empty());
        // The same settings again: nothing to do.
        assert!(
            router
                .apply(&fixed.plugins, &fixed.tenants, &BTreeMap::new())
                .is_empty()
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_tenant_without_an_entry_that_gets_one_switches_to_it() {
        let start = tables(
            "[plugins.default]\nbuiltin = \"route-by-aggregate\"\nconfig = { topic_prefix = \"d.\" }\n",
        );
        let router = PluginRouter::from_settings(&start.plugins, &start.tenants).unwrap();
        assert_eq!(topics(&router, &["x"]).await, ["d.order"]);
        let next = tables(&format!(
            "[plugins.default]\nbuiltin = \"route-by-aggregate\"\nconfig = {{ topic_prefix = \"d2.\" }}\n{}",
            tenant("x", "x.")
        ));
        let changes = router.apply(&next.plugins, &next.tenants, &BTreeMap::new());
        assert!(changes.default_changed);
        assert_eq!(changes.started, ["x"]);
        assert_eq!(topics(&router, &["x", "y"]).await, ["x.order", "d2.order"]);
        assert_eq!(router.instances().unconfigured.live, 1, "y's");
        // Removing [plugins.default] needs a restart: it stays.
        let without = tables(&tenant("x", "x."));
        let changes = router.apply(&without.plugins, &without.tenants, &BTreeMap::new());
        assert_eq!(changes.restart_needed, ["plugins.default"]);
        assert_eq!(topics(&router, &["z"]).await, ["d2.order"]);
    }
}
