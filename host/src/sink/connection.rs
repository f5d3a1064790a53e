//! What is wrong with the producer's connection to the broker, as librdkafka's error events
//! say: the credentials (SASL), TLS, or the broker cannot be reached. librdkafka retries a
//! failing connection every few seconds and reports every attempt; this keeps the current
//! state, so the log says what is wrong once when it starts, once when it changes and once
//! when the connection works again, and readiness (`/readyz`) names the same cause.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use rdkafka::error::RDKafkaErrorCode;

use super::SinkError;

/// The kind of an error librdkafka reports about the client as a whole (not one message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ConnectionProblem {
    /// The broker refused the credentials, or the SASL exchange failed.
    Authentication,
    /// The TLS handshake failed: the broker's certificate does not verify, or the protocols
    /// do not match.
    Tls,
    /// No connection: refused, timed out, name not resolved, closed by the broker.
    Unreachable,
    /// Anything else (not about the connection): logged as it comes.
    Other,
}

impl ConnectionProblem {
    /// The kind of an error event with `code` and text `reason`. librdkafka reports a failed
    /// TLS handshake or SASL exchange twice, as itself and again as a transport failure
    /// whose text names it; that text decides, or the state would flap between the two.
    pub(super) fn classify(code: RDKafkaErrorCode, reason: &str) -> Self {
        match Self::of(code) {
            Self::Unreachable if code != RDKafkaErrorCode::AllBrokersDown => {
                if reason.contains("SSL") {
                    Self::Tls
                } else if reason.contains("SASL") || reason.contains("uthentication") {
                    Self::Authentication
                } else {
                    Self::Unreachable
                }
            }
            kind => kind,
        }
    }

    /// The kind of an error event with `code`.
    pub(super) fn of(code: RDKafkaErrorCode) -> Self {
        use RDKafkaErrorCode::*;
        match code {
            Authentication
            | SaslAuthenticationFailed
            | UnsupportedSASLMechanism
            | IllegalSASLState => Self::Authentication,
            SSL => Self::Tls,
            BrokerTransportFailure
            | AllBrokersDown
            | Resolve
            | NetworkException
            | RequestTimedOut
            | OperationTimedOut => Self::Unreachable,
            _ => Self::Other,
        }
    }

    /// The error readiness reports for this problem, with librdkafka's `reason`.
    pub(super) fn error(self, reason: &str) -> SinkError {
        let reason = reason.to_owned();
        match self {
            Self::Authentication => SinkError::Authentication(reason),
            Self::Tls => SinkError::Tls(reason),
            Self::Unreachable | Self::Other => SinkError::Unreachable {
                reason,
                cause: None,
            },
        }
    }

    /// What an operator can do about it (appended to the log line).
    fn hint(self) -> &'static str {
        match self {
            Self::Authentication => {
                "check sasl.mechanism, sasl.username and sasl.password in [kafka]; \
                 rows wait until the broker accepts them (fix the secret, then SIGHUP)"
            }
            Self::Tls => {
                "check security.protocol and ssl.ca.location in [kafka] against the broker's \
                 certificate; rows wait until the handshake succeeds"
            }
            Self::Unreachable | Self::Other => {
                "check bootstrap.servers and the network; rows wait until the broker answers"
            }
        }
    }
}

/// The producer's connection state: `None` while it works (or nothing was reported yet).
#[derive(Debug, Default)]
pub(super) struct ConnectionWatch {
    /// Whether a problem is set, so a successful delivery (one per message) only takes the
    /// lock when there is something to clear.
    troubled: AtomicBool,
    problem: Mutex<Option<Trouble>>,
}

/// A problem librdkafka reported, and the reason it gave when it began.
#[derive(Debug)]
struct Trouble {
    problem: ConnectionProblem,
    reason: String,
    /// Reported by a producer that has since been replaced (SIGHUP): the new one has yet to
    /// show whether it has the same problem. If it does, that is logged again; if it works,
    /// the log says the connection works again.
    stale: bool,
}

/// What [`ConnectionWatch::report`] did with an error event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reported {
    /// The state changed to this problem: logged.
    Changed,
    /// Same problem as before (a retry): not logged again.
    Same,
    /// Not about the connection: logged as it comes, state untouched.
    Other,
}

impl ConnectionWatch {
    /// Files an error event from librdkafka (`reason` is its text) and logs it if it changes
    /// the state.
    pub(super) fn report(&self, code: RDKafkaErrorCode, reason: &str) -> Reported {
        let problem = ConnectionProblem::classify(code, reason);
        if problem == ConnectionProblem::Other {
            tracing::error!(target: "librdkafka", code = ?code, "librdkafka: {reason}");
            return Reported::Other;
        }
        let mut current = self.lock();
        let changed = match current.as_ref() {
            None => true,
            Some(trouble) if trouble.stale => true,
            // "All brokers are down" follows every failed attempt; it does not replace the
            // more telling cause (authentication, TLS) that made them go down.
            Some(_) if code == RDKafkaErrorCode::AllBrokersDown => false,
            Some(trouble) => trouble.problem != problem,
        };
        if !changed {
            tracing::debug!(target: "librdkafka", code = ?code, "librdkafka (again): {reason}");
            return Reported::Same;
        }
        let error = problem.error(reason);
        tracing::warn!(code = ?code, "kafka: {error}; {}", problem.hint());
        *current = Some(Trouble {
            problem,
            reason: reason.to_owned(),
            stale: false,
        });
        self.troubled.store(true, Ordering::Release);
        Reported::Changed
    }

    /// The connection works (a message was acknowledged, or metadata came back): clears the
    /// problem, logging once that it is over.
    pub(super) fn works(&self) {
        if !self.troubled.load(Ordering::Acquire) {
            return;
        }
        let mut current = self.lock();
        if let Some(trouble) = current.take() {
            tracing::info!(
                after = ?trouble.problem,
                "kafka: the connection to the broker works again"
            );
        }
        self.troubled.store(false, Ordering::Release);
    }

    /// A new producer (new credentials, on SIGHUP) replaced the one that reported the
    /// problem. The problem stays until the new producer shows how it fares: the same problem
    /// again is logged again (it was not fixed), and a first acknowledgement or metadata
    /// answer logs that the connection works again, which is what an operator who just fixed
    /// a secret waits for. Forgetting it silently would lose that line.
    pub(super) fn producer_replaced(&self) {
        if let Some(trouble) = self.lock().as_mut() {
            trouble.stale = true;
        }
    }

    /// The current problem and the reason librdkafka gave when it began.
    pub(super) fn problem(&self) -> Option<(ConnectionProblem, String)> {
        self.lock().as_ref().map(|t| (t.problem, t.reason.clone()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Trouble>> {
        self.problem.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RDKafkaErrorCode as C;

    #[test]
    fn error_codes_are_sorted_into_authentication_tls_and_unreachable() {
        use ConnectionProblem::*;
        assert_eq!(ConnectionProblem::of(C::Authentication), Authentication);
        assert_eq!(
            ConnectionProblem::of(C::SaslAuthenticationFailed),
            Authentication
        );
        assert_eq!(
            ConnectionProblem::of(C::UnsupportedSASLMechanism),
            Authentication
        );
        assert_eq!(ConnectionProblem::of(C::SSL), Tls);
        assert_eq!(
            ConnectionProblem::of(C::BrokerTransportFailure),
            Unreachable
        );
        assert_eq!(ConnectionProblem::of(C::AllBrokersDown), Unreachable);
        assert_eq!(ConnectionProblem::of(C::Resolve), Unreachable);
        assert_eq!(ConnectionProblem::of(C::Fatal), Other);
        assert_eq!(ConnectionProblem::of(C::MessageSizeTooLarge), Other);
    }

    #[test]
    fn a_transport_failure_that_names_tls_or_sasl_is_that() {
        use ConnectionProblem::*;
        let tls = "ssl://127.0.0.1:1/bootstrap: error:0A000086:SSL routines::certificate \
                   verify failed (after 1ms in state SSL_HANDSHAKE)";
        assert_eq!(
            ConnectionProblem::classify(C::BrokerTransportFailure, tls),
            Tls
        );
        let sasl = "sasl_plaintext://127.0.0.1:1/bootstrap: SASL authentication error";
        assert_eq!(
            ConnectionProblem::classify(C::BrokerTransportFailure, sasl),
            Authentication
        );
        let refused = "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: \
                       Connection refused (after 0ms in state CONNECT)";
        assert_eq!(
            ConnectionProblem::classify(C::BrokerTransportFailure, refused),
            Unreachable
        );
        // "All brokers down" is never more than that, whatever the text.
        assert_eq!(
            ConnectionProblem::classify(C::AllBrokersDown, "1/1 brokers are down"),
            Unreachable
        );
        let watch = ConnectionWatch::default();
        assert_eq!(watch.report(C::SSL, "handshake failed"), Reported::Changed);
        assert_eq!(watch.report(C::BrokerTransportFailure, tls), Reported::Same);
        assert_eq!(
            watch.report(C::BrokerTransportFailure, refused),
            Reported::Changed
        );
    }

    #[test]
    fn readiness_errors_name_the_cause() {
        let e = ConnectionProblem::Authentication.error("SASL authentication error");
        assert!(e.to_string().starts_with("authentication"), "{e}");
        assert!(matches!(e, SinkError::Authentication(_)));
        let e = ConnectionProblem::Tls.error("certificate verify failed");
        assert!(e.to_string().starts_with("TLS"), "{e}");
        let e = ConnectionProblem::Unreachable.error("Connection refused");
        assert!(matches!(e, SinkError::Unreachable { .. }), "{e}");
    }

    #[test]
    fn a_problem_is_reported_once_per_change_not_per_retry() {
        let watch = ConnectionWatch::default();
        assert_eq!(watch.report(C::Authentication, "bad"), Reported::Changed);
        assert_eq!(watch.report(C::Authentication, "bad again"), Reported::Same);
        // The brokers-down event after each failed attempt keeps the cause.
        assert_eq!(watch.report(C::AllBrokersDown, "1/1 down"), Reported::Same);
        let (problem, reason) = watch.problem().unwrap();
        assert_eq!(
            (problem, reason.as_str()),
            (ConnectionProblem::Authentication, "bad")
        );
        assert_eq!(watch.report(C::SSL, "handshake"), Reported::Changed);
        assert_eq!(watch.report(C::SSL, "handshake"), Reported::Same);
        assert_eq!(watch.report(C::Fatal, "other"), Reported::Other);
        assert_eq!(watch.problem().unwrap().0, ConnectionProblem::Tls);
        watch.works();
        assert_eq!(watch.problem(), None);
        // After recovery the same problem is news again.
        assert_eq!(watch.report(C::SSL, "handshake"), Reported::Changed);
    }

    #[test]
    fn a_problem_of_a_replaced_producer_is_reported_again_if_the_new_one_has_it() {
        let watch = ConnectionWatch::default();
        let code = RDKafkaErrorCode::Authentication;
        assert_eq!(
            watch.report(code, "SASL authentication error"),
            Reported::Changed
        );
        assert_eq!(
            watch.report(code, "SASL authentication error"),
            Reported::Same
        );
        watch.producer_replaced();
        // Readiness still names it until the new producer shows otherwise.
        assert_eq!(
            watch.problem().map(|(p, _)| p),
            Some(ConnectionProblem::Authentication)
        );
        assert_eq!(
            watch.report(code, "SASL authentication error"),
            Reported::Changed
        );
        assert_eq!(
            watch.report(code, "SASL authentication error"),
            Reported::Same
        );
    }

    #[test]
    fn a_replaced_producer_that_works_clears_the_problem() {
        let watch = ConnectionWatch::default();
        assert_eq!(watch.report(C::Authentication, "bad"), Reported::Changed);
        watch.producer_replaced();
        watch.works();
        assert_eq!(watch.problem(), None);
        assert!(!watch.troubled.load(Ordering::Acquire));
        // Replacing a producer that had no problem leaves none.
        watch.producer_replaced();
        assert_eq!(watch.problem(), None);
    }

    #[test]
    fn brokers_down_alone_means_unreachable() {
        let watch = ConnectionWatch::default();
        assert_eq!(
            watch.report(C::AllBrokersDown, "1/1 down"),
            Reported::Changed
        );
        assert_eq!(
            watch.report(C::BrokerTransportFailure, "refused"),
            Reported::Same
        );
        assert_eq!(watch.problem().unwrap().0, ConnectionProblem::Unreachable);
        assert_eq!(watch.report(C::Authentication, "bad"), Reported::Changed);
    }
}
