//! The relay loop: claim → transform → publish → mark, until shutdown.
//!
//! A process runs `relay.workers` of these loops at once, so one batch is claimed and
//! transformed while another waits for its acknowledgements or its commit; when to poll is
//! decided by the shared [`pacer::Pacer`]. A batch's rows stay locked by its open transaction
//! from the claim until the commit that marks them, so concurrent workers and relays never
//! publish the same row twice in normal operation. A crash after the broker acknowledged but
//! before the commit re-publishes the batch later: delivery is at-least-once.
//!
//! - [`outcome`]: what became of each row of a batch
//! - [`dead_letter`]: copies of rows that go dead
//! - [`held_back`]: rows whose outcome the database refused to record
//! - [`pacer`]: when to poll

mod dead_letter;
mod held_back;
mod outcome;
pub mod pacer;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::message::Message;
use crate::outbox::{
    BatchOutcome, Claim, ClaimedBatch, Disposition, OutboxId, OutboxRow, OutboxStore, RowFailure,
    Settlement, StoreError,
};
use crate::plugin::RowTransformer;
use crate::retry::RetryPolicy;
use crate::shutdown::{self, Shutdown};
use crate::sink::{Sink, SinkError};
use crate::text::{MAX_LOGGED, bounded};
use held_back::HeldBack;
use outcome::Outcomes;
pub use outcome::ResultCountMismatch;
use pacer::{Fill, Pacer};

/// First pause after a failed batch (a database error, a failed commit); doubled per
/// consecutive failure up to [`STORE_ERROR_MAX_PAUSE`], so an outage does not turn into a hot
/// loop, nor a commit that keeps failing into a stream of duplicates.
const STORE_ERROR_PAUSE: Duration = Duration::from_millis(250);
const STORE_ERROR_MAX_PAUSE: Duration = Duration::from_secs(10);
/// Pauses before settling again the rows a settling skipped (see
/// [`Relay::settle_with_retries`]).
const SETTLE_RETRY_PAUSES: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(500),
];

/// Loop settings, from `[relay]`.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub batch_size: usize,
    /// Concurrent batch loops.
    pub workers: usize,
    /// Wait after a partial batch, and the first back-off step after an empty poll.
    pub min_poll_interval: Duration,
    /// Longest wait between polls of an empty outbox.
    pub poll_interval: Duration,
    pub retry: RetryPolicy,
    /// Topic receiving a copy of every row that goes dead, if any.
    pub dead_letter_topic: Option<String>,
    /// After a stop request, how long the batch in hand may take before it is rolled back.
    pub shutdown_timeout: Duration,
}

/// Why the relay stopped without being asked to. A supervisor should restart the process.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    #[error("a relay worker panicked: {0}")]
    WorkerPanicked(String),
    #[error("a relay worker ended before a stop was requested")]
    WorkerEnded,
}

/// Why one batch failed as a whole. Its transaction was rolled back: nothing of it is
/// recorded, and (except after a failed commit, which is settled separately) nothing of it was
/// published.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    ResultCount(#[from] ResultCountMismatch),
}

/// Completes `timeout` after the stop request.
async fn deadline_after(mut shutdown: Shutdown, timeout: Duration) {
    shutdown.recv().await;
    tokio::time::sleep(timeout).await;
}

/// Counters of one relay's lifetime.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RelayStats {
    pub batches: u64,
    /// Rows marked sent (including rows the plugin filtered out).
    pub rows_sent: u64,
    /// Rows rescheduled or dead-lettered after a failure.
    pub rows_failed: u64,
    /// Rows dead-lettered.
    pub rows_dead: u64,
    /// Rows whose outcome could not be recorded after a failed commit (they stay unsent and
    /// are published again later).
    pub rows_unsettled: u64,
    pub messages: u64,
}

/// Live counters, shared by the workers and readable while the relay runs (progress).
#[derive(Debug, Default)]
pub struct Counters {
    batches: AtomicU64,
    rows_sent: AtomicU64,
    rows_failed: AtomicU64,
    rows_dead: AtomicU64,
    rows_unsettled: AtomicU64,
    messages: AtomicU64,
}

impl Counters {
    fn add(&self, report: &BatchReport) {
        let add = |c: &AtomicU64, n: usize| c.fetch_add(n as u64, Ordering::Relaxed);
        add(&self.batches, usize::from(report.claimed > 0));
        add(&self.rows_sent, report.sent);
        add(&self.rows_failed, report.failed);
        add(&self.rows_dead, report.dead);
        add(&self.rows_unsettled, report.unsettled);
        add(&self.messages, report.messages);
    }

    pub fn snapshot(&self) -> RelayStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RelayStats {
            batches: get(&self.batches),
            rows_sent: get(&self.rows_sent),
            rows_failed: get(&self.rows_failed),
            rows_dead: get(&self.rows_dead),
            rows_unsettled: get(&self.rows_unsettled),
            messages: get(&self.messages),
        }
    }
}

/// What one batch did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchReport {
    pub claimed: usize,
    pub sent: usize,
    pub failed: usize,
    pub dead: usize,
    /// Rows put back untouched (their tenant's plugin was slow or busy, or the row is held
    /// back): claimed again later.
    pub deferred: usize,
    pub messages: usize,
    /// Rows whose outcome could not be recorded after the commit failed.
    pub unsettled: usize,
    /// First failure of the batch, for the log.
    pub first_error: Option<String>,
    /// Set when the batch's commit failed after publishing and its outcome was recorded (as
    /// far as possible) in a fresh transaction; `sent`/`failed` then count what was recorded.
    pub commit_error: Option<String>,
}

/// Whether the loops run until stopped, or until nothing is due (`sluice drain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Continuous,
    Drain,
}

/// The relay: a store, a transformer and a sink, wired by the loop.
pub struct Relay<S, T, K> {
    store: S,
    transformer: T,
    sink: K,
    settings: RelaySettings,
    pacer: Arc<Pacer>,
    counters: Arc<Counters>,
    held_back: HeldBack,
}

impl<S: OutboxStore, T: RowTransformer, K: Sink> Relay<S, T, K> {
    pub fn new(store: S, transformer: T, sink: K, settings: RelaySettings) -> Self {
        let pacer = Arc::new(Pacer::new(
            settings.min_poll_interval,
            settings.poll_interval,
        ));
        Self {
            store,
            transformer,
            sink,
            settings,
            pacer,
            counters: Arc::default(),
            held_back: HeldBack::default(),
        }
    }

    pub fn sink(&self) -> &K {
        &self.sink
    }

    /// The poll clock; [`Pacer::wake`] makes an idle relay poll at once (LISTEN/NOTIFY).
    pub fn pacer(&self) -> Arc<Pacer> {
        Arc::clone(&self.pacer)
    }

    /// The live counters (for progress reports).
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(&self.counters)
    }

    /// Relays batches with `relay.workers` loops until `shutdown` fires. Each loop's batch in
    /// hand may finish within `shutdown_timeout`; after that it is dropped, which rolls it
    /// back. A loop that panics or ends on its own stops the others the same way and makes
    /// this return an error.
    pub async fn run(self: &Arc<Self>, shutdown: Shutdown) -> Result<RelayStats, RelayError> {
        self.run_workers(shutdown, Mode::Continuous).await
    }

    /// Relays until a claim finds nothing due (or `shutdown` fires): `sluice drain`.
    pub async fn drain(self: &Arc<Self>, shutdown: Shutdown) -> Result<RelayStats, RelayError> {
        self.run_workers(shutdown, Mode::Drain).await
    }

    async fn run_workers(
        self: &Arc<Self>,
        shutdown: Shutdown,
        mode: Mode,
    ) -> Result<RelayStats, RelayError> {
        // The workers stop on the caller's request, or when one of them failed.
        let (stop_workers, workers_stop) = shutdown::channel();
        let forward = {
            let stop_workers = stop_workers.clone();
            let mut requested = shutdown.clone();
            tokio::spawn(async move {
                requested.recv().await;
                stop_workers.trigger();
            })
        };
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..self.settings.workers.max(1) {
            let relay = Arc::clone(self);
            let stop = workers_stop.clone();
            workers.spawn(async move { relay.worker(stop, mode).await });
        }
        let mut failure = None;
        while let Some(ended) = workers.join_next().await {
            let error = match ended {
                Err(e) if e.is_panic() => Some(RelayError::WorkerPanicked(panic_message(e))),
                Err(e) => Some(RelayError::WorkerPanicked(e.to_string())),
                Ok(()) if mode == Mode::Continuous && !workers_stop.is_shutdown() => {
                    Some(RelayError::WorkerEnded)
                }
                Ok(()) => None,
            };
            if let Some(error) = error {
                tracing::error!(error = %error, "relay worker failed; stopping the others");
                stop_workers.trigger();
                failure.get_or_insert(error);
            }
        }
        forward.abort();
        match failure {
            Some(error) => Err(error),
            None => Ok(self.counters.snapshot()),
        }
    }

    /// One batch loop.
    async fn worker(&self, mut shutdown: Shutdown, mode: Mode) {
        // Failed batches in a row, for the pause before the next one.
        let mut failures: u32 = 0;
        while !shutdown.is_shutdown() {
            let batch = self.run_batch();
            tokio::pin!(batch);
            let outcome = tokio::select! {
                outcome = &mut batch => outcome,
                // Dropping the batch drops its transaction: PostgreSQL rolls it back and the
                // rows are claimed again later (possibly re-published: at-least-once).
                _ = deadline_after(shutdown.clone(), self.settings.shutdown_timeout) => {
                    tracing::warn!(
                        shutdown_timeout = ?self.settings.shutdown_timeout,
                        "batch did not finish within relay.shutdown_timeout; rolling it back"
                    );
                    break;
                }
            };
            let failed = match outcome {
                Ok(report) => {
                    self.counters.add(&report);
                    log_report(&report);
                    match report.commit_error {
                        Some(_) => true,
                        None => {
                            failures = 0;
                            if self.pace(&report, mode, &mut shutdown).await {
                                break;
                            }
                            false
                        }
                    }
                }
                Err(e) => {
                    let pause = store_error_pause(failures.saturating_add(1));
                    tracing::error!(error = %e, retry_in = ?pause, "batch failed; rolled back");
                    true
                }
            };
            if failed {
                failures = failures.saturating_add(1);
                tokio::select! {
                    _ = tokio::time::sleep(store_error_pause(failures)) => {}
                    _ = shutdown.recv() => {}
                }
            }
        }
    }

    /// Waits as the pacer says after a batch; returns whether a drain is done.
    async fn pace(&self, report: &BatchReport, mode: Mode, shutdown: &mut Shutdown) -> bool {
        let fill = fill(report, self.settings.batch_size);
        match mode {
            Mode::Drain => fill == Fill::Empty,
            Mode::Continuous => {
                self.pacer.record(fill);
                if fill != Fill::Full {
                    self.pacer.wait_turn(shutdown).await;
                }
                false
            }
        }
    }

    /// Claims, transforms, publishes and marks one batch.
    pub async fn run_batch(&self) -> Result<BatchReport, BatchError> {
        let paused = self.transformer.paused_tenants();
        // After an empty poll, look before claiming: one autocommit statement instead of a
        // transaction, which keeps an idle relay's load at one query per poll.
        if self.pacer.idle() && !self.store.has_due(&paused).await? {
            return Ok(BatchReport::default());
        }
        let claim = self.store.claim(self.settings.batch_size, &paused).await?;
        if claim.is_empty() {
            claim.batch.abandon().await?;
            return Ok(BatchReport::default());
        }
        let Claim {
            batch,
            rows,
            rejected,
        } = claim;
        // Rows of another worker's batch whose commit failed, unlocked until it settles them:
        // hand them back at once so the settling can lock them.
        if self.held_back.any_committing(
            rows.iter()
                .map(|r| &r.id)
                .chain(rejected.iter().map(|f| &f.id)),
        ) {
            let claimed = rows.len() + rejected.len();
            batch.abandon().await?;
            tracing::debug!(
                claimed,
                "claimed rows whose commit is being settled; put back"
            );
            return Ok(BatchReport {
                claimed,
                deferred: claimed,
                ..BatchReport::default()
            });
        }
        let now = Instant::now();
        let (held, rows): (Vec<OutboxRow>, Vec<OutboxRow>) = rows
            .into_iter()
            .partition(|r| self.held_back.is_held(&r.id, now));
        let rows: Arc<[OutboxRow]> = rows.into();
        let results = if rows.is_empty() {
            Vec::new()
        } else {
            self.transformer.transform(Arc::clone(&rows)).await
        };
        let mut outcomes = match Outcomes::build(&rows, results, &self.settings.retry) {
            Ok(outcomes) => outcomes,
            Err(mismatch) => {
                // Dropping the batch would roll it back as well; abandoning does it now.
                if let Err(e) = batch.abandon().await {
                    tracing::warn!(error = %e, "rolling back the batch failed");
                }
                return Err(mismatch.into());
            }
        };

        let reports = self.publish(outcomes.messages()).await;
        outcomes.apply_reports(reports, &self.settings.retry);
        self.record_publish(&outcomes);
        if let Some(topic) = &self.settings.dead_letter_topic {
            dead_letter::publish(&self.sink, topic, &mut outcomes).await;
        }

        let mut report = outcomes.report(&rejected);
        report.claimed += held.len();
        report.deferred += held.len();
        if !held.is_empty() {
            tracing::debug!(rows = held.len(), "held-back rows put back untouched");
        }
        let outcome = outcomes.store_outcome(&rejected);
        let _committing = self.held_back.committing_while(
            outcome
                .sent
                .iter()
                .chain(outcome.failed.iter().map(|f| &f.id))
                .cloned()
                .collect(),
        );
        match batch.complete(outcome).await {
            Ok(()) => {
                self.held_back.release(outcomes.recorded_ids());
                Ok(report)
            }
            Err(e) => Ok(self.settle(&e, &outcomes, &rejected, report).await),
        }
    }

    /// After the commit of a published batch failed: records its outcome in a fresh
    /// transaction, so the batch is not claimed and published again as a whole, and holds back
    /// the rows the database refused to record.
    async fn settle(
        &self,
        commit_error: &StoreError,
        outcomes: &Outcomes<'_>,
        rejected: &[RowFailure],
        mut report: BatchReport,
    ) -> BatchReport {
        let outcome = outcomes.store_outcome(rejected);
        let rows = outcome.sent.len() + outcome.failed.len();
        report.commit_error = Some(commit_error.to_string());
        let settlement = match self.settle_with_retries(&outcome).await {
            Ok(settlement) => settlement,
            Err(e) => {
                tracing::error!(commit_error = %commit_error, error = %e, rows,
                    "batch commit failed after publishing, and its outcome could not be recorded either; its rows stay unsent and will be published again");
                report.sent = 0;
                report.failed = 0;
                report.dead = 0;
                report.unsettled = rows;
                return report;
            }
        };
        let now = Instant::now();
        for (id, error) in &settlement.refused {
            let hold = self.held_back.hold(id, now);
            tracing::error!(row = %id, error = %bounded(error, MAX_LOGGED), hold = ?hold,
                "the database refused to record this row's outcome; holding it back, it is published again after the hold");
        }
        self.held_back
            .release(settlement.marked.iter().chain(&settlement.rescheduled));
        let dead: HashSet<&OutboxId> = outcome
            .failed
            .iter()
            .filter(|f| f.disposition == Disposition::Dead)
            .map(|f| &f.id)
            .collect();
        report.sent = settlement.marked.len();
        report.failed = settlement.rescheduled.len();
        report.dead = settlement
            .rescheduled
            .iter()
            .filter(|id| dead.contains(id))
            .count();
        report.unsettled = settlement.refused.len() + settlement.skipped.len();
        tracing::warn!(
            commit_error = %commit_error,
            marked = settlement.marked.len(),
            rescheduled = settlement.rescheduled.len(),
            skipped = settlement.skipped.len(),
            refused = settlement.refused.len(),
            "batch commit failed after publishing; its outcome was recorded in a fresh transaction"
        );
        report
    }

    /// [`OutboxStore::settle`], then again for the rows it skipped, a few times: a skipped row
    /// may still be locked by the failed transaction (its rollback is not instantaneous) or
    /// by another worker of this process that claimed it in between and is putting it back.
    /// Rows that stay skipped are another relay's, or were sent meanwhile.
    async fn settle_with_retries(&self, outcome: &BatchOutcome) -> Result<Settlement, StoreError> {
        let mut settlement = self.store.settle(outcome).await?;
        for pause in SETTLE_RETRY_PAUSES {
            if settlement.skipped.is_empty() {
                break;
            }
            tokio::time::sleep(pause).await;
            let skipped: HashSet<&OutboxId> = settlement.skipped.iter().collect();
            let retry = BatchOutcome {
                sent: outcome
                    .sent
                    .iter()
                    .filter(|id| skipped.contains(id))
                    .cloned()
                    .collect(),
                failed: outcome
                    .failed
                    .iter()
                    .filter(|f| skipped.contains(&f.id))
                    .cloned()
                    .collect(),
            };
            let Ok(again) = self.store.settle(&retry).await else {
                break;
            };
            settlement.marked.extend(again.marked);
            settlement.rescheduled.extend(again.rescheduled);
            settlement.refused.extend(again.refused);
            settlement.skipped = again.skipped;
        }
        Ok(settlement)
    }

    /// Tells each tenant's health what publishing did with its rows.
    fn record_publish(&self, outcomes: &Outcomes<'_>) {
        for (tenant, tally) in outcomes.publish_tallies() {
            self.transformer
                .record_publish(tenant, tally.delivered, tally.refused);
        }
    }

    async fn publish(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        if messages.is_empty() {
            Vec::new()
        } else {
            self.sink.publish(messages).await
        }
    }
}

/// How full a batch was, for the pacer: a batch whose rows were all put back did no work.
fn fill(report: &BatchReport, batch_size: usize) -> Fill {
    if report.claimed == report.deferred {
        Fill::Empty
    } else if report.claimed >= batch_size {
        Fill::Full
    } else {
        Fill::Partial
    }
}

fn panic_message(error: tokio::task::JoinError) -> String {
    let payload = error.into_panic();
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

fn log_report(report: &BatchReport) {
    // A batch whose commit failed was logged when its outcome was settled.
    if report.claimed == 0 || report.commit_error.is_some() {
        return;
    }
    match &report.first_error {
        None => tracing::debug!(
            claimed = report.claimed,
            sent = report.sent,
            messages = report.messages,
            "batch committed"
        ),
        Some(first) => tracing::warn!(
            claimed = report.claimed,
            sent = report.sent,
            failed = report.failed,
            dead = report.dead,
            first_error = %first,
            "batch committed with failed rows rescheduled or dead-lettered"
        ),
    }
}

fn store_error_pause(consecutive: u32) -> Duration {
    let exp = consecutive.saturating_sub(1).min(16);
    STORE_ERROR_PAUSE
        .saturating_mul(1 << exp)
        .min(STORE_ERROR_MAX_PAUSE)
}
