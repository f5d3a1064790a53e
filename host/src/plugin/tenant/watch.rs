//! Which tenants a claim must leave out ([`Watch::unavailable`]), found without asking every
//! tenant: every claim needs the list, and with 10,000 configured tenants asking each took
//! 0.5 ms a claim. A tenant is left out while its breaker pauses it, its plugin is
//! quarantined, or a call of its plugin has run longer than [`STALL_AFTER`]. The first two
//! begin with an event ([`Watch::changed`]: a breaker pausing a tenant, a plugin entering
//! quarantine, a tenant switching plugins or starting on a quarantined one), after which the
//! next claim looks at every tenant once and keeps the few that may be unavailable
//! ("suspects"); until the next event it asks only those. Running calls are registered while
//! they run ([`Watch::call`]), so a stalled one is found among them.
//!
//! What the watch asks of each tenant is [`Watched`], which the tenant's health
//! ([`TenantHealth`](super::health::TenantHealth)) answers; the watch sits below the tenant's
//! parts that tell it of events (health, template, quarantine).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::model::TenantId;
use crate::plugin::tenant::lock;

/// A tenant whose current plugin call has run this long is "stalled": other batches skip its
/// rows instead of queueing behind the call. Normal calls take microseconds; a 64-row batch
/// of a JavaScript guest about 15 ms.
pub(crate) const STALL_AFTER: Duration = Duration::from_millis(20);

/// What the watch asks of a tenant: its health
/// ([`TenantHealth`](super::health::TenantHealth)).
pub(crate) trait Watched: Send + Sync {
    /// Whether the tenant may be unavailable without an event first (kept as a suspect).
    fn suspect(&self) -> bool;
    /// Whether the tenant should be left out of a claim at `now`.
    fn unavailable(&self, now: Instant) -> bool;
}

/// One router's view of its tenants' availability (shared with their health).
#[derive(Default)]
pub(crate) struct Watch {
    /// Counts the events (see the module documentation).
    events: AtomicU64,
    suspects: Mutex<Suspects>,
    /// The plugin calls running now: (the health's address, its tenant, when it began).
    running: Mutex<Vec<(usize, TenantId, Instant)>>,
}

#[derive(Default)]
struct Suspects {
    /// The count of events the list was made after.
    seen: Option<u64>,
    tenants: Vec<(TenantId, Arc<dyn Watched>)>,
}

/// A running call, registered until dropped (also when the call panics).
pub(crate) struct RunningCall<'a> {
    watch: &'a Watch,
    id: usize,
}

impl Drop for RunningCall<'_> {
    fn drop(&mut self) {
        let mut running = lock(&self.watch.running);
        if let Some(at) = running.iter().position(|(id, _, _)| *id == self.id) {
            running.swap_remove(at);
        }
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// Something may have made a tenant unavailable: the next claim looks at every tenant
    /// again.
    pub(crate) fn changed(&self) {
        self.events.fetch_add(1, Ordering::AcqRel);
    }

    /// Registers a call of `tenant`'s plugin (`health`: its state, whose address tells the
    /// call apart while it runs) until the guard drops.
    pub(crate) fn call<H>(&self, health: &H, tenant: &TenantId) -> RunningCall<'_> {
        let id = std::ptr::from_ref(health) as usize;
        lock(&self.running).push((id, tenant.clone(), Instant::now()));
        RunningCall { watch: self, id }
    }

    /// The tenants to leave out of a claim at `now`. `all` lists every tenant; it is called
    /// only when something happened since the last call.
    pub(crate) fn unavailable<H: Watched + 'static>(
        &self,
        now: Instant,
        all: impl FnOnce() -> Vec<(TenantId, Arc<H>)>,
    ) -> Vec<TenantId> {
        // Read before the tenants are: an event during the scan is seen by the next call.
        let seen = self.events.load(Ordering::Acquire);
        let stale = lock(&self.suspects).seen != Some(seen);
        if stale {
            // Outside the lock: `all` takes the router's lock on its tenants.
            let found = all()
                .into_iter()
                .filter(|(_, h)| h.suspect())
                .map(|(id, h)| (id, h as Arc<dyn Watched>))
                .collect();
            let mut suspects = lock(&self.suspects);
            suspects.tenants = found;
            suspects.seen = Some(seen);
        }
        let mut out: Vec<TenantId> = {
            let mut suspects = lock(&self.suspects);
            suspects.tenants.retain(|(_, h)| h.suspect());
            let unavailable = suspects.tenants.iter().filter(|(_, h)| h.unavailable(now));
            unavailable.map(|(id, _)| id.clone()).collect()
        };
        for (_, tenant, since) in lock(&self.running).iter() {
            if now.saturating_duration_since(*since) > STALL_AFTER && !out.contains(tenant) {
                out.push(tenant.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::plugin::limits::Limits;
    use crate::plugin::tenant::breaker::CircuitBreaker;
    use crate::plugin::tenant::health::TenantHealth;
    use crate::plugin::tenant::template::{PluginCode, TenantTemplate};

    fn template(watch: &Arc<Watch>) -> Arc<TenantTemplate> {
        let code = PluginCode::Builtin("route-by-aggregate".into());
        Arc::new(TenantTemplate::new(code, vec![], Limits::default()).watched_by(watch))
    }

    /// `n` tenants on `watch`.
    fn tenants(watch: &Arc<Watch>, n: usize) -> Vec<(TenantId, Arc<TenantHealth>)> {
        (0..n)
            .map(|i| {
                let id = TenantId::named(format!("t{i}").as_str());
                let health = TenantHealth::new(id.clone(), template(watch), Arc::clone(watch));
                (id, Arc::new(health))
            })
            .collect()
    }

    #[test]
    fn tenants_are_scanned_once_per_event_and_only_suspects_are_asked_between() {
        let watch = Arc::new(Watch::default());
        let all = tenants(&watch, 100);
        let scans = AtomicU64::new(0);
        let ask = || {
            scans.fetch_add(1, Ordering::Relaxed);
            all.clone()
        };
        let now = Instant::now();
        assert!(watch.unavailable(now, ask).is_empty());
        assert!(watch.unavailable(now, ask).is_empty());
        assert_eq!(scans.load(Ordering::Relaxed), 1);

        // A breaker opens: seen at the next claim, then asked of the suspect alone.
        let (paused, health) = &all[7];
        health.with_breaker(|b| b.record_deadline(Instant::now()));
        let now = Instant::now();
        assert_eq!(watch.unavailable(now, ask), std::slice::from_ref(paused));
        let after = scans.load(Ordering::Relaxed);
        assert_eq!(watch.unavailable(now, ask), std::slice::from_ref(paused));
        assert_eq!(
            scans.load(Ordering::Relaxed),
            after,
            "no scan without an event"
        );

        // It closes: gone from the list, without a scan.
        health.with_breaker(CircuitBreaker::reset);
        assert!(watch.unavailable(Instant::now(), ask).is_empty());

        // A quarantine of the tenant's plugin is seen as well.
        let (quarantined, health) = &all[42];
        health
            .template()
            .quarantine
            .failed("bad".into(), Instant::now());
        assert_eq!(
            watch.unavailable(Instant::now(), ask),
            std::slice::from_ref(quarantined)
        );
        health.template().quarantine.clear();
        assert!(watch.unavailable(Instant::now(), ask).is_empty());
    }

    #[test]
    fn a_call_running_past_the_stall_limit_is_left_out_until_it_ends() {
        let watch = Arc::new(Watch::default());
        let all = tenants(&watch, 3);
        let (busy, health) = &all[1];
        let call = watch.call(health, busy);
        let now = Instant::now();
        assert!(watch.unavailable(now, || all.clone()).is_empty());
        let later = now + STALL_AFTER + Duration::from_millis(1);
        assert_eq!(
            watch.unavailable(later, || all.clone()),
            std::slice::from_ref(busy)
        );
        drop(call);
        assert!(watch.unavailable(later, || all.clone()).is_empty());
    }

    #[test]
    fn a_tenant_that_starts_on_a_quarantined_plugin_is_seen() {
        let watch = Arc::new(Watch::default());
        let mut all = tenants(&watch, 3);
        assert!(watch.unavailable(Instant::now(), || all.clone()).is_empty());
        // Quarantined before the tenant exists: the event is scanned, and finds no tenant.
        let shared = template(&watch);
        shared.quarantine.failed("bad".into(), Instant::now());
        assert!(watch.unavailable(Instant::now(), || all.clone()).is_empty());
        let id = TenantId::named("late");
        let health = TenantHealth::new(id.clone(), shared, Arc::clone(&watch));
        all.push((id.clone(), Arc::new(health)));
        assert_eq!(watch.unavailable(Instant::now(), || all.clone()), [id]);
    }
}
