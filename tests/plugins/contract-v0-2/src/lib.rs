//! Test plugin built against the second released contract, `sluice:plugin@0.2.0`
//! (`wit/v0.2.0/`), with plain wit-bindgen: routes each row to `<topic_prefix><aggregate type>`,
//! key = aggregate id, the payload as it is and logs
//! through the 0.2.0 host interface. Its rows have no extra columns and its messages no
//! timestamp, whatever the table holds. A host that dropped 0.2.0 would refuse to load it.

wit_bindgen::generate!({
    path: "../../../wit/v0.2.0",
    world: "plugin",
});

use std::sync::OnceLock;

use exports::sluice::plugin::transformer::Guest;
use sluice::plugin::host;
use sluice::plugin::types::{
    ErrorDetail, LogLevel, OutboxRow, OutputMessage, PluginInfo, TransformError,
};

static PREFIX: OnceLock<String> = OnceLock::new();

struct ContractV02;

impl Guest for ContractV02 {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "test-contract-v0-2".into(),
            version: "0.2.0".into(),
            config_schema: None,
            schemas: Vec::new(),
        }
    }

    fn configure(config: Vec<(String, String)>) -> Result<(), String> {
        let prefix = config
            .into_iter()
            .find(|(k, _)| k == "topic_prefix")
            .map(|(_, v)| v)
            .ok_or("topic_prefix is required")?;
        host::log(LogLevel::Info, "configured against sluice:plugin@0.2.0");
        let _ = PREFIX.set(prefix);
        Ok(())
    }

    fn transform(row: OutboxRow) -> Result<Vec<OutputMessage>, TransformError> {
        let Some(prefix) = PREFIX.get() else {
            return Err(TransformError::Permanent(ErrorDetail {
                code: "unconfigured".into(),
                message: "configure was not called".into(),
            }));
        };
        host::counter_add("v0_2_rows", 1);
        Ok(vec![OutputMessage {
            topic: format!("{prefix}{}", row.aggregate_type),
            key: Some(row.aggregate_id.into_bytes()),
            payload: Some(row.payload),
            headers: vec![("contract".into(), b"0.2.0".to_vec())],
            partition: None,
            value_record: None,
            key_record: None,
        }])
    }

    fn transform_batch(rows: Vec<OutboxRow>) -> Vec<Result<Vec<OutputMessage>, TransformError>> {
        rows.into_iter().map(Self::transform).collect()
    }
}

export!(ContractV02);
