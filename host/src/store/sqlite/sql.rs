//! The relay's statements, built from the checked layout ([`LayoutSql`]): the claim (a lease),
//! the due probe, marking, rescheduling, releasing leases.
//!
//! Times are bound from Rust as milliseconds since the epoch, so every process on the machine
//! compares leases against the same clock. The paused tenants travel as one JSON array
//! (`json_each`), so the claim is one fixed statement.

use std::sync::Arc;

use crate::store::layout_sql::LayoutSql;
use crate::store::rows::placeholders;
use crate::store::{MarkMode, StoreOptions};

/// Which rows a marking or rescheduling statement may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Guard {
    /// Rows still leased to the batch (binds its token last): a row whose lease expired and
    /// was taken by another relay is not changed, and the count check notices.
    Lease,
    /// Rows still unsent and not dead (settling, inside the transaction that checked them).
    Unsent,
}

impl Guard {
    fn sql(self) -> &'static str {
        match self {
            Self::Lease => "AND o.leased_by = ?",
            Self::Unsent => "AND o.published_at IS NULL AND o.dead_at IS NULL",
        }
    }
}

/// The store's statements for one table and `[relay]` setting, built once at start-up.
#[derive(Debug)]
pub(super) struct Statements {
    pub sql: LayoutSql,
    /// Binds: token, lease deadline, now, paused tenants (JSON array), limit.
    pub claim: Arc<str>,
    /// Binds: now, paused tenants (JSON array).
    pub due: Arc<str>,
    mark: MarkMode,
}

impl Statements {
    pub(super) fn new(sql: LayoutSql, options: StoreOptions) -> Self {
        let table = &sql.table;
        let due = |now: &str, paused: &str| {
            format!(
                "o.published_at IS NULL AND o.dead_at IS NULL
                    AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= {now})
                    AND (o.lease_until IS NULL OR o.lease_until <= {now})
                    AND NOT EXISTS (SELECT 1 FROM json_each({paused}) AS paused
                                     WHERE {paused_tenant})
                    {key_order}",
                paused_tenant = sql
                    .dialect
                    .null_safe_eq("paused.value", &sql.tenant_expr("o")),
                key_order = sql.key_order_filter(options.ordering, options.after_dead),
            )
        };
        let claim = format!(
            "UPDATE {table} SET leased_by = ?1, lease_until = ?2
              WHERE {id} IN (SELECT o.{id} FROM {table} AS o
                              WHERE {due}
                              ORDER BY {order_by}
                              LIMIT ?5)
             RETURNING {columns}, CAST({order} AS INTEGER) AS claim_order",
            id = sql.id,
            due = due("?3", "?4"),
            order_by = sql.order_by("o"),
            columns = sql.claimed_columns(""),
            order = sql.order,
        );
        Self {
            due: format!(
                "SELECT EXISTS (SELECT 1 FROM {table} AS o WHERE {})",
                due("?1", "?2")
            )
            .into(),
            claim: claim.into(),
            mark: options.mark,
            sql,
        }
    }

    /// Whether marking sets `published_at` (and so binds the time first).
    pub(super) fn marks_with_time(&self) -> bool {
        self.mark == MarkMode::PublishedAt
    }

    /// Marks `n` rows sent, by id. Binds: (`published_at` mode: now,) the ids, (the token).
    pub(super) fn mark(&self, n: usize, guard: Guard) -> String {
        let l = &self.sql.layout;
        let rows = format!("o.{} IN ({}) {}", l.id, placeholders(n), guard.sql());
        match self.mark {
            MarkMode::Delete => format!("DELETE FROM {} AS o WHERE {rows}", l.table),
            MarkMode::PublishedAt => format!(
                "UPDATE {} AS o SET published_at = ?, leased_by = NULL, lease_until = NULL
                  WHERE {rows}",
                l.table
            ),
        }
    }

    /// Reschedules or dead-letters `n` rows and ends their leases. Binds: per row id, error,
    /// delay in ms, dead (0/1), counted (0/1); then now, now, (the token).
    pub(super) fn reschedule(&self, n: usize, guard: Guard) -> String {
        let l = &self.sql.layout;
        let rows = vec!["(?, ?, ?, ?, ?)"; n].join(", ");
        format!(
            "WITH f(id, error, delay_ms, dead, counted) AS (VALUES {rows})
             UPDATE {table} AS o
                SET attempts = o.attempts + f.counted,
                    last_error = f.error,
                    next_attempt_at = CASE WHEN f.dead THEN NULL ELSE ? + f.delay_ms END,
                    dead_at = CASE WHEN f.dead THEN ? END,
                    leased_by = NULL, lease_until = NULL
               FROM f
              WHERE o.{id} = f.id {guard}",
            table = l.table,
            id = l.id,
            guard = guard.sql(),
        )
    }

    /// Ends the leases of `n` rows of a batch, unchanged otherwise. Binds: the ids, the token.
    pub(super) fn release(&self, n: usize) -> String {
        let l = &self.sql.layout;
        format!(
            "UPDATE {} AS o SET leased_by = NULL, lease_until = NULL
              WHERE o.{} IN ({}) AND o.leased_by = ?",
            l.table,
            l.id,
            placeholders(n)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Ordering;
    use crate::store::dialect::Dialect;
    use crate::store::test_layouts::{sluice_layout, squash};

    fn statements(options: StoreOptions) -> Statements {
        Statements::new(LayoutSql::new(sluice_layout(), Dialect::Sqlite), options)
    }

    #[test]
    fn the_claim_leases_unleased_or_expired_rows_in_order() {
        let s = statements(StoreOptions {
            ordering: Ordering::Key,
            ..StoreOptions::default()
        });
        let claim = squash(&s.claim);
        assert!(
            claim.starts_with("UPDATE \"outbox\" SET leased_by = ?1, lease_until = ?2"),
            "{claim}"
        );
        assert!(
            claim.contains("AND (o.lease_until IS NULL OR o.lease_until <= ?3)"),
            "{claim}"
        );
        assert!(
            claim.contains("NOT EXISTS (SELECT 1 FROM json_each(?4) AS paused"),
            "{claim}"
        );
        assert!(
            claim.contains("AND p.\"tenant\" IS o.\"tenant\""),
            "{claim}"
        );
        assert!(claim.contains("ORDER BY o.\"id\" LIMIT ?5)"), "{claim}");
    }

    #[test]
    fn marking_touches_only_rows_the_batch_still_leases() {
        let s = statements(StoreOptions::default());
        assert_eq!(
            s.mark(2, Guard::Lease),
            "DELETE FROM \"outbox\" AS o WHERE o.\"id\" IN (?, ?) AND o.leased_by = ?"
        );
        let reschedule = squash(&s.reschedule(2, Guard::Unsent));
        assert!(
            reschedule.starts_with(
                "WITH f(id, error, delay_ms, dead, counted) AS (VALUES (?, ?, ?, ?, ?), (?, ?, ?, ?, ?))"
            ),
            "{reschedule}"
        );
        assert!(
            reschedule.ends_with("AND o.published_at IS NULL AND o.dead_at IS NULL"),
            "{reschedule}"
        );
    }
}
