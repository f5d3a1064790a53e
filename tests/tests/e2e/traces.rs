//! Traces through the outbox, end to end through the binary, on PostgreSQL, MariaDB and
//! SQLite: a Debezium-shaped table whose `tracingspancontext` column holds the application's
//! trace context (Java-properties form, or a bare `traceparent`), `[tracing]` exporting to an
//! OTLP/HTTP receiver built on the OpenTelemetry project's own protobufs
//! (tests/otlp/receiver.py, PyPI opentelemetry-proto; not Sluice's code). Checked: the Kafka
//! message's `traceparent` continues the row's trace under the relay's publish span; the
//! receiver got the wait, transform and publish spans under the application's span, with
//! their attributes; a row whose parent is not sampled exports nothing but still propagates;
//! an invalid context is not passed on and is counted. And a collector that is not there, or
//! accepts connections but never answers, costs no row, does not stall the relay, keeps
//! `/readyz` green, and the dropped spans are counted. A context in the `headers` column
//! continues the same way on a NATS JetStream tenant (the host stamps it for every broker).
//! The same messages carry the table's two extra columns as headers (`[database.columns]
//! extra`, the builtin router's `additional_placement`) and the row's `timestamp` as the Kafka
//! record timestamp: everything a Debezium-shaped row carries reaches the message.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use sluice_testkit::*;

/// The application's span (sampled), as its tracing library wrote it.
const SAMPLED_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SAMPLED_PARENT: &str = "00f067aa0ba902b7";
const TRACESTATE: &str = "congo=t61rcWkgMzE";
/// Another application span whose trace was not sampled.
const UNSAMPLED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

/// The Python with opentelemetry-proto that `scripts/test` installs (see
/// scripts/plugin-toolchains.sh, `ensure_otlp_proto_python`).
fn python() -> String {
    std::env::var("SLUICE_OTLP_PYTHON").unwrap_or_else(|_| {
        panic!(
            "SLUICE_OTLP_PYTHON is not set: run the tests through scripts/test, or \
             `. scripts/plugin-toolchains.sh; ensure_otlp_proto_python` first"
        )
    })
}

/// tests/otlp/receiver.py, listening on a port of its own, writing spans to a file.
struct Receiver {
    child: Child,
    port: u16,
    out: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Receiver {
    fn start() -> Self {
        Self::start_with(&[])
    }

    /// A receiver misbehaving as `args` say (`--max-spans N`, `--stall-first S`).
    fn start_with(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("spans.jsonl");
        let mut child = Command::new(python())
            .arg(repo_root().join("tests/otlp/receiver.py"))
            .args(["--port", "0", "--out"])
            .arg(&out)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the OTLP receiver");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the receiver's port");
        let port = line.trim().parse().expect("a port number");
        Self {
            child,
            port,
            out,
            _dir: dir,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Debezium-shaped table on `database`: Debezium's columns, the Quarkus extension's
/// `timestamp` and `tracingspancontext`, and two columns of the application's own (`region`,
/// `created_by`) that reach the messages as headers.
fn create_sql(database: Database) -> &'static str {
    match database {
        Database::Postgres => {
            "CREATE TABLE {t} (
                id                 bigserial PRIMARY KEY,
                aggregatetype      varchar(255) NOT NULL,
                aggregateid        varchar(255) NOT NULL,
                type               varchar(255) NOT NULL,
                payload            jsonb,
                \"timestamp\"      timestamptz NOT NULL DEFAULT now(),
                tracingspancontext varchar(512),
                region             text,
                created_by         text
            )"
        }
        Database::Mariadb => {
            "CREATE TABLE {t} (
                id                 BIGINT AUTO_INCREMENT PRIMARY KEY,
                aggregatetype      varchar(255) NOT NULL,
                aggregateid        varchar(255) NOT NULL,
                type               varchar(255) NOT NULL,
                payload            longtext,
                `timestamp`        DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                tracingspancontext varchar(512),
                region             text,
                created_by         text
            )"
        }
        Database::Sqlite => {
            "CREATE TABLE {t} (
                id                 INTEGER PRIMARY KEY AUTOINCREMENT,
                aggregatetype      TEXT NOT NULL,
                aggregateid        TEXT NOT NULL,
                type               TEXT NOT NULL,
                payload            TEXT,
                \"timestamp\"      TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
                tracingspancontext TEXT,
                region             TEXT,
                created_by         TEXT
            )"
        }
    }
}

/// SQL for "five seconds ago" in UTC, in `database`'s dialect.
fn five_seconds_ago(database: Database) -> &'static str {
    match database {
        Database::Postgres => "now() - interval '5 seconds'",
        Database::Mariadb => "UTC_TIMESTAMP(6) - INTERVAL 5 SECOND",
        Database::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-5 seconds')",
    }
}

/// Inserts one row of aggregate `aggregate_id` with `context` in `tracingspancontext`.
async fn insert(table: &DbTable, aggregate_id: &str, context: Option<&str>) {
    let context = context.map_or("NULL".to_owned(), |c| format!("'{c}'"));
    insert_sql(table, aggregate_id, &context).await;
}

/// Inserts one row of aggregate `aggregate_id` whose `tracingspancontext` is the SQL
/// expression `context`.
async fn insert_sql(table: &DbTable, aggregate_id: &str, context: &str) {
    let quote = if table.database == Database::Mariadb {
        '`'
    } else {
        '"'
    };
    table
        .execute(&format!(
            "INSERT INTO {{t}} (aggregatetype, aggregateid, type, payload, {quote}timestamp{quote},
                                tracingspancontext, region, created_by)
             VALUES ('Order', '{aggregate_id}', 'OrderCreated', '{{\"n\": 1}}', {ago}, {context},
                     'eu-west', 'alice')",
            ago = five_seconds_ago(table.database),
        ))
        .await;
}

/// The relay's configuration for the Debezium table: the column map of docs/debezium.md plus
/// `timestamp` and `tracingspancontext`; `[tracing]` toward `endpoint`; `[telemetry]` on `port`.
fn config(s: &Scenario, endpoint: &str, port: u16, tracing_extra: &str) -> String {
    format!(
        r#"
[database]
url = "{db}"
table = "{table}"

[database.columns]
aggregate_type = "aggregatetype"
aggregate_id = "aggregateid"
event_type = "type"
created_at = "timestamp"
trace_context = "tracingspancontext"
extra = ["region", "created_by"]

[relay]
poll_interval = "100ms"

[kafka]
"bootstrap.servers" = "{bootstrap}"

[plugins.default]
builtin = "route-by-aggregate"
config = {{ topic_prefix = "{prefix}", additional_placement = "region:header,created_by:header:author" }}

[telemetry]
listen = "127.0.0.1:{port}"
sample_interval = "1s"

[tracing]
otlp_endpoint = "{endpoint}"
{tracing_extra}
"#,
        db = s.table.url,
        table = s.table.name,
        bootstrap = kafka_bootstrap(),
        prefix = s.prefix,
    )
}

/// Creates the table on `database`, runs `sluice migrate` for it, and its topic.
async fn debezium_scenario(database: Database, stem: &str) -> Scenario {
    migrated(DbTable::create_with_sql(database, stem, create_sql(database)).await).await
}

/// The scenario of the Debezium-shaped `table`: `sluice migrate` run for it, its topic made.
async fn migrated(table: DbTable) -> Scenario {
    let s = Scenario::with_table(table, &["Order"]).await;
    let out = sluice_with_config(&["migrate"], &config(&s, "http://127.0.0.1:4318", 1, ""));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    s
}

fn text<'a>(span: &'a Value, key: &str) -> &'a str {
    span[key].as_str().unwrap_or_default()
}

async fn context_continues_into_kafka_and_the_collector(database: Database) {
    let s = debezium_scenario(database, "trace").await;
    let receiver = Receiver::start();
    let sampled =
        format!("traceparent=00-{SAMPLED_TRACE}-{SAMPLED_PARENT}-01\ntracestate={TRACESTATE}");
    insert(&s.table, "sampled", Some(&sampled)).await;
    insert(&s.table, "unsampled", Some(UNSAMPLED)).await;
    insert(&s.table, "invalid", Some("traceparent=00-zz-01")).await;
    insert(&s.table, "none", None).await;

    let port = free_port();
    let config = config(&s, &receiver.endpoint(), port, "sample_ratio = 0.0");
    let relay = RelayProcess::start(&config).expect("start relay");
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    let sent = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(sent, "rows not sent: {}", relay.log());
    // The sampled row's three spans, exported within the export task's gathering delay.
    let exported = wait_until(Duration::from_secs(30), || {
        let n = receiver.spans().len();
        async move { n >= 3 }
    })
    .await;
    let metrics = http_get(port, "/metrics")
        .map(|(_, t)| t)
        .unwrap_or_default();
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(
        exported,
        "spans not exported: {:?}\n{}",
        receiver.spans(),
        exit.log
    );

    let got = s.consume(4, Duration::from_millis(500));
    assert_eq!(got.len(), 4, "{got:#?}");
    let by_key: HashMap<String, &Received> = got.iter().map(|m| (m.key_str(), m)).collect();

    // The sampled row: same trace, the relay's publish span as the parent, state kept.
    let message = by_key["sampled"];
    let traceparent = message.header("traceparent").expect("traceparent");
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields.len(), 4, "{traceparent}");
    assert_eq!(
        (fields[0], fields[1], fields[3]),
        ("00", SAMPLED_TRACE, "01")
    );
    assert_ne!(
        fields[2], SAMPLED_PARENT,
        "the message's parent is the relay's span"
    );
    assert_eq!(message.header("tracestate").as_deref(), Some(TRACESTATE));
    // The extra columns, placed as headers, and the row's `timestamp` as the record's.
    assert_eq!(message.header("region").as_deref(), Some("eu-west"));
    assert_eq!(message.header("author").as_deref(), Some("alice"));
    let record_ms = message.timestamp.expect("a record timestamp");

    let spans = receiver.spans();
    assert_eq!(spans.len(), 3, "only the sampled row exports: {spans:#?}");
    assert!(
        spans.iter().all(|s| text(s, "trace_id") == SAMPLED_TRACE
            && text(s, "parent_span_id") == SAMPLED_PARENT
            && text(s, "service") == "sluice"),
        "{spans:#?}"
    );
    let named = |name: &str| {
        spans
            .iter()
            .find(|s| text(s, "name") == name)
            .unwrap_or_else(|| panic!("no span {name}: {spans:#?}"))
    };
    let publish = named(&format!("send {}", s.topics[0]));
    assert_eq!(
        text(publish, "span_id"),
        fields[2],
        "the message names the publish span"
    );
    assert_eq!(publish["kind"], 4, "SPAN_KIND_PRODUCER");
    let attributes = &publish["attributes"];
    assert_eq!(attributes["messaging.system"], "kafka");
    assert_eq!(
        attributes["messaging.destination.name"],
        s.topics[0].as_str()
    );
    assert_eq!(attributes["messaging.operation.name"], "send");
    assert_eq!(attributes["sluice.attempt"], 1);
    assert_eq!(attributes["sluice.tenant"], "default");
    // Where the broker stored it, from its delivery report: the record read back.
    assert_eq!(
        attributes["messaging.destination.partition.id"],
        message.partition.to_string().as_str(),
        "{publish}"
    );
    assert_eq!(
        attributes["messaging.kafka.offset"], message.offset,
        "{publish}"
    );

    let wait = named("sluice.outbox.wait");
    assert_eq!(
        wait["start_ns"].as_u64().map(|ns| ns / 1_000_000),
        u64::try_from(record_ms).ok(),
        "the record timestamp and the wait's start are both the row's timestamp: {wait}"
    );
    let waited = wait["end_ns"].as_u64().unwrap_or(0) - wait["start_ns"].as_u64().unwrap_or(0);
    assert!(
        waited >= 4_000_000_000,
        "the wait starts at the row's timestamp, 5 s before the insert: {wait}"
    );
    let transform = named("sluice.transform");
    assert_eq!(transform["attributes"]["sluice.transform.outcome"], "ok");
    assert_eq!(transform["attributes"]["sluice.tenant"], "default");
    let plugin = transform["attributes"]["sluice.plugin"]
        .as_str()
        .unwrap_or_default();
    assert!(plugin.contains("route-by-aggregate"), "{transform}");
    assert!(
        wait["end_ns"].as_u64() <= publish["start_ns"].as_u64(),
        "{spans:#?}"
    );

    // Not sampled: passed on as it came, nothing exported.
    assert_eq!(
        by_key["unsampled"].header("traceparent").as_deref(),
        Some(UNSAMPLED)
    );
    // Invalid: not passed on, counted; no context, ratio 0: nothing.
    assert_eq!(by_key["invalid"].header("traceparent"), None);
    assert_eq!(by_key["none"].header("traceparent"), None);
    let samples = parse_metrics(&metrics);
    assert_eq!(
        metric_sum(&samples, "sluice_trace_contexts_invalid_total", &[]),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        metric_sum(&samples, "sluice_trace_spans_dropped_total", &[]),
        0.0,
        "{metrics}"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn trace_context_continues_into_kafka_and_the_collector_on_postgres() {
    context_continues_into_kafka_and_the_collector(Database::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn trace_context_continues_into_kafka_and_the_collector_on_mariadb() {
    context_continues_into_kafka_and_the_collector(Database::Mariadb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn trace_context_continues_into_kafka_and_the_collector_on_sqlite() {
    context_continues_into_kafka_and_the_collector(Database::Sqlite).await;
}

/// Inserts 300 sampled rows in three statements.
async fn insert_sampled(s: &Scenario, wave: u32) {
    let sampled = format!("traceparent=00-{SAMPLED_TRACE}-{SAMPLED_PARENT}-01");
    for batch in 0..3 {
        s.table
            .execute(&format!(
                "INSERT INTO {{t}} (aggregatetype, aggregateid, type, payload, tracingspancontext)
                 SELECT 'Order', 'o-{wave}-{batch}-' || g, 'OrderCreated', '{{}}', '{sampled}'
                   FROM generate_series(1, 100) AS g"
            ))
            .await;
    }
}

/// Relays sampled rows toward `endpoint` (a collector that is not answering), with an
/// `export_timeout` of 30 s: a second wave of rows, inserted while the first wave's export
/// hangs, is sent within seconds (the relay never waits for the collector), `/readyz` is
/// 200, spans are dropped and counted, and the relay stops promptly.
async fn a_silent_collector_costs_no_row(stem: &str, endpoint: &str) {
    let s = debezium_scenario(Database::Postgres, stem).await;
    insert_sampled(&s, 1).await;
    let port = free_port();
    let config = config(
        &s,
        endpoint,
        port,
        "export_timeout = \"30s\"\nqueue_size = 16",
    );
    let relay = RelayProcess::start(&config).expect("start relay");
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    let sent = wait_until(Duration::from_secs(30), || async {
        s.table.count().await == 0
    })
    .await;
    assert!(sent, "first wave not sent: {}", relay.log());
    // The first export is under way (it starts 200 ms after the first span) and hangs.
    tokio::time::sleep(Duration::from_secs(1)).await;
    insert_sampled(&s, 2).await;
    let started = std::time::Instant::now();
    let sent = wait_until(Duration::from_secs(10), || async {
        s.table.count().await == 0
    })
    .await;
    let took = started.elapsed();
    assert!(sent, "second wave not sent within 10 s: {}", relay.log());
    // Ready once the first dependency checks ran (every `sample_interval`), the collector
    // silent all along.
    let ready = wait_until(Duration::from_secs(15), || {
        let code = http_get(port, "/readyz").map(|(code, _)| code);
        async move { code == Some(200) }
    })
    .await;
    let readyz = http_get(port, "/readyz");
    let dropped = wait_until(Duration::from_secs(20), || {
        let text = http_get(port, "/metrics")
            .map(|(_, t)| t)
            .unwrap_or_default();
        let n = metric_sum(
            &parse_metrics(&text),
            "sluice_trace_spans_dropped_total",
            &[],
        );
        async move { n > 0.0 }
    })
    .await;
    let stopping = std::time::Instant::now();
    let exit = relay.stop();
    let stop_took = stopping.elapsed();
    assert!(exit.success, "{}", exit.log);
    assert!(
        ready,
        "/readyz must not depend on the collector: {readyz:?}"
    );
    assert!(dropped, "no dropped span counted: {}", exit.log);
    assert!(
        stop_took < Duration::from_secs(15),
        "the stop waited for the collector ({stop_took:?}): {}",
        exit.log
    );
    assert_eq!(s.consume(600, Duration::from_millis(200)).len(), 600);
    eprintln!("{stem}: second wave of 300 rows sent in {took:?}, stopped in {stop_took:?}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_collector_costs_no_row_and_drops_counted_spans() {
    // A port nobody listens on: connections are refused.
    let closed = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    a_silent_collector_costs_no_row("trace_closed", &format!("http://127.0.0.1:{port}")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_collector_costs_no_row_and_drops_counted_spans() {
    // Accepts connections and reads nothing, answers nothing.
    let stalled = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", stalled.local_addr().expect("addr"));
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in stalled.incoming().take(64) {
            open.push(stream);
        }
        open.len()
    });
    a_silent_collector_costs_no_row("trace_stalled", &endpoint).await;
    drop(held);
}

/// The context in the row's `headers` column, a NATS JetStream tenant: the message's
/// `traceparent` header names the relay's publish span, which the receiver got with
/// `messaging.system = nats`, under the application's span.
#[tokio::test(flavor = "multi_thread")]
async fn a_context_in_the_headers_column_continues_on_nats() {
    let table = DbTable::create(Database::Postgres, "trace_nats").await;
    let prefix = format!("{}.", table.name);
    let subject = format!("{prefix}order");
    let nats = NatsStreams::connect(&nats_url()).await.expect("NATS");
    nats.create_stream(&table.name, std::slice::from_ref(&subject))
        .await
        .expect("create a NATS stream");
    table
        .execute(&format!(
            "INSERT INTO {{t}} (tenant, aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ('acme', 'order', 'o-1', 'OrderCreated', '{{}}',
                     '{{\"traceparent\": \"00-{SAMPLED_TRACE}-{SAMPLED_PARENT}-01\"}}')"
        ))
        .await;
    let receiver = Receiver::start();
    let config = table.config(&kafka_bootstrap(), &prefix, "", "", "")
        + &format!(
            "[nats]\nurl = \"{}\"\n\n[tenants.acme]\nbroker = \"nats\"\n\n\
             [tracing]\notlp_endpoint = \"{}\"\n",
            nats_url(),
            receiver.endpoint()
        );
    let relay = RelayProcess::start(&config).expect("start relay");
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    let sent = wait_until(SCENARIO_WAIT, || async { table.count().await == 0 }).await;
    let exported = wait_until(Duration::from_secs(30), || {
        let n = receiver.spans().len();
        async move { n >= 3 }
    })
    .await;
    let exit = relay.stop();
    assert!(sent && exported && exit.success, "{}", exit.log);

    let got = nats
        .read_stream(&table.name, 1, SCENARIO_WAIT, Duration::from_millis(200))
        .await
        .expect("read NATS");
    assert_eq!(got.len(), 1);
    let traceparent = got[0].header("traceparent").expect("traceparent");
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(
        (fields[1], fields[3]),
        (SAMPLED_TRACE, "01"),
        "{traceparent}"
    );
    let spans = receiver.spans();
    let publish = spans
        .iter()
        .find(|s| text(s, "name") == format!("send {subject}"))
        .unwrap_or_else(|| panic!("no publish span: {spans:#?}"));
    assert_eq!(text(publish, "span_id"), fields[2]);
    assert_eq!(text(publish, "parent_span_id"), SAMPLED_PARENT);
    assert_eq!(publish["attributes"]["messaging.system"], "nats");
    assert_eq!(publish["attributes"]["sluice.tenant"], "acme");
    // Where JetStream stored it, from the publish acknowledgement: the stream's sequence.
    assert_eq!(
        publish["attributes"]["sluice.nats.stream.sequence"], got[0].sequence,
        "{publish}"
    );
    assert_eq!(
        publish["attributes"].get("messaging.destination.partition.id"),
        None,
        "{publish}"
    );
    let _ = nats.delete_stream(&table.name).await;
    table.drop_table().await;
}

/// At shutdown the spans still queued go out in requests of the usual size: a collector that
/// refuses requests of more than 512 spans (413, as one with a request size limit does) gets
/// them all but the batch in flight when the stop came (its first request, which it holds
/// for a minute), and the relay stops within seconds.
#[tokio::test(flavor = "multi_thread")]
async fn spans_queued_at_shutdown_go_out_in_batches_a_collector_takes() {
    let s = debezium_scenario(Database::Postgres, "trace_flush").await;
    insert_sampled(&s, 1).await;
    insert_sampled(&s, 2).await;
    let receiver = Receiver::start_with(&["--max-spans", "512", "--stall-first", "60"]);
    let port = free_port();
    let config = config(
        &s,
        &receiver.endpoint(),
        port,
        "export_timeout = \"60s\"\nqueue_size = 4096",
    );
    let relay = RelayProcess::start(&config).expect("start relay");
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    let sent = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    // Every row's spans queued (the first 512 in the stalled request).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dropped_before = metric_sum(
        &parse_metrics(
            &http_get(port, "/metrics")
                .map(|(_, t)| t)
                .unwrap_or_default(),
        ),
        "sluice_trace_spans_dropped_total",
        &[],
    );
    let stopping = std::time::Instant::now();
    let exit = relay.stop();
    let stop_took = stopping.elapsed();
    assert!(sent, "rows not sent: {}", exit.log);
    assert!(exit.success, "{}", exit.log);
    assert_eq!(dropped_before, 0.0, "nothing dropped before the stop");
    let received = receiver.spans().len();
    // 600 rows with a sampled parent: wait, transform and publish spans each.
    assert_eq!(
        received,
        1800 - 512,
        "all but the stalled request's: {}",
        exit.log
    );
    assert!(
        stop_took < Duration::from_secs(10),
        "{stop_took:?}: {}",
        exit.log
    );
    assert_eq!(s.consume(600, Duration::from_millis(200)).len(), 600);
    s.finish().await;
}

/// Contexts nobody designed, in a `text` column: what Debezium's extension writes
/// (`Properties.store`: CRLF line ends on Windows, `=` in the tracestate escaped as `\=`), a
/// later version with more fields, upper-case hex, all-zero ids, a tracestate of 33 members,
/// and a 1 MiB value. Every row is published; the messages carry exactly the valid contexts
/// (unescaped; the later version as version 00); the invalid ones are counted.
#[tokio::test(flavor = "multi_thread")]
async fn contexts_nobody_designed_in_the_column_never_fail_a_row() {
    let sql = create_sql(Database::Postgres)
        .replace("tracingspancontext varchar(512)", "tracingspancontext text");
    let s = migrated(DbTable::create_with_sql(Database::Postgres, "trace_odd", &sql).await).await;
    let stored = format!(
        "#Sun Dec 06 17:54:30 UTC 2026\r\ntraceparent={UNSAMPLED}\r\n\
         tracestate=congo\\=t61rcWkgMzE,rojo\\=00f067aa0ba902b7\r\n"
    );
    insert(&s.table, "escaped", Some(&stored)).await;
    let later = UNSAMPLED.replacen("00-", "01-", 1) + "-what-comes-next";
    insert(&s.table, "later", Some(&later)).await;
    insert(&s.table, "upper", Some(&UNSAMPLED.to_uppercase())).await;
    let zero = "00-00000000000000000000000000000000-b7ad6b7169203331-01";
    insert(&s.table, "zero", Some(zero)).await;
    let members: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
    let crowded = format!("traceparent={UNSAMPLED}\ntracestate={}", members.join(","));
    insert(&s.table, "crowded", Some(&crowded)).await;
    insert_sql(&s.table, "huge", "'traceparent=' || repeat('0', 1048576)").await;

    let receiver = Receiver::start();
    let port = free_port();
    let config = config(&s, &receiver.endpoint(), port, "sample_ratio = 0.0");
    let relay = RelayProcess::start(&config).expect("start relay");
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    let sent = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    let metrics = http_get(port, "/metrics")
        .map(|(_, t)| t)
        .unwrap_or_default();
    let exit = relay.stop();
    assert!(sent, "rows not sent: {}", exit.log);
    assert!(exit.success, "{}", exit.log);

    let got = s.consume(6, Duration::from_millis(500));
    assert_eq!(got.len(), 6, "{got:#?}");
    let by_key: HashMap<String, &Received> = got.iter().map(|m| (m.key_str(), m)).collect();
    let context = |key: &str| {
        let m = by_key[key];
        (m.header("traceparent"), m.header("tracestate"))
    };
    assert_eq!(
        context("escaped"),
        (
            Some(UNSAMPLED.to_owned()),
            Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7".to_owned())
        )
    );
    assert_eq!(context("later"), (Some(UNSAMPLED.to_owned()), None));
    assert_eq!(context("upper"), (None, None));
    assert_eq!(context("zero"), (None, None));
    assert_eq!(context("crowded"), (Some(UNSAMPLED.to_owned()), None));
    assert_eq!(context("huge"), (None, None));
    let samples = parse_metrics(&metrics);
    assert_eq!(
        metric_sum(&samples, "sluice_trace_contexts_invalid_total", &[]),
        4.0,
        "upper, zero, crowded's tracestate, huge: {metrics}"
    );
    s.finish().await;
}

/// The `headers` column on a NATS tenant, without `[tracing]`: a tracestate with a line break
/// (which a NATS header cannot carry, and which would forge a header of its own) is dropped
/// and the row published with its traceparent; two traceparents that disagree (names
/// differing in case) are not passed on; white space around the values is not kept. Counted.
#[tokio::test(flavor = "multi_thread")]
async fn contexts_nobody_designed_in_the_headers_column_never_fail_a_row_on_nats() {
    let table = DbTable::create(Database::Postgres, "trace_nats_odd").await;
    let prefix = format!("{}.", table.name);
    let subject = format!("{prefix}order");
    let nats = NatsStreams::connect(&nats_url()).await.expect("NATS");
    nats.create_stream(&table.name, std::slice::from_ref(&subject))
        .await
        .expect("create a NATS stream");
    let other = format!("00-{SAMPLED_TRACE}-{SAMPLED_PARENT}-01");
    for (id, headers) in [
        (
            "crlf",
            format!(
                r#"{{"traceparent": "{UNSAMPLED}", "tracestate": "congo=t61\r\nNats-Msg-Id: forged"}}"#
            ),
        ),
        (
            "repeated",
            format!(r#"{{"traceparent": "{UNSAMPLED}", "TraceParent": "{other}"}}"#),
        ),
        (
            "spaced",
            format!(r#"{{"traceparent": " {UNSAMPLED}\n", "tracestate": " a=1 "}}"#),
        ),
    ] {
        table
            .execute(&format!(
                "INSERT INTO {{t}} (tenant, aggregate_type, aggregate_id, event_type, payload, headers)
                 VALUES ('acme', 'order', '{id}', 'OrderCreated', '{{}}', '{headers}')"
            ))
            .await;
    }
    let port = free_port();
    let config = table.config(&kafka_bootstrap(), &prefix, "", "", "")
        + &format!(
            "[nats]\nurl = \"{}\"\n\n[tenants.acme]\nbroker = \"nats\"\n\n\
             [telemetry]\nlisten = \"127.0.0.1:{port}\"\n",
            nats_url(),
        );
    let relay = RelayProcess::start(&config).expect("start relay");
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    let sent = wait_until(SCENARIO_WAIT, || async { table.count().await == 0 }).await;
    let metrics = http_get(port, "/metrics")
        .map(|(_, t)| t)
        .unwrap_or_default();
    let exit = relay.stop();
    assert!(sent, "rows not sent: {}", exit.log);
    assert!(exit.success, "{}", exit.log);

    let got = nats
        .read_stream(&table.name, 3, SCENARIO_WAIT, Duration::from_millis(200))
        .await
        .expect("read NATS");
    assert_eq!(got.len(), 3);
    let context = |id: &str| {
        let m = got
            .iter()
            .find(|m| m.header("sluice-key").as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no message of {id}: {got:#?}"));
        (
            m.header_values("traceparent"),
            m.header_values("tracestate"),
        )
    };
    let unsampled = vec![UNSAMPLED.to_owned()];
    assert_eq!(context("crlf").0, unsampled);
    assert!(context("crlf").1.is_empty());
    assert_eq!(context("repeated").0, Vec::<String>::new());
    assert_eq!(
        (context("spaced").0, context("spaced").1),
        (unsampled, vec!["a=1".to_owned()])
    );
    let samples = parse_metrics(&metrics);
    assert_eq!(
        metric_sum(&samples, "sluice_trace_contexts_invalid_total", &[]),
        2.0,
        "crlf's tracestate, repeated: {metrics}"
    );
    let _ = nats.delete_stream(&table.name).await;
    table.drop_table().await;
}
