//! Produce errors injected with librdkafka's mock cluster (a real Kafka-protocol server in this
//! test process, reached by the relay over TCP): retriable errors are absorbed by the producer,
//! non-retriable ones fail the row by the retry policy, and nothing is lost.

use std::time::Duration;

use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use sluice_testkit::*;

const WAIT: Duration = Duration::from_secs(60);

struct MockScenario {
    table: DbTable,
    prefix: String,
    topics: Vec<String>,
}

impl MockScenario {
    async fn new(
        mock: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
        stem: &str,
    ) -> Self {
        let table = DbTable::create(Database::Postgres, stem).await;
        let prefix = format!("{}.", table.name);
        let topics = vec![format!("{prefix}order"), format!("{prefix}customer")];
        for t in &topics {
            mock.create_topic(t, 3, 1).expect("mock topic");
        }
        Self {
            table,
            prefix,
            topics,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn retriable_produce_errors_are_retried_by_the_producer_and_no_row_fails() {
    let mock = MockCluster::new(3).unwrap();
    let bootstrap = mock.bootstrap_servers();
    let s = MockScenario::new(&mock, "mockretry").await;
    s.table.insert_rows(50, None).await;
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 4],
    );
    let relay =
        RelayProcess::start(&relay_config(&s.table.name, &bootstrap, &s.prefix, "", "")).unwrap();
    let drained = wait_until(WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(
        !exit.log.contains("failed rows"),
        "librdkafka retried internally: {}",
        exit.log
    );
    let got = consume(&bootstrap, &s.topics, 50, WAIT, Duration::from_secs(1)).unwrap();
    assert_eq!(count_by_id(&got).len(), 50);
    s.table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn non_retriable_produce_errors_count_as_attempts_and_replay_delivers_afterwards() {
    let mock = MockCluster::new(1).unwrap();
    let bootstrap = mock.bootstrap_servers();
    let s = MockScenario::new(&mock, "mockfatal").await;
    s.table.insert_rows(10, None).await;
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 64],
    );
    let config = relay_config(&s.table.name, &bootstrap, &s.prefix, "", "")
        + "[relay.retry]\nmax_attempts = 1\n";
    let relay = RelayProcess::start(&config).unwrap();
    let dead = "SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL AND attempts = 1";
    let all_dead = wait_until(WAIT, || async { s.table.scalar_i64(dead).await == 10 }).await;
    assert!(all_dead, "{}", relay.log());
    let error: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT last_error FROM \"{}\" LIMIT 1",
        s.table.name
    )))
    .fetch_one(s.table.pg_pool())
    .await
    .unwrap();
    assert!(error.contains("TopicAuthorizationFailed"), "{error}");

    // The broker accepts again. librdkafka caches a topic's authorization error until its
    // next metadata refresh, so a fresh relay delivers the replayed rows (as after an
    // operator fixed the ACL and restarted).
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    mock.clear_request_errors(RDKafkaApiKey::Produce);
    let replay = sluice(&[
        "dead",
        "replay",
        "--all",
        "--database-url",
        &database_url(),
        "--table",
        &s.table.name,
    ]);
    assert!(replay.status.success());
    let relay = RelayProcess::start(&config).unwrap();
    let drained = wait_until(WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    let got = consume(&bootstrap, &s.topics, 10, WAIT, Duration::from_secs(1)).unwrap();
    assert_eq!(count_by_id(&got).len(), 10, "nothing lost");
    s.table.drop_table().await;
}
