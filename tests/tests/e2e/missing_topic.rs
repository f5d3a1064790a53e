//! A tenant whose plugin routes rows to a topic its allow-list permits but the broker lacks.
//! Those rows fail at once (the sink asks the broker's metadata first) instead of holding
//! their batch for librdkafka's 30 s metadata wait, so every other row of the batch — the
//! tenant's own and other tenants' — is delivered on time, exactly once; and the refusals
//! count against the tenant's circuit breaker.

use std::time::{Duration, Instant};

use sluice_testkit::*;
use sqlx::AssertSqlSafe;

/// Far below the 30 s a batch with a missing topic used to wait, far above a normal delivery.
const ON_TIME: Duration = Duration::from_secs(10);
const WAVES: i64 = 5;

/// Inserts wave `wave`: 20 rows of tenant `good`, 20 of tenant `mixed`, two of which (one
/// in ten) are of aggregate type `ghost`, whose topic does not exist.
async fn insert_wave(s: &Scenario, wave: i64) {
    let sql = format!(
        "INSERT INTO \"{}\" (tenant, aggregate_type, aggregate_id, event_type, payload)
         SELECT CASE WHEN g <= 20 THEN 'good' ELSE 'mixed' END,
                CASE WHEN g > 20 AND g % 10 = 0 THEN 'ghost' ELSE 'order' END,
                'w' || $1 || '-' || g, 'Created', jsonb_build_object('wave', $1, 'g', g)
           FROM generate_series(1, 40) AS g",
        s.table.name
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(wave)
        .execute(s.table.pg_pool())
        .await
        .expect("insert wave");
}

async fn start(config: &str) -> RelayProcess {
    let relay = RelayProcess::start(config).expect("start relay");
    let started = relay.wait_started(SCENARIO_WAIT).await;
    assert!(started, "relay did not start: {}", relay.log());
    relay
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_routed_to_a_missing_topic_do_not_delay_the_other_rows_of_their_batches() {
    let s = Scenario::new("ghosttopic", &["order"]).await;
    // The breaker is kept out of the way here: this test is about latency, not pausing.
    let mixed = format!(
        "[tenants.mixed]\nallowed_topics = [\"{}*\"]\ncircuit_breaker_failures = 1000\n",
        s.prefix
    );
    let relay = start(&s.config("", &mixed)).await;

    for wave in 1..=WAVES {
        insert_wave(&s, wave).await;
        let inserted = Instant::now();
        let pending = format!(
            "SELECT count(*) FROM {{t}} WHERE aggregate_type = 'order' AND aggregate_id LIKE 'w{wave}-%'"
        );
        let delivered = wait_until(ON_TIME, || async {
            s.table.scalar_i64(&pending).await == 0
        })
        .await;
        assert!(
            delivered,
            "wave {wave}: good rows not delivered within {ON_TIME:?}: {}",
            relay.log()
        );
        println!(
            "wave {wave}: good rows delivered in {:?}",
            inserted.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The ghost rows failed with the reason, each as an attempt.
    let ghosts = "SELECT count(*) FROM {t} WHERE aggregate_type = 'ghost'
                   AND attempts >= 1 AND last_error LIKE '%ghost%no such topic%'";
    assert_eq!(
        s.table.scalar_i64(ghosts).await,
        2 * WAVES,
        "{}",
        relay.log()
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);

    let good = (38 * WAVES) as usize;
    let got = s.consume(good, Duration::from_secs(2));
    let counts = count_by_id(&got);
    assert_eq!(counts.len(), good, "every good row delivered");
    assert!(
        counts.values().all(|&n| n == 1),
        "exactly once: {:?}",
        counts.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
    s.finish().await;
}

/// Needs the sandbox side (`PluginRouter::record_publish` feeding the breaker): on a branch
/// without it the breaker never hears of the refusals and this test fails.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_whose_rows_all_go_to_a_missing_topic_is_paused_by_its_circuit_breaker() {
    let s = Scenario::new("ghostbreaker", &["order"]).await;
    let tenants = format!(
        "[tenants.lost]\nallowed_topics = [\"{}*\"]\ncircuit_breaker_failures = 3\n\
         circuit_breaker_cooldown = \"1m\"\n\
         [relay.retry]\ninitial = \"200ms\"\nmax = \"1s\"\nmax_attempts = 100\n",
        s.prefix
    );
    let relay = start(&s.config("", &tenants)).await;
    let sql = format!(
        "INSERT INTO \"{}\" (tenant, aggregate_type, aggregate_id, event_type, payload)
         SELECT CASE WHEN g % 2 = 0 THEN 'lost' ELSE 'good' END,
                CASE WHEN g % 2 = 0 THEN 'ghost' ELSE 'order' END,
                'a' || g, 'Created', '{{}}'
           FROM generate_series(1, 40) AS g",
        s.table.name
    );
    sqlx::query(AssertSqlSafe(sql))
        .execute(s.table.pg_pool())
        .await
        .unwrap();

    let good_done = wait_until(ON_TIME, || async {
        s.table
            .scalar_i64("SELECT count(*) FROM {t} WHERE tenant = 'good'")
            .await
            == 0
    })
    .await;
    assert!(
        good_done,
        "the other tenant is not held up: {}",
        relay.log()
    );
    let paused = wait_until(Duration::from_secs(30), || async {
        relay
            .log()
            .lines()
            .any(|l| l.contains("circuit breaker opened") && l.contains("lost"))
    })
    .await;
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(paused, "tenant lost was not paused: {}", exit.log);
    assert_eq!(
        count_by_id(&s.consume(20, Duration::from_secs(1))).len(),
        20
    );
    s.finish().await;
}
