#!/bin/sh
# engine_bench.sh - llmem run against its peers, side by side on the same
# model, prompt and machine: its malloc baseline, llama.cpp (the prebuilt
# CPU library of the npm package @node-llama-cpp/linux-x64@3.22.1, timed
# by our native harness tests/oracle/llamacpp_harness.c, not through
# Node.js) and, when given, llama2.c's run.c.
#
#   bench/engine_bench.sh [-r ROUNDS] [-n STEPS] [-i PROMPT] [-b SEQS] [-L] MODEL [TOKENIZER]
#
#   -r ROUNDS  rounds per configuration (default 5), interleaved so that a
#              slow moment of the machine hits every configuration alike
#   -n STEPS   positions in all, the prompt included (default 256)
#   -i PROMPT  the prompt text (default "Once upon a time"); both engines
#              tokenise it (the test oracle_llamacpp checks they agree)
#   -b SEQS    sequences at once (llmem run --batch; llama.cpp: as many
#              sequences in one context, prefilled in one batch)
#   -L         add llama.cpp (GGUF models only); its harness is built by
#              tests/oracle/build_harness.sh into LLAMACPP_DIR (default
#              build-llamacpp), which installs the pinned npm packages once
#
# Env: LLMEM (default build/llmem); RUNC, a run.c binary you built yourself
# (only llama2.c .bin checkpoints go to it); THREADS (default: online CPUs)
# for --threads, OMP_NUM_THREADS and llama.cpp's -t; LLMEM_ARGS, more
# options for both llmem configurations; CONFIGS, the configurations to run
# (default "llmem malloc", plus llamacpp with -L and runc with RUNC);
# LLAMACPP_KV, llama.cpp's KV cache type (default f16, its own default and
# its fast attention path; llmem's default is f32).
#
# Reported per configuration: the median prefill speed (tokens of all
# sequences over the prefill's wall time: llmem's --stats, the harness's
# own clock, in the second of two rounds in one process so that its
# one-time graph reservation is not counted; run.c has none: 0), the median
# decode speed (tokens after the prompt over their wall time), the median
# wall time of the process and
# the median peak RSS (/usr/bin/time for every tool alike), and whether the
# text equals llmem's. Greedy (-t 0), so the engines compute the same
# tokens. Then the ratios llmem / each peer (higher is better for speed,
# lower for RSS). Machine-readable lines "result CONFIG PREFILL DECODE WALL
# RSS" follow for scripts (bench/engine_table.sh).
set -eu
ROUNDS=5
STEPS=256
PROMPT="Once upon a time"
SEQS=1
PEER=0
usage() { echo "usage: $0 [-r ROUNDS] [-n STEPS] [-i PROMPT] [-b SEQS] [-L] MODEL [TOKENIZER]" >&2; exit 2; }
while getopts r:n:i:b:L opt; do
    case $opt in
    r) ROUNDS=$OPTARG ;;
    n) STEPS=$OPTARG ;;
    i) PROMPT=$OPTARG ;;
    b) SEQS=$OPTARG ;;
    L) PEER=1 ;;
    *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage
MODEL=$1
TOK=${2:-}
LLMEM=${LLMEM:-build/llmem}
RUNC=${RUNC:-}
THREADS=${THREADS:-$(nproc)}
LLAMACPP_KV=${LLAMACPP_KV:-f16}
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (Debian package: time)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

ZOPT=""
[ -n "$TOK" ] && ZOPT="-z $TOK"
configs=${CONFIGS:-"llmem malloc"}
case $MODEL in *.bin) [ -n "$RUNC" ] && configs="$configs runc" ;; esac
HARNESS=""
if [ "$PEER" = 1 ]; then
    case $MODEL in
    *.gguf)
        DIR=${LLAMACPP_DIR:-build-llamacpp}
        HARNESS=$(tests/oracle/build_harness.sh "$DIR") || { echo "engine_bench: llama.cpp is not available" >&2; exit 77; }
        . "$DIR/env.sh"
        export LLAMACPP_LIBDIR
        case " $configs " in *" llamacpp "*) ;; *) configs="$configs llamacpp" ;; esac
        ;;
    *) echo "engine_bench: llama.cpp takes GGUF models only" >&2 ;;
    esac
fi

run_one() { # config round
    out=$TMP/$1.$2
    case $1 in
    llmem | malloc)
        # shellcheck disable=SC2086
        /usr/bin/time -f "%e %M" -o "$out.time" "$LLMEM" run "$MODEL" $ZOPT -t 0 -n "$STEPS" -i "$PROMPT" \
            --batch "$SEQS" --threads "$THREADS" --alloc "$1" --print-ids --stats ${LLMEM_ARGS:-} > "$out.txt" 2> "$out.err" || true
        ;;
    llamacpp)
        # The prompt's length in tokens from the first llmem run: llama.cpp
        # decodes the same number of tokens after it.
        P=$(sed -n 's/^prefill *\([0-9]*\) tokens.*/\1/p' "$TMP/llmem.1.err" 2>/dev/null | head -1)
        P=$(( ${P:-0} / SEQS ))
        N=$(( STEPS - P + 1 ))
        [ "$N" -ge 1 ] || N=1
        /usr/bin/time -f "%e %M" -o "$out.time" "$HARNESS" -t "$THREADS" --kv "$LLAMACPP_KV" bench "$MODEL" "$PROMPT" "$N" "$SEQS" 2 \
            > "$out.txt" 2> "$out.err" || true
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

median() { sort -n | awk '{v[NR]=$1} END {if (NR == 0) print 0; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

printf '%s, -n %s, %s threads, %s sequences, %s rounds, prompt "%.40s"\n' "$MODEL" "$STEPS" "$THREADS" "$SEQS" "$ROUNDS" "$PROMPT"
printf '%-9s %14s %14s %10s %14s %s\n' config "prefill tok/s" "decode tok/s" "wall s" "peak RSS MB" "same ids"
for c in $configs; do
    case $c in
    llamacpp)
        # The second (warm) round of each run: the first pays llama.cpp's
        # graph reservation and thread start-up.
        pre=$(for f in "$TMP/$c".*.txt; do sed -n 's/^round 2 .*prefill_tok_s \([0-9.]*\).*/\1/p' "$f"; done | median)
        tps=$(for f in "$TMP/$c".*.txt; do sed -n 's/^round 2 .*decode_tok_s \([0-9.]*\).*/\1/p' "$f"; done | median)
        same=-
        ;;
    *)
        tps=$(for f in "$TMP/$c".*.err; do sed -n 's/^achieved tok\/s: //p' "$f"; done | median)
        pre=$(for f in "$TMP/$c".*.err; do sed -n 's/^prefill .*: \([0-9.]*\) tok\/s.*/\1/p' "$f"; done | median)
        same=yes
        cmp -s "$TMP/$c.1.txt" "$TMP/llmem.1.txt" || same=no
        ;;
    esac
    [ -n "$pre" ] || pre=0
    [ -n "$tps" ] || tps=0
    wall=$(for f in "$TMP/$c".*.time; do awk 'NR==1{print $1}' "$f"; done | median)
    rss=$(for f in "$TMP/$c".*.time; do awk 'NR==1{print $2 / 1024}' "$f"; done | median)
    printf '%-9s %14.1f %14.1f %10.3f %14.1f %s\n' "$c" "$pre" "$tps" "$wall" "$rss" "$same"
    echo "$c $pre $tps $wall $rss" >> "$TMP/results"
done
awk '$1 == "llmem" {p = $2; d = $3; m = $5} $1 != "llmem" {peer[$1] = $0}
     END {for (k in peer) {split(peer[k], f, " ");
          printf "llmem / %-9s prefill %5.2fx  decode %5.2fx  peak RSS %5.2fx\n", k,
                 (f[2] > 0 ? p / f[2] : 0), (f[3] > 0 ? d / f[3] : 0), (f[5] > 0 ? m / f[5] : 0)}}' "$TMP/results"
sed 's/^/result /' "$TMP/results"
