//! Checking at start-up that the database user may do to the outbox table what the relay will
//! do, so a missing grant stops `sluice run` with the privilege named instead of failing
//! batch after batch. Without `DELETE` in `mark = "delete"` mode that failure would come after
//! the publish: every batch would be rolled back and published again.
//!
//! Each privilege is probed with a statement of its kind that matches no row (`WHERE 1 = 0`),
//! in a transaction that is rolled back: the database checks privileges before it looks for
//! rows, so the probe fails exactly as the relay's statement would, and changes nothing.

use sqlx::Acquire;

use super::columns::{BOOKKEEPING, REPLAY};
use super::driver::StoreDriver;
use super::layout_sql::LayoutSql;
use super::statement::{Execute, ReadRow, Statement};
use super::{MarkMode, Store, StoreError};

/// A table privilege the relay needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    /// Finding due rows and reading them.
    Select,
    /// Claiming rows (`FOR UPDATE`), recording failed attempts, setting `published_at`.
    Update,
    /// Marking rows sent with `mark = "delete"`, and pruning sent rows.
    Delete,
    /// `UPDATE` of the replay marker column (`replay_id`, which `sluice migrate` adds): a
    /// relay in `mark = "published_at"` mode clears it when it marks a row sent, and `sluice
    /// replay` sets it. Probed apart from [`Privilege::Update`] because a column-level grant
    /// of the other bookkeeping columns leaves it out: the relay would then publish every
    /// batch and fail to mark it, again and again. Only probed on a table that has the column.
    UpdateReplayId,
}

impl Privilege {
    /// The SQL keyword, as in `GRANT`.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Select => "SELECT",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
            Self::UpdateReplayId => "UPDATE (replay_id)",
        }
    }
}

/// A privilege and what the relay needs it for (shown when it is missing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// The privilege on the outbox table.
    pub privilege: Privilege,
    /// What the relay does with it, completing "needed …" (e.g. "to find due rows").
    pub why: &'static str,
}

/// What `sluice run` and `sluice drain` need with `mark`; `prunes`: the retention pruner runs
/// (`mark = "published_at"` with a `relay.retention` other than `"forever"`).
pub fn relay_needs(mark: MarkMode, prunes: bool) -> Vec<Need> {
    let need = |privilege, why| Need { privilege, why };
    let mut needs = vec![
        need(Privilege::Select, "to find due rows and read them"),
        need(
            Privilege::Update,
            "to claim rows (SELECT … FOR UPDATE) and to record failed attempts",
        ),
    ];
    let delete = match (mark, prunes) {
        (MarkMode::Delete, _) => Some("to mark rows sent with relay.mark = \"delete\""),
        (MarkMode::PublishedAt, true) => {
            Some("for the pruner to delete sent rows older than relay.retention")
        }
        (MarkMode::PublishedAt, false) => None,
    };
    needs.extend(delete.map(|why| need(Privilege::Delete, why)));
    if mark == MarkMode::PublishedAt {
        needs.push(need(
            Privilege::UpdateReplayId,
            "to clear the replay marker when it marks a row sent (a column-level UPDATE grant \
             must name replay_id too)",
        ));
    }
    needs
}

/// What `sluice replay` needs: it reads the sent rows and makes them due again, marked with
/// the replay's id.
pub fn replay_needs() -> Vec<Need> {
    let need = |privilege, why| Need { privilege, why };
    vec![
        need(Privilege::Select, "to find the sent rows to replay"),
        need(Privilege::Update, "to make sent rows due again"),
        need(
            Privilege::UpdateReplayId,
            "to mark the rows with the replay's id (a column-level UPDATE grant must name \
             replay_id too)",
        ),
    ]
}

/// A privilege the database user lacks on the outbox table: what it is needed for, what the
/// database said, and the `GRANT` that gives the user everything the relay needs.
#[derive(Debug, thiserror::Error)]
#[error(
    "outbox table {table}: the database user {user} lacks the {privilege} privilege, needed \
     {why} (the database said: {message}). Grant what the relay needs: {grant} (see \
     docs/databases.md#database-roles)"
)]
pub struct MissingPrivilege {
    /// The outbox table, as quoted in SQL.
    pub table: String,
    /// The database user the relay connects as.
    pub user: String,
    /// The missing privilege's keyword (e.g. `DELETE`).
    pub privilege: &'static str,
    /// What the relay needs it for ([`Need::why`]).
    pub why: &'static str,
    /// The database's error message for the refused probe.
    pub message: String,
    /// A `GRANT` of every privilege the relay needs on the table, to the user.
    pub grant: String,
}

/// The `GRANT` that gives `user` every privilege in `needs` on `table` (a table-level
/// `UPDATE` covers the replay marker).
fn grant_statement(needs: &[Need], table: &str, user: &str) -> String {
    let mut privileges: Vec<&str> = Vec::new();
    for need in needs {
        let keyword = match need.privilege {
            Privilege::UpdateReplayId => Privilege::Update.keyword(),
            other => other.keyword(),
        };
        if !privileges.contains(&keyword) {
            privileges.push(keyword);
        }
    }
    format!("GRANT {} ON {table} TO {user}", privileges.join(", "))
}

/// A statement needing `privilege` on `table` that changes no row (`1 = 0` reads the same
/// in PostgreSQL and MySQL/MariaDB).
fn probe(privilege: Privilege, table: &str) -> String {
    match privilege {
        Privilege::Select => format!("SELECT 1 FROM {table} WHERE 1 = 0"),
        // What the claim (FOR UPDATE; MySQL 8 wants UPDATE or DELETE besides SELECT for it)
        // and the reschedule need: UPDATE of the bookkeeping columns.
        Privilege::Update => {
            let set: Vec<String> = BOOKKEEPING
                .iter()
                .map(|(c, _)| format!("{c} = {c}"))
                .collect();
            format!("UPDATE {table} SET {} WHERE 1 = 0", set.join(", "))
        }
        Privilege::Delete => format!("DELETE FROM {table} WHERE 1 = 0"),
        Privilege::UpdateReplayId => {
            let (c, _) = REPLAY;
            format!("UPDATE {table} SET {c} = {c} WHERE 1 = 0")
        }
    }
}

/// Whether a probe failed for want of a privilege (rather than for any other reason, which is
/// reported as the database error it is). PostgreSQL: SQLSTATE 42501; MySQL/MariaDB: errors
/// 1142 (table) and 1143 (column).
fn is_denied(error: &sqlx::Error) -> bool {
    let Some(db) = error.as_database_error() else {
        return false;
    };
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return matches!(my.number(), 1142 | 1143);
    }
    db.code().is_some_and(|code| code == "42501")
}

impl Store {
    /// Refuses with [`StoreError::Privilege`] when the database user lacks one of `needs` on
    /// the outbox table. SQLite has no users: nothing to check.
    pub async fn check_privileges(&self, needs: &[Need]) -> Result<(), StoreError> {
        // The user as GRANT spells it.
        const PG_USER: &str = "SELECT quote_ident(current_user)";
        const MY_USER: &str = "SELECT CAST(CONCAT(QUOTE(SUBSTRING_INDEX(CURRENT_USER(), '@', 1)),
                             '@', QUOTE(SUBSTRING_INDEX(CURRENT_USER(), '@', -1))) AS CHAR)";
        match self {
            Store::Postgres(s) => check(s.pool(), s.sql(), needs, PG_USER).await,
            Store::Mysql(s) => check(s.pool(), s.sql(), needs, MY_USER).await,
            Store::Sqlite(_) => Ok(()),
        }
    }
}

/// Runs one probe per need in a transaction that is rolled back, each in a savepoint (a
/// refused statement aborts PostgreSQL's transaction); the first one refused for want of a
/// privilege is reported with the `GRANT` that covers all of `needs`, naming the user as
/// `current_user` (a query) gives it.
async fn check<DB: Execute>(
    pool: &sqlx::Pool<DB>,
    sql: &LayoutSql,
    needs: &[Need],
    current_user: &str,
) -> Result<(), StoreError> {
    let statement = |text: String| Statement::new(sql.dialect).with_sql(text);
    let mut tx = pool.begin().await?;
    // A table without the replay marker (not migrated since) has nothing to clear.
    let needs_here = needs
        .iter()
        .filter(|n| n.privilege != Privilege::UpdateReplayId || sql.layout.replay);
    for need in needs_here {
        let mut probe_tx = Acquire::begin(&mut tx).await?;
        let result = DB::execute(
            &mut *probe_tx,
            &statement(probe(need.privilege, &sql.table)),
        )
        .await;
        probe_tx.rollback().await?;
        match result {
            Ok(_) => {}
            Err(e) if is_denied(&e) => {
                let user = DB::fetch_all(&mut *tx, &statement(current_user.to_owned())).await?;
                let user = user.first().map(|row| row.text(0)).transpose()?.flatten();
                let user = user.unwrap_or_else(|| "CURRENT_USER".to_owned());
                let message = e.as_database_error().map(|db| db.message().to_owned());
                return Err(StoreError::Privilege(Box::new(MissingPrivilege {
                    grant: grant_statement(needs, &sql.table, &user),
                    table: sql.table.clone(),
                    user,
                    privilege: need.privilege.keyword(),
                    why: need.why,
                    message: message.unwrap_or_else(|| e.to_string()),
                })));
            }
            Err(e) => return Err(e.into()),
        }
    }
    tx.rollback().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn privileges(needs: &[Need]) -> Vec<&'static str> {
        needs.iter().map(|n| n.privilege.keyword()).collect()
    }

    #[test]
    fn delete_is_needed_to_mark_by_deleting_or_to_prune() {
        assert_eq!(
            privileges(&relay_needs(MarkMode::Delete, false)),
            ["SELECT", "UPDATE", "DELETE"]
        );
        assert_eq!(
            privileges(&relay_needs(MarkMode::PublishedAt, true)),
            ["SELECT", "UPDATE", "DELETE", "UPDATE (replay_id)"]
        );
        assert_eq!(
            privileges(&relay_needs(MarkMode::PublishedAt, false)),
            ["SELECT", "UPDATE", "UPDATE (replay_id)"]
        );
    }

    #[test]
    fn the_grant_names_every_needed_privilege() {
        assert_eq!(
            grant_statement(
                &relay_needs(MarkMode::Delete, false),
                "\"outbox\"",
                "\"relay\""
            ),
            "GRANT SELECT, UPDATE, DELETE ON \"outbox\" TO \"relay\""
        );
        // The replay marker is covered by the table-level UPDATE.
        assert_eq!(
            grant_statement(&replay_needs(), "\"outbox\"", "\"relay\""),
            "GRANT SELECT, UPDATE ON \"outbox\" TO \"relay\""
        );
    }
}
