#!/usr/bin/env bash
# Installs what capstan needs to build, test, fuzz and run its demo, from Debian's
# packages. Does nothing when everything is already there.
set -euo pipefail

pkgs=(build-essential meson ninja-build pkg-config python3
      libhiredis-dev libjansson-dev libyaml-dev libssl-dev libcriterion-dev
      redis-server ruby ruby-sidekiq ruby-activejob prometheus tmux
      zlib1g-dev clang libclang-rt-14-dev systemd tzdata faketime)

missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
