/* log_capture.c - llmem's log sent to a test (log_capture.h). */
#include "support/log_capture.h"

#include <stdio.h>
#include <string.h>

#include "llmem/llmem.h"

void test_log_capture_sink(void *user, llmem_log_level level, const char *msg)
{
    test_log_capture *c = user;
    c->count++;
    if (level == LLMEM_LOG_ERROR) c->errors++;
    c->level = level;
    snprintf(c->last, sizeof c->last, "%s", msg);
    if ((int)level >= 0 && level < LLMEM_LOG_OFF) snprintf(c->last_at[level], sizeof c->last_at[0], "%s", msg);
    int n = snprintf(c->text + c->len, sizeof c->text - c->len, "%s\n", msg);
    if (n > 0) c->len = c->len + (size_t)n < sizeof c->text ? c->len + (size_t)n : sizeof c->text - 1;
}

void test_log_capture_start(test_log_capture *c, llmem_log_level level)
{
    memset(c, 0, sizeof *c);
    llmem_log_set(test_log_capture_sink, c, level);
}
