//! The PostgreSQL driver: [`PgStore`] implements [`StoreDriver`] over a connection pool.
//!
//! Every statement is built once from the checked [`Layout`] of the table, so whatever the
//! application's column names and types, the Rust side sees one shape: `int8` or `text` keys,
//! `text` strings, `bytea` payloads, `timestamptz` times (see [`schema`]).
//!
//! - [`schema`]: reading the catalog and checking every column (the [`Layout`])
//! - [`migrate`]: creating or upgrading the table and its indexes
//! - [`sql`]: the relay's statements (claim, due probe, mark, reschedule)
//! - [`cursor`]: where the next claim starts while a backlog drains
//! - [`rows`]: ids as parameters, the shared statements on PostgreSQL's pool
//! - [`batch`]: the claimed batch's transaction (mark, reschedule, commit)
//! - LISTEN/NOTIFY: [`listen`]
//!
//! Settling, retention, dead rows and the backlog are shared: [`crate::store::settle`],
//! [`crate::store::prune`], [`crate::store::dead`], [`crate::store::backlog`].

mod batch;
mod cursor;
mod listen;
mod migrate;
mod rows;
mod schema;
mod sql;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::AssertSqlSafe;
use sqlx::Postgres;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::store::batch::TxBatch;
pub(super) use batch::PgBatch;
pub use listen::{DEFAULT_CHANNEL, validate_channel};
use schema::Layout;

use super::connect::{self, CONNECT_TIMEOUT};
use super::driver::StoreDriver;
use super::statement::{Param, Statement};
use super::{BatchOutcome, Claim, Settlement, StoreError, StoreOptions, TableSpec};
use super::{prune, settle};
use crate::model::{OutboxId, TenantId};
use crate::store::dialect::Dialect;
use crate::store::layout_sql::LayoutSql;
use crate::store::rows::decode_claimed;
use cursor::ClaimCursor;
use sql::Statements;

/// `application_name` of Sluice's connections (visible in `pg_stat_activity`).
pub(super) const APPLICATION_NAME: &str = "sluice";
/// Advisory-lock key (with the table's oid): one pruner per table at a time.
const PRUNE_LOCK_KEY: i32 = 0x736c_7570; // "slup"
/// Settling locks the rows it records, skipping those another relay has locked.
const FOR_UPDATE: &str = "FOR UPDATE SKIP LOCKED";

/// Connection options from a URL, with Sluice's `application_name` unless the URL sets one
/// (so operators can find the connections in `pg_stat_activity`). Without the
/// `extra_float_digits` start-up parameter sqlx sends by default: PgBouncer refuses
/// connections that carry it unless configured to ignore it, and Sluice reads no
/// floating-point values.
fn connect_options(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    let options: PgConnectOptions = url.parse::<PgConnectOptions>()?.extra_float_digits(None);
    Ok(if options.get_application_name().is_none() {
        options.application_name(APPLICATION_NAME)
    } else {
        options
    })
}

/// Connects a pool of at most `connections`.
async fn connect(url: &str, connections: u32) -> Result<PgPool, StoreError> {
    let pool = PgPoolOptions::new().acquire_timeout(CONNECT_TIMEOUT);
    connect::connect(url, connect_options(url), pool, connections).await
}

/// Creates or upgrades the table (see [`migrate::migrate`]) and returns a one-line
/// description of what Sluice will relay from.
pub(super) async fn migrate(url: &str, spec: &TableSpec) -> Result<String, StoreError> {
    let pool = connect(url, 1).await?;
    let layout = migrate::migrate(&pool, spec).await?;
    Ok(layout.summary())
}

/// The PostgreSQL store.
pub struct PgStore {
    pool: PgPool,
    /// The options LISTEN connections are opened with (replaced with the pool's on
    /// [`PgStore::use_url`]).
    options: std::sync::RwLock<PgConnectOptions>,
    sql: LayoutSql,
    // Built once from checked identifiers (see `TableName`, `ColumnName`), hence
    // `AssertSqlSafe`.
    statements: Statements,
    cursor: ClaimCursor,
}

impl PgStore {
    /// Connects a pool of at most `connections`, checks the table (every column Sluice reads
    /// or writes must exist with a usable type; otherwise the refusal lists every problem) and
    /// prepares the statements.
    pub async fn open(
        url: &str,
        spec: &TableSpec,
        options: StoreOptions,
        connections: u32,
    ) -> Result<Self, StoreError> {
        let pool = connect(url, connections).await?;
        let layout = schema::inspect(&pool, spec).await?;
        tracing::info!(table = %layout.table, layout = %layout.summary(), "outbox table checked");
        let sql = LayoutSql::new(layout, Dialect::Postgres);
        let statements = Statements::new(&sql, options);
        Ok(Self {
            pool,
            options: std::sync::RwLock::new(connect_options(url)?),
            sql,
            statements,
            cursor: ClaimCursor::default(),
        })
    }

    /// The checked table this store relays from.
    pub fn layout(&self) -> &Layout {
        &self.sql.layout
    }

    /// Opens new connections with `url` from now on (see [`connect::use_options`]), LISTEN's
    /// too.
    pub async fn use_url(&self, url: &str) -> Result<(), StoreError> {
        if let Ok(options) = connect_options(url) {
            *self
                .options
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = options;
        }
        connect::use_options(&self.pool, url, connect_options(url)).await
    }
}

impl StoreDriver for PgStore {
    const NAME: &'static str = "PostgreSQL";
    type Db = Postgres;

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn sql(&self) -> &LayoutSql {
        &self.sql
    }

    type Batch = PgBatch;

    async fn has_due(&self, paused: &[TenantId]) -> Result<bool, StoreError> {
        let paused: Vec<Option<&str>> = paused.iter().map(TenantId::name).collect();
        Ok(
            sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.statements.due)))
                .bind(&paused)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    async fn claim(&self, limit: usize, paused: &[TenantId]) -> Result<Claim<PgBatch>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let wanted = limit;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let paused: Vec<Option<&str>> = paused.iter().map(TenantId::name).collect();
        let after = match &self.statements.claim_after {
            Some(sql) => self.cursor.start(Instant::now()).map(|id| (sql, id)),
            None => None,
        };
        let raw = match after {
            Some((sql, id)) => {
                sqlx::query(AssertSqlSafe(Arc::clone(sql)))
                    .bind(&paused)
                    .bind(limit)
                    .bind(id)
                    .fetch_all(&mut *tx)
                    .await?
            }
            None => {
                sqlx::query(AssertSqlSafe(Arc::clone(&self.statements.claim)))
                    .bind(&paused)
                    .bind(limit)
                    .fetch_all(&mut *tx)
                    .await?
            }
        };
        let decoded = raw
            .iter()
            .map(|row| decode_claimed(row, &self.sql))
            .collect::<Result<Vec<_>, _>>()?;
        let batch = TxBatch::new(tx, Arc::clone(&self.statements.batch));
        let claim = Claim::of(batch, decoded);
        if self.statements.claim_after.is_some() {
            let highest = claim
                .rows
                .iter()
                .map(|r| &r.id)
                .chain(claim.rejected.iter().map(|f| &f.id))
                .filter_map(|id| match id {
                    OutboxId::Int(id) => Some(*id),
                    OutboxId::Text(_) => None,
                })
                .max();
            self.cursor
                .claimed(after.map(|(_, id)| id), raw.len(), wanted, highest);
        }
        Ok(claim)
    }

    async fn settle(&self, outcome: &BatchOutcome) -> Result<Settlement, StoreError> {
        let tx = self.pool.begin().await?;
        settle::settle(
            tx,
            &self.sql,
            outcome,
            |_| FOR_UPDATE.into(),
            &*self.statements.batch,
        )
        .await
    }

    async fn prune_sent(&self, retention: Duration) -> Result<u64, StoreError> {
        // One pruner per table at a time, however many relays run: each chunk takes an
        // advisory lock on the table's oid, or deletes nothing.
        let lock = |statement: &mut Statement| {
            let key = statement.param(Param::Int(PRUNE_LOCK_KEY.into()));
            let table = statement.param(Param::Text(self.sql.table.clone()));
            format!(
                "AND (SELECT pg_try_advisory_xact_lock({key}::int, to_regclass({table})::oid::int))"
            )
        };
        let mut conn = self.pool.acquire().await?;
        Ok(prune::prune::<Postgres>(&mut conn, &self.sql, retention, lock).await?)
    }

    async fn listen(
        &self,
        channel: &str,
        wake: &(dyn Fn() + Send + Sync),
    ) -> Result<Infallible, StoreError> {
        let options = self
            .options
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        listen::listen(&options, channel, wake).await
    }

    async fn install_notify_trigger(&self, channel: &str) -> Result<(), StoreError> {
        listen::install_trigger(&self.pool, &self.sql.layout.table, channel).await
    }

    async fn drop_notify_trigger(&self) -> Result<(), StoreError> {
        listen::drop_trigger(&self.pool, &self.sql.layout.table).await
    }
}

#[cfg(test)]
mod startup_tests;
