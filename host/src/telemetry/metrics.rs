//! The metric families of a relay and the calls that record into them. Names follow the
//! Prometheus conventions (`sluice_` prefix, base units, `_total` counters); the reference with
//! what each means is in `docs/operations.md`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::labels::TenantLabels;
use super::process::ProcessCollector;
use crate::model::TenantId;

/// Distinct `topic` label values kept; more topics share [`OTHER_TOPICS`]. Topics are bounded
/// by the allow-lists, but a plugin without one may route to many.
const MAX_TOPICS: usize = 256;
/// The `topic` label value of topics past [`MAX_TOPICS`].
pub const OTHER_TOPICS: &str = "_other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabel {
    tenant: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantOutcome {
    tenant: Arc<str>,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantPlugin {
    tenant: Arc<str>,
    plugin: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantPluginOutcome {
    tenant: Arc<str>,
    plugin: Arc<str>,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantReason {
    tenant: Arc<str>,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantTopic {
    tenant: Arc<str>,
    topic: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicError {
    topic: Arc<str>,
    error_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabel {
    mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DependencyLabel {
    dependency: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    wasmtime: &'static str,
    librdkafka: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// One tenant's unsent rows, as the sampler read them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantSample {
    /// Rows due now.
    pub due: i64,
    /// Age of the oldest due row, in seconds (0 when none is due).
    pub oldest_due_age_seconds: f64,
    pub dead: i64,
}

/// Every metric of one relay process. Cheap to record into from any thread.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    tenants: TenantLabels,
    topics: Mutex<HashMap<String, Arc<str>>>,
    claims: Family<ResultLabel, Counter>,
    claim_duration: Histogram,
    claim_batch_rows: Histogram,
    transform_duration: HistogramFamily<TenantPlugin>,
    transform_calls: Family<TenantPluginOutcome, Counter>,
    poll_wakeups: Family<CauseLabel, Counter>,
    rows_completed: Family<TenantOutcome, Counter>,
    dead_letters: Family<TenantReason, Counter>,
    messages_produced: Family<TenantTopic, Counter>,
    produced_bytes: Family<TenantTopic, Counter>,
    produce_errors: Family<TopicError, Counter>,
    produce_duration: Histogram,
    producer_queue: Gauge,
    mark_duration: HistogramFamily<ModeLabel>,
    delivered_not_marked: Counter,
    end_to_end: HistogramFamily<TenantLabel>,
    last_publish: Family<TenantLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    due_rows: Family<TenantLabel, Gauge>,
    oldest_due_age: Family<TenantLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    dead_rows: Family<TenantLabel, Gauge>,
    dependency_up: Family<DependencyLabel, Gauge>,
    workers_running: Gauge,
    batch_concurrency: Gauge,
    workers_started: AtomicI64,
    /// When each worker loop's batch in hand started (`None`: between batches), by worker.
    batches_in_hand: Mutex<Vec<Option<Instant>>>,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s: a claim, a transform or a delivery report is usually milliseconds; the
    // tail shows outages.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn end_to_end_histogram() -> Histogram {
    // 5 ms .. ~1.5 h: a row may wait out retries.
    Histogram::new(exponential_buckets(0.005, 3.0, 15))
}

/// The outcome label values of `sluice_rows_completed_total`.
pub mod outcome {
    pub const SENT: &str = "sent";
    pub const DROPPED: &str = "dropped";
    pub const RETRY_SCHEDULED: &str = "retry_scheduled";
    pub const DEAD: &str = "dead";
}

/// The `reason` label values of `sluice_dead_letters_total`.
pub mod dead_reason {
    /// The plugin said the row can never succeed (`permanent`).
    pub const PERMANENT: &str = "permanent";
    /// The row failed `max_attempts` times.
    pub const ATTEMPTS_EXHAUSTED: &str = "attempts_exhausted";
    /// The store could not read the row (a column it cannot decode).
    pub const INVALID_ROW: &str = "invalid_row";
}

/// The `cause` label values of `sluice_poll_wakeups_total`.
pub mod wake_cause {
    /// The idle wait ran out.
    pub const TIMER: &str = "timer";
    /// A NOTIFY (or the LISTEN connection coming back) cut it short.
    pub const NOTIFY: &str = "notify";
    /// Another worker found rows (a full batch, or rows after a quiet spell).
    pub const REFILL: &str = "refill";
}

/// The `outcome` label values of `sluice_transform_calls_total` that a tenant's plugin can
/// produce (`no_plugin` is only ever seen with `plugin="_none"`).
pub const PLUGIN_OUTCOMES: &[&str] = &[
    "ok",
    "retryable",
    "permanent",
    "trap",
    "timeout",
    "invalid_output",
    "unavailable",
];

/// The `plugin` label value of rows no plugin could take (no `[plugins.default]`).
pub const NO_PLUGIN: &str = "_none";

/// The dependencies of `sluice_dependency_up`.
pub mod dependency {
    pub const DATABASE: &str = "database";
    pub const KAFKA: &str = "kafka";
}

impl Metrics {
    /// The metrics of a relay whose configured tenants `tenants` names, with `librdkafka`'s
    /// version for `sluice_build_info`.
    pub fn new(tenants: TenantLabels, librdkafka: &str) -> Self {
        let mut registry = Registry::default();
        let m = Self {
            registry: Registry::default(),
            tenants,
            topics: Mutex::default(),
            claims: Family::default(),
            claim_duration: latency_histogram(),
            claim_batch_rows: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            transform_duration: Family::new_with_constructor(latency_histogram),
            transform_calls: Family::default(),
            poll_wakeups: Family::default(),
            rows_completed: Family::default(),
            dead_letters: Family::default(),
            messages_produced: Family::default(),
            produced_bytes: Family::default(),
            produce_errors: Family::default(),
            produce_duration: latency_histogram(),
            producer_queue: Gauge::default(),
            mark_duration: Family::new_with_constructor(latency_histogram),
            delivered_not_marked: Counter::default(),
            end_to_end: Family::new_with_constructor(end_to_end_histogram),
            last_publish: Family::default(),
            due_rows: Family::default(),
            oldest_due_age: Family::default(),
            dead_rows: Family::default(),
            dependency_up: Family::default(),
            workers_running: Gauge::default(),
            batch_concurrency: Gauge::default(),
            workers_started: AtomicI64::new(0),
            batches_in_hand: Mutex::default(),
        };
        let build: Family<BuildLabels, Gauge> = Family::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                wasmtime: "48",
                librdkafka: librdkafka.to_owned(),
            })
            .set(1);
        // Sluice's own metrics carry the prefix; the process collector's `process_*` do not.
        let r = registry.sub_registry_with_prefix("sluice");
        r.register(
            "build_info",
            "Sluice build: version, wasmtime and librdkafka",
            build,
        );
        r.register(
            "claims",
            "Claims by result (rows, empty, error)",
            m.claims.clone(),
        );
        r.register_with_unit(
            "claim_duration",
            "Time to claim one batch (the claim statement)",
            Unit::Seconds,
            m.claim_duration.clone(),
        );
        r.register(
            "claim_batch_rows",
            "Rows per non-empty claim",
            m.claim_batch_rows.clone(),
        );
        r.register_with_unit(
            "transform_duration",
            "Time to run one batch's rows of a tenant through its plugin, by tenant and plugin",
            Unit::Seconds,
            m.transform_duration.clone(),
        );
        r.register(
            "transform_calls",
            "Rows run through a plugin, by tenant, plugin and outcome (ok, retryable, permanent, trap, timeout, invalid_output, unavailable, no_plugin)",
            m.transform_calls.clone(),
        );
        r.register(
            "poll_wakeups",
            "Idle waits of the poll clock that ended, by cause (timer, notify, refill)",
            m.poll_wakeups.clone(),
        );
        r.register(
            "rows_completed",
            "Rows whose fate was recorded, by tenant and outcome (sent, dropped, retry_scheduled, dead)",
            m.rows_completed.clone(),
        );
        r.register(
            "dead_letters",
            "Rows that went dead, by tenant and reason (permanent, attempts_exhausted, invalid_row)",
            m.dead_letters.clone(),
        );
        r.register(
            "messages_produced",
            "Messages acknowledged by the broker, by tenant and topic",
            m.messages_produced.clone(),
        );
        r.register_with_unit(
            "produced",
            "Payload and key bytes of acknowledged messages, by tenant and topic",
            Unit::Bytes,
            m.produced_bytes.clone(),
        );
        r.register(
            "produce_errors",
            "Messages the broker did not acknowledge, by topic and error type (unavailable, refused, failed)",
            m.produce_errors.clone(),
        );
        r.register_with_unit(
            "produce_duration",
            "Time from sending a batch's messages to the last delivery report",
            Unit::Seconds,
            m.produce_duration.clone(),
        );
        r.register(
            "producer_queue_messages",
            "Messages in the producer's queues, not yet acknowledged (librdkafka statistics msg_cnt)",
            m.producer_queue.clone(),
        );
        r.register_with_unit(
            "mark_duration",
            "Time to mark a batch and commit, by mark mode",
            Unit::Seconds,
            m.mark_duration.clone(),
        );
        r.register(
            "delivered_not_marked",
            "Rows whose messages may be published but whose outcome could not be recorded: they are published again (duplicates)",
            m.delivered_not_marked.clone(),
        );
        r.register_with_unit(
            "end_to_end_latency",
            "Row created (its created_at) to its last message acknowledged, by tenant",
            Unit::Seconds,
            m.end_to_end.clone(),
        );
        r.register_with_unit(
            "last_publish_timestamp",
            "Unix time of the last acknowledged message, by tenant",
            Unit::Seconds,
            m.last_publish.clone(),
        );
        r.register(
            "outbox_due_rows",
            "Rows due now, by tenant (sampled; saturates at the sample limit)",
            m.due_rows.clone(),
        );
        r.register_with_unit(
            "outbox_oldest_due_age",
            "Age of the oldest due row, by tenant (sampled; 0 when none is due)",
            Unit::Seconds,
            m.oldest_due_age.clone(),
        );
        r.register(
            "outbox_dead_rows",
            "Dead rows, by tenant (sampled; saturates at the sample limit)",
            m.dead_rows.clone(),
        );
        r.register(
            "dependency_up",
            "Whether the last check of a dependency (database, kafka) succeeded",
            m.dependency_up.clone(),
        );
        r.register(
            "relay_workers_running",
            "Relay worker loops running now",
            m.workers_running.clone(),
        );
        r.register(
            "relay_batch_concurrency",
            "Batches the relay lets be in flight at once now (relay.adaptive_concurrency moves it between 1 and relay.workers)",
            m.batch_concurrency.clone(),
        );
        registry.register_collector(Box::new(ProcessCollector::default()));
        let mut m = m;
        m.registry = registry;
        m.initialise();
        m
    }

    /// Known label sets start at 0, so a rate over them exists before the first event.
    fn initialise(&self) {
        for result in ["rows", "empty", "error"] {
            let _ = self.claims.get_or_create(&ResultLabel { result });
        }
        for cause in [wake_cause::TIMER, wake_cause::NOTIFY, wake_cause::REFILL] {
            let _ = self.poll_wakeups.get_or_create(&CauseLabel { cause });
        }
        for tenant in self.tenants.all() {
            for outcome in [
                outcome::SENT,
                outcome::DROPPED,
                outcome::RETRY_SCHEDULED,
                outcome::DEAD,
            ] {
                let _ = self.rows_completed.get_or_create(&TenantOutcome {
                    tenant: Arc::clone(&tenant),
                    outcome,
                });
            }
            for reason in [
                dead_reason::PERMANENT,
                dead_reason::ATTEMPTS_EXHAUSTED,
                dead_reason::INVALID_ROW,
            ] {
                let _ = self.dead_letters.get_or_create(&TenantReason {
                    tenant: Arc::clone(&tenant),
                    reason,
                });
            }
        }
        self.set_samples(&[]);
        for dependency in [dependency::DATABASE, dependency::KAFKA] {
            let _ = self
                .dependency_up
                .get_or_create(&DependencyLabel { dependency });
        }
    }

    /// Starts the transform series of each configured tenant (and `_default`) with the
    /// plugin it runs at 0. The plugin a tenant runs is fixed by the config (a reload changes
    /// the file's content, not its path), so these are the label sets there will be.
    pub fn initialise_plugins<'a>(&self, plugins: impl IntoIterator<Item = (Arc<str>, &'a str)>) {
        for (tenant, plugin) in plugins {
            let plugin: Arc<str> = Arc::from(plugin);
            let _ = self.transform_duration.get_or_create(&TenantPlugin {
                tenant: Arc::clone(&tenant),
                plugin: Arc::clone(&plugin),
            });
            for &outcome in PLUGIN_OUTCOMES {
                let _ = self.transform_calls.get_or_create(&TenantPluginOutcome {
                    tenant: Arc::clone(&tenant),
                    plugin: Arc::clone(&plugin),
                    outcome,
                });
            }
        }
    }

    /// Adds a collector read at each scrape (the app's per-tenant plugin state).
    pub fn register_collector(&mut self, collector: impl Collector) {
        self.registry.register_collector(Box::new(collector));
    }

    /// The exposition in the Prometheus text format (version 0.0.4).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    pub fn tenants(&self) -> &TenantLabels {
        &self.tenants
    }

    /// The label value of `tenant`.
    pub fn tenant(&self, tenant: &TenantId) -> Arc<str> {
        self.tenants.of(tenant)
    }

    fn topic(&self, topic: &str) -> Arc<str> {
        let mut topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(label) = topics.get(topic) {
            return Arc::clone(label);
        }
        if topics.len() >= MAX_TOPICS {
            return Arc::from(OTHER_TOPICS);
        }
        let label: Arc<str> = Arc::from(topic);
        topics.insert(topic.to_owned(), Arc::clone(&label));
        label
    }

    pub fn claimed(&self, rows: usize, took: Duration) {
        let result = if rows == 0 { "empty" } else { "rows" };
        self.claims.get_or_create(&ResultLabel { result }).inc();
        self.claim_duration.observe(took.as_secs_f64());
        if rows > 0 {
            self.claim_batch_rows.observe(rows as f64);
        }
    }

    pub fn claim_failed(&self) {
        self.claims
            .get_or_create(&ResultLabel { result: "error" })
            .inc();
    }

    /// One batch's rows of `tenant` ran through `plugin` in `took` (`None`: not run, e.g.
    /// no plugin), with these counts by outcome.
    pub fn transformed(
        &self,
        tenant: &TenantId,
        plugin: &str,
        took: Option<Duration>,
        outcomes: &[(&'static str, u64)],
    ) {
        let tenant = self.tenant(tenant);
        let plugin: Arc<str> = Arc::from(plugin);
        if let Some(took) = took {
            self.transform_duration
                .get_or_create(&TenantPlugin {
                    tenant: Arc::clone(&tenant),
                    plugin: Arc::clone(&plugin),
                })
                .observe(took.as_secs_f64());
        }
        for &(outcome, rows) in outcomes {
            self.transform_calls
                .get_or_create(&TenantPluginOutcome {
                    tenant: Arc::clone(&tenant),
                    plugin: Arc::clone(&plugin),
                    outcome,
                })
                .inc_by(rows);
        }
    }

    /// An idle wait of the poll clock ended for `cause` (see [`wake_cause`]).
    pub fn poll_woken(&self, cause: &'static str) {
        self.poll_wakeups.get_or_create(&CauseLabel { cause }).inc();
    }

    /// `rows` rows of `tenant` went dead for `reason` (see [`dead_reason`]).
    pub fn dead_letters(&self, tenant: &Arc<str>, reason: &'static str, rows: u64) {
        self.dead_letters
            .get_or_create(&TenantReason {
                tenant: Arc::clone(tenant),
                reason,
            })
            .inc_by(rows);
    }

    /// Messages in the producer's queues, from librdkafka's statistics.
    pub fn set_producer_queue(&self, messages: u64) {
        self.producer_queue
            .set(i64::try_from(messages).unwrap_or(i64::MAX));
    }

    pub fn rows_completed(&self, tenant: &Arc<str>, outcome: &'static str, rows: u64) {
        self.rows_completed
            .get_or_create(&TenantOutcome {
                tenant: Arc::clone(tenant),
                outcome,
            })
            .inc_by(rows);
    }

    /// `messages` acknowledged messages of `tenant` to `topic`, `bytes` in all.
    pub fn produced(&self, tenant: &Arc<str>, topic: &str, messages: u64, bytes: u64) {
        let labels = TenantTopic {
            tenant: Arc::clone(tenant),
            topic: self.topic(topic),
        };
        self.messages_produced
            .get_or_create(&labels)
            .inc_by(messages);
        self.produced_bytes.get_or_create(&labels).inc_by(bytes);
    }

    pub fn produce_errors(&self, topic: &str, error_type: &'static str, messages: u64) {
        self.produce_errors
            .get_or_create(&TopicError {
                topic: self.topic(topic),
                error_type,
            })
            .inc_by(messages);
    }

    pub fn published(&self, took: Duration) {
        self.produce_duration.observe(took.as_secs_f64());
    }

    pub fn marked(&self, mode: &'static str, took: Duration) {
        self.mark_duration
            .get_or_create(&ModeLabel { mode })
            .observe(took.as_secs_f64());
    }

    pub fn delivered_not_marked(&self, rows: u64) {
        self.delivered_not_marked.inc_by(rows);
    }

    /// End-to-end latencies of one tenant's rows: one label look-up for all of them.
    pub fn end_to_end(&self, tenant: &Arc<str>, seconds: impl IntoIterator<Item = f64>) {
        let histogram = self.end_to_end.get_or_create_owned(&TenantLabel {
            tenant: Arc::clone(tenant),
        });
        for s in seconds {
            histogram.observe(s.max(0.0));
        }
    }

    pub fn last_publish(&self, tenant: &Arc<str>, unix_seconds: f64) {
        self.last_publish
            .get_or_create(&TenantLabel {
                tenant: Arc::clone(tenant),
            })
            .set(unix_seconds);
    }

    /// Replaces the sampled gauges: tenants missing from `samples` read 0.
    pub fn set_samples(&self, samples: &[(Arc<str>, TenantSample)]) {
        let mut by_label: HashMap<Arc<str>, TenantSample> = HashMap::new();
        for (label, sample) in samples {
            let sum = by_label.entry(Arc::clone(label)).or_default();
            sum.due += sample.due;
            sum.dead += sample.dead;
            sum.oldest_due_age_seconds = sum
                .oldest_due_age_seconds
                .max(sample.oldest_due_age_seconds);
        }
        for tenant in self.tenants.all() {
            let sample = by_label.remove(&tenant).unwrap_or_default();
            let labels = TenantLabel { tenant };
            self.due_rows.get_or_create(&labels).set(sample.due);
            self.dead_rows.get_or_create(&labels).set(sample.dead);
            self.oldest_due_age
                .get_or_create(&labels)
                .set(sample.oldest_due_age_seconds);
        }
    }

    pub fn set_dependency_up(&self, dependency: &'static str, up: bool) {
        self.dependency_up
            .get_or_create(&DependencyLabel { dependency })
            .set(i64::from(up));
    }

    /// Whether the last check of `dependency` succeeded.
    pub fn dependency_up(&self, dependency: &'static str) -> bool {
        self.dependency_up
            .get(&DependencyLabel { dependency })
            .is_some_and(|g| g.get() == 1)
    }

    pub fn worker_started(&self) {
        self.workers_started.fetch_add(1, Ordering::Relaxed);
        self.workers_running.inc();
    }

    pub fn worker_ended(&self) {
        self.workers_running.dec();
    }

    /// The limit on batches in flight.
    pub fn batch_concurrency(&self, limit: usize) {
        self.batch_concurrency
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
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

    /// Worker loops started so far, and running now.
    pub fn workers(&self) -> (i64, i64) {
        (
            self.workers_started.load(Ordering::Relaxed),
            self.workers_running.get(),
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The value of `series` (name and labels, as exposed) in the exposition `text`.
    pub(crate) fn sample_value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    #[test]
    fn counters_are_exposed_with_bounded_tenant_labels() {
        let m = Metrics::new(TenantLabels::new(["acme"]), "2.12.1");
        let acme = m.tenant(&TenantId::named("acme"));
        let other = m.tenant(&TenantId::named("someone-else"));
        m.rows_completed(&acme, outcome::SENT, 3);
        m.rows_completed(&other, outcome::DEAD, 2);
        m.produced(&acme, "t.orders", 3, 300);
        let text = m.encode().unwrap();
        assert_eq!(
            sample_value(
                &text,
                "sluice_rows_completed_total{tenant=\"acme\",outcome=\"sent\"}"
            ),
            Some(3.0),
            "{text}"
        );
        assert_eq!(
            sample_value(
                &text,
                "sluice_rows_completed_total{tenant=\"_default\",outcome=\"dead\"}"
            ),
            Some(2.0)
        );
        // Known label sets start at zero.
        assert_eq!(
            sample_value(
                &text,
                "sluice_rows_completed_total{tenant=\"acme\",outcome=\"dead\"}"
            ),
            Some(0.0)
        );
        assert_eq!(
            sample_value(
                &text,
                "sluice_produced_bytes_total{tenant=\"acme\",topic=\"t.orders\"}"
            ),
            Some(300.0)
        );
        assert!(!text.contains("someone-else"), "{text}");
        assert!(text.contains("sluice_build_info{version="), "{text}");
    }

    #[test]
    fn a_sample_resets_tenants_it_no_longer_mentions() {
        let m = Metrics::new(TenantLabels::new(["acme"]), "2.12.1");
        let acme = m.tenant(&TenantId::named("acme"));
        let due = |due| TenantSample {
            due,
            oldest_due_age_seconds: 1.5,
            dead: 0,
        };
        m.set_samples(&[(Arc::clone(&acme), due(7))]);
        let text = m.encode().unwrap();
        assert_eq!(
            sample_value(&text, "sluice_outbox_due_rows{tenant=\"acme\"}"),
            Some(7.0)
        );
        m.set_samples(&[]);
        let text = m.encode().unwrap();
        assert_eq!(
            sample_value(&text, "sluice_outbox_due_rows{tenant=\"acme\"}"),
            Some(0.0)
        );
        assert_eq!(
            sample_value(
                &text,
                "sluice_outbox_oldest_due_age_seconds{tenant=\"acme\"}"
            ),
            Some(0.0)
        );
    }

    #[test]
    fn topics_past_the_cap_share_one_label_value() {
        let m = Metrics::new(TenantLabels::new(None::<&str>), "2.12.1");
        for i in 0..MAX_TOPICS + 10 {
            assert_ne!(&*m.topic(&format!("t{i}")), "", "topic {i}");
        }
        assert_eq!(&*m.topic("one-more"), OTHER_TOPICS);
        assert_eq!(&*m.topic("t1"), "t1");
    }
}
