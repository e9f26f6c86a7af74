/* search.h — does a configuration fit, the largest micro-batch per plan, and
 * the recommended configuration.
 *
 * mp_fit_eval() is the single judge used by `check`, `plan --vram` and
 * `suggest`: it builds the program, makes the checkpoint plan (for `optimal`
 * the activation budget is what the target leaves after static memory and
 * overheads), replays the step and compares peak device bytes with the usable
 * capacity (capacity x (1 - margin)).  So suggest and check agree exactly.
 */
#ifndef MEMPLAN_SEARCH_H
#define MEMPLAN_SEARCH_H

#include "ckpt/ckpt.h"
#include "estimate/estimate.h"
#include "gpu.h"
#include "nccl.h"
#include "probe/probe.h"

struct mp_job {
    const struct mp_model *model;
    struct mp_build_opts build;   /* batch, seq, precision, attention */
    struct mp_train_opts train;   /* optimizer, workspace */
    struct mp_ckpt_spec ckpt;
    struct mp_gpu gpu;            /* target */
    double margin;                /* safety margin, fraction of capacity (default 0.05) */
    size_t slots;                 /* DP discretisation (0 = 500) */
    uint64_t activation_budget;   /* plan: explicit budget for optimal strategies (0 = from the target) */
    bool keep_program;            /* the fit keeps the program it evaluated (mp_fit.prog) for a report */
    bool keep_built;              /* it keeps the whole program only where it built one (a fold did not
                                   * hold, or none was tried) and folds otherwise: mp_fit.prog is then
                                   * that program or empty */
    struct mp_program *scratch;   /* or NULL: a program whose memory the fit reuses (mp_program_rebuild);
                                   * searches pass one, the caller releases it */
    struct mp_program *fold_scratch; /* or NULL: two programs a fit's folds reuse (the no-checkpoint
                                   * fold's short program, a plan's); the caller releases them */
    bool verdict_only;            /* only fits and peak_device_bytes are wanted (the batch search): a
                                   * fixed plan's schedule is made without the chain's replay (the
                                   * chain's sizes and the per-block figures stay zero) */
    uint64_t batch_unit;          /* suggest: micro-batches are multiples of this (GRPO: whole prompt groups
                                   * in the generation batch); 0 or 1: any */
    int fold;                     /* 0: fold (fold.h) models of MP_FIT_FOLD_BLOCKS blocks or more when
                                   * no program is kept; 1: whenever the fold may hold (tests); -1:
                                   * never */
};

/* Models with at least this many blocks are evaluated through folds by default. */
#define MP_FIT_FOLD_BLOCKS 512

struct mp_fit {
    bool fits;                    /* the verdict: fits_allocated, and fits_device where the
                                   * allocator was simulated */
    bool fits_allocated;          /* peak allocated + context (+ NCCL) within the usable bytes */
    bool device_simulated;        /* the caching allocator ran: fits_device and device_bytes hold */
    bool fits_device;             /* no allocation failed after the allocator's retry */
    uint64_t device_bytes;        /* peak reserved + context (+ NCCL): what the device holds */
    uint64_t alloc_limit;         /* what the allocator could reserve: usable less context (+ NCCL) */
    bool expandable_fits;         /* fits_allocated, not fits_device, and it would with
                                   * expandable_segments:True (checked for a report, not a search) */
    uint64_t expandable_device_bytes; /* device_bytes with it */
    uint64_t usable_bytes;        /* capacity x (1 - margin) */
    uint64_t capacity_bytes;
    uint64_t peak_device_bytes;
    uint64_t activation_budget;   /* used by the optimal strategies */
    bool infeasible;              /* optimal: no plan fits the budget (plan = every block checkpointed) */
    uint64_t static_bytes;        /* weights + grads + optimizer state + workspace + context */
    struct mp_estimate est;       /* owns memory: mp_fit_release */
    struct mp_ckpt_plan plan;     /* chain-model plan */
    struct mp_chain chain;
    uint64_t nockpt_activation_peak; /* chain-model peak without checkpointing */
    double step_s;                /* estimated step time (FLOPs / (efficiency x dense peak)) */
    double comm_s, exposed_comm_s, offload_s; /* data parallel: collectives (all / not hidden by
                                               * compute) and offload transfers + host step */
    double samples_per_s;
    size_t folded_blocks;         /* blocks its replays did not run (counted through folds, fold.h) */
    struct mp_program prog;       /* with job->keep_program: the program evaluated (build options
                                   * job->build, input_grad set by the strategy); else empty */
};

void mp_fit_release(struct mp_fit *f);

/* Evaluates job at job->build.batch.  MP_ERR_INFEASIBLE is not returned: an
 * optimal plan that cannot fit gives fits = false (with the no-checkpoint peak). */
enum mp_status mp_fit_eval(const struct mp_job *job, struct mp_fit *f, struct mp_diag *d);

/* What f lacks to fit (0 when it fits): the larger of the allocated level's shortfall (peak
 * device bytes over usable) and, where the allocator was simulated and fails, the device level's
 * (peak reserved + context over usable).  check's shortfall_bytes and its stderr line. */
uint64_t mp_fit_shortfall(const struct mp_fit *f);

/* The build options mp_fit_eval lowers job's model with (its plan's: input gradients and
 * use_cache as transformers sets them for checkpointing). */
void mp_fit_build_opts(const struct mp_job *job, struct mp_build_opts *bo);

/* Largest micro-batch (<= max_batch) that fits; 0 if even 1 does not.
 * *evals counts estimator runs. */
enum mp_status mp_search_max_batch(const struct mp_job *job, uint64_t max_batch, uint64_t *best, unsigned *evals,
                                   struct mp_diag *d);

/* Matmul efficiency assumed by throughput estimates (fraction of dense peak). */
#define MP_MATMUL_EFFICIENCY 0.5
/* Host optimizer throughput per rank with offload (10^9 parameters updated per second):
 * DeepSpeed's CPU Adam on a shared multi-core host, an assumption (no host here to measure). */
#define MP_HOST_ADAM_GPARAMS 0.5

struct mp_candidate {
    struct mp_parallel par;       /* data parallel (strategy none: one GPU); the fit's job points here */
    enum mp_ft_mode ft;           /* what trains (suggest --finetune lora also weighs qlora) */
    enum mp_precision precision;
    struct mp_ckpt_spec ckpt;
    uint64_t micro_batch, grad_accum, global_batch;
    bool fits;
    uint64_t peak_device_bytes, capacity_bytes, usable_bytes;
    double headroom_pct;
    double samples_per_s;         /* estimated (ranking compares estimates only) */
    bool probed;                  /* micro_batch ran on the probe backend and fit */
    bool probe_oom;               /* probed: out of memory at every batch tried */
    double probe_samples_per_s;   /* measured by the probe (memplan's kernels, not PyTorch's): reported only */
    double probe_step_ms;
    uint64_t probe_peak_bytes;    /* the probe pool's measured peak at micro_batch */
    double recompute_pct;
    size_t n_ckpt_blocks;
    uint64_t search_bmax;         /* the largest micro-batch the search found to fit (0: none) */
    struct mp_fit fit;            /* the evaluation at micro_batch */
};

struct mp_suggest_opts {
    bool precision_fixed;
    enum mp_precision precision;
    uint64_t global_batch;        /* 0 = none */
    uint64_t max_batch;           /* search bound (default 65536) */
    bool probe;                   /* confirm the choice with probe runs */
    const char *probe_backend;    /* "cuda" (NULL) or "host" */
    int device;
    uint64_t probe_capacity_bytes;/* the probes' pool limit; 0 = the target's usable bytes less its context,
                                   * so a probe answers for the target, never for whatever the local GPU has */
    bool target_is_device;        /* the target is the probed device itself: its own out-of-memory counts */
    bool progress;                /* progress lines on stderr */
    bool trainer_plans_only;      /* --emit hf: only plans a Trainer runs (none, layers, layers:N) */
    bool lora_bf16_base;          /* LoRA on an HF config, one GPU: bf16-amp (bf16 base, fp32 adapters,
                                   * bf16 autocast: the peft recipe) is searched and preferred when it
                                   * fits (issue 25 item 2) */
    bool par_search;              /* --gpus without --parallel: try every strategy at that world */
    bool ckpt_fixed;              /* --checkpoint given: only that plan is searched */
    bool hints;                   /* when it fits: also search the loss heads and optimizers the
                                     user did not pick, and list those that do better */
    bool no_alternatives;         /* a nested search for one alternative (expandable segments): when
                                     nothing fits, no alternatives or world of its own */
    int hint_packing;             /* with hints, a recipe that pads its rows: 1 also list --packing
                                     (rows of packed documents), 2 --padding-free (TRL's packing) */
    struct mp_ckpt_spec ckpt;
};

/* The most candidates one search evaluates: 7 data-parallel layouts x 3 precisions x 7
 * checkpoint plans at most (search.c's space; it checks the product against this). */
#define MP_SUGGEST_MAX_CANDIDATES 160

struct mp_suggestion {
    size_t n;
    struct mp_candidate cand[MP_SUGGEST_MAX_CANDIDATES];
    int best;                     /* index, or -1 when nothing fits */
    bool global_met;              /* --global-batch met exactly */
    char note[256];               /* why the choice / what is unmet */
    /* when nothing fits: what would; when it fits (hints): variants that do better */
    char alternatives[8][224];
    size_t n_alternatives;
    unsigned probes;
    uint64_t probe_capacity_bytes;/* the pool limit the probes ran under (0: no probe) */
    char probe_note[160];         /* why the probes did not confirm, when they did not */
    double elapsed_ms;
    /* GRPO (mp_grpo_limits), at the recommended plan: the longest completion that still fits (the
     * prompt as planned; 0: not searched) and a colocated vLLM's largest share (0: none) */
    uint64_t grpo_max_completion;
    bool grpo_completion_capped;  /* every length up to MP_GRPO_MAX_COMPLETION fits: a lower bound */
    double grpo_max_vllm;
};

/* GRPO's limits at s's recommended plan (s->best >= 0): the longest max_completion_length that
 * still fits with the prompt as planned, each a fit at the plan's micro-batch, precision and
 * checkpoints (exponential, then bisection, up to MP_GRPO_MAX_COMPLETION); with a colocated vLLM,
 * its largest vllm_gpu_memory_utilization in hundredths that still fits.  MP_OK, or the fits'
 * error. */
#define MP_GRPO_MAX_COMPLETION 1048576
enum mp_status mp_grpo_limits(const struct mp_job *base, struct mp_suggestion *s, struct mp_diag *d);

/* suggest probing on the host backend: its pool really allocates, up to the probes' limit
 * (o->probe_capacity_bytes, else the target's usable bytes), so a limit over half of
 * ram_bytes (this machine's RAM, mp_host_ram_bytes) is refused: MP_ERR_DEVICE, reason in d. */
enum mp_status mp_suggest_host_admit(const struct mp_job *base, const struct mp_suggest_opts *o, uint64_t ram_bytes,
                                     struct mp_diag *d);
enum mp_status mp_suggest(const struct mp_job *base, const struct mp_suggest_opts *o, const char *argv0,
                          struct mp_suggestion *s, struct mp_diag *d);
void mp_suggestion_release(struct mp_suggestion *s);

#endif
