/*
 * llama2c.c - llama2.c checkpoints (Karpathy's run.c), presented as GGUF
 * llama tensors.
 *
 * Layout: seven int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size, seq_len; a negative vocab_size means the classifier is
 * stored separately, positive that it shares the embedding), then f32
 * arrays back to back in run.c's memory_map_weights order, with
 * head_size = dim / n_heads and kv_dim = n_kv_heads * head_size:
 *
 *     token_embedding_table  (vocab, dim)
 *     rms_att_weight         (layer, dim)
 *     wq                     (layer, dim, n_heads * head_size)
 *     wk, wv                 (layer, dim, kv_dim)  each
 *     wo                     (layer, n_heads * head_size, dim)
 *     rms_ffn_weight         (layer, dim)
 *     w1                     (layer, hidden_dim, dim)
 *     w2                     (layer, dim, hidden_dim)
 *     w3                     (layer, hidden_dim, dim)
 *     rms_final_weight       (dim)
 *     freq_cis_real, freq_cis_imag  (seq_len * head_size / 2) each, skipped
 *     wcls                   (vocab, dim)  only when vocab_size < 0
 *
 * The file must be exactly the size the header implies (a checkpoint of
 * another layout would otherwise load as garbage). Each per-layer slice
 * becomes one tensor (blk.N.attn_q.weight, ...) pointing into the file, with
 * GGUF's dims order: dims[0] is the row length, so wq, d rows of n in
 * run.c's matmul, is dims {dim, n_heads * head_size}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

#define HEADER_BYTES 28u
#define NAME_CAP 48u /* "blk.2147483647.attn_output.weight" is 34 bytes */

typedef unsigned long long ull;

/* Checked a * b and a + b over uint64; *ok turns false on overflow. */
static uint64_t mul(uint64_t a, uint64_t b, bool *ok)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) *ok = false;
    return r;
}

static uint64_t add(uint64_t a, uint64_t b, bool *ok)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) *ok = false;
    return r;
}

typedef struct builder {
    llmem_model *m;
    uint64_t at; /* byte offset of the next array */
} builder;

/* Add one tensor named `name` of dims (d0[, d1]) at the current offset. */
static void put(builder *b, const char *name, uint64_t d0, uint64_t d1)
{
    llmem_model *m = b->m;
    llmem_tensor *t = &m->tensors[m->n_tensors];
    char *nm = m->names + m->n_tensors * NAME_CAP;
    snprintf(nm, NAME_CAP, "%s", name);
    t->name = nm;
    t->type = LLMEM_DTYPE_F32;
    t->n_dims = d1 ? 2 : 1;
    t->dims[0] = d0;
    t->dims[1] = d1 ? d1 : 1;
    t->dims[2] = t->dims[3] = 1;
    t->n_elements = d0 * t->dims[1]; /* no overflow: the total size was checked */
    t->bytes = t->n_elements * 4;
    t->offset = b->at;
    t->data = m->base + b->at;
    b->at += t->bytes;
    m->n_tensors++;
}

/* One tensor per layer of a (layer, ...) array. */
static void put_layers(builder *b, uint32_t layers, const char *suffix, uint64_t d0, uint64_t d1)
{
    char name[NAME_CAP];
    for (uint32_t l = 0; l < layers; l++) {
        snprintf(name, sizeof name, "blk.%u.%s.weight", l, suffix);
        put(b, name, d0, d1);
    }
}

llmem_status llmem__llama2c_parse(llmem_model *m)
{
    if (m->size < HEADER_BYTES)
        return llmem__fail(LLMEM_EFORMAT, "llama2c: file too short for the 28-byte header (%zu bytes)", m->size);
    int32_t h[7];
    memcpy(h, m->base, sizeof h);
    static const char *const field[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                                         "seq_len"};
    for (int i = 0; i < 7; i++) {
        if (i == 5 ? (h[i] == 0 || h[i] == INT32_MIN) : h[i] <= 0)
            return llmem__fail(LLMEM_EFORMAT, "llama2c: header field %s at offset %d is %d (must be %s)", field[i],
                               4 * i, h[i], i == 5 ? "non-zero" : "positive");
    }
    uint32_t dim = (uint32_t)h[0], hidden = (uint32_t)h[1], layers = (uint32_t)h[2], heads = (uint32_t)h[3],
             kv_heads = (uint32_t)h[4], seq = (uint32_t)h[6];
    bool untied = h[5] < 0;
    uint32_t vocab = untied ? (uint32_t)-(int64_t)h[5] : (uint32_t)h[5];
    if (dim % heads)
        return llmem__fail(LLMEM_EFORMAT, "llama2c: n_heads %u (offset 12) does not divide dim %u", heads, dim);
    if (kv_heads > heads || heads % kv_heads)
        return llmem__fail(LLMEM_EFORMAT, "llama2c: n_kv_heads %u (offset 16) does not divide n_heads %u", kv_heads,
                           heads);
    uint32_t hs = dim / heads;
    if (hs % 2)
        return llmem__fail(LLMEM_EFORMAT, "llama2c: head size %u (dim %u / n_heads %u) must be even for RoPE", hs, dim,
                           heads);
    uint64_t kvd = (uint64_t)kv_heads * hs, L = layers;

    /* Floats the header implies, overflow-checked. */
    bool ok = true;
    uint64_t per_layer = 0;
    per_layer = add(per_layer, 2 * (uint64_t)dim, &ok);                        /* rms_att, rms_ffn */
    per_layer = add(per_layer, mul(2, mul(dim, dim, &ok), &ok), &ok);          /* wq, wo */
    per_layer = add(per_layer, mul(2, mul(dim, kvd, &ok), &ok), &ok);          /* wk, wv */
    per_layer = add(per_layer, mul(3, mul(dim, hidden, &ok), &ok), &ok);       /* w1, w2, w3 */
    uint64_t floats = mul(vocab, dim, &ok);                                    /* token embeddings */
    floats = add(floats, mul(L, per_layer, &ok), &ok);
    floats = add(floats, dim, &ok);                                            /* rms_final */
    floats = add(floats, mul(seq, hs, &ok), &ok);                              /* freq_cis real + imag */
    if (untied) floats = add(floats, mul(vocab, dim, &ok), &ok);               /* wcls */
    uint64_t expect = add(HEADER_BYTES, mul(floats, 4, &ok), &ok);
    if (!ok || expect != m->size)
        return llmem__fail(LLMEM_EFORMAT,
                           "llama2c: file is %zu bytes but its header (dim %u, hidden_dim %u, n_layers %u, n_heads %u, "
                           "n_kv_heads %u, vocab_size %d, seq_len %u) implies %s%llu bytes",
                           m->size, dim, hidden, layers, heads, kv_heads, h[5], seq, ok ? "expected " : "over ",
                           ok ? (ull)expect : (ull)UINT64_MAX);

    /* The size check bounds the tensor count: each layer costs >= 36 bytes. */
    size_t n = 2 + 9 * (size_t)layers + (untied ? 1 : 0);
    m->tensors = calloc(n, sizeof *m->tensors);
    m->names = malloc(n * NAME_CAP);
    if (!m->tensors || !m->names) return llmem__fail(LLMEM_ENOMEM, "llama2c: out of memory for %zu tensors", n);
    builder b = {m, HEADER_BYTES};
    put(&b, "token_embd.weight", dim, vocab);
    put_layers(&b, layers, "attn_norm", dim, 0);
    put_layers(&b, layers, "attn_q", dim, dim);
    put_layers(&b, layers, "attn_k", dim, kvd);
    put_layers(&b, layers, "attn_v", dim, kvd);
    put_layers(&b, layers, "attn_output", dim, dim);
    put_layers(&b, layers, "ffn_norm", dim, 0);
    put_layers(&b, layers, "ffn_gate", dim, hidden);
    put_layers(&b, layers, "ffn_down", hidden, dim);
    put_layers(&b, layers, "ffn_up", dim, hidden);
    put(&b, "output_norm.weight", dim, 0);
    b.at += (uint64_t)seq * hs * 4; /* freq_cis_real and freq_cis_imag: seq_len * head_size / 2 each */
    if (untied) put(&b, "output.weight", dim, vocab);
    if (b.at != m->size) /* cannot happen after the size check; a guard for this code */
        return llmem__fail(LLMEM_EFORMAT, "llama2c: layout ends at %llu, file is %zu bytes", (ull)b.at, m->size);
    llmem_status st = llmem__tensor_index_build(m, "llama2c");
    if (st) return st;

    llmem_model_config *c = &m->config;
    c->format = LLMEM_MODEL_LLAMA2C;
    c->version = 0;
    c->rope_dim = hs;
    c->norm_eps = 1e-5f;
    c->weight_type = LLMEM_DTYPE_F32;
    llmem_shape *s = &c->shape;
    snprintf(s->name, sizeof s->name, "llama2c");
    s->layers = layers;
    s->hidden = dim;
    s->heads = heads;
    s->kv_heads = kv_heads;
    s->head_dim = hs;
    s->ffn = hidden;
    s->vocab = vocab;
    s->max_ctx = seq;
    s->rope_theta = 10000.0;
    s->tied_embeddings = !untied;
    return LLMEM_OK;
}
