//! MySQL/MariaDB's `relay.fair_share` (what it does, and why in three statements here:
//! [`crate::store::fair`]): the walk picks the heads without locking, then one statement
//! locks those still due, skipping rows another relay holds.

use std::collections::HashMap;

use sqlx::MySql;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlRow};

use super::migrate;
use super::sql::Statements;
use crate::model::OutboxId;
use crate::store::StoreError;
use crate::store::fair::{FairWalk, TenantTurn, check_tenant_index, pick_heads};
use crate::store::rows::{column, read_id};
use crate::store::schema::{FoundColumn, Layout};
use crate::store::statement::Execute;

/// Refuses a table the walk cannot serve (see [`check_tenant_index`]); `found`: its columns.
pub(super) async fn check_table(
    pool: &MySqlPool,
    layout: &Layout,
    found: &[FoundColumn],
) -> Result<(), StoreError> {
    let indexed = match &layout.tenant {
        Some(tenant) => {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.STATISTICS
                  WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?
                    AND SEQ_IN_INDEX = 1 AND COLUMN_NAME = ?",
            )
            .bind(layout.table.schema())
            .bind(layout.table.table())
            .bind(tenant.as_str())
            .fetch_one(pool)
            .await?;
            n > 0
        }
        None => false,
    };
    check_tenant_index(layout, indexed, || {
        migrate::tenant_index_sql(layout, found).unwrap_or_default()
    })
}

/// The heads of the tenants next in turn, locked in `tx` and in walk order, and the ids the
/// walk picked (the fill passes over them all: those not locked here are another relay's).
pub(super) async fn claim_heads(
    tx: &mut MySqlConnection,
    statements: &Statements,
    walk: &FairWalk,
    turn: &TenantTurn,
    paused: &[Option<&str>],
    limit: usize,
) -> Result<(Vec<MySqlRow>, Vec<OutboxId>), StoreError> {
    let sql = &statements.sql;
    let picked = pick_heads::<MySql>(tx, walk, sql, turn, paused, limit).await?;
    if picked.is_empty() {
        return Ok((Vec::new(), picked));
    }
    let mut rows = MySql::fetch_all(tx, &statements.lock(&picked)).await?;
    let place: HashMap<&OutboxId, usize> =
        picked.iter().enumerate().map(|(i, id)| (id, i)).collect();
    rows.sort_by_cached_key(|row| {
        read_id(row, &sql.layout.key, column::ID)
            .ok()
            .and_then(|id| place.get(&id).copied())
            .unwrap_or(usize::MAX)
    });
    Ok((rows, picked))
}
