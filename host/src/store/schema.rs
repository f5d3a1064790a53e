//! Checking an outbox table against what Sluice needs, whatever the database.
//!
//! At start-up (and in `sluice migrate`) each driver reads its catalog into [`FoundColumn`]s
//! and says, through [`ColumnTypes`], which of its types fit which role. The rules and the
//! refusal are shared: a column that is missing or of a type Sluice cannot use is a problem
//! naming the table, the column, its role, its type and what is accepted — every problem at
//! once ([`SchemaError`]). A table that passes yields a [`Layout`]: what each column holds and
//! how, from which each driver builds its SQL.

use std::fmt;

use super::columns::{
    self, ColumnMap, ColumnName, ExtraColumnNames, Holds, TableSpec, TenantColumn,
};
use super::{StoreError, TableName};
use crate::model::OutboxId;

/// A column as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FoundColumn {
    pub name: String,
    /// The declared type as the database prints it, e.g. `character varying(255)`.
    pub shown: String,
    /// The underlying type without modifiers, lower case (PostgreSQL: a domain's base type),
    /// e.g. `character varying`, `bigint`.
    pub base: String,
    /// Whether the type has a length limit (`varchar(255)`, `char(8)`).
    pub bounded: bool,
    pub not_null: bool,
    /// Whether a primary key or unique index covers this column alone.
    pub unique: bool,
    /// The columns a two-column primary key or unique index pairs this column with (PostgreSQL
    /// only: a partitioned table's unique keys must include the partition key, so its id is
    /// unique only together with, say, `created_at`).
    pub unique_with: Vec<String>,
}

/// How an id is carried: integers as 64-bit integers, anything else as its text form (compared
/// with the column as type `cast` where the database needs a cast).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    Int,
    Text { cast: String },
}

/// How the `payload` column is stored, which decides how it is turned into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// JSON: the JSON text, UTF-8.
    Json,
    /// Binary: the raw bytes.
    Bytes,
    /// Text: UTF-8.
    Text,
}

/// How `created_at` is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeKind {
    WithZone,
    /// A timestamp without time zone: read as UTC.
    WithoutZone,
}

/// How an extra column (`[database.columns] extra`) is read, by its type; each is one
/// [`crate::model::ColumnValue`] variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// Text, and every type without a kind of its own, as the database prints it.
    Text,
    Integer,
    /// An unsigned integer that may not fit 64 signed bits (MySQL's `bigint unsigned`,
    /// `bit(n)`): read as its decimal text, an integer when it fits, else that text.
    Unsigned,
    Float,
    Boolean,
    Time(TimeKind),
    Json,
    Bytes,
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
    /// The id is unique only together with `created_at` (a table partitioned by
    /// `created_at`, whose primary key is `(id, created_at)`): rows are marked by both.
    pub keyed_with_created_at: bool,
    /// The extra columns, in the order rows carry them, and how each is read.
    pub extra: Vec<(ColumnName, ValueKind)>,
    /// `[database.columns] trace_context`: a text column with the row's trace context.
    pub trace_context: Option<ColumnName>,
    /// Whether the table has the replay marker ([`columns::REPLAY`], added by `sluice
    /// migrate`): without it the relay runs as before and `sluice replay` refuses.
    pub replay: bool,
}

impl Layout {
    /// `id` as one of the table's ids, as an admin command gives it (so a typo is an error
    /// naming the table, not "0 rows").
    pub fn parse_id(&self, id: &str) -> Result<OutboxId, StoreError> {
        match self.key {
            KeyKind::Int => {
                id.trim()
                    .parse::<i64>()
                    .map(OutboxId::Int)
                    .map_err(|_| StoreError::InvalidId {
                        table: self.table.to_string(),
                        id: id.to_owned(),
                        expected: "an integer",
                    })
            }
            KeyKind::Text { .. } => Ok(OutboxId::Text(id.into())),
        }
    }

    /// Whether rows are claimed in id order (integer ids) rather than by a separate column.
    pub fn ordered_by_id(&self) -> bool {
        self.order == self.id
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

/// A table Sluice cannot use, and every reason why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "outbox table {table} cannot be used:{}",
    .problems.iter().map(|p| format!("\n  - {p}")).collect::<String>()
)]
pub struct SchemaError {
    /// The outbox table.
    pub table: String,
    /// One sentence per missing or unusable column, in check order.
    pub problems: Vec<String>,
}

/// Which of a database's column types fit which role, and how the accepted types are named in
/// a refusal.
pub(super) trait ColumnTypes {
    /// Accepted types of the id column, as a refusal lists them.
    const ACCEPTED_ID: &'static str;
    /// … of `tenant`, `aggregate_type`, `aggregate_id` and `event_type`.
    const ACCEPTED_STRING: &'static str;
    const ACCEPTED_PAYLOAD: &'static str;
    const ACCEPTED_HEADERS: &'static str;
    const ACCEPTED_CREATED_AT: &'static str;
    const ACCEPTED_ORDER: &'static str;
    /// Whether the tables carry Sluice's lease columns ([`columns::LEASE`]).
    const LEASES: bool = false;
    /// The type `sluice migrate` adds a missing order column with, numbering the existing rows
    /// (`None`: it cannot; a refusal then asks for `database.columns.order`).
    const ORDER_ADDED: Option<&'static str>;

    /// How an id of this type is carried, `None` if it cannot be an id.
    fn key_kind(column: &FoundColumn) -> Option<KeyKind>;
    /// Whether the column's values can be read as text (tenant, aggregate, event type): by
    /// default those of any id type, as ids are carried as integers or their text.
    fn is_string(column: &FoundColumn) -> bool {
        Self::key_kind(column).is_some()
    }
    /// Whether the column is an integer (ids carried as integers, the order column).
    fn is_int(column: &FoundColumn) -> bool {
        Self::key_kind(column) == Some(KeyKind::Int)
    }
    fn payload_kind(column: &FoundColumn) -> Option<PayloadKind>;
    fn is_headers(column: &FoundColumn) -> bool;
    fn time_kind(column: &FoundColumn) -> Option<TimeKind>;
    /// How an extra column of this type is read ([`ValueKind::Text`] for types without a
    /// kind of their own).
    fn value_kind(column: &FoundColumn) -> ValueKind;
    /// The types a bookkeeping column holding `what` may have (as a refusal lists them), and
    /// the test.
    fn bookkeeping(what: Holds) -> (&'static str, fn(&FoundColumn) -> bool);
    /// How to give `table` a unique, not-null id `column` (the end of a refusal).
    fn unique_id_hint(table: &str, column: &ColumnName) -> String;
}

/// Sluice's own columns in `T`'s tables, in table order, with what each holds.
pub(super) fn bookkeeping<T: ColumnTypes>() -> impl Iterator<Item = (&'static str, Holds)> {
    let lease = if T::LEASES { &columns::LEASE[..] } else { &[] };
    columns::BOOKKEEPING.iter().chain(lease).copied()
}

/// Checks the columns `found` of `spec`'s table with the database's `T`ypes: the [`Layout`],
/// or every problem.
pub(super) fn check<T: ColumnTypes>(
    spec: &TableSpec,
    found: &[FoundColumn],
) -> Result<Layout, SchemaError> {
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
    let id = checker.require("id", &map.id, T::ACCEPTED_ID, |c| T::key_kind(c).is_some());
    let keyed_with_created_at = match &id {
        Some(id) => checker.unique_id::<T>(map, id, &table),
        None => false,
    };
    let tenant = checker.tenant::<T>(&map.tenant);
    for (key, name) in [
        ("aggregate_type", &map.aggregate_type),
        ("aggregate_id", &map.aggregate_id),
        ("event_type", &map.event_type),
    ] {
        checker.require(key, name, T::ACCEPTED_STRING, T::is_string);
    }
    let payload = checker.require("payload", &map.payload, T::ACCEPTED_PAYLOAD, |c| {
        T::payload_kind(c).is_some()
    });
    checker.require("headers", &map.headers, T::ACCEPTED_HEADERS, T::is_headers);
    let created_at = checker.require("created_at", &map.created_at, T::ACCEPTED_CREATED_AT, |c| {
        T::time_kind(c).is_some()
    });
    if let Some(trace) = &map.trace_context {
        checker.require("trace_context", trace, T::ACCEPTED_STRING, T::is_string);
    }
    let order = checker.order::<T>(map, id.as_ref());
    let extra = checker.extra::<T>(map, order.as_ref());
    for (name, holds) in bookkeeping::<T>() {
        let (accepted, accept) = T::bookkeeping(holds);
        let name = ColumnName::known(name);
        checker.require(Role::Bookkeeping, &name, accepted, accept);
    }
    let replay = checker.optional_bookkeeping::<T>(columns::REPLAY);
    match (id, payload, created_at, order) {
        (Some(id), Some(payload), Some(created_at), Some(order)) if checker.problems.is_empty() => {
            Ok(Layout {
                table: spec.name.clone(),
                id: map.id.clone(),
                key: T::key_kind(&id).unwrap_or(KeyKind::Int),
                tenant,
                aggregate_type: map.aggregate_type.clone(),
                aggregate_id: map.aggregate_id.clone(),
                event_type: map.event_type.clone(),
                payload: map.payload.clone(),
                payload_kind: T::payload_kind(&payload).unwrap_or(PayloadKind::Bytes),
                headers: map.headers.clone(),
                created_at: map.created_at.clone(),
                created_at_kind: T::time_kind(&created_at).unwrap_or(TimeKind::WithZone),
                order,
                keyed_with_created_at,
                extra,
                trace_context: map.trace_context.clone(),
                replay,
            })
        }
        _ => Err(SchemaError {
            table,
            problems: checker.problems,
        }),
    }
}

/// The column rows are claimed in, and whether it is the id: the configured one, else an
/// integer id, else [`columns::DEFAULT_ORDER_COLUMN`]; `None` while there is no usable id.
pub(super) fn order_column<T: ColumnTypes>(
    map: &ColumnMap,
    id: Option<&FoundColumn>,
) -> Option<(ColumnName, bool)> {
    let default = || ColumnName::known(columns::DEFAULT_ORDER_COLUMN);
    match (&map.order, id) {
        (Some(order), _) => Some((order.clone(), *order == map.id)),
        (None, Some(id)) if T::is_int(id) => Some((map.id.clone(), true)),
        (None, Some(id)) if T::key_kind(id).is_some() => Some((default(), false)),
        (None, _) => None,
    }
}

/// What a column is for, as a problem names it.
#[derive(Clone, Copy)]
enum Role {
    /// A `[database.columns]` key.
    Mapped(&'static str),
    /// One of Sluice's own columns.
    Bookkeeping,
}

impl From<&'static str> for Role {
    fn from(key: &'static str) -> Self {
        Self::Mapped(key)
    }
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
        role: impl Into<Role>,
        name: &ColumnName,
        accepted: &str,
        accept: impl Fn(&FoundColumn) -> bool,
    ) -> Option<FoundColumn> {
        let role = role.into();
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

    /// Whether the optional bookkeeping column `name` is there; one of a type Sluice cannot
    /// use is a problem like any other.
    fn optional_bookkeeping<T: ColumnTypes>(
        &mut self,
        (name, holds): (&'static str, Holds),
    ) -> bool {
        let name = ColumnName::known(name);
        if self.find(&name).is_none() {
            return false;
        }
        let (accepted, accept) = T::bookkeeping(holds);
        self.require(Role::Bookkeeping, &name, accepted, accept)
            .is_some()
    }

    /// Sluice marks rows by id, so an id must name exactly one row: on its own, or together
    /// with `created_at` (a partitioned table's primary key `(id, created_at)`; returns true
    /// then, and rows are marked by both). A `created_at` in the key must be `NOT NULL`, which
    /// a primary key makes it.
    fn unique_id<T: ColumnTypes>(
        &mut self,
        map: &ColumnMap,
        id: &FoundColumn,
        table: &str,
    ) -> bool {
        let name = &map.id;
        if id.not_null && id.unique {
            return false;
        }
        let created_at = map.created_at.as_str();
        let with_created_at = id.unique_with.iter().any(|c| c == created_at)
            && self.find(&map.created_at).is_some_and(|c| c.not_null);
        if id.not_null && with_created_at {
            return true;
        }
        self.problems.push(format!(
            "column {name} (database.columns.id) must be NOT NULL and unique on its own \
             (a primary key or a unique index on it alone) or together with {created} (a \
             partitioned table's PRIMARY KEY ({name}, {created})): Sluice marks rows by id; {}",
            T::unique_id_hint(table, name),
            created = map.created_at,
        ));
        false
    }

    /// The tenant column, if the table has one (or must have the configured one).
    fn tenant<T: ColumnTypes>(&mut self, tenant: &TenantColumn) -> Option<ColumnName> {
        let name = match tenant {
            TenantColumn::None => return None,
            TenantColumn::IfPresent(name) if self.find(name).is_none() => return None,
            TenantColumn::IfPresent(name) | TenantColumn::Named(name) => name,
        };
        self.require("tenant", name, T::ACCEPTED_STRING, T::is_string)
            .map(|_| name.clone())
    }

    /// The extra columns: each named one must exist; `*` takes every column that is neither
    /// mapped (`order` included) nor Sluice's own, in table order.
    fn extra<T: ColumnTypes>(
        &mut self,
        map: &ColumnMap,
        order: Option<&ColumnName>,
    ) -> Vec<(ColumnName, ValueKind)> {
        match &map.extra {
            ExtraColumnNames::None => Vec::new(),
            ExtraColumnNames::Named(names) => {
                let found = self.found;
                let mut extra = Vec::with_capacity(names.len());
                for name in names {
                    match found.iter().find(|c| c.name == name.as_str()) {
                        Some(column) => extra.push((name.clone(), T::value_kind(column))),
                        None => self
                            .problems
                            .push(format!("column {name} (database.columns.extra) is missing")),
                    }
                }
                extra
            }
            ExtraColumnNames::All => {
                let roles = map.roles();
                let own: Vec<&str> = bookkeeping::<T>()
                    .chain([columns::REPLAY])
                    .map(|(name, _)| name)
                    .collect();
                self.found
                    .iter()
                    .filter(|c| {
                        !own.contains(&c.name.as_str())
                            && !roles.iter().any(|(_, r)| r.as_str() == c.name)
                            && order.is_none_or(|o| o.as_str() != c.name)
                            && c.name != columns::DEFAULT_ORDER_COLUMN
                    })
                    .filter_map(|c| Some((ColumnName::parse(&c.name).ok()?, T::value_kind(c))))
                    .collect()
            }
        }
    }

    /// The [`order_column`], which must be an integer and `NOT NULL`.
    fn order<T: ColumnTypes>(
        &mut self,
        map: &ColumnMap,
        id: Option<&FoundColumn>,
    ) -> Option<ColumnName> {
        let (order, is_id) = order_column::<T>(map, id)?;
        if is_id {
            return Some(order);
        }
        let how = if T::ORDER_ADDED.is_some() {
            "`sluice migrate` adds it"
        } else {
            "name one with database.columns.order: `sluice migrate` cannot add one to this \
             database's tables"
        };
        let accepted = match (&map.order, id) {
            (None, Some(id)) => format!(
                "{} (ids of type {} need an order column: {how})",
                T::ACCEPTED_ORDER,
                id.shown
            ),
            _ => T::ACCEPTED_ORDER.to_owned(),
        };
        self.require("order", &order, &accepted, |c| T::is_int(c) && c.not_null)
            .map(|_| order)
    }
}
