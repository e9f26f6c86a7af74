/* replay.c — the step replay: a block's forward and backward, the loss, the optimizer step (replay.h). */
#include "replay.h"

#include <stdlib.h>
#include <string.h>

/* What node n's forward holds until it has run: its inputs and keep (args), the frame locals it
 * ends (locals; layers.h mp_node.locals): d +1 before the block's forward, -1 once it ran (then
 * freed if nothing else holds them). */
static void node_uses(struct rp *r, const struct mp_node *n, int d, bool args, bool locals)
{
    int held[3 + 1 + MP_NODE_LOCALS_MAX], nh = 0;
    for (int j = 0; j < 3 && args; j++)
        if (n->in[j] >= 0 && !node_reads(n, n->in[j], j))
            held[nh++] = n->in[j];
    if (args)
        held[nh++] = n->keep;
    for (int j = 0; j < MP_NODE_LOCALS_MAX && locals; j++)
        held[nh++] = n->locals[j];
    for (int j = 0; j < nh; j++)
        if (held[j] >= 0) {
            r->uses[held[j]] += d;
            if (d < 0)
                t_maybe_free(r, held[j]);
        }
}

/* The end (index + 1) of block i's last node that packs a tensor for backward, or the block's
 * first node when none does.  Under torch's non-reentrant checkpoint the recompute stops at that
 * node's last pack (early stop: torch 2.15 torch/utils/checkpoint.py:1313-1316 raises
 * _StopRecomputationError), and in backward it is the first node that unpacks, which starts the
 * recompute (checkpoint.py:1351-1371, unpack_hook). */
static size_t last_pack_end(const struct mp_program *p, size_t i)
{
    const struct mp_block_prog *bp = &p->blocks[i];
    for (size_t k = bp->node0 + bp->n_nodes; k-- > bp->node0;)
        if (node_packs(&p->nodes[k]))
            return k + 1;
    return bp->node0;
}

/* Does n pack what it saves before it computes?  An ATen op's autograd kernel saves its inputs
 * before it runs the op and its outputs after (torch/csrc/autograd/generated/VariableType: the
 * SavedVariables of MmBackward0 are made before the redispatch).  Two extras are the op's inputs
 * made by ops of their own before it: autocast's weight copy (a cast) and an MoE row index
 * (transformers 5.24 integrations/moe.py:527-529: inv_perm, then weighted_out[inv_perm]).  A
 * custom Function (bitsandbytes' MatMul4Bit) and a node of several ops pack after running.  An
 * early stop at such a node's last pack leaves its output unmade. */
static bool packs_before_run(const struct mp_node *n)
{
    if (n->quantized || n->n_fops)
        return false;
    for (int j = 0; j < n->n_saved; j++) {
        int t = n->saved[j];
        bool made_before = false;
        for (int e = 0; e < n->n_extra; e++)
            made_before |= n->extra[e] == t &&
                           (n->extra_role[e] == MP_XR_WEIGHT_COPY || n->extra_role[e] == MP_XR_ROW_INDEX);
        if (!node_reads(n, t, 3) && !made_before)
            return false;
    }
    return true;
}

static void bwd_node(struct rp *r, size_t i, size_t k);

/* Offloaded checkpointing (--checkpoint layers+offload): transformers 5.24 modeling_utils.py
 * :3160-3166 runs each layer's checkpoint inside torch.autograd.graph.save_on_cpu(pin_memory=True).
 * The checkpoint's positional inputs are SavedTensors made before its own hooks are pushed (torch
 * 2.15 utils/checkpoint.py:2040 save_inputs, then :2044 _checkpoint_hook), so save_on_cpu packs
 * them: a pinned host tensor and a copy (autograd/graph.py:447-454).  GradientCheckpointingLayer
 * passes only the hidden states positionally; the other arguments are bound in a partial
 * (modeling_layers.py:123) and stay on the device as today.  So the device copy of x_i dies when
 * its Fc ends (out), and the recompute's first unpack copies it back (graph.py:456-458:
 * .to(device)) into unpack_hook's local args (checkpoint.py:1362-1370), which lives through the
 * recompute only: after it x_i stays on the device only if a recomputed op saved it.  A copy
 * still live at the unpack (saved by the block before) is not counted twice. */
static void offload_input(struct rp *r, size_t i, bool out)
{
    int x = r->p->blocks[i].input;
    if (out) {
        r->holds[x]--;
        t_maybe_free(r, x);
    } else {
        t_alloc(r, x);
        r->holds[x]++;
        r->ckpt[i] = false; /* the end of this Fe drops its hold, as a plain Fe's */
    }
}

/* ---- --act-offload: TRL's activation offloading --------------------------------------------
 * trl 1.16.0 models/activation_offloading.py (docs/memory-facts.md#activation-offloading), as
 * SFTTrainer runs it (sft_trainer.py:1190-1193, 1690-1693: get_act_offloading_ctx_manager(model)
 * with its defaults, around training_step's forward and backward).  Every tensor autograd saves
 * outside a checkpointed layer and outside the lm_head (NoOpManager, :717-720) is packed by its
 * hook; a checkpointed layer's own saves go to the checkpoint's hooks, so of a layer only the
 * checkpoint's input is packed (torch 2.15 utils/checkpoint.py:2040 save_inputs before :2044).
 * A pack (pack_tensor, :200-340) takes the next id (every pack, offloaded or not); a storage
 * already tracked stays on the device (:220-225, "dedup"); under 1,024 bytes too (:233); else a
 * pinned host copy (:319-320) and a device reference in the forward stash, which each offload
 * first trims to the ids above its own less 5 (:283-290, max_fwd_stash_size 5).  In backward
 * (unpack_tensor_with_streams, :385-534) an offloaded tensor still in the forward stash is used as
 * it is, any other is copied back (:436-447) and kept in the backward stash; after the node that
 * unpacked it (its hook, :477-522) the forward stash is emptied, the tensors of the node before
 * it are dropped, and its own stay until the next such node, unless something else now holds the
 * storage (record_stream, :500-502: a recompute saved it).  The end of backward drops the rest
 * (:391-399) and so does __exit__ (:612-618). */
#define AOFF_MIN_BYTES 1024 /* min_offload_size (activation_offloading.py:128, 646) */
#define AOFF_STASH 5        /* max_fwd_stash_size (:129, 647) */

struct rp_aoff {
    uint32_t *offm;     /* per node: bit j set when saved[j]'s pack was offloaded ... */
    uint32_t *dupm;     /* ... and packed again by a later op of the node (kept: a saved reference) */
    bool *xoff;         /* per block: its checkpoint input's pack was offloaded */
    uint64_t *owner;    /* per tensor: the pack id tracking its storage (0: not tracked) */
    int *fs_t;          /* forward stash: tensors, oldest first ... */
    uint64_t *fs_id;    /* ... and their pack ids */
    size_t n_fs;
    int *bs;            /* backward stash: the reloaded tensors, oldest first */
    size_t n_bs;
    uint64_t id;        /* the last pack id */
    int noop;           /* the lm_head node (NoOpManager), -1 */
    int trigger;        /* a recompute's first unpacking node: its reload of x_i is pending, -1 */
    bool mask_off;      /* TRL's fused head: the label mask's second pack was offloaded ... */
    int mask_kept;      /* ... and the mask each kept pack holds on the device (aoff_fused), -1 */
    size_t trigger_prev;/* the backward stash's entries before that reload */
    struct rp_aoff_out out;
};

static void aoff_hold(struct rp *r, int t, int d)
{
    r->holds[t] += d;
    if (d < 0)
        t_maybe_free(r, t);
}

static uint64_t pow2_up(uint64_t x)
{
    uint64_t v = 1;
    while (v < x && v <= UINT64_MAX / 2)
        v *= 2;
    return v < x ? UINT64_MAX : v;
}

/* The pack of tensor t in the forward: true when it is offloaded (a device reference in the
 * forward stash, no saved reference), false when autograd keeps it as it is. */
static bool aoff_pack(struct rp *r, int t)
{
    struct rp_aoff *a = r->ao;
    uint64_t id = ++a->id, bytes = r->p->tensors[t].bytes;
    if (a->owner[t]) { /* the storage is tracked: kept on the device, now tracked by this id */
        a->owner[t] = id;
        return false;
    }
    if (bytes < AOFF_MIN_BYTES)
        return false;
    size_t keep = 0;
    for (size_t j = 0; j < a->n_fs; j++) {
        if (a->fs_id[j] + AOFF_STASH <= id) { /* (id <= tensor_id - max_fwd_stash_size) */
            int u = a->fs_t[j];
            if (a->owner[u] == a->fs_id[j])
                a->owner[u] = 0; /* release_storage_key */
            aoff_hold(r, u, -1);
        } else {
            a->fs_t[keep] = a->fs_t[j];
            a->fs_id[keep++] = a->fs_id[j];
        }
    }
    a->n_fs = keep;
    a->fs_t[a->n_fs] = t;
    a->fs_id[a->n_fs++] = id;
    r->holds[t]++;
    a->owner[t] = id;
    a->out.pinned = r_add(r, a->out.pinned, pow2_up(bytes));
    a->out.pcie = r_add(r, a->out.pcie, bytes);
    return true;
}

static bool aoff_in_fs(const struct rp_aoff *a, int t)
{
    for (size_t j = 0; j < a->n_fs; j++)
        if (a->fs_t[j] == t)
            return true;
    return false;
}

/* The copy back of offloaded tensor t into the backward stash (unless the forward stash still
 * has it).  A device copy still live (the batch's input ids) is not counted twice. */
static void aoff_reload(struct rp *r, int t)
{
    struct rp_aoff *a = r->ao;
    if (aoff_in_fs(a, t))
        return;
    t_alloc(r, t);
    r->holds[t]++;
    a->bs[a->n_bs++] = t;
    a->out.pcie = r_add(r, a->out.pcie, r->p->tensors[t].bytes);
}

/* The hook after a node that unpacked an offloaded tensor: its own reloads (from index prev on)
 * stay unless a recompute saved them; the forward stash and the node before's reloads go. */
static void aoff_hook(struct rp *r, size_t prev)
{
    struct rp_aoff *a = r->ao;
    for (size_t j = 0; j < prev; j++)
        aoff_hold(r, a->bs[j], -1);
    size_t keep = 0;
    for (size_t j = prev; j < a->n_bs; j++) {
        int t = a->bs[j];
        if (r->saved[t] > 0)
            aoff_hold(r, t, -1);
        else
            a->bs[keep++] = t;
    }
    a->n_bs = keep;
    for (size_t j = 0; j < a->n_fs; j++)
        aoff_hold(r, a->fs_t[j], -1);
    a->n_fs = 0;
}

/* The end of backward (queue_callback) and the context's exit: both stashes dropped. */
static void aoff_end(struct rp *r)
{
    if (!r->ao)
        return;
    aoff_hook(r, r->ao->n_bs);
}

/* n's saved[j] holds no saved reference (offloaded, and not packed again by the node). */
static bool aoff_offloaded(const struct rp *r, const struct mp_node *n, int j)
{
    size_t k = (size_t)(n - r->p->nodes);
    return r->ao && (r->ao->offm[k] >> j & 1u) && !(r->ao->dupm[k] >> j & 1u);
}

/* Node k's packs in the forward, in torch's order.  One per saved tensor, except HF's RMSNorm
 * composite (transformers 5.24 LlamaRMSNorm.forward): pow saves the fp32 input, rsqrt its result,
 * the product saves both again (kept: their storages are tracked), the weight's product saves the
 * weight (a parameter: its id only, :237-242) and, when the weight trains, the normalized x. */
static void aoff_node(struct rp *r, size_t k)
{
    struct rp_aoff *a = r->ao;
    const struct mp_node *n = &r->p->nodes[k];
    bool norm = n->prim == MP_P_RMSNORM;
    for (int pass = 0; pass < (norm ? 3 : 1); pass++)
        for (int j = 0; j < n->n_saved; j++) {
            int t = n->saved[j];
            bool normed = false;
            for (int e = 0; norm && e < n->n_extra; e++)
                normed |= n->extra[e] == t && n->extra_role[e] == MP_XR_NORMED;
            if (norm && (pass == 2) != normed)
                continue;
            if (pass == 2 && j == 0)
                a->id++; /* (the weight) */
            if (pass == 1 && !(a->offm[k] >> j & 1u)) { /* the product's second pack: kept as the
                                                           * first was (small), nothing more */
                a->id++;
            } else if (pass == 1) { /* tracked: kept on the device, a saved reference */
                (void)aoff_pack(r, t); /* (its stash entry is younger than 5 packs) */
                r->saved[t]++;
                a->dupm[k] |= 1u << j;
            } else if (aoff_pack(r, t)) {
                a->offm[k] |= 1u << j; /* (its device copy: the forward stash's) */
            } else {
                r->saved[t]++;
            }
        }
}

/* TRL's fused head (--loss chunked-nll, trl 1.16.0 trainer/utils.py _fused_forward): it reads
 * lm_head.weight and never calls lm_head, so no NoOpManager scope; its packs, in torch's order
 * (bench trace, act_offload.py): IndexBackward0's bool mask, ChunkedLogProbFunction's
 * save_for_backward (kernels/chunked_logprob.py:386: hidden, the weight (a parameter: its id
 * only), bias None (no pack), targets, log_z, entropy), then the mask again for each output
 * scattered with a gradient (utils.py:1658, log_probs' and entropy's MaskedScatterBackward0).
 * The entropy's scatter never runs in backward (the loss uses log_probs only), so its pack stays
 * in the tracker until the next step's __enter__ (activation_offloading.py:592).  The node's
 * saved[]: the mask, hidden, targets, log_z, entropy (lower_embed_head.c trl_nll). */
static bool aoff_fused_head(const struct rp *r, const struct mp_node *n)
{
    return n->prim == MP_P_FUSED_LOSS && r->p->opts.loss == MP_LOSS_CHUNKED_NLL;
}

static void aoff_fused(struct rp *r, size_t k)
{
    struct rp_aoff *a = r->ao;
    const struct mp_node *n = &r->p->nodes[k];
    for (int j = 0; j < n->n_saved; j++) {
        if (j == 2)
            a->id++; /* (the weight) */
        if (aoff_pack(r, n->saved[j]))
            a->offm[k] |= 1u << j;
        else
            r->saved[n->saved[j]]++;
    }
    int m = n->saved[0];
    a->mask_off = aoff_pack(r, m); /* log_probs' scatter: its unpack empties the forward stash */
    a->mask_kept = m;
    r->holds[m] += 1 + !a->mask_off; /* entropy's pack (never unpacked); log_probs' when kept */
    (void)aoff_pack(r, m); /* (entropy's: tracked or small, so kept) */
}

/* The fused head's backward: MaskedScatterBackward0 (log_probs') unpacks the mask's second pack
 * and, when it was offloaded, its hook empties the forward stash; ChunkedLogProbFunctionBackward
 * reloads hidden, targets, log_z and entropy; IndexBackward0 the mask's first pack, and its hook
 * drops the function's reloads.  The bench's trace shows this order.  The replay holds every
 * reload through the node's one backward moment; returns the backward stash index the hook after
 * the node keeps from (SIZE_MAX: no unpacking node). */
static size_t aoff_fused_bwd(struct rp *r, size_t k)
{
    struct rp_aoff *a = r->ao;
    const struct mp_node *n = &r->p->nodes[k];
    if (a->mask_off) {
        size_t prev = a->n_bs;
        aoff_reload(r, a->mask_kept);
        aoff_hook(r, prev);
    }
    size_t p1 = a->n_bs, ret = SIZE_MAX;
    for (int j = 1; j < n->n_saved; j++)
        if (a->offm[k] >> j & 1u) {
            aoff_reload(r, n->saved[j]);
            ret = p1;
        }
    if (a->offm[k] & 1u) {
        ret = a->n_bs;
        aoff_reload(r, n->saved[0]);
    }
    return ret;
}

/* The end of the step: the next step's __enter__ clears the tracker (activation_offloading.py
 * :592): the fused head's kept mask goes. */
static void aoff_step_end(struct rp *r)
{
    struct rp_aoff *a = r->ao;
    if (a && a->mask_kept >= 0) {
        aoff_hold(r, a->mask_kept, -1);
        a->mask_kept = -1;
    }
}

/* Pinned host bytes the step needs, every offloaded x_i being alive at the loss; *copied: their
 * bytes (each crosses PCIe twice).  The host caching allocator rounds each request up to a power
 * of two (torch 2.15 include/ATen/core/CachingHostAllocator.h:343-352; the threshold defaults to
 * SIZE_MAX, c10/core/AllocatorConfig.h:360).  UINT64_MAX on overflow. */
uint64_t replay_pinned_bytes(const struct mp_program *p, const struct mp_schedule *s, uint64_t *copied)
{
    uint64_t b = 0, c = 0;
    for (size_t k = 0; s && s->offload && k < s->n; k++) {
        if (s->ops[k].kind != MP_SCHED_FC)
            continue;
        uint64_t x = p->tensors[p->blocks[s->ops[k].index].input].bytes, r = 1;
        while (r < x && r <= UINT64_MAX / 2)
            r *= 2;
        if (r < x || !mp_add_u64(b, r, &b) || !mp_add_u64(c, x, &c))
            return UINT64_MAX;
    }
    *copied = c;
    return b;
}

/* torchtitan's SelectiveAC (docs/checkpointing.md#sac-torchtitan; pytorch/torchtitan b5bcd76c6
 * torchtitan/distributed/activation_checkpoint.py): its policy MUST_SAVEs the outputs of torch's
 * compute-intensive ops (torch/_functorch/partitioners.py get_default_op_list: mm, addmm, bmm, the
 * SDPA flash / memory-efficient kernels, ...) and of SDPA's cudnn kernel (:31-93), except every
 * second aten.mm counted per checkpoint call (:258-273: the count goes up before the test, so the
 * 1st, 3rd, ... are saved).  A Linear without a bias is one aten.mm (F.linear on a 3-D input:
 * matmul's mm), one with a bias aten.addmm (torch 2.15 aten/src/ATen/native/Linear.cpp linear:
 * _flatten_nd_linear or addmm), saved and not counted; peft's lora_A and lora_B are Linears of
 * their own, run after their base.  The fused SDPA node keeps its output and logsumexp as for
 * TRL's policy.  Eager attention's bmm, MoE and quantized weights are refused (setup.c). */
static bool titan_keeps(const struct mp_program *p, size_t k)
{
    const struct mp_node *n = &p->nodes[k];
    if (n->prim == MP_P_ATTN)
        return !n->eager;
    if (n->prim != MP_P_LINEAR)
        return false;
    if (n->param[1] >= 0)
        return true; /* aten.addmm */
    const struct mp_block_prog *bp = &p->blocks[n->block];
    size_t mm = 0; /* torchtitan's forward_mm_count after this op */
    for (size_t q = bp->node0; q <= k; q++)
        mm += p->nodes[q].prim == MP_P_LINEAR && p->nodes[q].param[1] < 0;
    return mm % 2 == 1;
}

/* Selective activation checkpointing (docs/checkpointing.md#sac).  torch 2.15
 * torch/utils/checkpoint.py: in a checkpointed region's forward _CachingTorchDispatchMode (:1571)
 * runs every ATen op and stores the outputs of those the policy saves, detached (their storages,
 * :1666-1672); in the recompute _CachedTorchDispatchMode (:1686) returns them in place of running
 * the op and drops its entry (:1729-1731: _CONSUMED), so from then on only autograd's saved
 * tensors hold them.  TRL 1.16's policy (trl/models/selective_activation_checkpointing.py:26-48)
 * MUST_SAVEs the SDPA kernels' ops and recomputes the rest: memplan's fused SDPA node (eager
 * attention and SDPA's math path run other ops: nothing kept).  Their outputs on CUDA: the
 * attention output and the fp32 logsumexp (the node's out and its MP_XR_LSE extra); the flash and
 * memory-efficient kernels' philox seed and offset are host tensors without dropout, cum_seq_q/k
 * undefined and the debug mask empty (docs/memory-facts.md#sac-sdpa-outputs).  Only a node before
 * the block's last pack can be reached by the recompute (early stop). */
bool replay_sac_keeps(const struct mp_program *p, enum mp_sac_policy pol, uint64_t keep, size_t k)
{
    const struct mp_node *n = &p->nodes[k];
    if (n->block < 0)
        return false;
    if (pol == MP_SAC_TORCHTITAN) /* (no early stop: every node is reached) */
        return titan_keeps(p, k);
    if (k >= last_pack_end(p, (size_t)n->block))
        return false;
    int j;
    switch (pol) {
    case MP_SAC_TRL:
    case MP_SAC_AXOLOTL: return n->prim == MP_P_ATTN && !n->eager; /* (Axolotl's: no sliding layer, setup.c) */
    case MP_SAC_AUTO: return (j = mp_sac_candidate(p, k, NULL)) >= 0 && j < 64 && (keep >> j & 1);
    case MP_SAC_NONE:
    case MP_SAC_TORCHTITAN: return false;
    }
    return false;
}

/* Are block i's Linears all plain matmuls of trained weights (torch sees each as one aten.mm:
 * F.linear without a bias on a 3-D input is matmul's mm, torch 2.15 aten/src/ATen/native/
 * Linear.cpp), none a peft base layer (peft adds the adapters' sum to its output) or quantized? */
static bool block_plain_mm(const struct mp_program *p, size_t i)
{
    const struct mp_block_prog *bp = &p->blocks[i];
    for (size_t k = bp->node0; k < bp->node0 + bp->n_nodes; k++) {
        const struct mp_node *n = &p->nodes[k];
        if (n->prim != MP_P_LINEAR)
            continue;
        if (n->param[1] >= 0 || n->n_fops || n->quantized || n->param[0] < 0 || !p->params[n->param[0]].trainable ||
            p->params[n->param[0]].adapter)
            return false;
    }
    return true;
}

/* MP_SAC_AUTO's candidates: the fused SDPA call, and where block_plain_mm holds each Linear's
 * aten.mm, before the node whose pack stops the recompute (an op at the stop is never reached by
 * it, so its stored output would not be handed back).  Node k's ordinal among its block's
 * candidates, or -1.  *mm (may be NULL): a Linear's ordinal among the block's Linears (the aten.mm
 * calls torch counts), -1 for SDPA. */
int mp_sac_candidate(const struct mp_program *p, size_t k, int *mm)
{
    const struct mp_node *n = &p->nodes[k];
    if (mm)
        *mm = -1;
    if (n->block < 0)
        return -1;
    const struct mp_block_prog *bp = &p->blocks[n->block];
    size_t end = last_pack_end(p, (size_t)n->block);
    bool plain = block_plain_mm(p, (size_t)n->block);
    int j = 0, m = 0;
    for (size_t q = bp->node0; q < bp->node0 + bp->n_nodes && q + 1 < end; q++) {
        const struct mp_node *c = &p->nodes[q];
        bool cand = (c->prim == MP_P_ATTN && !c->eager) || (c->prim == MP_P_LINEAR && plain);
        if (q == k) {
            if (mm && c->prim == MP_P_LINEAR)
                *mm = m;
            return cand ? j : -1;
        }
        j += cand;
        m += c->prim == MP_P_LINEAR;
    }
    return -1;
}



/* The tensors SAC keeps of node n: its output and the logsumexp. */
static int sac_outputs(const struct mp_node *n, int out[1 + MP_NODE_EXTRA_MAX])
{
    int m = 0;
    out[m++] = n->out;
    for (int e = 0; e < n->n_extra; e++)
        if (n->extra_role[e] == MP_XR_LSE)
            out[m++] = n->extra[e];
    return m;
}

void mp_sac_block(const struct mp_program *p, enum mp_sac_policy pol, uint64_t keep, size_t i, uint64_t *bytes,
                      double *flops)
{
    const struct mp_block_prog *bp = &p->blocks[i];
    uint64_t b = 0;
    double f = 0;
    for (size_t k = bp->node0; pol != MP_SAC_NONE && k < bp->node0 + bp->n_nodes; k++) {
        if (!replay_sac_keeps(p, pol, keep, k))
            continue;
        int t[1 + MP_NODE_EXTRA_MAX], m = sac_outputs(&p->nodes[k], t);
        for (int j = 0; j < m; j++)
            if (t[j] >= 0 && !mp_add_u64(b, p->tensors[t[j]].bytes, &b))
                b = UINT64_MAX;
        f += p->nodes[k].fwd_flops;
    }
    *bytes = b;
    *flops = f;
}

double replay_sac_recompute(const struct mp_program *p, const struct mp_schedule *s, size_t i, struct mp_estimate *e)
{
    uint64_t b = 0;
    double f = 0;
    if (!s || s->sac == MP_SAC_NONE)
        return 0;
    mp_sac_block(p, s->sac, s->sac_keep, i, &b, &f);
    e->sac_policy = s->sac;
    e->sac_keep = s->sac_keep;
    if (b) {
        e->sac_layer_bytes = mp_max_u64(e->sac_layer_bytes, b);
        e->sac_layers++;
    }
    return f;
}

double replay_stop_skips(const struct mp_program *p, const struct mp_schedule *s, size_t i)
{
    const struct mp_block_prog *bp = &p->blocks[i];
    size_t end = last_pack_end(p, i), all = bp->node0 + bp->n_nodes;
    if ((s && s->sac == MP_SAC_TORCHTITAN) || end <= bp->node0)
        return 0;
    if (packs_before_run(&p->nodes[end - 1]))
        end--; /* (the stop is at its pack, before it runs) */
    double f = 0;
    for (size_t k = end; k < all; k++)
        if (!s || s->sac == MP_SAC_NONE || !replay_sac_keeps(p, s->sac, s->sac_keep, k))
            f += p->nodes[k].fwd_flops;
    return f;
}

/* The hold SAC's cache has on node n's outputs: taken after the node ran in a checkpointed block's
 * first forward (d +1), dropped where its recompute reaches the node (d -1). */
static void sac_hold(struct rp *r, const struct mp_node *n, int d)
{
    int t[1 + MP_NODE_EXTRA_MAX], m = sac_outputs(n, t);
    for (int j = 0; j < m; j++)
        if (t[j] >= 0) {
            r->holds[t[j]] += d;
            if (d < 0)
                t_maybe_free(r, t[j]);
        }
}

/* Forward of block i; kind FE records for backward, FN/FC do not.  early: the recompute right
 * before block i's backward (docs/checkpointing.md#early-stop).  Torch's non-reentrant checkpoint
 * starts it at the first unpack, so the backward of the block's trailing nodes that save nothing
 * (the residual add, casts, peft's scaling) runs first and the gradients they make live through
 * it; it stops at the pack of the last tensor the first forward saved: the ops after the block's
 * last saving op do not run again, its output is not remade, and until the raise every Python
 * frame still holds what the block's remaining ops would read and the locals of the modules they
 * would end (mp_node.locals); the raise drops them. */
static void fwd_block(struct rp *r, size_t i, enum mp_sched_kind kind, bool early)
{
    const struct mp_program *p = r->p;
    const struct mp_block_prog *bp = &p->blocks[i];
    bool grad = kind == MP_SCHED_FE;
    size_t all = bp->node0 + bp->n_nodes, end = all, unpack = all;
    if (early && grad && last_pack_end(p, i) > bp->node0)
        unpack = last_pack_end(p, i);
    /* torchtitan's checkpoint runs with early_stop=False (its SelectiveAC, activation_checkpoint.py
     * :285): the recompute still starts at the first unpack but runs the whole block; each frame
     * lets go of its locals as its module returns, and the block's output, which recompute_fn
     * drops, dies after the last node (torch 2.15 torch/utils/checkpoint.py:1313, :1368) */
    bool whole = r->sac == MP_SAC_TORCHTITAN && r->ckpt[i];
    if (!whole)
        end = unpack;
    bool stopped = end < all;
    if (unpack < all) { /* the trailing nodes' backward, before the recompute */
        enum mp_phase ph = r->phase;
        r->phase = MP_PH_BACKWARD;
        size_t k = all;
        while (k > unpack && r->st == MP_OK) {
            const struct mp_node *n = &p->nodes[k - 1];
            if (n->param[0] >= 0 || n->param[1] >= 0 || n->ep_unit)
                break; /* a node with parameters saves its input or has none that needs a
                          gradient: never trailing in a block memplan lowers; its parameter
                          gradients and the data-parallel hooks belong to B_i (so do an --ep
                          experts module's: its pre-backward fires on its output's gradient) */
            bwd_node(r, i, --k);
        }
        r->bwd_next = k;
        r->phase = ph;
    }
    if (grad && r->phase == MP_PH_RECOMPUTE)
        r->recomp[i] = true;
    if (grad && r->phase == MP_PH_RECOMPUTE && r->ckpt[i] && r->offload) /* the first unpack */
        offload_input(r, i, false);
    struct rp_aoff *ao = r->ao;
    bool packing = ao && grad && r->phase == MP_PH_FORWARD;
    if (ao && kind == MP_SCHED_FC && r->phase == MP_PH_FORWARD) /* the checkpoint's save_inputs */
        ao->xoff[i] = aoff_pack(r, bp->input);
    if (ao && grad && r->phase == MP_PH_RECOMPUTE && r->ckpt[i] && ao->xoff[i]) {
        /* the recompute's first unpack: x_i copied back inside the backward of the block's first
         * node that unpacks (its hook: aoff_hook), held by unpack_hook's args through the recompute */
        size_t first = last_pack_end(p, i);
        ao->trigger = first > bp->node0 ? (int)first - 1 : -1;
        ao->trigger_prev = ao->n_bs;
        aoff_reload(r, bp->input);
        offload_input(r, i, false);
    }
    /* The frame locals (mp_node.locals) are held in a recompute, where they set the peak at its
     * stop; in the first forward they only stretch transients, left as they were (the caching
     * allocator model's reserved bytes move by up to 17 % with them, unmeasured). */
    bool frames = r->phase == MP_PH_RECOMPUTE || (r->t->ref_pass && kind == MP_SCHED_FN);
    for (size_t k = bp->node0; k < all; k++)
        node_uses(r, &p->nodes[k], 1, true, frames);
    /* A whole forward under torch.no_grad (DPO's reference) frees a tensor when the model's Python
     * lets go of it (transformers 5.24 modeling_llama.py LlamaModel.forward, the pattern of every
     * causal LM): `inputs_embeds` keeps the token embedding until the backbone returns, its final
     * norm; a decoder layer's input is the caller's `hidden_states` until the layer returns (its
     * end); and `hidden_states = self.norm(hidden_states)` drops the last layer's output once the
     * norm has run: the head's input dies with its last use.  The GPU kit's live-at-peak (H200,
     * 2026-11-28) showed all three at the reference's peak in a layer's MLP. */
    bool ref = r->t->ref_pass && kind == MP_SCHED_FN;
    bool head = i + 1 == p->n_blocks;
    bool drop_early = ref && head && !r->ckpt[i] && r->holds[bp->input] > 0 && bp->n_nodes > 0;
    if (drop_early)
        r->holds[bp->input]--;
    for (size_t k = bp->node0; k < end && r->st == MP_OK; k++) {
        const struct mp_node *n = &p->nodes[k];
        r->node = (int)k;
        par_pre_node(r, k);
        bool before = stopped && k + 1 == end && packs_before_run(n); /* the stop before n runs */
        /* SAC: a kept op's first forward leaves its outputs held; its recompute hands them back */
        bool keep = r->sac != MP_SAC_NONE && replay_sac_keeps(p, r->sac, r->sac_keep, k) &&
                    (kind == MP_SCHED_FC || (grad && r->phase == MP_PH_RECOMPUTE && r->ckpt[i])),
             cached = keep && kind != MP_SCHED_FC;
        if (n->fwd_tmp_first && !cached) { /* (an HF composite: its transients' blocks go to what it keeps) */
            tmp(r, (int)k, n->fwd_tmp_bytes, true);
            tmp(r, (int)k, n->fwd_tmp_bytes, false);
        }
        if (n->out != n->in[0] && !fop_makes(p, n, n->out) && !before)
            t_alloc(r, n->out);
        for (int j = 0; j < n->n_extra; j++)
            if (!fop_makes(p, n, n->extra[j]))
                t_alloc(r, n->extra[j]);
        /* torch.autocast caches the half copy of every weight it casts (leaf, requires grad)
         * until the autocast region ends, after the loss: under checkpointing the copies of
         * every checkpointed layer outlive their no-grad forward (autocast_mode.cpp cached_cast) */
        if (n->wcopy >= 0 && r->phase == MP_PH_FORWARD && !r->cached[n->wcopy] && !params_sharded(r) &&
            (!r->t->ref_pass || r->t->gen_pass)) {
            r->cached[n->wcopy] = true;
            r->holds[n->wcopy]++;
        }
        /* use_cache: the DynamicCache keeps its k/v copies until the model's forward returns */
        if (n->kv_cached && r->phase == MP_PH_FORWARD && !r->cached[n->out]) {
            r->cached[n->out] = true;
            r->holds[n->out]++;
        }
        /* the rotary tables and the attention mask: made once per forward by the model and
         * used by every layer (checkpoint inputs under checkpointing): held until this block's
         * backward */
        const int shared[2] = {p->rope_tables, p->attn_mask};
        for (int j = 0; j < 2; j++)
            if (shared[j] >= 0 && r->phase == MP_PH_FORWARD && r->shared_block[j] < 0 &&
                node_makes(n, shared[j])) {
                r->shared_block[j] = (int)i;
                r->holds[shared[j]]++;
            }
        hold_made(r, n);
        if (ref && n->prim == MP_P_EMBED && r->ref_embeds < 0 && !head) {
            r->ref_embeds = n->out;
            r->holds[n->out]++;
        }
        if (grad && packing && aoff_fused_head(r, n))
            aoff_fused(r, k);
        else if (grad && packing && (int)k != ao->noop)
            aoff_node(r, k);
        else if (grad)
            for (int j = 0; j < n->n_saved; j++)
                r->saved[n->saved[j]]++;
        if (before) { /* the raise at its last pack; the executors still need what the op makes
                       * (autocast's weight copy): it runs after the frames let go of their locals
                       * (its arguments stay until it ran) */
            for (size_t kk = end; kk < all; kk++)
                node_uses(r, &p->nodes[kk], -1, true, frames);
            node_uses(r, n, -1, false, frames);
            if (n->out != n->in[0] && !fop_makes(p, n, n->out))
                t_alloc(r, n->out);
        }
        if (cached)
            sac_hold(r, n, -1);
        else if (!n->fwd_tmp_first)
            tmp(r, (int)k, n->fwd_tmp_bytes, true);
        if (cached)
            ; /* not run: the cache's tensors are its outputs */
        else if (n->n_fops)
            fwd_ops(r, n, (int)k, grad);
        else
            emit_fwd(r, (int)k, grad, 0);
        if (!n->fwd_tmp_first && !cached)
            tmp(r, (int)k, n->fwd_tmp_bytes, false);
        if (keep && !cached)
            sac_hold(r, n, 1);
        if (k + 1 == all && !stopped && !(whole && unpack < all))
            r->holds[bp->output]++; /* the chain holds x_{i+1} before anything can free it */
        node_uses(r, n, -1, true, frames && !before);
        for (int j = 0; j < n->n_extra; j++)
            t_maybe_free(r, n->extra[j]);
        t_maybe_free(r, n->out);
        par_post_node(r, k);
        if (ref && head && r->ref_embeds >= 0) { /* the backbone returned: its final norm ran */
            r->holds[r->ref_embeds]--;
            t_maybe_free(r, r->ref_embeds);
            r->ref_embeds = -1;
        }
        if (stopped && k + 1 == end && !before) /* the raise after n ran */
            for (size_t kk = end; kk < all; kk++)
                node_uses(r, &p->nodes[kk], -1, true, frames);
    }
    if (bp->n_nodes == 0)
        r->holds[bp->output]++;
    r->node = -1;
    if (r->phase == MP_PH_FORWARD)
        release_held_fwd(r, i);
    /* The chain's hold on x_i: Fc keeps it until B_i (a checkpoint); Fn and a
     * plain Fe release it (autograd keeps x_i only if a node saved it); an Fe
     * that recomputes a checkpointed block leaves it for B_i. */
    if (kind == MP_SCHED_FC) {
        r->ckpt[i] = true;
        if ((r->offload || (ao && ao->xoff[i])) && r->holds[bp->input] > 0)
            offload_input(r, i, true);
    } else if (!drop_early && !r->ckpt[i] && r->holds[bp->input] > 0) {
        r->holds[bp->input]--;
        t_maybe_free(r, bp->input);
    }
}

/* Backward of node n is done with what it saved. */
static void release_saved(struct rp *r, const struct mp_node *n)
{
    for (int j = 0; j < n->n_saved; j++) {
        int t = n->saved[j];
        if (aoff_offloaded(r, n, j))
            continue; /* (no saved reference: the backward stash holds its copy) */
        if (r->saved[t] > 0)
            r->saved[t]--;
        t_maybe_free(r, t);
    }
}

/* Releases n's saved tensor t (once: released[] marks n->saved[] entries already released). */
static void release_saved_one(struct rp *r, const struct mp_node *n, int t, bool *released)
{
    for (int j = 0; j < n->n_saved; j++)
        if (n->saved[j] == t && !released[j] && !aoff_offloaded(r, n, j)) {
            released[j] = true;
            if (r->saved[t] > 0)
                r->saved[t]--;
            t_maybe_free(r, t);
        }
}

/* The backward of node k that autograd runs as several ops (layers.h mp_subop): each op's
 * gradient appears before it runs; its input buffer, the saved tensors of its autograd node
 * and the output gradient die after it as the op says. */
static void bwd_ops(struct rp *r, const struct mp_node *n, int k)
{
    const struct mp_program *p = r->p;
    bool released[MP_NODE_SAVED_MAX] = {false};
    for (int i = 0; i < n->n_bops && r->st == MP_OK; i++) {
        const struct mp_subop *s = &p->subops[n->bop0 + i];
        if (s->dst >= 0)
            g_alloc(r, s->dst);
        else if (s->grad >= 0)
            g_alloc(r, n->in_grad_part[s->grad] >= 0 ? n->in_grad_part[s->grad] : n->in[s->grad]);
        if (r->st == MP_OK) {
            struct mp_event ev = {.kind = MP_EV_BWD, .store = MP_ST_TMP, .id = k, .node = k, .phase = r->phase,
                                  .step = i, .grad_of = r->grad_of};
            r->st = r->fn(r->ctx, &ev);
        }
        g_free(r, s->free_buf);
        for (int j = 0; j < 2; j++)
            if (s->release[j] >= 0)
                release_saved_one(r, n, s->release[j], released);
        if (s->free_gout && !node_reads(n, n->out, 3))
            g_free(r, n->out);
    }
    for (int j = 0; j < n->n_saved; j++)
        release_saved_one(r, n, n->saved[j], released);
}

/* Node n's parameter gradients in backward: a first one is allocated (a weight behind an autocast
 * cast: after the node, its index returned, else -1); under accumulation a new one is added to
 * the kept one in place (*incoming: its bytes). */
static int bwd_param_grads(struct rp *r, const struct mp_node *n, uint64_t *incoming)
{
    const struct mp_program *p = r->p;
    int wcast = -1;
    for (int j = 0; j < 2; j++) {
        int q = n->param[j];
        if (q < 0 || !p->params[q].trainable)
            continue;
        if (!r->pglive[q] && j == 0 && (n->prim == MP_P_LINEAR || n->prim == MP_P_GROUPED_MM) &&
            mp_node_tmp(n, true, MP_TR_WGRAD_HALF)) { /* (grouped: Llama 4's autocast bmm) */
            wcast = q;
        } else if (!r->pglive[q]) {
            r->pglive[q] = true;
            emit(r, MP_EV_ALLOC, MP_ST_PGRAD, q, mp_param_grad_bytes(&p->params[q]));
        } else if (r->t->accumulate) {
            *incoming = r_add(r, *incoming, mp_param_grad_bytes(&p->params[q]));
        }
    }
    return wcast;
}

/* The gradient node n makes for each input j: a new storage, its output's own (a residual add:
 * *passed, when it is added to another), added to the gradient the input has (acc[j], the new
 * ones' bytes into *fresh), or made by the engine after the node (late[j]). */
static void bwd_input_grads(struct rp *r, const struct mp_node *n, int acc[3], int late[3], int *passed,
                            uint64_t *fresh)
{
    const struct mp_program *p = r->p;
    for (int j = 0; j < 3 && n->grad_in && !n->n_bops; j++) { /* (bwd_ops makes its own) */
        int g = n->in_grad_part[j] >= 0 ? n->in_grad_part[j] : n->in[j];
        if (!g_wanted(r, g) || g == n->out)
            continue; /* an in-place op's input: its gradient is the output's */
        if (g_passes(r, n, g)) {
            if (g_has(r, g)) {
                acc[j] = g;
                *passed = r->grad_of[n->out];
            } else { /* the same storage */
                r->grad_of[g] = r->grad_of[n->out];
                r->grefs[r->grad_of[g]]++;
            }
            continue;
        }
        bool dup = false; /* one gradient per distinct input (q and k of one tensor) */
        for (int e = 0; e < j; e++)
            dup |= g == (n->in_grad_part[e] >= 0 ? n->in_grad_part[e] : n->in[e]);
        if (dup)
            continue;
        if (!g_has(r, g)) {
            if (n->engine_grad[j])
                late[j] = g;
            else
                g_new(r, g);
            continue;
        }
        acc[j] = g;
        *fresh = r_add(r, *fresh, p->tensors[g].bytes);
    }
}

/* After node k's backward: the fp32 gradient of a weight behind an autocast cast (wcast >= 0), and
 * DDP's bucket view taking the gradients of parameters whose last backward this was. */
static void bwd_after_node(struct rp *r, const struct mp_node *n, size_t k, int wcast)
{
    const struct mp_program *p = r->p;
    /* Under autocast the weight reaches the node through autocast's cast (ToCopyBackward0): the
     * node's gradient for it is the half one (its TMP); that node, run next, makes the fp32
     * gradient AccumulateGrad keeps, after the node released what it saved and its incoming
     * gradient (measured: 9 MiB of ViT-B's fc2 at 64x197 amp) */
    if (wcast >= 0 && r->st == MP_OK) {
        r->pglive[wcast] = true;
        emit(r, MP_EV_ALLOC, MP_ST_PGRAD, wcast, mp_param_grad_bytes(&p->params[wcast]));
        struct mp_event ev = {.kind = MP_EV_WGRAD_CAST, .store = MP_ST_PGRAD, .id = wcast, .node = (int)k,
                              .phase = r->phase, .grad_of = r->grad_of};
        if (r->st == MP_OK)
            r->st = r->fn(r->ctx, &ev);
    }
    if (r->first_use) /* DDP gradient_as_bucket_view: the reducer copies the fresh grad into its
                       * bucket view and drops it once the parameter's last backward ran */
        for (int j = 0; j < 2; j++) {
            int q = n->param[j];
            if (q >= 0 && r->pglive[q] && r->first_use[q] == (int)k) {
                r->pglive[q] = false;
                emit(r, MP_EV_FREE, MP_ST_PGRAD, q, mp_param_grad_bytes(&p->params[q]));
            }
        }
}

/* The backward of node k (of block i). */
static void bwd_node(struct rp *r, size_t i, size_t k)
{
    const struct mp_program *p = r->p;
    const struct mp_node *n = &p->nodes[k];
    r->node = (int)k;
    uint64_t incoming = 0; /* accumulation: the node's new weight gradients, added in place */
    int wcast = -1; /* a weight autocast cast: its fp32 gradient is made after the node */
    if (n->no_grad) { /* not recorded: no backward; nothing saved, no gradient flows */
        if (!node_reads(n, n->out, 3) && !held_leaf(r, n->out))
            g_free(r, n->out);
        return;
    }
    size_t aoff_prev = SIZE_MAX; /* --act-offload: it unpacks an offloaded tensor (aoff_hook) */
    if (r->ao && r->ao->trigger == (int)k) {
        aoff_prev = r->ao->trigger_prev;
        r->ao->trigger = -1;
    }
    bool fused = r->ao && aoff_fused_head(r, n);
    if (fused)
        aoff_prev = aoff_fused_bwd(r, k);
    for (int j = 0; r->ao && !fused && j < n->n_saved; j++)
        if (r->ao->offm[k] >> j & 1u) { /* (a pack kept besides, dupm, is unpacked as it is) */
            if (aoff_prev == SIZE_MAX)
                aoff_prev = r->ao->n_bs;
            aoff_reload(r, n->saved[j]);
        }
    /* the chunk's backward (SplitBackward0, its own node, run first) cats out's gradient parts */
    if (g_has(r, n->out_parts[0]) || g_has(r, n->out_parts[1])) {
        g_alloc(r, n->out);
        g_free(r, n->out_parts[0]);
        g_free(r, n->out_parts[1]);
    }
    /* Liger's fused loss made its gradients in the forward and kept them: backward hands the
     * same storages on as the gradients (the bytes change hands; nothing new is allocated) */
    if (n->fwd_grads)
        for (int j = 0; j < n->n_extra; j++)
            if (n->extra_role[j] == MP_XR_LOSS_GRAD) {
                bool released[MP_NODE_SAVED_MAX] = {false};
                release_saved_one(r, n, n->extra[j], released);
            }
    wcast = bwd_param_grads(r, n, &incoming);
    /* the gradient the node makes for each input: a new storage, its output's own (a residual
     * add), or one added after the node to the gradient the input already has */
    int acc[3] = {-1, -1, -1};  /* the tensor whose gradient input j's is added to, -1 none */
    int late[3] = {-1, -1, -1}; /* a new gradient the engine makes after the node (engine_grad) */
    int passed = -1;           /* a residual add's incoming gradient storage, when it is added to
                                  another: the add's outputs hold it until then */
    uint64_t fresh = 0;        /* the new gradients to be added: tensors until then (TMP) */
    bool oop = false;
    bwd_input_grads(r, n, acc, late, &passed, &fresh);
    /* Out of place when, once the node's incoming gradient is released, another tensor's
     * gradient is in the same storage (or the node's outputs still hold it: x + x). */
    int out_s = g_has(r, n->out) && !node_reads(n, n->out, 3) ? r->grad_of[n->out] : -1;
    for (int j = 0; j < 3; j++)
        if (acc[j] >= 0) {
            int s = r->grad_of[acc[j]];
            oop |= r->grefs[s] - (s == out_s) + (s == passed) > 1;
        }
    uint64_t btmp = r_add(r, r_add(r, n->bwd_tmp_bytes, fresh), incoming);
    tmp(r, (int)k, btmp, true);
    if (n->n_bops) {
        bwd_ops(r, n, (int)k);
    } else if (r->st == MP_OK) {
        struct mp_event ev = {.kind = MP_EV_BWD, .store = MP_ST_TMP, .id = (int)k, .node = (int)k,
                              .phase = r->phase, .grad_of = r->grad_of, .grad_out_of_place = oop};
        r->st = r->fn(r->ctx, &ev);
    }
    /* torch's non-reentrant checkpoint hands the node the recomputed tensors and drops its own
     * reference as it does (checkpoint.py unpack_hook: holder.handles[gid] = None): they die
     * with the node's backward, before the engine makes the gradients it casts or sums
     * (validate_outputs); a tensor autograd saved itself lives until release_variables, after
     * that.  (Bench: the MoE routing-weights MulBackward0 under `layers`, pure bf16.) */
    if (r->recomp[i] && !n->n_bops)
        release_saved(r, n);
    for (int j = 0; j < 3; j++)
        if (late[j] >= 0 && !g_has(r, late[j]))
            g_new(r, late[j]);
    if (!r->recomp[i] && !n->n_bops) /* (bwd_ops released them op by op) */
        release_saved(r, n);
    if (passed >= 0)
        r->grefs[passed]++;
    if (!node_reads(n, n->out, 3))
        g_free(r, n->out);
    for (int j = 0; j < 3; j++) {
        int g = acc[j];
        if (g < 0 || r->grefs[r->grad_of[g]] == 1)
            continue; /* in place: old += new */
        int old = r->grad_of[g]; /* out of place: old + new, then the old storage loses g */
        g_new(r, g);
        g_unref(r, old);
    }
    if (passed >= 0)
        g_unref(r, passed);
    bwd_after_node(r, n, k, wcast);
    tmp(r, (int)k, btmp, false);
    if (fused && !r->ao->mask_off) /* (log_probs' kept pack: unpacked, dropped from the tracker) */
        aoff_hold(r, r->ao->mask_kept, -1);
    if (aoff_prev != SIZE_MAX)
        aoff_hook(r, aoff_prev);
}

static void bwd_block(struct rp *r, size_t i)
{
    const struct mp_program *p = r->p;
    const struct mp_block_prog *bp = &p->blocks[i];
    /* (an early recompute ran the trailing nodes' backward: fwd_block) */
    size_t k = r->bwd_next != SIZE_MAX ? r->bwd_next : bp->node0 + bp->n_nodes;
    r->bwd_next = SIZE_MAX;
    while (k > bp->node0 && r->st == MP_OK) {
        par_pre_bwd_node(r, k - 1);
        bwd_node(r, i, --k);
        par_post_bwd_node(r, k);
    }
    r->node = -1;
    r->recomp[i] = false;
    if (bp->output != bp->input) /* a block of views (flatten) passes its gradient on to block i-1 */
        g_free(r, bp->output);
    /* A hold left on x_{i+1} comes from recomputing block i (B_{i+1} already ran):
     * B_i consumes that recomputed output (rotor: B_i frees xb_{i+1}). */
    while (r->holds[bp->output] > 0 && bp->output != bp->input) {
        r->holds[bp->output]--;
        t_maybe_free(r, bp->output);
    }
    if (r->ckpt[i] && r->holds[bp->input] > 0) {
        r->ckpt[i] = false;
        r->holds[bp->input]--;
        t_maybe_free(r, bp->input);
    }
    const int shared[2] = {p->rope_tables, p->attn_mask};
    for (int j = 0; j < 2; j++)
        if (r->shared_block[j] == (int)i) {
            r->shared_block[j] = -1;
            r->holds[shared[j]]--;
            t_maybe_free(r, shared[j]);
        }
    release_held(r, (int)i);
}

static void loss_op(struct rp *r)
{
    const struct mp_program *p = r->p;
    int out = p->blocks[p->n_blocks - 1].output;
    r->phase = MP_PH_LOSS;
    /* the attention mask is a local of the model's forward: unless the block that first used it
     * is a checkpoint (whose inputs hold it until its backward), it dies with the forward */
    if (p->attn_mask >= 0 && r->shared_block[1] >= 0 && !r->ckpt[r->shared_block[1]]) {
        r->shared_block[1] = -1;
        r->holds[p->attn_mask]--;
        t_maybe_free(r, p->attn_mask);
    }
    release_held(r, -1);
    /* the autocast region ends with the forward (loss included), before backward:
     * its cache of weight copies is cleared */
    for (size_t t = 0; t < p->n_tensors; t++)
        if (r->cached[t]) {
            r->cached[t] = false;
            r->holds[t]--;
            t_maybe_free(r, (int)t);
        }
    if (r->st == MP_OK) {
        g_alloc(r, out);
        struct mp_event ev = {.kind = MP_EV_LOSS_GRAD, .store = MP_ST_GRAD, .id = out, .node = -1,
                              .phase = r->phase, .grad_of = r->grad_of};
        r->st = r->fn(r->ctx, &ev);
    }
    /* the loss frees a plain x_L (docs/checkpointing.md#loss-frees-xl): nothing saved holds it */
    if (r->holds[out] > 0 && r->saved[out] == 0) {
        r->holds[out]--;
        t_maybe_free(r, out);
    }
}

/* The optimizer step's temporaries (kind ALLOC or FREE): per trainable parameter q (foreach),
 * tmp_of[q] x ps bytes (sharded) or its gradient's size; else one of otmp bytes (if any). */
static void opt_tmps(struct rp *r, enum mp_ev_kind kind, bool per_param, const uint64_t *tmp_of, uint64_t ps,
                     uint64_t otmp)
{
    const struct mp_program *p = r->p;
    if (per_param) {
        for (size_t q = 0; q < p->n_params; q++)
            if (p->params[q].trainable)
                emit(r, kind, MP_ST_OPT_TMP, (int)q, tmp_of ? tmp_of[q] * ps : mp_param_grad_bytes(&p->params[q]));
    } else if (otmp)
        emit(r, kind, MP_ST_OPT_TMP, 0, otmp);
}

enum mp_status mp_replay(const struct mp_program *p, const struct mp_schedule *sched, const struct mp_train_opts *t,
                         mp_event_fn fn, void *ctx, struct mp_diag *d)
{
    return replay_plan(p, sched, t, NULL, fn, ctx, d);
}

/* --act-offload's state; the lm_head is the head block's last Linear (get_act_offloading_ctx_manager
 * wraps `lm_head` in a NoOpManager, activation_offloading.py:717-720). */
static enum mp_status aoff_alloc(struct rp *r)
{
    const struct mp_program *p = r->p;
    size_t nt = p->n_tensors ? p->n_tensors : 1, nb = p->n_blocks ? p->n_blocks : 1;
    size_t most = (p->n_nodes + 1) * MP_NODE_SAVED_MAX + nb; /* every pack reloaded once */
    struct rp_aoff *a = calloc(1, sizeof *a);
    if (!a)
        return mp_fail(r->d, MP_ERR_NOMEM, "out of memory replaying the training step");
    r->ao = a;
    a->offm = calloc(p->n_nodes ? p->n_nodes : 1, sizeof *a->offm);
    a->dupm = calloc(p->n_nodes ? p->n_nodes : 1, sizeof *a->dupm);
    a->xoff = calloc(nb, sizeof *a->xoff);
    a->owner = calloc(nt, sizeof *a->owner);
    a->fs_t = calloc(AOFF_STASH + 1, sizeof *a->fs_t);
    a->fs_id = calloc(AOFF_STASH + 1, sizeof *a->fs_id);
    a->bs = calloc(most, sizeof *a->bs);
    if (!a->offm || !a->dupm || !a->xoff || !a->owner || !a->fs_t || !a->fs_id || !a->bs)
        return mp_fail(r->d, MP_ERR_NOMEM, "out of memory replaying the training step");
    a->noop = a->trigger = a->mask_kept = -1;
    if (p->n_blocks) {
        const struct mp_block_prog *bp = &p->blocks[p->n_blocks - 1];
        for (size_t k = bp->node0; k < bp->node0 + bp->n_nodes; k++)
            if (p->nodes[k].prim == MP_P_LINEAR)
                a->noop = (int)k;
    }
    return MP_OK;
}

static void aoff_free(struct rp_aoff *a)
{
    if (!a)
        return;
    free(a->offm);
    free(a->dupm);
    free(a->xoff);
    free(a->owner);
    free(a->fs_t);
    free(a->fs_id);
    free(a->bs);
    free(a);
}

/* The replay's arrays, and its data-parallel state under a plan (given, else made into plan). */
static enum mp_status rp_alloc(struct rp *r, const struct mp_par_plan *given, struct mp_par_plan *plan)
{
    const struct mp_program *p = r->p;
    const struct mp_train_opts *t = r->t;
    struct mp_diag *d = r->d;
    enum mp_status st = MP_OK;
    size_t nt = p->n_tensors ? p->n_tensors : 1;
    r->live = calloc(nt, sizeof(bool));
    r->grad_of = malloc(nt * sizeof *r->grad_of);
    r->grefs = calloc(nt, sizeof *r->grefs);
    r->is_input = calloc(nt, sizeof(bool));
    r->pglive = calloc(p->n_params ? p->n_params : 1, sizeof(bool));
    r->uses = calloc(nt, sizeof(int));
    r->saved = calloc(nt, sizeof(int));
    r->holds = calloc(nt, sizeof(int));
    r->ckpt = calloc(p->n_blocks ? p->n_blocks : 1, sizeof(bool));
    r->recomp = calloc(p->n_blocks ? p->n_blocks : 1, sizeof(bool));
    r->cached = calloc(nt, sizeof(bool));
    r->ag_held = r->rs_pending = r->bwd_defer = -1;
    if (t->par && t->par->strategy != MP_PAR_NONE) {
        if (!given) {
            st = mp_par_plan_make(t->par, p, t->optimizer, plan, d);
            if (st != MP_OK)
                return st;
        }
        r->pp = given ? given : plan;
        if (r->pp->par.strategy == MP_PAR_DDP && r->pp->par.ddp_grad_as_bucket_view) {
            r->first_use = malloc((p->n_params ? p->n_params : 1) * sizeof *r->first_use);
            if (!r->first_use)
                return mp_fail(d, MP_ERR_NOMEM, "out of memory replaying the training step");
            for (size_t q = 0; q < p->n_params; q++)
                r->first_use[q] = -1;
            for (size_t k = p->n_nodes; k-- > 0;)
                for (int j = 0; j < 2; j++)
                    if (p->nodes[k].param[j] >= 0)
                        r->first_use[p->nodes[k].param[j]] = (int)k;
        }
        size_t ng = r->pp->n_groups ? r->pp->n_groups : 1;
        r->uns = calloc(ng, sizeof(bool));
        r->ag_pending = calloc(ng, sizeof(bool));
        r->rs_out = calloc(ng, sizeof(bool));
        r->borrow_list = calloc(ng, sizeof *r->borrow_list);
        if (!r->uns || !r->ag_pending || !r->rs_out || !r->borrow_list)
            return mp_fail(d, MP_ERR_NOMEM, "out of memory replaying the training step");
    }
    if (!r->live || !r->grad_of || !r->grefs || !r->is_input || !r->pglive || !r->uses || !r->saved || !r->holds ||
        !r->ckpt || !r->recomp || !r->cached)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory replaying the training step");
    for (size_t i = 0; i < nt; i++)
        r->grad_of[i] = -1;
    return t->act_offload && !t->ref_pass ? aoff_alloc(r) : MP_OK;
}

bool mp_workspaces_bytes(const struct mp_train_opts *t, uint64_t *out)
{
    return mp_mul_u64(t->cublas_workspace_bytes, MP_CUBLAS_HANDLES, out);
}

/* Setup: parameters, optimizer state, workspace, the batch. */
static void replay_setup(struct rp *r)
{
    const struct mp_program *p = r->p;
    const struct mp_train_opts *t = r->t;
    r->phase = MP_PH_SETUP;
    for (size_t q = 0; q < p->n_params; q++) {
        uint64_t b = par_param_bytes(r, q);
        if (b)
            emit(r, MP_EV_ALLOC, MP_ST_PARAM, (int)q, b);
    }
    for (size_t q = 0; q < p->n_params && par_opt_per_param(r); q++) {
        uint64_t b = r->pp ? mp_par_opt_state_bytes(r->pp, p, t->optimizer, q)
                          : mp_opt_state_bytes(p, t->optimizer, &p->params[q]);
        if (b)
            emit(r, MP_EV_ALLOC, MP_ST_OPT_STATE, (int)q, b);
    }
    if (r->pp)
        par_setup(r);
    uint64_t ws; /* the forward's and the backward's (mp_workspaces_bytes): one storage */
    if (!mp_workspaces_bytes(t, &ws))
        ws = UINT64_MAX; /* the estimate refuses it (workspaces_into); the replay's sum saturates */
    if (ws)
        emit(r, MP_EV_ALLOC, MP_ST_WORKSPACE, 0, ws);
    if (t->accumulate && fsdp(r)) /* sharded gradients left by the previous micro-steps */
        for (size_t g = 0; g < r->pp->n_groups; g++) {
            comm(r, true, g, MP_COMM_RS_OUT, r->pp->groups[g].grad_shard_elems * r->pp->reduce_elem_bytes);
            r->rs_out[g] = true;
        }
    else if (t->accumulate && !(r->pp && (r->pp->par.strategy == MP_PAR_ZERO2 || r->pp->par.strategy == MP_PAR_ZERO3)))
        for (size_t q = 0; q < p->n_params; q++) {
            if (!p->params[q].trainable)
                continue;
            r->pglive[q] = true;
            emit(r, MP_EV_ALLOC, MP_ST_PGRAD, (int)q, mp_param_grad_bytes(&p->params[q]));
        }
    r->is_input[p->input] = true;
    r->live[p->input] = true;
    emit(r, MP_EV_ALLOC, MP_ST_INPUT, p->input, p->tensors[p->input].bytes);
    const int side[3] = {p->labels, p->ids, p->type_ids}; /* (--images: the ids beside the pixel values) */
    for (int k = 0; k < 3; k++)
        if (side[k] >= 0) {
            r->is_input[side[k]] = true;
            r->live[side[k]] = true;
            emit(r, MP_EV_ALLOC, MP_ST_INPUT, side[k], p->tensors[side[k]].bytes);
        }
    for (size_t b = 0; b < p->n_buffers; b++) { /* module buffers: resident like the batch */
        r->is_input[p->buffers[b]] = true;
        r->live[p->buffers[b]] = true;
        emit(r, MP_EV_ALLOC, MP_ST_INPUT, p->buffers[b], p->tensors[p->buffers[b]].bytes);
    }
}

/* The schedule's ops: blocks forward (a forward after the loss recomputes) and backward, the loss. */
static void replay_schedule(struct rp *r, const struct mp_schedule *sched)
{
    const struct mp_program *p = r->p;
    bool after_loss = false;
    for (size_t k = 0; k < sched->n && r->st == MP_OK; k++) {
        const struct mp_sched_op *op = &sched->ops[k];
        if (op->kind != MP_SCHED_LOSS && op->index >= p->n_blocks)
            MP_BUG("schedule op index %u out of range", op->index);
        emit(r, MP_EV_OP_BEGIN, MP_ST_TMP, (int)k, 0);
        switch (op->kind) {
        case MP_SCHED_FN:
        case MP_SCHED_FC:
        case MP_SCHED_FE:
            r->phase = after_loss ? MP_PH_RECOMPUTE : MP_PH_FORWARD;
            par_pre_fwd(r, op->index);
            fwd_block(r, op->index, op->kind,
                      after_loss && k + 1 < sched->n && sched->ops[k + 1].kind == MP_SCHED_B &&
                          sched->ops[k + 1].index == op->index);
            par_post_fwd(r, op->index);
            break;
        case MP_SCHED_LOSS:
            loss_op(r);
            after_loss = true;
            break;
        case MP_SCHED_B:
            r->phase = MP_PH_BACKWARD;
            par_pre_bwd(r, op->index);
            bwd_block(r, op->index);
            par_post_bwd(r, op->index);
            break;
        }
        emit(r, MP_EV_OP_END, MP_ST_TMP, (int)k, 0);
    }
}

/* The optimizer step, then zero_grad(set_to_none=True); what is still live is released. */
static void replay_step(struct rp *r, mp_event_fn fn, void *ctx)
{
    const struct mp_program *p = r->p;
    const struct mp_train_opts *t = r->t;
    /* The step's temporaries are per-parameter tensors (foreach ops return one
     * output per input), all alive together for Adam's _foreach_sqrt; Adafactor's
     * is one, fp32 tensors like the largest parameter (id 0, mp_opt_step_tmp_of). */
    aoff_end(r); /* (the end of backward, then OffloadActivations.__exit__) */
    r->phase = MP_PH_STEP;
    bool per_param = mp_optimizer_tmp(t->optimizer) == MP_OPT_TMP_ALL_GRADS;
    uint64_t ps = mp_dtype_size(p->param_dtype); /* sharded paths: per element */
    uint64_t total_grad = 0, largest = 0, muon = 0, adamw = 0; /* (mp_opt_step_tmp_bytes, the total checked) */
    enum mp_dtype ldt = MP_DT_F32;
    for (size_t q = 0; q < p->n_params; q++) {
        total_grad = r_add(r, total_grad, mp_param_grad_bytes(&p->params[q]));
        mp_opt_largest(&p->params[q], &largest, &ldt);
        mp_opt_muon_add(&p->params[q], 1, &muon, &adamw);
    }
    uint64_t otmp = mp_opt_step_tmp_of(t->optimizer, total_grad, largest, ldt, muon, adamw);
    /* Sharded: torch's foreach AdamW works on the fp32 shards (FSDP2); DeepSpeed's fused
     * Adam has no temporaries but ZeRO-1/2 make an fp32 gradient partition; offload steps
     * on the host. */
    uint64_t *tmp_of = NULL;
    bool z12 = r->pp && (r->pp->par.strategy == MP_PAR_ZERO1 || r->pp->par.strategy == MP_PAR_ZERO2);
    /* ZeRO-3 with a half-precision gradient partition: the step's fp32 gradient, made by
     * flattening the partition's per-parameter views (a copy in its dtype) and casting that to
     * fp32 (deepspeed 0.19.8 stage3.py:2683-2693 _prepare_fp32_grad_for_sub_group; one sub-group
     * under sub_group_size).  (An fp32 partition's flattened copy is not modelled.) */
    bool z3h = r->pp && r->pp->par.strategy == MP_PAR_ZERO3 && r->pp->par.offload == MP_OFFLOAD_NONE &&
               r->pp->compute_elem_bytes != 4;
    if (r->pp && (mp_par_is_deepspeed(r->pp->par.strategy) || r->pp->par.offload != MP_OFFLOAD_NONE)) {
        per_param = false;
        otmp = 0;
        if (z12 && r->pp->par.offload == MP_OFFLOAD_NONE)
            comm(r, true, 0, MP_COMM_STEP_GRAD, r->pp->partition_elems * 4);
        if (z3h) {
            comm(r, true, 1, MP_COMM_STEP_GRAD, r->pp->grad_shard_total * r->pp->compute_elem_bytes);
            comm(r, true, 0, MP_COMM_STEP_GRAD, r->pp->grad_shard_total * 4);
            comm(r, false, 1, MP_COMM_STEP_GRAD, r->pp->grad_shard_total * r->pp->compute_elem_bytes);
        }
    } else if (r->pp && mp_par_is_fsdp(r->pp->par.strategy)) {
        tmp_of = r->pp->shard_elems;
        ps = r->pp->reduce_elem_bytes; /* the trained shards' dtype: the master's, an adapter's fp32 */
        otmp = 0;
        for (size_t q = 0; q < p->n_params; q++)
            if (p->params[q].trainable) /* (a frozen base has no step) */
                otmp = per_param ? otmp + tmp_of[q] * ps : mp_max_u64(otmp, tmp_of[q] * ps);
    }
    opt_tmps(r, MP_EV_ALLOC, per_param, tmp_of, ps, otmp);
    if (r->st == MP_OK) {
        struct mp_event ev = {.kind = MP_EV_OPT_STEP, .store = MP_ST_OPT_TMP, .node = -1, .phase = r->phase};
        r->st = fn(ctx, &ev);
    }
    opt_tmps(r, MP_EV_FREE, per_param, tmp_of, ps, otmp);
    if (z12 && r->pp->par.offload == MP_OFFLOAD_NONE)
        comm(r, false, 0, MP_COMM_STEP_GRAD, r->pp->partition_elems * 4);
    if (z3h)
        comm(r, false, 0, MP_COMM_STEP_GRAD, r->pp->grad_shard_total * 4);
    r->phase = MP_PH_END;
    if (r->pp) /* zero_grad(set_to_none=True) frees the sharded gradients */
        for (size_t g = 0; g < r->pp->n_groups; g++)
            if (r->rs_out[g])
                comm(r, false, g, MP_COMM_RS_OUT, r->pp->groups[g].grad_shard_elems * r->pp->reduce_elem_bytes);
    for (size_t q = 0; q < p->n_params; q++)
        if (r->pglive[q])
            emit(r, MP_EV_FREE, MP_ST_PGRAD, (int)q, mp_param_grad_bytes(&p->params[q]));
    aoff_step_end(r);
    /* Anything still live is a bookkeeping bug; release it so visitors stay balanced. */
    for (size_t i = 0; i < p->n_tensors && r->st == MP_OK; i++) {
        g_free(r, (int)i);
        if (r->live[i] && !r->is_input[i]) {
            r->live[i] = false;
            emit(r, MP_EV_FREE, MP_ST_ACT, (int)i, p->tensors[i].bytes);
        }
    }
}

static void rp_free(struct rp *r)
{
    aoff_free(r->ao);
    free(r->uns);
    free(r->first_use);
    free(r->ag_pending);
    free(r->rs_out);
    free(r->borrow_list);
    free(r->live);
    free(r->grad_of);
    free(r->grefs);
    free(r->is_input);
    free(r->pglive);
    free(r->uses);
    free(r->saved);
    free(r->holds);
    free(r->ckpt);
    free(r->recomp);
    free(r->cached);
}

static enum mp_status replay_run(const struct mp_program *p, const struct mp_schedule *sched,
                                 const struct mp_train_opts *t, const struct mp_par_plan *given, mp_event_fn fn,
                                 void *ctx, struct rp_aoff_out *out, struct mp_diag *d)
{
    struct rp r = {.p = p, .t = t, .fn = fn, .ctx = ctx, .d = d, .st = MP_OK, .node = -1, .shared_block = {-1, -1},
                   .ref_embeds = -1, .bwd_next = SIZE_MAX};
    struct mp_schedule none;
    mp_schedule_init(&none);
    struct mp_par_plan plan;
    memset(&plan, 0, sizeof plan);
    enum mp_status st = rp_alloc(&r, given, &plan);
    if (st == MP_OK && !sched) {
        st = mp_ckpt_schedule_none(p->n_blocks, &none);
        if (st != MP_OK)
            mp_fail(d, st, "out of memory building the schedule");
        sched = &none;
    }
    if (st == MP_OK) {
        r.offload = sched->offload;
        r.sac = sched->sac;
        r.sac_keep = sched->sac_keep;
        replay_setup(&r);
        replay_schedule(&r, sched);
        replay_step(&r, fn, ctx);
        st = r.st;
        if (out && r.ao)
            *out = r.ao->out;
    }
    mp_schedule_release(&none);
    mp_par_plan_release(&plan);
    rp_free(&r);
    return st;
}

enum mp_status replay_plan(const struct mp_program *p, const struct mp_schedule *sched,
                           const struct mp_train_opts *t, const struct mp_par_plan *given, mp_event_fn fn,
                           void *ctx, struct mp_diag *d)
{
    return replay_run(p, sched, t, given, fn, ctx, NULL, d);
}

static enum mp_status no_event(void *ctx, const struct mp_event *ev)
{
    (void)ctx;
    (void)ev;
    return MP_OK;
}

enum mp_status replay_act_offload(const struct mp_program *p, const struct mp_schedule *sched,
                                  const struct mp_train_opts *t, struct rp_aoff_out *out, struct mp_diag *d)
{
    memset(out, 0, sizeof *out);
    if (!t->act_offload)
        return MP_OK;
    return replay_run(p, sched, t, NULL, no_event, NULL, out, d);
}

/* ---- a whole no-grad forward (DPO's and KTO's reference, KTO's KL pass, GRPO's prefill) ---- */
struct nograd_ctx {
    const struct mp_program *p;
    mp_nograd_fn fn;
    void *ctx;
    const uint64_t *gather; /* a ZeRO-3 reference copy: what each block fetches (NULL: none) */
    uint64_t held;          /* fetched now */
};

/* A ZeRO-3 copy's fetch: the last block's parameters released, then block i's gathered. */
static enum mp_status nograd_fetch(struct nograd_ctx *n, uint64_t bytes)
{
    enum mp_status st = MP_OK;
    struct mp_event g = {.kind = MP_EV_FREE, .store = MP_ST_COMM, .bytes = n->held, .node = -1,
                         .phase = MP_PH_FORWARD};
    if (n->held)
        st = n->fn(n->ctx, n->p, &g);
    g.kind = MP_EV_ALLOC;
    g.bytes = bytes;
    if (st == MP_OK && bytes)
        st = n->fn(n->ctx, n->p, &g);
    n->held = bytes;
    return st;
}

static enum mp_status nograd_event(void *ctx, const struct mp_event *ev)
{
    struct nograd_ctx *n = ctx;
    enum mp_status st = n->fn(n->ctx, n->p, ev);
    /* (schedule op i is block i's forward) */
    if (st == MP_OK && n->gather && ev->kind == MP_EV_OP_BEGIN && (size_t)ev->id < n->p->n_blocks)
        st = nograd_fetch(n, n->gather[ev->id]);
    return st;
}

enum mp_status mp_replay_nograd_forward(const struct mp_program *policy, const struct mp_train_opts *t, bool reference,
                                        mp_nograd_fn fn, void *ctx, struct mp_diag *d)
{
    const struct mp_program *p = policy;
    struct mp_program base;
    enum mp_status st = MP_OK;
    if (reference && t->ref == MP_REF_ADAPTER) {
        /* with the adapter disabled, peft runs each adapted Linear's base layer alone: the program
         * built again without the LoRA branches (mp_build_opts.adapter_off), the base as it is */
        struct mp_build_opts o = policy->opts;
        o.adapter_off = true;
        if ((st = mp_program_build(policy->model, &o, &base, d)) != MP_OK)
            return st;
        p = &base;
    }
    struct mp_schedule s;
    mp_schedule_init(&s);
    for (size_t i = 0; i < p->n_blocks && st == MP_OK; i++)
        st = mp_schedule_push(&s, MP_SCHED_FN, (uint32_t)i);
    if (st != MP_OK) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory");
    } else {
        struct mp_train_opts rt = *t;
        rt.ref_pass = true;
        if (reference && t->ref == MP_REF_COPY)
            rt.par = NULL; /* (a copy is no part of the policy's plan: under FSDP2 its own unit,
                            * mp_ref_gather_bytes; under ZeRO-3 its own engine, fetched block by
                            * block here; DDP wraps it in nothing) */
        rt.accumulate = t->gen_grads; /* (GRPO's phases before the step mid-accumulation: the gradients
                                       * resident; DPO's and KTO's reference: its own bytes only) */
        struct nograd_ctx n = {p, fn, ctx, NULL, 0};
        uint64_t resident, *gather = NULL;
        if (reference && t->ref == MP_REF_COPY && t->par && t->par->strategy == MP_PAR_ZERO3) {
            if (!(gather = calloc(p->n_blocks ? p->n_blocks : 1, sizeof *gather)))
                st = mp_fail(d, MP_ERR_NOMEM, "out of memory");
            else if (!mp_par_z3_ref_bytes(t->par, p, &resident, gather))
                st = mp_fail(d, MP_ERR_RANGE, "%s: the reference's sizes overflow 64 bits", p->model->path);
            n.gather = gather;
        }
        if (st == MP_OK)
            st = mp_replay(p, &s, &rt, nograd_event, &n, d);
        if (st == MP_OK && gather)
            st = nograd_fetch(&n, 0); /* the last block's released */
        free(gather);
    }
    mp_schedule_release(&s);
    if (p == &base)
        mp_program_release(&base);
    return st;
}
