/*
 * llmem/outfile.h - writing a file at a path a user gave, safely: the
 * timeline page, a synthetic model, events and samples of the tools.
 *
 * An output path is untrusted: it may name a device (/dev/null), a FIFO, a
 * folder or a symbolic link (planted in a shared folder such as /tmp to
 * make a privileged process overwrite the link's target). An outfile
 *  - refuses a target that exists and is not a regular file (a symbolic
 *    link included, whatever it points to): LLMEM_EIO naming what it is;
 *  - writes into a new temporary file in the target's own folder, created
 *    with O_CREAT | O_EXCL | O_NOFOLLOW (never an existing file, never
 *    through a link) under a random name (".NAME.XXXXXXXXXXXX.tmp");
 *  - on commit: flushes, fsyncs, closes, checks the target again and
 *    renames the temporary file over it (atomic: a reader sees the old file
 *    or the whole new one, never a part), then fsyncs the folder;
 *  - on any failure, or abort, removes the temporary file: the target is
 *    untouched.
 * A new file gets mode 0666 less the umask (as fopen would give it); a
 * file it replaces is replaced, not rewritten: its permission bits are
 * kept, its owner (unless the caller is that owner) and hard links are not. What it cannot guard against: a process that can
 * write the target's folder and swaps the target for something else
 * between the last check and the rename (rename then replaces that name);
 * in a sticky folder such as /tmp only the owner of a name can do that.
 *
 *     llmem_outfile *of;
 *     if (llmem_outfile_open(path, &of)) return fail(llmem_error_message());
 *     fprintf(llmem_outfile_stream(of), ...);          // every write
 *     if (llmem_outfile_commit(of)) return fail(llmem_error_message());
 *
 * Messages name the path and say what went wrong, with no prefix (callers
 * add theirs). Not thread-safe: one thread uses an outfile.
 */
#ifndef LLMEM_OUTFILE_H
#define LLMEM_OUTFILE_H

#include <stdio.h>

#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_outfile llmem_outfile;

/* Check `path` and create its temporary file. LLMEM_EINVAL: NULL or empty
 * path, or one ending in '/'; LLMEM_EIO: a target that exists and is not a
 * regular file (the message says what it is), or a folder that cannot be
 * written or looked up (the message has the system's reason);
 * LLMEM_ENOMEM. */
LLMEM_API llmem_status llmem_outfile_open(const char *path, llmem_outfile **out);

/* The stream to write to (binary; buffered). Valid until commit or abort. */
LLMEM_API FILE *llmem_outfile_stream(llmem_outfile *f);

/* Finish: LLMEM_OK when every write, the flush, fsync, close and rename
 * succeeded (the first write error seen is reported: LLMEM_EIO with the
 * system's reason), else the target is untouched and the temporary file
 * gone. Frees f either way; NULL is LLMEM_EINVAL. */
LLMEM_API llmem_status llmem_outfile_commit(llmem_outfile *f);

/* Give up: close and remove the temporary file, free f. NULL does nothing. */
LLMEM_API void llmem_outfile_abort(llmem_outfile *f);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_OUTFILE_H */
