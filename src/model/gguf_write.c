/*
 * gguf_write.c - a GGUF v3 writer for `llmem synth` and the tests.
 *
 * What it writes (see gguf.c for the format): the header, the metadata in
 * the order added (serialized as each key is added), the tensor infos with
 * data offsets aligned to 32 (GGUF's default alignment, so no
 * general.alignment key is needed), padding to 32, then each tensor's data
 * and its padding. Tensor data comes from a fill callback into one buffer
 * sized for the largest tensor and reused, so a model is never whole in
 * memory.
 *
 * The file is written through an outfile (llmem/outfile.h: a temporary
 * file created exclusively beside PATH, renamed over it only after every
 * write, the fsync and the close succeeded; a PATH that exists and is not
 * a regular file is refused); on any failure the temporary file is removed
 * and PATH is untouched. Every input is checked when added (a bad
 * one is refused with a status and leaves the writer as it was), so write
 * only fails on I/O, memory or a fill callback.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmem/outfile.h"
#include "model_internal.h"

#define WRITE_ALIGN 32u
#define MAX_NAME 63u                     /* ggml's GGML_MAX_NAME is 64 with the NUL */
#define PROGRESS_MIN_BYTES 100000000ull  /* progress lines only for files over 100 MB */

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t dims[4];
    uint64_t bytes;
    uint64_t offset;   /* in the data section, set by write */
    llmem_gguf_fill_fn fill;
    void *ctx;
} wtensor;

struct llmem_gguf_writer {
    uint8_t *kv;       /* serialized key/values, in order added */
    size_t kv_len, kv_cap;
    char **keys;       /* n_kv copies, to refuse duplicates */
    size_t n_kv, keys_cap;
    wtensor *t;
    size_t n_t, t_cap;
};

llmem_status llmem_gguf_writer_create(llmem_gguf_writer **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "gguf writer: null argument");
    *out = calloc(1, sizeof **out);
    return *out ? LLMEM_OK : llmem__fail(LLMEM_ENOMEM, "gguf writer: out of memory");
}

void llmem_gguf_writer_destroy(llmem_gguf_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->keys);
    free(w->t);
    free(w->kv);
    free(w);
}

/* ---- metadata ------------------------------------------------------------ */

static bool put(llmem_gguf_writer *w, const void *p, size_t n)
{
    if (w->kv_cap - w->kv_len < n) {
        size_t cap = w->kv_cap ? w->kv_cap : 256;
        while (cap - w->kv_len < n) {
            if (cap > SIZE_MAX / 2) return false;
            cap *= 2;
        }
        uint8_t *nk = realloc(w->kv, cap);
        if (!nk) return false;
        w->kv = nk;
        w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return true;
}

static bool put_u32(llmem_gguf_writer *w, uint32_t v) { return put(w, &v, 4); }
static bool put_u64(llmem_gguf_writer *w, uint64_t v) { return put(w, &v, 8); }
static bool put_str(llmem_gguf_writer *w, const char *s, size_t n) { return put_u64(w, n) && put(w, s, n); }

/* Begin a key/value: check the key, record it, write key and type. On
 * failure nothing is recorded. *mark is where the entry starts, for end(). */
static llmem_status begin(llmem_gguf_writer *w, const char *key, uint32_t type, size_t *mark)
{
    if (!w || !key) return llmem__fail(LLMEM_EINVAL, "gguf writer: null argument");
    if (!key[0]) return llmem__fail(LLMEM_EINVAL, "gguf writer: empty metadata key");
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return llmem__fail(LLMEM_EINVAL, "gguf writer: duplicate key '%s'", key);
    if (w->n_kv == w->keys_cap) {
        size_t cap = w->keys_cap ? w->keys_cap * 2 : 16;
        char **nk = realloc(w->keys, cap * sizeof *nk);
        if (!nk) return llmem__fail(LLMEM_ENOMEM, "gguf writer: out of memory");
        w->keys = nk;
        w->keys_cap = cap;
    }
    *mark = w->kv_len;
    if (!put_str(w, key, strlen(key)) || !put_u32(w, type)) {
        w->kv_len = *mark;
        return llmem__fail(LLMEM_ENOMEM, "gguf writer: out of memory");
    }
    return LLMEM_OK;
}

/* Finish the entry begun at mark: ok false rolls it back (out of memory). */
static llmem_status end(llmem_gguf_writer *w, const char *key, size_t mark, bool ok)
{
    char *copy = ok ? strdup(key) : NULL;
    if (!copy) {
        w->kv_len = mark;
        return llmem__fail(LLMEM_ENOMEM, "gguf writer: out of memory");
    }
    w->keys[w->n_kv++] = copy;
    return LLMEM_OK;
}

llmem_status llmem_gguf_add_u32(llmem_gguf_writer *w, const char *key, uint32_t v)
{
    size_t mark;
    llmem_status st = begin(w, key, LLMEM_META_U32, &mark);
    return st ? st : end(w, key, mark, put_u32(w, v));
}

llmem_status llmem_gguf_add_bool(llmem_gguf_writer *w, const char *key, bool v)
{
    size_t mark;
    uint8_t b = v ? 1 : 0;
    llmem_status st = begin(w, key, LLMEM_META_BOOL, &mark);
    return st ? st : end(w, key, mark, put(w, &b, 1));
}

llmem_status llmem_gguf_add_f32(llmem_gguf_writer *w, const char *key, float v)
{
    size_t mark;
    llmem_status st = begin(w, key, LLMEM_META_F32, &mark);
    return st ? st : end(w, key, mark, put(w, &v, 4));
}

llmem_status llmem_gguf_add_str(llmem_gguf_writer *w, const char *key, const char *v)
{
    if (!v) return llmem__fail(LLMEM_EINVAL, "gguf writer: null string for '%s'", key ? key : "(null)");
    size_t mark;
    llmem_status st = begin(w, key, LLMEM_META_STRING, &mark);
    return st ? st : end(w, key, mark, put_str(w, v, strlen(v)));
}

llmem_status llmem_gguf_add_str_array(llmem_gguf_writer *w, const char *key, const char *const *v, size_t n)
{
    if (n && !v) return llmem__fail(LLMEM_EINVAL, "gguf writer: null array for '%s'", key ? key : "(null)");
    for (size_t i = 0; i < n; i++)
        if (!v[i]) return llmem__fail(LLMEM_EINVAL, "gguf writer: string %zu of '%s' is null", i, key ? key : "(null)");
    size_t mark;
    llmem_status st = begin(w, key, LLMEM_META_ARRAY, &mark);
    if (st) return st;
    bool ok = put_u32(w, LLMEM_META_STRING) && put_u64(w, n);
    for (size_t i = 0; ok && i < n; i++) ok = put_str(w, v[i], strlen(v[i]));
    return end(w, key, mark, ok);
}

static llmem_status add_num_array(llmem_gguf_writer *w, const char *key, uint32_t type, const void *v, size_t n)
{
    if (n && !v) return llmem__fail(LLMEM_EINVAL, "gguf writer: null array for '%s'", key ? key : "(null)");
    if (n > SIZE_MAX / 4) return llmem__fail(LLMEM_EOVERFLOW, "gguf writer: array '%s' too long", key ? key : "(null)");
    size_t mark;
    llmem_status st = begin(w, key, LLMEM_META_ARRAY, &mark);
    if (st) return st;
    return end(w, key, mark, put_u32(w, type) && put_u64(w, n) && (n == 0 || put(w, v, n * 4)));
}

llmem_status llmem_gguf_add_f32_array(llmem_gguf_writer *w, const char *key, const float *v, size_t n)
{
    return add_num_array(w, key, LLMEM_META_F32, v, n);
}

llmem_status llmem_gguf_add_i32_array(llmem_gguf_writer *w, const char *key, const int32_t *v, size_t n)
{
    return add_num_array(w, key, LLMEM_META_I32, v, n);
}

llmem_status llmem__gguf_add_raw(llmem_gguf_writer *w, const char *key, size_t key_len, const void *bytes, size_t len)
{
    if (!w || !key || !bytes) return llmem__fail(LLMEM_EINVAL, "gguf writer: null argument");
    char *k = malloc(key_len + 1);
    if (!k) return llmem__fail(LLMEM_ENOMEM, "gguf writer: out of memory");
    memcpy(k, key, key_len);
    k[key_len] = 0;
    if (strlen(k) != key_len) {
        free(k);
        return llmem__fail(LLMEM_EINVAL, "gguf writer: a metadata key with a NUL byte");
    }
    size_t mark;
    llmem_status st = begin(w, k, 0, &mark);
    if (st) {
        free(k);
        return st;
    }
    w->kv_len = mark; /* begin wrote the key and a type: the raw bytes carry both */
    st = end(w, k, mark, put(w, bytes, len));
    free(k);
    return st;
}

/* ---- tensors ------------------------------------------------------------- */

llmem_status llmem_gguf_add_tensor(llmem_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                   const uint64_t *dims, llmem_gguf_fill_fn fill, void *ctx)
{
    if (!w || !name || !dims || !fill) return llmem__fail(LLMEM_EINVAL, "gguf writer: null argument");
    size_t len = strlen(name);
    if (len == 0 || len > MAX_NAME)
        return llmem__fail(LLMEM_EINVAL, "gguf writer: tensor name '%s' must be 1..%u bytes", name, MAX_NAME);
    if (n_dims < 1 || n_dims > 4)
        return llmem__fail(LLMEM_EINVAL, "gguf writer: tensor '%s': n_dims %u must be 1..4", name, n_dims);
    uint32_t block = llmem__dtype_block(type);
    if (!block) return llmem__fail(LLMEM_EINVAL, "gguf writer: tensor '%s': unknown type %u", name, type);
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (!dims[d]) return llmem__fail(LLMEM_EINVAL, "gguf writer: tensor '%s': dim %u is 0", name, d);
        if (__builtin_mul_overflow(n, dims[d], &n) || n > (uint64_t)INT64_MAX)
            return llmem__fail(LLMEM_EOVERFLOW, "gguf writer: tensor '%s': element count overflows", name);
    }
    if (dims[0] % block)
        return llmem__fail(LLMEM_EINVAL, "gguf writer: tensor '%s': rows of %llu are not whole %s blocks of %u", name,
                           (unsigned long long)dims[0], llmem_dtype_name(type), block);
    uint64_t bytes = llmem_dtype_bytes(type, n);
    if (!bytes || bytes > SIZE_MAX - WRITE_ALIGN)
        return llmem__fail(LLMEM_EOVERFLOW, "gguf writer: tensor '%s': byte size overflows", name);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return llmem__fail(LLMEM_EINVAL, "gguf writer: duplicate tensor '%s'", name);
    if (w->n_t == w->t_cap) {
        size_t cap = w->t_cap ? w->t_cap * 2 : 64;
        wtensor *nt = realloc(w->t, cap * sizeof *nt);
        if (!nt) return llmem__fail(LLMEM_ENOMEM, "gguf writer: out of memory");
        w->t = nt;
        w->t_cap = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return llmem__fail(LLMEM_ENOMEM, "gguf writer: out of memory");
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < 4; d++) t->dims[d] = d < n_dims ? dims[d] : 1;
    t->bytes = bytes;
    t->fill = fill;
    t->ctx = ctx;
    w->n_t++;
    return LLMEM_OK;
}

/* ---- writing ------------------------------------------------------------- */

typedef struct out {
    FILE *f;
    const char *tmp;
    uint64_t pos;
    llmem_status st;   /* first failure; later writes do nothing */
} out;

static void emit(out *o, const void *p, size_t n)
{
    if (o->st || !n) return;
    errno = 0;
    if (fwrite(p, 1, n, o->f) != n) {
        o->st = llmem__fail(LLMEM_EIO, "gguf writer: writing '%s' failed: %s", o->tmp,
                            strerror(errno ? errno : EIO));
        return;
    }
    o->pos += n;
}

static void emit_u32(out *o, uint32_t v) { emit(o, &v, 4); }
static void emit_u64(out *o, uint64_t v) { emit(o, &v, 8); }

static void pad(out *o)
{
    static const uint8_t zeros[WRITE_ALIGN];
    emit(o, zeros, (WRITE_ALIGN - o->pos % WRITE_ALIGN) % WRITE_ALIGN);
}

llmem_status llmem_gguf_write(llmem_gguf_writer *w, const char *path, bool progress)
{
    if (!w || !path) return llmem__fail(LLMEM_EINVAL, "gguf writer: null argument");
    /* Lay the data out first: offsets, total and the largest tensor. */
    uint64_t data = 0, largest = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = data;
        if (__builtin_add_overflow(data, w->t[i].bytes + (WRITE_ALIGN - 1), &data))
            return llmem__fail(LLMEM_EOVERFLOW, "gguf writer: total size overflows");
        data &= ~(uint64_t)(WRITE_ALIGN - 1);
        if (w->t[i].bytes > largest) largest = w->t[i].bytes;
    }
    uint8_t *buf = malloc(largest ? (size_t)largest : 1);
    if (!buf)
        return llmem__fail(LLMEM_ENOMEM, "gguf writer: out of memory for a %llu-byte tensor buffer",
                           (unsigned long long)largest);
    llmem_outfile *of;
    if (llmem_outfile_open(path, &of)) {
        free(buf);
        return llmem__fail_prefix("gguf writer");
    }
    out o = {llmem_outfile_stream(of), path, 0, LLMEM_OK};
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;

    emit(&o, "GGUF", 4);
    emit_u32(&o, 3);
    emit_u64(&o, w->n_t);
    emit_u64(&o, w->n_kv);
    emit(&o, w->kv, w->kv_len);
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        emit_u64(&o, strlen(t->name));
        emit(&o, t->name, strlen(t->name));
        emit_u32(&o, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) emit_u64(&o, t->dims[d]);
        emit_u32(&o, t->type);
        emit_u64(&o, t->offset);
    }
    pad(&o);
    uint64_t total = o.pos + data;
    bool show = progress && total > PROGRESS_MIN_BYTES && isatty(2);
    int shown = -1;
    for (size_t i = 0; i < w->n_t && !o.st; i++) {
        const wtensor *t = &w->t[i];
        uint64_t seq = llmem__error_seq();
        llmem_status st = t->fill(t->ctx, i, buf, (size_t)t->bytes);
        if (st) {
            o.st = llmem__error_seq() != seq ? st
                                             : llmem__fail(st, "gguf writer: filling tensor '%s' (index %zu) failed: %s",
                                                           t->name, i, llmem_status_name(st));
            break;
        }
        emit(&o, buf, (size_t)t->bytes);
        pad(&o);
        int pct = (int)((double)o.pos * 100.0 / (double)total);
        if (show && pct != shown) /* one line per percent, not per tensor */
            fprintf(stderr, "\rwriting %s: %3d%% (%.1f of %.1f GB)", base, shown = pct, (double)o.pos / 1e9,
                    (double)total / 1e9);
    }
    if (show) fputc('\n', stderr);
    free(buf);
    if (o.st) {
        llmem_outfile_abort(of);
        return o.st;
    }
    if (llmem_outfile_commit(of)) return llmem__fail_prefix("gguf writer");
    return LLMEM_OK;
}
