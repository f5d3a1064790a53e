//! The RabbitMQ sink against the local broker (`SLUICE_TEST_RABBITMQ`, default
//! `127.0.0.1:5672`, guest/guest), for what the conformance suite does not cover: message
//! properties, credentials, a missing exchange, a broker down or cut while connecting,
//! rotated settings.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::{ExchangeDeclareOptions, ExchangeDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, ExchangeKind};
use sluice_testkit::stall::StallingProxy;

use super::*;
use crate::model::OutboxId;
use crate::sink::conformance::rabbitmq::{
    EXCHANGE, bound_queue, drain, open, received, settings_at, test_address, unique,
};

/// How long a test waits for something that should happen soon.
const SOON: Duration = Duration::from_secs(20);

fn message(topic: &str, row: i64) -> OutboundMessage {
    OutboundMessage {
        row: OutboxId::Int(row),
        broker: Broker::Rabbitmq,
        topic: topic.to_owned(),
        key: Some(b"k".to_vec()),
        payload: Some(format!("{{\"n\":{row}}}").into_bytes()),
        headers: vec![("sluice-outbox-id".to_owned(), row.to_string().into_bytes())],
        partition: None,
        encoding: None,
        value_record: None,
        key_record: None,
        timestamp_ms: None,
    }
}

async fn sink(address: &str, extra: &str) -> RabbitmqSink {
    RabbitmqSink::connect(&settings_at(address, extra))
        .await
        .unwrap()
}

/// Runs the blocking `probe` off the reactor, as the relay does.
async fn probe(sink: &Arc<RabbitmqSink>, timeout: Duration) -> Result<(), SinkError> {
    let sink = Arc::clone(sink);
    tokio::task::spawn_blocking(move || sink.probe(timeout))
        .await
        .unwrap()
}

/// A queue bound on the suite's exchange, its name the routing key.
async fn destination(channel: &Channel) -> String {
    channel
        .exchange_declare(
            EXCHANGE.into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let name = unique("sluice.sink-test");
    bound_queue(channel, EXCHANGE, &name).await;
    name
}

/// Publishes `batch` until every message is confirmed or [`SOON`] passes; the failures of
/// the first attempt.
async fn publish_until_ok(sink: &RabbitmqSink, batch: &[OutboundMessage]) -> Vec<SinkError> {
    let first: Vec<SinkError> = sink
        .publish(batch)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    let deadline = Instant::now() + SOON;
    let mut results = if first.is_empty() {
        Vec::new()
    } else {
        sink.publish(batch).await
    };
    while results.iter().any(Result::is_err) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        results = sink.publish(batch).await;
    }
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_arrive_persistent_with_their_ids_and_a_timestamp() {
    let (_connection, channel) = open(&test_address()).await;
    let to = destination(&channel).await;
    let sink = sink(
        &test_address(),
        &format!("exchange = \"{EXCHANGE}\"\nmessage_id_prefix = \"shop-\""),
    )
    .await;
    // Row 1 fans out to two messages, row 2 to one.
    let batch = [message(&to, 1), message(&to, 2), message(&to, 1)];
    let results = sink.publish(&batch).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let got = drain(&channel, &to, 3, SOON).await;
    let ids: Vec<&str> = got
        .iter()
        .map(|d| d.properties.message_id().as_ref().unwrap().as_str())
        .collect();
    assert_eq!(ids, ["shop-1-0", "shop-2-0", "shop-1-1"]);
    for d in &got {
        assert_eq!(*d.properties.delivery_mode(), Some(2), "persistent");
        assert!(d.properties.timestamp().is_some());
        assert_eq!(d.exchange.as_str(), EXCHANGE);
        assert_eq!(d.routing_key.as_str(), to);
    }
    assert_eq!(received(&got[0]).key.as_deref(), Some(&b"k"[..]));
}

/// On the default exchange a routing key is a queue's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_exchange_routes_to_the_queue_so_named() {
    let (_connection, channel) = open(&test_address()).await;
    let queue = unique("sluice.sink-test.default");
    bound_queue(&channel, "", &queue).await;
    let sink = Arc::new(sink(&test_address(), "").await);
    assert!(probe(&sink, SOON).await.is_ok());
    let results = sink
        .publish(&[message(&queue, 1), message("sluice.no-such-queue", 2)])
        .await;
    assert!(results[0].is_ok(), "{results:?}");
    let refused = results[1].as_ref().unwrap_err();
    assert_eq!(refused.fault(), Some(PublishFault::Refused));
    assert!(
        refused.to_string().contains(
            "no queue is bound to routing key \"sluice.no-such-queue\" on the default exchange"
        ),
        "{refused}"
    );
    assert_eq!(drain(&channel, &queue, 1, SOON).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_reported_as_authentication() {
    let settings: RabbitmqSettings = toml::from_str(&format!(
        "url = \"amqp://guest:wrong-password@{}/%2f\"\ntimeout = \"5s\"",
        test_address()
    ))
    .unwrap();
    let sink = Arc::new(RabbitmqSink::connect(&settings).await.unwrap());
    let err = probe(&sink, SOON).await.unwrap_err();
    assert!(matches!(err, SinkError::Authentication(_)), "{err:?}");
    assert!(!err.to_string().contains("wrong-password"), "{err}");
    let results = sink.publish(&[message("q", 1)]).await;
    let failed = results[0].as_ref().unwrap_err();
    assert_eq!(failed.fault(), Some(PublishFault::Unavailable), "{failed}");

    // Rotated credentials (SIGHUP): the next batch connects with them.
    let (_connection, channel) = open(&test_address()).await;
    let to = destination(&channel).await;
    let fixed = settings_at(&test_address(), &format!("exchange = \"{EXCHANGE}\""));
    sink.reconfigure(&fixed).await.unwrap();
    publish_until_ok(&sink, &[message(&to, 1)]).await;
    assert_eq!(drain(&channel, &to, 1, SOON).await.len(), 1);
    assert!(probe(&sink, SOON).await.is_ok());

    // Settings that cannot work leave the working connection in place.
    let broken: RabbitmqSettings = toml::from_str("url = \"http://nowhere\"").unwrap();
    let err = sink.reconfigure(&broken).await.unwrap_err();
    assert!(matches!(err, SinkError::Settings { .. }), "{err:?}");
    assert!(sink.publish(&[message(&to, 2)]).await[0].is_ok());
}

/// The exchange is the operator's setting: while it is missing, rows wait (unavailable, not
/// the tenant's fault) and the probe names it; once declared, the next batch goes through
/// (the channel the broker closed is replaced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_exchange_fails_the_probe_and_makes_rows_wait_until_it_exists() {
    let (_connection, channel) = open(&test_address()).await;
    let exchange = unique("sluice.sink-test.exchange");
    let sink = Arc::new(sink(&test_address(), &format!("exchange = \"{exchange}\"")).await);
    let err = probe(&sink, SOON).await.unwrap_err();
    assert!(err.to_string().contains(&exchange), "{err}");
    for _ in 0..2 {
        let results = sink.publish(&[message("a", 1), message("b", 2)]).await;
        for r in &results {
            let e = r.as_ref().unwrap_err();
            assert_eq!(e.fault(), Some(PublishFault::Unavailable), "{e}");
            assert!(e.to_string().contains("no exchange"), "{e}");
        }
    }
    channel
        .exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                auto_delete: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let queue = unique("sluice.sink-test");
    bound_queue(&channel, &exchange, &queue).await;
    let results = sink.publish(&[message(&queue, 3)]).await;
    assert!(results[0].is_ok(), "{results:?}");
    assert!(probe(&sink, SOON).await.is_ok());
    assert_eq!(drain(&channel, &queue, 1, SOON).await.len(), 1);
    let _ = channel
        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await;
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Forwards every connection to `port` to `target` from now on (the broker comes up).
fn come_up(port: u16, target: String) {
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&target) else {
                continue;
            };
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
}

/// A relay starts while its broker is down: the sink is made, batches fail as unavailable,
/// and once the broker answers the next batch is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_down_at_start_delays_rows_until_it_is_up() {
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let sink = Arc::new(
        sink(
            &address,
            &format!("exchange = \"{EXCHANGE}\"\ntimeout = \"3s\""),
        )
        .await,
    );
    let (_connection, channel) = open(&test_address()).await;
    let to = destination(&channel).await;
    let results = sink.publish(&[message(&to, 1)]).await;
    let e = results[0].as_ref().unwrap_err();
    assert_eq!(e.fault(), Some(PublishFault::Unavailable), "{e}");
    let err = probe(&sink, Duration::from_secs(3)).await.unwrap_err();
    assert!(matches!(err, SinkError::Unreachable { .. }), "{err:?}");
    come_up(port, test_address());
    publish_until_ok(&sink, &[message(&to, 1)]).await;
    assert_eq!(drain(&channel, &to, 1, SOON).await.len(), 1);
}

/// The connection is cut while the sink connects (the broker hung mid-handshake, then
/// restarted), then while it publishes: it connects again by itself each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_while_connecting_or_publishing_are_made_again() {
    let proxy = StallingProxy::start(&test_address()).unwrap();
    proxy.freeze();
    let address = format!("127.0.0.1:{}", proxy.port());
    let sink = sink(
        &address,
        &format!("exchange = \"{EXCHANGE}\"\ntimeout = \"3s\""),
    )
    .await;
    let (_connection, channel) = open(&test_address()).await;
    let to = destination(&channel).await;
    // Connecting hangs in the handshake: the batch ends within its timeout, unavailable.
    let started = Instant::now();
    let results = sink.publish(&[message(&to, 1)]).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        results[0].as_ref().unwrap_err().fault(),
        Some(PublishFault::Unavailable)
    );
    proxy.cut();
    proxy.thaw();
    publish_until_ok(&sink, &[message(&to, 1)]).await;
    let before = proxy.connections();

    let batch: Vec<OutboundMessage> = (2..=101).map(|row| message(&to, row)).collect();
    let publishing = sink.publish(&batch);
    let cut = async {
        tokio::time::sleep(Duration::from_millis(1)).await;
        proxy.cut();
    };
    let (results, ()) = tokio::join!(publishing, cut);
    for e in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(e.fault(), Some(PublishFault::Unavailable), "{e}");
    }
    let again: Vec<OutboundMessage> = batch
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_err())
        .map(|(m, _)| m.clone())
        .collect();
    if !again.is_empty() {
        publish_until_ok(&sink, &again).await;
    }
    assert!(proxy.connections() > before, "a new connection was made");
    let rows: Vec<Vec<u8>> = drain(&channel, &to, 101, SOON)
        .await
        .iter()
        .map(|d| received(d).headers[0].1.clone())
        .collect();
    for row in 1..=101 {
        assert!(
            rows.contains(&row.to_string().into_bytes()),
            "row {row} lost"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_that_cannot_work_fail_connect() {
    let bad: RabbitmqSettings =
        toml::from_str("url = \"amqp://h\"\nca_location = \"/no/such.pem\"").unwrap();
    let err = RabbitmqSink::connect(&bad).await.err().unwrap();
    assert!(
        matches!(
            err,
            SinkError::Settings {
                broker: Broker::Rabbitmq,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("rabbitmq.ca_location"), "{err}");
}

/// With nothing sent there is nothing to wait for, connected or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_without_messages_returns_at_once() {
    let sink = Arc::new(sink(&format!("127.0.0.1:{}", free_port()), "").await);
    let flushed = tokio::task::spawn_blocking(move || sink.flush(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(flushed.is_ok(), "{flushed:?}");
}

/// A broker that stops answering after the batch was sent: the batch ends at
/// `rabbitmq.timeout`, every message unavailable; the next batch, once it answers again, goes
/// through on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconfirmed_messages_fail_as_unavailable_at_the_timeout() {
    let proxy = StallingProxy::start(&test_address()).unwrap();
    let address = format!("127.0.0.1:{}", proxy.port());
    let sink = sink(
        &address,
        &format!("exchange = \"{EXCHANGE}\"\ntimeout = \"2s\""),
    )
    .await;
    let (_connection, channel) = open(&test_address()).await;
    let to = destination(&channel).await;
    publish_until_ok(&sink, &[message(&to, 1)]).await;
    proxy.freeze();
    let batch: Vec<OutboundMessage> = (2..=21).map(|row| message(&to, row)).collect();
    let started = Instant::now();
    let results = sink.publish(&batch).await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(5),
        "{took:?}"
    );
    for r in &results {
        let e = r.as_ref().unwrap_err();
        assert_eq!(e.fault(), Some(PublishFault::Unavailable), "{e}");
        assert!(e.to_string().contains("did not confirm"), "{e}");
    }
    let before = proxy.connections();
    proxy.thaw();
    publish_until_ok(&sink, &batch).await;
    assert_eq!(
        proxy.connections(),
        before + 1,
        "the hung connection was replaced"
    );
    let got = drain(&channel, &to, 21, SOON).await;
    assert!(got.len() >= 21, "{}", got.len());
}

/// `amqps://` to the plain AMQP port: the handshake fails, and the probe says it is TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_tls_handshake_is_reported_as_tls() {
    let settings: RabbitmqSettings = toml::from_str(&format!(
        "url = \"amqps://guest:guest@{}/%2f\"\ntimeout = \"5s\"",
        test_address()
    ))
    .unwrap();
    let sink = Arc::new(RabbitmqSink::connect(&settings).await.unwrap());
    let err = probe(&sink, SOON).await.unwrap_err();
    assert!(matches!(err, SinkError::Tls(_)), "{err:?}");
    let results = sink.publish(&[message("q", 1)]).await;
    let failed = results[0].as_ref().unwrap_err();
    assert_eq!(failed.fault(), Some(PublishFault::Unavailable), "{failed}");
}
