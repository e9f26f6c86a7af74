/* main.c — memplan's command line: the command table and the dispatch (help, version, one
 * command per cmd_<name>.c), the progress line on a terminal.  Options: options.c; what every
 * command shares: setup.c.
 *
 * Exit: 0 success / fits; 1 completed, does not fit; 2 usage; 3 bad input;
 * 4 probe unavailable or device error; 5 internal error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h> /* TIOCGWINSZ: the terminal's width, for the progress line */
#include <unistd.h>    /* isatty */

#include "cli/cli.h"

static const struct command COMMANDS[] = {
    {"estimate", C_EST, cmd_estimate, "where a training step's GPU memory goes, layer by layer, and when it peaks", ""},
    {"plan", C_PLAN, cmd_plan, "which blocks to checkpoint so the batch fits, at the least recompute",
     "--checkpoint defaults to optimal here. With --vram/--gpu the activation budget is what the\n"
     "target leaves after weights, gradients, optimizer state and overheads.\n"},
    {"probe", C_PROBE, cmd_probe, "run real training steps and measure peak memory and step time",
     "--checkpoint takes a fixed plan here (none, sqrt, segments:K, every:K, layers). Without a GPU,\n"
     "--backend auto runs the host (CPU) executor for small models.\n"},
    {"suggest", C_SUGG, cmd_suggest, "the configuration to train with: micro-batch, accumulation, checkpoints, precision",
     "Micro-batch and checkpoint strategy are searched; precision too unless --precision is given.\n"
     "Target: --gpu, --vram, --device, else the local GPU, else the a100-80gb profile.\n"},
    {"check", C_CHECK, cmd_check, "CI gate: exit 0 if the configuration fits the target, 1 if it does not",
     "--batch (or a --recipe that sets it) and a target (--gpu NAME or --vram SIZE) are required.\n"
     "No GPU is needed.\n"},
};
#define N_COMMANDS (sizeof COMMANDS / sizeof COMMANDS[0])


static void print_help(FILE *f)
{
    fprintf(f, "Usage: memplan COMMAND MODEL [options]\n\n"
               "Plans GPU memory for training: estimate, checkpoint placement, batch size.\n"
               "MODEL is a memplan JSON model or a Hugging Face config.json (the task head from\n"
               "architectures[0]), also given as its model directory or as a Hub id ORG/NAME in the\n"
               "local HF cache (never downloaded), of model type");
    /* the types, wrapped at 100 columns */
    size_t col = strlen("local HF cache (never downloaded), of model type");
    for (const char *t = mp_hf_model_types(); *t;) {
        size_t n = strcspn(t, ",");
        if (col + n + 2 > 100) {
            fputs("\n ", f);
            col = 1;
        }
        fprintf(f, " %.*s%s", (int)n, t, t[n] ? "," : ".");
        col += n + 2;
        t += n;
        t += strspn(t, ", ");
    }
    fputs("\nWith --recipe FILE (a trainer's recipe: HF, TRL, Axolotl, LLaMA-Factory, torchtune), MODEL may\n"
          "be left out: the recipe names it.", f);
    fputs("\n\nCommands:\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-9s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(f, "  %-9s %s\n", "help", "help [COMMAND | gpus]: a command's options, or the GPU profiles");
    fprintf(f, "\nmemplan COMMAND --help shows a command's options; memplan --version its version.\n"
               "Quick start: memplan suggest models/gpt2-124m.json --gpu a100-40gb\n"
               "Exit status: 0 success/fits, 1 does not fit, 2 usage, 3 bad input, 4 device error, 5 internal.\n");
}

/* The progress sink: on a terminal, after about 2 s of work, the latest message on one
 * line of stderr, at most 5 times a second; cleared when the work is over.  The line is
 * cut to the terminal's width (100 columns when it does not say), since a line that
 * wraps cannot be cleared with a carriage return. */
static double t_start, progress_after_ms = 2000; /* $MEMPLAN_PROGRESS_AFTER_MS: tests use 0 */
static bool progress_shown;
static int progress_cols = MP_TEXT_COLUMNS;

static void show_progress(const char *msg)
{
    static double last;
    double now = mp_now_ms();
    if (!msg) {
        if (progress_shown)
            fputs("\r\033[K", stderr);
        progress_shown = false;
        return;
    }
    if (now - t_start < progress_after_ms || now - last < 200)
        return;
    last = now;
    progress_shown = true;
    /* "memplan: " + msg + " ...", within progress_cols - 1 (the cursor stays on the line) */
    int room = progress_cols - 1 - 9 - 4;
    fprintf(stderr, "\r\033[Kmemplan: %.*s ...", room > 8 ? room : 8, msg);
    fflush(stderr);
}

static int cmd_help(int argc, char **argv)
{
    if (argc < 3) {
        print_help(stdout);
        return cli_finish(0);
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[2], COMMANDS[i].name)) {
            cli_command_help(stdout, &COMMANDS[i]);
            return cli_finish(0);
        }
    if (!strcmp(argv[2], "gpus")) {
        struct mp_gpu *g;
        size_t n;
        struct mp_diag d = {{0}};
        enum mp_status st = mp_gpu_list(cli_argv0, &g, &n, &d);
        if (st != MP_OK)
            return cli_fail(st, &d);
        if (n == 0) {
            fprintf(stderr, "memplan: error: no GPU profiles found (configs/gpus or $MEMPLAN_GPUS)\n");
            free(g);
            return MP_EXIT_INPUT;
        }
        printf("%-12s %-32s %10s %8s %8s %8s\n", "name", "description", "memory", "bf16", "fp16", "fp32");
        for (size_t i = 0; i < n; i++) {
            char m[32], nm[4 * sizeof g[i].name], ds[4 * sizeof g[i].description]; /* profiles' names escaped */
            printf("%-12s %-32s %10s %8.1f %8.1f %8.1f\n", mp_text_clean(g[i].name, nm, sizeof nm),
                   mp_text_clean(g[i].description, ds, sizeof ds),
                   mp_fmt_bytes(g[i].memory_bytes, m, 32), g[i].tflops_bf16, g[i].tflops_fp16, g[i].tflops_fp32);
        }
        free(g);
        return cli_finish(0);
    }
    return cli_usage_error(NULL, "help: no command '%s'", argv[2]);
}

int main(int argc, char **argv)
{
    cli_argv0 = argv[0];
    t_start = mp_now_ms();
    if (isatty(2)) {
        struct winsize ws;
        if (ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
            progress_cols = ws.ws_col < MP_TEXT_COLUMNS ? ws.ws_col : MP_TEXT_COLUMNS;
        mp_progress_set(show_progress);
    }
    const char *pa = getenv("MEMPLAN_PROGRESS_AFTER_MS");
    if (pa && *pa)
        progress_after_ms = atof(pa);
    if (argc < 2) {
        print_help(stderr);
        return MP_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        print_help(stdout);
        return cli_finish(0);
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
        printf("memplan %s\n", MEMPLAN_VERSION);
        return cli_finish(0);
    }
    if (!strcmp(cmd, "help"))
        return cmd_help(argc, argv);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(cmd, COMMANDS[i].name))
            continue;
        struct args a;
        int rc = cli_parse_args(&COMMANDS[i], argc - 1, argv + 1, &a);
        if (rc == -1)
            return cli_finish(0);
        if (!rc && a.timeline) /* before the work, not after it */
            rc = cli_check_out_file("--timeline", "the timeline", a.timeline, a.model);
        if (rc)
            return rc;
        return cli_flush_warnings(COMMANDS[i].run(&a));
    }
    return cli_usage_error(NULL, cmd[0] == '-' ? "unknown option '%s'" : "unknown command '%s'", cmd);
}
