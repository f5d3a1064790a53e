//! Sandbox limits of one tenant instance, resolved from config, and the topic allow-list.

use std::time::Duration;

use wasmtime::{StoreLimits, StoreLimitsBuilder};

use crate::config::{
    DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_FAILURES, DEFAULT_CALL_TIMEOUT,
    DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_OUTPUTS_PER_ROW, DEFAULT_MEMORY_MB, LimitsSpec,
};

/// Limits applied to one tenant's Store and to what its plugin may emit.
#[derive(Debug, Clone)]
pub struct Limits {
    pub memory_bytes: usize,
    pub call_timeout: Duration,
    /// `None` = any topic.
    pub allowed_topics: Option<Vec<TopicPattern>>,
    pub max_outputs_per_row: usize,
    pub max_message_bytes: usize,
    pub breaker_failures: u32,
    pub breaker_cooldown: Duration,
}

impl Limits {
    /// Resolves a (validated) spec, filling unset fields with Sluice's defaults.
    pub fn resolve(spec: &LimitsSpec) -> Result<Self, String> {
        let memory_mb = spec.memory_mb.unwrap_or(DEFAULT_MEMORY_MB);
        let memory_bytes = usize::try_from(memory_mb.saturating_mul(1024 * 1024))
            .map_err(|_| format!("memory_mb {memory_mb} is too large"))?;
        let allowed_topics = spec
            .allowed_topics
            .as_ref()
            .map(|patterns| patterns.iter().map(|p| TopicPattern::parse(p)).collect())
            .transpose()?;
        Ok(Self {
            memory_bytes,
            call_timeout: spec.call_timeout.unwrap_or(DEFAULT_CALL_TIMEOUT),
            allowed_topics,
            max_outputs_per_row: spec
                .max_outputs_per_row
                .unwrap_or(DEFAULT_MAX_OUTPUTS_PER_ROW),
            max_message_bytes: spec.max_message_bytes.unwrap_or(DEFAULT_MAX_MESSAGE_BYTES),
            breaker_failures: spec
                .circuit_breaker_failures
                .unwrap_or(DEFAULT_BREAKER_FAILURES),
            breaker_cooldown: spec
                .circuit_breaker_cooldown
                .unwrap_or(DEFAULT_BREAKER_COOLDOWN),
        })
    }

    /// wasmtime limits for a new Store: a failed `memory.grow` traps instead of returning -1,
    /// so a runaway guest stops at once with a clear reason.
    pub fn store_limits(&self) -> StoreLimits {
        StoreLimitsBuilder::new()
            .memory_size(self.memory_bytes)
            .trap_on_grow_failure(true)
            .build()
    }

    pub fn topic_allowed(&self, topic: &str) -> bool {
        match &self.allowed_topics {
            None => true,
            Some(patterns) => patterns.iter().any(|p| p.matches(topic)),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        // The default spec always resolves.
        Self::resolve(&LimitsSpec::default()).unwrap_or(Self {
            memory_bytes: 0,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            allowed_topics: None,
            max_outputs_per_row: DEFAULT_MAX_OUTPUTS_PER_ROW,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            breaker_failures: DEFAULT_BREAKER_FAILURES,
            breaker_cooldown: DEFAULT_BREAKER_COOLDOWN,
        })
    }
}

/// An exact topic name, or `prefix*` (conventionally `prefix.*`) matching every topic that
/// starts with `prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicPattern {
    Exact(String),
    Prefix(String),
}

impl TopicPattern {
    pub fn parse(pattern: &str) -> Result<Self, String> {
        let invalid = |why: &str| format!("invalid topic pattern {pattern:?}: {why}");
        if pattern.is_empty() {
            return Err(invalid("empty"));
        }
        let (body, prefix) = match pattern.strip_suffix('*') {
            Some(body) => (body, true),
            None => (pattern, false),
        };
        if body.contains('*') {
            return Err(invalid("'*' is only allowed at the end"));
        }
        if !body
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(invalid(
                "topics use only ASCII letters, digits, '.', '_' and '-'",
            ));
        }
        Ok(if prefix {
            Self::Prefix(body.to_owned())
        } else {
            Self::Exact(body.to_owned())
        })
    }

    pub fn matches(&self, topic: &str) -> bool {
        match self {
            Self::Exact(t) => t == topic,
            Self::Prefix(p) => topic.starts_with(p.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_and_prefix_patterns_match_as_documented() {
        let p = TopicPattern::parse("acme.*").unwrap();
        assert!(p.matches("acme.orders"));
        assert!(!p.matches("acmeorders"));
        assert!(!p.matches("other.acme.x"));
        let e = TopicPattern::parse("audit").unwrap();
        assert!(e.matches("audit"));
        assert!(!e.matches("audit2"));
    }

    #[test]
    fn malformed_patterns_are_refused() {
        for bad in ["", "a*b", "**", "a b", "a/b"] {
            assert!(TopicPattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unset_allow_list_allows_everything_and_defaults_apply() {
        let limits = Limits::resolve(&LimitsSpec::default()).unwrap();
        assert!(limits.topic_allowed("anything"));
        assert_eq!(limits.call_timeout, DEFAULT_CALL_TIMEOUT);
        assert_eq!(limits.memory_bytes as u64, DEFAULT_MEMORY_MB * 1024 * 1024);
    }

    #[test]
    fn allow_list_restricts_topics() {
        let spec = LimitsSpec {
            allowed_topics: Some(vec!["acme.*".into(), "audit".into()]),
            ..LimitsSpec::default()
        };
        let limits = Limits::resolve(&spec).unwrap();
        assert!(limits.topic_allowed("acme.x"));
        assert!(limits.topic_allowed("audit"));
        assert!(!limits.topic_allowed("outbox.event.x"));
    }
}
