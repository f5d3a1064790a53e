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
/// Guest log lines per second a tenant may write on average…
const LOG_LINES_PER_SEC: f64 = 20.0;
/// …and in one burst. Lines beyond are dropped and counted.
const LOG_BURST: f64 = 100.0;

/// A wall and monotonic clock stuck at zero: guests get no time source (a plugin's output
/// must depend on the row, not on when it ran; `created-at-ms` carries the row's time).
struct FrozenClock;

impl wasmtime_wasi::HostWallClock for FrozenClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }
    fn now(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

impl wasmtime_wasi::HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Token bucket for guest log lines.
struct LogBudget {
    tokens: f64,
    last: std::time::Instant,
    dropped: u64,
}

impl LogBudget {
    fn new() -> Self {
        Self {
            tokens: LOG_BURST,
            last: std::time::Instant::now(),
            dropped: 0,
        }
    }

    /// Whether a line may be written now.
    fn take(&mut self) -> bool {
        let now = std::time::Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * LOG_LINES_PER_SEC;
        self.tokens = (self.tokens + refill).min(LOG_BURST);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.dropped += 1;
            false
        }
    }
}

/// Data of one tenant's Store. Never shared between tenants.
pub struct HostState {
    pub(crate) tenant: TenantId,
    pub(crate) limits: StoreLimits,
    wasi: WasiCtx,
    table: ResourceTable,
    counters: HashMap<String, u64>,
    log_budget: LogBudget,
}

impl HostState {
    pub fn new(tenant: TenantId, limits: StoreLimits) -> Self {
        Self {
            tenant,
            limits,
            // Empty context: no preopens, env, args or sockets; stdio goes nowhere; clocks
            // frozen at zero.
            wasi: WasiCtx::builder()
                .wall_clock(FrozenClock)
                .monotonic_clock(FrozenClock)
                .build(),
            table: ResourceTable::new(),
            counters: HashMap::new(),
            log_budget: LogBudget::new(),
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
        let dropped_before = self.log_budget.dropped;
        if !self.log_budget.take() {
            return;
        }
        if dropped_before > 0 {
            tracing::warn!(target: "sluice::guest", tenant = self.tenant.as_str(),
                dropped = dropped_before, "guest log lines dropped (rate limit)");
            self.log_budget.dropped = 0;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_budget_allows_a_burst_then_drops_and_counts() {
        let mut budget = LogBudget::new();
        let allowed = (0..1_000).filter(|_| budget.take()).count();
        // The burst, plus whatever refilled while the loop ran (microseconds).
        assert!((100..=101).contains(&allowed), "{allowed}");
        assert!(budget.dropped >= 899);
    }
}
