//! What a guest can call on the host (`sluice:plugin/host`) and the per-Store state behind it.

use std::collections::HashMap;

use wasmtime::StoreLimits;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::sluice::plugin::host;
use super::bindings::types::LogLevel;
use crate::outbox::TenantId;

/// Longest guest log line kept; the rest is cut so a guest cannot flood the logs line by line.
const MAX_LOG_LINE: usize = 1_024;

/// Data of one tenant's Store. Never shared between tenants.
pub struct HostState {
    pub(crate) tenant: TenantId,
    pub(crate) limits: StoreLimits,
    wasi: WasiCtx,
    table: ResourceTable,
    counters: HashMap<String, u64>,
}

impl HostState {
    pub fn new(tenant: TenantId, limits: StoreLimits) -> Self {
        Self {
            tenant,
            limits,
            // Empty context: no preopens, env, args or sockets; stdio goes nowhere.
            wasi: WasiCtx::builder().build(),
            table: ResourceTable::new(),
            counters: HashMap::new(),
        }
    }

    /// Counters the guest incremented with `counter-add`, by name.
    pub fn counters(&self) -> &HashMap<String, u64> {
        &self.counters
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl super::bindings::types::Host for HostState {}

impl host::Host for HostState {
    fn log(&mut self, level: LogLevel, message: String) {
        let mut message = message;
        if message.len() > MAX_LOG_LINE {
            let mut end = MAX_LOG_LINE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push('…');
        }
        let tenant = self.tenant.as_str();
        match level {
            LogLevel::Trace => tracing::trace!(target: "sluice::guest", tenant, "{message}"),
            LogLevel::Debug => tracing::debug!(target: "sluice::guest", tenant, "{message}"),
            LogLevel::Info => tracing::info!(target: "sluice::guest", tenant, "{message}"),
            LogLevel::Warn => tracing::warn!(target: "sluice::guest", tenant, "{message}"),
            LogLevel::Error => tracing::error!(target: "sluice::guest", tenant, "{message}"),
        }
    }

    fn counter_add(&mut self, name: String, delta: u64) {
        let value = self.counters.entry(name).or_default();
        *value = value.saturating_add(delta);
    }
}
