/*
 * file.c - reading a whole (small) file into memory, for the parsers that
 * take text or images of bounded size (traces, tokenizer.bin). The buffer
 * doubles from 64 KiB, so the file's size need not be known (pipes work).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

llmem_status llmem__read_file(const char *path, size_t max_bytes, const char *what, void **data, size_t *size)
{
    *data = NULL;
    *size = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return llmem__fail(LLMEM_EIO, "%s: cannot open '%s': %s", what, path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    llmem_status st = LLMEM_OK;
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        if (cap >= max_bytes) {
            st = llmem__fail(LLMEM_EFORMAT, "%s: '%s' is over %zu MiB", what, path, max_bytes >> 20);
            break;
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    bool err = ferror(f) != 0;
    fclose(f);
    if (!buf) return llmem__fail(LLMEM_ENOMEM, "%s: out of memory reading '%s'", what, path);
    if (!st && err) st = llmem__fail(LLMEM_EIO, "%s: reading '%s' failed", what, path);
    if (st) {
        free(buf);
        return st;
    }
    *data = buf;
    *size = n;
    return LLMEM_OK;
}
