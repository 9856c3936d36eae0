/*
 * test_kv.c - the KV cache manager: geometry and options, a shadow-model
 * property test over host and sim-device memory for every strategy, the
 * prefix cache and its LRU eviction, copy-on-write, sliding windows, out of
 * memory in the middle of an append, the STATIC and BUCKETS baselines,
 * truncation, stats, bad input, appends that take no malloc, and a
 * fault-injection campaign under the manager.
 *
 * The content model (tests/support/kv_content.h, shared with the other KV
 * tests): a token's K (or V) bytes in one layer are a function
 * of every token up to and including it (a rolling hash of the prefix), its
 * position, the layer and K-or-V. So, as in a real model, identical
 * prefixes have identical KV, and a block handed out under the wrong prefix
 * reads back wrong. Every byte is written right after the append that made
 * its position (through llmem_kv_seq_token) and, on a sim device, only ever
 * through llmem_resource_copy.
 */
#include "test_util.h"
#include "support/kv_content.h"
#include "support/rng.h"

/* glibc's allocator statistics, for appends_take_no_malloc; meaningless
 * under a sanitizer, whose allocator glibc does not see. */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33)) && !defined(TEST_ASAN) && \
    !defined(TEST_TSAN)
#include <malloc.h>
#define TEST_MALLINFO 1
#endif

enum { MAXS = 16 };

/* ---- the shadow model -------------------------------------------------------- */

typedef struct shseq {
    llmem_kv_seq h;
    size_t length, first, window; /* window rounded up to blocks, as the manager does */
    size_t cap;
    int32_t *tok;                 /* every token since position 0, dropped ones too */
    uint64_t *ph;                 /* prefix hash through each position */
    bool hashable;                /* the manager can register its next full blocks */
    int base;                     /* property test: which shared prompt it follows, -1 none */
    bool ontrack;
    size_t hwm;                   /* CONTIGUOUS: the most tokens it held (what is committed for) */
} shseq;

typedef struct model {
    llmem_kv *kv;
    llmem_resource *dev;          /* the sim device, NULL on the host */
    llmem_resource *fault;        /* fault campaign: counts injected failures */
    llmem_kv_options o;
    llmem_kv_strategy strategy;
    size_t tb, B, bb, max_len;
    uint32_t layers;
    bool prefix;
    bool may_fail;                /* a budget or a fault: creates, appends and forks may be refused */
    bool exact;                   /* nothing ever evicts: prefix matches are predicted exactly */
    shseq s[MAXS];
    size_t n;
    uint64_t hits, misses, preempts;
    uint64_t *keys;               /* prefix hashes of every block the manager registered */
    size_t nkeys, capkeys;
    llmem_kv_seq dead[8];         /* handles of freed sequences */
    size_t ndead;
    unsigned char *scratch;
    unsigned surfaced, absorbed;  /* fault campaign */
    size_t gran, vstride;         /* CONTIGUOUS: the resource's granularity, bytes reserved per layer */
} model;

/* CONTIGUOUS: bytes committed per layer for a sequence that held `hwm`
 * tokens at most: whole granules, never more than the reservation. */
static size_t v_committed(const model *m, size_t hwm)
{
    size_t need = (hwm + m->B - 1) / m->B * m->bb;
    need = (need + m->gran - 1) / m->gran * m->gran;
    return need < m->vstride ? need : m->vstride;
}

static llmem_kv_options geo(llmem_kv_strategy strategy, uint32_t B)
{
    llmem_kv_options o = llmem_kv_options_default();
    o.strategy = strategy;
    o.layers = 2;
    o.kv_heads = 2;
    o.head_dim = 8;
    o.dtype = LLMEM_KV_F16;
    o.block_tokens = B;
    o.max_seq_len = 256;
    return o;
}

static size_t elem_of(llmem_kv_dtype d) { return d == LLMEM_KV_F32 ? 4 : d == LLMEM_KV_I8 ? 1 : 2; }

static void dev_read(const model *m, void *dst, const void *src, size_t n) { test_kv_copy(m->dev, dst, src, n); }

static void m_open(model *m, const llmem_kv_options *o, llmem_resource *dev)
{
    memset(m, 0, sizeof *m);
    m->o = *o;
    if (!m->o.block_tokens) m->o.block_tokens = 16;
    m->dev = dev;
    if (dev) m->o.resource = dev;
    m->strategy = o->strategy;
    m->B = m->o.block_tokens;
    m->layers = o->layers;
    m->max_len = o->max_seq_len;
    m->tb = (size_t)o->kv_heads * o->head_dim * elem_of(o->dtype);
    m->bb = 2 * m->tb * m->B;
    m->prefix = o->prefix_cache;
    m->may_fail = o->budget_bytes != 0;
    m->exact = o->budget_bytes == 0;
    m->scratch = malloc(m->bb);
    m->gran = llmem_resource_granularity(dev ? dev : llmem_resource_default());
    m->vstride = (m->max_len + m->B - 1) / m->B * m->bb;
    m->vstride = (m->vstride + m->gran - 1) / m->gran * m->gran;
    assert_ok(llmem_kv_create(&m->o, &m->kv));
    assert_int_equal(llmem_kv_token_layer_bytes(m->kv), m->tb);
    assert_int_equal(llmem_kv_block_bytes(m->kv), m->bb);
}

static void sh_reserve(shseq *s, size_t n)
{
    if (n <= s->cap) return;
    size_t c = s->cap ? s->cap : 64;
    while (c < n) c *= 2;
    s->tok = realloc(s->tok, c * sizeof *s->tok);
    s->ph = realloc(s->ph, c * sizeof *s->ph);
    assert_non_null(s->tok);
    assert_non_null(s->ph);
    s->cap = c;
}

static void sh_push(shseq *s, const int32_t *t, size_t n)
{
    sh_reserve(s, s->length + n);
    if (n) memcpy(s->tok + s->length, t, n * sizeof *t); /* tok may still be NULL when n is 0 */
    test_kv_chain(s->ph, s->length, t, n);
    s->length += n;
}

static void sh_free(shseq *s)
{
    free(s->tok);
    free(s->ph);
    memset(s, 0, sizeof *s);
}

/* A window sequence holds its last window/B + 1 blocks: the first position
 * held once it is `length` long, given where it started. */
static void sh_slide(const model *m, shseq *s)
{
    if (!s->window) return;
    size_t wb = s->window / m->B + 1, blocks = (s->length + m->B - 1) / m->B;
    if (blocks > wb && (blocks - wb) * m->B > s->first) s->first = (blocks - wb) * m->B;
}

static bool key_known(const model *m, uint64_t k)
{
    for (size_t i = 0; i < m->nkeys; i++)
        if (m->keys[i] == k) return true;
    return false;
}

static void key_add(model *m, uint64_t k)
{
    if (key_known(m, k)) return;
    if (m->nkeys == m->capkeys) {
        m->capkeys = m->capkeys ? m->capkeys * 2 : 256;
        m->keys = realloc(m->keys, m->capkeys * sizeof *m->keys);
        assert_non_null(m->keys);
    }
    m->keys[m->nkeys++] = k;
}

/* Write K and V of positions [from, to) of every layer, as an engine does
 * right after the append. */
static void write_positions(model *m, const shseq *s, size_t from, size_t to)
{
    if (from < s->first) from = s->first;
    test_kv_write(m->kv, m->dev, s->h, s->ph, from, to, m->layers);
}

static void expect_bytes(const model *m, const shseq *s, const unsigned char *got, size_t p, uint32_t l, int which,
                         const char *via)
{
    test_kv_expect(got, m->tb, s->ph[p], p, l, which, "sequence 0x%llx (length %zu, first %zu, read through %s)",
                   (unsigned long long)s->h, s->length, s->first, via);
}

typedef struct blkref {
    uintptr_t k0;  /* layer 0 K base: the block's identity */
    size_t held;   /* positions this holder has in it */
} blkref;

static int by_k0(const void *a, const void *b)
{
    const blkref *x = a, *y = b;
    return x->k0 < y->k0 ? -1 : x->k0 > y->k0;
}

/* Everything the manager says about one sequence matches the shadow. */
static void verify_seq(model *m, const shseq *s, blkref *refs, size_t *nrefs, size_t *capacity)
{
    size_t B = m->B;
    llmem_kv_seq_info in;
    memset(&in, 0xff, sizeof in);
    assert_ok(llmem_kv_seq_get_info(m->kv, s->h, &in));
    assert_int_equal(in.length, s->length);
    assert_int_equal(in.first, s->first);
    assert_int_equal(in.window, s->window);
    size_t nb = s->length > s->first ? (s->length + B - 1) / B - s->first / B : 0;
    assert_int_equal(in.blocks, nb);
    if (s->window) assert_true(s->length - s->first <= s->window + B);
    if (m->strategy == LLMEM_KV_PAGED) {
        assert_int_equal(in.capacity, (s->first / B + nb) * B);
    } else if (m->strategy == LLMEM_KV_STATIC) {
        assert_int_equal(in.capacity, m->max_len);
    } else if (m->strategy == LLMEM_KV_CONTIGUOUS) { /* what its committed granules hold */
        size_t cap = v_committed(m, s->hwm) / m->bb * m->B;
        assert_int_equal(in.capacity, cap < m->max_len ? cap : m->max_len);
        assert_true(in.capacity >= s->length);
    } else if (in.capacity) { /* BUCKETS: a class, B * 2^c or max_seq_len */
        assert_true(in.capacity >= s->length && in.capacity <= m->max_len);
        size_t c = B;
        while (c < in.capacity) c *= 2;
        assert_true(c == in.capacity || in.capacity == m->max_len);
    } else {
        assert_int_equal(s->length, 0);
    }
    *capacity = in.capacity;

    void **kp = malloc((nb + 2) * sizeof *kp), **vp = malloc((nb + 2) * sizeof *vp);
    assert_non_null(kp);
    assert_non_null(vp);
    for (uint32_t l = 0; l < m->layers; l++) {
        for (size_t i = 0; i < nb + 2; i++) kp[i] = vp[i] = (void *)(uintptr_t)0x5a5a;
        size_t n = 12345;
        assert_ok(llmem_kv_seq_table(m->kv, s->h, l, kp, vp, nb + 2, &n));
        assert_int_equal(n, nb);
        assert_true(kp[nb] == (void *)(uintptr_t)0x5a5a && vp[nb + 1] == (void *)(uintptr_t)0x5a5a);
        for (size_t i = 0; i < nb; i++) {
            assert_ptr_equal(vp[i], (char *)kp[i] + B * m->tb); /* K for the block's tokens, then V */
            if (m->dev) assert_true(llmem_sim_resource_contains(m->dev, kp[i], m->bb));
            dev_read(m, m->scratch, kp[i], m->bb);
            size_t start = (s->first / B + i) * B, end = start + B < s->length ? start + B : s->length;
            for (size_t p = start; p < end; p++) {
                expect_bytes(m, s, m->scratch + (p % B) * m->tb, p, l, 0, "the table");
                expect_bytes(m, s, m->scratch + (B + p % B) * m->tb, p, l, 1, "the table");
            }
            if (l == 0 && refs) refs[(*nrefs)++] = (blkref){(uintptr_t)kp[i], end - start};
        }
        /* Every held position through seq_token: the same addresses. */
        size_t sample = s->length > s->first ? s->first + (s->length * 7 + l) % (s->length - s->first) : 0;
        for (size_t p = s->first; p < s->length; p++) {
            void *k = NULL, *v = NULL;
            assert_ok(llmem_kv_seq_token(m->kv, s->h, l, p, &k, &v));
            size_t i = p / B - s->first / B;
            assert_ptr_equal(k, (char *)kp[i] + (p % B) * m->tb);
            assert_ptr_equal(v, (char *)vp[i] + (p % B) * m->tb);
            if (!m->dev || p == sample) {
                unsigned char got[512];
                dev_read(m, got, k, m->tb);
                expect_bytes(m, s, got, p, l, 0, "seq_token");
                dev_read(m, got, v, m->tb);
                expect_bytes(m, s, got, p, l, 1, "seq_token");
            }
        }
        /* Positions outside [first, length) are refused. */
        void *k = (void *)1;
        assert_status(llmem_kv_seq_token(m->kv, s->h, l, s->length, &k, NULL), LLMEM_ERANGE);
        assert_status(llmem_kv_seq_token(m->kv, s->h, l, s->length + B + 3, NULL, &k), LLMEM_ERANGE);
        if (s->first) {
            assert_status(llmem_kv_seq_token(m->kv, s->h, l, s->first - 1, &k, &k), LLMEM_ERANGE);
            assert_status(llmem_kv_seq_token(m->kv, s->h, l, 0, &k, &k), LLMEM_ERANGE);
        }
    }
    free(kp);
    free(vp);
}

/* Verify every live sequence, the invariants and the stats. */
static void m_verify(model *m)
{
    size_t total_blocks = 0;
    for (size_t i = 0; i < m->n; i++)
        total_blocks += m->s[i].length > m->s[i].first ? (m->s[i].length + m->B - 1) / m->B - m->s[i].first / m->B : 0;
    blkref *refs = malloc((total_blocks + 1) * sizeof *refs);
    size_t nrefs = 0;
    uint64_t written = 0, buf_blocks = 0;
    for (size_t i = 0; i < m->n; i++) {
        size_t cap = 0;
        verify_seq(m, &m->s[i], refs, &nrefs, &cap);
        written += m->s[i].length - m->s[i].first;
        buf_blocks += (cap + m->B - 1) / m->B;
    }
    assert_ok(llmem_kv_check(m->kv));
    llmem_kv_stats st = test_kv_stats(m->kv);
    assert_int_equal(st.struct_size, sizeof st);
    assert_int_equal(st.sequences, m->n);
    assert_int_equal(st.prefix_hit_tokens_total, m->hits);
    assert_int_equal(st.prefix_miss_tokens_total, m->misses);
    assert_int_equal(st.preemptions_total, m->preempts);
    assert_true(st.bytes_reserved <= st.bytes_reserved_peak);
    if (m->o.budget_bytes) assert_true(st.bytes_reserved <= m->o.budget_bytes);
    size_t bpt = 2 * m->tb * m->layers;
    assert_int_equal(st.tokens_reserved, st.bytes_reserved / bpt);
    if (m->strategy == LLMEM_KV_PAGED) {
        /* Distinct blocks held, and the positions held in each. */
        qsort(refs, nrefs, sizeof *refs, by_k0);
        uint64_t distinct = 0, slots = 0;
        for (size_t i = 0; i < nrefs;) {
            size_t j = i, most = 0;
            for (; j < nrefs && refs[j].k0 == refs[i].k0; j++)
                if (refs[j].held > most) most = refs[j].held;
            distinct++;
            slots += most;
            i = j;
        }
        assert_int_equal(st.blocks_used, distinct);
        assert_int_equal(st.tokens_written, slots);
        assert_int_equal(st.blocks_used + st.blocks_cached + st.blocks_free, st.blocks_total);
        assert_int_equal(st.tokens_reserved, st.blocks_total * m->B);
        assert_int_equal(st.bytes_reserved, st.blocks_total * m->bb * m->layers);
        if (!m->prefix) assert_int_equal(st.blocks_cached, 0);
        if (m->exact) assert_int_equal(st.evictions_total, 0);
        assert_true(st.tokens_written <= st.tokens_reserved);
    } else {
        assert_int_equal(st.tokens_written, written);
        assert_int_equal(st.cow_copies_total, 0);
        assert_int_equal(st.blocks_cached, 0);
        assert_int_equal(st.blocks_used, buf_blocks); /* the buffers sequences hold; idle ones are free */
        assert_int_equal(st.blocks_used + st.blocks_free, st.blocks_total);
        size_t per_static = (m->max_len + m->B - 1) / m->B * m->bb * m->layers;
        if (m->strategy == LLMEM_KV_CONTIGUOUS) { /* committed granules, all layers */
            size_t want = 0;
            for (size_t i = 0; i < m->n; i++) want += v_committed(m, m->s[i].hwm) * m->layers;
            assert_int_equal(st.bytes_reserved, want);
            assert_true(st.blocks_total * m->bb * m->layers <= st.bytes_reserved);
        } else {
            assert_int_equal(st.bytes_reserved, st.blocks_total * m->bb * m->layers);
        }
        if (m->strategy == LLMEM_KV_STATIC) assert_int_equal(st.bytes_reserved, m->n * per_static);
        else assert_true(st.bytes_reserved >= written * bpt);
    }
    for (size_t i = 0; i < m->ndead; i++) {
        llmem_kv_seq_info in;
        assert_status(llmem_kv_seq_get_info(m->kv, m->dead[i], &in), LLMEM_EINVAL);
    }
    free(refs);
}

/* Counting injected faults around one manager call (fault campaign). */
static uint64_t injected_now(const model *m)
{
    if (!m->fault) return 0;
    llmem_fault_stats fs;
    memset(&fs, 0, sizeof fs);
    assert_ok(llmem_fault_resource_get_stats(m->fault, &fs));
    return fs.injected_total;
}

static void account(model *m, uint64_t inj_before, llmem_status st)
{
    if (!m->fault || injected_now(m) == inj_before) return;
    if (st == LLMEM_OK) m->absorbed++;
    else if (st == LLMEM_ENOMEM) m->surfaced++;
    else fail_msg("an injected failure surfaced as %s: %s", llmem_status_name(st), llmem_error_message());
}

/* Refusals for memory are allowed only where the model allows them. */
static bool refused(model *m, llmem_status st, const char *what)
{
    if (st == LLMEM_OK) return false;
    if (st == LLMEM_ENOMEM && m->may_fail) {
        m->preempts++;
        return true;
    }
    fail_msg("%s -> %s: %s", what, llmem_status_name(st), llmem_error_message());
    return true;
}

static size_t m_create(model *m, size_t window)
{
    assert_true(m->n < MAXS);
    llmem_kv_seq h = 77;
    uint64_t inj = injected_now(m);
    llmem_status st = llmem_kv_seq_create(m->kv, window, &h);
    account(m, inj, st);
    if (refused(m, st, "seq_create")) {
        assert_int_equal(h, 0);
        return SIZE_MAX;
    }
    assert_true(h != 0);
    shseq *s = &m->s[m->n];
    memset(s, 0, sizeof *s);
    s->h = h;
    s->window = (window + m->B - 1) / m->B * m->B;
    s->hashable = true;
    s->base = -1;
    return m->n++;
}

/* What match_prefix must find: the longest run of registered full blocks. */
static size_t predict_match(const model *m, const shseq *s, const int32_t *t, size_t n)
{
    if (!m->prefix) return 0;
    size_t full = n / m->B;
    if (!s->window && full > m->max_len / m->B) full = m->max_len / m->B;
    uint64_t ph = 0;
    size_t k = 0;
    for (size_t p = 0; k < full; p++) {
        ph = test_prefix_step(ph, t[p], p);
        if (p % m->B == m->B - 1) {
            if (!key_known(m, ph)) break;
            k++;
        }
    }
    return k * m->B;
}

static size_t m_match(model *m, size_t i, const int32_t *t, size_t n)
{
    shseq *s = &m->s[i];
    assert_int_equal(s->length, 0);
    size_t want = predict_match(m, s, t, n), got = 999;
    assert_ok(llmem_kv_seq_match_prefix(m->kv, s->h, t, n, &got));
    if (m->exact) assert_int_equal(got, want);
    else assert_true(got <= want);
    assert_int_equal(got % m->B, 0);
    if (m->prefix) {
        m->hits += got;
        m->misses += n - got;
    }
    sh_push(s, t, got);
    sh_slide(m, s);
    return got;
}

/* The layer 0 K base of the block holding position p (PAGED), NULL if none. */
static void *block_of(const model *m, const shseq *s, size_t p)
{
    if (p < s->first || p >= s->length) return NULL;
    void *k = NULL;
    assert_ok(llmem_kv_seq_token(m->kv, s->h, 0, p, &k, NULL));
    return (char *)k - (p % m->B) * m->tb;
}

/* Append n tokens (their ids in t; passed to the manager only if pass),
 * then write their K and V. */
static llmem_status m_append(model *m, size_t i, size_t n, const int32_t *t, bool pass)
{
    shseq *s = &m->s[i];
    size_t L = s->length;
    bool range = !s->window && L + n > m->max_len;
    bool shared = false;
    if (m->strategy == LLMEM_KV_PAGED && L % m->B && n) {
        void *last = block_of(m, s, L - 1);
        for (size_t j = 0; j < m->n && last; j++)
            if (j != i && block_of(m, &m->s[j], L - 1) == last) shared = true;
    }
    llmem_kv_stats before = test_kv_stats(m->kv);
    size_t fp = 4242;
    uint64_t inj = injected_now(m);
    llmem_status st = llmem_kv_seq_append(m->kv, s->h, n, pass ? t : NULL, &fp);
    account(m, inj, st);
    if (range) {
        assert_status(st, LLMEM_ERANGE);
        return st;
    }
    if (refused(m, st, "seq_append")) {
        assert_int_equal(test_kv_stats(m->kv).preemptions_total, before.preemptions_total + 1);
        return st;
    }
    assert_int_equal(fp, L);
    if (L + n > s->hwm) s->hwm = L + n;
    sh_push(s, t, n);
    sh_slide(m, s);
    if (pass && m->prefix && s->hashable)
        for (size_t p = L; p < L + n; p++)
            if (p % m->B == m->B - 1 && p + 1 - m->B >= s->first) key_add(m, s->ph[p]);
    if (!pass) s->hashable = false;
    llmem_kv_stats after = test_kv_stats(m->kv);
    if (shared) assert_int_equal(after.cow_copies_total, before.cow_copies_total + 1);
    else assert_true(after.cow_copies_total <= before.cow_copies_total + 1);
    write_positions(m, s, L, L + n);
    return LLMEM_OK;
}

static size_t m_fork(model *m, size_t i)
{
    assert_true(m->n < MAXS);
    llmem_kv_seq h = 77;
    uint64_t inj = injected_now(m);
    llmem_status st = llmem_kv_seq_fork(m->kv, m->s[i].h, &h);
    account(m, inj, st);
    if (refused(m, st, "seq_fork")) {
        assert_int_equal(h, 0);
        return SIZE_MAX;
    }
    shseq *c = &m->s[m->n], *p = &m->s[i];
    *c = *p;
    c->h = h;
    c->hwm = p->length; /* a fork commits for what it copies */
    c->tok = NULL;
    c->ph = NULL;
    c->cap = 0;
    sh_reserve(c, p->length + 1);
    if (p->length) {
        memcpy(c->tok, p->tok, p->length * sizeof *c->tok);
        memcpy(c->ph, p->ph, p->length * sizeof *c->ph);
    }
    return m->n++;
}

static llmem_status m_truncate(model *m, size_t i, size_t len)
{
    shseq *s = &m->s[i];
    llmem_status st = llmem_kv_seq_truncate(m->kv, s->h, len);
    if (len > s->length || len < s->first) {
        assert_status(st, LLMEM_ERANGE);
        return st;
    }
    assert_ok(st);
    if (len < s->length) s->hashable = false;
    if (len == 0) s->hashable = true;
    s->length = len;
    return st;
}

static void m_free(model *m, size_t i)
{
    assert_ok(llmem_kv_seq_free(m->kv, m->s[i].h));
    if (m->ndead < 8) m->dead[m->ndead++] = m->s[i].h;
    else m->dead[m->s[i].h % 8] = m->s[i].h;
    sh_free(&m->s[i]);
    m->s[i] = m->s[--m->n];
    memset(&m->s[m->n], 0, sizeof m->s[m->n]);
}

static void m_close(model *m)
{
    m_verify(m);
    while (m->n) m_free(m, m->n - 1);
    llmem_kv_stats st = test_kv_stats(m->kv);
    assert_int_equal(st.sequences, 0);
    assert_int_equal(st.blocks_used, 0);
    assert_int_equal(st.tokens_written, 0);
    assert_ok(llmem_kv_check(m->kv));
    llmem_kv_destroy(m->kv);
    free(m->keys);
    free(m->scratch);
    memset(m, 0, sizeof *m);
}

/* Shorthand: n tokens from a counter, appended and written. */
static void fill_tokens(int32_t *t, size_t n, int32_t start)
{
    for (size_t i = 0; i < n; i++) t[i] = start + (int32_t)i;
}

/* ---- geometry and options ---------------------------------------------------- */

static void geometry(void **state)
{
    (void)state;
    static const struct {
        llmem_kv_dtype dtype;
        size_t elem;
        uint32_t layers, heads, dim, B;
    } cases[] = {
        {LLMEM_KV_F16, 2, 32, 32, 128, 16}, /* Llama-2-7B: 512 KiB per token */
        {LLMEM_KV_F16, 2, 32, 8, 128, 16},  /* Llama-3-8B (GQA): 128 KiB per token */
        {LLMEM_KV_F32, 4, 2, 1, 64, 8},
        {LLMEM_KV_BF16, 2, 3, 4, 96, 32},
        {LLMEM_KV_I8, 1, 5, 3, 7, 5},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        llmem_kv_options o = llmem_kv_options_default();
        o.dtype = cases[c].dtype;
        o.layers = cases[c].layers;
        o.kv_heads = cases[c].heads;
        o.head_dim = cases[c].dim;
        o.block_tokens = cases[c].B;
        o.max_seq_len = 4096;
        llmem_kv *kv;
        assert_ok(llmem_kv_create(&o, &kv));
        size_t tb = (size_t)cases[c].heads * cases[c].dim * cases[c].elem;
        assert_int_equal(llmem_kv_token_layer_bytes(kv), tb);
        assert_int_equal(llmem_kv_block_bytes(kv), 2 * tb * cases[c].B);
        assert_int_equal(llmem_kv_token_total_bytes(kv), 2 * tb * cases[c].layers);
        llmem_kv_stats st = test_kv_stats(kv);
        assert_int_equal(st.bytes_reserved, 0); /* nothing taken before the first token */
        assert_int_equal(st.blocks_total, 0);
        llmem_kv_destroy(kv);
    }
    /* The published figures for two real models. */
    llmem_kv_options o = llmem_kv_options_default();
    o.layers = 32;
    o.kv_heads = 32;
    o.head_dim = 128;
    o.max_seq_len = 4096;
    llmem_kv *kv;
    assert_ok(llmem_kv_create(&o, &kv));
    assert_int_equal(llmem_kv_token_total_bytes(kv), 512 * 1024);
    assert_int_equal(llmem_kv_block_bytes(kv), 16 * 2 * 8192); /* default 16 tokens per block */
    llmem_kv_destroy(kv);
    o.kv_heads = 8;
    assert_ok(llmem_kv_create(&o, &kv));
    assert_int_equal(llmem_kv_token_total_bytes(kv), 128 * 1024);
    llmem_kv_destroy(kv);
    /* NULL asks nothing. */
    assert_int_equal(llmem_kv_token_layer_bytes(NULL), 0);
    assert_int_equal(llmem_kv_block_bytes(NULL), 0);
    assert_int_equal(llmem_kv_token_total_bytes(NULL), 0);
    /* Defaults. */
    llmem_kv_options d = llmem_kv_options_default();
    assert_int_equal(d.strategy, LLMEM_KV_PAGED);
    assert_int_equal(d.dtype, LLMEM_KV_F16);
    assert_int_equal(d.block_tokens, 16);
    assert_false(d.prefix_cache);
    d.layers = d.kv_heads = d.head_dim = 1;
    d.max_seq_len = 10;
    d.block_tokens = 0; /* 0 means the default too */
    assert_ok(llmem_kv_create(&d, &kv));
    assert_int_equal(llmem_kv_block_bytes(kv), 16 * 2 * 2);
    llmem_kv_destroy(kv);
}

/* A PAGED budget below one slab could never hold a token: refused at
 * create, naming the minimum; exactly one slab holds one. */
static void paged_budget_below_one_slab_is_refused(void **state)
{
    (void)state;
    llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
    llmem_kv *kv;
    assert_ok(llmem_kv_create(&o, &kv));
    size_t bb = llmem_kv_block_bytes(kv);
    llmem_kv_destroy(kv);
    size_t slab = 2 * bb < ((size_t)64 << 10) ? (size_t)64 << 10 : 2 * bb; /* the default slab */
    size_t slab_all = slab / bb * bb * o.layers;
    char want[64];
    snprintf(want, sizeof want, "give at least %zu", slab_all);
    size_t budgets[] = {1, bb, slab_all - 1};
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        o.budget_bytes = budgets[i];
        kv = (llmem_kv *)1;
        assert_status(llmem_kv_create(&o, &kv), LLMEM_EINVAL);
        assert_null(kv);
        assert_error_mentions("below one slab");
        assert_error_mentions(want);
    }
    o.budget_bytes = slab_all;
    assert_ok(llmem_kv_create(&o, &kv));
    llmem_kv_seq s;
    assert_ok(llmem_kv_seq_create(kv, 0, &s));
    int32_t tok = 5;
    assert_ok(llmem_kv_seq_append(kv, s, 1, &tok, NULL));
    llmem_kv_destroy(kv);
    /* A smaller slab lowers the minimum. */
    o.slab_bytes = bb;
    o.budget_bytes = bb * o.layers;
    assert_ok(llmem_kv_create(&o, &kv));
    llmem_kv_destroy(kv);
}

static void create_rejects_bad_options(void **state)
{
    (void)state;
    llmem_kv *kv = (llmem_kv *)(uintptr_t)1;
    llmem_kv_options good = geo(LLMEM_KV_PAGED, 16);
    assert_status(llmem_kv_create(NULL, &kv), LLMEM_EINVAL);
    assert_null(kv);
    assert_status(llmem_kv_create(&good, NULL), LLMEM_EINVAL);
    for (int f = 0; f < 4; f++) {
        llmem_kv_options o = good;
        if (f == 0) o.layers = 0;
        if (f == 1) o.kv_heads = 0;
        if (f == 2) o.head_dim = 0;
        if (f == 3) o.max_seq_len = 0;
        kv = (llmem_kv *)(uintptr_t)1;
        assert_status(llmem_kv_create(&o, &kv), LLMEM_EINVAL);
        assert_null(kv);
    }
    llmem_kv_options o = good;
    o.strategy = (llmem_kv_strategy)(LLMEM_KV_CONTIGUOUS + 1);
    assert_status(llmem_kv_create(&o, &kv), LLMEM_EINVAL);
    o.strategy = (llmem_kv_strategy)-1;
    assert_status(llmem_kv_create(&o, &kv), LLMEM_EINVAL);
    o = good;
    o.dtype = (llmem_kv_dtype)4;
    assert_status(llmem_kv_create(&o, &kv), LLMEM_EINVAL);
    /* Sizes that overflow: a token, a block, a whole sequence over all layers. */
    o = good;
    o.kv_heads = UINT32_MAX;
    o.head_dim = UINT32_MAX;
    o.dtype = LLMEM_KV_F32;
    assert_status(llmem_kv_create(&o, &kv), LLMEM_EOVERFLOW);
    o = good;
    o.kv_heads = 1u << 20;
    o.head_dim = 1u << 20;
    o.block_tokens = UINT32_MAX;
    assert_status(llmem_kv_create(&o, &kv), LLMEM_EOVERFLOW);
    o = good;
    o.layers = UINT32_MAX;
    o.max_seq_len = UINT32_MAX;
    o.kv_heads = 1024;
    o.head_dim = 1024;
    assert_status(llmem_kv_create(&o, &kv), LLMEM_EOVERFLOW);
    assert_null(kv);
    /* The prefix cache and windows are PAGED only. */
    for (int s = LLMEM_KV_STATIC; s <= LLMEM_KV_CONTIGUOUS; s++) {
        o = geo((llmem_kv_strategy)s, 16);
        o.prefix_cache = true;
        assert_status(llmem_kv_create(&o, &kv), LLMEM_ENOTSUP);
        o.prefix_cache = false;
        assert_ok(llmem_kv_create(&o, &kv));
        llmem_kv_seq h = 5;
        assert_status(llmem_kv_seq_create(kv, 32, &h), LLMEM_ENOTSUP);
        assert_int_equal(h, 0);
        assert_int_equal(test_kv_stats(kv).sequences, 0);
        assert_ok(llmem_kv_seq_create(kv, 0, &h));
        assert_ok(llmem_kv_seq_free(kv, h));
        llmem_kv_destroy(kv);
    }
}

/* ---- the property test ------------------------------------------------------- */

typedef struct prop_cfg {
    const char *name;
    llmem_kv_strategy strategy;
    bool prefix, windows;
    size_t budget_blocks; /* 0 = none */
    int ops;
} prop_cfg;

enum { NPROMPTS = 4, PROMPT_LEN = 72 };

/* Random operations on up to MAXS sequences, everything verified after each. */
static void property_run(const prop_cfg *c, llmem_resource *dev, uint64_t seed)
{
    uint64_t r = seed * 0x9e3779b97f4a7c15ull + 0x1234567;
    static const llmem_kv_dtype dtypes[] = {LLMEM_KV_F16, LLMEM_KV_F32, LLMEM_KV_BF16, LLMEM_KV_I8};
    llmem_kv_options o = llmem_kv_options_default();
    o.name = c->name;
    o.strategy = c->strategy;
    o.layers = 2 + (uint32_t)(seed % 2);
    o.kv_heads = 1 + (uint32_t)(seed % 2);
    o.head_dim = 4 + 4 * (uint32_t)(seed % 3 == 1);
    o.dtype = dtypes[seed % 4];
    o.block_tokens = seed % 3 == 2 ? 5 : 4; /* 5: not a power of two */
    o.max_seq_len = 11 * o.block_tokens + 3;  /* not a whole number of blocks */
    o.prefix_cache = c->prefix;
    size_t bb = 2 * (size_t)o.kv_heads * o.head_dim * elem_of(o.dtype) * o.block_tokens;
    o.slab_bytes = 6 * bb;
    o.budget_bytes = c->budget_blocks * bb * o.layers;
    model m;
    m_open(&m, &o, dev);
    size_t B = m.B;
    /* Prompts 1 and 2 repeat prompt 0's blocks under other prefixes: one
     * shifted by a block, one with only its first block changed, so a cache
     * that matched blocks by their tokens alone would hand out wrong KV. */
    int32_t prompts[NPROMPTS][PROMPT_LEN + 8];
    for (int p = 0; p < NPROMPTS; p++)
        for (int i = 0; i < PROMPT_LEN + 8; i++) prompts[p][i] = (int32_t)(1 + test_rng_next(&r) % 5000);
    for (size_t i = 0; i < PROMPT_LEN; i++) prompts[1][i] = prompts[0][i + B];
    for (size_t i = B; i < PROMPT_LEN; i++) prompts[2][i] = prompts[0][i];
    int32_t t[64];
    for (int op = 0; op < c->ops; op++) {
        uint64_t x = test_rng_next(&r) % 100;
        size_t i = m.n ? (size_t)(test_rng_next(&r) % m.n) : 0;
        if (m.n == 0 || (x < 14 && m.n < MAXS)) {
            /* A new request: maybe a window, maybe a prompt from the cache. */
            size_t w = 0;
            if (c->windows && test_rng_next(&r) % 3 == 0) w = 1 + (size_t)(test_rng_next(&r) % (3 * B));
            size_t j = m_create(&m, w);
            if (j == SIZE_MAX) continue;
            m.s[j].base = (int)(test_rng_next(&r) % (NPROMPTS + 1)) - 1;
            m.s[j].ontrack = m.s[j].base >= 0;
            if (m.s[j].base >= 0 && test_rng_next(&r) % 3) {
                size_t plen = 1 + (size_t)(test_rng_next(&r) % (PROMPT_LEN - 1));
                size_t got = m_match(&m, j, prompts[m.s[j].base], plen);
                m_verify(&m);
                if (got < plen && (m.s[j].window || got + (plen - got) <= m.max_len))
                    m_append(&m, j, plen - got, prompts[m.s[j].base] + got, true);
            }
        } else if (x < 55) {
            shseq *s = &m.s[i];
            size_t n = test_rng_next(&r) % 8 == 0 ? 1 + (size_t)(test_rng_next(&r) % 40)
                                                  : 1 + (size_t)(test_rng_next(&r) % 9);
            if (s->window && s->length > 400) continue;
            if (!s->window && s->length >= m.max_len && test_rng_next(&r) % 4) continue;
            if (s->ontrack && test_rng_next(&r) % 5 == 0) s->ontrack = false;
            for (size_t k = 0; k < n; k++) {
                size_t p = s->length + k;
                t[k] = s->ontrack && p < PROMPT_LEN ? prompts[s->base][p] : (int32_t)(1 + test_rng_next(&r) % 5000);
            }
            m_append(&m, i, n, t, test_rng_next(&r) % 6 != 0);
        } else if (x < 66 && m.n < MAXS) {
            m_fork(&m, i);
        } else if (x < 76) {
            shseq *s = &m.s[i];
            uint64_t y = test_rng_next(&r) % 10;
            size_t len = y == 0 ? s->length + 1 + (size_t)(test_rng_next(&r) % 5)
                       : y == 1 && s->first ? s->first - 1 - (size_t)(test_rng_next(&r) % s->first)
                       : s->first + (size_t)(test_rng_next(&r) % (s->length - s->first + 1));
            m_truncate(&m, i, len);
        } else if (x < 92) {
            m_free(&m, i);
        } else if (x < 94) {
            llmem_kv_trim(m.kv, false);
        } else if (x < 96) {
            /* Matching a sequence that holds tokens is refused, and changes nothing. */
            shseq *s = &m.s[i];
            size_t got = 7;
            if (s->length) {
                assert_status(llmem_kv_seq_match_prefix(m.kv, s->h, prompts[0], 16, &got), LLMEM_ESTATE);
                assert_int_equal(got, 0);
            }
        } else if (m.ndead) {
            llmem_kv_seq d = m.dead[test_rng_next(&r) % m.ndead];
            void *k;
            assert_status(llmem_kv_seq_append(m.kv, d, 1, NULL, NULL), LLMEM_EINVAL);
            assert_status(llmem_kv_seq_token(m.kv, d, 0, 0, &k, NULL), LLMEM_EINVAL);
            assert_status(llmem_kv_seq_free(m.kv, d), LLMEM_EINVAL);
        }
        m_verify(&m);
    }
    m_close(&m);
}

static const prop_cfg prop_cfgs[] = {
    {"paged-prefix", LLMEM_KV_PAGED, true, true, 0, 300},
    {"paged-budget", LLMEM_KV_PAGED, true, true, 40, 300},
    {"paged-plain", LLMEM_KV_PAGED, false, true, 0, 200},
    {"paged-tight", LLMEM_KV_PAGED, false, true, 24, 200},
    {"static", LLMEM_KV_STATIC, false, false, 0, 150},
    {"static-budget", LLMEM_KV_STATIC, false, false, 60, 150},
    {"buckets", LLMEM_KV_BUCKETS, false, false, 0, 150},
    {"buckets-budget", LLMEM_KV_BUCKETS, false, false, 50, 150},
    {"contiguous", LLMEM_KV_CONTIGUOUS, false, false, 0, 150},
    {"contiguous-budget", LLMEM_KV_CONTIGUOUS, false, false, 60, 150},
};

static void property_host(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof prop_cfgs / sizeof prop_cfgs[0]; c++)
        for (uint64_t seed = 1; seed <= 3; seed++) property_run(&prop_cfgs[c], NULL, seed + 10 * c);
}

static void property_sim_device(void **state)
{
    (void)state;
    llmem_sim_options so = llmem_sim_options_default();
    so.capacity = (size_t)1 << 30;
    so.fill = 0xa5; /* fresh device memory is not zero: unwritten slots show */
    llmem_resource *sim;
    assert_ok(llmem_sim_resource_create(&so, &sim));
    for (size_t c = 0; c < sizeof prop_cfgs / sizeof prop_cfgs[0]; c++) {
        prop_cfg pc = prop_cfgs[c];
        pc.ops = pc.ops / 2;
        property_run(&pc, sim, 100 + c);
    }
    test_sim_expect_clean(sim);
    llmem_resource_destroy(sim);
}

/* ---- the prefix cache -------------------------------------------------------- */

/* The tokens of t[0..n) a new sequence finds in kv's prefix cache (the
 * sequence made for the match and freed). */
static size_t probe_prefix(llmem_kv *kv, const int32_t *t, size_t n)
{
    llmem_kv_seq s;
    size_t matched = 0;
    assert_ok(llmem_kv_seq_create(kv, 0, &s));
    assert_ok(llmem_kv_seq_match_prefix(kv, s, t, n, &matched));
    assert_ok(llmem_kv_seq_free(kv, s));
    return matched;
}

/* Rollback (undoing an append nobody wrote) against truncate (keeping
 * what was written): a block the undone append filled leaves the prefix
 * cache, whether the rollback drops it or keeps it partial; truncate keeps
 * it registered. And the room figures admission reads. */
static void rollback_forgets_what_truncate_keeps(void **state)
{
    (void)state;
    llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
    o.prefix_cache = true;
    o.budget_bytes = 1 << 20;
    llmem_kv *kv;
    assert_ok(llmem_kv_create(&o, &kv));
    int32_t t[40];
    fill_tokens(t, 40, 77);
    size_t matched;
    llmem_kv_seq a, b;
    /* truncate: the filled block stays cached, so it is found */
    assert_ok(llmem_kv_seq_create(kv, 0, &a));
    assert_ok(llmem_kv_seq_append(kv, a, 20, t, NULL));
    assert_ok(llmem_kv_seq_truncate(kv, a, 10));
    assert_int_equal(probe_prefix(kv, t, 17), 16);
    assert_ok(llmem_kv_seq_free(kv, a));
    assert_int_equal(llmem_kv_trim(kv, true) > 0, 1); /* the cache forgets it */
    /* rollback inside the block: kept partial, no longer registered */
    assert_ok(llmem_kv_seq_create(kv, 0, &a));
    assert_ok(llmem_kv_seq_append(kv, a, 20, t, NULL));
    assert_ok(llmem_kv_seq_rollback(kv, a, 10));
    assert_int_equal(probe_prefix(kv, t, 17), 0);
    /* rollback to empty: dropped and unregistered */
    assert_ok(llmem_kv_seq_rollback(kv, a, 0));
    assert_ok(llmem_kv_seq_append(kv, a, 33, t, NULL)); /* hashable again from 0 */
    assert_ok(llmem_kv_seq_rollback(kv, a, 0));
    assert_ok(llmem_kv_seq_create(kv, 0, &b));
    assert_ok(llmem_kv_seq_match_prefix(kv, b, t, 33, &matched));
    assert_int_equal(matched, 0);
    /* A shared block (a fork) keeps its registration: the other holder wrote it. */
    assert_ok(llmem_kv_seq_append(kv, b, 16, t, NULL));
    llmem_kv_seq c, d;
    assert_ok(llmem_kv_seq_fork(kv, b, &c));
    assert_ok(llmem_kv_seq_rollback(kv, c, 0));
    assert_ok(llmem_kv_seq_create(kv, 0, &d));
    assert_ok(llmem_kv_seq_match_prefix(kv, d, t, 17, &matched));
    assert_int_equal(matched, 16);
    /* The room: what the stats say, without their walk. */
    llmem_kv_room r;
    assert_ok(llmem_kv_get_room(kv, &r));
    llmem_kv_stats ks = test_kv_stats(kv);
    assert_int_equal(r.used_blocks, ks.blocks_used);
    assert_int_equal(r.free_blocks, ks.blocks_free);
    assert_int_equal(r.cached_blocks, ks.blocks_cached);
    assert_int_equal(r.reserved_bytes, ks.bytes_reserved);
    assert_int_equal(r.budget_bytes, 1 << 20);
    assert_int_equal(r.block_tokens, 16);
    assert_true(r.prefix_cache && !r.can_swap);
    assert_int_equal(r.block_bytes_all_layers, llmem_kv_block_bytes(kv) * 2);
    assert_status(llmem_kv_get_room(NULL, &r), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_rollback(NULL, a, 0), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_rollback(kv, a, 5), LLMEM_ERANGE);
    llmem_kv_destroy(kv);
}

static void prefix_cache_hits_and_misses(void **state)
{
    (void)state;
    llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
    o.prefix_cache = true;
    model m;
    m_open(&m, &o, NULL);
    int32_t prompt[80], other[80];
    fill_tokens(prompt, 80, 1000);

    /* The first request misses everything and registers 4 full blocks. */
    size_t a = m_create(&m, 0);
    assert_int_equal(m_match(&m, a, prompt, 64), 0);
    assert_ok(m_append(&m, a, 64, prompt, true));
    m_verify(&m);
    llmem_kv_stats s0 = test_kv_stats(m.kv);
    assert_int_equal(s0.prefix_miss_tokens_total, 64);
    assert_int_equal(s0.prefix_hit_tokens_total, 0);
    assert_int_equal(s0.blocks_used, 4);

    /* The same prompt again: every block reused, none taken, same KV. */
    size_t b = m_create(&m, 0);
    assert_int_equal(m_match(&m, b, prompt, 64), 64);
    m_verify(&m);
    llmem_kv_stats s1 = test_kv_stats(m.kv);
    assert_int_equal(s1.prefix_hit_tokens_total, 64);
    assert_int_equal(s1.blocks_used, 4);
    assert_int_equal(s1.grows_total, s0.grows_total);
    assert_int_equal(s1.blocks_free, s0.blocks_free);
    for (size_t p = 0; p < 64; p += 16) assert_ptr_equal(block_of(&m, &m.s[a], p), block_of(&m, &m.s[b], p));

    /* Longer and shorter prompts: only whole blocks match. */
    size_t c = m_create(&m, 0);
    assert_int_equal(m_match(&m, c, prompt, 70), 64);
    assert_ok(m_append(&m, c, 6, prompt + 64, true));
    size_t d = m_create(&m, 0);
    assert_int_equal(m_match(&m, d, prompt, 63), 48);
    /* A difference inside block 2 stops the match there. */
    memcpy(other, prompt, sizeof other);
    other[40] = -7;
    size_t e = m_create(&m, 0);
    assert_int_equal(m_match(&m, e, other, 64), 32);
    assert_ok(m_append(&m, e, 32, other + 32, true));
    /* A difference in the first token matches nothing. */
    other[40] = prompt[40];
    other[0] = -1;
    size_t f = m_create(&m, 0);
    assert_int_equal(m_match(&m, f, other, 64), 0);
    /* Same tokens at other positions are another prefix. */
    size_t g = m_create(&m, 0);
    assert_int_equal(m_match(&m, g, prompt + 16, 48), 0);
    /* n = 0 and tokens NULL: nothing matched, nothing counted. */
    size_t h = m_create(&m, 0);
    assert_int_equal(m_match(&m, h, NULL, 0), 0);
    m_verify(&m);
    llmem_kv_stats s2 = test_kv_stats(m.kv);
    assert_int_equal(s2.prefix_hit_tokens_total, 64 + 64 + 48 + 32);
    assert_int_equal(s2.prefix_miss_tokens_total, 64 + 6 + 15 + 32 + 64 + 48);

    /* Freed, the blocks stay cached and a later request still hits them. */
    llmem_kv_seq ha = m.s[a].h;
    while (m.n) m_free(&m, m.n - 1);
    llmem_kv_stats s3 = test_kv_stats(m.kv);
    assert_int_equal(s3.blocks_used, 0);
    assert_int_equal(s3.blocks_cached, 4 + 2); /* the prompt's 4 and e's 2 */
    assert_int_equal(s3.evictions_total, 0);
    size_t i = m_create(&m, 0);
    assert_true(m.s[i].h != ha);
    assert_int_equal(m_match(&m, i, prompt, 80), 64);
    assert_ok(m_append(&m, i, 16, prompt + 64, true));
    m_verify(&m);
    assert_int_equal(test_kv_stats(m.kv).blocks_cached, 2);
    /* Appended without tokens, blocks are not registered. */
    size_t j = m_create(&m, 0);
    assert_ok(m_append(&m, j, 32, other, false));
    size_t k = m_create(&m, 0);
    assert_int_equal(m_match(&m, k, other, 32), 0);
    m_close(&m);

    /* Without a prefix cache nothing matches or is counted. */
    o.prefix_cache = false;
    m_open(&m, &o, NULL);
    a = m_create(&m, 0);
    assert_ok(m_append(&m, a, 64, prompt, true));
    b = m_create(&m, 0);
    size_t got = 9;
    assert_ok(llmem_kv_seq_match_prefix(m.kv, m.s[b].h, prompt, 64, &got));
    assert_int_equal(got, 0);
    assert_int_equal(test_kv_stats(m.kv).prefix_miss_tokens_total, 0);
    m_close(&m);
}

/* Interleaved decoding still gives each sequence slabs of its own: when one
 * ends, every slab it used goes back to the pool, and the others' are not
 * pinned by it. */
static void slabs_follow_sequences(void **state)
{
    (void)state;
    llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
    size_t bb = 2 * 2 * 8 * 2; /* K and V, 2 heads x 8 dims, f16: one token, one layer */
    o.slab_bytes = 4 * 16 * bb; /* 4 blocks per slab */
    llmem_kv *kv;
    assert_ok(llmem_kv_create(&o, &kv));
    llmem_kv_seq a, b, c;
    assert_ok(llmem_kv_seq_create(kv, 0, &a));
    assert_ok(llmem_kv_seq_create(kv, 0, &b));
    assert_ok(llmem_kv_seq_create(kv, 0, &c));
    assert_ok(llmem_kv_seq_append(kv, a, 40, NULL, NULL)); /* 3 blocks */
    assert_ok(llmem_kv_seq_append(kv, b, 8, NULL, NULL));  /* 1 block */
    assert_ok(llmem_kv_seq_append(kv, c, 70, NULL, NULL)); /* 5 blocks */
    for (int t = 0; t < 150; t++) { /* decode, one token each in turn */
        assert_ok(llmem_kv_seq_append(kv, a, 1, NULL, NULL));
        assert_ok(llmem_kv_seq_append(kv, b, 1, NULL, NULL));
        assert_ok(llmem_kv_seq_append(kv, c, 1, NULL, NULL));
    }
    /* a: 190 tokens, 12 blocks, 3 slabs; b: 158, 10 blocks, 3 slabs;
     * c: 220, 14 blocks, 4 slabs. */
    llmem_kv_stats s = test_kv_stats(kv);
    assert_int_equal(s.blocks_used, 12 + 10 + 14);
    assert_int_equal(s.blocks_total, 4 * (3 + 3 + 4));
    assert_int_equal(s.tokens_written, 190 + 158 + 220);
    assert_ok(llmem_kv_seq_free(kv, b));
    s = test_kv_stats(kv);
    assert_int_equal(s.blocks_total, 4 * (3 + 4));
    assert_int_equal(s.blocks_free, 4 * (3 + 4) - 12 - 14);
    assert_true(s.shrinks_total >= 3);
    assert_ok(llmem_kv_check(kv));
    /* A new sequence takes a fresh slab rather than the tails of a and c. */
    llmem_kv_seq d;
    assert_ok(llmem_kv_seq_create(kv, 0, &d));
    assert_ok(llmem_kv_seq_append(kv, d, 16, NULL, NULL));
    assert_int_equal(test_kv_stats(kv).blocks_total, 4 * (3 + 4 + 1));
    assert_ok(llmem_kv_seq_free(kv, a));
    assert_ok(llmem_kv_seq_free(kv, c));
    assert_int_equal(test_kv_stats(kv).blocks_total, 4);
    assert_ok(llmem_kv_seq_free(kv, d));
    s = test_kv_stats(kv);
    assert_int_equal(s.blocks_total, 0);
    assert_int_equal(s.bytes_reserved, 0);
    llmem_kv_destroy(kv);
}

static void prefix_cache_lru_eviction(void **state)
{
    (void)state;
    llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
    o.prefix_cache = true;
    size_t bb = 2 * 32 * 16;
    o.slab_bytes = 4 * bb;                 /* 4 blocks per slab */
    o.budget_bytes = 3 * 4 * bb * o.layers; /* 12 blocks in all */
    model m;
    m_open(&m, &o, NULL);
    int32_t pa[32], pb[32], pc[32], other[256];
    fill_tokens(pa, 32, 100);
    fill_tokens(pb, 32, 200);
    fill_tokens(pc, 32, 300);
    fill_tokens(other, 256, 5000);
    const int32_t *ps[3] = {pa, pb, pc};
    llmem_kv_seq hs[3];
    for (int p = 0; p < 3; p++) {
        size_t i = m_create(&m, 0);
        assert_ok(m_append(&m, i, 32, ps[p], true));
        hs[p] = m.s[i].h;
    }
    m_verify(&m);
    /* Freed in the order A, B, C: 6 cached blocks, least recently used A. */
    for (int p = 0; p < 3; p++) {
        size_t i = 0;
        while (m.s[i].h != hs[p]) i++;
        m_free(&m, i);
    }
    llmem_kv_stats s = test_kv_stats(m.kv);
    assert_int_equal(s.blocks_cached, 6);
    /* Each sequence got a slab of its own (placement for whole-slab release). */
    assert_int_equal(s.blocks_total, 12);
    assert_int_equal(s.blocks_free, 6);
    /* Memory is not needed yet: the budget allows no fourth slab, but the
     * 6 free blocks in the three slabs come before any eviction. */
    size_t d = m_create(&m, 0);
    assert_ok(m_append(&m, d, 32, other, true));
    assert_int_equal(test_kv_stats(m.kv).evictions_total, 0);
    assert_ok(m_append(&m, d, 64, other + 32, true));
    s = test_kv_stats(m.kv);
    assert_int_equal(s.evictions_total, 0);
    assert_int_equal(s.blocks_total, 12);
    assert_int_equal(s.blocks_cached, 6);
    /* Now it is: two more blocks evict A, the least recently used prefix. */
    assert_ok(m_append(&m, d, 32, other + 96, true));
    s = test_kv_stats(m.kv);
    assert_int_equal(s.evictions_total, 2);
    assert_int_equal(s.blocks_cached, 4);
    m_verify(&m);
    size_t probe = m_create(&m, 0);
    assert_int_equal(m_match(&m, probe, pa, 32), 0); /* A misses */
    m_free(&m, probe);
    probe = m_create(&m, 0);
    assert_int_equal(m_match(&m, probe, pc, 32), 32); /* C still hits, and reads its KV */
    m_verify(&m);
    m_free(&m, probe);
    probe = m_create(&m, 0);
    assert_int_equal(m_match(&m, probe, pb, 32), 32);
    m_verify(&m);
    m_free(&m, probe);
    /* Matching made B the most recently used: the next eviction takes C,
     * and the end of its prefix first, so its start still matches. */
    assert_ok(m_append(&m, d, 16, other + 128, true));
    assert_int_equal(test_kv_stats(m.kv).evictions_total, 3);
    probe = m_create(&m, 0);
    assert_int_equal(m_match(&m, probe, pc, 32), 16);
    m_free(&m, probe);
    probe = m_create(&m, 0);
    assert_int_equal(m_match(&m, probe, pb, 32), 32);
    m_verify(&m);
    m_free(&m, probe);
    /* Used blocks are never evicted: with 3 blocks cached and the budget
     * full, a request for 5 blocks fails and takes nothing. */
    size_t e = m_create(&m, 0);
    assert_int_equal(m_append(&m, e, 80, other + 144, true), LLMEM_ENOMEM);
    s = test_kv_stats(m.kv);
    assert_int_equal(s.evictions_total, 3);
    assert_int_equal(s.blocks_cached, 3);
    m_verify(&m);
    /* trim(false) keeps the cache; trim(true) evicts it and gives slabs back. */
    uint64_t before = test_kv_stats(m.kv).bytes_reserved;
    assert_int_equal(llmem_kv_trim(m.kv, false), 0);
    assert_int_equal(test_kv_stats(m.kv).blocks_cached, 3);
    size_t released = llmem_kv_trim(m.kv, true);
    s = test_kv_stats(m.kv);
    assert_int_equal(s.blocks_cached, 0);
    assert_int_equal(s.bytes_reserved, before - released);
    assert_int_equal(s.evictions_total, 3 + 3);
    assert_true(released % (4 * bb * o.layers) == 0);
    probe = m_create(&m, 0);
    assert_int_equal(m_match(&m, probe, pc, 32), 0);
    m_verify(&m);
    while (m.n) m_free(&m, 0);
    assert_true(llmem_kv_trim(m.kv, true) > 0);
    s = test_kv_stats(m.kv);
    assert_int_equal(s.bytes_reserved, 0);
    assert_int_equal(s.blocks_total, 0);
    assert_true(s.shrinks_total >= 3);
    assert_int_equal(llmem_kv_trim(m.kv, true), 0);
    m_close(&m);
}

/* ---- copy-on-write ----------------------------------------------------------- */

static void copy_on_write(void **state)
{
    (void)state;
    llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
    model m;
    m_open(&m, &o, NULL);
    int32_t t[64];
    fill_tokens(t, 64, 1);
    size_t p = m_create(&m, 0);
    assert_ok(m_append(&m, p, 20, t, true)); /* last block partial: 4 of 16 */
    size_t c = m_fork(&m, p);
    llmem_kv_stats s = test_kv_stats(m.kv);
    assert_int_equal(s.blocks_used, 2); /* shared */
    assert_int_equal(s.cow_copies_total, 0);
    assert_int_equal(s.sequences, 2);
    assert_ptr_equal(block_of(&m, &m.s[p], 19), block_of(&m, &m.s[c], 19));
    m_verify(&m);
    /* The child writes: it gets a copy of the partial block. */
    int32_t ct[16];
    for (int i = 0; i < 16; i++) ct[i] = -1 - i;
    assert_ok(m_append(&m, c, 1, ct, true));
    s = test_kv_stats(m.kv);
    assert_int_equal(s.cow_copies_total, 1);
    assert_int_equal(s.blocks_used, 3);
    assert_ptr_equal(block_of(&m, &m.s[p], 0), block_of(&m, &m.s[c], 0));
    assert_true(block_of(&m, &m.s[p], 19) != block_of(&m, &m.s[c], 19));
    m_verify(&m); /* the parent's block is untouched, the copy holds its 4 tokens */
    /* The other way round: the parent writes after a fork. */
    size_t c2 = m_fork(&m, p);
    assert_ok(m_append(&m, p, 3, t + 20, true));
    s = test_kv_stats(m.kv);
    assert_int_equal(s.cow_copies_total, 2);
    m_verify(&m);
    /* c2 now holds the old block alone: writing it copies nothing. */
    assert_ok(m_append(&m, c2, 5, ct, true));
    assert_int_equal(test_kv_stats(m.kv).cow_copies_total, 2);
    /* A fork at a block boundary shares only full blocks: no copy. */
    assert_ok(m_append(&m, p, 9, t + 23, true)); /* p: 32 tokens */
    size_t c3 = m_fork(&m, p);
    assert_ok(m_append(&m, c3, 16, t + 32, true));
    assert_ok(m_append(&m, p, 7, ct, true));
    assert_int_equal(test_kv_stats(m.kv).cow_copies_total, 2);
    m_verify(&m);
    /* A chain of forks of one partial block: each writer copies once. */
    size_t q = m_create(&m, 0);
    assert_ok(m_append(&m, q, 5, t, true));
    size_t f1 = m_fork(&m, q), f2 = m_fork(&m, q), f3 = m_fork(&m, f1);
    uint64_t cw = test_kv_stats(m.kv).cow_copies_total;
    assert_ok(m_append(&m, f2, 1, ct, true));
    assert_ok(m_append(&m, f3, 1, ct + 1, true));
    assert_ok(m_append(&m, q, 1, ct + 2, true));
    assert_int_equal(test_kv_stats(m.kv).cow_copies_total, cw + 3);
    assert_ok(m_append(&m, f1, 1, ct + 3, true)); /* the last holder writes in place */
    assert_int_equal(test_kv_stats(m.kv).cow_copies_total, cw + 3);
    m_verify(&m);
    /* Freeing the parent leaves the child whole. */
    m_free(&m, p);
    m_verify(&m);
    m_close(&m);

    /* The same on a sim device: the copy goes through the resource. */
    llmem_sim_options so = llmem_sim_options_default();
    so.fill = 0x3c;
    llmem_resource *sim;
    assert_ok(llmem_sim_resource_create(&so, &sim));
    m_open(&m, &o, sim);
    p = m_create(&m, 0);
    assert_ok(m_append(&m, p, 27, t, true));
    c = m_fork(&m, p);
    assert_ok(m_append(&m, c, 2, ct, true));
    assert_ok(m_append(&m, p, 2, ct + 2, true));
    assert_int_equal(test_kv_stats(m.kv).cow_copies_total, 1);
    m_verify(&m);
    m_close(&m);
    llmem_sim_stats ss = {0};
    assert_ok(llmem_sim_resource_get_stats(sim, &ss));
    assert_int_equal(ss.bad_copies_total, 0);
    llmem_resource_destroy(sim);
}

/* ---- windows ----------------------------------------------------------------- */

static void windows_slide_and_recycle(void **state)
{
    (void)state;
    for (int prefix = 0; prefix <= 1; prefix++) {
        llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
        o.max_seq_len = 64; /* a window may pass it */
        o.slab_bytes = 4 * 2 * 32 * 16;
        o.prefix_cache = prefix;
        model m;
        m_open(&m, &o, NULL);
        size_t w = m_create(&m, 32);
        uint64_t grows = 0;
        size_t last_first = 0;
        for (int32_t p = 0; p < 200; p++) {
            int32_t tok = 7 * p + 1;
            assert_ok(m_append(&m, w, 1, &tok, true));
            llmem_kv_seq_info in;
            assert_ok(llmem_kv_seq_get_info(m.kv, m.s[w].h, &in));
            size_t len = (size_t)p + 1;
            assert_int_equal(in.length, len);
            assert_int_equal(in.window, 32);
            assert_true(in.length - in.first >= (len < 32 ? len : 32)); /* the last 32 are held */
            assert_true(in.length - in.first <= 32 + 16);
            assert_int_equal(in.first % 16, 0);
            assert_true(in.first == last_first || in.first == last_first + 16);
            last_first = in.first;
            llmem_kv_stats s = test_kv_stats(m.kv);
            assert_true(s.blocks_used <= 3);
            if (p == 50) grows = s.grows_total;
            if (p > 50 && !prefix) assert_int_equal(s.grows_total, grows); /* blocks are recycled */
            if (!prefix) assert_true(s.blocks_total <= 4);
            if (p % 13 == 0) m_verify(&m);
            if (in.first) {
                void *k;
                assert_status(llmem_kv_seq_token(m.kv, m.s[w].h, 1, in.first - 1, &k, NULL), LLMEM_ERANGE);
            }
        }
        assert_int_equal(m.s[w].first, 160);
        m_verify(&m);
        if (prefix) {
            /* Dropped full blocks went to the cache, not back to the window. */
            llmem_kv_stats s = test_kv_stats(m.kv);
            assert_int_equal(s.blocks_cached, 200 / 16 - 2);
        }
        /* Fork a window sequence: the blocks are shared, each side slides alone. */
        size_t c = m_fork(&m, w);
        assert_int_equal(test_kv_stats(m.kv).blocks_used, 3);
        int32_t t[40];
        fill_tokens(t, 40, 90000);
        assert_ok(m_append(&m, c, 20, t, true));
        fill_tokens(t, 40, 80000);
        assert_ok(m_append(&m, w, 3, t, true));
        m_verify(&m);
        assert_int_equal(m.s[c].first, 176);
        assert_int_equal(m.s[w].first, 160);
        assert_ok(m_append(&m, w, 37, t + 3, true));
        m_verify(&m);
        m_free(&m, w);
        m_verify(&m);
        m_close(&m);
    }
}

/* A window appended in one long call needs only the blocks it keeps; the
 * blocks it drops in the same call were never written and must not reach
 * the prefix cache; a window sequence matching a long prefix holds only its
 * window. */
static void windows_long_appends_and_prefix(void **state)
{
    (void)state;
    llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
    o.max_seq_len = 64;
    size_t bb = 2 * 32 * 16;
    o.slab_bytes = 2 * bb;
    o.budget_bytes = 4 * bb * o.layers; /* 4 blocks */
    o.prefix_cache = true;
    llmem_sim_options so = llmem_sim_options_default();
    so.fill = 0xee;
    llmem_resource *sim;
    assert_ok(llmem_sim_resource_create(&so, &sim));
    for (int dev = 0; dev <= 1; dev++) {
        model m;
        m_open(&m, &o, dev ? sim : NULL);
        int32_t t[300];
        fill_tokens(t, 300, 40000);
        size_t w = m_create(&m, 32);
        assert_ok(m_append(&m, w, 200, t, false)); /* 13 block positions, 3 blocks held */
        assert_int_equal(m.s[w].first, 160);
        assert_int_equal(test_kv_stats(m.kv).blocks_used, 3);
        m_verify(&m);
        m_free(&m, w);
        /* With tokens: only the blocks still held are registered. */
        w = m_create(&m, 32);
        assert_ok(m_append(&m, w, 200, t, true));
        m_verify(&m);
        llmem_kv_stats s = test_kv_stats(m.kv);
        assert_int_equal(s.blocks_used, 3);
        assert_true(s.bytes_reserved <= o.budget_bytes);
        size_t probe = m_create(&m, 0);
        assert_int_equal(m_match(&m, probe, t, 64), 0); /* the start was never written */
        m_free(&m, probe);
        /* A window sequence matching the prompt holds only its last blocks. */
        size_t w2 = m_create(&m, 32);
        assert_int_equal(m_match(&m, w2, t, 200), 0);
        m_free(&m, w2);
        /* Token by token, every block is written before it leaves: all cached. */
        m_free(&m, w);
        assert_true(llmem_kv_trim(m.kv, true) > 0);
        m_close(&m);
        o.budget_bytes = 0;
        m_open(&m, &o, dev ? sim : NULL);
        w = m_create(&m, 32);
        for (size_t p = 0; p < 160; p++) assert_ok(m_append(&m, w, 1, t + p, true));
        m_free(&m, w);
        assert_int_equal(test_kv_stats(m.kv).blocks_cached, 10);
        w2 = m_create(&m, 32);
        assert_int_equal(m_match(&m, w2, t, 170), 160);
        assert_int_equal(m.s[w2].first, 112); /* 3 of the 10 blocks */
        llmem_kv_stats s2 = test_kv_stats(m.kv);
        assert_int_equal(s2.blocks_used, 3);
        assert_int_equal(s2.blocks_cached, 7);
        m_verify(&m);
        assert_ok(m_append(&m, w2, 10, t + 160, true));
        assert_ok(m_append(&m, w2, 30, t + 170, true));
        m_verify(&m);
        /* A plain sequence reads the whole prefix, written token by token. */
        size_t plain = m_create(&m, 0);
        assert_int_equal(m_match(&m, plain, t, 64), 64);
        m_verify(&m);
        /* ... but never more than max_seq_len. */
        size_t plain2 = m_create(&m, 0);
        assert_int_equal(m_match(&m, plain2, t, 160), 64);
        m_verify(&m);
        m_close(&m);
        o.budget_bytes = 4 * bb * o.layers;
    }
    llmem_resource_destroy(sim);
}

/* ---- out of memory ----------------------------------------------------------- */

static void out_of_memory_mid_append(void **state)
{
    (void)state;
    for (int dev = 0; dev <= 1; dev++) {
        llmem_resource *sim = NULL;
        if (dev) assert_ok(llmem_sim_resource_create(NULL, &sim));
        llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
        size_t bb = 2 * 32 * 16;
        o.slab_bytes = 4 * bb;
        o.budget_bytes = 2 * 4 * bb * o.layers; /* 8 blocks */
        model m;
        m_open(&m, &o, sim);
        int32_t t[128];
        fill_tokens(t, 128, 10);
        size_t x = m_create(&m, 0), y = m_create(&m, 0);
        assert_ok(m_append(&m, x, 40, t, true));  /* 3 blocks */
        assert_ok(m_append(&m, y, 64, t + 1, true)); /* 4 blocks: 1 left */
        m_verify(&m);
        llmem_kv_stats before = test_kv_stats(m.kv);
        assert_int_equal(before.blocks_free, 1);
        /* 30 more tokens need 2 blocks. */
        assert_int_equal(m_append(&m, x, 30, t + 40, true), LLMEM_ENOMEM);
        llmem_kv_stats after = test_kv_stats(m.kv);
        assert_int_equal(after.preemptions_total, before.preemptions_total + 1);
        assert_int_equal(after.blocks_used, before.blocks_used);
        assert_int_equal(after.blocks_free, 1); /* the one it took went back */
        assert_int_equal(after.tokens_written, before.tokens_written);
        m_verify(&m); /* x and y as they were */
        /* A copy-on-write that finds no block is refused the same way. */
        size_t c = m_fork(&m, x);
        assert_ok(m_append(&m, c, 8, t + 90, true)); /* fills the copy: the last free block */
        size_t c2 = m_fork(&m, x);
        assert_int_equal(m_append(&m, c2, 1, t, true), LLMEM_ENOMEM);
        m_verify(&m);
        m_free(&m, c2);
        m_free(&m, c);
        /* After another sequence goes, the same append succeeds. */
        m_free(&m, 1); /* y */
        assert_ok(m_append(&m, 0, 30, t + 40, true));
        m_verify(&m);
        assert_int_equal(m.s[0].length, 70);
        m_close(&m);
        llmem_resource_destroy(sim);
    }
}

/* ---- STATIC ------------------------------------------------------------------ */

static void static_reserves_and_max_len(void **state)
{
    (void)state;
    llmem_kv_options o = geo(LLMEM_KV_STATIC, 16);
    o.max_seq_len = 100; /* 7 blocks */
    size_t per = 7 * 2 * 32 * 16 * o.layers;
    o.budget_bytes = 3 * per;
    model m;
    m_open(&m, &o, NULL);
    size_t a = m_create(&m, 0);
    llmem_kv_stats s = test_kv_stats(m.kv);
    assert_int_equal(s.bytes_reserved, per); /* reserved at creation, before any token */
    assert_int_equal(s.tokens_reserved, 7 * 16);
    assert_int_equal(s.tokens_written, 0);
    m_create(&m, 0);
    m_create(&m, 0);
    llmem_kv_seq h = 3;
    assert_status(llmem_kv_seq_create(m.kv, 0, &h), LLMEM_ENOMEM); /* the 4th */
    m.preempts++;
    assert_int_equal(h, 0);
    assert_int_equal(test_kv_stats(m.kv).preemptions_total, 1);
    int32_t t[128];
    fill_tokens(t, 128, 3);
    assert_ok(m_append(&m, a, 100, t, true)); /* exactly max_seq_len */
    assert_int_equal(m_append(&m, a, 1, t, true), LLMEM_ERANGE);
    assert_int_equal(m_append(&m, 1, 101, t, true), LLMEM_ERANGE);
    assert_ok(m_append(&m, 1, 50, t, true));
    assert_int_equal(test_kv_stats(m.kv).grows_total, 3); /* appends take nothing */
    m_verify(&m);
    /* Forks copy (and need a reservation of their own). */
    assert_status(llmem_kv_seq_fork(m.kv, m.s[a].h, &h), LLMEM_ENOMEM);
    m.preempts++;
    m_free(&m, 2);
    size_t c = m_fork(&m, a);
    assert_true(block_of(&m, &m.s[c], 5) != block_of(&m, &m.s[a], 5));
    assert_ok(m_truncate(&m, c, 10));
    assert_ok(m_append(&m, c, 5, t + 64, true));
    m_verify(&m); /* the parent is untouched */
    m_free(&m, a);
    m_verify(&m);
    m_close(&m);

    /* Past max_seq_len is LLMEM_ERANGE for every strategy; a PAGED window passes it. */
    for (int st = LLMEM_KV_PAGED; st <= LLMEM_KV_CONTIGUOUS; st++) {
        o = geo((llmem_kv_strategy)st, 16);
        o.max_seq_len = 40;
        m_open(&m, &o, NULL);
        a = m_create(&m, 0);
        assert_ok(m_append(&m, a, 30, t, true));
        assert_int_equal(m_append(&m, a, 11, t, true), LLMEM_ERANGE);
        assert_ok(m_append(&m, a, 10, t + 30, true));
        assert_int_equal(m_append(&m, a, 1, t, true), LLMEM_ERANGE);
        size_t b = m_create(&m, 0);
        assert_int_equal(m_append(&m, b, 41, t, false), LLMEM_ERANGE);
        if (st == LLMEM_KV_PAGED) {
            size_t w = m_create(&m, 16);
            assert_ok(m_append(&m, w, 41, t, true));
            assert_ok(m_append(&m, w, 60, t + 41, true));
        }
        m_verify(&m);
        m_close(&m);
    }
}

/* ---- BUCKETS ----------------------------------------------------------------- */

static void buckets_grow_reuse_trim(void **state)
{
    (void)state;
    for (int dev = 0; dev <= 1; dev++) {
        llmem_resource *sim = NULL;
        if (dev) assert_ok(llmem_sim_resource_create(NULL, &sim));
        llmem_kv_options o = geo(LLMEM_KV_BUCKETS, 16);
        o.max_seq_len = 100; /* classes 16, 32, 64, 100 */
        model m;
        m_open(&m, &o, sim);
        size_t bb = 2 * 32 * 16;
        int32_t t[128];
        fill_tokens(t, 128, 77);
        size_t a = m_create(&m, 0);
        assert_int_equal(test_kv_stats(m.kv).bytes_reserved, 0); /* nothing until a token */
        size_t caps[] = {16, 32, 64, 100};
        size_t len = 0;
        for (int c = 0; c < 4; c++) {
            size_t n = caps[c] - len;
            assert_ok(m_append(&m, a, n, t + len, true));
            len += n;
            llmem_kv_seq_info in;
            assert_ok(llmem_kv_seq_get_info(m.kv, m.s[a].h, &in));
            assert_int_equal(in.capacity, caps[c]);
            llmem_kv_stats s = test_kv_stats(m.kv);
            assert_int_equal(s.grows_total, (uint64_t)c + 1);
            assert_int_equal(s.bucket_copies_total, (uint64_t)c); /* contents copied at each growth */
            m_verify(&m);
        }
        /* The outgrown buffers are idle: still reserved, reused later. */
        llmem_kv_stats s = test_kv_stats(m.kv);
        size_t all = (1 + 2 + 4 + 7) * bb * o.layers;
        assert_int_equal(s.bytes_reserved, all);
        m_free(&m, a);
        size_t b = m_create(&m, 0);
        assert_ok(m_append(&m, b, 20, t + 1, true));
        assert_ok(m_append(&m, b, 40, t + 21, true));
        size_t c = m_create(&m, 0);
        assert_ok(m_append(&m, c, 90, t + 2, true));
        size_t d = m_create(&m, 0);
        assert_ok(m_append(&m, d, 3, t + 3, true));
        s = test_kv_stats(m.kv);
        assert_int_equal(s.grows_total, 4); /* every buffer came from the idle lists */
        assert_int_equal(s.bytes_reserved, all);
        m_verify(&m);
        /* A fork takes the smallest class that holds the parent. */
        size_t f = m_fork(&m, d);
        llmem_kv_seq_info in;
        assert_ok(llmem_kv_seq_get_info(m.kv, m.s[f].h, &in));
        assert_int_equal(in.capacity, 16);
        assert_int_equal(test_kv_stats(m.kv).grows_total, 5);
        assert_ok(m_append(&m, f, 2, t, true));
        m_verify(&m);
        /* trim gives back only idle buffers: the 32 b outgrew. */
        size_t released = llmem_kv_trim(m.kv, false);
        assert_int_equal(released, 2 * bb * o.layers);
        s = test_kv_stats(m.kv);
        assert_int_equal(s.bytes_reserved, all + bb * o.layers - released);
        m_verify(&m);
        while (m.n) m_free(&m, 0);
        assert_int_equal(llmem_kv_trim(m.kv, false), all + bb * o.layers - released);
        s = test_kv_stats(m.kv);
        assert_int_equal(s.bytes_reserved, 0);
        assert_int_equal(s.shrinks_total, 5);
        m_close(&m);

        /* Under a budget, idle buffers give way to a new one; past it, ENOMEM. */
        o.budget_bytes = 8 * bb * o.layers;
        m_open(&m, &o, sim);
        a = m_create(&m, 0);
        assert_ok(m_append(&m, a, 64, t, true)); /* straight into the 64 class: 4 blocks */
        b = m_create(&m, 0);
        assert_ok(m_append(&m, b, 20, t + 5, true)); /* 32: 2 blocks, 6 of 8 held */
        assert_int_equal(test_kv_stats(m.kv).grows_total, 2);
        llmem_kv_stats s0 = test_kv_stats(m.kv);
        assert_int_equal(m_append(&m, b, 20, t + 25, true), LLMEM_ENOMEM); /* 64 more would pass */
        assert_int_equal(test_kv_stats(m.kv).preemptions_total, s0.preemptions_total + 1);
        m_verify(&m); /* b unchanged */
        m_free(&m, 0);
        assert_ok(m_append(&m, 0, 20, t + 25, true)); /* a's 64 is idle now: reused */
        assert_int_equal(test_kv_stats(m.kv).grows_total, 2);
        /* A new class that does not fit gives idle buffers back first. */
        c = m_create(&m, 0);
        assert_ok(m_append(&m, c, 50, t, true)); /* 64: 4 blocks, 4 + 2 idle held: the idle 32 goes */
        m_verify(&m);
        assert_int_equal(test_kv_stats(m.kv).shrinks_total, 1);
        assert_int_equal(test_kv_stats(m.kv).grows_total, 3);
        assert_int_equal(test_kv_stats(m.kv).bytes_reserved, 8 * bb * o.layers);
        m_close(&m);
        llmem_resource_destroy(sim);
    }
}

/* ---- truncation -------------------------------------------------------------- */

/* ---- CONTIGUOUS: fixed addresses, memory that follows the tokens -------------- */

static void contiguous_positions_stay_put(void **state)
{
    (void)state;
    llmem_resource *os = NULL, *track = NULL;
    assert_ok(llmem_os_resource_create(NULL, &os));
    assert_ok(llmem_tracking_resource_create(os, &track));
    llmem_kv_options o = geo(LLMEM_KV_CONTIGUOUS, 16);
    o.max_seq_len = 4096;
    o.resource = track;
    llmem_kv *kv = NULL;
    assert_ok(llmem_kv_create(&o, &kv));
    size_t bpt = llmem_kv_token_total_bytes(kv), page = llmem_resource_granularity(track);
    llmem_kv_seq a, b;
    assert_ok(llmem_kv_seq_create(kv, 0, &a));
    assert_ok(llmem_kv_seq_create(kv, 0, &b));
    assert_int_equal(test_kv_stats(kv).bytes_reserved, 0); /* address space only */
    void *k0 = NULL, *v0 = NULL;
    for (size_t t = 0; t < 1000; t++) {
        assert_ok(llmem_kv_seq_append(kv, a, 1, NULL, NULL));
        void *k, *v;
        assert_ok(llmem_kv_seq_token(kv, a, 1, t, &k, &v));
        memset(k, (int)(t & 0xff), llmem_kv_token_layer_bytes(kv));
        if (!t) k0 = k, v0 = v;
        /* Committed: the granules the tokens need, in every layer. */
        size_t need = (t + 1 + 15) / 16 * llmem_kv_block_bytes(kv);
        need = (need + page - 1) / page * page;
        assert_int_equal(test_kv_stats(kv).bytes_reserved, need * o.layers);
    }
    void *k, *v;
    assert_ok(llmem_kv_seq_token(kv, a, 1, 0, &k, &v));
    assert_ptr_equal(k, k0);
    assert_ptr_equal(v, v0);
    for (size_t t = 0; t < 1000; t += 37) {
        assert_ok(llmem_kv_seq_token(kv, a, 1, t, &k, &v));
        assert_int_equal(((unsigned char *)k)[3], t & 0xff);
    }
    /* One sequence's positions are one run per layer: no block table needed. */
    void *kp[80], *vp[80];
    size_t n = 0;
    assert_ok(llmem_kv_seq_table(kv, a, 0, kp, vp, 80, &n));
    for (size_t i = 1; i < n; i++) assert_ptr_equal(kp[i], (char *)kp[0] + i * llmem_kv_block_bytes(kv));
    /* The tracking resource saw exactly the commits. */
    llmem_tracking_stats ts = {sizeof ts};
    assert_ok(llmem_tracking_resource_get_stats(track, &ts));
    assert_int_equal(ts.live_mappings, 2);
    assert_true(test_kv_stats(kv).bytes_reserved <= (uint64_t)1000 * bpt + o.layers * page);
    assert_ok(llmem_kv_check(kv));
    assert_ok(llmem_kv_seq_free(kv, a));
    assert_ok(llmem_kv_seq_free(kv, b));
    assert_int_equal(test_kv_stats(kv).bytes_reserved, 0);
    llmem_kv_destroy(kv);
    assert_ok(llmem_tracking_resource_get_stats(track, &ts));
    assert_int_equal(ts.live_mappings, 0);
    assert_int_equal(ts.refused_total, 0);
    llmem_resource_destroy(track);
    llmem_resource_destroy(os);
}

static void truncate_rules(void **state)
{
    (void)state;
    for (int st = LLMEM_KV_PAGED; st <= LLMEM_KV_CONTIGUOUS; st++) {
        llmem_kv_options o = geo((llmem_kv_strategy)st, 16);
        model m;
        m_open(&m, &o, NULL);
        int32_t t[100];
        fill_tokens(t, 100, 500);
        size_t a = m_create(&m, 0);
        assert_ok(m_append(&m, a, 40, t, true));
        assert_ok(m_truncate(&m, a, 20)); /* keeps 0..19 */
        m_verify(&m);
        assert_int_equal(m_truncate(&m, a, 21), LLMEM_ERANGE); /* beyond the length */
        assert_ok(m_truncate(&m, a, 20));                     /* to the length: nothing */
        int32_t u[10] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
        assert_ok(m_append(&m, a, 10, u, true)); /* new tokens over the old positions */
        m_verify(&m);
        assert_ok(m_truncate(&m, a, 0));
        m_verify(&m);
        assert_ok(m_append(&m, a, 17, t + 50, true));
        m_verify(&m);
        m_close(&m);
    }
    /* PAGED: below a window's first position is refused; a truncated shared
     * block is copied before it is written; so is a cached block. */
    llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
    o.prefix_cache = true;
    model m;
    m_open(&m, &o, NULL);
    int32_t t[100];
    fill_tokens(t, 100, 900);
    size_t w = m_create(&m, 16);
    assert_ok(m_append(&m, w, 70, t, false));
    assert_int_equal(m.s[w].first, 48);
    assert_int_equal(m_truncate(&m, w, 47), LLMEM_ERANGE);
    assert_int_equal(m_truncate(&m, w, 0), LLMEM_ERANGE);
    assert_ok(m_truncate(&m, w, 48));
    assert_int_equal(test_kv_stats(m.kv).blocks_used, 0);
    assert_ok(m_append(&m, w, 40, t + 48, false));
    m_verify(&m);

    size_t p = m_create(&m, 0);
    assert_ok(m_append(&m, p, 40, t, false));
    size_t c = m_fork(&m, p);
    assert_ok(m_truncate(&m, c, 20)); /* block 1 still shared, p holds it whole */
    uint64_t cw = test_kv_stats(m.kv).cow_copies_total;
    int32_t u[8] = {-1, -2, -3, -4, -5, -6, -7, -8};
    assert_ok(m_append(&m, c, 8, u, true));
    assert_int_equal(test_kv_stats(m.kv).cow_copies_total, cw + 1);
    m_verify(&m); /* p's positions 20..27 are its own */

    /* A block in the prefix cache: truncating into it and writing copies it,
     * and the cache keeps the original. */
    size_t q = m_create(&m, 0);
    assert_ok(m_append(&m, q, 32, t + 10, true));
    assert_ok(m_truncate(&m, q, 20));
    assert_ok(m_append(&m, q, 8, u, true));
    assert_int_equal(test_kv_stats(m.kv).cow_copies_total, cw + 2);
    size_t r = m_create(&m, 0);
    assert_int_equal(m_match(&m, r, t + 10, 32), 32);
    m_verify(&m);
    /* After a truncation the chain is unknown: no more registrations ... */
    assert_ok(m_append(&m, q, 4, u, true));
    size_t r2 = m_create(&m, 0);
    int32_t qt[32];
    memcpy(qt, t + 10, 20 * sizeof *qt);
    memcpy(qt + 20, u, 8 * sizeof *qt);
    memcpy(qt + 28, u, 4 * sizeof *qt);
    assert_int_equal(m_match(&m, r2, qt, 32), 16);
    /* ... until it is empty again. */
    assert_ok(m_truncate(&m, q, 0));
    assert_ok(m_append(&m, q, 32, qt, true));
    size_t r3 = m_create(&m, 0);
    assert_int_equal(m_match(&m, r3, qt, 32), 32);
    m_verify(&m);
    m_close(&m);
}

/* ---- stats -------------------------------------------------------------------- */

static void stats_and_schema(void **state)
{
    (void)state;
    llmem_kv_options o = geo(LLMEM_KV_PAGED, 8);
    o.prefix_cache = true;
    o.slab_bytes = 4 * 2 * 32 * 8;
    model m;
    m_open(&m, &o, NULL);
    int32_t t[64];
    fill_tokens(t, 64, 1);
    size_t a = m_create(&m, 0);
    assert_ok(m_append(&m, a, 21, t, true));
    size_t b = m_fork(&m, a);
    assert_ok(m_append(&m, b, 2, t, true));
    size_t c = m_create(&m, 0);
    assert_int_equal(m_match(&m, c, t, 21), 16);
    m_verify(&m); /* blocks, slots and bytes against the shadow */
    llmem_kv_stats s = test_kv_stats(m.kv);
    /* a: 3 blocks (5 in the last); b shares 2, its copy holds 7; c shares 2. */
    assert_int_equal(s.blocks_used, 4);
    assert_int_equal(s.tokens_written, 8 + 8 + 5 + 7);
    assert_int_equal(s.blocks_total, 4);
    assert_int_equal(s.tokens_reserved, 32);
    assert_int_equal(s.bytes_reserved, 4 * 2 * 32 * 8 * 2);
    assert_int_equal(s.bytes_reserved_peak, s.bytes_reserved);
    assert_int_equal(s.grows_total, 1);
    assert_int_equal(s.cow_copies_total, 1);
    /* A truncated holder of a shared block holds fewer slots in it. */
    assert_ok(m_truncate(&m, c, 3));
    m_free(&m, a);
    m_verify(&m);
    /* A caller with an older, shorter struct gets only that much. */
    llmem_kv_stats small;
    memset(&small, 0xab, sizeof small);
    small.struct_size = offsetof(llmem_kv_stats, blocks_total);
    assert_ok(llmem_kv_get_stats(m.kv, &small));
    assert_int_equal(small.sequences, 2);
    assert_int_equal(small.blocks_total, 0xababababababababull);
    /* The schema renders every field. */
    s = test_kv_stats(m.kv);
    const llmem_stats_schema *sc = llmem_kv_stats_schema();
    assert_non_null(sc);
    assert_string_equal(sc->name, "kv");
    assert_int_equal(sc->struct_size, sizeof(llmem_kv_stats));
    assert_int_equal(sc->field_count, (sizeof(llmem_kv_stats) - sizeof(size_t)) / sizeof(uint64_t));
    char buf[4096], want[96];
    size_t len = 0;
    llmem_label lb[] = {{"kv", "test"}};
    assert_ok(llmem_stats_to_json(sc, &s, lb, 1, buf, sizeof buf, &len));
    assert_int_equal(len, strlen(buf));
    assert_non_null(strstr(buf, "\"type\":\"kv\""));
    assert_non_null(strstr(buf, "\"labels\":{\"kv\":\"test\"}"));
    for (size_t i = 0; i < sc->field_count; i++) {
        uint64_t v;
        memcpy(&v, (const char *)&s + sc->fields[i].offset, sizeof v);
        snprintf(want, sizeof want, "\"%s\":%llu", sc->fields[i].name, (unsigned long long)v);
        if (!strstr(buf, want)) fail_msg("%s not in %s", want, buf);
    }
    assert_non_null(strstr(buf, "\"cow_copies_total\":1"));
    m_close(&m);
}

/* ---- bad input ------------------------------------------------------------------ */

static void bad_input(void **state)
{
    (void)state;
    llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
    o.prefix_cache = true;
    llmem_kv *kv;
    assert_ok(llmem_kv_create(&o, &kv));
    llmem_kv_seq s, dead, never = ((uint64_t)5 << 32) | 9;
    void *k = NULL, *v = NULL, *arr[4];
    size_t n = 0, matched = 0;
    llmem_kv_seq_info in;
    llmem_kv_stats st;
    int32_t t[64] = {0};

    /* NULL kv and NULL outputs. */
    assert_status(llmem_kv_seq_create(NULL, 0, &s), LLMEM_EINVAL);
    assert_int_equal(s, 0);
    assert_status(llmem_kv_seq_create(kv, 0, NULL), LLMEM_EINVAL);
    assert_ok(llmem_kv_seq_create(kv, 0, &s));
    assert_status(llmem_kv_seq_free(NULL, s), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_fork(NULL, s, &dead), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_fork(kv, s, NULL), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_match_prefix(NULL, s, t, 16, &matched), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_match_prefix(kv, s, t, 16, NULL), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_match_prefix(kv, s, NULL, 16, &matched), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_append(NULL, s, 1, NULL, NULL), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_truncate(NULL, s, 0), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_token(NULL, s, 0, 0, &k, &v), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_table(NULL, s, 0, arr, NULL, 4, &n), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_table(kv, s, 0, arr, NULL, 4, NULL), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_table(kv, s, 0, NULL, NULL, 4, &n), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_get_info(NULL, s, &in), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_get_info(kv, s, NULL), LLMEM_EINVAL);
    assert_status(llmem_kv_get_stats(NULL, &st), LLMEM_EINVAL);
    assert_status(llmem_kv_get_stats(kv, NULL), LLMEM_EINVAL);
    assert_status(llmem_kv_check(NULL), LLMEM_EINVAL);
    assert_int_equal(llmem_kv_trim(NULL, true), 0);
    llmem_kv_destroy(NULL);
    assert_ok(llmem_kv_seq_free(kv, 0)); /* 0 is never a sequence: a no-op */

    /* Appending nothing is fine and reports the position. */
    size_t fp = 99;
    assert_ok(llmem_kv_seq_append(kv, s, 0, NULL, &fp));
    assert_int_equal(fp, 0);
    /* A table with no room only counts. */
    assert_ok(llmem_kv_seq_append(kv, s, 20, t, NULL));
    assert_ok(llmem_kv_seq_table(kv, s, 0, NULL, NULL, 0, &n));
    assert_int_equal(n, 2);
    arr[0] = arr[1] = &n;
    assert_ok(llmem_kv_seq_table(kv, s, 1, NULL, arr, 1, &n)); /* only V, only one */
    assert_int_equal(n, 2);
    assert_ptr_equal(arr[1], &n);
    assert_ok(llmem_kv_seq_token(kv, s, 1, 1, &k, &v));
    assert_ptr_equal(v, (char *)arr[0] + 32);           /* token 1: one 32-byte token in */
    assert_ptr_equal(k, (char *)arr[0] - 16 * 32 + 32); /* K comes 16 tokens before V */
    /* Layers past the last one. */
    assert_status(llmem_kv_seq_token(kv, s, 2, 0, &k, &v), LLMEM_ERANGE);
    assert_status(llmem_kv_seq_table(kv, s, 2, arr, arr, 4, &n), LLMEM_ERANGE);
    /* Matching a sequence that already holds tokens. */
    assert_status(llmem_kv_seq_match_prefix(kv, s, t, 16, &matched), LLMEM_ESTATE);
    /* Stale and never-created handles. */
    dead = s;
    assert_ok(llmem_kv_seq_free(kv, s));
    assert_ok(llmem_kv_seq_create(kv, 0, &s)); /* reuses the slot: a new handle */
    assert_true(s != dead);
    llmem_kv_seq bad[] = {dead, never, 1234567, UINT64_MAX, (uint64_t)1 << 32};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        llmem_kv_seq c = 8;
        assert_status(llmem_kv_seq_free(kv, bad[i]), LLMEM_EINVAL);
        assert_status(llmem_kv_seq_fork(kv, bad[i], &c), LLMEM_EINVAL);
        assert_int_equal(c, 0);
        assert_status(llmem_kv_seq_match_prefix(kv, bad[i], t, 16, &matched), LLMEM_EINVAL);
        assert_status(llmem_kv_seq_append(kv, bad[i], 1, t, NULL), LLMEM_EINVAL);
        assert_status(llmem_kv_seq_truncate(kv, bad[i], 0), LLMEM_EINVAL);
        assert_status(llmem_kv_seq_token(kv, bad[i], 0, 0, &k, &v), LLMEM_EINVAL);
        assert_status(llmem_kv_seq_table(kv, bad[i], 0, arr, arr, 4, &n), LLMEM_EINVAL);
        assert_status(llmem_kv_seq_get_info(kv, bad[i], &in), LLMEM_EINVAL);
    }
    assert_ok(llmem_kv_get_stats(kv, &st));
    assert_int_equal(st.sequences, 1);
    assert_int_equal(st.blocks_used, 0);
    assert_ok(llmem_kv_check(kv));
    /* Destroy with a sequence still live: everything goes. */
    assert_ok(llmem_kv_seq_append(kv, s, 40, NULL, NULL));
    llmem_kv_destroy(kv);
}

/* ---- no malloc on the append path ------------------------------------------------ */

/* An engine must be able to show that its decode loop does not call
 * malloc: the manager's own tables come from its metadata pool, sized at
 * sequence creation (block table, partial-block tokens) and, with a budget,
 * at manager creation (per-slab arrays, prefix table). Without interposing
 * malloc, glibc's statistics must not move across 1000 one-token appends
 * (with tokens, so full blocks are registered) to each of two sequences,
 * crossing a dozen slabs, once each has taken its first block (the storage
 * pool's memory is reserved ahead; the first calls set up this thread's
 * pool caches). Without a budget the per-slab arrays grow geometrically,
 * and the metadata pool may then malloc its own bookkeeping for a new
 * superblock. A malloc and free pair that nets out in glibc's thread cache
 * would go unseen here: the engine's test interposes malloc. */
static void appends_take_no_malloc(void **state)
{
    (void)state;
#if !defined(TEST_MALLINFO) || LLMEM_DEBUG >= 3
    print_message("skipped: %s\n", LLMEM_DEBUG >= 3 ? "debug level 3 walks the manager after every call, with scratch"
                                                    : "mallinfo2 does not see the allocator under a sanitizer (or without glibc 2.33)");
#else
    static const struct {
        bool prefix;
        size_t window;
    } cases[] = {{false, 0}, {true, 0}, {true, 100}};
    int32_t tok[2] = {0, 0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        llmem_pool_options po = llmem_pool_options_default();
        po.resource = llmem_resource_default();
        po.purge = LLMEM_POOL_PURGE_MANUAL;
        llmem_pool *pool;
        assert_ok(llmem_pool_create(&po, &pool));
        assert_ok(llmem_pool_reserve(pool, 8u << 20)); /* the storage the loop takes, mapped ahead */
        llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
        o.head_dim = 64;             /* 8 KiB blocks, 8 per 64 KiB slab */
        o.max_seq_len = 2048;
        o.budget_bytes = 8u << 20;   /* per-slab arrays sized for it at create */
        o.prefix_cache = cases[c].prefix;
        o.pool = pool;
        llmem_kv *kv;
        assert_ok(llmem_kv_create(&o, &kv));
        llmem_kv_seq s[2];
        for (int i = 0; i < 2; i++) {
            assert_ok(llmem_kv_seq_create(kv, cases[c].window, &s[i]));
            tok[i] = 1000 * i + (int32_t)c;
            assert_ok(llmem_kv_seq_append(kv, s[i], 1, &tok[i], NULL));
        }
        uint64_t grows = test_kv_stats(kv).grows_total;
        struct mallinfo2 before = mallinfo2();
        for (int k = 0; k < 1000; k++)
            for (int i = 0; i < 2; i++) {
                tok[i]++;
                llmem_status st = llmem_kv_seq_append(kv, s[i], 1, &tok[i], NULL);
                if (st) fail_msg("append %d: %s (%s)", k, llmem_status_name(st), llmem_error_message());
            }
        struct mallinfo2 after = mallinfo2();
        if (after.uordblks != before.uordblks || after.hblks != before.hblks || after.arena != before.arena)
            fail_msg("case %zu: malloc moved across the appends: in use %zu -> %zu bytes, mmapped %zu -> %zu, "
                     "arena %zu -> %zu",
                     c, before.uordblks, after.uordblks, before.hblks, after.hblks, before.arena, after.arena);
        llmem_kv_stats ks = test_kv_stats(kv);
        if (!cases[c].window) assert_true(ks.grows_total - grows >= 2 * (1000 / (16 * 8))); /* crossed 14 slabs */
        else assert_true(ks.shrinks_total + ks.grows_total > 0);
        llmem_kv_seq_info in;
        assert_ok(llmem_kv_seq_get_info(kv, s[0], &in));
        assert_int_equal(in.length, 1001);
        assert_ok(llmem_kv_check(kv));
        llmem_kv_destroy(kv);
        llmem_pool_destroy(pool);
    }
#endif
}

/* ---- fault injection ------------------------------------------------------------- */

typedef test_fault_stack fctx;

/* The manager over a pool over fault(tracking(os)): a fixed scenario of
 * creates, prompts, appends, forks, truncations and frees, every sequence
 * verified after each step. */
static void fault_scenario(fctx *f, llmem_kv_strategy strategy, bool prefix, unsigned *surfaced, unsigned *absorbed)
{
    llmem_pool_options po = llmem_pool_options_default();
    po.name = "kv-fault";
    po.resource = f->fault;
    po.purge = LLMEM_POOL_PURGE_MANUAL;
    po.decay_ms = 3600 * 1000; /* nothing goes back on a timer: the map calls are the same every run */
    po.first_superblock_bytes = 64 << 10; /* one slab of one layer each: a map per slab and layer */
    po.max_superblock_bytes = 64 << 10;
    llmem_pool *pool;
    assert_ok(llmem_pool_create(&po, &pool));
    llmem_kv_options o = llmem_kv_options_default();
    o.strategy = strategy;
    o.layers = 2;
    o.kv_heads = 4;
    o.head_dim = 64;
    o.block_tokens = 8;     /* 8 KiB blocks */
    o.max_seq_len = 64;
    o.slab_bytes = 40 << 10; /* 5 blocks per slab: large pool blocks */
    o.prefix_cache = prefix;
    o.pool = pool;
    model m;
    m_open(&m, &o, NULL);
    m.may_fail = true;
    m.exact = false;
    m.fault = f->fault;
    uint64_t r = 0x5eed + (uint64_t)strategy;
    int32_t prompt[64], t[64];
    fill_tokens(prompt, 64, 7);
    for (int op = 0; op < 36; op++) {
        uint64_t x = test_rng_next(&r) % 10;
        size_t i = m.n ? (size_t)(test_rng_next(&r) % m.n) : 0;
        if (m.n == 0 || (x < 3 && m.n < 10)) {
            size_t j = m_create(&m, 0);
            if (j != SIZE_MAX && prefix) {
                size_t plen = 8 + (size_t)(test_rng_next(&r) % 40);
                size_t got = m_match(&m, j, prompt, plen);
                m_append(&m, j, plen - got, prompt + got, true);
            }
        } else if (x < 7) {
            size_t n = 1 + (size_t)(test_rng_next(&r) % 20);
            if (m.s[i].length + n > m.max_len) n = m.max_len - m.s[i].length;
            fill_tokens(t, n, (int32_t)(1000 * op));
            if (n) m_append(&m, i, n, t, true);
        } else if (x < 8 && m.n < 10) {
            m_fork(&m, i);
        } else if (x < 9) {
            m_truncate(&m, i, m.s[i].length / 2);
        } else {
            m_free(&m, i);
        }
        m_verify(&m);
    }
    *surfaced = m.surfaced;
    *absorbed = m.absorbed;
    m_close(&m);
    llmem_pool_destroy(pool);
    /* Nothing left mapped. */
    test_tracking_expect_clean(f->track); /* the pool and the manager never made an invalid call */
}

static void fault_arm(fctx *f, uint64_t nth, uint64_t count)
{
    test_fault_arm(f->fault, nth, count, LLMEM_FAULT_OP_MAP);
}

static void fault_campaign(void **state)
{
    (void)state;
    fctx f;
    test_fault_stack_open(&f, NULL);
    static const struct {
        llmem_kv_strategy st;
        bool prefix;
    } cfgs[] = {{LLMEM_KV_PAGED, false},  {LLMEM_KV_PAGED, true},
                {LLMEM_KV_STATIC, false}, {LLMEM_KV_BUCKETS, false},
                {LLMEM_KV_CONTIGUOUS, false}};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        /* 1. Count the map calls. */
        unsigned surfaced = 0, absorbed = 0, total_surfaced = 0;
        fault_arm(&f, 0, 1);
        fault_scenario(&f, cfgs[c].st, cfgs[c].prefix, &surfaced, &absorbed);
        llmem_fault_stats fs = test_fault_stats(f.fault);
        uint64_t n = fs.calls_total;
        assert_int_equal(fs.injected_total, 0);
        assert_int_equal(surfaced + absorbed, 0);
        if (n < 4) fail_msg("config %zu: only %llu map calls, the scenario is too small", c, (unsigned long long)n);
        /* 2. Fail each once: it surfaces as ENOMEM from one call, or that call absorbs it. */
        for (uint64_t k = 1; k <= n; k++) {
            fault_arm(&f, k, 1);
            fault_scenario(&f, cfgs[c].st, cfgs[c].prefix, &surfaced, &absorbed);
            fs = test_fault_stats(f.fault);
            assert_int_equal(fs.injected_total, 1);
            if (surfaced + absorbed != 1)
                fail_msg("config %zu, map %llu: seen %u times", c, (unsigned long long)k, surfaced + absorbed);
            total_surfaced += surfaced;
        }
        assert_true(total_surfaced > 0);
        /* 3. Fail every map from the kth on. */
        for (uint64_t k = 1; k <= n; k += 2) {
            fault_arm(&f, k, UINT64_MAX);
            fault_scenario(&f, cfgs[c].st, cfgs[c].prefix, &surfaced, &absorbed);
            assert_true(surfaced + absorbed >= 1);
        }
        print_message("kv over fault(tracking(os)), config %zu: %llu map calls, each failed once (%u surfaced as "
                      "ENOMEM, the rest absorbed) and forever from there\n",
                      c, (unsigned long long)n, total_surfaced);
    }
    fault_arm(&f, 0, 1);
    test_fault_stack_close(&f);
}

/* ---- offload: swap out and in -------------------------------------------------------- */

/* Storage on a sim device (bytes kept), possibly behind a fault adaptor;
 * swap memory from tracking(os), so leaks show. */
typedef struct swfix {
    llmem_resource *sim, *dev, *fault, *os, *swap;
    llmem_kv *kv;
    size_t tb, B;
    uint32_t layers;
} swfix;

static void sw_open(swfix *f, llmem_kv_options o, bool fault)
{
    memset(f, 0, sizeof *f);
    llmem_sim_options so = llmem_sim_options_default();
    so.fill = 0x5a;
    assert_ok(llmem_sim_resource_create(&so, &f->sim));
    f->dev = f->sim;
    if (fault) {
        assert_ok(llmem_fault_resource_create(f->sim, NULL, &f->fault));
        f->dev = f->fault;
    }
    assert_ok(llmem_os_resource_create(NULL, &f->os));
    assert_ok(llmem_tracking_resource_create(f->os, &f->swap));
    o.resource = f->dev;
    if (!o.swap_resource) o.swap_resource = f->swap;
    assert_ok(llmem_kv_create(&o, &f->kv));
    f->tb = llmem_kv_token_layer_bytes(f->kv);
    f->B = o.block_tokens;
    f->layers = o.layers;
}

static uint64_t sw_live_maps(const swfix *f)
{
    llmem_tracking_stats ts;
    memset(&ts, 0, sizeof ts);
    assert_ok(llmem_tracking_resource_get_stats(f->swap, &ts));
    return ts.live_mappings;
}

static void sw_close(swfix *f)
{
    llmem_kv_destroy(f->kv);
    assert_int_equal(sw_live_maps(f), 0); /* destroy unmaps swapped sequences' memory */
    llmem_tracking_stats ts;
    memset(&ts, 0, sizeof ts);
    assert_ok(llmem_tracking_resource_get_stats(f->swap, &ts));
    assert_int_equal(ts.refused_total, 0);
    llmem_sim_stats ss;
    memset(&ss, 0, sizeof ss);
    assert_ok(llmem_sim_resource_get_stats(f->sim, &ss));
    assert_int_equal(ss.bad_copies_total, 0);
    assert_int_equal(ss.used_bytes, 0);
    llmem_resource_destroy(f->swap);
    llmem_resource_destroy(f->os);
    llmem_resource_destroy(f->fault);
    llmem_resource_destroy(f->sim);
}

/* Byte i of K (which 0) or V (1) of position pos in layer l, under tag. */
static unsigned char sw_byte(uint32_t tag, size_t pos, uint32_t l, int which, size_t i)
{
    return (unsigned char)(test_mix64(((uint64_t)tag << 40) ^ ((uint64_t)pos << 16) ^ ((uint64_t)l << 4) ^
                               ((uint64_t)which << 2) ^ ((uint64_t)i << 24)) >> 13);
}

/* Write positions [from, to) of s, every layer, K and V, through the device's copy. */
static void sw_fill(const swfix *f, llmem_kv_seq s, size_t from, size_t to, uint32_t tag)
{
    unsigned char buf[4096];
    assert_true(f->tb <= sizeof buf);
    for (size_t pos = from; pos < to; pos++)
        for (uint32_t l = 0; l < f->layers; l++) {
            void *kv[2];
            assert_ok(llmem_kv_seq_token(f->kv, s, l, pos, &kv[0], &kv[1]));
            for (int w = 0; w < 2; w++) {
                for (size_t i = 0; i < f->tb; i++) buf[i] = sw_byte(tag, pos, l, w, i);
                assert_ok(llmem_resource_copy(f->dev, kv[w], buf, f->tb));
            }
        }
}

static void sw_verify(const swfix *f, llmem_kv_seq s, size_t from, size_t to, uint32_t tag)
{
    unsigned char buf[4096];
    for (size_t pos = from; pos < to; pos++)
        for (uint32_t l = 0; l < f->layers; l++) {
            void *kv[2];
            assert_ok(llmem_kv_seq_token(f->kv, s, l, pos, &kv[0], &kv[1]));
            for (int w = 0; w < 2; w++) {
                assert_ok(llmem_resource_copy(f->dev, buf, kv[w], f->tb));
                for (size_t i = 0; i < f->tb; i++)
                    if (buf[i] != sw_byte(tag, pos, l, w, i))
                        fail_msg("position %zu layer %u %s byte %zu: %02x, want %02x", pos, l, w ? "V" : "K", i,
                                 buf[i], sw_byte(tag, pos, l, w, i));
            }
        }
}

static llmem_kv_seq_info sw_info(const swfix *f, llmem_kv_seq s)
{
    llmem_kv_seq_info in;
    memset(&in, 0, sizeof in);
    assert_ok(llmem_kv_seq_get_info(f->kv, s, &in));
    return in;
}

/* Every call that needs the sequence's blocks refuses a swapped one. */
static void sw_assert_swapped_refuses(const swfix *f, llmem_kv_seq s)
{
    void *k[4];
    size_t n = 0, got = 0;
    int32_t t[16] = {0};
    llmem_kv_seq c = 0;
    assert_status(llmem_kv_seq_append(f->kv, s, 1, t, NULL), LLMEM_ESTATE);
    assert_status(llmem_kv_seq_token(f->kv, s, 0, 0, &k[0], NULL), LLMEM_ESTATE);
    assert_status(llmem_kv_seq_table(f->kv, s, 0, k, NULL, 4, &n), LLMEM_ESTATE);
    assert_status(llmem_kv_seq_truncate(f->kv, s, 0), LLMEM_ESTATE);
    assert_status(llmem_kv_seq_fork(f->kv, s, &c), LLMEM_ESTATE);
    assert_int_equal(c, 0);
    assert_status(llmem_kv_seq_match_prefix(f->kv, s, t, 16, &got), LLMEM_ESTATE);
    assert_status(llmem_kv_seq_swap_out(f->kv, s), LLMEM_ESTATE); /* twice */
    assert_true(sw_info(f, s).swapped);
    assert_ok(llmem_kv_check(f->kv));
}

static void swap_round_trip(void **state)
{
    (void)state;
    llmem_kv_options o = geo(LLMEM_KV_PAGED, 16); /* 2 layers, 32-byte tokens, 1 KiB blocks */
    swfix f;
    sw_open(&f, o, false);
    size_t bb = llmem_kv_block_bytes(f.kv);
    int32_t t[256];
    fill_tokens(t, 256, 11);
    llmem_kv_seq a, b;
    assert_ok(llmem_kv_seq_create(f.kv, 0, &a));
    assert_ok(llmem_kv_seq_append(f.kv, a, 100, t, NULL)); /* 7 blocks, the last partial */
    sw_fill(&f, a, 0, 100, 1);
    llmem_kv_stats s0 = test_kv_stats(f.kv);
    assert_int_equal(s0.blocks_used, 7);
    assert_int_equal(s0.swapped_sequences, 0);

    assert_ok(llmem_kv_seq_swap_out(f.kv, a));
    assert_ok(llmem_kv_check(f.kv));
    llmem_kv_stats s1 = test_kv_stats(f.kv);
    size_t want_map = (7 * bb * 2 + 4095) / 4096 * 4096;
    assert_int_equal(s1.blocks_used, 0); /* the device blocks went back */
    assert_int_equal(s1.swapped_sequences, 1);
    assert_int_equal(s1.swap_out_total, 1);
    assert_int_equal(s1.bytes_swapped_out_total, 7 * bb * 2);
    assert_true(s1.swap_bytes_held >= 7 * bb * 2);
    assert_true(s1.swap_bytes_held <= want_map);
    assert_int_equal(s1.tokens_written, 0);
    assert_int_equal(sw_live_maps(&f), 1);
    llmem_kv_seq_info in = sw_info(&f, a);
    assert_true(in.swapped);
    assert_int_equal(in.length, 100);
    assert_int_equal(in.blocks, 0);
    assert_int_equal(in.capacity, 0);
    assert_int_equal(in.swap_bytes, s1.swap_bytes_held);
    sw_assert_swapped_refuses(&f, a);
    assert_status(llmem_kv_seq_swap_in(f.kv, 0), LLMEM_EINVAL);

    /* Another sequence takes the device memory a held. */
    assert_ok(llmem_kv_seq_create(f.kv, 0, &b));
    assert_ok(llmem_kv_seq_append(f.kv, b, 100, t + 100, NULL));
    sw_fill(&f, b, 0, 100, 2);
    assert_int_equal(test_kv_stats(f.kv).blocks_used, 7);

    assert_ok(llmem_kv_seq_swap_in(f.kv, a));
    assert_ok(llmem_kv_check(f.kv));
    assert_status(llmem_kv_seq_swap_in(f.kv, a), LLMEM_ESTATE);
    assert_int_equal(sw_live_maps(&f), 0);
    in = sw_info(&f, a);
    assert_false(in.swapped);
    assert_int_equal(in.blocks, 7);
    assert_int_equal(in.swap_bytes, 0);
    sw_verify(&f, a, 0, 100, 1); /* every byte, every layer, K and V */
    sw_verify(&f, b, 0, 100, 2);
    llmem_kv_stats s2 = test_kv_stats(f.kv);
    assert_int_equal(s2.blocks_used, 14);
    assert_int_equal(s2.swapped_sequences, 0);
    assert_int_equal(s2.swap_in_total, 1);
    assert_int_equal(s2.bytes_swapped_in_total, 7 * bb * 2);
    assert_int_equal(s2.swap_bytes_held, 0);
    assert_int_equal(s2.swap_bytes_held_peak, s1.swap_bytes_held);
    assert_true(s2.swap_seconds_total > 0);

    /* Appends after swap-in: into the partial block, then new blocks. */
    assert_ok(llmem_kv_seq_append(f.kv, a, 40, t + 100, NULL));
    sw_fill(&f, a, 100, 140, 1);
    sw_verify(&f, a, 0, 140, 1);
    sw_verify(&f, b, 0, 100, 2);
    assert_ok(llmem_kv_check(f.kv));

    /* An empty sequence swaps without memory. */
    llmem_kv_seq e;
    assert_ok(llmem_kv_seq_create(f.kv, 0, &e));
    assert_ok(llmem_kv_seq_swap_out(f.kv, e));
    assert_true(sw_info(&f, e).swapped);
    assert_int_equal(sw_info(&f, e).swap_bytes, 0);
    assert_int_equal(sw_live_maps(&f), 0);
    assert_status(llmem_kv_seq_append(f.kv, e, 1, t, NULL), LLMEM_ESTATE);
    assert_ok(llmem_kv_check(f.kv));
    assert_ok(llmem_kv_seq_swap_in(f.kv, e));
    assert_ok(llmem_kv_seq_append(f.kv, e, 3, t, NULL));

    /* A window sequence: swap keeps first and length. */
    llmem_kv_seq w;
    assert_ok(llmem_kv_seq_create(f.kv, 32, &w));
    assert_ok(llmem_kv_seq_append(f.kv, w, 90, t, NULL));
    in = sw_info(&f, w);
    assert_true(in.first > 0);
    sw_fill(&f, w, in.first, 90, 3);
    assert_ok(llmem_kv_seq_swap_out(f.kv, w));
    assert_ok(llmem_kv_check(f.kv));
    assert_ok(llmem_kv_seq_swap_in(f.kv, w));
    assert_int_equal(sw_info(&f, w).first, in.first);
    sw_verify(&f, w, in.first, 90, 3);
    assert_ok(llmem_kv_seq_append(f.kv, w, 40, t, NULL));
    assert_ok(llmem_kv_check(f.kv));
    sw_close(&f);
}

static void swap_shared_blocks(void **state)
{
    (void)state;
    for (int prefix = 0; prefix <= 1; prefix++) {
        llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
        o.prefix_cache = prefix;
        swfix f;
        sw_open(&f, o, false);
        int32_t t[64];
        fill_tokens(t, 64, 5);
        llmem_kv_seq p, c;
        assert_ok(llmem_kv_seq_create(f.kv, 0, &p));
        assert_ok(llmem_kv_seq_append(f.kv, p, 40, t, NULL)); /* 2 full blocks and a partial one */
        sw_fill(&f, p, 0, 40, 1);
        assert_ok(llmem_kv_seq_fork(f.kv, p, &c)); /* shares all three */
        assert_int_equal(test_kv_stats(f.kv).blocks_used, 3);

        /* Swap the parent out while the child shares every block. */
        assert_ok(llmem_kv_seq_swap_out(f.kv, p));
        assert_ok(llmem_kv_check(f.kv));
        assert_int_equal(test_kv_stats(f.kv).blocks_used, 3); /* the child still holds them */
        sw_verify(&f, c, 0, 40, 1);
        assert_ok(llmem_kv_seq_append(f.kv, c, 10, t + 40, NULL)); /* no copy-on-write needed now */
        assert_int_equal(test_kv_stats(f.kv).cow_copies_total, 0);
        sw_fill(&f, c, 40, 50, 2);
        assert_ok(llmem_kv_seq_swap_in(f.kv, p));
        assert_ok(llmem_kv_check(f.kv));
        assert_int_equal(test_kv_stats(f.kv).blocks_used, 7); /* c holds 4, p took 3 of its own */
        sw_verify(&f, p, 0, 40, 1);
        sw_verify(&f, c, 0, 40, 1);
        sw_verify(&f, c, 40, 50, 2);
        assert_ok(llmem_kv_seq_append(f.kv, p, 8, t + 40, NULL));
        sw_fill(&f, p, 40, 48, 3);
        sw_verify(&f, c, 40, 50, 2); /* p's writes do not reach the child */
        sw_verify(&f, p, 0, 40, 1);
        sw_verify(&f, p, 40, 48, 3);

        /* Now fork again and swap the child out: the parent keeps its view. */
        llmem_kv_seq d;
        assert_ok(llmem_kv_seq_fork(f.kv, c, &d));
        assert_ok(llmem_kv_seq_swap_out(f.kv, d));
        assert_ok(llmem_kv_check(f.kv));
        sw_verify(&f, c, 0, 40, 1);
        sw_verify(&f, c, 40, 50, 2);
        assert_ok(llmem_kv_seq_append(f.kv, c, 6, t, NULL)); /* c's partial block is its own again */
        sw_fill(&f, c, 50, 56, 4);
        assert_ok(llmem_kv_seq_swap_in(f.kv, d));
        sw_verify(&f, d, 0, 40, 1);
        sw_verify(&f, d, 40, 50, 2);
        sw_verify(&f, c, 50, 56, 4);
        assert_ok(llmem_kv_check(f.kv));
        assert_ok(llmem_kv_seq_free(f.kv, d));
        assert_ok(llmem_kv_seq_free(f.kv, c));
        assert_ok(llmem_kv_seq_free(f.kv, p));
        assert_ok(llmem_kv_check(f.kv));
        sw_close(&f);
    }
}
static void swap_failures(void **state)
{
    (void)state;
    int32_t t[256];
    fill_tokens(t, 256, 3);
    llmem_kv_seq a, b, c;

    /* Not configured, not PAGED, not host memory. */
    {
        llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
        llmem_kv *kv;
        assert_ok(llmem_kv_create(&o, &kv));
        assert_ok(llmem_kv_seq_create(kv, 0, &a));
        assert_status(llmem_kv_seq_swap_out(kv, a), LLMEM_ENOTSUP);
        assert_status(llmem_kv_seq_swap_in(kv, a), LLMEM_ENOTSUP);
        assert_status(llmem_kv_seq_swap_out(NULL, a), LLMEM_EINVAL);
        llmem_kv_destroy(kv);
        llmem_resource *sim;
        assert_ok(llmem_sim_resource_create(NULL, &sim));
        o.swap_resource = sim;
        assert_status(llmem_kv_create(&o, &kv), LLMEM_EINVAL);
        o = geo(LLMEM_KV_STATIC, 16);
        o.swap_resource = llmem_resource_default();
        assert_ok(llmem_kv_create(&o, &kv));
        assert_ok(llmem_kv_seq_create(kv, 0, &a));
        assert_status(llmem_kv_seq_swap_out(kv, a), LLMEM_ENOTSUP);
        llmem_kv_destroy(kv);
        llmem_resource_destroy(sim);
    }

    /* Storage for exactly two 64-token sequences: 2-block slabs (4 KiB over
     * both layers), a budget of 4 slabs. */
    llmem_kv_options o = geo(LLMEM_KV_PAGED, 16);
    o.slab_bytes = 2048;
    o.budget_bytes = 16384;
    o.swap_budget_bytes = 8192; /* one 64-token sequence (8 KiB, two pages) */
    swfix f;
    sw_open(&f, o, true);
    assert_ok(llmem_kv_seq_create(f.kv, 0, &a));
    assert_ok(llmem_kv_seq_append(f.kv, a, 64, t, NULL));
    sw_fill(&f, a, 0, 64, 1);
    assert_ok(llmem_kv_seq_create(f.kv, 0, &b));
    assert_ok(llmem_kv_seq_append(f.kv, b, 64, t + 64, NULL));
    sw_fill(&f, b, 0, 64, 2);

    /* The swap budget refuses the second: nothing changes. */
    assert_ok(llmem_kv_seq_swap_out(f.kv, a));
    llmem_kv_stats before = test_kv_stats(f.kv);
    assert_status(llmem_kv_seq_swap_out(f.kv, b), LLMEM_ENOMEM);
    assert_error_mentions("swap budget");
    llmem_kv_stats after = test_kv_stats(f.kv);
    assert_memory_equal(&before, &after, sizeof before);
    assert_false(sw_info(&f, b).swapped);
    assert_int_equal(sw_live_maps(&f), 1);
    sw_verify(&f, b, 0, 64, 2);
    assert_ok(llmem_kv_check(f.kv));

    /* A failing copy (device to swap) leaves b as it was and unmaps. */
    llmem_fault_options fo = llmem_fault_options_default();
    fo.ops = LLMEM_FAULT_OP_COPY;
    fo.fail_nth = 2;
    fo.status = LLMEM_EDEVICE;
    assert_ok(llmem_kv_seq_swap_in(f.kv, a)); /* room in the swap budget for b */
    assert_ok(llmem_fault_resource_arm(f.fault, &fo));
    before = test_kv_stats(f.kv);
    assert_status(llmem_kv_seq_swap_out(f.kv, b), LLMEM_EDEVICE);
    assert_ok(llmem_fault_resource_arm(f.fault, NULL));
    after = test_kv_stats(f.kv);
    before.swap_seconds_total = after.swap_seconds_total = 0; /* the failed copy's time counts */
    assert_memory_equal(&before, &after, sizeof before);
    assert_false(sw_info(&f, b).swapped);
    assert_int_equal(sw_live_maps(&f), 0);
    sw_verify(&f, b, 0, 64, 2);
    sw_verify(&f, a, 0, 64, 1);
    assert_ok(llmem_kv_check(f.kv));

    /* The device is full: swap-in refuses, the sequence stays swapped. */
    assert_ok(llmem_kv_seq_swap_out(f.kv, a));
    assert_ok(llmem_kv_seq_create(f.kv, 0, &c));
    assert_ok(llmem_kv_seq_append(f.kv, c, 64, t + 128, NULL));
    sw_fill(&f, c, 0, 64, 3);
    before = test_kv_stats(f.kv);
    assert_int_equal(before.blocks_used, 8);
    assert_status(llmem_kv_seq_swap_in(f.kv, a), LLMEM_ENOMEM);
    after = test_kv_stats(f.kv);
    assert_memory_equal(&before, &after, sizeof before);
    assert_true(sw_info(&f, a).swapped);
    assert_int_equal(sw_live_maps(&f), 1);
    assert_ok(llmem_kv_check(f.kv));
    sw_assert_swapped_refuses(&f, a);

    /* A failing copy back (swap to device): a stays swapped, its blocks go back. */
    assert_ok(llmem_kv_seq_free(f.kv, b));
    fo.fail_nth = 1;
    assert_ok(llmem_fault_resource_arm(f.fault, &fo));
    before = test_kv_stats(f.kv);
    assert_status(llmem_kv_seq_swap_in(f.kv, a), LLMEM_EDEVICE);
    assert_ok(llmem_fault_resource_arm(f.fault, NULL));
    after = test_kv_stats(f.kv);
    assert_int_equal(after.blocks_used, before.blocks_used);
    assert_int_equal(after.swapped_sequences, 1);
    assert_int_equal(after.swap_bytes_held, before.swap_bytes_held);
    assert_int_equal(after.swap_in_total, 0 + before.swap_in_total);
    assert_true(sw_info(&f, a).swapped);
    assert_ok(llmem_kv_check(f.kv));

    /* Freeing another sequence makes room: swap-in succeeds. */
    assert_ok(llmem_kv_seq_swap_in(f.kv, a));
    assert_ok(llmem_kv_check(f.kv));
    sw_verify(&f, a, 0, 64, 1);
    sw_verify(&f, c, 0, 64, 3);
    assert_int_equal(sw_live_maps(&f), 0);

    /* Freeing a swapped sequence releases its swap memory. */
    assert_ok(llmem_kv_seq_swap_out(f.kv, c));
    assert_int_equal(sw_live_maps(&f), 1);
    assert_ok(llmem_kv_seq_free(f.kv, c));
    assert_int_equal(sw_live_maps(&f), 0);
    llmem_kv_stats s = test_kv_stats(f.kv);
    assert_int_equal(s.swapped_sequences, 0);
    assert_int_equal(s.swap_bytes_held, 0);
    assert_int_equal(s.sequences, 1);
    assert_ok(llmem_kv_check(f.kv));
    assert_status(llmem_kv_seq_swap_in(f.kv, c), LLMEM_EINVAL); /* no longer a sequence */

    /* Destroy with a sequence still swapped: sw_close sees no live mapping. */
    assert_ok(llmem_kv_seq_swap_out(f.kv, a));
    assert_int_equal(sw_live_maps(&f), 1);
    sw_close(&f);
}

/* Swap bandwidth through the sim device (memcpy behind the resource's
 * checks): printed, not asserted. */
static void swap_throughput(void **state)
{
    (void)state;
    llmem_kv_options o = llmem_kv_options_default();
    o.layers = 4;
    o.kv_heads = 8;
    o.head_dim = 128;  /* 2 KiB tokens, 64 KiB blocks */
    o.max_seq_len = 2048;
    swfix f;
    sw_open(&f, o, false);
    llmem_kv_seq s;
    assert_ok(llmem_kv_seq_create(f.kv, 0, &s));
    assert_ok(llmem_kv_seq_append(f.kv, s, 2048, NULL, NULL)); /* 32 MiB of KV */
    sw_fill(&f, s, 2047, 2048, 9);
    enum { ROUNDS = 4 };
    uint64_t t0 = test_now_ms();
    for (int r = 0; r < ROUNDS; r++) {
        assert_ok(llmem_kv_seq_swap_out(f.kv, s));
        assert_ok(llmem_kv_seq_swap_in(f.kv, s));
    }
    uint64_t ms = test_now_ms() - t0;
    sw_verify(&f, s, 2047, 2048, 9);
    llmem_kv_stats st = test_kv_stats(f.kv);
    assert_int_equal(st.bytes_swapped_out_total, (uint64_t)ROUNDS * 2048 * 2048 * 2 * 4);
    double bytes = (double)(st.bytes_swapped_out_total + st.bytes_swapped_in_total);
    print_message("kv swap through sim-device: %.0f MiB in %.3f s of copies (%.2f GB/s); %llu ms wall with maps\n",
                  bytes / (1 << 20), st.swap_seconds_total,
                  st.swap_seconds_total > 0 ? bytes / st.swap_seconds_total / 1e9 : 0.0, (unsigned long long)ms);
    assert_ok(llmem_kv_check(f.kv));
    sw_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(geometry),
        cmocka_unit_test(create_rejects_bad_options),
        cmocka_unit_test_setup(paged_budget_below_one_slab_is_refused, test_quiet_logs),
        cmocka_unit_test(property_host),
        cmocka_unit_test(property_sim_device),
        cmocka_unit_test(prefix_cache_hits_and_misses),
        cmocka_unit_test(rollback_forgets_what_truncate_keeps),
        cmocka_unit_test(slabs_follow_sequences),
        cmocka_unit_test(prefix_cache_lru_eviction),
        cmocka_unit_test(copy_on_write),
        cmocka_unit_test(windows_slide_and_recycle),
        cmocka_unit_test(windows_long_appends_and_prefix),
        cmocka_unit_test(out_of_memory_mid_append),
        cmocka_unit_test(static_reserves_and_max_len),
        cmocka_unit_test(buckets_grow_reuse_trim),
        cmocka_unit_test(contiguous_positions_stay_put),
        cmocka_unit_test(truncate_rules),
        cmocka_unit_test(stats_and_schema),
        cmocka_unit_test(bad_input),
        cmocka_unit_test(appends_take_no_malloc),
        cmocka_unit_test(fault_campaign),
        cmocka_unit_test(swap_round_trip),
        cmocka_unit_test(swap_shared_blocks),
        cmocka_unit_test(swap_failures),
        cmocka_unit_test(swap_throughput),
    };
    return cmocka_run_group_tests(tests, test_quiet_logs, NULL);
}
