//! The three databases' fixtures: a fresh table of the test kit (`sluice_testkit::DbTable`)
//! each, rows inserted and read with the database's own SQL.

use sluice_testkit::{Database, DbTable};

use super::{DbFixture, Fixture, NewRow, OddColumn, RowState, migrated_db, open_db};
use crate::model::ColumnValue;
use crate::store::{Store, StoreOptions};

/// An [`OddColumn`].
fn odd(
    name: &'static str,
    declared: &'static str,
    set: &'static str,
    expect: ColumnValue,
) -> OddColumn {
    OddColumn {
        name,
        declared,
        set,
        expect,
    }
}

fn text(s: &str) -> ColumnValue {
    ColumnValue::Text(s.to_owned())
}

/// 2026-01-02 03:04:05 UTC plus `micros`.
fn at(micros: i64) -> ColumnValue {
    let base = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
        .map(|t| t.to_utc())
        .unwrap_or_default();
    ColumnValue::Timestamp(base + chrono::TimeDelta::microseconds(micros))
}

pub(super) use lite::LiteFixture;
pub(super) use my::MyFixture;
pub(super) use pg::PgFixture;

/// What every fixture holds: a fresh table of the test kit (`sluice_testkit::DbTable`).
macro_rules! kit_fixture {
    ($fixture:ident) => {
        pub(in crate::store::conformance) struct $fixture {
            t: DbTable,
        }

        impl $fixture {
            /// `sql` with `{t}` replaced by the quoted table.
            pub(in crate::store::conformance) fn sql(&self, sql: &str) -> String {
                self.t.sql(sql)
            }

            /// Runs `sql` (`{t}` stands for the quoted table).
            async fn exec(&self, sql: &str) {
                self.t.execute(sql).await;
            }
        }
    };
}

/// The parts of [`DbFixture`] every database does the same way through the kit's table.
macro_rules! kit_db_fixture_common {
    () => {
        fn url(&self) -> String {
            self.t.url.clone()
        }

        fn table(&self) -> &str {
            &self.t.name
        }

        async fn insert_bulk(&self, n: i64, tenant: Option<&str>) {
            self.t.insert_rows(n, tenant).await;
        }

        async fn execute(&self, sql: &str) {
            self.exec(sql).await;
        }
    };
}

/// The parts of [`Fixture`] every database does the same way through the kit's table.
macro_rules! kit_fixture_common {
    ($database:expr) => {
        type Store = Store;

        async fn new() -> Self {
            Self {
                t: DbTable::fresh($database, "conf").await,
            }
        }

        async fn count(&self) -> i64 {
            self.t.count().await
        }

        async fn make_due(&self, id: i64) {
            self.exec(&format!(
                "UPDATE {{t}} SET next_attempt_at = NULL WHERE id = {id}"
            ))
            .await;
        }

        async fn migrated(&self, options: StoreOptions) -> Store {
            migrated_db(self, options).await
        }

        async fn open(&self, options: StoreOptions) -> Store {
            open_db(self, options).await
        }

        async fn cleanup(self) {
            self.t.drop_table().await;
        }
    };
}

pub(super) mod pg {
    use super::*;
    use sqlx::{AssertSqlSafe, Row};

    kit_fixture!(PgFixture);

    impl Fixture for PgFixture {
        kit_fixture_common!(Database::Postgres);

        async fn insert(&self, rows: &[NewRow]) -> Vec<i64> {
            let sql = self.sql(
                "INSERT INTO {t} (tenant, aggregate_type, aggregate_id, event_type, payload, headers)
                 VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb) RETURNING id",
            );
            let mut ids = Vec::new();
            for r in rows {
                let id: i64 = sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                    .bind(r.tenant)
                    .bind(r.aggregate_type)
                    .bind(&r.aggregate_id)
                    .bind(r.event_type)
                    .bind(&r.payload)
                    .bind(&r.headers)
                    .fetch_one(self.t.pg_pool())
                    .await
                    .expect("insert");
                ids.push(id);
            }
            ids
        }

        async fn delete(&self, id: i64) {
            sqlx::query(AssertSqlSafe(self.sql("DELETE FROM {t} WHERE id = $1")))
                .bind(id)
                .execute(self.t.pg_pool())
                .await
                .expect("delete");
        }

        async fn state(&self, id: i64) -> Option<RowState> {
            let row = sqlx::query(AssertSqlSafe(self.sql(
                "SELECT published_at IS NOT NULL, dead_at IS NOT NULL, attempts, last_error,
                        COALESCE(next_attempt_at > now(), false)
                   FROM {t} WHERE id = $1",
            )))
            .bind(id)
            .fetch_optional(self.t.pg_pool())
            .await
            .expect("state")?;
            Some(RowState {
                published: row.get(0),
                dead: row.get(1),
                attempts: row.get(2),
                last_error: row.get(3),
                waiting: row.get(4),
            })
        }
    }

    impl DbFixture for PgFixture {
        kit_db_fixture_common!();

        async fn create_debezium_table(&self) {
            self.exec(
                "CREATE TABLE {t} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                    aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
                    type varchar(255) NOT NULL, payload jsonb)",
            )
            .await;
        }

        async fn insert_debezium(&self, aggregate_type: &str, aggregate_id: &str, payload: &str) {
            sqlx::query(AssertSqlSafe(self.sql(
                "INSERT INTO {t} (aggregatetype, aggregateid, type, payload)
                 VALUES ($1, $2, 'Created', $3::jsonb)",
            )))
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(payload)
            .execute(self.t.pg_pool())
            .await
            .expect("insert");
        }

        async fn create_unusable_table(&self) {
            self.exec(
                "CREATE TABLE {t} (id numeric, aggregate_type text, event_type text,
                    payload integer, headers jsonb, created_at timestamptz)",
            )
            .await;
        }

        const TYPED_COLUMNS: [&'static str; 9] = [
            "region text",
            "n bigint",
            "flag boolean",
            "score double precision",
            "seen_at timestamptz",
            "meta jsonb",
            "raw bytea",
            "note text",
            "amount numeric(10, 2)",
        ];
        const TYPED_VALUES: &'static str = "region = 'eu-west', n = 42, flag = true, \
            score = 19.5, seen_at = '2026-01-02T03:04:05.123Z', meta = '{\"a\": [1, 2]}', \
            raw = '\\x00ff', amount = 12.30";
        const ODD_SETUP: &'static [&'static str] = &[
            "DO $$ BEGIN CREATE TYPE sluice_conf_mood AS ENUM ('happy', 'sad');
             EXCEPTION WHEN duplicate_object THEN NULL; END $$",
            "DO $$ BEGIN CREATE DOMAIN sluice_conf_code AS text CHECK (VALUE <> '');
             EXCEPTION WHEN duplicate_object THEN NULL; END $$",
        ];

        fn odd_columns() -> Vec<OddColumn> {
            vec![
                odd(
                    "amount",
                    "amount numeric(20, 6)",
                    "amount = 12345678901234.123456",
                    text("12345678901234.123456"),
                ),
                odd(
                    "uid",
                    "uid uuid",
                    "uid = '0F8FAD5B-D9CB-469F-A165-70867728950E'",
                    text("0f8fad5b-d9cb-469f-a165-70867728950e"),
                ),
                odd(
                    "tags",
                    "tags text[]",
                    "tags = '{a,\"b c\"}'",
                    text("{a,\"b c\"}"),
                ),
                odd("nums", "nums int[]", "nums = '{1,2}'", text("{1,2}")),
                odd("mood", "mood sluice_conf_mood", "mood = 'sad'", text("sad")),
                odd("code", "code sluice_conf_code", "code = 'x1'", text("x1")),
                odd(
                    "span",
                    "span interval",
                    "span = '1 day 2 hours 3 minutes 4 seconds'",
                    text("1 day 02:03:04"),
                ),
                // PostgreSQL's `::text` of an inet keeps the netmask.
                odd(
                    "addr",
                    "addr inet",
                    "addr = '10.0.0.1'",
                    text("10.0.0.1/32"),
                ),
                odd("net", "net cidr", "net = '10.0.0.0/8'", text("10.0.0.0/8")),
                odd(
                    "doc",
                    "doc json",
                    "doc = '{\"b\": 1,  \"a\": 2}'",
                    ColumnValue::Json("{\"b\": 1,  \"a\": 2}".into()),
                ),
                odd(
                    "local_at",
                    "local_at timestamp",
                    "local_at = '2026-01-02 03:04:05.123456'",
                    at(123_456),
                ),
                odd("day", "day date", "day = '2026-01-02'", text("2026-01-02")),
                odd(
                    "at_time",
                    "at_time time",
                    "at_time = '03:04:05'",
                    text("03:04:05"),
                ),
                odd("tag", "tag char(4)", "tag = 'ab'", text("ab")),
                odd(
                    "label",
                    "label varchar(10) COLLATE \"C\"",
                    "label = 'Zz'",
                    text("Zz"),
                ),
                odd(
                    "twice",
                    "twice bigint GENERATED ALWAYS AS (length(aggregate_id) * 2) STORED",
                    "",
                    ColumnValue::Integer(6),
                ),
                odd(
                    "Order",
                    "\"Order\" text",
                    "\"Order\" = 'upper'",
                    text("upper"),
                ),
                odd(
                    "user",
                    "\"user\" text",
                    "\"user\" = 'keyword'",
                    text("keyword"),
                ),
                odd(
                    "big",
                    "big bigint",
                    "big = 9223372036854775807",
                    ColumnValue::Integer(i64::MAX),
                ),
                odd(
                    "late",
                    "late timestamptz",
                    "late = '2026-01-02T03:04:05Z'",
                    at(0),
                ),
            ]
        }

        const UNREADABLE: &'static [(&'static str, &'static str)] = &[
            ("late = 'infinity'", "\"late\""),
            ("late = '-infinity'", "\"late\""),
            ("late = '294000-01-01T00:00:00Z'", "\"late\""),
            ("created_at = 'infinity'", "\"created_at\""),
            ("created_at = '-infinity'", "\"created_at\""),
        ];
    }
}

pub(super) mod my {
    use super::*;
    use sqlx::{AssertSqlSafe, Row};

    pub(in crate::store::conformance) fn url() -> String {
        sluice_testkit::mysql_url()
    }

    kit_fixture!(MyFixture);

    impl Fixture for MyFixture {
        kit_fixture_common!(Database::Mariadb);

        async fn insert(&self, rows: &[NewRow]) -> Vec<i64> {
            let sql = self.sql(
                "INSERT INTO {t} (tenant, aggregate_type, aggregate_id, event_type, payload, headers)
                 VALUES (?, ?, ?, ?, ?, ?)",
            );
            let mut ids = Vec::new();
            for r in rows {
                let done = sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(r.tenant)
                    .bind(r.aggregate_type)
                    .bind(&r.aggregate_id)
                    .bind(r.event_type)
                    .bind(&r.payload)
                    .bind(&r.headers)
                    .execute(self.t.mysql_pool())
                    .await
                    .expect("insert");
                ids.push(done.last_insert_id() as i64);
            }
            ids
        }

        async fn delete(&self, id: i64) {
            sqlx::query(AssertSqlSafe(self.sql("DELETE FROM {t} WHERE id = ?")))
                .bind(id)
                .execute(self.t.mysql_pool())
                .await
                .expect("delete");
        }

        async fn state(&self, id: i64) -> Option<RowState> {
            let row = sqlx::query(AssertSqlSafe(self.sql(
                "SELECT CAST(published_at IS NOT NULL AS SIGNED), CAST(dead_at IS NOT NULL AS SIGNED),
                        attempts, CAST(last_error AS CHAR),
                        CAST(COALESCE(next_attempt_at > UTC_TIMESTAMP(6), 0) AS SIGNED)
                   FROM {t} WHERE id = ?",
            )))
            .bind(id)
            .fetch_optional(self.t.mysql_pool())
            .await
            .expect("state")?;
            Some(RowState {
                published: row.get::<i64, _>(0) != 0,
                dead: row.get::<i64, _>(1) != 0,
                attempts: row.get(2),
                last_error: row.get(3),
                waiting: row.get::<i64, _>(4) != 0,
            })
        }
    }

    impl DbFixture for MyFixture {
        kit_db_fixture_common!();

        async fn create_debezium_table(&self) {
            self.exec(
                "CREATE TABLE {t} (id CHAR(36) NOT NULL PRIMARY KEY,
                    aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL,
                    type VARCHAR(255) NOT NULL, payload JSON)",
            )
            .await;
        }

        async fn insert_debezium(&self, aggregate_type: &str, aggregate_id: &str, payload: &str) {
            sqlx::query(AssertSqlSafe(self.sql(
                "INSERT INTO {t} (id, aggregatetype, aggregateid, type, payload)
                 VALUES (UUID(), ?, ?, 'Created', ?)",
            )))
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(payload)
            .execute(self.t.mysql_pool())
            .await
            .expect("insert");
        }

        async fn create_unusable_table(&self) {
            self.exec(
                "CREATE TABLE {t} (id DECIMAL(20, 0), aggregate_type VARCHAR(50),
                    event_type VARCHAR(50), payload INT, headers JSON, created_at DATETIME)",
            )
            .await;
        }

        const TYPED_COLUMNS: [&'static str; 9] = [
            "region VARCHAR(32)",
            "n BIGINT",
            "flag BOOLEAN",
            "score DOUBLE",
            "seen_at DATETIME(3)",
            "meta JSON",
            "raw VARBINARY(16)",
            "note TEXT",
            "amount DECIMAL(10, 2)",
        ];
        const TYPED_VALUES: &'static str = "region = 'eu-west', n = 42, flag = TRUE, \
            score = 19.5, seen_at = '2026-01-02 03:04:05.123', meta = '{\"a\": [1, 2]}', \
            raw = X'00FF', amount = 12.30";
        fn odd_columns() -> Vec<OddColumn> {
            vec![
                odd(
                    "amount",
                    "amount DECIMAL(30, 10)",
                    "amount = 12345678901234567890.0123456789",
                    text("12345678901234567890.0123456789"),
                ),
                odd(
                    "mood",
                    "mood ENUM('happy', 'sad')",
                    "mood = 'sad'",
                    text("sad"),
                ),
                odd(
                    "perms",
                    "perms SET('r', 'w', 'x')",
                    "perms = 'x,r'",
                    text("r,x"),
                ),
                odd(
                    "bits",
                    "bits BIT(8)",
                    "bits = b'11111111'",
                    ColumnValue::Integer(255),
                ),
                odd(
                    "wide_bits",
                    "wide_bits BIT(64)",
                    "wide_bits = ~0",
                    text("18446744073709551615"),
                ),
                odd("yr", "yr YEAR", "yr = 2024", text("2024")),
                odd(
                    "fine",
                    "fine DATETIME(6)",
                    "fine = '2026-01-02 03:04:05.123456'",
                    at(123_456),
                ),
                odd(
                    "tiny",
                    "tiny TINYINT(1)",
                    "tiny = 5",
                    ColumnValue::Boolean(true),
                ),
                odd(
                    "blobby",
                    "blobby LONGBLOB",
                    "blobby = X'00FF'",
                    ColumnValue::Bytes(vec![0, 255]),
                ),
                odd(
                    "huge",
                    "huge BIGINT UNSIGNED",
                    "huge = 18446744073709551615",
                    text("18446744073709551615"),
                ),
                odd(
                    "small",
                    "small BIGINT UNSIGNED",
                    "small = 7",
                    ColumnValue::Integer(7),
                ),
                odd(
                    "order",
                    "`order` VARCHAR(8)",
                    "`order` = 'keyword'",
                    text("keyword"),
                ),
                odd(
                    "late",
                    "late DATETIME",
                    "late = '2026-01-02 03:04:05'",
                    at(0),
                ),
                // The zero date reads as NULL, as Debezium has it.
                odd(
                    "zero",
                    "zero DATETIME",
                    "zero = '0000-00-00 00:00:00'",
                    ColumnValue::Null,
                ),
            ]
        }

        const UNREADABLE: &'static [(&'static str, &'static str)] = &[];
    }
}

pub(super) mod lite {
    use super::*;
    use sqlx::{AssertSqlSafe, Row};

    kit_fixture!(LiteFixture);

    impl Fixture for LiteFixture {
        kit_fixture_common!(Database::Sqlite);

        async fn insert(&self, rows: &[NewRow]) -> Vec<i64> {
            let sql = self.sql(
                "INSERT INTO {t} (tenant, aggregate_type, aggregate_id, event_type, payload, headers)
                 VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
            );
            let mut ids = Vec::new();
            for r in rows {
                let id: i64 = sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                    .bind(r.tenant)
                    .bind(r.aggregate_type)
                    .bind(&r.aggregate_id)
                    .bind(r.event_type)
                    .bind(&r.payload)
                    .bind(&r.headers)
                    .fetch_one(self.t.sqlite_pool())
                    .await
                    .expect("insert");
                ids.push(id);
            }
            ids
        }

        async fn delete(&self, id: i64) {
            sqlx::query(AssertSqlSafe(self.sql("DELETE FROM {t} WHERE id = ?")))
                .bind(id)
                .execute(self.t.sqlite_pool())
                .await
                .expect("delete");
        }

        async fn state(&self, id: i64) -> Option<RowState> {
            let now = chrono::Utc::now().timestamp_millis();
            let row = sqlx::query(AssertSqlSafe(self.sql(
                "SELECT published_at IS NOT NULL, dead_at IS NOT NULL, attempts, last_error,
                        COALESCE(next_attempt_at > ?, 0)
                   FROM {t} WHERE id = ?",
            )))
            .bind(now)
            .bind(id)
            .fetch_optional(self.t.sqlite_pool())
            .await
            .expect("state")?;
            Some(RowState {
                published: row.get::<i64, _>(0) != 0,
                dead: row.get::<i64, _>(1) != 0,
                attempts: row.get(2),
                last_error: row.get(3),
                waiting: row.get::<i64, _>(4) != 0,
            })
        }
    }

    impl DbFixture for LiteFixture {
        kit_db_fixture_common!();

        async fn create_debezium_table(&self) {
            self.exec(
                "CREATE TABLE {t} (id INTEGER PRIMARY KEY AUTOINCREMENT,
                    aggregatetype TEXT NOT NULL, aggregateid TEXT NOT NULL,
                    type TEXT NOT NULL, payload TEXT)",
            )
            .await;
        }

        async fn insert_debezium(&self, aggregate_type: &str, aggregate_id: &str, payload: &str) {
            sqlx::query(AssertSqlSafe(self.sql(
                "INSERT INTO {t} (aggregatetype, aggregateid, type, payload)
                 VALUES (?, ?, 'Created', ?)",
            )))
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(payload)
            .execute(self.t.sqlite_pool())
            .await
            .expect("insert");
        }

        async fn create_unusable_table(&self) {
            self.exec(
                "CREATE TABLE {t} (id REAL, aggregate_type TEXT, event_type TEXT,
                    payload INTEGER, headers TEXT, created_at TEXT)",
            )
            .await;
        }

        const TYPED_COLUMNS: [&'static str; 9] = [
            "region TEXT",
            "n INTEGER",
            "flag BOOLEAN",
            "score REAL",
            "seen_at TIMESTAMP",
            "meta JSON",
            "raw BLOB",
            "note TEXT",
            "amount NUMERIC(10, 2)",
        ];
        const TYPED_VALUES: &'static str = "region = 'eu-west', n = 42, flag = 1, \
            score = 19.5, seen_at = '2026-01-02 03:04:05.123', meta = '{\"a\": [1, 2]}', \
            raw = X'00FF', amount = 12.30";
        /// Values of another storage class than the declared type's arrive as they are.
        fn odd_columns() -> Vec<OddColumn> {
            vec![
                odd("word", "word INTEGER", "word = 'abc'", text("abc")),
                odd("half", "half INTEGER", "half = 1.5", text("1.5")),
                odd(
                    "big",
                    "big INTEGER",
                    "big = 9223372036854775807",
                    ColumnValue::Integer(i64::MAX),
                ),
                odd("said", "said BOOLEAN", "said = 'true'", text("true")),
                odd("yes", "yes BOOLEAN", "yes = 1", ColumnValue::Boolean(true)),
                odd(
                    "epoch",
                    "epoch DATETIME",
                    "epoch = 1700000000",
                    text("1700000000"),
                ),
                odd("soon", "soon DATETIME", "soon = 'soon'", text("soon")),
                odd(
                    "iso",
                    "iso DATETIME",
                    "iso = '2026-01-02 03:04:05.123'",
                    at(123_000),
                ),
                odd("ratio", "ratio REAL", "ratio = 'n/a'", text("n/a")),
                odd(
                    "anything",
                    "anything",
                    "anything = X'00FF'",
                    ColumnValue::Bytes(vec![0, 255]),
                ),
                odd("number", "number", "number = 5", text("5")),
                odd("num", "num NUMERIC", "num = '12.30'", text("12.3")),
                odd(
                    "order",
                    "\"order\" TEXT",
                    "\"order\" = 'keyword'",
                    text("keyword"),
                ),
            ]
        }

        const UNREADABLE: &'static [(&'static str, &'static str)] = &[];
    }
}
