//! A claimed batch: rows leased to this batch's token (the claim committed at once), and how
//! its outcome is recorded — in one short write transaction that marks and reschedules only
//! rows still leased to the token, checks the counts, ends the leases of the rows the relay
//! put back, and commits.

use std::collections::HashSet;
use std::sync::Arc;

use sqlx::Transaction;
use sqlx::sqlite::{Sqlite, SqlitePool};

use super::BEGIN_WRITE;
use super::now_ms;
use super::sql::{Guard, Statements};
use crate::model::OutboxId;
use crate::store::batch::{ChunkedRows, in_chunks, record};
use crate::store::statement::Statement;
use crate::store::{BatchOutcome, ClaimedBatch, RowFailure, StoreError};

/// A claimed batch: its lease token and the rows it leased.
pub struct LiteBatch {
    pub(super) pool: SqlitePool,
    pub(super) statements: Arc<Statements>,
    pub(super) token: String,
    pub(super) claimed: Vec<OutboxId>,
}

impl ClaimedBatch for LiteBatch {
    async fn complete(self, outcome: BatchOutcome) -> Result<(), StoreError> {
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        let rows = Recorder {
            statements: &self.statements,
            now: now_ms(),
            guard: Guard::Lease(&self.token),
        };
        // A mismatch returns early and drops `tx`, which rolls back: the rows stay leased
        // until the relay settles them or the lease expires.
        record(&mut tx, &rows, &outcome).await?;
        // Rows the relay put back without an outcome: claimable again at once.
        let recorded: HashSet<&OutboxId> = outcome.ids().collect();
        let rest: Vec<&OutboxId> = self
            .claimed
            .iter()
            .filter(|id| !recorded.contains(id))
            .collect();
        self.release(tx, &rest).await
    }

    /// Ends the batch's leases: every row becomes claimable again, unchanged. (A batch dropped
    /// without this keeps its rows until the lease expires.)
    async fn abandon(self) -> Result<(), StoreError> {
        // An empty claim leased nothing: no write transaction for it.
        if self.claimed.is_empty() {
            return Ok(());
        }
        let tx = self.pool.begin_with(BEGIN_WRITE).await?;
        self.release(tx, &self.claimed.iter().collect::<Vec<_>>())
            .await
    }
}

impl LiteBatch {
    /// Ends the leases the batch's token holds on `ids`, and commits `tx`.
    async fn release(
        &self,
        mut tx: Transaction<'static, Sqlite>,
        ids: &[&OutboxId],
    ) -> Result<(), StoreError> {
        in_chunks::<Sqlite, _>(&mut tx, ids, |chunk| {
            self.statements.release(chunk.iter().copied(), &self.token)
        })
        .await?;
        Ok(tx.commit().await?)
    }
}

/// The statements that record a batch's rows at time `now` (milliseconds since the epoch),
/// changing only the rows `guard` lets them.
pub(super) struct Recorder<'a> {
    pub(super) statements: &'a Statements,
    pub(super) now: i64,
    pub(super) guard: Guard<'a>,
}

impl ChunkedRows for Recorder<'_> {
    fn mark(&self, ids: &[OutboxId]) -> Statement {
        self.statements.mark(ids, self.now, self.guard)
    }

    fn reschedule(&self, failed: &[RowFailure], fixed: Option<&str>) -> Statement {
        self.statements
            .reschedule(failed, self.now, self.guard, fixed)
    }
}
