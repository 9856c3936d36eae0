#!/bin/sh
# serve_chatml.sh LLMEM - a ChatML model served end to end, driven by curl.
# The model is synthetic: `llmem synth --chat-template chatml` writes a
# ChatML tokenizer.chat_template into the GGUF and makes the made-up
# vocabulary's last two tokens <|im_start|> and <|im_end|> (llmem/synth.h),
# so the server picks the template from the metadata (no flag).
#  - the prompt the model got (prompt_token_ids, return_token_ids) equals
#    the template rendered by hand here, from the made-up vocabulary's
#    layout: <unk> <s> </s>, the 256 byte tokens (newline is <0x0A>, id
#    13), then the printable ASCII characters from id 259; messages without
#    spaces so no "▁" merge applies; text after a special token gets no
#    dummy prefix;
#  - the chat answer equals a completion of those ids (greedy): chat is the
#    rendered prompt, nothing else;
#  - the KV is f32 by default (64 bytes a token here), as documented;
#  - 20 streamed chats each report usage and token_ids for every token they
#    streamed (a request that finished before llmem_sched_submit returned
#    once reported 0 tokens);
#  - a model whose metadata names ChatML but whose vocabulary lacks its
#    tokens (--bpe: no <|im_start|>) refuses chat with 400
#    chat_template_unavailable saying why, and still serves completions.
# Exit 0 pass, 1 fail, 77 skipped (no curl or python3).
set -u
llmem=$1
. "$(dirname "$0")/serve_lib.sh"
need curl "curl is not installed (scripts/deps.sh test)"
need python3 "python3 is not installed (scripts/deps.sh test)"
serve_lib_init serve_chatml
serve() { serve_start server "$@" --threads 1; }

post() { # PATH BODY -> $work/body, $code
    code=$(curl -s -o "$work/body" -w '%{http_code}' -H 'Content-Type: application/json' \
        --data-binary "$2" "http://127.0.0.1:$port$1") || fail "curl $1"
}

"$llmem" synth --shape tiny-random --chat-template chatml -o "$work/chatml.gguf" >/dev/null 2>&1 ||
    fail "llmem synth --chat-template chatml"
"$llmem" synth --shape tiny-random --chat-template nonsense -o "$work/never.gguf" >/dev/null 2>&1 &&
    fail "llmem synth accepted an unknown chat template"
[ -e "$work/never.gguf" ] && fail "llmem synth wrote a file for an unknown chat template"

serve "$work/chatml.gguf"
grep -q 'chat template chatml' "$work/server.log" || fail "the server did not pick ChatML from the metadata"

msgs='[{"role":"system","content":"Be:brief."},{"role":"user","content":"hi!"},{"role":"assistant","content":"ok"},{"role":"user","content":"2+2?"}]'
post /v1/chat/completions "{\"messages\":$msgs,\"max_tokens\":6,\"temperature\":0,\"return_token_ids\":true}"
[ "$code" = 200 ] || fail "chat: HTTP $code: $(cat "$work/body")"
cp "$work/body" "$work/chat.json"
python3 - "$work/chat.json" "$msgs" >"$work/rendered" <<'EOF' || fail "the rendered prompt is not the template's"
import json, sys
resp = json.load(open(sys.argv[1]))
msgs = json.loads(sys.argv[2])
V = 32000
IM_START, IM_END = V - 2, V - 1
def text(s):  # no spaces: one token a character; newline is the byte token <0x0A>
    return [13 if c == "\n" else 259 + ord(c) - 32 for c in s]
want = []
for m in msgs:
    want += [IM_START] + text(m["role"] + "\n" + m["content"]) + [IM_END] + text("\n")
want += [IM_START] + text("assistant\n")
got = resp.get("prompt_token_ids")
if got != want:
    sys.exit("prompt_token_ids %s\n         by hand %s" % (got, want))
if resp["usage"]["prompt_tokens"] != len(want):
    sys.exit("usage.prompt_tokens %d, the rendering has %d" % (resp["usage"]["prompt_tokens"], len(want)))
c = resp["choices"][0]
if len(c["token_ids"]) != resp["usage"]["completion_tokens"] or not c["token_ids"]:
    sys.exit("token_ids %s against completion_tokens %d" % (c["token_ids"], resp["usage"]["completion_tokens"]))
print(json.dumps(want))
EOF

# The same ids as a completion: the same greedy answer.
post /v1/completions "{\"prompt\":$(cat "$work/rendered"),\"max_tokens\":6,\"temperature\":0,\"return_token_ids\":true}"
[ "$code" = 200 ] || fail "completion of the rendered ids: HTTP $code"
python3 - "$work/chat.json" "$work/body" <<'EOF' || fail "chat and the completion of its rendered prompt differ"
import json, sys
chat, comp = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
a, b = chat["choices"][0], comp["choices"][0]
if a["token_ids"] != b["token_ids"] or a["message"]["content"] != b["text"]:
    sys.exit("chat %s %r\ncompletion %s %r" % (a["token_ids"], a["message"]["content"], b["token_ids"], b["text"]))
EOF

# The KV holds f32 by default, as documented (and as llmem run): tiny-random
# has 1 layer and 2 KV heads of 4, so 2 x 8 x 4 = 64 bytes a token (f16
# would be 32; the zero value of the options once meant f16).
curl -s "http://127.0.0.1:$port/metrics" >"$work/metrics" || fail "GET /metrics"
per=$(awk '/^llmem_kv_bytes_reserved\{/ { b = $2 } /^llmem_kv_tokens_reserved\{/ { t = $2 }
    END { if (t > 0) printf "%d", b / t }' "$work/metrics")
[ "$per" = 64 ] || fail "KV bytes a token: ${per:-none}, want 64 (f32, the documented default)"

# Streamed chats: every one reports what it streamed (checked together).
i=0
while [ $i -lt 20 ]; do
    curl -s -N -H 'Content-Type: application/json' --data-binary \
        "{\"messages\":[{\"role\":\"user\",\"content\":\"n$i\"}],\"max_tokens\":3,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"return_token_ids\":true}" \
        "http://127.0.0.1:$port/v1/chat/completions" >"$work/stream$i" || fail "stream $i"
    i=$((i + 1))
done
python3 - "$work" <<'EOF' || fail "a stream did not report what it streamed"
import json, sys
for i in range(20):
    path = "%s/stream%d" % (sys.argv[1], i)
    chunks = [json.loads(l[6:]) for l in open(path) if l.startswith("data: {")]
    ids, usage, prompt, pieces = None, None, None, 0
    for c in chunks:
        for ch in c["choices"]:
            if ch["delta"].get("content"):
                pieces += 1
            if "token_ids" in ch:
                ids = ch["token_ids"]
        if c.get("usage"):
            usage, prompt = c["usage"], c.get("prompt_token_ids")
    if usage is None or ids is None or prompt is None:
        sys.exit("stream %d: no usage, token_ids or prompt_token_ids: %s" % (i, open(path).read()))
    if usage["completion_tokens"] != len(ids) or len(ids) != 3 or pieces == 0:
        sys.exit("stream %d: usage %s, token_ids %s, %d content chunks" % (i, usage, ids, pieces))
    if usage["prompt_tokens"] != len(prompt) or prompt[0] != 31998:
        sys.exit("stream %d: prompt_token_ids %s, usage %s" % (i, prompt, usage))
EOF
serve_stop

# ChatML in the metadata, no ChatML tokens in the vocabulary.
"$llmem" synth --shape tiny-random --bpe gpt-2 --chat-template chatml -o "$work/broken.gguf" >/dev/null 2>&1 ||
    fail "llmem synth --bpe gpt-2 --chat-template chatml"
serve "$work/broken.gguf"
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
[ "$code" = 400 ] || fail "chat on an unusable template: HTTP $code, want 400"
grep -q '"code":"chat_template_unavailable"' "$work/body" || fail "refusal code: $(cat "$work/body")"
grep -q 'cannot be used: chat template chatml: the vocabulary has no <|im_start|> token' "$work/body" ||
    fail "the refusal does not say why: $(cat "$work/body")"
post /v1/completions '{"prompt":"hi","max_tokens":2,"temperature":0}'
[ "$code" = 200 ] || fail "completions on a model with an unusable template: HTTP $code"
serve_stop
echo "serve_chatml: ChatML from the metadata rendered as by hand, streamed and not; unusable template refused"
