#!/bin/sh
# timeline_render.sh TEST_TIMELINE OUTDIR - render the timeline demo page in
# headless Chromium and check the screenshot is the size asked and not blank.
#
# test_timeline writes its demo page to $LLMEM_TIMELINE_OUT; Chromium
# screenshots it at 1200x900; png_check.py decodes the PNG and counts
# colours. Exit 77 (skipped) when Chromium or python3 is absent (Debian:
# apt-get install chromium python3; `make check` installs them).
set -u

bin=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)

browser=""
for b in chromium chromium-browser google-chrome; do
    if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
done
if [ -z "$browser" ]; then
    echo "timeline_render: skipped: no chromium (Debian package: chromium)"
    exit 77
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "timeline_render: skipped: no python3"
    exit 77
fi

rm -rf "$out"
mkdir -p "$out" || exit 1
page="$out/timeline.html"
png="$out/timeline.png"

if ! LLMEM_TIMELINE_OUT="$page" "$bin" >"$out/test.log" 2>&1; then
    cat "$out/test.log"
    echo "timeline_render: $bin failed"
    exit 1
fi
if [ ! -s "$page" ]; then
    echo "timeline_render: $bin wrote no page at $page"
    exit 1
fi

# --no-sandbox: Chromium's sandbox refuses to run as root (CI, containers).
# A profile of its own, so no state is read or left in $HOME.
timeout 90 "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars \
    --no-first-run --user-data-dir="$out/profile" --window-size=1200,900 \
    --screenshot="$png" "file://$page" >"$out/chromium.log" 2>&1
rc=$?
if [ $rc -ne 0 ] || [ ! -s "$png" ]; then
    tail -n 20 "$out/chromium.log"
    echo "timeline_render: $browser exited $rc without a screenshot"
    exit 1
fi

python3 "$here/png_check.py" "$png" 1200 900 || exit 1
echo "timeline_render: $page renders ($png)"
