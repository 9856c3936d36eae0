/*
 * arena.c - linear arena over chunks from a resource.
 *
 * State: an array of chunks in the order they were mapped (never
 * reordered, so a mark's chunk index stays meaningful), the index of the
 * current chunk, and a cursor [ptr, end) inside it. `used` is the cursor's
 * position counted from the first chunk's base: every byte of every chunk
 * before the current one (tails skipped when moving on included) plus the
 * offset in the current chunk. Invariants:
 *   - chunks[0..cur] are the chunks allocations came from since the reset;
 *     chunks after cur are retained for reuse;
 *   - base(cur) <= ptr <= end(cur);
 *   - used == chunks[cur].before + (ptr - base(cur)), so a position
 *     (chunk, offset) alone determines used;
 *   - for j < cur, [base(j), chunks[j].top) is what was handed out from
 *     chunk j before the cursor moved on (top == base for a chunk skipped);
 *   - requested <= used;
 *   - on host memory, every byte from ptr to the end of the last chunk is
 *     poisoned for ASan, every byte handed out is not.
 * All bookkeeping is out of band, so device memory is never touched.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "llmem/arena.h"

typedef struct arena_chunk {
    uintptr_t base;
    size_t size;   /* usable bytes */
    size_t mapped; /* bytes mapped from the resource (0 for a caller buffer) */
    size_t before; /* sum of the sizes of the chunks before this one */
    uintptr_t top; /* end of what was handed out here when the cursor moved on */
} arena_chunk;

struct llmem_arena {
    char name[32];
    llmem_resource *res;
    bool host;            /* poison what is not handed out */
    bool fixed;
    size_t align;         /* default alignment */
    size_t chunk_bytes;
    size_t max_bytes;     /* 0 = no cap */
    uint64_t id;
    uint64_t epoch;
    arena_chunk *chunks;
    size_t nchunks, cap;
    size_t cur;
    uintptr_t ptr, end;
    size_t used, requested;
    llmem_arena_stats st;
};

static uint64_t next_arena_id = 1;

static void poison(llmem_arena *a, uintptr_t p, size_t n)
{
    if (a->host && n) LLMEM_POISON((void *)p, n);
}

static void update_reserved(llmem_arena *a, int64_t delta)
{
    a->st.reserved_bytes = (uint64_t)((int64_t)a->st.reserved_bytes + delta);
    if (a->st.reserved_bytes > a->st.reserved_peak_bytes) a->st.reserved_peak_bytes = a->st.reserved_bytes;
    a->st.chunks = a->nchunks;
}

/* Append a chunk of at least `need` bytes. */
static llmem_status add_chunk(llmem_arena *a, size_t need)
{
    size_t want = need > a->chunk_bytes ? need : a->chunk_bytes, size;
    llmem_status st = llmem_resource_round(a->res, want, &size);
    if (st)
        return llmem__fail(st, "arena '%s': a chunk of %zu bytes overflows when rounded to the resource's granularity",
                           a->name, want);
    if (a->max_bytes && (size > a->max_bytes || a->st.reserved_bytes > a->max_bytes - size))
        return llmem__fail(LLMEM_ECAPACITY, "arena '%s': growing by %zu bytes would pass max_bytes %zu (%llu held)",
                           a->name, size, a->max_bytes, (unsigned long long)a->st.reserved_bytes);
    if (a->nchunks == a->cap) {
        size_t ncap = a->cap ? a->cap * 2 : 8;
        arena_chunk *n = realloc(a->chunks, ncap * sizeof *n);
        if (!n) return llmem__fail(LLMEM_ENOMEM, "arena '%s': out of memory for metadata", a->name);
        a->chunks = n;
        a->cap = ncap;
    }
    void *p;
    st = llmem_resource_map_tagged(a->res, size, a->align, 0, a->name, &p);
    if (st) return st;
    poison(a, (uintptr_t)p, size);
    size_t before = a->nchunks ? a->chunks[a->nchunks - 1].before + a->chunks[a->nchunks - 1].size : 0;
    a->chunks[a->nchunks++] = (arena_chunk){(uintptr_t)p, size, size, before, (uintptr_t)p};
    a->st.grows_total++;
    update_reserved(a, (int64_t)size);
    return LLMEM_OK;
}

static void release_chunk(llmem_arena *a, arena_chunk *c)
{
    if (!c->mapped) {
        if (a->host) LLMEM_UNPOISON((void *)c->base, c->size); /* hand the caller's buffer back clean */
        return;
    }
    llmem_resource_unmap(a->res, (void *)c->base, c->mapped, c->mapped);
}

static llmem_arena_options defaults(void)
{
    llmem_arena_options o;
    memset(&o, 0, sizeof o);
    o.name = "arena";
    o.chunk_bytes = (size_t)1 << 20;
    return o;
}

llmem_arena_options llmem_arena_options_default(void) { return defaults(); }

llmem_status llmem_arena_create(const llmem_arena_options *opts, llmem_arena **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "arena: null out");
    *out = NULL;
    llmem_arena_options o = opts ? *opts : defaults();
    if (!o.resource) o.resource = llmem_resource_default();
    if (!o.chunk_bytes) o.chunk_bytes = defaults().chunk_bytes;
    bool host = llmem_resource_kind(o.resource) == LLMEM_MEM_HOST;
    if (!o.align) o.align = host ? LLMEM_HOST_ALIGN : LLMEM_DEVICE_ALIGN;
    const char *name = o.name && *o.name ? o.name : "arena";
    if (!llmem__is_pow2(o.align) || o.align > LLMEM_MAX_ALIGN)
        return llmem__fail(LLMEM_EALIGN, "arena '%s': alignment %zu is not a power of two up to 1 GiB", name, o.align);
    if (o.buffer && o.capacity_bytes)
        return llmem__fail(LLMEM_EINVAL, "arena '%s': give a buffer or a capacity, not both", name);
    if (o.buffer && !o.buffer_bytes) return llmem__fail(LLMEM_EINVAL, "arena '%s': buffer of 0 bytes", name);
    if (!o.buffer && o.buffer_bytes) return llmem__fail(LLMEM_EINVAL, "arena '%s': buffer_bytes without a buffer", name);
    if (o.buffer && (uintptr_t)o.buffer > UINTPTR_MAX - o.buffer_bytes)
        return llmem__fail(LLMEM_EOVERFLOW, "arena '%s': buffer range wraps around", name);
    size_t rounded;
    if (!llmem__align_up(o.chunk_bytes, llmem_resource_granularity(o.resource), &rounded))
        return llmem__fail(LLMEM_EOVERFLOW, "arena '%s': chunk_bytes %zu overflows when rounded", name, o.chunk_bytes);

    llmem_arena *a = calloc(1, sizeof *a);
    if (!a) return llmem__fail(LLMEM_ENOMEM, "arena '%s': out of memory", name);
    llmem__copy_name(a->name, sizeof a->name, name, "arena");
    a->res = o.resource;
    a->host = host;
    a->align = o.align;
    a->chunk_bytes = o.chunk_bytes;
    a->max_bytes = o.max_bytes;
    a->id = __atomic_fetch_add(&next_arena_id, 1, __ATOMIC_RELAXED);
    a->st.struct_size = sizeof a->st;
    llmem_status st = LLMEM_OK;
    if (o.buffer) {
        a->fixed = true;
        a->chunks = malloc(sizeof *a->chunks);
        if (!a->chunks) st = llmem__fail(LLMEM_ENOMEM, "arena '%s': out of memory", name);
        else {
            a->cap = a->nchunks = 1;
            a->chunks[0] = (arena_chunk){(uintptr_t)o.buffer, o.buffer_bytes, 0, 0, (uintptr_t)o.buffer};
            poison(a, (uintptr_t)o.buffer, o.buffer_bytes);
            update_reserved(a, (int64_t)o.buffer_bytes);
        }
    } else if (o.capacity_bytes) {
        a->fixed = true;
        a->chunk_bytes = o.capacity_bytes;
        a->max_bytes = 0;
        st = add_chunk(a, o.capacity_bytes);
        if (!st) {
            a->chunks[0].size = o.capacity_bytes; /* exactly what was asked, not the rounding */
            update_reserved(a, 0);
        }
    }
    if (st) {
        free(a->chunks);
        free(a);
        return st;
    }
    if (a->nchunks) {
        a->ptr = a->chunks[0].base;
        a->end = a->ptr + a->chunks[0].size;
    }
    *out = a;
    return LLMEM_OK;
}

void llmem_arena_destroy(llmem_arena *a)
{
    if (!a) return;
    for (size_t i = 0; i < a->nchunks; i++) release_chunk(a, &a->chunks[i]);
    free(a->chunks);
    free(a);
}

static void *fail(llmem_arena *a, llmem_status st, llmem_status *status)
{
    if (a) a->st.failures_total++;
    if (status) *status = st;
    return NULL;
}

/* Move to a later chunk that fits size at align, mapping one if none does.
 * Returns the aligned address or 0 (error recorded). */
static uintptr_t advance(llmem_arena *a, size_t size, size_t align, llmem_status *st)
{
    if (a->fixed) {
        *st = llmem__fail(LLMEM_ECAPACITY,
                          "arena '%s': %zu bytes (alignment %zu) do not fit; fixed capacity %zu, %zu used", a->name,
                          size, align, a->chunks[0].size, a->used);
        return 0;
    }
    size_t need;
    if (!llmem__add_ok(size, align > a->align ? align - a->align : 0, &need)) {
        *st = llmem__fail(LLMEM_EOVERFLOW, "arena '%s': allocation of %zu bytes overflows", a->name, size);
        return 0;
    }
    size_t from = a->nchunks ? a->cur + 1 : 0, i = from;
    for (; i < a->nchunks; i++) {
        uintptr_t p = llmem__align_ptr(a->chunks[i].base, align);
        if (p - a->chunks[i].base <= a->chunks[i].size && size <= a->chunks[i].size - (p - a->chunks[i].base)) break;
    }
    if (i == a->nchunks) {
        *st = add_chunk(a, need);
        if (*st) return 0;
    }
    /* Everything between the cursor and chunk i is passed over and counts
     * as used (waste) until the cursor comes back before it. */
    if (from > 0) {
        a->chunks[a->cur].top = a->ptr;
        for (size_t j = from; j < i; j++) a->chunks[j].top = a->chunks[j].base;
    }
    a->cur = i;
    a->ptr = a->chunks[i].base;
    a->end = a->ptr + a->chunks[i].size;
    a->used = a->chunks[i].before;
    return llmem__align_ptr(a->ptr, align);
}

void *llmem_arena_alloc(llmem_arena *a, size_t size, size_t align, llmem_status *status)
{
    if (!a) return fail(a, llmem__fail(LLMEM_EINVAL, "arena: null arena"), status);
    if (size == 0) return fail(a, llmem__fail(LLMEM_EINVAL, "arena '%s': allocation of 0 bytes", a->name), status);
    if (align == 0) align = a->align;
    if (!llmem__is_pow2(align) || align > LLMEM_MAX_ALIGN)
        return fail(a, llmem__fail(LLMEM_EALIGN, "arena '%s': alignment %zu is not a power of two up to 1 GiB", a->name,
                                   align),
                    status);
    if (size > (size_t)PTRDIFF_MAX)
        return fail(a, llmem__fail(LLMEM_EOVERFLOW, "arena '%s': allocation of %zu bytes overflows", a->name, size),
                    status);
    uintptr_t p = 0;
    if (LLMEM_LIKELY(a->nchunks)) {
        size_t pad = (size_t)(-a->ptr & (align - 1));
        if (pad <= a->end - a->ptr && size <= a->end - a->ptr - pad) p = a->ptr + pad;
    }
    if (LLMEM_UNLIKELY(!p)) {
        llmem_status st;
        p = advance(a, size, align, &st);
        if (!p) return fail(a, st, status);
    }
    a->used += p + size - a->ptr;
    a->requested += size;
    a->ptr = p + size;
    /* The cursor stays in the current chunk; used is its position. */
    llmem__assert(a->ptr <= a->end && a->used == a->chunks[a->cur].before + (a->ptr - a->chunks[a->cur].base));
    llmem__assert(a->requested <= a->used);
    if (a->host) LLMEM_UNPOISON((void *)p, size);
    a->st.allocs_total++;
    if (a->used > a->st.used_peak_bytes) a->st.used_peak_bytes = a->used;
    if (status) *status = LLMEM_OK;
    return (void *)p;
}

llmem_arena_mark llmem_arena_save(const llmem_arena *a)
{
    llmem_arena_mark m = {0};
    if (!a) return m;
    m.arena_id = a->id;
    m.epoch = a->epoch;
    m.chunk = a->cur;
    m.offset = a->nchunks ? (size_t)(a->ptr - a->chunks[a->cur].base) : 0;
    m.used = a->used;
    m.requested = a->requested;
    return m;
}

/* Poison from the new cursor to where the old one was. */
static void poison_back(llmem_arena *a, size_t old_cur, uintptr_t old_ptr)
{
    if (!a->host) return;
    if (old_cur == a->cur) {
        poison(a, a->ptr, old_ptr - a->ptr);
        return;
    }
    poison(a, a->ptr, a->end - a->ptr);
    for (size_t j = a->cur + 1; j < old_cur; j++) poison(a, a->chunks[j].base, a->chunks[j].size);
    poison(a, a->chunks[old_cur].base, old_ptr - a->chunks[old_cur].base);
}

llmem_status llmem_arena_rollback(llmem_arena *a, llmem_arena_mark m)
{
    if (!a) return llmem__fail(LLMEM_EINVAL, "arena: null arena");
    if (m.arena_id != a->id) return llmem__fail(LLMEM_EINVAL, "arena '%s': rollback to another arena's mark", a->name);
    if (m.epoch != a->epoch)
        return llmem__fail(LLMEM_ESTATE, "arena '%s': rollback to a mark taken before the last reset", a->name);
    if (m.requested > m.used)
        return llmem__fail(LLMEM_EINVAL, "arena '%s': rollback to a damaged mark (requested %zu > used %zu)", a->name,
                           m.requested, m.used);
    if (!a->nchunks) {
        /* No chunk (never grown, or all trimmed): only the origin exists. */
        if (m.chunk || m.offset || m.used)
            return llmem__fail(LLMEM_ESTATE,
                               "arena '%s': rollback to a mark ahead of the cursor (already rolled back past it)",
                               a->name);
        a->st.rollbacks_total++;
        return LLMEM_OK;
    }
    size_t off = (size_t)(a->ptr - a->chunks[a->cur].base);
    if (m.chunk > a->cur || (m.chunk == a->cur && m.offset > off) || m.offset > a->chunks[m.chunk].size)
        return llmem__fail(LLMEM_ESTATE, "arena '%s': rollback to a mark ahead of the cursor (already rolled back past it)",
                           a->name);
    size_t old_cur = a->cur;
    uintptr_t old_ptr = a->ptr;
    a->cur = m.chunk;
    a->ptr = a->chunks[m.chunk].base + m.offset;
    a->end = a->chunks[m.chunk].base + a->chunks[m.chunk].size;
    /* used follows from the position (chunks before it may have been
     * trimmed and mapped again with other sizes since the mark was taken);
     * requested is the mark's figure, never above used. */
    a->used = a->chunks[m.chunk].before + m.offset;
    a->requested = m.requested < a->used ? m.requested : a->used;
    llmem__assert(a->ptr <= a->end);
    poison_back(a, old_cur, old_ptr);
    a->st.rollbacks_total++;
    return LLMEM_OK;
}

void llmem_arena_reset(llmem_arena *a)
{
    if (!a) return;
    a->epoch++;
    a->st.resets_total++;
    if (!a->nchunks) return;
    size_t old_cur = a->cur;
    uintptr_t old_ptr = a->ptr;
    a->cur = 0;
    a->ptr = a->chunks[0].base;
    a->end = a->ptr + a->chunks[0].size;
    a->used = a->requested = 0;
    poison_back(a, old_cur, old_ptr);
}

size_t llmem_arena_trim(llmem_arena *a)
{
    if (!a || a->fixed || !a->nchunks) return 0;
    size_t released = 0;
    while (a->nchunks > a->cur + 1) {
        arena_chunk *c = &a->chunks[a->nchunks - 1];
        if (llmem_resource_unmap(a->res, (void *)c->base, c->mapped, c->mapped) != LLMEM_OK) break;
        released += c->mapped;
        a->nchunks--;
        a->st.releases_total++;
        update_reserved(a, -(int64_t)c->mapped);
    }
    /* A reset arena holding nothing gives back its last chunk too. */
    if (a->used == 0 && a->nchunks == 1) {
        arena_chunk *c = &a->chunks[0];
        if (llmem_resource_unmap(a->res, (void *)c->base, c->mapped, c->mapped) == LLMEM_OK) {
            released += c->mapped;
            a->nchunks = 0;
            a->cur = 0;
            a->ptr = a->end = 0;
            a->st.releases_total++;
            update_reserved(a, -(int64_t)c->mapped);
        }
    }
    return released;
}

bool llmem_arena_owns(const llmem_arena *a, const void *ptr)
{
    if (!a || !ptr || !a->nchunks) return false;
    uintptr_t p = (uintptr_t)ptr;
    for (size_t i = 0; i <= a->cur; i++) {
        uintptr_t lim = i == a->cur ? a->ptr : a->chunks[i].top;
        if (p >= a->chunks[i].base && p < lim) return true;
    }
    return false;
}

llmem_status llmem_arena_get_stats(const llmem_arena *a, llmem_arena_stats *out)
{
    if (!a || !out) return llmem__fail(LLMEM_EINVAL, "arena stats: null argument");
    llmem_arena_stats s = a->st;
    s.used_bytes = a->used;
    s.requested_bytes = a->requested;
    s.waste_bytes = a->used - a->requested;
    s.chunks = a->nchunks;
    return llmem__stats_out(out, &s, sizeof s);
}

LLMEM__STATS_SCHEMA_OF(llmem_arena_stats_schema, "arena", llmem_arena_stats, LLMEM_ARENA_STATS_FIELDS)
