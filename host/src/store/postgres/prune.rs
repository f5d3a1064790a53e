//! Retention: in `mark = "published_at"` mode sent rows stay in the table as an audit trail;
//! the pruner deletes those older than `relay.retention`, in bounded chunks
//! ([`crate::store::chunk`]) so it never holds long locks or builds a huge transaction. Dead
//! rows are never pruned (they are not sent): they stay until replayed or purged with
//! `sluice dead purge`.

use std::time::Duration;

use sqlx::postgres::{PgArguments, PgPool};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Postgres};

use crate::store::StoreError;
use crate::store::chunk::{CHUNK, Chunks, millis};
use crate::store::layout_sql::LayoutSql;

/// Advisory-lock key (with the table's oid): one pruner per table at a time, however many
/// relays run.
const PRUNE_LOCK_KEY: i32 = 0x736c_7570; // "slup"

/// Deletes sent rows older than `retention`, chunk by chunk, until none are left or another
/// process is pruning the same table. Returns how many rows it deleted.
pub async fn prune_once(
    pool: &PgPool,
    sql: &LayoutSql,
    retention: Duration,
) -> Result<u64, StoreError> {
    // In id order: the primary key walks the rows (for integer ids the oldest, which are the
    // sent ones, first) and stops after a chunk; no extra index on published_at is needed.
    let table = &sql.table;
    let text = format!(
        "WITH locked AS (SELECT pg_try_advisory_xact_lock($3, to_regclass($4)::oid::int) AS ok)
         DELETE FROM {table}
          WHERE {id} IN (SELECT {id} FROM {table}, locked
                          WHERE locked.ok
                            AND published_at < now() - $1 * interval '1 millisecond'
                          ORDER BY {id} LIMIT $2)",
        id = sql.id,
    );
    let retention_ms = millis(retention);
    let table_name = table.to_string();
    delete_in_chunks(pool, &text, |q| {
        q.bind(retention_ms)
            .bind(CHUNK)
            .bind(PRUNE_LOCK_KEY)
            .bind(table_name.clone())
    })
    .await
}

type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

/// Runs the `DELETE` in `text` (which deletes at most [`CHUNK`] rows; `bind` supplies its
/// parameters) until a chunk comes back short; returns the rows deleted.
pub(crate) async fn delete_in_chunks(
    pool: &PgPool,
    text: &str,
    bind: impl Fn(PgQuery<'_>) -> PgQuery<'_>,
) -> Result<u64, StoreError> {
    let mut chunks = Chunks::default();
    loop {
        let deleted = bind(sqlx::query(AssertSqlSafe(text)))
            .execute(pool)
            .await?
            .rows_affected();
        if !chunks.more(deleted).await {
            return Ok(chunks.total());
        }
    }
}
