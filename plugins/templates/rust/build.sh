#!/usr/bin/env bash
# Builds {{name}}.wasm: a WebAssembly component for Sluice, from Rust (wasm32-wasip2).
set -euo pipefail
cd "$(dirname "$0")"
rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
cargo build --release --target wasm32-wasip2
cp "${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/{{name_snake}}.wasm" {{name}}.wasm
echo "built {{name}}.wasm"
