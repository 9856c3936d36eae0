#!/bin/sh
# build_harness.sh - the llama.cpp oracle harness (llamacpp_harness.c),
# compiled against llama.cpp's prebuilt libraries from the npm package.
#
#   tests/oracle/build_harness.sh DIR
#
# Runs scripts/llamacpp.sh DIR (npm install of the pinned packages, the
# headers out of the source bundle), then compiles DIR/llamacpp_harness
# when it is missing or older than its source. Prints the harness's path
# on stdout. Exit 77 (CTest's skip) when llama.cpp cannot be had here.
set -eu
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
DIR=$1
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# One install at a time per folder: the normal and sanitizer builds share it.
mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9
"$ROOT/scripts/llamacpp.sh" "$DIR" || exit $?
. "$DIR/env.sh"
OUT=$DIR/llamacpp_harness
CC=${HARNESS_CC:-cc}
if [ ! -x "$OUT" ] || [ "$HERE/llamacpp_harness.c" -nt "$OUT" ]; then
    # shellcheck disable=SC2086
    $CC -O2 -std=c11 -Wall -Wextra $LLAMACPP_INCLUDE -o "$OUT.tmp" "$HERE/llamacpp_harness.c" \
        -L"$LLAMACPP_LIBDIR" -l:libllama.v0.5.0.so -l:libggml.v0.5.0.so -lggml-base \
        -Wl,-rpath,"$LLAMACPP_LIBDIR" -Wl,--disable-new-dtags
    mv "$OUT.tmp" "$OUT"
fi
echo "$OUT"
