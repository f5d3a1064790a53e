//! Where the next claim starts looking: just past the rows this process claimed last.
//!
//! A claim is `ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED`. While a backlog drains, the head
//! of that order is made of rows other batches hold locked (each claim has to walk past every
//! row of every batch in flight, and check each row's lock) and of rows deleted moments ago
//! whose index entries are not cleaned up yet. Measured on the benchmark drain, four batches in
//! flight made each claim twice as slow as two, eight made it ten times as slow: the claim,
//! not the database's work on the rows, capped the relay. So after a full claim, the next one
//! starts past the highest id claimed so far (`AND id > $3`), which skips that head entirely.
//!
//! Nothing is skipped for good: rows below the cursor that become due again (a retry whose
//! time has come, a batch put back or rolled back) are claimed by the next claim from the
//! start, which runs at least every [`REFRESH`], and whenever a claim from the cursor comes
//! back less than full (the backlog past the cursor is exhausted). In key order a row below the
//! cursor still holds back the later rows of its key: that check is in the claim itself.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Longest time between two claims from the start of the order.
pub(super) const REFRESH: Duration = Duration::from_millis(500);

/// The cursor of one store (shared by the process's workers).
#[derive(Debug, Default)]
pub(super) struct ClaimCursor {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Highest id of the full claims since the last claim from the start, if any.
    after: Option<i64>,
    /// When a claim last started from the start (`None`: none has yet).
    from_start: Option<Instant>,
}

impl ClaimCursor {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the claim starting now begins: past `Some(id)`, or from the start (`None`, also
    /// when the last claim from the start is [`REFRESH`] ago).
    pub(super) fn start(&self, now: Instant) -> Option<i64> {
        let mut state = self.state();
        let since = state.from_start.map(|at| now.duration_since(at));
        if since.is_none_or(|since| since >= REFRESH) || state.after.is_none() {
            state.from_start = Some(now);
            return None;
        }
        state.after
    }

    /// A claim that began at `started` (what [`ClaimCursor::start`] returned) found `rows`
    /// rows of the `limit` it asked for, the highest id among them being `highest`.
    pub(super) fn claimed(
        &self,
        started: Option<i64>,
        rows: usize,
        limit: usize,
        highest: Option<i64>,
    ) {
        let mut state = self.state();
        if rows >= limit {
            // More is waiting past these rows.
            state.after = state.after.max(highest);
        } else if started.is_some() {
            // Nothing more past the cursor: the next claim looks from the start.
            state.after = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_claims_move_the_cursor_and_a_short_one_resets_it() {
        let cursor = ClaimCursor::default();
        let now = Instant::now();
        assert_eq!(cursor.start(now), None);
        cursor.claimed(None, 500, 500, Some(500));
        let at = cursor.start(now);
        assert_eq!(at, Some(500));
        // A concurrent claim that ended later with lower rows does not move it back.
        cursor.claimed(at, 500, 500, Some(1000));
        cursor.claimed(None, 500, 500, Some(700));
        assert_eq!(cursor.start(now), Some(1000));
        cursor.claimed(Some(1000), 20, 500, Some(1020));
        assert_eq!(cursor.start(now), None);
    }

    #[test]
    fn a_claim_from_the_start_runs_at_least_every_refresh() {
        let cursor = ClaimCursor::default();
        let t0 = Instant::now();
        assert_eq!(cursor.start(t0), None);
        cursor.claimed(None, 500, 500, Some(500));
        assert_eq!(cursor.start(t0 + REFRESH / 2), Some(500));
        assert_eq!(cursor.start(t0 + REFRESH), None, "refresh due");
        assert_eq!(
            cursor.start(t0 + REFRESH),
            Some(500),
            "only one claim refreshes"
        );
    }

    #[test]
    fn a_short_claim_from_the_start_keeps_no_cursor() {
        let cursor = ClaimCursor::default();
        let now = Instant::now();
        cursor.claimed(None, 3, 500, Some(3));
        assert_eq!(cursor.start(now), None);
    }
}
