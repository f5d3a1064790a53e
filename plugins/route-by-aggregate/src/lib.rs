//! Reference plugin with the defaults of Debezium's Outbox Event Router:
//! topic `<topic_prefix><aggregate_type>`, key = aggregate id, payload unchanged,
//! headers = the row's headers plus `id` (outbox id) and `event-type`.
//!
//! Config: `topic_prefix` (default `outbox.event.`).

use sluice_plugin_sdk::{Config, Message, OutboxRow, Plugin, TransformError};

const DEFAULT_TOPIC_PREFIX: &str = "outbox.event.";

struct RouteByAggregate {
    topic_prefix: String,
}

impl Plugin for RouteByAggregate {
    const NAME: &'static str = "route-by-aggregate";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");

    fn config_schema() -> Option<String> {
        Some(
            r#"{"type":"object","properties":{"topic_prefix":{"type":"string","default":"outbox.event."}},"additionalProperties":false}"#
                .to_owned(),
        )
    }

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
        let message = Message::to(topic)
            .key(row.aggregate_id.into_bytes())
            .payload(row.payload)
            .headers(row.headers)
            .header("id", row.id.into_bytes())
            .header("event-type", row.event_type.into_bytes());
        Ok(vec![message])
    }
}

sluice_plugin_sdk::plugin!(RouteByAggregate);
