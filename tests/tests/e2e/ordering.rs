//! `relay.ordering = "key"`: with three relays and a key whose rows fail transiently, every
//! key's messages arrive in id order and the other keys are not held back.

use std::collections::HashMap;

use sluice_testkit::*;
use sqlx::AssertSqlSafe;

#[tokio::test(flavor = "multi_thread")]
async fn key_order_holds_across_three_relays_and_retries_without_holding_back_other_keys() {
    let s = Scenario::new("ordering", &["order"]).await;
    // 400 rows over 20 keys k0..k19, plus key `slow` at ids 100, 200, 300, 400.
    let insert = format!(
        "INSERT INTO \"{}\" (tenant, aggregate_type, aggregate_id, event_type, payload)
         SELECT 'flaky', 'order', CASE WHEN g % 100 = 0 THEN 'slow' ELSE 'k' || (g % 20) END,
                'Changed', jsonb_build_object('n', g)
           FROM generate_series(1, 400) AS g",
        s.table.name
    );
    sqlx::query(AssertSqlSafe(insert))
        .execute(s.table.pg_pool())
        .await
        .unwrap();
    // Every `slow` row fails its first 3 attempts; retries come 300 ms apart.
    let extra = s.tenant(
        "flaky",
        "test_flaky",
        &format!(
            "topic_prefix = \"{}\", fail_attempts = 3, fail_aggregate_id = \"slow\"",
            s.prefix
        ),
    ) + "[relay.retry]\ninitial = \"300ms\"\nmultiplier = 1.0\njitter = 0.0\n";
    let config = s.config("batch_size = 50\nordering = \"key\"", &extra);
    let relays: Vec<RelayProcess> = (0..3)
        .map(|_| RelayProcess::start(&config).unwrap())
        .collect();

    let others = "SELECT count(*) FROM {t} WHERE aggregate_id <> 'slow'";
    let slow = "SELECT count(*) FROM {t} WHERE aggregate_id = 'slow'";
    let others_done = wait_until(SCENARIO_WAIT, || async {
        s.table.scalar_i64(others).await == 0
    })
    .await;
    assert!(others_done, "{}", relays[0].log());
    let slow_left = s.table.scalar_i64(slow).await;
    assert!(
        slow_left > 0,
        "other keys finished while `slow` was still retrying"
    );
    let drained = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "{}", relays[0].log());
    for relay in relays {
        let exit = relay.stop();
        assert!(exit.success, "{}", exit.log);
    }

    let got = s.consume(400, std::time::Duration::from_secs(2));
    assert_eq!(count_by_id(&got).len(), 400, "every row delivered");
    let mut by_key: HashMap<String, Vec<i64>> = HashMap::new();
    for m in &got {
        let id = m.header("id").unwrap().parse().unwrap();
        by_key.entry(m.key_str()).or_default().push(id);
    }
    assert_eq!(by_key.len(), 21);
    assert_eq!(by_key["slow"], vec![100, 200, 300, 400]);
    for (key, ids) in &by_key {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "key {key} out of order: {ids:?}"
        );
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_row_blocks_its_key_only_when_configured_to() {
    for mode in ["block", "skip"] {
        let s = Scenario::new(&format!("afterdead_{mode}"), &["order"]).await;
        let insert = format!(
            "INSERT INTO \"{}\" (tenant, aggregate_type, aggregate_id, event_type, payload)
             SELECT 'flaky', 'order', CASE WHEN g % 10 = 0 THEN 'doomed' ELSE 'k' || (g % 3) END,
                    'Changed', jsonb_build_object('n', g)
               FROM generate_series(1, 40) AS g",
            s.table.name
        );
        sqlx::query(AssertSqlSafe(insert))
            .execute(s.table.pg_pool())
            .await
            .unwrap();
        // Every first attempt of a `doomed` row fails, and one attempt is all a row gets.
        let extra = s.tenant(
            "flaky",
            "test_flaky",
            &format!(
                "topic_prefix = \"{}\", fail_attempts = 1, fail_aggregate_id = \"doomed\"",
                s.prefix
            ),
        ) + "[relay.retry]\nmax_attempts = 1\n";
        let relay_extra = format!("ordering = \"key\"\nordering_after_dead = \"{mode}\"");
        let config = s.config(&relay_extra, &extra);
        let dead = "SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL";
        let others = "SELECT count(*) FROM {t} WHERE aggregate_id <> 'doomed'";
        let expected_dead = if mode == "block" { 1 } else { 4 };
        s.relay_until(&config, || async {
            s.table.scalar_i64(others).await == 0 && s.table.scalar_i64(dead).await == expected_dead
        })
        .await;
        let untried = "SELECT count(*) FROM {t} WHERE aggregate_id = 'doomed' AND attempts = 0";
        if mode == "block" {
            // Every other key drained, yet rows 20, 30, 40 still wait behind dead row 10.
            assert_eq!(s.table.scalar_i64(untried).await, 3, "later rows held back");
            let first_dead = "SELECT min(id) FROM {t} WHERE dead_at IS NOT NULL";
            assert_eq!(s.table.scalar_i64(first_dead).await, 10);
        } else {
            assert_eq!(
                s.table.scalar_i64(untried).await,
                0,
                "later rows were attempted"
            );
        }
        s.finish().await;
    }
}
