//! Broker outages: with the broker unreachable rows stay unsent with `last_error`; once it is
//! back they are delivered. The test runs its own Tansu on a free port so stopping it does not
//! disturb other tests.

use std::time::Duration;

use sluice_testkit::*;
use sqlx::AssertSqlSafe;

#[tokio::test(flavor = "multi_thread")]
async fn rows_wait_out_a_broker_outage_and_are_delivered_when_it_returns() {
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let table = DbTable::create(Database::Postgres, "outage").await;
    let prefix = format!("{}.", table.name);
    table.insert_rows(100, None).await;
    let config = relay_config(&table.name, &bootstrap, &prefix, "", "")
        .replace("[kafka]\n", "[kafka]\n\"message.timeout.ms\" = 3000\n");
    let relay = RelayProcess::start(&config).unwrap();

    // Broker down: every row is attempted, fails, and stays, without using up its attempts.
    let failed = wait_until(Duration::from_secs(60), || async {
        table
            .scalar_i64("SELECT count(*) FROM {t} WHERE last_error IS NOT NULL AND attempts = 0")
            .await
            == 100
    })
    .await;
    assert!(failed, "{}", relay.log());
    assert_eq!(
        table.count().await,
        100,
        "nothing is lost while the broker is down"
    );
    let error: String = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT last_error FROM \"{}\" LIMIT 1",
        table.name
    )))
    .fetch_one(table.pg_pool())
    .await
    .unwrap();
    assert!(
        error.contains("timed out") || error.contains("ransport"),
        "{error}"
    );

    // Broker back: rows go out on their next retry.
    let _tansu = OwnTansu::start(port);
    let topics = vec![format!("{prefix}order"), format!("{prefix}customer")];
    let created = wait_until(Duration::from_secs(20), || async {
        create_topics(&bootstrap, &topics).await.is_ok()
    })
    .await;
    assert!(created, "cannot create topics on the restarted broker");
    let drained = wait_until(Duration::from_secs(120), || async {
        table.count().await == 0
    })
    .await;
    assert!(drained, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    let got = consume(
        &bootstrap,
        &topics,
        100,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .unwrap();
    let counts = count_by_id(&got);
    assert_eq!(counts.len(), 100, "every row delivered after the outage");
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_stopped_mid_stream_loses_no_row() {
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let tansu = OwnTansu::start(port);
    let table = DbTable::create(Database::Postgres, "brokerstop").await;
    let prefix = format!("{}.", table.name);
    let topics = vec![format!("{prefix}order"), format!("{prefix}customer")];
    let created = wait_until(Duration::from_secs(20), || async {
        create_topics(&bootstrap, &topics).await.is_ok()
    })
    .await;
    assert!(created);
    let config = relay_config(&table.name, &bootstrap, &prefix, "", "")
        .replace("[kafka]\n", "[kafka]\n\"message.timeout.ms\" = 2000\n")
        + "[relay.retry]\ninitial = \"500ms\"\nmax = \"2s\"\n";
    let relay = RelayProcess::start(&config).unwrap();

    // Rows keep arriving before, during and after the outage.
    let mut inserted = 0;
    let insert_for = |secs: u64| {
        let table = &table;
        async move {
            let mut n = 0;
            let until = std::time::Instant::now() + Duration::from_secs(secs);
            while std::time::Instant::now() < until {
                table.insert_rows(50, None).await;
                n += 50;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            n
        }
    };
    inserted += insert_for(2).await;
    // SIGSTOP freezes the broker like an outage, keeping what it already stored (its storage
    // is in memory, so a kill would lose acknowledged messages the test wants to count).
    tansu.signal("STOP");
    inserted += insert_for(5).await;
    let failed = "SELECT count(*) FROM {t} WHERE last_error IS NOT NULL";
    assert!(
        table.scalar_i64(failed).await > 0,
        "the outage was noticed: {}",
        relay.log()
    );
    tansu.signal("CONT");
    inserted += insert_for(2).await;

    let drained = wait_until(Duration::from_secs(120), || async {
        table.count().await == 0
    })
    .await;
    assert!(drained, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    let got = consume(
        &bootstrap,
        &topics,
        inserted,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .unwrap();
    let counts = count_by_id(&got);
    let lost: Vec<i64> = (1..=inserted as i64)
        .filter(|id| !counts.contains_key(&id.to_string()))
        .take(10)
        .collect();
    assert!(lost.is_empty(), "rows lost: {lost:?}");
    println!(
        "broker stopped mid-stream: {inserted} rows, 0 lost, {} duplicates",
        got.len() - counts.len()
    );
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_rolls_back_a_batch_that_cannot_finish_within_shutdown_timeout() {
    // No broker at this port: the batch waits for delivery reports that cannot come.
    let bootstrap = format!("127.0.0.1:{}", free_port());
    let table = DbTable::create(Database::Postgres, "shutdown").await;
    let prefix = format!("{}.", table.name);
    table.insert_rows(20, None).await;
    let config = relay_config(
        &table.name,
        &bootstrap,
        &prefix,
        "shutdown_timeout = \"1s\"",
        "",
    )
    .replace("[kafka]\n", "[kafka]\n\"message.timeout.ms\" = 120000\n");
    let relay = RelayProcess::start(&config).unwrap();
    // Wait until the relay holds the rows (claimed: they are locked).
    let claimed = wait_until(Duration::from_secs(30), || async {
        table
            .scalar_i64("SELECT 20 - count(*) FROM (SELECT 1 FROM {t} FOR UPDATE SKIP LOCKED) x")
            .await
            == 20
    })
    .await;
    assert!(claimed, "{}", relay.log());
    let asked = std::time::Instant::now();
    let exit = relay.stop();
    let took = asked.elapsed();
    assert!(exit.success, "exit 0 after the deadline: {}", exit.log);
    assert!(took < Duration::from_secs(15), "stopped after {took:?}");
    assert!(exit.log.contains("rolling it back"), "{}", exit.log);
    let untouched = "SELECT count(*) FROM {t} WHERE attempts = 0 AND last_error IS NULL";
    assert_eq!(
        table.scalar_i64(untouched).await,
        20,
        "batch rolled back, rows unchanged"
    );
    table.drop_table().await;
}
