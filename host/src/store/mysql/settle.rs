//! [`OutboxStore::settle`](crate::store::OutboxStore::settle): recording a batch's outcome in
//! a fresh transaction after its commit failed. The rows still unsent are locked (skipping rows
//! another relay holds), then marked and rescheduled together inside a savepoint; if the
//! database refuses that (or a statement changes fewer rows than it was given), row by row,
//! each in its own savepoint, so one row it refuses cannot keep the others from being
//! recorded. Rare path: plain SQL built per call.

use std::collections::HashSet;

use sqlx::AssertSqlSafe;

use super::MyStore;
use super::rows::{bind_id, bind_null_id, placeholder_count};
use crate::model::OutboxId;
use crate::store::rows::{IDS_PER_STATEMENT, placeholders, read_id};
use crate::store::settle::{record_held, split_held};
use crate::store::{BatchOutcome, Settlement, StoreError};

pub(super) async fn settle(
    store: &MyStore,
    outcome: &BatchOutcome,
) -> Result<Settlement, StoreError> {
    let mut settlement = Settlement::default();
    let wanted: Vec<&OutboxId> = outcome.ids().collect();
    if wanted.is_empty() {
        return Ok(settlement);
    }
    let statements = &store.statements;
    let sql = &statements.sql;
    let mut tx = store.pool.begin().await?;
    let mut locked: HashSet<OutboxId> = HashSet::new();
    for chunk in wanted.chunks(IDS_PER_STATEMENT) {
        let slots = placeholder_count(chunk.len());
        let lock_sql = format!(
            "SELECT {id} AS id FROM {table} AS o WHERE o.{id_col} IN ({ids})
                AND o.published_at IS NULL AND o.dead_at IS NULL
                FOR UPDATE SKIP LOCKED",
            id = sql.id_expr("o"),
            table = sql.table,
            id_col = sql.id,
            ids = placeholders(slots),
        );
        let mut query = sqlx::query(AssertSqlSafe(lock_sql));
        for id in chunk {
            query = bind_id(query, id);
        }
        for _ in chunk.len()..slots {
            query = bind_null_id(query, &sql.layout.key);
        }
        for row in query.fetch_all(&mut *tx).await? {
            locked.insert(read_id(&row, &sql.layout.key, 0)?);
        }
    }
    let (sent, failed) = split_held(outcome, &locked, &mut settlement);

    record_held(&mut tx, &**statements, sent, failed, &mut settlement).await?;
    tx.commit().await?;
    Ok(settlement)
}
