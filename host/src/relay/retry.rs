//! The retry policy: how long a failed row waits before its next attempt, and when it is
//! dead-lettered instead (`[relay.retry]`).

use std::time::Duration;

use serde::Deserialize;

use crate::problem::Problem;
use crate::sink::check_topic_name;
use crate::store::Disposition;

/// First retry delay of a failed row.
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_secs(1);
/// Longest retry delay: a row keeps being retried at least this often until it is dead.
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(300);
/// Growth of the retry delay per attempt.
pub const DEFAULT_RETRY_MULTIPLIER: f64 = 2.0;
/// Each delay is moved by up to ±20 % at random so rows that failed together do not retry in
/// lock-step.
pub const DEFAULT_RETRY_JITTER: f64 = 0.2;
/// Attempts before a row is dead-lettered; with the defaults the last one comes about
/// 8.5 minutes after the first failure.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// `[relay.retry]`: what happens to a row whose plugin call or publish failed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySettings {
    /// Delay after the first failure (default `"1s"`).
    #[serde(with = "humantime_serde")]
    pub initial: Duration,
    /// Longest delay (default `"5m"`).
    #[serde(with = "humantime_serde")]
    pub max: Duration,
    /// Growth of the delay per failed attempt, at least 1 (default 2.0).
    pub multiplier: f64,
    /// Fraction (0–1) by which each delay is randomly moved up or down.
    pub jitter: f64,
    /// Attempts (the first delivery included) before the row is dead.
    pub max_attempts: u32,
    /// If set, a copy of every row that goes dead is published here.
    pub dead_letter_topic: Option<String>,
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            initial: DEFAULT_RETRY_INITIAL,
            max: DEFAULT_RETRY_MAX,
            multiplier: DEFAULT_RETRY_MULTIPLIER,
            jitter: DEFAULT_RETRY_JITTER,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            dead_letter_topic: None,
        }
    }
}

impl RetrySettings {
    /// Problems with these settings, at their `relay.retry.` keys.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if self.initial.is_zero() {
            problems.push(Problem::new(
                "relay.retry.initial",
                "must be greater than 0",
            ));
        }
        if self.max < self.initial {
            problems.push(Problem::new(
                "relay.retry.max",
                "must not be shorter than relay.retry.initial",
            ));
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            problems.push(Problem::new(
                "relay.retry.multiplier",
                format!("must be at least 1.0, got {}", self.multiplier),
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            problems.push(Problem::new(
                "relay.retry.jitter",
                format!("must be between 0 and 1, got {}", self.jitter),
            ));
        }
        if self.max_attempts == 0 {
            problems.push(Problem::new(
                "relay.retry.max_attempts",
                "must be at least 1",
            ));
        }
        if let Some(topic) = &self.dead_letter_topic
            && let Err(why) = check_topic_name(topic)
        {
            problems.push(Problem::new("relay.retry.dead_letter_topic", why));
        }
        problems
    }
}

/// Exponential backoff with jitter, capped, and a maximum number of attempts.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    initial: Duration,
    max: Duration,
    multiplier: f64,
    jitter: f64,
    max_attempts: u32,
}

impl RetryPolicy {
    /// The policy `[relay.retry]` describes.
    pub fn new(config: &RetrySettings) -> Self {
        Self {
            initial: config.initial,
            max: config.max,
            multiplier: config.multiplier,
            jitter: config.jitter,
            max_attempts: config.max_attempts,
        }
    }

    /// The disposition of a row that had failed `failed_before` times and has just failed
    /// again; `permanent` failures are dead at once.
    pub fn after_failure(&self, failed_before: i32, permanent: bool) -> Disposition {
        let attempts_made = u32::try_from(failed_before).unwrap_or(0).saturating_add(1);
        if permanent || attempts_made >= self.max_attempts {
            Disposition::Dead
        } else {
            Disposition::Retry(self.delay(failed_before, fastrand::f64()))
        }
    }

    /// The disposition of a row whose publish failed for a reason outside the row (broker
    /// down, timeouts): retried after `initial`, without using up an attempt, so an outage
    /// never dead-letters rows and recovery does not wait for a long backoff. The outage
    /// itself paces the retries (each batch waits for the producer's timeout).
    pub fn after_transient_failure(&self) -> Disposition {
        Disposition::Wait(self.initial)
    }

    /// `initial · multiplier^failed_before`, capped at `max`, then moved by up to ±jitter;
    /// `unit` is a random number in [0, 1).
    fn delay(&self, failed_before: i32, unit: f64) -> Duration {
        let exponent = failed_before.clamp(0, 1_000);
        let base = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = base.min(self.max.as_secs_f64());
        let jittered = capped * (1.0 + self.jitter * (2.0 * unit - 1.0));
        Duration::from_secs_f64(jittered.clamp(0.0, self.max.as_secs_f64()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(jitter: f64, max_attempts: u32) -> RetryPolicy {
        RetryPolicy::new(&RetrySettings {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            multiplier: 2.0,
            jitter,
            max_attempts,
            dead_letter_topic: None,
        })
    }

    #[test]
    fn delays_grow_exponentially_and_cap_at_max() {
        let p = policy(0.0, 100);
        assert_eq!(p.delay(0, 0.5), Duration::from_secs(1));
        assert_eq!(p.delay(1, 0.5), Duration::from_secs(2));
        assert_eq!(p.delay(3, 0.5), Duration::from_secs(8));
        assert_eq!(p.delay(50, 0.5), Duration::from_secs(60));
        assert_eq!(p.delay(-3, 0.5), Duration::from_secs(1));
    }

    #[test]
    fn jitter_moves_delays_within_the_band() {
        let p = policy(0.2, 100);
        assert_eq!(p.delay(2, 0.0), Duration::from_secs_f64(3.2));
        assert_eq!(p.delay(2, 0.5), Duration::from_secs(4));
        assert!(p.delay(2, 0.999_999) <= Duration::from_secs_f64(4.8));
        // Never beyond max, even with jitter upwards.
        assert_eq!(p.delay(50, 0.999), Duration::from_secs(60));
    }

    #[test]
    fn rows_die_at_max_attempts_or_at_once_when_permanent() {
        let p = policy(0.0, 3);
        assert!(matches!(p.after_failure(0, false), Disposition::Retry(_)));
        assert!(matches!(p.after_failure(1, false), Disposition::Retry(_)));
        assert_eq!(p.after_failure(2, false), Disposition::Dead);
        assert_eq!(p.after_failure(0, true), Disposition::Dead);
        assert_eq!(policy(0.0, 1).after_failure(0, false), Disposition::Dead);
    }
}
