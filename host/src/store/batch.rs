//! What every driver's [`ClaimedBatch`](super::ClaimedBatch) shares: the affected-row count
//! check, the text recorded when the database refuses an error's own, and the end of a batch
//! held in a transaction.

use super::StoreError;

/// Recorded as `last_error` when the database refuses a failure's own text (a constraint or
/// trigger of the application's, a column character set that cannot hold it): plain ASCII,
/// so recording the failure cannot fail on text.
pub(crate) const UNSTORABLE_ERROR: &str =
    "the error text could not be stored (the database refused it); see the relay's log";

/// [`StoreError::MarkMismatch`] unless a statement given `expected` rows changed as many.
pub(crate) fn check_count(expected: usize, affected: u64) -> Result<(), StoreError> {
    let expected = expected as u64;
    if expected == affected {
        Ok(())
    } else {
        Err(StoreError::MarkMismatch { expected, affected })
    }
}

/// The end of [`ClaimedBatch::complete`](super::ClaimedBatch::complete) for drivers that hold
/// rows in a transaction: commits `tx` when the outcome was `recorded`, else rolls it back at
/// once — not when the connection is next used, so the rows' locks are gone before the caller
/// settles the outcome in a fresh transaction — and returns the error.
pub(crate) async fn commit_if_recorded<DB: sqlx::Database>(
    tx: sqlx::Transaction<'static, DB>,
    recorded: Result<(), StoreError>,
) -> Result<(), StoreError> {
    match recorded {
        Ok(()) => Ok(tx.commit().await?),
        Err(e) => {
            if let Err(rollback) = tx.rollback().await {
                tracing::debug!(error = %rollback, "rolling back a batch that could not be marked failed");
            }
            Err(e)
        }
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
