#!/usr/bin/env bash
# Builds {{name}}.wasm: a WebAssembly component for Sluice, from Python, with the pinned
# componentize-py (installed on first use into ~/.cache/sluice/toolchains; needs python3 >= 3.10).
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=toolchain.sh
. ./toolchain.sh
ensure_componentize_py
componentize-py -d wit -w plugin componentize app -p . -o {{name}}.wasm
echo "built {{name}}.wasm"
