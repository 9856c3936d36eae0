/*
 * test_stats.c - schemas and the exporter: JSON objects, Prometheus
 * families, escaping, struct_size versioning, buffer contracts, custom
 * schemas with double fields.
 */
#include <math.h>

#include "test_util.h"

/* A stats struct of our own, to prove the exporter serves any schema. */
typedef struct my_stats {
    size_t struct_size;
    uint64_t hits_total;
    double ratio;
    uint64_t level;
} my_stats;

static const llmem_stat_field my_fields[] = {
    {"hits_total", "Hits.", LLMEM_METRIC_COUNTER, LLMEM_VALUE_U64, offsetof(my_stats, hits_total)},
    {"ratio", "A ratio.", LLMEM_METRIC_GAUGE, LLMEM_VALUE_DOUBLE, offsetof(my_stats, ratio)},
    {"level", "A level.", LLMEM_METRIC_GAUGE, LLMEM_VALUE_U64, offsetof(my_stats, level)},
};
static const llmem_stats_schema my_schema = {"mine", sizeof(my_stats), 3, my_fields};

static void json_object_has_type_labels_and_fields(void **state)
{
    (void)state;
    my_stats s = {sizeof s, 42, 0.25, 7};
    llmem_label lb[] = {{"pool", "kv"}, {"device", "0"}};
    char buf[512];
    size_t len = 0;
    assert_ok(llmem_stats_to_json(&my_schema, &s, lb, 2, buf, sizeof buf, &len));
    assert_string_equal(buf, "{\"type\":\"mine\",\"labels\":{\"pool\":\"kv\",\"device\":\"0\"},"
                             "\"hits_total\":42,\"ratio\":0.25,\"level\":7}");
    assert_int_equal(len, strlen(buf));
}

static void struct_size_limits_fields(void **state)
{
    (void)state;
    /* A caller compiled against an older, shorter struct. */
    my_stats s = {offsetof(my_stats, ratio), 5, 1.5, 9};
    char buf[256];
    assert_ok(llmem_stats_to_json(&my_schema, &s, NULL, 0, buf, sizeof buf, NULL));
    assert_non_null(strstr(buf, "\"hits_total\":5"));
    assert_null(strstr(buf, "ratio"));
    assert_null(strstr(buf, "level"));
    /* And a component filling a shorter struct writes only that much. */
    llmem_resource_stats rs;
    memset(&rs, 0xAB, sizeof rs);
    rs.struct_size = offsetof(llmem_resource_stats, mapped_peak_bytes);
    assert_ok(llmem_resource_get_stats(llmem_resource_default(), &rs));
    assert_int_equal(rs.struct_size, offsetof(llmem_resource_stats, mapped_peak_bytes));
    unsigned char *tail = (unsigned char *)&rs + offsetof(llmem_resource_stats, mapped_peak_bytes);
    for (size_t i = 0; i < sizeof rs - offsetof(llmem_resource_stats, mapped_peak_bytes); i++)
        assert_int_equal(tail[i], 0xAB);
}

static void escaping_in_both_formats(void **state)
{
    (void)state;
    my_stats s = {sizeof s, 1, 0, 0};
    llmem_label lb[] = {{"name", "a\"b\\c\nd\te\x01"}};
    char buf[512];
    assert_ok(llmem_stats_to_json(&my_schema, &s, lb, 1, buf, sizeof buf, NULL));
    assert_non_null(strstr(buf, "\"name\":\"a\\\"b\\\\c\\nd\\te\\u0001\""));
    llmem_exporter *ex;
    assert_ok(llmem_exporter_create(LLMEM_EXPORT_PROMETHEUS, &ex));
    assert_ok(llmem_exporter_add(ex, &my_schema, &s, lb, 1));
    assert_ok(llmem_exporter_render(ex, buf, sizeof buf, NULL));
    assert_non_null(strstr(buf, "llmem_mine_hits_total{name=\"a\\\"b\\\\c\\nd\te\x01\"} 1\n"));
    llmem_exporter_destroy(ex);
}

static void non_finite_doubles(void **state)
{
    (void)state;
    my_stats s = {sizeof s, 0, NAN, 0};
    char buf[512];
    assert_ok(llmem_stats_to_json(&my_schema, &s, NULL, 0, buf, sizeof buf, NULL));
    assert_non_null(strstr(buf, "\"ratio\":null"));
    llmem_exporter *ex;
    assert_ok(llmem_exporter_create(LLMEM_EXPORT_PROMETHEUS, &ex));
    assert_ok(llmem_exporter_add(ex, &my_schema, &s, NULL, 0));
    s.ratio = -INFINITY;
    assert_ok(llmem_exporter_add(ex, &my_schema, &s, NULL, 0));
    assert_ok(llmem_exporter_render(ex, buf, sizeof buf, NULL));
    assert_non_null(strstr(buf, "llmem_mine_ratio NaN\n"));
    assert_non_null(strstr(buf, "llmem_mine_ratio -Inf\n"));
    llmem_exporter_destroy(ex);
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

static void prometheus_groups_families(void **state)
{
    (void)state;
    llmem_arena *a, *b;
    assert_ok(llmem_arena_create(NULL, &a));
    assert_ok(llmem_arena_create(NULL, &b));
    assert_non_null(llmem_arena_alloc(a, 100, 0, NULL));
    llmem_arena_stats sa = {0}, sb = {0};
    assert_ok(llmem_arena_get_stats(a, &sa));
    assert_ok(llmem_arena_get_stats(b, &sb));
    my_stats m = {sizeof m, 3, 0.5, 1};
    llmem_exporter *ex;
    assert_ok(llmem_exporter_create(LLMEM_EXPORT_PROMETHEUS, &ex));
    llmem_label la[] = {{"arena", "a"}}, lb[] = {{"arena", "b"}};
    assert_ok(llmem_exporter_add(ex, llmem_arena_stats_schema(), &sa, la, 1));
    assert_ok(llmem_exporter_add(ex, &my_schema, &m, NULL, 0));
    assert_ok(llmem_exporter_add(ex, llmem_arena_stats_schema(), &sb, lb, 1));
    size_t len;
    assert_status(llmem_exporter_render(ex, NULL, 0, &len), LLMEM_ERANGE);
    char *buf = malloc(len + 1);
    assert_non_null(buf);
    assert_ok(llmem_exporter_render(ex, buf, len + 1, NULL));
    assert_int_equal(strlen(buf), len);
    /* One HELP and TYPE per family, however many objects. */
    assert_int_equal(count(buf, "# HELP llmem_arena_used_bytes "), 1);
    assert_int_equal(count(buf, "# TYPE llmem_arena_used_bytes gauge\n"), 1);
    assert_int_equal(count(buf, "# TYPE llmem_arena_allocs_total counter\n"), 1);
    assert_int_equal(count(buf, "llmem_arena_allocs_total{arena=\"a\"} 1\n"), 1);
    assert_int_equal(count(buf, "llmem_arena_allocs_total{arena=\"b\"} 0\n"), 1);
    assert_int_equal(count(buf, "llmem_mine_hits_total 3\n"), 1);
    /* Both arena samples follow their family's TYPE line, before "mine". */
    const char *type = strstr(buf, "# TYPE llmem_arena_allocs_total");
    const char *sample_b = strstr(buf, "llmem_arena_allocs_total{arena=\"b\"}");
    assert_true(type < sample_b && sample_b < strstr(buf, "# HELP llmem_mine_hits_total"));
    /* Every line is a comment or "name{labels} value". */
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        assert_true(strncmp(line, "llmem_", 6) == 0);
        assert_non_null(strchr(line, ' '));
    }
    free(buf);
    /* The stream form prints the same document. */
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_ok(llmem_exporter_write(ex, f));
    assert_int_equal((size_t)ftell(f), len);
    fclose(f);
    llmem_exporter_destroy(ex);
    llmem_arena_destroy(a);
    llmem_arena_destroy(b);
}

static void json_document_is_an_array(void **state)
{
    (void)state;
    llmem_exporter *ex;
    assert_ok(llmem_exporter_create(LLMEM_EXPORT_JSON, &ex));
    char buf[1024];
    assert_ok(llmem_exporter_render(ex, buf, sizeof buf, NULL));
    assert_string_equal(buf, "[]\n");
    my_stats m = {sizeof m, 1, 2, 3};
    assert_ok(llmem_exporter_add(ex, &my_schema, &m, NULL, 0));
    m.hits_total = 9;
    assert_ok(llmem_exporter_add(ex, &my_schema, &m, NULL, 0));
    assert_ok(llmem_exporter_render(ex, buf, sizeof buf, NULL));
    assert_string_equal(buf, "[{\"type\":\"mine\",\"labels\":{},\"hits_total\":1,\"ratio\":2,\"level\":3},"
                             "{\"type\":\"mine\",\"labels\":{},\"hits_total\":9,\"ratio\":2,\"level\":3}]\n");
    llmem_exporter_clear(ex);
    assert_ok(llmem_exporter_render(ex, buf, sizeof buf, NULL));
    assert_string_equal(buf, "[]\n");
    llmem_exporter_destroy(ex);
}

static void snapshots_are_copies(void **state)
{
    (void)state;
    my_stats m = {sizeof m, 1, 0, 0};
    char key[8] = "k", val[8] = "v1";
    llmem_label lb[] = {{key, val}};
    llmem_exporter *ex;
    assert_ok(llmem_exporter_create(LLMEM_EXPORT_JSON, &ex));
    assert_ok(llmem_exporter_add(ex, &my_schema, &m, lb, 1));
    m.hits_total = 99;
    strcpy(val, "v2");
    char buf[256];
    assert_ok(llmem_exporter_render(ex, buf, sizeof buf, NULL));
    assert_non_null(strstr(buf, "\"hits_total\":1,"));
    assert_non_null(strstr(buf, "\"k\":\"v1\""));
    llmem_exporter_destroy(ex);
}

static void buffer_contract(void **state)
{
    (void)state;
    my_stats m = {sizeof m, 1, 0, 0};
    char full[256];
    size_t need;
    assert_ok(llmem_stats_to_json(&my_schema, &m, NULL, 0, full, sizeof full, &need));
    char small[10];
    size_t len = 0;
    assert_status(llmem_stats_to_json(&my_schema, &m, NULL, 0, small, sizeof small, &len), LLMEM_ERANGE);
    assert_int_equal(len, need);
    assert_int_equal(strlen(small), sizeof small - 1); /* truncated, NUL-terminated */
    assert_memory_equal(small, full, sizeof small - 1);
    char *exact = malloc(need + 1);
    assert_ok(llmem_stats_to_json(&my_schema, &m, NULL, 0, exact, need + 1, NULL));
    assert_string_equal(exact, full);
    /* One byte short of room for the NUL. */
    assert_status(llmem_stats_to_json(&my_schema, &m, NULL, 0, exact, need, NULL), LLMEM_ERANGE);
    free(exact);
}

static void bad_input(void **state)
{
    (void)state;
    my_stats m = {sizeof m, 1, 0, 0};
    char buf[128];
    llmem_label bad_key[] = {{"9lives", "x"}}, dash[] = {{"a-b", "x"}}, null_val[] = {{"k", NULL}};
    assert_status(llmem_stats_to_json(NULL, &m, NULL, 0, buf, sizeof buf, NULL), LLMEM_EINVAL);
    assert_status(llmem_stats_to_json(&my_schema, NULL, NULL, 0, buf, sizeof buf, NULL), LLMEM_EINVAL);
    assert_status(llmem_stats_to_json(&my_schema, &m, bad_key, 1, buf, sizeof buf, NULL), LLMEM_EINVAL);
    assert_status(llmem_stats_to_json(&my_schema, &m, dash, 1, buf, sizeof buf, NULL), LLMEM_EINVAL);
    assert_status(llmem_stats_to_json(&my_schema, &m, null_val, 1, buf, sizeof buf, NULL), LLMEM_EINVAL);
    assert_status(llmem_stats_to_json(&my_schema, &m, NULL, 2, buf, sizeof buf, NULL), LLMEM_EINVAL);
    llmem_stats_schema broken = my_schema;
    broken.name = "has space";
    assert_status(llmem_stats_to_json(&broken, &m, NULL, 0, buf, sizeof buf, NULL), LLMEM_EINVAL);
    llmem_exporter *ex = (llmem_exporter *)1;
    assert_status(llmem_exporter_create((llmem_export_format)7, &ex), LLMEM_EINVAL);
    assert_null(ex);
    assert_status(llmem_exporter_create(LLMEM_EXPORT_JSON, NULL), LLMEM_EINVAL);
    assert_status(llmem_exporter_add(NULL, &my_schema, &m, NULL, 0), LLMEM_EINVAL);
    assert_status(llmem_exporter_render(NULL, buf, sizeof buf, NULL), LLMEM_EINVAL);
    assert_status(llmem_exporter_write(NULL, stdout), LLMEM_EINVAL);
    assert_ok(llmem_exporter_create(LLMEM_EXPORT_JSON, &ex));
    assert_status(llmem_exporter_add(ex, &my_schema, &m, bad_key, 1), LLMEM_EINVAL);
    assert_status(llmem_exporter_write(ex, NULL), LLMEM_EINVAL);
    llmem_exporter_destroy(ex);
    llmem_exporter_destroy(NULL);
    llmem_exporter_clear(NULL);
    assert_int_equal(llmem_stats_fill_size(0, 64), 64);
    assert_int_equal(llmem_stats_fill_size(32, 64), 32);
    assert_int_equal(llmem_stats_fill_size(1000, 64), 64);
}

static void every_builtin_schema_is_well_formed(void **state)
{
    (void)state;
    const llmem_stats_schema *schemas[] = {
        llmem_resource_stats_schema(), llmem_os_stats_schema(), llmem_sim_stats_schema(),
        llmem_tracking_stats_schema(), llmem_arena_stats_schema(), llmem_fixed_stats_schema(),
        llmem_fault_stats_schema(),
    };
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        const llmem_stats_schema *s = schemas[i];
        assert_non_null(s->name);
        assert_true(s->field_count > 0);
        size_t prev_end = sizeof(size_t); /* struct_size comes first */
        for (size_t f = 0; f < s->field_count; f++) {
            const llmem_stat_field *fd = &s->fields[f];
            size_t w = fd->type == LLMEM_VALUE_DOUBLE ? sizeof(double) : sizeof(uint64_t);
            assert_true(fd->offset >= prev_end);
            assert_true(fd->offset + w <= s->struct_size);
            prev_end = fd->offset + w;
            size_t nl = strlen(fd->name);
            bool total = nl > 6 && strcmp(fd->name + nl - 6, "_total") == 0;
            /* Prometheus convention: counters, and only counters, end in _total. */
            if (total != (fd->kind == LLMEM_METRIC_COUNTER))
                fail_msg("%s.%s: counters, and only counters, end in _total", s->name, fd->name);
            assert_true(fd->help && fd->help[0]);
        }
        /* Every field of the struct is described. */
        assert_int_equal(prev_end, s->struct_size);
    }
}

/* A schema with a prefix names its metrics prefix + field; histograms
 * render as Prometheus's _bucket/_sum/_count, grouped by name, and as JSON;
 * malformed ones are refused. */
static void prefix_and_histograms(void **state)
{
    (void)state;
    typedef struct { size_t struct_size; uint64_t running; uint64_t hits_total; } vstats;
    static const llmem_stat_field vf[] = {
        {"running", "Running.", LLMEM_METRIC_GAUGE, LLMEM_VALUE_U64, offsetof(vstats, running)},
        {"hits_total", "Hits.", LLMEM_METRIC_COUNTER, LLMEM_VALUE_U64, offsetof(vstats, hits_total)},
    };
    static const llmem_stats_schema vs = {"vllm", sizeof(vstats), 2, vf, "vllm:"};
    vstats v = {sizeof v, 3, 7};
    llmem_label lab[] = {{"model_name", "m\"x"}};
    const double le[] = {0.005, 0.1, 20};
    const uint64_t cum[] = {1, 4, 4};
    llmem_histogram_export h = {"vllm:ttft_seconds", "TTFT.", 3, le, cum, 5, 12.5};
    llmem_exporter *ex;
    assert_ok(llmem_exporter_create(LLMEM_EXPORT_PROMETHEUS, &ex));
    assert_ok(llmem_exporter_add(ex, &vs, &v, lab, 1));
    assert_ok(llmem_exporter_add_histogram(ex, &h, lab, 1));
    llmem_label other[] = {{"model_name", "n"}};
    assert_ok(llmem_exporter_add_histogram(ex, &h, other, 1));
    char buf[4096];
    assert_ok(llmem_exporter_render(ex, buf, sizeof buf, NULL));
    assert_non_null(strstr(buf, "# TYPE vllm:running gauge\nvllm:running{model_name=\"m\\\"x\"} 3\n"));
    assert_non_null(strstr(buf, "# TYPE vllm:hits_total counter\nvllm:hits_total{model_name=\"m\\\"x\"} 7\n"));
    assert_non_null(strstr(buf, "# HELP vllm:ttft_seconds TTFT.\n# TYPE vllm:ttft_seconds histogram\n"
                                "vllm:ttft_seconds_bucket{model_name=\"m\\\"x\",le=\"0.005\"} 1\n"
                                "vllm:ttft_seconds_bucket{model_name=\"m\\\"x\",le=\"0.1\"} 4\n"
                                "vllm:ttft_seconds_bucket{model_name=\"m\\\"x\",le=\"20\"} 4\n"
                                "vllm:ttft_seconds_bucket{model_name=\"m\\\"x\",le=\"+Inf\"} 5\n"
                                "vllm:ttft_seconds_sum{model_name=\"m\\\"x\"} 12.5\n"
                                "vllm:ttft_seconds_count{model_name=\"m\\\"x\"} 5\n"
                                "vllm:ttft_seconds_bucket{model_name=\"n\",le=\"0.005\"} 1\n"));
    /* One HELP for the name, however many were added. */
    assert_null(strstr(strstr(buf, "# HELP vllm:ttft_seconds") + 1, "# HELP vllm:ttft_seconds"));
    llmem_exporter_destroy(ex);

    assert_ok(llmem_exporter_create(LLMEM_EXPORT_JSON, &ex));
    assert_ok(llmem_exporter_add_histogram(ex, &h, NULL, 0));
    assert_ok(llmem_exporter_render(ex, buf, sizeof buf, NULL));
    assert_string_equal(buf, "[{\"type\":\"histogram\",\"name\":\"vllm:ttft_seconds\",\"labels\":{},"
                             "\"le\":[0.005,0.1,20],\"cumulative\":[1,4,4],\"count\":5,\"sum\":12.5}]\n");
    /* Refused: bounds out of order, counts not cumulative, above count, a bad name, a bad prefix. */
    const double bad_le[] = {0.1, 0.1, 20};
    llmem_histogram_export b = h;
    b.le = bad_le;
    assert_int_equal(llmem_exporter_add_histogram(ex, &b, NULL, 0), LLMEM_EINVAL);
    const uint64_t bad_cum[] = {4, 1, 4};
    b = h;
    b.cumulative = bad_cum;
    assert_int_equal(llmem_exporter_add_histogram(ex, &b, NULL, 0), LLMEM_EINVAL);
    b = h;
    b.count = 3;
    assert_int_equal(llmem_exporter_add_histogram(ex, &b, NULL, 0), LLMEM_EINVAL);
    b = h;
    b.name = "9bad name";
    assert_int_equal(llmem_exporter_add_histogram(ex, &b, NULL, 0), LLMEM_EINVAL);
    assert_int_equal(llmem_exporter_add_histogram(ex, NULL, NULL, 0), LLMEM_EINVAL);
    static const llmem_stats_schema badp = {"vllm", sizeof(vstats), 2, vf, "vllm space"};
    assert_int_equal(llmem_exporter_add(ex, &badp, &v, NULL, 0), LLMEM_EINVAL);
    llmem_exporter_destroy(ex);
}

/* The fault resource's figures through the exporter: a soak reads
 * llmem_fault_injected_total to know its faults fired. */
static void fault_stats_export(void **state)
{
    (void)state;
    llmem_resource *sim, *fault;
    assert_ok(llmem_sim_resource_create(NULL, &sim));
    llmem_fault_options fo = llmem_fault_options_default();
    fo.fail_nth = 1;
    fo.ops = LLMEM_FAULT_OP_COMMIT;
    assert_ok(llmem_fault_resource_create(sim, &fo, &fault));
    void *p;
    assert_ok(llmem_resource_map(fault, 1 << 16, 0, LLMEM_MAP_UNCOMMITTED, &p));
    assert_int_equal(llmem_resource_commit(fault, p, 4096), LLMEM_ENOMEM);
    assert_ok(llmem_resource_commit(fault, p, 4096));
    llmem_fault_stats fs = {sizeof fs};
    assert_ok(llmem_fault_resource_get_stats(fault, &fs));
    llmem_exporter *ex;
    assert_ok(llmem_exporter_create(LLMEM_EXPORT_PROMETHEUS, &ex));
    assert_ok(llmem_exporter_add(ex, llmem_fault_stats_schema(), &fs, NULL, 0));
    char buf[2048];
    assert_ok(llmem_exporter_render(ex, buf, sizeof buf, NULL));
    assert_non_null(strstr(buf, "\nllmem_fault_injected_total 1\n"));
    assert_non_null(strstr(buf, "\nllmem_fault_calls_total 2\n"));
    assert_non_null(strstr(buf, "# TYPE llmem_fault_injected_total counter\n"));
    llmem_exporter_destroy(ex);
    assert_ok(llmem_resource_unmap(fault, p, 1 << 16, 4096));
    llmem_resource_destroy(fault);
    llmem_resource_destroy(sim);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_object_has_type_labels_and_fields),
        cmocka_unit_test(struct_size_limits_fields),
        cmocka_unit_test(escaping_in_both_formats),
        cmocka_unit_test(non_finite_doubles),
        cmocka_unit_test(prometheus_groups_families),
        cmocka_unit_test(json_document_is_an_array),
        cmocka_unit_test(snapshots_are_copies),
        cmocka_unit_test(buffer_contract),
        cmocka_unit_test(bad_input),
        cmocka_unit_test(every_builtin_schema_is_well_formed),
        cmocka_unit_test(fault_stats_export),
        cmocka_unit_test(prefix_and_histograms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
