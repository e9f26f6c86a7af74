/* estimate.h — one steady-state training step as a stream of alloc/free events,
 * and the estimator that replays it.
 *
 * mp_replay() walks the tensor program through a block schedule (forward,
 * loss, backward with recomputation, optimizer step, zero_grad) and calls a
 * visitor for every allocation, free and compute event.  The estimator's
 * visitor counts bytes (512-byte rounding, plus a caching-allocator model for
 * reserved bytes); the probe's visitor allocates and computes for real.  Step
 * 2 onward: optimizer state exists at the start, gradients are set to None
 * after the step.  Pure: no I/O.
 */
#ifndef MEMPLAN_ESTIMATE_H
#define MEMPLAN_ESTIMATE_H

#include "ckpt/ckpt.h"
#include "fold.h"
#include "ir/layers.h"
#include "optim.h"
#include "parallel.h"

struct mp_nccl_env;

/* What a storage is. */
enum mp_store {
    MP_ST_PARAM,      /* id = param */
    MP_ST_OPT_STATE,  /* id = param */
    MP_ST_WORKSPACE,  /* cuBLAS workspace, id = 0 */
    MP_ST_INPUT,      /* id = tensor (input ids / images, labels) */
    MP_ST_ACT,        /* id = tensor */
    MP_ST_GRAD,       /* a gradient storage, id = the tensor it was made for (mp_event.grad_of) */
    MP_ST_PGRAD,      /* gradient of param id */
    MP_ST_TMP,        /* node transient, id = node */
    MP_ST_OPT_TMP,    /* optimizer-step temporary: id = param (Adam/AdamW foreach), 0 (Adafactor) */
    MP_ST_COMM,       /* data parallel: communication buffer, id = slot * MP_COMM_KINDS + kind (parallel.h) */
};

enum mp_ev_kind {
    MP_EV_ALLOC,
    MP_EV_FREE,
    MP_EV_FWD,        /* compute node forward (node), grad_mode says whether it records for backward */
    MP_EV_BWD,        /* compute node backward (node) */
    MP_EV_LOSS_GRAD,  /* seed the gradient of the loss / final output */
    MP_EV_OPT_STEP,   /* optimizer update of every parameter */
    MP_EV_OP_BEGIN,   /* schedule op number id begins (Fn/Fc/Fe/Loss/B) */
    MP_EV_OP_END,     /* schedule op number id ends */
    MP_EV_WGRAD_CAST, /* after linear node's backward under autocast: its half weight gradient (its TMP
                         part MP_TR_WGRAD_HALF) added into param id's fp32 gradient, just allocated
                         (ToCopyBackward0 of autocast's weight cast, then AccumulateGrad) */
};

enum mp_phase {
    MP_PH_SETUP, MP_PH_FORWARD, MP_PH_LOSS, MP_PH_RECOMPUTE, MP_PH_BACKWARD, MP_PH_STEP, MP_PH_END,
    MP_PH_GENERATE, /* GRPO's generation and its reference forward, before the step (no replay event has it) */
    MP_PH_LOAD      /* from_pretrained, before the first step: FSDP2 with a 4-bit base (load_bytes) */
};
const char *mp_phase_str(enum mp_phase ph);

struct mp_event {
    enum mp_ev_kind kind;
    enum mp_store store;
    int id;           /* tensor, param or node id per store / kind */
    int node;         /* node being processed, or -1 */
    uint64_t bytes;   /* unrounded request size for ALLOC/FREE */
    enum mp_phase phase;
    bool grad_mode;   /* FWD: with grad (saves) or without (Fn/Fc) */
    int step;         /* FWD / BWD of a node that runs as several ops (mp_node.n_fops, n_bops): which,
                         from 0 */
    /* Per tensor: the MP_ST_GRAD storage (its id) holding its gradient now, -1 none.  A residual
     * add hands its incoming gradient to its inputs (AddBackward0), so several tensors can share
     * one storage.  The replay's own array: valid until mp_replay returns. */
    const int *grad_of;
    bool grad_out_of_place; /* BWD: a gradient this node makes is added out of place to one held by
                               another tensor too (a new storage after the node) */
};

typedef enum mp_status (*mp_event_fn)(void *ctx, const struct mp_event *ev);
/* An event of a replay of program p (mp_replay_nograd_forward: p may be a program it built). */
typedef enum mp_status (*mp_nograd_fn)(void *ctx, const struct mp_program *p, const struct mp_event *ev);

/* ---- PyTorch's CUDA caching allocator (alloc_sim.c, alloc_conf.c;
 * docs/memory-facts.md#caching-allocator) --------------------------------------------------------
 * The settings of PYTORCH_CUDA_ALLOC_CONF that change device bytes, as torch 2.15 reads them
 * (c10/core/AllocatorConfig.{h,cpp}, AcceleratorAllocatorConfig; c10/cuda/CUDAAllocatorConfig.h). */
#define MP_ALLOC_POW2_INTERVALS 16 /* kRoundUpPowerOfTwoIntervals: 1 MiB .. 64 GiB */
struct mp_alloc_conf {
    uint64_t max_split_size;         /* UINT64_MAX: every block may be split (the default) */
    uint64_t max_non_split_rounding; /* max_non_split_rounding_mb: 20 MiB (kLargeBuffer) */
    uint64_t large_segment_size;     /* large_segment_size_mb: 20 MiB */
    double gc_threshold;             /* garbage_collection_threshold: 0 = off */
    double memory_fraction;          /* per_process_memory_fraction: 0 = not set */
    bool expandable;                 /* expandable_segments:True */
    uint32_t pow2_div[MP_ALLOC_POW2_INTERVALS]; /* roundup_power2_divisions per interval, 0 = off */
};
void mp_alloc_conf_default(struct mp_alloc_conf *c);
/* Parses s (PYTORCH_CUDA_ALLOC_CONF syntax) over c's defaults; what names the source in the
 * one-line error ("--alloc-conf", "PYTORCH_CUDA_ALLOC_CONF").  Unknown keys and cudaMallocAsync
 * are refused (MP_ERR_USAGE). */
enum mp_status mp_alloc_conf_parse(const char *s, const char *what, struct mp_alloc_conf *c, struct mp_diag *d);
/* The settings in PYTORCH_CUDA_ALLOC_CONF syntax ("" for the defaults): only what differs. */
void mp_alloc_conf_str(const struct mp_alloc_conf *c, char *buf, size_t n);
/* The request size the allocator serves (round_size: 512 B, or a power-of-2 division). */
uint64_t mp_alloc_round(const struct mp_alloc_conf *c, uint64_t bytes);

/* One block of the simulation: a piece of a segment, in address order. */
struct mp_asim_blk {
    uint64_t addr, size;
    uint64_t gc_base;   /* the pool's get_free_block count when it was freed (its age) */
    int prev, next;     /* neighbours in the segment, -1 at the ends */
    int free_pos;       /* 1 in its pool's free list, -1 when allocated or unmapped */
    bool small;         /* small pool (requests <= 1 MiB) */
    bool allocated;
    bool mapped;        /* an expandable segment's pages: false for the unmapped rest */
    bool expandable;
};

struct mp_asim {
    struct mp_alloc_conf conf;
    uint64_t limit;        /* cudaMalloc fails beyond this many reserved bytes (0: never) */
    uint64_t total;        /* the device's memory (per_process_memory_fraction, expandable address
                            * space), 0: unknown */
    struct mp_asim_blk *b;
    int n, cap, *dead, n_dead, cap_dead;
    int *fl[2], nfl[2], capfl[2]; /* the free blocks of the large [0] / small [1] pool, sorted by
                                   * (size, address) as BlockPool::blocks */
    struct mp_asim_key {
        uint64_t size, addr;
    } *fk[2];                     /* fl's keys, beside it (the binary search reads only these) */
    int es[2];             /* expandable segment of the large [0] / small [1] pool: its first block */
    uint64_t gc_calls[2];  /* get_free_blocks_call_count per pool */
    uint64_t next_addr;
    /* the figures (torch.cuda.memory_stats names) */
    uint64_t reserved, allocated; /* reserved_bytes, allocated_bytes (block sizes) now */
    uint64_t peak_reserved;       /* max_memory_reserved */
    uint64_t peak_allocated;      /* max allocated_bytes (block sizes: splits' slack included) */
    uint64_t frag_at_peak;        /* reserved less allocated_bytes there: cached, not usable for it */
    uint64_t retries;             /* num_alloc_retries: allocations that freed the cache and retried */
    uint64_t ooms;                /* allocations that failed even then: the first is made over the
                                   * limit, which is then lifted, so the replay goes on and the
                                   * figures say what the step would need */
    uint64_t oom_request;         /* the first of them: its request size */
    bool nomem, overflow;
};
void mp_asim_init(struct mp_asim *a, const struct mp_alloc_conf *c, uint64_t limit, uint64_t total);
/* Allocates bytes (as the caching allocator's malloc); returns the block, -1 when the model
 * itself ran out of memory (a->nomem) or bytes overflowed (a->overflow). */
int mp_asim_alloc(struct mp_asim *a, uint64_t bytes);
void mp_asim_free(struct mp_asim *a, int blk);
/* torch.cuda.empty_cache(): release_cached_blocks. */
void mp_asim_empty_cache(struct mp_asim *a);
void mp_asim_release(struct mp_asim *a);

struct mp_train_opts {
    enum mp_optimizer optimizer;
    uint64_t cublas_workspace_bytes; /* persistent, inside allocated
                                      * (docs/memory-facts.md#cublas-workspace) */
    bool accumulate; /* gradient accumulation: a micro-step after the first, .grad resident from its
                      * start (AccumulateGrad adds each incoming gradient in place: a transient);
                      * then the optimizer step and zero_grad as usual
                      * (docs/memory-facts.md#gradients) */
    const struct mp_parallel *par; /* data parallel / sharding (NULL or strategy none: one GPU); the
                                    * replay is then rank r's (all ranks hold the same bytes) */
    bool skip_reserved; /* no caching-allocator model (peak_reserved = peak_allocated): for
                         * searches, whose fit decisions use the allocated peak only */
    const struct mp_alloc_conf *alloc; /* the allocator's settings (NULL: the defaults) */
    const struct mp_nccl_env *nccl;    /* NCCL's NCCL_* settings (search/nccl.h; NULL: the defaults) */
    uint64_t alloc_limit;  /* what the allocator may reserve before cudaMalloc fails (0: no limit) */
    uint64_t device_total; /* the device's memory (per_process_memory_fraction), 0: unknown */
    enum mp_ref_mode ref; /* DPO's reference model (--trainer dpo): a resident copy and/or a no-grad
                           * forward between the policy's forward and its backward */
    /* GRPO (--trainer grpo, trl 1.16.0 grpo_trainer.py): the phases before the policy's step */
    uint64_t gen_steps;      /* steps_per_generation: transformers' generate runs the micro-batch x this
                              * many sequences at once; 0: no generation phase (other trainers; vLLM) */
    uint64_t gen_seqs;       /* not 0: the generation batch in sequences, whatever the micro-batch
                              * (suggest --global-batch: TRL's steps_per_generation defaults to the
                              * accumulation, so generation takes the global batch) */
    uint64_t gen_prompt, gen_completion; /* their prompt and generated tokens */
    bool gen_temperature;    /* sampling at a temperature other than 1: generate's TemperatureLogitsWarper
                              * makes the scores a b x vocabulary fp32 tensor of their own */
    uint64_t gen_top_k;      /* GRPOConfig's top_k: 0 none, else TopKLogitsWarper */
    bool gen_top_p;          /* top_p below 1: TopPLogitsWarper (a sort of the b x vocabulary scores) */
    bool gen_min_p;          /* min_p given: MinPLogitsWarper */
    bool gen_rep_penalty;    /* repetition_penalty other than 1: RepetitionPenaltyLogitsProcessor */
    bool gen_ds3_per_layer;  /* ZeRO-3 with GRPOConfig's ds3_gather_for_generation false: generate
                              * fetches each block's partitions as the forward does (the engine's
                              * hooks), not every parameter gathered at once (generate.c) */
    bool ref_before_policy;  /* the reference's no-grad forward runs before the policy's forward (GRPO's
                              * _generate_and_score_completions), on the resident state alone */
    bool old_logps;          /* GRPO: the policy's own no-grad forward of the generation batch, a
                              * micro-batch at a time, before the reference's (old_per_token_logps,
                              * grpo_trainer.py:2641-2657: steps out of step with the accumulation, or
                              * vLLM's importance-sampling correction); mp_grpo_phases sets it */
    bool gen_grads;          /* GRPO: the phases before the step run with the accumulated gradients
                              * resident (a generation mid-accumulation); mp_grpo_phases sets it */
    uint64_t gen_every;      /* GRPO: micro-steps between generations, steps_per_generation x
                              * num_iterations (0: not GRPO; with gen_seqs the accumulation's) */
    bool old_vllm;           /* GRPO: vLLM generates with its importance-sampling correction */
    double gen_iterations;   /* GRPO: num_iterations (a generation's no-grad forwards serve that many) */
    double vllm_fraction;    /* a colocated vLLM's vllm_gpu_memory_utilization (0: none) */
    bool vllm_server;        /* vLLM generates on a server (other GPUs): nothing on this one */
    uint64_t vllm_bytes;     /* its reservation, outside torch's caching allocator: mp_vllm_bytes of the
                              * device's memory (the fit's target sets it) */
    bool gen_pass;      /* (the estimator's own) this no-grad replay is generation's prefill on the
                         * policy's own weights: autocast caches the half copies of the trainable
                         * ones as with grad (autocast_mode.cpp cached_cast tests requires_grad, not
                         * the grad mode) until the forward's autocast region ends */
    bool ref_pass;      /* (the estimator's own) this replay is the reference's forward under
                         * torch.no_grad: its weights do not require grad, so autocast caches no
                         * weight copy (autocast_mode.cpp cached_cast) */
    bool act_offload;   /* --act-offload: TRL's activation offloading (OffloadActivations around the
                         * forward and backward; replay.c aoff_pack) */
};
void mp_train_opts_default(struct mp_train_opts *o); /* adamw, 8,519,680 B workspace, no accumulation */

/* The cuBLAS workspaces a training step holds: t->cublas_workspace_bytes is one (--workspace, the
 * GPU profile's cublas_workspace_bytes), and PyTorch keeps one per cuBLAS handle and stream
 * (aten/src/ATen/cuda/CublasHandlePool.cpp: setWorkspaceForHandle keys its map by (handle,
 * stream); getCurrentCUDABlasHandle reserves a handle per thread, a thread_local PoolWindow).
 * The forward's GEMMs run on the calling thread, the backward's on autograd's CUDA device thread
 * (torch/csrc/autograd/engine.h:213-237, thread_init / start_device_threads: one thread per
 * device): two handles, two workspaces, both resident from the second step on
 * (docs/memory-facts.md#cublas-workspace).  *out = MP_CUBLAS_HANDLES x the one; false past 64 bits. */
#define MP_CUBLAS_HANDLES 2
bool mp_workspaces_bytes(const struct mp_train_opts *t, uint64_t *out);

/* Replays one step of p through sched (NULL = no checkpointing) and calls fn for
 * every event in order.  Stops at the first non-OK status from fn and returns it. */
enum mp_status mp_replay(const struct mp_program *p, const struct mp_schedule *sched, const struct mp_train_opts *t,
                         mp_event_fn fn, void *ctx, struct mp_diag *d);
/* A no-grad forward of every block, as a DPO/KTO step runs it inside compute_loss: the reference's
 * (reference: the policy's program with its adapters off under t->ref MP_REF_ADAPTER, else the
 * policy's own, a frozen copy's being alike) or the policy's own (KTO's KL sequences).  Replays
 * the setup first (the program's resident tensors), then the forward from its first
 * MP_EV_OP_BEGIN; fn gets the program each event is of. */
enum mp_status mp_replay_nograd_forward(const struct mp_program *policy, const struct mp_train_opts *t, bool reference,
                                        mp_nograd_fn fn, void *ctx, struct mp_diag *d);
/* GRPO's generation phase (micro-batch x t->gen_steps sequences of t->gen_prompt tokens, t->gen_completion
 * generated) on policy's model: e's gen_* figures, absolute (the resident state included).
 * generate.c says what it follows. */
struct mp_estimate;
enum mp_status mp_generation_phase(const struct mp_program *policy, const struct mp_train_opts *t,
                                   struct mp_estimate *e, struct mp_diag *d);
/* GRPO's phases for an accumulation of accum micro-steps (0: not known yet, as in a batch search:
 * the worst case): the old log-probs forward runs when accum is not a multiple of t->gen_every or
 * vLLM corrects (grpo_trainer.py:2641-2645), and a generation falls mid-accumulation, the gradients
 * resident, when t->gen_every is not a multiple of accum.  Sets t->old_logps and t->gen_grads. */
void mp_grpo_phases(struct mp_train_opts *t, uint64_t accum);
/* GRPO: micro-steps between generations at an accumulation of accum (t->gen_every; with
 * t->gen_seqs, TRL's default steps_per_generation, accum x num_iterations); 0: not GRPO. */
uint64_t mp_grpo_every(const struct mp_train_opts *t, uint64_t accum);
/* A colocated vLLM's memory on a device of `total` bytes at gpu_memory_utilization f: vLLM sizes
 * its KV cache to total x f less its profiled peak (weights, activations; vllm/v1/worker/
 * gpu_worker.py determine_available_memory), so the engine holds f x the device's total memory,
 * outside torch's caching allocator (TRL's colocate mode: the same process; sleep mode off).
 * 0 for f = 0. */
uint64_t mp_vllm_bytes(double f, uint64_t total);
/* The reference's resident weights: a frozen copy of every parameter under MP_REF_COPY, else 0;
 * false past 64 bits. */
/* What a reference copy under FSDP2 gathers for its forward (TRL's prepare_fsdp: one unit, resharded
 * after forward): its whole parameters beside the flat all-gather output they are copied out of,
 * both held from its pre-forward to its post-forward (torch 2.15 _fsdp_state.py _post_forward
 * releases the all-gather state); 0 for any other reference or strategy (fsdp-no-reshard: it
 * stays gathered, counted by mp_ref_weights_bytes).  false on overflow. */
bool mp_ref_gather_bytes(const struct mp_program *p, const struct mp_train_opts *t, uint64_t *bytes);
bool mp_ref_weights_bytes(const struct mp_program *p, const struct mp_train_opts *t, uint64_t *bytes);


/* PyTorch caching-allocator rounding: < 512 -> 512, else a multiple of 512. */
static inline uint64_t mp_round512(uint64_t b) { return b == 0 ? 0 : ((b + 511) / 512) * 512; }

struct mp_block_est {
    uint64_t params;
    uint64_t weights_bytes, grads_bytes, optimizer_bytes;
    uint64_t activation_bytes;  /* what the block keeps for backward when run with grad (its output included) */
    uint64_t output_bytes;
    double fwd_flops, bwd_flops;
    bool checkpointed;
};

struct mp_estimate {
    uint64_t params, trainable_params;
    uint64_t weights_bytes, grads_bytes, optimizer_bytes;
    uint64_t input_bytes;            /* input batch and labels */
    uint64_t module_buffers_bytes;   /* non-persistent module buffers (rotary inv_freq ...) */
    uint64_t workspace_bytes;        /* cuBLAS workspace */
    uint64_t activations_bytes;      /* activations live when backward starts (after the loss) */
    uint64_t optimizer_tmp_bytes;
    uint64_t peak_allocated_bytes;   /* comparable to torch.cuda.max_memory_allocated */
    uint64_t peak_requested_bytes;   /* without 512-byte rounding */
    uint64_t peak_reserved_bytes;    /* caching-allocator segments */
    bool alloc_simulated;            /* the allocator model ran (else reserved = allocated) */
    uint64_t reserved_frag_bytes;    /* at the allocator's allocated peak: reserved less its blocks */
    uint64_t alloc_retries;          /* num_alloc_retries: cudaMalloc failed, the cache was freed */
    uint64_t alloc_ooms;             /* allocations that failed after the retry (OOM) */
    uint64_t overhead_bytes;         /* CUDA context (not in allocated/reserved) */
    uint64_t peak_device_bytes;      /* allocated + context: what the GPU must have (the allocator
                                      * empties its cache before failing; margin covers fragmentation) */
    enum mp_phase peak_phase;
    char peak_event[96];             /* "backward:h.11.mlp.fc2" */
    uint64_t static_bytes;           /* weights + optimizer state + workspace + input */
    /* data parallel (per rank; world 1 without --parallel) */
    uint64_t world;
    uint64_t buffers_bytes;          /* persistent communication buffers (DDP buckets, DeepSpeed buckets) */
    uint64_t host_bytes, nvme_bytes; /* offload: host RAM and NVMe space per rank */
    /* --ep (parallel.h): the EP and expert-FSDP group sizes; the experts' part of weights, grads
     * and optimizer state per rank; one experts unit's bytes all-gathered (its E / ep experts whole) */
    uint64_t ep, efsdp, expert_weights_bytes, expert_grads_bytes, expert_optimizer_bytes, expert_gather_bytes;
    uint64_t load_bytes;             /* FSDP2 with a bitsandbytes-quantized base: the whole model on each
                                      * GPU when loaded, before fully_shard shards it (module buffers
                                      * included); the peak where larger than the step's (0: none) */
    uint64_t host_pinned_bytes;      /* --checkpoint layers+offload: pinned host RAM of the
                                      * checkpointed inputs (their PCIe copies are in pcie_bytes) */
    uint64_t ckpt_offload_bytes;     /* the same unrounded: each crosses PCIe twice (in pcie_bytes) */
    uint64_t act_offload_pcie_bytes; /* --act-offload: its copies to the host and back (in pcie_bytes;
                                      * host_pinned_bytes holds its pinned host RAM) */
    uint64_t sac_layer_bytes;        /* --checkpoint ...+sac: the outputs SAC keeps of one checkpointed
                                      * layer from its forward to its recompute (the largest layer's) */
    size_t sac_layers;               /* the checkpointed layers that keep them */
    enum mp_sac_policy sac_policy;   /* whose policy (MP_SAC_NONE: no selective checkpointing) */
    uint64_t sac_keep;               /* MP_SAC_AUTO: the candidates kept (mp_sac_candidate's ordinals) */
    double allgather_bytes, reducescatter_bytes, allreduce_bytes, pcie_bytes, host_step_elems;
    double comm_s, exposed_comm_s, offload_s; /* filled by the fit (search.c): seconds per step */
    size_t n_groups;
    /* DPO (mp_train_opts.ref): the reference copy's weights (resident, in static_bytes), and the
     * step's two phases: the policy's step (its forward, loss, backward and optimizer step, the
     * copy beside it) and the reference's no-grad forward, run after the policy's forward while
     * its graph is held; the peak is the larger.  ref_forward_event names the reference's node. */
    uint64_t ref_weights_bytes;
    uint64_t policy_peak_bytes, ref_forward_peak_bytes;
    uint64_t ref_forward_tmp_bytes;  /* what the reference's forward adds at its own peak */
    char ref_forward_event[96];
    /* LLaMA-Factory's KTO (mp_program.kl_held_bytes): the policy's no-grad forward of the KL
     * sequences after its own forward, on what that holds (its graph, the logits): its peak (in
     * policy_peak_bytes too) and where; 0: none */
    uint64_t kl_forward_peak_bytes;
    char kl_forward_event[96];
    /* GRPO's generation (mp_train_opts.gen_steps): its peak (the prefill's or the last decoding
     * step's), the DynamicCache at the last step, where the peak is, the sequences generated at once;
     * vLLM's reservation */
    uint64_t gen_peak_bytes, gen_kv_bytes, gen_prefill_peak_bytes, gen_decode_peak_bytes, gen_batch;
    uint64_t gen_gathered_bytes; /* the parameters gathered at the generation's decoding forward:
                                  * ZeRO-3 with ds3_gather_for_generation every one whole (gen_gather
                                  * "whole"), else FSDP2's units or ZeRO-3's blocks ("per-unit") */
    const char *gen_gather;      /* "whole", "per-unit", or NULL: nothing gathered (DDP, ZeRO-1/2) */
    uint64_t gen_left_bytes;     /* FSDP2: the units generate leaves gathered (the root, those not
                                  * resharded after forward), held through the reference's forward */
    char gen_event[96];
    /* GRPO's old log-probs (mp_train_opts.old_logps): the policy's no-grad forward, its peak with the
     * resident state (the reference copy's weights included) and where */
    uint64_t old_forward_peak_bytes;
    char old_forward_event[96];
    uint64_t vllm_bytes;
    double fwd_flops, bwd_flops, recompute_flops;
    double dequant_bytes; /* a quantized base's dequantization traffic in the step: each forward
                             (the trainer's no-grad ones and recomputes too) and the backward read
                             the packed weights and write them in the compute dtype (memory-bound:
                             the throughput charges it at the GPU's bandwidth) */
    size_t n_blocks;
    struct mp_block_est *blocks;
};

void mp_estimate_release(struct mp_estimate *e);

/* Above this many program nodes the caching-allocator model is skipped
 * (peak_reserved_bytes = peak_allocated_bytes). */
#define MP_ASIM_MAX_NODES 20000

/* Runs the estimator.  context_bytes is the CUDA context of the target (0 if unknown). */
enum mp_status mp_estimate_run(const struct mp_program *p, const struct mp_schedule *sched,
                               const struct mp_train_opts *t, uint64_t context_bytes, struct mp_estimate *e,
                               struct mp_diag *d);
/* The same with p's chain (mp_estimate_chain) already made, or NULL: the caller's copy
 * saves the replay that the per-block figures would otherwise need. */
enum mp_status mp_estimate_run_chain(const struct mp_program *p, const struct mp_schedule *sched,
                                     const struct mp_train_opts *t, uint64_t context_bytes,
                                     const struct mp_chain *chain, struct mp_estimate *e, struct mp_diag *d);
/* The caching allocator's reserved bytes after each ALLOC/FREE event of the steady (second)
 * step, in mp_replay's order (the timeline's x axis): *out malloc'd (free it), *n its length;
 * NULL and 0 where the allocator is not simulated (over MP_ASIM_MAX_NODES nodes). */
enum mp_status mp_reserved_series(const struct mp_program *p, const struct mp_schedule *sched,
                                  const struct mp_train_opts *t, uint64_t **out, size_t *n, struct mp_diag *d);
/* Only the figures that do not depend on the schedule (no replay): parameters, weights,
 * gradients, optimizer state, inputs, buffers, workspace, FLOPs, and the per-rank shares
 * with data parallelism; static_bytes.  e->blocks stays NULL. */
/* The forwards one step of trainer tr runs over the batch's sequences (1: SFT; the trainer's
 * no-grad forwards besides: DPO's reference, KTO's KL sequences and its reference's two, GRPO's
 * old log-probs and reference, each a generation's shared by num_iterations passes). */
double mp_fwd_passes(enum mp_trainer tr, const struct mp_train_opts *t);
enum mp_status mp_estimate_static(const struct mp_program *p, const struct mp_train_opts *t, struct mp_estimate *e,
                                  struct mp_diag *d);

/* mp_estimate_run_chain for the full model of fold f (fold.h), from one replay of f's short
 * program p with f's schedule.  full: the full schedule (recompute FLOPs, checkpointed blocks);
 * chain: the full model's chain for the per-block figures, or NULL (e->blocks stays NULL).  The
 * caching-allocator model is not run (peak_reserved_bytes = peak_allocated_bytes).  *holds false
 * (and MP_OK): the fold does not hold for this program (data parallel, tensors held across
 * blocks, a weighted block not a verified copy, an interval's interior blocks replayed
 * differently); the caller evaluates the full model. */
enum mp_status mp_estimate_run_folded(const struct mp_fold *f, const struct mp_program *p,
                                      const struct mp_schedule *full, const struct mp_train_opts *t,
                                      uint64_t context_bytes, const struct mp_chain *chain, struct mp_estimate *e,
                                      bool *holds, struct mp_diag *d);

/* mp_estimate_static for the full model of fold f, from f's short program p, without a replay.
 * *holds false (and MP_OK): the fold does not hold for p (as mp_estimate_run_folded says). */
enum mp_status mp_estimate_static_folded(const struct mp_fold *f, const struct mp_program *p,
                                         const struct mp_train_opts *t, struct mp_estimate *e, bool *holds,
                                         struct mp_diag *d);

/* The checkpoint chain of p (rotor notation, bytes rounded to 512, costs in FLOPs):
 * per block forward/backward FLOPs, input sizes, what a forward with grad keeps,
 * and forward/backward transients, measured by replaying each block alone. */
enum mp_status mp_estimate_chain(const struct mp_program *p, struct mp_chain *c, struct mp_diag *d);
/* Marks the chain's repeated blocks (c->repeated) from p's model: the only part of the chain
 * that the fixed plans (none, sqrt, segments, every, layers) read to make their schedule. */
void mp_estimate_chain_mark(const struct mp_program *p, struct mp_chain *c);

/* Selective checkpointing (docs/checkpointing.md#sac).  mp_sac_candidate: node k's ordinal among
 * the ops of its block that --checkpoint ...+sac:auto may keep (the fused SDPA call; each Linear's
 * aten.mm where all the block's Linears are plain trained matmuls), -1 for none; *mm (may be NULL)
 * its ordinal among the block's Linears (the aten.mm calls torch counts), -1 for SDPA.
 * mp_sac_block: the bytes policy pol keeps of block i (each storage once) and the forward FLOPs its
 * recompute skips; keep: MP_SAC_AUTO's kept candidates (bit j: ordinal j). */
int mp_sac_candidate(const struct mp_program *p, size_t k, int *mm);
void mp_sac_block(const struct mp_program *p, enum mp_sac_policy pol, uint64_t keep, size_t i, uint64_t *bytes,
                  double *flops);

#endif
