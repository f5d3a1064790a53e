//! A claimed batch: the open transaction holding the row locks, and how its outcome is
//! recorded (mark, reschedule, count check, commit).

use std::sync::Arc;

use sqlx::{AssertSqlSafe, MySql, Transaction};

use super::rows::{bind_id, bind_null_id, placeholder_count};
use super::sql::Statements;
use crate::model::OutboxId;
use crate::store::rows::{IDS_PER_STATEMENT, Reschedule};
use crate::store::batch::{UNSTORABLE_ERROR, check_count, commit_if_recorded};
use crate::store::{BatchOutcome, ClaimedBatch, RowFailure, StoreError};
use crate::text::{MAX_LOGGED, MAX_STORED, bounded};

/// A claimed batch: the open transaction holding the row locks.
pub struct MyBatch {
    tx: Transaction<'static, MySql>,
    statements: Arc<Statements>,
}

impl MyBatch {
    pub(super) fn new(tx: Transaction<'static, MySql>, statements: Arc<Statements>) -> Self {
        Self { tx, statements }
    }
}

impl ClaimedBatch for MyBatch {
    async fn complete(mut self, outcome: BatchOutcome) -> Result<(), StoreError> {
        let recorded = self.record(&outcome).await;
        commit_if_recorded(self.tx, recorded).await
    }

    async fn abandon(self) -> Result<(), StoreError> {
        self.tx.rollback().await?;
        Ok(())
    }
}

impl MyBatch {
    /// Marks and reschedules the outcome's rows, checking each count.
    async fn record(&mut self, outcome: &BatchOutcome) -> Result<(), StoreError> {
        if !outcome.sent.is_empty() {
            let affected = mark(&mut self.tx, &self.statements, &outcome.sent).await?;
            check_count(outcome.sent.len(), affected)?;
        }
        if !outcome.failed.is_empty() {
            let affected = self.reschedule(&outcome.failed).await?;
            check_count(outcome.failed.len(), affected)?;
        }
        Ok(())
    }

    /// Reschedules or dead-letters `failed` with their errors made safe to store; should the
    /// database refuse the texts, records [`UNSTORABLE_ERROR`] instead (inside a savepoint),
    /// so the commit of a published batch cannot fail on text.
    async fn reschedule(&mut self, failed: &[RowFailure]) -> Result<u64, StoreError> {
        sqlx::query("SAVEPOINT sluice_reschedule")
            .execute(&mut *self.tx)
            .await?;
        match reschedule(&mut self.tx, &self.statements, failed, None).await {
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
                Ok(reschedule(
                    &mut self.tx,
                    &self.statements,
                    failed,
                    Some(UNSTORABLE_ERROR),
                )
                .await?)
            }
        }
    }
}

/// Marks `ids` sent (in statements of at most [`IDS_PER_STATEMENT`] ids); returns the rows
/// affected.
pub async fn mark(
    conn: &mut sqlx::MySqlConnection,
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
pub async fn reschedule(
    conn: &mut sqlx::MySqlConnection,
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
            let error = match fixed {
                Some(text) => text.to_owned(),
                None => bounded(&f.error, MAX_STORED).into_owned(),
            };
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
