/*
 * resources.h - what the tests do with resources and statistics. One
 * getter for each of the library's statistics structs: the struct zeroed,
 * filled by the library's get_stats, or the test fails with the library's
 * message. Included by test_util.h.
 *
 *     assert_int_equal(test_pool_stats(p).used_bytes, 0);
 *
 * With them, the two base resources most tests build on (test_os_new,
 * test_sim_new), a host copy of device or host memory (test_read_back),
 * the fault(tracking(base)) stack (test_fault_stack_open) and arming its
 * fault resource (test_fault_arm), and the end-of-test checks of
 * a sim device and of a tracking resource.
 *
 * A test that checks get_stats itself (every field written, struct_size
 * honoured) calls the library directly.
 */
#ifndef LLMEM_TEST_RESOURCES_H
#define LLMEM_TEST_RESOURCES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"

/* static inline T name(const O *o): a zeroed T filled by getter(o, &s). */
#define TEST_STATS_GETTER(name, T, getter, O)                                                   \
    static inline T name(O o)                                                                    \
    {                                                                                            \
        T s;                                                                                     \
        memset(&s, 0, sizeof s);                                                                 \
        assert_ok(getter(o, &s));                                                                \
        return s;                                                                                \
    }

TEST_STATS_GETTER(test_resource_stats, llmem_resource_stats, llmem_resource_get_stats, const llmem_resource *)
TEST_STATS_GETTER(test_os_stats, llmem_os_stats, llmem_os_resource_get_stats, const llmem_resource *)
TEST_STATS_GETTER(test_sim_stats, llmem_sim_stats, llmem_sim_resource_get_stats, const llmem_resource *)
TEST_STATS_GETTER(test_fault_stats, llmem_fault_stats, llmem_fault_resource_get_stats, const llmem_resource *)
TEST_STATS_GETTER(test_tracking_stats, llmem_tracking_stats, llmem_tracking_resource_get_stats, const llmem_resource *)
TEST_STATS_GETTER(test_pool_stats, llmem_pool_stats, llmem_pool_get_stats, const llmem_pool *)
TEST_STATS_GETTER(test_arena_stats, llmem_arena_stats, llmem_arena_get_stats, const llmem_arena *)
TEST_STATS_GETTER(test_kv_stats, llmem_kv_stats, llmem_kv_get_stats, const llmem_kv *)
TEST_STATS_GETTER(test_fixed_stats, llmem_fixed_stats, llmem_fixed_get_stats, const llmem_fixed *)

/* An os resource with the default options, or the test fails. */
static inline llmem_resource *test_os_new(void)
{
    llmem_resource *r = NULL;
    assert_ok(llmem_os_resource_create(NULL, &r));
    return r;
}

/* A sim device of `capacity` bytes (0: the default), or the test fails. */
static inline llmem_resource *test_sim_new(size_t capacity)
{
    llmem_sim_options o = llmem_sim_options_default();
    if (capacity) o.capacity = capacity;
    llmem_resource *r = NULL;
    assert_ok(llmem_sim_resource_create(&o, &r));
    return r;
}

/* Everything went back through the tracking resource t: no live mapping
 * (else its report on stderr, and a failure with the count), no live
 * byte, no call refused as a contract breach, and a report of no leak.
 * Its statistics, for more checks. */
static inline llmem_tracking_stats test_tracking_expect_clean(const llmem_resource *t)
{
    llmem_tracking_stats s = test_tracking_stats(t);
    if (s.live_mappings || s.live_bytes) {
        llmem_tracking_resource_report(t, stderr, NULL);
        fail_msg("%llu mappings (%llu bytes) leaked", (unsigned long long)s.live_mappings,
                 (unsigned long long)s.live_bytes);
    }
    assert_int_equal(s.refused_total, 0);
    FILE *f = tmpfile();
    assert_non_null(f);
    size_t leaks = 1;
    assert_ok(llmem_tracking_resource_report(t, f, &leaks));
    fclose(f);
    assert_int_equal(leaks, 0);
    return s;
}

/* A host copy of the n bytes at p (device memory through dev's copy;
 * host memory when dev is NULL), to free(); fails the test on error. */
static inline unsigned char *test_read_back(llmem_resource *dev, const void *p, size_t n)
{
    unsigned char *buf = malloc(n ? n : 1);
    if (!buf) fail_msg("no memory for a %zu-byte copy", n);
    if (dev) assert_ok(llmem_resource_copy(dev, buf, p, n));
    else memcpy(buf, p, n);
    return buf;
}

/* Arm the fault resource f (llmem_fault_options): fail its nth counted
 * call (1-based; 0 = off) and `count` calls from there (UINT64_MAX: all
 * after), counting the LLMEM_FAULT_OP_* kinds in ops (0: the default,
 * MAP|COMMIT); or the test fails. */
static inline void test_fault_arm(llmem_resource *f, uint64_t nth, uint64_t count, unsigned ops)
{
    llmem_fault_options o = llmem_fault_options_default();
    if (ops) o.ops = ops;
    o.fail_nth = nth;
    o.fail_count = count;
    assert_ok(llmem_fault_resource_arm(f, &o));
}

/* The fault tests' stack: fault(tracking(base)), so every call the code
 * under test makes can be failed, and every mapping it leaks shows. */
typedef struct test_fault_stack {
    llmem_resource *base, *track, *fault;
} test_fault_stack;

/* Build it over base (NULL: a new os resource); the fault adaptor starts
 * unarmed (test_fault_arm arms it). test_fault_stack_close destroys all
 * three, base included (the process default is never destroyed). */
static inline void test_fault_stack_open(test_fault_stack *s, llmem_resource *base)
{
    s->base = base ? base : test_os_new();
    assert_ok(llmem_tracking_resource_create(s->base, &s->track));
    assert_ok(llmem_fault_resource_create(s->track, NULL, &s->fault));
}

static inline void test_fault_stack_close(test_fault_stack *s)
{
    llmem_resource_destroy(s->fault);
    llmem_resource_destroy(s->track);
    llmem_resource_destroy(s->base);
    memset(s, 0, sizeof *s);
}

/* The sim device holds nothing and refused no copy as out of bounds. */
static inline void test_sim_expect_clean(const llmem_resource *sim)
{
    llmem_sim_stats s = test_sim_stats(sim);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(s.bad_copies_total, 0);
}

#endif
