/*
 * mapped.h - the malloc shim's mapped blocks (mapped.c). Not installed.
 *
 * Blocks of a megabyte and more are mappings of their own (glibc maps
 * from 128 KiB up): malloc and calloc of that size map (or take a freed
 * block's mapping, kept a while for that), free unmaps (or keeps the
 * mapping for the next big block), and realloc resizes with mremap, so the kernel moves page-table
 * entries instead of the pool copying bytes, and old and new copies are
 * never resident together. In the pool, a big block's pages stayed
 * resident in its free run after the free (the shim's pool never purges
 * by itself), while the next big block touched fresh ones: python3's
 * test run held 10, 8 and 5 MB buffers that way, and grew lists by steps
 * of 1.25 to 4 MB, each step a copy; peak RSS 49.6 MiB against glibc's
 * 43.3. A realloc that takes a pool block past the threshold moves it
 * to a mapping (its last copy).
 *
 * Thread-safe. The live mappings are kept in a fixed open-addressing
 * table; lookups take no lock (a live block's entry cannot change under
 * its owner), changes take one mutex, which the fork handlers hold.
 */
#ifndef LLMEM_SHIM_MAPPED_H
#define LLMEM_SHIM_MAPPED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Requests of at least this many bytes are mapped blocks. */
#define LLMEM_SHIM_MAPPED_MIN ((size_t)1 << 20)

/* A mapping of at least n bytes (page-rounded), zero-filled; NULL when
 * the kernel refuses or the table is full (the caller stays in the pool). */
void *llmem__mapped_alloc(size_t n);
/* Usable bytes of a live mapped block starting at p; 0 when p is not one. */
size_t llmem__mapped_usable(const void *p);
/* A mapped block of at least n bytes made from a freed block's mapping
 * (see the cache in mapped.c), zero-filled up to n when zero is set;
 * NULL when none is cached. Its pages may be resident already: the caller
 * need not make room for them. */
void *llmem__mapped_reuse(size_t n, bool zero);
/* Unmap every cached mapping (malloc_trim); the bytes unmapped. */
size_t llmem__mapped_trim(void);
/* How long a freed block's mapping is kept for reuse (0: never). */
void llmem__mapped_set_keep_ns(uint64_t ns);
/* Resize the mapped block p to at least n bytes (contents kept up to the
 * smaller size; may move). NULL, p unchanged, when the kernel refuses. */
void *llmem__mapped_resize(void *p, size_t n);
/* Free the live mapped block p: its mapping is kept for reuse a while
 * (8 MiB in all, or one block of up to 32 MiB), else unmapped. */
void llmem__mapped_free(void *p);

typedef struct llmem__mapped_stats {
    uint64_t live_blocks, live_bytes, peak_bytes;
    uint64_t maps_total, remaps_total, reuses_total;
    uint64_t cached_bytes; /* freed blocks' mappings kept for reuse */
} llmem__mapped_stats;
void llmem__mapped_get_stats(llmem__mapped_stats *out);

/* fork: hold the table's lock across it; the child re-initialises it. */
void llmem__mapped_fork_prepare(void);
void llmem__mapped_fork_parent(void);
void llmem__mapped_fork_child(void);

#endif
