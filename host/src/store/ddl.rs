//! The DDL of `sluice migrate`, built once for every database: the outbox table Sluice creates,
//! the columns an application's own table lacks, and the indexes on unsent rows. A driver says
//! how its database declares each kind of column ([`DdlTypes`]) and runs the statements its
//! own way (locks, transactions, MySQL's prefix key parts and index look-ups).

use super::TableName;
use super::columns::{self, ColumnName, Holds, TableSpec};
use super::dialect::Driver;
use super::schema::{self, ColumnTypes, FoundColumn, Layout};

/// How one database declares the columns `sluice migrate` creates or adds (type, constraints,
/// default).
pub(super) trait DdlTypes: ColumnTypes {
    const DIALECT: Driver;
    /// The id of a created table: an integer primary key the database numbers.
    const ID: &'static str;
    /// The tenant; `NOT NULL`, the aggregate type and id and the event type.
    const STRING: &'static str;
    const PAYLOAD: &'static str;
    /// `headers`: `NOT NULL`, `{}` unless given.
    const HEADERS: &'static str;
    /// `created_at`: the time of the insert unless given; and as added to an existing table.
    const CREATED_AT: &'static str;
    const CREATED_AT_ADDED: &'static str = Self::CREATED_AT;
    /// An order column other than the id in a created table (added to an existing one:
    /// [`ColumnTypes::ORDER_ADDED`]).
    const ORDER: &'static str;
    /// Bookkeeping columns by what they hold ([`Holds`]).
    const TIME: &'static str;
    const COUNT: &'static str;
    const TEXT: &'static str;
    /// What follows the column list of `CREATE TABLE`.
    const TABLE_OPTIONS: &'static str = "";
}

/// `CREATE TABLE IF NOT EXISTS` with the mapped column names, Sluice's bookkeeping columns and
/// `T`'s types.
pub(super) fn create_table<T: DdlTypes>(spec: &TableSpec) -> String {
    let (c, q) = (&spec.columns, T::DIALECT.quote());
    let string = format!("{} NOT NULL", T::STRING);
    let ty = |key| match key {
        "id" => T::ID,
        "tenant" => T::STRING,
        "payload" => T::PAYLOAD,
        "headers" => T::HEADERS,
        "created_at" => T::CREATED_AT,
        "order" => T::ORDER,
        _ => string.as_str(), // aggregate_type, aggregate_id, event_type
    };
    let list: Vec<String> = c
        .roles()
        .into_iter()
        .filter(|(key, name)| *key != "order" || **name != c.id)
        .map(|(key, name)| (name.as_str(), ty(key)))
        .chain(bookkeeping::<T>())
        .chain([replay::<T>()])
        .map(|(name, ty)| format!("{q}{name}{q} {ty}"))
        .collect();
    let (table, list) = (spec.name.quoted_with(q), list.join(", "));
    format!(
        "CREATE TABLE IF NOT EXISTS {table} ({list}){}",
        T::TABLE_OPTIONS
    )
}

/// What the application's table (its columns `found`) lacks, as (name, type): `headers`,
/// `created_at`, the bookkeeping columns, and last the order column when it is not the id
/// ([`schema::order_column`]) and `T` can add it.
pub(super) fn missing_columns<T: DdlTypes>(
    spec: &TableSpec,
    found: &[FoundColumn],
) -> Vec<(String, &'static str)> {
    let c = &spec.columns;
    let id = found.iter().find(|f| f.name == c.id.as_str());
    let order = schema::order_column::<T>(c, id).filter(|(_, is_id)| !is_id);
    let order = order.zip(T::ORDER_ADDED);
    [
        (c.headers.as_str(), T::HEADERS),
        (c.created_at.as_str(), T::CREATED_AT_ADDED),
    ]
    .into_iter()
    .chain(bookkeeping::<T>())
    .chain([replay::<T>()])
    .map(|(name, ty)| (name.to_owned(), ty))
    .chain(order.map(|((order, _), ty)| (order.as_str().to_owned(), ty)))
    .filter(|(name, _)| !found.iter().any(|f| f.name == *name))
    .collect()
}

/// One `ALTER TABLE` adding `columns` (name, type).
pub(super) fn add_columns<T: DdlTypes>(table: &TableName, columns: &[(String, &str)]) -> String {
    let q = T::DIALECT.quote();
    let clauses: Vec<String> = columns
        .iter()
        .map(|(name, ty)| format!("ADD COLUMN {q}{name}{q} {ty}"))
        .collect();
    format!(
        "ALTER TABLE {} {}",
        table.quoted_with(q),
        clauses.join(", ")
    )
}

/// The bookkeeping columns of `T`'s tables, with their types, in table order.
fn bookkeeping<'a, 'b, T: DdlTypes>() -> impl Iterator<Item = (&'a str, &'b str)> {
    schema::bookkeeping::<T>().map(|(name, holds)| match holds {
        Holds::Time => (name, T::TIME),
        Holds::Count => (name, T::COUNT),
        Holds::Text => (name, T::TEXT),
    })
}

/// The replay marker ([`columns::REPLAY`]) with its type: created and added like the
/// bookkeeping columns, but not required by the schema check.
fn replay<'a, T: DdlTypes>() -> (&'a str, &'a str) {
    let (name, holds) = columns::REPLAY;
    let ty = match holds {
        Holds::Time => T::TIME,
        Holds::Count => T::COUNT,
        Holds::Text => T::TEXT,
    };
    (name, ty)
}

/// PostgreSQL and SQLite: the partial index on rows a replay made due and that are not sent
/// yet (the marker is cleared when a row is sent, so it stays small), which the replay
/// progress of `sluice status` reads; `None` without the marker column. MySQL has no partial
/// indexes: see `mysql::migrate::index_sql`.
pub(super) fn replay_index<T: DdlTypes>(layout: &Layout) -> Option<String> {
    if !layout.replay {
        return None;
    }
    let table = &layout.table;
    let (schema, on) = match T::DIALECT {
        Driver::Sqlite => (table.schema_prefix(), format!("\"{}\"", table.table())),
        Driver::Postgres | Driver::Mysql => (String::new(), table.to_string()),
    };
    let (name, column) = (table.table(), columns::REPLAY.0);
    Some(format!(
        "CREATE INDEX IF NOT EXISTS {schema}\"{name}_replay_idx\" ON {on} (\"{column}\") \
         WHERE \"{column}\" IS NOT NULL"
    ))
}

/// One of the indexes on unsent rows.
pub(super) struct Index {
    /// What follows the table's name in the index's name.
    pub(super) suffix: String,
    /// Key parts before the claim order: the aggregate type and id of the per-key index.
    pub(super) leading: Vec<ColumnName>,
    /// The rows it covers, as a partial index's `WHERE`.
    pub(super) filter: &'static str,
    /// The bookkeeping columns `filter` tests: where there are no partial indexes (MySQL), the
    /// key parts between `leading` and the claim order.
    pub(super) filter_columns: Vec<&'static str>,
    /// The claim order: the order column then the id, or the id alone.
    pub(super) order: Vec<ColumnName>,
    /// The claim order newest first (`DESC`).
    pub(super) newest_first: bool,
}

/// [`indexes`], and `extra` if given, as partial indexes (PostgreSQL, SQLite), unless they
/// exist. PostgreSQL creates an index in its table's schema; SQLite names the schema on the
/// index, not on the table.
pub(super) fn partial_indexes<T: DdlTypes>(layout: &Layout, extra: Option<Index>) -> Vec<String> {
    let table = &layout.table;
    let (schema, on) = match T::DIALECT {
        Driver::Sqlite => (table.schema_prefix(), format!("\"{}\"", table.table())),
        Driver::Postgres | Driver::Mysql => (String::new(), table.to_string()),
    };
    let name = table.table();
    let sql = |index: &Index| {
        let direction = if index.newest_first { " DESC" } else { "" };
        let parts: Vec<String> = index
            .leading
            .iter()
            .map(ToString::to_string)
            .chain(index.order.iter().map(|c| format!("{c}{direction}")))
            .collect();
        let (suffix, parts, filter) = (&index.suffix, parts.join(", "), index.filter);
        format!(
            "CREATE INDEX IF NOT EXISTS {schema}\"{name}{suffix}\" ON {on} ({parts}) WHERE {filter}"
        )
    };
    indexes(layout).iter().chain(&extra).map(sql).collect()
}

/// Tables with a tenant column: unsent rows by tenant, each tenant's newest first (MySQL:
/// the bookkeeping columns after the tenant, in claim order; see `mysql::migrate::index_sql`).
/// It lets `relay.fair_share` walk the tenants that have rows waiting (one index probe per
/// tenant, however many rows one of them has) and take the oldest rows of each (scanning the
/// tenant's part backwards). Newest first, because a probe lands on the first entry of the
/// next tenant: a tenant whose backlog drains has its oldest entries deleted moments ago, and
/// a probe landing there would read past all of them, its newest rows are alive.
pub(super) fn tenant_index(layout: &Layout) -> Option<Index> {
    let tenant = layout.tenant.as_ref()?;
    let [unsent, ..] = indexes(layout);
    Some(Index {
        suffix: unsent.suffix.replacen("_unsent", "_unsent_tenant", 1),
        leading: vec![tenant.clone()],
        newest_first: true,
        ..unsent
    })
}

/// The indexes on unsent rows: one in claim order (keeps the claim cheap however many sent
/// rows `published_at` mode retains), one per key for `ordering = "key"` (finding an earlier
/// unsent row of the same key), and one on dead rows (the metrics sampler counts them without
/// reading the backlog). Tables ordered by a column named `id` keep the index names of
/// earlier versions.
pub(super) fn indexes(layout: &Layout) -> [Index; 3] {
    let mut order = vec![layout.order.clone()];
    if !layout.ordered_by_id() {
        order.push(layout.id.clone());
    }
    let by = match layout.order.as_str() {
        "id" => String::new(),
        other => format!("_{other}"),
    };
    let index = |kind: &str, leading: &[&ColumnName], filter: &'static str| Index {
        suffix: format!("_{kind}{by}_idx"),
        leading: leading.iter().map(|c| (*c).clone()).collect(),
        filter,
        filter_columns: ["published_at", "dead_at"]
            .into_iter()
            .filter(|c| filter.contains(c))
            .collect(),
        order: order.clone(),
        newest_first: false,
    };
    let key = [&layout.aggregate_type, &layout.aggregate_id];
    [
        index("unsent", &[], "published_at IS NULL AND dead_at IS NULL"),
        index("unsent_key", &key, "published_at IS NULL"),
        index("dead", &[], "published_at IS NULL AND dead_at IS NOT NULL"),
    ]
}
