//! A claimed batch: the open transaction holding the row locks ([`TxBatch`]), and the
//! statements that record its outcome (mark, reschedule).

use std::sync::Arc;

use futures::future::BoxFuture;
use sqlx::{AssertSqlSafe, PgConnection, Postgres};

use super::rows::key_params;
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
                .bind(key_params(ids.iter()))
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
        let params = RescheduleParams::new(failed.iter(), fixed);
        Box::pin(async move {
            Ok(sqlx::query(AssertSqlSafe(Arc::clone(&self.reschedule)))
                .bind(params.ids)
                .bind(params.errors)
                .bind(params.delays)
                .bind(params.dead)
                .bind(params.counted)
                .execute(conn)
                .await?
                .rows_affected())
        })
    }
}

/// A reschedule's parameters: the arrays its `unnest` takes.
pub(super) struct RescheduleParams {
    pub(super) ids: Vec<String>,
    pub(super) errors: Vec<String>,
    pub(super) delays: Vec<i64>,
    pub(super) dead: Vec<bool>,
    pub(super) counted: Vec<bool>,
}

impl RescheduleParams {
    /// The rows of `failed`, each with its [`stored_error`].
    pub(super) fn new<'a>(
        failed: impl Iterator<Item = &'a RowFailure>,
        fixed: Option<&str>,
    ) -> Self {
        let mut params = Self {
            ids: Vec::new(),
            errors: Vec::new(),
            delays: Vec::new(),
            dead: Vec::new(),
            counted: Vec::new(),
        };
        for f in failed {
            let r = Reschedule::from(f.disposition);
            params.ids.push(f.id.to_string());
            params.errors.push(stored_error(f, fixed));
            params.delays.push(r.delay_ms);
            params.dead.push(r.dead);
            params.counted.push(r.counted);
        }
        params
    }
}
