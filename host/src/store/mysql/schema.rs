//! MySQL's side of the table check ([`crate::store::schema`]): reading `information_schema`
//! and which MySQL/MariaDB types fit which role ([`MyTypes`]).

use sqlx::mysql::MySql;
use sqlx::{Executor, Row};

use crate::store::columns::{ColumnName, Holds};
use crate::store::schema::{ColumnTypes, FoundColumn, KeyKind, PayloadKind, TimeKind, ValueKind};
use crate::store::{StoreError, TableName};

const INT_TYPES: [&str; 5] = ["tinyint", "smallint", "mediumint", "int", "bigint"];
const CHAR_TYPES: [&str; 2] = ["char", "varchar"];
pub(super) const TEXT_TYPES: [&str; 4] = ["tinytext", "text", "mediumtext", "longtext"];
const BINARY_TYPES: [&str; 6] = [
    "binary",
    "varbinary",
    "tinyblob",
    "blob",
    "mediumblob",
    "longblob",
];

fn is_textual(base: &str) -> bool {
    CHAR_TYPES.contains(&base) || TEXT_TYPES.contains(&base)
}

/// MySQL's and MariaDB's types, by role (`information_schema.COLUMNS.DATA_TYPE`). MariaDB's
/// `JSON` is an alias of `LONGTEXT` (with a `json_valid` check) and is listed as such.
pub(super) struct MyTypes;

impl ColumnTypes for MyTypes {
    const ACCEPTED_ID: &'static str = "tinyint, smallint, mediumint, int, bigint (AUTO_INCREMENT), char(n), varchar(n), uuid (MariaDB)";
    const ACCEPTED_STRING: &'static str =
        "char, varchar, tinytext, text, mediumtext, longtext, uuid, tinyint … bigint";
    const ACCEPTED_PAYLOAD: &'static str =
        "json, longtext and the other text types, varchar, blob types, varbinary";
    const ACCEPTED_HEADERS: &'static str = "json, text types, varchar (a JSON object of strings)";
    const ACCEPTED_CREATED_AT: &'static str =
        "timestamp, datetime (read as UTC, as Sluice's connections use time_zone '+00:00')";
    const ACCEPTED_ORDER: &'static str = "tinyint … bigint, NOT NULL";
    const ORDER_ADDED: Option<&'static str> = Some("BIGINT NOT NULL AUTO_INCREMENT");

    fn key_kind(column: &FoundColumn) -> Option<KeyKind> {
        match column.base.as_str() {
            b if INT_TYPES.contains(&b) => Some(KeyKind::Int),
            b if CHAR_TYPES.contains(&b) => Some(KeyKind::Text {
                cast: "char".into(),
            }),
            "uuid" => Some(KeyKind::Text {
                cast: "uuid".into(),
            }),
            _ => None,
        }
    }

    /// Besides the id types, the text types.
    fn is_string(column: &FoundColumn) -> bool {
        Self::key_kind(column).is_some() || TEXT_TYPES.contains(&column.base.as_str())
    }

    fn payload_kind(column: &FoundColumn) -> Option<PayloadKind> {
        match column.base.as_str() {
            "json" => Some(PayloadKind::Json),
            b if is_textual(b) => Some(PayloadKind::Text),
            b if BINARY_TYPES.contains(&b) => Some(PayloadKind::Bytes),
            _ => None,
        }
    }

    fn is_headers(column: &FoundColumn) -> bool {
        let base = column.base.as_str();
        base == "json" || is_textual(base)
    }

    fn time_kind(column: &FoundColumn) -> Option<TimeKind> {
        match column.base.as_str() {
            "timestamp" => Some(TimeKind::WithZone),
            "datetime" => Some(TimeKind::WithoutZone),
            _ => None,
        }
    }

    /// `BOOLEAN` is `tinyint(1)`; MariaDB's `JSON` is `longtext` and reads as text. A
    /// `bigint unsigned` or wider `bit` may exceed a signed 64-bit integer, which `CAST(… AS
    /// SIGNED)` would wrap without a word (18446744073709551615 as -1).
    fn value_kind(column: &FoundColumn) -> ValueKind {
        match column.base.as_str() {
            "tinyint" if column.shown.starts_with("tinyint(1)") => ValueKind::Boolean,
            "bit" if column.shown == "bit(1)" => ValueKind::Boolean,
            "bit" => ValueKind::Unsigned,
            "bigint" if column.shown.contains("unsigned") => ValueKind::Unsigned,
            b if INT_TYPES.contains(&b) => ValueKind::Integer,
            "float" | "double" => ValueKind::Float,
            "json" => ValueKind::Json,
            b if BINARY_TYPES.contains(&b) => ValueKind::Bytes,
            _ => Self::time_kind(column).map_or(ValueKind::Text, ValueKind::Time),
        }
    }

    fn bookkeeping(what: Holds) -> (&'static str, fn(&FoundColumn) -> bool) {
        match what {
            Holds::Time => ("datetime, timestamp", |c| {
                matches!(c.base.as_str(), "datetime" | "timestamp")
            }),
            Holds::Count => ("int", |c| c.base == "int"),
            // Bounded error texts are up to `text::MAX_STORED` bytes.
            Holds::Text => ("text, mediumtext, longtext", |c| {
                matches!(c.base.as_str(), "text" | "mediumtext" | "longtext")
            }),
        }
    }

    fn unique_id_hint(table: &str, column: &ColumnName) -> String {
        format!(
            "e.g. ALTER TABLE {} ADD PRIMARY KEY ({})",
            table.replace('"', "`"),
            column.quoted_with('`')
        )
    }
}

/// Reads the table's columns from `information_schema`; empty when the table does not exist.
/// An unqualified table is looked up in the connection's database.
pub(super) async fn read_columns<'e, E>(
    executor: E,
    table: &TableName,
) -> Result<Vec<FoundColumn>, StoreError>
where
    E: Executor<'e, Database = MySql>,
{
    // Every value is cast, so each arrives as one type whatever the server's version.
    let rows = sqlx::query(
        "SELECT CAST(c.COLUMN_NAME AS CHAR) AS name,
                CAST(c.COLUMN_TYPE AS CHAR) AS shown,
                CAST(LOWER(c.DATA_TYPE) AS CHAR) AS base,
                CAST(c.IS_NULLABLE = 'NO' AS SIGNED) AS not_null,
                CAST(EXISTS (
                    SELECT 1 FROM information_schema.STATISTICS s
                     WHERE s.TABLE_SCHEMA = c.TABLE_SCHEMA AND s.TABLE_NAME = c.TABLE_NAME
                       AND s.COLUMN_NAME = c.COLUMN_NAME AND s.NON_UNIQUE = 0
                       AND s.SUB_PART IS NULL
                       AND NOT EXISTS (
                           SELECT 1 FROM information_schema.STATISTICS s2
                            WHERE s2.TABLE_SCHEMA = s.TABLE_SCHEMA
                              AND s2.TABLE_NAME = s.TABLE_NAME
                              AND s2.INDEX_NAME = s.INDEX_NAME
                              AND s2.COLUMN_NAME <> s.COLUMN_NAME)) AS SIGNED) AS is_unique
           FROM information_schema.COLUMNS c
          WHERE c.TABLE_SCHEMA = COALESCE(?, DATABASE()) AND c.TABLE_NAME = ?
          ORDER BY c.ORDINAL_POSITION",
    )
    .bind(table.schema())
    .bind(table.table())
    .fetch_all(executor)
    .await?;
    rows.iter()
        .map(|row| {
            let base: String = row.try_get("base")?;
            Ok(FoundColumn {
                name: row.try_get("name")?,
                shown: row.try_get("shown")?,
                bounded: CHAR_TYPES.contains(&base.as_str()),
                base,
                not_null: row.try_get::<i64, _>("not_null")? != 0,
                unique: row.try_get::<i64, _>("is_unique")? != 0,
                unique_with: Vec::new(),
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TableSpec;
    use crate::store::ddl;
    use crate::store::dialect::Driver;
    use crate::store::layout_sql::LayoutSql;
    use crate::store::schema::{Layout, check};

    fn my(layout: Layout) -> LayoutSql {
        LayoutSql::new(layout, Driver::Mysql)
    }

    fn column(name: &str, base: &str) -> FoundColumn {
        FoundColumn {
            name: name.into(),
            shown: base.into(),
            base: base.into(),
            bounded: CHAR_TYPES.contains(&base),
            not_null: name == "id" || name == "sluice_seq",
            unique: name == "id",
            unique_with: Vec::new(),
        }
    }

    /// The table `sluice migrate` creates, with the id of type `id`.
    fn table(id: &str) -> Vec<FoundColumn> {
        vec![
            column("id", id),
            column("tenant", "varchar"),
            column("aggregate_type", "varchar"),
            column("aggregate_id", "varchar"),
            column("event_type", "varchar"),
            column("payload", "longtext"),
            column("headers", "longtext"),
            column("created_at", "datetime"),
            column("published_at", "datetime"),
            column("attempts", "int"),
            column("next_attempt_at", "datetime"),
            column("last_error", "text"),
            column("dead_at", "datetime"),
        ]
    }

    fn spec() -> TableSpec {
        TableSpec::new(TableName::parse("app.outbox").unwrap())
    }

    #[test]
    fn integer_ids_are_signed_and_order_the_claim() {
        let layout = check::<MyTypes>(&spec(), &table("bigint")).unwrap();
        let sql = my(layout);
        assert_eq!(sql.table, "`app`.`outbox`");
        assert_eq!(sql.id_expr("o"), "CAST(o.`id` AS SIGNED)");
        assert_eq!(sql.order_by("o"), "o.`id`");
        assert_eq!(sql.before("p", "o"), "p.`id` < o.`id`");
        assert_eq!(
            sql.payload_expr("o"),
            "CAST(o.`payload` AS CHAR CHARACTER SET utf8mb4)"
        );
        assert_eq!(
            sql.tenant_name_expr("o"),
            "COALESCE(CAST(o.`tenant` AS CHAR), 'default')"
        );
    }

    #[test]
    fn char_ids_need_the_order_column_migrate_adds() {
        let err = check::<MyTypes>(&spec(), &table("char"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"sluice_seq\"") && err.contains("`sluice migrate` adds it"),
            "{err}"
        );
        assert_eq!(
            ddl::missing_columns::<MyTypes>(&spec(), &table("char")),
            [
                ("replay_id".to_owned(), "TEXT"),
                ("sluice_seq".to_owned(), "BIGINT NOT NULL AUTO_INCREMENT")
            ]
        );
        let mut with_seq = table("char");
        with_seq.push(column("sluice_seq", "bigint"));
        let sql = my(check::<MyTypes>(&spec(), &with_seq).unwrap());
        assert_eq!(sql.id_expr("o"), "CAST(o.`id` AS CHAR)");
        assert_eq!(sql.order_by("o"), "o.`sluice_seq`, o.`id`");
    }

    #[test]
    fn unusable_columns_are_named_with_mysql_types() {
        let mut cols = table("decimal");
        cols[5] = column("payload", "int");
        cols[9] = column("attempts", "varchar");
        let err = check::<MyTypes>(&spec(), &cols).unwrap_err().to_string();
        for needle in [
            "column \"id\" (database.columns.id) has type decimal; accepted types: tinyint",
            "column \"payload\" (database.columns.payload) has type int; accepted types: json",
            "column \"attempts\" (bookkeeping; `sluice migrate` adds it) has type varchar",
        ] {
            assert!(err.contains(needle), "{needle:?} not in:\n{err}");
        }
    }

    #[test]
    fn blobs_are_read_as_bytes_and_timestamps_as_utc() {
        let mut cols = table("bigint");
        cols[5] = column("payload", "longblob");
        cols[7] = column("created_at", "timestamp");
        let layout = check::<MyTypes>(&spec(), &cols).unwrap();
        assert_eq!(layout.payload_kind, PayloadKind::Bytes);
        assert_eq!(layout.created_at_kind, TimeKind::WithZone);
        assert_eq!(my(layout).payload_expr("o"), "o.`payload`");
    }
}
