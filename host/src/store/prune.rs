//! Deleting in bounded chunks ([`delete_in_chunks`]): each statement deletes at most [`CHUNK`]
//! rows — a short transaction, little WAL or undo at once, never long locks — with a pause
//! between full chunks that leaves the database to the relay and the application. Used for
//! retention ([`prune`]: in `mark = "published_at"` mode sent rows stay as an audit trail until
//! older than `relay.retention`) and for purging dead rows ([`super::dead::purge`]); dead rows
//! are never pruned, they are not sent. One pruner per table at a time where the database can
//! say so (PostgreSQL: an advisory lock each chunk takes; MySQL: a named lock held on the
//! pruner's connection); two SQLite pruners just take turns.

use std::time::Duration;

use super::layout_sql::LayoutSql;
use super::statement::{Execute, Param, Statement};

/// Rows deleted per statement.
pub(crate) const CHUNK: i64 = 1_000;
/// Pause between two full chunks.
const CHUNK_PAUSE: Duration = Duration::from_millis(50);

/// Runs `statement` (a `DELETE` of at most [`CHUNK`] rows) on `conn` until a chunk comes back
/// short; returns the rows deleted.
pub(crate) async fn delete_in_chunks<DB: Execute>(
    conn: &mut DB::Connection,
    statement: &Statement,
) -> Result<u64, sqlx::Error> {
    let mut total = 0;
    loop {
        let deleted = DB::execute(conn, statement).await?;
        total += deleted;
        if deleted < CHUNK as u64 {
            return Ok(total);
        }
        tokio::time::sleep(CHUNK_PAUSE).await;
    }
}

/// Deletes sent rows older than `retention` on `conn`, chunk by chunk, until none are left or
/// `lock` (a condition the driver adds to each chunk, e.g. a lock it must get) fails. In id
/// order: the primary key walks the rows (for integer ids the oldest, which are the sent
/// ones, first) and stops after a chunk; no index on `published_at` is needed. Returns how
/// many rows it deleted.
pub(crate) async fn prune<DB: Execute>(
    conn: &mut DB::Connection,
    sql: &LayoutSql,
    retention: Duration,
    lock: impl FnOnce(&mut Statement) -> String,
) -> Result<u64, sqlx::Error> {
    let mut statement = Statement::new(sql.dialect);
    let age = statement.param(Param::Int(sql.dialect.ago_param(retention)));
    let filter = format!(
        "{alias}.published_at < {ago} {lock}",
        alias = sql.delete_alias(),
        ago = sql.dialect.ago(&age),
        lock = lock(&mut statement),
    );
    let limit = statement.param(Param::Int(CHUNK));
    let text = sql.delete_first(&filter, &limit, true);
    delete_in_chunks::<DB>(conn, &statement.with_sql(text)).await
}
