//! The relay loop: claim → transform → publish → mark, until shutdown.
//!
//! A batch's rows stay locked by its open transaction from the claim until the commit that
//! marks them, so concurrent relays never publish the same row twice in normal operation. A
//! crash after the broker acknowledged but before the commit re-publishes the batch later:
//! delivery is at-least-once.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use crate::message::Message;
use crate::outbox::{
    BatchOutcome, Claim, ClaimedBatch, Disposition, OutboxRow, OutboxStore, RowFailure, StoreError,
};
use crate::plugin::{RowTransformer, TransformFailure};
use crate::retry::RetryPolicy;
use crate::shutdown::Shutdown;
use crate::sink::{Sink, SinkError};

/// First pause after a database error; doubled per consecutive error up to
/// [`STORE_ERROR_MAX_PAUSE`], so an outage does not turn into a hot loop.
const STORE_ERROR_PAUSE: Duration = Duration::from_millis(250);
const STORE_ERROR_MAX_PAUSE: Duration = Duration::from_secs(10);

/// Loop settings, from `[relay]`.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub batch_size: usize,
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

/// What one batch did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchReport {
    pub claimed: usize,
    pub sent: usize,
    pub failed: usize,
    pub dead: usize,
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

    /// Relays batches until `shutdown` fires. The batch in hand may finish within
    /// `shutdown_timeout`; after that it is dropped, which rolls it back.
    pub async fn run(&self, mut shutdown: Shutdown) -> RelayStats {
        let mut stats = RelayStats::default();
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
            let wait = match outcome {
                Ok(report) => {
                    store_errors = 0;
                    stats.batches += u64::from(report.claimed > 0);
                    stats.rows_sent += report.sent as u64;
                    stats.rows_failed += report.failed as u64;
                    stats.rows_dead += report.dead as u64;
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
        let paused = self.transformer.paused_tenants();
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
                None => sent.push(rows[index].id),
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
        self.dead_letter(&rows, &failed_rows, &mut failed).await;

        let report = BatchReport {
            claimed,
            sent: sent.len(),
            failed: failed.len(),
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
            id: row.id,
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

    /// Publishes a copy of every row that goes dead in this batch to the dead-letter topic.
    /// The row is dead either way; a failed copy is noted in its `last_error`.
    async fn dead_letter(
        &self,
        rows: &[OutboxRow],
        failed_rows: &[usize],
        failed: &mut [RowFailure],
    ) {
        let Some(topic) = &self.settings.dead_letter_topic else {
            return;
        };
        let offset = failed.len() - failed_rows.len();
        let dead: Vec<(usize, usize)> = failed_rows
            .iter()
            .enumerate()
            .filter(|(i, _)| failed[offset + i].disposition == Disposition::Dead)
            .map(|(i, row)| (offset + i, *row))
            .collect();
        if dead.is_empty() {
            return;
        }
        let copies: Vec<Message> = dead
            .iter()
            .map(|(f, r)| dead_letter_message(topic, &rows[*r], &failed[*f].error))
            .collect();
        let results = self.sink.publish(&copies).await;
        for ((f, _), result) in dead.iter().zip(results) {
            if let Err(e) = result {
                tracing::error!(row = %failed[*f].id, error = %e, "dead-letter copy not published");
                failed[*f]
                    .error
                    .push_str(&format!(" (dead-letter copy not published: {e})"));
            }
        }
    }
}

/// The dead-letter copy of a row: its payload untouched, keyed by aggregate id, with the row's
/// headers and Sluice's `sluice-*` headers explaining why it died.
fn dead_letter_message(topic: &str, row: &OutboxRow, error: &str) -> Message {
    let mut headers = row.headers.clone();
    headers.extend([
        ("sluice-error".to_owned(), error.as_bytes().to_vec()),
        (
            "sluice-attempts".to_owned(),
            (row.attempts + 1).to_string().into_bytes(),
        ),
        (
            "sluice-outbox-id".to_owned(),
            row.id.to_string().into_bytes(),
        ),
        (
            "sluice-tenant".to_owned(),
            row.tenant.as_str().as_bytes().to_vec(),
        ),
        (
            "sluice-aggregate-type".to_owned(),
            row.aggregate_type.as_bytes().to_vec(),
        ),
        (
            "sluice-event-type".to_owned(),
            row.event_type.as_bytes().to_vec(),
        ),
    ]);
    Message {
        row: row.id,
        topic: topic.to_owned(),
        key: Some(row.aggregate_id.as_bytes().to_vec()),
        payload: Some(row.payload.clone()),
        headers,
        partition: None,
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
