//! What publishing records: messages and bytes the broker acknowledged per tenant and topic,
//! the messages it did not, how long a batch waited for its reports, the producer's queue,
//! and each row's time from creation to its last acknowledged message.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::{HistogramFamily, TenantLabel, label_values, latency_histogram};
use crate::model::Broker;

/// Distinct `topic` label values kept; more topics share [`OTHER_TOPICS`]. Topics are bounded
/// by the allow-lists, but a plugin without one may route to many.
const MAX_TOPICS: usize = 256;
/// The `topic` label value of topics past [`MAX_TOPICS`].
pub(crate) const OTHER_TOPICS: &str = "_other";

label_values! {
    /// The `error_type` label values of `sluice_produce_errors_total`: whose fault a message
    /// the broker did not acknowledge is.
    pub enum ProduceError {
        Unavailable => "unavailable",
        Refused => "refused",
        Failed => "failed",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantTopic {
    tenant: Arc<str>,
    broker: &'static str,
    topic: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicError {
    broker: &'static str,
    topic: Arc<str>,
    error_type: ProduceError,
}

fn end_to_end_histogram() -> Histogram {
    // 5 ms .. ~1.5 h: a row may wait out retries.
    Histogram::new(exponential_buckets(0.005, 3.0, 15))
}

/// The publishing families. Series appear with their first message: topics are only known
/// then.
#[derive(Debug)]
pub struct SinkMetrics {
    topics: Mutex<HashMap<String, Arc<str>>>,
    messages_produced: Family<TenantTopic, Counter>,
    produced_bytes: Family<TenantTopic, Counter>,
    produce_errors: Family<TopicError, Counter>,
    produce_duration: Histogram,
    producer_queue: Gauge,
    end_to_end: HistogramFamily<TenantLabel>,
    last_publish: Family<TenantLabel, Gauge<f64, AtomicU64>>,
}

impl Default for SinkMetrics {
    fn default() -> Self {
        Self {
            topics: Mutex::default(),
            messages_produced: Family::default(),
            produced_bytes: Family::default(),
            produce_errors: Family::default(),
            produce_duration: latency_histogram(),
            producer_queue: Gauge::default(),
            end_to_end: Family::new_with_constructor(end_to_end_histogram),
            last_publish: Family::default(),
        }
    }
}

impl SinkMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "messages_produced",
            "Messages acknowledged by the broker, by tenant, broker and topic",
            self.messages_produced.clone(),
        );
        r.register_with_unit(
            "produced",
            "Payload and key bytes of acknowledged messages, by tenant, broker and topic",
            Unit::Bytes,
            self.produced_bytes.clone(),
        );
        r.register(
            "produce_errors",
            "Messages the broker did not acknowledge, by broker, topic and error type (unavailable, refused, failed)",
            self.produce_errors.clone(),
        );
        r.register_with_unit(
            "produce_duration",
            "Time from sending a batch's messages to the last delivery report",
            Unit::Seconds,
            self.produce_duration.clone(),
        );
        r.register(
            "producer_queue_messages",
            "Messages in the producer's queues, not yet acknowledged (librdkafka statistics msg_cnt)",
            self.producer_queue.clone(),
        );
        r.register_with_unit(
            "end_to_end_latency",
            "Row created (its created_at) to its last message acknowledged, by tenant",
            Unit::Seconds,
            self.end_to_end.clone(),
        );
        r.register_with_unit(
            "last_publish_timestamp",
            "Unix time of the last acknowledged message, by tenant",
            Unit::Seconds,
            self.last_publish.clone(),
        );
    }

    /// The label value of `topic`: itself, or [`OTHER_TOPICS`] once [`MAX_TOPICS`] are known.
    fn topic(&self, topic: &str) -> Arc<str> {
        let mut topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(label) = topics.get(topic) {
            return Arc::clone(label);
        }
        if topics.len() >= MAX_TOPICS {
            return Arc::from(OTHER_TOPICS);
        }
        let label: Arc<str> = Arc::from(topic);
        topics.insert(topic.to_owned(), Arc::clone(&label));
        label
    }

    /// `messages` acknowledged messages of `tenant` to `topic` on `broker`, `bytes` in all.
    pub fn produced(
        &self,
        tenant: &Arc<str>,
        broker: Broker,
        topic: &str,
        messages: u64,
        bytes: u64,
    ) {
        let labels = TenantTopic {
            tenant: Arc::clone(tenant),
            broker: broker.as_str(),
            topic: self.topic(topic),
        };
        self.messages_produced
            .get_or_create(&labels)
            .inc_by(messages);
        self.produced_bytes.get_or_create(&labels).inc_by(bytes);
    }

    pub fn produce_errors(
        &self,
        broker: Broker,
        topic: &str,
        error_type: ProduceError,
        messages: u64,
    ) {
        self.produce_errors
            .get_or_create(&TopicError {
                broker: broker.as_str(),
                topic: self.topic(topic),
                error_type,
            })
            .inc_by(messages);
    }

    /// A batch's messages were all reported on `took` after they were sent.
    pub fn published(&self, took: Duration) {
        self.produce_duration.observe(took.as_secs_f64());
    }

    /// Messages in the producer's queues, from librdkafka's statistics.
    pub fn set_producer_queue(&self, messages: u64) {
        self.producer_queue
            .set(i64::try_from(messages).unwrap_or(i64::MAX));
    }

    /// End-to-end latencies of one tenant's rows: one label look-up for all of them.
    pub fn end_to_end(&self, tenant: &Arc<str>, seconds: impl IntoIterator<Item = f64>) {
        let histogram = self.end_to_end.get_or_create_owned(&TenantLabel {
            tenant: Arc::clone(tenant),
        });
        for s in seconds {
            histogram.observe(s.max(0.0));
        }
    }

    /// Removes every series of the label value `tenant`.
    pub(super) fn forget_tenant(&self, tenant: &Arc<str>) {
        let topics: Vec<Arc<str>> = {
            let topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
            topics.values().cloned().collect()
        };
        for topic in topics.into_iter().chain([Arc::from(OTHER_TOPICS)]) {
            for broker in Broker::ALL {
                let labels = TenantTopic {
                    tenant: Arc::clone(tenant),
                    broker: broker.as_str(),
                    topic: Arc::clone(&topic),
                };
                self.messages_produced.remove(&labels);
                self.produced_bytes.remove(&labels);
            }
        }
        let labels = TenantLabel {
            tenant: Arc::clone(tenant),
        };
        self.end_to_end.remove(&labels);
        self.last_publish.remove(&labels);
    }

    pub fn last_publish(&self, tenant: &Arc<str>, unix_seconds: f64) {
        self.last_publish
            .get_or_create(&TenantLabel {
                tenant: Arc::clone(tenant),
            })
            .set(unix_seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_past_the_cap_share_one_label_value() {
        let m = SinkMetrics::default();
        for i in 0..MAX_TOPICS + 10 {
            assert_ne!(&*m.topic(&format!("t{i}")), "", "topic {i}");
        }
        assert_eq!(&*m.topic("one-more"), OTHER_TOPICS);
        assert_eq!(&*m.topic("t1"), "t1");
    }
}
