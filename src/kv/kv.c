/*
 * kv.c - the KV cache manager: paged blocks with prefix sharing and
 * windows, and the static and bucket baselines, behind one interface.
 *
 * PAGED. Blocks are numbered 0..; block b lives in slab b / S at index
 * b % S, and every layer has its own slab storage (S * block_bytes from the
 * pool). A block is ABSENT (its slab was given back), FREE (on its slab's
 * free stack), USED (ref > 0 sequences hold it) or CACHED (ref 0, but
 * registered in the prefix cache and on the LRU list). A new block comes
 * from the lowest slab with a free one (so high slabs drain and can go),
 * else from a new slab if the budget allows, else by evicting the least
 * recently used cached block. A slab that becomes wholly free goes back to
 * the pool when at least a slab's worth of free blocks remains elsewhere.
 *
 * Sequences hold block ids in position order from block first/B. An append
 * first works out exactly how many blocks it needs - new positions, less
 * the oldest blocks a window lets it recycle, plus one if the partial last
 * block is shared (referenced twice, or registered in the prefix cache) and
 * must be copied - and takes them all before changing anything, so it
 * either succeeds whole or fails with nothing changed.
 *
 * Prefix cache: a full block is registered under the hash of every token up
 * to and including it (a chain: the previous block's hash mixed with this
 * block's tokens); the block keeps its tokens and its parent's hash, so a
 * lookup compares them exactly and a hash collision cannot hand out the
 * wrong data. Open addressing with backward-shift deletion.
 *
 * STATIC and BUCKETS keep, per sequence, one buffer per layer laid out as a
 * run of blocks; BUCKETS keeps idle buffers per capacity class for reuse.
 *
 * Metadata. Every table the manager keeps (the llmem_kv itself, sequences,
 * block tables, partial-block tokens, per-slab and per-block arrays, the
 * prefix table, buffer descriptors, scratch) comes from a private host pool
 * the manager creates with it (kv_meta_*), never from libc malloc, so an
 * engine can show that its decode loop does not call malloc. That pool is
 * separate from the storage pool even when storage is on the host: the
 * storage pool's stats and resource calls are then KV storage alone (what
 * budgets, tracking and fault-injection campaigns on the storage resource
 * see), one code path serves host and device storage, and destroy drops
 * all metadata at once. It costs each manager a 64 KiB first superblock and
 * one pool's bookkeeping. It runs over options.meta_resource (default the
 * plain os resource, llmem_resource_default), purges only on its own slow
 * paths (no background thread touches it), and is destroyed last.
 * Appends make no metadata call in the common case: a PAGED sequence's
 * block table is sized at creation for all it can hold (ceil(max_seq_len /
 * B) + 1 entries, or window/B + 2 for a window, up to KV_TABLE_PREALLOC
 * entries; longer ones grow geometrically) and its partial-block buffer
 * too when the prefix cache is on. The per-slab and per-block arrays (and
 * the prefix table, kept at least twice the number of blocks so an insert
 * never grows it) grow geometrically when a new slab slot is added, and
 * are sized at creation for the budget's slabs when there is a budget (up
 * to KV_META_PRESIZE bytes). An append of more than 64 blocks takes its
 * scratch from the metadata pool. The only libc calls left are those the
 * pools make for their own bookkeeping.
 *
 * Offload (PAGED). A swapped-out sequence keeps its slot, length, window,
 * chain hash and partial-block tokens, but holds no block (nblocks 0): its
 * blocks' bytes sit in one region mapped from the swap resource for it,
 * laid out [layer][table index][block_bytes], and swap_nblocks says how
 * many to take back. Swap-out copies, then drops its blocks as a free
 * does; swap-in takes fresh blocks exactly as an append would (checked
 * with blocks_available first), copies back, then unmaps. Its block table
 * keeps its capacity, so swap-in needs no metadata. One mapping per
 * swapped sequence, not a pool over the swap resource: swaps are rare next
 * to appends, the region is returned whole, and swap_bytes_held is then
 * exactly what the swap resource holds for the manager.
 *
 * All state is guarded by one mutex (swap copies run under it). Device
 * memory is only ever touched through the resource's copy.
 */
#include <pthread.h>
#include <string.h>

#include "internal.h"
#include "llmem/kv.h"

enum { B_ABSENT = 0, B_FREE = 1, B_USED = 2, B_CACHED = 3 };
#define NONE UINT32_MAX

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
    kv_buf *buf;            /* STATIC / BUCKETS */
    uint32_t next_free;
    bool swapped;           /* PAGED: its KV waits in swap memory; nblocks is 0 */
    void *swap;             /* [layers][swap_nblocks][block_bytes] from swap_res; NULL when empty */
    size_t swap_nblocks;    /* blocks it takes back on swap-in */
    size_t swap_map;        /* bytes mapped at swap (rounded) */
} kv_seq;

struct llmem_kv {
    pthread_mutex_t lock;
    llmem_pool *meta;       /* private host pool of every table here, this struct included */
    char name[32];
    llmem_kv_strategy strategy;
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

/* ---- helpers ----------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t hash_block(uint64_t parent, const int32_t *t, uint32_t n)
{
    uint64_t h = mix64(parent ^ 0x6b76636163686521ull);
    for (uint32_t i = 0; i < n; i++) h = mix64(h ^ ((uint64_t)(uint32_t)t[i] + 0x9e3779b97f4a7c15ull * (i + 1)));
    return h ? h : 1;
}

static size_t dtype_size(llmem_kv_dtype d)
{
    switch (d) {
    case LLMEM_KV_F16: case LLMEM_KV_BF16: return 2;
    case LLMEM_KV_F32: return 4;
    case LLMEM_KV_I8: return 1;
    default: return 0;
    }
}

static llmem_status copy_bytes(llmem_kv *kv, void *dst, const void *src, size_t n)
{
    if (!n) return LLMEM_OK;
    if (kv->host) {
        memcpy(dst, src, n);
        return LLMEM_OK;
    }
    return llmem_resource_copy(kv->res, dst, src, n);
}

static void note_reserved(llmem_kv *kv, int64_t delta)
{
    kv->st.bytes_reserved = (uint64_t)((int64_t)kv->st.bytes_reserved + delta);
    if (kv->st.bytes_reserved > kv->st.bytes_reserved_peak) kv->st.bytes_reserved_peak = kv->st.bytes_reserved;
}

static bool budget_allows(const llmem_kv *kv, size_t more)
{
    return !kv->budget || (more <= kv->budget && kv->st.bytes_reserved <= kv->budget - more);
}

/* ---- metadata ----------------------------------------------------------------- */

enum {
    KV_META_FIRST_SUPERBLOCK = 64 << 10, /* the metadata pool's first superblock */
    KV_TABLE_PREALLOC = 16384,           /* block-table entries a sequence is created with, at most (64 KiB) */
    KV_META_PRESIZE = 1 << 20            /* bytes of per-slab arrays sized for the budget at create, at most */
};

/* count * size bytes from the metadata pool (at least 1), uninitialised;
 * NULL when count * size overflows or host memory is short. Caller holds
 * the lock, or owns kv alone (create). */
static void *kv_meta_alloc(llmem_kv *kv, size_t count, size_t size)
{
    size_t n;
    if (!llmem__mul_ok(count, size, &n)) return NULL;
    return llmem_pool_alloc(kv->meta, n ? n : 1, NULL);
}

/* Resize a block from kv_meta_alloc (p NULL: allocate) to count * size
 * bytes, keeping its contents; NULL on failure with p untouched. */
static void *kv_meta_realloc(llmem_kv *kv, void *p, size_t count, size_t size)
{
    size_t n;
    if (!llmem__mul_ok(count, size, &n)) return NULL;
    return llmem_pool_realloc(kv->meta, p, n ? n : 1, NULL);
}

/* Return a block from kv_meta_alloc; NULL is a no-op. */
static void kv_meta_free(llmem_kv *kv, void *p)
{
    if (p) llmem_pool_free(kv->meta, p);
}

/* ---- sequences table ----------------------------------------------------------- */

static kv_seq *seq_of(llmem_kv *kv, llmem_kv_seq h)
{
    uint32_t i = (uint32_t)(h & 0xffffffffu), gen = (uint32_t)(h >> 32);
    if (!i || i > kv->nseqs || !kv->seqs[i - 1].live || kv->seqs[i - 1].gen != gen) {
        llmem__fail(LLMEM_EINVAL, "kv '%s': sequence 0x%llx is not live", kv->name, (unsigned long long)h);
        return NULL;
    }
    return &kv->seqs[i - 1];
}

static llmem_status seq_new(llmem_kv *kv, kv_seq **out, llmem_kv_seq *h)
{
    uint32_t i;
    if (kv->seq_free) {
        i = kv->seq_free - 1;
        kv->seq_free = kv->seqs[i].next_free;
    } else {
        if (kv->nseqs == kv->seq_cap) {
            uint32_t ncap = kv->seq_cap ? kv->seq_cap * 2 : 64;
            kv_seq *n = kv_meta_realloc(kv, kv->seqs, ncap, sizeof *n);
            if (!n) return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of memory for sequences", kv->name);
            kv->seqs = n;
            kv->seq_cap = ncap;
        }
        i = kv->nseqs++;
        kv->seqs[i].gen = 0;
    }
    kv_seq *s = &kv->seqs[i];
    uint32_t gen = s->gen + 1 ? s->gen + 1 : 1;
    memset(s, 0, sizeof *s);
    s->gen = gen;
    s->live = true;
    s->hashable = true;
    *out = s;
    *h = (uint64_t)gen << 32 | (i + 1);
    return LLMEM_OK;
}

static void seq_release_slot(llmem_kv *kv, kv_seq *s)
{
    kv_meta_free(kv, s->blocks);
    kv_meta_free(kv, s->partial);
    s->blocks = NULL;
    s->partial = NULL;
    s->live = false;
    uint32_t i = (uint32_t)(s - kv->seqs);
    s->next_free = kv->seq_free;
    kv->seq_free = i + 1;
}

/* ---- PAGED: slabs and blocks ------------------------------------------------------- */

static void lru_remove(llmem_kv *kv, uint32_t b)
{
    kv_block *x = &kv->blocks[b];
    if (x->lru_prev != NONE) kv->blocks[x->lru_prev].lru_next = x->lru_next;
    else kv->lru_head = x->lru_next;
    if (x->lru_next != NONE) kv->blocks[x->lru_next].lru_prev = x->lru_prev;
    else kv->lru_tail = x->lru_prev;
    x->lru_prev = x->lru_next = NONE;
    kv->lru_count--;
}

static void lru_push(llmem_kv *kv, uint32_t b)
{
    kv_block *x = &kv->blocks[b];
    x->lru_next = NONE;
    x->lru_prev = kv->lru_tail;
    if (kv->lru_tail != NONE) kv->blocks[kv->lru_tail].lru_next = b;
    else kv->lru_head = b;
    kv->lru_tail = b;
    kv->lru_count++;
}

static size_t ht_slot(const llmem_kv *kv, uint64_t h) { return (size_t)mix64(h) & (kv->ht_cap - 1); }

/* The cached block registered under hash h whose tokens and parent match. */
static uint32_t ht_find(const llmem_kv *kv, uint64_t h, uint64_t parent, const int32_t *tokens)
{
    if (!kv->ht_cap) return NONE;
    for (size_t i = ht_slot(kv, h);; i = (i + 1) & (kv->ht_cap - 1)) {
        uint32_t b = kv->ht_block[i];
        if (b == NONE) return NONE;
        if (kv->ht_hash[i] == h && kv->blocks[b].parent == parent &&
            !memcmp(&kv->btokens[(size_t)b * kv->B], tokens, kv->B * sizeof *tokens))
            return b;
    }
}

/* Rehash the prefix table into ncap slots (a power of two above twice its
 * count); false, with the table as it was, when host memory is short. */
static bool ht_resize(llmem_kv *kv, size_t ncap)
{
    uint64_t *nh = kv_meta_alloc(kv, ncap, sizeof *nh);
    uint32_t *nb = kv_meta_alloc(kv, ncap, sizeof *nb);
    if (!nh || !nb) {
        kv_meta_free(kv, nh);
        kv_meta_free(kv, nb);
        return false;
    }
    for (size_t i = 0; i < ncap; i++) nb[i] = NONE;
    for (size_t i = 0; i < kv->ht_cap; i++) {
        if (kv->ht_block[i] == NONE) continue;
        size_t j = (size_t)mix64(kv->ht_hash[i]) & (ncap - 1);
        while (nb[j] != NONE) j = (j + 1) & (ncap - 1);
        nh[j] = kv->ht_hash[i];
        nb[j] = kv->ht_block[i];
    }
    kv_meta_free(kv, kv->ht_hash);
    kv_meta_free(kv, kv->ht_block);
    kv->ht_hash = nh;
    kv->ht_block = nb;
    kv->ht_cap = ncap;
    return true;
}

/* Register block b (hash and parent set). The table has at least twice as
 * many slots as there are blocks (slots_reserve), so it never grows here;
 * the check stays as a guard. */
static void ht_insert(llmem_kv *kv, uint32_t b)
{
    if ((kv->ht_count + 1) * 2 > kv->ht_cap && !ht_resize(kv, kv->ht_cap ? kv->ht_cap * 2 : 64))
        return; /* no room: simply not cached */
    size_t i = ht_slot(kv, kv->blocks[b].hash);
    while (kv->ht_block[i] != NONE) i = (i + 1) & (kv->ht_cap - 1);
    kv->ht_hash[i] = kv->blocks[b].hash;
    kv->ht_block[i] = b;
    kv->ht_count++;
    kv->blocks[b].hashed = true;
}

static void ht_remove(llmem_kv *kv, uint32_t b)
{
    size_t i = ht_slot(kv, kv->blocks[b].hash);
    while (kv->ht_block[i] != b) i = (i + 1) & (kv->ht_cap - 1);
    for (size_t j = i;;) { /* backward-shift delete */
        j = (j + 1) & (kv->ht_cap - 1);
        if (kv->ht_block[j] == NONE) break;
        size_t home = ht_slot(kv, kv->ht_hash[j]);
        if (((j - home) & (kv->ht_cap - 1)) >= ((j - i) & (kv->ht_cap - 1))) {
            kv->ht_hash[i] = kv->ht_hash[j];
            kv->ht_block[i] = kv->ht_block[j];
            i = j;
        }
    }
    kv->ht_block[i] = NONE;
    kv->ht_count--;
    kv->blocks[b].hashed = false;
}

static inline void **slab_base(const llmem_kv *kv, uint32_t i) { return &kv->slab_base[(size_t)i * kv->layers]; }
static inline uint32_t *slab_free(const llmem_kv *kv, uint32_t i) { return &kv->slab_free[(size_t)i * kv->S]; }

/* Room for `want` slab slots in the per-slab and per-block arrays, and a
 * prefix table of at least twice their blocks, growing them geometrically
 * (each array keeps what it holds; one that grew before another failed
 * simply stays larger). false when host memory is short; nothing else
 * changes. Caller holds the lock or owns kv alone. */
static bool slots_reserve(llmem_kv *kv, size_t want)
{
    if (want <= kv->slab_cap) return true;
    size_t most = (NONE - 1) / kv->S; /* block ids stay below NONE */
    if (want > most) return false;
    size_t ncap = kv->slab_cap ? kv->slab_cap : 8;
    while (ncap < want) ncap *= 2;
    if (ncap > most) ncap = most;
    size_t nb = ncap * kv->S, nbase, ntok;
    if (!llmem__mul_ok(ncap, kv->layers, &nbase) || !llmem__mul_ok(nb, kv->B, &ntok)) return false;
    kv_slab *sl = kv_meta_realloc(kv, kv->slabs, ncap, sizeof *sl);
    if (!sl) return false;
    kv->slabs = sl;
    void **base = kv_meta_realloc(kv, kv->slab_base, nbase, sizeof *base);
    if (!base) return false;
    kv->slab_base = base;
    uint32_t *fr = kv_meta_realloc(kv, kv->slab_free, nb, sizeof *fr);
    if (!fr) return false;
    kv->slab_free = fr;
    kv_block *bl = kv_meta_realloc(kv, kv->blocks, nb, sizeof *bl);
    if (!bl) return false;
    kv->blocks = bl;
    if (kv->prefix) {
        int32_t *t = kv_meta_realloc(kv, kv->btokens, ntok, sizeof *t);
        if (!t) return false;
        kv->btokens = t;
        size_t hcap = llmem__next_pow2(2 * nb);
        if (hcap < 64) hcap = 64;
        if (hcap > kv->ht_cap && !ht_resize(kv, hcap)) return false;
    }
    kv->slab_cap = (uint32_t)ncap;
    return true;
}

/* Map a slab for every layer into slot i. */
static llmem_status slab_add(llmem_kv *kv, uint32_t i)
{
    size_t bytes = (size_t)kv->S * kv->block_bytes;
    kv_slab *sl = &kv->slabs[i];
    void **base = slab_base(kv, i);
    for (uint32_t l = 0; l < kv->layers; l++) {
        base[l] = llmem_pool_alloc_aligned(kv->pool, bytes, kv->host ? 64 : LLMEM_DEVICE_ALIGN, NULL);
        if (!base[l]) {
            llmem_status st = llmem_last_status();
            for (uint32_t k = 0; k < l; k++) {
                llmem_pool_free(kv->pool, base[k]);
                base[k] = NULL;
            }
            return st ? st : LLMEM_ENOMEM;
        }
    }
    sl->live = true;
    sl->nfree = kv->S;
    uint32_t *fr = slab_free(kv, i);
    for (uint32_t k = 0; k < kv->S; k++) {
        uint32_t b = i * kv->S + (kv->S - 1 - k); /* lowest id on top */
        fr[k] = b;
        kv->blocks[b] = (kv_block){0, B_FREE, false, 0, NONE, NONE, 0, 0};
    }
    kv->st.blocks_total += kv->S;
    kv->st.grows_total++;
    note_reserved(kv, (int64_t)(bytes * kv->layers));
    return LLMEM_OK;
}

static void slab_remove(llmem_kv *kv, uint32_t i)
{
    kv_slab *sl = &kv->slabs[i];
    void **base = slab_base(kv, i);
    for (uint32_t l = 0; l < kv->layers; l++) {
        llmem_pool_free(kv->pool, base[l]);
        base[l] = NULL;
    }
    sl->live = false;
    sl->nfree = 0;
    for (uint32_t k = 0; k < kv->S; k++) kv->blocks[i * kv->S + k].state = B_ABSENT;
    kv->st.blocks_total -= kv->S;
    kv->st.shrinks_total++;
    note_reserved(kv, -(int64_t)((size_t)kv->S * kv->block_bytes * kv->layers));
}

/* One more slab, reusing an absent slot or adding one; *slab gets its index. */
static llmem_status grow(llmem_kv *kv, uint32_t *slab)
{
    size_t bytes = (size_t)kv->S * kv->block_bytes * kv->layers;
    if (!budget_allows(kv, bytes))
        return llmem__fail(LLMEM_ENOMEM, "kv '%s': another slab (%zu bytes) would pass the budget (%llu of %zu held)",
                           kv->name, bytes, (unsigned long long)kv->st.bytes_reserved, kv->budget);
    uint32_t i = 0;
    while (i < kv->nslabs && kv->slabs[i].live) i++;
    if (i == kv->nslabs) {
        if ((uint64_t)(kv->nslabs + 1) * kv->S > NONE - 1)
            return llmem__fail(LLMEM_ENOMEM, "kv '%s': block ids exhausted", kv->name);
        if (!slots_reserve(kv, (size_t)kv->nslabs + 1))
            return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory for slab metadata", kv->name);
        kv->slabs[kv->nslabs] = (kv_slab){0, false};
        memset(slab_base(kv, kv->nslabs), 0, kv->layers * sizeof *kv->slab_base);
        for (uint32_t k = 0; k < kv->S; k++) /* every field: check() and stats read absent blocks too */
            kv->blocks[(size_t)kv->nslabs * kv->S + k] = (kv_block){0, B_ABSENT, false, 0, NONE, NONE, 0, 0};
        kv->nslabs++;
    }
    *slab = i;
    return slab_add(kv, i);
}

/* Take a block for new data (ref 1, fill 0). Placement gives each
 * sequence slabs of its own, so that its slabs are wholly free when it ends
 * and go back to the pool: first the slab `hint` (the one holding the
 * sequence's previous block), else a new slab, and only when no new slab
 * can be had the fullest slab with a free block (filling the tails of other
 * sequences' slabs), then the least recently used cached block. Filling
 * tails first instead left 3.5% of the replay's KV memory in holes. */
static llmem_status block_take(llmem_kv *kv, uint32_t hint, uint32_t *out)
{
    uint32_t pick = NONE;
    if (hint < kv->nslabs && kv->slabs[hint].live && kv->slabs[hint].nfree) pick = hint;
    if (pick == NONE && grow(kv, &pick) != LLMEM_OK) {
        pick = NONE;
        for (uint32_t i = 0; i < kv->nslabs; i++) {
            const kv_slab *sl = &kv->slabs[i];
            if (sl->live && sl->nfree && (pick == NONE || sl->nfree < kv->slabs[pick].nfree)) pick = i;
        }
    }
    if (pick != NONE) {
        *out = slab_free(kv, pick)[--kv->slabs[pick].nfree];
        goto got;
    }
    if (kv->lru_head != NONE) { /* memory is needed: evict the least recently used cached block */
        uint32_t b = kv->lru_head;
        lru_remove(kv, b);
        ht_remove(kv, b);
        kv->st.evictions_total++;
        *out = b;
        goto got;
    }
    return llmem_last_status() == LLMEM_ENOMEM ? LLMEM_ENOMEM
                                               : llmem__fail(LLMEM_ENOMEM, "kv '%s': no block left", kv->name);
got:
    kv->blocks[*out] = (kv_block){1, B_USED, false, 0, NONE, NONE, 0, 0};
    return LLMEM_OK;
}

/* Whether n blocks can be had (free, in new slabs the budget allows, or by
 * evicting cached ones), so that an append that cannot succeed fails
 * before it evicts anything. Growth past the budget's room is left to the
 * pool to refuse. */
static bool blocks_available(const llmem_kv *kv, size_t n)
{
    size_t have = kv->lru_count;
    for (uint32_t i = 0; i < kv->nslabs && have < n; i++)
        if (kv->slabs[i].live) have += kv->slabs[i].nfree;
    if (have >= n || !kv->budget) return true;
    size_t slab = (size_t)kv->S * kv->block_bytes * kv->layers;
    size_t room = kv->budget > kv->st.bytes_reserved ? kv->budget - (size_t)kv->st.bytes_reserved : 0;
    return have + room / slab * kv->S >= n;
}

/* A sequence lets go of block b. */
static void block_put(llmem_kv *kv, uint32_t b)
{
    kv_block *x = &kv->blocks[b];
    if (--x->ref) return;
    if (x->hashed) {
        x->state = B_CACHED;
        lru_push(kv, b);
        return;
    }
    x->state = B_FREE;
    uint32_t si = b / kv->S;
    kv_slab *sl = &kv->slabs[si];
    slab_free(kv, si)[sl->nfree++] = b;
    /* A wholly free slab goes back to the pool at once: the pool, not the
     * manager, keeps memory for the next growth (its superblocks stay until
     * its purge policy returns them), so freed KV memory is free for
     * activations too. Keeping a spare slab here cost 0.3-0.7 points of
     * utilisation in the replay and saved nothing measurable. */
    if (sl->nfree == kv->S) slab_remove(kv, si);
}

static void *block_k(const llmem_kv *kv, uint32_t layer, uint32_t b)
{
    return (char *)slab_base(kv, b / kv->S)[layer] + (size_t)(b % kv->S) * kv->block_bytes;
}

/* Copy the first n tokens of block src into dst, every layer, K and V. */
static llmem_status block_copy(llmem_kv *kv, uint32_t dst, uint32_t src, size_t n)
{
    for (uint32_t l = 0; l < kv->layers; l++) {
        char *d = block_k(kv, l, dst), *s = block_k(kv, l, src);
        llmem_status st = copy_bytes(kv, d, s, n * kv->token_bytes);
        if (!st) st = copy_bytes(kv, d + (size_t)kv->B * kv->token_bytes, s + (size_t)kv->B * kv->token_bytes,
                                 n * kv->token_bytes);
        if (st) return st;
    }
    return LLMEM_OK;
}

/* Room for n entries in s's block table, growing it geometrically; false
 * when host memory is short. Sequences are created with room for all they
 * can hold (seq_paged_init), so this grows only tables capped at
 * KV_TABLE_PREALLOC, a window's prefix match, and a fork of such a table. */
static bool seq_reserve(llmem_kv *kv, kv_seq *s, size_t n)
{
    if (s->cap >= n) return true;
    size_t ncap = s->cap ? s->cap * 2 : 16;
    while (ncap < n) {
        if (ncap > SIZE_MAX / 2) return false;
        ncap *= 2;
    }
    uint32_t *nb = kv_meta_realloc(kv, s->blocks, ncap, sizeof *nb);
    if (!nb) return false;
    s->blocks = nb;
    s->cap = ncap;
    return true;
}

/* ---- PAGED append ------------------------------------------------------------- */

/* The first block index a window sequence still holds once it is `length`
 * tokens long (a window keeps window/B + 1 blocks, so the last
 * window_tokens tokens are always held); 0 without a window. */
static size_t window_keep_from(const llmem_kv *kv, const kv_seq *s, size_t length)
{
    if (!s->window) return 0;
    size_t wb = s->window / kv->B + 1, blocks = (length + kv->B - 1) / kv->B, from = s->first / kv->B;
    return blocks > wb && blocks - wb > from ? blocks - wb : from;
}

/* Block positions an append of n > 0 tokens to a sequence of length L
 * starts. */
static size_t new_block_positions(const llmem_kv *kv, size_t L, size_t n)
{
    return (L + n - 1) / kv->B + 1 - (L ? (L - 1) / kv->B + 1 : 0);
}

/* How many blocks an append of n tokens must take from the allocator:
 * one per new block position, less the oldest blocks a full window lets it
 * recycle, plus one to copy a shared partial last block. A block can be
 * recycled when this sequence alone holds it and it is not in the prefix
 * cache: an old block held once and not registered; the partial last block
 * (or its copy); and blocks this append fills and drops again (n longer
 * than the window), which are never registered because the engine never
 * gets to write them. The figure is exact. */
static size_t plan_append(const llmem_kv *kv, const kv_seq *s, size_t n, bool *cow)
{
    size_t B = kv->B, L = s->length;
    size_t new_positions = new_block_positions(kv, L, n);
    bool partial = L % B != 0 && s->nblocks;
    *cow = false;
    if (partial) {
        const kv_block *x = &kv->blocks[s->blocks[s->nblocks - 1]];
        *cow = x->ref > 1 || x->hashed;
    }
    size_t recycle = 0;
    if (s->window) {
        size_t wb = s->window / B + 1;
        size_t drops = s->nblocks + new_positions > wb ? s->nblocks + new_positions - wb : 0;
        for (size_t i = 0; i < drops && i < s->nblocks; i++) {
            const kv_block *x = &kv->blocks[s->blocks[i]];
            if ((partial && i == s->nblocks - 1) || (x->ref == 1 && !x->hashed)) recycle++;
        }
        if (drops > s->nblocks) recycle += drops - s->nblocks;
    }
    return new_positions - recycle + (*cow ? 1 : 0);
}

/* Block b (full) ends the sequence's next chain link; it is registered in
 * the prefix cache only if `keep` (the sequence still holds it when the
 * append returns, so the engine writes it). */
static void register_block(llmem_kv *kv, kv_seq *s, uint32_t b, bool keep)
{
    uint64_t h = hash_block(s->chain, s->partial, kv->B);
    if (keep && ht_find(kv, h, s->chain, s->partial) == NONE && !kv->blocks[b].hashed) {
        kv->blocks[b].hash = h;
        kv->blocks[b].parent = s->chain;
        memcpy(&kv->btokens[(size_t)b * kv->B], s->partial, kv->B * sizeof *s->partial);
        ht_insert(kv, b);
    }
    s->chain = h;
}

static llmem_status paged_append(llmem_kv *kv, kv_seq *s, size_t n, const int32_t *tokens)
{
    size_t B = kv->B;
    if (!s->window && s->length + n > kv->max_len)
        return llmem__fail(LLMEM_ERANGE, "kv '%s': %zu more tokens pass max_seq_len %u (sequence holds %zu)",
                           kv->name, n, kv->max_len, s->length);
    bool hashing = tokens && kv->prefix && s->hashable;
    bool cow;
    size_t need = plan_append(kv, s, n, &cow);
    size_t keep_from = window_keep_from(kv, s, s->length + n);
    uint32_t got[64], *fresh = need <= 64 ? got : kv_meta_alloc(kv, need, sizeof *fresh);
    if (!fresh) return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory", kv->name);
    size_t k = 0;
    llmem_status st = LLMEM_OK;
    if (!blocks_available(kv, need))
        st = llmem__fail(LLMEM_ENOMEM, "kv '%s': %zu tokens need %zu more blocks, fewer can be had (budget %zu)",
                         kv->name, n, need, kv->budget);
    uint32_t hint = s->nblocks ? s->blocks[s->nblocks - 1] / kv->S : NONE;
    while (!st && k < need && !(st = block_take(kv, hint, &fresh[k]))) hint = fresh[k++] / kv->S;
    /* The table's most entries during the append (a window keeps window/B + 1
     * blocks), plus one: within what the sequence was created with, except
     * for tables capped at KV_TABLE_PREALLOC. */
    size_t most = s->nblocks + new_block_positions(kv, s->length, n);
    if (s->window && most > s->window / B + 1) most = s->window / B + 1;
    if (!st && !seq_reserve(kv, s, most + 1))
        st = llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory for a block table", kv->name);
    if (st) { /* nothing changed yet: give the blocks back */
        while (k) block_put(kv, fresh[--k]);
        if (fresh != got) kv_meta_free(kv, fresh);
        if (st == LLMEM_ENOMEM) kv->st.preemptions_total++;
        return st;
    }
    size_t used = 0;
    if (cow) { /* the shared partial last block is copied before it is written */
        uint32_t old = s->blocks[s->nblocks - 1], nb = fresh[used++];
        size_t fill = s->length % B;
        st = block_copy(kv, nb, old, fill);
        if (st) {
            while (k) block_put(kv, fresh[--k]);
            if (fresh != got) kv_meta_free(kv, fresh);
            return st;
        }
        s->blocks[s->nblocks - 1] = nb;
        block_put(kv, old);
        kv->st.cow_copies_total++;
    }
    for (size_t i = 0; i < n; i++) {
        size_t pos = s->length;
        if (pos % B == 0) { /* a new block for this position */
            uint32_t b;
            if (s->window && s->nblocks == s->window / B + 1) { /* the oldest block left the window */
                uint32_t old = s->blocks[0];
                memmove(s->blocks, s->blocks + 1, (s->nblocks - 1) * sizeof *s->blocks);
                s->nblocks--;
                s->first += B;
                if (kv->blocks[old].ref == 1 && !kv->blocks[old].hashed) {
                    b = old;
                } else {
                    block_put(kv, old);
                    b = fresh[used++];
                }
            } else {
                b = fresh[used++];
            }
            s->blocks[s->nblocks++] = b;
        }
        uint32_t b = s->blocks[s->nblocks - 1];
        if (hashing) {
            s->partial[pos % B] = tokens[i];
            if (pos % B == B - 1) register_block(kv, s, b, pos / B >= keep_from);
        }
        s->length++;
    }
    if (!tokens) s->hashable = false;
    while (used < need) block_put(kv, fresh[used++]); /* recycled more than planned */
    if (fresh != got) kv_meta_free(kv, fresh);
    return LLMEM_OK;
}

/* ---- STATIC and BUCKETS buffers ---------------------------------------------------- */

static size_t buf_bytes(const llmem_kv *kv, size_t capacity)
{
    return (capacity + kv->B - 1) / kv->B * kv->block_bytes;
}

static void buf_release(llmem_kv *kv, kv_buf *b)
{
    if (b->map) {
        llmem_resource_unmap(kv->res, b->map, kv->vstride * kv->layers, b->committed * kv->layers);
        note_reserved(kv, -(int64_t)(b->committed * kv->layers));
        kv->st.shrinks_total++;
        kv_meta_free(kv, b);
        return;
    }
    for (uint32_t l = 0; l < kv->layers; l++) llmem_pool_free(kv->pool, b->base[l]);
    note_reserved(kv, -(int64_t)(buf_bytes(kv, b->capacity) * kv->layers));
    kv->st.shrinks_total++;
    kv_meta_free(kv, b);
}

/* Give back idle bucket buffers until `want` more bytes fit the budget. */
static void idle_release(llmem_kv *kv, size_t want)
{
    for (int c = kv->nclasses - 1; c >= 0 && !budget_allows(kv, want); c--)
        while (kv->idle[c] && !budget_allows(kv, want)) {
            kv_buf *b = kv->idle[c];
            kv->idle[c] = b->next;
            buf_release(kv, b);
        }
}

static llmem_status buf_new(llmem_kv *kv, size_t capacity, int cls, kv_buf **out)
{
    size_t per = buf_bytes(kv, capacity), all;
    if (!llmem__mul_ok(per, kv->layers, &all))
        return llmem__fail(LLMEM_EOVERFLOW, "kv '%s': a buffer of %zu tokens overflows", kv->name, capacity);
    if (cls >= 0 && kv->idle[cls]) {
        *out = kv->idle[cls];
        kv->idle[cls] = (*out)->next;
        (*out)->next = NULL;
        return LLMEM_OK;
    }
    idle_release(kv, all);
    if (!budget_allows(kv, all))
        return llmem__fail(LLMEM_ENOMEM, "kv '%s': %zu bytes for %zu tokens would pass the budget (%llu of %zu held)",
                           kv->name, all, capacity, (unsigned long long)kv->st.bytes_reserved, kv->budget);
    kv_buf *b = kv_meta_alloc(kv, 1, sizeof *b + (size_t)kv->layers * sizeof b->base[0]);
    if (!b) return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory", kv->name);
    b->capacity = capacity;
    b->cls = cls;
    b->next = NULL;
    for (uint32_t l = 0; l < kv->layers; l++) {
        b->base[l] = llmem_pool_alloc_aligned(kv->pool, per, kv->host ? 64 : LLMEM_DEVICE_ALIGN, NULL);
        if (!b->base[l]) {
            llmem_status st = llmem_last_status();
            for (uint32_t k = 0; k < l; k++) llmem_pool_free(kv->pool, b->base[k]);
            kv_meta_free(kv, b);
            return st ? st : LLMEM_ENOMEM;
        }
    }
    kv->st.grows_total++;
    note_reserved(kv, (int64_t)all);
    *out = b;
    return LLMEM_OK;
}

/* CONTIGUOUS: a reservation of vstride bytes per layer, nothing committed. */
static llmem_status vbuf_new(llmem_kv *kv, kv_buf **out)
{
    kv_buf *b = kv_meta_alloc(kv, 1, sizeof *b + (size_t)kv->layers * sizeof b->base[0]);
    if (!b) return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory", kv->name);
    memset(b, 0, sizeof *b);
    b->cls = -1;
    llmem_status st = llmem_resource_map_tagged(kv->res, kv->vstride * kv->layers, kv->vgran, LLMEM_MAP_UNCOMMITTED,
                                                kv->name, &b->map);
    if (st) {
        kv_meta_free(kv, b);
        return st;
    }
    for (uint32_t l = 0; l < kv->layers; l++) b->base[l] = (char *)b->map + (size_t)l * kv->vstride;
    *out = b;
    return LLMEM_OK;
}

/* CONTIGUOUS: commit every layer's range up to `tokens`; all layers or
 * none (a failure decommits what this call committed). */
static llmem_status vbuf_fit(llmem_kv *kv, kv_buf *b, size_t tokens)
{
    size_t need = (buf_bytes(kv, tokens) + kv->vgran - 1) / kv->vgran * kv->vgran;
    if (need > kv->vstride) need = kv->vstride;
    if (need <= b->committed) return LLMEM_OK;
    size_t more = need - b->committed;
    if (!budget_allows(kv, more * kv->layers))
        return llmem__fail(LLMEM_ENOMEM, "kv '%s': %zu more bytes would pass the budget (%llu of %zu held)", kv->name,
                           more * kv->layers, (unsigned long long)kv->st.bytes_reserved, kv->budget);
    for (uint32_t l = 0; l < kv->layers; l++) {
        llmem_status st = llmem_resource_commit(kv->res, (char *)b->base[l] + b->committed, more);
        if (st) {
            for (uint32_t k = 0; k < l; k++) llmem_resource_decommit(kv->res, (char *)b->base[k] + b->committed, more);
            return st;
        }
    }
    b->committed = need;
    size_t cap = need / kv->block_bytes * kv->B;
    b->capacity = cap < kv->max_len ? cap : kv->max_len;
    kv->st.grows_total++;
    note_reserved(kv, (int64_t)(more * kv->layers));
    return LLMEM_OK;
}

static void buf_done(llmem_kv *kv, kv_buf *b)
{
    if (!b) return;
    if (kv->strategy == LLMEM_KV_BUCKETS) {
        b->next = kv->idle[b->cls];
        kv->idle[b->cls] = b;
    } else {
        buf_release(kv, b);
    }
}

/* Bucket class for n tokens: capacity B * 2^c, the last one max_seq_len. */
static int bucket_for(const llmem_kv *kv, size_t n, size_t *capacity)
{
    size_t cap = kv->B;
    int c = 0;
    while (cap < n && cap < kv->max_len) {
        cap *= 2;
        c++;
    }
    if (cap > kv->max_len) cap = kv->max_len;
    *capacity = cap;
    return c;
}

/* Copy the first n tokens of one buffer into another, every layer. */
static llmem_status buf_copy(llmem_kv *kv, kv_buf *dst, const kv_buf *src, size_t n)
{
    size_t blocks = (n + kv->B - 1) / kv->B;
    for (uint32_t l = 0; l < kv->layers; l++) {
        llmem_status st = copy_bytes(kv, dst->base[l], src->base[l], blocks * kv->block_bytes);
        if (st) return st;
    }
    return LLMEM_OK;
}

static llmem_status contig_append(llmem_kv *kv, kv_seq *s, size_t n)
{
    size_t want = s->length + n;
    if (want > kv->max_len)
        return llmem__fail(LLMEM_ERANGE, "kv '%s': %zu more tokens pass max_seq_len %u (sequence holds %zu)",
                           kv->name, n, kv->max_len, s->length);
    if (s->buf && want <= s->buf->capacity) {
        s->length = want;
        return LLMEM_OK;
    }
    if (kv->strategy == LLMEM_KV_CONTIGUOUS) { /* commit in place: nothing moves */
        llmem_status st = vbuf_fit(kv, s->buf, want);
        if (st) {
            kv->st.preemptions_total++;
            return st;
        }
        s->length = want;
        return LLMEM_OK;
    }
    /* BUCKETS only (STATIC reserved everything at create): the next class. */
    size_t capacity;
    int c = bucket_for(kv, want, &capacity);
    kv_buf *nb;
    llmem_status st = buf_new(kv, capacity, c, &nb);
    if (st) {
        kv->st.preemptions_total++;
        return st;
    }
    if (s->buf) {
        st = buf_copy(kv, nb, s->buf, s->length);
        if (st) {
            buf_done(kv, nb);
            return st;
        }
        kv->st.bucket_copies_total++;
        buf_done(kv, s->buf);
    }
    s->buf = nb;
    s->length = want;
    return LLMEM_OK;
}

/* ---- public API --------------------------------------------------------------------- */

llmem_kv_options llmem_kv_options_default(void)
{
    llmem_kv_options o;
    memset(&o, 0, sizeof o);
    o.name = "kv";
    o.block_tokens = 16;
    return o;
}

llmem_status llmem_kv_create(const llmem_kv_options *opts, llmem_kv **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "kv: null out");
    *out = NULL;
    if (!opts) return llmem__fail(LLMEM_EINVAL, "kv: null options (the geometry is required)");
    llmem_kv_options o = *opts;
    const char *name = o.name && *o.name ? o.name : "kv";
    if (!o.layers || !o.kv_heads || !o.head_dim || !o.max_seq_len)
        return llmem__fail(LLMEM_EINVAL, "kv '%s': layers, kv_heads, head_dim and max_seq_len are required", name);
    if ((unsigned)o.strategy > LLMEM_KV_CONTIGUOUS) return llmem__fail(LLMEM_EINVAL, "kv '%s': unknown strategy", name);
    size_t elem = dtype_size(o.dtype);
    if (!elem) return llmem__fail(LLMEM_EINVAL, "kv '%s': unknown dtype %d", name, (int)o.dtype);
    if (!o.block_tokens) o.block_tokens = 16;
    size_t token_bytes, block_bytes, tmp;
    if (!llmem__mul_ok((size_t)o.kv_heads * o.head_dim, elem, &token_bytes) ||
        !llmem__mul_ok(token_bytes, 2 * (size_t)o.block_tokens, &block_bytes) ||
        !llmem__mul_ok(block_bytes, ((size_t)o.max_seq_len + o.block_tokens - 1) / o.block_tokens, &tmp) ||
        !llmem__mul_ok(tmp, o.layers, &tmp) || tmp > (size_t)PTRDIFF_MAX)
        return llmem__fail(LLMEM_EOVERFLOW, "kv '%s': the geometry overflows", name);
    if (o.prefix_cache && o.strategy != LLMEM_KV_PAGED)
        return llmem__fail(LLMEM_ENOTSUP, "kv '%s': the prefix cache needs the PAGED strategy", name);
    if (o.swap_resource && llmem_resource_kind(o.swap_resource) != LLMEM_MEM_HOST)
        return llmem__fail(LLMEM_EINVAL, "kv '%s': the swap resource '%s' is not host memory", name,
                           llmem_resource_name(o.swap_resource));
    if (o.meta_resource && llmem_resource_kind(o.meta_resource) != LLMEM_MEM_HOST)
        return llmem__fail(LLMEM_EINVAL, "kv '%s': the metadata resource '%s' is not host memory", name,
                           llmem_resource_name(o.meta_resource));
    /* The metadata pool, then the manager inside it (see the top of the file). */
    llmem_pool_options mo = llmem_pool_options_default();
    mo.name = "kv-metadata";
    mo.resource = o.meta_resource ? o.meta_resource : llmem_resource_default();
    mo.first_superblock_bytes = KV_META_FIRST_SUPERBLOCK;
    mo.purge = LLMEM_POOL_PURGE_MANUAL;
    llmem_pool *meta;
    llmem_status st = llmem_pool_create(&mo, &meta);
    if (st) return st;
    llmem_kv *kv = llmem_pool_alloc(meta, sizeof *kv, NULL);
    if (!kv) {
        llmem_pool_destroy(meta);
        return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of memory", name);
    }
    memset(kv, 0, sizeof *kv);
    kv->meta = meta;
    llmem__copy_name(kv->name, sizeof kv->name, name, "kv");
    kv->strategy = o.strategy;
    kv->layers = o.layers;
    kv->heads = o.kv_heads;
    kv->dim = o.head_dim;
    kv->B = o.block_tokens;
    kv->max_len = o.max_seq_len;
    kv->elem = elem;
    kv->token_bytes = token_bytes;
    kv->block_bytes = block_bytes;
    kv->budget = o.budget_bytes;
    kv->prefix = o.prefix_cache;
    kv->swap_res = o.swap_resource;
    kv->swap_budget = o.swap_budget_bytes;
    kv->lru_head = kv->lru_tail = NONE;
    if (o.pool) {
        kv->pool = o.pool;
    } else {
        llmem_pool_options po = llmem_pool_options_default();
        po.name = kv->name;
        po.resource = o.resource;
        st = llmem_pool_create(&po, &kv->pool);
        kv->own_pool = true;
    }
    if (!st) {
        kv->res = llmem_pool_get_resource(kv->pool);
        kv->host = llmem_resource_kind(kv->res) == LLMEM_MEM_HOST;
        /* Default: two blocks, at least 64 KiB. About half a slab per running
         * sequence sits empty, so small slabs keep utilisation high (98% in
         * the replay, against 88% for 16 blocks); the pool beneath carves
         * them out of its superblocks, host or device, in a microsecond. */
        size_t slab = o.slab_bytes ? o.slab_bytes : 2 * block_bytes;
        if (!o.slab_bytes && slab < ((size_t)64 << 10)) slab = (size_t)64 << 10;
        size_t S = slab / block_bytes;
        kv->S = (uint32_t)(S < 1 ? 1 : S > 65536 ? 65536 : S);
        size_t cap;
        kv->nclasses = bucket_for(kv, kv->max_len, &cap) + 1;
        if (kv->strategy == LLMEM_KV_CONTIGUOUS) {
            llmem_resource_info info;
            memset(&info, 0, sizeof info);
            llmem_resource_get_info(kv->res, &info);
            kv->vgran = info.granularity;
            size_t per = buf_bytes(kv, kv->max_len);
            if (!(info.caps & LLMEM_RES_CAP_RESERVE) || !(info.caps & LLMEM_RES_CAP_DECOMMIT))
                st = llmem__fail(LLMEM_ENOTSUP, "kv '%s': the CONTIGUOUS strategy needs a resource that reserves "
                                 "address space (%s cannot)", name, llmem_resource_name(kv->res));
            else if (!llmem__align_up(per, kv->vgran, &kv->vstride) || !llmem__mul_ok(kv->vstride, kv->layers, &cap) ||
                     cap > (size_t)PTRDIFF_MAX)
                st = llmem__fail(LLMEM_EOVERFLOW, "kv '%s': the reservation per sequence overflows", name);
        }
        /* With a budget, the per-slab arrays hold its slabs from the start
         * (up to KV_META_PRESIZE bytes), so no append grows them. */
        size_t slab_all = (size_t)kv->S * block_bytes * kv->layers;
        /* A PAGED budget below one slab could never hold a token: refuse it
         * here, naming the minimum, rather than failing every append. */
        if (!st && kv->strategy == LLMEM_KV_PAGED && kv->budget && kv->budget < slab_all)
            st = llmem__fail(LLMEM_EINVAL,
                             "kv '%s': budget_bytes %zu is below one slab, the least a PAGED cache holds: %zu bytes "
                             "(%u blocks of %u tokens, %zu bytes a block, x %u layers); give at least %zu or a "
                             "smaller slab_bytes",
                             name, kv->budget, slab_all, kv->S, kv->B, block_bytes, kv->layers, slab_all);
        if (!st && kv->strategy == LLMEM_KV_PAGED && kv->budget >= slab_all) {
            size_t per_slot = sizeof(kv_slab) + (size_t)kv->layers * sizeof(void *) +
                              (size_t)kv->S * (sizeof(uint32_t) + sizeof(kv_block) +
                                               (kv->prefix ? (size_t)kv->B * sizeof(int32_t) + 4 * 12 : 0));
            size_t slots = kv->budget / slab_all, most = KV_META_PRESIZE / per_slot;
            if (slots > most) slots = most;
            if (slots && !slots_reserve(kv, slots))
                st = llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory for slab metadata", name);
        }
    }
    if (st) {
        if (kv->own_pool) llmem_pool_destroy(kv->pool);
        llmem_pool_destroy(meta);
        return st;
    }
    pthread_mutex_init(&kv->lock, NULL);
    kv->st.struct_size = sizeof kv->st;
    *out = kv;
    return LLMEM_OK;
}

void llmem_kv_destroy(llmem_kv *kv)
{
    if (!kv) return;
    /* Storage goes back to its pool (which may be borrowed); the metadata
     * pool then goes whole, this struct and every table with it. */
    for (uint32_t i = 0; i < kv->nseqs; i++) {
        kv_seq *s = &kv->seqs[i];
        if (s->live && s->buf) buf_release(kv, s->buf);
        if (s->live && s->swap) llmem_resource_unmap(kv->swap_res, s->swap, s->swap_map, s->swap_map);
    }
    for (int c = 0; c < kv->nclasses; c++)
        while (kv->idle[c]) {
            kv_buf *b = kv->idle[c];
            kv->idle[c] = b->next;
            buf_release(kv, b);
        }
    for (uint32_t i = 0; i < kv->nslabs; i++)
        if (kv->slabs[i].live) slab_remove(kv, i);
    if (kv->own_pool) llmem_pool_destroy(kv->pool);
    pthread_mutex_destroy(&kv->lock);
    llmem_pool_destroy(kv->meta);
}

#define LOCKED(kv, expr)                   \
    do {                                   \
        pthread_mutex_lock(&(kv)->lock);   \
        llmem_status st_ = (expr);         \
        pthread_mutex_unlock(&(kv)->lock); \
        return st_;                        \
    } while (0)

/* ---- PAGED offload: swap out and in ---------------------------------------------------- */

static void seq_drop_blocks(llmem_kv *kv, kv_seq *s);

static llmem_status swapped_fail(llmem_kv *kv, const char *what)
{
    return llmem__fail(LLMEM_ESTATE, "kv '%s': %s on a swapped-out sequence (swap it in first)", kv->name, what);
}

/* Unmap s's swap memory (it is swapped) and forget it. */
static void swap_release(llmem_kv *kv, kv_seq *s)
{
    if (s->swap) llmem_resource_unmap(kv->swap_res, s->swap, s->swap_map, s->swap_map);
    kv->st.swap_bytes_held -= s->swap_map;
    kv->st.swapped_sequences--;
    s->swap = NULL;
    s->swap_map = 0;
    s->swap_nblocks = 0;
    s->swapped = false;
}

/* Copy blocks ids[0..n) of every layer between storage and a swap region
 * laid out [layer][i][block_bytes] (to_swap: storage -> region). A run of
 * consecutive ids in one slab is contiguous on both sides and goes in one
 * copy. Device storage is touched only through the storage resource's copy
 * (the region is host memory, which the copy contract allows). */
static llmem_status swap_copy(llmem_kv *kv, const uint32_t *ids, size_t n, char *region, bool to_swap)
{
    if (!n) return LLMEM_OK; /* an empty sequence has no region (NULL): nothing to offset */
    size_t bb = kv->block_bytes;
    uint64_t t0 = llmem__now_ns();
    llmem_status st = LLMEM_OK;
    for (uint32_t l = 0; l < kv->layers && !st; l++) {
        char *h = region + (size_t)l * n * bb;
        for (size_t i = 0, j; i < n && !st; i = j) {
            for (j = i + 1; j < n && ids[j] == ids[j - 1] + 1 && ids[j] / kv->S == ids[i] / kv->S; j++) {}
            char *d = block_k(kv, l, ids[i]);
            st = to_swap ? copy_bytes(kv, h + i * bb, d, (j - i) * bb) : copy_bytes(kv, d, h + i * bb, (j - i) * bb);
        }
    }
    kv->st.swap_seconds_total += (double)(llmem__now_ns() - t0) * 1e-9;
    return st;
}

static llmem_status swap_usable(llmem_kv *kv, kv_seq *s)
{
    if (!s) return LLMEM_EINVAL;
    if (kv->strategy != LLMEM_KV_PAGED)
        return llmem__fail(LLMEM_ENOTSUP, "kv '%s': swapping needs the PAGED strategy", kv->name);
    if (!kv->swap_res) return llmem__fail(LLMEM_ENOTSUP, "kv '%s': no swap resource", kv->name);
    return LLMEM_OK;
}

static llmem_status swap_out_locked(llmem_kv *kv, llmem_kv_seq h)
{
    kv_seq *s = seq_of(kv, h);
    llmem_status st = swap_usable(kv, s);
    if (st) return st;
    if (s->swapped) return llmem__fail(LLMEM_ESTATE, "kv '%s': sequence already swapped out", kv->name);
    size_t n = s->nblocks, bytes = 0, mapped = 0;
    void *region = NULL;
    if (n) {
        if (!llmem__mul_ok(n * kv->block_bytes, kv->layers, &bytes))
            return llmem__fail(LLMEM_EOVERFLOW, "kv '%s': swap size overflows", kv->name);
        if ((st = llmem_resource_round(kv->swap_res, bytes, &mapped)) != LLMEM_OK) return st;
        if (kv->swap_budget && (mapped > kv->swap_budget || kv->st.swap_bytes_held > kv->swap_budget - mapped))
            return llmem__fail(LLMEM_ENOMEM,
                               "kv '%s': swapping out %zu bytes would pass the swap budget (%llu of %zu held)",
                               kv->name, mapped, (unsigned long long)kv->st.swap_bytes_held, kv->swap_budget);
        if ((st = llmem_resource_map_tagged(kv->swap_res, bytes, 0, 0, kv->name, &region)) != LLMEM_OK) return st;
        if ((st = swap_copy(kv, s->blocks, n, region, true)) != LLMEM_OK) {
            llmem_resource_unmap(kv->swap_res, region, mapped, mapped);
            return st;
        }
    }
    seq_drop_blocks(kv, s); /* as a free: shared blocks lose a reference, registered ones stay cached */
    s->swapped = true;
    s->swap = region;
    s->swap_map = mapped;
    s->swap_nblocks = n;
    kv->st.swapped_sequences++;
    kv->st.swap_out_total++;
    kv->st.bytes_swapped_out_total += bytes;
    kv->st.swap_bytes_held += mapped;
    if (kv->st.swap_bytes_held > kv->st.swap_bytes_held_peak) kv->st.swap_bytes_held_peak = kv->st.swap_bytes_held;
    return LLMEM_OK;
}

static llmem_status swap_in_locked(llmem_kv *kv, llmem_kv_seq h)
{
    kv_seq *s = seq_of(kv, h);
    llmem_status st = swap_usable(kv, s);
    if (st) return st;
    if (!s->swapped) return llmem__fail(LLMEM_ESTATE, "kv '%s': sequence is not swapped out", kv->name);
    size_t n = s->swap_nblocks, k = 0;
    /* The table kept the capacity it had when it held these blocks. */
    if (!blocks_available(kv, n))
        return llmem__fail(LLMEM_ENOMEM, "kv '%s': swapping in needs %zu blocks, fewer can be had (budget %zu)",
                           kv->name, n, kv->budget);
    uint32_t hint = NONE;
    while (k < n && !(st = block_take(kv, hint, &s->blocks[k]))) hint = s->blocks[k++] / kv->S;
    if (!st) st = swap_copy(kv, s->blocks, n, s->swap, false);
    if (st) {
        while (k) block_put(kv, s->blocks[--k]);
        return st;
    }
    s->nblocks = n;
    kv->st.swap_in_total++;
    kv->st.bytes_swapped_in_total += (uint64_t)n * kv->block_bytes * kv->layers;
    swap_release(kv, s);
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_swap_out(llmem_kv *kv, llmem_kv_seq s)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    LOCKED(kv, swap_out_locked(kv, s));
}

llmem_status llmem_kv_seq_swap_in(llmem_kv *kv, llmem_kv_seq s)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    LOCKED(kv, swap_in_locked(kv, s));
}

/* A new PAGED sequence's tables (s->window set): a block table with room
 * for all it can hold, plus one (ceil(max_seq_len / B) + 1 entries, or
 * window/B + 2 with a window; at most KV_TABLE_PREALLOC, past which
 * seq_reserve grows it), and its partial-block tokens when the prefix
 * cache is on, so that appends take no metadata. LLMEM_ENOMEM when host
 * memory is short (the caller releases the slot). */
static llmem_status seq_paged_init(llmem_kv *kv, kv_seq *s)
{
    size_t n = s->window ? s->window / kv->B + 2 : ((size_t)kv->max_len + kv->B - 1) / kv->B + 1;
    if (n > KV_TABLE_PREALLOC) n = KV_TABLE_PREALLOC;
    s->blocks = kv_meta_alloc(kv, n, sizeof *s->blocks);
    if (!s->blocks) return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory for a block table", kv->name);
    s->cap = n;
    if (kv->prefix && !(s->partial = kv_meta_alloc(kv, kv->B, sizeof *s->partial)))
        return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory", kv->name);
    return LLMEM_OK;
}

static llmem_status seq_create_locked(llmem_kv *kv, size_t window, llmem_kv_seq *out)
{
    if (window && kv->strategy != LLMEM_KV_PAGED)
        return llmem__fail(LLMEM_ENOTSUP, "kv '%s': windows need the PAGED strategy", kv->name);
    kv_seq *s;
    llmem_status st = seq_new(kv, &s, out);
    if (st) return st;
    s->window = window ? (window + kv->B - 1) / kv->B * kv->B : 0;
    if (kv->strategy == LLMEM_KV_PAGED && (st = seq_paged_init(kv, s)) != LLMEM_OK) {
        seq_release_slot(kv, s);
        *out = 0;
        return st;
    }
    if (kv->strategy == LLMEM_KV_STATIC || kv->strategy == LLMEM_KV_CONTIGUOUS) {
        st = kv->strategy == LLMEM_KV_STATIC ? buf_new(kv, kv->max_len, -1, &s->buf) : vbuf_new(kv, &s->buf);
        if (st) {
            kv->st.preemptions_total++;
            seq_release_slot(kv, s);
            *out = 0;
            return st;
        }
    }
    kv->st.sequences++;
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_create(llmem_kv *kv, size_t window_tokens, llmem_kv_seq *out)
{
    if (out) *out = 0;
    if (!kv || !out) return llmem__fail(LLMEM_EINVAL, "kv: null %s", kv ? "out" : "kv");
    LOCKED(kv, seq_create_locked(kv, window_tokens, out));
}

/* Newest first: cached blocks then reach the LRU list tail first, so the
 * end of a prefix is evicted before its start (a chain whose first block
 * went can never be matched again). */
static void seq_drop_blocks(llmem_kv *kv, kv_seq *s)
{
    while (s->nblocks) block_put(kv, s->blocks[--s->nblocks]);
}

static llmem_status seq_free_locked(llmem_kv *kv, llmem_kv_seq h)
{
    kv_seq *s = seq_of(kv, h);
    if (!s) return LLMEM_EINVAL;
    if (s->swapped) swap_release(kv, s);
    seq_drop_blocks(kv, s);
    buf_done(kv, s->buf);
    s->buf = NULL;
    seq_release_slot(kv, s);
    kv->st.sequences--;
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_free(llmem_kv *kv, llmem_kv_seq s)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    if (!s) return LLMEM_OK;
    LOCKED(kv, seq_free_locked(kv, s));
}

static llmem_status fork_locked(llmem_kv *kv, llmem_kv_seq ph, llmem_kv_seq *out)
{
    kv_seq *p = seq_of(kv, ph);
    if (!p) return LLMEM_EINVAL;
    if (p->swapped) return swapped_fail(kv, "fork");
    uint32_t pi = (uint32_t)(p - kv->seqs);
    kv_seq *c;
    llmem_status st = seq_new(kv, &c, out);
    if (st) return st;
    p = &kv->seqs[pi]; /* the table may have moved */
    if (kv->strategy == LLMEM_KV_PAGED) {
        c->window = p->window;
        st = seq_paged_init(kv, c);
        if (!st && !seq_reserve(kv, c, p->nblocks)) /* the parent's table grew past KV_TABLE_PREALLOC */
            st = llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory for a block table", kv->name);
        if (st) {
            seq_release_slot(kv, c);
            *out = 0;
            return st;
        }
        if (p->nblocks) memcpy(c->blocks, p->blocks, p->nblocks * sizeof *c->blocks);
        for (size_t i = 0; i < p->nblocks; i++) kv->blocks[p->blocks[i]].ref++;
        c->nblocks = p->nblocks;
        if (p->partial) memcpy(c->partial, p->partial, kv->B * sizeof *c->partial);
    } else if (p->buf) {
        size_t cap = p->buf->capacity;
        int cls = kv->strategy == LLMEM_KV_BUCKETS ? bucket_for(kv, p->length ? p->length : 1, &cap) : -1;
        if (kv->strategy == LLMEM_KV_CONTIGUOUS) {
            st = vbuf_new(kv, &c->buf);
            if (!st) st = vbuf_fit(kv, c->buf, p->length);
        } else {
            st = buf_new(kv, cap, cls, &c->buf);
        }
        if (!st) st = buf_copy(kv, c->buf, p->buf, p->length);
        if (st) {
            if (c->buf) buf_done(kv, c->buf);
            seq_release_slot(kv, c);
            *out = 0;
            kv->st.preemptions_total++;
            return st;
        }
    }
    c->length = p->length;
    c->first = p->first;
    c->window = p->window;
    c->hashable = p->hashable;
    c->chain = p->chain;
    kv->st.sequences++;
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_fork(llmem_kv *kv, llmem_kv_seq parent, llmem_kv_seq *child)
{
    if (child) *child = 0;
    if (!kv || !child) return llmem__fail(LLMEM_EINVAL, "kv: null %s", kv ? "child" : "kv");
    LOCKED(kv, fork_locked(kv, parent, child));
}

static llmem_status match_locked(llmem_kv *kv, llmem_kv_seq h, const int32_t *tokens, size_t n, size_t *matched)
{
    kv_seq *s = seq_of(kv, h);
    if (!s) return LLMEM_EINVAL;
    if (s->swapped) return swapped_fail(kv, "match_prefix");
    if (s->length) return llmem__fail(LLMEM_ESTATE, "kv '%s': prefix matching needs an empty sequence", kv->name);
    if (!kv->prefix) return LLMEM_OK;
    size_t full = n / kv->B, k = 0;
    if (!s->window && full > kv->max_len / kv->B) full = kv->max_len / kv->B; /* no more than it may hold */
    uint64_t chain = 0;
    if (full && !seq_reserve(kv, s, full)) return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory", kv->name);
    for (; k < full; k++) {
        const int32_t *t = tokens + k * kv->B;
        uint64_t hsh = hash_block(chain, t, kv->B);
        uint32_t b = ht_find(kv, hsh, chain, t);
        if (b == NONE) break;
        kv_block *x = &kv->blocks[b];
        if (x->state == B_CACHED) {
            lru_remove(kv, b);
            x->state = B_USED;
        }
        x->ref++;
        s->blocks[s->nblocks++] = b;
        chain = hsh;
    }
    s->chain = chain;
    s->length = k * kv->B;
    size_t keep = window_keep_from(kv, s, s->length); /* a window holds its last window/B + 1 blocks */
    if (keep) {
        for (size_t i = keep; i-- > 0;) block_put(kv, s->blocks[i]);
        memmove(s->blocks, s->blocks + keep, (s->nblocks - keep) * sizeof *s->blocks);
        s->nblocks -= keep;
        s->first = keep * kv->B;
    }
    *matched = s->length;
    kv->st.prefix_hit_tokens_total += s->length;
    kv->st.prefix_miss_tokens_total += n - s->length;
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_match_prefix(llmem_kv *kv, llmem_kv_seq s, const int32_t *tokens, size_t n, size_t *matched)
{
    if (matched) *matched = 0;
    if (!kv || !matched || (n && !tokens)) return llmem__fail(LLMEM_EINVAL, "kv: null argument to match_prefix");
    LOCKED(kv, match_locked(kv, s, tokens, n, matched));
}

static llmem_status append_locked(llmem_kv *kv, llmem_kv_seq h, size_t n, const int32_t *tokens, size_t *first_pos)
{
    kv_seq *s = seq_of(kv, h);
    if (!s) return LLMEM_EINVAL;
    if (s->swapped) return swapped_fail(kv, "append");
    if (first_pos) *first_pos = s->length;
    if (n == 0) return LLMEM_OK;
    if (n > (size_t)PTRDIFF_MAX / 2 || s->length > SIZE_MAX - n)
        return llmem__fail(LLMEM_EOVERFLOW, "kv '%s': append of %zu tokens overflows", kv->name, n);
    return kv->strategy == LLMEM_KV_PAGED ? paged_append(kv, s, n, tokens) : contig_append(kv, s, n);
}

llmem_status llmem_kv_seq_append(llmem_kv *kv, llmem_kv_seq s, size_t n, const int32_t *tokens, size_t *first_pos)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    LOCKED(kv, append_locked(kv, s, n, tokens, first_pos));
}

static llmem_status truncate_locked(llmem_kv *kv, llmem_kv_seq h, size_t len, bool forget)
{
    kv_seq *s = seq_of(kv, h);
    if (!s) return LLMEM_EINVAL;
    if (s->swapped) return swapped_fail(kv, "truncate");
    if (len > s->length || len < s->first)
        return llmem__fail(LLMEM_ERANGE, "kv '%s': truncate to %zu outside the held positions [%zu, %zu]", kv->name,
                           len, s->first, s->length);
    if (kv->strategy == LLMEM_KV_PAGED) {
        size_t keep = len > s->first ? (len - 1) / kv->B - s->first / kv->B + 1 : 0;
        /* forget (a rollback): a dropped block that this sequence alone
         * holds leaves the prefix cache too - the append being undone may
         * have registered it before anyone wrote it. */
        while (s->nblocks > keep) {
            uint32_t b = s->blocks[--s->nblocks];
            if (forget && kv->blocks[b].ref == 1 && kv->blocks[b].hashed) ht_remove(kv, b);
            block_put(kv, b);
        }
        /* ...and so does a kept last block left partial that the undone
         * append filled: it was registered full. */
        if (forget && len % kv->B && s->nblocks) {
            uint32_t b = s->blocks[s->nblocks - 1];
            if (kv->blocks[b].ref == 1 && kv->blocks[b].hashed) ht_remove(kv, b);
        }
    }
    if (len < s->length) s->hashable = false; /* the chain hash is not kept per block */
    if (len == 0) { /* empty again: the (empty) chain is known */
        s->hashable = true;
        s->chain = 0;
    }
    s->length = len;
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_truncate(llmem_kv *kv, llmem_kv_seq s, size_t new_length)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    LOCKED(kv, truncate_locked(kv, s, new_length, false));
}

llmem_status llmem_kv_seq_rollback(llmem_kv *kv, llmem_kv_seq s, size_t new_length)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    LOCKED(kv, truncate_locked(kv, s, new_length, true));
}

/* The K base of the block holding position pos (held). */
static char *block_base(const llmem_kv *kv, const kv_seq *s, uint32_t layer, size_t pos)
{
    size_t bi = pos / kv->B;
    if (kv->strategy == LLMEM_KV_PAGED) return block_k(kv, layer, s->blocks[bi - s->first / kv->B]);
    return (char *)s->buf->base[layer] + bi * kv->block_bytes;
}

static llmem_status token_locked(llmem_kv *kv, llmem_kv_seq h, uint32_t layer, size_t pos, void **k, void **v)
{
    kv_seq *s = seq_of(kv, h);
    if (!s) return LLMEM_EINVAL;
    if (s->swapped) return swapped_fail(kv, "token");
    if (layer >= kv->layers) return llmem__fail(LLMEM_ERANGE, "kv '%s': layer %u of %u", kv->name, layer, kv->layers);
    if (pos >= s->length || pos < s->first)
        return llmem__fail(LLMEM_ERANGE, "kv '%s': position %zu outside the held [%zu, %zu)", kv->name, pos, s->first,
                           s->length);
    char *base = block_base(kv, s, layer, pos) + (pos % kv->B) * kv->token_bytes;
    if (k) *k = base;
    if (v) *v = base + (size_t)kv->B * kv->token_bytes;
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_token(llmem_kv *kv, llmem_kv_seq s, uint32_t layer, size_t pos, void **k, void **v)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    LOCKED(kv, token_locked(kv, s, layer, pos, k, v));
}

static llmem_status table_locked(llmem_kv *kv, llmem_kv_seq h, uint32_t layer, void **k, void **v, size_t cap,
                                 size_t *n)
{
    kv_seq *s = seq_of(kv, h);
    if (!s) return LLMEM_EINVAL;
    if (s->swapped) return swapped_fail(kv, "table");
    if (layer >= kv->layers) return llmem__fail(LLMEM_ERANGE, "kv '%s': layer %u of %u", kv->name, layer, kv->layers);
    size_t first_blk = s->first / kv->B;
    size_t nb = s->length > s->first ? (s->length - 1) / kv->B - first_blk + 1 : 0;
    *n = nb;
    for (size_t i = 0; i < nb && i < cap; i++) {
        char *base = block_base(kv, s, layer, (first_blk + i) * kv->B);
        if (k) k[i] = base;
        if (v) v[i] = base + (size_t)kv->B * kv->token_bytes;
    }
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_table(llmem_kv *kv, llmem_kv_seq s, uint32_t layer, void **k, void **v, size_t cap, size_t *n)
{
    if (!kv || !n || (cap && !k && !v)) return llmem__fail(LLMEM_EINVAL, "kv: null argument to seq_table");
    LOCKED(kv, table_locked(kv, s, layer, k, v, cap, n));
}

static llmem_status info_locked(llmem_kv *kv, llmem_kv_seq h, llmem_kv_seq_info *out)
{
    kv_seq *s = seq_of(kv, h);
    if (!s) return LLMEM_EINVAL;
    out->length = s->length;
    out->first = s->first;
    out->window = s->window;
    out->swapped = s->swapped;
    out->swap_bytes = s->swapped ? s->swap_map : 0;
    if (kv->strategy == LLMEM_KV_PAGED) {
        out->blocks = s->nblocks;
        out->capacity = s->swapped ? 0 : s->first / kv->B * kv->B + s->nblocks * kv->B;
    } else {
        out->capacity = s->buf ? s->buf->capacity : 0;
        out->blocks = (s->length + kv->B - 1) / kv->B; /* as seq_table reports */
    }
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_get_info(llmem_kv *kv, llmem_kv_seq s, llmem_kv_seq_info *out)
{
    if (!kv || !out) return llmem__fail(LLMEM_EINVAL, "kv: null argument to seq_get_info");
    LOCKED(kv, info_locked(kv, s, out));
}

size_t llmem_kv_token_bytes(const llmem_kv *kv) { return kv ? kv->token_bytes : 0; }
size_t llmem_kv_block_bytes(const llmem_kv *kv) { return kv ? kv->block_bytes : 0; }
size_t llmem_kv_bytes_per_token(const llmem_kv *kv) { return kv ? 2 * kv->token_bytes * kv->layers : 0; }

llmem_status llmem_kv_get_room(const llmem_kv *ckv, llmem_kv_room *out)
{
    if (!ckv || !out) return llmem__fail(LLMEM_EINVAL, "kv room: null argument");
    llmem_kv *kv = (llmem_kv *)(uintptr_t)ckv;
    pthread_mutex_lock(&kv->lock);
    llmem_kv_room r;
    memset(&r, 0, sizeof r);
    r.strategy = kv->strategy;
    r.block_tokens = kv->B;
    r.max_seq_len = kv->max_len;
    r.block_bytes_all_layers = kv->block_bytes * kv->layers;
    r.budget_bytes = kv->budget;
    r.reserved_bytes = (size_t)kv->st.bytes_reserved;
    r.can_swap = kv->strategy == LLMEM_KV_PAGED && kv->swap_res;
    r.prefix_cache = kv->prefix;
    if (kv->strategy == LLMEM_KV_PAGED) {
        for (uint32_t i = 0; i < kv->nslabs; i++)
            if (kv->slabs[i].live) r.free_blocks += kv->slabs[i].nfree;
        r.cached_blocks = kv->lru_count;
        size_t total = 0;
        for (uint32_t i = 0; i < kv->nslabs; i++)
            if (kv->slabs[i].live) total += kv->S;
        r.used_blocks = total - r.free_blocks - r.cached_blocks;
    }
    pthread_mutex_unlock(&kv->lock);
    *out = r;
    return LLMEM_OK;
}

size_t llmem_kv_trim(llmem_kv *kv, bool evict_cached)
{
    if (!kv) return 0;
    pthread_mutex_lock(&kv->lock);
    uint64_t before = kv->st.bytes_reserved;
    if (evict_cached) {
        while (kv->lru_head != NONE) {
            uint32_t b = kv->lru_head;
            lru_remove(kv, b);
            ht_remove(kv, b);
            kv->blocks[b].ref = 1; /* block_put turns it FREE */
            kv->blocks[b].state = B_USED;
            block_put(kv, b);
            kv->st.evictions_total++;
        }
    }
    for (uint32_t i = 0; i < kv->nslabs; i++)
        if (kv->slabs[i].live && kv->slabs[i].nfree == kv->S) slab_remove(kv, i);
    for (int c = 0; c < kv->nclasses; c++)
        while (kv->idle[c]) {
            kv_buf *b = kv->idle[c];
            kv->idle[c] = b->next;
            buf_release(kv, b);
        }
    size_t released = (size_t)(before - kv->st.bytes_reserved);
    pthread_mutex_unlock(&kv->lock);
    return released;
}

/* ---- invariants and stats ----------------------------------------------------------- */

#define BAD(...)                                       \
    do {                                               \
        st = llmem__fail(LLMEM_ECORRUPT, __VA_ARGS__); \
        goto done;                                     \
    } while (0)

llmem_status llmem_kv_check(llmem_kv *kv)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    llmem_status st = LLMEM_OK;
    pthread_mutex_lock(&kv->lock);
    size_t nb = (size_t)kv->nslabs * kv->S;
    uint32_t *refs = nb ? kv_meta_alloc(kv, nb, sizeof *refs) : NULL;
    if (nb && !refs) { /* not a violation: say so, the caller may try again */
        st = llmem__fail(LLMEM_ENOMEM, "kv '%s': out of memory for the check", kv->name);
        goto done;
    }
    if (nb) memset(refs, 0, nb * sizeof *refs);
    uint64_t nswapped = 0, swap_held = 0;
    for (uint32_t i = 0; i < kv->nseqs; i++) {
        kv_seq *s = &kv->seqs[i];
        if (!s->live) continue;
        if (s->first > s->length || s->first % kv->B) BAD("kv '%s': sequence %u has bad positions", kv->name, i);
        if (kv->strategy != LLMEM_KV_PAGED) {
            if ((s->length && !s->buf) || (s->buf && s->length > s->buf->capacity))
                BAD("kv '%s': sequence %u overflows its buffer", kv->name, i);
            continue;
        }
        size_t want = s->length > s->first ? (s->length - 1) / kv->B - s->first / kv->B + 1 : 0;
        if (s->swapped) {
            if (s->nblocks || s->swap_nblocks != want || !s->swap != !want || s->swap_nblocks > s->cap)
                BAD("kv '%s': swapped sequence %u holds %zu blocks, %zu in swap for %zu tokens", kv->name, i,
                    s->nblocks, s->swap_nblocks, s->length - s->first);
            nswapped++;
            swap_held += s->swap_map;
            continue;
        }
        if (s->swap) BAD("kv '%s': sequence %u holds swap memory but is not swapped", kv->name, i);
        if (s->nblocks != want) BAD("kv '%s': sequence %u has %zu blocks for %zu tokens", kv->name, i, s->nblocks,
                                    s->length - s->first);
        if (s->window && s->length - s->first > s->window + kv->B)
            BAD("kv '%s': sequence %u holds more than its window", kv->name, i);
        if (s->nblocks > s->cap || (kv->prefix && !s->partial))
            BAD("kv '%s': sequence %u has a short table", kv->name, i);
        for (size_t j = 0; j < s->nblocks; j++) {
            uint32_t b = s->blocks[j];
            if (b >= nb || kv->blocks[b].state != B_USED) BAD("kv '%s': sequence %u holds a block not in use", kv->name, i);
            refs[b]++;
        }
    }
    if (nswapped != kv->st.swapped_sequences || swap_held != kv->st.swap_bytes_held)
        BAD("kv '%s': %llu sequences hold %llu swap bytes, stats say %llu and %llu", kv->name,
            (unsigned long long)nswapped, (unsigned long long)swap_held,
            (unsigned long long)kv->st.swapped_sequences, (unsigned long long)kv->st.swap_bytes_held);
    size_t used = 0, cached = 0, freeb = 0, lru = 0;
    for (size_t b = 0; b < nb; b++) {
        kv_block *x = &kv->blocks[b];
        if (x->state == B_USED) {
            used++;
            if (x->ref != refs[b]) BAD("kv '%s': block %zu ref %u, held %u times", kv->name, b, x->ref, refs[b]);
        } else if (refs[b]) {
            BAD("kv '%s': block %zu held but not in use", kv->name, b);
        }
        if (x->state == B_CACHED) {
            cached++;
            if (!x->hashed || x->ref) BAD("kv '%s': cached block %zu not hashed or referenced", kv->name, b);
        }
        if (x->state == B_FREE) freeb++;
        if (x->hashed && ht_find(kv, x->hash, x->parent, &kv->btokens[b * kv->B]) != b)
            BAD("kv '%s': block %zu not found under its hash", kv->name, b);
    }
    for (uint32_t b = kv->lru_head; b != NONE; b = kv->blocks[b].lru_next) {
        if (kv->blocks[b].state != B_CACHED || ++lru > cached) BAD("kv '%s': LRU list is broken", kv->name);
    }
    if (lru != cached || lru != kv->lru_count)
        BAD("kv '%s': LRU holds %zu of %zu cached blocks (%zu counted)", kv->name, lru, cached, kv->lru_count);
    size_t onstacks = 0;
    for (uint32_t i = 0; i < kv->nslabs; i++) {
        for (uint32_t k = 0; k < kv->slabs[i].nfree; k++) {
            uint32_t b = slab_free(kv, i)[k];
            if (b / kv->S != i || kv->blocks[b].state != B_FREE) BAD("kv '%s': bad free stack in slab %u", kv->name, i);
        }
        onstacks += kv->slabs[i].nfree;
    }
    if (onstacks != freeb) BAD("kv '%s': %zu free blocks, %zu on free stacks", kv->name, freeb, onstacks);
    if (used + cached + freeb != kv->st.blocks_total) BAD("kv '%s': block counts disagree", kv->name);
    if (kv->nslabs > kv->slab_cap || (kv->prefix && kv->ht_cap < 2 * (size_t)kv->slab_cap * kv->S))
        BAD("kv '%s': slab arrays or prefix table smaller than the blocks", kv->name);
done:
    kv_meta_free(kv, refs);
    pthread_mutex_unlock(&kv->lock);
    return st;
}

#undef BAD

llmem_status llmem_kv_get_stats(const llmem_kv *ckv, llmem_kv_stats *out)
{
    if (!ckv || !out) return llmem__fail(LLMEM_EINVAL, "kv stats: null argument");
    llmem_kv *kv = (llmem_kv *)(uintptr_t)ckv;
    pthread_mutex_lock(&kv->lock);
    llmem_kv_stats s = kv->st;
    s.blocks_used = s.blocks_cached = s.blocks_free = 0;
    uint64_t written = 0;
    if (kv->strategy == LLMEM_KV_PAGED) {
        size_t nb = (size_t)kv->nslabs * kv->S;
        /* A block's fill: the most positions any holder has in it (a holder
         * that truncated, or dropped out of a shared block, holds fewer). */
        for (size_t b = 0; b < nb; b++)
            if (kv->blocks[b].state == B_USED) kv->blocks[b].fill = 0;
        for (uint32_t i = 0; i < kv->nseqs; i++) {
            const kv_seq *q = &kv->seqs[i];
            if (!q->live) continue;
            for (size_t j = 0; j < q->nblocks; j++) {
                size_t start = (q->first / kv->B + j) * kv->B;
                size_t held = q->length - start < kv->B ? q->length - start : kv->B;
                kv_block *x = &kv->blocks[q->blocks[j]];
                if (held > x->fill) x->fill = (uint32_t)held;
            }
        }
        for (size_t b = 0; b < nb; b++) {
            const kv_block *x = &kv->blocks[b];
            if (x->state == B_USED) {
                s.blocks_used++;
                written += x->fill;
            } else if (x->state == B_CACHED) {
                s.blocks_cached++;
            } else if (x->state == B_FREE) {
                s.blocks_free++;
            }
        }
    } else {
        /* Blocks of the buffers sequences hold are used; those of idle
         * bucket buffers are free. */
        for (uint32_t i = 0; i < kv->nseqs; i++) {
            const kv_seq *q = &kv->seqs[i];
            if (!q->live) continue;
            written += q->length;
            if (q->buf) s.blocks_used += (q->buf->capacity + kv->B - 1) / kv->B;
        }
        if (kv->strategy == LLMEM_KV_CONTIGUOUS) { /* whole blocks of each sequence's committed granules */
            s.blocks_total = 0;
            for (uint32_t i = 0; i < kv->nseqs; i++)
                if (kv->seqs[i].live && kv->seqs[i].buf) s.blocks_total += kv->seqs[i].buf->committed / kv->block_bytes;
        } else {
            s.blocks_total = s.bytes_reserved / kv->block_bytes / kv->layers;
        }
        s.blocks_free = s.blocks_total - s.blocks_used;
    }
    s.tokens_written = written;
    s.tokens_reserved = s.bytes_reserved / (2 * kv->token_bytes * kv->layers);
    pthread_mutex_unlock(&kv->lock);
    llmem__stats_out(out, &s, sizeof s);
    return LLMEM_OK;
}

#define F(kind, name, help) {#name, help, LLMEM_METRIC_##kind, LLMEM_VALUE_U64, offsetof(llmem_kv_stats, name)}
static const llmem_stat_field kv_fields[] = {
    F(GAUGE, sequences, "Live sequences."),
    F(GAUGE, blocks_total, "Blocks in all slabs."),
    F(GAUGE, blocks_used, "Blocks held by a sequence."),
    F(GAUGE, blocks_cached, "Blocks kept only for the prefix cache."),
    F(GAUGE, blocks_free, "Free blocks."),
    F(GAUGE, tokens_written, "Token slots holding data."),
    F(GAUGE, tokens_reserved, "Token slots of storage held."),
    F(GAUGE, bytes_reserved, "KV storage held, all layers."),
    F(GAUGE, bytes_reserved_peak, "Highest bytes_reserved."),
    F(COUNTER, cow_copies_total, "Shared partial blocks copied on write."),
    F(COUNTER, prefix_hit_tokens_total, "Prompt tokens found in the prefix cache."),
    F(COUNTER, prefix_miss_tokens_total, "Prompt tokens not found in the prefix cache."),
    F(COUNTER, evictions_total, "Cached blocks reused for new data."),
    F(COUNTER, preemptions_total, "Creates and appends refused for memory."),
    F(COUNTER, grows_total, "Slabs or buffers taken from the pool."),
    F(COUNTER, shrinks_total, "Slabs or buffers given back."),
    F(COUNTER, bucket_copies_total, "Buffers outgrown and copied."),
    F(GAUGE, swapped_sequences, "Live sequences swapped out."),
    F(COUNTER, swap_out_total, "Sequences swapped out."),
    F(COUNTER, swap_in_total, "Sequences swapped in."),
    F(COUNTER, bytes_swapped_out_total, "KV bytes copied to swap memory."),
    F(COUNTER, bytes_swapped_in_total, "KV bytes copied back from swap memory."),
    F(GAUGE, swap_bytes_held, "Swap memory mapped."),
    F(GAUGE, swap_bytes_held_peak, "Highest swap_bytes_held."),
    {"swap_seconds_total", "Seconds spent copying to and from swap memory.", LLMEM_METRIC_COUNTER,
     LLMEM_VALUE_DOUBLE, offsetof(llmem_kv_stats, swap_seconds_total)},
};
#undef F
static const llmem_stats_schema kv_schema = {"kv", sizeof(llmem_kv_stats), LLMEM_ARRAY_LEN(kv_fields), kv_fields};
const llmem_stats_schema *llmem_kv_stats_schema(void) { return &kv_schema; }
