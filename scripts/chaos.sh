#!/usr/bin/env bash
# The fault-injection harness (scripts/chaos/harness.py): capstan workers
# whose jobs keep a ledger of every start and end, a private master, replica
# and three sentinels (redis-server with appendfsync always; --no-sentinel:
# one redis-server; --shards N: N redis-servers, each a shard of the
# workers' shards: list, and a shard_outage fault), and faults chosen at
# random from a seed; then a check of every job: none lost, each extra run
# explained by a fault and within its bound, each run in its job's shard.
#
#   scripts/chaos.sh --seed 7 --minutes 30       a long run, every fault kind
#   scripts/chaos.sh --seed 7 --shards 3         the same over three shards
#   scripts/chaos.sh --ci                        CI's mode: fixed seeds, every kind, a minute;
#                                                then one shard-mode run (2 shards, 12 s)
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
    status=0
    python3 scripts/chaos/harness.py --build "$build" --seeds 11,12 --seconds 12 --cycle --sentinel \
        --fault-every 1.5 "$@" || status=1
    # Two shards, opening with a shard_outage, then the other kinds in turn.
    python3 scripts/chaos/harness.py --build "$build" --seed 13 --seconds 12 --cycle --shards 2 \
        --fault-every 1.5 "$@" || status=1
    exit "$status"
fi
exec python3 scripts/chaos/harness.py "$@"
