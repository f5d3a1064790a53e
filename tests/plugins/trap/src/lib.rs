//! Test plugin: panics on every row (with panic=abort this is a wasm trap).

use sluice_plugin_sdk::{Config, Message, OutboxRow, Plugin, TransformError};

struct Trap;

impl Plugin for Trap {
    const NAME: &'static str = "test-trap";
    const VERSION: &'static str = "0.1.0";

    fn configure(_config: Config) -> Result<Self, String> {
        Ok(Self)
    }

    fn transform(&self, row: OutboxRow) -> Result<Vec<Message>, TransformError> {
        panic!("test-trap plugin refuses row {}", row.id);
    }
}

sluice_plugin_sdk::plugin!(Trap);
