//! Which column of the outbox table holds what: the `[database.columns]` mapping, so Sluice can
//! relay from a table the application created with its own names (Debezium's `aggregatetype`,
//! `aggregateid`, `type`, …). Names are validated identifiers, quoted wherever they reach SQL.

use std::fmt;

use super::TableName;
use super::table::validate_identifier;
use crate::problem::Problem;

/// What a bookkeeping column holds, which decides its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holds {
    Time,
    Count,
    Text,
}

/// Sluice's bookkeeping columns, in table order. Sluice owns them (`sluice migrate` adds
/// them), so their names are fixed; a mapped column may not use one of them.
pub(super) const BOOKKEEPING: [(&str, Holds); 5] = [
    ("published_at", Holds::Time),
    ("attempts", Holds::Count),
    ("next_attempt_at", Holds::Time),
    ("last_error", Holds::Text),
    ("dead_at", Holds::Time),
];
/// Which `sluice replay` made a sent row due again (its id, stamped as the `sluice-replay`
/// header), cleared when the row is sent again. Optional: `sluice migrate` adds it, but a
/// relay runs on a table without it (only `sluice replay` then refuses).
pub(super) const REPLAY: (&str, Holds) = ("replay_id", Holds::Text);
/// SQLite's too: the relay holding a row's lease, and until when (see `store::sqlite`).
pub(super) const LEASE: [(&str, Holds); 2] =
    [("leased_by", Holds::Text), ("lease_until", Holds::Time)];

/// The column rows are claimed in when the id is not an integer (a `uuid`, a ULID in `text`).
pub const DEFAULT_ORDER_COLUMN: &str = "sluice_seq";

/// A column name that is safe to interpolate into SQL: ASCII letters, digits and `_`, not
/// starting with a digit, at most 63 bytes. It is always quoted, so it must be spelled as the
/// catalog has it (lower case unless the column was created with a quoted name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnName(String);

/// A configured column name that is not a plain identifier, and why.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid column name {name:?}: {reason}")]
pub struct ColumnNameError {
    name: String,
    reason: &'static str,
}

impl ColumnName {
    /// `name` if it is a valid identifier (see [`ColumnName`]), as given (case kept).
    pub fn parse(name: &str) -> Result<Self, ColumnNameError> {
        validate_identifier(name).map_err(|reason| ColumnNameError {
            name: name.to_owned(),
            reason,
        })?;
        Ok(Self(name.to_owned()))
    }

    /// For names known to be valid identifiers (Sluice's own).
    pub(super) fn known(name: &'static str) -> Self {
        Self(name.to_owned())
    }

    /// The name as the catalog has it (unquoted).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name quoted with `quote` (see [`TableName::quoted_with`]).
    pub fn quoted_with(&self, quote: char) -> String {
        format!("{quote}{}{quote}", self.0)
    }
}

impl fmt::Display for ColumnName {
    /// The quoted SQL form, e.g. `"aggregatetype"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0)
    }
}

/// Where a row's tenant comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantColumn {
    /// Not configured: the column `tenant` if the table has one; otherwise every row belongs to
    /// the default tenant.
    IfPresent(ColumnName),
    /// Configured by name: the table must have it.
    Named(ColumnName),
    /// Configured as `""`: the table's rows all belong to the default tenant.
    None,
}

impl TenantColumn {
    /// The column to look for, if any.
    pub fn name(&self) -> Option<&ColumnName> {
        match self {
            Self::IfPresent(c) | Self::Named(c) => Some(c),
            Self::None => None,
        }
    }
}

/// The columns Sluice reads, by role (`[database.columns]`; each defaults to the role's name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnMap {
    /// The primary key: an integer or text (a uuid, a ULID). Default `id`.
    pub id: ColumnName,
    /// Where the tenant comes from. Default `tenant`, if the table has it.
    pub tenant: TenantColumn,
    /// The aggregate's kind, e.g. `order`; the built-in router's topic. Default `aggregate_type`.
    pub aggregate_type: ColumnName,
    /// The aggregate's id; the built-in router's message key. Default `aggregate_id`.
    pub aggregate_id: ColumnName,
    /// The event's name, e.g. `order_placed`. Default `event_type`.
    pub event_type: ColumnName,
    /// The message body. Default `payload`.
    pub payload: ColumnName,
    /// Message headers as a JSON object of strings. Default `headers`.
    pub headers: ColumnName,
    /// When the application inserted the row. Default `created_at`.
    pub created_at: ColumnName,
    /// The column rows are claimed in (and ordered by per key); `None`: the id if it is an
    /// integer, else [`DEFAULT_ORDER_COLUMN`].
    pub order: Option<ColumnName>,
    /// A column holding the row's W3C trace context (Debezium's `tracingspancontext`); `None`:
    /// only the `headers` column's `traceparent`/`tracestate` are read.
    pub trace_context: Option<ColumnName>,
    /// Columns besides the mapped ones whose values reach plugins (`extra`). Default none.
    pub extra: ExtraColumnNames,
}

/// `[database.columns] extra`: the columns, beyond the mapped ones, whose typed values every
/// row carries to its plugin (`OutboxRow::extra`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ExtraColumnNames {
    /// None (the default): rows carry the mapped columns only.
    #[default]
    None,
    /// These columns, in this order.
    Named(Vec<ColumnName>),
    /// `["*"]`: every column of the table that is neither mapped nor Sluice's own, in table
    /// order.
    All,
}

impl ExtraColumnNames {
    /// The configured list: `["*"]` for every column, else names.
    fn parse(names: &[String]) -> Result<Self, Problem> {
        let key = "database.columns.extra";
        if names.iter().any(|n| n == "*") {
            return match names.len() {
                1 => Ok(Self::All),
                _ => Err(Problem::new(
                    key,
                    "\"*\" stands alone: every column not mapped",
                )),
            };
        }
        let mut parsed: Vec<ColumnName> = Vec::with_capacity(names.len());
        for name in names {
            let column = ColumnName::parse(name).map_err(|e| Problem::invalid(key, e))?;
            if parsed.contains(&column) {
                return Err(Problem::new(key, format!("{column} is listed twice")));
            }
            parsed.push(column);
        }
        Ok(if parsed.is_empty() {
            Self::None
        } else {
            Self::Named(parsed)
        })
    }

    /// The columns named (none for `None` and `All`).
    pub fn named(&self) -> &[ColumnName] {
        match self {
            Self::Named(names) => names,
            Self::None | Self::All => &[],
        }
    }
}

impl Default for ColumnMap {
    fn default() -> Self {
        Self {
            id: ColumnName::known("id"),
            tenant: TenantColumn::IfPresent(ColumnName::known("tenant")),
            aggregate_type: ColumnName::known("aggregate_type"),
            aggregate_id: ColumnName::known("aggregate_id"),
            event_type: ColumnName::known("event_type"),
            payload: ColumnName::known("payload"),
            headers: ColumnName::known("headers"),
            created_at: ColumnName::known("created_at"),
            order: None,
            trace_context: None,
            extra: ExtraColumnNames::None,
        }
    }
}

impl ColumnMap {
    /// Every mapped column with its `[database.columns]` key, the order column included when
    /// it is configured.
    pub fn roles(&self) -> Vec<(&'static str, &ColumnName)> {
        let mut roles = vec![("id", &self.id)];
        roles.extend(self.tenant.name().map(|c| ("tenant", c)));
        roles.extend([
            ("aggregate_type", &self.aggregate_type),
            ("aggregate_id", &self.aggregate_id),
            ("event_type", &self.event_type),
            ("payload", &self.payload),
            ("headers", &self.headers),
            ("created_at", &self.created_at),
        ]);
        roles.extend(self.order.as_ref().map(|c| ("order", c)));
        roles.extend(self.trace_context.as_ref().map(|c| ("trace_context", c)));
        roles
    }

    /// Refuses a mapping Sluice cannot work with: a column used for two roles (except `order`
    /// naming the id column), or one of Sluice's bookkeeping columns, at the
    /// `database.columns.…` key at fault.
    pub fn validate(&self) -> Result<(), Problem> {
        let roles = self.roles();
        for (i, (key, column)) in roles.iter().enumerate() {
            if BOOKKEEPING
                .iter()
                .chain(&LEASE)
                .chain([&REPLAY])
                .any(|(c, _)| *c == column.as_str())
            {
                return Err(Problem::new(
                    format!("database.columns.{key}"),
                    format!("{column} is one of Sluice's bookkeeping columns"),
                ));
            }
            let order_is_id =
                |a: &str, b: &str| matches!((a, b), ("id", "order") | ("order", "id"));
            if let Some((other, _)) = roles[..i]
                .iter()
                .find(|(other, c)| c == column && !order_is_id(other, key))
            {
                return Err(Problem::new(
                    format!("database.columns.{key}"),
                    format!("{column} is already mapped as database.columns.{other}"),
                ));
            }
        }
        self.validate_extra(&roles)
    }

    /// An extra column may be neither mapped nor Sluice's own: its value already reaches the
    /// plugin, or is none of the plugin's business.
    fn validate_extra(&self, roles: &[(&'static str, &ColumnName)]) -> Result<(), Problem> {
        for column in self.extra.named() {
            let own = BOOKKEEPING
                .iter()
                .chain(&LEASE)
                .chain([&REPLAY])
                .any(|(c, _)| *c == column.as_str())
                || column.as_str() == DEFAULT_ORDER_COLUMN;
            if own {
                return Err(Problem::new(
                    "database.columns.extra",
                    format!("{column} is one of Sluice's bookkeeping columns"),
                ));
            }
            if let Some((key, _)) = roles.iter().find(|(_, c)| *c == column) {
                return Err(Problem::new(
                    "database.columns.extra",
                    format!("{column} is already mapped as database.columns.{key}"),
                ));
            }
        }
        Ok(())
    }
}

/// The outbox table and what its columns hold: everything Sluice needs to know before it
/// looks at the table itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    /// The table (`database.table`), optionally schema-qualified.
    pub name: TableName,
    /// Which of its columns holds what.
    pub columns: ColumnMap,
}

impl TableSpec {
    /// A table with Sluice's own column names.
    pub fn new(name: TableName) -> Self {
        Self {
            name,
            columns: ColumnMap::default(),
        }
    }
}

/// `[database.columns]` as written: the table's column for each of Sluice's roles; each key
/// left out is the role's own name (`tenant`: used when the table has it; `""` for none).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnsSettings {
    /// See [`ColumnMap::id`]; default `id`.
    pub id: Option<String>,
    /// See [`ColumnMap::tenant`]; default `tenant` if present, `""` for none.
    pub tenant: Option<String>,
    /// See [`ColumnMap::aggregate_type`]; default `aggregate_type`.
    pub aggregate_type: Option<String>,
    /// See [`ColumnMap::aggregate_id`]; default `aggregate_id`.
    pub aggregate_id: Option<String>,
    /// See [`ColumnMap::event_type`]; default `event_type`.
    pub event_type: Option<String>,
    /// See [`ColumnMap::payload`]; default `payload`.
    pub payload: Option<String>,
    /// See [`ColumnMap::headers`]; default `headers`.
    pub headers: Option<String>,
    /// See [`ColumnMap::created_at`]; default `created_at`.
    pub created_at: Option<String>,
    /// The column rows are claimed in: default the id if it is an integer, else `sluice_seq`.
    pub order: Option<String>,
    /// See [`ColumnMap::trace_context`]; default none.
    pub trace_context: Option<String>,
    /// See [`ColumnMap::extra`]: column names, or `["*"]`; default none.
    pub extra: Option<Vec<String>>,
}

impl TableSpec {
    /// The outbox table `table` with the column mapping `columns`, validated (names are
    /// identifiers, no column mapped twice or onto a bookkeeping column); errors name the
    /// `database.…` key at fault.
    pub fn from_settings(table: &str, columns: &ColumnsSettings) -> Result<Self, Problem> {
        let name = TableName::parse(table).map_err(|e| Problem::invalid("database.table", e))?;
        let parse = |key: &str, value: &Option<String>| {
            let parsed = value.as_deref().map(ColumnName::parse).transpose();
            parsed.map_err(|e| Problem::invalid(format!("database.columns.{key}"), e))
        };
        let (c, d) = (columns, ColumnMap::default());
        let tenant = match c.tenant.as_deref() {
            Some("") => TenantColumn::None,
            _ => parse("tenant", &c.tenant)?.map_or(d.tenant, TenantColumn::Named),
        };
        let order = parse("order", &c.order)?;
        let columns = ColumnMap {
            id: parse("id", &c.id)?.unwrap_or(d.id),
            tenant,
            aggregate_type: parse("aggregate_type", &c.aggregate_type)?.unwrap_or(d.aggregate_type),
            aggregate_id: parse("aggregate_id", &c.aggregate_id)?.unwrap_or(d.aggregate_id),
            event_type: parse("event_type", &c.event_type)?.unwrap_or(d.event_type),
            payload: parse("payload", &c.payload)?.unwrap_or(d.payload),
            headers: parse("headers", &c.headers)?.unwrap_or(d.headers),
            created_at: parse("created_at", &c.created_at)?.unwrap_or(d.created_at),
            order,
            trace_context: parse("trace_context", &c.trace_context)?,
            extra: ExtraColumnNames::parse(c.extra.as_deref().unwrap_or_default())?,
        };
        columns.validate()?;
        Ok(Self { name, columns })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str) -> ColumnName {
        ColumnName::parse(name).unwrap()
    }

    #[test]
    fn column_names_are_identifiers_and_are_quoted() {
        assert_eq!(col("aggregatetype").to_string(), "\"aggregatetype\"");
        assert_eq!(col("AggregateType").as_str(), "AggregateType");
        for bad in [
            "",
            "a b",
            "x\"; drop table t; --",
            "1st",
            "a.b",
            &"x".repeat(64),
        ] {
            assert!(ColumnName::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn debezium_mapping_is_valid_and_lists_its_roles() {
        let map = ColumnMap {
            aggregate_type: col("aggregatetype"),
            aggregate_id: col("aggregateid"),
            event_type: col("type"),
            ..ColumnMap::default()
        };
        map.validate().unwrap();
        let keys: Vec<&str> = map.roles().iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            [
                "id",
                "tenant",
                "aggregate_type",
                "aggregate_id",
                "event_type",
                "payload",
                "headers",
                "created_at"
            ]
        );
    }

    #[test]
    fn a_column_mapped_twice_or_onto_bookkeeping_is_refused() {
        let twice = ColumnMap {
            event_type: col("aggregate_type"),
            ..ColumnMap::default()
        };
        let problem = twice.validate().unwrap_err();
        assert_eq!(problem.key, "database.columns.event_type");
        assert!(
            problem.message.contains("database.columns.aggregate_type"),
            "{problem}"
        );

        let bookkeeping = ColumnMap {
            payload: col("last_error"),
            ..ColumnMap::default()
        };
        assert_eq!(
            bookkeeping.validate().unwrap_err().key,
            "database.columns.payload"
        );

        let order_is_id = ColumnMap {
            order: Some(col("id")),
            ..ColumnMap::default()
        };
        order_is_id.validate().unwrap();
    }

    fn extra(names: &[&str]) -> Result<ColumnMap, Problem> {
        let settings = ColumnsSettings {
            extra: Some(names.iter().map(|n| (*n).to_owned()).collect()),
            ..ColumnsSettings::default()
        };
        TableSpec::from_settings("outbox", &settings).map(|spec| spec.columns)
    }

    #[test]
    fn extra_columns_are_named_or_all_and_never_mapped_or_sluices_own() {
        assert_eq!(
            extra(&["region", "created_by"]).unwrap().extra,
            ExtraColumnNames::Named(vec![col("region"), col("created_by")])
        );
        assert_eq!(extra(&["*"]).unwrap().extra, ExtraColumnNames::All);
        assert_eq!(extra(&[]).unwrap().extra, ExtraColumnNames::None);
        for (names, says) in [
            (&["region", "*"][..], "stands alone"),
            (&["a b"][..], "invalid column name"),
            (&["region", "region"][..], "listed twice"),
            (
                &["payload"][..],
                "already mapped as database.columns.payload",
            ),
            (&["dead_at"][..], "bookkeeping"),
            (&["sluice_seq"][..], "bookkeeping"),
            (&["replay_id"][..], "bookkeeping"),
            (&["lease_until"][..], "bookkeeping"),
        ] {
            let problem = extra(names).unwrap_err();
            assert_eq!(problem.key, "database.columns.extra", "{names:?}");
            assert!(problem.to_string().contains(says), "{names:?}: {problem}");
        }
    }
}
