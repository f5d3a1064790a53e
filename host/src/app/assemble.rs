//! Wiring one relay from a [`Config`]: the plugins, the store, the Kafka sink, the loop, and
//! (with `[telemetry] listen`) the metrics they record into.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::config::Config;
use crate::encoding::{RegistryClient, SchemaEncoder, SchemaSource};
use crate::maintenance::pruner::Retention;
use crate::plugin::{PluginRouter, TenantState};
use crate::relay::Relay;
use crate::shutdown::Shutdown;
use crate::sink::KafkaSink;
use crate::store::{self, MarkMode, Store};
use crate::telemetry::metrics::{Loaded, PluginStates};
use crate::telemetry::{Metrics, TenantLabels};

/// How long start-up keeps trying a database that is not reachable yet (restarting, a
/// connection cut while the table is checked) before giving up.
const DATABASE_START_PATIENCE: Duration = Duration::from_secs(30);
/// First pause between two start-up attempts; doubled up to 5 s.
const DATABASE_RETRY: Duration = Duration::from_millis(250);

/// The relay `sluice run` and `sluice drain` drive.
pub(super) type AppRelay = Relay<Store, Arc<PluginRouter>, KafkaSink>;

/// A relay's parts, ready to run.
pub(super) struct Parts {
    pub router: Arc<PluginRouter>,
    pub store: Arc<Store>,
    pub relay: Arc<AppRelay>,
    /// With `[telemetry] listen`: what the relay records into.
    pub metrics: Option<Arc<Metrics>>,
    /// With `[schema_registry]`: its client (for the readiness check).
    pub registry: Option<Arc<RegistryClient>>,
}

/// Loads the plugins, then connects the database and the producer. Returns `None` when
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
        let (plugins, tenants) = (config.plugins.clone(), config.tenants.clone());
        let router =
            tokio::task::spawn_blocking(move || PluginRouter::from_settings(&plugins, &tenants))
                .await
                .context("loading plugins")??;
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
        let properties = config.kafka.properties();
        let observed = metrics
            .clone()
            .map(|m| (m, config.telemetry.sample_interval));
        // Creating a producer starts librdkafka's threads: blocking work.
        let sink = tokio::task::spawn_blocking(move || match observed {
            // Statistics only with metrics on: librdkafka computes them for nothing otherwise.
            Some((metrics, interval)) => KafkaSink::with_metrics(&properties, metrics, interval),
            None => KafkaSink::new(&properties),
        })
        .await
        .context("creating the kafka producer")??;
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
        Ok::<_, anyhow::Error>(Parts {
            router,
            store,
            relay: Arc::new(relay),
            metrics,
            registry,
        })
    };
    tokio::select! {
        started = starting => started.map(Some),
        _ = stop.recv() => Ok(None),
    }
}

/// The metrics of a relay configured by `config`, with the router's tenants read at scrape
/// time.
fn metrics(config: &Config, router: &Arc<PluginRouter>) -> Arc<Metrics> {
    let tenants = TenantLabels::new(config.tenants.keys().map(String::as_str));
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
            let tenant = self.tenants.of(&s.tenant);
            match s.state {
                TenantState::Paused { .. } => states.paused(&tenant),
                TenantState::Quarantined { .. } => states.quarantined(&tenant),
                TenantState::Running | TenantState::Stalled => {}
            }
            // Plugin identity and guest counters only for tenants with their own label value
            // (and rows without a tenant, which run `[plugins.default]`): bounded.
            if s.configured {
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

/// The table privileges `sluice run` and `sluice drain` need with `config`'s `[relay]`.
pub(super) fn privileges_needed(config: &Config) -> Vec<store::Need> {
    let prunes = matches!(config.relay.retention, Retention::Keep(_));
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
