//! RabbitMQ (AMQP 0-9-1) from the harness: an exchange for a test's relay to publish to,
//! a queue bound to it by routing keys, and every message of a queue read back the way a
//! consumer sees it (routing key, headers with their arrays, message id, body).
//!
//! Queues are read with `basic.get` and no acknowledgement: a read takes the messages out, so
//! [`RabbitMq::read_queue`] returns everything it took, extras included.

use std::time::{Duration, Instant};

use anyhow::Context;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

/// Pause between two reads of a queue that has not got everything yet.
const POLL: Duration = Duration::from_millis(100);

/// A header's value as a consumer decodes it.
#[derive(Debug, Clone, PartialEq)]
pub enum AmqpHeader {
    /// A string (long string or byte array): the bytes.
    Bytes(Vec<u8>),
    /// A field array (what a repeated header name becomes), element by element.
    Array(Vec<AmqpHeader>),
    /// Any other field type, as its debug text.
    Other(String),
}

impl AmqpHeader {
    /// Every string this value holds, in order (an array's elements flattened), as text
    /// (lossy UTF-8); nothing for other types.
    pub fn texts(&self) -> Vec<String> {
        match self {
            Self::Bytes(b) => vec![String::from_utf8_lossy(b).into_owned()],
            Self::Array(items) => items.iter().flat_map(Self::texts).collect(),
            Self::Other(_) => Vec::new(),
        }
    }

    fn of(value: &AMQPValue) -> Self {
        match value {
            AMQPValue::LongString(s) => Self::Bytes(s.as_bytes().to_vec()),
            AMQPValue::ByteArray(b) => Self::Bytes(b.as_slice().to_vec()),
            AMQPValue::ShortString(s) => Self::Bytes(s.as_str().as_bytes().to_vec()),
            AMQPValue::FieldArray(items) => {
                Self::Array(items.as_slice().iter().map(Self::of).collect())
            }
            other => Self::Other(format!("{other:?}")),
        }
    }
}

/// One message taken from a queue.
#[derive(Debug, Clone)]
pub struct AmqpMessage {
    /// The exchange it was published to (empty: the default exchange).
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// The `message_id` property.
    pub message_id: Option<String>,
    /// The `headers` property, sorted by name (a field table is a map).
    pub headers: Vec<(String, AmqpHeader)>,
    /// The body (empty for a tombstone).
    pub body: Vec<u8>,
}

impl AmqpMessage {
    /// Header `name`, if it is a plain string, as text (lossy UTF-8).
    pub fn header(&self, name: &str) -> Option<String> {
        match self.header_value(name)? {
            AmqpHeader::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// Header `name` as sent.
    pub fn header_value(&self, name: &str) -> Option<&AmqpHeader> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The body as JSON (`Null` if it is empty or not JSON).
    pub fn body_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// A connection (and one channel) to a RabbitMQ broker, for topology and reading queues.
pub struct RabbitMq {
    connection: Connection,
    channel: Channel,
}

impl RabbitMq {
    /// Connects to `url` (`amqp://user:password@host:port/vhost`).
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .with_context(|| format!("cannot connect to RabbitMQ at {}", crate::db::redact(url)))?;
        let channel = connection
            .create_channel()
            .await
            .context("cannot open an AMQP channel")?;
        Ok(Self {
            connection,
            channel,
        })
    }

    /// Declares direct exchange `name` (not durable; an existing one of that kind is fine).
    pub async fn declare_exchange(&self, name: &str) -> anyhow::Result<()> {
        self.channel
            .exchange_declare(
                name.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("cannot declare exchange {name}"))
    }

    /// Declares queue `queue` and binds it to `exchange` by each of `routing_keys`.
    pub async fn declare_queue(
        &self,
        queue: &str,
        exchange: &str,
        routing_keys: &[String],
    ) -> anyhow::Result<()> {
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("cannot declare queue {queue}"))?;
        for key in routing_keys {
            self.channel
                .queue_bind(
                    queue.into(),
                    exchange.into(),
                    key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .with_context(|| format!("cannot bind queue {queue} to {exchange} by {key}"))?;
        }
        Ok(())
    }

    /// Deletes queue `queue` with its messages.
    pub async fn delete_queue(&self, queue: &str) -> anyhow::Result<()> {
        self.channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .with_context(|| format!("cannot delete queue {queue}"))?;
        Ok(())
    }

    /// Deletes exchange `name`.
    pub async fn delete_exchange(&self, name: &str) -> anyhow::Result<()> {
        self.channel
            .exchange_delete(name.into(), ExchangeDeleteOptions::default())
            .await
            .with_context(|| format!("cannot delete exchange {name}"))
    }

    /// Takes every message now in `queue`, in queue order.
    pub async fn take_all(&self, queue: &str) -> anyhow::Result<Vec<AmqpMessage>> {
        let mut out = Vec::new();
        while let Some(got) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .with_context(|| format!("basic.get from {queue}"))?
        {
            let d = got.delivery;
            out.push(AmqpMessage {
                exchange: d.exchange.to_string(),
                routing_key: d.routing_key.to_string(),
                message_id: d.properties.message_id().as_ref().map(|s| s.to_string()),
                headers: d
                    .properties
                    .headers()
                    .as_ref()
                    .map(|table| {
                        table
                            .inner()
                            .iter()
                            .map(|(k, v)| (k.to_string(), AmqpHeader::of(v)))
                            .collect()
                    })
                    .unwrap_or_default(),
                body: d.data,
            });
        }
        Ok(out)
    }

    /// Takes messages from `queue` until at least `expected` arrived, then for `settle` more
    /// (so extras show), or until `timeout` passed: everything taken.
    pub async fn read_queue(
        &self,
        queue: &str,
        expected: usize,
        timeout: Duration,
        settle: Duration,
    ) -> anyhow::Result<Vec<AmqpMessage>> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            out.extend(self.take_all(queue).await?);
            if out.len() >= expected {
                tokio::time::sleep(settle).await;
                out.extend(self.take_all(queue).await?);
                return Ok(out);
            }
            if Instant::now() > deadline {
                return Ok(out);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Closes the channel and the connection.
    pub async fn close(self) {
        let _ = self.channel.close(200, "done".into()).await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use lapin::BasicProperties;
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::types::{FieldArray, ShortString};

    use super::*;
    use crate::env::{rabbitmq_url, unique};

    /// Against the tests' RabbitMQ: a message published to the exchange by a bound routing key
    /// is read back with its routing key, message id, string and array headers and body; one
    /// by an unbound key is not; a read takes the messages out.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_bound_queue_reads_back_what_was_published() {
        let rabbit = RabbitMq::connect(&rabbitmq_url()).await.expect("RabbitMQ");
        let name = unique("kit_amqp");
        let key = format!("{name}.a");
        rabbit.declare_exchange(&name).await.unwrap();
        rabbit
            .declare_queue(&name, &name, std::slice::from_ref(&key))
            .await
            .unwrap();
        rabbit
            .channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let headers = FieldTable::from(BTreeMap::from([
            (ShortString::from("one"), AMQPValue::LongString("1".into())),
            (
                ShortString::from("two"),
                AMQPValue::FieldArray(FieldArray::from(vec![
                    AMQPValue::LongString("a".into()),
                    AMQPValue::LongString("b".into()),
                ])),
            ),
        ]));
        for routing_key in [key.clone(), format!("{name}.unbound")] {
            rabbit
                .channel
                .basic_publish(
                    name.as_str().into(),
                    routing_key.as_str().into(),
                    BasicPublishOptions::default(),
                    b"{\"x\":1}",
                    BasicProperties::default()
                        .with_message_id("m-0".into())
                        .with_headers(headers.clone()),
                )
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let got = rabbit
            .read_queue(
                &name,
                1,
                Duration::from_secs(10),
                Duration::from_millis(300),
            )
            .await
            .unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        let m = &got[0];
        assert_eq!(
            (m.exchange.as_str(), m.routing_key.as_str()),
            (name.as_str(), key.as_str())
        );
        assert_eq!(m.message_id.as_deref(), Some("m-0"));
        assert_eq!(m.header("one").as_deref(), Some("1"));
        assert_eq!(m.header("two"), None, "an array is no plain string");
        assert_eq!(
            m.header_value("two").map(AmqpHeader::texts),
            Some(vec!["a".into(), "b".into()])
        );
        assert_eq!(m.body_json()["x"], 1);
        assert!(rabbit.take_all(&name).await.unwrap().is_empty());
        rabbit.delete_queue(&name).await.unwrap();
        rabbit.delete_exchange(&name).await.unwrap();
        rabbit.close().await;
    }
}
