/*
 * synth_model.c - the tests' synthetic GGUF model (synth_model.h), written
 * through the library's GGUF writer; each tensor's bytes are produced by
 * synth_fill when the writer streams it, so no tensor is held in memory.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "synth_model.h"

#include "llmem/llmem.h"

enum { MAX_TENSORS = 2 + 9 * 32 + 2 };

typedef struct synth_ctx {
    uint32_t types[MAX_TENSORS];
    uint64_t n[MAX_TENSORS];
    bool norm[MAX_TENSORS];
} synth_ctx;

/* Deterministic values in [-0.5, 0.5) from (tensor, element). */
static float synth_value(size_t tensor, uint64_t i)
{
    uint64_t x = (tensor + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return (float)(x >> 40) / 16777216.0f - 0.5f;
}

/* f32 to f16, round to nearest even (subnormals, infinities and NaN too). */
static uint16_t to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e), half = 1u << (shift - 1);
        uint32_t r = man >> shift, rem = man & ((1u << shift) - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = man >> 13, rem = man & 0x1fff;
    uint32_t h = sign | ((uint32_t)e << 10) | r;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) h++;
    return (uint16_t)h;
}

static llmem_status synth_fill(void *vctx, size_t index, void *buf, size_t bytes)
{
    synth_ctx *c = vctx;
    uint64_t n = c->n[index];
    unsigned char *out = buf;
    (void)bytes;
    for (uint64_t i = 0; i < n; i++) {
        float v = c->norm[index] ? 1.0f + 0.25f * synth_value(index, i) : synth_value(index, i);
        switch (c->types[index]) {
        case LLMEM_DTYPE_F32: memcpy(out + 4 * i, &v, 4); break;
        case LLMEM_DTYPE_F16: {
            uint16_t h = to_f16(v);
            memcpy(out + 2 * i, &h, 2);
            break;
        }
        case LLMEM_DTYPE_BF16: {
            uint32_t x;
            memcpy(&x, &v, 4);
            uint16_t h = (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
            memcpy(out + 2 * i, &h, 2);
            break;
        }
        case LLMEM_DTYPE_Q8_0:
            if (i % 32 == 0) {
                float amax = 0;
                for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(synth_value(index, i + (uint64_t)j)));
                float d = amax / 127;
                uint16_t h = to_f16(d);
                unsigned char *blk = out + (i / 32) * 34;
                memcpy(blk, &h, 2);
                for (int j = 0; j < 32; j++)
                    blk[2 + j] = (unsigned char)(int8_t)lrintf(d > 0 ? synth_value(index, i + (uint64_t)j) / d : 0);
            }
            break;
        default: return LLMEM_EINVAL;
        }
    }
    return LLMEM_OK;
}

static void check(llmem_status st, const char *what)
{
    if (st != LLMEM_OK) fail_msg("%s: %s: %s", what, llmem_status_name(st), llmem_error_message());
}

typedef struct adder {
    llmem_gguf_writer *w;
    synth_ctx *c;
    uint32_t type;
    size_t k;
} adder;

static void add(adder *a, const char *name, uint32_t nd, uint64_t d0, uint64_t d1, bool norm)
{
    if (a->k == MAX_TENSORS) fail_msg("synthetic model: more than %d tensors", (int)MAX_TENSORS);
    uint64_t dims[2] = {d0, d1};
    a->c->types[a->k] = norm ? LLMEM_DTYPE_F32 : a->type;
    a->c->n[a->k] = d0 * d1;
    a->c->norm[a->k] = norm;
    check(llmem_gguf_add_tensor(a->w, name, a->c->types[a->k], nd, dims, synth_fill, a->c), name);
    a->k++;
}

void test_gguf_llama_keys(llmem_gguf_writer *w, uint32_t ctx, uint32_t dim, uint32_t layers, uint32_t ffn,
                          uint32_t heads, uint32_t kv_heads)
{
    check(llmem_gguf_add_str(w, "general.architecture", "llama"), "architecture");
    check(llmem_gguf_add_u32(w, "llama.context_length", ctx), "context_length");
    check(llmem_gguf_add_u32(w, "llama.embedding_length", dim), "embedding_length");
    check(llmem_gguf_add_u32(w, "llama.block_count", layers), "block_count");
    check(llmem_gguf_add_u32(w, "llama.feed_forward_length", ffn), "feed_forward_length");
    check(llmem_gguf_add_u32(w, "llama.attention.head_count", heads), "head_count");
    if (kv_heads) check(llmem_gguf_add_u32(w, "llama.attention.head_count_kv", kv_heads), "head_count_kv");
}

void test_synth_write(const test_synth_model *sm, const char *path)
{
    llmem_gguf_writer *w;
    check(llmem_gguf_writer_create(&w), "llmem_gguf_writer_create");
    synth_ctx *c = calloc(1, sizeof *c);
    if (!c) fail_msg("out of memory");
    test_gguf_llama_keys(w, sm->ctx, sm->dim, sm->layers, sm->ffn, sm->heads, sm->kv_heads);
    check(llmem_gguf_add_u32(w, "llama.rope.dimension_count", sm->rope_dim), "rope.dimension_count");
    check(llmem_gguf_add_f32(w, "llama.rope.freq_base", sm->theta), "rope.freq_base");
    check(llmem_gguf_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f), "layer_norm_rms_epsilon");
    uint32_t hd = sm->dim / sm->heads;
    adder a = {w, c, sm->type, 0};
    char name[64];
    add(&a, "token_embd.weight", 2, sm->dim, sm->vocab, false);
    for (uint32_t l = 0; l < sm->layers; l++) {
        static const struct {
            const char *name;
            int rows, cols; /* 0 dim, 1 heads*hd, 2 kv_heads*hd, 3 ffn, 4: one column (a norm) */
        } blk[] = {{"attn_norm", 0, 4}, {"attn_q", 0, 1},   {"attn_k", 0, 2},   {"attn_v", 0, 2},
                   {"attn_output", 1, 0}, {"ffn_norm", 0, 4}, {"ffn_gate", 0, 3}, {"ffn_down", 3, 0},
                   {"ffn_up", 0, 3}};
        const uint64_t size[5] = {sm->dim, (uint64_t)sm->heads * hd, (uint64_t)sm->kv_heads * hd, sm->ffn, 1};
        for (size_t t = 0; t < sizeof blk / sizeof *blk; t++) {
            snprintf(name, sizeof name, "blk.%u.%s.weight", l, blk[t].name);
            bool norm = blk[t].cols == 4;
            add(&a, name, norm ? 1 : 2, size[blk[t].rows], size[blk[t].cols], norm);
        }
    }
    add(&a, "output_norm.weight", 1, sm->dim, 1, true);
    if (!sm->tied) add(&a, "output.weight", 2, sm->dim, sm->vocab, false);
    check(llmem_gguf_write(w, path, false), path);
    llmem_gguf_writer_destroy(w);
    free(c);
}
