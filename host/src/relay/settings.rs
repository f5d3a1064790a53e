//! The loop's settings (`[relay]`): batch size, workers, polling, shutdown; with their
//! defaults and the reasons for them.

use std::time::Duration;

use super::retry::RetryPolicy;
use crate::problem::Problem;

/// Rows claimed per transaction. Large enough to amortise the claim/mark round trips, small
/// enough that a batch's transaction stays short.
pub const DEFAULT_BATCH_SIZE: usize = 500;
/// Largest `relay.batch_size`: one transaction holds this many row locks while it waits for
/// the broker.
pub(super) const MAX_BATCH_SIZE: usize = 100_000;
/// Longest wait between polls of an empty outbox: the idle load is one cheap query per
/// interval, and a row inserted into an idle outbox (without NOTIFY) waits at most this long.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Wait after a poll that found some rows but not a full batch, and the first step of the
/// back-off after an empty poll. Measured (docs/benchmarks.md): 5 ms keeps the insert →
/// publish latency at 1,000 rows/s well under 10 ms at p50 while an idle relay backs off to
/// `poll_interval` within about 2.5 s.
pub const DEFAULT_MIN_POLL_INTERVAL: Duration = Duration::from_millis(5);
/// Most batches in flight per process. With adaptive concurrency (the default) the relay runs
/// between 1 and this many, as batch times show ([`super::concurrency`]); measured on 2 cores
/// (docs/benchmarks.md) it settles around 3–4 while a backlog drains, and beyond about 6 fixed
/// batches the claims slow each other down. Each holds a database connection while in flight.
pub const DEFAULT_WORKERS: usize = 8;
/// Most concurrent batches a process may run (each holds a database connection).
pub const MAX_WORKERS: usize = 64;
/// How long the batch in hand may take after SIGTERM before it is given up unrecorded; covers the
/// producer's default `message.timeout.ms` of 30 s.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Loop settings, from `[relay]`.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Rows claimed per transaction.
    pub batch_size: usize,
    /// Batch loops: the most batches in flight at once.
    pub workers: usize,
    /// Whether the batches in flight follow the pipeline between 1 and `workers`
    /// ([`super::concurrency`]) rather than all `workers` running.
    pub adaptive_concurrency: bool,
    /// Wait after a partial batch, and the first back-off step after an empty poll.
    pub min_poll_interval: Duration,
    /// Longest wait between polls of an empty outbox.
    pub poll_interval: Duration,
    /// How long failed rows wait, and when they are dead.
    pub retry: RetryPolicy,
    /// Topic receiving a copy of every row that goes dead, if any.
    pub dead_letter_topic: Option<String>,
    /// The broker `dead_letter_topic` is on.
    pub dead_letter_broker: crate::model::Broker,
    /// After a stop request, how long the batch in hand may take before it is given up
    /// unrecorded (its transaction rolled back; on SQLite, its lease left to run out).
    pub shutdown_timeout: Duration,
}

impl RelaySettings {
    /// Problems with these settings, at their `relay.` keys.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            problems.push(Problem::new(
                "relay.batch_size",
                format!(
                    "must be between 1 and {MAX_BATCH_SIZE}, got {}",
                    self.batch_size
                ),
            ));
        }
        if self.workers == 0 || self.workers > MAX_WORKERS {
            problems.push(Problem::new(
                "relay.workers",
                format!("must be between 1 and {MAX_WORKERS}, got {}", self.workers),
            ));
        }
        if self.poll_interval.is_zero() {
            problems.push(Problem::new(
                "relay.poll_interval",
                "must be greater than 0",
            ));
        }
        if self.min_poll_interval.is_zero() || self.min_poll_interval > self.poll_interval {
            problems.push(Problem::new(
                "relay.min_poll_interval",
                "must be greater than 0 and not longer than relay.poll_interval",
            ));
        }
        problems
    }
}
