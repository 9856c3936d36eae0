/*
 * shape.c - model shapes: presets and Hugging Face config.json.
 *
 * Presets are the published configurations; a config.json overrides them
 * exactly. Parsing takes the standard llama keys (hidden_size,
 * num_hidden_layers, num_attention_heads, num_key_value_heads,
 * intermediate_size, vocab_size, max_position_embeddings, rope_theta,
 * tie_word_embeddings, head_dim) and checks each: integers in range,
 * heads dividing hidden, kv_heads dividing heads.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "internal.h"
#include "llmem/shape.h"

/* llama-2: the config.json files Meta published (checked against their
 * parameter counts in test_shape). yi-coder-1.5b: 01.AI's config.json as
 * recalled (no copy here to check against; its parameter count, 1.48B,
 * agrees with the name): pass its config.json to be exact. The tiny ones:
 * the headers of the files in ../shared/models (test_shape reads the
 * llama2.c one). */
static const llmem_shape presets[] = {
    /* name, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, ctx, theta, tied */
    {"llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096, 10000.0, 0},
    {"llama-2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 4096, 10000.0, 0},
    {"yi-coder-1.5b", 24, 2048, 16, 16, 128, 5504, 64000, 131072, 10000000.0, 0},
    {"tiny-15m", 6, 288, 6, 6, 48, 768, 32000, 256, 10000.0, 1},
    {"stories260k", 5, 64, 8, 4, 8, 172, 512, 512, 10000.0, 1},
    {"tiny-random", 1, 8, 2, 2, 4, 32, 32000, 4096, 10000.0, 0},
};
static const char *const preset_names[] = {"llama-2-7b", "llama-2-13b", "yi-coder-1.5b", "tiny-15m",
                                           "stories260k", "tiny-random", NULL};

const char *const *llmem_shape_preset_names(void) { return preset_names; }

static bool ieq(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char x = *a >= 'A' && *a <= 'Z' ? (char)(*a + 32) : *a, y = *b >= 'A' && *b <= 'Z' ? (char)(*b + 32) : *b;
        if (x != y) return false;
    }
    return *a == *b;
}

llmem_status llmem_shape_preset(const char *name, llmem_shape *out)
{
    if (!name || !out) return llmem__fail(LLMEM_EINVAL, "shape: null argument");
    for (size_t i = 0; i < LLMEM_ARRAY_LEN(presets); i++)
        if (ieq(name, presets[i].name)) {
            *out = presets[i];
            return LLMEM_OK;
        }
    return llmem__fail(LLMEM_ENOTFOUND,
                       "shape: no preset '%s' (llama-2-7b, llama-2-13b, yi-coder-1.5b, tiny-15m, stories260k, "
                       "tiny-random; or give a config.json)",
                       name);
}

/* An integer field in [lo, hi]; `have` false if absent (then *v unchanged). */
static llmem_status get_u32(const cJSON *root, const char *key, uint32_t lo, uint32_t hi, bool required,
                            uint32_t *v)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!f) return required ? llmem__fail(LLMEM_EFORMAT, "config.json: missing \"%s\"", key) : LLMEM_OK;
    /* Range first: converting a double outside int64's range is undefined. */
    if (!cJSON_IsNumber(f) || !(f->valuedouble >= lo && f->valuedouble <= hi) ||
        f->valuedouble != (double)(uint32_t)f->valuedouble)
        return llmem__fail(LLMEM_EFORMAT, "config.json: \"%s\" must be an integer in [%u, %u]", key, lo, hi);
    *v = (uint32_t)f->valuedouble;
    return LLMEM_OK;
}

llmem_status llmem_shape_from_json(const char *json, size_t len, llmem_shape *out)
{
    if (!json || !out) return llmem__fail(LLMEM_EINVAL, "shape: null argument");
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= json && at <= json + len ? (size_t)(at - json) : 0;
        return llmem__fail(LLMEM_EFORMAT, "config.json: not valid JSON (near byte %zu)", off);
    }
    llmem_shape s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "config.json");
    llmem_status st = LLMEM_OK;
    if (!cJSON_IsObject(root)) st = llmem__fail(LLMEM_EFORMAT, "config.json: the top level is not an object");
    if (!st) st = get_u32(root, "hidden_size", 1, 1u << 20, true, &s.hidden);
    if (!st) st = get_u32(root, "num_hidden_layers", 1, 4096, true, &s.layers);
    if (!st) st = get_u32(root, "num_attention_heads", 1, 8192, true, &s.heads);
    s.kv_heads = s.heads;
    if (!st) st = get_u32(root, "num_key_value_heads", 1, 8192, false, &s.kv_heads);
    if (!st) st = get_u32(root, "intermediate_size", 1, 1u << 22, true, &s.ffn);
    if (!st) st = get_u32(root, "vocab_size", 1, 1u << 24, true, &s.vocab);
    s.max_ctx = 2048;
    if (!st) st = get_u32(root, "max_position_embeddings", 1, 1u << 26, false, &s.max_ctx);
    if (!st && s.hidden % s.heads) st = llmem__fail(LLMEM_EFORMAT, "config.json: num_attention_heads %u does not divide hidden_size %u", s.heads, s.hidden);
    if (!st) {
        s.head_dim = s.hidden / s.heads;
        st = get_u32(root, "head_dim", 1, 1u << 16, false, &s.head_dim);
    }
    if (!st && (s.kv_heads > s.heads || s.heads % s.kv_heads))
        st = llmem__fail(LLMEM_EFORMAT, "config.json: num_key_value_heads %u must divide num_attention_heads %u",
                         s.kv_heads, s.heads);
    s.rope_theta = 10000.0;
    if (!st) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "rope_theta");
        if (t && (!cJSON_IsNumber(t) || !(t->valuedouble > 0) || t->valuedouble > 1e12))
            st = llmem__fail(LLMEM_EFORMAT, "config.json: \"rope_theta\" must be a positive number");
        else if (t)
            s.rope_theta = t->valuedouble;
        const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
        if (!st && tie && !cJSON_IsBool(tie))
            st = llmem__fail(LLMEM_EFORMAT, "config.json: \"tie_word_embeddings\" must be true or false");
        s.tied_embeddings = tie && cJSON_IsTrue(tie);
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "_name_or_path");
        if (cJSON_IsString(nm) && nm->valuestring[0]) snprintf(s.name, sizeof s.name, "%s", nm->valuestring);
    }
    cJSON_Delete(root);
    if (st) return st;
    *out = s;
    return LLMEM_OK;
}

llmem_status llmem_shape_load(const char *name_or_path, llmem_shape *out)
{
    if (!name_or_path || !out) return llmem__fail(LLMEM_EINVAL, "shape: null argument");
    if (!strchr(name_or_path, '/') && !strstr(name_or_path, ".json")) return llmem_shape_preset(name_or_path, out);
    void *buf;
    size_t n;
    /* Never blocks on a FIFO; a regular file of at most 1 MiB (file.c). */
    llmem_status st = llmem__read_file(name_or_path, 1 << 20, "shape", &buf, &n);
    if (st) return st;
    st = llmem_shape_from_json(buf, n, out);
    free(buf);
    return st;
}

uint64_t llmem_shape_params(const llmem_shape *s)
{
    if (!s) return 0;
    uint64_t h = s->hidden, kvd = (uint64_t)s->kv_heads * s->head_dim, qd = (uint64_t)s->heads * s->head_dim;
    uint64_t per_layer = h * qd + 2 * h * kvd + qd * h + 3 * h * s->ffn + 2 * h;
    uint64_t emb = (uint64_t)s->vocab * h;
    return emb + s->layers * per_layer + h + (s->tied_embeddings ? 0 : emb);
}

uint64_t llmem_shape_kv_bytes_per_token(const llmem_shape *s, size_t elem_bytes)
{
    return s ? 2ull * s->layers * s->kv_heads * s->head_dim * elem_bytes : 0;
}

/* a * b, or false on 64-bit overflow (*r then undefined). */
static bool mul(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }
static bool add(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_add_overflow(a, b, r); }

llmem_status llmem_shape_sizes(const llmem_shape *s, size_t elem_bytes, uint64_t *params, uint64_t *kv_bytes_per_token)
{
    if (!s) return llmem__fail(LLMEM_EINVAL, "shape: null argument");
    /* The same sums as llmem_shape_params, each step checked. */
    uint64_t h = s->hidden, kvd, qd, a, b, c, d, per_layer, emb, total;
    bool ok = mul(s->kv_heads, s->head_dim, &kvd) && mul(s->heads, s->head_dim, &qd) && mul(h, qd, &a) &&
              mul(h, kvd, &b) && mul(b, 2, &b) && mul(h, s->ffn, &c) && mul(c, 3, &c) && add(a, b, &per_layer) &&
              add(per_layer, a, &per_layer) && add(per_layer, c, &per_layer) && mul(2, h, &d) &&
              add(per_layer, d, &per_layer);
    ok = ok && mul(s->vocab, h, &emb) && mul(s->layers, per_layer, &total) && add(total, emb, &total) &&
         add(total, h, &total) && (s->tied_embeddings || add(total, emb, &total));
    if (!ok)
        return llmem__fail(LLMEM_EOVERFLOW,
                           "shape '%s': the parameter count overflows 64 bits (%u layers, hidden %u, %u heads x %u, "
                           "ffn %u, vocab %u)",
                           s->name, s->layers, s->hidden, s->heads, s->head_dim, s->ffn, s->vocab);
    uint64_t kv;
    if (!(mul(2, s->layers, &kv) && mul(kv, s->kv_heads, &kv) && mul(kv, s->head_dim, &kv) && mul(kv, elem_bytes, &kv)))
        return llmem__fail(LLMEM_EOVERFLOW,
                           "shape '%s': KV bytes per token overflow 64 bits (%u layers x %u KV heads x %u x %zu bytes)",
                           s->name, s->layers, s->kv_heads, s->head_dim, elem_bytes);
    if (params) *params = total;
    if (kv_bytes_per_token) *kv_bytes_per_token = kv;
    return LLMEM_OK;
}
