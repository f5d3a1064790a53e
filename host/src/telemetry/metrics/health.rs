//! What `/healthz` and `/readyz` read: whether the last check of each dependency succeeded,
//! the worker loops running, and when each worker's batch in hand started (to find one stuck).

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::label_values;

label_values! {
    /// The dependencies of `sluice_dependency_up`.
    pub enum Dependency {
        Database => "database",
        Kafka => "kafka",
        /// Only with `[nats]`.
        Nats => "nats",
        /// Only with `[rabbitmq]`.
        Rabbitmq => "rabbitmq",
        /// Only with `[redis]`.
        Redis => "redis",
        /// Only with `[schema_registry]`.
        SchemaRegistry => "schema_registry",
    }
}

label_values! {
    /// What a configuration reload did (`sluice_config_reloads_total`).
    pub enum ReloadOutcome {
        /// Read, and every change in it applied (or nothing changed).
        Applied => "applied",
        /// Read, but a part of it did not check or start: that part keeps running as it was.
        Refused => "refused",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabel {
    outcome: ReloadOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DependencyLabel {
    dependency: Dependency,
}

/// Dependency checks and worker heartbeats.
#[derive(Debug)]
pub struct HealthMetrics {
    dependency_up: Family<DependencyLabel, Gauge>,
    config_reloads: Family<ReloadLabel, Counter>,
    workers_running: Gauge,
    workers_started: AtomicI64,
    /// When each worker loop's batch in hand started (`None`: between batches), by worker.
    batches_in_hand: Mutex<Vec<Option<Instant>>>,
}

impl Default for HealthMetrics {
    /// Every dependency down (unchecked) at 0.
    fn default() -> Self {
        let m = Self {
            dependency_up: Family::default(),
            config_reloads: Family::default(),
            workers_running: Gauge::default(),
            workers_started: AtomicI64::new(0),
            batches_in_hand: Mutex::default(),
        };
        // The registry's and the brokers' gauges appear once they are checked (or the relay
        // sets them down at start): a relay without them has none.
        let _ = m.dependency_up.get_or_create(&DependencyLabel {
            dependency: Dependency::Database,
        });
        for &outcome in ReloadOutcome::ALL {
            let _ = m.config_reloads.get_or_create(&ReloadLabel { outcome });
        }
        m
    }
}

impl Dependency {
    /// A broker's dependency.
    pub fn broker(broker: crate::model::Broker) -> Self {
        use crate::model::Broker;
        match broker {
            Broker::Kafka => Self::Kafka,
            Broker::Nats => Self::Nats,
            Broker::Rabbitmq => Self::Rabbitmq,
            Broker::Redis => Self::Redis,
        }
    }
}

impl HealthMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "dependency_up",
            "Whether the last check of a dependency (database, kafka, nats, rabbitmq, redis, schema_registry) succeeded",
            self.dependency_up.clone(),
        );
        r.register(
            "config_reloads",
            "Times the configuration was read again while running (a watched file changed, SIGHUP, POST /reload), by outcome: applied, or refused (a part did not check or start and keeps running as it was)",
            self.config_reloads.clone(),
        );
        r.register(
            "relay_workers_running",
            "Relay worker loops running now",
            self.workers_running.clone(),
        );
    }

    pub fn set_dependency_up(&self, dependency: Dependency, up: bool) {
        self.dependency_up
            .get_or_create(&DependencyLabel { dependency })
            .set(i64::from(up));
    }

    /// Whether the last check of `dependency` succeeded.
    pub fn dependency_up(&self, dependency: Dependency) -> bool {
        self.dependency_up
            .get(&DependencyLabel { dependency })
            .is_some_and(|g| g.get() == 1)
    }

    /// A configuration reload finished with `outcome`.
    pub fn config_reloaded(&self, outcome: ReloadOutcome) {
        self.config_reloads
            .get_or_create(&ReloadLabel { outcome })
            .inc();
    }

    pub fn worker_started(&self) {
        self.workers_started.fetch_add(1, Ordering::Relaxed);
        self.workers_running.inc();
    }

    pub fn worker_ended(&self) {
        self.workers_running.dec();
    }

    /// Worker loops started so far, and running now.
    pub fn workers(&self) -> (i64, i64) {
        (
            self.workers_started.load(Ordering::Relaxed),
            self.workers_running.get(),
        )
    }

    /// Worker `worker` claimed a batch (`Some(now)`), or is done with it (`None`).
    pub fn batch_in_hand(&self, worker: usize, since: Option<Instant>) {
        let mut batches = self
            .batches_in_hand
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if batches.len() <= worker {
            batches.resize(worker + 1, None);
        }
        batches[worker] = since;
    }

    /// Worker loops whose batch in hand started more than `after` ago: stuck, since every
    /// step of a batch is bounded well below that (see `telemetry.stalled_after`).
    pub fn stalled_workers(&self, after: Duration, now: Instant) -> usize {
        self.batches_in_hand
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flatten()
            .filter(|since| now.saturating_duration_since(**since) > after)
            .count()
    }
}
