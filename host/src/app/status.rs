//! The per-tenant picture behind `/status` and `sluice status`: backlog, oldest due age and
//! dead rows from the store's sample, joined with what the plugin router knows (state, pause,
//! plugin and its digest, quarantine reason, guest counters), and the tenants furthest behind.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::plugin::{
    InstanceUse, PluginInstances, PluginSource, TenantChangeStatus, TenantState, TenantStatus,
};
use crate::store::{self, OutboxStore, ReplayProgress, StoreOptions, TenantBacklog};
use crate::telemetry::auth::Access;
use crate::telemetry::client::get;
use crate::telemetry::laggards::{Lag, worst};
use crate::telemetry::listen::{ListenAddr, reachable};
use crate::text::{MAX_LOGGED, bounded};

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
    /// Where the loaded plugin came from: its file, or the OCI reference with the manifest
    /// digest it resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The trusted key that signed it (`minisign:<key id>`), when `trusted_keys` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    /// The version the plugin reports about itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_version: Option<String>,
    /// Why the tenant is quarantined (its plugin failed to start).
    pub last_error: Option<String>,
    /// The plugin's `counter-add` totals, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
}

/// One of the tenants furthest behind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Laggard {
    /// The tenant column's value; `None`: rows without a tenant.
    pub tenant: Option<String>,
    /// Rows due now.
    pub due: i64,
    /// Age of the oldest due row, in seconds by the database's clock.
    pub oldest_due_age_seconds: f64,
    /// As in [`TenantReport::state`].
    pub state: Option<String>,
}

/// A `sluice replay` whose rows are not all sent again yet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// The replay's id (its `sluice-replay` header): when it started, by the database's clock.
    pub id: String,
    /// Its rows not sent again yet (dead ones not counted).
    pub rows_left: i64,
    /// Of those, rows due now: how far the relays are behind its schedule.
    pub rows_due: i64,
    /// Rows per second its schedule still makes due; `None`: all are due already.
    pub rate_per_second: Option<f64>,
    /// Seconds until its last row comes due; `None`: all are due already.
    pub eta_seconds: Option<f64>,
}

impl ReplayReport {
    /// The report of one replay's progress.
    pub fn of(p: &ReplayProgress) -> Self {
        Self {
            id: p.id.clone(),
            rows_left: p.left,
            rows_due: p.due,
            rate_per_second: p.rate(),
            eta_seconds: p.eta_seconds(),
        }
    }

    /// One line for people: `replay 2026-…Z: 1200 rows left (30 due now), 500 rows/s, ETA 2s`.
    pub fn line(&self) -> String {
        let rate = self
            .rate_per_second
            .map_or_else(|| "all due".to_owned(), |r| format!("{} rows/s", r.round()));
        let eta = self.eta_seconds.map_or_else(
            || "as fast as the relays send".to_owned(),
            |s| humantime::format_duration(Duration::from_secs(s.ceil() as u64)).to_string(),
        );
        format!(
            "replay {}: {} rows left ({} due now), {rate}, ETA {eta}",
            self.id, self.rows_left, self.rows_due
        )
    }
}

/// The whole status: every tenant the sample or the router knows, rows without a tenant
/// first, then by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// When the backlog was sampled; `None` before the first sample.
    pub sampled_at: Option<DateTime<Utc>>,
    /// Rows a sample reads at most: counts equal to it are lower bounds.
    pub sample_limit: i64,
    /// The sample read `sample_limit` unsent (or dead) rows: every count is a lower bound, and
    /// tenants whose rows come later in claim order were not seen.
    #[serde(default)]
    pub saturated: bool,
    /// Whether the database answered its last check; `None`: not checked.
    pub database_up: Option<bool>,
    /// Whether Kafka answered its last check; `None`: no relay reported it, or the relay
    /// does not publish to Kafka (kept beside `brokers_up` for readers of older reports).
    pub kafka_up: Option<bool>,
    /// Whether each broker the relay publishes to answered its last check, by name
    /// (`kafka`, `nats`, `rabbitmq`, `redis`); `None`: no relay reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brokers_up: Option<BTreeMap<String, bool>>,
    /// The `[telemetry] laggards` tenants furthest behind, worst first: the oldest due row
    /// first, then the most due rows.
    #[serde(default)]
    pub laggards: Vec<Laggard>,
    /// One line per tenant: rows without a tenant first, then by name.
    pub tenants: Vec<TenantReport>,
    /// The live plugin instances and their budgets (a running relay's report only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<PluginInstances>,
    /// Tenants whose rows wait (removed, or an entry that does not check) and tenants on an
    /// older version because their latest change did not apply (a running relay's only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_changes: Option<TenantChangeStatus>,
    /// `sluice replay`s with rows still to send again: rows left, rate and ETA.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replays: Vec<ReplayReport>,
}

impl StatusReport {
    /// The report of one backlog sample taken `at` (reading at most `sample_limit` rows of a
    /// kind) joined with the router's `statuses`; no laggards ranked yet.
    pub fn of_sample(
        at: Option<DateTime<Utc>>,
        backlog: &[TenantBacklog],
        statuses: &[TenantStatus],
        sample_limit: i64,
    ) -> Self {
        let unsent: i64 = backlog.iter().map(|b| b.due + b.waiting).sum();
        let dead: i64 = backlog.iter().map(|b| b.dead).sum();
        Self {
            sampled_at: at,
            sample_limit,
            saturated: unsent >= sample_limit || dead >= sample_limit,
            tenants: tenant_reports(backlog, statuses),
            ..Self::default()
        }
    }

    /// Ranks the `n` tenants furthest behind into `laggards`, with their states.
    pub fn rank_laggards(&mut self, n: usize) {
        let lags = self.tenants.iter().filter_map(|t| {
            Some(Lag {
                tenant: t.tenant.as_deref(),
                oldest_due_age_seconds: t.oldest_due_age_seconds?,
                due: t.due,
            })
        });
        let laggards = worst(lags, n)
            .iter()
            .map(|lag| Laggard {
                tenant: lag.tenant.map(str::to_owned),
                due: lag.due,
                oldest_due_age_seconds: lag.oldest_due_age_seconds,
                state: self
                    .tenants
                    .iter()
                    .find(|t| t.tenant.as_deref() == lag.tenant)
                    .and_then(|t| t.state.clone()),
            })
            .collect();
        self.laggards = laggards;
    }
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
        r.source = s.source.clone();
        r.signer = s.signer.clone();
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
    let limit = config.telemetry.sample_limit;
    let backlog = store.sample_backlog(limit).await?;
    let mut report = StatusReport {
        database_up: Some(true),
        replays: store
            .replay_progress()
            .await?
            .iter()
            .map(ReplayReport::of)
            .collect(),
        ..StatusReport::of_sample(Some(Utc::now()), &backlog, &[], limit)
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
    let source = match config.telemetry.listen_addr() {
        None => StatusSource::Database { relay: None },
        Some(listen) => match relay_status(listen, &config.telemetry.access()).await {
            Ok((relay, addr)) => {
                report.kafka_up = relay.kafka_up;
                report.brokers_up = relay.brokers_up;
                report.instances = relay.instances;
                for t in relay.tenants {
                    let r = entry(&mut report.tenants, t.tenant.as_deref());
                    r.state = t.state;
                    r.paused_until = t.paused_until;
                    r.plugin = t.plugin.or(r.plugin.take());
                    r.digest = t.digest;
                    r.source = t.source;
                    r.signer = t.signer;
                    r.plugin_version = t.plugin_version;
                    r.last_error = t.last_error;
                    r.counters = t.counters;
                }
                StatusSource::DatabaseAndRelay(addr)
            }
            Err(why) => StatusSource::Database { relay: Some(why) },
        },
    };
    // Ranked from this command's own sample, with the states the relay reported.
    report.rank_laggards(config.telemetry.laggards);
    Ok((report, source))
}

/// `sluice reload`: asks the relay at `[telemetry] listen` to reload (`POST /reload`, with
/// the credentials of the same section): the HTTP status and the relay's JSON answer.
pub async fn ask_reload(config: &Config) -> anyhow::Result<(u16, String)> {
    let listen = config
        .telemetry
        .listen_addr()
        .ok_or_else(|| anyhow::anyhow!("no [telemetry] listen: no relay to ask"))?
        .map_err(|e| anyhow::anyhow!("telemetry.listen: {e}"))?;
    let addrs = listen.resolve().await?;
    let authorization = config.telemetry.access().authorization();
    let mut why = String::new();
    for addr in addrs.into_iter().map(reachable) {
        match crate::telemetry::client::send(
            hyper::Method::POST,
            addr,
            "/reload",
            authorization.as_ref(),
            RELOAD_TIMEOUT,
        )
        .await
        {
            Ok(answer) => return Ok(answer),
            Err(e) => why = e.to_string(),
        }
    }
    anyhow::bail!("no relay answered at {listen}: {why}")
}

/// How long a reload may take: compiling changed plugins can take seconds each.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(300);

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

/// The status as tables for people: the slowest tenants, when any is behind, then every
/// tenant.
pub fn render_table(report: &StatusReport) -> String {
    let mut out = String::new();
    let bound = |n: i64| {
        if n >= report.sample_limit {
            format!("≥{n}")
        } else {
            n.to_string()
        }
    };
    if report.saturated {
        out.push_str(&format!(
            "the sample read {} rows (telemetry.sample_limit): counts are lower bounds, and \
             tenants whose rows come later in claim order are not shown\n",
            report.sample_limit
        ));
    }
    if !report.laggards.is_empty() {
        out.push_str("slowest tenants (oldest due row first):\n");
        let mut rows = vec![["TENANT", "DUE", "OLDEST", "STATE"].map(str::to_owned)];
        for l in &report.laggards {
            rows.push([
                tenant_name(l.tenant.as_deref()),
                bound(l.due),
                age(Some(l.oldest_due_age_seconds)),
                l.state.clone().unwrap_or_else(|| "-".to_owned()),
            ]);
        }
        out.push_str(&aligned(&rows));
        out.push_str("\nall tenants:\n");
    }
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
    for t in &report.tenants {
        rows.push([
            tenant_name(t.tenant.as_deref()),
            bound(t.due),
            age(t.oldest_due_age_seconds),
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
    out.push_str(&aligned(&rows));
    if let Some(instances) = &report.instances {
        out.push_str(&format!(
            "plugin instances: {} (tenants with an entry), {} (without)\n",
            instance_use(&instances.configured),
            instance_use(&instances.unconfigured)
        ));
    }
    // After the tables, beside the instances: the first line stays the tenants'.
    if let Some(brokers) = &report.brokers_up {
        let states: Vec<String> = brokers
            .iter()
            .map(|(b, up)| format!("{b} {}", if *up { "up" } else { "DOWN" }))
            .collect();
        out.push_str(&format!("brokers: {}\n", states.join(", ")));
    }
    // Changes a running relay could not apply: the rows of `waiting` tenants wait, the
    // others run their previous version.
    if let Some(changes) = &report.tenant_changes {
        for (tenant, why) in &changes.waiting {
            out.push_str(&format!(
                "tenant {} waits (its rows are held): {}\n",
                tenant_name(Some(tenant)),
                bounded(why, MAX_LOGGED)
            ));
        }
        for (tenant, why) in &changes.kept_old_version {
            out.push_str(&format!(
                "tenant {} runs its previous version (the change did not apply): {}\n",
                tenant_name(Some(tenant)),
                bounded(why, MAX_LOGGED)
            ));
        }
    }
    for replay in &report.replays {
        out.push_str(&replay.line());
        out.push('\n');
    }
    for t in report.tenants.iter().filter(|t| t.last_error.is_some()) {
        out.push_str(&format!(
            "{}: {}\n",
            tenant_name(t.tenant.as_deref()),
            t.last_error.as_deref().unwrap_or_default()
        ));
    }
    out
}

/// `12 live (max 1024), 13.0 of 512 MiB`.
fn instance_use(u: &InstanceUse) -> String {
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let max = u
        .max_live
        .map(|m| format!(" (max {m})"))
        .unwrap_or_default();
    format!(
        "{} live{max}, {:.1} of {:.0} MiB",
        u.live,
        mib(u.memory_bytes),
        mib(u.memory_limit_bytes)
    )
}

/// A tenant as the tables show it: the rows' text, escaped and bounded for a terminal.
fn tenant_name(tenant: Option<&str>) -> String {
    tenant.map_or_else(
        || "(none)".to_owned(),
        |t| bounded(t, MAX_LOGGED).into_owned(),
    )
}

/// An age in seconds as people read it (`1h 2m 3s`), `-` for none.
fn age(seconds: Option<f64>) -> String {
    seconds.map_or_else(
        || "-".to_owned(),
        |s| humantime::format_duration(Duration::from_secs(s as u64)).to_string(),
    )
}

/// `rows` as lines of left-aligned columns two spaces apart.
fn aligned<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
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
                waiting: 0,
            },
            TenantBacklog {
                tenant: None,
                due: 2,
                oldest_due_age: None,
                dead: 0,
                waiting: 0,
            },
        ];
        let statuses = [TenantStatus {
            tenant: TenantId::named("acme"),
            plugin: "acme.wasm".into(),
            digest: Some("sha256:ab".into()),
            source: Some("/srv/plugins/acme.wasm".into()),
            signer: Some("minisign:8C8C7D4AF7386F97".into()),
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
        assert_eq!(acme.source.as_deref(), Some("/srv/plugins/acme.wasm"));
        assert_eq!(acme.signer.as_deref(), Some("minisign:8C8C7D4AF7386F97"));
        let table = render_table(&StatusReport {
            sample_limit: 10_000,
            tenants: reports,
            instances: Some(PluginInstances {
                configured: InstanceUse {
                    live: 12,
                    max_live: None,
                    memory_bytes: 13 << 20,
                    memory_limit_bytes: 2048 << 20,
                },
                unconfigured: InstanceUse {
                    live: 3,
                    max_live: Some(1024),
                    memory_bytes: 3 << 20,
                    memory_limit_bytes: 512 << 20,
                },
            }),
            ..StatusReport::default()
        });
        assert!(table.contains("acme"), "{table}");
        assert!(table.contains("1m 30s"), "{table}");
        assert!(
            table.contains(
                "plugin instances: 12 live, 13.0 of 2048 MiB (tenants with an entry), \
                 3 live (max 1024), 3.0 of 512 MiB (without)"
            ),
            "{table}"
        );
    }

    fn backlog(tenant: Option<&str>, due: i64, age_secs: u64) -> TenantBacklog {
        TenantBacklog {
            tenant: tenant.map(str::to_owned),
            due,
            oldest_due_age: (due > 0).then(|| Duration::from_secs(age_secs)),
            dead: 0,
            waiting: 1,
        }
    }

    #[test]
    fn the_slowest_tenants_come_first_oldest_due_row_then_most_due_rows() {
        let sample = [
            backlog(Some("busy"), 500, 30),
            backlog(Some("idle"), 0, 0),
            backlog(Some("stuck"), 2, 7_200),
            backlog(None, 9, 60),
            backlog(Some("also-60s"), 3, 60),
        ];
        let statuses = [TenantStatus {
            tenant: TenantId::named("stuck"),
            plugin: "builtin:route-by-aggregate".into(),
            digest: None,
            source: None,
            signer: None,
            version: None,
            configured: false,
            state: TenantState::Stalled,
            instance: true,
            counters: BTreeMap::new(),
            instantiations: BTreeMap::new(),
            limit_hits: BTreeMap::new(),
        }];
        let mut report = StatusReport::of_sample(None, &sample, &statuses, 10_000);
        assert!(!report.saturated);
        report.rank_laggards(3);
        let laggards: Vec<(Option<&str>, i64, Option<&str>)> = report
            .laggards
            .iter()
            .map(|l| (l.tenant.as_deref(), l.due, l.state.as_deref()))
            .collect();
        assert_eq!(
            laggards,
            [
                (Some("stuck"), 2, Some("stalled")),
                (None, 9, None),
                (Some("also-60s"), 3, None)
            ]
        );
        assert_eq!(report.laggards[0].oldest_due_age_seconds, 7_200.0);
        let table = render_table(&report);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0], "slowest tenants (oldest due row first):",
            "{table}"
        );
        assert!(lines[1].starts_with("TENANT"), "{table}");
        let stuck: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(stuck, ["stuck", "2", "2h", "stalled"], "{table}");
        assert!(lines[3].starts_with("(none)"), "{table}");
        assert_eq!(lines[6], "all tenants:", "{table}");

        report.rank_laggards(0);
        assert!(report.laggards.is_empty());
        assert!(
            render_table(&report).starts_with("TENANT"),
            "0 turns them off"
        );
    }

    #[test]
    fn changes_a_relay_could_not_apply_are_listed_after_the_tables() {
        let mut report = StatusReport::of_sample(None, &[backlog(Some("acme"), 1, 5)], &[], 100);
        let before = render_table(&report);
        report.tenant_changes = Some(TenantChangeStatus {
            waiting: [(
                "gone\u{1b}".to_owned(),
                "removed from the configuration".to_owned(),
            )]
            .into(),
            kept_old_version: [("acme".to_owned(), "plugin.wasm: cannot read".to_owned())].into(),
        });
        let table = render_table(&report);
        assert!(table.starts_with(&before), "{table}");
        let added: Vec<&str> = table[before.len()..].lines().collect();
        assert_eq!(
            added,
            [
                "tenant gone\\u{1b} waits (its rows are held): removed from the configuration",
                "tenant acme runs its previous version (the change did not apply): plugin.wasm: \
                 cannot read",
            ],
            "{table}"
        );
    }

    #[test]
    fn a_sample_that_read_its_limit_says_its_counts_are_lower_bounds() {
        // 2 + 1 waiting rows each: 6 unsent rows read.
        let sample = [backlog(Some("a"), 2, 5), backlog(Some("b"), 2, 5)];
        assert!(!StatusReport::of_sample(None, &sample, &[], 7).saturated);
        let report = StatusReport::of_sample(None, &sample, &[], 6);
        assert!(report.saturated);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["saturated"], true);
        assert!(render_table(&report).contains("counts are lower bounds"));
        let dead = [TenantBacklog {
            dead: 6,
            ..backlog(Some("a"), 0, 0)
        }];
        assert!(StatusReport::of_sample(None, &dead, &[], 6).saturated);
    }

    #[test]
    fn a_tenant_name_is_escaped_and_bounded_in_the_tables() {
        let name = format!("evil\u{1b}[2J{}", "x".repeat(5_000));
        let mut report = StatusReport::of_sample(None, &[backlog(Some(&name), 1, 5)], &[], 100);
        report.rank_laggards(10);
        let table = render_table(&report);
        assert!(!table.contains('\u{1b}'), "{table}");
        assert!(table.contains("evil\\u{1b}[2J"), "{table}");
        // Two tables, each with its header padded to the name.
        assert!(table.len() < 4 * (MAX_LOGGED + 200), "{}", table.len());
    }

    #[test]
    fn a_status_without_laggards_from_an_older_relay_still_reads() {
        let old = r#"{"sampled_at":null,"sample_limit":10000,"database_up":true,
                      "kafka_up":true,"tenants":[]}"#;
        let report: StatusReport = serde_json::from_str(old).unwrap();
        assert!(report.laggards.is_empty() && !report.saturated);
    }
}
