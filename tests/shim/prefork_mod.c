/*
 * prefork_mod.c - preloaded before libllmem-malloc.so by the
 * test_shim_preload_prefork test: its constructor registers fork handlers
 * before the shim's first allocation registers the shim's, so its prepare
 * handler runs after the shim's has taken the allocator's locks - and
 * allocates, frees and reallocates there, as a library's handler may. The
 * shim must serve it without deadlocking (the fork buffer).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void *kept;

static void prepare(void)
{
    char *a = malloc(100), *b = calloc(1, 200000);
    if (a) memset(a, 1, 100);
    if (b && b[199999] != 0) abort();
    a = realloc(a, 5000);
    if (a) memset(a, 2, 5000);
    free(a);
    free(b);
    free(kept); /* a block from the pool, freed while its lock is held */
    kept = NULL;
}

static void parent(void) { kept = malloc(300); }

static void child(void) { free(malloc(1000)); }

__attribute__((constructor)) static void register_handlers(void)
{
    pthread_atfork(prepare, parent, child);
}
