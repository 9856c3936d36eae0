/*
 * quantize.c - a GGUF model converted to another weight type
 * (llmem_model_quantize in llmem/quant.h), as `llmem quantize` and users
 * converting their own files need it.
 *
 * The input is mapped (llmem_model_open checks it whole first), its
 * metadata copied byte for byte in order (general.file_type replaced),
 * and each tensor written through the GGUF writer's fill callback: a 2-D
 * "*.weight" matrix row by row, decoded to f32 (llmem_dequantize_row) and
 * encoded to its new type (llmem_quantize_row); anything else, or a matrix
 * already of its new type, copied as it is. Memory: the writer's one
 * tensor buffer and one f32 row. The output is the writer's: a temporary
 * file renamed into place only when whole.
 */
#include <stdlib.h>
#include <string.h>

#include "llmem/quant.h"
#include "model_internal.h"

typedef struct qz {
    const llmem_model *m;
    uint32_t *types;   /* per tensor: the type written */
    float *row;        /* the widest row, f32 */
} qz;

/* llama.cpp's numbering of general.file_type for a file mostly of type t. */
static uint32_t file_type_of(uint32_t t)
{
    switch (t) {
    case LLMEM_DTYPE_F32: return 0;
    case LLMEM_DTYPE_F16: return 1;
    case LLMEM_DTYPE_Q4_0: return 2;
    case LLMEM_DTYPE_Q4_1: return 3;
    case LLMEM_DTYPE_Q8_0: return 7;
    case LLMEM_DTYPE_Q5_0: return 8;
    case LLMEM_DTYPE_Q5_1: return 9;
    case LLMEM_DTYPE_Q2_K: return 10;
    case LLMEM_DTYPE_Q3_K: return 11; /* Q3_K_S: q3_k throughout */
    case LLMEM_DTYPE_Q4_K: return 14; /* Q4_K_S */
    case LLMEM_DTYPE_Q5_K: return 16; /* Q5_K_S */
    case LLMEM_DTYPE_Q6_K: return 18;
    default: return 32;               /* BF16 */
    }
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

static llmem_status fill(void *ctx, size_t index, void *buf, size_t bytes)
{
    qz *q = ctx;
    const llmem_tensor *t = llmem_model_tensor_at(q->m, index);
    uint32_t to = q->types[index];
    if (to == t->type) {
        if (bytes != t->bytes) return llmem__fail(LLMEM_ECORRUPT, "quantize: tensor '%s' changed size", t->name);
        memcpy(buf, t->data, bytes);
        return LLMEM_OK;
    }
    uint64_t n = t->dims[0], rows = t->n_elements / n;
    uint64_t in_row = llmem_dtype_bytes(t->type, n), out_row = llmem_dtype_bytes(to, n);
    if (out_row * rows != bytes) return llmem__fail(LLMEM_ECORRUPT, "quantize: tensor '%s' changed size", t->name);
    for (uint64_t r = 0; r < rows; r++) {
        llmem_status st = llmem_dequantize_row(t->type, (const uint8_t *)t->data + r * in_row, q->row, (size_t)n);
        if (!st) st = llmem_quantize_row(to, q->row, (uint8_t *)buf + r * out_row, (size_t)n);
        if (st) return llmem__fail(st, "quantize: tensor '%s' row %llu: %s", t->name, (unsigned long long)r,
                                   llmem_error_message());
    }
    return LLMEM_OK;
}

llmem_status llmem_model_quantize(const char *in, const char *out, const llmem_quantize_options *opts,
                                  llmem_quantize_report *report)
{
    if (!in || !out || !opts) return llmem__fail(LLMEM_EINVAL, "quantize: null argument");
    if (report && report->struct_size < sizeof *report)
        return llmem__fail(LLMEM_EINVAL, "quantize: report struct_size %zu, want %zu", report->struct_size,
                           sizeof *report);
    if (!llmem_dtype_is_quantizable(opts->type))
        return llmem__fail(LLMEM_EINVAL, "quantize: type %u cannot be written", opts->type);
    llmem_model *m;
    llmem_status st = llmem_model_open(in, NULL, &m);
    if (st) return st;
    if (llmem_model_get_config(m)->format != LLMEM_MODEL_GGUF) {
        llmem_model_close(m);
        return llmem__fail(LLMEM_ENOTSUP, "quantize: '%s' is a llama2.c checkpoint; quantize takes GGUF files", in);
    }
    llmem_quantize_report rep = {sizeof rep};
    size_t nt = llmem_model_tensor_count(m);
    qz q = {m, calloc(nt ? nt : 1, sizeof(uint32_t)), NULL};
    uint64_t widest = 1;
    for (size_t i = 0; i < nt; i++)
        if (llmem_model_tensor_at(m, i)->dims[0] > widest) widest = llmem_model_tensor_at(m, i)->dims[0];
    q.row = malloc((size_t)widest * sizeof(float));
    llmem_gguf_writer *w = NULL;
    if (!q.types || !q.row) st = llmem__fail(LLMEM_ENOMEM, "quantize: out of memory");
    if (!st) st = llmem_gguf_writer_create(&w);

    /* Each tensor's new type. */
    uint32_t counts[64] = {0};
    for (size_t i = 0; !st && i < nt; i++) {
        const llmem_tensor *t = llmem_model_tensor_at(m, i);
        uint32_t to = t->type;
        bool matrix = t->n_dims == 2 && ends_with(t->name, ".weight");
        if (matrix && !(opts->keep_output && !strcmp(t->name, "output.weight"))) {
            to = llmem_quant_row_type(opts->type, t->dims[0]);
            if (!llmem_dtype_is_quantizable(t->type))
                st = llmem__fail(LLMEM_ENOTSUP, "quantize: tensor '%s' has type %s, which llmem cannot read", t->name,
                                 llmem_dtype_name(t->type));
        }
        q.types[i] = to;
        if (to == t->type) rep.kept++;
        else if (to == opts->type) rep.quantized++;
        else rep.fallback++;
        if (matrix && to < 64) counts[to]++;
    }
    /* general.file_type names the type most matrices have. */
    uint32_t most = opts->type;
    for (uint32_t t = 0; t < 64; t++)
        if (counts[t] > counts[most]) most = t;

    for (size_t i = 0; !st && i < m->n_meta; i++) {
        const llmem__meta *e = &m->meta[i];
        if (e->key_len == 17 && !memcmp(e->key, "general.file_type", 17)) continue;
        uint64_t end = i + 1 < m->n_meta ? m->meta[i + 1].offset : m->meta_end;
        st = llmem__gguf_add_raw(w, e->key, (size_t)e->key_len, m->base + e->offset, (size_t)(end - e->offset));
    }
    if (!st) st = llmem_gguf_add_u32(w, "general.file_type", file_type_of(most));
    for (size_t i = 0; !st && i < nt; i++) {
        const llmem_tensor *t = llmem_model_tensor_at(m, i);
        st = llmem_gguf_add_tensor(w, t->name, q.types[i], t->n_dims, t->dims, fill, &q);
        rep.bytes_in += t->bytes;
        rep.bytes_out += llmem_dtype_bytes(q.types[i], t->n_elements);
    }
    rep.tensors = nt;
    if (!st) st = llmem_gguf_write(w, out, opts->progress);
    llmem_gguf_writer_destroy(w);
    free(q.types);
    free(q.row);
    llmem_model_close(m);
    if (!st && report) *report = rep;
    return st;
}
