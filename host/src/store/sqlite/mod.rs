//! The SQLite driver: [`LiteStore`] implements [`StoreDriver`] over one database file that
//! the application and any number of relay processes share.
//!
//! SQLite has no row locks and one writer at a time, so a transaction held across the broker
//! round trip would stop the application's writes. A claim is a **lease** instead: a short
//! write transaction stamps the rows with the batch's token (`leased_by`) and a deadline
//! (`lease_until`, now + `database.lease`) and commits; the relay publishes with no
//! transaction open; marking changes only rows still leased to the token (a count mismatch
//! sends the batch to the relay's settle path). A lease that expires — a relay killed, or a
//! batch slower than the lease — makes its rows claimable again: at-least-once, never lost.
//! Connections use WAL (readers never wait for the writer) and a busy timeout. There is no
//! LISTEN/NOTIFY: relays poll.
//!
//! - [`schema`]: reading the table (`pragma_table_info`) and SQLite's types
//! - [`mod@migrate`]: creating or upgrading the table and its partial indexes
//! - [`sql`], [`batch`]: the lease, completing a batch

mod batch;
mod migrate;
mod schema;
mod sql;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};

pub(super) use batch::LiteBatch;

use super::dialect::Driver;
use super::driver::StoreDriver;
use super::statement::{Param, Statement};
use super::{BatchOutcome, Claim, RowFailure, Settlement, StoreError};
use super::{StoreOptions, TableSpec};
use super::{connect, prune, settle};
use crate::model::{OutboxId, OutboxRow, TenantId};
use crate::store::dialect::millis;
use crate::store::fair::{TenantTurn, pick_heads};
use crate::store::layout_sql::LayoutSql;
use crate::store::rows::{column, decode_claimed, unreadable_key};
use crate::store::schema::check;
use crate::store::statement::{ReadRow, impl_execute};
use sql::{Guard, Statements};

impl_execute!(Sqlite, SqliteRow, i64, from_ms);

/// Now, as milliseconds since the Unix epoch (how Sluice's time columns hold time).
pub(super) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// Milliseconds since the epoch as a time (the epoch itself for values out of range).
fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// A claimed row with its place in claim order (`RETURNING` gives rows in no set order).
struct Claimed {
    order: (i64, OutboxId),
    row: Result<OutboxRow, RowFailure>,
}

/// Decodes a claimed row ([`decode_claimed`]) and its place in claim order.
fn decode_row(row: &SqliteRow, sql: &LayoutSql) -> Result<Claimed, StoreError> {
    let decoded = decode_claimed(row, sql)?;
    let claim_order = column::after_extra(sql);
    let order = row
        .int(claim_order)
        .and_then(|order| {
            order.ok_or_else(|| sqlx::Error::ColumnDecode {
                index: claim_order.to_string(),
                source: "the order column is NULL".into(),
            })
        })
        .map_err(|e| unreadable_key(sql, e))?;
    let id = match &decoded {
        Ok(row) => row.id.clone(),
        Err(failure) => failure.id.clone(),
    };
    Ok(Claimed {
        order: (order, id),
        row: decoded,
    })
}

/// How long a statement waits for another connection's write transaction (the application's
/// or another relay's) before failing with "database is locked".
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for a connection from the pool.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
/// Starts a write transaction at once (taking the write lock, waiting up to the busy
/// timeout), so it never fails half-way on a lock upgrade.
const BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

/// Connection options from a URL: WAL, the busy timeout, `synchronous = NORMAL` (in WAL mode
/// a power cut can lose the last commits but not corrupt the file; a lost mark means a row is
/// published again, never lost). `create`: create the file if missing (`sluice migrate`).
fn connect_options(url: &str, create: bool) -> Result<SqliteConnectOptions, StoreError> {
    if url.contains(":memory:") || url.contains("mode=memory") {
        return Err(StoreError::Url {
            url: url.to_owned(),
            message: "an in-memory SQLite database lives and dies with one process; give a \
                      file: sqlite:///absolute/path.db or sqlite://relative/path.db"
                .into(),
        });
    }
    let options: SqliteConnectOptions = url.parse().map_err(|e| StoreError::connect(url, e))?;
    Ok(options
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(BUSY_TIMEOUT)
        .create_if_missing(create))
}

async fn connect(url: &str, connections: u32, create: bool) -> Result<SqlitePool, StoreError> {
    let pool = SqlitePoolOptions::new().acquire_timeout(ACQUIRE_TIMEOUT);
    connect::connect(url, Ok(connect_options(url, create)?), pool, connections).await
}

/// Creates the database file if missing, creates or upgrades the table (see
/// [`migrate::migrate`]) and returns a one-line description of what Sluice will relay from.
pub(super) async fn migrate(
    url: &str,
    spec: &TableSpec,
    options: &StoreOptions,
) -> Result<String, StoreError> {
    let pool = connect(url, 1, true).await?;
    let mut tx = pool.begin_with(BEGIN_WRITE).await?;
    // Refused: `tx` is dropped, which rolls everything back.
    let layout = migrate::migrate(&mut tx, spec, options.fair_share.is_some()).await?;
    tx.commit().await?;
    pool.close().await;
    Ok(layout.summary())
}

/// The SQLite store.
pub struct LiteStore {
    pool: SqlitePool,
    statements: Arc<Statements>,
    lease: Duration,
    /// What every lease token of this store starts with: tells its leases from other
    /// processes'.
    process: String,
    batches: AtomicU64,
    /// `relay.fair_share`: where the next walk over the tenants starts.
    turn: TenantTurn,
}

impl LiteStore {
    /// Opens the database file (it must exist: `sluice migrate` creates it), checks the
    /// table and prepares the statements.
    pub async fn open(
        url: &str,
        spec: &TableSpec,
        options: StoreOptions,
        connections: u32,
    ) -> Result<Self, StoreError> {
        let pool = connect(url, connections, false).await?;
        let found = schema::read_columns(&mut *pool.acquire().await?, &spec.name).await?;
        let layout = check::<schema::LiteTypes>(spec, &found)?;
        if options.fair_share.is_some() {
            schema::check_tenant_index(&pool, &layout).await?;
        }
        tracing::info!(table = %layout.table, layout = %layout.summary(), lease = ?options.lease,
            "outbox table checked");
        let statements = Statements::new(LayoutSql::new(layout, Driver::Sqlite), options);
        Ok(Self {
            pool,
            statements: Arc::new(statements),
            lease: options.lease,
            process: format!("{:x}-{:016x}:", std::process::id(), fastrand::u64(..)),
            batches: AtomicU64::new(0),
            turn: TenantTurn::default(),
        })
    }

    fn next_token(&self) -> String {
        let n = self.batches.fetch_add(1, Ordering::Relaxed);
        format!("{}{n}", self.process)
    }

    fn paused_json(paused: &[TenantId]) -> String {
        // `null` stands for rows without a tenant.
        let names: Vec<Option<&str>> = paused.iter().map(TenantId::name).collect();
        serde_json::to_string(&names).unwrap_or_else(|_| "[]".to_owned())
    }
}

impl StoreDriver for LiteStore {
    type Db = Sqlite;
    type Batch = LiteBatch;

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn sql(&self) -> &LayoutSql {
        &self.statements.sql
    }

    async fn has_due(&self, paused: &[TenantId]) -> Result<bool, StoreError> {
        let due: i64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.statements.due)))
            .bind(now_ms())
            .bind(Self::paused_json(paused))
            .fetch_one(&self.pool)
            .await?;
        Ok(due != 0)
    }

    async fn claim(
        &self,
        limit: usize,
        paused: &[TenantId],
    ) -> Result<Claim<LiteBatch>, StoreError> {
        let token = self.next_token();
        let now = now_ms();
        let s = &self.statements;
        // Serialised once: with `relay.fair_share` two statements bind it.
        let paused_json = Self::paused_json(paused);
        let lease = |sql: &Arc<str>, limit: usize| {
            sqlx::query(AssertSqlSafe(Arc::clone(sql)))
                .bind(token.clone())
                .bind(now.saturating_add(millis(self.lease)))
                .bind(now)
                .bind(paused_json.clone())
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        };
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        // `relay.fair_share`: the heads first. The claim that fills up after them passes over
        // them as leased.
        let mut raw = match &s.fair {
            Some(walk) => {
                let names: Vec<Option<&str>> = paused.iter().map(TenantId::name).collect();
                let ids =
                    pick_heads::<Sqlite>(&mut tx, walk, &s.sql, &self.turn, &names, limit).await?;
                // Ids are numbers or strings: nothing here fails to serialise.
                let ids = serde_json::to_string(&ids).unwrap_or_else(|_| "[]".to_owned());
                match ids.as_str() {
                    "[]" => Vec::new(),
                    _ => {
                        lease(&s.claim_heads, limit)
                            .bind(ids)
                            .fetch_all(&mut *tx)
                            .await?
                    }
                }
            }
            None => Vec::new(),
        };
        let room = limit - raw.len().min(limit);
        if room > 0 {
            let filled = lease(&s.claim, room).fetch_all(&mut *tx).await?;
            if let Some(walk) = &s.fair {
                let tenants = filled
                    .iter()
                    .filter_map(|row| row.text(column::TENANT).ok());
                self.turn.filled(tenants, walk.share);
            }
            raw.extend(filled);
        } else if let Some(walk) = &s.fair {
            self.turn.filled([], walk.share);
        }
        tx.commit().await?;
        let mut claimed = raw
            .iter()
            .map(|row| decode_row(row, &self.statements.sql))
            .collect::<Result<Vec<_>, _>>()?;
        claimed.sort_by(|a, b| a.order.cmp(&b.order));
        let batch = LiteBatch {
            pool: self.pool.clone(),
            statements: Arc::clone(&self.statements),
            token,
            claimed: claimed.iter().map(|c| c.order.1.clone()).collect(),
        };
        Claim::of(batch, claimed.into_iter().map(|c| Ok(c.row)))
    }

    async fn settle(&self, outcome: &BatchOutcome) -> Result<Settlement, StoreError> {
        // Rows still leased by this process (any of its batches), by nobody, or by an expired
        // lease may be recorded; rows another relay leases are skipped.
        let now = now_ms();
        let prefix = &self.process;
        let held = |statement: &mut Statement| {
            let now = statement.param(Param::Int(now));
            let prefix = statement.param(Param::Text(prefix.clone()));
            format!(
                "AND (o.leased_by IS NULL OR o.lease_until <= {now}
                      OR substr(o.leased_by, 1, length({prefix})) = {prefix})"
            )
        };
        let recorder = batch::Recorder {
            statements: &self.statements,
            now,
            guard: Guard::Unsent,
        };
        let tx = self.pool.begin_with(BEGIN_WRITE).await?;
        settle::settle(tx, &self.statements.sql, outcome, held, &recorder).await
    }

    async fn prune_sent(&self, retention: Duration) -> Result<u64, StoreError> {
        // Each chunk is its own short write transaction: writers wait for one chunk at most.
        let mut conn = self.pool.acquire().await?;
        let sql = &self.statements.sql;
        Ok(prune::prune::<Sqlite>(&mut conn, sql, retention, |_| String::new()).await?)
    }
}
