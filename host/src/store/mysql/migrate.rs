//! `sluice migrate` on MySQL/MariaDB: creating the outbox table, or upgrading one the
//! application created, and its indexes (the statements: [`crate::store::ddl`]); then the same
//! check `sluice run` makes.
//!
//! MySQL commits every DDL statement on its own, so nothing can be rolled back: the check runs
//! first, on the columns the table will have, and a table Sluice cannot use is refused before
//! anything is changed. A named lock (`GET_LOCK`) keeps concurrent runs apart.

use sqlx::mysql::{MySqlConnection, MySqlPool};
use sqlx::{AssertSqlSafe, Executor};

use super::schema::{self, MyTypes, TEXT_TYPES};
use crate::store::ddl::{self, DdlTypes};
use crate::store::dialect::Driver;
use crate::store::schema::{FoundColumn, Layout, check};
use crate::store::{ColumnName, StoreError, TableName, TableSpec};

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
/// The longest tenant column the tenant index holds whole: `relay.fair_share`'s walk is a
/// loose index scan (`GROUP BY` tenant), which MySQL does on whole columns only. 255 × 4 bytes
/// and the other key parts stay under the 3072-byte limit.
const TENANT_WHOLE: u32 = 255;

/// Existing rows get `{}` headers, the time of the migration as `created_at`, and — for a new
/// order column — numbers in primary-key order.
impl DdlTypes for MyTypes {
    const DIALECT: Driver = Driver::Mysql;
    const ID: &'static str = "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY";
    const STRING: &'static str = "VARCHAR(255)";
    const PAYLOAD: &'static str = "JSON";
    const HEADERS: &'static str = "JSON NOT NULL DEFAULT ('{}')";
    const CREATED_AT: &'static str = "DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))";
    /// MySQL allows one AUTO_INCREMENT column per table (the id), so the application fills it.
    const ORDER: &'static str = "BIGINT NOT NULL";
    const TIME: &'static str = "DATETIME(6)";
    const COUNT: &'static str = "INT NOT NULL DEFAULT 0";
    const TEXT: &'static str = "TEXT";
    const TABLE_OPTIONS: &'static str = " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";
}

/// Creates or upgrades the table and its indexes (see the module documentation); with
/// `tenant_index`, also the index `relay.fair_share` walks ([`ddl::tenant_index`]): only then,
/// as every index costs the application's inserts.
pub(super) async fn migrate(
    pool: &MySqlPool,
    spec: &TableSpec,
    tenant_index: bool,
) -> Result<Layout, StoreError> {
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
    let migrated = migrate_locked(&mut conn, spec, tenant_index).await;
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
    tenant_index: bool,
) -> Result<Layout, StoreError> {
    let found = schema::read_columns(&mut *conn, &spec.name).await?;
    if found.is_empty() {
        conn.execute(AssertSqlSafe(ddl::create_table::<MyTypes>(spec)))
            .await?;
    } else {
        let missing = ddl::missing_columns::<MyTypes>(spec, &found);
        let mut planned = found.clone();
        planned.extend(missing.iter().map(|(name, ty)| planned_column(name, ty)));
        // Refused: nothing was changed.
        check::<MyTypes>(spec, &planned)?;
        if !missing.is_empty() {
            conn.execute(AssertSqlSafe(add_columns(&spec.name, &missing)))
                .await?;
        }
    }
    let found = schema::read_columns(&mut *conn, &spec.name).await?;
    let layout = check::<MyTypes>(spec, &found)?;
    for (name, sql) in index_sql(&layout, &found, tenant_index) {
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
            conn.execute(AssertSqlSafe(sql)).await?;
        }
    }
    Ok(layout)
}

/// The column `name` of type `ty` as `information_schema` will list it (`DATETIME(6) NOT NULL
/// …`: a `datetime` that is not null), for the check before anything changes.
fn planned_column(name: &str, ty: &str) -> FoundColumn {
    let base = ty.split(['(', ' ']).next().unwrap_or_default();
    let base = base.to_ascii_lowercase();
    FoundColumn {
        name: name.to_owned(),
        shown: base.clone(),
        base,
        bounded: false,
        not_null: ty.contains("NOT NULL"),
        unique: false,
        unique_with: Vec::new(),
    }
}

/// [`ddl::add_columns`], with a unique key on an AUTO_INCREMENT column (the order column,
/// always the last): MySQL requires one.
fn add_columns(table: &TableName, missing: &[(String, &str)]) -> String {
    let mut sql = ddl::add_columns::<MyTypes>(table, missing);
    if let Some((order, _)) = missing.iter().find(|(_, ty)| ty.contains("AUTO_INCREMENT")) {
        let key = index_name(table.table(), &format!("_{order}_key"));
        sql += &format!(", ADD UNIQUE KEY `{key}` (`{order}`)");
    }
    sql
}

/// The statement creating the tenant index of `relay.fair_share`, for the refusal that asks
/// for it (`None` without a tenant column).
pub(super) fn tenant_index_sql(layout: &Layout, found: &[FoundColumn]) -> Option<String> {
    let name = index_name(layout.table.table(), &ddl::tenant_index(layout)?.suffix);
    let mut indexes = index_sql(layout, found, true).into_iter();
    indexes.find(|(n, _)| *n == name).map(|(_, sql)| sql)
}

/// `table` + `suffix`, shortened to MySQL's identifier limit (with a hash of the table name,
/// so two long names stay apart).
fn index_name(table: &str, suffix: &str) -> String {
    if table.len() + suffix.len() <= MAX_IDENTIFIER {
        return format!("{table}{suffix}");
    }
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(table.as_bytes());
    let hex: String = hash.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let keep = MAX_IDENTIFIER - suffix.len() - hex.len() - 1;
    format!("{}_{hex}{suffix}", &table[..keep.min(table.len())])
}

/// A key part for `column`: text columns longer than `whole` characters by a prefix.
fn key_part(found: &[FoundColumn], column: &ColumnName, whole: u32) -> String {
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
                "char" | "varchar" => length.is_none_or(|n| n > whole),
                b => TEXT_TYPES.contains(&b),
            }
        });
    let quoted = column.quoted_with('`');
    if long {
        format!("{quoted}({INDEX_PREFIX})")
    } else {
        quoted
    }
}

/// MySQL has no partial indexes: the bookkeeping columns an index's filter tests follow its
/// leading key parts, so it reads only unsent rows, in claim order. Each as (unquoted name,
/// statement). The dead rows' index would have the unsent rows' key parts (`dead_at` is one of
/// them) and is left out. With `tenant_index`, also the tenant index (whole tenant values up
/// to [`TENANT_WHOLE`] characters), in ascending order unlike PostgreSQL's: MariaDB does no
/// loose index scan on a descending key part.
fn index_sql(layout: &Layout, found: &[FoundColumn], tenant_index: bool) -> Vec<(String, String)> {
    let table = layout.table.quoted_with('`');
    let mut made: Vec<Vec<String>> = Vec::new();
    let mut indexes = Vec::new();
    let tenant = tenant_index.then(|| ddl::tenant_index(layout)).flatten();
    let all = ddl::indexes(layout).into_iter().map(|i| (i, INDEX_PREFIX));
    for (index, whole) in all.chain(tenant.map(|i| (i, TENANT_WHOLE))) {
        let parts: Vec<String> = index
            .leading
            .iter()
            .map(|c| key_part(found, c, whole))
            .chain(index.filter_columns.iter().map(|c| (*c).to_owned()))
            .chain(index.order.iter().map(|c| c.quoted_with('`')))
            .collect();
        if made.contains(&parts) {
            continue;
        }
        let name = index_name(layout.table.table(), &index.suffix);
        let sql = format!("CREATE INDEX `{name}` ON {table} ({})", parts.join(", "));
        indexes.push((name, sql));
        made.push(parts);
    }
    // The rows a replay made due and that are not sent yet, for its progress in `sluice
    // status`: rows without the marker are NULL in it, which a range scan skips.
    if layout.replay {
        let name = index_name(layout.table.table(), "_replay_idx");
        let sql = format!("CREATE INDEX `{name}` ON {table} (`replay_id`({INDEX_PREFIX}))");
        indexes.push((name, sql));
    }
    indexes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_layouts::{debezium_layout, squash};
    use crate::store::{ColumnMap, TenantColumn};

    fn found(name: &str, shown: &str) -> FoundColumn {
        FoundColumn {
            name: name.into(),
            shown: shown.into(),
            base: shown.split('(').next().unwrap_or_default().into(),
            bounded: false,
            not_null: true,
            unique: name == "id",
            unique_with: Vec::new(),
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
        let missing = ddl::missing_columns::<MyTypes>(&spec, &table);
        let planned: Vec<FoundColumn> = missing
            .iter()
            .map(|(name, ty)| planned_column(name, ty))
            .collect();
        assert_eq!(planned[0].name, "created_at");
        assert_eq!(
            (planned[0].base.as_str(), planned[0].not_null),
            ("datetime", true)
        );
        assert_eq!(
            (planned[1].base.as_str(), planned[1].not_null),
            ("datetime", false)
        );
        let all = add_columns(&spec.name, &missing);
        assert!(!all.contains("`headers`"), "{all}");
        assert!(all.contains("ADD COLUMN `created_at` DATETIME(6)"), "{all}");
        assert!(
            all.ends_with("ADD COLUMN `sluice_seq` BIGINT NOT NULL AUTO_INCREMENT, ADD UNIQUE KEY `outboxevent_sluice_seq_key` (`sluice_seq`)"),
            "{all}"
        );
        let create = squash(&ddl::create_table::<MyTypes>(&spec));
        assert!(
            create.contains("`aggregatetype` VARCHAR(255) NOT NULL"),
            "{create}"
        );
        assert!(!create.contains("tenant"), "{create}");
        assert!(
            create.ends_with(
                "`dead_at` DATETIME(6), `replay_id` TEXT) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            ),
            "{create}"
        );
    }

    #[test]
    fn indexes_lead_with_the_filtered_columns_and_index_long_texts_by_prefix() {
        let found = [
            found("aggregatetype", "varchar(64)"),
            found("aggregateid", "text"),
        ];
        let indexes = index_sql(&debezium_layout(), &found, true);
        let names: Vec<&str> = indexes.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            [
                "outboxevent_unsent_sluice_seq_idx",
                "outboxevent_unsent_key_sluice_seq_idx"
            ]
        );
        assert_eq!(
            indexes[0].1,
            "CREATE INDEX `outboxevent_unsent_sluice_seq_idx` ON `outboxevent` \
             (published_at, dead_at, `sluice_seq`, `id`)"
        );
        assert!(
            indexes[1].1.ends_with(
                "(`aggregatetype`, `aggregateid`(191), published_at, `sluice_seq`, `id`)"
            ),
            "{}",
            indexes[1].1
        );
    }

    #[test]
    fn the_tenant_index_holds_whole_tenants_for_a_loose_scan() {
        let layout = crate::store::test_layouts::sluice_layout();
        let whole = [found("tenant", "varchar(255)")];
        assert!(
            index_sql(&layout, &whole, false)
                .iter()
                .all(|(n, _)| !n.contains("tenant"))
        );
        assert_eq!(
            tenant_index_sql(&layout, &whole).as_deref(),
            Some(
                "CREATE INDEX `outbox_unsent_tenant_idx` ON `outbox` \
                 (`tenant`, published_at, dead_at, `id`)"
            )
        );
        let long = [found("tenant", "varchar(1024)")];
        let sql = tenant_index_sql(&layout, &long).unwrap_or_default();
        assert!(sql.contains("(`tenant`(191), published_at"), "{sql}");
        assert_eq!(tenant_index_sql(&debezium_layout(), &whole), None);
    }

    #[test]
    fn long_names_are_shortened_and_long_texts_indexed_by_prefix() {
        let long = "t".repeat(63);
        let name = index_name(&long, "_unsent_key_sluice_seq_idx");
        assert!(name.len() <= MAX_IDENTIFIER, "{name}");
        assert!(name.ends_with("_unsent_key_sluice_seq_idx"), "{name}");
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
        assert_eq!(key_part(&cols, &col("a"), INDEX_PREFIX), "`a`");
        assert_eq!(key_part(&cols, &col("b"), INDEX_PREFIX), "`b`(191)");
        assert_eq!(key_part(&cols, &col("c"), INDEX_PREFIX), "`c`(191)");
    }
}
