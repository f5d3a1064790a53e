//! `drain-native` on MariaDB and SQLite: one `sluice run` (default settings, the built-in
//! router) draining the `--rows` backlog of an outbox in that database, timed from the outside
//! as [`crate::drain_watch`] does on PostgreSQL — from the first row leaving the table to the
//! last — median of [`RUNS`]. Reports rows/s and the relay's CPU seconds per 1,000 rows.
//! (PostgreSQL's drain is `drain-native` itself, with its database's CPU share.)

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::THROUGHPUT;
use crate::cli::Settings;
use crate::outbox::{self, BenchTable};
use crate::procstat::cpu_seconds;
use crate::relay::{self, Measured};
use crate::report::Figure;
use crate::{kafka, names};
use sluice_testkit::config::{Plugin, RelayConfig};
use sluice_testkit::{Database, DbTable};

/// Drains per database; the median is reported.
const RUNS: usize = 3;
/// Width of the id range watched for the first rows to leave (see `drain_watch`).
const HEAD_IDS: i64 = 5_000;
const POLL: Duration = Duration::from_millis(10);
const START_TIMEOUT: Duration = Duration::from_secs(120);
const DRAIN_TIMEOUT_BASE: Duration = Duration::from_secs(60);

pub(super) fn label(database: Database) -> String {
    format!("drain-native-{}", database.label())
}

pub(super) async fn run(settings: &Settings, database: Database) -> anyhow::Result<Vec<Figure>> {
    let table =
        outbox::create_on(settings, database, &format!("drain_{}", database.label())).await?;
    let mut runs = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let measured = measure(settings, &table).await;
        let truncated = table.truncate().await;
        match measured.and_then(|figures| truncated.map(|()| figures)) {
            Ok(figures) => runs.push(figures),
            Err(e) => {
                table.drop_table().await;
                return Err(e);
            }
        }
    }
    table.drop_table().await;
    runs.sort_by(|a, b| a[0].value.total_cmp(&b[0].value));
    let all: Vec<String> = runs.iter().map(|r| format!("{:.0}", r[0].value)).collect();
    let label = label(database);
    eprintln!("    {label} runs, rows/s: {}", all.join(", "));
    let mut median = runs.swap_remove(RUNS / 2);
    median.push(Figure::new(
        &label,
        "slowest run",
        runs[0][0].value,
        "rows/s",
    ));
    median.push(Figure::new(
        &label,
        "fastest run",
        runs[runs.len() - 1][0].value,
        "rows/s",
    ));
    Ok(median)
}

async fn measure(settings: &Settings, table: &DbTable) -> anyhow::Result<Vec<Figure>> {
    let prefix = names::topic_prefix(&format!("drain_{}", table.database.label()));
    kafka::create_topics(&settings.kafka, &kafka::topics(&prefix)).await?;
    table.fill(settings.rows, None).await?;
    let total = table.try_count().await?;
    let first = table.first_id().await?.context("the backlog is empty")?;
    let head_end = first + HEAD_IDS;
    let head_total = table.count_below(head_end).await?;
    let config = RelayConfig {
        database_url: table.url.clone(),
        table: table.name.clone(),
        kafka: settings.kafka.clone(),
        default_plugin: Some((Plugin::Builtin("route-by-aggregate"), prefix)),
        relay: settings.relay.clone(),
        ..RelayConfig::default()
    };
    let mut relay = relay::start(&settings.sluice, &config, "warn")?;

    let deadline = Instant::now() + START_TIMEOUT;
    let (started, head_left) = loop {
        relay.ensure_running()?;
        let head = table.count_below(head_end).await?;
        if head < head_total {
            break (Instant::now(), head);
        }
        if Instant::now() > deadline {
            bail!(
                "the relay removed no row within {START_TIMEOUT:?}; its log ends:\n{}",
                relay.log_tail()
            );
        }
        tokio::time::sleep(POLL).await;
    };
    let start = relay.sample()?;
    let rows = u64::try_from(total - (head_total - head_left)).context("negative row count")?;
    let limit = DRAIN_TIMEOUT_BASE + Duration::from_millis(rows);
    while table.first_id().await?.is_some() {
        relay.ensure_running()?;
        if started.elapsed() > limit {
            bail!(
                "the relay did not drain {rows} rows within {limit:?}; its log ends:\n{}",
                relay.log_tail()
            );
        }
        tokio::time::sleep(POLL).await;
    }
    let elapsed = started.elapsed();
    let stopped = relay.stop_measured().await?;
    let cpu = cpu_seconds(stopped.last.cpu_ticks.saturating_sub(start.cpu_ticks));
    let label = label(table.database);
    Ok(vec![
        Figure::new(
            &label,
            THROUGHPUT,
            rows as f64 / elapsed.as_secs_f64(),
            "rows/s",
        ),
        Figure::new(
            &label,
            "relay CPU per 1,000 rows",
            cpu / rows as f64 * 1000.0,
            "CPU s",
        ),
        Figure::new(&label, "rows in window", rows as f64, "rows"),
        Figure::new(&label, "drain time", elapsed.as_secs_f64(), "s"),
    ])
}
