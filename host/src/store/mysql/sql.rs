//! The relay's statements, built from the checked layout ([`LayoutSql`]): the claim, the due
//! probe, marking, rescheduling.
//!
//! MySQL has no array parameters: the paused tenants and the ids of a batch travel as one
//! placeholder each, so those statements are built for the number of values (and cached per
//! text by the driver's prepared-statement cache).

use std::sync::Arc;

use crate::model::OutboxId;
use crate::store::batch::ChunkedRows;
use crate::store::dialect::Driver;
use crate::store::fair::FairWalk;
use crate::store::layout_sql::LayoutSql;
use crate::store::rows::bind_failure;
use crate::store::statement::{Param, Statement};
use crate::store::{MarkMode, RowFailure, StoreOptions};

/// A statement with a place for the paused-tenants filter (one null-safe `NOT (tenant <=> ?)`
/// per paused tenant, NULL standing for rows without a tenant), built for the number of
/// paused tenants; the common case, none, is built once.
#[derive(Debug)]
pub(crate) struct WithPaused {
    head: String,
    /// One paused tenant's condition.
    filter: String,
    /// The id column, for [`WithPaused::excluding`].
    id: String,
    tail: String,
    unfiltered: Arc<str>,
}

impl WithPaused {
    fn new(head: String, tenant: &str, id: &str, tail: String) -> Self {
        Self {
            unfiltered: format!("{head}{tail}").into(),
            filter: format!(" AND NOT ({})", Driver::Mysql.null_safe_eq(tenant, "?")),
            id: id.to_owned(),
            head,
            tail,
        }
    }

    /// The statement for `paused` tenants; their names bind in place of the filter.
    pub(crate) fn sql(&self, paused: usize) -> Arc<str> {
        self.excluding(paused, 0)
    }

    /// … and for `excluded` ids, bound after the paused tenants and
    /// [`padded`](crate::store::statement::padded) to [`placeholder_count`].
    pub(crate) fn excluding(&self, paused: usize, excluded: usize) -> Arc<str> {
        if paused == 0 && excluded == 0 {
            return Arc::clone(&self.unfiltered);
        }
        let ids = match excluded {
            0 => String::new(),
            n => format!(
                " AND o.{} NOT IN ({})",
                self.id,
                vec!["?"; placeholder_count(n)].join(", ")
            ),
        };
        format!(
            "{}{}{ids} {}",
            self.head,
            self.filter.repeat(paused),
            self.tail
        )
        .into()
    }
}

/// The store's statements for one table and `[relay]` setting, built once at start-up.
#[derive(Debug)]
pub struct Statements {
    pub(crate) sql: LayoutSql,
    pub(crate) claim: WithPaused,
    pub(crate) due: WithPaused,
    /// `relay.fair_share`'s walk (`None` without it or without a tenant column).
    pub(crate) fair: Option<FairWalk>,
    /// The claim's key-order filter (empty without `ordering = "key"`).
    key_order: String,
    mark: MarkMode,
}

impl Statements {
    pub(crate) fn new(sql: LayoutSql, options: StoreOptions) -> Self {
        let table = &sql.table;
        let due_head = LayoutSql::due("UTC_TIMESTAMP(6)");
        let key_order = sql.key_order_filter(options.ordering, options.after_dead);
        let claim = WithPaused::new(
            format!(
                "SELECT {columns}
                   FROM {table} AS o
                  WHERE {due_head}",
                columns = sql.claimed_columns("o"),
            ),
            &sql.tenant_expr("o"),
            &sql.id,
            format!(
                "{key_order}
                  ORDER BY {order_by}
                  LIMIT ?
                    FOR UPDATE SKIP LOCKED",
                order_by = sql.order_by("o"),
            ),
        );
        let due = WithPaused::new(
            format!("SELECT CAST(EXISTS (SELECT 1 FROM {table} AS o WHERE {due_head}"),
            &sql.tenant_expr("o"),
            &sql.id,
            format!("{key_order}) AS SIGNED)"),
        );
        let fair = options
            .fair_share
            .and_then(|share| FairWalk::new(&sql, share.get(), &key_order));
        Self {
            claim,
            due,
            fair,
            key_order,
            mark: options.mark,
            sql,
        }
    }

    /// Locks the rows of `ids` that are still due (`FOR UPDATE SKIP LOCKED`, as the claim):
    /// `relay.fair_share`'s heads, picked by an unlocked walk. Joined by id as marking is (see
    /// [`Statements::values`]): MariaDB otherwise reads the ids through the unsent rows' index
    /// and locks every row of it, and the next relay's claim finds none.
    pub(crate) fn lock(&self, ids: &[OutboxId]) -> Statement {
        let mut statement = Statement::new(Driver::Mysql);
        let rows = self.values(&mut statement, ids, 1, |st, id| {
            format!("{} AS id", self.sql.bind_id(st, id))
        });
        let text = format!(
            "SELECT {columns} FROM {rows}
              WHERE {due} {key_order}
                FOR UPDATE SKIP LOCKED",
            columns = self.sql.claimed_columns("o"),
            due = LayoutSql::due("UTC_TIMESTAMP(6)"),
            key_order = self.key_order,
        );
        statement.with_sql(text)
    }

    /// The rows of `items` (one `SELECT` of `width` columns each, the id first, `bind` binding
    /// its values) joined to the table by id, the values first (`STRAIGHT_JOIN`): each row is
    /// found through the id's unique index. Left to itself the optimizer scans a small table
    /// instead, and a scanning `DELETE` waits on every row another relay's open claim has
    /// locked. Padded with rows of NULLs (which match no row) to [`placeholder_count`] rows.
    fn values<T>(
        &self,
        statement: &mut Statement,
        items: &[T],
        width: usize,
        bind: impl Fn(&mut Statement, &T) -> String,
    ) -> String {
        let mut rows: Vec<String> = items
            .iter()
            .map(|item| format!("SELECT {}", bind(statement, item)))
            .collect();
        while rows.len() < placeholder_count(items.len()) {
            let id = statement.param(Param::Null(self.sql.id_cast()));
            rows.push(format!("SELECT {id}{}", ", NULL".repeat(width - 1)));
        }
        format!(
            "({values}) AS f STRAIGHT_JOIN {table} AS o ON o.{id} = f.id",
            values = rows.join(" UNION ALL "),
            table = self.sql.table,
            id = self.sql.id,
        )
    }
}

impl ChunkedRows for Statements {
    fn mark(&self, ids: &[OutboxId]) -> Statement {
        let mut statement = Statement::new(Driver::Mysql);
        let rows = self.values(&mut statement, ids, 1, |st, id| {
            format!("{} AS id", self.sql.bind_id(st, id))
        });
        let text = match self.mark {
            MarkMode::Delete => format!("DELETE o FROM {rows}"),
            MarkMode::PublishedAt => format!(
                "UPDATE {rows} SET o.published_at = UTC_TIMESTAMP(6){}",
                self.sql.replay_cleared("o.")
            ),
        };
        statement.with_sql(text)
    }

    fn reschedule(&self, failed: &[RowFailure], fixed: Option<&str>) -> Statement {
        let mut statement = Statement::new(Driver::Mysql);
        let rows = self.values(&mut statement, failed, 5, |st, f| {
            let [id, error, delay, dead, counted] = bind_failure(&self.sql, st, f, fixed);
            format!("{id} AS id, {error} AS error, {delay} AS delay_ms, {dead} AS dead, {counted} AS counted")
        });
        let text = format!(
            "UPDATE {rows}
                SET o.attempts = o.attempts + f.counted,
                    o.last_error = f.error,
                    o.next_attempt_at = CASE WHEN f.dead = 1 THEN NULL
                        ELSE UTC_TIMESTAMP(6) + INTERVAL f.delay_ms * 1000 MICROSECOND END,
                    o.dead_at = CASE WHEN f.dead = 1 THEN UTC_TIMESTAMP(6) END"
        );
        statement.with_sql(text)
    }
}

/// The number of rows a statement for `n` values gets: the next power of two, the rest NULL.
/// Statements differ only by their placeholders, and sqlx prepares (and caches, up to 100 per
/// connection) each text: with one text per batch size the cache would overflow, and every
/// statement it evicts is closed with a packet MySQL does not answer, which stalls the next
/// statement for a delayed ACK (40 ms) under Nagle's algorithm. Powers of two keep each
/// connection at a handful of texts.
pub(crate) fn placeholder_count(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_layouts::{sluice_layout as layout, squash};
    use crate::store::{Disposition, Ordering};

    #[test]
    fn statements_come_in_a_few_sizes() {
        let sizes: std::collections::BTreeSet<usize> = (1..=1000).map(placeholder_count).collect();
        assert_eq!(sizes.len(), 11);
        assert_eq!(placeholder_count(0), 1);
        assert_eq!(placeholder_count(500), 512);
        assert_eq!(placeholder_count(1000), 1024);
    }

    #[test]
    fn the_claim_locks_skipping_and_filters_paused_tenants_by_placeholder() {
        let s = Statements::new(
            LayoutSql::new(layout(), Driver::Mysql),
            StoreOptions::default(),
        );
        let plain = squash(&s.claim.sql(0));
        assert!(
            plain.ends_with("ORDER BY o.`id` LIMIT ? FOR UPDATE SKIP LOCKED"),
            "{plain}"
        );
        assert!(!plain.contains("<=>"), "{plain}");
        let paused = squash(&s.claim.sql(2));
        let filter = "AND NOT (CAST(o.`tenant` AS CHAR) <=> ?)";
        assert_eq!(paused.matches(filter).count(), 2, "{paused}");
        assert!(paused.find("<=>") < paused.find("LIMIT ?"), "{paused}");
    }

    #[test]
    fn key_order_compares_tenants_null_safely() {
        let options = StoreOptions {
            ordering: Ordering::Key,
            ..StoreOptions::default()
        };
        let s = Statements::new(LayoutSql::new(layout(), Driver::Mysql), options);
        let claim = squash(&s.claim.sql(0));
        assert!(
            claim.contains("AND p.`tenant` <=> o.`tenant` AND p.`id` < o.`id`"),
            "{claim}"
        );
    }

    #[test]
    fn marking_and_rescheduling_bind_one_placeholder_per_value_padded_with_nulls() {
        let options = StoreOptions {
            mark: MarkMode::PublishedAt,
            ..StoreOptions::default()
        };
        let s = Statements::new(LayoutSql::new(layout(), Driver::Mysql), options);
        let ids = [OutboxId::Int(1), OutboxId::Int(2), OutboxId::Int(3)];
        let mark = s.mark(&ids);
        assert_eq!(
            mark.sql,
            "UPDATE (SELECT ? AS id UNION ALL SELECT ? AS id UNION ALL SELECT ? AS id \
             UNION ALL SELECT ?) AS f STRAIGHT_JOIN `outbox` AS o ON o.`id` = f.id \
             SET o.published_at = UTC_TIMESTAMP(6), o.`replay_id` = NULL"
        );
        assert_eq!(
            mark.params,
            [
                Param::Int(1),
                Param::Int(2),
                Param::Int(3),
                Param::Null(crate::store::dialect::Cast::Int)
            ]
        );
        let failed: Vec<RowFailure> = ids[..2]
            .iter()
            .map(|id| RowFailure {
                id: id.clone(),
                error: "boom".into(),
                disposition: Disposition::Dead,
            })
            .collect();
        let reschedule = s.reschedule(&failed, None);
        assert_eq!(reschedule.params.len(), 10);
        let reschedule = squash(&reschedule.sql);
        assert!(
            reschedule.starts_with(
                "UPDATE (SELECT ? AS id, ? AS error, ? AS delay_ms, ? AS dead, ? AS counted \
                 UNION ALL SELECT ? AS id, ? AS error, ? AS delay_ms, ? AS dead, ? AS counted) \
                 AS f STRAIGHT_JOIN `outbox` AS o ON o.`id` = f.id"
            ),
            "{reschedule}"
        );
    }
}
