//! Optional wake-ups through LISTEN/NOTIFY: the opt-in trigger `sluice migrate
//! --notify-trigger` installs, and the listener that makes an idle relay poll at once.
//!
//! Polling stays the mechanism; a notification only cuts an idle wait short. A lost
//! connection, a server that never notifies (PgBouncer in transaction mode), or no trigger at
//! all just means rows wait for the next poll.

use std::sync::Arc;
use std::time::Duration;

use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};

use super::{StoreError, TableName, connect_options};
use crate::relay::pacer::Pacer;
use crate::shutdown::Shutdown;

/// Channel `sluice migrate --notify-trigger` notifies unless told otherwise.
pub const DEFAULT_CHANNEL: &str = "sluice_outbox";
/// First pause before reconnecting a failed listener; doubled up to [`LISTEN_RETRY_MAX`].
const LISTEN_RETRY: Duration = Duration::from_secs(1);
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(60);

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
/// `channel` per inserting statement. `channel` must be validated
/// ([`crate::config::validate_channel`]): it is interpolated into the function body.
///
/// Cost: NOTIFY takes a database-wide lock at commit, which serialises inserting commits
/// (see docs/benchmarks.md for the figure on this machine).
pub async fn install_trigger(
    pool: &PgPool,
    table: &TableName,
    channel: &str,
) -> Result<(), StoreError> {
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
pub async fn drop_trigger(pool: &PgPool, table: &TableName) -> Result<(), StoreError> {
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

/// Listens on `channel` until shutdown and wakes `pacer` on every notification. Runs on its
/// own connection; reconnects with back-off and never fails the relay.
pub fn spawn_listener(url: String, channel: String, pacer: Arc<Pacer>, mut shutdown: Shutdown) {
    tokio::spawn(async move {
        let mut retry = LISTEN_RETRY;
        loop {
            let result = tokio::select! {
                r = listen(&url, &channel, &pacer) => r,
                _ = shutdown.recv() => return,
            };
            let Err(e) = result;
            tracing::warn!(channel, error = %e, retry_in = ?retry,
                "LISTEN failed; relying on polling until it works again");
            // Notifications may have been missed while the connection was down.
            pacer.wake();
            tokio::select! {
                _ = tokio::time::sleep(retry) => {}
                _ = shutdown.recv() => return,
            }
            retry = (retry * 2).min(LISTEN_RETRY_MAX);
        }
    });
}

/// Listens until an error; returns only with it.
async fn listen(
    url: &str,
    channel: &str,
    pacer: &Pacer,
) -> Result<std::convert::Infallible, sqlx::Error> {
    // A pool of one, used by the listener to reconnect.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_with(connect_options(url)?)
        .await?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(channel).await?;
    tracing::info!(channel, "listening for notifications");
    // Rows inserted before LISTEN took effect were not announced.
    pacer.wake();
    loop {
        match listener.try_recv().await? {
            Some(_) => pacer.wake(),
            // The connection was lost and is re-established on the next call; anything sent
            // meanwhile was missed, so poll once.
            None => {
                tracing::warn!(channel, "LISTEN connection lost; reconnecting");
                pacer.wake();
            }
        }
    }
}
