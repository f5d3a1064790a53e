//! Retention: in `mark = "published_at"` mode sent rows stay in the table as an audit trail;
//! the pruner deletes those older than `relay.retention`, in bounded chunks
//! ([`super::chunk`]) so it never holds long locks or builds a huge transaction. Dead rows are
//! never pruned (they are not sent): they stay until replayed or purged with `sluice dead
//! purge`. One pruner per table at a time where the database can say so (PostgreSQL: an
//! advisory lock each chunk takes; MySQL: a named lock held on the pruner's connection);
//! two SQLite pruners just take turns.

use std::time::Duration;

use super::chunk::{CHUNK, delete_in_chunks};
use super::layout_sql::LayoutSql;
use super::statement::{Execute, Param, Statement};

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
