//! The sink's way to the broker: one connection with one channel in confirm mode (a [`Link`]),
//! and [`Links`], which hands the current one to batches and probes and opens a new one when
//! it is gone — the connection dropped, or the broker closed the channel (a missing exchange
//! does). One attempt at a time, each bounded by `rabbitmq.timeout` and run as its own task,
//! so a caller that stops waiting does not cut it short. The connection's state is logged once
//! per change, not once per batch.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::runtime::Handle;
use tokio::time::Instant;

use super::faults::LinkProblem;
use super::settings::Endpoint;
use crate::sink::SinkError;

/// The name the broker shows for Sluice's connections (management UI, `rabbitmqctl
/// list_connections`).
const CONNECTION_NAME: &str = "sluice";

/// A connection and its publishing channel, in confirm mode.
pub(super) struct Link {
    connection: Arc<Connection>,
    pub channel: Channel,
}

impl Link {
    /// Whether messages can still be published through it.
    fn usable(&self) -> bool {
        self.connection.status().connected() && self.channel.status().connected()
    }

    /// The connection, for a probe's own channel.
    pub(super) fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The largest frame the broker accepts on this connection.
    pub(super) fn frame_max(&self) -> usize {
        usize::try_from(self.connection.configuration().frame_max()).unwrap_or(usize::MAX)
    }
}

/// Why there is no link: the kind of trouble and what the client said.
#[derive(Debug, Clone)]
pub(super) struct LinkError {
    pub problem: LinkProblem,
    pub reason: String,
}

impl LinkError {
    fn of(error: &lapin::Error) -> Self {
        Self {
            problem: LinkProblem::of(error),
            reason: error.to_string(),
        }
    }

    fn timed_out(after: Duration) -> Self {
        Self {
            problem: LinkProblem::Unreachable,
            reason: format!(
                "no answer within {} (rabbitmq.timeout)",
                humantime::format_duration(after)
            ),
        }
    }

    /// The error a probe reports.
    pub(super) fn to_sink_error(&self) -> SinkError {
        self.problem.error(self.reason.clone())
    }
}

/// A connection attempt in flight, awaited by every caller that needs a link meanwhile.
type Opening = Shared<BoxFuture<'static, Result<Arc<Link>, LinkError>>>;

/// The current link, or the attempt to make one.
enum Current {
    Idle,
    Opening(Opening),
    Open(Arc<Link>),
}

/// What [`Links`] guards.
struct State {
    endpoint: Arc<Endpoint>,
    /// Bumped when the endpoint changes: an attempt for an older one is dropped when done.
    generation: u64,
    current: Current,
    health: Health,
}

impl State {
    /// Logs `what` if the connection was up: it is down from now on.
    fn lost(&mut self, what: &str) {
        if self.health == Health::Up {
            tracing::warn!("{what}");
            self.health = Health::Down(LinkProblem::Unreachable);
        }
    }
}

/// The connection's state as last logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    /// Nothing tried yet.
    Unknown,
    Up,
    Down(LinkProblem),
}

/// Hands out the current [`Link`], opening one when there is none.
pub(super) struct Links {
    handle: Handle,
    timeout: Mutex<Duration>,
    state: Mutex<State>,
}

impl Links {
    /// Links to `endpoint`, each attempt bounded by `timeout`; attempts run on `handle`.
    pub(super) fn new(handle: Handle, endpoint: Endpoint, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            handle,
            timeout: Mutex::new(timeout),
            state: Mutex::new(State {
                endpoint: Arc::new(endpoint),
                generation: 0,
                current: Current::Idle,
                health: Health::Unknown,
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts connecting without waiting (so the log says early whether the broker answers).
    pub(super) fn warm(self: &Arc<Self>) {
        let _opening = self.opening();
    }

    /// The current link, opening one if needed; waits until `deadline` at most.
    pub(super) async fn get(self: &Arc<Self>, deadline: Instant) -> Result<Arc<Link>, LinkError> {
        let opening = match self.opening() {
            Ok(link) => return Ok(link),
            Err(opening) => opening,
        };
        match tokio::time::timeout_at(deadline, opening).await {
            Ok(result) => result,
            Err(_) => Err(LinkError {
                problem: LinkProblem::Unreachable,
                reason: "no connection to the broker yet (still trying)".to_owned(),
            }),
        }
    }

    /// The current link if it is open and usable, without connecting (for `flush`).
    pub(super) fn open(&self) -> Option<Arc<Link>> {
        match &self.state().current {
            Current::Open(link) if link.usable() => Some(Arc::clone(link)),
            _ => None,
        }
    }

    /// The usable link, or the attempt in flight (started now if there is none).
    fn opening(self: &Arc<Self>) -> Result<Arc<Link>, Opening> {
        let mut state = self.state();
        let reuse = match &state.current {
            Current::Open(link) if link.usable() => return Ok(Arc::clone(link)),
            Current::Opening(opening) => return Err(opening.clone()),
            Current::Open(link) if link.connection.status().connected() => {
                // The broker closed the channel only (a missing exchange, said by the batch
                // that met it): a new channel on the same connection.
                tracing::debug!("rabbitmq channel closed; opening another");
                Some(Arc::clone(&link.connection))
            }
            Current::Open(_) => {
                state.lost("rabbitmq connection lost; reconnecting (rows wait meanwhile)");
                None
            }
            Current::Idle => None,
        };
        let opening = self.start(&state, reuse);
        state.current = Current::Opening(opening.clone());
        Err(opening)
    }

    /// Spawns an attempt to open a link to the current endpoint (a new channel on `reuse` if
    /// given); it files its own result, so no caller has to wait for it.
    fn start(self: &Arc<Self>, state: &State, reuse: Option<Arc<Connection>>) -> Opening {
        let endpoint = Arc::clone(&state.endpoint);
        let generation = state.generation;
        let timeout = *self.timeout.lock().unwrap_or_else(PoisonError::into_inner);
        let links = Arc::clone(self);
        let task = self.handle.spawn(async move {
            let result = match tokio::time::timeout(timeout, open(&endpoint, reuse)).await {
                Ok(Ok(link)) => Ok(Arc::new(link)),
                Ok(Err(e)) => Err(LinkError::of(&e)),
                Err(_) => Err(LinkError::timed_out(timeout)),
            };
            links.settle(generation, &result);
            result
        });
        async move {
            task.await.unwrap_or_else(|e| {
                Err(LinkError {
                    problem: LinkProblem::Unreachable,
                    reason: format!("connecting failed: {e}"),
                })
            })
        }
        .boxed()
        .shared()
    }

    /// Files the result of an attempt for `generation`, logging a change of state.
    fn settle(&self, generation: u64, result: &Result<Arc<Link>, LinkError>) {
        let mut state = self.state();
        if state.generation != generation {
            // Made for settings replaced meanwhile: dropped (closing its connection).
            return;
        }
        let endpoint = &state.endpoint.uri.authority;
        let at = format!("{}:{}", endpoint.host, endpoint.port);
        match result {
            Ok(link) => {
                match state.health {
                    Health::Down(_) => {
                        tracing::info!(broker = %at, "rabbitmq connection restored");
                    }
                    Health::Unknown => tracing::info!(broker = %at, "connected to rabbitmq"),
                    Health::Up => {}
                }
                state.health = Health::Up;
                state.current = Current::Open(Arc::clone(link));
            }
            Err(e) => {
                if state.health != Health::Down(e.problem) {
                    tracing::warn!(
                        broker = %at,
                        reason = %e.reason,
                        "cannot connect to rabbitmq; {}",
                        e.problem.hint()
                    );
                }
                state.health = Health::Down(e.problem);
                state.current = Current::Idle;
            }
        }
    }

    /// Stops handing out `link` (a batch timed out on it: the broker may be hung); the next
    /// caller opens a new one. Batches still using it finish on it.
    pub(super) fn retire(&self, link: &Arc<Link>) {
        let mut state = self.state();
        if let Current::Open(current) = &state.current
            && Arc::ptr_eq(current, link)
        {
            state.lost(
                "rabbitmq did not confirm a batch in time; reconnecting (rows wait meanwhile)",
            );
            state.current = Current::Idle;
        }
    }

    /// Uses `endpoint` and `timeout` from now on: the next caller opens a new link, batches
    /// in flight finish on theirs.
    pub(super) fn replace(&self, endpoint: Endpoint, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(PoisonError::into_inner) = timeout;
        let mut state = self.state();
        state.endpoint = Arc::new(endpoint);
        state.generation += 1;
        state.current = Current::Idle;
    }
}

/// Opens a connection (or takes `reuse`) and a channel on it in confirm mode.
async fn open(endpoint: &Endpoint, reuse: Option<Arc<Connection>>) -> Result<Link, lapin::Error> {
    let connection = match reuse {
        Some(connection) => connection,
        None => {
            let properties =
                ConnectionProperties::default().with_connection_name(CONNECTION_NAME.into());
            let connection = Connection::connect_uri_with_config(
                endpoint.uri.clone(),
                properties,
                endpoint.tls.clone(),
                lapin::runtime::default_runtime()?,
            )
            .await?;
            Arc::new(connection)
        }
    };
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(Link {
        connection,
        channel,
    })
}
