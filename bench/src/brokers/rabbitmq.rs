//! RabbitMQ for `sluice-bench brokers`, through lapin as the sink uses it
//! (`host/src/sink/rabbitmq/`): a durable direct exchange with a durable queue bound for each
//! routing key of a drain, declared before and deleted after, and the produce ceiling.
//!
//! The ceiling publishes every message as the sink does — on one channel in confirm mode,
//! `mandatory`, persistent (`delivery_mode` 2), with a `message_id`, a timestamp and the
//! headers as a field table (the relay's four and `sluice-key`) — without waiting between
//! messages, and counts the broker's confirmations as they come: a message counts once it is
//! acknowledged and was not returned (routed nowhere). Persistent messages in durable queues
//! are confirmed once written to disk.

use std::future::IntoFuture;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use futures::StreamExt;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};

use super::{Broker, Ceiling, Standard, timed};

/// `delivery_mode` of a persistent message.
const PERSISTENT: u8 = 2;
/// The header the sink carries a message's key in.
const KEY_HEADER: &str = "sluice-key";
/// The longest wait for one declaration or deletion.
const TOPOLOGY_TIMEOUT: Duration = Duration::from_secs(30);

/// One connection with one channel in confirm mode.
pub(crate) struct RabbitMq {
    _connection: Connection,
    channel: Channel,
}

impl RabbitMq {
    /// Connects to `url` (`amqp://user:password@host:port/vhost`).
    pub(crate) async fn connect(url: &str) -> anyhow::Result<Self> {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .with_context(|| {
                format!(
                    "cannot connect to RabbitMQ at {}",
                    sluice_testkit::db::redact(url)
                )
            })?;
        let channel = connection
            .create_channel()
            .await
            .context("cannot open an AMQP channel")?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .context("cannot put the channel in confirm mode")?;
        Ok(Self {
            _connection: connection,
            channel,
        })
    }

    /// Declares durable direct exchange `exchange` and, for each routing key, a durable
    /// (classic) queue of the same name bound to it by that key.
    pub(crate) async fn declare(&self, exchange: &str, keys: &[String]) -> anyhow::Result<()> {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        self.within(self.channel.exchange_declare(
            exchange.into(),
            ExchangeKind::Direct,
            durable,
            FieldTable::default(),
        ))
        .await
        .with_context(|| format!("cannot declare exchange {exchange}"))?;
        for key in keys {
            let durable = QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            };
            self.within(self.channel.queue_declare(
                key.as_str().into(),
                durable,
                FieldTable::default(),
            ))
            .await
            .with_context(|| format!("cannot declare queue {key}"))?;
            self.within(self.channel.queue_bind(
                key.as_str().into(),
                exchange.into(),
                key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            ))
            .await
            .with_context(|| format!("cannot bind queue {key} to {exchange}"))?;
        }
        Ok(())
    }

    /// Messages the queues named `keys` hold together.
    pub(crate) async fn queued(&self, keys: &[String]) -> anyhow::Result<u64> {
        let mut total = 0;
        for key in keys {
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            let queue = self
                .within(self.channel.queue_declare(
                    key.as_str().into(),
                    passive,
                    FieldTable::default(),
                ))
                .await
                .with_context(|| format!("cannot look at queue {key}"))?;
            total += u64::from(queue.message_count());
        }
        Ok(total)
    }

    /// Deletes the queues named `keys` with their messages, then `exchange`.
    pub(crate) async fn delete(&self, exchange: &str, keys: &[String]) -> anyhow::Result<()> {
        for key in keys {
            self.within(
                self.channel
                    .queue_delete(key.as_str().into(), QueueDeleteOptions::default()),
            )
            .await
            .with_context(|| format!("cannot delete queue {key}"))?;
        }
        self.within(
            self.channel
                .exchange_delete(exchange.into(), ExchangeDeleteOptions::default()),
        )
        .await
        .with_context(|| format!("cannot delete exchange {exchange}"))
    }

    /// `request`, failed after [`TOPOLOGY_TIMEOUT`].
    async fn within<T>(
        &self,
        request: impl Future<Output = lapin::Result<T>>,
    ) -> anyhow::Result<T> {
        Ok(tokio::time::timeout(TOPOLOGY_TIMEOUT, request)
            .await
            .context("no answer from RabbitMQ")??)
    }

    /// The ceiling: `rows` standard messages to `exchange` by `keys` (see the module
    /// documentation), which must route to a queue each; `id_prefix` is the sink's
    /// `message_id_prefix`.
    pub(crate) async fn produce_ceiling(
        &self,
        exchange: &str,
        keys: &[String; 2],
        rows: u64,
        id_prefix: &str,
    ) -> anyhow::Result<Ceiling> {
        let messages = Standard::all(rows);
        let produce = self.produce(exchange, keys, &messages, id_prefix);
        timed(Broker::Rabbitmq, rows, produce).await
    }

    /// Publishes `messages`; returns how many the broker confirmed as routed.
    async fn produce(
        &self,
        exchange: &str,
        keys: &[String; 2],
        messages: &[Standard],
        id_prefix: &str,
    ) -> anyhow::Result<u64> {
        let short = |name: &str| {
            ShortString::try_new(name).with_context(|| format!("{name:?} is too long for AMQP"))
        };
        let exchange = short(exchange)?;
        let keys = [short(&keys[0])?, short(&keys[1])?];
        let mandatory = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let (to_confirm, mut confirms) = tokio::sync::mpsc::unbounded_channel();
        let sending = async move {
            for m in messages {
                let confirm = self
                    .channel
                    .basic_publish(
                        exchange.clone(),
                        keys[m.destination].clone(),
                        mandatory,
                        m.payload.as_bytes(),
                        properties(m, id_prefix),
                    )
                    .await
                    .context("cannot publish")?;
                if to_confirm.send(confirm).is_err() {
                    break;
                }
            }
            Ok::<(), anyhow::Error>(())
        };
        let confirming = futures::stream::poll_fn(|cx| confirms.poll_recv(cx))
            .map(IntoFuture::into_future)
            .buffer_unordered(messages.len().max(1))
            .fold(
                (0u64, None),
                |(confirmed, failure), confirmation| async move {
                    match confirmation {
                        Ok(Confirmation::Ack(None)) => (confirmed + 1, failure),
                        other => (confirmed, failure.or(Some(format!("{other:?}")))),
                    }
                },
            );
        let (sent, (confirmed, failure)) = tokio::join!(sending, confirming);
        sent?;
        if let Some(failure) = failure {
            eprintln!("    RabbitMQ: {confirmed} confirmed; a failure: {failure}");
        }
        Ok(confirmed)
    }
}

/// The properties the sink sends `m` with (`host/src/sink/rabbitmq/message.rs`).
fn properties(m: &Standard, id_prefix: &str) -> BasicProperties {
    let mut headers = FieldTable::default();
    let key = [(KEY_HEADER, m.key.as_str())];
    for (name, value) in m.headers().iter().chain(&key) {
        headers.insert(
            ShortString::from(*name),
            AMQPValue::LongString(LongString::from(value.as_bytes().to_vec())),
        );
    }
    BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_message_id(ShortString::from(m.message_id(id_prefix)))
        .with_timestamp(now())
        .with_headers(headers)
}

/// Seconds since the epoch, AMQP's `timestamp`.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
