/*
 * sched_engine.c - the scheduler's backend over a real llmem_engine: each
 * op is the engine call of the same name; a step is one llmem_engine_step,
 * timed on the monotonic clock. The engine reports its stages itself.
 */
#include <stdlib.h>
#include <string.h>

#include "llmem/engine.h"

#include "../core/internal.h"
#include "sched_backend.h"

typedef struct eng_backend {
    llmem_engine *e;
    llmem_engine_batch_item *items; /* [max_seqs] */
    uint32_t cap;
} eng_backend;

static llmem_status e_create(void *b, uint64_t *seq)
{
    llmem_engine_seq s = 0;
    llmem_status st = llmem_engine_seq_create(((eng_backend *)b)->e, &s);
    *seq = s;
    return st;
}

static void e_free(void *b, uint64_t seq) { llmem_engine_seq_free(((eng_backend *)b)->e, (llmem_engine_seq)seq); }

static llmem_status e_match(void *b, uint64_t seq, const int32_t *tokens, size_t n, size_t *matched)
{
    return llmem_engine_seq_match_prefix(((eng_backend *)b)->e, (llmem_engine_seq)seq, tokens, n, matched);
}

static llmem_status e_fork(void *b, uint64_t parent, uint64_t *child)
{
    llmem_engine_seq c = 0;
    llmem_status st = llmem_engine_seq_fork(((eng_backend *)b)->e, (llmem_engine_seq)parent, &c);
    *child = c;
    return st;
}

static llmem_status e_swap_out(void *b, uint64_t seq)
{
    return llmem_engine_seq_swap_out(((eng_backend *)b)->e, (llmem_engine_seq)seq);
}

static llmem_status e_swap_in(void *b, uint64_t seq)
{
    return llmem_engine_seq_swap_in(((eng_backend *)b)->e, (llmem_engine_seq)seq);
}

static llmem_status e_step(void *bp, const llmem__sched_item *items, size_t n, double *seconds)
{
    eng_backend *b = bp;
    if (n > b->cap) return llmem__fail(LLMEM_ECAPACITY, "sched: %zu items, the engine takes %u", n, b->cap);
    for (size_t i = 0; i < n; i++)
        b->items[i] = (llmem_engine_batch_item){(llmem_engine_seq)items[i].seq, items[i].tokens, items[i].n,
                                                items[i].cache_end};
    uint64_t t0 = llmem__now_ns();
    llmem_status st = llmem_engine_step(b->e, b->items, n);
    *seconds = (double)(llmem__now_ns() - t0) * 1e-9;
    return st;
}

static float *e_logits(void *b, size_t i) { return llmem_engine_logits(((eng_backend *)b)->e, i); }
static void e_idle(void *b) { llmem_engine_set_idle(((eng_backend *)b)->e); }
static uint64_t e_now(const void *b)
{
    (void)b;
    return llmem__now_ns();
}

static void e_destroy(void *bp)
{
    eng_backend *b = bp;
    if (!b) return;
    free(b->items);
    free(b);
}

static const llmem__sched_ops engine_ops = {
    /* .name = */ "engine",
    /* .reports_stages = */ true,
    /* .seq_create = */ e_create,
    /* .seq_free = */ e_free,
    /* .match_prefix = */ e_match,
    /* .fork = */ e_fork,
    /* .swap_out = */ e_swap_out,
    /* .swap_in = */ e_swap_in,
    /* .step = */ e_step,
    /* .logits = */ e_logits,
    /* .set_idle = */ e_idle,
    /* .now_ns = */ e_now,
    /* .advance = */ NULL,
    /* .destroy = */ e_destroy,
};

llmem_status llmem__sched_engine_backend(llmem_engine *e, llmem__sched_backend *out)
{
    llmem_engine_info info;
    llmem_status st = llmem_engine_get_info(e, &info);
    if (st) return st;
    eng_backend *b = calloc(1, sizeof *b);
    if (b) b->items = calloc(info.max_seqs, sizeof *b->items);
    if (!b || !b->items) {
        e_destroy(b);
        return llmem__fail(LLMEM_ENOMEM, "sched: no memory for the engine backend");
    }
    b->e = e;
    b->cap = info.max_seqs;
    memset(out, 0, sizeof *out);
    out->ops = &engine_ops;
    out->self = b;
    out->kv = llmem_engine_kv(e);
    out->vocab = info.vocab;
    out->max_seqs = info.max_seqs;
    out->max_step_tokens = info.max_step_tokens;
    out->max_seq_len = info.max_seq_len;
    llmem_kv_room kr;
    out->can_swap = out->kv && !llmem_kv_get_room(out->kv, &kr) && kr.can_swap;
    return LLMEM_OK;
}
