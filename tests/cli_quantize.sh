#!/bin/sh
# cli_quantize.sh - llmem quantize and llmem synth --type end to end.
#
#   tests/cli_quantize.sh LLMEM SHARED_DIR TMP_DIR [models|synth]
#
#   models  the shared stories260K.gguf converted to q8_0 and q4_k_m runs
#           (exit 77, skipped, when the shared folder lacks it)
#   synth   a synthetic q6_k model runs, is converted to q4_0 and still
#           runs; bad arguments are refused with status 2 (a bad type) or
#           1 (a missing input) and leave no file (no shared data needed)
#
# The shared folder is $LLMEM_SHARED_DIR when set, else SHARED_DIR (the
# convention of tests/test_util.h).
set -eu
LLMEM=$1
MODEL=${LLMEM_SHARED_DIR:-$2}/models/stories260K.gguf
TMP=$3
mode=${4:-models}
rm -rf "$TMP"
mkdir -p "$TMP"
if [ "$mode" = models ]; then
    [ -f "$MODEL" ] || { echo "skipped: $MODEL is absent (the shared data folder: set LLMEM_SHARED_DIR, or put shared/ beside the checkout)"; exit 77; }
    for t in q8_0 q4_k_m; do
        "$LLMEM" quantize "$MODEL" "$TMP/$t.gguf" --type "$t" 2>"$TMP/$t.err"
        grep -q "wrote $TMP/$t.gguf: 48 tensors" "$TMP/$t.err" || { cat "$TMP/$t.err"; exit 1; }
        n=$("$LLMEM" run "$TMP/$t.gguf" -t 0 -n 40 -i "Once upon a time" --print-ids --threads 1 2>/dev/null | wc -w)
        [ "$n" -eq 41 ] || { echo "cli_quantize: $t: $n ids, want 41"; exit 1; }
    done
    rm -rf "$TMP"
    echo "cli_quantize: stories260K's q8_0 and q4_k_m conversions run"
    exit 0
fi
"$LLMEM" synth --shape "$TMP/none.json" -o "$TMP/x.gguf" 2>/dev/null && exit 1
printf '{"hidden_size":256,"intermediate_size":512,"num_hidden_layers":1,"num_attention_heads":4,"vocab_size":400,"max_position_embeddings":64}' >"$TMP/shape.json"
"$LLMEM" synth --shape "$TMP/shape.json" --type f32 -o "$TMP/f32.gguf" 2>/dev/null
"$LLMEM" synth --shape "$TMP/shape.json" --type q6_k -o "$TMP/q6.gguf" 2>/dev/null
n=$("$LLMEM" run "$TMP/q6.gguf" -t 0 -n 8 -i "a b" --print-ids --threads 1 2>/dev/null | wc -w)
[ "$n" -ge 3 ] || { echo "cli_quantize: synth q6_k ran to $n ids"; exit 1; }
"$LLMEM" quantize "$TMP/f32.gguf" "$TMP/q4.gguf" --type q4_0 2>"$TMP/q4.err" || { cat "$TMP/q4.err"; exit 1; }
n=$("$LLMEM" run "$TMP/q4.gguf" -t 0 -n 8 -i "a b" --print-ids --threads 1 2>/dev/null | wc -w)
[ "$n" -ge 3 ] || { echo "cli_quantize: quantized q4_0 ran to $n ids"; exit 1; }
rc=0
"$LLMEM" quantize "$TMP/f32.gguf" "$TMP/bad.gguf" --type q7_0 2>/dev/null || rc=$?
[ $rc -eq 2 ] && [ ! -e "$TMP/bad.gguf" ] || { echo "cli_quantize: a bad type gave status $rc"; exit 1; }
rc=0
"$LLMEM" quantize "$TMP/missing.gguf" "$TMP/bad.gguf" --type q8_0 2>/dev/null || rc=$?
[ $rc -eq 1 ] && [ ! -e "$TMP/bad.gguf" ] || { echo "cli_quantize: a missing input gave status $rc"; exit 1; }
rm -rf "$TMP"
echo "cli_quantize: synth q6_k runs, f32 -> q4_0 runs, bad input refused"
