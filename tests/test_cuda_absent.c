/*
 * test_cuda_absent.c - the CUDA entry points on a machine that may have no
 * GPU, in every build: built with CUDA (LLMEM_TEST_HAVE_CUDA=1), the device
 * count is 0 with a reason, or the real count; creators either work (a
 * device is there) or fail with LLMEM_EDEVICE and a message; built without
 * CUDA, everything is LLMEM_ENOTSUP "llmem was built without CUDA". Never
 * a crash, never a resource handed out on failure.
 */
#include "test_util.h"

#include "llmem/cuda_resource.h"

#ifndef LLMEM_TEST_HAVE_CUDA
#error "tests/CMakeLists.txt passes LLMEM_TEST_HAVE_CUDA"
#endif

typedef llmem_status (*creator)(const llmem_cuda_options *, llmem_resource **);

static const struct {
    const char *name;
    creator fn;
    llmem_mem_kind kind;
} creators[] = {
    {"cuda", llmem_cuda_resource_create, LLMEM_MEM_DEVICE},
    {"cuda-async", llmem_cuda_async_resource_create, LLMEM_MEM_DEVICE},
    {"cuda-host", llmem_cuda_host_resource_create, LLMEM_MEM_HOST},
    {"cuda-managed", llmem_cuda_managed_resource_create, LLMEM_MEM_DEVICE},
    {"cuda-vmm", llmem_cuda_vmm_resource_create, LLMEM_MEM_DEVICE},
};

static int device_count(void)
{
    int n = -1;
    llmem_error_clear();
    llmem_status st = llmem_cuda_device_count(&n);
    if (!LLMEM_TEST_HAVE_CUDA) {
        assert_status(st, LLMEM_ENOTSUP);
        assert_error_mentions("built without CUDA");
        assert_int_equal(n, 0);
        return 0;
    }
    if (st == LLMEM_EDEVICE) { /* a broken runtime: a message, no count */
        assert_true(llmem_error_message()[0] != '\0');
        assert_int_equal(n, 0);
        return 0;
    }
    assert_ok(st);
    assert_true(n >= 0);
    if (n == 0) assert_error_mentions("cudaGetDeviceCount");
    return n;
}

static void device_count_is_clean(void **state)
{
    (void)state;
    int n = device_count();
    printf("llmem built %s CUDA; %d CUDA device(s)%s%s\n", LLMEM_TEST_HAVE_CUDA ? "with" : "without", n,
           n ? "" : ": ", n ? "" : llmem_error_message());
    assert_status(llmem_cuda_device_count(NULL), LLMEM_TEST_HAVE_CUDA ? LLMEM_EINVAL : LLMEM_ENOTSUP);
}

static void creators_fail_cleanly_or_work(void **state)
{
    (void)state;
    int n = device_count();
    for (size_t i = 0; i < sizeof creators / sizeof creators[0]; i++) {
        llmem_resource *r = (llmem_resource *)&r; /* must come back NULL on failure */
        llmem_error_clear();
        llmem_status st = creators[i].fn(NULL, &r);
        if (!LLMEM_TEST_HAVE_CUDA) {
            assert_status(st, LLMEM_ENOTSUP);
            assert_error_mentions("built without CUDA");
            assert_null(r);
        } else if (n == 0) {
            assert_status(st, LLMEM_EDEVICE);
            assert_error_mentions("no CUDA device");
            assert_null(r);
        } else if (st == LLMEM_ENOTSUP && strcmp(creators[i].name, "cuda-managed") == 0) {
            assert_null(r); /* a device without managed memory */
        } else {
            assert_ok(st);
            assert_non_null(r);
            assert_string_equal(llmem_resource_name(r), creators[i].name);
            assert_int_equal(llmem_resource_kind(r), creators[i].kind);
            llmem_resource_destroy(r);
        }
        /* Bad input is a status in every build. */
        llmem_status bad = creators[i].fn(NULL, NULL);
        assert_int_equal(bad, LLMEM_TEST_HAVE_CUDA ? LLMEM_EINVAL : LLMEM_ENOTSUP);
        llmem_cuda_options o;
        memset(&o, 0, sizeof o);
        o.device = -1;
        r = (llmem_resource *)&r;
        assert_int_equal(creators[i].fn(&o, &r), LLMEM_TEST_HAVE_CUDA ? LLMEM_EINVAL : LLMEM_ENOTSUP);
        assert_null(r);
        o.device = 1 << 20; /* no machine has that many */
        r = (llmem_resource *)&r;
        assert_int_equal(creators[i].fn(&o, &r), LLMEM_TEST_HAVE_CUDA ? LLMEM_EDEVICE : LLMEM_ENOTSUP);
        assert_null(r);
    }
}

/* A CUDA fence: ENOTSUP without CUDA, EDEVICE with no device, and a fence
 * that a pool can use with one. */
static void fence_record_fails_cleanly_or_works(void **state)
{
    (void)state;
    int n = device_count();
    llmem_fence f;
    memset(&f, 0, sizeof f);
    assert_status(llmem_cuda_fence_record(NULL, NULL), LLMEM_TEST_HAVE_CUDA ? LLMEM_EINVAL : LLMEM_ENOTSUP);
    llmem_status st = llmem_cuda_fence_record(NULL, &f);
    if (!LLMEM_TEST_HAVE_CUDA) {
        assert_int_equal(st, LLMEM_ENOTSUP);
        assert_null(f.done);
    } else if (n == 0) {
        assert_int_equal(st, LLMEM_EDEVICE);
        assert_error_mentions("llmem_cuda_fence_record");
        assert_null(f.done);
    } else {
        assert_ok(st);
        assert_non_null(f.done);
        assert_ok(f.wait(f.fence));
        assert_true(f.done(f.fence));
        f.drop(f.fence);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_count_is_clean),
        cmocka_unit_test(creators_fail_cleanly_or_work),
        cmocka_unit_test(fence_record_fails_cleanly_or_works),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
