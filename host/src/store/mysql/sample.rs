//! The metrics sampler's statement: due rows, the oldest due row's age and dead rows per
//! tenant, reading at most `limit` unsent rows and at most `limit` dead ones (both through the
//! `(published_at, dead_at, order)` index).

use std::sync::Arc;

use sqlx::{AssertSqlSafe, MySqlPool};

use crate::store::layout_sql::LayoutSql;
use crate::store::{StoreError, TenantBacklog, tenant_backlogs};

pub fn statement(sql: &LayoutSql) -> String {
    format!(
        "SELECT tenant, CAST(SUM(due) AS SIGNED), CAST(SUM(dead) AS SIGNED),
                CAST(TIMESTAMPDIFF(MICROSECOND, MIN(oldest), UTC_TIMESTAMP(6)) AS SIGNED)
           FROM (SELECT tenant, SUM(due) AS due, 0 AS dead,
                        MIN(CASE WHEN due THEN created_at END) AS oldest
                   FROM (SELECT {tenant} AS tenant, {created_at} AS created_at,
                                (o.next_attempt_at IS NULL
                                 OR o.next_attempt_at <= UTC_TIMESTAMP(6)) AS due
                           FROM {table} AS o
                          WHERE o.published_at IS NULL AND o.dead_at IS NULL
                          ORDER BY {order_by}
                          LIMIT ?) AS u
                  GROUP BY tenant
                 UNION ALL
                 SELECT tenant, 0, COUNT(*), NULL
                   FROM (SELECT {tenant} AS tenant FROM {table} AS o
                          WHERE o.published_at IS NULL AND o.dead_at IS NOT NULL
                          LIMIT ?) AS d
                  GROUP BY tenant) AS s
          GROUP BY tenant",
        table = sql.table,
        tenant = sql.tenant_expr("o"),
        created_at = sql.created_at_expr("o"),
        order_by = sql.order_by("o"),
    )
}

pub async fn sample(
    pool: &MySqlPool,
    statement: &Arc<str>,
    limit: i64,
) -> Result<Vec<TenantBacklog>, StoreError> {
    let rows = sqlx::query_as(AssertSqlSafe(Arc::clone(statement)))
        .bind(limit)
        .bind(limit)
        .fetch_all(pool)
        .await?;
    Ok(tenant_backlogs(rows))
}
