//! The per-tenant picture behind `/status` and `sluice status`: backlog, oldest due age and
//! dead rows from the store's sample, joined with what the plugin router knows (state, pause,
//! plugin and its digest, quarantine reason, guest counters).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::plugin::{PluginSource, TenantState, TenantStatus};
use crate::store::{self, OutboxStore, StoreOptions, TenantBacklog};
use crate::telemetry::auth::Access;
use crate::telemetry::client::get;
use crate::telemetry::listen::{ListenAddr, reachable};

/// One tenant's line of the status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantReport {
    /// The tenant column's value; `None`: rows without a tenant.
    pub tenant: Option<String>,
    /// Rows due now (at least this many when the sample was saturated).
    pub due: i64,
    /// Age of the oldest due row, in seconds by the database's clock; `None`: none is due.
    pub oldest_due_age_seconds: Option<f64>,
    /// Dead-lettered rows (at least this many when the sample was saturated).
    pub dead: i64,
    /// `running`, `stalled`, `paused` or `quarantined`; `None` when no relay reported it.
    pub state: Option<String>,
    /// When a paused or quarantined tenant is tried again.
    pub paused_until: Option<DateTime<Utc>>,
    /// The plugin file (or `builtin:<name>`).
    pub plugin: Option<String>,
    /// The plugin file's content hash as loaded (`sha256:…`; none for builtins).
    pub digest: Option<String>,
    /// The version the plugin reports about itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_version: Option<String>,
    /// Why the tenant is quarantined (its plugin failed to start).
    pub last_error: Option<String>,
    /// The plugin's `counter-add` totals, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
}

/// The whole status: every tenant the sample or the router knows, rows without a tenant
/// first, then by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// When the backlog was sampled; `None` before the first sample.
    pub sampled_at: Option<DateTime<Utc>>,
    /// Rows a sample reads at most: counts equal to it are lower bounds.
    pub sample_limit: i64,
    /// Whether the database answered its last check; `None`: not checked.
    pub database_up: Option<bool>,
    /// Whether the broker answered its last check; `None`: no relay reported it.
    pub kafka_up: Option<bool>,
    /// One line per tenant: rows without a tenant first, then by name.
    pub tenants: Vec<TenantReport>,
}

fn state_name(state: &TenantState) -> &'static str {
    match state {
        TenantState::Running => "running",
        TenantState::Stalled => "stalled",
        TenantState::Paused { .. } => "paused",
        TenantState::Quarantined { .. } => "quarantined",
    }
}

fn after(now: SystemTime, wait: Duration) -> Option<DateTime<Utc>> {
    now.checked_add(wait).map(DateTime::<Utc>::from)
}

/// Joins a backlog sample and the router's tenant statuses into one line per tenant.
pub fn tenant_reports(backlog: &[TenantBacklog], statuses: &[TenantStatus]) -> Vec<TenantReport> {
    let mut by_tenant: BTreeMap<Option<String>, TenantReport> = BTreeMap::new();
    for b in backlog {
        let r = by_tenant.entry(b.tenant.clone()).or_default();
        r.tenant = b.tenant.clone();
        r.due += b.due;
        r.dead += b.dead;
        r.oldest_due_age_seconds = b.oldest_due_age.map(|age| age.as_secs_f64());
    }
    let now = SystemTime::now();
    for s in statuses {
        let name = s.tenant.name().map(str::to_owned);
        let r = by_tenant.entry(name.clone()).or_default();
        r.tenant = name;
        r.state = Some(state_name(&s.state).to_owned());
        r.plugin = Some(s.plugin.clone());
        r.digest = s.digest.clone();
        r.plugin_version = s.version.clone();
        r.counters = s.counters.clone();
        match &s.state {
            TenantState::Paused { remaining } => r.paused_until = after(now, *remaining),
            TenantState::Quarantined {
                reason,
                next_try_in,
                ..
            } => {
                r.paused_until = after(now, *next_try_in);
                r.last_error = Some(reason.clone());
            }
            TenantState::Running | TenantState::Stalled => {}
        }
    }
    by_tenant.into_values().collect()
}

/// Where `sluice status` got its picture.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusSource {
    /// The database only (no `[telemetry] listen`, or no relay answered there: the reason).
    Database {
        /// Why no relay was asked or none answered; `None`: no `[telemetry] listen`.
        relay: Option<String>,
    },
    /// The database, and a running relay's `/status` for each tenant's state and plugin.
    DatabaseAndRelay(SocketAddr),
}

/// How long `sluice status` waits for a running relay's `/status`.
const RELAY_STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// `sluice status`: the backlog per tenant read from the database now, each configured tenant's
/// plugin, and — when `[telemetry] listen` names a relay that answers — its tenants' states.
pub async fn status(config: &Config) -> anyhow::Result<(StatusReport, StatusSource)> {
    let spec = config.database.table_spec()?;
    let store = store::open(config.database_url(), &spec, StoreOptions::default(), 1).await?;
    let backlog = store.sample_backlog(config.telemetry.sample_limit).await?;
    let mut report = StatusReport {
        sampled_at: Some(Utc::now()),
        sample_limit: config.telemetry.sample_limit,
        database_up: Some(true),
        kafka_up: None,
        tenants: tenant_reports(&backlog, &[]),
    };
    for (name, spec) in &config.tenants {
        let r = entry(&mut report.tenants, Some(name.as_str()));
        r.plugin = spec
            .inherit(config.plugins.default.as_ref())
            .source()
            .map(|s| describe(&s));
    }
    // Rows without a tenant, and tenants without an entry, run `[plugins.default]`.
    if let Some(default) = config.plugins.default.as_ref().and_then(|d| d.source()) {
        for r in report.tenants.iter_mut().filter(|r| r.plugin.is_none()) {
            r.plugin = Some(describe(&default));
        }
    }
    let Some(listen) = config.telemetry.listen_addr() else {
        return Ok((report, StatusSource::Database { relay: None }));
    };
    let relay = relay_status(listen, &config.telemetry.access()).await;
    match relay {
        Ok((relay, addr)) => {
            report.kafka_up = relay.kafka_up;
            for t in relay.tenants {
                let r = entry(&mut report.tenants, t.tenant.as_deref());
                r.state = t.state;
                r.paused_until = t.paused_until;
                r.plugin = t.plugin.or(r.plugin.take());
                r.digest = t.digest;
                r.plugin_version = t.plugin_version;
                r.last_error = t.last_error;
                r.counters = t.counters;
            }
            Ok((report, StatusSource::DatabaseAndRelay(addr)))
        }
        Err(why) => Ok((report, StatusSource::Database { relay: Some(why) })),
    }
}

/// A running relay's `/status`, asked at `[telemetry] listen` with the credentials of the same
/// `[telemetry]` section: the report and where it came from, or why there is none. A name
/// that resolves to several addresses is asked at each in turn (IPv4 first, as the relay binds).
async fn relay_status(
    listen: Result<ListenAddr, String>,
    access: &Access,
) -> Result<(StatusReport, SocketAddr), String> {
    let listen = listen.map_err(|e| format!("telemetry.listen: {e}"))?;
    let addrs = listen
        .resolve()
        .await
        .map_err(|e| format!("telemetry.listen: cannot resolve {listen}: {e}"))?;
    let authorization = access.authorization();
    let mut why = Vec::new();
    // A relay listening on every interface answers on the loopback one.
    for addr in addrs.into_iter().map(reachable) {
        match get(
            addr,
            "/status",
            authorization.as_ref(),
            RELAY_STATUS_TIMEOUT,
        )
        .await
        {
            Ok((200, body)) => {
                return serde_json::from_str::<StatusReport>(&body)
                    .map(|report| (report, addr))
                    .map_err(|e| format!("{addr}/status: {e}"));
            }
            Ok((401, _)) => {
                return Err(format!(
                    "{addr}/status answered 401: the relay requires credentials; give this \
                     config the relay's [telemetry] bearer_token or basic_auth_username and \
                     basic_auth_password"
                ));
            }
            Ok((code, _)) => return Err(format!("{addr}/status answered {code}")),
            Err(e) => why.push(e.to_string()),
        }
    }
    Err(why.join("; "))
}

/// A plugin as `/status` names it: its file, or `builtin:<name>`.
fn describe(source: &PluginSource) -> String {
    match source {
        PluginSource::Wasm(path) => path.display().to_string(),
        PluginSource::Builtin(name) => format!("builtin:{name}"),
    }
}

/// The line of `tenant`, added (in order) when missing.
fn entry<'r>(tenants: &'r mut Vec<TenantReport>, tenant: Option<&str>) -> &'r mut TenantReport {
    let at = match tenants.binary_search_by(|t| t.tenant.as_deref().cmp(&tenant)) {
        Ok(at) => at,
        Err(at) => {
            tenants.insert(
                at,
                TenantReport {
                    tenant: tenant.map(str::to_owned),
                    ..TenantReport::default()
                },
            );
            at
        }
    };
    &mut tenants[at]
}

/// The status as a table for people.
pub fn render_table(report: &StatusReport) -> String {
    let mut out = String::new();
    let header = [
        "TENANT",
        "DUE",
        "OLDEST",
        "DEAD",
        "STATE",
        "PAUSED UNTIL",
        "PLUGIN",
        "DIGEST",
    ];
    let mut rows: Vec<[String; 8]> = vec![header.map(str::to_owned)];
    let bound = |n: i64| {
        if n >= report.sample_limit {
            format!("≥{n}")
        } else {
            n.to_string()
        }
    };
    for t in &report.tenants {
        rows.push([
            t.tenant.clone().unwrap_or_else(|| "(none)".to_owned()),
            bound(t.due),
            t.oldest_due_age_seconds
                .map(|s| humantime::format_duration(Duration::from_secs(s as u64)).to_string())
                .unwrap_or_else(|| "-".to_owned()),
            bound(t.dead),
            t.state.clone().unwrap_or_else(|| "-".to_owned()),
            t.paused_until
                .map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_else(|| "-".to_owned()),
            t.plugin.clone().unwrap_or_else(|| "-".to_owned()),
            t.digest
                .as_deref()
                .map(|d| d.chars().take(19).collect())
                .unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    for t in report.tenants.iter().filter(|t| t.last_error.is_some()) {
        let name = t.tenant.as_deref().unwrap_or("(none)");
        out.push_str(&format!(
            "{name}: {}\n",
            t.last_error.as_deref().unwrap_or_default()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TenantId;

    #[test]
    fn sample_and_router_join_by_tenant() {
        let backlog = [
            TenantBacklog {
                tenant: Some("acme".into()),
                due: 3,
                oldest_due_age: Some(Duration::from_secs(90)),
                dead: 1,
            },
            TenantBacklog {
                tenant: None,
                due: 2,
                oldest_due_age: None,
                dead: 0,
            },
        ];
        let statuses = [TenantStatus {
            tenant: TenantId::named("acme"),
            plugin: "acme.wasm".into(),
            digest: Some("sha256:ab".into()),
            version: Some("1.2.0".into()),
            configured: true,
            state: TenantState::Paused {
                remaining: Duration::from_secs(30),
            },
            instance: true,
            counters: BTreeMap::new(),
            instantiations: BTreeMap::new(),
            limit_hits: BTreeMap::new(),
        }];
        let reports = tenant_reports(&backlog, &statuses);
        assert_eq!(reports.len(), 2);
        assert_eq!(reports[0].tenant, None);
        let acme = &reports[1];
        assert_eq!((acme.due, acme.dead), (3, 1));
        assert_eq!(acme.state.as_deref(), Some("paused"));
        assert!(acme.paused_until.is_some());
        let table = render_table(&StatusReport {
            sample_limit: 10_000,
            tenants: reports,
            ..StatusReport::default()
        });
        assert!(table.contains("acme"), "{table}");
        assert!(table.contains("1m 30s"), "{table}");
    }
}
