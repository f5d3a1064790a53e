//! Test plugin: fails with a retryable error on the first `fail_attempts` attempts of a row
//! (optionally only rows of aggregate `fail_aggregate_id`), then routes it to
//! `<topic_prefix><aggregate_type>` with an `id` header.

use sluice_plugin_sdk::{Config, Message, OutboxRow, Plugin, TransformError};

struct Flaky {
    prefix: String,
    fail_attempts: u32,
    only_aggregate: Option<String>,
}

impl Plugin for Flaky {
    const NAME: &'static str = "test-flaky";
    const VERSION: &'static str = "0.1.0";

    fn configure(config: Config) -> Result<Self, String> {
        config.allow_only(&["topic_prefix", "fail_attempts", "fail_aggregate_id"])?;
        let fail_attempts = config
            .require("fail_attempts")?
            .parse()
            .map_err(|e| format!("fail_attempts: {e}"))?;
        Ok(Self {
            prefix: config.require("topic_prefix")?.to_owned(),
            fail_attempts,
            only_aggregate: config.get("fail_aggregate_id").map(str::to_owned),
        })
    }

    fn transform(&self, row: OutboxRow) -> Result<Vec<Message>, TransformError> {
        let targeted = self
            .only_aggregate
            .as_ref()
            .is_none_or(|a| *a == row.aggregate_id);
        if targeted && row.attempt <= self.fail_attempts {
            return Err(TransformError::retryable(
                "flaky",
                format!("attempt {} of row {} fails on purpose", row.attempt, row.id),
            ));
        }
        Ok(vec![
            Message::to(format!("{}{}", self.prefix, row.aggregate_type))
                .key(row.aggregate_id.into_bytes())
                .payload(row.payload)
                .header("id", row.id.into_bytes()),
        ])
    }
}

sluice_plugin_sdk::plugin!(Flaky);
