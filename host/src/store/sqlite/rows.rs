//! SQLite's rows: claimed rows with their place in claim order, time as Sluice's SQLite
//! columns hold it, and the shared statements run on its connections
//! ([`crate::store::statement`]).

use chrono::{DateTime, Utc};
use sqlx::sqlite::{Sqlite, SqliteRow};

use crate::model::{OutboxId, OutboxRow};
use crate::store::layout_sql::LayoutSql;
use crate::store::rows::{column, decode_claimed, unreadable_key};
use crate::store::statement::{ReadRow, impl_execute};
use crate::store::{RowFailure, StoreError};

impl_execute!(Sqlite, SqliteRow, i64, from_ms);

/// Now, as milliseconds since the Unix epoch (how Sluice's time columns hold time).
pub(super) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// Milliseconds since the epoch as a time (the epoch itself for values out of range).
pub(super) fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// A claimed row with its place in claim order (`RETURNING` gives rows in no set order).
pub(super) struct Claimed {
    pub order: (i64, OutboxId),
    pub row: Result<OutboxRow, RowFailure>,
}

/// Decodes a claimed row ([`decode_claimed`]) and its place in claim order.
pub(super) fn decode_row(row: &SqliteRow, sql: &LayoutSql) -> Result<Claimed, StoreError> {
    let decoded = decode_claimed(row, sql)?;
    let order = row
        .int(column::CLAIM_ORDER)
        .and_then(|order| {
            order.ok_or_else(|| sqlx::Error::ColumnDecode {
                index: column::CLAIM_ORDER.to_string(),
                source: "the order column is NULL".into(),
            })
        })
        .map_err(|e| unreadable_key(sql, e))?;
    let id = match &decoded {
        Ok(row) => row.id.clone(),
        Err(failure) => failure.id.clone(),
    };
    Ok(Claimed {
        order: (order, id),
        row: decoded,
    })
}
