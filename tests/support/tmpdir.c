/* tmpdir.c - the tests' temporary folder (tmpdir.h). */
#include "support/tmpdir.h"

#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <cmocka.h>

static char dir[512];

/* "$TMPDIR (else /tmp)/llmem-<tag>-XXXXXX" into buf: whether it fitted. */
static int template_for(char *buf, size_t cap, const char *tag)
{
    const char *base = getenv("TMPDIR");
    int n = snprintf(buf, cap, "%s/llmem-%s-XXXXXX", base && base[0] ? base : "/tmp", tag);
    return n >= 0 && (size_t)n < cap;
}

int test_tmpdir_make(const char *tag)
{
    if (!template_for(dir, sizeof dir, tag) || !mkdtemp(dir)) {
        dir[0] = '\0';
        return -1;
    }
    return 0;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int test_tmpdir_teardown(void **state)
{
    (void)state;
    if (!dir[0]) return 0;
    return nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

const char *test_tmpdir(void) { return dir; }

const char *test_tmp_path(const char *name)
{
    static char ring[16][1024];
    static unsigned next;
    char *buf = ring[next++ % 16];
    int n = snprintf(buf, sizeof ring[0], "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof ring[0]) fail_msg("temporary path too long: %s/%s", dir, name);
    return buf;
}

void test_tmp_file(char *path, size_t cap, const char *tag)
{
    if (!template_for(path, cap, tag)) fail_msg("temporary file name too long for %zu bytes (tag %s)", cap, tag);
    int fd = mkstemp(path);
    if (fd < 0) fail_msg("cannot make a temporary file %s", path);
    close(fd);
}
