//! Picking the driver from the database URL: [`open`] a [`Store`] for the relay and the admin
//! commands, or [`migrate`] a table. Callers hold a [`Store`] and never name a driver.

use std::convert::Infallible;
use std::time::Duration;

use super::Driver;
use super::driver::StoreDriver;
use super::mysql::{self, MyBatch, MyStore};
use super::partitioning::{PartitionInterval, PartitionRound, Partitioning};
use super::postgres::{self, PgBatch, PgStore};
use super::sqlite::{self, LiteBatch, LiteStore};
use super::{
    Backlog, BatchOutcome, Claim, ClaimedBatch, DeadRow, OutboxStore, ReplaySelection, Settlement,
    StoreError, StoreOptions, TableSpec, TenantBacklog, backlog, dead,
};
use crate::model::TenantId;

/// Connects (a pool of at most `connections`) and checks the table: every column Sluice reads
/// or writes must exist with a usable type, or the error lists every problem.
pub async fn open(
    url: &str,
    spec: &TableSpec,
    options: StoreOptions,
    connections: u32,
) -> Result<Store, StoreError> {
    let driver = Driver::of(url)?;
    super::tls::check_files(url)?;
    Ok(match driver {
        Driver::Postgres => Store::Postgres(PgStore::open(url, spec, options, connections).await?),
        Driver::Mysql => Store::Mysql(MyStore::open(url, spec, options, connections).await?),
        Driver::Sqlite => Store::Sqlite(LiteStore::open(url, spec, options, connections).await?),
    })
}

/// Creates the outbox table, or upgrades one the application created, then checks it as
/// [`open`] would (`sluice migrate`), with the indexes claims with `options` need (the tenant
/// index of `relay.fair_share`); with `partitioned` (PostgreSQL only), a new table partitioned
/// by `created_at` (`sluice migrate --partitioned`). Returns a one-line description of the
/// table.
pub async fn migrate(
    url: &str,
    spec: &TableSpec,
    options: &StoreOptions,
    partitioned: Option<PartitionInterval>,
) -> Result<String, StoreError> {
    let driver = Driver::of(url)?;
    super::tls::check_files(url)?;
    if partitioned.is_some() && driver != Driver::Postgres {
        return Err(unsupported_partitions(driver));
    }
    match driver {
        Driver::Postgres => postgres::migrate(url, spec, options, partitioned).await,
        Driver::Mysql => mysql::migrate(url, spec, options).await,
        Driver::Sqlite => sqlite::migrate(url, spec, options).await,
    }
}

/// Partitioned outbox tables on a database other than PostgreSQL.
fn unsupported_partitions(driver: Driver) -> StoreError {
    StoreError::Unsupported {
        database: driver.name(),
        what: "partitioned outbox tables (sluice migrate --partitioned, relay.retention_mode = \
               \"drop-partitions\"): PostgreSQL only; use retention_mode = \"delete\"",
    }
}

impl Store {
    /// One round of partition maintenance (PostgreSQL): partitions made ahead for a table
    /// `sluice migrate --partitioned` set up; with `drop_after`, old partitions whose rows were
    /// all sent before it dropped. Nothing for a table that is not partitioned.
    pub async fn maintain_partitions(
        &self,
        drop_after: Option<Duration>,
    ) -> Result<PartitionRound, StoreError> {
        match self {
            Self::Postgres(s) => s.maintain_partitions(drop_after).await,
            _ if drop_after.is_none() => Ok(PartitionRound::default()),
            Self::Mysql(_) => Err(unsupported_partitions(Driver::Mysql)),
            Self::Sqlite(_) => Err(unsupported_partitions(Driver::Sqlite)),
        }
    }

    /// How the table is partitioned (PostgreSQL); `None` when it is not, or on other databases.
    pub async fn partitioning(&self) -> Result<Option<Partitioning>, StoreError> {
        match self {
            Self::Postgres(s) => s.partitioning().await,
            _ => Ok(None),
        }
    }

    /// Refuses `relay.retention_mode = "drop-partitions"` where it cannot work: a table not
    /// partitioned by `RANGE` on `created_at`, or a database other than PostgreSQL.
    pub async fn check_drop_partitions(&self) -> Result<(), StoreError> {
        match self {
            Self::Postgres(s) => s.check_drop_partitions().await,
            Self::Mysql(_) => Err(unsupported_partitions(Driver::Mysql)),
            Self::Sqlite(_) => Err(unsupported_partitions(Driver::Sqlite)),
        }
    }
}

/// An open outbox store, whichever the database.
// One per process, shared behind an `Arc`: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Store {
    /// `postgres://` (or `postgresql://`).
    Postgres(PgStore),
    /// `mysql://` or `mariadb://`.
    Mysql(MyStore),
    /// `sqlite://PATH`.
    Sqlite(LiteStore),
}

impl Store {
    /// Opens new connections with `url` from now on: rotated credentials or TLS files, on
    /// SIGHUP. Connections in use and their transactions are not touched, so no claimed row
    /// is affected. The error is that of a trial connection with the new URL (it is in use
    /// all the same). SQLite has no credentials: its URL is fixed at start.
    pub async fn use_url(&self, url: &str) -> Result<(), StoreError> {
        match self {
            Store::Postgres(s) => s.use_url(url).await,
            Store::Mysql(s) => s.use_url(url).await,
            Store::Sqlite(_) => Ok(()),
        }
    }
}

/// Checks what can be checked of a URL without connecting (the certificate and key files it
/// names are readable), so a rotation to a URL that cannot work leaves the current one in use.
pub fn check_url(url: &str) -> Result<(), StoreError> {
    super::tls::check_files(url)
}

/// A claimed batch of a [`Store`].
pub enum StoreBatch {
    /// An open PostgreSQL transaction holding the rows' locks.
    Postgres(PgBatch),
    /// An open MySQL/MariaDB transaction holding the rows' locks.
    Mysql(MyBatch),
    /// A committed SQLite lease on the rows.
    Sqlite(LiteBatch),
}

/// Calls `$call` on whichever driver `$store` (a [`Store`] or a [`StoreBatch`]) holds.
macro_rules! dispatch {
    ($store:expr, $s:ident => $call:expr) => {
        match $store {
            Self::Postgres($s) => $call,
            Self::Mysql($s) => $call,
            Self::Sqlite($s) => $call,
        }
    };
}

impl ClaimedBatch for StoreBatch {
    async fn complete(self, outcome: BatchOutcome) -> Result<(), StoreError> {
        dispatch!(self, batch => batch.complete(outcome).await)
    }

    async fn abandon(self) -> Result<(), StoreError> {
        dispatch!(self, batch => batch.abandon().await)
    }
}

impl OutboxStore for Store {
    type Batch = StoreBatch;

    async fn has_due(&self, paused: &[TenantId]) -> Result<bool, StoreError> {
        dispatch!(self, s => s.has_due(paused).await)
    }

    async fn claim(
        &self,
        limit: usize,
        paused: &[TenantId],
    ) -> Result<Claim<StoreBatch>, StoreError> {
        match self {
            Self::Postgres(s) => Ok(s.claim(limit, paused).await?.map(StoreBatch::Postgres)),
            Self::Mysql(s) => Ok(s.claim(limit, paused).await?.map(StoreBatch::Mysql)),
            Self::Sqlite(s) => Ok(s.claim(limit, paused).await?.map(StoreBatch::Sqlite)),
        }
    }

    async fn settle(&self, outcome: &BatchOutcome) -> Result<Settlement, StoreError> {
        dispatch!(self, s => s.settle(outcome).await)
    }

    async fn sample_backlog(&self, limit: i64) -> Result<Vec<TenantBacklog>, StoreError> {
        dispatch!(self, s => backlog::sample(s.pool(), s.sql(), limit).await)
    }

    async fn backlog(&self) -> Result<Backlog, StoreError> {
        dispatch!(self, s => backlog::count(s.pool(), s.sql()).await)
    }

    async fn prune_sent(&self, retention: Duration) -> Result<u64, StoreError> {
        dispatch!(self, s => s.prune_sent(retention).await)
    }

    async fn listen(
        &self,
        channel: &str,
        wake: &(dyn Fn() + Send + Sync),
    ) -> Result<Infallible, StoreError> {
        dispatch!(self, s => s.listen(channel, wake).await)
    }

    async fn install_notify_trigger(&self, channel: &str) -> Result<(), StoreError> {
        dispatch!(self, s => s.install_notify_trigger(channel).await)
    }

    async fn drop_notify_trigger(&self) -> Result<(), StoreError> {
        dispatch!(self, s => s.drop_notify_trigger().await)
    }

    async fn dead_rows(
        &self,
        tenant: Option<&str>,
        limit: i64,
    ) -> Result<Vec<DeadRow>, StoreError> {
        dispatch!(self, s => dead::list(s.pool(), s.sql(), tenant, limit).await)
    }

    async fn replay_dead(&self, selection: &ReplaySelection) -> Result<u64, StoreError> {
        dispatch!(self, s => dead::replay(s.pool(), s.sql(), selection).await)
    }

    async fn purge_dead(
        &self,
        older_than: Duration,
        tenant: Option<&str>,
    ) -> Result<u64, StoreError> {
        dispatch!(self, s => dead::purge(s.pool(), s.sql(), older_than, tenant).await)
    }
}

/// A database URL with its password hidden, for messages and logs.
pub fn redact(url: &str) -> String {
    crate::secret::redact_url(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_and_the_rest_is_kept() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(redact("postgres://db/app"), "postgres://db/app");
        assert_eq!(
            redact("mysql://root:pw@127.0.0.1:3306/test"),
            "mysql://root:***@127.0.0.1:3306/test"
        );
        assert_eq!(redact("sqlite:///var/app.db"), "sqlite:///var/app.db");
    }

    #[test]
    fn the_driver_follows_the_url_scheme() {
        assert_eq!(Driver::of("postgresql://x/y").unwrap(), Driver::Postgres);
        assert_eq!(Driver::of("mysql://x/y").unwrap(), Driver::Mysql);
        assert_eq!(Driver::of("mariadb://x/y").unwrap(), Driver::Mysql);
        assert_eq!(Driver::of("sqlite:///tmp/a.db").unwrap(), Driver::Sqlite);
        assert_eq!(Driver::of("sqlite://a.db").unwrap(), Driver::Sqlite);
        let err = Driver::of("oracle://x/y").unwrap_err().to_string();
        assert!(err.contains("unsupported database"), "{err}");
        assert!(err.contains("sqlite://"), "{err}");
    }

    #[test]
    fn only_postgres_notifies_and_only_sqlite_leases() {
        assert!(Driver::Postgres.notifies() && !Driver::Postgres.leases());
        assert!(!Driver::Mysql.notifies() && !Driver::Mysql.leases());
        assert!(!Driver::Sqlite.notifies() && Driver::Sqlite.leases());
    }
}
