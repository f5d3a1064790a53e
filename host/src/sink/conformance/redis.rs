//! The conformance suite's Redis Streams fixture: the local Redis (`SLUICE_TEST_REDIS`,
//! default `127.0.0.1:6379`), streams made the way their consumers make them (`XGROUP CREATE
//! … MKSTREAM`, so the sink under test runs with `create_streams = false` and a missing
//! stream is the tenant's fault), and entries read back with `XRANGE`, fields mapped back as
//! the docs promise: no `value` field is a tombstone, `sluice-key` is the key,
//! `sluice-message-id` is left out, every other field is a header, in order.

use std::time::Duration;

use ::redis::Value;
use ::redis::aio::MultiplexedConnection;

use super::{BrokerFixture, Received};
use crate::model::Broker;
use crate::secret::SecretUrl;
use crate::sink::{RedisSettings, RedisSink};

/// The test Redis and a connection of the fixture's own (never the sink's).
pub(super) struct RedisFixture {
    address: String,
    conn: MultiplexedConnection,
}

/// How long streams made by the suite live: the local Redis keeps them in memory only, and
/// runs of the suite must not pile them up.
const STREAM_TTL_SECONDS: u64 = 3600;

/// A batch's timeout in the sink under test: short, so the stalled-broker body ends soon.
const SINK_TIMEOUT: Duration = Duration::from_secs(3);

/// A stream key no other run or call uses.
fn unique_key(kind: &str) -> String {
    format!(
        "sluice-conformance:{kind}:{}:{:016x}",
        std::process::id(),
        fastrand::u64(..)
    )
}

/// A stream entry read back (`[id, [field, value, …]]`), as a consumer maps it.
fn received(entry: &Value) -> Received {
    let Value::Array(parts) = entry else {
        panic!("not an entry: {entry:?}");
    };
    let Some(Value::Array(fields)) = parts.get(1) else {
        panic!("an entry without fields: {entry:?}");
    };
    let mut out = Received {
        key: None,
        payload: None,
        headers: Vec::new(),
    };
    for pair in fields.chunks(2) {
        let [Value::BulkString(name), Value::BulkString(value)] = pair else {
            panic!("not a field and its value: {pair:?}");
        };
        match name.as_slice() {
            b"value" => out.payload = Some(value.clone()),
            b"sluice-key" => out.key = Some(value.clone()),
            b"sluice-message-id" => {}
            _ => out
                .headers
                .push((String::from_utf8_lossy(name).into_owned(), value.clone())),
        }
    }
    out
}

impl BrokerFixture for RedisFixture {
    type Sink = RedisSink;

    const BROKER: Broker = Broker::Redis;

    async fn new() -> Self {
        let address =
            std::env::var("SLUICE_TEST_REDIS").unwrap_or_else(|_| "127.0.0.1:6379".to_owned());
        let client = ::redis::Client::open(format!("redis://{address}")).expect("a Redis URL");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("Redis at {address} (SLUICE_TEST_REDIS): {e}"));
        Self { address, conn }
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    async fn sink_at(&self, address: &str) -> RedisSink {
        let mut settings = RedisSettings::new(SecretUrl::read(format!("redis://{address}")));
        settings.create_streams = false;
        settings.timeout = SINK_TIMEOUT;
        RedisSink::connect(&settings).await.expect("a Redis sink")
    }

    async fn destination(&self) -> String {
        let key = unique_key("stream");
        let mut conn = self.conn.clone();
        ::redis::pipe()
            .cmd("XGROUP")
            .arg("CREATE")
            .arg(&key)
            .arg("sluice-conformance")
            .arg("$")
            .arg("MKSTREAM")
            .cmd("EXPIRE")
            .arg(&key)
            .arg(STREAM_TTL_SECONDS)
            .exec_async(&mut conn)
            .await
            .expect("create a stream");
        key
    }

    async fn missing_destination(&self) -> String {
        unique_key("missing")
    }

    async fn received(
        &self,
        destination: &str,
        at_least: usize,
        timeout: Duration,
    ) -> Vec<Received> {
        let read = || async {
            let mut conn = self.conn.clone();
            ::redis::cmd("XRANGE")
                .arg(destination)
                .arg("-")
                .arg("+")
                .query_async::<Vec<Value>>(&mut conn)
                .await
                .expect("XRANGE")
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let mut entries = read().await;
        while entries.len() < at_least && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            entries = read().await;
        }
        // A short while more, so duplicates show.
        tokio::time::sleep(Duration::from_millis(300)).await;
        read().await.iter().map(received).collect()
    }

    fn oversized_payload(&self) -> Vec<u8> {
        vec![b'x'; crate::sink::redis::settings::DEFAULT_MAX_MESSAGE_BYTES + 1]
    }
}
