//! The values every part of Sluice talks about: an outbox row as claimed, its id, its tenant,
//! its headers; the messages a row becomes, or why it became none. Nothing here knows about
//! databases, plugins, encodings or brokers.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};

/// Primary key of an outbox row, as the database holds it: an integer of any width (`int2`,
/// `int4`, `int8`, serial or identity), or anything else (a `uuid`, a ULID in `text`) carried
/// as its text form. Sluice never invents an id: the store decodes the key it claimed and
/// marks exactly those keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OutboxId {
    /// An integer key (`int2`, `int4`, `int8`), widened.
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

/// A row's tenant: the value of its tenant column, or none (the column is NULL, or the table
/// has no tenant column). Rows without a tenant run `[plugins.default]`; they are a tenant of
/// their own, distinct from a tenant whose name is `default` (`[tenants.default]`), though
/// plugins see both as `"default"` (the WIT contract).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(Option<Arc<str>>);

impl TenantId {
    /// What plugins (and the `sluice-tenant` header) get for rows without a tenant.
    pub const DEFAULT_NAME: &'static str = "default";

    /// Rows without a tenant.
    pub fn none() -> Self {
        Self(None)
    }

    /// The tenant called `name` (a `[tenants.<name>]` key, a tenant column's value).
    pub fn named(name: impl Into<Arc<str>>) -> Self {
        Self(Some(name.into()))
    }

    /// From a tenant column's value, NULL being no tenant.
    pub fn from_column(value: Option<String>) -> Self {
        Self(value.map(Into::into))
    }

    /// The tenant's name; `None` for rows without a tenant.
    pub fn name(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// The name as plugins see it: [`TenantId::DEFAULT_NAME`] for rows without a tenant.
    pub fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or(Self::DEFAULT_NAME)
    }
}

impl std::fmt::Display for TenantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(name) => f.write_str(name),
            None => f.write_str("(no tenant)"),
        }
    }
}

/// Kafka-style headers: ordered, duplicates allowed, binary values.
pub type Headers = Vec<(String, Vec<u8>)>;

/// One claimed outbox row, decoded.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    /// The row's primary key.
    pub id: OutboxId,
    /// The tenant column's value, if any.
    pub tenant: TenantId,
    /// Kind of entity the event is about, as text.
    pub aggregate_type: String,
    /// Entity the event is about, as text; with `ordering = "key"`, part of the key.
    pub aggregate_id: String,
    /// What happened to the entity, as text.
    pub event_type: String,
    /// JSON text for `json`/`jsonb`, raw bytes for `bytea`, UTF-8 for `text`; empty for NULL.
    pub payload: Vec<u8>,
    /// From the `headers` column's JSON object of strings; empty for NULL.
    pub headers: Headers,
    /// When the row was written (a `timestamp` without time zone read as UTC); the claim's
    /// time for NULL.
    pub created_at: DateTime<Utc>,
    /// Delivery attempts already made (0 on the first claim).
    pub attempts: i32,
    /// The `[database.columns] extra` columns, in the order configured (`*`: table order).
    pub extra: ExtraColumns,
    /// The `sluice replay` that made this sent row due again (stamped on its messages as the
    /// `sluice-replay` header); `None` for a row's own delivery.
    pub replay: Option<Arc<str>>,
}

/// A row's extra columns (`[database.columns] extra`), name and value, in configured order.
pub type ExtraColumns = Vec<(Arc<str>, ColumnValue)>;

/// The value of an extra column, typed as the database holds it (docs/configuration.md,
/// `extra`: which column types read as which).
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnValue {
    /// SQL NULL.
    Null,
    /// Text, and every type without a variant of its own (`numeric`, `uuid`, `date`, …), as
    /// the database prints it.
    Text(String),
    /// Any integer type.
    Integer(i64),
    /// `real`, `double precision`, `float`.
    Float(f64),
    /// `boolean` (MySQL/MariaDB: `tinyint(1)`).
    Boolean(bool),
    /// A timestamp, read as UTC like `created_at`.
    Timestamp(DateTime<Utc>),
    /// `json`/`jsonb`: the JSON text.
    Json(String),
    /// Binary types: the raw bytes.
    Bytes(Vec<u8>),
}

impl ColumnValue {
    /// The value as a header carries it: text and JSON as UTF-8, integers and floats in
    /// decimal, booleans `true`/`false`, timestamps as milliseconds since the epoch in
    /// decimal, bytes as they are; `None` for NULL (no header).
    pub fn header_value(&self) -> Option<Vec<u8>> {
        Some(match self {
            Self::Null => return None,
            Self::Text(s) | Self::Json(s) => s.as_bytes().to_vec(),
            Self::Integer(n) => n.to_string().into_bytes(),
            Self::Float(f) => f.to_string().into_bytes(),
            Self::Boolean(b) => b.to_string().into_bytes(),
            Self::Timestamp(t) => t.timestamp_millis().to_string().into_bytes(),
            Self::Bytes(b) => b.clone(),
        })
    }
}

/// Which broker a message goes to: chosen per plugin section (`broker = "…"`), so per tenant.
/// One relay may publish to several at once (docs/brokers.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Broker {
    /// Any Kafka-protocol broker, through librdkafka (`[kafka]`).
    #[default]
    Kafka,
    /// NATS JetStream (`[nats]`).
    Nats,
    /// RabbitMQ, AMQP 0-9-1 (`[rabbitmq]`).
    Rabbitmq,
    /// Redis Streams (`[redis]`).
    Redis,
}

impl Broker {
    /// Every broker, in the order the docs list them.
    pub const ALL: [Broker; 4] = [Self::Kafka, Self::Nats, Self::Rabbitmq, Self::Redis];

    /// The name used in the configuration, in metrics' `broker` label and in `/readyz`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kafka => "kafka",
            Self::Nats => "nats",
            Self::Rabbitmq => "rabbitmq",
            Self::Redis => "redis",
        }
    }
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One message to publish, already validated by the plugin host. (A plugin's own answer is
/// the WIT `output-message`; a consumed Kafka record is rdkafka's `Message`.)
#[derive(Debug, Clone, PartialEq)]
pub struct OutboundMessage {
    /// The outbox row this message came from.
    pub row: OutboxId,
    /// The broker it goes to (its tenant's plugin section's `broker`).
    pub broker: Broker,
    /// Where on that broker: the Kafka topic, the NATS subject, the RabbitMQ routing key (on
    /// `[rabbitmq] exchange`), the Redis stream key.
    pub topic: String,
    /// Message key; `None`: no key.
    pub key: Option<Vec<u8>>,
    /// `None` is a tombstone.
    pub payload: Option<Vec<u8>>,
    /// In order, duplicates allowed; the host-stamped `sluice-tenant` and `sluice-outbox-id`
    /// included.
    pub headers: Headers,
    /// Partition to publish to; `None`: the producer's partitioner picks.
    pub partition: Option<i32>,
    /// How key and value are still to be encoded (the tenant's `key_format`/`value_format`);
    /// `None`: published as they are.
    pub encoding: Option<Encoding>,
    /// The record the plugin named for the value (contract 0.2.0 `value-record`), in place of
    /// the section's `value_record`.
    pub value_record: Option<String>,
    /// As `value_record`, for the key.
    pub key_record: Option<String>,
    /// The record's timestamp in milliseconds since the epoch (contract 0.3.0
    /// `timestamp-ms`; the builtin router: the row's `created_at`); `None`: the broker's or
    /// producer's time (docs/brokers.md, "Timestamps").
    pub timestamp_ms: Option<i64>,
}

/// Where the broker stored one acknowledged message, as far as its acknowledgement says: what
/// the publish span records (`[tracing]`). Small and `Copy`, so carrying it per message costs
/// nothing when tracing is off.
///
/// - Kafka: the partition and offset of the delivery report.
/// - NATS JetStream: the publish acknowledgement's stream sequence as `offset`; no partition.
/// - RabbitMQ: nothing; a publisher confirm names no position.
/// - Redis Streams: nothing; the XADD entry id (`<ms>-<seq>`) is two integers, not one
///   offset, and is left out rather than squeezed into one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delivered {
    /// The partition the broker wrote the message to (Kafka), whatever the plugin asked for.
    pub partition: Option<i32>,
    /// The message's position in what it was written to: the Kafka offset within `partition`,
    /// the JetStream stream sequence.
    pub offset: Option<i64>,
}

/// How a message's key and value are still to be encoded, in the encoding layer's own type
/// (`encoding::MessageFormats`): the plugin host attaches its tenant's formats, the encoder
/// reads them back with [`Encoding::get`], and everything between only carries them, so the
/// model knows nothing of encodings.
#[derive(Clone)]
pub struct Encoding(Arc<dyn EncodingPlan>);

/// What an [`Encoding`] may hold: a value that can be printed and compared.
pub trait EncodingPlan: Any + fmt::Debug + Send + Sync {
    /// Whether `other` holds an equal value of the same type.
    fn same_as(&self, other: &dyn EncodingPlan) -> bool;
}

impl<T: Any + fmt::Debug + PartialEq + Send + Sync> EncodingPlan for T {
    fn same_as(&self, other: &dyn EncodingPlan) -> bool {
        (other as &dyn Any).downcast_ref::<T>() == Some(self)
    }
}

impl Encoding {
    /// Carries `plan`.
    pub fn new<T: EncodingPlan>(plan: Arc<T>) -> Self {
        Self(plan)
    }

    /// The plan, if it is a `T` (the encoder fails a message whose plan is not its own type,
    /// rather than publish it unencoded).
    pub fn get<T: Any>(&self) -> Option<&T> {
        (&*self.0 as &dyn Any).downcast_ref()
    }
}

impl fmt::Debug for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for Encoding {
    fn eq(&self, other: &Self) -> bool {
        self.0.same_as(&*other.0)
    }
}

/// The messages of one row, or why the row could not be transformed.
pub type RowResult = Result<Vec<OutboundMessage>, TransformFailure>;

/// Why a row was not transformed. Every variant fails the row closed: nothing of it is
/// published.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TransformFailure {
    /// The plugin reported a transient error: the row is retried with back-off.
    #[error("plugin error (retryable) {code}: {message}")]
    Retryable {
        /// The plugin's error code (bounded).
        code: String,
        /// The plugin's error text (bounded).
        message: String,
    },
    /// The plugin refused the row for good: it goes dead at once.
    #[error("plugin error (permanent) {code}: {message}")]
    Permanent {
        /// The plugin's error code (bounded).
        code: String,
        /// The plugin's error text (bounded).
        message: String,
    },
    /// Trap or memory cap; the instance was discarded.
    #[error("{0}")]
    Trapped(String),
    /// The call ran into its `call_timeout`; the instance was discarded and the tenant paused.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// Not run in this batch: the tenant's plugin used up the batch's time budget, or was busy
    /// in another batch. The row is put back untouched (no attempt counted).
    #[error("deferred: {0}")]
    Deferred(String),
    /// The plugin returned something the host refuses to publish.
    #[error("invalid plugin output: {0}")]
    InvalidOutput(String),
    /// Neither a `[tenants.<name>]` entry nor `[plugins.default]` covers the row's tenant.
    #[error("no plugin for tenant {0:?}: add [tenants.{0}] or [plugins.default]")]
    NoPlugin(TenantId),
    /// The message does not fit its registry schema (`value_format`/`key_format`): the row's
    /// own fault, dead at once like a permanent plugin error.
    #[error("schema mismatch: {0}")]
    SchemaMismatch(String),
    /// No schema to encode with (registry down, subject or version missing, schema of another
    /// format): retried without counting an attempt, never dead-lettered.
    #[error("schema unavailable: {0}")]
    SchemaUnavailable(String),
    /// The tenant's instance could not be (re)created.
    #[error("plugin unavailable: {0}")]
    Unavailable(String),
    /// The tenant's circuit breaker is open, or the tenant is quarantined; the row was not
    /// run and waits `remaining` without an attempt being counted.
    #[error("{}", paused_message(tenant, remaining, reason))]
    Paused {
        /// The paused tenant.
        tenant: TenantId,
        /// Time left until its rows are tried again.
        remaining: std::time::Duration,
        /// Breaker or quarantine.
        reason: PauseReason,
    },
}

/// Why a tenant's rows are not run for now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PauseReason {
    /// Its circuit breaker is open.
    CircuitBreaker,
    /// Its plugin failed to load, instantiate or configure (the reason, bounded); retried
    /// with back-off and on reload.
    Quarantined(String),
}

fn paused_message(
    tenant: &TenantId,
    remaining: &std::time::Duration,
    reason: &PauseReason,
) -> String {
    let remaining = humantime::format_duration(*remaining);
    match reason {
        PauseReason::CircuitBreaker => {
            format!("tenant {tenant} paused by its circuit breaker for another {remaining}")
        }
        PauseReason::Quarantined(why) => format!(
            "tenant {tenant} quarantined: its plugin failed to start ({why}); next try in {remaining}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoding_is_read_back_only_as_its_own_type_and_compares_by_value() {
        let plan = Encoding::new(Arc::new(7_u32));
        assert_eq!(plan.get::<u32>(), Some(&7));
        assert_eq!(plan.get::<String>(), None);
        assert_eq!(plan, Encoding::new(Arc::new(7_u32)), "equal values");
        assert_ne!(plan, Encoding::new(Arc::new(8_u32)));
        assert_ne!(plan, Encoding::new(Arc::new(7_u64)), "another type");
        assert_eq!(format!("{plan:?}"), "7");
    }
}
