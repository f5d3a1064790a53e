//! End-to-end relay behaviour: routing, marking, concurrency, fan-out, filtering and failing
//! plugins, against real PostgreSQL and Tansu.

use std::collections::HashSet;
use std::time::Duration;

use sluice_e2e::*;
use sqlx::AssertSqlSafe;

const WAIT: Duration = Duration::from_secs(120);

fn topics(prefix: &str, suffixes: &[&str]) -> Vec<String> {
    suffixes.iter().map(|s| format!("{prefix}{s}")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_of_two_aggregate_types_arrive_routed_and_the_outbox_is_emptied() {
    let table = OutboxTable::create("routed").await;
    let prefix = format!("{}.", table.name);
    let topics = topics(&prefix, &["order", "customer"]);
    create_topics(&kafka_bootstrap(), &topics).await.unwrap();
    let n = 300;
    table.insert_rows(n, None).await;

    let relay = RelayProcess::start(&relay_config(
        &table.name,
        &kafka_bootstrap(),
        &prefix,
        "",
        "",
    ))
    .unwrap();
    assert!(
        wait_until(WAIT, || async { table.count().await == 0 }).await,
        "{}",
        relay.log()
    );
    let exit = relay.stop();
    assert!(exit.success, "relay did not exit 0: {}", exit.log);
    assert_eq!(exit.rows_sent(), Some(n as u64), "{}", exit.log);

    let got = consume(
        &kafka_bootstrap(),
        &topics,
        n as usize,
        WAIT,
        Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(got.len(), n as usize);
    let ids: HashSet<_> = got.iter().map(|m| m.header("id").unwrap()).collect();
    assert_eq!(ids.len(), n as usize, "every row exactly once");
    for m in &got {
        let id: i64 = m.header("id").unwrap().parse().unwrap();
        let even = id % 2 == 0;
        // generate_series starts at 1 and the bigserial too, so id == g.
        assert_eq!(
            m.topic,
            format!("{prefix}{}", if even { "order" } else { "customer" })
        );
        assert_eq!(m.key_str(), format!("agg-{}", id % 50));
        assert_eq!(
            m.payload_json(),
            serde_json::json!({ "n": id }),
            "payload unchanged"
        );
        assert_eq!(
            m.header("event-type").as_deref(),
            Some(if even {
                "OrderCreated"
            } else {
                "CustomerUpdated"
            })
        );
        assert_eq!(
            m.header("trace"),
            Some(format!("trace-{id}")),
            "row headers kept"
        );
    }
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn published_at_mode_keeps_rows_and_stamps_every_one() {
    let table = OutboxTable::create("stamped").await;
    let prefix = format!("{}.", table.name);
    let topics = topics(&prefix, &["order", "customer"]);
    create_topics(&kafka_bootstrap(), &topics).await.unwrap();
    table.insert_rows(200, None).await;

    let relay = RelayProcess::start(&relay_config(
        &table.name,
        &kafka_bootstrap(),
        &prefix,
        "mark = \"published_at\"",
        "",
    ))
    .unwrap();
    assert!(
        wait_until(WAIT, || async { table.unsent().await == 0 }).await,
        "{}",
        relay.log()
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert_eq!(table.count().await, 200, "rows are kept");
    assert_eq!(
        table
            .scalar_i64("SELECT count(*) FROM {t} WHERE published_at IS NOT NULL")
            .await,
        200
    );
    let got = consume(
        &kafka_bootstrap(),
        &topics,
        200,
        WAIT,
        Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(got.len(), 200);
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_relays_share_twenty_thousand_rows_each_published_and_marked_once() {
    let table = OutboxTable::create("shared").await;
    let prefix = format!("{}.", table.name);
    let topics = topics(&prefix, &["order", "customer"]);
    create_topics(&kafka_bootstrap(), &topics).await.unwrap();
    let n: i64 = 20_000;
    table.insert_rows(n, None).await;

    let config = relay_config(
        &table.name,
        &kafka_bootstrap(),
        &prefix,
        "batch_size = 200",
        "",
    );
    let a = RelayProcess::start(&config).unwrap();
    let b = RelayProcess::start(&config).unwrap();
    assert!(
        wait_until(WAIT, || async { table.count().await == 0 }).await,
        "not drained: {}\n{}",
        a.log(),
        b.log()
    );
    let (a, b) = (a.stop(), b.stop());
    assert!(a.success && b.success, "{}\n{}", a.log, b.log);
    for exit in [&a, &b] {
        assert!(!exit.log.contains("batch failed"), "{}", exit.log);
    }
    let (sent_a, sent_b) = (a.rows_sent().unwrap(), b.rows_sent().unwrap());
    assert_eq!(
        sent_a + sent_b,
        n as u64,
        "each row marked by exactly one relay"
    );
    assert!(
        sent_a > 0 && sent_b > 0,
        "both relays took work: {sent_a} / {sent_b}"
    );

    let got = consume(
        &kafka_bootstrap(),
        &topics,
        n as usize,
        WAIT,
        Duration::from_secs(2),
    )
    .unwrap();
    let counts = count_by_id(&got);
    assert_eq!(counts.len(), n as usize, "every row arrived");
    let dupes: Vec<_> = counts.iter().filter(|(_, c)| **c != 1).collect();
    assert!(dupes.is_empty(), "rows published more than once: {dupes:?}");
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fanout_plugin_publishes_each_row_to_two_topics() {
    let table = OutboxTable::create("fanout").await;
    let prefix = format!("{}.", table.name);
    let topics = topics(&prefix, &["a", "b"]);
    create_topics(&kafka_bootstrap(), &topics).await.unwrap();
    table.insert_rows(50, Some("fan")).await;
    let extra = format!(
        "[tenants.fan]\npath = \"{}\"\nconfig = {{ topic_prefix = \"{prefix}\" }}\n",
        test_plugin("test_fanout").display()
    );
    let relay = RelayProcess::start(&relay_config(
        &table.name,
        &kafka_bootstrap(),
        &prefix,
        "",
        &extra,
    ))
    .unwrap();
    assert!(
        wait_until(WAIT, || async { table.count().await == 0 }).await,
        "{}",
        relay.log()
    );
    assert!(relay.stop().success);
    let got = consume(
        &kafka_bootstrap(),
        &topics,
        100,
        WAIT,
        Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(got.len(), 100);
    for t in &topics {
        let ids: HashSet<_> = got
            .iter()
            .filter(|m| &m.topic == t)
            .map(|m| m.header("id"))
            .collect();
        assert_eq!(ids.len(), 50, "every row on {t}");
    }
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn filtering_plugin_drops_rows_which_are_marked_without_publishing() {
    let table = OutboxTable::create("filter").await;
    let prefix = format!("{}.", table.name);
    let topics = topics(&prefix, &["order", "customer"]);
    create_topics(&kafka_bootstrap(), &topics).await.unwrap();
    table.insert_rows(100, Some("picky")).await;
    let extra = format!(
        "[tenants.picky]\npath = \"{}\"\nconfig = {{ topic_prefix = \"{prefix}\", drop_event_type = \"CustomerUpdated\" }}\n",
        test_plugin("test_filter").display()
    );
    let relay = RelayProcess::start(&relay_config(
        &table.name,
        &kafka_bootstrap(),
        &prefix,
        "mark = \"published_at\"",
        &extra,
    ))
    .unwrap();
    assert!(
        wait_until(WAIT, || async { table.unsent().await == 0 }).await,
        "{}",
        relay.log()
    );
    assert!(relay.stop().success);
    // Dropped rows are marked like delivered ones.
    assert_eq!(
        table
            .scalar_i64("SELECT count(*) FROM {t} WHERE published_at IS NOT NULL")
            .await,
        100
    );
    let got = consume(
        &kafka_bootstrap(),
        &topics,
        50,
        WAIT,
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(got.len(), 50, "only the OrderCreated half is published");
    assert!(got.iter().all(|m| m.topic == format!("{prefix}order")));
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn permanent_errors_and_traps_leave_rows_unsent_while_other_tenants_deliver() {
    let table = OutboxTable::create("failing").await;
    let prefix = format!("{}.", table.name);
    let topics = topics(&prefix, &["order", "customer"]);
    create_topics(&kafka_bootstrap(), &topics).await.unwrap();
    // Interleave the tenants so every batch holds rows of all three.
    for _ in 0..4 {
        table.insert_rows(10, Some("refuser")).await;
        table.insert_rows(10, Some("crasher")).await;
        table.insert_rows(10, None).await;
    }
    let extra = format!(
        "[tenants.refuser]\npath = \"{}\"\n\n[tenants.crasher]\npath = \"{}\"\n",
        test_plugin("test_fail_permanent").display(),
        test_plugin("test_trap").display()
    );
    let relay = RelayProcess::start(&relay_config(
        &table.name,
        &kafka_bootstrap(),
        &prefix,
        "mark = \"published_at\"",
        &extra,
    ))
    .unwrap();
    let ok = wait_until(WAIT, || async {
        table
            .scalar_i64("SELECT count(*) FROM {t} WHERE tenant IS NULL AND published_at IS NULL")
            .await
            == 0
            && table
                .scalar_i64("SELECT count(*) FROM {t} WHERE tenant IS NOT NULL AND attempts = 0")
                .await
                == 0
    })
    .await;
    assert!(ok, "{}", relay.log());
    let exit = relay.stop();
    assert!(
        exit.success,
        "relay keeps running and stops cleanly: {}",
        exit.log
    );

    let unsent = table.unsent_rows().await;
    assert_eq!(
        unsent.len(),
        80,
        "all rows of the failing tenants stay unsent"
    );
    for (tenant, attempts, error) in &unsent {
        let error = error.as_deref().unwrap_or_default();
        assert!(*attempts >= 1);
        match tenant.as_deref() {
            Some("refuser") => assert!(error.contains("schema-mismatch"), "{error}"),
            Some("crasher") => assert!(error.contains("trapped"), "{error}"),
            other => panic!("unexpected unsent row of tenant {other:?}"),
        }
    }
    let got = consume(
        &kafka_bootstrap(),
        &topics,
        40,
        WAIT,
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(
        got.len(),
        40,
        "exactly the default tenant's rows are published"
    );
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bytea_and_text_payloads_reach_kafka_byte_for_byte() {
    for column_type in ["bytea", "text"] {
        let table = OutboxTable::create(&format!("payload_{column_type}")).await;
        let prefix = format!("{}.", table.name);
        let topics = topics(&prefix, &["blob"]);
        create_topics(&kafka_bootstrap(), &topics).await.unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "ALTER TABLE \"{}\" ALTER COLUMN payload TYPE {column_type} USING NULL",
            table.name
        )))
        .execute(&table.pool)
        .await
        .unwrap();
        let value: Vec<u8> = if column_type == "bytea" {
            vec![0, 159, 146, 150, 255]
        } else {
            "héllo, not JSON".as_bytes().to_vec()
        };
        let insert = format!(
            "INSERT INTO \"{}\" (aggregate_type, aggregate_id, event_type, payload) VALUES ('blob', 'b1', 'Raw', $1)",
            table.name
        );
        if column_type == "bytea" {
            sqlx::query(AssertSqlSafe(insert.clone()))
                .bind(&value)
                .execute(&table.pool)
                .await
                .unwrap();
        } else {
            let text = String::from_utf8(value.clone()).unwrap();
            sqlx::query(AssertSqlSafe(insert.clone()))
                .bind(text)
                .execute(&table.pool)
                .await
                .unwrap();
        }
        let relay = RelayProcess::start(&relay_config(
            &table.name,
            &kafka_bootstrap(),
            &prefix,
            "",
            "",
        ))
        .unwrap();
        assert!(
            wait_until(WAIT, || async { table.count().await == 0 }).await,
            "{}",
            relay.log()
        );
        assert!(relay.stop().success);
        let got = consume(
            &kafka_bootstrap(),
            &topics,
            1,
            WAIT,
            Duration::from_millis(500),
        )
        .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].payload.as_deref(),
            Some(value.as_slice()),
            "{column_type}"
        );
        table.drop_table().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_headers_and_unknown_topics_leave_rows_unsent_with_the_reason() {
    let table = OutboxTable::create("badrows").await;
    let prefix = format!("{}.", table.name);
    let topics = topics(&prefix, &["order"]);
    create_topics(&kafka_bootstrap(), &topics).await.unwrap();
    let insert = format!(
        "INSERT INTO \"{}\" (aggregate_type, aggregate_id, event_type, payload, headers) VALUES
           ('order', 'o1', 'Ok', '{{}}', '{{}}'),
           ('order', 'o2', 'BadHeader', '{{}}', '{{\"n\": 5}}'),
           ('nosuchtopic', 'x1', 'Lost', '{{}}', '{{}}')",
        table.name
    );
    sqlx::query(AssertSqlSafe(insert.clone()))
        .execute(&table.pool)
        .await
        .unwrap();
    // Unknown topics fail after librdkafka's metadata propagation wait; keep it short here.
    let config = relay_config(&table.name, &kafka_bootstrap(), &prefix, "", "").replace(
        "[kafka]\n",
        "[kafka]\n\"topic.metadata.propagation.max.ms\" = 2000\n\"message.timeout.ms\" = 5000\n",
    );
    let relay = RelayProcess::start(&config).unwrap();
    let ok = wait_until(WAIT, || async {
        table.count().await == 2
            && table
                .scalar_i64("SELECT count(*) FROM {t} WHERE last_error IS NOT NULL")
                .await
                == 2
    })
    .await;
    assert!(ok, "{}", relay.log());
    assert!(relay.stop().success);
    let rows: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT event_type, last_error FROM \"{}\" ORDER BY id",
        table.name
    )))
    .fetch_all(&table.pool)
    .await
    .unwrap();
    assert_eq!(rows[0].0, "BadHeader");
    assert!(
        rows[0].1.contains("\"n\""),
        "names the header: {}",
        rows[0].1
    );
    assert_eq!(rows[1].0, "Lost");
    assert!(
        rows[1].1.contains("nosuchtopic"),
        "names the topic: {}",
        rows[1].1
    );
    table.drop_table().await;
}
