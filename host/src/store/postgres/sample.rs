//! The metrics sampler's statement: due rows, the oldest due row's age and dead rows per
//! tenant, reading at most `$1` unsent rows (the claim's partial index, in claim order) and
//! at most `$1` dead ones (the dead rows' partial index; tables migrated before it existed
//! get it from `sluice migrate`).

use std::sync::Arc;

use sqlx::{AssertSqlSafe, PgPool};

use crate::store::layout_sql::LayoutSql;
use crate::store::{StoreError, TenantBacklog, tenant_backlogs};

pub fn statement(sql: &LayoutSql) -> String {
    format!(
        "WITH unsent AS (
              SELECT {tenant} AS tenant, {created_at} AS created_at,
                     (o.next_attempt_at IS NULL OR o.next_attempt_at <= now()) AS due
                FROM {table} AS o
               WHERE o.published_at IS NULL AND o.dead_at IS NULL
               ORDER BY {order_by}
               LIMIT $1),
         dead AS (
              SELECT {tenant} AS tenant FROM {table} AS o
               WHERE o.published_at IS NULL AND o.dead_at IS NOT NULL
               ORDER BY {order_by}
               LIMIT $1)
         SELECT tenant, sum(due)::int8, sum(dead)::int8,
                (extract(epoch FROM now() - min(oldest)) * 1000000)::int8
           FROM (SELECT tenant, count(*) FILTER (WHERE due) AS due, 0::int8 AS dead,
                        min(created_at) FILTER (WHERE due) AS oldest
                   FROM unsent GROUP BY tenant
                 UNION ALL
                 SELECT tenant, 0, count(*), NULL FROM dead GROUP BY tenant) AS s
          GROUP BY tenant",
        table = sql.table,
        tenant = sql.tenant_expr("o"),
        created_at = sql.created_at_expr("o"),
        order_by = sql.order_by("o"),
    )
}

pub async fn sample(
    pool: &PgPool,
    statement: &Arc<str>,
    limit: i64,
) -> Result<Vec<TenantBacklog>, StoreError> {
    let rows = sqlx::query_as(AssertSqlSafe(Arc::clone(statement)))
        .bind(limit)
        .fetch_all(pool)
        .await?;
    Ok(tenant_backlogs(rows))
}
