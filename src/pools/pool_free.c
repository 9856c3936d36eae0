/*
 * pool_free.c - the dynamic pool's locked free path, realloc, and the
 * pointer queries (usable_size, owns).
 *
 * Algorithm. A pointer is located in three steps: the process-wide address
 * map gives its superblock (and so its pool), the superblock's owner table
 * its block, and for a slab the class size gives the block index (exact
 * division by multiplication, llmem__pool_slab_index). What it is decides
 * the outcome: the start of a live block is freed; anything else (not ours,
 * in a free run, a free slab block, inside a live block, a damaged guard
 * header, a block whose fenced free is pending) is refused with its own
 * status and message, counted in invalid_frees_total, and nothing changes.
 *
 * Invariants: a refused free changes no block; a handle's block is freed
 * only through llmem_pool_handle_free; realloc leaves the old block untouched on
 * every failure.
 *
 * Locking: the pool lock is held for every function here (the public calls
 * take it).
 */
#include <pthread.h>
#include <string.h>

#include "addrmap.h"
#include "pool_internal.h"

/* ---- free --------------------------------------------------------------- */

/* What a pointer is, found under the lock. */
typedef struct located {
    superblock *sb;
    pblock *b;       /* D_SLAB or D_LARGE descriptor */
    uint32_t idx;    /* slab block index */
    uintptr_t block; /* block start */
    size_t off;      /* offset into the block, when not its start */
    size_t extent;   /* size of the run or block found, for messages */
} located;

typedef enum where {
    AT_BLOCK = 0,    /* the start of a live block */
    NOT_OURS,        /* not in this pool */
    IN_FREE_RUN,     /* in a free run: freed already */
    FREE_SLAB_BLOCK, /* a slab block that is free: freed already */
    INSIDE_BLOCK,    /* inside a live block, not its start */
    BAD_HEADER,      /* checked host: the guard header is damaged */
    NOT_A_BLOCK,     /* in a superblock but no block starts there */
    FENCED,          /* a live block whose fenced free is pending */
    IN_TCACHE        /* in a large block freed into a thread cache: freed already */
} where;

/* Find the block containing a in a superblock: the nearest owner entry at
 * or before it. Lock held. */
static pblock *containing(const llmem_pool *p, const superblock *sb, uintptr_t a)
{
    for (size_t u = unit_of(sb, a, p->ushift) + 1; u-- > 0;) {
        pblock *b = sb->owner[u];
        if (b) return a < b->start + b->size ? b : NULL;
    }
    return NULL;
}

/* Where ptr lies. No side effect. Lock held. */
static where find_block_raw(const llmem_pool *p, uintptr_t a, located *l)
{
    memset(l, 0, sizeof *l);
    superblock *sb = llmem__addrmap_get(a);
    if (!sb || sb->pool != p) return NOT_OURS;
    l->sb = sb;
    pblock *b = sb->owner[unit_of(sb, a, p->ushift)];
    l->b = b;
    if (b && b->kind == D_SLAB) {
        slab *s = (slab *)b;
        size_t csize = p->cls.size[b->cls], off = a - b->start;
        uint32_t idx = (uint32_t)(off / csize);
        if (idx >= s->nblocks) return NOT_A_BLOCK; /* the slab's tail, past its last block */
        l->extent = csize;
        l->idx = idx;
        l->block = b->start + (uintptr_t)idx * csize;
        l->off = off % csize;
        if (p->checked && p->host) {
            /* The user pointer sits g bytes into its block. */
            if (idx >= s->carved || !state_get(slab_state(s, idx))) return FREE_SLAB_BLOCK;
            size_t n, g;
            if (!llmem__pool_guards_header(l->block, &n, &g)) return BAD_HEADER;
            if (l->block + g != a) return INSIDE_BLOCK;
            return AT_BLOCK;
        }
        if (!llmem__pool_slab_index(p, b->cls, (uint32_t)off, &idx)) return INSIDE_BLOCK;
        if (idx >= s->carved || !state_get(slab_state(s, idx))) return FREE_SLAB_BLOCK;
        /* Pools with marks: free in a thread or transfer cache. */
        if (state_get(slab_state(s, idx)) == STATE_OUT && mark_load(l->block) == block_mark(p, l->block))
            return FREE_SLAB_BLOCK;
        return AT_BLOCK;
    }
    if (b && b->kind == D_LARGE && b->user == a) {
        l->block = b->start;
        l->extent = b->size;
        return __atomic_load_n(&b->tcached, __ATOMIC_RELAXED) ? IN_TCACHE : AT_BLOCK;
    }
    pblock *c = containing(p, sb, a);
    if (!c) return NOT_A_BLOCK;
    l->b = c;
    l->extent = c->size;
    if (c->kind == D_FREE || c->kind == D_CACHED) return IN_FREE_RUN;
    if (c->kind == D_LARGE && __atomic_load_n(&c->tcached, __ATOMIC_RELAXED)) return IN_TCACHE;
    if (c->kind == D_LARGE) {
        l->off = a - c->user;
        return INSIDE_BLOCK;
    }
    return NOT_A_BLOCK;
}

/* find_block_raw, and FENCED for a block whose fenced free is pending. */
static where find_block(const llmem_pool *p, uintptr_t a, located *l)
{
    where w = find_block_raw(p, a, l);
    if (w == AT_BLOCK && p->nfenced &&
        (l->b->kind == D_LARGE ? l->b->fenced : llmem__pool_fenced_has(p, a)))
        return FENCED;
    return w;
}

/* Count, log and describe a refused free. Lock held. */
static llmem_status refuse_free(llmem_pool *p, uintptr_t a, where w, const located *l)
{
    ST_ADD(p->st.invalid_frees_total, 1);
    void *ptr = (void *)a;
    switch (w) {
    case NOT_OURS:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EFOREIGN, "pool '%s': free of %p, which is not from this pool",
                               p->name, ptr);
    case IN_FREE_RUN:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EDOUBLEFREE,
                               "pool '%s': double free of %p (it lies in a free run of %zu bytes)", p->name, ptr,
                               l->extent);
    case FREE_SLAB_BLOCK:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EDOUBLEFREE,
                               "pool '%s': double free of %p (block %u of a %zu-byte class slab is free)", p->name,
                               ptr, l->idx, l->extent);
    case INSIDE_BLOCK:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EFOREIGN,
                               "pool '%s': free of %p, %zu bytes into a live %zu-byte block, not its start", p->name,
                               ptr, l->off, l->extent);
    case IN_TCACHE:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EDOUBLEFREE,
                               "pool '%s': double free of %p (it lies in a %zu-byte block freed to a thread cache)",
                               p->name, ptr, l->extent);
    case FENCED:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EDOUBLEFREE,
                               "pool '%s': double free of %p (its fenced free is pending)", p->name, ptr);
    case BAD_HEADER:
        ST_ADD(p->st.corruptions_total, 1);
        return llmem__fail_log(LLMEM_LOG_ERROR, LLMEM_ECORRUPT,
                               "pool '%s': free of %p: the guard header of its %zu-byte block at %p is damaged",
                               p->name, ptr, l->extent, (void *)l->block);
    default:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EFOREIGN,
                               "pool '%s': free of %p, which is not the start of a live block", p->name, ptr);
    }
}

static llmem_status free_located(llmem_pool *p, uintptr_t a, located *l)
{
    llmem_status st = LLMEM_OK;
    pblock *b = l->b;
    if (b->kind == D_SLAB) {
        slab *s = (slab *)b;
        size_t csize = p->cls.size[b->cls];
        if (p->checked) {
            if (p->host) {
                size_t n = 0, g = 0;
                if (!llmem__pool_guards_header(l->block, &n, &g) || !llmem__pool_guards_intact(l->block, csize, a, n)) {
                    ST_ADD(p->st.corruptions_total, 1);
                    st = llmem__fail_log(LLMEM_LOG_ERROR, LLMEM_ECORRUPT,
                                         "pool '%s': guard canary around the %zu-byte block at %p (%zu bytes asked) "
                                         "is damaged: something wrote out of bounds; the block is freed",
                                         p->name, csize, (void *)a, n);
                }
            }
        }
        state_set(slab_state(s, l->idx), 0);
        ST_ADD(p->central[b->cls].frees, 1);
        llmem__pool_small_put(p, s, l->block, l->idx);
    } else {
        if (p->checked && p->host && !llmem__pool_guards_intact(b->start, b->size, b->user, b->requested)) {
            ST_ADD(p->st.corruptions_total, 1);
            st = llmem__fail_log(LLMEM_LOG_ERROR, LLMEM_ECORRUPT,
                                 "pool '%s': guard canary around the block at %p (%zu bytes asked) is damaged: "
                                 "something wrote out of bounds; the block is freed",
                                 p->name, (void *)a, b->requested);
        }
        superblock *sb = l->sb;
        if (b->user != b->start) sb->owner[unit_of(sb, b->user, p->ushift)] = NULL;
        ST_SUB(p->st.used_bytes, b->size);
        ST_SUB(p->st.live_allocations, 1);
        llmem__pool_put_large(p, b);
    }
    ST_ADD(p->st.frees_total, 1);
    return st;
}

/* The rules of every free (`what` names the call in messages): a live raw
 * block of this pool, not a handle's, not pending a fenced free; else the
 * refusal, counted and logged. Lock held. */
static llmem_status check_free(llmem_pool *p, uintptr_t a, located *l, const char *what)
{
    where w = find_block(p, a, l);
    if (w != AT_BLOCK) return refuse_free(p, a, w, l);
    if (l->b->kind == D_LARGE && l->b->handle) {
        ST_ADD(p->st.invalid_frees_total, 1);
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EINVAL,
                               "pool '%s': %s of %p, which belongs to a handle: use llmem_pool_handle_free", p->name, what,
                               (void *)a);
    }
    return LLMEM_OK;
}

llmem_status llmem__pool_validate_free(llmem_pool *p, uintptr_t a, size_t *bytes, pblock **b)
{
    located l;
    llmem_status st = check_free(p, a, &l, "fenced free");
    if (st) return st;
    *bytes = l.b->kind == D_SLAB ? p->cls.size[l.b->cls] : l.b->size;
    *b = l.b;
    return LLMEM_OK;
}

llmem_status llmem__pool_free_locked(llmem_pool *p, uintptr_t a, const char *what)
{
    located l;
    llmem_status st = check_free(p, a, &l, what);
    return st ? st : free_located(p, a, &l);
}

llmem_status llmem__pool_free_valid(llmem_pool *p, uintptr_t a)
{
    located l;
    where w = find_block_raw(p, a, &l);
    if (w != AT_BLOCK) return refuse_free(p, a, w, &l); /* cannot happen: the block was validated */
    return free_located(p, a, &l);
}


/* Usable bytes at a located block. Lock held. */
static size_t usable_locked(const llmem_pool *p, uintptr_t a, const located *l)
{
    if (l->b->kind == D_SLAB) {
        size_t csize = p->cls.size[l->b->cls];
        if (p->checked && p->host) {
            size_t n, g;
            return llmem__pool_guards_header(l->block, &n, &g) ? n : 0;
        }
        return csize;
    }
    if (p->checked && p->host) return l->b->requested;
    return l->b->start + l->b->size - a;
}

size_t llmem_pool_usable_size(const llmem_pool *cp, const void *ptr)
{
    if (!cp || !ptr) return 0;
    llmem_pool *p = (llmem_pool *)(uintptr_t)cp; /* the lock is internal state */
    pthread_mutex_lock(&p->lock);
    located l;
    size_t n = find_block(p, (uintptr_t)ptr, &l) == AT_BLOCK ? usable_locked(p, (uintptr_t)ptr, &l) : 0;
    pthread_mutex_unlock(&p->lock);
    return n;
}

static void *pool_realloc(llmem_pool *p, void *ptr, size_t size, llmem_status *status)
{
    if (!p) return llmem__pool_alloc_failed(llmem__fail(LLMEM_EINVAL, "pool: null pool"), status);
    if (!ptr) return llmem_pool_alloc(p, size, status);
    if (size == 0)
        return llmem__pool_alloc_failed(llmem__fail(LLMEM_EINVAL, "pool '%s': realloc to 0 bytes (free it instead)", p->name),
                            status);
    if (size > (size_t)PTRDIFF_MAX)
        return llmem__pool_alloc_failed(llmem__fail(LLMEM_EOVERFLOW, "pool '%s': realloc to %zu bytes overflows", p->name, size),
                            status);
    uintptr_t a = (uintptr_t)ptr;
    pthread_mutex_lock(&p->lock);
    located l;
    where w = find_block(p, a, &l);
    if (w != AT_BLOCK || (l.b->kind == D_LARGE && l.b->handle)) {
        llmem_status st = w != AT_BLOCK ? refuse_free(p, a, w, &l)
                                        : llmem__fail(LLMEM_EINVAL, "pool '%s': realloc of %p, which belongs to a handle",
                                                      p->name, ptr);
        pthread_mutex_unlock(&p->lock);
        return llmem__pool_alloc_failed(st, status);
    }
    size_t usable = usable_locked(p, a, &l);
    bool guarded = p->checked && p->host;
    /* Fits and does not waste more than half: stay in place. Guarded blocks
     * only if the guards can be moved within the block. */
    size_t room = guarded ? (l.b->kind == D_SLAB ? p->cls.size[l.b->cls] : l.b->size) - (a - l.block) - GUARD_TAIL
                          : usable;
    if (size <= room && size >= usable / 2) {
        if (guarded) {
            size_t bsize = l.b->kind == D_SLAB ? p->cls.size[l.b->cls] : l.b->size;
            if (l.b->kind == D_LARGE) l.b->requested = size;
            LLMEM_UNPOISON(ptr, size);
            llmem__pool_guards_write(l.block, bsize, a, size);
        } else if (p->host) {
            LLMEM_UNPOISON(ptr, size);
        }
        pthread_mutex_unlock(&p->lock);
        if (status) *status = LLMEM_OK;
        return ptr;
    }
    /* A large block that grows: into the free run after it, if there is
     * one long enough (no copy, no second block). Unguarded blocks only. */
    size_t pages;
    if (l.b->kind == D_LARGE && !guarded && size > usable &&
        llmem__align_up(size + (a - l.b->start), p->unit, &pages)) {
        size_t before = l.b->size;
        if (llmem__pool_grow_in_place(p, l.b, pages)) {
            ST_ADD(p->st.used_bytes, l.b->size - before);
            l.b->requested = size;
            if (p->host) LLMEM_UNPOISON(ptr, size);
            llmem__pool_note_peak(p);
            pthread_mutex_unlock(&p->lock);
            if (status) *status = LLMEM_OK;
            return ptr;
        }
    }
    llmem_status st;
    void *n = llmem__pool_alloc_locked(p, size, p->align, &st);
    if (!n) {
        ST_ADD(p->st.failures_total, 1);
        pthread_mutex_unlock(&p->lock);
        return llmem__pool_alloc_failed(st, status);
    }
    size_t keep = usable < size ? usable : size;
    if (p->host) {
        LLMEM_UNPOISON(ptr, keep); /* release mode does not know how much of the old block was asked for */
        memcpy(n, ptr, keep);
    } else {
        st = llmem_resource_copy(p->res, n, ptr, keep);
        if (st) {
            located nl;
            find_block(p, (uintptr_t)n, &nl);
            free_located(p, (uintptr_t)n, &nl);
            ST_SUB(p->st.allocs_total, 1); /* the move never happened */
            ST_SUB(p->st.frees_total, 1);
            ST_ADD(p->st.failures_total, 1);
            pthread_mutex_unlock(&p->lock);
            return llmem__pool_alloc_failed(st, status);
        }
    }
    free_located(p, a, &l);
    pthread_mutex_unlock(&p->lock);
    if (status) *status = LLMEM_OK;
    return n;
}

bool llmem_pool_owns(const llmem_pool *cp, const void *ptr)
{
    if (!cp || !ptr) return false;
    llmem_pool *p = (llmem_pool *)(uintptr_t)cp;
    pthread_mutex_lock(&p->lock);
    located l;
    where w = find_block(p, (uintptr_t)ptr, &l);
    pthread_mutex_unlock(&p->lock);
    return w == AT_BLOCK || w == INSIDE_BLOCK;
}

void *llmem_pool_realloc(llmem_pool *p, void *ptr, size_t size, llmem_status *status)
{
    void *r = pool_realloc(p, ptr, size, status);
    POOL_WALK(p);
    return r;
}
