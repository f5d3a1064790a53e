#!/usr/bin/env bash
# Builds route_by_aggregate.wasm (QuickJS) with the pinned componentize-qjs, installed on first
# use: `build.sh [OUT]`. `build.sh --spidermonkey [OUT]` builds it with componentize-js
# instead (measured in docs/plugin-languages.md; not the supported path).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=scripts/plugin-toolchains.sh
. "$REPO/scripts/plugin-toolchains.sh"
if [ "${1:-}" = "--spidermonkey" ]; then
    out="$(realpath -m "${2:-$HERE/route_by_aggregate_sm.wasm}")"
    ensure_componentize_js
    # componentize-js reads only files under its working directory: run it from plugins/ so
    # ../sdk-js resolves. -d http fetch-event: without it the component imports wasi:http,
    # which Sluice refuses.
    cd "$HERE/.."
    componentize-js "$(basename "$HERE")/plugin.js" -w "$REPO/wit" -n plugin \
        -d http fetch-event -o "$out"
else
    out="$(realpath -m "${1:-$HERE/route_by_aggregate.wasm}")"
    ensure_componentize_qjs
    # --sync: Sluice calls plugins without component-model async.
    # --module-root ..: the SDK is imported from ../sdk-js.
    cd "$HERE"
    componentize-qjs --wit "$REPO/wit" --world plugin --sync --module-root "$HERE/.." \
        --js plugin.js -o "$out"
fi
