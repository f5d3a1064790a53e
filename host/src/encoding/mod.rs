//! Schema Registry encoding (docs/schema-registry.md), the relay's step between plugins and
//! sink: the plugin's JSON encoded as Avro, Protobuf or JSON Schema against a
//! Confluent-compatible registry and framed in Confluent's wire format, so any Confluent
//! deserializer reads what Sluice writes. A leaf below the relay: it knows messages
//! ([`crate::model`]), not plugins, stores or sinks.
//!
//! Read in this order:
//! - [`Encoder`]: the seam the relay calls; [`SchemaEncoder`] implements it, with its caches
//! - [`settings`]: the per-plugin-section keys (`value_format`, …), resolved per tenant
//! - [`source`]: where schemas come from ([`SchemaSource`]): [`registry`] (the REST API,
//!   `[schema_registry]`, whether it answers) or [`files`] (for `sluice plugin test`)
//! - [`format`]: JSON to each format; [`framing`]: the 5-byte header (and Protobuf's indexes)

pub mod encoder;
pub mod files;
pub mod format;
pub mod framing;
pub mod registry;
pub mod settings;
pub mod source;

use futures::future::BoxFuture;

pub use encoder::{EncodeError, SchemaEncoder};
pub use files::FileSchemas;
pub use registry::RegistryClient;
pub use registry::settings::RegistrySettings;
pub use registry::state::RegistryState;
pub use settings::{FieldEncoding, Format, FormatsSpec, MessageFormats};
pub use source::{RegisteredSchema, RegistryError, SchemaSource};

use crate::model::RowResult;

/// The relay's encoding step.
pub trait Encoder: Send + Sync {
    /// Encodes the messages of every transformed row that carry an
    /// [`Encoding`](crate::model::Encoding); a row with a message that cannot be encoded
    /// fails as a whole (nothing of it is published, raw or otherwise). One result per row,
    /// in order.
    fn encode_rows(&self, results: Vec<RowResult>) -> BoxFuture<'_, Vec<RowResult>>;
}
