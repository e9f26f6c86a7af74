/* parallel.c — per-rank sharding arithmetic for DDP, ZeRO 1/2/3, FSDP2 and offload.
 *
 * Sources (read from torch 2.15 and deepspeed; docs/memory-facts.md#ddp,
 * docs/memory-facts.md#fsdp2, docs/memory-facts.md#zero):
 *  DDP     nn/parallel/distributed.py, c10d reducer: buckets in reverse parameter order, the
 *          first capped at 1 MiB, the rest at 25 MiB; together one more copy of the gradients.
 *  FSDP2   distributed/fsdp/_fully_shard/: dim-0 chunks padded to ceil(dim0/world) rows; a
 *          group's flat all-gather output (sum of padded shards x world), per-parameter
 *          unsharded storages of the same size, a flat copy-in of the cast shards under a
 *          param_dtype; reduce-scatter input (padded, reduce dtype) and output (input/world,
 *          which the sharded gradients are views of).
 *  ZeRO    deepspeed/runtime/zero/stage_1_and_2.py: parameters flattened and padded to a
 *          multiple of 2 x world; an fp32 clone of this rank's partition (even for fp32
 *          parameters); grads_in_partition in the parameter dtype; one reduce bucket buffer
 *          (reduce_bucket_size elements); an fp32 gradient partition made for the step.
 *          stage3.py: each parameter partitioned to ceil(numel/world) unless under
 *          stage3_param_persistence_threshold; fp32 master partition (shared with the
 *          parameter when that is already fp32); grad_partitions_flat_buffer in
 *          gradient_accumulation_dtype, which engine.py get_data_types makes the model's dtype
 *          (bf16 under "bf16") unless data_types.grad_accum_dtype is set, flattened and cast
 *          to fp32 for the step (replay.c); one reduce bucket.
 */
#include "parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim.h"

#define MP_X(id, name) name,
static const char *const STRATS[] = {MP_PAR_STRATEGIES(MP_X)};
static const char *const OFFLOADS[] = {MP_OFFLOADS(MP_X)};
static const char *const OFFDEVS[] = {MP_OFFLOAD_DEVS(MP_X)};
#undef MP_X
#define N_OF(a) (sizeof(a) / sizeof(a)[0])
static const char *const COMMS[] = {"all-gather", "copy-in", "unsharded params", "reduce-scatter input",
                                    "reduce-scatter output", "bucket", "partition", "fp32 grad partition",
                                    "divided gradients"};

static int parse_in(const char *const *names, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s, names[i]))
            return (int)i;
    return -1;
}

const char *mp_par_strategy_str(enum mp_par_strategy s) { return (unsigned)s < N_OF(STRATS) ? STRATS[s] : "?"; }
int mp_par_strategy_parse(const char *s) { return parse_in(STRATS, N_OF(STRATS), s); }
const char *mp_par_strategy_names(const char *sep, const char *last)
{
    static char buf[128];
    return mp_join(buf, sizeof buf, STRATS + 1, N_OF(STRATS) - 1, sep, last); /* not "none" */
}
const char *mp_offload_str(enum mp_offload o) { return (unsigned)o < N_OF(OFFLOADS) ? OFFLOADS[o] : "?"; }
int mp_offload_parse(const char *s) { return parse_in(OFFLOADS, N_OF(OFFLOADS), s); }
const char *mp_offload_names(const char *sep, const char *last)
{
    static char buf[64];
    return mp_join(buf, sizeof buf, OFFLOADS, N_OF(OFFLOADS), sep, last);
}
const char *mp_offload_dev_str(enum mp_offload_dev o) { return (unsigned)o < N_OF(OFFDEVS) ? OFFDEVS[o] : "?"; }
int mp_offload_dev_parse(const char *s) { return parse_in(OFFDEVS, N_OF(OFFDEVS), s); }
const char *mp_offload_dev_names(const char *sep, const char *last)
{
    static char buf[32];
    return mp_join(buf, sizeof buf, OFFDEVS, N_OF(OFFDEVS), sep, last);
}
const char *mp_comm_kind_str(enum mp_comm_kind k) { return (unsigned)k < MP_COMM_KINDS ? COMMS[k] : "?"; }

void mp_parallel_default(struct mp_parallel *p)
{
    memset(p, 0, sizeof *p);
    p->strategy = MP_PAR_NONE;
    p->gpus = 1;
    p->nodes = 1;
    p->ddp_bucket_cap_bytes = 25u << 20;
    p->ddp_first_bucket_bytes = 1u << 20;
    p->ds_max_live_elems = 1000000000;
    p->ds_nvme_buffer_count = 5;
    p->ep = 1;
}

uint64_t mp_par_world(const struct mp_parallel *p) { return p->gpus * p->nodes; }

bool mp_par_sharded_params(enum mp_par_strategy s)
{
    return s == MP_PAR_ZERO3 || s == MP_PAR_FSDP || s == MP_PAR_FSDP_NO_RESHARD;
}
bool mp_par_is_fsdp(enum mp_par_strategy s) { return s == MP_PAR_FSDP || s == MP_PAR_FSDP_NO_RESHARD; }
bool mp_par_is_deepspeed(enum mp_par_strategy s) { return s >= MP_PAR_ZERO1 && s <= MP_PAR_ZERO3; }

const char *mp_par_describe(const struct mp_parallel *p, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s x%llu", mp_par_strategy_str(p->strategy), (unsigned long long)mp_par_world(p));
    if (n > 0 && (size_t)n < len && p->nodes > 1)
        n += snprintf(buf + n, len - (size_t)n, " (%llu nodes)", (unsigned long long)p->nodes);
    if (n > 0 && (size_t)n < len && p->ep > 1)
        n += snprintf(buf + n, len - (size_t)n, ", experts over ep %llu", (unsigned long long)p->ep);
    if (n > 0 && (size_t)n < len && p->offload != MP_OFFLOAD_NONE)
        snprintf(buf + n, len - (size_t)n, ", %s offload to %s", mp_offload_str(p->offload),
                 mp_offload_dev_str(p->offload_device));
    return buf;
}

bool mp_par_finetune_modelled(enum mp_par_strategy s, enum mp_ft_mode m, enum mp_optimizer o)
{
    if (mp_optimizer_tmp(o) == MP_OPT_TMP_MUON) /* (its Newton-Schulz needs whole matrices; DeepSpeed steps its own Adam) */
        return s == MP_PAR_NONE || s == MP_PAR_DDP;
    if (m == MP_FT_FULL || s == MP_PAR_NONE || s == MP_PAR_DDP || s == MP_PAR_ZERO1 || s == MP_PAR_ZERO2)
        return true;
    return mp_par_is_fsdp(s) || s == MP_PAR_ZERO3;
}

enum mp_adapter_cast mp_par_adapters_cast(const struct mp_parallel *par, enum mp_ft_mode m, enum mp_precision prec,
                                          bool trl_quant)
{
    if (m != MP_FT_LORA && m != MP_FT_QLORA)
        return MP_AC_NONE;
    /* FSDP2's MixedPrecisionPolicy(param_dtype=bf16) casts every parameter (--precision mixed-bf16) */
    if (par->mixed_bf16 && mp_par_is_fsdp(par->strategy))
        return MP_AC_FSDP2;
    /* DeepSpeed 0.19.8 with "bf16" enabled (--precision bf16 and mixed-bf16 both write it:
     * report.c snippet_deepspeed) casts every floating parameter, adapters included, of a model
     * not made under zero.Init (engine.py:1859-1862 _cast_module_mixed_precision): ZeRO-1/2 */
    if ((par->strategy == MP_PAR_ZERO1 || par->strategy == MP_PAR_ZERO2) && prec == MP_PREC_BF16)
        return MP_AC_DEEPSPEED;
    /* ZeRO-3: TRL 1.16's trainers call get_peft_model(..., autocast_adapter_dtype=False) for a
     * non-quantized base (grpo_trainer.py:461-476; sft, dpo, kto, orpo alike: DeepSpeed issue 8072,
     * mixed-dtype persistent parameters), so the adapters are made in the base's dtype, and
     * DeepSpeed 0.19.8 neither casts nor upcasts them (engine.py:1859-1862 casts only a model
     * not made under zero.Init, to the same dtype); measured: bench/accuracy/grpo_zero3_results.md */
    if (par->strategy == MP_PAR_ZERO3 && m == MP_FT_LORA)
        return MP_AC_ZERO3_TRL;
    if (par->mixed_bf16) /* (ZeRO-3 QLoRA under mixed-bf16: the program's bf16, as before) */
        return MP_AC_DEEPSPEED;
    /* TRL 1.16's SFT, DPO, KTO and GRPO trainers cast a bitsandbytes 4/8-bit model's trainable
     * parameters to bf16 after get_peft_model (sft_trainer.py:905-911, dpo_trainer.py:720-729,
     * kto_trainer.py:771-780, grpo_trainer.py:530-539): mp_trainer_casts_quant_adapters */
    return trl_quant ? MP_AC_TRL_QUANT : MP_AC_NONE;
}

void mp_par_build_opts(struct mp_build_opts *b, const struct mp_parallel *par, enum mp_quant_kind base)
{
    bool trl_quant = mp_trainer_casts_quant_adapters(b->trainer, b->loss, b->ft.mode, base);
    b->ft.adapters_cast = mp_par_adapters_cast(par, b->ft.mode, b->precision, trl_quant);
    b->zero3_linear = par->strategy == MP_PAR_ZERO3; /* (LinearFunctionForZeroStage3: frozen.c) */
}

bool mp_trainer_par_modelled(enum mp_trainer tr, enum mp_loss loss, enum mp_par_strategy s)
{
    /* LLaMA-Factory's DPO and KTO (--loss hf) and their own reference preparation under ZeRO and
     * FSDP2: not modelled.  GRPO's generation: under every strategy (generate.c: ZeRO-3's gathered
     * parameters or per-block fetch, FSDP2's units gathered by each forward) */
    bool one_or_ddp = mp_trainer_lf(tr, loss);
    return !one_or_ddp || s == MP_PAR_NONE || s == MP_PAR_DDP;
}

const char *mp_par_grpo_unmodelled(enum mp_par_strategy s, enum mp_ft_mode m, enum mp_offload off, bool vllm)
{
    if (!mp_par_sharded_params(s))
        return NULL; /* (ZeRO-1/2 and DDP: whole parameters, generate as on one GPU) */
    if (vllm) /* (trl 1.16 generation/vllm_generation.py: the weights' sync gathers them itself) */
        return "vLLM's weight sync from a sharded policy";
    if (m == MP_FT_QLORA)
        return "generation from a sharded 4-bit base";
    if (off == MP_OFFLOAD_PARAMS)
        return "generation from offloaded parameters (each partition brought to the GPU as it is gathered)";
    return NULL;
}

const char *mp_par_finetune_names(void) { return "ddp, zero1, zero2, zero3, fsdp, fsdp-no-reshard"; }

const char *mp_par_fused_head_unmodelled(enum mp_par_strategy s, enum mp_ft_mode m, enum mp_loss l)
{
    if (l == MP_LOSS_TORCHTUNE && s != MP_PAR_NONE)
        return "torchtune's distributed recipes shard the model with their own FSDP2 wrapping "
               "(training.shard_model), not accelerate's";
    if (l == MP_LOSS_CCE && s == MP_PAR_ZERO3) /* the fork's cce.py:179-195, transformers/utils.py:137-146 */
        return "Cut Cross-Entropy gathers the partitioned lm_head.weight itself in backward "
               "(GatheredParameters)";
    if (!mp_par_is_fsdp(s) || (m != MP_FT_LORA && m != MP_FT_QLORA))
        return NULL;
    if (l == MP_LOSS_CHUNKED_NLL || l == MP_LOSS_LIGER)
        return "the fused LM head reads lm_head.weight, which peft leaves out of FSDP2's gathered units (a "
               "sharded DTensor, gathered per chunk)";
    if (l == MP_LOSS_CCE)
        return "Cut Cross-Entropy reads lm_head.weight, which peft leaves out of FSDP2's gathered units: a "
               "sharded DTensor, which it refuses";
    return NULL;
}

const char *mp_par_quant_unmodelled(enum mp_par_strategy s, const struct mp_quant *q)
{
    if (!q || q->kind == MP_Q_NONE || !mp_par_sharded_params(s))
        return NULL;
    if (q->kind != MP_Q_BNB_NF4 && q->kind != MP_Q_BNB_FP4)
        return s == MP_PAR_ZERO3 ? "only a bitsandbytes 4-bit base is modelled under ZeRO-3 (its packed weights "
                                   "partitioned)"
                                 : "only a bitsandbytes 4-bit base is modelled under FSDP2 (its packed weights sharded "
                                   "or left out)";
    if (s == MP_PAR_ZERO3 && mp_quant_storage(q, true) == MP_DT_U8)
        return "uint8 storage under ZeRO-3 is not modelled (give --quant-storage bfloat16, the ZeRO-3 QLoRA recipe's)";
    return NULL;
}

/* acc += v x w; false when it leaves 64 bits */
static bool wadd(uint64_t *acc, uint64_t v, uint64_t w)
{
    uint64_t m;
    return mp_mul_u64(v, w, &m) && mp_add_u64(*acc, m, acc);
}

/* A quantized base weight: its packed parts (uint8 in the program), frozen. */
static bool quantized(const struct mp_param *q) { return q->dtype == MP_DT_U8 && !q->trainable; }

bool mp_par_fsdp_ignored(const struct mp_par_plan *pp, const struct mp_param *q)
{
    return mp_par_is_fsdp(pp->par.strategy) && quantized(q) && pp->quant_storage == MP_DT_U8;
}

uint64_t mp_par_fsdp_shard_elem_bytes(const struct mp_par_plan *pp, const struct mp_param *q)
{
    if (q->adapter)
        return mp_dtype_size(MP_DT_F32);
    if (quantized(q))
        return mp_dtype_size((enum mp_dtype)pp->quant_storage);
    if (pp->quant) /* a quantized model's other weights: as loaded (no fp32 copy of a frozen one) */
        return mp_dtype_size(q->dtype);
    return pp->master_elem_bytes;
}

/* The elements the library holds of q: a quantized weight's packed storage elements ((n + 1) /
 * (2 x storage bytes) rows of one: bitsandbytes backends/cuda/ops.py quantize_4bit), else q's. */
static uint64_t lib_elems(const struct mp_par_plan *pp, const struct mp_param *q)
{
    return quantized(q) ? (q->elems + 1) / (2 * mp_dtype_size((enum mp_dtype)pp->quant_storage)) : q->elems;
}

/* ZeRO-3: bytes per element of q's partition and gathered copy, the compute dtype's, but a 4-bit
 * weight's packed storage (DeepSpeed's bf16 casts floating parameters to bf16 and leaves a
 * bf16 storage as it is; without bf16 nothing casts it: engine.py _cast_module_mixed_precision) */
static uint64_t z3_elem_bytes(const struct mp_par_plan *pp, const struct mp_param *q)
{
    return quantized(q) ? mp_dtype_size((enum mp_dtype)pp->quant_storage) : pp->compute_elem_bytes;
}

bool mp_par_z3_persistent(const struct mp_par_plan *pp, const struct mp_param *q)
{
    return pp->par.strategy == MP_PAR_ZERO3 && lib_elems(pp, q) < pp->par.ds_persistence_elems;
}

uint64_t mp_par_gather_elem_bytes(const struct mp_par_plan *pp, const struct mp_param *q)
{
    if (!mp_par_is_fsdp(pp->par.strategy))
        return pp->par.strategy == MP_PAR_ZERO3 ? z3_elem_bytes(pp, q) : pp->compute_elem_bytes;
    if (quantized(q)) /* the packed storage, never cast */
        return mp_dtype_size((enum mp_dtype)pp->quant_storage);
    return pp->par.mixed_bf16 ? pp->compute_elem_bytes : mp_par_fsdp_shard_elem_bytes(pp, q);
}

uint64_t mp_par_quant_state_bytes(const struct mp_par_plan *pp, const struct mp_param *q)
{
    struct mp_quant_part parts[MP_QUANT_PARTS_MAX];
    if (!quantized(q) || !pp->quant || !mp_quant_parts(pp->quant, q->rows, q->cols, parts))
        return 0;
    uint64_t packed = mp_ceil_div(parts[0].bytes, 512) * 512; /* the packed weight (sharded or left out) */
    return q->bytes > packed ? q->bytes - packed : 0;
}

uint64_t mp_par_hidden(const struct mp_program *p)
{
    for (size_t q = 0; q < p->n_params; q++)
        if (p->params[q].matrix)
            return p->params[q].cols;
    return 1024;
}

bool mp_par_z3_ref_bytes(const struct mp_parallel *par, const struct mp_program *p, uint64_t *resident,
                         uint64_t *gather)
{
    uint64_t N = mp_par_world(par), thr = 10 * mp_par_hidden(p);
    *resident = 0;
    for (size_t q = 0; q < p->n_params; q++) {
        const struct mp_param *pa = &p->params[q];
        uint64_t n = pa->elems < thr ? pa->elems : mp_par_zero3_shard_elems(pa->elems, N);
        if (!wadd(resident, n, mp_dtype_size(pa->dtype)))
            return false;
    }
    for (size_t i = 0; gather && i < p->n_blocks; i++) {
        gather[i] = 0;
        const struct mp_block_prog *b = &p->blocks[i];
        for (size_t k = b->node0; k < b->node0 + b->n_nodes; k++)
            for (int j = 0; j < 2; j++) {
                int q = p->nodes[k].param[j];
                if (q < 0 || p->params[q].elems < thr)
                    continue;
                bool seen = false; /* (a parameter two ops of the block use: gathered once) */
                for (size_t k2 = b->node0; k2 <= k && !seen; k2++)
                    for (int j2 = 0; j2 < 2 && !seen; j2++)
                        seen = (k2 < k || j2 < j) && p->nodes[k2].param[j2] == q;
                if (!seen && !mp_add_u64(gather[i], p->params[q].raw_bytes, &gather[i]))
                    return false;
            }
    }
    return true;
}

bool mp_par_fsdp_ref_bytes(const struct mp_parallel *par, const struct mp_program *p, uint64_t *shard,
                           uint64_t *unsharded)
{
    uint64_t N = mp_par_world(par), m = p->param_dtype == MP_DT_BF16 && !par->mixed_bf16 ? 2 : 4;
    uint64_t g = par->mixed_bf16 ? 2 : m;
    *shard = *unsharded = 0;
    for (size_t q = 0; q < p->n_params; q++) {
        uint64_t s = mp_par_fsdp_shard_elems(&p->params[q], N);
        if (!wadd(shard, s, m) || s > UINT64_MAX / N || !wadd(unsharded, s * N, g))
            return false;
    }
    return true;
}

uint64_t mp_par_rank_param_bytes(const struct mp_par_plan *pp, const struct mp_program *p, size_t q)
{
    const struct mp_param *pa = &p->params[q];
    if (pp->par.strategy == MP_PAR_ZERO3) /* persisted whole, or its partition */
        return (mp_par_z3_persistent(pp, pa) ? lib_elems(pp, pa) : pp->shard_elems[q]) * z3_elem_bytes(pp, pa) +
               mp_par_quant_state_bytes(pp, pa);
    if (!mp_par_is_fsdp(pp->par.strategy) || mp_par_fsdp_ignored(pp, pa))
        return pa->bytes;
    return pp->shard_elems[q] * mp_par_fsdp_shard_elem_bytes(pp, pa) + mp_par_quant_state_bytes(pp, pa);
}

uint64_t mp_par_offload_kept_bytes(const struct mp_par_plan *pp, const struct mp_program *p, size_t q)
{
    const struct mp_param *pa = &p->params[q];
    if (pp->par.strategy == MP_PAR_ZERO3)
        return mp_par_quant_state_bytes(pp, pa);
    if (!mp_par_is_fsdp(pp->par.strategy))
        return 0;
    return mp_par_fsdp_ignored(pp, pa) ? pa->bytes : mp_par_quant_state_bytes(pp, pa);
}

enum mp_status mp_par_validate(const struct mp_parallel *p, struct mp_diag *d)
{
    if (p->gpus == 0 || p->nodes == 0)
        return mp_fail(d, MP_ERR_USAGE, "--gpus and --nodes must be positive");
    if (p->strategy == MP_PAR_NONE && mp_par_world(p) > 1)
        return mp_fail(d, MP_ERR_USAGE, "--gpus/--nodes above 1 need --parallel ddp|zero1|zero2|zero3|fsdp|fsdp-no-reshard");
    if (p->offload != MP_OFFLOAD_NONE && !mp_par_is_deepspeed(p->strategy) && !mp_par_is_fsdp(p->strategy))
        return mp_fail(d, MP_ERR_USAGE, "--offload needs --parallel zero1|zero2|zero3|fsdp|fsdp-no-reshard");
    if (p->offload == MP_OFFLOAD_PARAMS && p->strategy != MP_PAR_ZERO3 && !mp_par_is_fsdp(p->strategy))
        return mp_fail(d, MP_ERR_USAGE, "--offload params needs --parallel zero3 or fsdp (parameters must be sharded)");
    if (p->offload == MP_OFFLOAD_OPTIMIZER && mp_par_is_fsdp(p->strategy))
        return mp_fail(d, MP_ERR_USAGE, "FSDP2 offloads parameters, gradients and optimizer state together "
                                        "(CPUOffloadPolicy): use --offload params");
    if (p->offload_device == MP_OFFDEV_NVME && p->strategy != MP_PAR_ZERO3)
        return mp_fail(d, MP_ERR_USAGE, "--offload-device nvme needs --parallel zero3 (DeepSpeed ZeRO-Infinity)");
    if (p->ep > 1 && p->strategy != MP_PAR_FSDP)
        return mp_fail(d, MP_ERR_USAGE, "--ep %llu (transformers' expert parallelism) shards the rest with FSDP2: "
                                        "add --parallel fsdp", (unsigned long long)p->ep);
    if (p->ep > 1 && mp_par_world(p) % p->ep)
        return mp_fail(d, MP_ERR_USAGE, "--ep %llu must divide the world (%llu ranks): DistributedConfig needs "
                       "ep_size to divide fsdp_size", (unsigned long long)p->ep, (unsigned long long)mp_par_world(p));
    if (p->mixed_bf16 && (p->strategy == MP_PAR_NONE || p->strategy == MP_PAR_DDP))
        return mp_fail(d, MP_ERR_USAGE, "--precision mixed-bf16 (bf16 parameters + fp32 master) is an FSDP2 or "
                                        "DeepSpeed policy: add --parallel zero1|zero2|zero3|fsdp|fsdp-no-reshard");
    return MP_OK;
}

/* ---- shard sizes ---------------------------------------------------------------------------- */

/* FSDP2 shards dim 0: an experts stack's (E, out, in) on E */
static uint64_t dim0_of(const struct mp_param *q)
{
    return q->stacked && q->experts ? q->experts : q->rows > 1 ? q->rows : q->cols;
}

uint64_t mp_par_fsdp_shard_elems(const struct mp_param *q, uint64_t world)
{
    uint64_t d0 = dim0_of(q);
    if (d0 == 0 || world == 0)
        return q->elems;
    return mp_ceil_div(d0, world) * (q->elems / d0);
}

uint64_t mp_par_zero3_shard_elems(uint64_t numel, uint64_t world) { return mp_ceil_div(numel, world); }

uint64_t mp_par_zero12_partition_elems(uint64_t numel, uint64_t world)
{
    uint64_t align = 2 * world;
    return mp_ceil_div(numel, align) * align / world;
}

uint64_t mp_par_opt_state_bytes(const struct mp_par_plan *pp, const struct mp_program *p, enum mp_optimizer o,
                                size_t qi)
{
    const struct mp_param *q = &p->params[qi];
    struct mp_param s = *q;
    struct mp_program sp = *p;
    /* an adapter's state: DeepSpeed's and FSDP2's mixed-bf16 fp32 master, else the adapter's own
     * dtype (peft's fp32; TRL's bf16 on a 4-bit base, MP_AC_TRL_QUANT: AdamW's zeros_like) */
    bool own = q->adapter && !mp_par_is_deepspeed(pp->par.strategy) && !pp->par.mixed_bf16;
    sp.param_dtype = own                                        ? q->dtype
                     : pp->master_elem_bytes == 2 && !q->adapter ? MP_DT_BF16
                                                                 : MP_DT_F32;
    s.dtype = sp.param_dtype; /* the master copy's dtype (a frozen parameter still has none) */
    uint64_t n = pp->shard_elems[qi];
    if (n != q->elems) { /* a shard: Adafactor factors the local rows */
        s.elems = n;
        if (q->rows > 1 && q->cols)
            s.rows = n / q->cols;
        else
            s.cols = n;
    }
    return mp_opt_state_bytes(&sp, o, &s);
}

/* ---- the plan ---------------------------------------------------------------------------------- */

void mp_par_plan_release(struct mp_par_plan *pp)
{
    if (!pp)
        return;
    free(pp->shard_elems);
    free(pp->groups);
    free(pp->group_of_block);
    free(pp->group_of_param);
    free(pp->experts_group_of_block);
    free(pp->group_weight);
    free(pp->bucket_bytes);
    memset(pp, 0, sizeof *pp);
}

/* How many blocks block b of p stands for (fold.h; NULL weights: one each). */
static uint64_t weight_of(const uint64_t *w, const struct mp_program *p, int b)
{
    return w && b >= 0 && (size_t)b < p->n_blocks ? w[b] : 1;
}

static bool add_bucket(struct mp_par_plan *pp, size_t *cap_n, uint64_t bytes)
{
    if (pp->n_buckets == *cap_n) {
        size_t n = *cap_n ? 2 * *cap_n : 64;
        uint64_t *b = n > SIZE_MAX / sizeof *b ? NULL : realloc(pp->bucket_bytes, n * sizeof *b);
        if (!b)
            return false;
        pp->bucket_bytes = b;
        *cap_n = n;
    }
    pp->bucket_bytes[pp->n_buckets++] = bytes;
    return true;
}

/* The bytes parameter q takes in DDP's buckets: those that require grad are the reducer's, an
 * idle one (no op uses it: its .grad stays None) too; a frozen base is not. */
static uint64_t ddp_bucket_bytes_of(const struct mp_param *q)
{
    return q->trainable || q->idle ? q->elems * mp_dtype_size(q->dtype) : 0;
}

/* DDP's bucket assignment (reducer's compute_bucket_assignment_by_size): parameters in
 * reverse order, a bucket closes once its bytes reach the cap; the first cap is 1 MiB; each
 * parameter its gradient's bytes (its own dtype), a frozen one none.  A weighted block's
 * parameters come that many times over (its copies, last to first). */
static enum mp_status ddp_buckets(struct mp_par_plan *pp, const struct mp_program *p, const uint64_t *w)
{
    size_t cap_n = 0;
    uint64_t cur = 0, cap = pp->par.ddp_first_bucket_bytes;
    for (size_t k = p->n_params; k-- > 0;) {
        int b = p->params[k].block;
        uint64_t reps = weight_of(w, p, b);
        size_t lo = k;
        if (reps > 1) /* the block's parameters are params[param0 .. k] (k its last) */
            lo = p->blocks[b].param0;
        for (uint64_t r = 0; r < reps; r++)
            for (size_t j = k + 1; j-- > lo;) {
                uint64_t gb = ddp_bucket_bytes_of(&p->params[j]);
                if (!gb)
                    continue; /* frozen: not in the reducer's buckets */
                cur += gb;
                if (cur >= cap) {
                    if (!add_bucket(pp, &cap_n, cur))
                        return MP_ERR_NOMEM;
                    cur = 0;
                    cap = pp->par.ddp_bucket_cap_bytes;
                }
            }
        k = lo;
    }
    if (cur && !add_bucket(pp, &cap_n, cur))
        return MP_ERR_NOMEM;
    return MP_OK;
}

/* The FSDP2 unit of each parameter, as accelerate >= 1.14 lays a model out (utils/fsdp_utils.py
 * fsdp2_prepare_model, accelerate PR #4015; torchtitan's parallelize does the same): fully_shard
 * on each decoder layer (a repeated block), on the input embedding (untied: its own unit,
 * resharded as the others), on the tail [final norm, (tied: the input embedding,) output
 * embedding] with reshard_after_forward=False, then on the model, whose root unit holds the rest
 * (reshard None: not resharded).  The final norm is a Norm child of the base model
 * (_find_final_norm): the head block's first op when it is a norm, but for an encoder-decoder,
 * a multimodal class (the norm inside language_model) or under peft (the root's). */
enum unit { U_ROOT, U_BLOCK, U_EMBED, U_TAIL };

static bool is_norm(const struct mp_node *n) { return n->prim == MP_P_LAYERNORM || n->prim == MP_P_RMSNORM; }

/* Sets unit[q] for each parameter; *embed_blk: the embedding unit's block (-1: none, or tied: in
 * the tail); *tail_first / *tail_blk: the block where the tail is first used (the tied table's)
 * and the head's block (-1: no tail). */
static void fsdp_units(const struct mp_program *p, unsigned char *unit, int *embed_blk, int *tail_first,
                       int *tail_blk)
{
    *embed_blk = *tail_first = *tail_blk = -1;
    for (size_t q = 0; q < p->n_params; q++) {
        int b = p->params[q].block;
        unit[q] = b >= 0 && (size_t)b < p->n_blocks && p->model && (size_t)b < p->model->n_blocks &&
                          p->model->blocks[b].repeat_group > 0
                      ? U_BLOCK
                      : U_ROOT;
    }
    int emb = p->input_embed;
    if (emb < 0 || (size_t)emb >= p->n_params || unit[emb] == U_BLOCK)
        return;
    const struct mp_param *e = &p->params[emb];
    /* the output embedding: the last linear (or fused head) that reads the table (tied) or an
     * output weight of the table's shape */
    int head = -1;
    bool tied = false;
    for (size_t k = p->n_nodes; k-- > 0 && head < 0;) {
        const struct mp_node *n = &p->nodes[k];
        int w = n->param[0];
        if ((n->prim != MP_P_LINEAR && n->prim != MP_P_FUSED_LOSS) || w < 0 || n->block == e->block)
            continue;
        const struct mp_param *o = &p->params[w];
        if (w == emb || (o->output && o->rows == e->rows && o->cols == e->cols && unit[w] == U_ROOT)) {
            head = (int)k;
            tied = w == emb;
        }
    }
    *embed_blk = e->block;
    unit[emb] = U_EMBED;
    const struct mp_node *h = head >= 0 ? &p->nodes[head] : NULL;
    /* the tail: the output embedding's block, else (a classifier) the last block for its norm */
    int tb = h ? h->block : (int)p->n_blocks - 1;
    if (tb < 0 || (h && h->block == e->block && !tied) || (p->model && (size_t)tb < p->model->n_blocks &&
                                                          p->model->blocks[tb].repeat_group > 0))
        return; /* (the head beside the table in one block, or a repeated last block: the root's) */
    if (h && tied)
        unit[emb] = U_TAIL;
    else if (h)
        unit[h->param[0]] = U_TAIL;
    if (h && h->prim == MP_P_LINEAR && h->param[1] >= 0)
        unit[h->param[1]] = U_TAIL; /* the output embedding's bias */
    const struct mp_block_prog *hb = &p->blocks[tb];
    const struct mp_model *m = p->model;
    /* (peft's wrapper hides it: getattr(PeftModel, base_model_prefix) is the CausalLM, whose
     * children are the base model and lm_head) */
    bool peft = p->opts.ft.mode == MP_FT_LORA || p->opts.ft.mode == MP_FT_QLORA;
    bool base_norm = m && !peft && !m->enc_dec && !strstr(m->hf_class, "ForConditionalGeneration");
    bool any = h != NULL;
    if (base_norm && hb->n_nodes && is_norm(&p->nodes[hb->node0]))
        for (int j = 0; j < 2; j++) {
            int q = p->nodes[hb->node0].param[j];
            if (q >= 0 && unit[q] == U_ROOT) {
                unit[q] = U_TAIL;
                any = true;
            }
        }
    if (!any)
        return;
    *tail_blk = *tail_first = tb;
    if (unit[emb] == U_TAIL)
        *tail_first = e->block, *embed_blk = -1;
}

/* FSDP2: the units above, in forward order, the root last.  ZeRO-3: one group per block.  A
 * weighted block's group stands for that many groups. */
static enum mp_status make_groups(struct mp_par_plan *pp, const struct mp_program *p, const uint64_t *w)
{
    bool fsdp = mp_par_is_fsdp(pp->par.strategy);
    size_t nb = p->n_blocks ? p->n_blocks : 1, np = p->n_params ? p->n_params : 1;
    pp->group_of_block = calloc(nb, sizeof *pp->group_of_block);
    pp->group_of_param = calloc(np, sizeof *pp->group_of_param);
    pp->experts_group_of_block = calloc(nb, sizeof *pp->experts_group_of_block);
    pp->groups = calloc(2 * p->n_blocks + 3, sizeof *pp->groups);
    pp->group_weight = calloc(2 * p->n_blocks + 3, sizeof *pp->group_weight);
    unsigned char *unit = calloc(np, 1);
    if (!pp->group_of_block || !pp->group_of_param || !pp->experts_group_of_block || !pp->groups ||
        !pp->group_weight || !unit) {
        free(unit);
        return MP_ERR_NOMEM;
    }
    int embed_blk = -1, tail_first = -1, tail_blk = -1;
    if (fsdp)
        fsdp_units(p, unit, &embed_blk, &tail_first, &tail_blk);
    bool reshard = pp->par.strategy == MP_PAR_FSDP;
    int g_embed = -1, g_tail = -1;
    size_t g = 0;
    for (size_t i = 0; i < p->n_blocks; i++) {
        bool own = !fsdp || (p->model && i < p->model->n_blocks && p->model->blocks[i].repeat_group > 0);
        bool embed = (int)i == embed_blk, tail = (int)i == tail_first;
        pp->group_of_block[i] = -1;
        if (own || embed || tail) { /* a new unit, in forward order */
            pp->group_weight[g] = own ? weight_of(w, p, (int)i) : 1;
            pp->groups[g].reshard = !tail && reshard; /* (the tail: reshard_after_forward=False) */
            pp->groups[g].first_block = i;
            if (embed)
                g_embed = (int)g;
            else if (tail)
                g_tail = (int)g;
            pp->group_of_block[i] = (int)g++;
        }
        if ((int)i == tail_blk)
            pp->group_of_block[i] = g_tail;
    }
    size_t root = g;
    bool any_root = false;
    for (size_t i = 0; i < p->n_blocks; i++)
        if (pp->group_of_block[i] < 0) {
            pp->group_of_block[i] = (int)root;
            any_root = true;
        }
    for (size_t q = 0; q < p->n_params; q++) {
        int b = p->params[q].block;
        if (b < 0 || (size_t)b >= p->n_blocks || mp_par_fsdp_ignored(pp, &p->params[q])) {
            pp->group_of_param[q] = -1; /* (a uint8 4-bit weight: accelerate's ignored_params) */
            continue;
        }
        switch ((enum unit)unit[q]) {
        case U_EMBED: pp->group_of_param[q] = g_embed; break;
        case U_TAIL: pp->group_of_param[q] = g_tail; break;
        case U_BLOCK: pp->group_of_param[q] = pp->group_of_block[b]; break;
        case U_ROOT:
            pp->group_of_param[q] = fsdp ? (int)root : pp->group_of_block[b];
            any_root = any_root || fsdp;
            break;
        }
    }
    free(unit);
    pp->n_groups = g + (any_root ? 1 : 0);
    pp->root_group = fsdp && any_root ? (int)root : -1;
    if (fsdp && any_root) {
        pp->groups[root].root = true;
        pp->group_weight[root] = 1; /* the blocks outside repeats, never weighted */
    }
    for (size_t k = 0; k < pp->n_groups; k++)
        pp->groups[k].mesh = pp->world;
    /* --ep: each experts module its own unit on the efsdp mesh, after the others (transformers
     * 5.24 distributed/fsdp.py: fully_shard(experts, mesh=efsdp, reshard_after_forward=True)
     * before the layers', which then leave its stacks out) */
    for (size_t i = 0; i < p->n_blocks; i++)
        pp->experts_group_of_block[i] = -1;
    for (size_t i = 0; pp->efsdp && i < p->n_blocks; i++) {
        const struct mp_block_prog *bp = &p->blocks[i];
        int ge = -1;
        for (size_t q = bp->param0; q < bp->param0 + bp->n_params; q++) {
            if (!p->params[q].stacked || pp->group_of_param[q] < 0)
                continue;
            if (ge < 0) {
                ge = (int)pp->n_groups++;
                pp->groups[ge] = (struct mp_par_group){.reshard = true, .experts = true, .first_block = i,
                                                        .mesh = pp->efsdp};
                pp->group_weight[ge] = weight_of(w, p, (int)i);
            }
            pp->group_of_param[q] = ge;
        }
        pp->experts_group_of_block[i] = ge;
    }
    for (size_t k = 0; k < pp->n_groups; k++) {
        pp->groups_total += pp->group_weight[k];
        pp->groups[k].blk_lo = p->n_blocks;
        pp->groups[k].first_node = pp->groups[k].last_node = SIZE_MAX;
    }
    for (size_t k = 0; k < p->n_nodes; k++) /* (the pre-forward hook of a unit's first module) */
        for (int j = 0; j < 2; j++) {
            int q = p->nodes[k].param[j], gq = q >= 0 ? pp->group_of_param[q] : -1;
            if (gq >= 0 && pp->groups[gq].experts)
                continue;
            if (gq >= 0 && pp->groups[gq].first_node == SIZE_MAX)
                pp->groups[gq].first_node = k;
            if (gq >= 0)
                pp->groups[gq].last_node = k;
        }
    /* an experts unit: gathered as its module's forward begins (the dispatch), resharded after it
     * returns (the combine); its pre-backward on that output's gradient */
    for (size_t i = 0; pp->efsdp && i < p->n_blocks; i++) {
        const struct mp_block_prog *bp = &p->blocks[i];
        int ge = -1;
        for (size_t q = bp->param0; q < bp->param0 + bp->n_params && ge < 0; q++)
            if (pp->group_of_param[q] >= 0 && pp->groups[pp->group_of_param[q]].experts)
                ge = pp->group_of_param[q];
        for (size_t k = bp->node0; ge >= 0 && k < bp->node0 + bp->n_nodes; k++)
            if (p->nodes[k].ep_unit) {
                if (pp->groups[ge].first_node == SIZE_MAX)
                    pp->groups[ge].first_node = k;
                pp->groups[ge].last_node = k;
            }
        /* the layer's pre-backward (on the layer's output) comes before its experts' */
        int gl = pp->group_of_block[i];
        if (ge >= 0 && gl >= 0 && (pp->groups[gl].last_node == SIZE_MAX || pp->groups[gl].last_node < pp->groups[ge].last_node))
            pp->groups[gl].last_node = pp->groups[ge].last_node;
    }
    uint64_t N = pp->world;
    for (size_t q = 0; q < p->n_params; q++) {
        const struct mp_param *pa = &p->params[q];
        if (pp->group_of_param[q] < 0)
            continue;
        struct mp_par_group *gr = &pp->groups[pp->group_of_param[q]];
        gr->blk_lo = mp_min_u64(gr->blk_lo, (uint64_t)pa->block);
        gr->blk_hi = mp_max_u64(gr->blk_hi, (uint64_t)pa->block);
        if (!fsdp && mp_par_z3_persistent(pp, pa)) {
            gr->persist_elems += lib_elems(pp, pa);
            continue;
        }
        uint64_t M = gr->mesh ? gr->mesh : N;
        gr->shard_elems += pp->shard_elems[q];
        gr->unsharded_elems += pp->shard_elems[q] * M;
        uint64_t gb = mp_par_gather_elem_bytes(pp, pa);
        /* the all-gather's inputs, held until copied into its flat output: a policy's cast copy,
         * and under CPU offload every shard's copy to the GPU (torch 2.15 _fsdp_param.py
         * all_gather_inputs: .to(device), then the cast; _fsdp_collectives.py:363-387) */
        bool cast = fsdp && gb != mp_par_fsdp_shard_elem_bytes(pp, pa);
        bool h2d = fsdp && pp->par.offload == MP_OFFLOAD_PARAMS && !mp_par_fsdp_ignored(pp, pa);
        if (!wadd(&gr->unsharded_bytes, pp->shard_elems[q] * M, gb) ||
            ((cast || h2d) && !wadd(&gr->copyin_bytes, pp->shard_elems[q], gb)))
            return MP_ERR_RANGE;
        if (pa->trainable) {
            gr->grad_shard_elems += pp->shard_elems[q];
            gr->grad_unsharded_elems += pp->shard_elems[q] * M;
        }
    }
    return MP_OK;
}

enum mp_status mp_par_plan_make(const struct mp_parallel *par, const struct mp_program *p, enum mp_optimizer o,
                                struct mp_par_plan *pp, struct mp_diag *d)
{
    return mp_par_plan_make_weighted(par, p, o, NULL, pp, d);
}

/* DeepSpeed's bucket sizes where the user set none: accelerate's "auto" rule (hidden^2,
 * 0.9 hidden^2, 10 hidden). */
static enum mp_status ds_bucket_defaults(struct mp_par_plan *pp, const struct mp_program *p, struct mp_diag *d)
{
    enum mp_par_strategy s = pp->par.strategy;
    uint64_t h2 = 0; /* (only DeepSpeed reads them) */
    if (mp_par_is_deepspeed(s) && (!mp_mul_u64(pp->hidden, pp->hidden, &h2) || h2 > UINT64_MAX / 64))
        return mp_fail(d, MP_ERR_RANGE, "%s: DeepSpeed's buckets (hidden size %llu squared) overflow 64 bits",
                       p->model ? p->model->path : "model", (unsigned long long)pp->hidden);
    if (!pp->par.ds_reduce_bucket_elems)
        pp->par.ds_reduce_bucket_elems = h2;
    if (!pp->par.ds_allgather_bucket_elems)
        pp->par.ds_allgather_bucket_elems = h2;
    if (!pp->par.ds_prefetch_bucket_elems)
        pp->par.ds_prefetch_bucket_elems = h2 * 9 / 10;
    if (!pp->par.ds_persistence_elems && s == MP_PAR_ZERO3)
        pp->par.ds_persistence_elems = 10 * pp->hidden;
    return MP_OK;
}

/* The elements of parameter pa this rank holds (ZeRO-1/2: its share of the optimizer state);
 * FSDP2: a quantized weight's packed storage elements ((n + 1) / (2 x storage bytes) rows of
 * one: bitsandbytes backends/cuda/ops.py quantize_4bit), or all of it when left out. */
static uint64_t shard_elems_of(const struct mp_par_plan *pp, const struct mp_param *pa, uint64_t N)
{
    switch (pp->par.strategy) {
    case MP_PAR_FSDP:
    case MP_PAR_FSDP_NO_RESHARD:
        if (mp_par_fsdp_ignored(pp, pa))
            return pa->elems;
        if (quantized(pa))
            return mp_ceil_div(lib_elems(pp, pa), N);
        /* --ep: a rank's experts stack (E / ep of them) over the efsdp ranks */
        return mp_par_fsdp_shard_elems(pa, pa->stacked && pp->efsdp ? pp->efsdp : N);
    case MP_PAR_ZERO3: return mp_par_zero3_shard_elems(lib_elems(pp, pa), N);
    case MP_PAR_ZERO1:
    case MP_PAR_ZERO2: return mp_ceil_div(pa->elems, N);
    case MP_PAR_NONE:
    case MP_PAR_DDP: return pa->elems;
    }
    return pa->elems;
}

/* The resident bytes per rank (weights, gradients, optimizer state, buffers, host and NVMe) and
 * the step's traffic, from the shards and groups made; MP_ERR_RANGE when they leave 64 bits. */
static enum mp_status resident_bytes(struct mp_par_plan *pp, const struct mp_program *p, enum mp_optimizer o,
                                     const uint64_t *w)
{
    enum mp_par_strategy s = pp->par.strategy;
    uint64_t P = pp->compute_elem_bytes;
    bool ok = true;
    uint64_t opt = 0, shard = 0, un = 0, whole = 0, grads = 0;
    uint64_t persist_b = 0, part_b = 0; /* ZeRO-3: persisted parameters whole, the others' partitions */
    uint64_t un_b = 0, regather_b = 0; /* the groups' unsharded bytes as gathered (all; the resharded) */
    uint64_t gshard = 0, gun = 0, fsdp_w = 0; /* FSDP2: trainable shards, their RS input; shard bytes */
    uint64_t kept = 0;                         /* FSDP2 offload: what stays on the GPU (quant state) */
    uint64_t loaded = 0;                       /* every parameter whole, as from_pretrained leaves it */
    uint64_t ddp = 0;                          /* DDP: the buckets' bytes, all-reduced */
    uint64_t ew = 0, eg = 0, eo = 0;           /* --ep: the experts' weights, gradients, state */
    for (size_t q = 0; q < p->n_params; q++) {
        uint64_t wq = weight_of(w, p, p->params[q].block);
        const struct mp_param *pa = &p->params[q];
        if (pp->efsdp && pa->stacked)
            ok = ok && wadd(&ew, mp_par_rank_param_bytes(pp, p, q), wq) &&
                 wadd(&eg, pa->trainable ? pp->shard_elems[q] * pp->reduce_elem_bytes : 0, wq) &&
                 wadd(&eo, mp_par_opt_state_bytes(pp, p, o, q), wq);
        ok = ok && wadd(&opt, mp_par_opt_state_bytes(pp, p, o, q), wq) && wadd(&shard, pp->shard_elems[q], wq) &&
             wadd(&whole, pa->raw_bytes, wq) && wadd(&grads, mp_param_grad_bytes(pa), wq) &&
             wadd(&fsdp_w, mp_par_rank_param_bytes(pp, p, q), wq) &&
             wadd(&kept, mp_par_offload_kept_bytes(pp, p, q), wq) && /* (peft's adapters: fp32) */
             wadd(&loaded, pa->adapter ? pa->elems : pa->bytes, pa->adapter ? 4 * wq : wq) &&
             (!pa->trainable || wadd(&gshard, pp->shard_elems[q], wq)) && wadd(&ddp, ddp_bucket_bytes_of(pa), wq);
        if (s == MP_PAR_ZERO3 && mp_par_z3_persistent(pp, pa))
            ok = ok && wadd(&persist_b, lib_elems(pp, pa) * z3_elem_bytes(pp, pa), wq);
        else if (s == MP_PAR_ZERO3)
            ok = ok && wadd(&part_b, pp->shard_elems[q] * z3_elem_bytes(pp, pa), wq);
    }
    for (size_t g = 0; g < pp->n_groups; g++) {
        ok = ok && wadd(&un, pp->groups[g].unsharded_elems, pp->group_weight[g]) &&
             wadd(&un_b, pp->groups[g].unsharded_bytes, pp->group_weight[g]) &&
             wadd(&gun, pp->groups[g].grad_unsharded_elems, pp->group_weight[g]);
        if (pp->groups[g].experts)
            pp->expert_gather_bytes = mp_max_u64(pp->expert_gather_bytes, pp->groups[g].unsharded_bytes);
        if (pp->groups[g].reshard) /* gathered again for its backward */
            ok = ok && wadd(&regather_b, pp->groups[g].unsharded_bytes, pp->group_weight[g]);
    }
    /* (shards are at most twice their parameters: padding to whole rows) */
    if (!ok || un > UINT64_MAX / 64)
        return MP_ERR_RANGE;
    pp->shard_total = shard;
    pp->grad_shard_total = gshard;
    pp->expert_weights_bytes = ew, pp->expert_grads_bytes = eg, pp->expert_optimizer_bytes = eo;
    uint64_t Psi = pp->total_elems, part = pp->partition_elems;
    const struct mp_parallel *par = &pp->par;
    bool off_opt = par->offload != MP_OFFLOAD_NONE, off_par = par->offload == MP_OFFLOAD_PARAMS;
    switch (s) {
    case MP_PAR_NONE:
    case MP_PAR_DDP:
        /* replicated as on one GPU (a quantized base in its packed tensors); gradients and
         * the all-reduce only of the trainable parameters */
        pp->weights_bytes = whole;
        /* gradient_as_bucket_view: .grad are views of the buckets (counted there) */
        pp->grads_bytes = s == MP_PAR_DDP && par->ddp_grad_as_bucket_view ? 0 : grads;
        pp->optimizer_bytes = opt;
        for (size_t b = 0; b < pp->n_buckets; b++)
            pp->buffers_bytes += pp->bucket_bytes[b];
        if (s == MP_PAR_DDP)
            pp->allreduce_bytes = (double)ddp;
        break;
    case MP_PAR_ZERO1:
    case MP_PAR_ZERO2:
        /* optimizer state on the aligned partition */
        opt = 0;
        {
            struct mp_param one = {.elems = part, .rows = 1, .cols = part, .dtype = MP_DT_F32, .trainable = true};
            struct mp_program sp = *p;
            sp.param_dtype = MP_DT_F32;
            opt = mp_opt_state_bytes(&sp, o, &one);
        }
        pp->weights_bytes = whole + (off_opt ? 0 : part * 4); /* the module as is (a frozen base too) */
        pp->grads_bytes = s == MP_PAR_ZERO1 ? Psi * P : (off_opt ? 0 : part * P);
        pp->optimizer_bytes = off_opt ? 0 : opt;
        pp->buffers_bytes = pp->bucket_bytes[0];
        pp->host_bytes = off_opt ? part * 4 + opt + part * 4 : 0;
        pp->reducescatter_bytes = (double)(Psi * P);
        pp->allgather_bytes = (double)(Psi * P);
        if (off_opt) {
            pp->pcie_bytes = 2.0 * (double)(part * P);
            pp->host_step_elems = (double)part;
        }
        break;
    case MP_PAR_ZERO3: {
        /* persisted parameters stay whole on the GPU; the rest are partitions (on the host
         * with parameter offload) */
        /* every parameter partitioned (zero.Init; a frozen base too), the optimizer's flat fp32
         * master and gradient partitions only of the trained ones (stage3.py
         * _get_trainable_parameter_groups: is_optimized_parameter; grad_partitions_flat_buffer) */
        /* (a 4-bit weight's quant_state, a module attribute, stays on every rank's GPU) */
        uint64_t dev_params = persist_b + kept + (off_par ? 0 : part_b);
        uint64_t master = (P == 4 && !off_opt) ? 0 : gshard * 4; /* fp32 params are their own master */
        /* grad_partitions_flat_buffer (stage3.py:791-795, on the offload device when the optimizer
         * is offloaded) in gradient_accumulation_dtype: engine.py:1799-1810 get_data_types gives
         * the model's dtype when data_types.grad_accum_dtype is unset (accelerate and transformers
         * leave it unset), passed at :2636/:2782 (deepspeed 0.19.8; measured on the CPU:
         * bench/accuracy/grpo_zero3_results.md) */
        uint64_t grad_part = gshard * P;
        pp->weights_bytes = dev_params + (off_opt ? 0 : master);
        pp->grads_bytes = off_opt ? 0 : grad_part;
        pp->optimizer_bytes = off_opt ? 0 : opt;
        pp->buffers_bytes = pp->bucket_bytes[0];
        if (off_opt)
            pp->host_bytes = gshard * 4 + opt + grad_part;
        if (off_par)
            pp->host_bytes += part_b;
        /* (a frozen base is gathered too: the groups' bytes; Psi counts the trained parameters) */
        pp->allgather_bytes = 2.0 * (double)(gshard == shard ? Psi * P : un_b);
        pp->reducescatter_bytes = (double)(Psi * P);
        if (off_opt) {
            pp->pcie_bytes = 2.0 * (double)(gshard * P);
            pp->host_step_elems = (double)gshard;
        }
        if (off_par)
            pp->pcie_bytes += 2.0 * (double)part_b;
        if (par->offload_device == MP_OFFDEV_NVME) {
            /* ZeRO-Infinity: state on NVMe, pinned swap buffers on the host
             * (buffer_count x buffer_size for parameters; 4 optimizer sub-group buffers) */
            pp->nvme_bytes = pp->host_bytes;
            uint64_t sub = mp_min_u64(shard, 100000000);
            pp->host_bytes = 4 * sub * 4 + (off_par ? pp->par.ds_nvme_buffer_count * 100000000ull * P : 0);
        }
        break;
    }
    case MP_PAR_FSDP:
    case MP_PAR_FSDP_NO_RESHARD: {
        /* every parameter sharded (a frozen base too); gradients, the reduce-scatter and the
         * optimizer only of the trainable ones */
        uint64_t R = pp->reduce_elem_bytes;
        pp->weights_bytes = off_par ? kept : fsdp_w;
        pp->grads_bytes = off_par ? 0 : gshard * R;
        pp->optimizer_bytes = off_par ? 0 : opt;
        if (off_par) /* (--ep: transformers' fsdp_cpu_offload gives the experts units the same policy,
                      * distributed/fsdp.py:193-238: their share of the GPU's figures is none) */
            pp->expert_weights_bytes = pp->expert_grads_bytes = pp->expert_optimizer_bytes = 0;
        pp->host_bytes = off_par ? fsdp_w - kept + gshard * R + opt : 0;
        /* forward all-gathers every group; those resharded after forward are gathered again
         * in backward */
        pp->allgather_bytes = (double)un_b + (double)regather_b;
        pp->reducescatter_bytes = (double)(gun * R);
        if (off_par) {
            pp->pcie_bytes = (double)(fsdp_w - kept) * (s == MP_PAR_FSDP ? 2 : 1) + (double)(gshard * R);
            pp->host_step_elems = (double)gshard;
        }
        break;
    }
    }
    /* A bitsandbytes-quantized base is loaded whole onto every rank's GPU before FSDP2 or ZeRO-3
     * shards it: transformers 5.24 quantizer_bnb_4bit.py update_device_map sets device_map
     * {"": torch.cuda.current_device()} (and skips zero.Init for a quantized model,
     * modeling_utils.py:1435), accelerate 1.15 prepare_model refuses a 4-bit model on another
     * device (accelerator.py:1851-1870), fsdp2_prepare_model skips cpu_ram_efficient_loading for
     * Params4bit (fsdp_utils.py:831); peft's adapters are made there too.  fully_shard, or
     * DeepSpeed's Init(module=...) at initialize (parameter_offload.py:258-279), then frees each
     * full weight for its shard. */
    if (pp->quant && mp_par_sharded_params(s))
        pp->load_bytes = loaded;
    return MP_OK;
}

enum mp_status mp_par_plan_make_weighted(const struct mp_parallel *par, const struct mp_program *p,
                                         enum mp_optimizer o, const uint64_t *block_weight, struct mp_par_plan *pp,
                                         struct mp_diag *d)
{
    const uint64_t *w = block_weight;
    memset(pp, 0, sizeof *pp);
    pp->root_group = -1;
    pp->par = *par;
    pp->world = mp_par_world(par);
    if (pp->world == 0)
        return mp_fail(d, MP_ERR_USAGE, "world size must be positive");
    enum mp_par_strategy s = par->strategy;
    uint64_t N = pp->world, P = mp_dtype_size(p->param_dtype);
    bool pure_bf16 = p->param_dtype == MP_DT_BF16 && !par->mixed_bf16;
    pp->compute_elem_bytes = P;
    /* The master copy: fp32 unless the model itself is bf16 with no fp32 copy (FSDP2 of a
     * .bfloat16() model; DeepSpeed always keeps fp32 partitions). */
    pp->master_elem_bytes = pure_bf16 && !mp_par_is_deepspeed(s) ? 2 : 4;
    /* FSDP2 reduces in the policy's fp32, else in the gradients' dtype: an adapter's fp32 */
    bool adapters = p->opts.ft.mode == MP_FT_LORA || p->opts.ft.mode == MP_FT_QLORA;
    pp->reduce_elem_bytes = mp_par_is_fsdp(s) ? (adapters ? 4 : pp->master_elem_bytes) : P;
    pp->n_params = p->n_params;
    pp->quant = mp_program_base_quant(p);
    pp->quant_storage = pp->quant ? mp_quant_storage(pp->quant, mp_par_sharded_params(s)) : MP_DT_U8;
    enum mp_status st = MP_OK;
    bool ok = true;
    for (size_t q = 0; q < p->n_params; q++) {
        /* the optimizer's parameters: a frozen base is in none of its groups (ZeRO-1/2 flatten
         * only those; deepspeed 0.19.8 runtime/zero/stage_1_and_2.py:423-434, is_optimized_parameter) */
        if (ddp_bucket_bytes_of(&p->params[q]))
            ok = ok && wadd(&pp->total_elems, p->params[q].elems, weight_of(w, p, p->params[q].block));
    }
    /* every per-rank figure below is a few bytes per element at most */
    if (!ok || pp->total_elems > UINT64_MAX / 64)
        return mp_fail(d, MP_ERR_RANGE, "%s: parameter sizes overflow 64 bits",
                       p->model ? p->model->path : "model");
    pp->hidden = mp_par_hidden(p);
    if ((st = ds_bucket_defaults(pp, p, d)) != MP_OK)
        return st;
    if (par->ep > 1 && mp_par_is_fsdp(s)) {
        if (p->opts.ep != par->ep)
            return mp_fail(d, MP_ERR_INTERNAL, "the program was built for --ep %llu, the plan asks %llu",
                           (unsigned long long)p->opts.ep, (unsigned long long)par->ep);
        pp->efsdp = N / par->ep;
    }
    pp->shard_elems = calloc(p->n_params ? p->n_params : 1, sizeof *pp->shard_elems);
    if (!pp->shard_elems)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    for (size_t q = 0; q < p->n_params; q++)
        pp->shard_elems[q] = shard_elems_of(pp, &p->params[q], N);
    pp->partition_elems = mp_par_zero12_partition_elems(pp->total_elems, N);
    if (mp_par_sharded_params(s))
        st = make_groups(pp, p, w);
    if (st == MP_OK && s == MP_PAR_DDP)
        st = ddp_buckets(pp, p, w);
    if (st == MP_OK && mp_par_is_deepspeed(s)) {
        pp->bucket_bytes = calloc(1, sizeof *pp->bucket_bytes);
        if (!pp->bucket_bytes)
            st = MP_ERR_NOMEM;
        else {
            pp->n_buckets = 1;
            pp->bucket_bytes[0] = pp->par.ds_reduce_bucket_elems * P;
        }
    }
    if (st != MP_OK) {
        mp_par_plan_release(pp);
        if (st == MP_ERR_RANGE)
            return mp_fail(d, st, "%s: parameter sizes overflow 64 bits", p->model ? p->model->path : "model");
        return mp_fail(d, st, "out of memory");
    }

    st = resident_bytes(pp, p, o, w);
    if (st != MP_OK) {
        mp_par_plan_release(pp);
        return mp_fail(d, st, "%s: parameter sizes overflow 64 bits", p->model ? p->model->path : "model");
    }
    return MP_OK;
}

/* ---- time ---------------------------------------------------------------------------------------- */

void mp_par_time(const struct mp_par_plan *pp, const struct mp_links *l, double compute_s, double bwd_share,
                 struct mp_par_time *t)
{
    memset(t, 0, sizeof *t);
    double N = (double)pp->world;
    double bw = pp->par.nodes > 1 ? l->inter_gbs : l->intra_gbs;
    if (bw <= 0)
        bw = l->pcie_gbs > 0 ? l->pcie_gbs : 16;
    t->bus_gbs = bw;
    if (pp->world > 1) {
        double ring = (N - 1) / N / (bw * 1e9);
        double ag = pp->allgather_bytes * ring, rs = pp->reducescatter_bytes * ring;
        double ar = 2 * pp->allreduce_bytes * ring;
        t->comm_s = ag + rs + ar;
        double bwd = compute_s * bwd_share;
        switch (pp->par.strategy) {
        case MP_PAR_DDP: {
            /* buckets reduce during backward; the first bucket of the next... the last one is exposed */
            double last = pp->n_buckets ? ar / (double)pp->n_buckets : 0;
            t->exposed_comm_s = (ar > bwd ? ar - bwd : 0) + last;
            break;
        }
        case MP_PAR_ZERO1:
        case MP_PAR_ZERO2:
            /* reduce-scatter overlaps backward; the parameter all-gather follows the step */
            t->exposed_comm_s = (rs > bwd ? rs - bwd : 0) + ag;
            break;
        default: {
            /* prefetch hides all-gathers and reduce-scatters behind compute, except the
             * first group's all-gather and the last group's reduce-scatter */
            double groups = pp->n_groups ? (double)pp->n_groups : 1;
            double edge = (ag + rs) / groups;
            double hidden = ag + rs - edge;
            t->exposed_comm_s = edge + (hidden > compute_s ? hidden - compute_s : 0);
            break;
        }
        }
    }
    if (pp->pcie_bytes > 0) {
        double pcie = l->pcie_gbs > 0 ? l->pcie_gbs : 16;
        double xfer = pp->pcie_bytes / (pcie * 1e9);
        double host = l->host_adam_gparams > 0 ? pp->host_step_elems / (l->host_adam_gparams * 1e9) : 0;
        /* gradients stream down during backward (DeepSpeed overlaps them); the host step and
         * the parameters coming back up are on the critical path */
        t->offload_s = xfer + host;
    }
}
