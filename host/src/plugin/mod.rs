//! The plugin host: what the relay sees of it — [`RowTransformer`], implemented by
//! [`PluginRouter`] — and, private behind it, the wasmtime sandbox.
//!
//! Read in this order:
//! - [`router`]: routing rows to their tenants for the relay, start-up quarantine, the cap on
//!   instances of tenants without their own entry, the status read API
//! - `tenant/`: one tenant (its plugin template and instance, breaker, quarantine, per-batch
//!   budgets) and what the router reports about it
//! - `wasm/`: the wasmtime side — engine and epoch ticker, loading a component, a tenant's
//!   `wasmtime::Store` and the guest calls (each bounded in wall-clock time), the host API guests
//!   call
//! - [`limits`]: a tenant's sandbox limits as data, the topic allow-list, the `wasmtime::Store`
//!   limiter
//! - [`metrics`]: what a batch's plugin calls record (time and outcomes per tenant)
//! - [`output`]: what the host accepts from a plugin, and the headers it stamps
//! - [`builtin`]: routing plugins compiled into the host (no WASM)
//! - [`reload`]: hot reload and quarantine retries
//! - [`settings`]: `[plugins]`, `[plugins.default]` and `[tenants.<name>]` as written
//! - [`testbench`]: `sluice plugin check|test`
//! - [`scaffold`]: `sluice plugin new` (the embedded project templates)
//!
//! A plugin goes through three forms, each its own type: as written ([`PluginSource`]: a
//! file or a builtin's name), as loaded (a compiled component shared by every tenant that
//! uses the file), and as running (one configured instance per tenant, in its own
//! `wasmtime::Store`).

pub mod builtin;
pub mod limits;
pub mod metrics;
pub mod output;
mod reload;
mod router;
pub mod scaffold;
pub mod settings;
mod tenant;
pub mod testbench;
mod wasm;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

pub use limits::{Limits, TopicPattern};
pub use router::PluginRouter;
pub use settings::{PluginSource, PluginSpec, PluginsSettings};
pub use tenant::status::{TenantState, TenantStatus};

use crate::model::{OutboundMessage, OutboxRow, TenantId};

/// The messages of one row, or why the row could not be transformed.
pub type RowResult = Result<Vec<OutboundMessage>, TransformFailure>;

/// Turns claimed rows into messages. Implementations: [`PluginRouter`] (WASM plugins).
pub trait RowTransformer: Send + Sync + 'static {
    /// One result per input row, in the same order.
    fn transform(&self, rows: Arc<[OutboxRow]>) -> impl Future<Output = Vec<RowResult>> + Send;

    /// Tenants whose rows should not be claimed right now (circuit breaker open, or a plugin
    /// call of theirs has been running for a while).
    fn paused_tenants(&self) -> Vec<TenantId> {
        Vec::new()
    }

    /// Feeds what publishing did with one tenant's rows of a batch back into that tenant's
    /// health (its circuit breaker): `delivered` rows had every message acknowledged;
    /// `refused` rows had a message refused for a reason of the tenant's own making (routed to
    /// a topic the broker lacks, too large for the broker). Broker outages are not reported:
    /// they are nobody's fault and must not pause tenants.
    fn record_publish(&self, tenant: &TenantId, delivered: usize, refused: usize) {
        let _ = (tenant, delivered, refused);
    }
}

impl<T: RowTransformer> RowTransformer for Arc<T> {
    fn transform(&self, rows: Arc<[OutboxRow]>) -> impl Future<Output = Vec<RowResult>> + Send {
        T::transform(self, rows)
    }

    fn paused_tenants(&self) -> Vec<TenantId> {
        T::paused_tenants(self)
    }

    fn record_publish(&self, tenant: &TenantId, delivered: usize, refused: usize) {
        T::record_publish(self, tenant, delivered, refused)
    }
}

/// Why a row was not transformed. Every variant fails the row closed: nothing of it is
/// published.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TransformFailure {
    #[error("plugin error (retryable) {code}: {message}")]
    Retryable { code: String, message: String },
    #[error("plugin error (permanent) {code}: {message}")]
    Permanent { code: String, message: String },
    /// Trap or memory cap; the instance was discarded.
    #[error("{0}")]
    Trapped(String),
    /// The call ran into its `call_timeout`; the instance was discarded and the tenant paused.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// Not run in this batch: the tenant's plugin used up the batch's time budget, or was busy
    /// in another batch. The row is put back untouched (no attempt counted).
    #[error("deferred: {0}")]
    Deferred(String),
    /// The plugin returned something the host refuses to publish.
    #[error("invalid plugin output: {0}")]
    InvalidOutput(String),
    #[error("no plugin for tenant {0:?}: add [tenants.{0}] or [plugins.default]")]
    NoPlugin(TenantId),
    /// The tenant's instance could not be (re)created.
    #[error("plugin unavailable: {0}")]
    Unavailable(String),
    /// The tenant's circuit breaker is open, or the tenant is quarantined; the row was not
    /// run and waits `remaining` without an attempt being counted.
    #[error("{}", paused_message(tenant, remaining, reason))]
    Paused {
        tenant: TenantId,
        remaining: std::time::Duration,
        reason: PauseReason,
    },
}

/// Why a tenant's rows are not run for now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PauseReason {
    /// Its circuit breaker is open.
    CircuitBreaker,
    /// Its plugin failed to load, instantiate or configure (the reason, bounded); retried
    /// with back-off and on reload.
    Quarantined(String),
}

fn paused_message(
    tenant: &TenantId,
    remaining: &std::time::Duration,
    reason: &PauseReason,
) -> String {
    let remaining = humantime::format_duration(*remaining);
    match reason {
        PauseReason::CircuitBreaker => {
            format!("tenant {tenant} paused by its circuit breaker for another {remaining}")
        }
        PauseReason::Quarantined(why) => format!(
            "tenant {tenant} quarantined: its plugin failed to start ({why}); next try in {remaining}"
        ),
    }
}

/// Errors loading or setting up plugins. At start-up they quarantine the tenant, or stop
/// `sluice run` with `[plugins] strict_startup = true`.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("plugin engine: {0}")]
    Engine(String),
    #[error("plugin {path}: {message}")]
    BadPlugin { path: PathBuf, message: String },
    #[error("plugin {path} (tenant {tenant}): instantiation failed: {message}")]
    Instantiate {
        path: PathBuf,
        tenant: TenantId,
        message: String,
    },
    #[error("plugin {path} (tenant {tenant}) rejected its config: {message}")]
    Configure {
        path: PathBuf,
        tenant: TenantId,
        message: String,
    },
    #[error("config {key}: {message}")]
    Config { key: String, message: String },
}

impl PluginError {
    fn engine(e: wasmtime::Error) -> Self {
        Self::Engine(format!("{e:#}"))
    }
}
