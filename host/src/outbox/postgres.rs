//! PostgreSQL outbox: the migration, the claim query, marking and rescheduling.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Postgres, Row, Transaction};

use super::{
    BatchOutcome, Claim, ClaimedBatch, Disposition, Headers, OutboxId, OutboxRow, OutboxStore,
    RowFailure, Settlement, StoreError, TableName, TenantId,
};
use crate::config::{AfterDead, MarkMode, Ordering};

/// `last_error` is for humans; keep a runaway error message from bloating the table.
const MAX_ERROR_LEN: usize = 2_000;
/// How long to wait for a connection before reporting the database as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// `application_name` of Sluice's connections (visible in `pg_stat_activity`).
pub const APPLICATION_NAME: &str = "sluice";
/// Advisory-lock key serialising concurrent `sluice migrate` runs ("sluice" in ASCII).
const MIGRATE_LOCK_KEY: i64 = 0x736c_7569_6365;

/// How the `payload` column is stored, which decides how it is turned into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// `jsonb` or `json`: the JSON text, UTF-8.
    Json,
    /// `bytea`: the raw bytes.
    Bytes,
    /// `text`/`varchar`: UTF-8.
    Text,
}

impl PayloadKind {
    fn from_type_name(name: &str) -> Option<Self> {
        match name {
            "jsonb" | "json" => Some(Self::Json),
            "bytea" => Some(Self::Bytes),
            "text" | "character varying" => Some(Self::Text),
            _ => None,
        }
    }

    /// SQL expression yielding the payload as `bytea`.
    fn select_expr(self) -> &'static str {
        match self {
            Self::Json => "convert_to(o.payload::text, 'UTF8')",
            Self::Bytes => "o.payload",
            Self::Text => "convert_to(o.payload, 'UTF8')",
        }
    }
}

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
/// key is ever in flight, and a failing row holds back its own key only.
fn key_order_filter(table: &TableName, ordering: Ordering, after_dead: AfterDead) -> String {
    match ordering {
        Ordering::None => String::new(),
        Ordering::Key => {
            let dead = match after_dead {
                AfterDead::Skip => "AND p.dead_at IS NULL",
                AfterDead::Block => "",
            };
            format!(
                "AND NOT EXISTS (
                    SELECT 1 FROM {table} AS p
                     WHERE p.aggregate_type = o.aggregate_type
                       AND p.aggregate_id = o.aggregate_id
                       AND p.tenant IS NOT DISTINCT FROM o.tenant
                       AND p.id < o.id
                       AND p.published_at IS NULL {dead})"
            )
        }
    }
}

/// Creates (or upgrades) the outbox table and its partial index on unsent rows. Idempotent,
/// and safe to run from several processes at once.
pub async fn migrate(pool: &PgPool, table: &TableName) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    // "column already exists, skipping" notices are expected on every re-run; keep them quiet.
    sqlx::query("SET LOCAL client_min_messages = warning")
        .execute(&mut *tx)
        .await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATE_LOCK_KEY)
        .execute(&mut *tx)
        .await?;
    let statements = [
        format!(
            "CREATE TABLE IF NOT EXISTS {table} (
                id              bigserial PRIMARY KEY,
                tenant          text,
                aggregate_type  text        NOT NULL,
                aggregate_id    text        NOT NULL,
                event_type      text        NOT NULL,
                payload         jsonb,
                headers         jsonb       NOT NULL DEFAULT '{{}}',
                created_at      timestamptz NOT NULL DEFAULT now(),
                published_at    timestamptz,
                attempts        integer     NOT NULL DEFAULT 0,
                next_attempt_at timestamptz,
                last_error      text,
                dead_at         timestamptz
            )"
        ),
        // An application may have created the table with only its own columns: add Sluice's
        // bookkeeping columns to it.
        format!(
            "ALTER TABLE {table}
                ADD COLUMN IF NOT EXISTS headers         jsonb       NOT NULL DEFAULT '{{}}',
                ADD COLUMN IF NOT EXISTS created_at      timestamptz NOT NULL DEFAULT now(),
                ADD COLUMN IF NOT EXISTS published_at    timestamptz,
                ADD COLUMN IF NOT EXISTS attempts        integer     NOT NULL DEFAULT 0,
                ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz,
                ADD COLUMN IF NOT EXISTS last_error      text,
                ADD COLUMN IF NOT EXISTS dead_at         timestamptz"
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS \"{}_unsent_idx\" ON {table} (id)
                WHERE published_at IS NULL AND dead_at IS NULL",
            table.table()
        ),
        // For `ordering = "key"`: finding an earlier unsent row of the same key.
        format!(
            "CREATE INDEX IF NOT EXISTS \"{}_unsent_key_idx\" ON {table}
                (aggregate_type, aggregate_id, id) WHERE published_at IS NULL",
            table.table()
        ),
    ];
    for sql in &statements {
        sqlx::query(AssertSqlSafe(sql.as_str()))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
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
    // Built once from a validated table name (see `TableName`), hence `AssertSqlSafe`.
    claim_sql: Arc<str>,
    due_sql: Arc<str>,
    backlog_sql: Arc<str>,
    mark_sql: Arc<str>,
    reschedule_sql: Arc<str>,
    /// For [`OutboxStore::settle`].
    table: TableName,
}

impl PgOutbox {
    /// Inspects the table (it must exist, with a supported `payload` type) and prepares the
    /// statements.
    pub async fn new(
        pool: PgPool,
        table: TableName,
        options: StoreOptions,
    ) -> Result<Self, StoreError> {
        let kind = payload_kind(&pool, &table).await?;
        let mark = options.mark;
        // Unsent, not dead, due, not of a paused tenant ($1), and — in key order — not behind
        // an earlier unsent row of its key.
        let due = format!(
            "o.published_at IS NULL AND o.dead_at IS NULL
                AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())
                AND NOT (COALESCE(o.tenant::text, 'default') = ANY($1::text[]))
                {key_order}",
            key_order = key_order_filter(&table, options.ordering, options.after_dead),
        );
        let claim_sql = format!(
            "SELECT o.id, o.tenant::text AS tenant, o.aggregate_type::text AS aggregate_type,
                    o.aggregate_id::text AS aggregate_id, o.event_type::text AS event_type,
                    {payload} AS payload, COALESCE(o.headers::text, '{{}}') AS headers,
                    o.created_at, o.attempts
               FROM {table} AS o
              WHERE {due}
              ORDER BY o.id
              LIMIT $2
                FOR UPDATE OF o SKIP LOCKED",
            payload = kind.select_expr(),
        );
        let due_sql = format!("SELECT EXISTS (SELECT 1 FROM {table} AS o WHERE {due})");
        let mark_sql = match mark {
            MarkMode::Delete => format!("DELETE FROM {table} WHERE id = ANY($1)"),
            MarkMode::PublishedAt => {
                format!("UPDATE {table} SET published_at = now() WHERE id = ANY($1)")
            }
        };
        let reschedule_sql = format!(
            "UPDATE {table} AS o
                SET attempts = o.attempts + f.counted::int,
                    last_error = f.error,
                    next_attempt_at = CASE WHEN f.dead THEN NULL
                                      ELSE now() + f.delay_ms * interval '1 millisecond' END,
                    dead_at = CASE WHEN f.dead THEN now() END
               FROM unnest($1::int8[], $2::text[], $3::int8[], $4::bool[], $5::bool[])
                    AS f(id, error, delay_ms, dead, counted)
              WHERE o.id = f.id"
        );
        Ok(Self {
            pool,
            mark,
            claim_sql: claim_sql.into(),
            due_sql: due_sql.into(),
            backlog_sql: format!(
                "SELECT count(*) FILTER (WHERE dead_at IS NULL
                                           AND (next_attempt_at IS NULL OR next_attempt_at <= now())),
                        count(*) FILTER (WHERE dead_at IS NULL AND next_attempt_at > now()),
                        count(*) FILTER (WHERE dead_at IS NOT NULL)
                   FROM {table} WHERE published_at IS NULL"
            )
            .into(),
            mark_sql: mark_sql.into(),
            reschedule_sql: reschedule_sql.into(),
            table,
        })
    }

    pub fn mark_mode(&self) -> MarkMode {
        self.mark
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

/// Unsent rows of the outbox, by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Claimable now (not counting locks and paused tenants).
    pub due: i64,
    /// Waiting for a retry (`next_attempt_at` in the future).
    pub waiting: i64,
    pub dead: i64,
}

async fn payload_kind(pool: &PgPool, table: &TableName) -> Result<PayloadKind, StoreError> {
    let found: Option<String> = sqlx::query_scalar(
        "SELECT format_type(a.atttypid, NULL)
           FROM pg_attribute a
          WHERE a.attrelid = to_regclass($1) AND a.attname = 'payload' AND NOT a.attisdropped",
    )
    .bind(table.to_string())
    .fetch_optional(pool)
    .await?;
    let found = found.unwrap_or_else(|| "(missing; run `sluice migrate`)".to_owned());
    PayloadKind::from_type_name(&found).ok_or_else(|| StoreError::Schema {
        table: table.to_string(),
        column: "payload".into(),
        found,
    })
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
            match decode_row(row) {
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
    use std::collections::HashSet;

    use sqlx::{Acquire, AssertSqlSafe, PgConnection};

    use super::{PgOutbox, int_keys};
    use crate::outbox::{BatchOutcome, Disposition, OutboxId, RowFailure, Settlement, StoreError};
    use crate::text::{MAX_STORED, bounded};

    /// A statement that changed nothing about a row it was given.
    const UNCHANGED: &str = "the statement changed no row (a trigger or rule suppressed it)";

    pub(super) async fn settle(
        store: &PgOutbox,
        outcome: &BatchOutcome,
    ) -> Result<Settlement, StoreError> {
        let mut settlement = Settlement::default();
        let wanted = int_keys(
            outcome
                .sent
                .iter()
                .chain(outcome.failed.iter().map(|f| &f.id)),
        )?;
        if wanted.is_empty() {
            return Ok(settlement);
        }
        let lock_sql = format!(
            "SELECT id FROM {} WHERE id = ANY($1::int8[])
                AND published_at IS NULL AND dead_at IS NULL
                FOR UPDATE SKIP LOCKED",
            store.table
        );
        let mark_sql = format!("{} RETURNING id", store.mark_sql);
        let reschedule_sql = format!("{} RETURNING o.id", store.reschedule_sql);

        let mut tx = store.pool.begin().await?;
        let locked: HashSet<i64> = sqlx::query_scalar::<_, i64>(AssertSqlSafe(lock_sql))
            .bind(&wanted)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect();
        settlement.skipped = wanted
            .iter()
            .filter(|id| !locked.contains(id))
            .map(|id| OutboxId::Int(*id))
            .collect();
        let sent: Vec<i64> = int_keys(outcome.sent.iter())?
            .into_iter()
            .filter(|id| locked.contains(id))
            .collect();
        let failed: Vec<(i64, &RowFailure)> = outcome
            .failed
            .iter()
            .filter_map(|f| match f.id {
                OutboxId::Int(id) if locked.contains(&id) => Some((id, f)),
                _ => None,
            })
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
                let ids: Vec<i64> = failed.iter().map(|(id, _)| *id).collect();
                sort(&mut settlement, &ids, &rescheduled, Target::Rescheduled);
            }
            Err(e) => {
                all.rollback().await?;
                tracing::warn!(error = %e, "recording the batch's rows together failed; recording them one by one");
                for id in sent {
                    let mut one = Acquire::begin(&mut tx).await?;
                    let done = mark(&mut one, &mark_sql, &[id]).await;
                    settle_one(&mut settlement, id, done, one, Target::Marked).await?;
                }
                for (id, failure) in failed {
                    let mut one = Acquire::begin(&mut tx).await?;
                    let done = reschedule(&mut one, &reschedule_sql, &[(id, failure)]).await;
                    settle_one(&mut settlement, id, done, one, Target::Rescheduled).await?;
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
    fn sort(settlement: &mut Settlement, given: &[i64], changed: &[i64], target: Target) {
        let changed: HashSet<i64> = changed.iter().copied().collect();
        for id in given {
            if changed.contains(id) {
                let list = match target {
                    Target::Marked => &mut settlement.marked,
                    Target::Rescheduled => &mut settlement.rescheduled,
                };
                list.push(OutboxId::Int(*id));
            } else {
                settlement
                    .refused
                    .push((OutboxId::Int(*id), UNCHANGED.to_owned()));
            }
        }
    }

    /// Keeps one row's change (releasing its savepoint) or undoes it and files it as refused.
    async fn settle_one(
        settlement: &mut Settlement,
        id: i64,
        done: Result<Vec<i64>, sqlx::Error>,
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
                settlement.refused.push((OutboxId::Int(id), e.to_string()));
            }
        }
        Ok(())
    }

    async fn mark(
        conn: &mut PgConnection,
        sql: &str,
        ids: &[i64],
    ) -> Result<Vec<i64>, sqlx::Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
            .bind(ids)
            .fetch_all(conn)
            .await
    }

    async fn reschedule(
        conn: &mut PgConnection,
        sql: &str,
        failed: &[(i64, &RowFailure)],
    ) -> Result<Vec<i64>, sqlx::Error> {
        if failed.is_empty() {
            return Ok(Vec::new());
        }
        let millis = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let mut ids = Vec::with_capacity(failed.len());
        let mut errors = Vec::with_capacity(failed.len());
        let mut delays = Vec::with_capacity(failed.len());
        let mut dead = Vec::with_capacity(failed.len());
        let mut counted = Vec::with_capacity(failed.len());
        for (id, f) in failed {
            let (delay, is_dead, counts) = match f.disposition {
                Disposition::Retry(d) => (millis(d), false, true),
                Disposition::Dead => (0, true, true),
                Disposition::Wait(d) => (millis(d), false, false),
            };
            ids.push(*id);
            errors.push(bounded(&f.error, MAX_STORED).into_owned());
            delays.push(delay);
            dead.push(is_dead);
            counted.push(counts);
        }
        sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
            .bind(&ids)
            .bind(&errors)
            .bind(&delays)
            .bind(&dead)
            .bind(&counted)
            .fetch_all(conn)
            .await
    }
}

fn decode_row(row: &PgRow) -> Result<OutboxRow, RowFailure> {
    let id = OutboxId::Int(row.try_get("id").map_err(|e| RowFailure {
        id: OutboxId::Int(0),
        error: e.to_string(),
        disposition: Disposition::Dead,
    })?);
    // A row that cannot be decoded will not decode on retry either: dead-letter it with the
    // reason, to be fixed and replayed.
    let fail = |error: String| RowFailure {
        id: id.clone(),
        error,
        disposition: Disposition::Dead,
    };
    let column_err = |e: sqlx::Error| fail(format!("cannot decode row: {e}"));
    let headers_text: String = row.try_get("headers").map_err(column_err)?;
    Ok(OutboxRow {
        id: id.clone(),
        tenant: TenantId::from_column(row.try_get("tenant").map_err(column_err)?),
        aggregate_type: row.try_get("aggregate_type").map_err(column_err)?,
        aggregate_id: row.try_get("aggregate_id").map_err(column_err)?,
        event_type: row.try_get("event_type").map_err(column_err)?,
        payload: row
            .try_get::<Option<Vec<u8>>, _>("payload")
            .map_err(column_err)?
            .unwrap_or_default(),
        headers: parse_headers(&headers_text).map_err(fail)?,
        created_at: row.try_get("created_at").map_err(column_err)?,
        attempts: row.try_get("attempts").map_err(column_err)?,
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

/// A claimed batch: the open transaction holding the row locks.
pub struct PgBatch {
    tx: Transaction<'static, Postgres>,
    mark_sql: Arc<str>,
    reschedule_sql: Arc<str>,
}

impl ClaimedBatch for PgBatch {
    async fn complete(mut self, outcome: BatchOutcome) -> Result<(), StoreError> {
        if !outcome.sent.is_empty() {
            let ids = int_keys(outcome.sent.iter())?;
            let affected = sqlx::query(AssertSqlSafe(Arc::clone(&self.mark_sql)))
                .bind(&ids)
                .execute(&mut *self.tx)
                .await?
                .rows_affected();
            check_count(ids.len(), affected)?;
        }
        if !outcome.failed.is_empty() {
            let ids = int_keys(outcome.failed.iter().map(|f| &f.id))?;
            let errors: Vec<String> = outcome
                .failed
                .iter()
                .map(|f| truncate(&f.error, MAX_ERROR_LEN))
                .collect();
            let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
            let mut delays = Vec::with_capacity(ids.len());
            let mut dead = Vec::with_capacity(ids.len());
            let mut counted = Vec::with_capacity(ids.len());
            for f in &outcome.failed {
                let (delay, is_dead, counts) = match f.disposition {
                    Disposition::Retry(d) => (millis(d), false, true),
                    Disposition::Dead => (0, true, true),
                    Disposition::Wait(d) => (millis(d), false, false),
                };
                delays.push(delay);
                dead.push(is_dead);
                counted.push(counts);
            }
            let affected = sqlx::query(AssertSqlSafe(Arc::clone(&self.reschedule_sql)))
                .bind(&ids)
                .bind(&errors)
                .bind(&delays)
                .bind(&dead)
                .bind(&counted)
                .execute(&mut *self.tx)
                .await?
                .rows_affected();
            check_count(ids.len(), affected)?;
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

/// The integer keys of `ids` (this store claims only `int8` keys).
fn int_keys<'a>(ids: impl Iterator<Item = &'a OutboxId>) -> Result<Vec<i64>, StoreError> {
    ids.map(|id| match id {
        OutboxId::Int(id) => Ok(*id),
        OutboxId::Text(text) => Err(StoreError::Schema {
            table: String::new(),
            column: "id".into(),
            found: format!("non-integer key {text:?}"),
        }),
    })
    .collect()
}

fn check_count(expected: usize, affected: u64) -> Result<(), StoreError> {
    let expected = expected as u64;
    if expected == affected {
        Ok(())
    } else {
        Err(StoreError::MarkMismatch { expected, affected })
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn payload_types_map_to_kinds() {
        assert_eq!(
            PayloadKind::from_type_name("jsonb"),
            Some(PayloadKind::Json)
        );
        assert_eq!(
            PayloadKind::from_type_name("bytea"),
            Some(PayloadKind::Bytes)
        );
        assert_eq!(PayloadKind::from_type_name("text"), Some(PayloadKind::Text));
        assert_eq!(PayloadKind::from_type_name("integer"), None);
    }

    #[test]
    fn long_errors_are_truncated_on_a_char_boundary() {
        let s = "é".repeat(10);
        let t = truncate(&s, 5);
        assert!(t.ends_with('…'));
        assert!(t.len() <= 5 + '…'.len_utf8());
    }
}
