//! Dead rows (`sluice dead list|replay|purge`) and retention (the pruner): deletes run in
//! bounded chunks, each its own short write transaction, so the application's writers wait
//! for at most one chunk. Two pruners of one table just take turns.

use std::time::Duration;

use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{AssertSqlSafe, Row};

use super::rows::{LiteQuery, from_ms, now_ms, read_id};
use crate::store::chunk::{CHUNK, Chunks, millis};
use crate::store::layout_sql::LayoutSql;
use crate::model::OutboxId;
use crate::store::{DeadRow, ReplaySelection, StoreError};

/// Dead rows, oldest first (in claim order), optionally of one tenant (`default` matches
/// rows without a tenant).
pub async fn list(
    pool: &SqlitePool,
    sql: &LayoutSql,
    tenant: Option<&str>,
    limit: i64,
) -> Result<Vec<DeadRow>, StoreError> {
    let l = &sql.layout;
    let tenant_filter = match tenant {
        Some(_) => format!("AND {} = ?", sql.tenant_name_expr("o")),
        None => String::new(),
    };
    let text = format!(
        "SELECT {id} AS id, {tenant} AS tenant, CAST(o.{at} AS TEXT) AS aggregate_type,
                CAST(o.{ai} AS TEXT) AS aggregate_id, CAST(o.{et} AS TEXT) AS event_type,
                o.attempts AS attempts, o.dead_at AS dead_at,
                CAST(o.last_error AS TEXT) AS last_error
           FROM {table} AS o
          WHERE o.dead_at IS NOT NULL {tenant_filter}
          ORDER BY {order_by}
          LIMIT ?",
        id = sql.id_expr("o"),
        tenant = sql.tenant_expr("o"),
        at = l.aggregate_type,
        ai = l.aggregate_id,
        et = l.event_type,
        table = l.table,
        order_by = sql.order_by("o"),
    );
    let mut query = sqlx::query(AssertSqlSafe(text));
    if let Some(tenant) = tenant {
        query = query.bind(tenant.to_owned());
    }
    let rows = query.bind(limit).fetch_all(pool).await?;
    Ok(rows
        .iter()
        .map(|row| dead_row(row, sql))
        .collect::<Result<_, _>>()?)
}

fn dead_row(row: &SqliteRow, sql: &LayoutSql) -> Result<DeadRow, sqlx::Error> {
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
        dead_at: from_ms(row.try_get("dead_at")?),
        last_error: row.try_get("last_error")?,
    })
}

/// Makes the selected dead rows due again with a fresh attempt count; returns how many.
pub async fn replay(
    pool: &SqlitePool,
    sql: &LayoutSql,
    selection: &ReplaySelection,
) -> Result<u64, StoreError> {
    let l = &sql.layout;
    let filter = match selection {
        ReplaySelection::Id(_) => format!("AND o.{} = ?", l.id),
        ReplaySelection::Tenant(_) => format!("AND {} = ?", sql.tenant_name_expr("o")),
        ReplaySelection::All => String::new(),
    };
    let text = format!(
        "UPDATE {table} AS o
            SET dead_at = NULL, attempts = 0, next_attempt_at = NULL,
                leased_by = NULL, lease_until = NULL
          WHERE o.dead_at IS NOT NULL AND o.published_at IS NULL {filter}",
        table = l.table,
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

/// Deletes dead rows that died more than `older_than` ago (optionally of one tenant); returns
/// how many.
pub async fn purge(
    pool: &SqlitePool,
    sql: &LayoutSql,
    older_than: Duration,
    tenant: Option<&str>,
) -> Result<u64, StoreError> {
    let l = &sql.layout;
    let tenant_filter = match tenant {
        Some(_) => format!("AND {} = ?", sql.tenant_name_expr("o")),
        None => String::new(),
    };
    let text = format!(
        "DELETE FROM {table}
          WHERE {id} IN (SELECT o.{id} FROM {table} AS o
                          WHERE o.dead_at IS NOT NULL AND o.published_at IS NULL
                            AND o.dead_at <= ? {tenant_filter}
                          ORDER BY {order_by} LIMIT ?)",
        table = l.table,
        id = l.id,
        order_by = sql.order_by("o"),
    );
    let cutoff = now_ms().saturating_sub(millis(older_than));
    let tenant = tenant.map(str::to_owned);
    delete_in_chunks(pool, &text, |q| {
        let q = q.bind(cutoff);
        let q = match &tenant {
            Some(t) => q.bind(t.clone()),
            None => q,
        };
        q.bind(CHUNK)
    })
    .await
}

/// Deletes sent rows older than `retention` (`mark = "published_at"`), in id order; dead
/// rows are never pruned. Returns how many rows it deleted.
pub async fn prune(
    pool: &SqlitePool,
    sql: &LayoutSql,
    retention: Duration,
) -> Result<u64, StoreError> {
    let l = &sql.layout;
    let text = format!(
        "DELETE FROM {table}
          WHERE {id} IN (SELECT {id} FROM {table}
                          WHERE published_at < ? ORDER BY {id} LIMIT ?)",
        table = l.table,
        id = l.id,
    );
    let cutoff = now_ms().saturating_sub(millis(retention));
    delete_in_chunks(pool, &text, |q| q.bind(cutoff).bind(CHUNK)).await
}

/// Runs the `DELETE` in `text` (at most [`CHUNK`] rows each) until a chunk comes back short.
async fn delete_in_chunks(
    pool: &SqlitePool,
    text: &str,
    bind: impl Fn(LiteQuery<'_>) -> LiteQuery<'_>,
) -> Result<u64, StoreError> {
    let mut chunks = Chunks::default();
    loop {
        let deleted = bind(sqlx::query(AssertSqlSafe(text)))
            .execute(pool)
            .await?
            .rows_affected();
        if !chunks.more(deleted).await {
            return Ok(chunks.total());
        }
    }
}
