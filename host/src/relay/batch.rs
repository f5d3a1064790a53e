//! One batch, start to end: claim → transform → publish → dead-letter copies → mark and
//! commit; and, when the commit of a published batch fails, settling its outcome in a fresh
//! transaction so it is not published again as a whole.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::outcome::Outcomes;
use super::stats::BatchReport;
use super::{BatchError, Relay, batch_metrics, dead_letter};
use crate::model::{OutboundMessage, OutboxId, OutboxRow, RowResult, TransformFailure};
use crate::plugin::RowTransformer;
use crate::sink::{Delivered, Sink, SinkError};
use crate::store::{
    BatchOutcome, Claim, ClaimedBatch, Disposition, OutboxStore, RowFailure, Settlement, StoreError,
};
use crate::text::{MAX_LOGGED, bounded};

/// Pauses before settling again the rows a settling skipped (see
/// [`Relay::settle_with_retries`]).
const SETTLE_RETRY_PAUSES: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(500),
];

impl<S: OutboxStore, T: RowTransformer, K: Sink> Relay<S, T, K> {
    /// Claims, transforms, publishes and marks one batch.
    pub async fn run_batch(&self) -> Result<BatchReport, BatchError> {
        let paused = self.transformer.paused_tenants();
        // After an empty poll, look before claiming: one autocommit statement instead of a
        // transaction, which keeps an idle relay's load at one query per poll.
        if self.pacer.idle() && !self.store.has_due(&paused).await? {
            return Ok(BatchReport::default());
        }
        let claiming = Instant::now();
        let claim = match self.store.claim(self.settings.batch_size, &paused).await {
            Ok(claim) => claim,
            Err(e) => {
                if let Some(m) = self.metrics() {
                    m.relay.claim_failed();
                }
                return Err(e.into());
            }
        };
        let claimed_at = SystemTime::now();
        if let Some(m) = self.metrics() {
            m.relay.claimed(claim.len(), claiming.elapsed());
        }
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
        // The transformer records its own calls (time and outcome per tenant and plugin).
        let transform_started = SystemTime::now();
        let results = if rows.is_empty() {
            Vec::new()
        } else {
            self.transformer.transform(Arc::clone(&rows)).await
        };
        let mut results = self.encode(results).await;
        let spans = self.tracing.stamp(
            &rows,
            &mut results,
            (claimed_at, transform_started),
            &|tenant| self.transformer.plugin_of(tenant),
        );
        let mut outcomes = match Outcomes::build(&rows, results, &self.settings.retry) {
            Ok(outcomes) => outcomes,
            Err(mismatch) => {
                // Abandoning gives the rows back now; a dropped batch would only roll back
                // (PostgreSQL, MySQL), while on SQLite its lease would hold them until it ran
                // out.
                if let Err(e) = batch.abandon().await {
                    tracing::warn!(error = %e, "rolling back the batch failed");
                }
                return Err(mismatch.into());
            }
        };

        let publishing = Instant::now();
        let publish_started = SystemTime::now();
        let reports = self.publish(outcomes.messages()).await;
        if let Some(spans) = spans {
            spans.finish(
                &self.tracing,
                outcomes.messages(),
                &reports,
                publish_started,
            );
        }
        if let Some(m) = self.metrics() {
            if !reports.is_empty() {
                m.sink.published(publishing.elapsed());
            }
            batch_metrics::record_reports(m, &outcomes, &reports);
        }
        outcomes.apply_reports(reports, &self.settings.retry);
        self.record_publish(&outcomes);
        if let Some(topic) = &self.settings.dead_letter_topic {
            let broker = self.settings.dead_letter_broker;
            dead_letter::publish(&self.sink, broker, topic, &mut outcomes).await;
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
        let marking = Instant::now();
        match batch.complete(outcome).await {
            Ok(()) => {
                if let Some(r) = &self.metrics {
                    r.metrics.relay.marked(r.mark_mode, marking.elapsed());
                    batch_metrics::record_completed(&r.metrics, &outcomes, &rejected, None);
                }
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
                if let Some(m) = self.metrics() {
                    m.relay.delivered_not_marked(outcome.sent.len() as u64);
                }
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
        if let Some(m) = self.metrics() {
            let recorded: HashSet<&OutboxId> = settlement
                .marked
                .iter()
                .chain(&settlement.rescheduled)
                .collect();
            batch_metrics::record_completed(m, outcomes, rejected, Some(&recorded));
            let sent: HashSet<&OutboxId> = outcome.sent.iter().collect();
            let unmarked = settlement
                .refused
                .iter()
                .map(|(id, _)| id)
                .chain(&settlement.skipped)
                .filter(|id| sent.contains(id))
                .count();
            m.relay.delivered_not_marked(unmarked as u64);
        }
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

    /// The schema-encoding step: messages whose tenant set `key_format`/`value_format` are
    /// encoded; without an encoder, their rows fail closed (never published raw).
    async fn encode(&self, results: Vec<RowResult>) -> Vec<RowResult> {
        let wants_encoding = |r: &RowResult| {
            r.as_ref()
                .is_ok_and(|ms| ms.iter().any(|m| m.encoding.is_some()))
        };
        if !results.iter().any(wants_encoding) {
            return results;
        }
        match &self.schemas {
            Some(schemas) => schemas.encode_rows(results).await,
            None => results
                .into_iter()
                .map(|r| match r {
                    Ok(ms) if ms.iter().any(|m| m.encoding.is_some()) => {
                        Err(TransformFailure::SchemaUnavailable(
                            "the tenant's messages are to be encoded, but this relay has no \
                             [schema_registry]"
                                .into(),
                        ))
                    }
                    other => other,
                })
                .collect(),
        }
    }

    /// Tells each tenant's health what publishing did with its rows.
    fn record_publish(&self, outcomes: &Outcomes<'_>) {
        for (tenant, tally) in outcomes.publish_tallies() {
            self.transformer
                .record_publish(tenant, tally.delivered, tally.refused);
        }
    }

    async fn publish(&self, messages: &[OutboundMessage]) -> Vec<Result<Delivered, SinkError>> {
        if messages.is_empty() {
            Vec::new()
        } else {
            self.sink.publish(messages).await
        }
    }
}
