/*
 * test_planner.c - the workspace planner: hand-made graphs with known
 * answers, a property test over random lifetimes (never an overlap of
 * tensors alive together, peak between the lower bound and the naive
 * layout), in-place reuse, and bad input.
 */
#include "test_util.h"
#include "support/rng.h"

static unsigned char scratch[1 << 16];

static llmem_plan_result plan_ok(llmem_plan_tensor *t, size_t n, size_t align)
{
    llmem_plan_result r;
    assert_ok(llmem_plan(t, n, align, scratch, sizeof scratch, &r));
    assert_ok(llmem_plan_check(t, n, align, r.peak_bytes));
    assert_true(r.peak_bytes >= r.lower_bound_bytes);
    assert_true(r.peak_bytes <= r.naive_bytes);
    return r;
}

static void chain_shares_memory(void **state)
{
    (void)state;
    /* a -> b -> c -> d: each lives across two ops, so at most two at once. */
    llmem_plan_tensor t[4] = {{"a", 1000, 0, 1, -1, 0}, {"b", 1000, 1, 2, -1, 0}, {"c", 1000, 2, 3, -1, 0},
                              {"d", 1000, 3, 4, -1, 0}};
    llmem_plan_result r = plan_ok(t, 4, 64);
    assert_int_equal(r.naive_bytes, 4 * 1024);
    assert_int_equal(r.lower_bound_bytes, 2 * 1024);
    assert_int_equal(r.peak_bytes, 2 * 1024);
    assert_int_equal(t[0].offset, t[2].offset);
    assert_int_equal(t[1].offset, t[3].offset);
}

static void big_first_small_fill_the_holes(void **state)
{
    (void)state;
    /* x lives throughout; h1 and h2 (large) never together; s small beside each. */
    llmem_plan_tensor t[5] = {{"x", 256, 0, 9, -1, 0},
                              {"h1", 4096, 1, 3, -1, 0},
                              {"h2", 4096, 5, 7, -1, 0},
                              {"s1", 512, 2, 6, -1, 0},
                              {"s2", 512, 8, 9, -1, 0}};
    llmem_plan_result r = plan_ok(t, 5, 64);
    assert_int_equal(r.lower_bound_bytes, 256 + 4096 + 512);
    assert_int_equal(r.peak_bytes, r.lower_bound_bytes);
    assert_int_equal(t[1].offset, t[2].offset);
}

static void inplace_output_takes_its_input(void **state)
{
    (void)state;
    /* gate and up; swiglu writes over gate; down reads it. */
    llmem_plan_tensor t[4] = {{"gate", 8192, 1, 2, -1, 0},
                              {"up", 8192, 1, 2, -1, 0},
                              {"act", 8192, 2, 3, 0, 0},
                              {"out", 1024, 3, 4, -1, 0}};
    llmem_plan_result r = plan_ok(t, 4, 64);
    assert_int_equal(t[2].offset, t[0].offset);
    assert_int_equal(r.inplace_reuses, 1);
    /* out (after act) fits where up was. */
    assert_int_equal(r.peak_bytes, 2 * 8192);
    assert_int_equal(r.lower_bound_bytes, 2 * 8192);
    /* Without the in-place declaration, act needs its own bytes. */
    t[2].inplace_of = -1;
    r = plan_ok(t, 4, 64);
    assert_int_equal(r.peak_bytes, 3 * 8192);
}

static void zero_sized_and_empty(void **state)
{
    (void)state;
    llmem_plan_result r;
    assert_ok(llmem_plan(NULL, 0, 0, NULL, 0, &r));
    assert_int_equal(r.peak_bytes, 0);
    llmem_plan_tensor t[2] = {{"z", 0, 0, 5, -1, 7}, {"a", 10, 0, 5, -1, 0}};
    r = plan_ok(t, 2, 16);
    assert_int_equal(r.peak_bytes, 16);
    assert_int_equal(t[0].offset, 0);
}

static uint64_t rng = 88172645463325252ull;
static uint32_t next_u32(void) { return (uint32_t)(test_rng_next(&rng) >> 32); }

/* Random graphs: lifetimes, sizes from 1 byte to 1 MiB (log-uniform),
 * some in-place pairs. The plan is always sound; on average it stays near
 * the lower bound. */
static void random_lifetimes_never_overlap(void **state)
{
    (void)state;
    static llmem_plan_tensor t[200];
    double ratio_sum = 0;
    int graphs = 0;
    for (int g = 0; g < 3000; g++) {
        size_t n = 1 + next_u32() % 120, ops = 1 + next_u32() % 60;
        for (size_t i = 0; i < n; i++) {
            uint32_t a = next_u32() % ops, b = next_u32() % ops;
            t[i] = (llmem_plan_tensor){NULL, (size_t)1 << (next_u32() % 21), a < b ? a : b, a < b ? b : a, -1, 0};
            t[i].bytes += next_u32() % t[i].bytes;
            if (next_u32() % 8 == 0) t[i].bytes = 0;
        }
        /* In-place pairs: a tensor that starts where an earlier one ends. */
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n && next_u32() % 4 == 0; j++)
                if (j != i && t[j].last == t[i].first && t[j].inplace_of != (int32_t)i) {
                    t[i].inplace_of = (int32_t)j;
                    break;
                }
        size_t align = (size_t)1 << (next_u32() % 9);
        llmem_plan_result r = plan_ok(t, n, align);
        if (r.lower_bound_bytes) {
            ratio_sum += (double)r.peak_bytes / (double)r.lower_bound_bytes;
            graphs++;
        }
    }
    double mean = ratio_sum / graphs;
    print_message("random graphs: planned peak %.3fx the lower bound on average\n", mean);
    assert_true(mean < 1.25);
}

static void bad_input(void **state)
{
    (void)state;
    llmem_plan_tensor t[2] = {{"a", 10, 3, 2, -1, 0}, {"b", 10, 0, 1, -1, 0}};
    llmem_plan_result r;
    assert_status(llmem_plan(t, 2, 64, scratch, sizeof scratch, &r), LLMEM_EINVAL);
    t[0] = (llmem_plan_tensor){"a", 10, 2, 3, 1, 0}; /* b ends at 1, a starts at 2 */
    assert_status(llmem_plan(t, 2, 64, scratch, sizeof scratch, &r), LLMEM_EINVAL);
    t[0].inplace_of = 0;
    assert_status(llmem_plan(t, 2, 64, scratch, sizeof scratch, &r), LLMEM_EINVAL);
    t[0].inplace_of = 5;
    assert_status(llmem_plan(t, 2, 64, scratch, sizeof scratch, &r), LLMEM_EINVAL);
    t[0].inplace_of = -1;
    assert_status(llmem_plan(t, 2, 48, scratch, sizeof scratch, &r), LLMEM_EALIGN);
    assert_status(llmem_plan(t, 2, 64, scratch, 3, &r), LLMEM_ERANGE);
    assert_status(llmem_plan(t, 2, 64, scratch, sizeof scratch, NULL), LLMEM_EINVAL);
    assert_status(llmem_plan(NULL, 2, 64, scratch, sizeof scratch, &r), LLMEM_EINVAL);
    t[1].bytes = SIZE_MAX - 3;
    assert_status(llmem_plan(t, 2, 64, scratch, sizeof scratch, &r), LLMEM_EOVERFLOW);
    /* The checker catches a plan that overlaps. */
    llmem_plan_tensor u[2] = {{"a", 100, 0, 2, -1, 0}, {"b", 100, 1, 3, -1, 64}};
    assert_status(llmem_plan_check(u, 2, 64, 256), LLMEM_ECORRUPT);
    u[1].offset = 128;
    assert_ok(llmem_plan_check(u, 2, 64, 256));
    assert_status(llmem_plan_check(u, 2, 64, 200), LLMEM_ECORRUPT); /* past the peak */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chain_shares_memory),
        cmocka_unit_test(big_first_small_fill_the_holes),
        cmocka_unit_test(inplace_output_takes_its_input),
        cmocka_unit_test(zero_sized_and_empty),
        cmocka_unit_test(random_lifetimes_never_overlap),
        cmocka_unit_test_setup(bad_input, test_quiet_logs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
