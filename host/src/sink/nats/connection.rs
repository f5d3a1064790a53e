//! The state of one NATS connection as the client's events tell it: connected or not, why not
//! (credentials, TLS, unreachable), how often it was lost, and which subjects the server just
//! refused for lack of permission. The client retries a failing connection for ever and reports
//! every attempt; this keeps the current state, so the log says what is wrong once when it
//! starts, once when it changes and once when the connection works again, and a batch can stop
//! waiting for acknowledgements that a lost connection will never bring.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_nats::{ClientError, Event, ServerError};
use tokio::sync::watch;

use crate::sink::SinkError;

/// How long a subject's refusal is kept to tell a batch waiting on it.
const DENIAL_KEPT: Duration = Duration::from_secs(60);
/// Subjects kept at most (each refusal adds one until the oldest are forgotten).
const MAX_DENIALS: usize = 1024;
/// What the server writes before the subject when it refuses a publish.
const PUBLISH_DENIED: &str = "permissions violation for publish to";

/// Why the client is not connected, from the failed attempt's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ConnectionProblem {
    /// The server refused the credentials (authorization violation), or they could not be
    /// used (a nonce that could not be signed with the `.creds` file's key).
    Authentication,
    /// The TLS handshake failed.
    Tls,
    /// No answer: refused, timed out, name not resolved, closed.
    Unreachable,
}

impl ConnectionProblem {
    /// The problem a failed connection attempt's text names (async-nats reports the kind of
    /// its `ConnectError`: "authorization violation", "TLS error", "IO error", …).
    pub(super) fn classify(text: &str) -> Self {
        let text = text.to_ascii_lowercase();
        if text.contains("authorization")
            || text.contains("authentication")
            || text.contains("signing nonce")
        {
            Self::Authentication
        } else if text.contains("tls") || text.contains("certificate") || text.contains("handshake")
        {
            Self::Tls
        } else {
            Self::Unreachable
        }
    }

    /// The error readiness reports for this problem, with the client's `reason`.
    pub(super) fn error(self, reason: &str) -> SinkError {
        let reason = format!("{reason}; {}", self.hint());
        match self {
            Self::Authentication => SinkError::Authentication(reason),
            Self::Tls => SinkError::Tls(reason),
            Self::Unreachable => SinkError::Unreachable {
                reason,
                cause: None,
            },
        }
    }

    /// What an operator can do about it.
    fn hint(self) -> &'static str {
        match self {
            Self::Authentication => {
                "check the user and password in nats.url, nats.token or \
                 nats.credentials_location; rows wait until the server accepts them (fix the \
                 secret, then SIGHUP)"
            }
            Self::Tls => {
                "check the tls:// URL, nats.ca_location, nats.certificate_location and \
                 nats.key_location against the server's certificate; rows wait until the \
                 handshake succeeds"
            }
            Self::Unreachable => {
                "check nats.url and the network; rows wait until the server answers"
            }
        }
    }
}

/// What a batch watches while it waits for acknowledgements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Status {
    pub connected: bool,
    /// Connections lost so far: an acknowledgement due on a lost connection never comes.
    pub lost: u64,
    /// Publishes refused for lack of permission so far (see [`ConnectionWatch::denied_since`]).
    pub denials: u64,
}

/// One client's connection state (see the module documentation).
#[derive(Debug)]
pub(super) struct ConnectionWatch {
    status: watch::Sender<Status>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Why the client is not connected, and the text of the attempt that said so.
    problem: Option<(ConnectionProblem, String)>,
    /// Whether the connection was up once and then lost (so coming back is news).
    was_lost: bool,
    /// Subjects the server refused a publish to, and when.
    denied: HashMap<String, Instant>,
}

impl Default for ConnectionWatch {
    fn default() -> Self {
        Self {
            status: watch::Sender::new(Status::default()),
            state: Mutex::default(),
        }
    }
}

impl ConnectionWatch {
    /// Files one of the client's events, logging it if it changes the state.
    pub(super) fn event(&self, event: Event) {
        match event {
            Event::Connected => self.connected(),
            Event::Disconnected => {
                self.lock().was_lost = true;
                self.status.send_modify(|s| {
                    s.connected = false;
                    s.lost += 1;
                });
                tracing::warn!(
                    "nats: lost the connection to the server; reconnecting, rows wait until \
                     it is back"
                );
            }
            Event::ClientError(ClientError::Other(text)) => {
                self.failed(ConnectionProblem::classify(&text), &text);
            }
            Event::ClientError(other) => tracing::warn!("nats: {other}"),
            Event::ServerError(ServerError::AuthorizationViolation) => self.failed(
                ConnectionProblem::Authentication,
                "the server refused the credentials (authorization violation)",
            ),
            Event::ServerError(ServerError::Other(text)) => self.server_error(&text),
            Event::ServerError(e @ ServerError::SlowConsumer(_)) => tracing::debug!("{e}"),
            Event::LameDuckMode => tracing::info!(
                "nats: the server is shutting down (lame duck mode); the client moves to \
                 another server when it closes"
            ),
            Event::SlowConsumer(_) | Event::Draining | Event::Closed => {
                tracing::debug!("nats: {event}");
            }
        }
    }

    /// The connection is up: clears the problem, logging once that it is over.
    fn connected(&self) {
        let mut state = self.lock();
        let problem = state.problem.take();
        let was_lost = std::mem::take(&mut state.was_lost);
        drop(state);
        self.status.send_modify(|s| s.connected = true);
        match problem {
            Some((problem, _)) => tracing::info!(
                after = ?problem,
                "nats: connected to the server again"
            ),
            None if was_lost => tracing::info!("nats: connected to the server again"),
            None => tracing::info!("nats: connected to the server"),
        }
    }

    /// A connection attempt failed with `problem`: logged when it is new.
    fn failed(&self, problem: ConnectionProblem, text: &str) {
        let mut state = self.lock();
        if state.problem.as_ref().is_some_and(|(p, _)| *p == problem) {
            tracing::debug!("nats (again): {text}");
            return;
        }
        let error = problem.error(text);
        state.problem = Some((problem, text.to_owned()));
        drop(state);
        tracing::warn!("nats: {error}");
    }

    /// An `-ERR` from the server on an open connection: a refused publish is kept for the
    /// batch waiting on it, anything else is logged.
    fn server_error(&self, text: &str) {
        let Some(subject) = denied_subject(text) else {
            tracing::warn!("nats: the server reported an error: {text}");
            return;
        };
        let now = Instant::now();
        let mut state = self.lock();
        if state.denied.len() >= MAX_DENIALS {
            state
                .denied
                .retain(|_, at| now.duration_since(*at) < DENIAL_KEPT);
        }
        if state.denied.len() < MAX_DENIALS {
            state.denied.insert(subject.to_owned(), now);
        }
        drop(state);
        tracing::debug!(subject, "nats: the server refused a publish: {text}");
        self.status.send_modify(|s| s.denials += 1);
    }

    /// Whether the server refused a publish to `subject` since `since`.
    pub(super) fn denied_since(&self, subject: &str, since: Instant) -> bool {
        self.lock()
            .denied
            .get(subject)
            .is_some_and(|at| *at >= since)
    }

    /// The current status, and a receiver that sees every later change.
    pub(super) fn subscribe(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    /// The current problem and the text of the attempt that reported it.
    pub(super) fn problem(&self) -> Option<(ConnectionProblem, String)> {
        self.lock().problem.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The subject of a `Permissions Violation for Publish to "subject"` error.
fn denied_subject(text: &str) -> Option<&str> {
    let at = text.to_ascii_lowercase().find(PUBLISH_DENIED)? + PUBLISH_DENIED.len();
    let rest = text[at..].trim().trim_start_matches('"');
    let end = rest.find(['"', ' ']).unwrap_or(rest.len());
    Some(&rest[..end]).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_texts_are_sorted_into_authentication_tls_and_unreachable() {
        use ConnectionProblem::*;
        assert_eq!(
            ConnectionProblem::classify("authorization violation"),
            Authentication
        );
        assert_eq!(
            ConnectionProblem::classify("failed signing nonce"),
            Authentication
        );
        assert_eq!(ConnectionProblem::classify("TLS error"), Tls);
        assert_eq!(
            ConnectionProblem::classify("IO error: invalid peer certificate: UnknownIssuer"),
            Tls
        );
        assert_eq!(ConnectionProblem::classify("IO error"), Unreachable);
        assert_eq!(ConnectionProblem::classify("timed out"), Unreachable);
        assert!(matches!(
            Authentication.error("authorization violation"),
            SinkError::Authentication(_)
        ));
        assert!(Tls.error("x").to_string().starts_with("TLS"));
    }

    #[test]
    fn a_problem_is_reported_once_per_change_and_cleared_by_a_connection() {
        let watch = ConnectionWatch::default();
        let rx = watch.subscribe();
        watch.event(Event::ClientError(ClientError::Other("IO error".into())));
        watch.event(Event::ClientError(ClientError::Other("IO error".into())));
        assert_eq!(
            watch.problem().map(|p| p.0),
            Some(ConnectionProblem::Unreachable)
        );
        watch.event(Event::ClientError(ClientError::Other(
            "authorization violation".into(),
        )));
        assert_eq!(
            watch.problem(),
            Some((
                ConnectionProblem::Authentication,
                "authorization violation".into()
            ))
        );
        watch.event(Event::Connected);
        assert_eq!(watch.problem(), None);
        assert!(rx.borrow().connected);
        watch.event(Event::Disconnected);
        assert_eq!(
            *rx.borrow(),
            Status {
                connected: false,
                lost: 1,
                denials: 0
            }
        );
    }

    #[test]
    fn a_refused_publish_is_kept_by_subject() {
        let watch = ConnectionWatch::default();
        let before = Instant::now();
        watch.event(Event::ServerError(ServerError::Other(
            "Permissions Violation for Publish to \"orders.secret\"".into(),
        )));
        assert!(watch.denied_since("orders.secret", before));
        assert!(!watch.denied_since("orders.other", before));
        assert!(!watch.denied_since("orders.secret", Instant::now() + Duration::from_secs(1)));
        assert_eq!(watch.subscribe().borrow().denials, 1);
        assert_eq!(
            denied_subject("Permissions Violation for Publish to a.b"),
            Some("a.b")
        );
        assert_eq!(denied_subject("Maximum Payload Violation"), None);
    }
}
