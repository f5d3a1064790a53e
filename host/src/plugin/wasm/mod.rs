//! The wasmtime side of the sandbox, private to the plugin host.
//!
//! - [`engine`]: the one engine of a process, its epoch ticker, the linker (WASI p2 with an
//!   empty context + the host API)
//! - [`component`]: loading a `.wasm` file into something to instantiate
//! - [`cache`]: the compile cache on disk, pruned to its size bound
//! - [`imports`]: refusing a component that imports what the sandbox lacks, before compiling
//! - [`instance`]: one tenant's `wasmtime::Store` and the calls into the guest
//! - [`call`]: driving a guest call within its wall-clock deadline
//! - [`host_api`]: what guests may call on the host, and the per-tenant state behind it
//! - [`guest_output`]: the bounded tail of a guest's stdout and stderr, quoted on traps
//! - [`bindings`]: generated from `wit/sluice.wit`

pub(super) mod bindings;
pub(super) mod cache;
pub(super) mod call;
pub(super) mod component;
pub(super) mod contract;
pub(super) mod engine;
pub(super) mod guest_output;
pub(super) mod host_api;
pub(super) mod imports;
pub(super) mod instance;
