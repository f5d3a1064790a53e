//! `fairness` (issue #23): how long a small tenant's rows wait while a big tenant's backlog
//! drains, with claims in claim order only and with `relay.fair_share`.
//!
//! Tenant `t0` has `--rows` rows waiting (default 1,000,000, `--quick` 100,000: the standard
//! rows, topics `<prefix>order` and `<prefix>customer`) when `sluice run` starts (default
//! settings; the reference plugin's routing through `tests/plugins/contract-v0-1`, which leaves
//! the record timestamp to the producer, see `Settings::send_time_plugin`). From then until that backlog is gone, tenant `small`
//! commits one row every 100 ms (aggregate type `invoice`, topic `<prefix>invoice`), and a
//! consumer of that topic notes each row's producer CreateTime: commit → produce, as in
//! `latency`. Measured twice on a fresh table each: `fair_share = 0` (claim order only), then
//! `fair_share = 10`. On PostgreSQL, or with `--database` on MariaDB or SQLite. Figures: the
//! small tenant's commit → produce p50/p99/max, and the big backlog's drain rate (what taking
//! turns costs it). Target: with `fair_share`, the small tenant's p99 ≤ 500 ms.
//!
//! The backlog is loaded as a migration or an import loads it, without refreshing the
//! planner's statistics afterwards (issue #45: with them refreshed, as the other scenarios'
//! tables are, the first seconds of a real bulk load went unmeasured).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::latency::{Consumer, Sighting, now_us};
use super::startup::{READY_LINE, wait_for_line};
use crate::cli::Settings;
use crate::outbox::{self, BenchTable, Tenants};
use crate::relay::{self, Measured};
use crate::report::Figure;
use crate::stats::summarize;
use crate::{kafka, names};
use sluice_testkit::config::{Plugin, RelayConfig};
use sluice_testkit::{Database, DbTable};

pub(super) const NAME: &str = "fairness";

/// The share of the drain with `relay.fair_share`.
const SHARE: usize = 10;
/// The big tenant (`Tenants::Spread(1)` names every row's tenant `t0`).
const BIG: &str = "t0";
const SMALL: &str = "small";
const SMALL_EVERY: Duration = Duration::from_millis(100);
const TARGET_P99_MS: f64 = 500.0;
/// Longest a drain of the big backlog may take before the scenario gives up.
const DRAIN_LIMIT: Duration = Duration::from_secs(900);
/// Longest wait after the backlog is gone for the consumer to see every small row.
const CATCH_UP: Duration = Duration::from_secs(15);
/// The small tenant's slowest rows printed with when they were committed.
const WORST_SHOWN: usize = 8;

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let plugin = settings.send_time_plugin()?;
    let rows = settings.fairness_rows;
    let mut figures = vec![Figure::new(
        NAME,
        "big tenant's backlog",
        rows as f64,
        "rows",
    )];
    let mut drain_rates = Vec::new();
    for share in [0, SHARE] {
        let label = match share {
            0 => format!("{NAME} (claim order)"),
            n => format!("{NAME} (fair_share = {n})"),
        };
        eprintln!("    {label}: {rows} rows of tenant {BIG}, a row of {SMALL} every 100 ms");
        let table = outbox::create_on(settings, settings.fairness_database, "fairness").await?;
        let measured = measure(settings, &table, &plugin, share, &label).await;
        table.drop_table().await;
        let (drain_rate, mut more) = measured?;
        drain_rates.push(drain_rate);
        figures.append(&mut more);
    }
    if let [alone, fair] = drain_rates[..] {
        figures.push(Figure::new(
            NAME,
            "big tenant's drain, fair_share / claim order",
            fair / alone,
            "×",
        ));
    }
    Ok(figures)
}

/// One drain with `fair_share = share`: the big backlog's rows/s and the figures.
async fn measure(
    settings: &Settings,
    table: &DbTable,
    plugin: &std::path::Path,
    share: usize,
    label: &str,
) -> anyhow::Result<(f64, Vec<Figure>)> {
    let rows = settings.fairness_rows;
    // No ANALYZE after the load (see the module documentation).
    table.insert(rows, Some(Tenants::Spread(1))).await?;
    let prefix = names::topic_prefix("fairness");
    let small_topic = format!("{prefix}invoice");
    let mut topics = kafka::topics(&prefix);
    topics.push(small_topic.clone());
    kafka::create_topics(&settings.kafka, &topics).await?;
    let consumer = Consumer::start(&settings.kafka, vec![small_topic]).await?;
    let config = RelayConfig {
        database_url: table.url.clone(),
        table: table.name.clone(),
        kafka: settings.kafka.clone(),
        relay: std::iter::once(("fair_share".to_owned(), share.to_string()))
            .chain(settings.relay.iter().cloned())
            .collect(),
        default_plugin: Some((Plugin::Wasm(plugin.to_path_buf()), prefix)),
        ..RelayConfig::default()
    };
    if share > 0 {
        migrate_for(&settings.sluice, &config)?;
    }
    // "info": the start-up line says when the relay was ready, so that the worst waits can be
    // placed before or after it.
    let mut relay = relay::start(&settings.sluice, &config, "info")?;
    let started = Instant::now();
    let launched_us = now_us();
    let stop = Arc::new(AtomicBool::new(false));
    let inserter = tokio::spawn(insert_small(table.clone(), Arc::clone(&stop)));
    let ready = wait_for_line(&mut relay, READY_LINE, started).await?;
    let drained = loop {
        relay.sleep(Duration::from_millis(250)).await?;
        // Served by the tenant index, so the probe stays cheap while rows are deleted.
        let left = table
            .try_scalar(&format!(
                "SELECT COUNT(*) FROM (SELECT 1 FROM {{t}} WHERE tenant = '{BIG}' LIMIT 1) AS b"
            ))
            .await?
            .unwrap_or(0);
        if left == 0 {
            break started.elapsed();
        }
        if started.elapsed() > DRAIN_LIMIT {
            stop.store(true, Ordering::Relaxed);
            bail!("{label}: the big backlog did not drain within {DRAIN_LIMIT:?}");
        }
    };
    stop.store(true, Ordering::Relaxed);
    let commits = inserter.await.context("the inserter panicked")??;
    let catch_up_until = Instant::now() + CATCH_UP;
    while consumer.seen() < commits.len() && Instant::now() < catch_up_until {
        relay.sleep(Duration::from_millis(50)).await?;
    }
    relay.stop_measured().await?;
    let sightings = consumer.finish().await?;
    let waits: Vec<f64> = commits
        .iter()
        .filter_map(|(id, committed)| {
            let produced = sightings.by_id.get(id)?.produced_ms?;
            Some((produced * 1000 - committed) as f64 / 1000.0)
        })
        .collect();
    report_worst(label, &commits, &sightings.by_id, launched_us, ready);
    let Some(wait) = summarize(&waits) else {
        bail!(
            "{label}: the consumer saw none of the {} rows of tenant {SMALL}",
            commits.len()
        );
    };
    let drain_rate = rows as f64 / drained.as_secs_f64();
    let p99 = Figure::new(
        label,
        &format!("{SMALL}: commit → produce p99"),
        wait.p99,
        "ms",
    );
    let p99 = match share {
        0 => p99,
        _ => p99.at_most(TARGET_P99_MS),
    };
    Ok((
        drain_rate,
        vec![
            Figure::new(label, "big tenant's drain", drain_rate, "rows/s"),
            Figure::new(
                label,
                &format!("{SMALL}: rows committed"),
                commits.len() as f64,
                "rows",
            ),
            Figure::new(
                label,
                &format!("{SMALL}: rows seen in Kafka"),
                waits.len() as f64,
                "rows",
            ),
            Figure::new(
                label,
                &format!("{SMALL}: commit → produce p50"),
                wait.p50,
                "ms",
            ),
            p99,
            Figure::new(
                label,
                &format!("{SMALL}: commit → produce max"),
                wait.max,
                "ms",
            ),
        ],
    ))
}

/// Prints the small tenant's slowest rows: when each was committed (ms after the relay's
/// launch) and how long it waited, so a tail can be placed (start-up, a stall, or spread).
fn report_worst(
    label: &str,
    commits: &[(i64, i64)],
    seen: &std::collections::HashMap<i64, Sighting>,
    launched_us: i64,
    ready: Duration,
) {
    let mut waits: Vec<(i64, i64)> = commits
        .iter()
        .filter_map(|(id, committed)| {
            let produced = seen.get(id)?.produced_ms?;
            Some((
                (committed - launched_us) / 1000,
                produced - committed / 1000,
            ))
        })
        .collect();
    waits.sort_by_key(|&(_, wait)| std::cmp::Reverse(wait));
    let worst: Vec<String> = waits
        .iter()
        .take(WORST_SHOWN)
        .map(|(at, wait)| format!("{wait} ms (committed at +{at} ms)"))
        .collect();
    eprintln!(
        "    {label}: relay ready after {} ms; slowest small rows: {}",
        ready.as_millis(),
        worst.join(", ")
    );
}

/// `sluice migrate --config` with the relay's config: the tenant index `fair_share` needs, as
/// a user creates it.
fn migrate_for(sluice: &std::path::Path, config: &RelayConfig) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, config.render()).context("cannot write the config")?;
    let out = std::process::Command::new(sluice)
        .arg("migrate")
        .arg("--config")
        .arg(&path)
        .env_remove("SLUICE_DATABASE_URL")
        .output()
        .with_context(|| format!("cannot run {}", sluice.display()))?;
    if !out.status.success() {
        bail!(
            "sluice migrate --config failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Commits one row of the small tenant every [`SMALL_EVERY`] until `stop`; returns (id, µs
/// since the epoch right after COMMIT) of each.
async fn insert_small(table: DbTable, stop: Arc<AtomicBool>) -> anyhow::Result<Vec<(i64, i64)>> {
    let mut ticker = tokio::time::interval(SMALL_EVERY);
    let mut commits = Vec::new();
    let mut n = 0i64;
    while !stop.load(Ordering::Relaxed) {
        ticker.tick().await;
        // One statement, committed on its own (autocommit).
        let payload = match table.database {
            Database::Postgres => format!("jsonb_build_object('n', {n})"),
            Database::Mariadb => format!("JSON_OBJECT('n', {n})"),
            Database::Sqlite => format!("json_object('n', {n})"),
        };
        let id = table
            .try_scalar(&format!(
                "INSERT INTO {{t}} (tenant, aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('{SMALL}', 'invoice', 'inv-{n}', 'Created', {payload})
                 RETURNING id"
            ))
            .await
            .context("insert failed")?
            .context("the insert returned no id")?;
        commits.push((id, now_us()));
        n += 1;
    }
    Ok(commits)
}
