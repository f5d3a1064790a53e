//! `metrics-overhead`: what metrics cost a drain. `--pairs` pairs of drains (default settings,
//! WASM reference plugin, the `--rows` backlog), each drain against a broker started for it:
//! one with metrics off, one with `[telemetry] listen` set (metrics recorded, endpoints
//! served, the backlog sampled, librdkafka's statistics on). The order alternates from pair to
//! pair, so whatever drifts during the run (the database's caches, other load) falls on both
//! sides alike.
//!
//! One drain varies by ±7 % from the next in either mode, more than the cost being measured,
//! so the figure is the median of the per-pair ratios on / off, with its quartiles: with
//! enough pairs that median is steady to a point or two where a comparison of two medians is
//! not.

use super::THROUGHPUT;
use super::drain::{self, Drain};
use crate::brokers::Broker;
use crate::cli::Settings;
use crate::outbox;
use crate::report::Figure;
use crate::stats::{percentile, sorted};
use sluice_testkit::DbTable;
use sluice_testkit::OwnTansu;
use sluice_testkit::config::Plugin;

pub(super) const NAME: &str = "metrics-overhead";

/// One drain's figures.
#[derive(Debug, Clone, Copy)]
struct Measured {
    rows_per_second: f64,
    relay_cpu_per_1k: f64,
}

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let plugin = Plugin::Wasm(settings.reference_plugin()?);
    let table = outbox::create(settings, "overhead", None).await?;
    // (pair, metrics on): off first in even pairs, on first in odd ones.
    let order: Vec<(usize, bool)> = (0..settings.pairs)
        .flat_map(|pair| {
            let on_first = pair % 2 == 1;
            [(pair, on_first), (pair, !on_first)]
        })
        .collect();
    let drains = outbox::for_each(table, order, async |table, (pair, on)| {
        let measured = measure(settings, table, &plugin, on).await?;
        eprintln!(
            "    pair {}: metrics {}: {:.0} rows/s, relay CPU {:.2} ms per 1,000 rows",
            pair + 1,
            if on { "on " } else { "off" },
            measured.rows_per_second,
            measured.relay_cpu_per_1k * 1000.0
        );
        Ok((pair, on, measured))
    })
    .await?;

    let side = |on: bool, pick: fn(&Measured) -> f64| -> Vec<f64> {
        drains
            .iter()
            .filter(|(_, o, _)| *o == on)
            .map(|(_, _, m)| pick(m))
            .collect()
    };
    let ratios = |pick: fn(&Measured) -> f64| -> Vec<f64> {
        (0..settings.pairs)
            .filter_map(|pair| {
                let of = |on: bool| {
                    drains
                        .iter()
                        .find(|(p, o, _)| *p == pair && *o == on)
                        .map(|(_, _, m)| pick(m))
                };
                Some(of(true)? / of(false)?)
            })
            .collect()
    };
    let rate = |m: &Measured| m.rows_per_second;
    let cpu = |m: &Measured| m.relay_cpu_per_1k;
    let throughput_ratios = sorted(ratios(rate));
    let slower = throughput_ratios.iter().filter(|r| **r < 1.0).count();
    let quartile = |p: f64| percentile(&throughput_ratios, p).unwrap_or(f64::NAN);
    let median = |values: Vec<f64>| percentile(&sorted(values), 50.0).unwrap_or(f64::NAN);

    let pairs = settings.pairs;
    Ok(vec![
        Figure::new(
            NAME,
            &format!("{THROUGHPUT}, metrics off (median of {pairs})"),
            median(side(false, rate)),
            "rows/s",
        ),
        Figure::new(
            NAME,
            &format!("{THROUGHPUT}, metrics on (median of {pairs})"),
            median(side(true, rate)),
            "rows/s",
        ),
        Figure::new(
            NAME,
            "throughput on / off: median of the pairs",
            quartile(50.0),
            "ratio",
        )
        .at_least(0.97),
        Figure::new(
            NAME,
            "throughput on / off: first quartile",
            quartile(25.0),
            "ratio",
        ),
        Figure::new(
            NAME,
            "throughput on / off: third quartile",
            quartile(75.0),
            "ratio",
        ),
        Figure::new(
            NAME,
            "pairs where metrics on was slower",
            slower as f64,
            "pairs",
        ),
        Figure::new(
            NAME,
            "relay CPU per 1,000 rows, metrics off (median)",
            median(side(false, cpu)),
            "CPU s",
        ),
        Figure::new(
            NAME,
            "relay CPU per 1,000 rows, metrics on (median)",
            median(side(true, cpu)),
            "CPU s",
        ),
        Figure::new(
            NAME,
            "relay CPU on / off: median of the pairs",
            median(ratios(cpu)),
            "ratio",
        ),
    ])
}

async fn measure(
    settings: &Settings,
    table: &DbTable,
    plugin: &Plugin,
    metrics: bool,
) -> anyhow::Result<Measured> {
    let broker = OwnTansu::fresh()?;
    let telemetry = if metrics {
        Some(format!(
            "127.0.0.1:{}",
            sluice_testkit::broker::try_free_port()?
        ))
    } else {
        None
    };
    let settings = Settings {
        kafka: broker.bootstrap(),
        telemetry,
        ..settings.clone()
    };
    let drain = Drain {
        label: NAME,
        stem: "overhead",
        plugin: plugin.clone(),
        rows: settings.rows,
        cache_dir: None,
        extra: None,
        broker: Broker::Kafka,
    };
    let figures = drain::measure(&settings, &drain, table).await?;
    let value = |name: &str| {
        figures
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.value)
            .ok_or_else(|| anyhow::anyhow!("no figure {name:?} was measured"))
    };
    let measured = Measured {
        rows_per_second: value(THROUGHPUT)?,
        relay_cpu_per_1k: value("relay CPU per 1,000 rows")?,
    };
    drop(broker);
    Ok(measured)
}
