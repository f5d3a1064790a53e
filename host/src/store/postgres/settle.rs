//! [`OutboxStore::settle`]: recording a batch's outcome in a fresh transaction after its
//! commit failed. All rows in one statement each (mark, reschedule) inside a savepoint; if
//! the database refuses that, row by row, each in its own savepoint, so one row it refuses
//! cannot keep the others from being recorded. Rare path: plain SQL built per call.

use std::collections::{HashMap, HashSet};

use sqlx::{Acquire, AssertSqlSafe, PgConnection};

use super::PgStore;
use super::batch::RescheduleParams;
use super::rows::key_params;
use super::sql::{id_text_expr, key_array};
use crate::model::OutboxId;
use crate::store::settle::{SettledAs, UNCHANGED};
use crate::store::{BatchOutcome, RowFailure, Settlement, StoreError};

pub(super) async fn settle(
    store: &PgStore,
    outcome: &BatchOutcome,
) -> Result<Settlement, StoreError> {
    let mut settlement = Settlement::default();
    // Keys travel as text (cast to the id column's type in SQL) and come back as text.
    let ids: HashMap<String, &OutboxId> = outcome.ids().map(|id| (id.to_string(), id)).collect();
    if ids.is_empty() {
        return Ok(settlement);
    }
    let sql = &store.sql;
    let wanted: Vec<String> = ids.keys().cloned().collect();
    let lock_sql = format!(
        "SELECT {id_text} FROM {table} AS o WHERE o.{id} = ANY({keys})
            AND o.published_at IS NULL AND o.dead_at IS NULL
            FOR UPDATE OF o SKIP LOCKED",
        id_text = id_text_expr(sql, "o"),
        table = sql.table,
        id = sql.id,
        keys = key_array(sql, "$1"),
    );
    let mark_sql = format!(
        "{} RETURNING {}",
        store.statements.mark,
        id_text_expr(sql, "")
    );
    let reschedule_sql = format!(
        "{} RETURNING {}",
        store.statements.reschedule,
        id_text_expr(sql, "o")
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
            file_returned(&mut settlement, &sent, &marked, SettledAs::Marked);
            let failed_ids: Vec<&OutboxId> = failed.iter().map(|f| &f.id).collect();
            file_returned(
                &mut settlement,
                &failed_ids,
                &rescheduled,
                SettledAs::Rescheduled,
            );
        }
        Err(e) => {
            all.rollback().await?;
            tracing::warn!(error = %e, "recording the batch's rows together failed; recording them one by one");
            for id in sent {
                let mut one = Acquire::begin(&mut tx).await?;
                let done = mark(&mut one, &mark_sql, &[id]).await;
                keep_or_undo(&mut settlement, id, done, one, SettledAs::Marked).await?;
            }
            for failure in failed {
                let mut one = Acquire::begin(&mut tx).await?;
                let done = reschedule(&mut one, &reschedule_sql, &[failure]).await;
                keep_or_undo(
                    &mut settlement,
                    &failure.id,
                    done,
                    one,
                    SettledAs::Rescheduled,
                )
                .await?;
            }
        }
    }
    tx.commit().await?;
    Ok(settlement)
}

/// Files the `given` rows as `settled_as` when the statement returned them (`RETURNING`), as
/// refused otherwise.
fn file_returned(
    settlement: &mut Settlement,
    given: &[&OutboxId],
    changed: &[String],
    settled_as: SettledAs,
) {
    let changed: HashSet<&str> = changed.iter().map(String::as_str).collect();
    for id in given {
        if changed.contains(id.to_string().as_str()) {
            settled_as.file(settlement, (*id).clone());
        } else {
            settlement
                .refused
                .push(((*id).clone(), UNCHANGED.to_owned()));
        }
    }
}

/// Keeps one row's change (releasing its savepoint) and files what `RETURNING` gave back, or
/// undoes it and files it as refused.
async fn keep_or_undo(
    settlement: &mut Settlement,
    id: &OutboxId,
    done: Result<Vec<String>, sqlx::Error>,
    savepoint: sqlx::Transaction<'_, sqlx::Postgres>,
    settled_as: SettledAs,
) -> Result<(), StoreError> {
    match done {
        Ok(changed) => {
            savepoint.commit().await?;
            file_returned(settlement, &[id], &changed, settled_as);
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
    let params = RescheduleParams::new(failed.iter().copied(), None);
    sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
        .bind(params.ids)
        .bind(params.errors)
        .bind(params.delays)
        .bind(params.dead)
        .bind(params.counted)
        .fetch_all(conn)
        .await
}
