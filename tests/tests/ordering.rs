//! `relay.ordering = "key"`: with three relays and a key whose rows fail transiently, every
//! key's messages arrive in id order and the other keys are not held back.

use std::collections::HashMap;

use sluice_e2e::*;
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
        .execute(&s.table.pool)
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
