//! An outbox table in memory with the semantics of the real stores, for tests: the relay's
//! unit tests run on it, and the conformance suite (`conformance`) holds it to the same
//! behaviour bodies as PostgreSQL, MariaDB and SQLite, so a divergence fails a test.
//!
//! It models one table shared by every [`MemoryStore`] opened on it (clones and
//! [`MemoryStore::open`]), each with its own [`StoreOptions`] as each relay has its own: row
//! locks held by open batches (`FOR UPDATE SKIP LOCKED`), `mark` (delete or `published_at`),
//! key order with `ordering_after_dead`, retries, dead rows, retention. Besides, the relay's
//! tests script database faults through [`StoreState`]: commits that fail, rows the database
//! refuses to settle, settlements that fail or find rows locked.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::batch::check_count;
use chrono::{DateTime, Utc};

use super::{
    AfterDead, Backlog, BatchOutcome, Claim, ClaimedBatch, DeadRow, Disposition, MarkMode,
    Ordering, OutboxStore, ReplaySelection, RowFailure, Settlement, StoreError, StoreOptions,
    TenantBacklog,
};
use crate::model::{OutboxId, OutboxRow, TenantId};
use crate::text::{MAX_STORED, bounded};

/// The table's name in error messages.
const TABLE: &str = "outbox";

/// A row as the in-memory table holds it: the application's columns, decoded, and the
/// bookkeeping columns.
#[derive(Debug, Clone)]
pub(crate) struct StoredRow {
    pub row: OutboxRow,
    pub published_at: Option<DateTime<Utc>>,
    pub dead_at: Option<DateTime<Utc>>,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Set for a row whose columns cannot be decoded (why): claimed as rejected, as the real
    /// stores claim a row with malformed `headers`.
    pub undecodable: Option<String>,
}

impl StoredRow {
    /// Marked sent (`published_at` mode; in delete mode a sent row is gone).
    pub(crate) fn sent(&self) -> bool {
        self.published_at.is_some()
    }

    pub(crate) fn dead(&self) -> bool {
        self.dead_at.is_some()
    }

    /// Neither sent nor dead.
    fn live(&self) -> bool {
        !self.sent() && !self.dead()
    }

    /// Due for a claim at `now`, ignoring locks, pauses and key order.
    fn due(&self, now: DateTime<Utc>) -> bool {
        self.live() && self.next_attempt_at.is_none_or(|at| at <= now)
    }

    /// The row's key in key order: tenant, aggregate type, aggregate id.
    fn key(&self) -> (&TenantId, &str, &str) {
        (
            &self.row.tenant,
            &self.row.aggregate_type,
            &self.row.aggregate_id,
        )
    }

    /// Applies a failed attempt's disposition, as the drivers' reschedule statement does.
    fn reschedule(&mut self, failure: &RowFailure, now: DateTime<Utc>) {
        self.last_error = Some(bounded(&failure.error, MAX_STORED).into_owned());
        match failure.disposition {
            Disposition::Retry(d) => {
                self.attempts += 1;
                self.next_attempt_at = Some(now + d);
                self.dead_at = None;
            }
            Disposition::Dead => {
                self.attempts += 1;
                self.next_attempt_at = None;
                self.dead_at = Some(now);
            }
            Disposition::Wait(d) => {
                self.next_attempt_at = Some(now + d);
                self.dead_at = None;
            }
        }
    }
}

/// How a scripted commit fails.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CommitFailure {
    MarkMismatch,
    Database,
}

impl CommitFailure {
    fn error(self) -> StoreError {
        match self {
            Self::MarkMismatch => StoreError::MarkMismatch {
                expected: 2,
                affected: 1,
            },
            Self::Database => StoreError::Database(sqlx::Error::PoolTimedOut),
        }
    }
}

/// The table, its locks, and the faults a test scripts.
#[derive(Debug, Default)]
pub(crate) struct StoreState {
    pub rows: BTreeMap<i64, StoredRow>,
    /// Rows held by an open batch.
    pub locked: HashSet<i64>,
    /// The id an insert without one gets: past every id ever inserted, as a sequence.
    next_id: i64,
    /// How the next commits fail, in order (each failure rolls its batch back).
    pub failing_commits: VecDeque<CommitFailure>,
    /// Rows the database refuses to change when settling.
    pub refusing: HashSet<i64>,
    /// Whether `settle` fails as a whole.
    pub settle_fails: bool,
    /// `settle` calls that find every row locked (as right after a rollback that has not
    /// run yet).
    pub settles_finding_rows_locked: usize,
    pub commits: usize,
    pub rollbacks: usize,
    pub settles: usize,
}

impl StoreState {
    /// The rows a claim may take at `now`, in claim order, ignoring locks: due, not of a
    /// `paused` tenant and, in key order, not behind an earlier unsent row of their key.
    fn claimable(
        &self,
        options: StoreOptions,
        now: DateTime<Utc>,
        paused: &[TenantId],
    ) -> Vec<i64> {
        // Keys with an unsent row so far in claim order. Like the drivers' `NOT EXISTS`, a row
        // locked by a batch or waiting for its retry holds its key back; a dead one only with
        // `AfterDead::Block`.
        let mut held_back: HashSet<(&TenantId, &str, &str)> = HashSet::new();
        let mut claimable = Vec::new();
        for (id, row) in &self.rows {
            let blocked = options.ordering == Ordering::Key && held_back.contains(&row.key());
            if !blocked && row.due(now) && !paused.contains(&row.row.tenant) {
                claimable.push(*id);
            }
            let holds = !row.sent() && (!row.dead() || options.after_dead == AfterDead::Block);
            if holds {
                held_back.insert(row.key());
            }
        }
        claimable
    }

    /// Marks row `id` sent as `mark` says: gone, or `published_at` set.
    fn mark(&mut self, id: i64, mark: MarkMode, now: DateTime<Utc>) {
        match mark {
            MarkMode::Delete => {
                self.rows.remove(&id);
            }
            MarkMode::PublishedAt => {
                if let Some(row) = self.rows.get_mut(&id) {
                    row.published_at = Some(now);
                }
            }
        }
    }
}

/// An outbox in memory. Clones share the table and the options.
#[derive(Debug, Clone)]
pub(crate) struct MemoryStore {
    state: Arc<Mutex<StoreState>>,
    options: StoreOptions,
}

impl MemoryStore {
    /// A store on a new, empty table.
    pub(crate) fn new(options: StoreOptions) -> Self {
        Self {
            state: Arc::new(Mutex::new(StoreState {
                next_id: 1,
                ..StoreState::default()
            })),
            options,
        }
    }

    /// Another store on the same table (another relay), with its own options.
    pub(crate) fn open(&self, options: StoreOptions) -> Self {
        Self {
            state: Arc::clone(&self.state),
            options,
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, StoreState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Inserts `row` under its own id, as an application would (not yet sent, no attempt
    /// recorded but the row's `attempts`).
    pub(crate) fn insert(&self, row: OutboxRow) {
        let OutboxId::Int(id) = row.id else {
            panic!("integer ids only")
        };
        let mut state = self.state();
        state.next_id = state.next_id.max(id + 1);
        state.rows.insert(
            id,
            StoredRow {
                attempts: row.attempts,
                row,
                published_at: None,
                dead_at: None,
                last_error: None,
                next_attempt_at: None,
                undecodable: None,
            },
        );
    }

    /// The id the next insert without one gets.
    pub(crate) fn next_id(&self) -> i64 {
        self.state().next_id
    }

    /// Row `id` as the table holds it; panics when it is gone.
    pub(crate) fn row(&self, id: i64) -> StoredRow {
        self.state().rows[&id].clone()
    }

    fn release(&self, ids: &[i64]) {
        let mut state = self.state();
        for id in ids {
            state.locked.remove(id);
        }
    }

    /// The dead rows `tenant` selects by name (`default` also matches rows without a tenant,
    /// as the drivers' `COALESCE(tenant, 'default')`).
    fn of_tenant(row: &StoredRow, tenant: Option<&str>) -> bool {
        tenant.is_none_or(|t| row.row.tenant.as_str() == t)
    }
}

fn int(id: &OutboxId) -> Option<i64> {
    match id {
        OutboxId::Int(id) => Some(*id),
        OutboxId::Text(_) => None,
    }
}

/// One tenant's rows as [`OutboxStore::sample_backlog`] reads them.
#[derive(Default)]
struct Sampled {
    due: i64,
    /// The oldest due row's `created_at`.
    oldest_due: Option<DateTime<Utc>>,
    dead: i64,
    waiting: i64,
}

impl OutboxStore for MemoryStore {
    type Batch = MemoryBatch;

    async fn has_due(&self, paused: &[TenantId]) -> Result<bool, StoreError> {
        let state = self.state();
        Ok(!state.claimable(self.options, Utc::now(), paused).is_empty())
    }

    async fn claim(
        &self,
        limit: usize,
        paused: &[TenantId],
    ) -> Result<Claim<MemoryBatch>, StoreError> {
        let mut state = self.state();
        let ids: Vec<i64> = state
            .claimable(self.options, Utc::now(), paused)
            .into_iter()
            .filter(|id| !state.locked.contains(id))
            .take(limit)
            .collect();
        let mut decoded = Vec::with_capacity(ids.len());
        for id in &ids {
            state.locked.insert(*id);
            let stored = &state.rows[id];
            decoded.push(match &stored.undecodable {
                Some(error) => Err(RowFailure {
                    id: OutboxId::Int(*id),
                    error: error.clone(),
                    disposition: Disposition::Dead,
                }),
                None => Ok(OutboxRow {
                    attempts: stored.attempts,
                    ..stored.row.clone()
                }),
            });
        }
        let batch = MemoryBatch {
            store: self.clone(),
            ids,
            open: true,
        };
        Claim::of(batch, decoded.into_iter().map(Ok))
    }

    async fn settle(&self, outcome: &BatchOutcome) -> Result<Settlement, StoreError> {
        let now = Utc::now();
        let mut state = self.state();
        state.settles += 1;
        if state.settle_fails {
            return Err(StoreError::Database(sqlx::Error::PoolTimedOut));
        }
        let mut settlement = Settlement::default();
        let all_locked = state.settles_finding_rows_locked > 0;
        state.settles_finding_rows_locked = state.settles_finding_rows_locked.saturating_sub(1);
        let targets = outcome
            .sent
            .iter()
            .map(|id| (id, None))
            .chain(outcome.failed.iter().map(|f| (&f.id, Some(f))));
        for (id, failure) in targets {
            // Only rows still there, unsent, not dead and not held by another batch.
            let held = int(id).filter(|n| {
                !all_locked
                    && !state.locked.contains(n)
                    && state.rows.get(n).is_some_and(StoredRow::live)
            });
            let Some(n) = held else {
                settlement.skipped.push(id.clone());
                continue;
            };
            if state.refusing.contains(&n) {
                settlement
                    .refused
                    .push((id.clone(), "trigger refused the row".to_owned()));
                continue;
            }
            match failure {
                None => {
                    state.mark(n, self.options.mark, now);
                    settlement.marked.push(id.clone());
                }
                Some(f) => {
                    if let Some(row) = state.rows.get_mut(&n) {
                        row.reschedule(f, now);
                    }
                    settlement.rescheduled.push(id.clone());
                }
            }
        }
        Ok(settlement)
    }

    async fn backlog(&self) -> Result<Backlog, StoreError> {
        let now = Utc::now();
        let state = self.state();
        let unsent = || state.rows.values().filter(|r| !r.sent());
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        Ok(Backlog {
            due: count(unsent().filter(|r| r.due(now)).count()),
            waiting: count(unsent().filter(|r| !r.dead() && !r.due(now)).count()),
            dead: count(unsent().filter(|r| r.dead()).count()),
        })
    }

    /// As the drivers' statement: the first `limit` unsent, live rows in claim order (due or
    /// waiting) and the first `limit` dead ones, grouped by tenant.
    async fn sample_backlog(&self, limit: i64) -> Result<Vec<TenantBacklog>, StoreError> {
        let now = Utc::now();
        let state = self.state();
        let limit = usize::try_from(limit).unwrap_or(0);
        let mut tenants: BTreeMap<Option<String>, Sampled> = BTreeMap::new();
        let tenant = |row: &StoredRow| row.row.tenant.name().map(str::to_owned);
        for row in state.rows.values().filter(|r| r.live()).take(limit) {
            let sampled = tenants.entry(tenant(row)).or_default();
            if row.due(now) {
                sampled.due += 1;
                let created = row.row.created_at;
                sampled.oldest_due = Some(sampled.oldest_due.map_or(created, |at| at.min(created)));
            } else {
                sampled.waiting += 1;
            }
        }
        let dead = state.rows.values().filter(|r| !r.sent() && r.dead());
        for row in dead.take(limit) {
            tenants.entry(tenant(row)).or_default().dead += 1;
        }
        Ok(tenants
            .into_iter()
            .map(|(tenant, sampled)| TenantBacklog {
                tenant,
                due: sampled.due,
                oldest_due_age: sampled
                    .oldest_due
                    .map(|at| (now - at).to_std().unwrap_or(Duration::ZERO)),
                dead: sampled.dead,
                waiting: sampled.waiting,
            })
            .collect())
    }

    async fn prune_sent(&self, retention: Duration) -> Result<u64, StoreError> {
        let before = Utc::now() - retention;
        let mut state = self.state();
        let count = state.rows.len();
        state
            .rows
            .retain(|_, r| r.published_at.is_none_or(|at| at >= before));
        Ok((count - state.rows.len()) as u64)
    }

    /// An in-memory table announces nothing, as MySQL and SQLite do not: relays poll.
    async fn listen(
        &self,
        _channel: &str,
        _wake: &(dyn Fn() + Send + Sync),
    ) -> Result<std::convert::Infallible, StoreError> {
        Err(StoreError::unsupported_notify("an in-memory table"))
    }

    async fn install_notify_trigger(&self, _channel: &str) -> Result<(), StoreError> {
        Err(StoreError::unsupported_notify("an in-memory table"))
    }

    async fn drop_notify_trigger(&self) -> Result<(), StoreError> {
        Err(StoreError::unsupported_notify("an in-memory table"))
    }

    async fn dead_rows(
        &self,
        tenant: Option<&str>,
        limit: i64,
    ) -> Result<Vec<DeadRow>, StoreError> {
        let state = self.state();
        Ok(state
            .rows
            .values()
            .filter(|r| r.dead() && Self::of_tenant(r, tenant))
            .take(usize::try_from(limit).unwrap_or(0))
            .map(|r| DeadRow {
                id: r.row.id.clone(),
                tenant: r.row.tenant.name().map(str::to_owned),
                aggregate_type: r.row.aggregate_type.clone(),
                aggregate_id: r.row.aggregate_id.clone(),
                event_type: r.row.event_type.clone(),
                attempts: r.attempts,
                dead_at: r.dead_at.unwrap_or_default(),
                last_error: r.last_error.clone(),
            })
            .collect())
    }

    async fn replay_dead(&self, selection: &ReplaySelection) -> Result<u64, StoreError> {
        let id = match selection {
            ReplaySelection::Id(id) => {
                Some(
                    id.trim()
                        .parse::<i64>()
                        .map_err(|_| StoreError::InvalidId {
                            table: TABLE.to_owned(),
                            id: id.clone(),
                            expected: "an integer",
                        })?,
                )
            }
            ReplaySelection::Tenant(_) | ReplaySelection::All => None,
        };
        let mut state = self.state();
        let mut replayed = 0;
        for (n, row) in state.rows.iter_mut() {
            let chosen = match selection {
                ReplaySelection::Id(_) => id == Some(*n),
                ReplaySelection::Tenant(t) => Self::of_tenant(row, Some(t)),
                ReplaySelection::All => true,
            };
            if chosen && row.dead() && !row.sent() {
                // `last_error` stays: the row's history is visible until it is delivered.
                row.dead_at = None;
                row.attempts = 0;
                row.next_attempt_at = None;
                replayed += 1;
            }
        }
        Ok(replayed)
    }

    async fn purge_dead(
        &self,
        older_than: Duration,
        tenant: Option<&str>,
    ) -> Result<u64, StoreError> {
        let died_before = Utc::now() - older_than;
        let mut state = self.state();
        let count = state.rows.len();
        state.rows.retain(|_, r| {
            let purged = !r.sent()
                && r.dead_at.is_some_and(|at| at <= died_before)
                && Self::of_tenant(r, tenant);
            !purged
        });
        Ok((count - state.rows.len()) as u64)
    }
}

/// A claimed batch: its rows stay locked until it completes, is abandoned or dropped.
#[derive(Debug)]
pub(crate) struct MemoryBatch {
    store: MemoryStore,
    ids: Vec<i64>,
    open: bool,
}

impl MemoryBatch {
    fn roll_back(&mut self) {
        if std::mem::take(&mut self.open) {
            self.store.release(&self.ids);
            self.store.state().rollbacks += 1;
        }
    }

    /// How many of `ids` a statement of this batch changes: rows it holds that are still
    /// there (a row deleted meanwhile is not). Recording a row the batch does not hold is a
    /// bug of the caller.
    fn affected<'a>(&self, state: &StoreState, ids: impl Iterator<Item = &'a OutboxId>) -> u64 {
        let mut affected = 0;
        for id in ids {
            let Some(n) = int(id).filter(|n| state.rows.contains_key(n)) else {
                continue;
            };
            assert!(self.ids.contains(&n), "row {n} recorded but not claimed");
            affected += 1;
        }
        affected
    }
}

impl Drop for MemoryBatch {
    fn drop(&mut self) {
        self.roll_back();
    }
}

impl ClaimedBatch for MemoryBatch {
    async fn complete(mut self, outcome: BatchOutcome) -> Result<(), StoreError> {
        let recorded: Vec<&OutboxId> = outcome.ids().collect();
        let unique: HashSet<&OutboxId> = recorded.iter().copied().collect();
        assert_eq!(unique.len(), recorded.len(), "a row recorded twice");
        let (marked, rescheduled) = {
            let state = self.store.state();
            (
                self.affected(&state, outcome.sent.iter()),
                self.affected(&state, outcome.failed.iter().map(|f| &f.id)),
            )
        };
        let failure = self.store.state().failing_commits.pop_front();
        // Like the drivers: each statement's count must equal the rows it was given, or
        // nothing of the batch is recorded.
        let recorded = match failure {
            Some(failure) => Err(failure.error()),
            None => check_count(outcome.sent.len(), marked)
                .and_then(|()| check_count(outcome.failed.len(), rescheduled)),
        };
        if let Err(e) = recorded {
            self.roll_back();
            return Err(e);
        }
        let now = Utc::now();
        {
            let mut state = self.store.state();
            for n in outcome.sent.iter().filter_map(int) {
                state.mark(n, self.store.options.mark, now);
            }
            for f in &outcome.failed {
                if let Some(row) = int(&f.id).and_then(|n| state.rows.get_mut(&n)) {
                    row.reschedule(f, now);
                }
            }
            state.commits += 1;
        }
        self.open = false;
        self.store.release(&self.ids);
        Ok(())
    }

    async fn abandon(mut self) -> Result<(), StoreError> {
        self.roll_back();
        Ok(())
    }
}
