/*
 * pool_internal.h - the dynamic pool's data structures, shared by pool.c
 * (allocation, thread caches, purge) and pool_compact.c (handles and
 * compaction). Not installed. See pool.c for the layout and invariants.
 */
#ifndef LLMEM_POOL_INTERNAL_H
#define LLMEM_POOL_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "avl.h"
#include "internal.h"
#include "llmem/fixed.h"
#include "llmem/pool.h"
#include "llmem/profile.h"
#include "size_class.h"

enum { D_FREE = 1, D_LARGE = 2, D_SLAB = 3 };

#define GUARD_MIN 64u          /* front guard, checked host pools */
#define GUARD_TAIL 16u         /* at least this much tail guard */
#define GUARD_MAGIC 0x6c6c6d65u /* "llme" */
#define GUARD_BYTE 0xFD
#define FREED_BYTE 0xDF        /* fills free small blocks of checked host pools */
#define MAGIC_SHIFT 40         /* exact division by class size, see slab_index */

typedef struct superblock superblock;

typedef struct pblock {
    uint8_t kind;
    uint16_t cls;              /* D_SLAB */
    uintptr_t start;
    size_t size;               /* bytes, a multiple of U */
    superblock *sb;
    struct pblock *prev, *next; /* address order within the superblock */
    llmem_avl_node node;        /* D_FREE: in the pool's free tree */
    uintptr_t user;             /* D_LARGE: the pointer handed out */
    size_t requested;           /* D_LARGE: bytes asked for */
    uint64_t free_since;        /* D_FREE: when it became a free run (ns) */
    bool purged;                /* D_FREE: its pages were decommitted by the purger */
    uint32_t handle;            /* D_LARGE: index + 1 of its handle, 0 for a raw allocation */
    bool fenced;                /* D_LARGE: its fenced free is pending (pool_fence.c) */
} pblock;

/* A movable allocation: the block it is in now, and how it may be named. */
typedef struct hentry {
    pblock *b;                  /* NULL when the entry is free */
    uint32_t gen;               /* bumped at every free, so old handles go stale */
    uint32_t pins;
    uint32_t next_free;         /* index + 1 of the next free entry */
} hentry;

typedef struct slab {
    pblock b;
    struct slab *lnext, *lprev; /* the class's partial list */
    uint32_t nblocks, used, carved, nfree;
    bool listed;
    void *free_head;            /* in-band free list */
    uint32_t *free_idx;         /* out-of-band free stack (nfree entries) */
    uint64_t *bits;             /* checked: 1 = handed out */
} slab;

struct superblock {
    uintptr_t base;
    size_t size;
    llmem_pool *pool;
    superblock *next, *prev;    /* all superblocks of the pool */
    superblock *enext, *eprev;  /* the pool's empty superblocks */
    pblock **owner;             /* one entry per unit */
    uint32_t *slab_info;        /* per unit of a slab: (class + 1) << 24 | units from the slab's start */
    uint64_t *decommitted;      /* one bit per unit */
    size_t decommitted_units;
    size_t used;                /* bytes in LARGE and SLAB blocks */
    uint64_t empty_since;       /* when used became 0, if listed as empty */
    bool empty;
    bool reserved;              /* the reserve_bytes range: never listed empty, never unmapped
                                   before destroy, committed page run by page run */
};

typedef struct central {
    slab *partial;              /* slabs with a free block (or none carved yet) */
    uint32_t slabs, empty_slabs;
    uint64_t live, allocs;      /* live: blocks out of the slabs (caches included) */
    void **xfer;                /* transfer cache: free blocks passed between threads */
    uint32_t xcount, xcap;
} central;

/* Fields read by every fast path come first and are only written at
 * create; what the lock guards starts on its own cache line, so refills in
 * one thread do not evict the configuration other threads are reading. */
struct llmem_pool {
    /* read-mostly */
    uint64_t id;                /* unique for the process's life */
    bool host, checked, inband, tcache_on;
    size_t unit;
    unsigned ushift;
    size_t align;               /* pool minimum alignment */
    uint64_t magic[LLMEM_MAX_CLASSES]; /* ceil(2^MAGIC_SHIFT / class size) */
    llmem_size_classes cls;
    uint32_t tcache_cap[LLMEM_MAX_CLASSES];
    size_t tcache_slots;
    pthread_key_t tkey;
    char name[32];
    llmem_resource *res;
    size_t run;                 /* commit/decommit run: max(unit, resource granularity) */
    size_t sb_align;            /* superblock alignment and size multiple */
    size_t max_sb, max_bytes;
    size_t first_sb;            /* the first superblock size; growth steps back towards it on release */
    size_t reserve;             /* reserve_bytes, rounded; 0 = none */
    uint64_t decay_ns;
    bool purge_background;
    struct llmem_pool *purge_next; /* the purger's list, under its lock */
    void **xfer_storage;
    llmem_fixed *descs;
    llmem_profile *profile;     /* borrowed; records every allocation when set */
    /* guarded by the lock */
    _Alignas(64) pthread_mutex_t lock;
    size_t next_sb;
    central central[LLMEM_MAX_CLASSES];
    llmem_avl free_tree;
    superblock *sbs, *empties;
    superblock *rsb;            /* the reserved superblock, once mapped */
    llmem_pool_stats st;        /* derived fields are filled by get_stats */
    struct tcache *tcaches;
    uint64_t xfer_bytes, xfer_blocks; /* in transfer caches */
    hentry *handles;            /* handle table (pool_compact.c) */
    uint32_t hcount, hcap, hfree;
    struct fenced_free *fenced; /* pending fenced frees, oldest first (pool_fence.c) */
    uint32_t nfenced, capfenced;
};

/* ---- helpers ---------------------------------------------------------- */

static inline size_t unit_of(const superblock *sb, uintptr_t a, unsigned ushift)
{
    return (size_t)(a - sb->base) >> ushift;
}

static inline bool bit_get(const uint64_t *b, size_t i) { return (b[i / 64] >> (i % 64)) & 1; }
static inline void bit_set(uint64_t *b, size_t i) { b[i / 64] |= 1ull << (i % 64); }
static inline void bit_clear(uint64_t *b, size_t i) { b[i / 64] &= ~(1ull << (i % 64)); }

static inline pblock *node_block(llmem_avl_node *n)
{
    return n ? (pblock *)((char *)n - offsetof(pblock, node)) : NULL;
}

/* ---- the page allocator (pool.c); the pool lock is held for all --------- */

pblock *llmem__pool_desc_new(llmem_pool *p);
void llmem__pool_desc_free(llmem_pool *p, pblock *b);
void llmem__pool_tree_insert(llmem_pool *p, pblock *b);
void llmem__pool_tree_remove(llmem_pool *p, pblock *b);
/* Split everything past `keep` bytes off b as a free run after it. */
void llmem__pool_split_back(llmem_pool *p, pblock *b, size_t keep);
/* A run of `size` bytes at `align`, out of the tree, committed, growing if
 * needed; the caller sets its kind. */
pblock *llmem__pool_take_pages(llmem_pool *p, size_t size, size_t align, llmem_status *st);
/* The same from a given free run b (which must fit). */
pblock *llmem__pool_take_run(llmem_pool *p, pblock *b, size_t size, size_t align, llmem_status *st);
/* Back to the free runs, coalescing; the caller has fixed the owner table. */
void llmem__pool_put_pages(llmem_pool *p, pblock *b);
llmem_status llmem__pool_commit_range(llmem_pool *p, superblock *sb, uintptr_t a, size_t n);
/* Unmap an empty superblock; false (and kept) if the resource refuses. */
bool llmem__pool_release_sb(llmem_pool *p, superblock *sb);
void llmem__pool_note_peak(llmem_pool *p);
/* ---- fenced frees (pool_fence.c uses these from pool.c) ----------------- */

/* ptr is a live raw block of this pool whose fenced free is not pending:
 * LLMEM_OK with its block bytes in *bytes and its block in *b (the slab for
 * a small block), or the refusal llmem_pool_free would give (counted and
 * logged). Lock held. */
llmem_status llmem__pool_validate_free(llmem_pool *p, uintptr_t a, size_t *bytes, pblock **b);
/* Validate as above and free, with one lookup (`what` names the call in
 * messages). Lock held. */
llmem_status llmem__pool_free_locked(llmem_pool *p, uintptr_t a, const char *what);
/* Free a block validated before (and still live). Lock held. */
llmem_status llmem__pool_free_valid(llmem_pool *p, uintptr_t a);
/* Is a's fenced free pending? Lock held. */
bool llmem__pool_fenced_has(const llmem_pool *p, uintptr_t a);
/* Complete the fenced frees whose fences are done; how many. Lock held. */
size_t llmem__pool_poll_fenced_locked(llmem_pool *p);
/* Wait for the oldest pending fence (the lock is dropped while waiting) and
 * complete its free; false if none was pending. `forced`: an allocation
 * would have failed without it (counted in fence_waits_total). Lock held. */
bool llmem__pool_wait_one_fenced(llmem_pool *p, bool forced);
/* Drop every pending fence without waiting (destroy). */
void llmem__pool_drop_fenced(llmem_pool *p);

/* Free-tree search key: the smallest size wanted. */
int llmem__pool_size_key_cmp(const void *key, const llmem_avl_node *n);

#endif
