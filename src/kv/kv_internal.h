/*
 * kv_internal.h - what the KV cache manager's files share (llmem/kv.h).
 * Not installed.
 *
 *   kv.c            the manager: create/destroy, metadata, the sequence
 *                   table, and every public call (checks, lock, then the
 *                   strategy's ops)
 *   kv_paged.c      PAGED: slabs, blocks, block tables, windows
 *   kv_prefix.c     PAGED's prefix cache: chain hashes, the table, the LRU
 *   kv_swap.c       PAGED's offload: swap out and in
 *   kv_fixed.c      STATIC and BUCKETS: one pool buffer per layer
 *   kv_contiguous.c CONTIGUOUS: one reservation per sequence, committed as it grows
 *
 * Each strategy is one static const llmem__kv_ops table (ggml-backend
 * style); the public wrappers in kv.c do the argument checks, take the
 * lock, and call the table, applying the default where a member is NULL.
 * One heading per file below for its cross-file internals, as mimalloc's
 * internal.h; kv.c's file-top comment states the layout and invariants.
 */
#ifndef LLMEM_KV_INTERNAL_H
#define LLMEM_KV_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "llmem/kv.h"

enum { B_ABSENT = 0, B_FREE = 1, B_USED = 2, B_CACHED = 3 }; /* kv_block.state */
#define NONE UINT32_MAX                                      /* no block, no slab, empty table slot */

typedef struct kv_block {
    uint32_t ref;
    uint8_t state;
    bool hashed;            /* registered in the prefix cache */
    uint32_t fill;          /* positions held in it; worked out by get_stats */
    uint32_t lru_prev, lru_next;
    uint64_t hash, parent;  /* prefix cache key, and the hash before this block */
} kv_block;

typedef struct kv_slab {     /* storage: slab_base; free stack: slab_free (llmem_kv) */
    uint32_t nfree;         /* blocks on its free stack */
    bool live;              /* false: absent (its storage went back to the pool) */
} kv_slab;

typedef struct kv_buf {     /* STATIC / BUCKETS / CONTIGUOUS: one buffer per layer */
    size_t capacity;        /* tokens */
    int cls;                /* BUCKETS class */
    struct kv_buf *next;    /* idle list of its class */
    void *map;              /* CONTIGUOUS: the reservation, layers x kv->vstride bytes */
    size_t committed;       /* CONTIGUOUS: bytes committed at the start of every layer's range */
    void *base[];           /* [layers] */
} kv_buf;

typedef struct kv_seq {
    uint32_t gen;
    bool live;
    size_t length, first, window;
    uint32_t *blocks;       /* PAGED: [cap] block ids, nblocks held, oldest first */
    size_t nblocks, cap;
    bool hashable;          /* every token so far was given: blocks can be registered */
    uint64_t chain;         /* hash of every token of the full blocks so far */
    int32_t *partial;       /* [B] tokens of the current partial block (prefix cache on) */
    kv_buf *buf;            /* STATIC / BUCKETS / CONTIGUOUS */
    uint32_t next_free;
    bool swapped;           /* PAGED: its KV waits in swap memory; nblocks is 0 */
    void *swap;             /* [layers][swap_nblocks][block_bytes] from swap_res; NULL when empty */
    size_t swap_nblocks;    /* blocks it takes back on swap-in */
    size_t swap_map;        /* bytes mapped at swap (rounded) */
} kv_seq;

typedef struct llmem__kv_ops llmem__kv_ops;

struct llmem_kv {
    pthread_mutex_t lock;
    llmem_pool *meta;       /* private host pool of every table here, this struct included */
    char name[32];
    llmem_kv_strategy strategy;
    const llmem__kv_ops *ops; /* the strategy's table */
    uint32_t layers, heads, dim, B, max_len;
    size_t elem, token_bytes, block_bytes, budget;
    llmem_pool *pool;
    bool own_pool;
    llmem_resource *res;
    bool host, prefix;
    llmem_resource *swap_res; /* borrowed host resource for swapped sequences; NULL: no swapping */
    size_t swap_budget;       /* cap on st.swap_bytes_held; 0 = none */
    size_t vgran, vstride;    /* CONTIGUOUS: commit granule, and bytes reserved per layer */
    /* PAGED */
    uint32_t S;             /* blocks per slab */
    kv_slab *slabs;         /* [slab_cap] */
    uint32_t nslabs;        /* slots, live or absent */
    uint32_t slab_cap;      /* slots the per-slab and per-block arrays have room for */
    void **slab_base;       /* [slab_cap * layers]: each slab's storage per layer, NULL when absent */
    uint32_t *slab_free;    /* [slab_cap * S]: each slab's stack of free block ids */
    kv_block *blocks;       /* [slab_cap * S], nslabs * S in use */
    int32_t *btokens;       /* prefix cache: [slab_cap * S * B] tokens of each block */
    uint32_t lru_head, lru_tail;
    size_t lru_count;       /* cached blocks */
    uint64_t *ht_hash;      /* prefix table [ht_cap], at least 2 * slab_cap * S slots */
    uint32_t *ht_block;     /* [ht_cap]; NONE = empty */
    size_t ht_cap, ht_count;
    /* BUCKETS */
    int nclasses;
    kv_buf *idle[40];
    /* sequences */
    kv_seq *seqs;
    uint32_t nseqs, seq_cap, seq_free;
    llmem_kv_stats st;
};

/*
 * One strategy. Every member runs with kv->lock held (or with kv owned
 * alone, for init and destroy) after kv.c has checked the arguments and
 * the sequence (live, not swapped unless the member says otherwise).
 * Optional members may be NULL; kv.c then applies the default named.
 */
struct llmem__kv_ops {
    const char *name;
    bool windows;           /* sequences may have a sliding window (else LLMEM_ENOTSUP) */
    /* create, after the geometry is set: checks and presizing; LLMEM_OK or
     * the status create returns. NULL: nothing to do. `name` is the
     * options' name as given (kv->name may be cut short). */
    llmem_status (*init)(llmem_kv *kv, const llmem_kv_options *o, const char *name);
    /* Give back all storage (sequences, idle buffers, slabs, swap regions). */
    void (*destroy)(llmem_kv *kv);
    /* A new sequence's storage (s->window set). On failure kv.c releases
     * the slot; the member counts a preemption when that is what it was.
     * NULL: a sequence starts with nothing. */
    llmem_status (*seq_init)(llmem_kv *kv, kv_seq *s);
    /* Let go of everything s holds (it may be swapped out). */
    void (*seq_fini)(llmem_kv *kv, kv_seq *s);
    /* Child c (new, window set) shares or copies parent p's n positions;
     * kv.c copies the lengths and hashes after. On failure c holds
     * nothing but its slot tables, which kv.c releases. */
    llmem_status (*fork)(llmem_kv *kv, kv_seq *c, const kv_seq *p);
    /* n > 0 more positions (tokens NULL: not given); all or nothing. */
    llmem_status (*append)(llmem_kv *kv, kv_seq *s, size_t n, const int32_t *tokens);
    /* Drop what lies past len (first <= len <= length; forget: a rollback).
     * NULL: only the length changes. */
    void (*truncate)(llmem_kv *kv, kv_seq *s, size_t len, bool forget);
    /* The K base of the block holding held position pos in one layer. */
    char *(*block_base)(const llmem_kv *kv, const kv_seq *s, uint32_t layer, size_t pos);
    /* blocks and capacity of llmem_kv_seq_info (the rest is kv.c's). */
    void (*seq_info)(const llmem_kv *kv, const kv_seq *s, llmem_kv_seq_info *out);
    /* free, cached and used blocks of llmem_kv_room. NULL: zeros. */
    void (*room)(const llmem_kv *kv, llmem_kv_room *r);
    /* Give back what is held idle (trim). NULL: nothing is. */
    void (*trim)(llmem_kv *kv, bool evict_cached);
    /* The strategy's invariants, after kv.c checked every sequence's
     * positions: LLMEM_OK, LLMEM_ECORRUPT naming the first violation, or
     * LLMEM_ENOMEM when the check could not get its scratch. */
    llmem_status (*check)(llmem_kv *kv);
    /* blocks_used/cached/free/total of *s (the rest copied from kv->st,
     * those three zeroed) and the token slots holding data. */
    void (*stats)(llmem_kv *kv, llmem_kv_stats *s, uint64_t *written);
    /* Swap s out / in (kv->swap_res set). NULL: LLMEM_ENOTSUP. */
    llmem_status (*swap_out)(llmem_kv *kv, kv_seq *s);
    llmem_status (*swap_in)(llmem_kv *kv, kv_seq *s);
    /* Prefix matching on an empty sequence (kv->prefix on). NULL: the
     * prefix cache is not offered (create refuses prefix_cache). */
    llmem_status (*match_prefix)(llmem_kv *kv, kv_seq *s, const int32_t *tokens, size_t n, size_t *matched);
};

/* ---- kv.c --------------------------------------------------------------------------- */

enum {
    KV_META_FIRST_SUPERBLOCK = 64 << 10, /* the metadata pool's first superblock */
    KV_TABLE_PREALLOC = 16384,           /* block-table entries a sequence is created with, at most (64 KiB) */
    KV_META_PRESIZE = 1 << 20            /* bytes of per-slab arrays sized for the budget at create, at most */
};

/* Metadata from the private pool: count * size bytes (at least 1),
 * uninitialised; NULL when count * size overflows or host memory is short.
 * realloc keeps the contents (p NULL: allocate; NULL on failure with p
 * untouched); free(NULL) is a no-op. Caller holds the lock or owns kv. */
void *llmem__kv_meta_alloc(llmem_kv *kv, size_t count, size_t size);
void *llmem__kv_meta_realloc(llmem_kv *kv, void *p, size_t count, size_t size);
void llmem__kv_meta_free(llmem_kv *kv, void *p);

/* n bytes between storage and storage or host memory: memcpy on the host,
 * the resource's copy on a device. */
static inline llmem_status llmem__kv_copy(llmem_kv *kv, void *dst, const void *src, size_t n)
{
    if (!n) return LLMEM_OK;
    if (kv->host) {
        memcpy(dst, src, n);
        return LLMEM_OK;
    }
    return llmem_resource_copy(kv->res, dst, src, n);
}

/* Storage held changed by delta bytes (all layers); keeps the peak. */
static inline void llmem__kv_note_reserved(llmem_kv *kv, int64_t delta)
{
    kv->st.bytes_reserved = (uint64_t)((int64_t)kv->st.bytes_reserved + delta);
    if (kv->st.bytes_reserved > kv->st.bytes_reserved_peak) kv->st.bytes_reserved_peak = kv->st.bytes_reserved;
}

/* Whether `more` bytes of storage fit the budget (always, without one). */
static inline bool llmem__kv_budget_allows(const llmem_kv *kv, size_t more)
{
    return !kv->budget || (more <= kv->budget && kv->st.bytes_reserved <= kv->budget - more);
}

/* ---- kv_paged.c --------------------------------------------------------------------- */

const llmem__kv_ops *llmem__kv_paged_ops(void);

/* Room for `want` slab slots in the per-slab and per-block arrays (and the
 * prefix table); false when host memory is short, nothing else changed. */
bool llmem__kv_slots_reserve(llmem_kv *kv, size_t want);
/* Take a block for new data (ref 1), preferring slab `hint`; LLMEM_ENOMEM. */
llmem_status llmem__kv_block_take(llmem_kv *kv, uint32_t hint, uint32_t *out);
/* Whether n blocks can be had (free, new slabs, evicting cached ones). */
bool llmem__kv_blocks_available(const llmem_kv *kv, size_t n);
/* A sequence lets go of block b (cached if registered, else free). */
void llmem__kv_block_put(llmem_kv *kv, uint32_t b);
/* Room for n entries in s's block table; false when host memory is short. */
bool llmem__kv_seq_reserve(llmem_kv *kv, kv_seq *s, size_t n);
/* s lets go of every block it holds, newest first. */
void llmem__kv_seq_drop_blocks(llmem_kv *kv, kv_seq *s);
/* First block index a window sequence still holds at `length`; 0 without one. */
size_t llmem__kv_window_keep_from(const llmem_kv *kv, const kv_seq *s, size_t length);

static inline void **llmem__kv_slab_base(const llmem_kv *kv, uint32_t i)
{
    return &kv->slab_base[(size_t)i * kv->layers];
}

/* Block b's K in one layer (its V follows B tokens on). */
static inline char *llmem__kv_block_k(const llmem_kv *kv, uint32_t layer, uint32_t b)
{
    return (char *)llmem__kv_slab_base(kv, b / kv->S)[layer] + (size_t)(b % kv->S) * kv->block_bytes;
}

/* ---- kv_prefix.c -------------------------------------------------------------------- */

/* The chain hash of a full block of n tokens after `parent` (never 0). */
uint64_t llmem__kv_hash_block(uint64_t parent, const int32_t *t, uint32_t n);
void llmem__kv_lru_remove(llmem_kv *kv, uint32_t b);
void llmem__kv_lru_push(llmem_kv *kv, uint32_t b);
/* The cached block registered under hash h whose tokens and parent match; NONE. */
uint32_t llmem__kv_ht_find(const llmem_kv *kv, uint64_t h, uint64_t parent, const int32_t *tokens);
/* Rehash the prefix table into ncap slots; false (table unchanged) when short of memory. */
bool llmem__kv_ht_resize(llmem_kv *kv, size_t ncap);
void llmem__kv_ht_remove(llmem_kv *kv, uint32_t b);
/* Block b (full) ends s's next chain link; registered only if `keep`. */
void llmem__kv_register_block(llmem_kv *kv, kv_seq *s, uint32_t b, bool keep);
/* The PAGED match_prefix member. */
llmem_status llmem__kv_prefix_match(llmem_kv *kv, kv_seq *s, const int32_t *tokens, size_t n, size_t *matched);

/* ---- kv_swap.c ---------------------------------------------------------------------- */

/* The PAGED swap_out and swap_in members. */
llmem_status llmem__kv_swap_out(llmem_kv *kv, kv_seq *s);
llmem_status llmem__kv_swap_in(llmem_kv *kv, kv_seq *s);
/* Unmap s's swap memory (it is swapped) and forget it. */
void llmem__kv_swap_release(llmem_kv *kv, kv_seq *s);

/* ---- kv_fixed.c --------------------------------------------------------------------- */

const llmem__kv_ops *llmem__kv_static_ops(void);
const llmem__kv_ops *llmem__kv_buckets_ops(void);

/* Bytes of one layer's buffer for `capacity` tokens (whole blocks). */
static inline size_t llmem__kv_buf_bytes(const llmem_kv *kv, size_t capacity)
{
    return (capacity + kv->B - 1) / kv->B * kv->block_bytes;
}
/* Release one buffer of either kind (pool blocks, or a CONTIGUOUS
 * reservation) and its descriptor. */
void llmem__kv_buf_release(llmem_kv *kv, kv_buf *b);
/* Copy the first n tokens of one buffer into another, every layer. */
llmem_status llmem__kv_buf_copy(llmem_kv *kv, kv_buf *dst, const kv_buf *src, size_t n);
/* The end of a buffer strategy's fork of p into c: `st` says whether c's
 * buffer was made; if so, p's tokens are copied into it. If either failed,
 * fini(kv, c) undoes c and the fork counts as a preemption. Returns the
 * status. */
llmem_status llmem__kv_buf_fork_fill(llmem_kv *kv, kv_seq *c, const kv_seq *p, llmem_status st,
                                     void (*fini)(llmem_kv *kv, kv_seq *s));
/* Every buffer strategy's members over s->buf: the append's max_seq_len
 * check (*fits: the buffer already holds length + n), block_base,
 * seq_info, check, destroy (release every buffer, idle ones too), and the
 * stats part that does not depend on how blocks_total is counted. */
llmem_status llmem__kv_buf_append_check(llmem_kv *kv, kv_seq *s, size_t n, bool *fits);
char *llmem__kv_buf_block_base(const llmem_kv *kv, const kv_seq *s, uint32_t layer, size_t pos);
void llmem__kv_buf_seq_info(const llmem_kv *kv, const kv_seq *s, llmem_kv_seq_info *out);
llmem_status llmem__kv_buf_check(llmem_kv *kv);
void llmem__kv_buf_destroy(llmem_kv *kv);
void llmem__kv_buf_stats_used(const llmem_kv *kv, llmem_kv_stats *s, uint64_t *written);
/* The ops-table members every buffer strategy (STATIC, BUCKETS,
 * CONTIGUOUS) shares: one buffer per sequence, no windows, no truncate,
 * room, swap or prefix matching. Each table starts with it and names the
 * rest. */
#define LLMEM__KV_BUF_OPS                                                                                         \
    .windows = false, .destroy = llmem__kv_buf_destroy, .truncate = NULL, .block_base = llmem__kv_buf_block_base, \
    .seq_info = llmem__kv_buf_seq_info, .room = NULL, .check = llmem__kv_buf_check, .swap_out = NULL,            \
    .swap_in = NULL, .match_prefix = NULL

/* ---- kv_contiguous.c ---------------------------------------------------------------- */

const llmem__kv_ops *llmem__kv_contiguous_ops(void);

#endif /* LLMEM_KV_INTERNAL_H */
