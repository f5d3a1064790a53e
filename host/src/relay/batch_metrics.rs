//! What a batch records into the relay's [`Metrics`]: acknowledged messages and bytes per
//! tenant and topic, produce errors, end-to-end latency, and each row's recorded fate (with
//! why rows went dead). The plugin calls are recorded by the transformer itself. Counts are
//! summed per batch first, so a batch costs a few label lookups, not one per row.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;

use super::outcome::{Fate, Outcomes};
use crate::model::{Broker, OutboxId, TenantId};
use crate::sink::{Delivered, PublishFault, SinkError};
use crate::store::{Disposition, RowFailure};
use crate::telemetry::Metrics;
use crate::telemetry::metrics::{DeadReason, ProduceError, RowOutcome};

fn error_type(error: &SinkError) -> ProduceError {
    match error.fault() {
        Some(PublishFault::Unavailable) => ProduceError::Unavailable,
        Some(PublishFault::Refused) => ProduceError::Refused,
        Some(PublishFault::Failed) | None => ProduceError::Failed,
    }
}

/// Records the delivery reports of `outcomes`' messages (before they decide the rows' fates):
/// acknowledged messages and bytes by tenant and topic, errors by topic and type, and, for
/// rows whose every message was acknowledged, the time since the row was created.
pub(super) fn record_reports(
    metrics: &Metrics,
    outcomes: &Outcomes<'_>,
    reports: &[Result<Delivered, SinkError>],
) {
    let now = Utc::now();
    let mut produced: HashMap<(&TenantId, Broker, &str), (u64, u64)> = HashMap::new();
    let mut errors: HashMap<(Broker, &str, ProduceError), u64> = HashMap::new();
    let mut latencies: HashMap<&TenantId, Vec<f64>> = HashMap::new();
    let mut messages = outcomes.messages().iter().zip(reports);
    for o in outcomes.rows() {
        let Fate::Sent { messages: n } = o.fate else {
            continue;
        };
        let mut all_acked = true;
        for (message, report) in messages.by_ref().take(n) {
            match report {
                Ok(_) => {
                    let bytes = message.payload.as_ref().map_or(0, Vec::len)
                        + message.key.as_ref().map_or(0, Vec::len);
                    let entry = produced
                        .entry((&o.row.tenant, message.broker, message.topic.as_str()))
                        .or_default();
                    entry.0 += 1;
                    entry.1 += bytes as u64;
                }
                Err(e) => {
                    all_acked = false;
                    *errors
                        .entry((message.broker, message.topic.as_str(), error_type(e)))
                        .or_default() += 1;
                }
            }
        }
        // A replayed row is as old as the events it replays: its age would say nothing about
        // how fast the outbox is relayed.
        if all_acked && o.row.replay.is_none() {
            let age = (now - o.row.created_at)
                .num_microseconds()
                .unwrap_or(i64::MAX);
            latencies
                .entry(&o.row.tenant)
                .or_default()
                .push(age as f64 / 1e6);
        }
    }
    let now_seconds = now.timestamp_micros() as f64 / 1e6;
    let mut published: HashMap<&TenantId, Arc<str>> = HashMap::new();
    for ((tenant, broker, topic), (count, bytes)) in produced {
        let label = metrics.tenant(tenant);
        metrics.sink.produced(&label, broker, topic, count, bytes);
        published.insert(tenant, label);
    }
    for (_, label) in published {
        metrics.sink.last_publish(&label, now_seconds);
    }
    for ((broker, topic, kind), n) in errors {
        metrics.sink.produce_errors(broker, topic, kind, n);
    }
    for (tenant, seconds) in latencies {
        metrics.sink.end_to_end(&metrics.tenant(tenant), seconds);
    }
}

fn failure_outcome(disposition: Disposition) -> RowOutcome {
    match disposition {
        Disposition::Dead => RowOutcome::Dead,
        Disposition::Retry(_) | Disposition::Wait(_) => RowOutcome::RetryScheduled,
    }
}

/// Records each row's fate once its batch committed; `only`, after a failed commit was
/// settled, limits it to the rows the settling recorded.
pub(super) fn record_completed(
    metrics: &Metrics,
    outcomes: &Outcomes<'_>,
    rejected: &[RowFailure],
    only: Option<&std::collections::HashSet<&OutboxId>>,
) {
    let recorded = |id: &OutboxId| only.is_none_or(|ids| ids.contains(id));
    let mut counts: HashMap<(&TenantId, RowOutcome), u64> = HashMap::new();
    let mut dead: HashMap<(&TenantId, DeadReason), u64> = HashMap::new();
    for o in outcomes.rows() {
        if !recorded(&o.row.id) {
            continue;
        }
        let outcome = match &o.fate {
            Fate::Sent { .. } => RowOutcome::Sent,
            Fate::Dropped => RowOutcome::Dropped,
            Fate::Failed(f) => {
                if f.disposition == Disposition::Dead {
                    let reason = if f.permanent {
                        DeadReason::Permanent
                    } else {
                        DeadReason::AttemptsExhausted
                    };
                    *dead.entry((&o.row.tenant, reason)).or_default() += 1;
                }
                failure_outcome(f.disposition)
            }
            Fate::Deferred => continue,
        };
        *counts.entry((&o.row.tenant, outcome)).or_default() += 1;
    }
    for ((tenant, outcome), n) in counts {
        metrics
            .relay
            .rows_completed(&metrics.tenant(tenant), outcome, n);
    }
    for ((tenant, reason), n) in dead {
        metrics
            .relay
            .dead_letters(&metrics.tenant(tenant), reason, n);
    }
    // Rows the store could not decode have no tenant to go by.
    let other = metrics.tenant(&TenantId::none());
    for f in rejected.iter().filter(|f| recorded(&f.id)) {
        metrics
            .relay
            .rows_completed(&other, failure_outcome(f.disposition), 1);
        if f.disposition == Disposition::Dead {
            metrics
                .relay
                .dead_letters(&other, DeadReason::InvalidRow, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::OutboxRow;
    use crate::model::TransformFailure;
    use crate::relay::{RetryPolicy, RetrySettings};
    use crate::telemetry::TenantLabels;
    use crate::telemetry::metrics::tests::sample_value as sample;

    fn row(id: i64, attempts: i32) -> OutboxRow {
        OutboxRow {
            id: OutboxId::Int(id),
            tenant: TenantId::named("acme"),
            aggregate_type: "order".into(),
            aggregate_id: id.to_string(),
            event_type: "E".into(),
            payload: Vec::new(),
            headers: Vec::new(),
            created_at: Utc::now(),
            attempts,
            extra: Vec::new(),
            replay: None,
        }
    }

    #[test]
    fn rows_going_dead_are_counted_by_why() {
        let metrics = Metrics::new(TenantLabels::new(["acme"]), "test");
        let retry = RetryPolicy::new(&RetrySettings {
            max_attempts: 3,
            ..RetrySettings::default()
        });
        let (code, message) = ("bad".to_owned(), "no".to_owned());
        let rows = [row(1, 0), row(2, 2), row(3, 0)];
        let results = vec![
            Err(TransformFailure::Permanent {
                code: code.clone(),
                message: message.clone(),
            }),
            // Its third attempt: the last one.
            Err(TransformFailure::Retryable {
                code: code.clone(),
                message: message.clone(),
            }),
            Err(TransformFailure::Retryable { code, message }),
        ];
        let outcomes = Outcomes::build(&rows, results, &retry).unwrap();
        let unreadable = [RowFailure {
            id: OutboxId::Int(4),
            error: "cannot decode".into(),
            disposition: Disposition::Dead,
        }];
        record_completed(&metrics, &outcomes, &unreadable, None);
        let text = metrics.encode().unwrap();
        let dead = |tenant: &str, reason: &str| {
            sample(
                &text,
                &format!("sluice_dead_letters_total{{tenant=\"{tenant}\",reason=\"{reason}\"}}"),
            )
        };
        assert_eq!(dead("acme", "permanent"), Some(1.0), "{text}");
        assert_eq!(dead("acme", "attempts_exhausted"), Some(1.0));
        assert_eq!(dead("_default", "invalid_row"), Some(1.0));
        assert_eq!(
            dead("_default", "permanent"),
            Some(0.0),
            "known label sets start at 0"
        );
        assert_eq!(
            sample(
                &text,
                "sluice_rows_completed_total{tenant=\"acme\",outcome=\"dead\"}"
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                "sluice_rows_completed_total{tenant=\"acme\",outcome=\"retry_scheduled\"}"
            ),
            Some(1.0)
        );
    }
}
