/*
 * tool_util.c - see tool_util.h.
 */
#include "tool_util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double tool_parse_bytes(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0)) return -1;
    if (errno == ERANGE && v > 1) v = INFINITY; /* 1e400: too large, not "not a size" */
    else if (errno) return -1;
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {{"", 1},         {"B", 1},          {"KiB", 1024.0},   {"MiB", 1048576.0}, {"GiB", 1073741824.0},
                 {"TiB", 1099511627776.0}, {"K", 1024.0}, {"M", 1048576.0}, {"G", 1073741824.0}, {"T", 1099511627776.0},
                 {"KB", 1e3},     {"MB", 1e6},       {"GB", 1e9},       {"TB", 1e12}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].suffix)) {
            double b = v * units[i].mult;
            return b > 9e18 ? TOOL_BYTES_TOO_LARGE : b;
        }
    return -1;
}

bool tool_parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') return false;
    *out = v;
    return true;
}

bool tool_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    uint64_t v;
    if (!tool_parse_u64(s, &v) || v < lo || v > hi) return false;
    *out = (uint32_t)v;
    return true;
}

bool tool_parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool tool_args_next(tool_args *cl)
{
    cl->i++;
    cl->val = NULL;
    cl->opt = cl->i < cl->argc ? cl->argv[cl->i] : NULL;
    return cl->opt != NULL;
}

bool tool_args_help(const tool_args *cl)
{
    if (strcmp(cl->opt, "--help") && strcmp(cl->opt, "-h")) return false;
    cl->usage(stdout);
    return true;
}

bool tool_args_is(const tool_args *cl, const char *name) { return !strcmp(cl->opt, name); }

bool tool_args_take(tool_args *cl, const char *name)
{
    if (strcmp(cl->opt, name) || cl->i + 1 >= cl->argc) return false;
    cl->val = cl->argv[++cl->i];
    return true;
}

int tool_args_unknown(const tool_args *cl)
{
    fprintf(stderr, "llmem %s: unknown or incomplete option '%s'\n", cl->cmd, cl->opt);
    cl->usage(stderr);
    return 2;
}

int tool_args_bad_value(const tool_args *cl)
{
    fprintf(stderr, "llmem %s: bad value '%s' for %s\n", cl->cmd, cl->val, cl->opt);
    return 2;
}
