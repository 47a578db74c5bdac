#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer (build-fuzz/), then runs each for SECONDS
# (default 60), one after the other, and prints libFuzzer's final line per
# target (runs, coverage, features). Exits non-zero when a target finds a
# crash, a leak, undefined behaviour or a broken invariant; the input is
# kept in build-fuzz/artifacts/ (replay it: build-fuzz/fuzz/fuzz_NAME FILE).
#
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(payload yaml url labels)
dir=build-fuzz

bash scripts/deps.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if [ ! -f "$dir/build.ninja" ]; then
    CC=clang meson setup "$dir" -Dwerror=true -Dfuzz=true -Dtests=false \
        -Db_sanitize=address,undefined -Db_lundef=false >"$log" 2>&1 || { cat "$log"; exit 1; }
fi
ninja -C "$dir" "${targets[@]/#/fuzz/fuzz_}" >"$log" 2>&1 || { cat "$log"; exit 1; }

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
mkdir -p "$dir/artifacts" "$dir/fuzz-logs"
status=0
for t in "${targets[@]}"; do
    # New inputs go to a corpus under build-fuzz/, so fuzz/corpus/ keeps
    # only the seeds and later runs start from what earlier ones found.
    corpus="$dir/corpus/$t"
    mkdir -p "$corpus"
    out="$dir/fuzz-logs/$t.log"
    rc=0
    "$dir/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=25 -max_len=4096 \
        -artifact_prefix="$dir/artifacts/$t-" -print_final_stats=1 \
        "$corpus" "fuzz/corpus/$t" >"$out" 2>&1 || rc=$?
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$out" | tail -n 1 || true)
    if [ "$rc" -eq 0 ] && [ -n "$done_line" ]; then
        printf '%-8s %s\n' "$t" "$(echo "$done_line" | tr -s '[:space:]' ' ')"
    else
        status=1
        echo "$t: FAILED (exit $rc); the end of $out:"
        tail -n 60 "$out"
    fi
done
exit "$status"
