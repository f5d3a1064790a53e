//! What every driver's [`OutboxStore::settle`](super::OutboxStore::settle) shares once it
//! knows which of the batch's rows it may still record: splitting the outcome by those rows,
//! and keeping or undoing one row's change in its own savepoint.

use std::collections::HashSet;

use super::{BatchOutcome, RowFailure, Settlement, StoreError};
use crate::model::OutboxId;

/// A statement that changed nothing about a row it was given.
pub(crate) const UNCHANGED: &str = "the statement changed no row (a trigger or rule suppressed it)";

/// Files every row of `outcome` that is not in `held` (another relay has it, or it is gone)
/// as skipped, and returns the sent ids and failures of the held ones.
pub(crate) fn split_held(
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

/// Which list of a [`Settlement`] a row goes to once its statement changed it.
#[derive(Clone, Copy)]
pub(crate) enum SettledAs {
    Marked,
    Rescheduled,
}

impl SettledAs {
    /// Files `id` under this list of `settlement`.
    pub(crate) fn file(self, settlement: &mut Settlement, id: OutboxId) {
        match self {
            Self::Marked => settlement.marked.push(id),
            Self::Rescheduled => settlement.rescheduled.push(id),
        }
    }
}

/// Keeps one row's change (releasing its savepoint) and files it under `settled_as`, or undoes it
/// and files it as refused.
pub(crate) async fn settle_one<DB: sqlx::Database>(
    settlement: &mut Settlement,
    id: OutboxId,
    done: Result<u64, sqlx::Error>,
    savepoint: sqlx::Transaction<'_, DB>,
    settled_as: SettledAs,
) -> Result<(), StoreError> {
    match done {
        Ok(1) => {
            savepoint.commit().await?;
            settled_as.file(settlement, id);
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
