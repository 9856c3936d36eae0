/*
 * planner.c - greedy-by-size offset assignment for a forward pass's
 * temporaries (see llmem/planner.h).
 *
 * Order: tensors by aligned size, largest first (ties: earlier first use,
 * then lower index, so an in-place input of equal size is placed before
 * its output). Each tensor goes to the smallest gap, between the tensors
 * already placed that are alive at the same time, that holds it; else
 * after the last of them. Placing big tensors first leaves small ones to
 * fill the holes, which is what brings the plan near the lower bound on
 * the layer graphs of a transformer (a few large FFN buffers, many small
 * ones). An in-place output first tries its input's offset.
 *
 * Invariant (llmem_plan_check): tensors alive together never overlap,
 * except an in-place output sitting exactly on its input.
 *
 * Scratch: the order (n indices) and the list of live placed tensors
 * (n indices); an unplaced tensor has offset SIZE_MAX while planning.
 * Sorting is insertion sort: n is a few dozen, and qsort may allocate.
 */
#include <stdbool.h>
#include <string.h>

#include "internal.h"
#include "llmem/planner.h"

#define UNPLACED SIZE_MAX

size_t llmem_plan_scratch_bytes(size_t n) { return 2 * n * sizeof(uint32_t) + 1; }

static bool alive_together(const llmem_plan_tensor *a, const llmem_plan_tensor *b)
{
    return a->first <= b->last && b->first <= a->last;
}

static bool inplace_pair(const llmem_plan_tensor *t, size_t a, size_t b)
{
    return t[a].inplace_of == (int32_t)b || t[b].inplace_of == (int32_t)a;
}

static llmem_status validate(const llmem_plan_tensor *t, size_t n, size_t align, size_t *sz)
{
    for (size_t i = 0; i < n; i++) {
        if (t[i].last < t[i].first)
            return llmem__fail(LLMEM_EINVAL, "plan: tensor %zu (%s) is last used (%u) before it is written (%u)", i,
                               t[i].name ? t[i].name : "?", t[i].last, t[i].first);
        if (t[i].inplace_of >= 0) {
            size_t j = (size_t)t[i].inplace_of;
            if (j >= n || j == i || t[j].last != t[i].first)
                return llmem__fail(LLMEM_EINVAL,
                                   "plan: tensor %zu (%s) is in place of tensor %d, which does not end where it begins",
                                   i, t[i].name ? t[i].name : "?", t[i].inplace_of);
        }
        if (t[i].bytes > SIZE_MAX - align)
            return llmem__fail(LLMEM_EOVERFLOW, "plan: tensor %zu has %zu bytes", i, t[i].bytes);
        if (sz) sz[i] = (t[i].bytes + align - 1) & ~(align - 1);
    }
    return LLMEM_OK;
}

static inline size_t asize(const llmem_plan_tensor *t, size_t i, size_t align)
{
    return (t[i].bytes + align - 1) & ~(align - 1);
}

/* Does [off, off + size) collide with a placed tensor alive with k (other
 * than `except`)? */
static bool collides(const llmem_plan_tensor *t, size_t n, size_t align, size_t k, size_t except, size_t off,
                     size_t size)
{
    for (size_t p = 0; p < n; p++) {
        if (p == k || p == except || t[p].offset == UNPLACED || !t[p].bytes) continue;
        if (!alive_together(&t[p], &t[k])) continue;
        size_t ps = asize(t, p, align);
        if (t[p].offset < off + size && off < t[p].offset + ps) return true;
    }
    return false;
}

llmem_status llmem_plan(llmem_plan_tensor *t, size_t n, size_t align, void *scratch, size_t scratch_bytes,
                        llmem_plan_result *out)
{
    if (!out || (n && !t)) return llmem__fail(LLMEM_EINVAL, "plan: null argument");
    if (!align) align = 64;
    if (align & (align - 1)) return llmem__fail(LLMEM_EALIGN, "plan: alignment %zu is not a power of two", align);
    if (n > UINT32_MAX / 2) return llmem__fail(LLMEM_EINVAL, "plan: %zu tensors", n);
    if (n && (!scratch || scratch_bytes < llmem_plan_scratch_bytes(n)))
        return llmem__fail(LLMEM_ERANGE, "plan: %zu bytes of scratch, %zu needed for %zu tensors", scratch_bytes,
                           llmem_plan_scratch_bytes(n), n);
    llmem_status st = validate(t, n, align, NULL);
    if (st) return st;
    memset(out, 0, sizeof *out);
    uint32_t *order = scratch, *live = order + n;

    /* Naive size and the order. */
    for (size_t i = 0; i < n; i++) {
        size_t s = asize(t, i, align);
        if (out->naive_bytes > SIZE_MAX - s) return llmem__fail(LLMEM_EOVERFLOW, "plan: sizes overflow");
        out->naive_bytes += s;
        t[i].offset = UNPLACED;
        /* insertion: larger first, then earlier first use, then index */
        size_t j = i;
        while (j > 0) {
            size_t q = order[j - 1];
            size_t qs = asize(t, q, align);
            bool before = s > qs || (s == qs && (t[i].first < t[q].first || (t[i].first == t[q].first && i < q)));
            if (!before) break;
            order[j] = order[j - 1];
            j--;
        }
        order[j] = (uint32_t)i;
    }

    for (size_t o = 0; o < n; o++) {
        size_t k = order[o], size = asize(t, k, align);
        if (!size) {
            t[k].offset = 0;
            continue;
        }
        /* In place over its input, when the input is placed and as large. */
        if (t[k].inplace_of >= 0) {
            size_t j = (size_t)t[k].inplace_of;
            if (t[j].offset != UNPLACED && asize(t, j, align) >= size &&
                !collides(t, n, align, k, j, t[j].offset, size)) {
                t[k].offset = t[j].offset;
                out->inplace_reuses++;
                continue;
            }
        }
        /* The placed tensors alive with k, by offset. */
        size_t nl = 0;
        for (size_t p = 0; p < n; p++) {
            if (p == k || t[p].offset == UNPLACED || !t[p].bytes || !alive_together(&t[p], &t[k])) continue;
            size_t j = nl++;
            while (j > 0 && t[live[j - 1]].offset > t[p].offset) {
                live[j] = live[j - 1];
                j--;
            }
            live[j] = (uint32_t)p;
        }
        /* Best-fitting gap, else after them. */
        size_t end = 0, best = UNPLACED, best_gap = SIZE_MAX;
        for (size_t i = 0; i < nl; i++) {
            size_t p = live[i];
            if (t[p].offset > end) {
                size_t gap = t[p].offset - end;
                if (gap >= size && gap < best_gap) {
                    best_gap = gap;
                    best = end;
                }
            }
            size_t pe = t[p].offset + asize(t, p, align);
            if (pe > end) end = pe;
        }
        if (best == UNPLACED) {
            if (end > SIZE_MAX - size) return llmem__fail(LLMEM_EOVERFLOW, "plan: workspace overflows");
            best = end;
        }
        t[k].offset = best;
    }

    /* Peak, and the lower bound: the most bytes alive at any one
     * operation (some tensor's first), an in-place pair counted once. */
    for (size_t i = 0; i < n; i++) {
        size_t e = t[i].offset + asize(t, i, align);
        if (t[i].bytes && e > out->peak_bytes) out->peak_bytes = e;
    }
    for (size_t x = 0; x < n; x++) {
        uint32_t op = t[x].first;
        size_t sum = 0;
        for (size_t i = 0; i < n; i++)
            if (t[i].first <= op && op <= t[i].last) sum += asize(t, i, align);
        for (size_t i = 0; i < n; i++)
            if (t[i].inplace_of >= 0 && t[i].first == op) {
                size_t a = asize(t, i, align), b = asize(t, (size_t)t[i].inplace_of, align);
                sum -= a < b ? a : b;
            }
        if (sum > out->lower_bound_bytes) out->lower_bound_bytes = sum;
    }
    llmem__assert(out->lower_bound_bytes <= out->peak_bytes); /* no plan beats the live-set bound */
    LLMEM_DEBUG_WALK(llmem_plan_check(t, n, align, out->peak_bytes));
    return LLMEM_OK;
}

llmem_status llmem_plan_check(const llmem_plan_tensor *t, size_t n, size_t align, size_t peak)
{
    if (n && !t) return llmem__fail(LLMEM_EINVAL, "plan check: null tensors");
    if (!align) align = 64;
    if (align & (align - 1)) return llmem__fail(LLMEM_EALIGN, "plan check: alignment %zu", align);
    llmem_status st = validate(t, n, align, NULL);
    if (st) return st;
    for (size_t a = 0; a < n; a++) {
        if (!t[a].bytes) continue;
        size_t as = asize(t, a, align);
        if (t[a].offset % align || t[a].offset > peak || as > peak - t[a].offset)
            return llmem__fail(LLMEM_ECORRUPT, "plan check: tensor %zu at %zu (+%zu) is misaligned or past %zu", a,
                               t[a].offset, as, peak);
        for (size_t b = a + 1; b < n; b++) {
            if (!t[b].bytes || !alive_together(&t[a], &t[b])) continue;
            size_t bs = asize(t, b, align);
            if (t[a].offset < t[b].offset + bs && t[b].offset < t[a].offset + as) {
                if (inplace_pair(t, a, b) && t[a].offset == t[b].offset) continue;
                return llmem__fail(LLMEM_ECORRUPT, "plan check: tensors %zu (%s) and %zu (%s) overlap while alive", a,
                                   t[a].name ? t[a].name : "?", b, t[b].name ? t[b].name : "?");
            }
        }
    }
    return LLMEM_OK;
}
