//! The three databases' fixtures: a fresh table of the test kit (`sluice_testkit::DbTable`)
//! each, rows inserted and read with the database's own SQL.

use sluice_testkit::{Database, DbTable};

use super::{DbFixture, Fixture, NewRow, RowState, migrated_db, open_db};
use crate::store::{Store, StoreOptions};

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
            self.t.execute(sql).await;
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
    }
}
