//! Quarantine of a tenant whose plugin cannot start (the file does not load, instantiation or
//! `configure` fails or times out): its rows wait, the other tenants run, and starting it is
//! retried with back-off and on every reload.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::plugin::tenant::watch::Watch;

/// First retry after a tenant was quarantined…
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(5);
/// …doubling up to this.
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(300);

/// What is known about a quarantined plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QuarantineState {
    /// Why it cannot start (bounded, printable).
    pub reason: String,
    /// When it was quarantined.
    pub since: SystemTime,
    /// Failed starts so far.
    pub tries: u32,
    /// When the next start is tried.
    pub next_try: Instant,
}

/// Quarantine flag of one tenant template; empty when the plugin runs.
#[derive(Debug, Default)]
pub(crate) struct Quarantine {
    state: Mutex<Option<QuarantineState>>,
    /// Whether `state` is set, readable without the lock (see `TenantHealth::unavailable`).
    flagged: AtomicBool,
    /// Told when the plugin enters quarantine (so claims leave its tenants out).
    watch: Option<Arc<Watch>>,
}

impl Quarantine {
    /// Not quarantined; entering quarantine is an event of `watch`.
    pub(crate) fn watched_by(watch: &Arc<Watch>) -> Self {
        Self {
            watch: Some(Arc::clone(watch)),
            ..Self::default()
        }
    }

    /// The watch told of this quarantine.
    pub(crate) fn watch(&self) -> Option<&Arc<Watch>> {
        self.watch.as_ref()
    }

    /// Records a failed start: enters quarantine, or stays with a doubled back-off.
    pub(crate) fn failed(&self, reason: String, now: Instant) {
        let mut state = self.lock();
        let tries = state.as_ref().map_or(0, |s| s.tries).saturating_add(1);
        let since = state.as_ref().map_or_else(SystemTime::now, |s| s.since);
        *state = Some(QuarantineState {
            reason,
            since,
            tries,
            next_try: now + backoff(tries),
        });
        let entered = !self.flagged.swap(true, Ordering::AcqRel);
        if let Some(watch) = &self.watch
            && entered
        {
            watch.changed();
        }
    }

    /// Leaves quarantine; returns whether it was in it.
    pub(crate) fn clear(&self) -> bool {
        let mut state = self.lock();
        self.flagged.store(false, Ordering::Release);
        state.take().is_some()
    }

    pub(crate) fn state(&self) -> Option<QuarantineState> {
        self.lock().clone()
    }

    pub(crate) fn is_quarantined(&self) -> bool {
        self.flagged.load(Ordering::Acquire)
    }

    /// Whether a retry is due at `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.lock().as_ref().is_some_and(|s| s.next_try <= now)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<QuarantineState>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Wait before the next try after `tries` failed starts.
fn backoff(tries: u32) -> Duration {
    let exp = tries.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1 << exp).min(MAX_RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_from_the_first_try_to_the_maximum() {
        let q = Quarantine::default();
        let t0 = Instant::now();
        assert!(!q.is_quarantined());
        q.failed("configure: bad".into(), t0);
        let first = q.state().unwrap();
        assert_eq!(first.next_try, t0 + FIRST_RETRY);
        assert!(!q.due(t0) && q.due(t0 + FIRST_RETRY));
        q.failed("configure: still bad".into(), t0);
        let second = q.state().unwrap();
        assert_eq!(second.tries, 2);
        assert_eq!(second.next_try, t0 + FIRST_RETRY * 2);
        assert_eq!(
            second.since, first.since,
            "quarantined since the first failure"
        );
        for _ in 0..20 {
            q.failed("x".into(), t0);
        }
        assert_eq!(q.state().unwrap().next_try, t0 + MAX_RETRY);
        assert!(q.clear());
        assert!(!q.clear());
    }
}
