//! Redis Streams for `sluice-bench brokers`, through redis-rs as the sink uses it
//! (`host/src/sink/redis/`): a drain's streams (made by its first `XADD`, as the sink's default
//! `create_streams = true` does) counted and deleted after (through the test kit's
//! [`RedisStreams`]), and the produce ceiling.
//!
//! The ceiling writes every message as the sink does — `XADD <stream> * value … sluice-key …
//! <the relay's four headers> sluice-message-id …`, one pipeline per [`BATCH`] messages on one
//! multiplexed connection — with every pipeline sent without waiting for the ones before, and
//! counts the entry ids Redis replies with (an error reply is a message not confirmed).

use anyhow::Context;
use futures::StreamExt;
// `::redis`: the crate (this module has its name).
use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Pipeline, Value};
use sluice_testkit::RedisStreams;

use super::{Broker, Ceiling, Standard, timed};

/// Messages per pipeline: the relay's default `relay.batch_size`, a batch being one pipeline.
const BATCH: usize = 500;
/// The field of the payload.
const VALUE: &str = "value";
/// The field of the message key.
const KEY: &str = "sluice-key";
/// The field of the message id.
const MESSAGE_ID: &str = "sluice-message-id";

/// One multiplexed connection.
pub(crate) struct Redis {
    connection: MultiplexedConnection,
    streams: RedisStreams,
}

impl Redis {
    /// Connects to `url` (`redis://host:port`).
    pub(crate) async fn connect(url: &str) -> anyhow::Result<Self> {
        let client = ::redis::Client::open(url)
            .with_context(|| format!("not a Redis URL: {}", sluice_testkit::db::redact(url)))?;
        // Replies are awaited as long as they take, as the sink does under its own deadline
        // (redis-rs' default of 500 ms is shorter than a queue of pipelines may take).
        let config = AsyncConnectionConfig::new().set_response_timeout(None);
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .with_context(|| {
                format!(
                    "cannot connect to Redis at {}",
                    sluice_testkit::db::redact(url)
                )
            })?;
        Ok(Self {
            streams: RedisStreams::new(connection.clone()),
            connection,
        })
    }

    /// The streams on this connection (the test kit's): a drain's streams counted and deleted
    /// after.
    pub(crate) fn streams(&self) -> &RedisStreams {
        &self.streams
    }

    /// The ceiling: `rows` standard messages to the streams `keys` (see the module
    /// documentation); `id_prefix` is the sink's `message_id_prefix`.
    pub(crate) async fn produce_ceiling(
        &self,
        keys: &[String; 2],
        rows: u64,
        id_prefix: &str,
    ) -> anyhow::Result<Ceiling> {
        let messages = Standard::all(rows);
        timed(
            Broker::Redis,
            rows,
            self.produce(keys, &messages, id_prefix),
        )
        .await
    }

    /// Writes `messages`; returns how many got an entry id back.
    async fn produce(
        &self,
        keys: &[String; 2],
        messages: &[Standard],
        id_prefix: &str,
    ) -> anyhow::Result<u64> {
        let batches = messages.chunks(BATCH);
        let in_flight = batches.len().max(1);
        let replies = futures::stream::iter(batches)
            .map(|batch| {
                let mut connection = self.connection.clone();
                async move {
                    pipeline(keys, batch, id_prefix)
                        .query_async::<Vec<Value>>(&mut connection)
                        .await
                }
            })
            .buffer_unordered(in_flight)
            .fold((0u64, None), |(added, failure), replies| async move {
                match replies {
                    Ok(replies) => {
                        let ids = replies
                            .iter()
                            .filter(|r| matches!(r, Value::BulkString(_)))
                            .count() as u64;
                        let refused = replies
                            .into_iter()
                            .find(|r| !matches!(r, Value::BulkString(_)))
                            .map(|r| format!("{r:?}"));
                        (added + ids, failure.or(refused))
                    }
                    Err(e) => (added, failure.or(Some(e.to_string()))),
                }
            });
        let (added, failure) = replies.await;
        if let Some(failure) = failure {
            eprintln!("    Redis: {added} added; a failure: {failure}");
        }
        Ok(added)
    }
}

/// One batch's pipeline, as the sink builds it (`host/src/sink/redis/entry.rs`); an error
/// reply to one `XADD` comes back in its place.
fn pipeline(keys: &[String; 2], batch: &[Standard], id_prefix: &str) -> Pipeline {
    let mut pipeline = ::redis::pipe();
    pipeline.ignore_errors();
    for m in batch {
        let mut xadd = ::redis::cmd("XADD");
        xadd.arg(&keys[m.destination])
            .arg("*")
            .arg(VALUE)
            .arg(m.payload.as_bytes())
            .arg(KEY)
            .arg(m.key.as_bytes());
        for (name, value) in m.headers() {
            xadd.arg(name).arg(value.as_bytes());
        }
        xadd.arg(MESSAGE_ID).arg(m.message_id(id_prefix));
        pipeline.add_command(xadd);
    }
    pipeline
}
