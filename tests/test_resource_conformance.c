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

static llmem_status os_base(test_stack *s)
{
    llmem_resource *r = NULL;
    return test_stack_push(s, llmem_os_resource_create(NULL, &r), &r);
}

static llmem_status sim_base_g(test_stack *s, size_t granularity)
{
    llmem_sim_options o = llmem_sim_options_default();
    if (granularity) o.granularity = granularity;
    llmem_resource *r = NULL;
    return test_stack_push(s, llmem_sim_resource_create(&o, &r), &r);
}

static llmem_status sim_base(test_stack *s) { return sim_base_g(s, 0); }
static llmem_status sim_64k(test_stack *s) { return sim_base_g(s, (size_t)64 << 10); }

static llmem_status add_limit(test_stack *s, llmem_limit_what what)
{
    llmem_limit_options o = llmem_limit_options_default();
    o.limit_bytes = (size_t)1 << 34; /* far above what any case maps */
    o.what = what;
    llmem_resource *r = NULL;
    return test_stack_push(s, llmem_limit_resource_create(s->r[s->n - 1], &o, &r), &r);
}

static llmem_status add_fault(test_stack *s)
{
    llmem_fault_options o = llmem_fault_options_default(); /* armed with nothing */
    llmem_resource *r = NULL;
    return test_stack_push(s, llmem_fault_resource_create(s->r[s->n - 1], &o, &r), &r);
}

static llmem_status add_tracking(test_stack *s)
{
    llmem_resource *r = NULL;
    return test_stack_push(s, llmem_tracking_resource_create(s->r[s->n - 1], &r), &r);
}

static llmem_status limit_os(test_stack *s)
{
    llmem_status st = os_base(s);
    return st ? st : add_limit(s, LLMEM_LIMIT_COMMITTED);
}

static llmem_status limit_sim(test_stack *s)
{
    llmem_status st = sim_base(s);
    return st ? st : add_limit(s, LLMEM_LIMIT_MAPPED);
}

static llmem_status fault_os(test_stack *s)
{
    llmem_status st = os_base(s);
    return st ? st : add_fault(s);
}

static llmem_status fault_sim(test_stack *s)
{
    llmem_status st = sim_64k(s);
    return st ? st : add_fault(s);
}

static llmem_status tracking_os(test_stack *s)
{
    llmem_status st = os_base(s);
    return st ? st : add_tracking(s);
}

static llmem_status tracking_sim(test_stack *s)
{
    llmem_status st = sim_base(s);
    return st ? st : add_tracking(s);
}

static llmem_status full_stack(test_stack *s)
{
    llmem_status st = os_base(s);
    if (!st) st = add_tracking(s);
    if (!st) st = add_limit(s, LLMEM_LIMIT_COMMITTED);
    if (!st) st = add_fault(s);
    return st;
}

static const test_stack_def host_and_sim[] = {
    {"os", LLMEM_MEM_HOST, os_base},
    {"sim-device", LLMEM_MEM_DEVICE, sim_base},
    {"sim-device", LLMEM_MEM_DEVICE, sim_64k},
    {"limit(os)", LLMEM_MEM_HOST, limit_os},
    {"limit(sim-device)", LLMEM_MEM_DEVICE, limit_sim},
    {"fault(os)", LLMEM_MEM_HOST, fault_os},
    {"fault(sim-device)", LLMEM_MEM_DEVICE, fault_sim},
    {"tracking(os)", LLMEM_MEM_HOST, tracking_os},
    {"tracking(sim-device)", LLMEM_MEM_DEVICE, tracking_sim},
    {"fault(limit(tracking(os)))", LLMEM_MEM_HOST, full_stack},
};

/* ---- CUDA ---------------------------------------------------------------------------- */

typedef llmem_status (*cuda_creator)(const llmem_cuda_options *, llmem_resource **);

static llmem_status cuda_push(test_stack *s, cuda_creator fn)
{
    llmem_resource *r = NULL;
    return test_stack_push(s, fn(NULL, &r), &r);
}

static llmem_status cuda_plain(test_stack *s) { return cuda_push(s, llmem_cuda_resource_create); }
static llmem_status cuda_async(test_stack *s) { return cuda_push(s, llmem_cuda_async_resource_create); }
static llmem_status cuda_managed(test_stack *s) { return cuda_push(s, llmem_cuda_managed_resource_create); }
static llmem_status cuda_host(test_stack *s) { return cuda_push(s, llmem_cuda_host_resource_create); }
static llmem_status cuda_vmm(test_stack *s) { return cuda_push(s, llmem_cuda_vmm_resource_create); }

static int run_cuda(void)
{
    int n = 0;
    llmem_status st = llmem_cuda_device_count(&n);
    if (st != LLMEM_OK || n == 0) {
        printf("skipped: no CUDA device (%s)\n", st ? llmem_last_error() : "none found");
        return 77;
    }
    const test_stack_def all[] = {
        {"cuda", LLMEM_MEM_DEVICE, cuda_plain},       {"cuda-async", LLMEM_MEM_DEVICE, cuda_async},
        {"cuda-managed", LLMEM_MEM_DEVICE, cuda_managed}, {"cuda-host", LLMEM_MEM_HOST, cuda_host},
        {"cuda-vmm", LLMEM_MEM_DEVICE, cuda_vmm},
    };
    test_stack_def run[sizeof all / sizeof all[0]];
    size_t k = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        test_stack s = {{0}, 0};
        st = all[i].build(&s);
        if (st == LLMEM_ENOTSUP) { /* this device cannot offer the flavour */
            printf("%s: left out: %s\n", all[i].name, llmem_last_error());
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
