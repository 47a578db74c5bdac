#!/usr/bin/env bash
# What `meson install` gives a user, checked on a copy installed with
# --destdir: the README's two build commands (a plugin and an embedding
# program) work against the installed headers and capstan.pc, every C
# sample of README.md and doc/*.md compiles against them, the installed capstan
# loads the plugin and the installed example plugin and runs their jobs
# with the installed sample config, the installed Ruby batch module finds
# the installed Lua scripts, the man page documents every option
# of every subcommand, the systemd unit passes `systemd-analyze verify`,
# and the Dockerfile's runtime packages and health check match.
# Usage: install.sh BUILD_DIR SOURCE_DIR [B_SANITIZE]. Exits 77 (skipped)
# without a C compiler.
set -euo pipefail
build=$(realpath "$1")
src=$(realpath "$2")
sanitize=${3:-none}
command -v cc >/dev/null || { echo "no C compiler: skipped"; exit 77; }
# meson test points this at the build tree; the installed copy must do
# without it.
unset LD_LIBRARY_PATH
command -v redis-server >/dev/null || { echo "no redis-server: skipped"; exit 77; }

tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# until SECONDS CMD...: runs CMD every 0.1 s until it succeeds.
until_ok() {
    local end=$(( $(date +%s) + $1 )); shift
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$end" ] || return 1
        sleep 0.1
    done
}

D=$tmp/dest
meson install -C "$build" --no-rebuild --destdir "$D" --quiet >/dev/null
pc=$(find "$D" -name capstan.pc | head -1)
[ -n "$pc" ] || fail "no capstan.pc installed"
# pkg-config finds the installed tree as it would under / (its flags get
# the destdir in front).
export PKG_CONFIG_PATH=$(dirname "$pc")
prefix=$(pkg-config --variable=prefix capstan)
libdir=$D$(pkg-config --variable=libdir capstan)
export PKG_CONFIG_SYSROOT_DIR=$D
capstan=$D$prefix/bin/capstan
[ -x "$capstan" ] || fail "no capstan in $D$prefix/bin"

# The library exports the public API alone: every dynamic symbol is
# capstan_, none a module's capstan__ internals.
lib=$(find "$D" -name 'libcapstan.so.*' -type f | head -1)
[ -n "$lib" ] || fail "no libcapstan.so installed"
other=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^capstan_' | grep -v '^_' || true)
[ -z "$other" ] || fail "libcapstan.so exports $other"
! nm -D --defined-only "$lib" | awk '{print $3}' | grep -q '^capstan__' \
    || fail "libcapstan.so exports internals: $(nm -D --defined-only "$lib" | grep ' capstan__' | head -3)"
# The layers run one way: only runtime/ and the supervisor and testing kit
# above it include runtime/'s headers.
files=$(cd "$src" && find . -path ./runtime -prune -o -path ./supervisor -prune -o -path ./testing -prune \
    -o -path ./tests -prune -o -path './build*' -prune -o -name '*.[ch]' -print)
up=$(cd "$src" && grep -l '#include "runtime/' $files || true)
[ -z "$up" ] || fail "outside runtime/, supervisor/ and testing/, these include a runtime/ header: $up"

# The README's handler example and build commands, as a user runs them.
cd "$tmp"
awk '/^## A handler/ {on = 1} on && /^```c$/ {c = 1; next} c && /^```$/ {exit} c' \
    "$src/README.md" > myjobs.c
grep -q capstan_plugin_init myjobs.c || fail "README's handler example not found"
cmd=$(grep -o 'cc -shared -fPIC -o libmyjobs.so myjobs.c \$(pkg-config --cflags capstan)' "$src/README.md" | head -1)
[ -n "$cmd" ] || fail "README lacks the plugin build command"
eval "$cmd" || fail "plugin build: $cmd"
cp "$src/examples/embed.c" main.c
cmd=$(grep -o 'cc -o myworker main.c \$(pkg-config --cflags --libs capstan)' "$src/README.md" | head -1)
[ -n "$cmd" ] || fail "README lacks the embedding build command"
eval "$cmd" 2>cc.err || fail "embedding build: $cmd: $(cat cc.err)"

# Every C sample of the README and doc/ compiles against the installed
# headers, so none can fall behind the API (doc/development.md, "The
# install test", is the convention): a ```c block with an #include line is
# a whole file; any other is a fragment, compiled as the body of a function
# given rt, client and job. #line makes the compiler name the .md line.
mkdir samples
nsamples=0
for md in "$src/README.md" "$src"/doc/*.md; do
    rm -f samples/*
    awk -v dir=samples '
        /^[ \t]*```c[ \t]*$/ { c = 1; f = sprintf("%s/%04d.c", dir, NR + 1); next }
        c && /^[ \t]*```[ \t]*$/ { c = 0; close(f); next }
        c { print > f }' "$md"
    for f in samples/*.c; do
        [ -e "$f" ] || continue
        line=$(basename "$f" .c); line=$((10#$line))
        name=${md#"$src"/}
        where=$name:$line
        if grep -q '^[ \t]*#[ \t]*include' "$f"; then
            { echo "#line $line \"$name\""; cat "$f"; } > sample.c
        else
            { echo '#include <capstan/capstan.h>'
              echo 'int sample(capstan_runtime_t *rt, capstan_client_t *client, capstan_job_t *job);'
              echo 'int sample(capstan_runtime_t *rt, capstan_client_t *client, capstan_job_t *job)'
              echo '{'
              echo "#line $line \"$name\""
              cat "$f"
              echo 'return 0;'
              echo '}'; } > sample.c
        fi
        cc -c -Wall -Werror -o sample.o sample.c $(pkg-config --cflags capstan) 2>cc.err \
            || fail "the C sample at $where does not compile: $(cat cc.err)"
        nsamples=$((nsamples + 1))
    done
done
[ "$nsamples" -gt 0 ] || fail "no C sample found in README.md or doc/"

# After ldconfig (README), the installed libcapstan is found; here the
# destdir's copy stands in for it. A sanitized libcapstan needs its runtimes
# loaded first by a program built without them.
myworker() {
    local pre=""
    [ "$sanitize" = none ] || pre="$(cc -print-file-name=libasan.so) $(cc -print-file-name=libubsan.so)"
    LD_PRELOAD=$pre LD_LIBRARY_PATH=$libdir ./myworker "$@"
}
[ "$(myworker version)" = "$("$capstan" version)" ] || fail "myworker version"

# A private Redis, the installed sample config (pointing into the destdir),
# the installed capstan with the README's plugin.
redis-server --port 0 --unixsocket "$tmp/redis.sock" --save '' --appendonly no >/dev/null &
pids+=($!)
until_ok 10 redis-cli -s "$tmp/redis.sock" ping || fail "redis-server did not start"
export REDIS_URL="unix://$tmp/redis.sock"
conf=$(find "$D" -path '*/capstan/capstan.yml' | head -1)
[ -n "$conf" ] || fail "no sample config installed"
sed "s|$prefix/|$D$prefix/|g" "$conf" > capstan.yml
sed -i 's/^poll_interval_average:.*//; $a poll_interval_average: 1' capstan.yml
# A free metrics port: the Dockerfile's may be taken on this machine.
mport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$capstan" run -C capstan.yml -r ./libmyjobs.so --metrics-port "$mport" > capstan.log 2>&1 &
pids+=($!)
"$capstan" push HardJob '["bob"]' >/dev/null
"$capstan" push FailJob '["from the installed example plugin"]' >/dev/null
myworker push HardJob '["ann"]' >/dev/null
hello() { [ "$(redis-cli -s "$tmp/redis.sock" get "hello:$1")" = 1 ]; }
until_ok 20 hello bob || fail "the plugin's job did not run: $(cat capstan.log)"
until_ok 20 hello ann || fail "the job myworker pushed did not run: $(cat capstan.log)"
retried() { [ "$(redis-cli -s "$tmp/redis.sock" zcard retry)" = 1 ]; }
until_ok 20 retried || fail "the example plugin's FailJob did not fail into retry: $(cat capstan.log)"
# The installed Ruby batch module reads the Lua scripts installed beside it
# (never CAPSTAN_LUA_DIR's): a batch made from Ruby, run by capstan.
rb=$(find "$D" -path '*/share/capstan/ruby/capstan_batch.rb' | head -1)
[ -n "$rb" ] || fail "no Ruby batch module installed in share/capstan/ruby"
[ -f "$(dirname "$(dirname "$rb")")/lua/lib/batch_done.lua" ] || fail "no Lua scripts installed in share/capstan/lua"
if command -v ruby >/dev/null && ruby -e 'require "sidekiq"' 2>/dev/null; then
    out=$(CAPSTAN_LUA_DIR=/nonexistent ruby -e '
        require ARGV[0]
        batch = Capstan::Batch.new(description: "installed")
        batch.jobs { Sidekiq::Client.push("class" => "HardJob", "args" => ["batch"]) }
        puts Capstan::Batch.lua_dir, batch.bid' "$rb" 2>rb.err) || fail "the installed Ruby batch module: $(cat rb.err)"
    [ "$(head -1 <<<"$out")" = "$(dirname "$(dirname "$rb")")/lua" ] || fail "the installed Ruby batch module read $out"
    bid=$(tail -1 <<<"$out")
    batch_done() { [ "$(redis-cli -s "$tmp/redis.sock" hget "batch:$bid" pending)" = 0 ]; }
    until_ok 20 batch_done || fail "the batch made from Ruby did not finish: $(cat capstan.log)"
else
    echo "ruby-sidekiq is not installed: the Ruby batch module was not run"
fi
# The Ruby shard router installed beside it loads and picks as capstan does.
[ -f "$(dirname "$rb")/capstan_shards.rb" ] || fail "no Ruby shard module installed in share/capstan/ruby"
if command -v ruby >/dev/null && ruby -e 'require "sidekiq"' 2>/dev/null; then
    ruby -e 'require ARGV[0]; exit(Capstan::Shards.respond_to?(:pick) ? 0 : 1)' "$(dirname "$rb")/capstan_shards.rb" \
        2>rb.err || fail "the installed Ruby shard module: $(cat rb.err)"
fi
# The Dockerfile's health check, as it runs it, asking the port its CMD
# serves (here on mport).
hc=$(sed -n 's/^HEALTHCHECK.*CMD \["capstan", \(.*\)\]$/\1/p' "$src/examples/Dockerfile" | tr -d '",')
[ -n "$hc" ] || fail "no HEALTHCHECK in examples/Dockerfile"
cport=$(sed -n 's/^CMD \[.*"--metrics-port", "\([0-9]*\)".*/\1/p' "$src/examples/Dockerfile")
[ -n "$cport" ] && grep -q -- "--port $cport\b" <<<"$hc" || fail "the HEALTHCHECK ($hc) does not ask the CMD's metrics port (${cport:-none})"
hc=${hc/--port $cport/--port $mport}
until_ok 20 "$capstan" $hc || fail "health check capstan $hc failed: $("$capstan" $hc 2>&1); $(cat capstan.log)"

# The Kubernetes example, checked by structure (kubectl --dry-run=client
# needs a cluster): probes on /livez and /readyz, a preStop, and a grace
# period above capstan's timeout.
if command -v ruby >/dev/null; then
    ruby -ryaml -e '
        docs = YAML.load_stream(File.read(ARGV[0]))
        conf = YAML.safe_load(docs.find { |d| d["kind"] == "ConfigMap" }["data"]["capstan.yml"])
        pod = docs.find { |d| d["kind"] == "Deployment" }["spec"]["template"]["spec"]
        c = pod["containers"][0]
        abort "livenessProbe is not /livez" unless c.dig("livenessProbe", "httpGet", "path") == "/livez"
        abort "readinessProbe is not /readyz" unless c.dig("readinessProbe", "httpGet", "path") == "/readyz"
        abort "no preStop" unless c.dig("lifecycle", "preStop", "exec", "command")
        abort "grace not above timeout" unless pod["terminationGracePeriodSeconds"] > conf["timeout"]
        abort "no metrics_port" unless conf["metrics_port"]
    ' "$src/examples/kubernetes.yml" || fail "examples/kubernetes.yml"
fi

# Every library the installed capstan links comes from a package the
# Dockerfile's runtime stage installs (libc and libgcc are in the base
# image; the sanitizers' runtimes are only in a sanitized build).
for lib in $(ldd "$capstan" | awk '$3 ~ /^\// {print $3}'); do
    b=$(basename "$lib")
    case $b in libc.so*|libm.so*|libdl.so*|libpthread.so*|libgcc_s.so*|libstdc++.so*|libasan.so*|libubsan.so*) continue ;; esac
    found=0
    for p in $(dpkg -S "*/$b" 2>/dev/null | cut -d: -f1 | tr ',' ' '); do
        grep -qw -- "$p" "$src/examples/Dockerfile" && found=1
    done
    [ $found = 1 ] || fail "examples/Dockerfile installs no package providing $b"
done

# The man page: every subcommand, and every long option each one's --help
# lists.
man=$(find "$D" -name capstan.1 | head -1)
[ -n "$man" ] || fail "no man page installed"
if command -v man >/dev/null; then
    text=$(LC_ALL=C MANWIDTH=200 man -l "$man" 2>/dev/null)
    for c in run push stats locks lock limits top probe version; do
        grep -q "^   $c\b\|^  *$c\b" <<<"$text" || fail "the man page has no $c section"
        for o in $("$capstan" "$c" --help 2>&1 | grep -o -- '--[a-z][a-z-]*' | sort -u); do
            grep -q -- "$o" <<<"$text" || fail "the man page lacks $c's $o"
        done
    done
else
    echo "man is not installed: the man page's contents were not checked"
fi

# The unit, with its paths moved into the destdir, as systemd would load
# it (MANPATH lets verify find the man page its Documentation= names).
unit=$(find "$D" -name capstan.service | head -1)
[ -n "$unit" ] || fail "no systemd unit installed"
grep -q "^ExecStart=$prefix/bin/capstan run -C .*/capstan/capstan.yml$" "$unit" || fail "ExecStart: $(grep ExecStart "$unit")"
if command -v systemd-analyze >/dev/null; then
    sed "s|$prefix/|$D$prefix/|g" "$unit" > capstan.service
    MANPATH=$(dirname "$(dirname "$man")") systemd-analyze verify ./capstan.service \
        || fail "systemd-analyze verify"
else
    echo "systemd-analyze is not installed: the unit was not verified"
fi
echo "ok"
