/*
 * phase.h - a step number two test threads hand back and forth: one sets
 * it, the other waits until it reads a given value (under a mutex and a
 * condition variable, so TSan sees the hand-off). Used where a test
 * thread must idle while the main thread watches the pool reclaim it.
 */
#ifndef LLMEM_TEST_PHASE_H
#define LLMEM_TEST_PHASE_H

#include <pthread.h>

typedef struct test_phase {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int phase;
} test_phase;

static inline void test_phase_init(test_phase *t)
{
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->cond, NULL);
    t->phase = 0;
}

static inline void test_phase_destroy(test_phase *t)
{
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->lock);
}

static inline void test_phase_set(test_phase *t, int phase)
{
    pthread_mutex_lock(&t->lock);
    t->phase = phase;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

static inline void test_phase_wait(test_phase *t, int phase)
{
    pthread_mutex_lock(&t->lock);
    while (t->phase != phase) pthread_cond_wait(&t->cond, &t->lock);
    pthread_mutex_unlock(&t->lock);
}

#endif
