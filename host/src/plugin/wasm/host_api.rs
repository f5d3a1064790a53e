//! What a guest can call on the host (`sluice:plugin/host`), the per-`wasmtime::Store` state behind
//! it, and the per-tenant state that outlives `wasmtime::Store`s (log budget, counters). In the
//! current contract's types: older versions' calls are converted to these in
//! [`super::contract`].
//!
//! A trapped instance is replaced by a fresh `wasmtime::Store`, so anything a guest could use to
//! consume host resources — log lines, counter names — is budgeted per tenant ([`TenantShared`]),
//! not per `wasmtime::Store`: a trap must not hand the guest a fresh budget.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::model::TenantId;
use crate::plugin::limits::TenantLimiter;
use crate::plugin::wasm::bindings::sluice::plugin::host;
use crate::plugin::wasm::bindings::types::LogLevel;
use crate::plugin::wasm::guest_output::GuestOutput;
use crate::text::bounded;

/// Longest guest log line kept; the rest is cut so a guest cannot flood the logs line by line.
pub(crate) const MAX_LOG_LINE: usize = 1_024;
/// Guest log lines per second a tenant may write on average…
pub(crate) const LOG_LINES_PER_SEC: f64 = 20.0;
/// …and in one burst. Lines beyond are dropped and counted.
pub(crate) const LOG_BURST: f64 = 100.0;
/// Distinct `counter-add` names kept per tenant, `_overflow` included (what the metrics
/// export shows per plugin).
pub(crate) const MAX_COUNTER_NAMES: usize = 32;
/// Longest counter name kept; longer names are added to `_overflow`.
pub(crate) const MAX_COUNTER_NAME: usize = 64;
/// Where counters past [`MAX_COUNTER_NAMES`], and names that are too long, empty or contain
/// control characters, are added.
pub(crate) const OVERFLOW_COUNTER: &str = "_overflow";

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
    last: Instant,
    dropped: u64,
}

impl LogBudget {
    fn new() -> Self {
        Self {
            tokens: LOG_BURST,
            last: Instant::now(),
            dropped: 0,
        }
    }

    /// Tokens at `now`, refilled since the last line.
    fn refilled(&self, now: Instant) -> f64 {
        let refill = now.duration_since(self.last).as_secs_f64() * LOG_LINES_PER_SEC;
        (self.tokens + refill).min(LOG_BURST)
    }

    /// Whether the bucket is as a fresh one would be: forgetting it gives nothing away.
    fn at_rest(&self, now: Instant) -> bool {
        self.dropped == 0 && self.refilled(now) >= LOG_BURST
    }

    /// Whether a line may be written now.
    fn take(&mut self) -> bool {
        let now = Instant::now();
        self.tokens = self.refilled(now);
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

/// `counter-add` totals of one tenant, bounded in names and name length.
#[derive(Debug, Default)]
struct Counters(BTreeMap<String, u64>);

impl Counters {
    fn add(&mut self, name: &str, delta: u64) {
        let key = if !acceptable_counter_name(name) {
            OVERFLOW_COUNTER
        } else if self.0.contains_key(name) || self.0.len() < MAX_COUNTER_NAMES - 1 {
            name
        } else {
            // Room is kept for `_overflow` itself.
            OVERFLOW_COUNTER
        };
        match self.0.get_mut(key) {
            Some(value) => *value = value.saturating_add(delta),
            None => {
                self.0.insert(key.to_owned(), delta);
            }
        }
    }
}

fn acceptable_counter_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_COUNTER_NAME
        && name != OVERFLOW_COUNTER
        && !name.chars().any(char::is_control)
}

/// Host-side state of one tenant that every `wasmtime::Store` of it shares.
pub(crate) struct TenantShared {
    tenant: TenantId,
    log_budget: Mutex<LogBudget>,
    counters: Mutex<Counters>,
}

impl TenantShared {
    pub(crate) fn new(tenant: TenantId) -> Arc<Self> {
        Arc::new(Self {
            tenant,
            log_budget: Mutex::new(LogBudget::new()),
            counters: Mutex::new(Counters::default()),
        })
    }

    pub(crate) fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    /// Whether the tenant's log budget is full again (as a fresh tenant's would be): only
    /// then may the router forget the tenant, else coming back would refill it.
    pub(crate) fn log_budget_at_rest(&self, now: Instant) -> bool {
        lock(&self.log_budget).at_rest(now)
    }

    /// Takes one line from the tenant's log budget for guest text the host logs on the
    /// guest's behalf (what it wrote to stderr before a trap); `false` when it is used up.
    pub(crate) fn take_log_line(&self) -> bool {
        lock(&self.log_budget).take()
    }

    /// The tenant's `counter-add` totals, by name (at most [`MAX_COUNTER_NAMES`]).
    pub(crate) fn counters(&self) -> BTreeMap<String, u64> {
        lock(&self.counters).0.clone()
    }

    fn log(&self, level: LogLevel, message: &str) {
        let dropped_before = {
            let mut budget = lock(&self.log_budget);
            let dropped = budget.dropped;
            if !budget.take() {
                return;
            }
            budget.dropped = 0;
            dropped
        };
        let tenant = bounded(self.tenant.as_str(), MAX_LOG_LINE);
        if dropped_before > 0 {
            tracing::warn!(target: "sluice::guest", tenant = %tenant,
                dropped = dropped_before, "guest log lines dropped (rate limit)");
        }
        let message = bounded(message, MAX_LOG_LINE);
        match level {
            LogLevel::Trace => {
                tracing::trace!(target: "sluice::guest", tenant = %tenant, "{message}")
            }
            LogLevel::Debug => {
                tracing::debug!(target: "sluice::guest", tenant = %tenant, "{message}")
            }
            LogLevel::Info => {
                tracing::info!(target: "sluice::guest", tenant = %tenant, "{message}")
            }
            LogLevel::Warn => {
                tracing::warn!(target: "sluice::guest", tenant = %tenant, "{message}")
            }
            LogLevel::Error => {
                tracing::error!(target: "sluice::guest", tenant = %tenant, "{message}")
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Data of one tenant's `wasmtime::Store`. Never shared between tenants.
pub(crate) struct HostState {
    pub(crate) shared: Arc<TenantShared>,
    pub(crate) limiter: TenantLimiter,
    /// The tail of what the guest wrote to stdout and stderr.
    pub(crate) output: GuestOutput,
    /// When the running call's `call_timeout` ends: a WASI wait gives up then
    /// ([`super::call::shadow_waits`]). Set before every call.
    pub(crate) deadline: Instant,
    wasi: WasiCtx,
    table: ResourceTable,
}

impl HostState {
    pub(crate) fn new(shared: Arc<TenantShared>, limiter: TenantLimiter) -> Self {
        let output = GuestOutput::default();
        Self {
            shared,
            limiter,
            // Empty context: no preopens, env, args or sockets; stdout and stderr go to a
            // bounded tail (quoted when a call traps), never to the host's own stdio; clocks
            // frozen at zero.
            wasi: WasiCtx::builder()
                .stdout(output.clone())
                .stderr(output.clone())
                .wall_clock(FrozenClock)
                .monotonic_clock(FrozenClock)
                .build(),
            output,
            deadline: Instant::now(),
            table: ResourceTable::new(),
        }
    }

    /// What a WASI wait needs: the Store's resources (the pollables) and the call's deadline.
    pub(crate) fn waits(&mut self) -> (&mut ResourceTable, Instant) {
        (&mut self.table, self.deadline)
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

impl crate::plugin::wasm::bindings::types::Host for HostState {}

impl host::Host for HostState {
    fn log(&mut self, level: LogLevel, message: String) {
        self.shared.log(level, &message);
    }

    fn counter_add(&mut self, name: String, delta: u64) {
        lock(&self.shared.counters).add(&name, delta);
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

    #[test]
    fn the_log_budget_belongs_to_the_tenant_not_the_store() {
        let shared = TenantShared::new(TenantId::named("t"));
        // Two `wasmtime::Store`s of the same tenant, as after a trap.
        let mut first = HostState::new(Arc::clone(&shared), TenantLimiter::new(1 << 20));
        let mut second = HostState::new(Arc::clone(&shared), TenantLimiter::new(1 << 20));
        for _ in 0..1_000 {
            host::Host::log(&mut first, LogLevel::Info, "x".into());
            host::Host::log(&mut second, LogLevel::Info, "x".into());
        }
        let budget = lock(&shared.log_budget);
        assert!(budget.tokens < 2.0, "one bucket, emptied by both Stores");
        assert!(budget.dropped >= 1_890, "{}", budget.dropped);
    }

    #[test]
    fn a_used_budget_is_not_at_rest_until_it_has_refilled() {
        let shared = TenantShared::new(TenantId::named("t"));
        let now = Instant::now();
        assert!(shared.log_budget_at_rest(now));
        assert!(shared.take_log_line());
        assert!(!shared.log_budget_at_rest(now));
        // One line refills in 1/20 s.
        let later = now + std::time::Duration::from_millis(100);
        assert!(shared.log_budget_at_rest(later));
        let mut budget = lock(&shared.log_budget);
        budget.tokens = 0.0;
        budget.take();
        assert!(budget.dropped > 0);
        assert!(
            !budget.at_rest(later + std::time::Duration::from_secs(60)),
            "dropped lines not reported yet"
        );
    }

    #[test]
    fn counters_are_bounded_in_names_and_length() {
        let shared = TenantShared::new(TenantId::named("t"));
        let mut state = HostState::new(Arc::clone(&shared), TenantLimiter::new(1 << 20));
        for i in 0..1_000 {
            host::Host::counter_add(&mut state, format!("name-{i}"), 1);
        }
        host::Host::counter_add(&mut state, "x".repeat(1 << 20), 5);
        host::Host::counter_add(&mut state, "bad\0name".into(), 1);
        host::Host::counter_add(&mut state, "name-0".into(), 10);
        let counters = shared.counters();
        assert_eq!(counters.len(), MAX_COUNTER_NAMES);
        assert_eq!(counters["name-0"], 11, "known names keep counting");
        let overflow = (1_000 - (MAX_COUNTER_NAMES as u64 - 1)) + 5 + 1;
        assert_eq!(counters[OVERFLOW_COUNTER], overflow);
        assert!(counters.keys().all(|k| k.len() <= MAX_COUNTER_NAME));
    }
}
