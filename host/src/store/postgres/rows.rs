//! Decoding claimed rows: the claim's columns (already cast in SQL) into [`OutboxRow`]s.

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::schema::{KeyKind, Layout};
use crate::model::{Headers, OutboxId, OutboxRow, TenantId};
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

/// Parses the `headers` column: a JSON object whose values are strings.
pub(crate) fn parse_headers(text: &str) -> Result<Headers, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("headers column is not JSON: {e}"))?;
    let serde_json::Value::Object(map) = value else {
        return Err(format!(
            "headers column must be a JSON object of strings, got {text}"
        ));
    };
    map.into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k, s.into_bytes())),
            other => Err(format!(
                "headers column: value of {k:?} must be a string, got {other}"
            )),
        })
        .collect()
}

/// Ids as the `text[]` parameter the statements cast to the id column's type.
pub(crate) fn key_params<'a>(ids: impl Iterator<Item = &'a OutboxId>) -> Vec<String> {
    ids.map(OutboxId::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_object_of_strings_becomes_ordered_pairs() {
        let h = parse_headers(r#"{"a":"1","b":"two"}"#).unwrap();
        assert_eq!(
            h,
            vec![("a".into(), b"1".to_vec()), ("b".into(), b"two".to_vec())]
        );
    }

    #[test]
    fn non_string_header_value_is_named() {
        let err = parse_headers(r#"{"trace":5}"#).unwrap_err();
        assert!(err.contains("\"trace\""), "{err}");
        assert!(parse_headers("[1]").is_err());
    }
}
