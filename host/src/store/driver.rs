//! What each database does its own way, as one trait ([`StoreDriver`]) with one implementation
//! per driver; the rest of [`OutboxStore`](super::OutboxStore) runs statements built once on
//! the driver's pool ([`mod@super::open`]).

use std::convert::Infallible;
use std::time::Duration;

use super::layout_sql::LayoutSql;
use super::statement::Execute;
use super::{BatchOutcome, Claim, Settlement, StoreError};
use crate::model::TenantId;

/// What one database's store does its own way: the claim and what completes it (row locks in
/// a transaction, or a lease), the due probe, settling, retention and LISTEN/NOTIFY. See
/// [`OutboxStore`](super::OutboxStore) for what each operation means.
pub(crate) trait StoreDriver: Send + Sync {
    type Db: Execute;
    /// A claimed batch of this driver (the store wraps it in its `StoreBatch`).
    type Batch;

    /// The pool the shared statements run on.
    fn pool(&self) -> &sqlx::Pool<Self::Db>;
    /// The checked table, as this database's SQL.
    fn sql(&self) -> &LayoutSql;

    async fn has_due(&self, paused: &[TenantId]) -> Result<bool, StoreError>;
    async fn claim(
        &self,
        limit: usize,
        paused: &[TenantId],
    ) -> Result<Claim<Self::Batch>, StoreError>;
    async fn settle(&self, outcome: &BatchOutcome) -> Result<Settlement, StoreError>;
    async fn prune_sent(&self, retention: Duration) -> Result<u64, StoreError>;

    /// Databases without LISTEN/NOTIFY: relays poll.
    async fn listen(
        &self,
        _channel: &str,
        _wake: &(dyn Fn() + Send + Sync),
    ) -> Result<Infallible, StoreError> {
        Err(StoreError::unsupported_notify(self.sql().dialect.name()))
    }

    async fn install_notify_trigger(&self, _channel: &str) -> Result<(), StoreError> {
        Err(StoreError::unsupported_notify(self.sql().dialect.name()))
    }

    async fn drop_notify_trigger(&self) -> Result<(), StoreError> {
        Err(StoreError::unsupported_notify(self.sql().dialect.name()))
    }
}
