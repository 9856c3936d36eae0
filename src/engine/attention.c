/*
 * attention.c - the per-token part of a layer (engine_internal.h): Q/K/V
 * biases, rotary position embedding in the model's style, the cache's
 * block tables, storing K/V, and causal attention over the cache.
 *
 * Rope styles (ggml's names): NORM rotates the adjacent pairs (2i, 2i+1)
 * of each head (llama, run.c); NEOX rotates (i, i + rope_dim/2), the two
 * halves of the rotated part (qwen2, GPT-NeoX). Both use the frequency
 * theta^(-2i/rope_dim) for pair i, so a head's dot products depend only
 * on the distance between positions.
 *
 * Addressing: per item and layer, a table of K and V block bases, a block
 * length in tokens (tab_len: the KV manager's block, or max_seq_len for
 * ALLOC_MALLOC's one buffer) and the block entry 0 holds (tab_first: > 0
 * once a sliding window let the KV manager drop a sequence's oldest
 * blocks). Position p lives in entry p / len - tab_first at row p % len.
 *
 * Sliding window: a token at position p attends to positions
 * max(0, p - window + 1) .. p (llama.cpp's LLAMA_SWA_TYPE_STANDARD: masked
 * when p - p0 >= window). The engine sizes each step so that every one of
 * those positions is still held (engine.c: the KV window is the attention
 * window plus the step's slack).
 */
#include <math.h>
#include <string.h>

#include "../core/internal.h"
#include "engine_internal.h"
#include "kernels.h"

void llmem__rope_neox(float *v, size_t n_heads, size_t head_dim, size_t rope_dim, size_t pos, float theta)
{
    if (rope_dim > head_dim) rope_dim = head_dim;
    size_t half = rope_dim / 2;
    /* The angle of pair i as the GGUF reference (ggml) defines it: pos,
     * times theta^(-2/rope_dim) once per pair, in float. It differs from
     * pos * theta^(-2i/rope_dim) rounded once by up to ~i ulp, which at
     * Qwen2's theta of 1e6 was 3x the noise floor of the oracle's f32
     * check over 40 positions. */
    float step = powf(theta, -2.0f / (float)rope_dim), val = (float)pos;
    for (size_t i = 0; i < half; i++, val *= step) {
        float fcr = cosf(val), fci = sinf(val);
        for (size_t h = 0; h < n_heads; h++) {
            float *p = v + h * head_dim;
            float v0 = p[i], v1 = p[i + half];
            p[i] = v0 * fcr - v1 * fci;
            p[i + half] = v0 * fci + v1 * fcr;
        }
    }
}

typedef struct qkv_ctx {
    const llmem_engine *e;
    const eng_layer *ly;
    step_bufs *b;
    size_t T;
} qkv_ctx;

size_t llmem__rope_pairs(size_t head_dim, size_t rope_dim) { return (rope_dim > head_dim ? head_dim : rope_dim) / 2; }

void llmem__rope_angles(float *cs, llmem_rope_style style, size_t head_dim, size_t rope_dim, size_t pos, float theta)
{
    size_t pairs = llmem__rope_pairs(head_dim, rope_dim);
    if (rope_dim > head_dim) rope_dim = head_dim;
    if (style == LLMEM_ROPE_NEOX) {
        float step = powf(theta, -2.0f / (float)rope_dim), val = (float)pos;
        for (size_t i = 0; i < pairs; i++, val *= step) cs[2 * i] = cosf(val), cs[2 * i + 1] = sinf(val);
        return;
    }
    for (size_t i = 0; i < pairs; i++) {
        float val = (float)pos * (1.0f / powf(theta, (float)(2 * i) / (float)rope_dim));
        cs[2 * i] = cosf(val);
        cs[2 * i + 1] = sinf(val);
    }
}

void llmem__rope_apply(float *v, llmem_rope_style style, size_t n_heads, size_t head_dim, size_t rope_dim,
                       const float *cs)
{
    size_t pairs = llmem__rope_pairs(head_dim, rope_dim);
    /* NORM rotates (2i, 2i+1), NEOX (i, i + pairs). */
    size_t stride = style == LLMEM_ROPE_NEOX ? 1 : 2, other = style == LLMEM_ROPE_NEOX ? pairs : 1;
    for (size_t h = 0; h < n_heads; h++) {
        float *p = v + h * head_dim;
        for (size_t i = 0; i < pairs; i++) {
            float fcr = cs[2 * i], fci = cs[2 * i + 1];
            float *a = p + i * stride, *c = a + other;
            float v0 = *a, v1 = *c;
            *a = v0 * fcr - v1 * fci;
            *c = v0 * fci + v1 * fcr;
        }
    }
}

static inline const void *cache_row(const step_bufs *b, const llmem_engine *e, void **tab, uint32_t item, size_t pos)
{
    size_t len = b->tab_len[item];
    return (const char *)tab[(size_t)item * e->blocks_max + pos / len - b->tab_first[item]] +
           (pos % len) * e->tok_bytes;
}

static void store_row(const llmem_engine *e, void *dst, const float *src)
{
    if (e->kv_elem == 4) memcpy(dst, src, e->tok_bytes);
    else llmem__f16_from_f32_row(dst, src, e->kvdim);
}

/* Biases, rope and the K/V store of rows [lo, hi): each row on its own.
 * Layer 0 computes each row's angles, which the later layers reuse (the
 * team's run ends with all its writes visible to the next). */
static void qkv_rows(const llmem_engine *e, const eng_layer *ly, step_bufs *b, size_t lo, size_t hi)
{
    size_t pairs = llmem__rope_pairs(e->hd, e->rope_dim);
    for (size_t r = lo; r < hi; r++) {
        float *q = b->q + r * e->qdim, *k = b->k + r * e->kvdim, *v = b->v + r * e->kvdim;
        float *cs = b->rope + r * 2 * pairs;
        if (ly->bq) llmem__axpy(q, 1.0f, ly->bq, e->qdim);
        if (ly->bk) llmem__axpy(k, 1.0f, ly->bk, e->kvdim);
        if (ly->bv) llmem__axpy(v, 1.0f, ly->bv, e->kvdim);
        if (ly == e->layers) llmem__rope_angles(cs, e->rope_style, e->hd, e->rope_dim, b->tok_pos[r], e->theta);
        llmem__rope_apply(q, e->rope_style, e->heads, e->hd, e->rope_dim, cs);
        llmem__rope_apply(k, e->rope_style, e->kvh, e->hd, e->rope_dim, cs);
        store_row(e, (void *)(uintptr_t)cache_row(b, e, b->ktab, b->tok_item[r], b->tok_pos[r]), k);
        store_row(e, (void *)(uintptr_t)cache_row(b, e, b->vtab, b->tok_item[r], b->tok_pos[r]), v);
    }
}

static void qkv_part(void *ctx, unsigned index, unsigned count)
{
    qkv_ctx *c = ctx;
    size_t lo, hi;
    llmem__threads_split(c->T, 1, index, count, &lo, &hi);
    qkv_rows(c->e, c->ly, c->b, lo, hi);
}

/* A prefill step's rows on the team (rope's cos/sin per row add up), a
 * decode step's few on the caller. */
void llmem__engine_qkv_finish(const llmem_engine *e, const eng_layer *ly, step_bufs *b, size_t T)
{
    if (T < 8 || llmem__threads_count(e->th) < 2) {
        qkv_rows(e, ly, b, 0, T);
        return;
    }
    qkv_ctx c = {e, ly, b, T};
    llmem__threads_run(e->th, qkv_part, &c);
}

llmem_status llmem__engine_fill_table(llmem_engine *e, step_bufs *b, const eng_seq *q, uint32_t item, uint32_t layer)
{
    void **kt = b->ktab + (size_t)item * e->blocks_max, **vt = b->vtab + (size_t)item * e->blocks_max;
    b->tab_first[item] = 0;
    if (!e->kv) {
        size_t layer_bytes = (size_t)e->o.max_seq_len * e->tok_bytes;
        kt[0] = q->kbuf + layer * layer_bytes;
        vt[0] = q->vbuf + layer * layer_bytes;
        b->tab_len[item] = e->o.max_seq_len;
        return LLMEM_OK;
    }
    size_t n;
    llmem_status st = llmem_kv_seq_table(e->kv, q->kvs, layer, kt, vt, e->blocks_max, &n);
    if (st) return st;
    if (n > e->blocks_max) return llmem__fail(LLMEM_ECORRUPT, "engine: block table of %zu blocks", n);
    b->tab_len[item] = e->o.kv_block_tokens;
    if (e->kv_window) {
        llmem_kv_seq_info info;
        if ((st = llmem_kv_seq_get_info(e->kv, q->kvs, &info))) return st;
        b->tab_first[item] = info.first / e->o.kv_block_tokens;
    }
    return LLMEM_OK;
}

typedef struct attn_ctx {
    llmem_engine *e;
    step_bufs *b;
    size_t T;
} attn_ctx;

/* Rows x heads split over the threads; each task one head of one row. */
static void attention_part(void *ctx, unsigned index, unsigned count)
{
    attn_ctx *a = ctx;
    llmem_engine *e = a->e;
    step_bufs *b = a->b;
    size_t lo, hi, hd = e->hd, group = e->heads / e->kvh;
    llmem__threads_split(a->T * e->heads, 1, index, count, &lo, &hi);
    float *att = b->scores + (size_t)index * e->o.max_seq_len;
    float scale = 1.0f / sqrtf((float)hd);
    bool f16 = e->kv_elem == 2;
    for (size_t task = lo; task < hi; task++) {
        size_t t = task / e->heads, h = task % e->heads, kvoff = (h / group) * hd;
        uint32_t item = b->tok_item[t];
        size_t pos = b->tok_pos[t];
        size_t p0 = e->window && pos >= e->window ? pos + 1 - e->window : 0;
        const float *qv = b->q + t * e->qdim + h * hd;
        float *o = b->att_out + t * e->qdim + h * hd;
        memset(o, 0, hd * sizeof *o);
        /* Runs of positions within one cache block, whose rows are
         * contiguous: one kernel call per run, the order of the
         * position-by-position loop (kernels.h); an f16 cache converts in
         * the kernels' loads, the same operations. */
        size_t len = b->tab_len[item], stride = e->tok_bytes / e->kv_elem;
        for (size_t p = p0; p <= pos;) {
            size_t run = len - p % len;
            if (run > pos + 1 - p) run = pos + 1 - p;
            const void *kr = cache_row(b, e, b->ktab, item, p);
            if (f16) llmem__dot_rows_f16(att + (p - p0), qv, (const uint16_t *)kr + kvoff, stride, run, hd, scale);
            else llmem__dot_rows(att + (p - p0), qv, (const float *)kr + kvoff, stride, run, hd, scale);
            p += run;
        }
        llmem__softmax(att, pos + 1 - p0);
        for (size_t p = p0; p <= pos;) {
            size_t run = len - p % len;
            if (run > pos + 1 - p) run = pos + 1 - p;
            const void *vr = cache_row(b, e, b->vtab, item, p);
            if (f16) llmem__axpy_rows_f16(o, att + (p - p0), (const uint16_t *)vr + kvoff, stride, run, hd);
            else llmem__axpy_rows(o, att + (p - p0), (const float *)vr + kvoff, stride, run, hd);
            p += run;
        }
    }
}

void llmem__engine_attend(llmem_engine *e, step_bufs *b, size_t T)
{
    attn_ctx ac = {e, b, T};
    llmem__threads_run(e->th, attention_part, &ac);
}
