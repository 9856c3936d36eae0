/*
 * pool_purge.c - the background purger: one thread for the process that
 * gives pools' free memory back to their resources after the decay delay.
 *
 * Algorithm. Pools with LLMEM_POOL_PURGE_BACKGROUND register here at create.
 * The thread sleeps until the oldest pending item of any registered pool (an
 * empty superblock, a free run not yet decommitted) has waited the pool's
 * decay delay, then unmaps or decommits it; with nothing pending it sleeps
 * until a pool kicks it (llmem__pool_purger_kick, from every put of pages
 * and every new superblock).
 *
 * Invariants: the purger never makes an application thread wait: it takes
 * pool locks with trylock only and retries a busy pool 10 ms later. A kick
 * is never lost: either the purger reads the new kick count before it
 * sleeps, or the kicker reads its sleeping flag and signals. Lock order: a
 * pool's lock, then the purger's (kick); the purger holds its own and only
 * tries pool locks, so unregister (under the purger's lock) waits for any
 * pass over the pool to end.
 */
#include <pthread.h>
#include <time.h>

#include "pool_internal.h"

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    llmem_pool *pools;
    bool started, sleeping;
    uint64_t kicks; /* bumped by every kick; the purger rescans if it moved */
} purger = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, false, false, 0};

/* Something became free: make sure the purger sees it. Either the purger
 * reads the new kick count before it sleeps, or this reads its sleeping
 * flag and signals (both sides use sequentially consistent order). */
void llmem__pool_purger_kick(const llmem_pool *p)
{
    if (!p->purge_background) return;
    __atomic_add_fetch(&purger.kicks, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&purger.sleeping, __ATOMIC_SEQ_CST)) return;
    pthread_mutex_lock(&purger.lock);
    pthread_cond_signal(&purger.wake);
    pthread_mutex_unlock(&purger.lock);
}

/* Give back what has waited the decay delay; return when the next pending
 * item will have, or UINT64_MAX. Pool lock held. */
static uint64_t purge_pass(llmem_pool *p, uint64_t now)
{
    uint64_t next = llmem__pool_reclaim_idle(p, now), c = llmem__pool_cache_purge(p, now);
    if (c < next) next = c;
    for (superblock *sb = p->empties, *n; sb; sb = n) {
        n = sb->enext;
        if (now - sb->empty_since >= p->decay_ns) llmem__pool_release_sb(p, sb);
        else if (sb->empty_since + p->decay_ns < next) next = sb->empty_since + p->decay_ns;
    }
    for (unsigned h = 0; h < HEAPS; h++)
        for (llmem__avl_node *x = llmem__avl_first(&p->free_tree[h]); x; x = llmem__avl_next(x)) {
            pblock *b = node_block(x);
            if (b->purged) continue;
            if (now - b->free_since >= p->decay_ns) {
                llmem__pool_decommit_block(p, b, SIZE_MAX);
                b->purged = true;
            } else if (b->free_since + p->decay_ns < next) {
                next = b->free_since + p->decay_ns;
            }
        }
    return next;
}

static void *purger_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&purger.lock);
    for (;;) {
        uint64_t seen = __atomic_load_n(&purger.kicks, __ATOMIC_SEQ_CST);
        uint64_t now = llmem__pool_clock(), next = UINT64_MAX;
        for (llmem_pool *p = purger.pools; p; p = p->purge_next) {
            if (pthread_mutex_trylock(&p->lock) == 0) {
                uint64_t t = purge_pass(p, now);
                pthread_mutex_unlock(&p->lock);
                if (t < next) next = t;
            } else if (now + 10000000u < next) {
                next = now + 10000000u; /* busy: look again in 10 ms */
            }
        }
        if (next == UINT64_MAX) {
            __atomic_store_n(&purger.sleeping, true, __ATOMIC_SEQ_CST);
            if (__atomic_load_n(&purger.kicks, __ATOMIC_SEQ_CST) == seen) pthread_cond_wait(&purger.wake, &purger.lock);
            __atomic_store_n(&purger.sleeping, false, __ATOMIC_SEQ_CST);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t wait = next > now ? next - now : 0;
            wait += 1000000u; /* a little past the deadline, so it has passed */
            ts.tv_sec += (time_t)(wait / 1000000000u);
            ts.tv_nsec += (long)(wait % 1000000000u);
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&purger.wake, &purger.lock, &ts);
        }
    }
    return NULL;
}

llmem_status llmem__pool_purger_register(llmem_pool *p)
{
    pthread_mutex_lock(&purger.lock);
    if (!purger.started) {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_destroy(&purger.wake);
        pthread_cond_init(&purger.wake, &ca);
        pthread_condattr_destroy(&ca);
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        bool ok = pthread_create(&t, &a, purger_main, NULL) == 0;
        pthread_attr_destroy(&a);
        if (!ok) {
            pthread_mutex_unlock(&purger.lock);
            return llmem__fail(LLMEM_EOS, "pool '%s': cannot start the background purge thread", p->name);
        }
        purger.started = true;
    }
    p->purge_next = purger.pools;
    purger.pools = p;
    pthread_cond_signal(&purger.wake);
    pthread_mutex_unlock(&purger.lock);
    return LLMEM_OK;
}

void llmem__pool_purger_unregister(llmem_pool *p)
{
    pthread_mutex_lock(&purger.lock); /* waits for a pass over p to end */
    for (llmem_pool **q = &purger.pools; *q; q = &(*q)->purge_next)
        if (*q == p) {
            *q = p->purge_next;
            break;
        }
    pthread_mutex_unlock(&purger.lock);
}

