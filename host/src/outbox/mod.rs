//! The outbox store seam: what the relay needs from the database, and the row types it sees.
//!
//! The relay never builds SQL; it claims a [`ClaimedBatch`] from an [`OutboxStore`] and hands
//! the batch back with a [`BatchOutcome`]. A batch owns an open transaction whose row locks keep
//! other relays off its rows until [`ClaimedBatch::complete`] commits (or the batch is dropped,
//! which rolls back).

mod columns;
pub mod dead;
pub mod notify;
mod postgres;
pub mod prune;
pub mod schema;
mod table;

use std::future::Future;

use chrono::{DateTime, Utc};

pub use columns::{
    ColumnMap, ColumnName, ColumnNameError, DEFAULT_ORDER_COLUMN, TableSpec, TenantColumn,
};
pub use postgres::{Backlog, PgBatch, PgOutbox, StoreOptions, connect, connect_options, migrate};
pub use schema::{KeyKind, Layout, PayloadKind, SchemaError};
pub use table::{TableName, TableNameError};

pub use crate::retry::Disposition;

/// Primary key of an outbox row, as the database holds it: an integer of any width (`int2`,
/// `int4`, `int8`, serial or identity), or anything else (a `uuid`, a ULID in `text`) carried
/// as its text form. Sluice never invents an id: the store decodes the key it claimed and
/// marks exactly those keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OutboxId {
    Int(i64),
    /// The key's text form; the store casts it back to the column's type in SQL.
    Text(std::sync::Arc<str>),
}

impl From<i64> for OutboxId {
    fn from(id: i64) -> Self {
        Self::Int(id)
    }
}

impl std::fmt::Display for OutboxId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Int(id) => id.fmt(f),
            Self::Text(id) => f.write_str(id),
        }
    }
}

impl serde::Serialize for OutboxId {
    /// A JSON number for integer keys, a string otherwise.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Int(id) => s.serialize_i64(*id),
            Self::Text(id) => s.serialize_str(id),
        }
    }
}

/// Tenant name as plugins see it; rows with a NULL tenant belong to [`TenantId::DEFAULT`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(pub String);

impl TenantId {
    pub const DEFAULT: &'static str = "default";

    pub fn from_column(value: Option<String>) -> Self {
        Self(value.unwrap_or_else(|| Self::DEFAULT.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TenantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Kafka-style headers: ordered, duplicates allowed, binary values.
pub type Headers = Vec<(String, Vec<u8>)>;

/// One claimed outbox row, decoded.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: OutboxId,
    pub tenant: TenantId,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    /// JSON text for `json`/`jsonb`, raw bytes for `bytea`, UTF-8 for `text`; empty for NULL.
    pub payload: Vec<u8>,
    pub headers: Headers,
    pub created_at: DateTime<Utc>,
    /// Delivery attempts already made (0 on the first claim).
    pub attempts: i32,
}

/// A row that could not be delivered this time, why, and what happens to it next.
#[derive(Debug, Clone, PartialEq)]
pub struct RowFailure {
    pub id: OutboxId,
    pub error: String,
    pub disposition: Disposition,
}

/// What happened to a claimed batch, as the relay hands it back to the store.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    /// Rows whose every message was acknowledged (or that produced none): mark them sent.
    pub sent: Vec<OutboxId>,
    /// Rows to reschedule or dead-letter, with the error recorded.
    pub failed: Vec<RowFailure>,
}

/// Errors of the outbox store. Callers branch on them: a [`StoreError::MarkMismatch`] means the
/// batch was rolled back and will be re-claimed (and re-published) later.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error(
        "marking rows affected {affected} rows, expected {expected}; batch rolled back \
         (another process changed the claimed rows)"
    )]
    MarkMismatch { expected: u64, affected: u64 },
    /// The table lacks a column Sluice needs, or has one of a type it cannot use.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// A claimed row's id could not be read, so the row cannot be named (the schema check
    /// rules this out unless the table changes under a running relay).
    #[error(
        "outbox table {table}: a claimed row's id column {column} could not be read: {message}"
    )]
    Key {
        table: String,
        column: String,
        message: String,
    },
    /// An id given by a person (`sluice dead replay --id`) is not one of this table's ids.
    #[error("{id:?} is not an id of outbox table {table} ({expected})")]
    InvalidId {
        table: String,
        id: String,
        expected: &'static str,
    },
}

/// Where outbox rows come from. Implementations: [`PgOutbox`].
pub trait OutboxStore: Send + Sync + 'static {
    type Batch: ClaimedBatch;

    /// Whether any row is due (as [`OutboxStore::claim`] would see it, ignoring locks), in
    /// one cheap statement without a transaction: what an idle relay asks before claiming.
    fn has_due(&self, paused: &[TenantId])
    -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Claims up to `limit` unsent, due rows, oldest first, skipping rows locked by others and
    /// rows of the `paused` tenants. The returned batch holds the transaction open.
    fn claim(
        &self,
        limit: usize,
        paused: &[TenantId],
    ) -> impl Future<Output = Result<Claim<Self::Batch>, StoreError>> + Send;

    /// Records `outcome` in a fresh transaction after [`ClaimedBatch::complete`] failed (its
    /// transaction rolled back, but the batch's messages may already be published): re-locks
    /// exactly the rows of `outcome` that are still unsent, skipping rows locked by another
    /// relay (`FOR UPDATE SKIP LOCKED`), marks or reschedules each row it got, and commits.
    /// A row the database refuses to change (a trigger raising, a constraint) is reported in
    /// [`Settlement::refused`] and does not keep the other rows from being recorded.
    fn settle(
        &self,
        outcome: &BatchOutcome,
    ) -> impl Future<Output = Result<Settlement, StoreError>> + Send;
}

/// What [`OutboxStore::settle`] recorded.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Settlement {
    /// Rows marked sent.
    pub marked: Vec<OutboxId>,
    /// Rows rescheduled or dead-lettered.
    pub rescheduled: Vec<OutboxId>,
    /// Rows not touched: locked by another relay, or no longer unsent.
    pub skipped: Vec<OutboxId>,
    /// Rows the database refused to change, with its error.
    pub refused: Vec<(OutboxId, String)>,
}

/// The result of a claim: the rows, and the batch handle that holds their locks.
pub struct Claim<B> {
    pub batch: B,
    /// Rows decoded successfully, in claim order (see [`Layout::order_by`]).
    pub rows: Vec<OutboxRow>,
    /// Rows whose columns could not be decoded (e.g. malformed `headers`); they are
    /// dead-lettered (retrying cannot help until someone fixes the row), never published.
    pub rejected: Vec<RowFailure>,
}

impl<B> Claim<B> {
    /// Rows claimed, decoded or not.
    pub fn len(&self) -> usize {
        self.rows.len() + self.rejected.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The open transaction that locks a claimed set of rows.
pub trait ClaimedBatch: Send {
    /// Marks `outcome.sent`, reschedules or dead-letters `outcome.failed`, checks the
    /// affected-row counts and commits. On a count mismatch it rolls back and returns [`StoreError::MarkMismatch`].
    fn complete(self, outcome: BatchOutcome)
    -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rolls back: every row becomes claimable again, unchanged.
    fn abandon(self) -> impl Future<Output = Result<(), StoreError>> + Send;
}
