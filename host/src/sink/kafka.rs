//! Kafka sink on rdkafka's `FutureProducer`: every message of a batch is enqueued before any
//! delivery report is awaited.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures::future::join_all;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use super::{Sink, SinkError};
use crate::message::Message;

/// Sluice's producer defaults; any `[kafka]` property overrides them.
/// - idempotence + acks=all: no duplicates from producer retries, no loss on leader change.
/// - message.timeout.ms: the batch's transaction stays open while we wait for reports, so give
///   up after 30 s (librdkafka's default is 5 min) and reschedule the rows instead.
/// - linger.ms: Sluice enqueues a whole batch at once and then waits, so librdkafka's 5 ms
///   default only adds latency; 1 ms still lets a batch's messages share produce requests.
pub const DEFAULT_PROPERTIES: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("message.timeout.ms", "30000"),
    ("linger.ms", "1"),
];

/// How long `send` may wait for room in librdkafka's local queue before failing the message.
const QUEUE_FULL_WAIT: Duration = Duration::from_secs(10);

/// The client configuration Sluice uses: defaults, then the user's properties.
pub fn kafka_client_config(properties: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (k, v) in DEFAULT_PROPERTIES {
        config.set(*k, *v);
    }
    for (k, v) in properties {
        config.set(k, v);
    }
    config
}

/// Publishes to Kafka. Re-creates its producer after a fatal (idempotence) error.
pub struct KafkaSink {
    config: ClientConfig,
    producer: Mutex<FutureProducer>,
}

impl KafkaSink {
    /// Creates the producer; invalid or unknown librdkafka properties are reported here.
    pub fn new(properties: &BTreeMap<String, String>) -> Result<Self, SinkError> {
        if !properties.contains_key("bootstrap.servers") {
            return Err(SinkError::Config(
                "[kafka] needs \"bootstrap.servers\"".to_owned(),
            ));
        }
        let config = kafka_client_config(properties);
        let producer = create(&config)?;
        Ok(Self {
            config,
            producer: Mutex::new(producer),
        })
    }

    fn producer(&self) -> FutureProducer {
        self.producer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// An idempotent producer that hit a fatal error, or was fenced by the broker (seen after
    /// a broker outage), refuses every later send; replace it.
    fn replace_if_broken(&self, producer: &FutureProducer, fenced: bool) {
        let fatal = producer.client().fatal_error();
        if fatal.is_some() || fenced {
            tracing::error!(?fatal, fenced, "kafka producer is unusable; re-creating it");
            match create(&self.config) {
                Ok(new) => {
                    *self.producer.lock().unwrap_or_else(PoisonError::into_inner) = new;
                }
                Err(e) => tracing::error!(error = %e, "cannot re-create kafka producer"),
            }
        }
    }
}

fn create(config: &ClientConfig) -> Result<FutureProducer, SinkError> {
    config
        .create()
        .map_err(|e| SinkError::Config(e.to_string()))
}

impl Sink for KafkaSink {
    async fn publish(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        let producer = self.producer();
        // `join_all` polls every send future before awaiting any: all messages are in
        // flight together, and librdkafka batches them per partition.
        let sends = messages.iter().map(|m| {
            let headers = m.headers.iter().fold(
                OwnedHeaders::new_with_capacity(m.headers.len()),
                |h, (key, value)| {
                    h.insert(Header {
                        key,
                        value: Some(value.as_slice()),
                    })
                },
            );
            let mut record: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(&m.topic).headers(headers);
            if let Some(key) = &m.key {
                record = record.key(key.as_slice());
            }
            if let Some(payload) = &m.payload {
                record = record.payload(payload.as_slice());
            }
            if let Some(partition) = m.partition {
                record = record.partition(partition);
            }
            producer.send(record, Timeout::After(QUEUE_FULL_WAIT))
        });
        let reports = join_all(sends).await;
        let mut fenced = false;
        let results = reports
            .into_iter()
            .zip(messages)
            .map(|(report, m)| {
                report.map(|_| ()).map_err(|(e, _)| {
                    let code = e.rdkafka_error_code();
                    fenced |= code.is_some_and(producer_is_broken);
                    SinkError::Publish {
                        topic: m.topic.clone(),
                        message: e.to_string(),
                        transient: is_transient(&e),
                    }
                })
            })
            .collect();
        self.replace_if_broken(&producer, fenced);
        results
    }

    fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        self.producer()
            .flush(Timeout::After(timeout))
            .map_err(|e| SinkError::Flush(e.to_string()))
    }
}

/// Errors of the broker or the connection rather than of the message: retrying the row later
/// is all there is to do, and the failure must not count against it.
fn is_transient(error: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    matches!(
        error.rdkafka_error_code(),
        Some(
            MessageTimedOut
                | AllBrokersDown
                | BrokerTransportFailure
                | OperationTimedOut
                | QueueFull
                | Retry
                | LeaderNotAvailable
                | NotLeaderForPartition
                | RequestTimedOut
                | NetworkException
                | NotEnoughReplicas
                | NotEnoughReplicasAfterAppend
                | KafkaStorageError
                | Fatal
                | OutOfOrderSequenceNumber
                | InvalidProducerEpoch
                | UnknownProducerId
                | ProducerFenced
        )
    )
}

/// Errors after which the idempotent producer's state is unusable.
fn producer_is_broken(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode::*;
    matches!(
        code,
        Fatal
            | ProducerFenced
            | InvalidProducerEpoch
            | OutOfOrderSequenceNumber
            | UnknownProducerId
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_properties_override_defaults() {
        let mut props = BTreeMap::new();
        props.insert("acks".to_owned(), "1".to_owned());
        let config = kafka_client_config(&props);
        assert_eq!(config.get("acks"), Some("1"));
        assert_eq!(config.get("enable.idempotence"), Some("true"));
    }

    #[test]
    fn broker_failures_are_transient_and_message_failures_are_not() {
        let err = |code| KafkaError::MessageProduction(code);
        assert!(is_transient(&err(RDKafkaErrorCode::MessageTimedOut)));
        assert!(is_transient(&err(RDKafkaErrorCode::ProducerFenced)));
        assert!(!is_transient(&err(RDKafkaErrorCode::MessageSizeTooLarge)));
        assert!(!is_transient(&err(RDKafkaErrorCode::UnknownTopic)));
        assert!(producer_is_broken(RDKafkaErrorCode::ProducerFenced));
        assert!(!producer_is_broken(RDKafkaErrorCode::MessageTimedOut));
    }

    #[test]
    fn missing_bootstrap_servers_is_named() {
        let err = KafkaSink::new(&BTreeMap::new()).err().unwrap();
        assert!(err.to_string().contains("bootstrap.servers"));
    }

    #[test]
    fn unknown_property_is_refused_with_its_name() {
        let mut props = BTreeMap::new();
        props.insert("bootstrap.servers".to_owned(), "127.0.0.1:1".to_owned());
        props.insert("no.such.property".to_owned(), "1".to_owned());
        let err = KafkaSink::new(&props).err().unwrap();
        assert!(err.to_string().contains("no.such.property"), "{err}");
    }
}
