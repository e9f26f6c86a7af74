/* lower_t5.c — T5's blocks: its norm, position bias, attention, feed-forward and decoder embedding
 * (build.h). */
#include "build.h"

#include <stdio.h>

/* ---- T5 (transformers 5.23 modeling_t5.py) ------------------------------------------------ */

/* T5LayerNorm: x.to(fp32).pow(2).mean (pow saves the fp32 x: a copy when x is half), x * rsqrt
 * (saves x itself and rsqrt), .to(the weight's dtype) when that is half, weight * normed (saves
 * normed): HF's RMSNorm plus, for a half x, x itself saved. */
struct val lower_t5_norm(struct bld *B, struct val x, uint64_t dim, const char *name)
{
    struct val y = lower_rmsnorm(B, x, dim, false, name);
    if (!failed(B) && dt_of(B, x) != MP_DT_F32)
        save(&B->p->nodes[B->p->n_nodes - 1], x.t);
    return y;
}

/* A node making a new tensor from in (-1: none) with transients, no saved tensor of its own. */
static struct mp_node *t5_node(struct bld *B, const char *name, int in, int out, uint64_t fwd_tmp)
{
    struct mp_node *n = new_node(B, MP_P_CAST, name);
    if (!n)
        return NULL;
    n->in[0] = in;
    n->out = out;
    n->rows = 1;
    n->n = T(B, out)->elems;
    n->fwd_flops = (double)T(B, out)->elems;
    n->bwd_flops = n->fwd_flops;
    tmp_one(B, n, false, MP_TR_OTHER, fwd_tmp);
    return n;
}

/* compute_bias in layer 0 of a stack (UMT5: in every layer): the (q, k) relative positions
 * bucketed (int64 and fp32 (q, k) intermediates: forward transients), looked up in
 * relative_attention_bias (buckets x heads, the parameters' dtype; Embedding saves the int64
 * bucket index) and permuted to (1, heads, q, k): a view, handed to every layer of the stack
 * (UMT5: used by its own layer only). */
static struct val t5_position_bias(struct bld *B, const struct mp_layer *l, uint64_t ql, uint64_t kl)
{
    uint64_t shape[4] = {1, l->attn.heads, ql, kl}, qk = mul(B, ql, kl);
    int w = new_param(B, "relative_attention_bias.weight", l->t5.rel_buckets, l->attn.heads, false);
    if (w >= 0)
        B->p->params[w].embedding = true; /* an nn.Embedding */
    struct val pb = new_val(B, "position_bias", B->p->param_dtype, 4, shape, true);
    struct mp_node *n = t5_node(B, "relative_attention_bias", -1, pb.t, mul(B, qk, 3 * 8));
    if (!n)
        return pb;
    n->param[0] = w;
    extra_as(n, new_flat(B, "relative_position_bucket", MP_DT_I64, qk), MP_XR_POSITION_IDS);
    if (!l->t5.bias_per_layer) /* UMT5: a local of the layer's attention */
        held_tensor(B, pb.t, B->block);
    return pb;
}

/* T5Attention (no 1/sqrt(d) scaling) of x over kv (x itself, or the encoder output) with the
 * position bias pb (1, a, q, k) added to the scores.
 * SDPA (transformers' default for T5): sdpa_attention_forward folds pb into a float attn_mask
 * per layer (create_position_bias_mask): encoder, pb.contiguous() (a copy: pb is a permuted
 * view); causal decoder, torch.where(causal (1, 1, q, k) bool, pb, min) (WhereBackward saves the
 * bool); cross-attention, the shared zeros as they are.  Under autocast SDPA casts the fp32 mask
 * to the half dtype (that copy is saved).  On CUDA a float mask rules out flash: the memory-
 * efficient kernel saves q, k, v, the mask, out and its fp32 logsumexp (b, a, q rounded up to
 * 32); its backward makes the mask's gradient at the expanded (b, a, q, k rounded up to 16) size
 * (_efficient_attention_backward), summed over the batch by ExpandBackward, and keeps delta
 * (b, a, q) and, for half inputs, an fp32 dq accumulator.  (The CPU runs a mask that needs a
 * gradient through the math kernel instead: bench/accuracy/torch_step_results.md.)
 * Eager (eager_attention_forward): contiguous copies of q, k, v for the matmuls (saved), the
 * scores, + pb (promoted: fp32 under autocast), + the decoder's causal mask, a plain softmax
 * (fp32 under CUDA autocast; saves its output), dropout, the probabilities cast to v's dtype
 * (saved by P@V); the bias gradient is the scores' gradient summed over the batch. */
enum t5_attn { T5_ENC_SELF, T5_DEC_SELF, T5_CROSS };

/* The position bias a T5 attention's scores add, a tensor id: cross-attention's zeros, else the
 * stack's relative position bias (made by the layer with rel_buckets). */
static int t5_bias(struct bld *B, const struct mp_layer *l, enum t5_attn kind, enum mp_dtype cdt,
                   const uint64_t *shape4, uint64_t ql, uint64_t kl)
{
    int pb;
    if (kind == T5_CROSS) {
        if (B->cross_bias < 0 || l->t5.bias_per_layer) { /* torch.zeros (1, a, q, k) in q's dtype: made
                                                          by layer 0 and handed on (UMT5: every layer) */
            struct val z = new_val(B, "position_bias_zeros", cdt, 4, shape4,
                                   B->p->opts.hf_checkpointing && !l->t5.bias_per_layer);
            struct mp_node *zn = t5_node(B, "position_bias_zeros", -1, z.t, 0);
            if (zn) {
                zn->no_grad = true;
                zn->grad_in = false;
            }
            B->cross_bias = z.t;
            if (!l->t5.bias_per_layer)
                held_tensor(B, z.t, B->block);
            /* under HF checkpointing T5Attention sets requires_grad on it: a leaf (not UMT5's) */
            if (!failed(B) && B->p->opts.hf_checkpointing && !l->t5.bias_per_layer)
                B->p->held[B->p->n_held - 1].leaf = true;
        }
        pb = B->cross_bias;
    } else {
        if (l->t5.rel_buckets)
            B->pos_bias = t5_position_bias(B, l, ql, kl).t;
        pb = B->pos_bias;
    }
    return pb;
}

static struct val t5_attention(struct bld *B, struct val x, struct val kv, const struct mp_layer *l,
                               enum t5_attn kind, const char *name)
{
    char saved[96], en[112];
    with_prefix(B, B->prefix, name, saved);
    uint64_t h = l->dim, a = l->attn.heads, d = l->attn.head_dim, inner = mul(B, a, d);
    uint64_t b = B->b, ql = B->s, kl = kind == T5_CROSS ? B->s_enc : B->s;
    enum mp_attn_impl impl = B->p->opts.attention_forced || !l->attn.impl_set ? B->p->opts.attention : l->attn.impl;
    bool eager = impl == MP_ATTN_EAGER;
    if (impl == MP_ATTN_FLASH) {
        fail_model(B, MP_ERR_USAGE, "--attention flash: transformers has no flash-attention path for T5 (the "
                                    "position bias is an additive mask): use sdpa or eager");
        restore_prefix(B, saved);
        return x;
    }
    struct val q = lower_linear(B, x, h, inner, false, "q");
    struct val k = lower_linear(B, kv, h, inner, false, "k");
    struct val v = lower_linear(B, kv, h, inner, false, "v");
    if (kind != T5_ENC_SELF && B->m->use_cache && !B->p->opts.hf_checkpointing && !eager) {
        /* EncoderDecoderCache: DynamicLayer.update torch.cat's k and v (self and cross) onto an
         * empty tensor; SDPA saves the copies, the cache holds them until the forward returns */
        k = cast_to(B, k, dt_of(B, k), "k_cache");
        if (!failed(B))
            B->p->nodes[B->p->n_nodes - 1].kv_cached = true;
        v = cast_to(B, v, dt_of(B, v), "v_cache");
        if (!failed(B))
            B->p->nodes[B->p->n_nodes - 1].kv_cached = true;
    }
    if (failed(B)) {
        restore_prefix(B, saved);
        return x;
    }
    enum mp_dtype cdt = dt_of(B, q);
    uint64_t shape4[4] = {1, a, ql, kl}, aqk = mul(B, mul(B, a, ql), kl), baqk = mul(B, b, aqk);
    int pb = t5_bias(B, l, kind, cdt, shape4, ql, kl);
    if (pb < 0) {
        fail_model(B, MP_ERR_MODEL, "no relative position bias before this layer (rel_buckets in layer 0)");
        restore_prefix(B, saved);
        return x;
    }
    if (l->t5.bias_per_layer) /* UMT5: the layer's own, for no other (so each layer leaves the builder
                            * as it found it, and a layer repeats the one before: copies, folds) */
        *(kind == T5_CROSS ? &B->cross_bias : &B->pos_bias) = -1;
    bool pb_grad = T(B, pb)->needs_grad;
    enum mp_dtype pdt = T(B, pb)->dtype;
    struct val y = with_last(B, "attn", q, inner, cdt, true);
    int mask = pb;
    if (!eager && kind != T5_CROSS) {
        enum mp_dtype mdt = B->amp ? cdt : pdt;
        bool f32 = B->amp && pdt == MP_DT_F32; /* an fp32 bias (amp-*; bf16-amp's is bf16) */
        mask = new_val(B, "position_bias_mask", mdt, 4, shape4, true).t;
        /* the fp32 contiguous / where output before its autocast copy */
        struct mp_node *mn = t5_node(B, "position_bias_mask", pb, mask, f32 ? mul(B, aqk, 4) : 0);
        if (mn && kind == T5_DEC_SELF)
            extra_as(mn, new_flat(B, "causal_mask", MP_DT_U8, mul(B, ql, kl)), MP_XR_ATTN_MASK);
        /* backward: the expanded gradient, its batch sum, the sum's fp32 copy (autocast) */
        tmp_one(B, mn, true, MP_TR_OTHER,
                add(B, mul(B, mul(B, mul(B, b, mul(B, a, ql)), round_up(kl, 16)), mp_dtype_size(mdt)),
                    mul(B, aqk, mp_dtype_size(mdt) + (f32 ? 4 : 0))));
    } else if (pb_grad) {
        /* the scores' (or the zeros' mask's) gradient reaches pb: a view node carries it */
        struct mp_node *vn = new_node(B, MP_P_VIEW, "position_bias_grad");
        if (vn) {
            vn->in[0] = vn->out = pb;
            vn->rows = 1;
            vn->n = aqk;
            /* eager: the batch sum of the scores' gradient; SDPA (the zeros under HF checkpointing):
             * the kernel's expanded gradient and its batch sum */
            uint64_t ex = eager ? 0 : mul(B, mul(B, mul(B, b, mul(B, a, ql)), round_up(kl, 16)), mp_dtype_size(pdt));
            tmp_one(B, vn, true, MP_TR_OTHER, add(B, ex, mul(B, aqk, mp_dtype_size(eager ? promote(cdt, pdt) : pdt))));
        }
    }
    if (eager && kind == T5_DEC_SELF && B->dec_mask < 0) {
        /* create_causal_mask: a (b, 1, q, q) float mask in the model's dtype, once per forward */
        B->dec_mask = new_flat(B, "causal_mask", B->p->param_dtype, mul(B, mul(B, b, ql), kl));
        t5_node(B, "causal_mask", -1, B->dec_mask, 0);
        if (!failed(B)) {
            B->p->nodes[B->p->n_nodes - 1].no_grad = true;
            B->p->nodes[B->p->n_nodes - 1].grad_in = false;
        }
        held_tensor(B, B->dec_mask, B->block);
    }
    struct mp_node *n = new_node(B, MP_P_ATTN, "attention");
    if (!n) {
        restore_prefix(B, saved);
        return y;
    }
    n->in[0] = q.t;
    n->in[1] = k.t;
    n->in[2] = v.t;
    n->out = y.t;
    n->heads = n->kv_heads = a;
    n->head_dim = d;
    n->seq = ql;
    n->rows = mul(B, b, ql);
    n->causal = false; /* the causal mask is in the bias */
    n->eager = eager;
    n->p = l->attn.dropout;
    n->keep = mask; /* the mask is an argument, not an input with a gradient slot: alive until it runs */
    uint64_t baq = mul(B, mul(B, b, a), ql);
    if (!eager) {
        save(n, q.t);
        save(n, k.t);
        save(n, v.t);
        save(n, y.t);
        save(n, mask);
        snprintf(en, sizeof en, "lse");
        extra_as(n, new_flat(B, en, MP_DT_F32, mul(B, mul(B, b, a), round_up(ql, 32))), MP_XR_LSE);
        uint64_t gb = T(B, mask)->needs_grad
                          ? mul(B, mul(B, baq, round_up(kl, 16)), mp_dtype_size(T(B, mask)->dtype)) : 0;
        tmp_one(B, n, true, MP_TR_OTHER,
                add(B, add(B, mul(B, baq, 4), cdt != MP_DT_F32 ? mul(B, mul(B, baq, d), 4) : 0), gb));
    } else {
        extra_as(n, new_flat(B, "q_copy", cdt, mul(B, baq, d)), MP_XR_Q_COPY);
        extra_as(n, new_flat(B, "k_copy", cdt, mul(B, mul(B, mul(B, b, a), kl), d)), MP_XR_K_COPY);
        extra_as(n, new_flat(B, "v_copy", cdt, mul(B, mul(B, mul(B, b, a), kl), d)), MP_XR_V_COPY);
        enum mp_dtype sdt = promote(cdt, pdt);            /* scores + pb */
        enum mp_dtype sm = B->amp ? MP_DT_F32 : sdt;       /* softmax: CUDA autocast's fp32 list */
        extra_as(n, new_flat(B, "probs", sm, baqk), MP_XR_PROBS);
        if (l->attn.dropout > 0) {
            extra_as(n, new_flat(B, "dropout_mask", MP_DT_U8, baqk), MP_XR_ATTN_DROP_MASK);
            extra_as(n, new_flat(B, "probs_dropped", sm, baqk), MP_XR_PROBS_DROPPED);
            if (sm != cdt) {
                unsave(n, n->extra[n->n_extra - 1]); /* P@V saves the cast, not the dropped fp32 */
                extra_as(n, new_flat(B, "probs_cast", cdt, baqk), MP_XR_PROBS_CAST);
            }
        } else if (sm != cdt) {
            extra_as(n, new_flat(B, "probs_cast", cdt, baqk), MP_XR_PROBS_CAST);
        }
        /* the scores (* 1.0), + pb, + the decoder's causal mask, ..., op by op (eager_ops) */
        n->score_add[0] = pb;
        n->score_add[1] = kind == T5_DEC_SELF ? B->dec_mask : -1;
    }
    double f = 4.0 * (double)b * (double)a * (double)ql * (double)kl * (double)d;
    n->fwd_flops = f;
    n->bwd_flops = 2.5 * f;
    struct val o = lower_linear(B, y, inner, h, false, "o");
    restore_prefix(B, saved);
    return o;
}

/* T5LayerFF: DenseReluDense (wi, act; or wi_0 act * wi_1), dropout, the cast to wo's dtype (an
 * fp32 copy of the half activation under autocast; wo then casts it back), wo. */
static struct val t5_ff(struct bld *B, struct val x, const struct mp_layer *l, const char *name)
{
    if (base_quant(B, false)) { /* checked before any Linear of the feed-forward */
        fail_model(B, B->m->quant.kind != MP_Q_NONE ? MP_ERR_MODEL : MP_ERR_USAGE,
                   "a quantized T5 is not modelled: transformers keeps wo in fp32 and unquantized "
                   "(_keep_in_fp32_modules), so the feed-forward's dtypes differ; use --finetune lora");
        return x;
    }
    char saved[96];
    with_prefix(B, B->prefix, name, saved);
    uint64_t h = l->dim, F = l->mlp.ffn;
    struct val m;
    if (l->mlp.gated) {
        struct val g = lower_act(B, lower_linear(B, x, h, F, false, "wi_0"), l->mlp.act, false, "act");
        m = lower_mul(B, g, lower_linear(B, x, h, F, false, "wi_1"), "mul");
    } else {
        m = lower_act(B, lower_linear(B, x, h, F, false, "wi"), l->mlp.act, false, "act");
    }
    m = lower_dropout(B, m, l->p, "dropout");
    if (!failed(B) && dt_of(B, m) != B->p->param_dtype)
        m = cast_to(B, m, B->p->param_dtype, "to_wo_dtype");
    struct val y = lower_linear(B, m, F, h, false, "wo");
    restore_prefix(B, saved);
    return y;
}

/* T5Block: x + dropout(SelfAttention(norm(x))); [x + dropout(EncDecAttention(norm(x), encoder
 * output))]; x + dropout(FF(norm(x))).  Module names as transformers': layer.0 / 1 / 2. */
struct val lower_t5_block(struct bld *B, struct val x, const struct mp_layer *l)
{
    uint64_t h = l->dim;
    if (!width_ok(B, x, h, "dim", ""))
        return x;
    if (l->t5.cross_attn && B->enc_out < 0) {
        fail_model(B, MP_ERR_MODEL, "a T5 decoder block needs the decoder embedding (dec_input) before it");
        return x;
    }
    if (l->t5.cross_attn && !B->dec_started) { /* the first decoder layer: checkpoint inputs hold it */
        B->dec_started = true;
        for (size_t j = 0; j < B->p->n_held; j++)
            if (B->p->held[j].t == B->enc_out)
                B->p->held[j].release = B->block;
    }
    B->p->probe_unsupported = "T5's encoder-decoder attention (relative position bias, cross-attention)";
    char p0[24], p1[24], p2[24];
    snprintf(p0, sizeof p0, "layer.0");
    snprintf(p1, sizeof p1, "layer.1");
    snprintf(p2, sizeof p2, "layer.%d", l->t5.cross_attn ? 2 : 1);
    char sv[96];
    with_prefix(B, B->prefix, p0, sv);
    struct val n0 = lower_t5_norm(B, x, h, "layer_norm");
    struct val a = t5_attention(B, n0, n0, l, l->t5.cross_attn ? T5_DEC_SELF : T5_ENC_SELF, "SelfAttention");
    restore_prefix(B, sv);
    x = lower_add(B, x, lower_dropout(B, a, l->p, "layer.0.dropout"), "layer.0.residual");
    if (l->t5.cross_attn) {
        struct val e = {.t = B->enc_out, .rank = 3, .shape = {B->b, B->s_enc, h}};
        with_prefix(B, B->prefix, p1, sv);
        struct val c = t5_attention(B, lower_t5_norm(B, x, h, "layer_norm"), e, l, T5_CROSS, "EncDecAttention");
        restore_prefix(B, sv);
        x = lower_add(B, x, lower_dropout(B, c, l->p, "layer.1.dropout"), "layer.1.residual");
    }
    with_prefix(B, B->prefix, p2, sv);
    struct val f = t5_ff(B, lower_t5_norm(B, x, h, "layer_norm"), l, "DenseReluDense");
    f = lower_dropout(B, f, l->p, "dropout");
    restore_prefix(B, sv);
    char rn[32];
    snprintf(rn, sizeof rn, "%s.residual", p2);
    return lower_add(B, x, f, rn);
}

/* The decoder's embedding: decoder_input_ids = _shift_right(labels) (new_zeros, a shifted clone,
 * masked_fill_ of -100: int64 (b, t), made when the decoder starts, saved by the lookup), looked
 * up in the shared table.  The incoming value is the encoder output: held for every decoder
 * layer's cross-attention (checkpoint inputs under checkpointing).  From here on the sequence is
 * the decoder's. */
struct val lower_t5_decoder_embed(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    if (failed(B))
        return x;
    if (B->embed_param < 0 || !width_ok(B, x, l->dim, "dim", nm)) {
        fail_model(B, MP_ERR_MODEL, "a decoder embedding needs the encoder (its shared table and output) before it");
        return x;
    }
    B->enc_out = x.t;
    held_tensor(B, x.t, B->block);
    B->s_enc = B->s;
    B->s = B->p->opts.target_seq;
    B->pos_bias = -1;
    uint64_t shape[3] = {B->b, B->s, l->dim};
    struct val ids = new_val(B, "decoder_input_ids", MP_DT_I64, 2, shape, false);
    struct mp_node *sn = t5_node(B, "shift_right", B->m->dec_from_input ? B->p->input : B->p->labels, ids.t,
                                 add(B, T(B, ids.t)->bytes, mul(B, B->b, B->s)));
    if (sn) {
        sn->no_grad = true;
        sn->grad_in = false;
    }
    struct val y = new_val(B, nm, B->p->param_dtype, 3, shape, true);
    struct mp_node *n = new_node(B, MP_P_EMBED, nm);
    if (!n)
        return y;
    n->in[0] = ids.t;
    n->out = y.t;
    n->param[0] = B->embed_param;
    save(n, ids.t);
    n->rows = mul(B, B->b, B->s);
    n->n = l->dim;
    n->k = l->vocab;
    n->fwd_flops = (double)T(B, y.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return lower_dropout(B, y, l->emb.dropout, "dropout");
}
