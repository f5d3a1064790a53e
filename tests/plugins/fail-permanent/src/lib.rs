//! Test plugin: refuses every row with a permanent error.

use sluice_plugin_sdk::{Config, Message, OutboxRow, Plugin, TransformError};

struct FailPermanent;

impl Plugin for FailPermanent {
    const NAME: &'static str = "test-fail-permanent";
    const VERSION: &'static str = "0.1.0";

    fn configure(_config: Config) -> Result<Self, String> {
        Ok(Self)
    }

    fn transform(&self, row: OutboxRow) -> Result<Vec<Message>, TransformError> {
        Err(TransformError::permanent(
            "schema-mismatch",
            format!("row {} does not match the expected schema", row.id),
        ))
    }
}

sluice_plugin_sdk::plugin!(FailPermanent);
