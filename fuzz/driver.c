/*
 * driver.c - runs a libFuzzer target without libFuzzer, so every build
 * (normal, ASan+UBSan) exercises the fuzz targets under CTest:
 *
 *     fuzz_X [--iterations N] [--seed S] CORPUS_DIR_OR_FILE...
 *
 * Each corpus file is run as it is, then N inputs are derived from them by
 * deterministic mutations (bit flips, byte sets to boundary values, inserts,
 * deletes, duplicated runs, splices of two inputs, truncations). A crash or
 * a sanitizer report fails the test; with clang, `make fuzz` links the same
 * targets against libFuzzer for coverage-guided runs.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct input {
    uint8_t *data;
    size_t size;
} input;

static input *inputs;
static size_t ninputs, capinputs;

static void add_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz driver: cannot open %s\n", path);
        exit(2);
    }
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) exit(2);
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (!got) break;
    }
    fclose(f);
    if (ninputs == capinputs) {
        capinputs = capinputs ? capinputs * 2 : 16;
        input *ni = realloc(inputs, capinputs * sizeof *ni);
        if (!ni) exit(2);
        inputs = ni;
    }
    inputs[ninputs++] = (input){buf, n};
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void add_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "fuzz driver: %s does not exist\n", path);
        exit(2);
    }
    if (!S_ISDIR(st.st_mode)) {
        add_file(path);
        return;
    }
    DIR *d = opendir(path);
    if (!d) exit(2);
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char **nn = realloc(names, (n + 1) * sizeof *nn);
        if (!nn) exit(2);
        names = nn;
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        names[n] = malloc(len);
        if (!names[n]) exit(2);
        snprintf(names[n++], len, "%s/%s", path, e->d_name);
    }
    closedir(d);
    if (n == 0) { /* an empty folder (a seed folder whose source is absent) adds nothing */
        free(names);
        return;
    }
    qsort(names, n, sizeof *names, by_name); /* the same order everywhere */
    for (size_t i = 0; i < n; i++) {
        add_file(names[i]);
        free(names[i]);
    }
    free(names);
}

static uint64_t rng;
static uint64_t next(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}

/* Derive one input from the corpus into buf (cap bytes); returns its size. */
static size_t mutate(uint8_t *buf, size_t cap)
{
    const input *a = &inputs[next() % ninputs];
    size_t n = a->size < cap ? a->size : cap;
    memcpy(buf, a->data, n);
    int rounds = 1 + (int)(next() % 4);
    static const uint8_t special[] = {0, 1, 0x7f, 0x80, 0xff, ',', '\n', '\r', '"', '{', '}', '[', ']',
                                      ':', '-', '.', 'e', '9', '0', ' '};
    for (int r = 0; r < rounds; r++) {
        size_t pos = n ? next() % n : 0;
        switch (next() % 7) {
        case 0: /* flip a bit */
            if (n) buf[pos] ^= (uint8_t)(1u << (next() % 8));
            break;
        case 1: /* set a byte to something a parser cares about */
            if (n) buf[pos] = special[next() % sizeof special];
            break;
        case 2: /* insert a byte */
            if (n < cap) {
                memmove(buf + pos + 1, buf + pos, n - pos);
                buf[pos] = special[next() % sizeof special];
                n++;
            }
            break;
        case 3: { /* delete a run */
            size_t len = n - pos ? 1 + next() % (n - pos) % 16 : 0;
            memmove(buf + pos, buf + pos + len, n - pos - len);
            n -= len;
            break;
        }
        case 4: { /* duplicate a run (long numbers, many fields) */
            size_t len = n - pos ? 1 + next() % (n - pos) % 32 : 0;
            if (n + len <= cap) {
                memmove(buf + pos + len, buf + pos, n - pos);
                n += len;
            }
            break;
        }
        case 5: { /* splice the tail of another input */
            const input *b = &inputs[next() % ninputs];
            size_t from = b->size ? next() % b->size : 0, len = b->size - from;
            if (pos + len > cap) len = cap - pos;
            memcpy(buf + pos, b->data + from, len);
            n = pos + len;
            break;
        }
        default: /* truncate */
            n = pos;
            break;
        }
    }
    return n;
}

int main(int argc, char **argv)
{
    long iterations = 5000;
    rng = 0x853c49e6748fea9bull;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--iterations") && i + 1 < argc) iterations = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) rng = strtoull(argv[++i], NULL, 10) | 1;
        else {
            fprintf(stderr, "usage: %s [--iterations N] [--seed S] CORPUS...\n", argv[0]);
            return 2;
        }
    }
    for (; i < argc; i++) add_path(argv[i]);
    if (!ninputs) {
        fprintf(stderr, "fuzz driver: no corpus given\n");
        return 2;
    }
    for (size_t k = 0; k < ninputs; k++) LLVMFuzzerTestOneInput(inputs[k].data, inputs[k].size);
    size_t cap = 1 << 16;
    uint8_t *buf = malloc(cap);
    if (!buf) return 2;
    for (long it = 0; it < iterations; it++) {
        size_t n = mutate(buf, cap);
        /* An exact-size copy, so ASan sees reads past the end. */
        uint8_t *exact = malloc(n ? n : 1);
        if (!exact) return 2;
        memcpy(exact, buf, n);
        LLVMFuzzerTestOneInput(exact, n);
        free(exact);
    }
    free(buf);
    for (size_t k = 0; k < ninputs; k++) free(inputs[k].data);
    free(inputs);
    printf("fuzz driver: %zu corpus inputs and %ld mutations ran clean\n", ninputs, iterations);
    return 0;
}
