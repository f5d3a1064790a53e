//! Retention: in `mark = "published_at"` mode sent rows stay in the table as an audit trail;
//! the pruner deletes those older than `relay.retention`, in bounded chunks so it never holds
//! long locks or builds a huge transaction. Dead rows are never pruned (they are not sent):
//! they stay until replayed or purged with `sluice dead purge`.

use std::time::Duration;

use sqlx::postgres::{PgArguments, PgPool};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Postgres};

use super::schema::Layout;
use crate::store::StoreError;

/// Rows deleted per statement: small enough for a short transaction and little WAL at once.
pub const CHUNK: i64 = 1_000;
/// Pause between two full chunks, leaving the database to the relay in between.
const CHUNK_PAUSE: Duration = Duration::from_millis(50);
/// Advisory-lock key (with the table's oid): one pruner per table at a time, however many
/// relays run.
const PRUNE_LOCK_KEY: i32 = 0x736c_7570; // "slup"

/// Deletes sent rows older than `retention`, chunk by chunk, until none are left or another
/// process is pruning the same table. Returns how many rows it deleted.
pub async fn prune_once(
    pool: &PgPool,
    layout: &Layout,
    retention: Duration,
) -> Result<u64, StoreError> {
    // In id order: the primary key walks the rows (for integer ids the oldest, which are the
    // sent ones, first) and stops after a chunk; no extra index on published_at is needed.
    let table = &layout.table;
    let sql = format!(
        "WITH locked AS (SELECT pg_try_advisory_xact_lock($3, to_regclass($4)::oid::int) AS ok)
         DELETE FROM {table}
          WHERE {id} IN (SELECT {id} FROM {table}, locked
                          WHERE locked.ok
                            AND published_at < now() - $1 * interval '1 millisecond'
                          ORDER BY {id} LIMIT $2)",
        id = layout.id,
    );
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let table_name = table.to_string();
    delete_in_chunks(pool, &sql, |q| {
        q.bind(retention_ms)
            .bind(CHUNK)
            .bind(PRUNE_LOCK_KEY)
            .bind(table_name.clone())
    })
    .await
}

type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

/// Runs the `DELETE` in `sql` (which deletes at most [`CHUNK`] rows; `bind` supplies its
/// parameters) until a chunk comes back short, pausing between chunks; returns the rows
/// deleted.
pub(crate) async fn delete_in_chunks(
    pool: &PgPool,
    sql: &str,
    bind: impl Fn(PgQuery<'_>) -> PgQuery<'_>,
) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let deleted = bind(sqlx::query(AssertSqlSafe(sql)))
            .execute(pool)
            .await?
            .rows_affected();
        total += deleted;
        if deleted < CHUNK as u64 {
            return Ok(total);
        }
        tokio::time::sleep(CHUNK_PAUSE).await;
    }
}
