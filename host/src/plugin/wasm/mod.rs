//! The wasmtime side of the sandbox, private to the plugin host.
//!
//! - [`engine`]: the one engine of a process, its epoch ticker, the linker (WASI p2 with an
//!   empty context + the host API)
//! - [`component`]: loading a `.wasm` file (compile cache) into something to instantiate
//! - [`instance`]: one tenant's Store and the calls into the guest
//! - [`call`]: driving a guest call within its wall-clock deadline
//! - [`host_api`]: what guests may call on the host, and the per-tenant state behind it
//! - [`bindings`]: generated from `wit/sluice.wit`

pub mod bindings;
pub mod call;
pub mod component;
pub mod engine;
pub mod host_api;
pub mod instance;
