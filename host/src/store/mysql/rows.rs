//! Decoding claimed rows (already cast in SQL) into [`OutboxRow`]s, and binding ids.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::mysql::{MySql, MySqlArguments, MySqlRow};
use sqlx::query::Query;

use crate::model::{OutboxId, OutboxRow, TenantId};
use crate::store::rows::parse_headers;
use crate::store::schema::{KeyKind, Layout, PayloadKind};
use crate::store::{ColumnName, Disposition, RowFailure, StoreError};

pub type MyQuery<'q> = Query<'q, MySql, MySqlArguments>;

/// The number of placeholders a statement for `n` values gets: the next power of two, the rest
/// bound as NULL (which matches no row). Statements differ only by their placeholders, and
/// sqlx prepares (and caches, up to 100 per connection) each text: with one text per batch size
/// the cache would overflow, and every statement it evicts is closed with a packet MySQL does
/// not answer, which stalls the next statement for a delayed ACK (40 ms) under Nagle's
/// algorithm. Powers of two keep each connection at a handful of texts.
pub fn placeholder_count(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// Binds a NULL of the id's type, for the placeholders beyond the values.
pub fn bind_null_id<'q>(query: MyQuery<'q>, key: &KeyKind) -> MyQuery<'q> {
    match key {
        KeyKind::Int => query.bind(None::<i64>),
        KeyKind::Text { .. } => query.bind(None::<String>),
    }
}

/// Binds `id` as the type the id column compares with: an integer, or its text.
pub fn bind_id<'q>(query: MyQuery<'q>, id: &OutboxId) -> MyQuery<'q> {
    match id {
        OutboxId::Int(n) => query.bind(*n),
        OutboxId::Text(text) => query.bind(text.to_string()),
    }
}

/// Reads the `id` column of a row as the layout carries it.
pub fn read_id(row: &MySqlRow, layout: &Layout, column: &str) -> Result<OutboxId, sqlx::Error> {
    Ok(match layout.key {
        KeyKind::Int => OutboxId::Int(row.try_get(column)?),
        KeyKind::Text { .. } => OutboxId::Text(row.try_get::<String, _>(column)?.into()),
    })
}

/// Decodes a claimed row. A row whose columns cannot be decoded is a [`RowFailure`] under its
/// own id, dead-lettered with the reason; only an unreadable id fails the whole claim.
pub fn decode_row(
    row: &MySqlRow,
    layout: &Layout,
) -> Result<Result<OutboxRow, RowFailure>, StoreError> {
    let id = read_id(row, layout, "id").map_err(|e| StoreError::Key {
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

fn decode_columns(row: &MySqlRow, layout: &Layout, id: OutboxId) -> Result<OutboxRow, String> {
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
    let payload = match layout.payload_kind {
        PayloadKind::Json | PayloadKind::Text => row
            .try_get::<Option<String>, _>("payload")
            .map(|p| p.map(String::into_bytes)),
        PayloadKind::Bytes => row.try_get::<Option<Vec<u8>>, _>("payload"),
    }
    .map_err(|e| cannot(&layout.payload, e))?;
    let headers = text("headers", &layout.headers)?;
    let created_at: DateTime<Utc> = row
        .try_get("created_at")
        .map_err(|e| cannot(&layout.created_at, e))?;
    Ok(OutboxRow {
        id,
        tenant: TenantId::from_column(tenant),
        aggregate_type: text("aggregate_type", &layout.aggregate_type)?,
        aggregate_id: text("aggregate_id", &layout.aggregate_id)?,
        event_type: text("event_type", &layout.event_type)?,
        payload: payload.unwrap_or_default(),
        headers: parse_headers(&headers)?,
        created_at,
        attempts: row
            .try_get("attempts")
            .map_err(|e| format!("cannot decode column attempts: {e}"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_come_in_a_few_sizes() {
        let sizes: std::collections::BTreeSet<usize> = (1..=1000).map(placeholder_count).collect();
        assert_eq!(sizes.len(), 11);
        assert_eq!(placeholder_count(0), 1);
        assert_eq!(placeholder_count(500), 512);
        assert_eq!(placeholder_count(1000), 1024);
    }
}
