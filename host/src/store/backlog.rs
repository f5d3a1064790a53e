//! Counting unsent rows, for every database: by state ([`count`], what `sluice drain` has to
//! do) and, for the metrics sampler, per tenant ([`sample`]: due rows, the oldest due row's age,
//! waiting and dead rows, reading at most `limit` unsent rows — the claim's partial index, in claim
//! order — and at most `limit` dead ones — the dead rows' index; tables migrated before it
//! existed get it from `sluice migrate`).

use sqlx::Pool;

use super::dialect::{Cast, Driver};
use super::layout_sql::LayoutSql;
use super::statement::{Execute, Param, ReadRow, Statement};
use super::{Backlog, StoreError, TenantBacklog};

/// `SUM(cond)` as a 64-bit integer, 0 over no rows.
fn count_if(dialect: Driver, cond: &str) -> String {
    dialect.cast(
        &format!("COALESCE(SUM(CASE WHEN {cond} THEN 1 ELSE 0 END), 0)"),
        Cast::Int,
    )
}

/// Unsent rows by state (see [`super::OutboxStore::backlog`]).
pub(crate) async fn count<DB: Execute>(
    pool: &Pool<DB>,
    sql: &LayoutSql,
) -> Result<Backlog, StoreError> {
    let dialect = sql.dialect;
    let mut statement = Statement::new(dialect);
    let now = statement.now();
    let text = format!(
        "SELECT {due}, {waiting}, {dead} FROM {table} AS o WHERE o.published_at IS NULL",
        due = count_if(dialect, &LayoutSql::due(&now)),
        waiting = count_if(
            dialect,
            &format!("o.dead_at IS NULL AND o.next_attempt_at > {now}")
        ),
        dead = count_if(dialect, "o.dead_at IS NOT NULL"),
        table = sql.table,
    );
    let rows = DB::fetch_all(&mut *pool.acquire().await?, &statement.with_sql(text)).await?;
    let row = rows.first().ok_or(sqlx::Error::RowNotFound)?;
    Ok(Backlog {
        due: row.int(0)?.unwrap_or(0),
        waiting: row.int(1)?.unwrap_or(0),
        dead: row.int(2)?.unwrap_or(0),
    })
}

/// When a row became due, for its age: its `created_at`, but for a row `sluice replay` made
/// due again the time its replay scheduled it (`next_attempt_at`), so a replay of old rows does
/// not look like a stuck backlog.
fn due_since(sql: &LayoutSql) -> String {
    let created_at = sql.created_at_expr("o");
    match sql.layout.replay {
        true => format!(
            "CASE WHEN o.{} IS NOT NULL THEN o.next_attempt_at ELSE {created_at} END",
            sql.replay_column()
        ),
        false => created_at,
    }
}

/// The sampler's statement for reading at most `limit` unsent and `limit` dead rows.
fn statement(sql: &LayoutSql, limit: i64) -> Statement {
    let dialect = sql.dialect;
    let mut statement = Statement::new(dialect);
    let now = statement.now();
    let unsent_limit = statement.param(Param::Int(limit));
    let dead_limit = statement.again(&unsent_limit, Param::Int(limit));
    // The oldest due row's age in microseconds.
    let age = match dialect {
        // No age for a `-infinity` (no subtraction takes it), and a year past 292,000 does not
        // overflow the cast: one such row must not fail the sample of every tenant.
        Driver::Postgres => "CASE WHEN isfinite(MIN(oldest)) THEN least(greatest(
                 extract(epoch FROM now() - MIN(oldest)) * 1000000,
                 -9000000000000000000), 9000000000000000000)::int8 END"
            .to_owned(),
        Driver::Mysql => {
            "CAST(TIMESTAMPDIFF(MICROSECOND, MIN(oldest), UTC_TIMESTAMP(6)) AS SIGNED)".to_owned()
        }
        Driver::Sqlite => format!("({now} - MIN(oldest)) * 1000"),
    };
    let text = format!(
        "SELECT tenant, {due}, {dead}, {age}, {waiting}
           FROM (SELECT tenant, SUM(CASE WHEN due THEN 1 ELSE 0 END) AS due, 0 AS dead,
                        MIN(CASE WHEN due THEN created_at END) AS oldest,
                        SUM(CASE WHEN due THEN 0 ELSE 1 END) AS waiting
                   FROM (SELECT {tenant} AS tenant, {created_at} AS created_at,
                                ({is_due}) AS due
                           FROM {table} AS o
                          WHERE {pending}
                          ORDER BY {order_by}
                          LIMIT {unsent_limit}) AS u
                  GROUP BY tenant
                 UNION ALL
                 SELECT tenant, 0, COUNT(*), NULL, 0
                   FROM (SELECT {tenant} AS tenant FROM {table} AS o
                          WHERE o.published_at IS NULL AND o.dead_at IS NOT NULL
                          ORDER BY {order_by}
                          LIMIT {dead_limit}) AS d
                  GROUP BY tenant) AS s
          GROUP BY tenant",
        due = dialect.cast("SUM(due)", Cast::Int),
        is_due = LayoutSql::due(&now),
        pending = LayoutSql::PENDING,
        dead = dialect.cast("SUM(dead)", Cast::Int),
        waiting = dialect.cast("SUM(waiting)", Cast::Int),
        table = sql.table,
        tenant = sql.tenant_expr("o"),
        created_at = due_since(sql),
        order_by = sql.order_by("o"),
    );
    statement.with_sql(text)
}

/// Samples the backlog per tenant (see [`super::OutboxStore::sample_backlog`]).
pub(crate) async fn sample<DB: Execute>(
    pool: &Pool<DB>,
    sql: &LayoutSql,
    limit: i64,
) -> Result<Vec<TenantBacklog>, StoreError> {
    let rows = DB::fetch_all(&mut *pool.acquire().await?, &statement(sql, limit)).await?;
    rows.iter()
        .map(|row| {
            Ok(TenantBacklog {
                tenant: row.text(0)?,
                due: row.int(1)?.unwrap_or(0),
                dead: row.int(2)?.unwrap_or(0),
                oldest_due_age: row
                    .int(3)?
                    .map(|us| std::time::Duration::from_micros(u64::try_from(us).unwrap_or(0))),
                waiting: row.int(4)?.unwrap_or(0),
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_layouts::sluice_layout;

    fn sql(dialect: Driver) -> LayoutSql {
        LayoutSql::new(sluice_layout(), dialect)
    }

    #[test]
    fn the_limit_is_bound_once_where_placeholders_are_numbered() {
        let pg = statement(&sql(Driver::Postgres), 10);
        assert_eq!(pg.params, [Param::Int(10)]);
        assert_eq!(pg.sql.matches("LIMIT $1").count(), 2, "{}", pg.sql);
        let my = statement(&sql(Driver::Mysql), 10);
        assert_eq!(my.params, [Param::Int(10), Param::Int(10)]);
        let lite = statement(&sql(Driver::Sqlite), 10);
        assert_eq!(lite.params.len(), 2);
        assert_eq!(lite.sql.matches("LIMIT ?2").count(), 2, "{}", lite.sql);
    }
}
