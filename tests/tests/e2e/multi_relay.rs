//! Several `sluice run` processes on one outbox table, on every database: three relays with
//! `relay.ordering = "key"` share a table (PostgreSQL and MariaDB: row locks; SQLite: leases,
//! one WAL file written by four processes) while rows of several tenants keep arriving, and
//! one relay after another is killed with SIGKILL and started again. Afterwards every row
//! reached Kafka at least once, the duplicates stay within what the killed batches held, and
//! each key's rows were first delivered in id order.
//!
//! The broker is the test's own, behind a proxy that adds latency: a batch then spends most of
//! its time waiting for acknowledgements, so a kill lands in the middle of one (with a broker
//! that answers in a millisecond the relays idle between polls, and most kills would find
//! nothing in flight).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice_testkit::stall::StallingProxy;
use sluice_testkit::*;
use sluice_testkit::{OwnTansu, TansuLaunch, free_port};

use crate::databases::topics_for;

/// Relays sharing the table.
const RELAYS: usize = 3;
/// `[relay] batch_size` and `workers` of each relay: a killed relay had at most
/// `WORKERS * BATCH_SIZE` rows in flight.
const BATCH_SIZE: usize = 50;
const WORKERS: usize = 2;
/// The application's tenants, and the aggregates of each (of both aggregate types): 64 keys.
const TENANTS: usize = 4;
const AGGREGATES: usize = 8;
/// Rows the application inserts every [`INSERT_EVERY`]: about 200 rows/s, below what the
/// relays publish in key order (at most one row per key in flight, each for a round trip of
/// about 2 × [`BROKER_LATENCY`]: ~500 rows/s), so the backlog stays small.
const ROWS_PER_INSERT: usize = 10;
const INSERT_EVERY: Duration = Duration::from_millis(50);
/// What the proxy adds to each way between the relays and the broker.
const BROKER_LATENCY: Duration = Duration::from_millis(50);
/// How long relays are killed and restarted, one after another.
const KILL_LOOP: Duration = Duration::from_secs(12);
/// How long a relay works before it is killed (plus a varying part, so kills land in
/// different stages of a batch).
const WORK_BEFORE_KILL: Duration = Duration::from_millis(1200);

/// Inserts [`ROWS_PER_INSERT`] rows every [`INSERT_EVERY`] until `stop` is set, spread over
/// the tenants and their keys; returns how many it inserted. One multi-row `INSERT` with
/// literals, which every database takes as it is.
fn application(table: &DbTable, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<usize> {
    let table = table.clone();
    tokio::spawn(async move {
        let mut inserted = 0;
        while !stop.load(Ordering::Relaxed) {
            let rows: Vec<String> = (inserted..inserted + ROWS_PER_INSERT)
                .map(|n| {
                    let tenant = format!("t{}", n % TENANTS);
                    let kind = if (n / TENANTS).is_multiple_of(2) {
                        "order"
                    } else {
                        "customer"
                    };
                    // The tenant is part of the aggregate id, so the consumer's key (the
                    // aggregate id) tells tenants apart as the relay's key does.
                    let aggregate = format!("{tenant}-a{}", (n / (TENANTS * 2)) % AGGREGATES);
                    format!("('{tenant}', '{kind}', '{aggregate}', 'Changed', '{{\"n\": {n}}}')")
                })
                .collect();
            table
                .execute(&format!(
                    "INSERT INTO {{t}} (tenant, aggregate_type, aggregate_id, event_type, payload)
                     VALUES {}",
                    rows.join(", ")
                ))
                .await;
            inserted += ROWS_PER_INSERT;
            tokio::time::sleep(INSERT_EVERY).await;
        }
        inserted
    })
}

/// What the consumer saw: rows lost, duplicates, and keys whose first deliveries were out of
/// id order.
struct Delivery {
    lost: Vec<String>,
    duplicates: usize,
    out_of_order: Vec<String>,
    keys: usize,
}

/// Checks `messages` (in the order a partition holds them; each key is in one partition)
/// against the table's `ids`. A key's first deliveries must come in id order; a duplicate may
/// come later (a killed relay's batch published again), but after a newer row of its key was
/// delivered, an older row must never arrive for the first time.
fn check_delivery(ids: &HashSet<String>, messages: &[Received]) -> Delivery {
    let counts = count_by_id(messages);
    let mut lost: Vec<String> = ids
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .cloned()
        .collect();
    lost.sort();
    let duplicates = counts.values().map(|c| c - 1).sum();
    let mut seen: HashSet<i64> = HashSet::new();
    let mut newest: HashMap<(String, String), i64> = HashMap::new();
    let mut out_of_order = Vec::new();
    for m in messages {
        let Some(id) = m.header("id").and_then(|id| id.parse::<i64>().ok()) else {
            continue;
        };
        if !seen.insert(id) {
            continue;
        }
        let key = (m.topic.clone(), m.key_str());
        let last = newest.entry(key.clone()).or_insert(id);
        if id < *last {
            out_of_order.push(format!(
                "{}/{}: row {id} first delivered after row {last}",
                key.0, key.1
            ));
        }
        *last = (*last).max(id);
    }
    Delivery {
        lost,
        duplicates,
        out_of_order,
        keys: newest.len(),
    }
}

/// Starts a relay with `config` and waits until it is up (a SIGTERM sent before its signal
/// handlers exist would kill it instead of stopping it).
async fn started(config: &str) -> RelayProcess {
    let relay = RelayProcess::start(config).expect("start relay");
    let up = relay.wait_started(SCENARIO_WAIT).await;
    assert!(up, "the relay did not start: {}", relay.log());
    relay
}

/// The scenario of the module documentation on `kind`; `database_extra` and `kafka_extra` go
/// into `[database]` and `[kafka]`.
async fn three_relays_one_killed_in_a_loop(
    kind: Database,
    database_extra: &str,
    kafka_extra: &str,
) {
    let began = Instant::now();
    let kafka_port = free_port();
    let proxy = StallingProxy::start(&format!("127.0.0.1:{kafka_port}")).expect("start proxy");
    let _tansu = OwnTansu::launch(&TansuLaunch {
        port: kafka_port,
        // Every connection of a client goes through the proxy, not only the first.
        advertised_port: Some(proxy.port()),
        ..TansuLaunch::default()
    });
    let bootstrap = format!("127.0.0.1:{}", proxy.port());
    let table = DbTable::create(kind, "multi").await;
    let (prefix, topics) = topics_for(&table, &bootstrap).await;
    proxy.delay(BROKER_LATENCY);
    let config = table.config(
        &bootstrap,
        &prefix,
        database_extra,
        &format!(
            "batch_size = {BATCH_SIZE}\nworkers = {WORKERS}\nordering = \"key\"\n\
             mark = \"published_at\""
        ),
        kafka_extra,
    );
    let mut relays = Vec::with_capacity(RELAYS);
    for _ in 0..RELAYS {
        relays.push(started(&config).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let app = application(&table, Arc::clone(&stop));

    let mut kills = 0usize;
    let loop_began = Instant::now();
    while loop_began.elapsed() < KILL_LOOP {
        let victim = kills % RELAYS;
        let wait = WORK_BEFORE_KILL + Duration::from_millis((kills as u64 * 137) % 600);
        tokio::time::sleep(wait).await;
        for relay in &mut relays {
            relay.ensure_running().expect("a relay died on its own");
        }
        // Killed at work: it has published and marked rows, and most likely holds more.
        let working = wait_until(SCENARIO_WAIT, || async {
            relays[victim].log().contains("batch committed")
        })
        .await;
        assert!(working, "a relay never got rows: {}", relays[victim].log());
        relays.remove(victim).kill();
        kills += 1;
        relays.insert(victim, started(&config).await);
    }
    stop.store(true, Ordering::Relaxed);
    let inserted = app.await.expect("the application's inserts");

    // SQLite: the rows of the last killed relays' batches wait until their leases expire.
    let unsent = "SELECT COUNT(*) FROM {t} WHERE published_at IS NULL";
    let drained = wait_until(SCENARIO_WAIT, || async {
        table.scalar_i64(unsent).await == 0
    })
    .await;
    assert!(
        drained,
        "{} rows left unsent; a relay's log ends:\n{}",
        table.scalar_i64(unsent).await,
        relays[0].log_tail()
    );
    for relay in relays {
        let exit = relay.stop();
        assert!(exit.success, "a relay did not exit 0: {}", exit.log);
    }
    proxy.delay(Duration::ZERO);

    let ids: HashSet<String> = table.ids().await.iter().map(i64::to_string).collect();
    assert_eq!(ids.len(), inserted, "the table holds every inserted row");
    let got = consume(
        &bootstrap,
        &topics,
        ids.len(),
        SCENARIO_WAIT,
        Duration::from_secs(2),
    )
    .expect("consume");
    let delivery = check_delivery(&ids, &got);
    let first: Vec<&String> = delivery.lost.iter().take(10).collect();
    assert!(
        delivery.lost.is_empty(),
        "{kind:?}: {} rows lost (first few): {first:?}",
        delivery.lost.len()
    );
    assert!(
        delivery.out_of_order.is_empty(),
        "{kind:?}: key order broken: {:?}",
        &delivery.out_of_order[..delivery.out_of_order.len().min(10)]
    );
    assert_eq!(
        delivery.keys,
        TENANTS * 2 * AGGREGATES,
        "every tenant's keys"
    );
    // A row is published again only when a relay died between publishing it and marking it:
    // it was in one of the killed relay's batches in flight, at most `WORKERS` of at most
    // `BATCH_SIZE` rows (in key order even fewer: one row per key per claim). Relays stopped
    // with SIGTERM finish their batches, and no producer timed out (that would be another
    // source of duplicates), so each kill adds at most `WORKERS * BATCH_SIZE`.
    let bound = kills * WORKERS * BATCH_SIZE;
    assert!(
        delivery.duplicates <= bound,
        "{kind:?}: {} duplicates, more than {kills} kills can explain ({bound})",
        delivery.duplicates
    );
    println!(
        "{kind:?}: {RELAYS} relays, {kills} kill -9, {inserted} rows of {TENANTS} tenants, 0 lost, \
         {} duplicates (bound {bound}), {} keys in order, {:.1?}",
        delivery.duplicates,
        delivery.keys,
        began.elapsed()
    );
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_three_relays_one_killed_in_a_loop_lose_no_row_and_keep_key_order() {
    three_relays_one_killed_in_a_loop(Database::Postgres, "", "").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_three_relays_one_killed_in_a_loop_lose_no_row_and_keep_key_order() {
    three_relays_one_killed_in_a_loop(Database::Mariadb, "", "").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_three_relays_one_killed_in_a_loop_lose_no_row_and_keep_key_order() {
    // A killed relay's rows are claimed again once their lease expires, and a lease must
    // outlast the producer's timeout by 30 s: a short timeout keeps the wait (and the test)
    // short.
    three_relays_one_killed_in_a_loop(
        Database::Sqlite,
        "lease = \"35s\"",
        "\"message.timeout.ms\" = 5000",
    )
    .await;
}
