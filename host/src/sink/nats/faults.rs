//! Whose fault a failed JetStream publish is: the connection's or the server's (retry later,
//! nobody's fault), the sender's (no stream for the subject, a message too large, a subject it
//! may not publish to), or the message's. Each failure's text says what is wrong, naming the
//! subject.

use std::time::Duration;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};

use crate::sink::{PublishFault, SinkError};

/// A publish that never reached the client's connection (`send_publish` failed).
pub(super) fn send_failed(subject: &str, error: &PublishError) -> SinkError {
    let (fault, message) = match error.kind() {
        PublishErrorKind::MaxPayloadExceeded => (
            PublishFault::Refused,
            format!(
                "the message is larger than the server accepts ({error}); NATS limits body \
                 and headers together to the server's max_payload"
            ),
        ),
        PublishErrorKind::TimedOut => (
            PublishFault::Unavailable,
            "the client could not take the message in time (its queue to the server is full)"
                .to_owned(),
        ),
        _ => (
            PublishFault::Unavailable,
            format!("the client could not send the message: {error}"),
        ),
    };
    SinkError::publish_failed(subject, message, fault)
}

/// JetStream's answer to a publish was not an acknowledgement. `jetstream_enabled`: whether
/// the server said it runs JetStream (without it, no subject has a stream).
pub(super) fn ack_failed(
    subject: &str,
    error: &PublishError,
    jetstream_enabled: bool,
) -> SinkError {
    let (fault, message) = match error.kind() {
        PublishErrorKind::StreamNotFound if jetstream_enabled => (
            PublishFault::Refused,
            format!(
                "no JetStream stream captures subject {subject} (the server answered \"no \
                 responders\"); add the subject to a stream, the row is retried"
            ),
        ),
        PublishErrorKind::StreamNotFound => (
            PublishFault::Unavailable,
            "JetStream is not enabled on the server (it answered \"no responders\"); start \
             it with JetStream, rows wait"
                .to_owned(),
        ),
        PublishErrorKind::TimedOut => (
            PublishFault::Unavailable,
            "JetStream did not acknowledge the message in time".to_owned(),
        ),
        PublishErrorKind::BrokenPipe => (
            PublishFault::Unavailable,
            "the connection closed before JetStream acknowledged the message".to_owned(),
        ),
        PublishErrorKind::MaxPayloadExceeded => (
            PublishFault::Refused,
            format!("the message is larger than the server accepts ({error})"),
        ),
        PublishErrorKind::MaxAckPending => (
            PublishFault::Unavailable,
            "too many publishes wait for acknowledgements".to_owned(),
        ),
        PublishErrorKind::Other => api_error(error),
        PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence => (
            PublishFault::Failed,
            format!("JetStream refused the message: {error}"),
        ),
    };
    SinkError::publish_failed(subject, message, fault)
}

/// A JetStream API error in place of an acknowledgement, by its error code.
fn api_error(error: &PublishError) -> (PublishFault, String) {
    let api = std::error::Error::source(error)
        .and_then(|e| e.downcast_ref::<async_nats::jetstream::Error>());
    let Some(api) = api else {
        return (
            PublishFault::Failed,
            format!("JetStream's answer was not an acknowledgement: {error}"),
        );
    };
    let code = api.error_code();
    let fault = if code == ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM {
        PublishFault::Refused
    } else if is_unavailable(code) || api.code() == 503 {
        PublishFault::Unavailable
    } else {
        PublishFault::Failed
    };
    let hint = if fault == PublishFault::Refused {
        " (the stream's max_msg_size)"
    } else {
        ""
    };
    (fault, format!("JetStream refused the message{hint}: {api}"))
}

/// Errors of the server or its storage rather than of the message: the stream is full
/// (`discard: new`), resources are exhausted, the cluster has no leader.
fn is_unavailable(code: ErrorCode) -> bool {
    [
        ErrorCode::STREAM_STORE_FAILED,
        ErrorCode::INSUFFICIENT_RESOURCES,
        ErrorCode::STORAGE_RESOURCES_EXCEEDED,
        ErrorCode::MEMORY_RESOURCES_EXCEEDED,
        ErrorCode::ACCOUNT_RESOURCES_EXCEEDED,
        ErrorCode::CLUSTER_NOT_AVAILABLE,
        ErrorCode::CLUSTER_NOT_LEADER,
        ErrorCode::CLUSTER_NOT_ACTIVE,
        ErrorCode::CLUSTER_NO_PEERS,
        ErrorCode::JETSTREAM_NOT_ENABLED,
        ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
    ]
    .contains(&code)
}

/// The batch gave up waiting: not sent, or sent and not acknowledged within `timeout`.
pub(super) fn timed_out(subject: &str, sent: bool, timeout: Duration) -> SinkError {
    let message = if sent {
        format!("JetStream did not acknowledge the message within nats.timeout ({timeout:?})")
    } else {
        format!(
            "not sent within nats.timeout ({timeout:?}): the client is not connected or its queue is full"
        )
    };
    SinkError::publish_failed(subject, message, PublishFault::Unavailable)
}

/// The connection was lost while the message waited for its acknowledgement.
pub(super) fn connection_lost(subject: &str) -> SinkError {
    SinkError::publish_failed(
        subject,
        "the connection to the server was lost before JetStream acknowledged the message \
         (it may be stored: the Nats-Msg-Id lets the stream drop it when it is sent again)",
        PublishFault::Unavailable,
    )
}

/// The server refused the publish: the credentials may not publish to `subject`.
pub(super) fn permission_denied(subject: &str) -> SinkError {
    SinkError::publish_failed(
        subject,
        format!(
            "the server refused publishing to subject {subject} (permissions violation): \
             the credentials of [nats] may not publish to it"
        ),
        PublishFault::Refused,
    )
}

/// The message was not sent: an earlier message of the batch could not be, and later ones
/// would overtake it.
pub(super) fn not_sent_after(subject: &str, earlier: &SinkError) -> SinkError {
    SinkError::publish_failed(
        subject,
        format!("not sent: an earlier message of the batch could not be ({earlier})"),
        PublishFault::Unavailable,
    )
}

/// Not connected when the batch began, nor within its timeout.
pub(super) fn not_connected(subject: &str, why: Option<&str>, timeout: Duration) -> SinkError {
    let why = why.map_or_else(|| "still connecting".to_owned(), str::to_owned);
    SinkError::publish_failed(
        subject,
        format!("not connected to the NATS server within nats.timeout ({timeout:?}): {why}"),
        PublishFault::Unavailable,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_the_servers_the_senders_or_the_messages() {
        let fault = |kind| ack_failed("a.b", &PublishError::new(kind), true).fault();
        use PublishFault::*;
        assert_eq!(fault(PublishErrorKind::StreamNotFound), Some(Refused));
        assert_eq!(fault(PublishErrorKind::TimedOut), Some(Unavailable));
        assert_eq!(fault(PublishErrorKind::BrokenPipe), Some(Unavailable));
        assert_eq!(fault(PublishErrorKind::MaxPayloadExceeded), Some(Refused));
        assert_eq!(fault(PublishErrorKind::WrongLastSequence), Some(Failed));
        assert_eq!(fault(PublishErrorKind::Other), Some(Failed));
        let off = ack_failed(
            "a.b",
            &PublishError::new(PublishErrorKind::StreamNotFound),
            false,
        );
        assert_eq!(off.fault(), Some(Unavailable));
        let e = ack_failed(
            "a.b",
            &PublishError::new(PublishErrorKind::StreamNotFound),
            true,
        );
        assert!(
            e.to_string()
                .contains("no JetStream stream captures subject a.b"),
            "{e}"
        );
        let sent = send_failed(
            "a.b",
            &PublishError::new(PublishErrorKind::MaxPayloadExceeded),
        );
        assert_eq!(sent.fault(), Some(Refused));
        assert!(is_unavailable(ErrorCode::STREAM_STORE_FAILED));
        assert!(!is_unavailable(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM));
    }
}
