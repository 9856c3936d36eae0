/*
 * test_resource_conformance.c - every resource and adaptor stack through
 * the one conformance suite (tests/support/resource_suite.h): os,
 * sim-device at two granularities, limit (both modes), fault (disarmed:
 * it must pass everything through unchanged), tracking, each over a host
 * and a device upstream, and the fault(limit(tracking(os))) stack of
 * llmem/resource.h's comment.
 *
 * `test_resource_conformance --cuda` runs the CUDA resources (cuda,
 * cuda-async, cuda-managed, cuda-host, cuda-vmm) through the same cases;
 * without CUDA in the build, or without a device, it prints "skipped:
 * ..." and exits 77 (its CTest entry says Skipped). A flavour the device
 * cannot offer (managed memory, virtual memory management) is left out
 * with a line saying so.
 */
#include "test_util.h"
#include "support/resource_suite.h"

#include "llmem/cuda_resource.h"

/* A stack: its base, then up to three adaptors, each over the one before. */
typedef enum base { OS, SIM, SIM_64K } base;
typedef enum layer { NONE, LIMIT_COMMITTED, LIMIT_MAPPED, FAULT, TRACKING } layer;
typedef struct recipe {
    base base;
    layer layers[3];
} recipe;

static llmem_status add_layer(test_stack *s, layer l)
{
    llmem_resource *up = s->r[s->n - 1], *r = NULL;
    switch (l) {
    case LIMIT_COMMITTED:
    case LIMIT_MAPPED: {
        llmem_limit_options o = llmem_limit_options_default();
        o.limit_bytes = (size_t)1 << 34; /* far above what any case maps */
        o.what = l == LIMIT_MAPPED ? LLMEM_LIMIT_MAPPED : LLMEM_LIMIT_COMMITTED;
        return test_stack_push(s, llmem_limit_resource_create(up, &o, &r), &r);
    }
    case FAULT: {
        llmem_fault_options o = llmem_fault_options_default(); /* armed with nothing */
        return test_stack_push(s, llmem_fault_resource_create(up, &o, &r), &r);
    }
    case TRACKING: return test_stack_push(s, llmem_tracking_resource_create(up, &r), &r);
    case NONE: break;
    }
    return LLMEM_OK;
}

static llmem_status build(test_stack *s, const void *arg)
{
    const recipe *rc = arg;
    llmem_resource *r = NULL;
    llmem_status st;
    if (rc->base == OS) {
        st = test_stack_push(s, llmem_os_resource_create(NULL, &r), &r);
    } else {
        llmem_sim_options o = llmem_sim_options_default();
        if (rc->base == SIM_64K) o.granularity = (size_t)64 << 10;
        st = test_stack_push(s, llmem_sim_resource_create(&o, &r), &r);
    }
    for (int i = 0; i < 3 && !st; i++) st = add_layer(s, rc->layers[i]);
    return st;
}

static const recipe r_os = {OS, {NONE}}, r_sim = {SIM, {NONE}}, r_sim64 = {SIM_64K, {NONE}},
                    r_limit_os = {OS, {LIMIT_COMMITTED}}, r_limit_sim = {SIM, {LIMIT_MAPPED}},
                    r_fault_os = {OS, {FAULT}}, r_fault_sim = {SIM_64K, {FAULT}},
                    r_track_os = {OS, {TRACKING}}, r_track_sim = {SIM, {TRACKING}},
                    r_full = {OS, {TRACKING, LIMIT_COMMITTED, FAULT}};

static const test_stack_def host_and_sim[] = {
    {"os", LLMEM_MEM_HOST, build, &r_os},
    {"sim-device", LLMEM_MEM_DEVICE, build, &r_sim},
    {"sim-device", LLMEM_MEM_DEVICE, build, &r_sim64},
    {"limit(os)", LLMEM_MEM_HOST, build, &r_limit_os},
    {"limit(sim-device)", LLMEM_MEM_DEVICE, build, &r_limit_sim},
    {"fault(os)", LLMEM_MEM_HOST, build, &r_fault_os},
    {"fault(sim-device)", LLMEM_MEM_DEVICE, build, &r_fault_sim},
    {"tracking(os)", LLMEM_MEM_HOST, build, &r_track_os},
    {"tracking(sim-device)", LLMEM_MEM_DEVICE, build, &r_track_sim},
    {"fault(limit(tracking(os)))", LLMEM_MEM_HOST, build, &r_full},
};

/* ---- CUDA ---------------------------------------------------------------------------- */

typedef llmem_status (*cuda_creator)(const llmem_cuda_options *, llmem_resource **);

static llmem_status cuda_build(test_stack *s, const void *arg)
{
    cuda_creator fn = *(const cuda_creator *)arg;
    llmem_resource *r = NULL;
    return test_stack_push(s, fn(NULL, &r), &r);
}

static const cuda_creator c_plain = llmem_cuda_resource_create, c_async = llmem_cuda_async_resource_create,
                          c_managed = llmem_cuda_managed_resource_create, c_host = llmem_cuda_host_resource_create,
                          c_vmm = llmem_cuda_vmm_resource_create;

static int run_cuda(void)
{
    int n = 0;
    llmem_status st = llmem_cuda_device_count(&n);
    if (st != LLMEM_OK || n == 0) {
        printf("skipped: no CUDA device (%s)\n", st ? llmem_error_message() : "none found");
        return 77;
    }
    const test_stack_def all[] = {
        {"cuda", LLMEM_MEM_DEVICE, cuda_build, &c_plain},
        {"cuda-async", LLMEM_MEM_DEVICE, cuda_build, &c_async},
        {"cuda-managed", LLMEM_MEM_DEVICE, cuda_build, &c_managed},
        {"cuda-host", LLMEM_MEM_HOST, cuda_build, &c_host},
        {"cuda-vmm", LLMEM_MEM_DEVICE, cuda_build, &c_vmm},
    };
    test_stack_def run[sizeof all / sizeof all[0]];
    size_t k = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        test_stack s = {{0}, 0};
        st = all[i].build(&s, all[i].arg);
        if (st == LLMEM_ENOTSUP) { /* this device cannot offer the flavour */
            printf("%s: left out: %s\n", all[i].name, llmem_error_message());
            continue;
        }
        for (size_t j = s.n; j-- > 0;) llmem_resource_destroy(s.r[j]);
        run[k++] = all[i]; /* another failure shows in every case of the group */
    }
    return test_resource_conformance(run, k);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--cuda")) return run_cuda();
    return test_resource_conformance(host_and_sim, sizeof host_and_sim / sizeof host_and_sim[0]);
}
