#!/bin/sh
# check_symbols.sh LIB.so - the shared library exports llmem_ symbols only:
# every public function, and no internal llmem__ helper or stray symbol.
set -eu
lib="$1"
syms=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sed 's/@.*//' | sort -u)
[ -n "$syms" ] || { echo "no exported symbols in $lib"; exit 1; }
bad=$(printf '%s\n' "$syms" | grep -v '^llmem_' || true)
internal=$(printf '%s\n' "$syms" | grep '^llmem__' || true)
if [ -n "$bad" ] || [ -n "$internal" ]; then
    echo "unexpected exported symbols:"; printf '%s\n' $bad $internal
    exit 1
fi
for must in llmem_status_str llmem_resource_map llmem_arena_alloc llmem_fixed_alloc llmem_exporter_render; do
    printf '%s\n' "$syms" | grep -qx "$must" || { echo "missing export: $must"; exit 1; }
done
echo "$(printf '%s\n' "$syms" | wc -l) symbols exported, all llmem_"
