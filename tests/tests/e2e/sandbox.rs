//! The hostile-plugin suite: tenants whose plugins spin, exhaust memory, panic, route to a
//! forbidden topic, flood outputs, emit huge messages, or try to read files, environment,
//! sockets or the clock. Each hostile tenant's rows end unsent with an explaining
//! `last_error`, nothing forbidden reaches Kafka, the relay keeps running, and a well-behaved
//! tenant in the same table gets every row delivered.

use std::time::Duration;

use sluice_testkit::*;

/// (mode, extra tenant settings, what `last_error` must say)
const HOSTILE: &[(&str, &str, &str)] = &[
    // A deadline overrun pauses the tenant at once; a short cool-down lets the test see all
    // three rows tried.
    (
        "loop",
        "call_timeout = \"100ms\"\ncircuit_breaker_cooldown = \"200ms\"",
        "call_timeout",
    ),
    ("bomb", "memory_mb = 16", "memory limit of 16 MiB"),
    ("panic", "", "trapped"),
    ("forbidden", "", "allowed_topics"),
    ("many", "", "max_outputs_per_row"),
    ("huge", "", "max_message_bytes"),
    ("fs", "", "fs-denied"),
    ("env", "", "env-denied"),
    ("socket", "", "socket-denied"),
    ("clock", "", "clock-denied"),
];

#[tokio::test(flavor = "multi_thread")]
async fn hostile_plugins_fail_only_their_own_rows_and_leak_nothing() {
    let s = Scenario::new("hostile", &["order", "customer", "good", "leak"]).await;
    create_topics(&kafka_bootstrap(), &["forbidden.topic".to_owned()])
        .await
        .unwrap();
    let mut tenants = String::new();
    for (mode, limits, _) in HOSTILE {
        tenants += &format!(
            "[tenants.{mode}]\npath = \"{}\"\nconfig = {{ mode = \"{mode}\", topic_prefix = \"{}\" }}\nallowed_topics = [\"{}*\"]\n{limits}\n\n",
            test_plugin("test_hostile").display(),
            s.prefix,
            s.prefix
        );
    }
    tenants += "[relay.retry]\nmax_attempts = 1\n";
    // Interleave good and hostile rows so every batch mixes them.
    for _ in 0..3 {
        s.table.insert_rows(10, None).await;
        for (mode, _, _) in HOSTILE {
            s.table.insert_rows(1, Some(mode)).await;
        }
    }
    let hostile_rows = 3 * HOSTILE.len() as i64;
    let dead = "SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL";
    let exit = s
        .relay_until(&s.config("", &tenants), || async {
            s.table.scalar_i64(dead).await == hostile_rows
                && s.table.scalar_i64("SELECT count(*) FROM {t}").await == hostile_rows
        })
        .await;
    assert!(exit.log.contains("relay stopped"), "{}", exit.log);

    for (tenant, attempts, error) in s.table.unsent_rows().await {
        let tenant = tenant.expect("only hostile rows are left");
        let (_, _, expected) = HOSTILE.iter().find(|(m, _, _)| *m == tenant).unwrap();
        let error = error.unwrap_or_default();
        assert!(error.contains(expected), "{tenant}: {error}");
        assert_eq!(attempts, 1);
    }
    // The good tenant's 30 rows arrived; nothing else did.
    let delivered = s.consume(30, Duration::from_secs(2));
    assert_eq!(delivered.len(), 30);
    assert!(
        delivered
            .iter()
            .all(|m| m.header("sluice-tenant").as_deref() == Some("default"))
    );
    let stray = consume(
        &kafka_bootstrap(),
        &["forbidden.topic".to_owned()],
        1,
        Duration::from_secs(3),
        Duration::ZERO,
    )
    .unwrap();
    assert!(stray.is_empty(), "a forbidden topic received messages");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn host_stamped_headers_cannot_be_forged() {
    let s = Scenario::new("stamped", &["order", "customer"]).await;
    let insert = format!(
        "INSERT INTO \"{}\" (tenant, aggregate_type, aggregate_id, event_type, payload, headers)
         VALUES ('acme', 'order', 'o1', 'Created', '{{}}',
                 '{{\"sluice-tenant\": \"root\", \"sluice-outbox-id\": \"999\"}}')",
        s.table.name
    );
    sqlx::query(sqlx::AssertSqlSafe(insert))
        .execute(s.table.pg_pool())
        .await
        .unwrap();
    // The reference plugin copies row headers, so the forged values reach the host.
    s.relay_until(&s.config("", ""), || async { s.table.count().await == 0 })
        .await;
    let got = s.consume(1, Duration::from_millis(500));
    assert_eq!(got.len(), 1);
    let m = &got[0];
    let values = |name: &str| -> Vec<String> {
        m.headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    };
    assert_eq!(values("sluice-tenant"), vec!["acme"]);
    assert_eq!(values("sluice-outbox-id"), vec![m.header("id").unwrap()]);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn circuit_breaker_pauses_a_failing_tenant_and_resumes_it_by_itself() {
    let s = Scenario::new("breaker", &["order", "customer"]).await;
    s.table.insert_rows(10, Some("flaky")).await;
    s.table.insert_rows(20, None).await;
    // Every row's first attempt fails: three in a row trip the breaker for one second.
    let tenant = format!(
        "[tenants.flaky]\npath = \"{}\"\nconfig = {{ topic_prefix = \"{}\", fail_attempts = 1 }}\n\
         circuit_breaker_failures = 3\ncircuit_breaker_cooldown = \"1s\"\n\
         [relay.retry]\ninitial = \"100ms\"\nmax_attempts = 5\n",
        test_plugin("test_flaky").display(),
        s.prefix
    );
    let exit = s
        .relay_until(&s.config("", &tenant), || async {
            s.table.count().await == 0
        })
        .await;
    assert!(exit.log.contains("circuit breaker opened"), "{}", exit.log);
    assert!(exit.log.contains("circuit breaker closed"), "{}", exit.log);
    let got = s.consume(30, Duration::from_secs(1));
    assert_eq!(
        count_by_id(&got).len(),
        30,
        "every row delivered in the end"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_that_traps_in_a_batch_call_fails_alone_among_its_own_tenants_rows() {
    let s = Scenario::new("onetrap", &["order", "customer"]).await;
    // One batch of 121 rows of one tenant. The first 64 run row by row (a new instance's
    // probation), the rest go to transform-batch, where the plugin traps on aggregate "bad":
    // that call is retried row by row and only the bad row fails. One worker: two claiming at
    // once (the adaptive limit starts at 2) can split the rows so that "bad" lands among a
    // batch's first 64 and never reaches transform-batch.
    s.table.insert_rows(100, Some("picky")).await;
    let bad = format!(
        "INSERT INTO \"{}\" (tenant, aggregate_type, aggregate_id, event_type, payload)
         VALUES ('picky', 'order', 'bad', 'OrderCreated', '{{}}')",
        s.table.name
    );
    sqlx::query(sqlx::AssertSqlSafe(bad))
        .execute(s.table.pg_pool())
        .await
        .unwrap();
    s.table.insert_rows(20, Some("picky")).await;
    let tenant = s.tenant(
        "picky",
        "test_trap",
        &format!(
            "only_aggregate_id = \"bad\", topic_prefix = \"{}\"",
            s.prefix
        ),
    );
    let config = s.config(
        "batch_size = 500\nworkers = 1\n[relay.retry]\nmax_attempts = 1",
        &tenant,
    );
    let exit = s
        .relay_until(&config, || async { s.table.count().await == 1 })
        .await;
    assert!(
        exit.log
            .contains("transform-batch failed; calling this tenant's plugin row by row"),
        "{}",
        exit.log
    );
    let unsent = s.table.unsent_rows().await;
    assert_eq!(unsent.len(), 1);
    assert_eq!(unsent[0].1, 1, "one attempt");
    assert!(
        unsent[0]
            .2
            .as_deref()
            .unwrap_or_default()
            .contains("trapped")
    );
    let got = s.consume(120, Duration::from_secs(1));
    assert_eq!(count_by_id(&got).len(), 120);
    assert!(got.iter().all(|m| m.key_str() != "bad"));
    s.finish().await;
}
