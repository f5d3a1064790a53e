//! `sluice config check`: everything that can be checked before a relay starts, every problem
//! listed. Offline: the file's shape and keys, the rules between keys, every plugin loads,
//! instantiates and accepts its tenant's `configure`, allow-list patterns parse, `[telemetry]
//! listen`'s host resolves. With
//! `--connect`: the table (columns, types, indexes as `sluice run` needs them) and the broker
//! answering. Valid settings that may not do what was meant (how a tenant inherits from
//! `[plugins.default]`, memory budgets past the container's memory limit) are listed as
//! warnings, which do not fail the check.

use std::path::Path;
use std::sync::Arc;

use crate::config::{Config, ConfigError, Problem};
use crate::maintenance::pruner::RetentionMode;
use crate::plugin::{InstanceBudgets, LoadMode, PluginRouter, PluginsSettings, TenantState};
use crate::sink::{self, Brokers};
use crate::store;
use crate::telemetry::settings::BROKER_PROBE_TIMEOUT;

/// What `config check` found: problems (`sluice run` would refuse the file, or a tenant would
/// not start) and warnings (valid, but maybe not what was meant; see [`Config::warnings`]).
#[derive(Debug, Default)]
pub struct CheckReport {
    /// What `sluice run` would refuse, or what keeps a tenant from starting; any fails the check.
    pub problems: Vec<Problem>,
    /// Valid settings that may not do what was meant; they do not fail the check.
    pub warnings: Vec<Problem>,
}

/// Checks the configuration file at `path`; no problems means it is fine.
pub async fn check(path: &Path, connect: bool) -> CheckReport {
    let problem = |key: &str, message: String| CheckReport {
        problems: vec![Problem::new(key, message)],
        warnings: Vec::new(),
    };
    let config = match Config::load_unchecked(path) {
        Ok(config) => config,
        // The file cannot be read or is not a configuration's shape: nothing else to check.
        Err(ConfigError::Read { source, .. }) => return problem("file", source.to_string()),
        Err(ConfigError::Parse { message, .. }) => return problem("file", message),
        Err(e) => return problem("file", e.to_string()),
    };
    let mut problems = config.problems();
    problems.extend(check_listen(&config).await);
    problems.extend(check_plugins(&config).await);
    if connect {
        problems.extend(check_database(&config).await);
        problems.extend(check_broker(&config).await);
    }
    let mut warnings = config.warnings();
    // Budgets written larger than this machine's memory limit leaves plugins.
    warnings.extend(InstanceBudgets::of_this_process(&config.plugins).warnings());
    CheckReport { problems, warnings }
}

/// How long resolving `[telemetry] listen`'s host may take.
const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Resolves `[telemetry] listen`'s host as `sluice run` will (its form is checked by
/// `Config::problems`): a name this machine cannot resolve fails the start.
async fn check_listen(config: &Config) -> Option<Problem> {
    let Some(Ok(listen)) = config.telemetry.listen_addr() else {
        return None;
    };
    let message = match tokio::time::timeout(RESOLVE_TIMEOUT, listen.resolve()).await {
        Ok(Ok(_)) => return None,
        Ok(Err(e)) => format!("cannot resolve {listen}: {e}"),
        Err(_) => format!("cannot resolve {listen}: no answer within {RESOLVE_TIMEOUT:?}"),
    };
    Some(Problem::new("telemetry.listen", message))
}

/// Starts every tenant's plugin as `sluice run` would, quarantining instead of failing, and
/// reports each quarantined tenant with its reason.
async fn check_plugins(config: &Config) -> Vec<Problem> {
    // Through the relay's compile cache: a check of a large (Python, JavaScript) plugin
    // then also spares the next start its compile.
    // Every plugin, also with `load = "lazy"`: a check is where a bad one should show.
    let plugins = PluginsSettings {
        strict_startup: false,
        load: LoadMode::Eager,
        ..config.plugins.clone()
    };
    let tenants = config.tenants.clone();
    let started =
        tokio::task::spawn_blocking(move || PluginRouter::from_settings(&plugins, &tenants)).await;
    let router = match started {
        Ok(Ok(router)) => Arc::new(router),
        Ok(Err(e)) => {
            return vec![Problem::new("plugins", e.to_string())];
        }
        Err(e) => {
            return vec![Problem::new(
                "plugins",
                format!("loading the plugins failed: {e}"),
            )];
        }
    };
    router
        .tenant_statuses()
        .into_iter()
        .filter_map(|s| match s.state {
            TenantState::Quarantined { reason, .. } => Some(Problem::new(
                match s.tenant.name() {
                    Some(name) if s.configured && config.tenants.contains_key(name) => {
                        config.tenant_key(name, &format!("tenants.{name}"))
                    }
                    _ => "plugins.default".to_owned(),
                },
                format!("{} cannot start: {reason}", s.plugin),
            )),
            _ => None,
        })
        .collect()
}

async fn check_database(config: &Config) -> Vec<Problem> {
    let spec = match config.database.table_spec() {
        Ok(spec) => spec,
        // Already reported by `Config::problems`.
        Err(_) => return Vec::new(),
    };
    let mut problems = Vec::new();
    // The options `sluice run` opens with: they say what the table must have beyond its
    // columns (e.g. the tenant index `relay.fair_share` walks).
    let opened = match store::open(config.database_url(), &spec, config.store_options(), 1).await {
        // The grants `sluice run` checks at start-up.
        Ok(store) => {
            // The table `relay.retention_mode = "drop-partitions"` needs, as `sluice run`
            // checks it at start-up.
            let drops = config.relay.retention_mode == RetentionMode::DropPartitions;
            if drops && let Err(e) = store.check_drop_partitions().await {
                problems.push(Problem::new("relay.retention_mode", e.to_string()));
            }
            store
                .check_privileges(&super::assemble::privileges_needed(config))
                .await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = opened {
        problems.push(Problem::new("database", e.to_string()));
    }
    problems
}

/// Connects to every broker `sluice run` would (see [`Config::broker_settings`]) and asks
/// each whether it answers, side by side; one problem per broker that does not, at its
/// section's key.
async fn check_broker(config: &Config) -> Vec<Problem> {
    let settings = config.broker_settings();
    let runtime = tokio::runtime::Handle::current();
    let probed = tokio::task::spawn_blocking(move || {
        let mut problems = Vec::new();
        let mut sinks = Vec::new();
        for s in &settings {
            match sink::connect(s, None, &runtime) {
                Ok(connected) => sinks.push((s.broker(), connected)),
                Err(e) => problems.push(Problem::new(s.broker().as_str(), e.to_string())),
            }
        }
        let brokers = Brokers::of_connected(sinks);
        for (broker, result) in brokers.probes(BROKER_PROBE_TIMEOUT) {
            if let Err(e) = result {
                problems.push(Problem::new(broker.as_str(), e.to_string()));
            }
        }
        problems
    })
    .await;
    probed.unwrap_or_else(|e| vec![Problem::new("kafka", e.to_string())])
}
