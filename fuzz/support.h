/*
 * support.h - what every fuzz target shares: a check that says where it
 * failed and aborts (so libFuzzer and driver.c keep the input), the trace
 * switch, the byte reader that turns an input into a program, and the
 * once-per-process set-up. shadow.h adds the allocator targets' block
 * patterns and resource stack on top of it.
 *
 * Header-only, static functions: each target is one executable.
 */
#ifndef LLMEM_FUZZ_SUPPORT_H
#define LLMEM_FUZZ_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "llmem/llmem.h"

#include "../src/core/debug.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken contract: say which, where and the library's last error, then
 * abort. */
#define FZ_CHECK(cond)                                                                 \
    do {                                                                               \
        if (!(cond)) fz_fail(#cond, __FILE__, __LINE__);                               \
    } while (0)

static inline void fz_fail(const char *what, const char *file, int line)
{
    fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", file, line, what, llmem_error_message());
    abort();
}

/* FZ_TRACE=1 in the environment: the targets say what each step does. */
static inline bool fz_trace(void)
{
    static int on = -1;
    if (on < 0) on = getenv("FZ_TRACE") != NULL;
    return on;
}

/* At the start of each input: the library's log off, once (refusals are
 * expected and would drown the fuzzer's output), and the level-3 walk
 * counts reset, so each input's first call at every site walks whatever
 * the inputs before it did (debug.h). */
static inline void fz_begin(void)
{
    static bool quiet;
    if (!quiet) llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
    quiet = true;
    llmem__debug_walk_reset();
}

/* The input, read as a program: each op takes its bytes from the front. */
typedef struct fz_in {
    const uint8_t *p;
    size_t n;
} fz_in;

/* The next input byte; zeros once the input is used up. */
static inline unsigned fz_u8(fz_in *in)
{
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

static inline unsigned fz_u16(fz_in *in) { return fz_u8(in) | fz_u8(in) << 8; }

/* A parser's refusal: whether st is one (not LLMEM_OK), checking that it
 * is one a parser may give on bad bytes (LLMEM_EFORMAT) or on no memory. */
static inline bool fz_parse_refused(llmem_status st)
{
    FZ_CHECK(st == LLMEM_OK || st == LLMEM_EFORMAT || st == LLMEM_ENOMEM);
    return st != LLMEM_OK;
}

/*
 * The skeleton of the program targets (pool, fixed, arena): a zeroed model
 * of type model_t, setup(&m, &in) from the first bytes (false: nothing to
 * run), then for each step while input is left, at most maxsteps:
 * step(&m, &in, i), check(&m) (the model's checks after every op) and,
 * every `every` steps, sweep(&m) (the whole-memory walk); then finish(&m)
 * (everything back, the end-state checks), and teardown(&m) in every case.
 */
#define FZ_PROGRAM(model_t, setup, step, check, sweep, every, finish, teardown, maxsteps) \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)                       \
    {                                                                                  \
        fz_begin();                                                                    \
        static model_t m;                                                              \
        memset(&m, 0, sizeof m);                                                       \
        fz_in in = {data, size};                                                       \
        if (setup(&m, &in)) {                                                          \
            for (int i = 0; in.n && i < (maxsteps); i++) {                             \
                step(&m, &in, i);                                                      \
                check(&m);                                                             \
                if (i % (every) == (every) - 1) sweep(&m);                             \
            }                                                                          \
            finish(&m);                                                                \
        }                                                                              \
        teardown(&m);                                                                  \
        return 0;                                                                      \
    }

#endif /* LLMEM_FUZZ_SUPPORT_H */
