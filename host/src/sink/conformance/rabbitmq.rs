//! The RabbitMQ fixture: a direct exchange of the suite's own, a new queue bound to it per
//! destination (routing key = the queue's name), and messages read back with `basic.get` as
//! a consumer would, `sluice-key` and `sluice-tombstone` mapped back to key and tombstone.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use super::{BrokerFixture, Received};
use crate::model::Broker;
use crate::sink::rabbitmq::message::{KEY_HEADER, TOMBSTONE_HEADER};
use crate::sink::rabbitmq::settings::DEFAULT_MAX_MESSAGE_BYTES;
use crate::sink::{RabbitmqSettings, RabbitmqSink};

/// The exchange every sink of the suite publishes to (declared by each fixture; not durable:
/// the broker forgets it when restarted).
pub(crate) const EXCHANGE: &str = "sluice.conformance";

/// How long `received` waits for more once it has what it waited for.
const MORE: Duration = Duration::from_millis(300);

/// The local RabbitMQ (`SLUICE_TEST_RABBITMQ`, default `127.0.0.1:5672`, user guest/guest)
/// and a connection of the fixture's own to it.
pub(super) struct RabbitmqFixture {
    address: String,
    /// Kept open: the exclusive queues live as long as it does.
    _connection: Connection,
    channel: Channel,
}

/// The broker's address, `host:port`.
pub(crate) fn test_address() -> String {
    std::env::var("SLUICE_TEST_RABBITMQ").unwrap_or_else(|_| "127.0.0.1:5672".to_owned())
}

/// A name no other test uses, under `prefix`.
pub(crate) fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}.{}.{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        fastrand::u32(..)
    )
}

/// `[rabbitmq]` for the broker at `address` (guest/guest, default vhost) with `extra` lines.
pub(crate) fn settings_at(address: &str, extra: &str) -> RabbitmqSettings {
    toml::from_str(&format!(
        "url = \"amqp://guest:guest@{address}/%2f\"\n{extra}"
    ))
    .expect("rabbitmq settings")
}

/// A connection and channel of a test's own to the broker at `address`.
pub(crate) async fn open(address: &str) -> (Connection, Channel) {
    let connection = Connection::connect(
        &format!("amqp://guest:guest@{address}/%2f"),
        ConnectionProperties::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("RabbitMQ at {address} (SLUICE_TEST_RABBITMQ): {e}"));
    let channel = connection.create_channel().await.expect("channel");
    (connection, channel)
}

/// Declares an exclusive queue called `name`, bound to `exchange` with its name as routing
/// key (for the default exchange, the queue alone is the binding).
pub(crate) async fn bound_queue(channel: &Channel, exchange: &str, name: &str) {
    let exclusive = QueueDeclareOptions {
        exclusive: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(name.into(), exclusive, FieldTable::default())
        .await
        .expect("declare queue");
    if !exchange.is_empty() {
        channel
            .queue_bind(
                name.into(),
                exchange.into(),
                name.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind queue");
    }
}

/// The messages in `queue`, taken from it with `basic.get`: waits up to `timeout` until at
/// least `at_least` have come, then [`MORE`] for more.
pub(crate) async fn drain(
    channel: &Channel,
    queue: &str,
    at_least: usize,
    timeout: Duration,
) -> Vec<lapin::message::Delivery> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut quiet_until: Option<tokio::time::Instant> = None;
    let mut got = Vec::new();
    let take = BasicGetOptions { no_ack: true };
    loop {
        let now = tokio::time::Instant::now();
        match channel
            .basic_get(queue.into(), take)
            .await
            .expect("basic.get")
        {
            Some(message) => {
                got.push(message.delivery);
                continue;
            }
            None if got.len() >= at_least => {
                let until = *quiet_until.get_or_insert(now + MORE);
                if now >= until {
                    return got;
                }
            }
            None if now >= deadline => return got,
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A message as the suite compares it: headers in the table's order (a repeated name's
/// values in order), key and tombstone from their headers.
pub(crate) fn received(delivery: &lapin::message::Delivery) -> Received {
    let mut key = None;
    let mut tombstone = false;
    let mut headers = Vec::new();
    let table = delivery.properties.headers().clone().unwrap_or_default();
    for (name, value) in &table {
        let values: Vec<Vec<u8>> = match value {
            AMQPValue::FieldArray(items) => items.as_slice().iter().map(bytes).collect(),
            one => vec![bytes(one)],
        };
        match name.as_str() {
            KEY_HEADER => key = values.into_iter().next(),
            TOMBSTONE_HEADER => tombstone = values.first().is_some_and(|v| v == b"true"),
            other => headers.extend(values.into_iter().map(|v| (other.to_owned(), v))),
        }
    }
    Received {
        key,
        payload: (!tombstone).then(|| delivery.data.clone()),
        headers,
    }
}

fn bytes(value: &AMQPValue) -> Vec<u8> {
    match value {
        AMQPValue::LongString(s) => s.as_bytes().to_vec(),
        other => panic!("a header that is not a byte string: {other:?}"),
    }
}

impl BrokerFixture for RabbitmqFixture {
    type Sink = RabbitmqSink;

    const BROKER: Broker = Broker::Rabbitmq;

    /// A field table is a map.
    const KEEPS_HEADER_ORDER: bool = false;

    async fn new() -> Self {
        let address = test_address();
        let (connection, channel) = open(&address).await;
        channel
            .exchange_declare(
                EXCHANGE.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare the suite's exchange");
        Self {
            address,
            _connection: connection,
            channel,
        }
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    async fn sink_at(&self, address: &str) -> RabbitmqSink {
        // Short enough that a stalled batch ends soon, long enough for a delayed proxy.
        let settings = settings_at(
            address,
            &format!("exchange = \"{EXCHANGE}\"\ntimeout = \"5s\""),
        );
        RabbitmqSink::connect(&settings)
            .await
            .expect("rabbitmq sink")
    }

    async fn destination(&self) -> String {
        let name = unique("sluice.conformance");
        bound_queue(&self.channel, EXCHANGE, &name).await;
        name
    }

    async fn missing_destination(&self) -> String {
        unique("sluice.conformance.unbound")
    }

    async fn received(
        &self,
        destination: &str,
        at_least: usize,
        timeout: Duration,
    ) -> Vec<Received> {
        drain(&self.channel, destination, at_least, timeout)
            .await
            .iter()
            .map(received)
            .collect()
    }

    fn oversized_payload(&self) -> Vec<u8> {
        vec![b'x'; DEFAULT_MAX_MESSAGE_BYTES + 1]
    }
}
