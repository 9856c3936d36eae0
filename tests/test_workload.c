/*
 * test_workload.c - llmem_workload_plan_make (llmem/workload.h): the
 * figures `llmem plan` prints, checked by hand for llama-2-7b, and the
 * refusals of sizes that overflow.
 */
#include "test_util.h"

static llmem_workload llama7b(void)
{
    llmem_workload w = llmem_workload_default();
    assert_ok(llmem_shape_load("llama-2-7b", &w.shape));
    assert_ok(llmem_workload_weights_bytes(&w.shape, LLMEM_DTYPE_F16, &w.weights_bytes));
    return w;
}

/* 32 layers x 2 (K, V) x 4096 x 2 bytes = 524,288 bytes a token; 8
 * sequences of 2304 tokens (144 blocks of 16) = 9,663,676,416 bytes. */
static void llama7b_by_hand(void **state)
{
    (void)state;
    llmem_workload w = llama7b();
    assert_int_equal(w.weights_bytes, 13476831232ull);
    w.batch = 8;
    w.prompt_tokens = 2048;
    w.max_tokens = 256;
    w.device_bytes = 80e9;
    llmem_workload_plan p;
    assert_ok(llmem_workload_plan_make(&w, &p));
    assert_int_equal(p.seq_tokens, 2304);
    assert_false(p.over_context);
    assert_int_equal(p.kv_bytes_per_token, 524288);
    assert_int_equal(p.kv_bytes_per_seq, 2304ull * 524288);
    assert_int_equal(p.kv_bytes, 9663676416ull);
    /* Prefill of 512 tokens is the larger step; the reserve is
     * (KV + activations) x 1.2 rounded up. */
    assert_true(p.prefill_is_peak);
    assert_true(p.prefill.peak_bytes > p.decode.peak_bytes && p.decode.peak_bytes > 0);
    assert_int_equal(p.activation_peak_bytes, p.prefill.peak_bytes);
    uint64_t need = p.kv_bytes + p.activation_peak_bytes;
    assert_int_equal(p.reserve_bytes, need + (need + 4) / 5);
    /* (80e9 - weights - act x 1.2) / (seq KV x 1.2) = 45.x */
    double room = 80e9 - 13476831232.0 - (double)p.activation_peak_bytes * 1.2;
    assert_int_equal(p.max_concurrent, (long long)(room / (2304.0 * 524288 * 1.2)));
    assert_int_equal(p.max_concurrent, 45);
    /* Without a device: no fit. A sequence past the context is noted. */
    w.device_bytes = 0;
    w.prompt_tokens = 4096;
    assert_ok(llmem_workload_plan_make(&w, &p));
    assert_int_equal(p.max_concurrent, -1);
    assert_true(p.over_context);
    /* Decode only: no prefill step. */
    w.prompt_tokens = 0;
    assert_ok(llmem_workload_plan_make(&w, &p));
    assert_int_equal(p.prefill.peak_bytes, 0);
    assert_false(p.prefill_is_peak);
    /* Another safety factor. */
    w.safety = 2;
    assert_ok(llmem_workload_plan_make(&w, &p));
    assert_int_equal(p.reserve_bytes, 2 * (p.kv_bytes + p.activation_peak_bytes));
}

static void bad_workloads_are_refused(void **state)
{
    (void)state;
    llmem_workload_plan p;
    assert_status(llmem_workload_plan_make(NULL, &p), LLMEM_EINVAL);
    llmem_workload w = llama7b();
    assert_status(llmem_workload_plan_make(&w, NULL), LLMEM_EINVAL);
    w.prompt_tokens = w.max_tokens = 0;
    assert_status(llmem_workload_plan_make(&w, &p), LLMEM_EINVAL);
    assert_error_mentions("no tokens");
    w = llama7b();
    w.batch = 0;
    assert_status(llmem_workload_plan_make(&w, &p), LLMEM_EINVAL);
    w = llama7b();
    w.safety = 0.5;
    assert_status(llmem_workload_plan_make(&w, &p), LLMEM_EINVAL);
    /* 2^20 sequences x 2^25 tokens x 2^19 bytes overflow. */
    w = llama7b();
    w.batch = 1u << 20;
    w.prompt_tokens = w.max_tokens = 1u << 24;
    assert_status(llmem_workload_plan_make(&w, &p), LLMEM_EOVERFLOW);
    assert_error_mentions("the KV cache is too large: 1048576 sequences x 33554432 tokens");
    uint64_t bytes;
    assert_status(llmem_workload_weights_bytes(&w.shape, LLMEM_DTYPE_Q4_0, &bytes), LLMEM_ENOTSUP);
    assert_status(llmem_workload_weights_bytes(NULL, LLMEM_DTYPE_F16, &bytes), LLMEM_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(llama7b_by_hand),
        cmocka_unit_test(bad_workloads_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
