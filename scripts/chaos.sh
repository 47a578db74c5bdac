#!/usr/bin/env bash
# The fault-injection harness (scripts/chaos/harness.py): capstan workers
# whose jobs keep a ledger of every start and end, a private master, replica
# and three sentinels (redis-server with appendfsync always; --no-sentinel:
# one redis-server), and faults chosen at random from a seed; then a
# check of every job: none lost, each extra run explained by a fault and
# within its bound.
#
#   scripts/chaos.sh --seed 7 --minutes 30       a long run, every fault kind
#   scripts/chaos.sh --ci                        CI's mode: fixed seeds, every kind, a minute
#   scripts/chaos.sh --help                      every option
#
# Network partitions need root (network namespaces and veth pairs the
# harness makes and removes itself); without it they are left out, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--ci" ]; then
    shift
    build=${CHAOS_BUILD:-build}
    [ -x "$build/capstan" ] && [ -f "$build/tests/libcapstan-ledger.so" ] && [ -x "$build/tests/capstan-chaos-batch" ] || bash scripts/build.sh "$build"
    # Every kind in turn, so that the two short runs inject each one; each
    # opens with one of the two failover kinds.
    exec python3 scripts/chaos/harness.py --build "$build" --seeds 11,12 --seconds 12 --cycle --sentinel \
        --fault-every 1.5 "$@"
fi
exec python3 scripts/chaos/harness.py "$@"
