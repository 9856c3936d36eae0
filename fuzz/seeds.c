/*
 * seeds.c - writes the seed corpora of the allocator fuzz targets:
 *
 *     fuzz_seeds DIR      (DIR/pool, DIR/fixed, DIR/arena must exist)
 *
 * A seed is a configuration (the first bytes each target reads: mode
 * flags, alignment, sizes) followed by op bytes from a fixed xorshift
 * stream, so every configuration the targets know starts with a program
 * that reaches allocations, frees and the rest. Any byte string is a valid
 * program, so the fuzzer takes it from there. The committed corpora in
 * fuzz/corpus/{pool,fixed,arena} are this program's output; the crash-*
 * files beside them are regressions.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../tests/support/rng.h"

enum { OPS = 400 };

typedef struct seed {
    const char *target, *name;
    uint8_t config[4];
} seed;

/* Flag bits: see setup() in each target. */
static const seed seeds[] = {
    {"pool", "host", {0x00, 0x00, 0x05, 0x40}},
    {"pool", "host-checked", {0x01, 0x04, 0x05, 0x40}},
    {"pool", "sim", {0x02, 0x00, 0x01, 0x10}},
    {"pool", "sim-checked", {0x03, 0x00, 0x01, 0x10}},
    {"pool", "capped", {0x0c, 0x00, 0x04, 0x2b}},
    {"pool", "extra-classes-purger", {0xb0, 0x10, 0x05, 0x40}},
    {"pool", "host-reserved-range", {0x00, 0x00, 0x35, 0x40}},
    {"pool", "sim-reserved-range", {0x02, 0x00, 0x31, 0x10}},
    {"pool", "capped-reserved-range", {0x0c, 0x00, 0x14, 0x2b}},
    {"fixed", "host", {0x00, 0x21, 0x10, 0x20}},
    {"fixed", "host-checked", {0x01, 0x71, 0x10, 0x20}},
    {"fixed", "thread-safe", {0x02, 0x21, 0x10, 0x20}},
    {"fixed", "sim-checked", {0x05, 0x21, 0x10, 0x20}},
    {"fixed", "max-initial", {0x18, 0x21, 0x10, 0x61}},
    {"fixed", "limit-chunks", {0xa3, 0x91, 0x03, 0x22}},
    {"arena", "host", {0x00, 0x00, 0x33, 0}},
    {"arena", "sim", {0x01, 0x00, 0x33, 0}},
    {"arena", "capacity", {0x04, 0x00, 0x80, 0}},
    {"arena", "buffer", {0x06, 0x06, 0x40, 0}},
    {"arena", "max-bytes", {0x40, 0x00, 0x13, 0}},
    {"arena", "limit", {0x88, 0x07, 0x21, 0}},
};

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) {
        const seed *s = &seeds[i];
        char path[4096];
        snprintf(path, sizeof path, "%s/%s/seed-%s", argv[1], s->target, s->name);
        FILE *f = fopen(path, "wb");
        if (!f) {
            perror(path);
            return 1;
        }
        uint64_t x = 0x9e3779b97f4a7c15ull * (i + 1);
        uint8_t buf[4 + OPS];
        memcpy(buf, s->config, 4);
        for (size_t k = 4; k < sizeof buf; k++) {
            buf[k] = (uint8_t)(test_rng_next(&x) >> 24);
        }
        if (fwrite(buf, 1, sizeof buf, f) != sizeof buf || fclose(f)) {
            perror(path);
            return 1;
        }
    }
    return 0;
}
