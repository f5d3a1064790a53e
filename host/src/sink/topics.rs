//! Which topics the broker has, as far as the sink has seen.
//!
//! librdkafka holds a message to a topic it does not know for `topic.metadata.propagation.max.ms`
//! (30 s by default) before failing it, and a batch waits for its slowest delivery report: one
//! tenant routing to a missing topic would hold up every other row of the batch. So the sink
//! asks the broker's metadata about a topic before its first send and fails messages to a
//! missing topic at once. A topic found is remembered for good (a send that later reports it
//! unknown forgets it again); a topic found missing is asked about again after
//! [`MISSING_TOPIC_RECHECK`], so a topic created later starts working.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a topic found missing is taken as missing before the broker is asked again.
pub(crate) const MISSING_TOPIC_RECHECK: Duration = Duration::from_secs(5);
/// Most topics remembered. Plugins choose topic names (within their `allowed_topics`), so
/// the set must not grow without bound; past this, topics found missing are forgotten first.
const MAX_TOPICS: usize = 10_000;

/// What is known about a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    /// The broker has it.
    Present,
    /// The broker said recently that it has no such topic.
    Missing,
    /// Not asked yet, or asked too long ago: ask the broker.
    Unknown,
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    Present,
    Missing { checked: Instant },
}

/// The sink's topic-existence cache.
#[derive(Debug)]
pub(crate) struct TopicCache {
    entries: Mutex<HashMap<String, Entry>>,
    recheck: Duration,
}

impl Default for TopicCache {
    fn default() -> Self {
        Self::new(MISSING_TOPIC_RECHECK)
    }
}

impl TopicCache {
    /// A cache that asks about a missing topic again `recheck` after it was found missing.
    pub(crate) fn new(recheck: Duration) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            recheck,
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn lookup(&self, topic: &str, now: Instant) -> Known {
        match self.entries().get(topic) {
            Some(Entry::Present) => Known::Present,
            Some(Entry::Missing { checked })
                if now.saturating_duration_since(*checked) < self.recheck =>
            {
                Known::Missing
            }
            Some(Entry::Missing { .. }) | None => Known::Unknown,
        }
    }

    /// Records that the broker has `topic`.
    pub(crate) fn found(&self, topic: &str) {
        let mut entries = self.entries();
        if !matches!(entries.get(topic), Some(Entry::Present)) {
            make_room(&mut entries, Instant::now(), self.recheck);
            entries.insert(topic.to_owned(), Entry::Present);
        }
    }

    /// Records that the broker said, at `now`, that it has no `topic`.
    pub(crate) fn missing(&self, topic: &str, now: Instant) {
        let mut entries = self.entries();
        make_room(&mut entries, now, self.recheck);
        entries.insert(topic.to_owned(), Entry::Missing { checked: now });
    }

    /// Forgets what is known about `topic` (a send to it failed as unknown after all).
    pub(crate) fn forget(&self, topic: &str) {
        self.entries().remove(topic);
    }
}

/// Keeps the map below [`MAX_TOPICS`]: drops stale "missing" entries, then all of them.
fn make_room(entries: &mut HashMap<String, Entry>, now: Instant, recheck: Duration) {
    if entries.len() < MAX_TOPICS {
        return;
    }
    entries.retain(|_, e| match e {
        Entry::Present => true,
        Entry::Missing { checked } => now.saturating_duration_since(*checked) < recheck,
    });
    if entries.len() >= MAX_TOPICS {
        entries.retain(|_, e| matches!(e, Entry::Present));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn a_topic_is_unknown_until_the_broker_was_asked() {
        let cache = TopicCache::new(5 * SEC);
        assert_eq!(cache.lookup("orders", Instant::now()), Known::Unknown);
        cache.found("orders");
        assert_eq!(cache.lookup("orders", Instant::now()), Known::Present);
    }

    #[test]
    fn a_missing_topic_is_asked_about_again_after_the_recheck_interval() {
        let cache = TopicCache::new(5 * SEC);
        let t0 = Instant::now();
        cache.missing("ghost", t0);
        assert_eq!(cache.lookup("ghost", t0 + 4 * SEC), Known::Missing);
        assert_eq!(cache.lookup("ghost", t0 + 5 * SEC), Known::Unknown);
        // Created meanwhile: found on the next look.
        cache.found("ghost");
        assert_eq!(cache.lookup("ghost", t0 + 6 * SEC), Known::Present);
    }

    #[test]
    fn a_forgotten_topic_is_asked_about_again() {
        let cache = TopicCache::default();
        cache.found("orders");
        cache.forget("orders");
        assert_eq!(cache.lookup("orders", Instant::now()), Known::Unknown);
    }

    #[test]
    fn endless_missing_topic_names_do_not_grow_the_cache_without_bound() {
        let cache = TopicCache::new(5 * SEC);
        cache.found("orders");
        let now = Instant::now();
        for i in 0..(MAX_TOPICS * 2) {
            cache.missing(&format!("ghost-{i}"), now);
        }
        assert!(cache.entries().len() <= MAX_TOPICS);
        assert_eq!(
            cache.lookup("orders", now),
            Known::Present,
            "found topics are kept"
        );
    }
}
