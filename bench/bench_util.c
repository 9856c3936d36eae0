/*
 * bench_util.c - shared benchmark plumbing.
 */
#include "bench_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llmem/version.h"

volatile uint64_t bench_sink;


static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, size_t n)
{
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bench_result bench_summary(const char *workload, const char *allocator, uint64_t ops, double *v, int rounds)
{
    double best = 0;
    for (int r = 0; r < rounds; r++)
        if (v[r] > best) best = v[r];
    return (bench_result){workload, allocator, ops, bench_median(v, (size_t)rounds), best, rounds};
}

void bench_report(const bench_result *r, size_t n, bool json, const char *name, int rounds, const char *subject,
                  const char *baseline)
{
    if (json) {
        bench_print_json(r, n);
        return;
    }
    printf("llmem %s bench %s: median of %d alternating rounds, ratio = %s / %s throughput\n\n", llmem_version(), name,
           rounds, subject, baseline);
    bench_print_table(r, n, subject, baseline);
}

bool bench_common_arg(int argc, char **argv, int *i, bool *json, bool *quick, int *rounds)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--json")) *json = true;
    else if (!strcmp(a, "--quick")) *quick = true;
    else if (!strcmp(a, "--rounds") && *i + 1 < argc) *rounds = atoi(argv[++*i]);
    else return false;
    return true;
}

bool bench_rounds_ok(const char *name, int rounds, int max)
{
    if (rounds >= 1 && rounds <= max) return true;
    fprintf(stderr, "llmem bench %s: --rounds must be 1..%d\n", name, max);
    return false;
}

void bench_progress(const char *fmt, ...)
{
    if (!isatty(STDERR_FILENO)) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\r\033[K");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
}

void bench_progress_done(void)
{
    if (isatty(STDERR_FILENO)) fprintf(stderr, "\r\033[K");
}

static const bench_result *find(const bench_result *r, size_t n, const char *w, const char *a)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(r[i].workload, w) && !strcmp(r[i].allocator, a)) return &r[i];
    return NULL;
}

void bench_print_table(const bench_result *r, size_t n, const char *subject, const char *baseline)
{
    printf("%-16s %16s %16s %10s\n", "workload", subject, baseline, "ratio");
    printf("%-16s %16s %16s %10s\n", "", "(Mops/s)", "(Mops/s)", "");
    for (size_t i = 0; i < n; i++) {
        if (strcmp(r[i].allocator, subject)) continue;
        const bench_result *b = find(r, n, r[i].workload, baseline);
        double ratio = b && b->ops_per_sec > 0 ? r[i].ops_per_sec / b->ops_per_sec : 0;
        printf("%-16s %16.1f %16.1f %9.2fx\n", r[i].workload, r[i].ops_per_sec / 1e6,
               b ? b->ops_per_sec / 1e6 : 0.0, ratio);
    }
}

void bench_print_json(const bench_result *r, size_t n)
{
    printf("[");
    for (size_t i = 0; i < n; i++)
        printf("%s{\"workload\":\"%s\",\"allocator\":\"%s\",\"ops\":%llu,\"ops_per_sec\":%.0f,"
               "\"best_ops_per_sec\":%.0f,\"rounds\":%d}",
               i ? "," : "", r[i].workload, r[i].allocator, (unsigned long long)r[i].ops, r[i].ops_per_sec,
               r[i].best_ops_per_sec, r[i].rounds);
    printf("]\n");
}
