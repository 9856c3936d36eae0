/*
 * llmem/server.h - an OpenAI-compatible HTTP server over the engine and
 * the continuous-batching scheduler (`llmem serve`).
 *
 * One call builds everything a model needs to be served: the model mapped,
 * its tokenizer, the stage-aware memory (llmem/memctl.h: pool, predictor,
 * controller) over a tracking resource (so shutdown can say no mapping
 * leaked), the engine, the scheduler (llmem/sched.h) and its step-loop
 * thread, and an HTTP/1.1 daemon (GNU libmicrohttpd, one thread per
 * connection) bound to the loopback address unless told otherwise.
 *
 * Endpoints:
 *   POST /v1/completions, /v1/chat/completions  OpenAI's; "stream": true
 *       answers server-sent events ending "data: [DONE]" (llmem/openai.h
 *       for what is taken); otherwise one JSON body with "usage"
 *   GET  /v1/models     the one model served
 *   GET  /health        200 while serving, 503 while shutting down
 *   GET  /metrics       Prometheus text: vLLM's metric names where one
 *       exists (vllm:num_requests_running, ...), then every llmem
 *       component's stats through the exporter (llmem/stats.h)
 *   GET  /              a live dashboard (one self-contained page in the
 *       binary) polling GET /llmem/timeline, the JSON of the memory
 *       timeline, requests in flight, latency percentiles
 * With an API key set, /v1/... needs "Authorization: Bearer KEY" (401
 * otherwise); /health, /metrics and the dashboard do not, as vLLM's.
 *
 * Errors are OpenAI error objects {"error": {"message", "type", "param",
 * "code"}}: 400 for malformed JSON, wrong types, an unknown model, a
 * prompt longer than the context (both numbers in the message); 413 for a
 * body over max_body_bytes; 429 with Retry-After when max_waiting requests
 * are queued; 503 with Retry-After while shutting down; 404/405 for
 * unknown paths and methods. A client that goes away (the connection
 * closes while its request waits or streams) cancels the request, and its
 * KV is freed at once.
 *
 * Threads: create, shutdown and destroy from one thread; the port and
 * stats from any.
 */
#ifndef LLMEM_SERVER_H
#define LLMEM_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/kv.h"
#include "llmem/stats.h"
#include "llmem/status.h"
#include "llmem/step_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_server llmem_server;

#define LLMEM_SERVER_PORT_ANY 65536u /* llmem_server_options.port: any free port */

/* Zero fields mean the default. */
typedef struct llmem_server_options {
    const char *model_path;       /* required: GGUF, or llama2.c .bin with tokenizer_path */
    const char *tokenizer_path;   /* llama2.c tokenizer.bin; default the GGUF's own vocabulary */
    const char *model_name;       /* the model's id in requests and /v1/models; default the file name
                                     without its directory and extension */
    const char *host;             /* address to bind; default "127.0.0.1" */
    uint32_t port;                /* default 8080; LLMEM_SERVER_PORT_ANY: a free one (llmem_server_port) */
    const char *api_key;          /* optional: required as a bearer token on /v1/... */
    const char *chat_template;    /* "llama2", "chatml", "none"; NULL or "auto": the model's own
                                     (GGUF tokenizer.chat_template), none without one */
    unsigned threads;             /* engine kernel threads; default the online CPUs */
    uint32_t max_batch;           /* sequences running at once; default 16 */
    uint32_t max_step_tokens;     /* tokens in one step; default 512 */
    uint32_t max_seq_len;         /* tokens per sequence; default the model's context */
    size_t kv_budget_bytes;       /* cap on KV storage; 0 = none */
    llmem_kv_strategy kv_strategy; /* default PAGED */
    llmem_kv_dtype kv_dtype;      /* default F32 */
    bool no_prefix_cache;         /* default: the prefix cache is on (PAGED) */
    size_t swap_bytes;            /* host memory preempted sequences may wait in (PAGED); 0 = no swapping:
                                     preemption recomputes */
    uint32_t max_waiting;         /* requests queued at most (429 past it); default 256 */
    size_t max_body_bytes;        /* request body limit (413 past it); default 4 MiB */
    uint32_t max_connections;     /* connections at once; default 256 */
    uint32_t default_max_tokens;  /* completions without max_tokens; default 16 (OpenAI's); chat
                                     requests default to the rest of the context */
    uint32_t idle_decay_ms;       /* the controller's idle decay; default its own (1000) */
    double fault_probability;     /* testing: once serving, each commit of the pool's resource fails
                                     with this probability (a fault-injecting resource); 0 = off */
    uint64_t fault_seed;          /* its generator's seed */
    bool access_log;              /* a line per request on stderr */
} llmem_server_options;

LLMEM_API llmem_server_options llmem_server_options_default(void);

/* Load, build and start listening. LLMEM_EINVAL for bad options (a chat
 * template that is neither name, or one the vocabulary cannot serve),
 * the model's and engine's errors, LLMEM_EOS when the address cannot be
 * bound (the message says why). */
LLMEM_API llmem_status llmem_server_create(const llmem_server_options *o, llmem_server **out);

/* The port listened on (the one picked for PORT_ANY); 0 after shutdown. */
LLMEM_API uint16_t llmem_server_port(const llmem_server *s);

/* The served model's id and context, and the chat template in use
 * ("none" when chat is refused). */
LLMEM_API const char *llmem_server_model_name(const llmem_server *s);
LLMEM_API const char *llmem_server_chat_template(const llmem_server *s);

typedef struct llmem_server_shutdown_report {
    uint32_t finished;            /* requests in flight at the start that finished before the deadline */
    uint32_t cancelled;           /* requests cancelled at the deadline */
    double seconds;               /* how long the shutdown took */
    uint64_t leaked_mappings;     /* mappings the tracking resource still held after teardown (0) */
    uint64_t leaked_bytes;
} llmem_server_shutdown_report;

/* Stop accepting (the listening socket closes; requests arriving on open
 * connections get 503), let requests in flight finish for deadline_ms,
 * cancel those still running, then stop the daemon and the step loop and
 * free engine and memory; the report (optional) says what the tracking
 * resource still holds. A second call does nothing (LLMEM_OK). */
LLMEM_API llmem_status llmem_server_shutdown(llmem_server *s, uint32_t deadline_ms, llmem_server_shutdown_report *out);

/* Shut down (deadline 0) if not done, and free. NULL is a no-op. */
LLMEM_API void llmem_server_destroy(llmem_server *s);

/* The fields of llmem_server_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_SERVER_STATS_FIELDS(X) \
    /* requests answered, every path */ \
    X(COUNTER, U64, http_requests_total, "HTTP requests answered.") \
    X(COUNTER, U64, http_2xx_total, "HTTP answers 2xx.") \
    X(COUNTER, U64, http_4xx_total, "HTTP answers 4xx.") \
    X(COUNTER, U64, http_5xx_total, "HTTP answers 5xx.") \
    X(COUNTER, U64, http_413_total, "Request bodies over the limit (413).") \
    /* queue full */ \
    X(COUNTER, U64, http_429_total, "Requests refused because the queue was full (429).") \
    X(COUNTER, U64, http_401_total, "Requests without the right API key (401).") \
    /* generation requests accepted (submitted) */ \
    X(COUNTER, U64, completions_total, "Generation requests submitted.") \
    /* of which streamed */ \
    X(COUNTER, U64, streams_total, "Generation requests streamed.") \
    /* requests cancelled because the client went away */ \
    X(COUNTER, U64, client_disconnects_total, "Requests cancelled because their client went away.") \
    /* generation requests submitted and not answered */ \
    X(GAUGE, U64, requests_in_flight, "Generation requests submitted and not yet answered.") \
    /* open now */ \
    X(GAUGE, U64, connections, "HTTP connections open.") \
    X(COUNTER, U64, step_errors_total, "Scheduler steps that failed.")

typedef struct llmem_server_stats {
    size_t struct_size;
    LLMEM_SERVER_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_server_stats;

LLMEM_API llmem_status llmem_server_get_stats(llmem_server *s, llmem_server_stats *out);
LLMEM_API const llmem_stats_schema *llmem_server_stats_schema(void);

/* The server's own step cost: a LINEAR step model (llmem/step_model.h)
 * least-squares fitted (absolute error, so it keeps their total time) to
 * the steps its scheduler ran, the newest 4096 of them. This is the clock
 * to give `llmem replay` (--step-model) to predict this server on this
 * machine under its present load, and what GET /metrics exports as
 * llmem_step_model_*. */
typedef struct llmem_server_step_fit {
    size_t struct_size;
    uint64_t steps;                    /* steps fitted */
    uint64_t steps_total;              /* steps the server ran (with at least one sequence) */
    double seconds;                    /* their measured total */
    double rel_error;                  /* mean |fit - measured| / measured over them */
} llmem_server_step_fit;

/* LLMEM_ESTATE while fewer than 4 steps have run, or when they cannot tell
 * the terms apart (a singular system: say, every step the same shape). *fit
 * is optional. Safe from any thread. */
LLMEM_API llmem_status llmem_server_step_model(llmem_server *s, llmem_step_model *out, llmem_server_step_fit *fit);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_SERVER_H */
