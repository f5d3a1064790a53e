//! Retention: in `mark = "published_at"` mode sent rows stay in the table as an audit trail;
//! the pruner deletes those older than `relay.retention`, in bounded chunks
//! ([`crate::store::chunk`]) so it never holds long locks or builds a huge transaction, one
//! process per table at a time (an advisory lock taken by each chunk). Dead rows are never
//! pruned (they are not sent): they stay until replayed or purged with `sluice dead purge`.

use std::time::Duration;

use sqlx::PgPool;

use crate::store::StoreError;
use crate::store::chunk::{CHUNK, delete_in_chunks};
use crate::store::dialect::Dialect;
use crate::store::layout_sql::LayoutSql;
use crate::store::statement::{Param, Statement};

/// Advisory-lock key (with the table's oid): one pruner per table at a time, however many
/// relays run.
const PRUNE_LOCK_KEY: i32 = 0x736c_7570; // "slup"

/// Deletes sent rows older than `retention`, chunk by chunk, until none are left or another
/// process is pruning the same table. Returns how many rows it deleted.
pub(super) async fn prune_once(
    pool: &PgPool,
    sql: &LayoutSql,
    retention: Duration,
) -> Result<u64, StoreError> {
    let mut statement = Statement::new(Dialect::Postgres);
    let age = statement.param(Param::Int(Dialect::Postgres.ago_param(retention)));
    let limit = statement.param(Param::Int(CHUNK));
    let key = statement.param(Param::Int(PRUNE_LOCK_KEY.into()));
    let table_name = statement.param(Param::Text(sql.table.clone()));
    // In id order: the primary key walks the rows (for integer ids the oldest, which are the
    // sent ones, first) and stops after a chunk; no extra index on published_at is needed.
    let text = format!(
        "WITH locked AS (SELECT pg_try_advisory_xact_lock({key}::int,
                                                          to_regclass({table_name})::oid::int) AS ok)
         DELETE FROM {table}
          WHERE {id} IN (SELECT {id} FROM {table}, locked
                          WHERE locked.ok AND published_at < {ago}
                          ORDER BY {id} LIMIT {limit})",
        table = sql.table,
        id = sql.id,
        ago = Dialect::Postgres.ago(&age),
    );
    Ok(delete_in_chunks(pool, &statement.with_sql(text)).await?)
}
