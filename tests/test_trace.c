/*
 * test_trace.c - request traces: the Azure format and the simple one,
 * column order, stable sorting, prefix columns, every malformed field, and
 * the real trace in ../shared/traces.
 */
#include <math.h>

#include "test_util.h"

static llmem_trace parse_ok(const char *csv)
{
    llmem_trace t;
    assert_ok(llmem_trace_parse(csv, strlen(csv), &t));
    return t;
}

static void azure_format(void **state)
{
    (void)state;
    llmem_trace t = parse_ok("TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                             "2023-11-16 18:17:03.9799600,4808,10\r\n"
                             "2023-11-16 18:17:04.0319600,3180,8\r\n"
                             "2023-11-16 23:59:59.5,1,1\r\n"
                             "2023-11-17 00:00:00.5,2,0\r\n");
    assert_int_equal(t.count, 4);
    assert_true(t.req[0].arrival_s == 0);
    assert_int_equal(t.req[0].prompt_tokens, 4808);
    assert_int_equal(t.req[0].output_tokens, 10);
    assert_true(fabs(t.req[1].arrival_s - 0.052) < 1e-6);
    /* Across midnight: 23:59:59.5 to 00:00:00.5 is one second. */
    assert_true(fabs(t.req[3].arrival_s - t.req[2].arrival_s - 1.0) < 1e-6);
    assert_true(t.duration_s == t.req[3].arrival_s);
    assert_int_equal(t.req[3].output_tokens, 0);
    assert_int_equal(t.req[0].prefix_id, 0);
    llmem_trace_free(&t);
    assert_null(t.req);
    assert_int_equal(t.count, 0);
    llmem_trace_free(&t); /* twice is harmless */
    llmem_trace_free(NULL);
}

static void simple_format_any_order_and_prefixes(void **state)
{
    (void)state;
    /* Columns in another order, names in another case, seconds as numbers,
     * extra columns ignored, blank lines skipped, no final newline. */
    llmem_trace t = parse_ok("output_tokens, Prompt_Tokens ,note,arrival_s,prefix_id,prefix_tokens\n"
                             "5,100,x,2.5,7,64\n"
                             "\n"
                             "6,30,y,1.0,7,64\n"
                             "7,40,z,1.0,0,0\n"
                             "8,50,w,0.5,3,80");
    assert_int_equal(t.count, 4);
    /* Sorted by arrival and stable for equal arrivals (line order kept). */
    assert_int_equal(t.req[0].prompt_tokens, 50);
    assert_int_equal(t.req[1].prompt_tokens, 30);
    assert_int_equal(t.req[2].prompt_tokens, 40);
    assert_int_equal(t.req[3].prompt_tokens, 100);
    assert_true(t.req[0].arrival_s == 0 && t.req[1].arrival_s == 0.5 && t.req[3].arrival_s == 2.0);
    assert_true(t.duration_s == 2.0);
    assert_int_equal(t.req[1].output_tokens, 6);
    assert_int_equal(t.req[1].prefix_id, 7);
    assert_int_equal(t.req[1].prefix_tokens, 30); /* clamped to the prompt */
    assert_int_equal(t.req[3].prefix_tokens, 64);
    assert_int_equal(t.req[0].prefix_id, 3);
    assert_int_equal(t.req[0].prefix_tokens, 50);
    llmem_trace_free(&t);

    /* A header alone is an empty trace, not an error. */
    t = parse_ok("arrival,prompt_tokens,output_tokens\n");
    assert_int_equal(t.count, 0);
    assert_null(t.req);
    llmem_trace_free(&t);

    /* Many equal arrivals out of place: order within the tie is the file's. */
    char big[64 * 40 + 64];
    size_t n = (size_t)snprintf(big, sizeof big, "arrival,prompt_tokens,output_tokens\n9,999,1\n");
    for (int i = 1; i <= 60; i++) n += (size_t)snprintf(big + n, sizeof big - n, "1,%d,1\n", i);
    t = parse_ok(big);
    assert_int_equal(t.count, 61);
    for (size_t i = 0; i < 60; i++) assert_int_equal(t.req[i].prompt_tokens, i + 1);
    assert_int_equal(t.req[60].prompt_tokens, 999);
    llmem_trace_free(&t);
}

static void malformed(void **state)
{
    (void)state;
    static const struct {
        const char *csv, *mentions;
    } bad[] = {
        {"", "empty"},
        {"\n\n", "empty"},
        {"when,prompt_tokens,output_tokens\n1,2,3\n", "header"},
        {"arrival,prompt_tokens\n1,2\n", "header"},
        {"arrival,prompt_tokens,output_tokens\n1,2\n", "line 2, column 3"},
        {"arrival,prompt_tokens,output_tokens\n1,2,3\n-1,2,3\n", "line 3, column 1"},
        {"arrival,prompt_tokens,output_tokens\nnan,2,3\n", "column 1"},
        {"arrival,prompt_tokens,output_tokens\n1e300,2,3\n", "column 1"},
        {"arrival,prompt_tokens,output_tokens\n1,abc,3\n", "column 2"},
        {"arrival,prompt_tokens,output_tokens\n1,-2,3\n", "column 2"},
        {"arrival,prompt_tokens,output_tokens\n1,99999999999,3\n", "column 2"},
        {"arrival,prompt_tokens,output_tokens\n1,20000000,3\n", "column 2"}, /* over 2^24 tokens */
        {"arrival,prompt_tokens,output_tokens\n1,2,3.5\n", "column 3"},
        {"arrival,prompt_tokens,output_tokens\n1,2,\n", "column 3"},
        {"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-16 18:17:03,1,1\n", "column 1"},
        {"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 25:17:03,1,1\n", "column 1"},
        {"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.5x,1,1\n", "column 1"},
        {"arrival,prompt_tokens,output_tokens,prefix_id\n1,2,3,x\n", "prefix id"},
        {"arrival,prompt_tokens,output_tokens\n1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17\n", "16 fields"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        llmem_trace t;
        memset(&t, 0x5a, sizeof t);
        llmem_status st = llmem_trace_parse(bad[i].csv, strlen(bad[i].csv), &t);
        if (st != LLMEM_EFORMAT)
            fail_msg("case %zu: %s, expected EFORMAT (%s)", i, llmem_status_name(st), llmem_error_message());
        if (!strstr(llmem_error_message(), bad[i].mentions))
            fail_msg("case %zu: \"%s\" does not mention \"%s\"", i, llmem_error_message(), bad[i].mentions);
        /* Nothing is handed out on failure. */
        assert_null(t.req);
        assert_int_equal(t.count, 0);
    }
    /* A NUL byte inside the text. */
    const char nul[] = "arrival,prompt_tokens,output_tokens\n1,2\0,3\n";
    llmem_trace t;
    assert_status(llmem_trace_parse(nul, sizeof nul - 1, &t), LLMEM_EFORMAT);
    assert_error_mentions("NUL");
    /* The length bounds the parse: a cut line is parsed as what it is. */
    const char *cut = "arrival,prompt_tokens,output_tokens\n1,2,3\n4,5,6\n";
    assert_status(llmem_trace_parse(cut, strlen(cut) - 4, &t), LLMEM_EFORMAT);
    assert_error_mentions("line 3");
    assert_status(llmem_trace_parse(NULL, 3, &t), LLMEM_EINVAL);
    assert_status(llmem_trace_parse("a", 1, NULL), LLMEM_EINVAL);
    assert_status(llmem_trace_load(NULL, &t), LLMEM_EINVAL);
    assert_status(llmem_trace_load("/no/such/trace.csv", &t), LLMEM_EIO);
    assert_error_mentions("/no/such/trace.csv");
}

static void real_trace(void **state)
{
    (void)state;
    const char *path = test_shared_path("traces/AzureLLMInferenceTrace_code.csv");
    llmem_trace t;
    assert_ok(llmem_trace_load(path, &t));
    /* Its README: 8,819 requests over 3,436 s, mean prompt 2,048, mean output 28. */
    assert_int_equal(t.count, 8819);
    uint64_t prompt = 0, output = 0;
    for (size_t i = 0; i < t.count; i++) {
        if (i) assert_true(t.req[i].arrival_s >= t.req[i - 1].arrival_s);
        prompt += t.req[i].prompt_tokens;
        output += t.req[i].output_tokens;
    }
    assert_true(t.req[0].arrival_s == 0);
    assert_true(t.duration_s > 3435 && t.duration_s < 3437);
    assert_int_equal(llround((double)prompt / (double)t.count), 2048);
    assert_int_equal(llround((double)output / (double)t.count), 28);
    print_message("real trace: %zu requests over %.0f s, mean prompt %.0f, mean output %.0f tokens\n", t.count,
                  t.duration_s, (double)prompt / (double)t.count, (double)output / (double)t.count);
    llmem_trace_free(&t);
}

int main(int argc, char **argv)
{
    /* The Azure trace of the shared folder (test_trace_shared). */
    const struct CMUnitTest shared_tests[] = {
        cmocka_unit_test(real_trace),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(azure_format),
        cmocka_unit_test(simple_format_any_order_and_prefixes),
        cmocka_unit_test(malformed),
    };
    return test_main(argc, argv, "test_trace", TEST_GROUP(tests, NULL, NULL), TEST_GROUP(shared_tests, NULL, NULL),
                     (const char *const[]){"traces/AzureLLMInferenceTrace_code.csv", NULL});
}
