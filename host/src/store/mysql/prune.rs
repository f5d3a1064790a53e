//! Retention: in `mark = "published_at"` mode the pruner deletes sent rows older than
//! `relay.retention`, in bounded chunks ([`crate::store::chunk`]), one process per table at a time (a named lock,
//! `GET_LOCK`, held on one connection while it prunes). Dead rows are never pruned.

use std::time::Duration;

use sqlx::AssertSqlSafe;
use sqlx::mysql::{MySqlConnection, MySqlPool};

use super::rows::MyQuery;
use crate::store::StoreError;
use crate::store::chunk::{CHUNK, Chunks};
use crate::store::layout_sql::LayoutSql;

/// The server-wide named lock of one table's pruner (names are limited to 64 characters, so
/// the database and table are hashed).
const PRUNE_LOCK: &str = "CONCAT('sluice_prune_', LEFT(SHA2(CONCAT(DATABASE(), '.', ?), 256), 40))";

/// Deletes sent rows older than `retention`, chunk by chunk, until none are left, unless
/// another process is pruning the same table. Returns how many rows it deleted.
pub(super) async fn prune_once(
    pool: &MySqlPool,
    sql: &LayoutSql,
    retention: Duration,
) -> Result<u64, StoreError> {
    let mut conn = pool.acquire().await?;
    let got: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT CAST(GET_LOCK({PRUNE_LOCK}, 0) AS SIGNED)"
    )))
    .bind(&sql.table)
    .fetch_one(&mut *conn)
    .await?;
    if got != Some(1) {
        return Ok(0);
    }
    // In id order: the primary key walks the rows (for integer ids the oldest, which are the
    // sent ones, first) and stops after a chunk.
    let text = format!(
        "DELETE FROM {table}
          WHERE published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
          ORDER BY {id} LIMIT ?",
        table = sql.table,
        id = sql.id,
    );
    let retention_us = i64::try_from(retention.as_micros()).unwrap_or(i64::MAX);
    let pruned = delete_in_chunks(&mut conn, &text, |q| q.bind(retention_us).bind(CHUNK)).await;
    let released = sqlx::query(AssertSqlSafe(format!("DO RELEASE_LOCK({PRUNE_LOCK})")))
        .bind(&sql.table)
        .execute(&mut *conn)
        .await;
    let pruned = pruned?;
    released?;
    Ok(pruned)
}

/// Runs the `DELETE` in `text` (which deletes at most [`CHUNK`] rows; `bind` supplies its
/// parameters) until a chunk comes back short; returns the rows deleted.
pub(super) async fn delete_in_chunks(
    conn: &mut MySqlConnection,
    text: &str,
    bind: impl Fn(MyQuery<'_>) -> MyQuery<'_>,
) -> Result<u64, StoreError> {
    let mut chunks = Chunks::default();
    loop {
        let deleted = bind(sqlx::query(AssertSqlSafe(text)))
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if !chunks.more(deleted).await {
            return Ok(chunks.total());
        }
    }
}
