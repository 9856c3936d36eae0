/*
 * memctl.c - pool + predictor + controller in one call (llmem/memctl.h).
 *
 * Creation order is dependency order (pool, predictor, controller) and
 * destruction the reverse; a failure part way destroys what was made, so
 * nothing is left behind.
 */
#include <stdlib.h>
#include <string.h>

#include "llmem/memctl.h"

#include "../core/internal.h"

struct llmem_memctl {
    llmem_pool *pool;
    llmem_predictor *pred;
    llmem_controller *ctl;
};

llmem_memctl_options llmem_memctl_options_default(void)
{
    llmem_memctl_options o;
    memset(&o, 0, sizeof o);
    o.predictor = llmem_predictor_options_default();
    return o;
}

void llmem_memctl_destroy(llmem_memctl *mc)
{
    if (!mc) return;
    llmem_controller_destroy(mc->ctl);
    llmem_predictor_destroy(mc->pred);
    llmem_pool_destroy(mc->pool);
    free(mc);
}

llmem_status llmem_memctl_create(const llmem_memctl_options *o, llmem_memctl **out)
{
    if (!o || !out) return llmem__fail(LLMEM_EINVAL, "memctl create: null argument");
    *out = NULL;
    llmem_memctl *mc = calloc(1, sizeof *mc);
    if (!mc) return llmem__fail(LLMEM_ENOMEM, "memctl: no memory");
    llmem_pool_options po = llmem_pool_options_default();
    po.name = o->name ? o->name : "memctl";
    po.resource = o->resource ? o->resource : llmem_resource_default();
    if (o->first_superblock_bytes) po.first_superblock_bytes = o->first_superblock_bytes;
    po.purge = LLMEM_POOL_PURGE_MANUAL; /* the controller decides */
    if (o->max_superblock_bytes) po.max_superblock_bytes = o->max_superblock_bytes;
    if (o->pool_decay_ms) po.decay_ms = o->pool_decay_ms;
    llmem_status st = llmem_pool_create(&po, &mc->pool);
    if (!st && !o->no_predictor) st = llmem_predictor_create(&o->predictor, &mc->pred);
    if (!st) {
        llmem_controller_options co = o->controller;
        co.pool = mc->pool;
        co.predictor = mc->pred;
        st = llmem_controller_create(&co, &mc->ctl);
    }
    if (st) {
        llmem_memctl_destroy(mc);
        return st;
    }
    *out = mc;
    return LLMEM_OK;
}

llmem_status llmem_memctl_create_for_engine(const llmem_model *m, llmem_engine_options *eo,
                                            const llmem_memctl_options *o, llmem_memctl **out)
{
    if (!m || !eo || !out) return llmem__fail(LLMEM_EINVAL, "memctl for engine: null argument");
    llmem_memctl_options mo = o ? *o : llmem_memctl_options_default();
    llmem_status st = llmem_engine_predictor_options(m, eo, &mo.predictor);
    if (st) return st;
    /* Plain pages and a small first superblock, as the engine's own pool:
     * the KV grows a block at a time. */
    if (!mo.first_superblock_bytes) mo.first_superblock_bytes = (size_t)1 << 20;
    if ((st = llmem_memctl_create(&mo, out))) return st;
    eo->pool = (*out)->pool;
    eo->on_stage = llmem_controller_on_stage;
    eo->stage_ctx = (*out)->ctl;
    eo->on_step_done = llmem_controller_on_step_done; /* measured peaks train the predictor */
    return LLMEM_OK;
}

llmem_status llmem_memctl_kv_predictor_options(const llmem_shape *shape, const llmem_kv_options *ko,
                                               llmem_predictor_options *out)
{
    if (!shape || !ko || !out) return llmem__fail(LLMEM_EINVAL, "memctl kv predictor: null argument");
    static const size_t elem[] = {2, 4, 2, 1}; /* F16, F32, BF16, I8 */
    if ((unsigned)ko->dtype >= LLMEM_ARRAY_LEN(elem))
        return llmem__fail(LLMEM_EINVAL, "memctl kv predictor: unknown KV dtype %d", (int)ko->dtype);
    llmem_predictor_options p = llmem_predictor_options_default();
    p.shape = *shape;
    if (ko->max_seq_len) p.shape.max_ctx = ko->max_seq_len;
    p.kv_elem_bytes = elem[ko->dtype];
    p.block_tokens = ko->block_tokens ? ko->block_tokens : 16;
    p.kv_slab_bytes = ko->slab_bytes;
    p.activations_apart = true; /* only KV lives in this pool */
    *out = p;
    return LLMEM_OK;
}

llmem_pool *llmem_memctl_pool(const llmem_memctl *mc) { return mc ? mc->pool : NULL; }
llmem_predictor *llmem_memctl_predictor(const llmem_memctl *mc) { return mc ? mc->pred : NULL; }
llmem_controller *llmem_memctl_controller(const llmem_memctl *mc) { return mc ? mc->ctl : NULL; }

llmem_status llmem_memctl_add_decisions(const llmem_controller *ctl, llmem_timeline *tl)
{
    llmem_controller_stats cs = {sizeof cs};
    if (!tl || !ctl || llmem_controller_get_stats(ctl, &cs)) return LLMEM_OK;
    size_t cap = (size_t)(cs.events_total - cs.events_dropped);
    if (!cap) return LLMEM_OK;
    llmem_controller_event *ev = malloc(cap * sizeof *ev);
    if (!ev) return llmem__fail(LLMEM_ENOMEM, "memctl: no memory to copy %zu controller events", cap);
    size_t n = llmem_controller_events(ctl, ev, cap);
    for (size_t i = 0; i < n; i++) /* best effort: a full timeline keeps what it has */
        if (ev[i].action != LLMEM_CONTROLLER_STAGE && ev[i].bytes_before != ev[i].bytes_after)
            llmem_timeline_event(tl, ev[i].time_ns, ev[i].stage, llmem_controller_action_name(ev[i].action), ev[i].reason,
                                 ev[i].bytes_before, ev[i].bytes_after);
    free(ev);
    return LLMEM_OK;
}
