//! Whether the connection to Redis works, so the log says it once when it is lost (and why),
//! once when the cause changes and once when it works again, never once per batch or retry;
//! readiness names the same cause.

use std::sync::{Mutex, PoisonError};

use crate::sink::connection::ConnectionProblem;

/// The connection's state: `None` while it works (or nothing went wrong yet).
#[derive(Debug)]
pub(super) struct Watch {
    /// `host:port`, for the log lines.
    address: Mutex<String>,
    trouble: Mutex<Option<Trouble>>,
}

/// What went wrong, and the reason given when it began.
#[derive(Debug)]
struct Trouble {
    problem: ConnectionProblem,
    /// Kept for [`Watch::problem`] (the tests ask what the watch saw).
    #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests"))]
    reason: String,
    /// Seen on a connection made with settings since replaced (SIGHUP): the same problem on
    /// the new settings is logged again (it was not fixed), and the first success logs that
    /// the connection works again.
    stale: bool,
}

impl Watch {
    pub(super) fn new(address: String) -> Self {
        Self {
            address: Mutex::new(address),
            trouble: Mutex::new(None),
        }
    }

    /// The connection failed with `problem`; logged when that changes the state. Returns
    /// whether it did.
    pub(super) fn lost(&self, problem: ConnectionProblem, reason: &str) -> bool {
        let mut trouble = lock(&self.trouble);
        let changed = match trouble.as_ref() {
            None => true,
            Some(t) => t.stale || t.problem != problem,
        };
        if changed {
            let address = lock(&self.address).clone();
            tracing::warn!(
                address,
                "redis: {}; {}",
                problem.error(reason),
                hint(problem)
            );
            *trouble = Some(Trouble {
                problem,
                reason: reason.to_owned(),
                stale: false,
            });
        } else {
            tracing::debug!(address = %lock(&self.address), "redis (again): {reason}");
        }
        changed
    }

    /// The server answered: clears the problem, logging once that it is over. Returns whether
    /// there was one.
    pub(super) fn works(&self) -> bool {
        let Some(trouble) = lock(&self.trouble).take() else {
            return false;
        };
        tracing::info!(
            address = %lock(&self.address),
            after = ?trouble.problem,
            "redis: the connection works again"
        );
        true
    }

    /// New settings replaced the connection (SIGHUP), possibly to another `address`.
    pub(super) fn replaced(&self, address: String) {
        *lock(&self.address) = address;
        if let Some(trouble) = lock(&self.trouble).as_mut() {
            trouble.stale = true;
        }
    }

    /// The current problem and the reason given when it began.
    #[cfg(test)]
    pub(super) fn problem(&self) -> Option<(ConnectionProblem, String)> {
        lock(&self.trouble)
            .as_ref()
            .map(|t| (t.problem, t.reason.clone()))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What an operator can do about it (appended to the log line).
fn hint(problem: ConnectionProblem) -> &'static str {
    match problem {
        ConnectionProblem::Authentication => {
            "check the user and password of [redis] url; rows wait until Redis accepts them \
             (fix the secret, then SIGHUP)"
        }
        ConnectionProblem::Tls => {
            "check the rediss:// URL and ca_location, certificate_location and key_location \
             in [redis] against the server's certificate; rows wait until the handshake succeeds"
        }
        ConnectionProblem::Unreachable | ConnectionProblem::Other => {
            "check [redis] url and the network; rows wait until Redis answers"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ConnectionProblem::*;

    #[test]
    fn a_problem_is_logged_once_per_change_and_once_when_it_is_over() {
        let watch = Watch::new("h:6379".into());
        assert!(!watch.works(), "nothing to clear");
        assert!(watch.lost(Unreachable, "refused"));
        assert!(!watch.lost(Unreachable, "refused again"));
        assert_eq!(watch.problem(), Some((Unreachable, "refused".to_owned())));
        assert!(watch.lost(Authentication, "WRONGPASS"));
        assert!(watch.works());
        assert_eq!(watch.problem(), None);
        assert!(
            watch.lost(Authentication, "WRONGPASS"),
            "news again after recovery"
        );
    }

    #[test]
    fn the_same_problem_after_new_settings_is_logged_again() {
        let watch = Watch::new("h:6379".into());
        assert!(watch.lost(Authentication, "WRONGPASS"));
        watch.replaced("h2:6379".into());
        assert!(watch.lost(Authentication, "WRONGPASS"));
        assert!(!watch.lost(Authentication, "WRONGPASS"));
    }
}
