//! Retention: in `published_at` mode the pruner deletes sent rows past `relay.retention`,
//! never unsent or dead ones; `sluice dead purge` deletes dead rows.

use std::time::Duration;

use sluice_testkit::*;

#[tokio::test(flavor = "multi_thread")]
async fn sent_rows_are_pruned_after_retention_and_dead_rows_are_kept_until_purged() {
    let s = Scenario::new("retention", &["order", "customer"]).await;
    s.table.insert_rows(40, None).await;
    s.table.insert_rows(3, Some("refuser")).await;
    let tenants = s.tenant("refuser", "test_fail_permanent", "");
    let config = s.config(
        "mark = \"published_at\"\nretention = \"2s\"\nprune_interval = \"300ms\"",
        &tenants,
    );
    let dead = "SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL";
    let relay = RelayProcess::start(&config).unwrap();
    // First the rows are sent and kept…
    let sent = wait_until(SCENARIO_WAIT, || async {
        s.table
            .scalar_i64("SELECT count(*) FROM {t} WHERE published_at IS NOT NULL")
            .await
            == 40
            && s.table.scalar_i64(dead).await == 3
    })
    .await;
    assert!(sent, "{}", relay.log());
    assert_eq!(s.table.count().await, 43, "sent rows are kept for a while");
    // …then pruned; dead rows stay.
    let pruned = wait_until(Duration::from_secs(30), || async {
        s.table.count().await == 3
    })
    .await;
    let exit = relay.stop();
    assert!(pruned, "{}", exit.log);
    assert!(exit.log.contains("pruned sent rows"), "{}", exit.log);
    assert_eq!(s.table.scalar_i64(dead).await, 3);

    let purge = |older_than: &str| {
        sluice(&[
            "dead",
            "purge",
            "--database-url",
            &database_url(),
            "--table",
            &s.table.name,
            "--older-than",
            older_than,
        ])
    };
    let kept = purge("1h");
    assert!(kept.status.success());
    assert!(String::from_utf8_lossy(&kept.stdout).contains("0 dead rows purged"));
    let purged = purge("0s");
    assert!(
        String::from_utf8_lossy(&purged.stdout).contains("3 dead rows purged"),
        "{}",
        String::from_utf8_lossy(&purged.stderr)
    );
    assert_eq!(s.table.count().await, 0);
    s.finish().await;
}

/// `sluice migrate --partitioned hourly`, then a relay in `published_at` mode with
/// `retention_mode = "drop-partitions"`: the rows of an old partition are relayed, and once
/// every one was sent longer ago than the retention the partition is dropped; the DEFAULT
/// partition and the current ones stay.
#[tokio::test(flavor = "multi_thread")]
async fn old_partitions_are_dropped_once_their_rows_were_sent_past_the_retention() {
    let table = DbTable::fresh(Database::Postgres, "retention_parts").await;
    let migrate = sluice(&[
        "migrate",
        "--database-url",
        &table.url,
        "--table",
        &table.name,
        "--partitioned",
        "hourly",
    ]);
    let stdout = String::from_utf8_lossy(&migrate.stdout);
    assert!(
        migrate.status.success() && stdout.contains("partitioned by created_at, hourly"),
        "{stdout}{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    let partitions = format!(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = '{}'::regclass",
        table.name
    );
    assert_eq!(table.scalar_i64(&partitions).await, 1 + 1 + 48);
    // An hour three hours ago, with rows in it.
    table
        .execute(&format!(
            "CREATE TABLE \"{}_old\" PARTITION OF {{t}}
                FOR VALUES FROM (date_trunc('hour', now()) - interval '3 hours')
                            TO (date_trunc('hour', now()) - interval '2 hours')",
            table.name
        ))
        .await;
    table
        .execute(
            "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, created_at)
             SELECT 'order', 'a' || g, 'OrderCreated', '{}',
                    date_trunc('hour', now()) - interval '150 minutes'
               FROM generate_series(1, 20) AS g",
        )
        .await;
    table.insert_rows(10, None).await;
    let s = Scenario::with_table(table, &["order", "customer"]).await;
    let config = s.config(
        "mark = \"published_at\"\nretention = \"2s\"\nretention_mode = \"drop-partitions\"\n\
         prune_interval = \"300ms\"",
        "",
    );
    let relay = RelayProcess::start(&config).unwrap();
    let dropped = wait_until(SCENARIO_WAIT, || async {
        s.table.count().await == 10
            && s.table
                .scalar_i64("SELECT count(*) FROM {t} WHERE published_at IS NULL")
                .await
                == 0
    })
    .await;
    let exit = relay.stop();
    assert!(dropped, "{}", exit.log);
    assert!(
        exit.log
            .contains("dropped outbox partitions past relay.retention"),
        "{}",
        exit.log
    );
    assert_eq!(s.table.scalar_i64(&partitions).await, 1 + 1 + 48);
    s.finish().await;
}

/// `retention_mode = "drop-partitions"` on a table that is not partitioned: `sluice run`
/// refuses to start, naming the key.
#[tokio::test(flavor = "multi_thread")]
async fn drop_partitions_on_a_plain_table_is_refused_at_start() {
    let s = Scenario::new("retention_plain", &["order", "customer"]).await;
    let config = s.config(
        "mark = \"published_at\"\nretention_mode = \"drop-partitions\"",
        "",
    );
    let mut relay = RelayProcess::start(&config).unwrap();
    let status = relay.wait_exit(SCENARIO_WAIT).await.unwrap();
    let log = relay.log();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("retention_mode") && log.contains("partitioned by RANGE"),
        "{log}"
    );
    s.finish().await;
}
