//! The one wasmtime [`Engine`] of a process, its epoch ticker and the shared [`Linker`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::plugin::PluginError;
use crate::plugin::wasm::bindings::{Plugin, v0_1};
use crate::plugin::wasm::host_api::HostState;

/// Granularity of call deadlines: the ticker bumps the engine's epoch this often.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(1);

/// How long the parked ticker sleeps before checking whether the engine is gone.
const TICKER_PARK: Duration = Duration::from_secs(1);

/// Engine + linker shared by every plugin and tenant. Dropping the last handle stops the
/// ticker thread.
pub(crate) struct PluginEngine {
    engine: Engine,
    linker: Linker<HostState>,
    /// Guest calls (and instantiations) running now; the ticker only ticks while there are
    /// any, so an idle relay does not wake up a thousand times a second.
    active_calls: AtomicUsize,
    ticker: OnceLock<thread::Thread>,
}

/// Held while a guest call runs: keeps the epoch ticker going (see [`PluginEngine::enter`]).
pub(crate) struct CallGuard<'a> {
    engine: &'a PluginEngine,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.engine.active_calls.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Most instances a process with few tenants keeps at once: `sluice plugin check/test`, and
/// the floor for `sluice run`.
pub(crate) const MIN_POOLED_INSTANCES: u32 = 64;

/// Most instances one process pools. Each has up to two linear memories, and each memory slot
/// reserves 4 GiB of address space plus guard pages (wasmtime's default on 64-bit hosts, which
/// makes the guest's bounds checks free): 6,144 instances are 12,288 slots, about 48 TiB of the
/// 128 TiB a process can address on x86-64 Linux. A pool for 10,000 configured tenants and
/// their reload replacements asked for 181 TiB, and the engine failed to start ("mmap failed
/// to reserve"); two pools of 64 TiB in one process (tests) failed now and then.
pub(crate) const MAX_POOLED_INSTANCES: u32 = 6_144;

/// Core module instances (and their memories and tables) to plan per plugin instance: a Rust
/// component has one or two, a Python or JavaScript one up to about a dozen.
const CORE_INSTANCES_PER_PLUGIN: u32 = 16;

/// Linear memory a freed slot keeps resident, reset to its original contents in place rather
/// than handed back to the kernel: a Rust guest's stack and heap start within its first 1–2
/// MiB. With thousands of free-form tenants every row may take a new instance, and without
/// this each paid copy-on-write page faults with TLB shoot-downs to the other cores (a third
/// of the relay's CPU in `perf`); measured in docs/benchmarks.md ("many tenants"). Only with
/// `PAGEMAP_SCAN` (Linux 6.7+), which finds the pages the guest wrote: those are reset, up
/// to this many bytes, the rest is handed back. A Rust guest writes well under 1 MiB; a
/// Python or JavaScript one more, of which a freed slot then keeps 1 MiB.
const LINEAR_MEMORY_KEEP_RESIDENT: usize = 1 << 20;

/// The pooling allocator for `instances` live plugin instances: memories, tables and fiber
/// stacks come from slots reserved once and reused, so creating and dropping an instance
/// costs no `mmap`/`munmap` (a relay with thousands of free-form tenants creates and drops
/// instances all the time). The slots reserve address space only; memory is committed as the
/// guests touch it and reset when a slot is freed. A plugin that exceeds a slot (a table
/// longer than `table_elements`) fails to instantiate, as if it broke any other limit.
fn pooling(instances: u32) -> PoolingAllocationConfig {
    let instances = instances.clamp(MIN_POOLED_INSTANCES, MAX_POOLED_INSTANCES);
    let core = instances.saturating_mul(CORE_INSTANCES_PER_PLUGIN);
    // Without `PAGEMAP_SCAN` the kept bytes would be the lowest ones, all of them reset with
    // `memset` on every drop whether the guest touched them or not: slower than handing
    // them back, so only with the scan.
    let keep_resident = if PoolingAllocationConfig::is_pagemap_scan_available() {
        LINEAR_MEMORY_KEEP_RESIDENT
    } else {
        0
    };
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(instances)
        .total_stacks(instances)
        .total_core_instances(core)
        .total_memories(instances.saturating_mul(2))
        .total_tables(core)
        // Python and JavaScript runtimes have function tables of tens of thousands.
        .table_elements(200_000)
        .max_memories_per_module(2)
        .max_core_instance_size(16 << 20)
        .max_component_instance_size(16 << 20)
        // Freed slots are returned to the kernel in batches (one TLB shoot-down per batch,
        // not per instance), and the top of a fiber stack is zeroed and kept rather than
        // faulted in again by the next instance.
        .decommit_batch_size(64)
        .async_stack_keep_resident(64 << 10)
        .table_keep_resident(64 << 10)
        .linear_memory_keep_resident(keep_resident)
        .pagemap_scan(Enabled::Auto);
    pool
}

impl PluginEngine {
    /// An engine whose instance pool holds `instances` live plugin instances (at least
    /// [`MIN_POOLED_INSTANCES`], at most [`MAX_POOLED_INSTANCES`]).
    pub(crate) fn new(instances: u32) -> Result<Arc<Self>, PluginError> {
        let mut config = Config::new();
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling(instances)));
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        // No component-model async here: plain sync calls are markedly cheaper.
        config.concurrency_support(false);
        let engine = Engine::new(&config).map_err(PluginError::engine)?;

        let mut linker = Linker::new(&engine);
        // WASI p2 with an empty context: guests built with std (Python, JS, Rust) import
        // these at start-up, but get no files, env, args, network or inherited stdio. The
        // async flavour, so a guest waiting in WASI (a sleep) can be cut off at its deadline.
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(PluginError::engine)?;
        // The host interface of every supported contract version (docs/plugins.md, "Contract
        // versions"): components built against 0.1.0 import sluice:plugin/host@0.1.0.
        Plugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(PluginError::engine)?;
        v0_1::Plugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(PluginError::engine)?;

        let this = Arc::new(Self {
            engine,
            linker,
            active_calls: AtomicUsize::new(0),
            ticker: OnceLock::new(),
        });
        let ticker = spawn_ticker(Arc::downgrade(&this))?;
        let _ = this.ticker.set(ticker);
        Ok(this)
    }

    /// Marks a guest call as running until the guard is dropped. Deadlines are counted in
    /// epoch ticks from the moment they are armed, so arm them after entering.
    pub(crate) fn enter(&self) -> CallGuard<'_> {
        if self.active_calls.fetch_add(1, Ordering::AcqRel) == 0
            && let Some(ticker) = self.ticker.get()
        {
            ticker.unpark();
        }
        CallGuard { engine: self }
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(crate) fn linker(&self) -> &Linker<HostState> {
        &self.linker
    }
}

fn spawn_ticker(engine: Weak<PluginEngine>) -> Result<thread::Thread, PluginError> {
    thread::Builder::new()
        .name("sluice-epoch".into())
        .spawn(move || {
            while let Some(engine) = engine.upgrade() {
                let busy = engine.active_calls.load(Ordering::Acquire) > 0;
                if busy {
                    engine.engine.increment_epoch();
                }
                drop(engine);
                if busy {
                    thread::sleep(EPOCH_TICK);
                } else {
                    // `enter` unparks us; the timeout only notices a dropped engine.
                    thread::park_timeout(TICKER_PARK);
                }
            }
        })
        .map(|handle| handle.thread().clone())
        .map_err(|source| PluginError::EpochTicker { source })
}

/// Epoch ticks that make up `timeout` (at least one).
pub(crate) fn deadline_ticks(timeout: Duration) -> u64 {
    let ticks = timeout.as_micros() / EPOCH_TICK.as_micros().max(1);
    u64::try_from(ticks).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticker_counts_running_calls() {
        let engine = PluginEngine::new(MIN_POOLED_INSTANCES).unwrap();
        {
            let _a = engine.enter();
            let _b = engine.enter();
            assert_eq!(engine.active_calls.load(Ordering::Acquire), 2);
        }
        assert_eq!(engine.active_calls.load(Ordering::Acquire), 0);
    }

    #[test]
    fn deadlines_round_down_to_ticks_but_never_zero() {
        assert_eq!(deadline_ticks(Duration::from_millis(50)), 50);
        assert_eq!(deadline_ticks(Duration::from_micros(10)), 1);
    }
}
