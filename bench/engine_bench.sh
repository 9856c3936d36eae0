#!/bin/sh
# engine_bench.sh - llmem run against its malloc baseline and, when given,
# llama2.c's run.c, side by side on the same model, prompt and machine.
#
#   bench/engine_bench.sh [-r ROUNDS] [-n STEPS] [-i PROMPT] MODEL [TOKENIZER]
#
# Env: LLMEM (default build/llmem); RUNC, a run.c binary you built yourself
# from llama2.c (for example gcc -O3 -fopenmp -march=native run.c -lm);
# only llama2.c checkpoints (.bin) go to run.c. THREADS (default: online CPUs)
# sets --threads and OMP_NUM_THREADS alike. LLMEM_ARGS: more options for
# both llmem configurations (for example --max-seq-len 4096).
#
# For each configuration, ROUNDS runs (default 5), interleaved so that a
# slow moment of the machine hits every configuration alike; reported:
# the median prefill speed (llmem's --stats; run.c has no prefill pass: 0),
# the median decode speed (each tool's own "achieved tok/s": tokens after
# the first sampled one divided by the time after it), the median wall time
# of the whole process (load included) and the median peak RSS
# (/usr/bin/time). Greedy (-t 0), so every tool computes the same tokens.
set -eu
ROUNDS=5
STEPS=256
PROMPT="Once upon a time"
while getopts r:n:i: opt; do
    case $opt in
    r) ROUNDS=$OPTARG ;;
    n) STEPS=$OPTARG ;;
    i) PROMPT=$OPTARG ;;
    *) echo "usage: $0 [-r ROUNDS] [-n STEPS] [-i PROMPT] MODEL [TOKENIZER]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-r ROUNDS] [-n STEPS] [-i PROMPT] MODEL [TOKENIZER]" >&2; exit 2; }
MODEL=$1
TOK=${2:-}
LLMEM=${LLMEM:-build/llmem}
RUNC=${RUNC:-}
THREADS=${THREADS:-$(nproc)}
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (Debian package: time)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

ZOPT=""
[ -n "$TOK" ] && ZOPT="-z $TOK"
configs="llmem malloc"
case $MODEL in *.bin) [ -n "$RUNC" ] && configs="$configs runc" ;; esac

run_one() { # config round
    out=$TMP/$1.$2
    case $1 in
    llmem | malloc)
        # shellcheck disable=SC2086
        /usr/bin/time -f "%e %M" -o "$out.time" "$LLMEM" run "$MODEL" $ZOPT -t 0 -n "$STEPS" -i "$PROMPT" \
            --threads "$THREADS" --alloc "$1" --stats ${LLMEM_ARGS:-} > "$out.txt" 2> "$out.err" || true
        ;;
    runc)
        # shellcheck disable=SC2086
        OMP_NUM_THREADS=$THREADS /usr/bin/time -f "%e %M" -o "$out.time" "$RUNC" "$MODEL" $ZOPT -t 0 -n "$STEPS" \
            -i "$PROMPT" > "$out.txt" 2> "$out.err" || true
        ;;
    esac
}

r=1
while [ $r -le "$ROUNDS" ]; do
    for c in $configs; do run_one "$c" $r; done
    r=$((r + 1))
done

median() { sort -n | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

printf '%s, -n %s, %s threads, %s rounds, prompt "%s"\n' "$MODEL" "$STEPS" "$THREADS" "$ROUNDS" "$PROMPT"
printf '%-8s %14s %14s %10s %14s %s\n' config "prefill tok/s" "decode tok/s" "wall s" "peak RSS MB" "same text"
for c in $configs; do
    tps=$(for f in "$TMP/$c".*.err; do sed -n 's/^achieved tok\/s: //p' "$f"; done | median)
    pre=$(for f in "$TMP/$c".*.err; do sed -n 's/^prefill .*: \([0-9.]*\) tok\/s.*/\1/p' "$f"; done | median)
    [ -n "$pre" ] || pre=0
    wall=$(for f in "$TMP/$c".*.time; do awk '{print $1}' "$f"; done | median)
    rss=$(for f in "$TMP/$c".*.time; do awk '{print $2 / 1024}' "$f"; done | median)
    same=yes
    cmp -s "$TMP/$c.1.txt" "$TMP/llmem.1.txt" || same=no
    printf '%-8s %14.1f %14.1f %10.3f %14.1f %s\n' "$c" "$pre" "$tps" "$wall" "$rss" "$same"
done
