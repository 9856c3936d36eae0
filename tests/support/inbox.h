/*
 * inbox.h - a mutex-protected ring of fixed-size items, one per thread in
 * the cross-thread tests (test_pool_threads, test_stress_threads): other
 * threads push what this one is to free. A full inbox refuses the push
 * (the sender then frees the item itself).
 */
#ifndef LLMEM_TEST_INBOX_H
#define LLMEM_TEST_INBOX_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct test_inbox {
    pthread_mutex_t lock;
    unsigned char *q; /* cap items of size bytes */
    size_t size, cap, head, count;
} test_inbox;

/* An empty inbox of cap items of size bytes each; fails the test without memory. */
void test_inbox_init(test_inbox *b, size_t size, size_t cap);
void test_inbox_destroy(test_inbox *b);

/* Copy *item in at the tail: false (nothing copied) when full. */
bool test_inbox_push(test_inbox *b, const void *item);

/* Copy the head out to *item and drop it: false when empty. */
bool test_inbox_pop(test_inbox *b, void *item);

#endif
