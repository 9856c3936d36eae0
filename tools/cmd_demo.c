/*
 * cmd_demo.c - `llmem demo`: llmem serving bursts of requests, and
 * the story of its memory.
 *
 * Without --model, a small llama (4 layers, 256 wide, grouped-query
 * attention, synthetic weights) is written to a temporary file. Then:
 * a burst of concurrent requests whose prompt and output lengths follow the
 * Azure code trace in ../shared/traces (its quantiles are embedded below,
 * prompts scaled to the model's context), served by the library's
 * continuous-batching scheduler (llmem/sched.h: up to 8 sequences a step,
 * new prompts prefilled in the same steps as the others decode); an idle
 * pause; a second burst; another pause. The engine
 * reports its stages to the stage-aware controller, which reserves before
 * each prefill, grows past the high watermark and gives memory back after
 * the idle decay. The demo prints what each phase reserved, used, grew and
 * gave back, the KV utilisation, the same workload under the static and
 * bucket KV strategies for contrast, and writes the timeline page.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "tool_util.h"
#include "llmem/llmem.h"

/* The Azure LLM inference trace (code, 8,819 requests): the 0/16 .. 16/16
 * quantiles of prompt (context) and generated tokens. */
static const uint32_t trace_prompt_q[17] = {3,    90,   185,  348,  578,  825,  1016, 1196, 1469,
                                            1734, 2048, 2375, 2745, 3330, 4434, 6499, 7437};
static const uint32_t trace_gen_q[17] = {6, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 19, 24, 31, 46, 77, 1899};

#define DEMO_SEQS 8
#define DEMO_BURST 16
#define DEMO_MAX_GEN 48
#define DEMO_STEP_TOKENS 512

typedef struct request {
    uint32_t prompt, gen;
    int32_t *tokens;
} request;

typedef struct phase_figures {
    const char *name;
    double seconds;
    uint64_t reserved_start, reserved_end, reserved_peak, used_peak;
    uint64_t grown, released, reserved_ahead;
    uint64_t tokens;
    double kv_util_weighted, kv_util_time;
    uint64_t kv_peak;
} phase_figures;

typedef struct demo_run {
    llmem_kv_strategy strategy;
    bool controlled;
    llmem_engine *e;
    llmem_sched *sched;
    llmem_pool *pool;
    llmem_controller *ctl;
    llmem_timeline *tl;
    uint32_t vocab;
    phase_figures ph[4];
    uint64_t resource_calls;
    double seconds;
} demo_run;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

static uint32_t from_quantiles(const uint32_t q[17], double u)
{
    double x = u * 16;
    int i = (int)x;
    if (i >= 16) return q[16];
    return (uint32_t)lround(q[i] + (x - i) * (q[i + 1] - q[i]));
}

static double mb(uint64_t b) { return (double)b / 1e6; }

static void sample(demo_run *r, phase_figures *ph, llmem_stage stage, double dt)
{
    llmem_pool_stats ps = {sizeof ps};
    llmem_engine_stats es = {sizeof es};
    llmem_pool_get_stats(r->pool, &ps);
    llmem_engine_get_stats(r->e, &es);
    double util = es.kv_bytes ? (double)es.kv_used_bytes / (double)es.kv_bytes : -1;
    if (r->tl) {
        llmem_timeline_sample s = {llmem_time_now_ns(), stage, ps.reserved_bytes, ps.committed_bytes, ps.used_bytes, util};
        llmem_timeline_record(r->tl, &s);
    }
    if (ps.reserved_bytes > ph->reserved_peak) ph->reserved_peak = ps.reserved_bytes;
    if (ps.used_bytes > ph->used_peak) ph->used_peak = ps.used_bytes;
    if (es.kv_bytes > ph->kv_peak) ph->kv_peak = es.kv_bytes;
    if (util >= 0 && dt > 0) {
        ph->kv_util_weighted += util * dt;
        ph->kv_util_time += dt;
    }
}

static uint64_t reserved(const demo_run *r)
{
    llmem_pool_stats ps = {sizeof ps};
    llmem_pool_get_stats(r->pool, &ps);
    return ps.reserved_bytes;
}

/* Serve a burst to the end: the scheduler's steps, greedy tokens. */
static int serve(demo_run *r, request *reqs, size_t n, phase_figures *ph)
{
    llmem_sched_req ids[DEMO_BURST];
    for (size_t i = 0; i < n; i++) {
        llmem_sched_params p = llmem_sched_params_default();
        p.prompt = reqs[i].tokens;
        p.prompt_len = reqs[i].prompt;
        p.max_tokens = reqs[i].gen;
        if (llmem_sched_submit(r->sched, &p, &ids[i])) {
            fprintf(stderr, "llmem demo: submitting a request: %s\n", llmem_error_message());
            return 1;
        }
    }
    uint64_t t_prev = llmem_time_now_ns();
    while (llmem_sched_pending(r->sched)) {
        llmem_sched_step_report rep;
        if (llmem_sched_step(r->sched, &rep)) {
            fprintf(stderr, "llmem demo: step: %s\n", llmem_error_message());
            return 1;
        }
        ph->tokens += rep.prefill_tokens + rep.decode_tokens;
        uint64_t t = llmem_time_now_ns();
        sample(r, ph, rep.prefill_tokens ? LLMEM_STAGE_PREFILL : LLMEM_STAGE_DECODE, (double)(t - t_prev) * 1e-9);
        t_prev = t;
    }
    for (size_t i = 0; i < n; i++) llmem_sched_release(r->sched, ids[i]);
    return 0;
}

/* Idle: the scheduler reports IDLE and ticks the controller on each empty
 * step, as a server's loop would. */
static void idle(demo_run *r, phase_figures *ph, uint32_t ms)
{
    uint64_t end = llmem_time_now_ns() + (uint64_t)ms * 1000000ull;
    while (llmem_time_now_ns() < end) {
        llmem_sched_step(r->sched, NULL);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
        sample(r, ph, LLMEM_STAGE_IDLE, 0.02);
    }
}

static void controller_totals(const demo_run *r, uint64_t *grown, uint64_t *released, uint64_t *ahead)
{
    *grown = *released = *ahead = 0;
    if (!r->ctl) return;
    llmem_controller_stats cs = {sizeof cs};
    llmem_controller_get_stats(r->ctl, &cs);
    *grown = cs.bytes_grown_total;
    *released = cs.bytes_released_total;
    *ahead = cs.bytes_reserved_ahead_total;
}

static int run_workload(demo_run *r, const llmem_model *m, request *reqs, const char *timeline_path,
                        uint32_t idle_ms)
{
    const llmem_model_config *c = llmem_model_get_config(m);
    llmem_engine_options eo = llmem_engine_options_default();
    eo.max_seqs = DEMO_SEQS;
    eo.max_step_tokens = DEMO_STEP_TOKENS + DEMO_SEQS;
    eo.kv_strategy = r->strategy;
    llmem_memctl *mc = NULL;
    if (r->controlled) {
        /* Pool, predictor and controller for this engine; eo gets its pool
         * and stage listener. */
        llmem_memctl_options mo = llmem_memctl_options_default();
        mo.name = "demo";
        mo.controller.idle_decay_ms = idle_ms / 2;
        if (llmem_memctl_create_for_engine(m, &eo, &mo, &mc)) {
            fprintf(stderr, "llmem demo: controller: %s\n", llmem_error_message());
            return 1;
        }
        r->pool = llmem_memctl_pool(mc);
        r->ctl = llmem_memctl_controller(mc);
        if (timeline_path && llmem_timeline_create(0, &r->tl)) {
            llmem_memctl_destroy(mc);
            return 1;
        }
    } else {
        llmem_pool_options po = llmem_pool_options_default();
        po.name = "demo";
        po.resource = llmem_resource_default();
        po.first_superblock_bytes = 1u << 20;
        if (llmem_pool_create(&po, &r->pool)) return 1;
        eo.pool = r->pool;
    }
    llmem_sched_options so = llmem_sched_options_default();
    so.controller = r->ctl;
    if (llmem_engine_create(m, &eo, &r->e) || llmem_sched_create_engine(r->e, &so, &r->sched)) {
        fprintf(stderr, "llmem demo: engine: %s\n", llmem_error_message());
        llmem_engine_destroy(r->e);
        llmem_timeline_destroy(r->tl);
        if (mc) llmem_memctl_destroy(mc);
        else llmem_pool_destroy(r->pool);
        return 1;
    }
    r->vocab = c->shape.vocab;
    static const char *names[4] = {"burst 1", "idle", "burst 2", "idle"};
    uint64_t t0 = llmem_time_now_ns();
    sample(r, &r->ph[0], LLMEM_STAGE_IDLE, 0); /* the chart starts before the first decision */
    int rc = 0;
    for (int p = 0; p < 4 && !rc; p++) {
        phase_figures *ph = &r->ph[p];
        ph->name = names[p];
        ph->reserved_start = reserved(r);
        uint64_t g0, r0, a0, g1, r1, a1, ts = llmem_time_now_ns();
        controller_totals(r, &g0, &r0, &a0);
        if (p % 2 == 0) rc = serve(r, reqs + (size_t)(p / 2) * DEMO_BURST, DEMO_BURST, ph);
        else idle(r, ph, idle_ms);
        controller_totals(r, &g1, &r1, &a1);
        ph->grown = g1 - g0;
        ph->released = r1 - r0;
        ph->reserved_ahead = a1 - a0;
        ph->reserved_end = reserved(r);
        ph->seconds = (double)(llmem_time_now_ns() - ts) * 1e-9;
    }
    r->seconds = (double)(llmem_time_now_ns() - t0) * 1e-9;
    llmem_pool_stats ps = {sizeof ps};
    llmem_pool_get_stats(r->pool, &ps);
    r->resource_calls = ps.resource_calls_total;
    if (!rc && r->tl) {
        llmem_memctl_add_decisions(r->ctl, r->tl);
        if (llmem_timeline_write_html(r->tl, timeline_path, "llmem demo: two bursts of requests, and idle")) {
            fprintf(stderr, "llmem demo: %s\n", llmem_error_message()); /* "timeline: cannot write ..." */
            rc = 1;
        }
    }
    llmem_sched_destroy(r->sched);
    r->sched = NULL;
    llmem_engine_destroy(r->e);
    r->e = NULL;
    llmem_timeline_destroy(r->tl);
    r->tl = NULL;
    if (mc) llmem_memctl_destroy(mc);
    else llmem_pool_destroy(r->pool);
    r->ctl = NULL;
    r->pool = NULL;
    return rc;
}

static double util(const phase_figures *ph) { return ph->kv_util_time > 0 ? ph->kv_util_weighted / ph->kv_util_time : 0; }

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem demo [--model FILE] [--timeline FILE.html] [--seed N] [--tour [--json]]\n"
            "\n"
            "Serves two bursts of requests (lengths from the Azure code trace) with an idle pause after\n"
            "each, on a small synthetic llama or on --model, and tells what the memory did. --tour: the\n"
            "older walk through the foundation layers (resources, arena, fixed pool).\n");
}

int llmem_cmd_demo(int argc, char **argv)
{
    const char *model_path = NULL, *timeline = NULL;
    bool tour = false, json = false;
    tool_args cl = {"demo", usage, argc, argv};
    while (tool_args_next(&cl)) {
        if (tool_args_help(&cl)) return 0;
        else if (tool_args_is(&cl, "--tour")) tour = true;
        else if (tool_args_is(&cl, "--json")) json = true;
        else if (tool_args_take(&cl, "--model")) model_path = cl.val;
        else if (tool_args_take(&cl, "--timeline")) timeline = cl.val;
        else if (tool_args_take(&cl, "--seed")) {
            char *end;
            errno = 0;
            rng_state = strtoull(cl.val, &end, 10) | 1;
            if (errno || *end) {
                fprintf(stderr, "llmem demo: bad seed\n");
                return 2;
            }
        } else return tool_args_unknown(&cl);
    }
    if (tour) return llmem_demo_tour(json);
    llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);

    char tmp_model[64] = "";
    if (!model_path) {
        llmem_shape s = {"demo-llama", 4, 256, 8, 2, 32, 688, 2048, 512, 10000.0, 0};
        snprintf(tmp_model, sizeof tmp_model, "/tmp/llmem-demo-XXXXXX");
        int fd = mkstemp(tmp_model);
        if (fd < 0) {
            fprintf(stderr, "llmem demo: no temporary file: %s\n", strerror(errno));
            return 1;
        }
        close(fd);
        printf("llmem %s demo. A small llama (4 layers, 256 wide, 8 query / 2 KV heads, context 512) with\n"
               "synthetic weights: its text is noise, its memory is real.\n\n",
               llmem_version());
        if (llmem_tool_synth_gguf(&s, LLMEM_DTYPE_F32, 7, tmp_model)) {
            fprintf(stderr, "llmem demo: writing the model: %s\n", llmem_error_message());
            unlink(tmp_model);
            return 1;
        }
        model_path = tmp_model;
    } else {
        printf("llmem %s demo on %s\n\n", llmem_version(), model_path);
    }
    /* No --timeline: a new private folder (mkdtemp, mode 0700) in the
     * temporary folder, never a fixed name there that another user could
     * have planted a link at. */
    char default_timeline[4096];
    if (!timeline) {
        const char *dir = getenv("TMPDIR");
        char folder[4000];
        snprintf(folder, sizeof folder, "%s/llmem-demo-XXXXXX", dir && *dir ? dir : "/tmp");
        if (!mkdtemp(folder)) {
            fprintf(stderr, "llmem demo: no folder for the timeline in %s: %s (give --timeline FILE)\n",
                    dir && *dir ? dir : "/tmp", strerror(errno));
            if (*tmp_model) unlink(tmp_model);
            return 1;
        }
        snprintf(default_timeline, sizeof default_timeline, "%s/timeline.html", folder);
        timeline = default_timeline;
    }
    /* Refuse a timeline path that cannot be written now, not after the run. */
    llmem_outfile *probe;
    if (llmem_outfile_open(timeline, &probe)) {
        fprintf(stderr, "llmem demo: timeline: %s\n", llmem_error_message());
        if (*tmp_model) unlink(tmp_model);
        return 1;
    }
    llmem_outfile_abort(probe);
    llmem_model *m;
    if (llmem_model_open(model_path, NULL, &m)) {
        fprintf(stderr, "llmem demo: %s: %s\n", model_path, llmem_error_message());
        if (*tmp_model) unlink(tmp_model);
        return 1;
    }
    const llmem_model_config *c = llmem_model_get_config(m);
    uint32_t ctx = c->shape.max_ctx < 4096 ? c->shape.max_ctx : 4096;
    double scale = (double)(ctx > DEMO_MAX_GEN + 16 ? ctx - DEMO_MAX_GEN - 16 : ctx / 2) / trace_prompt_q[16];
    if (scale > 1) scale = 1;
    request reqs[2 * DEMO_BURST];
    uint64_t prompt_sum = 0, gen_sum = 0;
    for (int i = 0; i < 2 * DEMO_BURST; i++) {
        uint32_t p = (uint32_t)lround(from_quantiles(trace_prompt_q, rnd()) * scale);
        uint32_t g = from_quantiles(trace_gen_q, rnd());
        reqs[i].prompt = p < 1 ? 1 : p > DEMO_STEP_TOKENS ? DEMO_STEP_TOKENS : p;
        reqs[i].gen = g > DEMO_MAX_GEN ? DEMO_MAX_GEN : g;
        reqs[i].tokens = malloc(reqs[i].prompt * sizeof(int32_t));
        if (!reqs[i].tokens) return 1;
        reqs[i].tokens[0] = 1;
        for (uint32_t k = 1; k < reqs[i].prompt; k++) reqs[i].tokens[k] = 3 + (int32_t)(rnd() * (c->shape.vocab - 3));
        prompt_sum += reqs[i].prompt;
        gen_sum += reqs[i].gen;
    }
    printf("Workload: 2 bursts of %d requests, at most %d at once; prompt and output lengths drawn from the\n"
           "Azure code trace (prompts scaled by %.3f to the context): %.0f prompt and %.0f output tokens on average.\n\n",
           DEMO_BURST, DEMO_SEQS, scale, (double)prompt_sum / (2 * DEMO_BURST), (double)gen_sum / (2 * DEMO_BURST));

    demo_run runs[3] = {{LLMEM_KV_PAGED, true, 0}, {LLMEM_KV_STATIC, true, 0}, {LLMEM_KV_BUCKETS, true, 0}};
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) rc = run_workload(&runs[k], m, reqs, k == 0 ? timeline : NULL, 400);
    if (!rc) {
        demo_run *r = &runs[0];
        printf("Paged KV with the stage-aware controller (reserve before prefill, grow past 85%% used,\n"
               "give back after %u ms idle):\n\n",
               200);
        printf("  %-8s %7s %14s %14s %10s %10s %10s %9s\n", "phase", "time", "reserved MB", "peak used MB",
               "ahead MB", "grown MB", "freed MB", "KV util");
        for (int p = 0; p < 4; p++) {
            phase_figures *ph = &r->ph[p];
            char kvu[16] = "-";
            if (p % 2 == 0) snprintf(kvu, sizeof kvu, "%.0f%%", 100 * util(ph));
            printf("  %-8s %6.2fs %6.1f -> %-6.1f %14.1f %10.1f %10.1f %10.1f %9s\n", ph->name, ph->seconds,
                   mb(ph->reserved_start), mb(ph->reserved_end), mb(ph->used_peak), mb(ph->reserved_ahead),
                   mb(ph->grown), mb(ph->released), kvu);
        }
        printf("\n  %llu resource calls in all; each burst's memory was reserved ahead of its prefills and given\n"
               "  back in the idle pause after it.\n\n",
               (unsigned long long)r->resource_calls);
        printf("The same workload, KV strategies side by side (KV storage held at the busiest moment):\n\n");
        printf("  %-8s %14s %14s %12s\n", "strategy", "peak KV MB", "pool peak MB", "KV util");
        static const char *sn[3] = {"paged", "static", "buckets"};
        for (int k = 0; k < 3; k++) {
            uint64_t kv = 0, peak = 0;
            double w = 0, t = 0;
            for (int p = 0; p < 4; p += 2) {
                if (runs[k].ph[p].kv_peak > kv) kv = runs[k].ph[p].kv_peak;
                if (runs[k].ph[p].reserved_peak > peak) peak = runs[k].ph[p].reserved_peak;
                w += runs[k].ph[p].kv_util_weighted;
                t += runs[k].ph[p].kv_util_time;
            }
            printf("  %-8s %14.2f %14.2f %11.0f%%\n", sn[k], mb(kv), mb(peak), t > 0 ? 100 * w / t : 0);
        }
        printf("\n  (static reserves the whole context per request, as llama2.c does; buckets grow by copying.)\n\n");
        printf("Timeline: %s (open it in a browser).\n", timeline);
    }
    for (int i = 0; i < 2 * DEMO_BURST; i++) free(reqs[i].tokens);
    llmem_model_close(m);
    if (*tmp_model) unlink(tmp_model);
    return rc;
}
