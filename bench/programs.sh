#!/bin/sh
# programs.sh [--rounds N] [--only redis,gcc,python,sqlite] [--json FILE] ...
# Real programs from Debian (redis-server, gcc, python3's own tests,
# sqlite3) under glibc, jemalloc, mimalloc, tcmalloc and llmem's
# libllmem-malloc.so, side by side: wall time and peak RSS, medians of
# interleaved rounds, a markdown table on stdout (progress on stderr).
# Every program's results are checked against glibc's. See programs.py.
#
# Builds build/libllmem-malloc.so first (BUILD=dir to use another build
# folder) and installs the Debian packages of the bench group. Run it
# under the bench lock on a shared machine:
#   flock /work/bench.lock bench/programs.sh --rounds 5
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${BUILD:-$root/build}
"$root/scripts/deps.sh" bench
cmake -S "$root" -B "$build" >/dev/null
cmake --build "$build" --target llmem_malloc -j2 >/dev/null
work=$build/bench-programs
mkdir -p "$work"
cc -O2 -shared -fPIC -fvisibility=hidden -o "$work/libglibc-malloc.so" "$here/glibc_malloc.c" -ldl
exec /usr/bin/python3 "$here/programs.py" --shim "$build/libllmem-malloc.so" \
    --glibc-preload "$work/libglibc-malloc.so" --source "$root" --work "$work" "$@"
