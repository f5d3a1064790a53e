//! Timing a relay's drain of a backlog from the outside: from the moment the first row has
//! left the table to the moment none is left, polled every 10 ms.
//!
//! The probes are index lookups rather than `SELECT count(*)`: on this 2-core machine a
//! `count(*)` of a 200,000-row outbox takes 17–35 ms with two parallel workers, so polling it
//! every 10 ms would keep more than a core busy and slow the relay being measured. The probes
//! answer the same two questions exactly:
//! - "has the first row left?": the count of rows among the lowest [`HEAD_IDS`] ids (a short
//!   primary-key range) drops. Relays claim `ORDER BY id`, so their first commits remove rows
//!   from there as long as workers × batch_size < [`HEAD_IDS`] (defaults: 2 × 500).
//! - "is the count 0?": `SELECT id … ORDER BY id LIMIT 1` finds nothing.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Postgres};

use crate::procstat::{ProcSample, SystemSample};
use crate::relay::{Measured, RelayProcess};
use sluice_testkit::DbTable;
use sluice_testkit::db;

/// Width of the id range watched for the first rows to leave.
const HEAD_IDS: i64 = 5_000;
/// How often the table is probed.
const POLL: Duration = Duration::from_millis(10);
/// Longest wait for the relay's first commit (start-up includes compiling plugins).
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest drain accepted, on top of one second per 1,000 rows.
const DRAIN_TIMEOUT_BASE: Duration = Duration::from_secs(60);

/// Which rows of the table count.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rows {
    All,
    /// Only rows with tenant NULL (the well-behaved tenant of `noisy`).
    NoTenant,
}

impl Rows {
    fn condition(self) -> &'static str {
        match self {
            Self::All => "TRUE",
            Self::NoTenant => "tenant IS NULL",
        }
    }
}

/// A drain, as seen from the table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drained {
    /// Rows still there when the first row had left: the rows drained within `elapsed`.
    pub rows: u64,
    pub elapsed: Duration,
    /// The relay's `/proc` reading at the start of the window.
    pub start: ProcSample,
    /// The database's, the broker's and the machine's CPU over the window.
    pub system: (SystemSample, SystemSample),
}

impl Drained {
    pub(crate) fn rows_per_second(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64()
    }
}

/// Prepared before the relay starts: knows the backlog's size and first id.
pub(crate) struct DrainWatch {
    conn: PgConnection,
    rows: Rows,
    table: String,
    total: i64,
    head_end: i64,
    head_total: i64,
}

impl DrainWatch {
    /// Looks at the filled `table` (call before starting the relay).
    pub(crate) async fn prepare(url: &str, table: &DbTable, rows: Rows) -> anyhow::Result<Self> {
        let mut watch = Self::connect(url, table, rows).await?;
        let sql = format!(
            "SELECT count(*), COALESCE(min(id), 0) FROM {} WHERE {}",
            watch.table,
            rows.condition()
        );
        let (total, first_id): (i64, i64) =
            sqlx::query_as::<Postgres, (i64, i64)>(AssertSqlSafe(sql))
                .fetch_one(&mut watch.conn)
                .await
                .with_context(|| format!("cannot count the backlog of {}", &table.name))?;
        if total == 0 {
            bail!("the backlog of {} is empty", &table.name);
        }
        watch.total = total;
        watch.head_end = first_id + HEAD_IDS;
        watch.head_total = watch.head_count().await?;
        Ok(watch)
    }

    /// Prepared for `rows` rows not inserted yet, which one `INSERT` will number from
    /// `first_id` on: a relay already running drains them as soon as they are committed, so
    /// the watch cannot count them first.
    pub(crate) async fn expect(
        url: &str,
        table: &DbTable,
        rows: u64,
        first_id: i64,
    ) -> anyhow::Result<Self> {
        let mut watch = Self::connect(url, table, Rows::All).await?;
        watch.total = i64::try_from(rows).context("too many rows")?;
        watch.head_end = first_id + HEAD_IDS;
        watch.head_total = watch.total.min(HEAD_IDS);
        Ok(watch)
    }

    /// The probes' connection; nothing counted yet.
    async fn connect(url: &str, table: &DbTable, rows: Rows) -> anyhow::Result<Self> {
        let mut conn = db::connection(url).await?;
        // The probes are tiny; parallel workers would only add processes competing for CPU.
        db::execute(
            &mut conn,
            "SET max_parallel_workers_per_gather = 0".to_owned(),
        )
        .await?;
        Ok(Self {
            conn,
            rows,
            table: table.quoted().to_owned(),
            total: 0,
            head_end: 0,
            head_total: 0,
        })
    }

    /// Waits for the drain to start and finish; fails if the relay exits or stalls.
    pub(crate) async fn run(mut self, relay: &mut RelayProcess) -> anyhow::Result<Drained> {
        let deadline = Instant::now() + START_TIMEOUT;
        let (started, head_left) = loop {
            relay.ensure_running()?;
            let head = self.head_count().await?;
            if head < self.head_total {
                break (Instant::now(), head);
            }
            if Instant::now() > deadline {
                bail!(
                    "the relay removed no row within {START_TIMEOUT:?}; its log ends:\n{}",
                    relay.log_tail()
                );
            }
            tokio::time::sleep(POLL).await;
        };
        let start = relay.sample()?;
        let system_start = SystemSample::now();
        let remaining = self.total - (self.head_total - head_left);
        let rows = u64::try_from(remaining).context("negative row count")?;
        if rows == 0 {
            bail!("the backlog was drained before its start was seen: give more --rows");
        }
        let limit = DRAIN_TIMEOUT_BASE + Duration::from_millis(rows);
        loop {
            relay.ensure_running()?;
            if self.first_left().await?.is_none() {
                return Ok(Drained {
                    rows,
                    elapsed: started.elapsed(),
                    start,
                    system: (system_start, SystemSample::now()),
                });
            }
            if started.elapsed() > limit {
                bail!(
                    "the relay did not drain {rows} rows within {limit:?}; its log ends:\n{}",
                    relay.log_tail()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn head_count(&mut self) -> anyhow::Result<i64> {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE id < $1 AND {}",
            self.table,
            self.rows.condition()
        );
        sqlx::query_scalar::<Postgres, i64>(AssertSqlSafe(sql))
            .bind(self.head_end)
            .fetch_one(&mut self.conn)
            .await
            .context("probe of the first rows failed")
    }

    async fn first_left(&mut self) -> anyhow::Result<Option<i64>> {
        let sql = format!(
            "SELECT id FROM {} WHERE {} ORDER BY id LIMIT 1",
            self.table,
            self.rows.condition()
        );
        sqlx::query_scalar::<Postgres, i64>(AssertSqlSafe(sql))
            .fetch_optional(&mut self.conn)
            .await
            .context("probe for remaining rows failed")
    }
}
