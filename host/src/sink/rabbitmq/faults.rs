//! Whose fault a failed publish is, from what RabbitMQ answered: a returned message (no queue
//! bound to the routing key: the tenant's), a nack, a channel the broker closed (its
//! reply code and text: a missing exchange is the operator's, a routing key the user may not
//! write to is the tenant's), or a connection that broke (nobody's). And what kind of trouble
//! a failed connection attempt is (credentials, TLS, or no answer).

use lapin::ErrorKind;
use lapin::protocol::{AMQPError, AMQPErrorKind, AMQPSoftError};

use crate::sink::{PublishFault, SinkError};

/// Reply code of a basic.return for a mandatory message no queue is bound for.
const NO_ROUTE: u16 = 312;

/// How a message's exchange is named in errors.
pub(super) fn exchange_name(exchange: &str) -> String {
    if exchange.is_empty() {
        "the default exchange".to_owned()
    } else {
        format!("exchange {exchange:?}")
    }
}

/// A message the broker returned (basic.return): routed nowhere. The tenant's fault.
pub(super) fn returned(topic: &str, exchange: &str, code: u16, text: &str) -> SinkError {
    let message = if code == NO_ROUTE {
        format!(
            "no queue is bound to routing key {topic:?} on {} (the broker returned the \
             message: {text}); bind a queue for it or route elsewhere, the row is retried",
            exchange_name(exchange)
        )
    } else {
        format!(
            "the broker returned the message from {} ({code} {text})",
            exchange_name(exchange)
        )
    };
    SinkError::publish_failed(topic, message, PublishFault::Refused)
}

/// A message the broker nacked: a queue could not take it (full with `overflow =
/// reject-publish`, or an internal error). The destination's state, not the message's: the
/// row waits without using up its attempts.
pub(super) fn nacked(topic: &str, exchange: &str) -> SinkError {
    SinkError::publish_failed(
        topic,
        format!(
            "the broker nacked the message on {} (a queue bound to it is full with \
             overflow = reject-publish, or failed); the row is retried",
            exchange_name(exchange)
        ),
        PublishFault::Unavailable,
    )
}

/// A message whose confirmation did not come within `rabbitmq.timeout`.
pub(super) fn timed_out(topic: &str, timeout: std::time::Duration) -> SinkError {
    SinkError::publish_failed(
        topic,
        format!(
            "the broker did not confirm the message within {} (rabbitmq.timeout); \
             the row is retried",
            humantime::format_duration(timeout)
        ),
        PublishFault::Unavailable,
    )
}

/// A message that failed with `error`. `cause` is the error that closed its channel when one
/// did (a later publish on a closed channel fails with a state error that no longer says
/// why); `body_len` tells a message too large from the others when the broker's limit closed
/// the channel.
pub(super) fn failed(
    topic: &str,
    exchange: &str,
    error: &lapin::Error,
    cause: Option<&AMQPError>,
    body_len: usize,
) -> SinkError {
    let closed_by = match error.kind() {
        ErrorKind::ProtocolError(e) => Some(e),
        ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidConnectionState(_) => cause,
        _ => None,
    };
    let Some(amqp) = closed_by else {
        return SinkError::publish_failed(
            topic,
            format!("the connection to the broker failed ({error}); the row is retried",),
            PublishFault::Unavailable,
        );
    };
    let (fault, why) = closed_channel_fault(amqp, topic, body_len);
    SinkError::publish_failed(
        topic,
        format!(
            "the broker closed the channel publishing to {}: {}{why}",
            exchange_name(exchange),
            amqp.get_message()
        ),
        fault,
    )
}

/// Whose fault a message is when the broker closed its channel (or the connection) with
/// `error`, and what to add to the text.
fn closed_channel_fault(
    error: &AMQPError,
    topic: &str,
    body_len: usize,
) -> (PublishFault, &'static str) {
    let text = error.get_message().as_str();
    match error.kind() {
        AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => (
            PublishFault::Unavailable,
            " (rabbitmq.exchange names an exchange the broker lacks: declare it; rows wait)",
        ),
        AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => match refused_topic(text) {
            Some(refused) if refused == topic => (
                PublishFault::Refused,
                " (the user may not write to this routing key)",
            ),
            Some(_) => (
                PublishFault::Unavailable,
                " (another message of the batch went to a routing key the user may not write \
                 to; the row is retried)",
            ),
            None => (
                PublishFault::Unavailable,
                " (the user in rabbitmq.url lacks permission on the exchange; rows wait)",
            ),
        },
        AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) => match broker_max_size(text) {
            Some(max) if body_len > max => (
                PublishFault::Refused,
                " (larger than the broker's max_message_size: lower rabbitmq.max_message_bytes \
                 to it)",
            ),
            Some(_) => (
                PublishFault::Unavailable,
                " (another message of the batch was too large)",
            ),
            None => (PublishFault::Failed, ""),
        },
        AMQPErrorKind::Soft(_) => (PublishFault::Failed, ""),
        // A connection the broker closed (forced, out of resources, shutting down).
        AMQPErrorKind::Hard(_) => (PublishFault::Unavailable, ""),
    }
}

/// The routing key a topic-permission refusal names: "ACCESS_REFUSED - access to topic 'KEY'
/// in exchange 'X' in vhost '/' refused for user 'U'" (RabbitMQ 3.10; checked against the
/// local broker with `rabbitmqctl set_topic_permissions`).
fn refused_topic(text: &str) -> Option<&str> {
    let start = text.find("access to topic '")? + "access to topic '".len();
    let end = text.rfind("' in exchange '")?;
    text.get(start..end)
}

/// The broker's limit a too-large message ran into: "PRECONDITION_FAILED - message size N is
/// larger than configured max size M".
fn broker_max_size(text: &str) -> Option<usize> {
    let at = text.find("max size ")? + "max size ".len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// What kind of trouble a failed connection attempt is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LinkProblem {
    /// The broker refused the credentials in `rabbitmq.url`, or the user's access to the
    /// vhost.
    Authentication,
    /// The TLS handshake failed.
    Tls,
    /// No connection, no answer, or a refusal that is not about credentials.
    Unreachable,
}

impl LinkProblem {
    /// The kind of a failed connection attempt.
    pub(super) fn of(error: &lapin::Error) -> Self {
        match error.kind() {
            ErrorKind::ProtocolError(e)
                if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)) =>
            {
                Self::Authentication
            }
            ErrorKind::AuthProviderError(_) => Self::Authentication,
            ErrorKind::IOError(e) if is_tls(&e.to_string()) => Self::Tls,
            _ => Self::Unreachable,
        }
    }

    /// The error a probe reports for this problem.
    pub(super) fn error(self, reason: String) -> SinkError {
        match self {
            Self::Authentication => SinkError::Authentication(reason),
            Self::Tls => SinkError::Tls(reason),
            Self::Unreachable => SinkError::Unreachable {
                reason,
                cause: None,
            },
        }
    }

    /// What an operator can do about it (appended to the log line).
    pub(super) fn hint(self) -> &'static str {
        match self {
            Self::Authentication => {
                "check the user and password in rabbitmq.url and the user's access to its \
                 vhost; rows wait until the broker accepts them (fix the secret, then SIGHUP)"
            }
            Self::Tls => {
                "check the amqps:// port and rabbitmq.ca_location against the broker's \
                 certificate; rows wait until the handshake succeeds"
            }
            Self::Unreachable => {
                "check the host and port in rabbitmq.url and the network; rows wait until the \
                 broker answers"
            }
        }
    }
}

/// Whether an I/O error's text is OpenSSL's (through native-tls) about the handshake.
fn is_tls(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    ["ssl", "tls", "certificate", "handshake"]
        .iter()
        .any(|word| lower.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amqp(code: u16, text: &str) -> AMQPError {
        AMQPError::from_id(code, text.into()).unwrap()
    }

    fn closed(code: u16, text: &str) -> lapin::Error {
        ErrorKind::ProtocolError(amqp(code, text)).into()
    }

    #[test]
    fn a_returned_message_is_the_tenants_fault_and_names_key_and_exchange() {
        let e = returned("orders", "outbox", 312, "NO_ROUTE");
        assert_eq!(e.fault(), Some(PublishFault::Refused));
        let text = e.to_string();
        assert!(
            text.contains("no queue is bound to routing key \"orders\" on exchange \"outbox\""),
            "{text}"
        );
        assert!(
            returned("q", "", 312, "NO_ROUTE")
                .to_string()
                .contains("default exchange")
        );
    }

    #[test]
    fn a_missing_exchange_is_unavailable_a_refused_routing_key_refused() {
        let fault = |e: &lapin::Error, topic, len| failed(topic, "x", e, None, len).fault();
        use PublishFault::*;
        let missing = closed(404, "NOT_FOUND - no exchange 'x' in vhost '/'");
        assert_eq!(fault(&missing, "t", 1), Some(Unavailable));
        let topic = closed(
            403,
            "ACCESS_REFUSED - access to topic 'a.b' in exchange 'x' in vhost '/' refused \
             for user 'u'",
        );
        assert_eq!(fault(&topic, "a.b", 1), Some(Refused));
        assert_eq!(fault(&topic, "other", 1), Some(Unavailable));
        let exchange = closed(
            403,
            "ACCESS_REFUSED - access to exchange 'x' in vhost '/' refused for user 'u'",
        );
        assert_eq!(fault(&exchange, "t", 1), Some(Unavailable));
        let large = closed(
            406,
            "PRECONDITION_FAILED - message size 200 is larger than configured max size 100",
        );
        assert_eq!(fault(&large, "t", 200), Some(Refused));
        assert_eq!(fault(&large, "t", 50), Some(Unavailable));
        assert_eq!(
            fault(&closed(406, "PRECONDITION_FAILED - x"), "t", 1),
            Some(Failed)
        );
        assert_eq!(
            fault(&closed(320, "CONNECTION_FORCED"), "t", 1),
            Some(Unavailable)
        );
        let io: lapin::Error = std::io::Error::other("reset").into();
        assert_eq!(fault(&io, "t", 1), Some(Unavailable));
    }

    #[test]
    fn a_publish_on_a_closed_channel_takes_the_reason_that_closed_it() {
        let state: lapin::Error =
            ErrorKind::InvalidChannelState(lapin::ChannelState::Closed, "basic.publish").into();
        let why = amqp(404, "NOT_FOUND - no exchange 'x' in vhost '/'");
        let e = failed("t", "x", &state, Some(&why), 1);
        assert_eq!(e.fault(), Some(PublishFault::Unavailable));
        assert!(e.to_string().contains("no exchange 'x'"), "{e}");
        let e = failed("t", "x", &state, None, 1);
        assert_eq!(e.fault(), Some(PublishFault::Unavailable));
    }

    #[test]
    fn connection_failures_are_told_apart() {
        let login = closed(403, "ACCESS_REFUSED - Login was refused");
        assert_eq!(LinkProblem::of(&login), LinkProblem::Authentication);
        let tls: lapin::Error =
            std::io::Error::other("error:0A000086:SSL routines::certificate verify failed").into();
        assert_eq!(LinkProblem::of(&tls), LinkProblem::Tls);
        let refused: lapin::Error =
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert_eq!(LinkProblem::of(&refused), LinkProblem::Unreachable);
        assert!(matches!(
            LinkProblem::Authentication.error("x".into()),
            SinkError::Authentication(_)
        ));
    }
}
