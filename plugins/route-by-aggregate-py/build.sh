#!/usr/bin/env bash
# Builds route_by_aggregate.wasm with the pinned componentize-py (installed on first use).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=scripts/plugin-toolchains.sh
. "$REPO/scripts/plugin-toolchains.sh"
ensure_componentize_py
OUT="$(realpath -m "${1:-$HERE/route_by_aggregate.wasm}")"
cd "$HERE"
componentize-py -d "$REPO/wit" -w plugin componentize app \
    -p "$HERE" -p "$REPO/plugins/sdk-python" -o "$OUT"
