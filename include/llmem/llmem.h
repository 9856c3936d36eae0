/*
 * llmem/llmem.h - everything at once.
 *
 * llmem manages the memory of LLM inference: resources (where bytes come
 * from), pools (arena, fixed blocks, the dynamic pool, the multi-size
 * pool), the KV cache manager, the planner and predictor, the stage-aware
 * controller, models, the engine, the scheduler and the server. Include
 * the module headers you need, or this one for all of them.
 */
#ifndef LLMEM_LLMEM_H
#define LLMEM_LLMEM_H

#include "llmem/version.h"
#include "llmem/status.h"
#include "llmem/stats.h"
#include "llmem/outfile.h"
#include "llmem/resource.h"
#include "llmem/fence.h"
#include "llmem/os_resource.h"
#include "llmem/sim_resource.h"
#include "llmem/limit_resource.h"
#include "llmem/fault_resource.h"
#include "llmem/tracking_resource.h"
#include "llmem/cuda_resource.h"
#include "llmem/arena.h"
#include "llmem/fixed.h"
#include "llmem/pool.h"
#include "llmem/profile.h"
#include "llmem/multipool.h"
#include "llmem/kv.h"
#include "llmem/shape.h"
#include "llmem/trace.h"
#include "llmem/model.h"
#include "llmem/quant.h"
#include "llmem/synth.h"
#include "llmem/tokenizer.h"
#include "llmem/sampler.h"
#include "llmem/stage.h"
#include "llmem/engine.h"
#include "llmem/planner.h"
#include "llmem/workload.h"
#include "llmem/predictor.h"
#include "llmem/timeline.h"
#include "llmem/controller.h"
#include "llmem/memctl.h"
#include "llmem/step_model.h"
#include "llmem/sched.h"
#include "llmem/replay.h"
#include "llmem/openai.h"
#include "llmem/server.h"

#endif /* LLMEM_LLMEM_H */
