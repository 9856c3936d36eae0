#!/bin/sh
# deps.sh GROUP... - install the Debian packages a make target needs, only
# those missing, quietly when nothing is. Groups: build, test, bench, fuzz.
# Runs apt-get as root (directly, or through sudo when not root).
set -eu

pkgs_build="cmake make gcc g++ libc6-dev pkgconf binutils libcjson-dev libmicrohttpd-dev libpcre2-dev"
pkgs_test="libcmocka-dev libnuma1 sqlite3 curl python3" # sqlite3: tests/shim/programs.sh; curl: tests/serve_*.sh; python3: tests/serve_chatml.sh
pkgs_render="chromium python3 fonts-dejavu-core" # the timeline page rendered headless (tests/timeline_render.sh)
# llama.cpp from the npm registry for test_oracle and engine_bench -L
# (scripts/llamacpp.sh). Debian's npm only where no npm is on PATH: a
# Node.js from elsewhere (nodesource) ships its own and conflicts with it.
pkgs_oracle="git"
command -v npm >/dev/null 2>&1 || pkgs_oracle="$pkgs_oracle npm"
pkgs_bench="libjemalloc2 libmimalloc2.0 libtcmalloc-minimal4"
# bench/programs.sh: real programs under each allocator
pkgs_bench="$pkgs_bench redis-server redis-tools libpython3.11-testsuite sqlite3 python3"
# clang's sanitizer and libFuzzer runtimes and headers (sanitizer/*.h) are
# in libclang-rt-14-dev, only a Recommends of clang on Debian 12 (and
# apt-get runs with --no-install-recommends below).
pkgs_fuzz="clang libclang-rt-14-dev"

want=""
for g in "$@"; do
    case "$g" in
        build) want="$want $pkgs_build" ;;
        test) want="$want $pkgs_build $pkgs_test $pkgs_render $pkgs_oracle" ;;
        bench) want="$want $pkgs_build $pkgs_bench $pkgs_oracle time" ;;
        fuzz) want="$want $pkgs_build $pkgs_test $pkgs_fuzz" ;;
        *) echo "deps.sh: unknown group '$g' (build, test, bench, fuzz)" >&2; exit 2 ;;
    esac
done

missing=""
for p in $want; do
    case " $missing " in *" $p "*) continue ;; esac
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

echo "llmem: installing Debian packages:$missing"
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "llmem: missing packages:$missing; run as root: apt-get install$missing" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
