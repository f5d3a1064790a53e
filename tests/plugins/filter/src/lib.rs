//! Test plugin: drops rows whose event type is `drop_event_type`, routes the rest to
//! `<topic_prefix><aggregate_type>`.

use sluice_plugin_sdk::{Config, Message, OutboxRow, Plugin, TransformError};

struct Filter {
    prefix: String,
    drop_event_type: String,
}

impl Plugin for Filter {
    const NAME: &'static str = "test-filter";
    const VERSION: &'static str = "0.1.0";

    fn configure(config: Config) -> Result<Self, String> {
        config.allow_only(&["topic_prefix", "drop_event_type"])?;
        Ok(Self {
            prefix: config.require("topic_prefix")?.to_owned(),
            drop_event_type: config.require("drop_event_type")?.to_owned(),
        })
    }

    fn transform(&self, row: OutboxRow) -> Result<Vec<Message>, TransformError> {
        if row.event_type == self.drop_event_type {
            sluice_plugin_sdk::counter_add("dropped", 1);
            return Ok(Vec::new());
        }
        Ok(vec![
            Message::to(format!("{}{}", self.prefix, row.aggregate_type))
                .key(row.aggregate_id.into_bytes())
                .payload(row.payload)
                .header("id", row.id.into_bytes()),
        ])
    }
}

sluice_plugin_sdk::plugin!(Filter);
