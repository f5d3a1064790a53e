//! Test doubles for the relay loop, all in memory: an outbox store with the locking and
//! bookkeeping of the real one, a transformer that follows a script, and a sink that records
//! what it was asked to publish and answers as scripted.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::model::OutboundMessage;
use crate::model::{OutboxId, OutboxRow, TenantId};
use crate::plugin::{RowResult, RowTransformer};
use crate::sink::{PublishFault, Sink, SinkError};
use crate::store::{
    Backlog, BatchOutcome, Claim, ClaimedBatch, DeadRow, Disposition, OutboxStore, ReplaySelection,
    RowFailure, Settlement, StoreError, TenantBacklog,
};

// ---------------------------------------------------------------------------------------------
// Store

/// A row as the in-memory table holds it.
#[derive(Debug, Clone)]
pub(super) struct StoredRow {
    pub row: OutboxRow,
    pub sent: bool,
    /// When it was marked sent (for pruning).
    pub sent_at: Option<Instant>,
    pub dead: bool,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub due: Option<Instant>,
    /// Set for a row whose columns "cannot be decoded": claimed as rejected.
    pub undecodable: Option<String>,
}

/// How a scripted commit fails.
#[derive(Debug, Clone, Copy)]
pub(super) enum CommitFailure {
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

#[derive(Debug, Default)]
pub(super) struct StoreState {
    pub rows: BTreeMap<i64, StoredRow>,
    pub locked: HashSet<i64>,
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

/// An outbox in memory. Clones share the table.
#[derive(Debug, Clone, Default)]
pub(super) struct MemoryStore {
    state: Arc<Mutex<StoreState>>,
}

/// The row with id `id` of `tenant`, as an application would insert it.
pub(super) fn outbox_row(id: i64, tenant: &str, aggregate_type: &str) -> OutboxRow {
    OutboxRow {
        id: OutboxId::Int(id),
        tenant: TenantId::named(tenant),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: format!("agg-{id}"),
        event_type: "Happened".to_owned(),
        payload: format!("{{\"n\":{id}}}").into_bytes(),
        headers: vec![("trace".to_owned(), format!("t-{id}").into_bytes())],
        created_at: chrono::Utc::now(),
        attempts: 0,
    }
}

impl MemoryStore {
    pub(super) fn state(&self) -> MutexGuard<'_, StoreState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn insert(&self, row: OutboxRow) {
        let OutboxId::Int(id) = row.id else {
            panic!("integer ids only")
        };
        self.state().rows.insert(
            id,
            StoredRow {
                attempts: row.attempts,
                row,
                sent: false,
                sent_at: None,
                dead: false,
                last_error: None,
                due: None,
                undecodable: None,
            },
        );
    }

    pub(super) fn row(&self, id: i64) -> StoredRow {
        self.state().rows[&id].clone()
    }

    fn due(row: &StoredRow, now: Instant, paused: &[TenantId]) -> bool {
        !row.sent
            && !row.dead
            && row.due.is_none_or(|d| d <= now)
            && !paused.contains(&row.row.tenant)
    }

    fn release(&self, ids: &[i64]) {
        let mut state = self.state();
        for id in ids {
            state.locked.remove(id);
        }
    }
}

/// Applies a failed row's disposition, as `PgBatch::complete` does.
fn reschedule(row: &mut StoredRow, failure: &RowFailure, now: Instant) {
    row.last_error = Some(failure.error.clone());
    match failure.disposition {
        Disposition::Retry(d) => {
            row.attempts += 1;
            row.due = Some(now + d);
        }
        Disposition::Dead => {
            row.attempts += 1;
            row.dead = true;
        }
        Disposition::Wait(d) => row.due = Some(now + d),
    }
}

fn int(id: &OutboxId) -> i64 {
    match id {
        OutboxId::Int(id) => *id,
        OutboxId::Text(t) => panic!("unexpected text id {t}"),
    }
}

impl OutboxStore for MemoryStore {
    type Batch = MemoryBatch;

    async fn has_due(&self, paused: &[TenantId]) -> Result<bool, StoreError> {
        let now = Instant::now();
        Ok(self
            .state()
            .rows
            .values()
            .any(|r| Self::due(r, now, paused)))
    }

    async fn claim(
        &self,
        limit: usize,
        paused: &[TenantId],
    ) -> Result<Claim<MemoryBatch>, StoreError> {
        let now = Instant::now();
        let mut state = self.state();
        let ids: Vec<i64> = state
            .rows
            .iter()
            .filter(|(id, r)| Self::due(r, now, paused) && !state.locked.contains(id))
            .map(|(id, _)| *id)
            .take(limit)
            .collect();
        let mut rows = Vec::new();
        let mut rejected = Vec::new();
        for id in &ids {
            state.locked.insert(*id);
            let stored = &state.rows[id];
            match &stored.undecodable {
                Some(error) => rejected.push(RowFailure {
                    id: OutboxId::Int(*id),
                    error: error.clone(),
                    disposition: Disposition::Dead,
                }),
                None => rows.push(OutboxRow {
                    attempts: stored.attempts,
                    ..stored.row.clone()
                }),
            }
        }
        Ok(Claim {
            batch: MemoryBatch {
                store: self.clone(),
                ids,
                open: true,
            },
            rows,
            rejected,
        })
    }

    async fn settle(&self, outcome: &BatchOutcome) -> Result<Settlement, StoreError> {
        let now = Instant::now();
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
            let n = int(id);
            let row = &state.rows[&n];
            if all_locked || state.locked.contains(&n) || row.sent || row.dead {
                settlement.skipped.push(id.clone());
                continue;
            }
            if state.refusing.contains(&n) {
                settlement
                    .refused
                    .push((id.clone(), "trigger refused the row".to_owned()));
                continue;
            }
            let Some(row) = state.rows.get_mut(&n) else {
                continue;
            };
            match failure {
                None => {
                    row.sent = true;
                    row.sent_at = Some(now);
                    settlement.marked.push(id.clone());
                }
                Some(f) => {
                    reschedule(row, f, now);
                    settlement.rescheduled.push(id.clone());
                }
            }
        }
        Ok(settlement)
    }

    async fn backlog(&self) -> Result<Backlog, StoreError> {
        let now = Instant::now();
        let state = self.state();
        let unsent = || state.rows.values().filter(|r| !r.sent);
        Ok(Backlog {
            due: unsent()
                .filter(|r| !r.dead && r.due.is_none_or(|d| d <= now))
                .count() as i64,
            waiting: unsent()
                .filter(|r| !r.dead && r.due.is_some_and(|d| d > now))
                .count() as i64,
            dead: unsent().filter(|r| r.dead).count() as i64,
        })
    }

    async fn sample_backlog(&self, _limit: i64) -> Result<Vec<TenantBacklog>, StoreError> {
        // The relay's tests do not sample; the drivers' conformance suite tests the statement.
        Ok(Vec::new())
    }

    async fn prune_sent(&self, retention: Duration) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut state = self.state();
        let before = state.rows.len();
        state.rows.retain(|_, r| {
            r.sent_at
                .is_none_or(|at| now.duration_since(at) < retention)
        });
        Ok((before - state.rows.len()) as u64)
    }

    /// An in-memory table announces nothing: the relay polls.
    async fn listen(
        &self,
        _channel: &str,
        _wake: &(dyn Fn() + Send + Sync),
    ) -> Result<std::convert::Infallible, StoreError> {
        std::future::pending().await
    }

    async fn install_notify_trigger(&self, _channel: &str) -> Result<(), StoreError> {
        Ok(())
    }

    async fn drop_notify_trigger(&self) -> Result<(), StoreError> {
        Ok(())
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
            .filter(|r| r.dead && !r.sent && tenant.is_none_or(|t| r.row.tenant.as_str() == t))
            .take(usize::try_from(limit).unwrap_or(0))
            .map(|r| DeadRow {
                id: r.row.id.clone(),
                tenant: Some(r.row.tenant.as_str().to_owned()),
                aggregate_type: r.row.aggregate_type.clone(),
                aggregate_id: r.row.aggregate_id.clone(),
                event_type: r.row.event_type.clone(),
                attempts: r.attempts,
                dead_at: chrono::Utc::now(),
                last_error: r.last_error.clone(),
            })
            .collect())
    }

    async fn replay_dead(&self, selection: &ReplaySelection) -> Result<u64, StoreError> {
        let mut state = self.state();
        let mut replayed = 0;
        for row in state.rows.values_mut().filter(|r| r.dead && !r.sent) {
            let chosen = match selection {
                ReplaySelection::Id(id) => row.row.id.to_string() == *id,
                ReplaySelection::Tenant(t) => row.row.tenant.as_str() == t,
                ReplaySelection::All => true,
            };
            if chosen {
                row.dead = false;
                row.attempts = 0;
                row.due = None;
                replayed += 1;
            }
        }
        Ok(replayed)
    }

    /// Dead rows carry no time of death here: every dead row of `tenant` is old enough.
    async fn purge_dead(
        &self,
        _older_than: Duration,
        tenant: Option<&str>,
    ) -> Result<u64, StoreError> {
        let mut state = self.state();
        let before = state.rows.len();
        state.rows.retain(|_, r| {
            !(r.dead && !r.sent && tenant.is_none_or(|t| r.row.tenant.as_str() == t))
        });
        Ok((before - state.rows.len()) as u64)
    }
}

/// A claimed batch: its rows stay locked until it completes, is abandoned or dropped.
#[derive(Debug)]
pub(super) struct MemoryBatch {
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
}

impl Drop for MemoryBatch {
    fn drop(&mut self) {
        self.roll_back();
    }
}

impl ClaimedBatch for MemoryBatch {
    async fn complete(mut self, outcome: BatchOutcome) -> Result<(), StoreError> {
        let recorded: Vec<i64> = outcome
            .sent
            .iter()
            .chain(outcome.failed.iter().map(|f| &f.id))
            .map(int)
            .collect();
        let unique: HashSet<i64> = recorded.iter().copied().collect();
        assert_eq!(unique.len(), recorded.len(), "a row recorded twice");
        for id in &recorded {
            assert!(self.ids.contains(id), "row {id} recorded but not claimed");
        }
        let failure = self.store.state().failing_commits.pop_front();
        if let Some(failure) = failure {
            self.roll_back();
            return Err(failure.error());
        }
        let now = Instant::now();
        {
            let mut state = self.store.state();
            for id in &outcome.sent {
                if let Some(row) = state.rows.get_mut(&int(id)) {
                    row.sent = true;
                    row.sent_at = Some(now);
                }
            }
            for f in &outcome.failed {
                if let Some(row) = state.rows.get_mut(&int(&f.id)) {
                    reschedule(row, f, now);
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

// ---------------------------------------------------------------------------------------------
// Transformer

type Script = Box<dyn Fn(&OutboxRow) -> RowResult + Send + Sync>;

/// A transformer that answers each row as its script says and remembers what it was told
/// about publishing.
pub(super) struct ScriptedTransformer {
    script: Mutex<Script>,
    /// Results added (positive) or left out (negative) at the end: a transformer that
    /// miscounts.
    pub miscount: Mutex<isize>,
    /// Panic on the next `transform` call.
    pub panic_once: AtomicBool,
    /// `record_publish` calls: tenant, delivered, refused.
    pub publishes: Mutex<Vec<(String, usize, usize)>>,
}

impl ScriptedTransformer {
    pub(super) fn new(
        script: impl Fn(&OutboxRow) -> RowResult + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            script: Mutex::new(Box::new(script)),
            miscount: Mutex::new(0),
            panic_once: AtomicBool::new(false),
            publishes: Mutex::new(Vec::new()),
        })
    }

    /// Routes every row to one message on topic `t.<aggregate_type>`.
    pub(super) fn routing() -> Arc<Self> {
        Self::new(|row| Ok(vec![message(row, &format!("t.{}", row.aggregate_type))]))
    }

    pub(super) fn set_script(
        &self,
        script: impl Fn(&OutboxRow) -> RowResult + Send + Sync + 'static,
    ) {
        *self.script.lock().unwrap() = Box::new(script);
    }
}

/// A message of `row` to `topic`, its payload the row's.
pub(super) fn message(row: &OutboxRow, topic: &str) -> OutboundMessage {
    OutboundMessage {
        row: row.id.clone(),
        topic: topic.to_owned(),
        key: Some(row.aggregate_id.as_bytes().to_vec()),
        payload: Some(row.payload.clone()),
        headers: Vec::new(),
        partition: None,
    }
}

impl RowTransformer for ScriptedTransformer {
    async fn transform(&self, rows: Arc<[OutboxRow]>) -> Vec<RowResult> {
        if self.panic_once.swap(false, Ordering::SeqCst) {
            panic!("scripted transformer panic");
        }
        let mut results: Vec<RowResult> = {
            let script = self.script.lock().unwrap();
            rows.iter().map(&*script).collect()
        };
        let miscount = *self.miscount.lock().unwrap();
        if miscount < 0 {
            results.truncate(results.len().saturating_sub(miscount.unsigned_abs()));
        }
        for _ in 0..miscount.max(0) {
            results.push(Ok(Vec::new()));
        }
        results
    }

    fn record_publish(&self, tenant: &TenantId, delivered: usize, refused: usize) {
        self.publishes
            .lock()
            .unwrap()
            .push((tenant.as_str().to_owned(), delivered, refused));
    }
}

// ---------------------------------------------------------------------------------------------
// Sink

type Answer = Box<dyn Fn(&OutboundMessage) -> Result<(), SinkError> + Send + Sync>;

/// A sink that records every message it is asked to publish and answers as scripted.
pub(super) struct RecordingSink {
    pub published: Mutex<Vec<OutboundMessage>>,
    pub calls: AtomicUsize,
    answer: Answer,
    /// Never report: the batch waits forever.
    pub hang: bool,
}

impl RecordingSink {
    /// Acknowledges everything.
    pub(super) fn acking() -> Self {
        Self::answering(|_| Ok(()))
    }

    pub(super) fn answering(
        answer: impl Fn(&OutboundMessage) -> Result<(), SinkError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            published: Mutex::new(Vec::new()),
            calls: AtomicUsize::new(0),
            answer: Box::new(answer),
            hang: false,
        }
    }

    pub(super) fn hanging() -> Self {
        Self {
            hang: true,
            ..Self::acking()
        }
    }

    /// Messages published for row `id` (dead-letter copies included).
    pub(super) fn for_row(&self, id: i64) -> Vec<OutboundMessage> {
        self.published
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.row == OutboxId::Int(id))
            .cloned()
            .collect()
    }
}

/// A publish failure of `topic` for which `fault` is to blame.
pub(super) fn publish_error(topic: &str, fault: PublishFault) -> SinkError {
    SinkError::publish_failed(topic, format!("scripted {fault:?}"), fault)
}

impl Sink for RecordingSink {
    async fn publish(&self, messages: &[OutboundMessage]) -> Vec<Result<(), SinkError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.published
            .lock()
            .unwrap()
            .extend(messages.iter().cloned());
        if self.hang {
            std::future::pending::<()>().await;
        }
        messages.iter().map(|m| (self.answer)(m)).collect()
    }

    fn probe(&self, _timeout: Duration) -> Result<(), SinkError> {
        Ok(())
    }

    fn flush(&self, _timeout: Duration) -> Result<(), SinkError> {
        Ok(())
    }
}
