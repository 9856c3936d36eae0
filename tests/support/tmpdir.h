/*
 * tmpdir.h - the tests' temporary folder: one per test binary, made by a
 * group setup and removed, with everything in it, by the group teardown.
 *
 *     static int setup(void **state) { (void)state; return test_tmpdir_make("arch"); }
 *     ... test_tmp_path("model.gguf") ...
 *     return cmocka_run_group_tests(tests, setup, test_tmpdir_teardown);
 */
#ifndef LLMEM_TEST_TMPDIR_H
#define LLMEM_TEST_TMPDIR_H

#include <stddef.h>

/* Make $TMPDIR (else /tmp)/llmem-<tag>-XXXXXX: 0, or -1 (as a cmocka
 * setup answers) when it cannot be made. */
int test_tmpdir_make(const char *tag);

/* Remove the folder and everything below it: 0, or -1 when something
 * would not go. A cmocka group teardown as it stands. */
int test_tmpdir_teardown(void **state);

/* The folder made last ("" before any). */
const char *test_tmpdir(void);

/* "<folder>/<name>", in a ring of 16 static buffers: use it before 16
 * more calls; fails the test when too long. */
const char *test_tmp_path(const char *name);

/* Make an empty file $TMPDIR (else /tmp)/llmem-<tag>-XXXXXX, closed, and
 * write its name into path (cap bytes); fails the test when it cannot.
 * The caller removes it. For a file outside the group's folder. */
void test_tmp_file(char *path, size_t cap, const char *tag);

#endif
