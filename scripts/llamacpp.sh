#!/bin/sh
# llamacpp.sh - llama.cpp as a peer and an oracle, from the pinned npm
# packages, into a folder of the build tree (never committed, never global).
#
#   scripts/llamacpp.sh DIR
#
# Installs node-llama-cpp@3.22.1 and @node-llama-cpp/linux-x64@3.22.1 with
# `npm install --ignore-scripts` (nothing of theirs runs) into DIR, takes
# the public C headers (include/ and ggml/include/) out of the source
# bundle node-llama-cpp ships (llama/gitRelease.bundle, a git bundle of the
# llama.cpp release its prebuilt libraries were built from), and writes
# DIR/env.sh, which sets
#
#   LLAMACPP_INCLUDE  -I flags for llama.h and ggml.h
#   LLAMACPP_LIBDIR   the folder of libllama / libggml* (the CPU backend
#                     variants are loaded from there at run time)
#
# Nothing here compiles llama.cpp: its code is only ever linked, as
# shipped. A second run with everything in place does nothing. Exit 77
# (CTest's skip) when npm, git or the registry is not available, with the
# reason on stderr; any other failure is 1.
set -eu
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
DIR=$1
NLC=node-llama-cpp@3.22.1
BIN=@node-llama-cpp/linux-x64@3.22.1
LIBDIR=$DIR/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
BUNDLE=$DIR/node_modules/node-llama-cpp/llama/gitRelease.bundle
skip() { echo "llamacpp.sh: SKIP: $*" >&2; exit 77; }

case $(uname -sm) in "Linux x86_64") ;; *) skip "the prebuilt llama.cpp package is linux-x64 only" ;; esac
if [ -f "$DIR/env.sh" ] && [ -f "$LIBDIR/libllama.v0.5.0.so" ] && [ -f "$DIR/include/llama.h" ]; then
    exit 0
fi
command -v npm >/dev/null 2>&1 || skip "npm is not installed (Debian: npm)"
command -v git >/dev/null 2>&1 || skip "git is not installed"
mkdir -p "$DIR"
# A package.json of our own so npm installs here and not in a parent
# folder's project; the linux-x64 package is named explicitly because the
# lock of node-llama-cpp's optional dependencies may refuse the others.
[ -f "$DIR/package.json" ] || printf '{"name":"llmem-llamacpp-oracle","private":true}\n' >"$DIR/package.json"
if [ ! -f "$LIBDIR/libllama.v0.5.0.so" ] || [ ! -f "$BUNDLE" ]; then
    if ! (cd "$DIR" && npm install --ignore-scripts --no-audit --no-fund --no-save --loglevel=error "$NLC" "$BIN") \
        >"$DIR/npm.log" 2>&1; then
        tail -5 "$DIR/npm.log" >&2
        skip "npm install $NLC $BIN failed (no registry?): see $DIR/npm.log"
    fi
fi
[ -f "$LIBDIR/libllama.v0.5.0.so" ] || { echo "llamacpp.sh: $LIBDIR/libllama.v0.5.0.so missing after install" >&2; exit 1; }
[ -f "$BUNDLE" ] || { echo "llamacpp.sh: $BUNDLE missing after install" >&2; exit 1; }

# The headers of the release the libraries were built from.
rm -rf "$DIR/src.git" "$DIR/include.tmp"
git init -q --bare "$DIR/src.git"
git -C "$DIR/src.git" fetch -q "$(cd "$(dirname "$BUNDLE")" && pwd)/gitRelease.bundle" HEAD
mkdir -p "$DIR/include.tmp"
git -C "$DIR/src.git" archive FETCH_HEAD include ggml/include | tar -x -C "$DIR/include.tmp"
git -C "$DIR/src.git" rev-parse FETCH_HEAD >"$DIR/include.tmp/COMMIT"
rm -rf "$DIR/src.git" "$DIR/include"
mkdir -p "$DIR/include"
cp "$DIR/include.tmp/include/"*.h "$DIR/include.tmp/ggml/include/"*.h "$DIR/include.tmp/COMMIT" "$DIR/include/"
rm -rf "$DIR/include.tmp"
ABS=$(cd "$DIR" && pwd)
cat >"$DIR/env.sh" <<ENV
LLAMACPP_INCLUDE="-I$ABS/include"
LLAMACPP_LIBDIR="$ABS/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
ENV
echo "llamacpp.sh: llama.cpp $(cat "$DIR/include/COMMIT") (npm $NLC, $BIN) in $ABS" >&2
