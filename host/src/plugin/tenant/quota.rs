//! The cap on live instances of tenants without their own `[tenants.<name>]` entry, and the
//! permit each such instance holds while it lives.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Live instances allowed for tenants without their own `[tenants.<name>]` entry.
pub(crate) struct InstanceQuota {
    live: AtomicUsize,
    cap: usize,
}

/// One live instance counted against an [`InstanceQuota`]; released on drop.
pub(crate) struct QuotaPermit(Arc<InstanceQuota>);

impl Drop for QuotaPermit {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

impl InstanceQuota {
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            live: AtomicUsize::new(0),
            cap: cap.max(1),
        })
    }

    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    pub(crate) fn try_acquire(self: &Arc<Self>) -> Option<QuotaPermit> {
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .ok()
            .map(|_| QuotaPermit(Arc::clone(self)))
    }
}
