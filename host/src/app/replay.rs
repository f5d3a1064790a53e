//! `sluice replay`: sent rows (`mark = "published_at"`) published again. What may be replayed
//! (the mark mode, the ordering hazard, a table without the marker), the times and filters of
//! the command line turned into a [`ReplayFilter`] on the database's clock, and the pace. The
//! rows are changed by the store ([`Store::replay_sent`]); the relays do the publishing.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};

use super::admin::Target;
use crate::config::Config;
use crate::store::{
    self, MarkMode, Ordering, ReplayFilter, ReplayPace, Store, StoreOptions, TableSpec,
};

/// Rows per second a replay makes due unless `--rate` says otherwise: a fraction of what one
/// relay sends on a small machine (thousands per second), so live rows keep flowing beside it.
pub const DEFAULT_RATE: NonZeroU32 = NonZeroU32::new(500).expect("not zero");

/// A time on the command line: a moment (RFC 3339) or a duration before now ("2h").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeArg {
    /// `2026-12-06T15:00:00Z`, `2026-12-06T16:00:00+01:00`.
    At(DateTime<Utc>),
    /// `2h`, `30m`, `1d 6h`: that long before now, by the database's clock.
    Ago(Duration),
}

impl std::str::FromStr for TimeArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(at) = DateTime::parse_from_rfc3339(s.trim()) {
            return Ok(Self::At(at.with_timezone(&Utc)));
        }
        humantime::parse_duration(s.trim())
            .map(Self::Ago)
            .map_err(|_| {
                format!(
                    "{s:?} is neither an RFC 3339 time (2026-12-06T15:00:00Z) nor a duration \
                     before now (2h, 30m, 1d)"
                )
            })
    }
}

impl TimeArg {
    /// The moment, durations counted back from `now`.
    pub fn resolve(self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Self::At(at) => at,
            Self::Ago(ago) => chrono::TimeDelta::from_std(ago)
                .ok()
                .and_then(|ago| now.checked_sub_signed(ago))
                .unwrap_or(DateTime::<Utc>::MIN_UTC),
        }
    }
}

/// What `sluice replay` was asked for.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// `--since`: rows sent at or after this time.
    pub since: Option<TimeArg>,
    /// `--until`: rows sent before this time.
    pub until: Option<TimeArg>,
    /// `--tenant` (`default`: rows without a tenant).
    pub tenant: Option<String>,
    /// `--aggregate-type`.
    pub aggregate_type: Option<String>,
    /// `--event-type`.
    pub event_type: Option<String>,
    /// `--ids FILE`: one id per line (blank lines and `#` comments skipped; `-`: standard
    /// input).
    pub ids: Option<PathBuf>,
    /// `--rate`: rows made due per second.
    pub rate: NonZeroU32,
    /// `--force`: replay although `relay.ordering = "key"` (or unknown, without `--config`).
    pub force: bool,
}

/// A replay checked and counted, not started: what the command shows before it asks.
pub struct PreparedReplay {
    /// The table's store (one connection).
    pub store: Store,
    /// The table.
    pub table: TableSpec,
    /// The rows it takes.
    pub filter: ReplayFilter,
    /// How many rows that is now.
    pub rows: u64,
    /// Its id, start and rate.
    pub pace: ReplayPace,
}

impl PreparedReplay {
    /// When the last row comes due, if all `rows` are replayed.
    pub fn last_due(&self) -> DateTime<Utc> {
        self.pace.last_due(self.rows)
    }

    /// Makes the rows due again; `progress` gets the rows changed so far after each chunk.
    pub async fn run(&self, progress: &mut (dyn FnMut(u64) + Send)) -> anyhow::Result<u64> {
        Ok(self
            .store
            .replay_sent(&self.filter, &self.pace, progress)
            .await?)
    }
}

/// Checks that the table's sent rows can be replayed as `request` asks, and counts them.
pub async fn prepare(
    target: &Target<'_>,
    request: &ReplayRequest,
) -> anyhow::Result<PreparedReplay> {
    let (url, table, options) = match target {
        Target::Config(path) => {
            let config = Config::load(path)?;
            let table = config.database.table_spec()?;
            (
                config.database_url().to_owned(),
                table,
                Some(config.store_options()),
            )
        }
        Target::Url { .. } => {
            let (url, table) = target.resolve()?;
            (url, table, None)
        }
    };
    check_options(options.as_ref(), request.force)?;
    if request.since.is_none() && request.ids.is_none() {
        bail!("give --since TIME (and optionally --until TIME), or --ids FILE");
    }
    let ids = request.ids.as_deref().map(read_ids).transpose()?;
    let store = store::open(&url, &table, StoreOptions::default(), 1).await?;
    if !store.can_replay() {
        bail!(
            "outbox table {} has no replay_id column yet: run `sluice migrate` (as the table's \
             owner) to add it, then replay",
            table.name
        );
    }
    // Before counting and asking: a grant missing (a column-level UPDATE without replay_id)
    // would otherwise fail the first chunk after the question.
    store.check_privileges(&store::replay_needs()).await?;
    let now = store.database_now().await?;
    let (since, until) = window(request.since, request.until, now)?;
    let filter = ReplayFilter {
        since,
        until: Some(until),
        tenant: request.tenant.clone(),
        aggregate_type: request.aggregate_type.clone(),
        event_type: request.event_type.clone(),
        ids,
    };
    let rows = store.count_replayable(&filter).await?;
    let pace = ReplayPace {
        id: now.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        start: now,
        rate: request.rate,
    };
    Ok(PreparedReplay {
        store,
        table,
        filter,
        rows,
        pace,
    })
}

/// The replay's window on the database's clock (`now`): `--since` (none: every sent row
/// before `--until`) and `--until`, at most now, so rows sent while the replay runs (its own,
/// or live rows) are not taken by its later chunks. A window with no time in it is refused:
/// it would match no row, and `0 rows` would read as "nothing was sent then".
fn window(
    since: Option<TimeArg>,
    until: Option<TimeArg>,
    now: DateTime<Utc>,
) -> anyhow::Result<(Option<DateTime<Utc>>, DateTime<Utc>)> {
    // Before 1970 (`--since 100y`): every sent row, shown as no lower bound.
    let since_at = since
        .map(|t| t.resolve(now))
        .filter(|s| *s > DateTime::UNIX_EPOCH);
    let until_at = until.map_or(now, |t| t.resolve(now).min(now));
    let shown = |t: DateTime<Utc>| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();
    match since_at {
        Some(s) if s > now => bail!(
            "--since {} is in the future (the database's clock says {}): no row was sent then",
            shown(s),
            shown(now)
        ),
        Some(s) if s >= until_at => bail!(
            "--since {} is not before --until {}: no row can match; give the earlier time to \
             --since",
            shown(s),
            shown(until_at)
        ),
        _ => Ok((since_at, until_at)),
    }
}

/// Refuses what the relays' `[relay]` settings (`None`: not known, no `--config`) make
/// unsafe or pointless.
fn check_options(options: Option<&StoreOptions>, force: bool) -> anyhow::Result<()> {
    let Some(options) = options else {
        if force {
            return Ok(());
        }
        bail!(
            "without --config, Sluice cannot tell the relays' relay.mark and relay.ordering: \
             give --config with their sluice.toml, or --force if the relays use \
             mark = \"published_at\" and no key ordering (see docs/operations.md#replay)"
        );
    };
    if options.mark == MarkMode::Delete {
        bail!(
            "relay.mark = \"delete\": sent rows are deleted, so there is nothing to replay. \
             Instead: re-insert the events from the application's source of truth (INSERT INTO \
             the outbox); for rows that were never sent, `sluice dead replay`; and to be able to \
             replay in future, set relay.mark = \"published_at\" with relay.retention (e.g. \
             \"7d\") so sent rows are kept that long (see docs/operations.md#replay)"
        );
    }
    if options.ordering == Ordering::Key && !force {
        bail!(
            "relay.ordering = \"key\": a replayed row is an old event; sent to its topic again, \
             it reaches consumers after newer events of the same key (a consumer keeping the \
             latest state per key goes back in time), and until it is sent it holds back the \
             key's new rows. Replay into another topic instead (docs/operations.md#replay), or \
             give --force if the consumers can take old events out of order"
        );
    }
    Ok(())
}

/// The ids of `--ids FILE`: one per line, blank lines and `#` comments skipped.
fn read_ids(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("--ids -: standard input")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("--ids {}", path.display()))?
    };
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_or_durations_before_now() {
        let now = DateTime::parse_from_rfc3339("2026-12-06T15:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let ago: TimeArg = "2h".parse().unwrap();
        assert_eq!(ago.resolve(now).to_rfc3339(), "2026-12-06T13:00:00+00:00");
        let at: TimeArg = "2026-12-06T16:30:00+01:00".parse().unwrap();
        assert_eq!(at.resolve(now).to_rfc3339(), "2026-12-06T15:30:00+00:00");
        let err = "yesterday".parse::<TimeArg>().unwrap_err();
        assert!(err.contains("RFC 3339"), "{err}");
    }

    #[test]
    fn a_window_with_no_time_in_it_is_refused_naming_both_ends() {
        let now = DateTime::parse_from_rfc3339("2026-12-06T15:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let at = |s: &str| Some(s.parse::<TimeArg>().unwrap());
        let (since, until) = window(at("2h"), None, now).unwrap();
        assert_eq!(since.unwrap().to_rfc3339(), "2026-12-06T13:00:00+00:00");
        assert_eq!(until, now);
        // A later --until is cut to now.
        let (_, until) = window(at("2h"), at("2026-12-07T00:00:00Z"), now).unwrap();
        assert_eq!(until, now);
        let err = window(at("1h"), at("2h"), now).unwrap_err().to_string();
        assert!(
            err.contains(
                "--since 2026-12-06T14:00:00.000Z is not before --until 2026-12-06T13:00:00.000Z"
            ),
            "{err}"
        );
        let err = window(at("2026-12-07T00:00:00Z"), None, now)
            .unwrap_err()
            .to_string();
        assert!(err.contains("in the future"), "{err}");
        let err = window(at("0s"), None, now).unwrap_err().to_string();
        assert!(err.contains("not before"), "{err}");
        // Only --until (with --ids): every row sent before it.
        assert_eq!(window(None, at("1h"), now).unwrap().0, None);
        // Before 1970: no lower bound.
        assert_eq!(window(at("1000000y"), None, now).unwrap().0, None);
        assert_eq!(
            window(at("1960-01-01T00:00:00Z"), None, now).unwrap().0,
            None
        );
    }

    #[test]
    fn delete_mode_and_key_order_are_refused_with_what_to_do() {
        let delete = StoreOptions::default();
        let err = check_options(Some(&delete), true).unwrap_err().to_string();
        assert!(err.contains("nothing to replay"), "{err}");
        assert!(err.contains("sluice dead replay"), "{err}");
        let keyed = StoreOptions {
            mark: MarkMode::PublishedAt,
            ordering: Ordering::Key,
            ..StoreOptions::default()
        };
        let err = check_options(Some(&keyed), false).unwrap_err().to_string();
        assert!(err.contains("--force"), "{err}");
        check_options(Some(&keyed), true).unwrap();
        assert!(check_options(None, false).is_err());
        check_options(None, true).unwrap();
    }
}
