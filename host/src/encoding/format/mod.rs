//! The plugin's JSON in each schema format, errors naming the field: [`avro`], [`protobuf`],
//! [`json_schema`].

pub mod avro;
pub mod json_schema;
pub mod protobuf;

pub use avro::AvroSchema;
pub use json_schema::JsonSchema;
pub use protobuf::ProtoSchema;
