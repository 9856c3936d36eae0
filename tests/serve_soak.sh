#!/bin/sh
# serve_soak.sh LLMEM SECONDS - `llmem serve` under bounded load for
# SECONDS: rounds of concurrent greedy streaming clients (8 at once, from a
# set of prompts whose answers were taken alone first), a quarter of them
# killed mid-stream, a fault-injecting resource failing the pool's commits
# at random (--fault-probability; the controller gives memory back after
# 20 ms idle, so every round commits again), preemption under a small KV
# budget.
# Checks (SOAK_FAULT_PROBABILITY, default 0.2, sets the fault rate; at 0
# the run must fail): faults fired (the fault resource's injected counter, from
# /metrics, is above 0); the server never dies; every response that completes equals its
# reference; every killed client's request is cancelled; resident memory
# after the warm-up (a third of the time) drifts under 2% to the end (runs
# of 30 s or more; shorter ones report it); SIGTERM exits 0 with no
# mapping left. A CTest entry runs it for a few seconds (serve_soak); make
# soak runs it for SOAK_MINUTES. Exit 0 pass, 1 fail, 77 no curl.
set -u
llmem=$1
seconds=${2:-10}
. "$(dirname "$0")/serve_lib.sh"
need curl "curl is not installed"
serve_lib_init serve_soak
"$llmem" synth --shape tiny-random -o "$work/m.gguf" >/dev/null 2>&1 || fail "llmem synth"
serve_start server "$work/m.gguf" --threads 2 --max-batch 8 --kv-budget 16KiB \
    --swap 1MiB --idle-decay-ms 20 --fault-probability "${SOAK_FAULT_PROBABILITY:-0.2}" --fault-seed 7
url="http://127.0.0.1:$port/v1/completions"
# body K [MAX_TOKENS]: prompt K's request (20 + 8K tokens unless told).
body() { printf '{"prompt":"soak prompt %s","max_tokens":%s,"temperature":0,"stream":true}' "$1" "${2:-$((20 + 8 * $1))}"; }
text() { grep '^data: {' "$1" | sed -n 's/.*"text":"\([^"]*\)".*/\1/p' | tr -d '\n'; }
# A client killed mid-stream: once its first token is in, long before its
# last (it asks for 200 tokens, about 4x the others, and the 16 KiB of KV
# preempt it meanwhile), so the server sees the client go while the request
# runs, on a fast idle machine as on a loaded one (a kill on a timer found
# the requests already finished when the machine was quiet).
kill_mid_stream() {
    curl -s -N --data-binary "$(body "$1" 200)" "$url" >"$work/kill$1" 2>/dev/null &
    c=$!
    n=0
    while ! grep -q '^data: {' "$work/kill$1" 2>/dev/null && kill -0 $c 2>/dev/null && [ $n -lt 1000 ]; do
        sleep 0.01
        n=$((n + 1))
    done
    kill $c 2>/dev/null
    wait $c 2>/dev/null
}

# References, one at a time (a fault may fail one: retry).
for k in 0 1 2 3 4 5 6 7; do
    t=0
    while :; do
        curl -s -N --data-binary "$(body $k)" "$url" >"$work/ref$k"
        grep -q '"finish_reason":"length"' "$work/ref$k" && break
        t=$((t + 1))
        [ $t -gt 5 ] && fail "no reference for prompt $k: $(tail -c 300 "$work/ref$k")"
    done
    text "$work/ref$k" >"$work/ref$k.txt"
done

end=$(($(date +%s) + seconds))
rounds=0
completed=0
killed=0
failed=0
rss0=""
while [ $rounds -lt 4 ] || [ "$(date +%s)" -lt "$end" ]; do
    cpids=""
    for k in 0 1 2 3 4 5 6 7; do
        if [ $(((rounds + k) % 4)) = 0 ]; then
            kill_mid_stream $k &
        else
            curl -s -N --data-binary "$(body $k)" "$url" >"$work/out$k" &
        fi
        cpids="$cpids $!"
    done
    for c in $cpids; do wait "$c"; done
    kill -0 "$pid" 2>/dev/null || fail "the server died in round $rounds"
    for k in 0 1 2 3 4 5 6 7; do
        if [ $(((rounds + k) % 4)) = 0 ]; then
            killed=$((killed + 1))
            continue
        fi
        if grep -q '"finish_reason":"length"' "$work/out$k"; then
            [ "$(text "$work/out$k")" = "$(cat "$work/ref$k.txt")" ] ||
                fail "round $rounds, prompt $k differs from its reference"
            completed=$((completed + 1))
        else
            # A fault ended it: an error event or a truncated sample, never silence.
            tail -1 "$work/out$k" | grep -q '^data: \[DONE\]' || grep -q '"error"' "$work/out$k" ||
                fail "round $rounds, prompt $k ended without an answer: $(tail -c 300 "$work/out$k")"
            failed=$((failed + 1))
        fi
    done
    rounds=$((rounds + 1))
    # The warm-up: a third of the time, three rounds at least.
    if [ -z "$rss0" ] && [ $rounds -ge 3 ] && [ $(($(date +%s) + 2 * seconds / 3)) -ge "$end" ]; then
        rss0=$(metric llmem_process_resident_bytes)
    fi
done
[ -n "$rss0" ] || rss0=$(metric llmem_process_resident_bytes)
sleep 0.3
rss1=$(metric llmem_process_resident_bytes)
running=$(metric vllm:num_requests_running)
cancelled=$(metric llmem_sched_requests_cancelled_total)
faults=$(metric llmem_fault_injected_total)
pool_failures=$(metric llmem_pool_failures_total)
[ "$running" = 0 ] || fail "$running requests still running after the load"
# The faults must have fired, or the soak proved nothing about them.
[ "${faults:-0}" -ge 1 ] || fail "no fault was injected (llmem_fault_injected_total ${faults:-absent})"
[ "${cancelled:-0}" -ge 1 ] || fail "no killed client's request was cancelled"
drift=$(awk -v a="$rss0" -v b="$rss1" 'BEGIN { printf "%.2f", (b - a) * 100 / a }')
# The drift bound needs a run long enough to be past the warm-up (30 s or
# more: make soak); a short CTest run only reports it.
if [ "$seconds" -ge 30 ]; then
    awk -v d="$drift" 'BEGIN { exit !(d < 2) }' || fail "resident memory drifted $drift% ($rss0 -> $rss1 bytes)"
fi
serve_stop
grep -q '0 mappings (0 bytes) left' "$work/server.log" || fail "shutdown: $(tail -1 "$work/server.log")"
echo "serve_soak: $rounds rounds in $seconds s: $completed responses equal to their references, $failed ended by" \
    "faults, $killed clients killed ($cancelled requests cancelled), $faults commits failed by the fault resource" \
    "($pool_failures pool failures); RSS $rss0 -> $rss1 ($drift%)"
