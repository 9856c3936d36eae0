/*
 * bench_alloc.c - `llmem bench alloc`: llmem's dynamic pool against glibc,
 * jemalloc, mimalloc and tcmalloc, workload by workload, side by side.
 *
 * Every (workload, allocator) run is a child process (this binary again,
 * with `--child`), so each allocator starts from a clean heap and its
 * resident memory is its own. The other allocators replace malloc through
 * LD_PRELOAD of their Debian libraries; the llmem child calls
 * llmem_pool_alloc/free on one default pool. Both sides go through the same
 * pair of function pointers, so neither gets inlined where the other is not.
 * Rounds rotate the order of the allocators; the table shows medians.
 * Single-threaded workloads run pinned to one CPU, the same for every
 * allocator: on shared virtual machines the cores differ in speed (by a
 * third on the 2-core machine this was written on), which would otherwise
 * decide the winner.
 *
 * Workloads (an operation is one allocation with its free):
 *   tensor_mix    the tensors of llama-2-7b forward passes (dim 4096, ffn
 *                 11008, 32 heads, vocab 32000): prefill of 16-512 tokens and
 *                 decode of batches 1-8, per layer activations, attention
 *                 scores and FFN buffers freed in the order an engine frees
 *                 them, plus request objects living across steps
 *   small         64 K slots of 16 B - 1 KiB toggled at random
 *   cross_thread  one thread allocates 16 B - 1 KiB, another frees
 *   larson_2t/4t  threads churn their own slots and hand them to the next
 *                 thread every round, so most frees are remote
 *   batch_alloc   256 blocks of 16 B - 1 KiB allocated, then freed in a
 *   batch_free    shuffled order, all in cache: each times one half, the
 *                 fast paths' own cost per call (an operation is one call)
 *   burst_idle    1 GiB in 64 B - 1 MiB blocks, each written, then a random
 *                 90% freed and 1 s idle: resident memory after the idle
 *                 against the live bytes
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "commands.h"
#include "llmem/llmem.h"
#include "tensor_mix.h"

#ifndef LLMEM_MULTIARCH
#define LLMEM_MULTIARCH ""
#endif

/* ---- the allocator under test -------------------------------------------- */

static void *(*A_alloc)(size_t);
static void (*A_free)(void *);
static llmem_pool *g_pool;

static void *pool_alloc(size_t n) { return llmem_pool_alloc(g_pool, n, NULL); }
static void pool_free(void *p) { llmem_pool_free(g_pool, p); }
static void *sys_alloc(size_t n) { return malloc(n); }
static void sys_free(void *p) { free(p); }

static void *must(void *p, size_t n)
{
    if (!p) {
        fprintf(stderr, "bench alloc: allocation of %zu bytes failed\n", n);
        exit(3);
    }
    return p;
}

static size_t proc_status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t v = 0, kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') v = strtoull(line + kl + 1, NULL, 10);
    fclose(f);
    return v;
}

typedef struct result {
    uint64_t ops;
    double seconds;
    uint64_t live_bytes, rss_after_idle_bytes;
} result;

/* ---- workloads --------------------------------------------------------------- */

/* A log-uniform size in [lo, hi]: a power of two picked uniformly, then a
 * uniform mantissa. */
static size_t log_uniform(uint64_t *s, size_t lo, size_t hi)
{
    unsigned e_lo = 0, e_hi = 0;
    while (((size_t)1 << e_lo) < lo) e_lo++;
    while (((size_t)1 << e_hi) < hi) e_hi++;
    unsigned e = e_lo + (unsigned)(bench_rand(s) % (e_hi - e_lo + 1));
    size_t base = (size_t)1 << e;
    size_t n = base + (size_t)(bench_rand(s) % base);
    return n < lo ? lo : n > hi ? hi : n;
}

static void *mix_alloc(void *ctx, size_t n)
{
    (void)ctx;
    return must(A_alloc(n), n);
}

static void mix_free(void *ctx, void *p, size_t n)
{
    (void)ctx;
    (void)n;
    A_free(p);
}

static result w_tensor_mix(bool quick)
{
    tensor_mix_ops ops = {mix_alloc, mix_free, NULL};
    uint64_t t0 = llmem_time_now_ns();
    uint64_t n = tensor_mix_run(quick ? 60 : 300, 7, &tensor_mix_llama2_7b, &ops);
    return (result){n, (double)(llmem_time_now_ns() - t0) / 1e9, 0, 0};
}

static result w_small(bool quick)
{
    enum { SLOTS = 65536 };
    void **slot = calloc(SLOTS, sizeof *slot);
    uint64_t s = 11, ops = 0, target = quick ? 2000000 : 10000000;
    uint64_t t0 = llmem_time_now_ns();
    while (ops < target) {
        size_t k = (size_t)(bench_rand(&s) % SLOTS);
        if (slot[k]) {
            A_free(slot[k]);
            slot[k] = NULL;
        } else {
            size_t n = 16 + bench_rand(&s) % 1009;
            slot[k] = must(A_alloc(n), n);
            *(volatile char *)slot[k] = 1;
            ops++;
        }
    }
    double sec = (double)(llmem_time_now_ns() - t0) / 1e9;
    for (size_t k = 0; k < SLOTS; k++)
        if (slot[k]) A_free(slot[k]);
    free(slot);
    return (result){ops, sec, 0, 0};
}

/* cross_thread: a single-producer single-consumer ring of pointers. */
enum { RING = 4096 };
typedef struct ring {
    void *slot[RING];
    uint64_t head; /* written by the consumer */
    uint64_t tail; /* written by the producer */
    uint64_t n;
} ring;

static void *consumer(void *arg)
{
    ring *r = arg;
    uint64_t head = 0;
    while (head < r->n) {
        uint64_t tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
        while (head < tail) {
            A_free(r->slot[head % RING]);
            head++;
        }
        __atomic_store_n(&r->head, head, __ATOMIC_RELEASE);
    }
    return NULL;
}

static result w_cross_thread(bool quick)
{
    ring *r = calloc(1, sizeof *r);
    r->n = quick ? 1000000 : 5000000;
    pthread_t t;
    uint64_t s = 13;
    uint64_t t0 = llmem_time_now_ns();
    pthread_create(&t, NULL, consumer, r);
    for (uint64_t i = 0; i < r->n; i++) {
        while (i - __atomic_load_n(&r->head, __ATOMIC_ACQUIRE) >= RING) {
        }
        size_t n = 16 + bench_rand(&s) % 1009;
        void *p = must(A_alloc(n), n);
        *(volatile char *)p = 1;
        r->slot[i % RING] = p;
        __atomic_store_n(&r->tail, i + 1, __ATOMIC_RELEASE);
    }
    pthread_join(t, NULL);
    double sec = (double)(llmem_time_now_ns() - t0) / 1e9;
    uint64_t n = r->n;
    free(r);
    return (result){n, sec, 0, 0};
}

/* larson: threads churn slot arrays and pass them on each round. */
enum { LSLOTS = 4096 };
typedef struct larson {
    int threads;
    uint64_t per_round, rounds;
    void **arrays[8];
    pthread_barrier_t bar;
} larson;

typedef struct larg {
    larson *L;
    int id;
} larg;

static void *larson_worker(void *arg)
{
    larg *a = arg;
    larson *L = a->L;
    uint64_t s = 17 + (uint64_t)a->id;
    for (uint64_t round = 0; round < L->rounds; round++) {
        void **slot = L->arrays[(a->id + round) % (uint64_t)L->threads];
        for (uint64_t i = 0; i < L->per_round; i++) {
            size_t k = (size_t)(bench_rand(&s) % LSLOTS);
            if (slot[k]) A_free(slot[k]);
            size_t n = 16 + bench_rand(&s) % 1009;
            slot[k] = must(A_alloc(n), n);
            *(volatile char *)slot[k] = 1;
        }
        pthread_barrier_wait(&L->bar);
    }
    return NULL;
}

static result w_larson(int threads, bool quick)
{
    larson L = {threads, quick ? 50000 : 200000, 10, {0}, {{0}}};
    for (int i = 0; i < threads; i++) L.arrays[i] = calloc(LSLOTS, sizeof(void *));
    pthread_barrier_init(&L.bar, NULL, (unsigned)threads);
    pthread_t t[8];
    larg a[8];
    uint64_t t0 = llmem_time_now_ns();
    for (int i = 0; i < threads; i++) {
        a[i] = (larg){&L, i};
        pthread_create(&t[i], NULL, larson_worker, &a[i]);
    }
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    double sec = (double)(llmem_time_now_ns() - t0) / 1e9;
    for (int i = 0; i < threads; i++) {
        for (size_t k = 0; k < LSLOTS; k++)
            if (L.arrays[i][k]) A_free(L.arrays[i][k]);
        free(L.arrays[i]);
    }
    pthread_barrier_destroy(&L.bar);
    return (result){(uint64_t)threads * L.per_round * L.rounds, sec, 0, 0};
}

/* batch_alloc, batch_free: a batch of 256 blocks of 16-1024 bytes
 * allocated (each touched once, as a program would), then freed in a
 * shuffled order, over and over; each workload times one of the two
 * phases. The batch stays in L1/L2 and in the thread cache, and no branch
 * of the bench depends on the allocator's result, so consecutive calls
 * overlap and the figure is the fast path's own cost: its instructions and
 * the dependent loads of its lookups, with no cache miss to hide them
 * (docs/BENCHMARKS.md, "where the small-block free spends its time"). */
enum { BATCH = 256 };

static result w_batch(bool quick, bool time_free)
{
    void *v[BATCH];
    size_t sz[BATCH];
    uint32_t order[BATCH];
    uint64_t s = 23, rounds = quick ? 20000 : 100000, ns = 0;
    for (uint32_t i = 0; i < BATCH; i++) {
        sz[i] = 16 + bench_rand(&s) % 1009;
        order[i] = i;
    }
    for (uint32_t i = BATCH - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(bench_rand(&s) % (i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (uint64_t r = 0; r <= rounds; r++) { /* round 0 warms the caches, untimed */
        uint64_t t0 = llmem_time_now_ns();
        for (uint32_t i = 0; i < BATCH; i++) {
            v[i] = must(A_alloc(sz[i]), sz[i]);
            *(volatile char *)v[i] = 1;
        }
        uint64_t t1 = llmem_time_now_ns();
        for (uint32_t i = 0; i < BATCH; i++) A_free(v[order[i]]);
        uint64_t t2 = llmem_time_now_ns();
        if (r) ns += time_free ? t2 - t1 : t1 - t0;
    }
    return (result){rounds * BATCH, (double)ns / 1e9, 0, 0};
}

static result w_batch_alloc(bool quick) { return w_batch(quick, false); }
static result w_batch_free(bool quick) { return w_batch(quick, true); }

static result w_burst_idle(bool quick)
{
    size_t total = quick ? (size_t)256 << 20 : (size_t)1 << 30, sum = 0, n = 0, cap = 1 << 16;
    void **v = malloc(cap * sizeof *v);
    size_t *sz = malloc(cap * sizeof *sz);
    uint64_t s = 19;
    uint64_t t0 = llmem_time_now_ns();
    while (sum < total) {
        if (n == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
            sz = realloc(sz, cap * sizeof *sz);
        }
        size_t k = log_uniform(&s, 64, (size_t)1 << 20);
        v[n] = must(A_alloc(k), k);
        memset(v[n], 1, k);
        sz[n++] = k;
        sum += k;
    }
    double sec = (double)(llmem_time_now_ns() - t0) / 1e9;
    size_t live = 0;
    for (size_t i = 0; i < n; i++) {
        if (bench_rand(&s) % 10 != 0) {
            A_free(v[i]);
            v[i] = NULL;
        } else {
            live += sz[i];
        }
    }
    sleep(1);
    uint64_t rss = (uint64_t)proc_status_kb("VmRSS") * 1024;
    for (size_t i = 0; i < n; i++)
        if (v[i]) A_free(v[i]);
    free(v);
    free(sz);
    return (result){n, sec, live, rss};
}

typedef struct workload {
    const char *name;
    result (*run)(bool quick);
    int threads;
} workload;

static result run_larson2(bool q) { return w_larson(2, q); }
static result run_larson4(bool q) { return w_larson(4, q); }

static const workload workloads[] = {
    {"tensor_mix", w_tensor_mix, 1}, {"small", w_small, 1},         {"cross_thread", w_cross_thread, 2},
    {"larson_2t", run_larson2, 2},   {"larson_4t", run_larson4, 4}, {"batch_alloc", w_batch_alloc, 1},
    {"batch_free", w_batch_free, 1}, {"burst_idle", w_burst_idle, 1}, /* burst_idle last: see the summary */
};
#define NW (sizeof workloads / sizeof workloads[0])

/* ---- allocators ------------------------------------------------------------ */

typedef struct allocator {
    const char *name;
    const char *lib; /* LD_PRELOAD soname, NULL for llmem and glibc */
} allocator;

static const allocator allocators[] = {
    {"llmem", NULL},
    {"glibc", NULL},
    {"jemalloc", "libjemalloc.so.2"},
    {"mimalloc", "libmimalloc.so.2"},
    {"tcmalloc", "libtcmalloc_minimal.so.4"},
};
#define NA (sizeof allocators / sizeof allocators[0])

static bool find_lib(const char *so, char *path, size_t cap)
{
    const char *dirs[] = {"/usr/lib/" LLMEM_MULTIARCH, "/usr/lib64", "/usr/lib", "/usr/local/lib", "/lib/" LLMEM_MULTIARCH};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(path, cap, "%s/%s", dirs[i], so);
        if (access(path, R_OK) == 0) return true;
    }
    return false;
}

/* ---- child --------------------------------------------------------------------- */

static int child(const char *wname, const char *aname, bool quick)
{
    const workload *w = NULL;
    for (size_t i = 0; i < NW; i++)
        if (!strcmp(workloads[i].name, wname)) w = &workloads[i];
    if (!w) return 2;
    if (!strcmp(aname, "llmem")) {
        if (llmem_pool_create(NULL, &g_pool)) {
            fprintf(stderr, "bench alloc: %s\n", llmem_error_message());
            return 1;
        }
        A_alloc = pool_alloc;
        A_free = pool_free;
    } else {
        A_alloc = sys_alloc;
        A_free = sys_free;
    }
    result r = w->run(quick);
    uint64_t peak = (uint64_t)proc_status_kb("VmHWM") * 1024;
    printf("%llu %.9f %llu %llu %llu\n", (unsigned long long)r.ops, r.seconds, (unsigned long long)peak,
           (unsigned long long)r.live_bytes, (unsigned long long)r.rss_after_idle_bytes);
    llmem_pool_destroy(g_pool);
    return 0;
}

/* The CPU single-threaded children run on: the first one we may use. */
static int bench_cpu(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) return c;
    return -1;
}

/* Run one child; false if it failed. */
static bool spawn(const char *self, const workload *w, const allocator *a, const char *lib, bool quick, result *r,
                  uint64_t *peak)
{
    int cpu = w->threads == 1 ? bench_cpu() : -1;
    int fd[2];
    if (pipe(fd) != 0) return false;
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        close(fd[1]);
        if (lib) setenv("LD_PRELOAD", lib, 1);
        else unsetenv("LD_PRELOAD");
        if (cpu >= 0) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            sched_setaffinity(0, sizeof one, &one);
        }
        execl(self, self, "bench", "alloc", "--child", w->name, a->name, quick ? "--quick" : "--full", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[256] = {0};
    size_t got = 0;
    ssize_t k;
    while (got < sizeof buf - 1 && (k = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)k;
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
    unsigned long long ops, pk, live, rss;
    double sec;
    if (sscanf(buf, "%llu %lf %llu %llu %llu", &ops, &sec, &pk, &live, &rss) != 5) return false;
    *r = (result){ops, sec, live, rss};
    *peak = pk;
    return true;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: llmem bench alloc [--json] [--quick] [--rounds N] [--only W,W...]\n\n"
               "llmem's pool against glibc, jemalloc, mimalloc and tcmalloc (those installed), each\n"
               "(workload, allocator) in its own process, rounds in rotating order, medians reported.\n"
               "  --json      one JSON array: workload, allocator, ops_per_sec, peak_rss_bytes\n"
               "              (and live_bytes, rss_after_idle_bytes for burst_idle)\n"
               "  --quick     smaller workloads (CI smoke runs)\n"
               "  --rounds N  runs per (workload, allocator); default 3\n"
               "  --only W,.. these workloads only (tensor_mix, small, cross_thread, larson_2t,\n"
               "              larson_4t, batch_alloc, batch_free, burst_idle): a shorter locked run\n"
               "              on a shared machine\n"
               "batch_alloc and batch_free time the two halves of one loop (256 blocks allocated,\n"
               "then freed shuffled; all in cache): the fast paths' own cost, per call.\n");
}

int llmem_bench_alloc(int argc, char **argv)
{
    bool json = false, quick = false;
    int rounds = 3;
    bool want[NW];
    for (size_t w = 0; w < NW; w++) want[w] = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--child") && i + 2 < argc) {
            bool q = i + 3 < argc && !strcmp(argv[i + 3], "--quick");
            return child(argv[i + 1], argv[i + 2], q);
        }
        if (bench_common_arg(argc, argv, &i, &json, &quick, &rounds)) continue;
        if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            const char *list = argv[++i];
            for (size_t w = 0; w < NW; w++) want[w] = false;
            for (const char *t = list; *t;) {
                size_t n = strcspn(t, ",");
                bool found = false;
                for (size_t w = 0; w < NW; w++)
                    if (strlen(workloads[w].name) == n && !strncmp(workloads[w].name, t, n)) want[w] = found = true;
                if (!found) {
                    fprintf(stderr, "llmem bench alloc: --only: no workload '%.*s'\n", (int)n, t);
                    return 2;
                }
                t += n + (t[n] == ',');
            }
        }
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!bench_rounds_ok("alloc", rounds, 50)) return 2;
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) return 1;
    self[sl] = '\0';
    char libs[NA][512];
    bool have[NA];
    for (size_t a = 0; a < NA; a++) {
        have[a] = !allocators[a].lib || find_lib(allocators[a].lib, libs[a], sizeof libs[a]);
        if (!have[a] && !json)
            fprintf(stderr, "llmem bench alloc: %s not installed (%s), skipped; `make deps` installs it\n",
                    allocators[a].name, allocators[a].lib);
    }
    double (*ops)[NA] = calloc(NW * (size_t)rounds, sizeof *ops);
    uint64_t peak[NW][NA] = {{0}}, live[NW][NA] = {{0}}, idle[NW][NA] = {{0}};
    for (int r = 0; r < rounds; r++) {
        for (size_t w = 0; w < NW; w++) {
            for (size_t k = 0; k < NA && want[w]; k++) {
                size_t a = (k + (size_t)r) % NA;
                if (!have[a]) continue;
                bench_progress("bench alloc: round %d/%d %s on %s", r + 1, rounds, workloads[w].name,
                               allocators[a].name);
                result res;
                uint64_t pk;
                if (!spawn(self, &workloads[w], &allocators[a], allocators[a].lib ? libs[a] : NULL, quick, &res, &pk)) {
                    bench_progress_done();
                    fprintf(stderr, "llmem bench alloc: %s on %s failed\n", workloads[w].name, allocators[a].name);
                    free(ops);
                    return 1;
                }
                ops[w * (size_t)rounds + (size_t)r][a] = (double)res.ops / res.seconds;
                if (pk > peak[w][a]) peak[w][a] = pk;
                live[w][a] = res.live_bytes;
                if (!idle[w][a] || res.rss_after_idle_bytes < idle[w][a]) idle[w][a] = res.rss_after_idle_bytes;
            }
        }
    }
    bench_progress_done();
    double med[NW][NA];
    for (size_t w = 0; w < NW; w++)
        for (size_t a = 0; a < NA; a++) {
            double v[50];
            for (int r = 0; r < rounds; r++) v[r] = ops[w * (size_t)rounds + (size_t)r][a];
            med[w][a] = have[a] ? bench_median(v, (size_t)rounds) : 0;
        }
    free(ops);
    if (json) {
        printf("[");
        bool first = true;
        for (size_t w = 0; w < NW; w++)
            for (size_t a = 0; a < NA; a++) {
                if (!have[a] || !want[w]) continue;
                printf("%s{\"workload\":\"%s\",\"allocator\":\"%s\",\"ops_per_sec\":%.0f,\"peak_rss_bytes\":%llu",
                       first ? "" : ",", workloads[w].name, allocators[a].name, med[w][a],
                       (unsigned long long)peak[w][a]);
                if (!strcmp(workloads[w].name, "burst_idle"))
                    printf(",\"live_bytes\":%llu,\"rss_after_idle_bytes\":%llu", (unsigned long long)live[w][a],
                           (unsigned long long)idle[w][a]);
                printf("}");
                first = false;
            }
        printf("]\n");
        return 0;
    }
    printf("llmem %s bench alloc: median Mops/s of %d rounds (ratio: llmem / best other)%s\n\n", llmem_version(),
           rounds, quick ? ", quick" : "");
    printf("%-13s", "workload");
    for (size_t a = 0; a < NA; a++)
        if (have[a]) printf(" %10s", allocators[a].name);
    printf(" %8s\n", "ratio");
    for (size_t w = 0; w < NW; w++) {
        if (!want[w]) continue;
        printf("%-13s", workloads[w].name);
        double best = 0;
        for (size_t a = 0; a < NA; a++) {
            if (!have[a]) continue;
            printf(" %10.2f", med[w][a] / 1e6);
            if (a && med[w][a] > best) best = med[w][a];
        }
        printf(" %7.2fx\n", best > 0 ? med[w][0] / best : 0);
    }
    printf("\npeak RSS (MiB)");
    for (size_t w = 0; w < NW; w++) {
        if (!want[w]) continue;
        printf("\n%-13s", workloads[w].name);
        for (size_t a = 0; a < NA; a++)
            if (have[a]) printf(" %10.1f", (double)peak[w][a] / (1 << 20));
    }
    size_t bi = NW - 1;
    if (!want[bi]) {
        printf("\n");
        return 0;
    }
    printf("\n\nburst_idle: resident after 1 s idle / live bytes");
    for (size_t a = 0; a < NA; a++)
        if (have[a] && live[bi][a])
            printf("\n  %-10s %7.1f MiB / %7.1f MiB = %.2fx", allocators[a].name, (double)idle[bi][a] / (1 << 20),
                   (double)live[bi][a] / (1 << 20), (double)idle[bi][a] / (double)live[bi][a]);
    printf("\n");
    return 0;
}
