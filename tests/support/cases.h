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

/* Define `name`, a cmocka case that runs the statement `call`. */
#define TEST_CASE(name, call)                                                                    \
    static void name(void **state)                                                               \
    {                                                                                            \
        (void)state;                                                                             \
        call;                                                                                    \
    }

#endif
