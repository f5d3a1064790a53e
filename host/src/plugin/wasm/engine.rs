//! The one wasmtime [`Engine`] of a process (its pooling allocator sized to the tenants' memory
//! limits), its epoch ticker and the shared [`Linker`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::plugin::PluginError;
use crate::plugin::wasm::bindings::{Plugin, v0_1, v0_2};
use crate::plugin::wasm::call;
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
    /// Bytes of each pooled memory slot: no instance's memory grows past it.
    slot: u64,
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

/// Most instances one process pools. A pooled memory slot is sized to the largest tenant's
/// `memory_mb` (128 MiB by default, see [`slot_reservation`]), not wasmtime's 4 GiB, so the
/// address space is no longer what limits the pool ([`ADDRESS_SPACE`] caps it for large
/// slots); this bound keeps the kernel's mappings in reach: each resident instance costs a
/// few (docs/operations.md, "Many tenants: `vm.max_map_count`").
pub(crate) const MAX_POOLED_INSTANCES: u32 = 32_768;

/// Address space the memory slots of one process may reserve: well within the 128 TiB a
/// process can address on x86-64 Linux, leaving room for a second engine (tests, reload).
const ADDRESS_SPACE: u64 = 32 << 40;

/// The memory slot every engine reserves at least: the default `memory_mb`.
pub(crate) const DEFAULT_SLOT_MEMORY: u64 = 128 << 20;

/// Unmapped bytes after each memory slot. Cranelift elides the bounds check of an access
/// whose constant offset falls within it; wasmtime's default (32 MiB) only pays off with
/// 4 GiB slots, where it elides every check.
const MEMORY_GUARD: u64 = 2 << 20;

/// Linear memories planned per plugin instance: a component built from one core module with
/// one memory (the Rust reference plugin; check with `wasm-tools print`) needs one slot. A
/// component that needs more takes them from the same pool; when the pool has none free the
/// instance is refused as [`crate::plugin::PluginError::PoolExhausted`] and its tenant
/// makes room by evicting an idle instance, as for the instance budget.
const MEMORIES_PER_INSTANCE: u32 = 1;

/// Core module instances (and their tables) to plan per plugin instance: a Rust component
/// has one or two, a Python or JavaScript one up to about a dozen.
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

/// The memory slot for tenants whose largest `memory_mb` is `largest_memory` bytes: at least
/// [`DEFAULT_SLOT_MEMORY`], rounded up to a power of two so that small changes to the
/// limits do not change the engine's settings (which would invalidate the compile cache).
/// At most 4 GiB, what a 32-bit memory can address.
pub(crate) fn slot_reservation(largest_memory: u64) -> u64 {
    largest_memory
        .max(DEFAULT_SLOT_MEMORY)
        .checked_next_power_of_two()
        .unwrap_or(u64::MAX)
        .min(4 << 30)
}

/// Most instances a pool of `slot`-byte memories may hold within [`ADDRESS_SPACE`] (a guard
/// before and after each slot) and [`MAX_POOLED_INSTANCES`].
pub(crate) fn max_pooled_instances(slot: u64) -> u32 {
    let per_instance = (slot + 2 * MEMORY_GUARD) * u64::from(MEMORIES_PER_INSTANCE);
    let fit = ADDRESS_SPACE / per_instance.max(1);
    u32::try_from(fit)
        .unwrap_or(u32::MAX)
        .min(MAX_POOLED_INSTANCES)
}

/// The pooling allocator for `instances` live plugin instances whose memories are at most
/// `slot` bytes: memories and tables come from slots reserved once and reused, so creating
/// and dropping an instance costs no `mmap`/`munmap` (a relay with thousands of free-form
/// tenants creates and drops instances all the time). The slots reserve address space only;
/// memory is committed as the guests touch it and reset when a slot is freed. A plugin that
/// exceeds a slot (a table longer than `table_elements`) fails to instantiate, as if it
/// broke any other limit. Calls are synchronous (no fibers), so no stacks are pooled.
fn pooling(instances: u32, slot: u64) -> PoolingAllocationConfig {
    let instances = instances.clamp(MIN_POOLED_INSTANCES, max_pooled_instances(slot));
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
        .total_stacks(0)
        .total_core_instances(core)
        .total_memories(instances.saturating_mul(MEMORIES_PER_INSTANCE))
        .total_tables(core)
        .max_memory_size(usize::try_from(slot).unwrap_or(usize::MAX))
        // Python and JavaScript runtimes have function tables of tens of thousands.
        .table_elements(200_000)
        .max_memories_per_module(2)
        .max_core_instance_size(16 << 20)
        .max_component_instance_size(16 << 20)
        // Freed slots are returned to the kernel in batches (one TLB shoot-down per batch,
        // not per instance).
        .decommit_batch_size(64)
        .table_keep_resident(64 << 10)
        .linear_memory_keep_resident(keep_resident)
        .pagemap_scan(Enabled::Auto);
    pool
}

impl PluginEngine {
    /// An engine whose instance pool holds `instances` live plugin instances (at least
    /// [`MIN_POOLED_INSTANCES`], at most [`MAX_POOLED_INSTANCES`]) with memories of the
    /// default `memory_mb`.
    pub(crate) fn new(instances: u32) -> Result<Arc<Self>, PluginError> {
        Self::with_memory(instances, DEFAULT_SLOT_MEMORY)
    }

    /// As [`PluginEngine::new`], with memory slots for tenants whose largest `memory_mb` is
    /// `largest_memory` bytes (see [`slot_reservation`]).
    pub(crate) fn with_memory(
        instances: u32,
        largest_memory: u64,
    ) -> Result<Arc<Self>, PluginError> {
        let slot = slot_reservation(largest_memory);
        let mut config = Config::new();
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling(
            instances, slot,
        )));
        // A slot of the largest `memory_mb`, not 4 GiB: guest code checks bounds explicitly
        // (against a constant, since memories never move), the price of ~30 times as many
        // slots in the same address space (docs/benchmarks.md, "many tenants").
        config.memory_reservation(slot);
        config.memory_reservation_for_growth(0);
        config.memory_guard_size(MEMORY_GUARD);
        config.memory_may_move(false);
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        // No component-model async here: plain sync calls are markedly cheaper.
        config.concurrency_support(false);
        let engine = Engine::new(&config).map_err(PluginError::engine)?;

        let mut linker = Linker::new(&engine);
        // WASI p2 with an empty context: guests built with std (Python, JS, Rust) import
        // these at start-up, but get no files, env, args, network or inherited stdio. The
        // synchronous flavour: calls run on the caller's stack, without a fiber per Store;
        // the one place a guest can wait (a poll, a sleep) is replaced by one bounded by the
        // call's deadline (see [`super::call`]).
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(PluginError::engine)?;
        linker.allow_shadowing(true);
        call::shadow_waits(&mut linker).map_err(PluginError::engine)?;
        linker.allow_shadowing(false);
        // The host interface of every supported contract version (docs/plugins.md, "Contract
        // versions"): components built against 0.1.0 import sluice:plugin/host@0.1.0, …
        Plugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(PluginError::engine)?;
        v0_1::Plugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(PluginError::engine)?;
        v0_2::Plugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(PluginError::engine)?;

        let this = Arc::new(Self {
            engine,
            linker,
            slot,
            active_calls: AtomicUsize::new(0),
            ticker: OnceLock::new(),
        });
        let ticker = spawn_ticker(Arc::downgrade(&this))?;
        let _ = this.ticker.set(ticker);
        Ok(this)
    }

    /// The largest linear memory an instance may have, in bytes (its pool slot).
    pub(crate) fn memory_slot(&self) -> u64 {
        self.slot
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
    use crate::plugin::limits::TenantLimiter;
    use wasmtime::component::Component;

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

    /// A component with one memory of one page: `grow(pages)` (old size in pages, or -1),
    /// `put(value)` at byte 1,024 and `get()` from there.
    const MEMORY_PROBE: &str = r#"(component
        (core module $m
            (memory 1)
            (func (export "grow") (param i32) (result i32) (memory.grow (local.get 0)))
            (func (export "put") (param i32) (i32.store (i32.const 1024) (local.get 0)))
            (func (export "get") (result i32) (i32.load (i32.const 1024))))
        (core instance $i (instantiate $m))
        (func (export "grow") (param "pages" u32) (result s32) (canon lift (core func $i "grow")))
        (func (export "put") (param "value" u32) (canon lift (core func $i "put")))
        (func (export "get") (result u32) (canon lift (core func $i "get"))))"#;

    struct Probe {
        store: wasmtime::Store<TenantLimiter>,
        instance: wasmtime::component::Instance,
    }

    impl Probe {
        /// An instance of [`MEMORY_PROBE`] in a Store capped at `memory_cap` bytes, as a
        /// tenant's (`memory_mb`).
        fn new(engine: &PluginEngine, component: &Component, memory_cap: usize) -> Self {
            let mut store = wasmtime::Store::new(engine.engine(), TenantLimiter::new(memory_cap));
            store.limiter(|limiter| limiter);
            store.set_epoch_deadline(1_000_000);
            let instance = Linker::new(engine.engine())
                .instantiate(&mut store, component)
                .unwrap();
            Self { store, instance }
        }

        fn grow(&mut self, pages: u32) -> wasmtime::Result<i32> {
            let f = self
                .instance
                .get_typed_func::<(u32,), (i32,)>(&mut self.store, "grow")?;
            Ok(f.call(&mut self.store, (pages,))?.0)
        }

        fn put(&mut self, value: u32) {
            let f = self
                .instance
                .get_typed_func::<(u32,), ()>(&mut self.store, "put")
                .unwrap();
            f.call(&mut self.store, (value,)).unwrap();
        }

        fn get(&mut self) -> u32 {
            let f = self
                .instance
                .get_typed_func::<(), (u32,)>(&mut self.store, "get")
                .unwrap();
            f.call(&mut self.store, ()).unwrap().0
        }
    }

    const PAGE: u32 = 64 * 1024;

    #[test]
    fn slots_are_sized_to_the_largest_memory_limit_in_powers_of_two() {
        assert_eq!(slot_reservation(0), DEFAULT_SLOT_MEMORY);
        assert_eq!(slot_reservation(128 << 20), 128 << 20);
        assert_eq!(slot_reservation(200 << 20), 256 << 20);
        assert_eq!(slot_reservation(u64::MAX), 4 << 30);
        // The default slot leaves the count, not the address space, as the bound…
        assert_eq!(
            max_pooled_instances(DEFAULT_SLOT_MEMORY),
            MAX_POOLED_INSTANCES
        );
        // …4 GiB slots fit fewer (a guard before and after each).
        let large = max_pooled_instances(4 << 30);
        assert!((7_000..MAX_POOLED_INSTANCES).contains(&large), "{large}");
    }

    #[test]
    fn a_memory_grows_to_its_slot_and_no_further() {
        let engine = PluginEngine::new(MIN_POOLED_INSTANCES).unwrap();
        assert_eq!(engine.memory_slot(), DEFAULT_SLOT_MEMORY);
        let component = Component::new(engine.engine(), MEMORY_PROBE).unwrap();
        let slot_pages = u32::try_from(DEFAULT_SLOT_MEMORY).unwrap() / PAGE;
        // No tenant limit below the slot: the slot itself is the bound.
        let mut probe = Probe::new(&engine, &component, usize::MAX);
        assert_eq!(probe.grow(slot_pages - 1).unwrap(), 1);
        probe.put(7);
        assert_eq!(probe.get(), 7);
        // Refused by the pool (the slot's maximum), and a trap as every failed growth is.
        let err = probe.grow(1).unwrap_err();
        assert!(
            format!("{err:#}").contains("maximum size exceeded"),
            "one page past the slot: {err:#}"
        );
    }

    #[test]
    fn the_tenant_memory_cap_holds_inside_the_smaller_slot() {
        let engine = PluginEngine::new(MIN_POOLED_INSTANCES).unwrap();
        let component = Component::new(engine.engine(), MEMORY_PROBE).unwrap();
        // `memory_mb = 16`: the limiter refuses growth past it, and traps (as for every
        // tenant: `trap_on_grow_failure`).
        let mut probe = Probe::new(&engine, &component, 16 << 20);
        assert_eq!(probe.grow(16 * 16 - 1).unwrap(), 1);
        let err = probe.grow(1).unwrap_err();
        assert!(
            format!("{err:#}").contains("memory limit of 16 MiB"),
            "{err:#}"
        );
    }

    #[test]
    fn a_reused_slot_shows_nothing_of_the_instance_before() {
        // The pool hands an instance of the same component the memory slot the one before
        // left (module affinity), reset in place (`linear_memory_keep_resident`).
        let engine = PluginEngine::new(MIN_POOLED_INSTANCES).unwrap();
        let component = Component::new(engine.engine(), MEMORY_PROBE).unwrap();
        for secret in [0xdead_beef_u32, 0x005e_c2e7, 42] {
            let mut probe = Probe::new(&engine, &component, usize::MAX);
            assert_eq!(probe.get(), 0, "the previous tenant's secret is gone");
            // Memory the previous instance grew into is gone too.
            assert_eq!(probe.grow(0).unwrap(), 1);
            probe.put(secret);
            assert_eq!(probe.grow(100).unwrap(), 1);
            assert_eq!(probe.get(), secret);
        }
    }

    #[test]
    fn a_full_pool_is_reported_as_such() {
        // Asking for fewer than the floor gets the floor.
        let engine = PluginEngine::new(1).unwrap();
        let component = Component::new(engine.engine(), MEMORY_PROBE).unwrap();
        let _live: Vec<Probe> = (0..MIN_POOLED_INSTANCES)
            .map(|_| Probe::new(&engine, &component, usize::MAX))
            .collect();
        let mut store = wasmtime::Store::new(engine.engine(), TenantLimiter::new(usize::MAX));
        store.set_epoch_deadline(1_000_000);
        let err = Linker::new(engine.engine())
            .instantiate(&mut store, &component)
            .unwrap_err();
        assert!(
            err.downcast_ref::<wasmtime::PoolConcurrencyLimitError>()
                .is_some(),
            "{err:#}"
        );
    }

    #[test]
    fn deadlines_round_down_to_ticks_but_never_zero() {
        assert_eq!(deadline_ticks(Duration::from_millis(50)), 50);
        assert_eq!(deadline_ticks(Duration::from_micros(10)), 1);
    }
}
