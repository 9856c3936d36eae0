/*
 * glibc_malloc.c - an LD_PRELOAD library that hands every allocation to
 * glibc's own malloc (__libc_malloc and friends), for bench/programs.sh:
 * programs linked against another allocator (Debian's redis-server links
 * libjemalloc) are measured "with glibc" through it. Each entry point is
 * one direct call, no lookup.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

#define EXPORT __attribute__((visibility("default")))
EXPORT void *malloc(size_t n);
EXPORT void free(void *p);
EXPORT void *calloc(size_t a, size_t b);
EXPORT void *realloc(void *p, size_t n);
EXPORT void *memalign(size_t a, size_t n);
EXPORT void *aligned_alloc(size_t a, size_t n);
EXPORT int posix_memalign(void **out, size_t a, size_t n);
EXPORT void *valloc(size_t n);
EXPORT void *pvalloc(size_t n);
EXPORT size_t malloc_usable_size(void *p);

/* glibc's own malloc_usable_size, by its symbol version, so that a
 * program's other allocator (jemalloc in redis-server) is skipped. Looked
 * up on first use; dlvsym may allocate, which lands in __libc_malloc. */
static size_t usable(void *p)
{
    static size_t (*f)(void *);
    if (!f) *(void **)&f = dlvsym(RTLD_NEXT, "malloc_usable_size", "GLIBC_2.2.5");
    return f ? f(p) : 0;
}

void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }
void *calloc(size_t a, size_t b) { return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void *memalign(size_t a, size_t n) { return __libc_memalign(a, n); }
void *aligned_alloc(size_t a, size_t n) { return __libc_memalign(a, n); }
void *valloc(size_t n) { return __libc_valloc(n); }
void *pvalloc(size_t n) { return __libc_pvalloc(n); }
size_t malloc_usable_size(void *p) { return usable(p); }
int posix_memalign(void **out, size_t a, size_t n)
{
    if (!a || (a & (a - 1)) || a % sizeof(void *)) return EINVAL;
    void *p = __libc_memalign(a, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
