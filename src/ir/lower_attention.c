/* lower_attention.c — rotary embeddings, attention (SDPA, flash, eager) and multi-head latent attention
 * (build.h). */
#include "build.h"

#include <stdio.h>
#include <string.h>

static struct val lower_rope(struct bld *B, struct val x, const struct mp_layer *l, uint64_t heads,
                             const char *name)
{
    if (failed(B))
        return x;
    /* q * cos + rotate_half(q) * sin is in the promoted dtype (fp32 under autocast, the table
     * being in the fp32 residual's dtype).  memplan keeps x's dtype where SDPA follows (its autocast
     * makes the half copy it saves either way); a q/k norm after the rotary gets the promoted one */
    enum mp_dtype ydt = dt_of(B, x);
    if (l->attn.qk_norm_late && !l->rope.cast_back && !l->mla.rope_complex)
        ydt = promote(ydt, l->rope.fp32 ? MP_DT_F32 : B->p->param_dtype);
    struct val y = like(B, name, x, ydt, ng(B, x));
    struct mp_node *n = new_node(B, MP_P_ROPE, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->heads = heads;
    n->head_dim = l->attn.head_dim;
    n->rotary_dim = l->rope.dim ? l->rope.dim : l->attn.head_dim;
    uint64_t tmp = mul(B, T(B, x.t)->bytes, 2);
    bool q_call = !strcmp(name, "q_rope");
    /* the positions the tables cover: s (the model's own position ids, (1, s)), or every row's
     * where the collator passes (b, s) position ids (packing: they restart per document), so the
     * rotary embedding's cos and sin are (b, s, rotary_dim) (LlamaRotaryEmbedding.forward) */
    uint64_t pos = B->p->opts.packing || B->p->opts.padding_free ? mul(B, B->b, B->s) : B->s;
    if (l->rope.interleave && !q_call) {
        save(n, B->rope_pair); /* k: the layer's pair, made by q's call */
        B->rope_pair = -1;     /* no other's (each layer leaves the builder as it found it:
                                * copies, folds) */
    } else if (l->rope.interleave) {
        /* apply_rotary_pos_emb slices the model's cos/sin to rotary_dim/2 and repeat_interleave's
         * them: a new (1, 1, s, rotary_dim) pair per layer, in the table's dtype (the residual
         * dtype; fp32 for ERNIE 4.5), saved by q's and k's products.  The model's table (made
         * once, by the first layer here) is saved by nobody: a forward local */
        enum mp_dtype cdt = l->rope.fp32 ? MP_DT_F32 : B->p->param_dtype;
        uint64_t pair = mul(B, mul(B, 2, pos), n->rotary_dim);
        if (B->rope_cos_sin < 0) {
            B->rope_cos_sin = new_flat(B, "rope.cos_sin", cdt, pair);
            extra_as(n, B->rope_cos_sin, MP_XR_COS_SIN);
            unsave(n, B->rope_cos_sin);
            held_tensor(B, B->rope_cos_sin, B->block); /* a checkpoint input under checkpointing */
            const char *bn[2] = {"rotary_emb.inv_freq", "rotary_emb.original_inv_freq"};
            for (int i = 0; i < 2 && B->p->n_buffers < MP_BUFFERS_MAX; i++)
                B->p->buffers[B->p->n_buffers++] = new_flat(B, bn[i], MP_DT_F32, mp_ceil_div(n->rotary_dim, 2));
        }
        char en[112];
        snprintf(en, sizeof en, "%s.cos_sin", name);
        B->rope_pair = new_flat(B, en, cdt, pair);
        extra_as(n, B->rope_pair, MP_XR_COS_SIN);
    } else if (l->rope.table_rows) {
        /* GPT-J: cos and sin gathered from the layer's table for the s positions (position ids
         * of batch 1), cast to x's dtype, repeat_interleave'd: each apply_rotary_pos_emb saves
         * its own pair (1, s, 1, rotary_dim); the table's repeat and the fp32 gather are
         * forward transients */
        char en[112];
        snprintf(en, sizeof en, "%s.cos_sin", name);
        extra_as(n, new_flat(B, en, dt_of(B, x), mul(B, mul(B, 2, pos), n->rotary_dim)), MP_XR_COS_SIN);
        /* (packed: position ids (b, s), so _get_embed_positions repeats the table b times) */
        uint64_t tab = pos == B->s ? l->rope.table_rows : mul(B, B->b, l->rope.table_rows);
        tmp = add(B, tmp, mul(B, mul(B, add(B, tab, pos), n->rotary_dim), 4));
    } else if (B->rope_cos_sin < 0) {
        /* cos and sin (s x rotary_dim each, in the residual dtype) are made once per
         * forward and saved by every q*cos / rotate_half(q)*sin of every layer */
        /* (one pair per distinct layer type where the model keeps a table per type: Gemma3,
         * OLMo3; counted as one tensor) */
        /* (generate's position ids are (b, s), from the attention mask: a pair per sample) */
        /* (Llama 4: one complex64 table freqs_cis (1, s, rotary_dim / 2), rotary_dim fp32 a row) */
        uint64_t kinds = l->rope.kinds > 1 ? l->rope.kinds : 1,
                 rows = l->rope.per_sample || B->p->opts.gen_cache ? mul(B, B->b, B->s) : pos;
        bool cplx = l->mla.rope_complex && !l->mla.kv_lora;
        B->rope_cos_sin = new_flat(B, "rope.cos_sin", l->rope.fp32 || cplx ? MP_DT_F32 : B->p->param_dtype,
                                   mul(B, mul(B, mul(B, cplx ? 1 : 2, kinds), rows), n->rotary_dim));
        extra_as(n, B->rope_cos_sin, MP_XR_COS_SIN);
        if (l->vision && B->m->vision.kind == MP_VIS_LLAMA4) {
            /* Llama 4's vision rotary (modeling_llama4.py Llama4VisionRotaryEmbedding :973-1000): a
             * registered buffer freqs_ci, complex64 (patches + 1, 1, head_dim / 2), resident like
             * the model's buffers; every layer's products read (and MulBackward0 saves) it */
            unsave(n, B->rope_cos_sin);
            if (B->p->n_buffers < MP_BUFFERS_MAX)
                B->p->buffers[B->p->n_buffers++] = B->rope_cos_sin;
            else
                fail_model(B, MP_ERR_INTERNAL, "too many module buffers");
            goto made;
        }
        if (l->vision && MP_VIS_IS_QWEN(B->m->vision.kind)) {
            /* Qwen2-VL's vision rotary (--images): the tower's fp32 (patches, head_dim) cos and sin,
             * made once per forward, held like the text's (a checkpoint input of every block); its
             * VisionRotaryEmbedding registers one inv_freq of head_dim / 4 fp32 */
            held_tensor(B, B->rope_cos_sin, B->block);
            if (B->p->n_buffers < MP_BUFFERS_MAX)
                B->p->buffers[B->p->n_buffers++] =
                    new_flat(B, "rotary_pos_emb.inv_freq", MP_DT_F32, mp_ceil_div(n->rotary_dim, 4));
            goto made;
        }
        if (B->vision) /* Pixtral's tower (--images): its own tables, a local of its forward,
                        * saved or a checkpoint input to the first layer's backward */
            held_tensor(B, B->rope_cos_sin, B->block);
        else
            B->p->rope_tables = B->rope_cos_sin;
        /* HF's rotary embedding registers inv_freq and a clone, original_inv_freq
         * (persistent=False: not in the checkpoint, but on the GPU): rotary_dim/2 fp32 each,
         * per layer type where there is a table per type */
        const char *bn[2] = {"rotary_emb.inv_freq", "rotary_emb.original_inv_freq"};
        for (int i = 0; i < 2 && B->p->n_buffers < MP_BUFFERS_MAX; i++)
            B->p->buffers[B->p->n_buffers++] =
                new_flat(B, bn[i], MP_DT_F32, mul(B, kinds, mp_ceil_div(n->rotary_dim, 2)));
    } else {
        save(n, B->rope_cos_sin);
    }
made:
    /* products and sum in fp32 (ERNIE, Cohere: q.float() too), cast back */
    if (l->rope.cast_back && dt_of(B, x) != MP_DT_F32)
        tmp = mul(B, mul(B, T(B, x.t)->elems, 4), 3);
    n->seq = B->s;
    n->rows = rows_of(x);
    n->n = last_dim(x);
    /* q*cos, rotate_half(q) (a cat of two halves) and *sin: two x-sized temporaries (x may be a
     * view of the rotary part of each head, DeepSeek's MLA: its part; DeepSeek-V2's complex rotary
     * makes an fp32 copy and an fp32 product) */
    uint64_t xe = l->mla.kv_lora ? val_elems(B, x) : T(B, x.t)->elems;
    if (l->mla.kv_lora)
        tmp = mul(B, mul(B, xe, l->mla.rope_complex ? 4 : mp_dtype_size(dt_of(B, x))), 2);
    /* Llama 4's apply_rotary_emb (modeling_llama4.py:223-232): view_as_complex of xq.float() times
     * freqs_cis (which MulBackward0 saves: the model's table; the fp32 q is not saved, the table
     * needing no gradient), view_as_real, type_as(xq): a half x makes an fp32 copy and an fp32
     * product before its cast back; an fp32 x makes only the product, the output */
    else if (l->mla.rope_complex)
        tmp = dt_of(B, x) == MP_DT_F32 ? 0 : mul(B, mul(B, xe, 4), 2);
    tmp_one(B, n, false, MP_TR_OTHER, tmp);
    n->fwd_flops = 3.0 * (double)xe;
    n->bwd_flops = n->fwd_flops;
    return y;
}

/* Does attention layer l get a (b, 1, s, s) mask: always (Falcon builds one even for causal
 * attention), or on a sliding-window layer once the sequence reaches the window (transformers'
 * masking_utils then builds the mask instead of relying on SDPA's is_causal:
 * _ignore_causal_mask_sdpa). */
static bool sdpa_masked(const struct bld *B, const struct mp_layer *l)
{
    return l->attn.mask || (l->attn.window && B->s >= l->attn.window);
}

/* Rows with images (--images: Gemma3Processor's token_type_ids make Gemma3Model.forward call
 * create_masks_for_vision_model, whose or_mask_function lets each image's tokens see each other:
 * the full and the sliding masks materialised as bool masks, as for packed rows).
 * Packed rows under SDPA (--packing, --tokens-per-batch): transformers finds the documents from
 * the position ids (masking_utils.py find_packed_sequence_indices, transformers 5.24.0:735-764),
 * then never skips the mask (create_causal_mask :991-1002 sets allow_is_causal_skip false and ands
 * packed_sequence_mask_function in), so sdpa_mask (:536-547) materialises the (b, 1, s, s) bool
 * block-diagonal causal mask.  Flash attention runs varlen instead (cu_seqlens, no mask); eager
 * gets its float mask packed or not. */
static bool sdpa_packed(const struct bld *B, const struct mp_layer *l, enum mp_attn_impl impl)
{
    return (B->p->opts.packing || B->p->opts.padding_free || (B->m->images && B->m->vision.kind == MP_VIS_SIGLIP)) &&
           impl == MP_ATTN_SDPA && l->attn.causal;
}

/* The (b, 1, s, s) mask a model passes to attention (sdpa_masked, sdpa_packed; transformers'
 * create_causal_mask): made once per forward (the first attention
 * node's extra, held like the rotary tables).  For SDPA it is a bool mask that SDPA converts to
 * a float mask in q's dtype in every layer (convert_boolean_attn_mask) and saves; for eager
 * attention a float mask in the model's dtype, added to the scores: nothing saved. */
static void attn_mask(struct bld *B, struct mp_node *n, const char *name, bool eager, bool packed,
                      enum mp_dtype qdt)
{
    if (n && n->layer->attn.block_mask) {
        /* Pixtral (--images): generate_block_attention_mask's float (1, 1, s, s) mask in the
         * patches' dtype (torch.full, then its blocks zeroed in place, expanded: a view), made
         * once by the tower's forward: saved by SDPA (under autocast its half copy, made and
         * saved in every layer), added by eager; held like the tower's rotary tables */
        if (B->attn_mask < 0) {
            B->attn_mask = new_flat(B, "vision.attn_mask", B->p->param_dtype, mul(B, mul(B, B->b, B->s), B->s));
            extra_as(n, B->attn_mask, MP_XR_ATTN_MASK);
            unsave(n, B->attn_mask);
            held_tensor(B, B->attn_mask, B->block);
        }
        if (eager) {
            n->score_add[0] = B->attn_mask;
        } else if (qdt != B->p->param_dtype && B->m->vision.kind == MP_VIS_MLLAMA) {
            /* Mllama's tower mask (fp32 under amp-*): its half cast is not among what torch saves
             * (measured: bench/accuracy/mllama_images_results.md), the fp32 mask is: a transient
             * of each layer's SDPA */
            save(n, B->attn_mask);
            tmp_one(B, n, false, MP_TR_OTHER, mul(B, mul(B, mul(B, B->b, B->s), B->s), mp_dtype_size(qdt)));
        } else if (qdt != B->p->param_dtype) {
            char en[112];
            snprintf(en, sizeof en, "%s.attn_mask_cast", name);
            extra_as(n, new_flat(B, en, qdt, mul(B, mul(B, B->b, B->s), B->s)), MP_XR_ATTN_MASK);
        } else {
            save(n, B->attn_mask);
        }
        return;
    }
    if (!n || !(sdpa_masked(B, n->layer) || packed || (eager && n->layer->attn.eager_mask)))
        return;
    uint64_t mb = mul(B, mul(B, B->b, B->s), B->s);
    if (B->attn_mask < 0) { /* (packed: one bool mask per kind, as eager's, Gemma2's sliding and full) */
        uint64_t nm = (eager || packed) && n->layer->attn.eager_mask > 1 ? n->layer->attn.eager_mask : 1;
        B->attn_mask = new_flat(B, "attn_mask", eager ? B->p->param_dtype : MP_DT_U8, mul(B, mb, nm));
        T(B, B->attn_mask)->name = store_name(B, "", "attn_mask");
        B->p->attn_mask = B->attn_mask;
        extra_as(n, B->attn_mask, MP_XR_ATTN_MASK);
        unsave(n, B->attn_mask);
    }
    if (!eager) {
        char en[112];
        snprintf(en, sizeof en, "%s.attn_mask_float", name);
        extra_as(n, new_flat(B, en, qdt, mb), MP_XR_ATTN_MASK);
    }
}

/* SDPA's math kernel on CUDA (docs/memory-facts.md#sdpa-math): grouped-query attention (fewer k/v
 * heads than q heads) in fp32, without a mask, before torch 2.15.  transformers passes
 * enable_gqa=True there (sdpa_attention.py use_gqa_in_sdpa, transformers 5.24.0:42-51: no mask,
 * equal k and v head dims <= 256); torch's dispatcher (aten/src/ATen/native/transformers/cuda/
 * sdp_utils.cpp select_sdp_backend) then finds: cuDNN and flash take only fp16/bf16
 * (check_dtypes_low_precision), and the memory-efficient kernel, before pytorch/pytorch#191085,
 * checks the heads with check_batch_size_and_num_heads_dense<supports_gqa = false>, which
 * refuses q heads != k heads whatever enable_gqa says: math.  Measured on an H200 with torch 2.11
 * (the bench/gpu kit's report: "math (no fused SDPA op seen)" for both fp32 Qwen2-0.5B rows).
 * torch 2.15 (nn/functional.py scaled_dot_product_attention: "Memory-efficient attention also
 * supports GQA on NVIDIA CUDA"; pytorch/pytorch#191085, 2026-07) runs the memory-efficient kernel
 * instead; 2.12 to 2.14 are not checked here and get the math kernel (an overestimate if they have
 * the change; a third party quotes the same sentence from 2.14's documentation).
 * --torch says which (0, the default: 2.15).  A masked or packed layer gets k and v repeated to
 * every head by transformers first (repeat_kv: core.kv_heads = heads here), so the fused kernels
 * take it. */
static bool sdpa_math(const struct bld *B, const struct mp_layer *l, enum mp_attn_impl impl, enum mp_dtype qdt,
                      uint64_t d, uint64_t dv)
{
    unsigned torch = B->p->opts.torch;
    return impl == MP_ATTN_SDPA && torch && torch < MP_TORCH_MEMEFF_GQA && l->attn.kv_heads < l->attn.heads &&
           qdt == MP_DT_F32 && d == dv && d <= 256 && !sdpa_masked(B, l) && !sdpa_packed(B, l, impl);
}

const char *mp_sdpa_backend_str(enum mp_sdpa_backend b)
{
    static const char *const names[] = {"", "cudnn", "flash", "efficient", "math"};
    return (unsigned)b < sizeof names / sizeof names[0] ? names[b] : "";
}

/* torch 2.15's select_sdp_backend for dense CUDA inputs in training (aten/src/ATen/native/
 * transformers/cuda/sdp_utils.cpp, docs/memory-facts.md#sdpa-backend): the priority order is
 * cuDNN, flash, memory-efficient, math where check_prefer_cudnn_attention holds (compute
 * capability 9.0 or 10.0, cuDNN >= 9.9, TORCH_CUDNN_SDPA_PREFERRED not off), else flash,
 * memory-efficient, math (cuDNN last); the first whose checks pass runs. */
static bool cc_in(int major, int minor, int lo_major, int lo_minor, int hi_major, int hi_minor)
{
    return (major > lo_major || (major == lo_major && minor >= lo_minor)) &&
           (major < hi_major || (major == hi_major && minor <= hi_minor));
}

enum mp_sdpa_backend mp_sdpa_backend(int major, int minor, enum mp_dtype dt, uint64_t d, uint64_t dv, bool masked,
                                     bool dropout, bool math)
{
    if (math)
        return MP_SDPA_MATH;
    if (major <= 0)
        return MP_SDPA_UNKNOWN;
    bool half = dt == MP_DT_F16 || dt == MP_DT_BF16;
    /* check_dtypes_low_precision: fp16 and bf16 from sm80, fp16 before */
    bool low = major >= 8 ? half : dt == MP_DT_F16;
    /* check_cudnn_tensor_shapes: head dims multiples of 8, at most 128 (256 on sm90 from cuDNN
     * 9.10); check_cudnn_hardware_support sm80-sm121; a mask of SDPA's shapes is taken */
    if ((major == 9 || major == 10) && minor == 0 && low && d % 8 == 0 && dv % 8 == 0 &&
        d <= (major == 9 ? 256u : 128u) && dv <= (major == 9 ? 256u : 128u))
        return MP_SDPA_CUDNN;
    /* can_use_flash_attention: sm80-sm121, no attn_mask, equal head dims <= 256, and on sm86-89
     * and sm120-121 no training with a head dim in (192, 224] or above 224 with dropout */
    bool sm86 = cc_in(major, minor, 8, 6, 8, 9) || cc_in(major, minor, 12, 0, 12, 1);
    if (cc_in(major, minor, 8, 0, 12, 1) && low && !masked && d == dv && d <= 256 &&
        !(sm86 && ((d > 192 && d <= 224) || (d > 224 && dropout))))
        return MP_SDPA_FLASH;
    /* can_use_mem_efficient_attention: sm50-sm121; fp16, fp32 (and bf16 from sm80); head dims
     * multiples of minimum_gemm_alignment (tensor cores: 128 bits / the element; before sm80
     * fp32 has none: 1) */
    bool dt_ok = dt == MP_DT_F32 || dt == MP_DT_F16 || (major >= 8 && dt == MP_DT_BF16);
    uint64_t align = major >= 8 ? (half ? 8 : 4) : (major >= 7 && half ? 8 : 1);
    if (cc_in(major, minor, 5, 0, 12, 1) && dt_ok && d % align == 0 && dv % align == 0)
        return MP_SDPA_EFFICIENT;
    return MP_SDPA_MATH;
}

/* Scaled dot-product attention core: q (b,s,a*d), k (b,s,kv*d) and v (b,s,kv*dv).  Eager
 * attention makes contiguous copies of the inputs that are transposed views (copies: bit 0 q,
 * bit 1 k, bit 2 v; DeepSeek's q and k are fresh (b,a,s,d) tensors, its v a view). */
static struct val lower_attn_core(struct bld *B, struct val q, struct val k, struct val v, const struct mp_layer *l,
                                  uint64_t d, uint64_t dv, unsigned copies, const char *name)
{
    if (failed(B))
        return q;
    enum mp_attn_impl impl = B->p->opts.attention_forced || !l->attn.impl_set ? B->p->opts.attention : l->attn.impl;
    enum mp_dtype cdt = dt_of(B, q);
    /* SDPA's math kernel is eager attention's chain of ops (eager_ops) on its own copies */
    bool math = sdpa_math(B, l, impl, cdt, d, dv), eager = impl == MP_ATTN_EAGER || math;
    enum mp_sdpa_backend bk = impl != MP_ATTN_SDPA ? MP_SDPA_UNKNOWN
                              : mp_sdpa_backend(B->p->opts.cc_major, B->p->opts.cc_minor, cdt, d, dv,
                                                sdpa_masked(B, l) || sdpa_packed(B, l, impl), l->attn.dropout > 0, math);
    if (impl == MP_ATTN_SDPA && !B->p->sdpa_head_dim) { /* the first SDPA layer's, reported */
        B->p->sdpa_head_dim = d;
        B->p->sdpa_dtype = cdt;
        B->p->sdpa_backend = (int)bk;
    }
    uint64_t b = B->b, s = B->s, a = l->attn.heads;
    struct val y = with_last(B, name, q, mul(B, a, dv), cdt, true);
    struct mp_node *n = new_node(B, MP_P_ATTN, name);
    if (!n)
        return y;
    n->in[0] = q.t;
    n->in[1] = k.t;
    n->in[2] = v.t;
    n->out = y.t;
    n->heads = a;
    n->kv_heads = l->attn.kv_heads;
    n->head_dim = d;
    n->seq = s;
    n->rows = mul(B, b, s);
    n->causal = l->attn.causal;
    n->eager = eager;
    n->p = l->attn.dropout;
    uint64_t asb = mul(B, mul(B, a, s), b);      /* a*s*b */
    uint64_t ass = mul(B, asb, s);                /* a*s*s*b */
    char en[80];
    if (!(l->attn.block_mask && impl == MP_ATTN_FLASH)) /* Pixtral under flash: cu_seqlens, no mask */
        attn_mask(B, n, name, impl == MP_ATTN_EAGER, sdpa_packed(B, l, impl), cdt);
    if (impl == MP_ATTN_EAGER && (l->attn.mask || l->attn.eager_mask))
        n->score_add[0] = B->attn_mask;
    if (math) {
        /* _scaled_dot_product_attention_math (aten/src/ATen/native/transformers/attention.cpp),
         * traced op by op with torch 2.15 on the CPU (bench/accuracy/sdpa_math.py): q * sqrt(scale)
         * (b,a,s,d); for is_causal an (s, s) bool ones().tril() turned into an (s, s) float mask;
         * k and v repeat_interleave'd to every head (unsqueeze, expand, clone: (b,a,s,d) each);
         * k^T * sqrt(scale) (b,a,d,s); scores = bmm; + mask (a new (b,a,s,s)); _safe_softmax;
         * bmm with v.  Saved: the scaled q and k^T, the repeated v and the probabilities, which are
         * eager's q, k and v copies and probs, with the scale applied to the scores instead (same
         * bytes: the scale's new tensor stands for the mask add's).  The float mask and the
         * repeated k (before its scaling) are the function's locals: alive to its end, a forward
         * transient of the node. */
        B->p->sdpa_math = true;
        uint64_t mask = l->attn.causal ? mul(B, mul(B, s, s), mp_dtype_size(cdt)) : 0;
        tmp_one(B, n, false, MP_TR_OTHER, add(B, mask, mul(B, mul(B, asb, d), mp_dtype_size(cdt))));
    }
    if (!eager) {
        /* SDPA flash / mem-efficient: saves q, k, v, out and the fp32 logsumexp. */
        save(n, q.t);
        save(n, k.t);
        save(n, v.t);
        save(n, y.t);
        /* q/k and v widths that differ (DeepSeek's MLA) rule out flash, and so does a target where
         * torch picks the memory-efficient kernel (mp_sdpa_backend: fp16 before sm80): its
         * logsumexp rows are rounded up to 32 in every dtype (_efficient_attention_forward) */
        uint64_t s_lse = cdt == MP_DT_F32 || dv != d || bk == MP_SDPA_EFFICIENT ? round_up(s, 32) : s;
        snprintf(en, sizeof en, "%s.lse", name);
        extra_as(n, new_flat(B, en, MP_DT_F32, mul(B, mul(B, a, b), s_lse)), MP_XR_LSE);
        /* backward: softmax_d [b,a,s_r] and dq_accum [b,s_r,a,d_r] in fp32 (flash_api mha_bwd);
         * grouped-query attention in a half dtype also makes dK and dV at every q head, in q's
         * dtype, then sums each group (flash_api.cpp mha_bwd: dk_expanded, dv_expanded; cuDNN's
         * workspace measured so on an H200, b*a*s*(8d + 4) + 256 bytes against b*a*s*(4d + 4) + 256
         * without groups: bench/gpu/sdpa_ws.py, docs/memory-facts.md#sdpa-gqa-backward) */
        uint64_t s_r = round_up(s, 128), d_r = round_up(d, 32);
        const enum mp_trole fr[3] = {MP_TR_FLASH_D, MP_TR_FLASH_DQ, MP_TR_OTHER};
        const uint64_t fb[3] = {mul(B, mul(B, mul(B, b, a), s_r), 4), mul(B, mul(B, mul(B, mul(B, b, s_r), a), d_r), 4),
                                mul(B, mul(B, asb, add(B, d, dv)), mp_dtype_size(cdt))};
        bool gqa_bwd = l->attn.kv_heads < a && cdt != MP_DT_F32;
        tmp_parts(B, n, true, gqa_bwd ? 3 : 2, fr, fb);
    } else {
        /* Eager: contiguous copies of q, k, v (reshape of transposed views, repeat_kv),
         * scores, softmax (fp32 under autocast), its cast, dropout. */
        const char *cn[3] = {"q_copy", "k_copy", "v_copy"};
        const enum mp_xrole cr[3] = {MP_XR_Q_COPY, MP_XR_K_COPY, MP_XR_V_COPY};
        const int in3[3] = {q.t, k.t, v.t};
        for (int i = 0; i < 3; i++) {
            if (!(copies & (1u << i))) { /* already a contiguous (b,a,s,d) tensor: the matmul saves it */
                save(n, in3[i]);
                continue;
            }
            /* GPT-J upcasts q and k to fp32 (under autocast the matmul casts them back) */
            enum mp_dtype qdt = i < 2 && l->attn.qk_fp32 && !B->amp ? MP_DT_F32 : cdt;
            snprintf(en, sizeof en, "%s.%s", name, cn[i]);
            extra_as(n, new_flat(B, en, qdt, mul(B, asb, i == 2 ? dv : d)), cr[i]);
        }
        if (l->attn.softcap > 0) { /* scores / cap, tanh (saves its output), * cap (Gemma2) */
            snprintf(en, sizeof en, "%s.softcap_tanh", name);
            extra_as(n, new_flat(B, en, cdt, ass), MP_XR_SOFTCAP_TANH);
        }
        /* softmax in fp32: under autocast (softmax is on CUDA's fp32 list), or asked for
         * (softmax(..., dtype=torch.float32).to(q.dtype) in most HF decoders) */
        enum mp_dtype sm = B->amp || l->attn.softmax_fp32 ? MP_DT_F32 : cdt;
        snprintf(en, sizeof en, "%s.probs", name);
        extra_as(n, new_flat(B, en, sm, ass), MP_XR_PROBS); /* softmax saves its output */
        if (l->attn.dropout > 0) {
            snprintf(en, sizeof en, "%s.dropout_mask", name);
            extra_as(n, new_flat(B, en, MP_DT_U8, ass), MP_XR_ATTN_DROP_MASK);
            snprintf(en, sizeof en, "%s.probs_dropped", name); /* saved by P@V */
            extra_as(n, new_flat(B, en, cdt, ass), MP_XR_PROBS_DROPPED);
        } else if (sm != cdt) {
            snprintf(en, sizeof en, "%s.probs_cast", name); /* probs.to(v dtype), saved by P@V */
            extra_as(n, new_flat(B, en, cdt, ass), MP_XR_PROBS_CAST);
        }
        /* the scores, their transients and the output heads: op by op, forward and backward
         * (eager_ops, once the program knows which inputs need a gradient) */
    }
    double f = 4.0 * (double)b * (double)a * (double)s * (double)s * (double)d;
    if (l->attn.causal && !eager)
        f /= 2.0;
    n->fwd_flops = f;
    n->bwd_flops = 2.5 * f;
    return y;
}

/* RMSNorm of a q or k projection: over each head (the (b, s, heads, d) view; weight d) or
 * over the whole projection. */
static struct val qk_norm(struct bld *B, struct val x, const struct mp_layer *l, uint64_t heads, const char *name)
{
    if (failed(B) || l->attn.qk_norm == MP_QK_NORM_ALL)
        return lower_rmsnorm(B, x, last_dim(x), l->norm.rms_fp32, name);
    struct val v = x; /* (b, s, heads, d): a view */
    v.rank = x.rank + 1;
    v.shape[x.rank - 1] = heads;
    v.shape[x.rank] = l->attn.head_dim;
    struct val y = l->attn.qk_norm == MP_QK_NORM_L2 ? lower_l2_norm(B, v, l->attn.head_dim, name)
                                                    : lower_rmsnorm(B, v, l->attn.head_dim, l->norm.rms_fp32, name);
    y.rank = x.rank;
    y.shape[x.rank - 1] = last_dim(x);
    if (!failed(B)) { /* the output tensor is stored (b, s, heads * d), like q */
        struct mp_tensor *t = T(B, y.t);
        t->rank = y.rank;
        memcpy(t->shape, y.shape, sizeof t->shape);
    }
    return y;
}

static struct val lower_mla(struct bld *B, struct val x, const struct mp_layer *l, uint64_t h);

/* A copy of x, width wide (Falcon's split of its fused qkv): tmp, the intermediate copies it
 * makes first (forward transients); index, an advanced-indexing copy that saves its int64 index. */
static struct val split_copy(struct bld *B, struct val x, uint64_t width, uint64_t tmp, bool index,
                             const char *name)
{
    if (failed(B))
        return x;
    struct val y = with_last(B, name, x, width, dt_of(B, x), ng(B, x));
    struct mp_node *n = new_node(B, MP_P_CAST, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->rows = rows_of(x);
    n->n = width;
    n->fwd_flops = (double)T(B, y.t)->elems;
    n->bwd_flops = n->fwd_flops;
    if (index) {
        char en[112];
        snprintf(en, sizeof en, "%s.index", name);
        extra_as(n, new_flat(B, en, MP_DT_I64, 1), MP_XR_SPLIT_INDEX);
    }
    tmp_one(B, n, false, MP_TR_OTHER, tmp);
    return y;
}

/* GPT-J: every attention layer registers its own sinusoid table (rope_table_rows x rotary_dim
 * fp32, persistent=False: on the GPU, not in the checkpoint).  One resident tensor holds them all
 * (m->pos_table_elems; a model made without mp_model_mark_copies: grown layer by layer). */
static void pos_table(struct bld *B, const struct mp_layer *l)
{
    uint64_t e = mul(B, l->rope.table_rows, l->rope.dim ? l->rope.dim : l->attn.head_dim);
    if (failed(B))
        return;
    if (B->pos_tables < 0) {
        if (B->p->n_buffers >= MP_BUFFERS_MAX) {
            fail_model(B, MP_ERR_INTERNAL, "too many module buffers");
            return;
        }
        B->pos_tables = new_flat(B, "embed_positions", MP_DT_F32, B->m->pos_table_elems ? B->m->pos_table_elems : e);
        T(B, B->pos_tables)->name = store_name(B, "", "attn.embed_positions (all layers)");
        B->p->buffers[B->p->n_buffers++] = B->pos_tables;
        return;
    }
    if (B->m->pos_table_elems) /* every layer's, made with the first (so each later layer leaves the
                                * program as it found it: copies, folds) */
        return;
    struct mp_tensor *t = T(B, B->pos_tables);
    t->elems = add(B, t->elems, e);
    t->shape[0] = t->elems;
    t->bytes = mul(B, t->elems, 4);
}

/* transformers' repeat_kv(x, heads / kv_heads): expand(b, kv, n_rep, s, d).reshape(b, heads, s, d).
 * More than one kv head: the reshape copies every head (b, s, width) in x's dtype (saved by SDPA
 * in its place).  One kv head: the reshape is a view (SDPA saves x's storage, nothing is made),
 * unless autocast then casts it: that copy has every head.  Under amp the rotated k is fp32 in
 * torch (q * cos, cos in the fp32 residual's dtype; memplan's rope keeps x's dtype, and the bytes
 * SDPA saves are the same), so `rotated` says it is cast (not under bf16-amp: cos is bf16).  Not modelled:
 * the view's gradient, every head wide, before the expand's backward sums it.  The copy widens
 * its input, which no probe executor does. */
static struct val repeat_kv(struct bld *B, struct val x, uint64_t kv, uint64_t width, bool rotated,
                            const char *name)
{
    enum mp_dtype c = B->p->compute_dtype;
    bool cast = B->amp && (dt_of(B, x) != c || (rotated && B->amp_f32));
    if (failed(B) || last_dim(x) == width || (kv == 1 && !cast))
        return x;
    B->p->probe_unsupported = "transformers' repeat_kv copies (sliding-window attention past its window)";
    struct val y = split_copy(B, x, width, 0, false, name);
    if (kv == 1 && !failed(B)) { /* the view's cast is the copy */
        struct mp_tensor *t = T(B, y.t);
        t->dtype = c;
        t->bytes = mul(B, t->elems, mp_dtype_size(c));
    }
    return y;
}

/* Multi-head attention with projections: q/k/v (fused or not), rope, core, out projection. */
struct val lower_attention(struct bld *B, struct val x, const struct mp_layer *l, uint64_t hidden,
                           const char *name)
{
    char saved[96];
    with_prefix(B, B->prefix, name, saved);
    if (l->mla.kv_lora) {
        struct val y = lower_mla(B, x, l, hidden);
        restore_prefix(B, saved);
        return y;
    }
    uint64_t a = l->attn.heads, kv = l->attn.kv_heads, d = l->attn.head_dim;
    uint64_t qd = mul(B, a, d), kd = mul(B, kv, d);
    struct val q, k, v;
    struct mp_layer core = *l; /* what the attention kernel sees */
    if (l->attn.fused_qkv) {
        struct val qkv = lower_linear(B, x, hidden, add(B, qd, mul(B, 2, kd)), l->attn.qkv_bias, "qkv_proj");
        q = k = v = qkv; /* views of one storage */
        q.shape[q.rank - 1] = qd;
        k.shape[k.rank - 1] = v.shape[v.rank - 1] = kd;
        if (l->attn.qkv_split != MP_QKV_VIEWS) {
            bool expand = l->attn.qkv_split == MP_QKV_COPY_EXPAND, index = l->attn.qkv_split != MP_QKV_COPY_ALL;
            uint64_t kw = expand ? qd : kd, rows = rows_of(qkv), es = mp_dtype_size(dt_of(B, qkv));
            /* the new architecture first flattens each into (b, s, a*d), then copies it transposed;
             * k and v start as index copies (b, s, kv, 1, d) */
            uint64_t flat = expand ? mul(B, mul(B, rows, qd), es) : 0;
            uint64_t kv_tmp = expand ? add(B, flat, mul(B, mul(B, rows, kd), es)) : 0;
            q = split_copy(B, q, qd, flat, false, "q_split");
            k = split_copy(B, k, kw, kv_tmp, index, "k_split");
            v = split_copy(B, v, kw, kv_tmp, index, "v_split");
            if (expand)
                core.attn.kv_heads = kv = a;
        }
    } else {
        q = lower_linear(B, x, hidden, qd, l->attn.qkv_bias, "q_proj");
        k = lower_linear(B, x, hidden, kd, l->attn.qkv_bias, "k_proj");
        v = lower_linear(B, x, hidden, kd, l->attn.qkv_bias, "v_proj");
    }
    if (l->attn.qk_norm != MP_QK_NORM_NONE && !l->attn.qk_norm_late) {
        q = qk_norm(B, q, l, a, "q_norm");
        k = qk_norm(B, k, l, kv, "k_norm");
    }
    if (l->attn.clip_qkv) { /* after the q/k norms (OLMoE: an fp32 q and k under amp; OLMo has no norms) */
        q = lower_clamp(B, q, "q_clamp");
        k = lower_clamp(B, k, "k_clamp");
        v = lower_clamp(B, v, "v_clamp");
    }
    if (l->rope.on && l->rope.table_rows)
        pos_table(B, l);
    if (l->rope.on) {
        q = lower_rope(B, q, l, a, "q_rope");
        k = lower_rope(B, k, l, kv, "k_rope");
    }
    if (l->attn.qk_norm != MP_QK_NORM_NONE && l->attn.qk_norm_late) {
        q = qk_norm(B, q, l, a, "q_norm");
        k = qk_norm(B, k, l, kv, "k_norm");
    }
    /* Llama 4's temperature tuning on NoPE layers (modeling_llama4.py:372-378): q times the fp32
     * (1, s, 1, 1) scales (MulBackward0 saves only them: s fp32, not modelled), an fp32 product,
     * cast back to q's dtype */
    if (l->attn.temp_tuning) {
        enum mp_dtype qdt = dt_of(B, q);
        q = lower_copy(B, q, MP_DT_F32, 1.0, "q_temperature");
        if (qdt != MP_DT_F32)
            q = cast_to(B, q, qdt, "q_temperature_cast");
    }
    /* use_cache (transformers 5.24, no gradient checkpointing): DynamicLayer.update torch.cat's k
     * and v onto an empty cache tensor, so attention gets fresh copies; SDPA saves those (the
     * originals die unless something else keeps them: a fused qkv storage stays alive while q is
     * its view, GPT-2).  Eager attention saves its own contiguous copies of k and v either way. */
    enum mp_attn_impl impl = B->p->opts.attention_forced || !l->attn.impl_set ? B->p->opts.attention : l->attn.impl;
    if (((B->m->use_cache && !B->p->opts.hf_checkpointing) || B->p->opts.gen_cache) && impl != MP_ATTN_EAGER &&
        !l->vision) { /* (a vision tower's attention has no cache) */
        /* the cache holds them until the forward returns; under autocast the rotated k is fp32
         * (q * cos with cos in the fp32 residual's dtype), so its copy is too; v's copy keeps v's
         * dtype (cache_utils.py:113-116 lazy_initialization: the empty keys in k's dtype, the
         * empty values in v's); SDPA saves their half casts (rope_cast_back families cast the
         * rotated k back to k's dtype) */
        k = cast_to(B, k, B->amp_f32 && l->rope.on && !l->rope.cast_back ? MP_DT_F32 : dt_of(B, k), "k_cache");
        if (!failed(B))
            B->p->nodes[B->p->n_nodes - 1].kv_cached = true;
        v = cast_to(B, v, dt_of(B, v), "v_cache");
        if (!failed(B))
            B->p->nodes[B->p->n_nodes - 1].kv_cached = true;
    }
    /* transformers' SDPA path with a mask (sliding window, packed rows) repeats k and v to every
     * head (sdpa_attention.py: use_gqa_in_sdpa is false with a mask; repeat_kv) */
    if (impl != MP_ATTN_EAGER && ((l->attn.window && sdpa_masked(B, l)) || sdpa_packed(B, l, impl)) && kv < a) {
        k = repeat_kv(B, k, kv, qd, l->rope.on, "k_repeat");
        v = repeat_kv(B, v, kv, qd, false, "v_repeat");
        core.attn.kv_heads = a;
    }
    /* SDPA autocasts its inputs: fp32 q/k (after an fp32 qk-norm) get half copies, and an
     * fp32 v (a bitsandbytes 4-bit v_proj returns x's dtype) too */
    q = autocast_in(B, q, "q_cast");
    k = autocast_in(B, k, "k_cast");
    v = autocast_in(B, v, "v_cast");
    struct val o = lower_attn_core(B, q, k, v, &core, d, d, 7u, "sdpa");
    /* (GPT-J's eager attention merges its heads with the one copy every eager output makes) */
    if (l->rope.on && !l->rope.table_rows && (l->rope.cat || (l->rope.dim && l->rope.dim < l->attn.head_dim)) &&
        !failed(B)) {
        /* Partial rotary builds q with torch.cat, so the attention output follows q's
         * layout and transpose(1, 2).contiguous() copies it (gpt_neox, phi). */
        o = cast_to(B, o, dt_of(B, o), "out_contiguous");
    }
    o = lower_linear(B, o, qd, hidden, l->attn.out_bias, "o_proj");
    restore_prefix(B, saved);
    return o;
}

/* ---- multi-head latent attention (DeepSeek-V2/V3 *Attention.forward) ------------------------
 * q = q_b(RMSNorm(q_a(x))) (or q_proj(x)); [kv | k_rot] = kv_a_proj_with_mqa(x);
 * kv = kv_a_layernorm(kv) (a view: its fp32 copy under half precision); rotary on q's and
 * k_rot's rope_dim columns; query = cat(q_nope, q_rot) (a new (b,a,s,nope+rope) tensor);
 * kv_b_proj(kv) -> k_nope | v per head; key = a new (b,a,s,nope+rope) tensor of k_nope and
 * k_rot (broadcast); v stays a view of kv_b's output; attention (SDPA: the memory-efficient
 * kernel, q/k and v widths differ); o_proj. */
static struct val lower_mla(struct bld *B, struct val x, const struct mp_layer *l, uint64_t h)
{
    B->p->probe_unsupported = "multi-head latent attention (q/k and v head widths differ)";
    uint64_t a = l->attn.heads, r = l->mla.rope_dim, qk = add(B, l->mla.nope_dim, r),
             kvw = add(B, l->mla.nope_dim, l->mla.v_dim);
    struct val q;
    if (l->mla.q_lora) {
        q = lower_linear(B, x, h, l->mla.q_lora, l->attn.qkv_bias, "q_a_proj");
        q = lower_rmsnorm(B, q, l->mla.q_lora, false, "q_a_layernorm");
        q = lower_linear(B, q, l->mla.q_lora, mul(B, a, qk), false, "q_b_proj");
    } else {
        q = lower_linear(B, x, h, mul(B, a, qk), false, "q_proj");
    }
    struct val ckv = lower_linear(B, x, h, add(B, l->mla.kv_lora, r), l->attn.qkv_bias, "kv_a_proj_with_mqa");
    struct val lat = ckv, krot = ckv, qrot = q;
    if (failed(B))
        return q;
    lat.shape[lat.rank - 1] = l->mla.kv_lora;
    krot.shape[krot.rank - 1] = r;
    qrot.shape[qrot.rank - 1] = mul(B, a, r);
    lat = lower_rmsnorm(B, lat, l->mla.kv_lora, false, "kv_a_layernorm");
    struct mp_layer rl = *l; /* rotary over rope_dim of each head */
    rl.attn.head_dim = r;
    rl.rope.dim = 0;
    qrot = lower_rope(B, qrot, &rl, a, "q_rope");
    krot = lower_rope(B, krot, &rl, 1, "k_rope");
    if (!l->mla.rope_complex && !failed(B)) { /* V3's halves: q * cos with cos in the residual dtype (fp32
                                           * under amp) promote; V2's complex rotary casts back */
        retype(B, qrot, promote(dt_of(B, qrot), B->p->param_dtype));
        retype(B, krot, promote(dt_of(B, krot), B->p->param_dtype));
    }
    /* torch.cat((q_nope, q_rot)) in the promoted dtype (fp32 under amp: SDPA's autocast copies it) */
    struct val query = with_last(B, "query", q, mul(B, a, qk), promote(dt_of(B, q), dt_of(B, qrot)), true);
    struct mp_node *n = new_node(B, MP_P_CAST, "query"); /* torch.cat((q_nope, q_rot)): saves nothing */
    if (n) {
        n->in[0] = q.t;
        n->in[1] = qrot.t;
        n->out = query.t;
        n->rows = rows_of(q);
        n->n = mul(B, a, qk);
    }
    enum mp_attn_impl impl = B->p->opts.attention_forced || !l->attn.impl_set ? B->p->opts.attention : l->attn.impl;
    if (((B->m->use_cache && !B->p->opts.hf_checkpointing) || B->p->opts.gen_cache) && impl != MP_ATTN_EAGER &&
        !l->vision) { /* (a vision tower's attention has no cache) */
        /* use_cache: past_key_values.update(kv, k_rot) torch.cat's the latent and the rotated
         * k_rot into the cache (held until the forward returns); expand_kv reads the copies */
        lat = cast_to(B, lat, dt_of(B, lat), "kv_cache");
        if (!failed(B))
            B->p->nodes[B->p->n_nodes - 1].kv_cached = true;
        krot = cast_to(B, krot, dt_of(B, krot), "k_rot_cache");
        if (!failed(B))
            B->p->nodes[B->p->n_nodes - 1].kv_cached = true;
    }
    struct val kvb = lower_linear(B, lat, l->mla.kv_lora, mul(B, a, kvw), false, "kv_b_proj");
    struct val key = with_last(B, "key", kvb, mul(B, a, qk), dt_of(B, kvb), true);
    n = new_node(B, MP_P_CAST, "key"); /* new_empty + copy_ of k_nope and k_rot: saves nothing */
    if (n) {
        n->in[0] = kvb.t;
        n->in[1] = krot.t;
        n->out = key.t;
        n->rows = rows_of(kvb);
        n->n = mul(B, a, qk);
    }
    struct val v = kvb; /* a view: the v columns of each head */
    v.shape[v.rank - 1] = mul(B, a, l->mla.v_dim);
    struct val o = lower_attn_core(B, autocast_in(B, query, "q_cast"), autocast_in(B, key, "k_cast"), v, l, qk,
                                   l->mla.v_dim, 4u, "sdpa");
    /* SDPA's memory-efficient kernel writes its output (b, s, a, dv): the transpose back is a view.
     * Eager attention's (b, a, s, dv) output is copied by the transpose-contiguous (a forward
     * transient of the node, as for every eager attention). */
    return lower_linear(B, o, mul(B, a, l->mla.v_dim), h, l->attn.out_bias, "o_proj");
}
