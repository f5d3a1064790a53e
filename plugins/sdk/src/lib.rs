//! Guest SDK for Sluice plugins (`sluice:plugin@0.3.0`).
//!
//! Implement [`Plugin`] for a type and register it with [`plugin!`]; build the crate as a
//! `cdylib` with `cargo build --release --target wasm32-wasip2` and the `.wasm` file is a
//! component Sluice can load.
//!
//! ```ignore
//! use sluice_plugin_sdk::{Config, Message, OutboxRow, Plugin, TransformError};
//!
//! struct ToOneTopic { topic: String }
//!
//! impl Plugin for ToOneTopic {
//!     const NAME: &'static str = "to-one-topic";
//!     const VERSION: &'static str = env!("CARGO_PKG_VERSION");
//!
//!     fn configure(config: Config) -> Result<Self, String> {
//!         config.allow_only(&["topic"])?;
//!         Ok(Self { topic: config.require("topic")?.to_owned() })
//!     }
//!
//!     fn transform(&self, row: OutboxRow) -> Result<Vec<Message>, TransformError> {
//!         Ok(vec![Message::to(&self.topic).key(row.aggregate_id.as_bytes()).payload(row.payload)])
//!     }
//! }
//!
//! sluice_plugin_sdk::plugin!(ToOneTopic);
//! ```

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__export_world",
        default_bindings_module: "sluice_plugin_sdk::bindings",
    });
}

pub use bindings::sluice::plugin::types::{
    ColumnValue, ErrorDetail, ExtraColumn, LogLevel, OutboxRow, OutputMessage as Message,
    PluginInfo, RecordSchema, SchemaFormat, TransformError,
};

pub use placement::Placements;

/// Host logging, tagged with the tenant by the host.
pub mod log {
    pub use super::LogLevel;
    use super::bindings::sluice::plugin::host;

    pub fn log(level: LogLevel, message: &str) {
        host::log(level, message);
    }
    pub fn debug(message: &str) {
        host::log(LogLevel::Debug, message);
    }
    pub fn info(message: &str) {
        host::log(LogLevel::Info, message);
    }
    pub fn warn(message: &str) {
        host::log(LogLevel::Warn, message);
    }
    pub fn error(message: &str) {
        host::log(LogLevel::Error, message);
    }
}

/// Adds `delta` to a host-side counter named `name`.
pub fn counter_add(name: &str, delta: u64) {
    bindings::sluice::plugin::host::counter_add(name, delta);
}

/// What a plugin implements. One value is created per tenant instance by
/// [`Plugin::configure`] and used for every row of that tenant.
pub trait Plugin: Sized + Send + 'static {
    const NAME: &'static str;
    const VERSION: &'static str;

    /// JSON Schema of the accepted config, shown by `sluice plugin check`.
    fn config_schema() -> Option<String> {
        None
    }

    /// Schemas of the records this plugin emits (by full name, as [`Message::value_record`]
    /// names them): a tenant with `auto_register = true` and no schema file of its own
    /// registers them in its Schema Registry.
    fn schemas() -> Vec<RecordSchema> {
        Vec::new()
    }

    /// Builds the plugin from the tenant's `config` table; an `Err` at start-up quarantines
    /// the tenant with this message (its rows wait; with `strict_startup` it stops `sluice run`).
    fn configure(config: Config) -> Result<Self, String>;

    /// Zero messages drop the row, several fan it out.
    fn transform(&self, row: OutboxRow) -> Result<Vec<Message>, TransformError>;

    /// Defaults to calling [`Plugin::transform`] per row.
    fn transform_batch(&self, rows: Vec<OutboxRow>) -> Vec<Result<Vec<Message>, TransformError>> {
        rows.into_iter().map(|row| self.transform(row)).collect()
    }
}

/// The `config` table of a tenant, as string pairs.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pairs: Vec<(String, String)>,
}

impl Config {
    pub fn new(pairs: Vec<(String, String)>) -> Self {
        Self { pairs }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn get_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.get(key).unwrap_or(default)
    }

    pub fn require(&self, key: &str) -> Result<&str, String> {
        self.get(key)
            .ok_or_else(|| format!("missing required config key {key:?}"))
    }

    /// Refuses keys other than `known`, so a typo in `sluice.toml` is reported, not ignored.
    pub fn allow_only(&self, known: &[&str]) -> Result<(), String> {
        match self
            .pairs
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            Some((k, _)) => Err(format!(
                "unknown config key {k:?} (known keys: {})",
                known.join(", ")
            )),
            None => Ok(()),
        }
    }
}

impl Message {
    /// A message to `topic` with no key, no payload (a tombstone until [`Message::payload`])
    /// and no headers.
    pub fn to(topic: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            key: None,
            payload: None,
            headers: Vec::new(),
            partition: None,
            value_record: None,
            key_record: None,
            timestamp_ms: None,
        }
    }

    pub fn key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = Some(key.into());
        self
    }

    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = Some(payload.into());
        self
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn headers(mut self, headers: impl IntoIterator<Item = (String, Vec<u8>)>) -> Self {
        self.headers.extend(headers);
        self
    }

    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// With `value_format` set for the tenant: the Avro record or Protobuf message (full
    /// name) the value is encoded as, in place of the section's `value_record` — e.g.
    /// `OrderCreated` and `OrderShipped` on one topic with the record-name strategy.
    pub fn value_record(mut self, record: impl Into<String>) -> Self {
        self.value_record = Some(record.into());
        self
    }

    /// As [`Message::value_record`], for the key (`key_format`).
    pub fn key_record(mut self, record: impl Into<String>) -> Self {
        self.key_record = Some(record.into());
        self
    }

    /// The record's timestamp, in milliseconds since the epoch (Kafka's record timestamp;
    /// docs/brokers.md, "Timestamps"). Unset: the producer's time.
    pub fn timestamp_ms(mut self, ms: i64) -> Self {
        self.timestamp_ms = Some(ms);
        self
    }

    /// The row's `created_at` as the timestamp, as the reference plugins and the builtin
    /// router do (none for a time before the epoch, which Kafka refuses).
    pub fn timestamp_of(mut self, row: &OutboxRow) -> Self {
        self.timestamp_ms = (row.created_at_ms >= 0).then_some(row.created_at_ms);
        self
    }
}

impl ColumnValue {
    /// The value as a header carries it, as the builtin router writes it: text and JSON as
    /// UTF-8, integers and floats in decimal, booleans `true`/`false`, timestamps as
    /// milliseconds since the epoch in decimal, bytes as they are; `None` for NULL.
    pub fn header_value(&self) -> Option<Vec<u8>> {
        Some(match self {
            Self::Null => return None,
            Self::Text(s) | Self::Json(s) => s.as_bytes().to_vec(),
            Self::Integer(n) => n.to_string().into_bytes(),
            Self::Float(f) => f.to_string().into_bytes(),
            Self::Boolean(b) => b.to_string().into_bytes(),
            Self::TimestampMs(ms) => ms.to_string().into_bytes(),
            Self::Bytes(b) => b.clone(),
        })
    }
}

/// Looks up an extra column (`[database.columns] extra`) of the row by name.
pub fn extra<'a>(row: &'a OutboxRow, name: &str) -> Option<&'a ColumnValue> {
    row.extra.iter().find(|c| c.name == name).map(|c| &c.value)
}

impl TransformError {
    pub fn retryable(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Retryable(ErrorDetail {
            code: code.into(),
            message: message.into(),
        })
    }

    pub fn permanent(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Permanent(ErrorDetail {
            code: code.into(),
            message: message.into(),
        })
    }
}

/// Looks up a row header by name (first match).
pub fn header<'a>(row: &'a OutboxRow, name: &str) -> Option<&'a [u8]> {
    row.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_slice())
}

/// `additional_placement`, as the host's builtin router reads it (Debezium's
/// `table.fields.additional.placement`): `column:header[:alias]` and `column:partition`,
/// comma-separated. Same parsing, same output, same errors as the builtin, so a tenant moving
/// from the builtin to its own plugin publishes the same messages.
// Inline rather than a file of its own: `sluice plugin new` vendors this one file.
mod placement {
    use crate::{Message, OutboxRow, TransformError, extra};

    /// Where one extra column goes.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Target {
        Header(String),
        Partition,
    }

    /// A parsed `additional_placement` list.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct Placements(Vec<(String, Target)>);

    impl Placements {
        /// Parses `column:header[:alias],column:partition,…`; empty: none. `envelope` is refused:
        /// the payload is published unchanged.
        pub fn parse(spec: &str) -> Result<Self, String> {
            let mut placements = Vec::new();
            for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
                let target = match parts.as_slice() {
                    [column, "header"] => Target::Header((*column).to_owned()),
                    [_, "header", alias] if !alias.is_empty() => {
                        Target::Header((*alias).to_owned())
                    }
                    [_, "partition"] => Target::Partition,
                    [_, "envelope", ..] => {
                        return Err(format!(
                            "additional_placement {entry:?}: envelope is not supported (the payload \
                             is published unchanged); use header or partition"
                        ));
                    }
                    _ => {
                        return Err(format!(
                            "additional_placement {entry:?}: expected column:header[:alias] or \
                             column:partition"
                        ));
                    }
                };
                if parts[0].is_empty() {
                    return Err(format!(
                        "additional_placement {entry:?}: the column is empty"
                    ));
                }
                placements.push((parts[0].to_owned(), target));
            }
            Ok(Self(placements))
        }

        /// `message` with the row's placed extra columns: headers appended in list order (none
        /// for NULL), the partition set from an integer column. A column the row lacks, or a
        /// partition that is not an integer from 0 to 2^31-1, is a permanent error.
        pub fn apply(
            &self,
            row: &OutboxRow,
            mut message: Message,
        ) -> Result<Message, TransformError> {
            for (column, target) in &self.0 {
                let Some(value) = extra(row, column) else {
                    return Err(TransformError::permanent(
                        "missing-extra-column",
                        format!(
                            "additional_placement names column {column}, which the row does not \
                             carry (list it in [database.columns] extra)"
                        ),
                    ));
                };
                match target {
                    Target::Header(name) => {
                        if let Some(bytes) = value.header_value() {
                            message.headers.push((name.clone(), bytes));
                        }
                    }
                    Target::Partition => match value {
                        crate::ColumnValue::Null => {}
                        crate::ColumnValue::Integer(n) if (0..=i64::from(i32::MAX)).contains(n) => {
                            message.partition = i32::try_from(*n).ok();
                        }
                        _ => {
                            return Err(TransformError::permanent(
                                "invalid-partition",
                                format!(
                                    "column {column} is placed as the partition but does not hold \
                                     an integer from 0 to 2147483647"
                                ),
                            ));
                        }
                    },
                }
            }
            Ok(message)
        }
    }
}

#[doc(hidden)]
pub mod __private {
    use super::*;
    use std::sync::Mutex;

    pub use bindings::exports::sluice::plugin::transformer::Guest;

    /// The configured plugin value of this instance.
    pub struct State<P>(Mutex<Option<P>>);

    impl<P: Plugin> Default for State<P> {
        fn default() -> Self {
            Self::new()
        }
    }

    impl<P: Plugin> State<P> {
        pub const fn new() -> Self {
            Self(Mutex::new(None))
        }

        pub fn configure(&self, config: Vec<(String, String)>) -> Result<(), String> {
            let plugin = P::configure(Config::new(config))?;
            *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(plugin);
            Ok(())
        }

        pub fn with<R>(&self, f: impl FnOnce(&P) -> R, not_configured: impl FnOnce() -> R) -> R {
            let guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
            match guard.as_ref() {
                Some(p) => f(p),
                None => not_configured(),
            }
        }
    }

    pub fn info<P: Plugin>() -> PluginInfo {
        PluginInfo {
            name: P::NAME.to_owned(),
            version: P::VERSION.to_owned(),
            config_schema: P::config_schema(),
            schemas: P::schemas(),
        }
    }

    pub fn not_configured() -> TransformError {
        TransformError::permanent("not-configured", "configure was not called")
    }
}

/// Exports a [`Plugin`] implementation as the component's `sluice:plugin/transformer`.
#[macro_export]
macro_rules! plugin {
    ($plugin:ty) => {
        struct __SluiceExport;

        static __SLUICE_STATE: $crate::__private::State<$plugin> =
            $crate::__private::State::new();

        impl $crate::__private::Guest for __SluiceExport {
            fn info() -> $crate::PluginInfo {
                $crate::__private::info::<$plugin>()
            }

            fn configure(config: Vec<(String, String)>) -> Result<(), String> {
                __SLUICE_STATE.configure(config)
            }

            fn transform(
                row: $crate::OutboxRow,
            ) -> Result<Vec<$crate::Message>, $crate::TransformError> {
                __SLUICE_STATE.with(
                    |p| <$plugin as $crate::Plugin>::transform(p, row),
                    || Err($crate::__private::not_configured()),
                )
            }

            fn transform_batch(
                rows: Vec<$crate::OutboxRow>,
            ) -> Vec<Result<Vec<$crate::Message>, $crate::TransformError>> {
                let n = rows.len();
                __SLUICE_STATE.with(
                    |p| <$plugin as $crate::Plugin>::transform_batch(p, rows),
                    || (0..n).map(|_| Err($crate::__private::not_configured())).collect(),
                )
            }
        }

        $crate::bindings::__export_world!(__SluiceExport with_types_in $crate::bindings);
    };
}
