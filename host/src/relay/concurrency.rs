//! How many batches a process runs at once: `relay.workers` loops exist, and a limit decides
//! how many of them may have a batch in flight.
//!
//! With `relay.adaptive_concurrency` (the default) the limit follows what the pipeline shows,
//! the way TCP Vegas and Netflix's concurrency-limits size a window: while the backlog keeps
//! batches full, each batch's time (claim → commit) is compared with the shortest seen
//! recently. If batches take about as long as the shortest one, the database and the broker
//! are not queueing behind each other: one more batch in flight adds throughput, and the limit
//! grows. If they take much longer, batches are waiting for each other (CPU, locks, the
//! broker): the extra batches only add latency and held locks, and the limit shrinks. Partial
//! and empty batches teach nothing (there is no backlog to move faster), so they leave the
//! limit alone. Without it, all `relay.workers` run.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The limit the adaptive mode starts from: today's fixed default, good on a small machine.
pub const INITIAL_LIMIT: usize = 2;
/// Estimated batches waiting for each other (see [`Vegas::adjust`]) at or below which the
/// limit grows, and at or above which it shrinks. Between the two it holds.
const GROW_AT: f64 = 1.0;
const SHRINK_AT: f64 = 2.0;
/// The shortest batch time is forgotten this often, so a pipeline that became slower (a
/// busier database, a remote broker) is measured anew instead of read as congestion forever.
const MIN_RTT_MAX_AGE: Duration = Duration::from_secs(30);

/// Grants batch slots to the worker loops.
#[derive(Debug)]
pub struct ConcurrencyLimit {
    state: Mutex<State>,
    freed: Notify,
}

#[derive(Debug)]
struct State {
    active: usize,
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    Fixed(usize),
    Adaptive(Vegas),
}

impl Mode {
    fn limit(&self) -> usize {
        match self {
            Self::Fixed(n) => *n,
            Self::Adaptive(v) => v.limit,
        }
    }
}

/// A batch slot; dropping it frees the slot (a batch that ended in an error teaches the
/// limit nothing).
pub struct Slot<'a> {
    owner: &'a ConcurrencyLimit,
    started: Instant,
}

impl ConcurrencyLimit {
    /// All of `max` batches at once.
    pub fn fixed(max: usize) -> Self {
        Self::with(Mode::Fixed(max.max(1)))
    }

    /// From [`INITIAL_LIMIT`] (or `max` if smaller) between 1 and `max`, as batches show.
    pub fn adaptive(max: usize) -> Self {
        Self::with(Mode::Adaptive(Vegas::new(max.max(1))))
    }

    fn with(mode: Mode) -> Self {
        Self {
            state: Mutex::new(State { active: 0, mode }),
            freed: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current limit.
    pub fn limit(&self) -> usize {
        self.state().mode.limit()
    }

    /// Waits for a free slot.
    pub async fn acquire(&self) -> Slot<'_> {
        loop {
            // Registered before looking, so a slot freed in between is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut state = self.state();
                if state.active < state.mode.limit() {
                    state.active += 1;
                    return Slot {
                        owner: self,
                        started: Instant::now(),
                    };
                }
            }
            freed.await;
        }
    }
}

impl Slot<'_> {
    /// The batch in this slot ended; `full` when it claimed a whole batch (a backlog is
    /// waiting), which is when its time says something about the pipeline. The slot stays
    /// taken until dropped.
    pub fn record(&self, full: bool) {
        if full {
            let took = self.started.elapsed();
            let mut state = self.owner.state();
            if let Mode::Adaptive(vegas) = &mut state.mode {
                let before = vegas.limit;
                vegas.record(took, Instant::now());
                if vegas.limit != before {
                    tracing::debug!(
                        from = before,
                        to = vegas.limit,
                        batch_ms = took.as_millis() as u64,
                        "batch concurrency adjusted"
                    );
                }
            }
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut state = self.owner.state();
        state.active = state.active.saturating_sub(1);
        let free = state.mode.limit().saturating_sub(state.active);
        drop(state);
        // A grown limit may free more than this one slot.
        for _ in 0..free.max(1) {
            self.owner.freed.notify_one();
        }
    }
}

/// The Vegas-style limit: batches in flight grow while they do not slow each other down.
#[derive(Debug)]
struct Vegas {
    limit: usize,
    max: usize,
    /// Shortest full-batch time since `min_since`.
    min_rtt: Option<Duration>,
    min_since: Instant,
    /// Full batches since the limit last changed; the first `limit` of them started under
    /// the previous limit and are not averaged.
    seen: usize,
    sum: Duration,
    counted: u32,
}

impl Vegas {
    fn new(max: usize) -> Self {
        Self {
            limit: INITIAL_LIMIT.min(max),
            max,
            min_rtt: None,
            min_since: Instant::now(),
            seen: 0,
            sum: Duration::ZERO,
            counted: 0,
        }
    }

    fn record(&mut self, rtt: Duration, now: Instant) {
        if now.duration_since(self.min_since) > MIN_RTT_MAX_AGE {
            self.min_rtt = None;
            self.min_since = now;
        }
        self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
        self.seen += 1;
        if self.seen <= self.limit {
            return;
        }
        self.sum += rtt;
        self.counted += 1;
        if self.seen >= 2 * self.limit {
            self.adjust();
        }
    }

    /// Once per round at the current limit: `limit × (1 − shortest / average)` estimates how
    /// many of the batches in flight are waiting rather than working.
    fn adjust(&mut self) {
        let (Some(min), Some(average)) = (self.min_rtt, self.sum.checked_div(self.counted)) else {
            return;
        };
        let waiting = if average.is_zero() {
            0.0
        } else {
            self.limit as f64 * (1.0 - min.as_secs_f64() / average.as_secs_f64())
        };
        let next = if waiting <= GROW_AT {
            (self.limit + 1).min(self.max)
        } else if waiting >= SHRINK_AT {
            self.limit.saturating_sub(1).max(1)
        } else {
            self.limit
        };
        self.limit = next;
        self.seen = 0;
        self.sum = Duration::ZERO;
        self.counted = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `vegas` rounds of batches whose time follows `rtt_at(limit)`; returns the limits
    /// it went through.
    fn drive(vegas: &mut Vegas, rounds: usize, rtt_at: impl Fn(usize) -> Duration) -> Vec<usize> {
        let now = Instant::now();
        let mut limits = vec![vegas.limit];
        for _ in 0..rounds {
            let limit = vegas.limit;
            for _ in 0..2 * limit {
                vegas.record(rtt_at(vegas.limit), now);
            }
            limits.push(vegas.limit);
        }
        limits
    }

    #[test]
    fn grows_to_the_maximum_while_batches_do_not_slow_each_other_down() {
        let mut vegas = Vegas::new(8);
        let limits = drive(&mut vegas, 20, |_| Duration::from_millis(20));
        assert_eq!(vegas.limit, 8, "{limits:?}");
    }

    #[test]
    fn settles_near_the_point_where_the_pipeline_saturates() {
        // A pipeline that serves three batches at once: past three, every batch waits
        // in proportion.
        let mut vegas = Vegas::new(16);
        let limits = drive(&mut vegas, 40, |limit| {
            Duration::from_millis(20) * (limit.max(3) as u32) / 3
        });
        let tail = &limits[limits.len() - 10..];
        assert!(
            tail.iter().all(|l| (3..=6).contains(l)),
            "limit should hover just above 3: {limits:?}"
        );
    }

    #[test]
    fn shrinks_when_batches_start_waiting_for_each_other() {
        let mut vegas = Vegas::new(8);
        drive(&mut vegas, 20, |_| Duration::from_millis(20));
        assert_eq!(vegas.limit, 8);
        // The pipeline now serves only two at once.
        let limits = drive(&mut vegas, 20, |limit| {
            Duration::from_millis(20) * (limit.max(2) as u32) / 2
        });
        assert!(
            vegas.limit <= 4,
            "limit should come down towards 2: {limits:?}"
        );
    }

    #[tokio::test]
    async fn a_fixed_limit_grants_that_many_slots_and_frees_on_drop() {
        let limit = ConcurrencyLimit::fixed(2);
        let a = limit.acquire().await;
        let _b = limit.acquire().await;
        let third = tokio::time::timeout(Duration::from_millis(50), limit.acquire()).await;
        assert!(third.is_err(), "a third slot was granted");
        a.record(true);
        drop(a);
        let third = tokio::time::timeout(Duration::from_secs(5), limit.acquire()).await;
        assert!(third.is_ok(), "a freed slot was not granted");
    }
}
