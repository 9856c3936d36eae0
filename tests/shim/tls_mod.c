/*
 * tls_mod.c - a module for test_shim_preload's dlopen test: 64 KiB of
 * thread-local storage, too much for the static TLS surplus, so the
 * dynamic linker allocates each thread's block with malloc (through
 * __tls_get_addr) on first touch - with libllmem-malloc.so as that malloc.
 */
int llmem_test_tls_touch(int n);

static __thread int block[16384];

int llmem_test_tls_touch(int n)
{
    int sum = 0;
    for (int i = 0; i < n; i++) block[i % 16384] = 7;
    for (int i = 0; i < n; i++) sum += block[i % 16384];
    return sum;
}
