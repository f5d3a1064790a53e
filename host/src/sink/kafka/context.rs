//! The producer's client context: where librdkafka's delivery reports, statistics, error
//! events and log lines go.

use std::sync::Arc;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, ProducerContext};
use rdkafka::statistics::Statistics;

use crate::sink::Delivered;
use crate::sink::connection::ConnectionWatch;
use crate::sink::deliveries::{Deliveries, Opaque};
use crate::telemetry::Metrics;

/// The producer's client context: delivery reports go to the batch waiting for them;
/// librdkafka's log lines go to `tracing` as by default; its statistics (emitted only when
/// `statistics.interval.ms` is set, i.e. with metrics on) set `sluice_producer_queue_messages`;
/// its error events (authentication, TLS, unreachable broker) set the connection state, which
/// is logged once per change and named by the sink's readiness probe ([`Sink::probe`]).
#[derive(Clone, Default)]
pub(super) struct SinkContext {
    pub(super) metrics: Option<Arc<Metrics>>,
    pub(super) deliveries: Arc<Deliveries>,
    pub(super) connection: Arc<ConnectionWatch>,
}

impl ClientContext for SinkContext {
    fn stats(&self, statistics: Statistics) {
        if let Some(m) = &self.metrics {
            m.sink.set_producer_queue(statistics.msg_cnt);
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(code) => {
                self.connection.report(code, reason);
            }
            None => tracing::error!(target: "librdkafka", "librdkafka: {error}: {reason}"),
        }
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        use RDKafkaLogLevel::*;
        match level {
            // A broker connection failing at error level ("FAIL") also arrives as an error
            // event, which `error` logs once per change of state; logging each retry's line
            // too would repeat it every few seconds.
            Emerg | Alert | Critical | Error if fac == "FAIL" => {
                tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}")
            }
            Emerg | Alert | Critical | Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {fac} {message}")
            }
            Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {message}"),
            Notice | Info => tracing::info!(target: "librdkafka", "librdkafka: {fac} {message}"),
            Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}"),
        }
    }
}

#[cfg(test)]
impl SinkContext {
    /// No batch is waiting for reports (none left behind).
    pub(super) fn deliveries_idle(&self) -> bool {
        self.deliveries.is_idle()
    }
}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = Opaque;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Opaque) {
        let report = match result {
            Ok(message) => {
                // An acknowledgement: whatever was wrong with the connection is over.
                self.connection.works();
                Ok(delivered(message.partition(), message.offset()))
            }
            Err((e, _)) => Err(e.clone()),
        };
        self.deliveries.file(opaque, report);
    }
}

/// Where the broker stored a message, from its delivery report. librdkafka reports a negative
/// offset when it does not know one (`acks=0`): that is no position.
fn delivered(partition: i32, offset: i64) -> Delivered {
    Delivered {
        partition: Some(partition),
        offset: (offset >= 0).then_some(offset),
    }
}
