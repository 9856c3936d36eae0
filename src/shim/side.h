/*
 * side.h - the malloc shim's side allocator (side.c). Not installed.
 *
 * Everything in libllmem-malloc.so that must not come from the llmem pool
 * it serves: the pool's own metadata (its malloc/calloc/realloc/free calls
 * are redirected here at link time with -Wl,--wrap), allocations made
 * before the pool exists or while it is being created (the bootstrap), and
 * allocations that the C library makes on its own while the calling thread
 * is inside the pool (fopen of /proc files, qsort's buffer, the TLS arrays
 * of a thread being started). Its first blocks come from a static buffer,
 * so it works before the first mmap and needs no dlsym.
 *
 * Thread-safe (one mutex). Blocks are powers of two with a 16-byte header
 * just before the pointer handed out; every pointer it hands out lies in
 * the static buffer or in its one reserved address range, so
 * llmem__side_owns is two range checks.
 */
#ifndef LLMEM_SHIM_SIDE_H
#define LLMEM_SHIM_SIDE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* size bytes (0 is taken as 1) aligned to align (a power of two; below 16
 * means 16); zeroed when `zero`. NULL when the reserved range is spent or
 * the request overflows. */
void *llmem__side_alloc(size_t size, size_t align, bool zero);

/* Give a block back. NULL and pointers it does not own are ignored;
 * a block freed twice is recognised (its header says free) and ignored. */
void llmem__side_free(void *p);

/* Resize: in place when the block has room and is not more than four
 * times too big, else allocate, copy and free. size 0 is taken as 1.
 * NULL (the block untouched) on failure. */
void *llmem__side_realloc(void *p, size_t size);

/* True if p lies in memory the side allocator hands out. Lock-free. */
bool llmem__side_owns(const void *p);

/* Bytes usable from p (a block start it handed out), 0 if it is not one.
 * Lock-free. */
size_t llmem__side_usable(const void *p);

typedef struct llmem__side_stats {
    uint64_t boot_bytes;      /* of the static buffer used */
    uint64_t region_bytes;    /* committed in the reserved range */
    uint64_t live_blocks;
    uint64_t live_bytes;      /* at block size */
    uint64_t allocs_total;
    uint64_t bad_frees_total; /* double frees and non-block pointers refused */
} llmem__side_stats;

void llmem__side_get_stats(llmem__side_stats *out);

/* fork(): the parent holds the lock across the fork, so the child finds it
 * consistent; the child re-initialises it. */
void llmem__side_fork_prepare(void);
void llmem__side_fork_parent(void);
void llmem__side_fork_child(void);

#endif
