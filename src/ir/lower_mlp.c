/* lower_mlp.c — the MLP and the mixture of experts (build.h). */
#include "build.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- mixture of experts (transformers 5.23, experts_implementation "grouped_mm") ----------------
 *
 * grouped_mm is transformers' default (modeling_utils get_correct_experts_implementation) and
 * what its integrations/moe.py grouped_mm_experts_forward does, op by op, for M tokens, top-k
 * k, S = M*k routed rows, E experts of width F:
 *   router (*TopKRouter.forward): logits = Linear(h, E); softmax or sigmoid (saved, M x E); topk
 *     (indices saved, M x k int64); optional renormalization (in place: saves the values and
 *     their sum); the weights (M, k);
 *   sort the S expert ids (perm); x[perm // k] -> (S, h) (IndexBackward saves the index, S int64);
 *     weights[perm] -> (S,) (saves perm); per-expert offsets (E int32, saved by grouped_mm);
 *   grouped_mm(x_sorted, gate_up_proj) -> (S, 2F) [all experts' weights: one (E, 2F, h)
 *     parameter]; act(gate) * up; grouped_mm(., down_proj) -> (S, h); * weights (S, 1);
 *     un-permute (saves inv_perm, S int64); view (M, k, h).sum(1); .to(x's dtype).
 * grouped_mm is not an autocast op: under amp it runs in the weights' dtype, fp32 (x, the
 * RMSNorm output, is fp32 there), so the experts' activations are fp32 (measured on the CPU,
 * bench/accuracy/torch_step_results.md; CUDA's autocast list has no grouped_mm either, transformers'
 * _grouped_mm comment, pytorch#174763).  The S rows are one grouped GEMM whatever the split
 * over experts: routing imbalance (--moe-capacity) changes no tensor of this path. */

/* Dispatch/combine rows: out (rows, width) of x gathered by an index / permuted / summed over
 * the top-k copies, in dtype dt; n_idx int64 index tensors of S elements each are made and
 * saved (IndexBackward keeps its index).  Backward scatters into a zero gradient of x. */
static struct val moe_rows(struct bld *B, struct val x, uint64_t rows, uint64_t width, enum mp_dtype dt, int n_idx,
                           uint64_t idx, const char *name)
{
    if (failed(B))
        return x;
    uint64_t shape[2] = {rows, width};
    struct val y = new_val(B, name, dt, 2, shape, ng(B, x));
    struct mp_node *n = new_node(B, MP_P_ROWS, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->rows = rows;
    n->n = width;
    char en[96];
    for (int i = 0; i < n_idx; i++) {
        snprintf(en, sizeof en, "%s.index", name);
        extra_as(n, new_flat(B, en, MP_DT_I64, idx), MP_XR_ROW_INDEX);
    }
    if (n_idx) /* IndexBackward: index_put(zeros like x, ..., accumulate) is out of place */
        tmp_one(B, n, true, MP_TR_OTHER, T(B, x.t)->bytes);
    n->fwd_flops = (double)T(B, y.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return y;
}

/* grouped_mm(x, all experts' W^T): out (S, out_f) in x's dtype; saves x and the offsets. */
static struct val grouped_mm(struct bld *B, struct val x, uint64_t in_f, uint64_t out_f, uint64_t experts,
                             int offsets, const char *name)
{
    if (!width_ok(B, x, in_f, "in_features", name))
        return x;
    int w = new_param(B, name, mul(B, experts, out_f), in_f, false); /* a 3-D (E, out, in) parameter */
    if (w >= 0) {
        B->p->params[w].stacked = true;
        B->p->params[w].experts = experts;
    }
    struct val y = with_last(B, name, x, out_f, dt_of(B, x), true);
    struct mp_node *n = new_node(B, MP_P_GROUPED_MM, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = w;
    save(n, x.t);
    save(n, offsets);
    n->rows = rows_of(x);
    n->n = out_f;
    n->k = in_f;
    n->fwd_flops = 2.0 * (double)n->rows * (double)in_f * (double)out_f;
    n->bwd_flops = 2.0 * n->fwd_flops;
    return y;
}

/* The router's node: the logits (M rows of E) in, the top-k weights w (M, k) out. */
static struct mp_node *router_node(struct bld *B, const char *name, struct val logits, struct val w, uint64_t M,
                                   uint64_t E, uint64_t k)
{
    struct mp_node *n = new_node(B, MP_P_ROUTER, name);
    if (!n)
        return NULL;
    n->in[0] = logits.t;
    n->out = w.t;
    n->rows = M;
    n->n = E;
    n->k = k;
    return n;
}

/* PhiMoE's sparsemixer in training (transformers 5.24 phimoe/modeling_phimoe.py sparsemixer and
 * PhimoeMultiplier; docs/memory-facts.md#phimoe-sparsemixer), two rounds over the (M, E) logits,
 * the second on a scatter of them with the first choice at -inf: a no_grad threshold mask
 * (bool, saved by masked_fill), Gumbel sampling of one expert (M, 1) int64 (saved by gather, by
 * the multiplier's ctx and, for round 1, by round 2's scatter: one storage), softmax of the
 * masked logits (its output saved by SoftmaxBackward0 and the ctx: one storage), the gathered
 * weight (M, 1) (the ctx).  The weights (M, 2) are the two multipliers concatenated.  Softmax is
 * on CUDA autocast's fp32 list: under amp the probabilities and everything after are fp32.
 * Every shape is fixed by M and E: the random draws change values, never bytes.  Transients:
 * forward, the threshold's and the noise's (M, E) temporaries (abs, clamp, difference, quotient;
 * the exponential noise, its log, the difference), three alive at once; backward, each
 * multiplier's (M, E) gradient into the logits' dense one. */
static struct val sparsemixer(struct bld *B, struct val logits, uint64_t M, uint64_t E)
{
    enum mp_dtype ldt = dt_of(B, logits), pdt = B->amp ? MP_DT_F32 : ldt;
    uint64_t shape[2] = {M, 2};
    struct val w = new_val(B, "gate.weights", pdt, 2, shape, true);
    struct mp_node *n = router_node(B, "gate.sparsemixer", logits, w, M, E, 2);
    if (!n)
        return w;
    static const char *const round[] = {"gate.round1", "gate.round2"};
    char en[96];
    for (int r = 0; r < 2; r++) {
        snprintf(en, sizeof en, "%s.mask", round[r]);
        extra_as(n, new_flat(B, en, MP_DT_U8, mul(B, M, E)), MP_XR_ROUTE_MASK);
        snprintf(en, sizeof en, "%s.probs", round[r]);
        extra_as(n, new_flat(B, en, pdt, mul(B, M, E)), MP_XR_ROUTER_PROBS);
        snprintf(en, sizeof en, "%s.expert", round[r]);
        extra_as(n, new_flat(B, en, MP_DT_I64, M), MP_XR_TOPK_INDEX);
        snprintf(en, sizeof en, "%s.weight", round[r]);
        extra_as(n, new_flat(B, en, pdt, M), MP_XR_TOPK_VALUES);
    }
    uint64_t me = mul(B, M, E);
    tmp_one(B, n, false, MP_TR_OTHER, mul(B, me, 3 * mp_dtype_size(ldt)));
    tmp_one(B, n, true, MP_TR_OTHER, mul(B, me, 2 * mp_dtype_size(pdt)));
    n->fwd_flops = 20.0 * (double)M * (double)E;
    n->bwd_flops = 6.0 * (double)M * (double)E;
    return w;
}

/* PhiMoE's input_jitter_noise in training: x *= empty_like(x).uniform_(...), in place; MulBackward0
 * keeps the noise (x's size and dtype); its backward makes the input's gradient anew. */
static void input_jitter(struct bld *B, struct val x, const char *name)
{
    struct mp_node *n = new_node(B, MP_P_DROPOUT, name);
    if (!n)
        return;
    char en[96];
    snprintf(en, sizeof en, "%s.noise", name);
    n->in[0] = x.t;
    n->out = x.t; /* in place */
    extra_as(n, new_flat(B, en, dt_of(B, x), T(B, x.t)->elems), MP_XR_DROP_MASK);
    tmp_one(B, n, true, MP_TR_OTHER, T(B, x.t)->bytes);
    n->rows = rows_of(x);
    n->n = last_dim(x);
    n->fwd_flops = 2.0 * (double)T(B, x.t)->elems;
    n->bwd_flops = (double)T(B, x.t)->elems;
}

/* Llama 4's router (transformers 5.24 llama4/modeling_llama4.py:141-153 Llama4Router.forward):
 * topk of the (M, E) logits (its indices saved, M x k int64, also the scatter's index: one
 * storage); full_like(logits, -inf).scatter_(top values); sigmoid of its fp32 copy (the output,
 * fp32, saved by SigmoidBackward0), cast back to the logits' dtype: the scores (M, E), zero for
 * the experts not chosen.  Forward transients: the top values (M, k), the -inf tensor and, for
 * half logits, its fp32 copy; backward: the sigmoid's fp32 gradient and the scattered one. */
static struct val dense_sigmoid_router(struct bld *B, struct val logits, uint64_t M, uint64_t E, uint64_t k)
{
    enum mp_dtype ldt = dt_of(B, logits);
    uint64_t shape[2] = {M, E}, me = mul(B, M, E);
    struct val w = new_val(B, "router.scores", ldt, 2, shape, true);
    struct mp_node *n = router_node(B, "router.sigmoid", logits, w, M, E, k);
    if (!n)
        return w;
    if (ldt == MP_DT_F32) /* .float() and .to(dtype) are no-ops: the scores are the sigmoid's output */
        save(n, w.t);
    else
        extra_as(n, new_flat(B, "router.probs", MP_DT_F32, me), MP_XR_ROUTER_PROBS);
    extra_as(n, new_flat(B, "router.topk_index", MP_DT_I64, mul(B, M, k)), MP_XR_TOPK_INDEX);
    uint64_t es = mp_dtype_size(ldt);
    tmp_one(B, n, false, MP_TR_OTHER, add(B, mul(B, mul(B, M, k), es), mul(B, me, ldt == MP_DT_F32 ? es : es + 4)));
    tmp_one(B, n, true, MP_TR_OTHER, mul(B, me, add(B, 4, es)));
    n->fwd_flops = 6.0 * (double)M * (double)E;
    n->bwd_flops = 3.0 * (double)M * (double)E;
    return w;
}

/* One torch.bmm of the E experts' 3-D parameter (E, in, out) over x viewed (E, rows / E, in):
 * a matmul node (saves x; under autocast x's half copy and the weight's cached half copy). */
static struct val expert_bmm(struct bld *B, struct val x, uint64_t in_f, uint64_t out_f, uint64_t experts,
                             const char *name)
{
    char cn[96];
    snprintf(cn, sizeof cn, "%s.x_cast", name);
    x = autocast_in(B, x, cn);
    if (!width_ok(B, x, in_f, "in_features", name))
        return x;
    int w = new_param(B, name, mul(B, experts, out_f), in_f, true);
    if (w >= 0) {
        B->p->params[w].stacked = true;
        B->p->params[w].experts = experts;
    }
    struct val y = with_last(B, name, x, out_f, B->amp ? B->p->compute_dtype : dt_of(B, x), true);
    struct mp_node *n = matmul_node(B, MP_P_GROUPED_MM, name, x, y, w, -1);
    if (!n)
        return y;
    n->rows = rows_of(x);
    n->n = out_f;
    n->k = in_f;
    n->fwd_flops = 2.0 * (double)n->rows * (double)in_f * (double)out_f;
    n->bwd_flops = 2.0 * n->fwd_flops;
    return y;
}

/* Llama 4's MoE layer in training (modeling_llama4.py:156-175 Llama4TextMoe.forward, :55-84
 * Llama4TextExperts.forward): no dispatch: x.repeat(E, 1) (E*M rows) times the scores column
 * (scores.transpose(0, 1).reshape(-1, 1): a copy; MulBackward0 saves both), viewed (E, M, h):
 * bmm with gate_up_proj (E, h, 2F), chunk, act(gate) * up, bmm with down_proj (E, F, h); the
 * shared expert (a gated MLP of intermediate_size) on x; the E outputs summed and added in.
 * Every token runs through every expert whatever top_k: the expert activations are E x M rows
 * (docs/memory-facts.md#llama4). */
static struct val lower_dense_moe(struct bld *B, struct val x, const struct mp_layer *l, uint64_t h)
{
    uint64_t M = rows_of(x), E = l->moe.experts, k = l->moe.top_k, F = l->moe.expert_ffn, R = mul(B, E, M);
    enum mp_dtype xdt = dt_of(B, x);
    if (B->p->opts.ep > 1) {
        fail_model(B, MP_ERR_USAGE, "--ep %llu: Llama 4's experts (every token through every expert, one bmm) "
                   "are not modelled under expert parallelism", (unsigned long long)B->p->opts.ep);
        return x;
    }
    B->no_lora = true; /* an nn.Linear subclass returning a tuple: peft's LoRA cannot wrap it (frozen.c) */
    struct val logits = lower_linear(B, x, h, E, false, "router");
    B->no_lora = false;
    struct val sc = dense_sigmoid_router(B, logits, M, E, k);
    struct val rin = moe_rows(B, x, R, h, xdt, 0, 0, "routed_in");              /* x.repeat(E, 1) */
    struct val col = moe_rows(B, sc, R, 1, dt_of(B, sc), 0, 0, "scores_column"); /* the transposed copy */
    struct val ri = lower_mul(B, rin, col, "routed_in_scaled");
    char saved[96];
    with_prefix(B, B->prefix, "experts", saved);
    struct val gu = expert_bmm(B, ri, h, mul(B, 2, F), E, "gate_up_proj");
    struct val g = gu, u = gu; /* chunk(2, dim=-1): two views */
    g.shape[g.rank - 1] = u.shape[u.rank - 1] = F;
    size_t gun = failed(B) ? 0 : B->p->n_nodes - 1;
    struct val gp = like(B, "gate_up_proj.grad_gate", g, dt_of(B, gu), ng(B, gu));
    struct val up = like(B, "gate_up_proj.grad_up", u, dt_of(B, gu), ng(B, gu));
    struct val ga = lower_act(B, g, l->mlp.act, false, "act_fn");
    if (!failed(B))
        B->p->nodes[B->p->n_nodes - 1].in_grad_part[0] = gp.t;
    struct val m = lower_mul(B, u, ga, "mul"); /* up * act_fn(gate) */
    if (!failed(B)) {
        B->p->nodes[B->p->n_nodes - 1].in_grad_part[0] = up.t;
        B->p->nodes[gun].out_parts[0] = gp.t;
        B->p->nodes[gun].out_parts[1] = up.t;
    }
    struct val dn = expert_bmm(B, m, F, h, E, "down_proj");
    restore_prefix(B, saved);
    struct mp_layer sl = *l; /* the shared expert: Llama4TextMLP(config), intermediate_size wide */
    sl.moe.experts = 0;
    sl.mlp.ffn = l->moe.shared_ffn;
    sl.mlp.gated = true;
    sl.mlp.fused_gate_up = false;
    struct val sh = lower_mlp(B, x, &sl, h, "shared_expert");
    struct val sum = moe_rows(B, dn, M, h, dt_of(B, dn), 0, 0, "experts_sum"); /* reshape(E, M, h).sum(0) */
    /* (its backward's expanded gradient is cloned by the reshape's ViewBackward0: a new (E*M, h) one) */
    struct val y = lower_add(B, sh, sum, "shared_add");
    /* the forward's locals until it returns: routed_in (rebound to the scaled rows, x's dtype or
     * fp32 under amp), routed_out, the scores (router_logits too: (M, E), not counted) */
    hold_to_last(B, ri.t);
    hold_to_last(B, dn.t);
    hold_to_last(B, sc.t);
    return y;
}

/* The router: logits = Linear(h, E) (DeepSeek: on fp32 copies of x and W outside autocast),
 * then the top-k weights (M, k) as the family's *TopKRouter computes them. */
static struct val lower_router(struct bld *B, struct val x, const struct mp_layer *l, uint64_t h)
{
    uint64_t M = rows_of(x), E = l->moe.experts, k = l->moe.top_k;
    bool ds = l->moe.router == MP_ROUTER_FP32_SOFTMAX || l->moe.router == MP_ROUTER_FP32_SIGMOID;
    struct val xin = x;
    bool copy_w = ds && !B->amp && dt_of(B, x) != MP_DT_F32; /* hidden.type(fp32), weight.type(fp32) */
    if (copy_w)
        xin = cast_to(B, x, MP_DT_F32, "gate.x_fp32");
    B->no_lora = true; /* *TopKRouter holds a Parameter, not an nn.Linear */
    struct val logits = lower_linear(B, xin, h, E, false, "gate");
    B->no_lora = false;
    if (failed(B))
        return logits;
    if (copy_w) /* the matmul saves the fp32 copy of W too */
        extra_as(&B->p->nodes[B->p->n_nodes - 1], new_flat(B, "gate.weight_fp32", MP_DT_F32, mul(B, E, h)),
                 MP_XR_WEIGHT_COPY);
    if (l->moe.router == MP_ROUTER_SPARSEMIXER)
        return sparsemixer(B, logits, M, E);
    enum mp_dtype ldt = dt_of(B, logits);
    /* softmax(logits.float()) / softmax(dtype=float): fp32 probabilities; sigmoid: the logits' dtype */
    enum mp_dtype pdt = l->moe.router == MP_ROUTER_FP32_SIGMOID ? ldt : MP_DT_F32;
    bool topk_first = l->moe.router == MP_ROUTER_TOPK_SOFTMAX; /* softmax over the k chosen logits */
    enum mp_dtype wdt = l->moe.router == MP_ROUTER_SOFTMAX_CAST ? ldt
                        : topk_first                            ? dt_of(B, x)
                                                                : pdt; /* the weights */
    uint64_t shape[2] = {M, k};
    struct val w = new_val(B, "gate.weights", wdt, 2, shape, true);
    struct mp_node *n = router_node(B, "gate.topk", logits, w, M, E, k);
    if (!n)
        return w;
    /* the probabilities softmax saves: (M, E), or (M, k) after the top-k (GraniteMoE: topk keeps
     * only its indices, .type_as(x) nothing) */
    extra_as(n, new_flat(B, "gate.probs", pdt, mul(B, M, topk_first ? k : E)), MP_XR_ROUTER_PROBS);
    extra_as(n, new_flat(B, "gate.topk_index", MP_DT_I64, mul(B, M, k)), MP_XR_TOPK_INDEX);
    if (l->moe.norm_topk) { /* values /= values.sum(-1, keepdim=True): DivBackward keeps both */
        extra_as(n, new_flat(B, "gate.topk_values", pdt, mul(B, M, k)), MP_XR_TOPK_VALUES);
        extra_as(n, new_flat(B, "gate.topk_sum", pdt, M), MP_XR_TOPK_SUM);
    }
    if (l->moe.route_mask) /* DeepSeek-V2 group_limited_greedy: masked_fill keeps its mask */
        extra_as(n, new_flat(B, "gate.group_mask", MP_DT_U8, mul(B, M, E)), MP_XR_ROUTE_MASK);
    /* forward transients: an fp32 copy of the logits (Mixtral's .float()) or DeepSeek-V3's
     * scores_for_choice and its masked copy; backward: the dense (M, E) gradient */
    uint64_t me4 = mul(B, mul(B, M, E), 4);
    tmp_one(B, n, false, MP_TR_OTHER,
            l->moe.router == MP_ROUTER_FP32_SIGMOID ? mul(B, me4, 2) : ldt != MP_DT_F32 ? me4 : 0);
    tmp_one(B, n, true, MP_TR_OTHER, me4);
    n->fwd_flops = 5.0 * (double)M * (double)E;
    n->bwd_flops = n->fwd_flops;
    return w;
}

/* A masked_fill copy of x (rows, width) that saves mask. */
static struct val ep_mask_copy(struct bld *B, struct val x, int mask, const char *name)
{
    struct val y = moe_rows(B, x, rows_of(x), last_dim(x), dt_of(B, x), 0, 0, name);
    if (!failed(B))
        save(&B->p->nodes[B->p->n_nodes - 1], mask);
    return y;
}

/* The experts' FFN on rows xs sorted by expert: grouped_mm up (2F), [a masked_fill copy], act(gate)
 * * up, grouped_mm down, [a masked_fill copy]; E experts' stacks; mask >= 0: --ep's sentinel mask. */
static struct val experts_ffn(struct bld *B, struct val xs, const struct mp_layer *l, uint64_t h, uint64_t E,
                              int mask)
{
    uint64_t F = l->moe.expert_ffn;
    if (dt_of(B, xs) != B->p->param_dtype) /* input.to(weight.dtype) */
        xs = cast_to(B, xs, B->p->param_dtype, "dispatch_cast");
    int offs = new_flat(B, "offsets", MP_DT_U8, mul(B, E, 4)); /* cumsum(histc(...)), int32 */
    if (!failed(B))
        extra_as(&B->p->nodes[B->p->n_nodes - 1], offs, MP_XR_EXPERT_OFFSETS);
    struct val gu = grouped_mm(B, xs, h, mul(B, 2, F), E, offs, "gate_up_proj");
    if (mask >= 0)
        gu = ep_mask_copy(B, gu, mask, "gate_up_proj.masked");
    struct val g = gu, u = gu; /* chunk(2): two views; their gradients are two tensors, cat by
                                * SplitBackward once both exist */
    g.shape[g.rank - 1] = u.shape[u.rank - 1] = F;
    size_t gun = failed(B) ? 0 : B->p->n_nodes - 1; /* an index: the node array may move */
    struct val gp = like(B, "gate_up_proj.grad_gate", g, dt_of(B, gu), ng(B, gu));
    struct val up = like(B, "gate_up_proj.grad_up", u, dt_of(B, gu), ng(B, gu));
    struct val ga = lower_act(B, g, l->mlp.act, false, "act_fn");
    if (!failed(B))
        B->p->nodes[B->p->n_nodes - 1].in_grad_part[0] = gp.t;
    struct val m = lower_mul(B, ga, u, "mul");
    if (!failed(B)) {
        B->p->nodes[B->p->n_nodes - 1].in_grad_part[1] = up.t;
        B->p->nodes[gun].out_parts[0] = gp.t;
        B->p->nodes[gun].out_parts[1] = up.t;
    }
    struct val dn = grouped_mm(B, m, F, h, E, offs, "down_proj");
    return mask >= 0 ? ep_mask_copy(B, dn, mask, "down_proj.masked") : dn;
}

/* The routed experts on x (M, h) with weights w (M, k): grouped_mm_experts_forward. */
static struct val lower_experts(struct bld *B, struct val x, struct val w, const struct mp_layer *l, uint64_t h)
{
    char saved[96];
    with_prefix(B, B->prefix, "experts", saved);
    uint64_t M = rows_of(x), k = l->moe.top_k, E = l->moe.experts, S = mul(B, M, k);
    enum mp_dtype xdt = dt_of(B, x);
    struct val xs = moe_rows(B, x, S, h, xdt, 1, S, "dispatch"); /* hidden_states[perm // k] */
    struct val ws = moe_rows(B, w, S, 1, dt_of(B, w), 1, S, "dispatch_weights"); /* weights[perm] */
    struct val dn = experts_ffn(B, xs, l, h, E, -1);
    struct val wo = lower_mul(B, dn, ws, "weighted");
    struct val un = moe_rows(B, wo, S, h, dt_of(B, wo), 1, S, "unpermute"); /* weighted_out[inv_perm] */
    struct val y = moe_rows(B, un, M, h, dt_of(B, un), 0, 0, "combine");  /* view(M, k, h).sum(1) */
    if (!failed(B) && dt_of(B, y) != xdt)
        y = cast_to(B, y, xdt, "combine_cast");
    restore_prefix(B, saved);
    return y;
}

/* ---- expert parallelism (--ep; transformers 5.24 distributed/expert_parallel.py AllToAllEP) ------
 *
 * DistributedConfig(fsdp_size=W, ep_size=N) shards each experts module's (E, out, in) stacks on
 * dim 0 over the N ranks of an EP group (MoEParamShard: E/N local experts, module.num_experts =
 * E/N, _is_expert_parallel set) and routes tokens by AllToAllEP, inside the experts module's
 * forward (FSDP2's experts unit gathers before it and reshards after it):
 *   dispatch: order = argsort(top_k_index.view(-1)) (S int64, kept: the combine's index_put saves
 *     it); send = x[order // k] (S, h) (IndexBackward saves the index); recv =
 *     all_to_all_single_autograd(send) (R, h), R the rows this rank's experts get; their local ids
 *     (arange(E/N).repeat(N).repeat_interleave(counts): R int64) and unit weights (ones: R, no
 *     grad), all three held by the frame until the module returns;
 *   the experts (grouped_mm_experts_forward, top-1): x[perm] (R, h) saves the index; the sentinel
 *     mask (R, 1) bool, saved by each masked_fill; grouped_mm; masked_fill (R, 2F) (a copy);
 *     act * up; grouped_mm (R, h); masked_fill (R, h); * the unit weights gathered by perm (R: no
 *     grad, MulBackward saves only them); [inv_perm] (saves R int64); view(R, 1, h).sum(1);
 *   combine: all_to_all back (S, h); empty_like + index_put_(order) (S, h); view (M, k, h) *
 *     top_k_weights (saves both); sum(1) (M, h).
 * Under uniform routing a rank receives R = S = M x k rows (each of the N ranks sends it S / N).
 * --moe-capacity F: one of its experts gets F x its uniform share, R = S (E/N - 1 + F) / (E/N),
 * at most M x N x min(k, E/N) (each token of the group reaches a rank once per local expert). */

/* out = x * w (rows, 1) where w has no gradient: MulBackward0 saves w alone. */
static struct val scale_rows(struct bld *B, struct val x, struct val w, const char *name)
{
    if (failed(B))
        return x;
    struct val y = like(B, name, x, dt_of(B, x), ng(B, x));
    struct mp_node *n = new_node(B, MP_P_MUL, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->in[1] = w.t;
    n->out = y.t;
    save(n, w.t);
    n->rows = rows_of(x);
    n->n = last_dim(x);
    n->fwd_flops = (double)val_elems(B, x);
    n->bwd_flops = n->fwd_flops;
    return y;
}

uint64_t mp_moe_ep_rows(uint64_t tokens, uint64_t k, uint64_t local, uint64_t ep, double capacity)
{
    uint64_t S = tokens * k;
    if (capacity <= 1 || !local)
        return S;
    double r = ceil((double)S * ((double)local - 1 + capacity) / (double)local);
    uint64_t most = tokens * ep * (k < local ? k : local);
    return r >= (double)most ? most : (uint64_t)r;
}

/* The routed experts on x (M, h) with weights w (M, k) under --ep: AllToAllEP. */
static struct val lower_experts_ep(struct bld *B, struct val x, struct val w, const struct mp_layer *l, uint64_t h)
{
    uint64_t ep = B->p->opts.ep, E = l->moe.experts, k = l->moe.top_k, F = l->moe.expert_ffn, M = rows_of(x);
    if (E % ep) {
        fail_model(B, MP_ERR_USAGE, "--ep %llu does not divide the %llu experts", (unsigned long long)ep,
                   (unsigned long long)E);
        return x;
    }
    char saved[96];
    with_prefix(B, B->prefix, "experts", saved);
    uint64_t local = E / ep, S = mul(B, M, k);
    (void)mul(B, S, ep); /* (the busiest rank's rows are at most S x ep: checked 64-bit here) */
    uint64_t R = failed(B) ? S : mp_moe_ep_rows(M, k, local, ep, B->p->opts.moe_capacity);
    enum mp_dtype xdt = dt_of(B, x);
    size_t n0 = B->p->n_nodes;
    /* dispatch: x[order // k] saves order // k; order itself is the combine's saved index */
    struct val send = moe_rows(B, x, S, h, xdt, 2, S, "dispatch");
    struct val recv = moe_rows(B, send, R, h, xdt, 0, 0, "all_to_all");
    int ids = new_flat(B, "recv_expert_ids", MP_DT_I64, R), ones = new_flat(B, "recv_weights", xdt, R);
    if (!failed(B)) { /* (new_flat makes no node: both are the all-to-all's) */
        extra_as(&B->p->nodes[B->p->n_nodes - 1], ids, MP_XR_EP_LOCAL);
        extra_as(&B->p->nodes[B->p->n_nodes - 1], ones, MP_XR_EP_LOCAL);
    }
    /* the experts' forward on the R received rows, top-1 */
    struct val xs = moe_rows(B, recv, R, h, xdt, 1, R, "sorted");
    int mask = new_flat(B, "sentinel_mask", MP_DT_U8, R);
    if (!failed(B))
        extra_as(&B->p->nodes[B->p->n_nodes - 1], mask, MP_XR_EP_MASK);
    uint64_t wshape[2] = {R, 1};
    struct val wones = new_val(B, "recv_weights", xdt, 2, wshape, false);
    wones.t = ones;
    struct val ws = moe_rows(B, wones, R, 1, xdt, 0, 0, "sorted_weights"); /* recv_weights[perm] */
    if (!failed(B))
        B->p->nodes[B->p->n_nodes - 1].no_grad = true;
    struct val dn = experts_ffn(B, xs, l, h, local, mask);
    struct val wo = scale_rows(B, dn, ws, "weighted");
    struct val un = moe_rows(B, wo, R, h, dt_of(B, wo), 1, R, "unpermute");
    struct val eo = moe_rows(B, un, R, h, dt_of(B, un), 0, 0, "sum");
    if (!failed(B) && dt_of(B, eo) != xdt)
        eo = cast_to(B, eo, xdt, "sum_cast");
    /* combine */
    struct val back = moe_rows(B, eo, S, h, xdt, 0, 0, "all_to_all_back");
    struct val put = moe_rows(B, back, S, h, xdt, 0, 0, "index_put");
    uint64_t kshape[3] = {M, k, h};
    put.rank = 3;
    memcpy(put.shape, kshape, sizeof kshape);
    struct val wk = w;
    wk.rank = 3;
    wk.shape[0] = M, wk.shape[1] = k, wk.shape[2] = 1;
    struct val tw = lower_mul(B, put, wk, "weighted_tokens");
    tw.rank = 2;
    tw.shape[0] = S, tw.shape[1] = h;
    struct val y = moe_rows(B, tw, M, h, dt_of(B, tw), 0, 0, "combine");
    if (!failed(B) && dt_of(B, y) != xdt) /* ep_forward: output.to(hidden_states.dtype) (Mixtral's fp32
                                            * router weights promote the weighted rows) */
        y = cast_to(B, y, xdt, "combine_cast");
    hold_to_last(B, recv.t); /* AllToAllEP's frame holds the received rows, ids and weights */
    hold_to_last(B, ids);
    hold_to_last(B, ones);
    if (!failed(B)) {
        for (size_t i = n0; i < B->p->n_nodes; i++)
            B->p->nodes[i].ep_unit = true;
        /* the other ranks' experts: counted in the model's parameters, held by them */
        uint64_t other = mul(B, mul(B, E - local, mul(B, 3, F)), h);
        B->p->total_params = add(B, B->p->total_params, other);
        B->p->ep_other_params = add(B, B->p->ep_other_params, other);
    }
    restore_prefix(B, saved);
    return y;
}

/* An MoE layer's MLP: [shared expert (Qwen2-MoE, first)], router, experts, [shared expert
 * (DeepSeek)], the sum.  Qwen2-MoE gates its shared expert: sigmoid(Linear(h, 1)) * it. */
static struct val lower_moe(struct bld *B, struct val x, const struct mp_layer *l, uint64_t h, const char *name)
{
    char saved[96];
    with_prefix(B, B->prefix, name, saved);
    B->p->probe_unsupported = "mixture-of-experts routing (router, token dispatch, grouped_mm)";
    struct val xt = x; /* hidden_states.view(-1, h) */
    xt.rank = 2;
    xt.shape[0] = rows_of(x);
    xt.shape[1] = h;
    if (l->moe.router == MP_ROUTER_DENSE_SIGMOID) {
        struct val y = lower_dense_moe(B, xt, l, h);
        y.rank = x.rank;
        memcpy(y.shape, x.shape, sizeof y.shape);
        restore_prefix(B, saved);
        return y;
    }
    struct mp_layer sl = *l; /* the shared expert: a gated MLP of its own width */
    sl.moe.experts = 0;
    sl.mlp.ffn = l->moe.shared_ffn;
    sl.mlp.gated = true;
    sl.mlp.fused_gate_up = false;
    struct val sh = {.t = -1};
    const char *shn = l->moe.shared_gate ? "shared_expert" : "shared_experts";
    if (l->moe.shared_ffn && l->moe.shared_first)
        sh = lower_mlp(B, xt, &sl, h, shn);
    if (l->moe.input_jitter) { /* PhimoeSparseMoeBlock, then PhimoeTopKRouter: the same storage */
        input_jitter(B, xt, "input_jitter");
        input_jitter(B, xt, "gate.input_jitter");
    }
    struct val rw = lower_router(B, xt, l, h);
    struct val y = B->p->opts.ep > 1 ? lower_experts_ep(B, xt, rw, l, h) : lower_experts(B, xt, rw, l, h);
    if (l->moe.shared_ffn && !l->moe.shared_first)
        sh = lower_mlp(B, xt, &sl, h, shn);
    if (sh.t >= 0 && l->moe.shared_gate) {
        struct val gt = lower_act(B, lower_linear(B, xt, h, 1, false, "shared_expert_gate"), MP_ACT_SIGMOID, false,
                                  "shared_expert_gate.sigmoid");
        sh = lower_mul(B, sh, gt, "shared_expert_gated");
    }
    if (sh.t >= 0)
        y = lower_add(B, y, sh, "shared_add");
    y.rank = x.rank;
    memcpy(y.shape, x.shape, sizeof y.shape);
    restore_prefix(B, saved);
    return y;
}

struct val lower_mlp(struct bld *B, struct val x, const struct mp_layer *l, uint64_t hidden,
                     const char *name)
{
    if (l->moe.experts)
        return lower_moe(B, x, l, hidden, name);
    char saved[96];
    with_prefix(B, B->prefix, name, saved);
    struct val y;
    if (l->mlp.gated) {
        struct val ga, u;
        if (l->mlp.fused_gate_up) { /* Phi-3: gate_up_proj, chunked into two views of one storage */
            struct val g = u = lower_linear(B, x, hidden, mul(B, 2, l->mlp.ffn), l->mlp.bias, "gate_up_proj");
            g.shape[g.rank - 1] = u.shape[u.rank - 1] = l->mlp.ffn;
            ga = lower_act(B, g, l->mlp.act, false, "act");
        } else { /* down_proj(act_fn(gate_proj(x)) * up_proj(x)): the activation runs before
                  * up_proj (transformers 5.24 models/llama/modeling_llama.py:164, and the
                  * families that copy it) */
            ga = lower_act(B, lower_linear(B, x, hidden, l->mlp.ffn, l->mlp.bias, "gate_proj"), l->mlp.act, false,
                           "act");
            u = lower_linear(B, x, hidden, l->mlp.ffn, l->mlp.bias, "up_proj");
        }
        struct val m = lower_mul(B, ga, u, "mul");
        y = lower_linear(B, m, l->mlp.ffn, hidden, l->mlp.bias, "down_proj");
    } else {
        struct val f = lower_linear(B, x, hidden, l->mlp.ffn, l->mlp.bias, l->mlp.up_down ? "up_proj" : "fc1");
        f = lower_act(B, f, l->mlp.act, false, "act");
        y = lower_linear(B, f, l->mlp.ffn, hidden, l->mlp.bias, l->mlp.up_down ? "down_proj" : "fc2");
    }
    hold_to_last(B, x.t); /* the MLP's frame holds x until it returns */
    restore_prefix(B, saved);
    return y;
}
