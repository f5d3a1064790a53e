//! Whose fault a failed send is, from librdkafka's error codes: the broker's (retry later,
//! nobody's fault), the sender's (a missing topic, a message too large), or the message's.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::sink::PublishFault;

/// Whose fault a failed send is (see [`PublishFault`]).
pub(super) fn fault_of(error: &KafkaError) -> PublishFault {
    match error.rdkafka_error_code() {
        Some(code) if is_unavailable(code) => PublishFault::Unavailable,
        Some(code) if is_refused(code) => PublishFault::Refused,
        _ => PublishFault::Failed,
    }
}

/// Errors of the broker or the connection rather than of the message: retrying the row later
/// is all there is to do, and the failure must not count against it.
fn is_unavailable(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode::*;
    matches!(
        code,
        MessageTimedOut
            | AllBrokersDown
            | BrokerTransportFailure
            | OperationTimedOut
            | QueueFull
            | Retry
            | LeaderNotAvailable
            | NotLeaderForPartition
            | RequestTimedOut
            | NetworkException
            | NotEnoughReplicas
            | NotEnoughReplicasAfterAppend
            | KafkaStorageError
            | Fatal
            | OutOfOrderSequenceNumber
            | InvalidProducerEpoch
            | UnknownProducerId
            | ProducerFenced
    )
}

/// Refusals of the message for a reason of its sender's making: where the plugin routed it,
/// or what it put in it.
fn is_refused(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode::*;
    is_unknown_topic(code)
        || matches!(
            code,
            UnknownPartition | MessageSizeTooLarge | TopicAuthorizationFailed | InvalidTopic
        )
}

pub(super) fn is_unknown_topic(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::UnknownTopic | RDKafkaErrorCode::UnknownTopicOrPartition
    )
}

/// Errors after which the idempotent producer's state is unusable.
pub(super) fn producer_is_broken(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode::*;
    matches!(
        code,
        Fatal
            | ProducerFenced
            | InvalidProducerEpoch
            | OutOfOrderSequenceNumber
            | UnknownProducerId
    )
}
