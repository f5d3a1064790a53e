//! `sql-ceiling`: the database's own limit for Sluice's SQL. `--workers` tasks, each on its own
//! connection, loop BEGIN → claim 500 rows (`FOR UPDATE SKIP LOCKED`) → decode them → `DELETE`
//! → COMMIT until a claim comes back empty. No Kafka, no plugin: no relay on this database can
//! drain faster.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection, Postgres};

use super::rate_figures;
use crate::claim::{BATCH_SIZE, ClaimedRow, claim_sql};
use crate::cli::Settings;
use crate::db;
use crate::outbox::OutboxTable;
use crate::report::Figure;

pub const NAME: &str = "sql-ceiling";

pub async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let pool = db::pool(&settings.database_url).await?;
    let table = OutboxTable::create(settings, &pool, "sql_ceiling", None).await?;
    let measured = measure(settings, &table).await;
    table.drop_table().await;
    let (rows, elapsed) = measured?;
    let mut figures = rate_figures(NAME, rows, elapsed);
    figures.push(Figure::new(
        NAME,
        "connections",
        settings.workers as f64,
        "connections",
    ));
    Ok(figures)
}

/// Fills the table, then drains it with the workers; returns rows deleted and the time taken.
async fn measure(settings: &Settings, table: &OutboxTable) -> anyhow::Result<(u64, Duration)> {
    table.fill(settings.rows, None).await?;
    let claim: Arc<str> = claim_sql(table.quoted()).into();
    let delete: Arc<str> = format!("DELETE FROM {} WHERE id = ANY($1)", table.quoted()).into();
    let mut connections = Vec::with_capacity(settings.workers);
    for _ in 0..settings.workers {
        connections.push(db::connection(&settings.database_url).await?);
    }
    let start = Instant::now();
    let workers: Vec<_> = connections
        .into_iter()
        .map(|conn| tokio::spawn(worker(conn, Arc::clone(&claim), Arc::clone(&delete))))
        .collect();
    let mut rows = 0;
    for worker in workers {
        rows += worker.await.context("an sql-ceiling worker panicked")??;
    }
    let elapsed = start.elapsed();
    if rows != settings.rows {
        bail!("deleted {rows} rows, expected {}", settings.rows);
    }
    Ok((rows, elapsed))
}

/// One connection's loop; returns the rows it deleted.
async fn worker(mut conn: PgConnection, claim: Arc<str>, delete: Arc<str>) -> anyhow::Result<u64> {
    let mut deleted = 0u64;
    let mut decoded_bytes = 0usize;
    loop {
        let mut tx = conn.begin().await.context("BEGIN failed")?;
        let rows = sqlx::query::<Postgres>(AssertSqlSafe(Arc::clone(&claim)))
            .bind(BATCH_SIZE)
            .fetch_all(&mut *tx)
            .await
            .context("claim failed")?;
        if rows.is_empty() {
            tx.commit().await.context("COMMIT failed")?;
            std::hint::black_box(decoded_bytes);
            return Ok(deleted);
        }
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let row = ClaimedRow::decode(row)?;
            decoded_bytes += row.decoded_bytes();
            ids.push(row.id);
        }
        sqlx::query::<Postgres>(AssertSqlSafe(Arc::clone(&delete)))
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .context("DELETE failed")?;
        tx.commit().await.context("COMMIT failed")?;
        deleted += ids.len() as u64;
    }
}
