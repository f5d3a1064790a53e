//! Running one guest call (instantiation, `info`, `configure`, `transform`, …) to completion
//! within a wall-clock deadline.
//!
//! The epoch deadline interrupts a guest that spins in its own code, but not one that waits
//! inside a host function: a WASI `poll` on a clock subscription (`std::thread::sleep` in a
//! guest) sleeps in the host. So every guest call is made through wasmtime's async API and
//! driven here: when the call is waiting in a host function and the deadline passes, its
//! future is dropped, which unwinds the guest and abandons the host call. A call that never
//! waits costs one poll, no timer and no thread switch.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Instant;

/// Wakes the thread that drives the call.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

thread_local! {
    static WAKER: Waker = Waker::from(Arc::new(Unpark(std::thread::current())));
}

/// Polls `future` on this thread until it completes (`Some`) or `deadline` passes while it is
/// waiting (`None`; the future is dropped, cancelling whatever it waited for).
///
/// WASI's host functions use Tokio timers and I/O: they run in the current Tokio runtime when
/// there is one (the relay's; guest calls run on its blocking threads), else in
/// `wasmtime-wasi`'s own background runtime (start-up, `sluice plugin …`). Must not be called
/// from an async task: it blocks the thread.
pub(crate) fn run_until<F: Future>(future: F, deadline: Instant) -> Option<F::Output> {
    wasmtime_wasi::runtime::with_ambient_tokio_runtime(|| {
        let mut future = std::pin::pin!(future);
        WAKER.with(|waker| {
            let mut cx = Context::from_waker(waker);
            loop {
                if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                    return Some(output);
                }
                let now = Instant::now();
                if now >= deadline {
                    return None;
                }
                // Woken by the host function's waker, or at the deadline; a spurious wake-up
                // only costs another poll.
                std::thread::park_timeout(deadline - now);
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_ready_future_completes_at_once() {
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(run_until(async { 7 }, deadline), Some(7));
    }

    #[test]
    fn a_waiting_future_is_dropped_at_the_deadline() {
        struct DropFlag(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for DropFlag {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = DropFlag(Arc::clone(&dropped));
        let started = Instant::now();
        let out = run_until(
            async move {
                let _flag = flag;
                tokio::time::sleep(Duration::from_secs(3600)).await;
            },
            started + Duration::from_millis(50),
        );
        assert_eq!(out, None);
        assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(50), "{took:?}");
        assert!(took < Duration::from_secs(10), "{took:?}");
    }

    #[test]
    fn a_future_woken_by_a_timer_completes_before_the_deadline() {
        let deadline = Instant::now() + Duration::from_secs(30);
        let out = run_until(
            async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                "slept"
            },
            deadline,
        );
        assert_eq!(out, Some("slept"));
    }
}
