//! Connecting to a database, whichever the driver: a pool from the options a driver reads
//! from its URL, the options replaced on rotation (SIGHUP) and tried, and the error naming the
//! URL without its password.

use std::time::Duration;

use sqlx::ConnectOptions;

use super::StoreError;
use crate::secret::redact_url as redact;

/// How long to wait for a new connection before reporting the database as unreachable.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl StoreError {
    /// Connecting to `url` failed (the URL is shown without its password).
    pub(crate) fn connect(url: &str, source: sqlx::Error) -> Self {
        Self::Connect {
            url: redact(url),
            source,
        }
    }
}

/// A pool of at most `connections` to `url`, opened with `options` as read from it.
pub(crate) async fn connect<DB: sqlx::Database>(
    url: &str,
    options: Result<ConnectOptionsOf<DB>, sqlx::Error>,
    pool: sqlx::pool::PoolOptions<DB>,
    connections: u32,
) -> Result<sqlx::Pool<DB>, StoreError> {
    let options = options.map_err(|e| StoreError::connect(url, e))?;
    pool.max_connections(connections.max(1))
        .connect_with(options)
        .await
        .map_err(|e| StoreError::connect(url, e))
}

/// Opens new connections of `pool` with `options` (read from `url`) from now on: rotated
/// credentials; connections in use, and the transactions on them, are not touched. Then tries
/// one new connection (the error is its, though the options are in use all the same).
pub(crate) async fn use_options<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    url: &str,
    options: Result<ConnectOptionsOf<DB>, sqlx::Error>,
) -> Result<(), StoreError> {
    let options = options.map_err(|e| StoreError::connect(url, e))?;
    pool.set_connect_options(options.clone());
    let tried = match tokio::time::timeout(CONNECT_TIMEOUT, options.connect()).await {
        Ok(Ok(connection)) => sqlx::Connection::close(connection).await,
        Ok(Err(e)) => Err(e),
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "no connection within {}",
                humantime::format_duration(CONNECT_TIMEOUT)
            ),
        ))),
    };
    tried.map_err(|e| StoreError::connect(url, e))
}

/// A database's connection options.
type ConnectOptionsOf<DB> = <<DB as sqlx::Database>::Connection as sqlx::Connection>::Options;
