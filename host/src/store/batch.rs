//! What every driver's [`ClaimedBatch`] shares: recording an outcome with the driver's
//! statements ([`RecordRows`]) and checking the counts, and the batch held in a transaction
//! ([`TxBatch`], PostgreSQL's and MySQL's).

use std::sync::Arc;

use futures::future::BoxFuture;
use sqlx::Acquire;

use super::rows::IDS_PER_STATEMENT;
use super::statement::{Execute, Statement};
use super::{BatchOutcome, ClaimedBatch, RowFailure, StoreError};
use crate::model::OutboxId;
use crate::text::{MAX_LOGGED, bounded};

/// A driver's two statements that record an outcome's rows, on a connection of its database
/// (boxed futures: the shared code holding them stays `Send` whatever the driver).
pub trait RecordRows<DB: sqlx::Database>: Sync {
    /// Marks `ids` sent; returns the rows changed.
    fn mark<'c>(
        &'c self,
        conn: &'c mut DB::Connection,
        ids: &'c [OutboxId],
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>>;

    /// Reschedules or dead-letters `failed`, recording each row's error (made safe to store)
    /// or `fixed`; returns the rows changed.
    fn reschedule<'c>(
        &'c self,
        conn: &'c mut DB::Connection,
        failed: &'c [RowFailure],
        fixed: Option<&'static str>,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>>;
}

/// The statements that record an outcome's rows on a database without array parameters, one
/// per chunk of rows ([`in_chunks`]): [`RecordRows`] runs them.
pub(crate) trait ChunkedRows: Sync {
    /// Marks `ids` sent.
    fn mark(&self, ids: &[OutboxId]) -> Statement;
    /// Reschedules or dead-letters `failed`, recording each row's error or `fixed`.
    fn reschedule(&self, failed: &[RowFailure], fixed: Option<&str>) -> Statement;
}

impl<DB: Execute, S: ChunkedRows> RecordRows<DB> for S {
    fn mark<'c>(
        &'c self,
        conn: &'c mut DB::Connection,
        ids: &'c [OutboxId],
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        Box::pin(in_chunks::<DB, _>(conn, ids, |chunk| {
            ChunkedRows::mark(self, chunk)
        }))
    }

    fn reschedule<'c>(
        &'c self,
        conn: &'c mut DB::Connection,
        failed: &'c [RowFailure],
        fixed: Option<&'static str>,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        Box::pin(in_chunks::<DB, _>(conn, failed, move |chunk| {
            ChunkedRows::reschedule(self, chunk, fixed)
        }))
    }
}

/// A claimed batch held in an open transaction whose row locks keep other relays off its rows
/// until it commits (PostgreSQL, MySQL), recorded with the driver's statements `S`.
pub struct TxBatch<DB: sqlx::Database, S> {
    tx: sqlx::Transaction<'static, DB>,
    rows: Arc<S>,
}

impl<DB: sqlx::Database, S> TxBatch<DB, S> {
    pub(crate) fn new(tx: sqlx::Transaction<'static, DB>, rows: Arc<S>) -> Self {
        Self { tx, rows }
    }
}

impl<DB: sqlx::Database, S: RecordRows<DB> + Send> ClaimedBatch for TxBatch<DB, S> {
    async fn complete(mut self, outcome: BatchOutcome) -> Result<(), StoreError> {
        match record(&mut self.tx, &*self.rows, &outcome).await {
            Ok(()) => Ok(self.tx.commit().await?),
            // Rolled back at once, not when the connection is next used: the rows' locks are
            // gone before the caller settles the outcome in a fresh transaction.
            Err(e) => {
                if let Err(rollback) = self.tx.rollback().await {
                    tracing::debug!(error = %rollback, "rolling back a batch that could not be marked failed");
                }
                Err(e)
            }
        }
    }

    async fn abandon(self) -> Result<(), StoreError> {
        self.tx.rollback().await?;
        Ok(())
    }
}

/// Marks and reschedules the outcome's rows in `tx` with the driver's statements `rows`,
/// checking each count.
pub(crate) async fn record<DB: sqlx::Database>(
    tx: &mut sqlx::Transaction<'static, DB>,
    rows: &(impl RecordRows<DB> + ?Sized),
    outcome: &BatchOutcome,
) -> Result<(), StoreError> {
    if !outcome.sent.is_empty() {
        let affected = rows.mark(tx, &outcome.sent).await?;
        check_count(outcome.sent.len(), affected)?;
    }
    if !outcome.failed.is_empty() {
        let affected = reschedule_or_fixed(tx, rows, &outcome.failed).await?;
        check_count(outcome.failed.len(), affected)?;
    }
    Ok(())
}

/// Reschedules `failed` with their own error texts inside a savepoint of `tx`; should the
/// database refuse the texts (a constraint or trigger of the application's, a column
/// character set that cannot hold them), undoes that and records [`UNSTORABLE_ERROR`]
/// instead, so completing a batch whose messages were published cannot fail on text.
async fn reschedule_or_fixed<DB: sqlx::Database>(
    tx: &mut sqlx::Transaction<'static, DB>,
    rows: &(impl RecordRows<DB> + ?Sized),
    failed: &[RowFailure],
) -> Result<u64, StoreError> {
    let mut savepoint = Acquire::begin(&mut *tx).await?;
    match rows.reschedule(&mut savepoint, failed, None).await {
        Ok(affected) => {
            savepoint.commit().await?;
            Ok(affected)
        }
        Err(refused) => {
            tracing::warn!(
                error = %bounded(&refused.to_string(), MAX_LOGGED),
                rows = failed.len(),
                "the database refused the failed rows' error texts; recording a fixed text instead"
            );
            savepoint.rollback().await?;
            Ok(rows.reschedule(tx, failed, Some(UNSTORABLE_ERROR)).await?)
        }
    }
}

/// The `last_error` [`reschedule_or_fixed`] falls back on: plain ASCII.
const UNSTORABLE_ERROR: &str =
    "the error text could not be stored (the database refused it); see the relay's log";

/// Runs the statement `each` builds for every chunk of at most [`IDS_PER_STATEMENT`] `items`
/// (databases without array parameters: one placeholder per value); returns the rows changed.
pub(crate) async fn in_chunks<DB: Execute, T: Sync>(
    conn: &mut DB::Connection,
    items: &[T],
    each: impl Fn(&[T]) -> Statement + Sync,
) -> Result<u64, sqlx::Error> {
    let mut affected = 0;
    for chunk in items.chunks(IDS_PER_STATEMENT) {
        affected += DB::execute(conn, &each(chunk)).await?;
    }
    Ok(affected)
}

/// [`StoreError::MarkMismatch`] unless a statement given `expected` rows changed as many.
pub(crate) fn check_count(expected: usize, affected: u64) -> Result<(), StoreError> {
    let expected = expected as u64;
    if expected == affected {
        Ok(())
    } else {
        Err(StoreError::MarkMismatch { expected, affected })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_short_of_the_rows_given_is_a_mismatch() {
        assert!(check_count(3, 3).is_ok());
        assert!(matches!(
            check_count(3, 2),
            Err(StoreError::MarkMismatch {
                expected: 3,
                affected: 2
            })
        ));
    }
}
