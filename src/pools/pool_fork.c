/*
 * pool_fork.c - fork hooks of the dynamic pool (see pool_fork.h).
 *
 * Everything a pool operation changes under the pool lock (slabs, free
 * runs, superblocks, the descriptor pool, the address map, the resource)
 * is changed only with the pool lock held, so holding it across fork
 * leaves the child a consistent pool. Thread-cache fast paths take no
 * lock but touch only their own thread's cache, which the child either
 * owns (the forking thread) or never touches again.
 */
#include "pool_fork.h"

#include "pool_internal.h"

void llmem__pool_fork_prepare(llmem_pool *p)
{
    if (p) pthread_mutex_lock(&p->lock);
}

void llmem__pool_fork_parent(llmem_pool *p)
{
    if (p) pthread_mutex_unlock(&p->lock);
}

void llmem__pool_fork_child(llmem_pool *p)
{
    if (p) pthread_mutex_init(&p->lock, NULL);
}
