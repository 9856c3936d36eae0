/*
 * model.c - model files mapped, not copied: open, map, hints, lookups, stats.
 *
 * Opening a file: open(2) without blocking (O_NONBLOCK; a FIFO or device
 * is refused, file.c), fstat, one read-only mmap of the whole file (the
 * descriptor is closed right after), then the parser the magic names
 * (gguf.c for "GGUF", llama2c.c otherwise) checks every byte it will ever
 * hand out and builds the tables. Only a model that passed is given the
 * optional hints (madvise SEQUENTIAL + WILLNEED over the tensor data,
 * MADV_HUGEPAGE over the 2 MiB-aligned interior), populated with a progress
 * line when asked, and mlocked; any failure unmaps and frees everything, so
 * nothing stays mapped or open. Memory models (open_memory) parse the
 * caller's bytes in place and take no hints.
 *
 * Lookups by name go through an open-addressing hash index (FNV-1a, linear
 * probing, load <= 1/2): models have a few hundred tensors and tokenizers
 * read metadata keys by name, so both are O(1).
 *
 * Invariants of an open model: every tensor's [data, data + bytes) lies in
 * [base, base + size) and no two tensors overlap; names are unique and
 * NUL-terminated; the config agrees with the tensors' dims.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_internal.h"
#include "model_release.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14; older kernels say EINVAL and we touch pages instead */
#endif

#define GGUF_MAGIC 0x46554747u           /* "GGUF" read as a little-endian u32 */
#define PROGRESS_MIN_BYTES 100000000ull  /* progress lines only for files over 100 MB */
#define HUGE_2M ((uintptr_t)2 << 20)

/* ---- element types ------------------------------------------------------ */

static const struct {
    uint32_t type;
    const char *name;
    uint32_t block;        /* elements per block */
    uint32_t block_bytes;  /* bytes per block */
} dtypes[] = {
    {LLMEM_DTYPE_F32, "f32", 1, 4},
    {LLMEM_DTYPE_F16, "f16", 1, 2},
    {LLMEM_DTYPE_Q4_0, "q4_0", 32, 18},
    {LLMEM_DTYPE_Q4_1, "q4_1", 32, 20},
    {LLMEM_DTYPE_Q5_0, "q5_0", 32, 22},
    {LLMEM_DTYPE_Q5_1, "q5_1", 32, 24},
    {LLMEM_DTYPE_Q8_0, "q8_0", 32, 34},
    {LLMEM_DTYPE_Q2_K, "q2_k", 256, 84},
    {LLMEM_DTYPE_Q3_K, "q3_k", 256, 110},
    {LLMEM_DTYPE_Q4_K, "q4_k", 256, 144},
    {LLMEM_DTYPE_Q5_K, "q5_k", 256, 176},
    {LLMEM_DTYPE_Q6_K, "q6_k", 256, 210},
    {LLMEM_DTYPE_BF16, "bf16", 1, 2},
};

static int dtype_find(uint32_t type)
{
    for (size_t i = 0; i < LLMEM_ARRAY_LEN(dtypes); i++)
        if (dtypes[i].type == type) return (int)i;
    return -1;
}

const char *llmem_dtype_name(uint32_t type)
{
    int i = dtype_find(type);
    return i < 0 ? "?" : dtypes[i].name;
}

uint32_t llmem__dtype_block(uint32_t type)
{
    int i = dtype_find(type);
    return i < 0 ? 0 : dtypes[i].block;
}

uint64_t llmem_dtype_bytes(uint32_t type, uint64_t n)
{
    int i = dtype_find(type);
    if (i < 0 || n % dtypes[i].block) return 0;
    uint64_t r;
    if (__builtin_mul_overflow(n / dtypes[i].block, (uint64_t)dtypes[i].block_bytes, &r)) return 0;
    return r;
}

/* ---- name indexes ------------------------------------------------------- */

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

typedef void (*key_fn)(const llmem_model *m, size_t i, const char **key, size_t *len);

static void tensor_key(const llmem_model *m, size_t i, const char **key, size_t *len)
{
    *key = m->tensors[i].name;
    *len = strlen(*key);
}

static void meta_key(const llmem_model *m, size_t i, const char **key, size_t *len)
{
    *key = m->meta[i].key;
    *len = (size_t)m->meta[i].key_len;
}

/* Build ix over n entries. LLMEM_OK, or LLMEM_ENOMEM (message set), or
 * LLMEM_EFORMAT with *dup the position of the second of two equal keys (no
 * message: the caller names it). */
static llmem_status index_build(const llmem_model *m, llmem__index *ix, size_t n, key_fn key, size_t *dup)
{
    size_t cap = llmem__next_pow2(n < 8 ? 16 : n * 2);
    ix->slots = calloc(cap, sizeof *ix->slots);
    if (!ix->slots) return llmem__fail(LLMEM_ENOMEM, "model: out of memory for an index of %zu names", n);
    ix->mask = cap - 1;
    for (size_t i = 0; i < n; i++) {
        const char *k;
        size_t len;
        key(m, i, &k, &len);
        size_t s = (size_t)fnv1a(k, len) & ix->mask;
        for (; ix->slots[s]; s = (s + 1) & ix->mask) {
            const char *k2;
            size_t len2;
            key(m, ix->slots[s] - 1, &k2, &len2);
            if (len == len2 && memcmp(k, k2, len) == 0) {
                *dup = i;
                return LLMEM_EFORMAT;
            }
        }
        ix->slots[s] = i + 1;
    }
    return LLMEM_OK;
}

static size_t index_find(const llmem_model *m, const llmem__index *ix, key_fn key, const char *name)
{
    if (!ix->slots) return SIZE_MAX;
    size_t len = strlen(name);
    for (size_t s = (size_t)fnv1a(name, len) & ix->mask; ix->slots[s]; s = (s + 1) & ix->mask) {
        const char *k;
        size_t klen;
        key(m, ix->slots[s] - 1, &k, &klen);
        if (klen == len && memcmp(k, name, len) == 0) return ix->slots[s] - 1;
    }
    return SIZE_MAX;
}

void llmem__show(char *dst, size_t cap, const char *s, uint64_t n)
{
    size_t max = cap - 4 < 48 ? cap - 4 : 48, k = n < max ? (size_t)n : max, i;
    for (i = 0; i < k; i++) dst[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    if (n > k) dst[i++] = '.', dst[i++] = '.', dst[i++] = '.';
    dst[i] = '\0';
}

llmem_status llmem__tensor_index_build(llmem_model *m, const char *who)
{
    size_t dup = 0;
    llmem_status st = index_build(m, &m->tensor_index, m->n_tensors, tensor_key, &dup);
    if (st == LLMEM_EFORMAT) {
        char nm[64];
        llmem__show(nm, sizeof nm, m->tensors[dup].name, strlen(m->tensors[dup].name));
        return llmem__fail(LLMEM_EFORMAT, "%s: duplicate tensor name '%s' (tensor %zu)", who, nm, dup);
    }
    return st;
}

llmem_status llmem__meta_index_build(llmem_model *m)
{
    size_t dup = 0;
    llmem_status st = index_build(m, &m->meta_index, m->n_meta, meta_key, &dup);
    if (st == LLMEM_EFORMAT) {
        char k[64];
        llmem__show(k, sizeof k, m->meta[dup].key, m->meta[dup].key_len);
        return llmem__fail(LLMEM_EFORMAT, "gguf: duplicate metadata key '%s' at offset %llu", k,
                           (unsigned long long)m->meta[dup].offset);
    }
    return st;
}

const llmem_tensor *llmem__tensor_find(const llmem_model *m, const char *name)
{
    size_t i = index_find(m, &m->tensor_index, tensor_key, name);
    if (i == SIZE_MAX) return NULL;
    /* Every tensor's bytes lie in the model's (checked at open). */
    llmem__assert((const uint8_t *)m->tensors[i].data >= m->base &&
                  m->tensors[i].bytes <= m->size - (size_t)((const uint8_t *)m->tensors[i].data - m->base));
    return &m->tensors[i];
}

const llmem__meta *llmem__meta_find(const llmem_model *m, const char *key)
{
    size_t i = index_find(m, &m->meta_index, meta_key, key);
    return i == SIZE_MAX ? NULL : &m->meta[i];
}

/* ---- open and close ----------------------------------------------------- */

llmem_model_options llmem_model_options_default(void)
{
    llmem_model_options o;
    memset(&o, 0, sizeof o);
    return o;
}

static void model_free(llmem_model *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->n_meta; i++) free(m->meta[i].str_off);
    free(m->meta);
    free(m->meta_index.slots);
    free(m->tensors);
    free(m->names);
    free(m->tensor_index.slots);
    if (m->map) munmap(m->map, m->size);
    free(m->path);
    free(m);
}

/* options.copy: the whole file read into private anonymous memory, so no
 * later change to the file can reach this process (a mapped file that
 * shrinks raises SIGBUS on the next touch past its end). The file must
 * still have `size` bytes at the end of the read. */
static llmem_status read_copy(int fd, const char *path, size_t size, void **out)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return llmem__fail(errno == ENOMEM ? LLMEM_ENOMEM : LLMEM_EOS, "model: no memory to copy '%s' (%zu bytes): %s",
                           path, size, strerror(errno));
    size_t done = 0;
    while (done < size) {
        ssize_t r = pread(fd, (char *)p + done, size - done, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            munmap(p, size);
            if (!e)
                return llmem__fail(LLMEM_EFORMAT, "model: '%s' shrank to %zu bytes while it was read (%zu at open)",
                                   path, done, size);
            return llmem__fail(LLMEM_EIO, "model: reading '%s' failed at byte %zu: %s", path, done, strerror(e));
        }
        done += (size_t)r;
    }
    mprotect(p, size, PROT_READ); /* as read-only as a mapping of the file */
    *out = p;
    return LLMEM_OK;
}

void llmem_model_close(llmem_model *m) { model_free(m); }

/* Run the parser the magic names, then total the tensors. */
static llmem_status parse(llmem_model *m)
{
    if (m->size < 4)
        return llmem__fail(LLMEM_EFORMAT, "model: file too short to tell its format (%zu bytes)", m->size);
    uint32_t magic;
    memcpy(&magic, m->base, 4);
    /* Three of the four bytes of "GGUF" in place: a damaged GGUF, not a
     * llama2.c header (whose first int32, the width, would be over a
     * billion), so say that instead of complaining about "n_heads". */
    int same = 0;
    for (int i = 0; i < 4; i++) same += m->base[i] == (uint8_t)"GGUF"[i];
    if (magic != GGUF_MAGIC && same == 3) {
        char shown[24];
        llmem__show(shown, sizeof shown, (const char *)m->base, 4);
        return llmem__fail(LLMEM_EFORMAT,
                           "model: bad magic '%s' (%02x %02x %02x %02x at offset 0): one byte from GGUF's 'GGUF', a "
                           "damaged GGUF file",
                           shown, m->base[0], m->base[1], m->base[2], m->base[3]);
    }
    llmem_status st = magic == GGUF_MAGIC ? llmem__gguf_parse(m) : llmem__llama2c_parse(m);
    if (st) return st;
    for (size_t i = 0; i < m->n_tensors; i++) m->tensor_bytes += m->tensors[i].bytes;
    return LLMEM_OK;
}

llmem_status llmem_model_open_memory(const void *data, size_t size, llmem_model **out)
{
    if (out) *out = NULL;
    if (!data || !out) return llmem__fail(LLMEM_EINVAL, "model: null argument");
    uint64_t t0 = llmem__now_ns();
    llmem_model *m = calloc(1, sizeof *m);
    if (!m) return llmem__fail(LLMEM_ENOMEM, "model: out of memory");
    m->base = data;
    m->size = size;
    llmem_status st = parse(m);
    if (st) {
        model_free(m);
        return st;
    }
    m->open_seconds = (double)(llmem__now_ns() - t0) / 1e9;
    *out = m;
    return LLMEM_OK;
}

/* The page-aligned span [lo, hi) of the mapping that holds tensor data. */
static void data_span(const llmem_model *m, uintptr_t *lo, uintptr_t *hi)
{
    size_t page = llmem__page_size();
    uintptr_t a = UINTPTR_MAX, b = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        uintptr_t s = (uintptr_t)m->tensors[i].data, e = s + m->tensors[i].bytes;
        if (s < a) a = s;
        if (e > b) b = e;
    }
    if (a >= b) a = b = (uintptr_t)m->base;
    *lo = a & ~(uintptr_t)(page - 1);
    *hi = llmem__align_ptr(b, page);
}

/* Fault the mapping in, chunk by chunk, printing "\rloading NAME: 37% (1.2
 * of 3.1 GB)". MADV_POPULATE_READ where the kernel has it, else one read
 * per page. */
static void populate_with_progress(const llmem_model *m, const char *path)
{
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    const size_t chunk = (size_t)64 << 20; /* a multiple of any page size */
    size_t page = llmem__page_size();
    bool madv_ok = true;
    for (size_t off = 0; off < m->size;) {
        size_t len = m->size - off < chunk ? m->size - off : chunk;
        const uint8_t *p = m->base + off;
        if (!madv_ok || madvise((void *)(uintptr_t)p, len, MADV_POPULATE_READ) != 0) {
            madv_ok = false;
            volatile const uint8_t *v = p;
            unsigned sink = 0;
            for (size_t i = 0; i < len; i += page) sink += v[i];
            (void)sink;
        }
        off += len;
        fprintf(stderr, "\rloading %s: %3d%% (%.1f of %.1f GB)", name, (int)((double)off * 100.0 / (double)m->size),
                (double)off / 1e9, (double)m->size / 1e9);
    }
    fputc('\n', stderr);
}

llmem_status llmem_model_open(const char *path, const llmem_model_options *opts, llmem_model **out)
{
    if (out) *out = NULL;
    if (!path || !out) return llmem__fail(LLMEM_EINVAL, "model: null argument");
    llmem_model_options o = opts ? *opts : llmem_model_options_default();
    uint64_t t0 = llmem__now_ns();

    /* O_NONBLOCK, then a regular file or LLMEM_EIO: a FIFO or a device
     * given as the model returns at once instead of hanging in open(). */
    int fd;
    struct stat sb;
    llmem_status ost = llmem__open_regular(path, "model", &fd, &sb);
    if (ost) return ost;
    if (sb.st_size < 4) { /* mmap cannot map 0 bytes; and no format fits in 3 */
        close(fd);
        return llmem__fail(LLMEM_EFORMAT, "model: '%s': file too short to tell its format (%lld bytes)", path,
                           (long long)sb.st_size);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return llmem__fail(LLMEM_EOVERFLOW, "model: '%s' does not fit the address space", path);
    }
    size_t size = (size_t)sb.st_size;
    bool progress = !o.copy && o.progress && o.populate && size > PROGRESS_MIN_BYTES && isatty(2);
    void *map = NULL;
    int e;
    if (o.copy) {
        ost = read_copy(fd, path, size, &map);
        close(fd);
        if (ost) return ost;
    } else {
        int flags = (o.shared ? MAP_SHARED : MAP_PRIVATE) | (o.populate && !progress ? MAP_POPULATE : 0);
        map = mmap(NULL, size, PROT_READ, flags, fd, 0);
        e = errno;
        close(fd); /* the mapping keeps the file alive */
        if (map == MAP_FAILED)
            return llmem__fail(e == ENOMEM ? LLMEM_ENOMEM : LLMEM_EIO, "model: cannot map '%s' (%zu bytes): %s", path,
                               size, strerror(e));
    }

    llmem_model *m = calloc(1, sizeof *m);
    char *path_copy = strdup(path);
    if (!m || !path_copy) {
        free(m);
        free(path_copy);
        munmap(map, size);
        return llmem__fail(LLMEM_ENOMEM, "model: out of memory");
    }
    m->map = map;
    m->base = map;
    m->size = size;
    m->path = path_copy;
    m->copied = o.copy;
    m->dev = sb.st_dev;
    m->ino = sb.st_ino;
    m->file_size = sb.st_size;
    m->mtime = sb.st_mtim;
    llmem_status st = parse(m);
    if (st) {
        model_free(m);
        return st;
    }

    /* Hints are advisory: a kernel that refuses one (no THP for files,
     * say) costs speed, not correctness, so their errors are ignored. */
    if (o.sequential) {
        uintptr_t lo, hi;
        data_span(m, &lo, &hi);
        if (hi > lo) {
            madvise((void *)lo, hi - lo, MADV_SEQUENTIAL);
            madvise((void *)lo, hi - lo, MADV_WILLNEED);
        }
    }
    if (o.hugepage) {
        uintptr_t lo = llmem__align_ptr((uintptr_t)map, HUGE_2M), hi = ((uintptr_t)map + size) & ~(HUGE_2M - 1);
        if (hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
    }
    if (progress) populate_with_progress(m, path);
    m->releasable = !o.copy && !o.shared && !o.mlock;
    if (o.mlock && mlock(map, size) != 0) {
        e = errno;
        struct rlimit rl = {0, 0};
        getrlimit(RLIMIT_MEMLOCK, &rl);
        model_free(m);
        if (e == EPERM || e == ENOMEM || e == EAGAIN) {
            if (rl.rlim_cur == RLIM_INFINITY)
                return llmem__fail(LLMEM_EPERM, "model: mlock of '%s' (%zu bytes) refused: %s (RLIMIT_MEMLOCK is "
                                   "unlimited; CAP_IPC_LOCK or memory is lacking)", path, size, strerror(e));
            return llmem__fail(LLMEM_EPERM,
                               "model: mlock of '%s' (%zu bytes) refused: %s (RLIMIT_MEMLOCK is %llu bytes; "
                               "raise it with ulimit -l or run with CAP_IPC_LOCK)",
                               path, size, strerror(e), (unsigned long long)rl.rlim_cur);
        }
        return llmem__fail(LLMEM_EOS, "model: mlock of '%s' failed: %s", path, strerror(e));
    }
    m->open_seconds = (double)(llmem__now_ns() - t0) / 1e9;
    *out = m;
    return LLMEM_OK;
}

llmem_status llmem_model_check_file(const llmem_model *m)
{
    if (!m) return llmem__fail(LLMEM_EINVAL, "model: null argument");
    if (!m->path || m->copied) return LLMEM_OK; /* bytes of its own: nothing outside can change them */
    struct stat sb;
    if (stat(m->path, &sb) != 0) {
        if (errno == ENOENT)
            return llmem__fail(LLMEM_ESTATE, "model: '%s' was removed since open (this model still maps the old file, "
                               "intact)", m->path);
        return llmem__fail(LLMEM_EIO, "model: cannot stat '%s': %s", m->path, strerror(errno));
    }
    if (sb.st_dev != m->dev || sb.st_ino != m->ino)
        return llmem__fail(LLMEM_ESTATE, "model: '%s' was replaced by another file since open (this model still maps "
                           "the old one, intact; reopen to serve the new one)", m->path);
    if (sb.st_size < m->file_size)
        return llmem__fail(LLMEM_ECORRUPT, "model: '%s' was truncated from %lld to %lld bytes since open: touching "
                           "the mapping past the new end raises SIGBUS; stop using this model (options.copy makes "
                           "a model immune)", m->path, (long long)m->file_size, (long long)sb.st_size);
    if (sb.st_size != m->file_size || sb.st_mtim.tv_sec != m->mtime.tv_sec || sb.st_mtim.tv_nsec != m->mtime.tv_nsec)
        return llmem__fail(LLMEM_ECORRUPT, "model: '%s' was modified in place since open (%lld -> %lld bytes, new "
                           "modification time): the mapped bytes may no longer be those checked at open", m->path,
                           (long long)m->file_size, (long long)sb.st_size);
    return LLMEM_OK;
}

/* ---- queries ------------------------------------------------------------ */

const llmem_model_config *llmem_model_get_config(const llmem_model *m) { return m ? &m->config : NULL; }

llmem_status llmem_model_tensor(const llmem_model *m, const char *name, const llmem_tensor **out)
{
    if (out) *out = NULL;
    if (!m || !name || !out) return llmem__fail(LLMEM_EINVAL, "model: null argument");
    const llmem_tensor *t = llmem__tensor_find(m, name);
    if (!t) {
        char nm[64];
        llmem__show(nm, sizeof nm, name, strlen(name));
        return llmem__fail(LLMEM_ENOTFOUND, "model: no tensor '%s'", nm);
    }
    *out = t;
    return LLMEM_OK;
}

size_t llmem_model_tensor_count(const llmem_model *m) { return m ? m->n_tensors : 0; }

const llmem_tensor *llmem_model_tensor_at(const llmem_model *m, size_t i)
{
    return m && i < m->n_tensors ? &m->tensors[i] : NULL;
}

llmem_status llmem_model_advise(llmem_model *m, int advice)
{
    if (!m) return llmem__fail(LLMEM_EINVAL, "model: null argument");
    if (!m->map) return LLMEM_OK;
    size_t page = llmem__page_size();
    uintptr_t lo = 0, hi = 0; /* the run of tensors being gathered into one call */
    for (size_t i = 0; i <= m->n_tensors; i++) {
        uintptr_t s = 0, e = 0;
        if (i < m->n_tensors) {
            s = (uintptr_t)m->tensors[i].data & ~(uintptr_t)(page - 1);
            e = llmem__align_ptr((uintptr_t)m->tensors[i].data + m->tensors[i].bytes, page);
            if (hi > lo && s <= hi && e >= lo) { /* touches the run: extend it */
                lo = s < lo ? s : lo;
                hi = e > hi ? e : hi;
                continue;
            }
        }
        if (hi > lo && madvise((void *)lo, hi - lo, advice) != 0) {
            int err = errno;
            return llmem__fail(err == EINVAL ? LLMEM_EINVAL : LLMEM_EOS, "model: madvise(%d) over [%p, +%zu) failed: %s",
                               advice, (void *)lo, (size_t)(hi - lo), strerror(err));
        }
        lo = s;
        hi = e;
    }
    return LLMEM_OK;
}

llmem_status llmem_model_get_stats(const llmem_model *m, llmem_model_stats *out)
{
    if (!m || !out) return llmem__fail(LLMEM_EINVAL, "model: null argument");
    llmem_model_stats s;
    memset(&s, 0, sizeof s);
    s.file_bytes = m->size;
    s.tensor_bytes = m->tensor_bytes;
    s.tensors = m->n_tensors;
    s.open_seconds = m->open_seconds;
    if (m->map) {
        size_t page = llmem__page_size(), pages = (m->size + page - 1) / page;
        s.mapped_bytes = (uint64_t)pages * page;
        unsigned char vec[4096];
        for (size_t p = 0; p < pages; p += sizeof vec) {
            size_t n = pages - p < sizeof vec ? pages - p : sizeof vec;
            if (mincore((uint8_t *)m->map + p * page, n * page, vec) != 0) break;
            for (size_t i = 0; i < n; i++) s.resident_bytes += (vec[i] & 1) ? page : 0;
        }
        if (s.resident_bytes > m->size) s.resident_bytes = m->size; /* the last page is partial */
    }
    return llmem__stats_out(out, &s, sizeof s);
}

LLMEM__STATS_SCHEMA_OF(llmem_model_stats_schema, "model", llmem_model_stats, LLMEM_MODEL_STATS_FIELDS)

/* ---- giving pages back (model_release.h) ---- */

bool llmem__model_releasable(const llmem_model *m) { return m && m->releasable; }

void llmem__model_release(const llmem_model *m, const void *p, size_t bytes)
{
    if (!llmem__model_releasable(m) || !p || !bytes) return;
    uintptr_t lo = (uintptr_t)p, hi = lo + bytes, base = (uintptr_t)m->base;
    if (lo < base || hi > base + m->size) return;
    /* Whole pages only: a page shared with a neighbouring tensor stays. */
    const uintptr_t pg = (uintptr_t)llmem__page_size();
    lo = (lo + pg - 1) & ~(pg - 1);
    hi &= ~(pg - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advisory: an error leaves the pages resident */
}
