//! Host bindings generated from `wit/sluice.wit` (world `plugin`).

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
});

pub use sluice::plugin::types;
