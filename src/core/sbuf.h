/*
 * sbuf.h - a growable string for building documents (exporter, reports).
 * Not installed. Allocation failure is sticky: `failed` is set, further
 * appends do nothing, and the caller checks once at the end.
 */
#ifndef LLMEM_SBUF_H
#define LLMEM_SBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct llmem__sbuf {
    char *data;   /* NUL-terminated when len > 0 */
    size_t len;
    size_t cap;
    bool failed;
} llmem__sbuf;

void llmem__sbuf_init(llmem__sbuf *b);
void llmem__sbuf_free(llmem__sbuf *b);
void llmem__sbuf_putc(llmem__sbuf *b, char c);
void llmem__sbuf_puts(llmem__sbuf *b, const char *s);
void llmem__sbuf_printf(llmem__sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Append a JSON string literal of s[0..len), quotes included: quote,
 * backslash, control characters, NUL and DEL escaped; other bytes as they
 * are (valid UTF-8 assumed). */
void llmem__json_str(llmem__sbuf *b, const char *s, size_t len);

#endif /* LLMEM_SBUF_H */
