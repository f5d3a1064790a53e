//! Host bindings generated from `wit/sluice.wit` (world `plugin`). Exports are called through
//! wasmtime's async API so that every call can be cut off at a wall-clock deadline (see
//! [`super::call`]); the host's own imports (`log`, `counter-add`) are plain functions.
//! Inputs to exports borrow ([`types::OutboxRow`] has `&str`/`&[u8]` fields); results are
//! owned.

// Generated items carry the WIT file's documentation, not always on every field.
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
    exports: { default: async },
    // Rows are passed to `transform`/`transform-batch` as borrowed views of the claimed rows:
    // lowering copies them into guest memory directly, without an owned copy per row first.
    ownership: Borrowing { duplicate_if_necessary: true },
});

pub(crate) use sluice::plugin::types;
