//! Talking to the broker from the harness: creating topics (Tansu does not auto-create them)
//! and reading every partition of some topics from the beginning.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::env::unique;

/// Partitions of every topic the harness creates.
const PARTITIONS: i32 = 3;
/// How long admin and metadata requests may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Creates topics (3 partitions each) through the Kafka admin API; existing topics are fine.
pub async fn create_topics(bootstrap: &str, topics: &[String]) -> anyhow::Result<()> {
    create_topics_with(
        ClientConfig::new().set("bootstrap.servers", bootstrap),
        topics,
    )
    .await
    .with_context(|| format!("on {bootstrap}"))
}

/// [`create_topics`] with a client made from `config` (e.g. with SASL and TLS properties).
pub async fn create_topics_with(config: &ClientConfig, topics: &[String]) -> anyhow::Result<()> {
    create_partitioned_topics(config, topics, PARTITIONS).await
}

/// [`create_topics_with`], each topic with `partitions` partitions (1: one order for all).
pub async fn create_partitioned_topics(
    config: &ClientConfig,
    topics: &[String],
    partitions: i32,
) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = config
        .create()
        .context("cannot create a Kafka admin client")?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    let results = admin
        .create_topics(
            &new,
            &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)),
        )
        .await
        .with_context(|| format!("cannot create topics {topics:?}"))?;
    for r in results {
        if let Err((topic, code)) = r
            && code != RDKafkaErrorCode::TopicAlreadyExists
        {
            bail!("cannot create topic {topic}: {code:?}");
        }
    }
    Ok(())
}

/// Assigns `consumer` every partition of `topics`, from the beginning.
pub fn assign_from_beginning(consumer: &BaseConsumer, topics: &[String]) -> anyhow::Result<()> {
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), ADMIN_TIMEOUT)
            .with_context(|| format!("cannot fetch metadata of topic {topic}"))?;
        let partitions = metadata
            .topics()
            .first()
            .map(|t| t.partitions().len())
            .unwrap_or(0);
        if partitions == 0 {
            bail!("topic {topic} has no partitions");
        }
        for partition in 0..partitions {
            let partition = i32::try_from(partition).context("partition number")?;
            assignment
                .add_partition_offset(topic, partition, Offset::Beginning)
                .with_context(|| format!("cannot assign {topic}/{partition}"))?;
        }
    }
    consumer
        .assign(&assignment)
        .context("cannot assign the consumer's partitions")?;
    Ok(())
}

/// A consumed message.
#[derive(Debug, Clone)]
pub struct Received {
    /// The topic it was read from.
    pub topic: String,
    /// The partition it was read from.
    pub partition: i32,
    /// Its offset in that partition.
    pub offset: i64,
    /// The message key, if it has one.
    pub key: Option<Vec<u8>>,
    /// The value, unless it is a tombstone.
    pub payload: Option<Vec<u8>>,
    /// Its headers, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Its record timestamp in milliseconds since the epoch (CreateTime or LogAppendTime),
    /// if it has one.
    pub timestamp: Option<i64>,
}

impl Received {
    /// The first header called `name`, as text (lossy UTF-8).
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    /// The key as text (lossy UTF-8; empty without a key).
    pub fn key_str(&self) -> String {
        String::from_utf8_lossy(self.key.as_deref().unwrap_or_default()).into_owned()
    }

    /// The value as JSON (`Null` if it is none or not JSON).
    pub fn payload_json(&self) -> serde_json::Value {
        serde_json::from_slice(self.payload.as_deref().unwrap_or_default())
            .unwrap_or(serde_json::Value::Null)
    }
}

/// Reads every partition of `topics` from the beginning until `expected` messages arrived
/// (then keeps reading for `settle` to catch extras) or `timeout` passed.
pub fn consume(
    bootstrap: &str,
    topics: &[String],
    expected: usize,
    timeout: Duration,
    settle: Duration,
) -> anyhow::Result<Vec<Received>> {
    consume_until(bootstrap, topics, timeout, settle, |got| {
        got.len() >= expected
    })
}

/// Reads every partition of `topics` from the beginning until `done(messages so far)` holds
/// (then keeps reading for `settle`) or `timeout` passed.
pub fn consume_until(
    bootstrap: &str,
    topics: &[String],
    timeout: Duration,
    settle: Duration,
    done: impl FnMut(&[Received]) -> bool,
) -> anyhow::Result<Vec<Received>> {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    consume_until_with(config, topics, timeout, settle, done)
}

/// [`consume_until`] with a consumer made from `config` (e.g. with SASL and TLS properties).
pub fn consume_until_with(
    mut config: ClientConfig,
    topics: &[String],
    timeout: Duration,
    settle: Duration,
    mut done: impl FnMut(&[Received]) -> bool,
) -> anyhow::Result<Vec<Received>> {
    let consumer: BaseConsumer = config
        .set("group.id", unique("test-consumer"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    assign_from_beginning(&consumer, topics)?;
    let start = Instant::now();
    let mut settle_until: Option<Instant> = None;
    let mut out = Vec::new();
    loop {
        let now = Instant::now();
        if now - start > timeout || settle_until.is_some_and(|t| now > t) {
            break;
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Received {
                    topic: m.topic().to_owned(),
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().map(<[u8]>::to_vec),
                    headers,
                    timestamp: m.timestamp().to_millis(),
                });
                if settle_until.is_none() && done(&out) {
                    settle_until = Some(Instant::now() + settle);
                }
            }
            Some(Err(e)) => bail!("consume: {e}"),
            None => {}
        }
    }
    Ok(out)
}

/// Counts messages per `id` header.
pub fn count_by_id(messages: &[Received]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for m in messages {
        *counts
            .entry(m.header("id").unwrap_or_default())
            .or_insert(0) += 1;
    }
    counts
}
