/*
 * log_capture.h - llmem's log sent to a test instead of stderr: how many
 * lines, of which errors, the last line of each level, and all of them.
 *
 *     static test_log_capture cap;
 *     test_log_capture_start(&cap, LLMEM_LOG_WARN);
 *     ... misuse ...
 *     llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
 *     assert_int_equal(cap.count, 1);
 *     assert_non_null(strstr(cap.last, "double free"));
 */
#ifndef LLMEM_TEST_LOG_CAPTURE_H
#define LLMEM_TEST_LOG_CAPTURE_H

#include <stddef.h>

#include "llmem/status.h"

typedef struct test_log_capture {
    unsigned count;              /* lines received */
    unsigned errors;             /* of which at LLMEM_LOG_ERROR */
    llmem_log_level level;       /* of the last line */
    char last[1024];             /* the last line */
    char last_at[LLMEM_LOG_OFF][1024]; /* the last line of each level */
    char text[8192];             /* every line, each ending in '\n', cut at the end */
    size_t len;                  /* of text */
} test_log_capture;

/* The sink: user is a test_log_capture. */
void test_log_capture_sink(void *user, llmem_log_level level, const char *msg);

/* Empty *c and send the log at `level` and above to it. */
void test_log_capture_start(test_log_capture *c, llmem_log_level level);

#endif
