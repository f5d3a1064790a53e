//! The sink seam: where messages are published. Implementations: [`KafkaSink`].
//!
//! - [`kafka`]: the rdkafka producer, its defaults and error classification
//! - [`connection`]: what is wrong with the connection to the broker (authentication, TLS,
//!   unreachable), logged once per change
//! - [`deliveries`]: delivery reports filed by batch, so a batch waits once for all of them
//! - [`topics`]: which topics the broker has, so messages to missing ones fail at once

mod connection;
mod deliveries;
mod kafka;
pub mod topics;

use std::future::Future;
use std::time::Duration;

pub use kafka::{KafkaSink, kafka_client_config, librdkafka_version, weak_acks};

use crate::model::OutboundMessage;

/// Longest topic name Kafka accepts.
const MAX_TOPIC_NAME: usize = 249;

/// Whether `name` can be a Kafka topic: 1–249 ASCII letters, digits, `.`, `_` and `-`, and not
/// `.` or `..`. Errors say why.
pub fn check_topic_name(name: &str) -> Result<(), String> {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > MAX_TOPIC_NAME {
        Err(format!(
            "{name:?} is not a topic name: 1 to {MAX_TOPIC_NAME} characters"
        ))
    } else if name == "." || name == ".." || !name.chars().all(legal) {
        Err(format!(
            "{name:?} is not a topic name: only ASCII letters, digits, '.', '_' and '-'"
        ))
    } else {
        Ok(())
    }
}

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
    /// The broker did not answer a metadata request (readiness probe).
    #[error("broker not reachable: {0}")]
    Unreachable(String),
    /// The broker refused the client's SASL credentials (readiness probe).
    #[error("authentication with the broker failed: {0}")]
    Authentication(String),
    /// The TLS handshake with the broker failed, e.g. its certificate does not verify
    /// (readiness probe).
    #[error("TLS with the broker failed: {0}")]
    Tls(String),
}

impl SinkError {
    /// Whose fault a failed publish is; `None` for errors that are not about one message.
    pub fn fault(&self) -> Option<PublishFault> {
        match self {
            Self::Publish { fault, .. } => Some(*fault),
            Self::Config(_)
            | Self::Flush(_)
            | Self::Unreachable(_)
            | Self::Authentication(_)
            | Self::Tls(_) => None,
        }
    }
}

/// Publishes messages and reports, per message, whether the broker acknowledged it.
pub trait Sink: Send + Sync + 'static {
    /// Sends every message at once and waits for all delivery reports. One result per
    /// message, in order; `Ok` only after the broker acknowledged the message.
    fn publish(
        &self,
        messages: &[OutboundMessage],
    ) -> impl Future<Output = Vec<Result<(), SinkError>>> + Send;

    /// Waits up to `timeout` for messages still queued (called at shutdown). Blocks the
    /// calling thread: call it off the async reactor.
    fn flush(&self, timeout: Duration) -> Result<(), SinkError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafkas_rules() {
        assert!(check_topic_name("outbox.event.order_v2-x").is_ok());
        for bad in ["", ".", "..", "dlq.*", "a b", "é", &"t".repeat(250)] {
            assert!(check_topic_name(bad).is_err(), "{bad:?}");
        }
    }
}
