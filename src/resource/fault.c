/*
 * fault.c - the fault adaptor: fail chosen calls on purpose.
 *
 * Each counted call takes the lock once to number itself, decide, and
 * update the counters, so the Nth call is well defined even with many
 * threads. An injected failure never reaches upstream. The probability
 * trigger draws from splitmix64 seeded by the options, so a seed replays
 * the same failures for the same sequence of calls.
 *
 * bytes_total counts what went through: a map or commit claims its bytes
 * when it is decided (so concurrent callers cannot pass the byte budget
 * together) and gives them back if upstream then fails. A claim made before
 * a re-arm is not given back to the new arming's fresh counter.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "adaptor.h"
#include "hash.h"
#include "llmem/fault_resource.h"

typedef struct fault_resource {
    llmem__adaptor a;
    pthread_mutex_t lock;       /* guards everything below */
    llmem_fault_options opts;
    uint64_t rng;
    uint64_t arm_gen;           /* bumped by every arm */
    llmem_fault_stats st;
} fault_resource;

static const char *op_name(unsigned op)
{
    switch (op) {
    case LLMEM_FAULT_OP_MAP: return "map";
    case LLMEM_FAULT_OP_UNMAP: return "unmap";
    case LLMEM_FAULT_OP_COMMIT: return "commit";
    case LLMEM_FAULT_OP_DECOMMIT: return "decommit";
    default: return "copy";
    }
}

/* The next draw of a SplitMix64 stream: the state advances by the golden
 * ratio (inside llmem__splitmix64) and the draw is its mix. */
static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = llmem__splitmix64(*s);
    *s += 0x9e3779b97f4a7c15ull;
    return z;
}

/* Decide one call. bytes: what a map/commit would add (0 for others).
 * On LLMEM_OK, *claimed is how many bytes were added to bytes_total (0 for
 * an uncounted call) and *gen the arming they were added under; hand both
 * to give_back() if upstream fails. */
static llmem_status decide(fault_resource *f, unsigned op, size_t bytes, size_t *claimed, uint64_t *gen)
{
    *claimed = 0;
    pthread_mutex_lock(&f->lock);
    *gen = f->arm_gen;
    const llmem_fault_options *o = &f->opts;
    if (!(o->ops & op)) {
        pthread_mutex_unlock(&f->lock);
        return LLMEM_OK;
    }
    uint64_t k = ++f->st.calls_total;
    const char *why = NULL;
    if (o->fail_nth && k >= o->fail_nth && k - o->fail_nth < o->fail_count) why = "scheduled";
    else if (o->fail_after_bytes && bytes && (bytes > o->fail_after_bytes ||
                                              f->st.bytes_total > o->fail_after_bytes - bytes))
        why = "byte budget";
    else if (o->probability > 0 && (double)(splitmix64(&f->rng) >> 11) * 0x1.0p-53 < o->probability)
        why = "random";
    llmem_status st = LLMEM_OK;
    if (why) {
        f->st.injected_total++;
        st = llmem__fail(o->status, "fault '%s': injected %s failure of %s call #%llu (%s)", f->a.base.info.name, why,
                         op_name(op), (unsigned long long)k, llmem_status_name(o->status));
    } else {
        f->st.bytes_total += bytes;
        *claimed = bytes;
    }
    pthread_mutex_unlock(&f->lock);
    return st;
}

/* Upstream refused a call decide() let through: its bytes never went through. */
static void give_back(fault_resource *f, size_t claimed, uint64_t gen)
{
    if (!claimed) return;
    pthread_mutex_lock(&f->lock);
    if (f->arm_gen == gen) f->st.bytes_total -= claimed;
    pthread_mutex_unlock(&f->lock);
}

static llmem_status fault_map(llmem_resource *r, size_t size, size_t align, unsigned flags, const char *tag, void **out)
{
    fault_resource *f = (fault_resource *)r;
    size_t claimed;
    uint64_t gen;
    llmem_status st = decide(f, LLMEM_FAULT_OP_MAP, (flags & LLMEM_MAP_UNCOMMITTED) ? 0 : size, &claimed, &gen);
    if (st) return st;
    st = llmem_resource_map_tagged(f->a.up, size, align, flags, tag, out);
    if (st) give_back(f, claimed, gen);
    return st;
}

static llmem_status fault_unmap(llmem_resource *r, void *ptr, size_t size, size_t committed)
{
    fault_resource *f = (fault_resource *)r;
    size_t claimed;
    uint64_t gen;
    llmem_status st = decide(f, LLMEM_FAULT_OP_UNMAP, 0, &claimed, &gen);
    if (st) return st;
    return llmem_resource_unmap(f->a.up, ptr, size, committed);
}

static llmem_status fault_commit(llmem_resource *r, void *ptr, size_t size)
{
    fault_resource *f = (fault_resource *)r;
    size_t claimed;
    uint64_t gen;
    llmem_status st = decide(f, LLMEM_FAULT_OP_COMMIT, size, &claimed, &gen);
    if (st) return st;
    st = llmem_resource_commit(f->a.up, ptr, size);
    if (st) give_back(f, claimed, gen);
    return st;
}

static llmem_status fault_decommit(llmem_resource *r, void *ptr, size_t size)
{
    fault_resource *f = (fault_resource *)r;
    size_t claimed;
    uint64_t gen;
    llmem_status st = decide(f, LLMEM_FAULT_OP_DECOMMIT, 0, &claimed, &gen);
    return st ? st : llmem_resource_decommit(f->a.up, ptr, size);
}

static llmem_status fault_copy(llmem_resource *r, void *dst, const void *src, size_t n)
{
    fault_resource *f = (fault_resource *)r;
    size_t claimed;
    uint64_t gen;
    llmem_status st = decide(f, LLMEM_FAULT_OP_COPY, 0, &claimed, &gen);
    return st ? st : llmem_resource_copy(f->a.up, dst, src, n);
}

static void fault_destroy(llmem_resource *r)
{
    fault_resource *f = (fault_resource *)r;
    pthread_mutex_destroy(&f->lock);
    free(f);
}

static const llmem_resource_ops fault_ops = {
    .map = fault_map,
    .unmap = fault_unmap,
    .commit = fault_commit,
    .decommit = fault_decommit,
    .copy = fault_copy,
    .destroy = fault_destroy,
};

llmem_fault_options llmem_fault_options_default(void)
{
    llmem_fault_options o = {0};
    o.ops = LLMEM_FAULT_OP_MAP | LLMEM_FAULT_OP_COMMIT;
    o.fail_count = 1;
    o.status = LLMEM_ENOMEM;
    return o;
}

static llmem_status normalise(const llmem_fault_options *in, llmem_fault_options *o)
{
    *o = in ? *in : llmem_fault_options_default();
    if (!o->ops) o->ops = LLMEM_FAULT_OP_MAP | LLMEM_FAULT_OP_COMMIT;
    if (!o->fail_count) o->fail_count = 1;
    if (!o->status) o->status = LLMEM_ENOMEM;
    if (!o->seed) o->seed = 0x6c6c6d656d; /* "llmem" */
    if (o->ops & ~(unsigned)LLMEM_FAULT_OP_ALL) return llmem__fail(LLMEM_EINVAL, "fault: unknown ops 0x%x", o->ops);
    if (!(o->probability >= 0 && o->probability <= 1))
        return llmem__fail(LLMEM_EINVAL, "fault: probability must be within [0, 1]");
    if ((unsigned)o->status >= LLMEM_STATUS_COUNT_)
        return llmem__fail(LLMEM_EINVAL, "fault: unknown status %d", (int)o->status);
    return LLMEM_OK;
}

llmem_status llmem_fault_resource_create(llmem_resource *upstream, const llmem_fault_options *opts,
                                         llmem_resource **out)
{
    llmem_status st = llmem__adaptor_check("fault", upstream, out);
    if (st) return st;
    llmem_fault_options o;
    st = normalise(opts, &o);
    if (st) return st;
    fault_resource *f = llmem__adaptor_new(sizeof *f, &fault_ops, "fault", upstream);
    if (!f) return LLMEM_ENOMEM;
    f->opts = o;
    f->rng = o.seed;
    f->st.struct_size = sizeof f->st;
    pthread_mutex_init(&f->lock, NULL);
    *out = &f->a.base;
    return LLMEM_OK;
}

llmem_status llmem_fault_resource_arm(llmem_resource *r, const llmem_fault_options *opts)
{
    if (!r || r->ops != &fault_ops) return llmem__fail(LLMEM_EINVAL, "fault arm: not a fault resource");
    fault_resource *f = (fault_resource *)r;
    llmem_fault_options o;
    llmem_status st = normalise(opts, &o);
    if (st) return st;
    pthread_mutex_lock(&f->lock);
    f->opts = o;
    f->rng = o.seed;
    f->arm_gen++;
    f->st.calls_total = f->st.injected_total = f->st.bytes_total = 0;
    pthread_mutex_unlock(&f->lock);
    return LLMEM_OK;
}

llmem_status llmem_fault_resource_get_stats(const llmem_resource *r, llmem_fault_stats *out)
{
    if (!r || !out || r->ops != &fault_ops) return llmem__fail(LLMEM_EINVAL, "fault stats: not a fault resource");
    fault_resource *f = (fault_resource *)(uintptr_t)r;
    return llmem__stats_out_locked(out, &f->st, sizeof f->st, &f->lock);
}

LLMEM__STATS_SCHEMA_OF(llmem_fault_stats_schema, "fault", llmem_fault_stats, LLMEM_FAULT_STATS_FIELDS)
