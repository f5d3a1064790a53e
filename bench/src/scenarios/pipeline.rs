//! `pipeline`: how close a drain comes to what the database and the broker allow together.
//!
//! Each of [`RUNS`] runs measures, one after the other:
//! - the SQL ceiling: [`sql_ceiling`] on PostgreSQL (claim + decode + `DELETE`, 2 connections,
//!   no broker);
//! - the pgbench ceiling: [`pgbench`] claiming and deleting the same backlog (2 clients), a
//!   ceiling no Sluice code takes part in;
//! - the produce ceiling: the drain's messages (same keys, 256-byte payloads, headers and
//!   topics) produced by one librdkafka producer with `acks=all` and idempotence, all enqueued
//!   at once, delivery reports counted by a callback until all are in (as confluent-kafka's
//!   producer does it) — against a broker started for this measurement;
//! - the drain: `sluice run` with default settings and the WASM reference plugin on the same
//!   backlog, against another fresh broker; then a second backlog of the same rows, inserted
//!   after the first has drained, drained by the same relay: its connections open and its
//!   instances live, as the ceilings' are when they start timing
//!   ([`drain::measure_twice`]).
//!
//! The pipeline limit is `1 / (1/sql + 1/produce)`: the rate at which one machine could move
//! rows if every row cost the database's time plus the broker's time and nothing else. The
//! drain is reported as a ratio of it, per run and as the median; likewise against the limit
//! with the pgbench ceiling in place of the SQL ceiling (#23's target: at least 0.80).
//!
//! Next to the relay's CPU per 1,000 rows it reports what the two ceilings cost this process:
//! the SQL ceiling's client side (Sluice's driver: statements, TLS, decoding) per 1,000 rows
//! and the producer's per 1,000 messages. Their sum is what a relay spends on moving rows
//! before any transform, grouping or bookkeeping of its own; the relay's CPU is reported as a
//! ratio of that sum too, for both backlogs. #23's target (at most 1.25) is on the second:
//! the first also pays the relay's start — TLS set-up of each pooled connection, which the
//! ceilings' windows leave out — once per process, not per row.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};

use super::drain::Drain;
use super::{THROUGHPUT, drain, pgbench, sql_ceiling};
use crate::brokers::Broker;
use crate::cli::Settings;
use crate::outbox::{self, BenchTable};
use crate::report::{Figure, Target};
use crate::stats::spread;
use crate::{kafka, names, procstat};
use sluice_testkit::Database;
use sluice_testkit::DbTable;
use sluice_testkit::OwnTansu;
use sluice_testkit::config::Plugin;

pub(super) const NAME: &str = "pipeline";
/// Runs; medians are reported.
const RUNS: usize = 3;
/// Aggregate ids of the standard rows (`bench/src/outbox.rs`).
const AGGREGATES: u64 = 1_000;

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let plugin = Plugin::Wasm(settings.reference_plugin()?);
    let table = outbox::create(settings, "pipeline", None).await?;
    let result = runs(settings, &table, &plugin).await;
    table.drop_table().await;
    let runs = result?;

    let mut figures = Vec::new();
    let column = |pick: fn(&Run) -> f64| -> Vec<f64> { runs.iter().map(pick).collect() };
    let series: [(&str, &'static str, Vec<f64>, Option<Target>); 16] = [
        ("SQL ceiling", "rows/s", column(|r| r.sql), None),
        ("pgbench ceiling", "rows/s", column(|r| r.pgbench), None),
        ("produce ceiling", "messages/s", column(|r| r.produce), None),
        ("pipeline limit", "rows/s", column(|r| r.limit(r.sql)), None),
        (
            "pipeline limit (pgbench)",
            "rows/s",
            column(|r| r.limit(r.pgbench)),
            None,
        ),
        (THROUGHPUT, "rows/s", column(|r| r.drain), None),
        (
            "drain / pipeline limit",
            "ratio",
            column(|r| r.ratio(r.sql)),
            Some(Target::AtLeast(0.80)),
        ),
        (
            "drain / pipeline limit (pgbench)",
            "ratio",
            column(|r| r.ratio(r.pgbench)),
            Some(Target::AtLeast(0.80)),
        ),
        (
            "relay CPU per 1,000 rows",
            "CPU s",
            column(|r| r.relay_cpu_per_1k),
            None,
        ),
        (
            "second backlog: drain",
            "rows/s",
            column(|r| r.warm_drain),
            None,
        ),
        (
            "second backlog: relay CPU per 1,000 rows",
            "CPU s",
            column(|r| r.warm_relay_cpu_per_1k),
            None,
        ),
        (
            "machine busy during the drain",
            "%",
            column(|r| r.busy),
            None,
        ),
        (
            "SQL ceiling's client CPU per 1,000 rows",
            "CPU s",
            column(|r| r.sql_cpu_per_1k),
            None,
        ),
        (
            "produce ceiling's producer CPU per 1,000 messages",
            "CPU s",
            column(|r| r.produce_cpu_per_1k),
            None,
        ),
        (
            "relay CPU / (SQL client + producer CPU)",
            "ratio",
            column(|r| r.cpu_ratio(r.relay_cpu_per_1k)),
            None,
        ),
        (
            "second backlog: relay CPU / (SQL client + producer CPU)",
            "ratio",
            column(|r| r.cpu_ratio(r.warm_relay_cpu_per_1k)),
            Some(Target::AtMost(1.25)),
        ),
    ];
    for (name, unit, values, target) in series {
        let list: Vec<String> = values
            .iter()
            .map(|v| crate::report::format_value(*v))
            .collect();
        eprintln!("    {name}: runs {}", list.join(" / "));
        let (low, mid, high) = spread(&values);
        let mut figure = Figure::new(NAME, &format!("{name} (median of {RUNS})"), mid, unit);
        figure.target = target;
        figures.push(figure);
        figures.push(Figure::new(NAME, &format!("{name}: lowest"), low, unit));
        figures.push(Figure::new(NAME, &format!("{name}: highest"), high, unit));
    }
    Ok(figures)
}

/// One run's measurements.
struct Run {
    sql: f64,
    sql_cpu_per_1k: f64,
    pgbench: f64,
    produce: f64,
    produce_cpu_per_1k: f64,
    drain: f64,
    relay_cpu_per_1k: f64,
    busy: f64,
    /// The second backlog, drained by the same relay (see [`drain::measure_twice`]).
    warm_drain: f64,
    warm_relay_cpu_per_1k: f64,
}

impl Run {
    /// The pipeline limit with `database` (one of the database ceilings) and the produce ceiling.
    fn limit(&self, database: f64) -> f64 {
        1.0 / (1.0 / database + 1.0 / self.produce)
    }

    fn ratio(&self, database: f64) -> f64 {
        self.drain / self.limit(database)
    }

    /// `relay_cpu_per_1k` as a multiple of its driver's and librdkafka's CPU on their own.
    fn cpu_ratio(&self, relay_cpu_per_1k: f64) -> f64 {
        relay_cpu_per_1k / (self.sql_cpu_per_1k + self.produce_cpu_per_1k)
    }
}

async fn runs(settings: &Settings, table: &DbTable, plugin: &Plugin) -> anyhow::Result<Vec<Run>> {
    let mut runs = Vec::with_capacity(RUNS);
    for n in 1..=RUNS {
        let ceiling = sql_ceiling::run(settings, Database::Postgres).await?;
        let sql = figure(&ceiling, THROUGHPUT)?;
        let sql_cpu_per_1k = figure(&ceiling, sql_ceiling::CLIENT_CPU)?;
        let pgbench = pgbench::ceiling(table, settings.rows).await?;
        let (produce, produce_cpu_per_1k) = {
            let broker = OwnTansu::fresh()?;
            produce_ceiling(&broker.bootstrap(), settings.rows, "pipeline_produce").await?
        };
        let drained = {
            let broker = OwnTansu::fresh()?;
            let settings = Settings {
                kafka: broker.bootstrap(),
                relay: Vec::new(),
                telemetry: None,
                ..settings.clone()
            };
            let drain = Drain {
                label: NAME,
                stem: "pipeline",
                plugin: plugin.clone(),
                rows: settings.rows,
                cache_dir: None,
                extra: None,
                broker: Broker::Kafka,
            };
            let figures = drain::measure_twice(&settings, &drain, table).await;
            table.truncate().await?;
            figures?
        };
        let (drained, warm) = drained;
        let run = Run {
            sql,
            sql_cpu_per_1k,
            pgbench,
            produce,
            produce_cpu_per_1k,
            drain: figure(&drained, THROUGHPUT)?,
            relay_cpu_per_1k: figure(&drained, "relay CPU per 1,000 rows")?,
            busy: figure(&drained, "machine busy during the drain")?,
            warm_drain: figure(&warm, THROUGHPUT)?,
            warm_relay_cpu_per_1k: figure(&warm, "relay CPU per 1,000 rows")?,
        };
        eprintln!(
            "    run {run_no}: SQL {sql:.0} rows/s, pgbench {pgbench:.0} rows/s, produce {produce:.0} msg/s, limit {limit:.0} (pgbench: {pg_limit:.0}), drain {drain:.0} rows/s: {ratio:.2} ({pg_ratio:.2}); second backlog {warm:.0} rows/s, relay CPU {cpu_ratio:.2}× the ceilings",
            run_no = n,
            sql = run.sql,
            pgbench = run.pgbench,
            produce = run.produce,
            limit = run.limit(run.sql),
            pg_limit = run.limit(run.pgbench),
            drain = run.drain,
            ratio = run.ratio(run.sql),
            pg_ratio = run.ratio(run.pgbench),
            warm = run.warm_drain,
            cpu_ratio = run.cpu_ratio(run.warm_relay_cpu_per_1k),
        );
        runs.push(run);
    }
    Ok(runs)
}

/// The value of the figure called `name`.
fn figure(figures: &[Figure], name: &str) -> anyhow::Result<f64> {
    figures
        .iter()
        .find(|f| f.name == name)
        .map(|f| f.value)
        .with_context(|| format!("no figure {name:?} was measured"))
}

/// Produces `rows` messages shaped like the drain's to a fresh `bootstrap` as fast as one
/// producer can: every message enqueued without waiting (a full local queue is waited out),
/// delivery reports counted by a callback on librdkafka's poll thread (as confluent-kafka's
/// `on_delivery` does), until every message is reported. Returns acknowledged messages per
/// second and this process's CPU seconds per 1,000 messages (the producer's side alone:
/// building the records, librdkafka, the delivery reports).
pub(super) async fn produce_ceiling(
    bootstrap: &str,
    rows: u64,
    stem: &str,
) -> anyhow::Result<(f64, f64)> {
    let prefix = names::topic_prefix(stem);
    let topics = kafka::topics(&prefix);
    kafka::create_topics(bootstrap, &topics).await?;
    // librdkafka's defaults (as confluent-kafka has them), with the guarantees Sluice needs.
    let producer: ThreadedProducer<Counted> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .create_with_context(Counted::default())
        .context("cannot create the produce-ceiling producer")?;
    let messages: Vec<Shaped> = (1..=rows).map(Shaped::new).collect();
    let cpu_before = procstat::sample(std::process::id())?.cpu_ticks;
    let start = Instant::now();
    for m in &messages {
        let mut record = m.record(&topics);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((e, _)) => bail!("cannot enqueue a message: {e}"),
            }
        }
    }
    let counted = producer.context();
    while counted.reported.load(Ordering::Relaxed) < rows {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = start.elapsed();
    let cpu = procstat::cpu_seconds(procstat::sample(std::process::id())?.cpu_ticks - cpu_before);
    let failed = counted.failures();
    if !failed.is_empty() {
        bail!("the produce ceiling's messages failed: {failed:?}");
    }
    Ok((
        rows as f64 / elapsed.as_secs_f64(),
        cpu / rows as f64 * 1000.0,
    ))
}

/// Counts delivery reports, and failures by error.
#[derive(Default)]
struct Counted {
    reported: AtomicU64,
    failed: Mutex<HashMap<String, u64>>,
}

impl Counted {
    fn failures(&self) -> HashMap<String, u64> {
        self.failed
            .lock()
            .map(|f| f.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }
}

impl ClientContext for Counted {}

impl ProducerContext for Counted {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
            *failed.entry(e.to_string()).or_default() += 1;
        }
        self.reported.fetch_add(1, Ordering::Relaxed);
    }
}

/// A message as `sluice run` produces it for standard row `g` with the reference plugin.
struct Shaped {
    /// Index into the two topics: `order` for even `g`, `customer` for odd.
    topic: usize,
    key: String,
    payload: String,
    id: String,
}

impl Shaped {
    fn new(g: u64) -> Self {
        Self {
            topic: usize::from(!g.is_multiple_of(2)),
            key: format!("agg-{}", g % AGGREGATES),
            // jsonb's text form of the row's payload: 256 bytes.
            payload: format!(r#"{{"n": {g}, "pad": "{}"}}"#, "x".repeat(236)),
            id: g.to_string(),
        }
    }

    fn record<'a>(&'a self, topics: &'a [String]) -> BaseRecord<'a, String, String> {
        let headers = OwnedHeaders::new_with_capacity(4)
            .insert(Header {
                key: "id",
                value: Some(self.id.as_bytes()),
            })
            .insert(Header {
                key: "event-type",
                value: Some("Created".as_bytes()),
            })
            .insert(Header {
                key: "sluice-tenant",
                value: Some("default".as_bytes()),
            })
            .insert(Header {
                key: "sluice-outbox-id",
                value: Some(self.id.as_bytes()),
            });
        BaseRecord::to(&topics[self.topic])
            .key(&self.key)
            .payload(&self.payload)
            .headers(headers)
    }
}
