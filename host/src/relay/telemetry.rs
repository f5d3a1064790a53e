//! What a batch records into the relay's [`Metrics`]: transform outcomes, acknowledged
//! messages and bytes per tenant and topic, produce errors, end-to-end latency, and each row's
//! recorded fate. Counts are summed per batch first, so a batch costs a few label lookups,
//! not one per row.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;

use super::outcome::{Fate, Outcomes};
use crate::model::{OutboxId, TenantId};
use crate::plugin::{RowResult, TransformFailure};
use crate::sink::{PublishFault, SinkError};
use crate::store::{Disposition, RowFailure};
use crate::telemetry::Metrics;
use crate::telemetry::metrics::outcome;

/// The `outcome` label of a plugin's result for one row; `None` for rows not run (deferred,
/// tenant paused).
fn transform_outcome(result: &RowResult) -> Option<&'static str> {
    Some(match result {
        Ok(_) => "ok",
        Err(TransformFailure::Retryable { .. }) => "retryable",
        Err(TransformFailure::Permanent { .. }) => "permanent",
        Err(TransformFailure::Trapped(_)) => "trap",
        Err(TransformFailure::DeadlineExceeded(_)) => "timeout",
        Err(TransformFailure::InvalidOutput(_)) => "invalid_output",
        Err(TransformFailure::NoPlugin(_)) => "no_plugin",
        Err(TransformFailure::Unavailable(_)) => "unavailable",
        Err(TransformFailure::Deferred(_) | TransformFailure::Paused { .. }) => return None,
    })
}

/// Counts the plugins' results by tenant and outcome.
pub(super) fn record_transforms(
    metrics: &Metrics,
    rows: &[crate::model::OutboxRow],
    results: &[RowResult],
) {
    let mut counts: HashMap<(&TenantId, &'static str), u64> = HashMap::new();
    for (row, result) in rows.iter().zip(results) {
        if let Some(outcome) = transform_outcome(result) {
            *counts.entry((&row.tenant, outcome)).or_default() += 1;
        }
    }
    for ((tenant, outcome), n) in counts {
        metrics.transform_calls(&metrics.tenant(tenant), outcome, n);
    }
}

fn error_type(error: &SinkError) -> &'static str {
    match error.fault() {
        Some(PublishFault::Unavailable) => "unavailable",
        Some(PublishFault::Refused) => "refused",
        Some(PublishFault::Failed) | None => "failed",
    }
}

/// Records the delivery reports of `outcomes`' messages (before they decide the rows' fates):
/// acknowledged messages and bytes by tenant and topic, errors by topic and type, and, for
/// rows whose every message was acknowledged, the time since the row was created.
pub(super) fn record_reports(
    metrics: &Metrics,
    outcomes: &Outcomes<'_>,
    reports: &[Result<(), SinkError>],
) {
    let now = Utc::now();
    let mut produced: HashMap<(&TenantId, &str), (u64, u64)> = HashMap::new();
    let mut errors: HashMap<(&str, &'static str), u64> = HashMap::new();
    let mut latencies: HashMap<&TenantId, Vec<f64>> = HashMap::new();
    let mut messages = outcomes.messages().iter().zip(reports);
    for o in outcomes.rows() {
        let Fate::Sent { messages: n } = o.fate else {
            continue;
        };
        let mut all_acked = true;
        for (message, report) in messages.by_ref().take(n) {
            match report {
                Ok(()) => {
                    let bytes = message.payload.as_ref().map_or(0, Vec::len)
                        + message.key.as_ref().map_or(0, Vec::len);
                    let entry = produced
                        .entry((&o.row.tenant, message.topic.as_str()))
                        .or_default();
                    entry.0 += 1;
                    entry.1 += bytes as u64;
                }
                Err(e) => {
                    all_acked = false;
                    *errors
                        .entry((message.topic.as_str(), error_type(e)))
                        .or_default() += 1;
                }
            }
        }
        if all_acked {
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
    for ((tenant, topic), (count, bytes)) in produced {
        let label = metrics.tenant(tenant);
        metrics.produced(&label, topic, count, bytes);
        published.insert(tenant, label);
    }
    for (_, label) in published {
        metrics.last_publish(&label, now_seconds);
    }
    for ((topic, kind), n) in errors {
        metrics.produce_errors(topic, kind, n);
    }
    for (tenant, seconds) in latencies {
        metrics.end_to_end(&metrics.tenant(tenant), seconds);
    }
}

fn failure_outcome(disposition: Disposition) -> &'static str {
    match disposition {
        Disposition::Dead => outcome::DEAD,
        Disposition::Retry(_) | Disposition::Wait(_) => outcome::RETRY_SCHEDULED,
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
    let mut counts: HashMap<(&TenantId, &'static str), u64> = HashMap::new();
    for o in outcomes.rows() {
        if !recorded(&o.row.id) {
            continue;
        }
        let outcome = match &o.fate {
            Fate::Sent { .. } => outcome::SENT,
            Fate::Dropped => outcome::DROPPED,
            Fate::Failed(f) => failure_outcome(f.disposition),
            Fate::Deferred => continue,
        };
        *counts.entry((&o.row.tenant, outcome)).or_default() += 1;
    }
    for ((tenant, outcome), n) in counts {
        metrics.rows_completed(&metrics.tenant(tenant), outcome, n);
    }
    // Rows the store could not decode have no tenant to go by.
    let other = metrics.tenant(&TenantId::none());
    for f in rejected.iter().filter(|f| recorded(&f.id)) {
        metrics.rows_completed(&other, failure_outcome(f.disposition), 1);
    }
}
