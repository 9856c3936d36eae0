/*
 * profile.c - sampled size histogram and lifetimes.
 *
 * Sizes: an open-addressing table of `cap` entries (a power of two, twice
 * max_sizes); a key is claimed with a compare-and-swap from 0 and counters
 * are atomic adds, so recording takes no lock. Sampling: a thread-local
 * tick; one call in `rate` records.
 *
 * Lifetimes: a sampled allocation's pointer and time go into a small table
 * under a mutex (sampled calls only), and a byte counter per hash bucket of
 * pointers lets record_free skip the lock for every pointer that was not
 * sampled (one relaxed load). A full lifetime table drops the sample.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "internal.h"
#include "llmem/profile.h"

#define LIVE_CAP 4096u     /* sampled allocations awaiting their free */
#define FILTER_SIZE 65536u /* bytes of the pointer filter */

typedef struct pentry {
    uint64_t size;         /* 0 = empty; claimed by CAS */
    uint64_t samples;      /* atomic */
    uint64_t life_n;       /* atomic */
    uint64_t life_ns;      /* atomic: sum of lifetimes */
} pentry;

typedef struct live_sample {
    uintptr_t ptr;         /* 0 = empty */
    uint64_t t;
    uint64_t size;
} live_sample;

struct llmem_profile {
    uint32_t rate, max_sizes;
    size_t cap;
    pentry *table;
    uint64_t distinct, samples, other, lifetimes; /* atomic */
    pthread_mutex_t lock;                          /* guards live */
    live_sample *live;
    size_t live_count;
    uint8_t filter[FILTER_SIZE];                   /* samples per pointer hash; atomic */
};

static _Thread_local uint64_t tl_tick;

llmem_profile_options llmem_profile_options_default(void)
{
    llmem_profile_options o = {16, 4096};
    return o;
}

llmem_status llmem_profile_create(const llmem_profile_options *opts, llmem_profile **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "profile: null out");
    *out = NULL;
    llmem_profile_options o = opts ? *opts : llmem_profile_options_default();
    if (!o.sample_every) o.sample_every = 16;
    if (!o.max_sizes) o.max_sizes = 4096;
    if (o.max_sizes > (1u << 24)) return llmem__fail(LLMEM_EINVAL, "profile: max_sizes %u above 2^24", o.max_sizes);
    llmem_profile *pr = calloc(1, sizeof *pr);
    if (!pr) return llmem__fail(LLMEM_ENOMEM, "profile: out of memory");
    pr->rate = o.sample_every;
    pr->max_sizes = o.max_sizes;
    pr->cap = llmem__next_pow2((size_t)o.max_sizes * 2);
    pr->table = calloc(pr->cap, sizeof *pr->table);
    pr->live = calloc(LIVE_CAP, sizeof *pr->live);
    if (!pr->table || !pr->live) {
        free(pr->table);
        free(pr->live);
        free(pr);
        return llmem__fail(LLMEM_ENOMEM, "profile: out of memory");
    }
    pthread_mutex_init(&pr->lock, NULL);
    *out = pr;
    return LLMEM_OK;
}

void llmem_profile_destroy(llmem_profile *pr)
{
    if (!pr) return;
    pthread_mutex_destroy(&pr->lock);
    free(pr->table);
    free(pr->live);
    free(pr);
}

/* The entry for size, claimed if new; NULL when the table is full. */
static pentry *entry_for(llmem_profile *pr, uint64_t size, bool create)
{
    size_t mask = pr->cap - 1;
    for (size_t i = llmem__fmix64(size) & mask, n = 0; n < pr->cap; i = (i + 1) & mask, n++) {
        uint64_t k = __atomic_load_n(&pr->table[i].size, __ATOMIC_ACQUIRE);
        if (k == size) return &pr->table[i];
        if (k != 0) continue;
        if (!create) return NULL;
        if (__atomic_add_fetch(&pr->distinct, 1, __ATOMIC_RELAXED) > pr->max_sizes) {
            __atomic_sub_fetch(&pr->distinct, 1, __ATOMIC_RELAXED);
            return NULL;
        }
        uint64_t zero = 0;
        if (__atomic_compare_exchange_n(&pr->table[i].size, &zero, size, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return &pr->table[i];
        __atomic_sub_fetch(&pr->distinct, 1, __ATOMIC_RELAXED);
        if (zero == size) return &pr->table[i]; /* another thread claimed it for us */
    }
    return NULL;
}

static inline size_t filter_slot(uintptr_t p) { return (size_t)(llmem__fmix64((uint64_t)p) % FILTER_SIZE); }

void llmem_profile_record_alloc(llmem_profile *pr, size_t size, const void *ptr)
{
    if (!pr || !ptr || ++tl_tick % pr->rate) return;
    __atomic_add_fetch(&pr->samples, 1, __ATOMIC_RELAXED);
    pentry *e = entry_for(pr, size, true);
    if (!e) {
        __atomic_add_fetch(&pr->other, 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_add_fetch(&e->samples, 1, __ATOMIC_RELAXED);
    /* Remember it for its lifetime. */
    uintptr_t p = (uintptr_t)ptr;
    pthread_mutex_lock(&pr->lock);
    if (pr->live_count < LIVE_CAP / 2) {
        size_t i = llmem__fmix64((uint64_t)p) & (LIVE_CAP - 1);
        while (pr->live[i].ptr && pr->live[i].ptr != p) i = (i + 1) & (LIVE_CAP - 1);
        if (!pr->live[i].ptr) {
            pr->live_count++;
            uint8_t *f = &pr->filter[filter_slot(p)];
            if (__atomic_load_n(f, __ATOMIC_RELAXED) < 255) __atomic_add_fetch(f, 1, __ATOMIC_RELAXED);
        }
        pr->live[i] = (live_sample){p, llmem__now_ns(), size};
    }
    pthread_mutex_unlock(&pr->lock);
}

void llmem_profile_record_free(llmem_profile *pr, const void *ptr)
{
    if (!pr || !ptr) return;
    uintptr_t p = (uintptr_t)ptr;
    uint8_t *f = &pr->filter[filter_slot(p)];
    if (!__atomic_load_n(f, __ATOMIC_RELAXED)) return; /* not sampled: the common case */
    pthread_mutex_lock(&pr->lock);
    size_t i = llmem__fmix64((uint64_t)p) & (LIVE_CAP - 1);
    while (pr->live[i].ptr && pr->live[i].ptr != p) i = (i + 1) & (LIVE_CAP - 1);
    if (pr->live[i].ptr == p) {
        live_sample s = pr->live[i];
        /* Backward-shift delete keeps probe chains intact. */
        size_t j = i;
        for (;;) {
            j = (j + 1) & (LIVE_CAP - 1);
            if (!pr->live[j].ptr) break;
            size_t home = llmem__fmix64((uint64_t)pr->live[j].ptr) & (LIVE_CAP - 1);
            if (((j - home) & (LIVE_CAP - 1)) >= ((j - i) & (LIVE_CAP - 1))) {
                pr->live[i] = pr->live[j];
                i = j;
            }
        }
        pr->live[i].ptr = 0;
        pr->live_count--;
        if (__atomic_load_n(f, __ATOMIC_RELAXED) < 255) __atomic_sub_fetch(f, 1, __ATOMIC_RELAXED);
        pentry *e = entry_for(pr, s.size, false);
        if (e) {
            __atomic_add_fetch(&e->life_n, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&e->life_ns, llmem__now_ns() - s.t, __ATOMIC_RELAXED);
            __atomic_add_fetch(&pr->lifetimes, 1, __ATOMIC_RELAXED);
        }
    }
    pthread_mutex_unlock(&pr->lock);
}

static int by_count_desc(const void *a, const void *b)
{
    const llmem_profile_entry *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return x->size < y->size ? -1 : x->size > y->size;
}

/* Every entry, sorted by count; caller frees. */
static llmem_status snapshot(const llmem_profile *pr, llmem_profile_entry **out, size_t *n)
{
    llmem_profile_entry *v = malloc((pr->cap ? pr->cap : 1) * sizeof *v);
    if (!v) return llmem__fail(LLMEM_ENOMEM, "profile: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < pr->cap; i++) {
        const pentry *e = &pr->table[i];
        uint64_t size = __atomic_load_n(&e->size, __ATOMIC_ACQUIRE);
        uint64_t samples = __atomic_load_n(&e->samples, __ATOMIC_RELAXED);
        if (!size || !samples) continue;
        uint64_t ln = __atomic_load_n(&e->life_n, __ATOMIC_RELAXED), lns = __atomic_load_n(&e->life_ns, __ATOMIC_RELAXED);
        uint64_t count, bytes;
        if (__builtin_mul_overflow(samples, (uint64_t)pr->rate, &count)) count = UINT64_MAX;
        if (__builtin_mul_overflow(size, count, &bytes)) bytes = UINT64_MAX; /* a hostile file: saturate */
        v[k++] = (llmem_profile_entry){size, count, bytes, ln, ln ? (double)lns / (double)ln / 1e9 : 0.0};
    }
    qsort(v, k, sizeof *v, by_count_desc);
    *out = v;
    *n = k;
    return LLMEM_OK;
}

llmem_status llmem_profile_top(const llmem_profile *pr, llmem_profile_entry *out, size_t cap, size_t *n)
{
    if (!pr || (cap && !out) || !n) return llmem__fail(LLMEM_EINVAL, "profile top: null argument");
    llmem_profile_entry *v;
    size_t k;
    llmem_status st = snapshot(pr, &v, &k);
    if (st) return st;
    *n = k < cap ? k : cap;
    if (*n) memcpy(out, v, *n * sizeof *v);
    free(v);
    return LLMEM_OK;
}

static int by_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

llmem_status llmem_profile_suggest_classes(const llmem_profile *pr, size_t k, size_t max_size, size_t align,
                                           double min_share, uint32_t *sizes, size_t *n)
{
    if (!pr || (k && !sizes) || !n) return llmem__fail(LLMEM_EINVAL, "profile suggest: null argument");
    if (!llmem__is_pow2(align)) return llmem__fail(LLMEM_EALIGN, "profile suggest: align %zu is not a power of two", align);
    if (!(min_share >= 0 && min_share <= 1)) return llmem__fail(LLMEM_EINVAL, "profile suggest: min_share outside [0, 1]");
    *n = 0;
    llmem_profile_entry *v;
    size_t cnt;
    llmem_status st = snapshot(pr, &v, &cnt);
    if (st) return st;
    uint64_t total = 0;
    for (size_t i = 0; i < cnt; i++) total += v[i].count;
    for (size_t i = 0; i < cnt && *n < k; i++) {
        if (v[i].size > max_size || v[i].size > UINT32_MAX) continue;
        if ((double)v[i].count < min_share * (double)total) break; /* sorted: the rest are rarer */
        size_t r;
        if (!llmem__align_up((size_t)v[i].size, align, &r) || r > max_size || r > UINT32_MAX) continue;
        bool dup = false;
        for (size_t j = 0; j < *n; j++) dup |= sizes[j] == r;
        if (!dup) sizes[(*n)++] = (uint32_t)r;
    }
    free(v);
    qsort(sizes, *n, sizeof *sizes, by_u32);
    return LLMEM_OK;
}

llmem_status llmem_profile_save(const llmem_profile *pr, const char *path)
{
    if (!pr || !path) return llmem__fail(LLMEM_EINVAL, "profile save: null argument");
    llmem_profile_entry *v;
    size_t k;
    llmem_status st = snapshot(pr, &v, &k);
    if (st) return st;
    FILE *f = fopen(path, "w");
    if (!f) {
        free(v);
        return llmem__fail(LLMEM_EIO, "profile save: cannot open '%s': %s", path, strerror(errno));
    }
    fprintf(f, "# llmem profile v1 sample_every=%u sizes=%zu\n# size count lifetimes mean_lifetime_s\n", pr->rate, k);
    for (size_t i = 0; i < k; i++)
        fprintf(f, "%llu %llu %llu %.9g\n", (unsigned long long)v[i].size, (unsigned long long)v[i].count,
                (unsigned long long)v[i].lifetimes, v[i].mean_lifetime_s);
    free(v);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) return llmem__fail(LLMEM_EIO, "profile save: writing '%s' failed", path);
    return LLMEM_OK;
}

/* Parse an unsigned decimal field; false on anything else. */
static bool parse_u64(char **s, uint64_t *v)
{
    while (**s == ' ' || **s == '\t') (*s)++;
    if (**s < '0' || **s > '9') return false;
    errno = 0;
    char *end;
    unsigned long long x = strtoull(*s, &end, 10);
    if (errno || end == *s) return false;
    *v = x;
    *s = end;
    return true;
}

llmem_status llmem_profile_load(llmem_profile *pr, const char *path)
{
    if (!pr || !path) return llmem__fail(LLMEM_EINVAL, "profile load: null argument");
    FILE *f = fopen(path, "r");
    if (!f) return llmem__fail(LLMEM_EIO, "profile load: cannot open '%s': %s", path, strerror(errno));
    pentry *table = calloc(pr->cap, sizeof *table);
    if (!table) {
        fclose(f);
        return llmem__fail(LLMEM_ENOMEM, "profile load: out of memory");
    }
    char line[512];
    unsigned lineno = 0;
    uint64_t distinct = 0, samples = 0;
    llmem_status st = LLMEM_OK;
    while (!st && fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            st = llmem__fail(LLMEM_EFORMAT, "profile load: '%s' line %u is too long", path, lineno);
            break;
        }
        if (line[0] == '#' || line[0] == '\n') continue;
        char *s = line;
        uint64_t size, count, ln;
        double mean;
        if (!parse_u64(&s, &size) || !parse_u64(&s, &count) || !parse_u64(&s, &ln) ||
            sscanf(s, "%lf", &mean) != 1 || size == 0 || !(mean >= 0) || mean > 1e9) {
            st = llmem__fail(LLMEM_EFORMAT, "profile load: '%s' line %u: expected \"size count lifetimes mean\"",
                             path, lineno);
            break;
        }
        if (distinct >= pr->max_sizes) continue; /* more sizes than this profile keeps */
        size_t mask = pr->cap - 1, i = llmem__fmix64(size) & mask;
        while (table[i].size && table[i].size != size) i = (i + 1) & mask;
        if (!table[i].size) distinct++;
        /* Counts in the file are allocations; this profile keeps samples. */
        uint64_t smp = count / pr->rate;
        table[i] = (pentry){size, smp ? smp : 1, ln, (uint64_t)(mean * 1e9 * (double)ln)};
        samples += table[i].samples;
    }
    if (!st && ferror(f)) st = llmem__fail(LLMEM_EIO, "profile load: reading '%s' failed", path);
    fclose(f);
    if (st) {
        free(table);
        return st;
    }
    free(pr->table);
    pr->table = table;
    pr->distinct = distinct;
    pr->samples = samples;
    pr->other = 0;
    return LLMEM_OK;
}

llmem_status llmem_profile_get_stats(const llmem_profile *pr, llmem_profile_stats *out)
{
    if (!pr || !out) return llmem__fail(LLMEM_EINVAL, "profile stats: null argument");
    llmem_profile_stats s = {.struct_size = sizeof s};
    s.samples_total = __atomic_load_n(&pr->samples, __ATOMIC_RELAXED);
    s.allocations_total = s.samples_total * pr->rate;
    s.distinct_sizes = __atomic_load_n(&pr->distinct, __ATOMIC_RELAXED);
    s.other_samples_total = __atomic_load_n(&pr->other, __ATOMIC_RELAXED);
    s.lifetimes_total = __atomic_load_n(&pr->lifetimes, __ATOMIC_RELAXED);
    return llmem__stats_out(out, &s, sizeof s);
}

LLMEM__STATS_SCHEMA_OF(llmem_profile_stats_schema, "profile", llmem_profile_stats, LLMEM_PROFILE_STATS_FIELDS)
