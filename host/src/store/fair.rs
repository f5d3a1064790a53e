//! `relay.fair_share`: a batch first takes the oldest due rows of each tenant with rows
//! waiting, up to the share each, and only then fills up in claim order.
//!
//! A claim in claim order alone is first-in-first-out across tenants: one tenant's backlog of
//! a million rows (a migration, a bulk import) delays every other tenant's rows behind it until
//! it has drained. A walk visits the tenants that have unsent rows in the order of the tenant
//! column — a loose scan of the tenant index `sluice migrate --config` creates when the config
//! sets `fair_share`: one index probe per tenant, however many rows each has — and takes the
//! first `share` due rows of each. When more tenants wait than a batch has room for, the next
//! walk starts after the last tenant this one visited ([`TenantTurn`]), so every tenant gets
//! its turn. Rows without a tenant take theirs when a walk reaches the last tenant. A tenant
//! of which the previous fill took a whole share or more — the one with the backlog at the
//! front of the claim order — is passed over: the fill serves it.
//!
//! Order is kept: a tenant's heads are its first due rows in claim order, the same filters
//! (paused tenants, key order) apply as in the claim, and the fill takes only rows that are
//! not heads.
//!
//! PostgreSQL walks, takes and locks the heads in one statement (a recursive walk joined
//! `LATERAL` to each tenant's heads, see `postgres::fair`). MariaDB has no `LATERAL` and does
//! not turn a recursive walk's correlated probe into an index range (every probe read the
//! index from its start: 12 million entries for a walk of 50 tenants past 300,000 rows), and
//! SQLite has no row locks; there [`pick_heads`] walks in two plain reads in the claim's
//! transaction — the tenants ([`FairWalk::walk`]), then their heads ([`FairWalk::heads`]) —
//! and the driver locks (MySQL: `FOR UPDATE SKIP LOCKED`) or leases (SQLite) the rows it
//! picked. A head another relay locked in between is skipped, as in the claim.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

use super::StoreError;
use super::dialect::{Cast, Driver};
use super::layout_sql::LayoutSql;
use super::rows::{read_id, unreadable_key};
use super::schema::Layout;
use super::statement::{Execute, Param, ReadRow, Statement, padded};
use crate::model::OutboxId;

/// Refuses a table the walk cannot serve: one without a tenant column, or (`indexed` false)
/// without an index led by it — without one, every probe of the walk reads the whole table.
/// `create` is the statement that makes the index.
pub(super) fn check_tenant_index(
    layout: &Layout,
    indexed: bool,
    create: impl FnOnce() -> String,
) -> Result<(), StoreError> {
    let refuse = |message: String| StoreError::FairShare {
        table: layout.table.to_string(),
        message,
    };
    let Some(tenant) = &layout.tenant else {
        return Err(refuse(
            "has no tenant column, and shares are per tenant (name it in \
             database.columns.tenant, or remove relay.fair_share)"
                .to_owned(),
        ));
    };
    if indexed {
        return Ok(());
    }
    Err(refuse(format!(
        "has no index led by its tenant column {tenant}, so each batch would read the whole \
         table to find the tenants with rows waiting; run `sluice migrate --config` with this \
         config, or: {}",
        create()
    )))
}

/// Where the next walk over the tenants starts, and which tenants the fill serves (shared by
/// the process's workers).
#[derive(Debug, Default)]
pub(super) struct TenantTurn {
    /// After the last tenant a walk that was cut short visited; `None`: at the first.
    after: Mutex<Option<String>>,
    /// The tenants (`None`: rows without one) of which the last fill took a whole share or
    /// more: those at the front of the claim order, as a tenant with a backlog is. The next
    /// walk passes them over: the fill serves them anyway, and taking their heads would read
    /// past every row the batches in flight hold locked (measured on PostgreSQL: 3 ms instead
    /// of 0.1 ms a walk with 2,000 rows locked ahead; a third of a drain's rate).
    served: Mutex<Vec<Option<String>>>,
}

impl TenantTurn {
    /// The tenant the next walk starts after (`None`: from the first).
    pub(super) fn start(&self) -> Option<String> {
        self.lock().clone()
    }

    /// A walk ended: if it was `cut` short (at its limit of rows or tenants before the last
    /// tenant) the next one goes on after `last`, the last tenant it visited; if it reached the
    /// last tenant with rows, the next one starts from the first again.
    pub(super) fn walked(&self, cut: bool, last: Option<String>) {
        *self.lock() = if cut { last } else { None };
    }

    /// The tenants the last fill served (see [`TenantTurn::served`]).
    pub(super) fn served(&self) -> Vec<Option<String>> {
        self.served
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A fill claimed rows of `tenants` (one item per row; none when the heads left no room):
    /// the tenants of which it took `share` rows or more are passed over by the next walk. A
    /// batch without a fill clears them, so a tenant is never left to a fill that does not run.
    pub(super) fn filled(&self, tenants: impl IntoIterator<Item = Option<String>>, share: usize) {
        let mut counts: HashMap<Option<String>, usize> = HashMap::new();
        for tenant in tenants {
            *counts.entry(tenant).or_default() += 1;
        }
        let served = counts
            .into_iter()
            .filter(|(_, n)| *n >= share)
            .map(|(tenant, _)| tenant)
            .collect();
        *self.served.lock().unwrap_or_else(PoisonError::into_inner) = served;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.after.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The walk's statements on MySQL/MariaDB and SQLite (see the module documentation).
#[derive(Debug)]
pub(crate) struct FairWalk {
    /// The most rows of one tenant a walk takes.
    pub share: usize,
    dialect: Driver,
    table: String,
    tenant: String,
    id: String,
    /// The claim's conditions on a due row `o` but the paused tenants (which the walk leaves
    /// out by name), with [`FairWalk::NOW`] for the time.
    due: String,
    order: String,
    order_by: String,
    id_cast: Cast,
}

/// What a walk found: the heads it picked in walk order, and where the next one starts.
struct Visit {
    /// One entry per head, or per visited tenant that had none to take (its rows all waiting
    /// for a retry, held back by key order, or locked by another relay).
    entries: Vec<(Option<String>, Option<OutboxId>)>,
    /// The tenant list ran out before the batch's room did: the walk reached the last tenant.
    reached_end: bool,
}

impl Visit {
    /// The heads picked (entries with a row).
    fn heads(&self) -> usize {
        self.entries.iter().filter(|(_, id)| id.is_some()).count()
    }
}

/// The tenants a walk passes over: the `paused` ones and those the last fill `served`.
pub(super) fn passed_over<'a>(
    paused: &[Option<&'a str>],
    served: &'a [Option<String>],
) -> Vec<Option<&'a str>> {
    paused
        .iter()
        .copied()
        .chain(served.iter().map(Option::as_deref))
        .collect()
}

impl FairWalk {
    /// Where the current time goes in the claim's conditions ([`Statement::now`]).
    pub(super) const NOW: &'static str = "{now}";

    /// `also`: the claim's conditions on a row `o` besides being due and not paused (key order;
    /// on SQLite, not leased), the time written as [`FairWalk::NOW`]. `None` without a tenant
    /// column.
    pub(super) fn new(sql: &LayoutSql, share: usize, also: &str) -> Option<Self> {
        let tenant = sql.tenant.as_ref()?;
        Some(Self {
            share,
            dialect: sql.dialect,
            table: sql.table.clone(),
            tenant: tenant.clone(),
            id: sql.id.clone(),
            due: format!("{} {also}", LayoutSql::due(Self::NOW)),
            order: sql
                .dialect
                .cast(&LayoutSql::column("o", &sql.order), Cast::Int),
            order_by: sql.order_by("o"),
            id_cast: sql.id_cast(),
        })
    }

    /// The next tenants with unsent rows in tenant order, at most `max`: after `after`, up to
    /// and including `until`, as text. MySQL groups by the tenant index (a loose index scan:
    /// one probe per tenant); SQLite has no loose scan for `GROUP BY` and probes each next
    /// tenant in a recursive walk (an index range, which it does use there).
    ///
    /// Only unsent rows count here, not due ones: the index has no retry time. A tenant whose
    /// rows all wait for a retry is visited and found to have no heads.
    ///
    /// MySQL also leaves the `skip`ped tenants out (`NOT IN`, which the range optimizer turns
    /// into ranges the scan jumps over): the tenant a fill serves has its oldest rows, just
    /// deleted and not yet purged, at the front of its part of the index, and a walk landing
    /// there reads through all of them (measured: a tenth of the drain rate with a 300,000-row
    /// backlog). SQLite's probes would read through every entry of a tenant left out that way;
    /// the caller drops skipped tenants from the result in any case.
    fn walk(
        &self,
        after: Option<&str>,
        until: Option<&str>,
        max: usize,
        skip: &[Option<&str>],
    ) -> Statement {
        let mut st = Statement::new(self.dialect);
        let (tenant, table) = (&self.tenant, &self.table);
        let mut bounds = String::new();
        if let Some(after) = after {
            bounds += &format!(" AND o.{tenant} > {}", st.param(Param::Text(after.into())));
        }
        let until = until.map(|until| Param::Text(until.into()));
        if let Some(until) = until.clone() {
            bounds += &format!(" AND o.{tenant} <= {}", st.param(until));
        }
        let named: Vec<&str> = skip.iter().flatten().copied().collect();
        if self.dialect == Driver::Mysql && !named.is_empty() {
            let names: Vec<String> = padded(&named)
                .map(|name| st.param(Param::Text((*name).to_owned())))
                .collect();
            bounds += &format!(" AND o.{tenant} NOT IN ({})", names.join(", "));
        }
        let pending = LayoutSql::PENDING;
        let as_text = self.dialect.cast("tenant", Cast::Text);
        let sql = match self.dialect {
            Driver::Mysql | Driver::Postgres => format!(
                "SELECT {as_text} FROM (
                   SELECT o.{tenant} AS tenant FROM {table} AS o
                    WHERE {pending} AND o.{tenant} IS NOT NULL{bounds}
                    GROUP BY o.{tenant} ORDER BY o.{tenant} LIMIT {max}) AS w",
                max = st.param(Param::Int(i64::try_from(max).unwrap_or(i64::MAX))),
            ),
            Driver::Sqlite => {
                let until = match until {
                    Some(until) => format!(" AND o.{tenant} <= {}", st.param(until)),
                    None => String::new(),
                };
                format!(
                    "WITH RECURSIVE visit(tenant, n) AS (
                       SELECT (SELECT o.{tenant} FROM {table} AS o
                                WHERE {pending} AND o.{tenant} IS NOT NULL{bounds}
                                ORDER BY o.{tenant} LIMIT 1), 1
                       UNION ALL
                       SELECT (SELECT o.{tenant} FROM {table} AS o
                                WHERE {pending} AND o.{tenant} > visit.tenant{until}
                                ORDER BY o.{tenant} LIMIT 1), n + 1
                         FROM visit
                        WHERE visit.tenant IS NOT NULL AND n < {max})
                     SELECT {as_text} FROM visit WHERE tenant IS NOT NULL",
                    max = st.param(Param::Int(i64::try_from(max).unwrap_or(i64::MAX))),
                )
            }
        };
        st.with_sql(sql)
    }

    /// The first `per_tenant` due rows of each of `tenants` (`None`: the rows without a
    /// tenant), as (tenant's place in `tenants`, claim order, id): one index range each. The
    /// list is padded to a power of two with parts that match nothing, so a connection
    /// prepares a handful of texts (see `mysql::sql::placeholder_count`).
    fn heads(&self, tenants: &[Option<String>], per_tenant: usize) -> Statement {
        let mut st = Statement::new(self.dialect);
        let limit = i64::try_from(per_tenant).unwrap_or(i64::MAX);
        let id = self.dialect.cast(&format!("o.{}", self.id), self.id_cast);
        let due = self.due.replace(Self::NOW, &st.now());
        let parts: Vec<String> = (0..tenants.len().max(1).next_power_of_two())
            .map(|part| {
                let which = match tenants.get(part) {
                    Some(Some(name)) => {
                        format!(
                            "o.{} = {}",
                            self.tenant,
                            st.param(Param::Text(name.clone()))
                        )
                    }
                    Some(None) => format!("o.{} IS NULL", self.tenant),
                    None => "1 = 0".to_owned(),
                };
                format!(
                    "SELECT * FROM (
                       SELECT {number} AS part, {order} AS claim_order, {id} AS id
                         FROM {table} AS o
                        WHERE {which} AND {due}
                        ORDER BY {order_by} LIMIT {limit}) AS h{part}",
                    number = self.dialect.cast(&part.to_string(), Cast::Int),
                    order = self.order,
                    table = self.table,
                    order_by = self.order_by,
                    limit = st.param(Param::Int(limit)),
                )
            })
            .collect();
        st.with_sql(parts.join(" UNION ALL "))
    }
}

/// The heads of the tenants next in turn, as ids in walk order, read in `conn` (the claim's
/// transaction); the caller locks or leases them. `paused`: the paused tenants (`None`: rows
/// without one); `limit`: the batch's room. Mirrors PostgreSQL's walk: a walk that reaches the
/// last tenant takes the rows without a tenant, and if it started after a tenant, goes on from
/// the first up to where it started. Tenants the last fill served are passed over like paused
/// ones.
pub(super) async fn pick_heads<DB: Execute>(
    conn: &mut DB::Connection,
    walk: &FairWalk,
    sql: &LayoutSql,
    turn: &TenantTurn,
    paused: &[Option<&str>],
    limit: usize,
) -> Result<Vec<OutboxId>, StoreError> {
    let served = turn.served();
    let skip = passed_over(paused, &served);
    let start = turn.start();
    let mut picked = visit::<DB>(conn, walk, sql, (start.as_deref(), None), &skip, limit).await?;
    let mut cut = !picked.reached_end;
    if picked.reached_end {
        // Past the last tenant: the rows without one, then the tenants before the start.
        let room = limit - picked.heads().min(limit);
        if room > 0 && !skip.contains(&None) {
            let rows = fetch_heads::<DB>(conn, walk, sql, &[None], room).await?;
            picked
                .entries
                .extend(rows.into_iter().map(|(_, id)| (None, Some(id))));
        }
        let room = limit - picked.heads().min(limit);
        if let Some(start) = &start
            && room > 0
        {
            let rest = visit::<DB>(conn, walk, sql, (None, Some(start)), &skip, room).await?;
            cut = !rest.reached_end;
            picked.entries.extend(rest.entries);
        }
    }
    let last = picked.entries.last().and_then(|(tenant, _)| tenant.clone());
    turn.walked(cut, last);
    Ok(picked
        .entries
        .into_iter()
        .filter_map(|(_, id)| id)
        .collect())
}

/// One walk over the tenants in `(after, until)` (see [`FairWalk::walk`]), and their heads: at
/// most `room` entries.
async fn visit<DB: Execute>(
    conn: &mut DB::Connection,
    walk: &FairWalk,
    sql: &LayoutSql,
    (after, until): (Option<&str>, Option<&str>),
    skip: &[Option<&str>],
    room: usize,
) -> Result<Visit, StoreError> {
    // Enough are asked for to leave `room` once the skipped ones are dropped (see
    // `FairWalk::walk`).
    let max = room.saturating_add(skip.len());
    let found = DB::fetch_all(conn, &walk.walk(after, until, max, skip)).await?;
    let reached_end = found.len() < max;
    let mut tenants: Vec<Option<String>> = Vec::with_capacity(room);
    for row in &found {
        let tenant = row.text(0)?;
        if tenant.is_some() && !skip.contains(&tenant.as_deref()) {
            tenants.push(tenant);
        }
        if tenants.len() == room {
            break;
        }
    }
    let heads = fetch_heads::<DB>(conn, walk, sql, &tenants, room).await?;
    let mut by_tenant: BTreeMap<usize, Vec<OutboxId>> = BTreeMap::new();
    for (part, id) in heads {
        by_tenant.entry(part).or_default().push(id);
    }
    let mut entries = Vec::with_capacity(room);
    for (part, tenant) in tenants.into_iter().enumerate() {
        match by_tenant.remove(&part) {
            Some(ids) => entries.extend(ids.into_iter().map(|id| (tenant.clone(), Some(id)))),
            None => entries.push((tenant, None)),
        }
        if entries.len() >= room {
            break;
        }
    }
    entries.truncate(room);
    let reached_end = reached_end && entries.len() < room;
    Ok(Visit {
        entries,
        reached_end,
    })
}

/// [`FairWalk::heads`] of `tenants`, at most `room` rows each (and the share): (tenant's
/// place, id), each tenant's in claim order.
async fn fetch_heads<DB: Execute>(
    conn: &mut DB::Connection,
    walk: &FairWalk,
    sql: &LayoutSql,
    tenants: &[Option<String>],
    room: usize,
) -> Result<Vec<(usize, OutboxId)>, StoreError> {
    if tenants.is_empty() {
        return Ok(Vec::new());
    }
    let statement = walk.heads(tenants, walk.share.min(room));
    let rows = DB::fetch_all(conn, &statement).await?;
    let mut heads = Vec::with_capacity(rows.len());
    for row in &rows {
        let part = row.int(0)?.and_then(|p| usize::try_from(p).ok());
        let order = row.int(1)?;
        let id = read_id(row, &sql.layout.key, 2).map_err(|e| unreadable_key(sql, e))?;
        if let Some(part) = part {
            heads.push(((part, order), id));
        }
    }
    heads.sort_by_key(|(place, _)| *place);
    Ok(heads
        .into_iter()
        .map(|((part, _), id)| (part, id))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_layouts::{debezium_layout, sluice_layout, squash};

    #[test]
    fn a_walk_cut_short_goes_on_after_its_last_tenant_and_one_that_ended_starts_over() {
        let turn = TenantTurn::default();
        assert_eq!(turn.start(), None);
        turn.walked(true, Some("t0499".into()));
        assert_eq!(turn.start().as_deref(), Some("t0499"));
        turn.walked(true, Some("t0549".into()));
        assert_eq!(turn.start().as_deref(), Some("t0549"));
        // Reached the last tenant with room to spare: from the first again.
        turn.walked(false, Some("t0569".into()));
        assert_eq!(turn.start(), None);
    }

    #[test]
    fn the_tenants_a_fill_took_a_share_of_are_passed_over_next() {
        let turn = TenantTurn::default();
        let rows = ["big", "big", "big", "small"].map(|t| Some(t.to_owned()));
        turn.filled(rows.into_iter().chain([None, None, None]), 3);
        let mut served = turn.served();
        served.sort();
        assert_eq!(served, [None, Some("big".to_owned())]);
        turn.filled([], 3);
        assert!(turn.served().is_empty());
    }

    #[test]
    fn mysql_walks_the_tenant_index_by_group_and_sqlite_by_recursive_probes() {
        let my = LayoutSql::new(sluice_layout(), Driver::Mysql);
        let walk = FairWalk::new(&my, 2, "").expect("a tenant column");
        let st = walk.walk(Some("t1"), None, 20, &[]);
        let text = squash(&st.sql);
        assert!(
            text.contains(
                "WHERE o.published_at IS NULL AND o.dead_at IS NULL AND o.`tenant` IS NOT NULL \
                 AND o.`tenant` > ? GROUP BY o.`tenant` ORDER BY o.`tenant` LIMIT ?"
            ),
            "{text}"
        );
        assert_eq!(st.params, [Param::Text("t1".into()), Param::Int(20)]);
        // Skipped tenants jumped over by the scan: NULL (rows without a tenant) is no value.
        let st = walk.walk(
            None,
            None,
            20,
            &[Some("big"), None, Some("paused"), Some("x")],
        );
        let text = squash(&st.sql);
        assert!(
            text.contains("IS NOT NULL AND o.`tenant` NOT IN (?, ?, ?, ?) GROUP BY"),
            "{text}"
        );
        let named = ["big", "paused", "x", "big"].map(|n| Param::Text(n.into()));
        assert_eq!(st.params[..4], named, "padded with the first again");

        let lite = LayoutSql::new(sluice_layout(), Driver::Sqlite);
        let walk = FairWalk::new(&lite, 2, "").expect("a tenant column");
        let st = walk.walk(None, Some("t9"), 5, &[Some("big")]);
        let text = squash(&st.sql);
        assert!(
            text.starts_with("WITH RECURSIVE visit(tenant, n)"),
            "{text}"
        );
        assert!(
            text.contains("o.\"tenant\" IS NOT NULL AND o.\"tenant\" <= ?1 ORDER BY")
                && text.contains("o.\"tenant\" > visit.tenant AND o.\"tenant\" <= ?2 ORDER BY")
                && text.contains("n < ?3")
                && !text.contains("NOT IN"),
            "{text}"
        );
        assert!(FairWalk::new(&LayoutSql::new(debezium_layout(), Driver::Mysql), 2, "").is_none());
    }

    #[test]
    fn heads_take_each_tenants_first_due_rows_in_parts_padded_to_a_power_of_two() {
        let my = LayoutSql::new(sluice_layout(), Driver::Mysql);
        let walk = FairWalk::new(&my, 4, "AND KEY_ORDER").expect("a tenant column");
        let tenants = [Some("a".to_owned()), None, Some("c".to_owned())];
        let st = walk.heads(&tenants, 3);
        let text = squash(&st.sql);
        assert_eq!(text.matches(" UNION ALL ").count(), 3, "{text}");
        let due = squash(&LayoutSql::due("UTC_TIMESTAMP(6)"));
        for which in ["o.`tenant` = ?", "o.`tenant` IS NULL", "1 = 0"] {
            assert!(
                text.contains(&format!(
                    "WHERE {which} AND {due} AND KEY_ORDER ORDER BY o.`id` LIMIT ?)"
                )),
                "{text}"
            );
        }
        assert!(text.contains("SELECT CAST(1 AS SIGNED) AS part"), "{text}");
        assert_eq!(
            st.params,
            [
                Param::Text("a".into()),
                Param::Int(3),
                Param::Int(3),
                Param::Text("c".into()),
                Param::Int(3),
                Param::Int(3)
            ]
        );
    }
}
