/*
 * test_pmr.cpp - llmem/pmr.hpp: std::pmr containers over a pool (run under
 * ASan in make check like every test).
 */
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <csetjmp>
extern "C" {
#include <cmocka.h>
}

#include <memory_resource>
#include <string>
#include <unordered_map>
#include <vector>

#include "llmem/llmem.h"
#include "llmem/pmr.hpp"
#include "llmem/sim_resource.h"

static uint64_t live(llmem_pool *p)
{
    llmem_pool_stats s{};
    llmem_pool_get_stats(p, &s);
    return s.live_allocations;
}

static void containers(void **)
{
    llmem::pool pool;
    auto *mr = &pool.resource();
    {
        std::pmr::vector<int> v(mr);
        for (int i = 0; i < 100000; i++) v.push_back(i);
        long sum = 0;
        for (int x : v) sum += x;
        assert_int_equal(sum, 4999950000L);
        std::pmr::string s("llmem ", mr);
        for (int i = 0; i < 1000; i++) s += "memory ";
        assert_int_equal(s.size(), 6 + 7 * 1000);
        std::pmr::unordered_map<int, std::pmr::string> m(mr);
        for (int i = 0; i < 2000; i++) m.emplace(i, std::pmr::string(100, 'x'));
        assert_int_equal(m.size(), 2000);
        assert_true(live(pool.get()) > 2000);
        assert_true(llmem_pool_owns(pool.get(), v.data()));
        assert_true(llmem_pool_owns(pool.get(), s.data()));
    }
    assert_int_equal(live(pool.get()), 0);
    assert_int_equal(llmem_pool_check(pool.get()), LLMEM_OK);
}

static void alignment_and_zero(void **)
{
    llmem::pool pool;
    std::pmr::memory_resource &mr = pool.resource();
    for (std::size_t a : {8, 16, 64, 256, 4096, 65536}) {
        void *p = mr.allocate(100, a);
        assert_int_equal(reinterpret_cast<std::uintptr_t>(p) % a, 0);
        mr.deallocate(p, 100, a);
    }
    void *z = mr.allocate(0);
    assert_non_null(z);
    mr.deallocate(z, 0);
    assert_int_equal(live(pool.get()), 0);
}

static void equality(void **)
{
    llmem::pool a, b;
    llmem::pool_resource a2(a.get());
    assert_true(a.resource() == a2);
    assert_false(a.resource() == b.resource());
    assert_false(a.resource().is_equal(*std::pmr::new_delete_resource()));
}

static void failure_throws_bad_alloc(void **)
{
    llmem_pool_options o = llmem_pool_options_default();
    o.max_bytes = 8 << 20;
    llmem::pool pool(&o);
    bool thrown = false;
    try {
        std::pmr::vector<char> v(64 << 20, 'x', &pool.resource());
    } catch (const std::bad_alloc &) {
        thrown = true;
    }
    assert_true(thrown);
    assert_int_equal(llmem_error_status(), LLMEM_ENOMEM);
    assert_int_equal(live(pool.get()), 0);
}

static void device_pools_are_refused(void **)
{
    llmem_resource *sim = nullptr;
    assert_int_equal(llmem_sim_resource_create(nullptr, &sim), LLMEM_OK);
    llmem_pool_options o = llmem_pool_options_default();
    o.resource = sim;
    llmem_pool *p = nullptr;
    assert_int_equal(llmem_pool_create(&o, &p), LLMEM_OK);
    bool thrown = false;
    try {
        llmem::pool_resource r(p);
    } catch (const std::invalid_argument &) {
        thrown = true;
    }
    assert_true(thrown);
    thrown = false;
    try {
        llmem::pool_resource r(nullptr);
    } catch (const std::invalid_argument &) {
        thrown = true;
    }
    assert_true(thrown);
    llmem_pool_destroy(p);
    llmem_resource_destroy(sim);
}

int main()
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(containers),
        cmocka_unit_test(alignment_and_zero),
        cmocka_unit_test(equality),
        cmocka_unit_test(failure_throws_bad_alloc),
        cmocka_unit_test(device_pools_are_refused),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
