//! {{name}}: a Sluice plugin. As it comes, it does what the builtin `route-by-aggregate` does
//! (the defaults of Debezium's Outbox Event Router): each outbox row goes to
//! `<topic_prefix><aggregate_type>` (prefix default `outbox.event.`), keyed by the aggregate
//! id, with the payload unchanged and the row's headers plus `id` (the outbox id) and
//! `event-type`, then the extra columns `additional_placement` places (Debezium's
//! `table.fields.additional.placement`), and the row's `created_at` as the record timestamp.
//! A row without an aggregate type is dead-lettered.
//!
//! Change `transform` to route your rows; keep `rows.jsonl`/`expected.jsonl` in step (see
//! README.md).

use sluice_plugin_sdk::{Config, Message, OutboxRow, Placements, Plugin, TransformError};

const DEFAULT_TOPIC_PREFIX: &str = "outbox.event.";

struct Router {
    topic_prefix: String,
    placements: Placements,
}

impl Plugin for Router {
    const NAME: &'static str = "{{name}}";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");

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
            // Consumers of Debezium's router de-duplicate on `id`; keep it when you change
            // the routing (the host adds the unforgeable `sluice-outbox-id` as well).
            .header("id", row.id.as_bytes())
            .header("event-type", row.event_type.as_bytes())
            // Kafka's record timestamp: when the application wrote the row.
            .timestamp_of(&row);
        // Extra columns ([database.columns] extra) as headers or the partition.
        Ok(vec![self.placements.apply(&row, message)?])
    }
}

sluice_plugin_sdk::plugin!(Router);
