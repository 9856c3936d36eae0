/*
 * resource_suite.c - the resource conformance suite (resource_suite.h).
 *
 * Each case is the contract of llmem/resource.h in terms every resource
 * shares: sizes as multiples of info.granularity, alignments from
 * info.min_align to info.max_align, reservations only with
 * LLMEM_RES_CAP_RESERVE, decommit only with LLMEM_RES_CAP_DECOMMIT, bytes
 * moved only by llmem_resource_copy. Where a case needs a capability the
 * stack lacks, it checks what the contract says instead (the refusal, or
 * the no-op) rather than skipping.
 */
#include "test_util.h"

#include "resource_suite.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

llmem_status test_stack_push(test_stack *s, llmem_status st, llmem_resource *const *r)
{
    if (st == LLMEM_OK) {
        if (s->n == TEST_STACK_MAX) fail_msg("a test stack holds at most %d resources", (int)TEST_STACK_MAX);
        s->r[s->n++] = *r;
    }
    return st;
}

typedef struct fx {
    const test_stack_def *def;
    test_stack s;
    llmem_resource *r; /* the top */
    llmem_resource_info info;
    size_t g;
    bool reserve, decommit;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (!f) return -1;
    f->def = *state;
    llmem_status st = f->def->build(&f->s, f->def->arg);
    if (st != LLMEM_OK || !f->s.n) {
        print_error("%s: building the stack: %s: %s\n", f->def->name, llmem_status_name(st), llmem_error_message());
        for (size_t i = f->s.n; i-- > 0;) llmem_resource_destroy(f->s.r[i]);
        free(f);
        return -1;
    }
    f->r = f->s.r[f->s.n - 1];
    if (llmem_resource_get_info(f->r, &f->info) != LLMEM_OK) {
        print_error("%s: get_info: %s\n", f->def->name, llmem_error_message());
        *state = f;
        return -1;
    }
    f->g = f->info.granularity;
    f->reserve = f->info.caps & LLMEM_RES_CAP_RESERVE;
    f->decommit = f->info.caps & LLMEM_RES_CAP_DECOMMIT;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    for (size_t i = f->s.n; i-- > 0;) llmem_resource_destroy(f->s.r[i]);
    free(f);
    return 0;
}

/* One byte into, or out of, a mapping: the only way to touch device memory. */
static void put(fx *f, void *dst, unsigned char v) { assert_ok(llmem_resource_copy(f->r, dst, &v, 1)); }

static unsigned char get(fx *f, const void *src)
{
    unsigned char v = 0;
    assert_ok(llmem_resource_copy(f->r, &v, src, 1));
    return v;
}

static void touch_read(void *arg)
{
    volatile const char *p = arg;
    char c = *p;
    (void)c;
}

/* ---- info ------------------------------------------------------------------- */

static void info_is_consistent(void **state)
{
    fx *f = *state;
    const llmem_resource_info *in = &f->info;
    assert_string_equal(in->name, f->def->name);
    assert_int_equal(in->kind, f->def->kind);
    assert_true(in->granularity && (in->granularity & (in->granularity - 1)) == 0);
    assert_true(in->min_align && (in->min_align & (in->min_align - 1)) == 0);
    assert_true(in->min_align <= in->max_align && in->max_align <= LLMEM_MAX_ALIGN);
    assert_string_equal(llmem_resource_name(f->r), in->name);
    assert_int_equal(llmem_resource_kind(f->r), in->kind);
    assert_int_equal(llmem_resource_granularity(f->r), in->granularity);
    llmem_resource_info info;
    assert_status(llmem_resource_get_info(NULL, &info), LLMEM_EINVAL);
    assert_status(llmem_resource_get_info(f->r, NULL), LLMEM_EINVAL);
    assert_string_equal(llmem_resource_name(NULL), "");
    assert_int_equal(llmem_resource_kind(NULL), LLMEM_MEM_HOST);
    assert_int_equal(llmem_resource_granularity(NULL), 0);
    /* An adaptor describes its upstream's memory: everything but the name. */
    if (f->s.n > 1) {
        llmem_resource_info base;
        assert_ok(llmem_resource_get_info(f->s.r[0], &base));
        assert_int_equal(in->kind, base.kind);
        assert_int_equal(in->granularity, base.granularity);
        assert_int_equal(in->min_align, base.min_align);
        assert_int_equal(in->max_align, base.max_align);
        assert_int_equal(in->caps, base.caps);
    }
}

/* ---- mapping ------------------------------------------------------------------ */

static void map_unmap_uses_the_whole_rounded_size(void **state)
{
    fx *f = *state;
    const size_t g = f->g, ask = 3 * g - (g > 100 ? 100 : 1);
    unsigned char *p = NULL;
    assert_ok(llmem_resource_map(f->r, ask, 0, 0, (void **)&p));
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % f->info.min_align, 0);
    /* The whole rounded size is usable, not just what was asked for. */
    put(f, p, 0x11);
    put(f, p + 3 * g - 1, 0x22);
    assert_int_equal(get(f, p), 0x11);
    assert_int_equal(get(f, p + 3 * g - 1), 0x22);
    assert_int_equal(test_resource_stats(f->r).mapped_bytes, 3 * g);
    /* unmap takes the size passed to map and rounds it the same way. */
    assert_ok(llmem_resource_unmap(f->r, p, ask, 3 * g));
    llmem_resource_stats s = test_resource_stats(f->r);
    assert_int_equal(s.mapped_bytes, 0);
    assert_int_equal(s.mappings, 0);
}

static void map_honours_alignment(void **state)
{
    fx *f = *state;
    const size_t g = f->g, aligns[] = {0, 4 * KiB, 64 * KiB, 2 * MiB, GiB};
    uint64_t maps = 0;
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        if (aligns[i] > f->info.max_align) continue;
        size_t want = aligns[i] > f->info.min_align ? aligns[i] : f->info.min_align;
        for (unsigned flags = 0; flags <= LLMEM_MAP_UNCOMMITTED; flags += LLMEM_MAP_UNCOMMITTED) {
            if ((flags & LLMEM_MAP_UNCOMMITTED) && !f->reserve) continue;
            unsigned char *p = NULL;
            assert_ok(llmem_resource_map(f->r, 2 * g, aligns[i], flags, (void **)&p));
            if ((uintptr_t)p % want != 0)
                fail_msg("align %zu (flags %u): %p is not a multiple of %zu", aligns[i], flags, (void *)p, want);
            if (flags & LLMEM_MAP_UNCOMMITTED) assert_ok(llmem_resource_commit(f->r, p, 2 * g));
            put(f, p, 1);
            put(f, p + 2 * g - 1, 2);
            assert_ok(llmem_resource_unmap(f->r, p, 2 * g, 2 * g));
            maps++;
        }
    }
    /* Alignment slack is trimmed, never counted: only the sizes asked for. */
    llmem_resource_stats s = test_resource_stats(f->r);
    assert_int_equal(s.mapped_bytes_total, maps * 2 * g);
    assert_int_equal(s.mapped_peak_bytes, 2 * g);
    assert_int_equal(s.mapped_bytes, 0);
}

/* Host -> mapping -> another mapping -> host: the bytes come back, at the
 * end of a mapping and across granules at odd offsets, the source of a
 * mapping-to-mapping copy is unchanged, and every copy is counted. */
static void copies_round_trip(void **state)
{
    fx *f = *state;
    const size_t g = f->g, sizes[] = {1, g + 3, 3 * g};
    unsigned char *a, *b, *in = malloc(3 * g), *out = malloc(3 * g);
    assert_non_null(in);
    assert_non_null(out);
    assert_ok(llmem_resource_map(f->r, 3 * g, 0, 0, (void **)&a));
    assert_ok(llmem_resource_map(f->r, 3 * g, 0, 0, (void **)&b));
    uint64_t bytes = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i], at = 3 * g - n, bt = (3 * g - n) / 2 | 1; /* a's end; b's middle, odd */
        if (bt + n > 3 * g) bt = 0;
        for (size_t k = 0; k < n; k++) in[k] = (unsigned char)(k * 131 + i * 7 + 1);
        memset(out, 0, n);
        assert_ok(llmem_resource_copy(f->r, a + at, in, n));
        assert_ok(llmem_resource_copy(f->r, b + bt, a + at, n));
        assert_ok(llmem_resource_copy(f->r, out, b + bt, n));
        assert_memory_equal(in, out, n);
        memset(out, 0, n);
        assert_ok(llmem_resource_copy(f->r, out, a + at, n)); /* the source is unchanged */
        assert_memory_equal(in, out, n);
        bytes += 4 * n;
    }
    /* n == 0 is a no-op and not counted. */
    assert_ok(llmem_resource_copy(f->r, b, in, 0));
    llmem_resource_stats s = test_resource_stats(f->r);
    assert_int_equal(s.copy_calls_total, 12);
    assert_int_equal(s.copy_bytes_total, bytes);
    assert_ok(llmem_resource_unmap(f->r, a, 3 * g, 3 * g));
    assert_ok(llmem_resource_unmap(f->r, b, 3 * g, 3 * g));
    free(in);
    free(out);
}

/* ---- statistics ------------------------------------------------------------------ */

static void stats_are_exact_over_a_sequence(void **state)
{
    fx *f = *state;
    const size_t g = f->g;
    llmem_resource *r = f->r;
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.struct_size, sizeof s);
    assert_int_equal(s.mapped_bytes + s.mapped_peak_bytes + s.mapped_bytes_total + s.committed_bytes +
                         s.committed_peak_bytes + s.mappings + s.map_calls_total + s.unmap_calls_total +
                         s.commit_calls_total + s.decommit_calls_total + s.copy_calls_total + s.copy_bytes_total +
                         s.failures_total,
                     0);
    if (!f->reserve || !f->decommit) {
        /* Always committed: commit is a no-op that counts nothing, decommit is refused. */
        char *a;
        assert_ok(llmem_resource_map(r, 3 * g - 1, 0, 0, (void **)&a));
        assert_ok(llmem_resource_commit(r, a, g));
        if (!f->decommit) assert_status(llmem_resource_decommit(r, a, g), LLMEM_ENOTSUP);
        s = test_resource_stats(r);
        assert_int_equal(s.mapped_bytes, 3 * g);
        assert_int_equal(s.committed_bytes, 3 * g);
        assert_int_equal(s.commit_calls_total, 0);
        assert_int_equal(s.failures_total, f->decommit ? 0 : 1);
        assert_ok(llmem_resource_unmap(r, a, 3 * g - 1, 3 * g));
        assert_int_equal(test_resource_stats(r).mapped_bytes, 0);
        return;
    }

    char *a, *b, *c;
    assert_ok(llmem_resource_map(r, 3 * g - 1, 0, 0, (void **)&a)); /* 3 granules, committed */
    s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, 3 * g);
    assert_int_equal(s.mapped_peak_bytes, 3 * g);
    assert_int_equal(s.mapped_bytes_total, 3 * g);
    assert_int_equal(s.committed_bytes, 3 * g);
    assert_int_equal(s.committed_peak_bytes, 3 * g);
    assert_int_equal(s.mappings, 1);
    assert_int_equal(s.map_calls_total, 1);

    assert_ok(llmem_resource_map(r, 5 * g, 0, LLMEM_MAP_UNCOMMITTED, (void **)&b)); /* 5 reserved */
    s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, 8 * g);
    assert_int_equal(s.mapped_peak_bytes, 8 * g);
    assert_int_equal(s.mapped_bytes_total, 8 * g);
    assert_int_equal(s.committed_bytes, 3 * g);
    assert_int_equal(s.committed_peak_bytes, 3 * g);
    assert_int_equal(s.mappings, 2);
    assert_int_equal(s.map_calls_total, 2);

    assert_ok(llmem_resource_commit(r, b + g, 2 * g));
    s = test_resource_stats(r);
    assert_int_equal(s.committed_bytes, 5 * g);
    assert_int_equal(s.committed_peak_bytes, 5 * g);
    assert_int_equal(s.commit_calls_total, 1);

    assert_ok(llmem_resource_decommit(r, a, g));
    s = test_resource_stats(r);
    assert_int_equal(s.committed_bytes, 4 * g);
    assert_int_equal(s.committed_peak_bytes, 5 * g);
    assert_int_equal(s.decommit_calls_total, 1);

    assert_ok(llmem_resource_copy(r, b + g, a + g, 100)); /* committed to committed */
    s = test_resource_stats(r);
    assert_int_equal(s.copy_calls_total, 1);
    assert_int_equal(s.copy_bytes_total, 100);

    assert_ok(llmem_resource_unmap(r, a, 3 * g - 1, 2 * g));
    s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, 5 * g);
    assert_int_equal(s.mapped_peak_bytes, 8 * g);
    assert_int_equal(s.committed_bytes, 2 * g);
    assert_int_equal(s.mappings, 1);
    assert_int_equal(s.unmap_calls_total, 1);

    assert_ok(llmem_resource_map(r, g, 0, 0, (void **)&c));
    s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, 6 * g);
    assert_int_equal(s.mapped_peak_bytes, 8 * g);
    assert_int_equal(s.mapped_bytes_total, 9 * g);
    assert_int_equal(s.committed_bytes, 3 * g);
    assert_int_equal(s.committed_peak_bytes, 5 * g);
    assert_int_equal(s.mappings, 2);
    assert_int_equal(s.map_calls_total, 3);

    assert_ok(llmem_resource_unmap(r, b, 5 * g, 2 * g));
    assert_ok(llmem_resource_unmap(r, c, g, g));
    s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, 0);
    assert_int_equal(s.committed_bytes, 0);
    assert_int_equal(s.mappings, 0);
    assert_int_equal(s.unmap_calls_total, 3);
    assert_int_equal(s.map_calls_total, 3);
    assert_int_equal(s.mapped_bytes_total, 9 * g);
    assert_int_equal(s.mapped_peak_bytes, 8 * g);
    assert_int_equal(s.committed_peak_bytes, 5 * g);
    assert_int_equal(s.commit_calls_total, 1);
    assert_int_equal(s.decommit_calls_total, 1);
    assert_int_equal(s.failures_total, 0);
}

static void stats_honour_a_short_struct_size(void **state)
{
    fx *f = *state;
    void *p;
    assert_ok(llmem_resource_map(f->r, f->g, 0, 0, &p));
    llmem_resource_stats s;
    memset(&s, 0xCD, sizeof s);
    s.struct_size = offsetof(llmem_resource_stats, mapped_bytes_total);
    assert_ok(llmem_resource_get_stats(f->r, &s));
    assert_int_equal(s.struct_size, offsetof(llmem_resource_stats, mapped_bytes_total));
    assert_int_equal(s.mapped_bytes, f->g);
    assert_int_equal(s.mapped_peak_bytes, f->g);
    const unsigned char *tail = (const unsigned char *)&s + offsetof(llmem_resource_stats, mapped_bytes_total);
    for (size_t i = 0; i < sizeof s - offsetof(llmem_resource_stats, mapped_bytes_total); i++)
        assert_int_equal(tail[i], 0xCD);
    assert_status(llmem_resource_get_stats(NULL, &s), LLMEM_EINVAL);
    assert_status(llmem_resource_get_stats(f->r, NULL), LLMEM_EINVAL);
    assert_ok(llmem_resource_unmap(f->r, p, f->g, f->g));
}

/* ---- bad input ------------------------------------------------------------------- */

static void map_rejects_null_resource_and_null_out(void **state)
{
    fx *f = *state;
    void *p = &p;
    llmem_error_clear();
    assert_status(llmem_resource_map(NULL, f->g, 0, 0, &p), LLMEM_EINVAL);
    assert_null(p);
    assert_error_mentions("null resource");
    p = &p;
    assert_status(llmem_resource_map_tagged(NULL, f->g, 0, 0, "tag", &p), LLMEM_EINVAL);
    assert_null(p);
    llmem_error_clear();
    assert_status(llmem_resource_map(f->r, f->g, 0, 0, NULL), LLMEM_EINVAL);
    assert_error_mentions("null out");
    llmem_resource_stats s = test_resource_stats(f->r);
    assert_int_equal(s.mapped_bytes, 0);
    assert_int_equal(s.mappings, 0);
    assert_int_equal(s.map_calls_total, 0);
    assert_int_equal(s.failures_total, 1); /* a resource was named: the refusal counts */
}

static void map_rejects_size_zero(void **state)
{
    fx *f = *state;
    void *p = &p;
    assert_status(llmem_resource_map(f->r, 0, 0, 0, &p), LLMEM_EINVAL);
    assert_null(p);
    assert_error_mentions("size 0");
    p = &p;
    assert_status(llmem_resource_map(f->r, 0, 0, LLMEM_MAP_UNCOMMITTED, &p), LLMEM_EINVAL);
    assert_null(p);
    assert_int_equal(test_resource_stats(f->r).failures_total, 2);
    assert_int_equal(test_resource_stats(f->r).mappings, 0);
}

static void map_rejects_sizes_that_overflow(void **state)
{
    fx *f = *state;
    const size_t sizes[] = {SIZE_MAX, SIZE_MAX / 2 + 1, SIZE_MAX - f->g + 2, (size_t)PTRDIFF_MAX};
    uint64_t refused = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (unsigned flags = 0; flags <= LLMEM_MAP_UNCOMMITTED; flags += LLMEM_MAP_UNCOMMITTED) {
            if ((flags & LLMEM_MAP_UNCOMMITTED) && !f->reserve) continue;
            void *p = &p;
            llmem_error_clear();
            assert_status(llmem_resource_map(f->r, sizes[i], 0, flags, &p), LLMEM_EOVERFLOW);
            assert_null(p);
            assert_error_mentions("overflow");
            refused++;
        }
    }
    llmem_resource_stats s = test_resource_stats(f->r);
    assert_int_equal(s.failures_total, refused);
    assert_int_equal(s.mapped_bytes, 0);
}

static void map_rejects_bad_alignments(void **state)
{
    fx *f = *state;
    const size_t aligns[] = {3, 48, 4097, 2 * GiB, (size_t)1 << 63, SIZE_MAX};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        void *p = &p;
        llmem_error_clear();
        assert_status(llmem_resource_map(f->r, f->g, aligns[i], 0, &p), LLMEM_EALIGN);
        assert_null(p);
        assert_error_mentions("alignment");
    }
    /* Small powers of two below min_align are fine: min_align covers them. */
    void *p;
    assert_ok(llmem_resource_map(f->r, f->g, 16, 0, &p));
    assert_int_equal((uintptr_t)p % f->info.min_align, 0);
    assert_ok(llmem_resource_unmap(f->r, p, f->g, f->g));
    assert_int_equal(test_resource_stats(f->r).failures_total, 6);
}

static void map_rejects_unknown_flags(void **state)
{
    fx *f = *state;
    const unsigned flags[] = {1u << 2, 1u << 31, LLMEM_MAP_UNCOMMITTED | LLMEM_MAP_POPULATE | (1u << 7)};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        void *p = &p;
        llmem_error_clear();
        assert_status(llmem_resource_map(f->r, f->g, 0, flags[i], &p), LLMEM_EINVAL);
        assert_null(p);
        assert_error_mentions("flags");
    }
    assert_int_equal(test_resource_stats(f->r).failures_total, 3);
    assert_int_equal(test_resource_stats(f->r).mappings, 0);
}

static void uncommitted_maps_need_the_reserve_cap(void **state)
{
    fx *f = *state;
    void *p = &p;
    if (f->reserve) {
        assert_ok(llmem_resource_map(f->r, 2 * f->g, 0, LLMEM_MAP_UNCOMMITTED, &p));
        assert_int_equal(test_resource_stats(f->r).committed_bytes, 0);
        assert_ok(llmem_resource_commit(f->r, p, f->g));
        put(f, p, 5);
        assert_int_equal(get(f, p), 5);
        assert_int_equal(test_resource_stats(f->r).committed_bytes, f->g);
        assert_ok(llmem_resource_unmap(f->r, p, 2 * f->g, f->g));
    } else {
        llmem_error_clear();
        assert_status(llmem_resource_map(f->r, 2 * f->g, 0, LLMEM_MAP_UNCOMMITTED, &p), LLMEM_EINVAL);
        assert_null(p);
        assert_error_mentions("cannot reserve");
    }
    llmem_resource_stats s = test_resource_stats(f->r);
    assert_int_equal(s.mappings, 0);
    assert_int_equal(s.committed_bytes, 0);
}

static void unmap_rejects_bad_arguments(void **state)
{
    fx *f = *state;
    const size_t g = f->g;
    llmem_resource *r = f->r;
    char *p;
    assert_ok(llmem_resource_map(r, 2 * g, 0, 0, (void **)&p));
    put(f, p, 42);
    assert_status(llmem_resource_unmap(NULL, p, 2 * g, 2 * g), LLMEM_EINVAL);
    assert_status(llmem_resource_unmap(r, NULL, 2 * g, 2 * g), LLMEM_EINVAL);
    assert_error_mentions("null pointer");
    assert_status(llmem_resource_unmap(r, p + 1, 2 * g, 2 * g), LLMEM_EINVAL);
    assert_error_mentions("granularity");
    assert_status(llmem_resource_unmap(r, p + g / 2, g, g), LLMEM_EINVAL);
    assert_status(llmem_resource_unmap(r, p, 0, 0), LLMEM_EINVAL);
    assert_error_mentions("size 0");
    assert_status(llmem_resource_unmap(r, p, 2 * g, 2 * g + 1), LLMEM_EINVAL);
    assert_error_mentions("committed");
    assert_status(llmem_resource_unmap(r, p, SIZE_MAX, 0), LLMEM_EOVERFLOW);
    void *top = (void *)(UINTPTR_MAX & ~(uintptr_t)(g - 1));
    assert_status(llmem_resource_unmap(r, top, 2 * g, 0), LLMEM_EOVERFLOW);
    assert_error_mentions("wraps");
    /* Nothing was unmapped or counted as unmapped. */
    assert_int_equal(get(f, p), 42);
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.failures_total, 7);
    assert_int_equal(s.mappings, 1);
    assert_int_equal(s.mapped_bytes, 2 * g);
    assert_int_equal(s.unmap_calls_total, 0);
    assert_ok(llmem_resource_unmap(r, p, 2 * g, 2 * g));
}

static void unmap_twice_is_refused_and_counters_stay_right(void **state)
{
    fx *f = *state;
    const size_t g = f->g;
    void *p, *q;
    assert_ok(llmem_resource_map(f->r, 4 * g, 0, 0, &p));
    assert_ok(llmem_resource_map(f->r, g, 0, 0, &q)); /* another mapping stays live throughout */
    assert_ok(llmem_resource_unmap(f->r, p, 4 * g, 4 * g));
    /* Refused: LLMEM_EINVAL from the resource, or LLMEM_EFOREIGN from an
     * adaptor that knows its mappings (tracking), with a message. */
    llmem_error_clear();
    llmem_status st = llmem_resource_unmap(f->r, p, 4 * g, 4 * g);
    if (st != LLMEM_EINVAL && st != LLMEM_EFOREIGN)
        fail_msg("a second unmap -> %s (%s), expected a refusal", llmem_status_name(st), llmem_error_message());
    assert_true(llmem_error_message()[0] != '\0');
    llmem_resource_stats s = test_resource_stats(f->r);
    assert_int_equal(s.mapped_bytes, g); /* not wrapped below zero */
    assert_int_equal(s.committed_bytes, g);
    assert_int_equal(s.mappings, 1);
    assert_int_equal(s.unmap_calls_total, 1);
    assert_int_equal(s.failures_total, 1);
    assert_ok(llmem_resource_unmap(f->r, q, g, g));
    assert_int_equal(test_resource_stats(f->r).mappings, 0);
}

static void commit_and_decommit_reject_bad_ranges(void **state)
{
    fx *f = *state;
    const size_t g = f->g;
    llmem_resource *r = f->r;
    char *p;
    assert_ok(llmem_resource_map(r, 4 * g, 0, f->reserve ? LLMEM_MAP_UNCOMMITTED : 0, (void **)&p));
    void *top = (void *)(UINTPTR_MAX & ~(uintptr_t)(g - 1));
    llmem_status (*const ops[2])(llmem_resource *, void *, size_t) = {llmem_resource_commit,
                                                                       llmem_resource_decommit};
    for (int i = 0; i < 2; i++) {
        assert_status(ops[i](NULL, p, g), LLMEM_EINVAL);
        assert_status(ops[i](r, NULL, g), LLMEM_EINVAL);
        assert_status(ops[i](r, p, 0), LLMEM_EINVAL);
        assert_status(ops[i](r, p + 1, g), LLMEM_EINVAL);
        assert_status(ops[i](r, p + g - 1, g), LLMEM_EINVAL);
        assert_status(ops[i](r, p, SIZE_MAX), LLMEM_EOVERFLOW);
        assert_status(ops[i](r, top, 2 * g), LLMEM_EOVERFLOW);
    }
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.failures_total, 12); /* the null-resource calls have no resource to count on */
    assert_int_equal(s.commit_calls_total, 0);
    assert_int_equal(s.decommit_calls_total, 0);
    assert_int_equal(s.committed_bytes, f->reserve ? 0 : 4 * g);
    /* Still uncommitted: host memory faults on a touch (device memory
     * always may; test_resource_sim.c checks the sim device's). */
    if (f->reserve && f->info.kind == LLMEM_MEM_HOST) assert_true(test_child_faults(touch_read, p));
    assert_ok(llmem_resource_unmap(r, p, 4 * g, f->reserve ? 0 : 4 * g));
}

static void copy_rejects_null_pointers(void **state)
{
    fx *f = *state;
    llmem_resource *r = f->r;
    char buf[16] = "abcdefghijklmno";
    char dst[16] = {0};
    assert_status(llmem_resource_copy(NULL, dst, buf, 4), LLMEM_EINVAL);
    assert_status(llmem_resource_copy(r, NULL, buf, 4), LLMEM_EINVAL);
    assert_error_mentions("null pointer");
    assert_status(llmem_resource_copy(r, dst, NULL, 4), LLMEM_EINVAL);
    assert_status(llmem_resource_copy(r, NULL, NULL, 4), LLMEM_EINVAL);
    assert_status(llmem_resource_copy(r, (void *)(UINTPTR_MAX - 8), buf, 16), LLMEM_EOVERFLOW);
    assert_status(llmem_resource_copy(r, dst, (void *)(UINTPTR_MAX - 8), 16), LLMEM_EOVERFLOW);
    /* n == 0 is a no-op, whatever the pointers. */
    assert_ok(llmem_resource_copy(r, NULL, NULL, 0));
    assert_ok(llmem_resource_copy(r, dst, buf, 0));
    for (size_t i = 0; i < sizeof dst; i++) assert_int_equal(dst[i], 0);
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.failures_total, 5);
    assert_int_equal(s.copy_calls_total, 0);
    assert_int_equal(s.copy_bytes_total, 0);
}

static void failures_total_counts_every_bad_call(void **state)
{
    fx *f = *state;
    const size_t g = f->g;
    llmem_resource *r = f->r;
    char *p, *q;
    assert_ok(llmem_resource_map(r, g, 0, 0, (void **)&p));
    uint64_t want = 0;
#define BAD(expr, st)                                            \
    do {                                                         \
        assert_status((expr), (st));                             \
        want++;                                                  \
        assert_int_equal(test_resource_stats(r).failures_total, want);        \
    } while (0)
    BAD(llmem_resource_map(r, 0, 0, 0, (void **)&q), LLMEM_EINVAL);
    BAD(llmem_resource_map(r, SIZE_MAX, 0, 0, (void **)&q), LLMEM_EOVERFLOW);
    BAD(llmem_resource_map(r, g, 3, 0, (void **)&q), LLMEM_EALIGN);
    BAD(llmem_resource_map(r, g, 0, 1u << 9, (void **)&q), LLMEM_EINVAL);
    BAD(llmem_resource_unmap(r, NULL, g, g), LLMEM_EINVAL);
    BAD(llmem_resource_unmap(r, p + 8, g, g), LLMEM_EINVAL);
    BAD(llmem_resource_unmap(r, p, 0, 0), LLMEM_EINVAL);
    BAD(llmem_resource_unmap(r, p, g, g + 1), LLMEM_EINVAL);
    BAD(llmem_resource_commit(r, p + 8, g), LLMEM_EINVAL);
    BAD(llmem_resource_decommit(r, p, 0), LLMEM_EINVAL);
    BAD(llmem_resource_copy(r, NULL, p, 1), LLMEM_EINVAL);
    BAD(llmem_resource_copy(r, p, NULL, 1), LLMEM_EINVAL);
#undef BAD
    /* Good calls in between do not count. */
    assert_ok(llmem_resource_copy(r, p + 1, p, 1));
    assert_ok(llmem_resource_unmap(r, p, g, g));
    assert_int_equal(test_resource_stats(r).failures_total, want);
}

static void round_rounds_up_and_detects_overflow(void **state)
{
    fx *f = *state;
    const size_t g = f->g;
    size_t out = 12345;
    assert_ok(llmem_resource_round(f->r, 1, &out));
    assert_int_equal(out, g);
    assert_ok(llmem_resource_round(f->r, g, &out));
    assert_int_equal(out, g);
    assert_ok(llmem_resource_round(f->r, g + 1, &out));
    assert_int_equal(out, 2 * g);
    assert_ok(llmem_resource_round(f->r, 0, &out));
    assert_int_equal(out, 0);
    size_t big = ((size_t)PTRDIFF_MAX + 1) - g; /* the largest size that rounds within ptrdiff_t */
    assert_ok(llmem_resource_round(f->r, big - 1, &out));
    assert_int_equal(out, big);
    const size_t bad[] = {SIZE_MAX, SIZE_MAX / 2 + 1, (size_t)PTRDIFF_MAX, big + 1, SIZE_MAX - g + 2};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        llmem_error_clear();
        assert_status(llmem_resource_round(f->r, bad[i], &out), LLMEM_EOVERFLOW);
        assert_error_mentions("overflows");
    }
    assert_status(llmem_resource_round(NULL, 1, &out), LLMEM_EINVAL);
    assert_status(llmem_resource_round(f->r, 1, NULL), LLMEM_EINVAL);
}

/* ---- the runner ---------------------------------------------------------------------- */

static const struct {
    const char *name;
    CMUnitTestFunction fn;
} cases[] = {
#define CASE(fn) {#fn, fn}
    CASE(info_is_consistent),
    CASE(map_unmap_uses_the_whole_rounded_size),
    CASE(map_honours_alignment),
    CASE(copies_round_trip),
    CASE(stats_are_exact_over_a_sequence),
    CASE(stats_honour_a_short_struct_size),
    CASE(map_rejects_null_resource_and_null_out),
    CASE(map_rejects_size_zero),
    CASE(map_rejects_sizes_that_overflow),
    CASE(map_rejects_bad_alignments),
    CASE(map_rejects_unknown_flags),
    CASE(uncommitted_maps_need_the_reserve_cap),
    CASE(unmap_rejects_bad_arguments),
    CASE(unmap_twice_is_refused_and_counters_stay_right),
    CASE(commit_and_decommit_reject_bad_ranges),
    CASE(copy_rejects_null_pointers),
    CASE(failures_total_counts_every_bad_call),
    CASE(round_rounds_up_and_detects_overflow),
#undef CASE
};

int test_resource_conformance(const test_stack_def *defs, size_t n)
{
    enum { NCASES = sizeof cases / sizeof cases[0] };
    struct CMUnitTest tests[NCASES];
    int failed = 0;
    for (size_t k = 0; k < n; k++) {
        for (size_t i = 0; i < NCASES; i++)
            tests[i] = (struct CMUnitTest){cases[i].name, cases[i].fn, setup, teardown, (void *)&defs[k]};
        print_message("[ STACK    ] %s (%s)\n", defs[k].name, defs[k].kind == LLMEM_MEM_DEVICE ? "device" : "host");
        failed += _cmocka_run_group_tests(defs[k].name, tests, NCASES, test_quiet_logs, NULL);
    }
    return failed;
}
