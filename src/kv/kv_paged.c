/*
 * kv_paged.c - the PAGED strategy: slabs of blocks, per-sequence block
 * tables, copy-on-write of shared partial blocks, and sliding windows.
 * The prefix cache it offers is kv_prefix.c; its offload is kv_swap.c.
 *
 * Algorithm. Blocks are numbered 0..; block b lives in slab b / S at
 * index b % S, and every layer has its own slab storage (S * block_bytes
 * from the pool). A block is ABSENT (its slab was given back), FREE (on its
 * slab's free stack), USED (ref > 0 sequences hold it) or CACHED (ref 0,
 * but registered in the prefix cache and on the LRU list). A new block
 * comes from the slab of the sequence's previous block, else from a new
 * slab if the budget allows, else from the fullest slab with a free one,
 * else by evicting the least recently used cached block. A slab that
 * becomes wholly free goes back to the pool at once.
 *
 * Sequences hold block ids in position order from block first/B. An append
 * first works out exactly how many blocks it needs - new positions, less
 * the oldest blocks a window lets it recycle, plus one if the partial last
 * block is shared (referenced twice, or registered in the prefix cache) and
 * must be copied - and takes them all before changing anything, so it
 * either succeeds whole or fails with nothing changed.
 *
 * Metadata. A sequence's block table is sized at creation for all it can
 * hold (ceil(max_seq_len / B) + 1 entries, or window/B + 2 for a window,
 * up to KV_TABLE_PREALLOC entries; longer ones grow geometrically) and its
 * partial-block buffer too when the prefix cache is on. The per-slab and
 * per-block arrays (and the prefix table, kept at least twice the number
 * of blocks so an insert never grows it) grow geometrically when a new
 * slab slot is added, and are sized at creation for the budget's slabs when
 * there is a budget (up to KV_META_PRESIZE bytes). An append of more than
 * 64 blocks takes its scratch from the metadata pool.
 *
 * Invariants (paged_check verifies them, after kv.c checked positions):
 *  - a live, not swapped sequence holds exactly the blocks its positions
 *    [first, length) touch, each USED, and no more than its window plus a
 *    block; its table has room for them (and its partial-block buffer
 *    exists when the prefix cache is on);
 *  - a USED block's ref is the number of table entries naming it; no other
 *    block is named; a FREE block is on its own slab's free stack, and the
 *    stacks hold nothing else; used + cached + free == stats.blocks_total;
 *  - the per-slab arrays hold every slot, and the prefix table (when on)
 *    at least twice their blocks.
 * Caller holds kv->lock for every member.
 */
#include "kv_internal.h"

static inline uint32_t *slab_free(const llmem_kv *kv, uint32_t i) { return &kv->slab_free[(size_t)i * kv->S]; }

/* ---- slabs and blocks ---------------------------------------------------------------- */

/* Growing each array geometrically (each keeps what it holds; one that
 * grew before another failed simply stays larger). Caller holds the lock
 * or owns kv alone. */
bool llmem__kv_slots_reserve(llmem_kv *kv, size_t want)
{
    if (want <= kv->slab_cap) return true;
    size_t most = (NONE - 1) / kv->S; /* block ids stay below NONE */
    if (want > most) return false;
    size_t ncap = kv->slab_cap ? kv->slab_cap : 8;
    while (ncap < want) ncap *= 2;
    if (ncap > most) ncap = most;
    size_t nb = ncap * kv->S, nbase, ntok;
    if (!llmem__mul_ok(ncap, kv->layers, &nbase) || !llmem__mul_ok(nb, kv->B, &ntok)) return false;
    kv_slab *sl = llmem__kv_meta_realloc(kv, kv->slabs, ncap, sizeof *sl);
    if (!sl) return false;
    kv->slabs = sl;
    void **base = llmem__kv_meta_realloc(kv, kv->slab_base, nbase, sizeof *base);
    if (!base) return false;
    kv->slab_base = base;
    uint32_t *fr = llmem__kv_meta_realloc(kv, kv->slab_free, nb, sizeof *fr);
    if (!fr) return false;
    kv->slab_free = fr;
    kv_block *bl = llmem__kv_meta_realloc(kv, kv->blocks, nb, sizeof *bl);
    if (!bl) return false;
    kv->blocks = bl;
    if (kv->prefix) {
        int32_t *t = llmem__kv_meta_realloc(kv, kv->btokens, ntok, sizeof *t);
        if (!t) return false;
        kv->btokens = t;
        size_t hcap = llmem__next_pow2(2 * nb);
        if (hcap < 64) hcap = 64;
        if (hcap > kv->ht_cap && !llmem__kv_ht_resize(kv, hcap)) return false;
    }
    kv->slab_cap = (uint32_t)ncap;
    return true;
}

/* Map a slab for every layer into slot i. */
static llmem_status slab_add(llmem_kv *kv, uint32_t i)
{
    size_t bytes = (size_t)kv->S * kv->block_bytes;
    kv_slab *sl = &kv->slabs[i];
    void **base = llmem__kv_slab_base(kv, i);
    for (uint32_t l = 0; l < kv->layers; l++) {
        base[l] = llmem_pool_alloc_aligned(kv->pool, bytes, kv->host ? 64 : LLMEM_DEVICE_ALIGN, NULL);
        if (!base[l]) {
            llmem_status st = llmem_error_status();
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
    llmem__kv_note_reserved(kv, (int64_t)(bytes * kv->layers));
    return LLMEM_OK;
}

static void slab_remove(llmem_kv *kv, uint32_t i)
{
    kv_slab *sl = &kv->slabs[i];
    void **base = llmem__kv_slab_base(kv, i);
    for (uint32_t l = 0; l < kv->layers; l++) {
        llmem_pool_free(kv->pool, base[l]);
        base[l] = NULL;
    }
    sl->live = false;
    sl->nfree = 0;
    for (uint32_t k = 0; k < kv->S; k++) kv->blocks[i * kv->S + k].state = B_ABSENT;
    kv->st.blocks_total -= kv->S;
    kv->st.shrinks_total++;
    llmem__kv_note_reserved(kv, -(int64_t)((size_t)kv->S * kv->block_bytes * kv->layers));
}

/* One more slab, reusing an absent slot or adding one; *slab gets its index. */
static llmem_status grow(llmem_kv *kv, uint32_t *slab)
{
    size_t bytes = (size_t)kv->S * kv->block_bytes * kv->layers;
    if (!llmem__kv_budget_allows(kv, bytes))
        return llmem__fail(LLMEM_ENOMEM, "kv '%s': another slab (%zu bytes) would pass the budget (%llu of %zu held)",
                           kv->name, bytes, (unsigned long long)kv->st.bytes_reserved, kv->budget);
    uint32_t i = 0;
    while (i < kv->nslabs && kv->slabs[i].live) i++;
    if (i == kv->nslabs) {
        if ((uint64_t)(kv->nslabs + 1) * kv->S > NONE - 1)
            return llmem__fail(LLMEM_ENOMEM, "kv '%s': block ids exhausted", kv->name);
        if (!llmem__kv_slots_reserve(kv, (size_t)kv->nslabs + 1))
            return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory for slab metadata", kv->name);
        kv->slabs[kv->nslabs] = (kv_slab){0, false};
        memset(llmem__kv_slab_base(kv, kv->nslabs), 0, kv->layers * sizeof *kv->slab_base);
        for (uint32_t k = 0; k < kv->S; k++) /* every field: check() and stats read absent blocks too */
            kv->blocks[(size_t)kv->nslabs * kv->S + k] = (kv_block){0, B_ABSENT, false, 0, NONE, NONE, 0, 0};
        kv->nslabs++;
    }
    *slab = i;
    return slab_add(kv, i);
}

/* Placement gives each sequence slabs of its own, so that its slabs are
 * wholly free when it ends and go back to the pool: first the slab `hint`
 * (the one holding the sequence's previous block), else a new slab, and
 * only when no new slab can be had the fullest slab with a free block
 * (filling the tails of other sequences' slabs), then the least recently
 * used cached block. Filling tails first instead left 3.5% of the replay's
 * KV memory in holes. The block comes back USED, ref 1, fill 0. */
llmem_status llmem__kv_block_take(llmem_kv *kv, uint32_t hint, uint32_t *out)
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
        llmem__assert(*out / kv->S == pick && kv->blocks[*out].state == B_FREE); /* a FREE block on its slab's stack */
        goto got;
    }
    if (kv->lru_head != NONE) { /* memory is needed: evict the least recently used cached block */
        uint32_t b = kv->lru_head;
        llmem__assert(kv->blocks[b].state == B_CACHED && kv->blocks[b].ref == 0 && kv->blocks[b].hashed);
        llmem__kv_lru_remove(kv, b);
        llmem__kv_ht_remove(kv, b);
        kv->st.evictions_total++;
        *out = b;
        goto got;
    }
    return llmem_error_status() == LLMEM_ENOMEM ? LLMEM_ENOMEM
                                               : llmem__fail(LLMEM_ENOMEM, "kv '%s': no block left", kv->name);
got:
    kv->blocks[*out] = (kv_block){1, B_USED, false, 0, NONE, NONE, 0, 0};
    return LLMEM_OK;
}

/* So that an append that cannot succeed fails before it evicts anything.
 * Growth past the budget's room is left to the pool to refuse. */
bool llmem__kv_blocks_available(const llmem_kv *kv, size_t n)
{
    size_t have = kv->lru_count;
    for (uint32_t i = 0; i < kv->nslabs && have < n; i++)
        if (kv->slabs[i].live) have += kv->slabs[i].nfree;
    if (have >= n || !kv->budget) return true;
    size_t slab = (size_t)kv->S * kv->block_bytes * kv->layers;
    size_t room = kv->budget > kv->st.bytes_reserved ? kv->budget - (size_t)kv->st.bytes_reserved : 0;
    return have + room / slab * kv->S >= n;
}

void llmem__kv_block_put(llmem_kv *kv, uint32_t b)
{
    kv_block *x = &kv->blocks[b];
    llmem__assert(x->state == B_USED && x->ref > 0); /* a put matches a take or a share */
    if (--x->ref) return;
    if (x->hashed) {
        x->state = B_CACHED;
        llmem__kv_lru_push(kv, b);
        return;
    }
    x->state = B_FREE;
    uint32_t si = b / kv->S;
    kv_slab *sl = &kv->slabs[si];
    llmem__assert(sl->live && sl->nfree < kv->S);
    slab_free(kv, si)[sl->nfree++] = b;
    /* A wholly free slab goes back to the pool at once: the pool, not the
     * manager, keeps memory for the next growth (its superblocks stay until
     * its purge policy returns them), so freed KV memory is free for
     * activations too. Keeping a spare slab here cost 0.3-0.7 points of
     * utilisation in the replay and saved nothing measurable. */
    if (sl->nfree == kv->S) slab_remove(kv, si);
}

/* Copy the first n tokens of block src into dst, every layer, K and V. */
static llmem_status block_copy(llmem_kv *kv, uint32_t dst, uint32_t src, size_t n)
{
    for (uint32_t l = 0; l < kv->layers; l++) {
        char *d = llmem__kv_block_k(kv, l, dst), *s = llmem__kv_block_k(kv, l, src);
        llmem_status st = llmem__kv_copy(kv, d, s, n * kv->token_bytes);
        if (!st)
            st = llmem__kv_copy(kv, d + (size_t)kv->B * kv->token_bytes, s + (size_t)kv->B * kv->token_bytes,
                                n * kv->token_bytes);
        if (st) return st;
    }
    return LLMEM_OK;
}

/* Growing geometrically. Sequences are created with room for all they can
 * hold (paged_seq_init), so this grows only tables capped at
 * KV_TABLE_PREALLOC, a window's prefix match, and a fork of such a table. */
bool llmem__kv_seq_reserve(llmem_kv *kv, kv_seq *s, size_t n)
{
    if (s->cap >= n) return true;
    size_t ncap = s->cap ? s->cap * 2 : 16;
    while (ncap < n) {
        if (ncap > SIZE_MAX / 2) return false;
        ncap *= 2;
    }
    uint32_t *nb = llmem__kv_meta_realloc(kv, s->blocks, ncap, sizeof *nb);
    if (!nb) return false;
    s->blocks = nb;
    s->cap = ncap;
    return true;
}

/* Newest first: cached blocks then reach the LRU list tail first, so the
 * end of a prefix is evicted before its start (a chain whose first block
 * went can never be matched again). */
void llmem__kv_seq_drop_blocks(llmem_kv *kv, kv_seq *s)
{
    while (s->nblocks) llmem__kv_block_put(kv, s->blocks[--s->nblocks]);
}

/* ---- append ----------------------------------------------------------------------------- */

/* A window keeps window/B + 1 blocks, so the last window_tokens tokens are
 * always held. */
size_t llmem__kv_window_keep_from(const llmem_kv *kv, const kv_seq *s, size_t length)
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

/* Give back the k blocks taken for an append that did not happen. */
static void give_back(llmem_kv *kv, uint32_t *fresh, size_t k, const uint32_t *got)
{
    while (k) llmem__kv_block_put(kv, fresh[--k]);
    if (fresh != got) llmem__kv_meta_free(kv, fresh);
}

#if LLMEM_DEBUG >= 2
/* Every block s names is USED and referenced (level-2 asserts: O(blocks)). */
static bool seq_blocks_used(const llmem_kv *kv, const kv_seq *s)
{
    for (size_t i = 0; i < s->nblocks; i++)
        if (kv->blocks[s->blocks[i]].state != B_USED || kv->blocks[s->blocks[i]].ref == 0) return false;
    return true;
}
#endif

static llmem_status paged_append(llmem_kv *kv, kv_seq *s, size_t n, const int32_t *tokens)
{
    size_t B = kv->B;
    if (!s->window && s->length + n > kv->max_len)
        return llmem__fail(LLMEM_ERANGE, "kv '%s': %zu more tokens pass max_seq_len %u (sequence holds %zu)",
                           kv->name, n, kv->max_len, s->length);
    bool hashing = tokens && kv->prefix && s->hashable;
    bool cow;
    size_t need = plan_append(kv, s, n, &cow);
    size_t keep_from = llmem__kv_window_keep_from(kv, s, s->length + n);
    uint32_t got[64], *fresh = need <= 64 ? got : llmem__kv_meta_alloc(kv, need, sizeof *fresh);
    if (!fresh) return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory", kv->name);
    size_t k = 0;
    llmem_status st = LLMEM_OK;
    if (!llmem__kv_blocks_available(kv, need))
        st = llmem__fail(LLMEM_ENOMEM, "kv '%s': %zu tokens need %zu more blocks, fewer can be had (budget %zu)",
                         kv->name, n, need, kv->budget);
    uint32_t hint = s->nblocks ? s->blocks[s->nblocks - 1] / kv->S : NONE;
    while (!st && k < need && !(st = llmem__kv_block_take(kv, hint, &fresh[k]))) hint = fresh[k++] / kv->S;
    /* The table's most entries during the append (a window keeps window/B + 1
     * blocks), plus one: within what the sequence was created with, except
     * for tables capped at KV_TABLE_PREALLOC. */
    size_t most = s->nblocks + new_block_positions(kv, s->length, n);
    if (s->window && most > s->window / B + 1) most = s->window / B + 1;
    if (!st && !llmem__kv_seq_reserve(kv, s, most + 1))
        st = llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory for a block table", kv->name);
    if (st) { /* nothing changed yet: give the blocks back */
        give_back(kv, fresh, k, got);
        if (st == LLMEM_ENOMEM) kv->st.preemptions_total++;
        return st;
    }
    size_t used = 0;
    if (cow) { /* the shared partial last block is copied before it is written */
        uint32_t old = s->blocks[s->nblocks - 1], nb = fresh[used++];
        size_t fill = s->length % B;
        st = block_copy(kv, nb, old, fill);
        if (st) {
            give_back(kv, fresh, k, got);
            return st;
        }
        s->blocks[s->nblocks - 1] = nb;
        llmem__kv_block_put(kv, old);
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
                    llmem__kv_block_put(kv, old);
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
            if (pos % B == B - 1) llmem__kv_register_block(kv, s, b, pos / B >= keep_from);
        }
        s->length++;
    }
    if (!tokens) s->hashable = false;
    while (used < need) llmem__kv_block_put(kv, fresh[used++]); /* recycled more than planned */
    if (fresh != got) llmem__kv_meta_free(kv, fresh);
    llmem__assert(used <= k && s->nblocks == (s->length + B - 1) / B - s->first / B);
    llmem__assert_expensive(seq_blocks_used(kv, s));
    return LLMEM_OK;
}

/* ---- the other members ---------------------------------------------------------------- */

/* Blocks per slab, the least budget, and the per-slab arrays presized for
 * the budget's slabs (up to KV_META_PRESIZE bytes), so no append grows
 * them. */
static llmem_status paged_init(llmem_kv *kv, const llmem_kv_options *o, const char *name)
{
    /* Default: two blocks, at least 64 KiB. About half a slab per running
     * sequence sits empty, so small slabs keep utilisation high (98% in
     * the replay, against 88% for 16 blocks); the pool beneath carves
     * them out of its superblocks, host or device, in a microsecond. */
    size_t block_bytes = kv->block_bytes;
    size_t slab = o->slab_bytes ? o->slab_bytes : 2 * block_bytes;
    if (!o->slab_bytes && slab < ((size_t)64 << 10)) slab = (size_t)64 << 10;
    size_t S = slab / block_bytes;
    kv->S = (uint32_t)(S < 1 ? 1 : S > 65536 ? 65536 : S);
    size_t slab_all = (size_t)kv->S * block_bytes * kv->layers;
    /* A budget below one slab could never hold a token: refuse it here,
     * naming the minimum, rather than failing every append. */
    if (kv->budget && kv->budget < slab_all)
        return llmem__fail(LLMEM_EINVAL,
                           "kv '%s': budget_bytes %zu is below one slab, the least a PAGED cache holds: %zu bytes "
                           "(%u blocks of %u tokens, %zu bytes a block, x %u layers); give at least %zu or a "
                           "smaller slab_bytes",
                           name, kv->budget, slab_all, kv->S, kv->B, block_bytes, kv->layers, slab_all);
    if (kv->budget >= slab_all) {
        size_t per_slot = sizeof(kv_slab) + (size_t)kv->layers * sizeof(void *) +
                          (size_t)kv->S * (sizeof(uint32_t) + sizeof(kv_block) +
                                           (kv->prefix ? (size_t)kv->B * sizeof(int32_t) + 4 * 12 : 0));
        size_t slots = kv->budget / slab_all, most = KV_META_PRESIZE / per_slot;
        if (slots > most) slots = most;
        if (slots && !llmem__kv_slots_reserve(kv, slots))
            return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory for slab metadata", name);
    }
    return LLMEM_OK;
}

/* Swap regions go back to the swap resource, slabs to the pool; the
 * tables go with the metadata pool. */
static void paged_destroy(llmem_kv *kv)
{
    for (uint32_t i = 0; i < kv->nseqs; i++) {
        kv_seq *s = &kv->seqs[i];
        if (s->live && s->swap) llmem_resource_unmap(kv->swap_res, s->swap, s->swap_map, s->swap_map);
    }
    for (uint32_t i = 0; i < kv->nslabs; i++)
        if (kv->slabs[i].live) slab_remove(kv, i);
}

/* A block table with room for all the sequence can hold, plus one
 * (ceil(max_seq_len / B) + 1 entries, or window/B + 2 with a window; at
 * most KV_TABLE_PREALLOC, past which llmem__kv_seq_reserve grows it), and
 * its partial-block tokens when the prefix cache is on, so that appends
 * take no metadata. LLMEM_ENOMEM when host memory is short. */
static llmem_status paged_seq_init(llmem_kv *kv, kv_seq *s)
{
    size_t n = s->window ? s->window / kv->B + 2 : ((size_t)kv->max_len + kv->B - 1) / kv->B + 1;
    if (n > KV_TABLE_PREALLOC) n = KV_TABLE_PREALLOC;
    s->blocks = llmem__kv_meta_alloc(kv, n, sizeof *s->blocks);
    if (!s->blocks) return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory for a block table", kv->name);
    s->cap = n;
    if (kv->prefix && !(s->partial = llmem__kv_meta_alloc(kv, kv->B, sizeof *s->partial)))
        return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory", kv->name);
    return LLMEM_OK;
}

static void paged_seq_fini(llmem_kv *kv, kv_seq *s)
{
    if (s->swapped) llmem__kv_swap_release(kv, s);
    llmem__kv_seq_drop_blocks(kv, s);
}

/* The child shares every block (one more reference each); a shared
 * partial last block is copied on the next write to it. */
static llmem_status paged_fork(llmem_kv *kv, kv_seq *c, const kv_seq *p)
{
    llmem_status st = paged_seq_init(kv, c);
    if (!st && !llmem__kv_seq_reserve(kv, c, p->nblocks)) /* the parent's table grew past KV_TABLE_PREALLOC */
        st = llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory for a block table", kv->name);
    if (st) return st;
    if (p->nblocks) memcpy(c->blocks, p->blocks, p->nblocks * sizeof *c->blocks);
    for (size_t i = 0; i < p->nblocks; i++) kv->blocks[p->blocks[i]].ref++;
    c->nblocks = p->nblocks;
    if (p->partial) memcpy(c->partial, p->partial, kv->B * sizeof *c->partial);
    return LLMEM_OK;
}

static void paged_truncate(llmem_kv *kv, kv_seq *s, size_t len, bool forget)
{
    size_t keep = len > s->first ? (len - 1) / kv->B - s->first / kv->B + 1 : 0;
    /* forget (a rollback): a dropped block that this sequence alone holds
     * leaves the prefix cache too - the append being undone may have
     * registered it before anyone wrote it. */
    while (s->nblocks > keep) {
        uint32_t b = s->blocks[--s->nblocks];
        if (forget && kv->blocks[b].ref == 1 && kv->blocks[b].hashed) llmem__kv_ht_remove(kv, b);
        llmem__kv_block_put(kv, b);
    }
    /* ...and so does a kept last block left partial that the undone
     * append filled: it was registered full. */
    if (forget && len % kv->B && s->nblocks) {
        uint32_t b = s->blocks[s->nblocks - 1];
        if (kv->blocks[b].ref == 1 && kv->blocks[b].hashed) llmem__kv_ht_remove(kv, b);
    }
}

static char *paged_block_base(const llmem_kv *kv, const kv_seq *s, uint32_t layer, size_t pos)
{
    /* s holds exactly the blocks its positions [first, length) touch. */
    llmem__assert(pos >= s->first && pos < s->length && pos / kv->B - s->first / kv->B < s->nblocks);
    return llmem__kv_block_k(kv, layer, s->blocks[pos / kv->B - s->first / kv->B]);
}

static void paged_seq_info(const llmem_kv *kv, const kv_seq *s, llmem_kv_seq_info *out)
{
    out->blocks = s->nblocks;
    out->capacity = s->swapped ? 0 : s->first / kv->B * kv->B + s->nblocks * kv->B;
}

static void paged_room(const llmem_kv *kv, llmem_kv_room *r)
{
    for (uint32_t i = 0; i < kv->nslabs; i++)
        if (kv->slabs[i].live) r->free_blocks += kv->slabs[i].nfree;
    r->cached_blocks = kv->lru_count;
    size_t total = 0;
    for (uint32_t i = 0; i < kv->nslabs; i++)
        if (kv->slabs[i].live) total += kv->S;
    r->used_blocks = total - r->free_blocks - r->cached_blocks;
}

/* evict_cached: every cached block leaves the prefix cache and turns free;
 * then every wholly free slab goes back to the pool. */
static void paged_trim(llmem_kv *kv, bool evict_cached)
{
    if (evict_cached) {
        while (kv->lru_head != NONE) {
            uint32_t b = kv->lru_head;
            llmem__kv_lru_remove(kv, b);
            llmem__kv_ht_remove(kv, b);
            kv->blocks[b].ref = 1; /* block_put turns it FREE */
            kv->blocks[b].state = B_USED;
            llmem__kv_block_put(kv, b);
            kv->st.evictions_total++;
        }
    }
    for (uint32_t i = 0; i < kv->nslabs; i++)
        if (kv->slabs[i].live && kv->slabs[i].nfree == kv->S) slab_remove(kv, i);
}

#define BAD(...)                                       \
    do {                                               \
        st = llmem__fail(LLMEM_ECORRUPT, __VA_ARGS__); \
        goto done;                                     \
    } while (0)

/* The sequences' tables against the blocks (refs counted in scratch from
 * the metadata pool), then the blocks, the LRU list and the free stacks. */
static llmem_status paged_check(llmem_kv *kv)
{
    llmem_status st = LLMEM_OK;
    size_t nb = (size_t)kv->nslabs * kv->S;
    uint32_t *refs = nb ? llmem__kv_meta_alloc(kv, nb, sizeof *refs) : NULL;
    if (nb && !refs) /* not a violation: say so, the caller may try again */
        return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of memory for the check", kv->name);
    if (nb) memset(refs, 0, nb * sizeof *refs);
    uint64_t nswapped = 0, swap_held = 0;
    for (uint32_t i = 0; i < kv->nseqs; i++) {
        kv_seq *s = &kv->seqs[i];
        if (!s->live) continue;
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
        if (x->hashed && llmem__kv_ht_find(kv, x->hash, x->parent, &kv->btokens[b * kv->B]) != b)
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
    llmem__kv_meta_free(kv, refs);
    return st;
}

#undef BAD

/* A block's fill: the most positions any holder has in it (a holder that
 * truncated, or dropped out of a shared block, holds fewer). */
static void paged_stats(llmem_kv *kv, llmem_kv_stats *s, uint64_t *written)
{
    size_t nb = (size_t)kv->nslabs * kv->S;
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
            s->blocks_used++;
            *written += x->fill;
        } else if (x->state == B_CACHED) {
            s->blocks_cached++;
        } else if (x->state == B_FREE) {
            s->blocks_free++;
        }
    }
}

static const llmem__kv_ops paged_ops = {
    .name         = "paged",
    .windows      = true,
    .init         = paged_init,
    .destroy      = paged_destroy,
    .seq_init     = paged_seq_init,
    .seq_fini     = paged_seq_fini,
    .fork         = paged_fork,
    .append       = paged_append,
    .truncate     = paged_truncate,
    .block_base   = paged_block_base,
    .seq_info     = paged_seq_info,
    .room         = paged_room,
    .trim         = paged_trim,
    .check        = paged_check,
    .stats        = paged_stats,
    .swap_out     = llmem__kv_swap_out,
    .swap_in      = llmem__kv_swap_in,
    .match_prefix = llmem__kv_prefix_match,
};

const llmem__kv_ops *llmem__kv_paged_ops(void) { return &paged_ops; }
