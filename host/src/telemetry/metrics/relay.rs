//! What the relay loop records: claims, poll wake-ups, each row's recorded fate (with why rows
//! went dead), mark timings, duplicates risked by unrecorded outcomes, and the batch
//! concurrency limit.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::{HistogramFamily, label_values, latency_histogram};
use crate::telemetry::TenantLabels;

label_values! {
    /// The `result` label values of `sluice_claims_total`.
    pub(crate) enum ClaimResult {
        Rows => "rows",
        Empty => "empty",
        Error => "error",
    }
}

label_values! {
    /// Why an idle wait of the poll clock ended (`sluice_poll_wakeups_total{cause}`).
    pub enum WakeCause {
        /// The wait ran its course.
        Timer => "timer",
        /// A NOTIFY arrived (or the LISTEN connection came back).
        Notify => "notify",
        /// Another worker found rows waiting (a full batch, or rows after a quiet spell).
        Refill => "refill",
    }
}

label_values! {
    /// The `outcome` label values of `sluice_rows_completed_total`.
    pub enum RowOutcome {
        Sent => "sent",
        Dropped => "dropped",
        RetryScheduled => "retry_scheduled",
        Dead => "dead",
    }
}

label_values! {
    /// The `reason` label values of `sluice_dead_letters_total`.
    pub enum DeadReason {
        /// The plugin said the row can never succeed (`permanent`).
        Permanent => "permanent",
        /// The row failed `max_attempts` times.
        AttemptsExhausted => "attempts_exhausted",
        /// The store could not read the row (a column it cannot decode).
        InvalidRow => "invalid_row",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: ClaimResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: WakeCause,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantOutcome {
    tenant: Arc<str>,
    outcome: RowOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantReason {
    tenant: Arc<str>,
    reason: DeadReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabel {
    mode: &'static str,
}

/// The relay loop's families.
#[derive(Debug)]
pub struct RelayMetrics {
    claims: Family<ResultLabel, Counter>,
    claim_duration: Histogram,
    claim_batch_rows: Histogram,
    poll_wakeups: Family<CauseLabel, Counter>,
    rows_completed: Family<TenantOutcome, Counter>,
    dead_letters: Family<TenantReason, Counter>,
    mark_duration: HistogramFamily<ModeLabel>,
    delivered_not_marked: Counter,
    batch_concurrency: Gauge,
    partitions_dropped: Counter,
}

impl RelayMetrics {
    /// The pruner dropped `n` partitions past `relay.retention`.
    pub(crate) fn partitions_dropped(&self, n: u64) {
        self.partitions_dropped.inc_by(n);
    }

    /// The families, with every known label set of `tenants` at 0.
    pub(super) fn new(tenants: &TenantLabels) -> Self {
        let m = Self {
            claims: Family::default(),
            claim_duration: latency_histogram(),
            claim_batch_rows: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            poll_wakeups: Family::default(),
            rows_completed: Family::default(),
            dead_letters: Family::default(),
            mark_duration: Family::new_with_constructor(latency_histogram),
            delivered_not_marked: Counter::default(),
            batch_concurrency: Gauge::default(),
            partitions_dropped: Counter::default(),
        };
        for &result in ClaimResult::ALL {
            let _ = m.claims.get_or_create(&ResultLabel { result });
        }
        for &cause in WakeCause::ALL {
            let _ = m.poll_wakeups.get_or_create(&CauseLabel { cause });
        }
        for tenant in tenants.all() {
            m.start_tenant(&tenant);
        }
        m
    }

    /// Starts the series of the label value `tenant` at 0.
    pub(super) fn start_tenant(&self, tenant: &Arc<str>) {
        for &outcome in RowOutcome::ALL {
            let _ = self.rows_completed.get_or_create(&TenantOutcome {
                tenant: Arc::clone(tenant),
                outcome,
            });
        }
        for &reason in DeadReason::ALL {
            let _ = self.dead_letters.get_or_create(&TenantReason {
                tenant: Arc::clone(tenant),
                reason,
            });
        }
    }

    /// Removes every series of the label value `tenant`.
    pub(super) fn forget_tenant(&self, tenant: &Arc<str>) {
        for &outcome in RowOutcome::ALL {
            self.rows_completed.remove(&TenantOutcome {
                tenant: Arc::clone(tenant),
                outcome,
            });
        }
        for &reason in DeadReason::ALL {
            self.dead_letters.remove(&TenantReason {
                tenant: Arc::clone(tenant),
                reason,
            });
        }
    }

    pub(super) fn register(&self, r: &mut Registry) {
        // Registered without the suffix: the client library adds `_total` to counters.
        r.register(
            "partitions_dropped",
            "Outbox partitions the pruner detached and dropped (relay.retention_mode = \"drop-partitions\")",
            self.partitions_dropped.clone(),
        );
        r.register(
            "claims",
            "Claims by result (rows, empty, error)",
            self.claims.clone(),
        );
        r.register_with_unit(
            "claim_duration",
            "Time to claim one batch (the claim statement)",
            Unit::Seconds,
            self.claim_duration.clone(),
        );
        r.register(
            "claim_batch_rows",
            "Rows per non-empty claim",
            self.claim_batch_rows.clone(),
        );
        r.register(
            "poll_wakeups",
            "Idle waits of the poll clock that ended, by cause (timer, notify, refill)",
            self.poll_wakeups.clone(),
        );
        r.register(
            "rows_completed",
            "Rows whose fate was recorded, by tenant and outcome (sent, dropped, retry_scheduled, dead)",
            self.rows_completed.clone(),
        );
        r.register(
            "dead_letters",
            "Rows that went dead, by tenant and reason (permanent, attempts_exhausted, invalid_row)",
            self.dead_letters.clone(),
        );
        r.register_with_unit(
            "mark_duration",
            "Time to mark a batch and commit, by mark mode",
            Unit::Seconds,
            self.mark_duration.clone(),
        );
        r.register(
            "delivered_not_marked",
            "Rows whose messages may be published but whose outcome could not be recorded: they are published again (duplicates)",
            self.delivered_not_marked.clone(),
        );
        r.register(
            "relay_batch_concurrency",
            "Batches the relay lets be in flight at once now (relay.adaptive_concurrency moves it between 1 and relay.workers)",
            self.batch_concurrency.clone(),
        );
    }

    /// A claim returned `rows` rows in `took`.
    pub fn claimed(&self, rows: usize, took: Duration) {
        let result = if rows == 0 {
            ClaimResult::Empty
        } else {
            ClaimResult::Rows
        };
        self.claims.get_or_create(&ResultLabel { result }).inc();
        self.claim_duration.observe(took.as_secs_f64());
        if rows > 0 {
            self.claim_batch_rows.observe(rows as f64);
        }
    }

    pub fn claim_failed(&self) {
        self.claims
            .get_or_create(&ResultLabel {
                result: ClaimResult::Error,
            })
            .inc();
    }

    /// An idle wait of the poll clock ended for `cause`.
    pub fn poll_woken(&self, cause: WakeCause) {
        self.poll_wakeups.get_or_create(&CauseLabel { cause }).inc();
    }

    pub fn rows_completed(&self, tenant: &Arc<str>, outcome: RowOutcome, rows: u64) {
        self.rows_completed
            .get_or_create(&TenantOutcome {
                tenant: Arc::clone(tenant),
                outcome,
            })
            .inc_by(rows);
    }

    /// `rows` rows of `tenant` went dead for `reason`.
    pub fn dead_letters(&self, tenant: &Arc<str>, reason: DeadReason, rows: u64) {
        self.dead_letters
            .get_or_create(&TenantReason {
                tenant: Arc::clone(tenant),
                reason,
            })
            .inc_by(rows);
    }

    /// Recording a batch's outcome in `mode` (`delete` or `published_at`) took `took`.
    pub fn marked(&self, mode: &'static str, took: Duration) {
        self.mark_duration
            .get_or_create(&ModeLabel { mode })
            .observe(took.as_secs_f64());
    }

    pub fn delivered_not_marked(&self, rows: u64) {
        self.delivered_not_marked.inc_by(rows);
    }

    /// The limit on batches in flight.
    pub fn batch_concurrency(&self, limit: usize) {
        self.batch_concurrency
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
    }
}
