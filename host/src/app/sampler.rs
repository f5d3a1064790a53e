//! The backlog sampler of a running relay with `[telemetry] listen`: every `sample_interval`
//! one bounded statement, one broker readiness probe and (with `[schema_registry]`) one
//! registry request, into the backlog gauges, the dependency checks and what `/status` and
//! `/readyz` answer.
//!
//! The three checks run side by side and start on a fixed tick, so a dependency that stops
//! answering is seen by the first check that starts after it went silent, whatever the others
//! do: within `sample_interval` plus that check's timeout (5 s each for the database and the
//! broker, `[schema_registry] timeout` for the registry). One silent dependency neither
//! delays the checks of the others nor stretches the interval (unless a round outlasts it).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use tokio::time::MissedTickBehavior;

use crate::encoding::RegistryClient;
use crate::model::Broker;
use crate::plugin::RowTransformer;
use crate::relay::Relay;
use crate::shutdown::Shutdown;
use crate::sink::Brokers;
use crate::store::{OutboxStore, ReplayProgress, Store, TenantBacklog};
use crate::telemetry::metrics::Dependency;
use crate::telemetry::settings::{BROKER_PROBE_TIMEOUT, DATABASE_PROBE_TIMEOUT};
use crate::telemetry::{Metrics, TelemetrySettings, TenantSample};

/// What the last sample saw, for `/status` and `/readyz`.
#[derive(Debug, Default)]
pub(super) struct LastSample {
    pub at: Option<chrono::DateTime<Utc>>,
    pub backlog: Vec<TenantBacklog>,
    /// Each broker the relay publishes to, and why its last check failed (authentication,
    /// TLS, unreachable; `None`: it answered), for `/readyz`.
    pub brokers: BTreeMap<Broker, Option<String>>,
    /// `sluice replay`s with rows still to send again.
    pub replays: Vec<ReplayProgress>,
}

impl LastSample {
    /// Nothing sampled yet; `brokers` not checked yet.
    pub(super) fn new(brokers: impl IntoIterator<Item = Broker>) -> Self {
        Self {
            brokers: brokers
                .into_iter()
                .map(|b| (b, Some("not checked yet".to_owned())))
                .collect(),
            ..Self::default()
        }
    }
}

/// Samples the backlog gauges and checks the database, the broker and the registry every
/// `sample_interval`, until `stop` fires.
pub(super) async fn sample<T: RowTransformer>(
    store: Arc<Store>,
    relay: Arc<Relay<Store, T, Brokers>>,
    registry: Option<Arc<RegistryClient>>,
    metrics: Arc<Metrics>,
    last: Arc<Mutex<LastSample>>,
    settings: TelemetrySettings,
    mut stop: Shutdown,
) {
    // Rounds start every `sample_interval`; one that outlasts it delays the next instead of
    // bunching rounds up behind it.
    let mut ticks = tokio::time::interval(settings.sample_interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.recv() => return,
        }
        let round = async {
            tokio::join!(
                sample_database(&store, &metrics, &last, &settings),
                probe_brokers(&relay, &metrics, &last),
                async {
                    if let Some(registry) = &registry {
                        check_registry(registry, &metrics).await;
                    }
                },
            )
        };
        tokio::select! {
            _ = round => {}
            _ = stop.recv() => return,
        }
    }
}

/// Reads the backlog gauges; the database is down when that fails or takes over
/// [`DATABASE_PROBE_TIMEOUT`].
async fn sample_database(
    store: &Store,
    metrics: &Metrics,
    last: &Mutex<LastSample>,
    settings: &TelemetrySettings,
) {
    // The replays' progress is read within the same timeout: a statement that hangs (the
    // table locked by a migration) must make the database unready, not stall every later
    // round on its last answer.
    let sampled = tokio::time::timeout(DATABASE_PROBE_TIMEOUT, async {
        let backlog = store.sample_backlog(settings.sample_limit).await?;
        let replays = store.replay_progress().await;
        Ok::<_, crate::store::StoreError>((backlog, replays))
    })
    .await;
    match sampled {
        Ok(Ok((backlog, replays))) => {
            metrics.health.set_dependency_up(Dependency::Database, true);
            let samples: Vec<(Option<&str>, TenantSample)> = backlog
                .iter()
                .map(|b| {
                    let sample = TenantSample {
                        due: b.due,
                        oldest_due_age_seconds: b
                            .oldest_due_age
                            .map_or(0.0, |age| age.as_secs_f64()),
                        dead: b.dead,
                    };
                    (b.tenant.as_deref(), sample)
                })
                .collect();
            metrics.set_tenant_samples(&samples);
            let replays = replays.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "reading the progress of replays failed");
                Vec::new()
            });
            let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
            last.at = Some(Utc::now());
            last.backlog = backlog;
            last.replays = replays;
        }
        Ok(Err(e)) => {
            metrics
                .health
                .set_dependency_up(Dependency::Database, false);
            tracing::warn!(error = %e, "sampling the outbox backlog failed");
        }
        Err(_) => {
            metrics
                .health
                .set_dependency_up(Dependency::Database, false);
            tracing::warn!(
                timeout = ?DATABASE_PROBE_TIMEOUT,
                "the database did not answer the backlog sample in time"
            );
        }
    }
}

/// Checks every broker side by side (Kafka: a metadata request; NATS: a round trip;
/// RabbitMQ: the exchange; Redis: PING); a broker is down when no answer comes within
/// [`BROKER_PROBE_TIMEOUT`]. Logs when a broker's answer changes.
async fn probe_brokers<T: RowTransformer>(
    relay: &Arc<Relay<Store, T, Brokers>>,
    metrics: &Metrics,
    last: &Mutex<LastSample>,
) {
    let probe = {
        let relay = Arc::clone(relay);
        tokio::task::spawn_blocking(move || relay.sink().probes(BROKER_PROBE_TIMEOUT))
    };
    let answers: Vec<(Broker, Option<String>)> = match probe.await {
        Ok(probes) => probes
            .into_iter()
            .map(|(broker, result)| (broker, result.err().map(|e| e.to_string())))
            .collect(),
        Err(e) => relay
            .sink()
            .brokers()
            .map(|b| (b, Some(format!("the readiness check did not finish: {e}"))))
            .collect(),
    };
    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
    for (broker, error) in answers {
        metrics
            .health
            .set_dependency_up(Dependency::broker(broker), error.is_none());
        // Logged when the answer changes, not every sample: an outage lasts many samples. The
        // error names its cause as the sink's own log line does (see sink/connection.rs).
        let before = last.brokers.get(&broker).cloned().flatten();
        let first =
            !last.brokers.contains_key(&broker) || before.as_deref() == Some("not checked yet");
        if error != before {
            match &error {
                Some(e) => {
                    tracing::warn!(broker = %broker, error = %e, "the broker did not answer the readiness check")
                }
                None if !first => {
                    tracing::info!(broker = %broker, "the broker answers the readiness check again")
                }
                None => {}
            }
        }
        last.brokers.insert(broker, error);
    }
}

/// Asks the schema registry whether it answers; logs when that changes.
async fn check_registry(registry: &RegistryClient, metrics: &Metrics) {
    let was_up = registry.state().up();
    let result = registry.check().await;
    metrics.health.set_dependency_up(
        Dependency::SchemaRegistry,
        !matches!(&result, Err(e) if e.is_outage()),
    );
    match &result {
        Err(e) if e.is_outage() && was_up => {
            tracing::warn!(error = %e, "the schema registry did not answer the readiness check");
        }
        Err(e) if !e.is_outage() => {
            tracing::warn!(error = %e, "the schema registry refused the readiness check");
        }
        Ok(()) if !was_up => tracing::info!("the schema registry answers again"),
        _ => {}
    }
}
