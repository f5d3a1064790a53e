//! The values every part of Sluice talks about: an outbox row as claimed, its id, its tenant,
//! its headers. Nothing here knows about databases, plugins or brokers.

use chrono::{DateTime, Utc};

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

/// One message to publish, already validated by the plugin host. (A plugin's own answer is
/// the WIT `output-message`; a consumed Kafka record is rdkafka's `Message`.)
#[derive(Debug, Clone, PartialEq)]
pub struct OutboundMessage {
    /// The outbox row this message came from.
    pub row: OutboxId,
    pub topic: String,
    pub key: Option<Vec<u8>>,
    /// `None` is a tombstone.
    pub payload: Option<Vec<u8>>,
    pub headers: Headers,
    pub partition: Option<i32>,
}
