//! The MySQL/MariaDB driver: [`MyStore`] implements [`StoreDriver`] over a connection pool.
//!
//! Claims hold a transaction open, as on PostgreSQL: `SELECT … FOR UPDATE SKIP LOCKED`
//! (MariaDB ≥ 10.6, MySQL ≥ 8.0; older servers are refused at start-up). Every connection runs
//! at READ COMMITTED. InnoDB's default, REPEATABLE READ, takes next-key (gap) locks on locking
//! reads: a claim that reads to the end of the unsent rows locks the gap after the last one,
//! and every application insert would wait for the relay's broker round trip. READ COMMITTED
//! locks only the rows a claim returns (rows it reads and rejects are unlocked at once), so
//! inserts never wait on a claim. There is no LISTEN/NOTIFY: relays poll.
//!
//! - [`schema`]: reading `information_schema` and the MySQL types (the checked layout)
//! - [`mod@migrate`]: creating or upgrading the table and its indexes
//! - [`sql`]: the relay's statements; a claimed batch is a [`TxBatch`] of them
//! - [`fair`]: `relay.fair_share`'s heads

mod fair;
mod migrate;
mod schema;
mod sql;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{AssertSqlSafe, Executor};

use super::connect::{self, CONNECT_TIMEOUT};
use super::dialect::Driver;
use super::driver::StoreDriver;
use super::{BatchOutcome, Claim, Settlement, StoreError, StoreOptions, TableSpec};
use super::{prune, settle};
use crate::model::{OutboxId, TenantId};
use crate::store::batch::TxBatch;
use crate::store::fair::TenantTurn;
use crate::store::layout_sql::LayoutSql;
use crate::store::rows::{column, decode_claimed};
use crate::store::schema::check;
use crate::store::statement::{ReadRow, impl_execute, padded};
use sql::Statements;

impl_execute!(MySql, MySqlRow, DateTime<Utc>, |time| time);

/// A claimed batch: the open transaction holding the row locks.
pub(crate) type MyBatch = TxBatch<MySql, Statements>;

/// The session setting that keeps claims from blocking the application's inserts (see the
/// module documentation).
const ISOLATION: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";
/// The server-wide named lock of one table's pruner (names are limited to 64 characters, so
/// the database and table are hashed).
const PRUNE_LOCK: &str = "CONCAT('sluice_prune_', LEFT(SHA2(CONCAT(DATABASE(), '.', ?), 256), 40))";

/// Connects a pool of at most `connections`, each at READ COMMITTED. (sqlx sets the session's
/// `time_zone` to `+00:00`, so `TIMESTAMP` columns read as UTC.)
async fn connect(url: &str, connections: u32) -> Result<MySqlPool, StoreError> {
    let pool = MySqlPoolOptions::new()
        .acquire_timeout(CONNECT_TIMEOUT)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(ISOLATION).await?;
                Ok(())
            })
        });
    connect::connect(url, url.parse(), pool, connections).await
}

/// Refuses servers without `SKIP LOCKED`: MariaDB before 10.6, MySQL before 8.0.
async fn check_version(pool: &MySqlPool) -> Result<(), StoreError> {
    let version: String = sqlx::query_scalar("SELECT CAST(VERSION() AS CHAR)")
        .fetch_one(pool)
        .await?;
    let mut numbers = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let found = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    let (needed, name) = if version.to_ascii_lowercase().contains("mariadb") {
        ((10, 6), "MariaDB 10.6")
    } else {
        ((8, 0), "MySQL 8.0")
    };
    if found < needed {
        return Err(StoreError::ServerVersion {
            found: version,
            needed: name,
        });
    }
    Ok(())
}

/// Creates or upgrades the table (see [`migrate::migrate`]) and returns a one-line
/// description of what Sluice will relay from.
pub(super) async fn migrate(
    url: &str,
    spec: &TableSpec,
    options: &StoreOptions,
) -> Result<String, StoreError> {
    let pool = connect(url, 1).await?;
    check_version(&pool).await?;
    let layout = migrate::migrate(&pool, spec, options.fair_share.is_some()).await?;
    Ok(layout.summary())
}

/// The MySQL/MariaDB store.
pub struct MyStore {
    pool: MySqlPool,
    statements: Arc<Statements>,
    /// `relay.fair_share`: where the next walk over the tenants starts.
    turn: TenantTurn,
}

impl MyStore {
    /// Connects a pool of at most `connections`, checks the server's version and the table,
    /// and prepares the statements.
    pub async fn open(
        url: &str,
        spec: &TableSpec,
        options: StoreOptions,
        connections: u32,
    ) -> Result<Self, StoreError> {
        let pool = connect(url, connections).await?;
        check_version(&pool).await?;
        let found = schema::read_columns(&pool, &spec.name).await?;
        let layout = check::<schema::MyTypes>(spec, &found)?;
        if options.fair_share.is_some() {
            fair::check_table(&pool, &layout, &found).await?;
        }
        tracing::info!(table = %layout.table, layout = %layout.summary(), "outbox table checked");
        let statements = Statements::new(LayoutSql::new(layout, Driver::Mysql), options);
        Ok(Self {
            pool,
            statements: Arc::new(statements),
            turn: TenantTurn::default(),
        })
    }

    /// Opens new connections with `url` from now on (see [`connect::use_options`]).
    pub async fn use_url(&self, url: &str) -> Result<(), StoreError> {
        connect::use_options(&self.pool, url, url.parse::<MySqlConnectOptions>()).await
    }
}

impl StoreDriver for MyStore {
    type Db = MySql;
    type Batch = MyBatch;

    fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    fn sql(&self) -> &LayoutSql {
        &self.statements.sql
    }

    async fn has_due(&self, paused: &[TenantId]) -> Result<bool, StoreError> {
        let mut query =
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(self.statements.due.sql(paused.len())));
        for tenant in paused.iter().map(TenantId::name) {
            query = query.bind(tenant);
        }
        Ok(query.fetch_one(&self.pool).await? != 0)
    }

    async fn claim(&self, limit: usize, paused: &[TenantId]) -> Result<Claim<MyBatch>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let s = &self.statements;
        let names: Vec<Option<&str>> = paused.iter().map(TenantId::name).collect();
        let (heads, head_ids) = match &s.fair {
            Some(walk) => fair::claim_heads(&mut tx, s, walk, &self.turn, &names, limit).await?,
            None => (Vec::new(), Vec::new()),
        };
        let room = limit - heads.len().min(limit);
        // The claim in claim order (with `relay.fair_share`: past the heads, up to the room
        // they left; a transaction's own row locks do not make SKIP LOCKED skip a row).
        let filled = if room > 0 {
            let mut query = sqlx::query(AssertSqlSafe(
                s.claim.excluding(names.len(), head_ids.len()),
            ));
            for tenant in &names {
                query = query.bind(*tenant);
            }
            for id in padded(&head_ids) {
                query = match id {
                    OutboxId::Int(n) => query.bind(*n),
                    OutboxId::Text(text) => query.bind(text.as_ref()),
                };
            }
            let room = i64::try_from(room).unwrap_or(i64::MAX);
            query.bind(room).fetch_all(&mut *tx).await?
        } else {
            Vec::new()
        };
        if let Some(walk) = &s.fair {
            let tenants = filled
                .iter()
                .filter_map(|row| row.text(column::TENANT).ok());
            self.turn.filled(tenants, walk.share);
        }
        let batch = TxBatch::new(tx, Arc::clone(s));
        let rows = heads.iter().chain(&filled);
        Claim::of(batch, rows.map(|row| decode_claimed(row, &s.sql)))
    }

    async fn settle(&self, outcome: &BatchOutcome) -> Result<Settlement, StoreError> {
        let tx = self.pool.begin().await?;
        let rows = &*self.statements;
        settle::settle(tx, &rows.sql, outcome, |_| settle::SKIP_LOCKED.into(), rows).await
    }

    async fn prune_sent(&self, retention: Duration) -> Result<u64, StoreError> {
        // One pruner per table at a time: a named lock held on this connection while it prunes.
        let mut conn = self.pool.acquire().await?;
        let sql = &self.statements.sql;
        let got: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT CAST(GET_LOCK({PRUNE_LOCK}, 0) AS SIGNED)"
        )))
        .bind(&sql.table)
        .fetch_one(&mut *conn)
        .await?;
        if got != Some(1) {
            return Ok(0);
        }
        let pruned = prune::prune::<MySql>(&mut conn, sql, retention, |_| String::new()).await;
        let released = sqlx::query(AssertSqlSafe(format!("DO RELEASE_LOCK({PRUNE_LOCK})")))
            .bind(&sql.table)
            .execute(&mut *conn)
            .await;
        let pruned = pruned?;
        released?;
        Ok(pruned)
    }
}
