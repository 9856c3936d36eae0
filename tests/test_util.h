/*
 * test_util.h - what every llmem unit test includes: cmocka, the library,
 * status assertions that print the library's message, resident-memory
 * readers, a death-test helper for the sim-device checks, and the one way
 * a test finds (or skips without) the shared data folder.
 *
 * Shared data (models, traces: the checkout's ../shared), the convention
 * every test follows (tests/CMakeLists.txt says the same for CMake):
 *  - test_shared_path("models/x.bin") is a file in the shared folder:
 *    $LLMEM_SHARED_DIR when that is set (make check sets it to an empty
 *    folder in the normal build, to exercise the skips), else the folder
 *    compiled in (LLMEM_TEST_SHARED_DEFAULT, the checkout's ../shared).
 *  - Cases that need shared files never skip one by one inside a binary
 *    (cmocka's skip() counts as a pass in CTest). They sit in a group of
 *    their own that main() runs when called with --shared:
 *
 *        return test_main(argc, argv, "test_x", TEST_GROUP(tests, NULL, NULL),
 *                         TEST_GROUP(shared_tests, NULL, NULL),
 *                         (const char *const[]){"models/stories260K.bin", "models/reference", NULL});
 *
 *    registered by llmem_add_test(name SHARED) as a second CTest entry
 *    name_shared (label "shared", SKIP_RETURN_CODE 77).
 *    test_require_shared exits 77 with "skipped: ... is absent" when any
 *    file is missing, so CTest prints the entry as Skipped, and
 *    tests/skip_summary.sh prints the reason after the run.
 */
#ifndef LLMEM_TEST_UTIL_H
#define LLMEM_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "llmem/llmem.h"

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#include <sanitizer/asan_interface.h>
#endif
#if defined(__SANITIZE_THREAD__)
#define TEST_TSAN 1
#endif

/* Assert a call succeeds; on failure show the status and the message. */
#define assert_ok(expr)                                                                          \
    do {                                                                                         \
        llmem_status st_ = (expr);                                                               \
        if (st_ != LLMEM_OK) fail_msg("%s -> %s: %s", #expr, llmem_status_name(st_), llmem_error_message()); \
    } while (0)

/* Assert a call fails with exactly `want` and leaves a non-empty message. */
#define assert_status(expr, want)                                                                \
    do {                                                                                         \
        llmem_status st_ = (expr);                                                               \
        if (st_ != (want))                                                                       \
            fail_msg("%s -> %s, expected %s (%s)", #expr, llmem_status_name(st_), llmem_status_name(want), \
                     llmem_error_message());                                                        \
        if ((want) != LLMEM_OK && llmem_error_message()[0] == '\0') fail_msg("%s left no message", #expr); \
    } while (0)

/* The last error message contains `needle`. */
#define assert_error_mentions(needle)                                                            \
    do {                                                                                         \
        if (!strstr(llmem_error_message(), (needle)))                                               \
            fail_msg("last error \"%s\" does not mention \"%s\"", llmem_error_message(), (needle)); \
    } while (0)

/* The statistics getters (test_resource_stats, test_pool_stats, ...), the
 * base resources (test_os_new, test_sim_new) and the end-of-test checks
 * (test_sim_expect_clean, test_tracking_expect_clean). */
#include "support/resources.h"

/* A large block served whole from a cache for a request of n bytes (the
 * caches give a block of up to a third more than asked, issue 15): its
 * usable size is the whole block, the stats count all of it as in use,
 * one live allocation more and one allocation counted, the request's
 * bytes are writable and, under ASan, the tail past them stays poisoned.
 * s0 is the stats read before the allocation. */
static inline void assert_fitted_block(llmem_pool *p, char *f, size_t n, size_t whole, llmem_pool_stats s0)
{
    assert_non_null(f);
    assert_int_equal(llmem_pool_usable_size(p, f), whole);
    llmem_pool_stats s = test_pool_stats(p);
    assert_int_equal(s.used_bytes, s0.used_bytes + whole);
    assert_int_equal(s.live_allocations, s0.live_allocations + 1);
    assert_int_equal(s.allocs_total, s0.allocs_total + 1);
#ifdef TEST_ASAN
    assert_null(__asan_region_is_poisoned(f, n));
    assert_true(__asan_address_is_poisoned(f + n));
    assert_true(__asan_address_is_poisoned(f + whole - 1));
#endif
    memset(f, 5, n);
    assert_ok(llmem_pool_check(p));
}

/* The tests' one clock: monotonic nanoseconds (the library's is
 * llmem__now_ns, private). */
static inline uint64_t test_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Deterministic bytes, different for each seed (an LCG's high bytes): what
 * the resource tests write through a mapping and read back. */
static inline void test_pattern(unsigned char *buf, size_t n, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (unsigned char)(x >> 16);
    }
}

/* Monotonic milliseconds, for tests that must tell whether a delay passed. */
static inline uint64_t test_now_ms(void) { return test_now_ns() / 1000000u; }

/* Resident set size of this process in bytes (from /proc/self/statm). */
static inline size_t test_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long size = 0, resident = 0;
    if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
    fclose(f);
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

static void test_crash_handler_(int sig)
{
    (void)sig;
    _exit(77);
}

/* Run fn(arg) in a child process. True if it died of a memory fault
 * (SIGSEGV or SIGBUS, caught or not), false if it returned normally. */
static inline bool test_child_faults(void (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) fail_msg("fork failed: the death test cannot run");
    if (pid == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = test_crash_handler_;
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        fn(arg);
        _exit(0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) fail_msg("waitpid failed: the death test has no verdict");
    if (WIFEXITED(status)) return WEXITSTATUS(status) == 77;
    return WIFSIGNALED(status) && (WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS);
}

/* ---- the shared data folder ------------------------------------------ */

#ifndef LLMEM_TEST_SHARED_DEFAULT
#define LLMEM_TEST_SHARED_DEFAULT "../shared"
#endif

/* The shared folder: $LLMEM_SHARED_DIR if set and not empty, else the
 * compiled default. */
static inline const char *test_shared_dir(void)
{
    const char *env = getenv("LLMEM_SHARED_DIR");
    return env && env[0] ? env : LLMEM_TEST_SHARED_DEFAULT;
}

/* The path of `rel` (e.g. "models/tok512.bin") in the shared folder. The
 * string lives in a ring of 16 static buffers: use it before 16 more calls
 * (enough for the paths of one statement); fails the test when too long. */
static inline const char *test_shared_path(const char *rel)
{
    static char ring[16][4096];
    static unsigned next;
    char *buf = ring[next++ % 16];
    int n = snprintf(buf, sizeof ring[0], "%s/%s", test_shared_dir(), rel);
    if (n < 0 || (size_t)n >= sizeof ring[0]) fail_msg("shared path too long: %s/%s", test_shared_dir(), rel);
    return buf;
}

/* True when main() was called to run its shared-data group (--shared). */
static inline bool test_shared_group(int argc, char **argv)
{
    return argc > 1 && strcmp(argv[1], "--shared") == 0;
}

/* Exit 77 (CTest: Skipped) with the reason unless every file or folder
 * named (relative to the shared folder, NULL-terminated) is readable. */
static inline void test_require_shared(const char *rel, ...)
{
    va_list ap;
    va_start(ap, rel);
    for (const char *r = rel; r; r = va_arg(ap, const char *)) {
        const char *p = test_shared_path(r);
        if (access(p, R_OK) != 0) {
            printf("skipped: %s is absent (the shared data folder: set LLMEM_SHARED_DIR, or put shared/ "
                   "beside the checkout)\n",
                   p);
            fflush(stdout);
            va_end(ap);
            exit(77);
        }
    }
    va_end(ap);
}

/* One group of cases with its fixtures, for test_main. */
typedef struct test_group {
    const struct CMUnitTest *tests;
    size_t n;
    CMFixtureFunction setup, teardown;
} test_group;

#define TEST_GROUP(array, setup, teardown)                                                       \
    ((test_group){(array), sizeof(array) / sizeof((array)[0]), (setup), (teardown)})

/* main()'s answer for a test with a shared-data group: with --shared, the
 * group `shared` (named "<name> (shared data)") once every file of the
 * NULL-terminated `needs` is there (else exit 77, test_require_shared);
 * otherwise the group `tests`.
 *
 *     return test_main(argc, argv, "test_shape", TEST_GROUP(tests, NULL, NULL),
 *                      TEST_GROUP(shared_tests, NULL, NULL), (const char *const[]){"models/x.bin", NULL});
 */
static inline int test_main(int argc, char **argv, const char *name, test_group tests, test_group shared,
                            const char *const *needs)
{
    if (!test_shared_group(argc, argv))
        return _cmocka_run_group_tests(name, tests.tests, tests.n, tests.setup, tests.teardown);
    for (const char *const *n = needs; *n; n++) test_require_shared(*n, NULL);
    char group[256];
    snprintf(group, sizeof group, "%s (shared data)", name);
    return _cmocka_run_group_tests(group, shared.tests, shared.n, shared.setup, shared.teardown);
}

/* Silence llmem's default stderr log for tests that misuse on purpose. */
static inline int test_quiet_logs(void **state)
{
    (void)state;
    llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
    return 0;
}

#endif
