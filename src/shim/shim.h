/*
 * shim.h - what libllmem-malloc.so's C++ entry points (new_delete.c) call
 * in malloc.c. Private to the shim: hidden, never exported.
 */
#ifndef LLMEM_SHIM_H
#define LLMEM_SHIM_H

#include <stddef.h>

/* n bytes (0 counts as 1) at align (0 or up to 16: the default; else a
 * power of two), from the pool, or from the side allocator where malloc
 * would take it; NULL when memory is short (errno untouched). */
void *llmem__shim_new(size_t n, size_t align);

/* What free(ptr) does. */
void llmem__shim_delete(void *ptr);

#endif
