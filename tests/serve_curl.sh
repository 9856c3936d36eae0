#!/bin/sh
# serve_curl.sh LLMEM - `llmem serve` driven by curl over loopback: every
# endpoint, the errors a hostile or careless client gets, a client that
# disconnects mid-stream, a full queue, and SIGTERM with a request in
# flight (exit 0, no mapping left). The model is synthetic (llmem synth
# tiny-random: a made-up vocabulary, meaningless text, real engine), so
# this runs without the shared data folder; greedy equality with
# `llmem run` on the real models is tests/serve_openai.sh's.
# Exit 0 pass, 1 fail, 77 skipped (no curl).
set -u
llmem=$1
. "$(dirname "$0")/serve_lib.sh"
need curl "curl is not installed (scripts/deps.sh test)"
serve_lib_init serve_curl

"$llmem" synth --shape tiny-random -o "$work/m.gguf" >/dev/null 2>&1 || fail "llmem synth"
# The first server's model costs about 40 times tiny-random's a token (same
# vocabulary and context), so its long requests run for seconds, not a
# fraction of one: the full-queue check needs two of them running at once,
# and a loaded machine starts a curl late (once both had finished before
# the poll saw them together: 2,000 tokens each in well under a second).
mkdir -p "$work/heavy"
printf '%s' '{"hidden_size":256,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":4,
 "intermediate_size":512,"vocab_size":32000,"max_position_embeddings":4096}' >"$work/heavy/config.json"
"$llmem" synth --shape "$work/heavy/config.json" --type q8_0 -o "$work/heavy/m.gguf" >/dev/null 2>&1 ||
    fail "llmem synth (the first server's model)"
model="$work/m.gguf"

# start NAME ARGS...: a server of $model on a free port; sets $port and $pid.
start() {
    name=$1
    shift
    serve_start "$name" "$model" --threads 1 "$@"
}

# req METHOD PATH [BODY-FILE] [curl args...]: $code gets the status, $work/body the body.
req() {
    m=$1
    p=$2
    shift 2
    if [ $# -gt 0 ] && [ -f "$1" ]; then
        d=$1
        shift
        code=$(curl -s -o "$work/body" -D "$work/headers" -w '%{http_code}' -X "$m" --data-binary @"$d" "$@" \
            "http://127.0.0.1:$port$p")
    else
        code=$(curl -s -o "$work/body" -D "$work/headers" -w '%{http_code}' -X "$m" "$@" "http://127.0.0.1:$port$p")
    fi
}
json() { printf '%s' "$1" >"$work/req.json"; echo "$work/req.json"; }
expect_code() { [ "$code" = "$1" ] || fail "$2: status $code, wanted $1: $(head -c 400 "$work/body")"; }
expect_body() { grep -Eq -- "$1" "$work/body" || fail "$2: body lacks /$1/: $(head -c 400 "$work/body")"; }
auth="Authorization: Bearer s3cret"

model="$work/heavy/m.gguf"
start a --api-key s3cret --max-body 65536 --max-batch 2 --max-waiting 1 --drain-ms 120000
model="$work/m.gguf"

req GET /health
expect_code 200 "health"
expect_body '"ok"' "health"
req GET /v1/models
expect_code 401 "models without a key"
expect_body '"invalid_api_key"' "401 error object"
req GET /v1/models -H "Authorization: Bearer wrong"
expect_code 401 "models with a wrong key"
req GET /v1/models -H "$auth"
expect_code 200 "models"
expect_body '"id":"m"' "models lists the model"
req GET /nowhere -H "$auth"
expect_code 404 "unknown path"
req GET /v1/completions -H "$auth"
expect_code 405 "GET on a POST endpoint"

# Completions: JSON with usage; greedy is deterministic.
req POST /v1/completions "$(json '{"model":"m","prompt":"hello world","max_tokens":12,"temperature":0}')" -H "$auth"
expect_code 200 "completion"
expect_body '"object":"text_completion"' "completion object"
expect_body '"usage":\{"prompt_tokens":[0-9]+,"completion_tokens":12,"total_tokens":[0-9]+\}' "completion usage"
expect_body '"finish_reason":"length"' "finish reason"
cp "$work/body" "$work/first"
req POST /v1/completions "$(json '{"prompt":"hello world","max_tokens":12,"temperature":0}')" -H "$auth"
t1=$(sed 's/.*"text":"\([^"]*\)".*/\1/' "$work/first")
t2=$(sed 's/.*"text":"\([^"]*\)".*/\1/' "$work/body")
[ -n "$t1" ] && [ "$t1" = "$t2" ] || fail "greedy completions differ: '$t1' / '$t2'"

# Streaming: SSE chunks, the text equal to the non-streamed one, [DONE] last.
req POST /v1/completions "$(json '{"prompt":"hello world","max_tokens":12,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}')" -H "$auth" -N
expect_code 200 "stream"
grep -q '^content-type: text/event-stream' "$work/headers" || grep -qi '^content-type: text/event-stream' "$work/headers" ||
    fail "stream content type"
[ "$(grep -c '^data: ' "$work/body")" -ge 3 ] || fail "stream has too few events"
[ "$(grep '^data: ' "$work/body" | tail -1)" = "data: [DONE]" ] || fail "stream does not end with data: [DONE]"
expect_body '"usage":\{"prompt_tokens"' "stream usage chunk"
st=$(grep '^data: {' "$work/body" | sed -n 's/.*"text":"\([^"]*\)".*/\1/p' | tr -d '\n')
[ "$st" = "$t1" ] || fail "streamed text '$st' differs from '$t1'"

# n > 1 with a seed: reproducible samples.
req POST /v1/completions "$(json '{"prompt":"hello","max_tokens":6,"n":2,"seed":5,"temperature":0.9}')" -H "$auth"
expect_code 200 "n=2"
expect_body '"index":1' "n=2 has two choices"
cp "$work/body" "$work/n2"
req POST /v1/completions "$(json '{"prompt":"hello","max_tokens":6,"n":2,"seed":5,"temperature":0.9}')" -H "$auth"
[ "$(sed 's/"id":"[^"]*","object":"text_completion","created":[0-9]*//' "$work/body")" = \
  "$(sed 's/"id":"[^"]*","object":"text_completion","created":[0-9]*//' "$work/n2")" ] || fail "seeded samples differ"

[ "$(metric llmem_sched_forks_total)" -ge 1 ] || fail "n=2 did not fork the prompt's sequence"
# The prefix cache: the same long prompt twice skips the cached blocks.
pp='{"prompt":"hello world hello world hello world hello world hello world hello world hello world","max_tokens":2}'
req POST /v1/completions "$(json "$pp")" -H "$auth"
h0=$(metric vllm:prefix_cache_hits_total)
req POST /v1/completions "$(json "$pp")" -H "$auth"
expect_code 200 "prefix cache request"
[ "$(metric vllm:prefix_cache_hits_total)" -gt "$h0" ] || fail "the repeated prompt found no cached block"

# Chat without a template: refused clearly; completions still served above.
req POST /v1/chat/completions "$(json '{"messages":[{"role":"user","content":"hi"}]}')" -H "$auth"
expect_code 400 "chat without a template"
expect_body '"code":"chat_template_unavailable"' "chat refusal code"

# Bad input: 400 with OpenAI error objects.
printf '{"prompt":' >"$work/bad.json"
req POST /v1/completions "$work/bad.json" -H "$auth"
expect_code 400 "malformed JSON"
expect_body '^\{"error":\{"message":"[^"]+","type":"invalid_request_error","param":null,"code":null\}\}$' "error object"
req POST /v1/completions "$(json '{"prompt":"x","temperature":"warm"}')" -H "$auth"
expect_code 400 "wrong type"
expect_body '"param":"temperature"' "wrong type names the parameter"
req POST /v1/completions "$(json '{"prompt":"x","model":"gpt-4"}')" -H "$auth"
expect_code 400 "unknown model"
expect_body '"code":"model_not_found"' "unknown model code"
awk 'BEGIN { printf "{\"prompt\":\""; for (i = 0; i < 5000; i++) printf "hello "; printf "\"}" }' >"$work/long.json"
req POST /v1/completions "$work/long.json" -H "$auth"
expect_code 400 "prompt over the context"
expect_body 'maximum context length is 4096 tokens. However, your prompt has [0-9]+ tokens' "context numbers"
expect_body '"code":"context_length_exceeded"' "context code"
awk 'BEGIN { printf "{\"prompt\":\""; for (i = 0; i < 70000; i++) printf "a"; printf "\"}" }' >"$work/big.json"
req POST /v1/completions "$work/big.json" -H "$auth"
expect_code 413 "body over the limit"
req POST /v1/completions "$work/big.json" -H "$auth" -H "Transfer-Encoding: chunked"
expect_code 413 "chunked body over the limit"

# A full queue: two running (max-batch 2), one waiting (max-waiting 1), the next 429.
long='{"prompt":"hello","max_tokens":4000,"temperature":0,"stream":true}'
curl -s -N -H "$auth" --data-binary "$long" "http://127.0.0.1:$port/v1/completions" >"$work/run1.out" &
c1=$!
# The first must be running before the second comes: until the step loop
# takes it, it is the one request waiting, and the second would find the
# queue full (seen once in 7 runs).
wait_metric vllm:num_requests_running 1
curl -s -N -H "$auth" --data-binary "$long" "http://127.0.0.1:$port/v1/completions" >"$work/run1b.out" &
c1b=$!
wait_metric vllm:num_requests_running 2
curl -s -N -H "$auth" --data-binary '{"prompt":"hello","max_tokens":5,"stream":true}' \
    "http://127.0.0.1:$port/v1/completions" >"$work/run2.out" &
c2=$!
wait_metric vllm:num_requests_waiting 1
req POST /v1/completions "$(json "$long")" -H "$auth"
expect_code 429 "full queue"
grep -qi '^retry-after: [0-9]' "$work/headers" || fail "429 without Retry-After"
expect_body '"type":"rate_limit_error"' "429 error object"
# The client of the running request goes away: its request is cancelled.
kill "$c1"
wait "$c1" 2>/dev/null
wait_metric llmem_server_client_disconnects_total 1
[ "$(metric llmem_sched_requests_cancelled_total)" -ge 1 ] || fail "the disconnected request was not cancelled"
kill "$c1b" 2>/dev/null
wait "$c1b" 2>/dev/null
wait "$c2"
[ "$(tail -c 14 "$work/run2.out")" = "data: [DONE]
" ] || tail -2 "$work/run2.out" | grep -q '^data: \[DONE\]' || fail "the waiting request did not finish"

# The killed client's request ends when the server sees its socket close
# (polled every 50 ms, then a step): under a loaded sanitizer build that
# can come after c2 finished, so wait for it before reading the gauges.
wait_metric vllm:num_requests_running 0
# Metrics: vLLM names and llmem's components.
curl -s "http://127.0.0.1:$port/metrics" >"$work/metrics"
for m in 'vllm:num_requests_running\{model_name="m"\} 0' 'vllm:num_requests_waiting' 'vllm:kv_cache_usage_perc' \
    'vllm:prefix_cache_queries_total' 'vllm:prefix_cache_hits_total' 'vllm:num_preemptions_total' \
    'vllm:prompt_tokens_total' 'vllm:generation_tokens_total' \
    'vllm:time_to_first_token_seconds_bucket\{model_name="m",le="\+Inf"\} [1-9]' \
    'vllm:time_per_output_token_seconds_count' 'vllm:e2e_request_latency_seconds_sum' \
    'llmem_server_http_429_total\{model_name="m"\} 1' 'llmem_server_http_413_total\{model_name="m"\} 2' \
    'llmem_server_http_401_total\{model_name="m"\} 2' 'llmem_kv_' 'llmem_pool_' 'llmem_engine_' 'llmem_controller_' \
    'llmem_tracking_live_mappings'; do
    grep -Eq -- "$m" "$work/metrics" || fail "metrics lack /$m/"
done
# The server's own step model, fitted on the steps it ran: at least the 4
# points a fit needs, costs finite and not negative, a step costing
# something, and an error that is a fraction.
awk '/^llmem_step_model_/ { v[$1] = $2 }
     END { n = v["llmem_step_model_fit_steps{model_name=\"m\"}"]
           c0 = v["llmem_step_model_c0_seconds{model_name=\"m\"}"]; cp = v["llmem_step_model_prefill_token_seconds{model_name=\"m\"}"]
           cd = v["llmem_step_model_decode_seq_seconds{model_name=\"m\"}"]; e = v["llmem_step_model_fit_error{model_name=\"m\"}"]
           if (n < 4 || c0 == "" || cp == "" || cd == "" || c0 < 0 || cp < 0 || cd < 0 || c0 + cp + cd <= 0 || e < 0 || e > 10)
               { print "step model: steps " n " c0 " c0 " prefill " cp " decode " cd " error " e; exit 1 } }' \
    "$work/metrics" || fail "no usable step model in /metrics"
# The dashboard and its data.
req GET /
expect_code 200 "dashboard"
expect_body 'llmem/timeline' "dashboard polls its data"
req GET '/llmem/timeline?since=0'
expect_code 200 "timeline"
expect_body '"samples":\[\{"t":' "timeline samples"

# SIGTERM with a request in flight (300 tokens x 2 on the heavier model:
# about a second here, 20 s under TSan): it finishes within the drain (120 s:
# TSan on a loaded machine is slow), exit 0.
curl -s -N -H "$auth" --data-binary '{"prompt":"hello","max_tokens":300,"n":2,"temperature":0,"stream":true}' \
    "http://127.0.0.1:$port/v1/completions" >"$work/drain.out" &
c3=$!
wait_metric vllm:num_requests_running 1
serve_stop
wait "$c3"
grep -Eq 'stopped in .*: 1 requests finished, 0 cancelled; 0 mappings \(0 bytes\) left' "$work/a.log" || fail "shutdown report: $(tail -1 "$work/a.log")"
tail -2 "$work/drain.out" | grep -q '^data: \[DONE\]' || fail "the request in flight at SIGTERM was cut short"
pids=""

# Preemption through the server: a KV budget of 8 blocks (4 KiB on this
# model), room for one sample of 110 tokens; n=4 forks the prompt into
# four samples that outgrow it, so samples are swapped out (--swap) and
# back in, again and again; greedy, every sample equals the request run
# alone (one curl: nothing here depends on timing).
start c --kv-budget 4096 --swap 1MiB --max-batch 4
texts() { grep -o '"text":"[^"]*"' "$1"; }
curl -s --data-binary '{"prompt":"story 1","max_tokens":110,"temperature":0}' \
    "http://127.0.0.1:$port/v1/completions" >"$work/alone"
curl -s --data-binary '{"prompt":"story 1","max_tokens":110,"temperature":0,"n":4}' \
    "http://127.0.0.1:$port/v1/completions" >"$work/n4"
grep -q '"finish_reason":"length"' "$work/alone" || fail "alone: $(head -c 300 "$work/alone")"
[ "$(texts "$work/n4" | wc -l)" = 4 ] || fail "n=4: $(head -c 300 "$work/n4")"
[ "$(texts "$work/n4" | sort -u)" = "$(texts "$work/alone")" ] ||
    fail "samples under preemption differ from the run alone: $(head -c 400 "$work/n4")"
[ "$(metric llmem_sched_preemptions_swap_total)" -ge 1 ] || fail "no preemption swapped out (budget too large?)"
[ "$(metric llmem_sched_swap_ins_total)" -ge 1 ] || fail "no sequence swapped back in"
serve_stop
grep -q '0 mappings (0 bytes) left' "$work/c.log" || fail "preemption server: $(tail -1 "$work/c.log")"
pids=""

# A server with the llama-2 chat template: chat served, streamed; a
# deadline of 0 cancels what runs at SIGTERM, and it still exits 0.
start b --chat-template llama2 --drain-ms 0
req POST /v1/chat/completions "$(json '{"messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0}')"
expect_code 200 "chat"
expect_body '"object":"chat.completion"' "chat object"
expect_body '"message":\{"role":"assistant","content":' "chat message"
req POST /v1/chat/completions "$(json '{"messages":[{"role":"assistant","content":"x"}]}')"
expect_code 400 "chat roles the template cannot express"
req POST /v1/chat/completions "$(json '{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}')" -N
expect_code 200 "chat stream"
expect_body '"delta":\{"role":"assistant"' "chat stream role"
curl -s -N --data-binary '{"prompt":"hello","max_tokens":4000,"n":8,"temperature":0,"stream":true}' \
    "http://127.0.0.1:$port/v1/completions" >"$work/cut.out" &
c4=$!
wait_metric vllm:num_requests_running 1
serve_stop
wait "$c4"
grep -Eq 'stopped in .*, 1 cancelled; 0 mappings' "$work/b.log" || fail "drain-0 report: $(tail -1 "$work/b.log")"
grep -q 'shutting down' "$work/cut.out" || fail "the cancelled stream did not say why"
pids=""
serve_sanitizer_check
echo "serve_curl: all checks passed"
