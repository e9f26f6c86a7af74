/* model_hf_vision.c — the vision tower and multimodal projector of a multimodal Hugging Face
 * checkpoint, as a text-only step sees them (model.h struct mp_idle): their parameter count and
 * their Linears, read from vision_config with the defaults of its transformers config class.
 * Each kind's sizes follow its transformers 5.24 modules (the file:class named at each); the
 * totals equal transformers' on the meta device (tests/test_model_hf.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_read.h"

/* Elements of count Linear(in, out) [+ bias], checked. */
struct acc {
    uint64_t n;
    bool ok;
    bool full; /* a Linear past MP_IDLE_LINEARS_MAX: refused, never dropped from peft's list */
};

static void acc_add(struct acc *a, uint64_t x) { a->ok = a->ok && mp_add_u64(a->n, x, &a->n); }

static uint64_t sum(struct acc *a, uint64_t x, uint64_t y)
{
    uint64_t r = 0;
    a->ok = a->ok && mp_add_u64(x, y, &r);
    return r;
}

static uint64_t prod(struct acc *a, uint64_t x, uint64_t y)
{
    uint64_t r = 0;
    a->ok = a->ok && mp_mul_u64(x, y, &r);
    return r;
}

/* A Linear(in, out), count times: its weight and bias in the total, and in the list peft sees. */
static void linear(struct acc *a, struct mp_idle *v, const char *name, uint64_t in, uint64_t out, uint64_t count,
                   bool bias)
{
    acc_add(a, prod(a, prod(a, in, out) + (bias ? out : 0), count));
    if (v->n_linears < MP_IDLE_LINEARS_MAX)
        v->linears[v->n_linears++] = (struct mp_idle_linear){.name = name, .in = in, .out = out, .count = count};
    else
        a->full = true;
}

static enum mp_status pos(const cJSON *o, const char *key, uint64_t *out, const char *path, struct mp_diag *d)
{
    uint64_t x = *out;
    enum mp_status st = mp_json_u64(o, key, false, MP_DIM_MAX, &x, path, "vision_config", d);
    if (st == MP_OK && x == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.%s: expected a positive integer", path, key);
    *out = x;
    return st;
}

/* Each key of o that is present, a positive integer (pos), in order. */
struct pkey {
    const char *key;
    uint64_t *v;
};

static enum mp_status positives(const cJSON *o, const struct pkey *k, size_t n, const char *path, struct mp_diag *d)
{
    enum mp_status st = MP_OK;
    for (size_t i = 0; i < n && st == MP_OK; i++)
        st = pos(o, k[i].key, k[i].v, path, d);
    return st;
}
#define POSITIVES(o, ...)                                                                                          \
    positives(o, (const struct pkey[]){__VA_ARGS__}, sizeof((const struct pkey[]){__VA_ARGS__}) / sizeof(struct pkey), \
              path, d)

/* vision_config.hidden_act (dflt where absent) into *act; an unknown activation is refused. */
static enum mp_status vision_act(const cJSON *vc, enum mp_act dflt, enum mp_act *act, const char *path,
                                 struct mp_diag *d)
{
    enum mp_status st;
    const char *an = mp_json_str(vc, "hidden_act", &st, path, "vision_config", d);
    if (st != MP_OK)
        return st;
    int ai = an ? mp_act_parse(an) : (int)dflt;
    if (ai < 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.hidden_act: '%s' is not a supported activation", path, an);
    *act = (enum mp_act)ai;
    return MP_OK;
}

/* SigLIP (siglip/modeling_siglip.py SiglipVisionTransformer, SiglipVisionConfig defaults) and
 * Gemma 3's projector (gemma3/modeling_gemma3.py Gemma3MultiModalProjector: the Parameter
 * mm_input_projection_weight (vision hidden x text hidden) and an RMSNorm of the vision width). */
static enum mp_status siglip_gemma3(const cJSON *root, const cJSON *vc, uint64_t text_hidden, struct mp_idle *v,
                                    struct mp_vision *vis, struct acc *a, const char *path, struct mp_diag *d)
{
    uint64_t D = 768, F = 3072, L = 12, C = 3, img = 224, p = 16, H = 12;
    uint64_t tokens = 256, id = 262144; /* Gemma3Config: mm_tokens_per_image, image_token_index */
    bool head = true;
    double ap = 0;
    enum mp_status st;
    if ((st = POSITIVES(vc, {"hidden_size", &D}, {"intermediate_size", &F}, {"num_hidden_layers", &L},
                            {"num_channels", &C}, {"image_size", &img}, {"patch_size", &p},
                            {"num_attention_heads", &H})) != MP_OK ||
        (st = mp_json_prob(vc, "attention_dropout", &ap, path, "vision_config", d)) != MP_OK ||
        (st = mp_json_bool(vc, "vision_use_head", &head, path, "vision_config", d)) != MP_OK ||
        (st = mp_json_u64(root, "mm_tokens_per_image", false, MP_DIM_MAX, &tokens, path, "", d)) != MP_OK ||
        (st = mp_json_u64(root, "image_token_index", false, MP_DIM_MAX, &id, path, "", d)) != MP_OK ||
        (st = mp_json_u64(root, "image_token_id", false, MP_DIM_MAX, &id, path, "", d)) != MP_OK)
        return st;
    enum mp_act ai;
    if ((st = vision_act(vc, MP_ACT_GELU_TANH, &ai, path, d)) != MP_OK) /* SiglipVisionConfig.hidden_act */
        return st;
    *vis = (struct mp_vision){.kind = MP_VIS_SIGLIP, .hidden = D, .ffn = F, .layers = L, .heads = H, .channels = C,
                              .image = img, .patch = p, .act = ai, .attn_p = ap, .tokens = tokens,
                              .text_hidden = text_hidden, .token_id = id};
    if (head)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.vision_use_head: true (SiglipVisionConfig's default) is not "
                       "supported (the SigLIP pooling head is not modelled; Gemma 3 checkpoints set false)", path);
    uint64_t side = img / p;
    acc_add(a, prod(a, prod(a, prod(a, C, p), p), D) + D);  /* patch_embedding Conv2d with bias */
    acc_add(a, prod(a, prod(a, side, side), D));            /* position_embedding */
    acc_add(a, prod(a, prod(a, 4, D), L));                  /* layer_norm1, layer_norm2 */
    linear(a, v, "q_proj", D, D, L, true);
    linear(a, v, "k_proj", D, D, L, true);
    linear(a, v, "v_proj", D, D, L, true);
    linear(a, v, "out_proj", D, D, L, true);
    linear(a, v, "fc1", D, F, L, true);
    linear(a, v, "fc2", F, D, L, true);
    acc_add(a, prod(a, 2, D));                              /* post_layernorm */
    acc_add(a, prod(a, D, text_hidden) + D);                /* the projector */
    v->gc_layers = L;                                       /* SiglipEncoderLayer */
    return MP_OK;
}

/* Qwen2.5-VL (qwen2_5_vl/modeling_qwen2_5_vl.py Qwen2_5_VisionTransformerPretrainedModel,
 * Qwen2_5_VLVisionConfig defaults): a bias-free Conv3d patch embedding, blocks of two RMSNorms,
 * qkv and proj with biases and a gated MLP with biases, the merger (RMSNorm, two Linears of
 * width hidden x spatial_merge_size^2). */
static enum mp_status qwen2_5_vision(const cJSON *root, const cJSON *vc, uint64_t text_hidden, struct mp_idle *v,
                                    struct mp_vision *vis, struct acc *a, const char *path, struct mp_diag *d)
{
    uint64_t L = 32, D = 3584, F = 3420, C = 3, p = 14, sm = 2, t = 2, O = 3584, heads = 16, win = 112;
    uint64_t id = 151655; /* Qwen2_5_VLConfig.image_token_id */
    enum mp_status st;
    if ((st = POSITIVES(vc, {"depth", &L}, {"hidden_size", &D}, {"intermediate_size", &F}, {"in_channels", &C},
                            {"patch_size", &p}, {"spatial_merge_size", &sm}, {"temporal_patch_size", &t},
                            {"out_hidden_size", &O}, {"num_heads", &heads}, {"window_size", &win})) != MP_OK ||
        (st = mp_json_u64(root, "image_token_id", false, MP_DIM_MAX, &id, path, "", d)) != MP_OK)
        return st;
    enum mp_act ai;
    if ((st = vision_act(vc, MP_ACT_SILU, &ai, path, d)) != MP_OK)
        return st;
    *vis = (struct mp_vision){.kind = MP_VIS_QWEN2_5, .hidden = D, .ffn = F, .layers = L, .heads = heads, .channels = C,
                              .patch = p, .act = ai, .text_hidden = O, .token_id = id,
                              .temporal = t, .merge = sm, .window = win, .fullatt = {7, 15, 23, 31}, .n_fullatt = 4};
    const cJSON *fa = cJSON_GetObjectItemCaseSensitive(vc, "fullatt_block_indexes");
    if (fa && !cJSON_IsNull(fa)) {
        if (!cJSON_IsArray(fa) || cJSON_GetArraySize(fa) > MP_VISION_FULLATT_MAX)
            return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.fullatt_block_indexes: expected a list of at most %d "
                           "block indexes", path, MP_VISION_FULLATT_MAX);
        vis->n_fullatt = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, fa) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble != (double)(uint64_t)e->valuedouble)
                return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.fullatt_block_indexes: expected non-negative "
                               "integers", path);
            vis->fullatt[vis->n_fullatt++] = (uint64_t)e->valuedouble;
        }
    }
    if (O != text_hidden) /* masked_scatter fills the text embedding's rows with the merger's */
        vis->kind = MP_VIS_NONE;
    uint64_t M = prod(a, D, prod(a, sm, sm));
    acc_add(a, prod(a, prod(a, prod(a, C, t), prod(a, p, p)), D));
    acc_add(a, prod(a, prod(a, 2, D), L));
    linear(a, v, "attn.qkv", D, prod(a, 3, D), L, true);
    linear(a, v, "attn.proj", D, D, L, true);
    linear(a, v, "mlp.gate_proj", D, F, L, true);
    linear(a, v, "mlp.up_proj", D, F, L, true);
    linear(a, v, "mlp.down_proj", F, D, L, true);
    acc_add(a, D);
    linear(a, v, "merger.mlp.0", M, M, 1, true);
    linear(a, v, "merger.mlp.2", M, O, 1, true);
    v->gc_layers = L; /* Qwen2_5_VLVisionBlock */
    return MP_OK;
}

/* Qwen2-VL (qwen2_vl/modeling_qwen2_vl.py Qwen2VisionTransformerPretrainedModel,
 * Qwen2VLVisionConfig defaults): blocks of two LayerNorms, qkv and proj, fc1/fc2 of width
 * embed_dim x mlp_ratio, all with biases; the merger's LayerNorm and two Linears to hidden_size. */
static enum mp_status qwen2_vision(const cJSON *root, const cJSON *vc, uint64_t text_hidden, struct mp_idle *v,
                                   struct mp_vision *vis, struct acc *a, const char *path, struct mp_diag *d)
{
    uint64_t L = 32, E = 1280, H = 3584, r = 4, C = 3, p = 14, sm = 2, t = 2, heads = 16;
    uint64_t id = 151655; /* Qwen2VLConfig.image_token_id */
    enum mp_status st;
    if ((st = POSITIVES(vc, {"depth", &L}, {"embed_dim", &E}, {"hidden_size", &H}, {"mlp_ratio", &r},
                            {"in_channels", &C}, {"patch_size", &p}, {"spatial_merge_size", &sm},
                            {"temporal_patch_size", &t}, {"num_heads", &heads})) != MP_OK ||
        (st = mp_json_u64(root, "image_token_id", false, MP_DIM_MAX, &id, path, "", d)) != MP_OK)
        return st;
    enum mp_act ai;
    if ((st = vision_act(vc, MP_ACT_QUICK_GELU, &ai, path, d)) != MP_OK)
        return st;
    uint64_t F = prod(a, E, r), M = prod(a, E, prod(a, sm, sm));
    *vis = (struct mp_vision){.kind = MP_VIS_QWEN2, .hidden = E, .ffn = F, .layers = L, .heads = heads, .channels = C,
                              .patch = p, .act = ai, .text_hidden = H, .token_id = id,
                              .temporal = t, .merge = sm};
    if (H != text_hidden) /* masked_scatter fills the text embedding's rows with the merger's */
        vis->kind = MP_VIS_NONE;
    acc_add(a, prod(a, prod(a, prod(a, C, t), prod(a, p, p)), E));
    acc_add(a, prod(a, prod(a, 4, E), L));
    linear(a, v, "attn.qkv", E, prod(a, 3, E), L, true);
    linear(a, v, "attn.proj", E, E, L, true);
    linear(a, v, "mlp.fc1", E, F, L, true);
    linear(a, v, "mlp.fc2", F, E, L, true);
    acc_add(a, prod(a, 2, E));
    linear(a, v, "merger.mlp.0", M, M, 1, true);
    linear(a, v, "merger.mlp.2", M, H, 1, true);
    v->gc_layers = L; /* Qwen2VLVisionBlock */
    return MP_OK;
}

/* Pixtral (pixtral/modeling_pixtral.py PixtralVisionModel, PixtralVisionConfig defaults: a
 * bias-free Conv2d, ln_pre, layers of two RMSNorms, bias-free q/k/v/o and gated MLP) and Mistral 3's
 * projector (mistral3/modeling_mistral3.py Mistral3MultiModalProjector: an RMSNorm, the patch
 * merger's Linear(hidden x spatial_merge_size^2, hidden), linear_1 and linear_2 with
 * multimodal_projector_bias). */
static enum mp_status pixtral_mistral3(const cJSON *root, const cJSON *vc, uint64_t text_hidden, struct mp_idle *v,
                                       struct mp_vision *vis, struct acc *a, const char *path, struct mp_diag *d)
{
    uint64_t D = 1024, F = 4096, L = 24, C = 3, p = 16, sm = 2, layers = 1, H = 16, img = 1024;
    uint64_t id = 10; /* Mistral3Config.image_token_index (attribute_map: image_token_id) */
    bool bias = false, last = true;
    double ap = 0;
    enum mp_status st;
    if ((st = POSITIVES(vc, {"hidden_size", &D}, {"intermediate_size", &F}, {"num_hidden_layers", &L},
                            {"num_channels", &C}, {"patch_size", &p}, {"num_attention_heads", &H},
                            {"image_size", &img})) != MP_OK ||
        (st = mp_json_prob(vc, "attention_dropout", &ap, path, "vision_config", d)) != MP_OK ||
        (st = mp_json_u64(root, "spatial_merge_size", false, MP_DIM_MAX, &sm, path, "", d)) != MP_OK ||
        (st = mp_json_u64(root, "image_token_index", false, MP_DIM_MAX, &id, path, "", d)) != MP_OK ||
        (st = mp_json_u64(root, "image_token_id", false, MP_DIM_MAX, &id, path, "", d)) != MP_OK ||
        (st = mp_json_bool(root, "multimodal_projector_bias", &bias, path, "", d)) != MP_OK)
        return st;
    const cJSON *fl = cJSON_GetObjectItemCaseSensitive(root, "vision_feature_layer");
    if (cJSON_IsArray(fl) && cJSON_GetArraySize(fl) > 0) {
        layers = (uint64_t)cJSON_GetArraySize(fl);
        last = false;
    } else if (fl && !cJSON_IsNull(fl) && !cJSON_IsNumber(fl))
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_feature_layer: expected an integer or a list of integers", path);
    else if (cJSON_IsNumber(fl)) /* hidden_states holds L + 1 states: -1 and L are the last layer's output */
        last = fl->valuedouble == -1 || fl->valuedouble == (double)L;
    enum mp_act act = MP_ACT_GELU, pact = MP_ACT_GELU; /* PixtralVisionConfig.hidden_act, projector_hidden_act */
    const char *an = mp_json_str(vc, "hidden_act", &st, path, "vision_config", d);
    if (st != MP_OK)
        return st;
    const char *pn = mp_json_str(root, "projector_hidden_act", &st, path, "", d);
    if (st != MP_OK)
        return st;
    int ai = an ? mp_act_parse(an) : (int)act, pi = pn ? mp_act_parse(pn) : (int)pact;
    if (ai < 0 || pi < 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: '%s' is not a supported activation", path,
                       ai < 0 ? "vision_config.hidden_act" : "projector_hidden_act", ai < 0 ? an : pn);
    *vis = (struct mp_vision){.kind = MP_VIS_PIXTRAL, .hidden = D, .ffn = F, .layers = L, .heads = H, .channels = C,
                              .image = img, .patch = p, .act = (enum mp_act)ai, .attn_p = ap,
                              .text_hidden = text_hidden, .token_id = id, .merge = sm ? sm : 1,
                              .proj_act = (enum mp_act)pi, .proj_bias = bias, .feature_last = last};
    if (sm == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: spatial_merge_size: expected a positive integer", path);
    acc_add(a, prod(a, prod(a, prod(a, C, p), p), D));
    acc_add(a, D);
    acc_add(a, prod(a, prod(a, 2, D), L));
    linear(a, v, "q_proj", D, D, L, false);
    linear(a, v, "k_proj", D, D, L, false);
    linear(a, v, "v_proj", D, D, L, false);
    linear(a, v, "o_proj", D, D, L, false);
    linear(a, v, "gate_proj", D, F, L, false);
    linear(a, v, "up_proj", D, F, L, false);
    linear(a, v, "down_proj", F, D, L, false);
    acc_add(a, D);
    linear(a, v, "patch_merger.merging_layer", prod(a, D, prod(a, sm, sm)), D, 1, false);
    linear(a, v, "linear_1", prod(a, D, layers), text_hidden, 1, bias);
    linear(a, v, "linear_2", text_hidden, text_hidden, 1, bias);
    v->gc_layers = L; /* PixtralAttentionLayer */
    return MP_OK;
}

/* Llama 3.2 Vision (mllama/modeling_mllama.py MllamaVisionModel, MllamaVisionConfig defaults): a
 * bias-free Conv2d, the class embedding, the gated position embedding (a gate, num_patches x hidden
 * and a tile table of (max_aspect_ratio_id + 1) rows of max_num_tiles x num_patches x hidden, with
 * num_patches = (image_size / patch_size)^2 + 1), the pre- and post-tile embeddings (tables of
 * max_num_tiles x hidden, a gate each), two LayerNorms, the local transformer (num_hidden_layers)
 * and the gated global one (num_global_layers, two scalar gates a layer), both of bias-free
 * q/k/v/o, fc1/fc2 with biases and two LayerNorms; then the projector MllamaModel builds:
 * Linear(vision_output_dim, text hidden) with bias.  max_aspect_ratio_id is the length of
 * supported_aspect_ratios (eight by default, with max_num_tiles 4: validate_architecture). */
static enum mp_status mllama_vision(const cJSON *vc, uint64_t text_hidden, const struct mp_hf_cross *x,
                                    struct mp_idle *v, struct mp_vision *vis, struct acc *a, const char *path,
                                    struct mp_diag *d)
{
    uint64_t D = 1280, F = 5120, L = 32, G = 8, H = 16, C = 3, img = 448, p = 14, tiles = 4, out = 7680, ratios = 8;
    uint64_t K = 5; /* MllamaVisionConfig.intermediate_layers_indices: [3, 7, 15, 23, 30] */
    enum mp_status st;
    if ((st = POSITIVES(vc, {"hidden_size", &D}, {"intermediate_size", &F}, {"num_hidden_layers", &L},
                            {"attention_heads", &H}, {"num_channels", &C}, {"image_size", &img}, {"patch_size", &p},
                            {"max_num_tiles", &tiles}, {"vision_output_dim", &out})) != MP_OK)
        return st;
    /* num_global_layers may be 0 (no global encoder layer) */
    if ((st = mp_json_u64(vc, "num_global_layers", false, MP_DIM_MAX, &G, path, "vision_config", d)) != MP_OK)
        return st;
    if (cJSON_GetObjectItemCaseSensitive(vc, "num_attention_heads")) /* attribute_map: the same field */
        if ((st = pos(vc, "num_attention_heads", &H, path, d)) != MP_OK)
            return st;
    const cJSON *sr = cJSON_GetObjectItemCaseSensitive(vc, "supported_aspect_ratios");
    if (sr && !cJSON_IsNull(sr) && !cJSON_IsArray(sr))
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.supported_aspect_ratios: expected a list of [h, w] pairs",
                       path);
    if (cJSON_IsArray(sr))
        ratios = (uint64_t)cJSON_GetArraySize(sr);
    const cJSON *il = cJSON_GetObjectItemCaseSensitive(vc, "intermediate_layers_indices");
    if (il && !cJSON_IsNull(il) && !cJSON_IsArray(il))
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.intermediate_layers_indices: expected a list of layer "
                       "indices", path);
    if (cJSON_IsArray(il))
        K = (uint64_t)cJSON_GetArraySize(il);
    else if (tiles != 4)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.max_num_tiles: %llu with the default "
                       "supported_aspect_ratios (MllamaVisionConfig requires 4)", path, (unsigned long long)tiles);
    if (img / p == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.patch_size: larger than image_size", path);
    uint64_t np = sum(a, prod(a, img / p, img / p), 1), hd = D / H, rows = sum(a, ratios, 1);
    if (hd == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.attention_heads: more heads than hidden_size", path);
    uint64_t LG = sum(a, L, G);
    acc_add(a, prod(a, prod(a, prod(a, C, p), p), D));                 /* patch_embedding */
    acc_add(a, D);                                                    /* class_embedding */
    acc_add(a, 1);                                                    /* gated positions: the gate, */
    acc_add(a, prod(a, np, D));                                       /* the positions, the tiles' */
    acc_add(a, prod(a, rows, prod(a, prod(a, tiles, np), D)));
    acc_add(a, prod(a, 2, sum(a, prod(a, rows, prod(a, tiles, D)), 1))); /* pre/post tile embeddings */
    acc_add(a, prod(a, 4, D));                                        /* layernorm_pre, layernorm_post */
    linear(a, v, "q_proj", D, prod(a, H, hd), LG, false);
    linear(a, v, "k_proj", D, prod(a, H, hd), LG, false);
    linear(a, v, "v_proj", D, prod(a, H, hd), LG, false);
    linear(a, v, "o_proj", prod(a, H, hd), D, LG, false);
    linear(a, v, "fc1", D, F, LG, true);
    linear(a, v, "fc2", F, D, LG, true);
    acc_add(a, prod(a, prod(a, 4, D), LG));                          /* two LayerNorms a layer */
    acc_add(a, prod(a, 2, G));                                        /* gate_attn, gate_ffn */
    linear(a, v, "multi_modal_projector", out, text_hidden, 1, true);
    *vis = (struct mp_vision){.kind = MP_VIS_MLLAMA, .hidden = D, .ffn = F, .layers = L, .heads = H, .channels = C,
                              .image = img, .patch = p, .act = MP_ACT_GELU, .text_hidden = text_hidden, .tokens = 1,
                              .tiles = tiles, .vision_out = out, .merge = rows, .global_layers = G, .n_inter = K,
                              .x_heads = x ? x->heads : 0, .x_kv_heads = x ? x->kv_heads : 0,
                              .x_head_dim = x ? x->head_dim : 0, .x_ffn = x ? x->ffn : 0};
    enum mp_act act; /* MllamaVisionConfig.hidden_act */
    if ((st = vision_act(vc, MP_ACT_GELU, &act, path, d)) != MP_OK)
        return st;
    vis->act = act;
    /* what the image step needs of the widths (else transformers' reshapes fail): refused with
     * images only */
    if (out != prod(a, D, K + 1))
        vis->proj_bad = "vision_output_dim must be hidden_size x (1 + the intermediate layers' count)";
    else if (D % H || img % p)
        vis->proj_bad = "attention_heads must divide hidden_size, patch_size image_size";
    return MP_OK; /* (MllamaVisionEncoderLayer is a plain nn.Module: no gc_layers) */
}

/* Mllama's cross-attention decoder layers (modeling_mllama.py MllamaCrossAttentionDecoderLayer):
 * bias-free q/k/v/o (k and v of num_key_value_heads), per-head RMSNorms q_norm and k_norm of
 * head_dim, two RMSNorms of hidden, two scalar gates, and the gated MLP of the self-attention
 * layers (MllamaTextMLP). */
static void mllama_cross(const struct mp_hf_cross *x, struct mp_idle *v, struct acc *a)
{
    uint64_t n = x->layers, q = prod(a, x->heads, x->head_dim), kv = prod(a, x->kv_heads, x->head_dim);
    linear(a, v, "q_proj", x->hidden, q, n, false);
    linear(a, v, "k_proj", x->hidden, kv, n, false);
    linear(a, v, "v_proj", x->hidden, kv, n, false);
    linear(a, v, "o_proj", q, x->hidden, n, false);
    linear(a, v, "gate_proj", x->hidden, x->ffn, n, false);
    linear(a, v, "up_proj", x->hidden, x->ffn, n, false);
    linear(a, v, "down_proj", x->ffn, x->hidden, n, false);
    acc_add(a, prod(a, sum(a, sum(a, prod(a, 2, x->head_dim), prod(a, 2, x->hidden)), 2), n));
}

/* Llama 4's vision model and projector (llama4/modeling_llama4.py Llama4VisionModel :1003-1038,
 * Llama4UnfoldConvolution, Llama4VisionEncoderLayer, Llama4VisionPixelShuffleMLP, Llama4VisionMLP2,
 * Llama4MultiModalProjector; Llama4VisionConfig defaults): a bias-free Linear(C p p, hidden) on the
 * unfolded patches, the class embedding, (image / patch)^2 + 1 learned positions, two LayerNorms;
 * each layer q/k/v/o and fc1/fc2 with biases and two LayerNorms; the adapter's bias-free
 * fc1 (intermediate_size -> projector_input_dim) and fc2 (projector_output_dim square); the
 * projector's bias-free linear_1 (vision_output_dim -> text hidden).  Every encoder layer is a
 * GradientCheckpointingLayer, ahead of the text layers in module order. */
static enum mp_status llama4_vision(const cJSON *root, const cJSON *vc, uint64_t text_hidden, struct mp_idle *v,
                                    struct mp_vision *vis, struct acc *a, const char *path, struct mp_diag *d)
{
    uint64_t D = 768, F = 5632, L = 34, H = 16, C = 3, img = 448, p = 14, out = 7680, pin = 4096, pout = 4096;
    uint64_t id = 200092; /* Llama4Config.image_token_index (attribute_map: image_token_id) */
    double ratio = 0.5, ap = 0, pp = 0;
    enum mp_status st;
    if ((st = POSITIVES(vc, {"hidden_size", &D}, {"intermediate_size", &F}, {"num_hidden_layers", &L},
                            {"num_attention_heads", &H}, {"num_channels", &C}, {"image_size", &img},
                            {"patch_size", &p}, {"vision_output_dim", &out}, {"projector_input_dim", &pin},
                            {"projector_output_dim", &pout})) != MP_OK ||
        (st = mp_json_num(vc, "pixel_shuffle_ratio", 0, true, 1, &ratio, path, "vision_config", d)) != MP_OK ||
        (st = mp_json_prob(vc, "attention_dropout", &ap, path, "vision_config", d)) != MP_OK ||
        (st = mp_json_prob(vc, "projector_dropout", &pp, path, "vision_config", d)) != MP_OK ||
        (st = mp_json_u64(root, "image_token_index", false, MP_DIM_MAX, &id, path, "", d)) != MP_OK ||
        (st = mp_json_u64(root, "image_token_id", false, MP_DIM_MAX, &id, path, "", d)) != MP_OK)
        return st;
    if (img / p == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.patch_size: larger than image_size", path);
    if (D / H == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.num_attention_heads: more heads than hidden_size", path);
    /* (hidden_act is not read: Llama4VisionMLP and Llama4VisionMLP2 use nn.GELU()) */
    uint64_t k = (uint64_t)(1.0 / ratio + 0.5), side = img / p;
    *vis = (struct mp_vision){.kind = MP_VIS_LLAMA4, .hidden = D, .ffn = F, .layers = L, .heads = H, .channels = C,
                              .image = img, .patch = p, .act = MP_ACT_GELU, .attn_p = ap, .text_hidden = text_hidden,
                              .token_id = id, .merge = k, .proj_in = pin, .proj_out = pout, .vision_out = out};
    /* what pixel_shuffle, the adapter and the projector need of the widths (else their shapes
     * disagree and transformers' forward fails): refused with images only */
    if (k < 1 || k > 64 || fabs(1.0 / (double)k - ratio) > 1e-9 || img % p || side % k || D % H || (D / H) % 2)
        vis->proj_bad = "pixel_shuffle_ratio must be 1 / k with k dividing image_size / patch_size (and "
                        "patch_size image_size, heads hidden_size into even head widths)";
    else if (F != D * k * k)
        vis->proj_bad = "intermediate_size must be hidden_size / pixel_shuffle_ratio^2 (the adapter's fc1 reads "
                        "the shuffled patches)";
    else if (pin != pout || out != pout)
        vis->proj_bad = "projector_input_dim, projector_output_dim and vision_output_dim must be equal (the "
                        "adapter's fc2 and the projector read the width before them)";
    else if (pp > 0)
        vis->proj_bad = "projector_dropout above 0 is not modelled";
    uint64_t np = sum(a, prod(a, img / p, img / p), 1), hd = prod(a, H, D / H);
    linear(a, v, "linear", prod(a, prod(a, C, p), p), D, 1, false); /* patch_embedding.linear */
    acc_add(a, D);                                                  /* class_embedding */
    acc_add(a, prod(a, np, D));                                     /* positional_embedding_vlm */
    acc_add(a, prod(a, 4, D));                                      /* layernorm_pre, layernorm_post */
    linear(a, v, "q_proj", D, hd, L, true);
    linear(a, v, "k_proj", D, hd, L, true);
    linear(a, v, "v_proj", D, hd, L, true);
    linear(a, v, "o_proj", hd, D, L, true);
    linear(a, v, "fc1", D, F, L, true);
    linear(a, v, "fc2", F, D, L, true);
    acc_add(a, prod(a, prod(a, 4, D), L)); /* two LayerNorms a layer */
    linear(a, v, "fc1", F, pin, 1, false); /* vision_adapter.mlp */
    linear(a, v, "fc2", pout, pout, 1, false);
    linear(a, v, "linear_1", out, text_hidden, 1, false);
    v->gc_layers = L;
    return MP_OK;
}

enum mp_status mp_hf_vision_modules(const cJSON *root, const char *type, uint64_t text_hidden,
                                    const struct mp_hf_cross *cross, struct mp_idle *v, struct mp_vision *vis,
                                    const char *path, struct mp_diag *d)
{
    memset(v, 0, sizeof *v);
    memset(vis, 0, sizeof *vis);
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
    static const cJSON empty = {0};
    if (vc && !cJSON_IsNull(vc) && !cJSON_IsObject(vc))
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config: expected an object", path);
    if (!vc || cJSON_IsNull(vc))
        vc = &empty; /* the vision config class's defaults */
    struct acc a = {0, true, false};
    enum mp_status st;
    if (!strcmp(type, "gemma3"))
        st = siglip_gemma3(root, vc, text_hidden, v, vis, &a, path, d);
    else if (!strcmp(type, "qwen2_5_vl"))
        st = qwen2_5_vision(root, vc, text_hidden, v, vis, &a, path, d);
    else if (!strcmp(type, "qwen2_vl"))
        st = qwen2_vision(root, vc, text_hidden, v, vis, &a, path, d);
    else if (!strcmp(type, "mllama"))
        st = mllama_vision(vc, text_hidden, cross, v, vis, &a, path, d);
    else if (!strcmp(type, "llama4"))
        st = llama4_vision(root, vc, text_hidden, v, vis, &a, path, d);
    else
        st = pixtral_mistral3(root, vc, text_hidden, v, vis, &a, path, d);
    if (st != MP_OK)
        return st;
    if (cross && cross->layers)
        mllama_cross(cross, v, &a);
    if (!a.ok || a.n > MP_DIM_MAX * 64)
        return mp_fail(d, MP_ERR_RANGE, "%s: vision_config: the vision tower is too large", path);
    if (a.full)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config: the %s tower has more than %d kinds of Linear, which "
                       "memplan keeps (model.h MP_IDLE_LINEARS_MAX)", path, type, MP_IDLE_LINEARS_MAX);
    v->params = a.n;
    snprintf(v->what, sizeof v->what, "%s", !strcmp(type, "mllama") ? "vision_model + projector + "
                                                                       "cross-attention layers"
                                            : !strcmp(type, "llama4") ? "vision_model + multi_modal_projector"
                                            : !strcmp(type, "gemma3") || !strcmp(type, "mistral3")
                                               ? "vision_tower + multi_modal_projector"
                                               : "visual: vision tower + merger");
    return MP_OK;
}

/* ---- steps with images (--images) -------------------------------------------------------------
 *
 * Gemma 3 (gemma3/modeling_gemma3.py Gemma3Model.forward, get_image_features,
 * Gemma3MultiModalProjector; siglip/modeling_siglip.py SiglipVisionTransformer, transformers
 * 5.24): pixel_values (batch x images, C, image, image) run through SiglipVisionEmbeddings (the
 * patch Conv2d, + position_embedding(position_ids): an nn.Embedding looked up with a registered
 * buffer), the encoder's layers (pre-LayerNorm, bidirectional attention with biases, fc1 / fc2 with
 * hidden_act), post_layernorm, then the projector (tokens to a (dim, side, side) grid, AvgPool2d,
 * Gemma3RMSNorm, a matmul with mm_input_projection_weight, type_as); the text embedding's output
 * gets the image features scattered into the image tokens' positions (masked_scatter).  Each
 * SiglipEncoderLayer is a GradientCheckpointingLayer: checkpointed like the text layers.
 *
 * Mistral 3 (mistral3/modeling_mistral3.py Mistral3Model.forward, get_image_features,
 * Mistral3MultiModalProjector, Mistral3PatchMerger; pixtral/modeling_pixtral.py
 * PixtralVisionModel.forward): the text embedding first, then pixel_values (batch x images, C, H,
 * W) through the bias-free patch_conv; every image's patches flattened and concatenated into ONE
 * sequence (batch 1, images x patches long), ln_pre (RMSNorm); the 2-D rotary tables and the
 * block-diagonal float mask over that sequence, made once; the PixtralAttentionLayers (RMSNorm,
 * bias-free q/k/v/o with the rotary, the gated MLP; GradientCheckpointingLayers); the projector:
 * RMSNorm, the patch merger (per image: unfold by spatial_merge_size, then one cat), merging_layer,
 * linear_1, the activation, linear_2; the features concatenated again (torch.cat of the per-image
 * splits) and scattered into the text embedding (masked_scatter). */

static struct mp_block *front_block(struct mp_model *m, const char *name, size_t n, struct mp_diag *d)
{
    struct mp_block *b = mp_model_add_block(m, name, n);
    if (!b)
        mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
    return b;
}

/* The block of the tower's layer i, named prefix.i, its one layer returned: a transformer block of
 * the tower's width, heads and MLP, non-causal SDPA with eager's fp32 softmax
 * (eager_attention_forward: softmax(dtype=float32).to(q.dtype)); repeat group 2, as each is a
 * GradientCheckpointingLayer (checkpointed like the text layers). */
static struct mp_layer *layer_block(struct mp_model *m, const char *prefix, uint64_t i, struct mp_diag *d)
{
    const struct mp_vision *v = &m->vision;
    char name[48];
    snprintf(name, sizeof name, "%s.%llu", prefix, (unsigned long long)i);
    struct mp_block *b = front_block(m, name, 1, d);
    if (!b)
        return NULL;
    b->repeat_group = 2;
    struct mp_layer *l = b->layers;
    l->type = MP_LT_TRANSFORMER_BLOCK;
    l->vision = true;
    l->dim = v->hidden;
    l->attn.heads = l->attn.kv_heads = v->heads;
    l->attn.head_dim = v->hidden / v->heads;
    l->attn.impl = MP_ATTN_SDPA;
    l->attn.softmax_fp32 = true;
    l->mlp.ffn = v->ffn;
    l->mlp.act = v->act;
    return l;
}

/* The vision blocks (made at the end of m's blocks from text0 on, nv of them) to the front, the
 * text model's after them, in order. */
static enum mp_status blocks_to_front(struct mp_model *m, size_t text0, size_t nv, struct mp_diag *d)
{
    struct mp_block *tmp = malloc(nv * sizeof *tmp);
    if (!tmp)
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
    memcpy(tmp, m->blocks + text0, nv * sizeof *tmp);
    memmove(m->blocks + nv, m->blocks, text0 * sizeof *tmp);
    memcpy(m->blocks, tmp, nv * sizeof *tmp);
    free(tmp);
    return MP_OK;
}

/* The vision blocks to the front (blocks_to_front); the text model's embedding scatters the image
 * features in (masked_scatter). */
static enum mp_status to_front(struct mp_model *m, size_t text0, size_t nv, struct mp_diag *d)
{
    enum mp_status st = blocks_to_front(m, text0, nv, d);
    if (st != MP_OK)
        return st;
    struct mp_layer *e = &m->blocks[nv].layers[0];
    e->vision = true;
    if (m->vision.token_id >= e->vocab) /* Gemma3Model.forward then clones input_ids and zeroes the image tokens */
        return mp_fail(d, MP_ERR_MODEL, "%s: image_token_index: %llu is outside the text vocabulary (%llu): "
                       "the ids' copy transformers then makes is not modelled", m->path,
                       (unsigned long long)m->vision.token_id, (unsigned long long)e->vocab);
    memset(&m->idle, 0, sizeof m->idle);
    return MP_OK;
}

/* The tower built (nv blocks from text0 on): moved to the front, the model's image fields set. */
static enum mp_status images_done(struct mp_model *m, const struct mp_model_request *rq, size_t text0, size_t nv,
                                  struct mp_diag *d)
{
    enum mp_status st = to_front(m, text0, nv, d);
    if (st != MP_OK)
        return st;
    m->images = rq->images;
    m->channels = m->vision.channels;
    m->height = m->vision.height;
    m->width = m->vision.width;
    mp_model_mark_copies(m);
    return MP_OK;
}

/* The first vision block: the text embedding's lookup (a copy of the text model's first layer,
 * made first as both models' forward do) and the patch embedding; returns its second layer. */
static struct mp_layer *embeddings_block(struct mp_model *m, size_t n_layers, struct mp_diag *d)
{
    const struct mp_vision *v = &m->vision;
    struct mp_block *b = front_block(m, "vision.embeddings", n_layers, d);
    if (!b)
        return NULL;
    struct mp_layer *l = b->layers;
    if (m->blocks[0].layers[0].type != MP_LT_EMBEDDING)
        MP_BUG("the text model does not start with its embedding");
    *l = m->blocks[0].layers[0]; /* (blocks[0]: the text model's first, before the move) */
    l->vision = true;
    l->emb.image_lookup = true;
    l++;
    l->type = MP_LT_PATCH_EMBEDDING;
    l->vision = true;
    l->conv.in_ch = v->channels;
    l->dim = v->hidden;
    l->conv.kernel = l->conv.stride = v->patch;
    snprintf(l->name, sizeof l->name, "%s", v->kind == MP_VIS_PIXTRAL ? "patch_conv" : "patch_embedding");
    return l;
}

/* The encoder's layers: one block each (repeat group 2, checkpointed like the text layers). */
static enum mp_status encoder_blocks(struct mp_model *m, struct mp_diag *d)
{
    const struct mp_vision *v = &m->vision;
    for (uint64_t i = 0; i < v->layers; i++) {
        struct mp_layer *l = layer_block(m, "vision.layers", i, d);
        if (!l)
            return MP_ERR_NOMEM;
        l->attn.dropout = v->attn_p;
        if (v->kind == MP_VIS_PIXTRAL) { /* PixtralAttentionLayer: RMSNorms, bias-free, rotary, block mask, gated MLP */
            l->norm.kind = MP_NORM_RMSNORM;
            l->rope.on = true;
            l->attn.block_mask = true;
            l->mlp.gated = true;
        } else { /* SiglipEncoderLayer */
            l->attn.qkv_bias = l->attn.out_bias = true;
            l->norm.kind = MP_NORM_LAYERNORM;
            l->norm.bias = true;
            l->mlp.bias = true;
        }
    }
    return MP_OK;
}

static struct mp_layer *named(struct mp_layer *l, enum mp_layer_type type, uint64_t dim, const char *name)
{
    l->type = type;
    l->dim = dim;
    snprintf(l->name, sizeof l->name, "%s", name);
    return l;
}

/* Gemma 3: SigLIP's tower, post_layernorm, the AvgPool2d projector. */
static enum mp_status siglip_blocks(struct mp_model *m, const struct mp_model_request *rq, struct mp_diag *d)
{
    struct mp_vision *v = &m->vision;
    uint64_t side = v->image / v->patch, t = 1;
    while ((t + 1) * (t + 1) <= v->tokens)
        t++;
    if ((rq->image_h || rq->image_w) && (rq->image_h != v->image || rq->image_w != v->image))
        return mp_fail(d, MP_ERR_USAGE, "%s: --image-size %llux%llu: Gemma 3's processor resizes every image to "
                       "vision_config.image_size (%llux%llu)", m->path, (unsigned long long)rq->image_h,
                       (unsigned long long)rq->image_w, (unsigned long long)v->image, (unsigned long long)v->image);
    if (v->image % v->patch)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.patch_size: %llu does not divide image_size %llu", m->path,
                       (unsigned long long)v->patch, (unsigned long long)v->image);
    if (t * t != v->tokens || side % t)
        return mp_fail(d, MP_ERR_MODEL, "%s: mm_tokens_per_image: %llu is not the square of a divisor of the %llu "
                       "patches per side (the projector's AvgPool2d would not make that many tokens)", m->path,
                       (unsigned long long)v->tokens, (unsigned long long)side);
    struct mp_layer *l = embeddings_block(m, 2, d);
    if (!l)
        return MP_ERR_NOMEM;
    enum mp_status st = encoder_blocks(m, d);
    struct mp_block *b = st == MP_OK ? front_block(m, "vision.projector", 4, d) : NULL;
    if (!b)
        return st != MP_OK ? st : MP_ERR_NOMEM;
    l = b->layers;
    named(&l[0], MP_LT_LAYERNORM, v->hidden, "post_layernorm")->norm.kind = MP_NORM_LAYERNORM;
    l[0].norm.bias = true;
    named(&l[1], MP_LT_AVGPOOL2D, v->hidden, "avg_pool")->vision = true;
    l[1].conv.kernel = l[1].conv.stride = side / t;
    named(&l[2], MP_LT_RMSNORM, v->hidden, "mm_soft_emb_norm")->norm.kind = MP_NORM_RMSNORM;
    l[2].norm.rms_fp32 = true; /* Gemma3RMSNorm */
    named(&l[3], MP_LT_LINEAR, 0, "mm_input_projection")->vision = true;
    l[3].in_features = v->hidden;
    l[3].out_features = v->text_hidden;
    v->height = v->width = m->height = m->width = v->image;
    v->asked_h = rq->image_h;
    v->asked_w = rq->image_w;
    return MP_OK;
}

/* Mistral 3: Pixtral's tower at the asked image size, the patch-merging projector.  The processor
 * (pixtral/image_processing_pixtral.py, processing_pixtral.py) resizes each image to at most
 * image_size a side, in multiples of patch_size x spatial_merge_size, and writes rows x (columns +
 * 1) tokens for it ([IMG] per merged patch, [IMG_BREAK] after each row, [IMG_END] last): those are
 * part of --seq; rows x columns of them are image tokens, filled with the features. */
static enum mp_status pixtral_blocks(struct mp_model *m, const struct mp_model_request *rq, struct mp_diag *d)
{
    struct mp_vision *v = &m->vision;
    uint64_t h = rq->image_h ? rq->image_h : v->image, w = rq->image_w ? rq->image_w : v->image, unit, rows, cols;
    if (!v->feature_last)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_feature_layer: steps with images are modelled for the last "
                       "layer's output (-1) only (an earlier layer's or several layers' features are not)", m->path);
    if (!mp_mul_u64(v->patch, v->merge, &unit) || h % unit || w % unit)
        return mp_fail(d, MP_ERR_USAGE, "%s: --image-size %llux%llu: each side must be a multiple of patch_size x "
                       "spatial_merge_size = %llu (the processor resizes images so)", m->path,
                       (unsigned long long)h, (unsigned long long)w, (unsigned long long)unit);
    if (h > v->image || w > v->image)
        return mp_fail(d, MP_ERR_USAGE, "%s: --image-size %llux%llu: a side exceeds vision_config.image_size %llu "
                       "(the processor's longest edge)", m->path, (unsigned long long)h, (unsigned long long)w,
                       (unsigned long long)v->image);
    rows = h / unit;
    cols = w / unit;
    if (!mp_mul_u64(rows, cols + 1, &v->tokens))
        return mp_fail(d, MP_ERR_RANGE, "%s: --image-size: too many tokens", m->path);
    struct mp_layer *l = embeddings_block(m, 3, d);
    if (!l)
        return MP_ERR_NOMEM;
    named(l + 1, MP_LT_RMSNORM, v->hidden, "ln_pre")->norm.kind = MP_NORM_RMSNORM;
    enum mp_status st = encoder_blocks(m, d);
    struct mp_block *b = st == MP_OK ? front_block(m, "vision.projector", 6, d) : NULL;
    if (!b)
        return st != MP_OK ? st : MP_ERR_NOMEM;
    l = b->layers;
    uint64_t sm2 = v->merge * v->merge;
    named(&l[0], MP_LT_RMSNORM, v->hidden, "norm")->norm.kind = MP_NORM_RMSNORM;
    l[0].vision = true; /* (its input held: lower_layer.c) */
    named(&l[1], MP_LT_AVGPOOL2D, v->hidden, "patch_merger")->vision = true;
    l[1].conv.kernel = l[1].conv.stride = v->merge;
    l[1].conv.out_h = h / v->patch; /* each image's grid of patches */
    l[1].conv.out_w = w / v->patch;
    named(&l[2], MP_LT_LINEAR, 0, "merging_layer")->vision = true;
    l[2].in_features = v->hidden * sm2; /* (checked: unit = patch x merge) */
    l[2].out_features = v->hidden;
    named(&l[3], MP_LT_LINEAR, 0, "linear_1")->vision = true;
    l[3].in_features = v->hidden;
    l[3].out_features = v->text_hidden;
    l[3].bias = v->proj_bias;
    named(&l[4], MP_LT_ACTIVATION, v->text_hidden, "act")->mlp.act = v->proj_act;
    named(&l[5], MP_LT_LINEAR, 0, "linear_2")->vision = true;
    l[5].in_features = l[5].out_features = v->text_hidden;
    l[5].bias = v->proj_bias;
    v->height = m->height = h;
    v->width = m->width = w;
    v->asked_h = rq->image_h;
    v->asked_w = rq->image_w;
    return MP_OK;
}

/* Python's round(x / f) * f for integers (round half to even), as smart_resize rounds. */
static uint64_t round_to(uint64_t x, uint64_t f)
{
    uint64_t q = x / f, r = x % f;
    if (2 * r > f || (2 * r == f && (q & 1)))
        q++;
    return q * f;
}

/* Qwen2VLImageProcessor's smart_resize (transformers 5.24 image_processing_qwen2_vl.py:63-89, the
 * class's size defaults: min_pixels 56 x 56, max_pixels 28 x 28 x 1280): both sides to multiples
 * of factor = patch x merge, the pixel count kept within the two bounds; an aspect ratio above
 * 200 is refused, as there. */
static enum mp_status smart_resize(struct mp_model *m, uint64_t h, uint64_t w, uint64_t f, uint64_t *rh,
                                   uint64_t *rw, struct mp_diag *d)
{
    const double lo = (double)MP_QWEN_MIN_PIXELS, hi = (double)MP_QWEN_MAX_PIXELS;
    if ((h > w ? h : w) > 200 * (h < w ? h : w))
        return mp_fail(d, MP_ERR_USAGE, "%s: --image-size %llux%llu: the processor refuses an aspect ratio above "
                       "200 (smart_resize)", m->path, (unsigned long long)h, (unsigned long long)w);
    double hb = (double)round_to(h, f), wb = (double)round_to(w, f), px = (double)h * (double)w;
    if (hb * wb > hi) {
        double beta = sqrt(px / hi), a = floor((double)h / beta / (double)f) * (double)f,
               b = floor((double)w / beta / (double)f) * (double)f;
        hb = a > (double)f ? a : (double)f;
        wb = b > (double)f ? b : (double)f;
    } else if (hb * wb < lo) {
        double beta = sqrt(lo / px);
        hb = ceil((double)h * beta / (double)f) * (double)f;
        wb = ceil((double)w * beta / (double)f) * (double)f;
    }
    *rh = (uint64_t)hb;
    *rw = (uint64_t)wb;
    return MP_OK;
}

/* Qwen2-VL (qwen2_vl/modeling_qwen2_vl.py, transformers 5.24; docs/memory-facts.md#qwen-vl-images):
 * pixel_values (every image's patches, C x temporal_patch_size x patch^2) through PatchEmbed's
 * bias-free Conv3d (kernel = stride: a conv of C x t channels over patch x patch), the blocks
 * (LayerNorms, a fused qkv with the fp32 vision rotary cast back, one SDPA per image and the
 * torch.cat of their outputs, fc1 / quick_gelu / fc2; each a GradientCheckpointingLayer), the
 * PatchMerger (ln_q, merge^2 patches viewed as one row, Linear, GELU, Linear), the torch.cat of
 * the per-image features, masked_scatter into the text embedding.  b and s are the images' and
 * each image's patches while the tower is lowered. */
static enum mp_status qwen2_images(struct mp_model *m, const struct mp_model_request *rq, struct mp_diag *d)
{
    struct mp_vision *v = &m->vision;
    uint64_t h = rq->image_h, w = rq->image_w;
    uint64_t f = v->patch * v->merge;
    if (v->patch > MP_DIM_MAX || v->merge > 64 || f == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config: patch_size x spatial_merge_size is too large", m->path);
    v->asked_h = h; /* (0: the default, 448 x 448 pixels) */
    v->asked_w = w;
    enum mp_status st = smart_resize(m, h ? h : 448, w ? w : 448, f, &v->height, &v->width, d);
    if (st != MP_OK)
        return st;
    uint64_t ph = v->height / v->patch, pw = v->width / v->patch, patches = ph * pw;
    v->tokens = patches / (v->merge * v->merge);
    if (v->hidden % v->heads || (v->hidden / v->heads) % 4)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.num_heads: %llu does not divide embed_dim %llu into "
                       "heads of a multiple of 4 (the vision rotary's halves)", m->path,
                       (unsigned long long)v->heads, (unsigned long long)v->hidden);
    if (v->layers > ((size_t)1 << 20))
        return mp_fail(d, MP_ERR_RANGE, "%s: vision_config.depth: too many layers", m->path);
    if (v->kind == MP_VIS_QWEN2_5 && v->window % f) /* get_vision_window_index: window_size // merge // patch units */
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.window_size: %llu is not a multiple of patch_size x "
                       "spatial_merge_size (%llu)", m->path, (unsigned long long)v->window, (unsigned long long)f);
    size_t text0 = m->n_blocks, nv = (size_t)v->layers + 2;
    struct mp_layer *l = embeddings_block(m, 2, d);
    if (!l)
        return MP_ERR_NOMEM;
    l->conv.in_ch = v->channels * v->temporal; /* Conv3d over (C, t, p, p) = a conv of C x t channels */
    snprintf(l->name, sizeof l->name, "patch_embed");
    for (uint64_t i = 0; i < v->layers; i++) {
        if (!(l = layer_block(m, "vision.blocks", i, d))) /* Qwen2VLVisionBlock */
            return MP_ERR_NOMEM;
        l->attn.fused_qkv = l->attn.qkv_bias = l->attn.out_bias = true;
        l->rope.on = l->rope.fp32 = l->rope.cast_back = true; /* q.float(), k.float(), .to(q's dtype) */
        l->rope.per_sample = true; /* cos, sin: (patches of every image, head_dim) */
        l->rope.cat = true;        /* torch.cat of the per-image outputs: a copy proj saves */
        l->norm.kind = v->kind == MP_VIS_QWEN2_5 ? MP_NORM_RMSNORM : MP_NORM_LAYERNORM; /* Qwen2_5_VLRMSNorm */
        l->norm.bias = v->kind == MP_VIS_QWEN2;
        l->mlp.bias = true;
        l->mlp.gated = v->kind == MP_VIS_QWEN2_5; /* Qwen2_5_VLMLP: gate_proj, up_proj, down_proj with biases */
        bool full = v->kind != MP_VIS_QWEN2_5;
        for (size_t j = 0; j < v->n_fullatt; j++)
            full = full || v->fullatt[j] == i;
        l->conv.kernel = full ? 0 : v->window / v->patch; /* a window block: its side in patches */
    }
    struct mp_block *b = front_block(m, "vision.merger", 4, d);
    if (!b)
        return MP_ERR_NOMEM;
    l = b->layers;
    uint64_t unit = v->merge * v->merge, M = v->hidden * unit;
    l[0].type = v->kind == MP_VIS_QWEN2_5 ? MP_LT_RMSNORM : MP_LT_LAYERNORM;
    l[0].dim = v->hidden;
    l[0].norm.kind = v->kind == MP_VIS_QWEN2_5 ? MP_NORM_RMSNORM : MP_NORM_LAYERNORM;
    l[0].norm.bias = v->kind == MP_VIS_QWEN2;
    snprintf(l[0].name, sizeof l[0].name, "ln_q");
    l[1].type = MP_LT_LINEAR;
    l[1].vision = true;
    l[1].in_features = l[1].out_features = M;
    l[1].bias = true;
    l[1].conv.kernel = unit; /* x.view(-1, hidden x merge^2) first */
    snprintf(l[1].name, sizeof l[1].name, "mlp.0");
    l[2].type = MP_LT_ACTIVATION;
    l[2].mlp.act = MP_ACT_GELU;
    snprintf(l[2].name, sizeof l[2].name, "mlp.1");
    l[3].type = MP_LT_LINEAR;
    l[3].vision = true;
    l[3].in_features = M;
    l[3].out_features = v->text_hidden;
    l[3].bias = true;
    l[3].conv.stride = 1; /* then Qwen2VLModel.forward's torch.cat of the per-image features */
    snprintf(l[3].name, sizeof l[3].name, "mlp.2");
    return images_done(m, rq, text0, nv, d);
}

/* Llama4ImageProcessor's canvas for an image of h x w pixels (transformers 5.24
 * image_processing_llama4.py find_supported_resolutions :88-141 and get_best_fit :180-276, the
 * class defaults max_patches 16, resize_to_max_canvas false): every (rows, columns) of at most
 * max_patches tiles of tile x tile pixels, listed in that function's order; the smallest scale of
 * at least 1 that fits the image (else the largest below 1), the limiting side's
 * min(rows x tile / h, columns x tile / w) in float32 as torch computes it; of the canvases with
 * that scale, the first of least area. */
#define LLAMA4_MAX_PATCHES 16
static void llama4_canvas(uint64_t h, uint64_t w, uint64_t tile, uint64_t *rows, uint64_t *cols)
{
    enum { MAXC = 64 }; /* (rows, columns) pairs of at most 16 tiles: 50 */
    uint64_t kr[MAXC][LLAMA4_MAX_PATCHES], kc[MAXC][LLAMA4_MAX_PATCHES], cr[MAXC], cc[MAXC];
    double key[MAXC];
    size_t kn[MAXC] = {0}, nk = 0, n = 0;
    for (uint64_t chunk = LLAMA4_MAX_PATCHES; chunk >= 1; chunk--) /* asp_dict: ratio -> pairs, in order */
        for (uint64_t f = 1; f <= chunk; f++) {
            if (chunk % f)
                continue;
            double r = (double)f / (double)(chunk / f);
            size_t j = 0;
            while (j < nk && key[j] != r)
                j++;
            if (j == nk)
                key[nk++] = r;
            kr[j][kn[j]] = f;
            kc[j][kn[j]++] = chunk / f;
        }
    for (size_t j = 0; j < nk; j++)
        for (size_t i = 0; i < kn[j]; i++) {
            cr[n] = kr[j][i];
            cc[n++] = kc[j][i];
        }
    float sc[MAXC], best = 0;
    bool up = false, first = true;
    for (size_t i = 0; i < n; i++) {
        float sw = (float)(cc[i] * tile) / (float)w, sh = (float)(cr[i] * tile) / (float)h;
        sc[i] = sh > sw ? sw : sh;
        up = up || sc[i] >= 1.0f;
    }
    for (size_t i = 0; i < n; i++) /* the smallest scale >= 1, else the largest below 1 */
        if ((up && sc[i] >= 1.0f && (first || sc[i] < best)) || (!up && (first || sc[i] > best))) {
            best = sc[i];
            first = false;
        }
    uint64_t area = 0;
    for (size_t i = 0; i < n; i++)
        if (sc[i] == best && (!area || cr[i] * cc[i] < area)) {
            area = cr[i] * cc[i];
            *rows = cr[i];
            *cols = cc[i];
        }
}

/* Llama 4 (llama4/modeling_llama4.py Llama4ForConditionalGeneration.forward :1274-1285,
 * Llama4VisionModel.forward :1040-1138, processing_llama4.py _prompt_split_image :89-116;
 * docs/memory-facts.md#llama4-images): the image resized onto its canvas of tiles (llama4_canvas),
 * each tile of image_size x image_size pixels, a global tile of the whole image after them when
 * there is more than one; every tile through the patch embedding (unfold, a bias-free Linear), the
 * class embedding cat'ed last, the positions added, layernorm_pre; the encoder layers (LayerNorms,
 * q/k/v/o with biases, the complex 2-D rotary, non-causal SDPA, fc1 / GELU / fc2 with biases; each
 * a GradientCheckpointingLayer); layernorm_post, the class token dropped, pixel_shuffle, the
 * adapter (fc1, GELU, fc2, GELU; bias-free), the projector's linear_1; scattered into the image
 * tokens.  The processor writes <|image_start|>, per row of tiles each tile's patches with a
 * separator after each (x between, y at the row's end) when there are several, <|image|>, the
 * global (or only) tile's patches, <|image_end|>: (tiles > 1: 3 + (tiles + 1) x per + tiles, else
 * 3 + per) tokens in --seq, per = (image_size / patch_size x pixel_shuffle_ratio)^2 a tile. */
static enum mp_status llama4_blocks(struct mp_model *m, const struct mp_model_request *rq, struct mp_diag *d)
{
    struct mp_vision *v = &m->vision;
    if (v->proj_bad)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config: steps with images: %s", m->path, v->proj_bad);
    uint64_t h = rq->image_h ? rq->image_h : v->image, w = rq->image_w ? rq->image_w : v->image;
    llama4_canvas(h, w, v->image, &v->tile_rows, &v->tile_cols);
    uint64_t n = v->tile_rows * v->tile_cols, side = v->image / v->patch / v->merge, per = side * side, tok;
    v->tiles = n > 1 ? n + 1 : 1;
    if (!mp_mul_u64(per, v->tiles, &tok) || !mp_add_u64(tok, n > 1 ? n + 3 : 3, &v->tokens))
        return mp_fail(d, MP_ERR_RANGE, "%s: --image-size: too many tokens", m->path);
    size_t text0 = m->n_blocks, nv = (size_t)v->layers + 2;
    struct mp_layer *l = embeddings_block(m, 3, d);
    if (!l)
        return MP_ERR_NOMEM;
    snprintf(l->name, sizeof l->name, "linear"); /* patch_embedding.linear (peft's name) */
    l->conv.in_ch = v->channels;
    named(l + 1, MP_LT_LAYERNORM, v->hidden, "layernorm_pre")->norm.kind = MP_NORM_LAYERNORM;
    l[1].norm.bias = true;
    for (uint64_t i = 0; i < v->layers; i++) {
        if (!(l = layer_block(m, "vision.layers", i, d))) /* Llama4VisionEncoderLayer */
            return MP_ERR_NOMEM;
        l->attn.dropout = v->attn_p;
        l->attn.qkv_bias = l->attn.out_bias = true;
        l->attn.softmax_fp32 = false;
        l->norm.kind = MP_NORM_LAYERNORM;
        l->norm.bias = true;
        l->mlp.bias = true;
        l->rope.on = true;
        l->mla.rope_complex = true; /* vision_apply_rotary_emb: complex64 products, type_as */
    }
    struct mp_block *b = front_block(m, "vision.adapter", 7, d);
    if (!b)
        return MP_ERR_NOMEM;
    l = b->layers;
    uint64_t k2 = v->merge * v->merge;
    named(&l[0], MP_LT_LAYERNORM, v->hidden, "layernorm_post")->norm.kind = MP_NORM_LAYERNORM;
    l[0].norm.bias = true;
    named(&l[1], MP_LT_AVGPOOL2D, v->hidden, "pixel_shuffle")->vision = true;
    l[1].conv.kernel = l[1].conv.stride = v->merge;
    named(&l[2], MP_LT_LINEAR, 0, "fc1")->vision = true; /* vision_adapter.mlp */
    l[2].in_features = v->hidden * k2;                   /* (= intermediate_size: checked) */
    l[2].out_features = v->proj_in;
    named(&l[3], MP_LT_ACTIVATION, v->proj_in, "act1")->mlp.act = MP_ACT_GELU;
    named(&l[4], MP_LT_LINEAR, 0, "fc2")->vision = true;
    l[4].in_features = l[4].out_features = v->proj_out;
    named(&l[5], MP_LT_ACTIVATION, v->proj_out, "act2")->mlp.act = MP_ACT_GELU;
    named(&l[6], MP_LT_LINEAR, 0, "linear_1")->vision = true; /* multi_modal_projector */
    l[6].in_features = v->vision_out;
    l[6].out_features = v->text_hidden;
    l[6].conv.stride = 1; /* (its input, image_features, held to the forward's end) */
    v->height = m->height = v->tile_rows * v->image;
    v->width = m->width = v->tile_cols * v->image;
    v->asked_h = rq->image_h;
    v->asked_w = rq->image_w;
    return images_done(m, rq, text0, nv, d);
}

/* A tower layer of Llama 3.2 Vision (MllamaVisionEncoderLayer): LayerNorms, bias-free q/k/v/o, SDPA
 * under the tower's shared float mask, fc1 / GELU / fc2 with biases; a plain nn.Module (not a
 * GradientCheckpointingLayer: repeat group 0, never checkpointed); gated: the global layers. */
static enum mp_status mllama_layers(struct mp_model *m, const char *prefix, uint64_t n, bool gated, struct mp_diag *d)
{
    for (uint64_t i = 0; i < n; i++) {
        struct mp_layer *l = layer_block(m, prefix, i, d);
        if (!l)
            return MP_ERR_NOMEM;
        m->blocks[m->n_blocks - 1].repeat_group = 0;
        l->norm.kind = MP_NORM_LAYERNORM;
        l->norm.bias = true;
        l->mlp.bias = true;
        l->attn.block_mask = true; /* _prepare_aspect_ratio_attention_mask's, made once (lower_vision.c) */
        l->attn.tower_gate = gated;
    }
    return MP_OK;
}

/* The text model's blocks with Mllama's cross-attention layers put back where they were skipped
 * (a repeated block's num_skip, the model's num_skip_end: mllama_text_hook), each a copy of the
 * next text block's layer made a MllamaCrossAttentionDecoderLayer (GradientCheckpointingLayers:
 * repeat group 1, numbered as transformers' layers). */
static enum mp_status mllama_cross_blocks(struct mp_model *m, size_t text0, struct mp_diag *d)
{
    const struct mp_vision *v = &m->vision;
    size_t extra = m->num_skip_end, last = 0;
    for (size_t i = text0; i < m->n_blocks; i++)
        if (m->blocks[i].repeat_group > 0) {
            extra += m->blocks[i].num_skip;
            last = i;
        }
    if (!extra)
        return MP_OK;
    if (!last)
        return mp_fail(d, MP_ERR_MODEL, "%s: --images: no self-attention layer to model the cross-attention "
                       "layers on", m->path);
    size_t n = m->n_blocks + extra, k = 0;
    struct mp_block *nb = calloc(n, sizeof *nb);
    if (!nb)
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
    uint64_t num = 0; /* transformers' layer index */
    for (size_t i = 0; i < m->n_blocks; i++) {
        struct mp_block *b = &m->blocks[i];
        bool rep = i >= text0 && b->repeat_group > 0;
        uint64_t before = rep ? b->num_skip : i == last + 1 ? m->num_skip_end : 0;
        const struct mp_block *like = &m->blocks[rep ? i : last];
        for (uint64_t j = 0; j < before; j++) {
            struct mp_block *c = &nb[k++];
            *c = *like;
            c->layers = calloc(1, sizeof *c->layers);
            if (!c->layers) {
                for (size_t q = 0; q + 1 < k; q++)
                    if (nb[q].layers->attn.mllama_cross) /* (only the copies made here) */
                        free(nb[q].layers);
                free(nb);
                return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
            }
            c->n_layers = 1;
            c->layers[0] = like->layers[0];
            struct mp_layer *l = c->layers;
            l->attn.mllama_cross = true;
            l->attn.heads = v->x_heads;
            l->attn.kv_heads = v->x_kv_heads;
            l->attn.head_dim = v->x_head_dim;
            l->attn.causal = false;
            l->mlp.ffn = v->x_ffn;
            l->rope.on = false;
            snprintf(c->name, sizeof c->name, "h.%llu", (unsigned long long)num++);
            c->num_skip = 0;
            c->gc_before = j ? 0 : (rep && b->gc_before >= before ? b->gc_before - before : 0);
            c->period = 0;
        }
        nb[k] = *b;
        if (rep) {
            nb[k].gc_before = before ? 0 : b->gc_before;
            nb[k].num_skip = 0;
            num++;
        }
        k++;
    }
    free(m->blocks);
    m->blocks = nb;
    m->n_blocks = m->cap_blocks = n;
    m->num_skip_end = 0;
    return MP_OK;
}

/* Llama 3.2 Vision (mllama/modeling_mllama.py, transformers 5.24; docs/memory-facts.md#mllama-images):
 * every image runs max_num_tiles tiles of image_size^2 pixels (the processor pads to them), so
 * --image-size changes nothing and is refused.  The tower (the patch conv, the pre-tile, class,
 * position embeddings, layernorm_pre, the padding, the shared mask: lower_mllama_patches), the
 * local layers, layernorm_post and the post-tile embedding (lower_mllama_post), the gated global
 * layers, the stack and cat of the intermediate layers, the projector and the cross-attention
 * masks (lower_mllama_projector); then the text model with its cross-attention layers running.
 * One <|image|> token an image in --seq. */
static enum mp_status mllama_blocks(struct mp_model *m, const struct mp_model_request *rq, struct mp_diag *d)
{
    struct mp_vision *v = &m->vision;
    if (rq->image_h || rq->image_w)
        return mp_fail(d, MP_ERR_USAGE, "%s: --image-size: mllama runs every image as max_num_tiles tiles of "
                       "image_size pixels (the processor pads them), whatever its size: give --images alone",
                       m->path);
    if (v->proj_bad)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config: steps with images: %s", m->path, v->proj_bad);
    if (v->layers + v->global_layers > ((size_t)1 << 20))
        return mp_fail(d, MP_ERR_RANGE, "%s: vision_config.num_hidden_layers: too many layers", m->path);
    if (v->n_inter > v->layers)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.intermediate_layers_indices: more than the %llu layers",
                       m->path, (unsigned long long)v->layers);
    size_t text0 = m->n_blocks, nv = (size_t)(v->layers + v->global_layers) + 3;
    struct mp_block *b = front_block(m, "vision.embeddings", 1, d);
    if (!b)
        return MP_ERR_NOMEM;
    struct mp_layer *l = b->layers;
    l->type = MP_LT_PATCH_EMBEDDING;
    l->vision = true;
    l->conv.in_ch = v->channels;
    l->dim = v->hidden;
    l->conv.kernel = l->conv.stride = v->patch;
    snprintf(l->name, sizeof l->name, "patch_embedding");
    enum mp_status st = mllama_layers(m, "vision.transformer.layers", v->layers, false, d);
    if (st != MP_OK)
        return st;
    if (!(b = front_block(m, "vision.post", 1, d)))
        return MP_ERR_NOMEM;
    named(b->layers, MP_LT_LAYERNORM, v->hidden, "layernorm_post")->vision = true;
    b->layers->norm.kind = MP_NORM_LAYERNORM;
    b->layers->norm.bias = true;
    if ((st = mllama_layers(m, "vision.global_transformer.layers", v->global_layers, true, d)) != MP_OK)
        return st;
    if (!(b = front_block(m, "vision.projector", 1, d)))
        return MP_ERR_NOMEM;
    named(b->layers, MP_LT_LINEAR, 0, "multi_modal_projector")->vision = true;
    b->layers->in_features = v->vision_out;
    b->layers->out_features = v->text_hidden;
    b->layers->bias = true;
    if ((st = blocks_to_front(m, text0, nv, d)) != MP_OK) /* the tower to the front */
        return st;
    memset(&m->idle, 0, sizeof m->idle);
    if ((st = mllama_cross_blocks(m, nv, d)) != MP_OK)
        return st;
    v->height = v->width = v->image;
    m->images = rq->images;
    m->channels = v->channels;
    m->height = m->width = v->image;
    mp_model_mark_copies(m);
    return MP_OK;
}

enum mp_status mp_hf_add_images(struct mp_model *m, const struct mp_model_request *rq, struct mp_diag *d)
{
    const struct mp_vision *v = &m->vision;
    if (v->kind == MP_VIS_LLAMA4)
        return llama4_blocks(m, rq, d);
    if (v->kind == MP_VIS_MLLAMA)
        return mllama_blocks(m, rq, d);
    if (MP_VIS_IS_QWEN(v->kind))
        return qwen2_images(m, rq, d);
    bool qwen = !strcmp(m->hf_type, "qwen2_5_vl") || !strcmp(m->hf_type, "qwen2_vl");
    if (v->kind != MP_VIS_SIGLIP && v->kind != MP_VIS_PIXTRAL)
        return mp_fail(d, MP_ERR_MODEL, !m->idle.params ? "%s: --images: %s has no vision tower (a multimodal "
                                                          "checkpoint's config.json with a vision_config)"
                                        : qwen ? "%s: --images: %s's vision merger does not output the text "
                                                 "model's hidden size (masked_scatter would refuse it)"
                                               : "%s: --images: steps with images are modelled for gemma3, "
                                                 "mistral3, qwen2_vl and qwen2_5_vl only, not %s yet; text-only "
                                                 "steps are (no --images)",
                       m->path, m->hf_type[0] ? m->hf_type : "this model");
    if (v->hidden % v->heads)
        return mp_fail(d, MP_ERR_MODEL, "%s: vision_config.num_attention_heads: %llu does not divide hidden_size %llu",
                       m->path, (unsigned long long)v->heads, (unsigned long long)v->hidden);
    if (v->layers > ((size_t)1 << 20))
        return mp_fail(d, MP_ERR_RANGE, "%s: vision_config.num_hidden_layers: too many layers", m->path);
    size_t text0 = m->n_blocks, nv = (size_t)v->layers + 2;
    enum mp_status st = v->kind == MP_VIS_PIXTRAL ? pixtral_blocks(m, rq, d) : siglip_blocks(m, rq, d);
    if (st != MP_OK)
        return st;
    return images_done(m, rq, text0, nv, d);
}
