//! Talking to the broker: creating topics (Tansu does not auto-create them), the naive relay's
//! producer and the latency scenario's consumer.

use std::time::Duration;

use anyhow::{Context, bail};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureProducer;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Partitions of every benchmark topic.
const PARTITIONS: i32 = 3;
/// How long admin and metadata requests may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The producer settings of `sluice run` (host/src/sink/kafka.rs `DEFAULT_PROPERTIES`:
/// idempotence and acks=all so retries neither duplicate nor lose, a 30 s delivery timeout),
/// plus `linger.ms=1`, so the naive relay is compared like for like.
pub const PRODUCER_PROPERTIES: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("message.timeout.ms", "30000"),
    ("linger.ms", "1"),
];

/// The two topics the reference router writes to for the benchmark rows.
pub fn topics(prefix: &str) -> Vec<String> {
    vec![format!("{prefix}order"), format!("{prefix}customer")]
}

/// Creates `topics` with 3 partitions each; topics that already exist are fine.
pub async fn create_topics(bootstrap: &str, topics: &[String]) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("cannot create a Kafka admin client")?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1)))
        .collect();
    let results = admin
        .create_topics(
            &new,
            &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)),
        )
        .await
        .with_context(|| format!("cannot create topics {topics:?} on {bootstrap}"))?;
    for result in results {
        if let Err((topic, code)) = result
            && code != RDKafkaErrorCode::TopicAlreadyExists
        {
            bail!("cannot create topic {topic} on {bootstrap}: {code:?}");
        }
    }
    Ok(())
}

/// A producer with [`PRODUCER_PROPERTIES`].
pub fn producer(bootstrap: &str) -> anyhow::Result<FutureProducer> {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    for (key, value) in PRODUCER_PROPERTIES {
        config.set(*key, *value);
    }
    config.create().context("cannot create the Kafka producer")
}

/// A consumer assigned to every partition of `topics` from the beginning, tuned to hand out
/// each message as soon as the broker has it (`fetch.wait.max.ms=5`, `fetch.min.bytes=1`).
pub fn low_latency_consumer(
    bootstrap: &str,
    group: &str,
    topics: &[String],
) -> anyhow::Result<BaseConsumer> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "5")
        .set("fetch.min.bytes", "1")
        .create()
        .context("cannot create the Kafka consumer")?;
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
    Ok(consumer)
}
