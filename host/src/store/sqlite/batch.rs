//! A claimed batch: rows leased to this batch's token (the claim committed at once), and how
//! its outcome is recorded — in one short write transaction that marks and reschedules only
//! rows still leased to the token, checks the counts, ends the leases of the rows the relay
//! put back, and commits.

use std::collections::HashSet;
use std::sync::Arc;

use futures::future::BoxFuture;
use sqlx::AssertSqlSafe;
use sqlx::sqlite::{Sqlite, SqliteConnection, SqlitePool};

use super::BEGIN_WRITE;
use super::rows::{bind_id, now_ms};
use super::sql::{Guard, Statements};
use crate::model::OutboxId;
use crate::store::batch::{RecordRows, check_count, reschedule_or_fixed};
use crate::store::rows::{IDS_PER_STATEMENT, Reschedule, stored_error};
use crate::store::{BatchOutcome, ClaimedBatch, RowFailure, StoreError};

/// A claimed batch: its lease token and the rows it leased.
pub struct LiteBatch {
    pool: SqlitePool,
    statements: Arc<Statements>,
    token: String,
    claimed: Vec<OutboxId>,
}

impl LiteBatch {
    pub(super) fn new(
        pool: SqlitePool,
        statements: Arc<Statements>,
        token: String,
        claimed: Vec<OutboxId>,
    ) -> Self {
        Self {
            pool,
            statements,
            token,
            claimed,
        }
    }
}

impl ClaimedBatch for LiteBatch {
    async fn complete(self, outcome: BatchOutcome) -> Result<(), StoreError> {
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        let now = now_ms();
        let lease = Some(self.token.as_str());
        if !outcome.sent.is_empty() {
            let affected = mark(&mut tx, &self.statements, &outcome.sent, now, lease).await?;
            check_count(outcome.sent.len(), affected)?;
        }
        if !outcome.failed.is_empty() {
            let rows = Recorder {
                statements: &self.statements,
                now,
                lease,
            };
            let affected = reschedule_or_fixed(&mut tx, &rows, &outcome.failed).await?;
            check_count(outcome.failed.len(), affected)?;
        }
        // Rows the relay put back without an outcome: claimable again at once.
        let recorded: HashSet<&OutboxId> = outcome.ids().collect();
        let rest: Vec<OutboxId> = self
            .claimed
            .iter()
            .filter(|id| !recorded.contains(id))
            .cloned()
            .collect();
        release(&mut tx, &self.statements, &rest, &self.token).await?;
        // A mismatch above returns early and drops `tx`, which rolls back: the rows stay
        // leased until the relay settles them or the lease expires.
        tx.commit().await?;
        Ok(())
    }

    /// Ends the batch's leases: every row becomes claimable again, unchanged. (A batch dropped
    /// without this keeps its rows until the lease expires.)
    async fn abandon(self) -> Result<(), StoreError> {
        // An empty claim leased nothing: no write transaction for it.
        if self.claimed.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        release(&mut tx, &self.statements, &self.claimed, &self.token).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// The statements that record a batch's rows at time `now`: rows leased to `lease` (a
/// token), or, without one, rows still unsent (settling).
pub(super) struct Recorder<'a> {
    pub(super) statements: &'a Statements,
    pub(super) now: i64,
    pub(super) lease: Option<&'a str>,
}

impl RecordRows<Sqlite> for Recorder<'_> {
    fn mark<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        ids: &'c [OutboxId],
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        Box::pin(mark(conn, self.statements, ids, self.now, self.lease))
    }

    fn reschedule<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        failed: &'c [RowFailure],
        fixed: Option<&'static str>,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        Box::pin(reschedule(
            conn,
            self.statements,
            failed,
            self.now,
            self.lease,
            fixed,
        ))
    }
}

/// Marks `ids` sent: rows leased to `lease` (a token), or, without one, rows still unsent.
async fn mark(
    conn: &mut SqliteConnection,
    statements: &Statements,
    ids: &[OutboxId],
    now: i64,
    lease: Option<&str>,
) -> Result<u64, sqlx::Error> {
    let guard = if lease.is_some() {
        Guard::Lease
    } else {
        Guard::Unsent
    };
    let published_at = statements.marks_with_time();
    let mut affected = 0;
    for chunk in ids.chunks(IDS_PER_STATEMENT) {
        let sql = statements.mark(chunk.len(), guard);
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if published_at {
            query = query.bind(now);
        }
        for id in chunk {
            query = bind_id(query, id);
        }
        if let Some(token) = lease {
            query = query.bind(token.to_owned());
        }
        affected += query.execute(&mut *conn).await?.rows_affected();
    }
    Ok(affected)
}

/// Reschedules or dead-letters `failed` (rows leased to `lease`, or still unsent without
/// one), recording each row's error (bounded) or `fixed`; returns the rows affected.
async fn reschedule(
    conn: &mut SqliteConnection,
    statements: &Statements,
    failed: &[RowFailure],
    now: i64,
    lease: Option<&str>,
    fixed: Option<&str>,
) -> Result<u64, sqlx::Error> {
    let guard = if lease.is_some() {
        Guard::Lease
    } else {
        Guard::Unsent
    };
    let mut affected = 0;
    for chunk in failed.chunks(IDS_PER_STATEMENT) {
        let mut query = sqlx::query(AssertSqlSafe(statements.reschedule(chunk.len(), guard)));
        for f in chunk {
            let r = Reschedule::from(f.disposition);
            let error = stored_error(f, fixed);
            query = bind_id(query, &f.id)
                .bind(error)
                .bind(r.delay_ms)
                .bind(i64::from(r.dead))
                .bind(i64::from(r.counted));
        }
        query = query.bind(now).bind(now);
        if let Some(token) = lease {
            query = query.bind(token.to_owned());
        }
        affected += query.execute(&mut *conn).await?.rows_affected();
    }
    Ok(affected)
}

/// Ends the leases `token` holds on `ids`.
async fn release(
    conn: &mut SqliteConnection,
    statements: &Statements,
    ids: &[OutboxId],
    token: &str,
) -> Result<(), sqlx::Error> {
    for chunk in ids.chunks(IDS_PER_STATEMENT) {
        let mut query = sqlx::query(AssertSqlSafe(statements.release(chunk.len())));
        for id in chunk {
            query = bind_id(query, id);
        }
        query.bind(token.to_owned()).execute(&mut *conn).await?;
    }
    Ok(())
}
