//! Benchmark outbox tables on any of the databases Sluice relays from: created with
//! `sluice migrate`, filled with the standard rows (the same as [`crate::outbox`]'s: two
//! aggregate types, 1,000 ids, a 256-byte JSON payload), probed while a relay drains them, and
//! dropped at the end.

use std::time::Duration;

use anyhow::Context;
use sqlx::AssertSqlSafe;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::PgPool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use crate::cli::Settings;
use crate::outbox::{insert_rows_sql, migrate, to_i64};
use crate::{db, names};

/// The databases the benchmark compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Database {
    Postgres,
    Mariadb,
    Sqlite,
}

impl Database {
    pub const ALL: [Self; 3] = [Self::Postgres, Self::Mariadb, Self::Sqlite];

    /// As scenario labels spell it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Mariadb => "mariadb",
            Self::Sqlite => "sqlite",
        }
    }
}

enum Pool {
    Pg(PgPool),
    My(MySqlPool),
    Lite(SqlitePool),
}

/// An outbox table owned by one scenario (a SQLite one in a file of its own).
pub struct DbTable {
    pub database: Database,
    pub url: String,
    name: String,
    pool: Pool,
    _dir: Option<tempfile::TempDir>,
}

impl DbTable {
    /// Creates a table named after `stem` with `sluice migrate`.
    pub async fn create(
        settings: &Settings,
        database: Database,
        stem: &str,
    ) -> anyhow::Result<Self> {
        let name = names::table(stem);
        let (url, dir) = match database {
            Database::Postgres => (settings.database_url.clone(), None),
            Database::Mariadb => (settings.mysql_url.clone(), None),
            Database::Sqlite => {
                let dir = tempfile::tempdir().context("cannot create a directory for SQLite")?;
                let url = format!("sqlite://{}", dir.path().join("bench.db").display());
                (url, Some(dir))
            }
        };
        migrate(&settings.sluice, &url, &name, None).await?;
        let pool = match database {
            Database::Postgres => Pool::Pg(db::pool(&url).await?),
            Database::Mariadb => Pool::My(
                MySqlPoolOptions::new()
                    .max_connections(2)
                    .connect(&url)
                    .await
                    .with_context(|| {
                        format!("cannot connect to MariaDB at {}", db::redact(&url))
                    })?,
            ),
            Database::Sqlite => {
                let path = dir
                    .as_ref()
                    .map(|d| d.path().join("bench.db"))
                    .unwrap_or_default();
                Pool::Lite(
                    SqlitePoolOptions::new()
                        .max_connections(2)
                        .connect_with(
                            SqliteConnectOptions::new()
                                .filename(path)
                                .journal_mode(SqliteJournalMode::Wal)
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
            _dir: dir,
        })
    }

    /// The bare name, for `database.table`.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn quoted(&self) -> String {
        match self.database {
            Database::Mariadb => format!("`{}`", self.name),
            _ => db::quote_ident(&self.name),
        }
    }

    async fn execute(&self, sql: String) -> anyhow::Result<()> {
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

    async fn scalar(&self, sql: String) -> anyhow::Result<Option<i64>> {
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

    /// Inserts `rows` standard rows (tenant NULL), then updates the planner's statistics so
    /// every run starts from the same state.
    pub async fn fill(&self, rows: u64) -> anyhow::Result<()> {
        let t = self.quoted();
        match self.database {
            Database::Postgres => {
                self.execute(insert_rows_sql(
                    &t,
                    &format!("generate_series(1, {}::int8) AS g", to_i64(rows)?),
                ))
                .await?;
                self.execute(format!("VACUUM ANALYZE {t}")).await
            }
            // MariaDB stops a recursive CTE after max_recursive_iterations (1,000 by default).
            Database::Mariadb => {
                let mut from = 1;
                while from <= rows {
                    let to = (from + 999).min(rows);
                    self.execute(format!(
                        "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload)
                         WITH RECURSIVE s(g) AS (SELECT {from} UNION ALL SELECT g + 1 FROM s WHERE g < {to})
                         SELECT CASE WHEN g % 2 = 0 THEN 'order' ELSE 'customer' END,
                                CONCAT('agg-', g % 1000), 'Created',
                                JSON_OBJECT('n', g, 'pad', REPEAT('x', 236))
                           FROM s"
                    ))
                    .await?;
                    from = to + 1;
                }
                self.execute(format!("ANALYZE TABLE {t}")).await
            }
            Database::Sqlite => {
                self.execute(format!(
                    "WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {rows})
                     INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload)
                     SELECT CASE WHEN g % 2 = 0 THEN 'order' ELSE 'customer' END,
                            'agg-' || (g % 1000), 'Created',
                            json_object('n', g, 'pad', printf('%.236c', 'x'))
                       FROM s"
                ))
                .await?;
                self.execute("ANALYZE".to_owned()).await
            }
        }
    }

    /// Rows with an id below `id`.
    pub async fn count_below(&self, id: i64) -> anyhow::Result<i64> {
        Ok(self
            .scalar(format!(
                "SELECT COUNT(*) FROM {} WHERE id < {id}",
                self.quoted()
            ))
            .await?
            .unwrap_or(0))
    }

    /// The lowest id left, if any row is.
    pub async fn first_id(&self) -> anyhow::Result<Option<i64>> {
        self.scalar(format!(
            "SELECT id FROM {} ORDER BY id LIMIT 1",
            self.quoted()
        ))
        .await
    }

    pub async fn count(&self) -> anyhow::Result<i64> {
        Ok(self
            .scalar(format!("SELECT COUNT(*) FROM {}", self.quoted()))
            .await?
            .unwrap_or(0))
    }

    /// Deletes every row.
    pub async fn truncate(&self) -> anyhow::Result<()> {
        self.execute(format!("DELETE FROM {}", self.quoted())).await
    }

    /// Drops the table (a SQLite file goes with its directory); a failure is reported on
    /// stderr, not returned.
    pub async fn drop_table(self) {
        if self.database == Database::Sqlite {
            return;
        }
        if let Err(e) = self
            .execute(format!("DROP TABLE IF EXISTS {}", self.quoted()))
            .await
        {
            eprintln!("warning: cannot drop table {}: {e:#}", self.name);
        }
    }
}
