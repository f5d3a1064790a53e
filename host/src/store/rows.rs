//! What the drivers share about rows: decoding a claimed row (its columns already cast in
//! SQL, [`super::layout_sql::LayoutSql::claimed_columns`]), parsing the `headers` column, what
//! a failure does to its row as the reschedule statements take it, and how long id lists are
//! cut for databases without array parameters.

use std::sync::Arc;

use chrono::Utc;

use super::dialect::{Driver, millis};
use super::layout_sql::LayoutSql;
use super::schema::{KeyKind, PayloadKind, ValueKind};
use super::statement::{Param, ReadRow, Statement};
use super::{ColumnName, Disposition, RowFailure, StoreError};
use crate::model::{ColumnValue, ExtraColumns, Headers, OutboxId, OutboxRow, TenantId};
use crate::text::{MAX_STORED, bounded};

/// The claim's columns, in the order [`LayoutSql::claimed_columns`] lists them (a test of
/// PostgreSQL's claim holds the two together). Columns are read by position, not by name: a
/// lookup by name hashes the name for every column of every row.
pub(crate) mod column {
    pub(crate) const ID: usize = 0;
    pub(crate) const TENANT: usize = 1;
    pub(crate) const AGGREGATE_TYPE: usize = 2;
    pub(crate) const AGGREGATE_ID: usize = 3;
    pub(crate) const EVENT_TYPE: usize = 4;
    pub(crate) const PAYLOAD: usize = 5;
    pub(crate) const HEADERS: usize = 6;
    pub(crate) const CREATED_AT: usize = 7;
    pub(crate) const ATTEMPTS: usize = 8;
    /// `[database.columns] trace_context` (NULL when not mapped).
    pub(crate) const TRACE_CONTEXT: usize = 9;
    /// The replay marker (NULL: not a replay, or no such column).
    pub(crate) const REPLAY: usize = 10;
    /// The first extra column (`[database.columns] extra`), if any.
    pub(crate) const EXTRA: usize = 11;

    /// The column after the extra ones: SQLite's order column (to sort `RETURNING`'s rows, in
    /// no set order), PostgreSQL's fair heads' visited tenant.
    pub(crate) fn after_extra(sql: &super::LayoutSql) -> usize {
        EXTRA + sql.layout.extra.len()
    }
}

/// Reads column `index` as an id as `key` carries it.
pub(crate) fn read_id(
    row: &impl ReadRow,
    key: &KeyKind,
    index: usize,
) -> Result<OutboxId, sqlx::Error> {
    let missing = || sqlx::Error::ColumnDecode {
        index: index.to_string(),
        source: "the id is NULL".into(),
    };
    Ok(match key {
        KeyKind::Int => OutboxId::Int(row.int(index)?.ok_or_else(missing)?),
        KeyKind::Text { .. } => OutboxId::Text(row.text(index)?.ok_or_else(missing)?.into()),
    })
}

/// Decodes a claimed row: one whose columns cannot be decoded is a [`RowFailure`] under its
/// own id ([`super::Claim::rejected`]); only an unreadable id is an error of the whole claim
/// ([`StoreError::Key`]): without it the row cannot be named.
pub(crate) fn decode_claimed(
    row: &impl ReadRow,
    sql: &LayoutSql,
) -> Result<Result<OutboxRow, RowFailure>, StoreError> {
    let id = read_id(row, &sql.layout.key, column::ID).map_err(|e| unreadable_key(sql, e))?;
    Ok(
        decode_columns(row, sql, id.clone()).map_err(|error| RowFailure {
            id,
            error,
            disposition: Disposition::Dead,
        }),
    )
}

/// A claimed row's id (SQLite: or its place in claim order) could not be read.
pub(crate) fn unreadable_key(sql: &LayoutSql, e: sqlx::Error) -> StoreError {
    StoreError::Key {
        table: sql.layout.table.to_string(),
        column: sql.layout.id.to_string(),
        message: e.to_string(),
    }
}

fn decode_columns(row: &impl ReadRow, sql: &LayoutSql, id: OutboxId) -> Result<OutboxRow, String> {
    let layout = &sql.layout;
    let cannot =
        |column: &ColumnName, e: sqlx::Error| format!("cannot decode column {column}: {e}");
    let text = |index: usize, name: &ColumnName| match row.text(index) {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err(format!("column {name} is NULL")),
        Err(e) => Err(cannot(name, e)),
    };
    let tenant = match &layout.tenant {
        Some(name) => row.text(column::TENANT).map_err(|e| cannot(name, e))?,
        None => None,
    };
    // MySQL reads text and JSON payloads as utf8mb4 text (`LayoutSql::payload_expr`).
    let payload = match (sql.dialect, layout.payload_kind) {
        (Driver::Mysql, PayloadKind::Json | PayloadKind::Text) => {
            row.text(column::PAYLOAD).map(|p| p.map(String::into_bytes))
        }
        _ => row.bytes(column::PAYLOAD),
    }
    .map_err(|e| cannot(&layout.payload, e))?;
    let headers = text(column::HEADERS, &layout.headers)?;
    let mut headers = parse_headers(&headers)?;
    if let Some(name) = &layout.trace_context {
        let value = row
            .text(column::TRACE_CONTEXT)
            .map_err(|e| cannot(name, e))?;
        add_trace_context(&mut headers, value.as_deref());
    }
    // NULL: PostgreSQL and MySQL read it as now in SQL; SQLite's value is not a time.
    let created_at = row
        .time(column::CREATED_AT)
        .map_err(|e| cannot(&layout.created_at, e))?
        .unwrap_or_else(Utc::now);
    Ok(OutboxRow {
        id,
        tenant: TenantId::from_column(tenant),
        aggregate_type: text(column::AGGREGATE_TYPE, &layout.aggregate_type)?,
        aggregate_id: text(column::AGGREGATE_ID, &layout.aggregate_id)?,
        event_type: text(column::EVENT_TYPE, &layout.event_type)?,
        payload: payload.unwrap_or_default(),
        headers,
        created_at,
        attempts: row
            .int32(column::ATTEMPTS)
            .map_err(|e| format!("cannot decode column attempts: {e}"))?,
        extra: decode_extra(row, sql)?,
        replay: row
            .text(column::REPLAY)
            .map_err(|e| format!("cannot decode column replay_id: {e}"))?
            .map(Into::into),
    })
}

/// Reads the extra columns as [`LayoutSql::claimed_columns`] cast them (see `extra_expr`).
/// A value that cannot be read fails its row (`RowFailure`), naming the column.
fn decode_extra(row: &impl ReadRow, sql: &LayoutSql) -> Result<ExtraColumns, String> {
    let mut extra = Vec::with_capacity(sql.layout.extra.len());
    for (i, (name, kind)) in sql.layout.extra.iter().enumerate() {
        let index = column::EXTRA + i;
        let typed = decode_value(row, index, *kind);
        let value = match (typed, sql.dialect) {
            (Ok(value), _) => Ok(value),
            // SQLite: a value not of the declared kind comes as its text or its bytes
            // (`LayoutSql::sqlite_extra_expr`).
            (Err(e), Driver::Sqlite) => as_stored(row, index).ok_or(e),
            (Err(e), _) => Err(e),
        }
        .map_err(|e| format!("cannot decode column {name}: {e}"))?;
        extra.push((Arc::from(name.as_str()), value.unwrap_or(ColumnValue::Null)));
    }
    Ok(extra)
}

/// One extra column's value as `kind` reads it; `None` for NULL.
fn decode_value(
    row: &impl ReadRow,
    index: usize,
    kind: ValueKind,
) -> Result<Option<ColumnValue>, String> {
    let e = |e: sqlx::Error| e.to_string();
    Ok(match kind {
        ValueKind::Integer => row.int(index).map_err(e)?.map(ColumnValue::Integer),
        ValueKind::Boolean => row
            .int(index)
            .map_err(e)?
            .map(|n| ColumnValue::Boolean(n != 0)),
        ValueKind::Time(_) => row.time(index).map_err(e)?.map(ColumnValue::Timestamp),
        ValueKind::Bytes => row.bytes(index).map_err(e)?.map(ColumnValue::Bytes),
        ValueKind::Text => row.text(index).map_err(e)?.map(ColumnValue::Text),
        ValueKind::Json => row.text(index).map_err(e)?.map(ColumnValue::Json),
        // Above 2^63-1 it stays the decimal text: an integer would wrap.
        ValueKind::Unsigned => {
            row.text(index)
                .map_err(e)?
                .map(|text| match text.trim().parse::<i64>() {
                    Ok(n) => ColumnValue::Integer(n),
                    Err(_) => ColumnValue::Text(text),
                })
        }
        ValueKind::Float => match row.text(index).map_err(e)? {
            Some(text) => Some(ColumnValue::Float(
                text.trim()
                    .parse()
                    .map_err(|e| format!("{text:?} is not a number: {e}"))?,
            )),
            None => None,
        },
    })
}

/// A value as its storage class has it: its text, else its bytes; `None` if neither reads.
fn as_stored(row: &impl ReadRow, index: usize) -> Option<Option<ColumnValue>> {
    if let Ok(text) = row.text(index) {
        return Some(text.map(ColumnValue::Text));
    }
    row.bytes(index).ok().map(|b| b.map(ColumnValue::Bytes))
}

/// Puts a `trace_context` column's `traceparent`/`tracestate` into the row's headers, where
/// the relay (and the plugin) find them, in place of any the `headers` column had: the
/// column is where the application's tracing library wrote them. An empty or NULL column
/// changes nothing.
fn add_trace_context(headers: &mut Headers, column: Option<&str>) {
    use crate::trace::context::{TRACEPARENT, TRACESTATE, from_column};
    let (Some(parent), state) = from_column(column.unwrap_or_default()) else {
        return;
    };
    headers.retain(|(k, _)| {
        !k.eq_ignore_ascii_case(TRACEPARENT) && !k.eq_ignore_ascii_case(TRACESTATE)
    });
    headers.push((TRACEPARENT.to_owned(), parent.into_bytes()));
    if let Some(state) = state {
        headers.push((TRACESTATE.to_owned(), state.into_bytes()));
    }
}

/// Rows per statement where ids travel as one placeholder each (MySQL, SQLite): far below
/// either database's parameter limit, whatever `relay.batch_size` is.
pub(crate) const IDS_PER_STATEMENT: usize = 1_000;

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

/// A [`Disposition`] as the reschedule statements take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reschedule {
    /// Due again this many milliseconds after the statement (0 for dead rows).
    pub delay_ms: i64,
    pub dead: bool,
    /// Whether the attempt counts (`Wait` does not).
    pub counted: bool,
}

impl From<Disposition> for Reschedule {
    fn from(disposition: Disposition) -> Self {
        let (delay_ms, dead, counted) = match disposition {
            Disposition::Retry(d) => (millis(d), false, true),
            Disposition::Dead => (0, true, true),
            Disposition::Wait(d) => (millis(d), false, false),
        };
        Self {
            delay_ms,
            dead,
            counted,
        }
    }
}

/// The `last_error` recorded for `failure`: its error made safe to store ([`bounded`]: no NUL
/// or other control characters, at most [`MAX_STORED`] bytes), or `fixed` when the database
/// refused that (see `batch::reschedule_or_fixed`).
pub(crate) fn stored_error(failure: &RowFailure, fixed: Option<&str>) -> String {
    match fixed {
        Some(text) => text.to_owned(),
        None => bounded(&failure.error, MAX_STORED).into_owned(),
    }
}

/// Binds what a reschedule statement takes of `failure` next in `statement` (databases
/// without array parameters): id, error ([`stored_error`]), delay in ms, dead (0/1), counted
/// (0/1); returns their placeholders, in that order.
pub(crate) fn bind_failure(
    sql: &LayoutSql,
    statement: &mut Statement,
    failure: &RowFailure,
    fixed: Option<&str>,
) -> [String; 5] {
    let r = Reschedule::from(failure.disposition);
    [
        sql.bind_id(statement, &failure.id),
        statement.param(Param::Text(stored_error(failure, fixed))),
        statement.param(Param::Int(r.delay_ms)),
        statement.param(Param::Int(r.dead.into())),
        statement.param(Param::Int(r.counted.into())),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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

    #[test]
    fn dispositions_become_delay_dead_and_counted() {
        let wait = Reschedule::from(Disposition::Wait(Duration::from_millis(1500)));
        assert_eq!(
            (wait.delay_ms, wait.dead, wait.counted),
            (1500, false, false)
        );
        let dead = Reschedule::from(Disposition::Dead);
        assert!(dead.dead && dead.counted);
    }
}
