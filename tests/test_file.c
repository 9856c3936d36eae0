/*
 * test_file.c - files at paths a user gives (src/core/file.c):
 *  - outfile (llmem/outfile.h): a new file and a regular file replaced
 *    whole; a FIFO, a folder, a link to a file, a dangling link and a
 *    device (/dev/null) refused with LLMEM_EIO naming what they are and
 *    left as they were; a missing folder is LLMEM_EIO; a write that fails
 *    (RLIMIT_FSIZE) is LLMEM_EIO at commit with the target untouched; abort
 *    and every failure leave no temporary file; NULL arguments;
 *  - reading: a FIFO given as a model, tokenizer, trace or config.json is
 *    refused at once (an alarm fails the test if open() blocks), and so is
 *    a folder.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "test_util.h"
#include "support/tmpdir.h"

static int make_dir(void **state)
{
    (void)state;
    return test_tmpdir_make("test-file");
}

/* Files in the folder whose names end in ".tmp". */
static int temporaries(void)
{
    DIR *d = opendir(test_tmpdir());
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 4 && !strcmp(e->d_name + l - 4, ".tmp")) n++;
    }
    closedir(d);
    return n;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static char *read_text(const char *path)
{
    static char buf[256];
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static llmem_status write_through(const char *path, const char *text)
{
    llmem_outfile *of;
    llmem_status st = llmem_outfile_open(path, &of);
    if (st) return st;
    fputs(text, llmem_outfile_stream(of));
    return llmem_outfile_commit(of);
}

static void outfile_new_and_replaced(void **state)
{
    (void)state;
    const char *p = test_tmp_path("out.txt");
    assert_ok(write_through(p, "first\n"));
    assert_string_equal(read_text(p), "first\n");
    assert_int_equal(chmod(p, 0600), 0);
    assert_ok(write_through(p, "second\n")); /* a regular file: replaced whole */
    assert_string_equal(read_text(p), "second\n");
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600); /* its permissions kept */
    /* A relative path: the temporary file goes in the current folder. */
    char cwd[512];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(test_tmpdir()), 0);
    assert_ok(write_through("rel.txt", "rel\n"));
    assert_int_equal(chdir(cwd), 0);
    assert_string_equal(read_text(test_tmp_path("rel.txt")), "rel\n");
    assert_int_equal(temporaries(), 0);
    /* Abort: nothing written, nothing left. */
    llmem_outfile *of;
    assert_ok(llmem_outfile_open(p, &of));
    fputs("never\n", llmem_outfile_stream(of));
    assert_int_equal(temporaries(), 1); /* beside the target, while open */
    llmem_outfile_abort(of);
    assert_string_equal(read_text(p), "second\n");
    assert_int_equal(temporaries(), 0);
    llmem_outfile_abort(NULL);
}

static void outfile_refuses_what_is_not_a_regular_file(void **state)
{
    (void)state;
    const char *fifo = test_tmp_path("fifo"), *sub = test_tmp_path("sub"), *target = test_tmp_path("target.txt");
    const char *link = test_tmp_path("link"), *dangling = test_tmp_path("dangling");
    const char *nowhere = test_tmp_path("nowhere");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mkdir(sub, 0700), 0);
    write_text(target, "precious\n");
    assert_int_equal(symlink(target, link), 0);
    assert_int_equal(symlink(nowhere, dangling), 0);
    static const struct {
        int which;
        const char *kind;
    } cases[] = {{0, "a FIFO"}, {1, "a directory"}, {2, "a symbolic link"}, {3, "a symbolic link"},
                 {4, "a character device"}};
    const char *paths[] = {fifo, sub, link, dangling, "/dev/null"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmem_outfile *of = (llmem_outfile *)1;
        assert_status(llmem_outfile_open(paths[cases[i].which], &of), LLMEM_EIO);
        assert_null(of);
        assert_error_mentions(paths[cases[i].which]);
        assert_error_mentions(cases[i].kind);
        assert_error_mentions("not a regular file");
    }
    struct stat st;
    assert_int_equal(lstat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    assert_int_equal(lstat(sub, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(lstat("/dev/null", &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    assert_string_equal(read_text(target), "precious\n");
    assert_int_equal(access(nowhere, F_OK), -1); /* nothing made through the dangling link */
    assert_int_equal(temporaries(), 0);
    /* The page writers say so under their own name, once. */
    llmem_timeline *tl;
    assert_ok(llmem_timeline_create(16, &tl));
    assert_status(llmem_timeline_write_html(tl, fifo, NULL), LLMEM_EIO);
    assert_error_mentions("timeline: refusing to write");
    if (strstr(llmem_error_message(), "timeline: timeline:")) fail_msg("doubled prefix: %s", llmem_error_message());
    llmem_timeline_destroy(tl);
    /* Refused while writing, too: the target became a FIFO meanwhile. */
    const char *later = test_tmp_path("later");
    llmem_outfile *of;
    assert_ok(llmem_outfile_open(later, &of));
    fputs("x", llmem_outfile_stream(of));
    assert_int_equal(mkfifo(later, 0600), 0);
    assert_status(llmem_outfile_commit(of), LLMEM_EIO);
    assert_int_equal(lstat(later, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    assert_int_equal(temporaries(), 0);
}

static void outfile_failures_leave_nothing(void **state)
{
    (void)state;
    llmem_outfile *of = (llmem_outfile *)1;
    assert_status(llmem_outfile_open(NULL, &of), LLMEM_EINVAL);
    assert_status(llmem_outfile_open("x", NULL), LLMEM_EINVAL);
    assert_status(llmem_outfile_open("", &of), LLMEM_EINVAL);
    assert_status(llmem_outfile_open(test_tmp_path("sub/"), &of), LLMEM_EINVAL);
    assert_status(llmem_outfile_commit(NULL), LLMEM_EINVAL);
    assert_null(llmem_outfile_stream(NULL));
    assert_status(llmem_outfile_open(test_tmp_path("no/such/folder.txt"), &of), LLMEM_EIO);
    assert_error_mentions("No such file or directory");
    /* A write the system refuses (the file size limit) fails the commit;
     * the old contents stay and no temporary file does. */
    const char *p = test_tmp_path("limited.txt");
    write_text(p, "old\n");
    struct rlimit saved, small = {4096, 4096};
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
    small.rlim_max = saved.rlim_max;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_ok(llmem_outfile_open(p, &of));
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    for (int i = 0; i < 1000; i++) fputs("0123456789abcdef0123456789abcdef\n", llmem_outfile_stream(of));
    llmem_status st = llmem_outfile_commit(of);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(st, LLMEM_EIO);
    assert_error_mentions("limited.txt");
    assert_error_mentions("File too large");
    assert_string_equal(read_text(p), "old\n");
    assert_int_equal(temporaries(), 0);
}

/* ---- reading never blocks -------------------------------------------------- */

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "blocked in open(): a FIFO input hung the loader\n";
    if (write(2, msg, sizeof msg - 1)) {
    }
    _exit(1);
}

static void inputs_refuse_a_fifo_at_once(void **state)
{
    (void)state;
    const char *fifo = test_tmp_path("in.fifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    signal(SIGALRM, on_alarm);
    alarm(20); /* the loaders used to wait for a writer forever */
    llmem_model *m = (llmem_model *)1;
    assert_status(llmem_model_open(fifo, NULL, &m), LLMEM_EIO);
    assert_null(m);
    assert_error_mentions("model: ");
    assert_error_mentions("is a FIFO, not a regular file");
    llmem_tokenizer *t;
    assert_status(llmem_tokenizer_load(fifo, 512, &t), LLMEM_EIO);
    assert_error_mentions("is a FIFO, not a regular file");
    if (strstr(llmem_error_message(), "tokenizer: tokenizer:")) fail_msg("doubled prefix: %s", llmem_error_message());
    llmem_trace tr;
    assert_status(llmem_trace_load(fifo, &tr), LLMEM_EIO);
    assert_error_mentions("is a FIFO, not a regular file");
    llmem_shape sh;
    assert_status(llmem_shape_load(fifo, &sh), LLMEM_EIO);
    assert_error_mentions("is a FIFO, not a regular file");
    /* A folder, and a missing file. */
    assert_status(llmem_model_open(test_tmpdir(), NULL, &m), LLMEM_EIO);
    assert_error_mentions("is a directory");
    assert_status(llmem_trace_load(test_tmp_path("absent.csv"), &tr), LLMEM_EIO);
    assert_error_mentions("No such file or directory");
    alarm(0);
    signal(SIGALRM, SIG_DFL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(outfile_new_and_replaced),
        cmocka_unit_test(outfile_refuses_what_is_not_a_regular_file),
        cmocka_unit_test(outfile_failures_leave_nothing),
        cmocka_unit_test(inputs_refuse_a_fifo_at_once),
    };
    return cmocka_run_group_tests(tests, make_dir, test_tmpdir_teardown);
}
