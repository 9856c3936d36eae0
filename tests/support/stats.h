/*
 * stats.h - one getter for each of the library's statistics structs, for
 * the tests: the struct zeroed, filled by the library's get_stats, or the test fails with the library's
 * message. Included by test_util.h.
 *
 *     assert_int_equal(test_pool_stats(p).bytes_in_use, 0);
 *
 * A test that checks get_stats itself (every field written, struct_size
 * honoured) calls the library directly.
 */
#ifndef LLMEM_TEST_STATS_H
#define LLMEM_TEST_STATS_H

#include <string.h>

#include "llmem/llmem.h"

/* static inline T name(const O *o): a zeroed T filled by getter(o, &s). */
#define TEST_STATS_GETTER(name, T, getter, O)                                                   \
    static inline T name(O o)                                                                    \
    {                                                                                            \
        T s;                                                                                     \
        memset(&s, 0, sizeof s);                                                                 \
        assert_ok(getter(o, &s));                                                                \
        return s;                                                                                \
    }

TEST_STATS_GETTER(test_resource_stats, llmem_resource_stats, llmem_resource_get_stats, const llmem_resource *)
TEST_STATS_GETTER(test_os_stats, llmem_os_stats, llmem_os_resource_get_stats, const llmem_resource *)
TEST_STATS_GETTER(test_sim_stats, llmem_sim_stats, llmem_sim_resource_get_stats, const llmem_resource *)
TEST_STATS_GETTER(test_fault_stats, llmem_fault_stats, llmem_fault_resource_get_stats, const llmem_resource *)
TEST_STATS_GETTER(test_tracking_stats, llmem_tracking_stats, llmem_tracking_resource_get_stats, const llmem_resource *)
TEST_STATS_GETTER(test_pool_stats, llmem_pool_stats, llmem_pool_get_stats, const llmem_pool *)
TEST_STATS_GETTER(test_arena_stats, llmem_arena_stats, llmem_arena_get_stats, const llmem_arena *)
TEST_STATS_GETTER(test_kv_stats, llmem_kv_stats, llmem_kv_get_stats, const llmem_kv *)
TEST_STATS_GETTER(test_fixed_stats, llmem_fixed_stats, llmem_fixed_get_stats, const llmem_fixed *)

#endif
