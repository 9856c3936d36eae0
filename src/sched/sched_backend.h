/*
 * sched_backend.h - what the scheduler (sched.c) asks of the thing it
 * steps: the engine (sched_engine.c) or a simulation of one (sched_sim.c).
 *
 * An ops table in the ggml-backend manner: the scheduler calls these from
 * the stepping thread (or a canceller holding the step lock), never two at
 * once. Sequence handles are the backend's own (0 is never one). step is
 * all or nothing: on LLMEM_ENOMEM no sequence changed. Optional members may
 * be NULL: match_prefix (no prefix cache: nothing matches), fork
 * (LLMEM_ENOTSUP), swap_out/swap_in (no swapping), logits (synthetic
 * tokens), advance (not a simulation).
 */
#ifndef LLMEM_SCHED_BACKEND_H
#define LLMEM_SCHED_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/sched.h"

typedef struct llmem__sched_item {
    uint64_t seq;
    const int32_t *tokens;   /* n tokens, the sequence's next */
    uint32_t n;
    uint32_t cache_end;      /* positions at or past it are not offered to the prefix cache; 0 = none such */
    size_t context;          /* tokens the sequence holds before the step */
} llmem__sched_item;

typedef struct llmem__sched_ops {
    const char *name;
    bool reports_stages;     /* the backend tells the controller its stages itself (the engine) */
    llmem_status (*seq_create)(void *b, uint64_t *seq);
    void (*seq_free)(void *b, uint64_t seq);
    llmem_status (*match_prefix)(void *b, uint64_t seq, const int32_t *tokens, size_t n, size_t *matched);
    llmem_status (*fork)(void *b, uint64_t parent, uint64_t *child);
    llmem_status (*swap_out)(void *b, uint64_t seq);
    llmem_status (*swap_in)(void *b, uint64_t seq);
    /* Run a step; *seconds gets its time (measured or modelled; the clock
     * has moved by it when this returns). */
    llmem_status (*step)(void *b, const llmem__sched_item *items, size_t n, double *seconds);
    float *(*logits)(void *b, size_t i);
    void (*set_idle)(void *b);             /* optional: the engine reports IDLE */
    uint64_t (*now_ns)(const void *b);
    llmem_status (*advance)(void *b, uint64_t t_ns);
    void (*destroy)(void *b);
} llmem__sched_ops;

/* What the scheduler learns of its backend at creation. */
typedef struct llmem__sched_backend {
    const llmem__sched_ops *ops;
    void *self;
    llmem_kv *kv;            /* for admission (llmem_kv_get_room) and stats; NULL with the malloc engine */
    uint32_t vocab;
    uint32_t max_seqs;       /* sequence slots (0 = no limit of the backend's own) */
    uint32_t max_step_tokens; /* 0 = none of its own */
    uint32_t max_seq_len;
    bool can_swap;
    bool realtime;           /* the clock is the wall clock: advance sleeps */
} llmem__sched_backend;

/* sched.c: a scheduler over a backend (taken over: destroyed with it, or
 * on failure). */
llmem_status llmem__sched_create(const llmem__sched_backend *b, const llmem_sched_options *o, llmem_sched **out);

/* sched_engine.c, sched_sim.c */
llmem_status llmem__sched_engine_backend(llmem_engine *e, llmem__sched_backend *out);
llmem_status llmem__sched_sim_backend(const llmem_sched_sim_options *so, llmem__sched_backend *out);
llmem_status llmem__sched_sim_stats(void *b, llmem_sched_sim_stats *out);
extern const llmem__sched_ops llmem__sched_sim_ops;

#endif /* LLMEM_SCHED_BACKEND_H */
