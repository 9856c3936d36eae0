/*
 * tensor_mix.c - see tensor_mix.h.
 */
#include "tensor_mix.h"

#include "bench_util.h"

enum { REQS = 64 };

const tensor_mix_shape tensor_mix_llama2_7b = {"llama-2-7b", 4096, 11008, 32, 4096, 32000, 32};
const tensor_mix_shape tensor_mix_yi_coder_1_5b = {"yi-coder-1.5b", 2048, 5504, 16, 2048, 64000, 24};

static size_t log_uniform_tokens(uint64_t *s, unsigned lo_bits, unsigned hi_bits)
{
    unsigned e = lo_bits + (unsigned)(bench_rand(s) % (hi_bits - lo_bits + 1));
    size_t base = (size_t)1 << e;
    size_t n = base + (size_t)(bench_rand(s) % base);
    size_t hi = (size_t)1 << hi_bits;
    return n > hi ? hi : n;
}

static void *take(const tensor_mix_ops *o, size_t n)
{
    void *p = o->alloc(o->ctx, n);
    *(volatile char *)p = 1;
    return p;
}

uint64_t tensor_mix_run(int steps, uint64_t seed, const tensor_mix_shape *m, const tensor_mix_ops *o)
{
    if (!m) m = &tensor_mix_llama2_7b;
    uint64_t s = seed ? seed : 7, n = 0;
    void *req[REQS] = {0};
    size_t req_size[REQS] = {0};
    for (int step = 0; step < steps; step++) {
        int prefill = step % 8 == 0;
        size_t t = prefill ? log_uniform_tokens(&s, 4, 9) : 1 + bench_rand(&s) % 8;
        size_t ctx = prefill ? t : 128 + bench_rand(&s) % 1024;
        for (int k = 0; k < 4; k++) { /* request objects come and go */
            unsigned i = (unsigned)(bench_rand(&s) % REQS);
            if (req[i]) o->free(o->ctx, req[i], req_size[i]);
            req_size[i] = 16 + bench_rand(&s) % 1008;
            req[i] = take(o, req_size[i]);
            n++;
        }
        size_t act = t * m->dim * 4, kv = t * m->kv_dim * 4;
        void *x = take(o, act);
        n++;
        for (size_t l = 0; l < m->layers; l++) {
            void *xb = take(o, act), *q = take(o, act), *k = take(o, kv), *v = take(o, kv);
            size_t att_n = m->heads * t * (prefill ? t : ctx) * 4;
            void *att = take(o, att_n);
            o->free(o->ctx, att, att_n);
            o->free(o->ctx, q, act);
            o->free(o->ctx, k, kv);
            o->free(o->ctx, v, kv);
            size_t hid = t * m->ffn * 4;
            void *hb = take(o, hid), *hb2 = take(o, hid);
            o->free(o->ctx, hb2, hid);
            o->free(o->ctx, hb, hid);
            o->free(o->ctx, xb, act);
            n += 7;
        }
        size_t lg = (prefill ? 1 : t) * m->vocab * 4;
        void *logits = take(o, lg);
        o->free(o->ctx, logits, lg);
        o->free(o->ctx, x, act);
        n++;
    }
    for (int i = 0; i < REQS; i++)
        if (req[i]) o->free(o->ctx, req[i], req_size[i]);
    return n;
}

uint64_t object_mix_run(int steps, uint64_t seed, const tensor_mix_ops *o)
{
    enum { KINDS = 48, SLOTS = 512 };
    uint64_t s = seed ? seed : 7, n = 0;
    /* The sizes are the same for every seed: a program's struct sizes. */
    uint64_t g = 12345;
    size_t kind_size[KINDS];
    for (int i = 0; i < KINDS; i++) kind_size[i] = 100 + (size_t)(bench_rand(&g) % (24 << 10));
    void *slot[SLOTS] = {0};
    size_t slot_size[SLOTS] = {0};
    for (int step = 0; step < steps; step++) {
        for (int k = 0; k < 64; k++) {
            unsigned i = (unsigned)(bench_rand(&s) % SLOTS);
            if (slot[i]) o->free(o->ctx, slot[i], slot_size[i]);
            /* Zipf-like: kind j with weight 1/(j+1). */
            uint64_t r = bench_rand(&s) % 1000000;
            double acc = 0, total = 0;
            for (int j = 0; j < KINDS; j++) total += 1.0 / (j + 1);
            int kind = KINDS - 1;
            for (int j = 0; j < KINDS; j++) {
                acc += 1.0 / (j + 1) / total;
                if ((double)r / 1e6 < acc) {
                    kind = j;
                    break;
                }
            }
            slot_size[i] = kind_size[kind];
            slot[i] = take(o, slot_size[i]);
            n++;
        }
    }
    for (int i = 0; i < SLOTS; i++)
        if (slot[i]) o->free(o->ctx, slot[i], slot_size[i]);
    return n;
}
