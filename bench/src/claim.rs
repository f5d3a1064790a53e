//! Sluice's claim query and the row it returns, for the two scenarios that do the relay's SQL
//! themselves (sql-ceiling and the naive relay).

use anyhow::Context;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

/// Rows per claim: Sluice's default `relay.batch_size`.
pub const BATCH_SIZE: i64 = 500;

/// The claim `sluice run` issues for a `jsonb` payload column with `ordering = "none"`
/// (host/src/outbox/postgres.rs), minus the paused-tenants filter; `$1` is the batch size.
pub fn claim_sql(table: &str) -> String {
    format!(
        "SELECT o.id, o.tenant::text, o.aggregate_type::text, o.aggregate_id::text,
                o.event_type::text, convert_to(o.payload::text, 'UTF8') AS payload,
                COALESCE(o.headers::text, '{{}}'), o.created_at, o.attempts
           FROM {table} AS o
          WHERE o.published_at IS NULL AND o.dead_at IS NULL
            AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())
          ORDER BY o.id
          LIMIT $1
            FOR UPDATE OF o SKIP LOCKED"
    )
}

/// One claimed row, decoded the way the relay decodes it.
#[derive(Debug)]
pub struct ClaimedRow {
    pub id: i64,
    pub tenant: Option<String>,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: Vec<u8>,
    /// The row's headers as JSON object text.
    pub headers: String,
    pub created_at: DateTime<Utc>,
    pub attempts: i32,
}

impl ClaimedRow {
    pub fn decode(row: &PgRow) -> anyhow::Result<Self> {
        let id: i64 = row.try_get(0).context("claimed row: id")?;
        let column = |name: &'static str| move || format!("claimed row {id}: {name}");
        Ok(Self {
            id,
            tenant: row.try_get(1).with_context(column("tenant"))?,
            aggregate_type: row.try_get(2).with_context(column("aggregate_type"))?,
            aggregate_id: row.try_get(3).with_context(column("aggregate_id"))?,
            event_type: row.try_get(4).with_context(column("event_type"))?,
            payload: row.try_get(5).with_context(column("payload"))?,
            headers: row.try_get(6).with_context(column("headers"))?,
            created_at: row.try_get(7).with_context(column("created_at"))?,
            attempts: row.try_get(8).with_context(column("attempts"))?,
        })
    }

    /// Bytes held by the decoded row; sql-ceiling sums it so the decoding is real work the
    /// compiler cannot drop.
    pub fn decoded_bytes(&self) -> usize {
        std::mem::size_of_val(&self.id)
            + self.tenant.as_ref().map_or(0, String::len)
            + self.aggregate_type.len()
            + self.aggregate_id.len()
            + self.event_type.len()
            + self.payload.len()
            + self.headers.len()
            + std::mem::size_of_val(&self.created_at)
            + std::mem::size_of_val(&self.attempts)
    }
}
