/*
 * test_avl.c - the intrusive AVL tree (src/core/avl.c) against a shadow
 * array: random inserts and removes, duplicates included, with
 * llmem__avl_check (heights, balance, parent links, order) after every
 * operation, and in-order walks, lower_bound, first/last compared with the
 * shadow. Rebalancing stops early where a subtree's height is unchanged;
 * a height left stale above that point fails the check here.
 */
#include "test_util.h"
#include "support/rng.h"

#include "../src/core/avl.h"

#define N 600

typedef struct item {
    llmem__avl_node node;
    unsigned key, id; /* ordered by (key, id) */
    bool in;
} item;

static item *of(const llmem__avl_node *n) { return (item *)((char *)n - offsetof(item, node)); }

static int cmp(const llmem__avl_node *a, const llmem__avl_node *b)
{
    const item *x = of(a), *y = of(b);
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int key_cmp(const void *k, const llmem__avl_node *n) { return *(const unsigned *)k <= of(n)->key ? -1 : 1; }

static void check_against_shadow(const llmem_avl *t, const item *items, size_t in)
{
    assert_int_equal(llmem__avl_check(t, cmp), (long)in);
    size_t seen = 0;
    for (llmem__avl_node *n = llmem__avl_first(t); n; n = llmem__avl_next(n)) {
        assert_true(of(n)->in);
        seen++;
    }
    assert_int_equal(seen, in);
    seen = 0;
    for (llmem__avl_node *n = llmem__avl_last(t); n; n = llmem__avl_prev(n)) seen++;
    assert_int_equal(seen, in);
    (void)items;
}

static void random_ops_keep_the_tree_valid(void **state)
{
    (void)state;
    static item items[N];
    for (uint64_t seed = 1; seed <= 8; seed++) {
        uint64_t s = test_rng_seed(seed);
        llmem_avl t = {0};
        size_t in = 0;
        unsigned range = seed % 2 ? 16 : 100000; /* many duplicates, or few */
        for (unsigned i = 0; i < N; i++) items[i] = (item){.key = 0, .id = i, .in = false};
        for (int op = 0; op < 6000; op++) {
            item *it = &items[test_rng_next(&s) % N];
            if (it->in) {
                llmem__avl_remove(&t, &it->node);
                it->in = false;
                in--;
            } else {
                it->key = (unsigned)(test_rng_next(&s) % range);
                llmem__avl_insert(&t, &it->node, cmp);
                it->in = true;
                in++;
            }
            assert_int_equal(llmem__avl_check(&t, cmp), (long)in);
            if (op % 97 == 0) {
                check_against_shadow(&t, items, in);
                /* lower_bound: the smallest (key, id) with key >= k */
                unsigned k = (unsigned)(test_rng_next(&s) % range);
                const item *want = NULL;
                for (unsigned i = 0; i < N; i++)
                    if (items[i].in && items[i].key >= k &&
                        (!want || items[i].key < want->key || (items[i].key == want->key && items[i].id < want->id)))
                        want = &items[i];
                llmem__avl_node *got = llmem__avl_lower_bound(&t, &k, key_cmp);
                assert_ptr_equal(got ? of(got) : NULL, want);
            }
        }
        /* Drain in order of ids: every removal shape, down to empty. */
        for (unsigned i = 0; i < N; i++)
            if (items[i].in) {
                llmem__avl_remove(&t, &items[i].node);
                items[i].in = false;
                in--;
                assert_int_equal(llmem__avl_check(&t, cmp), (long)in);
            }
        assert_null(t.root);
    }
}

static void sorted_inserts_stay_logarithmic(void **state)
{
    (void)state;
    static item items[4096];
    llmem_avl t = {0};
    for (unsigned i = 0; i < 4096; i++) {
        items[i] = (item){.key = i, .id = i};
        llmem__avl_insert(&t, &items[i].node, cmp);
    }
    assert_int_equal(llmem__avl_check(&t, cmp), 4096);
    assert_true(t.root->height <= 13); /* 1.44 log2(4096) < 18; a sorted AVL build is 13 */
    for (unsigned i = 0; i < 4096; i += 2) llmem__avl_remove(&t, &items[i].node);
    assert_int_equal(llmem__avl_check(&t, cmp), 2048);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_ops_keep_the_tree_valid),
        cmocka_unit_test(sorted_inserts_stay_logarithmic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
