/* inbox.c - a mutex-protected ring of fixed-size items (inbox.h). */
#include "support/inbox.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

void test_inbox_init(test_inbox *b, size_t size, size_t cap)
{
    memset(b, 0, sizeof *b);
    b->q = calloc(cap, size);
    if (!b->q) fail_msg("inbox: no memory for %zu items of %zu bytes", cap, size);
    b->size = size;
    b->cap = cap;
    pthread_mutex_init(&b->lock, NULL);
}

void test_inbox_destroy(test_inbox *b)
{
    pthread_mutex_destroy(&b->lock);
    free(b->q);
    b->q = NULL;
}

bool test_inbox_push(test_inbox *b, const void *item)
{
    pthread_mutex_lock(&b->lock);
    bool ok = b->count < b->cap;
    if (ok) memcpy(b->q + (b->head + b->count++) % b->cap * b->size, item, b->size);
    pthread_mutex_unlock(&b->lock);
    return ok;
}

bool test_inbox_pop(test_inbox *b, void *item)
{
    pthread_mutex_lock(&b->lock);
    bool ok = b->count > 0;
    if (ok) {
        memcpy(item, b->q + b->head * b->size, b->size);
        b->head = (b->head + 1) % b->cap;
        b->count--;
    }
    pthread_mutex_unlock(&b->lock);
    return ok;
}
