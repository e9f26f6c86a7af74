/* report.h — text and JSON output (schema 1: README "JSON output", memplan(1) JSON OUTPUT)
 * and trainer snippets.
 * Writes only to the FILE given (stdout in practice); computes nothing the
 * reader could not recompute from the results passed in.  cJSON stays inside.
 */
#ifndef MEMPLAN_REPORT_H
#define MEMPLAN_REPORT_H

#include "recipe/recipe.h"
#include <stdio.h>

#include "search/search.h"
#include "timeline.h"

struct mp_report_ctx {
    const char *command;
    const struct mp_model *model;
    const struct mp_program *prog;
    const struct mp_build_opts *build;
    const struct mp_finetune *ft;      /* what trains (set even when build is NULL, as in suggest) */
    const struct mp_train_opts *train;
    const struct mp_ckpt_spec *ckpt;
    const struct mp_gpu *gpu;   /* NULL when no target */
    const char *target_how;     /* "--gpu a100-80gb", "--vram 24GiB", "default profile a100-80gb", ... */
    bool json;
    bool all_layers;
    bool wide;                  /* --wide: the full block table, lines not fitted to 100 columns */
    double margin_pct;          /* check: the safety margin, in percent */
    uint64_t num_generations;   /* --trainer grpo: GRPOConfig's num_generations, steps_per_generation, beta */
    uint64_t steps_per_generation;
    double beta;
    bool disable_dropout;       /* TRL's disable_dropout as planned (trainers other than sft) */
    uint64_t num_iterations;    /* GRPOConfig's num_iterations, vllm_importance_sampling_correction, temperature */
    double temperature;
    double top_p;               /* GRPOConfig's top_p, top_k, min_p (< 0: None) */
    uint64_t top_k;
    double min_p;
    double rep_penalty;         /* GRPOConfig's repetition_penalty (1: none) */
    bool vllm_is_correction;
    bool ds3_gather;            /* GRPOConfig's ds3_gather_for_generation */
    const struct mp_fit *fit;   /* estimate with a target: the verdict (NULL = none) */
    const char *alloc_from;     /* where the allocator's settings came from ("--alloc-conf",
                                   "PYTORCH_CUDA_ALLOC_CONF"), "" or NULL: torch's defaults */
    bool defaults_note;         /* print which defaults were used */
    char defaults[512];         /* "seq 1024 (model), batch 1, precision amp-bf16, ..." (the cli's, whole) */
    const struct mp_recipe *recipe; /* --recipe: what it set (NULL: none) */
    const char *head;               /* --head's name (NULL: the config's head): the report says so */
    uint64_t num_labels;            /* --num-labels (0: the config's): the snippets pass it to from_pretrained */
    double moe_capacity;        /* --moe-capacity: the busiest expert's share over the uniform one (>= 1;
                                   0 means 1) */
};

void mp_report_estimate(FILE *out, const struct mp_report_ctx *c, const struct mp_estimate *e,
                        const struct mp_ckpt_plan *plan);

/* plan: the chosen plan, plus optional comparisons for optimal (mp_ckpt_compare); cmp may be NULL. */
void mp_report_plan(FILE *out, const struct mp_report_ctx *c, const struct mp_fit *f, const struct mp_plan_cmp *cmp);

void mp_report_plan_none(FILE *out, const struct mp_report_ctx *c, const struct mp_fit *f, const char *reason);

void mp_report_check(FILE *out, const struct mp_report_ctx *c, const struct mp_fit *f);

/* suggest --emit: X(id, name); NONE prints the whole report. */
#define MP_EMITS(X)                 \
    X(NONE, "none")                 \
    X(TORCH, "torch")               \
    X(HF, "hf")                     \
    X(DEEPSPEED, "deepspeed")       \
    X(ACCELERATE, "accelerate")
enum mp_emit {
#define MP_X(id, name) MP_EMIT_##id,
    MP_EMITS(MP_X)
#undef MP_X
};
int mp_emit_parse(const char *s);                              /* -1 if unknown */
const char *mp_emit_names(const char *sep, const char *last); /* all but "none" */
const char *mp_emit_str(enum mp_emit e);
void mp_report_suggest(FILE *out, const struct mp_report_ctx *c, const struct mp_suggestion *s, enum mp_emit emit);

void mp_report_probe(FILE *out, const struct mp_report_ctx *c, const struct mp_estimate *e,
                     const struct mp_probe_result *r);

/* Text output fits this many columns unless --wide. */
#define MP_TEXT_COLUMNS 100

/* Writes text (len bytes) with trailing blanks removed and every line longer than
 * width wrapped at spaces, continuation lines indented where the line's value starts. */
void mp_report_fit_text(FILE *out, const char *text, size_t len, size_t width);

/* "0,3,6" / "[[0,4),[4,8)]" helpers used by text output */
void mp_report_plan_blocks(FILE *out, const struct mp_ckpt_plan *p);

#endif
