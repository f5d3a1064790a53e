//! Reference plugin with the defaults of Debezium's Outbox Event Router:
//! topic `<topic_prefix><aggregate_type>`, key = aggregate id, payload unchanged,
//! headers = the row's headers plus `id` (outbox id) and `event-type`, then the extra columns
//! `additional_placement` places; timestamp = the row's `created_at`.
//!
//! Config: `topic_prefix` (default `outbox.event.`), `additional_placement` (Debezium's
//! `table.fields.additional.placement`: `column:header[:alias]`, `column:partition`; default
//! none).

use sluice_plugin_sdk::{Config, Message, OutboxRow, Placements, Plugin, TransformError};

const DEFAULT_TOPIC_PREFIX: &str = "outbox.event.";

struct RouteByAggregate {
    topic_prefix: String,
    placements: Placements,
}

impl Plugin for RouteByAggregate {
    const NAME: &'static str = "route-by-aggregate";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");

    fn config_schema() -> Option<String> {
        Some(
            r#"{"type":"object","properties":{"topic_prefix":{"type":"string","default":"outbox.event."},"additional_placement":{"type":"string","default":""}},"additionalProperties":false}"#
                .to_owned(),
        )
    }

    fn configure(config: Config) -> Result<Self, String> {
        config.allow_only(&["topic_prefix", "additional_placement"])?;
        Ok(Self {
            topic_prefix: config
                .get_or("topic_prefix", DEFAULT_TOPIC_PREFIX)
                .to_owned(),
            placements: Placements::parse(config.get_or("additional_placement", ""))?,
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
            .key(row.aggregate_id.as_bytes())
            .payload(row.payload.as_slice())
            .headers(row.headers.iter().cloned())
            .header("id", row.id.as_bytes())
            .header("event-type", row.event_type.as_bytes())
            .timestamp_of(&row);
        Ok(vec![self.placements.apply(&row, message)?])
    }
}

sluice_plugin_sdk::plugin!(RouteByAggregate);
