#!/usr/bin/env bash
# Builds {{name}}.wasm: a WebAssembly component for Sluice, from JavaScript (QuickJS), with
# the pinned componentize-qjs (installed on first use into ~/.cache/sluice/toolchains; needs
# Node.js >= 18 and npm).
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=toolchain.sh
. ./toolchain.sh
ensure_componentize_qjs
# --sync: Sluice calls plugins without component-model async.
componentize-qjs --wit wit --world plugin --sync --js plugin.js -o {{name}}.wasm
echo "built {{name}}.wasm"
