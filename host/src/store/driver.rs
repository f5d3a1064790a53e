//! Picking the driver from the database URL: [`open`] a [`Store`] for the relay and the admin
//! commands, or [`migrate`] a table. Callers hold a [`Store`] and never name a driver.

use std::convert::Infallible;
use std::time::Duration;

use super::postgres::{self, PgBatch, PgStore};
use super::{
    Backlog, BatchOutcome, Claim, ClaimedBatch, DeadRow, OutboxStore, ReplaySelection, Settlement,
    StoreError, StoreOptions, TableSpec,
};
use crate::model::TenantId;

/// The databases Sluice relays from, by URL scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    Postgres,
}

impl Driver {
    fn of(url: &str) -> Result<Self, StoreError> {
        let scheme = url.split_once("://").map(|(scheme, _)| scheme);
        match scheme {
            Some("postgres" | "postgresql") => Ok(Self::Postgres),
            _ => Err(StoreError::Url {
                url: redact(url),
                message: "unsupported database; use postgres://…".into(),
            }),
        }
    }
}

/// Connects (a pool of at most `connections`) and checks the table: every column Sluice reads
/// or writes must exist with a usable type, or the error lists every problem.
pub async fn open(
    url: &str,
    spec: &TableSpec,
    options: StoreOptions,
    connections: u32,
) -> Result<Store, StoreError> {
    match Driver::of(url)? {
        Driver::Postgres => Ok(Store::Postgres(
            PgStore::open(url, spec, options, connections).await?,
        )),
    }
}

/// Creates the outbox table, or upgrades one the application created, then checks it as
/// [`open`] would (`sluice migrate`). Returns a one-line description of the table.
pub async fn migrate(url: &str, spec: &TableSpec) -> Result<String, StoreError> {
    match Driver::of(url)? {
        Driver::Postgres => postgres::migrate(url, spec).await,
    }
}

/// An open outbox store, whichever the database.
pub enum Store {
    Postgres(PgStore),
}

/// A claimed batch of a [`Store`].
pub enum StoreBatch {
    Postgres(PgBatch),
}

impl ClaimedBatch for StoreBatch {
    async fn complete(self, outcome: BatchOutcome) -> Result<(), StoreError> {
        match self {
            Self::Postgres(batch) => batch.complete(outcome).await,
        }
    }

    async fn abandon(self) -> Result<(), StoreError> {
        match self {
            Self::Postgres(batch) => batch.abandon().await,
        }
    }
}

impl OutboxStore for Store {
    type Batch = StoreBatch;

    async fn has_due(&self, paused: &[TenantId]) -> Result<bool, StoreError> {
        match self {
            Self::Postgres(s) => s.has_due(paused).await,
        }
    }

    async fn claim(
        &self,
        limit: usize,
        paused: &[TenantId],
    ) -> Result<Claim<StoreBatch>, StoreError> {
        match self {
            Self::Postgres(s) => {
                let claim = s.claim(limit, paused).await?;
                Ok(Claim {
                    batch: StoreBatch::Postgres(claim.batch),
                    rows: claim.rows,
                    rejected: claim.rejected,
                })
            }
        }
    }

    async fn settle(&self, outcome: &BatchOutcome) -> Result<Settlement, StoreError> {
        match self {
            Self::Postgres(s) => s.settle(outcome).await,
        }
    }

    async fn backlog(&self) -> Result<Backlog, StoreError> {
        match self {
            Self::Postgres(s) => s.backlog().await,
        }
    }

    async fn prune_sent(&self, retention: Duration) -> Result<u64, StoreError> {
        match self {
            Self::Postgres(s) => s.prune_sent(retention).await,
        }
    }

    async fn listen(
        &self,
        channel: &str,
        wake: &(dyn Fn() + Send + Sync),
    ) -> Result<Infallible, StoreError> {
        match self {
            Self::Postgres(s) => s.listen(channel, wake).await,
        }
    }

    async fn install_notify_trigger(&self, channel: &str) -> Result<(), StoreError> {
        match self {
            Self::Postgres(s) => s.install_notify_trigger(channel).await,
        }
    }

    async fn drop_notify_trigger(&self) -> Result<(), StoreError> {
        match self {
            Self::Postgres(s) => s.drop_notify_trigger().await,
        }
    }

    async fn dead_rows(
        &self,
        tenant: Option<&str>,
        limit: i64,
    ) -> Result<Vec<DeadRow>, StoreError> {
        match self {
            Self::Postgres(s) => s.dead_rows(tenant, limit).await,
        }
    }

    async fn replay_dead(&self, selection: &ReplaySelection) -> Result<u64, StoreError> {
        match self {
            Self::Postgres(s) => s.replay_dead(selection).await,
        }
    }

    async fn purge_dead(
        &self,
        older_than: Duration,
        tenant: Option<&str>,
    ) -> Result<u64, StoreError> {
        match self {
            Self::Postgres(s) => s.purge_dead(older_than, tenant).await,
        }
    }
}

/// A database URL with its password hidden, for messages and logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
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
    }

    #[test]
    fn the_driver_follows_the_url_scheme() {
        assert_eq!(Driver::of("postgresql://x/y").unwrap(), Driver::Postgres);
        let err = Driver::of("oracle://x/y").unwrap_err().to_string();
        assert!(err.contains("unsupported database"), "{err}");
    }
}
