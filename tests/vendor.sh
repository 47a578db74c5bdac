#!/usr/bin/env bash
# The Ruby load path of a vendored Sidekiq for the interop tests: unpacks
# the tarball that holds VERSION (../shared/vendor beside the repository,
# or $CAPSTAN_VENDOR) under DEST once, and prints the RUBYLIB that loads
# it and the libraries it needs ahead of Debian's gems.
#
#   tests/vendor.sh DEST VERSION       VERSION: 7.3.10, 8.0.10 or 8.1.7
#
# Exits 77 with one line on stdout saying why when the tarballs are not
# there (the tests skip with that line), 1 on any other trouble. Several
# test programs may call it at once: each unpacks into a directory of its
# own and renames it into place, and the first rename wins. The directory
# is named after the tarball's checksum, so a new tarball is unpacked anew.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 DEST VERSION" >&2; exit 1; }
dest=$1
version=$2
src=$(cd "$(dirname "$0")/.." && pwd)
vendor=${CAPSTAN_VENDOR:-$src/../shared/vendor}

# 8.0 comes without its libraries: 7.3's tarball holds them. 8.1 brings
# its own, newer ones, and the rack 3 and logger its Web UI and job logger
# need (Debian 12 has rack 2.2 and logger 1.5).
libs=sidekiq-7.3.tar.gz
need="redis-client connection_pool"
case $version in
    7.3.10) tarball=sidekiq-7.3.tar.gz ;;
    8.0.10) tarball=sidekiq-8.0.tar.gz ;;
    8.1.7) tarball=sidekiq-8.1.tar.gz libs=$tarball
           need="$need rack rack-session rackup logger" ;;
    *) echo "$0: no vendored Sidekiq $version (7.3.10, 8.0.10 or 8.1.7)" >&2; exit 1 ;;
esac

for t in $tarball $libs; do
    if [ ! -f "$vendor/$t" ]; then
        echo "Sidekiq $version sources ($t) not found at $vendor (set CAPSTAN_VENDOR): skipped"
        exit 77
    fi
done

# unpack TARBALL: prints the directory it is unpacked in.
unpack() {
    local sum dir tmp
    sum=$(cksum <"$vendor/$1" | cut -d' ' -f1)
    dir=$dest/${1%.tar.gz}-$sum
    if [ ! -d "$dir" ]; then
        mkdir -p "$dest"
        tmp=$(mktemp -d "$dest/.unpack-XXXXXX")
        tar -xzf "$vendor/$1" -C "$tmp"
        # Another caller may have won the race: its copy is the same.
        mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"
    fi
    echo "$dir"
}

main=$(unpack $tarball)
deps=$(unpack $libs)
lib=$main/sidekiq-$version/lib
[ -f "$lib/sidekiq.rb" ] || { echo "$0: $vendor/$tarball holds no sidekiq-$version" >&2; exit 1; }
path=$lib
for d in $need; do
    found=("$deps"/$d-[0-9]*/lib)
    [ -d "${found[0]}" ] || { echo "$0: $vendor/$libs holds no $d" >&2; exit 1; }
    path=$path:${found[0]}
done
echo "$path"
