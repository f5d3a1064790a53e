//! Decoding claimed rows (cast in SQL) into [`OutboxRow`]s, binding ids, and time as Sluice's
//! SQLite columns hold it.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::query::Query;
use sqlx::sqlite::{Sqlite, SqliteArguments, SqliteRow};

use crate::model::{OutboxId, OutboxRow, TenantId};
use crate::store::rows::parse_headers;
use crate::store::schema::{KeyKind, Layout};
use crate::store::{ColumnName, Disposition, RowFailure, StoreError};

pub type LiteQuery<'q> = Query<'q, Sqlite, SqliteArguments>;

/// Now, as milliseconds since the Unix epoch (how Sluice's time columns hold time).
pub fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// Milliseconds since the epoch as a time (the epoch itself for values out of range).
pub fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// Binds `id` as the type the id column holds: an integer, or its text.
pub fn bind_id<'q>(query: LiteQuery<'q>, id: &OutboxId) -> LiteQuery<'q> {
    match id {
        OutboxId::Int(n) => query.bind(*n),
        OutboxId::Text(text) => query.bind(text.to_string()),
    }
}

/// Reads column `column` as an id as the layout carries it.
pub fn read_id(row: &SqliteRow, layout: &Layout, column: &str) -> Result<OutboxId, sqlx::Error> {
    Ok(match layout.key {
        KeyKind::Int => OutboxId::Int(row.try_get(column)?),
        KeyKind::Text { .. } => OutboxId::Text(row.try_get::<String, _>(column)?.into()),
    })
}

/// A claimed row with its place in claim order (`RETURNING` gives rows in no set order).
pub struct Claimed {
    pub order: (i64, OutboxId),
    pub row: Result<OutboxRow, RowFailure>,
}

/// Decodes a claimed row. A row whose columns cannot be decoded is a [`RowFailure`] under its
/// own id, dead-lettered with the reason; only an unreadable id fails the whole claim.
pub fn decode_row(row: &SqliteRow, layout: &Layout) -> Result<Claimed, StoreError> {
    let key_error = |e: sqlx::Error| StoreError::Key {
        table: layout.table.to_string(),
        column: layout.id.to_string(),
        message: e.to_string(),
    };
    let id = read_id(row, layout, "id").map_err(key_error)?;
    let order: i64 = row.try_get("claim_order").map_err(key_error)?;
    let decoded = decode_columns(row, layout, id.clone()).map_err(|error| RowFailure {
        id: id.clone(),
        error,
        disposition: Disposition::Dead,
    });
    Ok(Claimed {
        order: (order, id),
        row: decoded,
    })
}

fn decode_columns(row: &SqliteRow, layout: &Layout, id: OutboxId) -> Result<OutboxRow, String> {
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
    let created_at = row
        .try_get::<Option<i64>, _>("created_at")
        .map_err(|e| cannot(&layout.created_at, e))?
        .map_or_else(Utc::now, from_ms);
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
        created_at,
        attempts: row
            .try_get("attempts")
            .map_err(|e| format!("cannot decode column attempts: {e}"))?,
    })
}
