//! What other batches (and status reads) may learn about a tenant without waiting for its
//! lock: breaker, the stamp of a running call (stalled or not), template, counters.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::model::TenantId;
use crate::plugin::tenant::breaker::{CircuitBreaker, Gate, Transition};
use crate::plugin::tenant::lock;
use crate::plugin::tenant::status::{ReasonCounts, TenantState};
use crate::plugin::tenant::template::TenantTemplate;
// The stall limit is the watch's (it leaves stalled tenants out of claims); `stalled` answers
// by it too, and the name stays reachable where it was.
pub(crate) use crate::plugin::tenant::watch::STALL_AFTER;
use crate::plugin::tenant::watch::{RunningCall, Watch, Watched};
use crate::plugin::wasm::host_api::TenantShared;

/// What other batches may learn about a tenant without waiting for its lock.
pub(crate) struct TenantHealth {
    /// Changed through [`TenantHealth::with_breaker`] only, which keeps `paused_until_us`.
    breaker: Mutex<CircuitBreaker>,
    /// Until when the breaker pauses the tenant, in µs since [`clock_origin`]; 0 = not
    /// paused. Readable without the breaker's lock (claims ask it of every suspect).
    paused_until_us: AtomicU64,
    /// When the running plugin call began, in µs since [`clock_origin`]; 0 = no call.
    busy_since_us: AtomicU64,
    /// The tenant's current template (also in its runner, for the hot path).
    template: Mutex<Arc<TenantTemplate>>,
    /// Log budget and counters, shared by every instance the tenant ever gets.
    pub(crate) shared: Arc<TenantShared>,
    /// Whether the tenant has a live instance now.
    live: AtomicBool,
    /// Instances replaced because their memory passed `recycle_memory_percent`.
    pub(crate) recycled: AtomicU64,
    /// Instances created, by why.
    pub(crate) instantiations: ReasonCounts,
    /// Told when the tenant may have become unavailable, and of its running calls.
    watch: Arc<Watch>,
    /// Sandbox limits run into, by limit.
    pub(crate) limit_hits: ReasonCounts,
}

fn clock_origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn micros_since_origin(t: Instant) -> u64 {
    u64::try_from(t.duration_since(clock_origin()).as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Marks a plugin call as running until dropped — also when the call panics, so a tenant is
/// never left marked stalled (and so excluded from claims) for good.
pub(crate) struct CallStamp<'a> {
    health: &'a TenantHealth,
    _running: RunningCall<'a>,
}

impl Drop for CallStamp<'_> {
    fn drop(&mut self) {
        self.health.busy_since_us.store(0, Ordering::Release);
    }
}

impl TenantHealth {
    pub(crate) fn new(tenant: TenantId, template: Arc<TenantTemplate>, watch: Arc<Watch>) -> Self {
        if template.quarantine.is_quarantined() {
            // Starts unavailable: the next claim must find it.
            watch.changed();
        }
        let limits = &template.limits;
        Self {
            breaker: Mutex::new(CircuitBreaker::new(
                limits.breaker_failures,
                limits.breaker_cooldown,
            )),
            paused_until_us: AtomicU64::new(0),
            busy_since_us: AtomicU64::new(0),
            template: Mutex::new(template),
            shared: TenantShared::new(tenant),
            live: AtomicBool::new(false),
            recycled: AtomicU64::new(0),
            instantiations: ReasonCounts::default(),
            limit_hits: ReasonCounts::default(),
            watch,
        }
    }

    /// Whether the tenant may be unavailable without an event first: paused by its breaker
    /// now or before (until it closes), or its plugin quarantined. See [`Watch`].
    pub(crate) fn suspect(&self) -> bool {
        self.paused_until_us.load(Ordering::Acquire) != 0
            || lock(&self.template).quarantine.is_quarantined()
    }

    /// Whether the tenant should be left out of the next claim: breaker open, plugin
    /// quarantined, or a call of its plugin has been running for longer than [`STALL_AFTER`].
    pub(crate) fn unavailable(&self, now: Instant) -> bool {
        self.stalled(now) || self.paused(now) || lock(&self.template).quarantine.is_quarantined()
    }

    /// Whether the breaker pauses the tenant at `now` (as [`CircuitBreaker::gate`] says).
    fn paused(&self, now: Instant) -> bool {
        let until = self.paused_until_us.load(Ordering::Acquire);
        until != 0 && micros_since_origin(now) < until
    }

    /// What the breaker says about running a row at `now`.
    pub(crate) fn gate(&self, now: Instant) -> Gate {
        lock(&self.breaker).gate(now)
    }

    /// Whether the breaker is open or half open.
    pub(crate) fn tripped(&self) -> bool {
        lock(&self.breaker).tripped()
    }

    /// Runs `change` on the breaker, then notes until when it pauses the tenant.
    pub(crate) fn with_breaker<R>(&self, change: impl FnOnce(&mut CircuitBreaker) -> R) -> R {
        let mut breaker = lock(&self.breaker);
        let result = change(&mut breaker);
        let until = breaker.open_until().map_or(0, micros_since_origin);
        let before = self.paused_until_us.swap(until, Ordering::AcqRel);
        if until != 0 && until != before {
            self.watch.changed();
        }
        result
    }

    pub(crate) fn template(&self) -> Arc<TenantTemplate> {
        Arc::clone(&lock(&self.template))
    }

    /// Switches the tenant to another template (its runner keeps its own copy).
    pub(crate) fn set_template(&self, template: Arc<TenantTemplate>) {
        *lock(&self.template) = template;
        self.watch.changed();
    }

    /// Whether the tenant has a live instance.
    pub(crate) fn has_instance(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    pub(crate) fn set_has_instance(&self, live: bool) {
        self.live.store(live, Ordering::Release);
    }

    pub(crate) fn stalled(&self, now: Instant) -> bool {
        match self.busy_since_us.load(Ordering::Acquire) {
            0 => false,
            since => {
                micros_since_origin(now).saturating_sub(since) > STALL_AFTER.as_micros() as u64
            }
        }
    }

    pub(crate) fn stamp_call(&self) -> CallStamp<'_> {
        self.busy_since_us
            .store(micros_since_origin(Instant::now()), Ordering::Release);
        CallStamp {
            health: self,
            _running: self.watch.call(self, self.shared.tenant()),
        }
    }

    /// The tenant's state for status reports.
    pub(crate) fn state(&self, now: Instant) -> TenantState {
        if let Some(q) = self.template().quarantine.state() {
            return TenantState::Quarantined {
                reason: q.reason,
                since: q.since,
                tries: q.tries,
                next_try_in: q.next_try.saturating_duration_since(now),
            };
        }
        if let Gate::Paused(until) = self.gate(now) {
            return TenantState::Paused {
                remaining: until - now,
            };
        }
        if self.stalled(now) {
            TenantState::Stalled
        } else {
            TenantState::Running
        }
    }

    /// Feeds a refused/delivered publish report to the breaker and logs its transitions.
    pub(crate) fn record_publish(&self, tenant: &TenantId, delivered: usize, refused: usize) {
        let transition =
            self.with_breaker(|b| b.record_publish(delivered, refused, Instant::now()));
        log_transition(tenant, &self.template(), transition);
    }
}

impl Watched for TenantHealth {
    fn suspect(&self) -> bool {
        TenantHealth::suspect(self)
    }

    fn unavailable(&self, now: Instant) -> bool {
        TenantHealth::unavailable(self, now)
    }
}

/// Logs the breaker opening or closing.
pub(crate) fn log_transition(tenant: &TenantId, template: &TenantTemplate, transition: Transition) {
    match transition {
        Transition::Opened => tracing::error!(
            tenant = %tenant,
            cooldown = ?template.limits.breaker_cooldown,
            "circuit breaker opened: tenant paused after repeated plugin failures, refused publishes, or a call that ran into its call_timeout"
        ),
        Transition::Closed => {
            tracing::warn!(tenant = %tenant, "circuit breaker closed: tenant resumed")
        }
        Transition::None => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::plugin::limits::Limits;
    use crate::plugin::tenant::template::PluginCode;

    fn health() -> TenantHealth {
        let template = TenantTemplate::new(
            PluginCode::Builtin("route-by-aggregate".into()),
            vec![],
            Limits::default(),
        );
        TenantHealth::new(TenantId::named("t"), Arc::new(template), Arc::default())
    }

    #[test]
    fn a_long_running_call_marks_the_tenant_stalled_until_the_stamp_drops() {
        let status = health();
        let now = Instant::now();
        assert!(!status.unavailable(now));
        let stamp = status.stamp_call();
        assert!(!status.stalled(Instant::now()));
        assert!(status.stalled(Instant::now() + STALL_AFTER * 2));
        drop(stamp);
        assert!(!status.stalled(Instant::now() + STALL_AFTER * 2));
    }

    #[test]
    fn a_tenant_is_unavailable_while_its_breaker_pauses_it_or_its_plugin_is_quarantined() {
        let status = health();
        let cooldown = Limits::default().breaker_cooldown;
        let now = Instant::now();
        assert_eq!(
            status.with_breaker(|b| b.record_deadline(now)),
            Transition::Opened
        );
        assert!(status.unavailable(now));
        assert!(status.unavailable(now + cooldown - Duration::from_millis(1)));
        // Half open after the cool-down: rows run again (a failure re-opens it).
        assert!(!status.unavailable(now + cooldown + Duration::from_millis(1)));
        assert!(status.tripped());
        assert!(status.with_breaker(CircuitBreaker::reset));
        assert!(!status.unavailable(now));

        let template = status.template();
        template.quarantine.failed("configure refused".into(), now);
        assert!(status.unavailable(now));
        assert!(template.quarantine.clear());
        assert!(!status.unavailable(now));
    }

    #[test]
    fn a_panic_during_a_call_does_not_leave_the_tenant_stalled() {
        let status = health();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _stamp = status.stamp_call();
            panic!("guest call panicked");
        }));
        assert!(panicked.is_err());
        assert!(!status.stalled(Instant::now() + STALL_AFTER * 2));
    }
}
