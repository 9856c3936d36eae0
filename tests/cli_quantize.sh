#!/bin/sh
# cli_quantize.sh - llmem quantize and llmem synth --type end to end: a
# real model converted to two types runs, a synthetic k-quant model runs,
# bad arguments are refused with status 2 and leave no file.
#
#   tests/cli_quantize.sh LLMEM SHARED_DIR TMP_DIR
set -eu
LLMEM=$1
MODEL=$2/models/stories260K.gguf
TMP=$3
[ -f "$MODEL" ] || { echo "cli_quantize: SKIPPED: $MODEL is absent"; exit 77; }
rm -rf "$TMP"
mkdir -p "$TMP"
for t in q8_0 q4_k_m; do
    "$LLMEM" quantize "$MODEL" "$TMP/$t.gguf" --type "$t" 2>"$TMP/$t.err"
    grep -q "wrote $TMP/$t.gguf: 48 tensors" "$TMP/$t.err" || { cat "$TMP/$t.err"; exit 1; }
    n=$("$LLMEM" run "$TMP/$t.gguf" -t 0 -n 40 -i "Once upon a time" --print-ids --threads 1 2>/dev/null | wc -w)
    [ "$n" -eq 41 ] || { echo "cli_quantize: $t: $n ids, want 41"; exit 1; }
done
"$LLMEM" synth --shape "$TMP/none.json" -o "$TMP/x.gguf" 2>/dev/null && exit 1
printf '{"hidden_size":256,"intermediate_size":512,"num_hidden_layers":1,"num_attention_heads":4,"vocab_size":400,"max_position_embeddings":64}' >"$TMP/shape.json"
"$LLMEM" synth --shape "$TMP/shape.json" --type q6_k -o "$TMP/q6.gguf" 2>/dev/null
n=$("$LLMEM" run "$TMP/q6.gguf" -t 0 -n 8 -i "a b" --print-ids --threads 1 2>/dev/null | wc -w)
[ "$n" -ge 3 ] || { echo "cli_quantize: synth q6_k ran to $n ids"; exit 1; }
rc=0
"$LLMEM" quantize "$MODEL" "$TMP/bad.gguf" --type q7_0 2>/dev/null || rc=$?
[ $rc -eq 2 ] && [ ! -e "$TMP/bad.gguf" ] || { echo "cli_quantize: a bad type gave status $rc"; exit 1; }
rc=0
"$LLMEM" quantize "$TMP/missing.gguf" "$TMP/bad.gguf" --type q8_0 2>/dev/null || rc=$?
[ $rc -eq 1 ] && [ ! -e "$TMP/bad.gguf" ] || { echo "cli_quantize: a missing input gave status $rc"; exit 1; }
rm -rf "$TMP"
echo "cli_quantize: q8_0 and q4_k_m conversions run, synth q6_k runs, bad input refused"
