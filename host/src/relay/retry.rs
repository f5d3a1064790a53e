//! The retry policy: how long a failed row waits before its next attempt, and when it is
//! dead-lettered instead (`[relay.retry]`).

use std::time::Duration;

use crate::model::Broker;
use crate::problem::Problem;
use crate::setting_group::{Humantime, above_zero, at_least_one, setting_group};
use crate::sink::check_destination;
use crate::store::Disposition;

setting_group! {
    /// `[relay.retry]` as written; [`RetrySettings`] is what a relay uses. The defaults:
    /// with them a row is retried after about 1 s, 2 s, 4 s, … 256 s and the last attempt
    /// comes about 8.5 minutes after the first failure; the jitter keeps rows that failed
    /// together from retrying in lock-step.
    pub struct RetrySpec => RetrySettings {
        /// delay after the first failure
        initial: Duration as Humantime = Duration::from_secs(1) => "`\"1s\"`", check above_zero;
        /// longest delay
        max: Duration as Humantime = Duration::from_secs(300) => "`\"5m\"`";
        /// growth of the delay per failed attempt (≥ 1)
        multiplier: f64 = 2.0 => "`2.0`", check multiplier;
        /// each delay is moved at random by up to ± this fraction (0–1), so rows that failed together do not retry together
        jitter: f64 = 0.2 => "`0.2`", check fraction;
        /// attempts, the first delivery included, before the row is dead
        max_attempts: u32 = 10 => "`10`", check at_least_one;
        /// if set, a copy of each row that goes dead is published here
        dead_letter_topic: String => "none";
        /// the broker `dead_letter_topic` is on: `"kafka"`, `"nats"`, `"rabbitmq"` or `"redis"` (its section must be configured)
        dead_letter_broker: Broker = Broker::Kafka => "`\"kafka\"`";
    }
}

fn multiplier(value: &f64) -> Result<(), String> {
    match value.is_finite() && *value >= 1.0 {
        true => Ok(()),
        false => Err(format!("must be at least 1.0, got {value}")),
    }
}

fn fraction(value: &f64) -> Result<(), String> {
    match (0.0..=1.0).contains(value) {
        true => Ok(()),
        false => Err(format!("must be between 0 and 1, got {value}")),
    }
}

impl RetrySettings {
    /// Problems with these settings, at their `relay.retry.` keys.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = self.key_problems("relay.retry");
        if let Some(topic) = &self.dead_letter_topic
            && let Err(why) = check_destination(self.dead_letter_broker, topic)
        {
            problems.push(Problem::new(
                "relay.retry.dead_letter_topic",
                format!(
                    "{topic:?} is not a valid {}: {why}",
                    crate::sink::destination_noun(self.dead_letter_broker)
                ),
            ));
        }
        if self.max < self.initial {
            problems.push(Problem::new(
                "relay.retry.max",
                "must not be shorter than relay.retry.initial",
            ));
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
    use crate::setting_group::{SettingGroup, undocumented};

    #[test]
    fn the_reference_lists_every_retry_key_as_declared() {
        let reference = include_str!("../../../docs/configuration.md");
        if let Some(block) = undocumented(reference, &RetrySpec::docs()) {
            panic!("docs/configuration.md's [relay.retry] table must hold these rows:\n{block}");
        }
    }

    fn policy(jitter: f64, max_attempts: u32) -> RetryPolicy {
        RetryPolicy::new(&RetrySettings {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            multiplier: 2.0,
            jitter,
            max_attempts,
            dead_letter_topic: None,
            dead_letter_broker: Broker::Kafka,
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
