//! The relay loop: claim → transform → publish → mark, until shutdown.
//!
//! A process runs `relay.workers` of these loops at once, so one batch is claimed and
//! transformed while another waits for its acknowledgements or its commit; when to poll is
//! decided by the shared [`pacer::Pacer`]. A batch's rows stay locked by its open transaction
//! from the claim until the commit that marks them, so concurrent workers and relays never
//! publish the same row twice in normal operation. A crash after the broker acknowledged but
//! before the commit re-publishes the batch later: delivery is at-least-once.

mod dead_letter;
pub mod pacer;

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::message::Message;
use crate::outbox::{
    BatchOutcome, Claim, ClaimedBatch, Disposition, OutboxRow, OutboxStore, RowFailure, StoreError,
};
use crate::plugin::{RowTransformer, TransformFailure};
use crate::retry::RetryPolicy;
use crate::shutdown::Shutdown;
use crate::sink::{Sink, SinkError};
use pacer::{Fill, Pacer};

/// First pause after a database error; doubled per consecutive error up to
/// [`STORE_ERROR_MAX_PAUSE`], so an outage does not turn into a hot loop.
const STORE_ERROR_PAUSE: Duration = Duration::from_millis(250);
const STORE_ERROR_MAX_PAUSE: Duration = Duration::from_secs(10);

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
    pub messages: u64,
}

/// Live counters, shared by the workers and readable while the relay runs (progress).
#[derive(Debug, Default)]
pub struct Counters {
    batches: AtomicU64,
    rows_sent: AtomicU64,
    rows_failed: AtomicU64,
    rows_dead: AtomicU64,
    messages: AtomicU64,
}

impl Counters {
    fn add(&self, report: &BatchReport) {
        let add = |c: &AtomicU64, n: usize| c.fetch_add(n as u64, Ordering::Relaxed);
        add(&self.batches, usize::from(report.claimed > 0));
        add(&self.rows_sent, report.sent);
        add(&self.rows_failed, report.failed);
        add(&self.rows_dead, report.dead);
        add(&self.messages, report.messages);
    }

    pub fn snapshot(&self) -> RelayStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RelayStats {
            batches: get(&self.batches),
            rows_sent: get(&self.rows_sent),
            rows_failed: get(&self.rows_failed),
            rows_dead: get(&self.rows_dead),
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
    /// Rows put back untouched (their tenant's plugin was slow or busy): claimed again later.
    pub deferred: usize,
    pub messages: usize,
    /// First failure of the batch, for the log.
    pub first_error: Option<String>,
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
    /// back.
    pub async fn run(self: &Arc<Self>, shutdown: Shutdown) -> RelayStats {
        self.run_workers(shutdown, Mode::Continuous).await
    }

    /// Relays until a claim finds nothing due (or `shutdown` fires): `sluice drain`.
    pub async fn drain(self: &Arc<Self>, shutdown: Shutdown) -> RelayStats {
        self.run_workers(shutdown, Mode::Drain).await
    }

    async fn run_workers(self: &Arc<Self>, shutdown: Shutdown, mode: Mode) -> RelayStats {
        let workers: Vec<_> = (0..self.settings.workers.max(1))
            .map(|_| {
                let relay = Arc::clone(self);
                let shutdown = shutdown.clone();
                tokio::spawn(async move { relay.worker(shutdown, mode).await })
            })
            .collect();
        for worker in workers {
            if let Err(e) = worker.await {
                tracing::error!(error = %e, "relay worker failed");
            }
        }
        self.counters.snapshot()
    }

    /// One batch loop.
    async fn worker(&self, mut shutdown: Shutdown, mode: Mode) {
        let mut store_errors: u32 = 0;
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
            match outcome {
                Ok(report) => {
                    store_errors = 0;
                    self.counters.add(&report);
                    log_report(&report);
                    let fill = if report.claimed == 0 {
                        Fill::Empty
                    } else if report.claimed >= self.settings.batch_size {
                        Fill::Full
                    } else {
                        Fill::Partial
                    };
                    match mode {
                        Mode::Drain if fill == Fill::Empty => break,
                        Mode::Drain => {}
                        Mode::Continuous => {
                            self.pacer.record(fill);
                            if fill != Fill::Full {
                                self.pacer.wait_turn(&mut shutdown).await;
                            }
                        }
                    }
                }
                Err(e) => {
                    store_errors = store_errors.saturating_add(1);
                    let pause = store_error_pause(store_errors);
                    tracing::error!(error = %e, retry_in = ?pause, "batch failed; rolled back");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = shutdown.recv() => {}
                    }
                }
            }
        }
    }

    /// Claims, transforms, publishes and marks one batch.
    pub async fn run_batch(&self) -> Result<BatchReport, StoreError> {
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
        let claimed = claim.len();
        let Claim {
            batch,
            rows,
            rejected,
        } = claim;
        let rows: Arc<[OutboxRow]> = rows.into();
        let results = self.transformer.transform(Arc::clone(&rows)).await;

        let mut failed = rejected;
        let mut deferred = 0;
        // Rows that failed here, by index into `rows`, so dead ones can be dead-lettered.
        let mut failed_rows: Vec<usize> = Vec::new();
        let mut messages: Vec<Message> = Vec::new();
        // Rows that transformed fine, with the range of their messages in `messages`.
        let mut transformed: Vec<(usize, Range<usize>)> = Vec::new();
        for (index, result) in results.into_iter().enumerate() {
            match result {
                Ok(out) => {
                    let start = messages.len();
                    messages.extend(out);
                    transformed.push((index, start..messages.len()));
                }
                // Put back untouched: neither marked nor rescheduled, claimable again at once.
                Err(TransformFailure::Deferred(_)) => deferred += 1,
                Err(failure) => {
                    let permanent = matches!(failure, TransformFailure::Permanent { .. });
                    let mut row_failure =
                        self.failure(&rows[index], failure.to_string(), permanent);
                    if let TransformFailure::Paused { remaining, .. } = failure {
                        // Not the row's fault and not an attempt: wait out the cool-down.
                        row_failure.disposition = Disposition::Wait(remaining);
                    }
                    failed.push(row_failure);
                    failed_rows.push(index);
                }
            }
        }

        let published = self.publish(&messages).await;
        let mut sent = Vec::with_capacity(transformed.len());
        for (index, range) in transformed {
            // A row counts as sent only when every one of its messages was acknowledged.
            let missing = SinkError::Publish {
                topic: String::new(),
                message: "sink returned no delivery report".into(),
                transient: true,
            };
            let error = match published.get(range) {
                Some(reports) => reports.iter().find_map(|r| r.as_ref().err()),
                None => Some(&missing),
            };
            match error {
                None => sent.push(rows[index].id.clone()),
                Some(e) => {
                    let mut failure = self.failure(&rows[index], e.to_string(), false);
                    if matches!(
                        e,
                        SinkError::Publish {
                            transient: true,
                            ..
                        }
                    ) {
                        failure.disposition = self.settings.retry.after_transient_failure();
                    }
                    failed.push(failure);
                    failed_rows.push(index);
                }
            }
        }
        if let Some(topic) = &self.settings.dead_letter_topic {
            dead_letter::publish(&self.sink, topic, &rows, &failed_rows, &mut failed).await;
        }

        let report = BatchReport {
            claimed,
            sent: sent.len(),
            failed: failed.len(),
            deferred,
            dead: failed
                .iter()
                .filter(|f| f.disposition == Disposition::Dead)
                .count(),
            messages: messages.len(),
            first_error: failed.first().map(|f| format!("row {}: {}", f.id, f.error)),
        };
        batch.complete(BatchOutcome { sent, failed }).await?;
        Ok(report)
    }

    fn failure(&self, row: &OutboxRow, error: String, permanent: bool) -> RowFailure {
        RowFailure {
            id: row.id.clone(),
            error,
            disposition: self.settings.retry.after_failure(row.attempts, permanent),
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

fn log_report(report: &BatchReport) {
    if report.claimed == 0 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_error_pause_backs_off() {
        assert_eq!(store_error_pause(1), STORE_ERROR_PAUSE);
        assert_eq!(store_error_pause(2), STORE_ERROR_PAUSE * 2);
        assert_eq!(store_error_pause(100), STORE_ERROR_MAX_PAUSE);
    }
}
