//! End-to-end relay behaviour: routing, marking, concurrency, fan-out, filtering and failing
//! plugins, payload types and undeliverable rows, against real PostgreSQL and Tansu.

use std::collections::HashSet;
use std::time::Duration;

use sluice_testkit::*;
use sqlx::AssertSqlSafe;

const SETTLE: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread")]
async fn rows_of_two_aggregate_types_arrive_routed_and_the_outbox_is_emptied() {
    let s = Scenario::new("routed", &["order", "customer"]).await;
    let n = 300;
    s.table.insert_rows(n, None).await;

    let exit = s
        .relay_until(&s.config("", ""), || async { s.table.count().await == 0 })
        .await;
    assert_eq!(exit.rows_sent(), Some(n as u64), "{}", exit.log);

    let got = s.consume(n as usize, SETTLE);
    assert_eq!(got.len(), n as usize);
    let ids: HashSet<_> = got.iter().map(|m| m.header("id").unwrap()).collect();
    assert_eq!(ids.len(), n as usize, "every row exactly once");
    for m in &got {
        // generate_series and the bigserial both start at 1, so id == g.
        let id: i64 = m.header("id").unwrap().parse().unwrap();
        let even = id % 2 == 0;
        let aggregate = if even { "order" } else { "customer" };
        assert_eq!(m.topic, format!("{}{aggregate}", s.prefix));
        assert_eq!(m.key_str(), format!("agg-{}", id % 50));
        assert_eq!(
            m.payload_json(),
            serde_json::json!({ "n": id }),
            "payload unchanged"
        );
        let event = if even {
            "OrderCreated"
        } else {
            "CustomerUpdated"
        };
        assert_eq!(m.header("event-type").as_deref(), Some(event));
        assert_eq!(
            m.header("trace"),
            Some(format!("trace-{id}")),
            "row headers kept"
        );
    }
    s.finish().await;
}

/// What a consumer can tell about a message, with the scenario's topic prefix removed.
fn shape(m: &Received, prefix: &str) -> (String, String, String, Vec<(String, Vec<u8>)>) {
    (
        m.topic.trim_start_matches(prefix).to_owned(),
        m.key_str(),
        String::from_utf8_lossy(m.payload.as_deref().unwrap_or_default()).into_owned(),
        m.headers.clone(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn builtin_routing_publishes_exactly_what_the_wasm_reference_plugin_does() {
    let mut outputs = Vec::new();
    for builtin in [false, true] {
        let s = Scenario::new(
            if builtin { "builtin" } else { "wasm" },
            &["order", "customer"],
        )
        .await;
        s.table.insert_rows(100, None).await;
        let mut config = s.config("", "");
        if builtin {
            let path = format!("path = \"{}\"", reference_plugin().display());
            config = config.replace(&path, "builtin = \"route-by-aggregate\"");
        }
        s.relay_until(&config, || async { s.table.count().await == 0 })
            .await;
        let mut got: Vec<_> = s
            .consume(100, SETTLE)
            .iter()
            .map(|m| shape(m, &s.prefix))
            .collect();
        got.sort();
        outputs.push(got);
        s.finish().await;
    }
    assert_eq!(outputs[0].len(), 100);
    assert_eq!(outputs[0], outputs[1], "builtin and WASM outputs differ");
}

#[tokio::test(flavor = "multi_thread")]
async fn published_at_mode_keeps_rows_and_stamps_every_one() {
    let s = Scenario::new("stamped", &["order", "customer"]).await;
    s.table.insert_rows(200, None).await;
    let config = s.config("mark = \"published_at\"", "");
    s.relay_until(&config, || async { s.table.unsent().await == 0 })
        .await;
    assert_eq!(s.table.count().await, 200, "rows are kept");
    let stamped = "SELECT count(*) FROM {t} WHERE published_at IS NOT NULL";
    assert_eq!(s.table.scalar_i64(stamped).await, 200);
    assert_eq!(s.consume(200, SETTLE).len(), 200);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_relays_share_twenty_thousand_rows_each_published_and_marked_once() {
    let s = Scenario::new("shared", &["order", "customer"]).await;
    let n: i64 = 20_000;
    s.table.insert_rows(n, None).await;

    let config = s.config("batch_size = 200", "");
    let a = RelayProcess::start(&config).unwrap();
    let b = RelayProcess::start(&config).unwrap();
    let drained = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "not drained: {}\n{}", a.log(), b.log());
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

    let counts = count_by_id(&s.consume(n as usize, Duration::from_secs(2)));
    assert_eq!(counts.len(), n as usize, "every row arrived");
    let dupes: Vec<_> = counts.iter().filter(|(_, c)| **c != 1).collect();
    assert!(dupes.is_empty(), "rows published more than once: {dupes:?}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fanout_plugin_publishes_each_row_to_two_topics() {
    let s = Scenario::new("fanout", &["a", "b"]).await;
    s.table.insert_rows(50, Some("fan")).await;
    let tenant = s.tenant(
        "fan",
        "test_fanout",
        &format!("topic_prefix = \"{}\"", s.prefix),
    );
    s.relay_until(&s.config("", &tenant), || async {
        s.table.count().await == 0
    })
    .await;
    let got = s.consume(100, SETTLE);
    assert_eq!(got.len(), 100);
    for t in &s.topics {
        let on_topic = got.iter().filter(|m| &m.topic == t);
        let ids: HashSet<_> = on_topic.map(|m| m.header("id")).collect();
        assert_eq!(ids.len(), 50, "every row on {t}");
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn filtering_plugin_drops_rows_which_are_marked_without_publishing() {
    let s = Scenario::new("filter", &["order", "customer"]).await;
    s.table.insert_rows(100, Some("picky")).await;
    let plugin_config = format!(
        "topic_prefix = \"{}\", drop_event_type = \"CustomerUpdated\"",
        s.prefix
    );
    let tenant = s.tenant("picky", "test_filter", &plugin_config);
    let config = s.config("mark = \"published_at\"", &tenant);
    s.relay_until(&config, || async { s.table.unsent().await == 0 })
        .await;
    // Dropped rows are marked like delivered ones.
    let stamped = "SELECT count(*) FROM {t} WHERE published_at IS NOT NULL";
    assert_eq!(s.table.scalar_i64(stamped).await, 100);
    let got = s.consume(50, Duration::from_secs(2));
    assert_eq!(got.len(), 50, "only the OrderCreated half is published");
    assert!(got.iter().all(|m| m.topic == format!("{}order", s.prefix)));
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn permanent_errors_and_traps_leave_rows_unsent_while_other_tenants_deliver() {
    let s = Scenario::new("failing", &["order", "customer"]).await;
    // Interleave the tenants so every batch holds rows of all three.
    for _ in 0..4 {
        s.table.insert_rows(10, Some("refuser")).await;
        s.table.insert_rows(10, Some("crasher")).await;
        s.table.insert_rows(10, None).await;
    }
    // This test is about single rows failing; keep the circuit breaker out of the way.
    let no_breaker = "circuit_breaker_failures = 1000\n";
    let tenants = s.tenant("refuser", "test_fail_permanent", "")
        + no_breaker
        + &s.tenant("crasher", "test_trap", "")
        + no_breaker;
    let config = s.config("mark = \"published_at\"", &tenants);
    let default_unsent = "SELECT count(*) FROM {t} WHERE tenant IS NULL AND published_at IS NULL";
    let untried = "SELECT count(*) FROM {t} WHERE tenant IS NOT NULL AND attempts = 0";
    s.relay_until(&config, || async {
        s.table.scalar_i64(default_unsent).await == 0 && s.table.scalar_i64(untried).await == 0
    })
    .await;

    let unsent = s.table.unsent_rows().await;
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
    let got = s.consume(40, Duration::from_secs(2));
    assert_eq!(
        got.len(),
        40,
        "exactly the default tenant's rows are published"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bytea_and_text_payloads_reach_kafka_byte_for_byte() {
    for column_type in ["bytea", "text"] {
        let s = Scenario::new(&format!("payload_{column_type}"), &["blob"]).await;
        let table = &s.table.name;
        let alter =
            format!("ALTER TABLE \"{table}\" ALTER COLUMN payload TYPE {column_type} USING NULL");
        sqlx::query(AssertSqlSafe(alter))
            .execute(s.table.pg_pool())
            .await
            .unwrap();
        let insert = format!(
            "INSERT INTO \"{table}\" (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('blob', 'b1', 'Raw', $1)"
        );
        let query = sqlx::query(AssertSqlSafe(insert));
        let value: Vec<u8> = if column_type == "bytea" {
            let raw = vec![0, 159, 146, 150, 255];
            query
                .bind(raw.clone())
                .execute(s.table.pg_pool())
                .await
                .unwrap();
            raw
        } else {
            let text = "héllo, not JSON";
            query.bind(text).execute(s.table.pg_pool()).await.unwrap();
            text.as_bytes().to_vec()
        };
        s.relay_until(&s.config("", ""), || async { s.table.count().await == 0 })
            .await;
        let got = s.consume(1, Duration::from_millis(500));
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].payload.as_deref(),
            Some(value.as_slice()),
            "{column_type}"
        );
        s.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_headers_unknown_topics_and_oversized_messages_leave_rows_unsent_with_the_reason()
{
    let s = Scenario::new("badrows", &["order"]).await;
    let insert = format!(
        "INSERT INTO \"{}\" (aggregate_type, aggregate_id, event_type, payload, headers) VALUES
           ('order', 'o1', 'Ok', '{{}}', '{{}}'),
           ('order', 'o2', 'BadHeader', '{{}}', '{{\"n\": 5}}'),
           ('nosuchtopic', 'x1', 'Lost', '{{}}', '{{}}'),
           ('order', 'o3', 'Huge', jsonb_build_object('pad', repeat('x', 5000)), '{{}}')",
        s.table.name
    );
    sqlx::query(AssertSqlSafe(insert))
        .execute(s.table.pg_pool())
        .await
        .unwrap();
    // Unknown topics fail after librdkafka's metadata propagation wait; keep it short here.
    let config = s.config("", "").replace(
        "[kafka]\n",
        "[kafka]\n\"topic.metadata.propagation.max.ms\" = 2000\n\"message.timeout.ms\" = 5000\n\"message.max.bytes\" = 2000\n",
    );
    let with_error = "SELECT count(*) FROM {t} WHERE last_error IS NOT NULL";
    s.relay_until(&config, || async {
        s.table.count().await == 3 && s.table.scalar_i64(with_error).await == 3
    })
    .await;
    let select = format!(
        "SELECT event_type, last_error FROM \"{}\" ORDER BY id",
        s.table.name
    );
    let rows: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(select))
        .fetch_all(s.table.pg_pool())
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
    assert_eq!(rows[2].0, "Huge");
    assert!(
        rows[2].1.contains("MessageSizeTooLarge"),
        "says why: {}",
        rows[2].1
    );
    assert_eq!(s.consume(1, SETTLE).len(), 1, "the good row is delivered");
    s.finish().await;
}
