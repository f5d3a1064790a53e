//! A claimed batch: the open transaction holding the row locks ([`TxBatch`]), and the
//! statements that record its outcome (mark, reschedule), in chunks of at most
//! [`IDS_PER_STATEMENT`] rows.

use std::sync::Arc;

use futures::future::BoxFuture;
use sqlx::{AssertSqlSafe, MySql, MySqlConnection};

use super::rows::{bind_id, bind_null_id, placeholder_count};
use super::sql::Statements;
use crate::model::OutboxId;
use crate::store::RowFailure;
use crate::store::batch::{RecordRows, TxBatch};
use crate::store::rows::{IDS_PER_STATEMENT, Reschedule, stored_error};

/// A claimed batch: the open transaction holding the row locks.
pub(crate) type MyBatch = TxBatch<MySql, Arc<Statements>>;

impl RecordRows<MySql> for Statements {
    fn mark<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        ids: &'c [OutboxId],
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        Box::pin(mark(conn, self, ids))
    }

    fn reschedule<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        failed: &'c [RowFailure],
        fixed: Option<&'static str>,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        Box::pin(reschedule(conn, self, failed, fixed))
    }
}

/// Marks `ids` sent (in statements of at most [`IDS_PER_STATEMENT`] ids); returns the rows
/// affected.
async fn mark(
    conn: &mut MySqlConnection,
    statements: &Statements,
    ids: &[OutboxId],
) -> Result<u64, sqlx::Error> {
    let mut affected = 0;
    let key = &statements.sql.layout.key;
    for chunk in ids.chunks(IDS_PER_STATEMENT) {
        let slots = placeholder_count(chunk.len());
        let mut query = sqlx::query(AssertSqlSafe(statements.mark(slots)));
        for id in chunk {
            query = bind_id(query, id);
        }
        for _ in chunk.len()..slots {
            query = bind_null_id(query, key);
        }
        affected += query.execute(&mut *conn).await?.rows_affected();
    }
    Ok(affected)
}

/// Reschedules or dead-letters `failed`, recording each row's error (bounded) or `fixed`;
/// returns the rows affected.
async fn reschedule(
    conn: &mut MySqlConnection,
    statements: &Statements,
    failed: &[RowFailure],
    fixed: Option<&str>,
) -> Result<u64, sqlx::Error> {
    let mut affected = 0;
    let key = &statements.sql.layout.key;
    for chunk in failed.chunks(IDS_PER_STATEMENT) {
        let slots = placeholder_count(chunk.len());
        let mut query = sqlx::query(AssertSqlSafe(statements.reschedule(slots)));
        for f in chunk {
            let r = Reschedule::from(f.disposition);
            let error = stored_error(f, fixed);
            query = bind_id(query, &f.id)
                .bind(error)
                .bind(r.delay_ms)
                .bind(i64::from(r.dead))
                .bind(i64::from(r.counted));
        }
        for _ in chunk.len()..slots {
            query = bind_null_id(query, key)
                .bind(None::<String>)
                .bind(0_i64)
                .bind(0_i64)
                .bind(0_i64);
        }
        affected += query.execute(&mut *conn).await?.rows_affected();
    }
    Ok(affected)
}
