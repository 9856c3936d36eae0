/*
 * kv.c - the KV cache manager: one interface over four strategies, each a
 * static const ops table in a file of its own (kv_internal.h lists them):
 * PAGED (kv_paged.c, with its prefix cache kv_prefix.c and offload
 * kv_swap.c), STATIC and BUCKETS (kv_fixed.c), CONTIGUOUS
 * (kv_contiguous.c). This file holds what they share: create and destroy,
 * the metadata pool, the sequence table, and every public call, which
 * checks its arguments and the sequence, takes the lock, and calls the
 * strategy's member (applying the default where the member is NULL).
 *
 * Sequences. A handle is (generation << 32 | slot + 1); a freed slot goes
 * on a free list and its generation moves on, so a stale handle is
 * refused (LLMEM_EINVAL), never aliased. A live sequence holds positions
 * [first, length): first > 0 only for a sliding window (PAGED), always a
 * multiple of B. Position p of layer l is token p % B of block p / B, K
 * then V in each block (B tokens of token_bytes each), whatever the
 * strategy, so llmem_kv_seq_token and _table read the same way for all.
 *
 * Metadata. Every table the manager keeps (the llmem_kv itself, sequences,
 * block tables, partial-block tokens, per-slab and per-block arrays, the
 * prefix table, buffer descriptors, scratch) comes from a private host pool
 * the manager creates with it (llmem__kv_meta_*), never from libc malloc,
 * so an engine can show that its decode loop does not call malloc. That
 * pool is separate from the storage pool even when storage is on the host:
 * the storage pool's stats and resource calls are then KV storage alone
 * (what budgets, tracking and fault-injection campaigns on the storage
 * resource see), one code path serves host and device storage, and destroy
 * drops all metadata at once. It costs each manager a 64 KiB first
 * superblock and one pool's bookkeeping. It runs over options.meta_resource
 * (default the plain os resource, llmem_resource_default), purges only on
 * its own slow paths (no background thread touches it), and is destroyed
 * last. Appends make no metadata call in the common case (kv_paged.c says
 * how PAGED sizes its tables); the only libc calls left are those the
 * pools make for their own bookkeeping.
 *
 * Invariants every strategy keeps (llmem_kv_check: the positions here,
 * then the strategy's check member): first <= length and first % B == 0
 * for every live sequence; stats.bytes_reserved is the storage held, all
 * layers, and never passes budget_bytes when there is one; sequences
 * counts the live ones.
 *
 * All state is guarded by one mutex (swap copies run under it). Device
 * memory is only ever touched through the resource's copy.
 */
#include <pthread.h>
#include <string.h>

#include "kv_internal.h"

/* ---- helpers ----------------------------------------------------------------- */

static size_t dtype_size(llmem_kv_dtype d)
{
    switch (d) {
    case LLMEM_KV_F16: case LLMEM_KV_BF16: return 2;
    case LLMEM_KV_F32: return 4;
    case LLMEM_KV_I8: return 1;
    default: return 0;
    }
}

/* The table of a strategy (checked to be one of the four). */
static const llmem__kv_ops *ops_of(llmem_kv_strategy s)
{
    switch (s) {
    case LLMEM_KV_STATIC: return llmem__kv_static_ops();
    case LLMEM_KV_BUCKETS: return llmem__kv_buckets_ops();
    case LLMEM_KV_CONTIGUOUS: return llmem__kv_contiguous_ops();
    default: return llmem__kv_paged_ops();
    }
}

/* ---- metadata ----------------------------------------------------------------- */

void *llmem__kv_meta_alloc(llmem_kv *kv, size_t count, size_t size)
{
    size_t n;
    if (!llmem__mul_ok(count, size, &n)) return NULL;
    return llmem_pool_alloc(kv->meta, n ? n : 1, NULL);
}

void *llmem__kv_meta_realloc(llmem_kv *kv, void *p, size_t count, size_t size)
{
    size_t n;
    if (!llmem__mul_ok(count, size, &n)) return NULL;
    return llmem_pool_realloc(kv->meta, p, n ? n : 1, NULL);
}

void llmem__kv_meta_free(llmem_kv *kv, void *p)
{
    if (p) llmem_pool_free(kv->meta, p);
}

/* The tables (each NULL until made), then this struct, back to the
 * metadata pool one by one, then the pool: its destroy finds no live
 * block (it reports any, as a leak). */
static void kv_meta_destroy(llmem_kv *kv)
{
    for (uint32_t i = 0; i < kv->nseqs; i++)
        if (kv->seqs[i].live) {
            llmem__kv_meta_free(kv, kv->seqs[i].blocks);
            llmem__kv_meta_free(kv, kv->seqs[i].partial);
        }
    void *tables[] = {kv->seqs, kv->ht_hash, kv->ht_block, kv->slabs, kv->slab_base, kv->slab_free, kv->blocks,
                      kv->btokens};
    for (size_t i = 0; i < sizeof tables / sizeof *tables; i++) llmem__kv_meta_free(kv, tables[i]);
    llmem_pool *meta = kv->meta;
    llmem_pool_free(meta, kv);
    llmem_pool_destroy(meta);
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
            kv_seq *n = llmem__kv_meta_realloc(kv, kv->seqs, ncap, sizeof *n);
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
    llmem__kv_meta_free(kv, s->blocks);
    llmem__kv_meta_free(kv, s->partial);
    s->blocks = NULL;
    s->partial = NULL;
    s->live = false;
    uint32_t i = (uint32_t)(s - kv->seqs);
    s->next_free = kv->seq_free;
    kv->seq_free = i + 1;
}

static llmem_status swapped_fail(llmem_kv *kv, const char *what)
{
    return llmem__fail(LLMEM_ESTATE, "kv '%s': %s on a swapped-out sequence (swap it in first)", kv->name, what);
}

/* ---- create and destroy -------------------------------------------------------------- */

llmem_kv_options llmem_kv_options_default(void)
{
    llmem_kv_options o;
    memset(&o, 0, sizeof o);
    o.name = "kv";
    o.block_tokens = 16;
    return o;
}

/* The storage pool (borrowed or made), its resource, and the strategy's
 * init member; kv is otherwise set up. */
static llmem_status storage_init(llmem_kv *kv, const llmem_kv_options *o, const char *name)
{
    llmem_status st = LLMEM_OK;
    if (o->pool) {
        kv->pool = o->pool;
    } else {
        llmem_pool_options po = llmem_pool_options_default();
        po.name = kv->name;
        po.resource = o->resource;
        st = llmem_pool_create(&po, &kv->pool);
        kv->own_pool = true;
    }
    if (st) return st;
    kv->res = llmem_pool_get_resource(kv->pool);
    kv->host = llmem_resource_kind(kv->res) == LLMEM_MEM_HOST;
    return kv->ops->init ? kv->ops->init(kv, o, name) : LLMEM_OK;
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
    const llmem__kv_ops *ops = ops_of(o.strategy);
    size_t elem = dtype_size(o.dtype);
    if (!elem) return llmem__fail(LLMEM_EINVAL, "kv '%s': unknown dtype %d", name, (int)o.dtype);
    if (!o.block_tokens) o.block_tokens = 16;
    size_t token_bytes, block_bytes, tmp;
    if (!llmem__mul_ok((size_t)o.kv_heads * o.head_dim, elem, &token_bytes) ||
        !llmem__mul_ok(token_bytes, 2 * (size_t)o.block_tokens, &block_bytes) ||
        !llmem__mul_ok(block_bytes, ((size_t)o.max_seq_len + o.block_tokens - 1) / o.block_tokens, &tmp) ||
        !llmem__mul_ok(tmp, o.layers, &tmp) || tmp > (size_t)PTRDIFF_MAX)
        return llmem__fail(LLMEM_EOVERFLOW, "kv '%s': the geometry overflows", name);
    if (o.prefix_cache && !ops->match_prefix)
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
    kv->ops = ops;
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
    st = storage_init(kv, &o, name);
    if (st) {
        if (kv->own_pool) llmem_pool_destroy(kv->pool);
        kv_meta_destroy(kv);
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
    /* Storage goes back to its pool (which may be borrowed); then the
     * tables and this struct to the metadata pool, which goes last. */
    kv->ops->destroy(kv);
    if (kv->own_pool) llmem_pool_destroy(kv->pool);
    pthread_mutex_destroy(&kv->lock);
    kv_meta_destroy(kv);
}

static llmem_status check_locked(llmem_kv *kv);

/* Runs a public call's body under the lock. */
#define LOCKED(kv, expr)                   \
    do {                                   \
        pthread_mutex_lock(&(kv)->lock);   \
        llmem_status st_ = (expr);         \
        pthread_mutex_unlock(&(kv)->lock); \
        return st_;                        \
    } while (0)

/* The same for a call that may change the manager: at debug level 3 the
 * whole manager is checked after it, whatever it returned (a refused call
 * must leave the invariants as they were, too). */
#define LOCKED_CHANGE(kv, expr)             \
    do {                                    \
        pthread_mutex_lock(&(kv)->lock);    \
        llmem_status st_ = (expr);          \
        LLMEM_DEBUG_WALK(check_locked(kv)); \
        pthread_mutex_unlock(&(kv)->lock);  \
        return st_;                         \
    } while (0)

/* ---- offload ------------------------------------------------------------------------- */

/* s's strategy swaps (swap_out and swap_in members) and kv has a swap
 * resource. */
static llmem_status swap_usable(llmem_kv *kv, kv_seq *s)
{
    if (!s) return LLMEM_EINVAL;
    if (!kv->ops->swap_out || !kv->ops->swap_in)
        return llmem__fail(LLMEM_ENOTSUP, "kv '%s': swapping needs the PAGED strategy", kv->name);
    if (!kv->swap_res) return llmem__fail(LLMEM_ENOTSUP, "kv '%s': no swap resource", kv->name);
    return LLMEM_OK;
}

static llmem_status swap_locked(llmem_kv *kv, llmem_kv_seq h, bool out)
{
    kv_seq *s = seq_of(kv, h);
    llmem_status st = swap_usable(kv, s);
    if (st) return st;
    return out ? kv->ops->swap_out(kv, s) : kv->ops->swap_in(kv, s);
}

llmem_status llmem_kv_seq_swap_out(llmem_kv *kv, llmem_kv_seq s)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    LOCKED_CHANGE(kv, swap_locked(kv, s, true));
}

llmem_status llmem_kv_seq_swap_in(llmem_kv *kv, llmem_kv_seq s)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    LOCKED_CHANGE(kv, swap_locked(kv, s, false));
}

/* ---- sequences ------------------------------------------------------------------------ */

static llmem_status seq_create_locked(llmem_kv *kv, size_t window, llmem_kv_seq *out)
{
    if (window && !kv->ops->windows)
        return llmem__fail(LLMEM_ENOTSUP, "kv '%s': windows need the PAGED strategy", kv->name);
    kv_seq *s;
    llmem_status st = seq_new(kv, &s, out);
    if (st) return st;
    s->window = window ? (window + kv->B - 1) / kv->B * kv->B : 0;
    if (kv->ops->seq_init && (st = kv->ops->seq_init(kv, s)) != LLMEM_OK) {
        seq_release_slot(kv, s);
        *out = 0;
        return st;
    }
    kv->st.sequences++;
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_create(llmem_kv *kv, size_t window_tokens, llmem_kv_seq *out)
{
    if (out) *out = 0;
    if (!kv || !out) return llmem__fail(LLMEM_EINVAL, "kv: null %s", kv ? "out" : "kv");
    LOCKED_CHANGE(kv, seq_create_locked(kv, window_tokens, out));
}

static llmem_status seq_free_locked(llmem_kv *kv, llmem_kv_seq h)
{
    kv_seq *s = seq_of(kv, h);
    if (!s) return LLMEM_EINVAL;
    kv->ops->seq_fini(kv, s);
    seq_release_slot(kv, s);
    kv->st.sequences--;
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_free(llmem_kv *kv, llmem_kv_seq s)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    if (!s) return LLMEM_OK;
    LOCKED_CHANGE(kv, seq_free_locked(kv, s));
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
    c->window = p->window;
    if ((st = kv->ops->fork(kv, c, p)) != LLMEM_OK) {
        seq_release_slot(kv, c);
        *out = 0;
        return st;
    }
    c->length = p->length;
    c->first = p->first;
    c->hashable = p->hashable;
    c->chain = p->chain;
    kv->st.sequences++;
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_fork(llmem_kv *kv, llmem_kv_seq parent, llmem_kv_seq *child)
{
    if (child) *child = 0;
    if (!kv || !child) return llmem__fail(LLMEM_EINVAL, "kv: null %s", kv ? "child" : "kv");
    LOCKED_CHANGE(kv, fork_locked(kv, parent, child));
}

static llmem_status match_locked(llmem_kv *kv, llmem_kv_seq h, const int32_t *tokens, size_t n, size_t *matched)
{
    kv_seq *s = seq_of(kv, h);
    if (!s) return LLMEM_EINVAL;
    if (s->swapped) return swapped_fail(kv, "match_prefix");
    if (s->length) return llmem__fail(LLMEM_ESTATE, "kv '%s': prefix matching needs an empty sequence", kv->name);
    if (!kv->prefix || !kv->ops->match_prefix) return LLMEM_OK; /* no cache: nothing matches */
    return kv->ops->match_prefix(kv, s, tokens, n, matched);
}

llmem_status llmem_kv_seq_match_prefix(llmem_kv *kv, llmem_kv_seq s, const int32_t *tokens, size_t n, size_t *matched)
{
    if (matched) *matched = 0;
    if (!kv || !matched || (n && !tokens)) return llmem__fail(LLMEM_EINVAL, "kv: null argument to match_prefix");
    LOCKED_CHANGE(kv, match_locked(kv, s, tokens, n, matched));
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
    return kv->ops->append(kv, s, n, tokens);
}

llmem_status llmem_kv_seq_append(llmem_kv *kv, llmem_kv_seq s, size_t n, const int32_t *tokens, size_t *first_pos)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    LOCKED_CHANGE(kv, append_locked(kv, s, n, tokens, first_pos));
}

static llmem_status truncate_locked(llmem_kv *kv, llmem_kv_seq h, size_t len, bool forget)
{
    kv_seq *s = seq_of(kv, h);
    if (!s) return LLMEM_EINVAL;
    if (s->swapped) return swapped_fail(kv, "truncate");
    if (len > s->length || len < s->first)
        return llmem__fail(LLMEM_ERANGE, "kv '%s': truncate to %zu outside the held positions [%zu, %zu]", kv->name,
                           len, s->first, s->length);
    if (kv->ops->truncate) kv->ops->truncate(kv, s, len, forget);
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
    LOCKED_CHANGE(kv, truncate_locked(kv, s, new_length, false));
}

llmem_status llmem_kv_seq_rollback(llmem_kv *kv, llmem_kv_seq s, size_t new_length)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    LOCKED_CHANGE(kv, truncate_locked(kv, s, new_length, true));
}

/* ---- reading positions ------------------------------------------------------------------ */

static llmem_status token_locked(llmem_kv *kv, llmem_kv_seq h, uint32_t layer, size_t pos, void **k, void **v)
{
    kv_seq *s = seq_of(kv, h);
    if (!s) return LLMEM_EINVAL;
    if (s->swapped) return swapped_fail(kv, "token");
    if (layer >= kv->layers) return llmem__fail(LLMEM_ERANGE, "kv '%s': layer %u of %u", kv->name, layer, kv->layers);
    if (pos >= s->length || pos < s->first)
        return llmem__fail(LLMEM_ERANGE, "kv '%s': position %zu outside the held [%zu, %zu)", kv->name, pos, s->first,
                           s->length);
    char *base = kv->ops->block_base(kv, s, layer, pos) + (pos % kv->B) * kv->token_bytes;
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
        char *base = kv->ops->block_base(kv, s, layer, (first_blk + i) * kv->B);
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
    kv->ops->seq_info(kv, s, out);
    return LLMEM_OK;
}

llmem_status llmem_kv_seq_get_info(llmem_kv *kv, llmem_kv_seq s, llmem_kv_seq_info *out)
{
    if (!kv || !out) return llmem__fail(LLMEM_EINVAL, "kv: null argument to seq_get_info");
    LOCKED(kv, info_locked(kv, s, out));
}

/* ---- the manager ------------------------------------------------------------------------ */

size_t llmem_kv_token_layer_bytes(const llmem_kv *kv) { return kv ? kv->token_bytes : 0; }
size_t llmem_kv_block_bytes(const llmem_kv *kv) { return kv ? kv->block_bytes : 0; }
size_t llmem_kv_token_total_bytes(const llmem_kv *kv) { return kv ? 2 * kv->token_bytes * kv->layers : 0; }

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
    r.can_swap = kv->ops->swap_out && kv->swap_res;
    r.prefix_cache = kv->prefix;
    if (kv->ops->room) kv->ops->room(kv, &r);
    pthread_mutex_unlock(&kv->lock);
    *out = r;
    return LLMEM_OK;
}

size_t llmem_kv_trim(llmem_kv *kv, bool evict_cached)
{
    if (!kv) return 0;
    pthread_mutex_lock(&kv->lock);
    uint64_t before = kv->st.bytes_reserved;
    if (kv->ops->trim) kv->ops->trim(kv, evict_cached);
    size_t released = (size_t)(before - kv->st.bytes_reserved);
    LLMEM_DEBUG_WALK(check_locked(kv));
    pthread_mutex_unlock(&kv->lock);
    return released;
}

/* ---- invariants and stats ----------------------------------------------------------- */

/* llmem_kv_check's walk; the caller holds the lock. */
static llmem_status check_locked(llmem_kv *kv)
{
    for (uint32_t i = 0; i < kv->nseqs; i++) {
        const kv_seq *s = &kv->seqs[i];
        if (s->live && (s->first > s->length || s->first % kv->B))
            return llmem__fail(LLMEM_ECORRUPT, "kv '%s': sequence %u has bad positions", kv->name, i);
    }
    return kv->ops->check(kv);
}

llmem_status llmem_kv_check(llmem_kv *kv)
{
    if (!kv) return llmem__fail(LLMEM_EINVAL, "kv: null kv");
    pthread_mutex_lock(&kv->lock);
    llmem_status st = check_locked(kv);
    pthread_mutex_unlock(&kv->lock);
    return st;
}

llmem_status llmem_kv_get_stats(const llmem_kv *ckv, llmem_kv_stats *out)
{
    if (!ckv || !out) return llmem__fail(LLMEM_EINVAL, "kv stats: null argument");
    llmem_kv *kv = (llmem_kv *)(uintptr_t)ckv;
    pthread_mutex_lock(&kv->lock);
    llmem_kv_stats s = kv->st;
    s.blocks_used = s.blocks_cached = s.blocks_free = 0;
    uint64_t written = 0;
    kv->ops->stats(kv, &s, &written);
    s.tokens_written = written;
    s.tokens_reserved = s.bytes_reserved / (2 * kv->token_bytes * kv->layers);
    pthread_mutex_unlock(&kv->lock);
    return llmem__stats_out(out, &s, sizeof s);
}

LLMEM__STATS_SCHEMA_OF(llmem_kv_stats_schema, "kv", llmem_kv_stats, LLMEM_KV_STATS_FIELDS)
