//! Decoding claimed rows: the claim's columns (already cast in SQL) into [`OutboxRow`]s.

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::schema::{KeyKind, Layout};
use crate::model::{OutboxId, OutboxRow, TenantId};
use crate::store::rows::parse_headers;
use crate::store::{ColumnName, Disposition, RowFailure, StoreError};

/// Decodes a claimed row. A row whose columns cannot be decoded is a [`RowFailure`] under its
/// own id, dead-lettered with the reason (retrying cannot help until someone fixes the row).
/// Only an unreadable id is an error of the whole claim: without it the row cannot be named.
/// (The schema check makes that impossible — the id is `NOT NULL` and cast to `int8` or
/// `text` in SQL — unless the table is altered under a running relay.)
pub fn decode_row(
    row: &PgRow,
    layout: &Layout,
) -> Result<Result<OutboxRow, RowFailure>, StoreError> {
    let id = match layout.key {
        KeyKind::Int => row.try_get::<i64, _>("id").map(OutboxId::Int),
        KeyKind::Text { .. } => row
            .try_get::<String, _>("id")
            .map(|id| OutboxId::Text(id.into())),
    }
    .map_err(|e| StoreError::Key {
        table: layout.table.to_string(),
        column: layout.id.to_string(),
        message: e.to_string(),
    })?;
    Ok(
        decode_columns(row, layout, id.clone()).map_err(|error| RowFailure {
            id,
            error,
            disposition: Disposition::Dead,
        }),
    )
}

fn decode_columns(row: &PgRow, layout: &Layout, id: OutboxId) -> Result<OutboxRow, String> {
    let cannot =
        |column: &ColumnName, e: sqlx::Error| format!("cannot decode column {column}: {e}");
    let text = |alias: &str, column: &ColumnName| match row.try_get::<Option<String>, _>(alias) {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err(format!("column {column} is NULL")),
        Err(e) => Err(cannot(column, e)),
    };
    let tenant = match &layout.tenant {
        Some(column) => row.try_get("tenant").map_err(|e| cannot(column, e))?,
        None => None,
    };
    let headers = text("headers", &layout.headers)?;
    Ok(OutboxRow {
        id,
        tenant: TenantId::from_column(tenant),
        aggregate_type: text("aggregate_type", &layout.aggregate_type)?,
        aggregate_id: text("aggregate_id", &layout.aggregate_id)?,
        event_type: text("event_type", &layout.event_type)?,
        payload: row
            .try_get::<Option<Vec<u8>>, _>("payload")
            .map_err(|e| cannot(&layout.payload, e))?
            .unwrap_or_default(),
        headers: parse_headers(&headers)?,
        created_at: row
            .try_get("created_at")
            .map_err(|e| cannot(&layout.created_at, e))?,
        attempts: row
            .try_get("attempts")
            .map_err(|e| format!("cannot decode column attempts: {e}"))?,
    })
}

/// Ids as the `text[]` parameter the statements cast to the id column's type.
pub(crate) fn key_params<'a>(ids: impl Iterator<Item = &'a OutboxId>) -> Vec<String> {
    ids.map(OutboxId::to_string).collect()
}
