/*
 * test_debug.c - the debug levels of src/core/debug.h, at the level this
 * build compiles the library with (LLMEM_DEBUG, set by CMake for every
 * target): an assert at level >= 1 aborts with what failed and where; at
 * level 0 its expression is not even evaluated, so a release build runs
 * the code it ran before the asserts were written; the whole-structure
 * walk runs at level 3 only. Each failing case runs in a child process.
 */
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"
#include "../src/core/debug.h"

/* Runs fn in a child with stderr on a pipe; returns its wait status and
 * what it wrote (up to cap - 1 bytes). */
static int run_child(void (*fn)(void), char *out, size_t cap)
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        fn();
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd[0], out + n, cap - 1 - n)) > 0) n += (size_t)r;
    out[n] = '\0';
    close(fd[0]);
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    return ws;
}

static void failing_assert(void)
{
    volatile int two = 2;
    (void)two;
    llmem__assert(two == 3);
}

static void assert_aborts_with_what_and_where_from_level_1(void **state)
{
    (void)state;
    char out[1024];
    int ws = run_child(failing_assert, out, sizeof out);
    if (LLMEM_DEBUG >= 1) {
        assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGABRT);
        assert_non_null(strstr(out, "invariant failed: two == 3"));
        assert_non_null(strstr(out, "test_debug.c"));
        assert_non_null(strstr(out, "failing_assert"));
    } else {
        assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
        assert_string_equal(out, "");
    }
}

static void release_level_does_not_evaluate(void **state)
{
    (void)state;
    int evaluated = 0, dear = 0;
    llmem__assert((evaluated = 1) == 1);
    llmem__assert_expensive((dear = 1) == 1);
    assert_int_equal(evaluated, LLMEM_DEBUG >= 1);
    assert_int_equal(dear, LLMEM_DEBUG >= 2);
}

static int walks;
/* A check that finds a break (a null kv: its message names it). */
static __attribute__((unused)) llmem_status broken_check(void)
{
    walks++;
    return llmem_kv_check(NULL);
}

static void failing_walk(void) { LLMEM_DEBUG_WALK(broken_check()); }

static void walk_runs_at_level_3_and_names_the_break(void **state)
{
    (void)state;
    char out[1024];
    int ws = run_child(failing_walk, out, sizeof out);
    if (LLMEM_DEBUG >= 3) {
        assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGABRT);
        assert_non_null(strstr(out, "broken_check()"));
        assert_non_null(strstr(out, "last error: kv: null kv"));
    } else {
        assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
        walks = 0;
        failing_walk();
        assert_int_equal(walks, 0);
    }
}

static int counted;
static __attribute__((unused)) llmem_status counting_check(void)
{
    counted++;
    return LLMEM_OK;
}

static void walk_site(void) { LLMEM_DEBUG_WALK(counting_check()); }

/* At level 3 a site walks on its first call and every LLMEM_DEBUG_WALK_EVERY
 * calls after; a reset (each fuzz input) makes its next call walk again. */
static void walk_period_counts_per_site_and_resets(void **state)
{
    (void)state;
    const int every = LLMEM_DEBUG_WALK_EVERY, on = LLMEM_DEBUG >= 3;
    counted = 0;
    llmem__debug_walk_reset();
    for (int i = 0; i < 3 * every + 1; i++) walk_site(); /* calls 0, N, 2N and 3N walk */
    assert_int_equal(counted, on ? 4 : 0);
    llmem__debug_walk_reset();
    walk_site();
    assert_int_equal(counted, on ? 5 : 0);
    walk_site(); /* the second call after a reset walks only when every call does */
    assert_int_equal(counted, on ? (every == 1 ? 6 : 5) : 0);
}

/* The level-3 walk after every KV call must accept every state the public
 * calls reach (a false alarm there would abort the fuzz build). */
static void kv_calls_pass_their_own_walk(void **state)
{
    (void)state;
    llmem_kv_options o = llmem_kv_options_default();
    o.layers = 2;
    o.kv_heads = 1;
    o.head_dim = 8;
    o.block_tokens = 4;
    o.max_seq_len = 64;
    o.prefix_cache = true;
    llmem_kv *kv = NULL;
    assert_int_equal(llmem_kv_create(&o, &kv), LLMEM_OK);
    int32_t toks[19];
    for (int i = 0; i < 19; i++) toks[i] = i * 7 + 1;
    llmem_kv_seq a = 0, b = 0, c = 0;
    size_t first = 0, matched = 0;
    assert_int_equal(llmem_kv_seq_create(kv, 0, &a), LLMEM_OK);
    assert_int_equal(llmem_kv_seq_append(kv, a, 19, toks, &first), LLMEM_OK);
    assert_int_equal(llmem_kv_seq_fork(kv, a, &b), LLMEM_OK);
    assert_int_equal(llmem_kv_seq_append(kv, b, 1, toks, &first), LLMEM_OK);
    assert_int_equal(llmem_kv_seq_rollback(kv, b, 10), LLMEM_OK);
    assert_int_equal(llmem_kv_seq_free(kv, a), LLMEM_OK);
    assert_int_equal(llmem_kv_seq_create(kv, 0, &c), LLMEM_OK);
    assert_int_equal(llmem_kv_seq_match_prefix(kv, c, toks, 19, &matched), LLMEM_OK);
    assert_true(matched >= 16);
    assert_int_equal(llmem_kv_seq_truncate(kv, c, 99), LLMEM_ERANGE); /* refused: state unchanged */
    assert_int_equal(llmem_kv_check(kv), LLMEM_OK);
    llmem_kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(assert_aborts_with_what_and_where_from_level_1),
        cmocka_unit_test(release_level_does_not_evaluate),
        cmocka_unit_test(walk_runs_at_level_3_and_names_the_break),
        cmocka_unit_test(walk_period_counts_per_site_and_resets),
        cmocka_unit_test(kv_calls_pass_their_own_walk),
    };
    printf("# LLMEM_DEBUG=%d, level-3 walks every %d call(s) a site\n", LLMEM_DEBUG, LLMEM_DEBUG_WALK_EVERY);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
