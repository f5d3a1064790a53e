//! [`OutboxStore::settle`]: recording a batch's outcome in a fresh transaction after its
//! commit failed. All rows in one statement each (mark, reschedule) inside a savepoint; if
//! the database refuses that, row by row, each in its own savepoint, so one row it refuses
//! cannot keep the others from being recorded. Rare path: plain SQL built per call.

use std::collections::{HashMap, HashSet};

use sqlx::{Acquire, AssertSqlSafe, PgConnection};

use super::PgStore;
use super::rows::key_params;
use super::schema::PgSql;
use crate::model::OutboxId;
use crate::store::{BatchOutcome, Disposition, RowFailure, Settlement, StoreError};
use crate::text::{MAX_STORED, bounded};

/// A statement that changed nothing about a row it was given.
const UNCHANGED: &str = "the statement changed no row (a trigger or rule suppressed it)";

pub async fn settle(store: &PgStore, outcome: &BatchOutcome) -> Result<Settlement, StoreError> {
    let mut settlement = Settlement::default();
    // Keys travel as text (cast to the id column's type in SQL) and come back as text.
    let ids: HashMap<String, &OutboxId> = outcome
        .sent
        .iter()
        .chain(outcome.failed.iter().map(|f| &f.id))
        .map(|id| (id.to_string(), id))
        .collect();
    if ids.is_empty() {
        return Ok(settlement);
    }
    let layout = store.layout();
    let wanted: Vec<String> = ids.keys().cloned().collect();
    let lock_sql = format!(
        "SELECT {id_text} FROM {table} AS o WHERE o.{id} = ANY({keys})
            AND o.published_at IS NULL AND o.dead_at IS NULL
            FOR UPDATE OF o SKIP LOCKED",
        id_text = layout.id_text_expr("o"),
        table = layout.table,
        id = layout.id,
        keys = layout.key_array("$1"),
    );
    let mark_sql = format!(
        "{} RETURNING {}",
        store.statements.mark,
        layout.id_text_expr("")
    );
    let reschedule_sql = format!(
        "{} RETURNING {}",
        store.statements.reschedule,
        layout.id_text_expr("o")
    );

    let mut tx = store.pool.begin().await?;
    let locked: HashSet<String> = sqlx::query_scalar::<_, String>(AssertSqlSafe(lock_sql))
        .bind(&wanted)
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .collect();
    settlement.skipped = ids
        .iter()
        .filter(|(key, _)| !locked.contains(*key))
        .map(|(_, id)| (*id).clone())
        .collect();
    let sent: Vec<&OutboxId> = outcome
        .sent
        .iter()
        .filter(|id| locked.contains(&id.to_string()))
        .collect();
    let failed: Vec<&RowFailure> = outcome
        .failed
        .iter()
        .filter(|f| locked.contains(&f.id.to_string()))
        .collect();

    let mut all = Acquire::begin(&mut tx).await?;
    let together = async {
        let marked = mark(&mut all, &mark_sql, &sent).await?;
        let rescheduled = reschedule(&mut all, &reschedule_sql, &failed).await?;
        Ok::<_, sqlx::Error>((marked, rescheduled))
    }
    .await;
    match together {
        Ok((marked, rescheduled)) => {
            all.commit().await?;
            sort(&mut settlement, &sent, &marked, Target::Marked);
            let failed_ids: Vec<&OutboxId> = failed.iter().map(|f| &f.id).collect();
            sort(
                &mut settlement,
                &failed_ids,
                &rescheduled,
                Target::Rescheduled,
            );
        }
        Err(e) => {
            all.rollback().await?;
            tracing::warn!(error = %e, "recording the batch's rows together failed; recording them one by one");
            for id in sent {
                let mut one = Acquire::begin(&mut tx).await?;
                let done = mark(&mut one, &mark_sql, &[id]).await;
                settle_one(&mut settlement, id, done, one, Target::Marked).await?;
            }
            for failure in failed {
                let mut one = Acquire::begin(&mut tx).await?;
                let done = reschedule(&mut one, &reschedule_sql, &[failure]).await;
                settle_one(&mut settlement, &failure.id, done, one, Target::Rescheduled).await?;
            }
        }
    }
    tx.commit().await?;
    Ok(settlement)
}

#[derive(Clone, Copy)]
enum Target {
    Marked,
    Rescheduled,
}

/// Files the `given` rows under `target` when the statement returned them, as refused
/// otherwise.
fn sort(settlement: &mut Settlement, given: &[&OutboxId], changed: &[String], target: Target) {
    let changed: HashSet<&str> = changed.iter().map(String::as_str).collect();
    for id in given {
        if changed.contains(id.to_string().as_str()) {
            let list = match target {
                Target::Marked => &mut settlement.marked,
                Target::Rescheduled => &mut settlement.rescheduled,
            };
            list.push((*id).clone());
        } else {
            settlement
                .refused
                .push(((*id).clone(), UNCHANGED.to_owned()));
        }
    }
}

/// Keeps one row's change (releasing its savepoint) or undoes it and files it as refused.
async fn settle_one(
    settlement: &mut Settlement,
    id: &OutboxId,
    done: Result<Vec<String>, sqlx::Error>,
    savepoint: sqlx::Transaction<'_, sqlx::Postgres>,
    target: Target,
) -> Result<(), StoreError> {
    match done {
        Ok(changed) => {
            savepoint.commit().await?;
            sort(settlement, &[id], &changed, target);
        }
        Err(e) => {
            savepoint.rollback().await?;
            settlement.refused.push((id.clone(), e.to_string()));
        }
    }
    Ok(())
}

async fn mark(
    conn: &mut PgConnection,
    sql: &str,
    ids: &[&OutboxId],
) -> Result<Vec<String>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
        .bind(key_params(ids.iter().copied()))
        .fetch_all(conn)
        .await
}

async fn reschedule(
    conn: &mut PgConnection,
    sql: &str,
    failed: &[&RowFailure],
) -> Result<Vec<String>, sqlx::Error> {
    if failed.is_empty() {
        return Ok(Vec::new());
    }
    let millis = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let mut errors = Vec::with_capacity(failed.len());
    let mut delays = Vec::with_capacity(failed.len());
    let mut dead = Vec::with_capacity(failed.len());
    let mut counted = Vec::with_capacity(failed.len());
    for f in failed {
        let (delay, is_dead, counts) = match f.disposition {
            Disposition::Retry(d) => (millis(d), false, true),
            Disposition::Dead => (0, true, true),
            Disposition::Wait(d) => (millis(d), false, false),
        };
        errors.push(bounded(&f.error, MAX_STORED).into_owned());
        delays.push(delay);
        dead.push(is_dead);
        counted.push(counts);
    }
    sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
        .bind(key_params(failed.iter().map(|f| &f.id)))
        .bind(&errors)
        .bind(&delays)
        .bind(&dead)
        .bind(&counted)
        .fetch_all(conn)
        .await
}
