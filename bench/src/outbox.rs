//! The benchmark's outbox tables: the test kit's [`DbTable`], created with `sluice migrate`
//! (as a user would), filled with the standard rows (two aggregate types, 1,000 ids, a 256-byte
//! JSON payload), probed while a relay drains them, emptied between runs and dropped at the end
//! of the scenario.

use anyhow::{Context, bail};
use sluice_testkit::{Database, DbTable, Servers};

use crate::cli::Settings;
use crate::names;

/// The standard row for series value `g` (a `bigint`), PostgreSQL: aggregate types `order` and
/// `customer` alternating, 1,000 aggregate ids, a 256-byte JSON payload. Columns are
/// [`ROW_COLUMNS`].
const ROW_VALUES: &str = "CASE WHEN g % 2 = 0 THEN 'order' ELSE 'customer' END,
       'agg-' || (g % 1000),
       'Created',
       jsonb_build_object('n', g, 'pad', repeat('x', 236))";
const ROW_COLUMNS: &str = "aggregate_type, aggregate_id, event_type, payload";

/// `INSERT` of standard rows into `table` (quoted) for every `g` of `from`, a FROM item
/// providing a `bigint` column `g`, e.g. `generate_series($1::int8, $2::int8) AS g`.
pub(crate) fn insert_rows_sql(table: &str, from: &str) -> String {
    format!("INSERT INTO {table} ({ROW_COLUMNS}) SELECT {ROW_VALUES} FROM {from}")
}

/// Rows of a second tenant mixed into a backlog, evenly spread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OtherTenant<'a> {
    pub name: &'a str,
    pub rows: u64,
}

/// Whose rows a backlog holds besides the default tenant's (PostgreSQL only).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Tenants<'a> {
    /// Another tenant's rows mixed in among the default tenant's.
    Other(OtherTenant<'a>),
    /// Every row belongs to one of this many tenants, `t0`, `t1`, …: row `g` to `t{g % n}`.
    Spread(u64),
}

/// The servers of the benchmark's settings.
fn servers(settings: &Settings) -> Servers {
    Servers {
        postgres: settings.database_url.clone(),
        mariadb: settings.mysql_url.clone(),
    }
}

/// A PostgreSQL table named after `stem`, created with `sluice migrate`, optionally with the
/// NOTIFY trigger on `notify_channel`.
pub(crate) async fn create(
    settings: &Settings,
    stem: &str,
    notify_channel: Option<&str>,
) -> anyhow::Result<DbTable> {
    DbTable::migrated(
        &servers(settings),
        Database::Postgres,
        names::table(stem),
        &settings.sluice,
        notify_channel,
    )
    .await
}

/// A table on `database` named after `stem`, created with `sluice migrate`.
pub(crate) async fn create_on(
    settings: &Settings,
    database: Database,
    stem: &str,
) -> anyhow::Result<DbTable> {
    DbTable::migrated(
        &servers(settings),
        database,
        names::table(stem),
        &settings.sluice,
        None,
    )
    .await
}

/// What a benchmark does with its table beyond the kit's.
pub(crate) trait BenchTable {
    /// Inserts `rows` standard rows with tenant NULL, plus another tenant's rows spread evenly
    /// among them (PostgreSQL only), or with their tenants spread as `tenants` says, then
    /// updates the planner's statistics so every run starts from the same state.
    async fn fill(&self, rows: u64, tenants: Option<Tenants<'_>>) -> anyhow::Result<()>;
    /// [`fill`](Self::fill) without updating the statistics: on PostgreSQL one `INSERT`,
    /// numbered from [`next_id`](Self::next_id) on.
    async fn insert(&self, rows: u64, tenants: Option<Tenants<'_>>) -> anyhow::Result<()>;
    /// The id the next row inserted gets (PostgreSQL; no other insert running).
    async fn next_id(&self) -> anyhow::Result<i64>;
    /// Rows with an id below `id`.
    async fn count_below(&self, id: i64) -> anyhow::Result<i64>;
    /// The lowest id left, if any row is.
    async fn first_id(&self) -> anyhow::Result<Option<i64>>;
    /// Deletes every row.
    async fn truncate(&self) -> anyhow::Result<()>;
}

impl BenchTable for DbTable {
    async fn fill(&self, rows: u64, tenants: Option<Tenants<'_>>) -> anyhow::Result<()> {
        self.insert(rows, tenants).await?;
        self.try_execute(match self.database {
            Database::Postgres => "VACUUM ANALYZE {t}",
            Database::Mariadb => "ANALYZE TABLE {t}",
            Database::Sqlite => "ANALYZE",
        })
        .await
    }

    async fn next_id(&self) -> anyhow::Result<i64> {
        // NULL before the sequence's first value (which is 1 for Sluice's tables).
        let next = self
            .try_scalar(
                "SELECT COALESCE(pg_sequence_last_value(
                            pg_get_serial_sequence('{t}', 'id')::regclass) + 1, 1)",
            )
            .await?;
        next.with_context(|| format!("{} has no id sequence", self.name))
    }

    async fn insert(&self, rows: u64, tenants: Option<Tenants<'_>>) -> anyhow::Result<()> {
        // Tenants `t0`…`t<spread-1>` in turn (0: NULL, or another tenant's rows mixed in).
        let spread = match tenants {
            Some(Tenants::Other(_)) if self.database != Database::Postgres => {
                bail!("another tenant's rows are only mixed in on PostgreSQL")
            }
            Some(Tenants::Spread(n)) => n,
            _ => 0,
        };
        match self.database {
            Database::Postgres => {
                let (other_name, other_rows) = match tenants {
                    Some(Tenants::Other(o)) => (Some(o.name), o.rows),
                    _ => (None, 0),
                };
                let total = rows + other_rows;
                // Every `step`-th row belongs to the other tenant, at most `other_rows` of them.
                let step = total.checked_div(other_rows).unwrap_or(1).max(1);
                let sql = self.sql(&format!(
                    "INSERT INTO {{t}} (tenant, {ROW_COLUMNS})
                     SELECT CASE WHEN $5::int8 > 0 THEN 't' || (g % $5::int8)
                                 WHEN $2::int8 > 0 AND g % $3::int8 = 0 AND g / $3::int8 <= $2::int8
                                 THEN $4::text END,
                            {ROW_VALUES}
                       FROM generate_series(1, $1::int8) AS g"
                ));
                sqlx::query::<sqlx::Postgres>(sqlx::AssertSqlSafe(sql))
                    .bind(to_i64(total)?)
                    .bind(to_i64(other_rows)?)
                    .bind(to_i64(step)?)
                    .bind(other_name)
                    .bind(to_i64(spread)?)
                    .execute(self.pg_pool())
                    .await
                    .with_context(|| format!("cannot insert {total} rows into {}", self.name))?;
                Ok(())
            }
            // MariaDB stops a recursive CTE after max_recursive_iterations (1,000 by default).
            Database::Mariadb => {
                let mut from = 1;
                while from <= rows {
                    let to = (from + 999).min(rows);
                    self.try_execute(&format!(
                        "INSERT INTO {{t}} (tenant, aggregate_type, aggregate_id, event_type, payload)
                         WITH RECURSIVE s(g) AS (SELECT {from} UNION ALL SELECT g + 1 FROM s WHERE g < {to})
                         SELECT CASE WHEN {spread} > 0 THEN CONCAT('t', g % {spread}) END,
                                CASE WHEN g % 2 = 0 THEN 'order' ELSE 'customer' END,
                                CONCAT('agg-', g % 1000), 'Created',
                                JSON_OBJECT('n', g, 'pad', REPEAT('x', 236))
                           FROM s"
                    ))
                    .await?;
                    from = to + 1;
                }
                Ok(())
            }
            Database::Sqlite => {
                self.try_execute(&format!(
                    "WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {rows})
                     INSERT INTO {{t}} (tenant, aggregate_type, aggregate_id, event_type, payload)
                     SELECT CASE WHEN {spread} > 0 THEN 't' || (g % {spread}) END,
                            CASE WHEN g % 2 = 0 THEN 'order' ELSE 'customer' END,
                            'agg-' || (g % 1000), 'Created',
                            json_object('n', g, 'pad', printf('%.236c', 'x'))
                       FROM s"
                ))
                .await
            }
        }
    }

    async fn count_below(&self, id: i64) -> anyhow::Result<i64> {
        Ok(self
            .try_scalar(&format!("SELECT COUNT(*) FROM {{t}} WHERE id < {id}"))
            .await?
            .unwrap_or(0))
    }

    async fn first_id(&self) -> anyhow::Result<Option<i64>> {
        self.try_scalar("SELECT id FROM {t} ORDER BY id LIMIT 1")
            .await
    }

    async fn truncate(&self) -> anyhow::Result<()> {
        match self.database {
            Database::Postgres => self.try_execute("TRUNCATE {t}").await,
            _ => self.try_execute("DELETE FROM {t}").await,
        }
    }
}

/// Runs `step` once per item in order, emptying `table` after each, then drops the table —
/// also when a step fails, whose error is then returned.
pub(crate) async fn for_each<I, T>(
    table: DbTable,
    items: impl IntoIterator<Item = I>,
    mut step: impl AsyncFnMut(&DbTable, I) -> anyhow::Result<T>,
) -> anyhow::Result<Vec<T>> {
    let mut results = Vec::new();
    let mut failure = None;
    for item in items {
        match step(&table, item).await {
            Ok(result) => results.push(result),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
        if let Err(e) = table.truncate().await {
            failure = Some(e);
            break;
        }
    }
    table.drop_table().await;
    match failure {
        Some(e) => Err(e),
        None => Ok(results),
    }
}

/// A row count as the `bigint` PostgreSQL wants.
pub(crate) fn to_i64(n: u64) -> anyhow::Result<i64> {
    i64::try_from(n).with_context(|| format!("{n} does not fit a bigint"))
}
