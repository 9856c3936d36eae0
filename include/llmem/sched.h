/*
 * llmem/sched.h - the continuous-batching scheduler: one request queue, one
 * step loop, for a real engine or for a simulation of one.
 *
 * A request is a prompt and sampling parameters; it produces n samples
 * (n >= 1), each one sequence of KV. The scheduler owns the queue and steps
 * its backend:
 *  - the engine (llmem_sched_create_engine): every step is one
 *    llmem_engine_step, tokens come from its logits through the sampler;
 *  - a simulation (llmem_sched_create_sim): the KV is a llmem_kv of the
 *    caller's (every block really allocated, on any resource), the clock is
 *    simulated and advanced by a step-time model (llmem/step_model.h), or
 *    the wall clock slept for that long (realtime); tokens are synthetic.
 * The policy is the same for both; `llmem replay` runs the simulation, a
 * server runs the engine.
 *
 * One step (llmem_sched_step):
 *  1. Running sequences first, oldest admission first: each gets what it
 *     still has to compute - one token when decoding, the next chunk of its
 *     prompt when prefilling - within the step's token budget
 *     (max_step_tokens; chunked prefill: a long prompt takes several steps,
 *     mixed with the others' decodes).
 *  2. Then the queue, head first (preempted sequences wait at the head):
 *     a swapped-out sequence is swapped back in; a request is admitted when
 *     a sequence slot is free (max_batch running, n slots for n samples)
 *     and the KV can hold the rest of its prompt plus headroom_blocks per
 *     running sequence (and, with a predictor, its reserve for the step) -
 *     the admission test (STATIC and BUCKETS: the attempt itself). Admission creates the sequence and
 *     attaches the longest run of cached prompt blocks (prefix cache:
 *     those tokens are not computed again; counted as queries and hits).
 *  3. The backend runs the step. When the KV cannot hold it (LLMEM_ENOMEM;
 *     the engine's step changes nothing then), the most recently admitted
 *     running sequence goes (one admitted for this very step is simply not
 *     admitted) - swapped out to the KV's swap resource
 *     when it has one (PREEMPT_AUTO) and the swap succeeds, else freed to be
 *     recomputed (its prompt and every token it generated, prefilled again
 *     when it is readmitted) - and the step is tried again without it. A
 *     sequence alone that is refused twice (a transient refusal passes the
 *     second time) stops: FINISH_MEMORY when it has output, else
 *     FINISH_REJECTED (it can never fit).
 *  4. Each sequence whose computed tokens reached its known tokens samples
 *     its next token: temperature 0 takes the argmax, else llmem_sampler
 *     seeded with seed + sample index. Stop conditions: max_tokens
 *     (FINISH_LENGTH), a stop token or stop sequence (FINISH_STOP; neither
 *     is part of the output, and tokens that may begin a stop sequence are
 *     held back from readers until they cannot), the context
 *     (FINISH_CONTEXT: the sequence reached max_seq_len), an event callback
 *     returning true (FINISH_STOP). A request with n > 1 forks its prompt's
 *     sequence when the prompt is done: the samples share its KV blocks
 *     (copy-on-write) and each samples its first token from the same
 *     logits. Where a fork cannot be had the sample prefills the prompt
 *     itself; the tokens are the same either way.
 * Recomputation and swapping change no token: the sampler state of a
 * sequence only moves when it samples, and the engine's kernels give the
 * same bits whatever the batch (tests/test_sched.c proves both).
 *
 * Stage reports: the engine reports PREFILL and DECODE to its on_stage
 * listener (the controller: llmem/memctl.h wires it); a simulation reports
 * them to options.controller itself, before the step's KV is taken, as an
 * engine would. With no work, the scheduler reports IDLE once and ticks the
 * controller on every step call and llmem_sched_advance.
 *
 * Threads. Submission, cancellation, release, reads, waits and stats are
 * safe from any thread; one thread at a time steps (llmem_sched_step takes
 * the step lock). Cancellation frees a sequence's KV before it returns
 * (waiting for the step in flight to end, if any); called from an event
 * callback, it frees at once too. Events are delivered on the stepping
 * thread after the step's bookkeeping, with no scheduler lock held except
 * the step lock: a callback may call any function here but
 * llmem_sched_step and llmem_sched_advance.
 *
 * Memory: the per-step tables are taken at creation; a request's records
 * (prompt copy, output tokens up to max_tokens, a sampler when the
 * temperature is not 0) at submission, so a step makes no allocation of
 * its own. A finished request keeps its record (outputs, timings) until
 * llmem_sched_release.
 *
 *     llmem_sched *s;
 *     llmem_sched_create_engine(engine, NULL, &s);
 *     llmem_sched_params p = llmem_sched_params_default();
 *     p.prompt = ids; p.prompt_len = n; p.max_tokens = 64;
 *     llmem_sched_req r;
 *     llmem_sched_submit(s, &p, &r);
 *     while (llmem_sched_pending(s)) llmem_sched_step(s, NULL);
 *     size_t got;
 *     llmem_sched_read(s, r, 0, 0, out, cap, &got);
 *     llmem_sched_release(s, r);
 *     llmem_sched_destroy(s);
 */
#ifndef LLMEM_SCHED_H
#define LLMEM_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/controller.h"
#include "llmem/engine.h"
#include "llmem/kv.h"
#include "llmem/predictor.h"
#include "llmem/stats.h"
#include "llmem/status.h"
#include "llmem/step_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_sched llmem_sched;
typedef uint64_t llmem_sched_req; /* 0 is never a request */

/* Where one sample (sequence) of a request stands. */
typedef enum llmem_sched_state {
    LLMEM_SCHED_WAITING = 0,   /* queued, holds no KV */
    LLMEM_SCHED_PREFILL = 1,   /* admitted, computing its prompt (or recomputing) */
    LLMEM_SCHED_DECODE = 2,    /* admitted, one token a step */
    LLMEM_SCHED_SWAPPED = 3,   /* preempted, its KV waiting in swap memory */
    LLMEM_SCHED_FINISHED = 4   /* see llmem_sched_finish */
} llmem_sched_state;

typedef enum llmem_sched_finish {
    LLMEM_SCHED_FINISH_NONE = 0,
    LLMEM_SCHED_FINISH_LENGTH = 1,    /* max_tokens generated */
    LLMEM_SCHED_FINISH_STOP = 2,      /* a stop token or sequence, or the event callback said stop */
    LLMEM_SCHED_FINISH_CONTEXT = 3,   /* the sequence reached max_seq_len */
    LLMEM_SCHED_FINISH_MEMORY = 4,    /* alone, refused KV twice: truncated */
    LLMEM_SCHED_FINISH_CANCELLED = 5, /* llmem_sched_cancel or release */
    LLMEM_SCHED_FINISH_REJECTED = 6,  /* its prompt could never fit in the KV */
    LLMEM_SCHED_FINISH_ERROR = 7      /* the backend failed (llmem_sched_step returned the error) */
} llmem_sched_finish;

/* "waiting", "prefill", ...; "length", "stop", ... ("?" otherwise). */
LLMEM_API const char *llmem_sched_state_name(llmem_sched_state s);
LLMEM_API const char *llmem_sched_finish_name(llmem_sched_finish f);

typedef enum llmem_sched_preempt {
    LLMEM_SCHED_PREEMPT_AUTO = 0,      /* swap when the KV has a swap resource, else recompute */
    LLMEM_SCHED_PREEMPT_RECOMPUTE = 1, /* always free and recompute */
    LLMEM_SCHED_PREEMPT_SWAP = 2       /* swap; recompute only when the swap fails */
} llmem_sched_preempt;

typedef enum llmem_sched_event_kind {
    LLMEM_SCHED_EV_ADMIT = 0,   /* a sample was admitted (again, after a preemption): it holds KV */
    LLMEM_SCHED_EV_TOKEN = 1,   /* a sample's next output token became readable (token, index) */
    LLMEM_SCHED_EV_PREEMPT = 2, /* a sample was preempted (swapped: true when its KV was swapped out) */
    LLMEM_SCHED_EV_RESUME = 3,  /* a swapped sample was swapped back in */
    LLMEM_SCHED_EV_FINISH = 4   /* a sample finished (finish) */
} llmem_sched_event_kind;

typedef struct llmem_sched_event {
    llmem_sched_event_kind kind;
    llmem_sched_req req;
    uint32_t sample;            /* 0..n-1 */
    int32_t token;              /* TOKEN: the token */
    uint32_t index;             /* TOKEN: its index in the sample's output */
    llmem_sched_finish finish;  /* FINISH */
    bool swapped;               /* PREEMPT */
    void *user;                 /* the request's params.user */
} llmem_sched_event;

/* Called on the stepping thread (see Threads above). For TOKEN, returning
 * true stops the sample (FINISH_STOP, the token kept): a server matching
 * stop strings in text stops here. The return value is ignored for the
 * other kinds. */
typedef bool (*llmem_sched_event_fn)(void *ctx, const llmem_sched_event *ev);

/* What one step did. */
typedef struct llmem_sched_step_report {
    uint32_t sequences;            /* items of the step (0: nothing ran) */
    uint32_t prefill_tokens;       /* prompt (and recomputed) tokens */
    uint32_t decode_tokens;
    uint32_t admitted;             /* sequences admitted or swapped in */
    uint32_t preempted;
    uint32_t finished;             /* samples finished (0 when on_step sees it) */
    uint32_t running;              /* sequences admitted when the step ran */
    double attn_pairs;             /* query-key pairs its attention computed (llmem_step_shape's) */
    double decode_kv_tokens;       /* KV tokens its decodes read */
    uint64_t start_ns;             /* the clock when it began */
    double seconds;                /* the step's time: measured (engine) or modelled (simulation) */
} llmem_sched_step_report;

/* Called on the stepping thread after a step ran (same rules as events). */
typedef void (*llmem_sched_step_fn)(void *ctx, const llmem_sched_step_report *rep);

/* Zero fields mean the default. */
typedef struct llmem_sched_options {
    uint32_t max_batch;            /* sequences admitted at once; default: the engine's max_seqs, 256
                                      in a simulation (an engine's sequences swapped out hold one of
                                      its slots too) */
    uint32_t max_step_tokens;      /* token budget of one step (decodes + prompt chunks); default the
                                      engine's max_step_tokens, 8192 in a simulation */
    uint32_t max_waiting;          /* requests queued (not yet admitted) at most: submit answers
                                      LLMEM_ECAPACITY past it; 0 = no limit */
    uint32_t headroom_blocks;      /* admission keeps this many free KV blocks per running sequence
                                      (decode room, fewer preemptions); default 0 */
    llmem_sched_preempt preempt;   /* default AUTO */
    llmem_controller *controller;  /* optional, borrowed: ticked when idle; a simulation reports its
                                      stages to it */
    llmem_predictor *predictor;    /* optional, borrowed: admission also needs its reserve for the
                                      step free in the KV budget */
    llmem_sched_event_fn on_event; /* optional */
    void *event_ctx;
    llmem_sched_step_fn on_step;   /* optional: after each step ran, before its bookkeeping (sequences
                                      that finish in it still hold their KV): a timeline samples here */
    void *step_ctx;
    bool check;                    /* llmem_kv_check after every step; a violation fails the step */
} llmem_sched_options;

LLMEM_API llmem_sched_options llmem_sched_options_default(void);

/* A simulated engine. */
typedef struct llmem_sched_sim_options {
    llmem_kv *kv;                  /* required, borrowed: the KV the simulation allocates from */
    llmem_resource *device;        /* optional, borrowed: the resource under the KV's pool; its copy
                                      bytes (bucket growth, copy-on-write) count in the step model */
    llmem_step_model model;        /* the step time (llmem_step_model_roofline / _linear) */
    uint32_t vocab;                /* synthetic tokens are < vocab; default 32000 */
    bool realtime;                 /* the wall clock: each step sleeps for its modelled time (a soak
                                      under real time); default a simulated clock from 0 */
    bool write_kv;                 /* write every KV slot appended (K and V, every layer) with a
                                      pattern of its prefix and verify a sample of each sequence's
                                      positions before it is freed: real resident memory and a
                                      corruption check (llmem_sched_get_sim_stats); the KV must be
                                      host memory */
    uint64_t seed;                 /* of the verification sample; default 1 */
} llmem_sched_sim_options;

LLMEM_API llmem_sched_sim_options llmem_sched_sim_options_default(void);

/* A scheduler over an engine (borrowed: it must outlive the scheduler; no
 * one else may step it meanwhile). Its sequences are the engine's. The
 * prefix cache, forks and swap are what the engine's KV offers
 * (llmem_engine_options.kv_prefix_cache, kv_swap_resource).
 * LLMEM_EINVAL for bad options, LLMEM_ENOMEM. */
LLMEM_API llmem_status llmem_sched_create_engine(llmem_engine *e, const llmem_sched_options *o, llmem_sched **out);

/* A scheduler over a simulated engine. LLMEM_EINVAL without a KV or with an
 * incomplete step model. */
LLMEM_API llmem_status llmem_sched_create_sim(const llmem_sched_sim_options *so, const llmem_sched_options *o,
                                              llmem_sched **out);

/* Frees every request record (and its sequences). NULL is a no-op. */
LLMEM_API void llmem_sched_destroy(llmem_sched *s);

/* A request. Zero fields mean the default. */
typedef struct llmem_sched_params {
    const int32_t *prompt;         /* required: prompt_len tokens, copied at submission */
    uint32_t prompt_len;           /* >= 1, < the context (max_seq_len) */
    uint32_t max_tokens;           /* tokens to generate at most; 0 = up to the context */
    uint32_t n;                    /* samples; default 1 */
    float temperature;             /* 0 (default): argmax; else sampled (llmem/sampler.h) */
    float top_p;                   /* in [0, 1]; 0 or 1 = off */
    uint64_t seed;                 /* sample i is seeded with seed + i */
    const int32_t *stop_tokens;    /* any of these ends a sample (FINISH_STOP, not output); copied */
    uint32_t stop_token_count;
    const int32_t *const *stop_seqs; /* token sequences that end a sample when generated (not output);
                                        copied */
    const uint32_t *stop_seq_lens;
    uint32_t stop_seq_count;
    uint32_t cache_limit;          /* prompt positions from this one on are not offered to the prefix
                                      cache (a prompt's private part); 0 = every position */
    uint64_t arrival_ns;           /* when the request arrived, on the scheduler's clock; 0 (or a time
                                      still to come) = now; latencies count from it */
    void *user;                    /* handed back in events and info */
} llmem_sched_params;

LLMEM_API llmem_sched_params llmem_sched_params_default(void);

/* Queue a request. LLMEM_EINVAL (no prompt, n = 0 after the default, a
 * token outside the vocabulary, bad sampling values), LLMEM_ERANGE (the
 * prompt fills the context: its length and the limit are in the message),
 * LLMEM_ECAPACITY (max_waiting requests queued, or n above max_batch),
 * LLMEM_ENOMEM. */
LLMEM_API llmem_status llmem_sched_submit(llmem_sched *s, const llmem_sched_params *p, llmem_sched_req *out);

/* Stop a request wherever it is: its sequences' KV is freed before the
 * call returns; its samples finish CANCELLED (those already finished keep
 * their reason). The record stays until released. LLMEM_EINVAL for an
 * unknown request; a finished one is a no-op. */
LLMEM_API llmem_status llmem_sched_cancel(llmem_sched *s, llmem_sched_req r);

/* Cancel if needed and forget the request (its id becomes unknown). */
LLMEM_API llmem_status llmem_sched_release(llmem_sched *s, llmem_sched_req r);

typedef struct llmem_sched_info {
    llmem_sched_state state;
    llmem_sched_finish finish;
    uint32_t n;                    /* samples of the request */
    uint32_t prompt_tokens;
    uint32_t cached_tokens;        /* prompt tokens the prefix cache supplied at its first admission */
    uint32_t generated;            /* tokens sampled */
    uint32_t visible;              /* tokens readable (llmem_sched_read): without held-back or stop tokens */
    uint32_t preemptions;          /* times preempted */
    uint32_t swaps;                /* of which swapped out */
    uint32_t computed_tokens;      /* tokens it ran through the backend, recomputation included */
    uint64_t arrival_ns;           /* on the scheduler's clock */
    uint64_t scheduled_ns;         /* first admitted; 0 = not yet */
    uint64_t first_token_ns;       /* 0 = not yet */
    uint64_t finish_ns;            /* 0 = not yet */
    void *user;
} llmem_sched_info;

/* One sample's state. LLMEM_EINVAL for an unknown request, LLMEM_ERANGE for
 * sample >= n. */
LLMEM_API llmem_status llmem_sched_get_info(llmem_sched *s, llmem_sched_req r, uint32_t sample, llmem_sched_info *out);

/* Copy readable output tokens [from, from + cap) of a sample; *n gets how
 * many were copied (0 when none past `from` yet). */
LLMEM_API llmem_status llmem_sched_read(llmem_sched *s, llmem_sched_req r, uint32_t sample, size_t from,
                                        int32_t *out, size_t cap, size_t *n);

/* Block until the request made progress since *progress (a new readable
 * token or a finish, in any sample), it is finished, or timeout_ns passed.
 * *progress gets the request's progress count (start from 0; unchanged
 * after a timeout, so the caller compares). LLMEM_EINVAL for an unknown
 * request. */
LLMEM_API llmem_status llmem_sched_wait(llmem_sched *s, llmem_sched_req r, uint64_t *progress, uint64_t timeout_ns);

/* Requests submitted and not finished. */
LLMEM_API size_t llmem_sched_pending(llmem_sched *s);

/* Run one step (see above). With nothing to run it reports IDLE (once),
 * ticks the controller and returns LLMEM_OK with rep->sequences 0. A
 * backend error other than the KV refusing returns its status; the
 * sequences of that step finish ERROR (the others go on). */
LLMEM_API llmem_status llmem_sched_step(llmem_sched *s, llmem_sched_step_report *rep);

/* Block until a request is waiting to run or timeout_ns passed (a server's
 * step loop sleeps here when idle; ticking the controller is its job
 * meanwhile). true when there is work. */
LLMEM_API bool llmem_sched_wait_work(llmem_sched *s, uint64_t timeout_ns);

/* Run fn(arg) while the backend is still: no step, cancellation or release
 * runs until fn returns. For reading the backend's own state from another
 * thread (llmem_engine_get_stats walks the engine's sequences, which a
 * cancellation frees). From an event callback of the stepping thread it
 * runs at once. fn must not call llmem_sched_step; it may submit, read and
 * wait-free calls. LLMEM_EINVAL for a null scheduler or fn. */
LLMEM_API llmem_status llmem_sched_while_still(llmem_sched *s, void (*fn)(void *arg), void *arg);

/* The scheduler's clock (ns): simulated, or monotonic (engine, realtime). */
LLMEM_API uint64_t llmem_sched_now_ns(const llmem_sched *s);

/* Simulation with nothing to run: the clock moves to t_ns (the next
 * arrival; a realtime simulation sleeps until then, ticking the controller
 * every 20 ms), IDLE is reported once, and the controller ticked at the end
 * (it shrinks once IDLE has lasted its decay on this clock). LLMEM_ESTATE
 * with sequences admitted or over an engine; a t_ns in the past only ticks. */
LLMEM_API llmem_status llmem_sched_advance(llmem_sched *s, uint64_t t_ns);

/* The fields of llmem_sched_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_SCHED_STATS_FIELDS(X) \
    X(GAUGE, U64, requests_waiting, "Requests none of whose samples is admitted.") \
    X(GAUGE, U64, requests_running, "Requests with a sample admitted.") \
    /* sequences admitted (holding KV, not swapped) */ \
    X(GAUGE, U64, sequences_running, "Sequences admitted (holding KV).") \
    /* sequences swapped out now */ \
    X(GAUGE, U64, sequences_swapped, "Sequences swapped out to host memory.") \
    /* KV held by sequences / KV capacity (the budget, or what the KV holds without one), 0..1 */ \
    X(GAUGE, DOUBLE, kv_usage, "KV held by sequences over KV capacity (0..1).") \
    X(COUNTER, U64, requests_submitted_total, "Requests submitted.") \
    /* every sample finished, whatever the reason */ \
    X(COUNTER, U64, requests_finished_total, "Requests whose every sample finished.") \
    X(COUNTER, U64, requests_cancelled_total, "Requests cancelled.") \
    X(COUNTER, U64, requests_rejected_total, "Requests whose prompt could never fit in the KV.") \
    /* samples finished by reason */ \
    X(COUNTER, U64, samples_length_total, "Samples that generated max_tokens.") \
    X(COUNTER, U64, samples_stop_total, "Samples ended by a stop token or sequence.") \
    X(COUNTER, U64, samples_context_total, "Samples that reached the context length.") \
    X(COUNTER, U64, samples_memory_total, "Samples truncated: alone, and refused KV.") \
    /* prompt tokens of admitted requests (once each) */ \
    X(COUNTER, U64, prompt_tokens_total, "Prompt tokens of admitted requests.") \
    /* tokens sampled */ \
    X(COUNTER, U64, generation_tokens_total, "Tokens generated.") \
    /* prompt tokens run through the backend, recomputation included */ \
    X(COUNTER, U64, computed_tokens_total, "Prompt tokens computed, recomputation included.") \
    X(COUNTER, U64, prefix_cache_queries_total, "Prompt tokens looked up in the prefix cache.") \
    /* of those, found: their prefill was skipped */ \
    X(COUNTER, U64, prefix_cache_hits_total, "Prompt tokens found in the prefix cache (prefill skipped).") \
    /* admissions that found at least one block */ \
    X(COUNTER, U64, prefix_cache_requests_hit_total, "Admissions that found cached blocks.") \
    X(COUNTER, U64, preemptions_total, "Sequences preempted.") \
    /* of which swapped out */ \
    X(COUNTER, U64, preemptions_swap_total, "Sequences preempted by swapping their KV out.") \
    X(COUNTER, U64, swap_ins_total, "Swapped sequences swapped back in.") \
    /* samples that share their prompt's KV */ \
    X(COUNTER, U64, forks_total, "Samples forked from their prompt's sequence.") \
    X(COUNTER, U64, fork_fallbacks_total, "Samples that prefilled their prompt themselves.") \
    X(COUNTER, U64, admissions_refused_total, "Admissions the KV refused at sequence creation.") \
    X(COUNTER, U64, steps_total, "Steps run.") \
    X(COUNTER, U64, step_prefill_tokens_total, "Prefill tokens in steps.") \
    X(COUNTER, U64, step_decode_tokens_total, "Decode tokens in steps.") \
    X(COUNTER, DOUBLE, step_seconds_total, "Seconds of steps (measured or modelled).") \
    /* the same: clock time spent in steps */ \
    X(COUNTER, DOUBLE, busy_seconds_total, "Clock seconds spent in steps.") \
    /* the clock now */ \
    X(GAUGE, DOUBLE, clock_seconds, "The scheduler's clock.")

typedef struct llmem_sched_stats {
    size_t struct_size;
    LLMEM_SCHED_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_sched_stats;

LLMEM_API llmem_status llmem_sched_get_stats(llmem_sched *s, llmem_sched_stats *out);
LLMEM_API const llmem_stats_schema *llmem_sched_stats_schema(void);

/* Latency histograms (Prometheus-style, bucket bounds fixed per kind,
 * cumulative counts as Prometheus writes them). */
typedef enum llmem_sched_hist_kind {
    LLMEM_SCHED_HIST_TTFT = 0,      /* arrival to first token, per sample */
    LLMEM_SCHED_HIST_TPOT = 1,      /* between consecutive tokens of a sample */
    LLMEM_SCHED_HIST_E2E = 2,       /* arrival to finish, per request */
    LLMEM_SCHED_HIST_QUEUE = 3,     /* arrival to first admission, per request */
    LLMEM_SCHED_HIST_COUNT_ = 4
} llmem_sched_hist_kind;

#define LLMEM_SCHED_HIST_MAX_BUCKETS 32

typedef struct llmem_sched_histogram {
    uint32_t buckets;                                 /* bounds in use (the +Inf bucket is count) */
    double le[LLMEM_SCHED_HIST_MAX_BUCKETS];          /* upper bounds, seconds, increasing */
    uint64_t cumulative[LLMEM_SCHED_HIST_MAX_BUCKETS]; /* observations <= le[i] */
    uint64_t count;
    double sum;                                       /* seconds */
} llmem_sched_histogram;

/* A copy of one histogram; LLMEM_EINVAL for an unknown kind. */
LLMEM_API llmem_status llmem_sched_get_histogram(llmem_sched *s, llmem_sched_hist_kind kind,
                                                 llmem_sched_histogram *out);

/* Simulation only: what write_kv found. */
typedef struct llmem_sched_sim_stats {
    size_t struct_size;
    uint64_t kv_slots_written_total;
    uint64_t kv_positions_verified_total;
    uint64_t kv_corruptions_total;      /* positions whose pattern changed */
    uint64_t copy_bytes_total;          /* device copies the step model counted */
} llmem_sched_sim_stats;

/* LLMEM_ENOTSUP over an engine. */
LLMEM_API llmem_status llmem_sched_get_sim_stats(llmem_sched *s, llmem_sched_sim_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_SCHED_H */
