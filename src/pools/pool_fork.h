/*
 * pool_fork.h - fork hooks of the dynamic pool (pool_fork.c), for a
 * process allocator built on one pool (src/shim). Not installed.
 *
 * fork() copies one thread; a lock another thread held at that moment
 * stays held for ever in the child. A caller that registers these with
 * pthread_atfork (prepare / parent / child) makes the child find the pool
 * consistent and unlocked, so children may allocate.
 *
 * The pool must use LLMEM_POOL_PURGE_MANUAL (no background thread, which
 * would not exist in the child). Blocks in the thread caches of threads
 * that do not exist in the child stay there: the child never reuses them
 * (at most one cache's worth per such thread).
 */
#ifndef LLMEM_POOL_FORK_H
#define LLMEM_POOL_FORK_H

#include "llmem/pool.h"

/* Take the pool lock: waits for every operation under way to finish. */
void llmem__pool_fork_prepare(llmem_pool *p);
/* In the parent after fork: release it. */
void llmem__pool_fork_parent(llmem_pool *p);
/* In the child: the only thread; the lock is re-initialised unlocked. */
void llmem__pool_fork_child(llmem_pool *p);

#endif
