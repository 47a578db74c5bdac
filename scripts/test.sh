#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs dependencies, builds with
# -Werror, runs every test against private redis-servers (and real Ruby
# Sidekiq), then builds again with AddressSanitizer + UndefinedBehavior-
# Sanitizer and runs the suite once more.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh

total_pass=0
total_fail=0

run_suite() {
    local dir=$1 label=$2
    echo "== $label"
    local rc=0
    meson test -C "$dir" --print-errorlogs --num-processes 2 || rc=$?
    # Count Criterion's test cases from meson's per-program TAP results.
    local p f
    p=$(grep -cE '^ok ' "$dir/meson-logs/testlog.txt" 2>/dev/null || true)
    f=$(grep -cE '^not ok ' "$dir/meson-logs/testlog.txt" 2>/dev/null || true)
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
    [ "$rc" -eq 0 ] || total_fail=$((total_fail > 0 ? total_fail : 1))
    # meson shows a failing program's stderr only; the failed case's own
    # assertion message is in its TAP output.
    if [ "$rc" -ne 0 ]; then
        echo "== failed test cases ($label)"
        awk '/^not ok /{show=1; print; next} show && /^  /{print; next} {show=0}' \
            "$dir/meson-logs/testlog.txt" 2>/dev/null | head -c 20000 || true
    fi
    return "$rc"
}

status=0
bash scripts/build.sh build
run_suite build "tests" || status=1

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
bash scripts/build.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug
run_suite build-asan "tests under ASan+UBSan" || status=1

echo "tests: $total_pass passed, $total_fail failed"
exit "$status"
