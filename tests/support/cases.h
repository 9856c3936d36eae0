/*
 * cases.h - families of cmocka cases that differ by an argument: one body,
 * taking the argument, and one named case a row.
 *
 *     static void decode_grow(bool reserved) { ... }
 *     TEST_CASE(decode_grow_plain, decode_grow(false))
 *     TEST_CASE(decode_grow_reserved, decode_grow(true))
 *     ... cmocka_unit_test(decode_grow_plain), cmocka_unit_test(decode_grow_reserved) ...
 *
 * Each row is a case of its own, so cmocka names the one that failed.
 */
#ifndef LLMEM_TEST_CASES_H
#define LLMEM_TEST_CASES_H

#include <stdint.h>

/* Define `name`, a cmocka case that runs the statement `call`. */
#define TEST_CASE(name, call)                                                                    \
    static void name(void **state)                                                               \
    {                                                                                            \
        (void)state;                                                                             \
        call;                                                                                    \
    }

/* A table row as a cmocka case of its own, named `name` (so a failure
 * says which row): fn gets the row as *state.
 *
 *     static void contract_case(void **state) { const contract_row *row = *state; ... }
 *     TEST_ROW("cuda_contract", contract_case, &contract_rows[0]),
 */
#define TEST_ROW(name, fn, row) {(name), (fn), NULL, NULL, (void *)(uintptr_t)(row)}

/* A case run on a fresh os resource (its counters at zero): the body
 * below the macro gets os and its page size; after it, os must hold no
 * mapping, no mapped and no committed byte, and is destroyed. test_util.h first.
 *
 *     TEST_OS_CASE(limit_caps_maps)
 *     {
 *         llmem_resource *l = new_limit(os, MiB, LLMEM_LIMIT_COMMITTED);
 *         ...
 *         llmem_resource_destroy(l);
 *     }
 */
#define TEST_OS_CASE(name)                                                                       \
    static void name##_on(llmem_resource *os, size_t page);                                      \
    static void name(void **state)                                                               \
    {                                                                                            \
        (void)state;                                                                             \
        llmem_resource *os = test_os_new();                                                      \
        name##_on(os, llmem_resource_granularity(os));                                           \
        llmem_resource_stats end_ = test_resource_stats(os);                                     \
        assert_int_equal(end_.mappings, 0);                                                      \
        assert_int_equal(end_.mapped_bytes, 0);                                                  \
        assert_int_equal(end_.committed_bytes, 0);                                               \
        llmem_resource_destroy(os);                                                              \
    }                                                                                            \
    static void name##_on(__attribute__((unused)) llmem_resource *os, __attribute__((unused)) size_t page)

#endif
