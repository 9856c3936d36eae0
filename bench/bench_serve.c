/*
 * bench_serve.c - `llmem bench serve`: the server under open-loop load over
 * loopback, as a client sees it.
 *
 * For each configuration the benchmark starts a server in this process
 * (llmem/server.h, a free port on 127.0.0.1), then one client thread per
 * request connects at its arrival time (Poisson arrivals at --rate, seeded:
 * open loop, arrivals never wait for answers) and streams a completion:
 * its prompt is token ids (exact lengths), its lengths the first
 * --requests of the Azure code trace, prompts scaled by the model's context
 * / 8192 (the trace's contexts reach 8k), outputs as they are (clipped to
 * the context). Greedy. The client measures TTFT (request sent to the
 * first chunk with text), TPOT ((last text chunk - first) / (tokens - 1),
 * tokens from the final usage chunk) and end-to-end latency; a sampler
 * thread reads GET /metrics every 50 ms (KV usage, requests running).
 * Peak RSS is the process's VmHWM, reset before each configuration.
 *
 * Configurations: paged against static KV at the same --kv-budget (prefix
 * cache off in both: the strategies alone), then the prefix cache on
 * against off with a shared system prompt of --system-tokens before every
 * request (paged). Bounded: --requests requests, each configuration at
 * most --seconds. A benchmark, not a test: numbers go to
 * docs/BENCHMARKS.md with the command.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "tool_util.h"
#include "llmem/llmem.h"
#include "llmem/server.h"

typedef struct job {
    double arrival_s;
    int32_t *prompt;
    uint32_t prompt_len, max_tokens;
    /* results */
    bool ok;
    double ttft, tpot, e2e;
    uint32_t tokens;
} job;

typedef struct run {
    uint16_t port;
    job *jobs;
    size_t njobs;
    uint64_t t0_ns;
    double deadline_s;
    volatile bool sampling;
    double kv_sum, kv_max;
    uint32_t running_max;
    size_t samples;
    /* Over the samples with a sequence running (as llmem replay's
     * time-weighted figures are over busy steps): sequences running, and
     * KV tokens written / tokens reserved (replay's KV utilisation). */
    double seq_sum, util_sum;
    size_t busy;
} run;

static double now_s(void) { return (double)llmem_time_now_ns() * 1e-9; }

static int connect_port(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    struct timeval tv = {120, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static bool send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* GET path into buf (NUL-terminated, cut at cap). */
static size_t http_get(uint16_t port, const char *path, char *buf, size_t cap)
{
    int fd = connect_port(port);
    if (fd < 0) return 0;
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    size_t got = 0;
    if (send_all(fd, req, (size_t)n)) {
        ssize_t r;
        while (got + 1 < cap && (r = recv(fd, buf + got, cap - 1 - got, 0)) > 0) got += (size_t)r;
    }
    buf[got] = 0;
    close(fd);
    return got;
}

static double metric(const char *text, const char *name)
{
    const char *p = text;
    size_t l = strlen(name);
    while ((p = strstr(p, name))) {
        if ((p == text || p[-1] == '\n') && p[l] == '{') {
            const char *v = strchr(p, '}');
            return v ? strtod(v + 1, NULL) : 0;
        }
        p += l;
    }
    return 0;
}

static void *sampler(void *arg)
{
    run *r = arg;
    char *buf = malloc(1 << 20);
    while (buf && r->sampling) {
        if (http_get(r->port, "/metrics", buf, 1 << 20)) {
            double kv = metric(buf, "vllm:kv_cache_usage_perc");
            double running = metric(buf, "vllm:num_requests_running");
            double seqs = metric(buf, "llmem_sched_sequences_running");
            double written = metric(buf, "llmem_kv_tokens_written"), reserved = metric(buf, "llmem_kv_tokens_reserved");
            r->kv_sum += kv;
            if (kv > r->kv_max) r->kv_max = kv;
            if (running > r->running_max) r->running_max = (uint32_t)running;
            r->samples++;
            if (seqs > 0) {
                r->seq_sum += seqs;
                r->util_sum += reserved > 0 ? written / reserved : 0;
                r->busy++;
            }
        }
        usleep(50000);
    }
    free(buf);
    return NULL;
}

typedef struct client_arg {
    run *r;
    job *j;
} client_arg;

static void *client(void *arg)
{
    client_arg *ca = arg;
    run *r = ca->r;
    job *j = ca->j;
    double start = (double)r->t0_ns * 1e-9 + j->arrival_s;
    double wait = start - now_s();
    if (wait > 0) usleep((useconds_t)(wait * 1e6));
    if (now_s() - (double)r->t0_ns * 1e-9 > r->deadline_s) return NULL;
    size_t cap = 64 + 12 * (size_t)j->prompt_len + 256;
    char *body = malloc(cap);
    if (!body) return NULL;
    size_t o = (size_t)snprintf(body, cap, "{\"prompt\":[");
    for (uint32_t i = 0; i < j->prompt_len; i++) o += (size_t)snprintf(body + o, cap - o, i ? ",%d" : "%d", j->prompt[i]);
    o += (size_t)snprintf(body + o, cap - o,
                          "],\"max_tokens\":%u,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                          j->max_tokens);
    char head[256];
    int hn = snprintf(head, sizeof head,
                      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      o);
    int fd = connect_port(r->port);
    double t_send = now_s(), t_first = 0, t_last = 0;
    size_t len = 0, bcap = 1 << 16, scan = 0;
    char *resp = malloc(bcap);
    bool ok = fd >= 0 && resp && send_all(fd, head, (size_t)hn) && send_all(fd, body, o);
    while (ok) {
        if (len + 4096 + 1 > bcap) {
            char *nb = realloc(resp, bcap * 2);
            if (!nb) break;
            resp = nb;
            bcap *= 2;
        }
        ssize_t n = recv(fd, resp + len, bcap - len - 1, 0);
        if (n <= 0) break;
        len += (size_t)n;
        resp[len] = 0;
        double t = now_s();
        /* A chunk with text: "text":" followed by anything but the quote. */
        const char *p = resp + (scan > 8 ? scan - 8 : 0);
        while ((p = strstr(p, "\"text\":\""))) {
            if (p[8] != '"') {
                if (!t_first) t_first = t;
                t_last = t;
            }
            p += 8;
        }
        scan = len;
    }
    if (fd >= 0) close(fd);
    const char *u = resp ? strstr(resp, "\"completion_tokens\":") : NULL;
    if (u && strstr(resp, "data: [DONE]") && t_first) {
        j->tokens = (uint32_t)strtoul(u + 20, NULL, 10);
        j->ttft = t_first - t_send;
        j->e2e = now_s() - t_send;
        j->tpot = j->tokens > 1 ? (t_last - t_first) / (j->tokens - 1) : -1;
        j->ok = true;
    }
    free(resp);
    free(body);
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (!n) return NAN;
    qsort(v, n, sizeof *v, cmp_d);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

static uint64_t hwm_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = strtoull(line + 6, NULL, 10);
    fclose(f);
    return kb * 1024;
}

static void reset_hwm(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

typedef struct config {
    const char *name;
    llmem_kv_strategy kv;
    bool prefix_cache;
    bool system_prompt;
} config;

/* The configuration's own step model (llmem_server_step_model), printed
 * after the table: the clock for llmem replay on the same trace. */
typedef struct fitted {
    bool ok;
    llmem_step_model m;
    llmem_server_step_fit f;
    char why[200];
} fitted;

static int run_config(const config *c, const llmem_server_options *base, job *jobs, size_t n, double seconds,
                      fitted *fit)
{
    llmem_server_options o = *base;
    o.kv_strategy = c->kv;
    o.no_prefix_cache = !c->prefix_cache;
    o.port = LLMEM_SERVER_PORT_ANY;
    llmem_server *s;
    reset_hwm();
    llmem_status st = llmem_server_create(&o, &s);
    if (st) {
        fprintf(stderr, "llmem bench serve: %s: %s\n", c->name, llmem_error_message());
        return 1;
    }
    run r;
    memset(&r, 0, sizeof r);
    r.port = llmem_server_port(s);
    r.jobs = jobs;
    r.njobs = n;
    r.deadline_s = seconds;
    r.sampling = true;
    pthread_t smp;
    pthread_create(&smp, NULL, sampler, &r);
    pthread_t *th = calloc(n, sizeof *th);
    client_arg *ca = calloc(n, sizeof *ca);
    r.t0_ns = llmem_time_now_ns();
    for (size_t i = 0; i < n; i++) {
        jobs[i].ok = false;
        ca[i].r = &r;
        ca[i].j = &jobs[i];
        pthread_create(&th[i], NULL, client, &ca[i]);
    }
    for (size_t i = 0; i < n; i++) pthread_join(th[i], NULL);
    double wall = (double)(llmem_time_now_ns() - r.t0_ns) * 1e-9;
    r.sampling = false;
    pthread_join(smp, NULL);
    char *mbuf = malloc(1 << 20);
    double hits = 0, queries = 0, preempt = 0;
    if (mbuf && http_get(r.port, "/metrics", mbuf, 1 << 20)) {
        hits = metric(mbuf, "vllm:prefix_cache_hits_total");
        queries = metric(mbuf, "vllm:prefix_cache_queries_total");
        preempt = metric(mbuf, "vllm:num_preemptions_total");
    }
    free(mbuf);
    fit->f.struct_size = sizeof fit->f;
    fit->ok = !llmem_server_step_model(s, &fit->m, &fit->f);
    if (!fit->ok) snprintf(fit->why, sizeof fit->why, "%s", llmem_error_message());
    uint64_t hwm = hwm_bytes();
    llmem_server_shutdown_report rep;
    llmem_server_shutdown(s, 1000, &rep);
    llmem_server_destroy(s);

    double *ttft = calloc(n, sizeof *ttft), *tpot = calloc(n, sizeof *tpot), *e2e = calloc(n, sizeof *e2e);
    size_t ok = 0, nt = 0;
    uint64_t tokens = 0;
    for (size_t i = 0; i < n; i++) {
        if (!jobs[i].ok) continue;
        ttft[ok] = jobs[i].ttft;
        e2e[ok] = jobs[i].e2e;
        if (jobs[i].tpot >= 0) tpot[nt++] = jobs[i].tpot;
        tokens += jobs[i].tokens;
        ok++;
    }
    printf("%-22s %4zu/%-4zu %8.1f %8.1f %8.2f %8.2f %8.3f %8.3f %8.1f %6.1f%% %6.1f%% %6.1f%% %4u %5.1f %6.0f %6.1f%% "
           "%7.1f\n",
           c->name, ok, n, pct(ttft, ok, .5) * 1e3, pct(ttft, ok, .99) * 1e3, pct(tpot, nt, .5) * 1e3,
           pct(tpot, nt, .99) * 1e3, pct(e2e, ok, .5), pct(e2e, ok, .99), (double)tokens / wall,
           r.samples ? 100 * r.kv_sum / (double)r.samples : 0, 100 * r.kv_max,
           r.busy ? 100 * r.util_sum / (double)r.busy : 0, r.running_max, r.busy ? r.seq_sum / (double)r.busy : 0,
           preempt,
           queries > 0 ? 100 * hits / queries : 0, (double)hwm / 1048576.0);
    fflush(stdout);
    free(ttft);
    free(tpot);
    free(e2e);
    free(th);
    free(ca);
    return rep.leaked_mappings ? 1 : 0;
}

/* The workload as a trace llmem replay reads (llmem/trace.h): arrivals in
 * seconds, exact prompt lengths, output lengths as asked (max_tokens), and
 * the shared system prompt as a declared prefix. */
static int write_trace(const char *path, const job *jobs, size_t n, uint32_t sys_tokens)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "llmem bench serve: %s: %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(f, "arrival_s,prompt_tokens,output_tokens%s\n", sys_tokens ? ",prefix_id,prefix_tokens" : "");
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%.6f,%u,%u", jobs[i].arrival_s, jobs[i].prompt_len, jobs[i].max_tokens);
        if (sys_tokens) fprintf(f, ",1,%u", sys_tokens);
        fputc('\n', f);
    }
    if (fclose(f)) {
        fprintf(stderr, "llmem bench serve: %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: llmem bench serve MODEL [-z TOKENIZER] [--trace CSV] [--requests N] [--rate R]\n"
               "                         [--kv-budget BYTES] [--max-batch N] [--threads N] [--seconds S]\n"
               "                         [--system-tokens N] [--seed N] [--write-trace PREFIX] [--only paged|static|prefix]\n"
               "Open-loop streaming load over loopback against an in-process server: paged against static KV\n"
               "at the same budget, then the prefix cache on against off with a shared system prompt.\n"
               "  --trace CSV        request lengths (default ../shared/traces/AzureLLMInferenceTrace_code.csv)\n"
               "  --requests N       requests per configuration (default 48)\n"
               "  --rate R           Poisson arrivals per second (default 8)\n"
               "  --kv-budget BYTES  KV budget for every configuration (default 4MiB)\n"
               "  --max-batch N      sequences at once (default 32)\n"
               "  --seconds S        no arrival after S seconds per configuration (default 60)\n"
               "  --system-tokens N  the shared system prompt (default: a quarter of the context)\n"
               "  --write-trace P    write the workload as traces for llmem replay: P.csv (the requests),\n"
               "                     P-sys.csv (with the system prompt as prefix_id 1)\n"
               "  --only C           run one pair only: paged (paged alone), static, or prefix (on and off)\n");
}

int llmem_bench_serve(int argc, char **argv)
{
    llmem_server_options o = llmem_server_options_default();
    const char *trace_path = "../shared/traces/AzureLLMInferenceTrace_code.csv", *write_prefix = NULL, *only = NULL;
    uint32_t nreq = 48, seed = 1, sys_tokens = 0, u;
    double rate = 8, seconds = 60;
    o.kv_budget_bytes = 4u << 20;
    o.max_batch = 32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (a[0] != '-') {
            o.model_path = a;
            continue;
        }
        if (!v) {
            fprintf(stderr, "llmem bench serve: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "-z")) o.tokenizer_path = v;
        else if (!strcmp(a, "--trace")) trace_path = v;
        else if (!strcmp(a, "--write-trace")) write_prefix = v;
        else if (!strcmp(a, "--only") && (!strcmp(v, "paged") || !strcmp(v, "static") || !strcmp(v, "prefix"))) only = v;
        else if (!strcmp(a, "--requests") && tool_parse_u32(v, 1, 4096, &nreq)) continue;
        else if (!strcmp(a, "--seed") && tool_parse_u32(v, 0, UINT32_MAX, &seed)) continue;
        else if (!strcmp(a, "--system-tokens") && tool_parse_u32(v, 1, 1u << 20, &sys_tokens)) continue;
        else if (!strcmp(a, "--max-batch") && tool_parse_u32(v, 1, 4096, &o.max_batch)) continue;
        else if (!strcmp(a, "--threads") && tool_parse_u32(v, 1, 1024, &u)) o.threads = u;
        else if (!strcmp(a, "--rate") && (rate = strtod(v, NULL)) > 0) continue;
        else if (!strcmp(a, "--seconds") && (seconds = strtod(v, NULL)) > 0) continue;
        else if (!strcmp(a, "--kv-budget") && tool_parse_bytes(v) > 0) o.kv_budget_bytes = (size_t)tool_parse_bytes(v);
        else {
            fprintf(stderr, "llmem bench serve: bad option %s %s (llmem bench serve --help)\n", a, v);
            return 2;
        }
    }
    if (!o.model_path) {
        usage(stderr);
        return 2;
    }
    llmem_trace tr;
    memset(&tr, 0, sizeof tr);
    if (llmem_trace_load(trace_path, &tr)) {
        fprintf(stderr, "llmem bench serve: %s\n", llmem_error_message());
        return 1;
    }
    /* The model's context and vocabulary, from a server started once. */
    llmem_server_options probe = o;
    probe.port = LLMEM_SERVER_PORT_ANY;
    llmem_server *s;
    if (llmem_server_create(&probe, &s)) {
        fprintf(stderr, "llmem bench serve: %s\n", llmem_error_message());
        llmem_trace_free(&tr);
        return 1;
    }
    char buf[4096];
    http_get(llmem_server_port(s), "/v1/models", buf, sizeof buf);
    const char *ml = strstr(buf, "\"max_model_len\":");
    uint32_t ctx = ml ? (uint32_t)strtoul(ml + 16, NULL, 10) : 0;
    llmem_model_options mo = llmem_model_options_default();
    llmem_model *m = NULL;
    uint32_t vocab = 0;
    if (!llmem_model_open(o.model_path, &mo, &m)) vocab = llmem_model_get_config(m)->shape.vocab;
    llmem_model_close(m);
    llmem_server_destroy(s);
    if (ctx < 16 || vocab < 8) {
        fprintf(stderr, "llmem bench serve: cannot read the model's context and vocabulary\n");
        llmem_trace_free(&tr);
        return 1;
    }
    if (!sys_tokens) sys_tokens = ctx / 4;
    if (sys_tokens > ctx / 2) sys_tokens = ctx / 2;

    size_t n = nreq < tr.count ? nreq : tr.count;
    job *plain = calloc(n, sizeof *plain), *withsys = calloc(n, sizeof *withsys);
    int32_t *sys = malloc(sys_tokens * sizeof *sys);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
#define RNG() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    for (uint32_t i = 0; i < sys_tokens; i++) sys[i] = 3 + (int32_t)(RNG() % (vocab - 3));
    double t = 0;
    uint64_t ptok = 0, otok = 0;
    for (size_t i = 0; i < n; i++) {
        t += -log(((double)(RNG() % 1000000) + 1) / 1000001.0) / rate;
        uint32_t p = (uint32_t)lround((double)tr.req[i].prompt_tokens * ctx / 8192.0);
        if (p < 1) p = 1;
        if (p > ctx / 2 - 1) p = ctx / 2 - 1;
        uint32_t out = tr.req[i].output_tokens ? tr.req[i].output_tokens : 1;
        for (int k = 0; k < 2; k++) {
            job *j = k ? &withsys[i] : &plain[i];
            uint32_t extra = k ? sys_tokens : 0;
            j->arrival_s = t;
            j->prompt_len = p + extra;
            j->prompt = malloc(j->prompt_len * sizeof *j->prompt);
            for (uint32_t q = 0; q < extra; q++) j->prompt[q] = sys[q];
            for (uint32_t q = 0; q < p; q++) j->prompt[extra + q] = 3 + (int32_t)(RNG() % (vocab - 3));
            uint32_t room = ctx - j->prompt_len - 1;
            j->max_tokens = out < room ? out : room;
        }
        ptok += p;
        otok += plain[i].max_tokens;
    }
#undef RNG
    int rc = 0;
    if (write_prefix) {
        size_t pl = strlen(write_prefix) + 16;
        char *path = malloc(pl);
        if (!path) rc = 1;
        if (!rc) snprintf(path, pl, "%s.csv", write_prefix);
        if (!rc) rc = write_trace(path, plain, n, 0);
        if (!rc) snprintf(path, pl, "%s-sys.csv", write_prefix);
        if (!rc) rc = write_trace(path, withsys, n, sys_tokens);
        free(path);
    }
    bool write_failed = rc != 0;
    printf("llmem %s bench serve: %s, context %u; %zu requests (Azure code trace lengths, prompts x %u/8192: mean "
           "%.0f prompt, %.0f output tokens), Poisson %.1f/s over %.1f s; KV budget %.2f MiB, max batch %u; "
           "system prompt %u tokens\n\n",
           llmem_version(), o.model_path, ctx, n, ctx, (double)ptok / n, (double)otok / n, rate, t,
           (double)o.kv_budget_bytes / 1048576.0, o.max_batch, sys_tokens);
    printf("%-22s %9s %8s %8s %8s %8s %8s %8s %8s %7s %7s %7s %4s %5s %6s %7s %7s\n", "configuration", "ok", "TTFT50",
           "TTFT99", "TPOT50", "TPOT99", "E2E50", "E2E99", "tok/s", "KVmean", "KVmax", "KVutil", "run", "seqs",
           "preem", "prefix", "RSS MB");
    printf("%-22s %9s %8s %8s %8s %8s %8s %8s %8s %7s %7s %7s %4s %5s %6s %7s %7s\n", "", "", "ms", "ms", "ms", "ms",
           "s", "s", "", "", "", "busy", "max", "busy", "", "hit", "peak");
    static const config configs[] = {
        {"paged", LLMEM_KV_PAGED, false, false},
        {"static", LLMEM_KV_STATIC, false, false},
        {"paged+sys, cache on", LLMEM_KV_PAGED, true, true},
        {"paged+sys, cache off", LLMEM_KV_PAGED, false, true},
    };
    fitted fits[sizeof configs / sizeof configs[0]];
    memset(fits, 0, sizeof fits);
    bool ran[sizeof configs / sizeof configs[0]] = {false};
    for (size_t c = 0; !write_failed && c < sizeof configs / sizeof configs[0]; c++) {
        if (only && (strcmp(only, "prefix") ? strcmp(only, configs[c].name) != 0 : !configs[c].system_prompt)) continue;
        rc |= run_config(&configs[c], &o, configs[c].system_prompt ? withsys : plain, n, seconds, &fits[c]);
        ran[c] = true;
    }
    printf("\nstep model fitted on each configuration's own steps (llmem_server_step_model; the clock for\n"
           "llmem replay on this trace):\n");
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        if (!ran[c]) continue;
        if (!fits[c].ok) {
            printf("  %-22s no fit: %s\n", configs[c].name, fits[c].why);
            continue;
        }
        const llmem_step_model *sm = &fits[c].m;
        printf("  %-22s %5llu steps, %7.2f s, mean step error %5.1f%%  --step-model linear:%.6g,%.6g,%.6g,%.6g\n",
               configs[c].name, (unsigned long long)fits[c].f.steps, fits[c].f.seconds, 100 * fits[c].f.rel_error,
               sm->c0, sm->c_prefill_token, sm->c_decode_seq, sm->c_attn_pair);
    }
    for (size_t i = 0; i < n; i++) {
        free(plain[i].prompt);
        free(withsys[i].prompt);
    }
    free(plain);
    free(withsys);
    free(sys);
    llmem_trace_free(&tr);
    return rc;
}
