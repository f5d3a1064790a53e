//! Test plugin of the current contract (`sluice:plugin@0.3.0`, through the SDK): routes each
//! row to `<topic_prefix><aggregate type>` and names the record its value is encoded as,
//! `<record_namespace>.<event type>` (`value-record`), so `OrderCreated` and `OrderShipped`
//! share one topic under the record-name strategy. Declares the Avro schemas of
//! `com.acme.OrderCreated` and `com.acme.OrderShipped` for `auto_register`.

use sluice_plugin_sdk::{
    Config, Message, OutboxRow, Plugin, RecordSchema, SchemaFormat, TransformError,
};

const ORDER_CREATED: &str = r#"{"type":"record","name":"OrderCreated","namespace":"com.acme",
  "fields":[{"name":"id","type":"long"},{"name":"total","type":"double"}]}"#;
const ORDER_SHIPPED: &str = r#"{"type":"record","name":"OrderShipped","namespace":"com.acme",
  "fields":[{"name":"id","type":"long"},{"name":"carrier","type":"string"}]}"#;

struct PickRecord {
    prefix: String,
    namespace: String,
}

impl Plugin for PickRecord {
    const NAME: &'static str = "test-pick-record";
    const VERSION: &'static str = "0.2.0";

    fn schemas() -> Vec<RecordSchema> {
        [
            ("com.acme.OrderCreated", ORDER_CREATED),
            ("com.acme.OrderShipped", ORDER_SHIPPED),
        ]
        .into_iter()
        .map(|(record, schema)| RecordSchema {
            record_name: record.to_owned(),
            format: SchemaFormat::Avro,
            schema: schema.to_owned(),
        })
        .collect()
    }

    fn configure(config: Config) -> Result<Self, String> {
        config.allow_only(&["topic_prefix", "record_namespace"])?;
        Ok(Self {
            prefix: config.require("topic_prefix")?.to_owned(),
            namespace: config.require("record_namespace")?.to_owned(),
        })
    }

    fn transform(&self, row: OutboxRow) -> Result<Vec<Message>, TransformError> {
        Ok(vec![
            Message::to(format!("{}{}", self.prefix, row.aggregate_type))
                .key(row.aggregate_id.into_bytes())
                .value_record(format!("{}.{}", self.namespace, row.event_type))
                .payload(row.payload),
        ])
    }
}

sluice_plugin_sdk::plugin!(PickRecord);
