//! Per-tenant circuit breaker: after K consecutive failures of the tenant's plugin instance, or
//! K consecutive refused publishes of its rows, the tenant is paused for a cool-down (its rows
//! are not claimed and not run); then rows are tried again ("half open"): a failure re-opens
//! it at once, a success closes it.
//!
//! What counts is the *tenant's* health, not a row's: traps, deadline overruns, memory-cap
//! hits, `retryable` errors and failed instantiations (instance failures); messages the broker
//! refused for a reason of the tenant's making, such as a topic it lacks (refused publishes).
//! A row's own `permanent` error or refused output is neither: five malformed rows must not
//! pause a healthy tenant. The two counts are kept apart, so a transform that succeeds does
//! not hide the refused publish that follows it.

use std::time::{Duration, Instant};

/// What the breaker says about running the next row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    Run,
    /// Paused until this instant.
    Paused(Instant),
}

/// Breaker state transitions worth logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    None,
    Opened,
    Closed,
}

#[derive(Debug)]
pub(crate) struct CircuitBreaker {
    threshold: u32,
    cooldown: Duration,
    instance_failures: u32,
    refused_publishes: u32,
    open_until: Option<Instant>,
    /// Opened and not closed since (paused, or half open after the cool-down).
    tripped: bool,
}

impl CircuitBreaker {
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cooldown,
            instance_failures: 0,
            refused_publishes: 0,
            open_until: None,
            tripped: false,
        }
    }

    pub(crate) fn gate(&self, now: Instant) -> Gate {
        match self.open_until {
            Some(until) if now < until => Gate::Paused(until),
            _ => Gate::Run,
        }
    }

    /// Until when rows are not run (open, not yet half open).
    pub(crate) fn open_until(&self) -> Option<Instant> {
        self.open_until
    }

    /// Whether the breaker is open or half open.
    pub(crate) fn tripped(&self) -> bool {
        self.tripped
    }

    /// The instance answered (messages, or a row's own error).
    pub(crate) fn record_success(&mut self) -> Transition {
        self.instance_failures = 0;
        self.maybe_close()
    }

    /// A call that ran into its `call_timeout` opens the breaker at once: each such call
    /// burns a core (or holds rows) for the whole timeout, so waiting for K of them would let
    /// one tenant take K × call_timeout from the others every cool-down.
    pub(crate) fn record_deadline(&mut self, now: Instant) -> Transition {
        self.instance_failures = self.instance_failures.saturating_add(1).max(self.threshold);
        self.open(now)
    }

    /// The instance failed (trap, memory cap, `retryable` error, failed instantiation).
    pub(crate) fn record_failure(&mut self, now: Instant) -> Transition {
        self.instance_failures = self.instance_failures.saturating_add(1);
        if self.instance_failures >= self.threshold {
            // Also after a failed half-open try: the count stays at or above the threshold.
            self.open(now)
        } else {
            Transition::None
        }
    }

    /// What publishing did with the tenant's rows of one batch. The order within a batch is
    /// not known, so refusals are counted as if they came after the deliveries: a batch with
    /// deliveries restarts the count, its refusals then add to it.
    pub(crate) fn record_publish(
        &mut self,
        delivered: usize,
        refused: usize,
        now: Instant,
    ) -> Transition {
        if delivered > 0 {
            self.refused_publishes = 0;
        }
        let refused = u32::try_from(refused).unwrap_or(u32::MAX);
        self.refused_publishes = self.refused_publishes.saturating_add(refused);
        if self.refused_publishes >= self.threshold {
            self.open(now)
        } else if delivered > 0 {
            self.maybe_close()
        } else {
            Transition::None
        }
    }

    /// Forgets everything (a new plugin version deserves a fresh start). Returns whether the
    /// breaker had been tripped.
    pub(crate) fn reset(&mut self) -> bool {
        let was = self.tripped;
        *self = Self::new(self.threshold, self.cooldown);
        was
    }

    fn open(&mut self, now: Instant) -> Transition {
        self.open_until = Some(now + self.cooldown);
        self.tripped = true;
        Transition::Opened
    }

    fn maybe_close(&mut self) -> Transition {
        let healthy =
            self.instance_failures < self.threshold && self.refused_publishes < self.threshold;
        if self.tripped && healthy {
            self.tripped = false;
            self.open_until = None;
            Transition::Closed
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
    fn refused_publishes_trip_the_breaker_even_when_every_transform_succeeds() {
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new(3, Duration::from_secs(10));
        // One row per batch: transform succeeds, then its publish is refused.
        for round in 0..3 {
            assert_eq!(b.record_success(), Transition::None);
            let expected = if round == 2 {
                Transition::Opened
            } else {
                Transition::None
            };
            assert_eq!(b.record_publish(0, 1, t0), expected, "round {round}");
        }
        assert!(matches!(b.gate(t0), Gate::Paused(_)));
        // Half open after the cool-down: a transform success alone does not close it…
        assert_eq!(b.record_success(), Transition::None);
        assert!(b.tripped());
        // …a delivered publish does.
        let t1 = t0 + Duration::from_secs(11);
        assert_eq!(b.record_publish(1, 0, t1), Transition::Closed);
        assert_eq!(b.gate(t1), Gate::Run);
    }

    #[test]
    fn deliveries_restart_the_refusal_count() {
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new(3, Duration::from_secs(10));
        assert_eq!(b.record_publish(0, 2, t0), Transition::None);
        assert_eq!(
            b.record_publish(5, 1, t0),
            Transition::None,
            "1 after a delivery"
        );
        assert_eq!(b.record_publish(0, 2, t0), Transition::Opened);
        let mut b = CircuitBreaker::new(3, Duration::from_secs(10));
        assert_eq!(
            b.record_publish(1, 3, t0),
            Transition::Opened,
            "3 in one batch"
        );
    }

    #[test]
    fn reset_forgets_an_open_breaker() {
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new(1, Duration::from_secs(10));
        b.record_failure(t0);
        assert!(b.reset());
        assert_eq!(b.gate(t0), Gate::Run);
        assert!(!b.reset());
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
