/* main.c — memplan's command line: the command table, option parsing, exit
 * statuses.  The only file that prints diagnostics or exits.
 *
 * Exit: 0 success / fits; 1 completed, does not fit; 2 usage; 3 bad input;
 * 4 probe unavailable or device error; 5 internal error.
 */
#include <errno.h>
#include <getopt.h>  /* getopt_long */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h> /* TIOCGWINSZ: the terminal's width, for the progress line */
#include <sys/stat.h>  /* lstat, fchmod: the --timeline file */
#include <unistd.h>  /* isatty */

#include "ckpt/ckpt.h"
#include "estimate/estimate.h"
#include "search/search.h"
#include "ir/layers.h"
#include "model/model.h"
#include "probe/probe.h"
#include "report/report.h"

static const char *argv0 = "memplan";

/* ---- messages and exits ------------------------------------------------------------------ */

static int exit_for(enum mp_status st)
{
    switch (st) {
    case MP_OK: return MP_EXIT_OK;
    case MP_ERR_USAGE: return MP_EXIT_USAGE;
    case MP_ERR_IO:
    case MP_ERR_JSON:
    case MP_ERR_MODEL:
    case MP_ERR_RANGE: return MP_EXIT_INPUT;
    case MP_ERR_DEVICE:
    case MP_ERR_OOM:
    case MP_ERR_UNSUPPORTED: return MP_EXIT_DEVICE;
    case MP_ERR_INFEASIBLE: return MP_EXIT_NOFIT;
    default: return MP_EXIT_INTERNAL;
    }
}

static int fail(enum mp_status st, const struct mp_diag *d)
{
    mp_progress_done();
    fprintf(stderr, "memplan: error: %s\n", d->msg[0] ? d->msg : mp_status_str(st));
    return exit_for(st);
}

/* One line: "memplan: error: <problem> (see 'memplan CMD --help')", exit 2. */
static int usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "memplan: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see 'memplan %s%s--help')\n", cmd ? cmd : "", cmd ? " " : "");
    return MP_EXIT_USAGE;
}

/* ---- options ----------------------------------------------------------------------------- */

enum {
    O_BATCH = 'b', O_SEQ = 's', O_PREC = 'p', O_OPT = 'o', O_CKPT = 'c', O_HELP = 'h',
    O_JSON = 1000, O_ALL, O_ATTN, O_GPU, O_VRAM, O_DEVICE, O_BUDGET, O_SLOTS, O_MARGIN, O_GLOBAL, O_EMIT,
    O_STEPS, O_BACKEND, O_NOPROBE, O_WORKSPACE, O_CONTEXT, O_MAXBATCH, O_CAPACITY, O_ACCUM,
    O_TIMELINE, O_WIDE,
    O_GPUS, O_NODES, O_PARALLEL, O_OFFLOAD, O_OFFDEV, O_BUCKETVIEW, O_RANK,
    O_FINETUNE, O_LORA_R, O_LORA_ALPHA, O_LORA_DROPOUT, O_LORA_TARGETS, O_TRAIN_BLOCKS,
    O_MOE_CAPACITY,
    O_USE_CACHE, O_TARGET_SEQ,
};

/* Which commands accept which options (bit per command). */
enum { C_EST = 1, C_PLAN = 2, C_PROBE = 4, C_SUGG = 8, C_CHECK = 16 };

struct opt_info {
    struct option lo;
    unsigned cmds;
    const char *arg;
    const char *help;
};

static const struct opt_info OPTS[] = {
    {{"batch", required_argument, 0, O_BATCH}, C_EST | C_PLAN | C_PROBE | C_CHECK, "B", "micro-batch (default 1)"},
    {{"seq", required_argument, 0, O_SEQ}, 31, "S", "sequence length (default: the model's, at most 2048 for HF configs)"},
    {{"target-seq", required_argument, 0, O_TARGET_SEQ}, 31, "T", "encoder-decoders (t5): the decoder's length; --seq is the encoder's (default: = --seq)"},
    {{"precision", required_argument, 0, O_PREC}, 31, "P", "fp32 | amp-bf16 | amp-fp16 | bf16 | mixed-bf16 (default amp-bf16)"},
    {{"optimizer", required_argument, 0, O_OPT}, 31, "O", "sgd | sgd-momentum | adam | adamw | adafactor | adam8bit (default adamw)"},
    {{"checkpoint", required_argument, 0, O_CKPT}, C_EST | C_PLAN | C_PROBE | C_CHECK, "C", "none (default; plan: optimal) | sqrt | segments:K | every:K | layers | optimal[-segments]"},
    {{"finetune", required_argument, 0, O_FINETUNE}, 31, "F", "full | lora | qlora | freeze: what trains (default full)"},
    {{"lora-r", required_argument, 0, O_LORA_R}, 31, "R", "LoRA rank (default 16)"},
    {{"lora-alpha", required_argument, 0, O_LORA_ALPHA}, 31, "A", "lora_alpha for the snippet; scaling alpha/r (default 2r)"},
    {{"lora-dropout", required_argument, 0, O_LORA_DROPOUT}, 31, "P", "lora_dropout: > 0 keeps a mask and a copy per adapter (default 0)"},
    {{"lora-targets", required_argument, 0, O_LORA_TARGETS}, 31, "T", "all-linear | NAME,NAME,... (default: peft's for the family)"},
    {{"train-blocks", required_argument, 0, O_TRAIN_BLOCKS}, 31, "LIST", "freeze: trained decoder blocks and parts, e.g. 20-31,head"},
    {{"attention", required_argument, 0, O_ATTN}, 31, "A", "sdpa | flash | eager: override the attention implementation (default sdpa)"},
    {{"moe-capacity", required_argument, 0, O_MOE_CAPACITY}, 31, "F", "MoE routing: the busiest expert gets F x the uniform share (F >= 1; default 1, uniform)"},
    {{"use-cache", required_argument, 0, O_USE_CACHE}, 31, "on|off", "HF decoders: transformers' use_cache in training (default: the config's; off under --checkpoint layers)"},
    {{"gpu", required_argument, 0, O_GPU}, C_EST | C_PLAN | C_SUGG | C_CHECK, "NAME", "target GPU profile (configs/gpus/NAME.json), e.g. a100-40gb"},
    {{"vram", required_argument, 0, O_VRAM}, C_PLAN | C_SUGG | C_CHECK, "SIZE", "target memory, e.g. 24GiB, 24G (GiB), 80GB (10^9)"},
    {{"device", required_argument, 0, O_DEVICE}, C_PROBE | C_SUGG, "N", "CUDA device index, default 0 (probe: run on it; suggest: target it)"},
    {{"activation-budget", required_argument, 0, O_BUDGET}, C_PLAN, "SIZE", "activation budget for optimal plans"},
    {{"slots", required_argument, 0, O_SLOTS}, C_PLAN | C_SUGG | C_CHECK | C_EST, "N", "memory slots of the optimal DP (default 500)"},
    {{"margin", required_argument, 0, O_MARGIN}, C_SUGG | C_CHECK | C_PLAN, "PCT", "safety margin in percent of capacity (default 5)"},
    {{"global-batch", required_argument, 0, O_GLOBAL}, C_SUGG, "G", "global batch: micro-batch x accumulation = G exactly"},
    {{"grad-accum", required_argument, 0, O_ACCUM}, C_EST | C_PLAN | C_CHECK, "N", "gradient accumulation steps: with N > 1 .grad stays resident through each micro-step (default 1)"},
    {{"emit", required_argument, 0, O_EMIT}, C_SUGG, "WHAT", "torch | hf | deepspeed | accelerate: print only that snippet"},
    {{"gpus", required_argument, 0, O_GPUS}, C_EST | C_PLAN | C_PROBE | C_SUGG | C_CHECK, "N", "GPUs per node for data parallelism (figures are per rank)"},
    {{"nodes", required_argument, 0, O_NODES}, C_EST | C_PLAN | C_PROBE | C_SUGG | C_CHECK, "M", "nodes (world = N x M ranks; default 1)"},
    {{"parallel", required_argument, 0, O_PARALLEL}, C_EST | C_PLAN | C_PROBE | C_SUGG | C_CHECK, "S", "ddp | zero1 | zero2 | zero3 | fsdp | fsdp-no-reshard (suggest: searched)"},
    {{"offload", required_argument, 0, O_OFFLOAD}, C_EST | C_PLAN | C_PROBE | C_SUGG | C_CHECK, "W", "none | optimizer | params: move state to the host (ZeRO-Offload, FSDP2 CPUOffloadPolicy)"},
    {{"ddp-bucket-view", no_argument, 0, O_BUCKETVIEW}, C_EST | C_PLAN | C_PROBE | C_SUGG | C_CHECK, NULL, "DDP gradient_as_bucket_view=True: .grad are views of the buckets"},
    {{"rank", required_argument, 0, O_RANK}, C_PROBE, "R", "with --parallel: the rank whose shards the step holds (default 0)"},
    {{"offload-device", required_argument, 0, O_OFFDEV}, C_EST | C_PLAN | C_PROBE | C_SUGG | C_CHECK, "D", "cpu | nvme (nvme: ZeRO-Infinity, zero3 only; default cpu)"},
    {{"max-batch", required_argument, 0, O_MAXBATCH}, C_SUGG, "B", "largest micro-batch to consider (default 65536)"},
    {{"steps", required_argument, 0, O_STEPS}, C_PROBE, "N", "measured steps after one warm-up (default 3)"},
    {{"backend", required_argument, 0, O_BACKEND}, C_PROBE | C_SUGG, "B", "auto | cuda | host (default auto; suggest: host probes on the CPU)"},
    {{"capacity", required_argument, 0, O_CAPACITY}, C_PROBE | C_SUGG, "SIZE", "probe memory limit (probe: host only, default none; suggest: default the target's usable less context)"},
    {{"no-probe", no_argument, 0, O_NOPROBE}, C_SUGG, NULL, "do not confirm with probes even when a GPU is present"},
    {{"workspace", required_argument, 0, O_WORKSPACE}, 31, "SIZE", "cuBLAS workspace, at most 1024TiB (default 8519680 B, or the --gpu profile's where --gpu applies)"},
    {{"context", required_argument, 0, O_CONTEXT}, C_EST | C_PLAN | C_SUGG | C_CHECK, "SIZE", "CUDA context size, at most 1024TiB (default: the GPU profile's, else 500MiB)"},
    {{"timeline", required_argument, 0, O_TIMELINE}, C_EST | C_PLAN | C_PROBE | C_CHECK, "FILE",
     "also draw the step's memory over time as an SVG picture in FILE"},
    {{"all-layers", no_argument, 0, O_ALL}, C_EST, NULL, "do not fold identical repeated blocks"},
    {{"wide", no_argument, 0, O_WIDE}, 31, NULL, "text wider than 100 columns: the full block table, no wrapping"},
    {{"json", no_argument, 0, O_JSON}, 31, NULL, "print the report as JSON (schema 1)"},
    {{"help", no_argument, 0, O_HELP}, 31, NULL, "show this help"},
};
#define N_OPTS (sizeof OPTS / sizeof OPTS[0])

struct args {
    const char *model;
    double moe_capacity;   /* --moe-capacity (1: uniform routing) */
    uint64_t batch;
    bool batch_set;
    uint64_t seq;
    uint64_t target_seq; /* --target-seq (0: not given) */
    int precision;
    bool precision_set;
    int optimizer;
    struct mp_ckpt_spec ckpt;
    bool ckpt_set;
    int attention;
    bool attention_set;
    int use_cache; /* -1: the config's; 0 off; 1 on */
    const char *gpu;
    uint64_t vram;
    int device;
    bool device_set;
    uint64_t budget;
    uint64_t slots;
    double margin;
    bool margin_set;
    uint64_t global_batch;
    enum mp_emit emit;
    uint64_t steps;
    const char *backend;
    bool no_probe;
    uint64_t workspace;
    bool workspace_set;
    uint64_t context;
    bool context_set;
    uint64_t max_batch;
    uint64_t capacity;
    uint64_t grad_accum;
    const char *timeline;
    bool json, all_layers, wide;
    struct mp_parallel par;
    bool par_set, gpus_set;
    struct mp_finetune ft;
    bool alpha_set, lora_set, blocks_set;
};

struct command {
    const char *name;
    unsigned bit;
    int (*run)(struct args *a);
    const char *summary;
};

static int cmd_estimate(struct args *a);
static int cmd_plan(struct args *a);
static int cmd_probe(struct args *a);
static int cmd_suggest(struct args *a);
static int cmd_check(struct args *a);

static const struct command COMMANDS[] = {
    {"estimate", C_EST, cmd_estimate, "where a training step's GPU memory goes, layer by layer, and when it peaks"},
    {"plan", C_PLAN, cmd_plan, "which blocks to checkpoint so the batch fits, at the least recompute"},
    {"probe", C_PROBE, cmd_probe, "run real training steps and measure peak memory and step time"},
    {"suggest", C_SUGG, cmd_suggest, "the configuration to train with: micro-batch, accumulation, checkpoints, precision"},
    {"check", C_CHECK, cmd_check, "CI gate: exit 0 if the configuration fits the target, 1 if it does not"},
};
#define N_COMMANDS (sizeof COMMANDS / sizeof COMMANDS[0])

/* Per-command notes printed after the shared option table. */
static const char *command_notes(unsigned bit)
{
    switch (bit) {
    case C_PLAN: return "--checkpoint defaults to optimal here. With --vram/--gpu the activation budget is what the\n"
                        "target leaves after weights, gradients, optimizer state and overheads.\n";
    case C_PROBE: return "--checkpoint takes a fixed plan here (none, sqrt, segments:K, every:K, layers). Without a GPU,\n"
                         "--backend auto runs the host (CPU) executor for small models.\n";
    case C_SUGG: return "Micro-batch and checkpoint strategy are searched; precision too unless --precision is given.\n"
                        "Target: --gpu, --vram, --device, else the local GPU, else the a100-80gb profile.\n";
    case C_CHECK: return "--batch and a target (--gpu NAME or --vram SIZE) are required. No GPU is needed.\n";
    default: return "";
    }
}

/* Usage generated from the option table: the synopsis wrapped under the command
 * name, one line per option, help text wrapped at 100 columns. */
static void print_command_help(FILE *out, const struct command *c)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        f = out;
    int ind = fprintf(f, "Usage: memplan %s ", c->name), col = ind + fprintf(f, "MODEL");
    for (size_t i = 0; i < N_OPTS; i++) {
        if (!(OPTS[i].cmds & c->bit) || OPTS[i].lo.val == O_HELP)
            continue;
        char item[64];
        int n = snprintf(item, sizeof item, "[--%s%s%s]", OPTS[i].lo.name, OPTS[i].arg ? " " : "",
                         OPTS[i].arg ? OPTS[i].arg : "");
        if (col + 1 + n > MP_TEXT_COLUMNS) {
            fprintf(f, "\n%*s", ind, "");
            col = ind;
        } else {
            fputc(' ', f);
            col++;
        }
        col += fprintf(f, "%s", item);
    }
    fprintf(f, "\n\n%s.\n\nOptions:\n", c->summary);
    for (size_t i = 0; i < N_OPTS; i++) {
        if (!(OPTS[i].cmds & c->bit))
            continue;
        char left[48];
        snprintf(left, sizeof left, "--%s%s%s", OPTS[i].lo.name, OPTS[i].arg ? " " : "", OPTS[i].arg ? OPTS[i].arg : "");
        if (OPTS[i].lo.val < 128)
            fprintf(f, "  -%c, %-26s %s\n", OPTS[i].lo.val, left, OPTS[i].help);
        else
            fprintf(f, "      %-26s %s\n", left, OPTS[i].help);
    }
    fprintf(f, "\n%sExit status: 0 success/fits, 1 does not fit, 2 usage, 3 bad input, 4 device error, 5 internal.\n"
               "See memplan(1).\n",
            command_notes(c->bit));
    if (f != out) {
        fclose(f);
        mp_report_fit_text(out, buf, len, MP_TEXT_COLUMNS);
        free(buf);
    }
}

static void print_help(FILE *f)
{
    fprintf(f, "Usage: memplan COMMAND MODEL [options]\n\n"
               "Plans GPU memory for training: estimate, checkpoint placement, batch size.\n"
               "MODEL is a memplan JSON model or a Hugging Face config.json (the task head from\n"
               "architectures[0]) of model type");
    /* the types, wrapped at 100 columns */
    size_t col = strlen("architectures[0]) of model type");
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
    fputs("\n\nCommands:\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-9s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(f, "  %-9s %s\n", "help", "help [COMMAND | gpus]: a command's options, or the GPU profiles");
    fprintf(f, "\nmemplan COMMAND --help shows a command's options; memplan --version its version.\n"
               "Quick start: memplan suggest models/gpt2-124m.json --gpu a100-40gb\n"
               "Exit status: 0 success/fits, 1 does not fit, 2 usage, 3 bad input, 4 device error, 5 internal.\n");
}

/* Largest values the integer options take: beyond them a plan means nothing. */
#define MAX_BATCH (1ull << 24)        /* micro-batch, --max-batch, --grad-accum */
#define MAX_SEQ (1ull << 24)
#define MAX_GLOBAL_BATCH (1ull << 32)

/* The bounds of the last integer option parsed, for its message. */
static uint64_t range_lo, range_hi;

/* A whole number in [lo, hi]: MP_ERR_RANGE outside it (or beyond 64 bits), MP_ERR_USAGE
 * when it is not a number; the option's own message says what was expected. */
static enum mp_status parse_int_in(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    range_lo = lo;
    range_hi = hi;
    enum mp_status st = mp_parse_u64(s, out);
    return st == MP_OK && (*out < lo || *out > hi) ? MP_ERR_RANGE : st;
}

/* A decimal number in lo..hi, each end included or not: MP_ERR_USAGE when it is not a decimal
 * number (nan, inf, hex, junk), MP_ERR_RANGE outside the range or beyond a double. */
static enum mp_status parse_num_in(const char *s, double lo, bool lo_in, double hi, bool hi_in, double *out)
{
    double v = 0;
    enum mp_status st = mp_parse_double(s, &v);
    if (st != MP_OK)
        return st;
    if (v < lo || (v == lo && !lo_in) || v > hi || (v == hi && !hi_in))
        return MP_ERR_RANGE;
    *out = v;
    return MP_OK;
}

/* The CUDA context and the cuBLAS workspace: at most 1 PiB, as a GPU profile's (a size near
 * 2^64 overflowed the peak device bytes they are added to). */
#define MAX_OVERHEAD_BYTES (UINT64_C(1) << 50)

/* A byte size, at most hi. */
static enum mp_status parse_size_max(const char *s, uint64_t hi, uint64_t *out)
{
    enum mp_status st = mp_parse_size(s, out);
    return st == MP_OK && *out > hi ? MP_ERR_RANGE : st;
}

/* A byte size, at least lo. */
static enum mp_status parse_size_min(const char *s, uint64_t lo, uint64_t *out)
{
    enum mp_status st = mp_parse_size(s, out);
    return st == MP_OK && *out < lo ? MP_ERR_USAGE : st;
}

static int parse_args(const struct command *c, int argc, char **argv, struct args *a)
{
    memset(a, 0, sizeof *a);
    mp_parallel_default(&a->par);
    a->batch = 1;
    a->precision = MP_PREC_AMP_BF16;
    a->optimizer = MP_OPT_ADAMW;
    a->attention = MP_ATTN_SDPA;
    a->use_cache = -1;
    a->margin = 0.05;
    a->moe_capacity = 1.0;
    a->steps = 3;
    a->backend = "auto";
    a->ckpt.strategy = c->bit == C_PLAN ? MP_CKPT_OPTIMAL : MP_CKPT_NONE;
    mp_finetune_default(&a->ft);
    struct mp_diag fd = {{0}};
    struct option lo[N_OPTS + 1];
    char shortopts[64] = ":"; /* ':' first: a missing value is reported as such */
    for (size_t i = 0; i < N_OPTS; i++) {
        lo[i] = OPTS[i].lo;
        if (OPTS[i].lo.val < 128) {
            size_t l = strlen(shortopts);
            shortopts[l] = (char)OPTS[i].lo.val;
            shortopts[l + 1] = OPTS[i].lo.has_arg ? ':' : 0;
            shortopts[l + 2] = 0;
        }
    }
    memset(&lo[N_OPTS], 0, sizeof lo[N_OPTS]);
    optind = 1;
    opterr = 0;
    int ch, idx;
    while ((ch = getopt_long(argc, argv, shortopts, lo, &idx)) != -1) {
        if (ch == '?' || ch == ':') {
            char bad[64]; /* a missing value: the option as typed (--seq, not -s) */
            if (optopt && optopt < 128 && (ch == '?' || argv[optind - 1][1] != '-'))
                snprintf(bad, sizeof bad, "-%c", optopt);
            else
                snprintf(bad, sizeof bad, "%s", argv[optind - 1]);
            return usage_error(c->name, ch == ':' ? "option '%s' needs a value" : "unknown option '%s'", bad);
        }
        const struct opt_info *oi = NULL;
        for (size_t i = 0; i < N_OPTS; i++)
            if (OPTS[i].lo.val == ch)
                oi = &OPTS[i];
        if (oi && !(oi->cmds & c->bit)) {
            char bad[64];
            snprintf(bad, sizeof bad, "--%s", oi->lo.name);
            fprintf(stderr, "memplan: error: option '%s' does not apply to '%s' (see 'memplan %s --help')\n", bad,
                    c->name, c->name);
            return MP_EXIT_USAGE;
        }
        enum mp_status st = MP_OK;
        const char *what = NULL;
        const char *num = NULL; /* a decimal option's range, for its messages */
        range_lo = range_hi = 0;
        switch (ch) {
        case O_HELP:
            print_command_help(stdout, c);
            return -1;
        case O_BATCH:
            st = parse_int_in(optarg, 1, MAX_BATCH, &a->batch);
            a->batch_set = true;
            what = "--batch: expected a positive integer, got '%s'";
            break;
        case O_SEQ:
            st = parse_int_in(optarg, 1, MAX_SEQ, &a->seq);
            what = "--seq: expected a positive integer, got '%s'";
            break;
        case O_TARGET_SEQ:
            st = parse_int_in(optarg, 1, MAX_SEQ, &a->target_seq);
            what = "--target-seq: expected a positive integer, got '%s'";
            break;
        case O_PREC:
            /* mixed-bf16: the program runs in bf16 (FSDP2 param_dtype / DeepSpeed bf16), the
             * sharding engine keeps the fp32 master (parallel.h) */
            a->par.mixed_bf16 = !strcmp(optarg, "mixed-bf16");
            a->precision = a->par.mixed_bf16 ? (int)MP_PREC_BF16 : mp_precision_parse(optarg);
            a->precision_set = true;
            st = a->precision < 0 ? MP_ERR_USAGE : MP_OK;
            what = "--precision: expected fp32, amp-bf16, amp-fp16, bf16 or mixed-bf16, got '%s'";
            break;
        case O_GPUS:
            st = parse_int_in(optarg, 1, 65536, &a->par.gpus);
            a->gpus_set = true;
            what = "--gpus: expected an integer from 1 to 65536, got '%s'";
            break;
        case O_NODES:
            st = parse_int_in(optarg, 1, 65536, &a->par.nodes);
            what = "--nodes: expected an integer from 1 to 65536, got '%s'";
            break;
        case O_PARALLEL: {
            int v = mp_par_strategy_parse(optarg);
            st = v <= 0 ? MP_ERR_USAGE : MP_OK;
            a->par.strategy = v > 0 ? (enum mp_par_strategy)v : MP_PAR_NONE;
            a->par_set = true;
            what = "--parallel: expected ddp, zero1, zero2, zero3, fsdp or fsdp-no-reshard, got '%s'";
            break;
        }
        case O_OFFLOAD: {
            int v = mp_offload_parse(optarg);
            st = v < 0 ? MP_ERR_USAGE : MP_OK;
            a->par.offload = v > 0 ? (enum mp_offload)v : MP_OFFLOAD_NONE;
            what = "--offload: expected none, optimizer or params, got '%s'";
            break;
        }
        case O_BUCKETVIEW: a->par.ddp_grad_as_bucket_view = true; break;
        case O_RANK:
            st = parse_int_in(optarg, 0, 65536 * 65536ull - 1, &a->par.rank);
            what = "--rank: expected an integer from 0, got '%s'";
            break;
        case O_OFFDEV: {
            int v = mp_offload_dev_parse(optarg);
            st = v < 0 ? MP_ERR_USAGE : MP_OK;
            a->par.offload_device = v > 0 ? (enum mp_offload_dev)v : MP_OFFDEV_CPU;
            what = "--offload-device: expected cpu or nvme, got '%s'";
            break;
        }
        case O_OPT:
            a->optimizer = mp_optimizer_parse(optarg);
            st = a->optimizer < 0 ? MP_ERR_USAGE : MP_OK;
            what = "--optimizer: expected sgd, sgd-momentum, adam, adamw, adafactor or adam8bit, got '%s'";
            break;
        case O_CKPT:
            st = mp_ckpt_spec_parse(optarg, &a->ckpt);
            a->ckpt_set = true;
            what = "--checkpoint: expected none, sqrt, segments:K, every:K, layers, optimal or optimal-segments, got '%s'";
            break;
        case O_ATTN:
            a->attention = mp_attn_impl_parse(optarg);
            a->attention_set = true;
            st = a->attention < 0 ? MP_ERR_USAGE : MP_OK;
            what = "--attention: expected sdpa, flash or eager, got '%s'";
            break;
        case O_USE_CACHE:
            a->use_cache = !strcmp(optarg, "on") ? 1 : !strcmp(optarg, "off") ? 0 : -2;
            st = a->use_cache < -1 ? MP_ERR_USAGE : MP_OK;
            what = "--use-cache: expected on or off, got '%s'";
            break;
        case O_GPU: a->gpu = optarg; break;
        case O_VRAM:
            st = parse_size_min(optarg, 1, &a->vram);
            what = "--vram: expected a size like 24GiB, 24G or 80GB, got '%s'";
            break;
        case O_DEVICE: {
            uint64_t v = 0;
            st = parse_int_in(optarg, 0, 64, &v);
            a->device = (int)v;
            a->device_set = true;
            what = "--device: expected a device index, got '%s'";
            break;
        }
        case O_BUDGET:
            st = parse_size_min(optarg, 1, &a->budget);
            what = "--activation-budget: expected a size, got '%s'";
            break;
        case O_SLOTS:
            st = parse_int_in(optarg, 10, 100000, &a->slots);
            what = "--slots: expected an integer from 10 to 100000, got '%s'";
            break;
        case O_MARGIN:
            st = parse_num_in(optarg, 0, true, 90, false, &a->margin);
            a->margin /= 100.0;
            a->margin_set = true;
            num = "a percentage, at least 0 and under 90";
            break;
        case O_GLOBAL:
            st = parse_int_in(optarg, 1, MAX_GLOBAL_BATCH, &a->global_batch);
            what = "--global-batch: expected a positive integer, got '%s'";
            break;
        case O_EMIT:
            a->emit = !strcmp(optarg, "torch")        ? MP_EMIT_TORCH
                      : !strcmp(optarg, "hf")         ? MP_EMIT_HF
                      : !strcmp(optarg, "deepspeed")  ? MP_EMIT_DEEPSPEED
                      : !strcmp(optarg, "accelerate") ? MP_EMIT_ACCELERATE
                                                      : MP_EMIT_NONE;
            st = a->emit == MP_EMIT_NONE ? MP_ERR_USAGE : MP_OK;
            what = "--emit: expected torch, hf, deepspeed or accelerate, got '%s'";
            break;
        case O_ACCUM:
            st = parse_int_in(optarg, 1, MAX_BATCH, &a->grad_accum);
            what = "--grad-accum: expected a positive integer, got '%s'";
            break;
        case O_MAXBATCH:
            st = parse_int_in(optarg, 1, MAX_BATCH, &a->max_batch);
            what = "--max-batch: expected a positive integer, got '%s'";
            break;
        case O_STEPS:
            st = parse_int_in(optarg, 1, 64, &a->steps);
            what = "--steps: expected an integer from 1 to 64, got '%s'";
            break;
        case O_BACKEND:
            a->backend = optarg;
            st = strcmp(optarg, "auto") && strcmp(optarg, "cuda") && strcmp(optarg, "host") ? MP_ERR_USAGE : MP_OK;
            what = "--backend: expected auto, cuda or host, got '%s'";
            break;
        case O_CAPACITY:
            st = mp_parse_size(optarg, &a->capacity);
            what = "--capacity: expected a size, got '%s'";
            break;
        case O_NOPROBE: a->no_probe = true; break;
        case O_WORKSPACE:
            st = parse_size_max(optarg, MAX_OVERHEAD_BYTES, &a->workspace);
            a->workspace_set = true;
            what = "--workspace: expected a size, got '%s'";
            break;
        case O_CONTEXT:
            st = parse_size_max(optarg, MAX_OVERHEAD_BYTES, &a->context);
            a->context_set = true;
            what = "--context: expected a size, got '%s'";
            break;
        case O_FINETUNE: {
            int m = mp_ft_mode_parse(optarg);
            a->ft.mode = m < 0 ? MP_FT_FULL : (enum mp_ft_mode)m;
            st = m < 0 ? MP_ERR_USAGE : MP_OK;
            what = "--finetune: expected full, lora, qlora or freeze, got '%s'";
            break;
        }
        case O_LORA_R:
            st = parse_int_in(optarg, 1, 65536, &a->ft.r);
            a->lora_set = true;
            what = "--lora-r: expected an integer from 1 to 65536, got '%s'";
            break;
        case O_LORA_ALPHA:
            st = parse_num_in(optarg, 0, false, 1e6, false, &a->ft.alpha);
            a->alpha_set = a->lora_set = true;
            num = "a number above 0 and under 1000000";
            break;
        case O_LORA_DROPOUT:
            st = parse_num_in(optarg, 0, true, 1, false, &a->ft.dropout);
            a->lora_set = true;
            num = "a probability in [0, 1)";
            break;
        case O_LORA_TARGETS:
            if (mp_finetune_parse_targets(&a->ft, optarg, &fd) != MP_OK) {
                fprintf(stderr, "memplan: error: %s (see 'memplan %s --help')\n", fd.msg, c->name);
                return MP_EXIT_USAGE;
            }
            a->lora_set = true;
            break;
        case O_TRAIN_BLOCKS:
            if (mp_finetune_parse_blocks(&a->ft, optarg, &fd) != MP_OK) {
                fprintf(stderr, "memplan: error: %s (see 'memplan %s --help')\n", fd.msg, c->name);
                return MP_EXIT_USAGE;
            }
            a->blocks_set = true;
            break;
        case O_MOE_CAPACITY:
            st = parse_num_in(optarg, 1, true, 1e6, true, &a->moe_capacity);
            num = "a number from 1 to 1000000";
            break;
        case O_TIMELINE: a->timeline = optarg; break;
        case O_WIDE: a->wide = true; break;
        case O_ALL: a->all_layers = true; break;
        case O_JSON: a->json = true; break;
        default: return usage_error(c->name, "unexpected option '%s'", argv[optind - 1]);
        }
        if (st != MP_OK && num && oi) {
            fprintf(stderr, "memplan: error: --%s: '%s' is %s: expected %s (see 'memplan %s --help')\n", oi->lo.name,
                    optarg, st == MP_ERR_RANGE          ? "out of range"
                            : strpbrk(optarg, "xX") ? "not a decimal number"
                                                    : "not a number",
                    num, c->name);
            return MP_EXIT_USAGE;
        }
        if (st == MP_ERR_RANGE && oi) {
            bool small = range_hi && optarg[0] >= '0' && optarg[0] <= '9' && strlen(optarg) < 20 &&
                         strtoull(optarg, NULL, 10) < range_lo;
            if (range_hi)
                fprintf(stderr, "memplan: error: --%s: %s is too %s: expected an integer from %llu to %llu "
                                "(see 'memplan %s --help')\n",
                        oi->lo.name, optarg, small ? "small" : "large", (unsigned long long)range_lo,
                        (unsigned long long)range_hi, c->name);
            else
                fprintf(stderr, "memplan: error: --%s: '%s' is too large%s (see 'memplan %s --help')\n", oi->lo.name,
                        optarg, ch == O_CONTEXT || ch == O_WORKSPACE ? " (at most 1024TiB)" : "", c->name);
            return MP_EXIT_USAGE;
        }
        if (st != MP_OK)
            return usage_error(c->name, what, optarg);
    }
    if (optind >= argc)
        return usage_error(c->name, "%s: missing MODEL (a memplan JSON model or an HF config.json)", c->name);
    if (optind + 1 < argc)
        return usage_error(c->name, "unexpected argument '%s'", argv[optind + 1]);
    a->model = argv[optind];
    if (!strcmp(a->model, "-"))
        return usage_error(c->name, "%s", "MODEL '-': memplan does not read a model from stdin; pass the file's path");
    if (a->gpu && a->vram)
        return usage_error(c->name, "%s", "--gpu and --vram are exclusive");
    bool lora = a->ft.mode == MP_FT_LORA || a->ft.mode == MP_FT_QLORA;
    if (a->lora_set && !lora)
        return usage_error(c->name, "%s", "--lora-* options need --finetune lora or qlora");
    if (a->blocks_set != (a->ft.mode == MP_FT_FREEZE))
        return usage_error(c->name, "%s", a->blocks_set ? "--train-blocks needs --finetune freeze"
                                                        : "--finetune freeze needs --train-blocks, e.g. 20-31,head");
    if (!a->alpha_set)
        a->ft.alpha = 2.0 * (double)a->ft.r;
    if (a->par.rank && a->par.strategy == MP_PAR_NONE)
        return usage_error(c->name, "%s", "--rank needs --gpus N --parallel S");
    /* parallel.c sizes gradients, buckets and shards from every parameter: refused, not ignored */
    if (a->ft.mode != MP_FT_FULL && (a->par.gpus * a->par.nodes > 1 || a->par.strategy != MP_PAR_NONE))
        return usage_error(c->name, "--finetune %s with --gpus/--nodes/--parallel: data-parallel fine-tuning "
                                    "is not modelled yet", mp_ft_mode_str(a->ft.mode));
    if (c->bit != C_SUGG || a->par_set) { /* suggest searches the strategy unless given */
        struct mp_diag pd = {{0}};
        if (mp_par_validate(&a->par, &pd) != MP_OK)
            return usage_error(c->name, "%s", pd.msg);
    }
    return 0;
}

/* ---- shared setup -------------------------------------------------------------------------- */

struct setup {
    struct mp_model model;
    struct mp_build_opts build;
    struct mp_train_opts train;
    struct mp_parallel par;       /* train.par points here */
    struct mp_gpu gpu;
    bool have_gpu;
    bool target_is_device; /* the target is the local GPU (probes of it answer for it) */
    char how[96];
    char defaults[384];
};

static void add_default(struct setup *s, const char *fmt, const char *v)
{
    size_t l = strlen(s->defaults);
    if (l)
        snprintf(s->defaults + l, sizeof s->defaults - l, ", ");
    l = strlen(s->defaults);
    snprintf(s->defaults + l, sizeof s->defaults - l, fmt, v);
}

/* --train-blocks against the model, as the lowering reads it: numbers name the repeated (decoder)
 * blocks, 0 to n-1, or without repeated blocks every block by its index; embed and head the
 * blocks before and after the repeated ones.  0, or the exit status (message printed). */
static int check_train_blocks(const struct args *a, const struct mp_model *m)
{
    if (a->ft.mode != MP_FT_FREEZE)
        return 0;
    size_t n_rep = 0, first = 0, last = 0;
    for (size_t i = 0; i < m->n_blocks; i++)
        if (m->blocks[i].repeat_group > 0) {
            first = n_rep++ ? first : i;
            last = i;
        }
    size_t n = n_rep ? n_rep : m->n_blocks;
    const char *kind = n_rep ? "repeated (decoder) blocks" : "blocks and no repeated ones";
    for (size_t i = 0; i < a->ft.n_ranges; i++) {
        if (a->ft.range_hi[i] < n)
            continue;
        char r[48];
        snprintf(r, sizeof r, a->ft.range_lo[i] == a->ft.range_hi[i] ? "%llu" : "%llu-%llu",
                 (unsigned long long)a->ft.range_lo[i], (unsigned long long)a->ft.range_hi[i]);
        fprintf(stderr, "memplan: error: --train-blocks: %s is out of range: %s has %zu %s (numbered 0 to %zu)\n",
                r, a->model, n, kind, n - 1);
        return MP_EXIT_USAGE;
    }
    bool no_embed = a->ft.train_embed && (!n_rep || first == 0),
         no_head = a->ft.train_head && (!n_rep || last + 1 == m->n_blocks);
    if (no_embed || no_head) {
        fprintf(stderr, "memplan: error: --train-blocks: %s: %s has no block %s its repeated (decoder) blocks%s\n",
                no_embed ? "embed" : "head", a->model, no_embed ? "before" : "after",
                n_rep ? "" : " (it has none: name its blocks by number)");
        return MP_EXIT_USAGE;
    }
    return 0;
}

static int setup(struct args *a, struct setup *s, bool need_target, struct mp_diag *d)
{
    memset(s, 0, sizeof *s);
    int rc = 0;
    enum mp_status st = mp_model_load_file(&s->model, a->model, d);
    if (st != MP_OK)
        return fail(st, d); /* nothing loaded: nothing to release */
    mp_build_opts_default(&s->build);
    s->build.batch = a->batch;
    s->build.seq = a->seq;
    s->build.precision = (enum mp_precision)a->precision;
    s->build.attention = (enum mp_attn_impl)a->attention;
    s->build.attention_forced = a->attention_set;
    s->build.ft = a->ft;
    s->build.ft.input_grad = a->ckpt.strategy != MP_CKPT_NONE;
    s->build.hf_checkpointing = a->ckpt.strategy == MP_CKPT_LAYERS;
    s->build.target_seq = a->target_seq;
    if (a->target_seq && (!s->model.enc_dec || s->model.dec_from_input)) {
        fprintf(stderr, "memplan: error: --target-seq: %s %s\n", a->model,
                s->model.enc_dec ? "decodes its input ids shifted (T5ForQuestionAnswering): the decoder's length is "
                                   "--seq"
                                 : "is not an encoder-decoder model (t5 configs only)");
        rc = MP_EXIT_USAGE;
        goto out;
    }
    if ((rc = check_train_blocks(a, &s->model)) != 0)
        goto out;
    if (a->use_cache >= 0 && !s->model.kv_cache) {
        fprintf(stderr, "memplan: error: --use-cache: %s has no key/value cache (HF decoder configs only)\n",
                a->model);
        rc = MP_EXIT_USAGE;
        goto out;
    }
    if (a->use_cache >= 0)
        s->model.use_cache = a->use_cache == 1;
    if (s->model.quant.kind != MP_Q_NONE && (a->ft.mode == MP_FT_FULL || a->ft.mode == MP_FT_FREEZE)) {
        fprintf(stderr, "memplan: error: %s: quantization_config: a %s-quantized base cannot be %s fine-tuned; "
                        "train adapters on it with --finetune lora (or qlora)\n",
                a->model, mp_quant_kind_str(s->model.quant.kind), a->ft.mode == MP_FT_FULL ? "fully" : "partly");
        rc = MP_EXIT_INPUT;
        goto out;
    }
    const char *why = a->ft.mode == MP_FT_LORA || a->ft.mode == MP_FT_QLORA ? mp_moe_lora_unmodelled(&s->model, &a->ft)
                                                                             : NULL;
    if (why) {
        fprintf(stderr, "memplan: error: %s: --finetune %s on a mixture-of-experts model: %s; memplan does not "
                        "model adapters on expert parameters yet: name attention modules with --lora-targets (e.g. "
                        "q_proj,v_proj)\n", a->model, mp_ft_mode_str(a->ft.mode), why);
        rc = MP_EXIT_USAGE;
        goto out;
    }
    mp_train_opts_default(&s->train);
    s->train.optimizer = (enum mp_optimizer)a->optimizer;
    s->train.accumulate = a->grad_accum > 1;
    s->par = a->par;
    s->train.par = a->par.strategy != MP_PAR_NONE ? &s->par : NULL;
    char num[32];
    if (!a->seq && s->model.input == MP_INPUT_TOKENS) {
        snprintf(num, sizeof num, "%llu", (unsigned long long)s->model.seq_len);
        add_default(s, "seq %s (model)", num);
    }
    if (s->model.enc_dec && !a->target_seq) {
        snprintf(num, sizeof num, "%llu", (unsigned long long)(a->seq ? a->seq : s->model.seq_len));
        add_default(s, s->model.dec_from_input ? "target seq %s (= seq: the input ids shifted)"
                                               : "target seq %s (= seq; the decoder's length)", num);
    }
    for (size_t i = 0; i < s->model.n_blocks && s->model.input == MP_INPUT_IMAGE; i++)
        for (size_t j = 0; j < s->model.blocks[i].n_layers; j++) {
            const struct mp_layer *l = &s->model.blocks[i].layers[j];
            if (l->type != MP_LT_PATCH_EMBEDDING || !l->kernel)
                continue;
            snprintf(num, sizeof num, "%llu", (unsigned long long)((s->model.height / l->kernel) *
                                                                   (s->model.width / l->kernel) + l->cls_token));
            add_default(s, "seq %s (image patches + class token; --seq does not apply)", num);
        }
    if (!a->batch_set && !need_target)
        add_default(s, "batch %s", "1");
    if (!a->precision_set && !need_target)
        add_default(s, "precision %s", "amp-bf16");
    if (a->optimizer == MP_OPT_ADAMW)
        add_default(s, "optimizer %s", "adamw");
    if (!a->attention_set && mp_model_has_attention(&s->model))
        add_default(s, "attention %s (transformers' default: no s x s matrix kept)", "sdpa");
    if (s->model.kv_cache && a->use_cache < 0)
        add_default(s, "use_cache %s", !s->model.use_cache ? "off (config)"
                                       : a->ckpt.strategy == MP_CKPT_LAYERS ? "off (gradient checkpointing turns it off)"
                                                                            : "on (config: k/v copied into a DynamicCache)");
    if (a->gpu) {
        if ((st = mp_gpu_load(a->gpu, argv0, &s->gpu, d)) != MP_OK) {
            rc = fail(st, d);
            goto out;
        }
        s->have_gpu = true;
        snprintf(s->how, sizeof s->how, "--gpu %s", a->gpu);
    } else if (a->vram) {
        mp_gpu_from_vram(a->vram, &s->gpu);
        s->have_gpu = true;
        snprintf(s->how, sizeof s->how, "--vram");
    } else if (need_target) {
        struct mp_diag pd = {{0}};
        if (mp_gpu_from_device(a->device, &s->gpu, &pd) == MP_OK) {
            s->have_gpu = true;
            s->target_is_device = true;
            snprintf(s->how, sizeof s->how, "the local GPU (device %d)", a->device);
        } else if (a->device_set) {
            fprintf(stderr, "memplan: error: --device %d: no usable CUDA device (%s)\n", a->device,
                    pd.msg[0] ? pd.msg : "none found");
            rc = MP_EXIT_DEVICE;
            goto out;
        } else {
            if ((st = mp_gpu_load(MP_DEFAULT_GPU, argv0, &s->gpu, d)) != MP_OK) {
                rc = fail(st, d);
                goto out;
            }
            s->have_gpu = true;
            snprintf(s->how, sizeof s->how, "default profile: no GPU here and no --gpu/--vram");
        }
    }
    if (!s->have_gpu)
        mp_gpu_from_vram(0, &s->gpu);
    if (a->workspace_set)
        s->gpu.workspace_bytes = a->workspace;
    if (a->context_set)
        s->gpu.context_bytes = a->context;
    s->train.cublas_workspace_bytes = s->gpu.workspace_bytes;
out: /* the one way out: on a failure the model is released */
    if (rc)
        mp_model_release(&s->model);
    return rc;
}

static void fill_ctx(struct mp_report_ctx *c, const char *cmd, struct setup *s, const struct mp_program *prog,
                     const struct mp_ckpt_spec *ck, struct args *a)
{
    memset(c, 0, sizeof *c);
    c->command = cmd;
    c->model = &s->model;
    c->prog = prog;
    c->build = &s->build;
    c->ft = &s->build.ft;
    c->train = &s->train;
    c->ckpt = ck;
    c->gpu = s->have_gpu && s->gpu.memory_bytes ? &s->gpu : NULL;
    c->target_how = s->how;
    c->json = a->json;
    c->all_layers = a->all_layers;
    c->wide = a->wide;
    c->margin_pct = 100.0 * a->margin;
    c->moe_capacity = a->moe_capacity;
    snprintf(c->defaults, sizeof c->defaults, "%s", s->defaults);
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

static int finish(int code)
{
    mp_progress_done();
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "memplan: error: writing output failed: %s\n", strerror(errno ? errno : EIO));
        return MP_EXIT_INTERNAL;
    }
    return code;
}

static struct mp_job job_of(struct setup *s, struct args *a)
{
    struct mp_job j = {.model = &s->model, .build = s->build, .train = s->train, .ckpt = a->ckpt, .gpu = s->gpu,
                       .margin = a->margin, .slots = a->slots, .activation_budget = a->budget};
    return j;
}

/* The one stderr line of a configuration that does not fit its target (exit 1). */
static void say_nofit(const struct mp_fit *f)
{
    char a1[32], a2[32], a3[32]; /* units as the report prints them; --json has the exact bytes */
    char ev[4 * sizeof f->est.peak_event]; /* the event's name from the model, escaped */
    mp_progress_done();
    fprintf(stderr, "memplan: does not fit: short by %s (peak %s of %s usable) at %s\n",
            mp_fmt_bytes(f->peak_device_bytes - f->usable_bytes, a1, sizeof a1),
            mp_fmt_bytes(f->peak_device_bytes, a2, sizeof a2), mp_fmt_bytes(f->usable_bytes, a3, sizeof a3),
            mp_text_clean(f->est.peak_event, ev, sizeof ev));
}

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
static int check_out_file(const char *opt, const char *what, const char *path, const char *input)
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
static int write_timeline(const struct args *a, const char *cmd, const struct setup *s, const struct mp_program *prog,
                          const struct mp_schedule *sched, uint64_t context, bool target, const uint64_t *measured,
                          size_t n_measured)
{
    if (!a->timeline)
        return 0;
    char title[256], sub[512], ck[48]; /* sub: every part is bounded, the GPU name comes last */
    snprintf(title, sizeof title, "%s: %s", s->model.name, cmd);
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
    struct mp_timeline_opts o = {.title = title, .subtitle = sub, .context_bytes = context,
                                 .capacity_bytes = target ? s->gpu.memory_bytes : 0, .margin = a->margin,
                                 .measured = measured, .n_measured = n_measured};
    struct mp_diag d = {{0}};
    enum mp_status st = mp_timeline_svg(of.f, prog, sched, &s->train, &o, &d);
    int err = out_finish(&of, a->timeline, st == MP_OK || st == MP_ERR_IO); /* IO: out_finish says why */
    if (st != MP_OK && st != MP_ERR_IO)
        return fail(st, &d);
    return err || st != MP_OK ? out_failed("the timeline", a->timeline, err ? err : EIO) : 0;
}

/* ---- commands -------------------------------------------------------------------------------- */

/* The end of every command, after its one cleanup: a library failure (st), else an exit
 * status whose message is already printed (rc), else the command's own status (code) once
 * stdout is written.  A size that overflows 64 bits is the model's (at this batch): a message
 * that does not name the model file (the checkpoint simulator's) is given its name. */
static int leave(enum mp_status st, struct mp_diag *d, int rc, int code, const char *model)
{
    size_t n = strlen(model);
    if (st == MP_ERR_RANGE && !(strncmp(d->msg, model, n) == 0 && d->msg[n] == ':')) {
        char msg[sizeof d->msg];
        snprintf(msg, sizeof msg, "%s", d->msg[0] ? d->msg : mp_status_str(st));
        mp_fail(d, st, "%s: %s", model, msg);
    }
    if (st != MP_OK)
        return fail(st, d);
    if (rc)
        return rc;
    return finish(code);
}

/* estimate and check: a long model is evaluated through folds (fold.h), as plan and suggest do,
 * where the whole model's replay took seconds and gigabytes for 100,000 blocks (same figures);
 * a timeline draws the whole program's events, so it still replays the whole model. */
static void fit_program_for_report(const struct args *a, const struct setup *s, struct mp_job *j)
{
    bool folds = s->model.n_blocks >= MP_FIT_FOLD_BLOCKS && !a->timeline;
    j->keep_program = !folds;
    j->keep_built = folds;
}

/* The program the report reads (counts, options): the fit's whole program where it built one,
 * else that of the model's fold (mp_fold_report_program), into f->prog. */
static enum mp_status fit_report_program(const struct mp_job *j, struct mp_fit *f, struct mp_diag *d)
{
    if (j->keep_program || f->prog.blocks)
        return MP_OK;
    struct mp_build_opts bo;
    mp_fit_build_opts(j, &bo);
    return mp_fold_report_program(j->model, &bo, &f->prog, d);
}

static int cmd_estimate(struct args *a)
{
    struct mp_diag d = {{0}};
    struct setup s;
    int rc = setup(a, &s, false, &d);
    if (rc)
        return rc;
    struct mp_fit f;
    memset(&f, 0, sizeof f);
    enum mp_status st = MP_OK;
    if (!a->gpu) {
        s.gpu.context_bytes = a->context_set ? a->context : 500u << 20;
        if (!a->context_set)
            add_default(&s, "CUDA context %s (typical; probe measures it)", "500 MiB");
    }
    struct mp_job j = job_of(&s, a);
    fit_program_for_report(a, &s, &j);
    bool budgeted = a->ckpt.strategy == MP_CKPT_OPTIMAL || a->ckpt.strategy == MP_CKPT_OPTIMAL_SEGMENTS;
    if (budgeted && !a->gpu) {
        rc = usage_error("estimate", "%s", "--checkpoint optimal needs a target: add --gpu NAME (or use 'memplan plan')");
        goto out;
    }
    double t0 = mp_now_ms();
    if ((st = mp_fit_eval(&j, &f, &d)) != MP_OK || (st = fit_report_program(&j, &f, &d)) != MP_OK)
        goto out;
    if (f.infeasible)
        fprintf(stderr, "memplan: warning: no %s plan fits the target's activation budget; showing every "
                        "block checkpointed (every:1)\n",
                a->ckpt.strategy == MP_CKPT_OPTIMAL ? "optimal" : "optimal-segments");
    struct mp_report_ctx c;
    fill_ctx(&c, "estimate", &s, &f.prog, &a->ckpt, a);
    c.gpu = a->gpu ? &s.gpu : NULL;
    c.fit = a->gpu ? &f : NULL;
    s.build.seq = f.prog.opts.seq;
    /* the picture before the report: a failed write (exit 5) prints no report */
    if ((rc = write_timeline(a, "estimate", &s, &f.prog, f.plan.sched.n ? &f.plan.sched : NULL,
                             f.est.overhead_bytes, a->gpu != NULL, NULL, 0)) != 0)
        goto out;
    mp_report_estimate(stdout, &c, &f.est, &f.plan);
    if (getenv("MEMPLAN_TIMING"))
        fprintf(stderr, "memplan: estimate took %.2f ms\n", mp_now_ms() - t0);
out: /* the one way out: everything released, then the status */
    mp_fit_release(&f);
    mp_model_release(&s.model);
    return leave(st, &d, rc, MP_EXIT_OK, a->model);
}

/* plan's one stderr line (and JSON report) when no optimal plan can be made: the static bytes
 * leave nothing for activations, or not even every block checkpointed fits the budget. */
static void say_noplan(struct args *a, struct setup *s, const struct mp_fit *f)
{
    char a1[32], a2[32], why[256];
    if (f->activation_budget == 0)
        snprintf(why, sizeof why, "weights, grads, optimizer and overheads alone take %s of %s usable",
                 mp_fmt_bytes(f->static_bytes, a1, sizeof a1), mp_fmt_bytes(f->usable_bytes, a2, sizeof a2));
    else
        snprintf(why, sizeof why, "no plan fits the activation budget %s: every block checkpointed needs %s",
                 mp_fmt_bytes(f->activation_budget, a1, sizeof a1), mp_fmt_bytes(f->plan.peak_bytes, a2, sizeof a2));
    fprintf(stderr, "memplan: does not fit: %s\n", why);
    if (a->json) {
        struct mp_report_ctx c;
        fill_ctx(&c, "plan", s, NULL, &a->ckpt, a);
        mp_report_plan_none(stdout, &c, f, why);
    }
}

static int cmd_plan(struct args *a)
{
    if (!a->budget && !a->gpu && !a->vram)
        return usage_error("plan", "%s", "plan needs --activation-budget, --vram or --gpu");
    struct mp_diag d = {{0}};
    struct setup s;
    int rc = setup(a, &s, false, &d);
    if (rc)
        return rc;
    if (!a->gpu && !a->vram)
        mp_gpu_from_vram(UINT64_MAX / 4, &s.gpu); /* an explicit budget: no device limit */
    struct mp_job j = job_of(&s, a);
    /* a long model is evaluated through folds (fold.h), and the report reads the counts of its
     * fold's program; a timeline replays the whole program */
    bool folds = s.model.n_blocks >= MP_FIT_FOLD_BLOCKS && !a->timeline;
    j.keep_program = !folds;
    struct mp_fit f;
    struct mp_program rprog;
    memset(&rprog, 0, sizeof rprog);
    int code = MP_EXIT_OK;
    enum mp_status st = mp_fit_eval(&j, &f, &d); /* f is empty, or released, when it fails */
    if (st != MP_OK)
        goto out;
    struct mp_build_opts rbo;
    mp_fit_build_opts(&j, &rbo);
    if (folds && (st = mp_fold_report_program(&s.model, &rbo, &rprog, &d)) != MP_OK)
        goto out;
    bool budgeted = a->ckpt.strategy == MP_CKPT_OPTIMAL || a->ckpt.strategy == MP_CKPT_OPTIMAL_SEGMENTS;
    if (budgeted && (f.activation_budget == 0 || f.infeasible)) {
        say_noplan(a, &s, &f);
        code = MP_EXIT_NOFIT;
        goto out;
    }
    struct mp_plan_cmp cmp = {0};
    if (budgeted && f.plan.sched.n)
        mp_ckpt_compare(&f.chain, f.plan.peak_bytes, a->slots, &cmp);
    struct mp_report_ctx c;
    fill_ctx(&c, "plan", &s, folds ? &rprog : &f.prog, &a->ckpt, a);
    if (!a->gpu && !a->vram)
        c.gpu = NULL;
    /* the picture before the report: a failed write (exit 5) prints no report */
    if ((rc = write_timeline(a, "plan", &s, &f.prog, f.plan.sched.n ? &f.plan.sched : NULL, f.est.overhead_bytes,
                             a->gpu || a->vram, NULL, 0)) != 0)
        goto out;
    mp_report_plan(stdout, &c, &f, &cmp);
    bool fits = f.fits || (!a->gpu && !a->vram);
    if (!fits)
        say_nofit(&f);
    code = fits ? MP_EXIT_OK : MP_EXIT_NOFIT;
out: /* the one way out: everything released, then the status */
    mp_program_release(&rprog);
    mp_fit_release(&f);
    mp_model_release(&s.model);
    return leave(st, &d, rc, code, a->model);
}

static int cmd_check(struct args *a)
{
    if (!a->batch_set)
        return usage_error("check", "%s", "check: --batch B is required");
    if (!a->gpu && !a->vram)
        return usage_error("check", "%s", "check: give the target with --gpu NAME or --vram SIZE");
    struct mp_diag d = {{0}};
    struct setup s;
    int rc = setup(a, &s, false, &d);
    if (rc)
        return rc;
    struct mp_fit f;
    memset(&f, 0, sizeof f);
    struct mp_job j = job_of(&s, a);
    fit_program_for_report(a, &s, &j);
    int code = MP_EXIT_OK;
    enum mp_status st = mp_fit_eval(&j, &f, &d);
    if (st == MP_OK)
        st = fit_report_program(&j, &f, &d);
    if (st != MP_OK)
        goto out;
    struct mp_report_ctx c;
    fill_ctx(&c, "check", &s, &f.prog, &a->ckpt, a);
    /* the picture before the report: a failed write (exit 5) prints no report */
    if ((rc = write_timeline(a, "check", &s, &f.prog, f.plan.sched.n ? &f.plan.sched : NULL, f.est.overhead_bytes,
                             true, NULL, 0)) != 0)
        goto out;
    mp_report_check(stdout, &c, &f);
    if (!f.fits)
        say_nofit(&f);
    code = f.fits ? MP_EXIT_OK : MP_EXIT_NOFIT;
out: /* the one way out: everything released, then the status */
    mp_fit_release(&f);
    mp_model_release(&s.model);
    return leave(st, &d, rc, code, a->model);
}

static int cmd_suggest(struct args *a)
{
    struct mp_diag d = {{0}};
    struct setup s;
    int rc = setup(a, &s, true, &d);
    if (rc)
        return rc;
    struct mp_job j = job_of(&s, a);
    struct mp_suggest_opts o = {.precision_fixed = a->precision_set, .precision = (enum mp_precision)a->precision,
                                .global_batch = a->global_batch, .max_batch = a->max_batch,
                                .probe = !a->no_probe && (!strcmp(a->backend, "host") || !strcmp(a->backend, "cuda") ||
                                                          mp_cuda_device_available()),
                                .probe_backend = !strcmp(a->backend, "host") ? "host" : "cuda",
                                .probe_capacity_bytes = a->capacity, .target_is_device = s.target_is_device,
                                .device = a->device,
                                .progress = isatty(2) && !a->json, .trainer_plans_only = a->emit == MP_EMIT_HF};
    if (a->gpus_set || a->par_set) { /* data parallel: strategy given, or searched at --gpus x --nodes */
        o.par_search = !a->par_set;
        j.train.par = &s.par;
        o.probe = false; /* the probe runs one rank's step on one GPU: not part of suggest yet */
    }
    struct mp_suggestion sg;
    struct mp_program prog;
    memset(&sg, 0, sizeof sg);
    memset(&prog, 0, sizeof prog);
    int code = MP_EXIT_OK;
    enum mp_status st = MP_OK;
    if (o.probe && !strcmp(o.probe_backend, "host") &&
        (st = mp_suggest_host_admit(&j, &o, mp_host_ram_bytes(), &d)) != MP_OK)
        goto out;
    if ((st = mp_suggest(&j, &o, argv0, &sg, &d)) != MP_OK)
        goto out;
    /* the report reads the program's counts: a long model's through its fold (fold.h) */
    if ((st = s.model.n_blocks >= MP_FIT_FOLD_BLOCKS ? mp_fold_report_program(&s.model, &s.build, &prog, &d)
                                                     : mp_program_build(&s.model, &s.build, &prog, &d)) != MP_OK)
        goto out;
    struct mp_report_ctx c;
    fill_ctx(&c, "suggest", &s, &prog, NULL, a);
    c.build = NULL; /* suggest searches batch and precision: no single config line */
    mp_report_suggest(stdout, &c, &sg, a->emit);
    code = sg.best >= 0 ? MP_EXIT_OK : MP_EXIT_NOFIT;
    if (sg.best >= 0 && o.global_batch && !sg.global_met)
        fprintf(stderr, "memplan: warning: global batch %llu cannot be met exactly\n",
                (unsigned long long)o.global_batch);
out: /* the one way out: everything released, then the status */
    mp_program_release(&prog);
    mp_suggestion_release(&sg);
    mp_model_release(&s.model);
    return leave(st, &d, rc, code, a->model);
}

static int cmd_probe(struct args *a)
{
    struct mp_diag d = {{0}};
    struct setup s;
    int rc = setup(a, &s, false, &d);
    if (rc)
        return rc;
    struct mp_program prog;
    struct mp_probe *p = NULL;
    struct mp_chain ch;
    struct mp_ckpt_plan plan;
    struct mp_estimate e;
    struct mp_probe_result r;
    memset(&prog, 0, sizeof prog);
    memset(&ch, 0, sizeof ch);
    mp_ckpt_plan_init(&plan);
    memset(&e, 0, sizeof e);
    memset(&r, 0, sizeof r);
    int code = MP_EXIT_OK;
    enum mp_status st = mp_program_build(&s.model, &s.build, &prog, &d);
    if (st != MP_OK)
        goto out;
    struct mp_probe_opts po;
    mp_probe_opts_default(&po);
    po.backend = a->backend;
    po.device = a->device;
    po.steps = (unsigned)a->steps;
    po.capacity_bytes = a->capacity;
    po.progress = isatty(2); /* stderr, on a terminal: a host step can take seconds */
    po.trace = a->timeline != NULL;
    bool autohost = !strcmp(a->backend, "auto") && !mp_cuda_device_available();
    if ((autohost || !strcmp(a->backend, "host")) &&
        (st = mp_probe_host_admit(&prog, &s.train, a->capacity, autohost, &d)) != MP_OK)
        goto out;
    if (autohost) {
        fprintf(stderr, "memplan: no usable GPU: probing on the host backend (CPU)\n");
        po.backend = "host";
    }
    if (a->ckpt.strategy == MP_CKPT_OPTIMAL || a->ckpt.strategy == MP_CKPT_OPTIMAL_SEGMENTS) {
        rc = usage_error("probe", "%s", "probe takes a fixed plan (none, sqrt, segments:K, every:K, layers); "
                                        "use 'memplan plan' to find an optimal one");
        goto out;
    }
    if ((st = mp_probe_open(&p, &po, &d)) != MP_OK || (st = mp_estimate_chain(&prog, &ch, &d)) != MP_OK ||
        (st = mp_ckpt_plan_make(&ch, &a->ckpt, 0, a->slots, &plan, &d)) != MP_OK ||
        (st = mp_estimate_run_chain(&prog, &plan.sched, &s.train, 0, &ch, &e, &d)) != MP_OK ||
        (st = mp_probe_run(p, &prog, &plan.sched, &s.train, &r, &d)) != MP_OK)
        goto out;
    struct mp_report_ctx c;
    fill_ctx(&c, "probe", &s, &prog, &a->ckpt, a);
    c.gpu = NULL;
    /* the picture before the report: a failed write (exit 5) prints no report */
    if ((rc = write_timeline(a, "probe", &s, &prog, &plan.sched, 0, false, r.trace, r.n_trace)) != 0)
        goto out;
    mp_report_probe(stdout, &c, &e, &r);
    code = r.fits ? MP_EXIT_OK : MP_EXIT_NOFIT;
out: /* the one way out: everything released, then the status */
    mp_probe_result_release(&r);
    mp_estimate_release(&e);
    mp_ckpt_plan_release(&plan);
    mp_chain_release(&ch);
    mp_probe_close(p);
    mp_program_release(&prog);
    mp_model_release(&s.model);
    return leave(st, &d, rc, code, a->model);
}

static int cmd_help(int argc, char **argv)
{
    if (argc < 3) {
        print_help(stdout);
        return finish(0);
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[2], COMMANDS[i].name)) {
            print_command_help(stdout, &COMMANDS[i]);
            return finish(0);
        }
    if (!strcmp(argv[2], "gpus")) {
        struct mp_gpu *g;
        size_t n;
        struct mp_diag d = {{0}};
        enum mp_status st = mp_gpu_list(argv0, &g, &n, &d);
        if (st != MP_OK)
            return fail(st, &d);
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
        return finish(0);
    }
    return usage_error(NULL, "help: no command '%s'", argv[2]);
}

int main(int argc, char **argv)
{
    argv0 = argv[0];
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
        return finish(0);
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
        printf("memplan %s\n", MEMPLAN_VERSION);
        return finish(0);
    }
    if (!strcmp(cmd, "help"))
        return cmd_help(argc, argv);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(cmd, COMMANDS[i].name))
            continue;
        struct args a;
        int rc = parse_args(&COMMANDS[i], argc - 1, argv + 1, &a);
        if (rc == -1)
            return finish(0);
        if (!rc && a.timeline) /* before the work, not after it */
            rc = check_out_file("--timeline", "the timeline", a.timeline, a.model);
        if (rc)
            return rc;
        return COMMANDS[i].run(&a);
    }
    return usage_error(NULL, cmd[0] == '-' ? "unknown option '%s'" : "unknown command '%s'", cmd);
}
