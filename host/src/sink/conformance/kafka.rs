//! Kafka's fixture: the shared test broker (Tansu, `SLUICE_TEST_KAFKA`), one-partition topics
//! (one order for every key, as the bodies read them), read back with a librdkafka consumer.
//! Behind a proxy, a broker of the fixture's own that advertises the proxy: a Kafka client
//! connects to the address the broker advertises after its first request.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use sluice_testkit::stall::StallingProxy;
use sluice_testkit::{OwnTansu, TansuLaunch, free_port, unique};

use super::{BrokerFixture, Received, Reports};
use crate::model::Broker;
use crate::sink::KafkaSink;

pub(in crate::sink) struct KafkaFixture {
    bootstrap: String,
    /// The fixture's own broker, once [`BrokerFixture::proxied`] started it.
    own: Option<OwnTansu>,
}

/// librdkafka's own limit on a produced message (`message.max.bytes`, 1,000,000 by default).
const OVERSIZED: usize = 1_100_000;

impl KafkaFixture {
    fn client(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        config
    }
}

impl BrokerFixture for KafkaFixture {
    type Sink = KafkaSink;
    const BROKER: Broker = Broker::Kafka;
    const REPORTS: Reports = Reports::PartitionAndOffset;

    async fn new() -> Self {
        Self {
            bootstrap: sluice_testkit::kafka_bootstrap(),
            own: None,
        }
    }

    fn address(&self) -> String {
        self.bootstrap.clone()
    }

    async fn sink_at(&self, address: &str) -> KafkaSink {
        let mut properties = BTreeMap::new();
        properties.insert("bootstrap.servers".to_owned(), address.to_owned());
        // A stalled broker fails a batch within the suite's patience, not Sluice's 30 s.
        properties.insert("message.timeout.ms".to_owned(), "8000".to_owned());
        let sink = tokio::task::spawn_blocking(move || KafkaSink::new(&properties));
        sink.await.unwrap().expect("a kafka sink")
    }

    async fn destination(&self) -> String {
        let topic = unique("conformance");
        sluice_testkit::kafka::create_partitioned_topics(
            &self.client(),
            std::slice::from_ref(&topic),
            1,
        )
        .await
        .expect("create a topic");
        topic
    }

    async fn missing_destination(&self) -> String {
        unique("conformance-missing")
    }

    async fn received(
        &self,
        destination: &str,
        at_least: usize,
        timeout: Duration,
    ) -> Vec<Received> {
        let config = self.client();
        let topics = vec![destination.to_owned()];
        let consumed = tokio::task::spawn_blocking(move || {
            sluice_testkit::consume_until_with(
                config,
                &topics,
                timeout,
                Duration::from_millis(500),
                |got| got.len() >= at_least,
            )
        });
        consumed
            .await
            .unwrap()
            .expect("consume")
            .into_iter()
            .map(|m| Received {
                key: m.key,
                payload: m.payload,
                headers: m.headers,
            })
            .collect()
    }

    fn oversized_payload(&self) -> Vec<u8> {
        vec![b'x'; OVERSIZED]
    }

    async fn proxied(&mut self) -> (StallingProxy, KafkaSink) {
        let port = free_port();
        let proxy = StallingProxy::start(&format!("127.0.0.1:{port}")).expect("start a proxy");
        let own = OwnTansu::launch(&TansuLaunch {
            port,
            advertised_port: Some(proxy.port()),
            ..TansuLaunch::default()
        });
        let address = format!("127.0.0.1:{}", proxy.port());
        // Until it listens, admin requests fail: wait for it.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.bootstrap = address.clone();
        self.own = Some(own);
        let sink = self.sink_at(&address).await;
        (proxy, sink)
    }
}
