//! A claimed batch: the open transaction holding the row locks ([`TxBatch`]), and how its
//! outcome is recorded: the statements of [`Statements`], a chunk of rows each.

use futures::future::BoxFuture;
use sqlx::{MySql, MySqlConnection};

use super::sql::Statements;
use crate::model::OutboxId;
use crate::store::RowFailure;
use crate::store::batch::{RecordRows, TxBatch, in_chunks};

/// A claimed batch: the open transaction holding the row locks.
pub(crate) type MyBatch = TxBatch<MySql, Statements>;

impl RecordRows<MySql> for Statements {
    fn mark<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        ids: &'c [OutboxId],
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        Box::pin(in_chunks::<MySql, _>(conn, ids, |chunk| self.mark(chunk)))
    }

    fn reschedule<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        failed: &'c [RowFailure],
        fixed: Option<&'static str>,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        Box::pin(in_chunks::<MySql, _>(conn, failed, move |chunk| {
            self.reschedule(chunk, fixed)
        }))
    }
}
