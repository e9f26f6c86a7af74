/* lower_layer.c — one layer of a block: the transformer block, custom layers and the dispatch on the layer
 * type (build.h). */
#include "build.h"

#include <stdio.h>

static struct val lower_transformer(struct bld *B, struct val x, const struct mp_layer *l)
{
    uint64_t h = l->dim;
    if (!width_ok(B, x, h, "dim", ""))
        return x;
    double ap = l->no_attn_out_dropout ? 0.0 : l->p; /* dropout on the attention branch */
    if (l->post_norm) { /* BERT: x = ln(x + drop(attn(x))); x = ln(x + drop(mlp(x))) */
        struct val a = lower_dropout(B, lower_attention(B, x, l, h, "attn"), ap, "attn_dropout");
        struct val h1 = lower_norm(B, lower_add(B, x, a, "attn_residual"), l, l->norm, h, "attn_norm");
        struct val m = lower_dropout(B, lower_mlp(B, h1, l, h, "mlp"), l->p, "mlp_dropout");
        return lower_norm(B, lower_add(B, h1, m, "mlp_residual"), l, l->norm, h, "mlp_norm");
    }
    if (l->branch_norm) { /* Gemma2/3: x + post(attn(pre(x))); OLMo2 (no_pre_norm): x + post(attn(x)) */
        struct val n1 = l->no_pre_norm ? x : lower_norm(B, x, l, l->norm, h, "ln_1");
        struct val a = lower_norm(B, lower_attention(B, n1, l, h, "attn"), l, l->norm, h, "post_attn_norm");
        struct val h1 = lower_add(B, x, lower_dropout(B, a, ap, "attn_dropout"), "attn_residual");
        struct val n2 = l->no_pre_norm ? h1 : lower_norm(B, h1, l, l->norm, h, "ln_2");
        struct val m = lower_norm(B, lower_mlp(B, n2, l, h, "mlp"), l, l->norm, h, "post_mlp_norm");
        return lower_add(B, h1, lower_dropout(B, m, l->p, "mlp_dropout"), "mlp_residual");
    }
    struct val n1 = lower_norm(B, x, l, l->norm, h, "ln_1");
    struct val a = lower_dropout(B, lower_attention(B, n1, l, h, "attn"), ap, "attn_dropout");
    if (l->parallel_residual) {
        struct val n2 = l->shared_norm ? n1 : lower_norm(B, x, l, l->norm, h, "ln_2");
        struct val m = lower_dropout(B, lower_mlp(B, n2, l, h, "mlp"), l->p, "mlp_dropout");
        struct val r = lower_add(B, a, m, "branch_sum");
        return lower_add(B, x, r, "residual");
    }
    struct val h1 = lower_add(B, x, mult_copy(B, a, l, "attn_mult"), "attn_residual");
    struct val n2 = lower_norm(B, h1, l, l->norm, h, "ln_2");
    struct val m = lower_dropout(B, lower_mlp(B, n2, l, h, "mlp"), l->p, "mlp_dropout");
    return lower_add(B, h1, mult_copy(B, m, l, "mlp_mult"), "mlp_residual");
}

static struct val lower_custom(struct bld *B, struct val x, const struct mp_layer *l)
{
    if (failed(B))
        return x;
    uint64_t shape[2] = {B->b, l->c_output_bytes};
    struct val y = new_val(B, "out", MP_DT_U8, 2, shape, true);
    struct mp_node *n = new_node(B, MP_P_CUSTOM, "custom");
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    save(n, y.t);
    if (l->c_saved_bytes > l->c_output_bytes)
        extra_as(n, new_flat(B, "saved", MP_DT_U8, mul(B, B->b, l->c_saved_bytes - l->c_output_bytes)),
                 MP_XR_CUSTOM_SAVED);
    if (l->c_params)
        n->param[0] = new_param(B, "params", 1, l->c_params, false);
    n->rows = B->b;
    n->n = l->c_output_bytes;
    n->fwd_flops = (double)B->b * (double)l->c_fwd_flops;
    n->bwd_flops = (double)B->b * (double)(l->c_bwd_flops ? l->c_bwd_flops : 2 * l->c_fwd_flops);
    return y;
}

/* One layer of a block. */
struct val lower_layer(struct bld *B, struct val x, const struct mp_layer *l, struct val *resid)
{
    const char *nm = l->name[0] ? l->name : mp_layer_type_str(l->type);
    B->layer = l;
    switch (l->type) {
    case MP_LT_EMBEDDING: {
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
            struct val y = lower_add_table(B, x, l, nm, 1, &n);
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
    case MP_LT_POS_EMBEDDING: {
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
        struct val y = lower_add_table(B, x, l, nm, B->s, &n);
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
    case MP_LT_LINEAR:
        return lower_linear(B, l->pool == MP_POOL_FIRST ? first_position(B, x, nm) : x, l->in_features,
                            l->out_features, l->bias, nm);
    case MP_LT_LAYERNORM:
        return lower_norm(B, x, l, MP_NORM_LAYERNORM, l->dim, nm);
    case MP_LT_RMSNORM:
        return l->t5 ? lower_t5_norm(B, x, l->dim, nm) : lower_rmsnorm(B, x, l->dim, l->rms_fp32, nm);
    case MP_LT_ATTENTION:
        if (!width_ok(B, x, l->dim, "dim", ""))
            return x;
        return lower_attention(B, x, l, l->dim, nm);
    case MP_LT_MLP:
        if (!width_ok(B, x, l->dim, "dim", ""))
            return x;
        return lower_mlp(B, x, l, l->dim, nm);
    case MP_LT_ACTIVATION:
        return lower_act(B, x, l->act, l->inplace, nm);
    case MP_LT_DROPOUT:
        return lower_dropout(B, x, l->p, nm);
    case MP_LT_RESIDUAL: {
        struct val y = lower_add(B, *resid, x, nm);
        *resid = y;
        return y;
    }
    case MP_LT_CONV2D:
        return lower_conv(B, x, l->in_ch, l->out_ch, l->kernel, l->stride ? l->stride : 1, l->padding,
                          l->groups ? l->groups : 1, l->bias, nm);
    case MP_LT_BATCHNORM2D:
        return lower_batchnorm(B, x, l->in_ch ? l->in_ch : l->dim, nm);
    case MP_LT_MAXPOOL2D:
        return lower_pool(B, x, MP_P_MAXPOOL, l->kernel, l->stride ? l->stride : l->kernel, l->padding, 0, 0, nm);
    case MP_LT_AVGPOOL2D:
        return lower_pool(B, x, MP_P_AVGPOOL, l->kernel, l->stride ? l->stride : l->kernel, l->padding, 0, 0, nm);
    case MP_LT_ADAPTIVE_AVGPOOL2D:
        return lower_pool(B, x, MP_P_ADAPTIVE_AVGPOOL, 0, 0, 0, l->out_h ? l->out_h : 1, l->out_w ? l->out_w : 1,
                          nm);
    case MP_LT_FLATTEN: {
        if (failed(B))
            return x;
        struct val y = x;
        y.rank = 2;
        y.shape[0] = x.shape[0];
        y.shape[1] = T(B, x.t)->elems / (x.shape[0] ? x.shape[0] : 1);
        struct mp_node *n = new_node(B, MP_P_VIEW, nm);
        if (n) {
            n->in[0] = x.t;
            n->out = x.t;
            n->rows = y.shape[0];
            n->n = y.shape[1];
        }
        return y;
    }
    case MP_LT_LM_HEAD: {
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
             * bench/torch_step_results.md). */
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
    case MP_LT_CLASSIFIER: {
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
    case MP_LT_CUSTOM:
        return lower_custom(B, x, l);
    case MP_LT_TRANSFORMER_BLOCK: {
        char saved[96];
        with_prefix(B, B->prefix, "", saved);
        struct val y = l->t5 ? lower_t5_block(B, x, l) : lower_transformer(B, x, l);
        restore_prefix(B, saved);
        *resid = y;
        return y;
    }
    case MP_LT_BOTTLENECK:
        return lower_bottleneck(B, x, l);
    case MP_LT_PATCH_EMBEDDING: {
        struct val y = lower_patch_embedding(B, x, l);
        *resid = y;
        return y;
    }
    case MP_LT_COUNT:
        break;
    }
    MP_BUG("unknown layer type %d", (int)l->type);
}
