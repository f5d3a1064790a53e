//! [`OutboxStore::settle`](crate::store::OutboxStore::settle): recording a batch's outcome in
//! a fresh write transaction after its completion failed (it rolled back; the rows are still
//! leased to the batch). Rows are settled if they are still unsent and leased by this process
//! (any of its batches' tokens), by nobody, or by an expired lease; rows another relay leases
//! are skipped. Together inside a savepoint; if the database refuses that, row by row.

use std::collections::HashSet;

use sqlx::AssertSqlSafe;

use super::batch::Recorder;
use super::rows::{bind_id, now_ms};
use super::{BEGIN_WRITE, LiteStore};
use crate::model::OutboxId;
use crate::store::rows::{IDS_PER_STATEMENT, placeholders, read_id};
use crate::store::settle::{record_held, split_held};
use crate::store::{BatchOutcome, Settlement, StoreError};

pub(super) async fn settle(
    store: &LiteStore,
    outcome: &BatchOutcome,
) -> Result<Settlement, StoreError> {
    let mut settlement = Settlement::default();
    let wanted: Vec<&OutboxId> = outcome.ids().collect();
    if wanted.is_empty() {
        return Ok(settlement);
    }
    let statements = &store.statements;
    let layout = &statements.sql.layout;
    let now = now_ms();
    let prefix = store.process_prefix();
    let mut tx = store.pool.begin_with(BEGIN_WRITE).await?;
    let mut ours: HashSet<OutboxId> = HashSet::new();
    for chunk in wanted.chunks(IDS_PER_STATEMENT) {
        let sql = format!(
            "SELECT {id_expr} AS id FROM {table} AS o
              WHERE o.{id} IN ({ids})
                AND o.published_at IS NULL AND o.dead_at IS NULL
                AND (o.leased_by IS NULL OR o.lease_until <= ?
                     OR substr(o.leased_by, 1, length(?)) = ?)",
            id_expr = statements.sql.id_expr("o"),
            table = layout.table,
            id = layout.id,
            ids = placeholders(chunk.len()),
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for id in chunk {
            query = bind_id(query, id);
        }
        let rows = query
            .bind(now)
            .bind(prefix.clone())
            .bind(prefix.clone())
            .fetch_all(&mut *tx)
            .await?;
        for row in &rows {
            ours.insert(read_id(row, &layout.key, 0)?);
        }
    }
    let (sent, failed) = split_held(outcome, &ours, &mut settlement);

    let rows = Recorder {
        statements,
        now,
        lease: None,
    };
    record_held(&mut tx, &rows, sent, failed, &mut settlement).await?;
    tx.commit().await?;
    Ok(settlement)
}
