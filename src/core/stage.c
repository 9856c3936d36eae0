/*
 * stage.c - the names of the inference stages (llmem/stage.h). In the core,
 * below everything that reports or draws a stage: the engine emits them,
 * the controller logs them, the timeline labels its bands with them.
 */
#include "llmem/stage.h"

const char *llmem_stage_name(llmem_stage s)
{
    static const char *const names[LLMEM_STAGE_COUNT_] = {"idle", "load", "prefill", "decode"};
    return (unsigned)s < LLMEM_STAGE_COUNT_ ? names[s] : "?";
}
