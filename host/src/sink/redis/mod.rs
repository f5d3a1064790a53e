//! Redis Streams sink: each message is one stream entry (`XADD`) on the stream named by its
//! topic. A batch is one pipeline on one connection (one write, one round trip, applied in
//! slice order), optionally followed by `WAIT` for replicas; each `XADD`'s reply (the entry
//! id) is that message's confirmation, an error reply fails that message alone.
//!
//! - `settings`: `[redis]`
//! - `entry`: the field layout of an entry, and what no entry can carry
//! - `faults`: whose fault an error reply is, what kind of trouble a client error is
//! - `link`: the shared connection, made on first use and again after it broke
//! - `watch`: the connection's state, logged once per change

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ::redis::Value;
use tokio::time::Instant;

use self::entry::{Layout, indexes_in_row};
use self::faults::{connection_is_broken, connection_problem, entry_error, is_authentication};
use self::link::{Connection, Link};
use self::watch::Watch;
use super::connection::ConnectionProblem;
use super::{Delivered, PublishFault, Sink, SinkError};
use crate::model::{Broker, OutboundMessage};

mod entry;
mod faults;
mod link;
pub(crate) mod settings;
#[cfg(test)]
mod tests;
mod watch;

pub(crate) use settings::RedisSettings;

/// Publishes to Redis Streams. Connects on first use (a relay starts while Redis is down;
/// rows wait) and again after a connection broke.
pub(crate) struct RedisSink {
    /// The runtime `probe` and `flush` run their round trip on: they are called from
    /// blocking threads.
    runtime: tokio::runtime::Handle,
    watch: Arc<Watch>,
    /// What batches publish with; replaced on [`RedisSink::reconfigure`]. Batches hold their
    /// own handle, so one in flight finishes on the settings and connection it began with.
    current: Mutex<Arc<Setup>>,
}

/// One version of `[redis]`: its connection and how it writes entries.
struct Setup {
    link: Link,
    layout: Layout,
    timeout: Duration,
    wait_replicas: Option<u32>,
}

impl Setup {
    fn new(settings: &RedisSettings) -> Result<Self, SinkError> {
        let problems = settings.problems();
        if !problems.is_empty() {
            let reason = problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            return Err(settings_error(reason));
        }
        let client = settings.client().map_err(settings_error)?;
        Ok(Self {
            link: Link::new(client, settings.timeout()),
            layout: Layout::new(settings),
            timeout: settings.timeout(),
            wait_replicas: settings.wait_replicas,
        })
    }
}

fn settings_error(reason: String) -> SinkError {
    SinkError::Settings {
        broker: Broker::Redis,
        reason,
    }
}

/// The replies to a batch's `XADD`s, one per entry, and whether the replicas it waited for
/// have them (`Err`: why not).
struct Replies {
    entries: Vec<Value>,
    replicated: Result<(), String>,
}

/// How much of the batch's `remaining` time a `WAIT` may take: all but a tenth, at most a
/// second, left for its answer to come back before the batch's deadline. Without that margin
/// both end together, and the error says "no reply" instead of how many replicas acknowledged.
fn wait_timeout(remaining: Duration) -> Duration {
    let margin = (remaining / 10).min(Duration::from_secs(1));
    // `WAIT n 0` blocks for ever.
    remaining
        .saturating_sub(margin)
        .max(Duration::from_millis(1))
}

impl RedisSink {
    /// A sink for `settings`. Ok while Redis is unreachable (the first connection is
    /// attempted in the background and again by each batch until one works); Err only for
    /// settings that cannot work: a URL that does not parse, TLS files that cannot be read.
    pub(crate) async fn connect(settings: &RedisSettings) -> Result<Self, SinkError> {
        let setup = Arc::new(Setup::new(settings)?);
        let watch = Arc::new(Watch::new(setup.link.address().to_owned()));
        {
            // Early, so a Redis that is down or refuses the credentials is in the log at
            // start, and the first batch finds the connection made.
            let (setup, watch) = (Arc::clone(&setup), Arc::clone(&watch));
            tokio::spawn(async move {
                let deadline = Instant::now() + setup.timeout;
                let _ = setup.link.connection(deadline, &watch).await;
            });
        }
        Ok(Self {
            runtime: tokio::runtime::Handle::current(),
            watch,
            current: Mutex::new(setup),
        })
    }

    /// Publishes with `settings` from now on (rotated credentials, on SIGHUP): later batches
    /// use a new connection; batches in flight finish on the old one, which closes after the
    /// last of them. Settings that cannot work leave the current ones in place.
    pub(crate) async fn reconfigure(&self, settings: &RedisSettings) -> Result<(), SinkError> {
        let setup = Arc::new(Setup::new(settings)?);
        self.watch.replaced(setup.link.address().to_owned());
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = setup;
        Ok(())
    }

    fn setup(&self) -> Arc<Setup> {
        Arc::clone(&self.current.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Sends a batch's `XADD`s (`pipeline`) on the current connection, made if need be, with
    /// a `WAIT` after them when `[redis]` asks for replicas; `Err` (why) when no reply came.
    async fn send_batch(
        &self,
        setup: &Setup,
        mut pipeline: ::redis::Pipeline,
        deadline: Instant,
    ) -> Result<Replies, String> {
        let connection = setup
            .link
            .connection(deadline, &self.watch)
            .await
            .map_err(|(_, reason)| reason)?;
        let entries = pipeline.len();
        // What is left of the batch's time once connected, so `WAIT` ends before the batch.
        let wait = setup.wait_replicas.map(|n| {
            let waited = wait_timeout(deadline.saturating_duration_since(Instant::now()));
            let ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
            pipeline.cmd("WAIT").arg(n).arg(ms);
            (n, waited)
        });
        let mut replies = self
            .round_trip(setup, &connection, &pipeline, deadline)
            .await?;
        if replies.len() != pipeline.len() {
            return Err(format!(
                "{} replies to {} commands from {}",
                replies.len(),
                pipeline.len(),
                setup.link.address()
            ));
        }
        let replicated = match wait {
            Some((n, waited)) => replicated(replies.pop().as_ref(), n, waited),
            None => Ok(()),
        };
        replies.truncate(entries);
        Ok(Replies {
            entries: replies,
            replicated,
        })
    }

    /// Sends `pipeline` on `connection` and returns its replies, one per command;
    /// `Err` (why) when there are none by `deadline` or the connection failed. Files the
    /// outcome with the watch, and drops a connection that broke.
    async fn round_trip(
        &self,
        setup: &Setup,
        connection: &Connection,
        pipeline: &::redis::Pipeline,
        deadline: Instant,
    ) -> Result<Vec<Value>, String> {
        let mut conn = connection.conn.clone();
        let replies =
            tokio::time::timeout_at(deadline, pipeline.query_async::<Vec<Value>>(&mut conn));
        match replies.await {
            Ok(Ok(replies)) => {
                // Replies came, but an unauthenticated connection's are all refusals.
                let unauthenticated = replies.iter().find_map(|r| match r {
                    Value::ServerError(e) if is_authentication(e) => Some(e),
                    _ => None,
                });
                if let Some(e) = unauthenticated {
                    self.watch
                        .lost(ConnectionProblem::Authentication, &e.to_string());
                } else {
                    self.watch.works();
                }
                Ok(replies)
            }
            Ok(Err(e)) => Err(self.failed(setup, connection, &e).await),
            Err(_) => {
                // The connection is kept: if Redis is only slow, the next batch's commands
                // queue behind this one's on it and are applied after them, in order.
                let reason = format!(
                    "no reply from {} within {} (the entries may be stored still, so \
                     publishing them again may duplicate them)",
                    setup.link.address(),
                    humantime::format_duration(setup.timeout)
                );
                self.watch.lost(ConnectionProblem::Unreachable, &reason);
                Err(reason)
            }
        }
    }

    /// Files a failed round trip on `connection` and says why it failed.
    async fn failed(
        &self,
        setup: &Setup,
        connection: &Connection,
        e: &::redis::RedisError,
    ) -> String {
        if connection_is_broken(e) {
            setup.link.discard(connection).await;
        }
        let reason = format!("{}: {e}", setup.link.address());
        self.watch
            .lost(connection_problem(e, setup.link.tls()), &reason);
        reason
    }

    /// One `PING` on the current connection (made if there is none), by `deadline`.
    async fn ping(&self, deadline: Instant) -> Result<(), SinkError> {
        let setup = self.setup();
        let connection = setup
            .link
            .connection(deadline, &self.watch)
            .await
            .map_err(|(problem, reason)| problem.error(&reason))?;
        match tokio::time::timeout_at(deadline, connection.ping()).await {
            Ok(Ok(_)) => {
                self.watch.works();
                Ok(())
            }
            Ok(Err(e)) => {
                let reason = self.failed(&setup, &connection, &e).await;
                Err(connection_problem(&e, setup.link.tls()).error(&reason))
            }
            Err(_) => {
                let reason = format!("no answer to PING from {}", setup.link.address());
                self.watch.lost(ConnectionProblem::Unreachable, &reason);
                Err(ConnectionProblem::Unreachable.error(&reason))
            }
        }
    }
}

/// The fate of one sent entry from its reply; `replicated` is `Err(why)` when the batch's
/// `WAIT` fell short. The reply is the entry id (`<ms>-<seq>`), two numbers rather than one
/// offset: the [`Delivered`] stays empty.
fn settle(
    m: &OutboundMessage,
    reply: &Value,
    replicated: &Result<(), String>,
) -> Result<Delivered, SinkError> {
    match reply {
        Value::BulkString(_) | Value::SimpleString(_) => replicated
            .as_ref()
            .map(|()| Delivered::default())
            .map_err(|why| {
                SinkError::publish_failed(&m.topic, why.clone(), PublishFault::Unavailable)
            }),
        Value::Nil => Err(SinkError::publish_failed(
            &m.topic,
            "stream does not exist (redis.create_streams = false: XADD NOMKSTREAM creates \
             none); create it, e.g. XGROUP CREATE <stream> <group> $ MKSTREAM, and the row is \
             retried",
            PublishFault::Refused,
        )),
        Value::ServerError(e) => {
            let (fault, message) = entry_error(e);
            Err(SinkError::publish_failed(&m.topic, message, fault))
        }
        other => Err(SinkError::publish_failed(
            &m.topic,
            format!("unexpected reply to XADD: {other:?}"),
            PublishFault::Failed,
        )),
    }
}

/// Whether the `WAIT` reply says `wanted` replicas have the batch.
fn replicated(reply: Option<&Value>, wanted: u32, waited: Duration) -> Result<(), String> {
    match reply {
        None => Ok(()),
        Some(Value::Int(got)) if *got >= i64::from(wanted) => Ok(()),
        Some(Value::Int(got)) => Err(format!(
            "stored on the primary, but only {got} of {wanted} replicas acknowledged it within \
             {} (redis.wait_replicas); publishing again may duplicate it",
            humantime::format_duration(waited)
        )),
        Some(other) => Err(format!(
            "stored on the primary, but WAIT for {wanted} replicas failed: {other:?}"
        )),
    }
}

impl Sink for RedisSink {
    async fn publish(&self, messages: &[OutboundMessage]) -> Vec<Result<Delivered, SinkError>> {
        let setup = self.setup();
        let deadline = Instant::now() + setup.timeout;
        let mut results: Vec<Option<Result<Delivered, SinkError>>> = vec![None; messages.len()];
        let mut pipeline = ::redis::pipe();
        // Error replies come back as values, one per command: one entry's refusal fails
        // that message alone.
        pipeline.ignore_errors();
        let mut sent = Vec::with_capacity(messages.len());
        for ((i, m), index) in messages.iter().enumerate().zip(indexes_in_row(messages)) {
            match setup.layout.xadd(m, index) {
                Ok(cmd) => {
                    pipeline.add_command(cmd);
                    sent.push(i);
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        if !sent.is_empty() {
            match self.send_batch(&setup, pipeline, deadline).await {
                Ok(replies) => {
                    for (i, reply) in sent.iter().zip(&replies.entries) {
                        results[*i] = Some(settle(&messages[*i], reply, &replies.replicated));
                    }
                }
                Err(why) => {
                    for i in &sent {
                        results[*i] = Some(Err(SinkError::publish_failed(
                            &messages[*i].topic,
                            why.clone(),
                            PublishFault::Unavailable,
                        )));
                    }
                }
            }
        }
        results
            .into_iter()
            .zip(messages)
            .map(|(result, m)| {
                result.unwrap_or_else(|| {
                    Err(SinkError::publish_failed(
                        &m.topic,
                        "not settled (a sink bug)",
                        PublishFault::Unavailable,
                    ))
                })
            })
            .collect()
    }

    /// Waits until Redis has answered every command already handed to the connection: a
    /// `PING` queued behind them is answered after them (Redis answers a connection's
    /// commands in order). Nothing to wait for without a connection.
    fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        self.runtime.block_on(async {
            let setup = self.setup();
            let Some(connection) = setup.link.current().await else {
                return Ok(());
            };
            match tokio::time::timeout(timeout, connection.ping()).await {
                Ok(Ok(_)) => Ok(()),
                // An error reply is an answer too: everything before it was answered.
                Ok(Err(e)) if e.code().is_some() => Ok(()),
                Ok(Err(e)) => Err(SinkError::Unreachable {
                    reason: format!("flush: {}: {e}", setup.link.address()),
                    cause: None,
                }),
                Err(_) => Err(SinkError::Unreachable {
                    reason: format!(
                        "flush: no answer from {} within {}",
                        setup.link.address(),
                        humantime::format_duration(timeout)
                    ),
                    cause: None,
                }),
            }
        })
    }

    /// A `PING` round trip within `timeout` (connecting first if need be); the error names
    /// why it failed: credentials, TLS, or no answer.
    fn probe(&self, timeout: Duration) -> Result<(), SinkError> {
        self.runtime
            .block_on(async { self.ping(Instant::now() + timeout).await })
    }
}
