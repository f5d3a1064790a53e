//! A claimed batch: the open transaction holding the row locks, and how its outcome is
//! recorded (mark, reschedule, count check, commit).

use std::sync::Arc;
use std::time::Duration;

use sqlx::{AssertSqlSafe, Postgres, Transaction};

use super::rows::key_params;
use crate::store::{
    BatchOutcome, ClaimedBatch, Disposition, RowFailure, StoreError, commit_if_recorded,
};
use crate::text::{MAX_LOGGED, MAX_STORED, bounded};

/// Recorded as `last_error` when the database refuses a failure's own text (a constraint or
/// trigger of the application's): plain ASCII, so recording the failure cannot fail on text.
const UNSTORABLE_ERROR: &str =
    "the error text could not be stored (the database refused it); see the relay's log";

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
        let errors: Vec<String> = failed
            .iter()
            .map(|f| bounded(&f.error, MAX_STORED).into_owned())
            .collect();
        sqlx::query("SAVEPOINT sluice_reschedule")
            .execute(&mut *self.tx)
            .await?;
        match self.run_reschedule(failed, &errors).await {
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
                let fixed = vec![UNSTORABLE_ERROR.to_owned(); failed.len()];
                self.run_reschedule(failed, &fixed).await
            }
        }
    }

    async fn run_reschedule(
        &mut self,
        failed: &[RowFailure],
        errors: &[String],
    ) -> Result<u64, StoreError> {
        let ids = key_params(failed.iter().map(|f| &f.id));
        let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let mut delays = Vec::with_capacity(ids.len());
        let mut dead = Vec::with_capacity(ids.len());
        let mut counted = Vec::with_capacity(ids.len());
        for f in failed {
            let (delay, is_dead, counts) = match f.disposition {
                Disposition::Retry(d) => (millis(d), false, true),
                Disposition::Dead => (0, true, true),
                Disposition::Wait(d) => (millis(d), false, false),
            };
            delays.push(delay);
            dead.push(is_dead);
            counted.push(counts);
        }
        Ok(sqlx::query(AssertSqlSafe(Arc::clone(&self.reschedule_sql)))
            .bind(&ids)
            .bind(errors)
            .bind(&delays)
            .bind(&dead)
            .bind(&counted)
            .execute(&mut *self.tx)
            .await?
            .rows_affected())
    }
}

fn check_count(expected: usize, affected: u64) -> Result<(), StoreError> {
    let expected = expected as u64;
    if expected == affected {
        Ok(())
    } else {
        Err(StoreError::MarkMismatch { expected, affected })
    }
}
