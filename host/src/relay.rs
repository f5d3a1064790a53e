//! The relay loop: claim → transform → publish → mark, until shutdown.
//!
//! A batch's rows stay locked by its open transaction from the claim until the commit that
//! marks them, so concurrent relays never publish the same row twice in normal operation. A
//! crash after the broker acknowledged but before the commit re-publishes the batch later:
//! delivery is at-least-once.

use std::ops::Range;
use std::time::Duration;

use crate::message::Message;
use crate::outbox::{
    BatchOutcome, Claim, ClaimedBatch, OutboxId, OutboxStore, RowFailure, StoreError,
};
use crate::plugin::RowTransformer;
use crate::shutdown::Shutdown;
use crate::sink::Sink;

/// First retry delay of a failed row; doubled per attempt up to [`RETRY_MAX`].
pub const RETRY_INITIAL: Duration = Duration::from_secs(1);
/// Longest retry delay of a failed row.
pub const RETRY_MAX: Duration = Duration::from_secs(60);
/// First pause after a database error; doubled per consecutive error up to
/// [`STORE_ERROR_MAX_PAUSE`], so an outage does not turn into a hot loop.
const STORE_ERROR_PAUSE: Duration = Duration::from_millis(250);
const STORE_ERROR_MAX_PAUSE: Duration = Duration::from_secs(10);

/// Loop settings, from `[relay]`.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub batch_size: usize,
    pub poll_interval: Duration,
}

/// Counters of one relay's lifetime.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RelayStats {
    pub batches: u64,
    /// Rows marked sent (including rows the plugin filtered out).
    pub rows_sent: u64,
    /// Rows rescheduled after a failure.
    pub rows_failed: u64,
    pub messages: u64,
}

/// What one batch did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchReport {
    pub claimed: usize,
    pub sent: usize,
    pub failed: usize,
    pub messages: usize,
    /// First failure of the batch, for the log.
    pub first_error: Option<String>,
}

/// The relay: a store, a transformer and a sink, wired by the loop.
pub struct Relay<S, T, K> {
    store: S,
    transformer: T,
    sink: K,
    settings: RelaySettings,
}

impl<S: OutboxStore, T: RowTransformer, K: Sink> Relay<S, T, K> {
    pub fn new(store: S, transformer: T, sink: K, settings: RelaySettings) -> Self {
        Self {
            store,
            transformer,
            sink,
            settings,
        }
    }

    pub fn sink(&self) -> &K {
        &self.sink
    }

    /// Relays batches until `shutdown` fires. The batch in hand is always finished first.
    pub async fn run(&self, mut shutdown: Shutdown) -> RelayStats {
        let mut stats = RelayStats::default();
        let mut store_errors: u32 = 0;
        while !shutdown.is_shutdown() {
            let wait = match self.run_batch().await {
                Ok(report) => {
                    store_errors = 0;
                    stats.batches += u64::from(report.claimed > 0);
                    stats.rows_sent += report.sent as u64;
                    stats.rows_failed += report.failed as u64;
                    stats.messages += report.messages as u64;
                    log_report(&report);
                    // Anything claimed means there may be more: poll again at once. Only an
                    // empty poll waits.
                    (report.claimed == 0).then_some(self.settings.poll_interval)
                }
                Err(e) => {
                    store_errors = store_errors.saturating_add(1);
                    let pause = store_error_pause(store_errors);
                    tracing::error!(error = %e, retry_in = ?pause, "batch failed; rolled back");
                    Some(pause)
                }
            };
            if let Some(wait) = wait {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.recv() => {}
                }
            }
        }
        stats
    }

    /// Claims, transforms, publishes and marks one batch.
    pub async fn run_batch(&self) -> Result<BatchReport, StoreError> {
        let claim = self.store.claim(self.settings.batch_size).await?;
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
        let ids: Vec<(OutboxId, i32)> = rows.iter().map(|r| (r.id, r.attempts)).collect();
        let results = self.transformer.transform(rows).await;

        let mut failed = rejected;
        let mut messages: Vec<Message> = Vec::new();
        // Rows that transformed fine, with the range of their messages in `messages`.
        let mut transformed: Vec<(OutboxId, i32, Range<usize>)> = Vec::new();
        for ((id, attempts), result) in ids.into_iter().zip(results) {
            match result {
                Ok(out) => {
                    let start = messages.len();
                    messages.extend(out);
                    transformed.push((id, attempts, start..messages.len()));
                }
                Err(failure) => failed.push(RowFailure {
                    id,
                    error: failure.to_string(),
                    retry_in: retry_delay(attempts),
                }),
            }
        }

        let published = if messages.is_empty() {
            Vec::new()
        } else {
            self.sink.publish(&messages).await
        };
        let mut sent = Vec::with_capacity(transformed.len());
        for (id, attempts, range) in transformed {
            // A row counts as sent only when every one of its messages was acknowledged.
            match published[range].iter().find_map(|r| r.as_ref().err()) {
                None => sent.push(id),
                Some(e) => failed.push(RowFailure {
                    id,
                    error: e.to_string(),
                    retry_in: retry_delay(attempts),
                }),
            }
        }

        let report = BatchReport {
            claimed,
            sent: sent.len(),
            failed: failed.len(),
            messages: messages.len(),
            first_error: failed.first().map(|f| format!("row {}: {}", f.id, f.error)),
        };
        batch.complete(BatchOutcome { sent, failed }).await?;
        Ok(report)
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
            first_error = %first,
            "batch committed with failed rows rescheduled"
        ),
    }
}

/// Retry delay for a row that already failed `attempts` times: `RETRY_INITIAL · 2^attempts`,
/// capped at `RETRY_MAX`.
pub fn retry_delay(attempts: i32) -> Duration {
    let exp = u32::try_from(attempts).unwrap_or(0).min(16);
    RETRY_INITIAL.saturating_mul(1 << exp).min(RETRY_MAX)
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
    fn retry_delay_doubles_and_caps() {
        assert_eq!(retry_delay(0), Duration::from_secs(1));
        assert_eq!(retry_delay(1), Duration::from_secs(2));
        assert_eq!(retry_delay(3), Duration::from_secs(8));
        assert_eq!(retry_delay(40), RETRY_MAX);
        assert_eq!(retry_delay(-1), Duration::from_secs(1));
    }

    #[test]
    fn store_error_pause_backs_off() {
        assert_eq!(store_error_pause(1), STORE_ERROR_PAUSE);
        assert_eq!(store_error_pause(2), STORE_ERROR_PAUSE * 2);
        assert_eq!(store_error_pause(100), STORE_ERROR_MAX_PAUSE);
    }
}
