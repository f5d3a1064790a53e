//! The relay's statements, built from the checked layout ([`LayoutSql`]): the claim, the due
//! probe, marking, rescheduling.
//!
//! MySQL has no array parameters: the paused tenants and the ids of a batch travel as one
//! placeholder each, so those statements are built for the number of values (and cached per
//! text by the driver's prepared-statement cache).

use std::sync::Arc;

use crate::store::dialect::Dialect;
use crate::store::layout_sql::LayoutSql;
use crate::store::{MarkMode, StoreOptions};

/// A statement with a place for the paused-tenants filter (one null-safe `NOT (tenant <=> ?)`
/// per paused tenant, NULL standing for rows without a tenant), built for the number of
/// paused tenants; the common case, none, is built once.
#[derive(Debug)]
pub(crate) struct WithPaused {
    head: String,
    tenant: String,
    tail: String,
    unfiltered: Arc<str>,
}

impl WithPaused {
    fn new(head: String, tenant: String, tail: String) -> Self {
        Self {
            unfiltered: format!("{head}{tail}").into(),
            head,
            tenant,
            tail,
        }
    }

    /// The statement for `paused` tenants; their names bind in place of the filter.
    pub(crate) fn sql(&self, paused: usize) -> Arc<str> {
        if paused == 0 {
            return Arc::clone(&self.unfiltered);
        }
        let filter = format!(
            " AND NOT ({})",
            Dialect::Mysql.null_safe_eq(&self.tenant, "?")
        )
        .repeat(paused);
        format!("{}{filter} {}", self.head, self.tail).into()
    }
}

/// The store's statements for one table and `[relay]` setting, built once at start-up.
#[derive(Debug)]
pub struct Statements {
    pub(crate) sql: LayoutSql,
    pub(crate) claim: WithPaused,
    pub(crate) due: WithPaused,
    mark: MarkMode,
}

impl Statements {
    pub(crate) fn new(sql: LayoutSql, options: StoreOptions) -> Self {
        let table = &sql.table;
        let due_head = "o.published_at IS NULL AND o.dead_at IS NULL
                AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= UTC_TIMESTAMP(6))";
        let key_order = sql.key_order_filter(options.ordering, options.after_dead);
        let claim = WithPaused::new(
            format!(
                "SELECT {columns}
                   FROM {table} AS o
                  WHERE {due_head}",
                columns = sql.claimed_columns("o"),
            ),
            sql.tenant_expr("o"),
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
            sql.tenant_expr("o"),
            format!("{key_order}) AS SIGNED)"),
        );
        Self {
            claim,
            due,
            mark: options.mark,
            sql,
        }
    }

    /// Marks `n` rows sent, by id.
    pub fn mark(&self, n: usize) -> String {
        let ids: Vec<&str> = std::iter::once("SELECT ? AS id")
            .chain(std::iter::repeat_n("SELECT ?", n.saturating_sub(1)))
            .collect();
        let rows = by_id(&self.sql, &ids.join(" UNION ALL "));
        match self.mark {
            MarkMode::Delete => format!("DELETE o FROM {rows}"),
            MarkMode::PublishedAt => {
                format!("UPDATE {rows} SET o.published_at = UTC_TIMESTAMP(6)")
            }
        }
    }

    /// Reschedules or dead-letters `n` rows; each binds id, error, delay in ms, dead (0/1),
    /// counted (0/1).
    pub fn reschedule(&self, n: usize) -> String {
        let rows: Vec<&str> =
            std::iter::once("SELECT ? AS id, ? AS error, ? AS delay_ms, ? AS dead, ? AS counted")
                .chain(std::iter::repeat_n(
                    "SELECT ?, ?, ?, ?, ?",
                    n.saturating_sub(1),
                ))
                .collect();
        format!(
            "UPDATE {rows}
                SET o.attempts = o.attempts + f.counted,
                    o.last_error = f.error,
                    o.next_attempt_at = CASE WHEN f.dead = 1 THEN NULL
                        ELSE UTC_TIMESTAMP(6) + INTERVAL f.delay_ms * 1000 MICROSECOND END,
                    o.dead_at = CASE WHEN f.dead = 1 THEN UTC_TIMESTAMP(6) END",
            rows = by_id(&self.sql, &rows.join(" UNION ALL ")),
        )
    }
}

/// The rows of `values` (a `SELECT … AS id, …` per row) joined to the table by id, the values
/// first (`STRAIGHT_JOIN`): each row is found through the id's unique index. Left to itself
/// the optimizer scans a small table instead, and a scanning `DELETE` waits on every row
/// another relay's open claim has locked.
fn by_id(sql: &LayoutSql, values: &str) -> String {
    format!(
        "({values}) AS f STRAIGHT_JOIN {table} AS o ON o.{id} = f.id",
        table = sql.table,
        id = sql.id,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Ordering;
    use crate::store::test_layouts::{sluice_layout as layout, squash};

    #[test]
    fn the_claim_locks_skipping_and_filters_paused_tenants_by_placeholder() {
        let s = Statements::new(
            LayoutSql::new(layout(), Dialect::Mysql),
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
        let s = Statements::new(LayoutSql::new(layout(), Dialect::Mysql), options);
        let claim = squash(&s.claim.sql(0));
        assert!(
            claim.contains("AND p.`tenant` <=> o.`tenant` AND p.`id` < o.`id`"),
            "{claim}"
        );
    }

    #[test]
    fn marking_and_rescheduling_bind_one_placeholder_per_value() {
        let options = StoreOptions {
            mark: MarkMode::PublishedAt,
            ..StoreOptions::default()
        };
        let s = Statements::new(LayoutSql::new(layout(), Dialect::Mysql), options);
        assert_eq!(
            s.mark(3),
            "UPDATE (SELECT ? AS id UNION ALL SELECT ? UNION ALL SELECT ?) AS f \
             STRAIGHT_JOIN `outbox` AS o ON o.`id` = f.id SET o.published_at = UTC_TIMESTAMP(6)"
        );
        let reschedule = squash(&s.reschedule(2));
        assert!(
            reschedule.starts_with(
                "UPDATE (SELECT ? AS id, ? AS error, ? AS delay_ms, ? AS dead, ? AS counted \
                 UNION ALL SELECT ?, ?, ?, ?, ?) AS f STRAIGHT_JOIN `outbox` AS o ON o.`id` = f.id"
            ),
            "{reschedule}"
        );
    }
}
