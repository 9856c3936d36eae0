/*
 * new_delete.c - libllmem-malloc.so's C++ operator new and delete: every
 * replaceable form of C++17 (plain, array, nothrow, sized delete, aligned,
 * aligned nothrow, sized aligned delete), written in C under their Itanium
 * ABI names (x86-64 and every LP64 target: size_t mangles as m), so the
 * shim needs no C++ runtime of its own and a C program that preloads it
 * loads no libstdc++.
 *
 * Why: without these, libstdc++'s operator new calls malloc through the
 * PLT, then the shim's malloc; here it is one call into the pool, and the
 * aligned forms go to the pool's aligned allocation directly.
 *
 * Semantics, as the standard asks ([new.delete.single]):
 *  - The throwing forms loop: allocate; on failure call the installed
 *    new_handler (std::get_new_handler) and try again; with none, throw
 *    std::bad_alloc (std::__throw_bad_alloc). Both are found with dlsym
 *    on the failure path only, so a program that loaded libstdc++ late
 *    (dlopen) is served too; a process with no C++ runtime at all cannot
 *    have called operator new except by its mangled name, and aborts
 *    there (nothing could catch the exception).
 *  - The nothrow forms run the same loop and return NULL where the others
 *    throw. A new_handler that itself throws propagates out of them
 *    (libstdc++ catches it there; C code cannot): a documented difference
 *    that only a handler throwing something is exposed to.
 *  - Size 0 gives a unique non-null pointer (malloc's rule here).
 *  - delete of NULL does nothing; delete of a pointer no allocator here
 *    handed out is what free does with it (ignored and counted); sized and
 *    aligned deletes are free (the pool knows each block's size).
 *  - An alignment that is not a power of two (undefined behaviour for the
 *    caller) is rounded up to one, as memalign does.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define EXPORT __attribute__((visibility("default")))

typedef void (*new_handler_fn)(void);

/* A function from the process's C++ runtime, or NULL. */
static void *runtime_fn(const char *name) { return dlsym(RTLD_DEFAULT, name); }

static size_t pow2_align(size_t a)
{
    if (!a || !(a & (a - 1))) return a;
    size_t r = 1;
    while (r && r < a) r <<= 1;
    return r ? r : a; /* beyond 2^63: the pool refuses it, bad_alloc follows */
}

/* The allocation failed: the new_handler loop, then NULL (nothrow) or
 * std::bad_alloc. */
static __attribute__((noinline, cold)) void *new_failed(size_t n, size_t align, bool nothrow)
{
    void *get = runtime_fn("_ZSt15get_new_handlerv");
    for (;;) {
        new_handler_fn (*getter)(void) = NULL;
        if (get) memcpy(&getter, &get, sizeof getter);
        new_handler_fn h = getter ? getter() : NULL;
        if (!h) break;
        h();
        void *r = llmem__shim_new(n, align);
        if (r) return r;
    }
    if (nothrow) return NULL;
    void *thr = runtime_fn("_ZSt17__throw_bad_allocv");
    if (thr) {
        void (*throw_bad_alloc)(void);
        memcpy(&throw_bad_alloc, &thr, sizeof throw_bad_alloc);
        throw_bad_alloc();
    }
    abort(); /* operator new called with no C++ runtime in the process */
}

static inline void *new_impl(size_t n, size_t align, bool nothrow)
{
    void *r = llmem__shim_new(n, align);
    return __builtin_expect(r != NULL, 1) ? r : new_failed(n, align, nothrow);
}

/* The Itanium names, declared for -Wmissing-prototypes. nothrow_t is an
 * empty struct passed by reference: a pointer never read. */
void *_Znwm(size_t n);
void *_Znam(size_t n);
void *_ZnwmRKSt9nothrow_t(size_t n, const void *nt);
void *_ZnamRKSt9nothrow_t(size_t n, const void *nt);
void *_ZnwmSt11align_val_t(size_t n, size_t align);
void *_ZnamSt11align_val_t(size_t n, size_t align);
void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t align, const void *nt);
void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t n, size_t align, const void *nt);
void _ZdlPv(void *p);
void _ZdaPv(void *p);
void _ZdlPvm(void *p, size_t n);
void _ZdaPvm(void *p, size_t n);
void _ZdlPvRKSt9nothrow_t(void *p, const void *nt);
void _ZdaPvRKSt9nothrow_t(void *p, const void *nt);
void _ZdlPvSt11align_val_t(void *p, size_t align);
void _ZdaPvSt11align_val_t(void *p, size_t align);
void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t align);
void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t align);
void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t align, const void *nt);
void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t align, const void *nt);

/* operator new, new[] (size_t) */
EXPORT void *_Znwm(size_t n) { return new_impl(n, 0, false); }
EXPORT void *_Znam(size_t n) { return new_impl(n, 0, false); }
/* (size_t, const nothrow_t &) */
EXPORT void *_ZnwmRKSt9nothrow_t(size_t n, const void *nt) { (void)nt; return new_impl(n, 0, true); }
EXPORT void *_ZnamRKSt9nothrow_t(size_t n, const void *nt) { (void)nt; return new_impl(n, 0, true); }
/* (size_t, align_val_t) */
EXPORT void *_ZnwmSt11align_val_t(size_t n, size_t align) { return new_impl(n, pow2_align(align), false); }
EXPORT void *_ZnamSt11align_val_t(size_t n, size_t align) { return new_impl(n, pow2_align(align), false); }
/* (size_t, align_val_t, const nothrow_t &) */
EXPORT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t align, const void *nt)
{
    (void)nt;
    return new_impl(n, pow2_align(align), true);
}
EXPORT void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t n, size_t align, const void *nt)
{
    (void)nt;
    return new_impl(n, pow2_align(align), true);
}

/* operator delete, delete[]: (void *), (void *, size_t), (void *, const
 * nothrow_t &), (void *, align_val_t), (void *, size_t, align_val_t),
 * (void *, align_val_t, const nothrow_t &) */
EXPORT void _ZdlPv(void *p) { llmem__shim_delete(p); }
EXPORT void _ZdaPv(void *p) { llmem__shim_delete(p); }
EXPORT void _ZdlPvm(void *p, size_t n) { (void)n; llmem__shim_delete(p); }
EXPORT void _ZdaPvm(void *p, size_t n) { (void)n; llmem__shim_delete(p); }
EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const void *nt) { (void)nt; llmem__shim_delete(p); }
EXPORT void _ZdaPvRKSt9nothrow_t(void *p, const void *nt) { (void)nt; llmem__shim_delete(p); }
EXPORT void _ZdlPvSt11align_val_t(void *p, size_t align) { (void)align; llmem__shim_delete(p); }
EXPORT void _ZdaPvSt11align_val_t(void *p, size_t align) { (void)align; llmem__shim_delete(p); }
EXPORT void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t align)
{
    (void)n;
    (void)align;
    llmem__shim_delete(p);
}
EXPORT void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t align)
{
    (void)n;
    (void)align;
    llmem__shim_delete(p);
}
EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t align, const void *nt)
{
    (void)align;
    (void)nt;
    llmem__shim_delete(p);
}
EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t align, const void *nt)
{
    (void)align;
    (void)nt;
    llmem__shim_delete(p);
}
