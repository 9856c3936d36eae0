/*
 * tracking.c - the tracking adaptor: every live mapping, its committed
 * bytes and its caller's tag.
 *
 * Mappings live in an array sorted by address under one mutex, so both
 * "is this the start of a mapping" (unmap) and "which mapping contains this
 * range" (commit, decommit) are binary searches. Invalid calls are refused
 * before they reach upstream: this adaptor is the contract checker for
 * resources that cannot check themselves (the kernel will happily munmap
 * half of someone else's mapping).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "adaptor.h"
#include "llmem/tracking_resource.h"

typedef struct track_entry {
    uintptr_t ptr;
    size_t size;
    size_t committed;
    uint64_t seq;
    char tag[32];
} track_entry;

typedef struct tracking_resource {
    llmem__adaptor a;
    pthread_mutex_t lock;  /* guards everything below */
    track_entry *v;        /* sorted by ptr */
    size_t count, cap;
    size_t pending;        /* unmaps taken out of v and not yet answered upstream;
                              count + pending <= cap, so each can be put back */
    uint64_t next_seq;
    llmem_tracking_stats st;
} tracking_resource;

/* First index whose mapping ends after p. Lock held. */
static size_t lower(const tracking_resource *t, uintptr_t p)
{
    size_t lo = 0, hi = t->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid].ptr + t->v[mid].size <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The mapping containing [p, p+n), or NULL. Lock held. */
static track_entry *containing(tracking_resource *t, uintptr_t p, size_t n)
{
    size_t i = lower(t, p);
    if (i < t->count && t->v[i].ptr <= p && p + n <= t->v[i].ptr + t->v[i].size) return &t->v[i];
    return NULL;
}

/* Put e in its place (room for it is there) and count it, peaks included.
 * Lock held. */
static void insert(tracking_resource *t, const track_entry *e)
{
    size_t i = lower(t, e->ptr);
    memmove(&t->v[i + 1], &t->v[i], (t->count - i) * sizeof *t->v);
    t->v[i] = *e;
    t->count++;
    t->st.live_mappings = t->count;
    t->st.live_bytes += e->size;
    if (t->st.live_bytes > t->st.peak_bytes) t->st.peak_bytes = t->st.live_bytes;
    if (t->count > t->st.peak_mappings) t->st.peak_mappings = t->count;
}

static llmem_status refuse(tracking_resource *t, llmem_status st)
{
    t->st.refused_total++;
    pthread_mutex_unlock(&t->lock);
    return st;
}

static llmem_status tr_map(llmem_resource *r, size_t size, size_t align, unsigned flags, const char *tag, void **out)
{
    tracking_resource *t = (tracking_resource *)r;
    void *p = NULL;
    llmem_status st = llmem_resource_map_tagged(t->a.up, size, align, flags, tag, &p);
    if (st) return st;
    pthread_mutex_lock(&t->lock);
    if (t->count + t->pending >= t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 32;
        track_entry *n = realloc(t->v, ncap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&t->lock);
            llmem_resource_unmap(t->a.up, p, size, (flags & LLMEM_MAP_UNCOMMITTED) ? 0 : size);
            return llmem__fail(LLMEM_ENOMEM, "tracking '%s': out of memory for metadata", r->info.name);
        }
        t->v = n;
        t->cap = ncap;
    }
    track_entry e = {(uintptr_t)p, size, (flags & LLMEM_MAP_UNCOMMITTED) ? 0 : size, ++t->next_seq, {0}};
    llmem__copy_name(e.tag, sizeof e.tag, tag, "");
    insert(t, &e);
    pthread_mutex_unlock(&t->lock);
    *out = p;
    return LLMEM_OK;
}

static llmem_status tr_unmap(llmem_resource *r, void *ptr, size_t size, size_t committed)
{
    tracking_resource *t = (tracking_resource *)r;
    pthread_mutex_lock(&t->lock);
    size_t i = lower(t, (uintptr_t)ptr);
    if (i >= t->count || t->v[i].ptr != (uintptr_t)ptr)
        return refuse(t, llmem__fail(LLMEM_EFOREIGN, "tracking '%s': unmap of %p, which it never mapped",
                                     r->info.name, ptr));
    track_entry e = t->v[i];
    if (e.size != size)
        return refuse(t, llmem__fail(LLMEM_EINVAL, "tracking '%s': unmap of %p (tag '%s') with size %zu, mapped with %zu",
                                     r->info.name, ptr, e.tag, size, e.size));
    if (e.committed != committed)
        return refuse(t, llmem__fail(LLMEM_EINVAL,
                                     "tracking '%s': unmap of %p (tag '%s') claims %zu committed bytes, %zu are",
                                     r->info.name, ptr, e.tag, committed, e.committed));
    /* Take it out first so a concurrent map that reuses the address can
     * insert; put it back if upstream refuses. The figures follow the
     * array, so a snapshot (stats, report) always agrees with itself. */
    memmove(&t->v[i], &t->v[i + 1], (t->count - i - 1) * sizeof *t->v);
    t->count--;
    t->pending++;
    t->st.live_mappings = t->count;
    t->st.live_bytes -= size;
    pthread_mutex_unlock(&t->lock);
    llmem_status st = llmem_resource_unmap(t->a.up, ptr, size, committed);
    pthread_mutex_lock(&t->lock);
    t->pending--;
    /* A map may have come in while it was out: back in, the figures can
     * pass the peaks they never reached with it gone. */
    if (st) insert(t, &e);
    pthread_mutex_unlock(&t->lock);
    return st;
}

static llmem_status tr_commit_change(llmem_resource *r, void *ptr, size_t size, bool commit)
{
    tracking_resource *t = (tracking_resource *)r;
    const char *op = commit ? "commit" : "decommit";
    pthread_mutex_lock(&t->lock);
    track_entry *e = containing(t, (uintptr_t)ptr, size);
    if (!e)
        return refuse(t, llmem__fail(LLMEM_EINVAL, "tracking '%s': %s of [%p, +%zu) outside any mapping",
                                     r->info.name, op, ptr, size));
    if (commit ? e->committed + size > e->size : e->committed < size)
        return refuse(t, llmem__fail(LLMEM_EINVAL,
                                     "tracking '%s': %s of %zu bytes in mapping %p (tag '%s') with %zu of %zu committed",
                                     r->info.name, op, size, (void *)e->ptr, e->tag, e->committed, e->size));
    uintptr_t key = e->ptr;
    pthread_mutex_unlock(&t->lock);
    llmem_status st = commit ? llmem_resource_commit(t->a.up, ptr, size) : llmem_resource_decommit(t->a.up, ptr, size);
    if (st) return st;
    pthread_mutex_lock(&t->lock);
    size_t i = lower(t, key);
    if (i < t->count && t->v[i].ptr == key) {
        if (commit) t->v[i].committed += size;
        else t->v[i].committed -= size;
    }
    pthread_mutex_unlock(&t->lock);
    return LLMEM_OK;
}

static llmem_status tr_commit(llmem_resource *r, void *ptr, size_t size) { return tr_commit_change(r, ptr, size, true); }
static llmem_status tr_decommit(llmem_resource *r, void *ptr, size_t size) { return tr_commit_change(r, ptr, size, false); }

static llmem_status copy_by_age(const tracking_resource *t, track_entry **out, size_t *n);

#define DESTROY_REPORT_LINES 16 /* mappings named one by one when destroyed with live ones */

/* Destroyed with live mappings: they are the caller's leak (still mapped
 * upstream, maybe still in use, so not unmapped here), and the last chance
 * to say so: one error line through the log with the count and bytes, and
 * the oldest mappings one line each. */
static void report_at_destroy(const tracking_resource *t)
{
    if (!t->count) return;
    llmem__log(LLMEM_LOG_ERROR,
               "tracking '%s': destroyed with %zu live mapping%s (%llu bytes), left mapped upstream: a leak",
               t->a.base.info.name, t->count, t->count == 1 ? "" : "s", (unsigned long long)t->st.live_bytes);
    track_entry *copy;
    size_t n;
    if (copy_by_age(t, &copy, &n)) return; /* out of memory: the summary above stands */
    for (size_t i = 0; i < n && i < DESTROY_REPORT_LINES; i++)
        llmem__log(LLMEM_LOG_ERROR, "tracking '%s': leak: %zu bytes at %p (tag '%s', map #%llu, %zu committed)",
                   t->a.base.info.name, copy[i].size, (void *)copy[i].ptr, copy[i].tag[0] ? copy[i].tag : "-",
                   (unsigned long long)copy[i].seq, copy[i].committed);
    if (n > DESTROY_REPORT_LINES)
        llmem__log(LLMEM_LOG_ERROR, "tracking '%s': ... and %zu more", t->a.base.info.name, n - DESTROY_REPORT_LINES);
    free(copy);
}

static void tr_destroy(llmem_resource *r)
{
    tracking_resource *t = (tracking_resource *)r;
    report_at_destroy(t);
    pthread_mutex_destroy(&t->lock);
    free(t->v);
    free(t);
}

static const llmem_resource_ops tracking_ops = {
    .map = tr_map,
    .unmap = tr_unmap,
    .commit = tr_commit,
    .decommit = tr_decommit,
    .copy = llmem__adaptor_copy,
    .destroy = tr_destroy,
};

llmem_status llmem_tracking_resource_create(llmem_resource *upstream, llmem_resource **out)
{
    llmem_status st = llmem__adaptor_check("tracking", upstream, out);
    if (st) return st;
    tracking_resource *t = llmem__adaptor_new(sizeof *t, &tracking_ops, "tracking", upstream);
    if (!t) return LLMEM_ENOMEM;
    t->st.struct_size = sizeof t->st;
    pthread_mutex_init(&t->lock, NULL);
    *out = &t->a.base;
    return LLMEM_OK;
}

static tracking_resource *as_tracking(const llmem_resource *r)
{
    return r && r->ops == &tracking_ops ? (tracking_resource *)(uintptr_t)r : NULL;
}

llmem_status llmem_tracking_resource_get_stats(const llmem_resource *r, llmem_tracking_stats *out)
{
    tracking_resource *t = as_tracking(r);
    if (!t || !out) return llmem__fail(LLMEM_EINVAL, "tracking stats: not a tracking resource");
    return llmem__stats_out_locked(out, &t->st, sizeof t->st, &t->lock);
}

static int by_seq(const void *a, const void *b)
{
    uint64_t x = ((const track_entry *)a)->seq, y = ((const track_entry *)b)->seq;
    return x < y ? -1 : x > y;
}

/* The live entries, oldest first, in a malloc'ed array (NULL when there are
 * none). Lock held. */
static llmem_status copy_by_age(const tracking_resource *t, track_entry **out, size_t *n)
{
    *out = NULL;
    *n = t->count;
    if (!t->count) return LLMEM_OK;
    track_entry *copy = malloc(t->count * sizeof *copy);
    if (!copy) return llmem__fail(LLMEM_ENOMEM, "tracking '%s': out of memory for a snapshot", t->a.base.info.name);
    memcpy(copy, t->v, t->count * sizeof *copy);
    qsort(copy, t->count, sizeof *copy, by_seq);
    *out = copy;
    return LLMEM_OK;
}

/* Take the lock and a snapshot of the live entries, oldest first
 * (copy_by_age): the caller unlocks, and frees *copy, whatever the status. */
static llmem_status lock_snapshot(tracking_resource *t, track_entry **copy, size_t *n)
{
    pthread_mutex_lock(&t->lock);
    return copy_by_age(t, copy, n);
}

llmem_status llmem_tracking_resource_foreach(const llmem_resource *r,
                                             bool (*fn)(void *user, const llmem_tracking_entry *e), void *user)
{
    tracking_resource *t = as_tracking(r);
    if (!t || !fn) return llmem__fail(LLMEM_EINVAL, "tracking foreach: not a tracking resource or null callback");
    track_entry *copy;
    size_t n;
    llmem_status st = lock_snapshot(t, &copy, &n);
    for (size_t i = 0; !st && i < n; i++) {
        llmem_tracking_entry e = {(void *)copy[i].ptr, copy[i].size, copy[i].committed, copy[i].tag, copy[i].seq};
        if (!fn(user, &e)) break;
    }
    pthread_mutex_unlock(&t->lock);
    free(copy);
    return st;
}

llmem_status llmem_tracking_resource_report(const llmem_resource *r, FILE *f, size_t *leaks)
{
    tracking_resource *t = as_tracking(r);
    if (!t || !f) return llmem__fail(LLMEM_EINVAL, "tracking report: not a tracking resource or null stream");
    /* One snapshot of the entries and the figures, so the lines and the
     * summary agree even while other threads map; written without the lock. */
    track_entry *copy;
    size_t n;
    llmem_status st = lock_snapshot(t, &copy, &n);
    llmem_tracking_stats s = t->st;
    pthread_mutex_unlock(&t->lock);
    if (st) return st;
    for (size_t i = 0; i < n; i++)
        fprintf(f, "llmem: leak in '%s': %zu bytes at %p (tag '%s', map #%llu, %zu committed)\n", r->info.name,
                copy[i].size, (void *)copy[i].ptr, copy[i].tag[0] ? copy[i].tag : "-",
                (unsigned long long)copy[i].seq, copy[i].committed);
    fprintf(f, "llmem: '%s': %llu live mappings, %llu bytes (peak %llu bytes)\n", r->info.name,
            (unsigned long long)s.live_mappings, (unsigned long long)s.live_bytes, (unsigned long long)s.peak_bytes);
    free(copy);
    if (leaks) *leaks = (size_t)s.live_mappings;
    return LLMEM_OK;
}

LLMEM__STATS_SCHEMA_OF(llmem_tracking_stats_schema, "tracking", llmem_tracking_stats, LLMEM_TRACKING_STATS_FIELDS)
