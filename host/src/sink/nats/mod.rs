//! NATS JetStream sink on async-nats: every message of a batch is published in slice order over
//! one connection, each with a reply subject JetStream acknowledges on once the message is
//! stored in a stream, and the batch awaits those acknowledgements together (while it sends),
//! bounded by `nats.timeout`. A message is `Ok` only on its acknowledgement.
//!
//! - [`settings`]: the `[nats]` section
//! - [`mapping`]: subject, headers, key, tombstone and `Nats-Msg-Id` of a message
//! - [`connection`]: the connection's state from the client's events, logged once per change
//! - [`faults`]: whose fault a failed publish is
//!
//! The client connects in the background and reconnects by itself, so a relay starts while its
//! server is down and rows wait. A batch that finds no connection waits for one, within its
//! timeout. A lost connection fails the messages still waiting for their acknowledgement at
//! once (as unavailable): their acknowledgements cannot come any more.

use std::future::IntoFuture;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use async_nats::{Client, ConnectError, ConnectErrorKind, ConnectOptions};
use futures::StreamExt;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use self::connection::{ConnectionProblem, ConnectionWatch, Status};
#[cfg(test)]
pub(super) use self::mapping::{KEY_HEADER, TOMBSTONE_HEADER};
use self::mapping::{Outgoing, check_subject, message_ids, outgoing};
use self::settings::Credentials;
pub(crate) use self::settings::NatsSettings;
use super::{Delivered, PublishFault, Sink, SinkError};
use crate::model::{Broker, OutboundMessage};

mod connection;
mod faults;
mod mapping;
pub(crate) mod settings;
#[cfg(test)]
mod tests;

/// The name the client gives the server (`nats server report connections` shows it).
const CLIENT_NAME: &str = "sluice";
/// How often the client pings an idle server: two unanswered pings end the connection, so a
/// server that went silent (a network partition) is noticed in about half a minute instead of
/// the client's default three minutes.
const PING_INTERVAL: Duration = Duration::from_secs(10);
/// How long one connection attempt may take (TCP, TLS, CONNECT).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// JetStream's account information request: the probe's round trip.
const JETSTREAM_INFO: &str = "$JS.API.INFO";
/// How often a batch waiting for the connection looks at it between the client's events.
const CONNECTED_POLL: Duration = Duration::from_millis(20);

/// Publishes to NATS JetStream (see the module documentation).
pub(crate) struct NatsSink {
    /// The connection batches start on; replaced on [`NatsSink::reconfigure`].
    link: Mutex<Arc<Link>>,
    /// Messages sent and not yet settled, for [`Sink::flush`].
    in_flight: Arc<InFlight>,
    /// The runtime the client runs on, for the blocking [`Sink::flush`] and [`Sink::probe`].
    runtime: tokio::runtime::Handle,
}

/// One client with its settings: the connection a batch publishes over from start to end.
struct Link {
    client: Client,
    jetstream: async_nats::jetstream::Context,
    watch: Arc<ConnectionWatch>,
    settings: NatsSettings,
}

impl NatsSink {
    /// A sink for `settings`, connecting in the background: `Ok` while the server is down (a
    /// batch waits for the connection within its timeout). `Err` only for settings that cannot
    /// work: problems of the section, a `.creds` file or TLS file that does not parse.
    pub(crate) async fn connect(settings: &NatsSettings) -> Result<Self, SinkError> {
        let link = Link::connect(settings).await?;
        Ok(Self {
            link: Mutex::new(Arc::new(link)),
            in_flight: Arc::default(),
            runtime: tokio::runtime::Handle::current(),
        })
    }

    /// Replaces the connection with one made from `settings` (rotated credentials, on
    /// SIGHUP). Batches in flight finish on the connection they started with, which closes
    /// after the last of them; the next batch gets the new one. Settings that cannot work
    /// leave the current connection in place.
    pub(crate) async fn reconfigure(&self, settings: &NatsSettings) -> Result<(), SinkError> {
        let new = Arc::new(Link::connect(settings).await?);
        let old = std::mem::replace(&mut *self.current_slot(), new);
        tracing::info!("nats: reconfigured; later batches use a new connection");
        drop(old);
        Ok(())
    }

    fn current_slot(&self) -> std::sync::MutexGuard<'_, Arc<Link>> {
        self.link.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current(&self) -> Arc<Link> {
        Arc::clone(&self.current_slot())
    }
}

impl Link {
    async fn connect(settings: &NatsSettings) -> Result<Self, SinkError> {
        let problems = settings.problems();
        if !problems.is_empty() {
            let reasons: Vec<String> = problems.iter().map(ToString::to_string).collect();
            return Err(settings_error(reasons.join("; ")));
        }
        check_tls_files(settings)?;
        let watch = Arc::new(ConnectionWatch::default());
        let events = Arc::clone(&watch);
        let options = options(settings)
            .await?
            .retry_on_initial_connect()
            .max_reconnects(None)
            .event_callback(move |event| {
                let events = Arc::clone(&events);
                async move { events.event(event) }
            });
        let servers = settings.servers().map_err(settings_error)?;
        let client = options
            .connect(servers)
            .await
            .map_err(|e| settings_error(e.to_string()))?;
        let jetstream = async_nats::jetstream::ContextBuilder::new()
            .timeout(settings.timeout())
            .build(client.clone());
        Ok(Self {
            client,
            jetstream,
            watch,
            settings: settings.clone(),
        })
    }

    fn timeout(&self) -> Duration {
        self.settings.timeout()
    }

    fn is_connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }

    /// Waits until the client is connected, up to `deadline`; whether it is.
    async fn connected_by(&self, deadline: Instant) -> bool {
        let mut status = self.watch.subscribe();
        while !self.is_connected() {
            if Instant::now() >= deadline {
                return false;
            }
            let next = (Instant::now() + CONNECTED_POLL).min(deadline);
            // Woken by the client's events; the poll covers the moment between the client's
            // state and its event.
            let _ = tokio::time::timeout_at(next, status.changed()).await;
        }
        true
    }

    /// JetStream's account information, asked for as a round trip. The answer is read as
    /// plain JSON: async-nats' `Account` type expects fields servers before 2.10 do not send.
    async fn account_info(&self) -> Result<(), SinkError> {
        let answer = self
            .client
            .request(JETSTREAM_INFO, bytes::Bytes::new())
            .await
            .map_err(|e| match e.kind() {
                async_nats::RequestErrorKind::NoResponders => unreachable(
                    "the server answered, but JetStream is not enabled for this account (no \
                     responders on $JS.API.INFO)"
                        .to_owned(),
                ),
                _ => unreachable(format!("JetStream did not answer: {e}")),
            })?;
        let info: serde_json::Value = serde_json::from_slice(&answer.payload)
            .map_err(|e| unreachable(format!("JetStream's answer is not JSON: {e}")))?;
        match info.get("error") {
            None => Ok(()),
            Some(error) => Err(unreachable(format!(
                "JetStream answered with an error: {error}"
            ))),
        }
    }

    /// Whether the server said it runs JetStream (assumed so before it said anything).
    fn jetstream_enabled(&self) -> bool {
        self.client
            .try_server_info()
            .is_none_or(|info| info.jetstream)
    }

    /// The readiness error for a client that is not connected: one connection attempt with
    /// the same settings, made now, says why (the client's own retries report only the kind).
    async fn diagnose(&self, within: Duration) -> Result<(), SinkError> {
        let attempt = async {
            let servers = self.settings.servers().map_err(settings_error)?;
            let options = options(&self.settings)
                .await?
                .connection_timeout(within.min(CONNECT_TIMEOUT));
            match options.connect(servers).await {
                // The server answers (it came back meanwhile); the sink's client follows.
                Ok(_) => Ok(()),
                Err(e) => Err(connect_error(&e)),
            }
        };
        match tokio::time::timeout(within, attempt).await {
            Ok(result) => result,
            Err(_) => Err(match self.watch.problem() {
                Some((problem, text)) => problem.error(&text),
                None => unreachable(format!("no connection within {within:?}")),
            }),
        }
    }
}

/// The client's options for `settings`: name, credentials, TLS, timeouts.
async fn options(settings: &NatsSettings) -> Result<ConnectOptions, SinkError> {
    let mut options = ConnectOptions::new()
        .name(CLIENT_NAME)
        .ping_interval(PING_INTERVAL)
        .connection_timeout(CONNECT_TIMEOUT)
        .request_timeout(Some(settings.timeout()));
    options = match settings
        .credentials()
        .map_err(|p| settings_error(p.to_string()))?
    {
        Credentials::None => options,
        Credentials::UserPassword { user, password } => options.user_and_password(user, password),
        Credentials::Token(token) => options.token(token),
        Credentials::File(path) => options.credentials_file(&path).await.map_err(|e| {
            settings_error(format!(
                "nats.credentials_location: {} is not a NATS credentials file: {e}",
                path.display()
            ))
        })?,
    };
    if settings.tls_required() {
        options = options.require_tls(true);
    }
    if let Some(ca) = &settings.ca_location {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&settings.certificate_location, &settings.key_location) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options)
}

/// The TLS files must hold what their keys say (the client reads them on every connection
/// attempt and would fail each one).
fn check_tls_files(settings: &NatsSettings) -> Result<(), SinkError> {
    match settings.tls_files().problems(None).into_iter().next() {
        Some(problem) => Err(settings_error(problem.to_string())),
        None => Ok(()),
    }
}

fn settings_error(reason: impl Into<String>) -> SinkError {
    SinkError::Settings {
        broker: Broker::Nats,
        reason: reason.into(),
    }
}

fn unreachable(reason: String) -> SinkError {
    SinkError::Unreachable {
        reason,
        cause: None,
    }
}

/// The readiness error for a failed connection attempt.
fn connect_error(error: &ConnectError) -> SinkError {
    let text = error.to_string();
    let problem = match error.kind() {
        ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
            ConnectionProblem::Authentication
        }
        ConnectErrorKind::Tls => ConnectionProblem::Tls,
        _ => ConnectionProblem::classify(&text),
    };
    problem.error(&text)
}

/// One result per message. Every message has one by now; a gap would be a bug, and is no
/// acknowledgement either.
fn settled(
    messages: &[OutboundMessage],
    results: Vec<Option<Result<Delivered, SinkError>>>,
) -> Vec<Result<Delivered, SinkError>> {
    messages
        .iter()
        .zip(results)
        .map(|(m, result)| {
            result.unwrap_or_else(|| {
                Err(SinkError::publish_failed(
                    &m.topic,
                    "no outcome recorded for the message",
                    PublishFault::Failed,
                ))
            })
        })
        .collect()
}

/// Messages sent and not settled yet, over all batches.
#[derive(Debug, Default)]
struct InFlight {
    count: AtomicUsize,
    idle: Notify,
}

impl InFlight {
    fn enter(self: &Arc<Self>) -> Sent {
        self.count.fetch_add(1, Ordering::AcqRel);
        Sent(Arc::clone(self))
    }

    /// Waits until no message is in flight.
    async fn settled(&self) {
        loop {
            let mut idle = pin!(self.idle.notified());
            idle.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// One message in flight; settled when dropped.
struct Sent(Arc<InFlight>);

impl Drop for Sent {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A message handed to the client, waiting for its acknowledgement.
struct Awaiting {
    index: usize,
    ack: PublishAckFuture,
    /// The connection's status when it was sent (a later loss means no acknowledgement).
    status: Status,
    sent_at: std::time::Instant,
    _sent: Sent,
}

impl Link {
    /// Sends every message that could be mapped (`prepared[i]` is `Some`), in slice order,
    /// handing each to `awaiting` as it goes; returns the failures of sending. After a message
    /// that could not be sent for want of the connection, the rest are not sent either: they
    /// would overtake it.
    async fn send_all(
        &self,
        messages: &[OutboundMessage],
        prepared: Vec<Option<Outgoing>>,
        deadline: Instant,
        in_flight: &Arc<InFlight>,
        awaiting: tokio::sync::mpsc::UnboundedSender<Awaiting>,
    ) -> Vec<(usize, SinkError)> {
        let mut failed = Vec::new();
        let mut stopped: Option<SinkError> = None;
        let status = self.watch.subscribe();
        for (index, (m, outgoing)) in messages.iter().zip(prepared).enumerate() {
            let Some(Outgoing { headers, payload }) = outgoing else {
                continue;
            };
            if let Some(earlier) = &stopped {
                failed.push((index, faults::not_sent_after(&m.topic, earlier)));
                continue;
            }
            let publish = PublishMessage::build().payload(payload).headers(headers);
            let at_send = *status.borrow();
            let sent_at = std::time::Instant::now();
            let sending = self.jetstream.send_publish(m.topic.clone(), publish);
            match tokio::time::timeout_at(deadline, sending).await {
                Ok(Ok(ack)) => {
                    let _ = awaiting.send(Awaiting {
                        index,
                        ack,
                        status: at_send,
                        sent_at,
                        _sent: in_flight.enter(),
                    });
                }
                Ok(Err(e)) => {
                    let error = faults::send_failed(&m.topic, &e);
                    if error.fault() == Some(PublishFault::Unavailable) {
                        stopped = Some(error.clone());
                    }
                    failed.push((index, error));
                }
                Err(_) => {
                    let error = faults::timed_out(&m.topic, false, self.timeout());
                    stopped = Some(error.clone());
                    failed.push((index, error));
                }
            }
        }
        failed
    }

    /// Waits for one message's acknowledgement, up to `deadline`; gives up at once when the
    /// connection it was sent on is lost, or the server refused the subject to these
    /// credentials.
    async fn acknowledged(
        &self,
        subject: &str,
        awaiting: Awaiting,
        deadline: Instant,
    ) -> Result<Delivered, SinkError> {
        // `_in_flight` is held until the message is settled, for `flush`.
        let Awaiting {
            ack,
            status: at_send,
            sent_at,
            _sent: _in_flight,
            ..
        } = awaiting;
        let mut status: watch::Receiver<Status> = self.watch.subscribe();
        let mut ack = pin!(ack.into_future());
        let mut expiry = pin!(tokio::time::sleep_until(deadline));
        loop {
            let now = *status.borrow_and_update();
            if now.lost > at_send.lost {
                return Err(faults::connection_lost(subject));
            }
            if now.denials > at_send.denials && self.watch.denied_since(subject, sent_at) {
                return Err(faults::permission_denied(subject));
            }
            tokio::select! {
                answer = &mut ack => return match answer {
                    // The stream sequence is where the stream stored it (for a duplicate,
                    // where the first copy is): JetStream's offset.
                    Ok(ack) => Ok(Delivered {
                        partition: None,
                        offset: i64::try_from(ack.sequence).ok(),
                    }),
                    Err(e) => Err(faults::ack_failed(subject, &e, self.jetstream_enabled())),
                },
                () = &mut expiry => return Err(faults::timed_out(subject, true, self.timeout())),
                // The sender lives in `self.watch`: it cannot close while we wait.
                Ok(()) = status.changed() => {}
            }
        }
    }
}

impl Sink for NatsSink {
    async fn publish(&self, messages: &[OutboundMessage]) -> Vec<Result<Delivered, SinkError>> {
        let link = self.current();
        let deadline = Instant::now() + link.timeout();
        let ids = message_ids(&link.settings.message_id_prefix, messages);
        let mut results: Vec<Option<Result<Delivered, SinkError>>> = vec![None; messages.len()];
        let mut prepared = Vec::with_capacity(messages.len());
        for ((m, id), result) in messages.iter().zip(&ids).zip(&mut results) {
            match check_subject(&m.topic).and_then(|()| outgoing(m, id)) {
                Ok(out) => prepared.push(Some(out)),
                Err(why) => {
                    *result = Some(Err(SinkError::publish_failed(
                        &m.topic,
                        why,
                        PublishFault::Refused,
                    )));
                    prepared.push(None);
                }
            }
        }
        if prepared.iter().any(Option::is_some) && !link.connected_by(deadline).await {
            let why = link
                .watch
                .problem()
                .map(|(problem, text)| problem.error(&text).to_string());
            for ((m, out), result) in messages.iter().zip(&prepared).zip(&mut results) {
                if out.is_some() {
                    *result = Some(Err(faults::not_connected(
                        &m.topic,
                        why.as_deref(),
                        link.timeout(),
                    )));
                }
            }
            return settled(messages, results);
        }
        // Acknowledgements are awaited while later messages are sent, so the client's limit
        // on acknowledgements pending never holds a large batch up.
        let (to_wait, mut waiting) = tokio::sync::mpsc::unbounded_channel::<Awaiting>();
        let sending = link.send_all(messages, prepared, deadline, &self.in_flight, to_wait);
        let acknowledging = futures::stream::poll_fn(|cx| waiting.poll_recv(cx))
            .map(|awaiting| {
                let link = &link;
                async move {
                    let index = awaiting.index;
                    let subject = &messages[index].topic;
                    (index, link.acknowledged(subject, awaiting, deadline).await)
                }
            })
            .buffer_unordered(messages.len().max(1))
            .collect::<Vec<_>>();
        let (failed, acknowledged) = tokio::join!(sending, acknowledging);
        for (index, result) in acknowledged {
            results[index] = Some(result);
        }
        for (index, error) in failed {
            results[index] = Some(Err(error));
        }
        settled(messages, results)
    }

    /// Writes out what the client still holds and waits for the acknowledgements of batches
    /// still waiting, up to `timeout`. Blocks the calling thread.
    fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        let link = self.current();
        let in_flight = Arc::clone(&self.in_flight);
        self.runtime.block_on(async move {
            let flushed = async {
                link.client.flush().await.map_err(|e| e.to_string())?;
                in_flight.settled().await;
                Ok::<(), String>(())
            };
            match tokio::time::timeout(timeout, flushed).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(why)) => Err(unreachable(format!("flush: {why}"))),
                Err(_) => Err(unreachable(format!(
                    "flush: messages still unacknowledged after {timeout:?}"
                ))),
            }
        })
    }

    /// A JetStream account request answered within `timeout`. Without a connection, one
    /// connection attempt says why (credentials, TLS, unreachable). Blocks the calling thread.
    fn probe(&self, timeout: Duration) -> Result<(), SinkError> {
        let link = self.current();
        self.runtime.block_on(async move {
            let deadline = Instant::now() + timeout;
            // A sink just started may be connecting: give it a little of the time.
            let grace = Instant::now() + timeout / 4;
            if !link.connected_by(grace).await {
                return link
                    .diagnose(deadline.saturating_duration_since(Instant::now()))
                    .await;
            }
            match tokio::time::timeout_at(deadline, link.account_info()).await {
                Ok(answer) => answer,
                Err(_) => Err(match link.watch.problem() {
                    Some((problem, text)) => problem.error(&text),
                    None => unreachable(format!("no answer from the server within {timeout:?}")),
                }),
            }
        })
    }
}
