/*
 * threads.h - a fixed team of worker threads for the engine's kernels.
 * Private to llmem.
 *
 * llmem__threads_run(t, fn, ctx) calls fn(ctx, i, n) once on each of the n
 * threads (the caller is thread 0) and returns when every call has
 * returned. Workers wait between runs (spinning briefly, then sleeping on a
 * futex or condition variable), so a decode step's dozens of runs cost
 * microseconds, not thread creations. A run allocates nothing. One run at a
 * time per team: the team belongs to one engine thread.
 */
#ifndef LLMEM_ENGINE_THREADS_H
#define LLMEM_ENGINE_THREADS_H

#include <stddef.h>
#include <stdint.h>

#include "llmem/status.h"

typedef struct llmem__threads llmem__threads;

typedef void (*llmem__thread_fn)(void *ctx, unsigned index, unsigned count);

/* A team of n threads in all (n - 1 workers plus the caller); n = 0 means
 * the number of online CPUs. */
llmem_status llmem__threads_create(unsigned n, llmem__threads **out);
void llmem__threads_destroy(llmem__threads *t);
unsigned llmem__threads_count(const llmem__threads *t);
void llmem__threads_run(llmem__threads *t, llmem__thread_fn fn, void *ctx);

/* The part [*lo, *hi) of [0, total) that thread index of count takes:
 * contiguous, sizes differing by at most `grain` rounding. */
void llmem__threads_split(size_t total, size_t grain, unsigned index, unsigned count, size_t *lo, size_t *hi);

/* A barrier inside one run of team t: each of the `count` threads of the
 * run (fn's count) calls it once with the same *arrived, which starts at 0
 * and is good for one use; it returns on each thread once all have called
 * it, and what each wrote before is visible to all after (acquire and
 * release). Spins (t's budget), then yields: for the short wait between
 * two phases of one kernel, cheaper than a second run. */
void llmem__threads_barrier(const llmem__threads *t, uint32_t *arrived, unsigned count);

#endif
