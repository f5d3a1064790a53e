//! PostgreSQL's `relay.fair_share` (what it does: [`crate::store::fair`]): one statement walks
//! the tenants with due rows — a recursive loose scan of the `<table>_unsent_tenant…_idx`
//! index, one probe per tenant — joined `LATERAL` to each tenant's first `share` due rows,
//! `FOR UPDATE SKIP LOCKED` like the claim.

use std::sync::Arc;

use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::{AssertSqlSafe, Row, ValueRef};

use super::paused::unpaused;
use super::schema::PgTypes;
use crate::store::StoreError;
use crate::store::ddl;
use crate::store::fair::{TenantTurn, check_tenant_index, passed_over};
use crate::store::layout_sql::LayoutSql;
use crate::store::rows::column;
use crate::store::schema::Layout;

/// Refuses a table the walk cannot serve: one without a tenant column, or without an index
/// led by it (without one, every probe of the walk reads the whole table).
pub(super) async fn check_table(pool: &PgPool, layout: &Layout) -> Result<(), StoreError> {
    let indexed: bool = match &layout.tenant {
        Some(tenant) => {
            sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_index i
                                  JOIN pg_attribute a ON a.attrelid = i.indrelid
                                                     AND a.attnum = i.indkey[0]
                                 WHERE i.indrelid = to_regclass($1) AND i.indisvalid
                                   AND a.attname = $2)",
            )
            .bind(layout.table.to_string())
            .bind(tenant.as_str())
            .fetch_one(pool)
            .await?
        }
        None => false,
    };
    check_tenant_index(layout, indexed, || {
        ddl::partial_indexes::<PgTypes>(layout, ddl::tenant_index(layout))
            .pop()
            .unwrap_or_default()
    })
}

/// `relay.fair_share`'s statements: the walk's ([`FairSql`]), and the claim that fills up after
/// the heads (built with the claim, [`super::sql::Statements`]).
pub(super) struct FairClaim {
    /// The most rows of one tenant a walk takes.
    pub share: usize,
    pub heads: FairSql,
    /// The claim in claim order, past the heads (`$3`, as text).
    pub fill: Arc<str>,
    /// … and past the cursor (`$4`), when rows are claimed in integer id order.
    pub fill_after: Option<Arc<str>>,
}

/// The heads statements of one table (see the module documentation). Parameters: `$1` the
/// paused tenants, `$2` the most rows (and tenants) a walk takes, `$3` the share, and `$4` the
/// tenant the walk starts after ([`FairSql::heads_after`]) or goes up to
/// ([`FairSql::heads_until`]: the rest of the turn, from the first tenant).
pub(super) struct FairSql {
    pub heads: Arc<str>,
    pub heads_after: Arc<str>,
    pub heads_until: Arc<str>,
    /// The heads of the rows without a tenant (`$2` the room left, `$3` the share): they
    /// take their turn after the last tenant.
    pub no_tenant: Arc<str>,
    /// The heads' column holding the visited tenant (after the extra columns).
    pub visited: usize,
}

impl FairSql {
    /// `key_order`: the claim's key-order filter (empty without `ordering = "key"`). `None`
    /// without a tenant column.
    ///
    /// The statements are shaped for the tenant index, because the planner cannot see which
    /// tenant a probe is for and guesses wrong otherwise:
    /// - paused tenants (`$1`) are left out by name after the walk, not by the claim's
    ///   `NOT EXISTS (… unnest($1) …)` in every probe: with that anti-join the planner
    ///   expects one row and reads the whole table instead of probing the index;
    /// - a tenant's heads are asked for as a range of one tenant value (`>=` and `<=`, not
    ///   `=`) ordered by tenant first: with `=` the planner takes the order for granted and
    ///   scans the claim-order index, reading every other tenant's rows before the last
    ///   tenant's (12 ms instead of 0.1 ms measured with 100,000 rows of one tenant ahead);
    ///   `tenant DESC, id` is the index's (`tenant, id DESC`) order scanned backwards.
    pub(super) fn new(sql: &LayoutSql, key_order: &str) -> Option<Self> {
        let tenant = sql.tenant.as_ref()?;
        let due = LayoutSql::due("now()");
        let heads = |after: &str, until: &str| -> Arc<str> {
            format!(
                "WITH RECURSIVE visit(tenant) AS (
                    (SELECT o.{tenant} FROM {table} AS o
                      WHERE {due} AND o.{tenant} IS NOT NULL {after} {until}
                      ORDER BY o.{tenant} LIMIT 1)
                  UNION ALL
                    SELECT (SELECT o.{tenant} FROM {table} AS o
                             WHERE {due} AND o.{tenant} > visit.tenant {until}
                             ORDER BY o.{tenant} LIMIT 1)
                      FROM visit
                     WHERE visit.tenant IS NOT NULL
                 )
                 SELECT h.*, v.tenant::text AS visited
                   FROM (SELECT tenant FROM visit
                          WHERE tenant IS NOT NULL AND {unpaused}
                          LIMIT $2) AS v
                   LEFT JOIN LATERAL (
                        SELECT {columns}
                          FROM {table} AS o
                         WHERE o.{tenant} >= v.tenant AND o.{tenant} <= v.tenant
                           AND {due} {key_order}
                         ORDER BY o.{tenant} DESC, {order_by}
                         LIMIT $3
                           FOR UPDATE OF o SKIP LOCKED) AS h ON true
                  LIMIT $2",
                table = sql.table,
                columns = sql.claimed_columns("o"),
                order_by = sql.order_by("o"),
                unpaused = unpaused("tenant::text"),
            )
            .into()
        };
        let no_tenant = format!(
            "SELECT {columns}
               FROM {table} AS o
              WHERE o.{tenant} IS NULL AND {unpaused}
                AND {due} {key_order}
              ORDER BY o.{tenant} DESC, {order_by}
              LIMIT LEAST($2, $3)
                FOR UPDATE OF o SKIP LOCKED",
            table = sql.table,
            columns = sql.claimed_columns("o"),
            order_by = sql.order_by("o"),
            unpaused = unpaused(&sql.tenant_expr("o")),
        );
        Some(Self {
            visited: column::after_extra(sql),
            no_tenant: no_tenant.into(),
            heads: heads("", ""),
            heads_after: heads(&format!("AND o.{tenant} > $4"), ""),
            heads_until: heads("", &format!("AND o.{tenant} <= $4")),
        })
    }
}

/// What a walk found: the rows it claimed, in walk order, and the last tenant it visited
/// (with or without rows to take: a tenant's may all be locked by other batches).
pub(super) struct Heads {
    pub rows: Vec<PgRow>,
    pub last: Option<String>,
    /// The walk stopped at its limit (of rows, or of tenants) before the last tenant.
    pub cut: bool,
}

impl Heads {
    /// Reads the result of a heads statement run with `limit` (`$2`): a row per claimed
    /// head, and one without a row (all its columns NULL) per visited tenant that had none
    /// to take.
    pub(super) fn read(
        result: Vec<PgRow>,
        limit: usize,
        visited_column: usize,
    ) -> Result<Self, StoreError> {
        let mut heads = Self {
            rows: Vec::with_capacity(result.len()),
            last: None,
            cut: result.len() >= limit,
        };
        for row in result {
            let visited: Option<String> = row.try_get(visited_column)?;
            heads.last = visited;
            if !row.try_get_raw(column::ID)?.is_null() {
                heads.rows.push(row);
            }
        }
        Ok(heads)
    }
}

/// `relay.fair_share`: the heads of the tenants next in turn, claimed in `tx`. A walk that
/// reaches the last tenant takes the rows without a tenant, and if it started after a
/// tenant, goes on from the first up to where it started. Tenants the last fill served
/// ([`TenantTurn::filled`]) are passed over like paused ones.
pub(super) async fn claim_heads(
    tx: &mut PgConnection,
    fair: &FairClaim,
    turn: &TenantTurn,
    paused: &[Option<&str>],
    limit: usize,
) -> Result<Vec<PgRow>, StoreError> {
    let served = turn.served();
    let skip = passed_over(paused, &served);
    let after = turn.start();
    let first = match &after {
        Some(tenant) => (&fair.heads.heads_after, Some(tenant)),
        None => (&fair.heads.heads, None),
    };
    let mut heads = walk(tx, fair, first, &skip, limit).await?;
    if !heads.cut {
        // Past the last tenant: the rows without one, then the tenants before the start.
        let room = limit - heads.rows.len().min(limit);
        if room > 0 {
            let no_tenant = sqlx::query(AssertSqlSafe(Arc::clone(&fair.heads.no_tenant)))
                .bind(&skip)
                .bind(i64::try_from(room).unwrap_or(i64::MAX))
                .bind(i64::try_from(fair.share).unwrap_or(i64::MAX));
            heads.rows.extend(no_tenant.fetch_all(&mut *tx).await?);
        }
        let room = limit - heads.rows.len().min(limit);
        if let Some(tenant) = &after
            && room > 0
        {
            let rest = (&fair.heads.heads_until, Some(tenant));
            let mut more = walk(tx, fair, rest, &skip, room).await?;
            heads.rows.append(&mut more.rows);
            more.rows = heads.rows;
            heads = more;
        }
    }
    turn.walked(heads.cut, heads.last);
    Ok(heads.rows)
}

/// One heads statement: `(sql, tenant)` is which one and where it starts or stops; `skip`
/// the tenants it passes over (`$1`).
async fn walk(
    tx: &mut PgConnection,
    fair: &FairClaim,
    (sql, tenant): (&Arc<str>, Option<&String>),
    skip: &[Option<&str>],
    limit: usize,
) -> Result<Heads, StoreError> {
    let query = sqlx::query(AssertSqlSafe(Arc::clone(sql)))
        .bind(skip)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(i64::try_from(fair.share).unwrap_or(i64::MAX));
    let query = match tenant {
        Some(tenant) => query.bind(tenant),
        None => query,
    };
    Heads::read(query.fetch_all(&mut *tx).await?, limit, fair.heads.visited)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::dialect::Driver;
    use crate::store::test_layouts::{debezium_layout, sluice_layout, squash};

    #[test]
    fn the_walk_probes_the_tenant_index_and_locks_heads_like_the_claim() {
        let sql = LayoutSql::new(sluice_layout(), Driver::Postgres);
        let fair = FairSql::new(&sql, "KEY_ORDER").expect("a tenant column");
        let heads = squash(&fair.heads);
        let due = squash(&LayoutSql::due("now()"));
        assert!(
            heads.contains(&format!(
                "(SELECT o.\"tenant\" FROM \"outbox\" AS o WHERE {due} AND o.\"tenant\" IS NOT NULL ORDER BY o.\"tenant\" LIMIT 1)"
            )),
            "{heads}"
        );
        assert!(
            heads.contains(&format!("WHERE o.\"tenant\" >= v.tenant AND o.\"tenant\" <= v.tenant AND {due} KEY_ORDER ORDER BY o.\"tenant\" DESC, o.\"id\" LIMIT $3 FOR UPDATE OF o SKIP LOCKED")),
            "{heads}"
        );
        // No anti-join on the paused tenants in the probes (see `FairSql::new`).
        assert!(!heads.contains("unnest"), "{heads}");
        assert!(
            heads.contains("tenant::text <> ALL(array_remove($1::text[], NULL))"),
            "{heads}"
        );
        assert!(!heads.contains("$4"), "{heads}");
        let after = squash(&fair.heads_after);
        assert!(
            after.contains("IS NOT NULL AND o.\"tenant\" > $4 ORDER BY"),
            "{after}"
        );
        let until = squash(&fair.heads_until);
        assert!(
            until.contains("IS NOT NULL AND o.\"tenant\" <= $4 ORDER BY")
                && until.contains("o.\"tenant\" > visit.tenant AND o.\"tenant\" <= $4 ORDER BY"),
            "{until}"
        );
        let no_tenant = LayoutSql::new(debezium_layout(), Driver::Postgres);
        assert!(FairSql::new(&no_tenant, "").is_none());
    }
}
