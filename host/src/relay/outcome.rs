//! What became of each claimed row of one batch: one [`RowOutcome`] per row, built in one pass
//! from the transformer's results, completed by the delivery reports, and then read by
//! everything after publishing — the tenants' circuit breakers, the dead-letter copies, the
//! marking and the batch report. A row's messages, its failure and its row never live in
//! separate lists that would have to stay aligned.

use std::collections::BTreeMap;

use super::BatchReport;
use super::retry::RetryPolicy;
use crate::model::OutboundMessage;
use crate::model::{OutboxId, OutboxRow, TenantId};
use crate::model::{RowResult, TransformFailure};
use crate::sink::{Delivered, PublishFault, SinkError};
use crate::store::{BatchOutcome, Disposition, RowFailure};

/// The fate of one row in this batch.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Fate {
    /// The plugin produced `messages` messages (at least one), which follow those of the
    /// previous rows in [`Outcomes::messages`]. After publishing: every one was acknowledged.
    Sent { messages: usize },
    /// The plugin produced no message: the row is marked sent without publishing anything.
    Dropped,
    /// Not delivered this time.
    Failed(Failure),
    /// Put back untouched (neither marked nor rescheduled): claimed again by a later batch.
    Deferred,
}

/// Why a row was not delivered, and what happens to it next.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Failure {
    pub error: String,
    pub disposition: Disposition,
    /// The broker refused one of its messages for a reason of the tenant's own making (a
    /// topic it lacks, a message too large, no authorization).
    pub refused: bool,
    /// The plugin said the row can never succeed: dead at once, whatever its attempts.
    pub permanent: bool,
}

/// One claimed row and its fate.
#[derive(Debug)]
pub(super) struct RowOutcome<'a> {
    pub row: &'a OutboxRow,
    pub fate: Fate,
}

/// The transformer returned a different number of results than it was given rows: which
/// result belongs to which row is unknowable, so nothing of the batch may be published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the transformer returned {results} results for {rows} rows; batch rolled back, nothing \
     published"
)]
pub struct ResultCountMismatch {
    /// Rows the transformer was given.
    pub rows: usize,
    /// Results it returned.
    pub results: usize,
}

/// The outcomes of a batch's decoded rows, in claim order, and the messages to publish.
#[derive(Debug)]
pub(super) struct Outcomes<'a> {
    rows: Vec<RowOutcome<'a>>,
    /// The messages of the [`Fate::Sent`] rows, row after row in the order of `rows`.
    messages: Vec<OutboundMessage>,
}

/// What publishing did with one tenant's rows (for its circuit breaker).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct PublishTally {
    /// Rows whose every message was acknowledged.
    pub delivered: usize,
    /// Rows with a message refused for a reason of the tenant's own making.
    pub refused: usize,
}

impl<'a> Outcomes<'a> {
    /// Pairs each row with its transform result, in one pass.
    pub(super) fn build(
        rows: &'a [OutboxRow],
        results: Vec<RowResult>,
        retry: &RetryPolicy,
    ) -> Result<Self, ResultCountMismatch> {
        if results.len() != rows.len() {
            return Err(ResultCountMismatch {
                rows: rows.len(),
                results: results.len(),
            });
        }
        // Mostly one message per row: one allocation, not a doubling series.
        let mut messages = Vec::with_capacity(rows.len());
        let rows = rows
            .iter()
            .zip(results)
            .map(|(row, result)| {
                let fate = match result {
                    Ok(out) if out.is_empty() => Fate::Dropped,
                    Ok(out) => {
                        let count = out.len();
                        messages.extend(out);
                        Fate::Sent { messages: count }
                    }
                    // A paused tenant's row reaches the transformer only when its breaker
                    // opened (or it was quarantined) after this batch's claim left it out:
                    // put it back untouched, so it runs as soon as the tenant resumes
                    // (a reload resets the breaker) instead of waiting out a cool-down.
                    Err(TransformFailure::Deferred(_) | TransformFailure::Paused { .. }) => {
                        Fate::Deferred
                    }
                    Err(failure) => Fate::Failed(transform_failure(row, failure, retry)),
                };
                RowOutcome { row, fate }
            })
            .collect();
        Ok(Self { rows, messages })
    }

    /// Everything the plugins produced, to publish in one go.
    pub(super) fn messages(&self) -> &[OutboundMessage] {
        &self.messages
    }

    pub(super) fn rows(&self) -> &[RowOutcome<'a>] {
        &self.rows
    }

    pub(super) fn rows_mut(&mut self) -> &mut [RowOutcome<'a>] {
        &mut self.rows
    }

    /// Applies the delivery reports of [`Outcomes::messages`] (one per message, in order): a
    /// row stays sent only if every one of its messages was acknowledged. A report the sink
    /// did not return counts as a broker failure.
    pub(super) fn apply_reports(
        &mut self,
        reports: Vec<Result<Delivered, SinkError>>,
        retry: &RetryPolicy,
    ) {
        let mut reports = reports.into_iter();
        for outcome in &mut self.rows {
            let Fate::Sent { messages } = outcome.fate else {
                continue;
            };
            let mut first_error: Option<SinkError> = None;
            for _ in 0..messages {
                let report = reports.next().unwrap_or_else(|| Err(missing_report()));
                if let (Err(e), None) = (report, &first_error) {
                    first_error = Some(e);
                }
            }
            if let Some(error) = first_error {
                outcome.fate = Fate::Failed(publish_failure(outcome.row, &error, retry));
            }
        }
    }

    /// Per tenant, what publishing did with its rows; tenants that published nothing are left
    /// out.
    pub(super) fn publish_tallies(&self) -> BTreeMap<&'a TenantId, PublishTally> {
        let mut tallies: BTreeMap<&TenantId, PublishTally> = BTreeMap::new();
        for outcome in &self.rows {
            let tenant = &outcome.row.tenant;
            match &outcome.fate {
                Fate::Sent { .. } => tallies.entry(tenant).or_default().delivered += 1,
                Fate::Failed(f) if f.refused => tallies.entry(tenant).or_default().refused += 1,
                _ => {}
            }
        }
        tallies
    }

    /// What the store records: sent and dropped rows are marked, failed ones rescheduled or
    /// dead-lettered (with the rows the store could not decode, `rejected`), deferred ones
    /// left alone.
    pub(super) fn store_outcome(&self, rejected: &[RowFailure]) -> BatchOutcome {
        let mut outcome = BatchOutcome {
            sent: Vec::with_capacity(self.rows.len()),
            failed: Vec::new(),
        };
        for o in &self.rows {
            match &o.fate {
                Fate::Sent { .. } | Fate::Dropped => outcome.sent.push(o.row.id.clone()),
                Fate::Failed(f) => outcome.failed.push(RowFailure {
                    id: o.row.id.clone(),
                    error: f.error.clone(),
                    disposition: f.disposition,
                }),
                Fate::Deferred => {}
            }
        }
        outcome.failed.extend_from_slice(rejected);
        outcome
    }

    /// The batch report, as if the store recorded [`Outcomes::store_outcome`].
    pub(super) fn report(&self, rejected: &[RowFailure]) -> BatchReport {
        let mut report = BatchReport {
            claimed: self.rows.len() + rejected.len(),
            messages: self.messages.len(),
            ..BatchReport::default()
        };
        for o in &self.rows {
            match &o.fate {
                Fate::Sent { .. } | Fate::Dropped => report.sent += 1,
                Fate::Failed(f) => {
                    report.failed += 1;
                    report.dead += usize::from(f.disposition == Disposition::Dead);
                    if report.first_error.is_none() {
                        report.first_error = Some(format!("row {}: {}", o.row.id, f.error));
                    }
                }
                Fate::Deferred => report.deferred += 1,
            }
        }
        for f in rejected {
            report.failed += 1;
            report.dead += usize::from(f.disposition == Disposition::Dead);
            if report.first_error.is_none() {
                report.first_error = Some(format!("row {}: {}", f.id, f.error));
            }
        }
        report
    }

    /// The ids of the rows the store is asked to record (all but the deferred ones).
    pub(super) fn recorded_ids(&self) -> impl Iterator<Item = &OutboxId> {
        self.rows
            .iter()
            .filter(|o| o.fate != Fate::Deferred)
            .map(|o| &o.row.id)
    }
}

fn missing_report() -> SinkError {
    SinkError::publish_failed(
        "",
        "sink returned no delivery report",
        PublishFault::Unavailable,
    )
}

fn transform_failure(row: &OutboxRow, failure: TransformFailure, retry: &RetryPolicy) -> Failure {
    match failure {
        // The registry is down or has no schema for the subject: nobody's fault of the row's
        // or the tenant's; retried without using up attempts, and the breaker is not told.
        TransformFailure::SchemaUnavailable(_) => Failure {
            error: failure.to_string(),
            disposition: retry.after_transient_failure(),
            refused: false,
            permanent: false,
        },
        // The payload does not fit its schema: the row can never succeed. Like a plugin's
        // `permanent` error, it is the row's fault, not the tenant's: the breaker is not told.
        TransformFailure::SchemaMismatch(_) => Failure {
            error: failure.to_string(),
            disposition: retry.after_failure(row.attempts, true),
            refused: false,
            permanent: true,
        },
        failure => {
            let permanent = matches!(failure, TransformFailure::Permanent { .. });
            Failure {
                error: failure.to_string(),
                disposition: retry.after_failure(row.attempts, permanent),
                refused: false,
                permanent,
            }
        }
    }
}

fn publish_failure(row: &OutboxRow, error: &SinkError, retry: &RetryPolicy) -> Failure {
    let fault = error.fault().unwrap_or(PublishFault::Failed);
    let disposition = match fault {
        PublishFault::Unavailable => retry.after_transient_failure(),
        PublishFault::Refused | PublishFault::Failed => retry.after_failure(row.attempts, false),
    };
    Failure {
        error: error.to_string(),
        disposition,
        refused: fault == PublishFault::Refused,
        permanent: false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::relay::RetrySettings;

    fn row(id: i64) -> OutboxRow {
        OutboxRow {
            id: OutboxId::Int(id),
            tenant: TenantId::named("t"),
            aggregate_type: "order".into(),
            aggregate_id: id.to_string(),
            event_type: "E".into(),
            payload: Vec::new(),
            headers: Vec::new(),
            created_at: chrono::Utc::now(),
            attempts: 0,
            extra: Vec::new(),
            replay: None,
        }
    }

    fn message(id: i64) -> OutboundMessage {
        OutboundMessage {
            row: OutboxId::Int(id),
            broker: crate::model::Broker::Kafka,
            topic: "x".into(),
            key: None,
            payload: None,
            headers: Vec::new(),
            partition: None,
            encoding: None,
            value_record: None,
            key_record: None,
            timestamp_ms: None,
        }
    }

    #[test]
    fn a_delivery_report_the_sink_did_not_return_fails_the_row_as_the_brokers_fault() {
        let retry = RetryPolicy::new(&RetrySettings::default());
        let rows = [row(1), row(2)];
        let mut outcomes = Outcomes::build(
            &rows,
            vec![Ok(vec![message(1)]), Ok(vec![message(2), message(2)])],
            &retry,
        )
        .unwrap();
        assert_eq!(outcomes.messages().len(), 3);

        // Two reports for three messages: row 2's second message has none.
        outcomes.apply_reports(
            vec![Ok(Delivered::default()), Ok(Delivered::default())],
            &retry,
        );

        assert_eq!(outcomes.rows[0].fate, Fate::Sent { messages: 1 });
        match &outcomes.rows[1].fate {
            Fate::Failed(f) => {
                assert_eq!(f.disposition, Disposition::Wait(Duration::from_secs(1)));
                assert!(f.error.contains("no delivery report"), "{}", f.error);
                assert!(!f.refused);
            }
            other => panic!("row 2 should have failed: {other:?}"),
        }
        let stored = outcomes.store_outcome(&[]);
        assert_eq!(stored.sent, vec![OutboxId::Int(1)]);
        assert_eq!(stored.failed.len(), 1);
    }
}
