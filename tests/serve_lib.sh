# serve_lib.sh - what the tests that drive `llmem serve` (tests/serve_*.sh)
# share. Sourced, POSIX sh, after `set -u`, with $llmem set:
#
#   need CMD WHY           exit 77 (Skipped) saying WHY when CMD is absent
#   serve_lib_init NAME    $work, a temporary folder; at exit every server
#                          still running is killed and $work removed;
#                          fail MESSAGE: "NAME: FAIL: MESSAGE", the tail of
#                          each log in $work, exit 1 (SERVE_KEEP=DIR keeps
#                          a copy of $work in DIR)
#   serve_start LOG ARGS   `llmem serve ARGS` on a free port (--port 0
#                          --port-file), output in $work/LOG.log; waits for
#                          the port (10 s) and fails if the server exits
#                          first; sets $port and $pid
#   serve_stop             SIGTERM to $pid and wait; sets $rc; fails unless
#                          it exited 0 and its log holds no sanitizer report
#   serve_sanitizer_check  fail on a sanitizer report in any $work/*.log
#   metric NAME            NAME's value in /metrics (labelled or not)
#   wait_metric NAME VALUE poll /metrics until NAME reads VALUE (30 s)
#
# Why one file: five scripts each carried their own copy of the start-up
# poll, the SIGTERM check and the sanitizer grep, and the copies drifted
# (two never noticed a server that died at start).

need() {
    command -v "$1" >/dev/null 2>&1 || { echo "skipped: $2"; exit 77; }
}

serve_lib_init() {
    serve_test=$1
    work=$(mktemp -d "${TMPDIR:-/tmp}/$serve_test.XXXXXX") || exit 1
    pid=""
    pids=""
    trap 'for p in $pids; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$work"' EXIT
}

fail() {
    echo "$serve_test: FAIL: $*" >&2
    for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
    # SERVE_KEEP=DIR: keep what the test saw there, for a post-mortem.
    [ -n "${SERVE_KEEP:-}" ] && mkdir -p "$SERVE_KEEP" && cp -r "$work" "$SERVE_KEEP/" && echo "kept in $SERVE_KEEP" >&2
    exit 1
}

serve_start() {
    serve_log=$work/$1.log
    serve_port=$work/$1.port
    shift
    rm -f "$serve_port"
    "$llmem" serve "$@" --port 0 --port-file "$serve_port" >"$serve_log" 2>&1 &
    pid=$!
    pids="$pids $pid"
    i=0
    while [ ! -s "$serve_port" ]; do
        i=$((i + 1))
        [ $i -gt 100 ] && fail "the server ($serve_log) did not start"
        kill -0 "$pid" 2>/dev/null || fail "the server ($serve_log) exited at start"
        sleep 0.1
    done
    port=$(cat "$serve_port")
}

serve_sanitizer_check() {
    for f in "$work"/*.log; do
        [ -f "$f" ] || continue
        for pat in 'ERROR: AddressSanitizer' 'ERROR: LeakSanitizer' 'runtime error:' 'WARNING: ThreadSanitizer'; do
            grep -Fq "$pat" "$f" && fail "a sanitizer report ($pat) in $f"
        done
    done
    return 0
}

serve_stop() {
    kill -TERM "$pid"
    wait "$pid"
    rc=$?
    pid=""
    [ $rc = 0 ] || fail "llmem serve ($serve_log) exited $rc after SIGTERM"
    serve_sanitizer_check
}

metric() { curl -s "http://127.0.0.1:$port/metrics" | sed -n "s/^$1{[^}]*} //p;s/^$1 //p" | head -1; }

wait_metric() {
    t0=$(date +%s)
    while [ "$(metric "$1")" != "$2" ]; do
        [ $(($(date +%s) - t0)) -gt 30 ] &&
            fail "$1 stayed $(metric "$1"), wanted $2 (running $(metric vllm:num_requests_running), waiting $(metric vllm:num_requests_waiting), generated $(metric vllm:generation_tokens_total))"
        sleep 0.05
    done
}
