//! Test plugin: every row fans out to two topics, `<prefix>a` and `<prefix>b`.

use sluice_plugin_sdk::{Config, Message, OutboxRow, Plugin, TransformError};

struct Fanout {
    prefix: String,
}

impl Plugin for Fanout {
    const NAME: &'static str = "test-fanout";
    // Not the reference plugin's version: the telemetry test tells a hot reload by it.
    const VERSION: &'static str = "0.2.0";

    fn configure(config: Config) -> Result<Self, String> {
        config.allow_only(&["topic_prefix"])?;
        Ok(Self {
            prefix: config.require("topic_prefix")?.to_owned(),
        })
    }

    fn transform(&self, row: OutboxRow) -> Result<Vec<Message>, TransformError> {
        Ok(["a", "b"]
            .into_iter()
            .map(|suffix| {
                Message::to(format!("{}{suffix}", self.prefix))
                    .key(row.aggregate_id.clone().into_bytes())
                    .payload(row.payload.clone())
                    .header("id", row.id.clone().into_bytes())
            })
            .collect())
    }
}

sluice_plugin_sdk::plugin!(Fanout);
