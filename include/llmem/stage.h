/*
 * llmem/stage.h - the stages of inference, as an engine reports them.
 *
 * Memory needs follow the stage: loading maps weights, prefill needs a
 * large activation workspace for a whole prompt at once, decode needs a
 * little workspace per step while the KV cache creeps up one slot per token,
 * and idle is when memory can go back. An engine reports every change of
 * stage as an event through one callback (llmem_stage_fn); whoever manages
 * memory - the stage-aware controller (llmem/controller.h) - listens there.
 * The engine and the controller count the stages in their stats; the pool
 * knows nothing of stages.
 */
#ifndef LLMEM_STAGE_H
#define LLMEM_STAGE_H

#include <stdint.h>

#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum llmem_stage {
    LLMEM_STAGE_IDLE = 0,    /* no request running */
    LLMEM_STAGE_LOAD = 1,    /* weights being mapped and prepared */
    LLMEM_STAGE_PREFILL = 2, /* a step that processes prompt tokens (batch sequences, tokens in all) */
    LLMEM_STAGE_DECODE = 3,  /* a step of one new token per sequence */
    LLMEM_STAGE_COUNT_ = 4
} llmem_stage;

/* Name of a stage ("idle", "load", "prefill", "decode"); "?" otherwise. */
LLMEM_API const char *llmem_stage_name(llmem_stage s);

typedef struct llmem_stage_event {
    llmem_stage stage;
    uint32_t batch;          /* sequences in the step (PREFILL, DECODE) */
    uint64_t tokens;         /* tokens in the step (PREFILL, DECODE); bytes mapped (LOAD) */
    uint64_t time_ns;        /* monotonic clock */
} llmem_stage_event;

/* A listener. Called on the engine's thread; must not call back into the
 * engine. */
typedef void (*llmem_stage_fn)(void *ctx, const llmem_stage_event *ev);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_STAGE_H */
