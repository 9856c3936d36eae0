/*
 * sbuf.c - growable string; capacity doubles, failure is sticky.
 */
#include "sbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void llmem__sbuf_init(llmem__sbuf *b) { *b = (llmem__sbuf){0}; }

void llmem__sbuf_free(llmem__sbuf *b)
{
    free(b->data);
    *b = (llmem__sbuf){0};
}

/* Make room for `extra` more bytes plus the NUL. */
static bool reserve(llmem__sbuf *b, size_t extra)
{
    if (b->failed) return false;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->failed = true;
        return false;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
        b->failed = true;
        return false;
    }
    b->data = d;
    b->cap = cap;
    return true;
}

void llmem__sbuf_putc(llmem__sbuf *b, char c)
{
    if (!reserve(b, 1)) return;
    b->data[b->len++] = c;
    b->data[b->len] = '\0';
}

void llmem__sbuf_puts(llmem__sbuf *b, const char *s)
{
    size_t n = strlen(s);
    if (!reserve(b, n)) return;
    memcpy(b->data + b->len, s, n + 1);
    b->len += n;
}

void llmem__sbuf_printf(llmem__sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[128];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if (!reserve(b, (size_t)n)) return;
    if ((size_t)n < sizeof small) {
        memcpy(b->data + b->len, small, (size_t)n + 1);
    } else {
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

void llmem__json_str(llmem__sbuf *b, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    llmem__sbuf_putc(b, '"');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': llmem__sbuf_puts(b, "\\\""); break;
        case '\\': llmem__sbuf_puts(b, "\\\\"); break;
        case '\n': llmem__sbuf_puts(b, "\\n"); break;
        case '\r': llmem__sbuf_puts(b, "\\r"); break;
        case '\t': llmem__sbuf_puts(b, "\\t"); break;
        default:
            if (c < 0x20 || c == 0x7f) {
                char e[7] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15], 0};
                llmem__sbuf_puts(b, e);
            } else {
                llmem__sbuf_putc(b, (char)c);
            }
        }
    }
    llmem__sbuf_putc(b, '"');
}
