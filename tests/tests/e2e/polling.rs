//! When the relay polls: LISTEN/NOTIFY wake-ups with polling as the fallback, and several
//! batch workers per process sharing one table without publishing a row twice.

use std::time::{Duration, Instant};

use sluice_testkit::*;

fn migrate_with_trigger(table: &str, channel: &str) {
    let out = sluice(&[
        "migrate",
        "--database-url",
        &database_url(),
        "--table",
        table,
        "--notify-trigger",
        "--notify-channel",
        channel,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until the relay's log shows `needle`.
async fn log_shows(relay: &RelayProcess, needle: &str) -> bool {
    wait_until(SCENARIO_WAIT, || async { relay.log().contains(needle) }).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notification_wakes_an_idle_relay_long_before_its_next_poll() {
    let s = Scenario::new("notify", &["order", "customer"]).await;
    let channel = s.table.name.clone();
    migrate_with_trigger(&s.table.name, &channel);
    // Polls only once a minute: a row can arrive within seconds only through NOTIFY.
    let port = sluice_testkit::free_port();
    let config = s.config(
        &format!(
            "min_poll_interval = \"60s\"\nnotify_channel = \"{channel}\"\n[relay.retry]\ninitial = \"1s\""
        ),
        &format!("[telemetry]\nlisten = \"127.0.0.1:{port}\"\n"),
    )
    .replace("poll_interval = \"100ms\"", "poll_interval = \"60s\"");
    let relay = RelayProcess::start(&config).unwrap();
    assert!(
        log_shows(&relay, "listening for notifications").await,
        "{}",
        relay.log()
    );
    // Let the relay's start-up poll pass, so it is asleep when the rows come.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let inserted = Instant::now();
    s.table.insert_rows(10, None).await;
    let delivered = wait_until(Duration::from_secs(20), || async {
        s.table.count().await == 0
    })
    .await;
    let took = inserted.elapsed();
    assert!(delivered, "rows not delivered: {}", relay.log());
    assert!(
        took < Duration::from_secs(20),
        "took {took:?}, as long as polling would"
    );
    // The metrics say why the idle wait ended: a notification, not the (minute-long) timer.
    let (code, text) = http_get(port, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    let m = parse_metrics(&text);
    assert!(
        metric_sum(&m, "sluice_poll_wakeups_total", &["cause=\"notify\""]) >= 1.0,
        "{text}"
    );
    assert_eq!(
        metric_sum(&m, "sluice_poll_wakeups_total", &["cause=\"timer\""]),
        0.0,
        "{text}"
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert_eq!(s.consume(10, Duration::from_millis(500)).len(), 10);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_notifications_polling_still_delivers() {
    // LISTEN on a channel nobody notifies (no trigger; as behind PgBouncer in transaction
    // mode): rows arrive through polling.
    let s = Scenario::new("nonotify", &["order", "customer"]).await;
    let config = s.config("notify_channel = \"sluice_nobody_notifies\"", "");
    let relay = RelayProcess::start(&config).unwrap();
    s.table.insert_rows(30, None).await;
    let delivered = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(delivered, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert_eq!(s.consume(30, Duration::from_millis(500)).len(), 30);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_installs_and_drops_the_notify_trigger_idempotently() {
    let table = DbTable::create(Database::Postgres, "trigger").await;
    migrate_with_trigger(&table.name, "chan_a");
    migrate_with_trigger(&table.name, "chan_b");
    let triggers = format!(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = '\"{}\"'::regclass AND NOT tgisinternal",
        table.name
    );
    assert_eq!(table.scalar_i64(&triggers).await, 1);
    let bad = sluice(&[
        "migrate",
        "--database-url",
        &database_url(),
        "--table",
        &table.name,
        "--notify-trigger",
        "--notify-channel",
        "no-dashes; allowed",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--notify-channel"));
    let drop = sluice(&[
        "migrate",
        "--database-url",
        &database_url(),
        "--table",
        &table.name,
        "--drop-notify-trigger",
    ]);
    assert!(drop.status.success());
    assert_eq!(table.scalar_i64(&triggers).await, 0);
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn four_workers_publish_and_mark_every_row_exactly_once() {
    let s = Scenario::new("workers", &["order", "customer"]).await;
    s.table.insert_rows(8_000, None).await;
    let exit = s
        .relay_until(&s.config("workers = 4\nbatch_size = 100", ""), || async {
            s.table.count().await == 0
        })
        .await;
    assert!(exit.log.contains("workers=4"), "{}", exit.log);
    let got = s.consume(8_000, Duration::from_secs(2));
    let counts = count_by_id(&got);
    assert_eq!(counts.len(), 8_000);
    assert!(
        counts.values().all(|&n| n == 1),
        "a row was published twice"
    );
    s.finish().await;
}
