/*
 * pool_fence.c - stream-ordered release: frees that wait for a fence.
 *
 * A fenced free validates the block at once (the same refusals as a plain
 * free) and appends {block, fence} to the pool's pending list, oldest
 * first; the block stays allocated until the fence is done. Large blocks
 * carry a flag so a second free of a pending block is refused in O(1);
 * small blocks are looked up in the list when a call reaches the slow path
 * (a release pool's thread-cache free checks nothing, see pool.h).
 *
 * Completion happens under the pool lock when the pool polls (slow paths,
 * llmem_pool_poll_fenced): done() must not block, so polling under the lock
 * is cheap (cudaEventQuery is a few microseconds). Waiting is different: the
 * oldest entry is taken off the list, the lock is dropped for the wait, and
 * the free completes when it is taken again. The block keeps its flag while
 * off the list, and the pending figures still count it, so no other thread
 * can free it or see it vanish from the stats early.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmem/profile.h"
#include "pool_internal.h"

typedef struct fenced_free {
    uintptr_t ptr;
    size_t bytes;
    pblock *large; /* the block, for large blocks (its fenced flag) */
    llmem_fence fence;
} fenced_free;

static void fence_drop(llmem_fence *f)
{
    if (f->drop) f->drop(f->fence);
}

/* Poll done() with growing sleeps (50 us to 5 ms): fences without wait(). */
static llmem_status fence_wait(llmem_fence *f)
{
    if (f->wait) return f->wait(f->fence);
    long ns = 50000;
    while (!f->done(f->fence)) {
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 5000000) ns *= 2;
    }
    return LLMEM_OK;
}

/* Free an entry's block and drop its fence. Lock held. */
static void complete(llmem_pool *p, fenced_free *e)
{
    if (e->large) e->large->fenced = false;
    llmem__pool_free_valid(p, e->ptr);
    ST_SUB(p->st.fenced_pending, 1);
    ST_SUB(p->st.fenced_pending_bytes, e->bytes);
    fence_drop(&e->fence);
}

bool llmem__pool_fenced_has(const llmem_pool *p, uintptr_t a)
{
    for (uint32_t i = 0; i < p->nfenced; i++)
        if (p->fenced[i].ptr == a) return true;
    return false;
}

size_t llmem__pool_poll_fenced_locked(llmem_pool *p)
{
    uint32_t kept = 0;
    size_t done = 0;
    for (uint32_t i = 0; i < p->nfenced; i++) {
        fenced_free *e = &p->fenced[i];
        if (e->fence.done(e->fence.fence)) {
            complete(p, e);
            done++;
        } else {
            p->fenced[kept++] = *e;
        }
    }
    p->nfenced = kept;
    return done;
}

bool llmem__pool_wait_one_fenced(llmem_pool *p, bool forced)
{
    if (!p->nfenced) return false;
    fenced_free e = p->fenced[0];
    memmove(&p->fenced[0], &p->fenced[1], (size_t)(p->nfenced - 1) * sizeof *p->fenced);
    p->nfenced--;
    if (forced) ST_ADD(p->st.fence_waits_total, 1);
    pthread_mutex_unlock(&p->lock);
    llmem_status st = fence_wait(&e.fence);
    pthread_mutex_lock(&p->lock);
    if (st)
        llmem__log(LLMEM_LOG_ERROR, "pool '%s': waiting for the fence of %p failed (%s); the block is freed", p->name,
                   (void *)e.ptr, llmem_status_name(st));
    complete(p, &e);
    return true;
}

void llmem__pool_drop_fenced(llmem_pool *p)
{
    for (uint32_t i = 0; i < p->nfenced; i++) fence_drop(&p->fenced[i].fence);
    free(p->fenced);
    p->fenced = NULL;
    p->nfenced = p->capfenced = 0;
}

llmem_status llmem_pool_free_fenced(llmem_pool *p, void *ptr, const llmem_fence *f)
{
    if (!f || !f->done) {
        if (f) {
            llmem_fence copy = *f;
            fence_drop(&copy);
        }
        return llmem__fail(LLMEM_EINVAL, "pool%s%s%s: fenced free without a fence (done() is required)",
                           p ? " '" : "", p ? p->name : "", p ? "'" : "");
    }
    llmem_fence fence = *f;
    if (!p) {
        fence_drop(&fence);
        return llmem__fail(LLMEM_EINVAL, "pool: null pool");
    }
    if (!ptr) {
        fence_drop(&fence);
        return LLMEM_OK;
    }
    uintptr_t a = (uintptr_t)ptr;
    pthread_mutex_lock(&p->lock);
    size_t bytes = 0;
    pblock *b = NULL;
    bool done = fence.done(fence.fence);
    /* Nothing in flight: an ordinary free. Else the block waits. */
    llmem_status st = done ? llmem__pool_free_locked(p, a, "fenced free") : llmem__pool_validate_free(p, a, &bytes, &b);
    if (!st && p->profile) llmem_profile_record_free(p->profile, ptr); /* the caller is done with it now */
    if (st || done) {
        pthread_mutex_unlock(&p->lock);
        fence_drop(&fence);
        return st;
    }
    if (p->nfenced == p->capfenced) {
        uint32_t ncap = p->capfenced ? p->capfenced * 2 : 16;
        fenced_free *n = ncap > p->capfenced ? realloc(p->fenced, (size_t)ncap * sizeof *n) : NULL;
        if (!n) {
            /* No room to remember it: the only safe free is after the fence. */
            pthread_mutex_unlock(&p->lock);
            if (!fence.wait) {
                fence_drop(&fence);
                return llmem__fail(LLMEM_ENOMEM, "pool '%s': no memory to queue the fenced free of %p; it stays live",
                                   p->name, ptr);
            }
            st = fence_wait(&fence);
            fence_drop(&fence);
            if (st) return st;
            pthread_mutex_lock(&p->lock);
            st = llmem__pool_free_locked(p, a, "fenced free");
            pthread_mutex_unlock(&p->lock);
            return st;
        }
        p->fenced = n;
        p->capfenced = ncap;
    }
    bool large = b->kind == D_LARGE;
    if (large) b->fenced = true;
    else { /* its state byte says so, so that the free fast path sends a second free to the lock */
        slab *s = (slab *)b;
        state_set(slab_state(s, (uint32_t)((a - s->b.start) / p->cls.size[s->b.cls])), 2);
    }
    p->fenced[p->nfenced++] = (fenced_free){a, bytes, large ? b : NULL, fence};
    ST_ADD(p->st.fenced_pending, 1);
    ST_ADD(p->st.fenced_pending_bytes, bytes);
    ST_ADD(p->st.fenced_frees_total, 1);
    pthread_mutex_unlock(&p->lock);
    return LLMEM_OK;
}

size_t llmem_pool_poll_fenced(llmem_pool *p)
{
    if (!p) return 0;
    pthread_mutex_lock(&p->lock);
    size_t n = p->nfenced ? llmem__pool_poll_fenced_locked(p) : 0;
    pthread_mutex_unlock(&p->lock);
    return n;
}

size_t llmem_pool_drain_fenced(llmem_pool *p)
{
    if (!p) return 0;
    size_t n = 0;
    pthread_mutex_lock(&p->lock);
    n += p->nfenced ? llmem__pool_poll_fenced_locked(p) : 0;
    while (llmem__pool_wait_one_fenced(p, false)) n++; /* asked for, not forced by an allocation */
    pthread_mutex_unlock(&p->lock);
    return n;
}
