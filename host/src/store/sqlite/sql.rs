//! The relay's statements, built from the checked layout ([`LayoutSql`]): the claim (a lease),
//! the due probe, marking, rescheduling, releasing leases.
//!
//! Times are bound from Rust as milliseconds since the epoch, so every process on the machine
//! compares leases against the same clock. The paused tenants travel as one JSON array
//! (`json_each`), so the claim is one fixed statement.

use std::sync::Arc;

use crate::model::OutboxId;
use crate::store::dialect::Driver;
use crate::store::fair::FairWalk;
use crate::store::layout_sql::LayoutSql;
use crate::store::rows::bind_failure;
use crate::store::statement::{Param, Statement};
use crate::store::{MarkMode, RowFailure, StoreOptions};

/// Which rows a marking or rescheduling statement may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Guard<'a> {
    /// Rows still leased to the batch (its token): a row whose lease expired and was taken by
    /// another relay is not changed, and the count check notices.
    Lease(&'a str),
    /// Rows still unsent and not dead (settling, inside the transaction that checked them).
    Unsent,
}

impl Guard<'_> {
    /// The condition, its token bound in `statement`.
    fn sql(self, statement: &mut Statement) -> String {
        match self {
            Self::Lease(token) => format!(
                "AND o.leased_by = {}",
                statement.param(Param::Text(token.to_owned()))
            ),
            Self::Unsent => format!("AND {}", LayoutSql::PENDING),
        }
    }
}

/// The store's statements for one table and `[relay]` setting, built once at start-up.
#[derive(Debug)]
pub(super) struct Statements {
    pub sql: LayoutSql,
    /// Binds: token, lease deadline, now, paused tenants (JSON array), limit.
    pub claim: Arc<str>,
    /// The claim of given rows (`relay.fair_share`'s heads): binds as the claim, then the ids
    /// (JSON array).
    pub claim_heads: Arc<str>,
    /// `relay.fair_share`'s walk (`None` without it or without a tenant column).
    pub fair: Option<FairWalk>,
    /// Binds: now, paused tenants (JSON array).
    pub due: Arc<str>,
    mark: MarkMode,
}

impl Statements {
    pub(super) fn new(sql: LayoutSql, options: StoreOptions) -> Self {
        let table = &sql.table;
        // Not leased, or the lease expired; and in key order.
        let key_order = sql.key_order_filter(options.ordering, options.after_dead);
        let free = |now: &str| {
            format!("AND (o.lease_until IS NULL OR o.lease_until <= {now}) {key_order}")
        };
        let due = |now: &str, paused: &str| {
            format!(
                "{due}
                    AND NOT EXISTS (SELECT 1 FROM json_each({paused}) AS paused
                                     WHERE {paused_tenant})
                    {free}",
                due = LayoutSql::due(now),
                paused_tenant = sql
                    .dialect
                    .null_safe_eq("paused.value", &sql.tenant_expr("o")),
                free = free(now),
            )
        };
        let claim = |only: &str| {
            format!(
                "UPDATE {table} SET leased_by = ?1, lease_until = ?2
                  WHERE {id} IN (SELECT o.{id} FROM {table} AS o
                                  WHERE {due} {only}
                                  ORDER BY {order_by}
                                  LIMIT ?5)
                 RETURNING {columns}, CAST({order} AS INTEGER) AS claim_order",
                id = sql.id,
                due = due("?3", "?4"),
                order_by = sql.order_by("o"),
                columns = sql.claimed_columns(""),
                order = sql.order,
            )
        };
        let fair = options
            .fair_share
            .and_then(|share| FairWalk::new(&sql, share.get(), &free(FairWalk::NOW)));
        Self {
            due: format!(
                "SELECT EXISTS (SELECT 1 FROM {table} AS o WHERE {})",
                due("?1", "?2")
            )
            .into(),
            claim: claim("").into(),
            claim_heads: claim(&format!(
                "AND o.{} IN (SELECT value FROM json_each(?6))",
                sql.id
            ))
            .into(),
            fair,
            mark: options.mark,
            sql,
        }
    }

    /// Marks `ids` sent at `now` (milliseconds since the epoch), ending their leases.
    pub(super) fn mark(&self, ids: &[OutboxId], now: i64, guard: Guard<'_>) -> Statement {
        let mut statement = Statement::new(Driver::Sqlite);
        let table = &self.sql.table;
        let ids = self.sql.bind_ids(&mut statement, ids);
        let rows = format!("o.{} IN ({ids}) {}", self.sql.id, guard.sql(&mut statement));
        let text = match self.mark {
            MarkMode::Delete => format!("DELETE FROM {table} AS o WHERE {rows}"),
            MarkMode::PublishedAt => format!(
                "UPDATE {table} AS o SET published_at = {now}{replay}, leased_by = NULL,
                        lease_until = NULL
                  WHERE {rows}",
                now = statement.param(Param::Int(now)),
                replay = self.sql.replay_cleared(""),
            ),
        };
        statement.with_sql(text)
    }

    /// Reschedules or dead-letters `failed` at `now`, recording each row's error or `fixed`,
    /// and ends their leases.
    pub(super) fn reschedule(
        &self,
        failed: &[RowFailure],
        now: i64,
        guard: Guard<'_>,
        fixed: Option<&str>,
    ) -> Statement {
        let mut statement = Statement::new(Driver::Sqlite);
        let rows: Vec<String> = failed
            .iter()
            .map(|f| {
                format!(
                    "({})",
                    bind_failure(&self.sql, &mut statement, f, fixed).join(", ")
                )
            })
            .collect();
        let text = format!(
            "WITH f(id, error, delay_ms, dead, counted) AS (VALUES {rows})
             UPDATE {table} AS o
                SET attempts = o.attempts + f.counted,
                    last_error = f.error,
                    next_attempt_at = CASE WHEN f.dead THEN NULL ELSE {now} + f.delay_ms END,
                    dead_at = CASE WHEN f.dead THEN {now} END,
                    leased_by = NULL, lease_until = NULL
               FROM f
              WHERE o.{id} = f.id {guard}",
            rows = rows.join(", "),
            now = statement.param(Param::Int(now)),
            table = self.sql.table,
            id = self.sql.id,
            guard = guard.sql(&mut statement),
        );
        statement.with_sql(text)
    }

    /// Ends the leases `token` holds on `ids`, the rows unchanged otherwise.
    pub(super) fn release<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a OutboxId>,
        token: &str,
    ) -> Statement {
        let mut statement = Statement::new(Driver::Sqlite);
        let text = format!(
            "UPDATE {table} AS o SET leased_by = NULL, lease_until = NULL
              WHERE o.{id} IN ({ids}) {guard}",
            table = self.sql.table,
            id = self.sql.id,
            ids = self.sql.bind_ids(&mut statement, ids),
            guard = Guard::Lease(token).sql(&mut statement),
        );
        statement.with_sql(text)
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Ordering;
    use crate::store::test_layouts::{sluice_layout, squash};

    fn statements(options: StoreOptions) -> Statements {
        Statements::new(LayoutSql::new(sluice_layout(), Driver::Sqlite), options)
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
        let ids = [OutboxId::Int(1), OutboxId::Int(2)];
        let mark = s.mark(&ids, 7, Guard::Lease("t:1"));
        assert_eq!(
            mark.sql,
            "DELETE FROM \"outbox\" AS o WHERE o.\"id\" IN (?1, ?2) AND o.leased_by = ?3"
        );
        assert_eq!(
            mark.params,
            [Param::Int(1), Param::Int(2), Param::Text("t:1".into())]
        );
        let failed: Vec<RowFailure> = ids
            .iter()
            .map(|id| RowFailure {
                id: id.clone(),
                error: "boom".into(),
                disposition: crate::store::Disposition::Dead,
            })
            .collect();
        let reschedule = s.reschedule(&failed, 7, Guard::Unsent, None);
        assert_eq!(reschedule.params.len(), 11, "five a row, then now");
        let reschedule = squash(&reschedule.sql);
        assert!(
            reschedule.starts_with(
                "WITH f(id, error, delay_ms, dead, counted) AS (VALUES (?1, ?2, ?3, ?4, ?5), (?6, ?7, ?8, ?9, ?10))"
            ),
            "{reschedule}"
        );
        assert!(reschedule.contains("ELSE ?11 + f.delay_ms"), "{reschedule}");
        assert!(
            reschedule.ends_with("AND o.published_at IS NULL AND o.dead_at IS NULL"),
            "{reschedule}"
        );
    }
}
