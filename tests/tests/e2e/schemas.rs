//! Outbox tables the application created itself, with plain SQL, relayed through `sluice run`:
//! integer ids of every width (serial, bigserial, identity), uuid ids with Debezium's column
//! names mapped in `[database.columns]`, `timestamp` without time zone, `varchar` strings,
//! `json`/`bytea`/`text` payloads. Plus the refusals for tables Sluice cannot use, and text the
//! database would refuse in `last_error`.

use std::collections::HashMap;
use std::time::Duration;

use sluice_testkit::*;

const SETTLE: Duration = Duration::from_secs(2);

/// Runs `sluice migrate --database-url … --table <table>` and asserts it said "ready".
fn migrate_by_url(table: &str) -> String {
    let out = sluice(&[
        "migrate",
        "--database-url",
        &database_url(),
        "--table",
        table,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("is ready"),
        "migrate failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `(id, aggregate_id, payload bytes)` of every row as the database holds them; `bytes` is
/// the SQL giving the payload column's bytes.
async fn expected_rows(table: &DbTable, bytes: &str) -> Vec<(String, String, Vec<u8>)> {
    let rows = table
        .text_rows(&format!(
            "SELECT id::text, aggregate_id::text, encode({bytes}, 'hex') FROM {{t}} ORDER BY id"
        ))
        .await;
    rows.into_iter()
        .map(|r| {
            let hex = r[2].clone().unwrap_or_default();
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            (r[0].clone().unwrap(), r[1].clone().unwrap(), bytes)
        })
        .collect()
}

/// Every expected row arrived exactly once, with its real id in `id` and `sluice-outbox-id`,
/// its key and its payload bytes unchanged.
fn assert_delivered(got: &[Received], expected: &[(String, String, Vec<u8>)]) {
    let by_id: HashMap<String, &Received> = got
        .iter()
        .map(|m| (m.header("sluice-outbox-id").unwrap_or_default(), m))
        .collect();
    assert_eq!(got.len(), expected.len(), "one message per row: {got:#?}");
    for (id, key, payload) in expected {
        let m = by_id
            .get(id)
            .unwrap_or_else(|| panic!("row {id} not delivered (got ids {:?})", by_id.keys()));
        assert_eq!(m.header("id").as_deref(), Some(id.as_str()));
        assert_eq!(m.key_str(), *key, "key of row {id}");
        assert_eq!(
            m.payload.as_deref(),
            Some(payload.as_slice()),
            "payload of row {id}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_int4_serial_table_relays_every_row_under_its_own_id_and_fails_bad_rows_under_theirs() {
    // The shape an application writes without thinking of Sluice: serial, nullable text
    // columns, a json payload (whose exact text must survive), no headers or created_at.
    let table = DbTable::create_with_sql(
        Database::Postgres,
        "serial",
        "CREATE TABLE {t} (
            id             serial PRIMARY KEY,
            tenant         text,
            aggregate_type text,
            aggregate_id   text,
            event_type     text,
            payload        json
        )",
    )
    .await;
    // Ids far from 0 and from the row count: whatever Sluice reports must be the real id.
    table
        .execute("SELECT setval(pg_get_serial_sequence('{t}', 'id'), 70000)")
        .await;
    migrate_by_url(&table.name);
    table
        .execute(
            "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'o-' || g, 'Created', ('{\"n\":  ' || g || ', \"b\": 1}')::json
               FROM generate_series(1, 30) AS g;
             INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ('order', 'bad-headers', 'Created', '{}', '{\"x\": 5}');
             INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', 'no-type', NULL, '{}');",
        )
        .await;
    let bad_headers = table
        .scalar_i64("SELECT id::int8 FROM {t} WHERE aggregate_id = 'bad-headers'")
        .await;
    let no_type = table
        .scalar_i64("SELECT id::int8 FROM {t} WHERE aggregate_id = 'no-type'")
        .await;
    assert!(bad_headers > 70000 && no_type > 70000);
    let expected = expected_rows(&table, "convert_to(payload::text, 'UTF8')").await;
    let expected: Vec<_> = expected
        .into_iter()
        .filter(|(_, key, _)| key.starts_with("o-"))
        .collect();
    assert_eq!(expected.len(), 30);
    assert_eq!(
        expected[0].2, br#"{"n":  1, "b": 1}"#,
        "json keeps its text"
    );

    let s = Scenario::with_table(table, &["order"]).await;
    let dead = "SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL";
    s.relay_until(&s.config("", ""), || async {
        s.table.count().await == 2 && s.table.scalar_i64(dead).await == 2
    })
    .await;
    let got = s.consume(30, SETTLE);
    assert_delivered(&got, &expected);

    // The two undecodable rows failed under their own ids, with the reason.
    let failed = s
        .table
        .text_rows("SELECT id::text, attempts::text, last_error FROM {t} ORDER BY id")
        .await;
    assert_eq!(failed.len(), 2);
    assert_eq!(failed[0][0], Some(bad_headers.to_string()));
    assert_eq!(failed[0][1].as_deref(), Some("1"));
    let error = failed[0][2].clone().unwrap_or_default();
    assert!(
        error.contains("\"x\"") && error.contains("must be a string"),
        "{error}"
    );
    assert_eq!(failed[1][0], Some(no_type.to_string()));
    let error = failed[1][2].clone().unwrap_or_default();
    assert!(error.contains("column \"event_type\" is NULL"), "{error}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bigserial_table_with_timestamp_without_time_zone_varchar_and_bytea_relays() {
    // No tenant column, varchar(n) strings, a bytea payload that is not UTF-8, and created_at
    // as `timestamp` (without time zone): this shape used to dead-letter every row.
    let table = DbTable::create_with_sql(
        Database::Postgres,
        "bigserial",
        "CREATE TABLE {t} (
            id             bigserial PRIMARY KEY,
            aggregate_type varchar(64)  NOT NULL,
            aggregate_id   varchar(64)  NOT NULL,
            event_type     varchar(128) NOT NULL,
            payload        bytea,
            created_at     timestamp    NOT NULL DEFAULT now()
        )",
    )
    .await;
    let ready = migrate_by_url(&table.name);
    assert!(ready.contains("no tenant column"), "{ready}");
    table
        .execute(
            "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'invoice', 'i-' || (g % 7), 'Issued', decode('00ff' || lpad(to_hex(g), 4, '0'), 'hex')
               FROM generate_series(1, 40) AS g",
        )
        .await;
    let expected = expected_rows(&table, "payload").await;
    assert_eq!(expected[0].2[..2], [0x00u8, 0xff]);

    let s = Scenario::with_table(table, &["invoice"]).await;
    s.relay_until(&s.config("", ""), || async { s.table.count().await == 0 })
        .await;
    let got = s.consume(40, SETTLE);
    assert_delivered(&got, &expected);
    assert!(
        got.iter()
            .all(|m| m.header("sluice-tenant").as_deref() == Some("default"))
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_identity_table_with_a_text_payload_relays_in_published_at_mode() {
    let table = DbTable::create_with_sql(
        Database::Postgres,
        "identity",
        "CREATE TABLE {t} (
            id             integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            tenant         varchar(32),
            aggregate_type text NOT NULL,
            aggregate_id   text NOT NULL,
            event_type     text NOT NULL,
            payload        text,
            created_at     timestamptz NOT NULL DEFAULT now()
        )",
    )
    .await;
    migrate_by_url(&table.name);
    table
        .execute(
            "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'note', 'n-' || g, 'Written', 'plain text, not JSON: é ' || g
               FROM generate_series(1, 25) AS g",
        )
        .await;
    let expected = expected_rows(&table, "convert_to(payload, 'UTF8')").await;

    let s = Scenario::with_table(table, &["note"]).await;
    s.relay_until(&s.config("mark = \"published_at\"", ""), || async {
        s.table.unsent().await == 0
    })
    .await;
    let got = s.consume(25, SETTLE);
    assert_delivered(&got, &expected);
    assert_eq!(
        s.table.count().await,
        25,
        "published_at mode keeps the rows"
    );
    s.finish().await;
}

/// Debezium's default outbox table (as in its documentation), ids from `gen_random_uuid()`.
const DEBEZIUM_TABLE: &str = "CREATE TABLE {t} (
    id            uuid         NOT NULL DEFAULT gen_random_uuid(),
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    PRIMARY KEY (id)
)";

/// The `[database.columns]` of docs/debezium.md.
const DEBEZIUM_COLUMNS: &str = "[database.columns]
aggregate_type = \"aggregatetype\"
aggregate_id = \"aggregateid\"
event_type = \"type\"
";

#[tokio::test(flavor = "multi_thread")]
async fn a_debezium_outbox_table_relays_with_the_column_mapping_like_the_event_router() {
    let table = DbTable::create_with_sql(Database::Postgres, "debezium", DEBEZIUM_TABLE).await;
    let s = Scenario::with_table(table, &["Order", "Customer"]).await;
    // docs/debezium.md's configuration, with this test's table, broker and topic prefix.
    let config = format!(
        r#"
[database]
url = "{db}"
table = "{table}"

{DEBEZIUM_COLUMNS}
[relay]
poll_interval = "100ms"

[kafka]
"bootstrap.servers" = "{bootstrap}"
"partitioner" = "murmur2_random"

[plugins.default]
builtin = "route-by-aggregate"
config = {{ topic_prefix = "{prefix}" }}
"#,
        db = database_url(),
        table = s.table.name,
        bootstrap = kafka_bootstrap(),
        prefix = s.prefix,
    );
    let out = sluice_with_config(&["migrate"], &config);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("uuid ids, claimed in sluice_seq order")
            && stdout.contains("every row belongs to tenant \"default\""),
        "{stdout}"
    );
    // The application's writers are unchanged: they insert Debezium's columns only.
    s.table
        .execute(
            "INSERT INTO {t} (aggregatetype, aggregateid, type, payload)
             SELECT CASE WHEN g % 3 = 0 THEN 'Customer' ELSE 'Order' END, (g % 10)::text,
                    'Changed' || g, jsonb_build_object('seq', g, 'note', 'π')
               FROM generate_series(1, 60) AS g",
        )
        .await;
    let rows = s
        .table
        .text_rows("SELECT id::text, aggregatetype, aggregateid, type, payload::text FROM {t}")
        .await;

    s.relay_until(&config, || async { s.table.count().await == 0 })
        .await;
    let got = s.consume(60, SETTLE);
    assert_eq!(got.len(), 60, "{got:#?}");
    let by_id: HashMap<String, &Received> = got
        .iter()
        .map(|m| (m.header("id").unwrap_or_default(), m))
        .collect();
    for row in &rows {
        let [
            Some(id),
            Some(aggregate_type),
            Some(aggregate_id),
            Some(event_type),
            Some(payload),
        ] = row.as_slice()
        else {
            panic!("unexpected row {row:?}");
        };
        let m = by_id
            .get(id)
            .unwrap_or_else(|| panic!("row {id} not delivered"));
        // Outbox Event Router defaults: topic <prefix><aggregatetype>, key aggregateid,
        // value payload, the event id in header `id`.
        assert_eq!(m.topic, format!("{}{aggregate_type}", s.prefix));
        assert_eq!(m.key_str(), *aggregate_id);
        assert_eq!(m.payload.as_deref(), Some(payload.as_bytes()));
        assert_eq!(m.header("sluice-outbox-id").as_deref(), Some(id.as_str()));
        assert_eq!(m.header("event-type").as_deref(), Some(event_type.as_str()));
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn key_order_holds_with_uuid_ids_for_rows_of_one_key_inserted_in_one_transaction() {
    let table = DbTable::create_with_sql(Database::Postgres, "dbz_order", DEBEZIUM_TABLE).await;
    let s = Scenario::with_table(table, &["Order"]).await;
    // Every row of key k1 fails its first attempt, so a key order that ignored insertion
    // order (uuid order, or created_at: one transaction shares one now()) would show.
    let extra = format!(
        "{DEBEZIUM_COLUMNS}\n{}[relay.retry]\ninitial = \"100ms\"\nmultiplier = 1.0\njitter = 0.0\n",
        s.tenant(
            "default",
            "test_flaky",
            &format!(
                "topic_prefix = \"{}\", fail_attempts = 1, fail_aggregate_id = \"k1\"",
                s.prefix
            )
        )
    );
    let config = s.config("batch_size = 7\nordering = \"key\"", &extra);
    let out = sluice_with_config(&["migrate"], &config);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One statement, one transaction: 100 rows over 5 keys, numbered in insertion order.
    s.table
        .execute(
            "INSERT INTO {t} (aggregatetype, aggregateid, type, payload)
             SELECT 'Order', 'k' || (g % 5), 'Changed', jsonb_build_object('n', g)
               FROM generate_series(1, 100) AS g",
        )
        .await;
    let shared_time = s
        .table
        .scalar_i64("SELECT count(DISTINCT created_at) FROM {t}")
        .await;
    assert_eq!(shared_time, 1, "one transaction, one created_at");
    let uuid_sorted_in_insert_order = s
        .table
        .scalar_i64(
            "SELECT (array_agg(payload->>'n' ORDER BY id) = array_agg(payload->>'n' ORDER BY sluice_seq))::int::int8 FROM {t}",
        )
        .await;
    assert_eq!(
        uuid_sorted_in_insert_order, 0,
        "uuid order differs from insertion order"
    );

    let relays: Vec<RelayProcess> = (0..2)
        .map(|_| RelayProcess::start(&config).unwrap())
        .collect();
    let drained = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "{}", relays[0].log());
    for relay in relays {
        let exit = relay.stop();
        assert!(exit.success, "{}", exit.log);
    }
    let got = s.consume(100, SETTLE);
    assert_eq!(got.len(), 100, "each row once");
    let mut by_key: HashMap<String, Vec<i64>> = HashMap::new();
    for m in &got {
        let n = m.payload_json()["n"].as_i64().unwrap();
        by_key.entry(m.key_str()).or_default().push(n);
    }
    assert_eq!(by_key.len(), 5);
    for (key, ns) in &by_key {
        assert_eq!(ns.len(), 20, "{key}");
        assert!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "key {key} out of insertion order: {ns:?}"
        );
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_and_run_refuse_an_unusable_table_naming_table_column_and_type() {
    let table = DbTable::create_with_sql(
        Database::Postgres,
        "unusable",
        "CREATE TABLE {t} (
            id             bigserial PRIMARY KEY,
            aggregate_type text NOT NULL,
            event_type     text NOT NULL,
            payload        integer
        )",
    )
    .await;
    let name = table.name.clone();
    let wants = |text: &str| {
        for needle in [
            format!("outbox table \"{name}\" cannot be used"),
            "column \"payload\" (database.columns.payload) has type integer; accepted types: jsonb, json, bytea, text".to_owned(),
            "column \"aggregate_id\" (database.columns.aggregate_id) is missing".to_owned(),
        ] {
            assert!(text.contains(&needle), "{needle:?} not in:\n{text}");
        }
    };
    let out = sluice(&[
        "migrate",
        "--database-url",
        &database_url(),
        "--table",
        &name,
    ]);
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ready"));
    wants(&String::from_utf8_lossy(&out.stderr));
    let added = table
        .scalar_i64(&format!(
            "SELECT count(*) FROM information_schema.columns WHERE table_name = '{name}'"
        ))
        .await;
    assert_eq!(added, 4, "a refused migration leaves the table as it was");

    let config = relay_config(&name, &kafka_bootstrap(), "x.", "", "");
    let mut relay = RelayProcess::start(&config).unwrap();
    let exited = wait_until(Duration::from_secs(60), || {
        let running = relay.running();
        async move { !running }
    })
    .await;
    assert!(exited, "run started on an unusable table: {}", relay.log());
    let exit = relay.stop();
    assert!(!exit.success);
    wants(&exit.log);
    assert!(exit.log.contains("column \"published_at\""), "{}", exit.log);
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_error_with_a_nul_byte_is_stored_escaped_and_the_batch_commits_once() {
    let s = Scenario::new("nul_error", &["order", "customer"]).await;
    s.table.insert_rows(20, None).await;
    s.table.insert_rows(5, Some("evil")).await;
    // The hostile plugin fails every row with "unknown mode <mode>": here a NUL byte, which
    // PostgreSQL refuses in text.
    let evil = s.tenant(
        "evil",
        "test_hostile",
        &format!("mode = \"bad\\u0000mode\", topic_prefix = \"{}\"", s.prefix),
    );
    let dead = "SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL";
    let exit = s
        .relay_until(&s.config("batch_size = 25", &evil), || async {
            s.table.count().await == 5 && s.table.scalar_i64(dead).await == 5
        })
        .await;
    assert!(!exit.log.contains("batch failed"), "{}", exit.log);
    let rows = s.table.unsent_rows().await;
    assert_eq!(rows.len(), 5);
    for (tenant, attempts, last_error) in rows {
        assert_eq!(tenant.as_deref(), Some("evil"));
        assert_eq!(attempts, 1, "failed once, not in a loop");
        let error = last_error.unwrap_or_default();
        assert!(error.contains("unknown mode bad\\u{0}mode"), "{error}");
    }
    let got = s.consume(20, SETTLE);
    assert!(
        count_by_id(&got).values().all(|&n| n == 1),
        "published once each"
    );
    assert_eq!(got.len(), 20);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_text_the_database_refuses_is_replaced_and_the_published_batch_commits() {
    let s = Scenario::new("refused_error", &["order", "customer"]).await;
    // An application's constraint that happens to refuse the plugin's error text.
    s.table
        .execute(
            "ALTER TABLE {t} ADD CONSTRAINT no_purpose
               CHECK (last_error IS NULL OR last_error NOT LIKE '%on purpose%')",
        )
        .await;
    s.table.insert_rows(20, None).await;
    s.table.insert_rows(4, Some("flaky")).await;
    let flaky = s.tenant(
        "flaky",
        "test_flaky",
        &format!("topic_prefix = \"{}\", fail_attempts = 1", s.prefix),
    ) + "[relay.retry]\ninitial = \"200ms\"\njitter = 0.0\n";
    let exit = s
        .relay_until(
            &s.config("batch_size = 24\nmark = \"published_at\"", &flaky),
            || async { s.table.unsent().await == 0 },
        )
        .await;
    assert!(
        exit.log.contains("recording a fixed text instead"),
        "{}",
        exit.log
    );
    assert!(!exit.log.contains("batch failed"), "{}", exit.log);
    let flaky_rows = s
        .table
        .text_rows("SELECT attempts::text, last_error FROM {t} WHERE tenant = 'flaky'")
        .await;
    assert_eq!(flaky_rows.len(), 4);
    for row in flaky_rows {
        assert_eq!(row[0].as_deref(), Some("1"));
        let error = row[1].clone().unwrap_or_default();
        assert!(error.contains("could not be stored"), "{error}");
    }
    let got = s.consume(24, SETTLE);
    assert_eq!(got.len(), 24, "every row published once, none again");
    assert!(count_by_id(&got).values().all(|&n| n == 1));
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_rows_of_a_uuid_table_are_listed_and_replayed_by_their_uuid() {
    let table = DbTable::create_with_sql(Database::Postgres, "dbz_dead", DEBEZIUM_TABLE).await;
    let s = Scenario::with_table(table, &["Order"]).await;
    // The table has no tenant column: its rows have no tenant and run [plugins.default].
    let config = s.config("", DEBEZIUM_COLUMNS).replace(
        &reference_plugin().display().to_string(),
        &test_plugin("test_fail_permanent").display().to_string(),
    );
    assert!(sluice_with_config(&["migrate"], &config).status.success());
    s.table
        .execute(
            "INSERT INTO {t} (aggregatetype, aggregateid, type, payload)
             SELECT 'Order', 'o' || g, 'Created', '{}' FROM generate_series(1, 3) AS g",
        )
        .await;
    let dead = "SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL";
    s.relay_until(&config, || async { s.table.scalar_i64(dead).await == 3 })
        .await;
    let ids: Vec<String> = s
        .table
        .text_rows("SELECT id::text FROM {t} ORDER BY sluice_seq")
        .await
        .into_iter()
        .map(|r| r[0].clone().unwrap())
        .collect();

    let list = sluice_with_config(&["dead", "list"], &config);
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    let listed = String::from_utf8_lossy(&list.stdout);
    let listed_ids: Vec<&str> = listed
        .lines()
        .skip(1)
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(listed_ids, ids, "{listed}");

    let replay = sluice_with_config(&["dead", "replay", "--id", &ids[1]], &config);
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    assert!(String::from_utf8_lossy(&replay.stdout).contains("1 dead rows are due again"));
    assert_eq!(s.table.scalar_i64(dead).await, 2);
    let due_again = s
        .table
        .text_rows("SELECT id::text FROM {t} WHERE dead_at IS NULL")
        .await;
    assert_eq!(due_again, vec![vec![Some(ids[1].clone())]]);

    let bad = sluice_with_config(&["dead", "replay", "--id", "not-a-uuid"], &config);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("uuid"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    s.finish().await;
}
