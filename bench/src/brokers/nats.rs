//! NATS JetStream for `sluice-bench brokers`, through async-nats as the sink uses it
//! (`host/src/sink/nats/`): a stream capturing a drain's subjects, made before and deleted
//! after (through the test kit's [`NatsStreams`]), and the produce ceiling.
//!
//! The ceiling publishes every message with the sink's headers (the relay's four, `sluice-key`,
//! `Nats-Msg-Id`) on one connection, each awaiting JetStream's acknowledgement that the stream
//! stored it, while later messages are sent — as the sink does within a batch. What bounds the
//! messages in flight is the client's own limit on acknowledgements pending (5,000, waited out
//! when reached), which the sink's context has too.

use std::future::IntoFuture;
use std::time::Duration;

use anyhow::Context;
use async_nats::HeaderMap;
use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream;
use async_nats::jetstream::context::ContextBuilder;
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use futures::StreamExt;
use sluice_testkit::NatsStreams;

use super::{Broker, Ceiling, Standard, timed};

/// The sink's default `nats.timeout`: how long an acknowledgement may take.
const TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The header the sink carries a message's key in.
const KEY_HEADER: &str = "sluice-key";

/// A JetStream context on one connection.
pub(crate) struct Nats {
    jetstream: jetstream::Context,
    streams: NatsStreams,
}

impl Nats {
    /// Connects to `url` (`nats://host:port`); fails at once if nothing answers there.
    pub(crate) async fn connect(url: &str) -> anyhow::Result<Self> {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(CONNECT_TIMEOUT)
            .request_timeout(Some(TIMEOUT))
            .connect(url)
            .await
            .with_context(|| format!("cannot connect to NATS at {url}"))?;
        let jetstream = ContextBuilder::new().timeout(TIMEOUT).build(client);
        Ok(Self {
            streams: NatsStreams::new(jetstream.clone()),
            jetstream,
        })
    }

    /// The stream administration on this connection (the test kit's): a drain's stream made
    /// before, counted and deleted after.
    pub(crate) fn streams(&self) -> &NatsStreams {
        &self.streams
    }

    /// The ceiling: `rows` standard messages to `subjects` (see the module documentation),
    /// which a stream must capture; `id_prefix` is the sink's `message_id_prefix`.
    pub(crate) async fn produce_ceiling(
        &self,
        subjects: &[String; 2],
        rows: u64,
        id_prefix: &str,
    ) -> anyhow::Result<Ceiling> {
        let messages = Standard::all(rows);
        timed(
            Broker::Nats,
            rows,
            self.produce(subjects, &messages, id_prefix),
        )
        .await
    }

    /// Publishes `messages`; returns how many JetStream acknowledged.
    async fn produce(
        &self,
        subjects: &[String; 2],
        messages: &[Standard],
        id_prefix: &str,
    ) -> anyhow::Result<u64> {
        let (to_ack, mut acks) = tokio::sync::mpsc::unbounded_channel();
        let sending = async move {
            for m in messages {
                let publish = PublishMessage::build()
                    .payload(Bytes::from(m.payload.clone()))
                    .headers(headers(m, id_prefix));
                let subject = &subjects[m.destination];
                let ack = self
                    .jetstream
                    .send_publish(subject.clone(), publish)
                    .await
                    .with_context(|| format!("cannot publish to {subject}"))?;
                if to_ack.send(ack).is_err() {
                    break;
                }
            }
            Ok::<(), anyhow::Error>(())
        };
        let acknowledging = futures::stream::poll_fn(|cx| acks.poll_recv(cx))
            .map(IntoFuture::into_future)
            .buffer_unordered(messages.len().max(1))
            .fold((0u64, None), |(acked, failure), ack| async move {
                match ack {
                    Ok(_) => (acked + 1, failure),
                    Err(e) => (acked, failure.or(Some(e.to_string()))),
                }
            });
        let (sent, (acked, failure)) = tokio::join!(sending, acknowledging);
        sent?;
        if let Some(failure) = failure {
            eprintln!("    NATS: {acked} acknowledged; a failure: {failure}");
        }
        Ok(acked)
    }
}

/// The headers the sink sends for `m` (`host/src/sink/nats/mapping.rs`).
fn headers(m: &Standard, id_prefix: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in m.headers() {
        headers.append(name, value);
    }
    headers.append(KEY_HEADER, m.key.as_str());
    headers.append(NATS_MESSAGE_ID, m.message_id(id_prefix));
    headers
}

/// A stream name for the subjects under `prefix` (stream names may not hold `.`).
pub(crate) fn stream_name(prefix: &str) -> String {
    let name: String = prefix
        .trim_end_matches('.')
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("SLUICE_{name}")
}
