/*
 * pool_shim.h - what a process allocator built on one pool (src/shim,
 * libllmem-malloc.so) needs from the pool's internals: fork hooks, and a
 * usable-size query that takes no lock (pool_shim.c). Not installed.
 *
 * fork hooks:
 * fork() copies one thread; a lock another thread held at that moment
 * stays held for ever in the child. A caller that registers these with
 * pthread_atfork (prepare / parent / child) makes the child find the pool
 * consistent and unlocked, so children may allocate.
 *
 * The pool must use LLMEM_POOL_PURGE_MANUAL (no background thread, which
 * would not exist in the child). Blocks in the thread caches of threads
 * that do not exist in the child stay there (at most one cache's worth per
 * such thread) until a shrink (malloc_trim) finds the cache idle past the
 * decay and takes them back, as it does for an idle live thread's.
 */
#ifndef LLMEM_POOL_SHIM_H
#define LLMEM_POOL_SHIM_H

#include <stdint.h>

#include "llmem/pool.h"

/* Take every lock of the pool, in a fixed order (the pool lock, each
 * class's transfer-cache lock, the thread-cache list lock): waits for
 * every operation under way to finish. */
void llmem__pool_fork_prepare(llmem_pool *p);
/* In the parent after fork: release them, in the reverse order. */
void llmem__pool_fork_parent(llmem_pool *p);
/* In the child: the only thread; every one is re-initialised unlocked. */
void llmem__pool_fork_child(llmem_pool *p);

/* The shim's malloc and free fast paths: the pool's thread-cache hit
 * and push (pool_internal.h), here so that the shim's entry points reach
 * them in one jump, with no frame of their own. Each is called with the
 * pool made and the thread outside any pool call (the shim's `inside`
 * flag clear), and does nothing but the hit or the push: anything else
 * it hands on, by a tail call, to the shim's own path for the call
 * (llmem__shim_alloc_miss, llmem__shim_free_miss: defined by the shim),
 * which does what the shim did before. Before, malloc and free set the
 * flag around a call of llmem_pool_alloc and llmem_pool_free, and free
 * looked the address up in the map first: callgrind, 256 mallocs of 16 B
 * to 1 KiB and their frees shuffled, 20,000 times, per call: malloc 69 ->
 * 47 instructions, free 95 -> 70 (the pool's own 42 and 62). */
void *llmem__pool_shim_alloc(llmem_pool *p, size_t n);
void llmem__pool_shim_free(llmem_pool *p, void *ptr);
void *llmem__shim_alloc_miss(size_t n);
void llmem__shim_free_miss(void *ptr);

/* Bytes usable from ptr, which must be a live block start this pool
 * handed out (malloc_usable_size's contract): the class size of a slab
 * block, the rest of its run for a large block, read from the
 * superblock's tables without the lock (they cannot change while the
 * block is live). Anything else (checked pools, a pointer that is not a
 * block start) takes llmem_pool_usable_size's locked path, so the answer
 * is always llmem_pool_usable_size's. */
size_t llmem__pool_usable_nolock(const llmem_pool *p, const void *ptr);

/* Give back the pages of every free run of at least min_run bytes that
 * has been free for min_age_ns or longer (0: any), decommitted as the
 * purger does after the decay delay; returns the bytes decommitted (pages
 * taken again later are committed as after any purge). The shim's pool
 * has no purger; the shim calls this before it maps a block of its own
 * (1 MiB and more: runs of 1 MiB and more, any age) and before a request
 * of 128 KiB or more (runs of 256 KiB and more, free for 20 ms), where
 * glibc would map or reuse its heap, so that long free runs do not stay
 * resident beside new pages (python3's test run: 6-7 MiB of them at its
 * peak; cc1: 1-2 MiB). The age keeps a run that a loop frees and takes
 * again from being given back and faulted in at every turn. Shorter
 * runs, where slabs come and go, are kept. Takes the pool lock. */
size_t llmem__pool_release_free_runs(llmem_pool *p, size_t min_run, uint64_t min_age_ns);

#endif
