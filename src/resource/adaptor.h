/*
 * adaptor.h - the common base of every resource adaptor (limit, fault,
 * tracking). Not installed.
 *
 * An adaptor's struct starts with llmem__adaptor: the resource it is and
 * the upstream it wraps. It looks exactly like its upstream (kind,
 * granularity, alignments, capabilities) and is named after it:
 * "limit(os)", "fault(tracking(sim-device))". Ops an adaptor has nothing to
 * add to are the forwarders below, which pass the call upstream unchanged
 * through its checked wrapper (so upstream's own counters see it too).
 */
#ifndef LLMEM_ADAPTOR_H
#define LLMEM_ADAPTOR_H

#include "internal.h"
#include "llmem/resource_impl.h"

typedef struct llmem__adaptor {
    llmem_resource base;  /* first: the adaptor is this resource */
    llmem_resource *up;   /* the resource it wraps; outlives it */
} llmem__adaptor;

/* The upstream of an adaptor resource. */
static inline llmem_resource *llmem__adaptor_up(const llmem_resource *r) { return ((const llmem__adaptor *)r)->up; }

/* Check a create call's arguments, in this order: out (clearing *out),
 * then upstream. LLMEM_EINVAL "<kind>: null out" / "<kind>: null upstream". */
llmem_status llmem__adaptor_check(const char *kind, const llmem_resource *upstream, llmem_resource **out);

/* A zeroed adaptor of `size` bytes (a struct that starts with
 * llmem__adaptor) over upstream, with its ops and its name kind(upstream).
 * NULL, with LLMEM_ENOMEM "<kind>: out of memory" recorded, when out of
 * memory. Free it with free() (or llmem__adaptor_free as its destroy op). */
void *llmem__adaptor_new(size_t size, const llmem_resource_ops *ops, const char *kind, llmem_resource *upstream);

/* Forwarders, for ops tables: the same call on upstream. */
llmem_status llmem__adaptor_map(llmem_resource *r, size_t size, size_t align, unsigned flags, const char *tag,
                                void **out);
llmem_status llmem__adaptor_unmap(llmem_resource *r, void *ptr, size_t size, size_t committed);
llmem_status llmem__adaptor_commit(llmem_resource *r, void *ptr, size_t size);
llmem_status llmem__adaptor_decommit(llmem_resource *r, void *ptr, size_t size);
llmem_status llmem__adaptor_copy(llmem_resource *r, void *dst, const void *src, size_t n);

/* A destroy op for adaptors that hold nothing but their struct. */
void llmem__adaptor_free(llmem_resource *r);

#endif /* LLMEM_ADAPTOR_H */
