/*
 * file.c - files at paths a user gives: opening one to read without ever
 * blocking, reading a whole (small) one, and writing one safely
 * (llmem/outfile.h).
 *
 * Reading: open(2) with O_NONBLOCK, so a FIFO (or a device that waits for
 * a peer) given as a model, tokenizer or trace returns at once, then fstat
 * must say a regular file, else LLMEM_EIO naming what it is. The
 * whole-file reader then reads with a buffer that doubles from 64 KiB, up
 * to a limit.
 *
 * Writing (outfile): a temporary file beside the target, created with
 * O_CREAT | O_EXCL | O_NOFOLLOW under a random name from getrandom(2)
 * (retried on a collision), written through stdio (a cookie stream whose
 * write callback keeps the first errno: stdio itself loses it), fsynced,
 * renamed over
 * the target after the target was checked again; the first error wins and
 * the temporary file is removed on every failure path.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "llmem/outfile.h"

const char *llmem__file_kind(mode_t mode)
{
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISLNK(mode)) return "a symbolic link";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

llmem_status llmem__open_regular(const char *path, const char *what, int *fd_out, struct stat *st_out)
{
    *fd_out = -1;
    if (!path) return llmem__fail(LLMEM_EINVAL, "%s: null path", what);
    if (!path[0]) return llmem__fail(LLMEM_EINVAL, "%s: empty path", what);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return llmem__fail(LLMEM_EIO, "%s: cannot open '%s': %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return llmem__fail(LLMEM_EIO, "%s: cannot stat '%s': %s", what, path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return llmem__fail(LLMEM_EIO, "%s: '%s' is %s, not a regular file", what, path, llmem__file_kind(st.st_mode));
    }
    /* Regular files ignore O_NONBLOCK; clear it anyway so the descriptor
     * behaves as a plain one for whoever reads it. */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    if (st_out) *st_out = st;
    return LLMEM_OK;
}

llmem_status llmem__read_file(const char *path, size_t max_bytes, const char *what, void **data, size_t *size)
{
    *data = NULL;
    *size = 0;
    int fd;
    llmem_status st = llmem__open_regular(path, what, &fd, NULL);
    if (st) return st;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return llmem__fail(LLMEM_EIO, "%s: cannot read '%s': %s", what, path, strerror(e));
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        if (cap >= max_bytes) {
            st = llmem__fail(LLMEM_EFORMAT, "%s: '%s' is over %zu MiB", what, path, max_bytes >> 20);
            break;
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    bool err = ferror(f) != 0;
    fclose(f);
    if (!buf) return llmem__fail(LLMEM_ENOMEM, "%s: out of memory reading '%s'", what, path);
    if (!st && err) st = llmem__fail(LLMEM_EIO, "%s: reading '%s' failed", what, path);
    if (st) {
        free(buf);
        return st;
    }
    *data = buf;
    *size = n;
    return LLMEM_OK;
}

/* ---- outfile ------------------------------------------------------------- */

struct llmem_outfile {
    FILE *f;    /* a stdio stream over write_fd (fopencookie), so the first errno is kept */
    int fd;     /* the temporary file; -1 once closed */
    int err;    /* the first errno of a failed write, 0 if none */
    char *path; /* the target, as given */
    char *tmp;  /* the temporary file beside it */
    char *dir;  /* the target's folder, for the fsync after rename */
};

/* stdio's write callback: all of it, or -1 with the first errno kept. */
static ssize_t cookie_write(void *c, const char *buf, size_t n)
{
    llmem_outfile *f = c;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(f->fd, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (!f->err) f->err = w < 0 ? errno : EIO;
            return -1;
        }
        done += (size_t)w;
    }
    return (ssize_t)n;
}

static int cookie_close(void *c)
{
    llmem_outfile *f = c;
    int r = f->fd >= 0 ? close(f->fd) : 0;
    if (r != 0 && !f->err) f->err = errno;
    f->fd = -1;
    return r;
}

/* LLMEM_OK when path names nothing yet or a regular file (lstat: a link is
 * refused, whatever it points to). *exists says which. */
static llmem_status check_target(const char *path, bool *exists, mode_t *mode)
{
    struct stat st;
    *exists = false;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return LLMEM_OK;
        return llmem__fail(LLMEM_EIO, "cannot write '%s': %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
        return llmem__fail(LLMEM_EIO, "refusing to write '%s': it exists and is %s, not a regular file", path,
                           llmem__file_kind(st.st_mode));
    *exists = true;
    if (mode) *mode = st.st_mode & 07777;
    return LLMEM_OK;
}

static void outfile_free(llmem_outfile *f)
{
    free(f->path);
    free(f->tmp);
    free(f->dir);
    free(f);
}

llmem_status llmem_outfile_open(const char *path, llmem_outfile **out)
{
    if (out) *out = NULL;
    if (!path || !out) return llmem__fail(LLMEM_EINVAL, "outfile: null argument");
    size_t len = strlen(path);
    if (len == 0) return llmem__fail(LLMEM_EINVAL, "cannot write to an empty path");
    if (path[len - 1] == '/') return llmem__fail(LLMEM_EINVAL, "cannot write '%s': it names a folder", path);
    bool exists;
    mode_t old_mode = 0;
    llmem_status st = check_target(path, &exists, &old_mode);
    if (st) return st;

    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    const char *base = slash ? slash + 1 : path;
    llmem_outfile *f = calloc(1, sizeof *f);
    if (!f) return llmem__fail(LLMEM_ENOMEM, "out of memory writing '%s'", path);
    f->path = strdup(path);
    f->dir = slash ? (dlen ? strndup(path, dlen) : strdup("/")) : strdup(".");
    /* DIR/.BASE.<12 hex>.tmp */
    size_t tcap = dlen + strlen(base) + 32;
    f->tmp = malloc(tcap);
    if (!f->path || !f->dir || !f->tmp) {
        outfile_free(f);
        return llmem__fail(LLMEM_ENOMEM, "out of memory writing '%s'", path);
    }
    int fd = -1, e = 0;
    for (int attempt = 0; attempt < 64 && fd < 0; attempt++) {
        unsigned char r[6];
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) { /* no entropy source: time and pid */
            uint64_t x = llmem__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)attempt * 0x9e3779b97f4a7c15ull;
            memcpy(r, &x, sizeof r);
        }
        snprintf(f->tmp, tcap, "%.*s%s.%s.%02x%02x%02x%02x%02x%02x.tmp", (int)dlen, path, slash ? "/" : "", base, r[0],
                 r[1], r[2], r[3], r[4], r[5]);
        fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        e = errno;
        if (fd < 0 && e != EEXIST) break;
    }
    if (fd < 0) {
        st = llmem__fail(LLMEM_EIO, "cannot write '%s': cannot create a temporary file in '%s': %s", path, f->dir,
                         strerror(e));
        outfile_free(f);
        return st;
    }
    if (exists) fchmod(fd, old_mode & 0777); /* a replaced file keeps its permissions (not set-id bits) */
    f->fd = fd;
    f->f = fopencookie(f, "wb", (cookie_io_functions_t){NULL, cookie_write, NULL, cookie_close});
    if (!f->f) {
        e = errno;
        close(fd);
        unlink(f->tmp);
        outfile_free(f);
        return llmem__fail(LLMEM_EIO, "cannot write '%s': %s", path, strerror(e));
    }
    *out = f;
    return LLMEM_OK;
}

FILE *llmem_outfile_stream(llmem_outfile *f) { return f ? f->f : NULL; }

llmem_status llmem_outfile_commit(llmem_outfile *f)
{
    if (!f) return llmem__fail(LLMEM_EINVAL, "outfile: null argument");
    bool bad = ferror(f->f) != 0;
    if (fflush(f->f) != 0) bad = true;
    if (!bad && !f->err && fsync(f->fd) != 0 && errno != EINVAL && errno != EROFS) f->err = errno;
    if (fclose(f->f) != 0) bad = true; /* closes fd through cookie_close */
    f->f = NULL;
    int e = f->err ? f->err : bad ? EIO : 0;
    llmem_status st = LLMEM_OK;
    if (e) st = llmem__fail(LLMEM_EIO, "cannot write '%s': %s", f->path, strerror(e));
    bool exists;
    if (!st) st = check_target(f->path, &exists, NULL); /* still nothing, or a regular file */
    if (!st) {
        /* Where nothing was there, take the name only if it is still free. */
        int r = -1;
#ifdef RENAME_NOREPLACE
        if (!exists) {
            r = renameat2(AT_FDCWD, f->tmp, AT_FDCWD, f->path, RENAME_NOREPLACE);
            if (r != 0 && errno == EEXIST)
                st = llmem__fail(LLMEM_EIO, "cannot write '%s': something else was created there meanwhile", f->path);
            else if (r != 0 && errno != EINVAL && errno != ENOSYS)
                st = llmem__fail(LLMEM_EIO, "cannot write '%s': %s", f->path, strerror(errno));
        }
#endif
        if (!st && r != 0 && rename(f->tmp, f->path) != 0)
            st = llmem__fail(LLMEM_EIO, "cannot write '%s': renaming its temporary file failed: %s", f->path,
                             strerror(errno));
    }
    if (st) {
        unlink(f->tmp);
    } else {
        int dfd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) { /* the rename itself durable; a folder that refuses fsync costs durability only */
            fsync(dfd);
            close(dfd);
        }
    }
    outfile_free(f);
    return st;
}

void llmem_outfile_abort(llmem_outfile *f)
{
    if (!f) return;
    if (f->f) fclose(f->f);
    unlink(f->tmp);
    outfile_free(f);
}
