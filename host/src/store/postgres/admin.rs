//! Dead rows: listing, replaying and purging them (`sluice dead list|replay|purge`).

use std::time::Duration;

use sqlx::postgres::{PgPool, PgRow};
use sqlx::{AssertSqlSafe, Row};

use super::prune::delete_in_chunks;
use super::schema::KeyKind;
use super::sql::key_cast;
use crate::store::chunk::{CHUNK, millis};
use crate::store::layout_sql::LayoutSql;
use crate::model::OutboxId;
use crate::store::{DeadRow, ReplaySelection, StoreError};

/// Dead rows, oldest first (in claim order), optionally of one tenant (`default` matches
/// rows without a tenant).
pub async fn list(
    pool: &PgPool,
    sql: &LayoutSql,
    tenant: Option<&str>,
    limit: i64,
) -> Result<Vec<DeadRow>, StoreError> {
    let text = format!(
        "SELECT {id} AS id, {tenant} AS tenant, o.{at}::text AS aggregate_type,
                o.{ai}::text AS aggregate_id, o.{et}::text AS event_type,
                o.attempts, o.dead_at, o.last_error
           FROM {table} AS o
          WHERE o.dead_at IS NOT NULL
            AND ($1::text IS NULL OR {tenant_name} = $1)
          ORDER BY {order_by}
          LIMIT $2",
        id = sql.id_expr("o"),
        tenant = sql.tenant_expr("o"),
        tenant_name = sql.tenant_name_expr("o"),
        at = sql.aggregate_type,
        ai = sql.aggregate_id,
        et = sql.event_type,
        table = sql.table,
        order_by = sql.order_by("o"),
    );
    let rows = sqlx::query(AssertSqlSafe(text))
        .bind(tenant)
        .bind(limit)
        .fetch_all(pool)
        .await?;
    Ok(rows
        .iter()
        .map(|row| dead_row(row, &sql.layout.key))
        .collect::<Result<_, _>>()?)
}

fn dead_row(row: &PgRow, key: &KeyKind) -> Result<DeadRow, sqlx::Error> {
    let id = match key {
        KeyKind::Int => OutboxId::Int(row.try_get("id")?),
        KeyKind::Text { .. } => OutboxId::Text(row.try_get::<String, _>("id")?.into()),
    };
    // A NULL string column (the reason such a row went dead) is shown empty.
    let text = |name: &str| -> Result<String, sqlx::Error> {
        Ok(row.try_get::<Option<String>, _>(name)?.unwrap_or_default())
    };
    Ok(DeadRow {
        id,
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
    pool: &PgPool,
    sql: &LayoutSql,
    selection: &ReplaySelection,
) -> Result<u64, StoreError> {
    let (id, tenant) = match selection {
        ReplaySelection::Id(id) => (Some(sql.layout.parse_id(id)?.to_string()), None),
        ReplaySelection::Tenant(t) => (None, Some(t.as_str())),
        ReplaySelection::All => (None, None),
    };
    let text = format!(
        "UPDATE {table} AS o
            SET dead_at = NULL, attempts = 0, next_attempt_at = NULL
          WHERE o.dead_at IS NOT NULL AND o.published_at IS NULL
            AND ($1::text IS NULL OR o.{id} = $1::text::{cast})
            AND ($2::text IS NULL OR {tenant_name} = $2)",
        table = sql.table,
        id = sql.id,
        cast = key_cast(&sql.layout.key),
        tenant_name = sql.tenant_name_expr("o"),
    );
    Ok(sqlx::query(AssertSqlSafe(text))
        .bind(id)
        .bind(tenant)
        .execute(pool)
        .await?
        .rows_affected())
}

/// Deletes dead rows that died more than `older_than` ago (optionally of one tenant), in
/// chunks of [`CHUNK`]; returns how many. Their content is gone for good:
/// `sluice dead list` them first, or dead-letter them to a topic.
pub async fn purge(
    pool: &PgPool,
    sql: &LayoutSql,
    older_than: Duration,
    tenant: Option<&str>,
) -> Result<u64, StoreError> {
    let text = format!(
        "DELETE FROM {table}
          WHERE {id} IN (SELECT o.{id} FROM {table} AS o
                          WHERE o.dead_at IS NOT NULL AND o.published_at IS NULL
                            AND o.dead_at <= now() - $1 * interval '1 millisecond'
                            AND ($2::text IS NULL OR {tenant_name} = $2)
                          ORDER BY {order_by} LIMIT $3)",
        table = sql.table,
        id = sql.id,
        tenant_name = sql.tenant_name_expr("o"),
        order_by = sql.order_by("o"),
    );
    let older_ms = millis(older_than);
    let tenant = tenant.map(str::to_owned);
    delete_in_chunks(pool, &text, |q| {
        q.bind(older_ms).bind(tenant.clone()).bind(CHUNK)
    })
    .await
}
