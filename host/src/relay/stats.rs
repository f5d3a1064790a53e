//! What the relay did: per batch ([`BatchReport`]) and over its lifetime ([`Counters`],
//! readable while it runs, and [`RelayStats`], a snapshot).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one relay's lifetime.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RelayStats {
    /// Batches that claimed at least one row.
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
    /// Messages handed to the producer (acknowledged or not).
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
    pub(super) fn add(&self, report: &BatchReport) {
        let add = |c: &AtomicU64, n: usize| c.fetch_add(n as u64, Ordering::Relaxed);
        add(&self.batches, usize::from(report.claimed > 0));
        add(&self.rows_sent, report.sent);
        add(&self.rows_failed, report.failed);
        add(&self.rows_dead, report.dead);
        add(&self.rows_unsettled, report.unsettled);
        add(&self.messages, report.messages);
    }

    /// The counts so far.
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
    /// Rows claimed, those that could not be decoded included.
    pub claimed: usize,
    /// Rows marked sent (including rows the plugin filtered out).
    pub sent: usize,
    /// Rows rescheduled or dead-lettered after a failure.
    pub failed: usize,
    /// Of `failed`, rows dead-lettered.
    pub dead: usize,
    /// Rows put back untouched (their tenant's plugin was slow or busy, or the row is held
    /// back): claimed again later.
    pub deferred: usize,
    /// Messages handed to the producer (acknowledged or not).
    pub messages: usize,
    /// Rows whose outcome could not be recorded after the commit failed.
    pub unsettled: usize,
    /// First failure of the batch, for the log.
    pub first_error: Option<String>,
    /// Set when the batch's commit failed after publishing and its outcome was recorded (as
    /// far as possible) in a fresh transaction; `sent`/`failed` then count what was recorded.
    pub commit_error: Option<String>,
}

pub(super) fn log_report(report: &BatchReport) {
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
