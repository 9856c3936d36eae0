/*
 * fuzz_model.c - the model parsers (GGUF and llama2.c) on arbitrary bytes:
 * they either fail with LLMEM_EFORMAT, LLMEM_ENOTSUP or LLMEM_ENOMEM and a
 * message, or return a model whose every tensor lies inside the bytes with
 * the size its dims and type say, whose config is self-consistent, and
 * whose metadata reads back through every getter.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"

#include "support.h"

static volatile uint8_t sink;

static void read_keys(const llmem_model *m)
{
    static const char *const keys[] = {
        "general.architecture", "general.name", "general.alignment", "llama.context_length",
        "llama.rope.freq_base", "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
        "tokenizer.ggml.bos_token_id", "t.nested", "t.arr_u8", "t.f64",
    };
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        uint32_t u;
        float f;
        const char *s;
        size_t len;
        double d;
        llmem_meta_array a;
        llmem_status st;
        FZ_CHECK(!((st = llmem_model_meta_u32(m, keys[k], &u)) && st != LLMEM_EFORMAT && st != LLMEM_ENOTFOUND));
        FZ_CHECK(!((st = llmem_model_meta_f32(m, keys[k], &f)) && st != LLMEM_EFORMAT && st != LLMEM_ENOTFOUND));
        if ((st = llmem_model_meta_str(m, keys[k], &s, &len)) == LLMEM_OK) {
            if (len) sink ^= (uint8_t)(s[0] ^ s[len - 1]);
        } else {
            FZ_CHECK(st == LLMEM_EFORMAT || st == LLMEM_ENOTFOUND);
        }
        if ((st = llmem_model_meta_array(m, keys[k], &a))) {
            FZ_CHECK(!(st != LLMEM_EFORMAT && st != LLMEM_ENOTFOUND));
            continue;
        }
        FZ_CHECK(!(llmem_model_meta_array_num(m, keys[k], a.count, &d) != LLMEM_ERANGE));
        for (uint64_t i = 0; i < a.count; i++) {
            if (a.type == LLMEM_META_STRING) {
                FZ_CHECK(!llmem_model_meta_array_str(m, keys[k], i, &s, &len));
                if (len) sink ^= (uint8_t)(s[0] ^ s[len - 1]);
                FZ_CHECK(!(llmem_model_meta_array_num(m, keys[k], i, &d) != LLMEM_EFORMAT));
            } else if (a.type == LLMEM_META_ARRAY) {
                FZ_CHECK(!(llmem_model_meta_array_num(m, keys[k], i, &d) != LLMEM_EFORMAT));
            } else {
                FZ_CHECK(!llmem_model_meta_array_num(m, keys[k], i, &d));
                FZ_CHECK(!(llmem_model_meta_array_str(m, keys[k], i, &s, &len) != LLMEM_EFORMAT));
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_begin();
    llmem_model *m = NULL;
    llmem_error_clear();
    llmem_status st = llmem_model_open_memory(data, size, &m);
    if (st) {
        FZ_CHECK(!(st != LLMEM_EFORMAT && st != LLMEM_ENOTSUP && st != LLMEM_ENOMEM));
        FZ_CHECK(!(m || !llmem_error_message()[0]));
        return 0;
    }
    size_t n = llmem_model_tensor_count(m);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const llmem_tensor *t = llmem_model_tensor_at(m, i), *u;
        FZ_CHECK(!(!t || t->n_dims < 1 || t->n_dims > 4));
        uint64_t prod = 1;
        for (int d = 0; d < 4; d++) {
            FZ_CHECK(!(!t->dims[d] || (d >= (int)t->n_dims && t->dims[d] != 1)));
            prod *= t->dims[d];
        }
        FZ_CHECK(!(prod != t->n_elements || t->bytes != llmem_dtype_bytes(t->type, t->n_elements) || !t->bytes));
        const uint8_t *p = t->data;
        FZ_CHECK(!(p < data || p > data + size || t->bytes > (uint64_t)(data + size - p) || p != data + t->offset));
        sink ^= (uint8_t)(p[0] ^ p[t->bytes - 1]);
        FZ_CHECK(!(llmem_model_tensor(m, t->name, &u) || u != t));
        total += t->bytes;
    }
    const llmem_model_config *c = llmem_model_get_config(m);
    const llmem_shape *s = &c->shape;
    FZ_CHECK(s->layers && s->heads && s->kv_heads && s->heads % s->kv_heads == 0 && s->hidden == s->heads * s->head_dim);
    FZ_CHECK(!(!s->vocab || !s->ffn || !s->max_ctx || !(s->rope_theta > 0) || !(c->norm_eps > 0)));
    FZ_CHECK(!(c->rope_dim > s->head_dim || c->rope_dim % 2 || !memchr(s->name, 0, sizeof s->name)));
    const llmem_tensor *embd;
    FZ_CHECK(!(llmem_model_tensor(m, "token_embd.weight", &embd) || embd->n_dims != 2 || embd->dims[0] != s->hidden));
    llmem_model_stats stats = {0};
    FZ_CHECK(!(llmem_model_get_stats(m, &stats) || stats.tensor_bytes != total || stats.tensors != n));
    FZ_CHECK(!llmem_model_advise(m, 3 /* MADV_WILLNEED */));
    read_keys(m);
    llmem_model_close(m);
    return 0;
}
