//! Operability end to end: `/metrics` scraped while rows flow agrees with what the database and
//! the broker say happened, and has every metric the shipped dashboard and alerts use;
//! `/readyz` follows the broker (a test-owned Tansu, SIGSTOPped and resumed) and a database
//! whose outbox table is locked (dependencies behind a proxy that goes silent: `silence.rs`),
//! `/healthz` a worker stuck in a batch; `sluice_plugin_info` follows a hot reload; the slowest
//! of many free-form tenants get backlog series of their own, bounded, and lead `/status`;
//! trace context headers reach Kafka unchanged; JSON log lines.

use std::collections::BTreeSet;
use std::time::Duration;

use sluice_testkit::*;
use sluice_testkit::{OwnTansu, free_port};

const SCRAPE_WAIT: Duration = Duration::from_secs(60);

fn telemetry(port: u16) -> String {
    format!("[telemetry]\nlisten = \"127.0.0.1:{port}\"\nsample_interval = \"1s\"\n")
}

/// Scrapes until `ready` holds for the samples, returning the last exposition.
async fn scrape_until(
    port: u16,
    ready: impl Fn(&std::collections::HashMap<String, f64>) -> bool,
) -> String {
    let mut last = String::new();
    let reached = wait_until(SCRAPE_WAIT, || {
        let got = http_get(port, "/metrics");
        if let Some((200, text)) = got {
            last = text;
        }
        let ok = ready(&parse_metrics(&last));
        async move { ok }
    })
    .await;
    assert!(reached, "metrics never got there:\n{last}");
    last
}

/// Runs Debian's `promtool check metrics` on the exposition when it is installed
/// (`scripts/test` installs it).
fn promtool_check(text: &str) {
    use std::io::Write;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("promtool not installed: exposition checked by the parser only");
        return;
    };
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes()).expect("write to promtool");
    }
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every metric name (`sluice_…`, `process_…`) the files under `deploy/` use.
fn deployed_metric_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for file in [
        "deploy/grafana/sluice-dashboard.json",
        "deploy/prometheus/sluice-alerts.yml",
    ] {
        let text = std::fs::read_to_string(repo_root().join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut rest = text.as_str();
        while let Some(at) = ["sluice_", "process_"]
            .iter()
            .filter_map(|p| rest.find(p))
            .min()
        {
            // Only whole identifiers: not the tail of a longer word.
            let starts_word = rest[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_');
            let tail = &rest[at..];
            let len = tail
                .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .unwrap_or(tail.len());
            if starts_word {
                names.insert(tail[..len].to_owned());
            }
            rest = &tail[len..];
        }
    }
    names
}

/// The metric names an exposition has: every sample's, and those its `# TYPE` lines declare
/// (with the `_total`, `_bucket`, `_sum` and `_count` series of counters and histograms, which
/// exist even before their first sample).
fn exposed_metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut parts = declared.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            names.insert(name.to_owned());
            match kind {
                "counter" => {
                    names.insert(format!("{}_total", name.trim_end_matches("_total")));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {}
            }
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            if !name.is_empty() {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_match_what_was_delivered_rescheduled_and_dead_lettered() {
    let s = Scenario::new("metrics", &["order", "customer"]).await;
    s.table.insert_rows(40, None).await;
    s.table.insert_rows(5, Some("refuser")).await;
    s.table.insert_rows(6, Some("lost")).await;
    let port = free_port();
    // `lost` routes to topics the broker lacks: each row fails once and waits an hour.
    let extra = s.tenant("refuser", "test_fail_permanent", "")
        + "circuit_breaker_failures = 1000\n"
        + &format!(
            "[tenants.lost]\nbuiltin = \"route-by-aggregate\"\nconfig = {{ topic_prefix = \"{}missing.\" }}\ncircuit_breaker_failures = 1000\n",
            s.prefix
        )
        + "[relay.retry]\ninitial = \"1h\"\nmax = \"1h\"\njitter = 0.0\n"
        + &telemetry(port);
    let relay = RelayProcess::start(&s.config("", &extra)).expect("start relay");
    let settled = wait_until(SCENARIO_WAIT, || async {
        s.table
            .scalar_i64("SELECT count(*) FROM {t} WHERE tenant IS NULL")
            .await
            == 0
            && s.table
                .scalar_i64("SELECT count(*) FROM {t} WHERE attempts = 1")
                .await
                == 11
    })
    .await;
    assert!(settled, "rows did not settle: {}", relay.log());

    let text = scrape_until(port, |m| {
        metric_sum(m, "sluice_outbox_dead_rows", &["tenant=\"refuser\""]) == 5.0
            && metric_sum(m, "sluice_dependency_up", &[]) == 2.0
            // Statistics come every second: wait for one after the last acknowledgement.
            && m.get("sluice_producer_queue_messages") == Some(&0.0)
    })
    .await;
    let m = parse_metrics(&text);
    let completed = |tenant: &str, outcome: &str| {
        metric_sum(
            &m,
            "sluice_rows_completed_total",
            &[
                &format!("tenant=\"{tenant}\""),
                &format!("outcome=\"{outcome}\""),
            ],
        )
    };
    // The database's account: rows without a tenant are gone (sent), refuser's are dead,
    // lost's wait with one attempt each.
    let dead = s
        .table
        .scalar_i64("SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL")
        .await;
    let waiting = s
        .table
        .scalar_i64("SELECT count(*) FROM {t} WHERE dead_at IS NULL AND attempts = 1")
        .await;
    assert_eq!((dead, waiting), (5, 6));
    assert_eq!(completed("_default", "sent"), 40.0, "{text}");
    assert_eq!(completed("refuser", "dead"), dead as f64);
    assert_eq!(completed("lost", "retry_scheduled"), waiting as f64);
    assert_eq!(
        completed("lost", "sent") + completed("refuser", "sent"),
        0.0
    );
    let fail_permanent = format!(
        "plugin=\"{}\"",
        test_plugin("test_fail_permanent").display()
    );
    assert_eq!(
        metric_sum(
            &m,
            "sluice_transform_calls_total",
            &[
                "tenant=\"refuser\"",
                &fail_permanent,
                "outcome=\"permanent\""
            ]
        ),
        5.0,
        "{text}"
    );
    // Why rows went dead: the plugin said so.
    assert_eq!(
        metric_sum(
            &m,
            "sluice_dead_letters_total",
            &["tenant=\"refuser\"", "reason=\"permanent\""]
        ),
        5.0,
        "{text}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "sluice_dead_letters_total",
            &["reason=\"attempts_exhausted\""]
        ),
        0.0
    );
    // Plugin time per tenant and plugin: each tenant's rows ran at least once.
    let builtin = "plugin=\"builtin:route-by-aggregate\"";
    assert!(
        metric_sum(
            &m,
            "sluice_transform_duration_seconds_count",
            &["tenant=\"refuser\"", &fail_permanent]
        ) >= 1.0,
        "{text}"
    );
    assert!(
        metric_sum(
            &m,
            "sluice_transform_duration_seconds_count",
            &["tenant=\"lost\"", builtin]
        ) >= 1.0,
        "{text}"
    );
    // An idle relay's waits end on its timer; nothing notifies it, and the series exist.
    assert!(
        metric_sum(&m, "sluice_poll_wakeups_total", &["cause=\"timer\""]) > 0.0,
        "{text}"
    );
    for cause in ["notify", "refill"] {
        assert!(
            m.contains_key(&format!("sluice_poll_wakeups_total{{cause=\"{cause}\"}}")),
            "{cause}: {text}"
        );
    }
    assert_eq!(
        metric_sum(&m, "sluice_poll_wakeups_total", &["cause=\"notify\""]),
        0.0
    );
    // Read from librdkafka's statistics: everything was acknowledged.
    assert_eq!(
        m.get("sluice_producer_queue_messages"),
        Some(&0.0),
        "{text}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "sluice_produce_errors_total",
            &["error_type=\"refused\""]
        ),
        6.0
    );
    // What the broker received is what the counters say was produced.
    let received = s.consume(40, Duration::from_secs(1));
    assert_eq!(received.len(), 40);
    assert_eq!(
        metric_sum(
            &m,
            "sluice_messages_produced_total",
            &["tenant=\"_default\""]
        ),
        received.len() as f64
    );
    let bytes: usize = received
        .iter()
        .map(|r| r.payload.as_ref().map_or(0, Vec::len) + r.key.as_ref().map_or(0, Vec::len))
        .sum();
    assert_eq!(
        metric_sum(&m, "sluice_produced_bytes_total", &[]),
        bytes as f64
    );
    assert_eq!(
        metric_sum(
            &m,
            "sluice_end_to_end_latency_seconds_count",
            &["tenant=\"_default\""]
        ),
        40.0
    );
    assert_eq!(metric_sum(&m, "sluice_outbox_due_rows", &[]), 0.0);
    assert_eq!(
        metric_sum(&m, "sluice_delivered_not_marked_total", &[]),
        0.0
    );
    // Every loop of `relay.workers` (default 8) runs; adaptive concurrency decides how many
    // have a batch in flight, not how many run.
    assert_eq!(metric_sum(&m, "sluice_relay_workers_running", &[]), 8.0);
    // Adaptive concurrency starts at 2 and stays between 1 and relay.workers.
    let concurrency = metric_sum(&m, "sluice_relay_batch_concurrency", &[]);
    assert!(
        (1.0..=8.0).contains(&concurrency),
        "sluice_relay_batch_concurrency = {concurrency}\n{text}"
    );
    assert!(metric_sum(&m, "process_resident_memory_bytes", &[]) > 0.0);
    assert!(text.contains("sluice_build_info{"), "{text}");
    // The version each plugin reports about itself; Sluice's own for a builtin.
    assert!(
        text.contains(&format!(
            "sluice_plugin_info{{tenant=\"refuser\",plugin=\"{}\",plugin_version=\"0.1.0\",digest=\"sha256:",
            test_plugin("test_fail_permanent").display()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "sluice_plugin_info{{tenant=\"lost\",plugin=\"builtin:route-by-aggregate\",plugin_version=\"{}\"",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    // The shipped dashboard and alert rules use only metrics that exist.
    let exposed = exposed_metric_names(&text);
    let missing: Vec<String> = deployed_metric_names()
        .into_iter()
        .filter(|name| !exposed.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "deploy/ uses metrics /metrics does not have: {missing:?}"
    );
    // Each configured tenant's one instance, made at start; `refuser`'s permanent errors hit
    // no sandbox limit.
    for tenant in ["refuser", "lost"] {
        assert_eq!(
            metric_sum(
                &m,
                "sluice_plugin_instantiations_total",
                &[&format!("tenant=\"{tenant}\""), "reason=\"start\""]
            ),
            1.0,
            "{tenant}: {text}"
        );
    }
    assert_eq!(
        metric_sum(
            &m,
            "sluice_tenant_limit_hits_total",
            &["tenant=\"refuser\""]
        ),
        0.0
    );
    promtool_check(&text);

    let (code, ready) = http_get(port, "/readyz").expect("readyz");
    assert_eq!(code, 200, "{ready}");
    let (code, _) = http_get(port, "/healthz").expect("healthz");
    assert_eq!(code, 200);
    let (code, status) = http_get(port, "/status").expect("status");
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    let refuser = status["tenants"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["tenant"] == "refuser"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(refuser["dead"], 5, "{status}");
    assert!(
        refuser["digest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:")),
        "{status}"
    );

    // `sluice status` reads the database and asks the running relay.
    let out = sluice_with_config(&["status", "--json"], &s.config("", &extra));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json");
    let lost = cli["tenants"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["tenant"] == "lost"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(lost["due"], 0, "{cli}");
    assert_eq!(lost["state"], "running", "{cli}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tenant states from the relay"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    s.finish().await;
}

/// The backlog series' labels of an exposition: each `tenant="…"` of `name` once.
fn backlog_series(text: &str, name: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .map(|l| {
            l.rsplit_once(' ')
                .map_or(l, |(series, _)| series)
                .to_owned()
        })
        .collect()
}

/// With free-form tenants every metric collapses into `_default`: the backlog gauges also
/// label the `[telemetry] laggards` worst of them by name — never more, a hostile name
/// escaped and cut, removed once they catch up — and `/status` and `sluice status` list them
/// first.
#[tokio::test(flavor = "multi_thread")]
async fn the_slowest_of_many_free_form_tenants_are_named_while_series_stay_bounded() {
    let s = Scenario::new("laggards", &["order", "customer"]).await;
    for i in 0..50 {
        s.table.insert_rows(2, Some(&format!("t-{i:02}"))).await;
    }
    s.table.insert_rows(3, Some("acme")).await;
    let hostile = format!("evil\n\u{1b}[31m\"}}{}", "x".repeat(300));
    s.table.insert_rows(2, Some(&hostile)).await;
    // t-17's rows have waited an hour, the hostile tenant's half an hour, acme's (configured)
    // two hours; the others are new.
    for (age, tenant) in [
        ("1 hour", "= 't-17'"),
        ("30 minutes", "LIKE 'evil%'"),
        ("2 hours", "= 'acme'"),
    ] {
        s.table
            .execute(&format!(
                "UPDATE {{t}} SET created_at = now() - interval '{age}' WHERE tenant {tenant}"
            ))
            .await;
    }
    // Every row held as a batch in flight holds it: the relay's claims skip them, the
    // sampler still reads them.
    let mut hold = s.table.pg_pool().begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(
        s.table.sql("SELECT id FROM {t} FOR UPDATE"),
    ))
    .fetch_all(&mut *hold)
    .await
    .expect("hold the rows");
    let port = free_port();
    let laggards = 3;
    let extra = format!(
        "[tenants.acme]\nbuiltin = \"route-by-aggregate\"\nconfig = {{ topic_prefix = \"{}\" }}\n{}laggards = {laggards}\n",
        s.prefix,
        telemetry(port)
    );
    let config = s.config("", &extra);
    let relay = RelayProcess::start(&config).expect("start relay");

    let text = scrape_until(port, |m| {
        metric_sum(
            m,
            "sluice_outbox_oldest_due_age_seconds",
            &["tenant=\"t-17\""],
        ) >= 3_000.0
    })
    .await;
    let m = parse_metrics(&text);
    for name in [
        "sluice_outbox_due_rows",
        "sluice_outbox_oldest_due_age_seconds",
        "sluice_outbox_dead_rows",
    ] {
        let series = backlog_series(&text, name);
        // acme, three laggards, `_default`: 1 configured + N + 1.
        assert_eq!(series.len(), 1 + laggards + 1, "{name}: {series:?}");
    }
    assert_eq!(
        metric_sum(&m, "sluice_outbox_due_rows", &["tenant=\"t-17\""]),
        2.0,
        "{text}"
    );
    assert_eq!(
        metric_sum(&m, "sluice_outbox_due_rows", &["tenant=\"acme\""]),
        3.0
    );
    // Labelled or not, every due row is counted once.
    assert_eq!(
        metric_sum(&m, "sluice_outbox_due_rows", &[]),
        (50 * 2 + 3 + 2) as f64,
        "{text}"
    );
    // The hostile name: control characters escaped (the exposition escapes the backslash
    // again), cut, no line longer than a bounded label allows.
    assert!(
        text.contains("tenant=\"evil \\\\u{1b}[31m\\\"}xxx"),
        "{text}"
    );
    assert!(!text.contains('\u{1b}'), "{text}");
    assert!(text.lines().all(|l| l.len() < 400), "{text}");
    promtool_check(&text);

    let (code, status) = http_get(port, "/status").expect("status");
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    let listed = status["laggards"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), laggards, "{status}");
    assert_eq!(listed[0]["tenant"], "acme", "{status}");
    assert_eq!(listed[1]["tenant"], "t-17", "{status}");
    assert_eq!(listed[1]["due"], 2);
    assert!(
        listed[1]["oldest_due_age_seconds"]
            .as_f64()
            .is_some_and(|age| age >= 3_000.0),
        "{status}"
    );
    assert_eq!(listed[2]["tenant"].as_str(), Some(hostile.as_str()));
    assert_eq!(status["saturated"], false);

    // `sluice status` ranks its own sample, the slowest first.
    let out = sluice_with_config(&["status", "--json"], &config);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json");
    assert_eq!(cli["laggards"][1]["tenant"], "t-17", "{cli}");
    let out = sluice_with_config(&["status"], &config);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0], "slowest tenants (oldest due row first):",
        "{table}"
    );
    assert!(lines[3].starts_with("t-17 "), "{table}");
    assert!(!table.contains('\u{1b}'), "{table}");
    // A sample that reads fewer rows than there are says its counts are lower bounds.
    let limited = config.replace("laggards = 3", "laggards = 3\nsample_limit = 50");
    let out = sluice_with_config(&["status", "--json"], &limited);
    let cli: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json");
    assert_eq!(cli["saturated"], true, "{cli}");

    // Released, the rows are sent: the laggards' series go, none is left stale.
    hold.rollback().await.expect("release the rows");
    let text = scrape_until(port, |m| {
        metric_sum(m, "sluice_outbox_due_rows", &[]) == 0.0
            && !m.keys().any(|series| series.contains("t-17"))
    })
    .await;
    let series = backlog_series(&text, "sluice_outbox_due_rows");
    assert_eq!(series.len(), 2, "acme and _default: {series:?}");
    assert!(!text.contains("evil"), "{text}");
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    s.finish().await;
}

/// A Tansu of the test's own (to stop and resume), a fresh outbox table, and the reference
/// router's two topics on that broker: (broker, bootstrap, table, topic prefix).
async fn own_broker_and_table(stem: &str) -> (OwnTansu, String, DbTable, String) {
    let kafka_port = free_port();
    let tansu = OwnTansu::start(kafka_port);
    let bootstrap = format!("127.0.0.1:{kafka_port}");
    let table = DbTable::create(Database::Postgres, stem).await;
    let prefix = format!("{}.", table.name);
    let topics = vec![format!("{prefix}order"), format!("{prefix}customer")];
    let created = wait_until(Duration::from_secs(30), || async {
        create_topics(&bootstrap, &topics).await.is_ok()
    })
    .await;
    assert!(created, "own broker did not start");
    (tansu, bootstrap, table, prefix)
}

/// Whether `/readyz` on `port` answers `want` within [`SCRAPE_WAIT`].
async fn readyz_becomes(port: u16, want: u16) -> bool {
    wait_until(SCRAPE_WAIT, || async move {
        http_get(port, "/readyz").is_some_and(|(code, _)| code == want)
    })
    .await
}

/// What `/readyz` on `port` answers now (empty when nothing answers).
fn readyz_body(port: u16) -> String {
    http_get(port, "/readyz")
        .map(|(_, b)| b)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn readyz_turns_unready_while_the_broker_is_stopped_and_ready_when_it_resumes() {
    let (tansu, bootstrap, table, prefix) = own_broker_and_table("readyz").await;
    let port = free_port();
    let config = relay_config(&table.name, &bootstrap, &prefix, "", &telemetry(port));
    let relay = RelayProcess::start(&config).expect("start relay");
    assert!(
        readyz_becomes(port, 200).await,
        "never ready: {}",
        relay.log()
    );

    tansu.signal("STOP");
    let unready = readyz_becomes(port, 503).await;
    let body = readyz_body(port);
    tansu.signal("CONT");
    assert!(
        unready,
        "still ready with the broker stopped: {}",
        relay.log()
    );
    assert!(body.contains("\"kafka\":false"), "{body}");
    // Liveness is not readiness: the process and its workers are fine.
    assert_eq!(http_get(port, "/healthz").map(|(c, _)| c), Some(200));

    assert!(
        readyz_becomes(port, 200).await,
        "not ready again after the broker resumed: {}",
        relay.log()
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    table.drop_table().await;
}

/// A database that answers its connections' pings but not the relay's statements (here: the
/// outbox table held under an exclusive lock, as a careless migration would) makes the relay
/// unready once a sample has waited 5 s, instead of leaving `/readyz` on its last answer.
#[tokio::test(flavor = "multi_thread")]
async fn readyz_turns_unready_while_the_outbox_table_is_locked_and_ready_after() {
    let s = Scenario::new("readyz_lock", &["order", "customer"]).await;
    let port = free_port();
    let relay = RelayProcess::start(&s.config("", &telemetry(port))).expect("start relay");
    assert!(
        readyz_becomes(port, 200).await,
        "never ready: {}",
        relay.log()
    );

    let mut lock = s.table.pg_pool().begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE \"{}\" IN ACCESS EXCLUSIVE MODE",
        s.table.name
    )))
    .execute(&mut *lock)
    .await
    .expect("lock the outbox table");
    let unready = readyz_becomes(port, 503).await;
    let body = readyz_body(port);
    lock.rollback().await.expect("release the lock");
    assert!(
        unready,
        "still ready while no statement on the table was answered: {}",
        relay.log()
    );
    assert!(body.contains("\"database\":false"), "{body}");

    assert!(
        readyz_becomes(port, 200).await,
        "not ready again after the lock was released: {}",
        relay.log()
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn trace_context_headers_reach_kafka_unchanged() {
    let s = Scenario::new("trace", &["order"]).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let tracestate = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
    s.table
        .execute(&format!(
            "INSERT INTO {{t}} (aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ('order', 'o-1', 'OrderCreated', '{{}}',
                     jsonb_build_object('traceparent', '{traceparent}', 'tracestate', '{tracestate}'))"
        ))
        .await;
    s.relay_until(&s.config("", ""), || async { s.table.count().await == 0 })
        .await;
    let got = s.consume(1, Duration::from_millis(500));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("traceparent").as_deref(), Some(traceparent));
    assert_eq!(got[0].header("tracestate").as_deref(), Some(tracestate));
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn log_format_json_writes_one_json_object_per_line() {
    let table = DbTable::create(Database::Postgres, "jsonlog").await;
    let config = relay_config(&table.name, &kafka_bootstrap(), "x.", "", "");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, config).expect("write config");
    let out = sluice_with_env(
        &["drain", "--config", &path.display().to_string()],
        &[("SLUICE_LOG_FORMAT", "json"), ("RUST_LOG", "info")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let logs: Vec<serde_json::Value> = stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert!(
        logs.iter()
            .any(|l| l["fields"]["message"] == "draining" && l["level"] == "INFO"),
        "{stderr}"
    );
    table.drop_table().await;
}

/// The `plugin_version` and `digest` labels of a tenant's `sluice_plugin_info` series.
fn plugin_info(text: &str, tenant: &str) -> Option<(String, String, String)> {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("sluice_plugin_info{{tenant=\"{tenant}\",")))?;
    let label = |name: &str| {
        let start = line.find(&format!("{name}=\""))? + name.len() + 2;
        let len = line[start..].find('"')?;
        Some(line[start..start + len].to_owned())
    };
    Some((label("plugin")?, label("plugin_version")?, label("digest")?))
}

#[tokio::test(flavor = "multi_thread")]
async fn plugin_info_shows_the_version_and_digest_a_hot_reload_brought() {
    let s = Scenario::new("pluginfo", &["order", "customer", "a", "b"]).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("acme.wasm");
    std::fs::copy(reference_plugin(), &plugin).unwrap();
    let port = free_port();
    let extra = format!(
        "[tenants.acme]\npath = \"{}\"\nconfig = {{ topic_prefix = \"{}\" }}\n{}",
        plugin.display(),
        s.prefix,
        telemetry(port)
    );
    let relay = RelayProcess::start(&s.config("", &extra)).expect("start relay");
    let before = scrape_until(port, |m| {
        metric_sum(m, "sluice_plugin_info", &["tenant=\"acme\""]) == 1.0
    })
    .await;
    let (path, version, digest) = plugin_info(&before, "acme").expect("acme's plugin info");
    assert_eq!(path, plugin.display().to_string());
    assert_eq!(version, "0.1.0", "the reference plugin's info(): {before}");

    // Replaced by the fan-out test plugin, which reports version 0.2.0.
    let tmp = dir.path().join("acme.wasm.new");
    std::fs::copy(test_plugin("test_fanout"), &tmp).unwrap();
    std::fs::rename(&tmp, &plugin).unwrap();
    let after = scrape_until(port, |m| {
        metric_sum(
            m,
            "sluice_plugin_info",
            &["tenant=\"acme\"", "plugin_version=\"0.2.0\""],
        ) == 1.0
    })
    .await;
    let (path_after, _, digest_after) = plugin_info(&after, "acme").expect("acme's plugin info");
    assert_eq!(
        path_after, path,
        "the plugin label stays the configured path"
    );
    assert_ne!(digest_after, digest, "{after}");
    // One series per tenant: the old version's is gone.
    assert_eq!(
        metric_sum(
            &parse_metrics(&after),
            "sluice_plugin_info",
            &["tenant=\"acme\""]
        ),
        1.0,
        "{after}"
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn healthz_fails_while_a_worker_is_stuck_in_a_batch_and_recovers_after() {
    let (tansu, bootstrap, table, prefix) = own_broker_and_table("healthz").await;
    let port = free_port();
    // A batch waits up to a minute for its acknowledgements; 3 s in hand counts as stuck.
    let extra = telemetry(port) + "stalled_after = \"3s\"\n";
    let config = relay_config(&table.name, &bootstrap, &prefix, "", &extra).replace(
        "\"bootstrap.servers\"",
        "\"message.timeout.ms\" = \"60000\"\n\"bootstrap.servers\"",
    );
    let relay = RelayProcess::start(&config).expect("start relay");
    let healthz =
        |want: u16| async move { http_get(port, "/healthz").is_some_and(|(code, _)| code == want) };
    table.insert_rows(4, None).await;
    let delivered = wait_until(SCRAPE_WAIT, || async { table.count().await == 0 }).await;
    assert!(delivered, "{}", relay.log());
    assert!(
        wait_until(SCRAPE_WAIT, || healthz(200)).await,
        "{}",
        relay.log()
    );

    // The broker stalls with a batch in flight: its worker waits for acknowledgements.
    tansu.signal("STOP");
    table.insert_rows(4, None).await;
    let stuck = wait_until(SCRAPE_WAIT, || healthz(503)).await;
    let body = http_get(port, "/healthz")
        .map(|(_, b)| b)
        .unwrap_or_default();
    tansu.signal("CONT");
    assert!(stuck, "still healthy with a stuck worker: {}", relay.log());
    let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    assert!(
        body["workers_stalled"].as_u64().is_some_and(|n| n >= 1),
        "{body}"
    );

    // The batch completes once the broker answers: healthy again, rows delivered.
    assert!(
        wait_until(SCRAPE_WAIT, || healthz(200)).await,
        "not healthy again after the broker resumed: {}",
        relay.log()
    );
    let delivered = wait_until(SCRAPE_WAIT, || async { table.count().await == 0 }).await;
    assert!(delivered, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    table.drop_table().await;
}

/// A GET of `path` on `127.0.0.1:port` with `authorization` as the `Authorization` header:
/// the status code, the `WWW-Authenticate` header and the body (`None`: nothing answers).
fn get_with(
    port: u16,
    path: &str,
    authorization: Option<&str>,
) -> Option<(u16, Option<String>, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let header = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{header}\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let challenge = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("www-authenticate")
            .then(|| value.trim().to_owned())
    });
    Some((code, challenge, body.to_owned()))
}

/// Waits until the relay on `port` is ready (probes need no credentials).
async fn ready_without_credentials(port: u16, relay: &RelayProcess) {
    assert!(
        readyz_becomes(port, 200).await,
        "never ready: {}",
        relay.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bearer_token_from_a_file_guards_metrics_and_status_but_not_the_probes() {
    let s = Scenario::new("tel_token", &["order", "customer"]).await;
    let port = free_port();
    let secrets = tempfile::tempdir().expect("temporary directory");
    let token = format!("tok-{}", unique("t"));
    let token_file = secrets.path().join("metrics-token");
    std::fs::write(&token_file, format!("{token}\n")).expect("token file");
    let extra =
        telemetry(port) + &format!("bearer_token = \"${{file:{}}}\"\n", token_file.display());
    let config = s.config("", &extra);
    let relay = RelayProcess::start(&config).expect("start relay");
    ready_without_credentials(port, &relay).await;

    let bearer = format!("Bearer {token}");
    for path in ["/metrics", "/status"] {
        let (code, challenge, _) = get_with(port, path, None).expect(path);
        assert_eq!(code, 401, "{path} without credentials");
        assert_eq!(
            challenge.as_deref(),
            Some("Bearer realm=\"sluice\""),
            "{path}"
        );
        let (code, _, _) = get_with(port, path, Some("Bearer not-the-token")).expect(path);
        assert_eq!(code, 401, "{path} with a wrong token");
        let (code, _, _) = get_with(port, path, Some(&format!("{bearer}x"))).expect(path);
        assert_eq!(code, 401, "{path} with a longer token");
        let (code, _, body) = get_with(port, path, Some(&bearer)).expect(path);
        assert_eq!(code, 200, "{path} with the token: {body}");
    }
    let (_, _, metrics) = get_with(port, "/metrics", Some(&bearer)).expect("metrics");
    assert!(metrics.contains("sluice_dependency_up"), "{metrics}");
    for path in ["/healthz", "/readyz"] {
        let (code, _, body) = get_with(port, path, None).expect(path);
        assert_eq!(code, 200, "{path} without credentials: {body}");
    }

    // `sluice status` sends the credentials of the config it is given.
    let out = sluice_with_config(&["status", "--json"], &config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("tenant states from the relay"), "{stderr}");
    let without = config.replace(
        &format!("bearer_token = \"${{file:{}}}\"\n", token_file.display()),
        "",
    );
    let out = sluice_with_config(&["status", "--json"], &without);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("answered 401"), "{stderr}");
    assert!(!stderr.contains(&token), "{stderr}");

    // A rotated token file and SIGHUP: the new token is required from then on.
    let rotated = format!("tok-{}", unique("r"));
    std::fs::write(&token_file, format!("{rotated}\n")).expect("token file");
    relay.hangup();
    let new_bearer = format!("Bearer {rotated}");
    let took_new = wait_until(SCRAPE_WAIT, || {
        let code = get_with(port, "/metrics", Some(&new_bearer)).map(|(c, _, _)| c);
        async move { code == Some(200) }
    })
    .await;
    assert!(
        took_new,
        "the rotated token was not accepted: {}",
        relay.log()
    );
    let (code, _, _) = get_with(port, "/status", Some(&bearer)).expect("status");
    assert_eq!(code, 401, "the old token after rotation");

    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    for secret in [&token, &rotated] {
        assert!(
            !exit.log.contains(secret.as_str()),
            "a token was logged: {}",
            exit.log
        );
    }
    assert!(
        exit.log
            .contains("/metrics and /status take the re-read [telemetry] credentials"),
        "{}",
        exit.log
    );
    assert!(exit.log.contains("access=\"bearer token\""), "{}", exit.log);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn basic_auth_guards_metrics_and_status_but_not_the_probes() {
    let s = Scenario::new("tel_basic", &["order", "customer"]).await;
    let port = free_port();
    let extra = telemetry(port)
        + "basic_auth_username = \"prometheus\"\nbasic_auth_password = \"pa:ss w0rd\"\n";
    let relay = RelayProcess::start(&s.config("", &extra)).expect("start relay");
    ready_without_credentials(port, &relay).await;

    let basic = |user_pass: &str| {
        format!(
            "Basic {}",
            openssl::base64::encode_block(user_pass.as_bytes())
        )
    };
    for path in ["/metrics", "/status"] {
        let (code, challenge, _) = get_with(port, path, None).expect(path);
        assert_eq!(code, 401, "{path} without credentials");
        assert_eq!(
            challenge.as_deref(),
            Some("Basic realm=\"sluice\""),
            "{path}"
        );
        for wrong in ["prometheus:pa:ss", "grafana:pa:ss w0rd", "prometheus:"] {
            let (code, _, _) = get_with(port, path, Some(&basic(wrong))).expect(path);
            assert_eq!(code, 401, "{path} as {wrong}");
        }
        let (code, _, body) =
            get_with(port, path, Some(&basic("prometheus:pa:ss w0rd"))).expect(path);
        assert_eq!(code, 200, "{path} with the credentials: {body}");
    }
    for path in ["/healthz", "/readyz"] {
        let (code, _, body) = get_with(port, path, None).expect(path);
        assert_eq!(code, 200, "{path} without credentials: {body}");
    }
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn listen_takes_a_host_name() {
    let s = Scenario::new("tel_host", &["order", "customer"]).await;
    let port = free_port();
    let config = s.config("", &telemetry(port)).replace(
        &format!("listen = \"127.0.0.1:{port}\""),
        &format!("listen = \"localhost:{port}\""),
    );
    assert!(config.contains("localhost:"), "{config}");
    let out = sluice_with_config(&["config", "check"], &config);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let relay = RelayProcess::start(&config).expect("start relay");
    let healthy = wait_until(SCRAPE_WAIT, || async {
        http_get(port, "/healthz").is_some_and(|(code, _)| code == 200)
    })
    .await;
    assert!(
        healthy,
        "/healthz never answered on localhost: {}",
        relay.log()
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(
        exit.log.contains(&format!("listen=localhost:{port}")),
        "{}",
        exit.log
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn config_check_names_a_listen_address_without_a_port_or_that_does_not_resolve() {
    let base = relay_config(
        "outbox",
        &kafka_bootstrap(),
        "outbox.",
        "",
        &telemetry(9464),
    );
    for (listen, says) in [
        ("localhost", "has no port"),
        (
            "no-such-host.invalid:9464",
            "cannot resolve no-such-host.invalid:9464",
        ),
    ] {
        let config = base.replace("127.0.0.1:9464", listen);
        let out = sluice_with_config(&["config", "check"], &config);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{listen}: {stdout}");
        let line = stdout
            .lines()
            .find(|l| l.contains("telemetry.listen"))
            .unwrap_or_else(|| panic!("{listen}: no telemetry.listen problem in {stdout}"));
        assert!(line.contains(says), "{listen}: {line}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn config_check_refuses_conflicting_or_empty_telemetry_credentials() {
    let base = relay_config(
        "outbox",
        &kafka_bootstrap(),
        "outbox.",
        "",
        &telemetry(9464),
    );
    for (extra, key, says) in [
        (
            "bearer_token = \"abc-secret\"\nbasic_auth_username = \"u\"\nbasic_auth_password = \"abc-secret\"\n",
            "telemetry.bearer_token",
            "not both",
        ),
        (
            "bearer_token = \"\"\n",
            "telemetry.bearer_token",
            "is empty",
        ),
        (
            "basic_auth_username = \"u\"\n",
            "telemetry.basic_auth_password",
            "missing",
        ),
    ] {
        let out = sluice_with_config(&["config", "check"], &(base.clone() + extra));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{extra}: {stdout}");
        let line = stdout
            .lines()
            .find(|l| l.contains(key))
            .unwrap_or_else(|| panic!("{extra}: no {key} problem in {stdout}"));
        assert!(line.contains(says), "{extra}: {line}");
        assert!(!stdout.contains("abc-secret"), "{stdout}");
    }
}
