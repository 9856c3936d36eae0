/*
 * engine.c - the llama forward pass over llmem's pool, KV manager and arena.
 *
 * A step takes items (sequence, n new tokens). Its T tokens are laid out
 * as rows: x[T][dim] holds the residual stream of every token of every
 * item, so each matrix multiply of a layer runs once over all T rows
 * (llmem__matmul reads each weight row once per step). Attention is the
 * only per-token part: a token at position p of sequence s attends to
 * positions 0..p of s, read through s's block table for the layer. The
 * layer's new K and V are written into the cache before attention runs, so
 * a prompt token sees the earlier prompt tokens of the same step (causal
 * prefill in one pass).
 *
 * Memory, decided at creation so a step allocates nothing:
 *  - every activation buffer comes from one fixed arena sized for the
 *    largest step (max_step_tokens tokens, max_seqs items) and reset at the
 *    start of each step; logits stay valid until the next step;
 *  - sequence slots and layer descriptors come from the pool at creation;
 *  - KV comes from llmem_kv, whose slabs come from the pool;
 *    llmem_engine_seq_reserve lets a scheduler take them at admission.
 * With ALLOC_MALLOC, the same buffers are malloc'd and freed every step
 * and each sequence callocs a max_seq_len cache, as llama2.c does: that is
 * the baseline the benchmarks compare against.
 *
 * Addressing the cache is the same for both: per item and layer, a table of
 * K and V block bases and a block length in tokens (the KV manager's block,
 * or the whole max_seq_len buffer). Position p lives in block p / len at
 * row p % len.
 *
 * Attention, rope and the KV tables are in attention.c; binding,
 * converting and repacking the weights at creation in weights.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/arena.h"
#include "llmem/engine.h"
#include "llmem/planner.h"
#include "llmem/sampler.h"

#include "../core/internal.h"
#include "engine_internal.h"
#include "kernels.h"
#include "threads.h"
#include "weights.h"

llmem_engine_options llmem_engine_options_default(void)
{
    llmem_engine_options o;
    memset(&o, 0, sizeof o);
    o.max_seqs = 16;
    o.max_step_tokens = 512;
    o.kv_strategy = LLMEM_KV_PAGED;
    o.kv_dtype = LLMEM_KV_F32;
    o.kv_block_tokens = 16;
    return o;
}

static void notify(llmem_engine *e, llmem_stage stage, uint32_t batch, uint64_t tokens)
{
    llmem_stage_event ev = {stage, batch, tokens, llmem__now_ns()};
    /* The stage counts are the engine's own (the pool below keeps none). */
    if (e->st.stage != (uint64_t)stage) e->st.stage_changes_total++;
    e->st.stage = (uint64_t)stage;
    if (stage == LLMEM_STAGE_PREFILL) e->st.prefill_steps_total++;
    if (stage == LLMEM_STAGE_DECODE) e->st.decode_steps_total++;
    if (e->o.on_stage) e->o.on_stage(e->o.stage_ctx, &ev);
}

/* ---- memory the engine keeps: pool, or malloc as the baseline ---------------------- */

void *llmem__engine_keep_alloc(llmem_engine *e, size_t bytes)
{
    if (e->use_malloc) {
        void *p = calloc(1, bytes);
        if (p) e->malloc_bytes += bytes;
        return p;
    }
    return llmem_pool_calloc(e->pool, 1, bytes, NULL);
}

static void keep_free(llmem_engine *e, void *p, size_t bytes)
{
    if (!p) return;
    if (e->use_malloc) {
        free(p);
        e->malloc_bytes -= bytes;
    } else {
        llmem_pool_free(e->pool, p);
    }
}

/* ---- the activation workspace --------------------------------------------------------- */

#define WS_ALIGN 64

/* The step as a graph for the planner: each temporary with its size and
 * the operations that write it first and read it last. One layer's body
 * stands for all of them (its temporaries die within it; what crosses
 * layers - the token rows and x - lives through it):
 *   0 embed, 1 attention norm, 2 q/k/v, 3 rope and store K/V (block
 *   tables filled), 4 attention, 5 output projection, 6 residual, 7 FFN
 *   norm, 8 gate/up, 9 SwiGLU (in place over gate), 10 down, 11 residual,
 *   12 final norm, 13 classifier, 14 the logits handed out. */
enum {
    G_TOK_ITEM, G_TOK_POS, G_X, G_XB, G_Q, G_K, G_V, G_KTAB, G_VTAB, G_TABLEN, G_TABFIRST, G_SCORES, G_ATT_OUT, G_XO,
    G_XF, G_HB, G_HB2, G_XD, G_XLAST, G_LOGITS, G_XQ, G_ROPE, G_COUNT
};

typedef struct graph_dims {
    size_t dim, qdim, kvdim, ffn, vocab, max_seq_len, blocks_max;
    unsigned threads;
    size_t rope;    /* floats per token of the rope angles: 2 * rotated pairs per head */
    size_t xq_row;  /* bytes per token of the widest matmul or group's quantised activation rows; 0: none */
} graph_dims;

/* a * b * c, or SIZE_MAX when it does not fit (plan_step refuses it). */
static size_t bytes3(size_t a, size_t b, size_t c)
{
    size_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_mul_overflow(r, c, &r)) return SIZE_MAX;
    return r;
}

static void graph(const graph_dims *d, size_t T, size_t S, llmem_plan_tensor *t)
{
#define G(id, nm, bytes, a, b) t[id] = (llmem_plan_tensor){nm, (bytes), (a), (b), -1, 0}
    G(G_TOK_ITEM, "tok_item", bytes3(T, 1, sizeof(uint32_t)), 0, 11);
    G(G_TOK_POS, "tok_pos", bytes3(T, 1, sizeof(uint32_t)), 0, 11);
    G(G_X, "x", bytes3(T, d->dim, sizeof(float)), 0, 12);
    G(G_XB, "attn_in", bytes3(T, d->dim, sizeof(float)), 1, 2);
    G(G_Q, "q", bytes3(T, d->qdim, sizeof(float)), 2, 4);
    G(G_K, "k", bytes3(T, d->kvdim, sizeof(float)), 2, 3);
    G(G_V, "v", bytes3(T, d->kvdim, sizeof(float)), 2, 3);
    G(G_KTAB, "k_table", bytes3(S, d->blocks_max, sizeof(void *)), 3, 4);
    G(G_VTAB, "v_table", bytes3(S, d->blocks_max, sizeof(void *)), 3, 4);
    G(G_TABLEN, "table_len", bytes3(S, 1, sizeof(size_t)), 3, 4);
    G(G_TABFIRST, "table_first", bytes3(S, 1, sizeof(size_t)), 3, 4);
    G(G_SCORES, "scores", bytes3(d->threads, d->max_seq_len, sizeof(float)), 4, 4);
    G(G_ATT_OUT, "attn_out", bytes3(T, d->qdim, sizeof(float)), 4, 5);
    G(G_XO, "attn_proj", bytes3(T, d->dim, sizeof(float)), 5, 6);
    G(G_XF, "ffn_in", bytes3(T, d->dim, sizeof(float)), 7, 8);
    G(G_HB, "gate", bytes3(T, d->ffn, sizeof(float)), 8, 10);
    G(G_HB2, "up", bytes3(T, d->ffn, sizeof(float)), 8, 9);
    G(G_XD, "down", bytes3(T, d->dim, sizeof(float)), 10, 11);
    G(G_XLAST, "last_rows", bytes3(S, d->dim, sizeof(float)), 12, 13);
    G(G_LOGITS, "logits", bytes3(S, d->vocab, sizeof(float)), 13, 14);
    /* Scratch of every matmul (2, 5, 8, 10, 13): live across them all. */
    G(G_XQ, "act_q8", bytes3(T > S ? T : S, d->xq_row, 1), 2, 13);
    /* Set in the first layer's rope, read by every layer's: live across all. */
    G(G_ROPE, "rope_angles", bytes3(T, d->rope, sizeof(float)), 0, 11);
#undef G
}

static graph_dims dims_of(const llmem_engine *e)
{
    return (graph_dims){e->dim, e->qdim, e->kvdim, e->ffn, e->vocab, e->o.max_seq_len, e->blocks_max,
                        llmem__threads_count(e->th), 2 * llmem__rope_pairs(e->hd, e->rope_dim), e->xq_row};
}

/* Plan a step of T tokens and S items into t (G_COUNT entries). */
static llmem_status plan_step(const graph_dims *d, size_t T, size_t S, llmem_plan_tensor *t, llmem_plan_result *r)
{
    uint32_t scratch[2 * G_COUNT + 1];
    graph(d, T, S, t);
    for (size_t i = 0; i < G_COUNT; i++)
        if (t[i].bytes == SIZE_MAX)
            return llmem__fail(LLMEM_EOVERFLOW, "engine plan: the '%s' buffer of a %zu-token step overflows the "
                               "address space (the shape or the step is too large)", t[i].name, T);
    return llmem_plan(t, G_COUNT, WS_ALIGN, scratch, sizeof scratch, r);
}

static void carve(char *base, const llmem_plan_tensor *t, step_bufs *b)
{
#define AT(field, id) b->field = (void *)(base + t[id].offset)
    AT(tok_item, G_TOK_ITEM);
    AT(tok_pos, G_TOK_POS);
    AT(x, G_X);
    AT(xb, G_XB);
    AT(q, G_Q);
    AT(k, G_K);
    AT(v, G_V);
    AT(ktab, G_KTAB);
    AT(vtab, G_VTAB);
    AT(tab_len, G_TABLEN);
    AT(tab_first, G_TABFIRST);
    AT(scores, G_SCORES);
    AT(att_out, G_ATT_OUT);
    AT(xo, G_XO);
    AT(xf, G_XF);
    AT(hb, G_HB);
    AT(hb2, G_HB2);
    AT(xd, G_XD);
    AT(xlast, G_XLAST);
    AT(logits, G_LOGITS);
    AT(xq, G_XQ);
    AT(rope, G_ROPE);
#undef AT
}

llmem_status llmem_engine_plan_step(const llmem_shape *s, uint32_t tokens, uint32_t seqs, uint32_t max_seq_len,
                                    unsigned threads, llmem_plan_result *out)
{
    if (!s || !out || !tokens || !seqs || !threads || !max_seq_len)
        return llmem__fail(LLMEM_EINVAL, "engine plan: null shape or result, or a zero count");
    if (!s->hidden || !s->heads || !s->kv_heads || !s->head_dim || !s->ffn || !s->vocab)
        return llmem__fail(LLMEM_EINVAL, "engine plan: incomplete shape");
    graph_dims d = {s->hidden, bytes3(s->heads, s->head_dim, 1), bytes3(s->kv_heads, s->head_dim, 1), s->ffn, s->vocab,
                    max_seq_len, ((size_t)max_seq_len + 15) / 16 + 1, threads, 2 * llmem__rope_pairs(s->head_dim, s->head_dim), 0};
    llmem_plan_tensor t[G_COUNT];
    return plan_step(&d, tokens, seqs, t, out);
}

/* ---- create / destroy ----------------------------------------------------------------- */

/* Slabs of two blocks per layer, whatever their size: on the host there is
 * no device granularity to amortise, and a sequence wastes about half a
 * slab (the manager's 64 KiB floor left small models at ~55% KV
 * utilisation in llmem demo; two blocks: ~85%). */
static size_t kv_slab_bytes(uint32_t block_tokens, uint32_t kvdim, llmem_kv_dtype dtype)
{
    size_t block_layer = 2 * (size_t)block_tokens * kvdim * (dtype == LLMEM_KV_F16 ? 2 : 4);
    return 2 * block_layer > llmem__page_size() ? 2 * block_layer : llmem__page_size();
}

static llmem_status check_options(const llmem_model_config *c, llmem_engine_options *o)
{
    if (!o->max_seqs) o->max_seqs = 16;
    if (!o->max_step_tokens) o->max_step_tokens = 512;
    if (!o->kv_block_tokens) o->kv_block_tokens = 16;
    if (!o->max_seq_len) o->max_seq_len = c->shape.max_ctx;
    if (o->max_seqs > MAX_SEQS) return llmem__fail(LLMEM_EINVAL, "engine: max_seqs %u above %u", o->max_seqs, MAX_SEQS);
    if (o->max_seq_len > c->shape.max_ctx)
        return llmem__fail(LLMEM_EINVAL, "engine: max_seq_len %u above the model's context %u", o->max_seq_len,
                           c->shape.max_ctx);
    if (o->max_step_tokens > (1u << 20))
        return llmem__fail(LLMEM_EINVAL, "engine: max_step_tokens %u is absurd", o->max_step_tokens);
    if (o->kv_dtype != LLMEM_KV_F32 && o->kv_dtype != LLMEM_KV_F16)
        return llmem__fail(LLMEM_ENOTSUP, "engine: KV element type %d not supported (f32 or f16)", (int)o->kv_dtype);
    if (o->alloc != LLMEM_ENGINE_ALLOC_LLMEM && o->alloc != LLMEM_ENGINE_ALLOC_MALLOC)
        return llmem__fail(LLMEM_EINVAL, "engine: unknown alloc mode %d", (int)o->alloc);
    if ((unsigned)o->kv_strategy > LLMEM_KV_CONTIGUOUS)
        return llmem__fail(LLMEM_EINVAL, "engine: unknown KV strategy %d", (int)o->kv_strategy);
    return LLMEM_OK;
}

llmem_status llmem_engine_create(const llmem_model *m, const llmem_engine_options *opts, llmem_engine **out)
{
    if (!m || !out) return llmem__fail(LLMEM_EINVAL, "engine create: null argument");
    *out = NULL;
    const llmem_model_config *c = llmem_model_get_config(m);
    llmem_engine_options o = opts ? *opts : llmem_engine_options_default();
    llmem_status st = check_options(c, &o);
    if (st) return st;
    llmem_engine *e = calloc(1, sizeof *e);
    if (!e) return llmem__fail(LLMEM_ENOMEM, "engine: no memory");
    e->model = m;
    e->o = o;
    e->use_malloc = o.alloc == LLMEM_ENGINE_ALLOC_MALLOC;
    const llmem_shape *s = &c->shape;
    e->L = s->layers;
    e->dim = s->hidden;
    e->heads = s->heads;
    e->kvh = s->kv_heads;
    e->hd = s->head_dim;
    e->qdim = s->heads * s->head_dim;
    e->kvdim = s->kv_heads * s->head_dim;
    e->ffn = s->ffn;
    e->vocab = s->vocab;
    e->rope_dim = c->rope_dim ? c->rope_dim : s->head_dim;
    e->theta = (float)s->rope_theta;
    e->rope_style = c->rope_style;
    e->window = o.attn_window == LLMEM_ENGINE_FULL_ATTENTION ? 0 : o.attn_window ? o.attn_window : c->sliding_window;
    if (e->window >= o.max_seq_len) e->window = 0; /* no sequence gets past it: full attention */
    if (e->window && !e->use_malloc && o.kv_strategy == LLMEM_KV_PAGED) {
        /* The KV keeps the window plus chunk positions, so a pass of up to
         * chunk + 1 tokens past the window still finds every position its
         * tokens attend to (window_chunk). */
        e->chunk = 4 * o.kv_block_tokens;
        e->kv_window = e->window + e->chunk;
    }
    e->eps = c->norm_eps > 0 ? c->norm_eps : 1e-5f;
    e->kv_elem = o.kv_dtype == LLMEM_KV_F16 ? 2 : 4;
    e->tok_bytes = (size_t)e->kvdim * e->kv_elem;

    if (!e->use_malloc) {
        e->pool = o.pool;
        if (!e->pool) {
            llmem_pool_options po = llmem_pool_options_default();
            po.name = "engine";
            /* Plain pages, small first superblock: the KV grows a block at a
             * time, and a transparent huge page would make one touched
             * block cost 2 MiB of RSS (measured: 6.0 vs 3.8 MB peak on
             * stories260K). The pool still grows geometrically. */
            po.resource = llmem_resource_default();
            po.first_superblock_bytes = 1u << 20;
            if ((st = llmem_pool_create(&po, &e->pool))) goto fail;
            e->own_pool = true;
        }
        /* Everything else the engine takes through llmem comes from the
         * pool's resource too, so a tracking or fault-injecting resource
         * under the pool sees all of it. */
        e->res = llmem_pool_get_resource(e->pool);
        if (llmem_resource_kind(e->res) != LLMEM_MEM_HOST) e->res = llmem_resource_default();
    }
    notify(e, LLMEM_STAGE_LOAD, 0, 0);
    if ((st = llmem__threads_create(o.threads, &e->th))) goto fail;
    if (!(e->layers = llmem__engine_keep_alloc(e, (size_t)e->L * sizeof *e->layers)) ||
        !(e->seqs = llmem__engine_keep_alloc(e, (size_t)o.max_seqs * sizeof *e->seqs)) ||
        (e->kv_window && !(e->sub_items = llmem__engine_keep_alloc(e, (size_t)o.max_seqs * sizeof *e->sub_items)))) {
        st = llmem__fail(LLMEM_ENOMEM, "engine: no memory for its tables");
        goto fail;
    }
    if ((st = llmem__engine_load_weights(e))) goto fail;

    if (!e->use_malloc) {
        llmem_kv_options ko = llmem_kv_options_default();
        ko.name = "engine-kv";
        ko.strategy = o.kv_strategy;
        ko.layers = e->L;
        ko.kv_heads = e->kvh;
        ko.head_dim = e->hd;
        ko.dtype = o.kv_dtype;
        ko.block_tokens = o.kv_block_tokens;
        ko.max_seq_len = o.max_seq_len;
        ko.budget_bytes = o.kv_budget_bytes;
        ko.pool = e->pool;
        ko.meta_resource = e->res;
        ko.slab_bytes = kv_slab_bytes(o.kv_block_tokens, e->kvdim, o.kv_dtype);
        ko.prefix_cache = o.kv_prefix_cache && o.kv_strategy == LLMEM_KV_PAGED;
        ko.swap_resource = o.kv_swap_resource;
        ko.swap_budget_bytes = o.kv_swap_budget_bytes;
        if ((st = llmem_kv_create(&ko, &e->kv))) goto fail;
        /* STATIC and BUCKETS hand a sequence's buffer out as a run of blocks;
         * PAGED at most one block more than its tokens need. */
        e->blocks_max = ((size_t)o.max_seq_len + o.kv_block_tokens - 1) / o.kv_block_tokens + 1;
    } else {
        e->blocks_max = 1;
    }

    {
        graph_dims d = dims_of(e);
        llmem_plan_tensor t[G_COUNT];
        llmem_plan_result pr;
        if ((st = plan_step(&d, o.max_step_tokens, o.max_seqs, t, &pr))) goto fail;
        e->ws_bytes = pr.peak_bytes;
        e->st.workspace_naive_bytes = pr.naive_bytes;
        e->st.workspace_lower_bound_bytes = pr.lower_bound_bytes;
    }
    if (!e->use_malloc) {
        /* The engine maps the workspace itself and hands it to the arena as
         * its buffer: workspace_fit decommits and commits parts of it, so
         * only the engine knows how much is committed when it is unmapped. */
        if ((st = llmem_resource_round(e->res, e->ws_bytes + WS_ALIGN, &e->ws_map))) goto fail;
        void *ws;
        if ((st = llmem_resource_map_tagged(e->res, e->ws_map, 0, 0, "engine-workspace", &ws))) goto fail;
        e->ws_base = ws;
        e->ws_commit_end = e->ws_map; /* mapped committed */
        llmem_arena_options ao = llmem_arena_options_default();
        ao.name = "engine-workspace";
        ao.resource = e->res;
        ao.buffer = ws;
        ao.buffer_bytes = e->ws_bytes + WS_ALIGN;
        if ((st = llmem_arena_create(&ao, &e->arena))) goto fail;
    }
    e->st.weights_converted_bytes = e->converted_bytes + e->repacked_bytes;
    e->st.workspace_bytes = e->use_malloc ? 0 : e->ws_bytes;
    notify(e, LLMEM_STAGE_IDLE, 0, 0);
    *out = e;
    return LLMEM_OK;
fail:
    llmem_engine_destroy(e);
    return st;
}

static void free_step_malloc(llmem_engine *e)
{
    for (size_t i = 0; i < e->step_malloc_n; i++) free(e->step_malloc[i]);
    e->step_malloc_n = 0;
    e->logits = NULL;
}

void llmem_engine_destroy(llmem_engine *e)
{
    if (!e) return;
    if (e->seqs)
        for (uint32_t i = 0; i < e->o.max_seqs; i++) {
            eng_seq *q = &e->seqs[i];
            if (!q->live) continue;
            if (e->kv) llmem_kv_seq_free(e->kv, q->kvs);
            size_t bytes = (size_t)e->L * e->o.max_seq_len * e->tok_bytes;
            keep_free(e, q->kbuf, bytes);
            keep_free(e, q->vbuf, bytes);
        }
    free_step_malloc(e);
    llmem_kv_destroy(e->kv);
    llmem_arena_destroy(e->arena);
    if (e->ws_base) llmem_resource_unmap(e->res, e->ws_base, e->ws_map, e->ws_commit_end);
    keep_free(e, e->converted, e->converted_bytes);
    if (e->repacked) llmem_resource_unmap(e->res, e->repacked, e->repacked_map, e->repacked_map);
    keep_free(e, e->seqs, (size_t)e->o.max_seqs * sizeof *e->seqs);
    keep_free(e, e->sub_items, (size_t)e->o.max_seqs * sizeof *e->sub_items);
    keep_free(e, e->layers, (size_t)e->L * sizeof *e->layers);
    llmem__threads_destroy(e->th);
    if (e->own_pool) llmem_pool_destroy(e->pool);
    free(e);
}

/* ---- sequences ---------------------------------------------------------------------- */

static eng_seq *seq_get(const llmem_engine *e, llmem_engine_seq id)
{
    uint32_t idx = id & SEQ_INDEX_MASK;
    if (!idx || idx > e->o.max_seqs) return NULL;
    eng_seq *q = &e->seqs[idx - 1];
    if (!q->live || q->gen != id >> SEQ_INDEX_BITS) return NULL;
    return q;
}

/* A free slot, or LLMEM_ECAPACITY. */
static llmem_status seq_slot(llmem_engine *e, uint32_t *idx)
{
    uint32_t i = 0;
    while (i < e->o.max_seqs && e->seqs[i].live) i++;
    if (i == e->o.max_seqs)
        return llmem__fail(LLMEM_ECAPACITY, "engine: all %u sequence slots are in use", e->o.max_seqs);
    *idx = i;
    return LLMEM_OK;
}

llmem_status llmem_engine_seq_create(llmem_engine *e, llmem_engine_seq *out)
{
    if (!e || !out) return llmem__fail(LLMEM_EINVAL, "engine seq create: null argument");
    uint32_t idx = 0;
    llmem_status st = seq_slot(e, &idx);
    if (st) return st;
    eng_seq *q = &e->seqs[idx];
    if (e->kv) {
        if ((st = llmem_kv_seq_create(e->kv, e->kv_window, &q->kvs))) return st;
    } else {
        size_t bytes = (size_t)e->L * e->o.max_seq_len * e->tok_bytes;
        q->kbuf = llmem__engine_keep_alloc(e, bytes);
        q->vbuf = llmem__engine_keep_alloc(e, bytes);
        if (!q->kbuf || !q->vbuf) {
            keep_free(e, q->kbuf, bytes);
            keep_free(e, q->vbuf, bytes);
            q->kbuf = q->vbuf = NULL;
            return llmem__fail(LLMEM_ENOMEM, "engine: no memory for a %zu-byte KV buffer", 2 * bytes);
        }
    }
    q->live = true;
    q->broken = false;
    q->len = 0;
    e->live_seqs++;
    *out = (q->gen << SEQ_INDEX_BITS) | (idx + 1);
    return LLMEM_OK;
}

llmem_status llmem_engine_seq_free(llmem_engine *e, llmem_engine_seq s)
{
    if (!e) return llmem__fail(LLMEM_EINVAL, "engine seq free: null engine");
    if (!s) return LLMEM_OK;
    eng_seq *q = seq_get(e, s);
    if (!q) return llmem__fail(LLMEM_EINVAL, "engine: sequence %u is not live", s);
    if (e->kv) llmem_kv_seq_free(e->kv, q->kvs);
    size_t bytes = (size_t)e->L * e->o.max_seq_len * e->tok_bytes;
    keep_free(e, q->kbuf, bytes);
    keep_free(e, q->vbuf, bytes);
    q->kbuf = q->vbuf = NULL;
    q->live = false;
    q->gen = (q->gen + 1) & ((1u << (32 - SEQ_INDEX_BITS)) - 1);
    e->live_seqs--;
    return LLMEM_OK;
}

llmem_status llmem_engine_seq_match_prefix(llmem_engine *e, llmem_engine_seq s, const int32_t *tokens, size_t n,
                                           size_t *matched)
{
    if (matched) *matched = 0;
    if (!e || !matched || (n && !tokens)) return llmem__fail(LLMEM_EINVAL, "engine match prefix: null argument");
    eng_seq *q = seq_get(e, s);
    if (!q) return llmem__fail(LLMEM_EINVAL, "engine: sequence %u is not live", s);
    if (q->len) return llmem__fail(LLMEM_ESTATE, "engine match prefix: sequence %u holds %zu tokens", s, q->len);
    if (!e->kv || !n) return LLMEM_OK;
    if (n > e->o.max_seq_len) n = e->o.max_seq_len;
    llmem_status st = llmem_kv_seq_match_prefix(e->kv, q->kvs, tokens, n, matched);
    if (st) return st;
    q->len = *matched;
    return LLMEM_OK;
}

llmem_status llmem_engine_seq_fork(llmem_engine *e, llmem_engine_seq parent, llmem_engine_seq *child)
{
    if (!e || !child) return llmem__fail(LLMEM_EINVAL, "engine seq fork: null argument");
    eng_seq *p = seq_get(e, parent);
    if (!p) return llmem__fail(LLMEM_EINVAL, "engine: sequence %u is not live", parent);
    if (!e->kv) return llmem__fail(LLMEM_ENOTSUP, "engine seq fork: not with ALLOC_MALLOC");
    uint32_t idx = 0;
    llmem_status st = seq_slot(e, &idx);
    if (st) return st;
    eng_seq *q = &e->seqs[idx];
    if ((st = llmem_kv_seq_fork(e->kv, p->kvs, &q->kvs))) return st;
    q->live = true;
    q->broken = p->broken;
    q->len = p->len;
    e->live_seqs++;
    *child = (q->gen << SEQ_INDEX_BITS) | (idx + 1);
    return LLMEM_OK;
}

/* Swap live sequence s out (or in) through its KV sequence; `what` names
 * the call in messages. */
static llmem_status seq_swap(llmem_engine *e, llmem_engine_seq s, bool out, const char *what)
{
    if (!e) return llmem__fail(LLMEM_EINVAL, "engine seq %s: null engine", what);
    eng_seq *q = seq_get(e, s);
    if (!q) return llmem__fail(LLMEM_EINVAL, "engine: sequence %u is not live", s);
    if (!e->kv) return llmem__fail(LLMEM_ENOTSUP, "engine seq %s: not with ALLOC_MALLOC", what);
    return out ? llmem_kv_seq_swap_out(e->kv, q->kvs) : llmem_kv_seq_swap_in(e->kv, q->kvs);
}

llmem_status llmem_engine_seq_swap_out(llmem_engine *e, llmem_engine_seq s) { return seq_swap(e, s, true, "swap out"); }

llmem_status llmem_engine_seq_swap_in(llmem_engine *e, llmem_engine_seq s) { return seq_swap(e, s, false, "swap in"); }

size_t llmem_engine_seq_length(const llmem_engine *e, llmem_engine_seq s)
{
    const eng_seq *q = e ? seq_get(e, s) : NULL;
    return q ? q->len : 0;
}

llmem_kv_seq llmem_engine_seq_kv(const llmem_engine *e, llmem_engine_seq s)
{
    const eng_seq *q = e && e->kv ? seq_get(e, s) : NULL;
    return q ? q->kvs : 0;
}

llmem_status llmem_engine_seq_reserve(llmem_engine *e, llmem_engine_seq s, size_t tokens)
{
    if (!e) return llmem__fail(LLMEM_EINVAL, "engine seq reserve: null engine");
    eng_seq *q = seq_get(e, s);
    if (!q) return llmem__fail(LLMEM_EINVAL, "engine: sequence %u is not live", s);
    if (!e->kv) return LLMEM_OK; /* the malloc baseline holds max_seq_len already */
    size_t want = q->len + tokens;
    if (want > e->o.max_seq_len) want = e->o.max_seq_len;
    size_t B = e->o.kv_block_tokens;
    size_t blocks = (want + B - 1) / B - (q->len + B - 1) / B;
    if (!blocks) return LLMEM_OK;
    /* New blocks come in slabs per layer; one slab more covers the rounding. */
    size_t bytes = (blocks + 2) * llmem_kv_block_bytes(e->kv) * e->L;
    return llmem_pool_reserve(e->pool, bytes);
}

/* ---- the step --------------------------------------------------------------------------- */

static void *step_take(llmem_engine *e, size_t bytes)
{
    if (!e->use_malloc) return llmem_arena_alloc(e->arena, bytes, WS_ALIGN, NULL);
    void *p = malloc(bytes);
    if (p) e->step_malloc[e->step_malloc_n++] = p;
    return p;
}

/* Decode needs a fraction of the workspace a prompt needed. The first
 * decode step after a prefill gives back the pages beyond its own need
 * (one decommit), so the prompt's activations do not stay resident for
 * the rest of the request; the next prefill commits them again. */
#define WS_RELEASE_MIN (256u << 10)

static llmem_status workspace_fit(llmem_engine *e, char *base, size_t bytes, bool decode)
{
    size_t page = llmem__page_size();
    size_t need = (bytes + page - 1) & ~(page - 1);
    llmem_resource *r = e->res;
    if (need > e->ws_commit_end) {
        llmem_status st = llmem_resource_commit(r, base + e->ws_commit_end, need - e->ws_commit_end);
        if (st) return st;
        e->ws_commit_end = need;
    }
    if (decode && e->ws_touched > need + WS_RELEASE_MIN) {
        /* The whole committed tail, touched or not, so that the committed
         * part stays one prefix of the mapping (what destroy unmaps). */
        size_t end = e->ws_commit_end;
        if (end > need && llmem_resource_decommit(r, base + need, end - need) == LLMEM_OK) {
            e->ws_commit_end = need;
            e->st.workspace_releases_total++;
        }
        e->ws_touched = bytes;
    }
    if (bytes > e->ws_touched) e->ws_touched = bytes;
    return LLMEM_OK;
}

static llmem_status step_buffers(llmem_engine *e, size_t T, size_t S, bool decode, step_bufs *b)
{
    if (!e->use_malloc) {
        llmem_arena_reset(e->arena);
        graph_dims d = dims_of(e);
        llmem_plan_tensor t[G_COUNT];
        llmem_plan_result pr;
        llmem_status st = plan_step(&d, T, S, t, &pr);
        if (st) return st;
        char *base = step_take(e, pr.peak_bytes);
        if (!base) return llmem__fail(LLMEM_ENOMEM, "engine: workspace of %zu bytes refused", pr.peak_bytes);
        if ((st = workspace_fit(e, base, pr.peak_bytes, decode))) return st;
        carve(base, t, b);
        return LLMEM_OK;
    }
    /* The baseline: every buffer its own malloc, freed at the next step. */
    free_step_malloc(e);
#define GET(field, count)                                                                                          \
    if (!(b->field = step_take(e, (size_t)(count) * sizeof(*b->field) + 1))) goto nomem;
    unsigned nth = llmem__threads_count(e->th);
    GET(tok_item, T) GET(tok_pos, T) GET(x, T * e->dim) GET(xb, T * e->dim) GET(xo, T * e->dim)
    GET(xf, T * e->dim) GET(xd, T * e->dim) GET(q, T * e->qdim) GET(k, T * e->kvdim) GET(v, T * e->kvdim)
    GET(att_out, T * e->qdim) GET(hb, T * e->ffn) GET(hb2, T * e->ffn) GET(scores, (size_t)nth * e->o.max_seq_len)
    GET(ktab, S) GET(vtab, S) GET(tab_len, S) GET(tab_first, S) GET(xlast, S * e->dim) GET(logits, S * e->vocab)
    GET(rope, T * 2 * llmem__rope_pairs(e->hd, e->rope_dim))
#undef GET
    if (e->xq_row) {
        /* 64-byte aligned, as the arena's buffers are. */
        char *raw = step_take(e, (T > S ? T : S) * e->xq_row + 64);
        if (!raw) goto nomem;
        b->xq = (void *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    } else {
        b->xq = NULL;
    }
    return LLMEM_OK;
nomem:
    free_step_malloc(e);
    return llmem__fail(LLMEM_ENOMEM, "engine: malloc refused a step buffer");
}

/* Append an item's slots: the positions before cache_end with their tokens
 * (the prefix cache may register their blocks), the rest without. All or
 * nothing. */
static llmem_status append_item(llmem_engine *e, eng_seq *q, const llmem_engine_batch_item *it)
{
    size_t n = it->n, with = n;
    if (it->cache_end) with = it->cache_end <= q->len ? 0 : it->cache_end - q->len < n ? it->cache_end - q->len : n;
    llmem_status st = LLMEM_OK;
    if (with) st = llmem_kv_seq_append(e->kv, q->kvs, with, it->tokens, NULL);
    if (!st && n > with && (st = llmem_kv_seq_append(e->kv, q->kvs, n - with, NULL, NULL)) && with)
        llmem_kv_seq_rollback(e->kv, q->kvs, q->len);
    return st;
}

/* The layers over the step's T token rows (embedded in b->x), then the
 * classifier for each item's last row. Only a damaged KV manager fails. */
static llmem_status forward(llmem_engine *e, step_bufs *b, const llmem_engine_batch_item *items, size_t count,
                            size_t T)
{
    llmem__threads *th = e->th;
    llmem_status st;
    for (uint32_t l = 0; l < e->L; l++) {
        const eng_layer *ly = &e->layers[l];
        llmem__rmsnorm_rows(th, b->xb, b->x, NULL, ly->attn_norm, e->dim, T, e->eps);
        /* Q, K and V from one quantisation of xb, in one run of the team. */
        const llmem__mm qkv[3] = {{b->q, ly->wq, ly->tq, e->qdim}, {b->k, ly->wk, ly->tk, e->kvdim},
                                  {b->v, ly->wv, ly->tv, e->kvdim}};
        llmem__matmul_group(th, qkv, 3, b->xb, e->dim, T, b->xq);
        for (size_t i = 0; i < count; i++)
            if ((st = llmem__engine_fill_table(e, b, seq_get(e, items[i].seq), (uint32_t)i, l))) return st;
        llmem__engine_qkv_finish(e, ly, b, T);
        llmem__engine_attend(e, b, T);
        llmem__matmul(th, b->xo, b->att_out, ly->wo, ly->to, e->qdim, e->dim, T, b->xq);
        /* The residual and the FFN's norm, row by row on the team. */
        llmem__rmsnorm_rows(th, b->xf, b->x, b->xo, ly->ffn_norm, e->dim, T, e->eps);
        const llmem__mm up[2] = {{b->hb, ly->w1, ly->t1, e->ffn}, {b->hb2, ly->w3, ly->t3, e->ffn}};
        llmem__matmul_group(th, up, 2, b->xf, e->dim, T, b->xq);
        llmem__swiglu_team(th, b->hb, b->hb2, T * e->ffn);
        llmem__matmul(th, b->xd, b->hb, ly->w2, ly->t2, e->ffn, e->dim, T, b->xq);
        /* Element-wise: one call over the rows, the same sums as one a row. */
        llmem__axpy(b->x, 1.0f, b->xd, T * e->dim);
    }
    /* The classifier only for each item's last token. */
    size_t t = 0;
    for (size_t i = 0; i < count; i++) {
        t += items[i].n;
        llmem__rmsnorm(b->xlast + i * e->dim, b->x + (t - 1) * e->dim, e->out_norm, e->dim, e->eps);
    }
    llmem__matmul(th, b->logits, b->xlast, e->wcls, e->wcls_type, e->dim, e->vocab, count, b->xq);
    return LLMEM_OK;
}

/* Undo the appends of a pass that failed. Refused only where a window's
 * append already dropped positions the rollback would need: the KV then
 * no longer matches the sequence, which is left broken (only freed). */
static llmem_status rollback_items(llmem_engine *e, const llmem_engine_batch_item *items, size_t count,
                                   llmem_status st)
{
    char why[256]; /* the failure's message, which a refused rollback would overwrite */
    snprintf(why, sizeof why, "%s", llmem_error_message());
    bool refused = false;
    for (size_t i = 0; e->kv && i < count; i++) {
        eng_seq *r = seq_get(e, items[i].seq);
        if (llmem_kv_seq_rollback(e->kv, r->kvs, r->len) != LLMEM_OK) r->broken = refused = true;
    }
    return refused ? llmem__fail(st, "%s", why) : st;
}

/* One pass over checked items of T tokens in all: KV slots, workspace,
 * forward, the sequences' lengths and the stats. All or nothing. */
static llmem_status step_run(llmem_engine *e, const llmem_engine_batch_item *items, size_t count, size_t T,
                             bool prefill)
{
    uint64_t t0 = llmem__now_ns();
    notify(e, prefill ? LLMEM_STAGE_PREFILL : LLMEM_STAGE_DECODE, (uint32_t)count, T);

    /* KV slots first: all or nothing. */
    if (e->kv) {
        for (size_t i = 0; i < count; i++) {
            eng_seq *q = seq_get(e, items[i].seq);
            llmem_status st = append_item(e, q, &items[i]);
            if (st) return rollback_items(e, items, i, st);
        }
    }
    step_bufs b;
    llmem_status st = step_buffers(e, T, count, !prefill, &b);
    if (st) return rollback_items(e, items, count, st);

    /* Token rows: item, position, embedding. */
    size_t t = 0;
    for (size_t i = 0; i < count; i++) {
        eng_seq *q = seq_get(e, items[i].seq);
        for (uint32_t j = 0; j < items[i].n; j++, t++) {
            b.tok_item[t] = (uint32_t)i;
            b.tok_pos[t] = (uint32_t)(q->len + j);
            llmem__dequant_row(e->embd_type, e->embd, (size_t)items[i].tokens[j], e->dim, b.x + t * e->dim);
        }
    }
    if ((st = forward(e, &b, items, count, T))) {
        /* Only a damaged KV manager gets here; the appended slots go back. */
        e->logits = NULL;
        e->logits_count = 0;
        return rollback_items(e, items, count, st);
    }
    e->logits = b.logits;
    e->logits_count = count;

    uint32_t held = 0, per_seq = 0; /* for on_step_done: before this step's tokens count */
    for (size_t i = 0; i < count; i++) {
        eng_seq *q = seq_get(e, items[i].seq);
        if (q->len > held) held = (uint32_t)q->len;
        if (items[i].n > per_seq) per_seq = items[i].n;
        q->len += items[i].n;
    }
    double secs = (double)(llmem__now_ns() - t0) * 1e-9;
    e->st.steps_total++;
    if (prefill) {
        e->st.prefill_tokens_total += T;
        e->st.prefill_seconds_total += secs;
    } else {
        e->st.decode_tokens_total += T;
        e->st.decode_seconds_total += secs;
    }
    if (e->arena) {
        llmem_arena_stats as = {sizeof as};
        if (llmem_arena_get_stats(e->arena, &as) == LLMEM_OK && as.used_bytes > e->st.workspace_peak_bytes)
            e->st.workspace_peak_bytes = as.used_bytes;
        if (e->o.on_step_done && as.used_bytes)
            e->o.on_step_done(e->o.stage_ctx, (uint32_t)count, per_seq, held, as.used_bytes);
    }
    return LLMEM_OK;
}

/* The most tokens one pass may append to a windowed sequence holding len:
 * the KV keeps (at least) its last window + chunk positions, and the
 * first new token (position len) attends back to len - window + 1. */
static size_t window_chunk(const llmem_engine *e, size_t len)
{
    return len + 1 <= e->window ? (size_t)e->window + e->chunk - len : (size_t)e->chunk + 1;
}

/* A step whose windowed items may be longer than one pass takes: first
 * passes of those items alone, window_chunk tokens each, until every item's
 * rest fits; then one pass of all the rests (its logits are the step's).
 * A failure undoes the earlier passes where the KV still holds their start,
 * else leaves the sequence broken (it can only be freed). */
static llmem_status step_windowed(llmem_engine *e, const llmem_engine_batch_item *items, size_t count)
{
    llmem_engine_batch_item *sub = e->sub_items;
    size_t T = 0;
    llmem_status st = LLMEM_OK;
    for (size_t i = 0; i < count; i++) seq_get(e, items[i].seq)->step_start = seq_get(e, items[i].seq)->len;
    for (size_t i = 0; i < count && !st; i++) {
        eng_seq *q = seq_get(e, items[i].seq);
        sub[i] = items[i];
        while (!st && sub[i].n > window_chunk(e, q->len)) {
            llmem_engine_batch_item pass = sub[i];
            pass.n = (uint32_t)window_chunk(e, q->len);
            if (!(st = step_run(e, &pass, 1, pass.n, true))) {
                sub[i].tokens += pass.n;
                sub[i].n -= pass.n;
            }
        }
        T += sub[i].n;
    }
    if (!st) st = step_run(e, sub, count, T, true);
    if (!st) return LLMEM_OK;
    char why[256]; /* the failure's message, which a refused rollback would overwrite */
    snprintf(why, sizeof why, "%s", llmem_error_message());
    for (size_t i = 0; i < count; i++) {
        eng_seq *q = seq_get(e, items[i].seq);
        if (q->len == q->step_start) continue;
        if (llmem_kv_seq_rollback(e->kv, q->kvs, q->step_start) == LLMEM_OK) q->len = q->step_start;
        else q->broken = true;
    }
    e->logits = NULL;
    e->logits_count = 0;
    return llmem__fail(st, "%s", why);
}

llmem_status llmem_engine_step(llmem_engine *e, const llmem_engine_batch_item *items, size_t count)
{
    if (!e || !items || !count) return llmem__fail(LLMEM_EINVAL, "engine step: null engine, items or empty batch");
    if (count > e->o.max_seqs)
        return llmem__fail(LLMEM_ECAPACITY, "engine step: %zu items, at most %u", count, e->o.max_seqs);
    size_t T = 0;
    bool prefill = false, long_item = false;
    for (size_t i = 0; i < count; i++) {
        const llmem_engine_batch_item *it = &items[i];
        eng_seq *q = seq_get(e, it->seq);
        if (!q) return llmem__fail(LLMEM_EINVAL, "engine step: item %zu: sequence %u is not live", i, it->seq);
        if (q->broken)
            return llmem__fail(LLMEM_ESTATE, "engine step: sequence %u lost its start in a failed step; free it",
                               it->seq);
        if (!it->tokens || !it->n) return llmem__fail(LLMEM_EINVAL, "engine step: item %zu has no tokens", i);
        for (size_t j = 0; j < i; j++)
            if (items[j].seq == it->seq)
                return llmem__fail(LLMEM_EINVAL, "engine step: sequence %u appears twice", it->seq);
        for (uint32_t j = 0; j < it->n; j++)
            if (it->tokens[j] < 0 || (uint32_t)it->tokens[j] >= e->vocab)
                return llmem__fail(LLMEM_EINVAL, "engine step: item %zu token %u is %d, outside the vocabulary (%u)",
                                   i, j, it->tokens[j], e->vocab);
        if (q->len + it->n > e->o.max_seq_len)
            return llmem__fail(LLMEM_ERANGE, "engine step: sequence %u would hold %zu tokens, max_seq_len is %u",
                               it->seq, q->len + it->n, e->o.max_seq_len);
        T += it->n;
        if (it->n > 1 || q->len == 0) prefill = true; /* a prompt, even of one token */
        if (e->kv_window && it->n > window_chunk(e, q->len)) long_item = true;
    }
    if (T > e->o.max_step_tokens)
        return llmem__fail(LLMEM_ECAPACITY, "engine step: %zu tokens, at most %u per step", T, e->o.max_step_tokens);
    return long_item ? step_windowed(e, items, count) : step_run(e, items, count, T, prefill);
}

float *llmem_engine_logits(llmem_engine *e, size_t i)
{
    if (!e || !e->logits || i >= e->logits_count) return NULL;
    return e->logits + i * e->vocab;
}

void llmem_engine_set_idle(llmem_engine *e)
{
    if (e) notify(e, LLMEM_STAGE_IDLE, 0, 0);
}

llmem_status llmem_engine_get_info(const llmem_engine *e, llmem_engine_info *out)
{
    if (!e || !out) return llmem__fail(LLMEM_EINVAL, "engine info: null argument");
    memset(out, 0, sizeof *out);
    out->vocab = e->vocab;
    out->max_seqs = e->o.max_seqs;
    out->max_step_tokens = e->o.max_step_tokens;
    out->max_seq_len = e->o.max_seq_len;
    out->live_seqs = e->live_seqs;
    out->kv_block_tokens = e->o.kv_block_tokens;
    out->kv_strategy = e->o.kv_strategy;
    out->kv_dtype = e->o.kv_dtype;
    out->kv_elem_bytes = e->kv_elem;
    out->use_malloc = e->use_malloc;
    out->attn_window = e->window;
    out->kv_window = e->kv_window;
    return LLMEM_OK;
}

llmem_status llmem_engine_predictor_options(const llmem_model *m, const llmem_engine_options *opts,
                                            llmem_predictor_options *out)
{
    if (!m || !out) return llmem__fail(LLMEM_EINVAL, "engine predictor options: null argument");
    const llmem_model_config *c = llmem_model_get_config(m);
    llmem_engine_options o = opts ? *opts : llmem_engine_options_default();
    llmem_status st = check_options(c, &o);
    if (st) return st;
    llmem_predictor_options p = llmem_predictor_options_default();
    p.shape = c->shape;
    p.shape.max_ctx = o.max_seq_len;
    p.weight_type = c->weight_type;
    p.kv_elem_bytes = o.kv_dtype == LLMEM_KV_F16 ? 2 : 4;
    if (o.threads) p.threads = o.threads;
    p.max_seq_len = o.max_seq_len;
    p.block_tokens = o.kv_block_tokens;
    p.kv_slab_bytes = kv_slab_bytes(o.kv_block_tokens, c->shape.kv_heads * c->shape.head_dim, o.kv_dtype);
    p.activations_apart = true; /* the workspace is the engine's own arena */
    *out = p;
    return LLMEM_OK;
}

llmem_kv *llmem_engine_kv(llmem_engine *e) { return e ? e->kv : NULL; }
llmem_pool *llmem_engine_pool(llmem_engine *e) { return e ? e->pool : NULL; }

llmem_status llmem_engine_get_stats(const llmem_engine *e, llmem_engine_stats *out)
{
    if (!e || !out) return llmem__fail(LLMEM_EINVAL, "engine stats: null argument");
    llmem_engine_stats s = e->st;
    s.sequences = e->live_seqs;
    if (e->kv) {
        llmem_kv_stats ks = {sizeof ks};
        if (llmem_kv_get_stats(e->kv, &ks) == LLMEM_OK) {
            s.kv_bytes = ks.bytes_reserved;
            s.kv_peak_bytes = ks.bytes_reserved_peak;
        }
    } else {
        uint64_t per = 2ull * e->L * e->o.max_seq_len * e->tok_bytes;
        s.kv_bytes = per * e->live_seqs;
        s.kv_peak_bytes = s.kv_bytes;
    }
    if (e->pool) {
        llmem_pool_stats ps = {sizeof ps};
        if (llmem_pool_get_stats(e->pool, &ps) == LLMEM_OK) s.pool_reserved_bytes = ps.reserved_bytes;
    }
    uint64_t tokens = 0;
    for (uint32_t i = 0; i < e->o.max_seqs; i++) {
        if (!e->seqs[i].live) continue;
        llmem_kv_seq_info info;
        /* A window's sequence holds its positions from info.first on. */
        if (e->kv_window && llmem_kv_seq_get_info(e->kv, e->seqs[i].kvs, &info) == LLMEM_OK)
            tokens += info.length - info.first;
        else
            tokens += e->seqs[i].len;
    }
    s.kv_used_bytes = tokens * 2 * e->L * e->tok_bytes;
    s.malloc_bytes = e->malloc_bytes;
    return llmem__stats_out(out, &s, sizeof s);
}

LLMEM__STATS_SCHEMA_OF(llmem_engine_stats_schema, "engine", llmem_engine_stats, LLMEM_ENGINE_STATS_FIELDS)
