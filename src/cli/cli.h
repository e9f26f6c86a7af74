/* cli.h — the command line's own header (src/cli only): the parsed options, the command
 * table's row, the setup every command shares, and the exits.
 *
 * main.c dispatches; options.c holds the option table and its parser; setup.c the model,
 * target and options every command starts from; out_file.c --timeline's file; one
 * cmd_<name>.c per command.  Only src/cli prints diagnostics or exits.
 *
 * Exit: 0 success / fits; 1 completed, does not fit; 2 usage; 3 bad input;
 * 4 probe unavailable or device error; 5 internal error.
 */
#ifndef MEMPLAN_CLI_H
#define MEMPLAN_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt/ckpt.h"
#include "estimate/estimate.h"
#include "ir/layers.h"
#include "model/model.h"
#include "probe/probe.h"
#include "recipe/recipe.h"
#include "report/report.h"
#include "search/search.h"

/* What the options say (options.c fills it from the option table). */
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
    int attention;
    bool attention_set;
    unsigned torch;        /* --torch: major * 100 + minor (0: not given, memplan's 2.15) */
    int loss;              /* --loss (enum mp_loss) */
    struct mp_liger liger; /* a recipe's Liger switch (--loss liger from it), else unset */
    bool loss_set;
    int trainer;           /* --trainer (enum mp_trainer; default sft) */
    bool precompute_ref;   /* --precompute-ref (dpo: precompute_ref_log_probs) */
    int disable_dropout;   /* --disable-dropout (1 on, 0 off, -1: the trainer's default) */
    /* --trainer grpo (GRPOConfig): max_completion_length (--seq less it is the prompt),
     * num_generations, steps_per_generation (0: = --grad-accum), beta (> 0: a reference model),
     * vllm_gpu_memory_utilization of a colocated vLLM (0: transformers' generate) */
    uint64_t completion_len;
    bool completion_set;
    uint64_t num_generations, steps_per_gen;
    double beta, vllm;
    bool vllm_server;        /* --vllm server: vllm_mode "server", on other GPUs */
    uint64_t num_iterations; /* num_iterations (1) */
    double temperature;      /* temperature (1) */
    double top_p;            /* top_p (1) */
    uint64_t top_k;          /* top_k (0: none) */
    double min_p;            /* min_p (< 0: None) */
    double rep_penalty;      /* repetition_penalty (1: none) */
    int vllm_is_corr;        /* vllm_importance_sampling_correction (1: on) */
    bool vllm_is_corr_set;
    int ds3_gather;          /* ds3_gather_for_generation (1: on) */
    bool ds3_gather_set;
    bool grpo_set;         /* one of --num-generations, --steps-per-generation, --beta, --vllm given */
    double label_fraction; /* --label-fraction */
    bool packing;          /* --packing */
    bool padding_free;     /* --padding-free (and --tokens-per-batch) */
    uint64_t tokens_per_batch; /* --tokens-per-batch (0: not given) */
    bool seq_set;          /* --seq given */
    bool ckpt_set;      /* --checkpoint given (suggest: only that plan is searched) */
    bool act_offload;   /* --act-offload: TRL's activation_offloading=True */
    int use_cache; /* -1: the config's; 0 off; 1 on */
    int head;            /* --head (enum mp_head); -1: the config's architectures[0] */
    uint64_t num_labels; /* --num-labels; 0: the config's */
    uint64_t images;     /* --images: images per sample (multimodal checkpoints; 0: text only) */
    uint64_t image_h, image_w; /* --image-size HxW in pixels (0: the model's default) */
    const char *gpu;
    uint64_t vram;
    int device;
    bool device_set;
    uint64_t budget;
    uint64_t slots;
    double margin;
    uint64_t global_batch;
    enum mp_emit emit;
    uint64_t steps;
    const char *backend;
    bool no_probe;
    uint64_t workspace;
    bool workspace_set;
    uint64_t context;
    bool context_set;
    struct mp_alloc_conf alloc; /* --alloc-conf (else PYTORCH_CUDA_ALLOC_CONF, read by cli_setup) */
    bool alloc_set;
    uint64_t max_batch;
    uint64_t capacity;
    uint64_t grad_accum;
    const char *timeline;
    bool json, all_layers, wide;
    struct mp_parallel par;
    bool par_set, gpus_set;
    struct mp_finetune ft;
    bool alpha_set, lora_set, blocks_set, quant_storage_set; /* lora_set: --lora-r, --lora-dropout or --lora-targets */
    const char *recipe;    /* --recipe FILE */
    int recipe_format;     /* --recipe-format (-1: detected from the keys) */
    bool explain;          /* --explain: how the recipe's keys were read, on stderr */
    const char *write_recipe; /* suggest --write-recipe OUT: the recipe with the plan's batch */
    struct mp_recipe *rec; /* the recipe read (NULL: none) */
    bool use_cache_recipe; /* use_cache came from the recipe: moot for a model without a k/v cache */
};

/* Which commands accept which options (bit per command). */
enum { C_EST = 1, C_PLAN = 2, C_PROBE = 4, C_SUGG = 8, C_CHECK = 16, C_ALL = 31 };

struct command {
    const char *name;
    unsigned bit;
    int (*run)(struct args *a);
    const char *summary;
    const char *notes; /* printed after the option table of its help */
};

int cmd_estimate(struct args *a);
int cmd_plan(struct args *a);
int cmd_probe(struct args *a);
int cmd_suggest(struct args *a);
int cmd_check(struct args *a);

/* options.c: 0 parsed, -1 --help printed (exit 0), else the exit status (message printed). */
int cli_parse_args(const struct command *c, int argc, char **argv, struct args *a);
void cli_command_help(FILE *out, const struct command *c);

/* ---- exits (setup.c) ---- */
extern const char *cli_argv0; /* argv[0], where GPU profiles and the probe binary are looked up */
int cli_fail(enum mp_status st, const struct mp_diag *d);
/* MODEL as given (a file, a model directory with config.json, or a Hub id ORG/NAME in the local
 * Hugging Face cache) to the file to read, into out (model_path.c).  0, or the exit status with
 * its message printed. */
int cli_resolve_model(const char *arg, char *out, size_t cap);
/* model.safetensors.index.json beside the config: its total_size against s's model's parameter bytes
 * in the checkpoint's dtype; a mismatch is a warning (setup.c). */
void cli_check_checkpoint_index(const char *config, const struct mp_model *m);
/* One line: "memplan: error: <problem> (see 'memplan CMD --help')", exit 2. */
int cli_usage_error(const char *cmd, const char *fmt, const char *arg);
int cli_finish(int code);
int cli_leave(enum mp_status st, struct mp_diag *d, int rc, int code, const char *model);

/* ---- shared setup (setup.c) ---- */
struct setup {
    struct mp_model model;
    struct mp_build_opts build;
    struct mp_train_opts train;
    struct mp_parallel par;       /* train.par points here */
    struct mp_alloc_conf alloc;   /* the caching allocator's settings; train.alloc points here */
    char alloc_from[32];          /* where they came from: "--alloc-conf", an environment variable, "" */
    struct mp_nccl_env nccl;      /* NCCL's NCCL_* variables; train.nccl points here */
    struct mp_gpu gpu;
    bool have_gpu;
    bool target_is_device; /* the target is the local GPU (probes of it answer for it) */
    char how[96];
    char defaults[512];
    uint64_t batch_unit; /* the micro-batch must be a multiple of this (GRPO's prompt groups; 0: any) */
};

int cli_setup(struct args *a, struct setup *s, bool need_target, struct mp_diag *d);
void cli_add_default(struct setup *s, const char *fmt, const char *v);
/* A warning about the input ("memplan: warning: ..."), printed to stderr once the command has
 * answered (exit 0 or 1) and dropped when it fails: an error stays one line. */
void cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cli_flush_warnings(int exit_status); /* returns exit_status */
void cli_fill_ctx(struct mp_report_ctx *c, const char *cmd, struct setup *s, const struct mp_program *prog,
                  const struct mp_ckpt_spec *ck, struct args *a);
struct mp_job cli_job_of(struct setup *s, struct args *a);
void cli_say_nofit(const struct mp_fit *f);
void cli_fit_program_for_report(const struct args *a, const struct setup *s, struct mp_job *j);
enum mp_status cli_fit_report_program(const struct mp_job *j, struct mp_fit *f, struct mp_diag *d);

/* ---- output files (out_file.c) ---- */
int cli_check_out_file(const char *opt, const char *what, const char *path, const char *input);
int cli_write_timeline(const struct args *a, const char *cmd, const struct setup *s, const struct mp_program *prog,
                       const struct mp_schedule *sched, uint64_t context, bool target, const uint64_t *measured,
                       size_t n_measured);

#endif
