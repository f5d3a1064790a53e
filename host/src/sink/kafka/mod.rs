//! Kafka sink on rdkafka's `ThreadedProducer`: every message of a batch is enqueued before
//! any delivery report is awaited, and the producer's poll thread files each report under its
//! batch ([`super::deliveries`]), so a batch waits once, not once per message. Messages to
//! topics the broker lacks fail at once (see [`super::topics`]). librdkafka calls that block
//! — metadata requests, creating and destroying a producer, flushing — run on tokio's
//! blocking threads, never on the reactor.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::util::Timeout;

use self::context::SinkContext;
use self::faults::{fault_of, is_unknown_topic, producer_is_broken};
use self::settings::kafka_client_config;
use super::deliveries::{Opaque, Pending};
use super::topics::{Known, TopicCache};
use super::{Delivered, PublishFault, Sink, SinkError};
use crate::model::OutboundMessage;
use crate::telemetry::Metrics;

mod context;
mod faults;
pub(crate) mod settings;

/// The producer, with the context that files delivery reports and reads librdkafka's
/// statistics into the metrics. Shared by the batches that publish through it.
type KafkaProducer = Arc<rdkafka::producer::ThreadedProducer<SinkContext>>;

/// How long enqueueing may wait for room in librdkafka's local queue before failing the
/// message, and how often it looks again meanwhile.
const QUEUE_FULL_WAIT: Duration = Duration::from_secs(10);
const QUEUE_FULL_RETRY: Duration = Duration::from_millis(10);
/// How long a metadata request about a topic not seen before may take. A healthy broker
/// answers in milliseconds; when it does not answer, the messages are sent anyway and the
/// batch waits for their reports as it would have without the check.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);
/// Metadata requests in flight at once for one batch (each holds a blocking thread).
const METADATA_REQUESTS: usize = 8;

/// The `statistics.interval.ms` property: librdkafka computes no statistics without it.
const STATISTICS_INTERVAL: &str = "statistics.interval.ms";

/// Publishes to Kafka. Re-creates its producer after a fatal (idempotence) error.
pub(crate) struct KafkaSink {
    inner: Arc<Inner>,
}

/// The sink's state, shared with the blocking tasks that work on the producer.
struct Inner {
    /// What a new producer is created from: after a fatal error, or on
    /// [`KafkaSink::reconfigure`].
    config: Mutex<ClientConfig>,
    /// The statistics interval Sluice sets when metrics are on (kept across reconfiguring).
    statistics: Option<Duration>,
    context: SinkContext,
    producer: Mutex<KafkaProducer>,
    topics: TopicCache,
}

impl KafkaSink {
    /// Creates the producer; invalid or unknown librdkafka properties are reported here.
    /// Creating a producer starts librdkafka's threads: call it off the async reactor.
    pub(crate) fn new(properties: &BTreeMap<String, String>) -> Result<Self, SinkError> {
        Self::create(properties, SinkContext::default(), None)
    }

    /// [`KafkaSink::new`], with the producer's queue depth read into `metrics` every
    /// `interval` from librdkafka's statistics (unless `[kafka]` sets
    /// `statistics.interval.ms` itself). Without metrics librdkafka computes no statistics.
    pub(crate) fn with_metrics(
        properties: &BTreeMap<String, String>,
        metrics: Arc<Metrics>,
        interval: Duration,
    ) -> Result<Self, SinkError> {
        let context = SinkContext {
            metrics: Some(metrics),
            ..SinkContext::default()
        };
        Self::create(properties, context, Some(interval))
    }

    fn create(
        properties: &BTreeMap<String, String>,
        context: SinkContext,
        statistics: Option<Duration>,
    ) -> Result<Self, SinkError> {
        let config = producer_config(properties, statistics)?;
        let producer = create(&config, &context)?;
        Ok(Self {
            inner: Arc::new(Inner {
                config: Mutex::new(config),
                statistics,
                context,
                producer: Mutex::new(producer),
                topics: TopicCache::default(),
            }),
        })
    }

    /// Replaces the producer with one made from `properties` (rotated credentials, on
    /// SIGHUP). Batches in flight finish on the producer they started with, which is dropped
    /// (flushed) after the last of them; the next batch gets the new one, so no message is
    /// lost or sent twice by the swap. Invalid properties leave the current producer in
    /// place. Creating a producer blocks: call it off the async reactor.
    pub(crate) fn reconfigure(
        &self,
        properties: &BTreeMap<String, String>,
    ) -> Result<(), SinkError> {
        let config = producer_config(properties, self.inner.statistics)?;
        let new = create(&config, &self.inner.context)?;
        *self
            .inner
            .config
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = config;
        let old = std::mem::replace(&mut *self.inner.current(), new);
        // The new producer reports its own connection problems, even the old one's again,
        // and its first success logs that the connection works again.
        self.inner.context.connection.producer_replaced();
        // Without a batch holding it, this is the last handle: dropping it flushes and joins
        // librdkafka's threads, so not under the lock and not on the reactor (we are on a
        // blocking thread already).
        drop(old);
        Ok(())
    }

    /// The topics of `messages` that the broker lacks, asking it about topics not seen yet.
    async fn missing_topics<'m>(
        &self,
        producer: &KafkaProducer,
        messages: &'m [OutboundMessage],
    ) -> HashSet<&'m str> {
        let now = Instant::now();
        let mut known: HashMap<&str, Known> = HashMap::new();
        for m in messages {
            known
                .entry(m.topic.as_str())
                .or_insert_with(|| self.inner.topics.lookup(&m.topic, now));
        }
        let unknown: Vec<String> = known
            .iter()
            .filter(|(_, k)| **k == Known::Unknown)
            .map(|(t, _)| (*t).to_owned())
            .collect();
        let answers: Vec<(String, Known)> = futures::stream::iter(unknown)
            .map(|topic| {
                let producer = Arc::clone(producer);
                async move {
                    let asked = {
                        let topic = topic.clone();
                        tokio::task::spawn_blocking(move || ask_broker(&producer, &topic))
                    };
                    (topic, asked.await.unwrap_or(Known::Unknown))
                }
            })
            .buffer_unordered(METADATA_REQUESTS)
            .collect()
            .await;
        for (topic, answer) in answers {
            match answer {
                Known::Present => self.inner.topics.found(&topic),
                Known::Missing => {
                    self.inner.topics.missing(&topic, Instant::now());
                    if let Some(k) = known.get_mut(topic.as_str()) {
                        *k = Known::Missing;
                    }
                }
                Known::Unknown => {}
            }
        }
        known
            .into_iter()
            .filter(|(_, k)| *k == Known::Missing)
            .map(|(t, _)| t)
            .collect()
    }

    /// Replaces a producer that can no longer send. Creating the new producer and dropping
    /// the old one (which flushes and joins librdkafka's threads) block, so both happen on
    /// blocking threads; the next batch already gets the new producer.
    async fn replace_broken(&self, broken: KafkaProducer) {
        let inner = Arc::clone(&self.inner);
        match tokio::task::spawn_blocking(move || inner.replace(broken)).await {
            Ok(retired) => drop_off_reactor(retired),
            Err(e) => tracing::error!(error = %e, "re-creating the kafka producer failed"),
        }
    }
}

impl Inner {
    fn current(&self) -> std::sync::MutexGuard<'_, KafkaProducer> {
        self.producer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_current(&self, producer: &KafkaProducer) -> bool {
        same_producer(&self.current(), producer)
    }

    /// Swaps in a new producer for `broken`, unless another batch did so already. Returns
    /// the producers to drop. Blocks.
    fn replace(&self, broken: KafkaProducer) -> Vec<KafkaProducer> {
        if !self.is_current(&broken) {
            return vec![broken];
        }
        let fatal = broken.client().fatal_error();
        tracing::error!(?fatal, "kafka producer is unusable; re-creating it");
        let config = self
            .config
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match create(&config, &self.context) {
            Ok(new) => {
                let mut current = self.current();
                if same_producer(&current, &broken) {
                    let old = std::mem::replace(&mut *current, new);
                    vec![old, broken]
                } else {
                    vec![new, broken]
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot re-create kafka producer");
                vec![broken]
            }
        }
    }
}

fn same_producer(a: &KafkaProducer, b: &KafkaProducer) -> bool {
    std::ptr::eq(a.client().native_ptr(), b.client().native_ptr())
}

/// Drops producers on a blocking thread: the last handle of a producer flushes and joins
/// librdkafka's threads when dropped.
fn drop_off_reactor(producers: Vec<KafkaProducer>) {
    if !producers.is_empty() {
        tokio::task::spawn_blocking(move || drop(producers));
    }
}

/// The producer's configuration: Sluice's defaults, the user's properties, and the statistics
/// interval with metrics on (unless `[kafka]` sets it).
fn producer_config(
    properties: &BTreeMap<String, String>,
    statistics: Option<Duration>,
) -> Result<ClientConfig, SinkError> {
    if !properties.contains_key("bootstrap.servers") {
        return Err(SinkError::Config {
            reason: "[kafka] needs \"bootstrap.servers\"".to_owned(),
            cause: None,
        });
    }
    let mut config = kafka_client_config(properties);
    if let Some(interval) = statistics
        && !properties.contains_key(STATISTICS_INTERVAL)
    {
        config.set(STATISTICS_INTERVAL, interval.as_millis().max(1).to_string());
    }
    Ok(config)
}

fn create(config: &ClientConfig, context: &SinkContext) -> Result<KafkaProducer, SinkError> {
    config
        .create_with_context(context.clone())
        .map(Arc::new)
        .map_err(|e| SinkError::Config {
            reason: e.to_string(),
            cause: Some(Box::new(e)),
        })
}

/// The version of the librdkafka Sluice is built with (for `sluice_build_info`).
pub(crate) fn librdkafka_version() -> String {
    rdkafka::util::get_rdkafka_version().1
}

/// Asks the broker whether it has `topic`. Blocks up to [`METADATA_TIMEOUT`]. A broker that
/// does not answer, or answers with another error (e.g. a leader election), leaves the
/// question open: the message is sent and its delivery report tells.
fn ask_broker(producer: &KafkaProducer, topic: &str) -> Known {
    match producer
        .client()
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
    {
        Ok(metadata) => match metadata.topics().iter().find(|t| t.name() == topic) {
            Some(t) => match t.error().map(RDKafkaErrorCode::from) {
                None => Known::Present,
                Some(RDKafkaErrorCode::UnknownTopicOrPartition) => Known::Missing,
                Some(_) => Known::Unknown,
            },
            None => Known::Unknown,
        },
        Err(e) => {
            tracing::debug!(topic, error = %e, "topic metadata request failed");
            Known::Unknown
        }
    }
}

/// The failure of a message to a topic the broker lacks.
fn missing_topic(topic: &str) -> SinkError {
    SinkError::publish_failed(
        topic,
        "the broker has no such topic (UnknownTopicOrPartition in its metadata); \
         create the topic, the row is retried",
        PublishFault::Refused,
    )
}

fn record(m: &OutboundMessage, opaque: Opaque) -> BaseRecord<'_, [u8], [u8], Opaque> {
    let headers = m.headers.iter().fold(
        OwnedHeaders::new_with_capacity(m.headers.len()),
        |h, (key, value)| {
            h.insert(Header {
                key,
                value: Some(value.as_slice()),
            })
        },
    );
    let mut record = BaseRecord::with_opaque_to(&m.topic, opaque).headers(headers);
    if let Some(key) = &m.key {
        record = record.key(key.as_slice());
    }
    if let Some(payload) = &m.payload {
        record = record.payload(payload.as_slice());
    }
    if let Some(partition) = m.partition {
        record = record.partition(partition);
    }
    // The record's CreateTime (a topic with message.timestamp.type=LogAppendTime replaces
    // it with the broker's); none: librdkafka stamps the time of the send.
    if let Some(ms) = m.timestamp_ms {
        record = record.timestamp(ms);
    }
    record
}

/// Hands `record` to librdkafka, waiting out a full local queue for up to
/// [`QUEUE_FULL_WAIT`]. An error means the message never reached librdkafka: no report
/// will come for it.
async fn enqueue(
    producer: &KafkaProducer,
    mut record: BaseRecord<'_, [u8], [u8], Opaque>,
) -> Result<(), KafkaError> {
    let deadline = Instant::now() + QUEUE_FULL_WAIT;
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                if Instant::now() < deadline =>
            {
                record = back;
                tokio::time::sleep(QUEUE_FULL_RETRY).await;
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Enqueues every message of a batch (none to a topic in `missing`); returns the batch's
/// reports, one per message, `None` for a missing topic.
async fn send_all(
    producer: &KafkaProducer,
    messages: &[OutboundMessage],
    missing: &HashSet<&str>,
) -> Vec<Result<Delivered, Option<KafkaError>>> {
    let pending: Pending<'_> = producer.context().deliveries.open(messages.len());
    for (index, m) in messages.iter().enumerate() {
        if missing.contains(m.topic.as_str()) {
            // Filed as cancelled; told apart from librdkafka's reports below.
            pending.settle(index, Err(KafkaError::Canceled));
            continue;
        }
        if let Err(e) = enqueue(producer, record(m, pending.opaque(index))).await {
            pending.settle(index, Err(e));
        }
    }
    pending
        .reports()
        .await
        .into_iter()
        .zip(messages)
        .map(|(report, m)| match report {
            Ok(delivered) => Ok(delivered),
            Err(_) if missing.contains(m.topic.as_str()) => Err(None),
            Err(e) => Err(Some(e)),
        })
        .collect()
}

impl Sink for KafkaSink {
    async fn publish(&self, messages: &[OutboundMessage]) -> Vec<Result<Delivered, SinkError>> {
        let producer = Arc::clone(&self.inner.current());
        let missing = self.missing_topics(&producer, messages).await;
        // Every message is in flight before any report is awaited: librdkafka batches them
        // per partition.
        let reports = send_all(&producer, messages, &missing).await;
        let mut fenced = false;
        // One look into the topic cache per topic, not per message.
        let mut acknowledged: HashSet<&str> = HashSet::new();
        let mut unknown: HashSet<&str> = HashSet::new();
        let results = reports
            .into_iter()
            .zip(messages)
            .map(|(report, m)| match report {
                Ok(delivered) => {
                    acknowledged.insert(m.topic.as_str());
                    Ok(delivered)
                }
                Err(None) => Err(missing_topic(&m.topic)),
                Err(Some(e)) => {
                    let code = e.rdkafka_error_code();
                    fenced |= code.is_some_and(producer_is_broken);
                    if code.is_some_and(is_unknown_topic) {
                        unknown.insert(m.topic.as_str());
                    }
                    Err(SinkError::Publish {
                        topic: m.topic.clone(),
                        message: e.to_string(),
                        fault: fault_of(&e),
                        cause: Some(Box::new(e)),
                    })
                }
            })
            .collect();
        for topic in acknowledged.difference(&unknown) {
            self.inner.topics.found(topic);
        }
        for topic in unknown {
            self.inner.topics.forget(topic);
        }
        if fenced || producer.client().fatal_error().is_some() {
            self.replace_broken(producer).await;
        } else if !self.inner.is_current(&producer) {
            // Replaced by another batch meanwhile: this may be the last handle.
            drop_off_reactor(vec![producer]);
        }
        results
    }

    fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        let producer = Arc::clone(&self.inner.current());
        producer
            .flush(Timeout::After(timeout))
            .map_err(|e| SinkError::Flush(Box::new(e)))
    }

    /// Whether the broker answers a metadata request within `timeout`. When it does not, the
    /// error names the cause librdkafka reported (authentication, TLS, unreachable), the same
    /// the log says.
    fn probe(&self, timeout: Duration) -> Result<(), SinkError> {
        // A clone of the handle, so a slow answer does not hold the lock publishing needs.
        let producer = Arc::clone(&self.inner.current());
        let connection = &producer.context().connection;
        match producer.client().fetch_metadata(None, timeout) {
            Ok(_) => {
                connection.works();
                Ok(())
            }
            Err(e) => Err(match connection.problem() {
                Some((problem, reason)) => problem.error(&reason),
                None => SinkError::Unreachable {
                    reason: e.to_string(),
                    cause: Some(Box::new(e)),
                },
            }),
        }
    }
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
    fn failures_are_the_brokers_the_senders_or_the_messages() {
        let fault = |code| fault_of(&KafkaError::MessageProduction(code));
        use PublishFault::*;
        assert_eq!(fault(RDKafkaErrorCode::MessageTimedOut), Unavailable);
        assert_eq!(fault(RDKafkaErrorCode::ProducerFenced), Unavailable);
        assert_eq!(fault(RDKafkaErrorCode::UnknownTopic), Refused);
        assert_eq!(fault(RDKafkaErrorCode::UnknownTopicOrPartition), Refused);
        assert_eq!(fault(RDKafkaErrorCode::MessageSizeTooLarge), Refused);
        assert_eq!(fault(RDKafkaErrorCode::TopicAuthorizationFailed), Refused);
        assert_eq!(fault(RDKafkaErrorCode::InvalidRecord), Failed);
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

    fn message(topic: &str) -> OutboundMessage {
        OutboundMessage {
            row: crate::model::OutboxId::Int(1),
            broker: crate::model::Broker::Kafka,
            topic: topic.to_owned(),
            key: None,
            payload: Some(b"{}".to_vec()),
            headers: Vec::new(),
            partition: None,
            encoding: None,
            value_record: None,
            key_record: None,
            timestamp_ms: None,
        }
    }

    /// With metrics, the queue depth comes from librdkafka's statistics: messages to a broker
    /// that does not answer stay queued, and the gauge says how many.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_producer_queue_gauge_follows_librdkafkas_statistics() {
        let metrics = Arc::new(Metrics::new(
            crate::telemetry::TenantLabels::new(None::<&str>),
            "test",
        ));
        let mut props = BTreeMap::new();
        // Nothing listens there: every message waits in the queue.
        props.insert("bootstrap.servers".to_owned(), "127.0.0.1:1".to_owned());
        props.insert("message.timeout.ms".to_owned(), "60000".to_owned());
        let sink = {
            let metrics = Arc::clone(&metrics);
            tokio::task::spawn_blocking(move || {
                KafkaSink::with_metrics(&props, metrics, Duration::from_millis(100))
            })
            .await
            .unwrap()
            .unwrap()
        };
        let sink = Arc::new(sink);
        let publishing = {
            let sink = Arc::clone(&sink);
            tokio::spawn(async move {
                sink.publish(&[message("t"), message("t"), message("t")])
                    .await
            })
        };
        let queue = |m: &Metrics| {
            m.encode().unwrap().lines().find_map(|l| {
                l.strip_prefix("sluice_producer_queue_messages ")?
                    .parse::<f64>()
                    .ok()
            })
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while queue(&metrics) != Some(3.0) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(queue(&metrics), Some(3.0), "{}", metrics.encode().unwrap());
        publishing.abort();
        let _ = publishing.await;
        let sink = Arc::try_unwrap(sink).ok();
        tokio::task::spawn_blocking(move || drop(sink))
            .await
            .unwrap();
    }

    #[test]
    fn without_metrics_librdkafka_computes_no_statistics() {
        let mut props = BTreeMap::new();
        props.insert("bootstrap.servers".to_owned(), "127.0.0.1:1".to_owned());
        let sink = KafkaSink::new(&props).unwrap();
        assert_eq!(
            sink.inner.config.lock().unwrap().get(STATISTICS_INTERVAL),
            None
        );
    }

    /// A sink on `mock` with one more property (created off the reactor: it starts threads).
    async fn sink_on(
        mock: &rdkafka::mocking::MockCluster<'_, rdkafka::producer::DefaultProducerContext>,
        (key, value): (&str, &str),
    ) -> KafkaSink {
        let mut props = BTreeMap::new();
        props.insert("bootstrap.servers".to_owned(), mock.bootstrap_servers());
        props.insert(key.to_owned(), value.to_owned());
        tokio::task::spawn_blocking(move || KafkaSink::new(&props))
            .await
            .unwrap()
            .unwrap()
    }

    /// A batch larger than librdkafka's local queue waits for room (reports free it) and is
    /// delivered whole, every message reported once, in the batch's order.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_batch_larger_than_the_local_queue_waits_for_room_and_is_delivered() {
        let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
        mock.create_topic("t", 3, 1).unwrap();
        let sink = sink_on(&mock, ("queue.buffering.max.messages", "5")).await;
        let messages: Vec<OutboundMessage> = (0..60).map(|_| message("t")).collect();
        let results = sink.publish(&messages).await;
        assert_eq!(results.len(), 60);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert!(sink.inner.current().context().deliveries_idle());
        tokio::task::spawn_blocking(move || drop(sink))
            .await
            .unwrap();
    }

    /// With a mock cluster (librdkafka's in-process broker): a message to a topic the broker
    /// lacks fails at once, as the tenant's fault, and does not hold up the others.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_message_to_a_missing_topic_fails_at_once_and_the_others_are_delivered() {
        let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
        mock.create_topic("present", 1, 1).unwrap();
        // The mock broker would create the topic when asked about it.
        let sink = sink_on(&mock, ("allow.auto.create.topics", "false")).await;
        let started = Instant::now();
        let results = sink
            .publish(&[message("present"), message("ghost"), message("present")])
            .await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not held for the metadata propagation wait: {:?}",
            started.elapsed()
        );
        // Where the mock broker stored them: its one partition, one after the other.
        let at = |offset| {
            Ok(Delivered {
                partition: Some(0),
                offset: Some(offset),
            })
        };
        assert_eq!(results[0], at(0));
        assert_eq!(results[2], at(1));
        let err = results[1].as_ref().unwrap_err();
        assert_eq!(err.fault(), Some(PublishFault::Refused));
        assert!(err.to_string().contains("ghost"), "{err}");

        // Created later: found once the missing entry is due for a re-check.
        mock.create_topic("ghost", 1, 1).unwrap();
        sink.inner.topics.forget("ghost");
        assert_eq!(sink.publish(&[message("ghost")]).await, vec![at(0)]);
    }
}
