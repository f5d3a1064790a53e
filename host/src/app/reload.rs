//! Live configuration: the one service that applies changes while the relay runs.
//!
//! It wakes every [`WATCH_INTERVAL`], on SIGHUP and on `POST /reload` (with `[telemetry]
//! reload = true`). Each time it reloads replaced plugin files (all of them on SIGHUP and
//! `POST /reload`), and when the config file or a tenant file changed (or was asked to),
//! reads the configuration again and applies what can change live: credentials ([`rotate`]),
//! `[plugins.default]` and every tenant's entry ([`PluginRouter::apply`]). Relay-wide
//! settings read at start only are named as needing a restart.
//!
//! Changes are noticed by each file's metadata (inode, size, modification time), following
//! symlinks: replacing a file, rewriting it, and Kubernetes' swap of a mounted ConfigMap's
//! `..data` symlink all change it, on any file system, without inotify watches to run out of.
//! A change is applied once the files stay unchanged for [`SETTLE`], so a file written in two
//! steps is read whole (an atomic rename is still the safe way to write one).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use tokio::signal::unix::Signal;
use tokio::sync::{mpsc, oneshot};

use super::assemble::AppRelay;
use super::rotate::{self, Applied};
use crate::config::{Config, Problem, tenant_of};
use crate::model::Broker;
use crate::plugin::{PluginRouter, PluginSpec, TenantChanges};
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::telemetry::Metrics;
use crate::telemetry::metrics::ReloadOutcome;

/// How often plugin files, the config file and the tenant files are looked at.
pub(super) const WATCH_INTERVAL: Duration = Duration::from_secs(1);
/// How long the files must stay unchanged before a change is read.
const SETTLE: Duration = Duration::from_millis(300);
/// Most times a change is waited on to settle before it is read anyway.
const MAX_SETTLE_ROUNDS: usize = 10;

/// A `POST /reload`'s answer channel.
pub(crate) type ReloadRequest = oneshot::Sender<ReloadReport>;

/// What one reload did: `POST /reload` answers it as JSON.
#[derive(Debug, Default, Clone, Serialize)]
pub(crate) struct ReloadReport {
    /// Whether the configuration was read again (always on SIGHUP and `POST /reload`).
    pub config_read: bool,
    /// What is wrong with the re-read configuration; the parts it concerns keep their
    /// running settings.
    pub problems: Vec<String>,
    /// Plugin files loaded again.
    pub plugin_files_reloaded: usize,
    /// What changed tenant by tenant.
    pub tenants: TenantChanges,
    /// Changed settings that take effect at the next restart.
    pub restart_needed: Vec<String>,
}

impl ReloadReport {
    /// Whether everything asked for applied.
    pub(crate) fn ok(&self) -> bool {
        self.problems.is_empty() && self.tenants.refused.is_empty()
    }
}

/// The metadata of every file a configuration is read from.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct ConfigStamp(BTreeMap<PathBuf, Option<(u64, u64, Option<SystemTime>)>>);

impl ConfigStamp {
    /// The config file's and, with `tenants_dir`, the directory's tenant files' stamps.
    pub(super) fn of(config: &Path, tenants_dir: Option<&Path>) -> Self {
        let mut stamps = BTreeMap::new();
        stamps.insert(config.to_owned(), stamp(config));
        if let Some(dir) = tenants_dir {
            // Not the directory's own stamp: an editor's swap file coming and going is no
            // change; a tenant file added or removed is one in the map's keys.
            if let Ok(entries) = std::fs::read_dir(dir) {
                for entry in entries.flatten() {
                    let name = entry.file_name();
                    if name.to_str().and_then(tenant_of).is_some() {
                        let path = entry.path();
                        stamps.insert(path.clone(), stamp(&path));
                    }
                }
            }
        }
        Self(stamps)
    }
}

fn stamp(path: &Path) -> Option<(u64, u64, Option<SystemTime>)> {
    use std::os::unix::fs::MetadataExt;
    // Following symlinks: a swapped `..data` gives every mounted file another inode.
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.ino(), meta.len(), meta.modified().ok()))
}

/// The live-configuration service's state.
pub(super) struct Reloader {
    /// The config file (`None`: the relay was not started from a file; only plugin files are
    /// watched).
    pub path: Option<PathBuf>,
    pub applied: Applied,
    pub router: Arc<PluginRouter>,
    pub relay: Arc<AppRelay>,
    pub store: Arc<Store>,
    /// What the configuration's files looked like when last read.
    pub stamp: ConfigStamp,
    /// The relay-wide settings as started, to name those that changed.
    pub started: RestartOnly,
    /// Where reloads are counted, with `[telemetry] listen`.
    pub metrics: Option<Arc<Metrics>>,
}

/// The settings that are read at start only, as text (secrets redacted; credentials, which
/// rotate live, left out), by key.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct RestartOnly(BTreeMap<&'static str, String>);

impl RestartOnly {
    pub(super) fn of(config: &Config) -> Self {
        let mut database = config.database.clone();
        database.url = None;
        let mut telemetry = config.telemetry.clone();
        telemetry.bearer_token = None;
        telemetry.basic_auth_username = None;
        telemetry.basic_auth_password = None;
        let registry = config.schema_registry.as_ref().map(|r| r.url.to_string());
        // The relay connects to the brokers it has at start: a section added or removed
        // (not one whose settings changed: those rotate live) needs a restart.
        let brokers: Vec<&str> = config
            .broker_settings()
            .iter()
            .map(|b| b.broker().as_str())
            .collect();
        Self(BTreeMap::from([
            ("relay", format!("{:?}", config.relay)),
            ("database", format!("{database:?}")),
            ("telemetry", format!("{telemetry:?}")),
            ("schema_registry.url", format!("{registry:?}")),
            ("brokers", format!("{brokers:?}")),
            ("tracing", format!("{:?}", config.tracing)),
        ]))
    }

    fn changed(&self, fresh: &Self) -> Vec<String> {
        self.0
            .iter()
            .filter(|(key, value)| fresh.0.get(*key) != Some(*value))
            .map(|(key, _)| (*key).to_owned())
            .collect()
    }
}

/// Runs the service until shutdown; `requests` are `POST /reload`s.
pub(super) async fn run(
    mut reloader: Reloader,
    hangup: std::io::Result<Signal>,
    mut requests: mpsc::Receiver<ReloadRequest>,
    mut shutdown: Shutdown,
) {
    let mut hangup = match hangup {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; files are still watched");
            None
        }
    };
    let mut tick = tokio::time::interval(WATCH_INTERVAL);
    loop {
        let (forced, reply) = tokio::select! {
            _ = tick.tick() => (false, None),
            Some(()) = async {
                match hangup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                tracing::info!("SIGHUP: reloading the configuration and the plugins");
                (true, None)
            }
            Some(reply) = requests.recv() => {
                tracing::info!("POST /reload: reloading the configuration and the plugins");
                (true, Some(reply))
            }
            _ = shutdown.recv() => return,
        };
        let started = Instant::now();
        let report = reloader.once(forced).await;
        if forced || !report.tenants.is_empty() {
            tracing::info!(
                plugin_files = report.plugin_files_reloaded,
                tenants_started = report.tenants.started.len(),
                tenants_changed = report.tenants.changed.len(),
                tenants_removed = report.tenants.removed.len(),
                tenants_refused = report.tenants.refused.len(),
                problems = report.problems.len(),
                took_ms = started.elapsed().as_millis() as u64,
                "configuration reloaded"
            );
        }
        if let Some(reply) = reply {
            let _ = reply.send(report);
        }
    }
}

impl Reloader {
    /// One round: replaced plugin files (all with `forced`), then the configuration when its
    /// files changed (always with `forced`).
    async fn once(&mut self, forced: bool) -> ReloadReport {
        let mut report = ReloadReport::default();
        let router = Arc::clone(&self.router);
        // Compiling and instantiating are blocking work.
        report.plugin_files_reloaded = tokio::task::spawn_blocking(move || router.reload(forced))
            .await
            .unwrap_or(0);
        let Some(path) = self.path.clone() else {
            return report;
        };
        let dir = self.applied.config.tenants_dir();
        if !forced && ConfigStamp::of(&path, dir.as_deref()) == self.stamp {
            return report;
        }
        // Let a change settle: a file written in two steps is read once, whole.
        let mut stamp = ConfigStamp::of(&path, dir.as_deref());
        for _ in 0..MAX_SETTLE_ROUNDS {
            tokio::time::sleep(SETTLE).await;
            let again = ConfigStamp::of(&path, dir.as_deref());
            if again == stamp {
                break;
            }
            stamp = again;
        }
        report.config_read = true;
        let fresh = match Config::load_unchecked(&path) {
            Ok(config) => config,
            Err(e) => {
                tracing::error!(error = %e,
                    "the changed configuration cannot be read; everything keeps running as it is");
                report.problems.push(e.to_string());
                self.stamp = stamp;
                if let Some(metrics) = &self.metrics {
                    metrics.health.config_reloaded(ReloadOutcome::Refused);
                }
                return report;
            }
        };
        // The directory the fresh file names (it may have changed) is watched from now on.
        self.stamp = ConfigStamp::of(&path, fresh.tenants_dir().as_deref());
        let problems = fresh.problems();
        for p in &problems {
            tracing::error!(key = %p.key, problem = %p.reason(),
                "changed configuration: this does not check; what it concerns keeps running as it is");
        }
        report.problems = problems.iter().map(ToString::to_string).collect();
        rotate::credentials(
            &fresh,
            &problems,
            &mut self.applied,
            &self.relay,
            &self.store,
        )
        .await;
        report.tenants = self.tenants(&fresh, &problems).await;
        if let Some(metrics) = &self.metrics
            && !(report.tenants.started.is_empty() && report.tenants.removed.is_empty())
        {
            // Within `[telemetry] tenant_series`: the label budget decides who is named.
            metrics.set_configured_tenants(fresh.tenants.keys().map(String::as_str));
        }
        report.restart_needed = self.started.changed(&RestartOnly::of(&fresh));
        report
            .restart_needed
            .extend(report.tenants.restart_needed.iter().cloned());
        for key in &report.restart_needed {
            tracing::warn!(key = %key,
                "changed setting is read at start only: it takes effect at the next restart");
        }
        self.applied.config = fresh;
        if let Some(metrics) = &self.metrics {
            metrics.health.config_reloaded(if report.ok() {
                ReloadOutcome::Applied
            } else {
                ReloadOutcome::Refused
            });
        }
        report
    }

    /// Applies the tenants' entries: each tenant with a problem of its own keeps what runs;
    /// a problem of `[plugins]` itself (or an unreadable tenant directory) keeps every tenant.
    async fn tenants(&self, fresh: &Config, problems: &[Problem]) -> TenantChanges {
        let mut refused: BTreeMap<String, String> = BTreeMap::new();
        let mut whole = false;
        for problem in problems {
            match fresh.tenant_of_problem(problem) {
                Some(name) => {
                    let why = refused.entry(name).or_default();
                    if !why.is_empty() {
                        why.push_str("; ");
                    }
                    why.push_str(&problem.to_string());
                }
                None if rotate::in_section(&problem.key, "plugins") => whole = true,
                None => {}
            }
        }
        // A broker section added since the start has no connection until a restart: a tenant
        // moved to it keeps its running version (its messages would have nowhere to go).
        let connected: Vec<Broker> = self.relay.sink().brokers().collect();
        let default = fresh.plugins.default.as_ref();
        if let Some(broker) = default.map(PluginSpec::broker)
            && !connected.contains(&broker)
        {
            tracing::error!(%broker,
                "[plugins.default] sends to a broker this relay has no connection to (its section is read at start only): every tenant keeps running as it is until a restart");
            return TenantChanges::default();
        }
        for (name, tenant) in &fresh.tenants {
            let broker = tenant.inherit(default).broker();
            if !connected.contains(&broker) {
                let why = refused.entry(name.clone()).or_default();
                if !why.is_empty() {
                    why.push_str("; ");
                }
                why.push_str(&format!(
                    "tenants.{name}.broker: this relay has no connection to \"{broker}\" \
                     ([{broker}] is read at start only): restart to send there"
                ));
            }
        }
        if whole {
            tracing::error!(
                "[plugins] does not check: every tenant keeps running as it is until it does"
            );
            return TenantChanges::default();
        }
        let router = Arc::clone(&self.router);
        let (plugins, tenants) = (fresh.plugins.clone(), fresh.tenants.clone());
        tokio::task::spawn_blocking(move || router.apply(&plugins, &tenants, &refused))
            .await
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubernetes_style_swap_changes_the_stamp() {
        // A mounted ConfigMap: `acme.toml -> ..data/acme.toml`, `..data -> ..<timestamp>`; an
        // update writes a new timestamped directory and renames a new `..data` over the old.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("..v1")).unwrap();
        std::fs::write(d.join("..v1/acme.toml"), "path = \"a.wasm\"\n").unwrap();
        std::os::unix::fs::symlink("..v1", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/acme.toml", d.join("acme.toml")).unwrap();
        let config = d.join("sluice.toml");
        std::fs::write(&config, "").unwrap();
        let before = ConfigStamp::of(&config, Some(d));
        assert_eq!(before, ConfigStamp::of(&config, Some(d)));
        assert_eq!(before.0.len(), 2, "{before:?}"); // the config and acme.toml
        std::fs::create_dir(d.join("..v2")).unwrap();
        std::fs::write(d.join("..v2/acme.toml"), "path = \"a.wasm\"\n").unwrap();
        std::os::unix::fs::symlink("..v2", d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        std::fs::remove_dir_all(d.join("..v1")).unwrap();
        // Same size, maybe the same mtime: the inode tells.
        assert_ne!(before, ConfigStamp::of(&config, Some(d)));
    }

    #[test]
    fn hidden_and_foreign_names_do_not_count() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let config = d.join("sluice.toml");
        std::fs::write(&config, "").unwrap();
        let tenants = d.join("tenants.d");
        std::fs::create_dir(&tenants).unwrap();
        let before = ConfigStamp::of(&config, Some(&tenants));
        std::fs::write(tenants.join(".acme.toml.swp"), "x").unwrap();
        std::fs::write(tenants.join("acme.toml~"), "x").unwrap();
        assert_eq!(before, ConfigStamp::of(&config, Some(&tenants)));
        std::fs::write(tenants.join("acme.toml"), "x").unwrap();
        assert_ne!(before, ConfigStamp::of(&config, Some(&tenants)));
    }

    #[test]
    fn restart_only_settings_name_their_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.toml");
        let text = "[database]\nurl = \"postgres://u:one@h/db\"\n";
        let a = Config::parse(text, &path).unwrap();
        let b = Config::parse(&text.replace("one", "two"), &path).unwrap();
        // A rotated password is applied live, not a restart's business.
        assert!(RestartOnly::of(&a).changed(&RestartOnly::of(&b)).is_empty());
        let c = Config::parse(&format!("{text}[relay]\nbatch_size = 7\n"), &path).unwrap();
        assert_eq!(RestartOnly::of(&a).changed(&RestartOnly::of(&c)), ["relay"]);
        let d = format!("{text}[tracing]\notlp_endpoint = \"http://c:4318\"\n");
        let d = Config::parse(&d, &path).unwrap();
        assert_eq!(
            RestartOnly::of(&a).changed(&RestartOnly::of(&d)),
            ["tracing"]
        );
    }
}
