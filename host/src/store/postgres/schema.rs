//! PostgreSQL's side of the table check ([`crate::store::schema`]): reading the catalog and
//! which PostgreSQL types fit which role ([`PgTypes`]).

use sqlx::postgres::PgPool;
use sqlx::{Executor, Postgres};

use crate::store::columns::{ColumnName, Holds, TableSpec};
use crate::store::ddl::DdlTypes;
use crate::store::schema::{self, ColumnTypes};
pub(super) use crate::store::schema::{
    FoundColumn, KeyKind, Layout, PayloadKind, TimeKind, ValueKind,
};
use crate::store::{StoreError, TableName};

const INT_TYPES: [&str; 3] = ["smallint", "integer", "bigint"];

fn is_citext(base: &str) -> bool {
    base == "citext" || base.ends_with(".citext")
}

/// PostgreSQL's types, by role.
pub(super) struct PgTypes;

impl ColumnTypes for PgTypes {
    const ACCEPTED_ID: &'static str = "smallint, integer, bigint (serial, bigserial, identity), uuid, text, varchar, char(n), citext";
    const ACCEPTED_STRING: &'static str =
        "text, varchar, char(n), citext, uuid, smallint, integer, bigint";
    const ACCEPTED_PAYLOAD: &'static str = "jsonb, json, bytea, text, varchar, citext";
    const ACCEPTED_HEADERS: &'static str = "jsonb, json, text, varchar (a JSON object of strings)";
    const ACCEPTED_CREATED_AT: &'static str =
        "timestamp with time zone, timestamp without time zone (read as UTC)";
    const ACCEPTED_ORDER: &'static str = "smallint, integer, bigint, NOT NULL";
    const ORDER_ADDED: Option<&'static str> = Some(<Self as DdlTypes>::ORDER);

    fn key_kind(column: &FoundColumn) -> Option<KeyKind> {
        let cast = match column.base.as_str() {
            b if INT_TYPES.contains(&b) => return Some(KeyKind::Int),
            "uuid" => "uuid".to_owned(),
            // Compared as text: PostgreSQL's text operators serve a varchar index.
            "text" | "character varying" => "text".to_owned(),
            // `character` without a length would be char(1): cast to the unbounded name.
            "character" => "bpchar".to_owned(),
            // As the catalog prints it (schema-qualified and quoted when needed).
            b if is_citext(b) => b.to_owned(),
            _ => return None,
        };
        Some(KeyKind::Text { cast })
    }

    fn payload_kind(column: &FoundColumn) -> Option<PayloadKind> {
        match column.base.as_str() {
            "jsonb" | "json" => Some(PayloadKind::Json),
            "bytea" => Some(PayloadKind::Bytes),
            "text" | "character varying" => Some(PayloadKind::Text),
            b if is_citext(b) => Some(PayloadKind::Text),
            _ => None,
        }
    }

    fn is_headers(column: &FoundColumn) -> bool {
        matches!(
            column.base.as_str(),
            "jsonb" | "json" | "text" | "character varying"
        )
    }

    fn time_kind(column: &FoundColumn) -> Option<TimeKind> {
        match column.base.as_str() {
            "timestamp with time zone" => Some(TimeKind::WithZone),
            "timestamp without time zone" => Some(TimeKind::WithoutZone),
            _ => None,
        }
    }

    fn value_kind(column: &FoundColumn) -> ValueKind {
        match column.base.as_str() {
            b if INT_TYPES.contains(&b) => ValueKind::Integer,
            "real" | "double precision" => ValueKind::Float,
            "boolean" => ValueKind::Boolean,
            "json" | "jsonb" => ValueKind::Json,
            "bytea" => ValueKind::Bytes,
            _ => Self::time_kind(column).map_or(ValueKind::Text, ValueKind::Time),
        }
    }

    fn bookkeeping(what: Holds) -> (&'static str, fn(&FoundColumn) -> bool) {
        match what {
            Holds::Time => ("timestamp with time zone", |c| {
                c.base == "timestamp with time zone"
            }),
            Holds::Count => ("integer", |c| c.base == "integer"),
            // Bounded error texts are up to `text::MAX_STORED` bytes: no length limit.
            Holds::Text => ("text, varchar without a length limit", |c| {
                matches!(c.base.as_str(), "text" | "character varying") && !c.bounded
            }),
        }
    }

    fn unique_id_hint(table: &str, column: &ColumnName) -> String {
        format!("e.g. ALTER TABLE {table} ADD PRIMARY KEY ({column})")
    }
}

/// Reads the table's columns from the catalog; empty when the table does not exist.
pub(super) async fn read_columns<'e, E>(
    executor: E,
    table: &TableName,
) -> Result<Vec<FoundColumn>, StoreError>
where
    E: Executor<'e, Database = Postgres>,
{
    type Found = (String, String, String, bool, bool, bool, Vec<String>);
    let rows: Vec<Found> = sqlx::query_as(
        "SELECT a.attname::text AS name,
                format_type(a.atttypid, a.atttypmod) AS shown,
                format_type(CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END, NULL)
                    AS base,
                (CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END) >= 0 AS bounded,
                a.attnotnull AS not_null,
                EXISTS (SELECT 1 FROM pg_index i
                         WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indisvalid
                           AND i.indnkeyatts = 1 AND i.indkey[0] = a.attnum
                           AND i.indpred IS NULL AND i.indexprs IS NULL) AS unique,
                ARRAY(SELECT b.attname::text FROM pg_index i
                        JOIN pg_attribute b ON b.attrelid = i.indrelid
                                           AND b.attnum IN (i.indkey[0], i.indkey[1])
                       WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indisvalid
                         AND i.indnkeyatts = 2 AND a.attnum IN (i.indkey[0], i.indkey[1])
                         AND b.attnum <> a.attnum
                         AND i.indpred IS NULL AND i.indexprs IS NULL) AS unique_with
           FROM pg_attribute a
           JOIN pg_type t ON t.oid = a.atttypid
          WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
          ORDER BY a.attnum",
    )
    .bind(table.to_string())
    .fetch_all(executor)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(name, shown, base, bounded, not_null, unique, unique_with)| FoundColumn {
                name,
                shown,
                base,
                bounded,
                not_null,
                unique,
                unique_with,
            },
        )
        .collect())
}

/// Looks the table up and checks it: the [`Layout`] to read it with, or every problem.
pub(super) async fn inspect(pool: &PgPool, spec: &TableSpec) -> Result<Layout, StoreError> {
    let found = read_columns(pool, &spec.name).await?;
    Ok(schema::check::<PgTypes>(spec, &found)?)
}

#[cfg(test)]
mod tests {
    use super::super::sql::key_array;
    use super::*;
    use crate::store::dialect::Driver;
    use crate::store::layout_sql::LayoutSql;
    use crate::store::schema::check;
    use crate::store::{ColumnMap, TenantColumn};

    fn pg(layout: &Layout) -> LayoutSql {
        LayoutSql::new(layout.clone(), Driver::Postgres)
    }

    fn column(name: &str, shown: &str) -> FoundColumn {
        let base = match shown {
            "serial" => "integer",
            s if s.starts_with("character varying") => "character varying",
            s if s.starts_with("character(") => "character",
            s => s,
        };
        FoundColumn {
            name: name.to_owned(),
            shown: shown.to_owned(),
            base: base.to_owned(),
            bounded: shown.contains('('),
            not_null: name == "id" || name == "sluice_seq",
            unique: name == "id",
            unique_with: Vec::new(),
        }
    }

    fn bookkeeping() -> Vec<FoundColumn> {
        vec![
            column("published_at", "timestamp with time zone"),
            column("attempts", "integer"),
            column("next_attempt_at", "timestamp with time zone"),
            column("last_error", "text"),
            column("dead_at", "timestamp with time zone"),
        ]
    }

    /// Sluice's own table, with the id of type `id_type`.
    fn sluice_table(id_type: &str) -> Vec<FoundColumn> {
        let mut cols = vec![
            column("id", id_type),
            column("tenant", "text"),
            column("aggregate_type", "text"),
            column("aggregate_id", "text"),
            column("event_type", "text"),
            column("payload", "jsonb"),
            column("headers", "jsonb"),
            column("created_at", "timestamp with time zone"),
        ];
        cols.extend(bookkeeping());
        cols
    }

    fn spec() -> TableSpec {
        TableSpec::new(TableName::parse("outbox").unwrap())
    }

    fn debezium_spec() -> TableSpec {
        TableSpec {
            name: TableName::parse("outboxevent").unwrap(),
            columns: ColumnMap {
                aggregate_type: ColumnName::parse("aggregatetype").unwrap(),
                aggregate_id: ColumnName::parse("aggregateid").unwrap(),
                event_type: ColumnName::parse("type").unwrap(),
                ..ColumnMap::default()
            },
        }
    }

    /// Debezium's default outbox table after `sluice migrate`.
    fn debezium_table() -> Vec<FoundColumn> {
        let mut cols = vec![
            column("id", "uuid"),
            column("aggregatetype", "character varying(255)"),
            column("aggregateid", "character varying(255)"),
            column("type", "character varying(255)"),
            column("payload", "jsonb"),
            column("headers", "jsonb"),
            column("created_at", "timestamp with time zone"),
            column("sluice_seq", "bigint"),
        ];
        cols.extend(bookkeeping());
        cols
    }

    #[test]
    fn integer_ids_of_any_width_are_read_as_int8_and_order_the_claim() {
        for id_type in ["smallint", "integer", "bigint", "serial"] {
            let layout = check::<PgTypes>(&spec(), &sluice_table(id_type)).unwrap();
            assert_eq!(layout.key, KeyKind::Int, "{id_type}");
            assert_eq!(pg(&layout).id_expr("o"), "o.\"id\"::int8");
            assert_eq!(pg(&layout).order_by("o"), "o.\"id\"");
            assert_eq!(pg(&layout).before("p", "o"), "p.\"id\" < o.\"id\"");
            assert_eq!(key_array(&pg(&layout), "$1"), "$1::text[]::int8[]");
        }
    }

    #[test]
    fn uuid_ids_are_text_cast_back_to_uuid_and_ordered_by_the_sequence_column() {
        let layout = check::<PgTypes>(&debezium_spec(), &debezium_table()).unwrap();
        assert_eq!(
            layout.key,
            KeyKind::Text {
                cast: "uuid".into()
            }
        );
        assert_eq!(pg(&layout).id_expr("o"), "o.\"id\"::text");
        assert_eq!(key_array(&pg(&layout), "$1"), "$1::text[]::uuid[]");
        assert_eq!(layout.order.as_str(), "sluice_seq");
        assert_eq!(pg(&layout).order_by("o"), "o.\"sluice_seq\", o.\"id\"");
        assert_eq!(
            pg(&layout).before("p", "o"),
            "(p.\"sluice_seq\", p.\"id\") < (o.\"sluice_seq\", o.\"id\")"
        );
        // Debezium's table has no tenant column: every row is the default tenant.
        assert_eq!(layout.tenant, None);
        assert_eq!(pg(&layout).tenant_expr("o"), "NULL::text");
        assert_eq!(pg(&layout).tenant_name_expr("o"), "'default'::text");
    }

    #[test]
    fn text_like_ids_cast_to_types_that_keep_their_value() {
        for (shown, cast) in [
            ("text", "text"),
            ("character varying(26)", "text"),
            ("character(26)", "bpchar"),
        ] {
            let mut table = sluice_table(shown);
            table.push(column("sluice_seq", "bigint"));
            let layout = check::<PgTypes>(&spec(), &table).unwrap();
            assert_eq!(pg(&layout).key_cast(), cast, "{shown}");
        }
    }

    #[test]
    fn timestamps_without_zone_are_read_as_utc() {
        let mut table = sluice_table("bigint");
        table[7] = column("created_at", "timestamp without time zone");
        let layout = check::<PgTypes>(&spec(), &table).unwrap();
        assert_eq!(
            pg(&layout).created_at_expr("o"),
            "COALESCE(o.\"created_at\" AT TIME ZONE 'UTC', now())"
        );
    }

    #[test]
    fn payload_types_are_turned_into_bytes_in_sql() {
        for (shown, expr) in [
            ("jsonb", "convert_to(o.\"payload\"::text, 'UTF8')"),
            ("json", "convert_to(o.\"payload\"::text, 'UTF8')"),
            ("text", "convert_to(o.\"payload\"::text, 'UTF8')"),
            ("bytea", "o.\"payload\""),
        ] {
            let mut table = sluice_table("bigint");
            table[5] = column("payload", shown);
            let layout = check::<PgTypes>(&spec(), &table).unwrap();
            assert_eq!(pg(&layout).payload_expr("o"), expr, "{shown}");
        }
    }

    #[test]
    fn every_unusable_column_is_named_with_its_type_and_what_is_accepted() {
        let mut table = sluice_table("numeric");
        table[5] = column("payload", "integer");
        table.retain(|c| c.name != "aggregate_id" && c.name != "dead_at");
        let err = check::<PgTypes>(&spec(), &table).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("outbox table \"outbox\" cannot be used:"),
            "{text}"
        );
        for needle in [
            "column \"id\" (database.columns.id) has type numeric; accepted types: smallint",
            "column \"payload\" (database.columns.payload) has type integer; accepted types: \
             jsonb, json, bytea",
            "column \"aggregate_id\" (database.columns.aggregate_id) is missing",
            "column \"dead_at\" (bookkeeping; `sluice migrate` adds it) is missing",
        ] {
            assert!(text.contains(needle), "{needle:?} not in:\n{text}");
        }
        assert_eq!(err.problems.len(), 4, "{text}");
    }

    #[test]
    fn a_missing_table_is_one_problem() {
        let err = check::<PgTypes>(&spec(), &[]).unwrap_err();
        assert_eq!(err.problems.len(), 1);
        assert!(err.to_string().contains("does not exist"), "{err}");
    }

    #[test]
    fn a_uuid_table_without_an_order_column_says_migrate_adds_it() {
        let mut table = debezium_table();
        table.retain(|c| c.name != "sluice_seq");
        let err = check::<PgTypes>(&debezium_spec(), &table)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"sluice_seq\"") && err.contains("`sluice migrate` adds it"),
            "{err}"
        );
    }

    #[test]
    fn an_id_that_is_not_unique_is_refused() {
        let mut table = sluice_table("integer");
        table[0].unique = false;
        let err = check::<PgTypes>(&spec(), &table).unwrap_err().to_string();
        assert!(err.contains("ADD PRIMARY KEY (\"id\")"), "{err}");
    }

    #[test]
    fn an_id_unique_only_with_created_at_is_keyed_with_it() {
        let mut table = sluice_table("bigint");
        table[0].unique = false;
        table[0].unique_with = vec!["created_at".into()];
        table[7].not_null = true;
        let layout = check::<PgTypes>(&spec(), &table).unwrap();
        assert!(layout.keyed_with_created_at);
        // Paired with another column, the id names no single row.
        table[0].unique_with = vec!["tenant".into()];
        let err = check::<PgTypes>(&spec(), &table).unwrap_err().to_string();
        assert!(
            err.contains("PRIMARY KEY (\"id\", \"created_at\")"),
            "{err}"
        );
        // Unique on its own: marked by id alone, whatever else is unique.
        table[0].unique = true;
        table[0].unique_with = vec!["created_at".into()];
        assert!(
            !check::<PgTypes>(&spec(), &table)
                .unwrap()
                .keyed_with_created_at
        );
    }

    #[test]
    fn a_named_tenant_column_must_exist_but_the_default_one_may_be_absent() {
        let mut table = sluice_table("bigint");
        table.retain(|c| c.name != "tenant");
        assert_eq!(check::<PgTypes>(&spec(), &table).unwrap().tenant, None);
        let mut named = spec();
        named.columns.tenant = TenantColumn::Named(ColumnName::parse("tenant").unwrap());
        let err = check::<PgTypes>(&named, &table).unwrap_err().to_string();
        assert!(
            err.contains("column \"tenant\" (database.columns.tenant) is missing"),
            "{err}"
        );
    }

    #[test]
    fn a_length_limited_last_error_is_refused() {
        let mut table = sluice_table("bigint");
        let last_error = table.iter_mut().find(|c| c.name == "last_error").unwrap();
        *last_error = column("last_error", "character varying(255)");
        let err = check::<PgTypes>(&spec(), &table).unwrap_err().to_string();
        assert!(err.contains("varchar without a length limit"), "{err}");
    }
}
