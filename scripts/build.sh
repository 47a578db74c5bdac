#!/usr/bin/env bash
# Configures (once) and builds capstan in DIR (default build/) with warnings as
# errors. Extra arguments go to `meson setup`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Quiet when it works; the whole output when it does not.
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" -Dwerror=true "$@" >"$log" 2>&1 || { cat "$log"; exit 1; }
fi
ninja -C "$dir" >"$log" 2>&1 || { cat "$log"; exit 1; }
