//! How a tenant's rows are grouped into plugin calls within one batch: when to use
//! `transform-batch` (and how far back to fall after a failed one), how many rows go into one
//! call, and the output byte budget of a tenant per batch.

use crate::model::{OutboxRow, TenantId};
use crate::model::{RowResult, TransformFailure};
use crate::plugin::limits::CallBatching;
use crate::plugin::output;

/// Most payload bytes handed to one `transform-batch` call (rows: the tenant's
/// [`CallBatching`]): the rows are copied into the guest's memory at once, which must
/// stay well inside `memory_mb`.
const MAX_BATCH_BYTES: usize = 256 * 1024;

/// Whether a tenant's rows go to `transform-batch` now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BatchCalls {
    /// Row by row; this many successes in a row so far.
    Probation(u32),
    On,
    /// Never (builtins have no `transform-batch`).
    Off,
}

impl BatchCalls {
    /// Where a fresh tenant (or a new plugin version) starts.
    fn start(batching: &CallBatching) -> Self {
        match batching.probation {
            0 => Self::On,
            _ => Self::Probation(0),
        }
    }

    /// After one single-row call; `needed`: successes that end the probation.
    fn after_row(self, ok: bool, needed: u32) -> Self {
        match self {
            Self::Probation(n) if ok && n + 1 >= needed => Self::On,
            Self::Probation(n) if ok => Self::Probation(n + 1),
            Self::Probation(_) => Self::Probation(0),
            other => other,
        }
    }
}

/// Good `transform-batch` calls in a row after which earlier failed ones are forgotten (the
/// probation after the next failure starts short again).
const FORGIVE_AFTER_BATCHES: u32 = 16;
/// The probation after a failed `transform-batch` call doubles with each failure not yet
/// forgiven, up to this many doublings (64 rows → 4,096 rows).
const MAX_PROBATION_DOUBLINGS: u32 = 6;

/// How a tenant moves between single-row calls and `transform-batch`. A failed batch call
/// (a trap, its memory cap, its deadline) sends the rows back to single-row calls — which
/// isolates the offending row — for a probation that doubles with every failure in a short
/// time, then batch calls resume: a plugin that leaks or trips now and then keeps batching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchMode {
    calls: BatchCalls,
    /// Failed batch calls not yet forgiven.
    failures: u32,
    /// Good batch calls since the last failure.
    good_batches: u32,
}

impl BatchMode {
    pub(crate) fn start(batching: &CallBatching) -> Self {
        Self {
            calls: BatchCalls::start(batching),
            failures: 0,
            good_batches: 0,
        }
    }

    /// Single-row successes that end the current probation: at least one chunk's worth, so
    /// every row of a failed chunk is tried alone.
    pub(crate) fn probation(&self, batching: &CallBatching) -> u32 {
        let base = batching
            .probation
            .max(u32::try_from(batching.max_rows).unwrap_or(u32::MAX));
        match self.failures {
            0 => batching.probation,
            n => base.saturating_mul(1 << (n - 1).min(MAX_PROBATION_DOUBLINGS)),
        }
    }

    /// Whether rows go to `transform-batch` now.
    pub(crate) fn batch_calls(&self) -> bool {
        self.calls == BatchCalls::On
    }

    /// Never batch again (the plugin has no `transform-batch`: a builtin).
    pub(crate) fn stop_batch_calls(&mut self) {
        self.calls = BatchCalls::Off;
    }

    /// After one single-row call.
    pub(crate) fn after_row(&mut self, ok: bool, batching: &CallBatching) {
        self.calls = self.calls.after_row(ok, self.probation(batching));
    }

    /// After one `transform-batch` call.
    pub(crate) fn after_batch(&mut self, ok: bool) {
        if ok {
            self.good_batches += 1;
            if self.good_batches >= FORGIVE_AFTER_BATCHES {
                self.failures = 0;
            }
        } else {
            self.failures = self.failures.saturating_add(1);
            self.good_batches = 0;
            self.calls = BatchCalls::Probation(0);
        }
    }
}

/// Output of one batch's rows of a tenant so far, against `max_batch_output_bytes`.
pub(crate) struct OutputBudget {
    limit: usize,
    spent: usize,
    /// Whether a row was deferred for it (counted once per batch as a limit hit).
    hit: bool,
}

impl OutputBudget {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            spent: 0,
            hit: false,
        }
    }

    /// Whether a row was deferred for the budget in this batch.
    pub(crate) fn hit(&self) -> bool {
        self.hit
    }

    /// Keeps a successful result within the budget: a row whose messages would take the
    /// batch past it is deferred to the next batch (the first row always passes, so every
    /// batch makes progress).
    pub(crate) fn admit(&mut self, tenant: &TenantId, result: RowResult) -> RowResult {
        let Ok(messages) = &result else {
            return result;
        };
        let bytes = output::output_bytes(messages);
        if self.spent > 0 && self.spent.saturating_add(bytes) > self.limit {
            self.hit = true;
            return Err(TransformFailure::Deferred(format!(
                "tenant {tenant}'s messages in this batch reached its max_batch_output_bytes ({} bytes)",
                self.limit
            )));
        }
        self.spent = self.spent.saturating_add(bytes);
        result
    }
}

/// How many of `rows` go into the next `transform-batch` call (at most `max_rows`).
pub(crate) fn batch_chunk(rows: &[&OutboxRow], max_rows: usize) -> usize {
    let mut bytes = 0;
    let mut n = 0;
    for row in rows.iter().take(max_rows) {
        bytes += row.payload.len();
        if n > 0 && bytes > MAX_BATCH_BYTES {
            break;
        }
        n += 1;
    }
    n
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::OutboxId;
    use crate::plugin::limits::{BATCH_CALLS_AFTER, MAX_BATCH_ROWS};

    /// A row of tenant `t` with a payload of `payload` bytes.
    pub(crate) fn row(payload: usize) -> OutboxRow {
        OutboxRow {
            id: OutboxId::Int(1),
            tenant: TenantId::named("t"),
            aggregate_type: "a".into(),
            aggregate_id: "b".into(),
            event_type: "c".into(),
            payload: vec![0; payload],
            headers: Vec::new(),
            created_at: chrono::Utc::now(),
            attempts: 0,
            extra: Vec::new(),
            replay: None,
        }
    }

    #[test]
    fn batch_chunks_are_bounded_by_rows_and_bytes() {
        let small: Vec<OutboxRow> = (0..100).map(|_| row(10)).collect();
        let refs: Vec<&OutboxRow> = small.iter().collect();
        assert_eq!(batch_chunk(&refs, MAX_BATCH_ROWS), MAX_BATCH_ROWS);
        assert_eq!(batch_chunk(&refs, 5), 5);
        let big: Vec<OutboxRow> = (0..10).map(|_| row(100 * 1024)).collect();
        let refs: Vec<&OutboxRow> = big.iter().collect();
        assert_eq!(batch_chunk(&refs, MAX_BATCH_ROWS), 2);
        let huge = [row(10 * 1024 * 1024)];
        let refs: Vec<&OutboxRow> = huge.iter().collect();
        assert_eq!(batch_chunk(&refs, MAX_BATCH_ROWS), 1, "one row always fits");
    }

    #[test]
    fn batch_calls_start_after_a_run_of_successes_and_failures_restart_the_count() {
        let relay = CallBatching::RELAY;
        let mut b = BatchMode::start(&relay);
        for _ in 0..BATCH_CALLS_AFTER - 1 {
            b.after_row(true, &relay);
        }
        let mut failed = b;
        failed.after_row(false, &relay);
        assert_eq!(failed.calls, BatchCalls::Probation(0));
        b.after_row(true, &relay);
        assert_eq!(b.calls, BatchCalls::On);
        assert_eq!(BatchCalls::On.after_row(false, 64), BatchCalls::On);
        assert_eq!(BatchCalls::Off.after_row(true, 64), BatchCalls::Off);
        assert_eq!(
            BatchMode::start(&CallBatching::fixed(8)).calls,
            BatchCalls::On
        );
    }

    /// Rows until a probation of `mode` ends.
    fn rows_to_batch_mode(mode: &mut BatchMode, batching: &CallBatching) -> u32 {
        let mut rows = 0;
        while mode.calls != BatchCalls::On {
            mode.after_row(true, batching);
            rows += 1;
        }
        rows
    }

    #[test]
    fn a_failed_batch_call_returns_to_batches_after_a_growing_probation() {
        let relay = CallBatching::RELAY;
        let mut mode = BatchMode::start(&relay);
        assert_eq!(rows_to_batch_mode(&mut mode, &relay), BATCH_CALLS_AFTER);
        mode.after_batch(false);
        assert_eq!(rows_to_batch_mode(&mut mode, &relay), BATCH_CALLS_AFTER);
        mode.after_batch(false);
        assert_eq!(rows_to_batch_mode(&mut mode, &relay), 2 * BATCH_CALLS_AFTER);
        for _ in 0..20 {
            mode.after_batch(false);
        }
        let longest = BATCH_CALLS_AFTER << MAX_PROBATION_DOUBLINGS;
        assert_eq!(rows_to_batch_mode(&mut mode, &relay), longest);
        // A run of good batches forgives: the next failure costs one probation again.
        for _ in 0..FORGIVE_AFTER_BATCHES {
            mode.after_batch(true);
        }
        mode.after_batch(false);
        assert_eq!(rows_to_batch_mode(&mut mode, &relay), BATCH_CALLS_AFTER);
    }

    #[test]
    fn with_fixed_batches_every_row_of_a_failed_chunk_is_tried_alone() {
        let fixed = CallBatching::fixed(8);
        let mut mode = BatchMode::start(&fixed);
        assert_eq!(mode.calls, BatchCalls::On);
        mode.after_batch(false);
        assert_eq!(rows_to_batch_mode(&mut mode, &fixed), 8);
    }
}
