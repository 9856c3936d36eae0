/*
 * llmem/model.h - model files mapped, not copied.
 *
 * Two formats: llama2.c checkpoints (Karpathy's run.c layout: a header of
 * seven int32 - dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
 * seq_len - then f32 weights; a negative vocab_size means a separate
 * classifier follows) and GGUF (versions 2 and 3: metadata key/values,
 * tensor infos, aligned tensor data; tensors F32, F16, BF16, the 32-element
 * block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the k-quants Q2_K..Q6_K).
 * The format is told by the file's first bytes, not its name.
 *
 * The file is mmapped (MAP_PRIVATE by default; MAP_SHARED so processes
 * share one page-cache copy), with optional MAP_POPULATE, madvise hints and
 * mlock. Tensors point into the mapping; nothing is copied. Whatever an
 * engine must convert (F16 to F32, say) it copies itself from llmem.
 * Opening never blocks: a FIFO or a device given as the model is refused
 * (LLMEM_EIO, "is a FIFO, not a regular file").
 *
 * A mapped file is not a private copy. If another process truncates it
 * while it is mapped, the next touch of a page past the new end raises
 * SIGBUS and kills this process (the kernel's rule for file mappings, with
 * MAP_PRIVATE too); if it rewrites it in place, pages not yet read show the
 * new bytes, which were never checked. An operator who cannot promise the
 * file stays as it is (a model directory others deploy into) has two
 * tools: options.copy reads the file into private anonymous memory at open
 * (costs its size in RAM, not shared, and the read time; then nothing done
 * to the file can reach the model), and llmem_model_check_file, cheap (one
 * stat), says whether the file is still the one mapped: call it before
 * each request, or on a timer, and stop serving from a model it calls
 * corrupt. Deploy new models by writing a new file and renaming it over
 * the old name (as llmem's own writers do): a mapping of the old file
 * stays valid.
 *
 * Both formats are presented the same way: a config (llmem_model_config)
 * and tensors under GGUF's llama names, dims in GGUF order (dims[0] is the
 * row length, the fastest-varying index):
 *
 *     token_embd.weight       (dims: hidden, vocab)
 *     blk.N.attn_norm.weight  (hidden)
 *     blk.N.attn_q.weight     (hidden, heads * head_dim)
 *     blk.N.attn_k.weight     (hidden, kv_heads * head_dim)
 *     blk.N.attn_v.weight     (hidden, kv_heads * head_dim)
 *     blk.N.attn_output.weight(heads * head_dim, hidden)
 *     blk.N.ffn_norm.weight   (hidden)
 *     blk.N.ffn_gate.weight   (hidden, ffn)      llama2.c's w1
 *     blk.N.ffn_down.weight   (ffn, hidden)      llama2.c's w2
 *     blk.N.ffn_up.weight     (hidden, ffn)      llama2.c's w3
 *     output_norm.weight      (hidden)
 *     output.weight           (hidden, vocab)    absent when tied to token_embd
 *     blk.N.attn_q.bias       (heads * head_dim)     qwen2: required; llama: each
 *     blk.N.attn_k.bias       (kv_heads * head_dim)  optional, as llama.cpp reads
 *     blk.N.attn_v.bias       (kv_heads * head_dim)  them (f32 or f16)
 *
 * A matrix with dims (n, d) is d rows of n elements: y = W x takes x of n
 * and gives y of d.
 *
 * Every field, count, offset and size in a file is checked before use, with
 * overflow-safe arithmetic: tensors lie inside the file, do not overlap the
 * header, have the element counts their dims say, and agree with the
 * config. A bad file is LLMEM_EFORMAT with a message naming the problem and
 * the byte offset; a short one, the same. Nothing is mapped after a failure.
 */
#ifndef LLMEM_MODEL_H
#define LLMEM_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/shape.h"
#include "llmem/stats.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_model llmem_model;

/* Element types, numbered as GGML numbers them (GGUF stores these ids).
 * The block types' layouts are in llmem/quant.h. */
typedef enum llmem_dtype {
    LLMEM_DTYPE_F32 = 0,
    LLMEM_DTYPE_F16 = 1,
    LLMEM_DTYPE_Q4_0 = 2,  /* blocks of 32: f16 scale, 16 bytes of nibbles (18 bytes) */
    LLMEM_DTYPE_Q4_1 = 3,  /* blocks of 32: f16 scale and min, nibbles (20 bytes) */
    LLMEM_DTYPE_Q5_0 = 6,  /* blocks of 32: f16 scale, 5-bit values (22 bytes) */
    LLMEM_DTYPE_Q5_1 = 7,  /* blocks of 32: f16 scale and min, 5-bit values (24 bytes) */
    LLMEM_DTYPE_Q8_0 = 8,  /* blocks of 32: an f16 scale, then 32 int8 (34 bytes) */
    LLMEM_DTYPE_Q2_K = 10, /* super-blocks of 256: 2-bit values, 4-bit scales and mins (84 bytes) */
    LLMEM_DTYPE_Q3_K = 11, /* super-blocks of 256: 3-bit values, 6-bit scales (110 bytes) */
    LLMEM_DTYPE_Q4_K = 12, /* super-blocks of 256: 4-bit values, 6-bit scales and mins (144 bytes) */
    LLMEM_DTYPE_Q5_K = 13, /* super-blocks of 256: 5-bit values, 6-bit scales and mins (176 bytes) */
    LLMEM_DTYPE_Q6_K = 14, /* super-blocks of 256: 6-bit values, 8-bit scales (210 bytes) */
    LLMEM_DTYPE_BF16 = 30
} llmem_dtype;

/* Name of a type ("f32", "q8_0", ...), "?" for one llmem does not know. */
LLMEM_API const char *llmem_dtype_name(uint32_t type);

/* Bytes of n elements of type t (n a multiple of the block size for block
 * types); 0 if t is unknown or n is not a whole number of blocks. */
LLMEM_API uint64_t llmem_dtype_bytes(uint32_t type, uint64_t n);

typedef enum llmem_model_format {
    LLMEM_MODEL_LLAMA2C = 0,
    LLMEM_MODEL_GGUF = 1
} llmem_model_format;

typedef struct llmem_model_options {
    bool shared;        /* MAP_SHARED instead of MAP_PRIVATE (one copy across processes); default false */
    bool populate;      /* MAP_POPULATE: fault everything in at open; default false */
    bool sequential;    /* madvise(SEQUENTIAL | WILLNEED) over the tensor data at open; default false */
    bool hugepage;      /* madvise(MADV_HUGEPAGE) over the 2 MiB-aligned part; default false */
    bool mlock;         /* mlock the mapping (LLMEM_EPERM if the rlimit refuses); default false */
    bool progress;      /* a progress line on stderr while populating files over 100 MB, when stderr is a terminal */
    bool copy;          /* read the file into private anonymous memory instead of mapping it: immune to the
                           file being truncated (SIGBUS) or rewritten later; costs the file's size in RAM and the
                           read at open; `shared` and `populate` do not apply; default false */
} llmem_model_options;

LLMEM_API llmem_model_options llmem_model_options_default(void);

/* The architectures the GGUF loader takes (general.architecture). Both
 * are the llama block (RMSNorm, rotary attention, SwiGLU FFN); they differ
 * in what the table below the config says. */
typedef enum llmem_arch {
    LLMEM_ARCH_LLAMA = 0,   /* "llama" (llama2.c checkpoints too): interleaved-pair rope, Q/K/V biases optional */
    LLMEM_ARCH_QWEN2 = 1    /* "qwen2": NEOX rope (rotate halves), Q/K/V biases required, heads x head_dim == hidden */
} llmem_arch;

/* How rotary position embedding pairs a head's dimensions (ggml's names). */
typedef enum llmem_rope_style {
    LLMEM_ROPE_NORM = 0,    /* pairs (2i, 2i+1): llama, as run.c and llama.cpp's LLAMA_ROPE_TYPE_NORM */
    LLMEM_ROPE_NEOX = 2     /* pairs (i, i + rope_dim/2): qwen2, llama.cpp's LLAMA_ROPE_TYPE_NEOX */
} llmem_rope_style;

typedef struct llmem_model_config {
    llmem_model_format format;
    uint32_t version;       /* GGUF version; 0 for llama2.c */
    llmem_shape shape;      /* layers, hidden, heads, kv_heads, head_dim, ffn, vocab, max_ctx, rope_theta, tied */
    uint32_t rope_dim;      /* rotated dimensions per head (<= head_dim); llama2.c: head_dim */
    float norm_eps;         /* RMSNorm epsilon; llama2.c: 1e-5 */
    uint32_t weight_type;   /* llmem_dtype of the matrices (the most common one) */
    llmem_arch arch;        /* general.architecture */
    llmem_rope_style rope_style; /* the arch's: NORM for llama, NEOX for qwen2 */
    bool qkv_bias;          /* some blk.N.attn_{q,k,v}.bias is present (added to that projection) */
    uint32_t sliding_window; /* ARCH.attention.sliding_window: a token attends to the last sliding_window
                                positions, itself included (llama.cpp's LLAMA_SWA_TYPE_STANDARD, every
                                layer); 0 = full causal attention (no key, or 0). llama.cpp does not honour
                                the key for llama or qwen2 files (it reads it only for archs such as gemma2,
                                cohere2, phi3 - where it disables it): llmem does, as Mistral was trained */
} llmem_model_config;

typedef struct llmem_tensor {
    const char *name;       /* NUL-terminated (copied out of the file) */
    uint32_t type;          /* llmem_dtype */
    uint32_t n_dims;        /* 1..4 */
    uint64_t dims[4];       /* dims[0] fastest; unused ones are 1 */
    uint64_t n_elements;
    uint64_t bytes;
    uint64_t offset;        /* of its data in the file */
    const void *data;       /* into the mapping */
} llmem_tensor;

/* The fields of llmem_model_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_MODEL_STATS_FIELDS(X) \
    X(GAUGE, U64, file_bytes, "Size of the model file.") \
    X(GAUGE, U64, mapped_bytes, "Bytes of address space mapped for the file (whole pages).") \
    /* of the mapping, now (mincore) */ \
    X(GAUGE, U64, resident_bytes, "Bytes of the mapping resident in memory now (mincore).") \
    /* sum of tensor data */ \
    X(GAUGE, U64, tensor_bytes, "Bytes of tensor data.") \
    X(GAUGE, U64, tensors, "Tensors in the file.") \
    /* open: parse, map, hints, populate */ \
    X(GAUGE, DOUBLE, open_seconds, "Seconds open took: parse, map, hints, populate.")

typedef struct llmem_model_stats {
    size_t struct_size;
    LLMEM_MODEL_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_model_stats;

/* Open and check a model file. */
LLMEM_API llmem_status llmem_model_open(const char *path, const llmem_model_options *opts, llmem_model **out);

/* The same from bytes already in memory (not copied: they must outlive the
 * model). For tests and fuzzing; no mapping options apply. */
LLMEM_API llmem_status llmem_model_open_memory(const void *data, size_t size, llmem_model **out);

/* Unmap and free; NULL does nothing. Tensor pointers die with it. */
LLMEM_API void llmem_model_close(llmem_model *m);

/* Whether the file a model maps is still the one it opened (one stat of
 * the path; see the top of this header):
 *   LLMEM_OK        the same file, size and modification time; also for
 *                   copied models (options.copy) and memory models;
 *   LLMEM_ECORRUPT  the same file truncated (touching the mapping past its
 *                   new end raises SIGBUS: stop using the model) or
 *                   modified in place (the bytes were not checked);
 *   LLMEM_ESTATE    the path now names another file, or nothing (renamed
 *                   over, removed): this model's mapping is intact, reopen
 *                   to serve the new file;
 *   LLMEM_EIO       the path cannot be looked up. */
LLMEM_API llmem_status llmem_model_check_file(const llmem_model *m);

LLMEM_API const llmem_model_config *llmem_model_get_config(const llmem_model *m);

/* The tensor of that name; LLMEM_ENOTFOUND if absent. */
LLMEM_API llmem_status llmem_model_tensor(const llmem_model *m, const char *name, const llmem_tensor **out);

/* All tensors, in file order. */
LLMEM_API size_t llmem_model_tensor_count(const llmem_model *m);
LLMEM_API const llmem_tensor *llmem_model_tensor_at(const llmem_model *m, size_t i);

/* madvise over every tensor's data before a pass (WILLNEED, SEQUENTIAL,
 * RANDOM or DONTNEED as in <sys/mman.h>); a no-op for memory models. */
LLMEM_API llmem_status llmem_model_advise(llmem_model *m, int advice);

LLMEM_API llmem_status llmem_model_get_stats(const llmem_model *m, llmem_model_stats *out);
LLMEM_API const llmem_stats_schema *llmem_model_stats_schema(void);

/* ---- GGUF metadata ----------------------------------------------------------------
 * Typed lookups; LLMEM_ENOTFOUND when the key is absent, LLMEM_EFORMAT when it
 * has another type (integers of any width convert when the value fits).
 * llama2.c models have no metadata. Strings are not NUL-terminated: a
 * pointer into the mapping and a length. */

typedef enum llmem_meta_type {
    LLMEM_META_U8 = 0, LLMEM_META_I8 = 1, LLMEM_META_U16 = 2, LLMEM_META_I16 = 3,
    LLMEM_META_U32 = 4, LLMEM_META_I32 = 5, LLMEM_META_F32 = 6, LLMEM_META_BOOL = 7,
    LLMEM_META_STRING = 8, LLMEM_META_ARRAY = 9, LLMEM_META_U64 = 10, LLMEM_META_I64 = 11,
    LLMEM_META_F64 = 12
} llmem_meta_type;

typedef struct llmem_meta_array {
    llmem_meta_type type;   /* of the elements */
    uint64_t count;
} llmem_meta_array;

LLMEM_API llmem_status llmem_model_meta_u32(const llmem_model *m, const char *key, uint32_t *out);
LLMEM_API llmem_status llmem_model_meta_bool(const llmem_model *m, const char *key, bool *out);
LLMEM_API llmem_status llmem_model_meta_f32(const llmem_model *m, const char *key, float *out);
LLMEM_API llmem_status llmem_model_meta_str(const llmem_model *m, const char *key, const char **s, size_t *len);
LLMEM_API llmem_status llmem_model_meta_array(const llmem_model *m, const char *key, llmem_meta_array *out);
/* Element i of an array: strings, numbers (as double; integers up to 2^53
 * exactly) */
LLMEM_API llmem_status llmem_model_meta_array_str(const llmem_model *m, const char *key, uint64_t i, const char **s,
                                                  size_t *len);
LLMEM_API llmem_status llmem_model_meta_array_num(const llmem_model *m, const char *key, uint64_t i, double *out);

/* ---- writing GGUF -----------------------------------------------------------------
 * For `llmem synth` and tests: a GGUF v3 file from metadata and tensors
 * given in memory. Keys and tensors are written in the order added. */

typedef struct llmem_gguf_writer llmem_gguf_writer;

LLMEM_API llmem_status llmem_gguf_writer_create(llmem_gguf_writer **out);
LLMEM_API void llmem_gguf_writer_destroy(llmem_gguf_writer *w);
LLMEM_API llmem_status llmem_gguf_add_u32(llmem_gguf_writer *w, const char *key, uint32_t v);
LLMEM_API llmem_status llmem_gguf_add_f32(llmem_gguf_writer *w, const char *key, float v);
LLMEM_API llmem_status llmem_gguf_add_bool(llmem_gguf_writer *w, const char *key, bool v);
LLMEM_API llmem_status llmem_gguf_add_str(llmem_gguf_writer *w, const char *key, const char *v);
/* Arrays: strings (n NUL-terminated), f32 and i32. Copied. */
LLMEM_API llmem_status llmem_gguf_add_str_array(llmem_gguf_writer *w, const char *key, const char *const *v, size_t n);
LLMEM_API llmem_status llmem_gguf_add_f32_array(llmem_gguf_writer *w, const char *key, const float *v, size_t n);
LLMEM_API llmem_status llmem_gguf_add_i32_array(llmem_gguf_writer *w, const char *key, const int32_t *v, size_t n);
/* A tensor whose data a callback produces when the file is written (so a
 * 3 GB model is never whole in memory): fill(ctx, index, buf, bytes) writes
 * the tensor's bytes. dims as in llmem_tensor. */
typedef llmem_status (*llmem_gguf_fill_fn)(void *ctx, size_t index, void *buf, size_t bytes);
LLMEM_API llmem_status llmem_gguf_add_tensor(llmem_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                             const uint64_t *dims, llmem_gguf_fill_fn fill, void *ctx);
/* Write it all (alignment 32), with progress on stderr for files over
 * 100 MB when `progress` and stderr is a terminal. */
LLMEM_API llmem_status llmem_gguf_write(llmem_gguf_writer *w, const char *path, bool progress);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_MODEL_H */
