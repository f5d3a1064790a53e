//! Schemas from files instead of a registry, for `sluice plugin test --value-schema FILE`:
//! plugin authors see the encoded bytes (or the mismatch) without a registry. Every schema is
//! given id 0; nothing is registered anywhere.

use futures::future::BoxFuture;

use super::settings::SchemaVersion;
use super::source::{RegisteredSchema, RegistryError, SchemaSource};

/// The schema id files get (no registry assigned one).
pub const FILE_SCHEMA_ID: u32 = 0;

/// A [`SchemaSource`] that knows only the schema texts it is handed (`value_schema`,
/// `key_schema`).
#[derive(Debug, Default)]
pub struct FileSchemas;

impl SchemaSource for FileSchemas {
    fn version(
        &self,
        subject: &str,
        _version: SchemaVersion,
    ) -> BoxFuture<'_, Result<RegisteredSchema, RegistryError>> {
        let error = RegistryError::NotFound(format!(
            "no schema for subject {subject}: without a registry, give the schema file \
             (--value-schema FILE / --key-schema FILE)"
        ));
        Box::pin(async move { Err(error) })
    }

    fn find(
        &self,
        _subject: &str,
        schema_type: &str,
        schema: &str,
        _register: bool,
    ) -> BoxFuture<'_, Result<RegisteredSchema, RegistryError>> {
        let found = RegisteredSchema {
            id: FILE_SCHEMA_ID,
            version: None,
            schema_type: schema_type.to_owned(),
            schema: schema.to_owned(),
        };
        Box::pin(async move { Ok(found) })
    }
}
