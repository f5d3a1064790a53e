//! The store seam: every SQL statement Sluice issues goes through [`OutboxStore`].
//!
//! The relay claims a [`ClaimedBatch`] and hands it back with a [`BatchOutcome`]. On
//! PostgreSQL and MySQL a batch owns an open transaction whose row locks keep other relays off
//! its rows until [`ClaimedBatch::complete`] commits (or the batch is dropped, which rolls
//! back); on SQLite the claim is a committed lease and completing changes only rows still
//! leased to the batch. The same trait serves the maintenance services (pruning, LISTEN
//! wake-ups) and the admin commands (`sluice dead …`), so callers never know which database
//! they talk to.
//!
//! [`open()`] and [`migrate()`] pick the driver from the URL ([`Driver`]): `postgres://` →
//! `postgres`, `mysql://` → `mysql`, `sqlite://` → `sqlite`. What a table must hold is
//! checked once for all of them (`schema`); the conformance suite (`conformance`, a unit test)
//! runs the same tests against each, and against the in-memory store of the tests (`memory`).
//!
//! One SQL dialect under three drivers: `dialect` names the databases ([`Driver`]) and spells
//! what they spell differently (quoting, casts, null-safe equality, time arithmetic),
//! `layout_sql` is the checked table as SQL of one dialect, and the statements that do not
//! differ are built once from the two and run on any driver's pool (`statement`): dead rows
//! (`dead`), the backlog (`backlog`), decoding claimed rows (`rows`), recording a batch
//! (`batch`), settling (`settle`), pruning and other chunked deletes (`prune`), and
//! `sluice migrate`'s tables, columns and indexes (`ddl`). Each driver (`postgres`, `mysql`,
//! `sqlite`) implements `driver::StoreDriver` with only what its database does its own way:
//! session setup, the claim, its column types and migration locks, LISTEN/NOTIFY, the cursor,
//! the lease.

mod backlog;
mod batch;
mod columns;
#[cfg(test)]
mod conformance;
mod connect;
mod ddl;
mod dead;
mod dialect;
mod driver;
mod fair;
mod layout_sql;
#[cfg(test)]
pub(crate) mod memory;
mod mysql;
mod open;
mod partitioning;
mod postgres;
mod privileges;
mod prune;
mod replay;
mod rows;
mod schema;
mod settings;
mod settle;
mod sqlite;
mod statement;
mod table;
mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

pub use columns::{
    ColumnMap, ColumnName, ColumnNameError, ColumnsSettings, DEFAULT_ORDER_COLUMN,
    ExtraColumnNames, TableSpec, TenantColumn,
};
pub use dialect::Driver;
pub use open::{Store, StoreBatch, check_url, migrate, open, redact};
pub use partitioning::{PartitionInterval, PartitionRound, Partitioning};
pub use postgres::{DEFAULT_CHANNEL, validate_channel};
pub use privileges::{MissingPrivilege, Need, Privilege, relay_needs, replay_needs};
pub use replay::{ReplayFilter, ReplayPace, ReplayProgress};
pub use schema::SchemaError;
pub use settings::{
    AfterDead, DATABASE_URL_ENV, DEFAULT_LEASE, DatabaseSettings, LEASE_MARGIN, MarkMode, Ordering,
    StoreOptions,
};
pub use table::{TableName, TableNameError};

use crate::model::{OutboxId, OutboxRow, TenantId};

/// What happens to a row after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Disposition {
    /// Due again this long after the commit.
    Retry(Duration),
    /// No more attempts: `dead_at` is set and the row is no longer claimed.
    Dead,
    /// Due again this long after the commit, without counting an attempt: the failure was the
    /// broker's, not the row's.
    Wait(Duration),
}

/// A row that could not be delivered this time, why, and what happens to it next.
#[derive(Debug, Clone, PartialEq)]
pub struct RowFailure {
    /// The row that failed.
    pub id: OutboxId,
    /// Why it failed; recorded as the row's `last_error`.
    pub error: String,
    /// Whether the row is retried, waits, or goes dead.
    pub disposition: Disposition,
}

/// What happened to a claimed batch, as the relay hands it back to the store.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    /// Rows whose every message was acknowledged (or that produced none): mark them sent.
    pub sent: Vec<OutboxId>,
    /// Rows to reschedule or dead-letter, with the error recorded.
    pub failed: Vec<RowFailure>,
}

impl BatchOutcome {
    /// Every row of the outcome: sent, then failed.
    pub(crate) fn ids(&self) -> impl Iterator<Item = &OutboxId> {
        self.sent.iter().chain(self.failed.iter().map(|f| &f.id))
    }
}

/// Errors of the outbox store. Callers branch on them: a [`StoreError::MarkMismatch`] means the
/// batch was rolled back and will be re-claimed (and re-published) later.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A statement failed (or the pool could not give a connection).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The database could not be reached at start-up (the URL is shown without its password).
    #[error("cannot connect to the database at {url}: {source}{}", tls::hint(.source))]
    Connect {
        /// The URL, password redacted.
        url: String,
        /// The driver's connection error.
        source: sqlx::Error,
    },
    /// The URL names no database Sluice can relay from.
    #[error("database url {url}: {message}")]
    Url {
        /// The URL, password redacted.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// Completing a batch changed a different number of rows than it holds: another process
    /// changed the claimed rows, so the batch was rolled back.
    #[error(
        "marking rows affected {affected} rows, expected {expected}; batch rolled back \
         (another process changed the claimed rows)"
    )]
    MarkMismatch {
        /// Rows the statement should have changed.
        expected: u64,
        /// Rows it did change.
        affected: u64,
    },
    /// The table lacks a column Sluice needs, or has one of a type it cannot use.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// A claimed row's id could not be read, so the row cannot be named (the schema check
    /// rules this out unless the table changes under a running relay).
    #[error(
        "outbox table {table}: a claimed row's id column {column} could not be read: {message}"
    )]
    Key {
        /// The outbox table.
        table: String,
        /// The id column.
        column: String,
        /// The decoding error.
        message: String,
    },
    /// An id given by a person (`sluice dead replay --id`) is not one of this table's ids.
    #[error("{id:?} is not an id of outbox table {table} ({expected})")]
    InvalidId {
        /// The outbox table.
        table: String,
        /// The id as given.
        id: String,
        /// What the table's ids look like (e.g. "an integer").
        expected: &'static str,
    },
    /// A LISTEN/NOTIFY channel name that cannot be used.
    #[error("{0}")]
    Channel(String),
    /// The database server is too old for what Sluice needs.
    #[error(
        "database server {found} is too old: Sluice needs {needed} or later (FOR UPDATE SKIP LOCKED)"
    )]
    ServerVersion {
        /// The version string the server reports.
        found: String,
        /// The oldest supported server (e.g. "MySQL 8.0").
        needed: &'static str,
    },
    /// The database user lacks a privilege the relay needs on the outbox table
    /// ([`Store::check_privileges`]). Boxed: the other variants stay small.
    #[error(transparent)]
    Privilege(Box<MissingPrivilege>),
    /// `relay.fair_share` cannot take turns between this table's tenants.
    #[error("relay.fair_share: outbox table {table} {message}")]
    FairShare {
        /// The outbox table.
        table: String,
        /// What is missing, and how to add it.
        message: String,
    },
    /// The table's partitioning does not allow what was asked (`sluice migrate --partitioned`,
    /// `relay.retention_mode = "drop-partitions"`).
    #[error("outbox table {table}: {message}")]
    Partitions {
        /// The outbox table.
        table: String,
        /// What is wrong, and what to do.
        message: String,
    },
    /// `sluice replay` cannot run on this table (e.g. it lacks the replay marker column).
    #[error("{0}")]
    Replay(String),
    /// Something this database cannot do (e.g. LISTEN/NOTIFY on MySQL or SQLite).
    #[error("{database} does not support {what}")]
    Unsupported {
        /// The database kind (e.g. "MySQL").
        database: &'static str,
        /// The missing feature, with what to do instead.
        what: &'static str,
    },
}

/// SQLite's primary result codes for a database another connection is using.
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;

impl StoreError {
    /// For databases without LISTEN/NOTIFY: relays there poll.
    pub(crate) fn unsupported_notify(database: &'static str) -> Self {
        Self::Unsupported {
            database,
            what: "LISTEN/NOTIFY wake-ups (relays poll; leave relay.notify_channel unset)",
        }
    }

    /// Whether the error is the connection's, not the statement's or the table's: the
    /// database restarting, a terminated backend, a network failure. Trying again may work.
    pub fn is_transient(&self) -> bool {
        let sql = match self {
            Self::Database(e) | Self::Connect { source: e, .. } => e,
            _ => return false,
        };
        match sql {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            // SQLite: the database is busy (another writer held it past the busy timeout) or
            // locked.
            sqlx::Error::Database(db)
                if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() =>
            {
                db.code()
                    .and_then(|code| code.parse::<i32>().ok())
                    .is_some_and(|code| matches!(code & 0xff, SQLITE_BUSY | SQLITE_LOCKED))
            }
            // SQLSTATE classes 08 (connection exception) and 57 (operator intervention:
            // admin shutdown, terminated backend, database starting up); MySQL reports a
            // lost connection or a server shutting down as 08S01.
            sqlx::Error::Database(db) => db
                .code()
                .is_some_and(|code| code.starts_with("08") || code.starts_with("57")),
            _ => false,
        }
    }
}

/// Where outbox rows come from, and everything else Sluice asks of the database.
/// Implementations: the drivers behind [`Store`].
pub trait OutboxStore: Send + Sync + 'static {
    /// The handle of a claimed batch: its open transaction (SQLite: its lease).
    type Batch: ClaimedBatch;

    // --- the relay loop ---

    /// Whether any row is due (as [`OutboxStore::claim`] would see it, ignoring locks), in
    /// one cheap statement without a transaction: what an idle relay asks before claiming.
    fn has_due(&self, paused: &[TenantId])
    -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Claims up to `limit` unsent, due rows, oldest first, skipping rows locked by others and
    /// rows of the `paused` tenants. The returned batch holds the transaction open (SQLite:
    /// the rows are leased to the batch, and rows under another batch's lease are skipped).
    fn claim(
        &self,
        limit: usize,
        paused: &[TenantId],
    ) -> impl Future<Output = Result<Claim<Self::Batch>, StoreError>> + Send;

    /// Records `outcome` in a fresh transaction after [`ClaimedBatch::complete`] failed (its
    /// transaction rolled back, but the batch's messages may already be published): re-locks
    /// exactly the rows of `outcome` that are still unsent, skipping rows locked by another
    /// relay (`FOR UPDATE SKIP LOCKED`; SQLite: rows under another process's unexpired lease),
    /// marks or reschedules each row it got, and commits.
    /// A row the database refuses to change (a trigger raising, a constraint) is reported in
    /// [`Settlement::refused`] and does not keep the other rows from being recorded.
    fn settle(
        &self,
        outcome: &BatchOutcome,
    ) -> impl Future<Output = Result<Settlement, StoreError>> + Send;

    // --- observation ---

    /// Unsent rows by state: what `sluice drain` has to do, and what it left.
    fn backlog(&self) -> impl Future<Output = Result<Backlog, StoreError>> + Send;

    /// Per tenant: rows due now, the age of the oldest due row, waiting and dead rows — in one
    /// statement that reads at most `limit` unsent rows in claim order (through the claim's
    /// partial index) and at most `limit` dead ones, so its cost does not grow with the
    /// backlog. Counts saturate: all tenants' due and waiting rows together, or their dead rows
    /// together, reaching `limit` means "at least". What the metrics sampler reads.
    fn sample_backlog(
        &self,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<TenantBacklog>, StoreError>> + Send;

    // --- maintenance ---

    /// Deletes sent rows (`mark = "published_at"`) older than `retention`, in bounded chunks,
    /// unless another process is pruning the same table; returns how many it deleted.
    fn prune_sent(
        &self,
        retention: Duration,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Listens for notifications on `channel` and calls `wake` for each one (and once when
    /// listening starts or resumes, since notifications sent meanwhile were missed). Returns
    /// only with an error; the caller reconnects.
    fn listen(
        &self,
        channel: &str,
        wake: &(dyn Fn() + Send + Sync),
    ) -> impl Future<Output = Result<Infallible, StoreError>> + Send;

    /// Installs (or replaces) the trigger that notifies `channel` on every inserting
    /// statement (`sluice migrate --notify-trigger`).
    fn install_notify_trigger(
        &self,
        channel: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Removes the trigger installed by [`OutboxStore::install_notify_trigger`], if present.
    fn drop_notify_trigger(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    // --- dead rows (`sluice dead …`) ---

    /// Dead rows in claim order, optionally of one tenant (`default` matches rows without a
    /// tenant), at most `limit`.
    fn dead_rows(
        &self,
        tenant: Option<&str>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<DeadRow>, StoreError>> + Send;

    /// Makes the selected dead rows due again with a fresh attempt count; returns how many.
    fn replay_dead(
        &self,
        selection: &ReplaySelection,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes dead rows that died more than `older_than` ago (optionally of one tenant), in
    /// bounded chunks; returns how many.
    fn purge_dead(
        &self,
        older_than: Duration,
        tenant: Option<&str>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// What [`OutboxStore::settle`] recorded.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Settlement {
    /// Rows marked sent.
    pub marked: Vec<OutboxId>,
    /// Rows rescheduled or dead-lettered.
    pub rescheduled: Vec<OutboxId>,
    /// Rows not touched: locked by another relay, or no longer unsent.
    pub skipped: Vec<OutboxId>,
    /// Rows the database refused to change, with its error.
    pub refused: Vec<(OutboxId, String)>,
}

/// The result of a claim: the rows, and the batch handle that holds their locks.
pub struct Claim<B> {
    /// Holds the claimed rows' locks (SQLite: lease) until completed or abandoned.
    pub batch: B,
    /// Rows decoded successfully, in claim order.
    pub rows: Vec<OutboxRow>,
    /// Rows whose columns could not be decoded (e.g. malformed `headers`); they are
    /// dead-lettered (retrying cannot help until someone fixes the row), never published.
    pub rejected: Vec<RowFailure>,
}

impl<B> Claim<B> {
    /// The same claim with its batch wrapped (a driver's batch into the store's).
    pub(crate) fn map<C>(self, wrap: impl FnOnce(B) -> C) -> Claim<C> {
        Claim {
            batch: wrap(self.batch),
            rows: self.rows,
            rejected: self.rejected,
        }
    }

    /// The claim of `batch` whose rows decoded as `decoded` ([`rows::decode_claimed`]), in
    /// claim order.
    pub(crate) fn of(
        batch: B,
        decoded: impl IntoIterator<Item = Result<Result<OutboxRow, RowFailure>, StoreError>>,
    ) -> Result<Self, StoreError> {
        let decoded = decoded.into_iter();
        let mut rows = Vec::with_capacity(decoded.size_hint().0);
        let mut rejected = Vec::new();
        for row in decoded {
            match row? {
                Ok(row) => rows.push(row),
                Err(failure) => rejected.push(failure),
            }
        }
        Ok(Self {
            batch,
            rows,
            rejected,
        })
    }

    /// Rows claimed, decoded or not.
    pub fn len(&self) -> usize {
        self.rows.len() + self.rejected.len()
    }

    /// Whether no row was claimed, decoded or not.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The open transaction that locks a claimed set of rows (SQLite: the lease on them).
pub trait ClaimedBatch: Send {
    /// Marks `outcome.sent`, reschedules or dead-letters `outcome.failed`, checks the
    /// affected-row counts and commits. On a count mismatch it rolls back and returns
    /// [`StoreError::MarkMismatch`].
    fn complete(self, outcome: BatchOutcome)
    -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rolls back (SQLite: ends the leases): every row becomes claimable again, unchanged.
    fn abandon(self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Unsent rows of the outbox, by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Claimable now (not counting locks and paused tenants).
    pub due: i64,
    /// Waiting for a retry (`next_attempt_at` in the future).
    pub waiting: i64,
    /// Dead-lettered (`dead_at` set), awaiting `sluice dead replay` or `purge`.
    pub dead: i64,
}

/// One tenant's unsent rows, as [`OutboxStore::sample_backlog`] saw them.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantBacklog {
    /// The tenant column's value (`None`: rows without a tenant).
    pub tenant: Option<String>,
    /// Rows due now (not counting locks and paused tenants).
    pub due: i64,
    /// Age of the oldest due row by the database's clock (`None`: no row is due).
    pub oldest_due_age: Option<Duration>,
    /// Dead-lettered rows (`dead_at` set, never sent).
    pub dead: i64,
    /// Rows waiting for a retry: with `due`, the unsent rows the sample read, which tells
    /// whether it reached its limit.
    pub waiting: i64,
}

/// A dead-lettered row, as `sluice dead list` shows it.
#[derive(Debug, Clone)]
pub struct DeadRow {
    /// The row's id.
    pub id: OutboxId,
    /// The tenant column's value (`None`: no tenant column, or NULL in it).
    pub tenant: Option<String>,
    /// The aggregate type column's value (empty if NULL).
    pub aggregate_type: String,
    /// The aggregate id column's value as text (empty if NULL).
    pub aggregate_id: String,
    /// The event type column's value (empty if NULL).
    pub event_type: String,
    /// Delivery attempts counted before it went dead.
    pub attempts: i32,
    /// When it was dead-lettered.
    pub dead_at: DateTime<Utc>,
    /// The error of its last attempt (`None`: none recorded).
    pub last_error: Option<String>,
}

/// Which dead rows to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplaySelection {
    /// One row, by its id as text (an integer or, say, a uuid: checked against the table).
    Id(String),
    /// Every dead row of one tenant, by name (`default`: rows without a tenant).
    Tenant(String),
    /// Every dead row.
    All,
}

#[cfg(test)]
mod test_layouts;
