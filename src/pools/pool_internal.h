/*
 * pool_internal.h - the dynamic pool's data structures, and every internal
 * one of its files calls in another, declared once under a heading per
 * file (mimalloc's internal.h manner). Not installed. Each file's top
 * comment states its algorithm and invariants; pool.c lists the files.
 */
#ifndef LLMEM_POOL_INTERNAL_H
#define LLMEM_POOL_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "addrmap.h"
#include "avl.h"
#include "internal.h"
#include "llmem/fixed.h"
#include "llmem/pool.h"
#include "llmem/profile.h"
#include "size_class.h"

/* D_CACHED: a freed large block kept whole in the run cache (see
 * pool_pages.c, "the run cache"): free to the user, not coalesced. */
enum { D_FREE = 1, D_LARGE = 2, D_SLAB = 3, D_CACHED = 4 };

/* The page heaps of a pool (see pool_pages.c): slabs live in superblocks of
 * the small heap, large blocks in those of the large heap. A pool that does
 * not split (device pools, reserved ranges) has one heap, HEAP_SMALL. */
enum { HEAP_SMALL = 0, HEAP_LARGE = 1, HEAPS = 2 };

#define GUARD_MIN 64u          /* front guard, checked host pools */
#define GUARD_TAIL 16u         /* at least this much tail guard */
#define GUARD_MAGIC 0x6c6c6d65u /* "llme" */
#define GUARD_BYTE 0xFD
#define FREED_BYTE 0xDF        /* fills free small blocks of checked host pools */

/* ---- block states: double frees of small blocks ---------------------------
 *
 * Every slab keeps one byte per block in host memory: 0 while the block is
 * free in its slab (its free list, or not carved yet), 1 while it is handed
 * out, 2 while its fenced free is pending (pool_fence.c), and STATE_OUT (3)
 * while it is out of its slab in the marked regime below, handed out or
 * free in a thread or transfer cache. A free block in a cache is in one of
 * two regimes, which its tslot says (TSLOT_MARKED in the block word):
 *
 * - Unmarked (device pools, whose memory is never touched; every pool while
 *   one thread uses it): the byte is 0 while cached. Both fast paths write
 *   it: an allocation sets 1 through the tslot, a free reads 1 and clears
 *   it, and a free that reads 0 is refused (LLMEM_EDOUBLEFREE, by the
 *   locked path).
 * - Marked (host pools with thread caches, p->marks, unless created with
 *   LLMEM_POOL_MARKS=0 in the environment; once their second thread cache
 *   exists: p->marks_on): the byte stays STATE_OUT from the
 *   refill that takes the block out of its slab to the flush that puts it
 *   back, both under a lock, so the fast paths only read it and its line
 *   stays shared in every core's cache. A free block is told from a handed-
 *   out one by its mark, block address ^ p->mark_key, in its first word: a
 *   free refuses a block that carries its mark and writes it otherwise; the
 *   allocation that takes the block from a cache clears the word with a
 *   store and does not read it (the load waited on the line the freeing
 *   core wrote: without it larson_4t gained 10%, branch s29-marks); a
 *   flush under the pool lock checks
 *   the mark of every block it returns, and drops and logs one that lost it
 *   (written after its free). A double free is refused by the free's check
 *   whatever the allocation reads; what only the allocation's check would
 *   have caught is a write after free followed by a second free of the same
 *   block before its flush. A free that reads 1 in a marking pool moves the
 *   block to STATE_OUT, once.
 *
 * Why two regimes (issue 15, docs/BENCHMARKS.md 2026-12-04, branch
 * s28-home): with every fast path writing the byte, larson's threads, whose
 * caches hold blocks of the same slabs (remote frees and transfer batches
 * mix them block by block), wrote the same state lines from two cores: the
 * free's wait on that line was most of larson_2t, and spreading the bytes
 * one line per block doubled it (4 or 16 to a line did nothing). The
 * block's own line is its holder's, as in tcmalloc, whose free writes the
 * block too. But one thread alone never shares a line, and there the
 * free's load of a cold block (`small`: 17 MB of live blocks) cost 29% more
 * than the dense byte's: so a pool marks only once a second thread uses it.
 * The encoding is per block, so threads switching regime at different
 * moments stay consistent. A program that writes exactly a free block's
 * mark into a live block (2^-64 for data not read from freed memory) has
 * that block's free refused.
 *
 * A thread cache holds each free block with the address of its state byte
 * (a tslot). The bytes are relaxed atomics: two threads freeing the same
 * block at the same instant can both pass (a race in the program that no
 * check short of a locked instruction on every free would close).
 * Where the bytes live: an array per slab, dense (a free reads one line per
 * slab, not one per block: a bytemap over the superblock, a byte per 16
 * bytes, made the state load miss as often as a mark in the block), from
 * fixed pools of host metadata, one per array size (64 << k bytes, the
 * smallest that holds the slab's blocks), so that making a slab mallocs
 * nothing (an engine's decode steps stay malloc-free). One size per
 * power of two, not one for all: arrays of the largest slab's count (4
 * KiB once slabs became 64 KiB) all began on a page boundary, so the hot
 * first bytes of every class's array fell in one set of the L1 cache
 * (callgrind, batch_alloc: D1 misses 6.1 -> 9.5 million). */
enum { STATE_OUT = 3 };
#define STATE_POOLS 8          /* state arrays of 64 B to 8 KiB: slabs of up to 8192 blocks */
/* The state-array pool for a slab of n blocks: the smallest 64 << k >= n. */
static inline unsigned state_pool(uint32_t n) { return n <= 64 ? 0 : (unsigned)(32 - __builtin_clz(n - 1)) - 6; }
#define TSLOT_MARKED ((uintptr_t)1) /* in a tslot's block word: the block is marked */
typedef struct tslot {
    void *block;
    uint8_t *state;
} tslot;

typedef struct superblock superblock;

/* A unit of a slab, as the free fast path reads it (16 bytes, no slab
 * descriptor and no superblock): the slab's state array, the low half of
 * the slab's start address (a block's offset in its slab is then one 32-bit
 * subtraction, slabs being far below 4 GiB), and its class under its
 * pool's tag. All zero for a unit outside slabs. It lives in the address
 * map's entry for the unit (addrmap.h), so the chain is map root, map
 * entry, state byte: slabs cover whole map units (slab_granule), so that
 * an entry names one slab. */
typedef llmem__slab_unit slab_unit;

/* What slabs are laid on: whole 64 KiB units of the address map, aligned,
 * or whole pool units where those are larger. Classes' slabs of 16-48 KiB
 * grew to 64 KiB for it; slabs carve lazily, so a class with few blocks
 * still touches only the pages it uses. */
static inline size_t slab_granule(size_t unit) { return unit > LLMEM_ADDRMAP_UNIT ? unit : LLMEM_ADDRMAP_UNIT; }

typedef struct pblock {
    uint8_t kind;
    uint16_t cls;              /* D_SLAB */
    uintptr_t start;
    size_t size;               /* bytes, a multiple of U */
    superblock *sb;
    struct pblock *prev, *next; /* address order within the superblock */
    union {
        llmem__avl_node node;    /* D_FREE: in the pool's free tree */
        struct {                 /* D_CACHED: the run cache's lists */
            struct pblock *cnext, *cprev; /* its size's list, newest first */
            struct pblock *anext, *aprev; /* every cached run, newest first */
        };
    };
    uintptr_t user;             /* D_LARGE: the pointer handed out */
    size_t requested;           /* D_LARGE: bytes asked for */
    uint64_t free_since;        /* D_FREE: when it became a free run (ns) */
    bool purged;                /* D_FREE: its pages were decommitted by the purger */
    bool fresh;                 /* D_FREE: no page of it written since it was mapped or decommitted
                                   (none resident): best fit takes such a run last (pool_pages.c) */
    uint32_t handle;            /* D_LARGE: index + 1 of its handle, 0 for a raw allocation */
    bool fenced;                /* D_LARGE: its fenced free is pending (pool_fence.c) */
    uint8_t tcached;            /* D_LARGE: 1 while freed into a thread's large-block cache
                                   (pool_tcache.c); relaxed atomics: its owner writes it unlocked */
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
    uint8_t *state;             /* nblocks bytes, one per block (see "block states") */
} slab;

/* The first cache line holds what every free reads (base, pool, owner)
 * and nothing written after the map; the counters the
 * lock holder writes at every slab or large block (used) sit on the next,
 * so a slab made in one thread does not take the line from another's free
 * (sb_map allocates it 64-byte aligned: from calloc it straddled lines at
 * random, and the free's per-unit table pointer sat beside used). */
struct superblock {
    uintptr_t base;
    size_t size;
    llmem_pool *pool;
    pblock **owner;             /* one entry per unit */
    superblock *next, *prev;    /* all superblocks of the pool */
    superblock *enext, *eprev;  /* the pool's empty superblocks */
    uint64_t *decommitted;      /* one bit per unit */
    size_t decommitted_units;
    size_t used;                /* bytes in LARGE, SLAB and CACHED blocks */
    uint64_t empty_since;       /* when used became 0, if listed as empty */
    bool empty;
    bool reserved;              /* the reserve_bytes range: never listed empty, never unmapped
                                   before destroy, committed page run by page run */
    uint8_t heap;               /* HEAP_SMALL or HEAP_LARGE: whose free tree its runs are in */
};

/* The run cache (pool_pages.c): freed large blocks of up to RUN_CACHE_UNITS
 * units, kept whole in lists by exact size, so that an allocation of a
 * size freed before takes one without touching the free tree. Under the
 * pool lock. */
#define RUN_CACHE_UNITS 256u
#define RUN_CACHE_BYTES ((size_t)8 << 20) /* host pools: 8 MiB at most, oldest out first */

typedef struct run_cache {
    pblock *head[RUN_CACHE_UNITS + 1]; /* by units */
    uint64_t nonempty[RUN_CACHE_UNITS / 64 + 1]; /* bit u: head[u] is not NULL (a fitting take's search) */
    pblock *newest, *oldest;           /* every cached run, by age */
    size_t bytes, cap;                 /* cap 0: no cache (device pools, manual purge) */
    uint64_t ops;                      /* bumped by every put and take */
    uint64_t seen_ops, seen_at;        /* the purger's last look: ops then, and when */
} run_cache;

typedef struct central {
    slab *partial;              /* slabs with a free block (or none carved yet) */
    uint32_t slabs, empty_slabs;
    uint64_t live, allocs;      /* live: blocks out of the slabs (caches included) */
    uint64_t frees, failures;   /* frees taken by the locked path or folded in from exited threads;
                                   allocations of the class refused */
    uint64_t last_take;         /* llmem__pool_clock when blocks last left the slabs */
} central;

/* A class's transfer cache (pool_tcache.c): free blocks passed between
 * thread caches in batches, under a lock of its own, so a refill or flush
 * that finds what it needs here takes no pool lock. The lock is a leaf:
 * nothing else is locked while it is held (the pool lock may be held when
 * it is taken). */
typedef struct xfer_cache {
    _Alignas(64) pthread_mutex_t lock;
    tslot *slots;
    uint32_t count;             /* relaxed stores under the lock; stats read it without */
    uint32_t cap;
    uint64_t last_used;         /* llmem__pool_clock at the last push or pop (relaxed) */
} xfer_cache;

/* The classes' exact division (llmem__pool_slab_index), by class: the
 * inverse of the size's odd part mod 2^32, its power of two, and the
 * slab's last block index. Arrays, not an array of structs: indexed by
 * the class with a scale, no multiply of the index first. */
typedef struct slab_divisors {
    uint32_t inv[LLMEM_MAX_CLASSES];
    uint32_t last[LLMEM_MAX_CLASSES];
    uint8_t shift[LLMEM_MAX_CLASSES];
} slab_divisors;

/* Fields read by every fast path come first and are only written at
 * create; what the lock guards starts on its own cache line, so refills in
 * one thread do not evict the configuration other threads are reading. */
struct llmem_pool {
    /* read-mostly */
    uint64_t id;                /* unique for the process's life */
    uint32_t utag;              /* pool_utag_of(id), its slab_unit entries' tag */
    bool host, checked, inband, tcache_on;
    bool marks;                 /* may mark free small blocks ("block states" above): inband pools
                                   with thread caches */
    bool marks_on;              /* marks in use: set (relaxed, once) when the second thread cache is made */
    uint64_t mark_key;          /* a marked cached block at a holds a ^ mark_key in its first word */
    bool lcache_on;             /* thread caches of large blocks: tcache_on pools with a run cache */
    size_t unit;
    unsigned ushift;
    size_t align;               /* pool minimum alignment */
    slab_divisors div;          /* llmem__pool_slab_index */
    llmem__size_classes cls;
    uint32_t tcache_cap[LLMEM_MAX_CLASSES];
    size_t tcache_slots;
    pthread_key_t tkey;
    char name[32];
    llmem_resource *res;        /* the pool's resource (the small heap's) */
    llmem_resource *heap_res[HEAPS]; /* each heap's: the large heap's has no THP advice by default */
    bool split;                 /* two heaps (host pools without reserve_bytes) */
    size_t run;                 /* commit/decommit run: max(unit, resource granularity) */
    size_t sb_align;            /* superblock alignment and size multiple */
    size_t max_sb, max_bytes;
    size_t first_sb;            /* the first superblock size; growth steps back towards it on release */
    size_t reserve;             /* reserve_bytes, rounded; 0 = none */
    uint64_t decay_ns;
    bool purge_background;
    struct llmem_pool *purge_next; /* the purger's list, under its lock */
    tslot *xfer_storage;        /* every class's transfer cache slots */
    llmem_fixed *descs;
    llmem_fixed *states[STATE_POOLS]; /* slabs' state arrays of 64 << k bytes (state_pool) */
    llmem_profile *profile;     /* borrowed; records every allocation when set */
    /* guarded by the lock */
    _Alignas(64) pthread_mutex_t lock;
    size_t next_sb[HEAPS];      /* each heap's next superblock size */
    central central[LLMEM_MAX_CLASSES];
    llmem_avl free_tree[HEAPS]; /* each heap's free runs */
    run_cache rc;               /* freed large blocks by size, in heap_for(p, D_LARGE) */
    superblock *sbs, *empties;
    superblock *rsb;            /* the reserved superblock, once mapped */
    llmem_pool_stats st;        /* derived fields are filled by get_stats */
    struct tcache *tcaches;     /* under tlock (not the pool lock) */
    uint64_t reclaim_seq;       /* odd while a reclaimer moves another thread's cached blocks to the
                                   slabs: stats reads retry, so that no block counts as both cached
                                   and back in its slab (or neither). Written only under the pool
                                   lock, so it has one writer at a time */
    pthread_mutex_t tlock;      /* the list of thread caches: a leaf lock, taken by a cache's
                                   creation and exit and by stats reads, never by the fast paths */
    hentry *handles;            /* handle table (pool_compact.c) */
    uint32_t hcount, hcap, hfree;
    struct fenced_free *fenced; /* pending fenced frees, oldest first (pool_fence.c) */
    uint32_t nfenced, capfenced;
    xfer_cache xfer[LLMEM_MAX_CLASSES];
};

/* A thread's cache of freed large blocks (pool_tcache.c, "large blocks"):
 * up to LCACHE_SLOTS blocks of at most RUN_CACHE_UNITS units and
 * LCACHE_BYTES in all, oldest first. Written by its owner with relaxed
 * atomic stores; read by stats, check and the reclaimer. */
#define LCACHE_SLOTS 16u
#define LCACHE_BYTES ((uint64_t)4 << 20)

typedef struct lslot {
    uintptr_t ptr;              /* the block's start, as handed out */
    pblock *b;
} lslot;

typedef struct lcache {
    uint32_t count;
    uint32_t units[LCACHE_SLOTS]; /* entry i's size in units (scanned by an allocation: one line) */
    lslot slot[LCACHE_SLOTS];
    uint64_t bytes;             /* the entries' block bytes */
    uint64_t allocs, frees;     /* served and taken by this thread */
} lcache;

/* A thread's cache for one pool (pool_tcache.c). */
/* One class's stack: what the fast paths touch, in 32 bytes. */
typedef struct tbin {
    tslot *items;               /* cap slots; the top count are free blocks */
    uint32_t count;             /* owner: relaxed stores */
    uint32_t cap;
    uint64_t allocs, frees;     /* served and taken by this thread; owner: relaxed stores */
} tbin;

typedef struct tcache {
    llmem_pool *pool;
    struct tcache *next, *prev; /* the pool's caches, under its tcache lock */
    uint32_t busy;              /* owner: 1 inside an allocation or free (see pool_tcache.c) */
    uint32_t reclaim;           /* a reclaimer's request: the owner's next call takes the slow path */
    uint64_t last_active;       /* owner: llmem__pool_clock at its last refill or flush */
    bool kicked;                /* the purger was told about this cache's blocks (under tlock) */
    uint64_t seen_ops;          /* reclaimer's: the cache's allocs + frees at its last look (pool lock) */
    lcache large;               /* freed large blocks, when p->lcache_on */
    tbin bin[LLMEM_MAX_CLASSES];
    tslot storage[];
} tcache;

/* ---- intrusive lists ----------------------------------------------------
 *
 * The pool's doubly linked lists (superblocks, empty superblocks, partial
 * slabs, thread caches) thread through two fields of their nodes, named
 * here: `head` is the list's first-node pointer (NULL when empty). Macros,
 * so each use compiles to the plain pointer writes it replaces. */
#define LIST_PUSH(head, node, prev, next) \
    do {                                  \
        (node)->prev = NULL;              \
        (node)->next = (head);            \
        if (head) (head)->prev = (node);  \
        (head) = (node);                  \
    } while (0)
#define LIST_UNLINK(head, node, prev, next)                 \
    do {                                                    \
        if ((node)->prev) (node)->prev->next = (node)->next; \
        else (head) = (node)->next;                         \
        if ((node)->next) (node)->next->prev = (node)->prev; \
    } while (0)

/* ---- stats fields ------------------------------------------------------
 *
 * The figures in p->st and the class counters in central are written only
 * under the pool lock and read without it by llmem_pool_get_stats and
 * llmem_pool_get_class_stats: writers make relaxed atomic stores (on x86 a
 * plain load, add and store: no locked instruction), readers relaxed
 * loads, so a stats read never waits for an allocation and never races. A
 * read is a snapshot: two figures may be a few operations apart. */
#define ST_SET(f, v) __atomic_store_n(&(f), (v), __ATOMIC_RELAXED)
#define ST_ADD(f, v) ST_SET(f, __atomic_load_n(&(f), __ATOMIC_RELAXED) + (v))
#define ST_SUB(f, v) ST_SET(f, __atomic_load_n(&(f), __ATOMIC_RELAXED) - (v))
#define ST_GET(f) __atomic_load_n(&(f), __ATOMIC_RELAXED)

/* ---- helpers ---------------------------------------------------------- */

/* The tag a pool's slab_unit entries carry in ctag's upper 24 bits, class
 * in the low 8: from the pool's id, never 0 (an entry outside slabs, all
 * zero, matches no pool), unique among live pools unless 2^24 - 1 pools
 * were created while one lived. */
static inline uint32_t pool_utag_of(uint64_t id) { return (uint32_t)(id % 0xffffffu + 1) << 8; }
static inline uint32_t pool_utag(const llmem_pool *p) { return p->utag; }

/* The slab entry of address a (all zero if no slab holds it), from the
 * address map: never NULL, so the free's lookup tests the tag alone. */
static inline const slab_unit *unit_entry(uintptr_t a) { return llmem__addrmap_slab(a); }

static inline size_t unit_of(const superblock *sb, uintptr_t a, unsigned ushift)
{
    return (size_t)(a - sb->base) >> ushift;
}

/* The pool's clock for the decay delay, in ns: CLOCK_MONOTONIC_COARSE,
 * which costs a few ns where CLOCK_MONOTONIC cost 150 ns on this project's
 * virtual machines (measured; it was 4-10% of tensor_mix), at one tick of
 * resolution (1-10 ms). Every stamp and every reading come from here, and
 * decay_ns carries two ticks more than asked, so nothing goes back before
 * its delay. */
static inline uint64_t llmem__pool_clock(void) { return llmem__coarse_ns(); }

/* The heap that serves blocks of a kind (D_SLAB or D_LARGE). */
static inline unsigned heap_for(const llmem_pool *p, int kind) { return p->split && kind == D_LARGE ? HEAP_LARGE : HEAP_SMALL; }

/* Block idx's state byte in slab s, and its accessors: relaxed atomics
 * (plain byte moves on x86), since the fast paths write them without the
 * lock that llmem_pool_check reads them under. */
static inline uint8_t *slab_state(const slab *s, uint32_t idx) { return s->state + idx; }
static inline uint8_t state_get(const uint8_t *b) { return __atomic_load_n(b, __ATOMIC_RELAXED); }
static inline void state_set(uint8_t *b, uint8_t v) { __atomic_store_n(b, v, __ATOMIC_RELAXED); }

/* A free block's mark (pools with marks): never 0, since blocks are
 * 16-aligned and the key's low four bits are set. */
static inline uint64_t block_mark(const llmem_pool *p, uintptr_t a) { return (uint64_t)a ^ p->mark_key; }

/* The first word of block a, read or written whether or not it is
 * poisoned: the pool's own access to a free block (ASan would report the
 * read of a cached block's mark as a use after poison). */
typedef uint64_t __attribute__((may_alias)) mark_word; /* the block's bytes have the program's types */
__attribute__((no_sanitize_address)) static inline uint64_t mark_load(uintptr_t a) { return *(const mark_word *)a; }
__attribute__((no_sanitize_address)) static inline void mark_store(uintptr_t a, uint64_t v) { *(mark_word *)a = v; }

static inline bool bit_get(const uint64_t *b, size_t i) { return (b[i / 64] >> (i % 64)) & 1; }
static inline void bit_set(uint64_t *b, size_t i) { b[i / 64] |= 1ull << (i % 64); }
static inline void bit_clear(uint64_t *b, size_t i) { b[i / 64] &= ~(1ull << (i % 64)); }

static inline pblock *node_block(llmem__avl_node *n)
{
    return n ? (pblock *)((char *)n - offsetof(pblock, node)) : NULL;
}

/* Block index of a pointer at offset off (below 2^32) in a slab of class
 * cls, and whether a block of the slab starts there: false for an offset
 * inside a block and for the slab's tail past its last block (the free's
 * fast path read the state byte past the slab's array there, and took the
 * tail in as a block when that byte, another slab's, said live). With the
 * class size d << k (d odd): off is a multiple of it exactly when
 * rotr32(off * d^-1 mod 2^32, k) is at most (2^32 - 1) / size, and then it
 * is off / size; bounding it by the slab's last index instead checks both
 * at once (Granlund and Montgomery's divisibility test). A multiply, a
 * rotate and a compare. */
static inline bool llmem__pool_slab_index(const llmem_pool *p, unsigned cls, uint32_t off, uint32_t *idx)
{
    unsigned k = p->div.shift[cls];
    uint32_t q = off * p->div.inv[cls];
    q = (q >> k) | (q << ((32 - k) & 31));
    *idx = q;
    return q <= p->div.last[cls];
}

/* The class of the slab block of pool p that address a starts, from its
 * unit's entry su (unit_entry), with its index in the slab in
 * *idx; -1 if su names no slab of p or a is not a block boundary in it.
 * The free's lookup and the shim's usable size: one load of the entry,
 * one subtraction, the exact division (which also bounds the index). */
static inline int unit_block(const llmem_pool *p, const slab_unit *su, uintptr_t a, uint32_t *idx)
{
    uint32_t c = su->ctag ^ pool_utag(p);
    if (c >= 256) return -1; /* another pool's slab, or none */
    return llmem__pool_slab_index(p, c, (uint32_t)a - su->start, idx) ? (int)c : -1;
}

/* Set *status (optional) and return NULL: the tail of every failed
 * pointer-returning call. */
static inline void *llmem__pool_alloc_failed(llmem_status st, llmem_status *status)
{
    if (status) *status = st;
    return NULL;
}


/* The front guard of a checked host block at this alignment. */
static inline size_t llmem__pool_guard_front(size_t align) { return align > GUARD_MIN ? align : GUARD_MIN; }

/* ---- pool_pages.c: superblocks and page runs; the pool lock is held ---- */

/* The most units a large allocation of u units takes whole from a
 * thread's stack or the run cache: a freed block up to half as large
 * again is reused where it lies, not cut anew from the free runs (whose
 * fresh pages the program then faults in: docs/BENCHMARKS.md,
 * 2026-12-04). The whole block is the allocation's: usable size, used
 * bytes; past the bytes asked for it stays poisoned. */
static inline size_t llmem__pool_fit_units(size_t u) { return u + u / 2; }

/* Free-tree order: (size, address). */
int llmem__pool_free_cmp(const llmem__avl_node *a, const llmem__avl_node *b);
/* Free-tree search key: the smallest size wanted. */
int llmem__pool_size_key_cmp(const void *key, const llmem__avl_node *n);
/* A zeroed descriptor (room for a slab), NULL when host memory is short. */
pblock *llmem__pool_desc_new(llmem_pool *p);
void llmem__pool_desc_free(llmem_pool *p, pblock *b);
/* Make b a FREE block in the tree (counted in free_bytes), free since now. */
void llmem__pool_tree_insert(llmem_pool *p, pblock *b);
void llmem__pool_tree_remove(llmem_pool *p, pblock *b);
/* Map a superblock in heap h for `need` bytes at `align` (the reserved
 * range first, if configured and not mapped yet). */
llmem_status llmem__pool_grow(llmem_pool *p, unsigned h, size_t need, size_t align);
/* The longest committed stretch of any free run, in bytes: what one
 * allocation can take with no resource call. */
size_t llmem__pool_largest_committed_free(const llmem_pool *p);
/* The largest free run of any heap, or NULL. */
pblock *llmem__pool_largest_free(const llmem_pool *p);
/* A best-fit free run of heap h for size bytes at align, or NULL. */
pblock *llmem__pool_best_fit(llmem_pool *p, unsigned h, size_t size, size_t align);
/* A run of `size` bytes at `align` from heap h, out of the tree,
 * committed, growing if needed; the caller sets its kind. */
pblock *llmem__pool_take_pages(llmem_pool *p, unsigned h, size_t size, size_t align, llmem_status *st);
/* A run for a large block of `size` bytes (a unit multiple) at `align`
 * from heap h: a cached run of size to llmem__pool_fit_units(size) units
 * if there is one (taken whole: its size may exceed `size`), else as
 * llmem__pool_take_pages. */
pblock *llmem__pool_take_large(llmem_pool *p, unsigned h, size_t size, size_t align, llmem_status *st);
/* The same from a given free run b (which must fit). */
pblock *llmem__pool_take_run(llmem_pool *p, pblock *b, size_t size, size_t align, llmem_status *st);
/* Grow the LARGE block b to `size` bytes (a unit multiple) in place, from
 * the free run right after it (committed as needed, the rest left free):
 * a growing buffer is not copied, and old and new copies are never held at
 * once. The caller counts the bytes. false, nothing changed, if that run
 * is not free or too short, or its pages cannot be committed. */
bool llmem__pool_grow_in_place(llmem_pool *p, pblock *b, size_t size);
/* Back to the free runs, coalescing; the caller has fixed the owner table. */
void llmem__pool_put_pages(llmem_pool *p, pblock *b);
/* The same, free since `stamp` (a llmem__pool_clock reading no later than
 * its free). */
void llmem__pool_put_pages_since(llmem_pool *p, pblock *b, uint64_t stamp);
/* A freed LARGE block (owner table fixed, counted free by the caller) into
 * the run cache if it takes it, else llmem__pool_put_pages. */
void llmem__pool_put_large(llmem_pool *p, pblock *b);
/* Every cached run back to the free runs, coalescing, free since `stamp`
 * (a llmem__pool_clock reading no earlier than any of them was freed). */
void llmem__pool_cache_flush(llmem_pool *p, uint64_t stamp);
/* The purger's look at the run cache at `now`: flush it once it has seen no
 * put or take for the decay delay. Returns when to look again, or
 * UINT64_MAX. */
uint64_t llmem__pool_cache_purge(llmem_pool *p, uint64_t now);
/* The run cache's invariants (llmem_pool_check): its lists hold exactly
 * `cached` runs of `bytes` bytes, each of its size's list. */
bool llmem__pool_cache_check(const llmem_pool *p, size_t cached, uint64_t bytes);
/* Commit every decommitted run overlapping [a, a+n). */
llmem_status llmem__pool_commit_range(llmem_pool *p, superblock *sb, uintptr_t a, size_t n);
/* Decommit the committed runs inside free block b until `budget` bytes
 * went back; returns the bytes released. */
size_t llmem__pool_decommit_block(llmem_pool *p, pblock *b, size_t budget);
/* Unmap an empty superblock; false (and kept) if the resource refuses. */
bool llmem__pool_release_sb(llmem_pool *p, superblock *sb);
/* Free a superblock's host metadata (not its memory). */
void llmem__pool_sb_free_meta(superblock *sb);

/* ---- pool_purge.c: the background purger ------------------------------- */

/* Register p with the process-wide purger, starting its thread on first
 * use. LLMEM_EOS if the thread cannot start. */
llmem_status llmem__pool_purger_register(llmem_pool *p);
/* Take p off the purger's list; returns after any pass over p ends. */
void llmem__pool_purger_unregister(llmem_pool *p);
/* Something became free in p: make sure the purger will look. Any lock. */
void llmem__pool_purger_kick(const llmem_pool *p);

/* ---- pool_slab.c: slabs, guards and fills; the pool lock is held -------- */

/* A block of class cls out of the slabs (counted as out of the slabs; its
 * state byte, in *state, still 0: the caller sets it when it hands the
 * block out); 0 with *st on failure. */
uintptr_t llmem__pool_small_take(llmem_pool *p, unsigned cls, llmem_status *st, uint8_t **state);
/* Give a slab block (index idx of slab s) back. */
void llmem__pool_small_put(llmem_pool *p, slab *s, uintptr_t block, uint32_t idx);
/* Return an empty slab to the page allocator. */
void llmem__pool_slab_release(llmem_pool *p, slab *s);
/* Write the guards around [user, user+n) inside [block, block+bsize). */
void llmem__pool_guards_write(uintptr_t block, size_t bsize, uintptr_t user, size_t n);
/* Read the header at block: requested size and front guard; false if the
 * magic word is damaged. */
bool llmem__pool_guards_header(uintptr_t block, size_t *n, size_t *g);
/* True when both guards are intact. */
bool llmem__pool_guards_intact(uintptr_t block, size_t bsize, uintptr_t user, size_t n);
/* Offset of the first byte of a free block that is not FREED_BYTE, or
 * csize if none. */
size_t llmem__pool_freed_damage(uintptr_t block, size_t csize);

/* ---- pool_tcache.c: thread caches and the fast paths -------------------- */

/* This thread's cache for p, created on first use; NULL when the pool has
 * none or memory for one is short. Takes the lock on first use only. */
tcache *llmem__pool_tcache_get(llmem_pool *p);
/* Return every block of t to the transfer caches or slabs. Lock held. */
void llmem__pool_tcache_flush_all(llmem_pool *p, tcache *t);
/* Return class c's transfer cache to its slabs. Lock held. */
void llmem__pool_xfer_drain(llmem_pool *p, unsigned c);
/* The pthread key's destructor: flush at thread exit. Takes the lock. */
void llmem__pool_tcache_destructor(void *v);
/* Take back the blocks of every thread cache idle (no allocation or free)
 * for the decay delay at `now`: an idle live thread's cache is memory no
 * one uses. Returns when the next cache with blocks will be idle that
 * long, or UINT64_MAX. Pool lock held. */
uint64_t llmem__pool_reclaim_idle(llmem_pool *p, uint64_t now);
/* Freeze the thread caches for llmem_pool_check (pools with large-block
 * stacks): the reclaim handshake's request set on each cache whose owner
 * is not inside a call, so that it waits for the pool lock at its next
 * call and its stacks hold still until the check ends. Pool lock held. */
void llmem__pool_tcaches_freeze(llmem_pool *p);
/* The frozen caches' large-block entries (llmem_pool_check): each names a
 * D_LARGE block of its size marked tcached and the byte counts add up;
 * `flagged` (the marked blocks the walk found) equals their number when
 * every cache was frozen, and is no smaller otherwise. Pool lock held. */
bool llmem__pool_lcache_check(llmem_pool *p, size_t flagged);
/* Free every cache of p (destroy; no other thread uses p any more). */
void llmem__pool_tcaches_destroy(llmem_pool *p);
/* Bytes and blocks in thread and transfer caches (per_class, optional,
 * gets each class's block count added). The tcache list lock (tlock) held. */
void llmem__pool_cached_totals(const llmem_pool *p, uint64_t *bytes, uint64_t *blocks, uint64_t *per_class);
/* Record a new peak of used bytes (cached blocks not counted). Lock held. */
void llmem__pool_note_peak(llmem_pool *p);
/* Allocate size bytes at align (>= the pool's) from the slabs or page
 * runs, counted; NULL with *st. Lock held. */
void *llmem__pool_alloc_locked(llmem_pool *p, size_t size, size_t align, llmem_status *st);

/* ---- pool_free.c: the locked free path --------------------------------- */

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

/* ---- pool_fence.c: fenced frees ---------------------------------------- */

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

/* Debug level 3: the whole pool checked after a public call that changes
 * it (alloc, free, realloc; debug.h); nothing at lower levels. */
#define POOL_WALK(p) LLMEM_DEBUG_WALK((p) ? llmem_pool_check(p) : LLMEM_OK)

/* ---- the thread caches' fast paths (pool_tcache.c, and pool_shim.c for the
 * malloc shim's own): leaves, no lock, no call ---------------------------- */

/* The memo of this thread's last pool and its cache (pool_tcache.c),
 * initial-exec TLS: the library is built position-independent,
 * where the default (global-dynamic) model makes every access a call of
 * __tls_get_addr as the compiler sees it (the linker relaxes it to a move
 * only in the executable), so both fast paths saved and restored
 * callee-saved registers around a call that never happens: four pushes and
 * four pops per allocation. Initial-exec takes the static TLS block, which
 * a library loaded at start-up (linked, or LD_PRELOADed like the shim) has;
 * one dlopened late uses glibc's static TLS surplus (24 bytes of it), as
 * mimalloc's default heap pointer does. It also never allocates on first
 * access, which the malloc shim needs. */
typedef struct llmem__tcache_memo {
    uint64_t id; /* the pool's: ids are unique for the process's life, never 0 */
    tcache *tc;
} llmem__tcache_memo;
extern _Thread_local __attribute__((tls_model("initial-exec"), visibility("hidden"))) llmem__tcache_memo llmem__tl_last;

static inline void st_u32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

/* Keep a bin's address in one register: GCC otherwise rebuilds each
 * field's address from the cache and the class, an add and a shift per
 * field (callgrind, batch_free: 3 of the allocation's 47 instructions and
 * 4 of the free's 82). */
#define pin_reg(x) __asm__("" : "+r"(x))

/* The owner's half of the handshake (see the top of pool_tcache.c). */
static inline void owner_enter(tcache *t)
{
    __atomic_store_n(&t->busy, 1, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST); /* the reclaimer's membarrier orders it */
}

static inline bool owner_reclaimed(const tcache *t) { return __atomic_load_n(&t->reclaim, __ATOMIC_RELAXED) != 0; }

static inline void owner_leave(tcache *t)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n(&t->busy, 0, __ATOMIC_RELEASE);
}

static inline void st_u64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline uint32_t ld_u32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

/* One more on a counter that only this thread writes and stats read with
 * relaxed loads: on x86-64 one add to memory (an aligned 8-byte store is
 * never seen torn), where the relaxed load and store that C11 offers take
 * three instructions (GCC fuses no atomic access into an add): 2 of the
 * free's 66 and 2 of the allocation's 44 (callgrind, batch_free). TSan
 * builds keep the atomics, which it can see. */
static inline void count_one(uint64_t *c)
{
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
    __asm__("addq $1, %0" : "+m"(*c));
#else
    st_u64(c, *c + 1);
#endif
}

/* Does this thread mark the blocks it caches? In a pool with marks, once
 * its second thread cache exists (pool_internal.h, "block states"). */
static inline bool marking(const llmem_pool *p) { return __atomic_load_n(&p->marks_on, __ATOMIC_RELAXED); }

/* The slab block a pointer starts, read from its unit's slab entry in the
 * address map without touching the block or the superblock: its class (or
 * -1 if it is not a block boundary of a slab of this pool: then the slow
 * path explains) and its state byte. Three dependent loads: map root, map
 * entry, state byte. */
static inline int small_block_of(const llmem_pool *p, uintptr_t a, uint8_t **state)
{
    uint32_t idx;
    const slab_unit *su = unit_entry(a);
    int c = unit_block(p, su, a, &idx);
    if (c >= 0) *state = su->state + idx;
    return c;
}

/* May the small block at a, whose state byte reads sv, be pushed onto a
 * thread cache? Handed out by the unmarked regime (1), or out of its slab in
 * the marked one (STATE_OUT) without its mark, i.e. not free in a cache
 * already. */
static inline bool small_live(const llmem_pool *p, uintptr_t a, uint8_t sv)
{
    return sv == 1 || (sv == STATE_OUT && mark_load(a) != block_mark(p, a));
}

/* Push the live small block ptr of class c (its state byte `state`) onto
 * bin b of this thread's cache, which holds n < cap blocks: marked free,
 * counted, poisoned on a host pool. The owner is entered (owner_enter). */
static inline __attribute__((always_inline)) void bin_push(llmem_pool *p, tbin *b, size_t c, uint32_t n, void *ptr,
                                                           uint8_t *state, uint8_t sv)
{
    tslot *slot = &b->items[n];
    if (sv != 1 || marking(p)) { /* sv is 1 or STATE_OUT (small_live) */
        if (sv == 1) state_set(state, STATE_OUT); /* into the marked regime, once per block */
        mark_store((uintptr_t)ptr, block_mark(p, (uintptr_t)ptr));
        *slot = (tslot){(void *)((uintptr_t)ptr | TSLOT_MARKED), state};
    } else {
        state_set(state, 0);
        *slot = (tslot){ptr, state};
    }
    st_u32(&b->count, n + 1);
    count_one(&b->frees);
    if (p->host) LLMEM_POISON(ptr, p->cls.size[c]);
}

/* A thread-cache hit: a small block of `size` bytes (at least 1) popped
 * from this thread's cache of p, found through the memo; its state byte
 * set through the slot, with no lookup. NULL, nothing done, when the size
 * is past the small classes, this thread's memo is another pool's, or the
 * bin is empty or being reclaimed. No lock, no call: llmem_pool_alloc's
 * fast path and the malloc shim's (pool_shim.c). */
static inline __attribute__((always_inline)) void *llmem__tcache_pop(llmem_pool *p, size_t size)
{
    if (LLMEM_LIKELY(size - 1 < p->cls.max_small && llmem__tl_last.id == p->id)) {
        tcache *t = llmem__tl_last.tc;
        /* llmem__class_of with size - 1 at hand: ceil(size / align) is
         * ((size - 1) >> shift) + 1 for any size of at least 1. */
        size_t c = p->cls.lookup[((size - 1) >> p->cls.align_shift) + 1];
        tbin *bin = &t->bin[c];
        pin_reg(bin);
        owner_enter(t);
        /* reclaim first: once it reads 0, no reclaimer touches the bins
         * until busy drops (and a past one's writes were acknowledged under
         * the pool lock). */
        uint32_t n = LLMEM_LIKELY(!owner_reclaimed(t)) ? ld_u32(&bin->count) : 0;
        if (LLMEM_LIKELY(n)) {
            tslot got = bin->items[n - 1];
            uintptr_t b = (uintptr_t)got.block & ~(uintptr_t)TSLOT_MARKED;
            st_u32(&bin->count, n - 1);
            count_one(&bin->allocs);
            if (b == (uintptr_t)got.block) state_set(got.state, 1);
            else mark_store(b, 0); /* a store: the block's line need not be here yet */
            owner_leave(t);
            if (p->host) LLMEM_UNPOISON((void *)b, size);
            if (!b) __builtin_unreachable(); /* a caller's test of the result folds away on a hit */
            return (void *)b;
        }
        owner_leave(t);
    }
    return NULL;
}

/* A free onto this thread's cache t of p (the memo's): 1 when ptr, a live
 * small block start of p, was pushed; 0 when it is a small block start of
 * p that cannot be (free already by its state byte, a full bin, a
 * reclaim: the locked path decides); -1 when it is none (a large block,
 * another pool's, a bad pointer). The slab cannot change under us: it
 * holds this live block. */
static inline __attribute__((always_inline)) int llmem__tcache_push(llmem_pool *p, tcache *t, void *ptr)
{
    uint8_t *state;
    int c = small_block_of(p, (uintptr_t)ptr, &state);
    if (LLMEM_UNLIKELY(c < 0)) return -1;
    uint8_t sv = state_get(state);
    if (LLMEM_LIKELY(small_live(p, (uintptr_t)ptr, sv))) {
        tbin *b = &t->bin[(size_t)c];
        pin_reg(b);
        owner_enter(t);
        /* reclaim first: the count is the reclaimer's until it reads 0 (and
         * a relaxed load, which the compiler does not hoist above that
         * test: TSan saw a plain one turned into a load and a conditional
         * move) */
        if (LLMEM_LIKELY(!owner_reclaimed(t))) {
            uint32_t n = ld_u32(&b->count);
            if (LLMEM_LIKELY(n < b->cap)) {
                bin_push(p, b, (size_t)c, n, ptr, state, sv);
                owner_leave(t);
                return 1;
            }
        }
        owner_leave(t);
    }
    return 0;
}

#endif
