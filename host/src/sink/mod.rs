//! The sink seam: where messages are published. Implementations: [`KafkaSink`], and the
//! NATS JetStream, RabbitMQ and Redis Streams sinks; [`Brokers`] sends each message to its
//! tenant's broker. An acknowledged message comes back with where the broker stored it,
//! as far as the broker says ([`Delivered`], in the model: the trace code records it).
//!
//! - [`brokers`]: the brokers of one relay behind one [`Sink`]
//! - [`kafka`]: the rdkafka producer, its defaults and error classification
//! - [`nats`]: NATS JetStream through async-nats: publish acknowledgements, `Nats-Msg-Id`
//! - [`rabbitmq`]: AMQP 0-9-1 through lapin, publisher confirms and `mandatory`
//! - [`redis`](self::redis): Redis Streams, one entry per message, one pipeline per batch
//! - [`connection`]: what is wrong with the connection to the broker (authentication, TLS,
//!   unreachable), logged once per change
//! - [`deliveries`]: delivery reports filed by batch, so a batch waits once for all of them
//! - [`topics`]: which topics the broker has, so messages to missing ones fail at once

mod brokers;
#[cfg(test)]
mod conformance;
mod connection;
mod deliveries;
mod kafka;
mod nats;
mod rabbitmq;
mod redis;
mod tls_files;
pub(crate) mod topics;

use std::future::Future;
use std::time::Duration;

use rdkafka::error::KafkaError;

pub(crate) use self::redis::{RedisSettings, RedisSink};
pub(crate) use brokers::{BrokerSettings, Brokers, connect};
pub(crate) use kafka::settings::KafkaSettings;
pub(crate) use kafka::{KafkaSink, librdkafka_version};
pub(crate) use nats::{NatsSettings, NatsSink};
pub(crate) use rabbitmq::{RabbitmqSettings, RabbitmqSink};

pub(crate) use crate::model::Delivered;
use crate::model::{Broker, OutboundMessage};

/// Longest topic name Kafka accepts.
const MAX_TOPIC_NAME: usize = 249;

/// Whether `name` can be a Kafka topic: 1–249 ASCII letters, digits, `.`, `_` and `-`, and not
/// `.` or `..`. Errors say why.
pub(crate) fn check_topic_name(name: &str) -> Result<(), String> {
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

/// Longest destination name on the other brokers: AMQP's short string, and as much as a
/// subject or stream key needs.
const MAX_DESTINATION_NAME: usize = 255;

/// Whether `c` may be part of a destination name (and of an `allowed_topics` pattern): what
/// Kafka allows, plus `:` and `/` for RabbitMQ routing keys, NATS subjects and Redis stream
/// keys (`orders:acme`). Whitespace, wildcards and control characters never are.
pub(crate) fn destination_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/')
}

/// Whether `name` can be a destination on `broker`: a Kafka topic name
/// ([`check_topic_name`]); a NATS subject (tokens of [`destination_char`]s other than `.`,
/// separated by single dots); a RabbitMQ routing key or Redis stream key (1–255 such
/// characters). Errors say why.
pub(crate) fn check_destination(broker: Broker, name: &str) -> Result<(), String> {
    // The reasons never quote `name`: it may be a plugin's megabyte of anything.
    if broker == Broker::Kafka {
        return check_topic_name(name)
            .map_err(|_| format!("1-{MAX_TOPIC_NAME} ASCII letters, digits, '.', '_', '-'"));
    }
    let chars = "ASCII letters, digits, '.', '_', '-', ':', '/'";
    if name.is_empty() || name.len() > MAX_DESTINATION_NAME || !name.chars().all(destination_char) {
        return Err(format!("1 to {MAX_DESTINATION_NAME} {chars}"));
    }
    if broker == Broker::Nats && name.split('.').any(str::is_empty) {
        return Err(
            "a NATS subject has no empty tokens: no leading, trailing or double '.'".into(),
        );
    }
    Ok(())
}

/// What a destination is called on `broker`, for errors.
pub(crate) fn destination_noun(broker: Broker) -> &'static str {
    match broker {
        Broker::Kafka => "Kafka topic name",
        Broker::Nats => "NATS subject",
        Broker::Rabbitmq => "RabbitMQ routing key",
        Broker::Redis => "Redis stream key",
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

/// A failed publish of one message, or a sink that could not be set up. Each text names its
/// cause as well as keeping it as the source: the text alone is what a row's `last_error`,
/// `/readyz` and the log keep (the binary leaves a repeated cause out of its error chain).
/// Causes are boxed: one result per message is kept while a batch is settled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SinkError {
    /// `[kafka]` cannot make a producer: a property missing, unknown or invalid.
    #[error("kafka configuration: {reason}")]
    Config {
        reason: String,
        #[source]
        cause: Option<Box<KafkaError>>,
    },
    /// A broker section (`[nats]`, `[rabbitmq]`, `[redis]`) that cannot work: a URL that does
    /// not parse, a TLS file that cannot be read.
    #[error("{broker} configuration: {reason}")]
    Settings { broker: Broker, reason: String },
    #[error("publish to {topic} failed: {message}")]
    Publish {
        topic: String,
        message: String,
        fault: PublishFault,
        #[source]
        cause: Option<Box<KafkaError>>,
    },
    #[error("flush: {0}")]
    Flush(#[source] Box<KafkaError>),
    /// The broker did not answer a metadata request (readiness probe).
    #[error("broker not reachable: {reason}")]
    Unreachable {
        reason: String,
        #[source]
        cause: Option<Box<KafkaError>>,
    },
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
            Self::Config { .. }
            | Self::Settings { .. }
            | Self::Flush(_)
            | Self::Unreachable { .. }
            | Self::Authentication(_)
            | Self::Tls(_) => None,
        }
    }

    /// A failed publish to `topic` that is not the broker's word (no report, no such topic).
    pub fn publish_failed(topic: &str, message: impl Into<String>, fault: PublishFault) -> Self {
        Self::Publish {
            topic: topic.to_owned(),
            message: message.into(),
            fault,
            cause: None,
        }
    }
}

/// Publishes messages and reports, per message, whether the broker acknowledged it.
pub trait Sink: Send + Sync + 'static {
    /// Sends every message at once and waits for all delivery reports. One result per
    /// message, in order; `Ok` only after the broker acknowledged the message, with where it
    /// stored it as far as the acknowledgement says.
    fn publish(
        &self,
        messages: &[OutboundMessage],
    ) -> impl Future<Output = Vec<Result<Delivered, SinkError>>> + Send;

    /// Waits up to `timeout` for messages still queued (called at shutdown). Blocks the
    /// calling thread: call it off the async reactor.
    fn flush(&self, timeout: Duration) -> Result<(), SinkError>;

    /// Whether the broker answers within `timeout` (readiness, `/readyz`); when it does not,
    /// the error names why. Blocks the calling thread: call it off the async reactor.
    fn probe(&self, timeout: Duration) -> Result<(), SinkError>;
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

    #[test]
    fn destinations_follow_each_brokers_rules() {
        assert!(check_destination(Broker::Redis, "orders:acme/v1").is_ok());
        assert!(check_destination(Broker::Rabbitmq, "order.created").is_ok());
        assert!(check_destination(Broker::Kafka, "orders:acme").is_err());
        assert!(check_destination(Broker::Nats, "orders.acme").is_ok());
        for bad in ["", ".a", "a.", "a..b", "a.*", "a.>", "a b"] {
            assert!(check_destination(Broker::Nats, bad).is_err(), "{bad:?}");
        }
        for bad in ["", "a b", "a*", "é", &"t".repeat(256)] {
            assert!(check_destination(Broker::Redis, bad).is_err(), "{bad:?}");
        }
    }
}
