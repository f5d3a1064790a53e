//! The sink conformance suite: one set of test bodies, run against every broker Sluice
//! publishes to (Kafka through Tansu, NATS JetStream, RabbitMQ, Redis Streams), as the store
//! conformance suite runs one set against every database.
//!
//! Each body is a generic function over a [`BrokerFixture`]: a connection to the test broker
//! that makes destinations and reads what arrived the way a consumer of that broker would,
//! never through the sink under test. [`conformance!`] stamps out one `#[tokio::test]` per
//! body and broker.
//!
//! What every sink must show:
//! - each message arrives once, in the order sent to one destination, key, payload and
//!   headers byte for byte (host headers included);
//! - a destination the broker has nothing for fails the message as [`PublishFault::Refused`]
//!   (the tenant's fault), and only that message;
//! - a message too large for the broker fails as `Refused`, and only that message;
//! - a broker that stalls mid-batch, or drops every connection (a restart), makes the batch
//!   fail as [`PublishFault::Unavailable`] or succeed — never `Ok` for a message the broker
//!   did not keep — and the next batch is delivered once the broker answers again;
//! - an acknowledgement says where the broker stored the message as far as the broker tells
//!   ([`BrokerFixture::REPORTS`]): Kafka its partition and offsets increasing in it, NATS
//!   JetStream increasing stream sequences, the others nothing;
//! - `flush` at shutdown waits for messages in flight;
//! - `probe` answers for a healthy broker and fails for a silent one.
//!
//! Brokers are found at `SLUICE_TEST_KAFKA` (default `127.0.0.1:9092`), `SLUICE_TEST_NATS`
//! (`127.0.0.1:4222`), `SLUICE_TEST_RABBITMQ` (`127.0.0.1:5672`, guest/guest) and
//! `SLUICE_TEST_REDIS` (`127.0.0.1:6379`). Run the suite alone with `cargo test -p sluice
//! --lib sink::conformance`.

use std::time::{Duration, Instant};

use sluice_testkit::stall::StallingProxy;

use super::{Delivered, PublishFault, Sink, SinkError};
use crate::model::{Broker, Headers, OutboundMessage, OutboxId};

/// One message as a consumer of the broker read it back.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Received {
    pub key: Option<Vec<u8>>,
    /// `None`: a tombstone (no value).
    pub payload: Option<Vec<u8>>,
    /// In the order sent; the broker-specific ones (`Nats-Msg-Id`, a stream entry's `key` or
    /// `value` field) left out.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// What a broker's acknowledgement says of where it stored a message ([`Delivered`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reports {
    /// Nothing (RabbitMQ's publisher confirms, Redis's entry ids).
    Nothing,
    /// A position in the destination, increasing as messages are stored (JetStream's stream
    /// sequence); no partition.
    Sequence,
    /// The partition and the offset in it (Kafka).
    PartitionAndOffset,
}

/// A test broker, and what the suite needs of it besides the sink under test.
pub(super) trait BrokerFixture: Sized + Send + Sync + 'static {
    type Sink: Sink;

    /// The broker this fixture is for.
    const BROKER: Broker;

    /// Whether headers arrive in the order sent. A broker whose headers are a map (AMQP's
    /// field table; NATS, whose every client holds headers name to values) returns them in
    /// the map's order; the values of one name keep their order
    /// there too, and the bodies compare headers grouped by name (stably) instead.
    const KEEPS_HEADER_ORDER: bool = true;

    /// What the broker's acknowledgements say of where messages were stored.
    const REPORTS: Reports = Reports::Nothing;

    /// Connects to the test broker.
    async fn new() -> Self;

    /// The broker's address, `host:port`.
    fn address(&self) -> String;

    /// A sink publishing to the test broker at `address` (`host:port`: the broker's own, or a
    /// proxy's in front of it). Created inside the test's runtime.
    async fn sink_at(&self, address: &str) -> Self::Sink;

    /// A destination that exists and is empty, new to this call: a topic, a subject of a new
    /// stream, a routing key bound to a new queue, a stream key.
    async fn destination(&self) -> String;

    /// A destination name the broker has nothing for.
    async fn missing_destination(&self) -> String;

    /// What arrived at `destination`, in the broker's order: waits up to `timeout` until at
    /// least `at_least` have, then a short while for more (duplicates must show).
    async fn received(
        &self,
        destination: &str,
        at_least: usize,
        timeout: Duration,
    ) -> Vec<Received>;

    /// A payload the broker, or the sink's own limit for it, refuses as too large.
    fn oversized_payload(&self) -> Vec<u8>;

    /// A sink whose every connection to the broker passes the returned proxy, so a body can
    /// stall or cut them; from then on the fixture's destinations and reads are on the broker
    /// behind it. (Kafka overrides it: a client connects to the address the broker
    /// advertises, so its broker must advertise the proxy.)
    async fn proxied(&mut self) -> (StallingProxy, Self::Sink) {
        let proxy = StallingProxy::start(&self.address()).expect("start a proxy");
        let sink = self.sink_at(&format!("127.0.0.1:{}", proxy.port())).await;
        (proxy, sink)
    }
}

/// How long a body waits for messages it expects.
const ARRIVAL: Duration = Duration::from_secs(20);

/// A message for row `row` to `destination`, with a key, a JSON payload and host headers.
fn message(destination: &str, row: i64, key: &str) -> OutboundMessage {
    let headers: Headers = vec![
        ("sluice-tenant".to_owned(), b"acme".to_vec()),
        ("sluice-outbox-id".to_owned(), row.to_string().into_bytes()),
        ("trace".to_owned(), format!("t{row}").into_bytes()),
    ];
    OutboundMessage {
        row: OutboxId::Int(row),
        broker: Broker::Kafka,
        topic: destination.to_owned(),
        key: Some(key.as_bytes().to_vec()),
        payload: Some(format!(r#"{{"n":{row}}}"#).into_bytes()),
        headers,
        partition: None,
        encoding: None,
        value_record: None,
        key_record: None,
        timestamp_ms: None,
    }
}

/// `n` messages to `destination`, rows `first..first + n`, keys cycling through `keys`.
fn messages<F: BrokerFixture>(destination: &str, first: i64, n: i64) -> Vec<OutboundMessage> {
    (first..first + n)
        .map(|row| {
            let mut m = message(destination, row, &format!("k{}", row % 4));
            m.broker = F::BROKER;
            m
        })
        .collect()
}

fn rows_of(received: &[Received]) -> Vec<i64> {
    received
        .iter()
        .map(|r| {
            let id = r.header("sluice-outbox-id").unwrap_or_default();
            String::from_utf8_lossy(id).parse().unwrap_or(-1)
        })
        .collect()
}

/// `headers` as the bodies compare them: as sent, or grouped by name (each name's values in
/// their order) for a broker that does not keep the order across names.
fn comparable<F: BrokerFixture>(headers: &Headers) -> Headers {
    let mut headers = headers.clone();
    if !F::KEEPS_HEADER_ORDER {
        // Stable: the values of one name stay in their order.
        headers.sort_by(|a, b| a.0.cmp(&b.0));
    }
    headers
}

fn assert_all_ok(results: &[Result<Delivered, SinkError>]) {
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .collect();
    assert!(failed.is_empty(), "failed: {failed:?}");
}

/// Publishes the messages of `batch` whose `results` failed again and again, as the relay
/// would on their rows' next claims, until each is confirmed or [`ARRIVAL`] passed; returns
/// those never confirmed.
async fn publish_until_confirmed<S: Sink>(
    sink: &S,
    batch: &[OutboundMessage],
    results: &[Result<Delivered, SinkError>],
) -> Vec<OutboundMessage> {
    let mut pending: Vec<OutboundMessage> = batch
        .iter()
        .zip(results)
        .filter(|(_, r)| r.is_err())
        .map(|(m, _)| m.clone())
        .collect();
    let deadline = Instant::now() + ARRIVAL;
    while !pending.is_empty() && Instant::now() < deadline {
        let results = sink.publish(&pending).await;
        pending = pending
            .into_iter()
            .zip(results)
            .filter(|(_, r)| r.is_err())
            .map(|(m, _)| m)
            .collect();
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    pending
}

// ---------------------------------------------------------------------------------------------
// Bodies

/// Every message of a batch arrives once, in order, byte for byte.
async fn each_message_once_in_order_with_headers<F: BrokerFixture>() {
    let f = F::new().await;
    let sink = f.sink_at(&f.address()).await;
    let to = f.destination().await;
    let batch = messages::<F>(&to, 1, 200);
    assert_all_ok(&sink.publish(&batch).await);
    let got = f.received(&to, batch.len(), ARRIVAL).await;
    assert_eq!(
        rows_of(&got),
        (1..=200).collect::<Vec<_>>(),
        "each once, in order"
    );
    for (sent, got) in batch.iter().zip(&got) {
        assert_eq!(got.key, sent.key);
        assert_eq!(got.payload, sent.payload);
        assert_eq!(
            comparable::<F>(&got.headers),
            comparable::<F>(&sent.headers)
        );
    }
}

/// Headers keep their order (across names only where the broker keeps it:
/// [`BrokerFixture::KEEPS_HEADER_ORDER`]), duplicates and bytes; a tombstone and a message
/// without a key arrive as such.
async fn headers_tombstones_and_keyless_round_trip<F: BrokerFixture>() {
    let f = F::new().await;
    let sink = f.sink_at(&f.address()).await;
    let to = f.destination().await;
    let mut repeated = message(&to, 1, "k");
    repeated.broker = F::BROKER;
    repeated.headers.extend([
        ("trace".to_owned(), b"second".to_vec()),
        ("empty".to_owned(), Vec::new()),
        ("utf8".to_owned(), "grüße ✓".as_bytes().to_vec()),
    ]);
    let mut keyless = message(&to, 2, "unused");
    keyless.broker = F::BROKER;
    keyless.key = None;
    let mut tombstone = message(&to, 3, "gone");
    tombstone.broker = F::BROKER;
    tombstone.payload = None;
    let batch = vec![repeated, keyless, tombstone];
    assert_all_ok(&sink.publish(&batch).await);
    let got = f.received(&to, 3, ARRIVAL).await;
    assert_eq!(rows_of(&got), vec![1, 2, 3]);
    for (sent, got) in batch.iter().zip(&got) {
        assert_eq!(
            comparable::<F>(&got.headers),
            comparable::<F>(&sent.headers),
            "row {}",
            sent.row
        );
        assert_eq!(got.key, sent.key, "row {}", sent.row);
        assert_eq!(got.payload, sent.payload, "row {}", sent.row);
    }
}

/// A destination the broker lacks fails its messages as the tenant's fault; the rest of the
/// batch is delivered.
async fn a_missing_destination_is_refused_alone<F: BrokerFixture>() {
    let f = F::new().await;
    let sink = f.sink_at(&f.address()).await;
    let to = f.destination().await;
    let missing = f.missing_destination().await;
    let mut batch = messages::<F>(&to, 1, 3);
    let mut lost = message(&missing, 4, "k");
    lost.broker = F::BROKER;
    batch.insert(1, lost);
    let results = sink.publish(&batch).await;
    assert_eq!(results.len(), 4);
    match &results[1] {
        Err(e) => assert_eq!(e.fault(), Some(PublishFault::Refused), "{e}"),
        Ok(_) => panic!("a message to {missing} was acknowledged"),
    }
    for i in [0, 2, 3] {
        assert!(results[i].is_ok(), "{:?}", results[i]);
    }
    assert_eq!(rows_of(&f.received(&to, 3, ARRIVAL).await), vec![1, 2, 3]);
}

/// A message too large for the broker fails as the tenant's fault, alone.
async fn an_oversized_message_is_refused_alone<F: BrokerFixture>() {
    let f = F::new().await;
    let sink = f.sink_at(&f.address()).await;
    let to = f.destination().await;
    let mut batch = messages::<F>(&to, 1, 3);
    batch[1].payload = Some(f.oversized_payload());
    let results = sink.publish(&batch).await;
    match &results[1] {
        Err(e) => assert_eq!(e.fault(), Some(PublishFault::Refused), "{e}"),
        Ok(_) => panic!("an oversized message was acknowledged"),
    }
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert_eq!(rows_of(&f.received(&to, 2, ARRIVAL).await), vec![1, 3]);
}

/// A broker that stops answering mid-batch: the batch ends within the sink's timeout, every
/// message it did not confirm is `Unavailable` (never the tenant's fault), nothing confirmed
/// is missing; once the broker answers again the same messages go through (duplicates allowed,
/// loss not).
async fn a_stalled_broker_loses_nothing_and_blames_no_tenant<F: BrokerFixture>() {
    let mut f = F::new().await;
    let (proxy, sink) = f.proxied().await;
    let to = f.destination().await;
    // Connected and working first.
    assert_all_ok(&sink.publish(&messages::<F>(&to, 1, 5)).await);
    // Slowed down, so the freeze surely comes while the batch is on the wire: no
    // confirmation can be back before it.
    proxy.delay(Duration::from_millis(40));
    let batch = messages::<F>(&to, 6, 50);
    let publishing = sink.publish(&batch);
    let freeze = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        proxy.freeze();
    };
    let started = Instant::now();
    let (results, ()) = tokio::join!(publishing, freeze);
    let took = started.elapsed();
    proxy.thaw();
    proxy.delay(Duration::ZERO);
    assert!(
        took < Duration::from_secs(120),
        "a stalled batch took {took:?}"
    );
    assert!(
        results.iter().all(Result::is_err),
        "acknowledged while the broker was silent: {results:?}"
    );
    let confirmed: Vec<i64> = batch
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|(m, _)| m.row.to_string().parse().unwrap_or(-1))
        .collect();
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(r.fault(), Some(PublishFault::Unavailable), "{r}");
    }
    // What failed is published again, as the relay would on the rows' next claim.
    let pending = publish_until_confirmed(&sink, &batch, &results).await;
    assert!(pending.is_empty(), "{} never went through", pending.len());
    let got = rows_of(&f.received(&to, 55, ARRIVAL).await);
    for row in 1..=55 {
        assert!(
            got.contains(&row),
            "row {row} lost; confirmed early: {confirmed:?}"
        );
    }
}

/// A broker that drops every connection mid-batch (a restart): as a stall, nothing confirmed
/// is lost and the sink reconnects by itself.
async fn a_broker_restart_loses_nothing<F: BrokerFixture>() {
    let mut f = F::new().await;
    let (proxy, sink) = f.proxied().await;
    let to = f.destination().await;
    assert_all_ok(&sink.publish(&messages::<F>(&to, 1, 5)).await);
    proxy.delay(Duration::from_millis(40));
    let batch = messages::<F>(&to, 6, 200);
    let publishing = sink.publish(&batch);
    let cut = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        proxy.cut();
        proxy.delay(Duration::ZERO);
    };
    let (results, ()) = tokio::join!(publishing, cut);
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(r.fault(), Some(PublishFault::Unavailable), "{r}");
    }
    let pending = publish_until_confirmed(&sink, &batch, &results).await;
    assert!(pending.is_empty(), "{} never went through", pending.len());
    let got = rows_of(&f.received(&to, 205, ARRIVAL).await);
    for row in 1..=205 {
        assert!(got.contains(&row), "row {row} lost");
    }
}

/// Each acknowledgement says where the broker stored the message, as far as the broker tells
/// ([`BrokerFixture::REPORTS`]): in the destination's one partition (Kafka), at positions
/// that increase message by message and batch by batch.
async fn acknowledgements_say_where_messages_were_stored<F: BrokerFixture>() {
    let f = F::new().await;
    let sink = f.sink_at(&f.address()).await;
    let to = f.destination().await;
    let mut delivered: Vec<Delivered> = Vec::new();
    for first in [1, 21] {
        let results = sink.publish(&messages::<F>(&to, first, 20)).await;
        assert_all_ok(&results);
        delivered.extend(results.into_iter().flatten());
    }
    assert_eq!(delivered.len(), 40);
    let partitions: Vec<Option<i32>> = delivered.iter().map(|d| d.partition).collect();
    let offsets: Vec<Option<i64>> = delivered.iter().map(|d| d.offset).collect();
    match F::REPORTS {
        Reports::Nothing => {
            assert!(
                delivered.iter().all(|d| *d == Delivered::default()),
                "{delivered:?}"
            );
            return;
        }
        // The fixture's topics have one partition.
        Reports::PartitionAndOffset => {
            assert!(partitions.iter().all(|p| *p == Some(0)), "{partitions:?}")
        }
        Reports::Sequence => assert!(partitions.iter().all(Option::is_none), "{partitions:?}"),
    }
    let offsets: Vec<i64> = offsets.into_iter().flatten().collect();
    assert_eq!(
        offsets.len(),
        40,
        "every message has a position: {delivered:?}"
    );
    assert!(
        offsets.windows(2).all(|w| w[0] < w[1]),
        "positions not increasing: {offsets:?}"
    );
}

/// Per key, batches arrive in the order they were published (one destination).
async fn order_per_key_holds_across_batches<F: BrokerFixture>() {
    let f = F::new().await;
    let sink = f.sink_at(&f.address()).await;
    let to = f.destination().await;
    for first in (1..=300).step_by(50) {
        assert_all_ok(&sink.publish(&messages::<F>(&to, first, 50)).await);
    }
    let got = f.received(&to, 300, ARRIVAL).await;
    for k in 0..4 {
        let key = format!("k{k}").into_bytes();
        let rows: Vec<i64> = rows_of(&got)
            .into_iter()
            .zip(&got)
            .filter(|(_, r)| r.key.as_deref() == Some(key.as_slice()))
            .map(|(row, _)| row)
            .collect();
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        assert_eq!(rows, sorted, "key k{k} out of order");
        assert_eq!(rows.len(), 75, "key k{k}");
    }
}

/// `flush` at shutdown waits for the messages of a batch still in flight; a batch cut short
/// by shutdown (its future dropped) reports nothing, so its rows are never marked.
async fn flush_waits_for_messages_in_flight<F: BrokerFixture>() {
    let mut f = F::new().await;
    let (proxy, sink) = f.proxied().await;
    let sink = std::sync::Arc::new(sink);
    let to = f.destination().await;
    assert_all_ok(&sink.publish(&messages::<F>(&to, 1, 5)).await);
    proxy.delay(Duration::from_millis(300));
    let batch = messages::<F>(&to, 6, 20);
    let publisher = {
        let sink = std::sync::Arc::clone(&sink);
        tokio::spawn(async move { sink.publish(&batch).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Shutdown: the relay stops waiting and flushes.
    publisher.abort();
    let flushing = {
        let sink = std::sync::Arc::clone(&sink);
        tokio::task::spawn_blocking(move || sink.flush(Duration::from_secs(10)))
    };
    let flushed = flushing.await.unwrap();
    assert!(flushed.is_ok(), "{flushed:?}");
    // What the aborted batch handed to the client is at the broker once the flush is done.
    let got = f.received(&to, 25, ARRIVAL).await;
    let rows = rows_of(&got);
    for row in 1..=25 {
        assert!(
            rows.contains(&row),
            "row {row} not at the broker after the flush"
        );
    }
}

/// `probe` answers for a healthy broker, fails within its timeout for a silent one.
async fn probe_sees_a_silent_broker<F: BrokerFixture>() {
    let mut f = F::new().await;
    let (proxy, sink) = f.proxied().await;
    let sink = std::sync::Arc::new(sink);
    let probe = |sink: std::sync::Arc<F::Sink>| {
        tokio::task::spawn_blocking(move || sink.probe(Duration::from_secs(2)))
    };
    let healthy = probe(std::sync::Arc::clone(&sink)).await.unwrap();
    assert!(healthy.is_ok(), "{healthy:?}");
    proxy.freeze();
    let started = Instant::now();
    let silent = probe(std::sync::Arc::clone(&sink)).await.unwrap();
    assert!(silent.is_err(), "a frozen broker answered the probe");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    proxy.thaw();
    let mut back = probe(std::sync::Arc::clone(&sink)).await.unwrap();
    let deadline = Instant::now() + ARRIVAL;
    while back.is_err() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        back = probe(std::sync::Arc::clone(&sink)).await.unwrap();
    }
    assert!(back.is_ok(), "{back:?}");
}

/// One `#[tokio::test]` per body for the fixture `$fixture`, in a module named `$broker`.
macro_rules! conformance {
    ($broker:ident, $fixture:ty) => {
        mod $broker {
            use super::*;

            conformance!(@bodies $fixture;
                each_message_once_in_order_with_headers,
                headers_tombstones_and_keyless_round_trip,
                a_missing_destination_is_refused_alone,
                an_oversized_message_is_refused_alone,
                a_stalled_broker_loses_nothing_and_blames_no_tenant,
                a_broker_restart_loses_nothing,
                order_per_key_holds_across_batches,
                acknowledgements_say_where_messages_were_stored,
                flush_waits_for_messages_in_flight,
                probe_sees_a_silent_broker,
            );
        }
    };
    (@bodies $fixture:ty; $($body:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $body() {
                super::$body::<$fixture>().await;
            }
        )*
    };
}

// One fixture module per broker, in its own file next to this one; the tests' module is named
// `<broker>_suite` (two modules cannot share a name; the layout check does not follow
// `#[path]`). A fixture module may be visible to its sink's own tests, which use its helpers.
mod kafka;
conformance!(kafka_suite, kafka::KafkaFixture);
pub(super) mod rabbitmq;
conformance!(rabbitmq_suite, rabbitmq::RabbitmqFixture);
mod nats;
conformance!(nats_suite, nats::NatsFixture);
mod redis;
conformance!(redis_suite, redis::RedisFixture);
