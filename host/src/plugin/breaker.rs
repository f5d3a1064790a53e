//! Per-tenant circuit breaker: after K consecutive plugin failures the tenant is paused for a
//! cool-down (its rows are not claimed and not run), then one row is tried again ("half
//! open"): success closes the breaker, failure re-opens it at once.

use std::time::{Duration, Instant};

/// What the breaker says about running the next row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Run,
    /// Paused until this instant.
    Paused(Instant),
}

/// Breaker state transitions worth logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    None,
    Opened,
    Closed,
}

#[derive(Debug)]
pub struct CircuitBreaker {
    threshold: u32,
    cooldown: Duration,
    consecutive_failures: u32,
    open_until: Option<Instant>,
}

impl CircuitBreaker {
    pub fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cooldown,
            consecutive_failures: 0,
            open_until: None,
        }
    }

    pub fn gate(&self, now: Instant) -> Gate {
        match self.open_until {
            Some(until) if now < until => Gate::Paused(until),
            _ => Gate::Run,
        }
    }

    pub fn record_success(&mut self) -> Transition {
        let was_tripped = self.consecutive_failures >= self.threshold;
        self.consecutive_failures = 0;
        self.open_until = None;
        if was_tripped {
            Transition::Closed
        } else {
            Transition::None
        }
    }

    /// A call that ran into its `call_timeout` opens the breaker at once: each such call
    /// burns a core for the whole timeout, so waiting for K of them would let one tenant take
    /// K × call_timeout of CPU from the others every cool-down.
    pub fn record_deadline(&mut self, now: Instant) -> Transition {
        self.consecutive_failures = self
            .consecutive_failures
            .saturating_add(1)
            .max(self.threshold);
        self.open_until = Some(now + self.cooldown);
        Transition::Opened
    }

    pub fn record_failure(&mut self, now: Instant) -> Transition {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        if self.consecutive_failures >= self.threshold {
            // Also after a failed half-open try: the count stays at or above the threshold.
            self.open_until = Some(now + self.cooldown);
            Transition::Opened
        } else {
            Transition::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_k_failures_pauses_for_the_cooldown_then_half_opens() {
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new(3, Duration::from_secs(10));
        assert_eq!(b.record_failure(t0), Transition::None);
        assert_eq!(b.record_failure(t0), Transition::None);
        assert_eq!(b.gate(t0), Gate::Run);
        assert_eq!(b.record_failure(t0), Transition::Opened);
        assert_eq!(
            b.gate(t0 + Duration::from_secs(5)),
            Gate::Paused(t0 + Duration::from_secs(10))
        );
        // Cool-down over: one try; a failure re-opens at once.
        let t1 = t0 + Duration::from_secs(11);
        assert_eq!(b.gate(t1), Gate::Run);
        assert_eq!(b.record_failure(t1), Transition::Opened);
        assert!(matches!(b.gate(t1), Gate::Paused(_)));
        // A success after the next cool-down closes it.
        let t2 = t1 + Duration::from_secs(11);
        assert_eq!(b.record_success(), Transition::Closed);
        assert_eq!(b.gate(t2), Gate::Run);
        assert_eq!(b.record_failure(t2), Transition::None, "count starts over");
    }

    #[test]
    fn a_deadline_overrun_opens_at_once() {
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new(5, Duration::from_secs(10));
        assert_eq!(b.record_deadline(t0), Transition::Opened);
        assert!(matches!(b.gate(t0), Gate::Paused(_)));
        assert_eq!(b.record_success(), Transition::Closed);
    }

    #[test]
    fn successes_reset_the_count() {
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new(2, Duration::from_secs(1));
        b.record_failure(t0);
        assert_eq!(b.record_success(), Transition::None);
        assert_eq!(b.record_failure(t0), Transition::None);
    }
}
