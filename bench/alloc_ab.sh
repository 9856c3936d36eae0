#!/bin/sh
# alloc_ab.sh ROUNDS WORKLOAD BINARY... - compare llmem builds on one
# workload of `llmem bench alloc`: each round runs every binary's llmem
# child once, in turn (interleaved, so load from elsewhere hits them
# alike), and the median Mops/s per binary is printed with every round's
# figure. Single-threaded workloads run pinned to CPU 0, as the bench does.
# Take /work/bench.lock (flock) on a shared machine.
#   bench/alloc_ab.sh 7 small /tmp/llmem-before build/llmem
set -eu
[ $# -ge 3 ] || { echo "usage: $0 ROUNDS WORKLOAD BINARY..." >&2; exit 2; }
R=$1; W=$2; shift 2
PIN=""
case $W in tensor_mix|small|batch_alloc|batch_free|burst_idle) PIN="taskset -c 0" ;; esac
for i in $(seq "$R"); do
    for b in "$@"; do
        $PIN "$b" bench alloc --child "$W" llmem --full | awk -v b="$b" '{ printf "%s %.3f\n", b, $1 / $2 / 1e6 }'
    done
done | awk '{ v[$1] = v[$1] " " $2 } END { for (k in v) print k, v[k] }' | while read -r b vals; do
    med=$(echo "$vals" | tr ' ' '\n' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
    echo "$W $b median $med :$vals"
done
