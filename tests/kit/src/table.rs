//! An outbox table on any database Sluice relays from (PostgreSQL, MySQL/MariaDB, SQLite),
//! owned by one test or benchmark scenario: a unique name (SQLite: a file of its own in a
//! temporary directory), created by `sluice migrate` or left for the caller to create, filled
//! and inspected with plain SQL the way an application would, dropped at the end.
//!
//! SQL passed in may write `{t}` for the quoted table name.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::PgPool;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Row};

use crate::db::{quote_ident, redact};
use crate::env::{database_url, mysql_url, sluice_bin, unique};
use crate::relay::migrate;

/// The databases Sluice relays from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Database {
    /// PostgreSQL.
    Postgres,
    /// MariaDB (Sluice's MySQL driver).
    Mariadb,
    /// SQLite, a file in a temporary directory.
    Sqlite,
}

impl Database {
    /// Every database, in this order.
    pub const ALL: [Self; 3] = [Self::Postgres, Self::Mariadb, Self::Sqlite];

    /// As labels spell it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Mariadb => "mariadb",
            Self::Sqlite => "sqlite",
        }
    }
}

/// Where the database servers are (SQLite needs none).
#[derive(Debug, Clone)]
pub struct Servers {
    /// A PostgreSQL URL.
    pub postgres: String,
    /// A MariaDB URL.
    pub mariadb: String,
}

impl Servers {
    /// The tests' servers (see [`crate::env`]).
    pub fn for_tests() -> Self {
        Self {
            postgres: database_url(),
            mariadb: mysql_url(),
        }
    }
}

#[derive(Clone)]
enum Pool {
    Pg(PgPool),
    My(MySqlPool),
    Lite(SqlitePool),
}

/// One table in one database, and a small pool of the harness's own connections to it.
/// Clones share the pool (and the SQLite file's directory).
#[derive(Clone)]
pub struct DbTable {
    /// The database it is in.
    pub database: Database,
    /// The URL a relay connects with.
    pub url: String,
    /// The bare name, for `database.table`.
    pub name: String,
    pool: Pool,
    _dir: Option<Arc<tempfile::TempDir>>,
}

/// A place for a table named `name`: its database's URL and, for SQLite, the file's directory.
fn place(
    servers: &Servers,
    database: Database,
) -> anyhow::Result<(String, Option<tempfile::TempDir>)> {
    Ok(match database {
        Database::Postgres => (servers.postgres.clone(), None),
        Database::Mariadb => (servers.mariadb.clone(), None),
        Database::Sqlite => {
            let dir = tempfile::tempdir().context("cannot create a directory for SQLite")?;
            let url = format!("sqlite://{}", dir.path().join("app.db").display());
            (url, Some(dir))
        }
    })
}

impl DbTable {
    /// A table named `name`, not created yet.
    pub async fn open(servers: &Servers, database: Database, name: String) -> anyhow::Result<Self> {
        let (url, dir) = place(servers, database)?;
        Self::connect(database, url, name, dir).await
    }

    /// A table named `name` created by `sluice migrate` (binary `sluice`), with the NOTIFY
    /// trigger on `notify_channel` if given.
    pub async fn migrated(
        servers: &Servers,
        database: Database,
        name: String,
        sluice: &Path,
        notify_channel: Option<&str>,
    ) -> anyhow::Result<Self> {
        let (url, dir) = place(servers, database)?;
        migrate(sluice, &url, &name, notify_channel).await?;
        Self::connect(database, url, name, dir).await
    }

    /// For tests: a fresh table named after `stem` created by `sluice migrate` in the tests'
    /// database of kind `database`.
    pub async fn create(database: Database, stem: &str) -> Self {
        Self::migrated(
            &Servers::for_tests(),
            database,
            unique(stem),
            &sluice_bin(),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// For tests: a fresh table named after `stem`, not created yet.
    pub async fn fresh(database: Database, stem: &str) -> Self {
        Self::open(&Servers::for_tests(), database, unique(stem))
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// For tests: a table the application created itself with plain SQL (`create_sql`), not
    /// by `sluice migrate`.
    pub async fn create_with_sql(database: Database, stem: &str, create_sql: &str) -> Self {
        let table = Self::fresh(database, stem).await;
        table.execute(create_sql).await;
        table
    }

    async fn connect(
        database: Database,
        url: String,
        name: String,
        dir: Option<tempfile::TempDir>,
    ) -> anyhow::Result<Self> {
        let pool = match database {
            Database::Postgres => Pool::Pg(crate::db::pool(&url).await?),
            Database::Mariadb => Pool::My(
                MySqlPoolOptions::new()
                    .max_connections(4)
                    .connect(&url)
                    .await
                    .with_context(|| format!("cannot connect to MariaDB at {}", redact(&url)))?,
            ),
            Database::Sqlite => {
                let path = dir
                    .as_ref()
                    .map(|d| d.path().join("app.db"))
                    .unwrap_or_default();
                Pool::Lite(
                    SqlitePoolOptions::new()
                        .max_connections(2)
                        .connect_with(
                            SqliteConnectOptions::new()
                                .filename(path)
                                .create_if_missing(true)
                                // As a WAL application usually runs.
                                .journal_mode(SqliteJournalMode::Wal)
                                .synchronous(SqliteSynchronous::Normal)
                                .busy_timeout(Duration::from_secs(30)),
                        )
                        .await
                        .context("cannot open the SQLite file")?,
                )
            }
        };
        Ok(Self {
            database,
            url,
            name,
            pool,
            _dir: dir.map(Arc::new),
        })
    }

    /// The quoted name, for SQL.
    pub fn quoted(&self) -> String {
        match self.database {
            Database::Mariadb => format!("`{}`", self.name.replace('`', "``")),
            _ => quote_ident(&self.name),
        }
    }

    /// `sql` with `{t}` replaced by the quoted name.
    pub fn sql(&self, sql: &str) -> String {
        sql.replace("{t}", &self.quoted())
    }

    /// The PostgreSQL pool (panics on another database).
    pub fn pg_pool(&self) -> &PgPool {
        match &self.pool {
            Pool::Pg(pool) => pool,
            _ => panic!("{} is not a PostgreSQL table", self.name),
        }
    }

    /// The MariaDB pool (panics on another database).
    pub fn mysql_pool(&self) -> &MySqlPool {
        match &self.pool {
            Pool::My(pool) => pool,
            _ => panic!("{} is not a MariaDB table", self.name),
        }
    }

    /// The SQLite pool (panics on another database).
    pub fn sqlite_pool(&self) -> &SqlitePool {
        match &self.pool {
            Pool::Lite(pool) => pool,
            _ => panic!("{} is not a SQLite table", self.name),
        }
    }

    /// Runs `sql` (any number of statements, no parameters).
    pub async fn try_execute(&self, sql: &str) -> anyhow::Result<()> {
        let sql = self.sql(sql);
        match &self.pool {
            Pool::Pg(pool) => sqlx::raw_sql(AssertSqlSafe(sql.clone()))
                .execute(pool)
                .await
                .map(drop),
            Pool::My(pool) => sqlx::raw_sql(AssertSqlSafe(sql.clone()))
                .execute(pool)
                .await
                .map(drop),
            Pool::Lite(pool) => sqlx::raw_sql(AssertSqlSafe(sql.clone()))
                .execute(pool)
                .await
                .map(drop),
        }
        .with_context(|| format!("SQL failed: {sql}"))
    }

    /// [`DbTable::try_execute`] for tests: panics on failure.
    pub async fn execute(&self, sql: &str) {
        self.try_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// The integer of a query returning at most one row.
    pub async fn try_scalar(&self, sql: &str) -> anyhow::Result<Option<i64>> {
        let sql = self.sql(sql);
        match &self.pool {
            Pool::Pg(pool) => {
                sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                    .fetch_optional(pool)
                    .await
            }
            Pool::My(pool) => {
                sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                    .fetch_optional(pool)
                    .await
            }
            Pool::Lite(pool) => {
                sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                    .fetch_optional(pool)
                    .await
            }
        }
        .with_context(|| format!("SQL failed: {sql}"))
    }

    /// For tests: the integer of a query returning one row; panics otherwise.
    pub async fn scalar_i64(&self, sql: &str) -> i64 {
        match self.try_scalar(sql).await {
            Ok(Some(n)) => n,
            Ok(None) => panic!("{}: no row", self.sql(sql)),
            Err(e) => panic!("{e:#}"),
        }
    }

    /// Rows in the table.
    pub async fn try_count(&self) -> anyhow::Result<i64> {
        Ok(self
            .try_scalar("SELECT COUNT(*) FROM {t}")
            .await?
            .unwrap_or(0))
    }

    /// Rows in the table.
    pub async fn count(&self) -> i64 {
        self.scalar_i64("SELECT COUNT(*) FROM {t}").await
    }

    /// Rows not sent yet (`published_at IS NULL`).
    pub async fn unsent(&self) -> i64 {
        self.scalar_i64("SELECT COUNT(*) FROM {t} WHERE published_at IS NULL")
            .await
    }

    /// Every row's id.
    pub async fn ids(&self) -> Vec<i64> {
        let sql = self.sql("SELECT id FROM {t} ORDER BY id");
        match &self.pool {
            Pool::Pg(pool) => sqlx::query_scalar(AssertSqlSafe(sql)).fetch_all(pool).await,
            Pool::My(pool) => sqlx::query_scalar(AssertSqlSafe(sql)).fetch_all(pool).await,
            Pool::Lite(pool) => sqlx::query_scalar(AssertSqlSafe(sql)).fetch_all(pool).await,
        }
        .expect("select ids")
    }

    /// Inserts `n` rows in one statement (MariaDB: 1,000 a statement): aggregate types `order`
    /// and `customer` alternating, ids `agg-<i % 50>`, payload `{"n": i}`, a `trace` header;
    /// `tenant` may be NULL.
    pub async fn insert_rows(&self, n: i64, tenant: Option<&str>) {
        match &self.pool {
            Pool::Pg(pool) => {
                let sql = self.sql(
                    "INSERT INTO {t} (tenant, aggregate_type, aggregate_id, event_type, payload, headers)
                     SELECT $2,
                            CASE WHEN g % 2 = 0 THEN 'order' ELSE 'customer' END,
                            'agg-' || (g % 50),
                            CASE WHEN g % 2 = 0 THEN 'OrderCreated' ELSE 'CustomerUpdated' END,
                            jsonb_build_object('n', g),
                            jsonb_build_object('trace', 'trace-' || g)
                       FROM generate_series(1, $1) AS g",
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(n)
                    .bind(tenant)
                    .execute(pool)
                    .await
                    .expect("insert rows");
            }
            Pool::My(pool) => {
                // MariaDB stops recursive CTEs at max_recursive_iterations (1000 here).
                let sql = self.sql(
                    "INSERT INTO {t} (tenant, aggregate_type, aggregate_id, event_type, payload, headers)
                     WITH RECURSIVE g(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM g WHERE i < ?)
                     SELECT ?,
                            CASE WHEN i % 2 = 0 THEN 'order' ELSE 'customer' END,
                            CONCAT('agg-', i % 50),
                            CASE WHEN i % 2 = 0 THEN 'OrderCreated' ELSE 'CustomerUpdated' END,
                            JSON_OBJECT('n', i), JSON_OBJECT('trace', CONCAT('trace-', i))
                       FROM g",
                );
                let mut from = 1;
                while from <= n {
                    let to = (from + 999).min(n);
                    sqlx::query(AssertSqlSafe(sql.clone()))
                        .bind(from)
                        .bind(to)
                        .bind(tenant)
                        .execute(pool)
                        .await
                        .expect("insert rows");
                    from = to + 1;
                }
            }
            Pool::Lite(pool) => {
                let sql = self.sql(
                    "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < ?)
                     INSERT INTO {t} (tenant, aggregate_type, aggregate_id, event_type, payload, headers)
                     SELECT ?,
                            CASE WHEN i % 2 = 0 THEN 'order' ELSE 'customer' END,
                            'agg-' || (i % 50),
                            CASE WHEN i % 2 = 0 THEN 'OrderCreated' ELSE 'CustomerUpdated' END,
                            json_object('n', i), json_object('trace', 'trace-' || i)
                       FROM g",
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(n)
                    .bind(tenant)
                    .execute(pool)
                    .await
                    .expect("insert rows");
            }
        }
    }

    /// PostgreSQL: `(tenant, attempts, last_error)` of every row still unsent.
    pub async fn unsent_rows(&self) -> Vec<(Option<String>, i32, Option<String>)> {
        let sql = self.sql(
            "SELECT tenant, attempts, last_error FROM {t} WHERE published_at IS NULL ORDER BY id",
        );
        sqlx::query_as(AssertSqlSafe(sql))
            .fetch_all(self.pg_pool())
            .await
            .expect("select unsent")
    }

    /// PostgreSQL: rows of a query returning text columns.
    pub async fn text_rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        let sql = self.sql(sql);
        let rows = sqlx::query(AssertSqlSafe(sql.clone()))
            .fetch_all(self.pg_pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| row.try_get::<Option<String>, _>(i).expect("text column"))
                    .collect()
            })
            .collect()
    }

    /// A relay config for this table with the reference plugin (see
    /// [`crate::config::RelayConfig::for_tests`]); `database_extra` goes into `[database]`,
    /// `relay_extra` into `[relay]`, `kafka_extra` into `[kafka]`.
    pub fn config(
        &self,
        bootstrap: &str,
        topic_prefix: &str,
        database_extra: &str,
        relay_extra: &str,
        kafka_extra: &str,
    ) -> String {
        crate::config::RelayConfig {
            database_url: self.url.clone(),
            database_extra: Some(database_extra.to_owned()),
            relay_extra: Some(relay_extra.to_owned()),
            kafka_extra: Some(kafka_extra.to_owned()),
            ..crate::config::RelayConfig::for_tests(&self.name, bootstrap, topic_prefix)
        }
        .render()
    }

    /// Drops the table (a SQLite file goes with its directory); a failure is reported on
    /// stderr, not returned, so it never hides the test's or scenario's own result.
    pub async fn drop_table(self) {
        match &self.pool {
            Pool::Lite(pool) => pool.close().await,
            _ => {
                if let Err(e) = self.try_execute("DROP TABLE IF EXISTS {t}").await {
                    eprintln!("warning: cannot drop table {}: {e:#}", self.name);
                }
            }
        }
    }
}
