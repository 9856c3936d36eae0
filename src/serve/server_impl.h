/*
 * server_impl.h - the server's records, shared by server.c (building,
 * the step loop, scheduler events), serve_http.c (the HTTP side) and
 * serve_report.c (metrics, timeline JSON, dashboard). Not installed.
 *
 * Locking order: srv->mu, then a request's mu; the step thread (holding
 * the scheduler's step lock inside event callbacks) takes only a request's
 * mu and srv->lat_mu / srv->snap_mu, so no HTTP thread may call a
 * scheduler function while holding a request's mu.
 */
#ifndef LLMEM_SERVER_IMPL_H
#define LLMEM_SERVER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "llmem/llmem.h"
#include "llmem/openai.h"
#include "llmem/server.h"

#include "sbuf.h"

struct MHD_Daemon;
struct MHD_Connection;

/* One sample of the dashboard's timeline. */
typedef struct srv_sample {
    double t;                 /* seconds since the server started */
    uint32_t stage;           /* llmem_stage */
    uint64_t reserved, committed, used; /* the pool's bytes */
    double kv_util;           /* KV slots in use / held (-1 unknown) */
    double kv_usage;          /* KV held / capacity (the scheduler's) */
    uint32_t running, waiting, swapped;
    uint64_t generated;       /* tokens generated in all */
    uint64_t rss;             /* resident bytes of the process */
} srv_sample;

#define SRV_SAMPLES 4096u     /* ring: at 20 Hz about 3.4 minutes */
#define SRV_LATENCIES 2048u   /* ring of the latest requests' latencies */
#define SRV_STEPS 4096u       /* ring of the latest steps: what the step model is fitted on */

/* One step the scheduler ran: its shape and its measured time. */
typedef struct srv_step {
    llmem_step_shape shape;
    double seconds;
} srv_step;

typedef struct srv_latency {
    double ttft, tpot, e2e, queue; /* seconds; tpot < 0 when one token */
} srv_latency;

typedef struct llmem_server_req srv_req;

struct llmem_server {
    llmem_server_options o;
    char *model_path, *tokenizer_path, *model_name, *host, *api_key;

    llmem_resource *os, *fault, *track;
    llmem_model *model;
    llmem_tokenizer *tok;
    llmem_memctl *mc;
    llmem_engine *engine;
    llmem_sched *sched;
    llmem_chat_format chat;
    bool chat_ok;
    char chat_why[200];
    uint32_t vocab, ctx, max_batch;
    int32_t bos, eos;

    struct MHD_Daemon *daemon;
    uint16_t port;
    time_t created;
    uint64_t start_ns;

    pthread_t stepper;
    bool stepper_started;
    atomic_bool stop;         /* the step loop ends */
    atomic_bool draining;     /* new requests get 503 */
    atomic_bool cancel_all;   /* in-flight requests end now (shutdown deadline) */
    bool shut;

    pthread_mutex_t mu;       /* in-flight list and counters */
    pthread_cond_t cv;        /* in-flight count changed */
    srv_req *inflight;        /* doubly linked */
    uint32_t ninflight;
    uint64_t next_id;
    llmem_server_stats st;

    pthread_mutex_t snap_mu;  /* samples and the step thread's snapshots */
    srv_sample *samples;      /* ring of SRV_SAMPLES */
    uint64_t nsamples;        /* recorded in all; the newest is (nsamples - 1) % SRV_SAMPLES */
    uint64_t last_sample_ns;
    llmem_engine_stats es;    /* taken by the step thread */
    llmem_kv_stats ks;
    bool have_ks;
    srv_step *steps;          /* ring of SRV_STEPS, the step thread's records (under snap_mu) */
    uint64_t nsteps;          /* recorded in all */

    pthread_mutex_t lat_mu;
    srv_latency *lat;         /* ring of SRV_LATENCIES */
    uint64_t nlat;
};

/* One generation request, from the handler that submitted it to the end
 * of its response. */
typedef struct srv_sample_out {
    llmem_textstream *ts;
    llmem__sbuf text;          /* non-streaming: the text so far */
    llmem_sched_finish finish;
    bool finished;
    bool role_sent;           /* chat streams: the first chunk carries the role */
} srv_sample_out;

struct llmem_server_req {
    llmem_server *srv;
    llmem_oai_request *q;
    _Atomic llmem_sched_req id; /* written by the submitter and by the step thread's events (the
                                  request may finish before llmem_sched_submit returns) */
    uint32_t n;
    uint32_t prompt_len;
    int32_t *prompt_ids;      /* return_token_ids: the prompt as the model got it (chat: rendered) */
    char id_str[48];
    time_t created;
    int fd;                   /* the client's socket (disconnect polling); -1 unknown */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_sample_out *s;        /* [n] */
    uint32_t finished;        /* samples finished */
    llmem__sbuf out;           /* streaming: SSE bytes not yet sent (from `sent`) */
    size_t sent;
    bool done;                /* every sample finished and its last bytes are in `out` */
    bool cancelled;           /* by a disconnect or the shutdown */
    bool shutdown_error;      /* ended by the shutdown deadline */
    bool error;               /* the backend failed or rejected it */
    char error_msg[200];

    srv_req *prev, *next;
};

/* server.c */
llmem_status llmem__srv_submit(llmem_server *s, srv_req *r, const int32_t *prompt, uint32_t prompt_len,
                               uint32_t max_tokens, int32_t extra_stop, llmem_oai_error *err);
void llmem__srv_req_free(srv_req *r);
void llmem__srv_inflight_add(llmem_server *s, srv_req *r);
void llmem__srv_inflight_remove(llmem_server *s, srv_req *r);
/* Append the SSE chunk that ends a stream early (the shutdown, an error). */
void llmem__srv_stream_error(srv_req *r, const char *type, const char *msg);
void llmem__srv_chunk_prefix(srv_req *r, llmem__sbuf *b);
const char *llmem__srv_finish_reason(llmem_sched_finish f);
/* The JSON body of a finished, not streamed request (its samples done). */
void llmem__srv_response_json(srv_req *r, llmem__sbuf *b);

/* serve_http.c */
llmem_status llmem__srv_http_start(llmem_server *s);
void llmem__srv_http_quiesce(llmem_server *s);
void llmem__srv_http_stop(llmem_server *s);
void llmem__srv_count(llmem_server *s, unsigned code);

/* serve_report.c */
void llmem__srv_metrics(llmem_server *s, llmem__sbuf *b);
void llmem__srv_timeline_json(llmem_server *s, uint64_t since, llmem__sbuf *b);
void llmem__srv_sample(llmem_server *s, bool force);
extern const char llmem__dashboard_html[];
extern const size_t llmem__dashboard_html_len;

#endif /* LLMEM_SERVER_IMPL_H */
