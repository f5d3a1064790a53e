//! `brokers`: the pipeline measurement for every broker Sluice publishes to (issue #41) — how
//! close a drain to Kafka, NATS JetStream, RabbitMQ or Redis Streams comes to what the
//! database and that broker allow together.
//!
//! The SQL ceiling runs once first (its own step, [`sql_ceiling`]). Then, per broker, one step:
//! - the produce ceiling: the drain's messages (same keys, 256-byte payloads, headers and
//!   destinations, row ids 1…n) from one client of the kind the broker's sink uses, with the
//!   sink's settings, as fast as it takes them, each counted once the broker confirmed it as
//!   the sink waits for (Kafka: [`pipeline::produce_ceiling`] against a fresh Tansu; the
//!   others: [`crate::brokers`]), into destinations made for it and removed after;
//! - the drain: `sluice run` with the WASM reference plugin and `broker = "…"` in
//!   `[plugins.default]` (Kafka: the default, against another fresh Tansu) draining the
//!   `--rows` backlog, then a second backlog of the same rows into the same relay
//!   ([`drain::measure_tenants_twice`]), into fresh destinations (a JetStream stream capturing
//!   the two subjects; a durable exchange with a durable queue per routing key; two streams),
//!   whose message count is checked against the rows and which are removed after.
//!
//! Reported per broker as the pipeline scenario does: the produce ceiling, the pipeline limit
//! `1 / (1/SQL + 1/produce)`, the drain and its ratio to the limit, relay CPU per 1,000 rows
//! and its ratio to what the SQL ceiling's client and the producer cost alone; also the
//! broker's own CPU in both, and the load average before the step (others may share the
//! machine). A last step prints the brokers side by side.

use anyhow::{Context, bail};

use super::drain::{self, Drain};
use super::{THROUGHPUT, pipeline, sql_ceiling};
use crate::brokers::nats::{self, Nats};
use crate::brokers::rabbitmq::RabbitMq;
use crate::brokers::redis::Redis;
use crate::brokers::{self, Broker, Ceiling, destinations};
use crate::cli::Settings;
use crate::machine::load_average;
use crate::names;
use crate::outbox;
use crate::procstat::SystemSample;
use crate::report::{Figure, Report, format_value};
use sluice_testkit::config::Plugin;
use sluice_testkit::{DbTable, OwnTansu};

pub(super) const NAME: &str = "brokers";
/// The side-by-side summary's label.
pub(super) const SUMMARY: &str = "brokers-summary";

const CEILING: &str = "produce ceiling";
const LIMIT: &str = "pipeline limit";
const RATIO: &str = "drain / pipeline limit";
const RELAY_CPU: &str = "relay CPU per 1,000 rows";
const SECOND: &str = "second backlog: drain";
const SECOND_RATIO: &str = "second backlog: drain / pipeline limit";
const SECOND_RELAY_CPU: &str = "second backlog: relay CPU per 1,000 rows";
const PRODUCER_CPU: &str = "producer CPU per 1,000 messages";
const CPU_RATIO: &str = "second backlog: relay CPU / (SQL client + producer CPU)";
const LOAD: &str = "load average (1 min) before";

/// The figures' label for `broker`.
pub(super) fn label(broker: Broker) -> String {
    format!("{NAME}-{broker}")
}

/// Table and destination names of `broker`'s `what` (ceiling or drain).
fn stem(broker: Broker, what: &str) -> String {
    format!("{NAME}_{broker}_{what}")
}

/// One broker's step (see the module documentation); needs the SQL ceiling in `report`.
pub(super) async fn run(
    settings: &Settings,
    broker: Broker,
    report: &Report,
) -> anyhow::Result<Vec<Figure>> {
    let label = label(broker);
    let (Some(sql), Some(sql_cpu)) = (
        report.value(sql_ceiling::NAME, THROUGHPUT),
        report.value(sql_ceiling::NAME, sql_ceiling::CLIENT_CPU),
    ) else {
        bail!("the SQL ceiling was not measured (it runs before the brokers)");
    };
    let plugin = Plugin::Wasm(settings.reference_plugin()?);
    let load = load_average();

    let ceiling = produce_ceiling(settings, broker).await?;
    let limit = 1.0 / (1.0 / sql + 1.0 / ceiling.rate);
    eprintln!(
        "    {broker}: produce ceiling {:.0} msg/s (producer {:.2} ms, {} {:.2} ms CPU per 1,000), limit {limit:.0} rows/s",
        ceiling.rate,
        ceiling.producer_cpu_per_1k * 1000.0,
        brokers::server_label(broker),
        ceiling.broker_cpu_per_1k * 1000.0,
    );

    let table = outbox::create(settings, &stem(broker, "drain"), None).await?;
    let drained = drains(settings, broker, &table, plugin).await;
    table.drop_table().await;
    let (first, second) = drained?;

    let value = |figures: &[Figure], name: &str| -> anyhow::Result<f64> {
        figures
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.value)
            .with_context(|| format!("no figure {name:?} was measured"))
    };
    let drain = value(&first, THROUGHPUT)?;
    let second_drain = value(&second, THROUGHPUT)?;
    let second_cpu = value(&second, RELAY_CPU)?;
    let broker_cpu = format!("{} CPU per 1,000 rows", brokers::server_label(broker));
    let mut figures = vec![
        Figure::new(&label, CEILING, ceiling.rate, "messages/s"),
        Figure::new(&label, PRODUCER_CPU, ceiling.producer_cpu_per_1k, "CPU s"),
        Figure::new(
            &label,
            &format!(
                "{} CPU per 1,000 messages (ceiling)",
                brokers::server_label(broker)
            ),
            ceiling.broker_cpu_per_1k,
            "CPU s",
        ),
        Figure::new(&label, LIMIT, limit, "rows/s"),
        Figure::new(&label, THROUGHPUT, drain, "rows/s"),
        Figure::new(&label, RATIO, drain / limit, "ratio"),
        Figure::new(&label, RELAY_CPU, value(&first, RELAY_CPU)?, "CPU s"),
        Figure::new(&label, &broker_cpu, value(&first, &broker_cpu)?, "CPU s"),
    ];
    for name in [
        "PostgreSQL CPU per 1,000 rows",
        "machine busy during the drain",
        "relay peak RSS",
    ] {
        if let Some(f) = first.iter().find(|f| f.name == name) {
            figures.push(Figure::new(&label, name, f.value, f.unit));
        }
    }
    figures.extend([
        Figure::new(&label, SECOND, second_drain, "rows/s"),
        Figure::new(&label, SECOND_RATIO, second_drain / limit, "ratio"),
        Figure::new(&label, SECOND_RELAY_CPU, second_cpu, "CPU s"),
        Figure::new(
            &label,
            CPU_RATIO,
            second_cpu / (sql_cpu + ceiling.producer_cpu_per_1k),
            "ratio",
        ),
        Figure::new(
            &label,
            &format!("second backlog: {broker_cpu}"),
            value(&second, &broker_cpu)?,
            "CPU s",
        ),
    ]);
    if let Some(load) = load {
        figures.push(Figure::new(&label, LOAD, load, "load"));
    }
    Ok(figures)
}

/// `broker`'s produce ceiling of `settings.rows` messages, into destinations made for it.
async fn produce_ceiling(settings: &Settings, broker: Broker) -> anyhow::Result<Ceiling> {
    let rows = settings.rows;
    let stem = stem(broker, "ceiling");
    let prefix = names::topic_prefix(&stem);
    let keys = destinations(&prefix);
    // The sinks' default message id prefix: the outbox table's name (like the drain's ids).
    let id_prefix = format!("{}:", names::table(&stem));
    match broker {
        Broker::Kafka => {
            let tansu = OwnTansu::fresh()?;
            let before = SystemSample::now();
            let (rate, producer_cpu_per_1k) =
                pipeline::produce_ceiling(&tansu.bootstrap(), rows, &stem).await?;
            let after = SystemSample::now();
            let tansu_cpu = before.server_seconds(&after, brokers::server_command(broker));
            Ok(Ceiling {
                rate,
                producer_cpu_per_1k,
                broker_cpu_per_1k: tansu_cpu / rows as f64 * 1000.0,
            })
        }
        Broker::Nats => {
            let nats = Nats::connect(&settings.nats_url).await?;
            let stream = nats::stream_name(&prefix);
            nats.streams().create_stream(&stream, &keys).await?;
            let ceiling = async {
                let ceiling = nats.produce_ceiling(&keys, rows, &id_prefix).await?;
                expect_stored(broker, nats.streams().message_count(&stream).await?, rows)?;
                Ok(ceiling)
            }
            .await;
            cleaned(ceiling, nats.streams().delete_stream(&stream).await)
        }
        Broker::Rabbitmq => {
            let rabbitmq = RabbitMq::connect(&settings.rabbitmq_url).await?;
            let exchange = format!("{prefix}exchange");
            rabbitmq.declare(&exchange, &keys).await?;
            let ceiling = async {
                let ceiling = rabbitmq
                    .produce_ceiling(&exchange, &keys, rows, &id_prefix)
                    .await?;
                expect_stored(broker, rabbitmq.queued(&keys).await?, rows)?;
                Ok(ceiling)
            }
            .await;
            cleaned(ceiling, rabbitmq.delete(&exchange, &keys).await)
        }
        Broker::Redis => {
            let redis = Redis::connect(&settings.redis_url).await?;
            let ceiling = async {
                let ceiling = redis.produce_ceiling(&keys, rows, &id_prefix).await?;
                expect_stored(broker, redis.streams().entry_count(&keys).await?, rows)?;
                Ok(ceiling)
            }
            .await;
            cleaned(ceiling, redis.streams().delete(&keys).await)
        }
    }
}

/// The two drains' figures (first backlog, second) to `broker`, into destinations made for
/// them; the messages stored are checked against the rows (except Kafka's: Tansu's offsets do
/// not count records).
async fn drains(
    settings: &Settings,
    broker: Broker,
    table: &DbTable,
    plugin: Plugin,
) -> anyhow::Result<(Vec<Figure>, Vec<Figure>)> {
    let label = label(broker);
    let stem = stem(broker, "drain");
    let prefix = names::topic_prefix(&stem);
    let keys = destinations(&prefix);
    let mut drain = Drain {
        label: &label,
        stem: &stem,
        plugin,
        rows: settings.rows,
        cache_dir: None,
        extra: None,
        broker,
    };
    let expected = 2 * settings.rows;
    // No `[kafka]` in a relay publishing elsewhere: it would run an idle Kafka producer.
    let elsewhere = Settings {
        kafka: String::new(),
        ..settings.clone()
    };
    match broker {
        Broker::Kafka => {
            let tansu = OwnTansu::fresh()?;
            let settings = Settings {
                kafka: tansu.bootstrap(),
                ..settings.clone()
            };
            twice(&settings, &drain, table, &prefix).await
        }
        Broker::Nats => {
            let nats = Nats::connect(&settings.nats_url).await?;
            let stream = nats::stream_name(&prefix);
            nats.streams().create_stream(&stream, &keys).await?;
            drain.extra = Some((
                String::new(),
                format!("[nats]\nurl = {}", toml(&settings.nats_url)),
            ));
            let drained = async {
                let drained = twice(&elsewhere, &drain, table, &prefix).await?;
                expect_stored(
                    broker,
                    nats.streams().message_count(&stream).await?,
                    expected,
                )?;
                Ok(drained)
            }
            .await;
            cleaned(drained, nats.streams().delete_stream(&stream).await)
        }
        Broker::Rabbitmq => {
            let rabbitmq = RabbitMq::connect(&settings.rabbitmq_url).await?;
            let exchange = format!("{prefix}exchange");
            rabbitmq.declare(&exchange, &keys).await?;
            drain.extra = Some((
                String::new(),
                format!(
                    "[rabbitmq]\nurl = {}\nexchange = {}",
                    toml(&settings.rabbitmq_url),
                    toml(&exchange)
                ),
            ));
            let drained = async {
                let drained = twice(&elsewhere, &drain, table, &prefix).await?;
                expect_stored(broker, rabbitmq.queued(&keys).await?, expected)?;
                Ok(drained)
            }
            .await;
            cleaned(drained, rabbitmq.delete(&exchange, &keys).await)
        }
        Broker::Redis => {
            let redis = Redis::connect(&settings.redis_url).await?;
            drain.extra = Some((
                String::new(),
                format!("[redis]\nurl = {}", toml(&settings.redis_url)),
            ));
            let drained = async {
                let drained = twice(&elsewhere, &drain, table, &prefix).await?;
                expect_stored(broker, redis.streams().entry_count(&keys).await?, expected)?;
                Ok(drained)
            }
            .await;
            cleaned(drained, redis.streams().delete(&keys).await)
        }
    }
}

/// Both backlogs drained by one relay (the default plugin writing under `prefix`).
async fn twice(
    settings: &Settings,
    drain: &Drain<'_>,
    table: &DbTable,
    prefix: &str,
) -> anyhow::Result<(Vec<Figure>, Vec<Figure>)> {
    drain::measure_tenants_twice(settings, drain, table, prefix, None, Vec::new(), None).await
}

/// `s` as a TOML string.
fn toml(s: &str) -> String {
    sluice_testkit::config::toml_string(s)
}

/// An error unless the broker holds `expected` messages: a drain or ceiling that lost or
/// duplicated messages measured something else.
fn expect_stored(broker: Broker, stored: u64, expected: u64) -> anyhow::Result<()> {
    if stored != expected {
        bail!("{broker} holds {stored} messages, expected {expected}");
    }
    Ok(())
}

/// `result`, or the clean-up's error when only the clean-up failed (a failed measurement's
/// error wins; the clean-up's is printed).
fn cleaned<T>(result: anyhow::Result<T>, cleanup: anyhow::Result<()>) -> anyhow::Result<T> {
    match (result, cleanup) {
        (Ok(value), Ok(())) => Ok(value),
        (Ok(_), Err(e)) => Err(e),
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(cleanup)) => {
            eprintln!("    and the clean-up failed too: {cleanup:#}");
            Err(e)
        }
    }
}

/// The brokers side by side, as a Markdown table on stderr (the figures are in the report
/// already).
pub(super) fn summary(settings: &Settings, report: &Report) -> anyhow::Result<Vec<Figure>> {
    // (figure, column title, scale); `{server}` stands for the broker's server.
    let columns = [
        (CEILING, "produce ceiling (msg/s)", 1.0),
        (LIMIT, "pipeline limit (rows/s)", 1.0),
        (THROUGHPUT, "drain (rows/s)", 1.0),
        (RATIO, "drain / limit", 1.0),
        (RELAY_CPU, "relay CPU / 1,000 rows (ms)", 1000.0),
        (SECOND, "second backlog (rows/s)", 1.0),
        (SECOND_RATIO, "second / limit", 1.0),
        (SECOND_RELAY_CPU, "second: relay CPU / 1,000 (ms)", 1000.0),
        (PRODUCER_CPU, "producer CPU / 1,000 (ms)", 1000.0),
        (
            "{server} CPU per 1,000 messages (ceiling)",
            "broker CPU / 1,000, ceiling (ms)",
            1000.0,
        ),
        (
            "{server} CPU per 1,000 rows",
            "broker CPU / 1,000, drain (ms)",
            1000.0,
        ),
        (
            "PostgreSQL CPU per 1,000 rows",
            "PostgreSQL CPU / 1,000 (ms)",
            1000.0,
        ),
        ("machine busy during the drain", "busy (%)", 1.0),
        (LOAD, "load before", 1.0),
    ];
    let header: Vec<&str> = columns.iter().map(|(_, title, _)| *title).collect();
    eprintln!("\n| broker | {} |", header.join(" | "));
    eprintln!("|---|{}", "---:|".repeat(columns.len()));
    for broker in &settings.brokers {
        let label = label(*broker);
        let server = brokers::server_label(*broker);
        let cells: Vec<String> = columns
            .iter()
            .map(|(name, _, scale)| {
                report
                    .value(&label, &name.replace("{server}", server))
                    .map_or_else(|| "—".to_owned(), |v| format_value(v * scale))
            })
            .collect();
        eprintln!("| {broker} | {} |", cells.join(" | "));
    }
    if let Some(sql) = report.value(sql_ceiling::NAME, THROUGHPUT) {
        eprintln!("SQL ceiling: {} rows/s", format_value(sql));
    }
    Ok(Vec::new())
}
