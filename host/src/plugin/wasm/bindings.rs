//! Host bindings generated from the WIT of every supported contract version (world `plugin`):
//! `sluice:plugin@0.3.0` from `wit/sluice.wit` (the current one, whose types the host works
//! with) and, in [`v0_1`] and [`v0_2`], `sluice:plugin@0.1.0` and `@0.2.0` as released
//! (`wit/v0.1.0/`, `wit/v0.2.0/`), converted to the current types at the boundary
//! ([`super::contract`]). Exports are called synchronously, on
//! the caller's stack (no fiber per Store): a wall-clock deadline bounds the only host calls a
//! guest can wait in (see [`super::call`]), epoch interruption its own code. The host's own
//! imports (`log`, `counter-add`) are plain functions. Inputs to exports borrow
//! ([`types::OutboxRow`] has `&str`/`&[u8]` fields); results are owned.

// Generated items carry the WIT file's documentation, not always on every field.
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
    // Rows are passed to `transform`/`transform-batch` as borrowed views of the claimed rows:
    // lowering copies them into guest memory directly, without an owned copy per row first.
    ownership: Borrowing { duplicate_if_necessary: true },
});

pub(crate) use sluice::plugin::types;

/// `sluice:plugin@0.1.0`, the first released contract: components built against it keep
/// running.
pub(crate) mod v0_1 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.1.0",
        world: "plugin",
            ownership: Borrowing { duplicate_if_necessary: true },
    });

    pub(crate) use sluice::plugin::types;
}

/// `sluice:plugin@0.2.0`: components built against it keep running.
pub(crate) mod v0_2 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.2.0",
        world: "plugin",
        ownership: Borrowing { duplicate_if_necessary: true },
    });

    pub(crate) use sluice::plugin::types;
}
