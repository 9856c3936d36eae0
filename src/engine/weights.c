/*
 * weights.c - the engine's weights: found by name in the model, checked
 * against the shape, 1-D tensors converted to f32, and on the AVX2 paths
 * the q4_K, q5_0 and q8_0 matrices repacked 8 rows interleaved
 * (kernels_q4k_x8.h). Runs once, from llmem_engine_create (weights.h).
 */
#include <stdio.h>
#include <string.h>

#include "llmem/engine.h"

#include "../core/internal.h"
#include "engine_internal.h"
#include "../model/model_release.h"
#include "kernels.h"
#include "kernels_q4k_x8.h"
#include "threads.h"
#include "weights.h"

/* ---- binding and checking ----------------------------------------------------------- */

static llmem_status want_tensor(const llmem_model *m, const char *name, const llmem_tensor **t)
{
    llmem_status st = llmem_model_tensor(m, name, t);
    if (st) return llmem__fail(st, "engine: the model has no tensor '%s'", name);
    return LLMEM_OK;
}

static llmem_status want_matrix(const llmem_model *m, const char *name, uint64_t n, uint64_t d, const void **w,
                                uint32_t *type)
{
    const llmem_tensor *t;
    llmem_status st = want_tensor(m, name, &t);
    if (st) return st;
    if (t->dims[0] != n || t->n_elements != n * d)
        return llmem__fail(LLMEM_EFORMAT, "engine: tensor '%s' is not %llu x %llu", name, (unsigned long long)d,
                           (unsigned long long)n);
    if (!llmem__matmul_supports(t->type))
        return llmem__fail(LLMEM_ENOTSUP, "engine: tensor '%s' has type %s, which the kernels do not take", name,
                           llmem_dtype_name(t->type));
    *w = t->data;
    *type = t->type;
    return LLMEM_OK;
}

/* The widest activation row (per token) any matmul or group of forward()
 * quantises to: a group's rows for all its layouts. */
static size_t xq_row_bytes(const llmem_engine *e)
{
    size_t m = 0;
#define W(n, ...)                                                                                                  \
    do {                                                                                                           \
        const uint32_t ts_[] = {__VA_ARGS__};                                                                      \
        size_t b_ = llmem__matmul_group_scratch_bytes(ts_, sizeof ts_ / sizeof ts_[0], n, 1);                      \
        if (b_ > m) m = b_;                                                                                        \
    } while (0)
    for (uint32_t l = 0; l < e->L; l++) {
        const eng_layer *ly = &e->layers[l];
        W(e->dim, ly->tq, ly->tk, ly->tv);
        W(e->qdim, ly->to);
        W(e->dim, ly->t1, ly->t3);
        W(e->ffn, ly->t2);
    }
    W(e->dim, e->wcls_type);
#undef W
    return m;
}

/* Whether the matrices will be repacked and their file pages given back
 * (see "repacked weights" below). */
static bool repacking(const llmem_engine *e)
{
    return !e->use_malloc && llmem__model_releasable(e->model) && strncmp(llmem__kernels_isa(), "avx2", 4) == 0;
}

/* A 1-D tensor as f32: in place when it is f32 and the file stays mapped
 * whole, else converted (or copied) into e->converted at *used (counted
 * only, when fill is false). Copied when the matrices are repacked: the
 * norms lie between the matrices whose pages repack_matrix gives back, and
 * a read of one in every step faulted its neighbours back in, a 2 MiB
 * folio at a time where the page cache maps large folios (yi-coder-1.5b
 * q8_0: 49 vectors of 8 KiB kept 104 MiB of released matrices resident). */
static llmem_status want_vector(llmem_engine *e, const char *name, uint64_t n, bool fill, bool copy,
                                const float **out, size_t *used)
{
    const llmem_tensor *t;
    llmem_status st = want_tensor(e->model, name, &t);
    if (st) return st;
    if (t->n_elements != n)
        return llmem__fail(LLMEM_EFORMAT, "engine: tensor '%s' has %llu elements, not %llu", name,
                           (unsigned long long)t->n_elements, (unsigned long long)n);
    if (t->type == LLMEM_DTYPE_F32 && !copy) {
        *out = t->data;
        return LLMEM_OK;
    }
    if (!llmem__matmul_supports(t->type))
        return llmem__fail(LLMEM_ENOTSUP, "engine: tensor '%s' has type %s", name, llmem_dtype_name(t->type));
    if (fill) {
        float *dst = e->converted + *used;
        if (t->type == LLMEM_DTYPE_F32) memcpy(dst, t->data, n * sizeof(float));
        else llmem__dequant_row(t->type, t->data, 0, n, dst);
        /* its pages go back with every unread tensor's (release_unread) */
        if (copy && t->type == LLMEM_DTYPE_F32) e->st.weights_mapped_bytes -= t->bytes; /* now only converted */
        *out = dst;
    }
    *used += n;
    return LLMEM_OK;
}

/* Whether the model has the tensor, leaving no error message when not. */
static bool has_tensor(const llmem_model *m, const char *name)
{
    for (size_t i = 0; i < llmem_model_tensor_count(m); i++)
        if (!strcmp(llmem_model_tensor_at(m, i)->name, name)) return true;
    return false;
}

/* The i-th vector slot of the engine (5 a layer: attn_norm, ffn_norm and
 * the Q/K/V biases; then out_norm), with its tensor's name and length, or
 * false past the last. A bias is optional: bound only when the
 * architecture has them and the file holds it. One list for binding and
 * for vector_in_place, so that a vector added to one is in the other. */
static bool vec_slot(llmem_engine *e, size_t i, const float ***v, char *name, size_t cap, uint64_t *n, bool *optional)
{
    static const char *const what[5] = {"attn_norm.weight", "ffn_norm.weight", "attn_q.bias", "attn_k.bias",
                                        "attn_v.bias"};
    if (i < (size_t)e->L * 5) {
        eng_layer *ly = &e->layers[i / 5];
        const float **slot[5] = {&ly->attn_norm, &ly->ffn_norm, &ly->bq, &ly->bk, &ly->bv};
        const uint64_t rows[5] = {e->dim, e->dim, e->qdim, e->kvdim, e->kvdim};
        const size_t k = i % 5;
        *v = slot[k];
        *n = rows[k];
        *optional = k >= 2;
        if (name) snprintf(name, cap, "blk.%zu.%s", i / 5, what[k]);
        return true;
    }
    if (i > (size_t)e->L * 5) return false;
    *v = &e->out_norm;
    *n = e->dim;
    *optional = false;
    if (name) snprintf(name, cap, "output_norm.weight");
    return true;
}

static llmem_status bind_vectors(llmem_engine *e, bool fill, bool copy, size_t *used)
{
    char name[96];
    const bool bias = llmem_model_get_config(e->model)->qkv_bias;
    const float **v;
    uint64_t n;
    bool optional;
    for (size_t i = 0; vec_slot(e, i, &v, name, sizeof name, &n, &optional); i++) {
        /* The loader checked each bias there is; llama's are optional. */
        if (optional && (!bias || !has_tensor(e->model, name))) continue;
        llmem_status st = want_vector(e, name, n, fill, copy, v, used);
        if (st) return st;
    }
    return LLMEM_OK;
}

static size_t repack_total(llmem_engine *e);

static llmem_status bind_weights(llmem_engine *e)
{
    const llmem_model *m = e->model;
    char name[96];
    llmem_status st;
    for (uint32_t l = 0; l < e->L; l++) {
        eng_layer *ly = &e->layers[l];
#define MAT(field, type, suffix, n, d)                                                                              \
    snprintf(name, sizeof name, "blk.%u." suffix ".weight", l);                                                     \
    if ((st = want_matrix(m, name, n, d, &ly->field, &ly->type))) return st;
        MAT(wq, tq, "attn_q", e->dim, e->qdim)
        MAT(wk, tk, "attn_k", e->dim, e->kvdim)
        MAT(wv, tv, "attn_v", e->dim, e->kvdim)
        MAT(wo, to, "attn_output", e->qdim, e->dim)
        MAT(w1, t1, "ffn_gate", e->dim, e->ffn)
        MAT(w2, t2, "ffn_down", e->ffn, e->dim)
        MAT(w3, t3, "ffn_up", e->dim, e->ffn)
#undef MAT
    }
    if ((st = want_matrix(m, "token_embd.weight", e->dim, e->vocab, &e->embd, &e->embd_type))) return st;
    const llmem_tensor *out;
    if (llmem_model_tensor(m, "output.weight", &out) == LLMEM_OK) {
        if ((st = want_matrix(m, "output.weight", e->dim, e->vocab, &e->wcls, &e->wcls_type))) return st;
    } else {
        e->wcls = e->embd;
        e->wcls_type = e->embd_type;
    }
    e->xq_row = xq_row_bytes(e);
    /* Count the f32 copies needed, take them in one block, then fill. */
    const bool copy = repack_total(e) > 0;
    size_t n = 0;
    if ((st = bind_vectors(e, false, copy, &n))) return st;
    if (n) {
        e->converted_bytes = n * sizeof(float);
        if (!(e->converted = llmem__engine_keep_alloc(e, e->converted_bytes)))
            return llmem__fail(LLMEM_ENOMEM, "engine: no memory for %zu bytes of converted weights",
                               e->converted_bytes);
    }
    n = 0;
    return bind_vectors(e, true, copy, &n);
}

/* ---- repacked weights -----------------------------------------------------------------
 *
 * On the AVX2 paths, every q4_K, q5_0, q4_0 and q8_0 matrix is copied at load
 * into the 8-row interleaved layouts of kernels_q4k_x8.h (same values, same
 * results; about 2x the q4_K decode matmul's speed; q8_0's the same size,
 * one linear stream where the in-place rows are 8), in one mapping of the
 * pool's resource tagged "engine-weights" and counted as converted
 * weights. As each matrix is copied its file pages are given back
 * (llmem__model_release) a few MB at a time, so the peak stays about the
 * model plus one chunk. Only for a private, unlocked file mapping: a
 * shared or mlocked mapping, a copied model or a memory model keeps its
 * tensors and reads them in place, as does the malloc baseline. The
 * classifier is repacked only when it is not the embedding table, which
 * lookups read by rows. */

/* The i-th matrix slot of the engine (7 a layer, then the classifier), or
 * false past the last. */
static bool mat_slot(llmem_engine *e, size_t i, const void ***w, uint32_t **type, size_t *n, size_t *d)
{
    if (i < (size_t)e->L * 7) {
        eng_layer *ly = &e->layers[i / 7];
        const size_t dim = e->dim, qd = e->qdim, kvd = e->kvdim, ffn = e->ffn;
        switch (i % 7) {
        case 0: *w = &ly->wq; *type = &ly->tq; *n = dim; *d = qd; break;
        case 1: *w = &ly->wk; *type = &ly->tk; *n = dim; *d = kvd; break;
        case 2: *w = &ly->wv; *type = &ly->tv; *n = dim; *d = kvd; break;
        case 3: *w = &ly->wo; *type = &ly->to; *n = qd; *d = dim; break;
        case 4: *w = &ly->w1; *type = &ly->t1; *n = dim; *d = ffn; break;
        case 5: *w = &ly->w2; *type = &ly->t2; *n = ffn; *d = dim; break;
        default: *w = &ly->w3; *type = &ly->t3; *n = dim; *d = ffn; break;
        }
        return true;
    }
    if (i > (size_t)e->L * 7) return false;
    *w = &e->wcls;
    *type = &e->wcls_type;
    *n = e->dim;
    *d = e->vocab;
    return true;
}

/* The repacked layout of each source type (kernels_q4k_x8.h): its bytes
 * for d rows of n, its pack, and the wtype the kernels take for it. */
typedef struct repack_kind {
    uint32_t type, wtype;
    size_t (*bytes)(size_t n, size_t d);
    void (*pack)(void *dst, const void *src, size_t n, size_t d);
} repack_kind;

static const repack_kind repack_kinds[] = {
    {LLMEM_DTYPE_Q4_K, LLMEM__WTYPE_Q4K_X8, llmem__q4k_x8_bytes, llmem__q4k_x8_pack},
    {LLMEM_DTYPE_Q5_0, LLMEM__WTYPE_Q5_0_X8, llmem__q5_0_x8_bytes, llmem__q5_0_x8_pack},
    {LLMEM_DTYPE_Q4_0, LLMEM__WTYPE_Q4_0_X8, llmem__q4_0_x8_bytes, llmem__q4_0_x8_pack},
    {LLMEM_DTYPE_Q8_0, LLMEM__WTYPE_Q8_0_X8, llmem__q8_0_x8_bytes, llmem__q8_0_x8_pack},
};

/* The repacked layout for a matrix slot's tensor, or NULL to read it in place. */
static const repack_kind *repack_this(const llmem_engine *e, const void *w, uint32_t type)
{
    if (w == e->embd && e->wcls == e->embd) return NULL;
    for (size_t i = 0; i < sizeof repack_kinds / sizeof repack_kinds[0]; i++)
        if (repack_kinds[i].type == type) return &repack_kinds[i];
    return NULL;
}

/* Bytes of d rows of n of the tensor as the file holds it (want_matrix
 * took only types the model layer knows, and n whole blocks). */
static size_t source_size(const repack_kind *rk, size_t n, size_t d)
{
    return (size_t)llmem_dtype_bytes(rk->type, n) * d;
}

/* Groups [g0, g1) of one matrix to repack (a group: 8 rows; the tail rows
 * past the last whole group count as one more), split over the thread
 * team by whole groups: each group's blocks depend on its 8 rows only. */
typedef struct repack_job {
    uint8_t *dst;
    const uint8_t *src;
    const repack_kind *rk;
    size_t n, d, g0, g1;
} repack_job;

static void repack_part(void *ctx, unsigned index, unsigned count)
{
    const repack_job *j = ctx;
    const size_t groups = j->d / 8;
    size_t g0, g1;
    llmem__threads_split(j->g1 - j->g0, 1, index, count, &g0, &g1);
    g0 += j->g0;
    g1 += j->g0;
    if (g0 >= g1) return;
    const size_t rows = (g1 > groups ? j->d : 8 * g1) - 8 * g0;
    j->rk->pack(j->dst + j->rk->bytes(j->n, 8 * g0), j->src + 8 * g0 * source_size(j->rk, j->n, 1), j->n, rows);
}

/* Source bytes repacked between two releases of the file's pages: the
 * peak is the model plus this much, not plus the largest matrix (with
 * --populate the whole file is resident first; yi-coder-1.5b's q8_0
 * classifier alone is 139 MB). */
#define REPACK_CHUNK_BYTES ((size_t)4 << 20)

/* Repacks one matrix into dst a chunk of groups at a time, giving back
 * each chunk's file pages as it goes, then the whole range (the pages a
 * chunk's bounds cut). */
static void repack_matrix(llmem_engine *e, uint8_t *dst, const void *src, const repack_kind *rk, size_t n, size_t d)
{
    const size_t rb = source_size(rk, n, 1), groups = d / 8 + (d % 8 ? 1 : 0);
    const size_t step = REPACK_CHUNK_BYTES / (8 * rb) ? REPACK_CHUNK_BYTES / (8 * rb) : 1;
    for (size_t g = 0; g < groups; g += step) {
        repack_job job = {dst, src, rk, n, d, g, g + step < groups ? g + step : groups};
        llmem__threads_run(e->th, repack_part, &job);
        const size_t r1 = 8 * job.g1 < d ? 8 * job.g1 : d;
        llmem__model_release(e->model, (const uint8_t *)src + 8 * g * rb, (r1 - 8 * g) * rb);
    }
    llmem__model_release(e->model, src, d * rb);
}

/* Whether a 1-D tensor's data is bound in place (want_vector leaves f32
 * vectors in the file when nothing is repacked). */
static bool vector_in_place(llmem_engine *e, const void *data)
{
    const float **v;
    uint64_t n;
    bool optional;
    for (size_t i = 0; vec_slot(e, i, &v, NULL, 0, &n, &optional); i++)
        if ((const void *)*v == data) return true;
    return false;
}

/* Whether the steps read the whole of tensor t in place: a matrix left as
 * the file has it, a vector want_vector left there. Not the embedding,
 * unless it is the classifier too: a step reads one row of it per token,
 * so its pages go back with the unread tensors' and the rows the prompts
 * look up fault back in from the page cache, a few pages each
 * (yi-coder-1.5b's q6_K embedding is 80 MB, 6% of the file, and a
 * conversation reads a few hundred of its 64000 rows). */
static bool read_in_place(llmem_engine *e, const llmem_tensor *t)
{
    if (t->n_dims == 1) return vector_in_place(e, t->data);
    const void **w;
    uint32_t *type;
    size_t n, d;
    for (size_t i = 0; mat_slot(e, i, &w, &type, &n, &d); i++)
        if (*w == t->data) return true;
    return false;
}

/* Gives back, once more, the pages of every tensor the steps do not read:
 * each matrix's source was released as it was repacked, but the reads of
 * the next one faulted some back in (fault-around maps the cached pages
 * near a fault, 64 KiB by default, and a large folio maps whole). */
static void release_unread(llmem_engine *e)
{
    for (size_t i = 0; i < llmem_model_tensor_count(e->model); i++) {
        const llmem_tensor *t = llmem_model_tensor_at(e->model, i);
        if (!read_in_place(e, t)) llmem__model_release(e->model, t->data, t->bytes);
    }
}

/* Bytes of the repacked matrices, each 64-byte aligned: 0 when nothing
 * is repacked. */
static size_t repack_total(llmem_engine *e)
{
    if (!repacking(e)) return 0;
    const void **w;
    uint32_t *type;
    size_t n, d, total = 0;
    const repack_kind *rk;
    for (size_t i = 0; mat_slot(e, i, &w, &type, &n, &d); i++)
        if ((rk = repack_this(e, *w, *type))) total += (rk->bytes(n, d) + 63) & ~(size_t)63;
    return total;
}

static llmem_status repack_weights(llmem_engine *e)
{
    const size_t total = repack_total(e);
    if (!total) return LLMEM_OK;
    const void **w;
    uint32_t *type;
    size_t n, d;
    const repack_kind *rk;
    llmem_status st = llmem_resource_round(e->res, total, &e->repacked_map);
    if (!st) st = llmem_resource_map_tagged(e->res, e->repacked_map, 0, 0, "engine-weights", &e->repacked);
    if (st) {
        e->repacked = NULL;
        return llmem__fail(st, "engine: no memory for %zu bytes of repacked q4_K/q5_0/q4_0/q8_0 weights", total);
    }
    size_t off = 0;
    for (size_t i = 0; mat_slot(e, i, &w, &type, &n, &d); i++) {
        if (!(rk = repack_this(e, *w, *type))) continue;
        uint8_t *dst = (uint8_t *)e->repacked + off;
        const size_t bytes = rk->bytes(n, d), src = source_size(rk, n, d);
        repack_matrix(e, dst, *w, rk, n, d);
        *w = dst;
        *type = rk->wtype;
        off += (bytes + 63) & ~(size_t)63;
        e->repacked_bytes += bytes;
        e->st.weights_mapped_bytes -= src;
    }
    return LLMEM_OK;
}

llmem_status llmem__engine_load_weights(llmem_engine *e)
{
    e->st.weights_mapped_bytes = 0;
    for (size_t i = 0; i < llmem_model_tensor_count(e->model); i++)
        e->st.weights_mapped_bytes += llmem_model_tensor_at(e->model, i)->bytes;
    llmem_status st = bind_weights(e);
    if (!st) st = repack_weights(e);
    if (!st) release_unread(e);
    return st;
}
