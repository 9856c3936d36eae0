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

#include "tool_util.h" /* tool_now_ns */
double bench_median(double *v, size_t n);

/* Progress line on stderr when it is a terminal. */
void bench_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void bench_progress_done(void);

/* Table: one row per workload, one column per allocator, and the ratio of
 * `subject` over `baseline` (higher = subject faster). */
void bench_print_table(const bench_result *r, size_t n, const char *subject, const char *baseline);
void bench_print_json(const bench_result *r, size_t n);

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
