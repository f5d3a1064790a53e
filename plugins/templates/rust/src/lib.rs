//! {{name}}: a Sluice plugin. Routes each outbox row to `<topic_prefix><aggregate_type>`
//! (prefix default `events.`), keyed by the aggregate id, with the payload unchanged and the
//! row's headers plus `event-type`. A row without an aggregate type is dead-lettered.
//!
//! Change `transform` to route your rows; keep `rows.jsonl`/`expected.jsonl` in step (see
//! README.md).

use sluice_plugin_sdk::{Config, Message, OutboxRow, Plugin, TransformError};

const DEFAULT_TOPIC_PREFIX: &str = "events.";

struct Router {
    topic_prefix: String,
}

impl Plugin for Router {
    const NAME: &'static str = "{{name}}";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");

    fn configure(config: Config) -> Result<Self, String> {
        config.allow_only(&["topic_prefix"])?;
        Ok(Self {
            topic_prefix: config
                .get_or("topic_prefix", DEFAULT_TOPIC_PREFIX)
                .to_owned(),
        })
    }

    fn transform(&self, row: OutboxRow) -> Result<Vec<Message>, TransformError> {
        if row.aggregate_type.is_empty() {
            return Err(TransformError::permanent(
                "empty-aggregate-type",
                "aggregate_type is empty, so there is no topic to route to",
            ));
        }
        let topic = format!("{}{}", self.topic_prefix, row.aggregate_type);
        Ok(vec![
            Message::to(topic)
                .key(row.aggregate_id.into_bytes())
                .payload(row.payload)
                .headers(row.headers)
                .header("event-type", row.event_type.into_bytes()),
        ])
    }
}

sluice_plugin_sdk::plugin!(Router);
