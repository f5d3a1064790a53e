//! The one connection a sink's batches share: a redis-rs `MultiplexedConnection`, made on first
//! use and made again after it broke. One connection, so the pipelines of successive batches
//! reach Redis, and are applied, in the order they were sent; Redis answers a connection's
//! commands in order, which is also what [`super::RedisSink`]'s flush relies on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, ConnectionAddr};
use tokio::time::Instant;

use super::faults::connection_problem;
use super::watch::Watch;
use crate::sink::connection::ConnectionProblem;

/// A client and its current connection.
pub(super) struct Link {
    client: ::redis::Client,
    config: AsyncConnectionConfig,
    /// `rediss://`: a client error while connecting is the TLS handshake's.
    tls: bool,
    /// `host:port`, for messages.
    address: String,
    /// The connection batches use; `None` before the first and after one broke. A
    /// `tokio` mutex: held while connecting, so concurrent batches wait for one attempt
    /// instead of each making its own.
    slot: tokio::sync::Mutex<Option<Connection>>,
    made: AtomicU64,
}

/// One connection, with a number telling it from the ones before and after it.
#[derive(Clone)]
pub(super) struct Connection {
    id: u64,
    pub(super) conn: MultiplexedConnection,
}

impl Connection {
    /// One `PING` on this connection: answered after every command sent on it before.
    pub(super) async fn ping(&self) -> ::redis::RedisResult<::redis::Value> {
        let mut conn = self.conn.clone();
        ::redis::cmd("PING").query_async(&mut conn).await
    }
}

/// Why no connection could be had: the kind of trouble, and what was said.
pub(super) type ConnectError = (ConnectionProblem, String);

impl Link {
    /// A link for `client`; connects on first use.
    pub(super) fn new(client: ::redis::Client, timeout: Duration) -> Self {
        let addr = client.get_connection_info().addr();
        let tls = matches!(addr, ConnectionAddr::TcpTls { .. });
        let address = addr.to_string();
        // Replies are awaited under the batch's own deadline, not redis-rs' (500 ms by
        // default, shorter than a large pipeline or a `WAIT` may take).
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(None);
        Self {
            client,
            config,
            tls,
            address,
            slot: tokio::sync::Mutex::new(None),
            made: AtomicU64::new(0),
        }
    }

    /// `host:port`.
    pub(super) fn address(&self) -> &str {
        &self.address
    }

    /// Whether the connection is TLS.
    pub(super) fn tls(&self) -> bool {
        self.tls
    }

    /// The current connection, or a new one made by `deadline`. A failure is filed with
    /// `watch` (logged once per change); a new connection clears its problem.
    pub(super) async fn connection(
        &self,
        deadline: Instant,
        watch: &Watch,
    ) -> Result<Connection, ConnectError> {
        let mut slot = match tokio::time::timeout_at(deadline, self.slot.lock()).await {
            Ok(slot) => slot,
            Err(_) => {
                return Err((
                    ConnectionProblem::Unreachable,
                    format!(
                        "still connecting to {} (another attempt is under way)",
                        self.address
                    ),
                ));
            }
        };
        if let Some(current) = slot.as_ref() {
            return Ok(current.clone());
        }
        let connecting = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config);
        let error = match tokio::time::timeout_at(deadline, connecting).await {
            Ok(Ok(conn)) => {
                let id = self.made.fetch_add(1, Ordering::Relaxed) + 1;
                let current = Connection { id, conn };
                *slot = Some(current.clone());
                tracing::debug!(address = %self.address, id, "redis: connected");
                watch.works();
                return Ok(current);
            }
            Ok(Err(e)) => (
                connection_problem(&e, self.tls),
                format!("cannot connect to {}: {e}", self.address),
            ),
            Err(_) => (
                ConnectionProblem::Unreachable,
                format!("no connection to {} within the time allowed", self.address),
            ),
        };
        watch.lost(error.0, &error.1);
        Err(error)
    }

    /// The current connection, if there is one (none is made).
    pub(super) async fn current(&self) -> Option<Connection> {
        self.slot.lock().await.clone()
    }

    /// Drops `broken` from the slot (unless it was replaced already), so the next batch
    /// connects anew. Batches still holding it finish with its error.
    pub(super) async fn discard(&self, broken: &Connection) {
        let mut slot = self.slot.lock().await;
        if slot.as_ref().is_some_and(|c| c.id == broken.id) {
            tracing::debug!(address = %self.address, id = broken.id, "redis: connection dropped");
            *slot = None;
        }
    }
}
