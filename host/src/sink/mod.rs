//! The sink seam: where messages are published. Implementations: [`KafkaSink`].
//!
//! - [`kafka`]: the rdkafka producer, its defaults and error classification
//! - [`topics`]: which topics the broker has, so messages to missing ones fail at once

mod kafka;
pub mod topics;

use std::future::Future;
use std::time::Duration;

pub use kafka::{KafkaSink, kafka_client_config};

use crate::message::Message;

/// Whose fault a failed publish of one message is, which decides what it costs the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishFault {
    /// The broker or the connection failed, not this message (timeouts, unreachable broker,
    /// leader changes, producer fencing): says nothing about the row, must not use up its
    /// attempts.
    Unavailable,
    /// The broker refused the message for a reason of its sender's own making: a topic or
    /// partition it lacks, a message too large, no authorization. Counts an attempt, and
    /// counts against the tenant whose plugin routed it.
    Refused,
    /// Any other failure of this message. Counts an attempt.
    Failed,
}

/// A failed publish of one message, or a sink that could not be set up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SinkError {
    #[error("kafka configuration: {0}")]
    Config(String),
    #[error("publish to {topic} failed: {message}")]
    Publish {
        topic: String,
        message: String,
        fault: PublishFault,
    },
    #[error("flush: {0}")]
    Flush(String),
}

impl SinkError {
    /// Whose fault a failed publish is; `None` for errors that are not about one message.
    pub fn fault(&self) -> Option<PublishFault> {
        match self {
            Self::Publish { fault, .. } => Some(*fault),
            Self::Config(_) | Self::Flush(_) => None,
        }
    }
}

/// Publishes messages and reports, per message, whether the broker acknowledged it.
pub trait Sink: Send + Sync + 'static {
    /// Sends every message at once and waits for all delivery reports. One result per
    /// message, in order; `Ok` only after the broker acknowledged the message.
    fn publish(
        &self,
        messages: &[Message],
    ) -> impl Future<Output = Vec<Result<(), SinkError>>> + Send;

    /// Waits up to `timeout` for messages still queued (called at shutdown). Blocks the
    /// calling thread: call it off the async reactor.
    fn flush(&self, timeout: Duration) -> Result<(), SinkError>;
}
