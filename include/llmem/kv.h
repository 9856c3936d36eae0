/*
 * llmem/kv.h - the KV cache manager.
 *
 * The KV cache grows one slot per token per sequence and dies with the
 * request. llmem_kv hands an engine the memory for it, from a pool over any
 * resource, host or device (it never touches device memory itself: copies
 * go through the resource). Four strategies behind one interface, so they
 * can be compared on equal terms:
 *  - PAGED (default): fixed blocks of block_tokens tokens. One block id space
 *    is shared by all layers; each layer's storage grows in slabs of a few
 *    blocks taken from the pool and goes back when a slab is wholly free.
 *    A sequence's blocks come from slabs of its own while the budget allows
 *    new slabs (then from the fullest slab), so its slabs go back when it
 *    ends; the slab size bounds the waste: about half a slab per sequence.
 *    Sequences hold a table of block ids. Forks share full blocks (reference
 *    counts) and copy a shared partial block when it is written
 *    (copy-on-write). A prefix cache indexes full blocks by a hash of every
 *    token up to and including them: a new sequence whose prompt starts with
 *    a cached prefix reuses those blocks, and blocks no sequence uses stay
 *    cached until memory is needed (then least recently used goes first,
 *    and of one sequence's blocks the last first). A block is registered
 *    when an append given the tokens fills it, and only if the sequence
 *    still holds it when the append returns (so the engine writes it).
 *    A sequence with a window (rounded up to whole blocks) always holds its
 *    last window_tokens tokens and at most one block more, and reuses its
 *    oldest block once that has wholly left the window (sliding-window
 *    attention).
 *  - STATIC: every sequence reserves max_seq_len tokens contiguously at
 *    creation, as llama2.c does.
 *  - BUCKETS: a contiguous buffer per sequence from capacity classes (powers
 *    of two from one block to max_seq_len), reused across requests, grown by
 *    copying into the next class when outgrown.
 *  - CONTIGUOUS: as STATIC, each layer of a sequence is one run of blocks
 *    for max_seq_len tokens at fixed addresses, but reserved as address
 *    space only (straight from the pool's resource, which must be able to
 *    reserve: os, sim-device, cuda-vmm; LLMEM_ENOTSUP otherwise) and
 *    committed a granule at a time as the sequence grows: memory follows the
 *    tokens held, positions never move, and a kernel needs no block table
 *    (vAttention's layout). The budget counts committed bytes; truncating
 *    keeps the committed memory until the sequence is freed. Not in the
 *    pool's stats: its resource calls are the manager's own.
 *
 * Layout: for every layer, a block holds K for block_tokens tokens, then V
 * for them; a token's K (or V) is kv_heads * head_dim elements, head-major.
 * In STATIC and BUCKETS a sequence's buffer is a run of such blocks, so an
 * engine addresses every strategy the same way:
 *
 *     llmem_kv_seq s;
 *     llmem_kv_seq_create(kv, 0, &s);
 *     size_t reused = 0;
 *     llmem_kv_seq_match_prefix(kv, s, prompt, n, &reused);   // skip those
 *     llmem_kv_seq_append(kv, s, n - reused, prompt + reused, NULL);
 *     for (pos ...) { void *k, *v; llmem_kv_seq_token(kv, s, layer, pos, &k, &v); ... }
 *     llmem_kv_seq_table(kv, s, layer, kptr, vptr, cap, &nblocks); // attention
 *     llmem_kv_seq_free(kv, s);
 *
 * Appending when no block can be had returns LLMEM_ENOMEM and changes
 * nothing, so a scheduler can preempt; no other sequence is touched. When
 * the budget refuses, the prefix cache loses nothing either (a failing
 * resource may have cost it the blocks evicted before the failure).
 * Host memory: the manager's own tables come from a private host pool it
 * creates with itself over options.meta_resource (default the os resource;
 * about 64 KiB mapped, plus the pool's bookkeeping),
 * not from malloc and not from the storage pool, whose stats and resource
 * calls are KV storage alone. A sequence's tables are sized when it is
 * created and the per-slab ones when the manager is (for the budget's
 * slabs, with a budget), so an append makes no host allocation in the
 * common case: an engine's decode loop can run without malloc.
 * Threads: every call takes the manager's lock; a sequence should be driven
 * by one thread at a time. A block an append registers can be matched by
 * other threads as soon as the append returns, before its K/V are written:
 * an engine sharing prompts between threads writes a block before another
 * thread may match it.
 */
#ifndef LLMEM_KV_H
#define LLMEM_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/pool.h"
#include "llmem/resource.h"
#include "llmem/stats.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_kv llmem_kv;
typedef uint64_t llmem_kv_seq; /* 0 is never a sequence */

typedef enum llmem_kv_strategy {
    LLMEM_KV_PAGED = 0,
    LLMEM_KV_STATIC = 1,
    LLMEM_KV_BUCKETS = 2,
    LLMEM_KV_CONTIGUOUS = 3
} llmem_kv_strategy;

typedef enum llmem_kv_dtype {
    LLMEM_KV_F16 = 0, /* default */
    LLMEM_KV_F32 = 1,
    LLMEM_KV_BF16 = 2,
    LLMEM_KV_I8 = 3   /* one byte per element (per-block scales are the engine's) */
} llmem_kv_dtype;

typedef struct llmem_kv_options {
    const char *name;             /* default "kv" */
    llmem_kv_strategy strategy;   /* default PAGED */
    uint32_t layers;              /* required */
    uint32_t kv_heads;            /* required */
    uint32_t head_dim;            /* required */
    llmem_kv_dtype dtype;         /* default F16 */
    uint32_t block_tokens;        /* tokens per block; default 16 */
    uint32_t max_seq_len;         /* longest sequence (STATIC reserves it); required */
    size_t budget_bytes;          /* cap on KV storage held; 0 = none; PAGED: at least one slab
                                     (slab_bytes x layers), else create is LLMEM_EINVAL naming it */
    llmem_pool *pool;             /* borrowed; default: a pool of the manager's own over `resource` */
    llmem_resource *resource;     /* for the manager's own pool; default the os resource */
    size_t slab_bytes;            /* PAGED: bytes per layer per slab; default 2 blocks, at least 64 KiB */
    bool prefix_cache;            /* PAGED: index full blocks by prefix hash */
    llmem_resource *swap_resource; /* PAGED: host resource (kind LLMEM_MEM_HOST, e.g. pinned memory) that
                                     swapped-out sequences' KV waits in; borrowed, must outlive the
                                     manager; default NULL: swapping disabled (LLMEM_ENOTSUP) */
    size_t swap_budget_bytes;     /* cap on swap memory held (mapped bytes, rounded to the swap resource's
                                     granularity); 0 = none */
    llmem_resource *meta_resource; /* host resource (kind LLMEM_MEM_HOST) of the manager's private metadata
                                     pool; borrowed, must outlive the manager; default the os resource
                                     (llmem_resource_default). An engine passes its host pool's resource so
                                     that tracking and fault injection see every byte it takes */
} llmem_kv_options;

/* The fields of llmem_kv_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_KV_STATS_FIELDS(X) \
    X(GAUGE, U64, sequences, "Live sequences.") \
    /* PAGED: blocks in all slabs */ \
    X(GAUGE, U64, blocks_total, "Blocks in all slabs.") \
    /* held by at least one sequence (STATIC, BUCKETS: in their buffers) */ \
    X(GAUGE, U64, blocks_used, "Blocks held by a sequence.") \
    /* held by no sequence, kept for the prefix cache */ \
    X(GAUGE, U64, blocks_cached, "Blocks kept only for the prefix cache.") \
    /* (BUCKETS: in idle buffers) */ \
    X(GAUGE, U64, blocks_free, "Free blocks.") \
    /* token slots holding data held by a sequence (a shared block's once) */ \
    X(GAUGE, U64, tokens_written, "Token slots holding data.") \
    /* token slots of storage held (blocks, reservations, buckets) */ \
    X(GAUGE, U64, tokens_reserved, "Token slots of storage held.") \
    X(GAUGE, U64, bytes_reserved, "KV storage held, all layers.") \
    X(GAUGE, U64, bytes_reserved_peak, "Highest bytes_reserved.") \
    X(COUNTER, U64, cow_copies_total, "Shared partial blocks copied on write.") \
    X(COUNTER, U64, prefix_hit_tokens_total, "Prompt tokens found in the prefix cache.") \
    X(COUNTER, U64, prefix_miss_tokens_total, "Prompt tokens not found in the prefix cache.") \
    X(COUNTER, U64, evictions_total, "Cached blocks reused for new data.") \
    X(COUNTER, U64, preemptions_total, "Creates and appends refused for memory.") \
    X(COUNTER, U64, grows_total, "Slabs or buffers taken from the pool.") \
    X(COUNTER, U64, shrinks_total, "Slabs or buffers given back.") \
    /* BUCKETS: buffers outgrown and copied */ \
    X(COUNTER, U64, bucket_copies_total, "Buffers outgrown and copied.") \
    /* live sequences swapped out now */ \
    X(GAUGE, U64, swapped_sequences, "Live sequences swapped out.") \
    /* successful llmem_kv_seq_swap_out calls */ \
    X(COUNTER, U64, swap_out_total, "Sequences swapped out.") \
    /* successful llmem_kv_seq_swap_in calls */ \
    X(COUNTER, U64, swap_in_total, "Sequences swapped in.") \
    /* KV bytes copied device -> swap (whole blocks, all layers) */ \
    X(COUNTER, U64, bytes_swapped_out_total, "KV bytes copied to swap memory.") \
    /* KV bytes copied swap -> device */ \
    X(COUNTER, U64, bytes_swapped_in_total, "KV bytes copied back from swap memory.") \
    /* swap memory mapped now (rounded to the swap resource's granularity) */ \
    X(GAUGE, U64, swap_bytes_held, "Swap memory mapped.") \
    X(GAUGE, U64, swap_bytes_held_peak, "Highest swap_bytes_held.") \
    /* wall time spent in swap copies, both directions (seconds) */ \
    X(COUNTER, DOUBLE, swap_seconds_total, "Seconds spent copying to and from swap memory.")

typedef struct llmem_kv_stats {
    size_t struct_size;
    LLMEM_KV_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_kv_stats;

/* What a sequence holds. */
typedef struct llmem_kv_seq_info {
    size_t length;           /* tokens appended over its life (positions 0..length-1) */
    size_t first;            /* first position still held (> 0 once a window dropped some) */
    size_t blocks;           /* blocks in its table (as llmem_kv_seq_table reports) */
    size_t window;           /* 0 = no window */
    size_t capacity;         /* tokens it can hold without taking memory (0 while swapped) */
    bool swapped;            /* swapped out: blocks is 0, its KV waits in swap memory */
    size_t swap_bytes;       /* swap memory it holds (mapped bytes; 0 unless swapped) */
} llmem_kv_seq_info;

LLMEM_API llmem_kv_options llmem_kv_options_default(void);

/* Errors: LLMEM_EINVAL (missing geometry, unknown enum, a swap or metadata
 * resource that is not host memory), LLMEM_EOVERFLOW
 * (a block or sequence whose size overflows), LLMEM_ENOMEM. */
LLMEM_API llmem_status llmem_kv_create(const llmem_kv_options *opts, llmem_kv **out);
LLMEM_API void llmem_kv_destroy(llmem_kv *kv);

/* A new empty sequence. window_tokens > 0 gives it a sliding window (PAGED
 * only; LLMEM_ENOTSUP otherwise). STATIC reserves its max_seq_len here:
 * LLMEM_ENOMEM when the budget is full. */
LLMEM_API llmem_status llmem_kv_seq_create(llmem_kv *kv, size_t window_tokens, llmem_kv_seq *out);

/* Free a sequence (0 is a no-op). Its blocks go back, or into the prefix
 * cache. */
LLMEM_API llmem_status llmem_kv_seq_free(llmem_kv *kv, llmem_kv_seq s);

/* A child holding the same tokens: PAGED shares every block (a shared
 * partial block is copied when either side writes it); STATIC and BUCKETS
 * copy. */
LLMEM_API llmem_status llmem_kv_seq_fork(llmem_kv *kv, llmem_kv_seq parent, llmem_kv_seq *child);

/* For an empty sequence: attach the longest run of cached full blocks
 * matching the start of tokens[0..n), at most max_seq_len tokens without a
 * window. *matched gets the tokens covered (a multiple of block_tokens; 0
 * without a prefix cache); the engine appends the rest. A sequence with a
 * window keeps only the last blocks its window holds (info.first moves
 * up). LLMEM_ESTATE if the sequence holds tokens. */
LLMEM_API llmem_status llmem_kv_seq_match_prefix(llmem_kv *kv, llmem_kv_seq s, const int32_t *tokens, size_t n,
                                                 size_t *matched);

/* Append n token slots (tokens may be NULL; the prefix cache needs them).
 * first_pos (optional) gets the position of the first new token. All or
 * nothing: LLMEM_ENOMEM (no block, budget full: preempt), LLMEM_ERANGE
 * (past max_seq_len without a window). */
LLMEM_API llmem_status llmem_kv_seq_append(llmem_kv *kv, llmem_kv_seq s, size_t n, const int32_t *tokens,
                                           size_t *first_pos);

/* Keep positions [first, new_length); LLMEM_ERANGE if new_length is beyond
 * the sequence or before what a window dropped. */
LLMEM_API llmem_status llmem_kv_seq_truncate(llmem_kv *kv, llmem_kv_seq s, size_t new_length);

/* Truncate to undo an append whose slots were never written (an engine
 * step that failed after its appends): as truncate, and the blocks this
 * sequence alone holds that the append may have registered in the prefix
 * cache leave it - those dropped, and a kept last block left partial. */
LLMEM_API llmem_status llmem_kv_seq_rollback(llmem_kv *kv, llmem_kv_seq s, size_t new_length);

/* Where position pos of layer `layer` lives: K and V for that token
 * (kv_heads * head_dim elements each). Either out may be NULL. */
LLMEM_API llmem_status llmem_kv_seq_token(llmem_kv *kv, llmem_kv_seq s, uint32_t layer, size_t pos, void **k,
                                          void **v);

/* The block table for attention: the K and V base of each block of layer
 * `layer`, oldest first (the first block starts at info.first rounded down
 * to a block). Fills up to cap entries of each non-NULL array; *n gets the
 * number of blocks. */
LLMEM_API llmem_status llmem_kv_seq_table(llmem_kv *kv, llmem_kv_seq s, uint32_t layer, void **k, void **v,
                                          size_t cap, size_t *n);

LLMEM_API llmem_status llmem_kv_seq_get_info(llmem_kv *kv, llmem_kv_seq s, llmem_kv_seq_info *out);

/* Offload (PAGED; options.swap_resource set). A preempted sequence's KV can
 * wait in host memory instead of being recomputed:
 *
 *     if (llmem_kv_seq_append(kv, s, 1, &tok, NULL) == LLMEM_ENOMEM)
 *         llmem_kv_seq_swap_out(kv, victim);      // its blocks go back
 *     ...
 *     if (llmem_kv_seq_swap_in(kv, victim) == LLMEM_OK) resume(victim);
 *
 * swap_out maps one region of exactly blocks x block_bytes x layers bytes
 * (rounded to the swap resource's granularity) from the swap resource,
 * copies every block the sequence holds into it (all layers, K and V, whole
 * blocks; device storage is read only through the storage resource's
 * copy), then lets go of its blocks as a free would: a block another
 * sequence shares keeps its data and loses one reference, a block in the
 * prefix cache stays cached (evictable). Shared blocks are copied too, so
 * swap_in needs no sharing. The sequence stays live but swapped: append,
 * truncate, token, table, fork and match_prefix return LLMEM_ESTATE;
 * get_info, free and swap_in work. Errors: LLMEM_ENOTSUP (no swap
 * resource, or STATIC/BUCKETS), LLMEM_ESTATE (already swapped), LLMEM_ENOMEM
 * (the swap budget or the swap resource refuses), or the copy's status; on
 * any error nothing changed. An empty sequence swaps without memory.
 *
 * swap_in takes fresh blocks (not shared with anyone, not registered in the
 * prefix cache; the sequence's later full blocks register as usual), copies
 * the bytes back and unmaps the region. Errors: LLMEM_ESTATE (not swapped),
 * LLMEM_ENOMEM (the blocks cannot be had: it stays swapped and nothing
 * changed, except cached blocks evicted before a resource failure), or the
 * copy's status (stays swapped). Both copy under the manager's lock.
 * Freeing a swapped sequence unmaps its swap memory; so does destroy. */
LLMEM_API llmem_status llmem_kv_seq_swap_out(llmem_kv *kv, llmem_kv_seq s);
LLMEM_API llmem_status llmem_kv_seq_swap_in(llmem_kv *kv, llmem_kv_seq s);

/* Bytes of one token's K (or V) in one layer, of a block in one layer (K and
 * V), and per token over all layers (K and V). */
LLMEM_API size_t llmem_kv_token_layer_bytes(const llmem_kv *kv);
LLMEM_API size_t llmem_kv_block_bytes(const llmem_kv *kv);
LLMEM_API size_t llmem_kv_token_total_bytes(const llmem_kv *kv);

/* Room left, for admission control: cheap (no walk over the blocks). */
typedef struct llmem_kv_room {
    llmem_kv_strategy strategy;
    size_t block_tokens;
    size_t max_seq_len;
    size_t block_bytes_all_layers; /* one block's storage over every layer, K and V */
    size_t budget_bytes;           /* the cap on KV storage; 0 = none */
    size_t reserved_bytes;         /* KV storage held now */
    size_t free_blocks;            /* PAGED: blocks free in the slabs held */
    size_t cached_blocks;          /* PAGED: held by no sequence, kept for the prefix cache (evictable) */
    size_t used_blocks;            /* PAGED: held by sequences */
    bool can_swap;                 /* PAGED with a swap resource: llmem_kv_seq_swap_out works */
    bool prefix_cache;             /* PAGED with the prefix cache: llmem_kv_seq_match_prefix can find blocks */
} llmem_kv_room;

LLMEM_API llmem_status llmem_kv_get_room(const llmem_kv *kv, llmem_kv_room *out);

/* Give back storage nothing holds: cached blocks (if evict_cached), then
 * wholly free slabs (PAGED) or idle buffers (BUCKETS). Returns bytes. */
LLMEM_API size_t llmem_kv_trim(llmem_kv *kv, bool evict_cached);

/* Verify the manager's invariants (reference counts, free lists, cache,
 * tables); LLMEM_ECORRUPT naming the first violation, LLMEM_ENOMEM when
 * the metadata pool cannot lend the check its scratch table. */
LLMEM_API llmem_status llmem_kv_check(llmem_kv *kv);

LLMEM_API llmem_status llmem_kv_get_stats(const llmem_kv *kv, llmem_kv_stats *out);
LLMEM_API const llmem_stats_schema *llmem_kv_stats_schema(void);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_KV_H */
