//! Optional wake-ups through LISTEN/NOTIFY: the opt-in trigger `sluice migrate
//! --notify-trigger` installs, and listening for it.
//!
//! Polling stays the mechanism; a notification only cuts an idle wait short. A lost
//! connection, a server that never notifies (PgBouncer in transaction mode), or no trigger at
//! all just means rows wait for the next poll.

use std::convert::Infallible;

use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};

use crate::store::{StoreError, TableName};

/// Channel `sluice migrate --notify-trigger` notifies unless told otherwise.
pub const DEFAULT_CHANNEL: &str = "sluice_outbox";

/// A LISTEN/NOTIFY channel name: a plain identifier, since it is interpolated into `LISTEN`
/// and into the trigger function's body.
pub fn validate_channel(channel: &str) -> Result<(), String> {
    let ok = !channel.is_empty()
        && channel.len() <= 63
        && !channel.starts_with(|c: char| c.is_ascii_digit())
        && channel
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid channel name {channel:?}: use 1-63 ASCII letters, digits and '_', not starting with a digit"
        ))
    }
}

fn function_name(table: &TableName) -> String {
    format!(
        "{}\"{}_sluice_notify\"",
        table.schema_prefix(),
        table.table()
    )
}

fn trigger_name(table: &TableName) -> String {
    format!("\"{}_sluice_notify\"", table.table())
}

/// Installs (or replaces) a statement-level `AFTER INSERT` trigger that sends one NOTIFY on
/// `channel` per inserting statement. `channel` is checked with [`validate_channel`] first:
/// it is interpolated into the function body.
///
/// Cost: NOTIFY takes a database-wide lock at commit, which serialises inserting commits
/// (see docs/benchmarks.md for the figure on this machine).
pub(super) async fn install_trigger(
    pool: &PgPool,
    table: &TableName,
    channel: &str,
) -> Result<(), StoreError> {
    validate_channel(channel).map_err(StoreError::Channel)?;
    let function = function_name(table);
    let trigger = trigger_name(table);
    let statements = [
        format!(
            "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM pg_notify('{channel}', '');
                 RETURN NULL;
             END $$"
        ),
        format!("DROP TRIGGER IF EXISTS {trigger} ON {table}"),
        format!(
            "CREATE TRIGGER {trigger} AFTER INSERT ON {table}
                 FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        ),
    ];
    run_in_transaction(pool, &statements).await
}

/// Removes the trigger and its function, if present.
pub(super) async fn drop_trigger(pool: &PgPool, table: &TableName) -> Result<(), StoreError> {
    let statements = [
        format!("DROP TRIGGER IF EXISTS {} ON {table}", trigger_name(table)),
        format!("DROP FUNCTION IF EXISTS {}()", function_name(table)),
    ];
    run_in_transaction(pool, &statements).await
}

async fn run_in_transaction(pool: &PgPool, statements: &[String]) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL client_min_messages = warning")
        .execute(&mut *tx)
        .await?;
    for sql in statements {
        sqlx::query(AssertSqlSafe(sql.as_str()))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Listens on `channel` on a connection of its own and calls `wake` for every notification,
/// once when listening starts (rows inserted before LISTEN took effect were not announced)
/// and once after the connection was lost and re-established. Returns only with an error.
pub(super) async fn listen(
    options: &PgConnectOptions,
    channel: &str,
    wake: &(dyn Fn() + Send + Sync),
) -> Result<Infallible, StoreError> {
    validate_channel(channel).map_err(StoreError::Channel)?;
    // A pool of one, used by the listener to reconnect.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_with(options.clone())
        .await?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(channel).await?;
    tracing::info!(channel, "listening for notifications");
    wake();
    loop {
        match listener.try_recv().await? {
            Some(_) => wake(),
            // The connection was lost and is re-established on the next call; anything sent
            // meanwhile was missed, so poll once.
            None => {
                tracing::warn!(channel, "LISTEN connection lost; reconnecting");
                wake();
            }
        }
    }
}
