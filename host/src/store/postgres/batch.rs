//! A claimed batch: the open transaction holding the row locks, and how its outcome is
//! recorded (mark, reschedule, count check, commit).

use std::sync::Arc;

use sqlx::{AssertSqlSafe, Postgres, Transaction};

use super::rows::key_params;
use crate::store::batch::{UNSTORABLE_ERROR, check_count, commit_if_recorded};
use crate::store::rows::Reschedule;
use crate::store::{BatchOutcome, ClaimedBatch, RowFailure, StoreError};
use crate::text::{MAX_LOGGED, MAX_STORED, bounded};

/// A claimed batch: the open transaction holding the row locks.
pub struct PgBatch {
    tx: Transaction<'static, Postgres>,
    mark_sql: Arc<str>,
    reschedule_sql: Arc<str>,
}

impl PgBatch {
    pub(super) fn new(
        tx: Transaction<'static, Postgres>,
        mark_sql: Arc<str>,
        reschedule_sql: Arc<str>,
    ) -> Self {
        Self {
            tx,
            mark_sql,
            reschedule_sql,
        }
    }
}

impl ClaimedBatch for PgBatch {
    async fn complete(mut self, outcome: BatchOutcome) -> Result<(), StoreError> {
        let recorded = self.record(&outcome).await;
        commit_if_recorded(self.tx, recorded).await
    }

    async fn abandon(self) -> Result<(), StoreError> {
        self.tx.rollback().await?;
        Ok(())
    }
}

impl PgBatch {
    /// Marks and reschedules the outcome's rows, checking each count.
    async fn record(&mut self, outcome: &BatchOutcome) -> Result<(), StoreError> {
        if !outcome.sent.is_empty() {
            let ids = key_params(outcome.sent.iter());
            let affected = sqlx::query(AssertSqlSafe(Arc::clone(&self.mark_sql)))
                .bind(&ids)
                .execute(&mut *self.tx)
                .await?
                .rows_affected();
            check_count(ids.len(), affected)?;
        }
        if !outcome.failed.is_empty() {
            let affected = self.reschedule(&outcome.failed).await?;
            check_count(outcome.failed.len(), affected)?;
        }
        Ok(())
    }

    /// Reschedules or dead-letters `failed`, recording each error made safe to store
    /// ([`bounded`]: no NUL or other control characters, at most [`MAX_STORED`] bytes). Runs
    /// inside a savepoint: should the database still refuse the texts (a constraint or trigger
    /// of the application's), the failures are recorded with [`UNSTORABLE_ERROR`] instead, so
    /// the commit of a batch whose messages were already published cannot fail on text.
    async fn reschedule(&mut self, failed: &[RowFailure]) -> Result<u64, StoreError> {
        sqlx::query("SAVEPOINT sluice_reschedule")
            .execute(&mut *self.tx)
            .await?;
        match self.run_reschedule(failed, None).await {
            Ok(affected) => Ok(affected),
            Err(refused) => {
                tracing::warn!(
                    error = %bounded(&refused.to_string(), MAX_LOGGED),
                    rows = failed.len(),
                    "the database refused the failed rows' error texts; recording a fixed text instead"
                );
                sqlx::query("ROLLBACK TO SAVEPOINT sluice_reschedule")
                    .execute(&mut *self.tx)
                    .await?;
                self.run_reschedule(failed, Some(UNSTORABLE_ERROR)).await
            }
        }
    }

    async fn run_reschedule(
        &mut self,
        failed: &[RowFailure],
        fixed: Option<&str>,
    ) -> Result<u64, StoreError> {
        let params = RescheduleParams::new(failed.iter(), fixed);
        Ok(sqlx::query(AssertSqlSafe(Arc::clone(&self.reschedule_sql)))
            .bind(params.ids)
            .bind(params.errors)
            .bind(params.delays)
            .bind(params.dead)
            .bind(params.counted)
            .execute(&mut *self.tx)
            .await?
            .rows_affected())
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
    /// The rows of `failed`, each error made safe to store ([`bounded`]) or replaced with
    /// `fixed`.
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
            params.errors.push(match fixed {
                Some(text) => text.to_owned(),
                None => bounded(&f.error, MAX_STORED).into_owned(),
            });
            params.delays.push(r.delay_ms);
            params.dead.push(r.dead);
            params.counted.push(r.counted);
        }
        params
    }
}
