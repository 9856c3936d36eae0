#!/bin/sh
# engine_table.sh - the engine benchmark table of docs/BENCHMARKS.md: llmem
# against llama.cpp (bench/engine_bench.sh -L) on synthetic models of the
# shapes people run, every weight type of the table, short and long
# prompts, 1 and 4 sequences at once, 2 threads.
#
#   bench/engine_table.sh [-r ROUNDS] [-m MODELS] [-s SEQS_LIST] [-p PROMPTS] [-k KV]
#
#   -r ROUNDS   interleaved rounds per row (default 5)
#   -m MODELS   space-separated NAME-TYPE list (default: tiny-15m in f32 f16
#               q8_0 q4_0 q4_k q6_k, yi-coder-1.5b in q8_0 q4_0 q4_k q6_k,
#               the table); NAME is a
#               llmem synth shape, or stories260K: the shared folder's
#               trained model ($LLMEM_SHARED_DIR or ../shared), converted by
#               llmem quantize to TYPE; NAME@ARCH (tiny-15m@qwen2-q8_0) writes
#               that architecture (llmem synth --arch ARCH)
#   -s SEQS     sequence counts (default "1 4")
#   -p PROMPTS  "short", "long" or both (default "short long")
#   -k KV       the KV cache type of both engines, f16 (default: llama.cpp's
#               own default) or f32: llmem --kv-dtype KV, llama.cpp's
#               LLAMACPP_KV. The peak RSS ratio compares like with like only
#               at one type: at f32 against f16 llmem's cache is twice
#               llama.cpp's (docs/BENCHMARKS.md, 2026-12-06)
#
# Models are written once by llmem synth into BENCH_DIR (default
# build-bench; yi-coder-1.5b q8_0 is 1.57 GB). Decode length: 128 positions
# after the prompt for tiny-15m, 32 for yi-coder-1.5b (GEN=N: N for every
# model, to bound a run on a busy machine). Each row is its own
# engine_bench.sh run, under flock /work/bench.lock when that file exists
# (the machine may be shared), so no two benchmarks overlap; with
# BENCH_LOCKED=1 the caller holds that lock for the whole table instead.
# Prints one markdown row per (model, prompt, sequences): llmem's and
# llama.cpp's prefill and decode tok/s, the ratios llmem / llama.cpp and
# the peak RSS ratio.
set -eu
ROUNDS=5
MODELS="tiny-15m-f32 tiny-15m-f16 tiny-15m-q8_0 tiny-15m-q4_0 tiny-15m-q4_k tiny-15m-q6_k yi-coder-1.5b-q8_0 yi-coder-1.5b-q4_0 yi-coder-1.5b-q4_k yi-coder-1.5b-q6_k"
SEQS_LIST="1 4"
PROMPTS="short long"
KV=f16
while getopts r:m:s:p:k: opt; do
    case $opt in
    r) ROUNDS=$OPTARG ;;
    m) MODELS=$OPTARG ;;
    s) SEQS_LIST=$OPTARG ;;
    p) PROMPTS=$OPTARG ;;
    k) KV=$OPTARG ;;
    *) echo "usage: $0 [-r ROUNDS] [-m MODELS] [-s SEQS] [-p PROMPTS] [-k KV]" >&2; exit 2 ;;
    esac
done
LLMEM=${LLMEM:-build/llmem}
DIR=${BENCH_DIR:-build-bench}
export LLMEM THREADS=${THREADS:-2}
# The weights faulted in at open and the prompt run once before the timed
# prefill (--populate --warmup), as llama.cpp is timed in its second, warm
# round: the prefill then measures compute, not first touches of the
# mapping and the workspace.
case $KV in f16 | f32) ;; *) echo "engine_table: -k: f16 or f32, not '$KV'" >&2; exit 2 ;; esac
export LLMEM_ARGS="${LLMEM_ARGS:---populate --warmup} --kv-dtype $KV" LLAMACPP_KV=$KV
mkdir -p "$DIR"
SHORT="Once upon a time"
LONG="Once upon a time, in a small town by the sea, there lived a girl named Lily. She loved to walk on the beach every morning and look for shells. One day she found a big blue shell."
LOCK=""
# BENCH_LOCKED=1: the caller already holds the lock for the whole table.
[ -e /work/bench.lock ] && [ "${BENCH_LOCKED:-0}" != 1 ] && LOCK="flock /work/bench.lock"

echo "| model | prompt | seqs | llmem prefill tok/s | llama.cpp prefill | prefill ratio | llmem decode tok/s | llama.cpp decode | decode ratio | peak RSS ratio |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for m in $MODELS; do
    shape=${m%-*}
    type=${m##*-}
    arch=llama
    case $shape in *@*) arch=${shape#*@}; shape=${shape%@*} ;; esac
    f=$DIR/$m.gguf
    if [ ! -f "$f" ]; then
        case $shape in
        stories260K) # the shared trained model, converted as users convert theirs
            src=${LLMEM_SHARED_DIR:-../shared}/models/stories260K.gguf
            [ -f "$src" ] || { echo "engine_table: $src is absent: $m skipped" >&2; continue; }
            if [ "$type" = f32 ]; then cp "$src" "$f"; else "$LLMEM" quantize "$src" "$f" --type "$type" >&2; fi ;;
        *) "$LLMEM" synth --shape "$shape" --type "$type" --arch "$arch" -o "$f" >&2 ;;
        esac
    fi
    gen=128
    case $shape in yi-coder-1.5b) gen=32 ;; esac
    gen=${GEN:-$gen}
    for p in $PROMPTS; do
        text=$SHORT
        [ "$p" = long ] && text=$LONG
        for s in $SEQS_LIST; do
            # positions in all: the prompt (at most 99 tokens here) plus gen
            n=$((gen + 5))
            [ "$p" = long ] && n=$((gen + 99))
            out=$(CONFIGS=llmem $LOCK bench/engine_bench.sh -L -r "$ROUNDS" -n "$n" -b "$s" -i "$text" "$f")
            echo "$out" >&2
            echo "$out" | awk -v m="$m" -v p="$p" -v s="$s" '
                $1 == "result" && $2 == "llmem" {lp = $3; ld = $4; lr = $6}
                $1 == "result" && $2 == "llamacpp" {cp = $3; cd = $4; cr = $6}
                END {printf "| %s | %s | %s | %.0f | %.0f | %.2fx | %.1f | %.1f | %.2fx | %.2fx |\n", m, p, s,
                     lp, cp, (cp > 0 ? lp / cp : 0), ld, cd, (cd > 0 ? ld / cd : 0), (cr > 0 ? lr / cr : 0)}'
        done
    done
done
