/*
 * llmem/pmr.hpp - a pool as a std::pmr::memory_resource (C++17, header-only).
 *
 *     llmem::pool arena_pool;                          // owns a default host pool
 *     std::pmr::vector<float> v(&arena_pool.resource());
 *     v.resize(1 << 20);                              // memory from llmem
 *
 * or wrap a pool you already have: llmem::pool_resource r(p);
 *
 * Allocation failure throws std::bad_alloc, as memory_resource requires;
 * the llmem status and message stay readable through llmem_error_status() and
 * llmem_error_message(). Only host pools can back C++ containers (they
 * construct objects in the memory): wrapping a device pool throws
 * std::invalid_argument. C stays the language of the library; this header
 * only adapts it.
 */
#ifndef LLMEM_PMR_HPP
#define LLMEM_PMR_HPP

#include <cstddef>
#include <memory_resource>
#include <new>
#include <stdexcept>
#include <string>

#include "llmem/pool.h"

namespace llmem {

class pool_resource : public std::pmr::memory_resource {
public:
    /* p is borrowed and must outlive the resource and every container using it. */
    explicit pool_resource(llmem_pool *p) : pool_(p)
    {
        if (!p) throw std::invalid_argument("llmem::pool_resource: null pool");
        if (llmem_resource_kind(llmem_pool_get_resource(p)) != LLMEM_MEM_HOST)
            throw std::invalid_argument("llmem::pool_resource: C++ objects need a host pool, not device memory");
    }

    llmem_pool *get() const noexcept { return pool_; }

private:
    void *do_allocate(std::size_t bytes, std::size_t alignment) override
    {
        /* memory_resource allows 0 bytes; llmem does not: give one byte. */
        void *p = llmem_pool_alloc_aligned(pool_, bytes ? bytes : 1, alignment, nullptr);
        if (!p) throw std::bad_alloc();
        return p;
    }

    void do_deallocate(void *p, std::size_t, std::size_t) override { llmem_pool_free(pool_, p); }

    bool do_is_equal(const std::pmr::memory_resource &other) const noexcept override
    {
        const auto *o = dynamic_cast<const pool_resource *>(&other);
        return o && o->pool_ == pool_;
    }

    llmem_pool *pool_;
};

/* An owned pool and its memory_resource. */
class pool {
public:
    explicit pool(const llmem_pool_options *opts = nullptr) : pool_(create(opts)), resource_(pool_) {}
    ~pool() { llmem_pool_destroy(pool_); }
    pool(const pool &) = delete;
    pool &operator=(const pool &) = delete;

    llmem_pool *get() const noexcept { return pool_; }
    pool_resource &resource() noexcept { return resource_; }

private:
    static llmem_pool *create(const llmem_pool_options *opts)
    {
        llmem_pool *p = nullptr;
        if (llmem_pool_create(opts, &p) != LLMEM_OK) throw std::runtime_error(std::string("llmem: ") + llmem_error_message());
        return p;
    }

    llmem_pool *pool_;
    pool_resource resource_;
};

} // namespace llmem

#endif /* LLMEM_PMR_HPP */
