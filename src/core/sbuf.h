/*
 * sbuf.h - a growable string for building documents (exporter, reports).
 * Not installed. Allocation failure is sticky: `failed` is set, further
 * appends do nothing, and the caller checks once at the end.
 */
#ifndef LLMEM_SBUF_H
#define LLMEM_SBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct llmem_sbuf {
    char *data;   /* NUL-terminated when len > 0 */
    size_t len;
    size_t cap;
    bool failed;
} llmem_sbuf;

void llmem_sbuf_init(llmem_sbuf *b);
void llmem_sbuf_free(llmem_sbuf *b);
void llmem_sbuf_putc(llmem_sbuf *b, char c);
void llmem_sbuf_puts(llmem_sbuf *b, const char *s);
void llmem_sbuf_printf(llmem_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* LLMEM_SBUF_H */
