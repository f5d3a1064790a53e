//! `idle`: what a relay on an empty outbox costs. The outbox lives in a database of its own
//! (`sluice_bench_idle`, created if missing), so `pg_stat_database` counts the relay's
//! transactions and nothing else; the counter is read from a connection to the main benchmark
//! database, so the reads do not count either. Each idle poll is one autocommit statement, so
//! transactions/s equals statements/s (target ≤ 1). Also reports the relay's CPU % over the
//! window, from `/proc`.
//!
//! Backends publish these statistics with a delay (PostgreSQL 15 flushes at most once a
//! second), so each counter read comes 1.5 s after the moment it stands for: read at window
//! start + 1.5 s and window end + 1.5 s.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::{PgPool, Postgres};

use crate::cli::Settings;
use crate::names;
use crate::procstat::cpu_seconds;
use crate::relay::{self, Measured};
use crate::report::Figure;
use sluice_testkit::config::{Plugin, RelayConfig};
use sluice_testkit::db;
use sluice_testkit::relay::migrate;

pub(super) const NAME: &str = "idle";

const DATABASE: &str = "sluice_bench_idle";
/// Time the relay gets to start and reach its idle state before the window.
const SETTLE_BEFORE: Duration = Duration::from_secs(5);
/// Delay until a backend's transactions show in `pg_stat_database`.
const STATS_DELAY: Duration = Duration::from_millis(1500);

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let plugin = settings.reference_plugin()?;
    let admin = db::pool(&settings.database_url).await?;
    let main_database: String = sqlx::query_scalar::<Postgres, String>("SELECT current_database()")
        .fetch_one(&admin)
        .await
        .context("cannot ask for the current database")?;
    if main_database == DATABASE {
        bail!("--database-url must not point at {DATABASE}, the idle scenario's own database");
    }
    ensure_database(&admin).await?;
    let url = db::with_database(&settings.database_url, DATABASE)?;
    let table = names::table("idle");
    migrate(&settings.sluice, &url, &table, None).await?;
    let measured = measure(settings, &admin, &url, &table, plugin).await;
    drop_table(&url, &table).await;
    measured
}

async fn measure(
    settings: &Settings,
    admin: &PgPool,
    url: &str,
    table: &str,
    plugin: std::path::PathBuf,
) -> anyhow::Result<Vec<Figure>> {
    let config = RelayConfig {
        database_url: url.to_owned(),
        table: table.to_owned(),
        kafka: settings.kafka.clone(),
        default_plugin: Some((Plugin::Wasm(plugin), names::topic_prefix("idle"))),
        telemetry: settings.telemetry.clone(),
        ..RelayConfig::default()
    };
    let mut relay = relay::start(&settings.sluice, &config, "warn")?;
    relay.sleep(SETTLE_BEFORE).await?;

    let window_start = Instant::now();
    let cpu_start = relay.sample()?;
    relay.sleep(STATS_DELAY).await?;
    let xacts_start = transactions(admin).await?;
    relay
        .sleep(settings.duration.saturating_sub(window_start.elapsed()))
        .await?;
    let cpu_end = relay.sample()?;
    let window = window_start.elapsed();
    relay.sleep(STATS_DELAY).await?;
    let xacts_end = transactions(admin).await?;
    relay.stop_measured().await?;

    let seconds = window.as_secs_f64();
    let cpu = cpu_seconds(cpu_end.cpu_ticks.saturating_sub(cpu_start.cpu_ticks));
    Ok(vec![
        Figure::new(
            NAME,
            "database transactions",
            (xacts_end - xacts_start) as f64 / seconds,
            "tx/s",
        )
        .at_most(1.0),
        Figure::new(NAME, "relay CPU", cpu / seconds * 100.0, "%"),
        Figure::new(NAME, "window", seconds, "s"),
    ])
}

async fn ensure_database(admin: &PgPool) -> anyhow::Result<()> {
    let exists: bool = sqlx::query_scalar::<Postgres, bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)",
    )
    .bind(DATABASE)
    .fetch_one(admin)
    .await
    .context("cannot look for the idle database")?;
    if !exists {
        db::execute(
            admin,
            format!("CREATE DATABASE {}", db::quote_ident(DATABASE)),
        )
        .await?;
    }
    Ok(())
}

/// Committed + rolled-back transactions of the idle database so far.
async fn transactions(admin: &PgPool) -> anyhow::Result<i64> {
    sqlx::query_scalar::<Postgres, i64>(
        "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = $1",
    )
    .bind(DATABASE)
    .fetch_one(admin)
    .await
    .context("cannot read pg_stat_database")
}

/// Drops the table from a fresh connection to the idle database (none is held during the
/// window); failures are only reported.
async fn drop_table(url: &str, table: &str) {
    let result = async {
        let mut conn = db::connection(url).await?;
        db::execute(
            &mut conn,
            format!("DROP TABLE IF EXISTS {}", db::quote_ident(table)),
        )
        .await
    }
    .await;
    if let Err(e) = result {
        eprintln!("warning: cannot drop table {table} in {DATABASE}: {e:#}");
    }
}
