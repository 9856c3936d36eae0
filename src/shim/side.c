/*
 * side.c - the malloc shim's side allocator: power-of-two blocks over a
 * static buffer, then over one reserved range of address space.
 *
 * Algorithm. A request of n bytes at alignment a (>= 16) takes a block of
 * 2^k >= n + max(a, 16) bytes, k >= 5: from the free list of its size, or
 * carved at the bump pointer, the static buffer first (256 KiB in .bss:
 * usable before any system call, so the shim needs nothing from the
 * dynamic linker to start), then the reserved range (up to 64 GiB of
 * PROT_NONE, MAP_NORESERVE address space, made read-write a megabyte or
 * more at a time as the bump pointer passes). The pointer handed out is
 * the first a-aligned address at least 16 bytes into the block; the 16
 * bytes before it are the header: a magic word (live or free), k, and the
 * offset from the block start. Freed blocks go on their size's list,
 * linked through the word 16 bytes into the block; blocks of 64 KiB and
 * more first give back every page but their first (MADV_DONTNEED), so a
 * burst of large metadata does not stay resident, and remember that the
 * rest reads as zero (calloc then clears only the first page's part).
 *
 * Why powers of two: what comes here is the pool's metadata (owner tables,
 * slab index stacks, thread caches: one size each per superblock size or
 * thread, allocated rarely and kept long) and the odd allocation of the C
 * library from inside the pool; at most half of a block is slack, and the
 * slack of large blocks is address space, never touched.
 *
 * Invariants: every pointer handed out lies in [boot, boot + BOOT_BYTES)
 * or [base, base + reserved); a live block's header has LIVE_MAGIC, a
 * free one's FREE_MAGIC; a block on list k is 2^k bytes, aligned to
 * min(2^k, 4096), and carved once, never split or merged.
 *
 * Locking: one mutex for the lists, the bump pointers and the figures;
 * llmem__side_owns and llmem__side_usable read only what cannot change
 * under them (range bounds fixed once set, a live block's header). Held
 * across fork by the shim's handlers.
 */
#include "side.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#define BOOT_BYTES ((size_t)256 << 10)
#define MIN_SHIFT 5                     /* 32-byte blocks: 16 of header, 16 usable */
#define MAX_SHIFT 40                    /* 1 TiB: above any range we can reserve */
#define HDR 16u
#define LIVE_MAGIC 0x6c6c6d73u          /* "llms" */
#define FREE_MAGIC 0x66726565u          /* "free" */
#define LARGE_SHIFT 16                  /* blocks from 64 KiB up give their pages back */
#define PAGE ((uintptr_t)4096)
#define COMMIT_STEP ((uintptr_t)1 << 20)

/* Block states kept in a free block (byte 24): what calloc must clear. */
enum { Z_DIRTY = 0, Z_PAST_FIRST_PAGE = 1, Z_ALL = 2 };

typedef struct hdr {
    uint32_t magic;
    uint8_t shift;
    uint8_t pad[3];
    uint64_t off; /* pointer - block start */
} hdr;
_Static_assert(sizeof(hdr) == HDR, "header size");

typedef struct freeblk {
    void *next;   /* at block + 16 */
    uint8_t zero; /* Z_* */
} freeblk;

static _Alignas(4096) unsigned char boot[BOOT_BYTES];

static struct {
    pthread_mutex_t lock;
    uintptr_t boot_next;          /* bump pointer in boot (0 = its start) */
    uintptr_t base, reserved;     /* the reserved range, once mapped */
    uintptr_t next, committed;    /* bump pointer and end of the read-write part, offsets from base */
    bool reserve_failed;
    uintptr_t lists[MAX_SHIFT + 1]; /* free blocks by size: block starts */
    llmem__side_stats st;
} S = {.lock = PTHREAD_MUTEX_INITIALIZER};

static inline hdr *hdr_of(const void *p) { return (hdr *)((uintptr_t)p - HDR); }
static inline freeblk *link_of(uintptr_t block) { return (freeblk *)(block + HDR); }

bool llmem__side_owns(const void *p)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)boot;
    if (a - b < BOOT_BYTES) return true;
    uintptr_t base = __atomic_load_n(&S.base, __ATOMIC_ACQUIRE);
    return base && a - base < S.reserved;
}

/* Map the reserved range: as large as the address-space limit allows. */
static bool reserve_range(void)
{
    static const uintptr_t sizes[] = {(uintptr_t)64 << 30, (uintptr_t)8 << 30, (uintptr_t)1 << 30,
                                      (uintptr_t)128 << 20, (uintptr_t)16 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *m = mmap(NULL, sizes[i], PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) continue;
        S.reserved = sizes[i];
        __atomic_store_n(&S.base, (uintptr_t)m, __ATOMIC_RELEASE);
        return true;
    }
    S.reserve_failed = true;
    return false;
}

/* Carve a fresh block of 2^k bytes: from boot while it fits, else from the
 * range. 0 when neither has room. Lock held. */
static uintptr_t carve(unsigned k)
{
    uintptr_t size = (uintptr_t)1 << k, align = size < PAGE ? size : PAGE;
    uintptr_t at = (S.boot_next + align - 1) & ~(align - 1);
    if (at + size <= BOOT_BYTES) {
        S.boot_next = at + size;
        S.st.boot_bytes = S.boot_next;
        return (uintptr_t)boot + at;
    }
    if (!S.base && (S.reserve_failed || !reserve_range())) return 0;
    at = (S.next + align - 1) & ~(align - 1);
    if (at > S.reserved || size > S.reserved - at) return 0;
    if (at + size > S.committed) {
        uintptr_t want = (at + size - S.committed + COMMIT_STEP - 1) & ~(COMMIT_STEP - 1);
        if (want > S.reserved - S.committed) want = S.reserved - S.committed;
        if (mprotect((void *)(S.base + S.committed), want, PROT_READ | PROT_WRITE) != 0) return 0;
        S.committed += want;
        S.st.region_bytes = S.committed;
    }
    S.next = at + size;
    return S.base + at;
}

static inline unsigned shift_for(size_t need)
{
    unsigned k = need <= ((size_t)1 << MIN_SHIFT) ? MIN_SHIFT : 64 - (unsigned)__builtin_clzll(need - 1);
    return k;
}

void *llmem__side_alloc(size_t size, size_t align, bool zero)
{
    if (size == 0) size = 1;
    if (align < HDR) align = HDR;
    if (align & (align - 1)) return NULL;
    size_t need;
    if (__builtin_add_overflow(size, align, &need)) return NULL;
    unsigned k = shift_for(need);
    if (k > MAX_SHIFT) return NULL;

    pthread_mutex_lock(&S.lock);
    uintptr_t block = S.lists[k];
    uint8_t z = Z_ALL;
    if (block) {
        freeblk *f = link_of(block);
        S.lists[k] = (uintptr_t)f->next;
        z = f->zero;
    } else {
        block = carve(k);
        if (!block) {
            pthread_mutex_unlock(&S.lock);
            return NULL;
        }
    }
    S.st.live_blocks++;
    S.st.live_bytes += (uint64_t)1 << k;
    S.st.allocs_total++;
    pthread_mutex_unlock(&S.lock);

    uintptr_t user = (block + HDR + align - 1) & ~(uintptr_t)(align - 1);
    hdr *h = hdr_of((void *)user);
    h->magic = LIVE_MAGIC;
    h->shift = (uint8_t)k;
    h->off = user - block;
    if (zero && z != Z_ALL) {
        size_t n = size;
        if (z == Z_PAST_FIRST_PAGE) {
            uintptr_t first_end = block + PAGE;
            n = user >= first_end ? 0 : (first_end - user < size ? first_end - user : size);
        }
        memset((void *)user, 0, n);
    }
    return (void *)user;
}

/* The block of a live pointer, or 0 (not a block). */
static uintptr_t block_of(const void *p, unsigned *k)
{
    if (!llmem__side_owns(p) || ((uintptr_t)p & (HDR - 1))) return 0;
    const hdr *h = hdr_of(p);
    if (h->magic != LIVE_MAGIC || h->shift < MIN_SHIFT || h->shift > MAX_SHIFT ||
        h->off < HDR || h->off >= ((uint64_t)1 << h->shift))
        return 0;
    *k = h->shift;
    return (uintptr_t)p - h->off;
}

void llmem__side_free(void *p)
{
    if (!p) return;
    pthread_mutex_lock(&S.lock);
    unsigned k;
    uintptr_t block = block_of(p, &k);
    if (!block) {
        S.st.bad_frees_total++;
        pthread_mutex_unlock(&S.lock);
        return;
    }
    hdr_of(p)->magic = FREE_MAGIC;
    uint8_t z = Z_DIRTY;
    uintptr_t size = (uintptr_t)1 << k;
    if (k >= LARGE_SHIFT && block - (uintptr_t)boot >= BOOT_BYTES) {
        /* Pages past the first go back to the kernel and read as zero. */
        if (madvise((void *)(block + PAGE), size - PAGE, MADV_DONTNEED) == 0) z = Z_PAST_FIRST_PAGE;
    }
    freeblk *f = link_of(block);
    f->next = (void *)S.lists[k];
    f->zero = z;
    S.lists[k] = block;
    S.st.live_blocks--;
    S.st.live_bytes -= size;
    pthread_mutex_unlock(&S.lock);
}

/* No lock: a live block's header does not change (and this must work
 * while the fork handlers hold the lock). */
size_t llmem__side_usable(const void *p)
{
    if (!p) return 0;
    unsigned k;
    uintptr_t block = block_of(p, &k);
    return block ? (size_t)(block + ((uintptr_t)1 << k) - (uintptr_t)p) : 0;
}

void *llmem__side_realloc(void *p, size_t size)
{
    if (!p) return llmem__side_alloc(size, 0, false);
    if (size == 0) size = 1;
    size_t have = llmem__side_usable(p);
    if (!have) return NULL;
    if (size <= have && (have <= 64 || size > have / 4)) return p;
    void *n = llmem__side_alloc(size, 0, false);
    if (!n) return NULL;
    memcpy(n, p, have < size ? have : size);
    llmem__side_free(p);
    return n;
}

void llmem__side_get_stats(llmem__side_stats *out)
{
    pthread_mutex_lock(&S.lock);
    *out = S.st;
    pthread_mutex_unlock(&S.lock);
}

void llmem__side_fork_prepare(void) { pthread_mutex_lock(&S.lock); }
void llmem__side_fork_parent(void) { pthread_mutex_unlock(&S.lock); }
void llmem__side_fork_child(void) { pthread_mutex_init(&S.lock, NULL); }
