//! The brokers besides Kafka that `sluice-bench brokers` publishes to, each through the client
//! its sink uses (`host/src/sink/<broker>/`): the destinations a drain needs made before it
//! (a JetStream stream, RabbitMQ queues) and removed after it, and the produce ceiling — the
//! drain's messages sent as fast as one client takes them, each counted once the broker
//! confirms it the way the sink waits for.
//!
//! - [`nats`]: NATS JetStream (async-nats)
//! - [`rabbitmq`]: RabbitMQ, AMQP 0-9-1 (lapin)
//! - [`redis`]: Redis Streams (redis-rs)
//!
//! Kafka's ceiling is the pipeline scenario's ([`crate::kafka`], librdkafka).

use std::time::Instant;

use anyhow::bail;
pub(crate) use sluice::model::Broker;

use crate::procstat::{self, SystemSample};

pub(crate) mod nats;
pub(crate) mod rabbitmq;
pub(crate) mod redis;

/// Aggregate ids of the standard rows (`bench/src/outbox.rs`).
const AGGREGATES: u64 = 1_000;
/// The tenant of rows without one: what `sluice run` stamps as `sluice-tenant`.
const DEFAULT_TENANT: &str = "default";

/// The process a broker runs as on this machine (its CPU is read from `/proc` by that name:
/// one of [`procstat::SERVERS`]).
pub(crate) fn server_command(broker: Broker) -> &'static str {
    match broker {
        Broker::Kafka => "tansu",
        Broker::Nats => "nats-server",
        Broker::Rabbitmq => "beam.smp",
        Broker::Redis => "redis-server",
    }
}

/// The broker's server as figures name it.
pub(crate) fn server_label(broker: Broker) -> &'static str {
    match broker {
        Broker::Kafka => "Tansu",
        Broker::Nats => "nats-server",
        Broker::Rabbitmq => "RabbitMQ",
        Broker::Redis => "Redis",
    }
}

/// A message as `sluice run` publishes it for standard row `g` with the reference plugin
/// (`<prefix>order` for even `g`, `<prefix>customer` for odd; key `agg-<g mod 1000>`; the row's
/// 256-byte JSON payload; headers `id` and `event-type` from the plugin, `sluice-tenant` and
/// `sluice-outbox-id` from the host, in that order). Row ids are 1, 2, … as in a fresh table.
#[derive(Debug, Clone)]
pub(crate) struct Standard {
    /// Index into the two destinations: 0 (`order`) or 1 (`customer`).
    pub destination: usize,
    pub key: String,
    pub payload: String,
    /// The outbox id, as text.
    pub id: String,
}

impl Standard {
    pub(crate) fn new(g: u64) -> Self {
        Self {
            destination: usize::from(!g.is_multiple_of(2)),
            key: format!("agg-{}", g % AGGREGATES),
            // jsonb's text form of the row's payload: 256 bytes.
            payload: format!(r#"{{"n": {g}, "pad": "{}"}}"#, "x".repeat(236)),
            id: g.to_string(),
        }
    }

    /// Messages of rows 1 to `rows`.
    pub(crate) fn all(rows: u64) -> Vec<Self> {
        (1..=rows).map(Self::new).collect()
    }

    /// The headers in the order the relay adds them.
    pub(crate) fn headers(&self) -> [(&'static str, &str); 4] {
        [
            ("id", &self.id),
            ("event-type", "Created"),
            ("sluice-tenant", DEFAULT_TENANT),
            ("sluice-outbox-id", &self.id),
        ]
    }

    /// The id the sinks give the message: `{message_id_prefix}{row}-{index}`, the row's only
    /// message (the sinks' default prefix is the outbox table's name and `:`).
    pub(crate) fn message_id(&self, prefix: &str) -> String {
        format!("{prefix}{}-0", self.id)
    }
}

/// The two destinations (topic, subject, routing key, stream key) the reference plugin
/// writes the standard rows to under `prefix`, in [`Standard::destination`] order.
pub(crate) fn destinations(prefix: &str) -> [String; 2] {
    [format!("{prefix}order"), format!("{prefix}customer")]
}

/// What one produce ceiling measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ceiling {
    /// Confirmed messages per second.
    pub rate: f64,
    /// This process's CPU seconds per 1,000 messages: the client's side alone.
    pub producer_cpu_per_1k: f64,
    /// The broker's CPU seconds per 1,000 messages.
    pub broker_cpu_per_1k: f64,
}

/// Times a produce ceiling: this process's CPU and `broker`'s server's from before `produce`
/// to its end, and the wall clock. `produce` returns how many messages the broker confirmed;
/// fewer than `rows` is an error.
pub(crate) async fn timed<F>(broker: Broker, rows: u64, produce: F) -> anyhow::Result<Ceiling>
where
    F: Future<Output = anyhow::Result<u64>>,
{
    let cpu_before = procstat::sample(std::process::id())?.cpu_ticks;
    let system_before = SystemSample::now();
    let start = Instant::now();
    let confirmed = produce.await?;
    let elapsed = start.elapsed();
    let system_after = SystemSample::now();
    let cpu = procstat::cpu_seconds(procstat::sample(std::process::id())?.cpu_ticks - cpu_before);
    if confirmed != rows {
        bail!("the broker confirmed {confirmed} of {rows} messages");
    }
    let per_1k = |seconds: f64| seconds / rows as f64 * 1000.0;
    Ok(Ceiling {
        rate: rows as f64 / elapsed.as_secs_f64(),
        producer_cpu_per_1k: per_1k(cpu),
        broker_cpu_per_1k: per_1k(
            system_before.server_seconds(&system_after, server_command(broker)),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_messages_are_shaped_like_the_drains() {
        let m = Standard::new(1042);
        assert_eq!(m.destination, 0);
        assert_eq!(m.key, "agg-42");
        // PostgreSQL's text form of `jsonb_build_object('n', 1042, 'pad', repeat('x', 236))`.
        assert_eq!(m.payload.len(), 258, "{}", m.payload);
        assert!(m.payload.starts_with(r#"{"n": 1042, "pad": "xx"#));
        assert_eq!(m.message_id("t:"), "t:1042-0");
        assert_eq!(Standard::new(7).destination, 1);
        assert_eq!(
            destinations("p.")[Standard::new(7).destination],
            "p.customer"
        );
    }

    #[test]
    fn every_broker_has_a_sampled_server() {
        for broker in Broker::ALL {
            assert!(procstat::SERVERS.contains(&server_command(broker)));
        }
    }
}
