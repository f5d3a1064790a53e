//! Benchmark outbox tables: created with `sluice migrate` (as a user would), filled with the
//! standard rows, dropped at the end of the scenario.

use std::path::Path;

use anyhow::{Context, bail};
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, Postgres};

use crate::cli::Settings;
use crate::db;

/// The standard row for series value `g` (a `bigint`): aggregate types `order` and `customer`
/// alternating, 1,000 aggregate ids, a 256-byte JSON payload. Columns are [`ROW_COLUMNS`].
const ROW_VALUES: &str = "CASE WHEN g % 2 = 0 THEN 'order' ELSE 'customer' END,
       'agg-' || (g % 1000),
       'Created',
       jsonb_build_object('n', g, 'pad', repeat('x', 236))";
const ROW_COLUMNS: &str = "aggregate_type, aggregate_id, event_type, payload";

/// `INSERT` of standard rows into `table` (quoted) for every `g` of `from`, a FROM item
/// providing a `bigint` column `g`, e.g. `generate_series($1::int8, $2::int8) AS g`.
pub fn insert_rows_sql(table: &str, from: &str) -> String {
    format!("INSERT INTO {table} ({ROW_COLUMNS}) SELECT {ROW_VALUES} FROM {from}")
}

/// Runs `sluice migrate` for `table` in the database at `url`, optionally installing the NOTIFY
/// trigger on `notify_channel`.
pub async fn migrate(
    sluice: &Path,
    url: &str,
    table: &str,
    notify_channel: Option<&str>,
) -> anyhow::Result<()> {
    let mut command = tokio::process::Command::new(sluice);
    command
        .arg("migrate")
        .arg("--database-url")
        .arg(url)
        .arg("--table")
        .arg(table)
        .env("RUST_LOG", "warn")
        .env_remove("SLUICE_DATABASE_URL");
    if let Some(channel) = notify_channel {
        command
            .arg("--notify-trigger")
            .arg("--notify-channel")
            .arg(channel);
    }
    let out = command
        .output()
        .await
        .with_context(|| format!("cannot run {} migrate", sluice.display()))?;
    if !out.status.success() {
        bail!(
            "`sluice migrate --table {table}{}` failed ({}): {}",
            notify_channel
                .map(|c| format!(" --notify-trigger --notify-channel {c}"))
                .unwrap_or_default(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Rows of a second tenant mixed into a backlog, evenly spread.
#[derive(Debug, Clone, Copy)]
pub struct OtherTenant<'a> {
    pub name: &'a str,
    pub rows: u64,
}

/// An outbox table in the benchmark database, owned by one scenario.
pub struct OutboxTable {
    name: String,
    quoted: String,
    pool: PgPool,
}

impl OutboxTable {
    /// Creates a table named after `stem` with `sluice migrate` (see [`migrate`]).
    pub async fn create(
        settings: &Settings,
        pool: &PgPool,
        stem: &str,
        notify_channel: Option<&str>,
    ) -> anyhow::Result<Self> {
        let name = crate::names::table(stem);
        migrate(
            &settings.sluice,
            &settings.database_url,
            &name,
            notify_channel,
        )
        .await?;
        Ok(Self {
            quoted: db::quote_ident(&name),
            name,
            pool: pool.clone(),
        })
    }

    /// The bare name, for `database.table`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quoted name, for SQL.
    pub fn quoted(&self) -> &str {
        &self.quoted
    }

    /// Inserts `rows` standard rows with tenant NULL, plus `other`'s rows spread evenly among
    /// them, in one statement; then `VACUUM ANALYZE` so every run starts from the same state.
    pub async fn fill(&self, rows: u64, other: Option<OtherTenant<'_>>) -> anyhow::Result<()> {
        let (other_name, other_rows) = other.map_or((None, 0), |o| (Some(o.name), o.rows));
        let total = rows + other_rows;
        // Every `step`-th row belongs to the other tenant, at most `other_rows` of them.
        let step = total.checked_div(other_rows).unwrap_or(1).max(1);
        let sql = format!(
            "INSERT INTO {table} (tenant, {ROW_COLUMNS})
             SELECT CASE WHEN $2::int8 > 0 AND g % $3::int8 = 0 AND g / $3::int8 <= $2::int8
                         THEN $4::text END,
                    {ROW_VALUES}
               FROM generate_series(1, $1::int8) AS g",
            table = self.quoted
        );
        sqlx::query::<Postgres>(AssertSqlSafe(sql))
            .bind(to_i64(total)?)
            .bind(to_i64(other_rows)?)
            .bind(to_i64(step)?)
            .bind(other_name)
            .execute(&self.pool)
            .await
            .with_context(|| format!("cannot insert {total} rows into {}", self.name))?;
        db::execute(&self.pool, format!("VACUUM ANALYZE {}", self.quoted)).await
    }

    /// Runs `step` once per item in order, emptying the table after each, then drops the
    /// table — also when a step fails, whose error is then returned.
    pub async fn for_each<I, T>(
        self,
        items: impl IntoIterator<Item = I>,
        mut step: impl AsyncFnMut(&OutboxTable, I) -> anyhow::Result<T>,
    ) -> anyhow::Result<Vec<T>> {
        let mut results = Vec::new();
        let mut failure = None;
        for item in items {
            match step(&self, item).await {
                Ok(result) => results.push(result),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
            if let Err(e) = self.truncate().await {
                failure = Some(e);
                break;
            }
        }
        self.drop_table().await;
        match failure {
            Some(e) => Err(e),
            None => Ok(results),
        }
    }

    /// Deletes every row.
    pub async fn truncate(&self) -> anyhow::Result<()> {
        db::execute(&self.pool, format!("TRUNCATE {}", self.quoted)).await
    }

    /// Drops the table; a failure is reported on stderr, not returned, so it never hides the
    /// scenario's own result.
    pub async fn drop_table(self) {
        if let Err(e) =
            db::execute(&self.pool, format!("DROP TABLE IF EXISTS {}", self.quoted)).await
        {
            eprintln!("warning: cannot drop table {}: {e:#}", self.name);
        }
    }
}

/// A row count as the `bigint` PostgreSQL wants.
pub fn to_i64(n: u64) -> anyhow::Result<i64> {
    i64::try_from(n).with_context(|| format!("{n} does not fit a bigint"))
}
