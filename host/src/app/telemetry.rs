//! `[telemetry]` in a running relay: the [`Metrics`] the relay records into, the collector that
//! reads the plugin router at scrape time, the backlog sampler (one bounded statement and one
//! broker metadata request per `sample_interval`), and what `/healthz`, `/readyz` and
//! `/status` answer.

use std::sync::{Arc, Mutex};

use chrono::Utc;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::json;

use super::assemble::AppRelay;
use super::status::{StatusReport, tenant_reports};
use crate::config::Config;
use crate::plugin::{PluginRouter, TenantState};
use crate::shutdown::Shutdown;
use crate::store::{OutboxStore, Store, TenantBacklog};
use crate::telemetry::metrics::dependency;
use crate::telemetry::server::{Check, Endpoints};
use crate::telemetry::settings::{BROKER_PROBE_TIMEOUT, DATABASE_PROBE_TIMEOUT};
use crate::telemetry::{Metrics, TelemetrySettings, TenantLabels, TenantSample};

/// The metrics of a relay configured by `config`, with the router's tenants read at scrape
/// time.
pub fn metrics(config: &Config, router: &Arc<PluginRouter>) -> Arc<Metrics> {
    let tenants = TenantLabels::new(config.tenants.keys().map(String::as_str));
    let mut metrics = Metrics::new(tenants.clone(), &crate::sink::librdkafka_version());
    metrics.register_collector(RouterCollector {
        router: Arc::clone(router),
        tenants,
    });
    Arc::new(metrics)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabel {
    tenant: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabels {
    tenant: Arc<str>,
    plugin: String,
    plugin_version: String,
    digest: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    tenant: Arc<str>,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    tenant: Arc<str>,
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CustomLabels {
    tenant: Arc<str>,
    name: String,
}

/// Per-tenant plugin state, read from the router at each scrape: paused, quarantined, plugin
/// info and the guests' own `counter-add` counters. Tenants without an entry share one label
/// value; their gauges say whether any of them is paused.
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
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let paused: Family<TenantLabel, Gauge> = Family::default();
        let quarantined: Family<TenantLabel, Gauge> = Family::default();
        let info: Family<PluginLabels, Gauge> = Family::default();
        let custom: Family<CustomLabels, Counter> = Family::default();
        let instantiations: Family<ReasonLabels, Counter> = Family::default();
        let limit_hits: Family<LimitLabels, Counter> = Family::default();
        for tenant in self.tenants.all() {
            let _ = paused.get_or_create(&TenantLabel {
                tenant: Arc::clone(&tenant),
            });
            let _ = quarantined.get_or_create(&TenantLabel { tenant });
        }
        for s in self.router.tenant_statuses() {
            let tenant = self.tenants.of(&s.tenant);
            let label = TenantLabel {
                tenant: Arc::clone(&tenant),
            };
            if matches!(s.state, TenantState::Paused { .. }) {
                paused.get_or_create(&label).set(1);
            }
            if matches!(s.state, TenantState::Quarantined { .. }) {
                quarantined.get_or_create(&label).set(1);
            }
            // Plugin identity and guest counters only for tenants with their own label value
            // (and rows without a tenant, which run `[plugins.default]`): bounded.
            if s.configured {
                info.get_or_create(&PluginLabels {
                    tenant: Arc::clone(&tenant),
                    plugin: s.plugin.clone(),
                    plugin_version: s.version.clone().unwrap_or_default(),
                    digest: s.digest.clone().unwrap_or_default(),
                })
                .set(1);
                for (&reason, &n) in &s.instantiations {
                    instantiations
                        .get_or_create(&ReasonLabels {
                            tenant: Arc::clone(&tenant),
                            reason,
                        })
                        .inc_by(n);
                }
                for (&limit, &n) in &s.limit_hits {
                    limit_hits
                        .get_or_create(&LimitLabels {
                            tenant: Arc::clone(&tenant),
                            limit,
                        })
                        .inc_by(n);
                }
                for (name, value) in &s.counters {
                    custom
                        .get_or_create(&CustomLabels {
                            tenant: Arc::clone(&tenant),
                            name: name.clone(),
                        })
                        .inc_by(*value);
                }
            }
        }
        let described = [
            (
                "sluice_tenant_paused",
                "Whether the tenant's circuit breaker has paused it (1) or not (0)",
                &paused,
            ),
            (
                "sluice_tenant_quarantined",
                "Whether the tenant's plugin failed to start and its rows wait (1) or not (0)",
                &quarantined,
            ),
        ];
        for (name, help, family) in described {
            let m = encoder.encode_descriptor(name, help, None, family.metric_type())?;
            family.encode(m)?;
        }
        let m = encoder.encode_descriptor(
            "sluice_plugin_info",
            "The plugin a tenant runs: its version (from its info()) and the loaded file's digest, both change on hot reload",
            None,
            info.metric_type(),
        )?;
        info.encode(m)?;
        let m = encoder.encode_descriptor(
            "sluice_plugin_custom",
            "The guest's own counters (host counter-add), at most 32 names per tenant",
            None,
            custom.metric_type(),
        )?;
        custom.encode(m)?;
        let m = encoder.encode_descriptor(
            "sluice_plugin_instantiations",
            "Plugin instances created, by reason: start, reload, after_trap, recycle \
             (recycle_memory_percent), evicted (re-created after making room)",
            None,
            instantiations.metric_type(),
        )?;
        instantiations.encode(m)?;
        let m = encoder.encode_descriptor(
            "sluice_tenant_limit_hits",
            "Sandbox limits a tenant's plugin ran into: call_timeout, memory, table_elements, \
             output_copy, output (a refused message), batch_time_budget, batch_output_budget",
            None,
            limit_hits.metric_type(),
        )?;
        limit_hits.encode(m)
    }
}

/// What the last sample saw, for `/status` and `/readyz`.
#[derive(Debug, Default)]
pub struct LastSample {
    pub at: Option<chrono::DateTime<Utc>>,
    pub backlog: Vec<TenantBacklog>,
    /// Why the last broker check failed (authentication, TLS, unreachable), for `/readyz`.
    pub kafka_error: Option<String>,
}

/// Samples the backlog gauges and checks the database and the broker every
/// `sample_interval`, until `stop` fires.
pub async fn sample(
    store: Arc<Store>,
    relay: Arc<AppRelay>,
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
        tokio::select! {
            () = tokio::time::sleep(settings.sample_interval) => {}
            _ = stop.recv() => return,
        }
    }
}

async fn sample_once(
    store: &Store,
    relay: &Arc<AppRelay>,
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
            metrics.set_dependency_up(dependency::DATABASE, true);
            let samples: Vec<(Arc<str>, TenantSample)> = backlog
                .iter()
                .map(|b| {
                    let label = match &b.tenant {
                        Some(name) => metrics.tenants().of_name(name),
                        None => metrics.tenant(&crate::model::TenantId::none()),
                    };
                    let sample = TenantSample {
                        due: b.due,
                        oldest_due_age_seconds: b
                            .oldest_due_age
                            .map_or(0.0, |age| age.as_secs_f64()),
                        dead: b.dead,
                    };
                    (label, sample)
                })
                .collect();
            metrics.set_samples(&samples);
            let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
            last.at = Some(Utc::now());
            last.backlog = backlog;
        }
        Ok(Err(e)) => {
            metrics.set_dependency_up(dependency::DATABASE, false);
            tracing::warn!(error = %e, "sampling the outbox backlog failed");
        }
        Err(_) => {
            metrics.set_dependency_up(dependency::DATABASE, false);
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
    metrics.set_dependency_up(dependency::KAFKA, kafka_error.is_none());
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

/// What the endpoints answer, from memory: the metrics, the router and the last sample.
pub struct AppEndpoints {
    pub metrics: Arc<Metrics>,
    pub router: Arc<PluginRouter>,
    pub last: Arc<Mutex<LastSample>>,
    pub settings: TelemetrySettings,
    /// Worker loops the relay runs.
    pub workers: usize,
}

impl Endpoints for AppEndpoints {
    fn metrics(&self) -> Result<String, std::fmt::Error> {
        self.metrics.encode()
    }

    fn health(&self) -> Check {
        let (started, running) = self.metrics.workers();
        let expected = i64::try_from(self.workers.max(1)).unwrap_or(i64::MAX);
        let stalled = self
            .metrics
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
        let database = self.metrics.dependency_up(dependency::DATABASE);
        let kafka = self.metrics.dependency_up(dependency::KAFKA);
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
        let kafka_error = self
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .kafka_error
            .clone();
        Check {
            ok: database && kafka,
            body: json!({
                "database": database,
                "kafka": kafka,
                "kafka_error": kafka_error,
                "paused_tenants": paused,
            }),
        }
    }

    fn status(&self) -> serde_json::Value {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let report = StatusReport {
            sampled_at: last.at,
            sample_limit: self.settings.sample_limit,
            database_up: Some(self.metrics.dependency_up(dependency::DATABASE)),
            kafka_up: Some(self.metrics.dependency_up(dependency::KAFKA)),
            tenants: tenant_reports(&last.backlog, &self.router.tenant_statuses()),
        };
        serde_json::to_value(report).unwrap_or_else(|e| json!({ "error": e.to_string() }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::plugin::PluginsSettings;

    fn endpoints(workers: usize) -> AppEndpoints {
        let router = PluginRouter::from_settings(&PluginsSettings::default(), &BTreeMap::new())
            .expect("a router without plugins");
        AppEndpoints {
            metrics: Arc::new(Metrics::new(TenantLabels::new(None::<&str>), "test")),
            router: Arc::new(router),
            last: Arc::default(),
            settings: TelemetrySettings::default(),
            workers,
        }
    }

    #[test]
    fn healthz_fails_once_a_worker_has_died() {
        let e = endpoints(2);
        assert!(e.health().ok, "starting up");
        e.metrics.worker_started();
        e.metrics.worker_started();
        assert!(e.health().ok);
        e.metrics.worker_ended();
        let check = e.health();
        assert!(!check.ok);
        assert_eq!(check.body["workers_running"], 1);
    }

    #[test]
    fn healthz_fails_while_a_worker_is_stuck_in_one_batch() {
        let mut e = endpoints(2);
        e.settings.stalled_after = std::time::Duration::from_secs(60);
        e.metrics.worker_started();
        e.metrics.worker_started();
        let now = std::time::Instant::now();
        e.metrics.batch_in_hand(0, Some(now));
        e.metrics
            .batch_in_hand(1, now.checked_sub(std::time::Duration::from_secs(61)));
        let check = e.health();
        assert!(!check.ok);
        assert_eq!(check.body["workers_stalled"], 1);
        e.metrics.batch_in_hand(1, None);
        assert!(e.health().ok, "the batch finished");
    }

    #[test]
    fn readyz_needs_both_dependencies_checked_and_up() {
        let e = endpoints(1);
        assert!(!e.ready().ok, "nothing checked yet");
        e.metrics.set_dependency_up(dependency::DATABASE, true);
        assert!(!e.ready().ok);
        e.metrics.set_dependency_up(dependency::KAFKA, true);
        assert!(e.ready().ok);
        e.metrics.set_dependency_up(dependency::KAFKA, false);
        let check = e.ready();
        assert!(!check.ok);
        assert_eq!(check.body["kafka"], false);
        assert_eq!(check.body["kafka_error"], serde_json::Value::Null);
        // The body names why, as the log does.
        e.last.lock().unwrap().kafka_error =
            Some("authentication with the broker failed: SASL".to_owned());
        assert_eq!(
            e.ready().body["kafka_error"],
            "authentication with the broker failed: SASL"
        );
    }
}
