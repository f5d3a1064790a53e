//! `value_format`/`key_format` with a Schema Registry (the test registry of
//! `sluice_testkit::registry`, over HTTP): what `sluice run` publishes is read back with
//! Confluent's own Python deserializers (PyPI confluent-kafka), not with Sluice's code; a
//! payload that does not fit goes dead naming the field and the subject; a registry that fails
//! holds rows back without dead-lettering them; a new latest version is picked up within the
//! TTL; and the schema lookups are cached (a handful of requests, not one per row).

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use sluice_testkit::registry::TestRegistry;
use sluice_testkit::*;

/// The Python with confluent-kafka that `scripts/test` installs (see
/// scripts/plugin-toolchains.sh, `ensure_confluent_kafka_python`).
fn python() -> String {
    std::env::var("SLUICE_CONFLUENT_PYTHON").unwrap_or_else(|_| {
        panic!(
            "SLUICE_CONFLUENT_PYTHON is not set: run the tests through scripts/test, or \
             `. scripts/plugin-toolchains.sh; ensure_confluent_kafka_python` first"
        )
    })
}

/// Each message's `field` bytes decoded by confluent-kafka's deserializer for `format`:
/// `Ok(value)` or `Err(what it raised)`.
fn deserialize(
    registry: &str,
    auth: Option<&str>,
    format: &str,
    topic: &str,
    field: &str,
    messages: &[Option<Vec<u8>>],
) -> Vec<Result<Value, String>> {
    let script = repo_root().join("tests/registry/deserialize.py");
    let mut command = Command::new(python());
    command.arg(script).args([
        "--registry",
        registry,
        "--format",
        format,
        "--topic",
        topic,
        "--field",
        field,
    ]);
    if let Some(auth) = auth {
        command.args(["--auth", auth]);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the Python deserializer");
    let mut input = String::new();
    for m in messages {
        if let Some(bytes) = m {
            for b in bytes {
                input.push_str(&format!("{b:02x}"));
            }
        }
        input.push('\n');
    }
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write to the deserializer");
    let out = child.wait_with_output().expect("run the deserializer");
    assert!(
        out.status.success(),
        "deserializer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("a JSON line");
            match v.get("ok") {
                Some(ok) => Ok(ok.clone()),
                None => Err(v["error"].as_str().unwrap_or_default().to_owned()),
            }
        })
        .collect()
}

const ORDER_AVRO: &str = r#"{"type": "record", "name": "OrderCreated", "namespace": "com.acme",
  "fields": [
    {"name": "id", "type": "long"},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line",
      "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}}
  ]}"#;

const SHOP_PROTO: &str = r#"syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Customer {
  int64 id = 1;
  string name = 2;
  google.protobuf.Timestamp since = 3;
  message Address { string city = 1; }
  Address address = 4;
}
message Refund { int64 order_id = 1; }
"#;

const INVOICE_JSON: &str = r#"{"$schema": "http://json-schema.org/draft-07/schema#",
  "title": "Invoice", "type": "object", "required": ["id", "amount"],
  "properties": {"id": {"type": "integer"}, "amount": {"type": "number", "minimum": 0},
                 "email": {"type": "string"}},
  "additionalProperties": false}"#;

/// Inserts a row of `tenant` for topic suffix `aggregate` with `payload`.
async fn insert(s: &Scenario, tenant: &str, aggregate: &str, id: &str, payload: &Value) {
    insert_event(s, tenant, aggregate, "Created", id, payload).await;
}

/// [`insert`] with event type `event`.
async fn insert_event(
    s: &Scenario,
    tenant: &str,
    aggregate: &str,
    event: &str,
    id: &str,
    payload: &Value,
) {
    s.table
        .execute(&format!(
            "INSERT INTO {{t}} (tenant, aggregate_type, aggregate_id, event_type, payload)
             VALUES ('{tenant}', '{aggregate}', '{id}', '{event}', '{}')",
            payload.to_string().replace('\'', "''")
        ))
        .await;
}

/// The `last_error` of the row with `aggregate_id` `id`, which must be dead.
async fn dead_error(s: &Scenario, id: &str) -> String {
    let dead =
        format!("SELECT COUNT(*) FROM {{t}} WHERE aggregate_id = '{id}' AND dead_at IS NOT NULL");
    assert_eq!(s.table.scalar_i64(&dead).await, 1, "{id} is dead");
    let rows = s
        .table
        .text_rows(&format!(
            "SELECT last_error FROM {{t}} WHERE aggregate_id = '{id}'"
        ))
        .await;
    rows[0][0].clone().unwrap_or_default()
}

/// `config` (a test kit config) with `keys` (TOML lines) added to its `[plugins.default]`,
/// which every tenant inherits.
fn with_default_keys(config: &str, keys: &str) -> String {
    const DEFAULT_SECTION: &str = "[plugins.default]\n";
    config.replacen(DEFAULT_SECTION, &format!("{DEFAULT_SECTION}{keys}"), 1)
}

/// Record `Order {n: long}`, the schema of the one-topic scenarios.
const ORDER_N: &str = r#"{"type":"record","name":"Order","fields":[{"name":"n","type":"long"}]}"#;

/// A scenario with topic `<prefix>order` and a test registry holding [`ORDER_N`] as version 1
/// of subject `<prefix>order-value`, and that schema's id.
async fn order_scenario(stem: &str) -> (Scenario, TestRegistry, u32) {
    let s = Scenario::new(stem, &["order"]).await;
    let registry = TestRegistry::start().expect("start the test registry");
    let id = registry.register(&format!("{}order-value", s.prefix), "AVRO", ORDER_N);
    (s, registry, id)
}

/// A file in `dir` holding `password` and a line end, as a secret file does.
fn password_file(dir: &tempfile::TempDir, password: &str) -> std::path::PathBuf {
    let path = dir.path().join("registry-password");
    std::fs::write(&path, format!("{password}\n")).unwrap();
    path
}

/// The scenario's config with `default` (TOML lines) in its default plugin section, which every
/// tenant inherits, and `sections` at the end.
fn encoding_config(s: &Scenario, default: &str, sections: &str) -> String {
    with_default_keys(&s.config("", sections), default)
}

/// A relay on `config`, started.
async fn started(config: &str) -> RelayProcess {
    let relay = RelayProcess::start(config).expect("start relay");
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    relay
}

fn section(tenant: &str, keys: &str) -> String {
    format!("[tenants.{tenant}]\n{keys}\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn avro_protobuf_and_json_schema_messages_are_read_by_confluents_deserializers() {
    let s = Scenario::new("sr_formats", &["order", "customer", "refund", "invoice"]).await;
    let registry = TestRegistry::start().expect("start the test registry");
    let topic = |suffix: &str| format!("{}{suffix}", s.prefix);
    let order_id = registry.register(&format!("{}-value", topic("order")), "AVRO", ORDER_AVRO);
    registry.register(&format!("{}-key", topic("order")), "AVRO", "\"string\"");
    registry.register(
        &format!("{}-value", topic("customer")),
        "PROTOBUF",
        SHOP_PROTO,
    );
    // RecordName strategy: the subject is the message's full name.
    registry.register("shop.Refund", "PROTOBUF", SHOP_PROTO);
    registry.register(&format!("{}-value", topic("invoice")), "JSON", INVOICE_JSON);

    // A breaker that would open at the first counted failure: a misfit is the row's own
    // fault, like a plugin's permanent error, and must not pause its tenant.
    let tenants = [
        section(
            "avro",
            "value_format = \"avro\"\nkey_format = \"avro\"\ncircuit_breaker_failures = 1",
        ),
        section(
            "proto",
            "value_format = \"protobuf\"\ncircuit_breaker_failures = 1",
        ),
        section(
            "refunds",
            "value_format = \"protobuf\"\nsubject_strategy = \"record-name\"\n\
             value_record = \"shop.Refund\"",
        ),
        section("json", "value_format = \"json-schema\""),
        format!("[schema_registry]\nurl = \"{}\"\n", registry.url()),
    ]
    .concat();
    let config = s.config("", &tenants);

    for i in 0..20 {
        let order = json!({"id": i, "status": if i % 2 == 0 { "NEW" } else { "PAID" },
            "total": format!("{i}.25"), "lines": [{"sku": format!("S{i}"), "qty": i}],
            "note": if i % 3 == 0 { Value::Null } else { json!(format!("n{i}")) }});
        insert(&s, "avro", "order", &format!("o{i}"), &order).await;
        let customer = json!({"id": i.to_string(), "name": format!("c{i}"),
            "since": "2026-12-05T10:00:00Z", "address": {"city": "Oslo"}});
        insert(&s, "proto", "customer", &format!("c{i}"), &customer).await;
        insert(
            &s,
            "refunds",
            "refund",
            &format!("r{i}"),
            &json!({"order_id": i}),
        )
        .await;
        insert(
            &s,
            "json",
            "invoice",
            &format!("i{i}"),
            &json!({"id": i, "amount": 9.5}),
        )
        .await;
    }
    // Misfits: each the row's own fault.
    insert(
        &s,
        "avro",
        "order",
        "bad-missing",
        &json!({"id": 1, "status": "NEW", "lines": []}),
    )
    .await;
    insert(
        &s,
        "avro",
        "order",
        "bad-enum",
        &json!({"id": 1, "status": "LOST", "total": 1, "lines": []}),
    )
    .await;
    insert(
        &s,
        "proto",
        "customer",
        "bad-field",
        &json!({"id": 1, "colour": "red"}),
    )
    .await;
    insert(
        &s,
        "json",
        "invoice",
        "bad-amount",
        &json!({"id": 1, "amount": -3}),
    )
    .await;

    let before = registry.requests();
    let exit = s
        .relay_until(&config, || async {
            s.table
                .scalar_i64("SELECT COUNT(*) FROM {t} WHERE dead_at IS NULL")
                .await
                == 0
        })
        .await;
    let requests = registry.requests() - before;
    assert!(!exit.log.contains("circuit breaker opened"), "{}", exit.log);

    // Dead misfits, each naming the field and the subject with its version.
    let order_subject = format!("{}-value version 1 (schema id {order_id})", topic("order"));
    let missing = dead_error(&s, "bad-missing").await;
    assert!(
        missing.contains(&order_subject) && missing.contains("$.total: missing field"),
        "{missing}"
    );
    let symbol = dead_error(&s, "bad-enum").await;
    assert!(
        symbol.contains("$.status: unknown symbol \"LOST\""),
        "{symbol}"
    );
    let field = dead_error(&s, "bad-field").await;
    assert!(
        field.contains("colour") && field.contains("shop.Customer"),
        "{field}"
    );
    let amount = dead_error(&s, "bad-amount").await;
    assert!(
        amount.contains("$ at /amount") && amount.contains("invoice-value"),
        "{amount}"
    );

    // Every good row once, read by the Python deserializers.
    let got = s.consume(80, Duration::from_secs(2));
    assert_eq!(got.len(), 80, "80 messages");
    let of = |suffix: &str| -> Vec<&Received> {
        let mut v: Vec<&Received> = got.iter().filter(|m| m.topic == topic(suffix)).collect();
        v.sort_by_key(|m| {
            m.header("sluice-outbox-id")
                .and_then(|i| i.parse::<i64>().ok())
        });
        v
    };
    let url = registry.url();
    let values = |ms: &[&Received]| ms.iter().map(|m| m.payload.clone()).collect::<Vec<_>>();

    let orders = of("order");
    let decoded = deserialize(
        &url,
        None,
        "avro",
        &topic("order"),
        "value",
        &values(&orders),
    );
    let keys: Vec<Option<Vec<u8>>> = orders.iter().map(|m| m.key.clone()).collect();
    let decoded_keys = deserialize(&url, None, "avro", &topic("order"), "key", &keys);
    for (i, (value, key)) in decoded.iter().zip(&decoded_keys).enumerate() {
        let value = value.as_ref().unwrap_or_else(|e| panic!("order {i}: {e}"));
        assert_eq!(value["id"], json!(i));
        assert_eq!(
            value["status"],
            json!(if i % 2 == 0 { "NEW" } else { "PAID" })
        );
        assert_eq!(
            value["total"],
            json!(format!("{i}.25")),
            "decimal as Python's Decimal"
        );
        assert_eq!(value["lines"][0]["sku"], json!(format!("S{i}")));
        let note = if i % 3 == 0 {
            Value::Null
        } else {
            json!(format!("n{i}"))
        };
        assert_eq!(value["note"], note);
        assert_eq!(
            key.as_ref().unwrap(),
            &json!(format!("o{i}")),
            "the key as an Avro string"
        );
    }

    let customers = deserialize(
        &url,
        None,
        "protobuf",
        &topic("customer"),
        "value",
        &values(&of("customer")),
    );
    for (i, c) in customers.iter().enumerate() {
        let c = c.as_ref().unwrap_or_else(|e| panic!("customer {i}: {e}"));
        assert_eq!(c["type"], "shop.Customer");
        assert_eq!(
            c["message"]["id"],
            json!(i.to_string()),
            "int64 as proto3 JSON"
        );
        assert_eq!(c["message"]["since"], "2026-12-05T10:00:00Z");
        assert_eq!(c["message"]["address"]["city"], "Oslo");
    }
    let refunds = deserialize(
        &url,
        None,
        "protobuf",
        &topic("refund"),
        "value",
        &values(&of("refund")),
    );
    for (i, r) in refunds.iter().enumerate() {
        let r = r.as_ref().unwrap_or_else(|e| panic!("refund {i}: {e}"));
        // The second message of the file: found through the frame's message indexes.
        assert_eq!(r["type"], "shop.Refund");
        assert_eq!(r["message"]["order_id"], json!(i.to_string()));
    }
    let invoices = deserialize(
        &url,
        None,
        "json-schema",
        &topic("invoice"),
        "value",
        &values(&of("invoice")),
    );
    for (i, v) in invoices.iter().enumerate() {
        assert_eq!(
            v.as_ref().unwrap_or_else(|e| panic!("invoice {i}: {e}")),
            &json!({"id": i, "amount": 9.5})
        );
    }

    // 84 rows, five subjects: a handful of lookups, not one per row.
    assert!(requests <= 12, "{requests} registry requests for 84 rows");
    println!("registry requests during the drain: {requests}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_registry_holds_rows_back_and_a_new_latest_version_is_picked_up() {
    let (s, registry, first) = order_scenario("sr_outage").await;
    registry.require_basic_auth("relay", "s3cret-pw");
    let dir = tempfile::tempdir().unwrap();
    let password = password_file(&dir, "s3cret-pw");
    let subject = format!("{}order-value", s.prefix);
    let port = sluice_testkit::free_port();
    // Every tenant (the default plugin's section) encodes its values.
    let config = encoding_config(
        &s,
        "value_format = \"avro\"\n",
        &format!(
            "[schema_registry]\nurl = \"{}\"\nusername = \"relay\"\n\
             password = \"${{file:{}}}\"\nlatest_ttl = \"1s\"\n\
             [telemetry]\nlisten = \"127.0.0.1:{port}\"\nsample_interval = \"1s\"\n",
            registry.url(),
            password.display()
        ),
    );

    registry.fail(true);
    let relay = started(&config).await;
    insert(&s, "t", "order", "a", &json!({"n": 1})).await;
    let waiting = wait_until(Duration::from_secs(20), || async {
        s.table
            .scalar_i64("SELECT COUNT(*) FROM {t} WHERE last_error LIKE '%schema registry failed%'")
            .await
            == 1
    })
    .await;
    assert!(
        waiting,
        "the row did not wait for the registry: {}",
        relay.log()
    );
    assert_eq!(
        s.table
            .scalar_i64("SELECT COUNT(*) FROM {t} WHERE dead_at IS NOT NULL")
            .await,
        0,
        "a registry outage dead-letters nothing"
    );
    // /readyz and the dependency gauge say so, and come back with the registry.
    let registry_state = |want_ready: bool| async move {
        wait_until(Duration::from_secs(15), || async {
            let ready = http_get(port, "/readyz");
            let metrics = http_get(port, "/metrics")
                .map(|(_, body)| body)
                .unwrap_or_default();
            let gauge = format!(
                "sluice_dependency_up{{dependency=\"schema_registry\"}} {}",
                u8::from(want_ready)
            );
            ready.is_some_and(|(code, body)| {
                (code == 200) == want_ready
                    && body.contains(&format!("\"schema_registry\":{want_ready}"))
            }) && metrics.contains(&gauge)
        })
        .await
    };
    assert!(
        registry_state(false).await,
        "{:?}",
        http_get(port, "/readyz")
    );

    registry.fail(false);
    assert!(
        registry_state(true).await,
        "{:?}",
        http_get(port, "/readyz")
    );
    let sent = wait_until(Duration::from_secs(30), || async {
        s.table.count().await == 0
    })
    .await;
    assert!(
        sent,
        "not delivered once the registry answered: {}",
        relay.log()
    );

    // Version 2 (a field with a default: BACKWARD compatible); after the 1 s TTL new rows use it.
    let v2 = r#"{"type":"record","name":"Order","fields":[{"name":"n","type":"long"},
        {"name":"tag","type":"string","default":"none"}]}"#;
    let second = registry.register(&subject, "AVRO", v2);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    insert(&s, "t", "order", "b", &json!({"n": 2, "tag": "x"})).await;
    let sent = wait_until(Duration::from_secs(30), || async {
        s.table.count().await == 0
    })
    .await;
    assert!(sent, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(
        !exit.log.contains("s3cret-pw"),
        "the password stays out of the log"
    );

    let got = s.consume(2, Duration::from_secs(1));
    let mut ids: Vec<u32> = got
        .iter()
        .map(|m| {
            let p = m.payload.as_deref().unwrap();
            u32::from_be_bytes([p[1], p[2], p[3], p[4]])
        })
        .collect();
    ids.sort();
    assert_eq!(ids, [first, second]);
    let decoded = deserialize(
        &registry.url(),
        Some("relay:s3cret-pw"),
        "avro",
        subject.trim_end_matches("-value"),
        "value",
        &got.iter().map(|m| m.payload.clone()).collect::<Vec<_>>(),
    );
    let mut values: Vec<Value> = decoded.into_iter().map(|d| d.unwrap()).collect();
    values.sort_by_key(|v| v["n"].as_i64());
    assert_eq!(values, [json!({"n": 1}), json!({"n": 2, "tag": "x"})]);
    s.finish().await;
}

/// Through `sluice run` on `kind`: every row's value published as Avro and read back by
/// confluent-kafka's `AvroDeserializer` (encoding happens between plugin and sink, the same
/// on every database; this proves the whole path on each).
async fn avro_values_on(kind: Database) {
    const ROWS: i64 = 200;
    let table = DbTable::create(kind, "sr_db").await;
    let bootstrap = kafka_bootstrap();
    let (prefix, topics) = crate::databases::topics_for(&table, &bootstrap).await;
    let registry = TestRegistry::start().expect("start the test registry");
    let event = r#"{"type":"record","name":"Event","fields":[{"name":"n","type":"long"}]}"#;
    for topic in &topics {
        registry.register(&format!("{topic}-value"), "AVRO", event);
    }
    let extra = format!("[schema_registry]\nurl = \"{}\"\n", registry.url());
    let config = with_default_keys(
        &table.config(&bootstrap, &prefix, "", "", &extra),
        "value_format = \"avro\"\n",
    );
    table.insert_rows(ROWS, None).await;
    let relay = RelayProcess::start(&config).expect("start relay");
    let drained = wait_until(SCENARIO_WAIT, || async { table.count().await == 0 }).await;
    assert!(drained, "{kind:?}: {}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    let got = consume(
        &bootstrap,
        &topics,
        ROWS as usize,
        SCENARIO_WAIT,
        Duration::from_secs(1),
    )
    .expect("consume");
    assert_eq!(got.len(), ROWS as usize, "{kind:?}: every row once");
    let mut seen = Vec::new();
    for topic in &topics {
        let values: Vec<Option<Vec<u8>>> = got
            .iter()
            .filter(|m| &m.topic == topic)
            .map(|m| m.payload.clone())
            .collect();
        for decoded in deserialize(&registry.url(), None, "avro", topic, "value", &values) {
            let value = decoded.unwrap_or_else(|e| panic!("{kind:?} {topic}: {e}"));
            seen.push(value["n"].as_i64().expect("n"));
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (1..=ROWS).collect::<Vec<_>>(), "{kind:?}");
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_mariadb_values_are_published_as_avro() {
    avro_values_on(Database::Mariadb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_sqlite_values_are_published_as_avro() {
    avro_values_on(Database::Sqlite).await;
}

/// A registry that accepts connections and never answers (a hung server, a partition): each
/// request gives up after `timeout`, the rows wait without being dead-lettered (one timeout
/// per subject and batch, not per row), and they go out once it answers again.
#[tokio::test(flavor = "multi_thread")]
async fn a_registry_that_stalls_holds_rows_back_until_it_answers() {
    let (s, registry, _) = order_scenario("sr_stall").await;
    let address = registry.url().trim_start_matches("http://").to_owned();
    let proxy = sluice_testkit::stall::StallingProxy::start(&address).expect("start the proxy");
    proxy.freeze();
    let config = encoding_config(
        &s,
        "value_format = \"avro\"\ncircuit_breaker_failures = 1\n",
        &format!(
            "[schema_registry]\nurl = \"http://127.0.0.1:{}\"\ntimeout = \"500ms\"\n",
            proxy.port()
        ),
    );
    let relay = started(&config).await;
    for i in 0..50 {
        insert(&s, "t", "order", &format!("a{i}"), &json!({"n": i})).await;
    }
    let waiting = wait_until(Duration::from_secs(20), || async {
        s.table
            .scalar_i64(
                "SELECT COUNT(*) FROM {t} WHERE last_error LIKE '%schema registry unreachable%'",
            )
            .await
            == 50
    })
    .await;
    assert!(
        waiting,
        "the rows did not wait for the registry: {}",
        relay.log()
    );
    assert_eq!(
        s.table
            .scalar_i64("SELECT COUNT(*) FROM {t} WHERE dead_at IS NOT NULL")
            .await,
        0,
        "a stalled registry dead-letters nothing"
    );
    proxy.thaw();
    let sent = wait_until(Duration::from_secs(30), || async {
        s.table.count().await == 0
    })
    .await;
    assert!(
        sent,
        "not delivered once the registry answered: {}",
        relay.log()
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    // A registry outage is nobody's fault: even a breaker that opens at the first counted
    // failure stays closed.
    assert!(!exit.log.contains("circuit breaker opened"), "{}", exit.log);
    let got = s.consume(50, Duration::from_secs(1));
    assert_eq!(count_by_id(&got).len(), 50, "every row once");
    s.finish().await;
}

/// Contract versions side by side: tenant `old` runs a component built against
/// `sluice:plugin@0.1.0` as released (`wit/v0.1.0`), unchanged; tenant `new` runs one of the
/// current contract that names each message's record (`value-record`), so `OrderCreated` and
/// `OrderShipped` share one topic under the record-name strategy, each with its own subject
/// and schema. `plugin check` names the version each was built for.
#[tokio::test(flavor = "multi_thread")]
async fn components_of_both_contract_versions_run_and_a_plugin_picks_the_record() {
    let s = Scenario::new("sr_contract", &["order", "legacy"]).await;
    let old = test_plugin("test_contract_v0_1");
    let new = test_plugin("test_pick_record");
    for (plugin, export) in [
        (&old, "sluice:plugin/transformer@0.1.0"),
        (&new, "sluice:plugin/transformer@0.3.0"),
    ] {
        let checked = sluice(&["plugin", "check", &plugin.to_string_lossy()]);
        let said = String::from_utf8_lossy(&checked.stdout);
        assert!(
            checked.status.success() && said.contains(&format!("OK (exports {export})")),
            "{said}{}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }
    let registry = TestRegistry::start().expect("start the test registry");
    let created = r#"{"type":"record","name":"OrderCreated","namespace":"com.acme",
        "fields":[{"name":"id","type":"long"},{"name":"total","type":"double"}]}"#;
    let shipped = r#"{"type":"record","name":"OrderShipped","namespace":"com.acme",
        "fields":[{"name":"id","type":"long"},{"name":"carrier","type":"string"}]}"#;
    registry.register("com.acme.OrderCreated", "AVRO", created);
    registry.register("com.acme.OrderShipped", "AVRO", shipped);
    let legacy = format!("{}legacy", s.prefix);
    registry.register(&format!("{legacy}-value"), "AVRO", created);
    let tenants = format!(
        "[tenants.old]\npath = \"{}\"\nconfig = {{ topic_prefix = \"{prefix}\" }}\n\
         value_format = \"avro\"\n\
         [tenants.new]\npath = \"{}\"\n\
         config = {{ topic_prefix = \"{prefix}\", record_namespace = \"com.acme\" }}\n\
         value_format = \"avro\"\nsubject_strategy = \"record-name\"\n\
         value_record = \"com.acme.OrderCreated\"\n\
         [schema_registry]\nurl = \"{}\"\n",
        old.display(),
        new.display(),
        registry.url(),
        prefix = s.prefix
    );
    let config = s.config("", &tenants);
    for i in 0..10 {
        let created_row = json!({"id": i, "total": 10.5});
        let shipped_row = json!({"id": i, "carrier": "DHL"});
        let c = format!("c{i}");
        insert_event(&s, "new", "order", "OrderCreated", &c, &created_row).await;
        let id = format!("s{i}");
        insert_event(&s, "new", "order", "OrderShipped", &id, &shipped_row).await;
        insert(&s, "old", "legacy", &format!("l{i}"), &created_row).await;
    }
    s.relay_until(&config, || async { s.table.count().await == 0 })
        .await;

    let got = s.consume(30, Duration::from_secs(1));
    assert_eq!(got.len(), 30, "every row once");
    let url = registry.url();
    let orders: Vec<Option<Vec<u8>>> = got
        .iter()
        .filter(|m| m.topic == format!("{}order", s.prefix))
        .map(|m| m.payload.clone())
        .collect();
    let decoded = deserialize(
        &url,
        None,
        "avro",
        &format!("{}order", s.prefix),
        "value",
        &orders,
    );
    let (mut with_total, mut with_carrier) = (0, 0);
    for d in &decoded {
        let v = d.as_ref().unwrap_or_else(|e| panic!("order: {e}"));
        if v.get("total") == Some(&json!(10.5)) {
            with_total += 1;
        }
        if v.get("carrier") == Some(&json!("DHL")) {
            with_carrier += 1;
        }
    }
    assert_eq!((with_total, with_carrier), (10, 10), "{decoded:?}");
    let legacy_values: Vec<Option<Vec<u8>>> = got
        .iter()
        .filter(|m| m.topic == legacy)
        .map(|m| {
            assert_eq!(m.header("contract").as_deref(), Some("0.1.0"));
            m.payload.clone()
        })
        .collect();
    for d in deserialize(&url, None, "avro", &legacy, "value", &legacy_values) {
        assert_eq!(d.unwrap()["total"], json!(10.5));
    }
    s.finish().await;
}

/// The ways a section names its schema: `auto_register` registers the schema file under the
/// subject (once; its id in every frame), a schema file without it is looked up, a pinned
/// version stays when a newer one is registered, and a schema file the subject's
/// compatibility level refuses (409) holds its rows back with the registry's reason, never
/// dead.
#[tokio::test(flavor = "multi_thread")]
async fn registered_looked_up_and_pinned_schemas_and_an_incompatible_one() {
    let s = Scenario::new("sr_modes", &["reg", "look", "pin", "bad"]).await;
    let registry = TestRegistry::start().expect("start the test registry");
    let dir = tempfile::tempdir().unwrap();
    let v1 = r#"{"type":"record","name":"E","fields":[{"name":"n","type":"long"}]}"#;
    let v2 = r#"{"type":"record","name":"E","fields":[{"name":"n","type":"long"},
        {"name":"tag","type":"string","default":"none"}]}"#;
    // Incompatible with v1 under BACKWARD: a new field without a default.
    let breaking = r#"{"type":"record","name":"E","fields":[{"name":"n","type":"long"},
        {"name":"must","type":"string"}]}"#;
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let (v1_file, breaking_file) = (file("v1.avsc", v1), file("breaking.avsc", breaking));
    let subject = |t: &str| format!("{}{t}-value", s.prefix);
    let looked_up = registry.register(&subject("look"), "AVRO", v1);
    let pinned = registry.register(&subject("pin"), "AVRO", v1);
    registry.register(&subject("pin"), "AVRO", v2);
    registry.register(&subject("bad"), "AVRO", v1);
    let tenants = format!(
        "[tenants.reg]\nvalue_format = \"avro\"\nvalue_schema = \"{v1_file}\"\nauto_register = true\n\
         [tenants.look]\nvalue_format = \"avro\"\nvalue_schema = \"{v1_file}\"\n\
         [tenants.pin]\nvalue_format = \"avro\"\nvalue_schema_version = 1\n\
         [tenants.bad]\nvalue_format = \"avro\"\nvalue_schema = \"{breaking_file}\"\nauto_register = true\n\
         [schema_registry]\nurl = \"{}\"\n",
        registry.url()
    );
    let config = s.config("", &tenants);
    for tenant in ["reg", "look", "pin", "bad"] {
        for i in 0..5 {
            insert(
                &s,
                tenant,
                tenant,
                &format!("{tenant}{i}"),
                &json!({"n": i, "must": "x"}),
            )
            .await;
        }
    }
    let relay = started(&config).await;
    let settled = wait_until(SCENARIO_WAIT, || async {
        s.table.count().await == 5
            && s.table
                .scalar_i64(
                    "SELECT COUNT(*) FROM {t} WHERE tenant = 'bad' AND last_error IS NOT NULL",
                )
                .await
                == 5
    })
    .await;
    assert!(settled, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    let refused = s
        .table
        .text_rows("SELECT last_error FROM {t} WHERE tenant = 'bad' LIMIT 1")
        .await[0][0]
        .clone()
        .unwrap_or_default();
    assert!(
        refused.contains("schema unavailable")
            && refused.contains("HTTP 409")
            && refused.contains("incompatible"),
        "{refused}"
    );
    assert_eq!(
        s.table
            .scalar_i64("SELECT COUNT(*) FROM {t} WHERE dead_at IS NOT NULL")
            .await,
        0,
        "a refused registration dead-letters nothing"
    );

    let got = s.consume(15, Duration::from_secs(1));
    let id_of = |topic: &str| -> Vec<u32> {
        got.iter()
            .filter(|m| m.topic == format!("{}{topic}", s.prefix))
            .map(|m| {
                let p = m.payload.as_deref().unwrap();
                u32::from_be_bytes([p[1], p[2], p[3], p[4]])
            })
            .collect()
    };
    let registered = id_of("reg");
    assert_eq!(registered.len(), 5);
    assert!(
        registered.iter().all(|&id| id == registered[0] && id > 0),
        "{registered:?}"
    );
    // v1's text is already known to the registry (under "look" and "pin"): the same id.
    assert_eq!(
        registered[0], looked_up,
        "a schema keeps its id across subjects"
    );
    assert_eq!(id_of("look"), vec![looked_up; 5]);
    assert_eq!(
        id_of("pin"),
        vec![pinned; 5],
        "version 1, not the latest (2)"
    );
    s.finish().await;
}

/// An `https://` registry whose certificate a CA of the test's own signed: without
/// `ca_location` the relay does not trust it (rows wait, the reason names the certificate);
/// with it, rows go out.
#[tokio::test(flavor = "multi_thread")]
async fn an_https_registry_is_trusted_through_ca_location() {
    use sluice_testkit::secure_broker::{TestCa, TlsProxy};
    let (s, registry, _) = order_scenario("sr_tls").await;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "registry-ca").expect("a CA");
    let (cert, key) = ca.issue_server().expect("a server certificate");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = registry.url().trim_start_matches("http://").to_owned();
    let proxy = TlsProxy::start(listener, &cert, &key, target).expect("TLS in front");
    let config_with = |ca_line: &str| {
        encoding_config(
            &s,
            "value_format = \"avro\"\n",
            &format!(
                "[schema_registry]\nurl = \"https://localhost:{}\"\n{ca_line}",
                proxy.port()
            ),
        )
    };
    insert(&s, "t", "order", "a", &json!({"n": 1})).await;

    let untrusted = RelayProcess::start(&config_with("")).expect("start relay");
    assert!(
        untrusted.wait_started(SCENARIO_WAIT).await,
        "{}",
        untrusted.log()
    );
    let waiting = wait_until(Duration::from_secs(20), || async {
        s.table
            .scalar_i64("SELECT COUNT(*) FROM {t} WHERE last_error LIKE '%schema registry unreachable%certificate%'")
            .await
            == 1
    })
    .await;
    assert!(
        waiting,
        "an untrusted certificate was accepted: {}",
        untrusted.log()
    );
    let exit = untrusted.stop();
    assert!(exit.success, "{}", exit.log);

    let ca_line = format!("ca_location = \"{}\"\n", ca.pem.display());
    s.relay_until(&config_with(&ca_line), || async {
        s.table.count().await == 0
    })
    .await;
    let got = s.consume(1, Duration::from_secs(1));
    let decoded = deserialize(
        &registry.url(),
        None,
        "avro",
        &format!("{}order", s.prefix),
        "value",
        &[got[0].payload.clone()],
    );
    assert_eq!(decoded[0].as_ref().unwrap(), &json!({"n": 1}));
    s.finish().await;
}

/// A plugin ships the schemas of the records it emits (`plugin-info.schemas`, contract 0.2.0):
/// with `auto_register = true` and no schema file, the relay registers them under each
/// message's subject, and consumers read them back.
#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_declares_its_schemas_and_auto_register_registers_them() {
    let s = Scenario::new("sr_declared", &["order"]).await;
    let registry = TestRegistry::start().expect("start the test registry");
    let tenants = format!(
        "[tenants.shop]\npath = \"{}\"\n\
         config = {{ topic_prefix = \"{}\", record_namespace = \"com.acme\" }}\n\
         value_format = \"avro\"\nsubject_strategy = \"record-name\"\n\
         value_record = \"com.acme.OrderCreated\"\nauto_register = true\n\
         [schema_registry]\nurl = \"{}\"\n",
        test_plugin("test_pick_record").display(),
        s.prefix,
        registry.url()
    );
    for i in 0..5 {
        let created = json!({"id": i, "total": 1.5});
        insert_event(
            &s,
            "shop",
            "order",
            "OrderCreated",
            &format!("c{i}"),
            &created,
        )
        .await;
        let shipped = json!({"id": i, "carrier": "UPS"});
        insert_event(
            &s,
            "shop",
            "order",
            "OrderShipped",
            &format!("s{i}"),
            &shipped,
        )
        .await;
    }
    // A record the plugin declares no schema for waits, naming what is missing.
    insert_event(&s, "shop", "order", "OrderLost", "x", &json!({"id": 9})).await;
    let config = s.config("", &tenants);
    let relay = started(&config).await;
    let settled = wait_until(SCENARIO_WAIT, || async {
        s.table.count().await == 1
            && s.table
                .scalar_i64("SELECT COUNT(*) FROM {t} WHERE last_error IS NOT NULL")
                .await
                == 1
    })
    .await;
    assert!(settled, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    let mut subjects = registry.subjects();
    subjects.sort();
    assert_eq!(subjects, ["com.acme.OrderCreated", "com.acme.OrderShipped"]);
    let lost = s.table.text_rows("SELECT last_error FROM {t}").await[0][0]
        .clone()
        .unwrap_or_default();
    assert!(
        lost.contains("schema unavailable")
            && lost.contains("the plugin declares a schema (avro) for record com.acme.OrderLost"),
        "{lost}"
    );
    let got = s.consume(10, Duration::from_secs(1));
    let values: Vec<Option<Vec<u8>>> = got.iter().map(|m| m.payload.clone()).collect();
    let topic = format!("{}order", s.prefix);
    let decoded = deserialize(&registry.url(), None, "avro", &topic, "value", &values);
    let carriers = decoded
        .iter()
        .filter(|d| d.as_ref().unwrap()["carrier"] == json!("UPS"))
        .count();
    let totals = decoded
        .iter()
        .filter(|d| d.as_ref().unwrap()["total"] == json!(1.5))
        .count();
    assert_eq!((carriers, totals), (5, 5), "{decoded:?}");
    s.finish().await;
}

/// Rotated registry credentials: the registry now wants a new password; the rows wait (401,
/// never dead) until the password file is rewritten and the relay gets SIGHUP, then go out.
#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_registry_password_is_used_after_sighup() {
    let (s, registry, _) = order_scenario("sr_rotate").await;
    registry.require_basic_auth("relay", "first-pw");
    let dir = tempfile::tempdir().unwrap();
    let password = password_file(&dir, "first-pw");
    let config = encoding_config(
        &s,
        "value_format = \"avro\"\n",
        &format!(
            "[schema_registry]\nurl = \"{}\"\nusername = \"relay\"\n\
                 password = \"${{file:{}}}\"\nlatest_ttl = \"1s\"\n",
            registry.url(),
            password.display()
        ),
    );
    let relay = started(&config).await;
    insert(&s, "t", "order", "a", &json!({"n": 1})).await;
    let sent = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(sent, "{}", relay.log());

    registry.require_basic_auth("relay", "second-pw");
    // Past `latest_ttl`: the next row asks the registry again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    insert(&s, "t", "order", "b", &json!({"n": 2})).await;
    let refused = wait_until(Duration::from_secs(20), || async {
        s.table
            .scalar_i64(
                "SELECT COUNT(*) FROM {t} WHERE last_error LIKE '%refused the credentials%'",
            )
            .await
            == 1
    })
    .await;
    assert!(refused, "the old password was not refused: {}", relay.log());
    assert_eq!(
        s.table
            .scalar_i64("SELECT COUNT(*) FROM {t} WHERE dead_at IS NOT NULL")
            .await,
        0
    );
    std::fs::write(&password, "second-pw\n").unwrap();
    relay.hangup();
    let rotated = wait_until(Duration::from_secs(20), || async {
        relay
            .log()
            .contains("config reload: the schema registry's credentials were replaced")
    })
    .await;
    assert!(rotated, "{}", relay.log());
    let sent = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(sent, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(!exit.log.contains("second-pw") && !exit.log.contains("first-pw"));
    s.finish().await;
}
