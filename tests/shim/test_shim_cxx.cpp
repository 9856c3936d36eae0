// test_shim_cxx.cpp - libllmem-malloc.so's C++ operator new and delete
// (src/shim/new_delete.c), run under LD_PRELOAD: every replaceable form is
// the shim's (not libstdc++'s), serves and frees blocks of every size and
// alignment, across threads, and fails as the standard says (the
// new_handler loop, std::bad_alloc, nullptr for nothrow).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include <dlfcn.h>
#include <malloc.h>

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <cmocka.h>
}

// Every replaceable form, by its Itanium name.
static const char *const forms[] = {
    "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t", "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t", "_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZnamSt11align_val_tRKSt9nothrow_t",
    "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm", "_ZdlPvRKSt9nothrow_t", "_ZdaPvRKSt9nothrow_t",
    "_ZdlPvSt11align_val_t", "_ZdaPvSt11align_val_t", "_ZdlPvmSt11align_val_t", "_ZdaPvmSt11align_val_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t", "_ZdaPvSt11align_val_tRKSt9nothrow_t",
};

// The shim's, not libstdc++'s: without new_delete.c these resolve there.
static void every_form_is_the_shims(void **)
{
    for (const char *name : forms) {
        void *f = dlsym(RTLD_DEFAULT, name);
        if (!f) fail_msg("%s is not defined in the process", name);
        Dl_info info;
        assert_true(dladdr(f, &info) != 0);
        if (!std::strstr(info.dli_fname, "libllmem-malloc"))
            fail_msg("%s comes from %s, not libllmem-malloc.so", name, info.dli_fname);
    }
}

// A block the shim knows (malloc_usable_size answers for it), written whole.
static void check_block(void *p, std::size_t n, std::size_t align)
{
    assert_non_null(p);
    if (align) assert_int_equal(reinterpret_cast<std::uintptr_t>(p) % align, 0);
    assert_true(malloc_usable_size(p) >= (n ? n : 1));
    std::memset(p, 0xa5, n);
}

static void every_form_allocates_and_frees(void **)
{
    const std::size_t sizes[] = {0, 1, 8, 24, 100, 1000, 4096, 5000, 65536, 1 << 20, 5 << 20};
    for (std::size_t n : sizes) {
        void *a = ::operator new(n);
        check_block(a, n, 16);
        ::operator delete(a);
        void *b = ::operator new[](n);
        check_block(b, n, 16);
        ::operator delete[](b);
        void *c = ::operator new(n, std::nothrow);
        check_block(c, n, 16);
        ::operator delete(c, std::nothrow);
        void *d = ::operator new[](n, std::nothrow);
        check_block(d, n, 16);
        ::operator delete[](d, std::nothrow);
        void *e = ::operator new(n);
        ::operator delete(e, n); // sized
        void *f = ::operator new[](n);
        ::operator delete[](f, n);
        for (std::size_t al = 32; al <= (std::size_t)1 << 21; al <<= 3) {
            std::align_val_t av{al};
            void *g = ::operator new(n, av);
            check_block(g, n, al);
            ::operator delete(g, av);
            void *h = ::operator new[](n, av);
            check_block(h, n, al);
            ::operator delete[](h, av);
            void *i = ::operator new(n, av, std::nothrow);
            check_block(i, n, al);
            ::operator delete(i, av, std::nothrow);
            void *j = ::operator new[](n, av, std::nothrow);
            check_block(j, n, al);
            ::operator delete[](j, av, std::nothrow);
            void *k = ::operator new(n, av);
            ::operator delete(k, n, av); // sized aligned
            void *l = ::operator new[](n, av);
            ::operator delete[](l, n, av);
        }
    }
    ::operator delete(nullptr);
    ::operator delete[](nullptr);
    // Ordinary C++: containers and over-aligned types.
    struct alignas(256) wide {
        char c[300];
    };
    std::vector<int> v;
    for (int i = 0; i < 100000; i++) v.push_back(i);
    for (int i = 0; i < 100000; i++) assert_int_equal(v[(std::size_t)i], i);
    wide *w = new wide[7];
    assert_int_equal(reinterpret_cast<std::uintptr_t>(w) % 256, 0);
    delete[] w;
}

// Allocated in one thread, deleted in another, and back.
static void new_and_delete_across_threads(void **)
{
    enum { N = 20000 };
    std::vector<char *> blocks(N);
    std::thread t([&] {
        for (int i = 0; i < N; i++) {
            blocks[(std::size_t)i] = new char[(std::size_t)(16 + i % 2000)];
            blocks[(std::size_t)i][0] = (char)i;
        }
    });
    t.join();
    std::thread u([&] {
        for (int i = 0; i < N; i++) {
            assert_int_equal(blocks[(std::size_t)i][0], (char)i);
            delete[] blocks[(std::size_t)i];
        }
    });
    u.join();
}

static int handler_calls;
static void handler_gives_up(void)
{
    if (++handler_calls == 2) std::set_new_handler(nullptr);
}

// Whether f() throws std::bad_alloc.
template <typename F> static bool throws_bad_alloc(F f)
{
    try {
        f();
    } catch (const std::bad_alloc &) {
        return true;
    }
    return false;
}

// What cannot be had: std::bad_alloc from the throwing forms, after the
// new_handler was called until it uninstalled itself; nullptr from the
// nothrow forms.
static void failure_is_bad_alloc_or_nullptr(void **)
{
    const std::size_t huge = (std::size_t)1 << 62;
    auto new_huge = [&] {
        void *p = ::operator new(huge);
        ::operator delete(p);
    };
    assert_true(throws_bad_alloc(new_huge));
    assert_true(throws_bad_alloc([&] {
        void *p = ::operator new[](huge, std::align_val_t{64});
        ::operator delete[](p);
    }));
    assert_null(::operator new(huge, std::nothrow));
    assert_null(::operator new[](huge, std::nothrow));
    assert_null(::operator new(huge, std::align_val_t{4096}, std::nothrow));
    assert_null(::operator new[](huge, std::align_val_t{4096}, std::nothrow));

    handler_calls = 0;
    std::set_new_handler(handler_gives_up);
    assert_true(throws_bad_alloc(new_huge));
    assert_int_equal(handler_calls, 2);
    handler_calls = 0;
    std::set_new_handler(handler_gives_up);
    assert_null(::operator new(huge, std::nothrow));
    assert_int_equal(handler_calls, 2);
    assert_null(std::get_new_handler());
    // And the heap still serves.
    void *p = ::operator new(100);
    check_block(p, 100, 16);
    ::operator delete(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_form_is_the_shims),
        cmocka_unit_test(every_form_allocates_and_frees),
        cmocka_unit_test(new_and_delete_across_threads),
        cmocka_unit_test(failure_is_bad_alloc_or_nullptr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
