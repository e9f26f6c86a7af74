/* lower_layer.c — one layer of a block: the transformer block, custom layers and the dispatch on the layer
 * type (build.h). */
#include "build.h"

#include <stdio.h>

static struct val lower_transformer(struct bld *B, struct val x, const struct mp_layer *l)
{
    uint64_t h = l->dim;
    if (!width_ok(B, x, h, "dim", ""))
        return x;
    double ap = l->attn.no_out_dropout ? 0.0 : l->p; /* dropout on the attention branch */
    if (l->norm.post) { /* BERT: x = ln(x + drop(attn(x))); x = ln(x + drop(mlp(x))) */
        struct val a = lower_dropout(B, lower_attention(B, x, l, h, "attn"), ap, "attn_dropout");
        struct val h1 = lower_norm(B, lower_add(B, x, a, "attn_residual"), l, l->norm.kind, h, "attn_norm");
        struct val m = lower_dropout(B, lower_mlp(B, h1, l, h, "mlp"), l->p, "mlp_dropout");
        return lower_norm(B, lower_add(B, h1, m, "mlp_residual"), l, l->norm.kind, h, "mlp_norm");
    }
    if (l->norm.branch) { /* Gemma2/3: x + post(attn(pre(x))); OLMo2 (no_pre_norm): x + post(attn(x)) */
        struct val n1 = l->norm.no_pre ? x : lower_norm(B, x, l, l->norm.kind, h, "ln_1");
        struct val a = lower_norm(B, lower_attention(B, n1, l, h, "attn"), l, l->norm.kind, h, "post_attn_norm");
        struct val h1 = lower_add(B, x, lower_dropout(B, a, ap, "attn_dropout"), "attn_residual");
        struct val n2 = l->norm.no_pre ? h1 : lower_norm(B, h1, l, l->norm.kind, h, "ln_2");
        struct val m = lower_norm(B, lower_mlp(B, n2, l, h, "mlp"), l, l->norm.kind, h, "post_mlp_norm");
        return lower_add(B, h1, lower_dropout(B, m, l->p, "mlp_dropout"), "mlp_residual");
    }
    struct val n1 = lower_norm(B, x, l, l->norm.kind, h, "ln_1");
    struct val a = lower_dropout(B, lower_attention(B, n1, l, h, "attn"), ap, "attn_dropout");
    if (l->parallel_residual) {
        struct val n2 = l->norm.shared ? n1 : lower_norm(B, x, l, l->norm.kind, h, "ln_2");
        struct val m = lower_dropout(B, lower_mlp(B, n2, l, h, "mlp"), l->p, "mlp_dropout");
        struct val r = lower_add(B, a, m, "branch_sum");
        return lower_add(B, x, r, "residual");
    }
    if (l->attn.tower_gate) /* Mllama's global tower layers: gate_attn.tanh() * the attention */
        a = lower_tanh_gate(B, a, "gate_attn");
    struct val h1 = lower_add(B, x, mult_copy(B, a, l, "attn_mult"), "attn_residual");
    struct val n2 = lower_norm(B, h1, l, l->norm.kind, h, "ln_2");
    struct val m = lower_dropout(B, lower_mlp(B, n2, l, h, "mlp"), l->p, "mlp_dropout");
    if (l->attn.tower_gate)
        m = lower_tanh_gate(B, m, "gate_ffn");
    return lower_add(B, h1, mult_copy(B, m, l, "mlp_mult"), "mlp_residual");
}

static struct val lower_custom(struct bld *B, struct val x, const struct mp_layer *l)
{
    if (failed(B))
        return x;
    uint64_t shape[2] = {B->b, l->custom.output_bytes};
    struct val y = new_val(B, "out", MP_DT_U8, 2, shape, true);
    struct mp_node *n = new_node(B, MP_P_CUSTOM, "custom");
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    save(n, y.t);
    if (l->custom.saved_bytes > l->custom.output_bytes)
        extra_as(n, new_flat(B, "saved", MP_DT_U8, mul(B, B->b, l->custom.saved_bytes - l->custom.output_bytes)),
                 MP_XR_CUSTOM_SAVED);
    if (l->custom.params)
        n->param[0] = new_param(B, "params", 1, l->custom.params, false);
    n->rows = B->b;
    n->n = l->custom.output_bytes;
    n->fwd_flops = (double)B->b * (double)l->custom.fwd_flops;
    n->bwd_flops = (double)B->b * (double)(l->custom.bwd_flops ? l->custom.bwd_flops : 2 * l->custom.fwd_flops);
    return y;
}

/* A view of x as (batch, the rest). */
static struct val lower_flatten(struct bld *B, struct val x, const char *nm)
{
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

/* Qwen2.5-VL's window block (qwen2_5_vl/modeling_qwen2_5_vl.py:451-462, vision_utils.py
 * get_vision_window_index): its attention runs one call per window of k x k patches (the states
 * already reordered window by window), so with whole windows (the image's sides multiples of
 * window_size) the block is the same block over b x windows rows of k^2 patches: what per-call
 * tensors it makes (SDPA's logsumexp, eager's s x s probabilities) are the windows'.  Edge windows
 * (smaller) are not modelled: the per-image calls' bytes stand for them under SDPA and flash (the
 * same saved bytes), eager attention is refused.  Returns whether b and s (and x's view) became the
 * windows'. */
static bool window_split(struct bld *B, struct val *x, const struct mp_layer *l)
{
    const struct mp_model *m = B->m;
    uint64_t k = l->conv.kernel, ph = m->height / m->vision.patch, pw = m->width / m->vision.patch;
    if (ph % k || pw % k || x->rank != 3) {
        enum mp_attn_impl impl = B->p->opts.attention_forced || !l->attn.impl_set ? B->p->opts.attention : l->attn.impl;
        if (impl == MP_ATTN_EAGER)
            fail_model(B, MP_ERR_MODEL, "%s: eager window attention on %llux%llu images: their edge windows (not "
                       "multiples of window_size %llu px) are not modelled", l->name, (unsigned long long)m->height,
                       (unsigned long long)m->width, (unsigned long long)m->vision.window);
        return false;
    }
    B->b = mul(B, B->b, mul(B, ph / k, pw / k));
    B->s = k * k;
    x->shape[0] = B->b; /* a view: (images x windows, k^2 patches, dim) */
    x->shape[1] = B->s;
    return true;
}

/* One layer of a block. */
struct val lower_layer(struct bld *B, struct val x, const struct mp_layer *l, struct val *resid)
{
    const char *nm = l->name[0] ? l->name : mp_layer_type_str(l->type);
    B->layer = l;
    B->vision = l->vision && l->type != MP_LT_EMBEDDING;
    switch (l->type) {
    case MP_LT_EMBEDDING:
        if (l->emb.image_lookup)
            return lower_image_lookup(B, x, l, nm);
        if (l->vision) /* the text embedding, the image features x scattered in */
            return lower_image_merge(B, x, l, nm, resid);
        return lower_embedding(B, x, l, nm, resid);
    case MP_LT_POS_EMBEDDING:
        return lower_pos_embedding(B, x, l, nm, resid);
    case MP_LT_LINEAR:
        if (l->vision && B->m->vision.kind == MP_VIS_SIGLIP)
            return lower_mm_projection(B, x, l, nm);
        if (l->vision && MP_VIS_IS_QWEN(B->m->vision.kind))
            return lower_merger_linear(B, x, l, nm);
        if (l->vision && B->m->vision.kind == MP_VIS_MLLAMA)
            return lower_mllama_projector(B, x, l, nm);
        if (l->vision && B->m->vision.kind == MP_VIS_LLAMA4 && l->conv.stride) /* linear_1: its input,
            * image_features, a local of the forward (mm_encoder_outputs) to its end */
            held_tensor(B, x.t, -1);
        return lower_linear(B, l->head.pool == MP_POOL_FIRST ? first_position(B, x, nm) : x, l->in_features,
                            l->out_features, l->bias, nm);
    case MP_LT_LAYERNORM:
        if (l->vision && B->m->vision.kind == MP_VIS_MLLAMA)
            return lower_mllama_post(B, x, l, nm);
        return lower_norm(B, x, l, MP_NORM_LAYERNORM, l->dim, nm);
    case MP_LT_RMSNORM:
        if (l->vision) { /* Mistral 3's projector norm: its input, the tower's last output, is held
                          * by image_outputs to the forward's end (lower_image_merge); the tower's
                          * block mask, a local of its forward, died as it returned, after its last
                          * layer (the block before) */
            held_tensor(B, x.t, -1);
            for (size_t j = 0; j < B->p->n_held && B->block > 0; j++)
                if (B->p->held[j].t == B->attn_mask && B->attn_mask >= 0)
                    B->p->held[j].fwd_end = B->block - 1;
        }
        return l->t5.on ? lower_t5_norm(B, x, l->dim, nm) : lower_rmsnorm(B, x, l->dim, l->norm.rms_fp32, nm);
    case MP_LT_ATTENTION:
        if (!width_ok(B, x, l->dim, "dim", ""))
            return x;
        return lower_attention(B, x, l, l->dim, nm);
    case MP_LT_MLP:
        if (!width_ok(B, x, l->dim, "dim", ""))
            return x;
        return lower_mlp(B, x, l, l->dim, nm);
    case MP_LT_ACTIVATION:
        return lower_act(B, x, l->mlp.act, l->inplace, nm);
    case MP_LT_DROPOUT:
        return lower_dropout(B, x, l->p, nm);
    case MP_LT_RESIDUAL: {
        struct val y = lower_add(B, *resid, x, nm);
        *resid = y;
        return y;
    }
    case MP_LT_CONV2D:
        return lower_conv(B, x, l->conv.in_ch, l->conv.out_ch, l->conv.kernel, l->conv.stride ? l->conv.stride : 1,
                          l->conv.padding, l->conv.groups ? l->conv.groups : 1, l->bias, nm);
    case MP_LT_BATCHNORM2D:
        return lower_batchnorm(B, x, l->conv.in_ch ? l->conv.in_ch : l->dim, nm);
    case MP_LT_MAXPOOL2D:
        return lower_pool(B, x, MP_P_MAXPOOL, l->conv.kernel, l->conv.stride ? l->conv.stride : l->conv.kernel,
                          l->conv.padding, 0, 0, nm);
    case MP_LT_AVGPOOL2D:
        if (l->vision)
            return B->m->vision.kind == MP_VIS_PIXTRAL   ? lower_patch_merge(B, x, l, nm)
                   : B->m->vision.kind == MP_VIS_LLAMA4 ? lower_pixel_shuffle(B, x, l, nm)
                                                        : lower_token_pool(B, x, l, nm);
        return lower_pool(B, x, MP_P_AVGPOOL, l->conv.kernel, l->conv.stride ? l->conv.stride : l->conv.kernel,
                          l->conv.padding, 0, 0, nm);
    case MP_LT_ADAPTIVE_AVGPOOL2D:
        return lower_pool(B, x, MP_P_ADAPTIVE_AVGPOOL, 0, 0, 0, l->conv.out_h ? l->conv.out_h : 1,
                          l->conv.out_w ? l->conv.out_w : 1, nm);
    case MP_LT_FLATTEN:
        return lower_flatten(B, x, nm);
    case MP_LT_LM_HEAD:
    case MP_LT_CLASSIFIER: { /* the output layer: its parameters are marked (Muon leaves them to AdamW) */
        size_t first = B->p->n_params;
        struct val y = l->type == MP_LT_LM_HEAD ? lower_lm_head(B, x, l, nm) : lower_classifier(B, x, l, nm);
        for (size_t q = first; q < B->p->n_params; q++)
            B->p->params[q].output = true;
        return y;
    }
    case MP_LT_CUSTOM:
        return lower_custom(B, x, l);
    case MP_LT_TRANSFORMER_BLOCK: {
        uint64_t b = B->b, s = B->s;
        bool win = l->vision && l->conv.kernel && window_split(B, &x, l);
        char saved[96];
        with_prefix(B, B->prefix, "", saved);
        struct val y = l->t5.on             ? lower_t5_block(B, x, l)
                       : l->attn.mllama_cross ? lower_mllama_cross(B, x, l)
                                              : lower_transformer(B, x, l);
        restore_prefix(B, saved);
        if (win) { /* back to the images' rows */
            B->b = b;
            B->s = s;
            y.shape[0] = b;
            y.shape[1] = s;
        }
        *resid = y;
        return y;
    }
    case MP_LT_BOTTLENECK:
        return lower_bottleneck(B, x, l);
    case MP_LT_PATCH_EMBEDDING: {
        struct val y = l->vision && B->m->vision.kind == MP_VIS_PIXTRAL ? lower_pixtral_patches(B, x, l)
                       : l->vision && B->m->vision.kind == MP_VIS_LLAMA4 ? lower_llama4_patches(B, x, l)
                       : l->vision && B->m->vision.kind == MP_VIS_MLLAMA ? lower_mllama_patches(B, x, l)
                       : l->vision && MP_VIS_IS_QWEN(B->m->vision.kind) ? lower_patch_embed3d(B, x, l, nm)
                                                           : lower_patch_embedding(B, x, l);
        *resid = y;
        return y;
    }
    case MP_LT_COUNT:
        break;
    }
    MP_BUG("unknown layer type %d", (int)l->type);
}
