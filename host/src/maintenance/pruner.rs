//! Retention: in `mark = "published_at"` mode sent rows stay in the table as an audit trail;
//! the pruner deletes those older than `relay.retention` every `relay.prune_interval`. The
//! store deletes in bounded chunks, so pruning never holds long locks or builds a huge
//! transaction, and only one process prunes a table at a time. Dead rows are never pruned
//! (they are not sent): they stay until replayed or purged with `sluice dead purge`.

use std::time::Duration;

use serde::Deserialize;

use crate::problem::Problem;
use crate::shutdown::Shutdown;
use crate::store::{Driver, MarkMode, OutboxStore, PartitionRound, Store};

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

/// `relay.retention_mode`: how sent rows past `relay.retention` leave the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetentionMode {
    /// Deleted in bounded chunks (every database, any table).
    #[default]
    Delete,
    /// PostgreSQL tables partitioned by `RANGE (created_at)`: partitions wholly older than the
    /// retention whose rows were all sent before it are detached and dropped; rows are never
    /// deleted one by one.
    DropPartitions,
}

/// What is wrong with `relay.retention_mode = "drop-partitions"` given the other keys (the
/// table itself is checked when the relay opens it, and by `sluice config check --connect`).
pub(crate) fn retention_mode_problems(
    mode: RetentionMode,
    mark: MarkMode,
    driver: Option<Driver>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    if mode != RetentionMode::DropPartitions {
        return problems;
    }
    if mark != MarkMode::PublishedAt {
        problems.push(Problem::new(
            "relay.retention_mode",
            "\"drop-partitions\" needs relay.mark = \"published_at\": with mark = \"delete\" \
             sent rows are deleted at once and nothing is retained",
        ));
    }
    if let Some(d) = driver
        && d != Driver::Postgres
    {
        problems.push(Problem::new(
            "relay.retention_mode",
            format!(
                "\"drop-partitions\" is PostgreSQL only ({} tables are not partitioned by \
                 Sluice); use \"delete\"",
                d.name()
            ),
        ));
    }
    problems
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

/// Partition maintenance every `interval` until `shutdown` (PostgreSQL): partitions made
/// ahead for a table `sluice migrate --partitioned` set up, and with `drop_after`
/// (`relay.retention_mode = "drop-partitions"`) old partitions whose rows were all sent before
/// it detached and dropped. Runs once at start, then every `interval`; errors are logged and
/// retried at the next round.
pub(crate) async fn run_partitions(
    store: &Store,
    drop_after: Option<Duration>,
    interval: Duration,
    mut shutdown: Shutdown,
    dropped: &(dyn Fn(u64) + Send + Sync),
) {
    loop {
        let result = tokio::select! {
            r = store.maintain_partitions(drop_after) => r,
            _ = shutdown.recv() => return,
        };
        match result {
            Ok(round) => log_round(&round, drop_after, dropped),
            Err(e) => tracing::warn!(
                error = %e,
                "partition maintenance failed; trying again later"
            ),
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.recv() => return,
        }
    }
}

/// Logs what a round did, and counts the partitions dropped.
fn log_round(round: &PartitionRound, retention: Option<Duration>, dropped: &dyn Fn(u64)) {
    if !round.created.is_empty() {
        tracing::info!(partitions = ?round.created, "made outbox partitions ahead");
    }
    if !round.dropped.is_empty() {
        dropped(round.dropped.len() as u64);
        tracing::info!(
            partitions = ?round.dropped,
            ?retention,
            "dropped outbox partitions past relay.retention"
        );
    }
    if !round.kept.is_empty() {
        tracing::debug!(
            partitions = ?round.kept,
            "kept old outbox partitions: they hold unsent, dead or recently sent rows"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_partitions_needs_published_at_and_postgres() {
        let pg = Some(Driver::Postgres);
        let ok = retention_mode_problems(RetentionMode::DropPartitions, MarkMode::PublishedAt, pg);
        assert!(ok.is_empty(), "{ok:?}");
        let delete = retention_mode_problems(RetentionMode::DropPartitions, MarkMode::Delete, pg);
        assert_eq!(delete.len(), 1);
        assert_eq!(delete[0].key, "relay.retention_mode");
        for d in [Driver::Mysql, Driver::Sqlite] {
            let p = retention_mode_problems(
                RetentionMode::DropPartitions,
                MarkMode::PublishedAt,
                Some(d),
            );
            assert!(p[0].to_string().contains("PostgreSQL only"), "{p:?}");
        }
        assert!(retention_mode_problems(RetentionMode::Delete, MarkMode::Delete, pg).is_empty());
    }
}
