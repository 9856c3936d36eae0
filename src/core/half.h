/*
 * half.h - IEEE half <-> float (half.c). Private to llmem.
 */
#ifndef LLMEM_CORE_HALF_H
#define LLMEM_CORE_HALF_H

#include <stdint.h>

/* Exact. */
float llmem__f16_to_f32(uint16_t h);

/* Round to nearest even; overflow to inf; NaN stays NaN. */
uint16_t llmem__f32_to_f16(float f);

#endif
