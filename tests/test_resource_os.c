/*
 * test_resource_os.c - what is the os resource's own: fresh memory is
 * zero and gone after unmap, the kernel's refusals, ranges with holes,
 * reservations that fault until committed, decommit and resident memory,
 * populate, huge pages (THP and hugetlb), NUMA binding, mlock, the default
 * resource, memmove copies, the os statistics and caps. The contract every
 * resource keeps (alignment, exact statistics, argument checking, rounding)
 * is test_resource_conformance.c's, which runs it over os too.
 *
 * Counters are checked on freshly created os resources; the shared default
 * resource is only used for what is specific to it.
 */
#include <errno.h>
#include <limits.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include "test_util.h"

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)
#define GiB (MiB * 1024)

static size_t page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static llmem_resource *os_new(const llmem_os_options *o)
{
    llmem_resource *r = NULL;
    assert_ok(llmem_os_resource_create(o, &r));
    assert_non_null(r);
    return r;
}

static llmem_os_caps caps(void)
{
    llmem_os_caps c;
    assert_ok(llmem_os_get_caps(&c));
    return c;
}

/* Death-test bodies, run in a child by test_child_faults. */
static void touch_read(void *arg)
{
    volatile const char *p = arg;
    char c = *p;
    (void)c;
}

static void touch_write(void *arg) { *(volatile char *)arg = 1; }

/* AddressSanitizer replaces mlock() with a no-op that succeeds, so the
 * kernel's view of locked memory can only be checked without it. */
#ifdef TEST_ASAN
#define MLOCK_IS_REAL 0
#else
#define MLOCK_IS_REAL 1
#endif

/* Locked memory of this process (VmLck in /proc/self/status), bytes. */
static size_t vmlck_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * KiB;
}

static size_t count_nonzero(const unsigned char *p, size_t n, size_t step)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i += step) bad += p[i] != 0;
    return bad;
}

/* ---- mapping ------------------------------------------------------------- */

static void map_unmap_writes_first_and_last_byte(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = os_new(NULL);
    void *p = NULL;
    assert_ok(llmem_resource_map(r, 3 * pg - 100, 0, 0, &p));
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % pg, 0);
    unsigned char *b = p;
    /* The whole rounded size is usable, not just what was asked for. */
    b[0] = 0x11;
    b[3 * pg - 1] = 0x22;
    assert_int_equal(b[0], 0x11);
    assert_int_equal(b[3 * pg - 1], 0x22);
    assert_int_equal(b[pg], 0); /* fresh anonymous memory is zero */
    assert_int_equal(test_resource_stats(r).mapped_bytes, 3 * pg);
    /* unmap takes the size passed to map and rounds it the same way. */
    assert_ok(llmem_resource_unmap(r, p, 3 * pg - 100, 3 * pg));
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, 0);
    assert_int_equal(s.mappings, 0);
    assert_true(test_child_faults(touch_read, p)); /* really gone */
    llmem_resource_destroy(r);
}

/* ---- bad input ----------------------------------------------------------- */

static void map_of_more_than_the_address_space_is_enomem(void **state)
{
    (void)state;
    llmem_resource *r = os_new(NULL);
    /* Rounds fine, but no 64-bit machine has 2^62 bytes of user address space. */
    void *p = &p;
    llmem_error_clear();
    assert_status(llmem_resource_map(r, (size_t)1 << 62, 0, LLMEM_MAP_UNCOMMITTED, &p), LLMEM_ENOMEM);
    assert_null(p);
    assert_error_mentions("mmap");
    assert_int_equal(test_resource_stats(r).failures_total, 1);
    assert_int_equal(test_resource_stats(r).mapped_bytes, 0);
    llmem_resource_destroy(r);
}

static void unmap_twice_is_refused_and_counters_stay_right(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = os_new(NULL);
    void *p;
    assert_ok(llmem_resource_map(r, 4 * pg, 0, 0, &p));
    assert_ok(llmem_resource_unmap(r, p, 4 * pg, 4 * pg));
    /* The counters are the conformance suite's; the os's own check names why. */
    llmem_error_clear();
    assert_status(llmem_resource_unmap(r, p, 4 * pg, 4 * pg), LLMEM_EINVAL);
    assert_error_mentions("not (all) mapped");
    assert_int_equal(test_resource_stats(r).mapped_bytes, 0); /* not wrapped below zero */
    llmem_resource_destroy(r);
}

/* Four pages of our own whose upper two are unmapped: a range with a hole. */
static char *range_with_hole(int prot)
{
    const size_t pg = page();
    char *p = mmap(NULL, 4 * pg, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    assert_int_equal(munmap(p + 2 * pg, 2 * pg), 0);
    return p;
}

static void calls_on_a_range_with_a_hole_change_nothing(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = os_new(NULL);

    /* unmap must not take the mapped half. */
    char *p = range_with_hole(PROT_READ | PROT_WRITE);
    p[0] = 7;
    assert_status(llmem_resource_unmap(r, p, 4 * pg, 4 * pg), LLMEM_EINVAL);
    assert_int_equal(p[0], 7);
    assert_int_equal(munmap(p, 2 * pg), 0);

    /* commit must not open the mapped half. */
    p = range_with_hole(PROT_NONE);
    assert_status(llmem_resource_commit(r, p, 4 * pg), LLMEM_EINVAL);
    assert_true(test_child_faults(touch_read, p));
    assert_int_equal(munmap(p, 2 * pg), 0);

    /* decommit must not drop the mapped half's contents. */
    p = range_with_hole(PROT_READ | PROT_WRITE);
    p[0] = 9;
    p[pg] = 10;
    assert_status(llmem_resource_decommit(r, p, 4 * pg), LLMEM_EINVAL);
    assert_int_equal(p[0], 9);
    assert_int_equal(p[pg], 10);
    assert_int_equal(munmap(p, 2 * pg), 0);

    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.failures_total, 3);
    assert_int_equal(s.unmap_calls_total + s.commit_calls_total + s.decommit_calls_total, 0);
    assert_int_equal(s.committed_bytes, 0);
    llmem_resource_destroy(r);
}

static void create_rejects_invalid_options(void **state)
{
    (void)state;
    llmem_resource *r = (llmem_resource *)&r;
    assert_status(llmem_os_resource_create(NULL, NULL), LLMEM_EINVAL);

    llmem_os_options o = llmem_os_options_default();
    o.huge = (llmem_os_huge)3;
    assert_status(llmem_os_resource_create(&o, &r), LLMEM_EINVAL);
    assert_null(r);
    assert_error_mentions("huge page mode");
    o.huge = (llmem_os_huge)-1;
    r = (llmem_resource *)&r;
    assert_status(llmem_os_resource_create(&o, &r), LLMEM_EINVAL);
    assert_null(r);

    o = llmem_os_options_default();
    o.decommit = (llmem_os_decommit)2;
    r = (llmem_resource *)&r;
    assert_status(llmem_os_resource_create(&o, &r), LLMEM_EINVAL);
    assert_null(r);
    assert_error_mentions("decommit mode");
    o.decommit = (llmem_os_decommit)-7;
    assert_status(llmem_os_resource_create(&o, &r), LLMEM_EINVAL);
    assert_null(r);
}

/* ---- reservations, commit, decommit ---------------------------------------- */

static void uncommitted_mapping_faults_until_committed(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = os_new(NULL);
    char *p;
    assert_ok(llmem_resource_map(r, 16 * pg, 0, LLMEM_MAP_UNCOMMITTED, (void **)&p));
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, 16 * pg);
    assert_int_equal(s.committed_bytes, 0);
    assert_true(test_child_faults(touch_read, p));
    assert_true(test_child_faults(touch_write, p));
    assert_true(test_child_faults(touch_write, p + 16 * pg - 1));

    assert_ok(llmem_resource_commit(r, p + 4 * pg, 4 * pg));
    s = test_resource_stats(r);
    assert_int_equal(s.committed_bytes, 4 * pg);
    assert_int_equal(s.commit_calls_total, 1);
    memset(p + 4 * pg, 0x5C, 4 * pg);
    for (size_t i = 4 * pg; i < 8 * pg; i += 97) assert_int_equal((unsigned char)p[i], 0x5C);
    /* The committed range is usable from a child too (the control case),
     * the bytes on either side are not. */
    assert_false(test_child_faults(touch_write, p + 4 * pg));
    assert_false(test_child_faults(touch_read, p + 8 * pg - 1));
    assert_true(test_child_faults(touch_read, p + 4 * pg - 1));
    assert_true(test_child_faults(touch_write, p + 8 * pg));

    assert_ok(llmem_resource_decommit(r, p + 4 * pg, 4 * pg));
    s = test_resource_stats(r);
    assert_int_equal(s.committed_bytes, 0);
    assert_int_equal(s.decommit_calls_total, 1);
    assert_ok(llmem_resource_unmap(r, p, 16 * pg, 0));
    s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, 0);
    assert_int_equal(s.committed_peak_bytes, 4 * pg);
    llmem_resource_destroy(r);
}

static void decommit_returns_resident_memory(void **state)
{
    (void)state;
    const size_t pg = page(), size = 64 * MiB;
    llmem_resource *r = os_new(NULL);
    unsigned char *p;
    assert_ok(llmem_resource_map(r, size, 0, 0, (void **)&p));
    for (size_t off = 0; off < size; off += pg) p[off] = (unsigned char)((off / pg) | 1);
    size_t before = test_rss_bytes();
    assert_ok(llmem_resource_decommit(r, p, size));
    size_t after = test_rss_bytes();
    if (after + 48 * MiB > before)
        fail_msg("RSS went from %zu to %zu bytes; decommit of 64 MiB should drop it by 48 MiB or more", before,
                 after);
    assert_int_equal(test_resource_stats(r).committed_bytes, 0);
    /* Still mapped, and DONTNEED memory reads back as zero. */
    assert_int_equal(count_nonzero(p, size, pg), 0);
    assert_int_equal(p[size - 1], 0);
    /* Commit again and it is ordinary memory. */
    assert_ok(llmem_resource_commit(r, p, size));
    p[0] = 1;
    p[size - 1] = 2;
    assert_int_equal(p[0] + p[size - 1], 3);
    assert_int_equal(test_resource_stats(r).committed_bytes, size);
    assert_ok(llmem_resource_unmap(r, p, size, size));
    llmem_resource_destroy(r);
}

static void decommit_free_mode_keeps_memory_usable(void **state)
{
    (void)state;
    const size_t size = 4 * MiB;
    llmem_os_options o = llmem_os_options_default();
    o.decommit = LLMEM_OS_DECOMMIT_FREE;
    llmem_resource *r = os_new(&o);
    unsigned char *p;
    assert_ok(llmem_resource_map(r, size, 0, 0, (void **)&p));
    memset(p, 0x5A, size);
    assert_ok(llmem_resource_decommit(r, p, size));
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.committed_bytes, 0);
    assert_int_equal(s.decommit_calls_total, 1);
    assert_ok(llmem_resource_commit(r, p, size));
    memset(p, 0x33, size);
    for (size_t i = 0; i < size; i += 61) assert_int_equal(p[i], 0x33);
    assert_int_equal(p[size - 1], 0x33);
    assert_ok(llmem_resource_unmap(r, p, size, size));
    assert_int_equal(test_resource_stats(r).failures_total, 0);
    llmem_resource_destroy(r);
}

/* ---- populate ---------------------------------------------------------------- */

/* RSS growth over a map call, in bytes (0 if it shrank). */
static size_t rss_rise_of_map(llmem_resource *r, size_t size, unsigned flags, void **p)
{
    size_t before = test_rss_bytes();
    assert_ok(llmem_resource_map(r, size, 0, flags, p));
    size_t after = test_rss_bytes();
    return after > before ? after - before : 0;
}

static void populate_flag_prefaults_the_mapping(void **state)
{
    (void)state;
    const size_t size = 32 * MiB;
    llmem_resource *r = os_new(NULL);
    void *p;
    /* Control: a plain map costs address space, not resident memory. */
    size_t rise = rss_rise_of_map(r, size, 0, &p);
    if (rise > size / 4) fail_msg("a plain 32 MiB map raised RSS by %zu bytes", rise);
    assert_ok(llmem_resource_unmap(r, p, size, size));

    rise = rss_rise_of_map(r, size, LLMEM_MAP_POPULATE, &p);
    if (rise < size - size / 8 || rise > 2 * size)
        fail_msg("a populated 32 MiB map raised RSS by %zu bytes, expected about %zu", rise, size);
    assert_int_equal(count_nonzero(p, size, page()), 0); /* contents still zero */
    assert_ok(llmem_resource_unmap(r, p, size, size));
    llmem_resource_destroy(r);
}

static void populate_option_prefaults_every_committed_range(void **state)
{
    (void)state;
    const size_t size = 32 * MiB;
    llmem_os_options o = llmem_os_options_default();
    o.populate = true;
    llmem_resource *r = os_new(&o);
    void *p;
    size_t rise = rss_rise_of_map(r, size, 0, &p);
    if (rise < size - size / 8 || rise > 2 * size)
        fail_msg("a 32 MiB map with the populate option raised RSS by %zu bytes, expected about %zu", rise, size);
    assert_ok(llmem_resource_unmap(r, p, size, size));

    /* An uncommitted reservation costs nothing until committed; then it is
     * populated too. */
    rise = rss_rise_of_map(r, size, LLMEM_MAP_UNCOMMITTED, &p);
    if (rise > size / 4) fail_msg("an uncommitted 32 MiB reservation raised RSS by %zu bytes", rise);
    size_t before = test_rss_bytes();
    assert_ok(llmem_resource_commit(r, p, size));
    size_t after = test_rss_bytes();
    if (after < before + size - size / 8)
        fail_msg("committing 32 MiB with the populate option moved RSS from %zu to %zu", before, after);
    assert_ok(llmem_resource_unmap(r, p, size, size));
    llmem_resource_destroy(r);
}

/* ---- huge pages ------------------------------------------------------------ */

static void thp_mode_aligns_and_advises(void **state)
{
    (void)state;
    llmem_os_caps c = caps();
    if (!c.huge_page_size) {
        print_message("skipped: the kernel reports no huge page size\n");
        skip();
    }
    const size_t huge = c.huge_page_size, pg = page();
    /* Sizes that are not huge page multiples: recent kernels align those
     * that are on their own, so only these show the resource's doing. */
    const size_t big = 8 * MiB + pg, res_size = 4 * MiB + pg;
    llmem_os_options o = llmem_os_options_default();
    o.huge = LLMEM_OS_HUGE_THP;
    llmem_resource *r = os_new(&o);
    assert_int_equal(llmem_resource_granularity(r), pg); /* THP keeps normal granularity */

    unsigned char *p;
    assert_ok(llmem_resource_map(r, big, 0, 0, (void **)&p));
    assert_int_equal((uintptr_t)p % huge, 0);
    p[0] = 1;
    p[big - 1] = 2;
    uint64_t advised = test_os_stats(r).thp_advised_bytes_total;
    if (c.thp_available) assert_int_equal(advised, big);
    else print_message("note: THP is 'never' here; advice counted: %llu bytes\n", (unsigned long long)advised);

    /* Below one huge page: no advice. */
    void *small;
    assert_ok(llmem_resource_map(r, 64 * KiB, 0, 0, &small));
    assert_int_equal(test_os_stats(r).thp_advised_bytes_total, advised);

    /* A reservation is aligned at map time and advised when committed. */
    char *res;
    assert_ok(llmem_resource_map(r, res_size, 0, LLMEM_MAP_UNCOMMITTED, (void **)&res));
    assert_int_equal((uintptr_t)res % huge, 0);
    assert_int_equal(test_os_stats(r).thp_advised_bytes_total, advised);
    assert_ok(llmem_resource_commit(r, res, 4 * MiB));
    if (c.thp_available) assert_int_equal(test_os_stats(r).thp_advised_bytes_total, advised + 4 * MiB);
    res[4 * MiB - 1] = 3;

    assert_ok(llmem_resource_unmap(r, p, big, big));
    assert_ok(llmem_resource_unmap(r, small, 64 * KiB, 64 * KiB));
    assert_ok(llmem_resource_unmap(r, res, res_size, 4 * MiB));
    llmem_resource_destroy(r);

    /* Control: the default mode advises nothing. */
    r = os_new(NULL);
    assert_ok(llmem_resource_map(r, big, 0, 0, (void **)&p));
    assert_int_equal(test_os_stats(r).thp_advised_bytes_total, 0);
    assert_ok(llmem_resource_unmap(r, p, big, big));
    llmem_resource_destroy(r);
}

static bool hugetlb_overcommit_allowed(void)
{
    FILE *f = fopen("/proc/sys/vm/nr_overcommit_hugepages", "r");
    unsigned long n = 0;
    if (f) {
        if (fscanf(f, "%lu", &n) != 1) n = 0;
        fclose(f);
    }
    return n > 0;
}

static llmem_resource *hugetlb_resource(bool strict, llmem_os_caps *c)
{
    *c = caps();
    if (!c->huge_page_size) {
        print_message("skipped: the kernel reports no huge page size\n");
        return NULL;
    }
    llmem_os_options o = llmem_os_options_default();
    o.huge = LLMEM_OS_HUGE_HUGETLB;
    o.huge_strict = strict;
    llmem_resource *r = os_new(&o);
    llmem_resource_info info;
    assert_ok(llmem_resource_get_info(r, &info));
    assert_int_equal(info.granularity, c->huge_page_size);
    assert_int_equal(info.min_align, c->huge_page_size);
    return r;
}

/* hugetlb_resource for a case that needs huge pages free (with_free) or
 * none free and no overcommit: skipped, saying why, on another host. */
static llmem_resource *hugetlb_case(bool strict, bool with_free, llmem_os_caps *c)
{
    llmem_resource *r = hugetlb_resource(strict, c);
    if (!r) skip();
    if (!with_free && (c->hugetlb_free > 0 || hugetlb_overcommit_allowed())) {
        print_message("skipped: this host has huge pages free (%llu) or overcommit; see the next test\n",
                      (unsigned long long)c->hugetlb_free);
        llmem_resource_destroy(r);
        skip();
    }
    if (with_free && c->hugetlb_free == 0) {
        print_message("skipped: no huge pages are reserved on this host (HugePages_Free 0); the fallback and "
                      "ENOHUGE tests cover it\n");
        llmem_resource_destroy(r);
        skip();
    }
    return r;
}

/* One byte mapped through r: a whole huge page, aligned to it. */
static char *map_one_byte_huge(llmem_resource *r, size_t huge)
{
    char *p;
    assert_ok(llmem_resource_map(r, 1, 0, 0, (void **)&p));
    assert_int_equal((uintptr_t)p % huge, 0);
    return p;
}

/* r's hugetlb figures: bytes in huge pages now, fallbacks so far. */
static void expect_hugetlb(const llmem_resource *r, uint64_t bytes, uint64_t fallbacks)
{
    llmem_os_stats os = test_os_stats(r);
    assert_int_equal(os.hugetlb_bytes, bytes);
    assert_int_equal(os.hugetlb_fallbacks_total, fallbacks);
}

/* The huge page at p is memory: its first and last bytes hold what is written. */
static void write_both_ends(char *p, size_t huge)
{
    p[0] = 1;
    p[huge - 1] = 2;
    assert_int_equal(p[0] + p[huge - 1], 3);
}

static void hugetlb_strict_without_free_pages_is_enohuge(void **state)
{
    (void)state;
    llmem_os_caps c;
    llmem_resource *r = hugetlb_case(true, false, &c);
    for (unsigned flags = 0; flags <= LLMEM_MAP_UNCOMMITTED; flags += LLMEM_MAP_UNCOMMITTED) {
        void *p = &p;
        llmem_error_clear();
        assert_status(llmem_resource_map(r, 1, 0, flags, &p), LLMEM_ENOHUGE);
        assert_null(p);
        assert_error_mentions("nr_hugepages");
    }
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.failures_total, 2);
    assert_int_equal(s.mappings, 0);
    expect_hugetlb(r, 0, 0);
    llmem_resource_destroy(r);
}

static void hugetlb_without_free_pages_falls_back(void **state)
{
    (void)state;
    llmem_os_caps c;
    llmem_resource *r = hugetlb_case(false, false, &c);
    const size_t huge = c.huge_page_size;
    char *p = map_one_byte_huge(r, huge);
    expect_hugetlb(r, 0, 1);
    if (c.thp_available) assert_int_equal(test_os_stats(r).thp_advised_bytes_total, huge);
    assert_int_equal(test_resource_stats(r).mapped_bytes, huge); /* one granule: a whole huge page */
    assert_false(test_child_faults(touch_write, p + huge - 1));
    write_both_ends(p, huge);

    /* An uncommitted reservation falls back as well, and what it commits is
     * real memory (hugetlb address space with no huge page reserved behind
     * it would die of SIGBUS on first touch). */
    char *q;
    assert_ok(llmem_resource_map(r, 2 * huge, 0, LLMEM_MAP_UNCOMMITTED, (void **)&q));
    expect_hugetlb(r, 0, 2);
    assert_true(test_child_faults(touch_read, q));
    assert_ok(llmem_resource_commit(r, q, huge));
    assert_false(test_child_faults(touch_write, q));
    assert_false(test_child_faults(touch_write, q + huge - 1));
    q[0] = 5;
    assert_int_equal(q[0], 5);

    assert_ok(llmem_resource_unmap(r, p, 1, huge));
    assert_ok(llmem_resource_unmap(r, q, 2 * huge, huge));
    assert_int_equal(test_resource_stats(r).mapped_bytes, 0);
    llmem_resource_destroy(r);
}

static void hugetlb_with_free_pages_maps_huge_pages(void **state)
{
    (void)state;
    llmem_os_caps c;
    llmem_resource *r = hugetlb_case(true, true, &c);
    const size_t huge = c.huge_page_size;
    char *p = map_one_byte_huge(r, huge);
    expect_hugetlb(r, huge, 0);
    write_both_ends(p, huge);
    assert_ok(llmem_resource_decommit(r, p, huge));
    assert_ok(llmem_resource_commit(r, p, huge));
    p[0] = 3;
    assert_int_equal(p[0], 3);
    assert_ok(llmem_resource_unmap(r, p, huge, huge));
    assert_int_equal(test_os_stats(r).hugetlb_bytes, 0);
    llmem_resource_destroy(r);
}

/* ---- NUMA ------------------------------------------------------------------- */

static void numa_binding_to_node_zero(void **state)
{
    (void)state;
    llmem_os_caps c = caps();
    assert_true(c.numa_nodes >= 1);
    llmem_os_options o = llmem_os_options_default();
    o.numa_bind = true;
    o.numa_node = 0;
    llmem_resource *r = (llmem_resource *)&r;
    if (!c.numa_available) {
        print_message("note: libnuma or kernel NUMA support missing; checking the refusal\n");
        assert_status(llmem_os_resource_create(&o, &r), LLMEM_ENOTSUP);
        assert_null(r);
        assert_error_mentions("libnuma");
        return;
    }
    r = os_new(&o);
    char *p;
    assert_ok(llmem_resource_map(r, MiB, 0, 0, (void **)&p));
    assert_int_equal(test_os_stats(r).numa_bound_bytes_total, MiB);
    p[0] = 1;
    p[MiB - 1] = 2;
    char *q;
    assert_ok(llmem_resource_map(r, 2 * MiB, 0, LLMEM_MAP_UNCOMMITTED, (void **)&q));
    assert_int_equal(test_os_stats(r).numa_bound_bytes_total, 3 * MiB);
    assert_ok(llmem_resource_commit(r, q, MiB));
    q[0] = 3;
    assert_ok(llmem_resource_unmap(r, p, MiB, MiB));
    assert_ok(llmem_resource_unmap(r, q, 2 * MiB, MiB));
    assert_int_equal(test_os_stats(r).numa_bound_bytes_total, 3 * MiB); /* a counter: it stays */
    llmem_resource_destroy(r);
}

static void numa_binding_to_missing_nodes_is_enotsup(void **state)
{
    (void)state;
    llmem_os_caps c = caps();
    const int nodes[] = {9999, -1, c.numa_nodes, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
        llmem_os_options o = llmem_os_options_default();
        o.numa_bind = true;
        o.numa_node = nodes[i];
        llmem_resource *r = (llmem_resource *)&r;
        llmem_error_clear();
        assert_status(llmem_os_resource_create(&o, &r), LLMEM_ENOTSUP);
        assert_null(r);
        if (c.numa_available) assert_error_mentions("does not exist");
    }
}

/* ---- mlock ----------------------------------------------------------------- */

static void mlock_option_locks_committed_memory(void **state)
{
    (void)state;
    llmem_os_options o = llmem_os_options_default();
    o.mlock = true;
    llmem_resource *r = os_new(&o);
    size_t lck0 = vmlck_bytes();
    char *p = (char *)&p;
    llmem_status st = llmem_resource_map(r, 64 * KiB, 0, 0, (void **)&p);
    if (st == LLMEM_EPERM) {
        print_message("note: mlock refused here (RLIMIT_MEMLOCK); checking the refusal\n");
        assert_null(p);
        assert_error_mentions("RLIMIT_MEMLOCK");
        llmem_resource_stats s = test_resource_stats(r);
        assert_int_equal(s.mappings, 0);
        assert_int_equal(s.mapped_bytes, 0);
        assert_int_equal(s.failures_total, 1);
        assert_int_equal(test_os_stats(r).mlocked_bytes, 0);
        llmem_resource_destroy(r);
        return;
    }
    assert_ok(st);
    assert_int_equal(test_os_stats(r).mlocked_bytes, 64 * KiB);
    if (MLOCK_IS_REAL) assert_int_equal(vmlck_bytes() - lck0, 64 * KiB);
    p[0] = 1;

    assert_ok(llmem_resource_decommit(r, p, 16 * KiB));
    assert_int_equal(test_os_stats(r).mlocked_bytes, 48 * KiB);
    if (MLOCK_IS_REAL) assert_int_equal(vmlck_bytes() - lck0, 48 * KiB);
    assert_ok(llmem_resource_commit(r, p, 16 * KiB));
    assert_int_equal(test_os_stats(r).mlocked_bytes, 64 * KiB);

    /* Reservations are locked as they are committed. */
    char *q;
    assert_ok(llmem_resource_map(r, 64 * KiB, 0, LLMEM_MAP_UNCOMMITTED, (void **)&q));
    assert_int_equal(test_os_stats(r).mlocked_bytes, 64 * KiB);
    assert_ok(llmem_resource_commit(r, q, 32 * KiB));
    assert_int_equal(test_os_stats(r).mlocked_bytes, 96 * KiB);

    assert_ok(llmem_resource_unmap(r, p, 64 * KiB, 64 * KiB));
    assert_ok(llmem_resource_unmap(r, q, 64 * KiB, 32 * KiB));
    assert_int_equal(test_os_stats(r).mlocked_bytes, 0);
    if (MLOCK_IS_REAL) assert_int_equal(vmlck_bytes(), lck0);
    assert_int_equal(test_resource_stats(r).failures_total, 0);
    llmem_resource_destroy(r);
}

/* In a child: drop CAP_IPC_LOCK, set RLIMIT_MEMLOCK to 0, and check that
 * map and commit then fail with LLMEM_EPERM and leave nothing behind.
 * Returns 0 (as expected), 2 (could not set up) or the failed check's line. */
static int mlock_refused_child(void)
{
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) != 0) return 2;
    d[0].effective &= ~(1u << CAP_IPC_LOCK);
    d[0].permitted &= ~(1u << CAP_IPC_LOCK);
    d[0].inheritable &= ~(1u << CAP_IPC_LOCK);
    if (syscall(SYS_capset, &h, d) != 0) return 2;
    struct rlimit rl = {0, 0};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 2;
#define CHECK(cond)                                                  \
    do {                                                             \
        if (!(cond)) {                                               \
            fprintf(stderr, "child check failed: %s\n", #cond);     \
            return __LINE__;                                         \
        }                                                            \
    } while (0)
    llmem_os_options o = llmem_os_options_default();
    o.mlock = true;
    llmem_resource *r = NULL;
    CHECK(llmem_os_resource_create(&o, &r) == LLMEM_OK);
    void *p = &p;
    CHECK(llmem_resource_map(r, 64 * KiB, 0, 0, &p) == LLMEM_EPERM);
    CHECK(p == NULL);
    CHECK(strstr(llmem_error_message(), "RLIMIT_MEMLOCK") != NULL);
    llmem_resource_stats s;
    memset(&s, 0, sizeof s);
    llmem_os_stats os;
    memset(&os, 0, sizeof os);
    CHECK(llmem_resource_get_stats(r, &s) == LLMEM_OK && llmem_os_resource_get_stats(r, &os) == LLMEM_OK);
    CHECK(s.mappings == 0 && s.mapped_bytes == 0 && s.committed_bytes == 0 && s.failures_total == 1);
    CHECK(os.mlocked_bytes == 0);
    /* A commit that cannot lock stays uncommitted. */
    CHECK(llmem_resource_map(r, 64 * KiB, 0, LLMEM_MAP_UNCOMMITTED, &p) == LLMEM_OK);
    CHECK(llmem_resource_commit(r, p, 64 * KiB) == LLMEM_EPERM);
    CHECK(llmem_resource_get_stats(r, &s) == LLMEM_OK && llmem_os_resource_get_stats(r, &os) == LLMEM_OK);
    CHECK(s.committed_bytes == 0 && s.commit_calls_total == 0 && s.failures_total == 2);
    CHECK(os.mlocked_bytes == 0);
    CHECK(test_child_faults(touch_read, p));
    CHECK(llmem_resource_unmap(r, p, 64 * KiB, 0) == LLMEM_OK);
    llmem_resource_destroy(r);
#undef CHECK
    return 0;
}

static void mlock_past_the_limit_is_eperm_and_leaves_nothing(void **state)
{
    (void)state;
    if (!MLOCK_IS_REAL) {
        print_message("skipped: AddressSanitizer turns mlock() into a no-op that cannot fail\n");
        skip();
    }
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(mlock_refused_child());
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status)) fail_msg("child died (status 0x%x)", status);
    if (WEXITSTATUS(status) == 2) {
        print_message("skipped: could not drop CAP_IPC_LOCK or RLIMIT_MEMLOCK here\n");
        skip();
    }
    if (WEXITSTATUS(status) != 0) fail_msg("child check at line %d failed", WEXITSTATUS(status));
}

/* ---- the default resource, info, copy, round ------------------------------- */

static void default_resource_is_one_shared_host_resource(void **state)
{
    (void)state;
    llmem_resource *a = llmem_resource_default(), *b = llmem_resource_default();
    assert_non_null(a);
    assert_ptr_equal(a, b);
    assert_int_equal(llmem_resource_kind(a), LLMEM_MEM_HOST);
    assert_string_equal(llmem_resource_name(a), "os");
    llmem_resource_stats s0 = test_resource_stats(a);
    llmem_resource_destroy(a); /* a no-op */
    llmem_resource_destroy(NULL);
    assert_ptr_equal(llmem_resource_default(), a);
    void *p;
    assert_ok(llmem_resource_map(a, page(), 0, 0, &p));
    ((volatile char *)p)[0] = 1;
    assert_ok(llmem_resource_unmap(a, p, page(), page()));
    llmem_resource_stats s1 = test_resource_stats(a);
    assert_int_equal(s1.map_calls_total, s0.map_calls_total + 1);
    assert_int_equal(s1.unmap_calls_total, s0.unmap_calls_total + 1);
    /* It is an os resource. */
    llmem_os_stats os;
    memset(&os, 0, sizeof os);
    assert_ok(llmem_os_resource_get_stats(a, &os));
}

static void info_describes_the_host_resource(void **state)
{
    (void)state;
    llmem_resource *fresh = os_new(NULL);
    llmem_resource *both[2] = {fresh, llmem_resource_default()};
    for (int i = 0; i < 2; i++) {
        llmem_resource_info info;
        memset(&info, 0, sizeof info);
        assert_ok(llmem_resource_get_info(both[i], &info));
        assert_string_equal(info.name, "os");
        assert_int_equal(info.kind, LLMEM_MEM_HOST);
        assert_int_equal(info.granularity, page());
        assert_int_equal(info.min_align, page());
        assert_int_equal(info.max_align, GiB);
        assert_int_equal(info.max_align, LLMEM_MAX_ALIGN);
        unsigned want = LLMEM_RES_CAP_DECOMMIT | LLMEM_RES_CAP_RESERVE | LLMEM_RES_CAP_COPY;
        assert_int_equal(info.caps & want, want);
        assert_int_equal(llmem_resource_granularity(both[i]), page());
        assert_string_equal(llmem_resource_name(both[i]), "os");
    }
    llmem_resource_info info;
    assert_status(llmem_resource_get_info(NULL, &info), LLMEM_EINVAL);
    assert_status(llmem_resource_get_info(fresh, NULL), LLMEM_EINVAL);
    assert_string_equal(llmem_resource_name(NULL), "");
    assert_int_equal(llmem_resource_kind(NULL), LLMEM_MEM_HOST);
    assert_int_equal(llmem_resource_granularity(NULL), 0);
    llmem_resource_destroy(fresh);
}

static void name_option_names_the_resource(void **state)
{
    (void)state;
    llmem_os_options o = llmem_os_options_default();
    o.name = "weights";
    llmem_resource *r = os_new(&o);
    assert_string_equal(llmem_resource_name(r), "weights");
    void *p;
    llmem_error_clear();
    assert_status(llmem_resource_map(r, 0, 0, 0, &p), LLMEM_EINVAL);
    assert_error_mentions("'weights'");
    llmem_resource_destroy(r);

    /* A zero-initialised options struct means defaults, name included. */
    llmem_os_options zero;
    memset(&zero, 0, sizeof zero);
    r = os_new(&zero);
    assert_string_equal(llmem_resource_name(r), "os");
    llmem_resource_destroy(r);
    o.name = "";
    r = os_new(&o);
    assert_string_equal(llmem_resource_name(r), "os");
    llmem_resource_destroy(r);

    /* Long names are truncated, not overflowed. */
    char longname[200];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    o.name = longname;
    r = os_new(&o);
    assert_int_equal(strlen(llmem_resource_name(r)), 47);
    llmem_resource_destroy(r);
}

static void host_copy_has_memmove_semantics(void **state)
{
    (void)state;
    const size_t pg = page();
    llmem_resource *r = os_new(NULL);
    unsigned char *p;
    assert_ok(llmem_resource_map(r, 2 * pg, 0, 0, (void **)&p));
    for (int i = 0; i < 256; i++) p[i] = (unsigned char)i;
    /* Overlapping forwards. */
    assert_ok(llmem_resource_copy(r, p + 1, p, 255));
    assert_int_equal(p[0], 0);
    for (int i = 1; i < 256; i++) assert_int_equal(p[i], i - 1);
    /* Overlapping backwards. */
    for (int i = 0; i < 256; i++) p[i] = (unsigned char)i;
    assert_ok(llmem_resource_copy(r, p, p + 1, 255));
    for (int i = 0; i < 255; i++) assert_int_equal(p[i], i + 1);
    assert_int_equal(p[255], 255);
    /* Host memory that is not a mapping, across a page boundary. */
    unsigned char buf[300], back[300];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 7 + 3);
    assert_ok(llmem_resource_copy(r, p + pg - 100, buf, sizeof buf));
    assert_ok(llmem_resource_copy(r, back, p + pg - 100, sizeof back));
    assert_memory_equal(back, buf, sizeof buf);
    /* n == 0 is a no-op and not counted. */
    assert_ok(llmem_resource_copy(r, p, buf, 0));
    assert_int_equal(p[0], 1);
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.copy_calls_total, 4);
    assert_int_equal(s.copy_bytes_total, 255 + 255 + 300 + 300);
    assert_ok(llmem_resource_unmap(r, p, 2 * pg, 2 * pg));
    llmem_resource_destroy(r);
}

/* Rounding follows the granularity of the os resource's mode (the rest of
 * rounding is the conformance suite's). */
static void round_follows_the_huge_page_granularity(void **state)
{
    (void)state;
    size_t out = 0;
    llmem_resource *r;
    llmem_os_caps c = caps();
    if (c.huge_page_size) {
        llmem_os_options o = llmem_os_options_default();
        o.huge = LLMEM_OS_HUGE_HUGETLB;
        r = os_new(&o);
        assert_ok(llmem_resource_round(r, 1, &out));
        assert_int_equal(out, c.huge_page_size);
        llmem_resource_destroy(r);
    }
}

static void os_stats_refuse_other_resources(void **state)
{
    (void)state;
    llmem_resource *sim;
    assert_ok(llmem_sim_resource_create(NULL, &sim));
    llmem_os_stats s;
    memset(&s, 0, sizeof s);
    assert_status(llmem_os_resource_get_stats(sim, &s), LLMEM_EINVAL);
    assert_error_mentions("not an os resource");
    assert_status(llmem_os_resource_get_stats(NULL, &s), LLMEM_EINVAL);
    llmem_resource_destroy(sim);

    llmem_resource *r = os_new(NULL);
    assert_status(llmem_os_resource_get_stats(r, NULL), LLMEM_EINVAL);
    s = test_os_stats(r);
    assert_int_equal(s.struct_size, sizeof s);
    assert_int_equal(s.hugetlb_bytes + s.hugetlb_fallbacks_total + s.thp_advised_bytes_total + s.mlocked_bytes +
                         s.numa_bound_bytes_total,
                     0);
    /* An older, shorter struct is filled only as far as it goes. */
    memset(&s, 0xCD, sizeof s);
    s.struct_size = offsetof(llmem_os_stats, hugetlb_fallbacks_total);
    assert_ok(llmem_os_resource_get_stats(r, &s));
    assert_int_equal(s.struct_size, offsetof(llmem_os_stats, hugetlb_fallbacks_total));
    assert_int_equal(s.hugetlb_bytes, 0);
    const unsigned char *tail = (const unsigned char *)&s + offsetof(llmem_os_stats, hugetlb_fallbacks_total);
    for (size_t i = 0; i < sizeof s - offsetof(llmem_os_stats, hugetlb_fallbacks_total); i++)
        assert_int_equal(tail[i], 0xCD);
    const llmem_stats_schema *schema = llmem_os_stats_schema();
    assert_non_null(schema);
    assert_int_equal(schema->struct_size, sizeof(llmem_os_stats));
    llmem_resource_destroy(r);
}

static void caps_describe_this_host(void **state)
{
    (void)state;
    llmem_os_caps c = caps();
    assert_int_equal(c.page_size, page());
    if (c.huge_page_size) {
        assert_int_equal(c.huge_page_size & (c.huge_page_size - 1), 0);
        assert_true(c.huge_page_size > c.page_size);
    }
    assert_true(c.numa_nodes >= 1);
    if (!c.numa_available) assert_int_equal(c.numa_nodes, 1);
    assert_status(llmem_os_get_caps(NULL), LLMEM_EINVAL);
}

/* A caller unmapping with the sizes it asked map for (1 byte mapped, so 1
 * byte "committed") means the whole granule: nothing stays counted. */
static void unmap_rounds_the_committed_figure_like_the_size(void **state)
{
    (void)state;
    llmem_resource *r = os_new(NULL);
    void *p;
    assert_ok(llmem_resource_map(r, 1, 0, 0, &p));
    assert_int_equal(test_resource_stats(r).committed_bytes, page());
    assert_ok(llmem_resource_unmap(r, p, 1, 1));
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.committed_bytes, 0);
    assert_int_equal(s.mapped_bytes, 0);
    llmem_resource_destroy(r);
    /* The sim-device checks the figure against its commit bitmap. */
    llmem_resource *sim;
    assert_ok(llmem_sim_resource_create(NULL, &sim));
    assert_ok(llmem_resource_map(sim, 1, 0, 0, &p));
    assert_ok(llmem_resource_unmap(sim, p, 1, 1));
    assert_int_equal(test_sim_stats(sim).used_bytes, 0);
    llmem_resource_destroy(sim);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(map_unmap_writes_first_and_last_byte),
        cmocka_unit_test(map_of_more_than_the_address_space_is_enomem),
        cmocka_unit_test(unmap_twice_is_refused_and_counters_stay_right),
        cmocka_unit_test(unmap_rounds_the_committed_figure_like_the_size),
        cmocka_unit_test(calls_on_a_range_with_a_hole_change_nothing),
        cmocka_unit_test(create_rejects_invalid_options),
        cmocka_unit_test(uncommitted_mapping_faults_until_committed),
        cmocka_unit_test(decommit_returns_resident_memory),
        cmocka_unit_test(decommit_free_mode_keeps_memory_usable),
        cmocka_unit_test(populate_flag_prefaults_the_mapping),
        cmocka_unit_test(populate_option_prefaults_every_committed_range),
        cmocka_unit_test(thp_mode_aligns_and_advises),
        cmocka_unit_test(hugetlb_strict_without_free_pages_is_enohuge),
        cmocka_unit_test(hugetlb_without_free_pages_falls_back),
        cmocka_unit_test(hugetlb_with_free_pages_maps_huge_pages),
        cmocka_unit_test(numa_binding_to_node_zero),
        cmocka_unit_test(numa_binding_to_missing_nodes_is_enotsup),
        cmocka_unit_test(mlock_option_locks_committed_memory),
        cmocka_unit_test(mlock_past_the_limit_is_eperm_and_leaves_nothing),
        cmocka_unit_test(default_resource_is_one_shared_host_resource),
        cmocka_unit_test(info_describes_the_host_resource),
        cmocka_unit_test(name_option_names_the_resource),
        cmocka_unit_test(host_copy_has_memmove_semantics),
        cmocka_unit_test(round_follows_the_huge_page_granularity),
        cmocka_unit_test(os_stats_refuse_other_resources),
        cmocka_unit_test(caps_describe_this_host),
    };
    return cmocka_run_group_tests(tests, test_quiet_logs, NULL);
}
