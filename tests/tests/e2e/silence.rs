//! Dependencies that go silent: the database, the broker or the schema registry behind a proxy
//! that keeps every connection open and passes no byte for a while (a hung server, a silent
//! network partition), while the application keeps inserting rows. `/readyz` answers 503 and
//! `sluice_dependency_up` is 0 within the documented bound (`sample_interval` plus the check's
//! 5 s timeout), both recover within the same bound once the dependency answers again, no row
//! is lost and the backlog drains. A broker that is slow but answers keeps the relay ready;
//! a database and a broker silent together are each seen within the bound.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice_testkit::registry::TestRegistry;
use sluice_testkit::stall::StallingProxy;
use sluice_testkit::*;
use sluice_testkit::{OwnTansu, TansuLaunch, free_port};

/// `[telemetry] sample_interval` of these relays (the default is 15 s; short keeps the tests
/// short, the bound is the same formula).
const SAMPLE_INTERVAL: Duration = Duration::from_secs(2);
/// How long each check waits for its answer (database and broker: fixed; registry: its
/// default `[schema_registry] timeout`).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// The documented bound, both ways: the first check that starts after the dependency went
/// silent (or answers again) starts within a sample interval and ends within its timeout.
const BOUND: Duration = Duration::from_secs(SAMPLE_INTERVAL.as_secs() + CHECK_TIMEOUT.as_secs());
/// What a busy test machine adds to it (the probe's own period, scheduling).
const SLACK: Duration = Duration::from_secs(3);
/// How long a dependency stays silent: well past the bound, well within the producer's
/// `message.timeout.ms` (30 s), so no message times out meanwhile.
const SILENCE: Duration = Duration::from_secs(15);
/// How often the test asks `/readyz`.
const PROBE_EVERY: Duration = Duration::from_millis(250);
/// How long the backlog may take to drain once the dependency answers again.
const DRAIN_WAIT: Duration = Duration::from_secs(30);

/// `[telemetry]` on `port`, sampled every [`SAMPLE_INTERVAL`].
fn telemetry(port: u16) -> String {
    format!(
        "[telemetry]\nlisten = \"127.0.0.1:{port}\"\nsample_interval = \"{}s\"\n",
        SAMPLE_INTERVAL.as_secs()
    )
}

/// The `[relay]` lines: rows are stamped, not deleted, so the table still lists every row at
/// the end.
const RELAY: &str = "mark = \"published_at\"";

/// What `/readyz` on `port` answers (0: no answer).
fn readyz(port: u16) -> u16 {
    http_get(port, "/readyz").map_or(0, |(code, _)| code)
}

/// `sluice_dependency_up{dependency="<dependency>"}` on `port` (`None`: no scrape).
fn dependency_up(port: u16, dependency: &str) -> Option<f64> {
    let (_, text) = http_get(port, "/metrics").filter(|(code, _)| *code == 200)?;
    let label = format!("dependency=\"{dependency}\"");
    Some(metric_sum(
        &parse_metrics(&text),
        "sluice_dependency_up",
        &[&label],
    ))
}

/// Polls `/readyz` on `port` until `done(status, body)` holds, for at most `timeout`: how
/// long that took.
async fn readyz_until(
    port: u16,
    timeout: Duration,
    done: impl Fn(u16, &str) -> bool,
) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() <= timeout {
        if let Some((code, body)) = http_get(port, "/readyz")
            && done(code, &body)
        {
            return Some(started.elapsed());
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
    None
}

/// Polls `/readyz` on `port` until it answers `want`, for at most `timeout`: how long that
/// took.
async fn readyz_turns(port: u16, want: u16, timeout: Duration) -> Option<Duration> {
    readyz_until(port, timeout, |code, _| code == want).await
}

/// The application: inserts 5 rows every 200 ms until `stop` is set.
fn application(table: &DbTable, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let table = table.clone();
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            table.insert_rows(5, None).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// A relay (telemetry on `port`) reading `table`, and the dependencies that go silent: each
/// as `/readyz` and the metric's label name it, with the proxy its server is reached through.
struct Silenced<'a> {
    silent: &'a [(&'a str, &'a StallingProxy)],
    table: &'a DbTable,
    relay: RelayProcess,
    port: u16,
}

/// The scenario of the module documentation: the dependencies of `s` silent together for
/// [`SILENCE`] while rows arrive. Returns every row's id once the relay stopped, for the
/// caller to consume.
async fn rows_wait_out_the_silence(s: Silenced<'_>) -> HashSet<String> {
    let Silenced {
        silent,
        table,
        relay,
        port,
    } = s;
    let names: Vec<&str> = silent.iter().map(|(name, _)| *name).collect();
    let what = names.join(" and ");
    let ready = readyz_turns(port, 200, SCENARIO_WAIT).await;
    assert!(ready.is_some(), "never ready: {}", relay.log());
    let stop = Arc::new(AtomicBool::new(false));
    let app = application(table, Arc::clone(&stop));
    tokio::time::sleep(Duration::from_secs(2)).await;

    for (_, proxy) in silent {
        proxy.freeze();
    }
    let frozen = Instant::now();
    // Each of them seen as down, not only the first.
    let unready = readyz_until(port, BOUND + SLACK, |code, body| {
        code == 503
            && names
                .iter()
                .all(|name| body.contains(&format!("\"{name}\":false")))
    })
    .await;
    let up_while_silent: Vec<Option<f64>> =
        names.iter().map(|name| dependency_up(port, name)).collect();
    let body = http_get(port, "/readyz")
        .map(|(_, b)| b)
        .unwrap_or_default();
    // Once unready, it stays unready until the dependencies answer again.
    let mut ready_while_silent = 0;
    while unready.is_some() && frozen.elapsed() < SILENCE {
        if readyz(port) == 200 {
            ready_while_silent += 1;
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
    let backlog = table.unsent().await;
    for (_, proxy) in silent {
        proxy.thaw();
    }
    let thawed = Instant::now();
    let Some(unready) = unready else {
        panic!(
            "{what} silent: not seen within {:?}; /readyz said {body}; log: {}",
            BOUND + SLACK,
            relay.log_tail()
        );
    };
    assert!(
        up_while_silent.iter().all(|up| *up == Some(0.0)),
        "{what} silent: sluice_dependency_up {up_while_silent:?}"
    );
    assert_eq!(
        ready_while_silent,
        0,
        "{what} silent: /readyz answered 200 again: {}",
        relay.log_tail()
    );

    let ready_again = readyz_turns(port, 200, BOUND + SLACK).await;
    assert!(
        ready_again.is_some(),
        "{what} answer again: /readyz still 503 after {:?}: {}",
        BOUND + SLACK,
        relay.log_tail()
    );
    for name in &names {
        assert_eq!(dependency_up(port, name), Some(1.0), "{name} answers again");
    }
    stop.store(true, Ordering::Relaxed);
    app.await.expect("the application's inserts");
    let drained = wait_until(DRAIN_WAIT, || async { table.unsent().await == 0 }).await;
    assert!(
        drained,
        "{what}: {} rows still unsent {DRAIN_WAIT:?} after they answered again: {}",
        table.unsent().await,
        relay.log_tail()
    );
    let drain = thawed.elapsed();
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    let ids: HashSet<String> = table.ids().await.iter().map(i64::to_string).collect();
    println!(
        "{what} silent {SILENCE:?}: /readyz 503 after {unready:.1?} (bound {BOUND:?}), \
         200 again {:.1?} after the silence, {} rows inserted, {backlog} unsent at the end of \
         the silence, all sent {drain:.1?} after",
        ready_again.unwrap_or_default(),
        ids.len()
    );
    ids
}

/// Every id of `ids` in `got` (at least once).
/// [`assert_every_row`] of what `topics` on the broker at `bootstrap` hold.
fn assert_every_row_reached_the_broker(
    dependency: &str,
    ids: &HashSet<String>,
    bootstrap: &str,
    topics: &[String],
) {
    let got = consume(
        bootstrap,
        topics,
        ids.len(),
        SCENARIO_WAIT,
        Duration::from_secs(1),
    )
    .expect("consume");
    assert_every_row(dependency, ids, &got);
}

fn assert_every_row(dependency: &str, ids: &HashSet<String>, got: &[Received]) {
    let counts = count_by_id(got);
    let lost: Vec<&String> = ids
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .take(10)
        .collect();
    assert!(
        lost.is_empty(),
        "{dependency} silent: rows lost (first few): {lost:?}"
    );
}

/// A proxy in front of the tests' PostgreSQL server, and the database URL through it.
fn proxied_database() -> (StallingProxy, String) {
    let url = database_url();
    // postgres://user@host:port/db: the host and port go through the proxy.
    let (scheme_user, rest) = url.split_once('@').expect("a URL with user@host");
    let (address, database) = rest.split_once('/').expect("a URL with /database");
    let proxy = StallingProxy::start(address).expect("start the proxy");
    let proxied = format!("{scheme_user}@127.0.0.1:{}/{database}", proxy.port());
    (proxy, proxied)
}

/// A broker of the test's own on a free port (`host:port`, for more proxies in front of it)
/// that advertises the proxy returned: every connection a client makes after its first
/// request goes through that proxy.
fn proxied_broker() -> (OwnTansu, StallingProxy, String) {
    let kafka_port = free_port();
    let target = format!("127.0.0.1:{kafka_port}");
    let proxy = StallingProxy::start(&target).expect("start the broker proxy");
    let tansu = OwnTansu::launch(&TansuLaunch {
        port: kafka_port,
        advertised_port: Some(proxy.port()),
        ..TansuLaunch::default()
    });
    (tansu, proxy, target)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_database_makes_the_relay_unready_and_loses_no_row() {
    let s = Scenario::new("silent_db", &["order", "customer"]).await;
    let (proxy, proxied) = proxied_database();
    let port = free_port();
    let config = with_database_url(&s.config(RELAY, &telemetry(port)), &proxied);
    let relay = RelayProcess::start(&config).expect("start relay");
    let ids = rows_wait_out_the_silence(Silenced {
        silent: &[("database", &proxy)],
        table: &s.table,
        relay,
        port,
    })
    .await;
    assert_every_row(
        "database",
        &ids,
        &s.consume(ids.len(), Duration::from_secs(1)),
    );
    s.finish().await;
}

/// Asks `/readyz` on `port` for `how_long` while the application inserts rows: how many
/// answers were not 200, and whether every row was delivered meanwhile.
async fn stays_ready_and_delivers(port: u16, table: &DbTable, how_long: Duration) -> (usize, bool) {
    let started = Instant::now();
    let mut unready = 0;
    while started.elapsed() < how_long {
        table.insert_rows(2, None).await;
        if readyz(port) != 200 {
            unready += 1;
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
    let delivered = wait_until(Duration::from_secs(5), || async {
        table.unsent().await == 0
    })
    .await;
    (unready, delivered)
}

/// The broker on a port of the test's own behind two proxies: `bootstrap.servers` names one,
/// and the broker advertises the other, which every later connection of a client goes to.
/// Silence at the first stops nothing: librdkafka asked it once for the broker's address (a
/// proxy there alone is how a silent broker can seem to leave `/readyz` at 200). Silence at
/// the second is a silent broker.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_broker_makes_the_relay_unready_a_slow_one_does_not_and_no_row_is_lost() {
    let (_tansu, broker, target) = proxied_broker();
    let front = StallingProxy::start(&target).expect("start the bootstrap proxy");
    let bootstrap = format!("127.0.0.1:{}", front.port());
    let table = DbTable::create(Database::Postgres, "silent_kafka").await;
    let (prefix, topics) = crate::databases::topics_for(&table, &bootstrap).await;
    let port = free_port();
    let config = relay_config(&table.name, &bootstrap, &prefix, RELAY, &telemetry(port));
    let relay = RelayProcess::start(&config).expect("start relay");
    assert!(
        readyz_turns(port, 200, SCENARIO_WAIT).await.is_some(),
        "never ready: {}",
        relay.log()
    );

    // The bootstrap address silent: the relay keeps publishing to the advertised one.
    front.freeze();
    let (unready, delivered) = stays_ready_and_delivers(port, &table, BOUND + SLACK).await;
    front.thaw();
    assert_eq!(
        unready, 0,
        "unready while only the bootstrap address was silent"
    );
    assert!(
        delivered,
        "rows waited while only the bootstrap address was silent"
    );

    // Slow but answering: every request takes about 2 s, within the check's 5 s.
    broker.delay(Duration::from_secs(1));
    let (unready, delivered) = stays_ready_and_delivers(port, &table, BOUND + SLACK).await;
    broker.delay(Duration::ZERO);
    assert_eq!(
        unready,
        0,
        "a slow broker made the relay unready: {}",
        relay.log_tail()
    );
    assert!(delivered, "rows not delivered through a slow broker");

    let ids = rows_wait_out_the_silence(Silenced {
        silent: &[("kafka", &broker)],
        table: &table,
        relay,
        port,
    })
    .await;
    assert_every_row_reached_the_broker("kafka", &ids, &bootstrap, &topics);
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_schema_registry_makes_the_relay_unready_and_loses_no_row() {
    let s = Scenario::new("silent_sr", &["order", "customer"]).await;
    let registry = TestRegistry::start().expect("start the test registry");
    let schema = r#"{"type":"record","name":"Event","fields":[{"name":"n","type":"long"}]}"#;
    for topic in &s.topics {
        registry.register(&format!("{topic}-value"), "AVRO", schema);
    }
    let address = registry.url().trim_start_matches("http://").to_owned();
    let proxy = StallingProxy::start(&address).expect("start the proxy");
    let port = free_port();
    let sections = format!(
        "{}[schema_registry]\nurl = \"http://127.0.0.1:{}\"\n",
        telemetry(port),
        proxy.port()
    );
    let config = s.config(RELAY, &sections).replacen(
        "[plugins.default]\n",
        "[plugins.default]\nvalue_format = \"avro\"\n",
        1,
    );
    assert!(config.contains("value_format"), "{config}");
    let relay = RelayProcess::start(&config).expect("start relay");
    let ids = rows_wait_out_the_silence(Silenced {
        silent: &[("schema_registry", &proxy)],
        table: &s.table,
        relay,
        port,
    })
    .await;
    assert_every_row(
        "schema_registry",
        &ids,
        &s.consume(ids.len(), Duration::from_secs(1)),
    );
    s.finish().await;
}

/// The relay cut off from the database and the broker at once (its own network partitioned):
/// both checks fail within the bound, neither waits for the other's timeout.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_from_database_and_broker_is_seen_for_both_within_the_bound() {
    let (_tansu, broker, _) = proxied_broker();
    let bootstrap = format!("127.0.0.1:{}", broker.port());
    let table = DbTable::create(Database::Postgres, "silent_both").await;
    let (prefix, topics) = crate::databases::topics_for(&table, &bootstrap).await;
    let (database, url) = proxied_database();
    let port = free_port();
    let config = with_database_url(
        &relay_config(&table.name, &bootstrap, &prefix, RELAY, &telemetry(port)),
        &url,
    );
    let relay = RelayProcess::start(&config).expect("start relay");
    let ids = rows_wait_out_the_silence(Silenced {
        silent: &[("database", &database), ("kafka", &broker)],
        table: &table,
        relay,
        port,
    })
    .await;
    assert_every_row_reached_the_broker("database and kafka", &ids, &bootstrap, &topics);
    table.drop_table().await;
}
