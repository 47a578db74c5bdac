#!/usr/bin/env python3
"""Compiles the Redis scripts of lua/ into the library.

usage: embed_lua.py OUT.c OUT.h LUA_DIR NAME...
       embed_lua.py --print LUA_DIR NAME

The first form writes OUT.h, the enum capstan_script_t (CAPSTAN_SCRIPT_<NAME> in
the order of the NAME arguments, then CAPSTAN_SCRIPT_COUNT) and the tables'
declarations, and OUT.c, the names, texts and SHA1 digests (what EVALSHA
takes) indexed by that enum. The
NAME list (lua_scripts in lua/meson.build) is the only list of scripts.

A script that needs a shared Lua function says so on a line of its own,
"-- uses: FUNC"; the text of lua/lib/FUNC.lua is put before the script's,
so each embedded script stands alone (Redis runs one text per EVAL). A
lib file says what it needs the same way: each is put in once, after what
it uses. The
second form prints one script as embedded, for tools that load it with
SCRIPT LOAD themselves.
"""
import hashlib
import re
import sys

USES = re.compile(rb'^-- uses: ([a-z_]+)[ \t]*$', re.M)


def script_text(lua_dir: str, name: str) -> bytes:
    with open('%s/%s.lua' % (lua_dir, name), 'rb') as f:
        data = f.read()
    prelude, seen = [], set()

    def need(lib: str) -> None:
        if lib in seen:
            return
        seen.add(lib)
        with open('%s/lib/%s.lua' % (lua_dir, lib), 'rb') as f:
            text = f.read()
        for dep in USES.findall(text):
            need(dep.decode())
        prelude.append(text)

    for lib in USES.findall(data):
        need(lib.decode())
    return b''.join(prelude) + data


def embedded(data: bytes) -> bytes:
    # The bytes c_string's literal holds: each line ends with a newline.
    return (data[:-1] if data.endswith(b'\n') else data) + b'\n'


def c_string(data: bytes) -> str:
    # One C line per Lua line; the split leaves no empty last line because
    # the file's final newline is taken off first.
    if data.endswith(b'\n'):
        data = data[:-1]
    out = []
    for line in data.decode('utf-8').split('\n'):
        esc = line.replace('\\', '\\\\').replace('"', '\\"').replace('\t', '\\t')
        out.append('    "' + esc + '\\n"')
    return '\n'.join(out)


def header(names) -> str:
    parts = ['/* Generated from lua_scripts in lua/meson.build by tools/embed_lua.py;',
             ' * do not edit. */',
             '#ifndef CAPSTAN_LUA_H', '#define CAPSTAN_LUA_H', '',
             '/* The scripts in lua/, compiled into the library. */',
             'typedef enum capstan_script {']
    parts += ['    CAPSTAN_SCRIPT_%s,' % n.upper() for n in names]
    parts += ['    CAPSTAN_SCRIPT_COUNT', '} capstan_script_t;', '',
              '/* Each script\'s name (its file in lua/) and its text. */',
              'extern const char *const capstan__lua_names[CAPSTAN_SCRIPT_COUNT];',
              'extern const char *const capstan__lua_texts[CAPSTAN_SCRIPT_COUNT];',
              '/* Each text\'s SHA1, as Redis names a loaded script. */',
              'extern const char *const capstan__lua_shas[CAPSTAN_SCRIPT_COUNT];', '',
              '#endif']
    return '\n'.join(parts) + '\n'


def source(lua_dir: str, names) -> str:
    parts = ['/* Generated from the lua/ scripts by tools/embed_lua.py; do not edit. */',
             '#include "lua/capstan_lua.h"', '',
             'const char *const capstan__lua_names[CAPSTAN_SCRIPT_COUNT] = {']
    parts += ['    "%s",' % n for n in names]
    parts += ['};', 'const char *const capstan__lua_texts[CAPSTAN_SCRIPT_COUNT] = {']
    parts += [c_string(script_text(lua_dir, n)) + ',' for n in names]
    parts += ['};', 'const char *const capstan__lua_shas[CAPSTAN_SCRIPT_COUNT] = {']
    parts += ['    "%s",' % hashlib.sha1(embedded(script_text(lua_dir, n))).hexdigest() for n in names]
    parts.append('};')
    return '\n'.join(parts) + '\n'


def main() -> int:
    if sys.argv[1] == '--print':
        sys.stdout.buffer.write(script_text(sys.argv[2], sys.argv[3]))
        return 0
    out_c, out_h, lua_dir, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    with open(out_h, 'w') as f:
        f.write(header(names))
    with open(out_c, 'w') as f:
        f.write(source(lua_dir, names))
    return 0


if __name__ == '__main__':
    sys.exit(main())
