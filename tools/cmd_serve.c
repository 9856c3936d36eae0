/*
 * cmd_serve.c - `llmem serve MODEL`: an OpenAI-compatible HTTP server
 * (llmem/server.h does the work; this parses the arguments, starts it,
 * waits for SIGTERM or SIGINT, and shuts it down within the drain
 * deadline).
 *
 * Signals: SIGTERM and SIGINT are blocked in every thread (the mask is set
 * before the server starts its threads) and taken here by sigwait, so no
 * handler runs inside the library. The exit status is 0 after a clean
 * shutdown with no mapping left behind, 1 otherwise, 2 for bad arguments.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "tool_util.h"
#include "llmem/llmem.h"
#include "llmem/server.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem serve MODEL [-z TOKENIZER] [--host ADDR] [--port N] [--api-key KEY]\n"
            "                   [--model-name NAME] [--chat-template auto|llama2|chatml|none]\n"
            "                   [--kv-budget BYTES] [--kv paged|static|buckets] [--kv-dtype f32|f16]\n"
            "                   [--no-prefix-cache] [--swap BYTES] [--max-batch N] [--max-step-tokens N]\n"
            "                   [--max-seq-len N] [--threads N] [--max-waiting N] [--max-body BYTES]\n"
            "                   [--max-connections N] [--default-max-tokens N] [--drain-ms N]\n"
            "                   [--idle-decay-ms N] [--fault-probability P] [--fault-seed N] [--access-log]\n"
            "                   [--port-file FILE]\n"
            "\n"
            "An OpenAI-compatible server: POST /v1/completions, /v1/chat/completions (stream: true as\n"
            "server-sent events), GET /v1/models, /health, /metrics (Prometheus), / (a live dashboard).\n"
            "  -z PATH              llama2.c tokenizer.bin (default: the vocabulary inside a GGUF model)\n"
            "  --host ADDR          numeric address to bind (default 127.0.0.1: this machine only)\n"
            "  --port N             port (default 8080; 0: any free port, printed on stdout)\n"
            "  --api-key KEY        require 'Authorization: Bearer KEY' on /v1/... (default: none;\n"
            "                       also $LLMEM_API_KEY)\n"
            "  --model-name NAME    the model's id in requests (default: the file name without extension)\n"
            "  --chat-template T    auto (default: from the GGUF metadata), llama2, chatml, or none\n"
            "                       (chat requests refused, completions served)\n"
            "  --kv-budget BYTES    cap on KV storage (e.g. 64MiB; default none)\n"
            "  --kv S               KV strategy: paged (default), static, buckets\n"
            "  --kv-dtype D         f32 (default) or f16\n"
            "  --no-prefix-cache    do not reuse cached prompt blocks\n"
            "  --swap BYTES         host memory preempted sequences wait in (paged; default 0: recompute)\n"
            "  --max-batch N        sequences running at once (default 16)\n"
            "  --max-step-tokens N  tokens in one step, prefill chunks and decodes (default 512)\n"
            "  --max-seq-len N      tokens a sequence may hold (default: the model's context)\n"
            "  --threads N          kernel threads (default: online CPUs)\n"
            "  --max-waiting N      requests queued at most; past it 429 (default 256)\n"
            "  --max-body BYTES     request body limit; past it 413 (default 4MiB)\n"
            "  --max-connections N  connections at once (default 256)\n"
            "  --default-max-tokens N  completions without max_tokens (default 16)\n"
            "  --drain-ms N         on SIGTERM, how long requests in flight may finish (default 10000)\n"
            "  --idle-decay-ms N    idle time before the controller gives memory back (default 1000)\n"
            "  --fault-probability P  testing: each KV/pool commit fails with probability P once serving\n"
            "  --fault-seed N       its seed\n"
            "  --access-log         a line per request on stderr\n"
            "  --port-file FILE     write the port listened on to FILE once listening\n");
}

static int bad(const char *opt, const char *val)
{
    fprintf(stderr, "llmem serve: %s: bad value '%s' (llmem serve --help)\n", opt, val ? val : "");
    return 2;
}

static bool parse_size(const char *s, size_t *out)
{
    double v = tool_parse_bytes(s);
    if (v < 0) return false;
    *out = (size_t)v;
    return true;
}

int llmem_cmd_serve(int argc, char **argv)
{
    llmem_server_options o = llmem_server_options_default();
    uint32_t drain_ms = 10000;
    const char *port_file = NULL;
    o.api_key = getenv("LLMEM_API_KEY");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t u;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
#define NEED()                                                                                                     \
    do {                                                                                                           \
        if (!v) {                                                                                                  \
            fprintf(stderr, "llmem serve: %s needs a value\n", a);                                                 \
            return 2;                                                                                              \
        }                                                                                                          \
        i++;                                                                                                       \
    } while (0)
        if (!strcmp(a, "-z")) { NEED(); o.tokenizer_path = v; }
        else if (!strcmp(a, "--host")) { NEED(); o.host = v; }
        else if (!strcmp(a, "--port")) {
            NEED();
            if (!tool_parse_u32(v, 0, 65535, &u)) return bad(a, v);
            o.port = u ? u : LLMEM_SERVER_PORT_ANY;
        } else if (!strcmp(a, "--api-key")) { NEED(); o.api_key = v; }
        else if (!strcmp(a, "--model-name")) { NEED(); o.model_name = v; }
        else if (!strcmp(a, "--chat-template")) { NEED(); o.chat_template = v; }
        else if (!strcmp(a, "--kv-budget")) { NEED(); if (!parse_size(v, &o.kv_budget_bytes)) return bad(a, v); }
        else if (!strcmp(a, "--swap")) { NEED(); if (!parse_size(v, &o.swap_bytes)) return bad(a, v); }
        else if (!strcmp(a, "--max-body")) {
            NEED();
            if (!parse_size(v, &o.max_body_bytes) || !o.max_body_bytes) return bad(a, v);
        } else if (!strcmp(a, "--kv")) {
            NEED();
            if (!strcmp(v, "paged")) o.kv_strategy = LLMEM_KV_PAGED;
            else if (!strcmp(v, "static")) o.kv_strategy = LLMEM_KV_STATIC;
            else if (!strcmp(v, "buckets")) o.kv_strategy = LLMEM_KV_BUCKETS;
            else return bad(a, v);
        } else if (!strcmp(a, "--kv-dtype")) {
            NEED();
            if (!strcmp(v, "f32")) o.kv_dtype = LLMEM_KV_F32;
            else if (!strcmp(v, "f16")) o.kv_dtype = LLMEM_KV_F16;
            else return bad(a, v);
        } else if (!strcmp(a, "--no-prefix-cache")) o.no_prefix_cache = true;
        else if (!strcmp(a, "--access-log")) o.access_log = true;
        else if (!strcmp(a, "--max-batch")) { NEED(); if (!tool_parse_u32(v, 1, 4096, &o.max_batch)) return bad(a, v); }
        else if (!strcmp(a, "--max-step-tokens")) {
            NEED();
            if (!tool_parse_u32(v, 1, 1u << 20, &o.max_step_tokens)) return bad(a, v);
        } else if (!strcmp(a, "--max-seq-len")) {
            NEED();
            if (!tool_parse_u32(v, 2, 1u << 24, &o.max_seq_len)) return bad(a, v);
        } else if (!strcmp(a, "--threads")) {
            NEED();
            if (!tool_parse_u32(v, 1, 1024, &u)) return bad(a, v);
            o.threads = u;
        } else if (!strcmp(a, "--max-waiting")) {
            NEED();
            if (!tool_parse_u32(v, 1, 1u << 20, &o.max_waiting)) return bad(a, v);
        } else if (!strcmp(a, "--max-connections")) {
            NEED();
            if (!tool_parse_u32(v, 1, 65536, &o.max_connections)) return bad(a, v);
        } else if (!strcmp(a, "--default-max-tokens")) {
            NEED();
            if (!tool_parse_u32(v, 1, 1u << 24, &o.default_max_tokens)) return bad(a, v);
        } else if (!strcmp(a, "--drain-ms")) {
            NEED();
            if (!tool_parse_u32(v, 0, 3600u * 1000, &drain_ms)) return bad(a, v);
        } else if (!strcmp(a, "--fault-probability")) {
            NEED();
            char *end;
            errno = 0;
            o.fault_probability = strtod(v, &end);
            if (errno || end == v || *end || !(o.fault_probability >= 0 && o.fault_probability <= 1)) return bad(a, v);
        } else if (!strcmp(a, "--fault-seed")) {
            NEED();
            if (!tool_parse_u32(v, 0, UINT32_MAX, &u)) return bad(a, v);
            o.fault_seed = u;
        } else if (!strcmp(a, "--idle-decay-ms")) {
            NEED();
            if (!tool_parse_u32(v, 1, 3600u * 1000, &o.idle_decay_ms)) return bad(a, v);
        } else if (!strcmp(a, "--port-file")) { NEED(); port_file = v; }
        else if (a[0] == '-') {
            fprintf(stderr, "llmem serve: unknown option %s (llmem serve --help)\n", a);
            return 2;
        } else if (!o.model_path) o.model_path = a;
        else {
            fprintf(stderr, "llmem serve: one model only (got %s and %s)\n", o.model_path, a);
            return 2;
        }
#undef NEED
    }
    if (!o.model_path) {
        usage(stderr);
        return 2;
    }

    /* Blocked before any thread starts, so every thread inherits it. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    llmem_server *s;
    llmem_status st = llmem_server_create(&o, &s);
    if (st) {
        fprintf(stderr, "llmem serve: %s (%s)\n", llmem_error_message(), llmem_status_name(st));
        return 1;
    }
    printf("llmem serve: %s on http://%s:%u/ (chat template %s)\n", llmem_server_model_name(s),
           o.host ? o.host : "127.0.0.1", llmem_server_port(s), llmem_server_chat_template(s));
    fflush(stdout);
    if (port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%u\n", llmem_server_port(s)) < 0 || fclose(f) || rename(tmp, port_file)) {
            fprintf(stderr, "llmem serve: cannot write %s: %s\n", port_file, strerror(errno));
            llmem_server_destroy(s);
            return 1;
        }
    }
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "llmem serve: %s: draining (up to %u ms)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", drain_ms);
    llmem_server_shutdown_report rep;
    st = llmem_server_shutdown(s, drain_ms, &rep);
    llmem_server_destroy(s);
    if (st) {
        fprintf(stderr, "llmem serve: shutdown: %s\n", llmem_error_message());
        return 1;
    }
    fprintf(stderr,
            "llmem serve: stopped in %.3f s: %u requests finished, %u cancelled; %llu mappings (%llu bytes) left\n",
            rep.seconds, rep.finished, rep.cancelled, (unsigned long long)rep.leaked_mappings,
            (unsigned long long)rep.leaked_bytes);
    return rep.leaked_mappings ? 1 : 0;
}
