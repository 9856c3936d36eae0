#!/bin/sh
# ab_runs.sh - llmem binaries side by side: interleaved rounds of `llmem run`
# on the same models, the long prompt (99 tokens) then DECODE tokens, 2
# threads, --populate --warmup; prints per (binary, model) the median
# prefill and decode tok/s of the rounds and their min..max, then for each
# binary after the first the median of its per-round ratios to the first
# (paired within a round, so a slow moment of the machine cancels).
#
#   bench/ab_runs.sh [-r ROUNDS] [-g DECODE] [-b SEQS] [-i PROMPT] MODEL... -- NAME=BINARY...
#
#   -b SEQS    sequences at once (llmem run --batch; default 1)
#   -i PROMPT  the prompt (default: the long one, 99 tokens; engine_table.sh's
#              short one is "Once upon a time")
#
# Run it under flock /work/bench.lock (it does not take the lock itself).
set -eu
ROUNDS=5
GEN=128
SEQS=1
PROMPT=""
while getopts r:g:b:i: opt; do
    case $opt in
    r) ROUNDS=$OPTARG ;;
    g) GEN=$OPTARG ;;
    b) SEQS=$OPTARG ;;
    i) PROMPT=$OPTARG ;;
    *) echo "usage: $0 [-r ROUNDS] [-g DECODE] [-b SEQS] [-i PROMPT] MODEL... -- NAME=BINARY..." >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
MODELS=""
while [ $# -gt 0 ] && [ "$1" != -- ]; do MODELS="$MODELS $1"; shift; done
[ $# -gt 0 ] && shift
BINS="$*"
LONG="Once upon a time, in a small town by the sea, there lived a girl named Lily. She loved to walk on the beach every morning and look for shells. One day she found a big blue shell."
[ -n "$PROMPT" ] && LONG=$PROMPT
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for m in $MODELS; do
        for nb in $BINS; do
            name=${nb%%=*}
            bin=${nb#*=}
            key=$name.$(basename "$m" .gguf)
            "$bin" run "$m" -t 0 -n $((99 + GEN)) -i "$LONG" --batch "$SEQS" --threads "${THREADS:-2}" --populate --warmup --stats \
                > /dev/null 2> "$TMP/err"
            sed -n 's/^prefill .*: \([0-9.]*\) tok\/s.*/\1/p' "$TMP/err" >> "$TMP/$key.p"
            sed -n 's/^decode .*: \([0-9.]*\) tok\/s.*/\1/p' "$TMP/err" >> "$TMP/$key.d"
        done
    done
    r=$((r + 1))
done
stat() { # FILE [FORMAT]: median [min..max]
    sort -n "$1" | awk -v f="${2:-%.1f}" '{v[NR]=$1} END {m = NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2;
        printf f " [" f ".." f "]", m, v[1], v[NR]}'
}
ratio() { paste "$1" "$2" | awk '$2 > 0 {print $1 / $2}' > "$TMP/ratio"; stat "$TMP/ratio" %.3f; }
for m in $MODELS; do
    first=""
    for nb in $BINS; do
        name=${nb%%=*}
        key=$name.$(basename "$m" .gguf)
        printf "%s %s prefill %s decode %s" "$(basename "$m" .gguf)" "$name" "$(stat "$TMP/$key.p")" "$(stat "$TMP/$key.d")"
        if [ -n "$first" ]; then
            printf "  ratio to %s: prefill %s decode %s" "${first%%.*}" "$(ratio "$TMP/$key.p" "$TMP/$first.p")" \
                "$(ratio "$TMP/$key.d" "$TMP/$first.d")"
        else
            first=$key
        fi
        echo
    done
done
