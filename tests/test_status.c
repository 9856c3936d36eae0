/*
 * test_status.c - status codes, the per-thread last error, logging, version.
 */
#include <pthread.h>

#include "test_util.h"
#include "support/log_capture.h"

static void status_names_are_complete_and_distinct(void **state)
{
    (void)state;
    assert_int_equal(LLMEM_OK, 0);
    for (int i = 0; i < LLMEM_STATUS_COUNT_; i++) {
        const char *name = llmem_status_name((llmem_status)i);
        const char *text = llmem_status_str((llmem_status)i);
        assert_non_null(name);
        assert_true(strncmp(name, "LLMEM_", 6) == 0);
        assert_non_null(strstr(text, name)); /* "NAME: description" */
        assert_true(strlen(text) > strlen(name) + 3);
        for (int j = 0; j < i; j++) assert_string_not_equal(name, llmem_status_name((llmem_status)j));
    }
    assert_string_equal(llmem_status_name((llmem_status)LLMEM_STATUS_COUNT_), "LLMEM_E?");
    assert_string_equal(llmem_status_name((llmem_status)-1), "LLMEM_E?");
    assert_non_null(strstr(llmem_status_str((llmem_status)9999), "unknown"));
    assert_string_equal(llmem_status_name(LLMEM_ENOMEM), "LLMEM_ENOMEM");
}

static void failing_call_leaves_message_and_status(void **state)
{
    (void)state;
    llmem_error_clear();
    assert_string_equal(llmem_error_message(), "");
    assert_int_equal(llmem_error_status(), LLMEM_OK);
    void *p = (void *)1;
    assert_status(llmem_resource_map(llmem_resource_default(), 0, 0, 0, &p), LLMEM_EINVAL);
    assert_null(p);
    assert_int_equal(llmem_error_status(), LLMEM_EINVAL);
    assert_error_mentions("size 0");
    assert_error_mentions("os"); /* names the resource */
    /* A successful call does not clear it. */
    assert_ok(llmem_resource_map(llmem_resource_default(), 4096, 0, 0, &p));
    assert_int_equal(llmem_error_status(), LLMEM_EINVAL);
    assert_ok(llmem_resource_unmap(llmem_resource_default(), p, 4096, 4096));
    llmem_error_clear();
    assert_string_equal(llmem_error_message(), "");
}

/* The names before llmem_<thing>_<verb> (status.h keeps them one minor
 * release, deprecated): the same functions, so each old name sees and
 * changes exactly what its new name does. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static void deprecated_error_names_are_the_same_functions(void **state)
{
    (void)state;
    llmem_error_clear();
    assert_int_equal(llmem_set_error(LLMEM_ERANGE, "old name %d", 7), LLMEM_ERANGE);
    assert_int_equal(llmem_error_status(), LLMEM_ERANGE);
    assert_string_equal(llmem_error_message(), "old name 7");
    assert_string_equal(llmem_last_error(), "old name 7");
    assert_int_equal(llmem_last_status(), LLMEM_ERANGE);
    llmem_error_set(LLMEM_EINVAL, "new name");
    assert_string_equal(llmem_last_error(), "new name");
    llmem_clear_error();
    assert_string_equal(llmem_error_message(), "");
    assert_int_equal(llmem_error_status(), LLMEM_OK);
}
#pragma GCC diagnostic pop

static void *other_thread_fails(void *arg)
{
    (void)arg;
    llmem_arena_alloc(NULL, 1, 0, NULL);
    return strstr(llmem_error_message(), "null arena") ? (void *)1 : NULL;
}

static void last_error_is_per_thread(void **state)
{
    (void)state;
    llmem_error_clear();
    pthread_t t;
    void *ok = NULL;
    assert_int_equal(pthread_create(&t, NULL, other_thread_fails, NULL), 0);
    assert_int_equal(pthread_join(t, &ok), 0);
    assert_non_null(ok);
    assert_string_equal(llmem_error_message(), ""); /* untouched in this thread */
}

static void log_sink_receives_misuse_and_honours_level(void **state)
{
    (void)state;
    static test_log_capture c;
    test_log_capture_start(&c, LLMEM_LOG_WARN);
    assert_int_equal(llmem_log_level_get(), LLMEM_LOG_WARN);
    llmem_fixed_options o = llmem_fixed_options_default();
    o.name = "logged";
    o.block_size = 32;
    o.checked = true;
    llmem_fixed *p;
    assert_ok(llmem_fixed_create(&o, &p));
    void *b = llmem_fixed_alloc(p, NULL);
    assert_non_null(b);
    assert_ok(llmem_fixed_free(p, b));
    assert_status(llmem_fixed_free(p, b), LLMEM_EDOUBLEFREE);
    assert_int_equal(c.count, 1);
    assert_int_equal(c.level, LLMEM_LOG_WARN);
    assert_non_null(strstr(c.last, "logged"));
    assert_non_null(strstr(c.last, "double free"));
    /* Above the threshold: nothing reaches the sink. */
    llmem_log_set(test_log_capture_sink, &c, LLMEM_LOG_ERROR);
    assert_status(llmem_fixed_free(p, b), LLMEM_EDOUBLEFREE);
    assert_int_equal(c.count, 1);
    llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
    assert_status(llmem_fixed_free(p, b), LLMEM_EDOUBLEFREE);
    assert_int_equal(c.count, 1);
    llmem_fixed_destroy(p);
}

static void version_matches_headers(void **state)
{
    (void)state;
    assert_string_equal(llmem_version(), LLMEM_VERSION_STRING);
    char expect[32];
    snprintf(expect, sizeof expect, "%d.%d.%d", LLMEM_VERSION_MAJOR, LLMEM_VERSION_MINOR, LLMEM_VERSION_PATCH);
    assert_string_equal(llmem_version(), expect);
    assert_non_null(strstr(llmem_build_info(), LLMEM_VERSION_STRING));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(status_names_are_complete_and_distinct),
        cmocka_unit_test(failing_call_leaves_message_and_status),
        cmocka_unit_test(deprecated_error_names_are_the_same_functions),
        cmocka_unit_test(last_error_is_per_thread),
        cmocka_unit_test(log_sink_receives_misuse_and_honours_level),
        cmocka_unit_test(version_matches_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
