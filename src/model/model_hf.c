/* model_hf.c — reads a Hugging Face config.json into struct mp_model.
 *
 * Each supported model_type is one row of families[] (below): the keys its transformers
 * config class reads, the class defaults, the switches of its layout, the task heads it
 * has, and an optional hook; a llama-like family is one row.  The task head is the class
 * architectures[0] names (*ForCausalLM, *ForMaskedLM, *ForSequenceClassification,
 * *ForTokenClassification, *ForQuestionAnswering, bare *Model; the row's default without
 * architectures).  Missing optional fields take the defaults of the transformers config
 * class, so parameter counts equal what transformers instantiates.  Fields that would change
 * memory in a way the model cannot express are rejected, never silently dropped.  cJSON
 * stays here.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_read.h"

/* Lowering convention (the lowering in src/ir/ relies on it):
 *   block 0 "embed":  EMBEDDING (vocab, hidden)                   [mult: Gemma sqrt(h), Granite]
 *                     [EMBEDDING "token_type_embeddings" (type_vocab_size, hidden)]   bert,
 *                      roberta: its input is the hidden state, not token ids; it adds a lookup
 *                      of the all-zero token_type_ids (BertEmbeddings' buffer)
 *                     [POS_EMBEDDING (positions + offset, hidden)] gpt2, bert-likes, opt
 *                     [LAYERNORM (hidden)]                        bert-likes
 *                     [DROPOUT p]                                 when the embedding dropout p > 0
 *   blocks 1..N "h.i": one TRANSFORMER_BLOCK each, repeat_group 1
 *   last block "head": [final LAYERNORM / RMSNORM]               pre-norm families
 *                      then the task head (add_head): the MLM transform + LM_HEAD, LM_HEAD,
 *                      a pooler LINEAR (first position) + ACTIVATION, DROPOUT, CLASSIFIER
 *                      (pooled: first / last position / QA span)
 *
 * Default sequence: seq_len = min(max positions, 2048).  The position count is
 * what the model can take; 2048 keeps the default run of long-context models
 * (Mistral 32768, Qwen2 131072) at a length people fine-tune with; --seq
 * overrides it.  A rope model without max_position_embeddings gets 2048 (every
 * transformers default for these classes is at least 2048); gpt2 and bert
 * tables default to 1024 and 512 rows, as in GPT2Config and BertConfig.
 *
 * Ignored on purpose, because they do not change training memory:
 *   rope_theta, rotary_emb_base, rope_scaling, rope_parameters (except its
 *     partial_rotary_factor for gpt_neox/phi): values of cos/sin, same shapes;
 *   *_eps, initializer_range, bos/eos/pad_token_id, scale_attn_weights,
 *     scale_attn_by_inverse_layer_idx, pretraining_tp: values or scalars only;
 *   torch_dtype, dtype: the checkpoint's storage; --precision decides training dtypes (kept as
 *     ckpt_dtype for the CLI's check of model.safetensors.index.json);
 *   gradient_checkpointing: memplan plans checkpointing itself;
 *   summary_*, task_specific_params, n_special, predict_special_tokens: GPT2DoubleHeadsModel
 *     fields (that class is refused);
 *   head_dim for gpt2, gpt_neox and bert, attention_bias for mistral and qwen2,
 *     num_key_value_heads for gpt2, gpt_neox and bert: their transformers classes ignore them;
 *   n_ctx (gpt2): legacy; transformers sizes wpe by n_positions alone;
 *   _attn_implementation: the --attention option chooses the kernel.
 * Honoured: use_cache (decoders; default true): in training without gradient checkpointing
 *   transformers copies k and v into a DynamicCache and attention reads the copies (ir/lower_attention.c);
 *   --use-cache overrides it.
 * Rejected when set to a non-default value: add_cross_attention,
 * reorder_and_upcast_attn (gpt2), qk_layernorm (phi), position_embedding_type
 * other than "absolute" (bert).
 */

#define HF_SEQ_DEFAULT 2048u
#define HF_LAYERS_MAX MP_REPEAT_MAX

/* Task heads, from architectures[0] (transformers' class names). */
enum head { H_CAUSAL, H_MASKED, H_SEQ, H_TOKEN, H_QA, H_BARE, H_IMAGE, H_COUNT };
static const struct {
    const char *suffix;
    enum head h;
} head_classes[] = {
    {"ForCausalLM", H_CAUSAL},
    {"LMHeadModel", H_CAUSAL},
    {"ForMaskedLM", H_MASKED},
    {"ForSequenceClassification", H_SEQ},
    {"ForTokenClassification", H_TOKEN},
    {"ForQuestionAnswering", H_QA},
    {"ForImageClassification", H_IMAGE},
    {"Model", H_BARE}, /* <Prefix>Model only: no "For", no "...Head(s)Model" */
};
#define HEAD(h) (1u << (h))
#define DECODER_HEADS (HEAD(H_CAUSAL) | HEAD(H_SEQ) | HEAD(H_TOKEN) | HEAD(H_QA) | HEAD(H_BARE))

struct hf;
typedef enum mp_status (*hf_hook)(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);

/* One row per model_type: the keys its transformers config class reads, the class
 * defaults, and the module layout of its *ForCausalLM (or *ForMaskedLM).  A key field
 * left NULL is the usual name (hidden_size, num_hidden_layers, num_attention_heads,
 * max_position_embeddings, intermediate_size, hidden_act); a NULL flag key means the
 * class does not read that flag.  hook handles what no column expresses. */
/* Which layers use sliding-window attention, as transformers 5.23 lays them out: every layer
 * (W_ALL: the model picks its mask function from sliding_window alone, layer_types unread:
 * Mistral, Mixtral, Phi-3, Starcoder2, Qwen3-MoE), the sliding layer types (W_TYPES:
 * layer_sliding(), Gemma2/3, OLMo3, EXAONE 4), and, without layer_types, layers from
 * max_window_layers on (W_FROM_MAX: Qwen2, Qwen3), even layers below it (W_ODD_BELOW_MAX:
 * Qwen2-MoE), the NoPE layers (W_NOPE: SmolLM3); the layer types, and without layer_types every
 * layer (W_TYPES_OR_ALL: Ministral). */
enum win { W_NONE, W_ALL, W_TYPES, W_FROM_MAX, W_ODD_BELOW_MAX, W_NOPE, W_TYPES_OR_ALL };

struct family {
    const char *type;
    struct mp_hf_names names;   /* peft's default targets and the modules named unlike memplan's roles */
    const char *k_hidden[2], *k_layers[2], *k_heads[2], *k_pos[2]; /* first present wins */
    const char *k_ffn;
    uint64_t ffn_mult;          /* nonzero: k_ffn optional, null or absent means ffn_mult * hidden */
    const char *k_act;
    enum mp_act act;
    enum mp_norm norm;
    bool gqa;                   /* reads num_key_value_heads and head_dim */
    uint64_t kv_default;        /* key absent: this many kv heads (0: as many as heads) */
    uint64_t head_dim_default;  /* 0: hidden / heads */
    uint64_t pos_rows;          /* learned position table rows by default; 0: rotary positions */
    uint64_t type_vocab;        /* token-type table rows by default (0: no token types) */
    const char *k_rotary;       /* legacy partial-rotary key; NULL: rotary over the whole head */
    double rotary_default;
    bool gated, fused_qkv, qkv_bias, out_bias, mlp_bias, lm_bias, tied, encoder;
    bool parallel, shared_norm, post_norm, emb_norm, mlm_transform;
    bool ignores_head_dim;      /* reads num_key_value_heads but not head_dim (StableLM) */
    uint64_t pos_offset;        /* learned position rows beyond max positions (OPT: 2) */
    enum mp_qk_norm qk_norm;
    bool qk_norm_late;          /* the q/k norms after the rotary (HunYuan) */
    bool fused_gate_up;
    bool no_attn_out_dropout;   /* the residual dropout is on the MLP branch only */
    bool eager;                 /* transformers has no SDPA path for it (Gemma2: softcapping) */
    bool plain_softmax;         /* eager attention calls softmax without dtype=float32 (GPT-2, BERT) */
    const char *k_attn_softcap, *k_logit_softcap;
    double attn_softcap, logit_softcap;
    bool emb_sqrt;              /* embeddings * sqrt(hidden) (Gemma*): a new tensor */
    const char *k_emb_mult, *k_resid_mult, *k_logits_div; /* Granite's multipliers (default 1.0; applied
                                   even at 1.0: each is a new tensor) */
    const char *k_attn_bias, *k_mlp_bias, *k_parallel;
    const char *k_out_bias;     /* o_proj's own bias flag (Seed-OSS attention_out_bias): k_attn_bias
                                   then sets the q/k/v biases only */
    const char *k_qkv_bias;     /* q/k/v biases only (StableLM use_qkv_bias) */
    const char *k_bias;         /* every linear's bias (Starcoder2 use_bias, OPT enable_bias) */
    const char *k_lm_bias;      /* lm_head's bias (PhiMoE lm_head_bias) */
    double dropout;             /* default of the embedding and residual dropouts below */
    double attn_dropout;        /* default of the attention dropout */
    const char *k_emb_p, *k_attn_p, *k_resid_p; /* NULL: no such dropout */
    bool emb_p_is_resid;        /* the embedding dropout uses the residual probability */
    struct {
        const char *key, *why;
    } reject[2];                /* flags whose true value memplan does not model */
    const char *n_tok, *n_pos, *n_drop, *n_norm, *n_head; /* module names */
    unsigned heads;             /* HEAD() bits of the task heads transformers has */
    enum head default_head;     /* without architectures */
    const char *k_cls_p;        /* token / sequence classifier dropout when classifier_dropout is
                                   null or absent (NULL: 0.1); transformers' fallbacks differ */
    bool generic_heads;         /* Generic*For*: token_classification_bias is read */
    enum mp_act pooler_act;     /* encoders: the pooler / sequence-classifier activation */
    const char *n_pooler;       /* its dense layer ("pooler.dense") */
    bool bare_pooler;           /* the bare *Model has the pooler (BertModel, RobertaModel) */
    bool mlm_gelu;              /* the MLM transform uses exact gelu whatever hidden_act (RoBERTa) */
    bool id_buffers;            /* BertEmbeddings-style int64 position_ids (and token_type_ids) buffers */
    bool id_views;              /* the forward uses views of them (BERT, DistilBERT; RoBERTa computes ids) */
    bool enc_dec;               /* an encoder-decoder (T5): its own reader and layout (t5_model) */
    bool vision;                /* images in (ViT): a patch embedding instead of token embeddings, no
                                   vocabulary; image_size, patch_size, num_channels in the hook */
    uint64_t swa_every;         /* without layer_types: every swa_every-th layer is full attention, the
                                   others sliding (Gemma2 2, Gemma3 6, OLMo3 4, EXAONE 4 4); 0: all full */
    const char *k_swa_every;    /* the key that overrides it (sliding_window_pattern) */
    struct mp_rope rope;        /* every rotary layer's variant (interleave: GLM, Helium, ERNIE 4.5;
                                   fp32: OLMo2/3, ERNIE 4.5; cast_back: OLMo2/3, ERNIE 4.5, Cohere) */
    struct mp_norm_cfg norm_cfg; /* every norm's variant (ln_fp32: Cohere; ln_plain: OLMo; ln_1p:
                                   Nemotron; rms_fp32: Gemma, OLMo2) and the blocks' placement
                                   (branch: Gemma2/3, OLMo2; no_pre: OLMo2) */
    bool up_down;               /* a non-gated MLP named up_proj / down_proj (Arcee) */
    const char *k_logit_scale;  /* logits * logit_scale (Cohere; default logit_scale below) */
    double logit_scale;
    bool rope_per_type;         /* one rotary table (and inv_freq pair) per distinct layer type (Gemma3,
                                   OLMo3: position_embeddings[layer_type]) */
    enum win window;            /* which layers use sliding-window attention (W_NONE: none) */
    uint64_t window_default;    /* sliding_window absent (0: null, no window) */
    bool k_use_window;          /* use_sliding_window (default false) gates the window (Qwen, SmolLM3) */
    uint64_t emb_extra_rows;    /* embedding rows beyond vocab_size (MllamaTextModel: vocab_size + 8) */
    bool mm_text;               /* a multimodal checkpoint's text model only (multimodal[]): not a
                                   model_type memplan reads on its own */
    const char *no_flash;       /* its transformers class has no flash-attention path
                                   (_supports_flash_attn false): why (mp_model.no_flash) */
    hf_hook hook;               /* runs last: may override anything read before */
};

static enum mp_status gemma_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status bert_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status opt_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status distilbert_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status gptj_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status falcon_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status vit_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status moe_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status smollm3_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status exaone4_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status helium_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status ministral_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status olmo_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status olmoe_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status mllama_text_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);
static enum mp_status llama4_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);

#define NO_CROSS {"add_cross_attention", "cross-attention layers are not modelled"}
#define LLAMA_LIKE(a) .act = a, .norm = MP_NORM_RMSNORM, .gated = true, .gqa = true, \
                   .k_attn_p = "attention_dropout", .n_tok = "embed_tokens", .n_norm = "norm", .n_head = "lm_head", \
                   .k_cls_p = "hidden_dropout", .generic_heads = true

static const struct family families[] = {
    {.type = "gpt2",
     .names = {.peft = "c_attn", .qkv = "c_attn", .o = "c_proj", .fc1 = "c_fc", .fc2 = "c_proj"},
     .plain_softmax = true, .k_hidden = {"n_embd", "hidden_size"}, .k_layers = {"n_layer", "num_hidden_layers"},
     .k_heads = {"n_head", "num_attention_heads"}, .k_pos = {"n_positions", "max_position_embeddings"},
     .k_ffn = "n_inner", .ffn_mult = 4, .k_act = "activation_function", .act = MP_ACT_GELU_NEW,
     .norm = MP_NORM_LAYERNORM, .pos_rows = 1024, .fused_qkv = true, .qkv_bias = true, .out_bias = true,
     .mlp_bias = true, .tied = true, .dropout = 0.1, .attn_dropout = 0.1, .k_emb_p = "embd_pdrop", .k_attn_p = "attn_pdrop",
     .k_resid_p = "resid_pdrop",
     .reject = {NO_CROSS, {"reorder_and_upcast_attn", "the fp32 reordered attention is not modelled"}},
     .n_tok = "wte", .n_pos = "wpe", .n_norm = "ln_f", .n_head = "lm_head", .heads = DECODER_HEADS,
     .k_cls_p = "hidden_dropout"},
    {.type = "llama",
     .names = {.peft = "q_proj,v_proj"},
     LLAMA_LIKE(MP_ACT_SILU), .k_attn_bias = "attention_bias", .k_mlp_bias = "mlp_bias",
     .heads = DECODER_HEADS},
    {.type = "mistral",
     .names = {.peft = "q_proj,v_proj"},
     LLAMA_LIKE(MP_ACT_SILU), .kv_default = 8, .heads = DECODER_HEADS, .window = W_ALL,
     .window_default = 4096},
    {.type = "qwen2",
     .names = {.peft = "q_proj,v_proj"},
     LLAMA_LIKE(MP_ACT_SILU), .kv_default = 32, .qkv_bias = true, .heads = DECODER_HEADS,
     .window = W_FROM_MAX, .window_default = 4096, .k_use_window = true},
    {.type = "gpt_neox",
     .names = {.peft = "query_key_value", .qkv = "query_key_value", .o = "dense", .fc1 = "dense_h_to_4h", .fc2 = "dense_4h_to_h"},
     .act = MP_ACT_GELU, .norm = MP_NORM_LAYERNORM, .k_rotary = "rotary_pct",
     .rotary_default = 0.25, .fused_qkv = true, .qkv_bias = true, .out_bias = true, .mlp_bias = true,
     .parallel = true, .k_attn_bias = "attention_bias", .k_parallel = "use_parallel_residual",
     .k_attn_p = "attention_dropout", .k_resid_p = "hidden_dropout", .emb_p_is_resid = true, .n_tok = "embed_in",
     .n_norm = "final_layer_norm", .n_head = "embed_out", .heads = DECODER_HEADS},
    {.type = "phi",
     .names = {.peft = "q_proj,v_proj,fc1,fc2", .o = "dense"},
     .act = MP_ACT_GELU_NEW, .norm = MP_NORM_LAYERNORM, .gqa = true,
     .k_rotary = "partial_rotary_factor", .rotary_default = 0.5, .qkv_bias = true, .out_bias = true,
     .mlp_bias = true, .lm_bias = true, .parallel = true, .shared_norm = true, .k_emb_p = "embd_pdrop",
     .k_attn_p = "attention_dropout", .k_resid_p = "resid_pdrop",
     .reject = {{"qk_layernorm", "per-head q/k layernorms are not modelled"}}, .n_tok = "embed_tokens",
     .n_norm = "final_layernorm", .n_head = "lm_head", .heads = DECODER_HEADS & ~HEAD(H_QA),
     .k_cls_p = "hidden_dropout", .generic_heads = true},
    {.type = "gemma",
     .names = {.peft = "q_proj,v_proj"},
     LLAMA_LIKE(MP_ACT_GELU_TANH), .kv_default = 16, .head_dim_default = 256, .emb_sqrt = true,
     .tied = true, .k_attn_bias = "attention_bias", .norm_cfg.rms_fp32 = true, .heads = DECODER_HEADS & ~HEAD(H_QA),
     .hook = gemma_hook},
    {.type = "bert",
     .names = {.peft = "query,value", .o = "dense", .fc1 = "dense", .fc2 = "dense", .q = "query", .k = "key", .v = "value"},
     .plain_softmax = true, .act = MP_ACT_GELU, .norm = MP_NORM_LAYERNORM, .pos_rows = 512, .type_vocab = 2,
     .qkv_bias = true, .out_bias = true, .mlp_bias = true, .lm_bias = true, .tied = true, .encoder = true,
     .post_norm = true, .emb_norm = true, .mlm_transform = true, .dropout = 0.1, .attn_dropout = 0.1,
     .k_attn_p = "attention_probs_dropout_prob", .k_resid_p = "hidden_dropout_prob", .emb_p_is_resid = true,
     .reject = {NO_CROSS}, .n_tok = "word_embeddings", .n_pos = "position_embeddings", .n_drop = "dropout",
     .n_head = "decoder", .default_head = H_MASKED,
     .heads = HEAD(H_MASKED) | HEAD(H_SEQ) | HEAD(H_TOKEN) | HEAD(H_QA) | HEAD(H_BARE),
     .k_cls_p = "hidden_dropout_prob", .pooler_act = MP_ACT_TANH, .n_pooler = "pooler.dense", .bare_pooler = true,
     .id_buffers = true, .id_views = true, .hook = bert_hook},
    /* ---- added with the family table ---- */
    {.type = "qwen3",
     .names = {.peft = "q_proj,v_proj"},
     LLAMA_LIKE(MP_ACT_SILU), .kv_default = 32, .head_dim_default = 128,
     .k_attn_bias = "attention_bias", .qk_norm = MP_QK_NORM_HEAD, .heads = DECODER_HEADS, .window = W_FROM_MAX,
     .window_default = 4096, .k_use_window = true},
    {.type = "phi3", LLAMA_LIKE(MP_ACT_SILU), .fused_qkv = true, .fused_gate_up = true,
     .k_rotary = "partial_rotary_factor", .rotary_default = 1.0, .k_emb_p = "embd_pdrop", .k_resid_p = "resid_pdrop",
     .heads = DECODER_HEADS & ~HEAD(H_QA), .window = W_ALL},
    {.type = "olmo2", LLAMA_LIKE(MP_ACT_SILU), .k_attn_bias = "attention_bias", .qk_norm = MP_QK_NORM_ALL,
     .norm_cfg.rms_fp32 = true, .rope.fp32 = true, .rope.cast_back = true, .norm_cfg.branch = true,
     .norm_cfg.no_pre = true,
     .heads = HEAD(H_CAUSAL) | HEAD(H_SEQ) | HEAD(H_BARE)},
    {.type = "stablelm",
     .names = {.peft = "q_proj,v_proj"},
     .act = MP_ACT_SILU, .norm = MP_NORM_LAYERNORM, .gqa = true, .ignores_head_dim = true,
     .kv_default = 32, .k_rotary = "partial_rotary_factor", .rotary_default = 0.25, .gated = true,
     .shared_norm = true, .k_qkv_bias = "use_qkv_bias", .k_parallel = "use_parallel_residual",
     .no_attn_out_dropout = true, .k_attn_p = "attention_dropout", .k_resid_p = "hidden_dropout",
     .reject = {{"qk_layernorm", "per-head q/k layernorms are not modelled"}}, .n_tok = "embed_tokens",
     .n_norm = "norm", .n_head = "lm_head", .heads = DECODER_HEADS & ~HEAD(H_QA), .k_cls_p = "hidden_dropout",
     .generic_heads = true},
    {.type = "starcoder2",
     .names = {.fc1 = "c_fc", .fc2 = "c_proj"},
     .act = MP_ACT_GELU_TANH, .norm = MP_NORM_LAYERNORM, .gqa = true, .kv_default = 2,
     .qkv_bias = true, .out_bias = true, .mlp_bias = true, .k_bias = "use_bias", .tied = true,
     .k_emb_p = "embedding_dropout", .k_attn_p = "attention_dropout", .k_resid_p = "residual_dropout",
     .n_tok = "embed_tokens", .n_norm = "norm", .n_head = "lm_head", .heads = DECODER_HEADS & ~HEAD(H_QA),
     .k_cls_p = "hidden_dropout", .generic_heads = true, .window = W_ALL},
    {.type = "gemma2",
     .names = {.peft = "q_proj,v_proj"},
     LLAMA_LIKE(MP_ACT_GELU_TANH), .k_act = "hidden_activation", .kv_default = 4, .emb_sqrt = true,
     .head_dim_default = 256, .tied = true, .k_attn_bias = "attention_bias", .norm_cfg.rms_fp32 = true,
     .norm_cfg.branch = true, .eager = true, .k_attn_softcap = "attn_logit_softcapping", .attn_softcap = 50.0,
     .k_logit_softcap = "final_logit_softcapping", .logit_softcap = 30.0, .heads = DECODER_HEADS & ~HEAD(H_QA),
     .swa_every = 2, .window = W_TYPES, .window_default = 4096},
    {.type = "gemma3_text",
     .names = {.peft = "q_proj,v_proj"},
     LLAMA_LIKE(MP_ACT_GELU_TANH), .k_act = "hidden_activation", .kv_default = 4, .emb_sqrt = true,
     .head_dim_default = 256, .tied = true, .k_attn_bias = "attention_bias", .qk_norm = MP_QK_NORM_HEAD,
     .norm_cfg.rms_fp32 = true, .norm_cfg.branch = true, .k_attn_softcap = "attn_logit_softcapping",
     .k_logit_softcap = "final_logit_softcapping", .heads = HEAD(H_CAUSAL) | HEAD(H_SEQ) | HEAD(H_BARE),
     .swa_every = 6, .k_swa_every = "sliding_window_pattern", .rope_per_type = true, .window = W_TYPES,
     .window_default = 4096, .hook = gemma_hook},
    {.type = "granite", LLAMA_LIKE(MP_ACT_SILU), .k_attn_bias = "attention_bias", .k_mlp_bias = "mlp_bias",
     .k_emb_mult = "embedding_multiplier", .k_resid_mult = "residual_multiplier", .k_logits_div = "logits_scaling",
     .heads = HEAD(H_CAUSAL) | HEAD(H_BARE)},
    {.type = "opt",
     .names = {.peft = "q_proj,v_proj", .o = "out_proj", .fc1 = "fc1", .fc2 = "fc2"},
     .k_ffn = "ffn_dim", .k_act = "activation_function", .act = MP_ACT_RELU,
     .norm = MP_NORM_LAYERNORM, .pos_rows = 2048, .pos_offset = 2, .qkv_bias = true, .out_bias = true,
     .mlp_bias = true, .k_bias = "enable_bias", .tied = true, .dropout = 0.1, .k_attn_p = "attention_dropout",
     .k_resid_p = "dropout", .n_tok = "embed_tokens", .n_pos = "embed_positions", .n_norm = "final_layer_norm",
     .n_head = "lm_head", .heads = HEAD(H_CAUSAL) | HEAD(H_SEQ) | HEAD(H_QA) | HEAD(H_BARE), .hook = opt_hook},
    {.type = "roberta",
     .names = {.peft = "query,value", .o = "dense", .fc1 = "dense", .fc2 = "dense", .q = "query", .k = "key", .v = "value"},
     .plain_softmax = true, .act = MP_ACT_GELU, .norm = MP_NORM_LAYERNORM, .pos_rows = 512, .type_vocab = 2,
     .qkv_bias = true, .out_bias = true, .mlp_bias = true, .lm_bias = true, .tied = true, .encoder = true,
     .post_norm = true, .emb_norm = true, .mlm_transform = true, .mlm_gelu = true, .dropout = 0.1,
     .attn_dropout = 0.1, .k_attn_p = "attention_probs_dropout_prob", .k_resid_p = "hidden_dropout_prob",
     .emb_p_is_resid = true, .reject = {NO_CROSS}, .n_tok = "word_embeddings", .n_pos = "position_embeddings",
     .n_drop = "dropout", .n_head = "decoder", .default_head = H_MASKED,
     .heads = HEAD(H_MASKED) | HEAD(H_SEQ) | HEAD(H_TOKEN) | HEAD(H_QA) | HEAD(H_BARE),
     .k_cls_p = "hidden_dropout_prob", .pooler_act = MP_ACT_TANH, .n_pooler = "classifier.dense",
     .bare_pooler = true, .id_buffers = true, .hook = bert_hook},
    {.type = "distilbert",
     .names = {.o = "out_lin", .fc1 = "lin1", .fc2 = "lin2", .q = "q_lin", .k = "k_lin", .v = "v_lin"},
     .plain_softmax = true, .k_hidden = {"dim"}, .k_layers = {"n_layers"}, .k_heads = {"n_heads"},
     .k_ffn = "hidden_dim", .k_act = "activation", .act = MP_ACT_GELU, .norm = MP_NORM_LAYERNORM,
     .pos_rows = 512, .qkv_bias = true, .out_bias = true, .mlp_bias = true, .lm_bias = true, .tied = true,
     .encoder = true, .post_norm = true, .emb_norm = true, .mlm_transform = true, .no_attn_out_dropout = true,
     .dropout = 0.1, .attn_dropout = 0.1, .k_attn_p = "attention_dropout", .k_resid_p = "dropout",
     .emb_p_is_resid = true, .n_tok = "word_embeddings", .n_pos = "position_embeddings", .n_drop = "dropout",
     .n_head = "vocab_projector", .default_head = H_MASKED,
     .heads = HEAD(H_MASKED) | HEAD(H_SEQ) | HEAD(H_TOKEN) | HEAD(H_QA) | HEAD(H_BARE),
     .pooler_act = MP_ACT_RELU, .n_pooler = "pre_classifier", .id_buffers = true, .id_views = true,
     .hook = distilbert_hook},
    /* GPT-J: eager attention only (its own _attn: fp32 q/k, rotate_every_two rotary from a
     * per-layer table); rotary_dim in the hook */
    {.type = "gptj",
     .names = {.peft = "q_proj,v_proj", .o = "out_proj", .fc1 = "fc_in", .fc2 = "fc_out"},
     .k_hidden = {"n_embd", "hidden_size"}, .k_layers = {"n_layer", "num_hidden_layers"},
     .k_heads = {"n_head", "num_attention_heads"}, .k_pos = {"n_positions", "max_position_embeddings"},
     .k_ffn = "n_inner", .ffn_mult = 4, .k_act = "activation_function", .act = MP_ACT_GELU_NEW,
     .norm = MP_NORM_LAYERNORM, .mlp_bias = true, .lm_bias = true, .parallel = true, .shared_norm = true,
     .eager = true, .k_emb_p = "embd_pdrop", .k_attn_p = "attn_pdrop", .k_resid_p = "resid_pdrop",
     .n_tok = "wte", .n_norm = "ln_f", .n_head = "lm_head",
     .heads = HEAD(H_CAUSAL) | HEAD(H_SEQ) | HEAD(H_QA) | HEAD(H_BARE), .hook = gptj_hook},
    /* Falcon: the layouts (multi-query 7B, new decoder architecture 40B/180B) in the hook */
    {.type = "falcon",
     .names = {.peft = "query_key_value", .qkv = "query_key_value", .o = "dense", .fc1 = "dense_h_to_4h", .fc2 = "dense_4h_to_h"},
     .plain_softmax = true, .k_hidden = {"n_embed", "hidden_size"}, .k_ffn = "ffn_hidden_size",
     .ffn_mult = 4, .k_act = "activation", .act = MP_ACT_GELU, .norm = MP_NORM_LAYERNORM, .fused_qkv = true,
     .k_bias = "bias", .tied = true, .parallel = true, .shared_norm = true, .no_attn_out_dropout = true,
     .k_resid_p = "hidden_dropout", .n_tok = "word_embeddings", .n_norm = "ln_f", .n_head = "lm_head",
     .heads = DECODER_HEADS, .hook = falcon_hook},
    /* ViT: pre-norm encoder over patches + a class token */
    {.type = "vit", .vision = true, .act = MP_ACT_GELU, .norm = MP_NORM_LAYERNORM, .qkv_bias = true,
     .out_bias = true, .mlp_bias = true, .encoder = true, .k_qkv_bias = "qkv_bias",
     .k_attn_p = "attention_probs_dropout_prob", .k_resid_p = "hidden_dropout_prob", .emb_p_is_resid = true,
     .n_drop = "dropout", .n_norm = "layernorm", .n_head = "classifier", .default_head = H_IMAGE,
     .heads = HEAD(H_IMAGE) | HEAD(H_BARE), .pooler_act = MP_ACT_TANH, .n_pooler = "pooler.dense",
     .bare_pooler = true, .hook = vit_hook},
    /* T5: encoder-decoder; every key, the layout and the heads in t5_model */
    {.type = "t5",
     .names = {.peft = "q,v"}, /* T5's Linears carry their HF names */
     .enc_dec = true},
    {.type = "mt5",
     .names = {.peft = "q,v"},
     .enc_dec = true},
    {.type = "umt5", .enc_dec = true}, /* every layer its own relative position bias */
    /* ---- mixture of experts (moe_hook; the MoE and MLA keys are read there) ---- */
    {.type = "mixtral",
     .names = {.peft = NULL /* peft 0.21 + transformers 5: no default works */},
     LLAMA_LIKE(MP_ACT_SILU), .kv_default = 8, .heads = DECODER_HEADS, .window = W_ALL,
     .hook = moe_hook},
    {.type = "qwen2_moe", LLAMA_LIKE(MP_ACT_SILU), .kv_default = 16, .qkv_bias = true, .k_qkv_bias = "qkv_bias",
     .heads = DECODER_HEADS, .window = W_ODD_BELOW_MAX, .window_default = 4096, .k_use_window = true,
     .hook = moe_hook},
    {.type = "qwen3_moe", LLAMA_LIKE(MP_ACT_SILU), .kv_default = 4, .k_attn_bias = "attention_bias",
     .qk_norm = MP_QK_NORM_HEAD, .heads = DECODER_HEADS, .window = W_ALL, .window_default = 4096,
     .k_use_window = true, .hook = moe_hook},
    {.type = "deepseek_v2", LLAMA_LIKE(MP_ACT_SILU), .k_attn_bias = "attention_bias", .k_mlp_bias = "mlp_bias",
     .heads = HEAD(H_CAUSAL) | HEAD(H_SEQ) | HEAD(H_BARE), .hook = moe_hook},
    {.type = "deepseek_v3", LLAMA_LIKE(MP_ACT_SILU), .k_attn_bias = "attention_bias",
     .heads = HEAD(H_CAUSAL) | HEAD(H_SEQ) | HEAD(H_TOKEN) | HEAD(H_BARE), .hook = moe_hook},
    /* OLMoE: llama attention with q/k RMSNorms over the whole projections, clip_qkv; 64 experts
     * of intermediate_size, top 8, Qwen-MoE's router (moe_hook) */
    {.type = "olmoe", LLAMA_LIKE(MP_ACT_SILU), .k_attn_bias = "attention_bias", .qk_norm = MP_QK_NORM_ALL,
     .heads = HEAD(H_CAUSAL) | HEAD(H_BARE), .hook = olmoe_hook},
    /* GraniteMoE: Granite's multipliers, Mixtral's experts (intermediate_size wide), the router's
     * softmax over the top-k logits (moe_hook) */
    {.type = "granitemoe", LLAMA_LIKE(MP_ACT_SILU), .k_attn_bias = "attention_bias",
     .k_emb_mult = "embedding_multiplier", .k_resid_mult = "residual_multiplier", .k_logits_div = "logits_scaling",
     .heads = HEAD(H_CAUSAL) | HEAD(H_BARE), .hook = moe_hook},
    /* PhiMoE (phimoe/modeling_phimoe.py, PhimoeConfig): Mixtral's layout with LayerNorms (with bias)
     * for the RMSNorms, attention_bias on q/k/v/o, lm_head_bias, and the sparsemixer router
     * (moe_hook) */
    {.type = "phimoe", .act = MP_ACT_SILU, .norm = MP_NORM_LAYERNORM, .gated = true, .gqa = true, .kv_default = 8,
     .k_attn_bias = "attention_bias", .k_lm_bias = "lm_head_bias", .k_attn_p = "attention_dropout",
     .n_tok = "embed_tokens", .n_norm = "norm", .n_head = "lm_head", .heads = HEAD(H_CAUSAL) | HEAD(H_SEQ) | HEAD(H_BARE),
     .generic_heads = true, .window = W_ALL, .hook = moe_hook},
    /* ---- llama variants of 2025 ---- */
    {.type = "seed_oss", LLAMA_LIKE(MP_ACT_SILU), .kv_default = 8, .head_dim_default = 128, .qkv_bias = true,
     .k_attn_bias = "attention_bias", .k_out_bias = "attention_out_bias", .k_mlp_bias = "mlp_bias",
     .dropout = 0.1, .attn_dropout = 0.1, .k_resid_p = "residual_dropout", .heads = DECODER_HEADS},
    /* SmolLM3: no rotary on every no_rope_layer_interval-th layer (NoPE), in the hook */
    {.type = "smollm3", LLAMA_LIKE(MP_ACT_SILU), .kv_default = 4, .tied = true, .k_attn_bias = "attention_bias",
     .k_mlp_bias = "mlp_bias", .heads = DECODER_HEADS, .window = W_NOPE, .k_use_window = true,
     .hook = smollm3_hook},
    /* OLMo3: OLMo2 with sliding-window layers (3 of 4) and a rotary table per layer type */
    {.type = "olmo3", LLAMA_LIKE(MP_ACT_SILU), .k_attn_bias = "attention_bias", .qk_norm = MP_QK_NORM_ALL,
     .norm_cfg.rms_fp32 = true, .rope.fp32 = true, .rope.cast_back = true, .norm_cfg.branch = true,
     .norm_cfg.no_pre = true,
     .swa_every = 4, .rope_per_type = true,
     .heads = HEAD(H_CAUSAL) | HEAD(H_SEQ) | HEAD(H_BARE), .window = W_TYPES, .window_default = 4096},
    /* EXAONE 4: OLMo2's post-norm layer with plain RMSNorms, per-head q/k norms; with a sliding
     * window, rotary on the sliding layers only (the full ones are NoPE), in the hook */
    {.type = "exaone4", LLAMA_LIKE(MP_ACT_SILU), .kv_default = 32, .qk_norm = MP_QK_NORM_HEAD, .norm_cfg.branch = true,
     .norm_cfg.no_pre = true, .swa_every = 4, .k_swa_every = "sliding_window_pattern", .heads = DECODER_HEADS,
     .window = W_TYPES, .window_default = 4096, .hook = exaone4_hook},
    /* ---- interleaved rotary (each layer saves its own repeat_interleave'd cos/sin) ---- */
    /* GLM-4 (glm): partial interleaved rotary, q/k/v biases, Phi-3's fused gate_up MLP */
    {.type = "glm", LLAMA_LIKE(MP_ACT_SILU), .kv_default = 2, .head_dim_default = 128, .qkv_bias = true,
     .k_qkv_bias = "attention_bias", .fused_gate_up = true, .k_rotary = "partial_rotary_factor",
     .rotary_default = 0.5, .rope.interleave = true, .heads = DECODER_HEADS & ~HEAD(H_QA)},
    /* GLM-4-0414 (glm4): glm with sandwich norms (post_self_attn / post_mlp) */
    {.type = "glm4", LLAMA_LIKE(MP_ACT_SILU), .kv_default = 2, .head_dim_default = 128, .qkv_bias = true,
     .k_qkv_bias = "attention_bias", .fused_gate_up = true, .k_rotary = "partial_rotary_factor",
     .rotary_default = 0.5, .rope.interleave = true, .norm_cfg.branch = true, .heads = DECODER_HEADS & ~HEAD(H_QA)},
    /* Helium: fp32-weight RMSNorm, o_proj hidden x hidden without bias (checked in the hook) */
    {.type = "helium", LLAMA_LIKE(MP_ACT_SILU), .kv_default = 20, .head_dim_default = 128, .k_qkv_bias = "attention_bias",
     .k_mlp_bias = "mlp_bias", .norm_cfg.rms_fp32 = true, .rope.interleave = true, .heads = DECODER_HEADS & ~HEAD(H_QA),
     .hook = helium_hook},
    /* ERNIE 4.5 (dense): fp32 interleaved rotary, use_bias on every Linear, no attention dropout */
    {.type = "ernie4_5", .act = MP_ACT_SILU, .norm = MP_NORM_RMSNORM, .gated = true, .gqa = true, .kv_default = 2,
     .head_dim_default = 128, .tied = true, .k_bias = "use_bias", .rope.interleave = true, .rope.fp32 = true,
     .rope.cast_back = true, .n_tok = "embed_tokens", .n_norm = "norm", .n_head = "lm_head",
     .heads = HEAD(H_CAUSAL) | HEAD(H_BARE)},
    /* Cohere (Command-R, Aya): fp32 composite LayerNorm without bias shared by parallel attention and
     * MLP, q/k rotated in fp32 (the rotary table interleaved by the model), logits * logit_scale */
    {.type = "cohere", .act = MP_ACT_SILU, .norm = MP_NORM_LAYERNORM, .gated = true, .gqa = true, .tied = true,
     .k_attn_bias = "attention_bias", .parallel = true, .shared_norm = true, .norm_cfg.ln_fp32 = true,
     .rope.cast_back = true,
     .k_logit_scale = "logit_scale", .logit_scale = 0.0625, .k_attn_p = "attention_dropout",
     .reject = {{"use_qk_norm", "Cohere's per-head q/k LayerNorms are not modelled"}}, .n_tok = "embed_tokens",
     .n_norm = "norm", .n_head = "lm_head", .heads = HEAD(H_CAUSAL) | HEAD(H_BARE)},
    /* Arcee (AFM): llama with a non-gated relu2 MLP (NemotronMLP: up_proj, down_proj) */
    {.type = "arcee", .act = MP_ACT_RELU2, .norm = MP_NORM_RMSNORM, .gqa = true, .up_down = true,
     .k_attn_bias = "attention_bias", .k_mlp_bias = "mlp_bias", .k_attn_p = "attention_dropout", .n_tok = "embed_tokens",
     .n_norm = "norm", .n_head = "lm_head", .k_cls_p = "hidden_dropout", .generic_heads = true,
     .heads = DECODER_HEADS},
    /* Ministral: Mistral's config with layer_types (sliding or full per layer), Qwen2's layer
     * without biases; head_dim and sliding_window required (in the hook) */
    {.type = "ministral", LLAMA_LIKE(MP_ACT_SILU), .kv_default = 8, .heads = DECODER_HEADS,
     .window = W_TYPES_OR_ALL, .window_default = 4096, .hook = ministral_hook},
    /* OLMo (v1): llama with LayerNorms without parameters (fp32), fp32 cos/sin; clip_qkv in the hook */
    {.type = "olmo", .act = MP_ACT_SILU, .norm = MP_NORM_LAYERNORM, .norm_cfg.ln_plain = true, .gated = true,
     .gqa = true,
     .k_attn_bias = "attention_bias", .rope.fp32 = true, .rope.cast_back = true, .k_attn_p = "attention_dropout",
     .n_tok = "embed_tokens", .n_norm = "norm", .n_head = "lm_head", .heads = HEAD(H_CAUSAL) | HEAD(H_SEQ) | HEAD(H_BARE),
     .hook = olmo_hook},
    /* Nemotron (Minitron): LayerNorm1P with bias, a non-gated relu2 MLP (up_proj, down_proj), partial rotary
     * (0.5 by default) */
    {.type = "nemotron", .act = MP_ACT_RELU2, .norm = MP_NORM_LAYERNORM, .norm_cfg.ln_1p = true, .gqa = true,
     .up_down = true,
     .k_rotary = "partial_rotary_factor", .rotary_default = 0.5, .k_attn_bias = "attention_bias",
     .k_mlp_bias = "mlp_bias", .k_attn_p = "attention_dropout", .n_tok = "embed_tokens", .n_norm = "norm",
     .n_head = "lm_head", .k_cls_p = "hidden_dropout", .generic_heads = true, .heads = DECODER_HEADS},
    /* HunYuan dense (Hunyuan-7B): llama with per-head q/k RMSNorms after the rotary */
    {.type = "hunyuan_v1_dense", LLAMA_LIKE(MP_ACT_SILU), .k_attn_bias = "attention_bias", .qk_norm = MP_QK_NORM_HEAD,
     .qk_norm_late = true, .heads = HEAD(H_CAUSAL) | HEAD(H_SEQ) | HEAD(H_BARE)},
    /* Apertus: llama with per-head q/k RMSNorms and a non-gated xIELU MLP (up_proj, down_proj; the
     * activation's two learned scalars) */
    {.type = "apertus", .act = MP_ACT_XIELU, .norm = MP_NORM_RMSNORM, .gqa = true, .up_down = true,
     .qk_norm = MP_QK_NORM_HEAD, .k_attn_bias = "attention_bias", .k_attn_p = "attention_dropout",
     .n_tok = "embed_tokens", .n_norm = "norm", .n_head = "lm_head", .k_cls_p = "hidden_dropout", .generic_heads = true,
     .heads = HEAD(H_CAUSAL) | HEAD(H_TOKEN) | HEAD(H_BARE)},
    /* Llama 3.2 Vision's text model (mllama/modeling_mllama.py MllamaTextModel, MllamaTextConfig;
     * read through the mllama row of multimodal[] only): llama's self-attention layers without
     * biases, head_dim hidden / heads (the class reads no head_dim), the attention dropout
     * "dropout", an embedding of vocab_size + 8 rows, and the cross-attention layers
     * (cross_attention_layers), which a step without image states skips (mllama_text_hook) */
    /* Llama 4's text model (llama4/modeling_llama4.py Llama4ForCausalLM, Llama4TextConfig; llama4_hook):
     * llama's layers with the complex fp32 rotary, L2 q/k norms after it, NoPE layers with
     * temperature tuning, chunked attention on the rotary layers, MoE layers (every token through
     * every expert) and dense ones of intermediate_size_mlp; eager attention's plain softmax (no
     * fp32 cast, modeling_llama4.py:253-276); peft 0.21 has no default targets for llama4_text
     * (only for llama4) */
    {.type = "llama4_text", LLAMA_LIKE(MP_ACT_SILU), .kv_default = 8, .head_dim_default = 128,
     .k_attn_bias = "attention_bias", .qk_norm_late = true, .plain_softmax = true,
     .heads = HEAD(H_CAUSAL) | HEAD(H_BARE),
     .no_flash = "transformers has none for Llama 4 (Llama4PreTrainedModel, modeling_llama4.py:450)",
     .hook = llama4_hook},
    {.type = "mllama_text_model", .act = MP_ACT_SILU, .norm = MP_NORM_RMSNORM, .gated = true, .gqa = true,
     .ignores_head_dim = true, .kv_default = 8, .k_attn_p = "dropout", .n_tok = "embed_tokens", .n_norm = "norm",
     .n_head = "lm_head", .heads = HEAD(H_CAUSAL), .emb_extra_rows = 8, .mm_text = true, .hook = mllama_text_hook},
};
#define N_FAMILIES (sizeof families / sizeof families[0])

/* Multimodal checkpoints, planned for text-only steps: the text config (text_config, or the top
 * level where the class reads its text keys there) through its family's row, the vision tower and
 * projector loaded and unused (model_hf_vision.c, model.h struct mp_idle).  Columns: the class;
 * the text family's row and the text config's own model_type; whether the text keys may be at the
 * top level (Qwen2-VL, Qwen2.5-VL: Qwen2_5_VLConfig.__post_init__ builds text_config from them);
 * tie_word_embeddings: the top level's decides, with this class default (transformers 5.24 ties
 * the lm_head by the outer config; Qwen*-VL also when the text config says true); whether the
 * forward skips the text config's final_logit_softcapping (Gemma3ForConditionalGeneration); M-RoPE
 * (position ids (3, b, s): cos/sin per sample); the text config class's defaults of the keys the
 * family row requires (JSON, added where the text config lacks them). */
static const struct multimodal {
    const char *type, *cls, *text_row, *text_type;
    bool text_at_top, tie, tie_or_text, no_logit_softcap, mrope;
    const char *text_defaults;
    bool never_tied;
    bool text_ties; /* the text config's tie_word_embeddings alone decides (Llama 4: its language_model,
                       a Llama4ForCausalLM, ties by its own config; measured on the meta device) */
    struct mp_hf_names names; /* peft's default targets for the model_type (0.21 utils/constants.py
                                 TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: llama4) */
    const char *no_flash;     /* the class has no flash-attention path, why (else its text row's) */
} multimodal[] = {
    {"gemma3", "Gemma3ForConditionalGeneration", "gemma3_text", "gemma3_text", false, true, false, true, false,
     "{\"vocab_size\": 262208, \"hidden_size\": 2304, \"intermediate_size\": 9216, \"num_hidden_layers\": 26, "
     "\"num_attention_heads\": 8}", false, false, {NULL},
     /* transformers 5.24 gemma3/modeling_gemma3.py:751, 906 */
     .no_flash = "Gemma3ForConditionalGeneration has none (its bidirectional mask over image tokens)"},
    {"qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "qwen2", "qwen2_5_vl_text", true, false, true, false, true,
     "{\"vocab_size\": 152064, \"hidden_size\": 8192, \"intermediate_size\": 29568, \"num_hidden_layers\": 80, "
     "\"num_attention_heads\": 64, \"num_key_value_heads\": 8, \"max_position_embeddings\": 32768, "
     "\"max_window_layers\": 80}", false, false, {NULL}, NULL},
    {"qwen2_vl", "Qwen2VLForConditionalGeneration", "qwen2", "qwen2_vl_text", true, false, true, false, true,
     "{\"vocab_size\": 152064, \"hidden_size\": 8192, \"intermediate_size\": 29568, \"num_hidden_layers\": 80, "
     "\"num_attention_heads\": 64, \"num_key_value_heads\": 8, \"max_position_embeddings\": 32768, "
     "\"max_window_layers\": 80}", false, false, {NULL}, NULL},
    {"mistral3", "Mistral3ForConditionalGeneration", "mistral", "mistral", false, true, false, false, false, NULL, false,
     false, {NULL}, NULL},
    /* MllamaForConditionalGeneration never ties lm_head (its _tied_weights_keys is commented out in
     * 5.24), whatever tie_word_embeddings says */
    {"mllama", "MllamaForConditionalGeneration", "mllama_text_model", "mllama_text_model", false, false, false, false,
     false,
     "{\"vocab_size\": 128256, \"hidden_size\": 4096, \"intermediate_size\": 14336, \"num_hidden_layers\": 40, "
     "\"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"max_position_embeddings\": 131072}", true, false, {NULL},
     .no_flash = "MllamaForConditionalGeneration has none (its 4-D masks; modeling_mllama.py:783)"},
    /* Llama4ForConditionalGeneration: Llama4ForCausalLM as its language_model, the vision model and
     * projector idle in a text-only step (model_hf_vision.c llama4_vision) */
    {"llama4", "Llama4ForConditionalGeneration", "llama4_text", "llama4_text", false, false, false, false, false,
     "{\"vocab_size\": 202048, \"hidden_size\": 5120, \"intermediate_size\": 8192, \"num_hidden_layers\": 48, "
     "\"num_attention_heads\": 40, \"num_key_value_heads\": 8, \"max_position_embeddings\": 131072}", false,
     true, {.peft = "q_proj,v_proj"}, NULL},
};
#define N_MULTIMODAL (sizeof multimodal / sizeof multimodal[0])

/* The supported model_types, comma-separated, in the families' order (built once; the rows of a
 * multimodal checkpoint's text model alone are not model_types of their own). */
const char *mp_hf_model_types(void)
{
    static char buf[1024];
    const char *types[N_FAMILIES + N_MULTIMODAL];
    size_t n = 0;
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (!families[i].mm_text)
            types[n++] = families[i].type;
    for (size_t i = 0; i < N_MULTIMODAL; i++)
        types[n++] = multimodal[i].type;
    return buf[0] ? buf : mp_join(buf, sizeof buf, types, n, ", ", NULL);
}

const struct mp_hf_names *mp_hf_family_names(const char *hf_type)
{
    for (size_t i = 0; hf_type && i < N_MULTIMODAL; i++)
        if (!strcmp(multimodal[i].type, hf_type) && multimodal[i].names.peft)
            return &multimodal[i].names;
    for (size_t i = 0; hf_type && i < N_FAMILIES; i++)
        if (!strcmp(families[i].type, hf_type))
            return &families[i].names;
    return NULL;
}

/* model_types transformers has and memplan knowingly does not model: refused with what is missing,
 * never approximated. */
static const struct {
    const char *type, *why;
} refused_types[] = {
    {"mllama_text_model", "Llama 3.2 Vision's text model alone (MllamaForCausalLM, whose forward upcasts the "
                          "logits) is not modelled; give the mllama checkpoint's config.json "
                          "(MllamaForConditionalGeneration)"},
};

/* The config after the transformers defaults: everything the lowering needs. */
/* Reading a per-layer list in layer order: cJSON's lists are linked, so item i from the start
 * costs i steps (quadratic over 100,000 layers); a cursor walks on from the last item read. */
struct list_cursor {
    const cJSON *item;
    uint64_t index;
};

static const cJSON *list_item(const cJSON *a, uint64_t i, struct list_cursor *cur)
{
    if (!cur->item || cur->index > i) {
        cur->item = a->child;
        cur->index = 0;
    }
    while (cur->item && cur->index < i) {
        cur->item = cur->item->next;
        cur->index++;
    }
    return cur->item;
}

struct hf {
    const struct family *f;
    uint64_t vocab, hidden, layers, heads, kv_heads, head_dim, ffn;
    uint64_t positions;    /* max positions; 0 = not given (rope models only) */
    uint64_t type_vocab;   /* token-type rows (bert) */
    uint64_t rotary_dim;   /* 0 = whole head */
    enum mp_act act;
    enum mp_norm norm;
    bool learned_pos, rope, gated, fused_qkv, qkv_bias, out_bias, mlp_bias, lm_bias;
    bool tied, causal, parallel, shared_norm, post_norm;
    double emb_p, attn_p, resid_p;
    enum head head;
    uint64_t labels;       /* classes of a classification head */
    double cls_p;          /* classifier dropout */
    double qa_p;           /* dropout before qa_outputs (DistilBERT) */
    double attn_softcap, logit_softcap;
    bool cls_bias;         /* token classifier bias */
    double emb_mult, resid_mult, logits_mult; /* 0: none */
    enum mp_qkv_split qkv_split; /* Falcon: how the fused qkv is split */
    bool attn_mask;        /* Falcon: a mask tensor reaches every attention */
    bool qk_fp32;          /* GPT-J: eager q/k in fp32 */
    uint64_t rope_table_rows; /* GPT-J: rows of each layer's sinusoid table */
    uint64_t channels, image_h, image_w, patch; /* ViT */
    uint64_t pooler_out;   /* ViT: pooler_output_size (default hidden) */
    enum mp_act pooler_act;
    unsigned mask_kinds;   /* distinct layer types (full / sliding attention): one eager mask each */
    const cJSON *layer_types; /* the config's layer_types (validated), else NULL */
    struct list_cursor *lt_at, *nr_at; /* where layer_types / no_rope_layers were last read */
    uint64_t swa_every;    /* without layer_types: layer i is full attention iff (i + 1) % swa_every == 0 */
    /* per-layer rotary (NoPE layers): SmolLM3's no_rope_layers (1: rope) or every nope_every-th
     * layer without; EXAONE 4: rope on the sliding layers only */
    const cJSON *no_rope;
    uint64_t nope_every;
    bool rope_sliding_only;
    uint64_t window;       /* sliding_window after the config class's rules (0: no sliding layers) */
    uint64_t window_max;   /* Qwen's max_window_layers */
    /* mixture of experts (moe_hook): what every MoE layer gets (struct mp_layer's fields), and
     * which layers are MoE */
    struct mp_moe moe;
    uint64_t sparse_step;    /* Qwen-MoE: layer i is MoE when (i + 1) % step == 0 ... */
    const cJSON *mlp_only;   /* ... and i is not in mlp_only_layers (validated) */
    uint64_t first_dense;    /* DeepSeek: layers below first_k_dense_replace are dense */
    struct mp_mla mla;       /* MLA (kv_lora > 0) */
    bool clip_qkv;           /* OLMo: q, k, v clamped in place */
    bool mrope;              /* Qwen2-VL, Qwen2.5-VL: cos/sin per sample (multimodal[]) */
    /* Mllama: cross[i] for the cross-attention layers among the num_hidden_layers (a text-only
     * step skips them: no block; their weights are idle, model.h struct mp_idle), n_cross of them
     * (owned: from_hf frees it) */
    unsigned char *cross;
    uint64_t n_cross;
    /* Llama 4 (llama4_hook): the MoE layers' list (moe_layers, validated; else sparse_step), the
     * dense layers' MLP width (intermediate_size_mlp), the chunk of the chunked-attention layers
     * (0: none), L2 q/k norms and temperature tuning (per layer: rotary / NoPE) */
    const cJSON *moe_list;
    uint64_t dense_ffn, chunk;
    bool llama4, l2_qk, temp_tuning;
};

/* ---- field readers ---------------------------------------------------------------- */

static bool present(const cJSON *root, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return v && !cJSON_IsNull(v);
}

/* First of keys[] present in root, else keys[0] (the name a "missing" message uses). */
static const char *first_key(const cJSON *root, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (present(root, keys[i]))
            return keys[i];
    return keys[0];
}

/* A positive integer at most max.  Absent and not required leaves *out untouched. */
static enum mp_status read_pos(const cJSON *root, const char *key, bool required, uint64_t max, uint64_t *out,
                               const char *path, struct mp_diag *d)
{
    uint64_t v = 0;
    enum mp_status st = mp_json_u64(root, key, required, max, &v, path, "", d);
    if (st != MP_OK || !present(root, key))
        return st;
    if (v == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: expected a positive integer", path, key);
    *out = v;
    return MP_OK;
}

/* A fraction in (0, 1]. */
static enum mp_status read_fraction(const cJSON *obj, const char *key, double *out, const char *path,
                                    const char *where, struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return MP_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0.0 && v->valuedouble <= 1.0))
        return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: expected a number in (0, 1]", path, where, *where ? "." : "",
                       key);
    *out = v->valuedouble;
    return MP_OK;
}

/* An activation name; absent leaves *out untouched. */
static enum mp_status read_act(const cJSON *root, const char *key, enum mp_act *out, const char *path,
                               struct mp_diag *d)
{
    enum mp_status st;
    const char *s = mp_json_str(root, key, &st, path, "", d);
    if (st != MP_OK || !s)
        return st;
    int a = mp_act_parse(s);
    if (a < 0)
        return mp_fail(d, MP_ERR_MODEL,
                       "%s: %s: '%s' is not a supported activation (supported: gelu, gelu_new, gelu_fast, "
                       "gelu_pytorch_tanh, relu, relu2, silu, swish, tanh, sigmoid, xielu)",
                       path, key, s);
    *out = (enum mp_act)a;
    return MP_OK;
}

/* ---- reading the config ------------------------------------------------------------- */

static const char *key_or(const char *k, const char *dflt) { return k ? k : dflt; }

/* The first of a row's two names present in root, else its first name (or dflt). */
static const char *key2(const cJSON *root, const char *const k[2], const char *dflt)
{
    if (!k[0])
        return dflt;
    return k[1] ? first_key(root, k, 2) : k[0];
}

/* The row's defaults: what the transformers config class and module layout give. */
static void family_defaults(struct hf *c)
{
    const struct family *f = c->f;
    c->causal = !f->encoder;
    c->learned_pos = f->pos_rows != 0;
    c->rope = !c->learned_pos && !f->vision;
    c->positions = f->pos_rows;
    c->type_vocab = f->type_vocab;
    c->gated = f->gated;
    c->norm = f->norm;
    c->fused_qkv = f->fused_qkv;
    c->qkv_bias = f->qkv_bias;
    c->out_bias = f->out_bias;
    c->mlp_bias = f->mlp_bias;
    c->lm_bias = f->lm_bias;
    c->tied = f->tied;
    c->parallel = f->parallel;
    c->shared_norm = f->shared_norm;
    c->post_norm = f->post_norm;
    c->act = f->act;
    c->emb_p = c->attn_p = c->resid_p = f->dropout;
}

/* The size fields shared by every family. */
static enum mp_status read_sizes(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    const struct family *f = c->f;
    const char *hk = key2(root, f->k_hidden, "hidden_size");
    const char *lk = key2(root, f->k_layers, "num_hidden_layers");
    const char *ak = key2(root, f->k_heads, "num_attention_heads");
    const char *pk = key2(root, f->k_pos, "max_position_embeddings");
    const char *fk = key_or(f->k_ffn, "intermediate_size");
    enum mp_status st;
    if ((st = read_pos(root, "vocab_size", !f->vision, MP_DIM_MAX, &c->vocab, path, d)) != MP_OK ||
        (st = read_pos(root, hk, true, MP_DIM_MAX, &c->hidden, path, d)) != MP_OK ||
        (st = read_pos(root, lk, true, HF_LAYERS_MAX, &c->layers, path, d)) != MP_OK ||
        (st = read_pos(root, ak, true, MP_DIM_MAX, &c->heads, path, d)) != MP_OK ||
        (st = read_pos(root, pk, false, MP_DIM_MAX, &c->positions, path, d)) != MP_OK)
        return st;
    c->ffn = f->ffn_mult * c->hidden; /* gpt2's n_inner: null means 4 * n_embd */
    if ((st = read_pos(root, fk, f->ffn_mult == 0, MP_DIM_MAX, &c->ffn, path, d)) != MP_OK)
        return st;

    /* Key/value heads: an explicit null means "as many as heads" in every class; an absent
     * key takes the class default (MistralConfig 8, Qwen2Config 32, GemmaConfig 16). */
    c->kv_heads = c->heads;
    if (f->gqa && !cJSON_GetObjectItemCaseSensitive(root, "num_key_value_heads") && f->kv_default)
        c->kv_heads = f->kv_default;
    if (f->gqa && (st = read_pos(root, "num_key_value_heads", false, MP_DIM_MAX, &c->kv_heads, path, d)) != MP_OK)
        return st;
    if (c->kv_heads > c->heads || c->heads % c->kv_heads != 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: num_key_value_heads: %llu does not divide %s %llu", path,
                       (unsigned long long)c->kv_heads, ak, (unsigned long long)c->heads);

    /* head_dim: read by the gqa classes (gpt2, gpt_neox and bert ignore it); GemmaConfig
     * defaults it to 256, the others to hidden / heads. */
    if (f->gqa && !f->ignores_head_dim && present(root, "head_dim"))
        return read_pos(root, "head_dim", true, MP_DIM_MAX, &c->head_dim, path, d);
    if (f->head_dim_default) {
        c->head_dim = f->head_dim_default;
        return MP_OK;
    }
    if (c->hidden % c->heads != 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: %llu does not divide %s %llu", path, ak,
                       (unsigned long long)c->heads, hk, (unsigned long long)c->hidden);
    c->head_dim = c->hidden / c->heads;
    return MP_OK;
}

/* Partial rotary embeddings: rope_parameters.partial_rotary_factor wins over the legacy key. */
static enum mp_status read_rotary(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    const char *legacy = c->f->k_rotary;
    if (!legacy)
        return MP_OK;
    double frac = c->f->rotary_default;
    const char *key = legacy;
    enum mp_status st = read_fraction(root, legacy, &frac, path, "", d);
    if (st != MP_OK)
        return st;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (cJSON_IsObject(rp) && present(rp, "partial_rotary_factor")) {
        key = "rope_parameters.partial_rotary_factor";
        if ((st = read_fraction(rp, "partial_rotary_factor", &frac, path, "rope_parameters", d)) != MP_OK)
            return st;
    }
    /* transformers: rotary_ndims = int(head_dim * factor) */
    uint64_t r = (uint64_t)((double)c->head_dim * frac);
    if (r == 0 || r % 2 != 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: %g of head_dim %llu gives %llu rotary dimensions (expected an even "
                       "positive number)", path, key, frac, (unsigned long long)c->head_dim, (unsigned long long)r);
    c->rotary_dim = r == c->head_dim ? 0 : r;
    return MP_OK;
}

/* A flag the row names (NULL: the class does not read one). */
static enum mp_status read_flag(const cJSON *root, const char *key, bool *out, const char *path, struct mp_diag *d)
{
    return key ? mp_json_bool(root, key, out, path, "", d) : MP_OK;
}

static enum mp_status read_prob(const cJSON *root, const char *key, double *out, const char *path,
                                struct mp_diag *d)
{
    return key ? mp_json_prob(root, key, out, path, "", d) : MP_OK;
}

static enum mp_status read_softcap(const cJSON *root, const char *key, double *out, const char *path,
                                   struct mp_diag *d);

/* Activation, flags, dropouts, unmodelled options, tying. */
static enum mp_status read_options(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    const struct family *f = c->f;
    enum mp_status st;
    if ((st = read_act(root, key_or(f->k_act, "hidden_act"), &c->act, path, d)) != MP_OK)
        return st;
    bool ab = c->qkv_bias;
    if ((st = read_flag(root, f->k_attn_bias, &ab, path, d)) != MP_OK ||
        (st = read_flag(root, f->k_mlp_bias, &c->mlp_bias, path, d)) != MP_OK ||
        (st = read_flag(root, f->k_parallel, &c->parallel, path, d)) != MP_OK)
        return st;
    c->qkv_bias = ab;
    if (f->k_attn_bias && !f->k_out_bias)
        c->out_bias = ab;
    if ((st = read_flag(root, f->k_out_bias, &c->out_bias, path, d)) != MP_OK)
        return st;
    bool all = c->qkv_bias;
    if ((st = read_flag(root, f->k_qkv_bias, &c->qkv_bias, path, d)) != MP_OK ||
        (st = read_flag(root, f->k_bias, &all, path, d)) != MP_OK)
        return st;
    if (f->k_bias)
        c->qkv_bias = c->out_bias = c->mlp_bias = all;
    if ((st = read_flag(root, f->k_lm_bias, &c->lm_bias, path, d)) != MP_OK)
        return st;
    c->attn_softcap = f->attn_softcap;
    c->logit_softcap = f->logit_softcap;
    if ((st = read_softcap(root, f->k_attn_softcap, &c->attn_softcap, path, d)) != MP_OK ||
        (st = read_softcap(root, f->k_logit_softcap, &c->logit_softcap, path, d)) != MP_OK)
        return st;
    double div = 1.0;
    c->emb_mult = f->emb_sqrt ? sqrt((double)c->hidden) : f->k_emb_mult ? 1.0 : 0.0;
    c->resid_mult = f->k_resid_mult ? 1.0 : 0.0;
    if ((st = read_softcap(root, f->k_emb_mult, &c->emb_mult, path, d)) != MP_OK ||
        (st = read_softcap(root, f->k_resid_mult, &c->resid_mult, path, d)) != MP_OK ||
        (st = read_softcap(root, f->k_logits_div, &div, path, d)) != MP_OK)
        return st;
    if (f->k_logits_div && !(div > 0))
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: expected a positive number", path, f->k_logits_div);
    c->logits_mult = f->k_logits_div ? 1.0 / div : 0.0;
    if (f->k_logit_scale) {
        c->logits_mult = f->logit_scale;
        if ((st = read_softcap(root, f->k_logit_scale, &c->logits_mult, path, d)) != MP_OK)
            return st;
    }
    c->emb_p = f->k_emb_p || f->emb_p_is_resid ? f->dropout : 0.0;
    c->attn_p = f->k_attn_p ? f->attn_dropout : 0.0;
    c->resid_p = f->k_resid_p ? f->dropout : 0.0;
    if ((st = read_prob(root, f->k_emb_p, &c->emb_p, path, d)) != MP_OK ||
        (st = read_prob(root, f->k_attn_p, &c->attn_p, path, d)) != MP_OK ||
        (st = read_prob(root, f->k_resid_p, &c->resid_p, path, d)) != MP_OK)
        return st;
    if (f->emb_p_is_resid)
        c->emb_p = c->resid_p;
    for (size_t i = 0; i < sizeof f->reject / sizeof f->reject[0] && f->reject[i].key; i++) {
        bool v = false;
        if ((st = mp_json_bool(root, f->reject[i].key, &v, path, "", d)) != MP_OK)
            return st;
        if (v)
            return mp_fail(d, MP_ERR_MODEL, "%s: %s: true is not supported (%s)", path, f->reject[i].key,
                           f->reject[i].why);
    }
    return mp_json_bool(root, "tie_word_embeddings", &c->tied, path, "", d);
}

/* A tanh softcap or a multiplier: a positive number, or null / absent for none (when the default
 * is none). */
static enum mp_status read_softcap(const cJSON *root, const char *key, double *out, const char *path,
                                   struct mp_diag *d)
{
    const cJSON *v = key ? cJSON_GetObjectItemCaseSensitive(root, key) : NULL;
    if (!v)
        return MP_OK;
    if (cJSON_IsNull(v)) {
        *out = 0.0;
        return MP_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0.0))
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: expected a positive number or null", path, key);
    *out = v->valuedouble;
    return MP_OK;
}

/* Gemma's released configs say hidden_act "gelu" but mean the tanh approximation
 * (transformers rewrites it); hidden_activation, where given, wins.  Gemma can also be
 * bidirectional (use_bidirectional_attention). */
static enum mp_status gemma_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    const cJSON *ha = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (cJSON_IsString(ha) && strcmp(ha->valuestring, "gelu") == 0)
        c->act = c->f->act;
    enum mp_status st = read_act(root, "hidden_activation", &c->act, path, d);
    bool bidir = false;
    if (st != MP_OK || (st = mp_json_bool(root, "use_bidirectional_attention", &bidir, path, "", d)) != MP_OK)
        return st;
    c->causal = !bidir;
    if (bidir && c->window) /* Gemma3Config: exclusive bounds for the bidirectional window */
        c->window = c->window / 2 + 1;
    return MP_OK;
}

/* BERT: absolute positions only; token types; is_decoder makes it causal. */
static enum mp_status bert_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    enum mp_status st;
    const char *pet = mp_json_str(root, "position_embedding_type", &st, path, "", d);
    if (st != MP_OK)
        return st;
    if (pet && strcmp(pet, "absolute") != 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: position_embedding_type: '%s' is not supported (supported: absolute)",
                       path, pet);
    bool dec = false;
    if ((st = read_pos(root, "type_vocab_size", false, MP_DIM_MAX, &c->type_vocab, path, d)) != MP_OK ||
        (st = mp_json_bool(root, "is_decoder", &dec, path, "", d)) != MP_OK)
        return st;
    c->causal = dec;
    return MP_OK;
}

/* The head architectures[0] names: "<Prefix><suffix>" for a suffix of head_classes; *prefix_len
 * (when not NULL) the length of <Prefix>. */
static bool head_of_class(const char *cls, enum head *out, size_t *prefix_len)
{
    size_t n = strlen(cls);
    for (size_t i = 0; i < sizeof head_classes / sizeof head_classes[0]; i++) {
        size_t k = strlen(head_classes[i].suffix);
        if (n <= k || strcmp(cls + n - k, head_classes[i].suffix) != 0)
            continue;
        if (head_classes[i].h == H_BARE) { /* GPT2DoubleHeadsModel, BertLMHeadModel... are not bare */
            char pre[128];
            snprintf(pre, sizeof pre, "%.*s", (int)(n - k), cls);
            size_t pn = strlen(pre);
            if (strstr(pre, "For") || (pn >= 4 && strcmp(pre + pn - 4, "Head") == 0) ||
                (pn >= 5 && strcmp(pre + pn - 5, "Heads") == 0))
                return false;
        }
        *out = head_classes[i].h;
        if (prefix_len)
            *prefix_len = n - k;
        return true;
    }
    return false;
}

static void heads_list(unsigned heads, char *out, size_t cap)
{
    static const char *const names[H_COUNT] = {"*ForCausalLM", "*ForMaskedLM", "*ForSequenceClassification",
                                               "*ForTokenClassification", "*ForQuestionAnswering", "*Model",
                                               "*ForImageClassification"};
    size_t len = 0;
    out[0] = '\0';
    for (int h = 0; h < H_COUNT; h++)
        if (heads & HEAD(h))
            len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "%s%s", len ? ", " : "", names[h]);
}

/* Classes of a classification head: id2label's size when given (transformers derives num_labels
 * from it), else num_labels, else 2. */
static enum mp_status read_labels(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "id2label");
    c->labels = 2;
    if (map && !cJSON_IsNull(map)) {
        if (!cJSON_IsObject(map) || !map->child)
            return mp_fail(d, MP_ERR_MODEL, "%s: id2label: expected an object with at least one label", path);
        c->labels = (uint64_t)cJSON_GetArraySize(map);
        return MP_OK;
    }
    return read_pos(root, "num_labels", false, MP_DIM_MAX, &c->labels, path, d);
}

/* The task head (architectures[0]), its classes and dropout.  Classes: id2label's size when
 * given (transformers derives num_labels from it), else num_labels, else 2. */
static enum mp_status read_head(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    const struct family *f = c->f;
    c->head = f->default_head;
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (arch && !cJSON_IsNull(arch)) {
        const cJSON *a0 = cJSON_GetArrayItem(arch, 0);
        if (!cJSON_IsArray(arch) || (a0 && !cJSON_IsString(a0)))
            return mp_fail(d, MP_ERR_MODEL, "%s: architectures: expected a list of class names", path);
        enum head h;
        if (a0 && (!head_of_class(a0->valuestring, &h, NULL) || !(f->heads & HEAD(h)))) {
            char list[200];
            heads_list(f->heads, list, sizeof list);
            return mp_fail(d, MP_ERR_MODEL, "%s: architectures[0]: '%s' is not supported for %s (supported: %s)", path,
                           a0->valuestring, f->type, list);
        }
        if (a0)
            c->head = h;
    }
    enum mp_status st;
    if ((st = read_labels(root, c, path, d)) != MP_OK)
        return st;
    c->cls_p = 0.1;
    c->cls_bias = true;
    const char *pk = present(root, "classifier_dropout") ? "classifier_dropout" : f->k_cls_p;
    if ((st = read_prob(root, pk, &c->cls_p, path, d)) != MP_OK)
        return st;
    return f->generic_heads ? mp_json_bool(root, "token_classification_bias", &c->cls_bias, path, "", d) : MP_OK;
}

/* OPT: the pre-norm layout with word_embed_proj_dim == hidden_size (every OPT but opt-350m). */
static enum mp_status opt_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    bool before = true, affine = true, remove_final = false;
    uint64_t proj = c->hidden;
    enum mp_status st;
    if ((st = mp_json_bool(root, "do_layer_norm_before", &before, path, "", d)) != MP_OK ||
        (st = mp_json_bool(root, "layer_norm_elementwise_affine", &affine, path, "", d)) != MP_OK ||
        (st = mp_json_bool(root, "_remove_final_layer_norm", &remove_final, path, "", d)) != MP_OK ||
        (st = read_pos(root, "word_embed_proj_dim", false, MP_DIM_MAX, &proj, path, d)) != MP_OK)
        return st;
    if (!before)
        return mp_fail(d, MP_ERR_MODEL, "%s: do_layer_norm_before: false is not supported (the post-norm OPT "
                       "layout is not modelled)", path);
    if (!affine || remove_final)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: %s is not supported (OPT layer norms without parameters are not "
                       "modelled)", path, affine ? "_remove_final_layer_norm" : "layer_norm_elementwise_affine",
                       affine ? "true" : "false");
    if (proj != c->hidden)
        return mp_fail(d, MP_ERR_MODEL, "%s: word_embed_proj_dim: %llu differs from hidden_size %llu (the "
                       "project_in/project_out layers are not modelled)", path, (unsigned long long)proj,
                       (unsigned long long)c->hidden);
    return MP_OK;
}

/* DistilBERT: learned positions only; each head has its own dropout key. */
static enum mp_status distilbert_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    bool sinus = false;
    enum mp_status st;
    if ((st = mp_json_bool(root, "sinusoidal_pos_embds", &sinus, path, "", d)) != MP_OK)
        return st;
    if (sinus)
        return mp_fail(d, MP_ERR_MODEL, "%s: sinusoidal_pos_embds: true is not supported (a frozen position "
                       "table is not modelled)", path);
    c->cls_p = c->head == H_SEQ ? 0.2 : 0.1; /* seq_classif_dropout; dropout (token heads) */
    c->qa_p = 0.1;
    if (c->head == H_SEQ)
        return read_prob(root, "seq_classif_dropout", &c->cls_p, path, d);
    if (c->head == H_TOKEN)
        c->cls_p = c->resid_p;
    return read_prob(root, "qa_dropout", &c->qa_p, path, d);
}

/* GPT-J: rotary over the first rotary_dim of each head (null is not a layout transformers can
 * run: its table would be hidden_size wide); each layer's table has n_positions rows.  Its
 * question-answering head is a Linear to num_labels, split in two: 2 is the only count that runs. */
static enum mp_status gptj_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    uint64_t rd = 64;
    enum mp_status st = read_pos(root, "rotary_dim", false, MP_DIM_MAX, &rd, path, d);
    if (st != MP_OK)
        return st;
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(root, "rotary_dim")))
        return mp_fail(d, MP_ERR_MODEL, "%s: rotary_dim: null is not supported (rotary over the whole hidden size "
                       "does not run in transformers' GPT-J)", path);
    if (rd % 2 != 0 || rd > c->head_dim)
        return mp_fail(d, MP_ERR_MODEL, "%s: rotary_dim: %llu must be even and at most the head size %llu", path,
                       (unsigned long long)rd, (unsigned long long)c->head_dim);
    if (c->head == H_QA && c->labels != 2)
        return mp_fail(d, MP_ERR_MODEL, "%s: num_labels: %llu is not supported for GPTJForQuestionAnswering "
                       "(its qa_outputs are split into start and end logits: 2)", path, (unsigned long long)c->labels);
    c->rotary_dim = rd == c->head_dim ? 0 : rd;
    c->rope_table_rows = c->positions ? c->positions : 2048; /* GPTJConfig n_positions */
    c->positions = c->rope_table_rows;
    c->qk_fp32 = true;
    c->attn_mask = true; /* create_causal_mask gives eager attention a 4-D float mask */
    return MP_OK;
}

/* Falcon (FalconConfig, FalconDecoderLayer): the multi-query 7B layout (one k/v head, parallel
 * attention, one norm), the new decoder architecture of 40B/180B (num_kv_heads, two norms
 * ln_attn/ln_mlp unless num_ln_in_parallel_attn is 1), and the sequential layout
 * (parallel_attn false).  Every layer gets the (b, 1, s, s) mask (allow_is_causal_skip=False).
 * The residual dropout (hidden_dropout) is on the sum of both branches: one mask, modelled on
 * the MLP branch.  Token classification falls back to hidden_dropout (FalconConfig's 0.0). */
static enum mp_status falcon_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    bool alibi = false, newarch = false, mq = true, par = true;
    uint64_t kv = c->heads, nln = 0;
    double attn_p = 0.0;
    enum mp_status st;
    if ((st = mp_json_bool(root, "alibi", &alibi, path, "", d)) != MP_OK ||
        (st = mp_json_bool(root, "new_decoder_architecture", &newarch, path, "", d)) != MP_OK ||
        (st = mp_json_bool(root, "multi_query", &mq, path, "", d)) != MP_OK ||
        (st = mp_json_bool(root, "parallel_attn", &par, path, "", d)) != MP_OK ||
        (st = read_pos(root, "num_kv_heads", false, MP_DIM_MAX, &kv, path, d)) != MP_OK ||
        (st = read_pos(root, "num_ln_in_parallel_attn", false, 2, &nln, path, d)) != MP_OK ||
        (st = read_prob(root, "attention_dropout", &attn_p, path, d)) != MP_OK)
        return st;
    if (alibi)
        return mp_fail(d, MP_ERR_MODEL, "%s: alibi: true is not supported (ALiBi attention biases are not "
                       "modelled)", path);
    if (newarch) {
        if (!par)
            return mp_fail(d, MP_ERR_MODEL, "%s: parallel_attn: false with new_decoder_architecture is not a "
                           "layout transformers runs", path);
        if (kv > c->heads || c->heads % kv != 0)
            return mp_fail(d, MP_ERR_MODEL, "%s: num_kv_heads: %llu does not divide num_attention_heads %llu", path,
                           (unsigned long long)kv, (unsigned long long)c->heads);
        c->kv_heads = kv;
        c->qkv_split = MP_QKV_COPY_EXPAND;
        c->shared_norm = nln == 1;
    } else {
        if (nln == 2 && par)
            return mp_fail(d, MP_ERR_MODEL, "%s: num_ln_in_parallel_attn: 2 needs new_decoder_architecture "
                           "(transformers builds one norm otherwise)", path);
        if (!mq && kv != c->heads)
            return mp_fail(d, MP_ERR_MODEL, "%s: num_kv_heads: %llu must equal num_attention_heads without "
                           "multi_query", path, (unsigned long long)kv);
        if (!par && attn_p > 0)
            return mp_fail(d, MP_ERR_MODEL, "%s: attention_dropout: a dropout on the attention branch of the "
                           "sequential layout is not modelled", path);
        c->kv_heads = mq ? 1 : c->heads;
        c->qkv_split = mq ? MP_QKV_COPY_MQ : MP_QKV_COPY_ALL;
        c->parallel = par;
        c->shared_norm = true;
    }
    c->attn_mask = true;
    if (c->head == H_TOKEN && !present(root, "classifier_dropout"))
        c->cls_p = c->resid_p;
    return MP_OK;
}

/* Helium: o_proj is Linear(hidden_size, hidden_size), so the heads must fill the hidden size
 * (transformers' forward fails otherwise). */
static enum mp_status helium_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    (void)root;
    if (c->heads * c->head_dim != c->hidden)
        return mp_fail(d, MP_ERR_MODEL, "%s: head_dim: %llu heads x %llu differ from hidden_size %llu (Helium's "
                       "o_proj is hidden_size x hidden_size)", path, (unsigned long long)c->heads,
                       (unsigned long long)c->head_dim, (unsigned long long)c->hidden);
    return MP_OK;
}

/* An image size or a patch size: one integer, or [height, width]. */
static enum mp_status read_size2(const cJSON *root, const char *key, uint64_t *h, uint64_t *w, const char *path,
                                 struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v))
        return MP_OK;
    if (cJSON_IsArray(v)) {
        const cJSON *a = cJSON_GetArrayItem(v, 0), *b = cJSON_GetArrayItem(v, 1);
        if (cJSON_GetArraySize(v) != 2 || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) || !(a->valuedouble >= 1) ||
            !(b->valuedouble >= 1) || a->valuedouble > (double)MP_DIM_MAX || b->valuedouble > (double)MP_DIM_MAX ||
            a->valuedouble != (double)(uint64_t)a->valuedouble || b->valuedouble != (double)(uint64_t)b->valuedouble)
            return mp_fail(d, MP_ERR_MODEL, "%s: %s: expected a positive integer or [height, width]", path, key);
        *h = (uint64_t)a->valuedouble;
        *w = (uint64_t)b->valuedouble;
        return MP_OK;
    }
    enum mp_status st = read_pos(root, key, false, MP_DIM_MAX, h, path, d);
    *w = *h;
    return st;
}

/* ViT (ViTConfig, ViTEmbeddings): image_size (224), patch_size (16), num_channels (3); the
 * sequence is (H / patch) * (W / patch) + 1 (the class token).  head_dim is read when given
 * (ViTAttention's getattr); the bare ViTModel has the pooler (pooler_output_size, pooler_act). */
static enum mp_status vit_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    uint64_t ph = 16, pw = 16;
    c->channels = 3;
    c->image_h = c->image_w = 224;
    c->pooler_out = c->hidden;
    c->pooler_act = MP_ACT_TANH;
    enum mp_status st;
    if ((st = read_size2(root, "image_size", &c->image_h, &c->image_w, path, d)) != MP_OK ||
        (st = read_size2(root, "patch_size", &ph, &pw, path, d)) != MP_OK ||
        (st = read_pos(root, "num_channels", false, MP_DIM_MAX, &c->channels, path, d)) != MP_OK ||
        (st = read_pos(root, "pooler_output_size", false, MP_DIM_MAX, &c->pooler_out, path, d)) != MP_OK ||
        (st = read_act(root, "pooler_act", &c->pooler_act, path, d)) != MP_OK)
        return st;
    if (ph != pw)
        return mp_fail(d, MP_ERR_MODEL, "%s: patch_size: %llu x %llu is not supported (square patches only)", path,
                       (unsigned long long)ph, (unsigned long long)pw);
    if (c->image_h % ph || c->image_w % pw)
        return mp_fail(d, MP_ERR_MODEL, "%s: patch_size: %llu does not divide image_size %llu x %llu", path,
                       (unsigned long long)ph, (unsigned long long)c->image_h, (unsigned long long)c->image_w);
    c->patch = ph;
    if (present(root, "head_dim"))
        return read_pos(root, "head_dim", true, MP_DIM_MAX, &c->head_dim, path, d);
    return MP_OK;
}

static bool layer_sliding(const struct hf *c, uint64_t i);
static bool layer_rope(const struct hf *c, uint64_t i);

/* Layer types (full / sliding attention): layer_types when given (at least one entry per layer,
 * each "full_attention" or "sliding_attention"), else the class default — every swa_every-th
 * layer full, the others sliding (sliding_window_pattern overrides swa_every where the class
 * reads it).  transformers builds one 4-D eager mask per distinct type among the layers
 * (Gemma2/3, OLMo3, EXAONE 4: both kinds as soon as there are enough layers). */
static enum mp_status read_mask_kinds(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    bool llama4 = !strcmp(c->f->type, "llama4_text"); /* its types: full and chunked (llama4_hook) */
    c->mask_kinds = 1;
    c->swa_every = c->f->swa_every;
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || (uint64_t)cJSON_GetArraySize(lt) < c->layers)
            return mp_fail(d, MP_ERR_MODEL, "%s: layer_types: expected a list of at least %llu layer types", path,
                           (unsigned long long)c->layers);
        int i = 0;
        for (const cJSON *e = lt->child; e; e = e->next, i++)
            if (!cJSON_IsString(e) || (strcmp(e->valuestring, "full_attention") &&
                                       strcmp(e->valuestring, llama4 ? "chunked_attention" : "sliding_attention")))
                return mp_fail(d, MP_ERR_MODEL, "%s: layer_types[%d]: expected \"full_attention\" or "
                               "\"%s\"", path, i, llama4 ? "chunked_attention" : "sliding_attention");
        c->layer_types = lt;
    } else if (c->f->k_swa_every) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, c->f->k_swa_every);
        if (v && !cJSON_IsNull(v) && !cJSON_IsNumber(v)) /* EXAONE 4 32B's "LLLG": read only with layer_types */
            return mp_fail(d, MP_ERR_MODEL, "%s: %s: expected a positive integer when layer_types is not given",
                           path, c->f->k_swa_every);
        enum mp_status st = read_pos(root, c->f->k_swa_every, false, MP_DIM_MAX, &c->swa_every, path, d);
        if (st != MP_OK)
            return st;
    }
    bool first = layer_sliding(c, 0);
    for (uint64_t i = 1; i < c->layers; i++)
        if (layer_sliding(c, i) != first)
            c->mask_kinds = 2;
    return MP_OK;
}

/* Whether decoder layer i is a sliding-window layer (its type; layer_window() has its window). */
static bool layer_sliding(const struct hf *c, uint64_t i)
{
    if (c->layer_types)
        return !strcmp(list_item(c->layer_types, i, c->lt_at)->valuestring, "sliding_attention");
    return c->swa_every > 1 && (i + 1) % c->swa_every != 0;
}

/* Whether decoder layer i applies the rotary embedding (NoPE layers do not). */
static bool layer_rope(const struct hf *c, uint64_t i)
{
    if (!c->rope)
        return false;
    if (c->no_rope)
        return list_item(c->no_rope, i, c->nr_at)->valueint != 0;
    if (c->nope_every)
        return (i + 1) % c->nope_every != 0;
    return !c->rope_sliding_only || layer_sliding(c, i);
}

/* no_rope_layers (1: the layer has rotary, 0: NoPE), at least one entry per layer, or else
 * no_rope_layer_interval (default 4: every 4th layer NoPE).  empty_default: an empty list means
 * the interval (Llama4TextConfig); SmolLM3's config takes a list or null. */
static enum mp_status no_rope_layers(const cJSON *root, struct hf *c, bool empty_default, const char *path,
                                     struct mp_diag *d)
{
    const cJSON *nr = cJSON_GetObjectItemCaseSensitive(root, "no_rope_layers");
    c->nope_every = 4;
    if (!nr || cJSON_IsNull(nr) || (empty_default && cJSON_IsArray(nr) && cJSON_GetArraySize(nr) == 0))
        return read_pos(root, "no_rope_layer_interval", false, MP_DIM_MAX, &c->nope_every, path, d);
    if (!cJSON_IsArray(nr) || (uint64_t)cJSON_GetArraySize(nr) < c->layers)
        return mp_fail(d, MP_ERR_MODEL, "%s: no_rope_layers: expected a list of at least %llu entries (0 or 1)", path,
                       (unsigned long long)c->layers);
    int i = 0;
    for (const cJSON *e = nr->child; e; e = e->next, i++)
        if (!cJSON_IsNumber(e) || (e->valuedouble != 0 && e->valuedouble != 1))
            return mp_fail(d, MP_ERR_MODEL, "%s: no_rope_layers[%d]: expected 0 or 1", path, i);
    c->no_rope = nr;
    return MP_OK;
}

/* SmolLM3: no_rope_layers (one 0 / 1 per layer, 1 = rotary), else no rotary on every
 * no_rope_layer_interval-th layer (4).  use_sliding_window makes the NoPE layers sliding. */
static enum mp_status smollm3_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    enum mp_status st = no_rope_layers(root, c, false, path, d);
    if (st != MP_OK)
        return st;
    bool swa = false;
    if ((st = mp_json_bool(root, "use_sliding_window", &swa, path, "", d)) != MP_OK)
        return st;
    if (swa && present(root, "sliding_window") && !c->layer_types) { /* NoPE layers slide */
        c->mask_kinds = 1;
        for (uint64_t i = 1; i < c->layers; i++)
            if (layer_rope(c, i) != layer_rope(c, 0))
                c->mask_kinds = 2;
    }
    return MP_OK;
}

/* EXAONE 4: with a sliding_window, rotary on the sliding layers only; without one, every layer
 * is full attention with rotary — transformers then needs layer_types (its default pattern
 * divides by zero), as it needs an integer sliding_window_pattern (e.g. not "LLLG"). */
static enum mp_status exaone4_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    bool window = present(root, "sliding_window") || !cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (!c->layer_types && !window)
        return mp_fail(d, MP_ERR_MODEL, "%s: layer_types: needed when sliding_window is null (transformers' "
                       "default pattern is undefined then)", path);
    c->rope_sliding_only = window;
    return MP_OK;
}

/* Ministral (MinistralConfig, MinistralModel): MinistralConfig leaves head_dim None, which
 * MinistralAttention cannot size, and the model builds the sliding-window mask whatever the layer
 * types, which fails without a sliding_window; both masks are built, so eager attention gets two
 * (b, 1, s, s) masks even when every layer has one type. */
static enum mp_status ministral_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    if (!present(root, "head_dim"))
        return mp_fail(d, MP_ERR_MODEL, "%s: head_dim: missing (MinistralConfig leaves it None and "
                       "MinistralAttention cannot size q/k/v without it)", path);
    if (!c->window)
        return mp_fail(d, MP_ERR_MODEL, "%s: sliding_window: null is not supported (MinistralModel always builds "
                       "the sliding-window mask, which needs it)", path);
    c->mask_kinds = 2;
    return MP_OK;
}

/* OLMo: clip_qkv (a positive number, or null for none): q, k and v clamped in place after their
 * projections; clamp_ keeps a copy of each for backward (ir/lower_elementwise.c lower_clamp). */
static enum mp_status olmo_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    double clip = 0;
    enum mp_status st = read_softcap(root, "clip_qkv", &clip, path, d);
    c->clip_qkv = clip > 0;
    return st;
}

static enum mp_status moe_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d);

/* OLMoE: OLMo's clip_qkv and the mixture of experts. */
static enum mp_status olmoe_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    enum mp_status st = olmo_hook(root, c, path, d);
    return st == MP_OK ? moe_hook(root, c, path, d) : st;
}

/* A size key whose explicit null means 0 (DeepSeek's q_lora_rank: no q bottleneck); absent
 * leaves *out at the class default. */
static enum mp_status read_pos_or_null(const cJSON *root, const char *key, uint64_t *out, const char *path,
                                       struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (v && cJSON_IsNull(v)) {
        *out = 0;
        return MP_OK;
    }
    return read_pos(root, key, false, MP_DIM_MAX, out, path, d);
}

/* Sliding-window attention (enum win): the window after the config class's rules.  It changes
 * memory once the sequence reaches it: the model then gives SDPA a mask instead of is_causal
 * (ir/lower_attention.c sdpa_masked). */
static enum mp_status read_window(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    const struct family *f = c->f;
    if (f->window == W_NONE)
        return MP_OK;
    uint64_t w = f->window_default;
    bool use = true;
    c->window_max = 28; /* Qwen2Config / Qwen3Config / Qwen2MoeConfig max_window_layers */
    enum mp_status st = read_pos_or_null(root, "sliding_window", &w, path, d);
    if (st == MP_OK && f->k_use_window) {
        use = false;
        st = mp_json_bool(root, "use_sliding_window", &use, path, "", d);
    }
    if (st == MP_OK && (f->window == W_FROM_MAX || f->window == W_ODD_BELOW_MAX))
        st = read_pos(root, "max_window_layers", false, MP_DIM_MAX, &c->window_max, path, d);
    c->window = use ? w : 0;
    return st;
}

/* The window of decoder layer i (0: full attention). */
static uint64_t layer_window(const struct hf *c, uint64_t i)
{
    if (!c->window)
        return 0;
    if (c->layer_types && c->f->window != W_ALL)
        return layer_sliding(c, i) ? c->window : 0;
    switch (c->f->window) {
    case W_ALL:
        return c->window;
    case W_TYPES:
        return layer_sliding(c, i) ? c->window : 0;
    case W_FROM_MAX:
        return i >= c->window_max ? c->window : 0;
    case W_ODD_BELOW_MAX:
        return i % 2 == 0 && i < c->window_max ? c->window : 0;
    case W_NOPE:
        return layer_rope(c, i) ? 0 : c->window;
    case W_TYPES_OR_ALL:
        return c->window;
    case W_NONE:
        break;
    }
    return 0;
}

/* Qwen-MoE's mlp_only_layers: layer indices in [0, layers) that keep the dense MLP. */
static enum mp_status read_mlp_only(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
    if (!a || cJSON_IsNull(a))
        return MP_OK;
    if (!cJSON_IsArray(a))
        return mp_fail(d, MP_ERR_MODEL, "%s: mlp_only_layers: expected a list of layer indices", path);
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++)
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble != floor(e->valuedouble) ||
            e->valuedouble >= (double)c->layers)
            return mp_fail(d, MP_ERR_MODEL, "%s: mlp_only_layers[%d]: expected a layer index below %llu", path, i,
                           (unsigned long long)c->layers);
    c->mlp_only = a;
    return MP_OK;
}

/* Mixture of experts, as transformers 5.23 builds it (Mixtral, Qwen2-MoE, Qwen3-MoE,
 * DeepSeek-V2/V3; OLMoE and GraniteMoE as 5.24 builds them): experts, top-k, expert and shared-expert widths, the router, which layers
 * are MoE, and DeepSeek's multi-head latent attention.  Defaults are the config classes'.
 * Refused (they change memory and are not modelled): output_router_logits (the auxiliary
 * loss keeps every layer's router logits), router_jitter_noise > 0 (Mixtral multiplies the
 * input by a saved random tensor), moe_layer_freq other than 1 (transformers ignores it;
 * DeepSeek's own code would not).  Read and not memory: routed_scaling_factor (a Python
 * float), n_group / topk_group (a transient mask), rope_interleave (rotary temporaries). */
static enum mp_status moe_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    const char *t = c->f->type;
    bool mixtral = !strcmp(t, "mixtral"), qwen2 = !strcmp(t, "qwen2_moe"), ds2 = !strcmp(t, "deepseek_v2");
    bool ds3 = !strcmp(t, "deepseek_v3"), ds = ds2 || ds3, olmoe = !strcmp(t, "olmoe");
    bool granite = !strcmp(t, "granitemoe"), phimoe = !strcmp(t, "phimoe");
    bool dense_width = mixtral || olmoe || granite || phimoe; /* experts as wide as intermediate_size */
    enum mp_status st;
    bool aux = false;
    double jitter = 0, eps = 0.01, input_jitter = 0;
    if ((st = mp_json_bool(root, "output_router_logits", &aux, path, "", d)) != MP_OK ||
        (mixtral && (st = mp_json_prob(root, "router_jitter_noise", &jitter, path, "", d)) != MP_OK))
        return st;
    /* PhiMoE: router_jitter_noise is the sparsemixer's threshold (a Python float: no memory);
     * input_jitter_noise > 0 multiplies the MoE input in place by uniform noise, twice (the block,
     * then the router), each noise tensor saved by MulBackward0 (lower_mlp.c) */
    if (phimoe && ((st = mp_json_prob(root, "router_jitter_noise", &eps, path, "", d)) != MP_OK ||
                   (st = mp_json_prob(root, "input_jitter_noise", &input_jitter, path, "", d)) != MP_OK))
        return st;
    c->moe.input_jitter = input_jitter > 0;
    if (aux)
        return mp_fail(d, MP_ERR_MODEL, "%s: output_router_logits: true is not supported (the router auxiliary "
                       "loss over every layer's logits is not modelled)", path);
    if (jitter > 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: router_jitter_noise: %g is not supported (the saved noise tensor is "
                       "not modelled; 0 is)", path, jitter);
    /* OlmoeConfig maps num_local_experts to num_experts (attribute_map): either key */
    const char *ek = mixtral || granite || phimoe ? "num_local_experts" : ds ? "n_routed_experts"
                     : olmoe && !present(root, "num_experts") ? "num_local_experts" : "num_experts";
    c->moe.experts = mixtral || granite ? 8 : phimoe ? 16 : qwen2 ? 60 : ds2 || olmoe ? 64 : ds3 ? 256 : 128;
    c->moe.top_k = mixtral || granite || phimoe ? 2 : qwen2 ? 4 : ds2 ? 0 : 8; /* DeepseekV2Config: None */
    c->moe.expert_ffn = dense_width ? c->ffn : qwen2 ? 1408 : ds2 ? 1407 : ds3 ? 2048 : 768;
    c->moe.norm_topk = mixtral || ds3;
    c->moe.router = mixtral ? MP_ROUTER_SOFTMAX : ds2 ? MP_ROUTER_FP32_SOFTMAX : ds3 ? MP_ROUTER_FP32_SIGMOID
                : granite ? MP_ROUTER_TOPK_SOFTMAX : phimoe ? MP_ROUTER_SPARSEMIXER : MP_ROUTER_SOFTMAX_CAST;
    c->sparse_step = 1;
    if ((st = mp_json_u64(root, ek, false, MP_DIM_MAX, &c->moe.experts, path, "", d)) != MP_OK ||
        (st = read_pos(root, "num_experts_per_tok", false, MP_DIM_MAX, &c->moe.top_k, path, d)) != MP_OK ||
        (!dense_width && (st = read_pos(root, "moe_intermediate_size", false, MP_DIM_MAX, &c->moe.expert_ffn, path, d)) != MP_OK) ||
        (!ds2 && !mixtral && !granite && !phimoe &&
         (st = mp_json_bool(root, "norm_topk_prob", &c->moe.norm_topk, path, "", d)) != MP_OK))
        return st;
    if (phimoe) /* sparsemixer always picks two experts (its top_k argument is unused) */
        c->moe.top_k = 2;
    if (c->moe.experts && !c->moe.top_k)
        return mp_fail(d, MP_ERR_MODEL, "%s: num_experts_per_tok: missing (expected a positive integer)", path);
    if (c->moe.top_k > c->moe.experts && c->moe.experts)
        return mp_fail(d, MP_ERR_MODEL, "%s: num_experts_per_tok: %llu exceeds %s %llu", path,
                       (unsigned long long)c->moe.top_k, ek, (unsigned long long)c->moe.experts);
    if (qwen2) { /* one shared expert with a sigmoid gate, run first */
        c->moe.shared_ffn = 5632;
        c->moe.shared_gate = c->moe.shared_first = true;
        if ((st = read_pos(root, "shared_expert_intermediate_size", false, MP_DIM_MAX, &c->moe.shared_ffn, path, d)) != MP_OK)
            return st;
    }
    if (!dense_width && !ds && ((st = read_pos(root, "decoder_sparse_step", false, MP_DIM_MAX, &c->sparse_step, path, d)) !=
                            MP_OK || (st = read_mlp_only(root, c, path, d)) != MP_OK))
        return st;
    if (!ds)
        return MP_OK;

    /* DeepSeek: n_shared_experts experts in one MLP, dense layers first, MLA */
    uint64_t shared = ds2 ? 2 : 1, freq = 1, groups = ds3 ? 8 : 1, tg = ds3 ? 4 : 1;
    c->first_dense = ds3 ? 3 : 0;
    if ((st = mp_json_u64(root, "n_shared_experts", false, MP_DIM_MAX, &shared, path, "", d)) != MP_OK ||
        (st = mp_json_u64(root, "first_k_dense_replace", false, MP_DIM_MAX, &c->first_dense, path, "", d)) != MP_OK ||
        (st = read_pos(root, "moe_layer_freq", false, MP_DIM_MAX, &freq, path, d)) != MP_OK ||
        (st = read_pos(root, "n_group", false, MP_DIM_MAX, &groups, path, d)) != MP_OK ||
        (st = read_pos(root, "topk_group", false, MP_DIM_MAX, &tg, path, d)) != MP_OK)
        return st;
    if (freq != 1)
        return mp_fail(d, MP_ERR_MODEL, "%s: moe_layer_freq: %llu is not supported (transformers makes every layer "
                       "from first_k_dense_replace on an MoE layer; only 1 agrees with that)", path,
                       (unsigned long long)freq);
    if (!mp_mul_u64(c->moe.expert_ffn, shared, &c->moe.shared_ffn) || c->moe.shared_ffn > MP_DIM_MAX)
        return mp_fail(d, MP_ERR_RANGE, "%s: n_shared_experts: %llu x moe_intermediate_size is too large", path,
                       (unsigned long long)shared);
    const char *method = "greedy";
    if (ds2 && (method = mp_json_str(root, "topk_method", &st, path, "", d), st != MP_OK))
        return st;
    if (ds2 && !method)
        method = "greedy";
    bool grouped = ds3 || !strcmp(method, "group_limited_greedy");
    if (ds2 && !grouped && strcmp(method, "greedy"))
        return mp_fail(d, MP_ERR_MODEL, "%s: topk_method: '%s' is not supported (supported: greedy, "
                       "group_limited_greedy)", path, method);
    c->moe.route_mask = ds2 && grouped;
    if (grouped && c->moe.experts && (c->moe.experts % groups || tg > groups || (ds3 && c->moe.experts / groups < 2)))
        return mp_fail(d, MP_ERR_MODEL, "%s: n_group: %llu groups (topk_group %llu) do not split %llu experts%s",
                       path, (unsigned long long)groups, (unsigned long long)tg, (unsigned long long)c->moe.experts,
                       ds3 ? " into groups of two or more" : "");
    if (c->kv_heads != c->heads)
        return mp_fail(d, MP_ERR_MODEL, "%s: num_key_value_heads: %llu is not supported (multi-head latent "
                       "attention expands keys and values to every head: %llu)", path,
                       (unsigned long long)c->kv_heads, (unsigned long long)c->heads);
    c->mla.q_lora = 1536;
    c->mla.kv_lora = 512;
    c->mla.rope_dim = 64;
    c->mla.nope_dim = c->mla.v_dim = 128;
    c->mla.rope_complex = ds2;
    if ((st = read_pos_or_null(root, "q_lora_rank", &c->mla.q_lora, path, d)) != MP_OK ||
        (st = read_pos(root, "kv_lora_rank", false, MP_DIM_MAX, &c->mla.kv_lora, path, d)) != MP_OK ||
        (st = read_pos(root, "qk_rope_head_dim", false, MP_DIM_MAX, &c->mla.rope_dim, path, d)) != MP_OK ||
        (st = read_pos(root, "qk_nope_head_dim", false, MP_DIM_MAX, &c->mla.nope_dim, path, d)) != MP_OK ||
        (st = read_pos(root, "v_head_dim", false, MP_DIM_MAX, &c->mla.v_dim, path, d)) != MP_OK)
        return st;
    if (c->mla.rope_dim % 2)
        return mp_fail(d, MP_ERR_MODEL, "%s: qk_rope_head_dim: %llu is odd (rotary pairs need an even width)", path,
                       (unsigned long long)c->mla.rope_dim);
    c->head_dim = c->mla.nope_dim + c->mla.rope_dim;
    return MP_OK;
}

/* Llama 4's text model (transformers 5.24 llama4/configuration_llama4.py Llama4TextConfig and
 * __post_init__, modeling_llama4.py; docs/memory-facts.md#llama4):
 *   - MoE layers: moe_layers, else every interleave_moe_layer_step-th layer from step - 1; each has
 *     num_local_experts experts of intermediate_size, top num_experts_per_tok, the shared expert
 *     (intermediate_size) and Llama4Router (MP_ROUTER_DENSE_SIGMOID: every token through every
 *     expert); the other layers a dense MLP of intermediate_size_mlp;
 *   - rotary layers: no_rope_layers (1: rotary; an empty list means the default), else every
 *     no_rope_layer_interval-th layer NoPE; the rotary is an fp32 complex product, then (use_qk_norm)
 *     the L2 norms; NoPE layers get attn_temperature_tuning's scaled q;
 *   - layer_types (full / chunked), else the rotary layers chunked when attention_chunk_size is set.
 * Refused: output_router_logits (the auxiliary loss is not modelled).  Read, no memory:
 * floor_scale, attn_scale (Python floats), router_jitter_noise (Llama4Router does not read it). */
static enum mp_status llama4_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    enum mp_status st;
    bool aux = false;
    c->llama4 = true;
    c->l2_qk = c->temp_tuning = true;
    c->moe.experts = 16;
    c->moe.top_k = 1;
    c->moe.expert_ffn = c->moe.shared_ffn = c->ffn;
    c->moe.router = MP_ROUTER_DENSE_SIGMOID;
    c->dense_ffn = 16384;
    c->chunk = 8192;
    c->sparse_step = 1;
    c->mla.rope_complex = true;
    if ((st = mp_json_bool(root, "output_router_logits", &aux, path, "", d)) != MP_OK ||
        (st = mp_json_bool(root, "use_qk_norm", &c->l2_qk, path, "", d)) != MP_OK ||
        (st = mp_json_bool(root, "attn_temperature_tuning", &c->temp_tuning, path, "", d)) != MP_OK ||
        (st = read_pos(root, "num_local_experts", false, MP_DIM_MAX, &c->moe.experts, path, d)) != MP_OK ||
        (st = read_pos(root, "num_experts_per_tok", false, MP_DIM_MAX, &c->moe.top_k, path, d)) != MP_OK ||
        (st = read_pos(root, "intermediate_size_mlp", false, MP_DIM_MAX, &c->dense_ffn, path, d)) != MP_OK ||
        (st = read_pos(root, "interleave_moe_layer_step", false, MP_DIM_MAX, &c->sparse_step, path, d)) != MP_OK)
        return st;
    if (aux)
        return mp_fail(d, MP_ERR_MODEL, "%s: output_router_logits: true is not supported (the router auxiliary "
                       "loss over every layer's logits is not modelled)", path);
    if (c->moe.top_k > c->moe.experts)
        return mp_fail(d, MP_ERR_MODEL, "%s: num_experts_per_tok: %llu exceeds num_local_experts %llu", path,
                       (unsigned long long)c->moe.top_k, (unsigned long long)c->moe.experts);
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(root, "attention_chunk_size");
    if (ch && cJSON_IsNull(ch))
        c->chunk = 0;
    else if ((st = read_pos(root, "attention_chunk_size", false, MP_DIM_MAX, &c->chunk, path, d)) != MP_OK)
        return st;
    const cJSON *ml = cJSON_GetObjectItemCaseSensitive(root, "moe_layers");
    if (ml && !cJSON_IsNull(ml)) {
        if (!cJSON_IsArray(ml))
            return mp_fail(d, MP_ERR_MODEL, "%s: moe_layers: expected a list of layer indices", path);
        int i = 0;
        for (const cJSON *e = ml->child; e; e = e->next, i++)
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble != floor(e->valuedouble))
                return mp_fail(d, MP_ERR_MODEL, "%s: moe_layers[%d]: expected a layer index", path, i);
        c->moe_list = ml;
    }
    /* no_rope_layers: Llama4TextConfig takes an empty list (or null) for the default */
    if ((st = no_rope_layers(root, c, true, path, d)) != MP_OK)
        return st;
    if (c->layer_types && !c->chunk)
        for (uint64_t i = 0; i < c->layers; i++)
            if (!strcmp(list_item(c->layer_types, i, c->lt_at)->valuestring, "chunked_attention"))
                return mp_fail(d, MP_ERR_MODEL, "%s: layer_types[%llu]: chunked_attention without an "
                               "attention_chunk_size", path, (unsigned long long)i);
    /* eager attention: one (b, 1, s, s) mask per distinct layer type (Llama4TextModel.forward) */
    bool first = true;
    c->mask_kinds = 1;
    for (uint64_t i = 0; i < c->layers; i++) {
        bool chunked = c->layer_types ? !strcmp(list_item(c->layer_types, i, c->lt_at)->valuestring,
                                                "chunked_attention")
                                      : layer_rope(c, i) && c->chunk;
        if (i == 0)
            first = chunked;
        else if (chunked != first)
            c->mask_kinds = 2;
    }
    return MP_OK;
}

/* Whether decoder layer i is an MoE layer. */
static bool moe_layer(const struct hf *c, uint64_t i)
{
    if (c->moe_list) {
        for (const cJSON *e = c->moe_list->child; e; e = e->next)
            if ((uint64_t)e->valuedouble == i)
                return true;
        return false;
    }
    if (!c->moe.experts || i < c->first_dense || (i + 1) % c->sparse_step != 0)
        return false;
    for (const cJSON *e = c->mlp_only ? c->mlp_only->child : NULL; e; e = e->next)
        if ((uint64_t)e->valuedouble == i)
            return false;
    return true;
}

/* MllamaTextConfig's cross_attention_layers (default [3, 8, ..., 38]): MllamaTextModel builds a
 * MllamaCrossAttentionDecoderLayer at every index of the list below num_hidden_layers (others are
 * never matched), and its forward skips those layers when there are no cross_attention_states and
 * none cached (modeling_mllama.py MllamaTextModel.forward: `continue`), as in a text-only step:
 * they run nothing, their weights are loaded and idle (mp_hf_vision_modules;
 * docs/memory-facts.md#mllama-text-only). */
static enum mp_status mllama_text_hook(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    static const uint64_t deflt[] = {3, 8, 13, 18, 23, 28, 33, 38};
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "cross_attention_layers");
    if (a && !cJSON_IsNull(a) && !cJSON_IsArray(a))
        return mp_fail(d, MP_ERR_MODEL, "%s: text_config.cross_attention_layers: expected a list of layer indices",
                       path);
    c->cross = calloc(c->layers, 1);
    if (!c->cross)
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", path);
    c->n_cross = 0;
    size_t n = cJSON_IsArray(a) ? (size_t)cJSON_GetArraySize(a) : sizeof deflt / sizeof deflt[0];
    const cJSON *e = cJSON_IsArray(a) ? a->child : NULL;
    for (size_t i = 0; i < n; i++, e = e ? e->next : NULL) {
        double v = e ? e->valuedouble : (double)deflt[i];
        if (e && (!cJSON_IsNumber(e) || v != floor(v)))
            return mp_fail(d, MP_ERR_MODEL, "%s: text_config.cross_attention_layers[%zu]: expected an integer", path,
                           i);
        if (v >= 0 && v < (double)c->layers && !c->cross[(uint64_t)v]) {
            c->cross[(uint64_t)v] = 1;
            c->n_cross++;
        }
    }
    if (c->n_cross == c->layers)
        return mp_fail(d, MP_ERR_MODEL, "%s: text_config.cross_attention_layers: every one of the %llu layers is a "
                       "cross-attention layer: a text-only step would run none (not modelled)", path,
                       (unsigned long long)c->layers);
    return MP_OK;
}

static enum mp_status read_config(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    family_defaults(c);
    enum mp_status st;
    if ((st = read_sizes(root, c, path, d)) != MP_OK || (st = read_rotary(root, c, path, d)) != MP_OK ||
        (st = read_options(root, c, path, d)) != MP_OK || (st = read_head(root, c, path, d)) != MP_OK ||
        (st = read_mask_kinds(root, c, path, d)) != MP_OK || (st = read_window(root, c, path, d)) != MP_OK)
        return st;
    return c->f->hook ? c->f->hook(root, c, path, d) : MP_OK;
}

/* ---- the weights' sizes -------------------------------------------------------------------
 * Every field is at most MP_DIM_MAX; one weight is too (as the memplan reader caps each of its
 * weights), so that the builder's and estimator's sums of weights stay far inside 64 bits. */

/* A factor of a weight's element count: its value and the config key that gives it (NULL: a
 * constant of the layout). */
struct factor {
    const char *key;
    uint64_t v;
};

/* A weight of n factors' product elements is at most MP_DIM_MAX; else the error names the key
 * of its largest factor (fs[0] on a tie). */
static enum mp_status cap_weight(const char *what, const struct factor *fs, size_t n, const char *path,
                                 struct mp_diag *d)
{
    uint64_t w = 1;
    bool ok = true;
    const struct factor *big = &fs[0];
    for (size_t i = 0; i < n; i++) {
        ok = ok && mp_mul_u64(w, fs[i].v, &w);
        if (fs[i].key && fs[i].v > big->v)
            big = &fs[i];
    }
    if (ok && w <= MP_DIM_MAX)
        return MP_OK;
    return mp_fail(d, MP_ERR_RANGE, "%s: %s: the %s weight is too large (at most %llu elements)", path, big->key, what,
                   (unsigned long long)MP_DIM_MAX);
}

#define CAP(what, ...)                                                                                             \
    cap_weight(what, (const struct factor[]){__VA_ARGS__},                                                         \
               sizeof((const struct factor[]){__VA_ARGS__}) / sizeof(struct factor), path, d)

/* The config's weights, each within the cap (c read whole; T5: buckets its relative position
 * buckets, else 0). */
static enum mp_status check_weights(const cJSON *root, const struct hf *c, uint64_t buckets, const char *path,
                                    struct mp_diag *d)
{
    const struct family *f = c->f;
    const char *t = f->type;
    bool t5 = f->enc_dec, mixtral = !strcmp(t, "mixtral"), ds = !strncmp(t, "deepseek", 8);
    struct factor h = {t5 ? "d_model" : key2(root, f->k_hidden, "hidden_size"), c->hidden};
    struct factor heads = {t5 ? "num_heads" : key2(root, f->k_heads, "num_attention_heads"), c->heads};
    struct factor ffn = {t5 ? "d_ff" : key_or(f->k_ffn, "intermediate_size"), c->ffn};
    struct factor qkv = heads; /* a fused projection makes q, k and v */
    if (c->fused_qkv)
        qkv.v = c->heads + 2 * c->kv_heads;
    enum mp_status st;
    if ((st = CAP("embedding", {"vocab_size", c->vocab + f->emb_extra_rows}, h)) != MP_OK ||
        (st = CAP("MLP", ffn, h, {NULL, f->fused_gate_up ? 2 : 1})) != MP_OK ||
        (st = CAP("token type embedding", {"type_vocab_size", c->type_vocab}, h)) != MP_OK ||
        (st = CAP("classifier", {"num_labels", c->labels}, h)) != MP_OK ||
        (st = CAP("relative attention bias", {"relative_attention_num_buckets", buckets}, heads)) != MP_OK)
        return st;
    if (c->mla.kv_lora) { /* MLA: its own projections */
        struct factor ql = {"q_lora_rank", c->mla.q_lora}, kvl = {"kv_lora_rank", c->mla.kv_lora};
        if ((c->mla.q_lora && ((st = CAP("q_a_proj", ql, h)) != MP_OK ||
                           (st = CAP("q_b_proj", heads, ql, {"qk_nope_head_dim", c->head_dim})) != MP_OK)) ||
            (!c->mla.q_lora && (st = CAP("q_proj", heads, h, {"qk_nope_head_dim", c->head_dim})) != MP_OK) ||
            (st = CAP("kv_a_proj", {"kv_lora_rank", c->mla.kv_lora + c->mla.rope_dim}, h)) != MP_OK ||
            (st = CAP("kv_b_proj", heads, kvl, {"v_head_dim", c->mla.nope_dim + c->mla.v_dim})) != MP_OK ||
            (st = CAP("o_proj", heads, {"v_head_dim", c->mla.v_dim}, h)) != MP_OK)
            return st;
    } else if ((st = CAP("attention projection", h, qkv, {t5 ? "d_kv" : "head_dim", c->head_dim})) != MP_OK) {
        return st;
    }
    if (c->learned_pos &&
        (st = CAP("position embedding", {key2(root, f->k_pos, "max_position_embeddings"), c->positions}, h)) != MP_OK)
        return st;
    if (c->moe.experts) { /* the fused experts: (E, 2 x F, h) gate_up and (E, h, F) down */
        bool local = mixtral || !strcmp(t, "phimoe") || !strcmp(t, "granitemoe"); /* num_local_experts x ffn */
        struct factor e = {local ? "num_local_experts" : ds ? "n_routed_experts" : "num_experts", c->moe.experts};
        if ((st = CAP("experts", e, {local ? ffn.key : "moe_intermediate_size", c->moe.expert_ffn}, h, {NULL, 2})) !=
                MP_OK ||
            (st = CAP("shared expert", {ds ? "n_shared_experts" : "shared_expert_intermediate_size", c->moe.shared_ffn},
                      h)) != MP_OK)
            return st;
    }
    if (f->vision) {
        uint64_t patches = 0; /* (beyond 64 bits: left at 0 for image_size's own check) */
        if (c->patch && !mp_mul_u64(c->image_h / c->patch, c->image_w / c->patch, &patches))
            patches = 0;
        if ((st = CAP("patch embedding", {"num_channels", c->channels}, h, {"patch_size", c->patch},
                      {"patch_size", c->patch})) != MP_OK ||
            (st = CAP("position embedding", {"image_size", patches + 1}, h)) != MP_OK ||
            (st = CAP("pooler", {"pooler_output_size", c->pooler_out}, h)) != MP_OK)
            return st;
    }
    return MP_OK;
}

#undef CAP

/* ---- lowering ------------------------------------------------------------------------ */

static void set_name(struct mp_layer *l, const char *name) { snprintf(l->name, sizeof l->name, "%s", name); }

static void norm_layer(struct mp_layer *l, const struct hf *c, const char *name)
{
    l->type = c->norm == MP_NORM_RMSNORM ? MP_LT_RMSNORM : MP_LT_LAYERNORM;
    l->norm.kind = c->norm;
    l->norm.bias = c->norm == MP_NORM_LAYERNORM && !c->f->norm_cfg.ln_fp32 && !c->f->norm_cfg.ln_plain;
    l->norm.rms_fp32 = c->f->norm_cfg.rms_fp32;
    l->norm.ln_fp32 = c->f->norm_cfg.ln_fp32;
    l->norm.ln_plain = c->f->norm_cfg.ln_plain;
    l->norm.ln_1p = c->f->norm_cfg.ln_1p;
    l->dim = c->hidden;
    set_name(l, name);
}

static enum mp_status add_embed(struct mp_model *m, const struct hf *c, struct mp_diag *d)
{
    const struct family *f = c->f;
    if (f->vision) { /* ViTEmbeddings: patches, class token, positions, dropout */
        struct mp_block *b = mp_model_add_block(m, "embeddings", c->emb_p > 0 ? 2 : 1);
        if (!b)
            return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
        struct mp_layer *l = b->layers;
        l->type = MP_LT_PATCH_EMBEDDING;
        l->conv.in_ch = c->channels;
        l->dim = c->hidden;
        l->conv.kernel = l->conv.stride = c->patch;
        l->emb.cls_token = true;
        set_name(l, "patch_embeddings");
        if (c->emb_p > 0) {
            l[1].type = MP_LT_DROPOUT;
            l[1].p = c->emb_p;
            set_name(&l[1], f->n_drop);
        }
        return MP_OK;
    }
    bool types = c->type_vocab > 0;
    size_t n = 1u + (c->learned_pos ? 1u : 0u) + (types ? 1u : 0u) + (f->emb_norm ? 1u : 0u) + (c->emb_p > 0 ? 1u : 0u);
    struct mp_block *b = mp_model_add_block(m, "embed", n);
    if (!b)
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
    struct mp_layer *l = b->layers;
    l->type = MP_LT_EMBEDDING;
    l->vocab = c->vocab + f->emb_extra_rows; /* (vocab_size at most MP_DIM_MAX: no overflow) */
    l->dim = c->hidden;
    l->mult = c->emb_mult;
    l->emb.scale_buffer = f->emb_sqrt;
    set_name(l++, f->n_tok);
    if (types) { /* BertEmbeddings: words + token types (ids default to zeros) + positions */
        l->type = MP_LT_EMBEDDING;
        l->vocab = c->type_vocab;
        l->dim = c->hidden;
        l->emb.id_buffer = f->id_buffers;
        l->emb.id_rows = c->positions + f->pos_offset;
        set_name(l++, "token_type_embeddings");
    }
    if (c->learned_pos) {
        l->type = MP_LT_POS_EMBEDDING;
        l->vocab = l->emb.id_rows = c->positions + f->pos_offset;
        l->emb.id_buffer = f->id_buffers;
        l->emb.id_view = f->id_views;
        l->dim = c->hidden;
        set_name(l++, f->n_pos);
    }
    if (f->emb_norm)
        norm_layer(l++, c, "LayerNorm");
    if (c->emb_p > 0) {
        l->type = MP_LT_DROPOUT;
        l->p = c->emb_p;
        set_name(l, key_or(f->n_drop, "drop"));
    }
    return MP_OK;
}

static enum mp_status add_blocks(struct mp_model *m, const struct hf *c, struct mp_diag *d)
{
    uint64_t skipped = m->idle.gc_layers; /* the vision tower's layers come first in module order */
    uint64_t unnumbered = 0;              /* of the language model's layers, since the last block */
    for (uint64_t i = 0; i < c->layers; i++) {
        if (c->cross && c->cross[i]) { /* Mllama's cross-attention layer: skipped without image states */
            skipped++;                 /* (mllama_text_hook), a GradientCheckpointingLayer all the same */
            unnumbered++;
            continue;
        }
        char name[32];
        snprintf(name, sizeof name, "h.%llu", (unsigned long long)i);
        struct mp_block *b = mp_model_add_block(m, name, 1);
        if (!b)
            return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
        b->repeat_group = 1;
        b->gc_before = skipped;
        b->num_skip = unnumbered; /* --train-blocks N names layers.N, as the block's name does */
        skipped = unnumbered = 0;
        struct mp_layer *l = b->layers;
        l->type = MP_LT_TRANSFORMER_BLOCK;
        l->dim = c->hidden;
        l->attn.heads = c->heads;
        l->attn.kv_heads = c->kv_heads;
        l->attn.head_dim = c->head_dim;
        l->attn.causal = c->causal;
        l->attn.qkv_bias = c->qkv_bias;
        l->attn.out_bias = c->out_bias;
        l->attn.fused_qkv = c->fused_qkv;
        /* the family's rotary and norm variants (rows of families[]), then this config's */
        bool rope = layer_rope(c, i);
        if (rope)
            l->rope = c->f->rope;
        l->rope.on = rope;
        l->rope.dim = c->rotary_dim;
        l->rope.cat = rope && c->f->k_rotary;
        l->rope.kinds = c->f->rope_per_type ? c->mask_kinds : 1;
        l->rope.per_sample = rope && c->mrope;
        l->rope.table_rows = c->rope_table_rows;
        l->norm = c->f->norm_cfg;
        l->norm.kind = c->norm;
        l->norm.bias = c->norm == MP_NORM_LAYERNORM && !l->norm.ln_fp32 && !l->norm.ln_plain;
        l->norm.shared = c->parallel && c->shared_norm;
        l->norm.post = c->post_norm;
        l->mlp.up_down = c->f->up_down;
        l->attn.impl = MP_ATTN_SDPA;
        l->attn.impl_set = false;
        l->attn.dropout = c->attn_p;
        l->mlp.ffn = c->dense_ffn && !moe_layer(c, i) ? c->dense_ffn : c->ffn;
        l->mlp.act = c->act;
        l->mlp.gated = c->gated;
        l->mlp.bias = c->mlp_bias;
        l->p = c->resid_p;
        l->parallel_residual = c->parallel;
        l->attn.qk_norm = c->f->qk_norm;
        l->attn.qk_norm_late = c->f->qk_norm_late;
        l->attn.clip_qkv = c->clip_qkv;
        l->attn.softmax_fp32 = !c->f->plain_softmax;
        l->mlp.fused_gate_up = c->f->fused_gate_up;
        l->attn.no_out_dropout = c->f->no_attn_out_dropout;
        l->attn.softcap = c->attn_softcap;
        l->mult = c->resid_mult;
        l->attn.qkv_split = c->qkv_split;
        l->attn.mask = c->attn_mask;
        l->attn.window = layer_window(c, i);
        if (c->llama4) { /* chunked attention on the chunked layers: SDPA gets the same (b, 1, s, s) mask
                          * as a window of that size, from a sequence of that length on (llama4_hook) */
            bool chunked = c->layer_types ? !strcmp(list_item(c->layer_types, i, c->lt_at)->valuestring,
                                                    "chunked_attention")
                                          : rope && c->chunk;
            l->attn.window = chunked ? c->chunk : 0;
            l->attn.qk_norm = rope && c->l2_qk ? MP_QK_NORM_L2 : MP_QK_NORM_NONE;
            l->attn.qk_norm_late = l->attn.qk_norm != MP_QK_NORM_NONE; /* (after the rotary) */
            l->attn.temp_tuning = !rope && c->temp_tuning;
        }
        /* transformers' eager path always gets a 4-D causal mask (and a sliding-window one for
         * Gemma2/3's mixed layer types) */
        l->attn.eager_mask = c->causal ? c->mask_kinds : 0;
        l->attn.qk_fp32 = c->qk_fp32;
        if (moe_layer(c, i))
            l->moe = c->moe;
        l->mla = c->mla;
        l->mla.rope_complex = c->mla.rope_complex && (c->mla.kv_lora || rope);
        if (c->f->eager) { /* the model's default kernel; --attention still overrides it */
            l->attn.impl = MP_ATTN_EAGER;
            l->attn.impl_set = true;
        }
    }
    m->num_skip_end = unnumbered;
    return MP_OK;
}

/* Appends a layer to the head block under construction. */
static struct mp_layer *head_layer(struct mp_layer *l, size_t *n, enum mp_layer_type t, const char *name)
{
    l += (*n)++;
    l->type = t;
    set_name(l, name);
    return l;
}

/* A classifier over hidden -> classes. */
static void classifier(struct mp_layer *l, const struct hf *c, uint64_t classes, bool bias, enum mp_head_pool pool)
{
    l->in_features = l->dim = c->hidden;
    l->vocab = l->out_features = classes;
    l->bias = bias;
    l->head.pool = pool;
}

/* The head block: the final norm (pre-norm families) and the task head of architectures[0]
 * as transformers builds it.  Decoders: *ForSequenceClassification scores every position
 * (Linear, no bias) and gathers the last non-pad one; *ForTokenClassification is dropout +
 * Linear; *ForQuestionAnswering a Linear to 2 (start, end).  BERT: the pooler (dense + tanh
 * on the first position) for sequence classification and the bare BertModel; the MLM
 * transform for masked LM. */
static enum mp_status add_head(struct mp_model *m, const struct hf *c, struct mp_diag *d)
{
    const struct family *f = c->f;
    bool encoder = f->post_norm; /* no final norm: the last layer ends in one */
    struct mp_block *b = mp_model_add_block(m, "head", 6);
    if (!b)
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
    struct mp_layer *L = b->layers, *l;
    size_t n = 0;
    if (!encoder)
        norm_layer(head_layer(L, &n, MP_LT_LAYERNORM, ""), c, f->n_norm);
    bool pooler = (encoder && c->head == H_SEQ) || (c->head == H_BARE && f->bare_pooler);
    if (pooler) { /* BertPooler and the like: dense + activation of the first position */
        l = head_layer(L, &n, MP_LT_LINEAR, f->n_pooler);
        l->in_features = c->hidden;
        l->out_features = f->vision ? c->pooler_out : c->hidden;
        l->bias = true;
        l->head.pool = MP_POOL_FIRST;
        head_layer(L, &n, MP_LT_ACTIVATION, "pooler.activation")->mlp.act = f->vision ? c->pooler_act : f->pooler_act;
    }
    switch (c->head) {
    case H_CAUSAL:
    case H_MASKED:
        if (f->mlm_transform) { /* BertPredictionHeadTransform: dense, act, LayerNorm */
            l = head_layer(L, &n, MP_LT_LINEAR, "transform.dense");
            l->in_features = l->out_features = c->hidden;
            l->bias = true;
            head_layer(L, &n, MP_LT_ACTIVATION, "transform.act")->mlp.act = f->mlm_gelu ? MP_ACT_GELU : c->act;
            norm_layer(head_layer(L, &n, MP_LT_LAYERNORM, ""), c, "transform.LayerNorm");
        }
        l = head_layer(L, &n, MP_LT_LM_HEAD, f->n_head);
        l->vocab = c->vocab;
        l->dim = c->hidden;
        l->head.tied = c->tied;
        l->bias = c->lm_bias;
        l->head.masked = c->head == H_MASKED;
        l->head.softcap = c->logit_softcap;
        l->mult = c->logits_mult;
        break;
    case H_SEQ:
        if (encoder && c->cls_p > 0)
            head_layer(L, &n, MP_LT_DROPOUT, "dropout")->p = c->cls_p;
        classifier(head_layer(L, &n, MP_LT_CLASSIFIER, encoder ? "classifier" : "score"), c, c->labels, encoder,
                   encoder ? MP_POOL_FIRST : MP_POOL_LAST);
        break;
    case H_TOKEN:
        if (c->cls_p > 0)
            head_layer(L, &n, MP_LT_DROPOUT, "dropout")->p = c->cls_p;
        classifier(head_layer(L, &n, MP_LT_CLASSIFIER, "classifier"), c, c->labels, c->cls_bias, MP_POOL_NONE);
        break;
    case H_QA:
        if (c->qa_p > 0)
            head_layer(L, &n, MP_LT_DROPOUT, "dropout")->p = c->qa_p;
        classifier(head_layer(L, &n, MP_LT_CLASSIFIER, "qa_outputs"), c, 2, true, MP_POOL_SPAN);
        break;
    case H_IMAGE: /* ViTForImageClassification: a Linear on the class token */
        classifier(head_layer(L, &n, MP_LT_CLASSIFIER, f->n_head), c, c->labels, true, MP_POOL_FIRST);
        break;
    case H_BARE:
    case H_COUNT:
        break;
    }
    b->n_layers = n;
    return MP_OK;
}

/* ---- t5: an encoder-decoder (T5Config, modeling_t5.py of transformers 5.23) --------------------
 *
 * Blocks: "encoder.embed" (the shared table, dropout), "encoder.block.i" (T5Block, repeat group 1;
 * block 0 owns the relative_attention_bias), "encoder.final" (final_layer_norm, dropout),
 * "decoder.embed" (decoder ids looked up in the shared table; the encoder output is held from
 * here for every cross-attention), "decoder.block.i" (repeat group 2), "head" (the decoder's
 * final_layer_norm and dropout, then the task head).  T5EncoderModel and T5ForTokenClassification
 * end after the encoder.  T5Config keys: d_model, d_kv (independent of d_model / num_heads),
 * d_ff, num_layers, num_decoder_layers (default num_layers), num_heads,
 * relative_attention_num_buckets, dropout_rate (every dropout, attention's included),
 * feed_forward_proj ("relu", "gated-gelu" = gelu_new, "gated-ACT", "ACT"; dense_act_fn and
 * is_gated_act in the file win, as T5Config's kwargs do), classifier_dropout, num_labels.
 * transformers 5.23 ties lm_head to the shared table whatever tie_word_embeddings says (T5Config
 * forces it); tie_word_embeddings false only turns off the d_model**-0.5 rescale of the decoder
 * output.  relative_attention_max_distance and the token ids change values, not memory. */
enum t5_head { T5_LM, T5_BARE, T5_ENCODER, T5_TOKEN, T5_QA };

static enum mp_status t5_read(const cJSON *root, struct hf *c, enum t5_head *head, uint64_t *dec_layers,
                              uint64_t *buckets, bool *scale, const char *path, struct mp_diag *d)
{
    enum mp_status st;
    /* MT5Config's and UMT5Config's defaults; MT5 never rescales, UMT5 always does (it tests
     * tie_word_embeddings, which its config forces to true) */
    bool umt5 = !strcmp(c->f->type, "umt5"), mt5 = umt5 || !strcmp(c->f->type, "mt5");
    c->vocab = mt5 ? 250112 : 32128, c->hidden = 512, c->head_dim = 64, c->ffn = mt5 ? 1024 : 2048;
    c->layers = mt5 ? 8 : 6, c->heads = mt5 ? 6 : 8;
    *buckets = 32;
    c->resid_p = 0.1;
    c->cls_p = 0.0;
    if ((st = read_pos(root, "vocab_size", false, MP_DIM_MAX, &c->vocab, path, d)) != MP_OK ||
        (st = read_pos(root, "d_model", false, MP_DIM_MAX, &c->hidden, path, d)) != MP_OK ||
        (st = read_pos(root, "d_kv", false, MP_DIM_MAX, &c->head_dim, path, d)) != MP_OK ||
        (st = read_pos(root, "d_ff", false, MP_DIM_MAX, &c->ffn, path, d)) != MP_OK ||
        (st = read_pos(root, "num_layers", false, HF_LAYERS_MAX, &c->layers, path, d)) != MP_OK ||
        (st = read_pos(root, "num_heads", false, MP_DIM_MAX, &c->heads, path, d)) != MP_OK ||
        (st = read_pos(root, "relative_attention_num_buckets", false, MP_DIM_MAX, buckets, path, d)) != MP_OK ||
        (st = read_prob(root, "dropout_rate", &c->resid_p, path, d)) != MP_OK ||
        (st = read_prob(root, "classifier_dropout", &c->cls_p, path, d)) != MP_OK)
        return st;
    *dec_layers = c->layers;
    if ((st = read_pos(root, "num_decoder_layers", false, HF_LAYERS_MAX, dec_layers, path, d)) != MP_OK)
        return st;
    /* feed_forward_proj: "gated-ACT" or "ACT" */
    const char *ff = mp_json_str(root, "feed_forward_proj", &st, path, "", d);
    if (st != MP_OK)
        return st;
    char act[48];
    ff = ff ? ff : mt5 ? "gated-gelu" : "relu";
    const char *dash = strchr(ff, '-');
    if (dash && (strncmp(ff, "gated-", 6) != 0 || strchr(dash + 1, '-')))
        return mp_fail(d, MP_ERR_MODEL, "%s: feed_forward_proj: '%s' is not gated-ACT or ACT (transformers refuses it)",
                       path, ff);
    c->gated = dash != NULL;
    snprintf(act, sizeof act, "%s", !strcmp(ff, "gated-gelu") ? "gelu_new" : dash ? dash + 1 : ff);
    const char *da = mp_json_str(root, "dense_act_fn", &st, path, "", d);
    if (st != MP_OK || (st = mp_json_bool(root, "is_gated_act", &c->gated, path, "", d)) != MP_OK)
        return st;
    if (da)
        snprintf(act, sizeof act, "%s", da);
    int a = mp_act_parse(act);
    if (a < 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: '%s' is not a supported activation (supported: gelu, gelu_new, "
                       "gelu_fast, gelu_pytorch_tanh, relu, relu2, silu, swish, tanh, sigmoid, xielu)", path,
                       da ? "dense_act_fn" : "feed_forward_proj", act);
    c->act = (enum mp_act)a;
    bool tied = true, is_decoder = false;
    if ((st = mp_json_bool(root, "tie_word_embeddings", &tied, path, "", d)) != MP_OK ||
        (st = mp_json_bool(root, "is_decoder", &is_decoder, path, "", d)) != MP_OK)
        return st;
    *scale = umt5 || (tied && !mt5);
    if (is_decoder)
        return mp_fail(d, MP_ERR_MODEL, "%s: is_decoder: true is not supported (a T5 stack used as a decoder alone)",
                       path);
    /* the task head */
    *head = T5_LM;
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    if (arch && !cJSON_IsNull(arch) && (!cJSON_IsArray(arch) || (a0 && !cJSON_IsString(a0))))
        return mp_fail(d, MP_ERR_MODEL, "%s: architectures: expected a list of class names", path);
    static const struct {
        const char *cls;
        enum t5_head h;
    } t5_heads[] = {{"ForConditionalGeneration", T5_LM}, {"Model", T5_BARE}, {"EncoderModel", T5_ENCODER},
                    {"ForTokenClassification", T5_TOKEN}, {"ForQuestionAnswering", T5_QA}};
    if (a0) {
        const char *cls = a0->valuestring, *pre = umt5 ? "UMT5" : mt5 ? "MT5" : "T5";
        size_t pl = strlen(pre);
        bool found = false;
        for (size_t i = 0; i < sizeof t5_heads / sizeof t5_heads[0] && !found; i++)
            if (!strncmp(cls, pre, pl) && !strcmp(cls + pl, t5_heads[i].cls)) {
                *head = t5_heads[i].h;
                found = true;
            }
        if (!found && !strncmp(cls, pre, pl) && !strcmp(cls + pl, "ForSequenceClassification"))
            return mp_fail(d, MP_ERR_MODEL, "%s: architectures[0]: %s is not modelled (it gathers the hidden states "
                           "at the <eos> positions of input_ids, a data-dependent size)", path, cls);
        if (!found)
            return mp_fail(d, MP_ERR_MODEL, "%s: architectures[0]: '%s' is not supported for %s (supported: "
                           "%sForConditionalGeneration, %sModel, %sEncoderModel, %sForTokenClassification, "
                           "%sForQuestionAnswering)", path, cls, c->f->type, pre, pre, pre, pre, pre);
    }
    if ((st = read_labels(root, c, path, d)) != MP_OK)
        return st;
    if (*head == T5_QA && c->labels != 2)
        return mp_fail(d, MP_ERR_MODEL, "%s: num_labels: T5ForQuestionAnswering splits its logits into start and end "
                       "(expected 2, got %llu)", path, (unsigned long long)c->labels);
    return MP_OK;
}

static struct mp_layer *t5_add(struct mp_model *m, const char *name, size_t n, int group, struct mp_diag *d)
{
    struct mp_block *b = mp_model_add_block(m, name, n);
    if (!b) {
        mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
        return NULL;
    }
    b->repeat_group = group;
    return b->layers;
}

/* A T5LayerNorm, then dropout when p > 0: returns the layers used. */
static size_t t5_norm_drop(struct mp_layer *l, const struct hf *c, const char *norm, const char *drop)
{
    l->type = MP_LT_RMSNORM;
    l->norm.kind = MP_NORM_RMSNORM;
    l->t5.on = true;
    l->dim = c->hidden;
    set_name(l, norm);
    if (c->resid_p <= 0)
        return 1;
    l[1].type = MP_LT_DROPOUT;
    l[1].p = c->resid_p;
    set_name(&l[1], drop);
    return 2;
}

static enum mp_status t5_stack(struct mp_model *m, const struct hf *c, bool decoder, uint64_t layers,
                               uint64_t buckets, struct mp_diag *d)
{
    const char *stack = decoder ? "decoder" : "encoder";
    char name[48];
    snprintf(name, sizeof name, "%s.embed", stack);
    struct mp_layer *l = t5_add(m, name, c->resid_p > 0 ? 2 : 1, 0, d);
    if (!l)
        return MP_ERR_NOMEM;
    l->type = MP_LT_EMBEDDING;
    l->vocab = c->vocab;
    l->dim = c->hidden;
    l->emb.dec_input = decoder;
    set_name(l, decoder ? "decoder.embed_tokens" : "shared");
    if (c->resid_p > 0) {
        l[1].type = MP_LT_DROPOUT;
        l[1].p = c->resid_p;
        set_name(&l[1], decoder ? "decoder.dropout" : "encoder.dropout");
    }
    for (uint64_t i = 0; i < layers; i++) {
        snprintf(name, sizeof name, "%s.block.%llu", stack, (unsigned long long)i);
        if (!(l = t5_add(m, name, 1, decoder ? 2 : 1, d)))
            return MP_ERR_NOMEM;
        l->type = MP_LT_TRANSFORMER_BLOCK;
        l->t5.on = true;
        l->t5.cross_attn = l->attn.causal = decoder;
        l->t5.bias_per_layer = !strcmp(c->f->type, "umt5");
        l->t5.rel_buckets = i == 0 || l->t5.bias_per_layer ? buckets : 0;
        l->dim = c->hidden;
        l->attn.heads = l->attn.kv_heads = c->heads;
        l->attn.head_dim = c->head_dim;
        l->attn.impl = MP_ATTN_SDPA;
        l->attn.dropout = c->resid_p;
        l->mlp.ffn = c->ffn;
        l->mlp.act = c->act;
        l->mlp.gated = c->gated;
        l->norm.kind = MP_NORM_RMSNORM;
        l->p = c->resid_p;
    }
    return MP_OK;
}

static enum mp_status t5_model(struct mp_model *m, const cJSON *root, struct hf *c, const char *path,
                               struct mp_diag *d)
{
    enum t5_head head = T5_LM;
    uint64_t dec_layers = 0, buckets = 0;
    bool scale = true;
    enum mp_status st = t5_read(root, c, &head, &dec_layers, &buckets, &scale, path, d);
    if (st == MP_OK)
        st = check_weights(root, c, buckets, path, d);
    if (st != MP_OK)
        return st;
    bool decoder = head != T5_ENCODER && head != T5_TOKEN;
    m->enc_dec = decoder;
    m->keep_fp32_wo = true;
    m->dec_from_input = head == T5_QA;
    /* T5ForConditionalGeneration and T5Model fill an EncoderDecoderCache (use_cache, default true);
     * the question-answering head turns it off in training */
    m->kv_cache = head == T5_LM || head == T5_BARE;
    m->use_cache = m->kv_cache;
    if ((st = mp_json_bool(root, "use_cache", &m->use_cache, path, "", d)) != MP_OK)
        return st;
    m->use_cache = m->use_cache && m->kv_cache;
    m->input = MP_INPUT_TOKENS;
    m->seq_len = 512; /* n_positions of the released configs; T5 has no position table */
    if ((st = read_pos(root, "n_positions", false, MP_DIM_MAX, &m->seq_len, path, d)) != MP_OK ||
        (st = t5_stack(m, c, false, c->layers, buckets, d)) != MP_OK)
        return st;
    size_t n = 0;
    struct mp_layer *l;
    if (decoder) {
        if (!(l = t5_add(m, "encoder.final", 2, 0, d)))
            return MP_ERR_NOMEM;
        m->blocks[m->n_blocks - 1].n_layers = t5_norm_drop(l, c, "encoder.final_layer_norm", "encoder.dropout");
        if ((st = t5_stack(m, c, true, dec_layers, buckets, d)) != MP_OK)
            return st;
    }
    if (!(l = t5_add(m, "head", 5, 0, d)))
        return MP_ERR_NOMEM;
    n = t5_norm_drop(l, c, decoder ? "decoder.final_layer_norm" : "encoder.final_layer_norm",
                     decoder ? "decoder.dropout" : "encoder.dropout");
    switch (head) {
    case T5_LM:
        l[n].type = MP_LT_LM_HEAD;
        l[n].vocab = c->vocab;
        l[n].dim = c->hidden;
        l[n].head.tied = true;
        l[n].head.masked = true; /* CrossEntropyLoss(ignore_index=-100) on the labels as they are */
        l[n].head.in_mult = scale ? 1.0 / sqrt((double)c->hidden) : 0.0;
        l[n].t5.on = true;
        set_name(&l[n++], "lm_head");
        break;
    case T5_TOKEN:
        if (c->cls_p > 0) {
            l[n].type = MP_LT_DROPOUT;
            l[n].p = c->cls_p;
            set_name(&l[n++], "dropout");
        }
        l[n].type = MP_LT_CLASSIFIER;
        classifier(&l[n], c, c->labels, true, MP_POOL_NONE);
        l[n].head.masked = true; /* a plain CrossEntropyLoss: no logits.float() */
        l[n].t5.on = true;
        set_name(&l[n++], "classifier");
        break;
    case T5_QA:
        l[n].type = MP_LT_CLASSIFIER;
        classifier(&l[n], c, 2, true, MP_POOL_SPAN);
        l[n].t5.on = true;
        set_name(&l[n++], "qa_outputs");
        break;
    case T5_BARE:
    case T5_ENCODER: break;
    }
    m->blocks[m->n_blocks - 1].n_layers = n;
    return MP_OK;
}

/* ---- entry points -------------------------------------------------------------------- */

/* quantization_config (transformers' quantizers): bitsandbytes 4-bit / 8-bit, GPTQ, AWQ.
 * Storage per format is quant.c's; a method memplan cannot size is refused, never ignored. */
static enum mp_status read_quant(const cJSON *root, struct mp_quant *q, const char *path, struct mp_diag *d)
{
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (!qc)
        return MP_OK;
    if (!cJSON_IsObject(qc))
        return mp_fail(d, MP_ERR_MODEL, "%s: quantization_config: expected an object", path);
    const char *W = "quantization_config.";
    enum mp_status st;
    const char *method = mp_json_str(qc, "quant_method", &st, path, W, d);
    if (st != MP_OK)
        return st;
    if (!method)
        return mp_fail(d, MP_ERR_MODEL, "%s: quantization_config.quant_method: missing", path);
    if (!strcmp(method, "bitsandbytes")) {
        bool b4 = false, b8 = false, dq = false;
        if ((st = mp_json_bool(qc, "load_in_4bit", &b4, path, W, d)) != MP_OK ||
            (st = mp_json_bool(qc, "load_in_8bit", &b8, path, W, d)) != MP_OK ||
            (st = mp_json_bool(qc, "bnb_4bit_use_double_quant", &dq, path, W, d)) != MP_OK)
            return st;
        const char *qt = mp_json_str(qc, "bnb_4bit_quant_type", &st, path, W, d);
        if (st != MP_OK)
            return st;
        if (b4 == b8)
            return mp_fail(d, MP_ERR_MODEL, "%s: quantization_config: expected exactly one of load_in_4bit and "
                           "load_in_8bit to be true", path);
        if (b4 && qt && strcmp(qt, "nf4") && strcmp(qt, "fp4"))
            return mp_fail(d, MP_ERR_MODEL, "%s: quantization_config.bnb_4bit_quant_type: expected nf4 or fp4, "
                           "got '%s'", path, qt);
        const char *qs = mp_json_str(qc, "bnb_4bit_quant_storage", &st, path, W, d);
        if (st != MP_OK)
            return st;
        mp_quant_init(q, b8 ? MP_Q_BNB_INT8 : qt && !strcmp(qt, "nf4") ? MP_Q_BNB_NF4 : MP_Q_BNB_FP4);
        q->double_quant = dq;
        if (qs && b4 && (q->storage = mp_quant_storage_parse(qs)) < 0)
            return mp_fail(d, MP_ERR_MODEL, "%s: quantization_config.bnb_4bit_quant_storage: expected uint8, "
                           "bfloat16, float16 or float32, got '%s'", path, qs);
        if (q->storage < 0)
            q->storage = MP_DT_U8;
        return MP_OK;
    }
    if (!strcmp(method, "gptq") || !strcmp(method, "awq")) {
        mp_quant_init(q, method[0] == 'g' ? MP_Q_GPTQ : MP_Q_AWQ);
        const cJSON *gs = cJSON_GetObjectItemCaseSensitive(qc, "group_size");
        if ((st = mp_json_u64(qc, "bits", false, 8, &q->bits, path, W, d)) != MP_OK)
            return st;
        if (q->bits != 2 && q->bits != 3 && q->bits != 4 && q->bits != 8)
            return mp_fail(d, MP_ERR_MODEL, "%s: quantization_config.bits: expected 2, 3, 4 or 8", path);
        if (cJSON_IsNumber(gs) && gs->valuedouble == -1)
            q->group_size = 0; /* one group per input row */
        else if ((st = mp_json_u64(qc, "group_size", false, MP_DIM_MAX, &q->group_size, path, W, d)) != MP_OK)
            return st;
        return MP_OK;
    }
    return mp_fail(d, MP_ERR_MODEL, "%s: quantization_config.quant_method: '%s' is not supported (supported: "
                   "bitsandbytes, gptq, awq)", path, method);
}

bool mp_json_is_hf(const cJSON *root)
{
    /* any model_type (even a wrong one: the HF reader says what it expected) or an
     * architectures list marks a config.json, unless memplan's own "layers" is there */
    return (cJSON_GetObjectItemCaseSensitive(root, "model_type") ||
            cJSON_GetObjectItemCaseSensitive(root, "architectures")) &&
           !cJSON_GetObjectItemCaseSensitive(root, "layers");
}

/* The file's own name for the model: "llama-3.2-1b" of .../llama-3.2-1b.json, the model
 * directory's of .../Llama-3.2-1B/config.json, ORG/NAME of the Hub cache's
 * .../models--ORG--NAME/snapshots/<commit>/config.json; "" for a bare config.json. */
static void name_of_path(const char *path, char *out, size_t cap)
{
    const char *repo = strstr(path, "models--"), *snap = repo ? strstr(repo, "/snapshots/") : NULL;
    if (repo && snap && (repo == path || repo[-1] == '/')) { /* the Hub cache: models--ORG--NAME */
        const char *sep = strstr(repo + 8, "--");
        if (sep && sep < snap) {
            snprintf(out, cap, "%.*s/%.*s", (int)(sep - repo - 8), repo + 8, (int)(snap - sep - 2), sep + 2);
            return;
        }
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, ".json"))
        n -= 5;
    if (!strncmp(base, "config", n) && n == 6) { /* HF's file name: the directory names the model */
        const char *end = base > path ? base - 1 : path, *dir = end;
        while (dir > path && dir[-1] != '/')
            dir--;
        snprintf(out, cap, "%.*s", (int)(end - dir), dir);
        return;
    }
    snprintf(out, cap, "%.*s", (int)n, base);
}

/* Model name: _name_or_path, else the file's name (name_of_path), else architectures[0], else
 * model_type. */
static enum mp_status set_model_name(struct mp_model *m, const cJSON *root, const char *type, const char *path,
                                     struct mp_diag *d)
{
    enum mp_status st;
    const char *name = mp_json_str(root, "_name_or_path", &st, path, "", d);
    if (st != MP_OK)
        return st;
    char own[sizeof m->name];
    if (!name || !*name) {
        name_of_path(path, own, sizeof own);
        name = own;
    }
    if (!*name) {
        const cJSON *arch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "architectures"), 0);
        name = cJSON_IsString(arch) && *arch->valuestring ? arch->valuestring : type;
    }
    snprintf(m->name, sizeof m->name, "%s", name);
    return MP_OK;
}

/* rope_scaling and rope_parameters change only the values of cos/sin (ignored, above), but
 * transformers reads them as dicts (rope_config_validation calls .get on them): another type is
 * a broken config, refused rather than ignored. */
static enum mp_status check_rope_dicts(const cJSON *root, const char *path, struct mp_diag *d)
{
    static const char *const keys[] = {"rope_scaling", "rope_parameters"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (v && !cJSON_IsNull(v) && !cJSON_IsObject(v))
            return mp_fail(d, MP_ERR_MODEL, "%s: %s: expected an object or null", path, keys[i]);
    }
    return MP_OK;
}

/* Reads the model from root, its text config `text` (root itself but for multimodal checkpoints,
 * where mm is its row and text the prepared text config: text_config_of). */
static enum mp_status from_hf_read(struct mp_model *m, const cJSON *root, const cJSON *text, const char *type,
                                   const struct multimodal *mm, struct hf *cp, const char *path, struct mp_diag *d)
{
    enum mp_status st;
    const char *ttype = mm ? mm->text_row : type;
    struct hf c = *cp;
    for (size_t i = 0; i < N_FAMILIES && !c.f; i++)
        if (strcmp(ttype, families[i].type) == 0 && (mm || !families[i].mm_text))
            c.f = &families[i];
    for (size_t i = 0; i < sizeof refused_types / sizeof refused_types[0] && !c.f; i++)
        if (strcmp(type, refused_types[i].type) == 0)
            return mp_fail(d, MP_ERR_MODEL, "%s: model_type: '%s' is not supported (%s)", path, type,
                           refused_types[i].why);
    if (!c.f)
        return mp_fail(d, MP_ERR_MODEL, "%s: model_type: '%s' is not supported (supported: %s)", path,
                       type, mp_hf_model_types());
    if ((st = check_rope_dicts(root, path, d)) != MP_OK)
        return st;
    if (mm && (st = check_rope_dicts(text, path, d)) != MP_OK)
        return st;
    c.mrope = mm && mm->mrope;
    st = c.f->enc_dec ? MP_OK : read_config(text, &c, path, d);
    cp->cross = c.cross; /* (the caller frees it) */
    if (st != MP_OK || (!c.f->enc_dec && (st = check_weights(text, &c, 0, path, d)) != MP_OK))
        return st;
    struct mp_hf_cross cross = {.layers = c.n_cross, .hidden = c.hidden, .heads = c.heads, .kv_heads = c.kv_heads,
                                .head_dim = c.head_dim, .ffn = c.ffn};
    if (mm && (st = mp_hf_vision_modules(root, type, c.hidden, &cross, &m->idle, &m->vision, path, d)) != MP_OK)
        return st;

    if ((st = read_quant(root, &m->quant, path, d)) != MP_OK)
        return st;
    snprintf(m->source, sizeof m->source, "hf");
    for (size_t i = 0; i < 2 && !m->ckpt_dtype[0]; i++) { /* the checkpoint's dtype (cli: the index check) */
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, i ? "dtype" : "torch_dtype");
        if (cJSON_IsString(dt))
            snprintf(m->ckpt_dtype, sizeof m->ckpt_dtype, "%s", dt->valuestring);
    }
    /* decoders fill a DynamicCache when use_cache (the config classes' default: true) */
    m->kv_cache = c.causal && !c.f->vision;
    m->use_cache = m->kv_cache;
    if ((st = mp_json_bool(text, "use_cache", &m->use_cache, path, "", d)) != MP_OK)
        return st;
    m->use_cache = m->use_cache && m->kv_cache;
    snprintf(m->hf_type, sizeof m->hf_type, "%s", type);
    m->no_flash = mm && mm->no_flash ? mm->no_flash : c.f->no_flash;
    const cJSON *a0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "architectures"), 0);
    if (cJSON_IsString(a0))
        snprintf(m->hf_class, sizeof m->hf_class, "%s", a0->valuestring);
    if ((st = set_model_name(m, root, type, path, d)) != MP_OK)
        return st;
    if (c.f->enc_dec) { /* t5_model sets its cache flags itself */
        if ((st = t5_model(m, root, &c, path, d)) != MP_OK)
            return st;
        return mp_model_validate(m, d);
    }
    m->input = MP_INPUT_TOKENS;
    m->seq_len = c.positions ? mp_min_u64(c.positions, HF_SEQ_DEFAULT) : HF_SEQ_DEFAULT;
    m->max_positions = c.positions;
    if (c.f->vision) { /* pixel values in; the sequence is the patches and the class token */
        m->input = MP_INPUT_IMAGE;
        m->channels = c.channels;
        m->height = c.image_h;
        m->width = c.image_w;
        if (!mp_mul_u64(c.image_h / c.patch, c.image_w / c.patch, &m->seq_len) || m->seq_len >= MP_DIM_MAX)
            return mp_fail(d, MP_ERR_RANGE, "%s: image_size: too many patches", path);
        m->seq_len++;
        m->labels_vocab = c.head == H_IMAGE ? c.labels : 0;
    }
    if ((st = add_embed(m, &c, d)) != MP_OK || (st = add_blocks(m, &c, d)) != MP_OK ||
        (st = add_head(m, &c, d)) != MP_OK)
        return st;
    return mp_model_validate(m, d);
}

static enum mp_status from_hf(struct mp_model *m, const cJSON *root, const cJSON *text, const char *type,
                              const struct multimodal *mm, const char *path, struct mp_diag *d)
{
    struct hf c;
    memset(&c, 0, sizeof c);
    struct list_cursor lt_at = {0}, nr_at = {0};
    c.lt_at = &lt_at;
    c.nr_at = &nr_at;
    enum mp_status st = from_hf_read(m, root, text, type, mm, &c, path, d);
    free(c.cross);
    return st;
}

/* The text config of a multimodal checkpoint, prepared for its family's row (a copy the caller
 * deletes): text_config (or the top level, for the classes that read it there), without
 * architectures (the text model is the class's causal LM), with the text config class's defaults
 * of the required keys, tie_word_embeddings as the outer config decides it, and without
 * final_logit_softcapping where the class's forward does not apply it. */
static enum mp_status text_config_of(const cJSON *root, const struct multimodal *mm, cJSON **out, const char *path,
                                     struct mp_diag *d)
{
    enum mp_status st;
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    if (arch && !cJSON_IsNull(arch) && (!cJSON_IsArray(arch) || (a0 && !cJSON_IsString(a0))))
        return mp_fail(d, MP_ERR_MODEL, "%s: architectures: expected a list of class names", path);
    if (a0 && strcmp(a0->valuestring, mm->cls))
        return mp_fail(d, MP_ERR_MODEL, "%s: architectures[0]: '%s' is not supported for %s (supported: %s, planned "
                       "for text-only steps)", path, a0->valuestring, mm->type, mm->cls);
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (tc && !cJSON_IsNull(tc) && !cJSON_IsObject(tc))
        return mp_fail(d, MP_ERR_MODEL, "%s: text_config: expected an object", path);
    if ((!tc || cJSON_IsNull(tc)) && !mm->text_at_top && !mm->text_defaults)
        return mp_fail(d, MP_ERR_MODEL, "%s: text_config: missing (%s reads the language model's sizes there)", path,
                       mm->type);
    const cJSON *src = cJSON_IsObject(tc) ? tc : mm->text_at_top ? root : NULL;
    const char *tt = src && src != root ? mp_json_str(src, "model_type", &st, path, "text_config", d) : NULL;
    if (src && src != root && st != MP_OK)
        return st;
    if (tt && strcmp(tt, mm->text_type))
        return mp_fail(d, MP_ERR_MODEL, "%s: text_config.model_type: '%s' is not supported for %s (expected %s)", path,
                       tt, mm->type, mm->text_type);
    cJSON *t = src ? cJSON_Duplicate(src, true) : cJSON_CreateObject();
    cJSON *defs = mm->text_defaults ? cJSON_Parse(mm->text_defaults) : NULL;
    if (!t || (mm->text_defaults && !defs)) {
        cJSON_Delete(t);
        cJSON_Delete(defs);
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", path);
    }
    for (const cJSON *e = defs ? defs->child : NULL; e; e = e->next)
        if (!cJSON_GetObjectItemCaseSensitive(t, e->string))
            cJSON_AddItemToObject(t, e->string, cJSON_Duplicate(e, true));
    cJSON_Delete(defs);
    bool tie = mm->tie, text_tie = false; /* (read and checked even where the class never ties) */
    if ((st = mp_json_bool(root, "tie_word_embeddings", &tie, path, "", d)) != MP_OK ||
        (src && src != root && (st = mp_json_bool(src, "tie_word_embeddings", &text_tie, path, "text_config", d)) != MP_OK)) {
        cJSON_Delete(t);
        return st;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(t, "architectures");
    cJSON_DeleteItemFromObjectCaseSensitive(t, "model_type");
    cJSON_DeleteItemFromObjectCaseSensitive(t, "tie_word_embeddings");
    cJSON_DeleteItemFromObjectCaseSensitive(t, "text_config");
    cJSON_DeleteItemFromObjectCaseSensitive(t, "vision_config");
    cJSON_DeleteItemFromObjectCaseSensitive(t, "quantization_config");
    if (mm->no_logit_softcap)
        cJSON_DeleteItemFromObjectCaseSensitive(t, "final_logit_softcapping");
    cJSON_AddBoolToObject(t, "tie_word_embeddings", !mm->never_tied && (mm->text_ties ? text_tie
                                                                       : tie || (mm->tie_or_text && text_tie)));
    *out = t;
    return MP_OK;
}

enum mp_status mp_model_from_hf(struct mp_model *m, const cJSON *root, const char *path, struct mp_diag *d)
{
    enum mp_status st;
    const char *type = mp_json_str(root, "model_type", &st, path, "", d);
    if (st != MP_OK)
        return st;
    if (!type)
        return mp_fail(d, MP_ERR_MODEL, "%s: model_type: missing (expected one of: %s)", path,
                       mp_hf_model_types());
    for (size_t i = 0; i < N_MULTIMODAL; i++)
        if (!strcmp(type, multimodal[i].type)) {
            cJSON *text = NULL;
            if ((st = text_config_of(root, &multimodal[i], &text, path, d)) != MP_OK)
                return st;
            st = from_hf(m, root, text, type, &multimodal[i], path, d);
            cJSON_Delete(text);
            return st;
        }
    return from_hf(m, root, root, type, NULL, path, d);
}

/* ---- --head and --num-labels ------------------------------------------------------------------
 *
 * The request rewrites the config as transformers' from_pretrained(num_labels=) and loading the
 * head's Auto class would: architectures[0] becomes the family's class of that head (its prefix
 * kept from the file's class, else the model_type), num_labels the classes (id2label and
 * label2id dropped: PretrainedConfig's num_labels setter makes them anew).  The readers then
 * check and build the head as for a file that named it. */

/* memplan's head (sets.h MP_HEADS) as this reader's; T5's own class suffixes. */
static const enum head head_of_option[] = {H_CAUSAL, H_MASKED, H_SEQ, H_TOKEN, H_QA, H_BARE};
static const char *const t5_suffix_of_option[] = {"ForConditionalGeneration", NULL, NULL, "ForTokenClassification",
                                                  "ForQuestionAnswering", "Model"};
static const char *const suffix_of_option[] = {
#define MP_X(id, name, suffix) suffix,
    MP_HEADS(MP_X)
#undef MP_X
};

/* The heads transformers has for f, as --head names them. */
static void head_options(const struct family *f, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (int h = 0; h <= MP_HEAD_BASE; h++)
        if (f->enc_dec ? t5_suffix_of_option[h] != NULL : (f->heads & HEAD(head_of_option[h])) != 0)
            len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "%s%s", len ? ", " : "",
                                    mp_head_str((enum mp_head)h));
}

/* Whether the head has classes (num_labels), and whether only 2 run (start and end logits). */
static bool head_has_labels(enum head h, bool *only_two)
{
    *only_two = h == H_QA;
    return h == H_SEQ || h == H_TOKEN || h == H_QA || h == H_IMAGE;
}

enum mp_status mp_hf_apply_request(cJSON *root, const struct mp_model_request *rq, const char *path,
                                   struct mp_diag *d)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if ((rq->head < 0 && !rq->num_labels) || !cJSON_IsString(mt))
        return MP_OK; /* (a missing model_type: the reader says so) */
    const char *type = mt->valuestring, *opt = rq->head >= 0 ? mp_head_str((enum mp_head)rq->head) : NULL;
    for (size_t i = 0; i < N_MULTIMODAL; i++)
        if (!strcmp(type, multimodal[i].type)) {
            if ((opt && rq->head != MP_HEAD_CAUSAL_LM) || rq->num_labels)
                return mp_fail(d, MP_ERR_MODEL, "%s: --%s: a %s checkpoint is read as its language model's causal "
                               "LM (text-only fine-tuning); other heads on it are not modelled", path,
                               opt ? "head" : "num-labels", type);
            return MP_OK;
        }
    const struct family *f = NULL;
    for (size_t i = 0; i < N_FAMILIES && !f; i++)
        if (!strcmp(type, families[i].type))
            f = &families[i];
    if (!f)
        return MP_OK; /* the reader refuses the model_type */
    char list[160], prefix[128];
    head_options(f, list, sizeof list);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    const char *cls = cJSON_IsString(a0) ? a0->valuestring : NULL;
    /* the head the file names (the reader checks it when --head does not replace it) */
    enum head now = f->default_head, h;
    size_t pl;
    snprintf(prefix, sizeof prefix, "%s", type);
    if (f->enc_dec) {
        bool umt5 = !strcmp(type, "umt5"), mt5 = umt5 || !strcmp(type, "mt5");
        snprintf(prefix, sizeof prefix, "%s", umt5 ? "UMT5" : mt5 ? "MT5" : "T5");
        pl = strlen(prefix);
        now = H_CAUSAL;
        if (cls && !strncmp(cls, prefix, pl))
            now = !strcmp(cls + pl, "ForTokenClassification") ? H_TOKEN
                  : !strcmp(cls + pl, "ForQuestionAnswering") ? H_QA
                                                              : H_CAUSAL;
    } else if (cls && head_of_class(cls, &h, &pl)) {
        now = h;
        snprintf(prefix, sizeof prefix, "%.*s", (int)pl, cls);
    }
    if (opt) {
        const char *suffix = f->enc_dec ? t5_suffix_of_option[rq->head] : suffix_of_option[rq->head];
        if (f->enc_dec && rq->head == MP_HEAD_SEQ_CLS)
            return mp_fail(d, MP_ERR_MODEL, "%s: --head seq-cls: %sForSequenceClassification is not modelled (it "
                           "gathers the hidden states at the <eos> positions of input_ids, a data-dependent size)",
                           path, prefix);
        if (!suffix || (!f->enc_dec && !(f->heads & HEAD(head_of_option[rq->head]))))
            return mp_fail(d, MP_ERR_MODEL, "%s: --head %s: transformers has no %s class for %s (its heads: %s)",
                           path, opt, suffix ? suffix : suffix_of_option[rq->head], type, list);
        char name[192];
        snprintf(name, sizeof name, "%s%s", prefix, suffix);
        cJSON *a = cJSON_CreateArray(), *s = cJSON_CreateString(name);
        if (!a || !s || !cJSON_AddItemToArray(a, s)) {
            cJSON_Delete(a);
            cJSON_Delete(s);
            return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", path);
        }
        if (arch ? !cJSON_ReplaceItemInObjectCaseSensitive(root, "architectures", a)
                 : !cJSON_AddItemToObject(root, "architectures", a)) {
            cJSON_Delete(a);
            return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", path);
        }
        now = head_of_option[rq->head];
    }
    if (!rq->num_labels)
        return MP_OK;
    bool only_two;
    if (!head_has_labels(now, &only_two))
        return mp_fail(d, MP_ERR_MODEL, "%s: --num-labels: the %s head has no classes (give --head seq-cls or "
                       "token-cls; %s: %s)", path, opt ? opt : cls ? cls : "model's", type, list);
    if (only_two && rq->num_labels != 2)
        return mp_fail(d, MP_ERR_MODEL, "%s: --num-labels %llu: a qa head has 2 outputs (the start and end logits)",
                       path, (unsigned long long)rq->num_labels);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "id2label");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "label2id");
    cJSON *n = cJSON_CreateNumber((double)rq->num_labels);
    if (!n)
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", path);
    if (cJSON_GetObjectItemCaseSensitive(root, "num_labels") ? !cJSON_ReplaceItemInObjectCaseSensitive(root, "num_labels", n)
                                                             : !cJSON_AddItemToObject(root, "num_labels", n)) {
        cJSON_Delete(n);
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", path);
    }
    return MP_OK;
}
