//! Dead rows: listing them and making them due again (`sluice dead list|replay`).

use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};

use super::{StoreError, TableName};

/// A dead-lettered row, as `sluice dead list` shows it.
#[derive(Debug, Clone)]
pub struct DeadRow {
    pub id: i64,
    pub tenant: Option<String>,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub attempts: i32,
    pub dead_at: DateTime<Utc>,
    pub last_error: Option<String>,
}

/// Which dead rows to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplaySelection {
    Id(i64),
    Tenant(String),
    All,
}

/// Dead rows, oldest first, optionally of one tenant (`default` matches NULL tenants).
pub async fn list(
    pool: &PgPool,
    table: &TableName,
    tenant: Option<&str>,
    limit: i64,
) -> Result<Vec<DeadRow>, StoreError> {
    let sql = format!(
        "SELECT id, tenant::text AS tenant, aggregate_type::text AS aggregate_type,
                aggregate_id::text AS aggregate_id, event_type::text AS event_type,
                attempts, dead_at, last_error
           FROM {table}
          WHERE dead_at IS NOT NULL
            AND ($1::text IS NULL OR COALESCE(tenant::text, 'default') = $1)
          ORDER BY id
          LIMIT $2"
    );
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(tenant)
        .bind(limit)
        .fetch_all(pool)
        .await?;
    Ok(rows.iter().map(dead_row).collect::<Result<_, _>>()?)
}

fn dead_row(row: &PgRow) -> Result<DeadRow, sqlx::Error> {
    Ok(DeadRow {
        id: row.try_get("id")?,
        tenant: row.try_get("tenant")?,
        aggregate_type: row.try_get("aggregate_type")?,
        aggregate_id: row.try_get("aggregate_id")?,
        event_type: row.try_get("event_type")?,
        attempts: row.try_get("attempts")?,
        dead_at: row.try_get("dead_at")?,
        last_error: row.try_get("last_error")?,
    })
}

/// Makes the selected dead rows due again with a fresh attempt count; returns how many.
/// `last_error` is kept so the history of the row stays visible until it is delivered.
pub async fn replay(
    pool: &PgPool,
    table: &TableName,
    selection: &ReplaySelection,
) -> Result<u64, StoreError> {
    let (id, tenant) = match selection {
        ReplaySelection::Id(id) => (Some(*id), None),
        ReplaySelection::Tenant(t) => (None, Some(t.as_str())),
        ReplaySelection::All => (None, None),
    };
    let sql = format!(
        "UPDATE {table}
            SET dead_at = NULL, attempts = 0, next_attempt_at = NULL
          WHERE dead_at IS NOT NULL AND published_at IS NULL
            AND ($1::int8 IS NULL OR id = $1)
            AND ($2::text IS NULL OR COALESCE(tenant::text, 'default') = $2)"
    );
    Ok(sqlx::query(AssertSqlSafe(sql))
        .bind(id)
        .bind(tenant)
        .execute(pool)
        .await?
        .rows_affected())
}

/// Deletes dead rows that died more than `older_than` ago (optionally of one tenant), in
/// chunks of [`super::prune::CHUNK`]; returns how many. Their content is gone for good:
/// `sluice dead list` them first, or dead-letter them to a topic.
pub async fn purge(
    pool: &PgPool,
    table: &TableName,
    older_than: std::time::Duration,
    tenant: Option<&str>,
) -> Result<u64, StoreError> {
    let sql = format!(
        "DELETE FROM {table}
          WHERE id IN (SELECT id FROM {table}
                        WHERE dead_at IS NOT NULL AND published_at IS NULL
                          AND dead_at <= now() - $1 * interval '1 millisecond'
                          AND ($2::text IS NULL OR COALESCE(tenant::text, 'default') = $2)
                        ORDER BY id LIMIT $3)"
    );
    let older_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
    let tenant = tenant.map(str::to_owned);
    super::prune::delete_in_chunks(pool, &sql, |q| {
        q.bind(older_ms)
            .bind(tenant.clone())
            .bind(super::prune::CHUNK)
    })
    .await
}
