/* out_file.c — --timeline FILE: checked before the work, written beside it and renamed into
 * place once complete.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> /* lstat, fchmod: the --timeline file */
#include <unistd.h>   /* access, close, unlink */

#include "cli/cli.h"

/* ---- output files ------------------------------------------------------------------------ */

/* An output file (--timeline FILE) is checked before the work and written to a temporary file
 * beside it, renamed into place once complete: a failed write leaves no half-written file (an
 * existing FILE stays as it was).  FILE is never a symbolic link followed, a FIFO or device
 * opened, nor the model file written over. */

/* The one line of a failed write: exit 5 (README: a failure to write the output). */
static int out_failed(const char *what, const char *path, int err)
{
    mp_progress_done();
    fprintf(stderr, "memplan: error: writing %s %s failed: %s\n", what, path, strerror(err));
    return MP_EXIT_INTERNAL;
}

/* The directory part of path ("." for none), malloc'd; NULL: no memory. */
static char *dir_of(const char *path)
{
    const char *sl = strrchr(path, '/');
    size_t n = !sl ? 0 : sl == path ? 1 : (size_t)(sl - path);
    char *d = malloc(n + 2);
    if (d)
        snprintf(d, n + 2, "%.*s", (int)(n ? n : 1), n ? path : ".");
    return d;
}

/* Before the work: 0, or an exit status with its one line printed.  2: path (the value of opt)
 * names a directory, a symbolic link, something other than a regular file, or the file input;
 * 5: its directory cannot be written. */
int cli_check_out_file(const char *opt, const char *what, const char *path, const char *input)
{
    const char *base = strrchr(path, '/'), *why = NULL;
    struct stat st, in;
    if (!*(base ? base + 1 : path)) {
        why = "names a directory, not a file";
    } else if (lstat(path, &st) != 0) {
        if (errno != ENOENT) /* ENOENT: a new file */
            return out_failed(what, path, errno);
    } else {
        if (S_ISLNK(st.st_mode))
            why = "is a symbolic link: not followed (give the file it points to)";
        else if (S_ISDIR(st.st_mode))
            why = "is a directory";
        else if (S_ISFIFO(st.st_mode))
            why = "is a FIFO, not a regular file";
        else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))
            why = "is a device, not a regular file";
        else if (!S_ISREG(st.st_mode))
            why = "is not a regular file";
        else if (stat(input, &in) == 0 && in.st_dev == st.st_dev && in.st_ino == st.st_ino) {
            /* the model, under this name or another (a link, another spelling) */
            fprintf(stderr, "memplan: error: %s %s: is the model file %s: refusing to overwrite it\n", opt, path,
                    input);
            return MP_EXIT_USAGE;
        }
    }
    if (why) {
        fprintf(stderr, "memplan: error: %s %s: %s\n", opt, path, why);
        return MP_EXIT_USAGE;
    }
    char *dir = dir_of(path);
    if (!dir)
        return out_failed(what, path, ENOMEM);
    int r = access(dir, W_OK | X_OK), err = errno;
    free(dir);
    return r == 0 ? 0 : out_failed(what, path, err);
}

/* A file being written: a temporary file in path's directory until out_finish. */
struct out_file {
    FILE *f;
    char *tmp;
};

/* 0, or exit status 5 with its line printed (nothing left behind). */
static int out_open(struct out_file *o, const char *what, const char *path)
{
    o->f = NULL;
    char *dir = dir_of(path);
    size_t n = dir ? strlen(dir) + sizeof "/.memplan-XXXXXX" : 0;
    o->tmp = dir ? malloc(n) : NULL;
    if (!o->tmp) {
        free(dir);
        return out_failed(what, path, ENOMEM);
    }
    snprintf(o->tmp, n, "%s/.memplan-XXXXXX", dir);
    free(dir);
    int fd = mkstemp(o->tmp), err = errno;
    if (fd >= 0) {
        /* the mode of the file it replaces, else a new file's (mkstemp makes it 0600) */
        struct stat st;
        mode_t um = umask(0);
        umask(um);
        mode_t mode = stat(path, &st) == 0 && S_ISREG(st.st_mode) ? st.st_mode & 07777 : 0666 & ~um;
        if (fchmod(fd, mode) == 0 && (o->f = fdopen(fd, "w")) != NULL)
            return 0;
        err = errno;
        close(fd);
        unlink(o->tmp);
    }
    free(o->tmp);
    o->tmp = NULL;
    return out_failed(what, path, err);
}

/* Closes o; keep: renames it to path, else removes it.  Returns 0 or the errno of a failed
 * write or rename (then nothing is left behind). */
static int out_finish(struct out_file *o, const char *path, bool keep)
{
    int err = 0;
    errno = 0;
    if (fflush(o->f) != 0)
        err = errno ? errno : EIO;
    else if (ferror(o->f))
        err = EIO;
    if (fclose(o->f) != 0 && !err)
        err = errno;
    if (keep && !err && rename(o->tmp, path) != 0)
        err = errno;
    if (!keep || err)
        unlink(o->tmp);
    free(o->tmp);
    o->f = NULL;
    o->tmp = NULL;
    return keep ? err : 0;
}

/* --timeline FILE: the step of prog under sched as an SVG; target lines when the
 * command has a target.  Returns 0 or an exit status (message printed). */
int cli_write_timeline(const struct args *a, const char *cmd, const struct setup *s, const struct mp_program *prog,
                          const struct mp_schedule *sched, uint64_t context, bool target, const uint64_t *measured,
                          size_t n_measured)
{
    if (!a->timeline)
        return 0;
    char title[256], sub[512], ck[48]; /* sub: every part is bounded, the GPU name comes last */
    snprintf(title, sizeof title, "%s%s%s%s: %s", s->model.name, s->model.hf_class[0] ? " (" : "",
             s->model.hf_class, s->model.hf_class[0] ? ")" : "", cmd);
    int n = snprintf(sub, sizeof sub, "batch %llu", (unsigned long long)prog->opts.batch);
    if (s->model.input == MP_INPUT_TOKENS)
        n += snprintf(sub + n, sizeof sub - (size_t)n, ", seq %llu", (unsigned long long)prog->opts.seq);
    if (prog->opts.target_seq)
        n += snprintf(sub + n, sizeof sub - (size_t)n, ", target seq %llu", (unsigned long long)prog->opts.target_seq);
    n += snprintf(sub + n, sizeof sub - (size_t)n, ", %s, %s, checkpoint %s", mp_precision_str(prog->opts.precision),
                  mp_optimizer_str(s->train.optimizer), mp_ckpt_spec_str(&a->ckpt, ck, sizeof ck));
    const struct mp_finetune *ft = &s->build.ft; /* what trains, and where, as the report's header says */
    if (ft->mode == MP_FT_LORA || ft->mode == MP_FT_QLORA)
        n += snprintf(sub + n, sizeof sub - (size_t)n, ", %s r%llu", mp_ft_mode_str(ft->mode),
                      (unsigned long long)ft->r);
    else if (ft->mode != MP_FT_FULL)
        n += snprintf(sub + n, sizeof sub - (size_t)n, ", %s", mp_ft_mode_str(ft->mode));
    if (s->train.par) {
        char pb[96];
        n += snprintf(sub + n, sizeof sub - (size_t)n, ", %s per rank", mp_par_describe(s->train.par, pb, sizeof pb));
    }
    if (s->train.accumulate)
        n += snprintf(sub + n, sizeof sub - (size_t)n, ", accumulating gradients");
    snprintf(sub + n, sizeof sub - (size_t)n, "%s%s", target ? ", target " : "", target ? s->gpu.name : "");
    struct out_file of;
    int rc = out_open(&of, "the timeline", a->timeline);
    if (rc)
        return rc;
    struct mp_nccl_est nccl;
    mp_nccl_estimate(&s->gpu, s->train.par, s->train.nccl, &nccl);
    struct mp_timeline_opts o = {.title = title, .subtitle = sub, .context_bytes = context, .nccl_bytes = nccl.bytes,
                                 .capacity_bytes = target ? s->gpu.memory_bytes : 0, .margin = a->margin,
                                 .measured = measured, .n_measured = n_measured};
    struct mp_diag d = {{0}};
    enum mp_status st = mp_timeline_svg(of.f, prog, sched, &s->train, &o, &d);
    int err = out_finish(&of, a->timeline, st == MP_OK || st == MP_ERR_IO); /* IO: out_finish says why */
    if (st != MP_OK && st != MP_ERR_IO)
        return cli_fail(st, &d);
    return err || st != MP_OK ? out_failed("the timeline", a->timeline, err ? err : EIO) : 0;
}
