#!/usr/bin/env python3
"""Writes a C file holding every Redis script of lua/ as a string table.

usage: embed_lua.py OUT.c LUA_DIR NAME...
The table order is the order of NAME arguments; redis/scripts.c indexes it
by enum kiq_script, so keep the two lists in the same order.
"""
import sys


def c_string(data: bytes) -> str:
    out = []
    for line in data.decode('utf-8').split('\n'):
        esc = line.replace('\\', '\\\\').replace('"', '\\"').replace('\t', '\\t')
        out.append('    "' + esc + '\\n"')
    return '\n'.join(out)


def main() -> int:
    out, lua_dir, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    parts = ['/* Generated from the lua/ scripts by tools/embed_lua.py; do not edit. */',
             '#include <stddef.h>', '']
    parts.append('const char *const kiq_lua_names[] = {')
    parts += ['    "%s",' % n for n in names]
    parts.append('};')
    parts.append('const char *const kiq_lua_texts[] = {')
    for n in names:
        with open('%s/%s.lua' % (lua_dir, n), 'rb') as f:
            data = f.read()
        if data.endswith(b'\n'):
            data = data[:-1]
        parts.append(c_string(data) + ',')
    parts.append('};')
    parts.append('const size_t kiq_lua_count = %d;' % len(names))
    with open(out, 'w') as f:
        f.write('\n'.join(parts) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
