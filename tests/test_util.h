/*
 * test_util.h - what every llmem unit test includes: cmocka, the library,
 * status assertions that print the library's message, resident-memory
 * readers, and a death-test helper for the sim-device checks.
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
        if (st_ != LLMEM_OK) fail_msg("%s -> %s: %s", #expr, llmem_status_name(st_), llmem_last_error()); \
    } while (0)

/* Assert a call fails with exactly `want` and leaves a non-empty message. */
#define assert_status(expr, want)                                                                \
    do {                                                                                         \
        llmem_status st_ = (expr);                                                               \
        if (st_ != (want))                                                                       \
            fail_msg("%s -> %s, expected %s (%s)", #expr, llmem_status_name(st_), llmem_status_name(want), \
                     llmem_last_error());                                                        \
        if ((want) != LLMEM_OK && llmem_last_error()[0] == '\0') fail_msg("%s left no message", #expr); \
    } while (0)

/* The last error message contains `needle`. */
#define assert_error_mentions(needle)                                                            \
    do {                                                                                         \
        if (!strstr(llmem_last_error(), (needle)))                                               \
            fail_msg("last error \"%s\" does not mention \"%s\"", llmem_last_error(), (needle)); \
    } while (0)

/* Monotonic milliseconds, for tests that must tell whether a delay passed. */
static inline uint64_t test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

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

/* Silence llmem's default stderr log for tests that misuse on purpose. */
static inline int test_quiet_logs(void **state)
{
    (void)state;
    llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
    return 0;
}

#endif
