//! What every driver's [`OutboxStore::settle`](super::OutboxStore::settle) shares once it
//! knows which of the batch's rows it may still record: splitting the outcome by those rows,
//! and keeping or undoing one row's change in its own savepoint.

use std::collections::HashSet;

use super::{BatchOutcome, RowFailure, Settlement, StoreError};
use crate::model::OutboxId;

/// A statement that changed nothing about a row it was given.
pub const UNCHANGED: &str = "the statement changed no row (a trigger suppressed it)";

/// Files every row of `outcome` that is not in `held` (another relay has it, or it is gone)
/// as skipped, and returns the sent ids and failures of the held ones.
pub fn split_held(
    outcome: &BatchOutcome,
    held: &HashSet<OutboxId>,
    settlement: &mut Settlement,
) -> (Vec<OutboxId>, Vec<RowFailure>) {
    settlement.skipped = outcome
        .sent
        .iter()
        .chain(outcome.failed.iter().map(|f| &f.id))
        .filter(|id| !held.contains(*id))
        .cloned()
        .collect();
    let sent = outcome
        .sent
        .iter()
        .filter(|id| held.contains(*id))
        .cloned()
        .collect();
    let failed = outcome
        .failed
        .iter()
        .filter(|f| held.contains(&f.id))
        .cloned()
        .collect();
    (sent, failed)
}

/// Where a row goes once its own statement changed it.
#[derive(Clone, Copy)]
pub enum Target {
    Marked,
    Rescheduled,
}

/// Keeps one row's change (releasing its savepoint) and files it under `target`, or undoes it
/// and files it as refused.
pub async fn settle_one<DB: sqlx::Database>(
    settlement: &mut Settlement,
    id: OutboxId,
    done: Result<u64, sqlx::Error>,
    savepoint: sqlx::Transaction<'_, DB>,
    target: Target,
) -> Result<(), StoreError> {
    match done {
        Ok(1) => {
            savepoint.commit().await?;
            match target {
                Target::Marked => settlement.marked.push(id),
                Target::Rescheduled => settlement.rescheduled.push(id),
            }
        }
        Ok(_) => {
            savepoint.rollback().await?;
            settlement.refused.push((id, UNCHANGED.to_owned()));
        }
        Err(e) => {
            savepoint.rollback().await?;
            settlement.refused.push((id, e.to_string()));
        }
    }
    Ok(())
}
