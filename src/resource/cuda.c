/*
 * cuda.c - the CUDA runtime resources: cuda, cuda-async, cuda-host,
 * cuda-managed (llmem/cuda_resource.h).
 *
 * One implementation, four flavours: map/unmap/copy switch on the flavour
 * for the allocation call; the rest is shared.
 *
 * Every live mapping is recorded (address handed out, raw pointer the
 * runtime returned) in an unsorted array under a mutex. Resources hold few,
 * large mappings (superblocks, KV slabs), so a linear search is cheaper than
 * it sounds; the table lets unmap find the raw pointer of an over-aligned
 * mapping, refuse a pointer that is not a mapping before CUDA sees it, and
 * lets destroy free what the caller leaked.
 *
 * Alignment beyond the native one: allocate the exact size first (the
 * driver aligns large allocations generously); if the result is misaligned,
 * free it and allocate size + align, handing out the aligned address inside.
 *
 * Device selection: the runtime's current device is per thread. Each call
 * saves it, selects the resource's device, and puts it back (enter/leave).
 *
 * Errors: cudaErrorMemoryAllocation is LLMEM_ENOMEM, any other error
 * LLMEM_EDEVICE, both with the call and cudaGetErrorString in the message.
 * cudaGetLastError clears the (non-sticky) error afterwards so it does not
 * surface in an unrelated later call.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "llmem/resource_impl.h"
#include "llmem/cuda_resource.h"

#if defined(LLMEM_HAVE_CUDA) && LLMEM_HAVE_CUDA

#include <cuda_runtime_api.h>

typedef enum cuda_flavor { CUDA_PLAIN, CUDA_ASYNC, CUDA_HOST, CUDA_MANAGED } cuda_flavor;

static const char *const flavor_names[] = {"cuda", "cuda-async", "cuda-host", "cuda-managed"};

typedef struct cuda_map {
    uintptr_t ptr; /* what map handed out */
    void *raw;     /* what the runtime returned (ptr, or below it when over-aligned) */
    size_t size;   /* mapped size (rounded) */
} cuda_map;

typedef struct cuda_resource {
    llmem_resource base;
    cuda_flavor flavor;
    int device;
    cudaStream_t stream;  /* cuda-async; also cuda-managed's prefetch stream (0 = legacy) */
    bool own_stream;
    cudaMemPool_t pool;   /* cuda-async */
    bool own_pool;
    bool prefetch;        /* cuda-managed */
    unsigned host_flags;  /* cuda-host */
    pthread_mutex_t lock; /* guards maps */
    cuda_map *maps;
    size_t count, cap;
} cuda_resource;

/* Turn a CUDA error into a status and message; clears the runtime's error. */
static llmem_status cuda_fail(cudaError_t e, const char *who, const char *call)
{
    (void)cudaGetLastError();
    llmem_status st = e == cudaErrorMemoryAllocation ? LLMEM_ENOMEM : LLMEM_EDEVICE;
    return llmem__fail(st, "%s: %s failed: %s (%s)", who, call, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Select the resource's device for this thread; *prev receives the current
 * one for leave(). */
static llmem_status enter(const cuda_resource *c, int *prev)
{
    cudaError_t e = cudaGetDevice(prev);
    if (e != cudaSuccess) return cuda_fail(e, c->base.info.name, "cudaGetDevice");
    if (*prev == c->device) return LLMEM_OK;
    e = cudaSetDevice(c->device);
    if (e != cudaSuccess) return cuda_fail(e, c->base.info.name, "cudaSetDevice");
    return LLMEM_OK;
}

static void leave(const cuda_resource *c, int prev)
{
    if (prev != c->device) (void)cudaSetDevice(prev);
}

/* The flavour's raw allocation and free. */
static cudaError_t raw_alloc(cuda_resource *c, void **p, size_t n, const char **call)
{
    switch (c->flavor) {
    case CUDA_PLAIN:
        *call = "cudaMalloc";
        return cudaMalloc(p, n);
    case CUDA_ASYNC: {
        *call = "cudaMallocFromPoolAsync";
        cudaError_t e = cudaMallocFromPoolAsync(p, n, c->pool, c->stream);
        if (e != cudaSuccess) return e;
        /* The mapping must be usable from any stream when map returns. */
        *call = "cudaStreamSynchronize";
        e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess) (void)cudaFreeAsync(*p, c->stream);
        return e;
    }
    case CUDA_HOST:
        *call = "cudaHostAlloc";
        return cudaHostAlloc(p, n, c->host_flags);
    case CUDA_MANAGED:
        *call = "cudaMallocManaged";
        return cudaMallocManaged(p, n, cudaMemAttachGlobal);
    }
    return cudaErrorInvalidValue;
}

static cudaError_t raw_free(cuda_resource *c, void *p, const char **call)
{
    switch (c->flavor) {
    case CUDA_ASYNC:
        /* Stream-ordered: the block goes back to the pool once the stream
         * reaches this point; maps on the same stream reuse it safely. */
        *call = "cudaFreeAsync";
        return cudaFreeAsync(p, c->stream);
    case CUDA_HOST:
        *call = "cudaFreeHost";
        return cudaFreeHost(p);
    default:
        *call = "cudaFree";
        return cudaFree(p);
    }
}

/* cudaMemAdvise / cudaMemPrefetchAsync changed signature in CUDA 13 (a
 * cudaMemLocation instead of a device number). */
static cudaError_t managed_place(cuda_resource *c, void *p, size_t n, const char **call)
{
#if CUDART_VERSION >= 13000
    struct cudaMemLocation loc;
    memset(&loc, 0, sizeof loc);
    loc.type = cudaMemLocationTypeDevice;
    loc.id = c->device;
    *call = "cudaMemAdvise(SetPreferredLocation)";
    cudaError_t e = cudaMemAdvise(p, n, cudaMemAdviseSetPreferredLocation, loc);
    if (e != cudaSuccess || !c->prefetch) return e;
    *call = "cudaMemPrefetchAsync";
    e = cudaMemPrefetchAsync(p, n, loc, 0, c->stream);
#else
    *call = "cudaMemAdvise(SetPreferredLocation)";
    cudaError_t e = cudaMemAdvise(p, n, cudaMemAdviseSetPreferredLocation, c->device);
    if (e != cudaSuccess || !c->prefetch) return e;
    *call = "cudaMemPrefetchAsync";
    e = cudaMemPrefetchAsync(p, n, c->device, c->stream);
#endif
    if (e != cudaSuccess) return e;
    *call = "cudaStreamSynchronize";
    return cudaStreamSynchronize(c->stream);
}

static llmem_status record(cuda_resource *c, uintptr_t ptr, void *raw, size_t size)
{
    pthread_mutex_lock(&c->lock);
    if (c->count == c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 16;
        cuda_map *n = realloc(c->maps, ncap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&c->lock);
            return llmem__fail(LLMEM_ENOMEM, "%s: out of host memory for the mapping table", c->base.info.name);
        }
        c->maps = n;
        c->cap = ncap;
    }
    c->maps[c->count++] = (cuda_map){ptr, raw, size};
    pthread_mutex_unlock(&c->lock);
    return LLMEM_OK;
}

static llmem_status cuda_map_op(llmem_resource *r, size_t size, size_t align, unsigned flags, const char *tag,
                                void **out)
{
    LLMEM_UNUSED(tag);
    LLMEM_UNUSED(flags); /* POPULATE: CUDA memory is backed already */
    cuda_resource *c = (cuda_resource *)r;
    const char *who = r->info.name, *call = "";
    int prev;
    llmem_status st = enter(c, &prev);
    if (st) return st;
    if (c->flavor == CUDA_MANAGED) {
        size_t free_b = 0, total_b = 0;
        cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
        if (e != cudaSuccess) {
            st = cuda_fail(e, who, "cudaMemGetInfo");
            goto done;
        }
        if (size > free_b) {
            st = llmem__fail(LLMEM_ENOMEM,
                             "%s: refusing to map %zu bytes of managed memory: device %d has %zu of %zu bytes free "
                             "(oversubscribing managed memory can stall the GPU)",
                             who, size, c->device, free_b, total_b);
            goto done;
        }
    }
    void *raw = NULL;
    cudaError_t e = raw_alloc(c, &raw, size, &call);
    if (e != cudaSuccess) {
        st = cuda_fail(e, who, call);
        goto done;
    }
    uintptr_t p = (uintptr_t)raw;
    if (p & (align - 1)) {
        size_t big;
        const char *fcall;
        (void)raw_free(c, raw, &fcall);
        raw = NULL;
        if (!llmem__add_ok(size, align, &big)) {
            st = llmem__fail(LLMEM_EOVERFLOW, "%s: %zu bytes aligned to %zu overflows", who, size, align);
            goto done;
        }
        e = raw_alloc(c, &raw, big, &call);
        if (e != cudaSuccess) {
            st = cuda_fail(e, who, call);
            goto done;
        }
        p = llmem__align_ptr((uintptr_t)raw, align);
    }
    if (c->flavor == CUDA_MANAGED) {
        e = managed_place(c, (void *)p, size, &call);
        if (e != cudaSuccess) st = cuda_fail(e, who, call);
    }
    if (!st) st = record(c, p, raw, size);
    if (st) {
        (void)raw_free(c, raw, &call);
        goto done;
    }
    *out = (void *)p;
done:
    leave(c, prev);
    return st;
}

static llmem_status cuda_unmap(llmem_resource *r, void *ptr, size_t size, size_t committed)
{
    LLMEM_UNUSED(committed); /* always all of it: no decommit */
    cuda_resource *c = (cuda_resource *)r;
    pthread_mutex_lock(&c->lock);
    size_t i = 0;
    while (i < c->count && c->maps[i].ptr != (uintptr_t)ptr) i++;
    if (i == c->count || c->maps[i].size != size) {
        bool found = i < c->count;
        size_t had = found ? c->maps[i].size : 0;
        pthread_mutex_unlock(&c->lock);
        if (!found)
            return llmem__fail(LLMEM_EINVAL, "%s: unmap of %p, which is not a live mapping", r->info.name, ptr);
        return llmem__fail(LLMEM_EINVAL, "%s: unmap of %p with size %zu, mapped with %zu", r->info.name, ptr, size,
                           had);
    }
    cuda_map m = c->maps[i];
    c->maps[i] = c->maps[--c->count];
    pthread_mutex_unlock(&c->lock);

    int prev;
    llmem_status st = enter(c, &prev);
    if (!st) {
        const char *call;
        cudaError_t e = raw_free(c, m.raw, &call);
        if (e != cudaSuccess) st = cuda_fail(e, r->info.name, call);
        leave(c, prev);
    }
    if (st) (void)record(c, m.ptr, m.raw, m.size); /* still ours; the caller may retry */
    return st;
}

static llmem_status cuda_copy(llmem_resource *r, void *dst, const void *src, size_t n)
{
    cuda_resource *c = (cuda_resource *)r;
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (d < s + n && s < d + n)
        return llmem__fail(LLMEM_EINVAL, "%s: copy ranges overlap (%p and %p, %zu bytes)", r->info.name, dst, src, n);
    int prev;
    llmem_status st = enter(c, &prev);
    if (st) return st;
    cudaError_t e;
    if (c->flavor == CUDA_ASYNC) {
        e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, c->stream);
        if (e != cudaSuccess) st = cuda_fail(e, r->info.name, "cudaMemcpyAsync");
        else if ((e = cudaStreamSynchronize(c->stream)) != cudaSuccess)
            st = cuda_fail(e, r->info.name, "cudaStreamSynchronize");
    } else {
        e = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
        if (e != cudaSuccess) st = cuda_fail(e, r->info.name, "cudaMemcpy");
    }
    leave(c, prev);
    return st;
}

static void cuda_destroy(llmem_resource *r)
{
    cuda_resource *c = (cuda_resource *)r;
    int prev = c->device;
    bool entered = cudaGetDevice(&prev) == cudaSuccess && (prev == c->device || cudaSetDevice(c->device) == cudaSuccess);
    const char *call;
    for (size_t i = 0; i < c->count; i++) (void)raw_free(c, c->maps[i].raw, &call);
    if (c->stream) (void)cudaStreamSynchronize(c->stream);
    if (c->own_pool) (void)cudaMemPoolDestroy(c->pool);
    if (c->own_stream) (void)cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    if (entered) leave(c, prev);
    free(c->maps);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static const llmem_resource_ops cuda_device_ops = {
    .map = cuda_map_op,
    .unmap = cuda_unmap,
    /* commit NULL: memory is always backed; decommit NULL: LLMEM_ENOTSUP */
    .copy = cuda_copy,
    .destroy = cuda_destroy,
};

/* cuda-host: host memory; copy is memcpy, with the overlap check the
 * other flavours make. */
static llmem_status cuda_host_copy(llmem_resource *r, void *dst, const void *src, size_t n)
{
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (d < s + n && s < d + n)
        return llmem__fail(LLMEM_EINVAL, "%s: copy ranges overlap (%p and %p, %zu bytes)", r->info.name, dst, src, n);
    memcpy(dst, src, n);
    return LLMEM_OK;
}

static const llmem_resource_ops cuda_host_ops = {
    .map = cuda_map_op,
    .unmap = cuda_unmap,
    .copy = cuda_host_copy,
    .destroy = cuda_destroy,
};

llmem_status llmem_cuda_device_count(int *out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "llmem_cuda_device_count: null out");
    *out = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        (void)cudaGetLastError();
        llmem__fail(LLMEM_OK, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        return LLMEM_OK;
    }
    if (e != cudaSuccess) return cuda_fail(e, "cuda", "cudaGetDeviceCount");
    *out = n;
    return LLMEM_OK;
}

static llmem_status create(cuda_flavor f, const llmem_cuda_options *opts, llmem_resource **out)
{
    const char *fname = flavor_names[f];
    if (!out) return llmem__fail(LLMEM_EINVAL, "%s: null out", fname);
    *out = NULL;
    llmem_cuda_options o;
    memset(&o, 0, sizeof o);
    if (opts) o = *opts;
    if (o.device < 0) return llmem__fail(LLMEM_EINVAL, "%s: device index %d is negative", fname, o.device);
    int count = 0;
    llmem_status st = llmem_cuda_device_count(&count);
    if (st) return st;
    if (count == 0) {
        char why[256]; /* the message is about to be overwritten */
        snprintf(why, sizeof why, "%s", llmem_error_message());
        return llmem__fail(LLMEM_EDEVICE, "%s: no CUDA device (%s)", fname, why);
    }
    if (o.device >= count)
        return llmem__fail(LLMEM_EDEVICE, "%s: no CUDA device %d (%d found)", fname, o.device, count);

    cuda_resource *c = calloc(1, sizeof *c);
    if (!c) return llmem__fail(LLMEM_ENOMEM, "%s: out of memory", fname);
    c->flavor = f;
    c->device = o.device;
    c->prefetch = !o.no_prefetch;
    c->host_flags = o.host_flags ? o.host_flags : cudaHostAllocPortable;
    pthread_mutex_init(&c->lock, NULL);
    /* Named before any CUDA call so failures below carry the name. */
    size_t gran = f == CUDA_HOST ? llmem__page_size() : LLMEM_DEVICE_ALIGN;
    llmem_resource_init(&c->base, f == CUDA_HOST ? &cuda_host_ops : &cuda_device_ops, o.name ? o.name : fname,
                        f == CUDA_HOST ? LLMEM_MEM_HOST : LLMEM_MEM_DEVICE, gran, gran, LLMEM_MAX_ALIGN,
                        f == CUDA_HOST ? 0u : LLMEM_RES_CAP_COPY);
    const char *who = c->base.info.name;

    int prev;
    st = enter(c, &prev);
    if (st) goto fail_unentered;
    cudaError_t e = cudaSuccess;
    if (f == CUDA_ASYNC) {
        if (o.stream) {
            c->stream = (cudaStream_t)o.stream;
        } else if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
            st = cuda_fail(e, who, "cudaStreamCreateWithFlags");
            goto fail;
        } else {
            c->own_stream = true;
        }
        if (o.use_default_pool) {
            if ((e = cudaDeviceGetDefaultMemPool(&c->pool, c->device)) != cudaSuccess) {
                st = cuda_fail(e, who, "cudaDeviceGetDefaultMemPool");
                goto fail;
            }
        } else {
            struct cudaMemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = cudaMemAllocationTypePinned;
            props.handleTypes = cudaMemHandleTypeNone;
            props.location.type = cudaMemLocationTypeDevice;
            props.location.id = c->device;
            if ((e = cudaMemPoolCreate(&c->pool, &props)) != cudaSuccess) {
                st = cuda_fail(e, who, "cudaMemPoolCreate");
                goto fail;
            }
            c->own_pool = true;
        }
        if (o.release_threshold) {
            uint64_t t = o.release_threshold;
            if ((e = cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &t)) != cudaSuccess) {
                st = cuda_fail(e, who, "cudaMemPoolSetAttribute(ReleaseThreshold)");
                goto fail;
            }
        }
    } else if (f == CUDA_MANAGED) {
        int managed = 0;
        if ((e = cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, c->device)) != cudaSuccess) {
            st = cuda_fail(e, who, "cudaDeviceGetAttribute(ManagedMemory)");
            goto fail;
        }
        if (!managed) {
            st = llmem__fail(LLMEM_ENOTSUP, "%s: device %d does not support managed memory", who, c->device);
            goto fail;
        }
    }
    leave(c, prev);
    *out = &c->base;
    return LLMEM_OK;
fail:
    leave(c, prev);
fail_unentered:
    cuda_destroy(&c->base);
    return st;
}

#else /* built without CUDA */

static llmem_status absent(const char *fn)
{
    return llmem__fail(LLMEM_ENOTSUP, "%s: llmem was built without CUDA", fn);
}

llmem_status llmem_cuda_device_count(int *out)
{
    if (out) *out = 0;
    return absent("llmem_cuda_device_count");
}

typedef int cuda_flavor;

static llmem_status create(cuda_flavor f, const llmem_cuda_options *opts, llmem_resource **out)
{
    static const char *const fns[] = {"llmem_cuda_resource_create", "llmem_cuda_async_resource_create",
                                      "llmem_cuda_host_resource_create", "llmem_cuda_managed_resource_create"};
    LLMEM_UNUSED(opts);
    if (out) *out = NULL;
    return absent(fns[f]);
}

#define CUDA_PLAIN 0
#define CUDA_ASYNC 1
#define CUDA_HOST 2
#define CUDA_MANAGED 3

#endif

llmem_status llmem_cuda_resource_create(const llmem_cuda_options *opts, llmem_resource **out)
{
    return create(CUDA_PLAIN, opts, out);
}

llmem_status llmem_cuda_async_resource_create(const llmem_cuda_options *opts, llmem_resource **out)
{
    return create(CUDA_ASYNC, opts, out);
}

llmem_status llmem_cuda_host_resource_create(const llmem_cuda_options *opts, llmem_resource **out)
{
    return create(CUDA_HOST, opts, out);
}

llmem_status llmem_cuda_managed_resource_create(const llmem_cuda_options *opts, llmem_resource **out)
{
    return create(CUDA_MANAGED, opts, out);
}
