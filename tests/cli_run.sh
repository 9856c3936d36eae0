#!/bin/sh
# cli_run.sh LLMEM SHARED_DIR TMPDIR [args|models] - `llmem run` and `llmem
# synth` end to end (CTest: cli_run_args, which needs nothing, and cli_run,
# which needs the shared models):
#  - greedy ids of stories260K (.bin with tok512.bin, and .gguf) equal
#    llama2.c's reference ids for every reference prompt;
#  - --alloc malloc, --batch 3 and --warmup give the same ids;
#  - llmem synth writes a GGUF (with a vocabulary) and a llama2.c file that
#    llmem run reads, and --stats reports;
#  - bad arguments and a corrupt model fail with a message, exit status 1 or 2.
# The shared folder is $LLMEM_SHARED_DIR when set, else SHARED_DIR (the
# convention of tests/test_util.h). `models` exits 77 (skipped) when the
# shared models are absent.
set -u
LLMEM=$1
MODELS=${LLMEM_SHARED_DIR:-$2}/models
TMP=$3
mode=${4:-models}
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$TMP" || exit 1

if [ "$mode" = args ]; then
    # Bad arguments.
    "$LLMEM" run 2>/dev/null; [ $? = 2 ] || fail "no model: exit 2"
    "$LLMEM" run x.gguf -t hot 2>/dev/null; [ $? = 2 ] || fail "bad temperature: exit 2"
    "$LLMEM" run x.gguf --alloc jemalloc 2>/dev/null; [ $? = 2 ] || fail "bad alloc: exit 2"
    "$LLMEM" synth --shape nope -o "$TMP/x.gguf" 2>/dev/null; [ $? = 1 ] || fail "bad shape: exit 1"
    exit 0
fi

if [ -f "$MODELS/stories260K.bin" ] && [ -d "$MODELS/reference" ]; then
    for ref in once:"Once upon a time":256 lily:"Lily liked":128 empty:"":256; do
        name=${ref%%:*}; rest=${ref#*:}; prompt=${rest%:*}; steps=${rest##*:}
        want="$MODELS/reference/stories260K.$name.$steps.ids"
        "$LLMEM" run "$MODELS/stories260K.bin" -z "$MODELS/tok512.bin" -t 0 -n "$steps" -i "$prompt" --print-ids \
            > "$TMP/bin.ids" || fail "run .bin $name"
        cmp -s "$TMP/bin.ids" "$want" || fail ".bin ids for '$name' differ from the reference"
        "$LLMEM" run "$MODELS/stories260K.gguf" -t 0 -n "$steps" -i "$prompt" --print-ids --threads 1 \
            > "$TMP/gguf.ids" || fail "run .gguf $name"
        cmp -s "$TMP/gguf.ids" "$want" || fail ".gguf ids for '$name' differ from the reference"
        "$LLMEM" run "$MODELS/stories260K.bin" -z "$MODELS/tok512.bin" -t 0 -n "$steps" -i "$prompt" --print-ids \
            --alloc malloc > "$TMP/malloc.ids" || fail "run --alloc malloc $name"
        cmp -s "$TMP/malloc.ids" "$want" || fail "--alloc malloc ids for '$name' differ from the reference"
    done
    # Text as run.c prints it (the reference .txt is run.c's stdout).
    "$LLMEM" run "$MODELS/stories260K.bin" -z "$MODELS/tok512.bin" -t 0 -n 128 -i "Lily liked" \
        > "$TMP/lily.txt" 2>/dev/null || fail "run text"
    cmp -s "$TMP/lily.txt" "$MODELS/reference/stories260K.lily.128.txt" || fail "text differs from run.c's"
    # Three copies at once, greedy: three identical reference lines.
    "$LLMEM" run "$MODELS/stories260K.bin" -z "$MODELS/tok512.bin" -t 0 -n 128 -i "Lily liked" --print-ids \
        --batch 3 > "$TMP/batch.ids" || fail "run --batch 3"
    [ "$(sort -u "$TMP/batch.ids" | wc -l)" = 1 ] && [ "$(wc -l < "$TMP/batch.ids")" = 3 ] || fail "--batch 3 lines"
    head -n 1 "$TMP/batch.ids" | cmp -s - "$MODELS/reference/stories260K.lily.128.ids" || fail "--batch ids differ"
    # --warmup runs the prompt once first: the same ids, and --stats counts
    # only the request's prefill (3 copies of the 5-token prompt).
    "$LLMEM" run "$MODELS/stories260K.gguf" -t 0 -n 256 -i "Once upon a time" --print-ids --warmup --batch 3 \
        --stats > "$TMP/warm.ids" 2> "$TMP/warm.txt" || fail "run --warmup"
    head -n 1 "$TMP/warm.ids" | cmp -s - "$MODELS/reference/stories260K.once.256.ids" || fail "--warmup ids differ"
    grep -q "^prefill *15 tokens" "$TMP/warm.txt" || fail "--warmup's pass is counted in --stats' prefill"
    # Sampling is seeded: the same seed, the same text.
    a=$("$LLMEM" run "$MODELS/stories260K.bin" -z "$MODELS/tok512.bin" -t 1 -p 0.9 -s 42 -n 64 --print-ids)
    b=$("$LLMEM" run "$MODELS/stories260K.bin" -z "$MODELS/tok512.bin" -t 1 -p 0.9 -s 42 -n 64 --print-ids)
    [ "$a" = "$b" ] || fail "seeded sampling is not reproducible"
    # A synthetic model with the 512-token vocabulary inside.
    "$LLMEM" synth --shape stories260k --type f16 --vocab "$MODELS/tok512.bin" -o "$TMP/synth.gguf" 2>/dev/null \
        || fail "synth f16"
    "$LLMEM" run "$TMP/synth.gguf" -t 0 -n 40 -i "Once upon" --stats > /dev/null 2> "$TMP/stats.txt" \
        || fail "run the synthetic model"
    grep -q "decode .* tok/s" "$TMP/stats.txt" || fail "--stats has no decode line"
    grep -q "peak RSS" "$TMP/stats.txt" || fail "--stats has no RSS"
    "$LLMEM" synth --shape stories260k --format llama2c -o "$TMP/synth.bin" 2>/dev/null || fail "synth llama2c"
    "$LLMEM" run "$TMP/synth.bin" -z "$MODELS/tok512.bin" -t 0 -n 16 --print-ids > /dev/null || fail "run synth .bin"
    # The controller's timeline page.
    "$LLMEM" run "$MODELS/stories260K.bin" -z "$MODELS/tok512.bin" -t 0 -n 48 --timeline "$TMP/run.html" \
        > /dev/null 2>&1 || fail "run --timeline"
    grep -q "<svg" "$TMP/run.html" || fail "the timeline page has no chart"
    rm -f "$TMP/run.html"
    # Its decisions as JSON lines, and every component's stats for Prometheus.
    "$LLMEM" run "$MODELS/stories260K.bin" -z "$MODELS/tok512.bin" -t 0 -n 48 --events "$TMP/ev.jsonl" \
        --stats=prometheus > /dev/null 2> "$TMP/prom.txt" || fail "run --events"
    grep -q '^{"t_ms":.*"action":"stage"' "$TMP/ev.jsonl" || fail "no JSON lines of events"
    grep -q '"stage":"prefill"' "$TMP/ev.jsonl" || fail "no prefill in the events"
    for family in llmem_engine_decode_tokens_total llmem_kv_blocks_used llmem_pool_reserved_bytes \
        llmem_controller_stage; do
        grep -q "^$family" "$TMP/prom.txt" || fail "no $family in --stats=prometheus"
    done
    rm -f "$TMP/ev.jsonl" "$TMP/prom.txt"
    # A corrupt model: truncated.
    head -c 100000 "$MODELS/stories260K.bin" > "$TMP/short.bin"
    "$LLMEM" run "$TMP/short.bin" -z "$MODELS/tok512.bin" -n 4 2> "$TMP/err.txt" && fail "a truncated model ran"
    grep -q "llmem run" "$TMP/err.txt" || fail "no message for a truncated model"
    # A llama2.c model without -z.
    "$LLMEM" run "$MODELS/stories260K.bin" -n 4 2> "$TMP/err.txt" && fail "ran without a tokenizer"
    grep -q -- "-z" "$TMP/err.txt" || fail "no hint about -z"
    rm -f "$TMP"/*.ids "$TMP"/*.txt "$TMP"/synth.* "$TMP"/short.bin
else
    echo "skipped: $MODELS/stories260K.bin or $MODELS/reference is absent (the shared data folder: set LLMEM_SHARED_DIR, or put shared/ beside the checkout)"
    exit 77
fi
exit 0
