#!/usr/bin/env bash
# The demo: builds capstan, starts a private redis-server unless REDIS_URL is
# set, pushes a few example jobs and runs a worker on them until Ctrl-C
# (or for DEMO_SECONDS seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh build

tmp=$(mktemp -d)
redis_pid=""
cleanup() {
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

if [ -z "${REDIS_URL:-}" ]; then
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    # In a session of its own: Ctrl-C reaches the worker alone, which
    # still needs Redis to put its jobs back as it stops.
    setsid redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$tmp" --logfile "$tmp/redis.log" &
    redis_pid=$!
    export REDIS_URL="redis://127.0.0.1:$port/0"
    for _ in $(seq 100); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && break
        sleep 0.05
    done
    echo "started a private redis-server at $REDIS_URL"
fi

capstan=build/capstan
echo "pushing example jobs"
# -q default: the example classes have no queue of their own, which push
# would warn about.
for i in 1 2 3; do $capstan push NoopJob "[$i]" -q default >/dev/null; done
$capstan push SleepJob '[1500]' -q default >/dev/null
$capstan push RecordJob '["demo:records"]' -q critical >/dev/null
$capstan push FailJob '["this one fails and is retried"]' --retry 1 -q default >/dev/null
$capstan push RecordJob '["demo:records"]' --in 3 -q default >/dev/null
$capstan push NoSuchJob '[]' --retry false -q default >/dev/null

echo "running: $capstan run -C examples/capstan.yml (Ctrl-C to stop)"
if [ -n "${DEMO_SECONDS:-}" ]; then
    $capstan run -C examples/capstan.yml --redis-url "$REDIS_URL" &
    worker=$!
    sleep "$DEMO_SECONDS"
    kill -TERM "$worker"
    wait "$worker"
    $capstan stats --redis-url "$REDIS_URL" || true
else
    $capstan run -C examples/capstan.yml --redis-url "$REDIS_URL"
fi
