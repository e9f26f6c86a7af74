/* lower_vision.c — steps with images beyond the ViT lowering they reuse (lower_conv.c's patch
 * embedding, the transformer block): Gemma 3's projector (pooling, projection), Pixtral's patch
 * sequence and Mistral 3's patch merger, and the merge of the image features into the text
 * embedding (build.h; model.h mp_layer.vision, mp_vision.kind; transformers 5.24
 * gemma3/modeling_gemma3.py Gemma3MultiModalProjector.forward, Gemma3Model.forward and
 * get_placeholder_mask; pixtral/modeling_pixtral.py PixtralVisionModel.forward;
 * mistral3/modeling_mistral3.py Mistral3PatchMerger.forward, Mistral3Model.forward). */
#include "build.h"

#include <stdio.h>
#include <string.h>

/* v's shape given to its tensor too (a reshape of a fresh tensor). */
static void reshape(struct bld *B, struct val *v, int rank, const uint64_t *shape)
{
    v->rank = rank;
    memcpy(v->shape, shape, (size_t)rank * sizeof *shape);
    struct mp_tensor *t = T(B, v->t);
    t->rank = rank;
    memcpy(t->shape, shape, (size_t)rank * sizeof *shape);
}

/* Pixtral: patch_conv (bias-free) on pixel_values (images, C, H, W); each image's (dim, h, w)
 * patches .flatten(1).T (a view), all of them torch.cat into one sequence (a new tensor; its
 * backward slices the gradient: nothing saved), .unsqueeze(0): (1, images x h x w, dim).  From
 * here on the tower's batch is 1 and its sequence every image's patches. */
struct val lower_pixtral_patches(struct bld *B, struct val x, const struct mp_layer *l)
{
    if (failed(B))
        return x;
    uint64_t p = l->conv.kernel;
    if (x.rank != 4 || p == 0 || x.shape[2] % p || x.shape[3] % p) {
        fail_model(B, MP_ERR_MODEL, "patch %llu must divide the image's height and width", (unsigned long long)p);
        return x;
    }
    struct val c = lower_conv(B, x, l->conv.in_ch, l->dim, p, p, 0, 1, false, "patch_conv");
    if (failed(B))
        return c;
    uint64_t s = mul(B, mul(B, c.shape[0], c.shape[2]), c.shape[3]);
    struct val y = lower_copy(B, c, dt_of(B, c), 0, "patch_embeds.cat");
    if (failed(B))
        return y;
    const uint64_t shape[3] = {1, s, l->dim};
    reshape(B, &y, 3, shape);
    B->b = 1;
    B->s = s;
    return y;
}

/* Mistral3PatchMerger: per image, its (h x w, dim) rows .view(h, w, dim).permute(2, 0, 1)
 * .unsqueeze(0) (a view), F.unfold(kernel = stride = merge): im2col makes the input contiguous
 * first (a copy of the image's rows) and returns (1, dim x merge^2, h x w / merge^2);
 * .view(...).t() a view kept in a list until the forward returns; then one torch.cat of all the
 * images: (tokens, dim x merge^2), which merging_layer saves.  Nothing else is saved (Im2Col and
 * Cat backward keep sizes).  Backward, per image: the gradient's slice .t() reshaped (a copy),
 * col2im's (1, dim, h, w), the permuted view reshaped back (a copy), then one cat of the images'
 * gradients. */
struct val lower_patch_merge(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    if (failed(B) || !width_ok(B, x, l->dim, "dim", nm))
        return x;
    uint64_t mg = l->conv.kernel, per = mul(B, l->conv.out_h, l->conv.out_w), rows = rows_of(x);
    if (x.rank != 3 || mg == 0 || per == 0 || rows % per || per % (mg * mg)) {
        fail_model(B, MP_ERR_MODEL, "%s: the patch merger needs whole images of patches", nm);
        return x;
    }
    struct val y = lower_copy(B, x, dt_of(B, x), 0, nm);
    if (failed(B))
        return y;
    const uint64_t shape[3] = {1, rows / (mg * mg), mul(B, l->dim, mg * mg)};
    reshape(B, &y, 3, shape);
    struct mp_node *n = &B->p->nodes[B->p->n_nodes - 1];
    uint64_t img = mul(B, mul(B, per, l->dim), mp_dtype_size(dt_of(B, x))), all = T(B, y.t)->bytes;
    tmp_one(B, n, false, MP_TR_OTHER, add(B, all, img));
    if (ng(B, x))
        tmp_one(B, n, true, MP_TR_OTHER, add(B, all, mul(B, 2, img)));
    return y;
}

/* vision_outputs (b, patches, dim).transpose(1, 2).reshape(b, dim, side, side) (a copy: the
 * transposed view is not viewable so; .contiguous() then returns it as it is), AvgPool2d (saves
 * its input, the copy), .flatten(2).transpose(1, 2): a (b, tokens, dim) view of the pooled grid. */
struct val lower_token_pool(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    if (failed(B) || !width_ok(B, x, l->dim, "dim", nm))
        return x;
    uint64_t side = 1, P = x.rank == 3 ? x.shape[1] : 0;
    while ((side + 1) * (side + 1) <= P)
        side++;
    if (x.rank != 3 || side * side != P) {
        fail_model(B, MP_ERR_MODEL, "%s: the projector needs a square grid of patches", nm);
        return x;
    }
    char cn[80];
    snprintf(cn, sizeof cn, "%s.grid", nm);
    struct val g = lower_copy(B, x, dt_of(B, x), 0, cn);
    if (failed(B))
        return g;
    g.rank = 4;
    g.shape[0] = x.shape[0];
    g.shape[1] = l->dim;
    g.shape[2] = g.shape[3] = side;
    struct mp_tensor *gt = T(B, g.t);
    gt->rank = 4;
    for (int i = 0; i < 4; i++)
        gt->shape[i] = g.shape[i];
    struct val y = lower_pool(B, g, MP_P_AVGPOOL, l->conv.kernel, l->conv.stride, 0, 0, 0, nm);
    if (failed(B))
        return y;
    struct val v = y; /* (b, tokens, dim): a view */
    v.rank = 3;
    v.shape[1] = y.shape[2] * y.shape[3];
    v.shape[2] = l->dim;
    return v;
}

/* torch.matmul(normed, mm_input_projection_weight): an nn.Parameter, not an nn.Linear (peft's
 * targets never take it), the same mm and saves as F.linear (under autocast both operands' half
 * copies); .type_as(vision_outputs): back to the input's dtype (fp32 under amp-*). */
struct val lower_mm_projection(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    bool was = B->no_lora;
    B->no_lora = true;
    struct val y = lower_linear(B, x, l->in_features, l->out_features, false, nm);
    B->no_lora = was;
    if (!failed(B) && dt_of(B, y) != dt_of(B, x))
        y = cast_to(B, y, dt_of(B, x), "type_as");
    return y;
}

/* Gemma3Model.forward: inputs_embeds = embed_tokens(input_ids) (the text embedding and its scale,
 * with the text's batch and length) before the vision tower runs; x, the pixel values, passes on.
 * Its parameters train as the text model's embedding does (--finetune freeze: its selection). */
struct val lower_image_lookup(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    if (failed(B))
        return x;
    uint64_t b = B->b, s = B->s;
    bool trained = B->trained;
    B->trained = mp_finetune_block_trained(&B->p->opts.ft, -1, false);
    B->b = B->text_b;
    B->s = B->text_s;
    struct val ids = {.t = B->ids, .rank = 2, .shape = {B->b, B->s}}, resid;
    struct mp_layer tl = *l;
    tl.vision = false;
    tl.emb.image_lookup = false;
    B->inputs_embeds = lower_embedding(B, ids, &tl, nm, &resid);
    B->b = b;
    B->s = s;
    B->trained = trained;
    return x;
}

/* Then, with the image features x: image_features .to(inputs_embeds.dtype); get_placeholder_mask:
 * input_ids == image_token_id, a (b, s) bool tensor, its sum (an int64 scalar) checked against
 * the features; inputs_embeds.masked_scatter(mask.unsqueeze(-1), image_features): a new (b, s, h)
 * tensor; MaskedScatterBackward0 saves the mask (derivatives.yaml masked_scatter) when either
 * input needs a gradient, and makes a new gradient for each: grad.masked_fill(mask, 0) and
 * masked_scatter_backward's grad.masked_select(mask), which CUDA runs as an index with the
 * broadcast bool mask (aten/src/ATen/native/cuda/IndexKernel.cpp masked_select_out_cuda_impl):
 * nonzero's (selected, 3) int64 index, a backward transient.  From here on b and s are the text's. */
struct val lower_image_merge(struct bld *B, struct val x, const struct mp_layer *l, const char *nm, struct val *resid)
{
    if (failed(B))
        return x;
    B->b = B->text_b;
    B->s = B->text_s;
    /* the vision tower's rotary tables and mask were its own (held: lower_attention.c); the text
     * model's rotary makes its own tables */
    B->rope_cos_sin = B->rope_pair = B->attn_mask = -1;
    struct val e = B->inputs_embeds;
    if (B->m->vision.kind == MP_VIS_PIXTRAL && !failed(B)) {
        /* Mistral 3: get_image_features returns image_outputs, its pooler_output the projector's
         * output split per image (views) and its hidden states the tower's last output; the
         * model's forward keeps it (mm_encoder_outputs) and returns it with the logits: both held
         * to the forward's end.  torch.cat(pooler_output) is a new tensor (its backward
         * slices). */
        held_tensor(B, x.t, -1);
        x = lower_copy(B, x, dt_of(B, x), 0, "image_features.cat");
    }
    if (x.rank != 3 || last_dim(x) != l->dim) {
        fail_model(B, MP_ERR_MODEL, "%s: the image features are not (images, tokens, %llu)", nm,
                   (unsigned long long)l->dim);
        return e;
    }
    struct val f = dt_of(B, x) != dt_of(B, e) ? cast_to(B, x, dt_of(B, e), "image_features.to") : x;
    if (B->m->vision.kind == MP_VIS_LLAMA4) /* projected_vision_flat, a local of the forward to its end */
        held_tensor(B, f.t, -1);
    bool grad = ng(B, e) || ng(B, f);
    struct val y = like(B, "masked_scatter", e, dt_of(B, e), grad);
    struct mp_node *n = new_node(B, MP_P_MASKED_SCATTER, "masked_scatter");
    if (!n)
        return y;
    n->in[0] = e.t;
    n->in[1] = f.t;
    n->out = y.t;
    int mask = new_flat(B, "special_image_mask", MP_DT_U8, mul(B, B->b, B->s));
    extra_as(n, mask, MP_XR_IMAGE_MASK);
    if (!grad)
        unsave(n, mask);
    tmp_one(B, n, false, MP_TR_OTHER, mp_dtype_size(MP_DT_I64)); /* n_image_tokens, the mask's sum */
    if (ng(B, f)) /* masked_select's nonzero index: (features' elements, 3) int64 */
        tmp_one(B, n, true, MP_TR_OTHER, mul(B, mul(B, T(B, f.t)->elems, 3), mp_dtype_size(MP_DT_I64)));
    n->rows = mul(B, B->b, B->s);
    n->n = l->dim;
    n->fwd_flops = (double)T(B, y.t)->elems;
    n->bwd_flops = 2.0 * n->fwd_flops;
    *resid = y;
    return y;
}

/* Qwen2.5-VL's window reorder (qwen2_5_vl/modeling_qwen2_5_vl.py:421-425, :480-485): x indexed by
 * an int64 index of one row per merge^2 patches (window_index; after the merger, argsort's
 * reverse_indices): a new tensor, and IndexBackward saves the index.  (The index of the (N, head_dim)
 * fp32 cos and sin makes the table the blocks save, as Qwen2-VL's rotary does: the same bytes.) */
static struct val window_gather(struct bld *B, struct val x, const char *name)
{
    const struct mp_vision *v = &B->m->vision;
    uint64_t rows = mul(B, x.shape[0], x.shape[1]), unit = mul(B, v->merge, v->merge);
    struct val y = lower_copy(B, x, dt_of(B, x), 0, name);
    if (failed(B))
        return y;
    struct mp_node *n = &B->p->nodes[B->p->n_nodes - 1];
    char en[112];
    snprintf(en, sizeof en, "%s.index", name);
    int ix = new_flat(B, en, MP_DT_I64, x.shape[2] == v->hidden ? rows / unit : rows);
    extra_as(n, ix, MP_XR_GATHER_INDEX);
    if (!ng(B, x))
        unsave(n, ix);
    return y;
}

/* Qwen2-VL's PatchEmbed (qwen2_vl/modeling_qwen2_vl.py:253-276): the flattened pixel_values
 * (patches, C x t x p x p) viewed as (patches, C, t, p, p) through a bias-free Conv3d whose kernel
 * is its stride, i.e. a conv of C x t channels over one p x p patch (the layer's conv.in_ch), viewed
 * back to (patches, dim): here (images, each image's patches, dim), b and s the images'.  The conv
 * saves its input (a view of the resident pixel_values) and, under autocast, a half copy of both. */
struct val lower_patch_embed3d(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    if (failed(B))
        return x;
    uint64_t p = l->conv.kernel, k = mul(B, mul(B, l->conv.in_ch, p), p);
    if (x.rank != 2 || x.shape[1] != k || x.shape[0] % B->b) {
        fail_model(B, MP_ERR_MODEL, "%s: pixel_values are not (patches, %llu)", nm, (unsigned long long)k);
        return x;
    }
    struct val v = x; /* a view (patches, C x t, p, p) */
    v.rank = 4;
    v.shape[1] = l->conv.in_ch;
    v.shape[2] = v.shape[3] = p;
    char cn[80];
    snprintf(cn, sizeof cn, "%s.proj", nm);
    struct val c = lower_conv(B, v, l->conv.in_ch, l->dim, p, p, 0, 1, false, cn);
    if (failed(B))
        return c;
    struct val y = c; /* (images, patches each, dim): a view of the conv's (patches, dim, 1, 1) */
    y.rank = 3;
    y.shape[0] = B->b;
    y.shape[1] = x.shape[0] / B->b;
    y.shape[2] = l->dim;
    B->s = y.shape[1];
    if (B->m->vision.kind == MP_VIS_QWEN2_5) /* Qwen2.5-VL: the states reordered window by window */
        y = window_gather(B, y, "permute_input_for_window_attn");
    return y;
}

/* Qwen2-VL's PatchMerger Linears (:279-292): mlp.0 first views merge^2 consecutive patches as one
 * row (ln_q's output, contiguous: (images, patches / merge^2, dim x merge^2)); nn.Linears with
 * biases that peft adapts like any (all-linear).  After mlp.2, Qwen2VLModel.forward torch.cat's the
 * per-image features get_image_features split: a new tensor (conv.stride set). */
struct val lower_merger_linear(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    if (failed(B))
        return x;
    uint64_t unit = l->conv.kernel ? l->conv.kernel : 1;
    if (x.rank != 3 || x.shape[1] % unit || mul(B, last_dim(x), unit) != l->in_features) {
        fail_model(B, MP_ERR_MODEL, "%s: the merger needs (images, patches, dim) in units of %llu patches", nm,
                   (unsigned long long)unit);
        return x;
    }
    x.shape[1] /= unit;
    x.shape[2] = l->in_features;
    struct val y = lower_linear(B, x, l->in_features, l->out_features, l->bias, nm);
    if (l->conv.stride && !failed(B) && B->m->vision.kind == MP_VIS_QWEN2_5) /* merged_hidden_states[reverse_indices] */
        y = window_gather(B, y, "reverse_indices");
    if (l->conv.stride && !failed(B))
        y = lower_copy(B, y, dt_of(B, y), 0, "image_embeds.cat");
    return y;
}

/* Llama 4's patch embedding (llama4/modeling_llama4.py Llama4UnfoldConvolution :952-970,
 * Llama4VisionModel.forward :1082-1101): pixel_values (tiles, C, T, T) through nn.Unfold (im2col:
 * a new (tiles, C p p, patches) tensor; nothing saved), .permute(0, 2, 1) (a view), the bias-free
 * Linear: its matmul folds the permuted view to (tiles x patches, C p p), which copies it (under
 * autocast after the half cast of the permuted view), and mm saves that copy when the weight
 * trains; torch.cat with the expanded class embedding LAST (a new (tiles, patches + 1, dim); fp32
 * under autocast, the embedding being fp32); + positional_embedding_vlm.to(the states' dtype) (a
 * new tensor; the table an nn.Parameter).  From here on the tower's batch is the tiles and its
 * sequence patches + 1.  Under checkpointing, enable_input_require_grads hooks
 * Llama4VisionModel.get_input_embeddings, this module: the Linear's output a leaf (frozen.c). */
struct val lower_llama4_patches(struct bld *B, struct val x, const struct mp_layer *l)
{
    if (failed(B))
        return x;
    uint64_t p = l->conv.kernel;
    if (x.rank != 4 || p == 0 || x.shape[2] % p || x.shape[3] % p || x.shape[1] != l->conv.in_ch) {
        fail_model(B, MP_ERR_MODEL, "patch %llu must divide the tiles' height and width", (unsigned long long)p);
        return x;
    }
    uint64_t N = x.shape[0], np = mul(B, x.shape[2] / p, x.shape[3] / p), k = mul(B, mul(B, l->conv.in_ch, p), p);
    const uint64_t us[3] = {N, k, np};
    struct val u = new_val(B, "unfold", dt_of(B, x), 3, us, false);
    struct mp_node *n = new_node(B, MP_P_CAST, "unfold");
    if (!n)
        return u;
    n->in[0] = x.t;
    n->out = u.t;
    n->rows = mul(B, N, k);
    n->n = np;
    n->fwd_flops = (double)T(B, u.t)->elems;
    struct val pv = u; /* .permute(0, 2, 1): a view */
    pv.shape[1] = np;
    pv.shape[2] = k;
    pv = autocast_in(B, pv, "linear.cast"); /* (a half copy, permuted like the view) */
    struct val r = lower_copy(B, pv, dt_of(B, pv), 0, "linear.fold"); /* the matmul's reshape copy */
    struct val c = lower_linear(B, r, k, l->dim, false, l->name);
    if (failed(B))
        return c;
    struct val e = lower_class_cat(B, c, "class_embedding");
    uint64_t s = e.shape[1];
    B->s = s;
    struct mp_layer pos = *l;
    pos.vocab = s;
    return lower_add_table(B, e, &pos, "positional_embedding_vlm", s, false, &n);
}

/* Llama 4's pixel_shuffle (modeling_llama4.py:698-716, :1117-1122) after layernorm_post and the class token's
 * slice ([:, :-1]: a view): the states viewed (tiles, side, side / k, dim k), permute(0, 2, 1, 3)
 * .contiguous() (a copy), viewed (tiles, side / k, side / k, dim k^2), permute(...).contiguous()
 * (a second copy; the first dies), viewed (tiles, tokens, dim k^2).  Nothing is saved; backward,
 * the gradient's reshapes copy back, and the slice's gradient is a (tiles, patches + 1, dim)
 * tensor (the copy's input gradient). */
struct val lower_pixel_shuffle(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    if (failed(B) || !width_ok(B, x, l->dim, "dim", nm))
        return x;
    uint64_t k = l->conv.kernel, P = x.rank == 3 && x.shape[1] ? x.shape[1] - 1 : 0, side = 1;
    while ((side + 1) * (side + 1) <= P)
        side++;
    if (x.rank != 3 || k == 0 || side * side != P || side % k) {
        fail_model(B, MP_ERR_MODEL, "%s: pixel_shuffle needs a square grid of patches (and the class token)", nm);
        return x;
    }
    char cn[80];
    snprintf(cn, sizeof cn, "%s.permute1", nm);
    struct val sl = x; /* the class token's slice: a view */
    sl.shape[1] = P;
    struct val a = lower_copy(B, sl, dt_of(B, x), 0, cn);
    if (failed(B))
        return a;
    snprintf(cn, sizeof cn, "%s.permute2", nm);
    struct val y = lower_copy(B, a, dt_of(B, a), 0, cn);
    if (failed(B))
        return y;
    const uint64_t shape[3] = {x.shape[0], P / (k * k), mul(B, l->dim, k * k)};
    reshape(B, &y, 3, shape);
    return y;
}
