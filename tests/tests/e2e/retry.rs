//! Retry policy and dead letters: backoff timing, max attempts, permanent errors, the
//! dead-letter topic, and `sluice dead list|replay`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use sluice_testkit::*;

fn dead_count() -> &'static str {
    "SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL"
}

#[tokio::test(flavor = "multi_thread")]
async fn retries_follow_the_backoff_policy_and_the_row_dies_at_max_attempts() {
    let s = Scenario::new("backoff", &["order", "customer"]).await;
    s.table.insert_rows(1, Some("flaky")).await;
    let extra = s.tenant(
        "flaky",
        "test_flaky",
        &format!("topic_prefix = \"{}\", fail_attempts = 100", s.prefix),
    ) + "circuit_breaker_failures = 1000\n"
        + "[relay.retry]\ninitial = \"300ms\"\nmultiplier = 2.0\njitter = 0.0\nmax_attempts = 4\n";
    // Each change of `attempts`, stamped with the time of the transaction that made it (the
    // `now()` the relay's due check and its `next_attempt_at` use): gaps measured by the
    // database, not by when this test happened to look.
    let log = format!("{}_attempts", s.table.name);
    s.table
        .execute(&format!(
            "CREATE TABLE \"{log}\" (attempts int, at timestamptz);
             CREATE FUNCTION \"{log}_fn\"() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN INSERT INTO \"{log}\" VALUES (NEW.attempts, now()); RETURN NEW; END $$;
             CREATE TRIGGER \"{log}_tr\" AFTER UPDATE OF attempts ON {{t}} FOR EACH ROW
               WHEN (NEW.attempts IS DISTINCT FROM OLD.attempts) EXECUTE FUNCTION \"{log}_fn\"();"
        ))
        .await;
    let relay = RelayProcess::start(
        &s.config("poll_interval = \"20ms\"", &extra)
            .replace("poll_interval = \"100ms\"\n", ""),
    )
    .unwrap();

    // Record when each attempt lands in the table.
    let mut seen: Vec<(i64, Instant)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let attempts = s
            .table
            .scalar_i64("SELECT max(attempts)::int8 FROM {t}")
            .await;
        if seen.last().is_none_or(|(a, _)| *a != attempts) {
            seen.push((attempts, Instant::now()));
        }
        if s.table.scalar_i64(dead_count()).await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    // The first attempt may land before the first look (the relay starts fast from the compile
    // cache); the retries, hundreds of ms apart, are all seen.
    seen.retain(|(a, _)| *a > 0);
    let attempts: Vec<i64> = seen.iter().map(|(a, _)| *a).collect();
    assert_eq!(attempts, vec![1, 2, 3, 4], "{}", exit.log);
    assert_eq!(
        s.table.scalar_i64(dead_count()).await,
        1,
        "dead after max_attempts"
    );
    let stamps = s
        .table
        .text_rows(&format!(
            "SELECT attempts::text, (extract(epoch FROM at) * 1000)::int8::text
               FROM \"{log}\" ORDER BY at, attempts"
        ))
        .await;
    let at_ms: Vec<(i64, i64)> = stamps
        .iter()
        .map(|r| {
            let num = |i: usize| r[i].as_deref().unwrap_or("0").parse::<i64>().unwrap();
            (num(0), num(1))
        })
        .collect();
    assert_eq!(
        at_ms.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    for (k, expected_ms) in [(1usize, 300i64), (2, 600), (3, 1200)] {
        let gap = at_ms[k].1 - at_ms[k - 1].1;
        assert!(
            gap + 60 >= expected_ms && gap <= expected_ms + 700,
            "retry {k}: waited {gap} ms, policy says {expected_ms} ms"
        );
    }
    let (_, _, error) = s.table.unsent_rows().await.remove(0);
    assert!(error.unwrap_or_default().contains("fails on purpose"));
    s.table
        .execute(&format!(
            "DROP TRIGGER \"{log}_tr\" ON {{t}}; DROP FUNCTION \"{log}_fn\"(); DROP TABLE \"{log}\";"
        ))
        .await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn permanent_errors_dead_letter_at_once_with_a_copy_on_the_dead_letter_topic() {
    let s = Scenario::new("dlq", &["order", "customer", "dlq"]).await;
    s.table.insert_rows(5, Some("refuser")).await;
    let dlq = format!("{}dlq", s.prefix);
    let extra = s.tenant("refuser", "test_fail_permanent", "")
        + "circuit_breaker_failures = 1000\n"
        + &format!("[relay.retry]\ndead_letter_topic = \"{dlq}\"\n");
    s.relay_until(&s.config("", &extra), || async {
        s.table.scalar_i64(dead_count()).await == 5
    })
    .await;
    let attempts = "SELECT count(*) FROM {t} WHERE attempts = 1 AND next_attempt_at IS NULL";
    assert_eq!(
        s.table.scalar_i64(attempts).await,
        5,
        "dead on the first attempt"
    );

    let copies = consume(
        &kafka_bootstrap(),
        &[dlq],
        5,
        SCENARIO_WAIT,
        Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(copies.len(), 5);
    let ids: HashSet<String> = copies
        .iter()
        .filter_map(|m| m.header("sluice-outbox-id"))
        .collect();
    assert_eq!(ids.len(), 5);
    for m in &copies {
        let id: i64 = m.header("sluice-outbox-id").unwrap().parse().unwrap();
        assert!(
            m.header("sluice-error")
                .unwrap()
                .contains("schema-mismatch")
        );
        assert_eq!(m.header("sluice-attempts").as_deref(), Some("1"));
        assert_eq!(m.header("sluice-tenant").as_deref(), Some("refuser"));
        assert_eq!(
            m.payload_json(),
            serde_json::json!({ "n": id }),
            "original payload"
        );
    }

    let listed = sluice(&[
        "dead",
        "list",
        "--database-url",
        &database_url(),
        "--table",
        &s.table.name,
        "--tenant",
        "refuser",
    ]);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let text = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(text.lines().count(), 6, "header + 5 rows:\n{text}");
    assert!(text.contains("schema-mismatch"), "{text}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replayed_dead_rows_are_delivered() {
    // Only the `order` topic exists at first: `customer` rows die on their first attempt.
    let s = Scenario::new("replay", &["order"]).await;
    s.table.insert_rows(4, None).await;
    let config = s.config("", "[relay.retry]\nmax_attempts = 1\n").replace(
        "[kafka]\n",
        "[kafka]\n\"topic.metadata.propagation.max.ms\" = 1500\n\"message.timeout.ms\" = 5000\n",
    );
    s.relay_until(&config, || async {
        s.table.count().await == 2 && s.table.scalar_i64(dead_count()).await == 2
    })
    .await;

    let customer = format!("{}customer", s.prefix);
    create_topics(&kafka_bootstrap(), std::slice::from_ref(&customer))
        .await
        .unwrap();
    let first_dead = s
        .table
        .scalar_i64("SELECT min(id) FROM {t}")
        .await
        .to_string();
    let target = ["--database-url", &database_url(), "--table", &s.table.name];
    let one = sluice(&[&["dead", "replay", "--id", &first_dead][..], &target[..]].concat());
    assert_eq!(
        String::from_utf8_lossy(&one.stdout).trim(),
        "1 dead rows are due again"
    );
    let rest = sluice(&[&["dead", "replay", "--all"][..], &target[..]].concat());
    assert_eq!(
        String::from_utf8_lossy(&rest.stdout).trim(),
        "1 dead rows are due again"
    );
    assert_eq!(s.table.scalar_i64(dead_count()).await, 0);

    s.relay_until(&config, || async { s.table.count().await == 0 })
        .await;
    let got = consume(
        &kafka_bootstrap(),
        &[customer],
        2,
        SCENARIO_WAIT,
        Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(got.len(), 2, "replayed rows delivered");
    s.finish().await;
}
