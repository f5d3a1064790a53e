//! The sink seam: where messages are published. Implementations: [`KafkaSink`].

mod kafka;

use std::future::Future;
use std::time::Duration;

pub use kafka::{KafkaSink, kafka_client_config};

use crate::message::Message;

/// A failed publish of one message, or a sink that could not be set up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SinkError {
    #[error("kafka configuration: {0}")]
    Config(String),
    /// `transient`: the broker or the connection failed, not this message (timeouts,
    /// unreachable broker, leader changes, producer fencing); such failures say nothing about
    /// the row and must not use up its attempts.
    #[error("publish to {topic} failed: {message}")]
    Publish {
        topic: String,
        message: String,
        transient: bool,
    },
    #[error("flush: {0}")]
    Flush(String),
}

/// Publishes messages and reports, per message, whether the broker acknowledged it.
pub trait Sink: Send + Sync + 'static {
    /// Sends every message at once and waits for all delivery reports. One result per
    /// message, in order; `Ok` only after the broker acknowledged the message.
    fn publish(
        &self,
        messages: &[Message],
    ) -> impl Future<Output = Vec<Result<(), SinkError>>> + Send;

    /// Waits up to `timeout` for messages still queued (called at shutdown).
    fn flush(&self, timeout: Duration) -> Result<(), SinkError>;
}
