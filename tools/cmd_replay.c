/*
 * cmd_replay.c - `llmem replay`: a request trace through the KV cache
 * strategies (llmem/replay.h: the library's scheduler over a simulated
 * engine). Parses, calls llmem_replay_run per strategy, prints.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>

#include "commands.h"
#include "llmem/llmem.h"
#include "tool_util.h"

/* A finite number > 0 (>= 0 when zero_ok), or false. */
/* A finite number > 0 (>= 0 when zero_ok) into *out, or false. */
static bool parse_pos_arg(const char *s, bool zero_ok, double *out)
{
    double v;
    if (!tool_parse_double(s, 0, DBL_MAX, &v) || (v == 0 && !zero_ok)) return false;
    *out = v;
    return true;
}

static void progress(void *ctx, size_t done, size_t total, double sim_s)
{
    static const char *names[] = {"paged", "static", "buckets", "contiguous"};
    fprintf(stderr, "\r\033[Kreplay %s: %zu/%zu requests, %.0f s simulated", names[(uintptr_t)ctx % 4], done, total,
            sim_s);
}

/* Measure a real engine's steps and fit the linear step model. */
static int run_calibration(const char *path, uint32_t threads, llmem_step_model *out, bool json)
{
    llmem_model *m;
    if (llmem_model_open(path, NULL, &m)) {
        fprintf(stderr, "llmem replay: %s: %s\n", path, llmem_error_message());
        return 1;
    }
    llmem_engine_options eo = llmem_engine_options_default();
    eo.threads = threads;
    eo.max_seqs = 32;
    llmem_engine *e;
    llmem_step_calibration rep = {sizeof rep};
    llmem_status st = llmem_engine_create(m, &eo, &e);
    if (!st) {
        st = llmem_step_model_calibrate(e, 5, out, &rep);
        llmem_engine_destroy(e);
    }
    llmem_model_close(m);
    if (st) {
        fprintf(stderr, "llmem replay: calibration: %s\n", llmem_error_message());
        return 1;
    }
    FILE *f = json ? stderr : stdout;
    fprintf(f,
            "calibrated on %s (%u threads): step = %.4g s + %.4g s x prefill tokens + %.4g s x decode sequences"
            " + %.4g s x attention pairs\n"
            "  %u step shapes, median of %u each, mean relative error of the fit %.1f%%, %.1f s\n"
            "  --step-model linear:%.6g,%.6g,%.6g,%.6g\n",
            path, threads, out->c0, out->c_prefill_token, out->c_decode_seq, out->c_attn_pair, rep.points, rep.repeats,
            100 * rep.rel_error, rep.seconds, out->c0, out->c_prefill_token, out->c_decode_seq, out->c_attn_pair);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem replay --trace FILE --kv-budget BYTES --model-shape NAME|config.json\n"
            "                    [--strategy paged|static|buckets|contiguous|all] [--json] [options]\n"
            "\n"
            "Replays a request trace through a continuous-batching scheduler whose KV cache is\n"
            "allocated through llmem (on a simulated device: nothing is touched), on a simulated\n"
            "clock, and reports KV utilisation, concurrency, preemptions and latencies.\n"
            "\n"
            "  --trace FILE           CSV with a header (TIMESTAMP,ContextTokens,GeneratedTokens ...)\n"
            "  --kv-budget BYTES      KV memory, e.g. 8GiB, 512MiB\n"
            "  --model-shape S        llama-2-7b, llama-2-13b, yi-coder-1.5b, tiny-15m, stories260k,\n"
            "                         tiny-random, or a Hugging Face config.json\n"
            "  --strategy S           paged (default), static, buckets, contiguous, or all four\n"
            "  --json                 one JSON object (an array with --strategy all)\n"
            "  --max-seq-len N        context limit and STATIC's reservation (default: the model's)\n"
            "  --block-tokens N       tokens per KV block (default 16)\n"
            "  --slab-blocks N        paged: blocks per slab the manager takes from the pool (default 2)\n"
            "  --kv-dtype f16|f32|i8  KV element (default f16)\n"
            "  --max-batch N          running requests at most (default 256)\n"
            "  --max-prefill N        new prompt tokens per step at most (default 8192)\n"
            "  --requests N           replay the first N requests only\n"
            "  --speedup F            arrivals F times faster than the trace's (default 1)\n"
            "  --prefix-cache         PAGED: share the prefixes the trace declares (prefix_id column)\n"
            "  --bandwidth GBPS       memory bandwidth for the step model (default 3350, H100 SXM)\n"
            "  --tflops T             peak compute (default 989, H100 SXM dense bf16)\n"
            "  --mfu F                fraction of peak reached (default 0.5)\n"
            "  --step-overhead-us U   fixed cost per step (default 300)\n"
            "  --controller           the stage-aware controller runs the KV pool (reserve before prefill,\n"
            "                         grow past the watermark, give back after idle), on the simulated clock\n"
            "  --idle-decay-ms N      the controller's idle decay, simulated (default 1000)\n"
            "  --timeline FILE.html   write the pool's memory timeline (implies --controller; one strategy)\n"
            "  --step-model linear:C0,CP,CD,CA  a linear step model instead of the roofline: seconds =\n"
            "                         C0 + CP x prefill tokens + CD x decode sequences + CA x attention pairs\n"
            "  --calibrate MODEL      measure MODEL's steps on this machine's CPU engine (--threads N), fit\n"
            "                         the linear model, print it, and replay with it when a trace is given\n"
            "  --engine MODEL         replay on MODEL's real engine instead (wall clock; --kv-budget, --max-batch\n"
            "                         (default 16), --max-prefill (default 512), --threads), to compare\n"
            "  --first-request N      start at request N of the trace\n"
            "  --prompt-scale F       prompt lengths x F (a small model's context); --output-scale F likewise\n");
}

static void print_json(const llmem_replay_result *r, const llmem_replay_options *o)
{
    printf("{\"strategy\":\"%s\",\"model\":\"%s\",\"kv_budget_bytes\":%zu,\"max_seq_len\":%u,\"speedup\":%g,"
           "\"kv_utilization\":%.6f,"
           "\"peak_reserved_bytes\":%llu,\"mean_concurrency\":%.3f,\"max_concurrency\":%u,\"preemptions\":%llu,"
           "\"prefix_hit_rate\":%.6f,\"requests_total\":%zu,\"requests_completed\":%zu,\"requests_rejected\":%zu,"
           "\"requests_truncated\":%zu,\"ttft_p50_s\":%.6f,\"ttft_p99_s\":%.6f,\"tpot_p50_s\":%.6f,"
           "\"tpot_p99_s\":%.6f,\"e2e_p50_s\":%.6f,\"e2e_p99_s\":%.6f,\"tokens_generated\":%llu,"
           "\"throughput_tokens_per_s\":%.3f,\"steps\":%llu,\"sim_time_s\":%.3f,\"wall_time_s\":%.3f,"
           "\"controller\":%s,\"resource_calls\":%llu,\"peak_committed_bytes\":%llu,\"mean_committed_bytes\":%.0f,"
           "\"controller_reserves\":%llu,\"controller_grows\":%llu,\"controller_shrinks\":%llu}",
           r->strategy, o->shape.name, o->kv_budget, o->max_seq_len ? o->max_seq_len : o->shape.max_ctx, o->speedup,
           r->kv_utilization, (unsigned long long)r->peak_reserved_bytes,
           r->mean_concurrency, r->max_concurrency, (unsigned long long)r->preemptions, r->prefix_hit_rate,
           r->requests_total, r->requests_completed, r->requests_rejected, r->requests_truncated, r->ttft_p50_s,
           r->ttft_p99_s, r->tpot_p50_s, r->tpot_p99_s, r->e2e_p50_s, r->e2e_p99_s,
           (unsigned long long)r->tokens_generated, r->throughput_tokens_per_s, (unsigned long long)r->steps,
           r->sim_time_s, r->wall_time_s, o->controller ? "true" : "false", (unsigned long long)r->resource_calls,
           (unsigned long long)r->peak_committed_bytes, r->mean_committed_bytes,
           (unsigned long long)r->controller_reserves, (unsigned long long)r->controller_grows,
           (unsigned long long)r->controller_shrinks);
}

static void print_table(const llmem_replay_result *rs, size_t n, const llmem_replay_options *o, const char *trace)
{
    printf("llmem %s replay: %s, model %s, KV budget %.2f GiB, %zu requests", llmem_version(), trace, o->shape.name,
           (double)o->kv_budget / (1 << 30), rs[0].requests_total);
    if (o->speedup != 1) printf(", arrivals %gx faster", o->speedup);
    printf("\n\n");
    printf("%-26s", "");
    for (size_t i = 0; i < n; i++) printf(" %12s", rs[i].strategy);
    printf("\n");
#define ROW(label, fmt, ...)                                           \
    do {                                                               \
        printf("%-26s", label);                                        \
        for (size_t i = 0; i < n; i++) printf(" " fmt, __VA_ARGS__);   \
        printf("\n");                                                  \
    } while (0)
    ROW("KV utilisation", "%11.1f%%", 100 * rs[i].kv_utilization);
    ROW("peak KV reserved (GiB)", "%12.2f", (double)rs[i].peak_reserved_bytes / (1 << 30));
    ROW("mean concurrency", "%12.1f", rs[i].mean_concurrency);
    ROW("max concurrency", "%12u", rs[i].max_concurrency);
    ROW("preemptions", "%12llu", (unsigned long long)rs[i].preemptions);
    ROW("prefix hit rate", "%11.1f%%", 100 * rs[i].prefix_hit_rate);
    ROW("completed", "%12zu", rs[i].requests_completed);
    ROW("rejected", "%12zu", rs[i].requests_rejected);
    ROW("truncated", "%12zu", rs[i].requests_truncated);
    ROW("TTFT p50 / p99 (s)", "%5.2f /%5.2f", rs[i].ttft_p50_s, rs[i].ttft_p99_s);
    ROW("TPOT p50 / p99 (ms)", "%5.1f /%5.1f", 1e3 * rs[i].tpot_p50_s, 1e3 * rs[i].tpot_p99_s);
    ROW("E2E p50 / p99 (s)", "%5.1f /%5.1f", rs[i].e2e_p50_s, rs[i].e2e_p99_s);
    ROW("throughput (tok/s)", "%12.0f", rs[i].throughput_tokens_per_s);
    ROW("KV resource calls", "%12llu", (unsigned long long)rs[i].resource_calls);
    ROW("KV peak committed (GiB)", "%12.2f", (double)rs[i].peak_committed_bytes / (1 << 30));
    ROW("KV mean committed (GiB)", "%12.2f", rs[i].mean_committed_bytes / (1 << 30));
    if (o->controller) ROW("reserves/grows/shrinks", "%4llu/%3llu/%3llu", (unsigned long long)rs[i].controller_reserves,
                           (unsigned long long)rs[i].controller_grows, (unsigned long long)rs[i].controller_shrinks);
    ROW("simulated time (s)", "%12.0f", rs[i].sim_time_s);
    ROW("wall time (s)", "%12.1f", rs[i].wall_time_s);
#undef ROW
}

/* The trace on a real engine (wall clock), printed as the simulation is. */
static int replay_on_engine(const char *path, const char *trace_path, llmem_replay_options *o, uint32_t threads,
                            bool json)
{
    if (!trace_path) {
        fprintf(stderr, "llmem replay: --engine needs --trace\n");
        return 2;
    }
    llmem_model *m;
    if (llmem_model_open(path, NULL, &m)) {
        fprintf(stderr, "llmem replay: %s: %s\n", path, llmem_error_message());
        return 1;
    }
    o->shape = llmem_model_get_config(m)->shape;
    llmem_engine_options eo = llmem_engine_options_default();
    eo.threads = threads;
    eo.max_seqs = o->max_batch < 256 ? o->max_batch : 16;
    eo.max_step_tokens = o->max_prefill_tokens < 8192 ? o->max_prefill_tokens : 512;
    eo.max_seq_len = o->max_seq_len;
    eo.kv_budget_bytes = o->kv_budget;
    eo.kv_prefix_cache = o->prefix_cache;
    o->max_batch = eo.max_seqs;
    o->max_prefill_tokens = eo.max_step_tokens;
    llmem_engine *e = NULL;
    llmem_trace trace = {0};
    llmem_replay_result r;
    int rc = 1;
    if (llmem_engine_create(m, &eo, &e) || llmem_trace_load(trace_path, &trace)) {
        fprintf(stderr, "llmem replay: %s\n", llmem_error_message());
    } else {
        o->engine = e;
        o->fit_steps = true;
        if (llmem_replay_run(&trace, o, &r)) {
            fprintf(stderr, "llmem replay: %s\n", llmem_error_message());
        } else {
            rc = 0;
            if (json) {
                print_json(&r, o);
                printf("\n");
            } else {
                print_table(&r, 1, o, trace_path);
            }
            const llmem_step_model *f = &r.step_fit;
            fprintf(json ? stderr : stdout,
                    "steps as they ran, least squares: %.4g s + %.4g s x prefill tokens + %.4g s x decode sequences"
                    " + %.4g s x attention pairs (mean relative error %.1f%%)\n  --step-model linear:%.6g,%.6g,%.6g,%.6g\n",
                    f->c0, f->c_prefill_token, f->c_decode_seq, f->c_attn_pair, 100 * r.step_fit_error, f->c0,
                    f->c_prefill_token, f->c_decode_seq, f->c_attn_pair);
        }
    }
    llmem_trace_free(&trace);
    llmem_engine_destroy(e);
    llmem_model_close(m);
    return rc;
}

/* What the command line asks for. */
typedef struct replay_args {
    llmem_replay_options o;
    const char *trace_path, *shape, *strategy, *timeline_path, *calibrate, *engine_path;
    bool json;
    uint32_t threads;
    llmem_step_model linear; /* --step-model or --calibrate's (o.model points here) */
} replay_args;

/* Fills *r from argv; -1 to go on, else the exit code (usage printed). */
static int parse_args(int argc, char **argv, replay_args *r)
{
    llmem_replay_options *o = &r->o;
    tool_args cl = {"replay", usage, argc, argv};
    while (tool_args_next(&cl)) {
        bool ok = true;
        if (tool_args_help(&cl)) return 0;
        else if (tool_args_is(&cl, "--json")) r->json = true;
        else if (tool_args_is(&cl, "--prefix-cache")) o->prefix_cache = true;
        else if (tool_args_is(&cl, "--controller")) o->controller = true;
        else if (tool_args_take(&cl, "--timeline")) r->timeline_path = cl.val, o->controller = true;
        else if (tool_args_take(&cl, "--calibrate")) r->calibrate = cl.val;
        else if (tool_args_take(&cl, "--engine")) r->engine_path = cl.val;
        else if (tool_args_take(&cl, "--first-request")) {
            uint32_t f;
            ok = tool_parse_u32(cl.val, 0, UINT32_MAX, &f);
            o->first_request = f;
        } else if (tool_args_take(&cl, "--prompt-scale")) ok = parse_pos_arg(cl.val, false, &o->prompt_scale);
        else if (tool_args_take(&cl, "--output-scale")) ok = parse_pos_arg(cl.val, false, &o->output_scale);
        else if (tool_args_take(&cl, "--threads")) ok = tool_parse_u32(cl.val, 1, 1024, &r->threads);
        else if (tool_args_take(&cl, "--step-model")) {
            double c[4];
            ok = sscanf(cl.val, "linear:%lf,%lf,%lf,%lf", &c[0], &c[1], &c[2], &c[3]) == 4;
            r->linear = llmem_step_model_linear(c[0], c[1], c[2], c[3]);
            ok = ok && llmem_step_model_check(&r->linear) == LLMEM_OK;
            o->model = &r->linear;
        }
        else if (tool_args_take(&cl, "--idle-decay-ms")) ok = tool_parse_u32(cl.val, 0, 1u << 30, &o->idle_decay_ms);
        else if (tool_args_take(&cl, "--trace")) r->trace_path = cl.val;
        else if (tool_args_take(&cl, "--model-shape")) r->shape = cl.val;
        else if (tool_args_take(&cl, "--strategy")) r->strategy = cl.val;
        else if (tool_args_take(&cl, "--kv-budget")) {
            double b = tool_parse_bytes(cl.val);
            if (b == TOOL_BYTES_TOO_LARGE) {
                fprintf(stderr, "llmem replay: --kv-budget '%s' is too large (at most 9e18 bytes)\n", cl.val);
                return 2;
            }
            if (b <= 0) {
                fprintf(stderr, "llmem replay: --kv-budget '%s' is not a size (e.g. 8GiB)\n", cl.val);
                return 2;
            }
            o->kv_budget = (size_t)b;
        } else if (tool_args_take(&cl, "--max-seq-len")) ok = tool_parse_u32(cl.val, 1, 1u << 24, &o->max_seq_len);
        else if (tool_args_take(&cl, "--block-tokens")) ok = tool_parse_u32(cl.val, 1, 1u << 16, &o->block_tokens);
        else if (tool_args_take(&cl, "--slab-blocks")) ok = tool_parse_u32(cl.val, 1, 1u << 16, &o->slab_blocks);
        else if (tool_args_take(&cl, "--max-batch")) ok = tool_parse_u32(cl.val, 1, 1u << 20, &o->max_batch);
        else if (tool_args_take(&cl, "--max-prefill")) ok = tool_parse_u32(cl.val, 1, 1u << 24, &o->max_prefill_tokens);
        else if (tool_args_take(&cl, "--requests")) {
            uint32_t nreq;
            ok = tool_parse_u32(cl.val, 1, UINT32_MAX, &nreq);
            o->max_requests = nreq;
        } else if (tool_args_take(&cl, "--speedup")) ok = parse_pos_arg(cl.val, false, &o->speedup);
        else if (tool_args_take(&cl, "--bandwidth")) ok = parse_pos_arg(cl.val, false, &o->bandwidth), o->bandwidth *= 1e9;
        else if (tool_args_take(&cl, "--tflops")) ok = parse_pos_arg(cl.val, false, &o->peak_flops), o->peak_flops *= 1e12;
        else if (tool_args_take(&cl, "--mfu")) ok = parse_pos_arg(cl.val, false, &o->mfu) && o->mfu <= 1;
        else if (tool_args_take(&cl, "--step-overhead-us")) ok = parse_pos_arg(cl.val, true, &o->step_overhead_s), o->step_overhead_s /= 1e6;
        else if (tool_args_take(&cl, "--kv-dtype")) {
            if (!strcmp(cl.val, "f16") || !strcmp(cl.val, "bf16")) o->kv_elem_bytes = 2;
            else if (!strcmp(cl.val, "f32")) o->kv_elem_bytes = 4;
            else if (!strcmp(cl.val, "i8") || !strcmp(cl.val, "q8_0")) o->kv_elem_bytes = 1;
            else {
                fprintf(stderr, "llmem replay: --kv-dtype must be f16, f32 or i8\n");
                return 2;
            }
        } else {
            fprintf(stderr, "llmem replay: unknown or incomplete option '%s'\n\n", cl.opt);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "llmem replay: %s '%s' is out of range or not a number\n", cl.opt, cl.val);
            return 2;
        }
    }
    return -1;
}

/* --strategy: one, or all four. */
static bool strategies_parse(const char *s, llmem_kv_strategy list[4], size_t *ns)
{
    static const struct {
        const char *name;
        llmem_kv_strategy k;
    } names[] = {{"static", LLMEM_KV_STATIC}, {"buckets", LLMEM_KV_BUCKETS}, {"paged", LLMEM_KV_PAGED},
                 {"contiguous", LLMEM_KV_CONTIGUOUS}};
    *ns = 0;
    for (size_t i = 0; i < 4; i++)
        if (!strcmp(s, "all") || !strcmp(s, names[i].name)) list[(*ns)++] = names[i].k;
    return *ns > 0;
}

/* Replays the trace under each strategy and prints the results (and
 * writes the timeline when asked). */
static int replay_strategies(replay_args *r, const llmem_trace *trace, const llmem_kv_strategy *list, size_t ns)
{
    llmem_replay_options *o = &r->o;
    if (!r->json && isatty(STDERR_FILENO)) o->progress = progress;
    llmem_timeline *tl = NULL;
    if (r->timeline_path && llmem_timeline_create(0, &tl)) {
        fprintf(stderr, "llmem replay: timeline: %s\n", llmem_error_message());
        return 1;
    }
    o->timeline = tl;
    llmem_replay_result rs[4];
    llmem_log_set(NULL, NULL, LLMEM_LOG_ERROR);
    for (size_t i = 0; i < ns; i++) {
        o->strategy = list[i];
        o->progress_ctx = (void *)(uintptr_t)list[i];
        llmem_status st = llmem_replay_run(trace, o, &rs[i]);
        if (o->progress) fprintf(stderr, "\r\033[K");
        if (st) {
            fprintf(stderr, "llmem replay: %s\n", llmem_error_message());
            llmem_timeline_destroy(tl);
            return 1;
        }
    }
    int rc = 0;
    if (tl) {
        if (llmem_timeline_write_html(tl, r->timeline_path, "llmem replay: KV pool under the controller")) {
            fprintf(stderr, "llmem replay: %s\n", llmem_error_message()); /* "timeline: cannot write ..." */
            rc = 1;
        }
        llmem_timeline_destroy(tl);
    }
    if (r->json) {
        if (ns > 1) printf("[");
        for (size_t i = 0; i < ns; i++) {
            if (i) printf(",");
            print_json(&rs[i], o);
        }
        printf(ns > 1 ? "]\n" : "\n");
    } else {
        print_table(rs, ns, o, r->trace_path);
    }
    return rc;
}

int llmem_cmd_replay(int argc, char **argv)
{
    replay_args r = {.o = llmem_replay_options_default(), .strategy = "paged"};
    int rc = parse_args(argc, argv, &r);
    if (rc >= 0) return rc;
    if (r.calibrate) {
        rc = run_calibration(r.calibrate, r.threads, &r.linear, r.json);
        if (rc || !r.trace_path) return rc;
        r.o.model = &r.linear;
    }
    if (r.engine_path) return replay_on_engine(r.engine_path, r.trace_path, &r.o, r.threads, r.json);
    if (!r.trace_path || !r.shape || !r.o.kv_budget) {
        fprintf(stderr, "llmem replay: --trace, --model-shape and --kv-budget are required\n\n");
        usage(stderr);
        return 2;
    }
    if (llmem_shape_load(r.shape, &r.o.shape)) {
        fprintf(stderr, "llmem replay: %s\n", llmem_error_message());
        return 1;
    }
    llmem_kv_strategy list[4];
    size_t ns = 0;
    if (!strategies_parse(r.strategy, list, &ns)) {
        fprintf(stderr, "llmem replay: --strategy must be paged, static, buckets, contiguous or all\n");
        return 2;
    }
    if (r.timeline_path && ns > 1) {
        fprintf(stderr, "llmem replay: --timeline takes one strategy\n");
        return 2;
    }
    llmem_trace trace;
    if (llmem_trace_load(r.trace_path, &trace)) {
        fprintf(stderr, "llmem replay: %s\n", llmem_error_message());
        return 1;
    }
    rc = replay_strategies(&r, &trace, list, ns);
    llmem_trace_free(&trace);
    return rc;
}
