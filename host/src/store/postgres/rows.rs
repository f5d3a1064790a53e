//! Decoding claimed rows: the claim's columns (already cast in SQL) into [`OutboxRow`]s.
//! Columns are read by position ([`column`]), not by name: a lookup by name hashes the name
//! for every column of every row.

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::schema::{KeyKind, Layout};
use crate::model::{OutboxId, OutboxRow, TenantId};
use crate::store::rows::parse_headers;
use crate::store::{ColumnName, Disposition, RowFailure, StoreError};

/// The claim's columns, in the order its `SELECT` lists them (`sql.rs`; a test there holds
/// the two together).
pub mod column {
    pub const ID: usize = 0;
    pub const TENANT: usize = 1;
    pub const AGGREGATE_TYPE: usize = 2;
    pub const AGGREGATE_ID: usize = 3;
    pub const EVENT_TYPE: usize = 4;
    pub const PAYLOAD: usize = 5;
    pub const HEADERS: usize = 6;
    pub const CREATED_AT: usize = 7;
    pub const ATTEMPTS: usize = 8;
    /// The aliases, in that order.
    #[cfg(test)]
    pub const ALIASES: [&str; 9] = [
        "id",
        "tenant",
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "payload",
        "headers",
        "created_at",
        "attempts",
    ];
}

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
        KeyKind::Int => row.try_get::<i64, _>(column::ID).map(OutboxId::Int),
        KeyKind::Text { .. } => row
            .try_get::<String, _>(column::ID)
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
    let text = |index: usize, name: &ColumnName| match row.try_get::<Option<String>, _>(index) {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err(format!("column {name} is NULL")),
        Err(e) => Err(cannot(name, e)),
    };
    let tenant = match &layout.tenant {
        Some(name) => row.try_get(column::TENANT).map_err(|e| cannot(name, e))?,
        None => None,
    };
    let headers = text(column::HEADERS, &layout.headers)?;
    Ok(OutboxRow {
        id,
        tenant: TenantId::from_column(tenant),
        aggregate_type: text(column::AGGREGATE_TYPE, &layout.aggregate_type)?,
        aggregate_id: text(column::AGGREGATE_ID, &layout.aggregate_id)?,
        event_type: text(column::EVENT_TYPE, &layout.event_type)?,
        payload: row
            .try_get::<Option<Vec<u8>>, _>(column::PAYLOAD)
            .map_err(|e| cannot(&layout.payload, e))?
            .unwrap_or_default(),
        headers: parse_headers(&headers)?,
        created_at: row
            .try_get(column::CREATED_AT)
            .map_err(|e| cannot(&layout.created_at, e))?,
        attempts: row
            .try_get(column::ATTEMPTS)
            .map_err(|e| format!("cannot decode column attempts: {e}"))?,
    })
}

/// Ids as the `text[]` parameter the statements cast to the id column's type.
pub(crate) fn key_params<'a>(ids: impl Iterator<Item = &'a OutboxId>) -> Vec<String> {
    ids.map(OutboxId::to_string).collect()
}
