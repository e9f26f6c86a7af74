/* fuzz_cli.c — libFuzzer harness for the command line: option values, a GPU profile
 * and a model, run through memplan's own main() (src/cli/main.c, built for this harness
 * with main renamed mp_cli_main), so options are parsed, checked and combined exactly
 * as the CLI does.  Run by `make fuzz` (tests/fuzz/README).
 *
 * An input is text in three parts, split by lines "%%":
 *
 *     plan                  the command: estimate, plan, check or suggest
 *     batch=8               options, one a line: NAME=VALUE, or NAME for a flag
 *     gpu=@                 (NAME is a long option without "--"; gpu=@ is the profile below)
 *     %%
 *     { GPU profile JSON }  written to a file, as configs/gpus/NAME.json would be
 *     %%
 *     { model JSON }        written to a file: the command's MODEL
 *
 * Only the options in OPTS pass (not --timeline's file, --device, --backend or the
 * probe's): the fuzzer writes no file of its own choosing and runs no probe; suggest
 * always gets --no-probe.  An input over a work budget (below) is not run: the fuzzer
 * looks for wrong answers, not for slow giants.
 *
 * Wrong, and a crash here: a sanitizer report or leak; exit status 5 (internal) or
 * anything outside 0-5; a failure (2-4) without exactly one "memplan: error: " line;
 * any stderr line not starting "memplan: "; with --json, an answer (0 or 1) that is not
 * one valid JSON document.
 */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ir/layers.h" /* mp_model_load_string */
#include "model/model.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int mp_cli_main(int argc, char **argv); /* src/cli/main.c's main, renamed by the Makefile */

/* The work of one input, kept well under libFuzzer's -timeout=10 on a loaded 2-core machine.
 * Measured here under the fuzz build (load 7): the optimal DP costs about blocks^3 x slots
 * (plan on gpt2 with 30 blocks at the default 500 slots 1.0 s, at 5,000 slots 7.8 s; with 16
 * blocks at 100,000 slots 26 s), and suggest evaluates about 50 such plans (a data-parallel
 * search on 9 blocks 2.2 s), more the larger --max-batch; since 2026-11-28 seven checkpoint
 * plans where it had four (layers:2..4), and when it fits four more searches for its "would do
 * better" hints: 50 x 7/4 x 5, about 440.  So: at most MAX_BLOCKS blocks,
 * blocks^3 x slots (x SUGGEST_FACTOR for suggest) at most MAX_WORK, and suggest searches
 * micro-batches up to SUGGEST_MAX_BATCH.  Larger values are the sweep's (tests/sweep.sh). */
#define MAX_BLOCKS 64
#define MAX_WORK 2e7
#define SUGGEST_FACTOR 440
#define SUGGEST_MAX_BATCH "64"
#define DEFAULT_SLOTS 500 /* --slots' default */
#define MAX_SLOTS 100000  /* --slots' largest: above, the CLI refuses it (fast) */
#define MAX_ARGS 48
#define SEP "\n%%\n"

/* The options the fuzzer may give (every value-taking option of estimate, plan, check and
 * suggest that reads no file and touches no device), and the flags. */
static const char *const OPTS[] = {
    "batch", "seq", "target-seq", "precision", "optimizer", "checkpoint", "finetune", "lora-r", "lora-alpha",
    "lora-dropout", "lora-targets", "train-blocks", "attention", "moe-capacity", "use-cache", "gpu", "vram",
    "ep", "activation-budget", "slots", "margin", "global-batch", "grad-accum", "emit", "gpus", "nodes", "parallel",
    "offload", "offload-device", "max-batch", "workspace", "context", "alloc-conf", "timeline", "ddp-bucket-view",
    "act-offload", "all-layers", "wide", "json", "recipe-format", "explain", "loss", "label-fraction", "head", "num-labels", "images",
    "image-size", "packing", "padding-free", "tokens-per-batch",
    "trainer", "precompute-ref", "torch", "completion-length", "num-generations", "steps-per-generation", "beta",
    "vllm", "temperature", "top-p", "top-k", "min-p", "repetition-penalty", "ds3-gather",
    "num-iterations", "vllm-correction", "disable-dropout", "quant-storage",
};
/* The options of those commands it does not give: they read a file (--recipe: a fuzzed value
 * would be a path; its reader is tested by tests/test_recipe.c and not fuzzed yet; --write-recipe needs it) or name a
 * device or probe on one (the fuzzer runs no device).  tests/man_options.py checks that every option of estimate, plan,
 * check and suggest is in OPTS or here, so a new option is fuzzed unless it is listed here. */
static const char *const NOT_FUZZED[] __attribute__((unused)) = {"device", "backend", "capacity", "no-probe", "help",
                                                                "recipe", "write-recipe"};
static const char *const CMDS[] = {"estimate", "plan", "check", "suggest"};

static char dir[256], model_path[300], gpu_path[300], svg_path[300];

static void cleanup(void)
{
    unlink(model_path);
    unlink(gpu_path);
    unlink(svg_path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/memplan-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("fuzz_cli: mkdtemp");
        abort();
    }
    snprintf(model_path, sizeof model_path, "%s/model.json", dir);
    snprintf(gpu_path, sizeof gpu_path, "%s/gpu.json", dir);
    snprintf(svg_path, sizeof svg_path, "%s/timeline.svg", dir);
    atexit(cleanup);
    setenv("MEMPLAN_PROGRESS_AFTER_MS", "1e12", 1); /* no progress line, even on a terminal */
    return 0;
}

static bool write_file(const char *path, const char *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return false;
    bool ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static const char *find(const char *p, const char *end, const char *s)
{
    size_t l = strlen(s);
    for (; p + l <= end; p++)
        if (!memcmp(p, s, l))
            return p;
    return NULL;
}

static bool is_opt(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof OPTS / sizeof OPTS[0]; i++)
        if (strlen(OPTS[i]) == len && !memcmp(OPTS[i], name, len))
            return true;
    return false;
}

/* The one failure report: what ran, what was wrong, then a crash for libFuzzer. */
static void wrong(FILE *log, char **argv, int argc, int rc, const char *err, const char *why)
{
    fprintf(log, "fuzz_cli: %s (exit %d):", why, rc);
    for (int i = 0; i < argc; i++)
        fprintf(log, " '%s'", argv[i]);
    fprintf(log, "\nfuzz_cli: its stderr:\n%s\n", err);
    __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data, *end = text + size;
    const char *s1 = find(text, end, SEP);
    const char *s2 = s1 ? find(s1 + 4, end, SEP) : NULL;
    if (!s2)
        return 0;
    const char *gpu = s1 + 4, *model = s2 + 4;

    /* argv: memplan COMMAND --NAME[=VALUE]... [--no-probe] MODEL */
    char *header = strndup(text, (size_t)(s1 - text));
    if (!header)
        abort();
    char *argv[MAX_ARGS + 6], *own[MAX_ARGS]; /* own: the strings made here */
    int argc = 0, nown = 0;
    argv[argc++] = "memplan";
    char *save = NULL, *line = strtok_r(header, "\n", &save);
    bool known = false, json = false, emit = false;
    double slots = DEFAULT_SLOTS;
    for (size_t i = 0; line && i < sizeof CMDS / sizeof CMDS[0]; i++)
        known |= !strcmp(line, CMDS[i]);
    if (!known) {
        free(header);
        return 0;
    }
    argv[argc++] = line;
    bool suggest = !strcmp(line, "suggest");
    while ((line = strtok_r(NULL, "\n", &save)) != NULL && nown < MAX_ARGS) {
        char *eq = strchr(line, '=');
        size_t nl = eq ? (size_t)(eq - line) : strlen(line);
        if (!is_opt(line, nl))
            continue;
        const char *val = eq ? eq + 1 : NULL;
        if (!strncmp(line, "gpu", nl) && val && (!strcmp(val, "@") || strchr(val, '/')))
            val = gpu_path; /* a path only to the profile above */
        if (!strncmp(line, "timeline", nl))
            val = svg_path;
        if (!strncmp(line, "slots", nl) && val && strspn(val, "0123456789") == strlen(val) && strlen(val) < 12 &&
            *val && atof(val) <= MAX_SLOTS)
            slots = atof(val) < 10 ? 10 : atof(val);
        json |= !strncmp(line, "json", nl);
        emit |= !strncmp(line, "emit", nl);
        size_t l = nl + (val ? strlen(val) : 0) + 4;
        char *arg = malloc(l);
        if (!arg)
            abort();
        snprintf(arg, l, "--%.*s%s%s", (int)nl, line, val ? "=" : "", val ? val : "");
        own[nown++] = arg;
        argv[argc++] = arg;
    }
    if (suggest) { /* last: a given --max-batch is parsed, then this one counts */
        argv[argc++] = "--no-probe";
        argv[argc++] = "--max-batch=" SUGGEST_MAX_BATCH;
    }
    argv[argc++] = model_path;
    argv[argc] = NULL;

    /* an input over the work budget is not run (a rejected model is: its message counts) */
    struct mp_model m;
    struct mp_diag d = {{0}};
    if (mp_model_load_string(&m, model, (size_t)(end - model), "fuzz.json", &d) == MP_OK) {
        double nb = (double)m.n_blocks;
        mp_model_release(&m);
        if (nb > MAX_BLOCKS || nb * nb * nb * slots * (suggest ? SUGGEST_FACTOR : 1) > MAX_WORK)
            goto out;
    }
    if (!write_file(gpu_path, gpu, (size_t)(s2 - gpu)) || !write_file(model_path, model, (size_t)(end - model))) {
        perror("fuzz_cli: writing the input files");
        abort();
    }

    /* getopt keeps state between calls: optind = 0 starts it afresh (glibc) */
    optind = 0;
    char *reset[] = {"memplan", NULL};
    while (getopt(1, reset, "") != -1)
        ;

    /* stdout and stderr are the CLI's FILE streams: caught here (sanitizer reports still
     * go to the real stderr, fd 2) */
    char *out = NULL, *err = NULL;
    size_t nout = 0, nerr = 0;
    FILE *real_out = stdout, *real_err = stderr;
    FILE *fo = open_memstream(&out, &nout), *fe = open_memstream(&err, &nerr);
    if (!fo || !fe)
        abort();
    stdout = fo;
    stderr = fe;
    int rc = mp_cli_main(argc, argv);
    stdout = real_out;
    stderr = real_err;
    fclose(fo);
    fclose(fe);

    if (rc < 0 || rc > 4)
        wrong(stderr, argv, argc, rc, err, rc == 5 ? "internal error" : "exit status outside 0-5");
    int errors = 0;
    for (const char *l = err; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        if (strncmp(l, "memplan: ", 9))
            wrong(stderr, argv, argc, rc, err, "a stderr line not starting 'memplan: '");
        errors += !strncmp(l, "memplan: error: ", 16);
    }
    if (rc >= 2 && errors != 1)
        wrong(stderr, argv, argc, rc, err, "a failure without exactly one 'memplan: error:' line");
    if (rc < 2 && errors)
        wrong(stderr, argv, argc, rc, err, "an error line, yet an answer");
    if (rc < 2 && json && !emit && nout) {
        cJSON *j = cJSON_ParseWithOpts(out, NULL, 1);
        if (!j)
            wrong(stderr, argv, argc, rc, err, "--json output is not one valid JSON document");
        cJSON_Delete(j);
    }
    free(out);
    free(err);
out:
    for (int i = 0; i < nown; i++)
        free(own[i]);
    free(header);
    return 0;
}
