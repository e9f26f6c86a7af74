/* model.h — the validated, cJSON-free model description.
 *
 * A model is an ordered chain of blocks.  A block is the unit users can wrap
 * in torch.utils.checkpoint (a transformer block, a ResNet bottleneck, a
 * custom block, or a single op); it holds one or more layers (ops).  Readers
 * (model_json.c, model_hf.c) fill it; the ir (src/ir/) turns it into tensor tables.
 * All dimensions are uint64_t and have been range-checked by the reader.
 * Ownership: mp_model_release() frees everything a reader allocated.
 */
#ifndef MEMPLAN_MODEL_H
#define MEMPLAN_MODEL_H

#include "quant.h"
#include "util/util.h"

#define MP_LAYER_TYPES(X)                                            \
    X(EMBEDDING, "embedding")                                        \
    X(POS_EMBEDDING, "pos_embedding")                                \
    X(LINEAR, "linear")                                              \
    X(LAYERNORM, "layernorm")                                        \
    X(RMSNORM, "rmsnorm")                                            \
    X(ATTENTION, "attention")                                        \
    X(MLP, "mlp")                                                    \
    X(ACTIVATION, "activation")                                      \
    X(DROPOUT, "dropout")                                            \
    X(RESIDUAL, "residual")                                          \
    X(CONV2D, "conv2d")                                              \
    X(BATCHNORM2D, "batchnorm2d")                                    \
    X(MAXPOOL2D, "maxpool2d")                                        \
    X(AVGPOOL2D, "avgpool2d")                                        \
    X(ADAPTIVE_AVGPOOL2D, "adaptive_avgpool2d")                      \
    X(FLATTEN, "flatten")                                            \
    X(LM_HEAD, "lm_head")                                            \
    X(CLASSIFIER, "classifier")                                      \
    X(CUSTOM, "custom")                                              \
    X(TRANSFORMER_BLOCK, "transformer_block")                        \
    X(BOTTLENECK, "bottleneck")                                      \
    X(PATCH_EMBEDDING, "patch_embedding")

enum mp_layer_type {
#define MP_X(id, str) MP_LT_##id,
    MP_LAYER_TYPES(MP_X)
#undef MP_X
        MP_LT_COUNT
};
const char *mp_layer_type_str(enum mp_layer_type t);
/* Returns -1 when s names no layer type. */
int mp_layer_type_parse(const char *s);

const char *mp_act_str(enum mp_act a);
int mp_act_parse(const char *s); /* -1 if unknown; accepts the HF aliases (gelu_pytorch_tanh, swish) */
const char *mp_act_names(void);  /* every name, "a, b or c", in the table's order */
bool mp_act_saves_output(enum mp_act a);
/* The space-separated names of the HF intermediates it keeps ("" for none). */
const char *mp_act_intermediates(enum mp_act a);
/* How many intermediates it keeps (words of mp_act_intermediates). */
int mp_act_n_intermediates(enum mp_act a);
/* Whether `what` ("in", "out" or an intermediate's name) is fp32 under CUDA autocast with a
 * half input (the amp32 column). */
bool mp_act_fp32_under_amp(enum mp_act a, const char *what);
/* The bwd column: x-sized tensors its backward holds beyond a fused kernel's two gradients. */
int mp_act_bwd_tensors(enum mp_act a);
/* The fwd column: x-sized forward transients beside the output. */
int mp_act_fwd_tensors(enum mp_act a);

const char *mp_attn_impl_str(enum mp_attn_impl a);
int mp_attn_impl_parse(const char *s); /* -1 if unknown */
const char *mp_attn_impl_names(const char *sep, const char *last); /* (util.h mp_join) */

enum mp_norm { MP_NORM_LAYERNORM, MP_NORM_RMSNORM };

enum mp_qk_norm {
    MP_QK_NORM_NONE,
    MP_QK_NORM_HEAD, /* over each head's head_dim (Qwen3, Gemma3) */
    MP_QK_NORM_ALL,  /* over the whole projection, heads * head_dim (OLMo2) */
    MP_QK_NORM_L2,   /* over each head, no weight, on an fp32 copy cast back (Llama 4's L2Norm) */
};

/* How a mixture-of-experts router turns its logits (Linear(h, E)) into the top-k weights
 * (transformers 5.23's *TopKRouter / *TopkRouter). */
enum mp_router {
    MP_ROUTER_SOFTMAX,      /* softmax(logits.float()): fp32 weights (Mixtral) */
    MP_ROUTER_SOFTMAX_CAST, /* softmax(logits, dtype=float), weights cast back to the logits' dtype (Qwen-MoE) */
    MP_ROUTER_FP32_SOFTMAX, /* Linear on fp32 copies of x and W, softmax, * routed_scaling_factor (DeepSeek-V2) */
    MP_ROUTER_FP32_SIGMOID, /* Linear on fp32 copies, sigmoid, group-limited top-k, gather (DeepSeek-V3) */
    MP_ROUTER_TOPK_SOFTMAX, /* top-k of logits.float(), softmax over the k, cast to x's dtype (GraniteMoE) */
    MP_ROUTER_SPARSEMIXER,  /* PhiMoE's sparsemixer: two rounds of masked_fill, Gumbel sampling, softmax,
                               gather and its custom multiplier: top 2 whatever num_experts_per_tok */
    MP_ROUTER_DENSE_SIGMOID, /* Llama 4: the top-k logits scattered into a -inf (M, E) tensor, sigmoid in
                               fp32 cast back; every expert runs every token (x repeated E times, scaled
                               by its (M, E) score, two bmm), the E outputs summed */
};

/* How a fused qkv projection is split (HF attention classes). */
enum mp_qkv_split {
    MP_QKV_VIEWS,      /* q, k, v are views of the fused output (GPT-2, NeoX, Phi-3) */
    MP_QKV_COPY_MQ,    /* Falcon multi-query: q a reshape copy; k and v index copies ([-2], [-1]:
                          kv_heads wide, their int64 indices saved) */
    MP_QKV_COPY_ALL,   /* Falcon without multi-query: q, k, v reshape copies of strided views */
    MP_QKV_COPY_EXPAND,/* Falcon new decoder architecture: q, k, v copies with k and v broadcast
                          to every query head (attention sees as many kv heads as heads) */
};

/* Which positions a token model's head reads (HF task heads; memplan JSON uses NONE). */
enum mp_head_pool {
    MP_POOL_NONE,  /* every position, one label each */
    MP_POOL_FIRST, /* linear: the first position only (BERT's pooler), a view of the input */
    MP_POOL_LAST,  /* classifier: the logits of each sample's last position (decoder sequence
                      classification gathers them after the score layer), one label per sample */
    MP_POOL_SPAN,  /* classifier with 2 classes: start and end logits over positions (question
                      answering), two labels per sample */
};

/* A layer's settings, grouped by the part of a block they describe.  Each group is read by both
 * readers through one key table (model_keys.c: JSON key, field, type, default, doc), which also
 * makes docs/model-format.md's key tables.  Only the groups of a layer's type are meaningful; the
 * rest stay zero. */

/* attention (attention, and inside transformer_block) */
struct mp_attn {
    uint64_t heads, kv_heads, head_dim;
    uint64_t window;        /* sliding-window attention over this many positions (0: full): from a
                               sequence of that length on, transformers gives SDPA a mask */
    unsigned eager_mask;    /* eager attention gets this many (b, 1, s, s) float masks from the
                               model, made once per forward (HF decoders: create_causal_mask; 2
                               with sliding-window layer types too, Gemma2/3) */
    enum mp_attn_impl impl;
    enum mp_qk_norm qk_norm; /* RMSNorm of q and k after their projections (Qwen3, Gemma3, OLMo2) */
    enum mp_qkv_split qkv_split; /* how a fused qkv output becomes q, k, v (Falcon's copies) */
    double dropout;         /* dropout on attention probabilities */
    double softcap;         /* tanh softcapping of the attention scores (Gemma2; eager only) */
    bool causal;
    bool qkv_bias, out_bias;
    bool fused_qkv;         /* one [h, (a+2kv)d] projection (GPT-2, NeoX) vs three (Llama) */
    bool impl_set;          /* impl came from the file (else the --attention default applies) */
    bool qk_norm_late;      /* the q/k norms come after the rotary, not before (HunYuan) */
    bool clip_qkv;          /* q, k and v clamped in place after their projections (OLMo's clip_qkv) */
    bool softmax_fp32;      /* eager attention: softmax(..., dtype=float32).to(dtype), most HF decoders;
                               false: a plain softmax (GPT-2, BERT), fp32 only under autocast */
    bool mask;              /* the model builds a (b, 1, s, s) mask and passes it to attention (Falcon):
                               SDPA saves it (under autocast each layer's half copy); eager adds it */
    bool qk_fp32;           /* eager: q and k upcast to fp32 before QK^T (GPT-J's _attn) */
    bool no_out_dropout;    /* the residual dropout p is on the MLP branch only (StableLM, DistilBERT) */
    bool temp_tuning;       /* q times an fp32 per-position scale, cast back to q's dtype (Llama 4's
                               attn_temperature_tuning on its NoPE layers) */
    bool tower_gate;        /* --images, Mllama's global tower layers: the attention and MLP outputs times
                               gate.tanh() (the product saves its tensor operand when the gate trains) */
    bool mllama_cross;      /* --images, Mllama's MllamaCrossAttentionDecoderLayer (lower_vision.c) */
    bool block_mask;        /* --images, Pixtral's tower: a float (1, 1, s, s) block-diagonal mask over the
                               images in the model's dtype, made once per forward
                               (generate_block_attention_mask): SDPA saves it (under autocast each layer's
                               half copy), eager adds it */
};

/* multi-head latent attention (DeepSeek-V2/V3; kv_lora > 0): q through a rank-q_lora bottleneck
 * (0: one q_proj), k/v from a rank-kv_lora latent, rotary on rope_dim of each head; q/k heads
 * are nope_dim + rope_dim wide, v heads v_dim (attn.head_dim is unused) */
struct mp_mla {
    uint64_t q_lora, kv_lora, rope_dim, nope_dim, v_dim;
    bool rope_complex;      /* the rotary as an fp32 complex multiply (view_as_complex of an fp32 copy, cast
                               back): DeepSeek-V2 (else V3's interleaved halves), Llama 4 (no kv_lora) */
};

/* rotary embedding of q and k */
struct mp_rope {
    uint64_t dim;           /* partial rotary (NeoX, phi); 0 = head_dim */
    uint64_t table_rows;    /* GPT-J rotary: each attention layer's own sinusoid buffer (rows x
                               dim fp32); every rope call gathers cos/sin from it and saves its
                               own (s x dim) pair (rotate_every_two) */
    unsigned kinds;         /* rotary tables the model makes (one per distinct layer type: Gemma3, OLMo3;
                               0 counts as 1) */
    bool on;                /* rotary embedding: q and k are rewritten (new storages) */
    bool interleave;        /* interleaved rotary (GLM, Helium, ERNIE 4.5: cos/sin repeat_interleave'd and
                               rotate_half of even/odd pairs): each layer makes and saves its own cos/sin
                               pair (1, s, dim); the model's table is saved by no layer */
    bool per_sample;        /* M-RoPE (Qwen2-VL, Qwen2.5-VL): position ids (3, b, s) make the model's cos/sin
                               (b, s, dim), one row per sample */
    bool fp32;              /* the model's cos/sin stay fp32 (no cast to the residual dtype) (OLMo2/3,
                               ERNIE 4.5) */
    bool cast_back;         /* the rotated q/k (fp32 products) are cast back to q's dtype (OLMo2/3,
                               ERNIE 4.5, Cohere) */
    bool cat;               /* q/k rebuilt with torch.cat even at full rotary (the partial-rotary code of
                               NeoX, phi, Phi-3, StableLM): the attention output is then copied */
};

/* the norms of a transformer_block (kind, bias and the variants also on layernorm / rmsnorm
 * layers) and where they sit */
struct mp_norm_cfg {
    enum mp_norm kind;
    bool bias;              /* layernorm has a bias (false for OLMo-style / rmsnorm) */
    bool rms_fp32;          /* RMSNorm applies its weight in fp32 and casts back (Gemma, OLMo2) */
    bool ln_fp32;           /* layernorm is Cohere's Python composite in fp32 (no bias) */
    bool ln_plain;          /* layernorm is OLMo's: no weight, no bias, run in fp32 (x.to(fp32),
                               F.layer_norm, .to(x's dtype)) */
    bool ln_1p;             /* layernorm is Nemotron's LayerNorm1P: weight + 1 (a new tensor), under
                               autocast run in the half dtype */
    bool shared;            /* parallel residual with one norm for both branches (GPT-J, phi) */
    bool post;              /* BERT: x = ln(x + attn(x)); x = ln(x + mlp(x)) */
    bool branch;            /* each branch's output is normed before its residual add (Gemma2/3, OLMo2) */
    bool no_pre;            /* with branch: no norm before the branches (OLMo2) */
};

/* the feed-forward (mlp, and inside transformer_block) */
struct mp_mlp {
    uint64_t ffn;
    enum mp_act act;
    bool gated;             /* SwiGLU/GeGLU: act(gate) * up */
    bool up_down;           /* not gated, its Linears named up_proj / down_proj (Arcee), not fc1 / fc2 */
    bool bias;
    bool fused_gate_up;     /* gated MLP with one gate_up projection, chunked (Phi-3) */
};

/* mixture of experts (transformer_block with experts > 0): the MLP is a router, experts (all
 * experts' weights in two 3-D parameters, run by transformers' grouped_mm) and an optional
 * shared expert; mlp.ffn stays the dense MLP's width (unused here) */
struct mp_moe {
    uint64_t experts, top_k;  /* routed experts, experts per token */
    uint64_t expert_ffn;      /* one expert's intermediate width */
    uint64_t shared_ffn;      /* the shared expert's intermediate width (0: none) */
    enum mp_router router;
    bool shared_gate;         /* sigmoid(Linear(h, 1)) * shared expert (Qwen2-MoE) */
    bool shared_first;        /* the shared expert runs before the router (Qwen2-MoE) */
    bool norm_topk;           /* the top-k weights are renormalized (in place: a / sum) */
    bool route_mask;          /* group-limited routing that keeps a (tokens, E) bool mask (DeepSeek-V2) */
    bool input_jitter;        /* PhiMoE's input_jitter_noise > 0: the block and then the router multiply
                                 the input in place by a uniform noise tensor (saved, x-sized) */
};

/* lm_head / classifier / a token model's linear head */
struct mp_head_cfg {
    enum mp_head_pool pool; /* linear / classifier on tokens: which positions it reads */
    double softcap;         /* lm_head: tanh softcapping of the logits (Gemma2) */
    double in_mult;         /* lm_head: multiplies its input first (T5's d_model**-0.5 rescale; 0: none) */
    bool tied;              /* lm_head shares the embedding weight (no params of its own) */
    bool masked;            /* lm_head: masked-LM labels, used as they are (causal LMs shift theirs) */
};

/* embedding / patch_embedding: HF registered buffers (resident like the batch): id_buffer, the int64
 * (1, id_rows) position_ids / token_type_ids of BertEmbeddings (id_view: the forward uses a view
 * of it, no new ids); scale_buffer, Gemma's fp32 scalar embed_scale */
struct mp_embed {
    uint64_t id_rows;
    double dropout;         /* transformer models: dropout after the embeddings (in the embedding block) */
    bool id_buffer, id_view, scale_buffer;
    /* dec_input, the decoder's embedding of an encoder-decoder model: it looks up the decoder ids
     * (the labels shifted right, made in this block) and its incoming hidden state is the encoder
     * output, held for every cross-attention; tied: it shares the first embedding's table (T5's
     * shared) */
    bool dec_input;
    /* patch_embedding (ViT): a conv2d of in_ch -> dim with kernel = stride = patch (conv.kernel),
     * the patches flattened into a sequence, a learned class token prepended (cls_token), learned
     * positions added: the sequence is (H / patch) * (W / patch) + 1 */
    bool cls_token;
    /* --images: the text embedding's lookup (embed_tokens(input_ids), its scale) made first, in the
     * vision tower's first block, as Gemma3Model.forward makes it before get_image_features (its
     * backward then runs after the tower's: autograd's order); the text model's first layer
     * (vision) scatters the image features into it */
    bool image_lookup;
};

/* conv2d / pooling / batchnorm / bottleneck / patch_embedding */
struct mp_conv {
    uint64_t in_ch, out_ch, mid_ch;
    uint64_t kernel, stride, padding, groups;
    uint64_t out_h, out_w;  /* adaptive pooling target */
    bool downsample;        /* bottleneck has a 1x1 projection shortcut */
};

/* custom (per sample) */
struct mp_custom {
    uint64_t output_bytes, saved_bytes, params;
    uint64_t fwd_flops, bwd_flops;
};

/* T5 (a transformer_block laid out as transformers' T5Block): T5LayerNorm before each sub-layer
 * (RMS, fp32 variance, no bias), attention without 1/sqrt(d) scaling whose scores get a relative
 * position bias, the feed-forward cast to wo's dtype; cross_attn: a decoder block (causal
 * self-attention, then attention over the encoder output); rel_buckets > 0: this block (layer 0
 * of its stack) computes the bias from its relative_attention_bias table (rel_buckets x heads) */
struct mp_t5 {
    uint64_t rel_buckets;
    bool on, cross_attn;
    bool bias_per_layer;    /* UMT5: every self-attention computes its own bias and every
                               cross-attention its own zeros (locals of the layer, not handed on) */
};

/* One op (or one composite block) as described by the user. */
struct mp_layer {
    enum mp_layer_type type;
    char name[64];
    /* a layer of a multimodal checkpoint's vision side, stepped with images (--images,
     * model_hf_vision.c mp_hf_add_images): transformer_block, its Linears named as SigLIP's
     * (peft targets; Qwen2.5-VL's window blocks: conv.kernel, the patches of a window's side);
     * avgpool2d, Gemma 3's projector pooling of (b, patches, dim) tokens; linear, the
     * projector's bare weight (not an nn.Linear: no LoRA), its output cast back to its input's dtype
     * (type_as); embedding, the text embedding with the image features scattered in (masked_scatter) */
    bool vision;

    uint64_t vocab;         /* embedding / pos_embedding / lm_head: rows of the table; classifier: classes */
    uint64_t dim;           /* hidden size: embedding width, norm width, block hidden */
    uint64_t in_features, out_features; /* linear */
    bool bias;              /* linear, conv2d, lm_head, classifier */
    double p;               /* dropout probability; for transformer_block: residual dropout */
    bool inplace;           /* activation: ReLU(inplace=True) overwrites its input (saves nothing new) */
    bool parallel_residual; /* transformer_block: x + attn(ln1(x)) + mlp(ln2(x)) (NeoX, GPT-J, phi) */
    double mult;            /* a Python-float multiplier that makes a new tensor (0: none): embedding
                               output (Gemma's sqrt(h), Granite), each residual branch of a
                               transformer_block (Granite), lm_head logits (Granite 1/logits_scaling) */

    struct mp_attn attn;
    struct mp_mla mla;
    struct mp_rope rope;
    struct mp_norm_cfg norm;
    struct mp_mlp mlp;
    struct mp_moe moe;
    struct mp_head_cfg head;
    struct mp_embed emb;
    struct mp_conv conv;
    struct mp_custom custom;
    struct mp_t5 t5;
};

struct mp_block {
    char name[64];
    size_t n_layers;
    struct mp_layer *layers;
    /* Blocks expanded from one "repeat" share a group id (>0); the table folds them. */
    int repeat_group;
    /* period p > 0: its layers equal block i - p's, in a run of blocks that repeat with period p
     * (each the block p before it: 1 for copies in a row, 2 for alternating layers, 6 for
     * Gemma-3's five sliding and one global); 0: none (mp_model_mark_copies) */
    unsigned period;
    /* transformers' GradientCheckpointingLayer modules just before this block, in module order,
     * that have no block of their own (a multimodal checkpoint's vision-tower layers, Mllama's
     * skipped cross-attention layers): every_n_layers counts them (--checkpoint layers:N) */
    uint64_t gc_before;
    /* a repeated block: layers of the model's own numbering just before it that have no block
     * (Mllama's cross-attention layers, skipped without images): --train-blocks numbers the
     * repeated blocks as transformers numbers its layers (h.N = language_model.layers.N) */
    uint64_t num_skip;
};

enum mp_input_kind { MP_INPUT_TOKENS, MP_INPUT_IMAGE, MP_INPUT_BYTES };

/* Modules a multimodal checkpoint loads that a text-only step never runs (the vision tower and the
 * multimodal projector of Gemma 3, Qwen2-VL, Qwen2.5-VL, Mistral 3, Llama 3.2 Vision; Llama 3.2
 * Vision's cross-attention decoder layers too, which MllamaTextModel skips without image states):
 * their parameters are on the GPU
 * in the model's dtype, with no gradient (unused), no optimizer state and no activations.  Their
 * Linears are listed by peft's module name, for the LoRA targets that name them (ir/). */
struct mp_idle_linear {
    const char *name;          /* the module's last name component (a string literal) */
    uint64_t in, out, count;   /* Linear(in, out) count times */
};
/* The vision towers modelled with images (mp_vision.kind). */
enum mp_vision_kind {
    MP_VIS_NONE = 0,   /* none modelled */
    MP_VIS_SIGLIP,     /* SigLIP + Gemma 3's projector */
    MP_VIS_PIXTRAL,    /* Pixtral + Mistral3MultiModalProjector */
    MP_VIS_QWEN2,      /* Qwen2-VL's tower (images of any size, --image-size) */
    MP_VIS_QWEN2_5,    /* Qwen2.5-VL's (RMSNorms, gated MLP, window attention: its gathers) */
    MP_VIS_LLAMA4,     /* Llama 4's vision model (tiles of image_size, pixel shuffle) + projector */
    MP_VIS_MLLAMA,     /* Llama 3.2 Vision's tiled vision model + projector, read by gated cross-attention */
};
#define MP_VIS_IS_QWEN(k) ((k) == MP_VIS_QWEN2 || (k) == MP_VIS_QWEN2_5)
/* Qwen2VLImageProcessor's size defaults, the pixel bounds of its smart_resize (transformers 5.24
 * image_processing_qwen2_vl.py:96: shortest_edge 56 x 56, longest_edge 28 x 28 x 1280) */
#define MP_QWEN_MIN_PIXELS (56ull * 56ull)
#define MP_QWEN_MAX_PIXELS (28ull * 28ull * 1280ull)
/* A multimodal checkpoint's vision tower as an image step runs it (read from vision_config with
 * its config class's defaults, MP_VIS_NONE for the families not modelled with images): width, MLP
 * width, layers, heads, channels, image side (vision_config.image_size) and patch, the activation,
 * attention dropout; the projector's tokens per image (SigLIP: mm_tokens_per_image; the others:
 * set by mp_hf_add_images from the image size, the text positions each image takes), its width
 * into the text model; the image token's id (the config's image_token_id: the text positions the
 * features fill).  Pixtral (+ Mistral 3's projector) also: spatial_merge_size, the projector's
 * activation and bias, and whether vision_feature_layer selects the last layer's output. */
struct mp_vision {
    int kind;                  /* enum mp_vision_kind */
    uint64_t hidden, ffn, layers, heads, channels, image, patch;
    enum mp_act act;
    double attn_p;
    uint64_t tokens, text_hidden, token_id;
    uint64_t merge;            /* Pixtral, Qwen: spatial_merge_size (the patch merger's side) */
    enum mp_act proj_act;      /* Pixtral: projector_hidden_act */
    bool proj_bias;            /* Pixtral: multimodal_projector_bias */
    bool feature_last;         /* Pixtral: vision_feature_layer is the last layer's output (-1) */
    /* Pixtral, Qwen: the image's height and width in pixels as the step runs it (mp_hf_add_images:
     * Pixtral --image-size as asked, Qwen after Qwen2VLImageProcessor's smart_resize) and the size
     * asked (0 x 0: the default; Pixtral image_size square, Qwen 448 x 448).  Qwen also:
     * temporal_patch_size (the Conv3d's depth); tokens is then (h/p)(w/p)/merge^2. */
    uint64_t temporal, height, width, asked_h, asked_w;
    uint64_t window;           /* Qwen2.5-VL: window_size in pixels; the blocks fullatt_block_indexes
                                  names attend over whole images (fullatt, n_fullatt), the others
                                  window by window (their layer's conv.kernel: patches per side) */
#define MP_VISION_FULLATT_MAX 64
    uint64_t fullatt[MP_VISION_FULLATT_MAX];
    size_t n_fullatt;
    /* Llama 4: tiles an image runs as (the processor's canvas rows x columns, plus its global tile
     * when there is more than one), the canvas, the adapter's widths (projector_input_dim,
     * projector_output_dim) and the projector's input (vision_output_dim); merge is 1 /
     * pixel_shuffle_ratio; proj_bad names a config the image step cannot run ("" when it can) */
    uint64_t tiles, tile_rows, tile_cols, proj_in, proj_out, vision_out;
    const char *proj_bad;
    /* Mllama: num_global_layers, the intermediate layers stacked into vision_output_dim, the text
     * model's cross-attention layers (heads, key/value heads, head_dim, MLP width); tiles is
     * max_num_tiles (every image runs them all) */
    uint64_t global_layers, n_inter, x_heads, x_kv_heads, x_head_dim, x_ffn;
};
#define MP_IDLE_LINEARS_MAX 16
struct mp_idle {
    uint64_t params;           /* every parameter element of the idle modules (0: none) */
    size_t n_linears;
    struct mp_idle_linear linears[MP_IDLE_LINEARS_MAX];
    char what[64];             /* "vision_tower + multi_modal_projector" */
    uint64_t gc_layers;        /* of them, GradientCheckpointingLayer modules ahead of the language
                                  model's layers in module order (the vision tower's layers) */
};

struct mp_model {
    char name[128];
    char source[8];          /* "memplan" or "hf" */
    char path[256];          /* file it came from, for messages */
    char hf_type[32];        /* model_type of an HF config, else "" */
    char hf_class[96];       /* an HF config's architectures[0] (after --head), else "" */
    const char *no_flash;    /* its transformers class has no flash-attention path (_supports_flash_attn
                                false): why, a static string; NULL: it has one */
    struct mp_quant quant;   /* quantization_config of an HF checkpoint (kind MP_Q_NONE: none) */
    char ckpt_dtype[16];     /* an HF config's torch_dtype (or dtype): the checkpoint's storage ("" unknown) */
    bool kv_cache;           /* an HF decoder that can fill a DynamicCache (else use_cache is moot) */
    bool use_cache;          /* its config's use_cache (default true), or --use-cache: in training
                                without gradient checkpointing, k and v are copied into the cache and
                                attention reads those copies */

    enum mp_input_kind input;
    uint64_t seq_len;        /* tokens: default sequence length (file, or HF: min(max positions, 2048)) */
    uint64_t max_positions;  /* HF decoders and encoders: the config's max position embeddings (0: not
                                given, or a memplan model, whose position tables check --seq) */
    bool enc_dec;            /* encoder-decoder (T5): seq_len is the encoder's, the decoder's is
                                --target-seq (default seq_len) */
    bool keep_fp32_wo;       /* T5: transformers keeps wo in fp32 and unquantized (_keep_in_fp32_modules):
                                a quantized base (QLoRA, quantization_config) is refused */
    bool dec_from_input;     /* the decoder reads the input ids shifted (T5ForQuestionAnswering): its
                                length is the encoder's (--target-seq does not apply) */
    uint64_t channels, height, width; /* image input */
    uint64_t num_skip_end;   /* layers of that numbering after the last repeated block (mp_block.num_skip) */
    uint64_t bytes_per_sample;         /* opaque input */
    uint64_t labels_vocab;   /* for classification of images: classes (informational) */
    struct mp_idle idle;     /* a multimodal checkpoint's vision modules, unused by a text-only step */
    struct mp_vision vision; /* its vision tower, for steps with images */
    uint64_t images;         /* --images: images per sample (0: text only); the blocks start with the
                                vision tower (mp_hf_add_images) and the program's inputs are
                                pixel_values (batch x images, C, H, W), input_ids, token_type_ids and
                                labels */

    size_t n_blocks, cap_blocks; /* cap_blocks: private (geometric growth) */
    struct mp_block *blocks;
    uint64_t pos_table_elems; /* GPT-J: the elements of every attention layer's own sinusoid table
                                 (mp_model_mark_copies; 0: none, or too many to count), which the
                                 builder's one resident tensor holds from the first layer on (a
                                 fold's short model keeps the full model's count) */

    /* Parameters that are shared (tied embeddings) are counted once. */
};

void mp_model_init(struct mp_model *m);
/* Whether block b is a block of the vision tower run with images (its first layer's vision flag,
 * on a transformer_block or patch_embedding; the projector's block too). */
bool mp_block_vision(const struct mp_block *b);
void mp_model_release(struct mp_model *m);

/* The longest period mp_model_mark_copies looks for. */
#define MP_PERIOD_MAX 64

/* Sets each block's period (the loaders call it): from the first block on, the run that goes on
 * longest from there with some period p <= MP_PERIOD_MAX (each block equal to the one p before
 * it) marks its blocks p, the smallest p among the longest; a block no run starts at is 0.  And
 * pos_table_elems, over every block. */
void mp_model_mark_copies(struct mp_model *m);

/* Appends a block with n_layers zeroed layers; returns it (NULL on overflow/alloc failure). */
struct mp_block *mp_model_add_block(struct mp_model *m, const char *name, size_t n_layers);

/* Reads a model file: memplan JSON or HF config.json, auto-detected, validated, copies marked
 * (mp_model_mark_copies); not yet checked as a program: callers use mp_model_load_*() (ir).
 * On error returns MP_ERR_IO/JSON/MODEL/RANGE with d->msg = "path: place: problem" and the
 * model released. */
enum mp_status mp_model_read_file(struct mp_model *m, const char *path, struct mp_diag *d);
enum mp_status mp_model_read_string(struct mp_model *m, const char *text, size_t len, const char *path,
                                    struct mp_diag *d);

/* What the user asks of an HF config beyond its file (--head, --num-labels): head -1 and
 * num_labels 0 ask nothing.  head replaces architectures[0]'s task head with the family's class
 * of that head; num_labels replaces num_labels and id2label (a classification head's classes).
 * A request on a memplan model, or a head transformers does not have for the family, is
 * MP_ERR_MODEL naming the option. */
struct mp_model_request {
    int head;            /* enum mp_head, or -1 */
    uint64_t num_labels; /* 0: the config's */
    uint64_t images;     /* images per sample (--images; 0: text only): a multimodal checkpoint's
                            vision tower runs (mp_hf_add_images), else MP_ERR_MODEL */
    uint64_t image_h, image_w; /* --image-size HxW in pixels (0: the model's default) */
};
enum mp_status mp_model_read_file_as(struct mp_model *m, const char *path, const struct mp_model_request *rq,
                                     struct mp_diag *d);
const char *mp_head_str(enum mp_head h);
int mp_head_parse(const char *s);                             /* -1 if unknown */
const char *mp_head_names(const char *sep, const char *last); /* (util.h mp_join) */

/* metadata.total_size of a model.safetensors.index.json (the bytes of every tensor a sharded
 * checkpoint stores). */
enum mp_status mp_checkpoint_index_total(const char *path, uint64_t *total, struct mp_diag *d);

/* True when some layer computes attention (so --attention and the attention default apply). */
bool mp_model_has_attention(const struct mp_model *m);
/* The smallest sliding window of any layer's attention, 0 when none has one. */
uint64_t mp_model_min_window(const struct mp_model *m);
/* The implementation every attention layer names (its "impl", or the HF family's kernel: Gemma-2
 * runs eager), or -1 when some layer names none, they differ, or no layer has attention. */
int mp_model_attention_impl(const struct mp_model *m);

/* The Hugging Face model_type values the config.json reader accepts, comma-separated. */
const char *mp_hf_model_types(void);

/* An HF family's module names, from its row of model_hf.c's families[]: peft's default LoRA
 * targets (peft utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING; NULL: none
 * that works) and the modules named unlike memplan's roles (NULL: the role's name). */
struct mp_hf_names {
    const char *peft;
    const char *qkv, *o, *fc1, *fc2, *q, *k, *v;
};
/* NULL when hf_type is no supported family. */
const struct mp_hf_names *mp_hf_family_names(const char *hf_type);

/* Checks the cross-field rules every reader must satisfy (heads divide hidden, ...).
 * Readers call it last. */
enum mp_status mp_model_validate(const struct mp_model *m, struct mp_diag *d);

#endif
