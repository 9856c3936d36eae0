/*
 * sched_internal.h - what the scheduler's files share (llmem/sched.h):
 * sched.c (queue, admission, preemption, stepping), sched_requests.c
 * (submission, cancellation, reads), sched_stats.c (figures). One
 * heading per file for its cross-file internals, as mimalloc's
 * internal.h; sched.c's file-top comment states the records, lists, locks
 * and invariants.
 */
#ifndef LLMEM_SCHED_INTERNAL_H
#define LLMEM_SCHED_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/sampler.h"
#include "llmem/sched.h"

#include "sched_backend.h"

#define MAX_STOP_LEN 32u  /* tokens in one stop sequence at most */
#define MAX_STOPS 16u     /* stop tokens, and stop sequences, at most */

typedef struct sreq sreq;

typedef struct unit {
    sreq *r;
    uint32_t idx;               /* sample index */
    llmem_sched_state state;
    llmem_sched_finish finish;
    uint64_t seq;               /* backend sequence; 0 = none */
    int32_t *tok;               /* [cap]: prompt, then output */
    uint32_t cap, total, computed;
    uint32_t generated, out_len, visible;
    llmem_sampler *sampler;     /* NULL: argmax */
    uint64_t admit_order;
    bool queued, fork_wait, in_run;
    bool fresh;                 /* admitted in the step being planned: its ADMIT event and prefix
                                   figures wait for the step to succeed */
    uint32_t matched;           /* prompt tokens the prefix cache gave at that admission */
    uint32_t preemptions, swaps;
    uint64_t first_token_ns, last_token_ns, finish_ns;
} unit;

struct sreq {
    llmem_sched_req id;
    uint64_t serial;            /* submission number (synthetic tokens) */
    uint32_t n, prompt_len, max_tokens, cache_limit;
    uint32_t want;              /* max_tokens as asked (0 = up to the context) */
    int32_t stop_tok[MAX_STOPS];
    uint32_t nstop_tok;
    int32_t stop_seq[MAX_STOPS][MAX_STOP_LEN];
    uint32_t stop_len[MAX_STOPS];
    uint32_t nstop_seq;
    void *user;
    unit *u;                    /* [n] */
    uint32_t unfinished;
    uint32_t followers_waiting; /* units with fork_wait */
    bool slots_reserved;        /* the followers' slots are counted */
    bool prompt_counted, cancelled_counted;
    uint32_t cached_tokens, computed_tokens;
    uint64_t arrival_ns, scheduled_ns, finish_ns;
    uint64_t progress;
};

typedef struct hist {
    uint32_t nb;
    const double *le;
    uint64_t counts[LLMEM_SCHED_HIST_MAX_BUCKETS]; /* per bucket, not cumulative */
    uint64_t count;
    double sum;
} hist;

typedef struct event_buf {
    llmem_sched_event *ev;
    size_t n, cap;
} event_buf;

struct llmem_sched {
    llmem__sched_backend b;
    llmem_sched_options o;
    uint32_t max_batch, max_step, max_len;
    pthread_mutex_t mu, step_mu;
    pthread_cond_t cv;          /* progress of any request, or new work */
    pthread_t owner;
    bool owned;
    /* requests */
    sreq **reqs;                /* [nreq_cap]; NULL = free slot */
    uint32_t *req_gen;
    uint32_t nreq_cap, *free_slots, nfree;
    uint64_t serial;
    size_t pending;             /* submitted, not finished */
    size_t waiting_reqs;        /* in wq as never-admitted leaders (max_waiting) */
    size_t live_units;          /* units not finished: the deque holds room for all */
    /* lists */
    unit **run;                 /* [max_batch] */
    uint32_t nrun, nswapped, reserved;
    unit **wq;
    size_t wq_head, wq_len, wq_cap;
    uint64_t admit_seq;
    /* the step's tables */
    llmem__sched_item *items;   /* [max_batch] */
    unit **item_unit;           /* [max_batch] */
    float *keep, *tmp;          /* [vocab] logits for forked samples */
    event_buf eb;
    bool idle_reported;
    bool sim;
    hist h[LLMEM_SCHED_HIST_COUNT_];
    llmem_sched_stats st;
};

/* sched.c */
static inline uint64_t llmem__sched_now(const llmem_sched *s) { return s->b.ops->now_ns(s->b.self); }
sreq *llmem__sched_lookup(const llmem_sched *s, llmem_sched_req id);       /* mu held */
void llmem__sched_finish_unit(llmem_sched *s, unit *u, llmem_sched_finish why); /* mu and step_mu held */
void llmem__sched_wq_grow(llmem_sched *s, size_t units, bool *ok);         /* mu held */
void llmem__sched_wq_push_back(llmem_sched *s, unit *u);                   /* mu held; room made */

/* sched_requests.c */
void llmem__sched_free_req(sreq *r);

#endif /* LLMEM_SCHED_INTERNAL_H */
