//! Test plugin: panics (with panic=abort, a wasm trap) on every row — or, with config
//! `only_aggregate_id = X`, only on rows of aggregate X, routing the others to
//! `<topic_prefix><aggregate_type>` with an `id` header.

use sluice_plugin_sdk::{Config, Message, OutboxRow, Plugin, TransformError};

struct Trap {
    only: Option<String>,
    prefix: String,
}

impl Plugin for Trap {
    const NAME: &'static str = "test-trap";
    const VERSION: &'static str = "0.1.0";

    fn configure(config: Config) -> Result<Self, String> {
        config.allow_only(&["only_aggregate_id", "topic_prefix"])?;
        Ok(Self {
            only: config.get("only_aggregate_id").map(str::to_owned),
            prefix: config.get_or("topic_prefix", "").to_owned(),
        })
    }

    fn transform(&self, row: OutboxRow) -> Result<Vec<Message>, TransformError> {
        if self
            .only
            .as_ref()
            .is_none_or(|only| *only == row.aggregate_id)
        {
            panic!("test-trap plugin refuses row {}", row.id);
        }
        Ok(vec![
            Message::to(format!("{}{}", self.prefix, row.aggregate_type))
                .key(row.aggregate_id.into_bytes())
                .payload(row.payload)
                .header("id", row.id.into_bytes()),
        ])
    }
}

sluice_plugin_sdk::plugin!(Trap);
