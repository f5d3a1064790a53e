//! RabbitMQ sink (AMQP 0-9-1, through lapin): a batch is published on one channel in confirm
//! mode, every message `mandatory` and in slice order before any confirmation is awaited, so
//! a batch waits once for the broker, not once per message. A message is `Ok` only once the
//! broker confirmed it (stored by every queue it was routed to); a message routed nowhere
//! comes back (basic.return) and fails as the tenant's fault.
//!
//! - [`settings`]: the `[rabbitmq]` section
//! - [`message`]: an [`OutboundMessage`] as an AMQP message (headers, key, tombstone, id)
//! - [`link`]: the connection and channel, re-opened when lost, one attempt at a time
//! - [`faults`]: whose fault a failure is, and what kind of trouble a connection is in

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ExchangeDeclareOptions};
use lapin::protocol::AMQPError;
use lapin::types::{FieldTable, ShortString};
use lapin::{Confirmation, ErrorKind, ExchangeKind, PublisherConfirm};
use tokio::runtime::Handle;
use tokio::time::Instant;

use self::link::{Link, Links};
use self::message::{Amqp, Mapping, indexes_in_row};
pub(crate) use self::settings::RabbitmqSettings;
use super::{Delivered, PublishFault, Sink, SinkError};
use crate::model::{Broker, OutboundMessage};

mod faults;
mod link;
pub(crate) mod message;
pub(crate) mod settings;

#[cfg(test)]
mod tests;

/// What a batch is published with (from `[rabbitmq]`), replaced whole on reconfiguring.
struct Publishing {
    exchange: ShortString,
    timeout: Duration,
    max_message_bytes: usize,
    message_id_prefix: String,
}

impl Publishing {
    fn of(settings: &RabbitmqSettings) -> Result<Self, SinkError> {
        Ok(Self {
            exchange: ShortString::try_new(settings.exchange.as_str())
                .map_err(|e| settings_error(format!("rabbitmq.exchange: {e}")))?,
            timeout: settings.timeout(),
            max_message_bytes: settings.max_message_bytes,
            message_id_prefix: settings.message_id_prefix.clone(),
        })
    }

    fn mapping(&self) -> Mapping<'_> {
        Mapping {
            exchange: self.exchange.as_str(),
            max_message_bytes: self.max_message_bytes,
            message_id_prefix: &self.message_id_prefix,
        }
    }
}

fn settings_error(reason: String) -> SinkError {
    SinkError::Settings {
        broker: Broker::Rabbitmq,
        reason,
    }
}

/// Publishes to RabbitMQ. Connects in the background and again after losing the connection;
/// messages published meanwhile fail as unavailable (their rows wait).
pub(crate) struct RabbitmqSink {
    /// The runtime `flush` and `probe` block on (they are called from blocking threads).
    handle: Handle,
    publishing: Mutex<Arc<Publishing>>,
    links: Arc<Links>,
}

impl RabbitmqSink {
    /// A sink for `[rabbitmq]`; starts connecting in the background. `Err` only for settings
    /// that cannot work (a URL that does not parse, a TLS file that cannot be read): an
    /// unreachable broker makes batches fail as unavailable until it answers.
    pub(crate) async fn connect(settings: &RabbitmqSettings) -> Result<Self, SinkError> {
        let publishing = Publishing::of(settings)?;
        let endpoint = settings.endpoint().map_err(settings_error)?;
        let handle = Handle::current();
        let links = Links::new(handle.clone(), endpoint, settings.timeout());
        links.warm();
        Ok(Self {
            handle,
            publishing: Mutex::new(Arc::new(publishing)),
            links,
        })
    }

    /// Uses `settings` from the next batch on (rotated credentials, on SIGHUP): a new
    /// connection; batches in flight finish on the old one, which closes after them. Settings
    /// that cannot work leave everything as it is.
    pub(crate) async fn reconfigure(&self, settings: &RabbitmqSettings) -> Result<(), SinkError> {
        let publishing = Publishing::of(settings)?;
        let endpoint = settings.endpoint().map_err(settings_error)?;
        *self
            .publishing
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(publishing);
        self.links.replace(endpoint, settings.timeout());
        self.links.warm();
        Ok(())
    }

    fn publishing(&self) -> Arc<Publishing> {
        Arc::clone(
            &self
                .publishing
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
}

/// A message's fate while a batch is under way.
enum Step {
    /// Settled: confirmed, refused before sending, or failed to send.
    Done(Result<(), SinkError>),
    /// Mapped, waiting for a link.
    Mapped(Box<Amqp>),
    /// Sent; the broker's confirmation to come.
    Sent(PublisherConfirm),
    /// Sending or confirming failed with the client's error (classified once the batch is
    /// over: the reason a channel closed may come with another message).
    Error(lapin::Error),
    /// Routed nowhere: the broker returned it (basic.return) with this reply.
    Returned { code: u16, text: String },
    /// The broker nacked it.
    Nacked,
    /// The channel was not in confirm mode: nothing says the broker kept it.
    Unconfirmed,
    /// No confirmation by the deadline.
    TimedOut,
}

impl Sink for RabbitmqSink {
    async fn publish(&self, messages: &[OutboundMessage]) -> Vec<Result<Delivered, SinkError>> {
        let publishing = self.publishing();
        let deadline = Instant::now() + publishing.timeout;
        let mapping = publishing.mapping();
        let mut steps: Vec<Step> = messages
            .iter()
            .zip(indexes_in_row(messages))
            .map(|(m, index)| match mapping.map(m, index) {
                Ok(amqp) => Step::Mapped(Box::new(amqp)),
                Err(e) => Step::Done(Err(e)),
            })
            .collect();
        if steps.iter().any(|s| matches!(s, Step::Mapped(_))) {
            match self.links.get(deadline).await {
                Ok(link) => {
                    send(&link, &publishing, messages, &mut steps, deadline).await;
                    confirm(&mut steps, deadline).await;
                    if steps.iter().any(|s| matches!(s, Step::TimedOut)) {
                        self.links.retire(&link);
                    }
                }
                Err(e) => {
                    for (step, m) in steps.iter_mut().zip(messages) {
                        if matches!(step, Step::Mapped(_)) {
                            *step = Step::Done(Err(SinkError::publish_failed(
                                &m.topic,
                                format!("no connection to the broker: {}", e.reason),
                                PublishFault::Unavailable,
                            )));
                        }
                    }
                }
            }
        }
        settle(steps, messages, &publishing)
    }

    fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        let Some(link) = self.links.open() else {
            // No connection: nothing handed to the client can still be confirmed.
            return Ok(());
        };
        let waited = self.handle.block_on(async {
            tokio::time::timeout(timeout, link.channel.wait_for_confirms()).await
        });
        match waited {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(SinkError::Unreachable {
                reason: format!(
                    "flush: the channel failed before every message was confirmed: {e}"
                ),
                cause: None,
            }),
            Err(_) => Err(SinkError::Unreachable {
                reason: format!(
                    "flush: messages still unconfirmed after {}",
                    humantime::format_duration(timeout)
                ),
                cause: None,
            }),
        }
    }

    /// A round trip to the broker on a channel of its own: a passive declare of the
    /// exchange (which fails for a missing one), or opening and closing the channel for the
    /// default exchange.
    fn probe(&self, timeout: Duration) -> Result<(), SinkError> {
        let exchange = self.publishing().exchange.clone();
        let links = Arc::clone(&self.links);
        let deadline = Instant::now() + timeout;
        self.handle.block_on(async move {
            let checked = tokio::time::timeout_at(deadline, async {
                let link = links.get(deadline).await.map_err(|e| e.to_sink_error())?;
                probe_exchange(&link, &exchange).await
            });
            checked.await.unwrap_or_else(|_| {
                Err(SinkError::Unreachable {
                    reason: format!(
                        "the broker did not answer within {}",
                        humantime::format_duration(timeout)
                    ),
                    cause: None,
                })
            })
        })
    }
}

/// Publishes every mapped message in order on the link's channel (each waits only for its
/// frames to be written, not for the broker).
async fn send(
    link: &Link,
    publishing: &Publishing,
    messages: &[OutboundMessage],
    steps: &mut [Step],
    deadline: Instant,
) {
    let frame_max = link.frame_max();
    let mandatory = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    for (step, m) in steps.iter_mut().zip(messages) {
        let Step::Mapped(amqp) = step else { continue };
        if let Err(why) = amqp.fits(frame_max) {
            *step = Step::Done(Err(SinkError::publish_failed(
                &m.topic,
                why,
                PublishFault::Refused,
            )));
            continue;
        }
        let published = link.channel.basic_publish(
            publishing.exchange.clone(),
            amqp.routing_key.clone(),
            mandatory,
            m.payload.as_deref().unwrap_or_default(),
            amqp.properties.clone(),
        );
        *step = match tokio::time::timeout_at(deadline, published).await {
            Ok(Ok(confirm)) => Step::Sent(confirm),
            Ok(Err(e)) => Step::Error(e),
            Err(_) => Step::TimedOut,
        };
    }
}

/// Waits for the confirmation of every message sent, until `deadline`.
async fn confirm(steps: &mut [Step], deadline: Instant) {
    for step in steps.iter_mut() {
        let Step::Sent(confirm) = step else { continue };
        // A confirmation already in is taken even past the deadline: `timeout_at` polls it
        // first.
        *step = match tokio::time::timeout_at(deadline, confirm).await {
            Ok(Ok(Confirmation::Ack(None))) => Step::Done(Ok(())),
            Ok(Ok(Confirmation::Ack(Some(back)) | Confirmation::Nack(Some(back)))) => {
                Step::Returned {
                    code: back.reply_code,
                    text: back.reply_text.to_string(),
                }
            }
            Ok(Ok(Confirmation::Nack(None))) => Step::Nacked,
            Ok(Ok(Confirmation::NotRequested)) => Step::Unconfirmed,
            Ok(Err(e)) => Step::Error(e),
            Err(_) => Step::TimedOut,
        };
    }
}

/// One result per message. A message the client failed on a channel the broker had closed
/// gets the reason it closed (the first protocol error of the batch).
fn settle(
    steps: Vec<Step>,
    messages: &[OutboundMessage],
    publishing: &Publishing,
) -> Vec<Result<Delivered, SinkError>> {
    let closed_by: Option<AMQPError> = steps.iter().find_map(|s| match s {
        Step::Error(e) => match e.kind() {
            ErrorKind::ProtocolError(amqp) => Some(amqp.clone()),
            _ => None,
        },
        _ => None,
    });
    let exchange = publishing.exchange.as_str();
    steps
        .into_iter()
        .zip(messages)
        .map(|(step, m)| match step {
            // A publisher confirm names no position: nothing to say where it went.
            Step::Done(result) => result.map(|()| Delivered::default()),
            Step::Error(e) => Err(faults::failed(
                &m.topic,
                exchange,
                &e,
                closed_by.as_ref(),
                m.payload.as_ref().map_or(0, Vec::len),
            )),
            Step::Returned { code, text } => Err(faults::returned(&m.topic, exchange, code, &text)),
            Step::Nacked => Err(faults::nacked(&m.topic, exchange)),
            Step::Unconfirmed => Err(SinkError::publish_failed(
                &m.topic,
                "the channel was not in confirm mode: nothing says the broker kept the message",
                PublishFault::Failed,
            )),
            Step::TimedOut => Err(faults::timed_out(&m.topic, publishing.timeout)),
            // Neither sent nor settled: cannot be left so by `publish`; not confirmed.
            Step::Mapped(_) | Step::Sent(_) => Err(SinkError::publish_failed(
                &m.topic,
                "not sent",
                PublishFault::Unavailable,
            )),
        })
        .collect()
}

/// Whether the broker answers on a channel of its own, and has `exchange` (the default
/// exchange always exists: opening and closing the channel is the round trip).
async fn probe_exchange(link: &Link, exchange: &ShortString) -> Result<(), SinkError> {
    let unreachable = |what: String| SinkError::Unreachable {
        reason: what,
        cause: None,
    };
    let channel = link
        .connection()
        .create_channel()
        .await
        .map_err(|e| unreachable(format!("cannot open a channel: {e}")))?;
    if !exchange.as_str().is_empty() {
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        // The kind is not compared by a passive declare.
        if let Err(e) = channel
            .exchange_declare(
                exchange.clone(),
                ExchangeKind::Direct,
                passive,
                FieldTable::default(),
            )
            .await
        {
            return Err(unreachable(format!(
                "{} is not usable (rabbitmq.exchange): {e}",
                faults::exchange_name(exchange.as_str())
            )));
        }
    }
    channel
        .close(200, "probe done".into())
        .await
        .map_err(|e| unreachable(format!("closing the probe's channel: {e}")))
}
