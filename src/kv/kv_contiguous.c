/*
 * kv_contiguous.c - the CONTIGUOUS strategy: each sequence reserves
 * address space for max_seq_len tokens in every layer when it is created
 * and commits it as it grows, so nothing ever moves (what vAttention does
 * with CUDA virtual memory).
 *
 * Algorithm. A sequence's kv_buf maps one uncommitted range of
 * layers x vstride bytes from the storage resource (vstride: a layer's
 * max_seq_len tokens, rounded up to the resource's granularity vgran);
 * layer l's buffer starts at l x vstride. An append past what is committed
 * commits every layer's range up to the new length in whole granules, all
 * layers or none; the buffer's capacity is then the whole blocks committed
 * (at most max_seq_len). Freeing the sequence unmaps the range. Buffers
 * are addressed as every buffer strategy's (kv_fixed.c). The resource must
 * reserve and decommit (LLMEM_RES_CAP_RESERVE, _DECOMMIT): create refuses
 * others.
 *
 * Invariants: committed is a multiple of vgran (or vstride) and the same
 * in every layer; stats.bytes_reserved is the sum of committed x layers
 * over live sequences; capacity = committed / block_bytes * B, at most
 * max_seq_len; a sequence's length is within its capacity
 * (llmem__kv_buf_check).
 * Caller holds kv->lock for every member.
 */
#include "kv_internal.h"

/* A reservation of vstride bytes per layer, nothing committed. */
static llmem_status vbuf_new(llmem_kv *kv, kv_buf **out)
{
    kv_buf *b = llmem__kv_meta_alloc(kv, 1, sizeof *b + (size_t)kv->layers * sizeof b->base[0]);
    if (!b) return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory", kv->name);
    memset(b, 0, sizeof *b);
    b->cls = -1;
    llmem_status st = llmem_resource_map_tagged(kv->res, kv->vstride * kv->layers, kv->vgran, LLMEM_MAP_UNCOMMITTED,
                                                kv->name, &b->map);
    if (st) {
        llmem__kv_meta_free(kv, b);
        return st;
    }
    for (uint32_t l = 0; l < kv->layers; l++) b->base[l] = (char *)b->map + (size_t)l * kv->vstride;
    *out = b;
    return LLMEM_OK;
}

/* Commit every layer's range up to `tokens`; all layers or none (a
 * failure decommits what this call committed). */
static llmem_status vbuf_fit(llmem_kv *kv, kv_buf *b, size_t tokens)
{
    size_t need = (llmem__kv_buf_bytes(kv, tokens) + kv->vgran - 1) / kv->vgran * kv->vgran;
    if (need > kv->vstride) need = kv->vstride;
    if (need <= b->committed) return LLMEM_OK;
    size_t more = need - b->committed;
    if (!llmem__kv_budget_allows(kv, more * kv->layers))
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
    llmem__kv_note_reserved(kv, (int64_t)(more * kv->layers));
    return LLMEM_OK;
}

/* The resource must reserve address space; vgran and vstride. */
static llmem_status contiguous_init(llmem_kv *kv, const llmem_kv_options *o, const char *name)
{
    (void)o;
    llmem_resource_info info;
    memset(&info, 0, sizeof info);
    llmem_resource_get_info(kv->res, &info);
    kv->vgran = info.granularity;
    size_t per = llmem__kv_buf_bytes(kv, kv->max_len), all;
    if (!(info.caps & LLMEM_RES_CAP_RESERVE) || !(info.caps & LLMEM_RES_CAP_DECOMMIT))
        return llmem__fail(LLMEM_ENOTSUP, "kv '%s': the CONTIGUOUS strategy needs a resource that reserves "
                           "address space (%s cannot)", name, llmem_resource_name(kv->res));
    if (!llmem__align_up(per, kv->vgran, &kv->vstride) || !llmem__mul_ok(kv->vstride, kv->layers, &all) ||
        all > (size_t)PTRDIFF_MAX)
        return llmem__fail(LLMEM_EOVERFLOW, "kv '%s': the reservation per sequence overflows", name);
    return LLMEM_OK;
}

/* The reservation; refused, a preemption. */
static llmem_status contiguous_seq_init(llmem_kv *kv, kv_seq *s)
{
    llmem_status st = vbuf_new(kv, &s->buf);
    if (st) kv->st.preemptions_total++;
    return st;
}

static void contiguous_seq_fini(llmem_kv *kv, kv_seq *s)
{
    if (s->buf) llmem__kv_buf_release(kv, s->buf);
    s->buf = NULL;
}

/* A reservation of its own, committed for the parent's length, copied. */
static llmem_status contiguous_fork(llmem_kv *kv, kv_seq *c, const kv_seq *p)
{
    if (!p->buf) return LLMEM_OK;
    llmem_status st = vbuf_new(kv, &c->buf);
    if (!st) st = vbuf_fit(kv, c->buf, p->length);
    return llmem__kv_buf_fork_fill(kv, c, p, st, contiguous_seq_fini);
}

/* Commit in place: nothing moves. */
static llmem_status contiguous_append(llmem_kv *kv, kv_seq *s, size_t n, const int32_t *tokens)
{
    (void)tokens;
    bool fits = false;
    llmem_status st = llmem__kv_buf_append_check(kv, s, n, &fits);
    if (st) return st;
    if (!fits && (st = vbuf_fit(kv, s->buf, s->length + n)) != LLMEM_OK) {
        kv->st.preemptions_total++;
        return st;
    }
    s->length += n;
    return LLMEM_OK;
}

/* Whole blocks of each sequence's committed granules. */
static void contiguous_stats(llmem_kv *kv, llmem_kv_stats *s, uint64_t *written)
{
    llmem__kv_buf_stats_used(kv, s, written);
    s->blocks_total = 0;
    for (uint32_t i = 0; i < kv->nseqs; i++)
        if (kv->seqs[i].live && kv->seqs[i].buf) s->blocks_total += kv->seqs[i].buf->committed / kv->block_bytes;
    s->blocks_free = s->blocks_total - s->blocks_used;
}

static const llmem__kv_ops contiguous_ops = {
    LLMEM__KV_BUF_OPS,
    .name = "contiguous",
    .init = contiguous_init,
    .seq_init = contiguous_seq_init,
    .seq_fini = contiguous_seq_fini,
    .fork = contiguous_fork,
    .append = contiguous_append,
    .trim = NULL,
    .stats = contiguous_stats,
};

const llmem__kv_ops *llmem__kv_contiguous_ops(void) { return &contiguous_ops; }
