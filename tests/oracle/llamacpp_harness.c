/*
 * llamacpp_harness.c - llama.cpp, as shipped prebuilt in the npm package
 * @node-llama-cpp/linux-x64@3.22.1, driven through its C API: the oracle
 * the engine's tests compare against and the peer its benchmark times.
 * Ours; it links libllama/libggml as shipped and copies none of their code.
 * Built by tests/oracle/build_harness.sh against the headers of the same
 * release (scripts/llamacpp.sh), never by the project's CMake build, so the
 * project builds and tests without it.
 *
 *   llamacpp_harness [-t THREADS] [--kv f32|f16] COMMAND ARGS
 *
 *   load MODEL                    load it and make a context: prints
 *                                 "ok vocab=N ctx_train=N"; exit 1 if llama.cpp refuses it
 *   tokenize MODEL TEXT           ids of TEXT (BOS added as the model says), space-separated
 *   generate MODEL N ID...        greedy: N tokens after the prompt ids, space-separated
 *                                 (first highest logit wins a tie)
 *   logits MODEL OUT ID...        teacher forcing: the prompt in one batch, the logits of
 *                                 every position to OUT (f32, ids x vocab, row-major);
 *                                 with LLAMACPP_ONE_BY_ONE=1 one token a step instead (the
 *                                 same products in another order: how far llama.cpp is from
 *                                 itself)
 *   dequant TYPE IN OUT           ggml's own to_float for the ggml type number TYPE over
 *                                 the whole blocks in IN, f32 to OUT
 *   bench MODEL TEXT N S ROUNDS   timing: S sequences of the prompt TEXT (tokenised, BOS
 *                                 first), prefilled together in one batch, then N greedy
 *                                 decode steps of S tokens; per round "round R
 *                                 prompt_tokens P prefill_tok_s X decode_tok_s Y" (tokens
 *                                 of all sequences over the wall time of each phase; the
 *                                 same measure as llmem run --batch S --stats), then
 *                                 "peak_rss_kb K"
 *
 * The CPU backend is loaded from LLAMACPP_LIBDIR (the package's bins folder,
 * where ggml picks the variant for this CPU). llama.cpp's log goes to
 * stderr only with LLAMACPP_VERBOSE=1; LLAMACPP_NO_REPACK=1 turns off the
 * CPU backend's repacked weight layouts. KV cache f32 by default (the
 * oracle wants llama.cpp's best numbers, llmem's KV is f32 by default);
 * --kv f16 for llama.cpp's own default.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

static int n_threads = 2;
static enum ggml_type kv_type = GGML_TYPE_F32;

static void quiet_log(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void backend_init(void)
{
    if (!getenv("LLAMACPP_VERBOSE")) llama_log_set(quiet_log, NULL);
    const char *dir = getenv("LLAMACPP_LIBDIR");
    if (dir) ggml_backend_load_all_from_path(dir);
    else ggml_backend_load_all();
    llama_backend_init();
}

static struct llama_model *load(const char *path)
{
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    if (getenv("LLAMACPP_NO_REPACK")) mp.use_extra_bufts = false;
    struct llama_model *m = llama_model_load_from_file(path, mp);
    if (!m) fprintf(stderr, "llamacpp_harness: llama.cpp refused to load %s\n", path);
    return m;
}

static struct llama_context *context(struct llama_model *m, uint32_t n_ctx, uint32_t n_batch, uint32_t n_seq)
{
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_batch;
    cp.n_seq_max = n_seq;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.type_k = kv_type;
    cp.type_v = kv_type;
    cp.no_perf = true;
    cp.kv_unified = n_seq > 1 ? false : cp.kv_unified;
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c) fprintf(stderr, "llamacpp_harness: no context (n_ctx %u, n_batch %u, seqs %u)\n", n_ctx, n_batch, n_seq);
    return c;
}

static int parse_ids(int argc, char **argv, llama_token **out)
{
    llama_token *ids = malloc(((size_t)argc + 1) * sizeof *ids);
    if (!ids) return -1;
    for (int i = 0; i < argc; i++) {
        char *end;
        errno = 0;
        long v = strtol(argv[i], &end, 10);
        if (errno || end == argv[i] || *end || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "llamacpp_harness: bad token id '%s'\n", argv[i]);
            free(ids);
            return -1;
        }
        ids[i] = (llama_token)v;
    }
    *out = ids;
    return argc;
}

static llama_token argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* Decode ids [0, n) of sequence seq at positions pos0.., logits for the
 * last only (all when all_logits). */
static int decode(struct llama_context *c, struct llama_batch *b, const llama_token *ids, int n, int pos0,
                  llama_seq_id seq, int all_logits)
{
    b->n_tokens = n;
    for (int i = 0; i < n; i++) {
        b->token[i] = ids[i];
        b->pos[i] = pos0 + i;
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = seq;
        b->logits[i] = (int8_t)(all_logits || i == n - 1);
    }
    int rc = llama_decode(c, *b);
    if (rc) fprintf(stderr, "llamacpp_harness: llama_decode failed (%d)\n", rc);
    return rc;
}

static int cmd_load(const char *path)
{
    struct llama_model *m = load(path);
    if (!m) return 1;
    struct llama_context *c = context(m, 64, 64, 1);
    if (!c) {
        llama_model_free(m);
        return 1;
    }
    printf("ok vocab=%d ctx_train=%d\n", llama_vocab_n_tokens(llama_model_get_vocab(m)), llama_model_n_ctx_train(m));
    llama_free(c);
    llama_model_free(m);
    return 0;
}

static int cmd_tokenize(const char *path, const char *text)
{
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *m = llama_model_load_from_file(path, mp);
    if (!m) return 1;
    const struct llama_vocab *v = llama_model_get_vocab(m);
    int len = (int)strlen(text), cap = len + 8;
    llama_token *ids = malloc((size_t)cap * sizeof *ids);
    int n = ids ? llama_tokenize(v, text, len, ids, cap, true, false) : -1;
    for (int i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
    printf("\n");
    free(ids);
    llama_model_free(m);
    return n < 0;
}

static int cmd_generate(const char *path, int steps, int argc, char **argv)
{
    llama_token *ids;
    int n = parse_ids(argc, argv, &ids);
    if (n <= 0 || steps < 0) return 2;
    struct llama_model *m = load(path);
    if (!m) return 1;
    int vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
    struct llama_context *c = context(m, (uint32_t)(n + steps + 1), (uint32_t)n, 1);
    struct llama_batch b = llama_batch_init(n, 0, 1);
    int rc = c ? decode(c, &b, ids, n, 0, 0, 0) : 1;
    for (int s = 0; !rc && s < steps; s++) {
        llama_token t = argmax(llama_get_logits_ith(c, -1), vocab);
        printf("%s%d", s ? " " : "", t);
        if (s + 1 < steps) rc = decode(c, &b, &t, 1, n + s, 0, 0);
    }
    printf("\n");
    llama_batch_free(b);
    if (c) llama_free(c);
    llama_model_free(m);
    free(ids);
    return rc != 0;
}

static int cmd_logits(const char *path, const char *out, int argc, char **argv)
{
    llama_token *ids;
    int n = parse_ids(argc, argv, &ids);
    if (n <= 0) return 2;
    struct llama_model *m = load(path);
    if (!m) return 1;
    int vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
    struct llama_context *c = context(m, (uint32_t)n, (uint32_t)n, 1);
    struct llama_batch b = llama_batch_init(n, 0, 1);
    FILE *f = fopen(out, "wb");
    int rc = !c || !f;
    if (!rc && getenv("LLAMACPP_ONE_BY_ONE")) {
        for (int i = 0; !rc && i < n; i++) {
            rc = decode(c, &b, ids + i, 1, i, 0, 1);
            if (!rc && fwrite(llama_get_logits_ith(c, 0), sizeof(float), (size_t)vocab, f) != (size_t)vocab) rc = 1;
        }
    } else {
        if (!rc) rc = decode(c, &b, ids, n, 0, 0, 1);
        for (int i = 0; !rc && i < n; i++)
            if (fwrite(llama_get_logits_ith(c, i), sizeof(float), (size_t)vocab, f) != (size_t)vocab) rc = 1;
    }
    if (f && fclose(f)) rc = 1;
    llama_batch_free(b);
    if (c) llama_free(c);
    llama_model_free(m);
    free(ids);
    return rc != 0;
}

static int cmd_dequant(int type, const char *in, const char *out)
{
    if (type < 0 || type >= GGML_TYPE_COUNT) return 2;
    const struct ggml_type_traits *tt = ggml_get_type_traits((enum ggml_type)type);
    if (!tt || !tt->to_float || !tt->type_size) {
        fprintf(stderr, "llamacpp_harness: ggml has no to_float for type %d\n", type);
        return 1;
    }
    FILE *f = fopen(in, "rb");
    if (!f) return 1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    size_t blocks = (size_t)size / tt->type_size;
    void *buf = malloc(blocks * tt->type_size + 1);
    float *y = malloc(blocks * (size_t)tt->blck_size * sizeof *y + 1);
    int rc = !buf || !y || fread(buf, tt->type_size, blocks, f) != blocks;
    fclose(f);
    if (!rc) {
        tt->to_float(buf, y, (int64_t)blocks * tt->blck_size);
        FILE *o = fopen(out, "wb");
        rc = !o || fwrite(y, sizeof *y, blocks * (size_t)tt->blck_size, o) != blocks * (size_t)tt->blck_size;
        if (o && fclose(o)) rc = 1;
    }
    free(buf);
    free(y);
    return rc;
}

static int cmd_bench(const char *path, const char *text, int N, int S, int rounds)
{
    if (N < 1 || S < 1 || rounds < 1) return 2;
    struct llama_model *m = load(path);
    if (!m) return 1;
    const struct llama_vocab *v = llama_model_get_vocab(m);
    int vocab = llama_vocab_n_tokens(v);
    int len = (int)strlen(text), cap = len + 8;
    llama_token *prompt = malloc((size_t)cap * sizeof *prompt), *last = malloc((size_t)S * sizeof *last);
    int P = prompt ? llama_tokenize(v, text, len, prompt, cap, true, false) : -1;
    if (P < 1 || !last) {
        fprintf(stderr, "llamacpp_harness: cannot tokenise the prompt\n");
        llama_model_free(m);
        return 1;
    }
    /* Every sequence's prompt in one batch, as llmem run --batch S does. */
    int batch = P * S;
    struct llama_context *c = context(m, (uint32_t)(S * (P + N + 1)), (uint32_t)batch, (uint32_t)S);
    struct llama_batch b = llama_batch_init(batch, 0, 1);
    int rc = !c;
    for (int r = 0; !rc && r < rounds; r++) {
        llama_memory_clear(llama_get_memory(c), true);
        double t0 = now_s();
        b.n_tokens = batch;
        for (int s = 0; s < S; s++)
            for (int i = 0; i < P; i++) {
                int k = s * P + i;
                b.token[k] = prompt[i];
                b.pos[k] = i;
                b.n_seq_id[k] = 1;
                b.seq_id[k][0] = s;
                b.logits[k] = (int8_t)(i == P - 1);
            }
        if ((rc = llama_decode(c, b))) break;
        for (int s = 0; s < S; s++) last[s] = argmax(llama_get_logits_ith(c, s * P + P - 1), vocab);
        double t1 = now_s();
        for (int step = 0; !rc && step < N; step++) {
            b.n_tokens = S;
            for (int s = 0; s < S; s++) {
                b.token[s] = last[s];
                b.pos[s] = P + step;
                b.n_seq_id[s] = 1;
                b.seq_id[s][0] = s;
                b.logits[s] = 1;
            }
            if ((rc = llama_decode(c, b))) break;
            for (int s = 0; s < S; s++) last[s] = argmax(llama_get_logits_ith(c, s), vocab);
        }
        double t2 = now_s();
        if (!rc)
            printf("round %d prompt_tokens %d prefill_tok_s %.3f decode_tok_s %.3f\n", r + 1, P,
                   (double)P * S / (t1 - t0), (double)N * S / (t2 - t1));
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("peak_rss_kb %ld\n", ru.ru_maxrss);
    free(prompt);
    free(last);
    llama_batch_free(b);
    if (c) llama_free(c);
    llama_model_free(m);
    return rc != 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: llamacpp_harness [-t THREADS] [--kv f32|f16] load|tokenize|generate|logits|dequant|bench ...\n"
                    "(see the comment at the top of tests/oracle/llamacpp_harness.c)\n");
    return 2;
}

int main(int argc, char **argv)
{
    int i = 1;
    for (; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-t")) n_threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kv")) kv_type = !strcmp(argv[i + 1], "f16") ? GGML_TYPE_F16 : GGML_TYPE_F32;
        else break;
    }
    if (i >= argc || n_threads < 1) return usage();
    const char *cmd = argv[i];
    char **a = argv + i + 1;
    int n = argc - i - 1;
    backend_init();
    int rc;
    if (!strcmp(cmd, "load") && n == 1) rc = cmd_load(a[0]);
    else if (!strcmp(cmd, "tokenize") && n == 2) rc = cmd_tokenize(a[0], a[1]);
    else if (!strcmp(cmd, "generate") && n >= 3) rc = cmd_generate(a[0], atoi(a[1]), n - 2, a + 2);
    else if (!strcmp(cmd, "logits") && n >= 3) rc = cmd_logits(a[0], a[1], n - 2, a + 2);
    else if (!strcmp(cmd, "dequant") && n == 3) rc = cmd_dequant(atoi(a[0]), a[1], a[2]);
    else if (!strcmp(cmd, "bench") && n == 5) rc = cmd_bench(a[0], a[1], atoi(a[2]), atoi(a[3]), atoi(a[4]));
    else rc = usage();
    llama_backend_free();
    return rc;
}
