//! The PostgreSQL driver: [`PgStore`] implements [`StoreDriver`] over a connection pool.
//!
//! - [`schema`]: reading the catalog and checking every column (the [`Layout`])
//! - [`mod@migrate`]: creating or upgrading the table and its indexes
//! - [`sql`]: the relay's statements (claim, due probe, mark, reschedule) and the claimed
//!   batch's transaction
//! - [`fair`]: `relay.fair_share`'s walk over the tenants (its statements, and running them)
//! - [`paused`]: the paused tenants' filter, shared by the claim and the walk
//! - [`cursor`]: where the next claim starts while a backlog drains
//! - [`listen`]: LISTEN/NOTIFY wake-ups

mod cursor;
mod fair;
mod listen;
mod migrate;
mod partitions;
mod paused;
mod schema;
mod sql;
mod time;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::Postgres;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Row};

use crate::store::batch::TxBatch;
pub use listen::{DEFAULT_CHANNEL, validate_channel};
use schema::Layout;
pub(super) use sql::PgBatch;
use sql::PgRows;

use super::connect::{self, CONNECT_TIMEOUT};
use super::dialect::Driver;
use super::driver::StoreDriver;
use super::fair::TenantTurn;
use super::statement::{Param, Statement};
use super::{BatchOutcome, Claim, Settlement, StoreError, StoreOptions, TableSpec};
use super::{PartitionInterval, PartitionRound, Partitioning};
use super::{prune, settle};
use crate::model::{OutboxId, TenantId};
use crate::store::layout_sql::LayoutSql;
use crate::store::rows::{column, decode_claimed, read_id, unreadable_key};
use crate::store::statement::impl_execute;
use cursor::ClaimCursor;
use sql::Statements;

impl_execute!(Postgres, PgRow, time::PgTime, time::PgTime::utc);

/// `application_name` of Sluice's connections (visible in `pg_stat_activity`).
pub(super) const APPLICATION_NAME: &str = "sluice";
/// Advisory-lock key (with the table's oid): one pruner per table at a time.
const PRUNE_LOCK_KEY: i32 = 0x736c_7570; // "slup"

/// How a claim's transaction begins (one round trip, as a plain `BEGIN`). The claim takes rows
/// in the order of the claim-order index, so the planner's only sane plan is to read that
/// index up to `LIMIT`; yet it compares costs from its row estimates, and right after a bulk
/// load (no statistics yet, or statistics from before the load, as in `published_at` mode)
/// it expects a handful of unsent rows, and chose to fetch every unsent row through a bitmap
/// scan and sort them: 0.8 s instead of 0.5 ms per claim from the start of the order with
/// 1,000,000 rows waiting, until autovacuum's ANALYZE ran. `enable_sort = off` makes any plan
/// that sorts the backlog the most expensive one, whatever the estimates; `LOCAL` ends with
/// the transaction (so it also holds through PgBouncer in transaction mode). The batch's other
/// statements (mark, reschedule) sort nothing either way.
pub(super) const CLAIM_BEGIN: &str = "BEGIN; SET LOCAL enable_sort = off";

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
pub(super) async fn migrate(
    url: &str,
    spec: &TableSpec,
    options: &StoreOptions,
    partitioned: Option<PartitionInterval>,
) -> Result<String, StoreError> {
    let pool = connect(url, 1).await?;
    let fair = options.fair_share.is_some();
    let layout = migrate::migrate(&pool, spec, fair, partitioned).await?;
    Ok(layout.summary())
}

/// The PostgreSQL store.
pub struct PgStore {
    pool: PgPool,
    /// The options LISTEN connections are opened with (replaced with the pool's on
    /// [`PgStore::use_url`]).
    options: RwLock<PgConnectOptions>,
    sql: LayoutSql,
    // Built once from checked identifiers (see `TableName`, `ColumnName`), hence
    // `AssertSqlSafe`.
    statements: Statements,
    cursor: ClaimCursor,
    turn: TenantTurn,
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
        if options.fair_share.is_some() {
            fair::check_table(&pool, &layout).await?;
        }
        let sql = LayoutSql::new(layout, Driver::Postgres);
        let statements = Statements::new(&sql, options);
        Ok(Self {
            pool,
            options: RwLock::new(connect_options(url)?),
            sql,
            statements,
            cursor: ClaimCursor::default(),
            turn: TenantTurn::default(),
        })
    }

    /// The checked table this store relays from.
    pub fn layout(&self) -> &Layout {
        &self.sql.layout
    }

    /// How the table is partitioned; `None` when it is not.
    pub async fn partitioning(&self) -> Result<Option<Partitioning>, StoreError> {
        let layout = &self.sql.layout;
        partitions::read(&self.pool, &layout.table, layout.created_at.as_str()).await
    }

    /// One round of partition maintenance: the partitions ahead when `sluice migrate
    /// --partitioned` set the table up, then — with `drop_after` (`relay.retention_mode =
    /// "drop-partitions"`) — the partitions wholly older than it whose rows were all sent
    /// before it, detached and dropped ([`partitions::drop_old`]).
    pub async fn maintain_partitions(
        &self,
        drop_after: Option<Duration>,
    ) -> Result<PartitionRound, StoreError> {
        let mut round = PartitionRound::default();
        let Some(partitioning) = self.partitioning().await? else {
            return Ok(round);
        };
        if let Some(interval) = partitioning.interval {
            let mut conn = self.pool.acquire().await?;
            round.created = partitions::premake(&mut conn, &self.sql, interval, Utc::now()).await?;
        }
        if let Some(retention) = drop_after {
            if !partitioning.by_created_at {
                return Err(not_by_created_at(&self.sql));
            }
            partitions::drop_old(&self.pool, &self.sql, retention, PRUNE_LOCK_KEY, &mut round)
                .await?;
        }
        Ok(round)
    }

    /// Refuses `relay.retention_mode = "drop-partitions"` on a table it cannot serve: one not
    /// partitioned by `RANGE` on `created_at` alone.
    pub async fn check_drop_partitions(&self) -> Result<(), StoreError> {
        match self.partitioning().await? {
            Some(p) if p.by_created_at => Ok(()),
            _ => Err(not_by_created_at(&self.sql)),
        }
    }

    /// Opens new connections with `url` from now on (see [`connect::use_options`]), LISTEN's
    /// too.
    pub async fn use_url(&self, url: &str) -> Result<(), StoreError> {
        if let Ok(options) = connect_options(url) {
            *self.options.write().unwrap_or_else(PoisonError::into_inner) = options;
        }
        connect::use_options(&self.pool, url, connect_options(url)).await
    }
}

impl StoreDriver for PgStore {
    type Db = Postgres;
    type Batch = PgBatch;

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn sql(&self) -> &LayoutSql {
        &self.sql
    }

    async fn has_due(&self, paused: &[TenantId]) -> Result<bool, StoreError> {
        let paused: Vec<Option<&str>> = paused.iter().map(TenantId::name).collect();
        let due = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.statements.due)));
        Ok(due.bind(&paused).fetch_one(&self.pool).await?)
    }

    async fn claim(&self, limit: usize, paused: &[TenantId]) -> Result<Claim<PgBatch>, StoreError> {
        let mut tx = self.pool.begin_with(CLAIM_BEGIN).await?;
        let paused: Vec<Option<&str>> = paused.iter().map(TenantId::name).collect();
        let s = &self.statements;
        let (heads, head_ids) = match &s.fair {
            Some(fair) => {
                let heads = fair::claim_heads(&mut tx, fair, &self.turn, &paused, limit).await?;
                let ids = heads
                    .iter()
                    .map(|row| read_id(row, &self.sql.layout.key, column::ID))
                    .map(|id| id.map(|id| id.to_string()))
                    .collect::<Result<Vec<String>, _>>()
                    .map_err(|e| unreadable_key(&self.sql, e))?;
                (heads, Some(ids))
            }
            None => (Vec::new(), None),
        };
        let room = limit - heads.len().min(limit);
        // The claim in claim order (with `relay.fair_share`: past the heads, up to the room
        // they left), from the cursor when there is one.
        let (claim_sql, claim_after) = match &s.fair {
            Some(fair) => (&fair.fill, fair.fill_after.as_ref()),
            None => (&s.claim, s.claim_after.as_ref()),
        };
        let after = match claim_after {
            Some(sql) if room > 0 => self.cursor.start(Instant::now()).map(|id| (sql, id)),
            _ => None,
        };
        let filled = if room > 0 {
            let text = after.map_or(claim_sql, |(sql, _)| sql);
            let mut query = sqlx::query(AssertSqlSafe(Arc::clone(text)))
                .bind(&paused)
                .bind(i64::try_from(room).unwrap_or(i64::MAX));
            if let Some(ids) = &head_ids {
                query = query.bind(ids);
            }
            if let Some((_, id)) = after {
                query = query.bind(id);
            }
            query.fetch_all(&mut *tx).await?
        } else {
            Vec::new()
        };
        if claim_after.is_some() && room > 0 {
            // Only the fill moves the cursor: heads lie anywhere in claim order.
            let highest = filled
                .iter()
                .filter_map(|row| read_id(row, &self.sql.layout.key, column::ID).ok())
                .filter_map(|id| match id {
                    OutboxId::Int(id) => Some(id),
                    OutboxId::Text(_) => None,
                })
                .max();
            let started = after.map(|(_, id)| id);
            self.cursor.claimed(started, filled.len(), room, highest);
        }
        if let Some(fair) = &s.fair {
            let tenants = filled
                .iter()
                .filter_map(|row| row.try_get(column::TENANT).ok());
            self.turn.filled(tenants, fair.share);
        }
        let mut rows = PgRows {
            sql: Arc::clone(&s.batch),
            created: HashMap::new(),
        };
        let claimed = heads.iter().chain(&filled);
        if self.sql.layout.keyed_with_created_at {
            let claimed = keyed_rows(&self.sql, claimed, &mut rows.created)?;
            let batch = TxBatch::new(tx, Arc::new(rows));
            return Claim::of(batch, claimed.map(|row| decode_claimed(row, &self.sql)));
        }
        let batch = TxBatch::new(tx, Arc::new(rows));
        Claim::of(batch, claimed.map(|row| decode_claimed(row, &self.sql)))
    }

    async fn settle(&self, outcome: &BatchOutcome) -> Result<Settlement, StoreError> {
        let tx = self.pool.begin().await?;
        // The claim's `created_at`s are gone: a table keyed with it is settled by id alone
        // (among the rows still pending and not locked by another relay).
        let rows = PgRows {
            sql: Arc::clone(&self.statements.batch),
            created: HashMap::new(),
        };
        settle::settle(
            tx,
            &self.sql,
            outcome,
            |_| settle::SKIP_LOCKED.into(),
            &rows,
        )
        .await
    }

    async fn prune_sent(&self, retention: Duration) -> Result<u64, StoreError> {
        // Each chunk takes an advisory lock on the table's oid, or deletes nothing.
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
            .unwrap_or_else(PoisonError::into_inner)
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

/// `relay.retention_mode = "drop-partitions"` on a table that is not partitioned by
/// `created_at`.
fn not_by_created_at(sql: &LayoutSql) -> StoreError {
    StoreError::Partitions {
        table: sql.layout.table.to_string(),
        message: format!(
            "relay.retention_mode = \"drop-partitions\" needs a table partitioned by RANGE \
             ({}) alone (see docs/operations.md, \"Partitioned outbox tables\"); use \
             retention_mode = \"delete\" for this table",
            sql.layout.created_at
        ),
    }
}

/// The claimed rows of a table whose id is unique only with `created_at`, each id's time
/// filed in `created` for marking by both. Ids are unique through a sequence as long as the
/// application lets the sequence number its rows, but nothing in the table enforces that
/// across partitions: a row whose id an earlier row of the batch already has is left out of
/// the batch — still locked, untouched, and claimed again by a later batch — so an id names
/// one row of the batch, as the relay's outcome needs.
fn keyed_rows<'r>(
    sql: &LayoutSql,
    claimed: impl Iterator<Item = &'r PgRow>,
    created: &mut HashMap<OutboxId, DateTime<Utc>>,
) -> Result<std::vec::IntoIter<&'r PgRow>, StoreError> {
    let mut kept = Vec::new();
    for row in claimed {
        let id = read_id(row, &sql.layout.key, column::ID).map_err(|e| unreadable_key(sql, e))?;
        let at = row.try_get::<time::PgTime, _>(column::CREATED_AT)?.utc();
        if let std::collections::hash_map::Entry::Vacant(entry) = created.entry(id) {
            entry.insert(at);
            kept.push(row);
        }
    }
    Ok(kept.into_iter())
}

#[cfg(test)]
mod claim_plan_tests;
#[cfg(test)]
mod partition_tests;
#[cfg(test)]
mod startup_tests;
