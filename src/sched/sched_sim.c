/*
 * sched_sim.c - the scheduler's backend that simulates an engine: its KV is
 * a real llmem_kv of the caller's (every block allocated and freed through
 * llmem, on whatever resource the caller chose - a sim-device resource that
 * touches nothing, or host memory), its clock is simulated and each step
 * advances it by the step model's time (or, realtime, sleeps that long).
 *
 * A step appends every item's slots (all or nothing, as the engine: on a
 * refusal the items already appended are truncated back), counts what it
 * computed (llmem_step_shape) and the device bytes copied meanwhile, and
 * asks the model for its time.
 *
 * write_kv: every slot appended is written, K and V of every layer, with a
 * pattern whose seed is the prefix hash of the position (a chain over the
 * sequence's tokens), so forks and prefix matches, which share blocks, see
 * the same pattern. Before a sequence is freed, and after a swap-in, its
 * first, last and five pseudo-random positions are checked; a mismatch is a
 * corruption (counted: llmem_sched_get_sim_stats). The chain per position
 * is kept per sequence slot ([max_seq_len] words, allocated when a slot is
 * first used and reused after).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmem/kv.h"
#include "llmem/resource.h"

#include "../core/hash.h"
#include "../core/internal.h"
#include "sched_backend.h"

typedef struct sim_seq {
    llmem_kv_seq kvs;
    uint32_t gen;
    bool live;
    size_t len;        /* positions held (write_kv) */
    uint64_t *ph;      /* write_kv: [max_len] prefix hash per position */
} sim_seq;

typedef struct sim_backend {
    llmem_sched_sim_options o;
    llmem_kv *kv;
    size_t max_len, token_bytes;
    uint32_t layers;
    sim_seq *seqs;
    uint32_t nseqs, cap;
    uint64_t clock_ns;           /* simulated */
    uint64_t t0_ns;              /* realtime: the clock's zero */
    uint64_t copy_before;
    uint64_t rng;
    llmem_sched_sim_stats st;
} sim_backend;

static uint64_t slot_seed(uint64_t ph, uint32_t layer, int which)
{
    return llmem__mix64(ph ^ ((uint64_t)layer * 2 + (uint64_t)which + 1) * 0x2545f4914f6cdd1dull);
}

static void fill(void *dst, size_t bytes, uint64_t seed)
{
    unsigned char *p = dst;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w = seed + i / 8;
        memcpy(p + i, &w, 8);
    }
    for (; i < bytes; i++) p[i] = (unsigned char)(seed >> (8 * (i % 8)));
}

static bool same(const void *src, size_t bytes, uint64_t seed)
{
    const unsigned char *p = src;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w != seed + i / 8) return false;
    }
    for (; i < bytes; i++)
        if (p[i] != (unsigned char)(seed >> (8 * (i % 8)))) return false;
    return true;
}

static sim_seq *get(sim_backend *b, uint64_t h)
{
    uint32_t idx = (uint32_t)(h & 0xffffffffu);
    if (!idx || idx > b->nseqs) return NULL;
    sim_seq *q = &b->seqs[idx - 1];
    return q->live && q->gen == (uint32_t)(h >> 32) ? q : NULL;
}

static uint64_t s_now(const void *bp)
{
    const sim_backend *b = bp;
    return b->o.realtime ? llmem__now_ns() - b->t0_ns : b->clock_ns;
}

static llmem_status s_create(void *bp, uint64_t *out)
{
    sim_backend *b = bp;
    uint32_t idx = 0;
    while (idx < b->nseqs && b->seqs[idx].live) idx++;
    if (idx == b->nseqs) {
        if (b->nseqs == b->cap) {
            uint32_t ncap = b->cap ? b->cap * 2 : 64;
            sim_seq *n = realloc(b->seqs, ncap * sizeof *n);
            if (!n) return llmem__fail(LLMEM_ENOMEM, "sched sim: no memory for its sequence table");
            memset(n + b->cap, 0, (ncap - b->cap) * sizeof *n);
            b->seqs = n;
            b->cap = ncap;
        }
        b->nseqs++;
    }
    sim_seq *q = &b->seqs[idx];
    if (b->o.write_kv && !q->ph && !(q->ph = malloc(b->max_len * sizeof *q->ph)))
        return llmem__fail(LLMEM_ENOMEM, "sched sim: no memory for a sequence's pattern chain");
    llmem_status st = llmem_kv_seq_create(b->kv, 0, &q->kvs);
    if (st) return st;
    q->live = true;
    q->len = 0;
    *out = ((uint64_t)q->gen << 32) | (idx + 1);
    return LLMEM_OK;
}

static void verify_pos(sim_backend *b, sim_seq *q, size_t p)
{
    for (uint32_t l = 0; l < b->layers; l++) {
        void *k, *v;
        if (llmem_kv_seq_token(b->kv, q->kvs, l, p, &k, &v)) {
            b->st.kv_corruptions_total++;
            return;
        }
        if (!same(k, b->token_bytes, slot_seed(q->ph[p], l, 0)) || !same(v, b->token_bytes, slot_seed(q->ph[p], l, 1)))
            b->st.kv_corruptions_total++;
    }
    b->st.kv_positions_verified_total++;
}

/* The first, last and five random held positions. */
static void verify(sim_backend *b, sim_seq *q)
{
    if (!b->o.write_kv || !q->len) return;
    llmem_kv_seq_info info;
    if (llmem_kv_seq_get_info(b->kv, q->kvs, &info) || info.swapped) return;
    size_t first = info.first, n = q->len - first;
    if (!n) return;
    verify_pos(b, q, first);
    verify_pos(b, q, q->len - 1);
    for (int i = 0; i < 5; i++) {
        b->rng ^= b->rng << 13, b->rng ^= b->rng >> 7, b->rng ^= b->rng << 17;
        verify_pos(b, q, first + (size_t)(b->rng % n));
    }
}

static void s_free(void *bp, uint64_t h)
{
    sim_backend *b = bp;
    sim_seq *q = get(b, h);
    if (!q) return;
    verify(b, q);
    llmem_kv_seq_free(b->kv, q->kvs);
    q->live = false;
    q->gen++;
    q->len = 0;
}

static void chain(sim_backend *b, sim_seq *q, const int32_t *tokens, size_t from, size_t to)
{
    if (!b->o.write_kv) return;
    for (size_t p = from; p < to; p++) q->ph[p] = llmem__prefix_step(p ? q->ph[p - 1] : 0, tokens[p - from], p);
}

static llmem_status s_match(void *bp, uint64_t h, const int32_t *tokens, size_t n, size_t *matched)
{
    sim_backend *b = bp;
    sim_seq *q = get(b, h);
    if (!q) return llmem__fail(LLMEM_EINVAL, "sched sim: unknown sequence");
    llmem_status st = llmem_kv_seq_match_prefix(b->kv, q->kvs, tokens, n, matched);
    if (st) return st;
    chain(b, q, tokens, 0, *matched);
    q->len = *matched;
    return LLMEM_OK;
}

static llmem_status s_fork(void *bp, uint64_t parent, uint64_t *child)
{
    sim_backend *b = bp;
    sim_seq *p = get(b, parent);
    if (!p) return llmem__fail(LLMEM_EINVAL, "sched sim: unknown sequence");
    size_t plen = p->len;
    uint32_t pidx = (uint32_t)(parent & 0xffffffffu) - 1;
    uint64_t h;
    llmem_status st = s_create(b, &h);
    if (st) return st;
    p = &b->seqs[pidx]; /* the table may have moved */
    sim_seq *c = get(b, h);
    llmem_kv_seq_free(b->kv, c->kvs);
    if ((st = llmem_kv_seq_fork(b->kv, p->kvs, &c->kvs))) {
        c->live = false;
        c->gen++;
        return st;
    }
    c->len = plen;
    if (b->o.write_kv) memcpy(c->ph, p->ph, plen * sizeof *c->ph);
    *child = h;
    return LLMEM_OK;
}

static llmem_status s_swap_out(void *bp, uint64_t h)
{
    sim_backend *b = bp;
    sim_seq *q = get(b, h);
    if (!q) return llmem__fail(LLMEM_EINVAL, "sched sim: unknown sequence");
    return llmem_kv_seq_swap_out(b->kv, q->kvs);
}

static llmem_status s_swap_in(void *bp, uint64_t h)
{
    sim_backend *b = bp;
    sim_seq *q = get(b, h);
    if (!q) return llmem__fail(LLMEM_EINVAL, "sched sim: unknown sequence");
    llmem_status st = llmem_kv_seq_swap_in(b->kv, q->kvs);
    if (!st) verify(b, q); /* the bytes came back */
    return st;
}

static llmem_status append(sim_backend *b, sim_seq *q, const llmem__sched_item *it)
{
    size_t n = it->n, with = n;
    if (it->cache_end) with = it->cache_end <= it->context ? 0 : it->cache_end - it->context < n ? it->cache_end - it->context : n;
    llmem_status st = LLMEM_OK;
    if (with) st = llmem_kv_seq_append(b->kv, q->kvs, with, it->tokens, NULL);
    if (!st && n > with && (st = llmem_kv_seq_append(b->kv, q->kvs, n - with, NULL, NULL)) && with)
        llmem_kv_seq_rollback(b->kv, q->kvs, it->context);
    return st;
}

static void sleep_s(double s)
{
    if (!(s > 0)) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

static llmem_status s_step(void *bp, const llmem__sched_item *items, size_t n, double *seconds)
{
    sim_backend *b = bp;
    llmem_step_shape sh;
    memset(&sh, 0, sizeof sh);
    for (size_t i = 0; i < n; i++) {
        sim_seq *q = get(b, items[i].seq);
        llmem_status st = q ? append(b, q, &items[i]) : llmem__fail(LLMEM_EINVAL, "sched sim: unknown sequence");
        if (st) {
            for (size_t j = 0; j < i; j++) llmem_kv_seq_rollback(b->kv, get(b, items[j].seq)->kvs, items[j].context);
            return st;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const llmem__sched_item *it = &items[i];
        sim_seq *q = get(b, it->seq);
        if (b->o.write_kv) {
            chain(b, q, it->tokens, it->context, it->context + it->n);
            for (size_t p = it->context; p < it->context + it->n; p++)
                for (uint32_t l = 0; l < b->layers; l++) {
                    void *k, *v;
                    llmem_status st = llmem_kv_seq_token(b->kv, q->kvs, l, p, &k, &v);
                    if (st) return st;
                    fill(k, b->token_bytes, slot_seed(q->ph[p], l, 0));
                    fill(v, b->token_bytes, slot_seed(q->ph[p], l, 1));
                }
            b->st.kv_slots_written_total += it->n;
        }
        q->len = it->context + it->n;
        sh.sequences++;
        double ctx = (double)it->context, m = (double)it->n;
        if (it->n == 1 && it->context > 0) {
            sh.decode_seqs++;
            sh.decode_kv_tokens += ctx + 1;
        } else {
            sh.prefill_tokens += it->n;
        }
        sh.attn_pairs += m * ctx + m * (m + 1) / 2;
    }
    if (b->o.device) {
        llmem_resource_stats rs = {sizeof rs};
        llmem_resource_get_stats(b->o.device, &rs);
        sh.copy_bytes = rs.copy_bytes_total - b->copy_before;
        b->copy_before = rs.copy_bytes_total;
        b->st.copy_bytes_total += sh.copy_bytes;
    }
    double dt = llmem_step_model_time(&b->o.model, &sh);
    *seconds = dt;
    if (b->o.realtime) sleep_s(dt);
    else b->clock_ns += (uint64_t)llround(dt * 1e9);
    return LLMEM_OK;
}

static llmem_status s_advance(void *bp, uint64_t t_ns)
{
    sim_backend *b = bp;
    if (b->o.realtime) {
        uint64_t now = s_now(b);
        if (t_ns > now) sleep_s((double)(t_ns - now) * 1e-9);
    } else if (t_ns > b->clock_ns) {
        b->clock_ns = t_ns;
    }
    return LLMEM_OK;
}

static void s_destroy(void *bp)
{
    sim_backend *b = bp;
    if (!b) return;
    for (uint32_t i = 0; i < b->nseqs; i++) {
        if (b->seqs[i].live) llmem_kv_seq_free(b->kv, b->seqs[i].kvs);
        free(b->seqs[i].ph);
    }
    free(b->seqs);
    free(b);
}

const llmem__sched_ops llmem__sched_sim_ops = {
    /* .name = */ "sim",
    /* .reports_stages = */ false,
    /* .seq_create = */ s_create,
    /* .seq_free = */ s_free,
    /* .match_prefix = */ s_match,
    /* .fork = */ s_fork,
    /* .swap_out = */ s_swap_out,
    /* .swap_in = */ s_swap_in,
    /* .step = */ s_step,
    /* .logits = */ NULL,
    /* .set_idle = */ NULL,
    /* .now_ns = */ s_now,
    /* .advance = */ s_advance,
    /* .destroy = */ s_destroy,
};

llmem_sched_sim_options llmem_sched_sim_options_default(void)
{
    llmem_sched_sim_options o;
    memset(&o, 0, sizeof o);
    o.model = llmem_step_model_linear(0.001, 0, 0, 0);
    o.vocab = 32000;
    o.seed = 1;
    return o;
}

llmem_status llmem__sched_sim_backend(const llmem_sched_sim_options *so, llmem__sched_backend *out)
{
    if (!so->kv) return llmem__fail(LLMEM_EINVAL, "sched sim: no KV");
    llmem_status st = llmem_step_model_check(&so->model);
    if (st) return st;
    llmem_kv_room kr;
    if ((st = llmem_kv_get_room(so->kv, &kr))) return st;
    sim_backend *b = calloc(1, sizeof *b);
    if (!b) return llmem__fail(LLMEM_ENOMEM, "sched sim: no memory");
    b->o = *so;
    if (!b->o.vocab) b->o.vocab = 32000;
    b->kv = so->kv;
    b->max_len = kr.max_seq_len;
    b->token_bytes = llmem_kv_token_layer_bytes(so->kv);
    b->layers = (uint32_t)(llmem_kv_token_total_bytes(so->kv) / (2 * b->token_bytes));
    b->rng = llmem__mix64(so->seed ? so->seed : 1) | 1;
    b->t0_ns = llmem__now_ns();
    memset(out, 0, sizeof *out);
    out->ops = &llmem__sched_sim_ops;
    out->self = b;
    out->kv = so->kv;
    out->vocab = b->o.vocab;
    out->max_seq_len = (uint32_t)kr.max_seq_len;
    out->can_swap = kr.can_swap;
    out->realtime = so->realtime;
    return LLMEM_OK;
}

llmem_status llmem__sched_sim_stats(void *bp, llmem_sched_sim_stats *out)
{
    sim_backend *b = bp;
    llmem_sched_sim_stats st = b->st;
    size_t n = llmem_stats_fill_size(out->struct_size, sizeof st);
    st.struct_size = n;
    memcpy(out, &st, n);
    return LLMEM_OK;
}
