/*
 * resource_suite.h - one conformance suite for every resource and adaptor
 * stack, as ggml's test-backend-ops runs every backend through the same
 * cases: the contract of llmem/resource.h (info, mapping sizes and
 * alignment, exact statistics, argument checking, reservations and
 * commit, copies, rounding), checked the same way on os, sim-device,
 * limit, fault, tracking and their stacks, and cuda where there is one.
 *
 * A stack is described by how to build it; every case gets a freshly
 * built stack (so its counters start at zero) and the teardown checks
 * that nothing is left mapped before destroying it top down. Memory is
 * touched only through llmem_resource_copy, so device stacks run the same
 * cases as host ones. What is specific to one resource (the os's huge
 * pages, the sim device's faults on touch, the adaptors' own policies)
 * stays in that resource's test file.
 */
#ifndef LLMEM_TEST_RESOURCE_SUITE_H
#define LLMEM_TEST_RESOURCE_SUITE_H

#include <stddef.h>

#include "llmem/resource.h"

enum { TEST_STACK_MAX = 4 };

/* A built stack: r[0] the base, r[n - 1] the resource under test. */
typedef struct test_stack {
    llmem_resource *r[TEST_STACK_MAX];
    size_t n;
} test_stack;

typedef struct test_stack_def {
    const char *name;   /* what the top's info.name must read, e.g. "limit(os)" */
    llmem_mem_kind kind;
    /* Build the stack into *s (pushing each resource, base first) from
     * arg; any status but OK fails the case, with the library's message. */
    llmem_status (*build)(test_stack *s, const void *arg);
    const void *arg;
} test_stack_def;

/* Push *r (when st, the status of the call that created it, is OK) and
 * pass st on: test_stack_push(s, llmem_x_create(..., &r), &r). A pointer,
 * so *r is read after the create call, not before it. */
llmem_status test_stack_push(test_stack *s, llmem_status st, llmem_resource *const *r);

/* Run every case over every stack, one cmocka group per stack (named
 * "<stack>", each case "<case>"); returns the number of failed cases. */
int test_resource_conformance(const test_stack_def *defs, size_t n);

#endif
