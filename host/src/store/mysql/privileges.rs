//! [`MyStore::check_privileges`]: probing the relay's privileges on the table (see
//! [`crate::store::privileges`]).

use sqlx::AssertSqlSafe;

use super::MyStore;
use crate::store::StoreError;
use crate::store::privileges::{MissingPrivilege, Need, is_denied, probe};

impl MyStore {
    /// Runs one probe per need in a transaction that is rolled back; the first one refused
    /// for want of a privilege is reported with the `GRANT` that covers all of `needs`.
    pub async fn check_privileges(&self, needs: &[Need]) -> Result<(), StoreError> {
        let table = &self.statements.sql.table;
        let mut tx = self.pool.begin().await?;
        for need in needs {
            match sqlx::query(AssertSqlSafe(probe(need.privilege, table)))
                .execute(&mut *tx)
                .await
            {
                Ok(_) => {}
                Err(e) if is_denied(&e) => {
                    // 'user'@'host', as GRANT spells it.
                    let user: String = sqlx::query_scalar(
                        "SELECT CAST(CONCAT(QUOTE(SUBSTRING_INDEX(CURRENT_USER(), '@', 1)), '@',
                                            QUOTE(SUBSTRING_INDEX(CURRENT_USER(), '@', -1)))
                                     AS CHAR)",
                    )
                    .fetch_one(&mut *tx)
                    .await?;
                    return Err(MissingPrivilege::refused(needs, need, table, user, &e));
                }
                Err(e) => return Err(e.into()),
            }
        }
        tx.rollback().await?;
        Ok(())
    }
}
