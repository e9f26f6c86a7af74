/* parallel.h — data parallelism and sharding: what one rank holds under DDP,
 * DeepSpeed ZeRO 1/2/3, PyTorch FSDP2 and CPU/NVMe offload, and what the
 * collectives move per step.
 *
 * mp_par_plan_make() does the per-rank arithmetic from the tensor program
 * (shard sizes with the engines' padding, FSDP2 groups and their all-gather /
 * reduce-scatter buffers, DDP buckets, DeepSpeed bucket buffers, host and
 * NVMe bytes, bytes per collective).  The step replay (replay_par.c) uses the
 * plan to emit rank r's alloc/free events, so the peak and where it happens
 * are per rank.  All ranks hold the same bytes (shards are padded to equal
 * size), so the plan is the plan of every rank.  Facts: docs/memory-facts.md#ddp,
 * docs/memory-facts.md#fsdp2, docs/memory-facts.md#zero.
 */
#ifndef MEMPLAN_PARALLEL_H
#define MEMPLAN_PARALLEL_H

#include "ir/layers.h"

/* Data-parallel strategies (--parallel): X(id, name). */
#define MP_PAR_STRATEGIES(X)                                                                  \
    X(NONE, "none")                       /* one GPU */                                       \
    X(DDP, "ddp")                         /* torch DistributedDataParallel */                 \
    X(ZERO1, "zero1")                     /* DeepSpeed ZeRO stage 1: optimizer state sharded */ \
    X(ZERO2, "zero2")                     /* + gradients sharded */                           \
    X(ZERO3, "zero3")                     /* + parameters sharded */                          \
    X(FSDP, "fsdp")                       /* FSDP2 fully_shard per repeated block,            \
                                             reshard_after_forward=True */                    \
    X(FSDP_NO_RESHARD, "fsdp-no-reshard") /* the same with reshard_after_forward=False */

enum mp_par_strategy {
#define MP_X(id, name) MP_PAR_##id,
    MP_PAR_STRATEGIES(MP_X)
#undef MP_X
};
const char *mp_par_strategy_str(enum mp_par_strategy s);
int mp_par_strategy_parse(const char *s); /* -1 if unknown */
/* The strategies' names but "none", joined by mp_join (for --help and errors). */
const char *mp_par_strategy_names(const char *sep, const char *last);

/* What moves to the host (--offload): X(id, name). */
#define MP_OFFLOADS(X)         \
    X(NONE, "none")            \
    X(OPTIMIZER, "optimizer")  \
    X(PARAMS, "params")
enum mp_offload {
#define MP_X(id, name) MP_OFFLOAD_##id,
    MP_OFFLOADS(MP_X)
#undef MP_X
};
/* Where it goes (--offload-device): X(id, name). */
#define MP_OFFLOAD_DEVS(X) \
    X(CPU, "cpu")          \
    X(NVME, "nvme")
enum mp_offload_dev {
#define MP_X(id, name) MP_OFFDEV_##id,
    MP_OFFLOAD_DEVS(MP_X)
#undef MP_X
};
const char *mp_offload_str(enum mp_offload o);
int mp_offload_parse(const char *s);     /* -1 if unknown */
const char *mp_offload_names(const char *sep, const char *last);
const char *mp_offload_dev_str(enum mp_offload_dev o);
int mp_offload_dev_parse(const char *s); /* -1 if unknown */
const char *mp_offload_dev_names(const char *sep, const char *last);

struct mp_parallel {
    enum mp_par_strategy strategy;
    uint64_t gpus, nodes;             /* world = gpus x nodes (all data-parallel ranks) */
    enum mp_offload offload;
    enum mp_offload_dev offload_device;
    bool mixed_bf16;                  /* bf16 compute copies + fp32 master (program built as bf16):
                                       * FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32),
                                       * DeepSpeed "bf16": {"enabled": true} */
    /* DDP (torch/nn/parallel/distributed.py) */
    uint64_t ddp_bucket_cap_bytes;    /* 25 MiB */
    uint64_t ddp_first_bucket_bytes;  /* 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES) */
    bool ddp_grad_as_bucket_view;     /* false (the default) */
    /* DeepSpeed (deepspeed/runtime/zero/config.py; memplan emits these explicitly) */
    uint64_t ds_reduce_bucket_elems;      /* reduce_bucket_size */
    uint64_t ds_allgather_bucket_elems;   /* allgather_bucket_size */
    uint64_t ds_prefetch_bucket_elems;    /* stage3_prefetch_bucket_size */
    uint64_t ds_max_live_elems;           /* stage3_max_live_parameters */
    uint64_t ds_persistence_elems;        /* stage3_param_persistence_threshold */
    uint64_t ds_nvme_buffer_count;        /* offload_param.buffer_count (5) */
    uint64_t rank;                    /* probe: the rank whose shards the step holds (0) */
    uint64_t ep;                      /* --ep: expert-parallel ranks (1: none).  transformers 5.24's
                                       * DistributedConfig(fsdp_size=world, ep_size=ep): each EP group
                                       * of ep ranks holds every expert once (experts / ep each), and
                                       * the world / ep ranks holding the same experts shard them
                                       * with FSDP2 (efsdp), one unit per experts module */
};
/* One GPU, no offload, the engines' default settings; DeepSpeed bucket sizes 0 = derived
 * from the model's hidden size (mp_par_plan_make: accelerate's "auto" rule). */
void mp_parallel_default(struct mp_parallel *p);
uint64_t mp_par_world(const struct mp_parallel *p);
bool mp_par_sharded_params(enum mp_par_strategy s); /* zero3, fsdp, fsdp-no-reshard */
/* A trainer with a reference or generation (DPO, KTO, GRPO) under strategy s: DDP for all; ZeRO
 * and FSDP2 for TRL's DPO, KTO and GRPO (their reference copy whole, partitioned, or one FSDP2
 * unit; GRPO's generation from the sharded policy, generate.c, but mp_par_grpo_unmodelled); not
 * LLaMA-Factory's DPO (--loss hf: its own reference preparation). */
bool mp_trainer_par_modelled(enum mp_trainer tr, enum mp_loss loss, enum mp_par_strategy s);
/* GRPO under a strategy that shards the parameters (zero3, fsdp, fsdp-no-reshard): what its
 * generation is not modelled with (vLLM, a QLoRA base, --offload params), as a phrase; NULL
 * when it is, and for the other strategies. */
const char *mp_par_grpo_unmodelled(enum mp_par_strategy s, enum mp_ft_mode m, enum mp_offload off, bool vllm);
bool mp_par_is_fsdp(enum mp_par_strategy s);
bool mp_par_is_deepspeed(enum mp_par_strategy s);

/* "fsdp x8", "zero3 x16 (2 nodes), optimizer offload to cpu" */
const char *mp_par_describe(const struct mp_parallel *p, char *buf, size_t len);

/* Whether the per-rank plan models fine-tuning method m (frozen base parameters: LoRA, QLoRA,
 * freeze) under strategy s.  DDP: only the trainable parameters are in the reducer's buckets
 * (torch 2.15 nn/parallel/distributed.py:1545-1560, _build_params_for_reducer keeps
 * requires_grad parameters); the frozen base is replicated as on one GPU.  ZeRO-1/2: the same,
 * with only the optimizer's parameters flattened and partitioned (a frozen base is in no
 * optimizer group).  FSDP2 (LoRA, QLoRA, freeze):
 * every parameter is sharded and all-gathered, frozen ones too; only those with a gradient are
 * reduce-scattered (torch 2.15 distributed/fsdp/_fully_shard/_fsdp_param_group.py:978-987,
 * _take_unsharded_grads_to_reduce; a group without one returns before its reduce-scatter); a
 * 4-bit base as mp_par_quant_unmodelled says. */
bool mp_par_finetune_modelled(enum mp_par_strategy s, enum mp_ft_mode m, enum mp_optimizer o);
/* Who casts peft's adapters out of fp32 under par, for fine-tuning method m in precision prec
 * (mp_finetune adapters_cast; MP_AC_NONE: none): FSDP2's mixed-bf16 policy, DeepSpeed ZeRO-1/2's
 * bf16, TRL under ZeRO-3 (LoRA), or TRL's trainers on a bitsandbytes base (trl_quant:
 * mp_trainer_casts_quant_adapters). */
enum mp_adapter_cast mp_par_adapters_cast(const struct mp_parallel *par, enum mp_ft_mode m, enum mp_precision prec,
                                          bool trl_quant);
/* The build options par decides, from b's precision, fine-tuning method, trainer and loss and the
 * base's quantization: ft.adapters_cast (mp_par_adapters_cast) and zero3_linear. */
void mp_par_build_opts(struct mp_build_opts *b, const struct mp_parallel *par, enum mp_quant_kind base);
/* "ddp" (the strategies mp_par_finetune_modelled accepts for a fine-tune, for messages) */
const char *mp_par_finetune_names(void);
/* Why a quantized base q (a QLoRA base, a quantized checkpoint) cannot be planned under s, or
 * NULL: FSDP2 plans bitsandbytes 4-bit (the packed tensor sharded in a float storage dtype, left
 * out and replicated in uint8); GPTQ/AWQ/int8 there and any under ZeRO-3 are refused. */
const char *mp_par_quant_unmodelled(enum mp_par_strategy s, const struct mp_quant *q);
/* Why a loss head is not modelled under data parallelism s, or NULL.  A fused LM head (--loss
 * chunked-nll, liger, cce: TRL's, Liger's, Cut Cross-Entropy's) of a peft model under FSDP2: the
 * head reads lm_head.weight directly, and under peft accelerate's tail unit is [lm_head] alone
 * (the final norm is the root's), whose pre-forward hook never runs: the weight stays a sharded
 * DTensor, gathered by each chunk's op (bench/accuracy/dpo_fsdp_ref_results.md; Cut
 * Cross-Entropy's linear_cross_entropy.py:62-66 raises on a DTensor): not modelled.  Cut
 * Cross-Entropy under ZeRO-3: it gathers the weight itself in backward.  torchtune's loss under
 * any strategy: its distributed recipes wrap the model themselves. */
const char *mp_par_fused_head_unmodelled(enum mp_par_strategy s, enum mp_ft_mode m, enum mp_loss l);

/* Checks that a combination exists in the engines (e.g. param offload needs zero3 or
 * fsdp, fsdp has no optimizer-only offload, mixed-bf16 needs a sharding engine).
 * MP_ERR_USAGE with a one-line reason. */
enum mp_status mp_par_validate(const struct mp_parallel *p, struct mp_diag *d);

/* A group all-gathered and reduce-scattered as one (FSDP2 fully_shard unit, or the
 * DeepSpeed ZeRO-3 fetch of one block's parameters). */
struct mp_par_group {
    uint64_t shard_elems;      /* per rank, padded */
    uint64_t unsharded_elems;  /* shard_elems x world: all-gather output / reduce-scatter input */
    uint64_t persist_elems;    /* ZeRO-3: parameters under the persistence threshold (kept whole) */
    uint64_t grad_shard_elems; /* FSDP2: shard_elems of the trainable parameters (a frozen base has
                                * no gradient: reduce-scatter output, sharded gradients) */
    uint64_t grad_unsharded_elems; /* FSDP2: their reduce-scatter input (0: no reduce-scatter) */
    uint64_t unsharded_bytes;  /* the shards x world as all-gathered (each parameter's dtype on the
                                * wire: mp_par_gather_elem_bytes): output, unsharded parameters */
    uint64_t copyin_bytes;     /* FSDP2: the shards a mixed-precision policy casts (their copies) */
    bool root;                 /* FSDP2: the root module's group */
    bool reshard;              /* FSDP2: resharded after its forward (reshard_after_forward) */
    size_t first_block;        /* FSDP2: the block whose backward ends its use (its post-backward) */
    size_t blk_lo, blk_hi;     /* the blocks that hold its parameters */
    size_t first_node;         /* FSDP2: the first node that reads one of them (its pre-forward
                                * unshard; SIZE_MAX: none) */
    size_t last_node;          /* FSDP2: the last (its pre-backward, on that module's output) */
    uint64_t mesh;             /* the ranks it is sharded over: the world, or world / ep for experts */
    bool experts;              /* --ep: an experts module's unit (nested in its layer's; resharded
                                * after its forward, whatever the layers do) */
};

/* Kinds of communication buffers (MP_ST_COMM events: id = group * MP_COMM_KINDS + kind). */
enum mp_comm_kind {
    MP_COMM_AG_OUT,    /* flat all-gather output */
    MP_COMM_COPY_IN,   /* flat copy-in of the cast shards (mixed precision) */
    MP_COMM_UNSHARD,   /* the group's unsharded parameters */
    MP_COMM_RS_IN,     /* reduce-scatter input */
    MP_COMM_RS_OUT,    /* reduce-scatter output = the sharded gradients */
    MP_COMM_BUCKET,    /* DDP bucket / DeepSpeed reduce bucket (id = group slot = bucket) */
    MP_COMM_PARTITION, /* DeepSpeed gradient partition / fp32 master partition */
    MP_COMM_STEP_GRAD, /* DeepSpeed: fp32 gradient partition made for the step */
    MP_COMM_DIVIDED,   /* FSDP2 on a one-rank mesh with a divide factor (an --ep experts unit on
                        * efsdp 1): reduce_output.copy_(input / factor) makes the quotient first */
    MP_COMM_KINDS
};
const char *mp_comm_kind_str(enum mp_comm_kind k);

struct mp_par_plan {
    struct mp_parallel par;
    uint64_t world;
    size_t n_params;
    uint64_t *shard_elems;       /* per param: what rank r keeps (padded); full size when replicated */
    size_t n_groups;             /* FSDP2 / ZeRO-3 groups; the last is the root (FSDP2) */
    struct mp_par_group *groups;
    int *group_of_block;         /* per block: the group its forward unshards */
    int *group_of_param;         /* per parameter: its group (-1: none) */
    int *experts_group_of_block; /* --ep: per block, its experts module's unit (-1: none) */
    uint64_t *group_weight;      /* per group: the groups it stands for (a fold's weighted block) */
    uint64_t groups_total;       /* groups of the full model: the sum of group_weight */
    int root_group;              /* FSDP2: the root module's group (-1: none) */
    size_t n_buckets;            /* DDP buckets or DeepSpeed reduce buffers */
    uint64_t *bucket_bytes;
    const struct mp_quant *quant; /* the program's quantized base (QLoRA, a quantized checkpoint), or NULL */
    int quant_storage;           /* its packed tensors' dtype in effect (mp_quant_storage) */
    uint64_t master_elem_bytes;  /* fp32 (4), or 2 for pure bf16 */
    uint64_t compute_elem_bytes; /* the unsharded parameters' dtype size */
    uint64_t reduce_elem_bytes;  /* reduce-scatter / all-reduce dtype size */
    uint64_t hidden;             /* model width, for DeepSpeed's "auto" bucket rule */
    uint64_t efsdp;              /* --ep: the ranks an experts stack is sharded over (world / ep); 0: none */
    uint64_t expert_weights_bytes, expert_grads_bytes, expert_optimizer_bytes; /* --ep: the experts'
                                  * part of weights/grads/optimizer per rank */
    uint64_t expert_gather_bytes; /* --ep: the largest experts unit as all-gathered */
    uint64_t load_bytes;         /* FSDP2 with a bitsandbytes-quantized base: the model whole on this
                                  * rank's GPU when loaded, before fully_shard (0 otherwise) */
    uint64_t total_elems;        /* trainable parameter elements */
    uint64_t partition_elems;    /* ZeRO-1/2: flat partition per rank (aligned to 2 x world) */
    uint64_t shard_total;        /* the sum of shard_elems over the full model's parameters */
    uint64_t grad_shard_total;   /* the same over the trainable parameters */
    /* per rank, resident through the step (what the report calls weights/grads/optimizer) */
    uint64_t weights_bytes, grads_bytes, optimizer_bytes;
    uint64_t buffers_bytes;      /* persistent communication buffers (DDP buckets, DeepSpeed ipg) */
    uint64_t host_bytes;         /* host RAM per rank (pinned offload buffers and state) */
    uint64_t nvme_bytes;         /* NVMe space per rank */
    /* bytes per step per rank */
    double allgather_bytes, reducescatter_bytes, allreduce_bytes; /* payload (full tensor sizes) */
    double pcie_bytes;           /* offload traffic between host and GPU */
    double host_step_elems;      /* parameters the host optimizer updates per rank (offload) */
};

/* Per-rank plan of p under par with optimizer o.  Owns memory: mp_par_plan_release. */
enum mp_status mp_par_plan_make(const struct mp_parallel *par, const struct mp_program *p, enum mp_optimizer o,
                                struct mp_par_plan *pp, struct mp_diag *d);
/* The same for a fold's short program p (fold.h): block j stands for block_weight[j] identical
 * blocks, so its parameters count that many times in the totals and DDP buckets, and its group
 * (group_weight) stands for that many groups; per-parameter and per-group sizes are one copy's.
 * MP_ERR_RANGE when the totals overflow 64 bits. */
enum mp_status mp_par_plan_make_weighted(const struct mp_parallel *par, const struct mp_program *p,
                                         enum mp_optimizer o, const uint64_t *block_weight, struct mp_par_plan *pp,
                                         struct mp_diag *d);
void mp_par_plan_release(struct mp_par_plan *pp);

/* Bytes per element of parameter q's FSDP2 shard: the master dtype; an adapter fp32 (peft
 * makes LoRA's A and B fp32 whatever the base's dtype, and a policy casts only the copies); a
 * quantized weight its packed storage's dtype (shard_elems count those elements); the other
 * weights of a quantized model their own dtype (frozen: no fp32 copy). */
uint64_t mp_par_fsdp_shard_elem_bytes(const struct mp_par_plan *pp, const struct mp_param *q);
/* FSDP2 leaves q out (accelerate 1.15 fsdp2_prepare_model: a frozen non-floating Params4bit, the
 * uint8 storage, goes to ignored_params): every rank holds it whole, nothing gathers it. */
bool mp_par_fsdp_ignored(const struct mp_par_plan *pp, const struct mp_param *q);
/* A quantized weight's parts besides the packed one (absmax, codes; bitsandbytes' quant_state
 * is a module attribute, not a parameter: replicated on every rank), 512-rounded; 0 otherwise. */
uint64_t mp_par_quant_state_bytes(const struct mp_par_plan *pp, const struct mp_param *q);
/* Bytes of parameter q on this rank at setup under FSDP2 (its shard, or whole when left out,
 * plus a quantized weight's quant state) or ZeRO-3 (its partition, or whole when persisted, plus
 * the quant state); the whole parameter's bytes otherwise. */
uint64_t mp_par_rank_param_bytes(const struct mp_par_plan *pp, const struct mp_program *p, size_t q);
/* ZeRO-3 keeps q whole on every rank (its numel, a 4-bit weight's packed one, under
 * param_persistence_threshold). */
/* What of mp_par_rank_param_bytes stays on the GPU under FSDP2's CPUOffloadPolicy or ZeRO-3's
 * parameter offload (--offload params): a quantized weight's quant state (a module attribute: fully_shard moves parameters
 * and buffers only, torch 2.15 _fsdp_init.py _move_states_to_device, and FSDPParam moves the
 * padded shard to the host, _fsdp_param.py:362-365) and a parameter left out whole; 0 for the rest. */
bool mp_par_z3_persistent(const struct mp_par_plan *pp, const struct mp_param *q);
uint64_t mp_par_offload_kept_bytes(const struct mp_par_plan *pp, const struct mp_program *p, size_t q);
/* The model's width for DeepSpeed's "auto" sizes: the first matrix's columns (1024: none). */
uint64_t mp_par_hidden(const struct mp_program *p);
/* TRL's frozen reference copy under ZeRO-3 (trl 1.16 models/utils.py prepare_deepspeed: its own
 * stage-3 engine, stage3_param_persistence_threshold 10 x hidden): *resident, this rank's
 * partitions (ceil(n / world) elements) and the small parameters whole, in the copy's dtype;
 * gather[i] (n_blocks of them, or NULL), the parameters block i's ops use, whole, fetched for its
 * forward and released after it (block granularity, as the policy's ZeRO-3: DeepSpeed fetches
 * per submodule and prefetches ahead).  false when they leave 64 bits. */
bool mp_par_z3_ref_bytes(const struct mp_parallel *par, const struct mp_program *p, uint64_t *resident,
                         uint64_t *gather);
/* TRL's frozen reference copy under FSDP2 (trl 1.16 models/utils.py prepare_fsdp: fully_shard on
 * the whole model, one unit, the plugin's reshard_after_forward and policy): this rank's shards
 * (the model's load dtype: fp32 but for pure bf16) and the unit's unsharded bytes as gathered (a
 * bf16 policy's dtype).  false when they leave 64 bits. */
bool mp_par_fsdp_ref_bytes(const struct mp_parallel *par, const struct mp_program *p, uint64_t *shard,
                           uint64_t *unsharded);

/* Bytes per element of parameter q as its group all-gathers it: ZeRO-3 the compute dtype;
 * FSDP2 under a bf16 policy the compute dtype, otherwise the shard's own dtype (FSDP2 gathers
 * a group of mixed dtypes as bytes: torch 2.15 _fsdp_collectives.py foreach_all_gather). */
uint64_t mp_par_gather_elem_bytes(const struct mp_par_plan *pp, const struct mp_param *q);

/* FSDP2 shard of one parameter: dim 0 chunked in world pieces, each padded to
 * ceil(dim0 / world) rows (torch.chunk + pad).  ZeRO-3: ceil(numel / world). */
uint64_t mp_par_fsdp_shard_elems(const struct mp_param *q, uint64_t world);
uint64_t mp_par_zero3_shard_elems(uint64_t numel, uint64_t world);
/* ZeRO-1/2 flat partition: numel padded to a multiple of 2 x world (nccl_start_alignment_factor 2). */
uint64_t mp_par_zero12_partition_elems(uint64_t numel, uint64_t world);

/* Optimizer state bytes per rank for param q of p holding `elems` elements in fp32 (or the
 * master dtype). */
uint64_t mp_par_opt_state_bytes(const struct mp_par_plan *pp, const struct mp_program *p, enum mp_optimizer o,
                                size_t q);

/* Interconnect figures of a target (GB/s per GPU, one direction). */
struct mp_links {
    double intra_gbs;   /* NVLink / PCIe peer bandwidth inside a node */
    double inter_gbs;   /* InfiniBand / Ethernet per GPU between nodes */
    double pcie_gbs;    /* host <-> GPU */
    double host_adam_gparams; /* host optimizer throughput, 10^9 parameters/s per rank */
};

struct mp_par_time {
    double comm_s;      /* collectives, if not overlapped */
    double exposed_comm_s; /* what is left after the engine's overlap with compute */
    double offload_s;   /* PCIe transfers + host optimizer step, not overlapped */
    double bus_gbs;     /* the bandwidth the ring runs at */
};
/* Communication and offload time for one step of compute_s seconds (forward + backward).
 * Ring collectives move (world-1)/world of the payload (all-reduce twice); overlap as the
 * engines do it: DDP and ZeRO-1/2 reduce during backward, FSDP2/ZeRO-3 prefetch the next
 * group, so only the first all-gather and the last reduce stay exposed, plus whatever the
 * collectives take beyond the compute they hide behind. */
void mp_par_time(const struct mp_par_plan *pp, const struct mp_links *l, double compute_s, double bwd_share,
                 struct mp_par_time *t);

#endif
