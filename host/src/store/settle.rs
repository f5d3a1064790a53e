//! [`OutboxStore::settle`](super::OutboxStore::settle), for every driver: recording a batch's
//! outcome in a fresh transaction after its completion failed ([`settle`]). Rare path: plain
//! SQL built per call.

use std::collections::HashSet;

use sqlx::Acquire;

use super::batch::RecordRows;
use super::layout_sql::LayoutSql;
use super::rows::{IDS_PER_STATEMENT, read_id};
use super::statement::{Execute, Statement};
use super::{BatchOutcome, RowFailure, Settlement, StoreError};
use crate::model::OutboxId;

/// The `held` of drivers whose claims lock rows (PostgreSQL, MySQL): lock them too, skipping
/// rows another relay has locked.
pub(crate) const SKIP_LOCKED: &str = "FOR UPDATE SKIP LOCKED";

/// Settles `outcome` in `tx`, a fresh transaction, and commits: the rows of `outcome` still
/// pending and `held` (the driver's condition on them: [`SKIP_LOCKED`], or SQLite's lease) are
/// recorded with the driver's statements `rows`; the others are skipped.
pub(crate) async fn settle<DB: Execute>(
    mut tx: sqlx::Transaction<'static, DB>,
    sql: &LayoutSql,
    outcome: &BatchOutcome,
    held: impl Fn(&mut Statement) -> String,
    rows: &(impl RecordRows<DB> + ?Sized),
) -> Result<Settlement, StoreError> {
    let mut settlement = Settlement::default();
    let wanted: Vec<&OutboxId> = outcome.ids().collect();
    if wanted.is_empty() {
        return Ok(settlement);
    }
    let mut ours = HashSet::new();
    for chunk in wanted.chunks(IDS_PER_STATEMENT) {
        let mut statement = Statement::new(sql.dialect);
        let ids = sql.bind_ids(&mut statement, chunk.iter().copied());
        let text = format!(
            "SELECT {id_expr} FROM {table} AS o WHERE o.{id} IN ({ids}) AND {pending} {held}",
            id_expr = sql.id_expr("o"),
            table = sql.table,
            id = sql.id,
            pending = LayoutSql::PENDING,
            held = held(&mut statement),
        );
        for row in DB::fetch_all(&mut *tx, &statement.with_sql(text)).await? {
            ours.insert(read_id(&row, &sql.layout.key, 0)?);
        }
    }
    let (sent, failed) = split_held(outcome, &ours, &mut settlement);
    record_held(&mut tx, rows, sent, failed, &mut settlement).await?;
    tx.commit().await?;
    Ok(settlement)
}

/// A statement that changed nothing about a row it was given.
const UNCHANGED: &str = "the statement changed no row (a trigger or rule suppressed it)";

/// Files every row of `outcome` that is not in `held` (another relay has it, or it is gone)
/// as skipped, and returns the sent ids and failures of the held ones.
fn split_held(
    outcome: &BatchOutcome,
    held: &HashSet<OutboxId>,
    settlement: &mut Settlement,
) -> (Vec<OutboxId>, Vec<RowFailure>) {
    settlement.skipped = outcome
        .ids()
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

/// Keeps one row's change (releasing its savepoint) when the statement changed the row;
/// otherwise undoes it and returns why the row is refused.
async fn keep_one<DB: sqlx::Database>(
    done: Result<u64, sqlx::Error>,
    savepoint: sqlx::Transaction<'_, DB>,
) -> Result<Result<(), String>, StoreError> {
    if let Ok(1) = done {
        savepoint.commit().await?;
        return Ok(Ok(()));
    }
    savepoint.rollback().await?;
    Ok(Err(
        done.map_or_else(|e| e.to_string(), |_| UNCHANGED.to_owned())
    ))
}

/// Records the held rows (`sent` and `failed`, from [`split_held`]) in `tx`: together inside a
/// savepoint; if the database refuses that, or a statement changes fewer rows than it was
/// given, row by row, each in its own savepoint ([`keep_one`]), so one row it refuses cannot
/// keep the others from being recorded.
async fn record_held<DB: sqlx::Database>(
    tx: &mut sqlx::Transaction<'static, DB>,
    rows: &(impl RecordRows<DB> + ?Sized),
    sent: Vec<OutboxId>,
    failed: Vec<RowFailure>,
    settlement: &mut Settlement,
) -> Result<(), StoreError> {
    let mut all = Acquire::begin(&mut *tx).await?;
    let together = match rows.mark(&mut all, &sent).await {
        Ok(marked) => rows
            .reschedule(&mut all, &failed, None)
            .await
            .map(|rescheduled| marked == sent.len() as u64 && rescheduled == failed.len() as u64),
        Err(e) => Err(e),
    };
    match together {
        Ok(true) => {
            all.commit().await?;
            settlement.marked = sent;
            settlement.rescheduled = failed.into_iter().map(|f| f.id).collect();
        }
        outcome => {
            all.rollback().await?;
            if let Err(e) = outcome {
                tracing::warn!(error = %e, "recording the batch's rows together failed; recording them one by one");
            }
            for id in sent {
                let mut one = Acquire::begin(&mut *tx).await?;
                let done = rows.mark(&mut one, std::slice::from_ref(&id)).await;
                match keep_one(done, one).await? {
                    Ok(()) => settlement.marked.push(id),
                    Err(why) => settlement.refused.push((id, why)),
                }
            }
            for failure in failed {
                let mut one = Acquire::begin(&mut *tx).await?;
                let done = rows.reschedule(&mut one, std::slice::from_ref(&failure), None);
                match keep_one(done.await, one).await? {
                    Ok(()) => settlement.rescheduled.push(failure.id),
                    Err(why) => settlement.refused.push((failure.id, why)),
                }
            }
        }
    }
    Ok(())
}
