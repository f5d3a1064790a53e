//! Wiring one relay from a [`Config`]: the plugins, the store, the brokers' sinks, the loop, and
//! (with `[telemetry] listen`) the metrics they record into.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::config::Config;
use crate::encoding::{RegistryClient, SchemaEncoder, SchemaSource};
use crate::maintenance::pruner::{Retention, RetentionMode};
use crate::plugin::{PluginRouter, TenantState};
use crate::relay::Relay;
use crate::shutdown::Shutdown;
use crate::sink::Brokers;
use crate::store::{self, MarkMode, Store};
use crate::telemetry::metrics::{Loaded, PluginStates};
use crate::telemetry::{Metrics, TenantLabels};
use crate::trace::{ExportTask, TraceCounters, Tracing};

/// How long start-up keeps trying a database that is not reachable yet (restarting, a
/// connection cut while the table is checked) before giving up.
const DATABASE_START_PATIENCE: Duration = Duration::from_secs(30);
/// First pause between two start-up attempts; doubled up to 5 s.
const DATABASE_RETRY: Duration = Duration::from_millis(250);

/// The relay `sluice run` and `sluice drain` drive.
pub(super) type AppRelay = Relay<Store, Arc<PluginRouter>, Brokers>;

/// A relay's parts, ready to run.
pub(super) struct Parts {
    pub router: Arc<PluginRouter>,
    pub store: Arc<Store>,
    pub relay: Arc<AppRelay>,
    /// With `[telemetry] listen`: what the relay records into.
    pub metrics: Option<Arc<Metrics>>,
    /// With `[schema_registry]`: its client (for the readiness check).
    pub registry: Option<Arc<RegistryClient>>,
    /// With `[tracing]`: the span export, to run as a background service.
    pub trace_export: Option<ExportTask>,
}

/// Loads the plugins, then connects the database and the brokers. Returns `None` when
/// `stop` fired meanwhile: start-up is abandoned before anything was claimed.
pub(super) async fn assemble(
    config: &Config,
    stop: &mut Shutdown,
) -> anyhow::Result<Option<Parts>> {
    let starting = async {
        // Valid, but maybe not what was meant (`config check` lists these as warnings).
        for warning in config.warnings() {
            tracing::warn!(key = %warning.key, "{}", warning.message);
        }
        // Plugins first: a broken plugin file is reported without touching the database.
        // Compiling and instantiating are blocking work.
        // A tenant file that does not check holds up its own tenant only: its rows wait.
        let (tenants, refused) = config.runnable_tenants();
        for (name, why) in &refused {
            tracing::error!(tenant = %crate::text::bounded(name, crate::text::MAX_LOGGED), reason = %why,
                "tenant's settings do not apply; its rows wait until they do");
        }
        let plugins = config.plugins.clone();
        let router = tokio::task::spawn_blocking(move || {
            PluginRouter::from_settings(&plugins, &tenants).inspect(|router| router.hold(&refused))
        })
        .await
        .context("loading plugins")??;
        router.instance_budgets().log();
        let router = Arc::new(router);
        // One connection per worker's open batch, plus one for probes and maintenance.
        let connections = u32::try_from(config.relay.workers + 1).unwrap_or(u32::MAX);
        let store = Arc::new(open_store(config, connections).await?);
        if let Some((key, value)) = config.kafka.weak_acks() {
            tracing::warn!(key, value = %value,
                "kafka acks weaker than \"all\" (allowed by relay.allow_weak_acks): a broker failure can lose messages of rows already marked sent");
        }
        let metrics = config
            .telemetry
            .listen
            .as_ref()
            .map(|_| metrics(config, &router));
        let brokers = config.broker_settings();
        let observed = metrics
            .clone()
            .map(|m| (m, config.telemetry.sample_interval));
        let runtime = tokio::runtime::Handle::current();
        // Creating a Kafka producer starts librdkafka's threads: blocking work. The other
        // brokers connect in the background (a broker restarting does not hold up the start).
        let sink =
            tokio::task::spawn_blocking(move || Brokers::connect_all(&brokers, observed, &runtime))
                .await
                .context("connecting to the brokers")??;
        tracing::info!(brokers = ?sink.brokers().map(|b| b.as_str()).collect::<Vec<_>>(), "publishing to");
        let mut relay = Relay::new(
            Arc::clone(&store),
            Arc::clone(&router),
            sink,
            config.relay.settings(),
        );
        let registry = match &config.schema_registry {
            Some(settings) => {
                let client = Arc::new(RegistryClient::new(settings).map_err(anyhow::Error::msg)?);
                // Not fatal: rows to be encoded wait (and /readyz says why) until it answers.
                if let Err(e) = client.check().await {
                    tracing::warn!(error = %e, url = %crate::secret::redact_url(&settings.url),
                        "the schema registry does not answer yet");
                }
                let source: Arc<dyn SchemaSource> = Arc::clone(&client) as Arc<dyn SchemaSource>;
                relay =
                    relay.with_schemas(Arc::new(SchemaEncoder::new(source, settings.latest_ttl)));
                Some(client)
            }
            None => None,
        };
        if let Some(metrics) = &metrics {
            router.record_into(Arc::clone(metrics));
            let mode = match config.relay.mark {
                MarkMode::Delete => "delete",
                MarkMode::PublishedAt => "published_at",
            };
            relay = relay.with_metrics(Arc::clone(metrics), mode);
        }
        let (tracing, trace_export) = trace_setup(config, metrics.as_deref())?;
        relay = relay.with_tracing(Arc::new(tracing));
        Ok::<_, anyhow::Error>(Parts {
            router,
            store,
            relay: Arc::new(relay),
            metrics,
            registry,
            trace_export,
        })
    };
    tokio::select! {
        started = starting => started.map(Some),
        _ = stop.recv() => Ok(None),
    }
}

/// The relay's tracing: contexts passed on always, spans exported with `[tracing]` (by the
/// returned task). Its counters are the metrics' when `[telemetry] listen` is set.
fn trace_setup(
    config: &Config,
    metrics: Option<&Metrics>,
) -> anyhow::Result<(Tracing, Option<ExportTask>)> {
    let counters = metrics.map_or_else(TraceCounters::default, |m| m.trace.clone());
    match &config.tracing {
        None => Ok((Tracing::propagation_only(counters), None)),
        Some(settings) => {
            let (tracing, task) = Tracing::exporting(settings, counters)?;
            tracing::info!(
                endpoint = settings.traces_url().unwrap_or_default(),
                sample_ratio = settings.sample_ratio,
                "exporting spans (OTLP/HTTP)"
            );
            Ok((tracing, Some(task)))
        }
    }
}

/// The metrics of a relay configured by `config`, with the router's tenants read at scrape
/// time.
fn metrics(config: &Config, router: &Arc<PluginRouter>) -> Arc<Metrics> {
    let tenants = TenantLabels::with_budget(
        config.telemetry.label_budget(),
        config.tenants.keys().map(String::as_str),
    );
    let mut metrics = Metrics::new(tenants.clone(), &crate::sink::librdkafka_version());
    metrics.register_collector(RouterCollector {
        router: Arc::clone(router),
        tenants,
    });
    Arc::new(metrics)
}

/// Per-tenant plugin state, read from the router at each scrape into [`PluginStates`].
struct RouterCollector {
    router: Arc<PluginRouter>,
    tenants: TenantLabels,
}

impl std::fmt::Debug for RouterCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterCollector").finish_non_exhaustive()
    }
}

impl Collector for RouterCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let states = PluginStates::new(&self.tenants);
        for s in self.router.tenant_statuses() {
            let gauge = self.tenants.gauge_label(s.tenant.name());
            match s.state {
                TenantState::Paused { .. } => states.paused(&gauge),
                TenantState::Quarantined { .. } => states.quarantined(&gauge),
                TenantState::Running | TenantState::Stalled => {}
            }
            // Plugin identity and guest counters only for configured tenants with their own
            // label value (and rows without a tenant, which run `[plugins.default]`): bounded
            // by `[telemetry] tenant_series`.
            let own = s.tenant.name().is_none_or(|n| self.tenants.has_own(n));
            if s.configured && own {
                let tenant = self.tenants.of(&s.tenant);
                let version = s.version.as_deref().unwrap_or_default();
                let loaded = Loaded {
                    digest: s.digest.as_deref().unwrap_or_default(),
                    source: s.source.as_deref().unwrap_or_default(),
                    signer: s.signer.as_deref().unwrap_or_default(),
                };
                states.info(&tenant, &s.plugin, version, loaded);
                for (&reason, &n) in &s.instantiations {
                    states.instantiations(&tenant, reason, n);
                }
                for (&limit, &n) in &s.limit_hits {
                    states.limit_hits(&tenant, limit, n);
                }
                for (name, &value) in &s.counters {
                    states.custom(&tenant, name, value);
                }
            }
        }
        states.encode(encoder)
    }
}

/// The table privileges `sluice run` and `sluice drain` need with `config`'s `[relay]`. With
/// `retention_mode = "drop-partitions"` no row is deleted (whole partitions are dropped, which
/// takes ownership, not a grant), so the pruner needs no `DELETE`.
pub(super) fn privileges_needed(config: &Config) -> Vec<store::Need> {
    let prunes = matches!(config.relay.retention, Retention::Keep(_))
        && config.relay.retention_mode != RetentionMode::DropPartitions;
    store::relay_needs(config.relay.mark, prunes)
}

/// Opens the store and checks the relay's privileges on the table, trying again on
/// connection errors (a database restarting, a connection cut) for up to
/// [`DATABASE_START_PATIENCE`]; a table Sluice cannot use, or a missing grant, fails at once
/// with the privilege named, rather than failing every batch (without DELETE, after
/// publishing it).
async fn open_store(config: &Config, connections: u32) -> anyhow::Result<Store> {
    let spec = config.database.table_spec()?;
    let needs = privileges_needed(config);
    let started = Instant::now();
    let mut pause = DATABASE_RETRY;
    loop {
        let opened = match store::open(
            config.database_url(),
            &spec,
            config.store_options(),
            connections,
        )
        .await
        {
            Ok(store) => store.check_privileges(&needs).await.map(|()| store),
            Err(e) => Err(e),
        };
        match opened {
            Ok(store) => return Ok(store),
            Err(e) if e.is_transient() && started.elapsed() < DATABASE_START_PATIENCE => {
                tracing::warn!(error = %e, retry_in = ?pause, "database not reachable yet; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::fmt::Write as _;
    use std::path::Path;

    use super::*;
    use crate::model::TenantId;
    use crate::telemetry::TenantSample;
    use crate::telemetry::metrics::{DeadReason, PluginOutcome, ProduceError, RowOutcome};

    /// The series of an exposition: its lines that are neither comments nor empty.
    fn series(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    }

    /// The `tenant` label values of an exposition.
    fn tenant_values(text: &str) -> BTreeSet<&str> {
        series(text)
            .into_iter()
            .filter_map(|l| l.split_once("tenant=\"")?.1.split_once('"'))
            .map(|(value, _)| value)
            .collect()
    }

    /// Records what a busy relay would for `tenant`: every row outcome and dead reason, a
    /// plugin call of every outcome through the tenant's own plugin file, messages to its own
    /// topic, a produce error, latencies.
    fn record_everything(metrics: &Metrics, tenant: &TenantId, plugin: &str) {
        let label = metrics.tenant(tenant);
        for &outcome in RowOutcome::ALL {
            metrics.relay.rows_completed(&label, outcome, 1);
        }
        for &reason in DeadReason::ALL {
            metrics.relay.dead_letters(&label, reason, 1);
        }
        let outcomes: Vec<(PluginOutcome, u64)> =
            PluginOutcome::ALL.iter().map(|&o| (o, 1)).collect();
        let plugin_label = metrics.plugin_label(tenant, plugin);
        metrics.plugin.transformed(
            &label,
            plugin_label,
            Some(Duration::from_millis(3)),
            &outcomes,
        );
        let topic = format!("events.{}", tenant.name().unwrap_or("none"));
        metrics
            .sink
            .produced(&label, crate::model::Broker::Kafka, &topic, 2, 200);
        metrics.sink.end_to_end(&label, [0.2, 1.5]);
        metrics.sink.last_publish(&label, 1.0e9);
    }

    /// `[telemetry] tenant_series` bounds `/metrics` whatever the tenants: 5,000 configured
    /// tenants with a plugin file each, 5,000 free-form ones, every one of them busy and
    /// behind. The bound is docs/operations.md's formula (see "Series budget").
    #[test]
    fn a_relay_with_5000_tenants_stays_within_its_series_budget() {
        const CONFIGURED: usize = 5_000;
        const FREE_FORM: usize = 5_000;
        let (tenant_series, laggards) = (100, 10);
        let watched: Vec<String> = (0..20).map(|i| format!("t{:04}", i * 7)).collect();
        let mut text = format!(
            "[database]\nurl = \"postgres://sluice@127.0.0.1/test\"\n\
             [telemetry]\nlisten = \"127.0.0.1:0\"\ntenant_series = {tenant_series}\n\
             laggards = {laggards}\nwatched_tenants = {watched:?}\n\
             [plugins.default]\nbuiltin = \"route-by-aggregate\"\n"
        );
        for i in 0..CONFIGURED {
            let _ = write!(
                text,
                "[tenants.t{i:04}]\nbuiltin = \"route-by-aggregate\"\n"
            );
        }
        let config = Config::parse(&text, Path::new("sluice.toml")).unwrap();
        assert!(config.problems().is_empty(), "{:?}", config.problems());
        // The router runs the first 300 configured tenants (the watched among them): a router
        // of 5,000 reserves the largest instance pool, and two of those in one test process
        // fail now and then (see MAX_POOLED_INSTANCES). Its statuses still show tenants
        // without their own label value reported at scrape time; the labels know all 5,000.
        let loaded: std::collections::BTreeMap<_, _> = config
            .tenants
            .iter()
            .take(300)
            .map(|(name, spec)| (name.clone(), spec.clone()))
            .collect();
        let router = Arc::new(PluginRouter::from_settings(&config.plugins, &loaded).unwrap());
        let metrics = metrics(&config, &router);
        router.record_into(Arc::clone(&metrics));

        let configured: Vec<TenantId> = config
            .tenants
            .keys()
            .map(|k| TenantId::named(k.as_str()))
            .collect();
        let free: Vec<TenantId> = (0..FREE_FORM)
            .map(|i| TenantId::named(format!("free-{i}")))
            .collect();
        for tenant in &configured {
            let plugin = format!("/plugins/{}.wasm", tenant.name().unwrap_or_default());
            record_everything(&metrics, tenant, &plugin);
        }
        for tenant in free.iter().chain([&TenantId::none()]) {
            record_everything(&metrics, tenant, "builtin:route-by-aggregate");
        }
        for topic in 0..300 {
            metrics.sink.produce_errors(
                crate::model::Broker::Kafka,
                &format!("events.t{topic:04}"),
                ProduceError::Refused,
                1,
            );
        }
        // Every tenant behind, each a little further than the one before.
        let names: Vec<Option<&str>> = configured
            .iter()
            .chain(&free)
            .map(TenantId::name)
            .chain([None])
            .collect();
        let samples: Vec<(Option<&str>, TenantSample)> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let sample = TenantSample {
                    due: 3,
                    oldest_due_age_seconds: i as f64,
                    dead: 1,
                };
                (*name, sample)
            })
            .collect();
        metrics.set_tenant_samples(&samples);

        let exposition = metrics.encode().unwrap();
        let count = series(&exposition).len();
        let values = tenant_values(&exposition);
        // The watched tenants, the laggards, `_default`.
        assert_eq!(values.len(), watched.len() + laggards + 1, "{values:?}");
        assert!(values.len() <= tenant_series + 1);
        for w in &watched {
            assert!(values.contains(w.as_str()), "{w}: {values:?}");
        }
        assert!(!exposition.contains("/plugins/t0001.wasm"));
        let budget = series_budget(watched.len(), laggards, 1);
        // Each term of the formula holds on its own.
        let of = |value: &str| {
            let label = format!("tenant=\"{value}\"");
            series(&exposition)
                .into_iter()
                .filter(|l| l.contains(&label))
                .count()
        };
        let relay_wide = series(&exposition)
            .into_iter()
            .filter(|l| !l.contains("tenant=\""))
            .count();
        let default = of("_default");
        let most_watched = watched.iter().map(|w| of(w)).max().unwrap_or_default();
        let laggard_values: Vec<&str> = values
            .iter()
            .copied()
            .filter(|v| *v != "_default" && !watched.iter().any(|w| w == v))
            .collect();
        let most_laggard = laggard_values
            .iter()
            .map(|l| of(l))
            .max()
            .unwrap_or_default();
        eprintln!(
            "{CONFIGURED} configured + {FREE_FORM} free-form tenants: {count} series \
             (budget {budget}): relay-wide {relay_wide}, _default {default}, a watched tenant \
             {most_watched}, a laggard {most_laggard}"
        );
        assert!(relay_wide <= RELAY_WIDE + 3 * ALL_TOPICS, "{relay_wide}");
        assert!(default <= DEFAULT_TENANT + 2 * ALL_TOPICS, "{default}");
        assert!(most_watched <= PER_TENANT + 2, "{most_watched}");
        assert_eq!(most_laggard, PER_LAGGARD, "{laggard_values:?}");
        assert!(count <= budget, "{count} series > {budget}");

        // 50 configured tenants fit: each has its own label value (as without a budget);
        // back to 5,000, they lose them, and every series of theirs goes.
        let few: Vec<&str> = config.tenants.keys().take(50).map(String::as_str).collect();
        metrics.set_configured_tenants(few.iter().copied());
        // t0048 is not watched (the watched are every 7th).
        assert!(metrics.tenants().has_own("t0048"));
        for tenant in &configured[..50] {
            let plugin = format!("/plugins/{}.wasm", tenant.name().unwrap_or_default());
            record_everything(&metrics, tenant, &plugin);
        }
        let exposition = metrics.encode().unwrap();
        assert!(exposition.contains("tenant=\"t0048\""));
        let with_few = series(&exposition).len();
        metrics.set_configured_tenants(config.tenants.keys().map(String::as_str));
        metrics.set_tenant_samples(&samples);
        let exposition = metrics.encode().unwrap();
        let left: Vec<&str> = series(&exposition)
            .into_iter()
            .filter(|l| l.contains("tenant=\"t0048\""))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        let after = series(&exposition).len();
        assert!(
            after < with_few && after <= budget,
            "{after} after {with_few}"
        );
    }

    /// docs/operations.md's bound on the series of one relay ("Series budget"): `own` tenants
    /// with their own label value publishing to `topics` topics each, `laggards` on the gauges.
    fn series_budget(own: usize, laggards: usize, topics: usize) -> usize {
        RELAY_WIDE
            + 3 * ALL_TOPICS
            + DEFAULT_TENANT
            + 2 * ALL_TOPICS
            + own * (PER_TENANT + 2 * topics)
            + PER_LAGGARD * laggards
    }

    /// Series without a `tenant` label, but for 3 produce error types per topic.
    const RELAY_WIDE: usize = 100;
    /// Topic label values: 256 names, then `_other`.
    const ALL_TOPICS: usize = 257;
    /// A tenant with its own label value, but for 2 per topic: 4 row outcomes, 3 dead
    /// reasons, 7 plugin outcomes and `no_plugin` (under `plugin="_none"`), a transform
    /// histogram (20), an end-to-end histogram (18), last publish, 3 backlog gauges, paused,
    /// quarantined, plugin info, 5 instantiation reasons, 7 limits, 32 guest counters.
    const PER_TENANT: usize = 104;
    /// `_default`, but for 2 per topic: a tenant's, with two more `plugin` label values (the
    /// default plugin's and `_other`: 7 outcomes and a histogram each).
    const DEFAULT_TENANT: usize = PER_TENANT + 2 * 27;
    /// A laggard: 3 backlog gauges, paused, quarantined.
    const PER_LAGGARD: usize = 5;
}
