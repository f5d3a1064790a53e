//! MySQL/MariaDB and SQLite end to end, through `sluice run` (and `sluice drain`) to Tansu:
//! a backlog delivered exactly once, no row lost across `kill -9` of relays mid-batch, the
//! application's inserts never waiting on a relay (MariaDB: while its claim is held open by a
//! stalled broker; SQLite: while a drain runs, from another process).

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice_testkit::*;
use sluice_testkit::{Database, DbTable, OwnTansu, free_port};
use sqlx::{AssertSqlSafe, Connection};

/// The ids of every row in the table, as text (what the `id` header carries).
async fn table_ids(table: &DbTable) -> HashSet<String> {
    table.ids().await.iter().map(i64::to_string).collect()
}

/// Topics of the reference plugin for `table`, created on `bootstrap`.
pub(crate) async fn topics_for(table: &DbTable, bootstrap: &str) -> (String, Vec<String>) {
    let prefix = format!("{}.", table.name);
    let topics = vec![format!("{prefix}order"), format!("{prefix}customer")];
    let created = wait_until(Duration::from_secs(20), || async {
        create_topics(bootstrap, &topics).await.is_ok()
    })
    .await;
    assert!(created, "cannot create topics on {bootstrap}");
    (prefix, topics)
}

async fn run_until_empty(table: &DbTable, config: &str, unsent: &str) -> RelayExit {
    let relay = RelayProcess::start(config).expect("start relay");
    let drained = wait_until(SCENARIO_WAIT, || async {
        table.scalar_i64(unsent).await == 0
    })
    .await;
    assert!(
        drained,
        "the relay did not drain {}: {}",
        table.name,
        relay.log()
    );
    // The table may be empty before the relay has even started (the relays killed before it
    // can have sent every row): a SIGTERM before its signal handlers exist would kill it
    // rather than stop it.
    let started = relay.wait_started(SCENARIO_WAIT).await;
    assert!(started, "the relay did not start: {}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "relay did not exit 0: {}", exit.log);
    exit
}

async fn backlog_is_delivered_exactly_once(kind: Database) {
    let table = DbTable::create(kind, "exactly").await;
    let bootstrap = kafka_bootstrap();
    let (prefix, topics) = topics_for(&table, &bootstrap).await;
    let n = 3_000;
    table.insert_rows(n, None).await;
    let ids = table_ids(&table).await;
    assert_eq!(ids.len(), n as usize);
    let config = table.config(&bootstrap, &prefix, "", "", "");
    let exit = run_until_empty(&table, &config, "SELECT COUNT(*) FROM {t}").await;
    assert_eq!(exit.rows_sent(), Some(n as u64), "{}", exit.log);
    let got = consume(
        &bootstrap,
        &topics,
        n as usize,
        SCENARIO_WAIT,
        Duration::from_secs(2),
    )
    .expect("consume");
    let counts = count_by_id(&got);
    let delivered: HashSet<String> = counts.keys().cloned().collect();
    assert_eq!(delivered, ids, "every row, and only the table's rows");
    let twice: Vec<(&String, &usize)> = counts.iter().filter(|(_, c)| **c > 1).take(5).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let sample = got
        .iter()
        .find(|m| m.header("id").is_some())
        .expect("a message");
    assert!(sample.topic.starts_with(&prefix));
    assert!(
        sample.payload_json().get("n").is_some(),
        "the JSON payload arrives as written"
    );
    assert!(
        sample
            .header("trace")
            .is_some_and(|t| t.starts_with("trace-"))
    );
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_backlog_is_delivered_exactly_once() {
    backlog_is_delivered_exactly_once(Database::Mariadb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_backlog_is_delivered_exactly_once() {
    backlog_is_delivered_exactly_once(Database::Sqlite).await;
}

/// Relays killed with SIGKILL at varying points of their batches while rows keep arriving;
/// then one drains the rest. Rows are marked `published_at` so the table still lists every
/// row at the end: each must have reached Kafka.
async fn relays_killed_mid_batch_lose_no_row(
    kind: Database,
    database_extra: &str,
    kafka_extra: &str,
) {
    let table = Arc::new(DbTable::create(kind, "kill").await);
    let bootstrap = kafka_bootstrap();
    let (prefix, topics) = topics_for(&table, &bootstrap).await;
    let config = table.config(
        &bootstrap,
        &prefix,
        database_extra,
        "batch_size = 200\nmark = \"published_at\"",
        kafka_extra,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let generator = {
        let (table, stop) = (Arc::clone(&table), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut inserted = 0;
            while !stop.load(Ordering::Relaxed) {
                table.insert_rows(50, None).await;
                inserted += 50;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            inserted
        })
    };
    let cycles = 5u64;
    for cycle in 0..cycles {
        let relay = RelayProcess::start(&config).unwrap();
        let working = wait_until(SCENARIO_WAIT, || async {
            relay.log().contains("batch committed")
        })
        .await;
        assert!(working, "relay never committed a batch: {}", relay.log());
        tokio::time::sleep(Duration::from_millis(20 + (cycle * 53) % 300)).await;
        relay.kill();
    }
    stop.store(true, Ordering::Relaxed);
    let inserted: i64 = generator.await.unwrap();
    assert_eq!(table.count().await, inserted);

    run_until_empty(
        &table,
        &config,
        "SELECT COUNT(*) FROM {t} WHERE published_at IS NULL",
    )
    .await;
    let ids = table_ids(&table).await;
    let got = consume(
        &bootstrap,
        &topics,
        ids.len(),
        SCENARIO_WAIT,
        Duration::from_secs(2),
    )
    .expect("consume");
    let counts = count_by_id(&got);
    let lost: Vec<&String> = ids
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .take(10)
        .collect();
    assert!(lost.is_empty(), "rows lost (first few): {lost:?}");
    let duplicates: usize = counts.values().map(|c| c - 1).sum();
    println!("{kind:?}: {cycles} kill -9 cycles, {inserted} rows, 0 lost, {duplicates} duplicates");
    if let Ok(table) = Arc::try_unwrap(table) {
        table.drop_table().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_relays_killed_mid_batch_lose_no_row() {
    relays_killed_mid_batch_lose_no_row(Database::Mariadb, "", "").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_relays_killed_mid_batch_lose_no_row() {
    // A killed relay's leases expire before its rows are claimed again: a short producer
    // timeout allows a short lease, which keeps the test short.
    relays_killed_mid_batch_lose_no_row(
        Database::Sqlite,
        "lease = \"35s\"",
        "\"message.timeout.ms\" = 5000",
    )
    .await;
}

/// The open transactions of other sessions that hold row locks in the outbox's database, and
/// how many rows each locks.
async fn locking_transactions(table: &DbTable) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT CAST(trx_rows_locked AS SIGNED) FROM information_schema.INNODB_TRX
          WHERE trx_mysql_thread_id <> CONNECTION_ID() AND trx_rows_locked > 0",
    )
    .fetch_all(table.mysql_pool())
    .await
    .expect("INNODB_TRX")
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_inserts_do_not_wait_while_a_claim_waits_for_a_stalled_broker() {
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let tansu = OwnTansu::start(port);
    let table = DbTable::create(Database::Mariadb, "stalled").await;
    let (prefix, topics) = topics_for(&table, &bootstrap).await;
    let config = table.config(
        &bootstrap,
        &prefix,
        "",
        "",
        "\"message.timeout.ms\" = 60000",
    );
    let relay = RelayProcess::start(&config).unwrap();
    // The relay talks to the broker once, so the stall hits a working producer.
    table.insert_rows(10, None).await;
    let warm = wait_until(SCENARIO_WAIT, || async { table.count().await == 0 }).await;
    assert!(warm, "{}", relay.log());

    tansu.signal("STOP");
    table.insert_rows(100, None).await;
    let held = wait_until(Duration::from_secs(30), || async {
        locking_transactions(&table)
            .await
            .iter()
            .any(|&rows| rows >= 100)
    })
    .await;
    assert!(held, "the relay never held a claim open: {}", relay.log());

    // From a connection of its own, as the application's, unwilling to wait for locks.
    let mut app = sqlx::MySqlConnection::connect(&table.url).await.unwrap();
    sqlx::query("SET SESSION innodb_lock_wait_timeout = 3")
        .execute(&mut app)
        .await
        .unwrap();
    let mut slowest = Duration::ZERO;
    for n in 0..20 {
        let started = Instant::now();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO `{}` (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', 'late-{n}', 'OrderCreated', '{{}}')",
            table.name
        )))
        .execute(&mut app)
        .await
        .expect("an insert must not wait for the relay's open claim");
        slowest = slowest.max(started.elapsed());
    }
    assert!(
        !locking_transactions(&table).await.is_empty(),
        "the claim was still open during the inserts"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "slowest insert took {slowest:?}"
    );
    println!("insert while claimed (MariaDB, broker stalled): 20 inserts, slowest {slowest:?}");

    tansu.signal("CONT");
    let drained = wait_until(SCENARIO_WAIT, || async { table.count().await == 0 }).await;
    assert!(drained, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    let got = consume(
        &bootstrap,
        &topics,
        130,
        SCENARIO_WAIT,
        Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(
        count_by_id(&got).len(),
        130,
        "every row, the late ones included"
    );
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_the_application_keeps_writing_from_another_process_during_a_drain() {
    let table = DbTable::create(Database::Sqlite, "drainwrite").await;
    let bootstrap = kafka_bootstrap();
    let (prefix, topics) = topics_for(&table, &bootstrap).await;
    let backlog = 10_000;
    table.insert_rows(backlog, None).await;
    let config = table.config(&bootstrap, &prefix, "", "", "");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, &config).unwrap();
    let mut drain = Command::new(sluice_bin())
        .args(["drain", "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("start sluice drain");

    // This test process is the application: one-row write transactions (about 100 rows/s)
    // while the drain runs. (Far more write transactions than that slow the relay down:
    // SQLite's busy handler retries a waiting writer with sleeps of up to 100 ms.) One row at a
    // time keeps enough inserts inside even a fast (under a second) drain to measure them.
    let mut latencies = Vec::new();
    let started = Instant::now();
    while drain.try_wait().unwrap().is_none() {
        if started.elapsed() > SCENARIO_WAIT {
            let _ = drain.kill();
            panic!("the drain did not finish within {SCENARIO_WAIT:?}");
        }
        let t = Instant::now();
        table.insert_rows(1, None).await;
        latencies.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = drain.wait().unwrap();
    assert!(status.success(), "sluice drain: {status}");
    assert!(
        latencies.len() >= 10,
        "only {} inserts during the drain",
        latencies.len()
    );
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    let max = latencies[latencies.len() - 1];
    // A write blocked behind a relay's transaction would wait out the busy timeout (seconds).
    assert!(max < Duration::from_secs(2), "slowest insert took {max:?}");
    let inserted_meanwhile = latencies.len();
    println!(
        "SQLite: {inserted_meanwhile} rows inserted from another process during a {backlog}-row \
         drain of {:?}; insert p99 {p99:?}, max {max:?}",
        started.elapsed()
    );

    // A second drain delivers what arrived meanwhile; every row arrives once.
    let out = sluice(&["drain", "--config", &path.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(table.count().await, 0);
    let total = backlog as usize + inserted_meanwhile;
    let got = consume(
        &bootstrap,
        &topics,
        total,
        SCENARIO_WAIT,
        Duration::from_secs(2),
    )
    .unwrap();
    let counts: HashMap<String, usize> = count_by_id(&got);
    assert_eq!(counts.len(), total, "every row delivered");
    assert!(counts.values().all(|&c| c == 1), "and once");
    table.drop_table().await;
}
