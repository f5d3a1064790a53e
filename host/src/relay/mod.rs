//! The relay loop: claim → transform → publish → mark, until shutdown.
//!
//! A process runs `relay.workers` of these loops at once, so one batch is claimed and
//! transformed while another waits for its acknowledgements or its commit; when to poll is
//! decided by the shared [`pacer::Pacer`]. A batch's rows stay locked by its open transaction
//! (SQLite: leased to it by a committed claim) from the claim until the commit that marks
//! them, so concurrent workers and relays never publish the same row twice in normal
//! operation. A crash after the broker acknowledged but
//! before the commit re-publishes the batch later: delivery is at-least-once.
//!
//! - [`batch`]: one batch, start to end (and settling a failed commit)
//! - [`batch_metrics`]: what a batch records into the metrics
//! - [`concurrency`]: how many of the loops may have a batch in flight
//! - [`outcome`]: what became of each row of a batch
//! - [`dead_letter`]: copies of rows that go dead
//! - [`held_back`]: rows whose outcome the database refused to record
//! - [`pacer`]: when to poll
//! - [`retry`]: how long a failed row waits, and when it is dead
//! - [`settings`], [`stats`]: `[relay]` and what the relay did

mod batch;
mod batch_metrics;
pub mod concurrency;
mod dead_letter;
mod held_back;
mod outcome;
pub mod pacer;
pub mod retry;
mod settings;
mod stats;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::encoding::Encoder;
use crate::plugin::RowTransformer;
use crate::shutdown::{self, Shutdown};
use crate::sink::Sink;
use crate::store::{OutboxStore, StoreError};
use crate::telemetry::Metrics;
use crate::trace::Tracing;
use concurrency::ConcurrencyLimit;
use held_back::HeldBack;
pub use outcome::ResultCountMismatch;
use pacer::{Fill, Pacer};
pub use retry::{RetryPolicy, RetrySettings};
pub use settings::{
    DEFAULT_BATCH_SIZE, DEFAULT_MIN_POLL_INTERVAL, DEFAULT_POLL_INTERVAL, DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_WORKERS, MAX_WORKERS, RelaySettings,
};
use stats::log_report;
pub use stats::{BatchReport, Counters, RelayStats};

/// First pause after a failed batch (a database error, a failed commit); doubled per
/// consecutive failure up to [`STORE_ERROR_MAX_PAUSE`], so an outage does not turn into a hot
/// loop, nor a commit that keeps failing into a stream of duplicates.
const STORE_ERROR_PAUSE: Duration = Duration::from_millis(250);
const STORE_ERROR_MAX_PAUSE: Duration = Duration::from_secs(10);

/// Why the relay stopped without being asked to. A supervisor should restart the process.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    /// A worker task panicked (or was cancelled); the panic message.
    #[error("a relay worker panicked: {0}")]
    WorkerPanicked(String),
    /// A worker loop returned on its own, with no stop requested.
    #[error("a relay worker ended before a stop was requested")]
    WorkerEnded,
}

/// Why one batch failed as a whole. Its claim was given up (PostgreSQL, MySQL: the transaction
/// rolled back; SQLite: the leases ended, or run out): nothing of it is recorded, and (except
/// after a failed commit, which is settled separately) nothing of it was published.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The database failed (claim, mark or commit).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The transformer's results did not match the rows one to one.
    #[error(transparent)]
    ResultCount(#[from] ResultCountMismatch),
}

/// Completes `timeout` after the stop request.
async fn deadline_after(mut shutdown: Shutdown, timeout: Duration) {
    shutdown.recv().await;
    tokio::time::sleep(timeout).await;
}

/// Whether the loops run until stopped, or until nothing is due (`sluice drain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Continuous,
    Drain,
}

/// The relay: a store, a transformer and a sink, wired by the loop.
pub struct Relay<S, T, K> {
    /// Shared with the maintenance services and the metrics sampler.
    store: Arc<S>,
    transformer: T,
    sink: K,
    settings: RelaySettings,
    pacer: Arc<Pacer>,
    /// Slots for batches in flight.
    concurrency: ConcurrencyLimit,
    counters: Arc<Counters>,
    held_back: HeldBack,
    /// Where batches record what they did, when metrics are on.
    metrics: Option<Recording>,
    /// Encodes messages whose tenant set `key_format`/`value_format` (`[schema_registry]`).
    schemas: Option<Arc<dyn Encoder>>,
    /// Passes rows' trace contexts on; exports spans with `[tracing]`.
    tracing: Arc<Tracing>,
}

/// The relay's metrics and the `mode` label of its mark timings.
struct Recording {
    metrics: Arc<Metrics>,
    mark_mode: &'static str,
}

/// Counts a worker loop as running until it ends, however it ends (a panic included).
struct WorkerRunning<'a>(Option<&'a Metrics>);

impl<'a> WorkerRunning<'a> {
    fn start(metrics: Option<&'a Metrics>) -> Self {
        if let Some(m) = metrics {
            m.health.worker_started();
        }
        Self(metrics)
    }
}

impl Drop for WorkerRunning<'_> {
    fn drop(&mut self) {
        if let Some(m) = self.0 {
            m.health.worker_ended();
        }
    }
}

/// Marks worker `.1`'s batch as in hand from its claim until dropped (the batch finished or was
/// abandoned): the heartbeat `/healthz` reads to find a worker stuck in one batch.
struct BatchInHand<'a>(Option<&'a Metrics>, usize);

impl<'a> BatchInHand<'a> {
    fn start(metrics: Option<&'a Metrics>, worker: usize) -> Self {
        if let Some(m) = metrics {
            m.health.batch_in_hand(worker, Some(Instant::now()));
        }
        Self(metrics, worker)
    }
}

impl Drop for BatchInHand<'_> {
    fn drop(&mut self) {
        if let Some(m) = self.0 {
            m.health.batch_in_hand(self.1, None);
        }
    }
}

impl<S: OutboxStore, T: RowTransformer, K: Sink> Relay<S, T, K> {
    /// A relay with its own poll clock and concurrency limit, without metrics.
    pub fn new(store: Arc<S>, transformer: T, sink: K, settings: RelaySettings) -> Self {
        let pacer = Arc::new(Pacer::new(
            settings.min_poll_interval,
            settings.poll_interval,
        ));
        let workers = settings.workers.max(1);
        let concurrency = if settings.adaptive_concurrency {
            ConcurrencyLimit::adaptive(workers)
        } else {
            ConcurrencyLimit::fixed(workers)
        };
        Self {
            store,
            transformer,
            sink,
            settings,
            pacer,
            concurrency,
            counters: Arc::default(),
            held_back: HeldBack::default(),
            metrics: None,
            schemas: None,
            tracing: Arc::default(),
        }
    }

    /// Passes trace contexts on and exports spans as `tracing` says (by default contexts are
    /// passed on and nothing is exported).
    pub fn with_tracing(mut self, tracing: Arc<Tracing>) -> Self {
        self.tracing = tracing;
        self
    }

    /// Encodes messages against `[schema_registry]` schemas before publishing.
    pub fn with_schemas(mut self, schemas: Arc<dyn Encoder>) -> Self {
        self.schemas = Some(schemas);
        self
    }

    /// Records what the relay does into `metrics`; `mark_mode` labels the mark timings
    /// (`delete` or `published_at`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>, mark_mode: &'static str) -> Self {
        self.metrics = Some(Recording { metrics, mark_mode });
        self
    }

    fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_ref().map(|m| &*m.metrics)
    }

    /// The sink messages are published to (flushed at exit).
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
    /// hand may finish within `shutdown_timeout`; after that it is dropped, which gives up its
    /// claim unrecorded (see the worker loop). A loop that panics or ends on its own stops the others the same way and makes
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
        for index in 0..self.settings.workers.max(1) {
            let relay = Arc::clone(self);
            let stop = workers_stop.clone();
            workers.spawn(async move { relay.worker(index, stop, mode).await });
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

    /// One batch loop; `index` tells it from the others in the metrics.
    async fn worker(&self, index: usize, mut shutdown: Shutdown, mode: Mode) {
        let _running = WorkerRunning::start(self.metrics());
        if let Some(m) = self.metrics() {
            m.relay.batch_concurrency(self.concurrency.limit());
        }
        // Failed batches in a row, for the pause before the next one.
        let mut failures: u32 = 0;
        while !shutdown.is_shutdown() {
            let slot = tokio::select! {
                slot = self.concurrency.acquire() => slot,
                _ = shutdown.recv() => break,
            };
            let in_hand = BatchInHand::start(self.metrics(), index);
            let batch = self.run_batch();
            tokio::pin!(batch);
            let outcome = tokio::select! {
                outcome = &mut batch => outcome,
                // Dropping the batch gives up its claim with nothing recorded: on PostgreSQL
                // and MySQL its transaction rolls back; on SQLite the claim is a committed
                // lease, so the rows wait until it runs out (`database.lease`). Either way they
                // are claimed again later (possibly re-published: at-least-once).
                _ = deadline_after(shutdown.clone(), self.settings.shutdown_timeout) => {
                    tracing::warn!(
                        shutdown_timeout = ?self.settings.shutdown_timeout,
                        "batch did not finish within relay.shutdown_timeout; rolling it back"
                    );
                    break;
                }
            };
            drop(in_hand);
            let failed = match outcome {
                Ok(report) => {
                    slot.record(
                        report.commit_error.is_none()
                            && report.deferred == 0
                            && report.claimed >= self.settings.batch_size,
                    );
                    if let Some(m) = self.metrics() {
                        m.relay.batch_concurrency(self.concurrency.limit());
                    }
                    self.counters.add(&report);
                    log_report(&report);
                    match report.commit_error {
                        Some(_) => true,
                        None => {
                            failures = 0;
                            // The slot is kept while pacing: only the loops the limit lets
                            // run take turns polling, so a partly busy outbox is polled by
                            // as many loops as the limit allows, each after its wait, not
                            // by every idle loop in a row.
                            let done = self.pace(&report, mode, &mut shutdown).await;
                            drop(slot);
                            if done {
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
                // Any slot was dropped with the outcome: other loops run during the pause.
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
                if fill != Fill::Full
                    && let Some(cause) = self.pacer.wait_turn(shutdown).await
                    && let Some(m) = self.metrics()
                {
                    m.relay.poll_woken(cause);
                }
                false
            }
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

fn store_error_pause(consecutive: u32) -> Duration {
    let exp = consecutive.saturating_sub(1).min(16);
    STORE_ERROR_PAUSE
        .saturating_mul(1 << exp)
        .min(STORE_ERROR_MAX_PAUSE)
}
