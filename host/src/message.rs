//! The message a plugin produced and a sink publishes.

use crate::outbox::{Headers, OutboxId};

/// One message to publish, already validated by the plugin host.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The outbox row this message came from.
    pub row: OutboxId,
    pub topic: String,
    pub key: Option<Vec<u8>>,
    /// `None` is a tombstone.
    pub payload: Option<Vec<u8>>,
    pub headers: Headers,
    pub partition: Option<i32>,
}
