//! The relay's statements, built from the checked layout ([`LayoutSql`]): the claim, the due
//! probe, marking, rescheduling, and the claimed batch that runs the last two ([`PgBatch`]).
//! Ids travel as one `text[]` parameter, cast to the id column's type ([`key_array`]); the
//! failures as arrays.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::{AssertSqlSafe, PgConnection, Postgres};

use super::fair::{FairClaim, FairSql};
use super::paused::unpaused;
use super::schema::{KeyKind, TimeKind};
use crate::model::OutboxId;
use crate::store::batch::{RecordRows, TxBatch};
use crate::store::layout_sql::LayoutSql;
use crate::store::rows::{Reschedule, stored_error};
use crate::store::{MarkMode, RowFailure, StoreOptions};

/// `param` (a `text[]` of ids) cast to an array of the id column's type, so the primary key's
/// index serves `= ANY(…)`.
pub(super) fn key_array(sql: &LayoutSql, param: &str) -> String {
    format!("{param}::text[]::{}[]", sql.key_cast())
}

/// The store's statements for one table and `[relay]` setting, built once at start-up.
pub(super) struct Statements {
    pub claim: Arc<str>,
    /// The claim past a given id (`$3`), when rows are claimed in integer id order (see
    /// [`super::cursor`]).
    pub claim_after: Option<Arc<str>>,
    pub due: Arc<str>,
    /// `relay.fair_share`: the heads statements, and the claim that fills up after them.
    pub fair: Option<FairClaim>,
    /// Marking and rescheduling, which every claimed batch holds.
    pub batch: Arc<BatchSql>,
}

impl Statements {
    pub(super) fn new(sql: &LayoutSql, options: StoreOptions) -> Self {
        let layout = &sql.layout;
        let table = &sql.table;
        // Unsent, not dead, due, not of a paused tenant, and — in key order — not behind an
        // earlier unsent row of its key.
        let key_order = sql.key_order_filter(options.ordering, options.after_dead);
        let due = format!(
            "{due} AND {unpaused} {key_order}",
            due = LayoutSql::due("now()"),
            unpaused = unpaused(&sql.tenant_expr("o")),
        );
        let claim = |after: &str| {
            format!(
                "SELECT {columns}
               FROM {table} AS o
              WHERE {due} {after}
              ORDER BY {order_by}
              LIMIT $2
                FOR UPDATE OF o SKIP LOCKED",
                columns = sql.claimed_columns("o"),
                order_by = sql.order_by("o"),
            )
        };
        let by_int_id = layout.ordered_by_id() && matches!(layout.key, KeyKind::Int);
        let claim_after = by_int_id.then(|| claim(&format!("AND o.{} > $3", sql.id)).into());
        // The fill takes no head again: a transaction's own row locks do not make SKIP
        // LOCKED skip a row. `$3`: the heads' ids; `$4`: where the cursor starts.
        let fair = options.fair_share.and_then(|share| {
            let not_heads = format!("AND o.{} <> ALL({})", sql.id, key_array(sql, "$3"));
            Some(FairClaim {
                share: share.get(),
                heads: FairSql::new(sql, &key_order)?,
                fill: claim(&not_heads).into(),
                fill_after: by_int_id
                    .then(|| claim(&format!("{not_heads} AND o.{} > $4", sql.id)).into()),
            })
        });
        let keys = key_array(sql, "$1");
        let mark = match options.mark {
            MarkMode::Delete => format!("DELETE FROM {table} WHERE {} = ANY({keys})", sql.id),
            MarkMode::PublishedAt => format!(
                "UPDATE {table} SET published_at = now(){} WHERE {} = ANY({keys})",
                sql.replay_cleared(""),
                sql.id
            ),
        };
        let reschedule = format!(
            "UPDATE {table} AS o
                SET {RESCHEDULE_SET}
               FROM unnest($1::text[], $2::text[], $3::int8[], $4::bool[], $5::bool[])
                    AS f(id, error, delay_ms, dead, counted)
              WHERE o.{id} = f.id::{cast}",
            id = sql.id,
            cast = sql.key_cast(),
        );
        let keyed = layout
            .keyed_with_created_at
            .then(|| keyed_statements(sql, options.mark));
        Self {
            due: format!("SELECT EXISTS (SELECT 1 FROM {table} AS o WHERE {due})").into(),
            claim: claim("").into(),
            claim_after,
            fair,
            batch: Arc::new(BatchSql {
                mark: mark.into(),
                reschedule: reschedule.into(),
                keyed,
            }),
        }
    }
}

/// What a reschedule sets, from the failures' arrays (`f`).
const RESCHEDULE_SET: &str = "attempts = o.attempts + f.counted::int,
                    last_error = f.error,
                    next_attempt_at = CASE WHEN f.dead THEN NULL
                                      ELSE now() + f.delay_ms * interval '1 millisecond' END,
                    dead_at = CASE WHEN f.dead THEN now() END";

/// Marking and rescheduling where the id is unique only with `created_at` (a partitioned
/// table's primary key): each id travels with the `created_at` it was claimed with (`$2`
/// when marking, `$6` when rescheduling), so a row of another partition that happens to have
/// the same id is never touched (marking it too would fail the row-count check, roll the batch
/// back and claim it again, for ever), and each id's lookup is pruned to its own partition at
/// run time (by id alone it probes every partition's index). The time is compared with the
/// column as stored: a `timestamp` without time zone holds UTC.
fn keyed_statements(sql: &LayoutSql, mark: MarkMode) -> KeyedSql {
    let layout = &sql.layout;
    let created = &sql.created_at;
    let at = |alias: &str| match layout.created_at_kind {
        TimeKind::WithZone => format!("{alias}.at"),
        TimeKind::WithoutZone => format!("({alias}.at AT TIME ZONE 'UTC')"),
    };
    let (table, id, cast) = (&sql.table, &sql.id, sql.key_cast());
    let keys = format!(
        "unnest({}, $2::timestamptz[]) AS k(id, at)",
        key_array(sql, "$1")
    );
    let matched = format!("o.{id} = k.id AND o.{created} = {}", at("k"));
    let mark = match mark {
        MarkMode::Delete => format!("DELETE FROM {table} AS o USING {keys} WHERE {matched}"),
        MarkMode::PublishedAt => {
            // Like the plain mark, a row sent again by a replay loses its marker.
            format!(
                "UPDATE {table} AS o SET published_at = now(){} FROM {keys} WHERE {matched}",
                sql.replay_cleared("")
            )
        }
    };
    let reschedule = format!(
        "UPDATE {table} AS o
            SET {RESCHEDULE_SET}
           FROM unnest($1::text[], $2::text[], $3::int8[], $4::bool[], $5::bool[],
                       $6::timestamptz[])
                AS f(id, error, delay_ms, dead, counted, at)
          WHERE o.{id} = f.id::{cast} AND o.{created} = {}",
        at("f"),
    );
    KeyedSql {
        mark: mark.into(),
        reschedule: reschedule.into(),
    }
}

/// Marking and rescheduling by id and `created_at` ([`keyed_statements`]).
pub(super) struct KeyedSql {
    mark: Arc<str>,
    reschedule: Arc<str>,
}

/// A claimed batch: the open transaction holding the row locks.
pub(crate) type PgBatch = TxBatch<Postgres, PgRows>;

/// The batch's marking and rescheduling statements (see [`Statements`]).
pub(super) struct BatchSql {
    /// By id alone.
    pub(super) mark: Arc<str>,
    pub(super) reschedule: Arc<str>,
    /// Where the id is unique only with `created_at`: marking and rescheduling by both
    /// ([`keyed_statements`]), used whenever the batch knows every id's time.
    keyed: Option<KeyedSql>,
}

/// One batch's rows as its statements record them: the statements, and — where the id is
/// unique only with `created_at` — the time each claimed id was claimed with.
pub struct PgRows {
    pub(super) sql: Arc<BatchSql>,
    /// Empty for tables keyed by id alone, and when settling after a failed commit (the
    /// claim's times are gone: such a table is then settled by id alone, among the rows still
    /// pending and not locked by another relay).
    pub(super) created: HashMap<OutboxId, DateTime<Utc>>,
}

impl PgRows {
    /// The keyed statements and the batch's ids' `created_at`, in the order of `ids`, when
    /// the table is keyed with `created_at` and the batch knows every id's time.
    fn keyed<'a>(
        &self,
        ids: impl Iterator<Item = &'a OutboxId>,
    ) -> Option<(&KeyedSql, Vec<DateTime<Utc>>)> {
        let keyed = self.sql.keyed.as_ref()?;
        let times = ids
            .map(|id| self.created.get(id).copied())
            .collect::<Option<Vec<_>>>()?;
        Some((keyed, times))
    }
}

impl RecordRows<Postgres> for PgRows {
    fn mark<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        ids: &'c [OutboxId],
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        let keyed = self.keyed(ids.iter());
        Box::pin(async move {
            let sql = keyed.as_ref().map_or(&self.sql.mark, |(k, _)| &k.mark);
            let mut query = sqlx::query(AssertSqlSafe(Arc::clone(sql)))
                .bind(ids.iter().map(OutboxId::to_string).collect::<Vec<_>>());
            if let Some((_, times)) = keyed {
                query = query.bind(times);
            }
            Ok(query.execute(conn).await?.rows_affected())
        })
    }

    fn reschedule<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        failed: &'c [RowFailure],
        fixed: Option<&'static str>,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        // The arrays the statement's `unnest` takes.
        let (mut ids, mut errors, mut delays, mut dead, mut counted) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for f in failed {
            let r = Reschedule::from(f.disposition);
            ids.push(f.id.to_string());
            errors.push(stored_error(f, fixed));
            delays.push(r.delay_ms);
            dead.push(r.dead);
            counted.push(r.counted);
        }
        let keyed = self.keyed(failed.iter().map(|f| &f.id));
        Box::pin(async move {
            let sql = keyed
                .as_ref()
                .map_or(&self.sql.reschedule, |(k, _)| &k.reschedule);
            let mut query = sqlx::query(AssertSqlSafe(Arc::clone(sql)))
                .bind(ids)
                .bind(errors)
                .bind(delays)
                .bind(dead)
                .bind(counted);
            if let Some((_, times)) = keyed {
                query = query.bind(times);
            }
            Ok(query.execute(conn).await?.rows_affected())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::dialect::Driver;
    use crate::store::schema::Layout;
    use crate::store::test_layouts::{debezium_layout, sluice_layout, squash};
    use crate::store::{AfterDead, Ordering};

    fn statements(layout: Layout, options: StoreOptions) -> Statements {
        Statements::new(&LayoutSql::new(layout, Driver::Postgres), options)
    }

    fn key_order_filter(layout: Layout, ordering: Ordering, after_dead: AfterDead) -> String {
        LayoutSql::new(layout, Driver::Postgres).key_order_filter(ordering, after_dead)
    }

    #[test]
    fn uuid_keys_are_cast_back_to_uuid_when_marking_and_rescheduling() {
        let s = statements(debezium_layout(), StoreOptions::default());
        assert_eq!(
            squash(&s.batch.mark),
            "DELETE FROM \"outboxevent\" WHERE \"id\" = ANY($1::text[]::uuid[])"
        );
        assert!(
            squash(&s.batch.reschedule).ends_with("WHERE o.\"id\" = f.id::uuid"),
            "{}",
            s.batch.reschedule
        );
        let claim = squash(&s.claim);
        assert!(claim.starts_with("SELECT o.\"id\"::text AS id, NULL::text AS tenant, o.\"aggregatetype\"::text AS aggregate_type"), "{claim}");
        assert!(
            claim.contains("ORDER BY o.\"sluice_seq\", o.\"id\" LIMIT $2"),
            "{claim}"
        );
        assert!(
            claim.contains("AND CASE WHEN NULL::text IS NULL THEN array_position($1::text[], NULL) IS NULL ELSE NULL::text <> ALL(array_remove($1::text[], NULL)) END"),
            "{claim}"
        );
    }

    /// The claimed rows are decoded by position: the claims list their columns in the order
    /// `rows::column` names them, for every layout and with or without the cursor.
    #[test]
    fn claims_list_their_columns_in_the_order_rows_are_decoded_in() {
        for layout in [debezium_layout(), sluice_layout()] {
            let s = statements(layout, StoreOptions::default());
            for claim in std::iter::once(&s.claim).chain(s.claim_after.as_ref()) {
                let select = squash(claim);
                let list = select
                    .strip_prefix("SELECT ")
                    .and_then(|rest| rest.split(" FROM ").next())
                    .expect("a SELECT list");
                // Items are split at top-level commas only (COALESCE(…, …) is one item).
                let mut items = vec![String::new()];
                let mut depth = 0i32;
                for c in list.chars() {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        ',' if depth == 0 => {
                            items.push(String::new());
                            continue;
                        }
                        _ => {}
                    }
                    items.last_mut().expect("one item at least").push(c);
                }
                let aliases: Vec<&str> = items
                    .iter()
                    .map(|item| item.trim().rsplit([' ', '.']).next().unwrap_or(item))
                    .collect();
                // Every alias at the position its constant names, and no other column.
                use crate::store::rows::column::*;
                let expected = [
                    (ID, "id"),
                    (TENANT, "tenant"),
                    (AGGREGATE_TYPE, "aggregate_type"),
                    (AGGREGATE_ID, "aggregate_id"),
                    (EVENT_TYPE, "event_type"),
                    (PAYLOAD, "payload"),
                    (HEADERS, "headers"),
                    (CREATED_AT, "created_at"),
                    (ATTEMPTS, "attempts"),
                    (TRACE_CONTEXT, "trace_context"),
                    (REPLAY, "replay_id"),
                ];
                assert_eq!(aliases.len(), expected.len(), "{select}");
                for (index, alias) in expected {
                    assert_eq!(aliases.get(index), Some(&alias), "{select}");
                }
            }
        }
    }

    #[test]
    fn integer_keys_keep_the_primary_key_usable() {
        let options = StoreOptions {
            mark: MarkMode::PublishedAt,
            ..StoreOptions::default()
        };
        let s = statements(sluice_layout(), options);
        assert_eq!(
            squash(&s.batch.mark),
            "UPDATE \"outbox\" SET published_at = now(), \"replay_id\" = NULL WHERE \"id\" = ANY($1::text[]::int8[])"
        );
        let claim = squash(&s.claim);
        assert!(
            claim.starts_with("SELECT o.\"id\"::int8 AS id, o.\"tenant\"::text AS tenant"),
            "{claim}"
        );
        assert!(claim.contains("ORDER BY o.\"id\" LIMIT $2"), "{claim}");
    }

    #[test]
    fn key_order_with_uuid_ids_compares_the_order_column_then_the_id() {
        let filter = squash(&key_order_filter(
            debezium_layout(),
            Ordering::Key,
            AfterDead::Skip,
        ));
        assert!(filter.contains("p.\"aggregatetype\" = o.\"aggregatetype\" AND p.\"aggregateid\" = o.\"aggregateid\""), "{filter}");
        assert!(
            filter.contains("AND (p.\"sluice_seq\", p.\"id\") < (o.\"sluice_seq\", o.\"id\")"),
            "{filter}"
        );
        // No tenant column: the key is (aggregate type, aggregate id) alone.
        assert!(!filter.contains("DISTINCT"), "{filter}");
        let with_tenant = squash(&key_order_filter(
            sluice_layout(),
            Ordering::Key,
            AfterDead::Block,
        ));
        assert!(
            with_tenant.contains(
                "AND p.\"tenant\" IS NOT DISTINCT FROM o.\"tenant\" AND p.\"id\" < o.\"id\""
            ),
            "{with_tenant}"
        );
        assert!(!with_tenant.contains("dead_at"), "{with_tenant}");
    }
}
