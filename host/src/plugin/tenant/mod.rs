//! One tenant in the plugin host: [`Tenant`], what the router holds per tenant — the runner
//! behind its lock and what may be read without that lock.
//!
//! - [`template`]: its plugin as configured, and the live instance made from it
//! - [`runner`]: how a batch's rows of it are run (under the tenant's lock)
//! - [`batching`]: `transform-batch` or row by row, call sizes, the output budget per batch
//! - [`health`]: what other batches may learn without the lock (breaker, a stalled call)
//! - [`quota`]: the budgets for live instances (with and without their own entry)
//! - [`breaker`], [`quarantine`]: why its rows wait
//! - [`status`]: what the router reports about it
//! - [`watch`]: which tenants a claim leaves out, without asking every tenant; the stall limit

pub(crate) mod batching;
pub(crate) mod breaker;
pub(crate) mod health;
pub(crate) mod quarantine;
pub(crate) mod quota;
pub(crate) mod runner;
pub(crate) mod status;
pub(crate) mod template;
pub(crate) mod watch;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use crate::plugin::tenant::health::TenantHealth;
use crate::plugin::tenant::quota::InstanceQuota;
use crate::plugin::tenant::runner::TenantRunner;

/// How often a batch checks whether a busy tenant's lock is free.
pub(crate) const LOCK_POLL: Duration = Duration::from_micros(200);

/// A tenant as the router holds it (shared by the batches that have rows of it).
pub(crate) struct Tenant {
    /// Runs its rows; one batch at a time.
    runner: Mutex<TenantRunner>,
    /// What may be read without waiting for `runner`'s lock.
    pub(crate) health: Arc<TenantHealth>,
    /// Has its own `[tenants.<name>]` entry (or is the tenant of rows without one): never
    /// forgotten, though its instance is dropped when idle and its budget needs the room.
    pub(crate) configured: bool,
    /// Router clock tick of the last batch that had rows of this tenant (LRU order).
    last_used: AtomicU64,
    /// Used since the instance budget's clock sweep last passed it (see [`quota`]).
    pub(crate) used: AtomicBool,
    /// On its instance budget's clock.
    pub(crate) enlisted: AtomicBool,
    /// The budget its instances count against.
    quota: Option<Arc<InstanceQuota>>,
}

impl Tenant {
    pub(crate) fn new(runner: TenantRunner, configured: bool) -> Arc<Self> {
        Arc::new(Self {
            health: Arc::clone(&runner.health),
            quota: runner.quota().cloned(),
            runner: Mutex::new(runner),
            configured,
            last_used: AtomicU64::new(0),
            used: AtomicBool::new(true),
            enlisted: AtomicBool::new(false),
        })
    }

    /// Marks the tenant as used by the batch of router clock `tick`.
    pub(crate) fn touch(&self, tick: u64) {
        self.last_used.store(tick, Ordering::Relaxed);
        self.used.store(true, Ordering::Relaxed);
    }

    /// After a run: a tenant whose instance counts against the budget becomes a candidate
    /// for eviction once idle.
    pub(crate) fn enlist_if_live(self: &Arc<Self>) {
        if let Some(quota) = &self.quota
            && self.health.has_instance()
        {
            quota.enlist(self);
        }
    }

    /// The router clock tick of the last batch that had rows of this tenant.
    pub(crate) fn last_used(&self) -> u64 {
        self.last_used.load(Ordering::Relaxed)
    }

    /// Waits for the runner's lock.
    pub(crate) fn runner(&self) -> MutexGuard<'_, TenantRunner> {
        lock(&self.runner)
    }

    /// The runner's lock if it is free now.
    pub(crate) fn try_runner(&self) -> Option<MutexGuard<'_, TenantRunner>> {
        match self.runner.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// A poisoned lock only means another thread panicked mid-call; the tenant's data is still
/// consistent (at worst an instance that will trap again and be replaced).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
