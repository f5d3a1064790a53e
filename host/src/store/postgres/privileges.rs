//! [`PgStore::check_privileges`]: probing the relay's privileges on the table (see
//! [`crate::store::privileges`]).

use sqlx::{Acquire, AssertSqlSafe};

use super::PgStore;
use crate::store::StoreError;
use crate::store::privileges::{MissingPrivilege, Need, is_denied, probe};

impl PgStore {
    /// Runs one probe per need in a transaction that is rolled back; the first one refused
    /// for want of a privilege is reported with the `GRANT` that covers all of `needs`.
    pub async fn check_privileges(&self, needs: &[Need]) -> Result<(), StoreError> {
        let table = self.sql.table.clone();
        let mut tx = self.pool.begin().await?;
        for need in needs {
            // A savepoint each: a refused statement aborts its (sub)transaction.
            let mut probe_tx = Acquire::begin(&mut tx).await?;
            let result = sqlx::query(AssertSqlSafe(probe(need.privilege, &table)))
                .execute(&mut *probe_tx)
                .await;
            probe_tx.rollback().await?;
            match result {
                Ok(_) => {}
                Err(e) if is_denied(&e) => {
                    let user: String = sqlx::query_scalar("SELECT quote_ident(current_user)")
                        .fetch_one(&mut *tx)
                        .await?;
                    return Err(MissingPrivilege::refused(needs, need, &table, user, &e));
                }
                Err(e) => return Err(e.into()),
            }
        }
        tx.rollback().await?;
        Ok(())
    }
}
