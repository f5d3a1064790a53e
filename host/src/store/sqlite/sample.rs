//! The metrics sampler's statement: due rows, the oldest due row's age and dead rows per
//! tenant, reading at most `limit` unsent rows (the claim's partial index, in claim order) and
//! at most `limit` dead ones. Times are milliseconds since the epoch, bound from Rust like the
//! claim's.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlitePool};

use super::rows::now_ms;
use crate::store::layout_sql::LayoutSql;
use crate::store::{StoreError, TenantBacklog, tenant_backlogs};

pub fn statement(sql: &LayoutSql) -> String {
    format!(
        "SELECT tenant, SUM(due), SUM(dead), (?1 - MIN(oldest)) * 1000
           FROM (SELECT tenant, SUM(due) AS due, 0 AS dead,
                        MIN(CASE WHEN due THEN created_at_ms END) AS oldest
                   FROM (SELECT {tenant} AS tenant, {created_at} AS created_at_ms,
                                (o.next_attempt_at IS NULL OR o.next_attempt_at <= ?1) AS due
                           FROM {table} AS o
                          WHERE o.published_at IS NULL AND o.dead_at IS NULL
                          ORDER BY {order_by}
                          LIMIT ?2)
                  GROUP BY tenant
                 UNION ALL
                 SELECT tenant, 0, COUNT(*), NULL
                   FROM (SELECT {tenant} AS tenant FROM {table} AS o
                          WHERE o.published_at IS NULL AND o.dead_at IS NOT NULL
                          ORDER BY {order_by}
                          LIMIT ?2)
                  GROUP BY tenant)
          GROUP BY tenant",
        table = sql.table,
        tenant = sql.tenant_expr("o"),
        created_at = sql.created_at_expr("o"),
        order_by = sql.order_by("o"),
    )
}

pub async fn sample(
    pool: &SqlitePool,
    statement: &Arc<str>,
    limit: i64,
) -> Result<Vec<TenantBacklog>, StoreError> {
    let rows = sqlx::query_as(AssertSqlSafe(Arc::clone(statement)))
        .bind(now_ms())
        .bind(limit)
        .fetch_all(pool)
        .await?;
    Ok(tenant_backlogs(rows))
}
