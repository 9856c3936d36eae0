/*
 * llmem/memctl.h - one call that builds the memory an engine (or a KV
 * cache alone) runs under the stage-aware controller: a pool, a predictor
 * that knows the engine's geometry, and the controller that sizes the pool
 * from the stages it is told about.
 *
 *     llmem_engine_options eo = llmem_engine_options_default();
 *     llmem_memctl *mc;
 *     llmem_memctl_create_for_engine(model, &eo, NULL, &mc); // sets eo.pool, eo.on_stage, ...
 *     llmem_engine_create(model, &eo, &engine);
 *     ...
 *     llmem_engine_destroy(engine);
 *     llmem_memctl_destroy(mc);
 *
 * The predictor's options come from the engine (llmem_engine_predictor_options:
 * KV element size, block and slab geometry, activations apart) or, for a
 * KV cache without an engine, from llmem_memctl_kv_predictor_options; no
 * caller re-derives them. The pool purges MANUAL: memory goes back when the
 * controller says so. Destroy the engine (or KV) first: the pool must
 * outlive what allocates from it.
 */
#ifndef LLMEM_MEMCTL_H
#define LLMEM_MEMCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/controller.h"
#include "llmem/engine.h"
#include "llmem/kv.h"
#include "llmem/pool.h"
#include "llmem/predictor.h"
#include "llmem/resource.h"
#include "llmem/shape.h"
#include "llmem/status.h"
#include "llmem/timeline.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_memctl llmem_memctl;

/* Zero fields mean the default. */
typedef struct llmem_memctl_options {
    const char *name;                 /* the pool's name; default "memctl" */
    llmem_resource *resource;         /* the pool's resource, borrowed; default the os resource without huge
                                         pages (llmem_resource_default) */
    size_t first_superblock_bytes;    /* 0 = the pool's default (llmem_memctl_create_for_engine: 1 MiB) */
    size_t max_superblock_bytes;      /* the pool's cap on one superblock; 0 = its default */
    uint32_t pool_decay_ms;           /* the pool's decay_ms; 0 = its default */
    bool no_predictor;                /* reserve from controller.bytes_per_token_hint alone */
    llmem_predictor_options predictor; /* llmem_memctl_create: required unless no_predictor (the _for_
                                         calls fill it) */
    llmem_controller_options controller; /* its pool and predictor are set here; zero fields the defaults */
} llmem_memctl_options;

LLMEM_API llmem_memctl_options llmem_memctl_options_default(void);

/* Pool, predictor (unless no_predictor), controller. LLMEM_EINVAL for bad
 * options (the controller's or predictor's checks), LLMEM_ENOMEM. */
LLMEM_API llmem_status llmem_memctl_create(const llmem_memctl_options *o, llmem_memctl **out);

/* For an engine: the predictor from llmem_engine_predictor_options(m, eo),
 * and the controller; then eo->pool, eo->on_stage, eo->stage_ctx and
 * eo->on_step_done (the measured peaks train the predictor's corrector)
 * are set so the engine created with *eo runs under it. o may be NULL. */
LLMEM_API llmem_status llmem_memctl_create_for_engine(const llmem_model *m, llmem_engine_options *eo,
                                                      const llmem_memctl_options *o, llmem_memctl **out);

/* The predictor options of a KV cache alone over the pool (activations
 * apart): a model of this shape, the KV's element size, block and slab
 * geometry as ko gives them (ko->slab_bytes 0: the manager's default). */
LLMEM_API llmem_status llmem_memctl_kv_predictor_options(const llmem_shape *shape, const llmem_kv_options *ko,
                                                         llmem_predictor_options *out);

LLMEM_API void llmem_memctl_destroy(llmem_memctl *mc);

/* Put the controller's decisions that moved memory on a timeline (a
 * reserve already satisfied is noise on a chart; stage changes are the
 * timeline's own bands). Nothing for NULL arguments; LLMEM_ENOMEM when the
 * events cannot be copied. */
LLMEM_API llmem_status llmem_memctl_add_decisions(const llmem_controller *ctl, llmem_timeline *tl);

LLMEM_API llmem_pool *llmem_memctl_pool(const llmem_memctl *mc);
LLMEM_API llmem_predictor *llmem_memctl_predictor(const llmem_memctl *mc);
LLMEM_API llmem_controller *llmem_memctl_controller(const llmem_memctl *mc);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_MEMCTL_H */
