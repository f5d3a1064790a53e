//! Redis Streams from the harness: every entry of a stream (`XRANGE key - +`) as a consumer
//! sees it, its fields in the order written, how many entries streams hold, and removing a
//! test's streams.
//!
//! Replies are read as raw values, not through the client's stream types: those keep an
//! entry's fields in a map, which would hide a repeated field and the fields' order, both
//! part of what Sluice promises.

use std::time::{Duration, Instant};

use ::redis::Value;
use ::redis::aio::MultiplexedConnection;
use anyhow::{Context, bail};

/// Pause between two reads of streams that have not got everything yet.
const POLL: Duration = Duration::from_millis(100);

/// One stream entry.
#[derive(Debug, Clone)]
pub struct StreamEntry {
    /// The stream (key) it is in.
    pub stream: String,
    /// Its entry id (`<ms>-<seq>`).
    pub id: String,
    /// Its fields, in the order written, repeats kept.
    pub fields: Vec<(String, Vec<u8>)>,
}

impl StreamEntry {
    /// The first field called `name`, as text (lossy UTF-8).
    pub fn field(&self, name: &str) -> Option<String> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    /// The field names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.fields.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The `value` field as JSON (`Null` if there is none or it is not JSON).
    pub fn value_json(&self) -> serde_json::Value {
        self.fields
            .iter()
            .find(|(n, _)| n == "value")
            .and_then(|(_, v)| serde_json::from_slice(v).ok())
            .unwrap_or(serde_json::Value::Null)
    }
}

/// A connection to a Redis server, for reading and removing streams.
pub struct RedisStreams {
    connection: MultiplexedConnection,
}

impl RedisStreams {
    /// Connects to `url` (`redis://host:port`).
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let client = ::redis::Client::open(url)
            .with_context(|| format!("not a Redis URL: {}", crate::db::redact(url)))?;
        let connection = client
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("cannot connect to Redis at {}", crate::db::redact(url)))?;
        Ok(Self::new(connection))
    }

    /// Streams read and removed through `connection`, one its maker configured (the
    /// benchmark's waits for replies without a deadline and writes on the same connection).
    pub fn new(connection: MultiplexedConnection) -> Self {
        Self { connection }
    }

    /// How many entries the streams `keys` hold together (`XLEN`: counted by the server, none
    /// read; a missing key holds none).
    pub async fn entry_count(&self, keys: &[String]) -> anyhow::Result<u64> {
        let mut total = 0;
        for key in keys {
            let length: u64 = ::redis::cmd("XLEN")
                .arg(key)
                .query_async(&mut self.connection.clone())
                .await
                .with_context(|| format!("XLEN {key}"))?;
            total += length;
        }
        Ok(total)
    }

    /// Every entry of stream `key`, oldest first (none if there is no such key).
    pub async fn entries(&self, key: &str) -> anyhow::Result<Vec<StreamEntry>> {
        let reply: Value = ::redis::cmd("XRANGE")
            .arg(key)
            .arg("-")
            .arg("+")
            .query_async(&mut self.connection.clone())
            .await
            .with_context(|| format!("XRANGE {key} - +"))?;
        parse_range(key, reply)
    }

    /// Every entry of each of `keys`, stream after stream.
    pub async fn entries_of(&self, keys: &[String]) -> anyhow::Result<Vec<StreamEntry>> {
        let mut out = Vec::new();
        for key in keys {
            out.extend(self.entries(key).await?);
        }
        Ok(out)
    }

    /// Reads streams `keys` until they hold at least `expected` entries, then once more after
    /// `settle` (so extras show), or until `timeout` passed: what they hold then.
    pub async fn read_streams(
        &self,
        keys: &[String],
        expected: usize,
        timeout: Duration,
        settle: Duration,
    ) -> anyhow::Result<Vec<StreamEntry>> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.entries_of(keys).await?;
            if got.len() >= expected {
                tokio::time::sleep(settle).await;
                return self.entries_of(keys).await;
            }
            if Instant::now() > deadline {
                return Ok(got);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Deletes `keys`.
    pub async fn delete(&self, keys: &[String]) -> anyhow::Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let _: Value = ::redis::cmd("DEL")
            .arg(keys)
            .query_async(&mut self.connection.clone())
            .await
            .with_context(|| format!("DEL {keys:?}"))?;
        Ok(())
    }
}

/// An `XRANGE` reply: `[[id, [field, value, …]], …]`.
fn parse_range(key: &str, reply: Value) -> anyhow::Result<Vec<StreamEntry>> {
    let Value::Array(entries) = reply else {
        bail!("XRANGE {key}: not an array: {reply:?}");
    };
    entries
        .into_iter()
        .map(|entry| {
            let Value::Array(mut parts) = entry else {
                bail!("XRANGE {key}: an entry is not an array: {entry:?}");
            };
            let (Some(Value::Array(flat)), Some(id)) = (parts.pop(), parts.pop()) else {
                bail!("XRANGE {key}: an entry is not [id, fields]");
            };
            if flat.len() % 2 != 0 {
                bail!("XRANGE {key}: odd number of field items");
            }
            let mut fields = Vec::with_capacity(flat.len() / 2);
            let mut items = flat.into_iter();
            while let (Some(name), Some(value)) = (items.next(), items.next()) {
                fields.push((
                    String::from_utf8_lossy(&bytes(name)?).into_owned(),
                    bytes(value)?,
                ));
            }
            Ok(StreamEntry {
                stream: key.to_owned(),
                id: String::from_utf8_lossy(&bytes(id)?).into_owned(),
                fields,
            })
        })
        .collect()
}

fn bytes(value: Value) -> anyhow::Result<Vec<u8>> {
    match value {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        other => bail!("not a string: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn an_entry_keeps_its_field_order_and_repeats() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("1-0"),
            Value::Array(vec![
                bulk("value"),
                bulk("{}"),
                bulk("h"),
                bulk("1"),
                bulk("h"),
                bulk("2"),
            ]),
        ])]);
        let entries = parse_range("s", reply).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].id, "1-0");
        assert_eq!(entries[0].names(), ["value", "h", "h"]);
        assert_eq!(entries[0].fields[2].1, b"2");
    }

    /// Against the tests' Redis: entries come back in order, fields in the order written,
    /// repeats kept; a missing key has none.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_stream_reads_back_its_entries() {
        let redis = RedisStreams::connect(&crate::env::redis_url())
            .await
            .expect("Redis");
        let key = crate::env::unique("kit_redis");
        assert!(redis.entries(&key).await.unwrap().is_empty());
        assert_eq!(
            redis.entry_count(std::slice::from_ref(&key)).await.unwrap(),
            0
        );
        for i in 0..2 {
            let _: Value = ::redis::cmd("XADD")
                .arg(&key)
                .arg("*")
                .arg(&[
                    "value",
                    &format!("{{\"i\":{i}}}"),
                    "z",
                    "1",
                    "a",
                    "2",
                    "z",
                    "3",
                ])
                .query_async(&mut redis.connection.clone())
                .await
                .unwrap();
        }
        let got = redis
            .read_streams(
                std::slice::from_ref(&key),
                2,
                Duration::from_secs(5),
                Duration::ZERO,
            )
            .await
            .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].names(), ["value", "z", "a", "z"]);
        assert_eq!(got[1].value_json()["i"], 1);
        assert_eq!(got[0].field("z").as_deref(), Some("1"));
        assert_eq!(got[0].stream, key);
        assert_eq!(
            redis.entry_count(std::slice::from_ref(&key)).await.unwrap(),
            2
        );
        redis.delete(std::slice::from_ref(&key)).await.unwrap();
        assert!(redis.entries(&key).await.unwrap().is_empty());
    }
}
