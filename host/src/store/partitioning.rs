//! Partitioned outbox tables, whatever the database: how often `sluice migrate --partitioned`
//! cuts the table ([`PartitionInterval`]), how the table says it was set up that way (its
//! comment), what a table's partitioning is ([`Partitioning`]) and what one round of partition
//! maintenance did ([`PartitionRound`]). Only PostgreSQL partitions (`postgres/partitions.rs`).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Duration as TimeDelta, DurationRound, Utc};

/// The table comment `sluice migrate --partitioned` writes, followed by the interval
/// (`daily`/`hourly`): the pruner makes partitions ahead only for tables that carry it.
pub(crate) const COMMENT_PREFIX: &str = "sluice: partitioned ";

/// How often a table set up by `sluice migrate --partitioned` gets a new partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionInterval {
    /// One partition per UTC day; 7 made ahead.
    Daily,
    /// One partition per UTC hour; 48 made ahead.
    Hourly,
}

impl PartitionInterval {
    /// The length of one partition's range.
    pub fn length(self) -> TimeDelta {
        match self {
            Self::Daily => TimeDelta::days(1),
            Self::Hourly => TimeDelta::hours(1),
        }
    }

    /// Partitions kept made ahead of the current one: a week of days, two days of hours, so a
    /// relay (whose pruner makes them) may be down that long before rows land in the default
    /// partition.
    pub fn ahead(self) -> i32 {
        match self {
            Self::Daily => 7,
            Self::Hourly => 48,
        }
    }

    /// The start of the partition `time` falls in.
    pub fn floor(self, time: DateTime<Utc>) -> DateTime<Utc> {
        time.duration_trunc(self.length()).unwrap_or(time)
    }

    /// The suffix of the partition starting at `start`: `_p20261206` or `_p20261206_15`.
    pub fn suffix(self, start: DateTime<Utc>) -> String {
        match self {
            Self::Daily => start.format("_p%Y%m%d").to_string(),
            Self::Hourly => start.format("_p%Y%m%d_%H").to_string(),
        }
    }

    /// The interval a table comment names, if it is one `sluice migrate --partitioned` wrote.
    pub fn from_comment(comment: &str) -> Option<Self> {
        comment.strip_prefix(COMMENT_PREFIX)?.trim().parse().ok()
    }

    /// The comment `sluice migrate --partitioned` writes.
    pub fn comment(self) -> String {
        format!("{COMMENT_PREFIX}{self}")
    }
}

impl fmt::Display for PartitionInterval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Daily => "daily",
            Self::Hourly => "hourly",
        })
    }
}

impl FromStr for PartitionInterval {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "daily" => Ok(Self::Daily),
            "hourly" => Ok(Self::Hourly),
            other => Err(format!("{other:?}: expected \"daily\" or \"hourly\"")),
        }
    }
}

/// How an outbox table is partitioned, as the catalog says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partitioning {
    /// `PARTITION BY RANGE` on the `created_at` column alone: the only partitioning whose
    /// partitions Sluice drops.
    pub by_created_at: bool,
    /// Set up by `sluice migrate --partitioned` (the table's comment): partitions are made
    /// ahead.
    pub interval: Option<PartitionInterval>,
}

/// What one round of partition maintenance did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PartitionRound {
    /// Partitions made ahead, by name.
    pub created: Vec<String>,
    /// Partitions detached and dropped, by name.
    pub dropped: Vec<String>,
    /// Partitions wholly older than the retention that still hold a row that is unsent, dead,
    /// waiting for a retry or sent within the retention: kept.
    pub kept: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_start_on_utc_days_and_hours_and_are_named_after_their_start() {
        let t = DateTime::parse_from_rfc3339("2026-12-06T15:42:10.5Z")
            .unwrap()
            .with_timezone(&Utc);
        let day = PartitionInterval::Daily.floor(t);
        assert_eq!(day.to_rfc3339(), "2026-12-06T00:00:00+00:00");
        assert_eq!(PartitionInterval::Daily.suffix(day), "_p20261206");
        let hour = PartitionInterval::Hourly.floor(t);
        assert_eq!(PartitionInterval::Hourly.suffix(hour), "_p20261206_15");
    }

    #[test]
    fn the_comment_round_trips_and_other_comments_are_not_ours() {
        for interval in [PartitionInterval::Daily, PartitionInterval::Hourly] {
            assert_eq!(
                PartitionInterval::from_comment(&interval.comment()),
                Some(interval)
            );
        }
        assert_eq!(PartitionInterval::from_comment("pg_partman parent"), None);
        assert_eq!(
            PartitionInterval::from_comment("sluice: partitioned weekly"),
            None
        );
    }
}
