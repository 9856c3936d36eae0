/*
 * kv_prefix.c - the PAGED prefix cache: chain hashes, the hash table of
 * registered blocks, the LRU list of cached ones, and prefix matching.
 *
 * Algorithm. A full block is registered under the hash of every token up
 * to and including it (a chain: the previous block's hash mixed with this
 * block's tokens, hash_block); the block keeps its tokens (kv->btokens)
 * and its parent's hash, so a lookup compares them exactly and a hash
 * collision cannot hand out the wrong data. Open addressing, linear
 * probing, backward-shift deletion (no tombstones). A registered block
 * that no sequence holds any more is CACHED: ref 0, on the LRU list, and
 * the first thing block_take evicts when memory is needed.
 *
 * Invariants (llmem_kv_check verifies them):
 *  - a block is in the table iff its `hashed` flag is set, and ht_find
 *    of its hash, parent and tokens finds it;
 *  - the table has at least twice as many slots as there are block ids
 *    (llmem__kv_slots_reserve sizes it), so an insert never grows it and
 *    probes stay short;
 *  - the LRU list holds exactly the CACHED blocks (lru_count of them),
 *    oldest first; a CACHED block is hashed and has ref 0.
 * Caller holds kv->lock for everything here.
 */
#include "hash.h"
#include "kv_internal.h"

uint64_t llmem__kv_hash_block(uint64_t parent, const int32_t *t, uint32_t n)
{
    uint64_t h = llmem__fmix64(parent ^ 0x6b76636163686521ull);
    for (uint32_t i = 0; i < n; i++)
        h = llmem__fmix64(h ^ ((uint64_t)(uint32_t)t[i] + 0x9e3779b97f4a7c15ull * (i + 1)));
    return h ? h : 1;
}

/* ---- the LRU list of cached blocks ------------------------------------------------ */

void llmem__kv_lru_remove(llmem_kv *kv, uint32_t b)
{
    kv_block *x = &kv->blocks[b];
    llmem__assert(kv->lru_count > 0 && x->state == B_CACHED);
    if (x->lru_prev != NONE) kv->blocks[x->lru_prev].lru_next = x->lru_next;
    else kv->lru_head = x->lru_next;
    if (x->lru_next != NONE) kv->blocks[x->lru_next].lru_prev = x->lru_prev;
    else kv->lru_tail = x->lru_prev;
    x->lru_prev = x->lru_next = NONE;
    kv->lru_count--;
}

void llmem__kv_lru_push(llmem_kv *kv, uint32_t b)
{
    kv_block *x = &kv->blocks[b];
    llmem__assert(x->ref == 0 && x->hashed); /* the LRU list holds exactly the CACHED blocks */
    x->lru_next = NONE;
    x->lru_prev = kv->lru_tail;
    if (kv->lru_tail != NONE) kv->blocks[kv->lru_tail].lru_next = b;
    else kv->lru_head = b;
    kv->lru_tail = b;
    kv->lru_count++;
}

/* ---- the table ---------------------------------------------------------------------- */

static size_t ht_slot(const llmem_kv *kv, uint64_t h) { return (size_t)llmem__fmix64(h) & (kv->ht_cap - 1); }

uint32_t llmem__kv_ht_find(const llmem_kv *kv, uint64_t h, uint64_t parent, const int32_t *tokens)
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

/* ncap: a power of two above twice the count. */
bool llmem__kv_ht_resize(llmem_kv *kv, size_t ncap)
{
    uint64_t *nh = llmem__kv_meta_alloc(kv, ncap, sizeof *nh);
    uint32_t *nb = llmem__kv_meta_alloc(kv, ncap, sizeof *nb);
    if (!nh || !nb) {
        llmem__kv_meta_free(kv, nh);
        llmem__kv_meta_free(kv, nb);
        return false;
    }
    for (size_t i = 0; i < ncap; i++) nb[i] = NONE;
    for (size_t i = 0; i < kv->ht_cap; i++) {
        if (kv->ht_block[i] == NONE) continue;
        size_t j = (size_t)llmem__fmix64(kv->ht_hash[i]) & (ncap - 1);
        while (nb[j] != NONE) j = (j + 1) & (ncap - 1);
        nh[j] = kv->ht_hash[i];
        nb[j] = kv->ht_block[i];
    }
    llmem__kv_meta_free(kv, kv->ht_hash);
    llmem__kv_meta_free(kv, kv->ht_block);
    kv->ht_hash = nh;
    kv->ht_block = nb;
    kv->ht_cap = ncap;
    return true;
}

/* Register block b (hash and parent set). The table has at least twice as
 * many slots as there are blocks (llmem__kv_slots_reserve), so it never
 * grows here; the check stays as a guard. */
static void ht_insert(llmem_kv *kv, uint32_t b)
{
    if ((kv->ht_count + 1) * 2 > kv->ht_cap && !llmem__kv_ht_resize(kv, kv->ht_cap ? kv->ht_cap * 2 : 64))
        return; /* no room: simply not cached */
    llmem__assert(!kv->blocks[b].hashed && (kv->ht_count + 1) * 2 <= kv->ht_cap);
    size_t i = ht_slot(kv, kv->blocks[b].hash);
    while (kv->ht_block[i] != NONE) i = (i + 1) & (kv->ht_cap - 1);
    kv->ht_hash[i] = kv->blocks[b].hash;
    kv->ht_block[i] = b;
    kv->ht_count++;
    kv->blocks[b].hashed = true;
}

void llmem__kv_ht_remove(llmem_kv *kv, uint32_t b)
{
    llmem__assert(kv->blocks[b].hashed && kv->ht_count > 0); /* in the table iff hashed */
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

/* ---- registering and matching ------------------------------------------------------- */

/* `keep`: the sequence still holds b when the append returns, so the
 * engine writes it; a block dropped again within the append is never
 * registered. */
void llmem__kv_register_block(llmem_kv *kv, kv_seq *s, uint32_t b, bool keep)
{
    uint64_t h = llmem__kv_hash_block(s->chain, s->partial, kv->B);
    if (keep && llmem__kv_ht_find(kv, h, s->chain, s->partial) == NONE && !kv->blocks[b].hashed) {
        kv->blocks[b].hash = h;
        kv->blocks[b].parent = s->chain;
        memcpy(&kv->btokens[(size_t)b * kv->B], s->partial, kv->B * sizeof *s->partial);
        ht_insert(kv, b);
    }
    s->chain = h;
}

/* s is empty and not swapped (kv.c checked). Takes a reference on every
 * full block of the prompt found in the chain, up to what the sequence
 * may hold; a window sequence then keeps only its last window/B + 1. */
llmem_status llmem__kv_prefix_match(llmem_kv *kv, kv_seq *s, const int32_t *tokens, size_t n, size_t *matched)
{
    size_t full = n / kv->B, k = 0;
    if (!s->window && full > kv->max_len / kv->B) full = kv->max_len / kv->B; /* no more than it may hold */
    uint64_t chain = 0;
    if (full && !llmem__kv_seq_reserve(kv, s, full))
        return llmem__fail(LLMEM_ENOMEM, "kv '%s': out of host memory", kv->name);
    for (; k < full; k++) {
        const int32_t *t = tokens + k * kv->B;
        uint64_t hsh = llmem__kv_hash_block(chain, t, kv->B);
        uint32_t b = llmem__kv_ht_find(kv, hsh, chain, t);
        if (b == NONE) break;
        kv_block *x = &kv->blocks[b];
        if (x->state == B_CACHED) {
            llmem__kv_lru_remove(kv, b);
            x->state = B_USED;
        }
        x->ref++;
        s->blocks[s->nblocks++] = b;
        chain = hsh;
    }
    s->chain = chain;
    s->length = k * kv->B;
    size_t keep = llmem__kv_window_keep_from(kv, s, s->length); /* a window holds its last window/B + 1 blocks */
    if (keep) {
        for (size_t i = keep; i-- > 0;) llmem__kv_block_put(kv, s->blocks[i]);
        memmove(s->blocks, s->blocks + keep, (s->nblocks - keep) * sizeof *s->blocks);
        s->nblocks -= keep;
        s->first = keep * kv->B;
    }
    *matched = s->length;
    kv->st.prefix_hit_tokens_total += s->length;
    kv->st.prefix_miss_tokens_total += n - s->length;
    return LLMEM_OK;
}
