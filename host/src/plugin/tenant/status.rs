//! What the plugin runtime reports about each tenant: the read side for `/status` and metrics.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::model::TenantId;

/// One tenant as the router sees it now.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantStatus {
    pub tenant: TenantId,
    /// The plugin file, or `builtin:<name>`.
    pub plugin: String,
    /// The plugin file's content hash as loaded (`sha256:…`; none for builtins and files that
    /// failed to load).
    pub digest: Option<String>,
    /// Whether the tenant has its own `[tenants.<name>]` entry (else it runs
    /// `[plugins.default]` and counts against `max_unconfigured_instances`).
    pub configured: bool,
    pub state: TenantState,
    /// Whether it has a live plugin instance now.
    pub instance: bool,
    /// Its plugin's `counter-add` totals (at most 32 names, `_overflow` included).
    pub counters: BTreeMap<String, u64>,
}

/// Whether a tenant's rows are being run.
#[derive(Debug, Clone, PartialEq)]
pub enum TenantState {
    Running,
    /// A call of its plugin has been running for a while; other batches skip its rows.
    Stalled,
    /// Its circuit breaker is open for another `remaining`.
    Paused {
        remaining: Duration,
    },
    /// Its plugin cannot start; its rows wait.
    Quarantined {
        reason: String,
        since: SystemTime,
        /// Failed starts so far.
        tries: u32,
        next_try_in: Duration,
    },
}
