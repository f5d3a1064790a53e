//! `notify-cost`: what the NOTIFY trigger costs the application's writers. 8 tasks, each on its
//! own connection, insert one row per (autocommit) transaction as fast as they can, first into
//! a table without the trigger, then into one where `sluice migrate --notify-trigger` installed
//! it (channel `sluice_bench_notify`, nobody listening). No relay runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Postgres};

use crate::cli::Settings;
use crate::outbox::{self, insert_rows_sql};
use crate::report::Figure;
use sluice_testkit::DbTable;
use sluice_testkit::db;

pub(super) const NAME: &str = "notify-cost";

const CHANNEL: &str = "sluice_bench_notify";
const WRITERS: usize = 8;

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let without = insert_rate(settings, None).await?;
    let with = insert_rate(settings, Some(CHANNEL)).await?;
    Ok(vec![
        Figure::new(NAME, "writers", WRITERS as f64, "connections"),
        Figure::new(NAME, "without trigger", without, "inserts/s"),
        Figure::new(NAME, "with NOTIFY trigger", with, "inserts/s"),
        Figure::new(NAME, "with / without", with / without, "×"),
    ])
}

/// Single-row insert transactions per second into a fresh table (with the trigger on
/// `channel`, if given).
async fn insert_rate(settings: &Settings, channel: Option<&str>) -> anyhow::Result<f64> {
    let stem = if channel.is_some() {
        "notify_cost_trigger"
    } else {
        "notify_cost_plain"
    };
    let table = outbox::create(settings, stem, channel).await?;
    let measured = hammer(settings, &table).await;
    table.drop_table().await;
    let (inserts, elapsed) = measured?;
    Ok(inserts as f64 / elapsed.as_secs_f64())
}

/// Runs the writers for `notify_cost_duration`; returns inserts and the time taken.
async fn hammer(settings: &Settings, table: &DbTable) -> anyhow::Result<(u64, Duration)> {
    let sql: Arc<str> = insert_rows_sql(&table.quoted(), "(SELECT $1::int8 AS g) AS one").into();
    let mut connections = Vec::with_capacity(WRITERS);
    for _ in 0..WRITERS {
        connections.push(db::connection(&settings.database_url).await?);
    }
    let start = Instant::now();
    let until = start + settings.notify_cost_duration;
    let writers: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(i, conn)| tokio::spawn(writer(conn, Arc::clone(&sql), i as i64, until)))
        .collect();
    let mut inserts = 0;
    for writer in writers {
        inserts += writer.await.context("a notify-cost writer panicked")??;
    }
    Ok((inserts, start.elapsed()))
}

/// Inserts rows `first`, `first + WRITERS`, … until `until`; returns how many.
async fn writer(
    mut conn: PgConnection,
    sql: Arc<str>,
    first: i64,
    until: Instant,
) -> anyhow::Result<u64> {
    let mut g = first;
    let mut inserts = 0;
    while Instant::now() < until {
        sqlx::query::<Postgres>(AssertSqlSafe(Arc::clone(&sql)))
            .bind(g)
            .execute(&mut conn)
            .await
            .context("insert failed")?;
        g += WRITERS as i64;
        inserts += 1;
    }
    Ok(inserts)
}
