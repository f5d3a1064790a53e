//! A claimed batch: the open transaction holding the row locks ([`TxBatch`]), and how its
//! outcome is recorded: ids travel as one `text[]` parameter, the failures as arrays.

use std::sync::Arc;

use futures::future::BoxFuture;
use sqlx::{AssertSqlSafe, PgConnection, Postgres};

use crate::model::OutboxId;
use crate::store::RowFailure;
use crate::store::batch::{RecordRows, TxBatch};
use crate::store::rows::{Reschedule, stored_error};

/// A claimed batch: the open transaction holding the row locks.
pub(crate) type PgBatch = TxBatch<Postgres, BatchSql>;

/// The batch's marking and rescheduling statements (see [`super::sql::Statements`]).
pub struct BatchSql {
    pub(super) mark: Arc<str>,
    pub(super) reschedule: Arc<str>,
}

impl RecordRows<Postgres> for BatchSql {
    fn mark<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        ids: &'c [OutboxId],
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        Box::pin(async move {
            Ok(sqlx::query(AssertSqlSafe(Arc::clone(&self.mark)))
                .bind(ids.iter().map(OutboxId::to_string).collect::<Vec<_>>())
                .execute(conn)
                .await?
                .rows_affected())
        })
    }

    fn reschedule<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        failed: &'c [RowFailure],
        fixed: Option<&'static str>,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        // The arrays the statement's `unnest` takes.
        let (mut ids, mut errors, mut delays, mut dead, mut counted) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for f in failed {
            let r = Reschedule::from(f.disposition);
            ids.push(f.id.to_string());
            errors.push(stored_error(f, fixed));
            delays.push(r.delay_ms);
            dead.push(r.dead);
            counted.push(r.counted);
        }
        Box::pin(async move {
            Ok(sqlx::query(AssertSqlSafe(Arc::clone(&self.reschedule)))
                .bind(ids)
                .bind(errors)
                .bind(delays)
                .bind(dead)
                .bind(counted)
                .execute(conn)
                .await?
                .rows_affected())
        })
    }
}
