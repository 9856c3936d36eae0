/*
 * weights.h - loading the engine's weights. Private to llmem.
 *
 * llmem__engine_load_weights runs once, from llmem_engine_create, on an
 * engine whose shape, thread team, layer table and (for the pool) resource
 * are set. It binds each layer's seven matrices, the embedding and the
 * classifier (the embedding when the model ties them) in place in the
 * mapped file, checking each against the shape and the kernels' types; it
 * converts the 1-D tensors (norms, biases) that are not f32 into one f32
 * block (e->converted); it sets e->xq_row and st.weights_mapped_bytes; then,
 * on the AVX2 paths over a private file mapping, it repacks the q4_K and
 * q5_0 matrices 8 rows interleaved into one mapping of e->res
 * (e->repacked), giving the file's pages back a matrix at a time.
 * The memory it takes is freed by llmem_engine_destroy.
 */
#ifndef LLMEM_ENGINE_WEIGHTS_H
#define LLMEM_ENGINE_WEIGHTS_H

#include "llmem/engine.h"

/* LLMEM_OK, or the first failure with its message set: a tensor missing
 * (LLMEM_ENOTFOUND from the model), of the wrong shape (LLMEM_EFORMAT)
 * or of a type the kernels do not take (LLMEM_ENOTSUP), or no memory. */
llmem_status llmem__engine_load_weights(llmem_engine *e);

#endif /* LLMEM_ENGINE_WEIGHTS_H */
