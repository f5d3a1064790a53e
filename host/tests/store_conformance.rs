//! The store driver conformance suite: one set of test bodies, run against every database
//! Sluice relays from (PostgreSQL, MySQL/MariaDB, SQLite), as River's `riverdrivertest` does.
//!
//! Each body is a generic function over a [`Fixture`]: a fresh table in a real database, with
//! rows inserted and inspected by plain SQL the way an application would, never through the
//! store under test. [`conformance!`] stamps out one `#[tokio::test]` per body and database.
//!
//! The tables are the test kit's (`sluice_testkit::DbTable`): `SLUICE_TEST_DATABASE_URL`
//! (default `postgres://postgres@127.0.0.1:5432/test`), `SLUICE_TEST_MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`), and SQLite files in temporary directories.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use sluice::model::{OutboxId, TenantId};
use sluice::store::{
    self, AfterDead, BatchOutcome, ClaimedBatch, Disposition, MarkMode, Ordering, OutboxStore,
    ReplaySelection, RowFailure, Store, StoreError, StoreOptions, TableName, TableSpec,
};
use sluice_testkit::{Database, DbTable};

// ---------------------------------------------------------------------------------------------
// Fixtures

/// A row as an application inserts it.
#[derive(Debug, Clone)]
struct NewRow {
    tenant: Option<&'static str>,
    aggregate_type: &'static str,
    aggregate_id: String,
    event_type: &'static str,
    payload: String,
    headers: String,
}

fn row(tenant: Option<&'static str>, aggregate_id: &str, n: u32) -> NewRow {
    NewRow {
        tenant,
        aggregate_type: "order",
        aggregate_id: aggregate_id.to_owned(),
        event_type: "OrderCreated",
        payload: format!(r#"{{"n":{n}}}"#),
        headers: format!(r#"{{"trace":"t{n}"}}"#),
    }
}

/// A row's bookkeeping, as read with plain SQL.
#[derive(Debug, Clone, PartialEq)]
struct RowState {
    published: bool,
    dead: bool,
    attempts: i32,
    last_error: Option<String>,
    /// `next_attempt_at` lies in the future.
    waiting: bool,
}

/// A fresh table in one database, and plain SQL against it.
trait Fixture: Sized {
    /// A fresh, not yet created table.
    async fn new() -> Self;
    fn url(&self) -> String;
    fn table(&self) -> &str;
    /// Inserts `rows` one statement each; returns their ids.
    async fn insert(&self, rows: &[NewRow]) -> Vec<i64>;
    async fn delete(&self, id: i64);
    async fn count(&self) -> i64;
    /// The row's bookkeeping, `None` when the row is gone.
    async fn state(&self, id: i64) -> Option<RowState>;
    /// Creates the table the way an application coming from Debezium has it: columns `id`
    /// (the database's usual key), `aggregatetype`, `aggregateid`, `type`, `payload`; no
    /// tenant, headers, created_at or bookkeeping.
    async fn create_debezium_table(&self);
    /// Inserts into that table.
    async fn insert_debezium(&self, aggregate_type: &str, aggregate_id: &str, payload: &str);
    /// Creates a table Sluice cannot use: an id of a non-key type, `aggregate_id` missing,
    /// an integer `payload`, no bookkeeping columns.
    async fn create_unusable_table(&self);
    /// Runs `sql` (`{t}` stands for the quoted table).
    async fn exec(&self, sql: &str);
    async fn cleanup(self);

    fn spec(&self) -> TableSpec {
        TableSpec::new(TableName::parse(self.table()).unwrap())
    }

    /// `sluice migrate` of the standard table, then a store with `options`.
    async fn migrated(&self, options: StoreOptions) -> Store {
        store::migrate(&self.url(), &self.spec())
            .await
            .unwrap_or_else(|e| panic!("migrate {}: {e}", self.table()));
        self.open(options).await
    }

    /// Another store on the same table (another relay).
    async fn open(&self, options: StoreOptions) -> Store {
        store::open(&self.url(), &self.spec(), options, 3)
            .await
            .unwrap_or_else(|e| panic!("open {}: {e}", self.table()))
    }
}

/// What every fixture holds: a fresh table of the test kit (`sluice_testkit::DbTable`).
macro_rules! kit_fixture {
    ($fixture:ident) => {
        pub struct $fixture {
            t: DbTable,
        }

        impl $fixture {
            pub fn sql(&self, sql: &str) -> String {
                self.t.sql(sql)
            }
        }
    };
}

/// The parts of [`Fixture`] every database does the same way through the kit's table.
macro_rules! kit_fixture_common {
    ($database:expr) => {
        async fn new() -> Self {
            Self {
                t: DbTable::fresh($database, "conf").await,
            }
        }

        fn url(&self) -> String {
            self.t.url.clone()
        }

        fn table(&self) -> &str {
            &self.t.name
        }

        async fn count(&self) -> i64 {
            self.t.count().await
        }

        async fn exec(&self, sql: &str) {
            self.t.execute(sql).await;
        }

        async fn cleanup(self) {
            self.t.drop_table().await;
        }
    };
}

mod pg {
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

mod my {
    use super::*;
    use sqlx::{AssertSqlSafe, Row};

    pub fn url() -> String {
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

mod lite {
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

// ---------------------------------------------------------------------------------------------
// The bodies

fn ids(rows: &[sluice::model::OutboxRow]) -> Vec<OutboxId> {
    rows.iter().map(|r| r.id.clone()).collect()
}

fn int_ids(ids: &[i64]) -> Vec<OutboxId> {
    ids.iter().map(|&i| OutboxId::Int(i)).collect()
}

fn sent(ids: Vec<OutboxId>) -> BatchOutcome {
    BatchOutcome {
        sent: ids,
        failed: Vec::new(),
    }
}

fn failure(id: i64, error: &str, disposition: Disposition) -> RowFailure {
    RowFailure {
        id: OutboxId::Int(id),
        error: error.to_owned(),
        disposition,
    }
}

fn tenants(names: &[&str]) -> Vec<TenantId> {
    names
        .iter()
        .map(|n| match *n {
            "" => TenantId::none(),
            name => TenantId::named(name),
        })
        .collect()
}

const HOUR: Duration = Duration::from_secs(3600);

fn published_at() -> StoreOptions {
    StoreOptions {
        mark: MarkMode::PublishedAt,
        ..StoreOptions::default()
    }
}

mod bodies {
    use super::*;

    pub async fn claims_decode_rows_in_insertion_order<F: Fixture>() {
        let f = F::new().await;
        let store = f.migrated(StoreOptions::default()).await;
        let before = chrono::Utc::now() - chrono::Duration::seconds(60);
        let inserted = f
            .insert(&[
                row(Some("acme"), "a1", 1),
                row(None, "a2", 2),
                row(None, "a3", 3),
            ])
            .await;
        let claim = store.claim(10, &[]).await.unwrap();
        assert_eq!(ids(&claim.rows), int_ids(&inserted));
        assert!(claim.rejected.is_empty());
        let first = &claim.rows[0];
        assert_eq!(first.tenant.as_str(), "acme");
        assert_eq!(claim.rows[1].tenant.as_str(), TenantId::DEFAULT_NAME);
        assert_eq!(first.aggregate_type, "order");
        assert_eq!(first.aggregate_id, "a1");
        assert_eq!(first.event_type, "OrderCreated");
        let payload: serde_json::Value = serde_json::from_slice(&first.payload).unwrap();
        assert_eq!(payload, serde_json::json!({"n": 1}));
        assert_eq!(first.headers, vec![("trace".to_owned(), b"t1".to_vec())]);
        assert!(first.created_at > before && first.created_at <= chrono::Utc::now());
        assert_eq!(first.attempts, 0);
        claim.batch.complete(sent(ids(&claim.rows))).await.unwrap();
        assert_eq!(f.count().await, 0, "delete mode removes sent rows");
        assert_eq!(store.backlog().await.unwrap(), Default::default());
        f.cleanup().await;
    }

    pub async fn two_claimers_get_disjoint_rows<F: Fixture>() {
        let f = F::new().await;
        let first = f.migrated(StoreOptions::default()).await;
        let second = f.open(StoreOptions::default()).await;
        let inserted = f
            .insert(
                &(1..=6)
                    .map(|n| row(None, &format!("k{n}"), n))
                    .collect::<Vec<_>>(),
            )
            .await;
        let a = first.claim(4, &[]).await.unwrap();
        let b = second.claim(10, &[]).await.unwrap();
        assert_eq!(ids(&a.rows), int_ids(&inserted[..4]));
        assert_eq!(
            ids(&b.rows),
            int_ids(&inserted[4..]),
            "the held rows are skipped"
        );
        assert!(
            second.claim(10, &[]).await.unwrap().is_empty(),
            "nothing is claimable twice"
        );
        let a_ids = ids(&a.rows);
        a.batch.abandon().await.unwrap();
        let again = second.claim(10, &[]).await.unwrap();
        assert_eq!(
            ids(&again.rows),
            a_ids,
            "abandoned rows are claimable again, unchanged"
        );
        assert_eq!(again.rows[0].attempts, 0);
        again.batch.complete(sent(a_ids)).await.unwrap();
        b.batch.complete(sent(ids(&b.rows))).await.unwrap();
        assert_eq!(f.count().await, 0);
        f.cleanup().await;
    }

    /// While a backlog drains, a claim may start past the rows claimed last (the PostgreSQL
    /// driver's claim cursor); rows put back behind it must still come round, soon.
    pub async fn rows_put_back_behind_full_claims_are_claimed_again<F: Fixture>() {
        let f = F::new().await;
        let store = f.migrated(StoreOptions::default()).await;
        let inserted = f
            .insert(
                &(1..=8)
                    .map(|n| row(None, &format!("k{n}"), n))
                    .collect::<Vec<_>>(),
            )
            .await;
        let first = store.claim(2, &[]).await.unwrap();
        let second = store.claim(2, &[]).await.unwrap();
        assert_eq!(ids(&first.rows), int_ids(&inserted[..2]));
        assert_eq!(ids(&second.rows), int_ids(&inserted[2..4]));
        first.batch.abandon().await.unwrap();
        // `second` stays open (its rows locked) while later claims are sent at once.
        let mut seen = ids(&second.rows);
        let started = Instant::now();
        while !int_ids(&inserted[..2]).iter().all(|id| seen.contains(id)) {
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "rows put back were not claimed again within 3 s; claimed: {seen:?}"
            );
            let claim = store.claim(2, &[]).await.unwrap();
            let claimed = ids(&claim.rows);
            for id in &claimed {
                assert!(!seen.contains(id), "{id} claimed twice");
                seen.push(id.clone());
            }
            claim.batch.complete(sent(claimed)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let held = ids(&second.rows);
        second.batch.complete(sent(held)).await.unwrap();
        assert_eq!(f.count().await, 8 - seen.len() as i64);
        f.cleanup().await;
    }

    pub async fn paused_tenants_are_skipped<F: Fixture>() {
        let f = F::new().await;
        let store = f.migrated(StoreOptions::default()).await;
        let inserted = f
            .insert(&[
                row(Some("acme"), "a", 1),
                row(None, "b", 2),
                row(Some("beta"), "c", 3),
                // A tenant named "default" is not the rows without a tenant.
                row(Some("default"), "d", 4),
            ])
            .await;
        // "" stands for rows without a tenant.
        let claim = store.claim(10, &tenants(&["acme", ""])).await.unwrap();
        assert_eq!(ids(&claim.rows), int_ids(&inserted[2..]));
        claim
            .batch
            .complete(sent(int_ids(&inserted[2..])))
            .await
            .unwrap();
        assert!(!store.has_due(&tenants(&["acme", ""])).await.unwrap());
        assert!(store.has_due(&tenants(&["acme", "default"])).await.unwrap());
        let claim = store
            .claim(10, &tenants(&["acme", "default"]))
            .await
            .unwrap();
        assert_eq!(ids(&claim.rows), int_ids(&inserted[1..2]));
        claim.batch.abandon().await.unwrap();
        f.cleanup().await;
    }

    pub async fn the_backlog_sample_counts_per_tenant_and_reads_at_most_its_limit<F: Fixture>() {
        let f = F::new().await;
        let store = f.migrated(StoreOptions::default()).await;
        assert!(
            store.sample_backlog(100).await.unwrap().is_empty(),
            "an empty table"
        );
        let inserted = f
            .insert(&[
                row(Some("acme"), "a", 1),
                row(Some("acme"), "b", 2),
                row(Some("globex"), "c", 3),
                row(None, "d", 4),
                row(None, "e", 5),
                row(Some("acme"), "f", 6),
            ])
            .await;
        let claim = store.claim(3, &[]).await.unwrap();
        claim
            .batch
            .complete(BatchOutcome {
                sent: int_ids(&inserted[1..2]),
                failed: vec![
                    failure(inserted[0], "fatal", Disposition::Dead),
                    failure(inserted[2], "later", Disposition::Retry(HOUR)),
                ],
            })
            .await
            .unwrap();

        // Unsent: acme 6 due and 1 dead, globex 3 waiting, no tenant 4 and 5 due.
        let mut sample = store.sample_backlog(100).await.unwrap();
        sample.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        let counts: Vec<(Option<&str>, i64, i64, bool)> = sample
            .iter()
            .map(|t| {
                (
                    t.tenant.as_deref(),
                    t.due,
                    t.dead,
                    t.oldest_due_age.is_some(),
                )
            })
            .collect();
        assert_eq!(
            counts,
            [
                (None, 2, 0, true),
                (Some("acme"), 1, 1, true),
                (Some("globex"), 0, 0, false)
            ]
        );
        for t in &sample {
            if let Some(age) = t.oldest_due_age {
                assert!(age < Duration::from_secs(600), "{t:?}: the rows are new");
            }
        }

        // Two rows at most of each kind, in claim order: globex's waiting row and row 4.
        let limited = store.sample_backlog(2).await.unwrap();
        let due: i64 = limited.iter().map(|t| t.due).sum();
        let dead: i64 = limited.iter().map(|t| t.dead).sum();
        assert_eq!((due, dead), (1, 1), "{limited:?}");
        f.cleanup().await;
    }

    pub async fn has_due_and_backlog_follow_the_rows_states<F: Fixture>() {
        let f = F::new().await;
        let store = f.migrated(StoreOptions::default()).await;
        assert!(!store.has_due(&[]).await.unwrap(), "an empty table");
        let inserted = f
            .insert(&[
                row(None, "a", 1),
                row(None, "b", 2),
                row(None, "c", 3),
                row(None, "d", 4),
            ])
            .await;
        assert!(store.has_due(&[]).await.unwrap());
        let claim = store.claim(3, &[]).await.unwrap();
        claim
            .batch
            .complete(BatchOutcome {
                sent: vec![],
                failed: vec![
                    failure(inserted[0], "later", Disposition::Retry(HOUR)),
                    failure(inserted[1], "broker", Disposition::Wait(HOUR)),
                    failure(inserted[2], "fatal", Disposition::Dead),
                ],
            })
            .await
            .unwrap();
        let backlog = store.backlog().await.unwrap();
        assert_eq!((backlog.due, backlog.waiting, backlog.dead), (1, 2, 1));
        let claim = store.claim(10, &[]).await.unwrap();
        assert_eq!(ids(&claim.rows), int_ids(&inserted[3..]));
        claim
            .batch
            .complete(sent(int_ids(&inserted[3..])))
            .await
            .unwrap();
        assert!(
            !store.has_due(&[]).await.unwrap(),
            "waiting and dead rows are not due"
        );
        f.cleanup().await;
    }

    pub async fn failures_are_rescheduled_dead_lettered_or_waited_out<F: Fixture>() {
        let f = F::new().await;
        let store = f.migrated(StoreOptions::default()).await;
        let inserted = f
            .insert(&[
                row(None, "a", 1),
                row(None, "b", 2),
                row(None, "c", 3),
                row(None, "d", 4),
            ])
            .await;
        let long = format!("boom {}", "x".repeat(10_000));
        let claim = store.claim(10, &[]).await.unwrap();
        claim
            .batch
            .complete(BatchOutcome {
                sent: vec![],
                failed: vec![
                    failure(inserted[0], &long, Disposition::Retry(HOUR)),
                    failure(inserted[1], "fatal", Disposition::Dead),
                    failure(inserted[2], "broker down", Disposition::Wait(HOUR)),
                    failure(inserted[3], "try again", Disposition::Retry(Duration::ZERO)),
                ],
            })
            .await
            .unwrap();
        let retried = f.state(inserted[0]).await.unwrap();
        assert!(retried.waiting && !retried.dead && !retried.published);
        assert_eq!(retried.attempts, 1);
        let error = retried.last_error.unwrap();
        assert!(
            error.starts_with("boom xxx") && error.len() <= 2_100,
            "{}",
            error.len()
        );
        let dead = f.state(inserted[1]).await.unwrap();
        assert!(dead.dead && !dead.waiting);
        assert_eq!(
            (dead.attempts, dead.last_error.as_deref()),
            (1, Some("fatal"))
        );
        let waited = f.state(inserted[2]).await.unwrap();
        assert!(waited.waiting);
        assert_eq!(waited.attempts, 0, "the broker's failure does not count");
        let again = store.claim(10, &[]).await.unwrap();
        assert_eq!(
            ids(&again.rows),
            int_ids(&inserted[3..]),
            "a zero delay is due at once"
        );
        assert_eq!(again.rows[0].attempts, 1);
        again.batch.abandon().await.unwrap();
        f.cleanup().await;
    }

    pub async fn marking_published_at_keeps_the_row_and_never_claims_it_again<F: Fixture>() {
        let f = F::new().await;
        let store = f.migrated(published_at()).await;
        let inserted = f.insert(&[row(None, "a", 1), row(None, "b", 2)]).await;
        let claim = store.claim(10, &[]).await.unwrap();
        claim
            .batch
            .complete(sent(int_ids(&inserted[..1])))
            .await
            .unwrap();
        let state = f.state(inserted[0]).await.unwrap();
        assert!(state.published && !state.dead);
        assert_eq!(f.count().await, 2);
        let claim = store.claim(10, &[]).await.unwrap();
        assert_eq!(
            ids(&claim.rows),
            int_ids(&inserted[1..]),
            "the row the batch put back is claimable at once; the sent one never again"
        );
        claim.batch.abandon().await.unwrap();
        assert_eq!(store.backlog().await.unwrap().due, 1);
        f.cleanup().await;
    }

    pub async fn a_batch_naming_a_row_it_does_not_hold_fails_the_count_check_and_settle_records_the_rest<
        F: Fixture,
    >() {
        let f = F::new().await;
        let store = f.migrated(StoreOptions::default()).await;
        let inserted = f
            .insert(&[row(None, "a", 1), row(None, "b", 2), row(None, "c", 3)])
            .await;
        // Row 2 is gone (someone deleted it); the outcome still names it.
        f.delete(inserted[1]).await;
        let claim = store.claim(10, &[]).await.unwrap();
        assert_eq!(
            ids(&claim.rows),
            vec![OutboxId::Int(inserted[0]), OutboxId::Int(inserted[2])]
        );
        let outcome = BatchOutcome {
            sent: int_ids(&inserted[..2]),
            failed: vec![failure(inserted[2], "later", Disposition::Retry(HOUR))],
        };
        let err = claim
            .batch
            .complete(BatchOutcome {
                sent: outcome.sent.clone(),
                failed: outcome.failed.clone(),
            })
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::MarkMismatch {
                    expected: 2,
                    affected: 1
                }
            ),
            "{err}"
        );
        let untouched = f.state(inserted[0]).await.unwrap();
        assert!(!untouched.published, "nothing of the batch was recorded");
        assert_eq!(f.state(inserted[2]).await.unwrap().attempts, 0);

        // The relay then records what it published in a fresh transaction.
        let settlement = store.settle(&outcome).await.unwrap();
        assert_eq!(settlement.marked, int_ids(&inserted[..1]));
        assert_eq!(settlement.rescheduled, int_ids(&inserted[2..]));
        assert_eq!(
            settlement.skipped,
            int_ids(&inserted[1..2]),
            "the deleted row"
        );
        assert!(settlement.refused.is_empty());
        assert_eq!(f.state(inserted[0]).await, None);
        let rescheduled = f.state(inserted[2]).await.unwrap();
        assert!(rescheduled.waiting);
        assert_eq!(rescheduled.attempts, 1);
        f.cleanup().await;
    }

    pub async fn settle_skips_rows_another_relay_holds<F: Fixture>() {
        let f = F::new().await;
        let mine = f.migrated(StoreOptions::default()).await;
        let other = f.open(StoreOptions::default()).await;
        let inserted = f.insert(&[row(None, "a", 1), row(None, "b", 2)]).await;
        // As after a commit that failed: the batch rolled back, its rows are free again …
        mine.claim(10, &[])
            .await
            .unwrap()
            .batch
            .abandon()
            .await
            .unwrap();
        // … and another relay claims one of them before the settling.
        let held = other.claim(1, &[]).await.unwrap();
        assert_eq!(ids(&held.rows), int_ids(&inserted[..1]));
        let settlement = mine.settle(&sent(int_ids(&inserted))).await.unwrap();
        assert_eq!(settlement.marked, int_ids(&inserted[1..]));
        assert_eq!(settlement.skipped, int_ids(&inserted[..1]));
        held.batch
            .complete(sent(int_ids(&inserted[..1])))
            .await
            .unwrap();
        assert_eq!(f.count().await, 0);
        f.cleanup().await;
    }

    pub async fn key_order_holds_back_later_rows_of_a_key<F: Fixture>() {
        let f = F::new().await;
        let skip = StoreOptions {
            ordering: Ordering::Key,
            ..StoreOptions::default()
        };
        let block = StoreOptions {
            after_dead: AfterDead::Block,
            ..skip
        };
        let first = f.migrated(skip).await;
        let second = f.open(skip).await;
        let blocking = f.open(block).await;
        // Key k1: rows 1, 2; key k2: row 3; row 4 is k1 of another tenant.
        let inserted = f
            .insert(&[
                row(None, "k1", 1),
                row(None, "k1", 2),
                row(None, "k2", 3),
                row(Some("acme"), "k1", 4),
            ])
            .await;
        let a = first.claim(10, &[]).await.unwrap();
        let expected = vec![inserted[0], inserted[2], inserted[3]];
        assert_eq!(ids(&a.rows), int_ids(&expected), "one row per key");
        assert!(
            second.claim(10, &[]).await.unwrap().is_empty(),
            "row 2 waits for row 1, held by the first relay's batch"
        );
        a.batch
            .complete(BatchOutcome {
                sent: int_ids(&inserted[2..]),
                failed: vec![failure(inserted[0], "later", Disposition::Retry(HOUR))],
            })
            .await
            .unwrap();
        assert!(
            second.claim(10, &[]).await.unwrap().is_empty(),
            "row 2 waits while row 1 waits for its retry"
        );
        assert!(!second.has_due(&[]).await.unwrap());
        // Row 1's retry falls due (as if the hour had passed) and it fails for good: with
        // AfterDead::Skip row 2 proceeds, with Block it does not.
        f.exec(&format!(
            "UPDATE {{t}} SET next_attempt_at = NULL WHERE id = {}",
            inserted[0]
        ))
        .await;
        let again = second.claim(10, &[]).await.unwrap();
        assert_eq!(ids(&again.rows), int_ids(&inserted[..1]));
        again
            .batch
            .complete(BatchOutcome {
                sent: vec![],
                failed: vec![failure(inserted[0], "fatal", Disposition::Dead)],
            })
            .await
            .unwrap();
        let blocked = blocking.claim(10, &[]).await.unwrap();
        assert!(blocked.is_empty(), "Block: row 2 waits");
        blocked.batch.abandon().await.unwrap();
        let proceeds = second.claim(10, &[]).await.unwrap();
        assert_eq!(
            ids(&proceeds.rows),
            int_ids(&inserted[1..2]),
            "Skip: row 2 proceeds"
        );
        proceeds.batch.abandon().await.unwrap();
        f.cleanup().await;
    }

    pub async fn pruning_deletes_only_sent_rows_past_retention<F: Fixture>() {
        let f = F::new().await;
        let store = f.migrated(published_at()).await;
        let inserted = f
            .insert(&[
                row(None, "a", 1),
                row(None, "b", 2),
                row(None, "c", 3),
                row(None, "d", 4),
            ])
            .await;
        let claim = store.claim(10, &[]).await.unwrap();
        claim
            .batch
            .complete(BatchOutcome {
                sent: int_ids(&inserted[..2]),
                failed: vec![failure(inserted[2], "fatal", Disposition::Dead)],
            })
            .await
            .unwrap();
        assert_eq!(store.prune_sent(HOUR).await.unwrap(), 0, "not old enough");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(store.prune_sent(Duration::ZERO).await.unwrap(), 2);
        assert_eq!(f.state(inserted[0]).await, None);
        assert!(
            f.state(inserted[2]).await.unwrap().dead,
            "dead rows are never pruned"
        );
        assert!(
            !f.state(inserted[3]).await.unwrap().published,
            "unsent rows stay"
        );
        f.cleanup().await;
    }

    pub async fn dead_rows_are_listed_replayed_and_purged<F: Fixture>() {
        let f = F::new().await;
        let store = f.migrated(StoreOptions::default()).await;
        let inserted = f
            .insert(&[
                row(Some("acme"), "a", 1),
                row(None, "b", 2),
                row(Some("acme"), "c", 3),
            ])
            .await;
        let claim = store.claim(10, &[]).await.unwrap();
        let dead = inserted
            .iter()
            .map(|&id| failure(id, &format!("fatal {id}"), Disposition::Dead))
            .collect();
        claim
            .batch
            .complete(BatchOutcome {
                sent: vec![],
                failed: dead,
            })
            .await
            .unwrap();
        let all = store.dead_rows(None, 10).await.unwrap();
        let listed: Vec<OutboxId> = all.iter().map(|d| d.id.clone()).collect();
        assert_eq!(listed, int_ids(&inserted));
        assert_eq!(all[0].tenant.as_deref(), Some("acme"));
        assert_eq!(all[1].tenant, None);
        assert_eq!(all[0].aggregate_id, "a");
        assert_eq!(all[0].attempts, 1);
        assert_eq!(
            all[0].last_error.as_deref(),
            Some(format!("fatal {}", inserted[0]).as_str())
        );
        assert!(all[0].dead_at <= chrono::Utc::now());
        assert_eq!(store.dead_rows(Some("acme"), 10).await.unwrap().len(), 2);
        assert_eq!(store.dead_rows(Some("default"), 10).await.unwrap().len(), 1);
        assert_eq!(store.dead_rows(None, 1).await.unwrap().len(), 1);

        let err = store
            .replay_dead(&ReplaySelection::Id("not-a-number".into()))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::InvalidId { .. }), "{err}");
        let one = ReplaySelection::Id(inserted[0].to_string());
        assert_eq!(store.replay_dead(&one).await.unwrap(), 1);
        assert_eq!(store.replay_dead(&one).await.unwrap(), 0, "no longer dead");
        let acme = ReplaySelection::Tenant("acme".into());
        assert_eq!(store.replay_dead(&acme).await.unwrap(), 1);
        let replayed = f.state(inserted[2]).await.unwrap();
        assert!(!replayed.dead && !replayed.waiting);
        assert_eq!(replayed.attempts, 0);

        assert_eq!(
            store.purge_dead(HOUR, None).await.unwrap(),
            0,
            "died too recently"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            store
                .purge_dead(Duration::ZERO, Some("acme"))
                .await
                .unwrap(),
            0
        );
        assert_eq!(store.purge_dead(Duration::ZERO, None).await.unwrap(), 1);
        assert_eq!(f.state(inserted[1]).await, None);
        let claim = store.claim(10, &[]).await.unwrap();
        assert_eq!(
            ids(&claim.rows),
            vec![OutboxId::Int(inserted[0]), OutboxId::Int(inserted[2])]
        );
        claim.batch.abandon().await.unwrap();
        f.cleanup().await;
    }

    pub async fn malformed_headers_are_rejected_not_published<F: Fixture>() {
        let f = F::new().await;
        let store = f.migrated(StoreOptions::default()).await;
        let mut bad = row(None, "a", 1);
        bad.headers = r#"{"retries": 5}"#.to_owned();
        let inserted = f.insert(&[bad, row(None, "b", 2)]).await;
        let claim = store.claim(10, &[]).await.unwrap();
        assert_eq!(ids(&claim.rows), int_ids(&inserted[1..]));
        assert_eq!(claim.rejected.len(), 1);
        let rejected = &claim.rejected[0];
        assert_eq!(rejected.id, OutboxId::Int(inserted[0]));
        assert_eq!(rejected.disposition, Disposition::Dead);
        assert!(rejected.error.contains("\"retries\""), "{}", rejected.error);
        let outcome = BatchOutcome {
            sent: ids(&claim.rows),
            failed: claim.rejected.clone(),
        };
        claim.batch.complete(outcome).await.unwrap();
        assert!(f.state(inserted[0]).await.unwrap().dead);
        f.cleanup().await;
    }

    pub async fn unusable_tables_are_refused_naming_every_problem<F: Fixture>() {
        let f = F::new().await;
        let missing = store::open(&f.url(), &f.spec(), StoreOptions::default(), 1)
            .await
            .err()
            .expect("a missing table is refused")
            .to_string();
        assert!(missing.contains("does not exist"), "{missing}");
        f.create_unusable_table().await;
        for attempt in ["open", "migrate"] {
            let err = match attempt {
                "open" => store::open(&f.url(), &f.spec(), StoreOptions::default(), 1)
                    .await
                    .err()
                    .map(|e| e.to_string()),
                _ => store::migrate(&f.url(), &f.spec())
                    .await
                    .err()
                    .map(|e| e.to_string()),
            }
            .unwrap_or_else(|| panic!("{attempt} accepted an unusable table"));
            assert!(
                err.contains(&format!("\"{}\" cannot be used", f.table())),
                "{err}"
            );
            for needle in [
                "column \"id\" (database.columns.id) has type",
                "column \"aggregate_id\" (database.columns.aggregate_id) is missing",
                "column \"payload\" (database.columns.payload) has type",
            ] {
                assert!(err.contains(needle), "{attempt}: {needle:?} not in\n{err}");
            }
        }
        // `migrate` changed nothing on the refused table.
        let err = store::open(&f.url(), &f.spec(), StoreOptions::default(), 1)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("\"published_at\" (bookkeeping"), "{err}");
        f.cleanup().await;
    }

    pub async fn an_application_table_is_relayed_through_the_column_mapping<F: Fixture>() {
        let f = F::new().await;
        f.create_debezium_table().await;
        f.insert_debezium("order", "o-1", r#"{"total":1}"#).await;
        f.insert_debezium("customer", "c-1", r#"{"name":"x"}"#)
            .await;
        let columns = sluice::store::ColumnsSettings {
            aggregate_type: Some("aggregatetype".into()),
            aggregate_id: Some("aggregateid".into()),
            event_type: Some("type".into()),
            ..Default::default()
        };
        let spec = TableSpec::from_settings(f.table(), &columns).unwrap();
        let first = store::migrate(&f.url(), &spec).await.unwrap();
        let again = store::migrate(&f.url(), &spec).await.unwrap();
        assert_eq!(first, again, "migrate is idempotent");
        assert!(
            first.contains("every row belongs to tenant \"default\""),
            "{first}"
        );
        let store = store::open(&f.url(), &spec, StoreOptions::default(), 2)
            .await
            .unwrap();
        f.insert_debezium("order", "o-2", r#"{"total":2}"#).await;
        let claim = store.claim(10, &[]).await.unwrap();
        let got: Vec<(&str, &str, &str)> = claim
            .rows
            .iter()
            .map(|r| {
                (
                    r.aggregate_type.as_str(),
                    r.aggregate_id.as_str(),
                    r.event_type.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("order", "o-1", "Created"),
                ("customer", "c-1", "Created"),
                ("order", "o-2", "Created")
            ],
            "claimed in insertion order, also rows inserted before the migration"
        );
        assert!(
            claim
                .rows
                .iter()
                .all(|r| r.tenant.as_str() == TenantId::DEFAULT_NAME)
        );
        assert!(claim.rows.iter().all(|r| r.headers.is_empty()));
        let payload: serde_json::Value = serde_json::from_slice(&claim.rows[0].payload).unwrap();
        assert_eq!(payload, serde_json::json!({"total": 1}));
        let distinct: HashSet<&OutboxId> = claim.rows.iter().map(|r| &r.id).collect();
        assert_eq!(distinct.len(), 3);
        claim.batch.complete(sent(ids(&claim.rows))).await.unwrap();
        assert_eq!(f.count().await, 0);
        f.cleanup().await;
    }
}

/// One `#[tokio::test]` per body for a fixture.
macro_rules! conformance {
    ($module:ident, $fixture:ty) => {
        mod $module {
            use super::*;

            conformance!(@tests $fixture;
                claims_decode_rows_in_insertion_order,
                two_claimers_get_disjoint_rows,
                rows_put_back_behind_full_claims_are_claimed_again,
                paused_tenants_are_skipped,
                has_due_and_backlog_follow_the_rows_states,
                the_backlog_sample_counts_per_tenant_and_reads_at_most_its_limit,
                failures_are_rescheduled_dead_lettered_or_waited_out,
                marking_published_at_keeps_the_row_and_never_claims_it_again,
                a_batch_naming_a_row_it_does_not_hold_fails_the_count_check_and_settle_records_the_rest,
                settle_skips_rows_another_relay_holds,
                key_order_holds_back_later_rows_of_a_key,
                pruning_deletes_only_sent_rows_past_retention,
                dead_rows_are_listed_replayed_and_purged,
                malformed_headers_are_rejected_not_published,
                unusable_tables_are_refused_naming_every_problem,
                an_application_table_is_relayed_through_the_column_mapping,
            );
        }
    };
    (@tests $fixture:ty; $($body:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $body() {
                bodies::$body::<$fixture>().await;
            }
        )*
    };
}

conformance!(postgres, pg::PgFixture);
conformance!(mariadb, my::MyFixture);
conformance!(sqlite, lite::LiteFixture);

// ---------------------------------------------------------------------------------------------
// What only one database needs proven

/// MariaDB/MySQL: a claim must not make the application's inserts wait. Under InnoDB's
/// default REPEATABLE READ a locking read that reaches the end of the unsent rows takes a
/// next-key lock on the gap after them, and every insert waits for the claimer's commit.
mod mariadb_locks {
    use super::*;
    use my::MyFixture;
    use sqlx::{AssertSqlSafe, Connection, MySqlConnection};

    /// Inserts one row on a fresh connection that waits at most 2 s for a lock; returns how
    /// long it took, or the error.
    async fn insert_with_short_wait(f: &MyFixture) -> Result<Duration, sqlx::Error> {
        let mut conn = MySqlConnection::connect(&my::url()).await?;
        sqlx::query("SET SESSION innodb_lock_wait_timeout = 2")
            .execute(&mut conn)
            .await?;
        let started = Instant::now();
        sqlx::query(AssertSqlSafe(f.sql(
            "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', 'new', 'OrderCreated', '{}')",
        )))
        .execute(&mut conn)
        .await?;
        Ok(started.elapsed())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inserts_do_not_wait_for_an_open_claim() {
        let f = MyFixture::new().await;
        let store = f.migrated(StoreOptions::default()).await;
        f.insert(&(1..=5).map(|n| row(None, "k", n)).collect::<Vec<_>>())
            .await;
        // A claim that reads past the last unsent row (limit above the backlog), held open
        // as while the relay waits for the broker.
        let claim = store.claim(500, &[]).await.unwrap();
        assert_eq!(claim.len(), 5);
        let took = insert_with_short_wait(&f)
            .await
            .expect("the insert must not wait for the relay's open claim");
        assert!(took < Duration::from_secs(1), "insert took {took:?}");
        claim.batch.abandon().await.unwrap();
        f.cleanup().await;
    }

    /// The same claim at REPEATABLE READ does block the insert: the test above can fail.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_same_claim_at_repeatable_read_would_block_inserts() {
        let f = MyFixture::new().await;
        let _store = f.migrated(StoreOptions::default()).await;
        f.insert(&(1..=5).map(|n| row(None, "k", n)).collect::<Vec<_>>())
            .await;
        let mut claimer = MySqlConnection::connect(&my::url()).await.unwrap();
        sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut claimer)
            .await
            .unwrap();
        let mut tx = claimer.begin().await.unwrap();
        let claimed = sqlx::query(AssertSqlSafe(f.sql(
            "SELECT id FROM {t} WHERE published_at IS NULL AND dead_at IS NULL
              ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED",
        )))
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        assert_eq!(claimed.len(), 5);
        let err = insert_with_short_wait(&f)
            .await
            .expect_err("REPEATABLE READ's gap lock blocks the insert");
        assert!(err.to_string().contains("Lock wait timeout"), "{err}");
        tx.rollback().await.unwrap();
        f.cleanup().await;
    }
}

/// SQLite: claims are committed leases, so the application writes while a batch is out, and
/// an expired lease hands the rows to another relay.
mod sqlite_leases {
    use super::*;
    use lite::LiteFixture;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_application_writes_while_a_batch_is_claimed() {
        let f = LiteFixture::new().await;
        let store = f.migrated(StoreOptions::default()).await;
        f.insert(&[row(None, "a", 1)]).await;
        let claim = store.claim(10, &[]).await.unwrap();
        let started = Instant::now();
        let more = f.insert(&[row(None, "b", 2)]).await;
        assert!(started.elapsed() < Duration::from_secs(1));
        let next = store.claim(10, &[]).await.unwrap();
        assert_eq!(
            ids(&next.rows),
            int_ids(&more),
            "only the new row: the first is leased"
        );
        next.batch.abandon().await.unwrap();
        claim.batch.abandon().await.unwrap();
        f.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_expired_lease_hands_the_rows_to_another_relay_and_the_first_cannot_mark_them() {
        let f = LiteFixture::new().await;
        let short = StoreOptions {
            lease: Duration::from_millis(200),
            ..StoreOptions::default()
        };
        let slow = f.migrated(short).await;
        let other = f.open(short).await;
        let inserted = f.insert(&[row(None, "a", 1), row(None, "b", 2)]).await;
        let stale = slow.claim(10, &[]).await.unwrap();
        assert!(other.claim(10, &[]).await.unwrap().is_empty(), "leased");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(other.has_due(&[]).await.unwrap(), "the lease expired");
        let taken = other.claim(1, &[]).await.unwrap();
        assert_eq!(ids(&taken.rows), int_ids(&inserted[..1]));
        // The slow relay published both; one row is now another relay's.
        let outcome = sent(int_ids(&inserted));
        let err = stale
            .batch
            .complete(sent(int_ids(&inserted)))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::MarkMismatch { .. }), "{err}");
        let settlement = slow.settle(&outcome).await.unwrap();
        assert_eq!(
            settlement.marked,
            int_ids(&inserted[1..]),
            "its expired lease, unclaimed"
        );
        assert_eq!(
            settlement.skipped,
            int_ids(&inserted[..1]),
            "leased by the other relay"
        );
        taken
            .batch
            .complete(sent(int_ids(&inserted[..1])))
            .await
            .unwrap();
        assert_eq!(f.count().await, 0);
        f.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rows_put_back_without_an_outcome_are_claimable_at_once() {
        let f = LiteFixture::new().await;
        let store = f.migrated(StoreOptions::default()).await;
        let inserted = f.insert(&[row(None, "a", 1), row(None, "b", 2)]).await;
        let claim = store.claim(10, &[]).await.unwrap();
        // The relay recorded row 1 and held row 2 back (no outcome for it).
        claim
            .batch
            .complete(sent(int_ids(&inserted[..1])))
            .await
            .unwrap();
        let again = store.claim(10, &[]).await.unwrap();
        assert_eq!(ids(&again.rows), int_ids(&inserted[1..]));
        again.batch.abandon().await.unwrap();
        f.cleanup().await;
    }
}
