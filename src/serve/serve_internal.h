/*
 * serve_internal.h - what the files of src/serve share (not installed).
 */
#ifndef LLMEM_SERVE_INTERNAL_H
#define LLMEM_SERVE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbuf.h"

/* textstream.c: the length of the valid UTF-8 character at p (avail bytes
 * there, avail >= 1): 1..4, or 0 when the bytes are not one; *incomplete
 * is set when they are a valid beginning cut short by avail. */
size_t llmem__utf8_char(const unsigned char *p, size_t avail, bool *incomplete);

#endif /* LLMEM_SERVE_INTERNAL_H */
