/*
 * tool_util.h - what several llmem subcommands share: argument parsing and
 * the clock.
 */
#ifndef LLMEM_TOOLS_TOOL_UTIL_H
#define LLMEM_TOOLS_TOOL_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "llmem/llmem.h"

/* "8GiB", "512MiB", "64KiB", "1.5GiB", "24GB", "4096": bytes, or -1. */
double tool_parse_bytes(const char *s);

/* A whole decimal number in [lo, hi], or false. */
bool tool_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out);

/* Monotonic nanoseconds. */
uint64_t tool_now_ns(void);

#endif
