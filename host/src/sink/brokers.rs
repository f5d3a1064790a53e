//! Several brokers behind the one [`Sink`] the relay publishes through: each message goes to
//! the sink of its `broker` (its tenant's plugin section's), the brokers of one batch side by
//! side, and the results come back in the batch's order. The relay loop knows nothing of
//! brokers; a new broker is a sink folder, a settings section, and one arm in
//! [`BrokerSettings`] and [`connect`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, join_all};

use super::{
    Delivered, KafkaSink, NatsSettings, NatsSink, PublishFault, RabbitmqSettings, RabbitmqSink,
    RedisSettings, RedisSink, Sink, SinkError,
};
use crate::model::{Broker, OutboundMessage};
use crate::telemetry::Metrics;

/// One configured broker's settings, as the sink connecting to it takes them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum BrokerSettings {
    /// `[kafka]`'s librdkafka properties, credentials exposed.
    Kafka(BTreeMap<String, String>),
    Nats(NatsSettings),
    Rabbitmq(RabbitmqSettings),
    Redis(RedisSettings),
}

impl BrokerSettings {
    pub(crate) fn broker(&self) -> Broker {
        match self {
            Self::Kafka(_) => Broker::Kafka,
            Self::Nats(_) => Broker::Nats,
            Self::Rabbitmq(_) => Broker::Rabbitmq,
            Self::Redis(_) => Broker::Redis,
        }
    }
}

/// What the relay needs of one broker's sink, object-safe so [`Brokers`] can hold any.
pub(crate) trait BrokerSink: Send + Sync + 'static {
    fn publish_boxed<'a>(
        &'a self,
        messages: &'a [OutboundMessage],
    ) -> BoxFuture<'a, Vec<Result<Delivered, SinkError>>>;

    /// See [`Sink::flush`] (blocking).
    fn flush(&self, timeout: Duration) -> Result<(), SinkError>;

    /// See [`Sink::probe`] (blocking).
    fn probe(&self, timeout: Duration) -> Result<(), SinkError>;

    /// New settings for the same broker (rotated credentials): later batches use them,
    /// batches in flight finish as they started; settings that do not work keep the old ones.
    /// Blocking: call it off the async reactor.
    fn reconfigure(&self, settings: &BrokerSettings) -> Result<(), SinkError>;
}

/// The sink of every broker the configuration has a section for.
pub(crate) struct Brokers {
    sinks: BTreeMap<Broker, Arc<dyn BrokerSink>>,
}

/// Connects the sink of `settings`' broker. Blocking (librdkafka starts its threads; the
/// others connect in the background of `runtime`): call it off the async reactor.
pub(crate) fn connect(
    settings: &BrokerSettings,
    metrics: Option<(Arc<Metrics>, Duration)>,
    runtime: &tokio::runtime::Handle,
) -> Result<Arc<dyn BrokerSink>, SinkError> {
    Ok(match settings {
        BrokerSettings::Kafka(properties) => Arc::new(match metrics {
            // Statistics only with metrics on: librdkafka computes them for nothing otherwise.
            Some((metrics, interval)) => KafkaSink::with_metrics(properties, metrics, interval)?,
            None => KafkaSink::new(properties)?,
        }),
        BrokerSettings::Nats(s) => Arc::new(runtime.block_on(NatsSink::connect(s))?),
        BrokerSettings::Rabbitmq(s) => Arc::new(runtime.block_on(RabbitmqSink::connect(s))?),
        BrokerSettings::Redis(s) => Arc::new(runtime.block_on(RedisSink::connect(s))?),
    })
}

impl Brokers {
    /// A sink per configured broker (see [`connect`]). Blocking: call it off the reactor.
    pub(crate) fn connect_all(
        settings: &[BrokerSettings],
        metrics: Option<(Arc<Metrics>, Duration)>,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Self, SinkError> {
        let mut sinks = BTreeMap::new();
        for s in settings {
            sinks.insert(s.broker(), connect(s, metrics.clone(), runtime)?);
        }
        Ok(Self { sinks })
    }

    /// Brokers from sinks already connected (see [`connect`]).
    pub(crate) fn of_connected(
        sinks: impl IntoIterator<Item = (Broker, Arc<dyn BrokerSink>)>,
    ) -> Self {
        Self {
            sinks: sinks.into_iter().collect(),
        }
    }

    /// The brokers this relay publishes to.
    pub(crate) fn brokers(&self) -> impl Iterator<Item = Broker> + '_ {
        self.sinks.keys().copied()
    }

    /// Each broker's readiness (see [`Sink::probe`]), probed side by side so one silent
    /// broker does not delay the others' answers. Blocking: call it off the reactor.
    pub(crate) fn probes(&self, timeout: Duration) -> Vec<(Broker, Result<(), SinkError>)> {
        std::thread::scope(|scope| {
            let probing: Vec<_> = self
                .sinks
                .iter()
                .map(|(broker, sink)| (*broker, scope.spawn(move || sink.probe(timeout))))
                .collect();
            probing
                .into_iter()
                .map(|(broker, probe)| {
                    let result = probe.join().unwrap_or_else(|_| {
                        Err(SinkError::Unreachable {
                            reason: format!("the {broker} readiness check panicked"),
                            cause: None,
                        })
                    });
                    (broker, result)
                })
                .collect()
        })
    }

    /// Hands `settings` to its broker's sink (see [`BrokerSink::reconfigure`]); a broker
    /// without a sink is not started by a reload (its section was read at start).
    pub(crate) fn reconfigure(&self, settings: &BrokerSettings) -> Result<(), SinkError> {
        match self.sinks.get(&settings.broker()) {
            Some(sink) => sink.reconfigure(settings),
            None => Ok(()),
        }
    }
}

impl Sink for Brokers {
    async fn publish(&self, messages: &[OutboundMessage]) -> Vec<Result<Delivered, SinkError>> {
        // Most batches go to one broker: no regrouping then.
        if let Some(first) = messages.first()
            && messages.iter().all(|m| m.broker == first.broker)
        {
            return match self.sinks.get(&first.broker) {
                Some(sink) => sink.publish_boxed(messages).await,
                None => messages.iter().map(no_sink).collect(),
            };
        }
        let mut groups: BTreeMap<Broker, (Vec<usize>, Vec<OutboundMessage>)> = BTreeMap::new();
        for (index, m) in messages.iter().enumerate() {
            let group = groups.entry(m.broker).or_default();
            group.0.push(index);
            group.1.push(m.clone());
        }
        // Each is overwritten below: every message is in exactly one group.
        let mut results: Vec<Result<Delivered, SinkError>> =
            messages.iter().map(|_| Ok(Delivered::default())).collect();
        let published = join_all(groups.iter().map(|(broker, (_, group))| async move {
            match self.sinks.get(broker) {
                Some(sink) => sink.publish_boxed(group).await,
                None => group.iter().map(no_sink).collect(),
            }
        }))
        .await;
        for ((_, (indices, _)), outcome) in groups.iter().zip(published) {
            for (index, result) in indices.iter().zip(outcome) {
                results[*index] = result;
            }
        }
        results
    }

    fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        // Every broker gets its flush even when one fails; the first failure is reported.
        let mut first = Ok(());
        for sink in self.sinks.values() {
            let flushed = sink.flush(timeout);
            if first.is_ok() {
                first = flushed;
            }
        }
        first
    }

    fn probe(&self, timeout: Duration) -> Result<(), SinkError> {
        self.probes(timeout)
            .into_iter()
            .map(|(_, r)| r)
            .find(Result::is_err)
            .unwrap_or(Ok(()))
    }
}

/// A message to a broker the relay has no section for (configuration checks refuse such a
/// tenant, so only a broken invariant gets here): the tenant's setting, so `Refused`.
fn no_sink(m: &OutboundMessage) -> Result<Delivered, SinkError> {
    Err(SinkError::publish_failed(
        &m.topic,
        format!(
            "the tenant's broker is {0}, and this relay has no [{0}] section",
            m.broker
        ),
        PublishFault::Refused,
    ))
}

/// Every broker's sink is a [`BrokerSink`] through its own [`Sink`] implementation and a
/// `reconfigure` of its own settings type (`$reconfigure`: how, given the sink and them).
macro_rules! broker_sink {
    ($sink:ty, $variant:ident, $reconfigure:expr) => {
        impl BrokerSink for $sink {
            fn publish_boxed<'a>(
                &'a self,
                messages: &'a [OutboundMessage],
            ) -> BoxFuture<'a, Vec<Result<Delivered, SinkError>>> {
                Box::pin(Sink::publish(self, messages))
            }

            fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
                Sink::flush(self, timeout)
            }

            fn probe(&self, timeout: Duration) -> Result<(), SinkError> {
                Sink::probe(self, timeout)
            }

            fn reconfigure(&self, settings: &BrokerSettings) -> Result<(), SinkError> {
                match settings {
                    BrokerSettings::$variant(s) => $reconfigure(self, s),
                    other => Err(SinkError::Settings {
                        broker: other.broker(),
                        reason: format!("not the settings of the {} sink", Broker::$variant),
                    }),
                }
            }
        }
    };
}

broker_sink!(KafkaSink, Kafka, |sink: &KafkaSink, s| sink.reconfigure(s));
broker_sink!(NatsSink, Nats, |sink: &NatsSink, s| block_on(
    Broker::Nats,
    sink.reconfigure(s)
));
broker_sink!(RabbitmqSink, Rabbitmq, |sink: &RabbitmqSink, s| block_on(
    Broker::Rabbitmq,
    sink.reconfigure(s)
));
broker_sink!(RedisSink, Redis, |sink: &RedisSink, s| block_on(
    Broker::Redis,
    sink.reconfigure(s)
));

/// Runs an async sink's `reconfigure` to completion on the blocking thread the caller is on
/// (inside the relay's runtime).
fn block_on(
    broker: Broker,
    reconfiguring: impl std::future::Future<Output = Result<(), SinkError>>,
) -> Result<(), SinkError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| SinkError::Settings {
        broker,
        reason: "reconfigured outside the relay's runtime".to_owned(),
    })?;
    runtime.block_on(reconfiguring)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::model::OutboxId;

    /// A broker that records what it got and fails messages whose topic starts with `bad`;
    /// the others are delivered at their place in what it got.
    #[derive(Default)]
    struct Recording {
        got: Mutex<Vec<Vec<String>>>,
    }

    impl BrokerSink for Recording {
        fn publish_boxed<'a>(
            &'a self,
            messages: &'a [OutboundMessage],
        ) -> BoxFuture<'a, Vec<Result<Delivered, SinkError>>> {
            Box::pin(async move {
                self.got
                    .lock()
                    .unwrap()
                    .push(messages.iter().map(|m| m.topic.clone()).collect());
                messages
                    .iter()
                    .zip(0..)
                    .map(|(m, at)| match m.topic.starts_with("bad") {
                        true => Err(SinkError::publish_failed(
                            &m.topic,
                            "scripted",
                            PublishFault::Failed,
                        )),
                        false => Ok(Delivered {
                            partition: None,
                            offset: Some(at),
                        }),
                    })
                    .collect()
            })
        }

        fn flush(&self, _timeout: Duration) -> Result<(), SinkError> {
            Ok(())
        }

        fn probe(&self, _timeout: Duration) -> Result<(), SinkError> {
            Err(SinkError::Unreachable {
                reason: "scripted".into(),
                cause: None,
            })
        }

        fn reconfigure(&self, _settings: &BrokerSettings) -> Result<(), SinkError> {
            Ok(())
        }
    }

    fn message(row: i64, broker: Broker, topic: &str) -> OutboundMessage {
        OutboundMessage {
            row: OutboxId::Int(row),
            broker,
            topic: topic.to_owned(),
            key: None,
            payload: Some(Vec::new()),
            headers: Vec::new(),
            partition: None,
            encoding: None,
            value_record: None,
            key_record: None,
            timestamp_ms: None,
        }
    }

    #[tokio::test]
    async fn a_mixed_batch_goes_to_each_broker_in_order_and_results_come_back_in_place() {
        let kafka = Arc::new(Recording::default());
        let nats = Arc::new(Recording::default());
        let brokers = Brokers::of_connected([
            (Broker::Kafka, Arc::clone(&kafka) as Arc<dyn BrokerSink>),
            (Broker::Nats, Arc::clone(&nats) as Arc<dyn BrokerSink>),
        ]);
        let batch = vec![
            message(1, Broker::Nats, "n1"),
            message(1, Broker::Kafka, "k1"),
            message(2, Broker::Nats, "bad.n2"),
            message(3, Broker::Redis, "r3"),
            message(4, Broker::Kafka, "bad.k4"),
            message(5, Broker::Nats, "n5"),
        ];
        let results = brokers.publish(&batch).await;
        let failed: Vec<bool> = results.iter().map(Result::is_err).collect();
        assert_eq!(failed, [false, false, true, true, true, false]);
        // Each message's report, not its neighbour's: n5 was third of what NATS got.
        let offsets: Vec<Option<i64>> = results
            .iter()
            .map(|r| r.as_ref().ok().and_then(|d| d.offset))
            .collect();
        assert_eq!(offsets, [Some(0), Some(0), None, None, None, Some(2)]);
        // A broker without a section: the tenant's setting, so its fault.
        let no_sink = results[3].as_ref().unwrap_err();
        assert_eq!(no_sink.fault(), Some(PublishFault::Refused));
        assert!(
            no_sink.to_string().contains("no [redis] section"),
            "{no_sink}"
        );
        assert_eq!(*kafka.got.lock().unwrap(), [vec!["k1", "bad.k4"]]);
        assert_eq!(*nats.got.lock().unwrap(), [vec!["n1", "bad.n2", "n5"]]);
        // One broker only: handed over as it is.
        let results = brokers.publish(&batch[..1]).await;
        assert!(results[0].is_ok());
        assert_eq!(nats.got.lock().unwrap().len(), 2);
        // Each broker probed, each answer kept.
        let probes = brokers.probes(Duration::from_millis(10));
        let probed: Vec<Broker> = probes.iter().map(|(b, _)| *b).collect();
        assert_eq!(probed, [Broker::Kafka, Broker::Nats]);
        assert!(probes.iter().all(|(_, r)| r.is_err()));
    }
}
