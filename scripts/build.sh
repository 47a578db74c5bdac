#!/usr/bin/env bash
# Configures (once) and builds kiq in DIR (default build/) with warnings as
# errors. Extra arguments go to `meson setup`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" -Dwerror=true "$@" >/dev/null
fi
ninja -C "$dir" >/dev/null
