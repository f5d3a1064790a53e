//! `sluice replay`: sent rows (`mark = "published_at"`) made due again, for every database.
//!
//! A replay changes rows, nothing else: each matching sent row gets `published_at`,
//! `attempts` and (SQLite) its lease cleared, the replay's id in the marker column
//! ([`super::columns::REPLAY`]) and a `next_attempt_at` staggered by the replay's rate, so
//! the relays' ordinary claim picks the rows up a few at a time beside live rows. Rows are
//! taken in claim order, in chunks of about [`AHEAD`] of the rate (one transaction each),
//! through a keyset cursor, so a chunk costs the same at the end of a large replay as at the
//! start; each chunk is marked only [`AHEAD`] before its first rows are due, so the command
//! runs for the replay's length and few not-yet-due rows ever wait in the claim's path. The
//! relay stamps the marker as the `sluice-replay` header and clears it when the row is sent
//! again.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};

use super::StoreError;
use super::dialect::{Cast, Driver};
use super::driver::StoreDriver;
use super::layout_sql::LayoutSql;
use super::open::Store;
use super::rows::{IDS_PER_STATEMENT, read_id};
use super::statement::{Execute, Param, ReadRow, Statement, padded};
use crate::model::OutboxId;

/// Most rows per chunk: one transaction, one progress step.
const CHUNK: usize = 5_000;
/// A chunk holds about this long of the rate's rows, and is marked this long before its
/// first rows come due: rows made due ahead of their time wait in the claim's index in front
/// of every live row (they are older), and each claim steps over them, so few may wait.
const AHEAD: Duration = Duration::from_millis(500);
/// How far apart the due times of a replay's rows are: its rows come due in groups every
/// tick, so a relay polling beside live traffic takes a few at a time.
const TICK_MS: f64 = 100.0;

/// Which sent rows a replay makes due again (all given filters at once).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayFilter {
    /// Rows sent at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Rows sent before this time.
    pub until: Option<DateTime<Utc>>,
    /// Rows of this tenant (`default`: rows without a tenant).
    pub tenant: Option<String>,
    /// Rows of this aggregate type.
    pub aggregate_type: Option<String>,
    /// Rows of this event type.
    pub event_type: Option<String>,
    /// Only these ids (as text: integers, or e.g. uuids; checked against the table).
    pub ids: Option<Vec<String>>,
}

/// When a replay's rows come due: its id (the marker and the `sluice-replay` header), the
/// first row's due time and the rate after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayPace {
    /// The replay's id.
    pub id: String,
    /// When the first rows are due, by the database's clock ([`Store::database_now`]).
    pub start: DateTime<Utc>,
    /// Rows made due per second.
    pub rate: NonZeroU32,
}

impl ReplayPace {
    /// Rows per tick: about [`TICK_MS`] worth of the rate, at least one, at most what one
    /// statement binds.
    fn per_tick(&self) -> usize {
        let n = (f64::from(self.rate.get()) * TICK_MS / 1000.0).round() as usize;
        n.clamp(1, IDS_PER_STATEMENT)
    }

    /// When the `tick`-th group of [`ReplayPace::per_tick`] rows is due.
    fn due_at(&self, tick: u64) -> DateTime<Utc> {
        let spacing_ms = self.per_tick() as f64 * 1000.0 / f64::from(self.rate.get());
        let offset = (tick as f64 * spacing_ms).round() as i64;
        self.start + TimeDelta::milliseconds(offset)
    }

    /// Rows per chunk: [`AHEAD`] worth of the rate, whole ticks, at most [`CHUNK`].
    fn chunk_rows(&self) -> usize {
        let per_tick = self.per_tick();
        let ahead = f64::from(self.rate.get()) * AHEAD.as_secs_f64();
        let ticks = (ahead / per_tick as f64).ceil().max(1.0) as usize;
        (ticks * per_tick).min((CHUNK / per_tick).max(1) * per_tick)
    }

    /// When the last of `rows` rows is due.
    pub fn last_due(&self, rows: u64) -> DateTime<Utc> {
        let ticks = rows.saturating_sub(1) / self.per_tick() as u64;
        self.due_at(ticks)
    }
}

/// A replay whose rows are not all sent again yet, as `sluice status` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayProgress {
    /// The replay's id.
    pub id: String,
    /// Its rows not sent again yet (dead ones not counted).
    pub left: i64,
    /// Of those, rows due now: what the relays are behind its schedule.
    pub due: i64,
    /// When the last of them comes due (`None`: none left).
    pub last_due_at: Option<DateTime<Utc>>,
    /// The database's clock when this was read.
    pub read_at: DateTime<Utc>,
}

impl ReplayProgress {
    /// Rows per second its schedule still makes due (`None`: all are due already).
    pub fn rate(&self) -> Option<f64> {
        let ahead = (self.last_due_at? - self.read_at).as_seconds_f64();
        (ahead > 0.0).then(|| (self.left - self.due) as f64 / ahead)
    }

    /// Seconds until the last row is due (`None`: all are due already; how soon the relays
    /// send them depends on their capacity).
    pub fn eta_seconds(&self) -> Option<f64> {
        let ahead = (self.last_due_at? - self.read_at).as_seconds_f64();
        (ahead > 0.0).then_some(ahead)
    }
}

/// `at` as a time the bookkeeping columns compare with, bound next in `statement`
/// (milliseconds since the epoch, turned into the database's time type).
fn bind_time(dialect: Driver, statement: &mut Statement, at: DateTime<Utc>) -> String {
    let ms = statement.param(Param::Int(at.timestamp_millis()));
    match dialect {
        Driver::Postgres => format!("to_timestamp({ms}::float8 / 1000)"),
        // The connection's time zone is UTC ('+00:00').
        Driver::Mysql => format!("FROM_UNIXTIME({ms} / 1000)"),
        Driver::Sqlite => ms,
    }
}

/// The rows of `filter` that are sent and not dead, as a `WHERE` condition on `o`.
fn condition(sql: &LayoutSql, statement: &mut Statement, filter: &ReplayFilter) -> String {
    let mut all = vec![
        "o.published_at IS NOT NULL".to_owned(),
        "o.dead_at IS NULL".to_owned(),
    ];
    // Every row was sent after 1970: an earlier `since` bounds nothing, and bound it would
    // fail the statement (PostgreSQL: "timestamp out of range" for `--since 1000000y`) or
    // match no row at all (MySQL's FROM_UNIXTIME of a negative number is NULL).
    if let Some(since) = filter.since.filter(|s| s.timestamp_millis() > 0) {
        let at = bind_time(sql.dialect, statement, since);
        all.push(format!("o.published_at >= {at}"));
    }
    if let Some(until) = filter.until {
        let at = bind_time(sql.dialect, statement, until);
        all.push(format!("o.published_at < {at}"));
    }
    let mut equal = |expr: String, value: &Option<String>| {
        if let Some(value) = value {
            let p = statement.param(Param::Text(value.clone()));
            all.push(format!("{expr} = {p}"));
        }
    };
    equal(sql.tenant_name_expr("o"), &filter.tenant);
    equal(
        sql.text_expr("o", &sql.aggregate_type),
        &filter.aggregate_type,
    );
    equal(sql.text_expr("o", &sql.event_type), &filter.event_type);
    all.join(" AND ")
}

/// The ids of `filter`, parsed, each once, in chunks a statement binds; `None` without an
/// ids list. Once: an id listed twice (`7` and `07` are one) in two chunks would be counted
/// twice.
fn id_chunks(
    sql: &LayoutSql,
    filter: &ReplayFilter,
) -> Result<Option<Vec<Vec<OutboxId>>>, StoreError> {
    let Some(ids) = &filter.ids else {
        return Ok(None);
    };
    let mut seen = std::collections::HashSet::with_capacity(ids.len());
    let mut parsed = Vec::with_capacity(ids.len());
    for id in ids {
        let id = sql.layout.parse_id(id)?;
        if seen.insert(id.clone()) {
            parsed.push(id);
        }
    }
    Ok(Some(
        parsed
            .chunks(IDS_PER_STATEMENT)
            .map(<[OutboxId]>::to_vec)
            .collect(),
    ))
}

/// `AND o.id IN (…)` for `ids`, bound next in `statement`.
fn among(sql: &LayoutSql, statement: &mut Statement, ids: &[OutboxId]) -> String {
    let list = sql.bind_ids(statement, padded(ids));
    format!("AND o.{} IN ({list})", sql.id)
}

/// How many rows `filter` selects: what a replay would make due again.
pub(crate) async fn count<DB: Execute>(
    pool: &sqlx::Pool<DB>,
    sql: &LayoutSql,
    filter: &ReplayFilter,
) -> Result<u64, StoreError> {
    let chunks = id_chunks(sql, filter)?;
    let chunks: Vec<Option<&[OutboxId]>> = match &chunks {
        Some(chunks) => chunks.iter().map(|c| Some(c.as_slice())).collect(),
        None => vec![None],
    };
    let mut conn = pool.acquire().await?;
    let mut total = 0;
    for ids in chunks {
        let mut statement = Statement::new(sql.dialect);
        let condition = condition(sql, &mut statement, filter);
        let among = ids.map_or_else(String::new, |ids| among(sql, &mut statement, ids));
        let text = format!(
            "SELECT COUNT(*) FROM {table} AS o WHERE {condition} {among}",
            table = sql.table
        );
        let rows = DB::fetch_all(&mut *conn, &statement.with_sql(text)).await?;
        let n = rows.first().map(|r| r.int(0)).transpose()?.flatten();
        total += u64::try_from(n.unwrap_or(0)).unwrap_or(0);
    }
    Ok(total)
}

/// Where the next chunk starts: after this row in claim order.
struct Cursor {
    order: Option<i64>,
    id: OutboxId,
}

/// The next chunk of `filter`'s rows after `cursor`, in claim order (within `ids` when given):
/// their ids and the cursor after the last.
async fn next_chunk<DB: Execute>(
    conn: &mut DB::Connection,
    sql: &LayoutSql,
    filter: &ReplayFilter,
    cursor: Option<&Cursor>,
    ids: Option<&[OutboxId]>,
    limit: usize,
) -> Result<(Vec<OutboxId>, Option<Cursor>), StoreError> {
    let mut statement = Statement::new(sql.dialect);
    let condition = condition(sql, &mut statement, filter);
    let after = match cursor {
        None => String::new(),
        Some(c) if sql.layout.ordered_by_id() => {
            format!("AND o.{} > {}", sql.id, sql.bind_id(&mut statement, &c.id))
        }
        Some(c) => {
            let order = c.order.unwrap_or(i64::MIN);
            let first = statement.param(Param::Int(order));
            let again = statement.again(&first, Param::Int(order));
            let id = sql.bind_id(&mut statement, &c.id);
            format!(
                "AND (o.{o} > {first} OR (o.{o} = {again} AND o.{i} > {id}))",
                o = sql.order,
                i = sql.id
            )
        }
    };
    let among = ids.map_or_else(String::new, |ids| among(sql, &mut statement, ids));
    let limit = statement.param(Param::Int(i64::try_from(limit).unwrap_or(i64::MAX)));
    let text = format!(
        "SELECT {id} AS id, {order} AS claim_order FROM {table} AS o
          WHERE {condition} {after} {among}
          ORDER BY {order_by} LIMIT {limit}",
        id = sql.id_expr("o"),
        order = sql.dialect.cast(&format!("o.{}", sql.order), Cast::Int),
        table = sql.table,
        order_by = sql.order_by("o"),
    );
    let rows = DB::fetch_all(conn, &statement.with_sql(text)).await?;
    let mut chosen = Vec::with_capacity(rows.len());
    let mut last = None;
    for row in &rows {
        let id = read_id(row, &sql.layout.key, 0)?;
        last = Some(Cursor {
            order: row.int(1)?,
            id: id.clone(),
        });
        chosen.push(id);
    }
    Ok((chosen, last))
}

/// Makes `ids` due again for `pace` in one transaction, a tick's group per statement, the
/// first group at tick `tick`; returns the rows changed (a row sent or pruned meanwhile is
/// skipped) and advances `tick`. The filter is applied again: on a partitioned table an id
/// may name rows of several partitions, and only those the filter selects are replayed.
async fn mark_chunk<DB: Execute>(
    pool: &sqlx::Pool<DB>,
    sql: &LayoutSql,
    filter: &ReplayFilter,
    pace: &ReplayPace,
    ids: &[OutboxId],
    tick: &mut u64,
) -> Result<u64, StoreError> {
    let lease = match sql.dialect {
        Driver::Sqlite => ", leased_by = NULL, lease_until = NULL",
        Driver::Postgres | Driver::Mysql => "",
    };
    if ids.is_empty() {
        return Ok(0);
    }
    let mut tx = pool.begin().await?;
    let mut changed = 0;
    for group in ids.chunks(pace.per_tick()) {
        let mut statement = Statement::new(sql.dialect);
        let due = bind_time(sql.dialect, &mut statement, pace.due_at(*tick));
        let replay = statement.param(Param::Text(pace.id.clone()));
        let condition = condition(sql, &mut statement, filter);
        let among = among(sql, &mut statement, group);
        let text = format!(
            "UPDATE {table} AS o
                SET published_at = NULL, attempts = 0, next_attempt_at = {due},
                    {marker} = {replay}{lease}
              WHERE {condition} {among}",
            table = sql.table,
            marker = sql.replay_column(),
        );
        changed += DB::execute(&mut *tx, &statement.with_sql(text)).await?;
        *tick += 1;
    }
    tx.commit().await?;
    Ok(changed)
}

/// Makes the rows of `filter` due again at `pace`, chunk by chunk, calling `progress` with
/// the rows changed so far after each; returns how many.
pub(crate) async fn replay<DB: Execute>(
    pool: &sqlx::Pool<DB>,
    sql: &LayoutSql,
    filter: &ReplayFilter,
    pace: &ReplayPace,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<u64, StoreError> {
    if !sql.layout.replay {
        return Err(no_marker(sql));
    }
    let id_chunks = id_chunks(sql, filter)?;
    let mut marking = Marking {
        pool,
        sql,
        filter,
        pace,
        started: Instant::now(),
        tick: 0,
        done: 0,
    };
    // Each chunk is read on a connection given back before it is marked on another: an
    // admin command's pool has one.
    let limit = pace.chunk_rows();
    match id_chunks {
        Some(chunks) => {
            for ids in &chunks {
                let (chosen, _) = next_chunk::<DB>(
                    &mut *pool.acquire().await?,
                    sql,
                    filter,
                    None,
                    Some(ids),
                    CHUNK,
                )
                .await?;
                for part in chosen.chunks(limit) {
                    marking.mark(part, progress).await?;
                }
            }
        }
        None => {
            let mut cursor = None;
            loop {
                let (chosen, next) = next_chunk::<DB>(
                    &mut *pool.acquire().await?,
                    sql,
                    filter,
                    cursor.as_ref(),
                    None,
                    limit,
                )
                .await?;
                if chosen.is_empty() {
                    break;
                }
                marking.mark(&chosen, progress).await?;
                cursor = next;
            }
        }
    }
    Ok(marking.done)
}

/// A replay being marked, chunk by chunk, each just ahead of its time.
struct Marking<'a, DB: Execute> {
    pool: &'a sqlx::Pool<DB>,
    sql: &'a LayoutSql,
    filter: &'a ReplayFilter,
    pace: &'a ReplayPace,
    /// When marking began (the pace's start, on this process's clock).
    started: Instant,
    /// The next group's tick.
    tick: u64,
    /// Rows changed so far.
    done: u64,
}

impl<DB: Execute> Marking<'_, DB> {
    /// Waits until `ids`' first rows are [`AHEAD`] of their time, marks them, reports.
    async fn mark(
        &mut self,
        ids: &[OutboxId],
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(), StoreError> {
        let due = (self.pace.due_at(self.tick) - self.pace.start)
            .to_std()
            .unwrap_or_default();
        if let Some(wait) = due.checked_sub(AHEAD) {
            tokio::time::sleep_until((self.started + wait).into()).await;
        }
        self.done += mark_chunk(
            self.pool,
            self.sql,
            self.filter,
            self.pace,
            ids,
            &mut self.tick,
        )
        .await?;
        progress(self.done);
        Ok(())
    }
}

/// Replays whose rows are not all sent again yet, read through the marker's index.
pub(crate) async fn progress<DB: Execute>(
    pool: &sqlx::Pool<DB>,
    sql: &LayoutSql,
) -> Result<Vec<ReplayProgress>, StoreError> {
    if !sql.layout.replay {
        return Ok(Vec::new());
    }
    let mut conn = pool.acquire().await?;
    let read_at = now::<DB>(&mut *conn, sql.dialect).await?;
    let mut statement = Statement::new(sql.dialect);
    let now = bind_time(sql.dialect, &mut statement, read_at);
    let marker = format!("o.{}", sql.replay_column());
    let text = format!(
        "SELECT {id} AS replay, COUNT(*) AS rows_left,
                {due} AS due, MAX(o.next_attempt_at) AS last_due
           FROM {table} AS o
          WHERE {marker} IS NOT NULL AND o.published_at IS NULL AND o.dead_at IS NULL
          GROUP BY {marker}
          ORDER BY {marker}",
        id = sql.text_expr("o", &sql.replay_column()),
        due = sql.dialect.cast(
            &format!(
                "SUM(CASE WHEN o.next_attempt_at IS NULL OR o.next_attempt_at <= {now} \
                 THEN 1 ELSE 0 END)"
            ),
            Cast::Int
        ),
        table = sql.table,
    );
    let rows = DB::fetch_all(&mut *conn, &statement.with_sql(text)).await?;
    rows.iter()
        .map(|row| {
            Ok(ReplayProgress {
                id: row.text(0)?.unwrap_or_default(),
                left: row.int(1)?.unwrap_or(0),
                due: row.int(2)?.unwrap_or(0),
                last_due_at: row.time(3)?,
                read_at,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// The database's clock (SQLite's times are this process's).
async fn now<DB: Execute>(
    conn: &mut DB::Connection,
    dialect: Driver,
) -> Result<DateTime<Utc>, StoreError> {
    let mut statement = Statement::new(dialect);
    let now = statement.now();
    let rows = DB::fetch_all(conn, &statement.with_sql(format!("SELECT {now}"))).await?;
    Ok(rows
        .first()
        .map(|r| r.time(0))
        .transpose()?
        .flatten()
        .unwrap_or_else(Utc::now))
}

/// The database's clock, on a connection of `pool`.
async fn now_on<DB: Execute>(
    pool: &sqlx::Pool<DB>,
    dialect: Driver,
) -> Result<DateTime<Utc>, StoreError> {
    now::<DB>(&mut *pool.acquire().await?, dialect).await
}

/// The refusal on a table `sluice migrate` has not given the marker yet.
fn no_marker(sql: &LayoutSql) -> StoreError {
    StoreError::Replay(format!(
        "outbox table {} has no {} column: run `sluice migrate` (as the table's owner) to add it",
        sql.layout.table,
        super::columns::REPLAY.0
    ))
}

/// Runs `$call` with `$s` the driver of `$store`.
macro_rules! on_driver {
    ($store:expr, $s:ident => $call:expr) => {
        match $store {
            Store::Postgres($s) => $call,
            Store::Mysql($s) => $call,
            Store::Sqlite($s) => $call,
        }
    };
}

/// `sluice replay` and the replay lines of `sluice status`.
impl Store {
    /// Whether the table has the replay marker (`sluice migrate` adds it).
    pub fn can_replay(&self) -> bool {
        on_driver!(self, s => s.sql().layout.replay)
    }

    /// The database's clock: what a replay's times (`--since 2h`, its rows' due times) are
    /// counted on, wherever `sluice replay` runs.
    pub async fn database_now(&self) -> Result<DateTime<Utc>, StoreError> {
        on_driver!(self, s => now_on(s.pool(), s.sql().dialect).await)
    }

    /// How many sent rows `filter` selects (changes nothing: `--dry-run`).
    pub async fn count_replayable(&self, filter: &ReplayFilter) -> Result<u64, StoreError> {
        on_driver!(self, s => count(s.pool(), s.sql(), filter).await)
    }

    /// Makes the sent rows of `filter` due again at `pace`; `progress` gets the rows changed
    /// so far after each chunk. Refused on a table without the marker.
    pub async fn replay_sent(
        &self,
        filter: &ReplayFilter,
        pace: &ReplayPace,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<u64, StoreError> {
        on_driver!(self, s => replay(s.pool(), s.sql(), filter, pace, progress).await)
    }

    /// Replays with rows still to send again (none on a table without the marker).
    pub async fn replay_progress(&self) -> Result<Vec<ReplayProgress>, StoreError> {
        on_driver!(self, s => progress(s.pool(), s.sql()).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(rate: u32) -> ReplayPace {
        ReplayPace {
            id: "r".into(),
            start: DateTime::from_timestamp_millis(1_000_000).unwrap(),
            rate: NonZeroU32::new(rate).unwrap(),
        }
    }

    #[test]
    fn rows_come_due_a_tick_apart_at_the_rate() {
        let p = pace(1_000);
        assert_eq!(p.per_tick(), 100);
        assert_eq!((p.due_at(1) - p.start).num_milliseconds(), 100);
        // 10,000 rows at 1,000/s: the last is due after 9.9 s.
        assert_eq!((p.last_due(10_000) - p.start).num_milliseconds(), 9_900);
        let slow = pace(2);
        assert_eq!(slow.per_tick(), 1);
        assert_eq!((slow.due_at(3) - slow.start).num_milliseconds(), 1_500);
        assert_eq!(p.chunk_rows(), 500, "half a second of rows");
        assert_eq!(pace(4_000).chunk_rows(), 2_000);
        assert_eq!(slow.chunk_rows(), 1);
        let fast = pace(1_000_000);
        assert_eq!(fast.chunk_rows(), CHUNK);
        assert_eq!(fast.per_tick(), IDS_PER_STATEMENT);
        assert_eq!(
            (fast.last_due(1_000_000) - fast.start).num_milliseconds(),
            999
        );
    }

    #[test]
    fn progress_reports_the_schedules_rate_and_when_it_ends() {
        let read_at = DateTime::from_timestamp_millis(0).unwrap();
        let p = ReplayProgress {
            id: "r".into(),
            left: 1_100,
            due: 100,
            last_due_at: Some(read_at + TimeDelta::seconds(10)),
            read_at,
        };
        assert_eq!(p.rate(), Some(100.0));
        assert_eq!(p.eta_seconds(), Some(10.0));
        let behind = ReplayProgress {
            last_due_at: Some(read_at),
            ..p
        };
        assert_eq!(behind.rate(), None);
        assert_eq!(behind.eta_seconds(), None);
    }
}
