#!/bin/sh
# cli_paths.sh LLMEM TMPDIR - the paths a user passes to the tools, as a
# hostile user would pass them (needs nothing from the shared folder):
#  - an output (--timeline of run, replay and demo; synth -o; run --events)
#    that exists and is not a regular file (a FIFO, a folder, a symbolic
#    link to a file, a dangling link, a device node when we may make one)
#    is refused: exit 1, a message naming it, and the thing untouched (the
#    link's target keeps its bytes, nothing created where a link points);
#  - an output that cannot be written (a missing folder) is exit 1, not 0;
#  - a regular file is replaced whole, and no temporary file is left;
#  - the demo's default timeline is in a new private folder, not at a
#    fixed name in TMPDIR (a link planted there stays untouched; cli_demo
#    runs the whole demo that way);
#  - a FIFO given as the model, the tokenizer or the trace is refused at
#    once (each run under `timeout`: a hang fails);
#  - run --copy gives the tokens of the mapped model.
set -u
LLMEM=$1
T=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$T" && mkdir -p "$T" || exit 1
TRACE=$(dirname "$0")/data/mini_trace.csv
to() { timeout 60 "$@"; }

# A model of our own (no shared folder needed).
"$LLMEM" synth --shape stories260k -o "$T/m.gguf" >/dev/null 2>&1 || fail "synth a model"

# expect_refused WHAT PATTERN -- COMMAND...: exit 1, PATTERN in stderr.
expect_refused() {
    what=$1 pat=$2
    shift 3
    to "$@" >"$T/out.txt" 2>"$T/err.txt"
    rc=$?
    [ $rc -eq 1 ] || { cat "$T/err.txt"; fail "$what: exit $rc, wanted 1"; }
    grep -q -- "$pat" "$T/err.txt" || { cat "$T/err.txt"; fail "$what: no message matching '$pat'"; }
    if grep -Eq "tokenizer: tokenizer:|timeline: timeline:|model: model:|(: '[^']*'): \1" "$T/err.txt"; then
        cat "$T/err.txt"
        fail "$what: a doubled prefix"
    fi
}

mkfifo "$T/fifo" || fail "mkfifo"
mkdir "$T/dir"
printf 'precious\n' >"$T/target.txt"
ln -s "$T/target.txt" "$T/link"
ln -s "$T/nothing-here" "$T/dangling"
dev=""
if mknod "$T/null" c 1 3 2>/dev/null; then dev="$T/null"; fi # as root: a device node of our own

for out in fifo dir link dangling ${dev:+null}; do
    p=$T/$out
    case $out in
        fifo) kind="a FIFO" ;; dir) kind="a directory" ;; link | dangling) kind="a symbolic link" ;;
        null) kind="a character device" ;;
    esac
    expect_refused "replay --timeline $out" "refusing to write '$p': it exists and is $kind" -- \
        "$LLMEM" replay --trace "$TRACE" --kv-budget 8GiB --model-shape llama-2-7b --timeline "$p"
    expect_refused "run --timeline $out" "refusing to write '$p'" -- \
        "$LLMEM" run "$T/m.gguf" -n 4 --print-ids --timeline "$p"
    expect_refused "run --events $out" "refusing to write '$p'" -- \
        "$LLMEM" run "$T/m.gguf" -n 4 --print-ids --events "$p"
    expect_refused "synth -o $out" "refusing to write '$p'" -- "$LLMEM" synth --shape stories260k -o "$p"
    expect_refused "synth --format llama2c -o $out" "refusing to write '$p'" -- \
        "$LLMEM" synth --shape stories260k --format llama2c -o "$p"
done
expect_refused "demo --timeline fifo" "refusing to write '$T/fifo'" -- "$LLMEM" demo --timeline "$T/fifo"
# Untouched: the FIFO is a FIFO, the folder a folder, the links links, the
# target's bytes the same, nothing where the dangling link points.
[ -p "$T/fifo" ] || fail "the FIFO was replaced"
[ -d "$T/dir" ] && [ -z "$(ls -A "$T/dir")" ] || fail "the folder was changed"
[ -L "$T/link" ] && [ -L "$T/dangling" ] || fail "a link was replaced"
[ "$(cat "$T/target.txt")" = precious ] || fail "the link's target was overwritten"
[ ! -e "$T/nothing-here" ] || fail "a file was created through the dangling link"
[ -z "$dev" ] || [ -c "$dev" ] || fail "the device node was replaced"

# A folder that does not exist: exit 1 with the reason (was exit 0).
expect_refused "replay --timeline in a missing folder" "No such file or directory" -- \
    "$LLMEM" replay --trace "$TRACE" --kv-budget 8GiB --model-shape llama-2-7b --timeline "$T/no/such/x.html"
expect_refused "run --timeline in a missing folder" "No such file or directory" -- \
    "$LLMEM" run "$T/m.gguf" -n 4 --print-ids --timeline "$T/no/such/x.html"

# A regular file is replaced whole; no temporary file stays.
printf 'old\n' >"$T/page.html"
to "$LLMEM" replay --trace "$TRACE" --kv-budget 8GiB --model-shape llama-2-7b --timeline "$T/page.html" \
    >/dev/null 2>&1 || fail "replay --timeline on a regular file"
grep -q "<svg" "$T/page.html" || fail "the timeline page was not written"
to "$LLMEM" synth --shape stories260k -o "$T/m2.gguf" >/dev/null 2>&1 || fail "synth -o a new file"
cmp -s "$T/m.gguf" "$T/m2.gguf" || fail "synth is not deterministic, or wrote a part"
if ls -A "$T" | grep -q '\.tmp$'; then ls -A "$T"; fail "a temporary file was left"; fi

# The demo's default timeline: a new private folder in TMPDIR, never the
# old fixed name where a link could be planted (cli_demo runs the whole
# demo that way and checks where the page went; here the model is a FIFO,
# so the demo stops right after choosing the folder).
mkdir "$T/tmp"
ln -s "$T/target.txt" "$T/tmp/llmem-demo-timeline.html"
ln -s "$T/target.txt" "$T/tmp/llmem-demo-timeline.html.tmp"
TMPDIR=$T/tmp expect_refused "demo --model fifo" "is a FIFO, not a regular file" -- "$LLMEM" demo --model "$T/fifo"
set -- "$T"/tmp/llmem-demo-??????
[ $# -eq 1 ] && [ -d "$1" ] || fail "the demo made no private folder in TMPDIR (or more than one: $*)"
[ "$(stat -c %a "$1")" = 700 ] || fail "the demo's folder is not private"
[ -z "$(ls -A "$1")" ] || fail "the demo left a file in its folder after failing: $(ls -A "$1")"
[ "$(cat "$T/target.txt")" = precious ] || fail "the demo wrote through a planted link"
[ -L "$T/tmp/llmem-demo-timeline.html" ] && [ -L "$T/tmp/llmem-demo-timeline.html.tmp" ] || fail "a planted link went"

# run --copy (the model read into private memory) gives the same tokens.
a=$(to "$LLMEM" run "$T/m.gguf" -n 8 --print-ids 2>/dev/null) || fail "run"
b=$(to "$LLMEM" run "$T/m.gguf" -n 8 --print-ids --copy 2>/dev/null) || fail "run --copy"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "run --copy gave other tokens ('$b', not '$a')"

# Messages: a prompt cut to the positions that run says so; a llama2.c
# model without -z says what to give, with no doubled prefix; an output
# refusal names the page once.
to "$LLMEM" run "$T/m.gguf" -i "Once upon a time there was a little dog who liked to run in the park" -n 4 \
    --print-ids >/dev/null 2>"$T/err.txt" || fail "run with a long prompt"
grep -q "more than the 4 positions that run: only its first 4 are used, [0-9]* dropped" "$T/err.txt" \
    || { cat "$T/err.txt"; fail "a cut prompt is not reported"; }
to "$LLMEM" synth --shape stories260k --format llama2c -o "$T/m.bin" >/dev/null 2>&1 || fail "synth llama2c"
expect_refused "run a llama2.c model without -z" "give its tokenizer.bin with -z" -- "$LLMEM" run "$T/m.bin" -n 2
expect_refused "run --timeline fifo, once more" "llmem run: timeline: refusing to write" -- \
    "$LLMEM" run "$T/m.gguf" -n 4 --print-ids --timeline "$T/fifo"

# A FIFO as an input: refused at once, not a hang in open().
expect_refused "run on a FIFO model" "is a FIFO, not a regular file" -- "$LLMEM" run "$T/fifo" -n 4
expect_refused "run with a FIFO tokenizer" "is a FIFO, not a regular file" -- \
    "$LLMEM" run "$T/m.gguf" -z "$T/fifo" -n 4
expect_refused "replay on a FIFO trace" "is a FIFO, not a regular file" -- \
    "$LLMEM" replay --trace "$T/fifo" --kv-budget 8GiB --model-shape llama-2-7b
expect_refused "plan with a FIFO config.json" "is a FIFO, not a regular file" -- \
    "$LLMEM" plan --shape "$T/fifo"
echo "cli_paths: all refused as they should be"
exit 0
