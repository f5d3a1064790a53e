//! Where schemas come from, as the encoder sees it: [`SchemaSource`] is the seam (the relay asks
//! a registry client, `sluice plugin test` schema files), with what a source answers.

use futures::future::BoxFuture;

use super::settings::SchemaVersion;

/// A schema as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredSchema {
    /// Global id: what the wire format carries.
    pub id: u32,
    /// The subject's version (`None` when only the id is known).
    pub version: Option<u32>,
    /// `AVRO`, `PROTOBUF` or `JSON`.
    pub schema_type: String,
    /// The schema text.
    pub schema: String,
}

/// Why the registry gave no schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// No answer: connection refused, timeout, TLS failure.
    #[error("schema registry unreachable: {0}")]
    Unreachable(String),
    /// A 5xx answer, or one that is not the registry's JSON.
    #[error("schema registry failed: {0}")]
    Failed(String),
    /// 401/403: the credentials are wrong or lack a permission.
    #[error("schema registry refused the credentials: {0}")]
    Unauthorized(String),
    /// 404: no such subject, version or schema.
    #[error("{0}")]
    NotFound(String),
    /// 409/422 and other 4xx: the request was refused (incompatible or invalid schema).
    #[error("schema registry refused: {0}")]
    Refused(String),
    /// The schema uses something Sluice does not support (references).
    #[error("{0}")]
    Unsupported(String),
}

impl RegistryError {
    /// Whether the registry itself is down (for `/readyz` and `sluice_dependency_up`); a 404
    /// or a refusal is an answer.
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            RegistryError::Unreachable(_) | RegistryError::Failed(_)
        )
    }
}

/// Where schemas come from.
pub trait SchemaSource: Send + Sync {
    /// `subject`'s latest or pinned version.
    fn version(
        &self,
        subject: &str,
        version: SchemaVersion,
    ) -> BoxFuture<'_, Result<RegisteredSchema, RegistryError>>;

    /// The id of `schema` under `subject`: registered now if `register`, else looked up.
    fn find(
        &self,
        subject: &str,
        schema_type: &str,
        schema: &str,
        register: bool,
    ) -> BoxFuture<'_, Result<RegisteredSchema, RegistryError>>;
}
