//! Hot reload of plugin files, and the retries that bring quarantined tenants back.
//!
//! A new version is compiled once, then instantiated and configured for each tenant using the
//! file *without* holding that tenant's lock (so its rows keep flowing on the old version
//! meanwhile, and a new version that hangs in `configure` holds nobody up); only the swap takes
//! the lock, between two groups of rows. Each tenant switches on its own: one tenant whose
//! config the new version rejects keeps the old version, the others switch. The default plugin
//! is switched first, so a tenant first seen during a reload gets the new version.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::plugin::PluginError;
use crate::plugin::router::{FileStamp, PluginRouter, probe_shared};
use crate::plugin::tenant::template::{PluginCode, PluginInstance, TenantTemplate};
use crate::plugin::tenant::{Tenant, lock};
use crate::plugin::wasm::component::LoadedPlugin;
use crate::text::{MAX_LOGGED, bounded};

/// What one file's reload did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReloadOutcome {
    /// Tenants now on the new version.
    pub switched: usize,
    /// Tenants the new version failed for; they keep the old one.
    pub kept_old: usize,
}

/// The same plugin config and limits with another compiled file, not quarantined.
fn renewed(old: &TenantTemplate, plugin: &Arc<LoadedPlugin>) -> Arc<TenantTemplate> {
    let renewed = TenantTemplate::new(
        PluginCode::Wasm(Arc::clone(plugin)),
        old.config.clone(),
        old.limits.clone(),
    )
    .with_declared_formats(old.formats.clone())
    .pinned(old.pin.clone())
    .signed_by(old.keys.clone());
    Arc::new(match old.quarantine.watch() {
        Some(watch) => renewed.watched_by(watch),
        None => renewed,
    })
}

/// Whether the template's tenants are not running (so there is no old version to keep).
fn not_running(template: &TenantTemplate) -> bool {
    template.quarantine.is_quarantined()
        || matches!(
            template.code,
            PluginCode::Broken { .. } | PluginCode::Pending(_)
        )
}

fn reason_of(error: &PluginError) -> String {
    bounded(&error.to_string(), MAX_LOGGED).into_owned()
}

/// Puts `template` (and `instance`) into the tenant's runner if it still runs `old`.
pub(super) fn swap(
    tenant: &Arc<Tenant>,
    old: &Arc<TenantTemplate>,
    template: Arc<TenantTemplate>,
    instance: Option<PluginInstance>,
) -> bool {
    let mut runner = tenant.runner();
    if !Arc::ptr_eq(&runner.template, old) {
        return false;
    }
    let resumes = old.quarantine.is_quarantined() && !template.quarantine.is_quarantined();
    runner.replace(template, instance);
    if resumes {
        tracing::warn!(tenant = %runner.tenant, "tenant left quarantine: its plugin started");
    }
    drop(runner);
    tenant.enlist_if_live();
    true
}

impl PluginRouter {
    /// Reloads plugin files that changed on disk (all of them with `force`, as on SIGHUP), then
    /// retries quarantined tenants whose back-off has passed. If a new file fails to load, the
    /// old version keeps running and the reason is logged. Returns how many files were loaded.
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
            if self.reload_logged(&path) {
                swapped += 1;
            }
        }
        self.retry_quarantined(Instant::now());
        swapped
    }

    fn reload_logged(&self, path: &Path) -> bool {
        match self.reload_file(path) {
            Ok(outcome) => {
                tracing::info!(plugin = %path.display(), tenants = outcome.switched,
                    kept_old_version = outcome.kept_old, "plugin reloaded");
                true
            }
            Err(e) => {
                let reason = reason_of(&e);
                tracing::error!(plugin = %path.display(), error = %reason,
                    "new plugin version failed to load; the old version keeps running");
                self.still_broken(path, reason);
                false
            }
        }
    }

    /// Loads `path` again and moves every tenant using it to the new version.
    pub fn reload_file(&self, path: &Path) -> Result<ReloadOutcome, PluginError> {
        let plugin = Arc::new(LoadedPlugin::load_fetched(
            &self.engine,
            path,
            self.supply().fetch(path)?,
            self.cache.as_ref(),
        )?);
        let now = Instant::now();
        let old_default = lock(&self.default).clone();
        let new_default = old_default
            .as_ref()
            .filter(|t| t.path() == Some(path))
            .and_then(|old| self.renew_default(old, &plugin, now));
        if let Some(new) = &new_default {
            *lock(&self.default) = Some(Arc::clone(new));
        }

        let mut outcome = ReloadOutcome::default();
        for tenant in self.tenants() {
            let old = tenant.health.template();
            if old.path() != Some(path) {
                continue;
            }
            if let PluginCode::Wasm(p) = &old.code
                && Arc::ptr_eq(p, &plugin)
            {
                continue; // first seen during this reload: already on the new version
            }
            if old.pending() {
                continue; // compiled from the file as it is then, on its first row
            }
            let follows_default = old_default.as_ref().is_some_and(|d| Arc::ptr_eq(d, &old));
            let template = match (&new_default, follows_default) {
                (Some(new), true) => Arc::clone(new),
                (None, true) => {
                    outcome.kept_old += 1;
                    continue;
                }
                (_, false) => renewed(&old, &plugin),
            };
            // A file whose digest is not the tenant's pin, or not signed by one of its keys,
            // never replaces what runs (checked before the swap: tenants without a live
            // instance are not instantiated below).
            if let Some(refused) =
                template.refuses(&plugin, &tenant.health.shared.tenant().to_string())
            {
                let reason = reason_of(&refused);
                if not_running(&old) {
                    template.quarantine.failed(reason, now);
                    swap(&tenant, &old, template, None);
                } else {
                    tracing::error!(tenant = %tenant.health.shared.tenant(), plugin = %path.display(),
                        reason = %reason, "new plugin version refused for this tenant; it keeps the old version");
                    outcome.kept_old += 1;
                }
                continue;
            }
            let needs_instance = tenant.configured || tenant.health.has_instance();
            if !needs_instance || template.quarantine.is_quarantined() {
                if swap(&tenant, &old, template, None) {
                    outcome.switched += 1;
                }
                continue;
            }
            // The new version's `configure` runs here, without the tenant's lock.
            match PluginInstance::create(&template, &tenant.health.shared) {
                Ok(instance) => {
                    if swap(&tenant, &old, template, Some(instance)) {
                        outcome.switched += 1;
                    }
                }
                Err(e) if not_running(&old) => {
                    if !follows_default {
                        template.quarantine.failed(reason_of(&e), now);
                    }
                    swap(&tenant, &old, template, None);
                }
                Err(e) => {
                    tracing::error!(tenant = %tenant.health.shared.tenant(), plugin = %path.display(),
                        reason = %reason_of(&e),
                        "new plugin version failed to start for this tenant; it keeps the old version");
                    outcome.kept_old += 1;
                }
            }
        }
        Ok(outcome)
    }

    /// The default plugin's new template, tried first; `None` keeps the old one.
    fn renew_default(
        &self,
        old: &Arc<TenantTemplate>,
        plugin: &Arc<LoadedPlugin>,
        now: Instant,
    ) -> Option<Arc<TenantTemplate>> {
        let new = renewed(old, plugin);
        match PluginInstance::create(&new, &probe_shared()) {
            Ok(_) => Some(new),
            Err(e) if not_running(old) => {
                new.quarantine.failed(reason_of(&e), now);
                Some(new)
            }
            Err(e) => {
                tracing::error!(plugin = %plugin.path().display(), reason = %reason_of(&e),
                    "new plugin version failed to start as [plugins.default]; tenants without \
                     their own entry keep the old version");
                None
            }
        }
    }

    /// A file that failed to load again: its quarantined tenants back off further.
    fn still_broken(&self, path: &Path, reason: String) {
        let now = Instant::now();
        let default = lock(&self.default).clone();
        let templates = self
            .tenants()
            .into_iter()
            .map(|t| t.health.template())
            .chain(default);
        for template in templates {
            if template.path() == Some(path) && not_running(&template) {
                template.quarantine.failed(reason.clone(), now);
            }
        }
    }

    /// Tries to start each quarantined plugin whose back-off has passed.
    fn retry_quarantined(&self, now: Instant) {
        let tenants = self.tenants();
        let default = lock(&self.default).clone();
        let mut due: Vec<(Arc<TenantTemplate>, Option<Arc<Tenant>>)> = Vec::new();
        let mut add = |template: Arc<TenantTemplate>, tenant: Option<Arc<Tenant>>| {
            if template.quarantine.due(now) && !due.iter().any(|(t, _)| Arc::ptr_eq(t, &template)) {
                due.push((template, tenant));
            }
        };
        for tenant in &tenants {
            add(tenant.health.template(), Some(Arc::clone(tenant)));
        }
        if let Some(default) = default {
            add(default, None);
        }
        let mut files_tried: HashSet<PathBuf> = HashSet::new();
        for (template, tenant) in due {
            if let PluginCode::Broken { path, .. } = &template.code {
                // The file itself did not load: load it again, once per file.
                if files_tried.insert(path.clone()) {
                    self.reload_logged(path);
                }
                continue;
            }
            let shared = tenant
                .as_ref()
                .map_or_else(probe_shared, |t| Arc::clone(&t.health.shared));
            match PluginInstance::create(&template, &shared) {
                Ok(instance) => {
                    template.quarantine.clear();
                    tracing::warn!(plugin = %template.describe(),
                        "quarantined plugin started; its tenants resume");
                    if let Some(tenant) = tenant {
                        let mut runner = tenant.runner();
                        if Arc::ptr_eq(&runner.template, &template) {
                            runner.install_if_empty(instance);
                        }
                        drop(runner);
                        tenant.enlist_if_live();
                    }
                }
                Err(e) => {
                    let reason = reason_of(&e);
                    template.quarantine.failed(reason.clone(), now);
                    let next_try = template
                        .quarantine
                        .state()
                        .map(|s| s.next_try.saturating_duration_since(now))
                        .unwrap_or_default();
                    tracing::warn!(plugin = %template.describe(), reason = %reason,
                        next_try = %humantime::format_duration(next_try),
                        "plugin still fails to start; its tenants stay quarantined");
                }
            }
        }
    }
}
