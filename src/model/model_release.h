/*
 * model_release.h - giving a mapped model's pages back (model.c). Private
 * to llmem: the engine repacks some tensors into copies of its own at load
 * and then has no use for the file's pages of them.
 */
#ifndef LLMEM_MODEL_RELEASE_H
#define LLMEM_MODEL_RELEASE_H

#include <stdbool.h>
#include <stddef.h>

#include "llmem/model.h"

/* Whether m's bytes are a private, unlocked mapping of its file (opened
 * without options.shared, mlock or copy; not a memory model). Only then
 * may its pages be given back: a page read again after
 * llmem__model_release faults back in from the file, unchanged. */
bool llmem__model_releasable(const llmem_model *m);

/* Give back the whole pages inside [p, p + bytes), a range of m's bytes
 * (MADV_DONTNEED), so they leave the process's RSS; nothing when m is not
 * releasable or the range is not inside m. */
void llmem__model_release(const llmem_model *m, const void *p, size_t bytes);

#endif
