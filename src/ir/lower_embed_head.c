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
    /* nll_loss saves its target and total_weight (the bench/accuracy/torch_saved.md measurements) */
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
 * (learned positions), k == 1 row 0 everywhere (BERT's all-zero token types); embedding: the
 * table is an nn.Embedding (ViT's position table is an nn.Parameter). */
struct val lower_add_table(struct bld *B, struct val x, const struct mp_layer *l, const char *nm, uint64_t k,
                           bool embedding, struct mp_node **node)
{
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", nm);
    int w = new_param(B, pn, l->vocab, l->dim, false);
    if (w >= 0)
        B->p->params[w].embedding = embedding;
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

/* A token embedding (T5's decoder input, BERT's token types added to hidden states): the
 * residual stream starts at its output (*resid). */
struct val lower_embedding(struct bld *B, struct val x, const struct mp_layer *l, const char *nm, struct val *resid)
{
    if (failed(B))
        return x;
    if (l->dec_input) {
        struct val y = lower_t5_decoder_embed(B, x, l, nm);
        *resid = y;
        return y;
    }
    if (x.t >= 0 && T(B, x.t)->dtype != MP_DT_I64 && B->embed_param >= 0 && last_dim(x) == l->dim) {
        /* A second embedding applied to hidden states: BERT's token-type table looked up
         * with all-zero type ids and added (row 0 broadcast). */
        struct mp_node *n;
        struct val y = lower_add_table(B, x, l, nm, 1, true, &n);
        if (n)
            tmp_one(B, n, false, MP_TR_OTHER, T(B, y.t)->bytes); /* the looked-up (b,s,h) rows */
        if (l->id_buffer && n) { /* BertEmbeddings' all-zero token_type_ids buffer, its view saved */
            char en[112];
            snprintf(en, sizeof en, "%s.ids", nm);
            save(n, id_buffer(B, en, l->id_rows));
        }
        *resid = y;
        return y;
    }
    if (T(B, x.t)->dtype != MP_DT_I64) {
        fail_model(B, MP_ERR_MODEL, "an embedding needs token ids as its input (input.tokens)");
        return x;
    }
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", nm);
    int w = new_param(B, pn, l->vocab, l->dim, false);
    if (w >= 0)
        B->p->params[w].embedding = true;
    if (B->embed_param < 0)
        B->embed_param = w;
    uint64_t shape[3] = {B->b, B->s, l->dim};
    struct val y = new_val(B, nm, B->p->param_dtype, 3, shape, true);
    struct mp_node *n = new_node(B, MP_P_EMBED, nm);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = w;
    save(n, x.t);
    n->rows = mul(B, B->b, B->s);
    n->n = l->dim;
    n->k = l->vocab;
    n->fwd_flops = (double)T(B, y.t)->elems;
    n->bwd_flops = n->fwd_flops;
    if (l->scale_buffer) /* Gemma: embed_scale, a registered fp32 scalar */
        id_buffer(B, "embed_scale", 0);
    struct val r = lower_dropout(B, mult_copy(B, y, l, "embed_scale"), l->emb_dropout, "dropout");
    *resid = r;
    return r;
}

/* Learned positions added to x; the residual stream starts at the sum (*resid). */
struct val lower_pos_embedding(struct bld *B, struct val x, const struct mp_layer *l, const char *nm,
                               struct val *resid)
{
    if (failed(B))
        return x;
    if (B->s > l->vocab) {
        fail_model(B, MP_ERR_MODEL, "sequence %llu exceeds the %llu learned positions",
                   (unsigned long long)B->s, (unsigned long long)l->vocab);
        return x;
    }
    if (!width_ok(B, x, l->dim, "dim", ""))
        return x;
    struct mp_node *n;
    struct val y = lower_add_table(B, x, l, nm, B->s, true, &n);
    if (!n)
        return y;
    char en[112];
    snprintf(en, sizeof en, "%s.position_ids", nm); /* int64, saved by the position lookup */
    int ids = l->id_buffer ? id_buffer(B, en, l->id_rows) : -1;
    if (l->id_view) /* BertEmbeddings: the lookup saves a view of the registered buffer */
        save(n, ids);
    else
        extra_as(n, new_flat(B, en, MP_DT_I64, B->s), MP_XR_POSITION_IDS);
    *resid = y;
    return y;
}

/* The language-model head (tied to the embedding, or not) and its loss. */
struct val lower_lm_head(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    if (l->tied && B->embed_param < 0) {
        fail_model(B, MP_ERR_MODEL, "a tied lm_head needs an embedding earlier in the model");
        return x;
    }
    if (l->tied && !failed(B) &&
        (B->p->params[B->embed_param].rows != l->vocab || B->p->params[B->embed_param].cols != l->dim)) {
        fail_model(B, MP_ERR_MODEL, "tied: vocab x dim %llux%llu does not match the embedding %llux%llu",
                   (unsigned long long)l->vocab, (unsigned long long)l->dim,
                   (unsigned long long)B->p->params[B->embed_param].rows,
                   (unsigned long long)B->p->params[B->embed_param].cols);
        return x;
    }
    if (l->t5) /* T5: decoder_outputs[0] and the scaled sequence_output are locals of the forward */
        held_tensor(B, x.t, -1);
    if (l->in_mult != 0) { /* T5: sequence_output * d_model**-0.5, a new tensor (saves nothing) */
        x = lower_copy(B, x, dt_of(B, x), l->in_mult, "scale_decoder_outputs");
        if (l->t5)
            held_tensor(B, x.t, -1);
    }
    struct val logits = lower_linear_p(B, x, l->dim, l->vocab, l->bias, nm, l->tied ? B->embed_param : -1);
    if (!failed(B) && l->tied) {
        B->p->params[B->embed_param].matmul = true;
        /* Two gradients reach the tied table's AccumulateGrad: the engine keeps the head's
         * until the embedding's backward has made its dense V x h gradient, then adds them
         * out of place: two more table-sized tensors in that backward (measured,
         * bench/accuracy/torch_step_results.md). */
        for (size_t k = 0; k < B->p->n_nodes; k++)
            if (B->p->nodes[k].prim == MP_P_EMBED && B->p->nodes[k].param[0] == B->embed_param)
                tmp_one(B, &B->p->nodes[k], true, MP_TR_OTHER,
                        mul(B, mp_param_grad_bytes(&B->p->params[B->embed_param]), 2));
    }
    logits = mult_copy(B, logits, l, "logits_scaling");
    if (l->logit_softcap > 0)
        logits = softcap_logits(B, logits, nm);
    /* masked LMs call nn.CrossEntropyLoss on the logits (BertForMaskedLM & co.) */
    return lower_loss(B, logits, "loss", !l->masked, B->m->input == MP_INPUT_TOKENS && !l->masked);
}

/* A classifier head (pooled, or per token) and its loss. */
struct val lower_classifier(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    /* HF's token classification upcasts (logits.float()); pooled heads and images do not.
     * MP_POOL_FIRST on a sequence: the first position (ViT's class token) */
    if (l->pool == MP_POOL_FIRST)
        x = first_position(B, x, nm);
    if (l->t5) /* T5: the stack's output is a local of the forward (outputs[0]) */
        held_tensor(B, x.t, -1);
    struct val logits = lower_linear(B, x, l->in_features, l->vocab, l->bias, nm);
    bool upcast = B->m->input == MP_INPUT_TOKENS && l->pool == MP_POOL_NONE && !l->masked; /* masked: a plain
                                                             nn.CrossEntropyLoss (T5ForTokenClassification) */
    return lower_loss(B, pool_logits(B, logits, l, nm), "loss", upcast, false);
}
