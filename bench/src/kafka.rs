//! The benchmark's Kafka clients: the naive relay's producer and the latency scenario's
//! consumer (creating topics is the test kit's).

use anyhow::Context;
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::FutureProducer;
use sluice_testkit::kafka::assign_from_beginning;
pub(crate) use sluice_testkit::kafka::create_topics;

/// The producer settings of `sluice run` (host/src/sink/kafka.rs `DEFAULT_PROPERTIES`:
/// idempotence and acks=all so retries neither duplicate nor lose, a 30 s delivery timeout),
/// plus `linger.ms=1`, so the naive relay is compared like for like.
pub(crate) const PRODUCER_PROPERTIES: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("message.timeout.ms", "30000"),
    ("linger.ms", "1"),
];

/// The two topics the reference router writes to for the benchmark rows.
pub(crate) fn topics(prefix: &str) -> Vec<String> {
    vec![format!("{prefix}order"), format!("{prefix}customer")]
}

/// A producer with [`PRODUCER_PROPERTIES`].
pub(crate) fn producer(bootstrap: &str) -> anyhow::Result<FutureProducer> {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    for (key, value) in PRODUCER_PROPERTIES {
        config.set(*key, *value);
    }
    config.create().context("cannot create the Kafka producer")
}

/// A consumer assigned to every partition of `topics` from the beginning, tuned to hand out
/// each message as soon as the broker has it (`fetch.wait.max.ms=5`, `fetch.min.bytes=1`).
pub(crate) fn low_latency_consumer(
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
    assign_from_beginning(&consumer, topics)?;
    Ok(consumer)
}
