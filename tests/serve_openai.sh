#!/bin/sh
# serve_openai.sh LLMEM NPMDIR [--shared DIR] - `llmem serve` driven by the
# official OpenAI client from the npm registry (tests/serve_openai.cjs;
# installed into NPMDIR by tests/npm_openai.sh). Skipped (77) without
# node, npm or the registry.
#  - without --shared: a synthetic model (llmem synth tiny-random) with
#    the llama-2 chat template: completions and chat, streamed and not,
#    errors, 16 concurrent streaming clients equal to their runs alone;
#    then a ChatML model (llmem synth --chat-template chatml, the template
#    from its metadata): the rendered prompt equals the template by hand;
#  - --shared DIR: the real models of DIR/models (stories260K.bin with
#    tok512.bin, stories260K.gguf): greedy output through the server equals
#    `llmem run -t 0` token for token on three prompts. Skipped (77)
#    without them ($LLMEM_SHARED_DIR wins over DIR, as everywhere).
set -u
llmem=$1
npmdir=$2
shared=""
[ "${3:-}" = "--shared" ] && shared=${LLMEM_SHARED_DIR:-$4}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/serve_lib.sh"
sh "$here/npm_openai.sh" "$npmdir" || exit $?
npmdir=$(cd "$npmdir" && pwd)
if [ -n "$shared" ]; then
    for f in models/stories260K.bin models/tok512.bin models/stories260K.gguf; do
        [ -r "$shared/$f" ] || { echo "skipped: $shared/$f is absent (the shared data folder)"; exit 77; }
    done
fi
serve_lib_init serve_openai
if [ -z "$shared" ]; then
    "$llmem" synth --shape tiny-random -o "$work/m.gguf" >/dev/null 2>&1 || fail "llmem synth"
    serve_start server "$work/m.gguf" --chat-template llama2 --max-batch 16 --threads 2
    node "$here/serve_openai.cjs" "$npmdir" "$port" basic || fail "the OpenAI client checks"
    serve_stop
    "$llmem" synth --shape tiny-random --chat-template chatml -o "$work/chatml.gguf" >/dev/null 2>&1 ||
        fail "llmem synth --chat-template chatml"
    serve_start server "$work/chatml.gguf" --threads 2
    node "$here/serve_openai.cjs" "$npmdir" "$port" chatml || fail "the OpenAI client's ChatML checks"
    serve_stop
    exit 0
fi

m=$shared/models
# greedy NAME MODEL [-z TOK]: llmem run's ids for each prompt, then the server's.
greedy() {
    name=$1
    shift
    : >"$work/expect"
    for prompt in "" "Once upon a time" "Lily liked"; do
        ids=$("$llmem" run "$@" -i "$prompt" -t 0 -n 96 --print-ids --threads 1 2>/dev/null | head -1) ||
            fail "llmem run $name"
        printf '"%s"\t96\t%s\n' "$prompt" "$ids" >>"$work/expect"
    done
    serve_start server "$@" --threads 2 --max-batch 4
    node "$here/serve_openai.cjs" "$npmdir" "$port" greedy "$work/expect" || fail "greedy equality on $name"
    serve_stop
}
greedy stories260K.bin "$m/stories260K.bin" -z "$m/tok512.bin"
greedy stories260K.gguf "$m/stories260K.gguf"
echo "serve_openai: the server's greedy output equals llmem run's on both model files"
