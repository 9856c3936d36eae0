/*
 * test_resource_sim.c - the simulated device resource: device memory is
 * never host-accessible (death tests), copy() is the only way in and is a
 * strict bounds checker, capacity and reservations are enforced, costs,
 * fill and granularity options work, and the arena and fixed pools run a
 * real workload over it without ever touching device memory.
 */
#include <time.h>

#include "test_util.h"
#include "support/cases.h"

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)

static size_t page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static llmem_resource *sim_new(const llmem_sim_options *o)
{
    llmem_resource *r = NULL;
    assert_ok(llmem_sim_resource_create(o, &r));
    assert_non_null(r);
    return r;
}

/* Copy n device bytes at dev out and compare them with want. */
static void expect_device_bytes(llmem_resource *r, const void *dev, const void *want, size_t n)
{
    unsigned char *got = malloc(n);
    assert_non_null(got);
    assert_ok(llmem_resource_copy(r, got, dev, n));
    assert_memory_equal(got, want, n);
    free(got);
}

/* Copy n device bytes at dev out and check every one is `byte`. */
static void expect_device_filled(llmem_resource *r, const void *dev, unsigned char byte, size_t n)
{
    unsigned char *got = malloc(n);
    assert_non_null(got);
    assert_ok(llmem_resource_copy(r, got, dev, n));
    for (size_t i = 0; i < n; i++)
        if (got[i] != byte) fail_msg("device byte %zu is 0x%02x, expected 0x%02x", i, got[i], byte);
    free(got);
}

/* A copy the simulator must refuse: LLMEM_EINVAL, counted as a bad copy
 * and as a failure, and not counted as a copy. */
static void expect_bad_copy(llmem_resource *r, void *dst, const void *src, size_t n, const char *mentions)
{
    llmem_sim_stats before = test_sim_stats(r);
    llmem_resource_stats rb = test_resource_stats(r);
    llmem_error_clear();
    assert_status(llmem_resource_copy(r, dst, src, n), LLMEM_EINVAL);
    if (mentions) assert_error_mentions(mentions);
    assert_int_equal(test_sim_stats(r).bad_copies_total, before.bad_copies_total + 1);
    llmem_resource_stats ra = test_resource_stats(r);
    assert_int_equal(ra.failures_total, rb.failures_total + 1);
    assert_int_equal(ra.copy_calls_total, rb.copy_calls_total);
}

/* Death-test bodies, run in a child by test_child_faults. */
static void touch_read(void *arg)
{
    volatile const char *p = arg;
    char c = *p;
    (void)c;
}

static void touch_write(void *arg) { *(volatile char *)arg = 1; }

/* ---- mapping ------------------------------------------------------------- */

static void map_returns_aligned_device_memory(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = sim_new(NULL);
    llmem_resource_info info;
    assert_ok(llmem_resource_get_info(r, &info));
    assert_string_equal(info.name, "sim-device");
    assert_int_equal(info.kind, LLMEM_MEM_DEVICE);
    assert_int_equal(info.granularity, pg);
    assert_true(info.min_align >= 256);
    assert_int_equal(info.max_align, LLMEM_MAX_ALIGN);
    unsigned want = LLMEM_RES_CAP_DECOMMIT | LLMEM_RES_CAP_RESERVE | LLMEM_RES_CAP_COPY;
    assert_int_equal(info.caps & want, want);
    assert_int_equal(llmem_resource_kind(r), LLMEM_MEM_DEVICE);

    void *p, *q;
    assert_ok(llmem_resource_map(r, 1000, 0, 0, &p));
    assert_int_equal((uintptr_t)p % 256, 0);
    assert_int_equal((uintptr_t)p % pg, 0);
    assert_ok(llmem_resource_map(r, 1000, 64 * KiB, 0, &q));
    assert_int_equal((uintptr_t)q % (64 * KiB), 0);
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, 2 * pg);
    assert_int_equal(s.mappings, 2);
    llmem_sim_stats ss = test_sim_stats(r);
    assert_int_equal(ss.used_bytes, 2 * pg);
    assert_int_equal(ss.used_peak_bytes, 2 * pg);
    assert_int_equal(ss.capacity_bytes, (size_t)1 << 30);
    assert_ok(llmem_resource_unmap(r, p, 1000, pg));
    assert_ok(llmem_resource_unmap(r, q, 1000, pg));
    ss = test_sim_stats(r);
    assert_int_equal(ss.used_bytes, 0);
    assert_int_equal(ss.used_peak_bytes, 2 * pg);
    llmem_resource_destroy(r);
}

static void contains_is_true_only_inside_a_live_mapping(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = sim_new(NULL);
    char *p;
    assert_ok(llmem_resource_map(r, 2 * pg, 0, 0, (void **)&p));
    assert_true(llmem_sim_resource_contains(r, p, 1));
    assert_true(llmem_sim_resource_contains(r, p, 2 * pg));
    assert_true(llmem_sim_resource_contains(r, p + 2 * pg - 1, 1));
    assert_true(llmem_sim_resource_contains(r, p + 100, 2 * pg - 100));
    assert_false(llmem_sim_resource_contains(r, p, 2 * pg + 1));
    assert_false(llmem_sim_resource_contains(r, p + 100, 2 * pg - 99));
    assert_false(llmem_sim_resource_contains(r, p - 1, 1));
    assert_false(llmem_sim_resource_contains(r, p - 1, 2));
    assert_false(llmem_sim_resource_contains(r, p + 2 * pg, 1));
    /* Sizes so large that ptr + n wraps around are not "inside". */
    assert_false(llmem_sim_resource_contains(r, p + 1, SIZE_MAX));
    assert_false(llmem_sim_resource_contains(r, p, (size_t)0 - (uintptr_t)p));
    assert_false(llmem_sim_resource_contains(r, p, 0));
    assert_false(llmem_sim_resource_contains(r, NULL, 1));
    assert_false(llmem_sim_resource_contains(NULL, p, 1));
    assert_false(llmem_sim_resource_contains(llmem_resource_default(), p, 1));
    char host[8];
    assert_false(llmem_sim_resource_contains(r, host, sizeof host));
    assert_ok(llmem_resource_unmap(r, p, 2 * pg, 2 * pg));
    assert_false(llmem_sim_resource_contains(r, p, 1));
    llmem_resource_destroy(r);
}

/* ---- device memory is not host memory -------------------------------------- */

static void host_read_of_device_memory_faults(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = sim_new(NULL);
    char *p;
    assert_ok(llmem_resource_map(r, 4 * pg, 0, 0, (void **)&p));
    assert_true(test_child_faults(touch_read, p));
    assert_true(test_child_faults(touch_read, p + 2 * pg + 17));
    assert_true(test_child_faults(touch_read, p + 4 * pg - 1));
    /* Control: the death test does not report faults that do not happen. */
    char host = 0;
    assert_false(test_child_faults(touch_read, &host));
    assert_ok(llmem_resource_unmap(r, p, 4 * pg, 4 * pg));
    llmem_resource_destroy(r);
}

static void host_write_of_device_memory_faults(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = sim_new(NULL);
    char *p;
    assert_ok(llmem_resource_map(r, 4 * pg, 0, 0, (void **)&p));
    assert_true(test_child_faults(touch_write, p));
    assert_true(test_child_faults(touch_write, p + pg));
    assert_true(test_child_faults(touch_write, p + 4 * pg - 1));
    char host = 0;
    assert_false(test_child_faults(touch_write, &host));
    /* Nothing the children did reached the mapping. */
    expect_device_filled(r, p, 0, 4 * pg);
    assert_ok(llmem_resource_unmap(r, p, 4 * pg, 4 * pg));
    llmem_resource_destroy(r);
}

static void pages_are_closed_again_after_copies(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = sim_new(NULL);
    char *a, *b;
    assert_ok(llmem_resource_map(r, 2 * pg, 0, 0, (void **)&a));
    assert_ok(llmem_resource_map(r, 2 * pg, 0, 0, (void **)&b));
    unsigned char buf[512];
    test_pattern(buf, sizeof buf, 1);
    assert_ok(llmem_resource_copy(r, a + pg - 100, buf, sizeof buf)); /* in, across a page boundary */
    assert_true(test_child_faults(touch_read, a + pg - 100));
    assert_true(test_child_faults(touch_write, a + pg));
    assert_ok(llmem_resource_copy(r, buf, a + pg - 100, sizeof buf)); /* out */
    assert_true(test_child_faults(touch_read, a));
    assert_true(test_child_faults(touch_read, a + pg + 200));
    assert_ok(llmem_resource_copy(r, b + 10, a + pg - 100, sizeof buf)); /* device to device */
    assert_true(test_child_faults(touch_read, a + pg));
    assert_true(test_child_faults(touch_read, b + 10));
    assert_true(test_child_faults(touch_write, b));
    /* A refused copy leaves nothing open either. */
    assert_status(llmem_resource_copy(r, a + 2 * pg - 10, buf, 20), LLMEM_EINVAL);
    assert_true(test_child_faults(touch_read, a + 2 * pg - 10));
    assert_ok(llmem_resource_unmap(r, a, 2 * pg, 2 * pg));
    assert_ok(llmem_resource_unmap(r, b, 2 * pg, 2 * pg));
    llmem_resource_destroy(r);
}

/* ---- copies that work -------------------------------------------------------- */

static void copy_round_trips_host_device_host(void **state)
{
    (void)state;
    const size_t pg = page(), n = 3 * pg + 123;
    llmem_resource *r = sim_new(NULL);
    char *p;
    assert_ok(llmem_resource_map(r, 5 * pg, 0, 0, (void **)&p));
    unsigned char *in = malloc(n), *out = malloc(n);
    assert_non_null(in);
    assert_non_null(out);
    test_pattern(in, n, 7);
    memset(out, 0, n);
    assert_ok(llmem_resource_copy(r, p + 77, in, n)); /* odd offset, crosses pages */
    assert_ok(llmem_resource_copy(r, out, p + 77, n));
    assert_memory_equal(out, in, n);
    /* The bytes around the copied range are untouched (still zero). */
    expect_device_filled(r, p, 0, 77);
    expect_device_filled(r, p + 77 + n, 0, 5 * pg - 77 - n);
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.copy_calls_total, 4);
    assert_int_equal(s.copy_bytes_total, 2 * n + 77 + (5 * pg - 77 - n));
    assert_int_equal(test_sim_stats(r).bad_copies_total, 0);
    /* n == 0 is a no-op. */
    assert_ok(llmem_resource_copy(r, p, in, 0));
    assert_ok(llmem_resource_copy(r, NULL, NULL, 0));
    assert_int_equal(test_resource_stats(r).copy_calls_total, 4);
    /* Null pointers are refused by the wrapper. */
    assert_status(llmem_resource_copy(r, NULL, in, 1), LLMEM_EINVAL);
    assert_status(llmem_resource_copy(r, p, NULL, 1), LLMEM_EINVAL);
    free(in);
    free(out);
    assert_ok(llmem_resource_unmap(r, p, 5 * pg, 5 * pg));
    llmem_resource_destroy(r);
}

static void copy_within_one_mapping_without_overlap(void **state)
{
    (void)state;
    const size_t pg = page(), half = 2 * pg;
    llmem_resource *r = sim_new(NULL);
    char *p;
    assert_ok(llmem_resource_map(r, 2 * half, 0, 0, (void **)&p));
    unsigned char *in = malloc(half);
    assert_non_null(in);
    test_pattern(in, half, 3);
    assert_ok(llmem_resource_copy(r, p, in, half));
    assert_ok(llmem_resource_copy(r, p + half, p, half)); /* adjacent, not overlapping */
    expect_device_bytes(r, p + half, in, half);
    expect_device_bytes(r, p, in, half);
    /* Same page on both sides, disjoint bytes. */
    assert_ok(llmem_resource_copy(r, p + 100, p + 10, 50));
    expect_device_bytes(r, p + 100, in + 10, 50);
    free(in);
    assert_ok(llmem_resource_unmap(r, p, 2 * half, 2 * half));
    llmem_resource_destroy(r);
}

/* ---- copies that are refused --------------------------------------------------- */

static void copy_past_the_end_of_a_mapping_is_refused(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = sim_new(NULL);
    char *p;
    assert_ok(llmem_resource_map(r, pg, 0, 0, (void **)&p));
    unsigned char tail[10], zeros[20] = {0};
    test_pattern(tail, sizeof tail, 5);
    assert_ok(llmem_resource_copy(r, p + pg - 10, tail, 10));
    unsigned char src[20];
    test_pattern(src, sizeof src, 6);
    expect_bad_copy(r, p + pg - 10, src, 20, "outside a device mapping");
    expect_device_bytes(r, p + pg - 10, tail, 10); /* destination unchanged */
    /* Reading past the end is refused too, and the host side untouched. */
    unsigned char dst[20] = {0};
    expect_bad_copy(r, dst, p + pg - 10, 20, "source");
    assert_memory_equal(dst, zeros, sizeof dst);
    /* One byte past the end. */
    expect_bad_copy(r, p + pg - 1, src, 2, NULL);
    assert_int_equal(test_sim_stats(r).bad_copies_total, 3);
    assert_ok(llmem_resource_unmap(r, p, pg, pg));
    llmem_resource_destroy(r);
}

static void copy_straddling_two_mappings_is_refused(void **state)
{
    (void)state;
    const size_t pg = page();
    enum { N = 16 };
    llmem_resource *r = sim_new(NULL);
    char *m[N];
    for (int i = 0; i < N; i++) assert_ok(llmem_resource_map(r, pg, 0, 0, (void **)&m[i]));
    /* Find two mappings that sit next to each other (mmap places new ones
     * next to old ones; 16 tries make it all but certain). */
    char *lo = NULL, *hi = NULL;
    for (int i = 0; i < N && !lo; i++)
        for (int j = 0; j < N; j++)
            if (m[j] == m[i] + pg) {
                lo = m[i];
                hi = m[j];
                break;
            }
    if (!lo) fail_msg("no two of %d one-page mappings are adjacent; cannot build a straddling copy", N);
    assert_false(llmem_sim_resource_contains(r, lo + pg - 10, 20));
    unsigned char lo_tail[10], hi_head[10], src[20];
    test_pattern(lo_tail, 10, 1);
    test_pattern(hi_head, 10, 2);
    test_pattern(src, 20, 3);
    assert_ok(llmem_resource_copy(r, lo + pg - 10, lo_tail, 10));
    assert_ok(llmem_resource_copy(r, hi, hi_head, 10));
    expect_bad_copy(r, lo + pg - 10, src, 20, "outside a device mapping");
    expect_device_bytes(r, lo + pg - 10, lo_tail, 10);
    expect_device_bytes(r, hi, hi_head, 10);
    unsigned char dst[20] = {0}, zeros[20] = {0};
    expect_bad_copy(r, dst, lo + pg - 10, 20, NULL);
    assert_memory_equal(dst, zeros, sizeof dst);
    for (int i = 0; i < N; i++) assert_ok(llmem_resource_unmap(r, m[i], pg, pg));
    llmem_resource_destroy(r);
}

static void copy_with_a_host_range_running_into_device_memory_is_refused(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = sim_new(NULL);
    char *p;
    assert_ok(llmem_resource_map(r, pg, 0, 0, (void **)&p));
    unsigned char head[16];
    test_pattern(head, sizeof head, 9);
    assert_ok(llmem_resource_copy(r, p, head, sizeof head));
    /* [p - 16, p + 16) starts outside every mapping but runs into one. */
    unsigned char src[32];
    test_pattern(src, sizeof src, 10);
    expect_bad_copy(r, p - 16, src, 32, "outside a device mapping");
    expect_device_bytes(r, p, head, sizeof head);
    assert_ok(llmem_resource_unmap(r, p, pg, pg));
    llmem_resource_destroy(r);
}

static void overlapping_copies_are_refused(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = sim_new(NULL);
    char *p;
    assert_ok(llmem_resource_map(r, 2 * pg, 0, 0, (void **)&p));
    unsigned char in[300];
    test_pattern(in, sizeof in, 4);
    assert_ok(llmem_resource_copy(r, p, in, sizeof in));
    expect_bad_copy(r, p + 10, p, 100, "overlap");
    expect_bad_copy(r, p, p + 10, 100, "overlap");
    expect_bad_copy(r, p, p, 100, "overlap");
    expect_device_bytes(r, p, in, sizeof in);
    /* The contract holds for host ranges too. */
    unsigned char host[64], copy_of[64];
    test_pattern(host, sizeof host, 8);
    memcpy(copy_of, host, sizeof host);
    expect_bad_copy(r, host + 1, host, 32, "overlap");
    assert_memory_equal(host, copy_of, sizeof host);
    assert_int_equal(test_sim_stats(r).bad_copies_total, 4);
    assert_ok(llmem_resource_unmap(r, p, 2 * pg, 2 * pg));
    llmem_resource_destroy(r);
}

static void copy_touching_uncommitted_memory_is_refused(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = sim_new(NULL);
    char *p;
    assert_ok(llmem_resource_map(r, 4 * pg, 0, LLMEM_MAP_UNCOMMITTED, (void **)&p));
    assert_ok(llmem_resource_commit(r, p, pg));
    unsigned char tail[10], src[20];
    test_pattern(tail, 10, 12);
    test_pattern(src, 20, 13);
    assert_ok(llmem_resource_copy(r, p + pg - 10, tail, 10));
    expect_bad_copy(r, p + pg, src, 20, "uncommitted");
    expect_bad_copy(r, p + pg - 10, src, 20, "uncommitted"); /* half committed */
    expect_bad_copy(r, p + 3 * pg, src, 20, "uncommitted");
    expect_device_bytes(r, p + pg - 10, tail, 10);
    unsigned char dst[20] = {0}, zeros[20] = {0};
    expect_bad_copy(r, dst, p + pg, 20, "uncommitted");
    assert_memory_equal(dst, zeros, sizeof dst);
    /* Decommitted memory is uncommitted again. */
    assert_ok(llmem_resource_decommit(r, p, pg));
    expect_bad_copy(r, dst, p, 1, "uncommitted");
    assert_int_equal(test_sim_stats(r).bad_copies_total, 5);
    assert_ok(llmem_resource_unmap(r, p, 4 * pg, 0));
    llmem_resource_destroy(r);
}

/* ---- capacity and reservations --------------------------------------------- */

static void capacity_is_enforced(void **state)
{
    (void)state;
    llmem_resource *r = test_sim_new(MiB);
    assert_int_equal(test_sim_stats(r).capacity_bytes, MiB);
    void *p, *q = &q;
    assert_ok(llmem_resource_map(r, MiB, 0, 0, &p));
    llmem_error_clear();
    assert_status(llmem_resource_map(r, 4 * KiB, 0, 0, &q), LLMEM_ENOMEM);
    assert_null(q);
    assert_error_mentions("out of device memory");
    llmem_sim_stats s = test_sim_stats(r);
    assert_int_equal(s.oom_total, 1);
    assert_int_equal(s.used_bytes, MiB);
    assert_int_equal(s.used_peak_bytes, MiB);
    assert_int_equal(test_resource_stats(r).mappings, 1);
    assert_int_equal(test_resource_stats(r).failures_total, 1);

    assert_ok(llmem_resource_unmap(r, p, MiB, MiB));
    assert_int_equal(test_sim_stats(r).used_bytes, 0);
    assert_ok(llmem_resource_map(r, 4 * KiB, 0, 0, &q));
    s = test_sim_stats(r);
    assert_int_equal(s.used_bytes, 4 * KiB);
    assert_int_equal(s.used_peak_bytes, MiB);
    /* Too big from the start. */
    assert_status(llmem_resource_map(r, MiB, 0, 0, &p), LLMEM_ENOMEM);
    assert_int_equal(test_sim_stats(r).oom_total, 2);
    assert_ok(llmem_resource_unmap(r, q, 4 * KiB, 4 * KiB));
    llmem_resource_destroy(r);
}

static void reservations_commit_against_capacity(void **state)
{
    (void)state;
    llmem_resource *r = test_sim_new(256 * KiB);
    char *p;
    /* A reservation is address space: bigger than the device is fine. */
    assert_ok(llmem_resource_map(r, MiB, 0, LLMEM_MAP_UNCOMMITTED, (void **)&p));
    assert_int_equal(test_sim_stats(r).used_bytes, 0);
    assert_int_equal(test_resource_stats(r).committed_bytes, 0);
    assert_true(llmem_sim_resource_contains(r, p, MiB));

    assert_ok(llmem_resource_commit(r, p, 128 * KiB));
    assert_int_equal(test_sim_stats(r).used_bytes, 128 * KiB);
    assert_int_equal(test_resource_stats(r).committed_bytes, 128 * KiB);
    llmem_error_clear();
    assert_status(llmem_resource_commit(r, p, 128 * KiB), LLMEM_EINVAL);
    assert_error_mentions("already committed");
    assert_status(llmem_resource_commit(r, p + 64 * KiB, 128 * KiB), LLMEM_EINVAL); /* half committed */
    assert_int_equal(test_sim_stats(r).used_bytes, 128 * KiB);

    assert_ok(llmem_resource_commit(r, p + 128 * KiB, 128 * KiB));
    assert_int_equal(test_sim_stats(r).used_bytes, 256 * KiB);
    llmem_error_clear();
    assert_status(llmem_resource_commit(r, p + 512 * KiB, 4 * KiB), LLMEM_ENOMEM);
    assert_error_mentions("out of device memory");
    assert_int_equal(test_sim_stats(r).oom_total, 1);
    /* A refused commit left the range uncommitted. */
    unsigned char one = 1;
    expect_bad_copy(r, p + 512 * KiB, &one, 1, "uncommitted");

    llmem_error_clear();
    assert_status(llmem_resource_decommit(r, p + 768 * KiB, 64 * KiB), LLMEM_EINVAL);
    assert_error_mentions("not committed");
    assert_status(llmem_resource_decommit(r, p + 192 * KiB, 128 * KiB), LLMEM_EINVAL); /* half uncommitted */
    assert_status(llmem_resource_commit(r, p + MiB - 4 * KiB, 8 * KiB), LLMEM_EINVAL);  /* runs past the end */
    assert_int_equal(test_sim_stats(r).used_bytes, 256 * KiB);

    /* unmap must be told the truth about what is committed. */
    llmem_error_clear();
    assert_status(llmem_resource_unmap(r, p, MiB, 0), LLMEM_EINVAL);
    assert_error_mentions("committed");
    assert_status(llmem_resource_unmap(r, p, MiB, MiB), LLMEM_EINVAL);
    assert_int_equal(test_sim_stats(r).used_bytes, 256 * KiB);
    assert_true(llmem_sim_resource_contains(r, p, MiB));
    assert_int_equal(test_resource_stats(r).mappings, 1);
    assert_int_equal(test_resource_stats(r).mapped_bytes, MiB);

    /* Decommit gives capacity back. */
    assert_ok(llmem_resource_decommit(r, p, 64 * KiB));
    assert_int_equal(test_sim_stats(r).used_bytes, 192 * KiB);
    assert_ok(llmem_resource_commit(r, p + 512 * KiB, 64 * KiB));
    assert_int_equal(test_sim_stats(r).used_bytes, 256 * KiB);
    assert_int_equal(test_resource_stats(r).committed_bytes, 256 * KiB);
    unsigned char in[100], out[100];
    test_pattern(in, sizeof in, 21);
    assert_ok(llmem_resource_copy(r, p + 512 * KiB, in, sizeof in));
    assert_ok(llmem_resource_copy(r, out, p + 512 * KiB, sizeof out));
    assert_memory_equal(in, out, sizeof in);

    assert_ok(llmem_resource_unmap(r, p, MiB, 256 * KiB));
    llmem_sim_stats s = test_sim_stats(r);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(s.used_peak_bytes, 256 * KiB);
    assert_int_equal(test_resource_stats(r).committed_bytes, 0);
    assert_int_equal(test_resource_stats(r).mapped_bytes, 0);
    assert_status(llmem_resource_commit(r, p, 4 * KiB), LLMEM_EINVAL); /* no mapping there any more */
    llmem_resource_destroy(r);
}

static void decommitted_memory_comes_back_zeroed(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = sim_new(NULL);
    char *p;
    assert_ok(llmem_resource_map(r, 2 * pg, 0, 0, (void **)&p));
    unsigned char in[64];
    test_pattern(in, sizeof in, 30);
    assert_ok(llmem_resource_copy(r, p, in, sizeof in));
    assert_ok(llmem_resource_copy(r, p + pg, in, sizeof in));
    assert_ok(llmem_resource_decommit(r, p, pg));
    assert_ok(llmem_resource_commit(r, p, pg));
    expect_device_filled(r, p, 0, pg);
    expect_device_bytes(r, p + pg, in, sizeof in); /* the other page kept its bytes */
    assert_true(test_child_faults(touch_read, p));
    assert_ok(llmem_resource_unmap(r, p, 2 * pg, 2 * pg));
    llmem_resource_destroy(r);
}

static void unmap_with_wrong_pointer_or_size_is_refused(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = sim_new(NULL);
    char *p;
    assert_ok(llmem_resource_map(r, 4 * pg, 0, 0, (void **)&p));
    unsigned char in[128];
    test_pattern(in, sizeof in, 40);
    assert_ok(llmem_resource_copy(r, p + pg, in, sizeof in));
    llmem_error_clear();
    assert_status(llmem_resource_unmap(r, p + pg, 3 * pg, 3 * pg), LLMEM_EINVAL);
    assert_error_mentions("not the start");
    llmem_error_clear();
    assert_status(llmem_resource_unmap(r, p, 2 * pg, 2 * pg), LLMEM_EINVAL);
    assert_error_mentions("mapped with");
    assert_status(llmem_resource_unmap(r, p, 8 * pg, 4 * pg), LLMEM_EINVAL);
    assert_status(llmem_resource_unmap(r, p, 4 * pg, 3 * pg), LLMEM_EINVAL);
    assert_status(llmem_resource_unmap(r, p + 4 * pg, pg, pg), LLMEM_EINVAL); /* just past it */
    assert_status(llmem_resource_unmap(r, p + 1, 4 * pg, 4 * pg), LLMEM_EINVAL); /* wrapper: unaligned */
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.failures_total, 6);
    assert_int_equal(s.mappings, 1);
    assert_int_equal(s.unmap_calls_total, 0);
    assert_int_equal(test_sim_stats(r).used_bytes, 4 * pg);
    /* Still a working mapping. */
    assert_true(llmem_sim_resource_contains(r, p, 4 * pg));
    expect_device_bytes(r, p + pg, in, sizeof in);
    assert_ok(llmem_resource_unmap(r, p, 4 * pg, 4 * pg));
    /* Twice is refused, and nothing is counted twice. */
    assert_status(llmem_resource_unmap(r, p, 4 * pg, 4 * pg), LLMEM_EINVAL);
    assert_int_equal(test_sim_stats(r).used_bytes, 0);
    assert_int_equal(test_resource_stats(r).mapped_bytes, 0);
    assert_int_equal(test_resource_stats(r).unmap_calls_total, 1);
    llmem_resource_destroy(r);
}

/* ---- options ------------------------------------------------------------------ */

static void map_and_unmap_costs_are_charged(void **state)
{
    (void)state;
    const uint64_t map_cost = 2000000, unmap_cost = 1000000; /* 2 ms, 1 ms */
    llmem_sim_options o = llmem_sim_options_default();
    o.map_cost_ns = map_cost;
    o.unmap_cost_ns = unmap_cost;
    llmem_resource *r = sim_new(&o);
    assert_int_equal(test_sim_stats(r).cost_ns_total, 0);
    void *p;
    uint64_t t0 = test_now_ns();
    assert_ok(llmem_resource_map(r, page(), 0, 0, &p));
    uint64_t t1 = test_now_ns();
    if (t1 - t0 < map_cost) fail_msg("map took %llu ns, less than its 2 ms cost", (unsigned long long)(t1 - t0));
    assert_int_equal(test_sim_stats(r).cost_ns_total, map_cost);
    t0 = test_now_ns();
    assert_ok(llmem_resource_unmap(r, p, page(), page()));
    t1 = test_now_ns();
    if (t1 - t0 < unmap_cost)
        fail_msg("unmap took %llu ns, less than its 1 ms cost", (unsigned long long)(t1 - t0));
    assert_int_equal(test_sim_stats(r).cost_ns_total, map_cost + unmap_cost);
    /* Copies are not charged. */
    unsigned char b = 0;
    assert_ok(llmem_resource_map(r, page(), 0, 0, &p));
    assert_ok(llmem_resource_copy(r, p, &b, 1));
    assert_int_equal(test_sim_stats(r).cost_ns_total, 2 * map_cost + unmap_cost);
    assert_ok(llmem_resource_unmap(r, p, page(), page()));
    llmem_resource_destroy(r);
}

static void fill_option_fills_fresh_memory(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_sim_options o = llmem_sim_options_default();
    o.fill = 0xAB;
    llmem_resource *r = sim_new(&o);
    char *p;
    assert_ok(llmem_resource_map(r, 3 * pg, 0, 0, (void **)&p));
    expect_device_filled(r, p, 0xAB, 3 * pg);
    assert_true(test_child_faults(touch_read, p)); /* filling did not leave it open */
    /* Memory committed later in a reservation is just as fresh. */
    char *q;
    assert_ok(llmem_resource_map(r, 4 * pg, 0, LLMEM_MAP_UNCOMMITTED, (void **)&q));
    assert_ok(llmem_resource_commit(r, q + pg, 2 * pg));
    expect_device_filled(r, q + pg, 0xAB, 2 * pg);
    assert_true(test_child_faults(touch_read, q + pg));
    /* And so is memory committed again after a decommit. */
    unsigned char zeros[64] = {0};
    assert_ok(llmem_resource_copy(r, p, zeros, sizeof zeros));
    assert_ok(llmem_resource_decommit(r, p, pg));
    assert_ok(llmem_resource_commit(r, p, pg));
    expect_device_filled(r, p, 0xAB, pg);
    assert_ok(llmem_resource_unmap(r, p, 3 * pg, 3 * pg));
    assert_ok(llmem_resource_unmap(r, q, 4 * pg, 2 * pg));
    llmem_resource_destroy(r);

    /* Control: without the option fresh memory is zero. */
    r = sim_new(NULL);
    assert_ok(llmem_resource_map(r, pg, 0, 0, (void **)&p));
    expect_device_filled(r, p, 0, pg);
    assert_ok(llmem_resource_unmap(r, p, pg, pg));
    llmem_resource_destroy(r);
}

static void granularity_option_is_checked_and_applied(void **state)
{
    (void)state;
    llmem_sim_options o = llmem_sim_options_default();
    const size_t bad[] = {3000, 1024, page() / 2, page() + 1, (size_t)2 << 30, SIZE_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o.granularity = bad[i];
        llmem_resource *r = (llmem_resource *)&r;
        llmem_error_clear();
        assert_status(llmem_sim_resource_create(&o, &r), LLMEM_EINVAL);
        assert_null(r);
        assert_error_mentions("granularity");
    }
    o.granularity = 0; /* the default: the page */
    llmem_resource *r = sim_new(&o);
    assert_int_equal(llmem_resource_granularity(r), page());
    llmem_resource_destroy(r);

    o.granularity = 2 * MiB;
    r = sim_new(&o);
    llmem_resource_info info;
    assert_ok(llmem_resource_get_info(r, &info));
    assert_int_equal(info.granularity, 2 * MiB);
    assert_int_equal(info.min_align, 2 * MiB);
    char *p;
    assert_ok(llmem_resource_map(r, 1, 0, 0, (void **)&p));
    assert_int_equal((uintptr_t)p % (2 * MiB), 0);
    assert_int_equal(test_resource_stats(r).mapped_bytes, 2 * MiB);
    assert_int_equal(test_sim_stats(r).used_bytes, 2 * MiB);
    assert_true(llmem_sim_resource_contains(r, p, 2 * MiB));
    assert_false(llmem_sim_resource_contains(r, p, 2 * MiB + 1));
    /* Commit and decommit work in whole granules. */
    assert_status(llmem_resource_decommit(r, p + page(), page()), LLMEM_EINVAL);
    assert_ok(llmem_resource_unmap(r, p, 1, 2 * MiB));
    assert_int_equal(test_sim_stats(r).used_bytes, 0);
    llmem_resource_destroy(r);
}

static void options_default_and_create_arguments(void **state)
{
    (void)state;
    llmem_sim_options d = llmem_sim_options_default();
    assert_string_equal(d.name, "sim-device");
    assert_int_equal(d.capacity, (size_t)1 << 30);
    assert_int_equal(d.granularity, page());
    assert_int_equal(d.map_cost_ns + d.unmap_cost_ns + d.fill, 0);
    assert_status(llmem_sim_resource_create(NULL, NULL), LLMEM_EINVAL);
    assert_status(llmem_sim_resource_create(&d, NULL), LLMEM_EINVAL);

    /* Zeroed options mean the defaults. */
    llmem_sim_options z;
    memset(&z, 0, sizeof z);
    llmem_resource *r = sim_new(&z);
    assert_string_equal(llmem_resource_name(r), "sim-device");
    assert_int_equal(test_sim_stats(r).capacity_bytes, (size_t)1 << 30);
    assert_int_equal(llmem_resource_granularity(r), page());
    llmem_resource_destroy(r);

    d.name = "gpu0";
    r = sim_new(&d);
    assert_string_equal(llmem_resource_name(r), "gpu0");
    void *p;
    llmem_error_clear();
    assert_status(llmem_resource_map(r, 2u << 30, 0, 0, &p), LLMEM_ENOMEM);
    assert_error_mentions("gpu0");
    llmem_resource_destroy(r);
}

static void sim_stats_refuse_other_resources(void **state)
{
    (void)state;
    llmem_sim_stats s;
    memset(&s, 0, sizeof s);
    llmem_error_clear();
    assert_status(llmem_sim_resource_get_stats(llmem_resource_default(), &s), LLMEM_EINVAL);
    assert_error_mentions("not a sim-device");
    llmem_resource *os;
    assert_ok(llmem_os_resource_create(NULL, &os));
    assert_status(llmem_sim_resource_get_stats(os, &s), LLMEM_EINVAL);
    llmem_resource_destroy(os);
    assert_status(llmem_sim_resource_get_stats(NULL, &s), LLMEM_EINVAL);

    llmem_resource *r = test_sim_new(MiB);
    assert_status(llmem_sim_resource_get_stats(r, NULL), LLMEM_EINVAL);
    s = test_sim_stats(r);
    assert_int_equal(s.struct_size, sizeof s);
    /* A shorter struct is filled only as far as it goes. */
    memset(&s, 0xCD, sizeof s);
    s.struct_size = offsetof(llmem_sim_stats, used_peak_bytes);
    assert_ok(llmem_sim_resource_get_stats(r, &s));
    assert_int_equal(s.struct_size, offsetof(llmem_sim_stats, used_peak_bytes));
    assert_int_equal(s.capacity_bytes, MiB);
    assert_int_equal(s.used_bytes, 0);
    const unsigned char *tail = (const unsigned char *)&s + offsetof(llmem_sim_stats, used_peak_bytes);
    for (size_t i = 0; i < sizeof s - offsetof(llmem_sim_stats, used_peak_bytes); i++)
        assert_int_equal(tail[i], 0xCD);
    assert_int_equal(llmem_sim_stats_schema()->struct_size, sizeof(llmem_sim_stats));
    llmem_resource_destroy(r);
}

/* ---- pools over device memory ------------------------------------------------ */

#define ARENA_ALLOCS 200

static void arena_over_sim_never_touches_device_memory(void **state)
{
    (void)state;
    llmem_resource *r = test_sim_new(64 * MiB);
    llmem_arena_options o = llmem_arena_options_default();
    o.name = "dev-arena";
    o.resource = r;
    o.chunk_bytes = 64 * KiB;
    llmem_arena *a;
    assert_ok(llmem_arena_create(&o, &a));
    unsigned char *buf = malloc(256 * KiB);
    assert_non_null(buf);
    void *ptrs[ARENA_ALLOCS];
    size_t sizes[ARENA_ALLOCS];
    for (unsigned round = 0; round < 4; round++) {
        for (unsigned i = 0; i < ARENA_ALLOCS; i++) {
            sizes[i] = 1 + (i * 37u + round * 11u) % 3000;
            llmem_status st = LLMEM_EOS;
            ptrs[i] = llmem_arena_alloc(a, sizes[i], 0, &st);
            if (!ptrs[i]) fail_msg("round %u alloc %u of %zu failed: %s", round, i, sizes[i], llmem_error_message());
            assert_int_equal(st, LLMEM_OK);
            assert_int_equal((uintptr_t)ptrs[i] % 256, 0); /* the device default alignment */
            assert_true(llmem_sim_resource_contains(r, ptrs[i], sizes[i]));
            test_pattern(buf, sizes[i], round * 1000 + i);
            assert_ok(llmem_resource_copy(r, ptrs[i], buf, sizes[i]));
        }
        /* Temporaries past a mark, then rolled back. */
        llmem_arena_mark m = llmem_arena_save(a);
        for (unsigned j = 0; j < 50; j++) {
            void *t = llmem_arena_alloc(a, 512, 0, NULL);
            assert_non_null(t);
            memset(buf, 0xEE, 512);
            assert_ok(llmem_resource_copy(r, t, buf, 512));
        }
        void *big = llmem_arena_alloc(a, 200 * KiB, 0, NULL); /* larger than a chunk */
        assert_non_null(big);
        assert_true(llmem_sim_resource_contains(r, big, 200 * KiB));
        test_pattern(buf, 200 * KiB, 77);
        assert_ok(llmem_resource_copy(r, big, buf, 200 * KiB));
        assert_ok(llmem_arena_rollback(a, m));
        /* Every allocation kept its own bytes: none overlapped another. */
        for (unsigned i = 0; i < ARENA_ALLOCS; i++) {
            unsigned char *want = buf + 128 * KiB;
            test_pattern(want, sizes[i], round * 1000 + i);
            expect_device_bytes(r, ptrs[i], want, sizes[i]);
        }
        llmem_arena_reset(a);
    }
    llmem_arena_stats as;
    memset(&as, 0, sizeof as);
    assert_ok(llmem_arena_get_stats(a, &as));
    assert_int_equal(as.resets_total, 4);
    assert_int_equal(as.rollbacks_total, 4);
    assert_int_equal(as.used_bytes, 0);
    assert_true(test_sim_stats(r).used_bytes > 0);
    llmem_arena_trim(a);
    llmem_arena_destroy(a);
    free(buf);
    assert_int_equal(test_sim_stats(r).used_bytes, 0);
    assert_int_equal(test_sim_stats(r).bad_copies_total, 0);
    assert_int_equal(test_resource_stats(r).mappings, 0);
    llmem_resource_destroy(r);
}

#define FIXED_BLOCKS 300

static void fixed_workload(bool thread_safe, bool checked)
{
    llmem_resource *r = test_sim_new(64 * MiB);
    llmem_fixed_options o = llmem_fixed_options_default();
    o.name = "dev-blocks";
    o.resource = r;
    o.block_size = 1000;
    o.thread_safe = thread_safe;
    o.checked = checked;
    llmem_fixed *p;
    assert_ok(llmem_fixed_create(&o, &p));
    size_t stride = llmem_fixed_block_size(p);
    assert_true(stride >= 1000);
    assert_int_equal(stride % 256, 0);

    void *blocks[FIXED_BLOCKS];
    unsigned seed[FIXED_BLOCKS];
    unsigned char buf[1000], want[1000];
    for (unsigned i = 0; i < FIXED_BLOCKS; i++) {
        llmem_status st = LLMEM_EOS;
        blocks[i] = llmem_fixed_alloc(p, &st);
        if (!blocks[i]) fail_msg("alloc %u failed: %s", i, llmem_error_message());
        assert_int_equal(st, LLMEM_OK);
        assert_int_equal((uintptr_t)blocks[i] % 256, 0);
        assert_true(llmem_sim_resource_contains(r, blocks[i], 1000));
        assert_true(llmem_fixed_owns(p, blocks[i]));
        seed[i] = i + 1;
        test_pattern(buf, sizeof buf, seed[i]);
        assert_ok(llmem_resource_copy(r, blocks[i], buf, sizeof buf));
    }
    /* Free every other block, allocate them again with new contents. */
    for (unsigned i = 0; i < FIXED_BLOCKS; i += 2) assert_ok(llmem_fixed_free(p, blocks[i]));
    for (unsigned i = 0; i < FIXED_BLOCKS; i += 2) {
        blocks[i] = llmem_fixed_alloc(p, NULL);
        assert_non_null(blocks[i]);
        assert_true(llmem_sim_resource_contains(r, blocks[i], 1000));
        seed[i] = 10000 + i;
        test_pattern(buf, sizeof buf, seed[i]);
        assert_ok(llmem_resource_copy(r, blocks[i], buf, sizeof buf));
    }
    for (unsigned i = 0; i < FIXED_BLOCKS; i++) {
        test_pattern(want, sizeof want, seed[i]);
        expect_device_bytes(r, blocks[i], want, sizeof want);
    }
    if (checked) {
        /* Detections look only at metadata, never at the device block. */
        assert_ok(llmem_fixed_free(p, blocks[0]));
        assert_status(llmem_fixed_free(p, blocks[0]), LLMEM_EDOUBLEFREE);
        assert_status(llmem_fixed_free(p, (char *)blocks[1] + 8), LLMEM_EFOREIGN);
        assert_status(llmem_fixed_free(p, buf), LLMEM_EFOREIGN);
        blocks[0] = llmem_fixed_alloc(p, NULL);
        assert_non_null(blocks[0]);
    }
    for (unsigned i = 0; i < FIXED_BLOCKS; i++) assert_ok(llmem_fixed_free(p, blocks[i]));
    llmem_fixed_flush_thread_cache(p);
    llmem_fixed_stats fs;
    memset(&fs, 0, sizeof fs);
    assert_ok(llmem_fixed_get_stats(p, &fs));
    assert_int_equal(fs.blocks_in_use, 0);
    assert_true(fs.allocs_total >= FIXED_BLOCKS + FIXED_BLOCKS / 2);
    assert_true(test_sim_stats(r).used_bytes > 0);
    llmem_fixed_destroy(p);
    assert_int_equal(test_sim_stats(r).used_bytes, 0);
    assert_int_equal(test_sim_stats(r).bad_copies_total, 0);
    assert_int_equal(test_resource_stats(r).mappings, 0);
    llmem_resource_destroy(r);
}

TEST_CASE(fixed_pool_over_sim_plain, fixed_workload(false, false))
TEST_CASE(fixed_pool_over_sim_checked, fixed_workload(false, true))
TEST_CASE(fixed_pool_over_sim_thread_safe, fixed_workload(true, false))
TEST_CASE(fixed_pool_over_sim_thread_safe_checked, fixed_workload(true, true))

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(map_returns_aligned_device_memory),
        cmocka_unit_test(contains_is_true_only_inside_a_live_mapping),
        cmocka_unit_test(host_read_of_device_memory_faults),
        cmocka_unit_test(host_write_of_device_memory_faults),
        cmocka_unit_test(pages_are_closed_again_after_copies),
        cmocka_unit_test(copy_round_trips_host_device_host),
        cmocka_unit_test(copy_within_one_mapping_without_overlap),
        cmocka_unit_test(copy_past_the_end_of_a_mapping_is_refused),
        cmocka_unit_test(copy_straddling_two_mappings_is_refused),
        cmocka_unit_test(copy_with_a_host_range_running_into_device_memory_is_refused),
        cmocka_unit_test(overlapping_copies_are_refused),
        cmocka_unit_test(copy_touching_uncommitted_memory_is_refused),
        cmocka_unit_test(capacity_is_enforced),
        cmocka_unit_test(reservations_commit_against_capacity),
        cmocka_unit_test(decommitted_memory_comes_back_zeroed),
        cmocka_unit_test(unmap_with_wrong_pointer_or_size_is_refused),
        cmocka_unit_test(map_and_unmap_costs_are_charged),
        cmocka_unit_test(fill_option_fills_fresh_memory),
        cmocka_unit_test(granularity_option_is_checked_and_applied),
        cmocka_unit_test(options_default_and_create_arguments),
        cmocka_unit_test(sim_stats_refuse_other_resources),
        cmocka_unit_test(arena_over_sim_never_touches_device_memory),
        cmocka_unit_test(fixed_pool_over_sim_plain),
        cmocka_unit_test(fixed_pool_over_sim_checked),
        cmocka_unit_test(fixed_pool_over_sim_thread_safe),
        cmocka_unit_test(fixed_pool_over_sim_thread_safe_checked),
    };
    return cmocka_run_group_tests(tests, test_quiet_logs, NULL);
}
