/*
 * fuzz_sched.c - API sequences on the scheduler (llmem/sched.h) over a
 * simulated engine, against a shadow of what each request must produce.
 *
 * The input is a program: the first byte picks the KV (PAGED with the
 * prefix cache, with or without a swap resource, STATIC or BUCKETS) and a
 * budget small enough that admissions wait and steps preempt; then each op
 * byte picks submit (prompt length, a shared beginning or not, max_tokens,
 * n, a stop token, a cache limit, from the following bytes), cancel,
 * release, step (one or several), advance the clock, read, or info, on one
 * of the requests submitted so far.
 *
 * The simulation's tokens are a known function of the request's submission
 * number, the sample and the position, so the shadow knows every sample's
 * output: whatever was preempted, recomputed, swapped or forked, what a
 * reader sees is a prefix of it (cut before a stop token). The simulation
 * writes every KV slot and verifies sequences before they are freed
 * (write_kv): a corruption fails. After every op: llmem_kv_check, the
 * scheduler's figures against the shadow (pending requests, sequences at
 * most max_batch), and no KV held when nothing is admitted. At the end every
 * request is released and the KV must be empty.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"

#include "support.h"

#include "../src/core/hash.h"

enum { MAXREQ = 24, MAXPROMPT = 300, VOCAB = 1000, MAXBATCH = 6 };

typedef struct shreq {
    bool live;               /* submitted and not released */
    llmem_sched_req id;
    uint64_t serial;
    uint32_t prompt_len, max_tokens, n;
    int32_t stop;            /* -1: none */
} shreq;

/* The simulation's synthetic token (sched.c's pick, without logits). */
static int32_t token_at(const shreq *r, uint32_t sample, uint32_t total)
{
    uint64_t h = llmem__mix64(r->serial * 0x9e3779b97f4a7c15ull + (uint64_t)sample * 0x100000001b3ull + total);
    return (int32_t)(h % VOCAB);
}

/* Every readable token is the shadow's, and none is at or past a stop. */
static void check_output(llmem_sched *s, const shreq *r)
{
    for (uint32_t k = 0; k < r->n; k++) {
        int32_t out[MAXPROMPT + 64];
        size_t got = 0;
        FZ_CHECK(!llmem_sched_read(s, r->id, k, 0, out, MAXPROMPT + 64, &got));
        llmem_sched_info info;
        FZ_CHECK(!llmem_sched_get_info(s, r->id, k, &info));
        FZ_CHECK(!(got != info.visible || info.visible > info.generated || info.generated > r->max_tokens));
        for (size_t i = 0; i < got; i++) {
            int32_t want = token_at(r, k, r->prompt_len + (uint32_t)i);
            FZ_CHECK(!(out[i] != want || out[i] == r->stop));
        }
        FZ_CHECK(!(info.state == LLMEM_SCHED_FINISHED && info.finish == LLMEM_SCHED_FINISH_LENGTH) ||
                 info.visible == r->max_tokens);
    }
}

static void check_all(llmem_sched *s, llmem_kv *kv, const shreq *rq, size_t nreq)
{
    FZ_CHECK(!llmem_kv_check(kv));
    llmem_sched_stats st = {sizeof st};
    FZ_CHECK(!llmem_sched_get_stats(s, &st));
    FZ_CHECK(!(st.sequences_running + st.sequences_swapped > MAXBATCH));
    size_t unfinished = 0;
    for (size_t i = 0; i < nreq; i++) {
        if (!rq[i].live) continue;
        check_output(s, &rq[i]);
        bool done = true;
        for (uint32_t k = 0; k < rq[i].n; k++) {
            llmem_sched_info info;
            FZ_CHECK(!llmem_sched_get_info(s, rq[i].id, k, &info));
            if (info.state != LLMEM_SCHED_FINISHED) done = false;
        }
        unfinished += !done;
    }
    FZ_CHECK(!(llmem_sched_pending(s) != unfinished));
    llmem_kv_stats ks = {sizeof ks};
    FZ_CHECK(!llmem_kv_get_stats(kv, &ks));
    FZ_CHECK(!(!st.sequences_running && !st.sequences_swapped && ks.sequences));
    llmem_sched_sim_stats ss = {sizeof ss};
    FZ_CHECK(!(llmem_sched_get_sim_stats(s, &ss) || ss.kv_corruptions_total));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_begin();
    fz_in in = {data, size};
    unsigned cfg = fz_u8(&in);
    llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
    llmem_resource *swap = NULL;
    llmem_kv_strategy strat = cfg % 4 == 2 ? LLMEM_KV_STATIC : cfg % 4 == 3 ? LLMEM_KV_BUCKETS : LLMEM_KV_PAGED;
    if (cfg % 4 == 1 && llmem_os_resource_create(NULL, &swap)) return 0;
    llmem_pool_options po = llmem_pool_options_default();
    po.resource = llmem_resource_default();
    llmem_pool *pool;
    FZ_CHECK(!llmem_pool_create(&po, &pool));
    llmem_kv_options ko = llmem_kv_options_default();
    ko.strategy = strat;
    ko.layers = 2;
    ko.kv_heads = 1;
    ko.head_dim = 8;
    ko.block_tokens = 8;
    ko.max_seq_len = 512;
    /* 2 x 8 x 2 bytes x 2 layers = 64 B a token: 24..48 KiB, 384..768 tokens */
    ko.budget_bytes = (size_t)(24 + (cfg >> 2) % 25) << 10;
    /* Slabs of 4 blocks (1 KiB a layer), so the budget holds many and a
     * PAGED cache preempts at block granularity (the default slab, 64 KiB
     * a layer, is more than the whole budget and is refused at create). */
    ko.slab_bytes = 4 * 8 * 8 * 2 * 2;
    ko.pool = pool;
    ko.prefix_cache = strat == LLMEM_KV_PAGED;
    ko.swap_resource = swap;
    llmem_kv *kv;
    FZ_CHECK(!llmem_kv_create(&ko, &kv));
    llmem_sched_sim_options so = llmem_sched_sim_options_default();
    so.kv = kv;
    so.vocab = VOCAB;
    so.write_kv = true;
    so.model = llmem_step_model_linear(0.001, 1e-6, 1e-5, 0);
    llmem_sched_options o = llmem_sched_options_default();
    o.max_batch = MAXBATCH;
    o.max_step_tokens = 16 + (cfg >> 3) % 200;
    o.max_waiting = 12;
    o.headroom_blocks = (cfg >> 5) % 3;
    llmem_sched *s;
    FZ_CHECK(!llmem_sched_create_sim(&so, &o, &s));
    shreq rq[MAXREQ];
    memset(rq, 0, sizeof rq);
    size_t nreq = 0;
    uint64_t serial = 0;
    int32_t prompt[MAXPROMPT];
    for (int ops = 0; in.n && ops < 400; ops++) {
        unsigned op = fz_u8(&in) % 8;
        shreq *r = nreq ? &rq[fz_u8(&in) % nreq] : NULL;
        switch (op) {
        case 0:
        case 1: { /* submit */
            if (nreq == MAXREQ) break;
            unsigned a = fz_u8(&in), b = fz_u8(&in), c = fz_u8(&in);
            uint32_t len = 1 + (a | (b & 1) << 8) % (MAXPROMPT - 1);
            bool shared = b & 2;
            for (uint32_t i = 0; i < len; i++)
                prompt[i] = shared && i < 64 ? (int32_t)(i * 7 % VOCAB) : (int32_t)((serial * 131 + i * 17 + 5) % VOCAB);
            llmem_sched_params p = llmem_sched_params_default();
            p.prompt = prompt;
            p.prompt_len = len;
            p.max_tokens = 1 + c % 40;
            p.n = 1 + (b >> 2) % 3;
            int32_t stop = -1;
            if (b & 0x20) {
                stop = (int32_t)(c * 3 % VOCAB);
                p.stop_tokens = &stop;
                p.stop_token_count = 1;
            }
            if (b & 0x40) p.cache_limit = 32;
            llmem_sched_req id;
            llmem_status st = llmem_sched_submit(s, &p, &id);
            if (st == LLMEM_ECAPACITY) break; /* max_waiting */
            FZ_CHECK(!st);
            shreq *n = &rq[nreq++];
            n->live = true;
            n->id = id;
            n->serial = ++serial;
            n->prompt_len = len;
            n->max_tokens = p.max_tokens;
            n->n = p.n;
            n->stop = stop;
            break;
        }
        case 2:
            if (r && r->live) {
                FZ_CHECK(!llmem_sched_cancel(s, r->id));
                for (uint32_t k = 0; k < r->n; k++) {
                    llmem_sched_info info;
                    FZ_CHECK(!(llmem_sched_get_info(s, r->id, k, &info) || info.state != LLMEM_SCHED_FINISHED));
                }
            }
            break;
        case 3:
            if (r && r->live) {
                check_output(s, r);
                FZ_CHECK(!llmem_sched_release(s, r->id));
                r->live = false;
                llmem_sched_info info;
                FZ_CHECK(!(llmem_sched_get_info(s, r->id, 0, &info) != LLMEM_EINVAL));
            }
            break;
        case 4:
        case 5: { /* steps */
            unsigned k = 1 + fz_u8(&in) % 16;
            for (unsigned i = 0; i < k; i++)
                FZ_CHECK(!llmem_sched_step(s, NULL));
            break;
        }
        case 6: { /* advance, when nothing runs */
            llmem_sched_stats st = {sizeof st};
            llmem_sched_get_stats(s, &st);
            llmem_status a = llmem_sched_advance(s, llmem_sched_now_ns(s) + 1000000ull * fz_u8(&in));
            FZ_CHECK(!(st.sequences_running ? a != LLMEM_ESTATE : a != LLMEM_OK));
            break;
        }
        default: /* read a part of one sample */
            if (r && r->live) {
                int32_t out[8];
                size_t got;
                FZ_CHECK(!(llmem_sched_read(s, r->id, fz_u8(&in) % r->n, fz_u8(&in) % 50, out, 8, &got)));
                FZ_CHECK(!(llmem_sched_read(s, r->id, r->n, 0, out, 8, &got) != LLMEM_ERANGE));
            }
            break;
        }
        check_all(s, kv, rq, nreq);
    }
    /* Drain, then release everything: nothing may stay behind. */
    for (int guard = 0; llmem_sched_pending(s) && guard < 100000; guard++)
        FZ_CHECK(!llmem_sched_step(s, NULL));
    FZ_CHECK(!llmem_sched_pending(s));
    check_all(s, kv, rq, nreq);
    for (size_t i = 0; i < nreq; i++)
        FZ_CHECK(!(rq[i].live && llmem_sched_release(s, rq[i].id)));
    llmem_kv_stats ks = {sizeof ks};
    FZ_CHECK(!(llmem_kv_get_stats(kv, &ks) || ks.sequences || ks.blocks_used));
    llmem_sched_destroy(s);
    llmem_kv_destroy(kv);
    llmem_pool_destroy(pool);
    llmem_resource_destroy(swap);
    return 0;
}
