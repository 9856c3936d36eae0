/*
 * cmd_replay.c - `llmem replay`: a request trace through the KV cache
 * strategies (see replay_sim.h).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "llmem/llmem.h"
#include "replay_sim.h"
#include "tool_util.h"

/* A finite number > 0 (>= 0 when zero_ok), or false. */
static bool parse_pos_arg(const char *s, bool zero_ok, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < 0 || (v == 0 && !zero_ok)) return false;
    *out = v;
    return true;
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
            "  --timeline FILE.html   write the pool's memory timeline (implies --controller; one strategy)\n");
}

static void print_json(const replay_result *r, const replay_options *o)
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

static void print_table(const replay_result *rs, size_t n, const replay_options *o, const char *trace)
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

int llmem_cmd_replay(int argc, char **argv)
{
    replay_options o;
    replay_options_default(&o);
    const char *trace_path = NULL, *shape = NULL, *strategy = "paged";
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
#define TAKE(opt) (!strcmp(a, opt) && v && (i++, true))
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--prefix-cache")) o.prefix_cache = true;
        else if (!strcmp(a, "--controller")) o.controller = true;
        else if (TAKE("--timeline")) o.timeline = v, o.controller = true;
        else if (TAKE("--idle-decay-ms")) ok = tool_parse_u32(v, 0, 1u << 30, &o.idle_decay_ms);
        else if (TAKE("--trace")) trace_path = v;
        else if (TAKE("--model-shape")) shape = v;
        else if (TAKE("--strategy")) strategy = v;
        else if (TAKE("--kv-budget")) {
            double b = tool_parse_bytes(v);
            if (b == TOOL_BYTES_TOO_LARGE) {
                fprintf(stderr, "llmem replay: --kv-budget '%s' is too large (at most 9e18 bytes)\n", v);
                return 2;
            }
            if (b <= 0) {
                fprintf(stderr, "llmem replay: --kv-budget '%s' is not a size (e.g. 8GiB)\n", v);
                return 2;
            }
            o.kv_budget = (size_t)b;
        } else if (TAKE("--max-seq-len")) ok = tool_parse_u32(v, 1, 1u << 24, &o.max_seq_len);
        else if (TAKE("--block-tokens")) ok = tool_parse_u32(v, 1, 1u << 16, &o.block_tokens);
        else if (TAKE("--slab-blocks")) ok = tool_parse_u32(v, 1, 1u << 16, &o.slab_blocks);
        else if (TAKE("--max-batch")) ok = tool_parse_u32(v, 1, 1u << 20, &o.max_batch);
        else if (TAKE("--max-prefill")) ok = tool_parse_u32(v, 1, 1u << 24, &o.max_prefill_tokens);
        else if (TAKE("--requests")) {
            uint32_t nreq;
            ok = tool_parse_u32(v, 1, UINT32_MAX, &nreq);
            o.max_requests = nreq;
        } else if (TAKE("--speedup")) ok = parse_pos_arg(v, false, &o.speedup);
        else if (TAKE("--bandwidth")) ok = parse_pos_arg(v, false, &o.bandwidth), o.bandwidth *= 1e9;
        else if (TAKE("--tflops")) ok = parse_pos_arg(v, false, &o.peak_flops), o.peak_flops *= 1e12;
        else if (TAKE("--mfu")) ok = parse_pos_arg(v, false, &o.mfu) && o.mfu <= 1;
        else if (TAKE("--step-overhead-us")) ok = parse_pos_arg(v, true, &o.step_overhead_s), o.step_overhead_s /= 1e6;
        else if (TAKE("--kv-dtype")) {
            if (!strcmp(v, "f16") || !strcmp(v, "bf16")) o.kv_elem_bytes = 2;
            else if (!strcmp(v, "f32")) o.kv_elem_bytes = 4;
            else if (!strcmp(v, "i8") || !strcmp(v, "q8_0")) o.kv_elem_bytes = 1;
            else {
                fprintf(stderr, "llmem replay: --kv-dtype must be f16, f32 or i8\n");
                return 2;
            }
        } else {
            fprintf(stderr, "llmem replay: unknown or incomplete option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
#undef TAKE
        if (!ok) {
            fprintf(stderr, "llmem replay: %s '%s' is out of range or not a number\n", a, v);
            return 2;
        }
    }
    if (!trace_path || !shape || !o.kv_budget) {
        fprintf(stderr, "llmem replay: --trace, --model-shape and --kv-budget are required\n\n");
        usage(stderr);
        return 2;
    }
    if (llmem_shape_load(shape, &o.shape)) {
        fprintf(stderr, "llmem replay: %s\n", llmem_last_error());
        return 1;
    }
    llmem_trace trace;
    if (llmem_trace_load(trace_path, &trace)) {
        fprintf(stderr, "llmem replay: %s\n", llmem_last_error());
        return 1;
    }
    llmem_kv_strategy list[4];
    size_t ns = 0;
    if (!strcmp(strategy, "all")) {
        list[0] = LLMEM_KV_STATIC;
        list[1] = LLMEM_KV_BUCKETS;
        list[2] = LLMEM_KV_PAGED;
        list[3] = LLMEM_KV_CONTIGUOUS;
        ns = 4;
    } else if (!strcmp(strategy, "paged")) list[ns++] = LLMEM_KV_PAGED;
    else if (!strcmp(strategy, "static")) list[ns++] = LLMEM_KV_STATIC;
    else if (!strcmp(strategy, "buckets")) list[ns++] = LLMEM_KV_BUCKETS;
    else if (!strcmp(strategy, "contiguous")) list[ns++] = LLMEM_KV_CONTIGUOUS;
    else {
        fprintf(stderr, "llmem replay: --strategy must be paged, static, buckets, contiguous or all\n");
        llmem_trace_free(&trace);
        return 2;
    }
    if (o.timeline && ns > 1) {
        fprintf(stderr, "llmem replay: --timeline takes one strategy\n");
        llmem_trace_free(&trace);
        return 2;
    }
    o.progress = !json && isatty(STDERR_FILENO);
    replay_result rs[4];
    llmem_log_set(NULL, NULL, LLMEM_LOG_ERROR);
    for (size_t i = 0; i < ns; i++) {
        o.strategy = list[i];
        if (replay_run(&trace, &o, &rs[i])) {
            llmem_trace_free(&trace);
            return 1;
        }
    }
    if (json) {
        if (ns > 1) printf("[");
        for (size_t i = 0; i < ns; i++) {
            if (i) printf(",");
            print_json(&rs[i], &o);
        }
        printf(ns > 1 ? "]\n" : "\n");
    } else {
        print_table(rs, ns, &o, trace_path);
    }
    llmem_trace_free(&trace);
    return 0;
}
