//! Schema Registry support (docs/schema-registry.md): the plugin's JSON encoded as Avro,
//! Protobuf or JSON Schema against a Confluent-compatible registry and framed in Confluent's
//! wire format, so any Confluent deserializer reads what Sluice writes.
//!
//! Read in this order:
//! - [`settings`]: `[schema_registry]` and the per-plugin-section keys (`value_format`, …)
//! - [`encoder`]: the relay's step between plugins and sink, and its caches
//! - [`registry`]: the registry's REST API ([`SchemaSource`] is the seam)
//! - [`avro`], [`protobuf`], [`json_schema`]: JSON to each format, errors naming the field
//! - [`files`]: schemas from files, for `sluice plugin test`
//! - [`wire`]: the 5-byte header (and Protobuf's message indexes)
//! - [`state`]: whether the registry answers, for `/readyz`

pub mod avro;
pub mod encoder;
pub mod files;
pub mod json_schema;
pub mod protobuf;
pub mod registry;
pub mod settings;
pub mod state;
pub mod wire;

pub use encoder::{EncodeError, SchemaEncoder};
pub use files::FileSchemas;
pub use registry::{RegisteredSchema, RegistryClient, RegistryError, SchemaSource};
pub use settings::{FieldEncoding, Format, FormatsSpec, MessageFormats, RegistrySettings};
pub use state::RegistryState;
