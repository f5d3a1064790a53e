//! Dead rows: listing, replaying and purging them (`sluice dead list|replay|purge`).

use std::time::Duration;

use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::{AssertSqlSafe, Row};

use super::prune::delete_in_chunks;
use super::rows::read_id;
use crate::store::chunk::CHUNK;
use crate::store::layout_sql::LayoutSql;
use crate::model::OutboxId;
use crate::store::{DeadRow, ReplaySelection, StoreError};

/// Dead rows, oldest first (in claim order), optionally of one tenant (`default` matches
/// rows without a tenant).
pub async fn list(
    pool: &MySqlPool,
    sql: &LayoutSql,
    tenant: Option<&str>,
    limit: i64,
) -> Result<Vec<DeadRow>, StoreError> {
    let tenant_filter = match tenant {
        Some(_) => format!("AND {} = ?", sql.tenant_name_expr("o")),
        None => String::new(),
    };
    let text = format!(
        "SELECT {id} AS id, {tenant} AS tenant, {at} AS aggregate_type,
                {ai} AS aggregate_id, {et} AS event_type,
                o.attempts AS attempts, o.dead_at AS dead_at,
                CAST(o.last_error AS CHAR) AS last_error
           FROM {table} AS o
          WHERE o.dead_at IS NOT NULL {tenant_filter}
          ORDER BY {order_by}
          LIMIT ?",
        id = sql.id_expr("o"),
        tenant = sql.tenant_expr("o"),
        at = sql.text_expr("o", &sql.aggregate_type),
        ai = sql.text_expr("o", &sql.aggregate_id),
        et = sql.text_expr("o", &sql.event_type),
        table = sql.table,
        order_by = sql.order_by("o"),
    );
    let mut query = sqlx::query(AssertSqlSafe(text));
    if let Some(tenant) = tenant {
        query = query.bind(tenant);
    }
    let rows = query.bind(limit).fetch_all(pool).await?;
    Ok(rows
        .iter()
        .map(|row| dead_row(row, sql))
        .collect::<Result<_, _>>()?)
}

fn dead_row(row: &MySqlRow, sql: &LayoutSql) -> Result<DeadRow, sqlx::Error> {
    // A NULL string column (the reason such a row went dead) is shown empty.
    let text = |name: &str| -> Result<String, sqlx::Error> {
        Ok(row.try_get::<Option<String>, _>(name)?.unwrap_or_default())
    };
    Ok(DeadRow {
        id: read_id(row, &sql.layout, "id")?,
        tenant: row.try_get("tenant")?,
        aggregate_type: text("aggregate_type")?,
        aggregate_id: text("aggregate_id")?,
        event_type: text("event_type")?,
        attempts: row.try_get("attempts")?,
        dead_at: row.try_get("dead_at")?,
        last_error: row.try_get("last_error")?,
    })
}

/// Makes the selected dead rows due again with a fresh attempt count; returns how many.
/// `last_error` is kept so the history of the row stays visible until it is delivered.
pub async fn replay(
    pool: &MySqlPool,
    sql: &LayoutSql,
    selection: &ReplaySelection,
) -> Result<u64, StoreError> {
    let filter = match selection {
        ReplaySelection::Id(_) => format!("AND o.{} = ?", sql.id),
        ReplaySelection::Tenant(_) => format!("AND {} = ?", sql.tenant_name_expr("o")),
        ReplaySelection::All => String::new(),
    };
    let text = format!(
        "UPDATE {table} AS o
            SET o.dead_at = NULL, o.attempts = 0, o.next_attempt_at = NULL
          WHERE o.dead_at IS NOT NULL AND o.published_at IS NULL {filter}",
        table = sql.table,
    );
    let query = sqlx::query(AssertSqlSafe(text));
    let query = match selection {
        ReplaySelection::Id(id) => match sql.layout.parse_id(id)? {
            OutboxId::Int(n) => query.bind(n),
            OutboxId::Text(text) => query.bind(text.to_string()),
        },
        ReplaySelection::Tenant(tenant) => query.bind(tenant.clone()),
        ReplaySelection::All => query,
    };
    Ok(query.execute(pool).await?.rows_affected())
}

/// Deletes dead rows that died more than `older_than` ago (optionally of one tenant), in
/// chunks of [`CHUNK`]; returns how many.
pub async fn purge(
    pool: &MySqlPool,
    sql: &LayoutSql,
    older_than: Duration,
    tenant: Option<&str>,
) -> Result<u64, StoreError> {
    // A single-table DELETE (the only kind with ORDER BY and LIMIT) takes no alias before
    // MySQL 8.0.16: columns are qualified with the table's name instead.
    let table = &sql.table;
    let tenant_filter = match tenant {
        Some(_) => format!("AND {} = ?", sql.tenant_name_expr(table)),
        None => String::new(),
    };
    let text = format!(
        "DELETE FROM {table}
          WHERE {table}.dead_at IS NOT NULL AND {table}.published_at IS NULL
            AND {table}.dead_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
            {tenant_filter}
          ORDER BY {order_by} LIMIT ?",
        order_by = sql.order_by(table),
    );
    let older_us = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
    let tenant = tenant.map(str::to_owned);
    let mut conn = pool.acquire().await?;
    delete_in_chunks(&mut conn, &text, |q| {
        let q = q.bind(older_us);
        let q = match &tenant {
            Some(t) => q.bind(t.clone()),
            None => q,
        };
        q.bind(CHUNK)
    })
    .await
}
