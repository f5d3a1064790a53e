//! Keeping a guest call (instantiation, `info`, `configure`, `transform`, …) within its
//! wall-clock deadline without running it on a fiber.
//!
//! Guest calls are synchronous: they run on the calling thread's own stack. The epoch deadline
//! interrupts a guest that spins in its own code, but not one that waits inside a host
//! function. The only host functions a plugin can wait in are WASI's `poll` and
//! `pollable.block` (a sleep: `std::thread::sleep` in a Rust guest subscribes to the monotonic
//! clock and blocks): a plugin gets no files, sockets or stdin to wait on. [`shadow_waits`]
//! replaces both with versions that wait at most until the call's deadline and then trap with
//! [`WaitedPastDeadline`], which the caller reports as the call running into `call_timeout`.

use std::fmt;
use std::future::Future;
use std::time::Instant;

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::io::poll as wasi_poll;

use crate::plugin::wasm::host_api::HostState;

/// The WASI interface whose waits are shadowed, at the version `wasmtime-wasi` links (guests
/// importing an older 0.2 version are linked to it).
const POLL_INTERFACE: &str = "wasi:io/poll@0.2.12";

/// A guest call waited in a host function until its deadline passed; the call traps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitedPastDeadline;

impl fmt::Display for WaitedPastDeadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("plugin waited in a host call past its deadline")
    }
}

impl std::error::Error for WaitedPastDeadline {}

/// Replaces WASI's `poll` and `pollable.block` in `linker` (which must allow shadowing) with
/// versions bounded by the running call's deadline ([`HostState::deadline`]).
pub(crate) fn shadow_waits(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let mut poll = linker.instance(POLL_INTERFACE)?;
    poll.func_wrap(
        "poll",
        |mut store: StoreContextMut<'_, HostState>, (pollables,): (Vec<Resource<DynPollable>>,)| {
            let (table, deadline) = store.data_mut().waits();
            let ready = until(deadline, wasi_poll::Host::poll(table, pollables))??;
            Ok((ready,))
        },
    )?;
    poll.func_wrap(
        "[method]pollable.block",
        |mut store: StoreContextMut<'_, HostState>, (pollable,): (Resource<DynPollable>,)| {
            let (table, deadline) = store.data_mut().waits();
            until(deadline, wasi_poll::HostPollable::block(table, pollable))??;
            Ok(())
        },
    )?;
    Ok(())
}

/// Runs `wait` to completion on Tokio (the relay's runtime when this thread has one, else
/// `wasmtime-wasi`'s own), or gives up at `deadline`, dropping it (which cancels the timer or
/// I/O it waited for).
pub(crate) fn until<F: Future>(
    deadline: Instant,
    wait: F,
) -> Result<F::Output, WaitedPastDeadline> {
    let left = deadline.saturating_duration_since(Instant::now());
    wasmtime_wasi::runtime::in_tokio(async { tokio::time::timeout(left, wait).await })
        .map_err(|_| WaitedPastDeadline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn a_ready_wait_completes_at_once() {
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(until(deadline, async { 7 }), Ok(7));
    }

    #[test]
    fn a_wait_is_dropped_at_the_deadline() {
        struct DropFlag(Arc<AtomicBool>);
        impl Drop for DropFlag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(Arc::clone(&dropped));
        let started = Instant::now();
        let out = until(started + Duration::from_millis(50), async move {
            let _flag = flag;
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        assert_eq!(out, Err(WaitedPastDeadline));
        assert!(dropped.load(Ordering::SeqCst));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(50), "{took:?}");
        assert!(took < Duration::from_secs(10), "{took:?}");
    }

    #[test]
    fn a_wait_that_ends_before_the_deadline_completes() {
        let deadline = Instant::now() + Duration::from_secs(30);
        let out = until(deadline, async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            "slept"
        });
        assert_eq!(out, Ok("slept"));
    }

    #[test]
    fn a_past_deadline_gives_up_without_waiting() {
        let started = Instant::now();
        let out = until(started, async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        assert_eq!(out, Err(WaitedPastDeadline));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
