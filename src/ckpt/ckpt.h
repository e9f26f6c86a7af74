/* ckpt.h — checkpoint placement on a chain of blocks: strategies, the rotor
 * dynamic program, the single-level segment DP, and the schedule simulator.
 *
 * Chain model and notation follow rotor (docs/checkpointing.md#chain-model):
 * blocks F_0..F_{L-1}, then the loss at index L.  Memory convention shared by
 * the DPs and the simulator: the budget covers the model input x_0, stored
 * activations and activation gradients (not weights/grads/optimizer state),
 * and the Loss op frees a plain x_L once it has produced y_L
 * (docs/checkpointing.md#loss-frees-xl).
 * Pure: no I/O.  Sizes in bytes (uint64_t), costs in FLOPs (double).
 */
#ifndef MEMPLAN_CKPT_H
#define MEMPLAN_CKPT_H

#include "util/util.h"

struct mp_chain {
    size_t L;       /* number of blocks */
    double *f;      /* [L]   forward cost of block i */
    double *b;      /* [L+1] backward cost of block i; b[L] = loss backward */
    uint64_t *x;    /* [L+1] x[i] = size of block i's input (x[0] = model input; x[L] = loss input) */
    uint64_t *xb;   /* [L+1] xb[i] = all block i-1 keeps for backward incl. its output x[i] (xb[i] >= x[i]); xb[0] = x[0] */
    uint64_t *ft;   /* [L]   transient extra memory during forward of block i */
    uint64_t *bt;   /* [L+1] transient extra memory during backward of block i; bt[L] = loss temporary */
    bool *repeated; /* [L]   block i is one of a repeated run (a decoder layer): what "layers" wraps */
    uint64_t *gc_before; /* [L] layers transformers counts before block i that have no block (struct
                            mp_block gc_before): "layers:N" counts them in its every N-th */
};

/* Allocates arrays for L blocks, all zero.  Release with mp_chain_release. */
enum mp_status mp_chain_init(struct mp_chain *c, size_t L);
void mp_chain_release(struct mp_chain *c);

enum mp_ckpt_strategy {
    MP_CKPT_NONE,
    MP_CKPT_SQRT,             /* checkpoint_sequential with ceil(sqrt(L)) segments */
    MP_CKPT_SEGMENTS,         /* checkpoint_sequential(blocks, K): last segment not checkpointed */
    MP_CKPT_EVERY,            /* wrap every run of K blocks, the last run included */
    MP_CKPT_LAYERS,           /* wrap each repeated block (decoder layer) alone, nothing else: what
                                 transformers' activation_checkpointing_enable() does; with k > 1
                                 only every k-th of them, the first included (its every_n_layers) */
    MP_CKPT_OPTIMAL,          /* rotor persistent DP under a budget (multi-level) */
    MP_CKPT_OPTIMAL_SEGMENTS, /* single-level segment DP under a budget */
};

struct mp_ckpt_spec {
    enum mp_ckpt_strategy strategy;
    uint64_t k; /* SEGMENTS / EVERY; LAYERS: every_n_layers (0 and 1: every layer) */
    bool offload; /* LAYERS only ("+offload"): the checkpointed layers' inputs wait in pinned host
                     memory (transformers' activation_checkpointing_enable(offload=True)) */
    enum mp_sac_policy sac; /* LAYERS only ("+sac[:NAME]"): the ops whose outputs the checkpointed
                               layers keep from their forward to their recompute (sets.h) */
};

/* "none", "sqrt", "segments:K", "every:K", "layers", "layers:N", "optimal", "optimal-segments";
 * "layers" and "layers:N" take a "+offload" suffix, or "+sac" / "+sac:NAME" (MP_SAC_POLICIES; one
 * whose row says why it is not modelled: MP_ERR_UNSUPPORTED). */
enum mp_status mp_ckpt_spec_parse(const char *s, struct mp_ckpt_spec *out);
/* A SAC policy's name ("trl"), and why it is not modelled (NULL when it is). */
const char *mp_sac_str(enum mp_sac_policy s);
const char *mp_sac_why(enum mp_sac_policy s);
/* Inverse of parse, e.g. "segments:4". */
const char *mp_ckpt_spec_str(const struct mp_ckpt_spec *s, char *buf, size_t len);

enum mp_sched_kind {
    MP_SCHED_FN,   /* forward without grad; produce x_{i+1}; delete x_i (or xb_i) */
    MP_SCHED_FC,   /* forward without grad; produce x_{i+1}; keep x_i (a checkpoint) */
    MP_SCHED_FE,   /* forward with grad; keep xb_{i+1} */
    MP_SCHED_LOSS, /* consumes x_L (or xb_L), produces y_L; frees a plain x_L */
    MP_SCHED_B,    /* needs y_{i+1}, xb_{i+1}; produces y_i; frees x_i (if present), y_{i+1}, xb_{i+1} */
};

struct mp_sched_op {
    enum mp_sched_kind kind;
    uint32_t index;
};

struct mp_schedule {
    size_t n, cap;
    struct mp_sched_op *ops;
    bool offload; /* each Fc's input x_i waits in pinned host memory until B_i's recompute
                     (mp_ckpt_spec.offload; the replay's offload_input) */
    enum mp_sac_policy sac; /* the ops each Fc keeps for B_i's recompute (mp_ckpt_spec.sac) */
    uint64_t sac_keep;      /* MP_SAC_AUTO: bit j keeps each checkpointed layer's j-th candidate op
                               (the estimator's replay_sac_candidates; set by the fit's planner) */
};

void mp_schedule_init(struct mp_schedule *s);
void mp_schedule_release(struct mp_schedule *s);
enum mp_status mp_schedule_push(struct mp_schedule *s, enum mp_sched_kind k, uint32_t index);
/* The same ops in the same order. */
bool mp_schedule_equal(const struct mp_schedule *a, const struct mp_schedule *b);

/* Replays a schedule on the chain (docs/checkpointing.md#simulator).  Sets *peak (bytes,
 * including x_0 and gradient buffers) and *cost (sum of op costs).  An unmet
 * requirement (an op whose inputs are not resident) returns MP_ERR_INTERNAL
 * with a message naming the op. */
enum mp_status mp_ckpt_simulate(const struct mp_chain *c, const struct mp_schedule *s, uint64_t *peak,
                                double *cost, struct mp_diag *d);

/* A plan: the schedule plus what a user needs to reproduce it. */
struct mp_ckpt_plan {
    struct mp_ckpt_spec spec;
    struct mp_schedule sched;
    size_t L;
    bool *checkpointed;   /* [L] true if block i is not stored with full history in the first forward */
    size_t n_segments;
    size_t (*segments)[2]; /* checkpointed single-level segments [start, end); empty for NONE */
    bool multilevel;      /* optimal plan recomputes some block more than once */
    uint64_t peak_bytes;  /* simulator peak of the chain model (bytes) */
    double total_cost;    /* simulator total cost */
    double recompute_cost;/* total_cost - sum f - sum b */
    size_t dp_group;      /* optimal on a long chain: the DP ran on groups of up to this many
                           * consecutive blocks, so checkpoints fall only between groups (0 or 1: exact) */
};

/* The budgeted DPs are exact up to this many blocks; on longer chains they run on about 64
 * groups of consecutive blocks (dp_group), and the plan is never worse than sqrt's. */
#define MP_CKPT_DP_MAX_BLOCKS 128

void mp_ckpt_plan_init(struct mp_ckpt_plan *p);
void mp_ckpt_plan_release(struct mp_ckpt_plan *p);

/* Builds the plan for spec on chain c.  budget_bytes is used by OPTIMAL and
 * OPTIMAL_SEGMENTS (ignored otherwise); slots is the discretisation limit
 * (0 = default 500).  Every plan is verified by mp_ckpt_simulate; for the
 * budgeted strategies the simulated peak is <= budget_bytes.
 * MP_ERR_INFEASIBLE when no plan fits the budget; MP_ERR_USAGE for a bad K. */
enum mp_status mp_ckpt_plan_make(const struct mp_chain *c, const struct mp_ckpt_spec *spec, uint64_t budget_bytes,
                                 size_t slots, struct mp_ckpt_plan *p, struct mp_diag *d);

/* What an optimal plan is compared with at the same memory: sqrt, and the
 * segments:K of least recompute whose peak is at most limit_bytes. */
struct mp_plan_cmp {
    bool have_sqrt, have_seg;
    uint64_t sqrt_peak, seg_peak;
    double sqrt_recompute, seg_recompute;
    uint64_t seg_k;
    bool seg_sampled;     /* a long chain: K was sampled, not tried at every value of 1..L */
};
/* Fills cmp for chain c (plans that fail are left out).  Chains of up to 1,000
 * blocks try every K; longer ones K = 1..32, then steps of about 6% (about 170
 * plans at 100,000 blocks), so the sweep stays about linear in L. */
void mp_ckpt_compare(const struct mp_chain *c, uint64_t limit_bytes, size_t slots, struct mp_plan_cmp *cmp);

/* The total cost (all forwards, backwards and b[L]) of the plan that
 * mp_ckpt_plan_make builds for OPTIMAL (rotor) or OPTIMAL_SEGMENTS at
 * budget_bytes and slots, as the DP table states it: HUGE_VAL when nothing
 * fits (MP_OK either way).  It equals that plan's simulated total_cost (up to
 * floating-point summation order), which makes it a check on the DP; for
 * tests and quick budget sweeps. */
enum mp_status mp_ckpt_dp_cost(const struct mp_chain *c, enum mp_ckpt_strategy strategy, uint64_t budget_bytes,
                               size_t slots, double *cost, struct mp_diag *d);

/* Schedule builders (exposed for tests and the estimator). */
enum mp_status mp_ckpt_schedule_none(size_t L, struct mp_schedule *s);
/* checkpoint_sequential(blocks, segments): first segments-1 segments of floor(L/segments) blocks
 * checkpointed; the rest run normally. */
enum mp_status mp_ckpt_schedule_sequential(size_t L, size_t segments, struct mp_schedule *s);
/* Single-level plan from segment boundaries and flags: seg_start[k] ascending from 0,
 * seg_ckpt[k] true if segment k is checkpointed. */
enum mp_status mp_ckpt_schedule_segments(size_t L, size_t n_seg, const size_t *seg_start, const bool *seg_ckpt,
                                         struct mp_schedule *s);

/* Revolve / Griewank references (docs/checkpointing.md#revolve), for tests. */
uint64_t mp_revolve_beta(uint64_t s, uint64_t t);
uint64_t mp_revolve_numforw(uint64_t steps, uint64_t snaps);

#endif
