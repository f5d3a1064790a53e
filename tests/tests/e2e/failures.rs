//! Crash safety: relays killed with SIGKILL while rows keep arriving, and database backends
//! terminated mid-batch. Afterwards every inserted row is in Kafka at least once and the
//! outbox is drained.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice_testkit::*;

/// Inserts `per_tick` rows every 20 ms until `stop` is set; returns how many it inserted.
fn load_generator(
    table: &DbTable,
    per_tick: i64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<i64> {
    let table = table.clone();
    tokio::spawn(async move {
        let mut inserted = 0;
        while !stop.load(Ordering::Relaxed) {
            table.insert_rows(per_tick, None).await;
            inserted += per_tick;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        inserted
    })
}

fn assert_all_delivered(s: &Scenario, inserted: i64, got: &[Received]) -> usize {
    let counts = count_by_id(got);
    let missing: Vec<i64> = (1..=inserted)
        .filter(|id| !counts.contains_key(&id.to_string()))
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "rows lost (first few): {missing:?} of {}",
        s.table.name
    );
    counts.values().map(|c| c - 1).sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn relays_killed_twenty_times_under_load_lose_no_row() {
    let s = Scenario::new("crash", &["order", "customer"]).await;
    let stop = Arc::new(AtomicBool::new(false));
    // Faster than one relay drains in a debug build, so every relay is killed mid-work.
    let generator = load_generator(&s.table, 50, Arc::clone(&stop));
    let config = s.config("batch_size = 200", "");

    // bench/crash runs this test with more cycles.
    let cycles: u64 = std::env::var("SLUICE_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    for cycle in 0..cycles {
        let relay = RelayProcess::start(&config).unwrap();
        // Kill only once the relay is at work (start-up takes a while on a busy machine),
        // at a varying point so kills land in different stages of a batch.
        let working = wait_until(SCENARIO_WAIT, || async {
            relay.log().contains("batch committed")
        })
        .await;
        assert!(working, "relay never committed a batch: {}", relay.log());
        tokio::time::sleep(Duration::from_millis(20 + (cycle * 37) % 300)).await;
        relay.kill();
    }
    stop.store(true, Ordering::Relaxed);
    let inserted = generator.await.unwrap();

    // A last relay drains what is left and stops cleanly.
    s.relay_until(&config, || async { s.table.count().await == 0 })
        .await;
    let got = s.consume(inserted as usize, Duration::from_secs(3));
    let duplicates = assert_all_delivered(&s, inserted, &got);
    println!(
        "crash test: {cycles} kill -9 cycles, {inserted} rows inserted, 0 lost, \
         {duplicates} duplicates, {} messages",
        got.len()
    );
    // Duplicates come only from batches in flight at a kill: at most one batch per worker
    // (2 by default) per kill.
    assert!(
        duplicates <= (cycles as usize) * 2 * 200,
        "{duplicates} duplicates"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn terminated_database_backends_mid_batch_lose_no_row() {
    let s = Scenario::new("pgkill", &["order", "customer"]).await;
    let n: i64 = 10_000;
    s.table.insert_rows(n, None).await;
    // Its own application_name, so only this relay's connections are terminated, not those
    // of the tests running beside it.
    let name = unique("pgkill");
    let config = with_database_url(
        &s.config("batch_size = 100", ""),
        &format!("{}?application_name={name}", database_url()),
    );
    assert!(config.contains(&name), "{config}");
    let relay = RelayProcess::start(&config).unwrap();

    // Terminate the relay's connections repeatedly while it drains.
    let mut terminated = 0;
    for _ in 0..40 {
        if s.table.count().await == 0 {
            break;
        }
        let killed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE application_name = $1 AND pid <> pg_backend_pid()) t",
        )
        .bind(&name)
        .fetch_one(s.table.pg_pool())
        .await
        .unwrap();
        terminated += killed;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let drained = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "{}", relay.log());
    let exit = relay.stop();
    assert!(
        exit.success,
        "the relay survives and stops cleanly: {}",
        exit.log
    );
    assert!(terminated > 0, "no backend was terminated");
    // A connection cut during a claim fails the batch; one cut during the commit gets the
    // published batch's outcome settled on a fresh connection.
    assert!(
        exit.log.contains("batch failed") || exit.log.contains("batch commit failed"),
        "the relay saw its connection die"
    );

    let got = s.consume(n as usize, Duration::from_secs(2));
    let duplicates = assert_all_delivered(&s, n, &got);
    println!(
        "pg_terminate_backend: {terminated} backends terminated, {n} rows, 0 lost, {duplicates} duplicates"
    );
    s.finish().await;
}
