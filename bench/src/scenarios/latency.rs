//! `latency`: how long a row takes from its COMMIT to Kafka at a steady 1,000 rows/s (or
//! `--rate`), with
//! `sluice run` on default `[relay]` settings, once relying on polling (`latency-poll`) and once
//! woken by the NOTIFY trigger (`latency-notify`, `notify_channel = "sluice_outbox"`). Rows are
//! routed by `tests/plugins/contract-v0-1` (the reference plugin's routing, with no record
//! timestamp of its own: see `Settings::send_time_plugin`).
//!
//! After a 3 s warm-up an inserter commits 10 rows (`--rate` / 100) every 10 ms for
//! `--duration` and notes the
//! wall-clock time right after each COMMIT returns. A consumer assigned to every partition reads
//! each message's `sluice-outbox-id` header and notes (a) the producer's CreateTime (Tansu
//! 0.6 has no LogAppendTime): commit → produce, a lower bound of commit → acknowledged, in ms
//! resolution; and (b) its own receive time: commit → consumer, an upper bound. Both clocks are
//! this machine's. A relay can see a row before the inserter's COMMIT returns to it, so (a)
//! can be slightly negative. Percentiles are over the steady state: rows committed in the
//! first second of load (the relay coming out of its idle back-off) are reported only as
//! that second's maximum.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::{Headers, Message};
use sqlx::{AssertSqlSafe, Connection, Postgres};
use tokio::time::MissedTickBehavior;

use crate::cli::Settings;
use crate::outbox::{self, insert_rows_sql};
use crate::relay::{self, Measured};
use crate::report::Figure;
use crate::stats::{Summary, summarize};
use crate::{kafka, names};
use sluice_testkit::DbTable;
use sluice_testkit::config::{Plugin, RelayConfig, toml_string};
use sluice_testkit::db;

/// The channel `sluice migrate --notify-trigger` notifies and the relay listens on.
const NOTIFY_CHANNEL: &str = "sluice_outbox";
/// Header the host puts on every message.
const OUTBOX_ID_HEADER: &str = "sluice-outbox-id";
const WARM_UP: Duration = Duration::from_secs(3);
/// Rows committed this long after the load began are left out of the steady-state
/// percentiles (see `figures`).
const RAMP: Duration = Duration::from_secs(1);
const INSERT_EVERY: Duration = Duration::from_millis(10);
/// Longest wait after the last insert for the consumer to see every row.
const CATCH_UP: Duration = Duration::from_secs(15);
const TARGET_P50_MS: f64 = 10.0;
const TARGET_P99_MS: f64 = 50.0;

/// How the relay learns about new rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wakeup {
    /// Adaptive polling only.
    Poll,
    /// NOTIFY trigger + `relay.notify_channel`.
    Notify,
}

impl Wakeup {
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Poll => "latency-poll",
            Self::Notify => "latency-notify",
        }
    }

    fn stem(self) -> &'static str {
        match self {
            Self::Poll => "latency_poll",
            Self::Notify => "latency_notify",
        }
    }

    fn channel(self) -> Option<&'static str> {
        match self {
            Self::Poll => None,
            Self::Notify => Some(NOTIFY_CHANNEL),
        }
    }
}

pub(super) async fn run(settings: &Settings, wakeup: Wakeup) -> anyhow::Result<Vec<Figure>> {
    let plugin = settings.send_time_plugin()?;
    let table = outbox::create(settings, wakeup.stem(), wakeup.channel()).await?;
    let measured = measure(settings, wakeup, plugin, &table).await;
    table.drop_table().await;
    measured
}

async fn measure(
    settings: &Settings,
    wakeup: Wakeup,
    plugin: std::path::PathBuf,
    table: &DbTable,
) -> anyhow::Result<Vec<Figure>> {
    let prefix = names::topic_prefix(wakeup.stem());
    let topics = kafka::topics(&prefix);
    kafka::create_topics(&settings.kafka, &topics).await?;
    let consumer = Consumer::start(&settings.kafka, topics).await?;

    let config = RelayConfig {
        database_url: settings.database_url.clone(),
        table: table.name.clone(),
        kafka: settings.kafka.clone(),
        relay: wakeup
            .channel()
            .map(|c| ("notify_channel".to_owned(), toml_string(c)))
            .into_iter()
            .chain(settings.relay.iter().cloned())
            .collect(),
        default_plugin: Some((Plugin::Wasm(plugin), prefix)),
        telemetry: settings.telemetry.clone(),
        ..RelayConfig::default()
    };
    let mut relay = relay::start(&settings.sluice, &config, "warn")?;
    relay.sleep(WARM_UP).await?;
    let inserted = insert_load(
        &settings.database_url,
        table,
        settings.duration,
        rows_per_transaction(settings.rate)?,
    )
    .await?;
    let catch_up_until = Instant::now() + CATCH_UP;
    while consumer.seen() < inserted.commits.len() && Instant::now() < catch_up_until {
        relay.sleep(Duration::from_millis(50)).await?;
    }
    relay.stop_measured().await?;
    let sightings = consumer.finish().await?;
    figures(wakeup.label(), &inserted, &sightings)
}

/// Rows committed by the inserter: (outbox id, µs since the epoch right after COMMIT).
pub(super) struct Inserted {
    pub(super) commits: Vec<(i64, i64)>,
    pub(super) elapsed: Duration,
}

/// Rows per transaction for `rate` rows/s, one transaction every [`INSERT_EVERY`].
pub(super) fn rows_per_transaction(rate: u64) -> anyhow::Result<i64> {
    let per_tick = rate * INSERT_EVERY.as_millis() as u64 / 1000;
    if per_tick == 0 {
        anyhow::bail!("--rate must be at least 100 rows/s (one row every 10 ms)");
    }
    i64::try_from(per_tick).context("--rate is too large")
}

/// Commits `rows_per_transaction` rows every [`INSERT_EVERY`] for `duration` (a late tick
/// delays the following ones rather than bursting).
pub(super) async fn insert_load(
    url: &str,
    table: &DbTable,
    duration: Duration,
    rows_per_transaction: i64,
) -> anyhow::Result<Inserted> {
    let mut conn = db::connection(url).await?;
    let sql = format!(
        "{} RETURNING id",
        insert_rows_sql(&table.quoted(), "generate_series($1::int8, $2::int8) AS g")
    );
    let mut ticker = tokio::time::interval(INSERT_EVERY);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut commits = Vec::new();
    let mut next = 1i64;
    let start = Instant::now();
    while start.elapsed() < duration {
        ticker.tick().await;
        let mut tx = conn.begin().await.context("BEGIN failed")?;
        let ids: Vec<i64> = sqlx::query_scalar::<Postgres, i64>(AssertSqlSafe(sql.as_str()))
            .bind(next)
            .bind(next + rows_per_transaction - 1)
            .fetch_all(&mut *tx)
            .await
            .context("insert failed")?;
        tx.commit().await.context("COMMIT failed")?;
        let committed = now_us();
        commits.extend(ids.into_iter().map(|id| (id, committed)));
        next += rows_per_transaction;
    }
    Ok(Inserted {
        commits,
        elapsed: start.elapsed(),
    })
}

pub(super) fn figures(
    label: &str,
    inserted: &Inserted,
    sightings: &Sightings,
) -> anyhow::Result<Vec<Figure>> {
    let mut produce = Vec::new();
    let mut consume = Vec::new();
    // The first second of load meets a relay that has backed off to its idle poll interval:
    // that is the idle → busy transition, reported on its own; the percentiles are the steady
    // state.
    let load_start = inserted.commits.first().map_or(0, |(_, t)| *t);
    let ramp_end = load_start + RAMP.as_micros() as i64;
    let mut ramp_produce: f64 = 0.0;
    let mut seen = 0usize;
    for (id, committed) in &inserted.commits {
        if let Some(s) = sightings.by_id.get(id) {
            seen += 1;
            let produced = s
                .produced_ms
                .map(|ms| (ms * 1000 - committed) as f64 / 1000.0);
            if *committed < ramp_end {
                ramp_produce = ramp_produce.max(produced.unwrap_or(0.0));
                continue;
            }
            if let Some(ms) = produced {
                produce.push(ms);
            }
            consume.push((s.received_us - committed) as f64 / 1000.0);
        }
    }
    if consume.is_empty() {
        bail!(
            "the consumer saw none of the {} rows inserted ({} messages without a {OUTBOX_ID_HEADER} header)",
            inserted.commits.len(),
            sightings.without_id
        );
    }
    if sightings.without_id > 0 {
        eprintln!(
            "warning: {} messages had no {OUTBOX_ID_HEADER} header",
            sightings.without_id
        );
    }
    let mut out = vec![
        Figure::new(
            label,
            "rows inserted",
            inserted.commits.len() as f64,
            "rows",
        ),
        Figure::new(label, "rows seen in Kafka", seen as f64, "rows"),
        Figure::new(
            label,
            "first 1 s of load: max commit → produce",
            ramp_produce,
            "ms",
        ),
        Figure::new(
            label,
            "insert rate achieved",
            inserted.commits.len() as f64 / inserted.elapsed.as_secs_f64(),
            "rows/s",
        ),
    ];
    match summarize(&produce) {
        Some(s) => out.extend(percentile_figures(label, "commit → produce", s)),
        None => eprintln!("warning: no message carried a producer timestamp"),
    }
    if let Some(s) = summarize(&consume) {
        out.extend(percentile_figures(label, "commit → consumer", s));
    }
    Ok(out)
}

fn percentile_figures(label: &str, what: &str, s: Summary) -> Vec<Figure> {
    vec![
        Figure::new(label, &format!("{what} p50"), s.p50, "ms").at_most(TARGET_P50_MS),
        Figure::new(label, &format!("{what} p95"), s.p95, "ms"),
        Figure::new(label, &format!("{what} p99"), s.p99, "ms").at_most(TARGET_P99_MS),
        Figure::new(label, &format!("{what} max"), s.max, "ms"),
    ]
}

/// Microseconds since the epoch, now.
pub(super) fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The first sighting of one outbox row in Kafka.
pub(super) struct Sighting {
    /// Producer CreateTime, ms since the epoch.
    pub(super) produced_ms: Option<i64>,
    /// When the consumer got it, µs since the epoch.
    pub(super) received_us: i64,
}

#[derive(Default)]
pub(super) struct Sightings {
    pub(super) by_id: HashMap<i64, Sighting>,
    pub(super) without_id: u64,
}

/// A consumer thread reading the scenario's topics until told to stop.
pub(super) struct Consumer {
    stop: Arc<AtomicBool>,
    seen: Arc<AtomicUsize>,
    thread: JoinHandle<Sightings>,
}

impl Consumer {
    pub(super) async fn start(bootstrap: &str, topics: Vec<String>) -> anyhow::Result<Self> {
        let bootstrap = bootstrap.to_owned();
        let group = names::topic_prefix("latency_consumer");
        let consumer = tokio::task::spawn_blocking(move || {
            kafka::low_latency_consumer(&bootstrap, &group, &topics)
        })
        .await
        .context("the consumer set-up panicked")??;
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, seen) = (Arc::clone(&stop), Arc::clone(&seen));
            std::thread::Builder::new()
                .name("latency-consumer".to_owned())
                .spawn(move || consume(&consumer, &stop, &seen))
                .context("cannot start the consumer thread")?
        };
        Ok(Self { stop, seen, thread })
    }

    /// Distinct outbox rows seen so far.
    pub(super) fn seen(&self) -> usize {
        self.seen.load(Ordering::Relaxed)
    }

    pub(super) async fn finish(self) -> anyhow::Result<Sightings> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .context("cannot join the consumer thread")?
            .map_err(|_| anyhow!("the consumer thread panicked"))
    }
}

fn consume(consumer: &BaseConsumer, stop: &AtomicBool, seen: &AtomicUsize) -> Sightings {
    let mut sightings = Sightings::default();
    let mut errors = 0u32;
    while !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                let received_us = now_us();
                let id = message.headers().and_then(|headers| {
                    headers
                        .iter()
                        .find(|h| h.key == OUTBOX_ID_HEADER)
                        .and_then(|h| h.value)
                        .and_then(|v| std::str::from_utf8(v).ok())
                        .and_then(|v| v.parse::<i64>().ok())
                });
                match id {
                    Some(id) => {
                        sightings.by_id.entry(id).or_insert(Sighting {
                            produced_ms: message.timestamp().to_millis(),
                            received_us,
                        });
                        seen.store(sightings.by_id.len(), Ordering::Relaxed);
                    }
                    None => sightings.without_id += 1,
                }
            }
            Some(Err(e)) => {
                errors += 1;
                if errors <= 5 {
                    eprintln!("warning: consumer error: {e}");
                }
            }
            None => {}
        }
    }
    sightings
}
