//! Host bindings generated from `wit/sluice.wit` (world `plugin`).

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
});

pub use exports::sluice::plugin::transformer;
pub use sluice::plugin::types;
