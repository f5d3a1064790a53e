//! What the endpoints of a running relay answer (`/metrics`, `/healthz`, `/readyz`,
//! `/status`), all from memory, and starting them: the HTTP server and the backlog sampler
//! whose last sample they read.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use super::assemble::AppRelay;
use super::reload::ReloadRequest;
use super::sampler::{self, LastSample};
use super::services::Services;
use super::status::{ReplayReport, StatusReport};
use crate::config::Config;
use crate::encoding::{RegistryClient, RegistryState};
use crate::model::Broker;
use crate::plugin::{PluginRouter, TenantState};
use crate::store::Store;
use crate::telemetry::auth::SharedAccess;
use crate::telemetry::metrics::Dependency;
use crate::telemetry::server::{self, Check, Endpoints, ReloadFuture};
use crate::telemetry::{Metrics, TelemetrySettings};

/// The parts of a relay the endpoints read.
pub(super) struct Served<'a> {
    pub store: &'a Arc<Store>,
    pub relay: &'a Arc<AppRelay>,
    pub router: &'a Arc<PluginRouter>,
    pub registry: Option<Arc<RegistryClient>>,
}

/// Binds `[telemetry] listen` (a taken port fails the start) and starts the HTTP endpoints and
/// the backlog sampler among `services`. Returns the endpoints' credentials, for SIGHUP to
/// replace (`None` without `listen`).
pub(super) async fn start(
    services: &mut Services,
    config: &Config,
    served: Served<'_>,
    metrics: Arc<Metrics>,
    reloads: mpsc::Sender<ReloadRequest>,
) -> anyhow::Result<Option<Arc<SharedAccess>>> {
    let Served {
        store,
        relay,
        router,
        registry,
    } = served;
    let settings = config.telemetry.clone();
    let Some(listen) = settings.listen_addr() else {
        return Ok(None);
    };
    // Checked when the config was loaded; a name is resolved only now.
    let listen = listen.map_err(|e| anyhow::anyhow!("telemetry.listen: {e}"))?;
    let listener = server::bind(&listen)
        .await
        .with_context(|| format!("telemetry.listen: cannot listen on {listen}"))?;
    let access = Arc::new(SharedAccess::new(settings.access()));
    let address =
        server::local_addr(&listener).map_or_else(|| listen.to_string(), |a| a.to_string());
    tracing::info!(address, listen = %listen, access = access.current().describe(),
        "serving /metrics, /healthz, /readyz and /status");
    let brokers: Vec<Broker> = relay.sink().brokers().collect();
    for &broker in &brokers {
        // Down until the first check says otherwise, as the database is.
        metrics
            .health
            .set_dependency_up(Dependency::broker(broker), false);
    }
    let last = Arc::new(Mutex::new(LastSample::new(brokers)));
    let endpoints: Arc<dyn Endpoints> = Arc::new(AppEndpoints {
        metrics: Arc::clone(&metrics),
        router: Arc::clone(router),
        last: Arc::clone(&last),
        settings: settings.clone(),
        workers: config.relay.workers,
        registry: registry.as_ref().map(|r| Arc::clone(r.state())),
        reloads: settings.reload.then_some(reloads),
    });
    let served = Arc::clone(&access);
    services.start("telemetry server", move |stop| {
        server::serve(listener, endpoints, served, stop)
    });
    let (store, relay) = (Arc::clone(store), Arc::clone(relay));
    services.start("backlog sampler", move |stop| {
        sampler::sample(store, relay, registry, metrics, last, settings, stop)
    });
    Ok(Some(access))
}

/// What the endpoints answer, from memory: the metrics, the router and the last sample.
struct AppEndpoints {
    metrics: Arc<Metrics>,
    router: Arc<PluginRouter>,
    last: Arc<Mutex<LastSample>>,
    settings: TelemetrySettings,
    /// Worker loops the relay runs.
    workers: usize,
    /// With `[schema_registry]`: whether it answered last.
    registry: Option<Arc<RegistryState>>,
    /// With `[telemetry] reload = true`: where `POST /reload` asks for a reload.
    reloads: Option<mpsc::Sender<ReloadRequest>>,
}

impl Endpoints for AppEndpoints {
    fn metrics(&self) -> Result<String, std::fmt::Error> {
        self.metrics.encode()
    }

    fn health(&self) -> Check {
        let (started, running) = self.metrics.health.workers();
        let expected = i64::try_from(self.workers.max(1)).unwrap_or(i64::MAX);
        let stalled = self
            .metrics
            .health
            .stalled_workers(self.settings.stalled_after, std::time::Instant::now());
        // Before the workers start (start-up), the process is alive; after, every worker
        // must still be running, and none stuck in one batch.
        let ok = (started == 0 || running >= expected) && stalled == 0;
        Check {
            ok,
            body: json!({
                "workers_running": running,
                "workers": expected,
                "workers_stalled": stalled,
            }),
        }
    }

    fn ready(&self) -> Check {
        let database = self.metrics.health.dependency_up(Dependency::Database);
        let paused: Vec<String> = self
            .router
            .tenant_statuses()
            .into_iter()
            .filter(|s| {
                matches!(
                    s.state,
                    TenantState::Paused { .. } | TenantState::Quarantined { .. }
                )
            })
            .map(|s| s.tenant.to_string())
            .collect();
        let brokers = self
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .brokers
            .clone();
        // A registry that does not answer holds back only the rows to be encoded (or not
        // even those, with their schemas cached), but a relay that cannot encode is not ready.
        let registry = self.registry.as_ref().map(|r| r.up());
        let mut body = json!({
            "database": database,
            "paused_tenants": paused,
        });
        let mut brokers_up = true;
        // Each broker as `"<broker>": up, "<broker>_error": why not` (Kafka's keys as before
        // there were other brokers).
        for (broker, error) in &brokers {
            let up = self
                .metrics
                .health
                .dependency_up(Dependency::broker(*broker));
            brokers_up &= up;
            body[broker.as_str()] = json!(up);
            body[format!("{broker}_error")] = json!(error);
        }
        if let (Some(up), Some(state)) = (registry, &self.registry) {
            body["schema_registry"] = json!(up);
            body["schema_registry_error"] = json!(state.error());
        }
        Check {
            ok: database && brokers_up && registry.unwrap_or(true),
            body,
        }
    }

    fn status(&self) -> serde_json::Value {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let statuses = self.router.tenant_statuses();
        let mut report = StatusReport {
            database_up: Some(self.metrics.health.dependency_up(Dependency::Database)),
            kafka_up: last
                .brokers
                .contains_key(&Broker::Kafka)
                .then(|| self.metrics.health.dependency_up(Dependency::Kafka)),
            brokers_up: Some(
                last.brokers
                    .keys()
                    .map(|b| {
                        let up = self.metrics.health.dependency_up(Dependency::broker(*b));
                        (b.to_string(), up)
                    })
                    .collect(),
            ),
            ..StatusReport::of_sample(
                last.at,
                &last.backlog,
                &statuses,
                self.settings.sample_limit,
            )
        };
        report.rank_laggards(self.settings.laggards);
        report.replays = last.replays.iter().map(ReplayReport::of).collect();
        report.instances = Some(self.router.instances());
        report.tenant_changes = Some(self.router.change_status());
        serde_json::to_value(report).unwrap_or_else(|e| json!({ "error": e.to_string() }))
    }

    fn reload(&self) -> Option<ReloadFuture> {
        let reloads = self.reloads.clone()?;
        Some(Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let report = match reloads.send(reply).await {
                Ok(()) => answer.await.ok(),
                Err(_) => None,
            };
            match report {
                Some(report) => Check {
                    ok: report.ok(),
                    body: serde_json::to_value(&report)
                        .unwrap_or_else(|e| json!({ "error": e.to_string() })),
                },
                None => Check {
                    ok: false,
                    body: json!({ "error": "the relay is stopping: nothing was reloaded" }),
                },
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::plugin::PluginsSettings;
    use crate::telemetry::TenantLabels;

    fn endpoints(workers: usize) -> AppEndpoints {
        let router = PluginRouter::from_settings(&PluginsSettings::default(), &BTreeMap::new())
            .expect("a router without plugins");
        AppEndpoints {
            metrics: Arc::new(Metrics::new(TenantLabels::new(None::<&str>), "test")),
            router: Arc::new(router),
            last: Arc::new(Mutex::new(LastSample::new([Broker::Kafka]))),
            settings: TelemetrySettings::default(),
            workers,
            registry: None,
            reloads: None,
        }
    }

    #[test]
    fn healthz_fails_once_a_worker_has_died() {
        let e = endpoints(2);
        assert!(e.health().ok, "starting up");
        e.metrics.health.worker_started();
        e.metrics.health.worker_started();
        assert!(e.health().ok);
        e.metrics.health.worker_ended();
        let check = e.health();
        assert!(!check.ok);
        assert_eq!(check.body["workers_running"], 1);
    }

    #[test]
    fn healthz_fails_while_a_worker_is_stuck_in_one_batch() {
        let mut e = endpoints(2);
        e.settings.stalled_after = std::time::Duration::from_secs(60);
        e.metrics.health.worker_started();
        e.metrics.health.worker_started();
        let now = std::time::Instant::now();
        e.metrics.health.batch_in_hand(0, Some(now));
        e.metrics
            .health
            .batch_in_hand(1, now.checked_sub(std::time::Duration::from_secs(61)));
        let check = e.health();
        assert!(!check.ok);
        assert_eq!(check.body["workers_stalled"], 1);
        e.metrics.health.batch_in_hand(1, None);
        assert!(e.health().ok, "the batch finished");
    }

    #[test]
    fn readyz_needs_both_dependencies_checked_and_up() {
        let e = endpoints(1);
        assert!(!e.ready().ok, "nothing checked yet");
        e.metrics
            .health
            .set_dependency_up(Dependency::Database, true);
        assert!(!e.ready().ok);
        e.metrics.health.set_dependency_up(Dependency::Kafka, true);
        assert!(e.ready().ok);
        e.metrics.health.set_dependency_up(Dependency::Kafka, false);
        let check = e.ready();
        assert!(!check.ok);
        assert_eq!(check.body["kafka"], false);
        assert_eq!(check.body["kafka_error"], "not checked yet");
        // The body names why, as the log does.
        e.last.lock().unwrap().brokers.insert(
            Broker::Kafka,
            Some("authentication with the broker failed: SASL".to_owned()),
        );
        assert_eq!(
            e.ready().body["kafka_error"],
            "authentication with the broker failed: SASL"
        );
    }

    #[test]
    fn readyz_needs_every_broker_up_and_names_the_one_that_is_not() {
        let e = endpoints(1);
        *e.last.lock().unwrap() = LastSample::new([Broker::Kafka, Broker::Nats, Broker::Redis]);
        let health = &e.metrics.health;
        health.set_dependency_up(Dependency::Database, true);
        health.set_dependency_up(Dependency::Kafka, true);
        health.set_dependency_up(Dependency::Nats, true);
        assert!(!e.ready().ok, "redis not up yet");
        health.set_dependency_up(Dependency::Redis, true);
        e.last.lock().unwrap().brokers.insert(Broker::Redis, None);
        let check = e.ready();
        assert!(check.ok, "{}", check.body);
        assert_eq!(check.body["redis"], true);
        assert_eq!(
            check.body["rabbitmq"],
            serde_json::Value::Null,
            "not configured"
        );
        health.set_dependency_up(Dependency::Nats, false);
        e.last.lock().unwrap().brokers.insert(
            Broker::Nats,
            Some("broker not reachable: connection refused".to_owned()),
        );
        let check = e.ready();
        assert!(!check.ok);
        assert_eq!(check.body["nats"], false);
        assert_eq!(
            check.body["nats_error"],
            "broker not reachable: connection refused"
        );
        let status = e.status();
        assert_eq!(status["brokers_up"]["nats"], false);
        assert_eq!(status["brokers_up"]["kafka"], true);
        assert_eq!(status["kafka_up"], true);
    }

    #[test]
    fn readyz_is_not_ready_while_the_schema_registry_does_not_answer() {
        use crate::encoding::RegistryError;
        let mut e = endpoints(1);
        let state = Arc::new(RegistryState::default());
        e.registry = Some(Arc::clone(&state));
        e.metrics
            .health
            .set_dependency_up(Dependency::Database, true);
        e.metrics.health.set_dependency_up(Dependency::Kafka, true);
        assert!(e.ready().ok, "not asked yet: nothing known to be wrong");
        state.record::<()>(&Err(RegistryError::Unreachable(
            "connection refused".into(),
        )));
        let check = e.ready();
        assert!(!check.ok);
        assert_eq!(check.body["schema_registry"], false);
        assert_eq!(
            check.body["schema_registry_error"],
            "schema registry unreachable: connection refused"
        );
        // A 404 is an answer: the registry is up.
        state.record::<()>(&Err(RegistryError::NotFound("no such subject".into())));
        assert!(e.ready().ok);
        assert_eq!(e.ready().body["schema_registry"], true);
        // Without [schema_registry] the body does not mention it.
        e.registry = None;
        assert!(e.ready().body.get("schema_registry").is_none());
    }
}
