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

/* ---- Llama 3.2 Vision (mllama/modeling_mllama.py, transformers 5.24; docs/memory-facts.md#mllama-images) ---- */

/* x + a table's row (or a parameter) times a scalar gate, as one node making a new x-sized tensor:
 * the pre- and post-tile embeddings (MllamaPrecomputedAspectRatioEmbedding: an Embedding of rows x
 * per looked up by aspect_ratio_ids, times gate.tanh(), added), the gated position embedding's
 * (1 - tanh g) x embedding (lookup false: the parameter itself, P x D) and its tile table's lookup
 * (gate false: it shares the position embedding's gate).  The
 * product saves the looked-up rows (lookup elements, in the parameters' dtype) when the gate
 * trains (its gradient reads them); the Embedding saves the int64 ids. */
static struct val gated_table(struct bld *B, struct val x, const char *name, uint64_t rows, uint64_t per,
                              bool lookup, bool gate)
{
    if (failed(B))
        return x;
    char pn[96];
    snprintf(pn, sizeof pn, "%s.embedding.weight", name);
    int w = new_param(B, pn, rows, per, false);
    snprintf(pn, sizeof pn, "%s.gate", name);
    int g = gate ? new_param(B, pn, 1, 1, false) : -1;
    if (failed(B))
        return x;
    B->p->params[w].embedding = lookup;
    struct val y = like(B, name, x, promote(dt_of(B, x), B->p->param_dtype), true);
    struct mp_node *n = new_node(B, MP_P_CAST, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = w;
    n->param[1] = g;
    n->rows = rows_of(x);
    n->n = last_dim(x);
    n->fwd_flops = (double)T(B, x.t)->elems;
    n->bwd_flops = n->fwd_flops;
    uint64_t looked = lookup ? mul(B, T(B, B->ar_ids)->elems, per) : mul(B, per, rows);
    uint64_t lb = mul(B, looked, mp_dtype_size(B->p->param_dtype));
    if (lookup) {
        save(n, B->ar_ids);
        if (B->trained) {
            char en[112];
            snprintf(en, sizeof en, "%s.lookup", name);
            extra_as(n, new_flat(B, en, B->p->param_dtype, looked), MP_XR_CUSTOM_SAVED);
        }
    }
    tmp_one(B, n, false, MP_TR_OTHER, lb);    /* the product (and the lookup when not saved) */
    tmp_one(B, n, true, MP_TR_OTHER, add(B, lb, lb)); /* the table's gradient rows, the product's */
    return y;
}

/* gate.tanh() * x (MllamaVisionEncoderLayer's gated global layers, M:318 and M:325; the
 * cross-attention layers' attn_gate and mlp_gate, M:711 and M:718): a new tensor; the product
 * saves x when the gate trains. */
struct val lower_tanh_gate(struct bld *B, struct val x, const char *name)
{
    if (failed(B))
        return x;
    int g = new_param(B, name, 1, 1, false);
    struct val y = like(B, name, x, dt_of(B, x), true);
    struct mp_node *n = new_node(B, MP_P_CAST, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = g;
    n->rows = rows_of(x);
    n->n = last_dim(x);
    n->fwd_flops = (double)T(B, x.t)->elems;
    n->bwd_flops = 2.0 * n->fwd_flops;
    if (B->trained)
        save(n, x.t);
    tmp_one(B, n, true, MP_TR_OTHER, T(B, x.t)->bytes); /* grad * x before its sum */
    return y;
}

/* MllamaVisionModel.forward up to its first layer (M:920-960): pixel_values cast to the patch
 * conv's dtype (a copy the conv saves), the bias-free conv, .flatten(2).transpose(1, 2) reshaped
 * per tile (a copy), the pre-tile embedding, the class token cat'ed first, the gated position
 * embedding ((1 - tanh g) x embedding, then tanh g x the tile table's rows), layernorm_pre, F.pad
 * of the patches to a multiple of 8 (a copy).  Then _prepare_aspect_ratio_attention_mask
 * (M:93-117): a (b N, 1, T, T) float mask in the model's dtype, (b N, T, 1) @ (b N, 1, T) times
 * the dtype's min, shared by every tower layer (lower_attention.c attn_mask: B->attn_mask).  From
 * here on b is batch x images and s the tiles' padded patches T. */
struct val lower_mllama_patches(struct bld *B, struct val x, const struct mp_layer *l)
{
    if (failed(B))
        return x;
    const struct mp_vision *v = &B->m->vision;
    uint64_t p = l->conv.kernel, t = v->tiles, D = l->dim;
    if (x.rank != 4 || p == 0 || x.shape[2] % p || x.shape[3] % p || t == 0 || x.shape[0] % t || B->ar_ids < 0) {
        fail_model(B, MP_ERR_MODEL, "patch %llu must divide the tiles' height and width", (unsigned long long)p);
        return x;
    }
    uint64_t bNt = x.shape[0], bN = bNt / t, g = mul(B, x.shape[2] / p, x.shape[3] / p), P = add(B, g, 1);
    uint64_t Pp = round_up(P, 8), Tl = mul(B, t, Pp), rows = v->merge;
    struct val px = dt_of(B, x) == B->p->param_dtype ? x : cast_to(B, x, B->p->param_dtype, "pixel_values.to");
    struct val c = lower_conv(B, px, l->conv.in_ch, D, p, p, 0, 1, false, "patch_embedding");
    if (failed(B))
        return c;
    const uint64_t ps[3] = {bNt, g, D}, pads[3] = {bN, Tl, D};
    struct val r = lower_copy(B, c, dt_of(B, c), 0, "patch_embeds.reshape");
    if (failed(B))
        return r;
    reshape(B, &r, 3, ps);
    r = gated_table(B, r, "pre_tile_positional_embedding", rows, mul(B, t, D), true, true);
    struct val e = lower_class_cat(B, r, "class_embedding");
    e = gated_table(B, e, "gated_positional_embedding", P, D, false, true);
    e = gated_table(B, e, "gated_positional_embedding.tile", rows, mul(B, mul(B, t, P), D), true, false);
    struct mp_layer ln = *l; /* layernorm_pre: an nn.LayerNorm with its bias */
    ln.norm.bias = true;
    e = lower_norm(B, e, &ln, MP_NORM_LAYERNORM, D, "layernorm_pre");
    if (failed(B))
        return e;
    /* the mask (made here before the pad: a block's last node makes its output), by a no-grad
     * node; held by the tower's forward (its last layer ends it: lower_mllama_projector), saved by
     * every layer's SDPA */
    uint64_t me = mul(B, mul(B, bN, Tl), Tl);
    B->attn_mask = new_flat(B, "vision.attn_mask", B->p->param_dtype, me);
    struct mp_node *mn = new_node(B, MP_P_CAST, "aspect_ratio_attention_mask");
    if (mn) {
        mn->in[0] = -1;
        mn->out = B->attn_mask;
        mn->rows = 1;
        mn->n = me;
        mn->no_grad = true;
        mn->grad_in = false;
        mn->fwd_flops = (double)me;
        tmp_one(B, mn, false, MP_TR_OTHER, T(B, B->attn_mask)->bytes); /* the matmul before the multiply */
    }
    held_tensor(B, B->attn_mask, B->block);
    struct val y = new_val(B, "pad", dt_of(B, e), 3, pads, true);
    struct mp_node *n = new_node(B, MP_P_CAST, "pad");
    if (!n)
        return y;
    n->in[0] = e.t;
    n->out = y.t;
    n->rows = mul(B, bN, Tl);
    n->n = D;
    n->fwd_flops = (double)T(B, y.t)->elems;
    n->bwd_flops = n->fwd_flops;
    B->b = bN;
    B->s = Tl;
    return y;
}

/* layernorm_post, then the post-tile embedding (gated, as the pre-tile one) over the (b N, t,
 * padded patches, D) view (M:976-986). */
struct val lower_mllama_post(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    const struct mp_vision *v = &B->m->vision;
    struct val y = lower_norm(B, x, l, MP_NORM_LAYERNORM, l->dim, nm);
    return gated_table(B, y, "post_tile_positional_embedding", v->merge, mul(B, v->tiles, l->dim), true, true);
}

/* The tower's end and the projector (M:988-1011, M:1285-1289, M:1356-1358): the padding sliced
 * off (a view) and reshaped (a copy: the slice is not contiguous), torch.stack of the
 * intermediate layers' outputs (K copies of (b N, T, D)), its slice reshaped (a copy), torch.cat
 * into (b N t P, vision_output_dim), which the projector (a Linear with bias) saves; its output,
 * viewed (b, N t P, hidden), is the cross-attention states every cross-attention layer's k_proj
 * and v_proj read (held to the first one: a checkpoint input under checkpointing).  The tower's
 * mask dies with its forward.  Then _prepare_cross_attention_mask (M:53-78): the int64
 * (b, s, N, t) mask repeat_interleave'd by P (an int64 (b, s, N t P) transient), 1.0 - it (fp32),
 * .to(dtype), masked_fill: the kept float (b, 1, s, N t P) mask in the model's dtype, and
 * full_text_row_masked_out_mask (b, 1, s, 1).  From here on b and s are the text's; returns the
 * ids for the text embedding. */
struct val lower_mllama_projector(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    const struct mp_vision *v = &B->m->vision;
    uint64_t D = v->hidden, t = v->tiles, K = v->n_inter, bN = B->b, Tl = B->s;
    if (failed(B) || !width_ok(B, x, D, "hidden_size", nm))
        return x;
    for (size_t j = 0; j < B->p->n_held && B->block > 0; j++) /* the tower's mask, a local of its forward */
        if (B->p->held[j].t == B->attn_mask && B->attn_mask >= 0)
            B->p->held[j].fwd_end = B->block - 1;
    uint64_t P = add(B, mul(B, B->m->height / v->patch, B->m->width / v->patch), 1), rows = mul(B, mul(B, bN, t), P);
    size_t ds = mp_dtype_size(dt_of(B, x));
    const uint64_t cs[2] = {rows, mul(B, D, K + 1)};
    struct val c = new_val(B, "vision.cat", dt_of(B, x), 2, cs, true);
    struct mp_node *n = new_node(B, MP_P_CAST, "vision.cat");
    if (!n)
        return c;
    n->in[0] = x.t;
    n->out = c.t;
    n->rows = rows;
    n->n = cs[1];
    n->fwd_flops = (double)T(B, c.t)->elems;
    n->bwd_flops = n->fwd_flops;
    uint64_t st = mul(B, mul(B, mul(B, bN, Tl), D), mul(B, K, ds)), hc = mul(B, mul(B, rows, D), ds),
             ic = mul(B, mul(B, rows, mul(B, D, K)), ds);
    /* forward: the last state's copy, the stack and its slice's copy alive together; backward: the
     * intermediate layers' gradients (the stack's, K x (b N, Tl, D)) handed down the tower */
    tmp_one(B, n, false, MP_TR_OTHER, add(B, hc, add(B, ic, st)));
    tmp_one(B, n, true, MP_TR_OTHER, st);
    struct val y = lower_linear(B, c, l->in_features, l->out_features, l->bias, nm);
    if (failed(B))
        return y;
    uint64_t b = B->text_b, s = B->text_s, nk = rows / b, e = mul(B, mul(B, b, s), nk);
    const uint64_t ys[3] = {b, nk, l->out_features};
    reshape(B, &y, 3, ys);
    B->cross_states = y.t;
    held_tensor(B, y.t, -1);
    enum mp_dtype dt = B->p->param_dtype;
    B->cross_mask = new_flat(B, "cross_attention_mask.float", dt, e);
    B->row_mask = new_flat(B, "full_text_row_masked_out_mask", dt, mul(B, b, s));
    struct mp_node *mn = new_node(B, MP_P_CAST, "cross_attention_mask");
    if (mn) {
        mn->in[0] = B->type_ids;
        mn->out = B->cross_mask;
        mn->rows = mul(B, b, s);
        mn->n = nk;
        mn->no_grad = true;
        mn->grad_in = false;
        mn->fwd_flops = (double)e;
        /* the int64 repeat, 1.0 - it in fp32, its .to(dtype) (none in fp32) alive together */
        tmp_one(B, mn, false, MP_TR_OTHER, mul(B, e, 8 + 4 + (dt == MP_DT_F32 ? 0 : mp_dtype_size(dt))));
        extra_as(mn, B->row_mask, MP_XR_ATTN_MASK);
        unsave(mn, B->row_mask);
    }
    held_tensor(B, B->cross_mask, -1);
    held_tensor(B, B->row_mask, -1);
    B->b = b;
    B->s = s;
    B->rope_cos_sin = B->rope_pair = B->attn_mask = -1;
    B->vision = false;
    struct val ids = {.t = B->ids, .rank = 2, .shape = {b, s}};
    return ids;
}

/* repeat_kv: k or v expanded to every q head and reshaped, a copy of shape ks (ExpandBackward
 * saves nothing; its backward sums each group). */
static struct val repeat_kv(struct bld *B, struct val x, const uint64_t *ks, const char *name)
{
    struct val y = new_val(B, name, dt_of(B, x), 3, ks, true);
    struct mp_node *n = new_node(B, MP_P_CAST, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->rows = ks[0] * ks[1];
    n->n = ks[2];
    n->fwd_flops = (double)T(B, y.t)->elems;
    n->bwd_flops = n->fwd_flops;
    tmp_one(B, n, true, MP_TR_OTHER, T(B, y.t)->bytes); /* the expanded gradient before its sum */
    return y;
}

/* MllamaCrossAttentionDecoderLayer (M:672-721) with image states: input_layernorm; q_proj over the
 * text, q_norm per head (M:441); k_proj and v_proj over the cross-attention states (b, N t P,
 * hidden), k_norm (M:449); repeat_kv's copies of k and v to every head (SDPA's GQA flag is not used
 * under a mask); SDPA under the float cross-attention mask (saved); o_proj; residual +
 * tanh(attn_gate) x out; post_attention_layernorm, the gated MLP, the product with
 * full_text_row_masked_out_mask (saves only the mask), residual + tanh(mlp_gate) x out.  The first
 * one releases the held states and masks at its backward (a checkpoint's inputs). */
struct val lower_mllama_cross(struct bld *B, struct val x, const struct mp_layer *l)
{
    uint64_t h = l->dim, a = l->attn.heads, kv = l->attn.kv_heads, d = l->attn.head_dim, b = B->b, s = B->s;
    if (!width_ok(B, x, h, "dim", ""))
        return x;
    if (B->cross_states < 0) {
        fail_model(B, MP_ERR_MODEL, "a cross-attention layer needs the vision states before it");
        return x;
    }
    enum mp_attn_impl impl = B->p->opts.attention_forced || !l->attn.impl_set ? B->p->opts.attention : l->attn.impl;
    if (impl != MP_ATTN_SDPA) {
        fail_model(B, MP_ERR_USAGE, "--attention %s with --images on mllama: only SDPA's cross-attention is "
                   "modelled (eager's scores over the image states are not)", mp_attn_impl_str(impl));
        return x;
    }
    if (!B->mllama_crossed) {
        B->mllama_crossed = true;
        for (size_t j = 0; j < B->p->n_held; j++)
            if (B->p->held[j].t == B->cross_states || B->p->held[j].t == B->cross_mask ||
                B->p->held[j].t == B->row_mask)
                B->p->held[j].release = B->block;
    }
    uint64_t nk = T(B, B->cross_states)->elems / mul(B, b, h);
    struct val cs = {.t = B->cross_states, .rank = 3, .shape = {b, nk, h}};
    struct val n1 = lower_norm(B, x, l, MP_NORM_RMSNORM, h, "input_layernorm");
    struct val q = lower_linear(B, n1, h, mul(B, a, d), false, "cross_attn.q_proj");
    struct val k = lower_linear(B, cs, h, mul(B, kv, d), false, "cross_attn.k_proj");
    struct val vv = lower_linear(B, cs, h, mul(B, kv, d), false, "cross_attn.v_proj");
    if (failed(B))
        return x;
    struct val qv = q, kvw = k; /* per head: views */
    qv.rank = kvw.rank = 3;
    qv.shape[1] = mul(B, s, a);
    qv.shape[2] = kvw.shape[2] = d;
    kvw.shape[1] = mul(B, nk, kv);
    q = lower_rmsnorm(B, qv, d, l->norm.rms_fp32, "cross_attn.q_norm");
    k = lower_rmsnorm(B, kvw, d, l->norm.rms_fp32, "cross_attn.k_norm");
    if (failed(B))
        return x;
    const uint64_t qs[3] = {b, s, mul(B, a, d)}, ks[3] = {b, nk, mul(B, a, d)};
    reshape(B, &q, 3, qs);
    struct val kr = repeat_kv(B, k, ks, "cross_attn.repeat_kv.k"), vr = repeat_kv(B, vv, ks, "cross_attn.repeat_kv.v");
    /* under autocast SDPA runs in the half dtype: q and k (fp32 out of q_norm and k_norm, whose
     * fp32 weights multiply last) get half copies, which it saves */
    q = autocast_in(B, q, "cross_attn.q.cast");
    kr = autocast_in(B, kr, "cross_attn.k.cast");
    vr = autocast_in(B, vr, "cross_attn.v.cast");
    if (failed(B))
        return x;
    enum mp_dtype cdt = dt_of(B, q);
    struct val y = with_last(B, "cross_attn.attention", q, mul(B, a, d), cdt, true);
    struct mp_node *n = new_node(B, MP_P_ATTN, "cross_attn.attention");
    if (!n)
        return y;
    n->in[0] = q.t;
    n->in[1] = kr.t;
    n->in[2] = vr.t;
    n->out = y.t;
    n->heads = n->kv_heads = a;
    n->head_dim = d;
    n->seq = s;
    n->rows = mul(B, b, s);
    n->causal = false;
    n->keep = B->cross_mask;
    save(n, q.t);
    save(n, kr.t);
    save(n, vr.t);
    save(n, y.t);
    save(n, B->cross_mask);
    if (T(B, B->cross_mask)->dtype != cdt) /* its half cast under autocast: not saved (as the tower's) */
        tmp_one(B, n, false, MP_TR_OTHER, mul(B, T(B, B->cross_mask)->elems, mp_dtype_size(cdt)));
    uint64_t baq = mul(B, mul(B, b, a), s);
    extra_as(n, new_flat(B, "cross_attn.lse", MP_DT_F32, mul(B, mul(B, b, a), round_up(s, 32))), MP_XR_LSE);
    tmp_one(B, n, true, MP_TR_OTHER, add(B, mul(B, baq, 4), cdt != MP_DT_F32 ? mul(B, mul(B, baq, d), 4) : 0));
    double f = 4.0 * (double)b * (double)a * (double)s * (double)nk * (double)d;
    n->fwd_flops = f;
    n->bwd_flops = 2.5 * f;
    struct val o = lower_linear(B, y, mul(B, a, d), h, false, "cross_attn.o_proj");
    o = lower_tanh_gate(B, o, "cross_attn_attn_gate");
    struct val h1 = lower_add(B, x, o, "attn_residual");
    struct val n2 = lower_norm(B, h1, l, MP_NORM_RMSNORM, h, "post_attention_layernorm");
    struct val m = lower_mlp(B, n2, l, h, "mlp");
    if (failed(B))
        return x;
    struct val mm = like(B, "full_text_row_masked_out_mask.mul", m, dt_of(B, m), true);
    struct mp_node *rn = new_node(B, MP_P_CAST, "full_text_row_masked_out_mask.mul");
    if (rn) {
        rn->in[0] = m.t;
        rn->out = mm.t;
        rn->rows = rows_of(m);
        rn->n = last_dim(m);
        rn->keep = B->row_mask;
        save(rn, B->row_mask);
        rn->fwd_flops = (double)T(B, m.t)->elems;
        rn->bwd_flops = rn->fwd_flops;
    }
    mm = lower_tanh_gate(B, mm, "cross_attn_mlp_gate");
    return lower_add(B, h1, mm, "mlp_residual");
}
