//! The backlog sampler of a running relay with `[telemetry] listen`: one bounded statement
//! and one broker readiness probe per `sample_interval`, into the backlog gauges, the
//! dependency checks and what `/status` and `/readyz` answer.

use std::sync::{Arc, Mutex};

use chrono::Utc;

use crate::encoding::RegistryClient;
use crate::plugin::RowTransformer;
use crate::relay::Relay;
use crate::shutdown::Shutdown;
use crate::sink::Sink;
use crate::store::{OutboxStore, Store, TenantBacklog};
use crate::telemetry::metrics::Dependency;
use crate::telemetry::settings::{BROKER_PROBE_TIMEOUT, DATABASE_PROBE_TIMEOUT};
use crate::telemetry::{Metrics, TelemetrySettings, TenantSample};

/// What the last sample saw, for `/status` and `/readyz`.
#[derive(Debug, Default)]
pub(super) struct LastSample {
    pub at: Option<chrono::DateTime<Utc>>,
    pub backlog: Vec<TenantBacklog>,
    /// Why the last broker check failed (authentication, TLS, unreachable), for `/readyz`.
    pub kafka_error: Option<String>,
}

/// Samples the backlog gauges and checks the database and the broker every
/// `sample_interval`, until `stop` fires.
pub(super) async fn sample<T: RowTransformer, K: Sink>(
    store: Arc<Store>,
    relay: Arc<Relay<Store, T, K>>,
    registry: Option<Arc<RegistryClient>>,
    metrics: Arc<Metrics>,
    last: Arc<Mutex<LastSample>>,
    settings: TelemetrySettings,
    mut stop: Shutdown,
) {
    loop {
        tokio::select! {
            () = sample_once(&store, &relay, &metrics, &last, &settings) => {}
            _ = stop.recv() => return,
        }
        if let Some(registry) = &registry {
            tokio::select! {
                () = check_registry(registry, &metrics) => {}
                _ = stop.recv() => return,
            }
        }
        tokio::select! {
            () = tokio::time::sleep(settings.sample_interval) => {}
            _ = stop.recv() => return,
        }
    }
}

async fn sample_once<T: RowTransformer, K: Sink>(
    store: &Store,
    relay: &Arc<Relay<Store, T, K>>,
    metrics: &Metrics,
    last: &Mutex<LastSample>,
    settings: &TelemetrySettings,
) {
    let sampled = tokio::time::timeout(
        DATABASE_PROBE_TIMEOUT,
        store.sample_backlog(settings.sample_limit),
    )
    .await;
    match sampled {
        Ok(Ok(backlog)) => {
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
            let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
            last.at = Some(Utc::now());
            last.backlog = backlog;
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
    let probe = {
        let relay = Arc::clone(relay);
        tokio::task::spawn_blocking(move || relay.sink().probe(BROKER_PROBE_TIMEOUT))
    };
    let kafka_error = match probe.await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(e) => Some(format!("the readiness check did not finish: {e}")),
    };
    metrics
        .health
        .set_dependency_up(Dependency::Kafka, kafka_error.is_none());
    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
    // Logged when the answer changes, not every sample: an outage lasts many samples. The
    // error names its cause as the sink's own log line does (see sink/connection.rs).
    if kafka_error != last.kafka_error {
        match &kafka_error {
            Some(e) => tracing::warn!(error = %e, "the broker did not answer the readiness check"),
            None => tracing::info!("the broker answers the readiness check again"),
        }
        last.kafka_error = kafka_error;
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
