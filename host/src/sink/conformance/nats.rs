//! NATS JetStream for the sink conformance suite (`SLUICE_TEST_NATS`, default
//! `127.0.0.1:4222`): each destination is the one subject of a new memory stream; what arrived
//! is read from the stream's start through an ordered consumer, as a JetStream consumer reads
//! it, with `sluice-key` mapped back to the key, `sluice-tombstone` to no value and
//! `Nats-Msg-Id` left out. Streams of runs more than an hour old are deleted as the fixture
//! starts (memory streams last as long as the server).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream;
use futures::StreamExt;

use super::{BrokerFixture, Received, Reports};
use crate::model::Broker;
use crate::secret::SecretUrl;
use crate::sink::NatsSink;
use crate::sink::nats::{KEY_HEADER, NatsSettings, TOMBSTONE_HEADER};

/// Where the fixture's streams' names start (then the run's start in seconds, a number).
const STREAM_PREFIX: &str = "sluice_conformance_";
/// Streams of older runs are deleted.
const STALE: Duration = Duration::from_secs(3600);
/// How long a sink under test waits for acknowledgements: short, so a stalled batch ends soon.
const SINK_TIMEOUT: Duration = Duration::from_secs(5);
/// After the messages expected arrived, how long a read waits for more (duplicates).
const SETTLE: Duration = Duration::from_millis(500);

static NEXT: AtomicU64 = AtomicU64::new(0);

pub(super) struct NatsFixture {
    address: String,
    client: async_nats::Client,
    jetstream: jetstream::Context,
}

/// Settings of a sink under test at `address`.
fn test_settings(address: &str) -> NatsSettings {
    NatsSettings {
        url: SecretUrl::read(format!("nats://{address}")),
        token: None,
        credentials_location: None,
        ca_location: None,
        certificate_location: None,
        key_location: None,
        timeout: SINK_TIMEOUT,
        message_id_prefix: String::new(),
    }
}

/// Seconds since the epoch.
fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A name no other stream of this or another run has: `{seconds}_{process}_{n}`.
fn unique() -> String {
    format!(
        "{}_{}_{}",
        now_secs(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The stream whose one subject is `subject` (see [`NatsFixture::destination`]).
fn stream_of(subject: &str) -> String {
    subject.replace('.', "_")
}

impl NatsFixture {
    /// Deletes the streams of runs older than [`STALE`].
    async fn delete_stale_streams(&self) {
        let names: Vec<String> = self
            .jetstream
            .stream_names()
            .filter_map(|n| async move { n.ok() })
            .collect()
            .await;
        let oldest = now_secs().saturating_sub(STALE.as_secs());
        for name in names {
            let started = name
                .strip_prefix(STREAM_PREFIX)
                .and_then(|rest| rest.split('_').next())
                .and_then(|secs| secs.parse::<u64>().ok());
            if started.is_some_and(|secs| secs < oldest) {
                let _ = self.jetstream.delete_stream(&name).await;
            }
        }
    }
}

/// One stored message as a consumer reads it back.
fn received(message: &async_nats::Message) -> Received {
    let mut key = None;
    let mut tombstone = false;
    let mut headers = Vec::new();
    for (name, values) in message.headers.iter().flat_map(|h| h.iter()) {
        let name = name.to_string();
        for value in values {
            match name.as_str() {
                KEY_HEADER => key = Some(value.as_str().as_bytes().to_vec()),
                TOMBSTONE_HEADER => tombstone = value.as_str() == "true",
                "Nats-Msg-Id" => {}
                _ => headers.push((name.clone(), value.as_str().as_bytes().to_vec())),
            }
        }
    }
    // NATS headers come back as a map: by name, each name's values in the order sent.
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    Received {
        key,
        payload: (!tombstone).then(|| message.payload.to_vec()),
        headers,
    }
}

impl BrokerFixture for NatsFixture {
    type Sink = NatsSink;

    const BROKER: Broker = Broker::Nats;
    const REPORTS: Reports = Reports::Sequence;
    const KEEPS_HEADER_ORDER: bool = false;

    async fn new() -> Self {
        let address =
            std::env::var("SLUICE_TEST_NATS").unwrap_or_else(|_| "127.0.0.1:4222".to_owned());
        let client = async_nats::connect(&address)
            .await
            .unwrap_or_else(|e| panic!("NATS at {address} (SLUICE_TEST_NATS): {e}"));
        let fixture = Self {
            address,
            jetstream: jetstream::new(client.clone()),
            client,
        };
        fixture.delete_stale_streams().await;
        fixture
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    async fn sink_at(&self, address: &str) -> NatsSink {
        NatsSink::connect(&test_settings(address))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn destination(&self) -> String {
        let subject = format!("sluice.conformance.{}", unique());
        self.jetstream
            .create_stream(jetstream::stream::Config {
                name: stream_of(&subject),
                subjects: vec![subject.clone()],
                storage: jetstream::stream::StorageType::Memory,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("create a stream for {subject}: {e}"));
        subject
    }

    async fn missing_destination(&self) -> String {
        format!("sluice.nowhere.{}", unique())
    }

    async fn received(
        &self,
        destination: &str,
        at_least: usize,
        timeout: Duration,
    ) -> Vec<Received> {
        let stream = self
            .jetstream
            .get_stream(stream_of(destination))
            .await
            .unwrap_or_else(|e| panic!("stream of {destination}: {e}"));
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
            .await
            .unwrap_or_else(|e| panic!("consumer on {destination}: {e}"));
        let mut messages = consumer
            .messages()
            .await
            .unwrap_or_else(|e| panic!("read {destination}: {e}"));
        let deadline = tokio::time::Instant::now() + timeout;
        let mut got = Vec::new();
        loop {
            let until = if got.len() >= at_least {
                tokio::time::Instant::now() + SETTLE
            } else {
                deadline
            };
            match tokio::time::timeout_at(until, messages.next()).await {
                Ok(Some(Ok(message))) => got.push(received(&message)),
                Ok(Some(Err(e))) => panic!("read {destination}: {e}"),
                Ok(None) | Err(_) => break,
            }
        }
        got
    }

    fn oversized_payload(&self) -> Vec<u8> {
        vec![b'x'; self.client.server_info().max_payload.max(1) + 1]
    }
}
