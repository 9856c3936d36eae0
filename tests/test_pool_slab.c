/*
 * test_pool_slab.c - white box: how the dynamic pool lays out its slabs for
 * the free's fast path (src/pools/pool_slab.c, pool_internal.h
 * "slab_unit"). Every slab covers whole 64 KiB units of the address map,
 * aligned, and each unit's map entry names that slab; a slab's units go
 * back to zero when it is released; and the address just past a slab's
 * last block (its tail slack, where the slab is not a multiple of the
 * class size) is not a block: its free is refused on the fast path and the
 * locked one, and nothing past the slab's state bytes is read as a block's.
 * The exact division the free uses matches plain division everywhere, and
 * llmem_pool_check reports a wrong entry.
 */
#include "test_util.h"

#include "../src/pools/pool_internal.h"

/* The slab holding small block a of pool p. */
static slab *slab_of(llmem_pool *p, void *a)
{
    superblock *sb = llmem__addrmap_get((uintptr_t)a);
    assert_non_null(sb);
    pblock *b = sb->owner[unit_of(sb, (uintptr_t)a, p->ushift)];
    assert_non_null(b);
    assert_int_equal(b->kind, D_SLAB);
    return (slab *)b;
}

static void slabs_cover_whole_map_units(void **state)
{
    (void)state;
    llmem_pool *p;
    assert_ok(llmem_pool_create(NULL, &p));
    for (unsigned c = 0; c < p->cls.count; c++) {
        size_t size = p->cls.size[c];
        void *a = llmem_pool_alloc(p, size, NULL);
        assert_non_null(a);
        slab *s = slab_of(p, a);
        assert_int_equal(s->b.start % LLMEM_ADDRMAP_UNIT, 0);
        assert_int_equal(s->b.size % LLMEM_ADDRMAP_UNIT, 0);
        assert_int_equal(s->b.size, p->cls.slab_bytes[c]);
        for (uintptr_t u = s->b.start; u < s->b.start + s->b.size; u += LLMEM_ADDRMAP_UNIT) {
            const slab_unit *su = unit_entry(u);
            assert_ptr_equal(su->state, s->state);
            assert_int_equal(su->start, (uint32_t)s->b.start);
            assert_int_equal(su->ctag, pool_utag(p) | c);
        }
        assert_ok(llmem_pool_free(p, a));
    }
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

/* A slab that empties (and is not its class's one kept empty slab) gives its
 * units' entries back: a large block cut from the same pages later must
 * not be taken for a slab block. */
static void released_slab_clears_its_entries(void **state)
{
    (void)state;
    llmem_pool_options o = llmem_pool_options_default();
    o.checked = true; /* no thread caches: blocks go straight back to their slabs */
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    unsigned c = llmem__class_of(&p->cls, 4096);
    size_t n = 3 * p->cls.slab_blocks[c];
    void **v = calloc(n, sizeof *v);
    for (size_t i = 0; i < n; i++) assert_non_null(v[i] = llmem_pool_alloc(p, 4096, NULL));
    slab *last = slab_of(p, v[n - 1]);
    uintptr_t start = last->b.start, end = start + last->b.size;
    for (size_t i = 0; i < n; i++) assert_ok(llmem_pool_free(p, v[i]));
    /* Two of the three slabs went back; whichever units they held are all
     * zero now unless a slab (the kept one) holds them. */
    for (uintptr_t u = start; u < end; u += LLMEM_ADDRMAP_UNIT) {
        const slab_unit *su = unit_entry(u);
        superblock *sb = llmem__addrmap_get(u);
        pblock *b = sb ? sb->owner[unit_of(sb, u, p->ushift)] : NULL;
        if (b && b->kind == D_SLAB) continue;
        assert_null(su->state);
        assert_int_equal(su->ctag, 0);
    }
    assert_ok(llmem_pool_check(p));
    free(v);
    llmem_pool_destroy(p);
}

/* The tail past a slab's last block, for every class that leaves one, in a
 * pool with thread caches (the fast path, then the locked one) and a
 * checked pool (the locked path's own reading of checked blocks). The
 * state byte just past the slab's last one is set as another slab's live
 * block would leave it (arrays of one fixed pool sit end to end): the free
 * must not read it as this tail's. */
static void tail_of_a_slab_is_not_a_block(void **state)
{
    (void)state;
    for (int checked = 0; checked < 2; checked++) {
        llmem_pool_options o = llmem_pool_options_default();
        o.checked = checked;
        llmem_pool *p;
        assert_ok(llmem_pool_create(&o, &p));
        bool seen[LLMEM_MAX_CLASSES] = {false};
        unsigned tested = 0;
        for (unsigned k = 0; k < p->cls.count; k++) {
            size_t want = p->cls.size[k] > 256 ? p->cls.size[k] - 128 : p->cls.size[k];
            void *a = llmem_pool_alloc(p, want, NULL);
            assert_non_null(a);
            slab *s = slab_of(p, a);
            unsigned c = s->b.cls;
            size_t size = p->cls.size[c], nb = s->nblocks;
            /* The small state arrays only (64 bytes): there the byte past
             * the last is the array's own, which the test may write. */
            if (seen[c] || s->b.size == nb * size || nb >= 64) {
                assert_ok(llmem_pool_free(p, a));
                continue;
            }
            seen[c] = true;
            uintptr_t tail = s->b.start + nb * size;
            assert_true(tail < s->b.start + s->b.size);
            s->state[nb] = 1;
            assert_status(llmem_pool_free(p, (void *)tail), LLMEM_EFOREIGN);
            assert_int_equal(s->state[nb], 1);
            s->state[nb] = 0;
            /* Nothing was taken in: no block comes back at the tail. */
            void *b = llmem_pool_alloc(p, want, NULL);
            assert_non_null(b);
            assert_true((uintptr_t)b < s->b.start || (uintptr_t)b >= s->b.start + s->b.size ||
                        (uintptr_t)b < tail);
            assert_ok(llmem_pool_free(p, b));
            assert_ok(llmem_pool_free(p, a));
            tested++;
        }
        assert_true(tested > 0);
        assert_ok(llmem_pool_check(p));
        llmem_pool_destroy(p);
    }
}

/* The exact division against plain division, for every class of a host
 * pool and of a device pool (sim-device: 64 KiB units, 256-byte
 * alignment) and every offset of its slab and a little past it: true
 * exactly at block starts before the slab's end, with the block's index. */
static void division_matches(llmem_pool *p)
{
    for (unsigned c = 0; c < p->cls.count; c++) {
        uint32_t size = p->cls.size[c], nb = p->cls.slab_blocks[c];
        for (uint32_t off = 0; off < p->cls.slab_bytes[c] + 2 * size; off += 16) {
            uint32_t idx = UINT32_MAX;
            bool at = llmem__pool_slab_index(p, c, off, &idx);
            bool want = off % size == 0 && off / size < nb;
            if (at != want) fail_msg("class %u (%u B), offset %u: %d, want %d", c, size, off, at, want);
            if (at) assert_int_equal(idx, off / size);
        }
        /* A pointer below the slab's start wraps to a far offset: never a block. */
        uint32_t idx;
        assert_false(llmem__pool_slab_index(p, c, UINT32_MAX - 15, &idx));
        assert_false(llmem__pool_slab_index(p, c, nb * size, &idx));
    }
}

static void exact_division_matches_plain_division(void **state)
{
    (void)state;
    llmem_pool *p;
    assert_ok(llmem_pool_create(NULL, &p));
    division_matches(p);
    llmem_pool_destroy(p);
    llmem_resource *sim = test_sim_new(0);
    llmem_pool_options o = llmem_pool_options_default();
    o.resource = sim;
    assert_ok(llmem_pool_create(&o, &p));
    assert_false(p->host);
    division_matches(p);
    llmem_pool_destroy(p);
    test_sim_expect_clean(sim);
    llmem_resource_destroy(sim);
}

/* llmem_pool_check reads every map unit a block touches: a slab unit whose
 * entry names another class, and a unit outside slabs whose entry is not
 * zero, are both reported. */
static void check_sees_a_wrong_slab_entry(void **state)
{
    (void)state;
    llmem_pool *p;
    assert_ok(llmem_pool_create(NULL, &p));
    void *a = llmem_pool_alloc(p, 100, NULL), *big = llmem_pool_alloc(p, 1 << 20, NULL);
    assert_non_null(a);
    assert_non_null(big);
    slab *s = slab_of(p, a);
    llmem__addrmap_entry *e = (llmem__addrmap_entry *)llmem__addrmap_entry_of(s->b.start + s->b.size - 1);
    llmem__slab_unit keep = e->slab;
    e->slab.ctag ^= 1;
    assert_status(llmem_pool_check(p), LLMEM_ECORRUPT);
    e->slab = keep;
    assert_ok(llmem_pool_check(p));
    e = (llmem__addrmap_entry *)llmem__addrmap_entry_of((uintptr_t)big + (512 << 10));
    e->slab.start = 1;
    assert_status(llmem_pool_check(p), LLMEM_ECORRUPT);
    e->slab.start = 0;
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, big));
    assert_ok(llmem_pool_free(p, a));
    llmem_pool_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(slabs_cover_whole_map_units),
        cmocka_unit_test(released_slab_clears_its_entries),
        cmocka_unit_test(tail_of_a_slab_is_not_a_block),
        cmocka_unit_test(exact_division_matches_plain_division),
        cmocka_unit_test(check_sees_a_wrong_slab_entry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
