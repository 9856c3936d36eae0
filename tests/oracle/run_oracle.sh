#!/bin/sh
# run_oracle.sh - CTest's entry to the llama.cpp oracle test: build the
# harness (installing the pinned npm packages into DIR the first time),
# then run test_oracle with it. Exit 77 (skip) when llama.cpp cannot be
# had here; the reason is on stderr.
#
#   tests/oracle/run_oracle.sh DIR TEST_ORACLE_BINARY [--shared]
set -eu
[ $# -ge 2 ] || { echo "usage: $0 DIR TEST_ORACLE [ARGS...]" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$1
ORACLE=$2
shift 2
rc=0
H=$("$HERE/build_harness.sh" "$DIR") || rc=$?
if [ $rc -ne 0 ]; then
    [ $rc -eq 77 ] && echo "skipped: test_oracle: llama.cpp is not available here (npm, or the registry)"
    exit $rc
fi
. "$DIR/env.sh"
LLMEM_LLAMACPP_HARNESS=$H LLAMACPP_LIBDIR=$LLAMACPP_LIBDIR exec "$ORACLE" "$@"
