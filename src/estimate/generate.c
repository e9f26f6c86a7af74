/* generate.c — GRPO's generation phase: transformers' generate on the policy, before the step.
 *
 * trl 1.16.0 GRPOTrainer._generate_single_turn (grpo_trainer.py:1861-1875) runs
 * unwrapped_model.generate under torch.no_grad with gradient checkpointing turned off
 * (models/utils.py:135-137) on the generation batch (per_device_train_batch_size x
 * steps_per_generation prompts, each repeated num_generations times), with TRL's
 * GenerationConfig (:1155-1173: sampling, max_new_tokens = max_completion_length, the cache on).
 * transformers 5.24 generation/utils.py _sample then runs:
 *   the prefill: generate's clone of input_ids and the (b, P) int64 position ids it makes from the
 *     attention mask (so the rotary cos and sin are per sample: the program's, gen_cache); the
 *     model's forward over the prompts (logits_to_keep = 1: the LM head on the
 *     last position only, a b x 1 x v tensor in the compute dtype), which fills the DynamicCache:
 *     every layer's k and v torch.cat'ed onto an empty tensor (cache_utils.py DynamicLayer.update),
 *     held from then on;
 *   each step: next_token_logits = outputs.logits[:, -1, :].to(copy=True, dtype=float32) (b x v
 *     fp32), the logits processors (none at TRL's defaults: temperature 1, top_p 1, top_k 0, no
 *     min_p, repetition_penalty 1; otherwise the repetition penalty and the warpers of
 *     warper_bytes below, in _get_logits_processor's order, utils.py:1472-1480 and 1618-1635),
 *     probs = softmax (b x v fp32), one sampled token; the previous step's next_token_logits,
 *     scores and probs stay bound until they are rebound, and `outputs` (its b x 1 x v logits)
 *     until `del outputs` at the step's end;
 *   max_new_tokens - 1 decoding forwards of one token: each layer's cat makes its new k (then v)
 *     one position longer while the old one is still bound, and input_ids and attention_mask
 *     grow by a column (int64).
 * The prefill is the no-grad forward memplan replays for a reference (mp_replay_nograd_forward) on a
 * program built at the generation batch and the prompt's length with the cache on, metered up to
 * the LM head (the program's head is the loss's, not generate's); the head and the decoding steps
 * are the arithmetic below, from the program's own cache tensors (their dtype: the compute dtype,
 * or fp32 where autocast's rotated k is, lower_attention.c).  bench/accuracy/grpo_step.py compares
 * both with TRL's own generate on the CPU. */
#include "estimate.h"
#include "replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gen_meter {
    uint64_t cur, base, peak, head_cur;
    uint64_t gathered;                      /* ZeRO-3's GatheredParameters, held from the start */
    uint64_t comm, comm_fwd, comm_head;     /* data parallel: the gathered units held now, at their most
                                             * before the head, at the head (from the forward's start) */
    uint64_t head_comm0;                    /* comm when the head began (in head_cur) */
    const bool *kept;                       /* FSDP2: per group, not resharded after forward (NULL: none) */
    size_t n_kept;
    uint64_t held, trans_fwd, trans_head;   /* of comm: those groups' gathered parameters; the rest at
                                             * its most before the head, and at the head */
    int peak_node, head_node;
    bool started, stopped, overflow;
    bool no_fetch;                          /* ZeRO-3 gathered: its hooks removed, no per-block fetch */
};

static enum mp_status gen_event(void *ctx, const struct mp_program *p, const struct mp_event *ev)
{
    struct gen_meter *m = ctx;
    if (ev->kind == MP_EV_OP_BEGIN && !m->started) {
        m->started = true;
        if (!mp_add_u64(m->cur, m->gathered, &m->cur)) {
            m->overflow = true;
            return MP_ERR_RANGE;
        }
        m->base = m->peak = m->cur;
    }
    /* the LM head: generate's is on the last position only (below) */
    if (m->started && !m->stopped && ev->node >= 0 && (size_t)ev->node < p->n_nodes &&
        p->nodes[ev->node].prim == MP_P_FUSED_LOSS) {
        m->stopped = true;
        m->head_cur = m->cur;
        m->head_comm0 = m->comm_head = m->comm;
        m->trans_head = m->comm > m->held ? m->comm - m->held : 0;
        m->head_node = ev->node;
    }
    bool comm = ev->store == MP_ST_COMM && m->started && (ev->kind == MP_EV_ALLOC || ev->kind == MP_EV_FREE);
    if (comm && m->no_fetch && ev->id >= 0 && ev->id % MP_COMM_KINDS == MP_COMM_UNSHARD)
        return MP_OK; /* (trl models/utils.py:147-150: remove_hooks inside GatheredParameters) */
    if (comm) { /* (a free of a buffer made before the forward: what this one counts never goes below 0) */
        uint64_t r = mp_round512(ev->bytes);
        if (ev->kind == MP_EV_FREE)
            m->comm = m->comm > r ? m->comm - r : 0;
        else if (!mp_add_u64(m->comm, r, &m->comm)) {
            m->overflow = true;
            return MP_ERR_RANGE;
        }
        size_t g = ev->id >= 0 ? (size_t)ev->id / MP_COMM_KINDS : 0;
        if (m->kept && g < m->n_kept && m->kept[g] && ev->id % MP_COMM_KINDS == MP_COMM_UNSHARD)
            m->held = ev->kind == MP_EV_FREE ? (m->held > r ? m->held - r : 0) : m->held + r;
        uint64_t trans = m->comm > m->held ? m->comm - m->held : 0;
        if (!m->stopped) {
            m->comm_fwd = mp_max_u64(m->comm_fwd, m->comm);
            m->trans_fwd = mp_max_u64(m->trans_fwd, trans);
        } else if (ev->node == m->head_node) { /* (a unit whose first module is the head: gathered there) */
            m->comm_head = mp_max_u64(m->comm_head, m->comm);
            m->trans_head = mp_max_u64(m->trans_head, trans);
        }
    }
    if (ev->kind == MP_EV_ALLOC) {
        uint64_t r = mp_round512(ev->bytes);
        if (r < ev->bytes || !mp_add_u64(m->cur, r, &m->cur)) {
            m->overflow = true;
            return MP_ERR_RANGE;
        }
        if (m->started && !m->stopped && ev->phase == MP_PH_FORWARD && m->cur > m->peak) {
            m->peak = m->cur;
            m->peak_node = ev->node;
        }
    } else if (ev->kind == MP_EV_FREE)
        m->cur -= mp_round512(ev->bytes);
    return MP_OK;
}

/* Sums of rounded sizes, checked: *acc += round512(a * b). */
static bool add_prod(uint64_t *acc, uint64_t a, uint64_t b)
{
    uint64_t x;
    return mp_mul_u64(a, b, &x) && x <= UINT64_MAX - 511 && mp_add_u64(*acc, mp_round512(x), acc);
}

/* CUDA's stable sort of c rows of v fp32 scores (TopPLogitsWarper's torch.sort; v > 4096, so not
 * the in-place small sort): the buffers it allocates beyond its values and int64 indices, at their
 * most (torch aten/src/ATen/native/cuda/SortStable.cu do_launch_stable_sort_kernel, with
 * ATen/cuda/cub-RadixSortPairs.cuh and cub's DeviceRadixSort temporaries, CCCL 3
 * dispatch_radix_sort.cuh: an alternate keys and values buffer, num_items of each, when the sort
 * takes more than one pass, as 32-bit keys do; their histograms and look-back counters, about
 * 1 KiB per tile of thousands of items, are not counted):
 *   one row, or v >= 1,000,000 (segmented_sort_large_segments, row by row): the row's int64
 *     index iota and cub's temporaries (v fp32 keys + v int64 values);
 *   fewer than 128 rows (segmented_sort_pairs_by_full_sort): two int2 (index, segment) arrays,
 *     radix_sort_pairs' own keys output (keys_out NULL) and cub's temporaries (n fp32 keys + n int2);
 *     its second sort (int64 keys on the segment bits: one pass) adds only counters;
 *   otherwise (segmented_sort_pairs): an int64 reverse index and cub's temporaries (n fp32 + n
 *     int64).
 * The rows go in chunks of at most INT_MAX elements (nbatch).  0 on overflow (*ok false). */
static uint64_t sort_scratch(uint64_t b, uint64_t v, bool *ok)
{
    const uint64_t intmax = 2147483647u;
    uint64_t c = v <= intmax ? mp_min_u64(b, intmax / v) : 1, n = 0, s = 0;
    if (!c)
        c = 1;
    *ok = *ok && mp_mul_u64(c, v, &n) && n <= UINT64_MAX / 32;
    if (!*ok)
        return 0;
    if (c == 1 || v >= 1000000)
        *ok = add_prod(&s, v, 8) && add_prod(&s, v, 12);
    else if (c < 128)
        *ok = add_prod(&s, n, 8) && add_prod(&s, n, 8) && add_prod(&s, n, 4) && add_prod(&s, n, 12);
    else
        *ok = add_prod(&s, n, 8) && add_prod(&s, n, 12);
    return s;
}

/* What the logits processors of one decoding step hold beyond the step's copy of the logits (its
 * input), for warper_bytes's callers: w1 the first processor's highest point, rest the largest
 * of the others' with their input (the processor before's output), out the scores they hand
 * back (0: none, the scores are the copy), sm what softmax adds beside its probabilities (CUDA's
 * host_softmax and the CPU's make a contiguous copy of a non-contiguous input, SoftMax.cu
 * input_.contiguous()), pl the b int64 padding lengths held through the whole generation. */
struct warp_sum {
    uint64_t w1, rest, out, sm, pl;
    unsigned n;
};

/* The logits processors GRPOConfig turns on, each a call on the b x v fp32 scores (transformers
 * 5.24 generation/logits_process.py; docs/memory-facts.md#sampling-warpers), in
 * _get_logits_processor's order (utils.py:1472-1480 the repetition penalty, a processor, before
 * the warpers of :1618-1635): what each allocates at its highest point beyond its input, its
 * output included (every tensor its own 512-rounded block; fp = one b x v fp32 tensor, bo = one
 * b x v bool; L = the ids' columns at the call, the prompt and the tokens generated so far):
 *   RepetitionPenaltyLogitsProcessor (a tensor prompt_ignore_length: the attention mask's
 *     padding lengths, b int64 made once by _get_logits_processor): positions (L int64) and the
 *     b x L bool `positions < lengths`, masked_fill's b x L int64 ids, then clamp's beside them;
 *     pad's b x (v + 1) fp32 scores; gather's b x L fp32, then `score < 0`, `score * p`,
 *     `score / p` and where's output beside it; scatter's b x (v + 1) beside the padded; its
 *     output is a [..., :v] view of that, not contiguous: a top_p right after it sorts a dense
 *     copy on CUDA (Sort.cpp sort_cuda_kernel: not non-overlapping-and-dense), softmax makes
 *     one (min_p's stays below its mask's point; top_k and the temperature read it as it is);
 *   TemperatureLogitsWarper: scores / temperature, fp;
 *   TopKLogitsWarper (k = min(top_k, v)): topk's b x k values and int64 indices, then the bool
 *     `scores < kth` and masked_fill's output: bo + fp at its end;
 *   TopPLogitsWarper: sort's values (fp) and int64 indices, with CUDA's sort buffers
 *     (sort_scratch); then softmax and its cumsum, the bool mask, its scatter and masked_fill's
 *     output: fp + int64 indices + max(sort buffers, 2 fp + 2 bo);
 *   MinPLogitsWarper: softmax's probs, the b x 1 amax and scaled threshold, the bool mask,
 *     topk(probs, 1)'s int64 indices and masked_fill's output: 2 fp + bo + the small ones.
 * The CPU measures 1, 1.25, 5.50 and 2.25 fp for temperature, top_k, top_p and min_p at b 8, v
 * 32,000 (bench/accuracy/grpo_step.py); CUDA's sort makes top_p's 8 fp at one row or 128 rows
 * and more, 11 fp between. */
static bool warper_bytes(const struct mp_train_opts *t, uint64_t b, uint64_t v, uint64_t L, struct warp_sum *ws)
{
    uint64_t fp = 0, bo = 0, i64 = 0, w[5], in[5], pad = 0;
    bool ok = v < UINT64_MAX / 8 && add_prod(&fp, b, v * 4) && fp <= UINT64_MAX / 64 && add_prod(&bo, b, v) &&
              add_prod(&i64, b, v * 8) && add_prod(&pad, b, (v + 1) * 4) && pad <= UINT64_MAX / 64;
    /* (fp below 2^58: every sum below is a few fp, the sort's buffers 8 fp at most) */
    memset(ws, 0, sizeof *ws);
    if (!ok)
        return false;
    unsigned n = 0;
    uint64_t prev = 0; /* the output of the processor before (0: the copy) */
    bool dense = true; /* is it non-overlapping and dense */
    if (t->gen_rep_penalty) {
        uint64_t bl = 0, pos = 0, iL = 0, fL = 0, bL = 0, x, y, z;
        ok = mp_mul_u64(b, L, &bl) && bl <= UINT64_MAX / 64 && add_prod(&pos, L, 8) && add_prod(&iL, bl, 8) &&
             add_prod(&fL, bl, 4) && add_prod(&bL, bl, 1) && add_prod(&ws->pl, b, 8) && pos <= UINT64_MAX / 64;
        if (!ok)
            return false;
        x = pos + 2 * iL;                      /* clamp beside masked_fill's ids */
        y = pos + iL + pad + 4 * fL + bL;      /* where's operands beside gather's */
        z = pos + iL + 2 * pad + fL;           /* scatter's beside the padded scores */
        in[n] = prev;
        w[n++] = mp_max_u64(x, mp_max_u64(y, z));
        prev = pad;
        dense = false;
    }
    if (t->gen_temperature) {
        in[n] = prev;
        w[n++] = fp;
        prev = fp, dense = true;
    }
    if (t->gen_top_k) {
        uint64_t k = mp_min_u64(t->gen_top_k, v), vals = 0, idx = 0;
        ok = add_prod(&vals, b, k * 4) && add_prod(&idx, b, k * 8);
        in[n] = prev;
        w[n++] = mp_max_u64(mp_max_u64(vals + idx, vals + bo), bo + fp);
        prev = fp, dense = true;
    }
    if (ok && t->gen_top_p) {
        uint64_t s = sort_scratch(b, v, &ok), tail = 2 * fp + 2 * bo;
        in[n] = prev;
        w[n++] = fp + i64 + mp_max_u64(s + (dense ? 0 : fp), tail);
        prev = fp, dense = true;
    }
    if (ok && t->gen_min_p) {
        uint64_t small = 0;
        ok = add_prod(&small, b, 4) && add_prod(&small, b, 4) && add_prod(&small, b, 8);
        in[n] = prev;
        w[n++] = 2 * fp + bo + small; /* (a non-dense input's softmax copy: 2 fp, below) */
        prev = fp, dense = true;
    }
    if (!ok)
        return false;
    ws->n = n;
    ws->out = prev;
    ws->sm = dense ? 0 : fp;
    ws->w1 = n ? w[0] : 0;
    for (unsigned i = 1; i < n; i++)
        ws->rest = mp_max_u64(ws->rest, in[i] + w[i]);
    return true;
}

uint64_t mp_grpo_every(const struct mp_train_opts *t, uint64_t accum)
{
    uint64_t every = t->gen_every;
    /* (suggest --global-batch without steps_per_generation: TRL's default, the accumulation) */
    if (t->gen_seqs && accum && !mp_mul_u64(accum, t->gen_iterations > 1 ? (uint64_t)t->gen_iterations : 1, &every))
        every = UINT64_MAX;
    return every;
}

void mp_grpo_phases(struct mp_train_opts *t, uint64_t accum)
{
    if (!t->gen_every)
        return;
    if (!accum) { /* (whichever accumulation: the worst case) */
        t->old_logps = t->old_vllm || t->gen_every > 1;
        t->gen_grads = t->accumulate;
        return;
    }
    uint64_t every = mp_grpo_every(t, accum);
    t->old_logps = t->old_vllm || accum % every != 0;
    t->gen_grads = accum > 1 && every % accum != 0;
}

uint64_t mp_vllm_bytes(double f, uint64_t total)
{
    if (!(f > 0) || !total)
        return 0;
    double b = f * (double)total;
    return b >= (double)total ? total : (uint64_t)b;
}

/* ZeRO-3 with ds3_gather_for_generation (TRL's default): trl 1.16 models/utils.py:141-150 runs
 * generate inside deepspeed.zero.GatheredParameters(model.parameters()) with the engine's hooks
 * removed.  DeepSpeed 0.19.8 runtime/zero/partition_parameters.py: __enter__ (:2465-2473) calls
 * all_gather on every parameter; _all_gather (:1723-1760) takes those not available (the
 * persisted ones, below stage3_param_persistence_threshold, are whole already) and
 * _allgather_params_coalesced (:2022-2130; _allgather_params_sequential :2132- alike) makes each
 * one its own torch.empty of its partition's (padded) numel x the world in the partition's dtype,
 * param.data a view of it (:2124), held until the context exits; the partitions stay.  So the
 * whole generation runs on every rank's shards plus every non-persisted parameter whole.  0 for
 * the other strategies. */
static enum mp_status ds3_gathered(const struct mp_program *p, const struct mp_train_opts *t, uint64_t *out,
                                   struct mp_diag *d)
{
    *out = 0;
    struct mp_par_plan pp;
    enum mp_status st = mp_par_plan_make(t->par, p, t->optimizer, &pp, d);
    if (st != MP_OK)
        return st;
    uint64_t N = mp_par_world(t->par);
    bool ok = true;
    for (size_t q = 0; ok && q < p->n_params; q++) {
        uint64_t n;
        if (mp_par_z3_persistent(&pp, &p->params[q]))
            continue;
        ok = mp_mul_u64(pp.shard_elems[q], N, &n) && add_prod(out, n, mp_par_gather_elem_bytes(&pp, &p->params[q]));
    }
    mp_par_plan_release(&pp);
    return ok ? MP_OK : mp_fail(d, MP_ERR_RANGE, "%s: ZeRO-3's gathered parameters overflow 64 bits", p->model->path);
}

enum mp_status mp_generation_phase(const struct mp_program *policy, const struct mp_train_opts *t,
                                   struct mp_estimate *e, struct mp_diag *d)
{
    const uint64_t P = t->gen_prompt, C = t->gen_completion;
    uint64_t b;
    if (!t->gen_steps || !P || !C)
        return MP_OK;
    if (t->gen_seqs)
        b = t->gen_seqs;
    else if (!mp_mul_u64(policy->opts.batch, t->gen_steps, &b))
        return mp_fail(d, MP_ERR_RANGE, "%s: the generation batch overflows 64 bits", policy->model->path);
    /* A bitsandbytes 4-bit base (QLoRA, or a checkpoint's load_in_4bit): its Linear4bit casts the
     * fp32 hidden stream to compute_dtype and the result back (bitsandbytes 0.50.2 nn/modules.py:609-637),
     * and gemm_4bit on CUDA either runs the fused kernel or dequantizes the whole weight into a
     * temporary, chosen per GPU architecture and row count (backends/cuda/ops.py:584-813, 919-982);
     * the CPU runs only the dequantizing default (backends/default/ops.py:323-345), so the decoding
     * steps cannot be measured here: refused, not planned unmeasured (docs/memory-facts.md#qlora) */
    enum mp_quant_kind qk = policy->model->quant.kind;
    if (policy->opts.ft.mode == MP_FT_QLORA || qk == MP_Q_BNB_NF4 || qk == MP_Q_BNB_FP4)
        return mp_fail(d, MP_ERR_USAGE, "%s: --trainer grpo: transformers' generate on a bitsandbytes 4-bit base "
                       "is not modelled (its per-layer dequantize depends on the GPU); generate with --vllm F or "
                       "--vllm server", policy->model->path);
    /* The other quantized bases' layers (bitsandbytes Linear8bitLt, GPTQ and AWQ kernels) choose
     * their CUDA kernels and temporaries by the GPU and the row count as well, and none of their
     * decoding steps has been measured: refused for the same reason */
    if (qk != MP_Q_NONE)
        return mp_fail(d, MP_ERR_USAGE, "%s: --trainer grpo: transformers' generate on a %s base is not modelled "
                       "(its kernels' temporaries depend on the GPU, unmeasured); generate with --vllm F or "
                       "--vllm server", policy->model->path, mp_quant_kind_str(qk));
    e->gen_batch = b;
    struct mp_build_opts o = policy->opts;
    o.batch = b;
    o.seq = P;
    o.hf_checkpointing = false; /* (trl models/utils.py:135-137) */
    o.gen_cache = true;
    o.completion = 0;
    o.ft.input_grad = false;
    /* A PeftModel generates without autocast: accelerate wraps the forward of the model it
     * prepares (accelerator.py:1824-1835), the PeftModel, while PeftModel.generate calls the base
     * model's generate (peft_model.py:2229-2243), whose _sample calls the base model's own forward
     * (generation/utils.py:3236) and TRL's generate block opens no autocast (grpo_trainer.py:
     * 1861-1875): the whole generation runs in the weights' dtype (measured on the CPU: k and v
     * reach the cache in fp32 with an fp32 base) */
    bool peft = o.ft.mode == MP_FT_LORA;
    if (peft && (o.precision == MP_PREC_AMP_BF16 || o.precision == MP_PREC_AMP_FP16))
        o.precision = MP_PREC_FP32;
    else if (peft && o.precision == MP_PREC_BF16_AMP)
        o.precision = MP_PREC_BF16;
    struct mp_program g;
    enum mp_status st = mp_program_build(policy->model, &o, &g, d);
    if (st != MP_OK)
        return st;
    struct mp_train_opts gt = *t;
    gt.ref = MP_REF_NONE;
    gt.gen_pass = true;
    struct gen_meter m = {.peak_node = -1, .head_node = -1};
    bool z3 = t->par && t->par->strategy == MP_PAR_ZERO3, nr = t->par && t->par->strategy == MP_PAR_FSDP_NO_RESHARD;
    m.no_fetch = z3 && !t->gen_ds3_per_layer;
    if (m.no_fetch)
        st = ds3_gathered(policy, t, &m.gathered, d);
    bool *kept = NULL; /* FSDP2: the units a forward leaves gathered (the replay's own plan of g) */
    if (st == MP_OK && t->par && mp_par_is_fsdp(t->par->strategy)) {
        struct mp_par_plan pp;
        if ((st = mp_par_plan_make(t->par, &g, t->optimizer, &pp, d)) == MP_OK) {
            if (!(kept = calloc(pp.n_groups ? pp.n_groups : 1, sizeof *kept)))
                st = mp_fail(d, MP_ERR_NOMEM, "out of memory");
            for (size_t k = 0; kept && k < pp.n_groups; k++)
                kept[k] = pp.groups[k].root || !pp.groups[k].reshard;
            m.kept = kept;
            m.n_kept = pp.n_groups;
            mp_par_plan_release(&pp);
        }
    }
    if (st == MP_OK)
        st = mp_replay_nograd_forward(&g, &gt, false, gen_event, &m, d);
    free(kept);
    m.kept = NULL;
    if (st == MP_ERR_RANGE && m.overflow)
        st = mp_fail(d, MP_ERR_RANGE, "%s: the generation's memory overflows 64 bits", policy->model->path);
    if (st == MP_OK && m.head_node < 0)
        st = mp_fail(d, MP_ERR_MODEL, "%s: --trainer grpo: the model has no fused LM head to generate from",
                     policy->model->path);
    /* the cache: every k and v the prefill's layers keep, per token */
    uint64_t kv_last = 0, kv_one = 0, n_kv = 0;
    const uint64_t T = P + C - 1; /* the cache's length at the last decoding step */
    for (size_t k = 0; st == MP_OK && k < g.n_nodes; k++) {
        if (!g.nodes[k].kv_cached)
            continue;
        /* each cache tensor in its own dtype (under autocast the rotated k fp32, v in the compute
         * dtype: measured, bench/accuracy/grpo_step_results.md) */
        const struct mp_tensor *ct = &g.tensors[g.nodes[k].out];
        uint64_t bytes = ct->elems * mp_dtype_size(ct->dtype), per = bytes / P, one = 0;
        n_kv++;
        if (!add_prod(&one, per, T) || !mp_add_u64(kv_last, one, &kv_last))
            st = mp_fail(d, MP_ERR_RANGE, "%s: the generation's cache overflows 64 bits", policy->model->path);
        kv_one = mp_max_u64(kv_one, one);
    }
    if (st == MP_OK && !n_kv)
        st = mp_fail(d, MP_ERR_MODEL, "%s: --trainer grpo: generation's k/v cache is not modelled for this "
                     "model's attention (eager, or no attention layer)", policy->model->path);
    if (st != MP_OK) {
        mp_program_release(&g);
        return st;
    }
    const struct mp_node *hn = &g.nodes[m.head_node];
    uint64_t v = hn->n, lt = mp_dtype_size(g.compute_dtype);
    uint64_t norm_out = mp_round512(g.tensors[hn->in[0]].bytes); /* the final norm's b x P x h */
    uint64_t logits = 0, fp32 = 0, ids = 0, pre_ids = 0, fp2 = 0, fp3 = 0;
    /* input_ids and attention_mask grown to P + C columns (new tensors; the caller's prompt and mask
     * are the program's input and labels); the prefill's input_ids clone and position ids */
    bool ok = v <= UINT64_MAX / 8 && b <= UINT64_MAX / 2 && add_prod(&logits, b, v * lt) && add_prod(&fp32, b, v * 4) &&
              P + C > P && (P + C) <= UINT64_MAX / 8 && add_prod(&ids, b, 8 * (P + C)) && mp_add_u64(ids, ids, &ids) &&
              add_prod(&pre_ids, b, 8 * P) && mp_add_u64(pre_ids, pre_ids, &pre_ids) &&
              mp_add_u64(m.peak, pre_ids, &m.peak) && mp_add_u64(m.head_cur, pre_ids, &m.head_cur);
    /* a step's b x v fp32 tensors bound at once (out: the processors' scores, 0 when there are
     * none and the scores are the copy; they stay bound until the next step's are).  Between steps
     * (fp2): the copy, the scores and the probabilities.  The first step (fp1): the copy, then each
     * processor on its input beside it, then the probabilities (and softmax's copy of a
     * non-contiguous input, sm) beside the copy and the scores.  A decoding step (fp3): the new
     * copy beside the previous step's tensors; then each processor with the new copy and the
     * previous scores and probabilities (the previous copy rebound); then the new probabilities
     * beside the previous ones.  The processors' ids are the prompt's at the first step, P + C - 1
     * columns at the last. */
    struct warp_sum w0, wl;
    ok = ok && warper_bytes(t, b, v, P, &w0) && warper_bytes(t, b, v, T, &wl);
    uint64_t fp1 = 0;
    ok = ok && add_prod(&fp2, 2, fp32) && mp_add_u64(fp2, wl.out, &fp2) && mp_add_u64(fp2, fp32, &fp3);
    if (ok) {
        fp1 = mp_max_u64(2 * fp32 + w0.out + w0.sm, fp32 + mp_max_u64(w0.w1, w0.rest));
        fp3 = mp_max_u64(fp3 + wl.sm, fp2 + mp_max_u64(wl.w1, wl.rest));
        /* the padding lengths, from before the prefill to the end */
        ok = mp_add_u64(m.peak, wl.pl, &m.peak) && mp_add_u64(m.head_cur, wl.pl, &m.head_cur);
    }
    /* Under autocast the trainable weights' half copies are cached until each forward returns (the
     * replay holds the layers' in the prefill, gen_pass); the LM head's too: generate's head is a
     * Linear under autocast, not the fused one */
    uint64_t wsum = 0, lmcopy = 0;
    bool *seen = calloc(g.n_tensors ? g.n_tensors : 1, sizeof *seen); /* (a tied weight's copy is one) */
    if (!seen) {
        mp_program_release(&g);
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    }
    for (size_t k = 0; ok && k < g.n_nodes; k++) {
        int w = g.nodes[k].wcopy;
        if (w >= 0 && !seen[w]) {
            seen[w] = true;
            ok = mp_add_u64(wsum, mp_round512(g.tensors[w].bytes), &wsum);
        }
    }
    free(seen);
    int hw = hn->param[0];
    if (ok && hw >= 0 && g.params[hw].trainable && g.param_dtype != g.compute_dtype)
        ok = add_prod(&lmcopy, g.params[hw].elems, lt);
    /* the prefill: its layers (metered), then the LM head on the last position beside the final
     * norm's output, then, the forward returned (the half copies gone), the fp32 copy and the
     * probabilities */
    uint64_t at_head = 0, after = 0, pre = m.peak, dec_fwd = 0, dec_head = 0, dec_tail = 0;
    /* Data parallel (the replay's gathers, parallel.h): the head's with what its unit gathers there;
     * after the forward, the units it leaves gathered (comm_end; FSDP2: the root and the units not
     * resharded after forward, which stay gathered from the prefill on: torch 2.15
     * _fsdp_param_group.py:586-590, reshard returns at once in forward and no backward follows;
     * none under ZeRO-3).  Each decoding forward finds those gathered and gathers the others again
     * as the prefill did: comm_end and the rest at its most before the head (trans_fwd; the layers'
     * units the same size: the prefill's largest moment is each step's), or at the head.  Under
     * fsdp-no-reshard every unit stays gathered: each step gathers nothing.  DDP and ZeRO-1/2
     * gather nothing (0). */
    uint64_t comm_end = m.comm, cf = comm_end, ch = comm_end;
    if (!nr && (!mp_add_u64(comm_end, m.trans_fwd, &cf) || !mp_add_u64(comm_end, m.trans_head, &ch)))
        ok = false;
    uint64_t head_cur = m.head_cur - m.head_comm0; /* (without the comm, which head_cur includes) */
    ok = ok && mp_add_u64(head_cur, m.comm_head, &at_head) && mp_add_u64(at_head, logits, &at_head) &&
         mp_add_u64(at_head, lmcopy, &at_head) && head_cur >= norm_out + wsum &&
         mp_add_u64(head_cur - norm_out - wsum, logits, &after) && mp_add_u64(after, fp1, &after) &&
         mp_add_u64(after, comm_end, &after);
    pre = mp_max_u64(pre, mp_max_u64(at_head, after));
    /* the last decoding step: the resident state, the prompt's batch, the cache at T tokens, the ids;
     * during its forward the last layer's new k beside the old one and the previous step's
     * next_token_logits and probs; after it the new logits, their fp32 copy beside the previous two */
    uint64_t dec_base = 0;
    ok = ok && mp_add_u64(m.base, kv_last, &dec_base) && mp_add_u64(dec_base, ids, &dec_base) &&
         mp_add_u64(dec_base, wl.pl, &dec_base) &&
         mp_add_u64(dec_base, kv_one, &dec_fwd) && mp_add_u64(dec_fwd, fp2, &dec_fwd) &&
         mp_add_u64(dec_fwd, wsum, &dec_fwd) && mp_add_u64(dec_base, fp2, &dec_head) &&
         mp_add_u64(dec_head, wsum + lmcopy, &dec_head) && mp_add_u64(dec_head, logits, &dec_head) &&
         mp_add_u64(dec_base, logits, &dec_tail) && mp_add_u64(dec_tail, fp3, &dec_tail);
    ok = ok && mp_add_u64(dec_fwd, cf, &dec_fwd) && mp_add_u64(dec_head, ch, &dec_head) &&
         mp_add_u64(dec_tail, comm_end, &dec_tail);
    dec_fwd = mp_max_u64(dec_fwd, dec_head);
    if (!ok) {
        mp_program_release(&g);
        return mp_fail(d, MP_ERR_RANGE, "%s: the generation's memory overflows 64 bits", policy->model->path);
    }
    uint64_t dec = mp_max_u64(dec_fwd, dec_tail);
    e->gen_kv_bytes = kv_last;
    e->gen_gathered_bytes = m.no_fetch ? m.gathered : cf;
    e->gen_gather = m.no_fetch ? "whole" : t->par && mp_par_sharded_params(t->par->strategy) ? "per-unit" : NULL;
    e->gen_left_bytes = comm_end;
    e->gen_prefill_peak_bytes = pre;
    e->gen_decode_peak_bytes = dec;
    e->gen_peak_bytes = mp_max_u64(pre, dec);
    if (dec >= pre)
        snprintf(e->gen_event, sizeof e->gen_event, "generate:decode %llu%s",
                 (unsigned long long)(P + C - 1), dec_tail >= dec_fwd ? " logits" : " forward");
    else if (pre > m.peak)
        snprintf(e->gen_event, sizeof e->gen_event, "generate:prefill lm_head");
    else
        snprintf(e->gen_event, sizeof e->gen_event, "generate:prefill %s",
                 m.peak_node >= 0 ? g.nodes[m.peak_node].name : "?");
    mp_program_release(&g);
    return MP_OK;
}
