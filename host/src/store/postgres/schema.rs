//! Checking the outbox table against what Sluice needs, and the SQL expressions that read its
//! columns whatever their types.
//!
//! At start-up (and in `sluice migrate`) every column Sluice reads or writes is looked up in
//! the catalog. A column that is missing or of a type Sluice cannot use is a refusal that
//! names the table, the column, its type and what is accepted — every problem at once. A
//! table that passes yields a [`Layout`]: the SQL casts that give the Rust side one shape for
//! every accepted type (int8 or text keys, text strings, bytea payloads, timestamptz times).

use std::fmt;

use sqlx::postgres::PgPool;
use sqlx::{Executor, Postgres};

use crate::store::columns::{self, ColumnName, TableSpec, TenantColumn};
use crate::store::{StoreError, TableName};

/// A column as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundColumn {
    pub name: String,
    /// The declared type as PostgreSQL prints it, e.g. `character varying(255)`.
    pub shown: String,
    /// The underlying type without modifiers (a domain's base type), e.g. `character varying`.
    pub base: String,
    /// Whether the type has a length limit (`varchar(255)`, `char(8)`).
    pub bounded: bool,
    pub not_null: bool,
    /// Whether a primary key or unique index covers this column alone.
    pub unique: bool,
}

/// How an id is carried: integers as `int8`, anything else as its text form, cast back to the
/// column's type (`cast`) when Sluice names rows by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    Int,
    Text { cast: String },
}

/// How the `payload` column is stored, which decides how it is turned into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// `jsonb` or `json`: the JSON text, UTF-8.
    Json,
    /// `bytea`: the raw bytes.
    Bytes,
    /// `text`/`varchar`/`citext`: UTF-8.
    Text,
}

/// How `created_at` is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeKind {
    WithZone,
    /// `timestamp without time zone`: read as UTC.
    WithoutZone,
}

/// A checked outbox table: its columns and how to read each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub table: TableName,
    pub id: ColumnName,
    pub key: KeyKind,
    /// `None`: every row belongs to the default tenant.
    pub tenant: Option<ColumnName>,
    pub aggregate_type: ColumnName,
    pub aggregate_id: ColumnName,
    pub event_type: ColumnName,
    pub payload: ColumnName,
    pub payload_kind: PayloadKind,
    pub headers: ColumnName,
    pub created_at: ColumnName,
    pub created_at_kind: TimeKind,
    /// The column rows are claimed in; the id itself for integer ids.
    pub order: ColumnName,
}

/// A table Sluice cannot use, and every reason why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SchemaError {
    pub table: String,
    pub problems: Vec<String>,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "outbox table {} cannot be used:", self.table)?;
        for problem in &self.problems {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

const INT_TYPES: [&str; 3] = ["smallint", "integer", "bigint"];
const TEXT_TYPES: [&str; 3] = ["text", "character varying", "character"];

pub const ACCEPTED_ID: &str =
    "smallint, integer, bigint (serial, bigserial, identity), uuid, text, varchar, char(n), citext";
pub const ACCEPTED_STRING: &str = "text, varchar, char(n), citext, uuid, smallint, integer, bigint";
pub const ACCEPTED_PAYLOAD: &str = "jsonb, json, bytea, text, varchar, citext";
pub const ACCEPTED_HEADERS: &str = "jsonb, json, text, varchar (a JSON object of strings)";
pub const ACCEPTED_CREATED_AT: &str =
    "timestamp with time zone, timestamp without time zone (read as UTC)";
pub const ACCEPTED_ORDER: &str = "smallint, integer, bigint, NOT NULL";

fn is_citext(base: &str) -> bool {
    base == "citext" || base.ends_with(".citext")
}

fn is_int(base: &str) -> bool {
    INT_TYPES.contains(&base)
}

fn is_string(base: &str) -> bool {
    TEXT_TYPES.contains(&base) || is_citext(base) || base == "uuid" || is_int(base)
}

fn key_kind(column: &FoundColumn) -> Option<KeyKind> {
    let cast = match column.base.as_str() {
        b if is_int(b) => return Some(KeyKind::Int),
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

fn time_kind(column: &FoundColumn) -> Option<TimeKind> {
    match column.base.as_str() {
        "timestamp with time zone" => Some(TimeKind::WithZone),
        "timestamp without time zone" => Some(TimeKind::WithoutZone),
        _ => None,
    }
}

/// Reads the table's columns from the catalog; empty when the table does not exist.
pub async fn read_columns<'e, E>(
    executor: E,
    table: &TableName,
) -> Result<Vec<FoundColumn>, StoreError>
where
    E: Executor<'e, Database = Postgres>,
{
    let rows: Vec<(String, String, String, bool, bool, bool)> = sqlx::query_as(
        "SELECT a.attname::text AS name,
                format_type(a.atttypid, a.atttypmod) AS shown,
                format_type(CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END, NULL)
                    AS base,
                (CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END) >= 0 AS bounded,
                a.attnotnull AS not_null,
                EXISTS (SELECT 1 FROM pg_index i
                         WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indisvalid
                           AND i.indnkeyatts = 1 AND i.indkey[0] = a.attnum
                           AND i.indpred IS NULL AND i.indexprs IS NULL) AS unique
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
            |(name, shown, base, bounded, not_null, unique)| FoundColumn {
                name,
                shown,
                base,
                bounded,
                not_null,
                unique,
            },
        )
        .collect())
}

/// Looks the table up and checks it: the [`Layout`] to read it with, or every problem.
pub async fn inspect(pool: &PgPool, spec: &TableSpec) -> Result<Layout, StoreError> {
    let found = read_columns(pool, &spec.name).await?;
    Ok(check(spec, &found)?)
}

/// Checks the columns `found` against `spec`: the [`Layout`], or every problem.
pub fn check(spec: &TableSpec, found: &[FoundColumn]) -> Result<Layout, SchemaError> {
    let table = spec.name.to_string();
    if found.is_empty() {
        let problems = vec!["the table does not exist (run `sluice migrate`)".to_owned()];
        return Err(SchemaError { table, problems });
    }
    let map = &spec.columns;
    let mut checker = Checker {
        found,
        problems: Vec::new(),
    };
    let id = checker.require(Role::Mapped("id"), &map.id, ACCEPTED_ID, |c| {
        key_kind(c).is_some()
    });
    if let Some(id) = &id {
        checker.unique_id(&map.id, id, &table);
    }
    let tenant = checker.tenant(&map.tenant);
    for (key, name) in [
        ("aggregate_type", &map.aggregate_type),
        ("aggregate_id", &map.aggregate_id),
        ("event_type", &map.event_type),
    ] {
        checker.require(Role::Mapped(key), name, ACCEPTED_STRING, |c| {
            is_string(&c.base)
        });
    }
    let payload = checker.require(
        Role::Mapped("payload"),
        &map.payload,
        ACCEPTED_PAYLOAD,
        |c| payload_kind(c).is_some(),
    );
    checker.require(
        Role::Mapped("headers"),
        &map.headers,
        ACCEPTED_HEADERS,
        |c| {
            matches!(
                c.base.as_str(),
                "jsonb" | "json" | "text" | "character varying"
            )
        },
    );
    let created_at = checker.require(
        Role::Mapped("created_at"),
        &map.created_at,
        ACCEPTED_CREATED_AT,
        |c| time_kind(c).is_some(),
    );
    let order = checker.order(spec, id.as_ref());
    checker.bookkeeping();
    match (id, payload, created_at, order) {
        (Some(id), Some(payload), Some(created_at), Some(order)) if checker.problems.is_empty() => {
            Ok(Layout {
                table: spec.name.clone(),
                id: map.id.clone(),
                key: key_kind(&id).unwrap_or(KeyKind::Int),
                tenant,
                aggregate_type: map.aggregate_type.clone(),
                aggregate_id: map.aggregate_id.clone(),
                event_type: map.event_type.clone(),
                payload: map.payload.clone(),
                payload_kind: payload_kind(&payload).unwrap_or(PayloadKind::Bytes),
                headers: map.headers.clone(),
                created_at: map.created_at.clone(),
                created_at_kind: time_kind(&created_at).unwrap_or(TimeKind::WithZone),
                order,
            })
        }
        _ => Err(SchemaError {
            table,
            problems: checker.problems,
        }),
    }
}

/// Whether a column's type is usable for a role.
type Accept = fn(&FoundColumn) -> bool;

/// What a column is for, as a problem names it.
#[derive(Clone, Copy)]
enum Role {
    /// A `[database.columns]` key.
    Mapped(&'static str),
    /// One of Sluice's own columns.
    Bookkeeping,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Mapped(key) => write!(f, "database.columns.{key}"),
            Self::Bookkeeping => f.write_str("bookkeeping; `sluice migrate` adds it"),
        }
    }
}

/// The table's columns, and the problems found so far.
struct Checker<'a> {
    found: &'a [FoundColumn],
    problems: Vec<String>,
}

impl Checker<'_> {
    fn find(&self, name: &ColumnName) -> Option<&FoundColumn> {
        self.found.iter().find(|c| c.name == name.as_str())
    }

    /// The column `name` if it exists and `accept`s it; otherwise records a problem naming
    /// the column, its role, its type and the `accepted` types.
    fn require(
        &mut self,
        role: Role,
        name: &ColumnName,
        accepted: &str,
        accept: Accept,
    ) -> Option<FoundColumn> {
        let problem = match self.find(name) {
            Some(c) if accept(c) => return Some(c.clone()),
            Some(c) => format!(
                "column {name} ({role}) has type {}; accepted types: {accepted}",
                c.shown
            ),
            None => format!("column {name} ({role}) is missing; accepted types: {accepted}"),
        };
        self.problems.push(problem);
        None
    }

    /// Sluice marks rows by id, so an id must name exactly one row.
    fn unique_id(&mut self, name: &ColumnName, id: &FoundColumn, table: &str) {
        if !id.not_null || !id.unique {
            self.problems.push(format!(
                "column {name} (database.columns.id) must be NOT NULL and unique on its own \
                 (a primary key or a unique index on it alone): Sluice marks rows by id; e.g. \
                 ALTER TABLE {table} ADD PRIMARY KEY ({name})"
            ));
        }
    }

    /// The tenant column, if the table has one (or must have the configured one).
    fn tenant(&mut self, tenant: &TenantColumn) -> Option<ColumnName> {
        let name = match tenant {
            TenantColumn::None => return None,
            TenantColumn::IfPresent(name) if self.find(name).is_none() => return None,
            TenantColumn::IfPresent(name) | TenantColumn::Named(name) => name,
        };
        self.require(Role::Mapped("tenant"), name, ACCEPTED_STRING, |c| {
            is_string(&c.base)
        })
        .map(|_| name.clone())
    }

    /// The column rows are claimed in: the configured one, else an integer id, else
    /// [`columns::DEFAULT_ORDER_COLUMN`]. It must be an integer and `NOT NULL`.
    fn order(&mut self, spec: &TableSpec, id: Option<&FoundColumn>) -> Option<ColumnName> {
        let map = &spec.columns;
        let order = match (&map.order, id) {
            (Some(order), _) if *order == map.id => return Some(order.clone()),
            (Some(order), _) => order.clone(),
            (None, Some(id)) if is_int(&id.base) => return Some(map.id.clone()),
            (None, Some(_)) => ColumnName::parse(columns::DEFAULT_ORDER_COLUMN).ok()?,
            (None, None) => return None,
        };
        let accepted = match (&map.order, id) {
            (None, Some(id)) => format!(
                "{ACCEPTED_ORDER} (ids of type {} need an order column: `sluice migrate` adds it)",
                id.shown
            ),
            _ => ACCEPTED_ORDER.to_owned(),
        };
        self.require(Role::Mapped("order"), &order, &accepted, |c| {
            is_int(&c.base) && c.not_null
        })
        .map(|_| order)
    }

    /// Sluice's own columns, with the types it writes into them.
    fn bookkeeping(&mut self) {
        const TIMESTAMPTZ: &str = "timestamp with time zone";
        let rules: [(&str, &str, Accept); 5] = [
            (columns::PUBLISHED_AT, TIMESTAMPTZ, is_timestamptz),
            (columns::NEXT_ATTEMPT_AT, TIMESTAMPTZ, is_timestamptz),
            (columns::DEAD_AT, TIMESTAMPTZ, is_timestamptz),
            (columns::ATTEMPTS, "integer", |c| c.base == "integer"),
            // Bounded error texts are up to `text::MAX_STORED` bytes: no length limit.
            (
                columns::LAST_ERROR,
                "text, varchar without a length limit",
                |c| matches!(c.base.as_str(), "text" | "character varying") && !c.bounded,
            ),
        ];
        for (name, accepted, accept) in rules {
            if let Ok(column) = ColumnName::parse(name) {
                self.require(Role::Bookkeeping, &column, accepted, accept);
            }
        }
    }
}

/// The order column `sluice migrate` adds, if any: the configured one when the table lacks
/// it, or [`columns::DEFAULT_ORDER_COLUMN`] when the id is usable but not an integer and the
/// table lacks that.
pub fn order_column_to_add(spec: &TableSpec, found: &[FoundColumn]) -> Option<ColumnName> {
    let map = &spec.columns;
    let wanted = match &map.order {
        Some(order) if *order == map.id => return None,
        Some(order) => order.clone(),
        None => {
            let id = found.iter().find(|c| c.name == map.id.as_str())?;
            if is_int(&id.base) || key_kind(id).is_none() {
                return None;
            }
            ColumnName::parse(columns::DEFAULT_ORDER_COLUMN).ok()?
        }
    };
    let present = found.iter().any(|c| c.name == wanted.as_str());
    (!present).then_some(wanted)
}

fn is_timestamptz(c: &FoundColumn) -> bool {
    c.base == "timestamp with time zone"
}

impl Layout {
    /// Whether rows are claimed in id order (integer ids) rather than by a separate column.
    pub fn ordered_by_id(&self) -> bool {
        self.order == self.id
    }

    /// `o.<id>` as `int8` or `text`.
    pub fn id_expr(&self, alias: &str) -> String {
        match self.key {
            KeyKind::Int => format!("{alias}.{}::int8", self.id),
            KeyKind::Text { .. } => format!("{alias}.{}::text", self.id),
        }
    }

    /// The id as `text`, spelled as [`super::OutboxId`]'s `Display` spells the claimed key
    /// (`alias` may be empty for statements without a table alias).
    pub fn id_text_expr(&self, alias: &str) -> String {
        let column = if alias.is_empty() {
            self.id.to_string()
        } else {
            format!("{alias}.{}", self.id)
        };
        match self.key {
            KeyKind::Int => format!("{column}::int8::text"),
            KeyKind::Text { .. } => format!("{column}::text"),
        }
    }

    /// The tenant as `text`, NULL for the default tenant.
    pub fn tenant_expr(&self, alias: &str) -> String {
        match &self.tenant {
            Some(t) => format!("{alias}.{t}::text"),
            None => "NULL::text".to_owned(),
        }
    }

    /// The tenant name as plugins see it (`default` for NULL), for filters.
    pub fn tenant_name_expr(&self, alias: &str) -> String {
        match &self.tenant {
            Some(_) => format!("COALESCE({}, 'default')", self.tenant_expr(alias)),
            None => "'default'::text".to_owned(),
        }
    }

    /// The payload as `bytea`.
    pub fn payload_expr(&self, alias: &str) -> String {
        let p = &self.payload;
        match self.payload_kind {
            PayloadKind::Json | PayloadKind::Text => {
                format!("convert_to({alias}.{p}::text, 'UTF8')")
            }
            PayloadKind::Bytes => format!("{alias}.{p}"),
        }
    }

    /// `created_at` as `timestamptz` (a timestamp without zone read as UTC; NULL as now).
    pub fn created_at_expr(&self, alias: &str) -> String {
        let c = &self.created_at;
        match self.created_at_kind {
            TimeKind::WithZone => format!("COALESCE({alias}.{c}, now())"),
            TimeKind::WithoutZone => format!("COALESCE({alias}.{c} AT TIME ZONE 'UTC', now())"),
        }
    }

    /// `ORDER BY` list: the order column, then the id as a tie-break when they differ.
    pub fn order_by(&self, alias: &str) -> String {
        if self.ordered_by_id() {
            format!("{alias}.{}", self.id)
        } else {
            format!("{alias}.{}, {alias}.{}", self.order, self.id)
        }
    }

    /// Whether row `a` comes before row `b` in claim order (a total order).
    pub fn before(&self, a: &str, b: &str) -> String {
        if self.ordered_by_id() {
            format!("{a}.{id} < {b}.{id}", id = self.id)
        } else {
            format!(
                "({a}.{o}, {a}.{id}) < ({b}.{o}, {b}.{id})",
                o = self.order,
                id = self.id
            )
        }
    }

    /// `param` (a `text[]` of ids) cast to an array of the id column's type, so the primary
    /// key's index serves `= ANY(…)`.
    pub fn key_array(&self, param: &str) -> String {
        format!("{param}::text[]::{}[]", self.key_cast())
    }

    /// The SQL type a text id is cast to for comparison with the id column.
    pub fn key_cast(&self) -> &str {
        match &self.key {
            KeyKind::Int => "int8",
            KeyKind::Text { cast } => cast,
        }
    }

    /// A one-line description for `sluice migrate` and the start-up log.
    pub fn summary(&self) -> String {
        let key = match &self.key {
            KeyKind::Int => "integer ids".to_owned(),
            KeyKind::Text { cast } => format!("{cast} ids"),
        };
        let tenant = match &self.tenant {
            Some(t) => format!("tenant column {t}"),
            None => "no tenant column: every row belongs to tenant \"default\"".to_owned(),
        };
        format!("{key}, claimed in {} order, {tenant}", self.order.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ColumnMap;

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
            let layout = check(&spec(), &sluice_table(id_type)).unwrap();
            assert_eq!(layout.key, KeyKind::Int, "{id_type}");
            assert_eq!(layout.id_expr("o"), "o.\"id\"::int8");
            assert_eq!(layout.order_by("o"), "o.\"id\"");
            assert_eq!(layout.before("p", "o"), "p.\"id\" < o.\"id\"");
            assert_eq!(layout.key_array("$1"), "$1::text[]::int8[]");
        }
    }

    #[test]
    fn uuid_ids_are_text_cast_back_to_uuid_and_ordered_by_the_sequence_column() {
        let layout = check(&debezium_spec(), &debezium_table()).unwrap();
        assert_eq!(
            layout.key,
            KeyKind::Text {
                cast: "uuid".into()
            }
        );
        assert_eq!(layout.id_expr("o"), "o.\"id\"::text");
        assert_eq!(layout.key_array("$1"), "$1::text[]::uuid[]");
        assert_eq!(layout.order.as_str(), "sluice_seq");
        assert_eq!(layout.order_by("o"), "o.\"sluice_seq\", o.\"id\"");
        assert_eq!(
            layout.before("p", "o"),
            "(p.\"sluice_seq\", p.\"id\") < (o.\"sluice_seq\", o.\"id\")"
        );
        // Debezium's table has no tenant column: every row is the default tenant.
        assert_eq!(layout.tenant, None);
        assert_eq!(layout.tenant_expr("o"), "NULL::text");
        assert_eq!(layout.tenant_name_expr("o"), "'default'::text");
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
            let layout = check(&spec(), &table).unwrap();
            assert_eq!(layout.key_cast(), cast, "{shown}");
        }
    }

    #[test]
    fn timestamps_without_zone_are_read_as_utc() {
        let mut table = sluice_table("bigint");
        table[7] = column("created_at", "timestamp without time zone");
        let layout = check(&spec(), &table).unwrap();
        assert_eq!(
            layout.created_at_expr("o"),
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
            let layout = check(&spec(), &table).unwrap();
            assert_eq!(layout.payload_expr("o"), expr, "{shown}");
        }
    }

    #[test]
    fn every_unusable_column_is_named_with_its_type_and_what_is_accepted() {
        let mut table = sluice_table("numeric");
        table[5] = column("payload", "integer");
        table.retain(|c| c.name != "aggregate_id" && c.name != "dead_at");
        let err = check(&spec(), &table).unwrap_err();
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
        let err = check(&spec(), &[]).unwrap_err();
        assert_eq!(err.problems.len(), 1);
        assert!(err.to_string().contains("does not exist"), "{err}");
    }

    #[test]
    fn a_uuid_table_without_an_order_column_says_migrate_adds_it() {
        let mut table = debezium_table();
        table.retain(|c| c.name != "sluice_seq");
        let err = check(&debezium_spec(), &table).unwrap_err().to_string();
        assert!(
            err.contains("\"sluice_seq\"") && err.contains("`sluice migrate` adds it"),
            "{err}"
        );
    }

    #[test]
    fn an_id_that_is_not_unique_is_refused() {
        let mut table = sluice_table("integer");
        table[0].unique = false;
        let err = check(&spec(), &table).unwrap_err().to_string();
        assert!(err.contains("ADD PRIMARY KEY (\"id\")"), "{err}");
    }

    #[test]
    fn a_named_tenant_column_must_exist_but_the_default_one_may_be_absent() {
        let mut table = sluice_table("bigint");
        table.retain(|c| c.name != "tenant");
        assert_eq!(check(&spec(), &table).unwrap().tenant, None);
        let mut named = spec();
        named.columns.tenant = TenantColumn::Named(ColumnName::parse("tenant").unwrap());
        let err = check(&named, &table).unwrap_err().to_string();
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
        let err = check(&spec(), &table).unwrap_err().to_string();
        assert!(err.contains("varchar without a length limit"), "{err}");
    }
}
