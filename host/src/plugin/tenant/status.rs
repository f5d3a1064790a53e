//! What the plugin runtime reports about each tenant: the read side for `/status` and metrics.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::model::TenantId;

/// The live plugin instances of one budget and what bounds them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceUse {
    /// Instances alive now.
    pub live: usize,
    /// Most instances alive at once (`None`: bounded by memory only).
    pub max_live: Option<usize>,
    /// Linear memory they were last seen to hold together.
    pub memory_bytes: usize,
    /// The memory budget: past it, idle instances are dropped.
    pub memory_limit_bytes: usize,
}

/// The two instance budgets (see `[plugins] configured_instances_memory_mb`,
/// `max_unconfigured_instances` and `unconfigured_instances_memory_mb`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PluginInstances {
    /// Tenants with their own `[tenants.<name>]` entry, and rows without a tenant.
    pub configured: InstanceUse,
    /// Tenants without their own entry (free-form tenant values).
    pub unconfigured: InstanceUse,
}

/// One tenant as the router sees it now.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantStatus {
    /// The tenant's id.
    pub tenant: TenantId,
    /// The plugin file, or `builtin:<name>`.
    pub plugin: String,
    /// The plugin file's content hash as loaded (`sha256:…`; none for builtins and files that
    /// failed to load).
    pub digest: Option<String>,
    /// Where the loaded bytes came from: the file, or the OCI reference with the manifest
    /// digest it resolved to (none for builtins and files that failed to load).
    pub source: Option<String>,
    /// The trusted key that signed them (`minisign:<key id>`), when `trusted_keys` is set.
    pub signer: Option<String>,
    /// The version the plugin reports about itself (`info()`; Sluice's for builtins); `None`
    /// before it ever started.
    pub version: Option<String>,
    /// Whether the tenant has its own `[tenants.<name>]` entry (else it runs
    /// `[plugins.default]` and counts against `max_unconfigured_instances`). Rows without a
    /// tenant count as configured.
    pub configured: bool,
    /// Running, stalled, paused or quarantined.
    pub state: TenantState,
    /// Whether it has a live plugin instance now (an idle tenant's may have been dropped to
    /// make room: its next row creates one).
    pub instance: bool,
    /// Its plugin's `counter-add` totals (at most 32 names, `_overflow` included).
    pub counters: BTreeMap<String, u64>,
    /// Plugin instances created, by why (`start`, `reload`, `after_trap`, `recycle`,
    /// `evicted`: re-created after making room for other tenants).
    pub instantiations: BTreeMap<&'static str, u64>,
    /// Sandbox limits its plugin ran into, by limit (`call_timeout`, `memory`,
    /// `table_elements`, `output_copy`, `output`: a refused message, `batch_time_budget`,
    /// `batch_output_budget`).
    pub limit_hits: BTreeMap<&'static str, u64>,
}

/// Event counts by a fixed set of reasons (bounded: the reasons are compiled in).
#[derive(Debug, Default)]
pub(crate) struct ReasonCounts(Mutex<BTreeMap<&'static str, u64>>);

impl ReasonCounts {
    pub(crate) fn add(&self, reason: &'static str) {
        let mut counts = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *counts.entry(reason).or_default() += 1;
    }

    pub(crate) fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Whether a tenant's rows are being run.
#[derive(Debug, Clone, PartialEq)]
pub enum TenantState {
    /// Its rows are run normally.
    Running,
    /// A call of its plugin has been running for a while; other batches skip its rows.
    Stalled,
    /// Its circuit breaker is open for another `remaining`.
    Paused {
        /// Time until the breaker half-opens.
        remaining: Duration,
    },
    /// Its plugin cannot start; its rows wait.
    Quarantined {
        /// Why it cannot start (bounded).
        reason: String,
        /// When its first failed start happened.
        since: SystemTime,
        /// Failed starts so far.
        tries: u32,
        /// Time until the next start attempt.
        next_try_in: Duration,
    },
}
