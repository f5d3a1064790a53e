//! `sluice migrate` on SQLite: the statements of [`crate::store::ddl`], in one write
//! transaction (`BEGIN IMMEDIATE`, which also keeps concurrent runs apart); then the same
//! check `sluice run` makes. SQLite's DDL is transactional: a table Sluice cannot use is
//! refused and left unchanged.

use sqlx::sqlite::SqliteConnection;
use sqlx::{AssertSqlSafe, Executor};

use super::schema::{self, LiteTypes};
use crate::store::ddl::{self, DdlTypes};
use crate::store::dialect::Driver;
use crate::store::schema::{Layout, check};
use crate::store::{StoreError, TableSpec};

/// The id is `AUTOINCREMENT`: without it SQLite reuses the ids of the newest rows once they are
/// deleted, and consumers that deduplicate by id would drop new messages. The payload is
/// `TEXT` (JSON kept as written: a `JSON` column's numeric affinity would turn `1e3` into
/// `1000.0`). Sluice's times are milliseconds since the Unix epoch.
impl DdlTypes for LiteTypes {
    const DIALECT: Driver = Driver::Sqlite;
    const ID: &'static str = "INTEGER PRIMARY KEY AUTOINCREMENT";
    const STRING: &'static str = "TEXT";
    const PAYLOAD: &'static str = "TEXT";
    const HEADERS: &'static str = "TEXT NOT NULL DEFAULT '{}'";
    const CREATED_AT: &'static str =
        "TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))";
    /// SQLite cannot add a column with a non-constant default: rows without `created_at` are
    /// read as the time of their claim.
    const CREATED_AT_ADDED: &'static str = "TEXT";
    const ORDER: &'static str = "INTEGER NOT NULL";
    const TIME: &'static str = "INTEGER";
    const COUNT: &'static str = "INTEGER NOT NULL DEFAULT 0";
    const TEXT: &'static str = "TEXT";
}

/// Creates or upgrades the table and its indexes inside the caller's write transaction; with
/// `tenant_index`, also the index `relay.fair_share` walks ([`ddl::tenant_index`]).
pub(super) async fn migrate(
    conn: &mut SqliteConnection,
    spec: &TableSpec,
    tenant_index: bool,
) -> Result<Layout, StoreError> {
    let found = schema::read_columns(&mut *conn, &spec.name).await?;
    let changes = if found.is_empty() {
        vec![ddl::create_table::<LiteTypes>(spec)]
    } else {
        // SQLite adds one column per statement; the caller's rollback undoes them if the
        // check below refuses the table.
        let missing = ddl::missing_columns::<LiteTypes>(spec, &found);
        missing
            .chunks(1)
            .map(|added| ddl::add_columns::<LiteTypes>(&spec.name, added))
            .collect()
    };
    for sql in changes {
        conn.execute(AssertSqlSafe(sql)).await?;
    }
    let found = schema::read_columns(&mut *conn, &spec.name).await?;
    let layout = check::<LiteTypes>(spec, &found)?;
    let tenant = tenant_index.then(|| ddl::tenant_index(&layout)).flatten();
    let replay = ddl::replay_index::<LiteTypes>(&layout);
    for sql in ddl::partial_indexes::<LiteTypes>(&layout, tenant)
        .into_iter()
        .chain(replay)
    {
        conn.execute(AssertSqlSafe(sql)).await?;
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TableName;
    use crate::store::schema::FoundColumn;
    use crate::store::test_layouts::{sluice_layout, squash};

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
            unique_with: Vec::new(),
        }];
        let adds: Vec<String> = ddl::missing_columns::<LiteTypes>(&spec, &found)
            .into_iter()
            .map(|added| squash(&ddl::add_columns::<LiteTypes>(&spec.name, &[added])))
            .collect();
        assert_eq!(adds.len(), 9, "{adds:?}");
        assert_eq!(
            adds[0],
            "ALTER TABLE \"outbox\" ADD COLUMN \"created_at\" TEXT"
        );
        assert_eq!(
            adds[7],
            "ALTER TABLE \"outbox\" ADD COLUMN \"lease_until\" INTEGER"
        );
        assert_eq!(
            adds[8],
            "ALTER TABLE \"outbox\" ADD COLUMN \"replay_id\" TEXT"
        );
        let create = squash(&ddl::create_table::<LiteTypes>(&spec));
        assert!(
            create.contains("\"id\" INTEGER PRIMARY KEY AUTOINCREMENT"),
            "{create}"
        );
        assert!(
            create.ends_with("\"lease_until\" INTEGER, \"replay_id\" TEXT)"),
            "{create}"
        );
    }

    #[test]
    fn indexes_of_a_table_in_an_attached_database_name_its_schema() {
        let mut layout = sluice_layout();
        layout.table = TableName::parse("aux.outbox").unwrap();
        let sql = ddl::partial_indexes::<LiteTypes>(&layout, None);
        assert_eq!(
            squash(&sql[0]),
            "CREATE INDEX IF NOT EXISTS \"aux\".\"outbox_unsent_idx\" ON \"outbox\" (\"id\") \
             WHERE published_at IS NULL AND dead_at IS NULL"
        );
        assert_eq!(sql.len(), 3);
    }
}
