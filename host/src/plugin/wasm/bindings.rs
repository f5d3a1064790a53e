//! Host bindings generated from `wit/sluice.wit` (world `plugin`). Exports are called through
//! wasmtime's async API so that every call can be cut off at a wall-clock deadline (see
//! [`super::call`]); the host's own imports (`log`, `counter-add`) are plain functions.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
    exports: { default: async },
});

pub use sluice::plugin::types;
