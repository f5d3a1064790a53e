//! `sluice migrate` on SQLite: creating the outbox table, or upgrading one the application
//! created, and its partial indexes, in one write transaction (`BEGIN IMMEDIATE`, which also
//! keeps concurrent runs apart); then the same check `sluice run` makes. SQLite's DDL is
//! transactional: a table Sluice cannot use is refused and left unchanged.

use sqlx::sqlite::SqliteConnection;
use sqlx::{AssertSqlSafe, Executor};

use super::schema;
use crate::store::columns;
use crate::store::schema::{FoundColumn, Layout};
use crate::store::{ColumnName, StoreError, TableSpec, TenantColumn};

/// Creates or upgrades the table and its indexes inside the caller's write transaction.
pub(super) async fn migrate(
    conn: &mut SqliteConnection,
    spec: &TableSpec,
) -> Result<Layout, StoreError> {
    let found = schema::read_columns(&mut *conn, &spec.name).await?;
    if found.is_empty() {
        run(&mut *conn, create_table_sql(spec)).await?;
    } else {
        // SQLite adds one column per statement; the caller's rollback undoes them if the
        // check below refuses the table.
        for sql in add_columns_sql(spec, &found) {
            run(&mut *conn, sql).await?;
        }
    }
    let found = schema::read_columns(&mut *conn, &spec.name).await?;
    let layout = schema::check(spec, &found)?;
    for sql in index_sql(&layout) {
        run(&mut *conn, sql).await?;
    }
    Ok(layout)
}

async fn run(conn: &mut SqliteConnection, sql: String) -> Result<(), StoreError> {
    conn.execute(AssertSqlSafe(sql)).await?;
    Ok(())
}

/// `CREATE TABLE IF NOT EXISTS` with the mapped column names and Sluice's types. The id is
/// `INTEGER PRIMARY KEY AUTOINCREMENT`: without `AUTOINCREMENT` SQLite reuses the ids of the
/// newest rows once they are deleted, and consumers that deduplicate by id would drop new
/// messages. The payload is `TEXT` (JSON text kept as written: a `JSON` column's numeric
/// affinity would turn `1e3` into `1000.0`).
fn create_table_sql(spec: &TableSpec) -> String {
    let c = &spec.columns;
    let tenant = match &c.tenant {
        TenantColumn::IfPresent(t) | TenantColumn::Named(t) => format!("{t} TEXT,"),
        TenantColumn::None => String::new(),
    };
    let order = match &c.order {
        Some(order) if *order != c.id => format!("{order} INTEGER NOT NULL,"),
        _ => String::new(),
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
            {id}            INTEGER PRIMARY KEY AUTOINCREMENT,
            {tenant}
            {at}            TEXT    NOT NULL,
            {ai}            TEXT    NOT NULL,
            {et}            TEXT    NOT NULL,
            {payload}       TEXT,
            {headers}       TEXT    NOT NULL DEFAULT '{{}}',
            {created_at}    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
            {order}
            published_at    INTEGER,
            attempts        INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER,
            last_error      TEXT,
            dead_at         INTEGER,
            leased_by       TEXT,
            lease_until     INTEGER
        )",
        table = spec.name,
        id = c.id,
        at = c.aggregate_type,
        ai = c.aggregate_id,
        et = c.event_type,
        payload = c.payload,
        headers = c.headers,
        created_at = c.created_at,
    )
}

/// What an application's own table lacks. SQLite cannot add a column with a non-constant
/// default, so a missing `created_at` is added nullable (existing and new rows without it are
/// read as the time of their claim).
fn add_columns_sql(spec: &TableSpec, found: &[FoundColumn]) -> Vec<String> {
    let c = &spec.columns;
    let wanted: [(&str, String); 9] = [
        (c.headers.as_str(), "TEXT NOT NULL DEFAULT '{}'".to_owned()),
        (c.created_at.as_str(), "TEXT".to_owned()),
        (columns::PUBLISHED_AT, "INTEGER".to_owned()),
        (columns::ATTEMPTS, "INTEGER NOT NULL DEFAULT 0".to_owned()),
        (columns::NEXT_ATTEMPT_AT, "INTEGER".to_owned()),
        (columns::LAST_ERROR, "TEXT".to_owned()),
        (columns::DEAD_AT, "INTEGER".to_owned()),
        (columns::LEASED_BY, "TEXT".to_owned()),
        (columns::LEASE_UNTIL, "INTEGER".to_owned()),
    ];
    wanted
        .into_iter()
        .filter(|(name, _)| !found.iter().any(|f| f.name == *name))
        .filter_map(|(name, ty)| {
            let column = ColumnName::parse(name).ok()?;
            Some(format!(
                "ALTER TABLE {} ADD COLUMN {column} {ty}",
                spec.name
            ))
        })
        .collect()
}

/// The partial indexes on unsent rows, in claim order and per key, and on dead rows (for the
/// metrics sampler). SQLite puts an index's schema on its name, not on the table.
fn index_sql(layout: &Layout) -> [String; 3] {
    let name = layout.table.table();
    let prefix = layout.table.schema_prefix();
    let order_columns = if layout.ordered_by_id() {
        layout.id.to_string()
    } else {
        format!("{}, {}", layout.order, layout.id)
    };
    let suffix = match layout.order.as_str() {
        "id" => String::new(),
        other => format!("_{other}"),
    };
    [
        format!(
            "CREATE INDEX IF NOT EXISTS {prefix}\"{name}_unsent{suffix}_idx\" ON \"{name}\"
                ({order_columns}) WHERE published_at IS NULL AND dead_at IS NULL"
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {prefix}\"{name}_unsent_key{suffix}_idx\" ON \"{name}\"
                ({at}, {ai}, {order_columns}) WHERE published_at IS NULL",
            at = layout.aggregate_type,
            ai = layout.aggregate_id,
        ),
        // Dead rows, for the metrics sampler.
        format!(
            "CREATE INDEX IF NOT EXISTS {prefix}\"{name}_dead{suffix}_idx\" ON \"{name}\"
                ({order_columns}) WHERE published_at IS NULL AND dead_at IS NOT NULL"
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TableName;

    #[test]
    fn an_application_table_gets_the_missing_columns_one_statement_each() {
        let spec = TableSpec::new(TableName::parse("outbox").unwrap());
        let found = [FoundColumn {
            name: "headers".into(),
            shown: "TEXT".into(),
            base: "text".into(),
            bounded: false,
            not_null: true,
            unique: false,
        }];
        let adds = add_columns_sql(&spec, &found);
        assert_eq!(adds.len(), 8, "{adds:?}");
        assert_eq!(
            adds[0],
            "ALTER TABLE \"outbox\" ADD COLUMN \"created_at\" TEXT"
        );
        assert!(
            adds.iter().any(|a| a.ends_with("\"lease_until\" INTEGER")),
            "{adds:?}"
        );
        let create = create_table_sql(&spec);
        assert!(
            create.contains("INTEGER PRIMARY KEY AUTOINCREMENT"),
            "{create}"
        );
    }
}
