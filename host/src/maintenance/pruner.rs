//! Retention: in `mark = "published_at"` mode sent rows stay in the table as an audit trail;
//! the pruner deletes those older than `relay.retention` every `relay.prune_interval`. The
//! store deletes in bounded chunks, so pruning never holds long locks or builds a huge
//! transaction, and only one process prunes a table at a time. Dead rows are never pruned
//! (they are not sent): they stay until replayed or purged with `sluice dead purge`.

use std::time::Duration;

use serde::Deserialize;

use crate::shutdown::Shutdown;
use crate::store::OutboxStore;

/// In `mark = "published_at"` mode, sent rows older than this are deleted.
pub(crate) const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often the pruner looks for sent rows past `relay.retention`.
pub(crate) const DEFAULT_PRUNE_INTERVAL: Duration = Duration::from_secs(60);

/// `relay.retention`: a duration, or `"forever"` to keep sent rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    Keep(Duration),
    Forever,
}

impl Default for Retention {
    fn default() -> Self {
        Self::Keep(DEFAULT_RETENTION)
    }
}

impl<'de> Deserialize<'de> for Retention {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text == "forever" {
            return Ok(Self::Forever);
        }
        humantime::parse_duration(&text)
            .map(Self::Keep)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "{e}: expected a duration such as \"7d\" or \"forever\""
                ))
            })
    }
}

/// Prunes sent rows older than `retention` every `interval` until `shutdown`. Errors are
/// logged and retried at the next interval; a prune in progress is abandoned at shutdown
/// (each chunk is its own statement, so nothing is left half done).
pub(crate) async fn run<S: OutboxStore>(
    store: &S,
    retention: Duration,
    interval: Duration,
    mut shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.recv() => return,
        }
        let result = tokio::select! {
            r = store.prune_sent(retention) => r,
            _ = shutdown.recv() => return,
        };
        match result {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                rows = n,
                ?retention,
                "pruned sent rows past relay.retention"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "pruning sent rows failed; trying again later")
            }
        }
    }
}
