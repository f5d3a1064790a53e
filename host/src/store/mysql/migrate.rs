//! `sluice migrate` on MySQL/MariaDB: creating the outbox table, or upgrading one the
//! application created, and its indexes; then the same check `sluice run` makes.
//!
//! MySQL commits every DDL statement on its own, so nothing can be rolled back: the check runs
//! first, on the columns the table will have, and a table Sluice cannot use is refused before
//! anything is changed. A named lock (`GET_LOCK`) keeps concurrent runs apart.

use sqlx::mysql::{MySqlConnection, MySqlPool};
use sqlx::{AssertSqlSafe, Executor};

use super::schema::{self, MyTypes};
use crate::store::columns;
use crate::store::schema::{ColumnTypes, FoundColumn, Layout};
use crate::store::{ColumnName, StoreError, TableSpec, TenantColumn};

/// The server-wide named lock serialising `sluice migrate` runs on one table.
const MIGRATE_LOCK: &str =
    "CONCAT('sluice_migrate_', LEFT(SHA2(CONCAT(DATABASE(), '.', ?), 256), 40))";
/// How long to wait for another `sluice migrate` of the same table.
const MIGRATE_LOCK_WAIT_SECS: i64 = 60;
/// MySQL's longest identifier.
const MAX_IDENTIFIER: usize = 64;
/// Characters of a long text column that go into an index (191 × 4 bytes of utf8mb4 keep two
/// of them and the other key parts under InnoDB's 3072-byte limit).
const INDEX_PREFIX: u32 = 191;

/// Creates or upgrades the table and its indexes (see the module documentation).
pub(super) async fn migrate(pool: &MySqlPool, spec: &TableSpec) -> Result<Layout, StoreError> {
    let mut conn = pool.acquire().await?;
    let table = spec.name.quoted_with('`');
    let locked: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT CAST(GET_LOCK({MIGRATE_LOCK}, ?) AS SIGNED)"
    )))
    .bind(&table)
    .bind(MIGRATE_LOCK_WAIT_SECS)
    .fetch_one(&mut *conn)
    .await?;
    if locked != Some(1) {
        return Err(StoreError::Database(sqlx::Error::Protocol(format!(
            "another `sluice migrate` of {table} did not finish within {MIGRATE_LOCK_WAIT_SECS} s"
        ))));
    }
    let migrated = migrate_locked(&mut conn, spec).await;
    let released = sqlx::query(AssertSqlSafe(format!("DO RELEASE_LOCK({MIGRATE_LOCK})")))
        .bind(&table)
        .execute(&mut *conn)
        .await;
    let layout = migrated?;
    released?;
    Ok(layout)
}

async fn migrate_locked(
    conn: &mut MySqlConnection,
    spec: &TableSpec,
) -> Result<Layout, StoreError> {
    let found = schema::read_columns(&mut *conn, &spec.name).await?;
    if found.is_empty() {
        run(&mut *conn, create_table_sql(spec)).await?;
    } else {
        let additions = additions(spec, &found);
        // Refused: nothing was changed.
        let mut planned = found.clone();
        planned.extend(additions.iter().map(|(column, _)| column.clone()));
        schema::check(spec, &planned)?;
        if !additions.is_empty() {
            let clauses: Vec<&str> = additions.iter().map(|(_, sql)| sql.as_str()).collect();
            run(
                &mut *conn,
                format!(
                    "ALTER TABLE {}\n    {}",
                    spec.name.quoted_with('`'),
                    clauses.join(",\n    ")
                ),
            )
            .await?;
        }
    }
    let found = schema::read_columns(&mut *conn, &spec.name).await?;
    let layout = schema::check(spec, &found)?;
    for (name, sql) in index_sql(&layout, &found) {
        let exists: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.STATISTICS
              WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?
                AND INDEX_NAME = ?",
        )
        .bind(layout.table.schema())
        .bind(layout.table.table())
        .bind(&name)
        .fetch_one(&mut *conn)
        .await?;
        if exists == 0 {
            run(&mut *conn, sql).await?;
        }
    }
    Ok(layout)
}

async fn run(conn: &mut MySqlConnection, sql: String) -> Result<(), StoreError> {
    conn.execute(AssertSqlSafe(sql)).await?;
    Ok(())
}

fn q(column: &ColumnName) -> String {
    column.quoted_with('`')
}

/// `CREATE TABLE IF NOT EXISTS` with the mapped column names and Sluice's types.
fn create_table_sql(spec: &TableSpec) -> String {
    let c = &spec.columns;
    let tenant = match &c.tenant {
        TenantColumn::IfPresent(t) | TenantColumn::Named(t) => {
            format!("{} VARCHAR(255) NULL,", q(t))
        }
        TenantColumn::None => String::new(),
    };
    // A configured order column other than the id: MySQL allows one AUTO_INCREMENT column
    // per table (the id), so the application fills it.
    let order = match &c.order {
        Some(order) if *order != c.id => format!("{} BIGINT NOT NULL,", q(order)),
        _ => String::new(),
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
            {id}            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
            {tenant}
            {at}            VARCHAR(255) NOT NULL,
            {ai}            VARCHAR(255) NOT NULL,
            {et}            VARCHAR(255) NOT NULL,
            {payload}       JSON         NULL,
            {headers}       JSON         NOT NULL DEFAULT ('{{}}'),
            {created_at}    DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
            {order}
            published_at    DATETIME(6)  NULL,
            attempts        INT          NOT NULL DEFAULT 0,
            next_attempt_at DATETIME(6)  NULL,
            last_error      TEXT         NULL,
            dead_at         DATETIME(6)  NULL
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        table = spec.name.quoted_with('`'),
        id = q(&c.id),
        at = q(&c.aggregate_type),
        ai = q(&c.aggregate_id),
        et = q(&c.event_type),
        payload = q(&c.payload),
        headers = q(&c.headers),
        created_at = q(&c.created_at),
    )
}

/// What an application's own table lacks, as the column it will be (for the check) and the
/// `ALTER TABLE` clause that adds it. Existing rows get `{}` headers, the time of the
/// migration as `created_at`, and — for a new order column — numbers in primary-key order.
fn additions(spec: &TableSpec, found: &[FoundColumn]) -> Vec<(FoundColumn, String)> {
    let c = &spec.columns;
    let column = |name: &str, base: &str, not_null: bool| FoundColumn {
        name: name.to_owned(),
        shown: base.to_owned(),
        base: base.to_owned(),
        bounded: false,
        not_null,
        unique: false,
    };
    let mut wanted = vec![
        (
            column(c.headers.as_str(), "json", true),
            format!(
                "ADD COLUMN {} JSON NOT NULL DEFAULT ('{{}}')",
                q(&c.headers)
            ),
        ),
        (
            column(c.created_at.as_str(), "datetime", true),
            format!(
                "ADD COLUMN {} DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))",
                q(&c.created_at)
            ),
        ),
        (
            column(columns::PUBLISHED_AT, "datetime", false),
            "ADD COLUMN published_at DATETIME(6) NULL".to_owned(),
        ),
        (
            column(columns::ATTEMPTS, "int", true),
            "ADD COLUMN attempts INT NOT NULL DEFAULT 0".to_owned(),
        ),
        (
            column(columns::NEXT_ATTEMPT_AT, "datetime", false),
            "ADD COLUMN next_attempt_at DATETIME(6) NULL".to_owned(),
        ),
        (
            column(columns::LAST_ERROR, "text", false),
            "ADD COLUMN last_error TEXT NULL".to_owned(),
        ),
        (
            column(columns::DEAD_AT, "datetime", false),
            "ADD COLUMN dead_at DATETIME(6) NULL".to_owned(),
        ),
    ];
    if let Some(order) = schema::order_column_to_add(spec, found) {
        wanted.push((
            column(order.as_str(), "bigint", true),
            format!(
                "ADD COLUMN {o} BIGINT NOT NULL AUTO_INCREMENT, ADD UNIQUE KEY {key} ({o})",
                o = q(&order),
                key = index_name(spec.name.table(), &format!("_{}_key", order.as_str())),
            ),
        ));
    }
    wanted.retain(|(column, _)| !found.iter().any(|f| f.name == column.name));
    wanted
}

/// `table` + `suffix`, shortened to MySQL's identifier limit (with a hash of the table name,
/// so two long names stay apart), quoted.
fn index_name(table: &str, suffix: &str) -> String {
    let name = if table.len() + suffix.len() <= MAX_IDENTIFIER {
        format!("{table}{suffix}")
    } else {
        use sha2::{Digest, Sha256};
        let hash = Sha256::digest(table.as_bytes());
        let hex: String = hash.iter().take(4).map(|b| format!("{b:02x}")).collect();
        let keep = MAX_IDENTIFIER - suffix.len() - hex.len() - 1;
        format!("{}_{hex}{suffix}", &table[..keep.min(table.len())])
    };
    format!("`{name}`")
}

/// A key part for `column`: long text columns by a prefix.
fn key_part(found: &[FoundColumn], column: &ColumnName) -> String {
    let long = found
        .iter()
        .find(|c| c.name == column.as_str())
        .is_some_and(|c| {
            let length: Option<u32> = c
                .shown
                .split_once('(')
                .and_then(|(_, rest)| rest.split(')').next())
                .and_then(|n| n.trim().parse().ok());
            match c.base.as_str() {
                "char" | "varchar" => length.is_none_or(|n| n > INDEX_PREFIX),
                b => MyTypes::is_string(c) && !MyTypes::is_int(c) && b != "uuid",
            }
        });
    if long {
        format!("{}({INDEX_PREFIX})", q(column))
    } else {
        q(column)
    }
}

/// The indexes on unsent rows (MySQL has no partial indexes: `published_at` and `dead_at`
/// lead, so the claim reads only unsent rows, in claim order), one per key for
/// `ordering = "key"`. Each as (unquoted name, statement).
fn index_sql(layout: &Layout, found: &[FoundColumn]) -> Vec<(String, String)> {
    let order_columns = if layout.ordered_by_id() {
        q(&layout.id)
    } else {
        format!("{}, {}", q(&layout.order), q(&layout.id))
    };
    let suffix = match layout.order.as_str() {
        "id" => String::new(),
        other => format!("_{other}"),
    };
    let table = layout.table.quoted_with('`');
    let unsent = index_name(layout.table.table(), &format!("_unsent{suffix}_idx"));
    let key = index_name(layout.table.table(), &format!("_unsent_key{suffix}_idx"));
    vec![
        (
            unsent.trim_matches('`').to_owned(),
            format!("CREATE INDEX {unsent} ON {table} (published_at, dead_at, {order_columns})"),
        ),
        (
            key.trim_matches('`').to_owned(),
            format!(
                "CREATE INDEX {key} ON {table} ({at}, {ai}, published_at, {order_columns})",
                at = key_part(found, &layout.aggregate_type),
                ai = key_part(found, &layout.aggregate_id),
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ColumnMap, TableName};

    fn squash(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    fn found(name: &str, shown: &str) -> FoundColumn {
        FoundColumn {
            name: name.into(),
            shown: shown.into(),
            base: shown.split('(').next().unwrap_or_default().into(),
            bounded: false,
            not_null: true,
            unique: name == "id",
        }
    }

    #[test]
    fn an_application_table_gets_only_what_it_lacks() {
        let spec = TableSpec {
            name: TableName::parse("outboxevent").unwrap(),
            columns: ColumnMap {
                aggregate_type: ColumnName::parse("aggregatetype").unwrap(),
                tenant: TenantColumn::None,
                ..ColumnMap::default()
            },
        };
        let table = [
            found("id", "char(36)"),
            found("aggregatetype", "varchar(255)"),
            found("aggregate_id", "varchar(255)"),
            found("event_type", "varchar(255)"),
            found("payload", "longtext"),
            found("headers", "longtext"),
        ];
        let clauses: Vec<String> = additions(&spec, &table)
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        let all = clauses.join(", ");
        assert!(!all.contains("`headers`"), "{all}");
        assert!(all.contains("ADD COLUMN `created_at` DATETIME(6)"), "{all}");
        assert!(
            all.contains("ADD COLUMN `sluice_seq` BIGINT NOT NULL AUTO_INCREMENT, ADD UNIQUE KEY `outboxevent_sluice_seq_key` (`sluice_seq`)"),
            "{all}"
        );
        let create = squash(&create_table_sql(&spec));
        assert!(
            create.contains("`aggregatetype` VARCHAR(255) NOT NULL"),
            "{create}"
        );
        assert!(!create.contains("tenant"), "{create}");
    }

    #[test]
    fn long_names_are_shortened_and_long_texts_indexed_by_prefix() {
        let long = "t".repeat(63);
        let name = index_name(&long, "_unsent_key_sluice_seq_idx");
        assert!(name.len() <= MAX_IDENTIFIER + 2, "{name}");
        assert!(name.ends_with("_unsent_key_sluice_seq_idx`"), "{name}");
        assert_ne!(
            name,
            index_name(&"u".repeat(63), "_unsent_key_sluice_seq_idx")
        );
        let cols = [
            found("a", "varchar(100)"),
            found("b", "varchar(1024)"),
            found("c", "text"),
        ];
        let col = |n: &str| ColumnName::parse(n).unwrap();
        assert_eq!(key_part(&cols, &col("a")), "`a`");
        assert_eq!(key_part(&cols, &col("b")), "`b`(191)");
        assert_eq!(key_part(&cols, &col("c")), "`c`(191)");
    }
}
