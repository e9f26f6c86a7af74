/* lower_embed_head.c — position tables, the loss and the heads' logits (soft-capping, first position,
 * pooling) (build.h). */
#include "build.h"

#include <stdio.h>

/* Cross-entropy as PyTorch runs it: an fp32 upcast of half logits, log_softmax, nll_loss.
 * upcast: HF's causal-LM loss (ForCausalLMLoss) and token classification call
 * logits.float() whatever the precision; a plain nn.CrossEntropyLoss (HF *ForMaskedLM,
 * pooled classification heads, images) is upcast only by autocast (cross_entropy is on the
 * CUDA fp32 list), so in pure bf16 its log-probs are bf16.  shift: HF causal LMs shift the
 * labels into a new int64 tensor; the others read the labels as they are.
 * The order matters for the peak: backward runs NllLossBackward (the dense M*V gradient of
 * the log-probs; frees the labels and total_weight), LogSoftmaxBackward (the gradient of
 * the fp32 logits; frees the log-probs), and only then ToCopyBackward0 makes the half
 * gradient of the logits (M*V*2) and frees the fp32 one.  In the forward the half logits
 * stay alive (the model's local) while the log-probs are made.
 * One label per logits row: the labels shrink to one per sample for pooled heads. */
struct val lower_loss(struct bld *B, struct val logits, const char *name, bool upcast, bool shift)
{
    if (failed(B))
        return logits;
    uint64_t M = rows_of(logits), V = last_dim(logits);
    struct mp_tensor *lt = B->p->labels >= 0 ? T(B, B->p->labels) : NULL;
    if (lt && lt->elems != M) {
        lt->rank = 1;
        lt->shape[0] = lt->elems = M;
        lt->bytes = mul(B, M, mp_dtype_size(lt->dtype));
    }
    char en[96];
    struct val z = logits;
    int half_logits = -1;
    if (dt_of(B, logits) != MP_DT_F32 && (upcast || B->amp)) {
        snprintf(en, sizeof en, "%s.upcast", name);
        z = cast_to(B, logits, MP_DT_F32, en);
        half_logits = logits.t;
    }
    snprintf(en, sizeof en, "%s.log_softmax", name);
    struct val lp = like(B, en, z, dt_of(B, z), ng(B, z));
    struct mp_node *ls = new_node(B, MP_P_LOG_SOFTMAX, en);
    if (!ls)
        return lp;
    ls->in[0] = z.t;
    ls->out = lp.t;
    ls->keep = half_logits;
    save(ls, lp.t);
    ls->rows = M;
    ls->n = V;
    uint64_t mv = mul(B, M, V);
    ls->fwd_flops = 4.0 * (double)mv;
    ls->bwd_flops = 3.0 * (double)mv;

    uint64_t shape[1] = {1};
    struct val y = new_val(B, name, MP_DT_F32, 1, shape, true); /* bf16 in torch for bf16 log-probs: 512 B either way */
    struct mp_node *n = new_node(B, MP_P_NLL_LOSS, name);
    if (!n)
        return y;
    n->in[0] = lp.t;
    n->in[1] = B->p->labels;
    n->out = y.t;
    save(n, lp.t);
    /* nll_loss saves its target and total_weight (the bench/torch_saved.md measurements) */
    if (shift) {
        snprintf(en, sizeof en, "%s.shift_labels", name);
        extra_as(n, new_flat(B, en, MP_DT_I64, M), MP_XR_SHIFT_LABELS);
    }
    snprintf(en, sizeof en, "%s.total_weight", name);
    extra_as(n, new_flat(B, en, dt_of(B, lp), 1), MP_XR_TOTAL_WEIGHT);
    n->rows = M;
    n->n = V;
    n->fwd_flops = (double)M;
    n->bwd_flops = (double)mv; /* zero-filled M*V gradient, one scatter per row */
    B->p->explicit_loss = true;
    return y;
}

/* out = x + rows of a learned table (ADD_POS): k == seq uses row = position
 * (learned positions), k == 1 row 0 everywhere (BERT's all-zero token types). */
struct val lower_add_table(struct bld *B, struct val x, const struct mp_layer *l, const char *nm, uint64_t k,
                           struct mp_node **node)
{
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", nm);
    int w = new_param(B, pn, l->vocab, l->dim, false);
    struct val y = like(B, nm, x, promote(dt_of(B, x), B->p->param_dtype), true);
    struct mp_node *n = new_node(B, MP_P_ADD_POS, nm);
    *node = n;
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = w;
    n->rows = rows_of(x);
    n->n = l->dim;
    n->seq = B->s;
    n->k = k;
    n->fwd_flops = (double)T(B, y.t)->elems;
    return y;
}

/* Gemma2's final softcapping: logits / cap (a transient), tanh (saves its output), * cap (a new
 * tensor, what the loss reads). */
struct val softcap_logits(struct bld *B, struct val z, const char *name)
{
    char an[80];
    snprintf(an, sizeof an, "%s.softcap_tanh", name);
    struct val t = lower_act(B, z, MP_ACT_TANH, false, an);
    if (failed(B))
        return t;
    tmp_one(B, &B->p->nodes[B->p->n_nodes - 1], false, MP_TR_OTHER, T(B, z.t)->bytes); /* the divided logits */
    snprintf(an, sizeof an, "%s.softcap_scale", name);
    return lower_copy(B, t, dt_of(B, t), 1.0, an);
}

/* x[:, 0]: a view of the first position (BERT's pooler); a linear on it saves the view,
 * which keeps x's storage, or under autocast its half copy. */
struct val first_position(struct bld *B, struct val x, const char *name)
{
    if (failed(B) || x.rank != 3)
        return x;
    struct val y = x;
    y.rank = 2;
    y.shape[1] = x.shape[2];
    char vn[80];
    snprintf(vn, sizeof vn, "%s.first_position", name);
    struct mp_node *n = new_node(B, MP_P_VIEW, vn);
    if (n) {
        n->in[0] = n->out = x.t;
        n->rows = y.shape[0];
        n->n = y.shape[1];
    }
    return y;
}

/* A classifier's logits (b, s, classes) as its loss reads them: MP_POOL_LAST gathers each
 * sample's last position (logits[arange(b), last]: a new (b, classes) tensor; backward keeps
 * the two int64 index vectors); MP_POOL_SPAN copies the start and end logits out of the
 * (b, s, 2) output (split, squeeze, contiguous), each a cross-entropy over positions. */
struct val pool_logits(struct bld *B, struct val z, const struct mp_layer *l, const char *name)
{
    if (failed(B) || z.rank != 3 || (l->pool != MP_POOL_LAST && l->pool != MP_POOL_SPAN))
        return z;
    bool span = l->pool == MP_POOL_SPAN;
    uint64_t shape[2] = {span ? mul(B, 2, z.shape[0]) : z.shape[0], span ? z.shape[1] : z.shape[2]};
    char cn[80];
    snprintf(cn, sizeof cn, "%s.%s", name, span ? "start_end" : "pooled");
    struct val y = new_val(B, cn, dt_of(B, z), 2, shape, true);
    struct mp_node *n = new_node(B, MP_P_CAST, cn);
    if (!n)
        return y;
    n->in[0] = z.t;
    n->out = y.t;
    n->rows = shape[0];
    n->n = shape[1];
    if (!span) {
        char en[96];
        snprintf(en, sizeof en, "%s.index", cn);
        extra_as(n, new_flat(B, en, MP_DT_I64, mul(B, 2, z.shape[0])), MP_XR_GATHER_INDEX);
    }
    return y;
}
