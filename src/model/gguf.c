/*
 * gguf.c - GGUF v2/v3 parsing, the llama config check, metadata lookups.
 *
 * Layout (all little-endian; v2 and v3 are the same on a little-endian
 * file, v1 had 32-bit counts and is refused):
 *
 *     u32 magic "GGUF", u32 version, u64 tensor_count, u64 kv_count
 *     kv_count x   { string key, u32 type, value }
 *     tensor_count x { string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset }
 *     padding to `general.alignment` (u32 key, default 32; a power of two
 *     of at least 8: the specification says a multiple of 8, ggml a power
 *     of two)
 *     tensor data: each tensor at data_start + offset (offset % alignment == 0)
 *
 * A string is a u64 length and that many bytes (no NUL). A value is a
 * scalar (u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64), a string, or an
 * array: u32 element type, u64 count, the elements (arrays may nest; we
 * accept up to MAX_DEPTH levels).
 *
 * Every length, count and offset is checked against the bytes left before
 * it is used, with overflow-checked arithmetic, and no allocation is sized
 * by a count the file has not yet paid for in bytes: tables grow by
 * doubling as entries parse, and a string array's offsets table (8 bytes
 * per element) is allocated only after its count is checked against the
 * remaining bytes (each element costs at least 8). Work is linear in the
 * file's size.
 *
 * Tensors: 1 to 4 dims, each non-zero, product without overflow (and below
 * 2^63, ggml's int64), a known type, rows (dims[0]) made of whole blocks for
 * block types (ggml's requirement, stricter than a whole number of blocks
 * overall: engines read a row as blocks), offset aligned, data inside the
 * file, no two tensors overlapping, names unique and without NUL bytes.
 *
 * Then the config check: general.architecture "llama" or "qwen2" (another
 * is LLMEM_ENOTSUP), that arch's keys (ARCH.context_length, ...; ARCH.
 * attention.sliding_window when present), and every tensor of model.h's
 * table with exactly the dims the config implies and a type the engine
 * reads: qwen2's Q/K/V biases required, llama's optional (as llama.cpp).
 *
 * Metadata getters: integer getters convert any integer type whose value
 * fits; llmem_model_meta_f32 takes f32, and f64 whose magnitude fits a float
 * (rounded to nearest); array elements are O(1) (string arrays through the
 * offsets table built at parse time).
 */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

#define MAX_DEPTH 8             /* nesting of arrays in metadata */
#define DEFAULT_ALIGNMENT 32u
#define MIN_KV_BYTES 13u        /* u64 key length + u32 type + a 1-byte value */
#define MIN_TENSOR_INFO_BYTES 33u /* u64 name length + 1 byte + u32 n_dims + u64 dim + u32 type + u64 offset */

typedef unsigned long long ull;

/* A cursor over the file: at <= n always. */
typedef struct rd {
    const uint8_t *p;
    uint64_t n, at;
} rd;

static uint64_t left(const rd *r) { return r->n - r->at; }

static uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t ld64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Bytes of a scalar metadata type; 0 for string, array and unknown types. */
static uint32_t scalar_size(uint32_t t)
{
    switch (t) {
    case LLMEM_META_U8: case LLMEM_META_I8: case LLMEM_META_BOOL: return 1;
    case LLMEM_META_U16: case LLMEM_META_I16: return 2;
    case LLMEM_META_U32: case LLMEM_META_I32: case LLMEM_META_F32: return 4;
    case LLMEM_META_U64: case LLMEM_META_I64: case LLMEM_META_F64: return 8;
    default: return 0;
    }
}

static const char *meta_type_name(uint32_t t)
{
    static const char *const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return t < LLMEM_ARRAY_LEN(names) ? names[t] : "unknown";
}

/* ---- metadata values ----------------------------------------------------- */

/* Step over a string at r->at; `what` and `where` name it in messages. */
static llmem_status skip_string(rd *r, const char *what, const char *key, uint64_t key_off)
{
    uint64_t at = r->at;
    if (left(r) < 8)
        return llmem__fail(LLMEM_EFORMAT, "gguf: %s '%s' (key at offset %llu): string length at offset %llu runs past "
                           "the end of the file (%llu bytes)", what, key, (ull)key_off, (ull)at, (ull)r->n);
    uint64_t len = ld64(r->p + r->at);
    r->at += 8;
    if (len > left(r))
        return llmem__fail(LLMEM_EFORMAT, "gguf: %s '%s' (key at offset %llu): string length %llu at offset %llu "
                           "exceeds the file (%llu bytes)", what, key, (ull)key_off, (ull)len, (ull)at, (ull)r->n);
    r->at += len;
    return LLMEM_OK;
}

/* Step over an array body (element type and count already read) of `count`
 * elements of type et. Recursion is bounded by MAX_DEPTH. */
static llmem_status skip_array(rd *r, uint32_t et, uint64_t count, int depth, const char *key, uint64_t key_off)
{
    uint32_t sz = scalar_size(et);
    if (sz) {
        if (count > left(r) / sz)
            return llmem__fail(LLMEM_EFORMAT, "gguf: metadata '%s' (offset %llu): array of %llu %s needs more bytes "
                               "than the file has left (%llu at offset %llu)", key, (ull)key_off, (ull)count,
                               meta_type_name(et), (ull)left(r), (ull)r->at);
        r->at += count * sz;
        return LLMEM_OK;
    }
    if (et == LLMEM_META_STRING) {
        if (count > left(r) / 8)
            return llmem__fail(LLMEM_EFORMAT, "gguf: metadata '%s' (offset %llu): array count %llu of strings "
                               "exceeds the file (%llu bytes left at offset %llu)", key, (ull)key_off, (ull)count,
                               (ull)left(r), (ull)r->at);
        for (uint64_t i = 0; i < count; i++) {
            llmem_status st = skip_string(r, "metadata", key, key_off);
            if (st) return st;
        }
        return LLMEM_OK;
    }
    if (et == LLMEM_META_ARRAY) {
        if (depth >= MAX_DEPTH)
            return llmem__fail(LLMEM_EFORMAT, "gguf: metadata '%s' (offset %llu): arrays nested deeper than %d",
                               key, (ull)key_off, MAX_DEPTH);
        if (count > left(r) / 12)
            return llmem__fail(LLMEM_EFORMAT, "gguf: metadata '%s' (offset %llu): array count %llu of arrays "
                               "exceeds the file (%llu bytes left at offset %llu)", key, (ull)key_off, (ull)count,
                               (ull)left(r), (ull)r->at);
        for (uint64_t i = 0; i < count; i++) {
            if (left(r) < 12)
                return llmem__fail(LLMEM_EFORMAT, "gguf: metadata '%s' (offset %llu): nested array header at "
                                   "offset %llu runs past the end of the file", key, (ull)key_off, (ull)r->at);
            uint32_t et2 = ld32(r->p + r->at);
            uint64_t n2 = ld64(r->p + r->at + 4);
            r->at += 12;
            llmem_status st = skip_array(r, et2, n2, depth + 1, key, key_off);
            if (st) return st;
        }
        return LLMEM_OK;
    }
    return llmem__fail(LLMEM_EFORMAT, "gguf: metadata '%s' (offset %llu): unknown array element type %u at offset %llu",
                       key, (ull)key_off, et, (ull)(r->at - 12));
}

/* Parse one key/value into e (which the caller has already counted in
 * m->n_meta, so a str_off allocated here is freed on failure). */
static llmem_status parse_kv(rd *r, llmem__meta *e)
{
    e->offset = r->at;
    if (left(r) < 8)
        return llmem__fail(LLMEM_EFORMAT, "gguf: metadata key at offset %llu runs past the end of the file (%llu "
                           "bytes)", (ull)r->at, (ull)r->n);
    uint64_t len = ld64(r->p + r->at);
    if (len > left(r) - 8)
        return llmem__fail(LLMEM_EFORMAT, "gguf: metadata key at offset %llu: string length %llu exceeds the file "
                           "(%llu bytes)", (ull)r->at, (ull)len, (ull)r->n);
    r->at += 8;
    e->key = (const char *)r->p + r->at;
    e->key_len = len;
    r->at += len;
    char key[64];
    llmem__show(key, sizeof key, e->key, len);
    if (left(r) < 4)
        return llmem__fail(LLMEM_EFORMAT, "gguf: metadata '%s' (offset %llu): value type at offset %llu runs past "
                           "the end of the file", key, (ull)e->offset, (ull)r->at);
    e->type = ld32(r->p + r->at);
    r->at += 4;
    e->value = r->at;
    uint32_t sz = scalar_size(e->type);
    if (sz) {
        if (left(r) < sz)
            return llmem__fail(LLMEM_EFORMAT, "gguf: metadata '%s' (offset %llu): %s value at offset %llu runs past "
                               "the end of the file", key, (ull)e->offset, meta_type_name(e->type), (ull)r->at);
        r->at += sz;
        return LLMEM_OK;
    }
    if (e->type == LLMEM_META_STRING) return skip_string(r, "metadata", key, e->offset);
    if (e->type != LLMEM_META_ARRAY)
        return llmem__fail(LLMEM_EFORMAT, "gguf: metadata '%s' (offset %llu): unknown value type %u at offset %llu",
                           key, (ull)e->offset, e->type, (ull)(r->at - 4));
    if (left(r) < 12)
        return llmem__fail(LLMEM_EFORMAT, "gguf: metadata '%s' (offset %llu): array header at offset %llu runs past "
                           "the end of the file", key, (ull)e->offset, (ull)r->at);
    e->elem_type = ld32(r->p + r->at);
    e->count = ld64(r->p + r->at + 4);
    r->at += 12;
    e->value = r->at;
    if (e->elem_type != LLMEM_META_STRING) return skip_array(r, e->elem_type, e->count, 1, key, e->offset);
    /* Strings: record where each one starts so element i is O(1). The
     * count was checked against the bytes left, which bounds the table. */
    if (e->count > left(r) / 8)
        return llmem__fail(LLMEM_EFORMAT, "gguf: metadata '%s' (offset %llu): array count %llu of strings exceeds "
                           "the file (%llu bytes left at offset %llu)", key, (ull)e->offset, (ull)e->count,
                           (ull)left(r), (ull)r->at);
    if (e->count) {
        e->str_off = malloc((size_t)e->count * sizeof *e->str_off);
        if (!e->str_off)
            return llmem__fail(LLMEM_ENOMEM, "gguf: out of memory for the %llu strings of '%s'", (ull)e->count, key);
    }
    for (uint64_t i = 0; i < e->count; i++) {
        e->str_off[i] = r->at;
        llmem_status st = skip_string(r, "metadata", key, e->offset);
        if (st) return st;
    }
    return LLMEM_OK;
}

/* ---- tensor infos -------------------------------------------------------- */

/* Where a tensor's name lies in the file while the infos are parsed. */
typedef struct name_ref {
    uint64_t at, len;
} name_ref;

static llmem_status parse_tensor_info(rd *r, uint64_t index, uint32_t alignment, llmem_tensor *t, name_ref *nr)
{
    uint64_t start = r->at;
    if (left(r) < 8)
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor info %llu at offset %llu runs past the end of the file (%llu "
                           "bytes)", (ull)index, (ull)start, (ull)r->n);
    uint64_t len = ld64(r->p + r->at);
    if (len > left(r) - 8)
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor info %llu at offset %llu: name string length %llu exceeds the "
                           "file (%llu bytes)", (ull)index, (ull)start, (ull)len, (ull)r->n);
    if (len == 0)
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor info %llu at offset %llu: empty name", (ull)index, (ull)start);
    r->at += 8;
    const char *name = (const char *)r->p + r->at;
    if (memchr(name, 0, (size_t)len))
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor info %llu at offset %llu: name contains a NUL byte",
                           (ull)index, (ull)start);
    nr->at = r->at;
    nr->len = len;
    r->at += len;
    char nm[64];
    llmem__show(nm, sizeof nm, name, len);
    if (left(r) < 4)
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' (info at offset %llu): n_dims runs past the end of the "
                           "file", nm, (ull)start);
    uint32_t nd = ld32(r->p + r->at);
    if (nd < 1 || nd > 4)
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' (info at offset %llu): n_dims %u at offset %llu must be "
                           "1..4", nm, (ull)start, nd, (ull)r->at);
    r->at += 4;
    if (left(r) < (uint64_t)nd * 8 + 12)
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' (info at offset %llu): dims, type and offset run past the "
                           "end of the file (%llu bytes)", nm, (ull)start, (ull)r->n);
    t->n_dims = nd;
    uint64_t n = 1;
    for (uint32_t d = 0; d < 4; d++) t->dims[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        t->dims[d] = ld64(r->p + r->at + 8 * d);
        if (t->dims[d] == 0)
            return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' (info at offset %llu): dim %u is 0", nm, (ull)start, d);
        if (__builtin_mul_overflow(n, t->dims[d], &n) || n > (uint64_t)INT64_MAX)
            return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' (info at offset %llu): element count overflows "
                               "(dims %u of %u)", nm, (ull)start, d + 1, nd);
    }
    r->at += (uint64_t)nd * 8;
    t->n_elements = n;
    t->type = ld32(r->p + r->at);
    t->offset = ld64(r->p + r->at + 4);
    r->at += 12;
    uint32_t block = llmem__dtype_block(t->type);
    if (!block)
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' (info at offset %llu): unknown type %u", nm, (ull)start,
                           t->type);
    if (t->dims[0] % block)
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' (info at offset %llu): rows of %llu elements are not "
                           "whole %s blocks of %u", nm, (ull)start, (ull)t->dims[0], llmem_dtype_name(t->type), block);
    t->bytes = llmem_dtype_bytes(t->type, n);
    if (!t->bytes)
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' (info at offset %llu): byte size of %llu %s elements "
                           "overflows", nm, (ull)start, (ull)n, llmem_dtype_name(t->type));
    if (t->offset % alignment)
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' (info at offset %llu): data offset %llu is not a "
                           "multiple of the alignment %u", nm, (ull)start, (ull)t->offset, alignment);
    return LLMEM_OK;
}

typedef struct span {
    uint64_t start, bytes;
    size_t index;
} span;

static int by_start(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Tensors sorted by start must each end before the next begins. */
static llmem_status check_overlaps(const llmem_model *m)
{
    if (m->n_tensors < 2) return LLMEM_OK;
    span *s = malloc(m->n_tensors * sizeof *s);
    if (!s) return llmem__fail(LLMEM_ENOMEM, "gguf: out of memory");
    for (size_t i = 0; i < m->n_tensors; i++)
        s[i] = (span){(uint64_t)((const uint8_t *)m->tensors[i].data - m->base), m->tensors[i].bytes, i};
    qsort(s, m->n_tensors, sizeof *s, by_start);
    llmem_status st = LLMEM_OK;
    for (size_t i = 1; i < m->n_tensors && !st; i++)
        if (s[i - 1].start + s[i - 1].bytes > s[i].start) {
            const llmem_tensor *a = &m->tensors[s[i - 1].index], *b = &m->tensors[s[i].index];
            char na[64], nb[64];
            llmem__show(na, sizeof na, a->name, strlen(a->name));
            llmem__show(nb, sizeof nb, b->name, strlen(b->name));
            st = llmem__fail(LLMEM_EFORMAT, "gguf: tensors '%s' data [%llu, +%llu) and '%s' data [%llu, +%llu) overlap "
                             "(offset %llu)", na, (ull)s[i - 1].start, (ull)a->bytes, nb, (ull)s[i].start,
                             (ull)b->bytes, (ull)s[i].start);
        }
    free(s);
    return st;
}

/* ---- the llama-family config --------------------------------------------- */

/* What general.architecture may name. Each arch's keys start with its
 * name ("qwen2.context_length"), as llama.cpp's LLM_KV table spells them. */
typedef struct arch_info {
    const char *name;
    llmem_arch arch;
    llmem_rope_style rope;  /* llama.cpp's llama_model_rope_type for the arch */
    bool bias_required;     /* Q/K/V biases part of the architecture (qwen2: HF's attention bias) */
} arch_info;

static const arch_info archs[] = {
    {"llama", LLMEM_ARCH_LLAMA, LLMEM_ROPE_NORM, false},
    {"qwen2", LLMEM_ARCH_QWEN2, LLMEM_ROPE_NEOX, true},
};

/* "ARCH.suffix" into key (cap bytes). */
static const char *arch_key(char *key, size_t cap, const arch_info *a, const char *suffix)
{
    snprintf(key, cap, "%s.%s", a->name, suffix);
    return key;
}

static llmem_status need_u32(const llmem_model *m, const char *key, bool required, uint32_t def, uint32_t lo,
                             uint32_t *out)
{
    /* Look first: an optional key's absence leaves no error message. */
    if (!llmem__meta_find(m, key)) {
        if (required) return llmem__fail(LLMEM_EFORMAT, "gguf: model without the key '%s'", key);
        *out = def;
        return LLMEM_OK;
    }
    llmem_status st = llmem_model_meta_u32(m, key, out);
    if (st) return st;
    if (*out < lo) return llmem__fail(LLMEM_EFORMAT, "gguf: '%s' is %u, must be at least %u", key, *out, lo);
    return LLMEM_OK;
}

static llmem_status need_f32(const llmem_model *m, const char *key, float def, float *out)
{
    if (!llmem__meta_find(m, key)) {
        *out = def;
        return LLMEM_OK;
    }
    llmem_status st = llmem_model_meta_f32(m, key, out);
    if (st) return st;
    if (!(*out > 0) || !isfinite(*out))
        return llmem__fail(LLMEM_EFORMAT, "gguf: '%s' is %g, must be a positive finite number", key, (double)*out);
    return LLMEM_OK;
}

/* The matrix types, in the order weight_type prefers on a tie. */
static const uint32_t matrix_types[] = {LLMEM_DTYPE_F32,  LLMEM_DTYPE_F16,  LLMEM_DTYPE_BF16, LLMEM_DTYPE_Q8_0,
                                        LLMEM_DTYPE_Q4_0, LLMEM_DTYPE_Q4_1, LLMEM_DTYPE_Q5_0, LLMEM_DTYPE_Q5_1,
                                        LLMEM_DTYPE_Q2_K, LLMEM_DTYPE_Q3_K, LLMEM_DTYPE_Q4_K, LLMEM_DTYPE_Q5_K,
                                        LLMEM_DTYPE_Q6_K};
#define N_MATRIX_TYPES LLMEM_ARRAY_LEN(matrix_types)

/* Types the engine reads: matrices any of those, vectors f32/f16. */
static bool engine_type(uint32_t type, bool matrix)
{
    if (type == LLMEM_DTYPE_F32 || type == LLMEM_DTYPE_F16) return true;
    if (!matrix) return false;
    for (size_t i = 0; i < N_MATRIX_TYPES; i++)
        if (matrix_types[i] == type) return true;
    return false;
}

/* The tensor `name` must exist with exactly these dims (d1 == 0: 1-D). Its
 * type is counted in counts[] when it is a matrix. */
static llmem_status want(const llmem_model *m, const char *name, uint64_t d0, uint64_t d1, uint32_t *counts)
{
    const llmem_tensor *t = llmem__tensor_find(m, name);
    if (!t) return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' is missing", name);
    bool matrix = d1 != 0;
    uint32_t nd = matrix ? 2 : 1;
    if (t->n_dims != nd || t->dims[0] != d0 || (matrix && t->dims[1] != d1)) {
        char got[96];
        int k = snprintf(got, sizeof got, "%llu", (ull)t->dims[0]);
        for (uint32_t d = 1; d < t->n_dims && k > 0 && (size_t)k < sizeof got; d++)
            k += snprintf(got + k, sizeof got - (size_t)k, ", %llu", (ull)t->dims[d]);
        if (matrix)
            return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' (data at offset %llu) has dims (%s), the config "
                               "needs (%llu, %llu)", name, (ull)t->offset, got, (ull)d0, (ull)d1);
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' has dims (%s), the config needs (%llu)", name, got,
                           (ull)d0);
    }
    if (!engine_type(t->type, matrix))
        return llmem__fail(LLMEM_ENOTSUP, "gguf: tensor '%s' is %s; %s must be %s", name,
                           llmem_dtype_name(t->type), matrix ? "matrices" : "norm vectors and biases",
                           matrix ? "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0 or q2_k..q6_k" : "f32 or f16");
    if (matrix)
        for (size_t i = 0; i < N_MATRIX_TYPES; i++)
            if (matrix_types[i] == t->type) counts[i]++;
    return LLMEM_OK;
}

/* The arch general.architecture names, or LLMEM_ENOTSUP listing those known. */
static llmem_status find_arch(const llmem_model *m, const arch_info **out)
{
    const char *arch;
    size_t alen;
    if (!llmem__meta_find(m, "general.architecture"))
        return llmem__fail(LLMEM_EFORMAT, "gguf: no 'general.architecture' key");
    llmem_status st = llmem_model_meta_str(m, "general.architecture", &arch, &alen);
    if (st) return st;
    for (size_t i = 0; i < LLMEM_ARRAY_LEN(archs); i++)
        if (alen == strlen(archs[i].name) && memcmp(arch, archs[i].name, alen) == 0) {
            *out = &archs[i];
            return LLMEM_OK;
        }
    char a[64];
    llmem__show(a, sizeof a, arch, alen);
    return llmem__fail(LLMEM_ENOTSUP, "gguf: architecture '%s' not supported (llama or qwen2)", a);
}

/* Layer l's Q/K/V biases: required ones must be there, any there must be
 * 1-D of their projection's rows. *any set when one is present. The
 * attention output's bias (llama.cpp reads one for llama) is refused: the
 * engine does not add it, and ignoring it would be a wrong answer. */
static llmem_status want_biases(const llmem_model *m, const arch_info *a, uint32_t l, uint64_t qd, uint64_t kvd,
                                bool *any)
{
    static const char *const names[3] = {"attn_q", "attn_k", "attn_v"};
    const uint64_t rows[3] = {qd, kvd, kvd};
    char name[64];
    uint32_t counts[N_MATRIX_TYPES] = {0};
    for (int k = 0; k < 3; k++) {
        snprintf(name, sizeof name, "blk.%u.%s.bias", l, names[k]);
        if (!a->bias_required && !llmem__tensor_find(m, name)) continue;
        if (!llmem__tensor_find(m, name))
            return llmem__fail(LLMEM_EFORMAT, "gguf: %s tensor '%s' is missing (the architecture has Q/K/V biases)",
                               a->name, name);
        llmem_status st = want(m, name, rows[k], 0, counts);
        if (st) return st;
        *any = true;
    }
    snprintf(name, sizeof name, "blk.%u.attn_output.bias", l);
    if (llmem__tensor_find(m, name))
        return llmem__fail(LLMEM_ENOTSUP, "gguf: tensor '%s': an attention output bias is not supported", name);
    return LLMEM_OK;
}

/* Every tensor of model.h's table with the dims the config implies; the
 * matrices' types counted in counts[]. */
static llmem_status want_tensors(llmem_model *m, const arch_info *a, uint32_t layers, uint64_t hidden, uint64_t qd,
                                 uint64_t kvd, uint64_t ffn, uint32_t vocab, uint32_t *counts)
{
    llmem_status st;
    if ((st = want(m, "token_embd.weight", hidden, vocab, counts))) return st;
    char name[64];
    for (uint32_t l = 0; l < layers; l++) {
        static const struct {
            const char *suffix;
            int d0, d1; /* 0 hidden, 1 qd, 2 kvd, 3 ffn, -1 (d1 only) 1-D */
        } per_layer[] = {
            {"attn_norm", 0, -1}, {"attn_q", 0, 1}, {"attn_k", 0, 2}, {"attn_v", 0, 2}, {"attn_output", 1, 0},
            {"ffn_norm", 0, -1},  {"ffn_gate", 0, 3}, {"ffn_down", 3, 0}, {"ffn_up", 0, 3},
        };
        const uint64_t size_of[4] = {hidden, qd, kvd, ffn};
        for (size_t k = 0; k < LLMEM_ARRAY_LEN(per_layer); k++) {
            snprintf(name, sizeof name, "blk.%u.%s.weight", l, per_layer[k].suffix);
            uint64_t d1 = per_layer[k].d1 < 0 ? 0 : size_of[per_layer[k].d1];
            if ((st = want(m, name, size_of[per_layer[k].d0], d1, counts))) return st;
        }
        if ((st = want_biases(m, a, l, qd, kvd, &m->config.qkv_bias))) return st;
    }
    if ((st = want(m, "output_norm.weight", hidden, 0, counts))) return st;
    bool tied = llmem__tensor_find(m, "output.weight") == NULL;
    if (!tied && (st = want(m, "output.weight", hidden, vocab, counts))) return st;
    m->config.shape.tied_embeddings = tied;
    return LLMEM_OK;
}

/* The vocabulary size: ARCH.vocab_size, else token_embd's rows. */
static llmem_status vocab_size(const llmem_model *m, const arch_info *a, uint32_t *vocab)
{
    char key[96];
    llmem_status st;
    if (llmem__meta_find(m, arch_key(key, sizeof key, a, "vocab_size"))) {
        if ((st = llmem_model_meta_u32(m, key, vocab))) return st;
    } else {
        const llmem_tensor *e = llmem__tensor_find(m, "token_embd.weight");
        if (!e) return llmem__fail(LLMEM_EFORMAT, "gguf: tensor 'token_embd.weight' is missing");
        if (e->n_dims != 2 || e->dims[1] > UINT32_MAX)
            return llmem__fail(LLMEM_EFORMAT, "gguf: tensor 'token_embd.weight' must be 2-D (hidden, vocab)");
        *vocab = (uint32_t)e->dims[1];
    }
    if (*vocab == 0) return llmem__fail(LLMEM_EFORMAT, "gguf: vocabulary size 0");
    return LLMEM_OK;
}

static void model_name(const llmem_model *m, llmem_shape *s)
{
    const char *gname;
    size_t glen;
    if (llmem__meta_find(m, "general.name") && llmem_model_meta_str(m, "general.name", &gname, &glen) == LLMEM_OK &&
        glen) {
        size_t n = glen < sizeof s->name - 1 ? glen : sizeof s->name - 1;
        memcpy(s->name, gname, n);
        s->name[n] = '\0';
        if (strlen(s->name) == 0) snprintf(s->name, sizeof s->name, "gguf"); /* a name starting with NUL */
    } else {
        snprintf(s->name, sizeof s->name, "gguf");
    }
}

static llmem_status llama_config(llmem_model *m, uint32_t version)
{
    const arch_info *a = NULL;
    llmem_status st = find_arch(m, &a);
    if (st) return st;
    llmem_model_config *c = &m->config;
    llmem_shape *s = &c->shape;
    c->format = LLMEM_MODEL_GGUF;
    c->version = version;
    c->arch = a->arch;
    c->rope_style = a->rope;
    char key[96];
    uint32_t hidden, layers, ffn, heads, kv_heads, ctx, rope_dim, vocab, window;
#define K(suffix) arch_key(key, sizeof key, a, suffix)
    if ((st = need_u32(m, K("context_length"), true, 0, 1, &ctx))) return st;
    if ((st = need_u32(m, K("embedding_length"), true, 0, 1, &hidden))) return st;
    if ((st = need_u32(m, K("block_count"), true, 0, 1, &layers))) return st;
    if ((st = need_u32(m, K("feed_forward_length"), true, 0, 1, &ffn))) return st;
    if ((st = need_u32(m, K("attention.head_count"), true, 0, 1, &heads))) return st;
    if ((st = need_u32(m, K("attention.head_count_kv"), false, heads, 1, &kv_heads))) return st;
    if (hidden % heads)
        return llmem__fail(LLMEM_EFORMAT, "gguf: %s.attention.head_count %u does not divide %s.embedding_length %u",
                           a->name, heads, a->name, hidden);
    uint32_t head_dim = hidden / heads;
    if (kv_heads > heads || heads % kv_heads)
        return llmem__fail(LLMEM_EFORMAT, "gguf: %s.attention.head_count_kv %u does not divide head_count %u",
                           a->name, kv_heads, heads);
    if ((st = need_u32(m, K("rope.dimension_count"), false, head_dim, 2, &rope_dim))) return st;
    if (rope_dim > head_dim || rope_dim % 2)
        return llmem__fail(LLMEM_EFORMAT, "gguf: %s must be even and at most the head dimension %u (is %u)", key,
                           head_dim, rope_dim);
    float theta, eps;
    if ((st = need_f32(m, K("rope.freq_base"), 10000.0f, &theta))) return st;
    if ((st = need_f32(m, K("attention.layer_norm_rms_epsilon"), 1e-5f, &eps))) return st;
    if ((st = need_u32(m, K("attention.sliding_window"), false, 0, 0, &window))) return st;
#undef K
    if ((st = vocab_size(m, a, &vocab))) return st;

    uint32_t counts[N_MATRIX_TYPES] = {0};
    uint64_t qd = (uint64_t)heads * head_dim, kvd = (uint64_t)kv_heads * head_dim;
    if ((st = want_tensors(m, a, layers, hidden, qd, kvd, ffn, vocab, counts))) return st;

    size_t best = 0;
    for (size_t i = 1; i < N_MATRIX_TYPES; i++)
        if (counts[i] > counts[best]) best = i;
    c->weight_type = matrix_types[best];
    s->layers = layers;
    s->hidden = hidden;
    s->heads = heads;
    s->kv_heads = kv_heads;
    s->head_dim = head_dim;
    s->ffn = ffn;
    s->vocab = vocab;
    s->max_ctx = ctx;
    s->rope_theta = theta;
    c->rope_dim = rope_dim;
    c->norm_eps = eps;
    c->sliding_window = window;
    model_name(m, s);
    return LLMEM_OK;
}

/* ---- the parser ---------------------------------------------------------- */

llmem_status llmem__gguf_parse(llmem_model *m)
{
    rd r = {m->base, m->size, 0};
    if (m->size < 24)
        return llmem__fail(LLMEM_EFORMAT, "gguf: file too short for the 24-byte header (%zu bytes)", m->size);
    uint32_t version = ld32(m->base + 4);
    if (version == 1) return llmem__fail(LLMEM_EFORMAT, "gguf: version 1 not supported (offset 4; only 2 and 3)");
    if (version != 2 && version != 3)
        return llmem__fail(LLMEM_EFORMAT, "gguf: unknown version %u at offset 4 (only 2 and 3)", version);
    uint64_t n_tensors = ld64(m->base + 8), n_kv = ld64(m->base + 16);
    r.at = 24;
    /* Bound both counts by the bytes they need before anything is sized. */
    if (n_kv > left(&r) / MIN_KV_BYTES)
        return llmem__fail(LLMEM_EFORMAT, "gguf: metadata count %llu at offset 16 exceeds what the file (%zu bytes) "
                           "can hold", (ull)n_kv, m->size);
    if (n_tensors > left(&r) / MIN_TENSOR_INFO_BYTES ||
        n_kv * MIN_KV_BYTES > left(&r) - n_tensors * MIN_TENSOR_INFO_BYTES)
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor count %llu at offset 8 exceeds what the file (%zu bytes) "
                           "can hold", (ull)n_tensors, m->size);

    /* Tables grow by doubling as entries parse: allocation follows bytes
     * actually read, never a count alone. */
    size_t cap = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        if (m->n_meta == cap) {
            cap = cap ? cap * 2 : 32;
            llmem__meta *nm = realloc(m->meta, cap * sizeof *nm);
            if (!nm) return llmem__fail(LLMEM_ENOMEM, "gguf: out of memory for metadata");
            m->meta = nm;
        }
        llmem__meta *e = &m->meta[m->n_meta++];
        memset(e, 0, sizeof *e);
        llmem_status st = parse_kv(&r, e);
        if (st) return st;
    }
    m->meta_end = r.at;
    llmem_status st = llmem__meta_index_build(m);
    if (st) return st;

    uint32_t alignment = DEFAULT_ALIGNMENT;
    if (llmem__meta_find(m, "general.alignment") && (st = llmem_model_meta_u32(m, "general.alignment", &alignment)))
        return st;
    /* The GGUF specification: "it must be a multiple of 8"; ggml's reader
     * also requires a power of two. Below 8, tensor data could start at any
     * byte and the kernels would load misaligned floats. */
    if (!llmem__is_pow2(alignment) || alignment < 8)
        return llmem__fail(LLMEM_EFORMAT,
                           "gguf: general.alignment %u (offset %llu) is not a power of two of at least 8 (the GGUF "
                           "specification: a multiple of 8; the default is 32)",
                           alignment, (ull)llmem__meta_find(m, "general.alignment")->offset);

    name_ref *refs = NULL;
    cap = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (m->n_tensors == cap) {
            cap = cap ? cap * 2 : 64;
            llmem_tensor *nt = realloc(m->tensors, cap * sizeof *nt);
            if (nt) m->tensors = nt;
            name_ref *nr = nt ? realloc(refs, cap * sizeof *nr) : NULL;
            if (!nr) {
                free(refs);
                return llmem__fail(LLMEM_ENOMEM, "gguf: out of memory for tensor infos");
            }
            refs = nr;
        }
        llmem_tensor *t = &m->tensors[m->n_tensors];
        memset(t, 0, sizeof *t);
        if ((st = parse_tensor_info(&r, i, alignment, t, &refs[m->n_tensors]))) {
            free(refs);
            return st;
        }
        m->n_tensors++;
    }

    /* Names: copied out, NUL-terminated, in one block. The sum is bounded
     * by the file size. */
    size_t total = 0;
    for (size_t i = 0; i < m->n_tensors; i++) total += (size_t)refs[i].len + 1;
    m->names = malloc(total ? total : 1);
    if (!m->names) {
        free(refs);
        return llmem__fail(LLMEM_ENOMEM, "gguf: out of memory for tensor names");
    }
    char *p = m->names;
    for (size_t i = 0; i < m->n_tensors; i++) {
        memcpy(p, m->base + refs[i].at, (size_t)refs[i].len);
        p[refs[i].len] = '\0';
        m->tensors[i].name = p;
        p += refs[i].len + 1;
    }
    free(refs);
    if ((st = llmem__tensor_index_build(m, "gguf"))) return st;

    /* Data: from the aligned end of the infos; every tensor inside the file. */
    size_t data_start;
    if (!llmem__align_up((size_t)r.at, alignment, &data_start) || (m->n_tensors && data_start > m->size))
        return llmem__fail(LLMEM_EFORMAT, "gguf: tensor data would start past the end of the file (infos end at "
                           "%llu, alignment %u, file %zu bytes)", (ull)r.at, alignment, m->size);
    for (size_t i = 0; i < m->n_tensors; i++) {
        llmem_tensor *t = &m->tensors[i];
        uint64_t at;
        if (__builtin_add_overflow((uint64_t)data_start, t->offset, &at) || at > m->size ||
            t->bytes > m->size - at) {
            char nm[64];
            llmem__show(nm, sizeof nm, t->name, strlen(t->name));
            if (__builtin_add_overflow((uint64_t)data_start, t->offset, &at))
                return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' data offset %llu overflows", nm, (ull)t->offset);
            return llmem__fail(LLMEM_EFORMAT, "gguf: tensor '%s' data [%llu, +%llu) runs past the end of the file "
                               "(%zu bytes; offset %llu)", nm, (ull)at, (ull)t->bytes, m->size, (ull)t->offset);
        }
        t->offset = at;
        t->data = m->base + at;
    }
    if ((st = check_overlaps(m))) return st;
    return llama_config(m, version);
}

/* ---- metadata getters ---------------------------------------------------- */

static llmem_status find(const llmem_model *m, const char *key, const llmem__meta **out)
{
    if (!m || !key) return llmem__fail(LLMEM_EINVAL, "model: null argument");
    *out = llmem__meta_find(m, key);
    if (*out) return LLMEM_OK;
    char k[64];
    llmem__show(k, sizeof k, key, strlen(key));
    return llmem__fail(LLMEM_ENOTFOUND, "model: no metadata key '%s'%s", k,
                       m->config.format == LLMEM_MODEL_LLAMA2C ? " (llama2.c files have no metadata)" : "");
}

/* Fail with "gguf: metadata '<key>'" followed by fmt's text: how every
 * complaint about an entry's value starts. */
static llmem_status meta_fail(llmem_status st, const llmem__meta *e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static llmem_status meta_fail(llmem_status st, const llmem__meta *e, const char *fmt, ...)
{
    char k[64], rest[256];
    llmem__show(k, sizeof k, e->key, e->key_len);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rest, sizeof rest, fmt, ap);
    va_end(ap);
    return llmem__fail(st, "gguf: metadata '%s'%s", k, rest);
}

static llmem_status mismatch(const llmem__meta *e, const char *want)
{
    return meta_fail(LLMEM_EFORMAT, e, " (offset %llu) is %s, not %s", (ull)e->offset, meta_type_name(e->type), want);
}

/* find, then the caller's out arguments (have_out: all non-null). */
static llmem_status lookup(const llmem_model *m, const char *key, bool have_out, const llmem__meta **out)
{
    llmem_status st = find(m, key, out);
    if (!st && !have_out) st = llmem__fail(LLMEM_EINVAL, "model: null argument");
    return st;
}

/* An integer of type t at p as sign and magnitude; false if t is not one. */
static bool read_int(const uint8_t *p, uint32_t t, bool *neg, uint64_t *mag)
{
    int64_t s;
    switch (t) {
    case LLMEM_META_U8: *neg = false; *mag = p[0]; return true;
    case LLMEM_META_U16: { uint16_t v; memcpy(&v, p, 2); *neg = false; *mag = v; return true; }
    case LLMEM_META_U32: *neg = false; *mag = ld32(p); return true;
    case LLMEM_META_U64: *neg = false; *mag = ld64(p); return true;
    case LLMEM_META_I8: { int8_t v; memcpy(&v, p, 1); s = v; break; }
    case LLMEM_META_I16: { int16_t v; memcpy(&v, p, 2); s = v; break; }
    case LLMEM_META_I32: { int32_t v; memcpy(&v, p, 4); s = v; break; }
    case LLMEM_META_I64: { memcpy(&s, p, 8); break; }
    default: return false;
    }
    *neg = s < 0;
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return true;
}

llmem_status llmem_model_meta_bool(const llmem_model *m, const char *key, bool *out)
{
    const llmem__meta *e;
    llmem_status st = lookup(m, key, out != NULL, &e);
    if (st) return st;
    if (e->type != LLMEM_META_BOOL) return mismatch(e, "a bool");
    *out = m->base[e->value] != 0;
    return LLMEM_OK;
}

llmem_status llmem_model_meta_u32(const llmem_model *m, const char *key, uint32_t *out)
{
    const llmem__meta *e;
    llmem_status st = lookup(m, key, out != NULL, &e);
    if (st) return st;
    bool neg;
    uint64_t mag;
    if (!read_int(m->base + e->value, e->type, &neg, &mag)) return mismatch(e, "an integer");
    if (neg || mag > UINT32_MAX) {
        return meta_fail(LLMEM_EFORMAT, e, " (offset %llu): %s%llu does not fit a u32", (ull)e->offset,
                         neg ? "-" : "", (ull)mag);
    }
    *out = (uint32_t)mag;
    return LLMEM_OK;
}

llmem_status llmem_model_meta_f32(const llmem_model *m, const char *key, float *out)
{
    const llmem__meta *e;
    llmem_status st = lookup(m, key, out != NULL, &e);
    if (st) return st;
    if (e->type == LLMEM_META_F32) {
        memcpy(out, m->base + e->value, 4);
        return LLMEM_OK;
    }
    if (e->type == LLMEM_META_F64) {
        double d;
        memcpy(&d, m->base + e->value, 8);
        if (isfinite(d) && fabs(d) > FLT_MAX) {
            return meta_fail(LLMEM_EFORMAT, e, " (offset %llu): f64 %g does not fit an f32", (ull)e->offset, d);
        }
        *out = (float)d;
        return LLMEM_OK;
    }
    return mismatch(e, "f32");
}

llmem_status llmem_model_meta_str(const llmem_model *m, const char *key, const char **s, size_t *len)
{
    const llmem__meta *e;
    llmem_status st = lookup(m, key, s && len, &e);
    if (st) return st;
    if (e->type != LLMEM_META_STRING) return mismatch(e, "a string");
    *len = (size_t)ld64(m->base + e->value);
    *s = (const char *)m->base + e->value + 8;
    return LLMEM_OK;
}

llmem_status llmem_model_meta_array(const llmem_model *m, const char *key, llmem_meta_array *out)
{
    const llmem__meta *e;
    llmem_status st = lookup(m, key, out != NULL, &e);
    if (st) return st;
    if (e->type != LLMEM_META_ARRAY) return mismatch(e, "an array");
    out->type = (llmem_meta_type)e->elem_type;
    out->count = e->count;
    return LLMEM_OK;
}

/* The array entry for key with element i in range, then the caller's out
 * arguments (have_out: all non-null). */
static llmem_status array_elem(const llmem_model *m, const char *key, uint64_t i, bool have_out,
                               const llmem__meta **out)
{
    llmem_status st = find(m, key, out);
    if (st) return st;
    const llmem__meta *e = *out;
    if (e->type != LLMEM_META_ARRAY) return mismatch(e, "an array");
    if (i >= e->count)
        return meta_fail(LLMEM_ERANGE, e, ": index %llu out of range (%llu elements)", (ull)i, (ull)e->count);
    if (!have_out) return llmem__fail(LLMEM_EINVAL, "model: null argument");
    return LLMEM_OK;
}

llmem_status llmem_model_meta_array_str(const llmem_model *m, const char *key, uint64_t i, const char **s, size_t *len)
{
    const llmem__meta *e;
    llmem_status st = array_elem(m, key, i, s && len, &e);
    if (st) return st;
    if (e->elem_type != LLMEM_META_STRING)
        return meta_fail(LLMEM_EFORMAT, e, " (offset %llu) is an array of %s, not of strings", (ull)e->offset,
                         meta_type_name(e->elem_type));
    *len = (size_t)ld64(m->base + e->str_off[i]);
    *s = (const char *)m->base + e->str_off[i] + 8;
    return LLMEM_OK;
}

llmem_status llmem_model_meta_array_num(const llmem_model *m, const char *key, uint64_t i, double *out)
{
    const llmem__meta *e;
    llmem_status st = array_elem(m, key, i, out != NULL, &e);
    if (st) return st;
    uint32_t sz = scalar_size(e->elem_type);
    if (!sz)
        return meta_fail(LLMEM_EFORMAT, e, " (offset %llu) is an array of %s, not of numbers", (ull)e->offset,
                         meta_type_name(e->elem_type));
    const uint8_t *p = m->base + e->value + i * sz;
    bool neg;
    uint64_t mag;
    if (read_int(p, e->elem_type, &neg, &mag)) {
        *out = neg ? -(double)mag : (double)mag;
    } else if (e->elem_type == LLMEM_META_F32) {
        float f;
        memcpy(&f, p, 4);
        *out = f;
    } else if (e->elem_type == LLMEM_META_F64) {
        memcpy(out, p, 8);
    } else { /* bool */
        *out = p[0] ? 1.0 : 0.0;
    }
    return LLMEM_OK;
}
