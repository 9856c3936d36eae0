#!/bin/sh
# run_oracle.sh - CTest's entry to the llama.cpp oracle test: build the
# harness (installing the pinned npm packages into DIR the first time),
# then run test_oracle with it. Exit 77 (skip) when llama.cpp cannot be
# had here; the reason is on stderr.
#
#   tests/oracle/run_oracle.sh DIR TEST_ORACLE_BINARY
set -eu
[ $# -eq 2 ] || { echo "usage: $0 DIR TEST_ORACLE" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
rc=0
H=$("$HERE/build_harness.sh" "$1") || rc=$?
if [ $rc -ne 0 ]; then
    [ $rc -eq 77 ] && echo "test_oracle: SKIPPED: llama.cpp is not available here" >&2
    exit $rc
fi
. "$1/env.sh"
LLMEM_LLAMACPP_HARNESS=$H LLAMACPP_LIBDIR=$LLAMACPP_LIBDIR exec "$2"
