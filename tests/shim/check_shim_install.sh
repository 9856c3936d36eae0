#!/bin/sh
# check_shim_install.sh BUILD PREFIX - libllmem-malloc.so exports exactly
# the C allocation functions and C++'s operator new and delete (nothing of
# its private copy of llmem), is installed beside libllmem by
# `cmake --install`, and the installed copy runs a program.
set -eu
build=$1
prefix=$2
rm -rf "$prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
lib=$(ls "$prefix"/lib*/libllmem-malloc.so 2>/dev/null | head -1)
[ -n "$lib" ] || { echo "libllmem-malloc.so not installed under $prefix"; exit 1; }
want="_ZdaPv _ZdaPvRKSt9nothrow_t _ZdaPvSt11align_val_t _ZdaPvSt11align_val_tRKSt9nothrow_t _ZdaPvm _ZdaPvmSt11align_val_t _ZdlPv _ZdlPvRKSt9nothrow_t _ZdlPvSt11align_val_t _ZdlPvSt11align_val_tRKSt9nothrow_t _ZdlPvm _ZdlPvmSt11align_val_t _Znam _ZnamRKSt9nothrow_t _ZnamSt11align_val_t _ZnamSt11align_val_tRKSt9nothrow_t _Znwm _ZnwmRKSt9nothrow_t _ZnwmSt11align_val_t _ZnwmSt11align_val_tRKSt9nothrow_t aligned_alloc calloc free free_aligned_sized free_sized malloc malloc_trim malloc_usable_size memalign posix_memalign pvalloc realloc reallocarray valloc"
got=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWi]$/ {print $3}' | sed "s/@.*//" | LC_ALL=C sort -u | tr '\n' ' ' | sed 's/ $//')
if [ "$got" != "$want" ]; then
    echo "libllmem-malloc.so exports: $got"
    echo "expected:                   $want"
    exit 1
fi
# (coreutils close stderr at exit, so the figures go to a file.)
out=$(printf 'b\na\n' | LD_PRELOAD=$lib LLMEM_MALLOC_STATS=$prefix/stats.txt sort | tr '\n' ' ')
if [ "$out" != "a b " ] || ! grep -q "pool on allocs_total=[1-9]" "$prefix/stats.txt"; then
    echo "the installed shim did not run sort: output '$out', figures: $(cat "$prefix/stats.txt" 2>/dev/null)"
    exit 1
fi
echo "installed $lib: exports the $(echo "$want" | wc -w) allocation functions (C and C++) only, runs programs"
