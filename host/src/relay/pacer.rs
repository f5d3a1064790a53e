//! Adaptive polling: when the relay polls, shared by all of a process's batch workers.
//!
//! A worker whose batch came back full polls again at once. Otherwise it waits for its turn:
//! one idle worker at a time holds the clock and sleeps `min_poll_interval` after a partial
//! batch, then twice as long after each empty poll, up to `poll_interval`. So an idle process
//! issues one poll per `poll_interval` however many workers it has, and a busy one never
//! waits. A wake-up (a NOTIFY, or a full batch elsewhere) cuts the sleep short.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::shutdown::Shutdown;

/// Why an idle wait ended: the `cause` label of `sluice_poll_wakeups_total`, one list for both.
pub(crate) use crate::telemetry::metrics::WakeCause;

/// How full the last claim was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// No rows: the next wait doubles, up to `poll_interval`.
    Empty,
    /// Some rows, fewer than a batch: wait `min_poll_interval`.
    Partial,
    /// A whole batch: more are waiting, poll again at once.
    Full,
}

/// What the last wake-up signal was, for the waiter it wakes.
const WOKEN_BY_NOTIFY: u8 = 1;
const WOKEN_BY_REFILL: u8 = 2;

/// The shared poll clock of one relay process.
#[derive(Debug)]
pub struct Pacer {
    min: Duration,
    max: Duration,
    /// Empty polls in a row.
    empty_streak: Mutex<u32>,
    /// Held by the one idle worker whose sleep decides the next poll.
    turn: tokio::sync::Mutex<()>,
    wake: Notify,
    /// Who sent the pending wake-up signal (one of `WOKEN_BY_*`); the last sender wins.
    woken_by: AtomicU8,
}

impl Pacer {
    /// A clock waiting `min` after rows were found, backing off to `max` (at least `min`) when
    /// idle.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            empty_streak: Mutex::new(0),
            turn: tokio::sync::Mutex::new(()),
            wake: Notify::new(),
            woken_by: AtomicU8::new(WOKEN_BY_REFILL),
        }
    }

    fn streak(&self) -> std::sync::MutexGuard<'_, u32> {
        self.empty_streak
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the last poll found nothing: the next one may start with a cheap probe.
    pub fn idle(&self) -> bool {
        *self.streak() > 0
    }

    /// Records a claim's result. Rows found after a quiet spell (or a full batch, which means
    /// more are waiting) wake the sleeping worker so it joins in.
    pub fn record(&self, fill: Fill) {
        let mut streak = self.streak();
        match fill {
            Fill::Empty => *streak = streak.saturating_add(1),
            Fill::Partial | Fill::Full => {
                let was_idle = *streak > 0;
                *streak = 0;
                if fill == Fill::Full || was_idle {
                    self.woken_by.store(WOKEN_BY_REFILL, Ordering::Relaxed);
                    self.wake.notify_one();
                }
            }
        }
    }

    /// Cuts the current sleep short (a NOTIFY arrived).
    pub fn wake(&self) {
        self.woken_by.store(WOKEN_BY_NOTIFY, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// The wait before the next poll: `min` after rows were found, doubling with every empty
    /// poll after the first, capped at `max`.
    pub fn next_wait(&self) -> Duration {
        let streak = *self.streak();
        let doublings = streak.saturating_sub(1).min(20);
        self.min.saturating_mul(1 << doublings).min(self.max)
    }

    /// Waits until this worker should poll: its turn on the clock, then the current wait,
    /// cut short by a wake-up or shutdown. Returns why the wait ended (`None`: shutdown).
    pub async fn wait_turn(&self, shutdown: &mut Shutdown) -> Option<WakeCause> {
        let _turn = tokio::select! {
            turn = self.turn.lock() => turn,
            _ = shutdown.recv() => return None,
        };
        let wait = self.next_wait();
        tokio::select! {
            _ = tokio::time::sleep(wait) => Some(WakeCause::Timer),
            _ = self.wake.notified() => Some(match self.woken_by.load(Ordering::Relaxed) {
                WOKEN_BY_NOTIFY => WakeCause::Notify,
                _ => WakeCause::Refill,
            }),
            _ = shutdown.recv() => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_grow_with_empty_polls_and_reset_when_rows_come() {
        let p = Pacer::new(5 * MS, 1000 * MS);
        assert_eq!(p.next_wait(), 5 * MS);
        let waits: Vec<Duration> = (0..10)
            .map(|_| {
                p.record(Fill::Empty);
                p.next_wait()
            })
            .collect();
        assert_eq!(&waits[..4], &[5 * MS, 10 * MS, 20 * MS, 40 * MS]);
        assert_eq!(waits[9], 1000 * MS, "capped at poll_interval");
        assert!(p.idle());
        p.record(Fill::Partial);
        assert_eq!(p.next_wait(), 5 * MS);
        assert!(!p.idle());
    }

    #[tokio::test]
    async fn a_wake_up_cuts_the_idle_wait_short() {
        let p = std::sync::Arc::new(Pacer::new(5 * MS, 60_000 * MS));
        for _ in 0..30 {
            p.record(Fill::Empty);
        }
        let (_trigger, mut shutdown) = crate::shutdown::channel();
        let waiter = {
            let p = std::sync::Arc::clone(&p);
            tokio::spawn(async move { p.wait_turn(&mut shutdown).await })
        };
        tokio::time::sleep(20 * MS).await;
        p.wake();
        let cause = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken long before the 60 s wait")
            .unwrap();
        assert_eq!(cause, Some(WakeCause::Notify));
    }

    #[tokio::test]
    async fn each_wait_says_what_ended_it() {
        let p = std::sync::Arc::new(Pacer::new(5 * MS, 60_000 * MS));
        let (_trigger, mut shutdown) = crate::shutdown::channel();
        // The first wait after rows is `min`: it runs its course.
        assert_eq!(p.wait_turn(&mut shutdown).await, Some(WakeCause::Timer));
        for _ in 0..30 {
            p.record(Fill::Empty);
        }
        let waiter = {
            let p = std::sync::Arc::clone(&p);
            let mut shutdown = shutdown.clone();
            tokio::spawn(async move { p.wait_turn(&mut shutdown).await })
        };
        tokio::time::sleep(20 * MS).await;
        // Another worker's claim came back full.
        p.record(Fill::Full);
        let cause = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken long before the 60 s wait")
            .unwrap();
        assert_eq!(cause, Some(WakeCause::Refill));
        let (stop, mut stopped) = crate::shutdown::channel();
        stop.trigger();
        p.record(Fill::Empty);
        p.record(Fill::Empty);
        assert_eq!(p.wait_turn(&mut stopped).await, None);
    }

    #[tokio::test]
    async fn one_idle_worker_at_a_time_holds_the_clock() {
        let p = std::sync::Arc::new(Pacer::new(50 * MS, 50 * MS));
        p.record(Fill::Empty);
        let (_trigger, shutdown) = crate::shutdown::channel();
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let p = std::sync::Arc::clone(&p);
            let mut s = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                p.wait_turn(&mut s).await;
                tokio::time::Instant::now()
            }));
        }
        let mut done = Vec::new();
        for t in tasks {
            done.push(t.await.unwrap() - start);
        }
        done.sort();
        // Three waiters poll one after the other, a wait apart, not all at once.
        assert!(done[2] >= 150 * MS, "{done:?}");
    }
}
