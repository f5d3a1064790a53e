//! A budget for live plugin instances: how many, and how much linear memory they hold
//! together. There are two: one for tenants without their own `[tenants.<name>]` entry, one
//! for those with one (so free-form tenants coming and going never evict a configured
//! tenant's instance). A tenant that needs an instance when its budget is spent takes the
//! place of an idle one (least recently used, by a clock sweep) instead of waiting for a later
//! batch.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::plugin::tenant::status::InstanceUse;
use crate::plugin::tenant::{Tenant, lock};

/// Live instances (and their memory) allowed for one class of tenants.
pub(crate) struct InstanceQuota {
    live: AtomicUsize,
    bytes: AtomicUsize,
    cap: usize,
    max_bytes: usize,
    /// Whose instances and which settings bound them, for the reason rows wait.
    described: String,
    /// Tenants holding an instance, in the order the clock sweep visits them.
    holders: Mutex<VecDeque<Weak<Tenant>>>,
}

/// One live instance counted against an [`InstanceQuota`], with the memory it was last seen
/// to hold; released on drop.
pub(crate) struct QuotaPermit {
    quota: Arc<InstanceQuota>,
    bytes: usize,
}

impl Drop for QuotaPermit {
    fn drop(&mut self) {
        self.quota.live.fetch_sub(1, Ordering::AcqRel);
        self.quota.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl QuotaPermit {
    /// Records that the instance now holds `bytes` of linear memory.
    pub(crate) fn set_bytes(&mut self, bytes: usize) {
        if bytes >= self.bytes {
            self.quota
                .bytes
                .fetch_add(bytes - self.bytes, Ordering::AcqRel);
        } else {
            self.quota
                .bytes
                .fetch_sub(self.bytes - bytes, Ordering::AcqRel);
        }
        self.bytes = bytes;
    }
}

impl InstanceQuota {
    /// `described` names whose instances these are and the settings that bound them.
    pub(crate) fn new(cap: usize, max_bytes: usize, described: String) -> Arc<Self> {
        Arc::new(Self {
            live: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            cap: cap.max(1),
            max_bytes,
            described,
            holders: Mutex::new(VecDeque::new()),
        })
    }

    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// What the budget holds now; `max_live` is left out for a budget of memory only.
    pub(crate) fn usage(&self) -> InstanceUse {
        InstanceUse {
            live: self.live(),
            max_live: (self.cap != usize::MAX).then_some(self.cap),
            memory_bytes: self.bytes(),
            memory_limit_bytes: self.max_bytes,
        }
    }

    /// Why a tenant's rows wait when every instance of the budget is busy.
    pub(crate) fn busy_reason(&self) -> String {
        format!("the plugin instances {} are all busy", self.described)
    }

    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Linear memory the live instances were last seen to hold.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    /// A permit for one more instance, if the count and the memory budget leave room (the
    /// first instance always fits the memory budget).
    pub(crate) fn try_acquire(self: &Arc<Self>) -> Option<QuotaPermit> {
        let memory_left = self.live() == 0 || self.bytes() < self.max_bytes;
        if !memory_left {
            return None;
        }
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .ok()
            .map(|_| QuotaPermit {
                quota: Arc::clone(self),
                bytes: 0,
            })
    }

    /// Puts `tenant` (which just got an instance) on the clock, unless it is on it already.
    pub(crate) fn enlist(&self, tenant: &Arc<Tenant>) {
        if !tenant.enlisted.swap(true, Ordering::AcqRel) {
            lock(&self.holders).push_back(Arc::downgrade(tenant));
        }
    }

    /// Drops the instance of one idle tenant to make room: the first on the clock that was
    /// not used since the sweep last passed it and whose lock is free (a tenant running now,
    /// the caller included, is passed over). Returns whether one was dropped.
    pub(crate) fn evict_one(&self) -> bool {
        let mut holders = lock(&self.holders);
        // Two rounds: the first may only clear "used" marks.
        for _ in 0..holders.len().saturating_mul(2) {
            let Some(weak) = holders.pop_front() else {
                return false;
            };
            let Some(tenant) = weak.upgrade() else {
                continue;
            };
            if !tenant.health.has_instance() {
                tenant.enlisted.store(false, Ordering::Release);
                continue;
            }
            if tenant.used.swap(false, Ordering::AcqRel) {
                holders.push_back(weak);
                continue;
            }
            let Some(mut runner) = tenant.try_runner() else {
                holders.push_back(weak);
                continue;
            };
            tenant.enlisted.store(false, Ordering::Release);
            drop(holders);
            // Dropping the instance (and its permit) outside the clock's lock.
            runner.drop_instance();
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_instances_and_the_memory_they_last_held() {
        let quota = InstanceQuota::new(3, 100, "of the test".into());
        let mut first = quota.try_acquire().unwrap();
        first.set_bytes(150);
        // Over the memory budget: no second instance, whatever the count allows.
        assert!(quota.try_acquire().is_none());
        first.set_bytes(60);
        let mut second = quota.try_acquire().unwrap();
        second.set_bytes(30);
        assert_eq!((quota.live(), quota.bytes()), (2, 90));
        let third = quota.try_acquire().unwrap();
        assert!(quota.try_acquire().is_none(), "count cap");
        drop((first, third));
        assert_eq!((quota.live(), quota.bytes()), (1, 30));
        drop(second);
        assert_eq!((quota.live(), quota.bytes()), (0, 0));
        // The first instance always fits, however large.
        let mut big = quota.try_acquire().unwrap();
        big.set_bytes(1_000);
        assert!(quota.try_acquire().is_none());
    }
}
