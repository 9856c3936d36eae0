/*
 * tool_util.h - what several llmem subcommands share: walking the command
 * line, parsing option values, and the clock.
 */
#ifndef LLMEM_TOOLS_TOOL_UTIL_H
#define LLMEM_TOOLS_TOOL_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "llmem/llmem.h"

/* "8GiB", "512MiB", "64KiB", "1.5GiB", "24GB", "4096": bytes; -1 when it
 * is not a size, TOOL_BYTES_TOO_LARGE when it is one above 9e18 bytes
 * (1e30, inf, 1e400), so the message can say which. */
#define TOOL_BYTES_TOO_LARGE (-2.0)
double tool_parse_bytes(const char *s);

/* A whole decimal number in [lo, hi], or false. */
bool tool_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out);

/* A whole decimal number (no sign), up to UINT64_MAX, or false. */
bool tool_parse_u64(const char *s, uint64_t *out);

/* A finite decimal number in [lo, hi], the whole string, or false. */
bool tool_parse_double(const char *s, double lo, double hi, double *out);

/* A subcommand's command line, walked one argument at a time:
 *
 *     tool_args cl = {"plan", usage, argc, argv};
 *     while (tool_args_next(&cl)) {
 *         if (tool_args_help(&cl)) return 0;
 *         else if (tool_args_is(&cl, "--json")) json = true;
 *         else if (tool_args_take(&cl, "--model")) model = cl.val;
 *         else return tool_args_unknown(&cl);
 *     }
 *
 * Messages start "llmem <cmd>: " and end the way every subcommand's do. */
typedef struct tool_args {
    const char *cmd;             /* the subcommand's name, for messages */
    void (*usage)(FILE *f);      /* prints its usage */
    int argc;
    char **argv;                 /* argv[0] is the subcommand */
    int i;                       /* index of opt; 0 before the first tool_args_next */
    const char *opt;             /* the argument looked at */
    const char *val;             /* the value the last tool_args_take took (NULL: none) */
} tool_args;

/* Move to the next argument (cl->opt); false when none is left. */
bool tool_args_next(tool_args *cl);

/* Is the argument --help or -h? Then the usage is printed on stdout. */
bool tool_args_help(const tool_args *cl);

/* Is the argument `name` (an option without a value)? */
bool tool_args_is(const tool_args *cl, const char *name);

/* Is the argument `name` with a value after it? Then the value is taken
 * (cl->val) and the walk goes on after it. */
bool tool_args_take(tool_args *cl, const char *name);

/* "llmem <cmd>: unknown or incomplete option '<opt>'" and the usage on
 * stderr. Returns 2, the exit status of a usage error. */
int tool_args_unknown(const tool_args *cl);

/* "llmem <cmd>: bad value '<val>' for <opt>" on stderr. Returns 2. */
int tool_args_bad_value(const tool_args *cl);

#endif
