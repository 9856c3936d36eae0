/*
 * tool_util.h - what several llmem subcommands share: argument parsing and
 * the clock.
 */
#ifndef LLMEM_TOOLS_TOOL_UTIL_H
#define LLMEM_TOOLS_TOOL_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "llmem/llmem.h"

/* "8GiB", "512MiB", "64KiB", "1.5GiB", "24GB", "4096": bytes; -1 when it
 * is not a size, TOOL_BYTES_TOO_LARGE when it is one above 9e18 bytes
 * (1e30, inf, 1e400), so the message can say which. */
#define TOOL_BYTES_TOO_LARGE (-2.0)
double tool_parse_bytes(const char *s);

/* A whole decimal number in [lo, hi], or false. */
bool tool_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out);

/* Monotonic nanoseconds. */
uint64_t tool_now_ns(void);

#endif
