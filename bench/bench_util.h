/*
 * bench_util.h - what every llmem benchmark shares: a monotonic clock,
 * medians, side-by-side rounds, a results table or JSON, and progress on a
 * terminal (quiet when stderr is not one).
 */
#ifndef LLMEM_BENCH_UTIL_H
#define LLMEM_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bench_result {
    const char *workload;
    const char *allocator;
    uint64_t ops;          /* operations per run */
    double ops_per_sec;    /* median over rounds */
    double best_ops_per_sec;
    int rounds;
} bench_result;

#include "tool_util.h" /* llmem_time_now_ns */
double bench_median(double *v, size_t n);

/* Progress line on stderr when it is a terminal. */
void bench_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void bench_progress_done(void);

/* Table: one row per workload, one column per allocator, and the ratio of
 * `subject` over `baseline` (higher = subject faster). */
void bench_print_table(const bench_result *r, size_t n, const char *subject, const char *baseline);
void bench_print_json(const bench_result *r, size_t n);

/* The result of `rounds` timed rounds v (ops/s; sorted in place): their
 * median and their best. */
bench_result bench_summary(const char *workload, const char *allocator, uint64_t ops, double *v, int rounds);

/* The n results as JSON, or under the line "llmem <version> bench <name>:
 * median of <rounds> alternating rounds, ratio = <subject> / <baseline>
 * throughput" as the table of bench_print_table. */
void bench_report(const bench_result *r, size_t n, bool json, const char *name, int rounds, const char *subject,
                  const char *baseline);

/* The options every side-by-side bench takes: --json, --quick and
 * --rounds N at argv[*i]. True when argv[*i] was one (*i then on its last
 * word); false for anything else, which the caller handles. */
bool bench_common_arg(int argc, char **argv, int *i, bool *json, bool *quick, int *rounds);

/* rounds within 1..max; else "llmem bench <name>: --rounds must be 1..max"
 * on stderr and false. */
bool bench_rounds_ok(const char *name, int rounds, int max);

/* A sink the compiler cannot see through, so work is not optimised away. */
extern volatile uint64_t bench_sink;

/* xorshift64* */
static inline uint64_t bench_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

#endif
