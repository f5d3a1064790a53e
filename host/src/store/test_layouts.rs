//! Layouts of two typical tables, for the SQL builders' tests (every dialect's).

use super::schema::PayloadKind;
use super::schema::{KeyKind, Layout, TimeKind};
use super::{ColumnName, TableName};

pub(super) fn col(name: &str) -> ColumnName {
    ColumnName::parse(name).unwrap()
}

/// Debezium's default table (uuid id, no tenant) after `sluice migrate`.
pub(super) fn debezium_layout() -> Layout {
    Layout {
        table: TableName::parse("outboxevent").unwrap(),
        id: col("id"),
        key: KeyKind::Text {
            cast: "uuid".into(),
        },
        tenant: None,
        aggregate_type: col("aggregatetype"),
        aggregate_id: col("aggregateid"),
        event_type: col("type"),
        payload: col("payload"),
        payload_kind: PayloadKind::Json,
        headers: col("headers"),
        created_at: col("created_at"),
        created_at_kind: TimeKind::WithZone,
        order: col("sluice_seq"),
        keyed_with_created_at: false,
        extra: Vec::new(),
        trace_context: None,
        replay: false,
    }
}

pub(super) fn sluice_layout() -> Layout {
    Layout {
        table: TableName::parse("outbox").unwrap(),
        id: col("id"),
        key: KeyKind::Int,
        tenant: Some(col("tenant")),
        aggregate_type: col("aggregate_type"),
        aggregate_id: col("aggregate_id"),
        event_type: col("event_type"),
        payload: col("payload"),
        payload_kind: PayloadKind::Json,
        headers: col("headers"),
        created_at: col("created_at"),
        created_at_kind: TimeKind::WithZone,
        order: col("id"),
        keyed_with_created_at: false,
        extra: Vec::new(),
        trace_context: None,
        replay: true,
    }
}

pub(super) fn squash(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}
