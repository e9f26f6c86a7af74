/* replay.h — what the step replay and the estimator share inside src/estimate/ (internal: not
 * included outside src/estimate/; estimate.h is the public header).
 *
 * The step replay (alloc/free/compute events) and the estimator.
 *
 * Liveness follows autograd: a tensor lives while a later forward node still
 * reads it, while a node that saved it has not run backward, or while the
 * chain holds it (a block's output until the next block consumes it; a
 * checkpointed block input until that block's backward, as in rotor's model).
 * Gradients of activations appear when their consumer's backward runs and die
 * after their producer's backward (a residual add's inputs share its output's
 * gradient storage, as AddBackward0 returns it); parameter gradients live until
 * zero_grad.
 * The estimator's visitor sums 512-byte-rounded sizes (max_memory_allocated)
 * and feeds a model of PyTorch's caching allocator for reserved bytes.
 */
#ifndef MEMPLAN_ESTIMATE_REPLAY_H
#define MEMPLAN_ESTIMATE_REPLAY_H

#include "estimate.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- replay ------------------------------------------------------------------------------- */

struct rp {
    const struct mp_program *p;
    const struct mp_train_opts *t;
    mp_event_fn fn;
    void *ctx;
    struct mp_diag *d;
    enum mp_status st;
    enum mp_phase phase;
    int node;
    bool *live, *pglive, *is_input;
    int *uses, *saved, *holds;
    int *grad_of; /* per tensor: the GRAD storage holding its gradient, -1 none (mp_event.grad_of) */
    int *grefs;   /* per GRAD storage: how many tensors' gradients it holds */
    bool *ckpt; /* per block: its input is held as a checkpoint (Fc) until its backward */
    bool offload; /* the schedule's Fc inputs wait in pinned host memory (offload_input) */
    enum mp_sac_policy sac; /* the ops whose outputs each Fc keeps for its recompute (sac_hold) */
    uint64_t sac_keep;      /* MP_SAC_AUTO: the candidates kept (mp_schedule.sac_keep) */
    bool *recomp; /* per block: recorded by a recompute (after the loss) for its backward */
    size_t bwd_next; /* SIZE_MAX, or the node the next block backward starts below: an early
                        recompute ran the backward of the nodes from there on (fwd_block) */
    bool *cached; /* per tensor: an autocast weight copy held by autocast's cache until the loss */
    int shared_block[2]; /* per model-made tensor (rope_tables, attn_mask): the block whose first
                            forward made it (held until its backward), -1 */
    bool held_on[MP_HELD_MAX]; /* p->held[j] is held (made by the forward, not yet released) */
    int ref_embeds; /* DPO's reference forward: the token embedding held by the model's Python
                       (fwd_block), -1 none */
    struct rp_aoff *ao; /* --act-offload (replay.c aoff_pack), else NULL */
    /* data parallel (NULL pp: one GPU) */
    const struct mp_par_plan *pp;
    bool *uns, *ag_pending, *rs_out; /* per group: unsharded, all-gather issued (prefetch), grads reduced */
    size_t *borrow_list, n_borrow; /* ZeRO-3: groups gathered for a block that uses one of their
                                    * parameters (tied), released after it */
    int ag_held;    /* FSDP2 forward: the all-gather output kept until the next group's copy-out */
    int bwd_defer;  /* FSDP2 backward: a unit whose pre-backward waits for its last module (the
                     * tail's lm_head after the loss's backward), or -1 */
    size_t bwd_defer_blk;
    int *first_use; /* DDP gradient_as_bucket_view: per param, the first node using it (its last backward) */
    int rs_pending; /* FSDP2: the reduce-scatter input kept until the next group's reduce */
};

/* ---- the estimator's visitor --------------------------------------------------------------- */

/* A growing array of byte counts (mp_reserved_series). */
struct mp_series {
    uint64_t *v;
    size_t n, cap;
    bool nomem;
};

struct counter {
    const struct mp_program *p;
    uint64_t cur, cur_req, peak, peak_req;
    enum mp_phase peak_phase;
    int peak_node;
    enum mp_store peak_store;
    int peak_id;
    uint64_t act_at_loss;
    uint64_t before_loss; /* allocated as the loss's gradient is seeded: the forward's end, where
                             DPO's reference forward runs */
    bool have_loss;
    uint64_t fwd_start;   /* allocated before the forward's first event: the resident state the step starts
                             from (GRPO's reference forward runs on it, its adapters included) */
    bool have_fwd;
    uint64_t setup_grads; /* of it, the gradients the setup made resident (accumulation) */
    uint64_t act_cur; /* ACT + GRAD + TMP */
    struct mp_asim as;  /* the caching allocator (alloc_sim.c) */
    size_t *blk_of;   /* allocation key -> asim block */
    size_t nkeys;
    bool warm;        /* second step: persistent storages keep their blocks */
    bool no_asim;     /* program too large for the allocator model: reserved = allocated */
    bool overflow;    /* the bytes left 64 bits (MP_ERR_RANGE) */
    struct fold_meter *fm; /* a fold's short program (fold_event), else NULL */
    uint64_t *lazy_state; /* warm-up step: optimizer state bytes per parameter, still to be made
                             at the first optimizer.step event (lazy_opt_state), else NULL */
    int state_parts;  /* tensors per parameter of that state (exp_avg, exp_avg_sq: 2) */
    uint64_t ws_each;       /* one handle's cuBLAS workspace (--workspace): the step's storage holds
                               MP_CUBLAS_HANDLES of them, each its own request to the allocator */
    bool bwd_workspace;     /* warm-up step: the backward thread's cuBLAS workspace (ws_each), still to be
                               made at its first GEMM (backward_workspace) */
    int *tmp_more;    /* node -> its transient's further parts' asim blocks (+1; 0 none), MP_NODE_TMP_MAX - 1 each */
    FILE *trace;      /* MEMPLAN_ALLOC_TRACE: the allocator model's requests, else NULL */
    struct mp_series *series; /* mp_reserved_series: reserved after each event of the second step */
    int trace_phase;  /* the phase last marked in it */
};

/* ---- a fold's short program counted as the full model (fold.h) -------------------------------
 * A step of the blocks' schedule (forwards or backwards in a row on one unit) on a weighted unit
 * runs weight times in a row on its copies: each run starts where the one before ended, so the
 * step's peak is its first or last run's (as the step frees or adds memory), and it adds weight
 * times what one run adds.  Outside the blocks' ops (setup, loss, optimizer step, the end) a parameter, tensor or
 * node of a weighted block stands for that many.  Each op's events are hashed: the ops of an
 * interval's two interior blocks must agree. */
/* One level's step in progress (fold.h: level 0 the ops in a row on a unit, level 1 on a
 * super-unit, whose steps hold whole steps of level 0). */
struct fold_step {
    bool on;                 /* a step of this level is open */
    uint64_t w;              /* the copies it runs on */
    size_t op;               /* its first op */
    uint64_t b_cur, b_req, b_act; /* at its start */
    bool l_has;              /* a weighted step allocated: its highest point above b_cur, and where */
    int64_t l_max, l_req;
    enum mp_phase l_phase;
    int l_node, l_id;
    enum mp_store l_store;
    uint64_t l_shift;        /* that point's copy: this many full blocks above its short block's */
    bool desc;               /* the step's runs go down the units */
    uint64_t h;              /* its events, hashed (fold_hash) */
};

struct fold_meter {
    const struct mp_fold *f;
    bool per_param_opt;      /* the optimizer's step temporaries are one per parameter */
    bool in_blocks;          /* in a forward or backward op: counted once or by the op's weight */
    int levels;              /* mp_fold_levels */
    struct fold_step lv[2];
    uint64_t peak_shift;     /* the peak is in the copy this many full blocks above the short block's */
    uint64_t *sig[2];        /* per short op that starts a step of the level */
    bool overflow;
    const struct mp_par_plan *pp; /* data parallel: the weighted plan (its groups' weights) */
};

/* replay_grads.c */
void emit(struct rp *r, enum mp_ev_kind k, enum mp_store s, int id, uint64_t bytes);
uint64_t r_add(struct rp *r, uint64_t a, uint64_t b);
void emit_fwd(struct rp *r, int node, bool grad, int step);
void t_alloc(struct rp *r, int t);
void t_maybe_free(struct rp *r, int t);
bool g_wanted(const struct rp *r, int t);
bool g_has(const struct rp *r, int t);
void g_new(struct rp *r, int t);
void g_unref(struct rp *r, int s);
void g_alloc(struct rp *r, int t);
void g_free(struct rp *r, int t);
bool g_passes(const struct rp *r, const struct mp_node *n, int g);
void tmp(struct rp *r, int node, uint64_t bytes, bool alloc);
bool node_makes(const struct mp_node *n, int t);
bool fop_makes(const struct mp_program *p, const struct mp_node *n, int t);
void fwd_ops(struct rp *r, const struct mp_node *n, int k, bool grad);
bool node_reads(const struct mp_node *n, int t, int upto);
bool params_sharded(const struct rp *r);
bool node_packs(const struct mp_node *n);
void hold_made(struct rp *r, const struct mp_node *n);
void release_held(struct rp *r, int release_at);
void release_held_fwd(struct rp *r, size_t i);
bool held_leaf(const struct rp *r, int t);

/* replay_par.c */
void comm(struct rp *r, bool alloc, size_t slot, enum mp_comm_kind k, uint64_t bytes);
bool fsdp(const struct rp *r);
void par_pre_fwd(struct rp *r, size_t i);
void par_pre_node(struct rp *r, size_t k); /* FSDP2: a unit's first module, inside a block */
void par_pre_bwd_node(struct rp *r, size_t k); /* FSDP2: a unit's last module's backward */
void par_post_node(struct rp *r, size_t k); /* --ep: the experts unit resharded after its module */
void par_post_bwd_node(struct rp *r, size_t k); /* --ep: its post-backward, after the dispatch's */
void par_post_fwd(struct rp *r, size_t i);
void par_pre_bwd(struct rp *r, size_t i);
void par_post_bwd(struct rp *r, size_t i);
uint64_t par_param_bytes(const struct rp *r, size_t q);
void par_setup(struct rp *r);
bool par_opt_per_param(const struct rp *r);

/* replay.c */
/* --act-offload: what a step moves (mp_replay_act_offload). */
struct rp_aoff_out {
    uint64_t pinned; /* pinned host bytes: every offloaded pack, each rounded up to a power of two */
    uint64_t pcie;   /* bytes over PCIe: each pack copied to the host, each reload copied back */
};
/* Replays the step with no visitor and sums what --act-offload moves (zeros without it). */
enum mp_status replay_act_offload(const struct mp_program *p, const struct mp_schedule *sched,
                                  const struct mp_train_opts *t, struct rp_aoff_out *out, struct mp_diag *d);
/* Pinned host bytes of an offloaded schedule's checkpointed inputs (0 without offload); *copied:
 * their unrounded bytes.  UINT64_MAX on overflow. */
/* Does SAC policy pol keep node k's outputs from a checkpointed block's forward to its recompute
 * (docs/checkpointing.md#sac)?  keep: MP_SAC_AUTO's candidates kept (mp_sac_candidate). */
bool replay_sac_keeps(const struct mp_program *p, enum mp_sac_policy pol, uint64_t keep, size_t k);
/* The forward FLOPs the recompute of block i skips under s's SAC policy; e's SAC figures
 * (sac_layer_bytes, sac_layers) take block i's.  Called once per recompute. */
double replay_sac_recompute(const struct mp_program *p, const struct mp_schedule *s, size_t i, struct mp_estimate *e);
/* The forward FLOPs an early-stopped recompute of block i does not run (the recompute right before
 * B_i): its last packing node when it packs before it runs (an aten op's saved inputs) and every
 * node after it (docs/checkpointing.md#early-stop); 0 under torchtitan's early_stop=False. */
double replay_stop_skips(const struct mp_program *p, const struct mp_schedule *s, size_t i);
uint64_t replay_pinned_bytes(const struct mp_program *p, const struct mp_schedule *s, uint64_t *copied);
enum mp_status replay_plan(const struct mp_program *p, const struct mp_schedule *sched,
                           const struct mp_train_opts *t, const struct mp_par_plan *given, mp_event_fn fn,
                           void *ctx, struct mp_diag *d);


/* estimate.c */
bool round512(uint64_t bytes, uint64_t *r);
bool inputs_bytes(const struct mp_program *p, struct mp_estimate *e);
enum mp_status static_total(const struct mp_program *p, struct mp_estimate *e, struct mp_diag *d);
enum mp_status workspaces_into(const struct mp_program *p, const struct mp_train_opts *t, struct mp_estimate *e,
                               struct mp_diag *d);
enum mp_status peak_overflow(const struct mp_program *p, const struct mp_train_opts *t, struct mp_diag *d);
enum mp_status device_peak(const struct mp_program *p, uint64_t context_bytes, struct mp_estimate *e,
                           struct mp_diag *d);
void name_load_peak(struct mp_estimate *e);
void par_static(const struct mp_par_plan *pp, const struct mp_train_opts *t, struct mp_estimate *e);
void block_est(const struct mp_program *p, const struct mp_train_opts *t, size_t j, uint64_t activation,
               struct mp_block_est *b);

#endif
