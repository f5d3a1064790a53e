//! Everything a row carries reaches the message, through `sluice run` to Tansu: a table shaped
//! like Debezium's (with the Quarkus extension's `timestamp` column mapped as `created_at`,
//! and two extra columns) on PostgreSQL, MariaDB and SQLite publishes each row with its extra
//! columns as headers (the builtin router's `additional_placement`) and the row's timestamp
//! as the Kafka record timestamp; and components of contracts 0.1.0, 0.2.0 and 0.3.0 run side
//! by side in one relay, only the 0.3.0 one seeing the extra columns.

use std::time::Duration;

use sluice_testkit::config::toml_string;
use sluice_testkit::*;

const SETTLE: Duration = Duration::from_secs(2);

/// The rows' `timestamp` values, and the same in milliseconds since the epoch (UTC).
const TIMES: [(&str, i64); 3] = [
    ("2026-03-04 05:06:07.890", 1_772_600_767_890),
    ("2026-03-04 05:06:08.890", 1_772_600_768_890),
    ("2026-03-04 05:06:09.890", 1_772_600_769_890),
];

/// Debezium's outbox table (Quarkus extension: a `timestamp` column) plus `region` and
/// `created_by`, in `kind`'s usual types; PostgreSQL with a uuid id as Debezium has it.
fn debezium_table(kind: Database) -> &'static str {
    match kind {
        Database::Postgres => {
            "CREATE TABLE {t} (
                id            uuid         NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
                aggregatetype varchar(255) NOT NULL,
                aggregateid   varchar(255) NOT NULL,
                type          varchar(255) NOT NULL,
                payload       jsonb,
                \"timestamp\" timestamp    NOT NULL,
                region        text,
                created_by    varchar(64)
            )"
        }
        Database::Mariadb => {
            "CREATE TABLE {t} (
                id            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
                aggregatetype VARCHAR(255) NOT NULL,
                aggregateid   VARCHAR(255) NOT NULL,
                type          VARCHAR(255) NOT NULL,
                payload       JSON,
                `timestamp`   DATETIME(3)  NOT NULL,
                region        VARCHAR(32),
                created_by    VARCHAR(64)
            )"
        }
        Database::Sqlite => {
            "CREATE TABLE {t} (
                id            INTEGER PRIMARY KEY AUTOINCREMENT,
                aggregatetype TEXT NOT NULL,
                aggregateid   TEXT NOT NULL,
                type          TEXT NOT NULL,
                payload       TEXT,
                \"timestamp\" TEXT NOT NULL,
                region        TEXT,
                created_by    TEXT
            )"
        }
    }
}

/// docs/debezium.md's mapping, with the extra columns and the timestamp column.
const COLUMNS: &str = "[database.columns]
aggregate_type = \"aggregatetype\"
aggregate_id = \"aggregateid\"
event_type = \"type\"
created_at = \"timestamp\"
extra = [\"region\", \"created_by\"]
";

/// A Debezium-shaped table on `kind` (with [`COLUMNS`]), its `Order` topic, and the config of
/// a relay whose builtin router has `more_config` after its `topic_prefix`, migrated.
async fn migrated_debezium_table(
    kind: Database,
    stem: &str,
    more_config: &str,
) -> (DbTable, Vec<String>, String) {
    let table = DbTable::create_with_sql(kind, stem, debezium_table(kind)).await;
    let bootstrap = kafka_bootstrap();
    let prefix = format!("{}.", table.name);
    let topics = vec![format!("{prefix}Order")];
    create_topics(&bootstrap, &topics)
        .await
        .expect("create topics");
    let config = RelayConfig {
        database_url: table.url.clone(),
        database_extra: Some(COLUMNS.to_owned()),
        default_plugin: None,
        extra: Some(format!(
            "[plugins.default]\nbuiltin = \"route-by-aggregate\"\n\
             config = {{ topic_prefix = {}{more_config} }}\n",
            toml_string(&prefix)
        )),
        ..RelayConfig::for_tests(&table.name, &bootstrap, &prefix)
    }
    .render();
    let out = sluice_with_config(&["migrate"], &config);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (table, topics, config)
}

async fn extra_columns_become_headers_and_the_timestamp_the_record_timestamp(kind: Database) {
    let (table, topics, config) = migrated_debezium_table(
        kind,
        "extra_cols",
        ", additional_placement = \"region:header, created_by:header:author\"",
    )
    .await;
    let bootstrap = kafka_bootstrap();
    let rows = [
        ("o-1", "'eu-west'", "'ann'"),
        ("o-2", "NULL", "'bob'"),
        ("o-3", "'us-east'", "NULL"),
    ];
    for ((aggregate_id, region, by), (at, _)) in rows.iter().zip(TIMES) {
        let quote = if kind == Database::Mariadb { '`' } else { '"' };
        table
            .execute(&format!(
                "INSERT INTO {{t}} (aggregatetype, aggregateid, type, payload, \
                 {quote}timestamp{quote}, region, created_by) \
                 VALUES ('Order', '{aggregate_id}', 'OrderCreated', '{{}}', '{at}', {region}, {by})"
            ))
            .await;
    }
    let relay = RelayProcess::start(&config).expect("start relay");
    let sent = wait_until(SCENARIO_WAIT, || async { table.count().await == 0 }).await;
    assert!(sent, "not relayed: {}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);

    let got = consume(&bootstrap, &topics, 3, SCENARIO_WAIT, SETTLE).expect("consume");
    assert_eq!(got.len(), 3, "{got:#?}");
    let mut got = got;
    got.sort_by_key(Received::key_str);
    let expected = [
        (Some("eu-west"), Some("ann")),
        (None, Some("bob")),
        (Some("us-east"), None),
    ];
    for ((m, (region, author)), (_, ms)) in got.iter().zip(expected).zip(TIMES) {
        assert_eq!(m.header("region").as_deref(), region, "{m:?}");
        assert_eq!(m.header("author").as_deref(), author, "{m:?}");
        assert_eq!(
            m.header("created_by"),
            None,
            "placed under its alias: {m:?}"
        );
        assert_eq!(m.header("event-type").as_deref(), Some("OrderCreated"));
        assert_eq!(m.timestamp, Some(ms), "the row's timestamp: {m:?}");
    }
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_extra_columns_become_headers_and_the_timestamp_the_record_timestamp() {
    extra_columns_become_headers_and_the_timestamp_the_record_timestamp(Database::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_extra_columns_become_headers_and_the_timestamp_the_record_timestamp() {
    extra_columns_become_headers_and_the_timestamp_the_record_timestamp(Database::Mariadb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_extra_columns_become_headers_and_the_timestamp_the_record_timestamp() {
    extra_columns_become_headers_and_the_timestamp_the_record_timestamp(Database::Sqlite).await;
}

/// Tenants `v01` and `v02` run components built against contracts 0.1.0 and 0.2.0 as released,
/// tenant `v03` the reference plugin (0.3.0) with `additional_placement`: one relay runs all
/// three, the old ones see rows without extra columns and publish without a timestamp (the
/// producer's time), the new one places `region` and stamps the row's `created_at`.
#[tokio::test(flavor = "multi_thread")]
async fn components_of_contracts_0_1_0_2_and_0_3_run_side_by_side() {
    let table = DbTable::create(Database::Postgres, "contracts").await;
    table
        .execute("ALTER TABLE {t} ADD COLUMN region text")
        .await;
    let s = Scenario::with_table(table, &["v01", "v02", "v03"]).await;
    for (plugin, export) in [
        (test_plugin("test_contract_v0_1"), "0.1.0"),
        (test_plugin("test_contract_v0_2"), "0.2.0"),
        (reference_plugin(), "0.3.0"),
    ] {
        let checked = sluice(&["plugin", "check", &plugin.to_string_lossy()]);
        let said = String::from_utf8_lossy(&checked.stdout);
        assert!(
            checked.status.success()
                && said.contains(&format!("OK (exports sluice:plugin/transformer@{export})")),
            "{said}{}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }
    let created_at_ms = 1_577_836_800_000; // 2020-01-01T00:00:00Z
    for tenant in ["v01", "v02", "v03"] {
        for i in 0..3 {
            s.table
                .execute(&format!(
                    "INSERT INTO {{t}} (tenant, aggregate_type, aggregate_id, event_type, \
                     payload, created_at, region) \
                     VALUES ('{tenant}', '{tenant}', '{tenant}-{i}', 'E', '{{}}', \
                     '2020-01-01T00:00:00Z', 'eu-west')"
                ))
                .await;
        }
    }
    let tenants = format!(
        "{}{}[tenants.v03]\npath = {}\nconfig = {{ topic_prefix = {}, \
         additional_placement = \"region:header\" }}\n",
        s.tenant(
            "v01",
            "test_contract_v0_1",
            &format!("topic_prefix = {}", toml_string(&s.prefix))
        ),
        s.tenant(
            "v02",
            "test_contract_v0_2",
            &format!("topic_prefix = {}", toml_string(&s.prefix))
        ),
        toml_string(&reference_plugin().to_string_lossy()),
        toml_string(&s.prefix),
    );
    let config = RelayConfig {
        database_extra: Some("[database.columns]\nextra = [\"region\"]".to_owned()),
        extra: Some(tenants),
        ..RelayConfig::for_tests(&s.table.name, &kafka_bootstrap(), &s.prefix)
    }
    .render();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    s.relay_until(&config, || async { s.table.count().await == 0 })
        .await;
    let got = s.consume(9, SETTLE);
    assert_eq!(got.len(), 9, "{got:#?}");
    for m in &got {
        let tenant = m.header("sluice-tenant").unwrap_or_default();
        match tenant.as_str() {
            "v01" | "v02" => {
                let contract = if tenant == "v01" { "0.1.0" } else { "0.2.0" };
                assert_eq!(m.header("contract").as_deref(), Some(contract), "{m:?}");
                assert_eq!(m.header("region"), None, "{m:?}");
                let at = m.timestamp.unwrap_or_default();
                assert!(at >= started, "the producer's time, not the row's: {m:?}");
            }
            "v03" => {
                assert_eq!(m.header("region").as_deref(), Some("eu-west"), "{m:?}");
                assert_eq!(m.timestamp, Some(created_at_ms), "{m:?}");
            }
            other => panic!("tenant {other:?}: {m:?}"),
        }
    }
    s.finish().await;
}

/// Times at the edges of what a record timestamp holds, through the builtin router on
/// PostgreSQL's Debezium table: before 1970 and at the epoch itself (librdkafka's "none") the
/// producer stamps the time of the send; the year 9999 goes out as it is; and `infinity`,
/// which PostgreSQL stores and no time value holds, dead-letters its own row at once, naming
/// the column, while the relay goes on with the others (it used to panic decoding it).
#[tokio::test(flavor = "multi_thread")]
async fn timestamps_at_the_edges_go_out_or_fail_their_own_row() {
    let kind = Database::Postgres;
    let (table, topics, config) = migrated_debezium_table(kind, "edge_times", "").await;
    let bootstrap = kafka_bootstrap();
    let rows = [
        ("before-1970", "1969-07-20 20:17:40"),
        ("epoch", "1970-01-01 00:00:00"),
        ("year-9999", "9999-12-31 23:59:59.999"),
        ("infinite", "infinity"),
    ];
    for (aggregate_id, at) in rows {
        table
            .execute(&format!(
                "INSERT INTO {{t}} (aggregatetype, aggregateid, type, payload, \"timestamp\") \
                 VALUES ('Order', '{aggregate_id}', 'OrderCreated', '{{}}', '{at}')"
            ))
            .await;
    }
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let relay = RelayProcess::start(&config).expect("start relay");
    let settled = wait_until(SCENARIO_WAIT, || async {
        table
            .scalar_i64("SELECT count(*) FROM {t} WHERE dead_at IS NULL")
            .await
            == 0
    })
    .await;
    assert!(settled, "not relayed: {}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(!exit.log.contains("panicked"), "{}", exit.log);

    let dead = table
        .text_rows("SELECT aggregateid, last_error FROM {t} WHERE dead_at IS NOT NULL")
        .await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0][0].as_deref(), Some("infinite"));
    let error = dead[0][1].clone().unwrap_or_default();
    assert!(
        error.contains("cannot decode column \"timestamp\"") && error.contains("infinity"),
        "{error}"
    );

    let got = consume(&bootstrap, &topics, 3, SCENARIO_WAIT, SETTLE).expect("consume");
    assert_eq!(got.len(), 3, "{got:#?}");
    for m in &got {
        let at = m.timestamp.unwrap_or_default();
        match m.key_str().as_str() {
            "before-1970" | "epoch" => {
                assert!(at >= started, "the producer's time of the send: {m:?}")
            }
            "year-9999" => assert_eq!(at, 253_402_300_799_999, "{m:?}"),
            other => panic!("{other:?}: {m:?}"),
        }
    }
    table.drop_table().await;
}
