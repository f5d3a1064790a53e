//! Attacks that used to escape the sandbox, written as a tenant would write them: each test
//! runs hostile tenants (`tests/plugins/hostile`, `tests/plugins/hostile-raw`) next to a
//! well-behaved tenant (rows without tenant, reference plugin) in the same table and checks
//! what that tenant sees — every row delivered exactly once and on time — and that the relay's
//! memory (peak RSS) and log stay bounded.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sluice_testkit::*;

/// How long the well-behaved tenant's rows may take. Normal delivery takes well under a
/// second; the attacks here stalled it for 30 s (a missing topic) up to an hour (a sleep).
const ON_TIME: Duration = Duration::from_secs(20);
/// Rows of the well-behaved tenant in each test.
const GOOD_ROWS: i64 = 50;

fn hostile_path() -> String {
    test_plugin("test_hostile").display().to_string()
}

fn raw_path() -> String {
    test_plugin("test_hostile_raw").display().to_string()
}

/// `[tenants.<name>]` running the hostile plugin in `mode`, allowed the scenario's topics.
fn hostile(s: &Scenario, name: &str, mode: &str, limits: &str) -> String {
    format!(
        "[tenants.{name}]\npath = \"{}\"\nconfig = {{ mode = \"{mode}\", topic_prefix = \"{}\" }}\n\
         allowed_topics = [\"{}*\"]\n{limits}\n\n",
        hostile_path(),
        s.prefix,
        s.prefix
    )
}

/// What a relay run showed.
struct Run {
    exit: RelayExit,
    peak_rss_kib: u64,
    /// From "relay started" until the well-behaved tenant's rows were all sent.
    good_took: Duration,
}

/// Runs a relay with `config` until the well-behaved tenant's rows are all sent and `done`
/// holds, then stops it. The relay must start, and stop with exit code 0.
async fn run<F, Fut>(s: &Scenario, config: &str, mut done: F) -> Run
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let relay = RelayProcess::start(config).expect("start relay");
    let started = relay.wait_started(SCENARIO_WAIT).await;
    assert!(started, "relay did not start: {}", relay.log());
    let t0 = Instant::now();
    let good_sent = "SELECT count(*) FROM {t} WHERE tenant IS NULL AND published_at IS NULL";
    let good = wait_until(SCENARIO_WAIT, || async {
        s.table.scalar_i64(good_sent).await == 0
    })
    .await;
    assert!(good, "good rows not sent: {}", relay.log());
    let good_took = t0.elapsed();
    let finished = wait_until(SCENARIO_WAIT, &mut done).await;
    assert!(finished, "relay did not get there: {}", tail(&relay.log()));
    let peak_rss_kib = relay.peak_rss_kib().unwrap_or(0);
    let exit = relay.stop();
    assert!(exit.success, "relay did not exit 0: {}", tail(&exit.log));
    // The figures behind the assertions (`--nocapture` shows them).
    println!(
        "good tenant's rows sent in {good_took:?}; relay peak RSS {peak_rss_kib} KiB; log {} \
         bytes, longest line {} bytes",
        exit.log.len(),
        exit.log.lines().map(str::len).max().unwrap_or(0)
    );
    Run {
        exit,
        peak_rss_kib,
        good_took,
    }
}

/// The end of a log, for assertion messages (logs of these tests can be long).
/// `s`'s config with `relay_extra`, whose default plugin (the one tenants without an entry
/// get) is the hostile plugin in `mode`, with at most 4 such instances at once.
fn hostile_default_capped(s: &Scenario, relay_extra: &str, mode: &str) -> String {
    let config = s
        .config(relay_extra, "")
        .replace(
            &format!(
                "path = \"{}\"\nconfig = {{ topic_prefix = \"{}\" }}",
                reference_plugin().display(),
                s.prefix
            ),
            &format!(
                "path = \"{}\"\nconfig = {{ mode = \"{mode}\", topic_prefix = \"{}\" }}",
                hostile_path(),
                s.prefix
            ),
        )
        .replace(
            "[plugins.default]",
            "[plugins]\nmax_unconfigured_instances = 4\n\n[plugins.default]",
        );
    assert!(config.contains(&format!("mode = \"{mode}\"")), "{config}");
    config
}

fn tail(log: &str) -> &str {
    let start = log.len().saturating_sub(8_000);
    let start = (start..log.len())
        .find(|&i| log.is_char_boundary(i))
        .unwrap_or(0);
    &log[start..]
}

/// The well-behaved tenant's messages arrived, each exactly once, on time.
fn assert_good_tenant_served(s: &Scenario, run: &Run) {
    assert!(
        run.good_took < ON_TIME,
        "good tenant's rows took {:?}",
        run.good_took
    );
    let got = consume(
        &kafka_bootstrap(),
        &s.topics[..2],
        GOOD_ROWS as usize,
        SCENARIO_WAIT,
        Duration::from_secs(1),
    )
    .expect("consume");
    let good: Vec<Received> = got
        .into_iter()
        .filter(|m| m.header("sluice-tenant").as_deref() == Some("default"))
        .collect();
    assert_each_row_once(&good, GOOD_ROWS as usize);
}

/// The messages on the well-behaved tenant's own topic (`<prefix>good`), read until
/// `expected` arrived and a second more (so extras show).
fn good_messages(s: &Scenario, expected: usize) -> Vec<Received> {
    consume(
        &kafka_bootstrap(),
        &[format!("{}good", s.prefix)],
        expected,
        SCENARIO_WAIT,
        Duration::from_secs(1),
    )
    .expect("consume")
}

/// `got` holds `rows` rows (by their `id` header), each exactly once.
fn assert_each_row_once(got: &[Received], rows: usize) {
    let counts = count_by_id(got);
    assert_eq!(counts.len(), rows, "every row delivered: {counts:?}");
    assert!(
        counts.values().all(|&n| n == 1),
        "each row exactly once: {counts:?}"
    );
}

/// `(tenant, attempts, last_error)` of unsent rows, by tenant.
async fn unsent_by_tenant(s: &Scenario) -> HashMap<String, Vec<(i32, String)>> {
    let mut by: HashMap<String, Vec<(i32, String)>> = HashMap::new();
    for (tenant, attempts, error) in s.table.unsent_rows().await {
        by.entry(tenant.unwrap_or_default())
            .or_default()
            .push((attempts, error.unwrap_or_default()));
    }
    by
}

async fn dead(s: &Scenario) -> i64 {
    s.table
        .scalar_i64("SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL")
        .await
}

/// Inserts `n` rows of each of `tenants`, interleaved with the good tenant's [`GOOD_ROWS`], so
/// batches mix them.
async fn insert_mixed(s: &Scenario, tenants: &[&str], n: i64) {
    for round in 0..n {
        let good = GOOD_ROWS / n + i64::from(round < GOOD_ROWS % n);
        s.table.insert_rows(good, None).await;
        for tenant in tenants {
            s.table.insert_rows(1, Some(tenant)).await;
        }
    }
}

// ---- 1 + 4: guest text in the database and the log ----

#[tokio::test(flavor = "multi_thread")]
async fn guest_text_with_nul_bytes_or_megabytes_is_escaped_and_cut_and_the_log_stays_small() {
    let s = Scenario::new("breach_text", &["order", "customer", "good"]).await;
    let modes = [
        ("nulerror", "nul-error"),
        ("nultopic", "nul-topic"),
        ("hugeerror", "huge-error"),
        ("hugetopic", "huge-topic"),
        ("logflood", "log-flood"),
    ];
    let mut tenants = String::new();
    for (name, mode) in modes {
        tenants += &hostile(&s, name, mode, "");
    }
    tenants += "[relay.retry]\nmax_attempts = 1\n";
    let names: Vec<&str> = modes.iter().map(|(n, _)| *n).collect();
    insert_mixed(&s, &names, 5).await;
    let hostile_rows = 5 * modes.len() as i64;
    let run = run(&s, &s.config("", &tenants), || async {
        dead(&s).await == hostile_rows
    })
    .await;
    assert_good_tenant_served(&s, &run);

    let expected = [
        ("nulerror", "nul\\u{0}code: row"),
        ("nultopic", "not a valid Kafka topic name"),
        ("hugeerror", "more bytes)"),
        ("hugetopic", "more bytes)\" ("),
        ("logflood", "trapped"),
    ];
    let unsent = unsent_by_tenant(&s).await;
    for (tenant, needle) in expected {
        let rows = &unsent[tenant];
        assert_eq!(rows.len(), 5, "{tenant}");
        for (attempts, error) in rows {
            assert_eq!(*attempts, 1, "{tenant}");
            assert!(error.contains(needle), "{tenant}: {error}");
            assert!(
                error.len() <= 1_400,
                "{tenant}: {} bytes stored",
                error.len()
            );
            assert!(!error.chars().any(char::is_control), "{tenant}: {error:?}");
        }
    }
    // Five rows of 4 MiB errors and 1 MiB topics used to log tens of MiB.
    let log = &run.exit.log;
    assert!(log.len() < 2 << 20, "relay log of {} bytes", log.len());
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 8 * 1024, "a log line of {longest} bytes");
    // One log budget per tenant: five traps (five fresh instances) do not get five bursts
    // of 100 lines.
    let flood = log
        .lines()
        .filter(|l| l.contains("sluice::guest") && l.contains("tenant=logflood"))
        .count();
    assert!((1..200).contains(&flood), "{flood} guest lines of logflood");
    s.finish().await;
}

// ---- 2: blocking inside host calls ----

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_sleeping_in_a_host_call_is_cut_off_at_its_call_timeout() {
    let s = Scenario::new("breach_sleep", &["order", "customer", "good"]).await;
    let tenants = hostile(
        &s,
        "sleeper",
        "sleep",
        "call_timeout = \"100ms\"\ncircuit_breaker_cooldown = \"200ms\"",
    ) + "[relay.retry]\nmax_attempts = 1\n";
    insert_mixed(&s, &["sleeper"], 3).await;
    let run = run(&s, &s.config("", &tenants), || async {
        dead(&s).await == 3
    })
    .await;
    assert_good_tenant_served(&s, &run);
    for (attempts, error) in &unsent_by_tenant(&s).await["sleeper"] {
        assert_eq!(*attempts, 1);
        assert!(
            error.contains("call_timeout of 100ms") && error.contains("host call"),
            "{error}"
        );
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_plugin_version_that_sleeps_in_configure_holds_up_no_tenant_during_reload() {
    let s = Scenario::new("breach_reload_sleep", &["order", "customer"]).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("router.wasm");
    std::fs::copy(reference_plugin(), &plugin).unwrap();
    // Two tenants on a file that will be replaced by one whose `configure` sleeps an hour.
    let mut tenants = String::new();
    for name in ["alpha", "beta"] {
        tenants += &format!(
            "[tenants.{name}]\npath = \"{}\"\nconfig = {{ topic_prefix = \"{}\" }}\ncall_timeout = \"200ms\"\n",
            plugin.display(),
            s.prefix
        );
    }
    let relay = RelayProcess::start(&s.config("", &tenants)).unwrap();
    assert!(relay.wait_started(SCENARIO_WAIT).await);
    let replaced = dir.path().join("new.wasm");
    std::fs::copy(test_plugin("test_hostile_raw"), &replaced).unwrap();
    std::fs::rename(&replaced, &plugin).unwrap();
    let t0 = Instant::now();
    let reloaded = wait_until(Duration::from_secs(30), || async {
        relay.log().contains("plugin reloaded")
    })
    .await;
    assert!(reloaded, "{}", tail(&relay.log()));
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // Rows of the tenants being reloaded, and of the others, flow on the old version.
    for tenant in [None, Some("alpha"), Some("beta")] {
        s.table.insert_rows(20, tenant).await;
    }
    let t1 = Instant::now();
    let drained = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "{}", tail(&relay.log()));
    assert!(t1.elapsed() < ON_TIME, "{:?}", t1.elapsed());
    let exit = relay.stop();
    assert!(exit.success, "{}", tail(&exit.log));
    let kept = exit
        .log
        .matches("new plugin version failed to start for this tenant; it keeps the old version")
        .count();
    assert_eq!(kept, 2, "{}", tail(&exit.log));
    assert!(
        exit.log.contains("call_timeout of 200ms"),
        "{}",
        tail(&exit.log)
    );
    let got = s.consume(60, Duration::from_secs(1));
    assert_eq!(count_by_id(&got).len(), 60);
    s.finish().await;
}

#[test]
fn plugin_check_and_plugin_test_are_bounded_in_wall_clock_time() {
    let t0 = Instant::now();
    let check = sluice(&["plugin", "check", &raw_path()]);
    assert!(!check.status.success());
    let err = String::from_utf8_lossy(&check.stderr);
    assert!(
        err.contains("info() failed") && err.contains("call_timeout"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("rows.jsonl");
    std::fs::write(
        &input,
        "{\"aggregate_type\":\"a\",\"aggregate_id\":\"b\",\"event_type\":\"c\"}\n",
    )
    .unwrap();
    let input = input.display().to_string();
    let test = |mode: &str| {
        sluice(&[
            "plugin",
            "test",
            &hostile_path(),
            "--input",
            &input,
            "--set",
            &format!("mode={mode}"),
            "--set",
            "topic_prefix=x.",
        ])
    };
    let sleeping_row = test("sleep");
    let out = String::from_utf8_lossy(&sleeping_row.stdout);
    assert!(
        out.contains("call_timeout") && out.contains("\"kind\":\"trap\""),
        "{out}"
    );
    let sleeping_configure = test("sleep-configure");
    assert!(!sleeping_configure.status.success());
    assert!(
        String::from_utf8_lossy(&sleeping_configure.stderr).contains("call_timeout"),
        "{}",
        String::from_utf8_lossy(&sleeping_configure.stderr)
    );
    // Three commands whose plugins sleep an hour each.
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
}

// ---- 3: host memory ----

#[tokio::test(flavor = "multi_thread")]
async fn counter_names_and_lift_amplification_do_not_grow_relay_memory() {
    let s = Scenario::new("breach_memory", &["order", "customer", "good"]).await;
    let tenants = hostile(&s, "counting", "counters", "memory_mb = 16")
        + &format!(
            "[tenants.amplifier]\npath = \"{}\"\nconfig = {{}}\nmemory_mb = 16\nmax_batch_output_bytes = 4194304\n",
            raw_path()
        )
        + "[relay.retry]\nmax_attempts = 1\n";
    insert_mixed(&s, &["counting", "amplifier"], 5).await;
    s.table.insert_rows(15, Some("counting")).await;
    let run = run(&s, &s.config("", &tenants), || async {
        let left = "SELECT count(*) FROM {t} WHERE tenant = 'counting'";
        dead(&s).await == 5 && s.table.scalar_i64(left).await == 0
    })
    .await;
    assert_good_tenant_served(&s, &run);
    // 2,000 distinct 1 MiB counter names used to be kept (2 GiB); the amplifier's answer
    // points 100,000 messages at one 1 MiB buffer (100 GiB if copied).
    assert!(
        run.peak_rss_kib < 400 * 1024,
        "relay peak RSS {} KiB",
        run.peak_rss_kib
    );
    for (_, error) in &unsent_by_tenant(&s).await["amplifier"] {
        assert!(error.contains("more than 8388608 bytes"), "{error}");
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn instances_of_tenants_without_an_entry_are_capped_and_every_row_still_arrives_once() {
    let s = Scenario::new("breach_instances", &["order", "customer", "good"]).await;
    // The default plugin holds 8 MiB per instance; 300 tenant values would be 2.4 GiB.
    let config = hostile_default_capped(&s, "batch_size = 500", "fat");
    let insert = format!(
        "INSERT INTO \"{}\" (tenant, aggregate_type, aggregate_id, event_type, payload)
         SELECT 'value-' || (g % 300), 'order', 'a-' || g, 'E', '{{}}' FROM generate_series(1, 600) g",
        s.table.name
    );
    sqlx::query(sqlx::AssertSqlSafe(insert))
        .execute(s.table.pg_pool())
        .await
        .unwrap();
    s.table.insert_rows(GOOD_ROWS, None).await;
    let relay = RelayProcess::start(&config).unwrap();
    let drained = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "{}", tail(&relay.log()));
    let peak = relay.peak_rss_kib().unwrap_or(0);
    let exit = relay.stop();
    assert!(exit.success, "{}", tail(&exit.log));
    assert!(peak < 500 * 1024, "relay peak RSS {peak} KiB");
    assert_each_row_once(&good_messages(&s, 650), 650);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_past_a_tenants_batch_output_budget_wait_for_the_next_batch_without_failing() {
    let s = Scenario::new("breach_budget", &["order", "customer", "good"]).await;
    // 512 KiB per row, 1 MiB per batch: at most two of these rows per batch.
    let tenants = hostile(&s, "prolific", "large", "max_batch_output_bytes = 1048576");
    insert_mixed(&s, &["prolific"], 10).await;
    let config = s.config("mark = \"published_at\"", &tenants);
    let run = run(&s, &config, || async { s.table.unsent().await == 0 }).await;
    assert_good_tenant_served(&s, &run);
    let failed = s
        .table
        .scalar_i64("SELECT count(*) FROM {t} WHERE attempts > 0 OR last_error IS NOT NULL")
        .await;
    assert_eq!(failed, 0, "deferred rows are not failures");
    assert_each_row_once(&good_messages(&s, 10), 10);
    s.finish().await;
}

// ---- 5: host headers ----

#[tokio::test(flavor = "multi_thread")]
async fn host_headers_cannot_be_dropped_shadowed_or_forged_by_case() {
    let s = Scenario::new("breach_headers", &["order", "customer", "good"]).await;
    let tenants = hostile(&s, "manyheaders", "many-headers", "")
        + &hostile(&s, "nulheader", "nul-header", "")
        + &hostile(&s, "caseheader", "case-header", "")
        + "[relay.retry]\nmax_attempts = 1\n";
    insert_mixed(&s, &["manyheaders", "nulheader", "caseheader"], 5).await;
    let run = run(&s, &s.config("", &tenants), || async {
        let left = "SELECT count(*) FROM {t} WHERE tenant = 'caseheader'";
        dead(&s).await == 10 && s.table.scalar_i64(left).await == 0
    })
    .await;
    assert_good_tenant_served(&s, &run);
    let unsent = unsent_by_tenant(&s).await;
    for (_, error) in &unsent["manyheaders"] {
        assert!(error.contains("max_headers_per_message"), "{error}");
    }
    for (_, error) in &unsent["nulheader"] {
        assert!(error.contains("control character"), "{error}");
    }
    // What consumers see: the host's two headers, exactly once each, with the true values.
    let got = good_messages(&s, 5);
    assert_eq!(got.len(), 5);
    for m in &got {
        // The plugin set `id` and three case variants of the host's names; only `id` is kept.
        let names: Vec<&str> = m.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["id", "sluice-tenant", "sluice-outbox-id"],
            "{:?}",
            m.headers
        );
        assert_eq!(m.header("sluice-tenant").as_deref(), Some("caseheader"));
        assert_eq!(m.header("sluice-outbox-id"), m.header("id"));
    }
    s.finish().await;
}

// ---- 6: a topic inside the allow-list that the broker lacks ----

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_routing_to_a_missing_topic_delays_nobody_and_gets_paused() {
    let s = Scenario::new("breach_missing", &["order", "customer"]).await;
    let tenants = hostile(
        &s,
        "missing",
        "missing-topic",
        "circuit_breaker_failures = 3\ncircuit_breaker_cooldown = \"60s\"",
    );
    insert_mixed(&s, &["missing"], 10).await;
    let run = run(&s, &s.config("", &tenants), || async { true }).await;
    assert_good_tenant_served(&s, &run);
    assert!(
        run.exit.log.contains("circuit breaker opened"),
        "{}",
        tail(&run.exit.log)
    );
    s.finish().await;
}

// ---- 7: a tenant whose plugin cannot start ----

/// Tenants whose plugin cannot start: `configure` fails, `configure` sleeps, the file is not
/// a component.
fn unstartable_tenants(s: &Scenario, dir: &tempfile::TempDir) -> String {
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"not a component").unwrap();
    hostile(s, "rejecting", "fail-configure", "")
        + &hostile(s, "sleepy", "sleep-configure", "call_timeout = \"200ms\"")
        + &format!(
            "[tenants.garbage]\npath = \"{}\"\nconfig = {{ topic_prefix = \"x.\" }}\n",
            garbage.display()
        )
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_whose_plugin_cannot_start_are_quarantined_and_the_others_run() {
    let s = Scenario::new("breach_quarantine", &["order", "customer"]).await;
    let dir = tempfile::tempdir().unwrap();
    insert_mixed(&s, &["rejecting", "sleepy", "garbage"], 5).await;
    let config = s.config("", &unstartable_tenants(&s, &dir));
    let run = run(&s, &config, || async { true }).await;
    assert_good_tenant_served(&s, &run);
    let log = &run.exit.log;
    for tenant in ["rejecting", "sleepy", "garbage"] {
        let line = log
            .lines()
            .find(|l| l.contains("tenant quarantined") && l.contains(&format!("tenant={tenant}")));
        assert!(line.is_some(), "{tenant} not quarantined: {}", tail(log));
    }
    // Their rows wait untouched: not claimed, no attempt counted, not dead.
    let unsent = unsent_by_tenant(&s).await;
    for tenant in ["rejecting", "sleepy", "garbage"] {
        let rows = &unsent[tenant];
        assert_eq!(rows.len(), 5, "{tenant}");
        assert!(
            rows.iter().all(|(attempts, _)| *attempts == 0),
            "{tenant}: {rows:?}"
        );
    }
    assert_eq!(dead(&s).await, 0);
    s.finish().await;
}

#[test]
fn strict_startup_refuses_to_start_when_a_plugin_cannot_start() {
    let dir = tempfile::tempdir().unwrap();
    let s_prefix = "strict.";
    let config = format!(
        "[database]\nurl = \"{}\"\n[kafka]\n\"bootstrap.servers\" = \"{}\"\n\
         [plugins]\nstrict_startup = true\n\
         [tenants.sleepy]\npath = \"{}\"\nconfig = {{ mode = \"sleep-configure\", topic_prefix = \"{s_prefix}\" }}\ncall_timeout = \"200ms\"\n",
        database_url(),
        kafka_bootstrap(),
        hostile_path()
    );
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, config).unwrap();
    let t0 = Instant::now();
    let out = sluice(&["run", "--config", &path.display().to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sleepy") && err.contains("call_timeout"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_default_plugin_quarantines_the_tenants_that_use_it() {
    let s = Scenario::new("breach_default", &["order", "customer", "good"]).await;
    let config = s.config("", &hostile(&s, "acme", "good", "")).replace(
        &format!("config = {{ topic_prefix = \"{}\" }}", s.prefix),
        "config = { topic_prefx = \"typo.\" }",
    );
    s.table.insert_rows(5, None).await;
    s.table.insert_rows(5, Some("unlisted")).await;
    s.table.insert_rows(5, Some("acme")).await;
    let relay = RelayProcess::start(&config).unwrap();
    let acme_sent = wait_until(SCENARIO_WAIT, || async {
        let left = "SELECT count(*) FROM {t} WHERE tenant = 'acme'";
        s.table.scalar_i64(left).await == 0
    })
    .await;
    assert!(acme_sent, "{}", tail(&relay.log()));
    // Give the relay time to (wrongly) touch the other rows.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let exit = relay.stop();
    assert!(exit.success, "{}", tail(&exit.log));
    assert!(
        exit.log.contains("tenant quarantined"),
        "{}",
        tail(&exit.log)
    );
    let unsent = unsent_by_tenant(&s).await;
    assert_eq!(unsent.len(), 2, "{unsent:?}");
    for tenant in ["", "unlisted"] {
        let rows = &unsent[tenant];
        assert_eq!(rows.len(), 5, "{tenant:?}");
        assert!(rows.iter().all(|(attempts, _)| *attempts == 0), "{rows:?}");
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quarantined_tenant_resumes_when_its_plugin_file_is_fixed() {
    let s = Scenario::new("breach_resume", &["order", "customer", "good"]).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("tenant.wasm");
    // The reference plugin rejects `mode`: quarantined until the file is replaced by one that
    // accepts it.
    std::fs::copy(reference_plugin(), &plugin).unwrap();
    let tenant = format!(
        "[tenants.fixme]\npath = \"{}\"\nconfig = {{ mode = \"good\", topic_prefix = \"{}\" }}\n",
        plugin.display(),
        s.prefix
    );
    s.table.insert_rows(10, Some("fixme")).await;
    s.table.insert_rows(GOOD_ROWS, None).await;
    let relay = RelayProcess::start(&s.config("", &tenant)).unwrap();
    let good = wait_until(SCENARIO_WAIT, || async {
        s.table
            .scalar_i64("SELECT count(*) FROM {t} WHERE tenant IS NULL")
            .await
            == 0
    })
    .await;
    assert!(good, "{}", tail(&relay.log()));
    assert_eq!(s.table.count().await, 10, "quarantined rows wait");
    let fixed = dir.path().join("fixed.wasm");
    std::fs::copy(test_plugin("test_hostile"), &fixed).unwrap();
    std::fs::rename(&fixed, &plugin).unwrap();
    let drained = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "{}", tail(&relay.log()));
    let exit = relay.stop();
    assert!(
        exit.log.contains("tenant left quarantine"),
        "{}",
        tail(&exit.log)
    );
    assert_eq!(count_by_id(&good_messages(&s, 10)).len(), 10);
    s.finish().await;
}

// ---- plugin-side failures ----

#[tokio::test(flavor = "multi_thread")]
async fn a_transform_batch_with_too_few_results_fails_the_call_cleanly_and_no_row_is_lost() {
    let s = Scenario::new("breach_short", &["order", "customer", "good"]).await;
    let tenants = hostile(&s, "short", "short-batch", "");
    // More than the 64-row probation, so transform-batch gets called.
    s.table.insert_rows(200, Some("short")).await;
    s.table.insert_rows(GOOD_ROWS, None).await;
    let run = run(&s, &s.config("", &tenants), || async {
        s.table.count().await == 0
    })
    .await;
    assert_good_tenant_served(&s, &run);
    assert!(
        run.exit.log.contains("results for")
            && run
                .exit
                .log
                .contains("calling this tenant's plugin row by row"),
        "{}",
        tail(&run.exit.log)
    );
    assert_each_row_once(&good_messages(&s, 200), 200);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_rows_do_not_pause_a_healthy_tenant() {
    let s = Scenario::new("breach_malformed", &["order", "customer"]).await;
    // The reference plugin fails a row with an empty aggregate_type (`permanent`).
    let malformed = format!(
        "INSERT INTO \"{}\" (aggregate_type, aggregate_id, event_type, payload)
         SELECT '', 'm-' || g, 'E', '{{}}' FROM generate_series(1, 5) g",
        s.table.name
    );
    sqlx::query(sqlx::AssertSqlSafe(malformed))
        .execute(s.table.pg_pool())
        .await
        .unwrap();
    s.table.insert_rows(GOOD_ROWS, None).await;
    let breaker = "circuit_breaker_failures = 3\ncircuit_breaker_cooldown = \"1h\"";
    let config = s.config("", "").replace(
        "[plugins.default]\n",
        &format!("[plugins.default]\n{breaker}\n"),
    );
    let relay = RelayProcess::start(&config).unwrap();
    let t0 = Instant::now();
    let sent = wait_until(SCENARIO_WAIT, || async {
        s.table
            .scalar_i64("SELECT count(*) FROM {t} WHERE aggregate_type <> ''")
            .await
            == 0
    })
    .await;
    assert!(sent, "{}", tail(&relay.log()));
    assert!(t0.elapsed() < ON_TIME, "{:?}", t0.elapsed());
    let exit = relay.stop();
    assert!(
        !exit.log.contains("circuit breaker opened"),
        "{}",
        tail(&exit.log)
    );
    s.finish().await;
}

/// Replaces `path` atomically, as a deployment would.
fn replace(path: &std::path::Path, with: &std::path::Path) {
    let tmp = path.with_extension("new");
    std::fs::copy(with, &tmp).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_that_fails_for_one_tenant_still_switches_the_others_and_resets_breakers() {
    let s = Scenario::new("breach_reload", &["order", "customer", "a", "b"]).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("shared.wasm");
    // v1: test_trap. "lenient" routes normally (it traps only on aggregate id "never"),
    // "crashing" traps on every row, trips its breaker (1 failure, 1 h) and stays paused.
    // v2: test_fanout, which accepts only `topic_prefix`: "lenient"'s `only_aggregate_id`
    // makes its configure fail, so lenient keeps v1; crashing switches to v2.
    std::fs::copy(test_plugin("test_trap"), &plugin).unwrap();
    let tenants = format!(
        "[tenants.lenient]\npath = \"{p}\"\nconfig = {{ topic_prefix = \"{x}\", only_aggregate_id = \"never\" }}\n\
         [tenants.crashing]\npath = \"{p}\"\nconfig = {{ topic_prefix = \"{x}\" }}\n\
         circuit_breaker_failures = 1\ncircuit_breaker_cooldown = \"1h\"\n\
         [relay.retry]\ninitial = \"100ms\"\nmax = \"100ms\"\n",
        p = plugin.display(),
        x = s.prefix
    );
    s.table.insert_rows(1, Some("crashing")).await;
    let relay = RelayProcess::start(&s.config("", &tenants)).unwrap();
    let opened = wait_until(SCENARIO_WAIT, || async {
        relay.log().contains("circuit breaker opened")
    })
    .await;
    assert!(opened, "{}", tail(&relay.log()));
    replace(&plugin, &test_plugin("test_fanout"));
    let reloaded = wait_until(SCENARIO_WAIT, || async {
        relay.log().contains("plugin reloaded")
    })
    .await;
    assert!(reloaded, "{}", tail(&relay.log()));
    for tenant in [Some("lenient"), Some("crashing"), None] {
        s.table.insert_rows(10, tenant).await;
    }
    let t0 = Instant::now();
    let drained = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "{}", tail(&relay.log()));
    assert!(
        t0.elapsed() < ON_TIME,
        "paused until reset? {:?}",
        t0.elapsed()
    );
    let exit = relay.stop();
    assert!(
        exit.log.contains("circuit breaker reset"),
        "{}",
        tail(&exit.log)
    );
    assert!(
        exit.log.contains("it keeps the old version"),
        "{}",
        tail(&exit.log)
    );
    // lenient 10 (v1: one message each), crashing 11 (v2 fans out to a and b), default 10.
    let got = s.consume(42, Duration::from_secs(1));
    let by_tenant = |tenant: &str, v2: bool| {
        got.iter()
            .filter(|m| m.header("sluice-tenant").as_deref() == Some(tenant))
            .filter(|m| (m.topic.ends_with(".a") || m.topic.ends_with(".b")) == v2)
            .count()
    };
    assert_eq!(by_tenant("lenient", false), 10, "lenient kept v1");
    assert_eq!(
        by_tenant("crashing", true),
        22,
        "crashing switched to v2 (fan-out)"
    );
    assert_eq!(by_tenant("crashing", false), 0);
    s.finish().await;
}

/// Instances of tenants without an entry come and go through the same pooled slots (at most 4
/// live, 40 tenants taking turns). A `snoop` instance reads its whole linear memory for the
/// markers instances leave behind: another tenant's marker would be published to `leak`. Its
/// own markers, left by its earlier rows, must be found (`seen-own`), or the scan proves
/// nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_reused_instance_slot_shows_nothing_of_the_tenant_before() {
    let s = Scenario::new("breach_snoop", &["order", "customer", "good", "leak"]).await;
    let config = hostile_default_capped(&s, "batch_size = 100", "snoop");
    insert_snoop_rows(&s).await;
    let relay = RelayProcess::start(&config).unwrap();
    let drained = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "{}", tail(&relay.log()));
    let exit = relay.stop();
    assert!(exit.success, "{}", tail(&exit.log));
    let got = snooped(&s, 400);
    let good: Vec<_> = got.iter().filter(|m| m.topic.ends_with("good")).collect();
    let saw_own = good
        .iter()
        .filter(|m| m.header("seen-own").is_some_and(|n| n != "0"))
        .count();
    assert!(
        saw_own > 100,
        "the scan found its own markers in only {saw_own} of {} rows",
        good.len()
    );
    s.finish().await;
}

/// Forty tenants with their own entry, each running `snoop`, and a memory budget for
/// configured tenants' instances that holds about three: idle instances are dropped and
/// created again (their slots reused by other configured tenants), nothing of one tenant is
/// readable by the next, every row is delivered, and `/status` shows the budget held.
#[tokio::test(flavor = "multi_thread")]
async fn configured_tenants_past_their_memory_budget_share_slots_and_see_nothing_of_each_other() {
    let s = Scenario::new("breach_snoop_conf", &["order", "customer", "good", "leak"]).await;
    let port = free_port();
    let tenants: String = (0..40)
        .map(|n| {
            format!(
                "[tenants.snoop-{n}]\npath = \"{}\"\nconfig = {{ mode = \"snoop\", topic_prefix = \"{}\" }}\n\n",
                hostile_path(),
                s.prefix
            )
        })
        .collect();
    let config = s
        .config(
            "batch_size = 100",
            &format!("{tenants}[telemetry]\nlisten = \"127.0.0.1:{port}\"\n"),
        )
        .replace(
            "[plugins.default]",
            "[plugins]\nconfigured_instances_memory_mb = 4\n\n[plugins.default]",
        );
    insert_snoop_rows(&s).await;
    let relay = RelayProcess::start(&config).unwrap();
    let drained = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "{}", tail(&relay.log()));
    let (code, status) = http_get(port, "/status").expect("/status");
    assert_eq!(code, 200, "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let configured = &status["instances"]["configured"];
    assert_eq!(configured["memory_limit_bytes"], 4 << 20, "{status}");
    let live = configured["live"].as_u64().unwrap();
    assert!(
        (1..=6).contains(&live),
        "{live} instances of 41 configured tenants live under a 4 MiB budget: {status}"
    );
    let (_, metrics) = http_get(port, "/metrics").expect("/metrics");
    let evicted = metric_sum(
        &parse_metrics(&metrics),
        "sluice_plugin_instantiations_total",
        &["reason=\"evicted\""],
    );
    assert!(
        evicted >= 40.0,
        "instances created again after making room: {evicted}"
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", tail(&exit.log));
    snooped(&s, 400);
    s.finish().await;
}

/// 400 rows of tenants `snoop-0`…`snoop-39`, each tenant's in runs of five (so instances see
/// their own earlier rows).
async fn insert_snoop_rows(s: &Scenario) {
    let insert = format!(
        "INSERT INTO \"{}\" (tenant, aggregate_type, aggregate_id, event_type, payload)
         SELECT 'snoop-' || ((g / 5) % 40), 'order', 'a-' || g, 'E', '{{}}'
           FROM generate_series(1, 400) g",
        s.table.name
    );
    sqlx::query(sqlx::AssertSqlSafe(insert))
        .execute(s.table.pg_pool())
        .await
        .unwrap();
}

/// The `snoop` runs' messages: checks that no instance found another tenant's markers and that
/// each of the `rows` rows was delivered.
fn snooped(s: &Scenario, rows: usize) -> Vec<Received> {
    let got = consume(
        &kafka_bootstrap(),
        &[format!("{}good", s.prefix), format!("{}leak", s.prefix)],
        rows,
        SCENARIO_WAIT,
        Duration::from_secs(2),
    )
    .unwrap();
    let leaks: Vec<String> = got
        .iter()
        .filter(|m| m.topic.ends_with("leak"))
        .map(|m| String::from_utf8_lossy(m.payload.as_deref().unwrap_or_default()).into_owned())
        .collect();
    assert!(
        leaks.is_empty(),
        "another tenant's memory was readable: {leaks:?}"
    );
    assert_eq!(count_by_id(&got).len(), rows, "every row delivered");
    got
}
