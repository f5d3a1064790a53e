//! Dead rows (`sluice dead list|replay|purge`), for every database: the statements are built
//! once from the [`LayoutSql`] and run on the driver's pool.

use std::time::Duration;

use super::dialect::Driver;
use super::layout_sql::LayoutSql;
use super::prune::{CHUNK, delete_in_chunks};
use super::rows::read_id;
use super::statement::{Execute, Param, ReadRow, Statement};
use super::{DeadRow, ReplaySelection, StoreError};

/// `AND` row `alias` is of tenant `name` (`default`: rows without a tenant), bound next in
/// `statement`.
fn of_tenant(sql: &LayoutSql, statement: &mut Statement, alias: &str, name: &str) -> String {
    let name = statement.param(Param::Text(name.to_owned()));
    format!("AND {} = {name}", sql.tenant_name_expr(alias))
}

/// Dead rows, oldest first (in claim order), optionally of one tenant (`default` matches
/// rows without a tenant).
pub(crate) async fn list<DB: Execute>(
    pool: &sqlx::Pool<DB>,
    sql: &LayoutSql,
    tenant: Option<&str>,
    limit: i64,
) -> Result<Vec<DeadRow>, StoreError> {
    let mut statement = Statement::new(sql.dialect);
    let tenant_filter = tenant.map_or_else(String::new, |t| of_tenant(sql, &mut statement, "o", t));
    let limit = statement.param(Param::Int(limit));
    let text = format!(
        "SELECT {id} AS id, {tenant} AS tenant, {at} AS aggregate_type,
                {ai} AS aggregate_id, {et} AS event_type,
                o.attempts AS attempts, o.dead_at AS dead_at, {last_error} AS last_error
           FROM {table} AS o
          WHERE o.dead_at IS NOT NULL {tenant_filter}
          ORDER BY {order_by}
          LIMIT {limit}",
        id = sql.id_expr("o"),
        tenant = sql.tenant_expr("o"),
        at = sql.text_expr("o", &sql.aggregate_type),
        ai = sql.text_expr("o", &sql.aggregate_id),
        et = sql.text_expr("o", &sql.event_type),
        last_error = sql.text_expr("o", "last_error"),
        table = sql.table,
        order_by = sql.order_by("o"),
    );
    let rows = DB::fetch_all(&mut *pool.acquire().await?, &statement.with_sql(text)).await?;
    Ok(rows
        .iter()
        .map(|row| dead_row(row, sql))
        .collect::<Result<_, _>>()?)
}

fn dead_row(row: &impl ReadRow, sql: &LayoutSql) -> Result<DeadRow, sqlx::Error> {
    // A NULL string column (the reason such a row went dead) is shown empty.
    let text = |index| -> Result<String, sqlx::Error> { Ok(row.text(index)?.unwrap_or_default()) };
    Ok(DeadRow {
        id: read_id(row, &sql.layout.key, 0)?,
        tenant: row.text(1)?,
        aggregate_type: text(2)?,
        aggregate_id: text(3)?,
        event_type: text(4)?,
        attempts: row.int32(5)?,
        dead_at: row.time(6)?.unwrap_or_default(),
        last_error: row.text(7)?,
    })
}

/// Makes the selected dead rows due again with a fresh attempt count; returns how many.
/// `last_error` is kept so the history of the row stays visible until it is delivered.
pub(crate) async fn replay<DB: Execute>(
    pool: &sqlx::Pool<DB>,
    sql: &LayoutSql,
    selection: &ReplaySelection,
) -> Result<u64, StoreError> {
    let mut statement = Statement::new(sql.dialect);
    let filter = match selection {
        ReplaySelection::Id(id) => {
            let id = sql.layout.parse_id(id)?;
            format!("AND o.{} = {}", sql.id, sql.bind_id(&mut statement, &id))
        }
        ReplaySelection::Tenant(t) => of_tenant(sql, &mut statement, "o", t),
        ReplaySelection::All => String::new(),
    };
    // SQLite: a dead row holds no lease, but one replayed must not keep a stale one.
    let lease = match sql.dialect {
        Driver::Sqlite => ", leased_by = NULL, lease_until = NULL",
        Driver::Postgres | Driver::Mysql => "",
    };
    let text = format!(
        "UPDATE {table} AS o
            SET dead_at = NULL, attempts = 0, next_attempt_at = NULL{lease}
          WHERE o.dead_at IS NOT NULL AND o.published_at IS NULL {filter}",
        table = sql.table,
    );
    Ok(DB::execute(&mut *pool.acquire().await?, &statement.with_sql(text)).await?)
}

/// Deletes dead rows that died more than `older_than` ago (optionally of one tenant), in
/// chunks of [`CHUNK`]; returns how many. Their content is gone for good:
/// `sluice dead list` them first, or dead-letter them to a topic.
pub(crate) async fn purge<DB: Execute>(
    pool: &sqlx::Pool<DB>,
    sql: &LayoutSql,
    older_than: Duration,
    tenant: Option<&str>,
) -> Result<u64, StoreError> {
    let mut statement = Statement::new(sql.dialect);
    let alias = sql.delete_alias();
    let died = statement.param(Param::Int(sql.dialect.ago_param(older_than)));
    let tenant_filter =
        tenant.map_or_else(String::new, |t| of_tenant(sql, &mut statement, alias, t));
    let filter = format!(
        "{alias}.dead_at IS NOT NULL AND {alias}.published_at IS NULL
            AND {alias}.dead_at <= {ago} {tenant_filter}",
        ago = sql.dialect.ago(&died),
    );
    let limit = statement.param(Param::Int(CHUNK));
    let statement = statement.with_sql(sql.delete_first(&filter, &limit, false));
    Ok(delete_in_chunks::<DB>(&mut *pool.acquire().await?, &statement).await?)
}
