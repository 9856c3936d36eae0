/*
 * kv_swap.c - PAGED offload: a sequence's blocks out to host swap memory
 * and back.
 *
 * Algorithm. A swapped-out sequence keeps its slot, length, window, chain
 * hash and partial-block tokens, but holds no block (nblocks 0): its
 * blocks' bytes sit in one region mapped from the swap resource for it,
 * laid out [layer][table index][block_bytes], and swap_nblocks says how
 * many to take back. Swap-out copies, then drops its blocks as a free
 * does (shared blocks lose a reference, registered ones stay cached);
 * swap-in takes fresh blocks exactly as an append would (checked with
 * llmem__kv_blocks_available first), copies back, then unmaps. Its block
 * table keeps its capacity, so swap-in needs no metadata. One mapping per
 * swapped sequence, not a pool over the swap resource: swaps are rare next
 * to appends, the region is returned whole, and swap_bytes_held is then
 * exactly what the swap resource holds for the manager.
 *
 * Invariants (llmem_kv_check verifies them): a swapped sequence holds no
 * block, swap_nblocks blocks' worth of its positions, and a region iff it
 * has any; stats.swapped_sequences and swap_bytes_held are the count and
 * the sum of swap_map over swapped sequences; swap_bytes_held never passes
 * swap_budget when there is one.
 * Caller holds kv->lock; swap copies run under it.
 */
#include "kv_internal.h"

void llmem__kv_swap_release(llmem_kv *kv, kv_seq *s)
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
            char *d = llmem__kv_block_k(kv, l, ids[i]);
            st = to_swap ? llmem__kv_copy(kv, h + i * bb, d, (j - i) * bb)
                         : llmem__kv_copy(kv, d, h + i * bb, (j - i) * bb);
        }
    }
    kv->st.swap_seconds_total += (double)(llmem__now_ns() - t0) * 1e-9;
    return st;
}

llmem_status llmem__kv_swap_out(llmem_kv *kv, kv_seq *s)
{
    if (s->swapped) return llmem__fail(LLMEM_ESTATE, "kv '%s': sequence already swapped out", kv->name);
    size_t n = s->nblocks, bytes = 0, mapped = 0;
    void *region = NULL;
    llmem_status st;
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
    llmem__kv_seq_drop_blocks(kv, s); /* as a free: shared blocks lose a reference, registered ones stay cached */
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

llmem_status llmem__kv_swap_in(llmem_kv *kv, kv_seq *s)
{
    if (!s->swapped) return llmem__fail(LLMEM_ESTATE, "kv '%s': sequence is not swapped out", kv->name);
    size_t n = s->swap_nblocks, k = 0;
    llmem_status st = LLMEM_OK;
    /* The table kept the capacity it had when it held these blocks. */
    if (!llmem__kv_blocks_available(kv, n))
        return llmem__fail(LLMEM_ENOMEM, "kv '%s': swapping in needs %zu blocks, fewer can be had (budget %zu)",
                           kv->name, n, kv->budget);
    uint32_t hint = NONE;
    while (k < n && !(st = llmem__kv_block_take(kv, hint, &s->blocks[k]))) hint = s->blocks[k++] / kv->S;
    if (!st) st = swap_copy(kv, s->blocks, n, s->swap, false);
    if (st) {
        while (k) llmem__kv_block_put(kv, s->blocks[--k]);
        return st;
    }
    s->nblocks = n;
    kv->st.swap_in_total++;
    kv->st.bytes_swapped_in_total += (uint64_t)n * kv->block_bytes * kv->layers;
    llmem__kv_swap_release(kv, s);
    return LLMEM_OK;
}
