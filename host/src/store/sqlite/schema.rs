//! SQLite's side of the table check ([`crate::store::schema`]): reading `pragma_table_info`
//! and the table's unique indexes, and which declared types fit which role ([`LiteTypes`], by
//! SQLite's type affinity rules).
//!
//! Sluice's own time columns hold integers: milliseconds since the Unix epoch (UTC).
//! `created_at`, the application's, holds ISO-8601 text as `CURRENT_TIMESTAMP` writes it
//! (read as UTC unless it names an offset).

use sqlx::Row;
use sqlx::sqlite::{SqliteConnection, SqlitePool};

use crate::store::columns::{ColumnName, Holds};
use crate::store::schema::{
    ColumnTypes, FoundColumn, KeyKind, Layout, PayloadKind, TimeKind, ValueKind,
};
use crate::store::{StoreError, TableName};
use crate::store::{ddl, fair};

/// SQLite's type affinity of a declared type (<https://sqlite.org/datatype3.html>, 3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Affinity {
    Integer,
    Text,
    Blob,
    Real,
    Numeric,
}

fn affinity(declared: &str) -> Affinity {
    let t = declared.to_ascii_uppercase();
    if t.contains("INT") {
        Affinity::Integer
    } else if t.contains("CHAR") || t.contains("CLOB") || t.contains("TEXT") {
        Affinity::Text
    } else if t.contains("BLOB") || t.is_empty() {
        Affinity::Blob
    } else if t.contains("REAL") || t.contains("FLOA") || t.contains("DOUB") {
        Affinity::Real
    } else {
        Affinity::Numeric
    }
}

fn is_text(c: &FoundColumn) -> bool {
    affinity(&c.base) == Affinity::Text
}

/// `JSON` (and `JSONB`) has numeric affinity by SQLite's rules, but holds JSON text.
fn is_json(c: &FoundColumn) -> bool {
    matches!(c.base.as_str(), "json" | "jsonb")
}

/// SQLite's declared types, by affinity.
pub(super) struct LiteTypes;

impl ColumnTypes for LiteTypes {
    const ACCEPTED_ID: &'static str =
        "INTEGER (INTEGER PRIMARY KEY, best with AUTOINCREMENT) or another integer type; TEXT";
    const ACCEPTED_STRING: &'static str = "TEXT (or any type of text affinity), INTEGER";
    const ACCEPTED_PAYLOAD: &'static str = "JSON, TEXT (text affinity), BLOB (or no type)";
    const ACCEPTED_HEADERS: &'static str = "JSON, TEXT (a JSON object of strings)";
    const ACCEPTED_CREATED_AT: &'static str = "TEXT, DATETIME, TIMESTAMP holding ISO-8601 text (as CURRENT_TIMESTAMP writes it; UTC unless an offset is given)";
    const ACCEPTED_ORDER: &'static str = "INTEGER, NOT NULL";
    const LEASES: bool = true;
    /// SQLite cannot add a column that numbers the existing rows.
    const ORDER_ADDED: Option<&'static str> = None;

    fn key_kind(column: &FoundColumn) -> Option<KeyKind> {
        match affinity(&column.base) {
            Affinity::Integer => Some(KeyKind::Int),
            Affinity::Text => Some(KeyKind::Text {
                cast: "text".into(),
            }),
            _ => None,
        }
    }

    fn payload_kind(column: &FoundColumn) -> Option<PayloadKind> {
        if is_json(column) {
            return Some(PayloadKind::Json);
        }
        match affinity(&column.base) {
            Affinity::Text => Some(PayloadKind::Text),
            Affinity::Blob => Some(PayloadKind::Bytes),
            _ => None,
        }
    }

    fn is_headers(column: &FoundColumn) -> bool {
        is_json(column) || is_text(column)
    }

    fn time_kind(column: &FoundColumn) -> Option<TimeKind> {
        let t = column.base.as_str();
        (is_text(column) || t.contains("date") || t.contains("time"))
            .then_some(TimeKind::WithoutZone)
    }

    /// By declared type: `BOOLEAN`/`BOOL`, `JSON`, `DATETIME`/`TIMESTAMP`/`DATE…` (ISO-8601
    /// text, as `created_at`) before the affinity rules; values are cast to the declared kind.
    fn value_kind(column: &FoundColumn) -> ValueKind {
        let t = column.base.as_str();
        if t.starts_with("bool") {
            return ValueKind::Boolean;
        }
        if is_json(column) {
            return ValueKind::Json;
        }
        if t.contains("date") || t.contains("time") {
            return ValueKind::Time(TimeKind::WithoutZone);
        }
        match affinity(t) {
            Affinity::Integer => ValueKind::Integer,
            Affinity::Real => ValueKind::Float,
            Affinity::Blob if !t.is_empty() => ValueKind::Bytes,
            _ => ValueKind::Text,
        }
    }

    fn bookkeeping(what: Holds) -> (&'static str, fn(&FoundColumn) -> bool) {
        match what {
            Holds::Time => ("INTEGER (milliseconds since the Unix epoch)", Self::is_int),
            Holds::Count => ("INTEGER", Self::is_int),
            Holds::Text => ("TEXT", is_text),
        }
    }

    fn unique_id_hint(table: &str, column: &ColumnName) -> String {
        format!(
            "e.g. CREATE UNIQUE INDEX ON {table} ({column}) (SQLite cannot add a primary key to a table)"
        )
    }
}

/// Refuses a table `relay.fair_share`'s walk cannot serve: no tenant column, or no index led
/// by it (see [`check_tenant_index`]).
pub(super) async fn check_tenant_index(
    pool: &SqlitePool,
    layout: &Layout,
) -> Result<(), StoreError> {
    let indexed = match &layout.tenant {
        Some(tenant) => {
            let found: i64 = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pragma_index_list(?1, ?2) AS l
                                 WHERE (SELECT name FROM pragma_index_info(l.name, ?2)
                                         WHERE seqno = 0) = ?3)",
            )
            .bind(layout.table.table())
            .bind(layout.table.schema().unwrap_or("main"))
            .bind(tenant.as_str())
            .fetch_one(pool)
            .await?;
            found != 0
        }
        None => false,
    };
    fair::check_tenant_index(layout, indexed, || {
        ddl::partial_indexes::<LiteTypes>(layout, ddl::tenant_index(layout))
            .pop()
            .unwrap_or_default()
    })
}

/// Reads the table's columns (`pragma_table_info`) and which of them the primary key or a
/// complete (not partial) unique index covers alone; empty when the table does not exist.
pub(super) async fn read_columns(
    conn: &mut SqliteConnection,
    table: &TableName,
) -> Result<Vec<FoundColumn>, StoreError> {
    // `pk` numbers the primary key's columns from 1.
    let rows = sqlx::query(
        "SELECT c.name, c.type, c.\"notnull\",
                c.pk = 1 AND NOT EXISTS (SELECT 1 FROM pragma_table_info(?1, ?2) WHERE pk > 1)
                    AS sole_key,
                EXISTS (SELECT 1 FROM pragma_index_list(?1, ?2) AS l
                         WHERE l.\"unique\" AND NOT l.partial
                           AND (SELECT count(*) FROM pragma_index_info(l.name, ?2)) = 1
                           AND (SELECT name FROM pragma_index_info(l.name, ?2)) = c.name)
                    AS is_unique
           FROM pragma_table_info(?1, ?2) AS c
          ORDER BY c.cid",
    )
    .bind(table.table())
    .bind(table.schema().unwrap_or("main"))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|row| {
            let declared: String = row.try_get("type")?;
            let sole_key = row.try_get::<i64, _>("sole_key")? != 0;
            // An INTEGER PRIMARY KEY is the rowid: never NULL, whatever was declared.
            let rowid = sole_key && declared.eq_ignore_ascii_case("integer");
            Ok(FoundColumn {
                name: row.try_get("name")?,
                shown: if declared.is_empty() {
                    "(no type)".to_owned()
                } else {
                    declared.clone()
                },
                base: declared.to_ascii_lowercase(),
                bounded: false,
                not_null: row.try_get::<i64, _>("notnull")? != 0 || rowid,
                unique: sole_key || row.try_get::<i64, _>("is_unique")? != 0,
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
    use crate::store::dialect::Driver;
    use crate::store::layout_sql::LayoutSql;
    use crate::store::schema::check;

    fn column(name: &str, declared: &str) -> FoundColumn {
        FoundColumn {
            name: name.into(),
            shown: declared.into(),
            base: declared.to_ascii_lowercase(),
            bounded: false,
            not_null: name == "id",
            unique: name == "id",
            unique_with: Vec::new(),
        }
    }

    fn table(id: &str) -> Vec<FoundColumn> {
        vec![
            column("id", id),
            column("tenant", "TEXT"),
            column("aggregate_type", "TEXT"),
            column("aggregate_id", "VARCHAR(64)"),
            column("event_type", "TEXT"),
            column("payload", "JSON"),
            column("headers", "TEXT"),
            column("created_at", "DATETIME"),
            column("published_at", "INTEGER"),
            column("attempts", "INTEGER"),
            column("next_attempt_at", "INTEGER"),
            column("last_error", "TEXT"),
            column("dead_at", "INTEGER"),
            column("leased_by", "TEXT"),
            column("lease_until", "INTEGER"),
        ]
    }

    fn spec() -> TableSpec {
        TableSpec::new(TableName::parse("outbox").unwrap())
    }

    #[test]
    fn declared_types_are_judged_by_affinity() {
        assert_eq!(affinity("BIGINT"), Affinity::Integer);
        assert_eq!(affinity("varchar(26)"), Affinity::Text);
        assert_eq!(affinity(""), Affinity::Blob);
        assert_eq!(affinity("JSON"), Affinity::Numeric);
        let layout = check::<LiteTypes>(&spec(), &table("INTEGER")).unwrap();
        assert_eq!(layout.key, KeyKind::Int);
        assert_eq!(layout.payload_kind, PayloadKind::Json);
        let sql = LayoutSql::new(layout, Driver::Sqlite);
        assert_eq!(sql.order_by("o"), "o.\"id\"");
        assert_eq!(sql.id_expr(""), "CAST(\"id\" AS INTEGER)");
    }

    #[test]
    fn text_ids_need_an_order_column_migrate_cannot_add() {
        let err = check::<LiteTypes>(&spec(), &table("TEXT"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("database.columns.order") && err.contains("cannot add one"),
            "{err}"
        );
        let mut with_seq = table("TEXT");
        with_seq.push(FoundColumn {
            not_null: true,
            ..column("seq", "INTEGER")
        });
        let mut named = spec();
        named.columns.order = Some(ColumnName::parse("seq").unwrap());
        let sql = LayoutSql::new(
            check::<LiteTypes>(&named, &with_seq).unwrap(),
            Driver::Sqlite,
        );
        assert_eq!(
            sql.before("p", "o"),
            "(p.\"seq\", p.\"id\") < (o.\"seq\", o.\"id\")"
        );
    }

    #[test]
    fn lease_columns_are_bookkeeping() {
        let mut cols = table("INTEGER");
        cols.retain(|c| c.name != "lease_until");
        let err = check::<LiteTypes>(&spec(), &cols).unwrap_err().to_string();
        assert!(
            err.contains(
                "column \"lease_until\" (bookkeeping; `sluice migrate` adds it) is missing"
            ),
            "{err}"
        );
    }
}
