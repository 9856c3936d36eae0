/* A tiny llmem consumer: proves the installed headers, libraries and
 * package files are enough to build and run against llmem. */
#include <stdio.h>
#include <string.h>

#include <llmem/llmem.h>

int main(void)
{
    llmem_arena *a;
    if (llmem_arena_create(NULL, &a) != LLMEM_OK) return 1;
    char *s = llmem_arena_alloc(a, 64, 0, NULL);
    if (!s) return 1;
    strcpy(s, "hello from llmem ");
    strcat(s, llmem_version());
    puts(s);
    llmem_arena_destroy(a);
    return strcmp(llmem_version(), LLMEM_VERSION_STRING) != 0;
}
