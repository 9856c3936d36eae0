/*
 * cmd_run.c - `llmem run`: generate text with a llama-family model, every
 * byte of it from llmem (or, with --alloc malloc, from the C library, the
 * baseline the benchmarks compare against).
 *
 * The options follow llama2.c's run.c, so the two can be run side by side
 * on the same checkpoint: -z tokenizer, -i prompt, -n steps (positions in
 * all, the prompt included; each gives the next token, so a run prints up
 * to steps + 1 tokens counting BOS), -t temperature, -p top-p, -s seed. Like run.c
 * it prints the prompt and the generated text and stops early when the
 * model produces BOS; --print-ids prints the token ids instead, one line,
 * BOS first (the format of the reference .ids files in ../shared/models).
 *
 * Unlike run.c the prompt goes through the model in one batched pass
 * (prefill), then one token per step (decode); --batch N runs N copies of
 * the request at once with seeds seed, seed+1, ... (the engine's
 * multi-sequence steps).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "tool_util.h"
#include "llmem/llmem.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem run MODEL [-z TOKENIZER] [-i PROMPT] [-n STEPS] [-t TEMP] [-p TOPP] [-s SEED]\n"
            "                 [--threads N] [--batch N] [--print-ids] [--alloc llmem|malloc] [--stats[=json|=prometheus]]\n"
            "                 [--kv paged|static|buckets|contiguous] [--kv-dtype f32|f16] [--max-seq-len N]\n"
            "                 [--populate] [--warmup] [--shared] [--mlock] [--sequential] [--hugepage] [--copy] [--timeline FILE.html]\n"
            "\n"
            "MODEL is a llama2.c checkpoint (.bin, needs -z) or a GGUF file (F32, F16, BF16, Q4_0..Q8_0, Q2_K..Q6_K).\n"
            "  -z PATH          llama2.c tokenizer.bin (default: the vocabulary inside a GGUF model)\n"
            "  -i TEXT          prompt (default empty)\n"
            "  -n N             positions in all, prompt included; 0 = the model's context (default 256)\n"
            "  -t T             temperature, 0 = greedy (default 1.0)\n"
            "  -p P             top-p in [0,1] (default 0.9)\n"
            "  -s N             seed (default: the time)\n"
            "  --threads N      kernel threads (default: online CPUs)\n"
            "  --batch N        run N copies of the request together, seeds s, s+1, ... (default 1)\n"
            "  --print-ids      print the token ids (BOS first), not the text\n"
            "  --alloc A        llmem (default) or malloc: the C library for KV and activations, as a baseline\n"
            "  --stats[=json|=prometheus]  a summary on stderr: load, prefill and decode speed, memory;\n"
            "                   json, prometheus: also every component's stats (model, engine, KV, pool, controller)\n"
            "  --kv S           KV strategy: paged (default), static, buckets\n"
            "  --max-seq-len N  tokens a sequence may hold (default: the model's context)\n"
            "  --kv-dtype D     f32 (default) or f16\n"
            "  --populate       fault the whole model in at open (MAP_POPULATE)\n"
            "  --warmup         run the prompt once on a throwaway sequence first and leave it out of\n"
            "                   --stats' prefill figure (a warm prefill, as benchmarks time their peers)\n"
            "  --shared         map the model MAP_SHARED (one copy across processes)\n"
            "  --mlock          lock the model in memory\n"
            "  --copy           read the model into private memory instead of mapping it (immune to the file\n"
            "                   being truncated or rewritten while it runs; costs its size in RAM)\n"
            "  --sequential     madvise(SEQUENTIAL, WILLNEED) over the weights at open (read ahead)\n"
            "  --hugepage       madvise(HUGEPAGE) over the mapping where alignment allows\n"
            "  --timeline F     run the stage-aware controller and write its memory timeline to F (HTML)\n"
            "  --events F       run the controller and write its decisions to F as JSON lines\n"
            "\n"
            "On AVX2 machines the engine copies every Q4_K and Q5_0 matrix at load into a layout 8 rows interleaved\n"
            "(same results, faster decode) and gives the file's pages of it back, so memory stays about one\n"
            "model. --shared, --mlock, --copy and --alloc malloc skip that and read the weights in place.\n");
}

static bool parse_float(const char *s, float lo, float hi, float *out)
{
    double v;
    if (!tool_parse_double(s, lo, hi, &v)) return false;
    *out = (float)v;
    return true;
}

static double now_s(void) { return (double)llmem_time_now_ns() * 1e-9; }

/* Print a piece as run.c does: skip lone bytes that are not printable. */
static void print_piece(const char *p, size_t len)
{
    if (!p || !len) return;
    if (len == 1) {
        unsigned char c = (unsigned char)p[0];
        if (!(c >= 32 && c < 127) && c != '\n' && c != '\t' && c != ' ') return;
    }
    fwrite(p, 1, len, stdout);
}

typedef struct run_args {
    const char *model, *tokenizer, *prompt, *timeline;
    uint32_t steps, threads, batch;
    float temperature, top_p;
    uint64_t seed;
    bool print_ids, stats, stats_json, stats_prom, populate, shared, mlock, sequential, hugepage, copy, warmup;
    const char *events;
    llmem_engine_options eo;
} run_args;

/* Prefill tokens and seconds of the --warmup pass, left out of --stats. */
static uint64_t warm_tokens;
static double warm_seconds;

/* "llmem run: WHAT: message (STATUS)", without WHAT when the library's
 * message already names it (a path it quotes, or its own "tokenizer: "
 * prefix), so nothing is said twice. */
static int fail(const char *what, llmem_status st)
{
    const char *msg = llmem_error_message()[0] ? llmem_error_message() : llmem_status_str(st);
    size_t wl = strlen(what);
    bool named = strstr(msg, what) != NULL || (!strncmp(msg, what, wl) && msg[wl] == ':');
    if (named) fprintf(stderr, "llmem run: %s (%s)\n", msg, llmem_status_name(st));
    else fprintf(stderr, "llmem run: %s: %s (%s)\n", what, msg, llmem_status_name(st));
    return 1;
}

static void print_stats(const run_args *a, llmem_model *m, llmem_engine *e, llmem_controller *ctl,
                        llmem_predictor *pred, double load_s, double first_s)
{
    llmem_engine_stats es = {sizeof es};
    llmem_model_stats ms = {sizeof ms};
    llmem_engine_get_stats(e, &es);
    /* --warmup's pass is not the request's prefill: out of every format. */
    es.prefill_tokens_total -= warm_tokens;
    es.prefill_seconds_total -= warm_seconds;
    llmem_model_get_stats(m, &ms);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (a->stats_json || a->stats_prom) {
        llmem_exporter *ex;
        if (llmem_exporter_create(a->stats_prom ? LLMEM_EXPORT_PROMETHEUS : LLMEM_EXPORT_JSON, &ex)) return;
        llmem_exporter_add(ex, llmem_model_stats_schema(), &ms, NULL, 0);
        llmem_exporter_add(ex, llmem_engine_stats_schema(), &es, NULL, 0);
        llmem_kv *kv = llmem_engine_kv(e);
        llmem_pool *pool = llmem_engine_pool(e);
        llmem_kv_stats ks = {sizeof ks};
        if (kv && !llmem_kv_get_stats(kv, &ks)) llmem_exporter_add(ex, llmem_kv_stats_schema(), &ks, NULL, 0);
        if (pool) llmem_pool_export_stats(pool, ex, NULL, 0); /* the pool's figures and each class's */
        llmem_predictor_stats prs = {sizeof prs};
        if (pred && !llmem_predictor_get_stats(pred, &prs))
            llmem_exporter_add(ex, llmem_predictor_stats_schema(), &prs, NULL, 0);
        llmem_controller_stats cs = {sizeof cs};
        if (ctl && !llmem_controller_get_stats(ctl, &cs))
            llmem_exporter_add(ex, llmem_controller_stats_schema(), &cs, NULL, 0);
        llmem_exporter_write(ex, stderr);
        fputc('\n', stderr);
        llmem_exporter_destroy(ex);
    }
    fprintf(stderr,
            "model      %s, %.1f MB mapped, %.1f MB resident, opened in %.3f s (engine ready at %.3f s)\n"
            "prefill    %zu tokens in %.3f s: %.1f tok/s (first token after %.3f s)\n"
            "decode     %zu tokens in %.3f s: %.1f tok/s\n"
            "memory     KV reserved %.2f MB (peak %.2f), used %.2f MB; workspace %.2f MB (step peak %.2f);\n"
            "           converted weights %.2f MB,"
            " pool %.2f MB, malloc %.2f MB, peak RSS %.1f MB (%s)\n",
            a->model, (double)ms.mapped_bytes / 1e6, (double)ms.resident_bytes / 1e6, ms.open_seconds, load_s,
            (size_t)es.prefill_tokens_total, es.prefill_seconds_total,
            es.prefill_seconds_total > 0 ? (double)es.prefill_tokens_total / es.prefill_seconds_total : 0.0, first_s,
            (size_t)es.decode_tokens_total, es.decode_seconds_total,
            es.decode_seconds_total > 0 ? (double)es.decode_tokens_total / es.decode_seconds_total : 0.0,
            (double)es.kv_bytes / 1e6, (double)es.kv_peak_bytes / 1e6, (double)es.kv_used_bytes / 1e6,
            (double)es.workspace_bytes / 1e6,
            (double)es.workspace_peak_bytes / 1e6, (double)es.weights_converted_bytes / 1e6,
            (double)es.pool_reserved_bytes / 1e6, (double)es.malloc_bytes / 1e6, (double)ru.ru_maxrss / 1024.0,
            a->eo.alloc == LLMEM_ENGINE_ALLOC_MALLOC ? "alloc malloc" : "alloc llmem");
}

static void timeline_sample(llmem_timeline *tl, llmem_pool *pool, llmem_engine *e, llmem_stage stage)
{
    llmem_pool_stats ps = {sizeof ps};
    llmem_engine_stats es = {sizeof es};
    llmem_pool_get_stats(pool, &ps);
    llmem_engine_get_stats(e, &es);
    llmem_timeline_sample s = {llmem_time_now_ns(), stage, ps.reserved_bytes, ps.committed_bytes, ps.used_bytes,
                               es.kv_bytes ? (double)es.kv_used_bytes / (double)es.kv_bytes : -1};
    llmem_timeline_record(tl, &s);
}

/* False (and a message) when the page could not be written. */
static bool timeline_write(llmem_timeline *tl, llmem_controller *ctl, const char *path)
{
    llmem_memctl_add_decisions(ctl, tl);
    if (llmem_timeline_write_html(tl, path, "llmem run")) {
        fprintf(stderr, "llmem run: %s\n", llmem_error_message()); /* "timeline: cannot write ..." */
        return false;
    }
    fprintf(stderr, "llmem run: timeline written to %s\n", path);
    return true;
}

/* One run's state, phase by phase (generate calls them in order; each
 * returns 0, or 1 having said what failed, and run_close frees all). */
typedef struct run_state {
    const run_args *a;
    double t_start, load_s, t_first;
    llmem_model *m;
    const llmem_model_config *c;
    llmem_memctl *mc; /* with --timeline or --events: pool, predictor, controller */
    llmem_pool *pool;
    llmem_controller *ctl;
    llmem_predictor *pred;
    llmem_timeline *tl;
    llmem_tokenizer *tok;
    llmem_engine_options eo;
    llmem_engine *e;
    int32_t *prompt;
    size_t n;           /* prompt tokens that run */
    size_t steps;       /* positions that run */
    size_t first_shown; /* 1 when BOS leads the prompt (it prints nothing) */
    /* per copy of the prompt (a->batch of them): */
    llmem_sampler **samplers;
    llmem_engine_seq *seqs;
    int32_t **ids; /* prompt, then generated tokens */
    size_t *nids;
    bool *done;
    int32_t *next; /* the token sampled for the next step */
    /* one decode step's items, and the copy each came from: */
    llmem_engine_batch_item *items;
    uint32_t *slot;
    size_t generated;
} run_state;

/* The model, its vocabulary, the controller when a timeline or events
 * are asked for, and the engine. */
static int run_open(run_state *r)
{
    const run_args *a = r->a;
    llmem_model_options mo = llmem_model_options_default();
    mo.populate = a->populate;
    mo.shared = a->shared;
    mo.mlock = a->mlock;
    mo.copy = a->copy;
    mo.sequential = a->sequential;
    mo.hugepage = a->hugepage;
    mo.progress = true;
    /* On a terminal, a big model is faulted in at open with a progress
     * line, rather than silently during the first forward pass. */
    struct stat sb;
    if (isatty(2) && stat(a->model, &sb) == 0 && sb.st_size > 100 * 1000 * 1000) mo.populate = true;
    llmem_status st;
    if ((st = llmem_model_open(a->model, &mo, &r->m))) return fail(a->model, st);
    r->c = llmem_model_get_config(r->m);
    if (a->tokenizer) st = llmem_tokenizer_load(a->tokenizer, r->c->shape.vocab, &r->tok);
    else if ((st = llmem_tokenizer_from_model(r->m, &r->tok)) == LLMEM_ENOTFOUND)
        fprintf(stderr, "llmem run: %s has no vocabulary inside: give its tokenizer.bin with -z\n", a->model);
    if (st) return fail(a->tokenizer ? a->tokenizer : "tokenizer", st);
    if (llmem_tokenizer_vocab_size(r->tok) != r->c->shape.vocab) {
        fprintf(stderr, "llmem run: the tokenizer has %u tokens, the model %u\n", llmem_tokenizer_vocab_size(r->tok),
                r->c->shape.vocab);
        return 1;
    }
    r->eo = a->eo;
    r->eo.threads = a->threads;
    r->eo.max_seqs = a->batch;
    if (a->timeline || a->events) {
        /* The timeline watches a pool the stage-aware controller runs:
         * pool, predictor and controller for this engine in one call (eo
         * gets the pool and the stage listener). */
        llmem_memctl_options mco = llmem_memctl_options_default();
        mco.name = "run";
        if ((st = llmem_memctl_create_for_engine(r->m, &r->eo, &mco, &r->mc)) ||
            (a->timeline && (st = llmem_timeline_create(0, &r->tl))))
            return fail("controller", st);
        r->pool = llmem_memctl_pool(r->mc);
        r->ctl = llmem_memctl_controller(r->mc);
        r->pred = llmem_memctl_predictor(r->mc); /* fed the measured peaks through eo.on_step_done */
    }
    if ((st = llmem_engine_create(r->m, &r->eo, &r->e))) return fail("engine", st);
    r->load_s = now_s() - r->t_start;
    return 0;
}

/* The positions that run and the prompt's tokens, cut to them. */
static int run_encode(run_state *r)
{
    const run_args *a = r->a;
    const llmem_model_config *c = r->c;
    size_t ctx = r->eo.max_seq_len && r->eo.max_seq_len < c->shape.max_ctx ? r->eo.max_seq_len : c->shape.max_ctx;
    r->steps = a->steps ? a->steps : ctx;
    if (r->steps > ctx) {
        fprintf(stderr, "llmem run: warning: -n %u is past the context of %zu positions: running %zu\n", a->steps, ctx,
                ctx);
        r->steps = ctx;
    }
    size_t cap = strlen(a->prompt) + 3, n = 0;
    r->prompt = malloc(cap * sizeof *r->prompt);
    if (!r->prompt) return 1;
    /* BOS as the model asks (tokenizer.ggml.add_bos_token; gpt2 vocabularies add none by default). */
    llmem_status st = llmem_tokenizer_encode(r->tok, a->prompt, llmem_tokenizer_add_bos(r->tok), false, r->prompt, cap, &n);
    if (st) return fail("encode", st);
    r->first_shown = llmem_tokenizer_add_bos(r->tok) ? 1 : 0;
    if (n == 0) {
        fprintf(stderr, "llmem run: the prompt is empty and this model adds no BOS token: give a prompt (-i)\n");
        return 1;
    }
    if (n > r->steps) { /* as run.c: only the first steps positions run; but say so */
        fprintf(stderr,
                "llmem run: warning: the prompt is %zu tokens%s, more than the %zu positions that run: only "
                "its first %zu are used, %zu dropped (raise -n%s)\n",
                n, r->first_shown ? " (with BOS)" : "", r->steps, r->steps, n - r->steps,
                r->steps == ctx ? ", or use a model with a longer context" : "");
        n = r->steps;
    }
    r->n = n;
    return 0;
}

/* --warmup: the prompt once (every copy, as the timed prefill will), then
 * the sequences go back, so the timed pass meets a warm engine. */
static int run_warmup(run_state *r)
{
    uint32_t W = r->a->batch;
    uint32_t chunk = r->eo.max_step_tokens ? r->eo.max_step_tokens : 512;
    size_t take = r->n < chunk / W ? r->n : chunk / W;
    llmem_engine_seq ws[256] = {0};
    llmem_engine_batch_item wi[256] = {{0}};
    llmem_status st = LLMEM_OK;
    for (uint32_t b = 0; b < W && !st; b++)
        if (!(st = llmem_engine_seq_create(r->e, &ws[b])))
            wi[b] = (llmem_engine_batch_item){ws[b], r->prompt, (uint32_t)(take ? take : 1)};
    if (!st) st = llmem_engine_step(r->e, wi, W);
    for (uint32_t b = 0; b < W; b++)
        if (ws[b]) llmem_engine_seq_free(r->e, ws[b]);
    if (st) return fail("warm-up", st);
    llmem_engine_stats ws_st = {sizeof ws_st};
    llmem_engine_get_stats(r->e, &ws_st);
    warm_tokens = ws_st.prefill_tokens_total;
    warm_seconds = ws_st.prefill_seconds_total;
    return 0;
}

/* A sampler, a sequence with room for every position, and the token
 * list of each copy of the prompt. */
static int run_requests(run_state *r)
{
    const run_args *a = r->a;
    uint32_t B = a->batch;
    r->samplers = calloc(B, sizeof *r->samplers);
    r->seqs = calloc(B, sizeof *r->seqs);
    r->ids = calloc(B, sizeof *r->ids);
    r->nids = calloc(B, sizeof *r->nids);
    r->done = calloc(B, sizeof *r->done);
    r->items = calloc(B, sizeof *r->items);
    r->next = calloc(B, sizeof *r->next);
    r->slot = calloc(B, sizeof *r->slot);
    if (!r->samplers || !r->seqs || !r->ids || !r->nids || !r->done || !r->items || !r->next || !r->slot) {
        fprintf(stderr, "llmem run: out of memory\n");
        return 1;
    }
    for (uint32_t b = 0; b < B; b++) {
        llmem_sampler_options so = llmem_sampler_options_default();
        so.vocab_size = r->c->shape.vocab;
        so.temperature = a->temperature;
        so.top_p = a->top_p;
        so.seed = a->seed + b;
        llmem_status st;
        if ((st = llmem_sampler_create(&so, &r->samplers[b])) || (st = llmem_engine_seq_create(r->e, &r->seqs[b])) ||
            (st = llmem_engine_seq_reserve(r->e, r->seqs[b], r->steps)) ||
            !(r->ids[b] = malloc((r->steps + 1) * sizeof **r->ids)))
            return fail("request setup", st ? st : LLMEM_ENOMEM);
        memcpy(r->ids[b], r->prompt, r->n * sizeof *r->prompt);
        r->nids[b] = r->n;
    }
    return 0;
}

/* The prompt in chunks of max_step_tokens, every copy at once when they
 * fit in one step; the first token of each copy sampled; the prompt
 * printed (one copy, as text). */
static int run_prefill(run_state *r)
{
    uint32_t B = r->a->batch;
    size_t n = r->n;
    uint32_t chunk = r->eo.max_step_tokens ? r->eo.max_step_tokens : 512;
    for (size_t off = 0; off < n;) {
        size_t take = n - off < chunk / B ? n - off : chunk / B;
        if (!take) take = 1;
        for (uint32_t b = 0; b < B; b++)
            r->items[b] = (llmem_engine_batch_item){r->seqs[b], r->prompt + off, (uint32_t)take};
        uint32_t per = chunk / (uint32_t)take ? chunk / (uint32_t)take : 1;
        for (uint32_t b0 = 0; b0 < B; b0 += per) {
            uint32_t cnt = B - b0 < per ? B - b0 : per;
            llmem_status st = llmem_engine_step(r->e, r->items + b0, cnt);
            if (st) return fail("prefill", st);
            if (off + take == n)
                for (uint32_t b = 0; b < cnt; b++)
                    r->next[b0 + b] = llmem_sampler_sample(r->samplers[b0 + b], llmem_engine_logits(r->e, b));
        }
        off += take;
    }
    r->t_first = now_s() - r->t_start;
    if (r->tl) timeline_sample(r->tl, r->pool, r->e, LLMEM_STAGE_PREFILL);
    if (!r->a->print_ids && B == 1)
        for (size_t i = r->first_shown; i < n; i++) { /* BOS, when added, prints nothing */
            size_t len;
            const char *p = llmem_tokenizer_decode(r->tok, i ? r->prompt[i - 1] : -1, r->prompt[i], &len);
            print_piece(p, len);
        }
    fflush(stdout);
    return 0;
}

/* Decode steps over the copies still running until each has run every
 * position or met BOS (as run.c: BOS ends the text, and is not kept). */
static int run_decode(run_state *r)
{
    uint32_t B = r->a->batch;
    int32_t bos = llmem_tokenizer_bos(r->tok);
    for (;;) {
        uint32_t live = 0;
        for (uint32_t b = 0; b < B; b++) {
            if (r->done[b]) continue;
            if (r->next[b] == bos) {
                r->done[b] = true;
                continue;
            }
            if (!r->a->print_ids && B == 1) {
                size_t len;
                const char *piece = llmem_tokenizer_decode(r->tok, r->ids[b][r->nids[b] - 1], r->next[b], &len);
                print_piece(piece, len);
                fflush(stdout);
            }
            r->ids[b][r->nids[b]++] = r->next[b];
            if (r->nids[b] - 1 >= r->steps) { /* every position has been through the model */
                r->done[b] = true;
                continue;
            }
            r->items[live] = (llmem_engine_batch_item){r->seqs[b], &r->ids[b][r->nids[b] - 1], 1};
            r->slot[live++] = b;
        }
        if (!live) break;
        llmem_status st = llmem_engine_step(r->e, r->items, live);
        if (st) return fail("decode", st);
        r->generated += live;
        for (uint32_t i = 0; i < live; i++)
            r->next[r->slot[i]] = llmem_sampler_sample(r->samplers[r->slot[i]], llmem_engine_logits(r->e, i));
        if (r->tl) timeline_sample(r->tl, r->pool, r->e, LLMEM_STAGE_DECODE);
    }
    llmem_engine_set_idle(r->e);
    return 0;
}

/* The timeline and events files, the text (or ids) of every copy, the
 * speed and --stats. 1 when a file asked for could not be written (the
 * text is out). */
static int run_outputs(run_state *r)
{
    const run_args *a = r->a;
    uint32_t B = a->batch;
    bool output_failed = false;
    if (r->tl) {
        timeline_sample(r->tl, r->pool, r->e, LLMEM_STAGE_IDLE);
        if (!timeline_write(r->tl, r->ctl, a->timeline)) output_failed = true;
    }
    if (a->events) {
        llmem_outfile *of;
        llmem_status wst = llmem_outfile_open(a->events, &of);
        if (!wst && (wst = llmem_controller_write_events(r->ctl, llmem_outfile_stream(of))) != LLMEM_OK)
            llmem_outfile_abort(of);
        else if (!wst) wst = llmem_outfile_commit(of);
        if (wst) {
            fprintf(stderr, "llmem run: events: %s\n", llmem_error_message());
            output_failed = true;
        }
    }
    if (a->print_ids) {
        for (uint32_t b = 0; b < B; b++) {
            for (size_t i = 0; i < r->nids[b]; i++) printf(i ? " %d" : "%d", r->ids[b][i]);
            printf("\n");
        }
    } else if (B > 1) {
        for (uint32_t b = 0; b < B; b++) {
            printf("[%u] ", b);
            for (size_t i = r->first_shown; i < r->nids[b]; i++) {
                size_t len;
                const char *piece = llmem_tokenizer_decode(r->tok, i ? r->ids[b][i - 1] : -1, r->ids[b][i], &len);
                print_piece(piece, len);
            }
            printf("\n");
        }
    } else {
        printf("\n");
    }
    fflush(stdout);
    double total = now_s() - r->t_start;
    if (r->generated > 0) fprintf(stderr, "achieved tok/s: %f\n", (double)r->generated / (total - r->t_first));
    if (a->stats) print_stats(a, r->m, r->e, r->ctl, r->pred, r->load_s, r->t_first);
    return output_failed ? 1 : 0;
}

static void run_close(run_state *r)
{
    for (uint32_t b = 0; r->seqs && b < r->a->batch; b++) {
        if (r->e && r->seqs[b]) llmem_engine_seq_free(r->e, r->seqs[b]);
        if (r->samplers) llmem_sampler_destroy(r->samplers[b]);
        if (r->ids) free(r->ids[b]);
    }
    free(r->samplers);
    free(r->seqs);
    free(r->ids);
    free(r->nids);
    free(r->done);
    free(r->items);
    free(r->next);
    free(r->slot);
    free(r->prompt);
    llmem_engine_destroy(r->e);
    llmem_timeline_destroy(r->tl);
    llmem_memctl_destroy(r->mc);
    llmem_tokenizer_destroy(r->tok);
    llmem_model_close(r->m);
}

static int generate(const run_args *a)
{
    run_state r = {.a = a, .t_start = now_s()};
    int rc = run_open(&r);
    if (!rc) rc = run_encode(&r);
    if (!rc && a->warmup) rc = run_warmup(&r);
    if (!rc) rc = run_requests(&r);
    if (!rc) rc = run_prefill(&r);
    if (!rc) rc = run_decode(&r);
    if (!rc) rc = run_outputs(&r);
    run_close(&r);
    return rc;
}

int llmem_cmd_run(int argc, char **argv)
{
    run_args a;
    memset(&a, 0, sizeof a);
    a.prompt = "";
    a.steps = 256;
    a.temperature = 1.0f;
    a.top_p = 0.9f;
    a.seed = (uint64_t)time(NULL);
    a.batch = 1;
    a.eo = llmem_engine_options_default();
    tool_args cl = {"run", usage, argc, argv};
    while (tool_args_next(&cl)) {
        bool ok = true;
        if (tool_args_help(&cl)) return 0;
        else if (tool_args_is(&cl, "--print-ids")) a.print_ids = true;
        else if (tool_args_is(&cl, "--stats")) a.stats = true;
        else if (tool_args_is(&cl, "--stats=json")) a.stats = a.stats_json = true;
        else if (tool_args_is(&cl, "--stats=prometheus")) a.stats = a.stats_prom = true;
        else if (tool_args_take(&cl, "--events")) a.events = cl.val;
        else if (tool_args_is(&cl, "--populate")) a.populate = true;
        else if (tool_args_is(&cl, "--warmup")) a.warmup = true;
        else if (tool_args_is(&cl, "--shared")) a.shared = true;
        else if (tool_args_is(&cl, "--mlock")) a.mlock = true;
        else if (tool_args_is(&cl, "--copy")) a.copy = true;
        else if (tool_args_is(&cl, "--sequential")) a.sequential = true;
        else if (tool_args_is(&cl, "--hugepage")) a.hugepage = true;
        else if (tool_args_take(&cl, "-z")) a.tokenizer = cl.val;
        else if (tool_args_take(&cl, "--timeline")) a.timeline = cl.val;
        else if (tool_args_take(&cl, "-i")) a.prompt = cl.val;
        else if (tool_args_take(&cl, "-n")) ok = tool_parse_u32(cl.val, 0, 1u << 24, &a.steps);
        else if (tool_args_take(&cl, "-t")) ok = parse_float(cl.val, 0, 100, &a.temperature);
        else if (tool_args_take(&cl, "-p")) ok = parse_float(cl.val, 0, 1, &a.top_p);
        else if (tool_args_take(&cl, "-s")) ok = tool_parse_u64(cl.val, &a.seed);
        else if (tool_args_take(&cl, "--threads")) ok = tool_parse_u32(cl.val, 1, 1024, &a.threads);
        else if (tool_args_take(&cl, "--max-seq-len")) ok = tool_parse_u32(cl.val, 1, 1u << 24, &a.eo.max_seq_len);
        else if (tool_args_take(&cl, "--batch")) ok = tool_parse_u32(cl.val, 1, 256, &a.batch);
        else if (tool_args_take(&cl, "--alloc")) {
            if (!strcmp(cl.val, "llmem")) a.eo.alloc = LLMEM_ENGINE_ALLOC_LLMEM;
            else if (!strcmp(cl.val, "malloc")) a.eo.alloc = LLMEM_ENGINE_ALLOC_MALLOC;
            else ok = false;
        } else if (tool_args_take(&cl, "--kv")) {
            if (!strcmp(cl.val, "paged")) a.eo.kv_strategy = LLMEM_KV_PAGED;
            else if (!strcmp(cl.val, "static")) a.eo.kv_strategy = LLMEM_KV_STATIC;
            else if (!strcmp(cl.val, "buckets")) a.eo.kv_strategy = LLMEM_KV_BUCKETS;
            else if (!strcmp(cl.val, "contiguous")) a.eo.kv_strategy = LLMEM_KV_CONTIGUOUS;
            else ok = false;
        } else if (tool_args_take(&cl, "--kv-dtype")) {
            if (!strcmp(cl.val, "f32")) a.eo.kv_dtype = LLMEM_KV_F32;
            else if (!strcmp(cl.val, "f16")) a.eo.kv_dtype = LLMEM_KV_F16;
            else ok = false;
        } else if (cl.opt[0] != '-' && !a.model) a.model = cl.opt;
        else return tool_args_unknown(&cl);
        if (!ok) return tool_args_bad_value(&cl);
    }
    if (!a.model) {
        usage(stderr);
        return 2;
    }
    return generate(&a);
}
