#!/usr/bin/env bash
# Creates a plugin project from a template, exactly as `sluice plugin new NAME --lang LANG`
# is to do (this script is that command's specification until it exists):
#
#   plugins/templates/new.sh NAME rust|python|js DEST
#
# DEST (must not exist yet) receives:
#   - every file of plugins/templates/LANG/, with {{name}} replaced by NAME and {{name_snake}}
#     by NAME with '-' turned into '_' (in contents; no file name holds a placeholder);
#   - common/rows.jsonl and common/expected.jsonl (the same rows and output in every
#     language);
#   - wit/sluice.wit, the contract;
#   - the language's SDK: rust -> vendor/sluice-plugin-sdk/src/lib.rs (plugins/sdk/src/lib.rs,
#     whose bindings path ../../wit then points at DEST/wit), python -> sluice_plugin/
#     (plugins/sdk-python/sluice_plugin), js -> sluice-plugin.js (plugins/sdk-js);
#   - python and js: toolchain.sh, a copy of scripts/plugin-toolchains.sh (the pinned
#     toolchain installer their build.sh sources).
# NAME: lowercase letters, digits and '-', starting with a letter (a valid crate name and a
# readable file name).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"

usage() { printf 'usage: %s NAME rust|python|js DEST\n' "$0" >&2; exit 2; }
[ $# -eq 3 ] || usage
name="$1" lang="$2" dest="$3"
[[ "$name" =~ ^[a-z][a-z0-9-]*$ ]] \
    || { printf 'error: plugin name %q: use lowercase letters, digits and -, starting with a letter\n' "$name" >&2; exit 2; }
case "$lang" in rust | python | js) ;; *) usage ;; esac
[ ! -e "$dest" ] || { printf 'error: %s already exists\n' "$dest" >&2; exit 1; }

name_snake="${name//-/_}"
mkdir -p "$dest"
(cd "$HERE/$lang" && find . -type f) | while read -r file; do
    mkdir -p "$dest/$(dirname "$file")"
    sed -e "s/{{name}}/$name/g" -e "s/{{name_snake}}/$name_snake/g" \
        "$HERE/$lang/$file" >"$dest/$file"
    [ ! -x "$HERE/$lang/$file" ] || chmod +x "$dest/$file"
done
cp "$HERE/common/rows.jsonl" "$HERE/common/expected.jsonl" "$dest/"
mkdir -p "$dest/wit"
cp "$REPO/wit/sluice.wit" "$dest/wit/"
case "$lang" in
    rust)
        mkdir -p "$dest/vendor/sluice-plugin-sdk/src"
        cp "$REPO/plugins/sdk/src/lib.rs" "$dest/vendor/sluice-plugin-sdk/src/"
        ;;
    python)
        mkdir -p "$dest/sluice_plugin"
        cp "$REPO/plugins/sdk-python/sluice_plugin/__init__.py" "$dest/sluice_plugin/"
        cp "$REPO/scripts/plugin-toolchains.sh" "$dest/toolchain.sh"
        ;;
    js)
        cp "$REPO/plugins/sdk-js/sluice-plugin.js" "$dest/"
        cp "$REPO/scripts/plugin-toolchains.sh" "$dest/toolchain.sh"
        ;;
esac
printf 'created %s (%s plugin %s); next: see %s/README.md\n' "$dest" "$lang" "$name" "$dest"
