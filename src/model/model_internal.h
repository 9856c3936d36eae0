/*
 * model_internal.h - what model.c, gguf.c and llama2c.c share. Not installed.
 *
 * A model is a byte range (a file mapping, or caller memory) plus tables
 * built from it by one parser: tensors (names copied, data pointing into the
 * range), an index from tensor names to positions, and for GGUF the
 * metadata entries (pointing into the range) with their own index. The
 * parsers fill these fields and never map or unmap; model.c owns the
 * mapping and frees every table, also after a parser fails halfway, so a
 * parser only has to leave each pointer it allocated in the model.
 */
#ifndef LLMEM_MODEL_INTERNAL_H
#define LLMEM_MODEL_INTERNAL_H

#include <sys/stat.h>
#include <time.h>

#include "internal.h"
#include "llmem/model.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llmem's model loaders read little-endian files in place: a little-endian host is required"
#endif

/* One GGUF metadata key/value; every offset is into the model's bytes. */
typedef struct llmem__meta {
    const char *key;      /* into the file, not NUL-terminated */
    uint64_t key_len;
    uint64_t offset;      /* of the key's u64 length field (for messages) */
    uint32_t type;        /* llmem_meta_type */
    uint32_t elem_type;   /* arrays: llmem_meta_type of the elements */
    uint64_t value;       /* scalars: the value; strings: the u64 length; arrays: the first element */
    uint64_t count;       /* arrays: elements */
    uint64_t *str_off;    /* string arrays: each element's u64 length field (count entries); else NULL */
} llmem__meta;

/* Open addressing with linear probing: slots hold position + 1 (0 = empty);
 * capacity a power of two, at least twice the entries. */
typedef struct llmem__index {
    size_t *slots;
    size_t mask;
} llmem__index;

struct llmem_model {
    llmem_model_config config;
    const uint8_t *base;       /* the file's bytes */
    size_t size;
    void *map;                 /* the mapping (base), NULL for memory models */
    llmem_tensor *tensors;     /* n_tensors, in file order */
    size_t n_tensors;
    char *names;               /* every tensor name, NUL-terminated, back to back */
    llmem__index tensor_index;
    llmem__meta *meta;         /* n_meta, in file order */
    size_t n_meta;
    uint64_t meta_end;         /* GGUF: the offset just past the last key/value (meta[i] spans
                                  meta[i].offset .. meta[i + 1].offset, the last one .. meta_end) */
    llmem__index meta_index;
    uint64_t tensor_bytes;     /* sum over tensors */
    double open_seconds;
    /* The file as opened (llmem_model_check_file); path NULL for memory models. */
    char *path;
    bool copied;               /* read into anonymous memory (options.copy), not mapped from the file */
    bool releasable;           /* a private, unlocked mapping of the file (not shared, mlock, copy or
                                  memory): llmem__model_release may give its pages back */
    dev_t dev;
    ino_t ino;
    off_t file_size;
    struct timespec mtime;
};

/* ---- model.c ---- */

/* Elements per block of a type (1 for scalars), 0 if llmem does not know it. */
uint32_t llmem__dtype_block(uint32_t type);

/* Build m->tensor_index over m->tensors (names set). LLMEM_EFORMAT naming a
 * duplicate name (prefix: "gguf" or "llama2c"), LLMEM_ENOMEM. */
llmem_status llmem__tensor_index_build(llmem_model *m, const char *who);

/* Build m->meta_index over m->meta. LLMEM_EFORMAT naming a duplicate key. */
llmem_status llmem__meta_index_build(llmem_model *m);

/* The tensor or metadata entry of that (NUL-terminated) name, or NULL. */
const llmem_tensor *llmem__tensor_find(const llmem_model *m, const char *name);
const llmem__meta *llmem__meta_find(const llmem_model *m, const char *key);

/* A printable excerpt of n bytes of s for a message: at most 48 bytes, bytes
 * outside printable ASCII shown as '?', "..." when cut. dst has cap >= 56. */
void llmem__show(char *dst, size_t cap, const char *s, uint64_t n);

/* ---- gguf_write.c ---- */

/* Append one serialized key/value as it is (bytes: the u64 key length, the
 * key, the u32 type, the value), recorded under key (key_len bytes) so a
 * duplicate is refused. For copying metadata from one GGUF file to another. */
llmem_status llmem__gguf_add_raw(llmem_gguf_writer *w, const char *key, size_t key_len, const void *bytes, size_t len);

/* ---- gguf.c / llama2c.c ---- */

/* Parse m->base[0, m->size) (the format told by its magic) and fill the
 * tables and m->config. On failure the status and message are set and the
 * model holds whatever was allocated so far (model.c frees it). */
llmem_status llmem__gguf_parse(llmem_model *m);
llmem_status llmem__llama2c_parse(llmem_model *m);

#endif /* LLMEM_MODEL_INTERNAL_H */
