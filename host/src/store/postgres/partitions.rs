//! Partitioned outbox tables on PostgreSQL: reading how a table is partitioned, the table
//! `sluice migrate --partitioned` creates (primary key `(id, created_at)`, `PARTITION BY RANGE
//! (created_at)`, a DEFAULT partition, the interval in the table's comment), the partitions
//! made ahead, and `relay.retention_mode = "drop-partitions"`: a partition wholly older than
//! the retention whose every row was sent before the retention is detached and dropped, the
//! last check made under a lock that keeps any row from slipping in or changing.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection, Row};

use crate::store::layout_sql::LayoutSql;
use crate::store::partitioning::{PartitionInterval, PartitionRound, Partitioning};
use crate::store::schema::TimeKind;
use crate::store::{StoreError, TableName};

/// How long dropping a partition waits for the table's lock (held by batches in flight)
/// before it gives up until the next round: a waiting `ACCESS EXCLUSIVE` request queues every
/// claim and insert behind it.
const LOCK_TIMEOUT: &str = "2s";
/// The longest table name `--partitioned` takes: partition names add up to 12 bytes
/// (`_p20261206_15`) and PostgreSQL cuts names at 63.
const MAX_TABLE_NAME: usize = 50;

/// How `table` is partitioned; `None` when it is not (or does not exist). `created_at`: the
/// mapped column name.
pub(super) async fn read<'e, E>(
    executor: E,
    table: &TableName,
    created_at: &str,
) -> Result<Option<Partitioning>, StoreError>
where
    E: Executor<'e, Database = sqlx::Postgres>,
{
    let row = sqlx::query(
        "SELECT pt.partstrat = 'r' AND pt.partnatts = 1 AND a.attname = $2 AS by_created_at,
                obj_description(pt.partrelid, 'pg_class') AS comment
           FROM pg_partitioned_table pt
           LEFT JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0]
          WHERE pt.partrelid = to_regclass($1)",
    )
    .bind(table.to_string())
    .bind(created_at)
    .fetch_optional(executor)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let comment: Option<String> = row.try_get("comment")?;
    Ok(Some(Partitioning {
        by_created_at: row
            .try_get::<Option<bool>, _>("by_created_at")?
            .unwrap_or(false),
        interval: comment.as_deref().and_then(PartitionInterval::from_comment),
    }))
}

/// `CREATE TABLE` of `create` (Sluice's table, [`crate::store::ddl::create_table`]) turned
/// into the partitioned one: the id a `bigserial` without a key of its own, the primary key
/// `(id, created_at)`, `PARTITION BY RANGE (created_at)`.
pub(super) fn partitioned_create(create: &str, id: &str, created_at: &str) -> String {
    let body = create.strip_suffix(')').unwrap_or(create);
    let body = body.replacen(
        &format!("{id} bigserial PRIMARY KEY"),
        &format!("{id} bigserial NOT NULL"),
        1,
    );
    format!("{body}, PRIMARY KEY ({id}, {created_at})) PARTITION BY RANGE ({created_at})")
}

/// Whether `table` has a partition other than its DEFAULT one.
pub(super) async fn has_ranged_partitions(
    conn: &mut PgConnection,
    table: &TableName,
) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                         WHERE i.inhparent = to_regclass($1)
                           AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT')",
    )
    .bind(table.to_string())
    .fetch_one(conn)
    .await?)
}

/// Refuses what `sluice migrate --partitioned interval` cannot set up: a table that exists
/// without being partitioned by `created_at`, a name too long for its partitions' names, a
/// table whose partitions something else makes (`made_elsewhere`: partitions, but not
/// Sluice's comment — pg_partman, a script: Sluice's partitions, named its own way, would
/// overlap theirs, and whichever comes second fails for ever), a table set up with another
/// interval (hourly partitions inside daily ones).
pub(super) fn check_migratable(
    table: &TableName,
    existing: Option<&Partitioning>,
    exists: bool,
    made_elsewhere: bool,
    interval: PartitionInterval,
) -> Result<(), StoreError> {
    let refuse = |message: String| StoreError::Partitions {
        table: table.to_string(),
        message,
    };
    if table.table().len() > MAX_TABLE_NAME {
        return Err(refuse(format!(
            "--partitioned takes table names of at most {MAX_TABLE_NAME} bytes (partition names \
             add a suffix such as _p20261206_15)"
        )));
    }
    match existing {
        Some(p) if !p.by_created_at => Err(refuse(
            "is partitioned, but not by RANGE on created_at alone: --partitioned cannot manage it"
                .into(),
        )),
        Some(p) if p.interval.is_none() && made_elsewhere => Err(refuse(
            "is partitioned already, and its partitions are made by something else (pg_partman, \
             a script): --partitioned would make partitions of its own beside them, which \
             overlap theirs. Run `sluice migrate` without --partitioned; whoever makes the \
             partitions keeps doing so (see docs/operations.md, \"Partitioned outbox tables\")"
                .into(),
        )),
        Some(Partitioning {
            interval: Some(set_up),
            ..
        }) if *set_up != interval => Err(refuse(format!(
            "was set up --partitioned {set_up}: its partitions cannot be cut {interval} as well \
             (they would overlap); run --partitioned {set_up}"
        ))),
        None if exists => Err(refuse(
            "exists and is not partitioned: --partitioned creates a new table; PostgreSQL \
             cannot partition an existing one in place (see docs/operations.md, \"Partitioned \
             outbox tables\", for moving to one)"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// A time as a partition bound literal of the `created_at` column's type (UTC).
fn bound(time: DateTime<Utc>, kind: TimeKind) -> String {
    match kind {
        TimeKind::WithZone => time.format("'%Y-%m-%d %H:%M:%S+00'").to_string(),
        TimeKind::WithoutZone => time.format("'%Y-%m-%d %H:%M:%S'").to_string(),
    }
}

/// The quoted name of `table`'s partition with `suffix`, in the table's schema.
fn partition_name(table: &TableName, suffix: &str) -> String {
    let name = format!("{}{suffix}", table.table());
    match table.schema() {
        Some(schema) => format!("\"{schema}\".\"{name}\""),
        None => format!("\"{name}\""),
    }
}

/// The DEFAULT partition `--partitioned` creates: rows outside every partition made so far
/// land there rather than failing the application's insert. It is never dropped.
pub(super) fn default_partition(sql: &LayoutSql) -> String {
    let table = &sql.layout.table;
    format!(
        "CREATE TABLE IF NOT EXISTS {} PARTITION OF {} DEFAULT",
        partition_name(table, "_default"),
        sql.table
    )
}

/// Makes the partition `now` falls in and `interval.ahead()` after it, each its own statement
/// so one that cannot be made (another partition covers its range, or the DEFAULT partition
/// holds rows of it) does not keep the others; returns the names made and logs the others.
pub(super) async fn premake(
    conn: &mut PgConnection,
    sql: &LayoutSql,
    interval: PartitionInterval,
    now: DateTime<Utc>,
) -> Result<Vec<String>, StoreError> {
    let table = &sql.layout.table;
    let existing: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
          WHERE i.inhparent = to_regclass($1)",
    )
    .bind(table.to_string())
    .fetch_all(&mut *conn)
    .await?;
    let mut created = Vec::new();
    let start = interval.floor(now);
    for k in 0..=interval.ahead() {
        let from = start + interval.length() * k;
        let suffix = interval.suffix(from);
        if existing.contains(&format!("{}{suffix}", table.table())) {
            continue;
        }
        let name = partition_name(table, &suffix);
        let kind = sql.layout.created_at_kind;
        let statement = format!(
            "CREATE TABLE {name} PARTITION OF {parent} FOR VALUES FROM ({from}) TO ({to})",
            parent = sql.table,
            from = bound(from, kind),
            to = bound(from + interval.length(), kind),
        );
        // Its own transaction (a savepoint inside `sluice migrate`'s), so a refusal leaves
        // the others to be made.
        let mut one = conn.begin().await?;
        match one.execute(AssertSqlSafe(statement)).await {
            Ok(_) => {
                one.commit().await?;
                created.push(name);
            }
            // A partition of another name covers the range, or the DEFAULT partition holds
            // rows of it: leave it to the operator, and go on with the next.
            Err(sqlx::Error::Database(e)) => {
                one.rollback().await?;
                tracing::warn!(
                    table = %table,
                    partition = %name,
                    error = %e,
                    "cannot make a partition ahead (rows of its range in the DEFAULT partition \
                     must be moved to a partition of their own first; see docs/operations.md)"
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(created)
}

/// Detaches and drops each partition of the table whose range ends before `now() -
/// retention` and that holds no row that is unsent (due, waiting for a retry, held back), dead
/// or sent within the retention. Each drop is its own transaction: the advisory lock of the
/// table's pruner (`prune_lock`: the key), the table locked `ACCESS EXCLUSIVE` (at most
/// [`LOCK_TIMEOUT`]: in-flight batches finish first, and no row can be inserted into the
/// partition, claimed, replayed or marked until the drop commits), the check again, then
/// `DETACH PARTITION` and `DROP TABLE`.
pub(super) async fn drop_old(
    pool: &PgPool,
    sql: &LayoutSql,
    retention: Duration,
    prune_lock: i32,
    round: &mut PartitionRound,
) -> Result<(), StoreError> {
    let ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let cutoff = "now() - $2 * interval '1 millisecond'";
    let ends_before = match sql.layout.created_at_kind {
        TimeKind::WithZone => format!("upper_bound::timestamptz <= {cutoff}"),
        TimeKind::WithoutZone => {
            format!("upper_bound::timestamp <= ({cutoff}) AT TIME ZONE 'UTC'")
        }
    };
    // Leaf range partitions only (never the DEFAULT one, never a sub-partitioned one), whose
    // upper bound is a time (not MAXVALUE) before the cutoff.
    let list = format!(
        "SELECT name FROM (
             SELECT c.oid::regclass::text AS name,
                    substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''([^'']+)''\\)')
                        AS upper_bound
               FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = to_regclass($1) AND c.relkind = 'r'
         ) p
         WHERE upper_bound IS NOT NULL AND {ends_before}
         ORDER BY name"
    );
    // Names as PostgreSQL quotes them (schema-qualified unless on the search path).
    let candidates: Vec<String> = sqlx::query_scalar(AssertSqlSafe(list))
        .bind(sql.layout.table.to_string())
        .bind(ms)
        .fetch_all(pool)
        .await?;
    let table = sql.layout.table.to_string();
    for name in candidates {
        // First without locks, so a partition that must stay costs no lock. An operator may
        // have detached or dropped it since the list was read: it is no longer ours to drop.
        let mut conn = pool.acquire().await?;
        if !is_partition(&mut conn, &name, &table).await? {
            continue;
        }
        // Read straight from the partition: a partition another role made may refuse even
        // that.
        let holds = holds_rows(&mut conn, &name, ms).await;
        if holds.map_err(|e| not_owner(&table, &name, e))? {
            round.kept.push(name);
            continue;
        }
        drop(conn);
        let mut tx = pool.begin().await?;
        tx.execute(AssertSqlSafe(format!(
            "SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"
        )))
        .await?;
        let ours: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1, to_regclass($2)::oid::int)")
                .bind(prune_lock)
                .bind(sql.layout.table.to_string())
                .fetch_one(&mut *tx)
                .await?;
        if !ours {
            // Another relay's pruner is at it.
            tx.rollback().await?;
            return Ok(());
        }
        tx.execute(AssertSqlSafe(format!(
            "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
            sql.table
        )))
        .await?;
        // Under the lock nobody detaches it any more; check it is still attached.
        if !is_partition(&mut tx, &name, &table).await? {
            tx.rollback().await?;
            continue;
        }
        let holds = holds_rows(&mut tx, &name, ms).await;
        if holds.map_err(|e| not_owner(&table, &name, e))? {
            tx.rollback().await?;
            round.kept.push(name);
            continue;
        }
        for statement in [
            format!("ALTER TABLE {} DETACH PARTITION {name}", sql.table),
            format!("DROP TABLE {name}"),
        ] {
            if let Err(e) = tx.execute(AssertSqlSafe(statement)).await {
                return Err(not_owner(&table, &name, e.into()));
            }
        }
        tx.commit().await?;
        round.dropped.push(name);
    }
    Ok(())
}

/// Whether `partition` (as `drop_old` listed it) is still an attached partition of `table`:
/// not detached, dropped or being detached (`DETACH PARTITION … CONCURRENTLY`) meanwhile.
async fn is_partition(
    conn: &mut PgConnection,
    partition: &str,
    table: &str,
) -> Result<bool, StoreError> {
    // `inhdetachpending` is PostgreSQL 14's: read through jsonb so older servers answer too.
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_inherits i
                         WHERE i.inhrelid = to_regclass($1) AND i.inhparent = to_regclass($2)
                           AND NOT coalesce((to_jsonb(i) ->> 'inhdetachpending')::bool, false))",
    )
    .bind(partition)
    .bind(table)
    .fetch_one(conn)
    .await?)
}

/// A failed statement on `partition`: refused for want of ownership or a grant (SQLSTATE
/// 42501, the usual case: pg_partman or another role made the partition), said with what to
/// do; the relay goes on relaying and the next round tries again.
fn not_owner(table: &str, partition: &str, error: StoreError) -> StoreError {
    let denied = match &error {
        StoreError::Database(e) => e
            .as_database_error()
            .filter(|db| db.code().is_some_and(|code| code == "42501"))
            .map(|db| db.message().to_owned()),
        _ => None,
    };
    match denied {
        Some(said) => StoreError::Partitions {
            table: table.to_owned(),
            message: format!(
                "cannot drop partition {partition} (relay.retention_mode = \"drop-partitions\"): \
                 DETACH PARTITION needs the database user to own the table and DROP TABLE to own \
                 the partition (the database said: {said}). Run the relay as the owner of both \
                 (ALTER TABLE {partition} OWNER TO …), or use retention_mode = \"delete\"; the \
                 relay goes on relaying and tries again next round (see docs/databases.md#database-roles)"
            ),
        },
        None => error,
    }
}

/// Whether `partition` holds a row that must stay: unsent (due, waiting, held back), dead
/// (dead rows are unsent too), or sent within the retention (`$1` ms).
async fn holds_rows(
    conn: &mut PgConnection,
    partition: &str,
    retention_ms: i64,
) -> Result<bool, StoreError> {
    let text = format!(
        "SELECT EXISTS (SELECT 1 FROM {partition} AS o
                         WHERE o.published_at IS NULL
                            OR o.published_at >= now() - $1 * interval '1 millisecond')"
    );
    Ok(sqlx::query_scalar(AssertSqlSafe(text))
        .bind(retention_ms)
        .fetch_one(conn)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_created_table_is_keyed_by_id_and_created_at_and_partitioned_by_range() {
        let create = "CREATE TABLE IF NOT EXISTS \"outbox\" (\"id\" bigserial PRIMARY KEY, \
                      \"created_at\" timestamptz NOT NULL DEFAULT now(), \"dead_at\" timestamptz)";
        assert_eq!(
            partitioned_create(create, "\"id\"", "\"created_at\""),
            "CREATE TABLE IF NOT EXISTS \"outbox\" (\"id\" bigserial NOT NULL, \"created_at\" \
             timestamptz NOT NULL DEFAULT now(), \"dead_at\" timestamptz, PRIMARY KEY (\"id\", \
             \"created_at\")) PARTITION BY RANGE (\"created_at\")"
        );
    }

    #[test]
    fn existing_plain_tables_and_other_partitionings_are_refused() {
        let table = TableName::parse("outbox").unwrap();
        let daily = PartitionInterval::Daily;
        assert!(check_migratable(&table, None, false, false, daily).is_ok());
        let plain = check_migratable(&table, None, true, false, daily)
            .unwrap_err()
            .to_string();
        assert!(plain.contains("not partitioned"), "{plain}");
        let other = Partitioning {
            by_created_at: false,
            interval: None,
        };
        let err = check_migratable(&table, Some(&other), true, false, daily)
            .unwrap_err()
            .to_string();
        assert!(err.contains("RANGE on created_at"), "{err}");
        let long = TableName::parse(&"o".repeat(51)).unwrap();
        assert!(check_migratable(&long, None, false, false, daily).is_err());
        // Declared by hand with only a DEFAULT partition: Sluice may make the partitions.
        let declared = Partitioning {
            by_created_at: true,
            interval: None,
        };
        assert!(check_migratable(&table, Some(&declared), true, false, daily).is_ok());
        let ours = Partitioning {
            by_created_at: true,
            interval: Some(daily),
        };
        assert!(check_migratable(&table, Some(&ours), true, true, daily).is_ok());
        let err = check_migratable(&table, Some(&ours), true, true, PartitionInterval::Hourly)
            .unwrap_err()
            .to_string();
        assert!(err.contains("was set up --partitioned daily"), "{err}");
    }

    #[test]
    fn bounds_are_utc_literals_of_the_columns_type() {
        let t = DateTime::parse_from_rfc3339("2026-12-06T15:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(bound(t, TimeKind::WithZone), "'2026-12-06 15:00:00+00'");
        assert_eq!(bound(t, TimeKind::WithoutZone), "'2026-12-06 15:00:00'");
    }
}
