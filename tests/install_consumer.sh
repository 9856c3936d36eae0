#!/bin/sh
# install_consumer.sh BUILD_DIR CONSUMER_SRC WORK_DIR - install the built
# tree into WORK_DIR/prefix, then build and run a tiny consumer against it
# twice: through find_package(llmem) (shared and static targets) and
# through pkg-config.
set -eu
build="$1"; src="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null

cmake -S "$src" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake" >/dev/null
LD_LIBRARY_PATH="$prefix/lib" "$work/cmake/consumer_shared"
"$work/cmake/consumer_static"

libdir=$(ls -d "$prefix"/lib*/pkgconfig | head -1)
export PKG_CONFIG_PATH="$libdir"
cc -std=c11 -Wall -Werror "$src/main.c" -o "$work/consumer_pc" $(pkg-config --cflags --libs llmem)
LD_LIBRARY_PATH="$(dirname "$libdir")" "$work/consumer_pc"
cc -std=c11 -Wall -Werror "$src/main.c" -o "$work/consumer_pc_static" \
    $(pkg-config --cflags llmem) "$(dirname "$libdir")/libllmem.a" $(pkg-config --libs-only-other --static llmem) \
    -lcjson -lmicrohttpd -lpcre2-8 -lpthread -ldl -lm
"$work/consumer_pc_static"
echo "install consumer: find_package and pkg-config builds ran"
