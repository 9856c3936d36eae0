/*
 * debug.h - llmem's debug levels, as mimalloc has them (STYLE.md item 8).
 *
 *   LLMEM_DEBUG 0  release: every check below compiles to nothing, so a
 *                  release build's code is the same with or without them
 *                  (the asserted expressions are never evaluated).
 *   LLMEM_DEBUG 1  cheap invariant asserts (llmem__assert) at the places
 *                  the file-top comments state an invariant: O(1) each.
 *                  On in the Debug and sanitizer builds.
 *   LLMEM_DEBUG 2  dearer asserts (llmem__assert_expensive): walks of one
 *                  list or one sequence, O(n) in what the call touched.
 *   LLMEM_DEBUG 3  the whole-structure checks (llmem_pool_check,
 *                  llmem_kv_check) after every mutating call
 *                  (LLMEM_DEBUG_WALK). On in the fuzz builds, where every
 *                  input then proves the invariants after each step.
 *
 * CMake sets the level (cache variable LLMEM_DEBUG; by default 3 with
 * LLMEM_FUZZ, 1 in Debug or sanitizer builds, 0 otherwise).
 *
 * A failed assert is a bug in llmem, never bad input (bad input gets a
 * status, STYLE.md item 4): it prints what failed and where, then aborts,
 * so a sanitizer or fuzzer shows the stack at the broken invariant rather
 * than at a later crash.
 */
#ifndef LLMEM_DEBUG_H
#define LLMEM_DEBUG_H

#include "llmem/status.h"

#ifndef LLMEM_DEBUG
#define LLMEM_DEBUG 0
#endif

/* Prints "llmem: <file>:<line>: <func>: invariant failed: <what>" to stderr
 * and aborts. Only the macros below call it. */
_Noreturn void llmem__assert_fail(const char *what, const char *file, int line, const char *func);

#if LLMEM_DEBUG >= 1
#define llmem__assert(cond) \
    ((cond) ? (void)0 : llmem__assert_fail(#cond, __FILE__, __LINE__, __func__))
#else
#define llmem__assert(cond) ((void)0)
#endif

#if LLMEM_DEBUG >= 2
#define llmem__assert_expensive(cond) llmem__assert(cond)
#else
#define llmem__assert_expensive(cond) ((void)0)
#endif

/* LLMEM_DEBUG_WALK(check_call): at level 3 runs a whole-structure check
 * that returns an llmem_status and aborts unless it returned LLMEM_OK (the
 * check's own message, through llmem__fail, names what broke). A check
 * that could not run for want of scratch memory (LLMEM_ENOMEM: fault
 * injection, budgets) is not a broken invariant and is let go. Either way
 * the thread's last error is left as the checked call left it. A
 * statement.
 *
 * The walk period LLMEM_DEBUG_WALK_EVERY (CMake sets it: 16 in the fuzz
 * build, 1 elsewhere): each call site walks on its first call and then on
 * every Nth, counted per thread, and llmem__debug_walk_reset() starts
 * every site's count again (the fuzz targets call it before each input,
 * so an input's first call at every site walks). Why: a walk after every
 * call made the scheduler fuzzer run 25 times fewer inputs in its 20 s
 * (docs/DECISIONS.md, "Debug levels"); a broken structure stays broken,
 * so the next walk at that site, or any other, still finds it. */
#ifndef LLMEM_DEBUG_WALK_EVERY
#define LLMEM_DEBUG_WALK_EVERY 1
#endif
void llmem__debug_walk_reset(void);
unsigned long llmem__debug_walk_epoch(void);
#if LLMEM_DEBUG >= 3
typedef struct llmem__error_saved {
    llmem_status status;
    unsigned long long seq;
    char msg[512];
} llmem__error_saved;
void llmem__error_save(llmem__error_saved *s);
void llmem__error_restore(const llmem__error_saved *s);
#define LLMEM_DEBUG_WALK(check_call)                                                  \
    do {                                                                               \
        static _Thread_local unsigned long walk_epoch_, walk_calls_;                   \
        unsigned long epoch_ = llmem__debug_walk_epoch();                              \
        if (walk_epoch_ != epoch_) {                                                   \
            walk_epoch_ = epoch_;                                                      \
            walk_calls_ = 0;                                                           \
        }                                                                              \
        if (walk_calls_++ % LLMEM_DEBUG_WALK_EVERY == 0) {                             \
            llmem__error_saved saved_;                                                 \
            llmem__error_save(&saved_);                                                \
            llmem_status walk_ = (check_call);                                         \
            if (walk_ != LLMEM_OK && walk_ != LLMEM_ENOMEM)                            \
                llmem__assert_fail(#check_call, __FILE__, __LINE__, __func__);        \
            llmem__error_restore(&saved_);                                             \
        }                                                                              \
    } while (0)
#else
#define LLMEM_DEBUG_WALK(check_call) ((void)0)
#endif

#endif
