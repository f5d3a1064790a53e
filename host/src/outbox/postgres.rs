//! PostgreSQL outbox: the migration, the claim query, marking and rescheduling.
//!
//! Every statement is built once from the checked [`Layout`] of the table, so whatever the
//! application's column names and types, the Rust side sees one shape: `int8` or `text` keys,
//! `text` strings, `bytea` payloads, `timestamptz` times (see [`super::schema`]).

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Postgres, Row, Transaction};

use super::columns::{ColumnName, TableSpec, TenantColumn};
use super::schema::{self, FoundColumn, KeyKind, Layout};
use super::{
    BatchOutcome, Claim, ClaimedBatch, Disposition, Headers, OutboxId, OutboxRow, OutboxStore,
    RowFailure, Settlement, StoreError, TenantId,
};
use crate::config::{AfterDead, MarkMode, Ordering};
use crate::text::{MAX_LOGGED, MAX_STORED, bounded};

/// How long to wait for a connection before reporting the database as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// `application_name` of Sluice's connections (visible in `pg_stat_activity`).
pub const APPLICATION_NAME: &str = "sluice";
/// Advisory-lock key serialising concurrent `sluice migrate` runs ("sluice" in ASCII).
const MIGRATE_LOCK_KEY: i64 = 0x736c_7569_6365;
/// Recorded as `last_error` when the database refuses a failure's own text (a constraint or
/// trigger of the application's): plain ASCII, so recording the failure cannot fail on text.
const UNSTORABLE_ERROR: &str =
    "the error text could not be stored (the database refused it); see the relay's log";

/// How the store claims and marks rows (from `[relay]`).
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreOptions {
    pub mark: MarkMode,
    pub ordering: Ordering,
    pub after_dead: AfterDead,
}

/// In key order, a row is claimable only when no earlier row of its key is still unsent:
/// not in another relay's open batch (its lock keeps it unsent until that commit), not
/// waiting for a retry, and — unless dead rows are skipped — not dead. So at most one row per
/// key is ever in flight, and a failing row holds back its own key only. "Earlier" is the
/// claim order ([`Layout::before`]): a total order, so of two unsent rows of a key exactly one
/// is first.
fn key_order_filter(layout: &Layout, ordering: Ordering, after_dead: AfterDead) -> String {
    match ordering {
        Ordering::None => String::new(),
        Ordering::Key => {
            let dead = match after_dead {
                AfterDead::Skip => "AND p.dead_at IS NULL",
                AfterDead::Block => "",
            };
            let tenant = match &layout.tenant {
                Some(t) => format!("AND p.{t} IS NOT DISTINCT FROM o.{t}"),
                None => String::new(),
            };
            format!(
                "AND NOT EXISTS (
                    SELECT 1 FROM {table} AS p
                     WHERE p.{at} = o.{at}
                       AND p.{ai} = o.{ai}
                       {tenant}
                       AND {before}
                       AND p.published_at IS NULL {dead})",
                table = layout.table,
                at = layout.aggregate_type,
                ai = layout.aggregate_id,
                before = layout.before("p", "o"),
            )
        }
    }
}

/// Creates the outbox table, or upgrades one the application created: adds Sluice's
/// bookkeeping columns, `headers` and `created_at` when missing (all without rewriting the
/// table), the order column when the id is not an integer (this one fills every existing
/// row, which rewrites the table once), and the partial indexes on unsent rows. Then checks
/// the table as `sluice run` would; a table Sluice cannot use is refused with every problem
/// and left unchanged. Idempotent, and safe to run from several processes at once.
pub async fn migrate(pool: &PgPool, spec: &TableSpec) -> Result<Layout, StoreError> {
    let mut tx = pool.begin().await?;
    // "column already exists, skipping" notices are expected on every re-run; keep them quiet.
    sqlx::query("SET LOCAL client_min_messages = warning")
        .execute(&mut *tx)
        .await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATE_LOCK_KEY)
        .execute(&mut *tx)
        .await?;
    sqlx::query(AssertSqlSafe(create_table_sql(spec)))
        .execute(&mut *tx)
        .await?;
    let found = schema::read_columns(&mut *tx, &spec.name).await?;
    sqlx::query(AssertSqlSafe(add_columns_sql(spec, &found)))
        .execute(&mut *tx)
        .await?;
    let found = schema::read_columns(&mut *tx, &spec.name).await?;
    // Refused: `tx` is dropped, which rolls everything above back.
    let layout = schema::check(spec, &found)?;
    for sql in index_sql(&layout) {
        sqlx::query(AssertSqlSafe(sql)).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(layout)
}

/// `CREATE TABLE IF NOT EXISTS` with the mapped column names and Sluice's types.
fn create_table_sql(spec: &TableSpec) -> String {
    let c = &spec.columns;
    let tenant = match &c.tenant {
        TenantColumn::IfPresent(t) | TenantColumn::Named(t) => format!("{t} text,"),
        TenantColumn::None => String::new(),
    };
    let order = match &c.order {
        Some(order) if *order != c.id => {
            format!("{order} bigint GENERATED BY DEFAULT AS IDENTITY,")
        }
        _ => String::new(),
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
            {id}            bigserial PRIMARY KEY,
            {tenant}
            {at}            text        NOT NULL,
            {ai}            text        NOT NULL,
            {et}            text        NOT NULL,
            {payload}       jsonb,
            {headers}       jsonb       NOT NULL DEFAULT '{{}}',
            {created_at}    timestamptz NOT NULL DEFAULT now(),
            {order}
            published_at    timestamptz,
            attempts        integer     NOT NULL DEFAULT 0,
            next_attempt_at timestamptz,
            last_error      text,
            dead_at         timestamptz
        )",
        table = spec.name,
        id = c.id,
        at = c.aggregate_type,
        ai = c.aggregate_id,
        et = c.event_type,
        payload = c.payload,
        headers = c.headers,
        created_at = c.created_at,
    )
}

/// Adds what an application's own table lacks. Constant (or `now()`) defaults are stored in
/// the catalog, so these columns cost no rewrite; only a new order column does (each existing
/// row gets its number, in the table's physical order).
fn add_columns_sql(spec: &TableSpec, found: &[FoundColumn]) -> String {
    let c = &spec.columns;
    let mut adds = vec![
        format!(
            "ADD COLUMN IF NOT EXISTS {} jsonb NOT NULL DEFAULT '{{}}'",
            c.headers
        ),
        format!(
            "ADD COLUMN IF NOT EXISTS {} timestamptz NOT NULL DEFAULT now()",
            c.created_at
        ),
        "ADD COLUMN IF NOT EXISTS published_at    timestamptz".to_owned(),
        "ADD COLUMN IF NOT EXISTS attempts        integer NOT NULL DEFAULT 0".to_owned(),
        "ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz".to_owned(),
        "ADD COLUMN IF NOT EXISTS last_error      text".to_owned(),
        "ADD COLUMN IF NOT EXISTS dead_at         timestamptz".to_owned(),
    ];
    // Only when missing: `ADD COLUMN IF NOT EXISTS … IDENTITY` would still create a sequence.
    if let Some(order) = schema::order_column_to_add(spec, found) {
        adds.push(format!(
            "ADD COLUMN {order} bigint GENERATED BY DEFAULT AS IDENTITY"
        ));
    }
    format!("ALTER TABLE {}\n    {}", spec.name, adds.join(",\n    "))
}

/// The partial indexes on unsent rows: one in claim order (keeps the claim cheap however many
/// sent rows `published_at` mode retains), one per key for `ordering = "key"`. Tables ordered
/// by a column named `id` keep the index names of earlier versions.
fn index_sql(layout: &Layout) -> [String; 2] {
    let table = &layout.table;
    let order_columns = if layout.ordered_by_id() {
        layout.id.to_string()
    } else {
        format!("{}, {}", layout.order, layout.id)
    };
    let suffix = match layout.order.as_str() {
        "id" => String::new(),
        other => format!("_{other}"),
    };
    [
        format!(
            "CREATE INDEX IF NOT EXISTS \"{name}_unsent{suffix}_idx\" ON {table} ({order_columns})
                WHERE published_at IS NULL AND dead_at IS NULL",
            name = table.table()
        ),
        // For `ordering = "key"`: finding an earlier unsent row of the same key.
        format!(
            "CREATE INDEX IF NOT EXISTS \"{name}_unsent_key{suffix}_idx\" ON {table}
                ({at}, {ai}, {order_columns}) WHERE published_at IS NULL",
            name = table.table(),
            at = layout.aggregate_type,
            ai = layout.aggregate_id,
        ),
    ]
}

/// Connection options from a URL, with Sluice's `application_name` unless the URL sets one
/// (so operators can find the connections in `pg_stat_activity`).
pub fn connect_options(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    let options: PgConnectOptions = url.parse()?;
    Ok(if options.get_application_name().is_none() {
        options.application_name(APPLICATION_NAME)
    } else {
        options
    })
}

/// Connects a pool of at most `connections` (a relay needs one per worker, plus one for the
/// probe, the pruner and the CLI's queries).
pub async fn connect(url: &str, connections: u32) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(connections.max(1))
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(connect_options(url)?)
        .await
}

/// The PostgreSQL [`OutboxStore`].
pub struct PgOutbox {
    pool: PgPool,
    mark: MarkMode,
    layout: Arc<Layout>,
    // Built once from checked identifiers (see `TableName`, `ColumnName`), hence
    // `AssertSqlSafe`.
    claim_sql: Arc<str>,
    due_sql: Arc<str>,
    backlog_sql: Arc<str>,
    mark_sql: Arc<str>,
    reschedule_sql: Arc<str>,
}

impl PgOutbox {
    /// Checks the table (every column Sluice reads or writes must exist with a usable type;
    /// otherwise the refusal lists every problem) and prepares the statements.
    pub async fn new(
        pool: PgPool,
        spec: TableSpec,
        options: StoreOptions,
    ) -> Result<Self, StoreError> {
        let layout = schema::inspect(&pool, &spec).await?;
        tracing::info!(table = %layout.table, layout = %layout.summary(), "outbox table checked");
        let statements = Statements::new(&layout, options);
        Ok(Self {
            pool,
            mark: options.mark,
            layout: Arc::new(layout),
            claim_sql: statements.claim.into(),
            due_sql: statements.due.into(),
            backlog_sql: statements.backlog.into(),
            mark_sql: statements.mark.into(),
            reschedule_sql: statements.reschedule.into(),
        })
    }

    pub fn mark_mode(&self) -> MarkMode {
        self.mark
    }

    /// The checked table this store relays from.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Unsent rows by state: what `sluice drain` has to do, and what it left.
    pub async fn backlog(&self) -> Result<Backlog, StoreError> {
        let (due, waiting, dead): (i64, i64, i64) =
            sqlx::query_as(AssertSqlSafe(Arc::clone(&self.backlog_sql)))
                .fetch_one(&self.pool)
                .await?;
        Ok(Backlog { due, waiting, dead })
    }
}

/// The store's statements for one table and `[relay]` setting.
struct Statements {
    claim: String,
    due: String,
    backlog: String,
    mark: String,
    reschedule: String,
}

impl Statements {
    fn new(layout: &Layout, options: StoreOptions) -> Self {
        let table = &layout.table;
        // Unsent, not dead, due, not of a paused tenant ($1), and — in key order — not behind
        // an earlier unsent row of its key.
        let due = format!(
            "o.published_at IS NULL AND o.dead_at IS NULL
                AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())
                AND NOT ({tenant} = ANY($1::text[]))
                {key_order}",
            tenant = layout.tenant_name_expr("o"),
            key_order = key_order_filter(layout, options.ordering, options.after_dead),
        );
        let claim = format!(
            "SELECT {id} AS id, {tenant} AS tenant, o.{at}::text AS aggregate_type,
                    o.{ai}::text AS aggregate_id, o.{et}::text AS event_type,
                    {payload} AS payload, COALESCE(o.{headers}::text, '{{}}') AS headers,
                    {created_at} AS created_at, o.attempts
               FROM {table} AS o
              WHERE {due}
              ORDER BY {order_by}
              LIMIT $2
                FOR UPDATE OF o SKIP LOCKED",
            id = layout.id_expr("o"),
            tenant = layout.tenant_expr("o"),
            at = layout.aggregate_type,
            ai = layout.aggregate_id,
            et = layout.event_type,
            payload = layout.payload_expr("o"),
            headers = layout.headers,
            created_at = layout.created_at_expr("o"),
            order_by = layout.order_by("o"),
        );
        let keys = layout.key_array("$1");
        let mark = match options.mark {
            MarkMode::Delete => format!("DELETE FROM {table} WHERE {} = ANY({keys})", layout.id),
            MarkMode::PublishedAt => format!(
                "UPDATE {table} SET published_at = now() WHERE {} = ANY({keys})",
                layout.id
            ),
        };
        let reschedule = format!(
            "UPDATE {table} AS o
                SET attempts = o.attempts + f.counted::int,
                    last_error = f.error,
                    next_attempt_at = CASE WHEN f.dead THEN NULL
                                      ELSE now() + f.delay_ms * interval '1 millisecond' END,
                    dead_at = CASE WHEN f.dead THEN now() END
               FROM unnest($1::text[], $2::text[], $3::int8[], $4::bool[], $5::bool[])
                    AS f(id, error, delay_ms, dead, counted)
              WHERE o.{id} = f.id::{cast}",
            id = layout.id,
            cast = layout.key_cast(),
        );
        let backlog = format!(
            "SELECT count(*) FILTER (WHERE dead_at IS NULL
                                       AND (next_attempt_at IS NULL OR next_attempt_at <= now())),
                    count(*) FILTER (WHERE dead_at IS NULL AND next_attempt_at > now()),
                    count(*) FILTER (WHERE dead_at IS NOT NULL)
               FROM {table} WHERE published_at IS NULL"
        );
        Self {
            due: format!("SELECT EXISTS (SELECT 1 FROM {table} AS o WHERE {due})"),
            claim,
            backlog,
            mark,
            reschedule,
        }
    }
}

/// Unsent rows of the outbox, by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Claimable now (not counting locks and paused tenants).
    pub due: i64,
    /// Waiting for a retry (`next_attempt_at` in the future).
    pub waiting: i64,
    pub dead: i64,
}

impl OutboxStore for PgOutbox {
    type Batch = PgBatch;

    async fn has_due(&self, paused: &[TenantId]) -> Result<bool, StoreError> {
        let paused: Vec<&str> = paused.iter().map(TenantId::as_str).collect();
        Ok(sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.due_sql)))
            .bind(&paused)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn claim(&self, limit: usize, paused: &[TenantId]) -> Result<Claim<PgBatch>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let paused: Vec<&str> = paused.iter().map(TenantId::as_str).collect();
        let raw = sqlx::query(AssertSqlSafe(Arc::clone(&self.claim_sql)))
            .bind(&paused)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        let mut rows = Vec::with_capacity(raw.len());
        let mut rejected = Vec::new();
        for row in &raw {
            match decode_row(row, &self.layout)? {
                Ok(r) => rows.push(r),
                Err(failure) => rejected.push(failure),
            }
        }
        Ok(Claim {
            batch: PgBatch {
                tx,
                mark_sql: Arc::clone(&self.mark_sql),
                reschedule_sql: Arc::clone(&self.reschedule_sql),
            },
            rows,
            rejected,
        })
    }

    async fn settle(&self, outcome: &BatchOutcome) -> Result<Settlement, StoreError> {
        settle::settle(self, outcome).await
    }
}

/// [`OutboxStore::settle`]: recording a batch's outcome in a fresh transaction after its
/// commit failed. All rows in one statement each (mark, reschedule) inside a savepoint; if
/// the database refuses that, row by row, each in its own savepoint, so one row it refuses
/// cannot keep the others from being recorded. Rare path: plain SQL built per call.
mod settle {
    use std::collections::{HashMap, HashSet};

    use sqlx::{Acquire, AssertSqlSafe, PgConnection};

    use super::{PgOutbox, key_params};
    use crate::outbox::{BatchOutcome, Disposition, OutboxId, RowFailure, Settlement, StoreError};
    use crate::text::{MAX_STORED, bounded};

    /// A statement that changed nothing about a row it was given.
    const UNCHANGED: &str = "the statement changed no row (a trigger or rule suppressed it)";

    pub(super) async fn settle(
        store: &PgOutbox,
        outcome: &BatchOutcome,
    ) -> Result<Settlement, StoreError> {
        let mut settlement = Settlement::default();
        // Keys travel as text (cast to the id column's type in SQL) and come back as text.
        let ids: HashMap<String, &OutboxId> = outcome
            .sent
            .iter()
            .chain(outcome.failed.iter().map(|f| &f.id))
            .map(|id| (id.to_string(), id))
            .collect();
        if ids.is_empty() {
            return Ok(settlement);
        }
        let layout = store.layout();
        let wanted: Vec<String> = ids.keys().cloned().collect();
        let lock_sql = format!(
            "SELECT {id_text} FROM {table} AS o WHERE o.{id} = ANY({keys})
                AND o.published_at IS NULL AND o.dead_at IS NULL
                FOR UPDATE OF o SKIP LOCKED",
            id_text = layout.id_text_expr("o"),
            table = layout.table,
            id = layout.id,
            keys = layout.key_array("$1"),
        );
        let mark_sql = format!("{} RETURNING {}", store.mark_sql, layout.id_text_expr(""));
        let reschedule_sql = format!(
            "{} RETURNING {}",
            store.reschedule_sql,
            layout.id_text_expr("o")
        );

        let mut tx = store.pool.begin().await?;
        let locked: HashSet<String> = sqlx::query_scalar::<_, String>(AssertSqlSafe(lock_sql))
            .bind(&wanted)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect();
        settlement.skipped = ids
            .iter()
            .filter(|(key, _)| !locked.contains(*key))
            .map(|(_, id)| (*id).clone())
            .collect();
        let sent: Vec<&OutboxId> = outcome
            .sent
            .iter()
            .filter(|id| locked.contains(&id.to_string()))
            .collect();
        let failed: Vec<&RowFailure> = outcome
            .failed
            .iter()
            .filter(|f| locked.contains(&f.id.to_string()))
            .collect();

        let mut all = Acquire::begin(&mut tx).await?;
        let together = async {
            let marked = mark(&mut all, &mark_sql, &sent).await?;
            let rescheduled = reschedule(&mut all, &reschedule_sql, &failed).await?;
            Ok::<_, sqlx::Error>((marked, rescheduled))
        }
        .await;
        match together {
            Ok((marked, rescheduled)) => {
                all.commit().await?;
                sort(&mut settlement, &sent, &marked, Target::Marked);
                let failed_ids: Vec<&OutboxId> = failed.iter().map(|f| &f.id).collect();
                sort(
                    &mut settlement,
                    &failed_ids,
                    &rescheduled,
                    Target::Rescheduled,
                );
            }
            Err(e) => {
                all.rollback().await?;
                tracing::warn!(error = %e, "recording the batch's rows together failed; recording them one by one");
                for id in sent {
                    let mut one = Acquire::begin(&mut tx).await?;
                    let done = mark(&mut one, &mark_sql, &[id]).await;
                    settle_one(&mut settlement, id, done, one, Target::Marked).await?;
                }
                for failure in failed {
                    let mut one = Acquire::begin(&mut tx).await?;
                    let done = reschedule(&mut one, &reschedule_sql, &[failure]).await;
                    settle_one(&mut settlement, &failure.id, done, one, Target::Rescheduled)
                        .await?;
                }
            }
        }
        tx.commit().await?;
        Ok(settlement)
    }

    #[derive(Clone, Copy)]
    enum Target {
        Marked,
        Rescheduled,
    }

    /// Files the `given` rows under `target` when the statement returned them, as refused
    /// otherwise.
    fn sort(settlement: &mut Settlement, given: &[&OutboxId], changed: &[String], target: Target) {
        let changed: HashSet<&str> = changed.iter().map(String::as_str).collect();
        for id in given {
            if changed.contains(id.to_string().as_str()) {
                let list = match target {
                    Target::Marked => &mut settlement.marked,
                    Target::Rescheduled => &mut settlement.rescheduled,
                };
                list.push((*id).clone());
            } else {
                settlement
                    .refused
                    .push(((*id).clone(), UNCHANGED.to_owned()));
            }
        }
    }

    /// Keeps one row's change (releasing its savepoint) or undoes it and files it as refused.
    async fn settle_one(
        settlement: &mut Settlement,
        id: &OutboxId,
        done: Result<Vec<String>, sqlx::Error>,
        savepoint: sqlx::Transaction<'_, sqlx::Postgres>,
        target: Target,
    ) -> Result<(), StoreError> {
        match done {
            Ok(changed) => {
                savepoint.commit().await?;
                sort(settlement, &[id], &changed, target);
            }
            Err(e) => {
                savepoint.rollback().await?;
                settlement.refused.push((id.clone(), e.to_string()));
            }
        }
        Ok(())
    }

    async fn mark(
        conn: &mut PgConnection,
        sql: &str,
        ids: &[&OutboxId],
    ) -> Result<Vec<String>, sqlx::Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
            .bind(key_params(ids.iter().copied()))
            .fetch_all(conn)
            .await
    }

    async fn reschedule(
        conn: &mut PgConnection,
        sql: &str,
        failed: &[&RowFailure],
    ) -> Result<Vec<String>, sqlx::Error> {
        if failed.is_empty() {
            return Ok(Vec::new());
        }
        let millis = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let mut errors = Vec::with_capacity(failed.len());
        let mut delays = Vec::with_capacity(failed.len());
        let mut dead = Vec::with_capacity(failed.len());
        let mut counted = Vec::with_capacity(failed.len());
        for f in failed {
            let (delay, is_dead, counts) = match f.disposition {
                Disposition::Retry(d) => (millis(d), false, true),
                Disposition::Dead => (0, true, true),
                Disposition::Wait(d) => (millis(d), false, false),
            };
            errors.push(bounded(&f.error, MAX_STORED).into_owned());
            delays.push(delay);
            dead.push(is_dead);
            counted.push(counts);
        }
        sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
            .bind(key_params(failed.iter().map(|f| &f.id)))
            .bind(&errors)
            .bind(&delays)
            .bind(&dead)
            .bind(&counted)
            .fetch_all(conn)
            .await
    }
}

/// Decodes a claimed row. A row whose columns cannot be decoded is a [`RowFailure`] under its
/// own id, dead-lettered with the reason (retrying cannot help until someone fixes the row).
/// Only an unreadable id is an error of the whole claim: without it the row cannot be named.
/// (The schema check makes that impossible — the id is `NOT NULL` and cast to `int8` or
/// `text` in SQL — unless the table is altered under a running relay.)
fn decode_row(row: &PgRow, layout: &Layout) -> Result<Result<OutboxRow, RowFailure>, StoreError> {
    let id = match layout.key {
        KeyKind::Int => row.try_get::<i64, _>("id").map(OutboxId::Int),
        KeyKind::Text { .. } => row
            .try_get::<String, _>("id")
            .map(|id| OutboxId::Text(id.into())),
    }
    .map_err(|e| StoreError::Key {
        table: layout.table.to_string(),
        column: layout.id.to_string(),
        message: e.to_string(),
    })?;
    Ok(
        decode_columns(row, layout, id.clone()).map_err(|error| RowFailure {
            id,
            error,
            disposition: Disposition::Dead,
        }),
    )
}

fn decode_columns(row: &PgRow, layout: &Layout, id: OutboxId) -> Result<OutboxRow, String> {
    let cannot =
        |column: &ColumnName, e: sqlx::Error| format!("cannot decode column {column}: {e}");
    let text = |alias: &str, column: &ColumnName| match row.try_get::<Option<String>, _>(alias) {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err(format!("column {column} is NULL")),
        Err(e) => Err(cannot(column, e)),
    };
    let tenant = match &layout.tenant {
        Some(column) => row.try_get("tenant").map_err(|e| cannot(column, e))?,
        None => None,
    };
    let headers = text("headers", &layout.headers)?;
    Ok(OutboxRow {
        id,
        tenant: TenantId::from_column(tenant),
        aggregate_type: text("aggregate_type", &layout.aggregate_type)?,
        aggregate_id: text("aggregate_id", &layout.aggregate_id)?,
        event_type: text("event_type", &layout.event_type)?,
        payload: row
            .try_get::<Option<Vec<u8>>, _>("payload")
            .map_err(|e| cannot(&layout.payload, e))?
            .unwrap_or_default(),
        headers: parse_headers(&headers)?,
        created_at: row
            .try_get("created_at")
            .map_err(|e| cannot(&layout.created_at, e))?,
        attempts: row
            .try_get("attempts")
            .map_err(|e| format!("cannot decode column attempts: {e}"))?,
    })
}

/// Parses the `headers` column: a JSON object whose values are strings.
pub(crate) fn parse_headers(text: &str) -> Result<Headers, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("headers column is not JSON: {e}"))?;
    let serde_json::Value::Object(map) = value else {
        return Err(format!(
            "headers column must be a JSON object of strings, got {text}"
        ));
    };
    map.into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k, s.into_bytes())),
            other => Err(format!(
                "headers column: value of {k:?} must be a string, got {other}"
            )),
        })
        .collect()
}

/// Ids as the `text[]` parameter the statements cast to the id column's type.
pub(crate) fn key_params<'a>(ids: impl Iterator<Item = &'a OutboxId>) -> Vec<String> {
    ids.map(OutboxId::to_string).collect()
}

/// A claimed batch: the open transaction holding the row locks.
pub struct PgBatch {
    tx: Transaction<'static, Postgres>,
    mark_sql: Arc<str>,
    reschedule_sql: Arc<str>,
}

impl ClaimedBatch for PgBatch {
    async fn complete(mut self, outcome: BatchOutcome) -> Result<(), StoreError> {
        if !outcome.sent.is_empty() {
            let ids = key_params(outcome.sent.iter());
            let affected = sqlx::query(AssertSqlSafe(Arc::clone(&self.mark_sql)))
                .bind(&ids)
                .execute(&mut *self.tx)
                .await?
                .rows_affected();
            check_count(ids.len(), affected)?;
        }
        if !outcome.failed.is_empty() {
            let affected = self.reschedule(&outcome.failed).await?;
            check_count(outcome.failed.len(), affected)?;
        }
        // A mismatch above returns early and drops `tx`, which rolls back.
        self.tx.commit().await?;
        Ok(())
    }

    async fn abandon(self) -> Result<(), StoreError> {
        self.tx.rollback().await?;
        Ok(())
    }
}

impl PgBatch {
    /// Reschedules or dead-letters `failed`, recording each error made safe to store
    /// ([`bounded`]: no NUL or other control characters, at most [`MAX_STORED`] bytes). Runs
    /// inside a savepoint: should the database still refuse the texts (a constraint or trigger
    /// of the application's), the failures are recorded with [`UNSTORABLE_ERROR`] instead, so
    /// the commit of a batch whose messages were already published cannot fail on text.
    async fn reschedule(&mut self, failed: &[RowFailure]) -> Result<u64, StoreError> {
        let errors: Vec<String> = failed
            .iter()
            .map(|f| bounded(&f.error, MAX_STORED).into_owned())
            .collect();
        sqlx::query("SAVEPOINT sluice_reschedule")
            .execute(&mut *self.tx)
            .await?;
        match self.run_reschedule(failed, &errors).await {
            Ok(affected) => Ok(affected),
            Err(refused) => {
                tracing::warn!(
                    error = %bounded(&refused.to_string(), MAX_LOGGED),
                    rows = failed.len(),
                    "the database refused the failed rows' error texts; recording a fixed text instead"
                );
                sqlx::query("ROLLBACK TO SAVEPOINT sluice_reschedule")
                    .execute(&mut *self.tx)
                    .await?;
                let fixed = vec![UNSTORABLE_ERROR.to_owned(); failed.len()];
                self.run_reschedule(failed, &fixed).await
            }
        }
    }

    async fn run_reschedule(
        &mut self,
        failed: &[RowFailure],
        errors: &[String],
    ) -> Result<u64, StoreError> {
        let ids = key_params(failed.iter().map(|f| &f.id));
        let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let mut delays = Vec::with_capacity(ids.len());
        let mut dead = Vec::with_capacity(ids.len());
        let mut counted = Vec::with_capacity(ids.len());
        for f in failed {
            let (delay, is_dead, counts) = match f.disposition {
                Disposition::Retry(d) => (millis(d), false, true),
                Disposition::Dead => (0, true, true),
                Disposition::Wait(d) => (millis(d), false, false),
            };
            delays.push(delay);
            dead.push(is_dead);
            counted.push(counts);
        }
        Ok(sqlx::query(AssertSqlSafe(Arc::clone(&self.reschedule_sql)))
            .bind(&ids)
            .bind(errors)
            .bind(&delays)
            .bind(&dead)
            .bind(&counted)
            .execute(&mut *self.tx)
            .await?
            .rows_affected())
    }
}

fn check_count(expected: usize, affected: u64) -> Result<(), StoreError> {
    let expected = expected as u64;
    if expected == affected {
        Ok(())
    } else {
        Err(StoreError::MarkMismatch { expected, affected })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::columns::ColumnMap;
    use crate::outbox::schema::TimeKind;
    use crate::outbox::{PayloadKind, TableName};

    #[test]
    fn headers_object_of_strings_becomes_ordered_pairs() {
        let h = parse_headers(r#"{"a":"1","b":"two"}"#).unwrap();
        assert_eq!(
            h,
            vec![("a".into(), b"1".to_vec()), ("b".into(), b"two".to_vec())]
        );
    }

    #[test]
    fn non_string_header_value_is_named() {
        let err = parse_headers(r#"{"trace":5}"#).unwrap_err();
        assert!(err.contains("\"trace\""), "{err}");
        assert!(parse_headers("[1]").is_err());
    }

    fn col(name: &str) -> ColumnName {
        ColumnName::parse(name).unwrap()
    }

    /// Debezium's default table (uuid id, no tenant) after `sluice migrate`.
    fn debezium_layout() -> Layout {
        Layout {
            table: TableName::parse("outboxevent").unwrap(),
            id: col("id"),
            key: KeyKind::Text {
                cast: "uuid".into(),
            },
            tenant: None,
            aggregate_type: col("aggregatetype"),
            aggregate_id: col("aggregateid"),
            event_type: col("type"),
            payload: col("payload"),
            payload_kind: PayloadKind::Json,
            headers: col("headers"),
            created_at: col("created_at"),
            created_at_kind: TimeKind::WithZone,
            order: col("sluice_seq"),
        }
    }

    fn sluice_layout() -> Layout {
        Layout {
            table: TableName::parse("outbox").unwrap(),
            id: col("id"),
            key: KeyKind::Int,
            tenant: Some(col("tenant")),
            aggregate_type: col("aggregate_type"),
            aggregate_id: col("aggregate_id"),
            event_type: col("event_type"),
            payload: col("payload"),
            payload_kind: PayloadKind::Json,
            headers: col("headers"),
            created_at: col("created_at"),
            created_at_kind: TimeKind::WithZone,
            order: col("id"),
        }
    }

    fn squash(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn uuid_keys_are_cast_back_to_uuid_when_marking_and_rescheduling() {
        let s = Statements::new(&debezium_layout(), StoreOptions::default());
        assert_eq!(
            squash(&s.mark),
            "DELETE FROM \"outboxevent\" WHERE \"id\" = ANY($1::text[]::uuid[])"
        );
        assert!(
            squash(&s.reschedule).ends_with("WHERE o.\"id\" = f.id::uuid"),
            "{}",
            s.reschedule
        );
        let claim = squash(&s.claim);
        assert!(claim.starts_with("SELECT o.\"id\"::text AS id, NULL::text AS tenant, o.\"aggregatetype\"::text AS aggregate_type"), "{claim}");
        assert!(
            claim.contains("ORDER BY o.\"sluice_seq\", o.\"id\" LIMIT $2"),
            "{claim}"
        );
        assert!(
            claim.contains("AND NOT ('default'::text = ANY($1::text[]))"),
            "{claim}"
        );
    }

    #[test]
    fn integer_keys_keep_the_primary_key_usable() {
        let options = StoreOptions {
            mark: MarkMode::PublishedAt,
            ..StoreOptions::default()
        };
        let s = Statements::new(&sluice_layout(), options);
        assert_eq!(
            squash(&s.mark),
            "UPDATE \"outbox\" SET published_at = now() WHERE \"id\" = ANY($1::text[]::int8[])"
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
            &debezium_layout(),
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
            &sluice_layout(),
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

    #[test]
    fn indexes_follow_the_order_column_and_keep_the_old_names_for_id() {
        let [unsent, key] = index_sql(&sluice_layout());
        assert!(
            squash(&unsent).starts_with(
                "CREATE INDEX IF NOT EXISTS \"outbox_unsent_idx\" ON \"outbox\" (\"id\")"
            ),
            "{unsent}"
        );
        assert!(squash(&key).contains("\"outbox_unsent_key_idx\" ON \"outbox\" (\"aggregate_type\", \"aggregate_id\", \"id\")"), "{key}");
        let [unsent, key] = index_sql(&debezium_layout());
        assert!(
            squash(&unsent).contains(
                "\"outboxevent_unsent_sluice_seq_idx\" ON \"outboxevent\" (\"sluice_seq\", \"id\")"
            ),
            "{unsent}"
        );
        assert!(
            squash(&key).contains("(\"aggregatetype\", \"aggregateid\", \"sluice_seq\", \"id\")"),
            "{key}"
        );
    }

    #[test]
    fn migrate_creates_the_mapped_names_and_adds_what_an_application_table_lacks() {
        let spec = TableSpec {
            name: TableName::parse("outboxevent").unwrap(),
            columns: ColumnMap {
                aggregate_type: col("aggregatetype"),
                tenant: TenantColumn::None,
                ..ColumnMap::default()
            },
        };
        let create = squash(&create_table_sql(&spec));
        assert!(
            create.contains("\"aggregatetype\" text NOT NULL"),
            "{create}"
        );
        assert!(!create.contains("tenant"), "{create}");
        let uuid_id = FoundColumn {
            name: "id".into(),
            shown: "uuid".into(),
            base: "uuid".into(),
            bounded: false,
            not_null: true,
            unique: true,
        };
        let alter = squash(&add_columns_sql(&spec, std::slice::from_ref(&uuid_id)));
        assert!(
            alter.contains("ADD COLUMN \"sluice_seq\" bigint GENERATED BY DEFAULT AS IDENTITY"),
            "{alter}"
        );
        assert!(
            alter.contains("ADD COLUMN IF NOT EXISTS \"headers\" jsonb NOT NULL DEFAULT '{}'"),
            "{alter}"
        );
        let int_id = FoundColumn {
            shown: "integer".into(),
            base: "integer".into(),
            ..uuid_id
        };
        let alter = add_columns_sql(&spec, &[int_id]);
        assert!(!alter.contains("sluice_seq"), "{alter}");
    }
}
