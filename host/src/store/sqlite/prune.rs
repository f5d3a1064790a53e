//! Retention: in `mark = "published_at"` mode the pruner deletes sent rows older than
//! `relay.retention`, in bounded chunks, each its own short write transaction, so the
//! application's writers wait for at most one chunk. Two pruners of one table just take
//! turns. Dead rows are never pruned.

use std::time::Duration;

use sqlx::SqlitePool;

use crate::store::StoreError;
use crate::store::chunk::{CHUNK, delete_in_chunks};
use crate::store::dialect::Dialect;
use crate::store::layout_sql::LayoutSql;
use crate::store::statement::{Param, Statement};

/// Deletes sent rows older than `retention`, in id order; returns how many rows it deleted.
pub(super) async fn prune(
    pool: &SqlitePool,
    sql: &LayoutSql,
    retention: Duration,
) -> Result<u64, StoreError> {
    let mut statement = Statement::new(Dialect::Sqlite);
    let cutoff = statement.param(Param::Int(Dialect::Sqlite.ago_param(retention)));
    let limit = statement.param(Param::Int(CHUNK));
    let text = format!(
        "DELETE FROM {table}
          WHERE {id} IN (SELECT {id} FROM {table}
                          WHERE published_at < {cutoff} ORDER BY {id} LIMIT {limit})",
        table = sql.table,
        id = sql.id,
    );
    Ok(delete_in_chunks(pool, &statement.with_sql(text)).await?)
}
