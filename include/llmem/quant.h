/*
 * llmem/quant.h - the GGUF/ggml quantised block formats: converting rows
 * of f32 to blocks and back, and quantising a whole model file.
 *
 * Types (numbered as llmem/model.h's llmem_dtype, which is ggml's
 * numbering). A row of n elements is n / block blocks; each block is:
 *
 *   type  block bytes  layout (f16 = IEEE half, little-endian)
 *   q4_0    32    18   f16 d; u8 qs[16]: x = d * (q - 8), 4-bit q; element j < 16 in the
 *                      low nibble of qs[j], element j + 16 in its high nibble
 *   q4_1    32    20   f16 d, m; u8 qs[16]: x = d * q + m (nibbles as q4_0)
 *   q5_0    32    22   f16 d; u8 qh[4]; u8 qs[16]: x = d * (q - 16), 5-bit q: the low four
 *                      bits as q4_0, bit 4 of element j is bit j of the u32 qh
 *   q5_1    32    24   f16 d, m; u8 qh[4]; u8 qs[16]: x = d * q + m (bits as q5_0)
 *   q8_0    32    34   f16 d; i8 qs[32]: x = d * q
 *   q2_k   256    84   u8 scales[16]; u8 qs[64]; f16 d, dmin: 16 groups of 16, group g
 *                      x = d * (scales[g] & 15) * q - dmin * (scales[g] >> 4), 2-bit q
 *   q3_k   256   110   u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d: 16 groups of 16,
 *                      x = d * (s_g - 32) * (q - 4), 3-bit q, 6-bit s_g packed in scales
 *   q4_k   256   144   f16 d, dmin; u8 scales[12]; u8 qs[128]: 8 groups of 32,
 *                      x = d * s_g * q - dmin * m_g, 4-bit q, 6-bit s_g and m_g
 *   q5_k   256   176   f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]: as q4_k, 5-bit q
 *   q6_k   256   210   u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d: 16 groups of 16,
 *                      x = d * scales[g] * (q - 32), 6-bit q
 *
 * Within a k-quant super-block the bits of element e lie as ggml lays them
 * (quant.c says where, type by type); files written here and by llama.cpp
 * are the same format, and the tests check llmem's decoding block by block
 * against llama.cpp's own.
 *
 * The quantisers are llmem's own: for each block (or group) a scale (and
 * for the types with a minimum, a minimum) chosen by a short search for the
 * least squared error, then the group scales themselves quantised against
 * the super-block's d and dmin, and the values rounded against those final
 * scales. They are deterministic, allocate nothing and are safe from any
 * thread.
 */
#ifndef LLMEM_QUANT_H
#define LLMEM_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/model.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements per block of a type (1 for f32, f16 and bf16); 0 if unknown. */
LLMEM_API uint32_t llmem_dtype_block_size(uint32_t type);

/* Whether llmem can write (quantise to) and read (dequantise) the type:
 * f32, f16, bf16 and every block type above. */
LLMEM_API bool llmem_dtype_is_quantizable(uint32_t type);

/* The type of a name as llmem_dtype_name writes it ("q4_k", case
 * insensitive; "q4_k_m" and "q4_k_s" are taken as q4_k); LLMEM_EINVAL if
 * none. */
LLMEM_API llmem_status llmem_dtype_parse(const char *name, uint32_t *out);

/* The type a matrix with rows of n elements takes when want is asked for:
 * want itself when n is a whole number of its blocks; otherwise the
 * fallback llama.cpp's quantiser uses (q2_k, q3_k -> q4_0; q4_k -> q5_0;
 * q5_k -> q5_1; q6_k -> q8_0), or f16 when not even 32 divides n. */
LLMEM_API uint32_t llmem_quant_row_type(uint32_t want, uint64_t n);

/* n f32 values (n a multiple of the type's block size) to the type's bytes
 * at dst (llmem_dtype_bytes(type, n) of them). LLMEM_EINVAL for a type it
 * cannot write or a partial block; non-finite inputs are LLMEM_ERANGE. */
LLMEM_API llmem_status llmem_quantize_row(uint32_t type, const float *src, void *dst, size_t n);

/* The reverse: n elements of the type at src to f32. LLMEM_EINVAL as above. */
LLMEM_API llmem_status llmem_dequantize_row(uint32_t type, const void *src, float *dst, size_t n);

/* ---- quantising a model file ---------------------------------------------------- */

typedef struct llmem_quantize_options {
    uint32_t type;          /* the matrices' type (an llmem_dtype); required */
    bool keep_output;       /* leave output.weight (the classifier) as it is; default false */
    bool progress;          /* progress lines on stderr for files over 100 MB when stderr is a terminal */
} llmem_quantize_options;

typedef struct llmem_quantize_report {
    size_t struct_size;     /* set by the caller: sizeof(llmem_quantize_report) */
    uint64_t tensors;       /* tensors written */
    uint64_t quantized;     /* of those, converted to the requested type */
    uint64_t fallback;      /* converted to another type because their rows are not whole blocks of
                               the requested one (k-quants: a 32-block type, else f16) */
    uint64_t kept;          /* copied as they were (1-D tensors, or already of the type) */
    uint64_t bytes_in, bytes_out; /* tensor data */
} llmem_quantize_report;

/* Read the GGUF model at in and write it to out with every 2-D weight
 * matrix converted to opts->type (through f32, from any type llmem reads),
 * metadata and 1-D tensors copied as they are, and general.file_type set
 * as llama.cpp numbers it. A matrix whose rows are not whole blocks of the
 * type falls back as llama.cpp's quantiser does: q2_k and q3_k to q4_0,
 * q4_k to q5_0, q5_k to q5_1, q6_k to q8_0, and to f16 when not even 32
 * divides the rows. out is written whole or not at all (the GGUF writer's
 * temporary file). report may be NULL. */
LLMEM_API llmem_status llmem_model_quantize(const char *in, const char *out, const llmem_quantize_options *opts,
                                            llmem_quantize_report *report);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_QUANT_H */
