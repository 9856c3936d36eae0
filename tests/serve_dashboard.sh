#!/bin/sh
# serve_dashboard.sh LLMEM - the dashboard of `llmem serve` (GET /) in
# Debian's headless Chromium while a request runs: the page loads, fetches
# /llmem/timeline, and draws data that changes (the canvas records its
# draws and the tokens generated at the first and the last one; the DOM is
# dumped after a few seconds of page time). Skipped (77) without chromium
# or curl.
set -u
llmem=$1
browser=""
for b in chromium chromium-browser google-chrome; do
    if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
done
[ -n "$browser" ] || { echo "skipped: no chromium (Debian package: chromium)"; exit 77; }
. "$(dirname "$0")/serve_lib.sh"
need curl "curl is not installed"
serve_lib_init serve_dashboard
"$llmem" synth --shape tiny-random -o "$work/m.gguf" >/dev/null 2>&1 || fail "llmem synth"
serve_start server "$work/m.gguf" --threads 1
# Requests one after another for the whole time the page is open.
(
    for k in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
        curl -s --data-binary '{"prompt":"hello","max_tokens":1500,"temperature":0}' \
            "http://127.0.0.1:$port/v1/completions" >/dev/null || break
    done
) &
load=$!
# --no-sandbox: Chromium's sandbox refuses to run as root (CI, containers).
timeout 90 "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
    --user-data-dir="$work/profile" --virtual-time-budget=4000 --dump-dom "http://127.0.0.1:$port/" \
    >"$work/dom.html" 2>"$work/chromium.log"
rc=$?
kill "$load" 2>/dev/null
[ $rc = 0 ] || fail "$browser exited $rc: $(tail -3 "$work/chromium.log")"
canvas=$(grep -o '<canvas id="tl"[^>]*>' "$work/dom.html")
[ -n "$canvas" ] || fail "no canvas in the page: $(head -c 300 "$work/dom.html")"
draws=$(printf '%s' "$canvas" | sed -n 's/.*data-draws="\([0-9]*\)".*/\1/p')
first=$(printf '%s' "$canvas" | sed -n 's/.*data-gen-first="\([0-9]*\)".*/\1/p')
last=$(printf '%s' "$canvas" | sed -n 's/.*data-gen-last="\([0-9]*\)".*/\1/p')
[ "${draws:-0}" -ge 2 ] || fail "the page drew ${draws:-0} times: $canvas"
[ "${last:-0}" -gt "${first:-0}" ] || fail "the drawn data did not change (tokens ${first:-?} -> ${last:-?})"
grep -q 'id="status"[^>]*>updated ' "$work/dom.html" || fail "the page shows no update"
serve_stop
echo "serve_dashboard: the page drew $draws times, tokens $first -> $last"
