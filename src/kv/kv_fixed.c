/*
 * kv_fixed.c - the STATIC and BUCKETS baselines, and what every buffer
 * strategy (these two and CONTIGUOUS, kv_contiguous.c) shares.
 *
 * Algorithm. A sequence holds one buffer per layer (a kv_buf), laid out as
 * a run of blocks of B tokens, K then V in each block (as a PAGED block),
 * so positions address the same way whatever the strategy. STATIC takes a
 * buffer for max_seq_len tokens when the sequence is created: what an
 * engine without a KV manager does. BUCKETS starts a sequence with no
 * buffer and moves it to the next capacity class (B * 2^c tokens, the last
 * max_seq_len) when it outgrows the one it has, copying what it holds;
 * buffers a sequence lets go of wait on their class's idle list for reuse,
 * and are given back (largest classes first) when a new buffer would pass
 * the budget, or on trim.
 *
 * Invariants (llmem__kv_buf_check verifies them): a sequence that holds a
 * token holds a buffer, and its length is within the buffer's capacity;
 * stats.bytes_reserved is the sum over buffers held (idle ones too) of
 * whole blocks of capacity times layers.
 * Caller holds kv->lock for every member.
 */
#include "kv_internal.h"

/* ---- buffers ----------------------------------------------------------------------- */

/* Either kind of buffer: a pool block per layer (STATIC, BUCKETS), or a
 * CONTIGUOUS reservation (b->map) with `committed` bytes committed in each
 * layer. */
void llmem__kv_buf_release(llmem_kv *kv, kv_buf *b)
{
    size_t held;
    if (b->map) {
        llmem_resource_unmap(kv->res, b->map, kv->vstride * kv->layers, b->committed * kv->layers);
        held = b->committed * kv->layers;
    } else {
        for (uint32_t l = 0; l < kv->layers; l++) llmem_pool_free(kv->pool, b->base[l]);
        held = llmem__kv_buf_bytes(kv, b->capacity) * kv->layers;
    }
    llmem__assert(held <= kv->st.bytes_reserved); /* bytes_reserved sums the buffers held */
    llmem__kv_note_reserved(kv, -(int64_t)held);
    kv->st.shrinks_total++;
    llmem__kv_meta_free(kv, b);
}

/* Give back idle bucket buffers until `want` more bytes fit the budget. */
static void idle_release(llmem_kv *kv, size_t want)
{
    for (int c = kv->nclasses - 1; c >= 0 && !llmem__kv_budget_allows(kv, want); c--)
        while (kv->idle[c] && !llmem__kv_budget_allows(kv, want)) {
            kv_buf *b = kv->idle[c];
            kv->idle[c] = b->next;
            llmem__kv_buf_release(kv, b);
        }
}

/* Every idle buffer goes back to the pool. */
static void idle_drain(llmem_kv *kv)
{
    for (int c = 0; c < kv->nclasses; c++)
        while (kv->idle[c]) {
            kv_buf *b = kv->idle[c];
            kv->idle[c] = b->next;
            llmem__kv_buf_release(kv, b);
        }
}

/* A buffer for `capacity` tokens in every layer: an idle one of class cls
 * (cls >= 0, BUCKETS), else new from the pool within the budget (after
 * giving back idle ones to make room). */
static llmem_status buf_new(llmem_kv *kv, size_t capacity, int cls, kv_buf **out)
{
    size_t per = llmem__kv_buf_bytes(kv, capacity), all;
    if (!llmem__mul_ok(per, kv->layers, &all))
        return llmem__fail(LLMEM_EOVERFLOW, "kv '%s': a buffer of %zu tokens overflows", kv->name, capacity);
    if (cls >= 0 && kv->idle[cls]) {
        *out = kv->idle[cls];
        kv->idle[cls] = (*out)->next;
        (*out)->next = NULL;
        return LLMEM_OK;
    }
    idle_release(kv, all);
    if (!llmem__kv_budget_allows(kv, all))
        return llmem__fail(LLMEM_ENOMEM, "kv '%s': %zu bytes for %zu tokens would pass the budget (%llu of %zu held)",
                           kv->name, all, capacity, (unsigned long long)kv->st.bytes_reserved, kv->budget);
    kv_buf *b = llmem__kv_meta_alloc(kv, 1, sizeof *b + (size_t)kv->layers * sizeof b->base[0]);
    if (!b) return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory", kv->name);
    b->capacity = capacity;
    b->cls = cls;
    b->next = NULL;
    b->map = NULL;
    b->committed = 0;
    for (uint32_t l = 0; l < kv->layers; l++) {
        b->base[l] = llmem_pool_alloc_aligned(kv->pool, per, kv->host ? 64 : LLMEM_DEVICE_ALIGN, NULL);
        if (!b->base[l]) {
            llmem_status st = llmem_error_status();
            for (uint32_t k = 0; k < l; k++) llmem_pool_free(kv->pool, b->base[k]);
            llmem__kv_meta_free(kv, b);
            return st ? st : LLMEM_ENOMEM;
        }
    }
    kv->st.grows_total++;
    llmem__kv_note_reserved(kv, (int64_t)all);
    *out = b;
    return LLMEM_OK;
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

llmem_status llmem__kv_buf_copy(llmem_kv *kv, kv_buf *dst, const kv_buf *src, size_t n)
{
    size_t blocks = (n + kv->B - 1) / kv->B;
    for (uint32_t l = 0; l < kv->layers; l++) {
        llmem_status st = llmem__kv_copy(kv, dst->base[l], src->base[l], blocks * kv->block_bytes);
        if (st) return st;
    }
    return LLMEM_OK;
}

/* ---- what every buffer strategy shares ---------------------------------------------- */

llmem_status llmem__kv_buf_fork_fill(llmem_kv *kv, kv_seq *c, const kv_seq *p, llmem_status st,
                                     void (*fini)(llmem_kv *kv, kv_seq *s))
{
    if (!st) st = llmem__kv_buf_copy(kv, c->buf, p->buf, p->length);
    if (st) {
        fini(kv, c);
        kv->st.preemptions_total++;
    }
    return st;
}

llmem_status llmem__kv_buf_append_check(llmem_kv *kv, kv_seq *s, size_t n, bool *fits)
{
    size_t want = s->length + n;
    if (want > kv->max_len)
        return llmem__fail(LLMEM_ERANGE, "kv '%s': %zu more tokens pass max_seq_len %u (sequence holds %zu)",
                           kv->name, n, kv->max_len, s->length);
    *fits = s->buf && want <= s->buf->capacity;
    return LLMEM_OK;
}

char *llmem__kv_buf_block_base(const llmem_kv *kv, const kv_seq *s, uint32_t layer, size_t pos)
{
    llmem__assert(s->buf && pos < s->buf->capacity); /* a held token lies within its buffer */
    return (char *)s->buf->base[layer] + pos / kv->B * kv->block_bytes;
}

void llmem__kv_buf_seq_info(const llmem_kv *kv, const kv_seq *s, llmem_kv_seq_info *out)
{
    out->capacity = s->buf ? s->buf->capacity : 0;
    out->blocks = (s->length + kv->B - 1) / kv->B; /* as seq_table reports */
}

llmem_status llmem__kv_buf_check(llmem_kv *kv)
{
    for (uint32_t i = 0; i < kv->nseqs; i++) {
        const kv_seq *s = &kv->seqs[i];
        if (s->live && ((s->length && !s->buf) || (s->buf && s->length > s->buf->capacity)))
            return llmem__fail(LLMEM_ECORRUPT, "kv '%s': sequence %u overflows its buffer", kv->name, i);
    }
    return LLMEM_OK;
}

void llmem__kv_buf_destroy(llmem_kv *kv)
{
    for (uint32_t i = 0; i < kv->nseqs; i++) {
        kv_seq *s = &kv->seqs[i];
        if (s->live && s->buf) llmem__kv_buf_release(kv, s->buf);
    }
    idle_drain(kv);
}

/* Blocks of the buffers sequences hold are used; token slots written are
 * the sequences' lengths. */
void llmem__kv_buf_stats_used(const llmem_kv *kv, llmem_kv_stats *s, uint64_t *written)
{
    for (uint32_t i = 0; i < kv->nseqs; i++) {
        const kv_seq *q = &kv->seqs[i];
        if (!q->live) continue;
        *written += q->length;
        if (q->buf) s->blocks_used += (q->buf->capacity + kv->B - 1) / kv->B;
    }
}

/* Every block of storage held is counted, idle bucket buffers' as free. */
static void fixed_stats(llmem_kv *kv, llmem_kv_stats *s, uint64_t *written)
{
    llmem__kv_buf_stats_used(kv, s, written);
    s->blocks_total = s->bytes_reserved / kv->block_bytes / kv->layers;
    s->blocks_free = s->blocks_total - s->blocks_used;
}

/* ---- STATIC --------------------------------------------------------------------------- */

/* max_seq_len tokens at once; refused for memory, a preemption. */
static llmem_status static_seq_init(llmem_kv *kv, kv_seq *s)
{
    llmem_status st = buf_new(kv, kv->max_len, -1, &s->buf);
    if (st) kv->st.preemptions_total++;
    return st;
}

static void static_seq_fini(llmem_kv *kv, kv_seq *s)
{
    if (s->buf) llmem__kv_buf_release(kv, s->buf);
    s->buf = NULL;
}

static llmem_status static_fork(llmem_kv *kv, kv_seq *c, const kv_seq *p)
{
    return llmem__kv_buf_fork_fill(kv, c, p, buf_new(kv, p->buf->capacity, -1, &c->buf), static_seq_fini);
}

/* The buffer holds max_seq_len tokens from the start: the check is all. */
static llmem_status static_append(llmem_kv *kv, kv_seq *s, size_t n, const int32_t *tokens)
{
    (void)tokens;
    bool fits = false;
    llmem_status st = llmem__kv_buf_append_check(kv, s, n, &fits);
    if (!st) s->length += n;
    return st;
}

static const llmem__kv_ops static_ops = {
    LLMEM__KV_BUF_OPS,
    .name = "static",
    .init = NULL,
    .seq_init = static_seq_init,
    .seq_fini = static_seq_fini,
    .fork = static_fork,
    .append = static_append,
    .trim = NULL,
    .stats = fixed_stats,
};

const llmem__kv_ops *llmem__kv_static_ops(void) { return &static_ops; }

/* ---- BUCKETS -------------------------------------------------------------------------- */

static llmem_status buckets_init(llmem_kv *kv, const llmem_kv_options *o, const char *name)
{
    (void)o;
    (void)name;
    size_t cap;
    kv->nclasses = bucket_for(kv, kv->max_len, &cap) + 1;
    return LLMEM_OK;
}

/* A buffer no sequence holds waits on its class's idle list. */
static void idle_push(llmem_kv *kv, kv_buf *b)
{
    b->next = kv->idle[b->cls];
    kv->idle[b->cls] = b;
}

static void buckets_seq_fini(llmem_kv *kv, kv_seq *s)
{
    if (s->buf) idle_push(kv, s->buf);
    s->buf = NULL;
}

static llmem_status buckets_fork(llmem_kv *kv, kv_seq *c, const kv_seq *p)
{
    if (!p->buf) return LLMEM_OK;
    size_t cap;
    int cls = bucket_for(kv, p->length ? p->length : 1, &cap);
    return llmem__kv_buf_fork_fill(kv, c, p, buf_new(kv, cap, cls, &c->buf), buckets_seq_fini);
}

/* Outgrown: a buffer of the next class that fits, what it holds copied. */
static llmem_status buckets_append(llmem_kv *kv, kv_seq *s, size_t n, const int32_t *tokens)
{
    (void)tokens;
    bool fits = false;
    llmem_status st = llmem__kv_buf_append_check(kv, s, n, &fits);
    if (st) return st;
    size_t want = s->length + n;
    if (fits) {
        s->length = want;
        return LLMEM_OK;
    }
    size_t capacity;
    int c = bucket_for(kv, want, &capacity);
    kv_buf *nb;
    st = buf_new(kv, capacity, c, &nb);
    if (st) {
        kv->st.preemptions_total++;
        return st;
    }
    if (s->buf) {
        st = llmem__kv_buf_copy(kv, nb, s->buf, s->length);
        if (st) {
            idle_push(kv, nb);
            return st;
        }
        kv->st.bucket_copies_total++;
        buckets_seq_fini(kv, s);
    }
    s->buf = nb;
    s->length = want;
    return LLMEM_OK;
}

static void buckets_trim(llmem_kv *kv, bool evict_cached)
{
    (void)evict_cached;
    idle_drain(kv);
}

static const llmem__kv_ops buckets_ops = {
    LLMEM__KV_BUF_OPS,
    .name = "buckets",
    .init = buckets_init,
    .seq_init = NULL,
    .seq_fini = buckets_seq_fini,
    .fork = buckets_fork,
    .append = buckets_append,
    .trim = buckets_trim,
    .stats = fixed_stats,
};

const llmem__kv_ops *llmem__kv_buckets_ops(void) { return &buckets_ops; }
