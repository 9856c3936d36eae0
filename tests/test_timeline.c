/*
 * test_timeline.c - the memory timeline: the HTML page's structure (one
 * SVG, escaped title, one table row per event, one chart point per kept
 * sample), decimation (never past max_samples, first and latest kept,
 * evenly spaced), no malloc while sampling, the edge cases (no sample, one,
 * all zero, huge values, the event ring overflowing), and bad input.
 *
 * With LLMEM_TIMELINE_OUT set, the demo test also writes its page there
 * (tests/timeline_render.sh renders it in headless Chromium).
 */
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <sys/stat.h>

#include "test_util.h"
#include "support/tmpdir.h"
#include "support/rng.h"

#if !defined(TEST_ASAN) && !defined(TEST_TSAN) && defined(__GLIBC__) &&                                    \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#define TEST_MALLINFO 1
#endif

static int setup_dir(void **state)
{
    (void)state;
    return test_tmpdir_make("timeline");
}

static void path_in_tmp(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", test_tmpdir(), name); }

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* The whole file, NUL-terminated; the caller frees. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0, len = strlen(needle);
    for (const char *p = strstr(hay, needle); p; p = strstr(p + len, needle)) n++;
    return n;
}

/* Points ("x,y" pairs) in every element whose class is cls, in all. */
static size_t points_of(const char *html, const char *cls)
{
    char key[64];
    snprintf(key, sizeof key, "class=\"%s\" points=\"", cls);
    size_t n = 0;
    for (const char *p = strstr(html, key); p; p = strstr(p, key)) {
        p += strlen(key);
        const char *end = strchr(p, '"');
        assert_non_null(end);
        for (const char *q = p; q < end; q++)
            if (*q == ',') n++;
        p = end;
    }
    return n;
}

static char *write_and_read(const llmem_timeline *t, const char *name, const char *title)
{
    char path[512];
    path_in_tmp(path, sizeof path, name);
    assert_ok(llmem_timeline_write_html(t, path, title));
    char tmp[520];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_false(exists(tmp)); /* renamed into place */
    return slurp(path);
}

static llmem_timeline_sample smp(uint64_t t_ms, llmem_stage st, uint64_t r, uint64_t c, uint64_t u, double kv)
{
    return (llmem_timeline_sample){t_ms * 1000000u, st, r, c, u, kv};
}

/* ---- the page ------------------------------------------------------------ */

static void page_structure(void **state)
{
    (void)state;
    llmem_timeline *t;
    assert_ok(llmem_timeline_create(0, &t));
    size_t known_kv = 0;
    for (uint64_t i = 0; i < 50; i++) {
        llmem_stage st = i < 10 ? LLMEM_STAGE_LOAD : i < 20 ? LLMEM_STAGE_PREFILL : LLMEM_STAGE_DECODE;
        double kv = i < 15 ? -1.0 : (double)i / 60.0;
        if (kv >= 0) known_kv++;
        llmem_timeline_sample s = smp(1000 + i * 7, st, 64u << 20, (32u + i) << 20, (16u + i / 2) << 20, kv);
        assert_ok(llmem_timeline_record(t, &s));
    }
    assert_ok(llmem_timeline_event(t, 1000000000ull, LLMEM_STAGE_LOAD, "reserve", "before prefill", 1, 2));
    assert_ok(llmem_timeline_event(t, 1100000000ull, LLMEM_STAGE_DECODE, "grow", "used > 85% & \"x\"", 2, 3));
    assert_ok(llmem_timeline_event(t, 1200000000ull, LLMEM_STAGE_DECODE, "grow", "<b>again</b>", 3, 4));
    assert_int_equal(llmem_timeline_sample_count(t), 50);
    assert_int_equal(llmem_timeline_event_count(t), 3);

    char *html = write_and_read(t, "page.html", "run <&> 'one'");
    assert_true(strncmp(html, "<!DOCTYPE html>", 15) == 0);
    assert_int_equal(count(html, "<svg "), 1);
    assert_int_equal(count(html, "</svg>"), 1);
    assert_true(strstr(html, "<svg ") < strstr(html, "</svg>"));
    assert_non_null(strstr(html, "</html>\n"));
    /* title escaped, in <title> and <h1> */
    assert_int_equal(count(html, "run &lt;&amp;&gt; &#39;one&#39;"), 2);
    assert_null(strstr(html, "<&>"));
    /* event text escaped; one row per event */
    assert_int_equal(count(html, "<tr class=\"ev\">"), 3);
    assert_non_null(strstr(html, "&lt;b&gt;again&lt;/b&gt;"));
    assert_non_null(strstr(html, "used &gt; 85% &amp; &quot;x&quot;"));
    assert_null(strstr(html, "<b>again"));
    /* one point per sample in each line, two more in each area */
    assert_int_equal(points_of(html, "line-reserved"), 50);
    assert_int_equal(points_of(html, "line-committed"), 50);
    assert_int_equal(points_of(html, "line-used"), 50);
    assert_int_equal(points_of(html, "area-reserved"), 52);
    assert_int_equal(points_of(html, "area-used"), 52);
    assert_int_equal(points_of(html, "line-kv"), known_kv);
    /* summary: the events by action, the peaks */
    assert_non_null(strstr(html, "1 reserve, 2 grow"));
    assert_non_null(strstr(html, "peak reserved <b>64 MiB</b>"));
    /* stage bands and event markers */
    assert_non_null(strstr(html, "<title>load: "));
    assert_non_null(strstr(html, "<title>prefill: "));
    assert_non_null(strstr(html, "<title>decode: "));
    assert_int_equal(count(html, "<g class=\"ev\">"), 3);
    /* no external resources */
    assert_null(strstr(html, "src=\"http"));
    assert_null(strstr(html, "href=\"http"));
    assert_null(strstr(html, "@import"));
    assert_null(strstr(html, "nan"));
    free(html);
    llmem_timeline_destroy(t);
}

/* An action name and text longer than their slots are cut, a UTF-8
 * character is never split, NULL action and text are fine. */
static void event_text_is_copied_and_truncated(void **state)
{
    (void)state;
    llmem_timeline *t;
    assert_ok(llmem_timeline_create(16, &t));
    char text[400];
    memset(text, 'a', sizeof text);
    /* "é" (2 bytes) straddling the cut at LLMEM_TIMELINE_TEXT_LEN - 1 */
    text[LLMEM_TIMELINE_TEXT_LEN - 2] = (char)0xc3;
    text[LLMEM_TIMELINE_TEXT_LEN - 1] = (char)0xa9;
    text[sizeof text - 1] = '\0';
    char action[100];
    memset(action, 'x', sizeof action);
    action[sizeof action - 1] = '\0';
    assert_ok(llmem_timeline_event(t, 5, LLMEM_STAGE_IDLE, action, text, 0, 0));
    assert_ok(llmem_timeline_event(t, 6, LLMEM_STAGE_IDLE, NULL, NULL, 10, 5));
    text[0] = 'Z'; /* copied, not referenced */
    llmem_timeline_sample s = smp(0, LLMEM_STAGE_IDLE, 1, 1, 1, -1);
    assert_ok(llmem_timeline_record(t, &s));
    char *html = write_and_read(t, "trunc.html", NULL);
    assert_non_null(strstr(html, "<title>llmem timeline</title>"));
    char want[LLMEM_TIMELINE_TEXT_LEN + 8];
    memset(want, 'a', LLMEM_TIMELINE_TEXT_LEN - 2);
    memcpy(want + LLMEM_TIMELINE_TEXT_LEN - 2, "</td>", 6);
    assert_non_null(strstr(html, want)); /* 158 'a's, the cut 'é' dropped */
    assert_null(strstr(html, "Zaaa"));
    char act[LLMEM_TIMELINE_ACTION_LEN + 8];
    memset(act, 'x', LLMEM_TIMELINE_ACTION_LEN - 1);
    memcpy(act + LLMEM_TIMELINE_ACTION_LEN - 1, "</span>", 8);
    assert_non_null(strstr(html, act));
    assert_non_null(strstr(html, ">event</span>"));
    assert_int_equal(count(html, "<tr class=\"ev\">"), 2);
    free(html);
    llmem_timeline_destroy(t);
}

/* ---- decimation ---------------------------------------------------------- */

static void check_decimation(size_t cap, uint64_t total)
{
    llmem_timeline *t;
    assert_ok(llmem_timeline_create(cap, &t));
    for (uint64_t i = 0; i < total; i++) {
        llmem_timeline_sample s = {i * 1000, LLMEM_STAGE_DECODE, i, i, i, 0.5};
        assert_ok(llmem_timeline_record(t, &s));
        size_t n = llmem_timeline_sample_count(t);
        if (n > cap) fail_msg("cap %zu: %zu samples kept after %llu", cap, n, (unsigned long long)i + 1);
        llmem_timeline_sample first, last;
        assert_ok(llmem_timeline_get_sample(t, 0, &first));
        assert_ok(llmem_timeline_get_sample(t, n - 1, &last));
        if (first.used_bytes != 0 || last.used_bytes != i)
            fail_msg("cap %zu after %llu: first %llu, last %llu", cap, (unsigned long long)i + 1,
                     (unsigned long long)first.used_bytes, (unsigned long long)last.used_bytes);
    }
    /* evenly spaced in sample count, but for the latest */
    size_t n = llmem_timeline_sample_count(t);
    if (total >= cap && cap >= 3) assert_true(n >= cap / 2);
    uint64_t stride = 0;
    for (size_t i = 1; i + 1 < n; i++) {
        llmem_timeline_sample a, b;
        assert_ok(llmem_timeline_get_sample(t, i - 1, &a));
        assert_ok(llmem_timeline_get_sample(t, i, &b));
        if (i == 1) stride = b.used_bytes - a.used_bytes;
        if (b.used_bytes - a.used_bytes != stride) fail_msg("cap %zu: uneven spacing at %zu", cap, i);
        assert_true(b.time_ns > a.time_ns);
    }
    /* what is drawn is what is kept */
    char name[64];
    snprintf(name, sizeof name, "decim-%zu.html", cap);
    char *html = write_and_read(t, name, "decimated");
    assert_int_equal(points_of(html, "line-used"), n);
    assert_int_equal(points_of(html, "line-kv"), n);
    assert_int_equal(count(html, "<svg "), 1);
    free(html);
    llmem_timeline_destroy(t);
}

static void decimation_keeps_first_and_last(void **state)
{
    (void)state;
    static const size_t caps[] = {2, 3, 4, 5, 7, 16, 100};
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++)
        for (uint64_t total = 1; total < 300; total += 37) check_decimation(caps[c], total);
    check_decimation(1000, 100000);
    check_decimation(2, 5000);
}

/* The default keeps 100000 and halves on the next. */
static void decimation_default_capacity(void **state)
{
    (void)state;
    llmem_timeline *t;
    assert_ok(llmem_timeline_create(0, &t));
    llmem_timeline_sample s = smp(0, LLMEM_STAGE_DECODE, 1, 1, 1, -1);
    for (uint64_t i = 0; i < LLMEM_TIMELINE_DEFAULT_SAMPLES; i++) {
        s.time_ns = i;
        assert_ok(llmem_timeline_record(t, &s));
    }
    assert_int_equal(llmem_timeline_sample_count(t), LLMEM_TIMELINE_DEFAULT_SAMPLES);
    s.time_ns++;
    assert_ok(llmem_timeline_record(t, &s));
    size_t n = llmem_timeline_sample_count(t);
    assert_true(n <= LLMEM_TIMELINE_DEFAULT_SAMPLES / 2 + 2);
    llmem_timeline_sample last;
    assert_ok(llmem_timeline_get_sample(t, n - 1, &last));
    assert_int_equal(last.time_ns, LLMEM_TIMELINE_DEFAULT_SAMPLES);
    llmem_timeline_destroy(t);
}

/* Sampling and events after create call no malloc. */
static void sampling_takes_no_malloc(void **state)
{
    (void)state;
#ifndef TEST_MALLINFO
    print_message("skipped: mallinfo2 does not see the allocator under a sanitizer (or without glibc 2.33)\n");
    skip();
#else
    llmem_timeline *t;
    assert_ok(llmem_timeline_create(1000, &t));
    char text[64];
    struct mallinfo2 before = mallinfo2();
    for (uint64_t i = 0; i < 100000; i++) {
        llmem_timeline_sample s = {i * 1000, (llmem_stage)(i / 100 % 4), i, i, i, (double)(i % 100) / 100};
        llmem_status st = llmem_timeline_record(t, &s);
        if (st) fail_msg("sample %llu: %s", (unsigned long long)i, llmem_status_name(st));
        if (i % 10 == 0) {
            snprintf(text, sizeof text, "event %llu", (unsigned long long)i);
            st = llmem_timeline_event(t, i * 1000, s.stage, i % 20 ? "grow" : "shrink", text, i, i + 1);
            if (st) fail_msg("event %llu: %s", (unsigned long long)i, llmem_status_name(st));
        }
    }
    struct mallinfo2 after = mallinfo2();
    if (after.uordblks != before.uordblks || after.hblks != before.hblks)
        fail_msg("malloc moved across 100000 samples: in use %zu -> %zu bytes, mmapped %zu -> %zu",
                 before.uordblks, after.uordblks, before.hblks, after.hblks);
    assert_true(llmem_timeline_sample_count(t) <= 1000);
    assert_int_equal(llmem_timeline_event_count(t), LLMEM_TIMELINE_MAX_EVENTS);
    assert_int_equal(llmem_timeline_events_total(t), 10000);
    llmem_timeline_destroy(t);
#endif
}

/* ---- edge cases ---------------------------------------------------------- */

static void no_samples(void **state)
{
    (void)state;
    llmem_timeline *t;
    assert_ok(llmem_timeline_create(0, &t));
    char *html = write_and_read(t, "empty.html", "nothing");
    assert_true(strncmp(html, "<!DOCTYPE html>", 15) == 0);
    assert_non_null(strstr(html, "No samples were recorded"));
    assert_null(strstr(html, "<svg"));
    assert_non_null(strstr(html, "No events were recorded"));
    free(html);
    /* events alone are still listed */
    assert_ok(llmem_timeline_event(t, 7, LLMEM_STAGE_IDLE, "shrink", "idle", 2u << 30, 1u << 30));
    html = write_and_read(t, "empty-events.html", "nothing");
    assert_null(strstr(html, "<svg"));
    assert_int_equal(count(html, "<tr class=\"ev\">"), 1);
    assert_non_null(strstr(html, "2 GiB \xe2\x86\x92 1 GiB"));
    free(html);
    llmem_timeline_destroy(t);
}

static void one_sample_all_zero(void **state)
{
    (void)state;
    llmem_timeline *t;
    assert_ok(llmem_timeline_create(0, &t));
    llmem_timeline_sample s = smp(123456, LLMEM_STAGE_IDLE, 0, 0, 0, 0.0);
    assert_ok(llmem_timeline_record(t, &s));
    assert_ok(llmem_timeline_event(t, 1, LLMEM_STAGE_IDLE, "stage", "before the first sample", 0, 0));
    char *html = write_and_read(t, "one.html", "one");
    assert_int_equal(count(html, "<svg "), 1);
    assert_int_equal(points_of(html, "line-used"), 1);
    assert_int_equal(count(html, "<circle class=\"dot-used\""), 1);
    assert_non_null(strstr(html, "Duration <b>0</b>"));
    assert_non_null(strstr(html, ", used <b>0 B</b>"));
    assert_non_null(strstr(html, "<title>idle: "));
    assert_non_null(strstr(html, ">-123.456 s<")); /* the event, before t = 0 */
    assert_null(strstr(html, "nan"));
    assert_null(strstr(html, "inf"));
    free(html);
    llmem_timeline_destroy(t);
}

static void huge_values(void **state)
{
    (void)state;
    llmem_timeline *t;
    assert_ok(llmem_timeline_create(0, &t));
    for (uint64_t i = 0; i < 10; i++) {
        llmem_timeline_sample s = {UINT64_MAX - 10 + i, LLMEM_STAGE_DECODE, UINT64_MAX, UINT64_MAX / 2,
                                   UINT64_MAX / 4 * i / 10, 2.5};
        assert_ok(llmem_timeline_record(t, &s));
    }
    assert_ok(llmem_timeline_event(t, UINT64_MAX, LLMEM_STAGE_DECODE, "grow", "", 0, UINT64_MAX));
    char *html = write_and_read(t, "huge.html", "huge");
    assert_int_equal(points_of(html, "line-reserved"), 10);
    assert_non_null(strstr(html, "16 EiB"));
    assert_null(strstr(html, "nan"));
    assert_null(strstr(html, "inf"));
    free(html);
    llmem_timeline_destroy(t);
    /* one sample at the end of the clock: the nominal second past it */
    assert_ok(llmem_timeline_create(0, &t));
    llmem_timeline_sample s = {UINT64_MAX, LLMEM_STAGE_PREFILL, UINT64_MAX, 1, 0, 1.0};
    assert_ok(llmem_timeline_record(t, &s));
    html = write_and_read(t, "huge-one.html", "huge");
    assert_non_null(strstr(html, "<title>prefill: "));
    assert_int_equal(points_of(html, "line-kv"), 1);
    free(html);
    llmem_timeline_destroy(t);
}

/* A sample earlier than the previous one is taken at the previous time. */
static void time_never_goes_back(void **state)
{
    (void)state;
    llmem_timeline *t;
    assert_ok(llmem_timeline_create(8, &t));
    llmem_timeline_sample s = smp(10, LLMEM_STAGE_DECODE, 1, 1, 1, -1);
    assert_ok(llmem_timeline_record(t, &s));
    s.time_ns = 5;
    assert_ok(llmem_timeline_record(t, &s));
    llmem_timeline_sample g;
    assert_ok(llmem_timeline_get_sample(t, 1, &g));
    assert_int_equal(g.time_ns, 10u * 1000000u);
    assert_status(llmem_timeline_get_sample(t, 2, &g), LLMEM_ERANGE);
    llmem_timeline_destroy(t);
}

static void event_ring_overflows(void **state)
{
    (void)state;
    llmem_timeline *t;
    assert_ok(llmem_timeline_create(0, &t));
    llmem_timeline_sample s = smp(0, LLMEM_STAGE_DECODE, 1u << 20, 1u << 20, 1u << 19, 0.5);
    assert_ok(llmem_timeline_record(t, &s));
    for (int i = 0; i < 5000; i++) {
        char action[16];
        snprintf(action, sizeof action, "a%d", i % 20); /* 20 actions: 4 past the table */
        assert_ok(llmem_timeline_event(t, (uint64_t)i * 1000, LLMEM_STAGE_DECODE, action, "x", 1, 2));
    }
    s.time_ns = 5000000;
    assert_ok(llmem_timeline_record(t, &s));
    assert_int_equal(llmem_timeline_event_count(t), LLMEM_TIMELINE_MAX_EVENTS);
    assert_int_equal(llmem_timeline_events_total(t), 5000);
    char *html = write_and_read(t, "ring.html", "ring");
    assert_int_equal(count(html, "<tr class=\"ev\">"), LLMEM_TIMELINE_MAX_EVENTS);
    assert_non_null(strstr(html, "The oldest 904 events were dropped"));
    assert_non_null(strstr(html, "250 a0,"));
    assert_non_null(strstr(html, ", 1000 other"));
    free(html);
    llmem_timeline_destroy(t);
}

/* More stage changes than the ring keeps: the newest are drawn from it,
 * the stretch before from the kept samples, and the page says so. */
static void stage_change_ring_overflows(void **state)
{
    (void)state;
    llmem_timeline *t;
    assert_ok(llmem_timeline_create(64, &t));
    for (uint64_t i = 0; i < 20000; i++) {
        llmem_timeline_sample s = {i * 1000000, (llmem_stage)(i / 2 % 4), 100, 50, 25, -1};
        assert_ok(llmem_timeline_record(t, &s));
    }
    char *html = write_and_read(t, "bands.html", "bands");
    size_t bands = count(html, "<g class=\"band\">");
    assert_true(bands >= 8192);
    assert_true(bands < 8192 + 64);
    assert_non_null(strstr(html, "Stage bands before the oldest"));
    assert_null(strstr(html, "class=\"line-kv\""));
    free(html);
    llmem_timeline_destroy(t);
}

/* ---- bad input ----------------------------------------------------------- */

static void bad_input(void **state)
{
    (void)state;
    llmem_timeline *t;
    assert_status(llmem_timeline_create(0, NULL), LLMEM_EINVAL);
    assert_status(llmem_timeline_create(1, &t), LLMEM_EINVAL);
    assert_null(t);
    assert_status(llmem_timeline_create(SIZE_MAX / 2, &t), LLMEM_EOVERFLOW);
    llmem_timeline_destroy(NULL);
    assert_ok(llmem_timeline_create(4, &t));
    llmem_timeline_sample s = smp(0, LLMEM_STAGE_IDLE, 0, 0, 0, -1);
    assert_status(llmem_timeline_record(NULL, &s), LLMEM_EINVAL);
    assert_status(llmem_timeline_record(t, NULL), LLMEM_EINVAL);
    s.stage = LLMEM_STAGE_COUNT_;
    assert_status(llmem_timeline_record(t, &s), LLMEM_EINVAL);
    assert_status(llmem_timeline_event(NULL, 0, LLMEM_STAGE_IDLE, "x", "y", 0, 0), LLMEM_EINVAL);
    assert_status(llmem_timeline_event(t, 0, (llmem_stage)9, "x", "y", 0, 0), LLMEM_EINVAL);
    assert_status(llmem_timeline_write_html(NULL, "/tmp/x.html", "x"), LLMEM_EINVAL);
    assert_status(llmem_timeline_write_html(t, NULL, "x"), LLMEM_EINVAL);
    assert_status(llmem_timeline_write_html(t, "", "x"), LLMEM_EINVAL);
    assert_status(llmem_timeline_get_sample(NULL, 0, &s), LLMEM_EINVAL);
    assert_status(llmem_timeline_get_sample(t, 0, NULL), LLMEM_EINVAL);
    assert_status(llmem_timeline_get_sample(t, 0, &s), LLMEM_ERANGE);
    assert_int_equal(llmem_timeline_sample_count(NULL), 0);
    assert_int_equal(llmem_timeline_sample_count(t), 0);

    /* a folder that does not exist */
    char path[512];
    path_in_tmp(path, sizeof path, "no-such-dir/page.html");
    assert_status(llmem_timeline_write_html(t, path, "x"), LLMEM_EIO);
    assert_error_mentions(path);
    assert_error_mentions(strerror(ENOENT));
    assert_false(exists(path));
    /* a path that is a folder: the page is written, the rename fails, and
     * the temporary file goes */
    path_in_tmp(path, sizeof path, "a-dir");
    assert_int_equal(mkdir(path, 0700), 0);
    char tmp[520];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_status(llmem_timeline_write_html(t, path, "x"), LLMEM_EIO);
    assert_error_mentions(path);
    assert_false(exists(tmp));
    llmem_timeline_destroy(t);
}

/* ---- the demo page ------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double rnd(void) { return test_rng_unit(&rng_state); } /* in [0, 1) */

#define MiB (1024.0 * 1024.0)

/* A serving run as the controller would draw it: load, two bursts of
 * requests with prefills and decodes, idle shrinks between. */
static void build_demo(llmem_timeline *t)
{
    double reserved = 0, committed = 0, used = 0, kv = -1;
    double grow = 32 * MiB;
    uint64_t now = 0;
    const uint64_t step = 4000000; /* 4 ms */
    llmem_stage stage = LLMEM_STAGE_IDLE;
#define EV(action, text, b, a)                                                                                 \
    assert_ok(llmem_timeline_event(t, now, stage, action, text, (uint64_t)(b), (uint64_t)(a)))
#define SAMPLE()                                                                                               \
    do {                                                                                                       \
        llmem_timeline_sample s_ = {now, stage, (uint64_t)reserved, (uint64_t)committed, (uint64_t)used, kv}; \
        assert_ok(llmem_timeline_record(t, &s_));                                                              \
        now += step;                                                                                           \
    } while (0)
    for (int i = 0; i < 25; i++) SAMPLE();
    stage = LLMEM_STAGE_LOAD;
    EV("stage", "load: 18.0 MiB of weights mapped", committed, committed);
    for (int i = 0; i < 40; i++) {
        reserved = committed = 64 * MiB;
        used = 18 * MiB * (i + 1) / 40 + 2 * MiB;
        SAMPLE();
    }
    stage = LLMEM_STAGE_IDLE;
    for (int i = 0; i < 60; i++) SAMPLE();
    for (int burst = 0; burst < 2; burst++) {
        int prefills = burst ? 5 : 4;
        double kv_cap = 256 * MiB, kv_used = 0;
        kv = 0;
        for (int p = 0; p < prefills; p++) {
            stage = LLMEM_STAGE_PREFILL;
            double need = (90 + 40 * rnd()) * MiB;
            if (committed - used < need) {
                double b = committed;
                reserved = committed = used + need * 1.2 + 16 * MiB;
                EV("reserve", "before prefill: predicted activations x 1.2", b, committed);
            }
            double base = used;
            for (int i = 0; i < 6; i++) {
                used = base + need * (0.6 + 0.4 * rnd());
                kv_used += 3 * MiB;
                kv = kv_used / kv_cap;
                SAMPLE();
            }
            used = base + 6 * MiB;
            stage = LLMEM_STAGE_DECODE;
            int steps = 50 + (int)(60 * rnd());
            for (int i = 0; i < steps; i++) {
                used += 0.35 * MiB * (p + 1) + 0.2 * MiB * rnd();
                kv_used += 0.35 * MiB * (p + 1);
                if (kv_used > kv_cap * 0.97) kv_cap *= 1.5;
                kv = kv_used / kv_cap;
                if (used > 0.85 * committed) {
                    double b = committed;
                    committed += grow;
                    if (committed > reserved) reserved = committed;
                    char why[80];
                    snprintf(why, sizeof why, "used %.0f%% > high watermark 85%%", 100 * used / b);
                    EV("grow", why, b, committed);
                    grow *= 2;
                    if (grow > 128 * MiB) grow = 128 * MiB;
                }
                SAMPLE();
            }
        }
        /* requests finish one by one, then idle */
        for (int i = 0; i < 60; i++) {
            used -= (used - 20 * MiB) * 0.06;
            kv = kv * 0.94;
            SAMPLE();
        }
        stage = LLMEM_STAGE_IDLE;
        kv = 0;
        used = 20 * MiB;
        for (int i = 0; i < 250; i++) {
            if (i == 220) {
                double b = committed;
                committed = used / 0.3;
                EV("shrink", "idle for 1000 ms: down to the low watermark (30%)", b, committed);
                grow = 32 * MiB;
            }
            if (i == 226 && burst == 1) {
                double b = reserved;
                reserved = committed + 12 * MiB;
                EV("compact", "fragmentation 46% > 40%: moved 9.5 MiB of handles", b, reserved);
            }
            SAMPLE();
        }
        if (burst == 0) {
            double b = reserved;
            reserved = committed;
            stage = LLMEM_STAGE_IDLE;
            EV("shrink", "empty superblocks unmapped", b, reserved);
        }
    }
#undef SAMPLE
#undef EV
}

static void demo_page(void **state)
{
    (void)state;
    llmem_timeline *t;
    assert_ok(llmem_timeline_create(0, &t));
    build_demo(t);
    assert_true(llmem_timeline_sample_count(t) > 1000);
    char *html = write_and_read(t, "demo.html", "llmem demo: two bursts of requests, and idle");
    assert_int_equal(count(html, "<svg "), 1);
    assert_int_equal(points_of(html, "line-used"), llmem_timeline_sample_count(t));
    assert_int_equal(count(html, "<tr class=\"ev\">"), llmem_timeline_event_count(t));
    free(html);
    const char *out = getenv("LLMEM_TIMELINE_OUT");
    if (out && out[0]) {
        assert_ok(llmem_timeline_write_html(t, out, "llmem demo: two bursts of requests, and idle"));
        print_message("timeline demo page written to %s\n", out);
    }
    llmem_timeline_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(page_structure),
        cmocka_unit_test(event_text_is_copied_and_truncated),
        cmocka_unit_test(decimation_keeps_first_and_last),
        cmocka_unit_test(decimation_default_capacity),
        cmocka_unit_test(sampling_takes_no_malloc),
        cmocka_unit_test(no_samples),
        cmocka_unit_test(one_sample_all_zero),
        cmocka_unit_test(huge_values),
        cmocka_unit_test(time_never_goes_back),
        cmocka_unit_test(event_ring_overflows),
        cmocka_unit_test(stage_change_ring_overflows),
        cmocka_unit_test(bad_input),
        cmocka_unit_test(demo_page),
    };
    return cmocka_run_group_tests(tests, setup_dir, test_tmpdir_teardown);
}
