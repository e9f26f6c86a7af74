/* model_keys.c — every key a layer of memplan JSON takes: one row each, with the layer types that
 * take it, its value kind, the struct mp_layer field it sets, its default and its meaning.
 *
 * The reader (model_json.c) takes a layer's allowed keys from here and reads every row that is not
 * `own` generically into its field; `own` rows are read by the type's code in model_json.c, which
 * applies their defaults and cross-checks.  docs/model-format.md's key tables are these rows:
 * under each "### type" heading, in this order, the rows whose first type is that type
 * (tests/test_model_json.c holds them equal, and prints the row to paste when they differ).
 * Adding a setting: a field in model.h's group, a row here (generic unless it needs the type's
 * code), a rule in model_json.c's check_settings if it depends on another, the md row.
 */
#include <stddef.h>
#include <stdio.h>

#include "model_read.h"

#define T(x) (1u << MP_LT_##x)
#define TB T(TRANSFORMER_BLOCK)
#define AT (T(ATTENTION) | TB)
#define F(field) offsetof(struct mp_layer, field), sizeof(((struct mp_layer *)0)->field)
#define NOF 0, 0 /* no one field: the type's code derives what it sets */

static const char *const norm_names[] = {"layernorm", "rmsnorm", NULL};
static const char *const qk_norm_names[] = {"none", "head", "all", "l2", NULL};
static const char *const split_names[] = {"views", "copy_mq", "copy_all", "copy_expand", NULL};
static const char *const router_names[] = {"softmax", "softmax_cast", "fp32_softmax", "fp32_sigmoid",
                                           "topk_softmax", "sparsemixer", "dense_sigmoid", NULL};
static const char *const pool_names[] = {"none", "first", NULL};

#define OWN true
#define GEN false

const struct mp_key mp_keys[] = {
    /* embedding */
    {"vocab", T(EMBEDDING), MP_KEY_DIM, OWN, F(vocab), NULL, "req.", "rows of the table"},
    {"dim", T(EMBEDDING), MP_KEY_DIM, OWN, F(dim), NULL, "req.", "width"},
    {"dropout", T(EMBEDDING), MP_KEY_PROB, GEN, F(emb.dropout), NULL, "`0`",
     "dropout on the embeddings' sum (HF's `embd_pdrop`, `hidden_dropout_prob`)"},
    {"mult", T(EMBEDDING), MP_KEY_REAL, GEN, F(mult), NULL, "none",
     "the output times a Python float, a new tensor (Gemma's `sqrt(hidden)`, Granite's `embedding_multiplier`)"},
    {"scale_buffer", T(EMBEDDING), MP_KEY_BOOL, GEN, F(emb.scale_buffer), NULL, "`false`",
     "the multiplier is an fp32 scalar buffer (Gemma's `embed_scale`)"},
    {"id_rows", T(EMBEDDING) | T(POS_EMBEDDING), MP_KEY_COUNT, GEN, F(emb.id_rows), NULL, "`0`",
     "with `id_buffer`: its length (also on a `pos_embedding`)"},
    {"id_buffer", T(EMBEDDING) | T(POS_EMBEDDING), MP_KEY_BOOL, GEN, F(emb.id_buffer), NULL, "`false`",
     "BERT's int64 (1, `id_rows`) `position_ids` / `token_type_ids` buffer, resident like the batch (also on "
     "a `pos_embedding`)"},
    {"id_view", T(EMBEDDING) | T(POS_EMBEDDING), MP_KEY_BOOL, GEN, F(emb.id_view), NULL, "`false`",
     "with `id_buffer`: the forward slices it (a view) instead of making ids (also on a `pos_embedding`)"},
    /* pos_embedding */
    {"max_positions", T(POS_EMBEDDING), MP_KEY_DIM, OWN, F(vocab), NULL, "req.",
     "rows of the table; must be ≥ `input.tokens`"},
    {"dim", T(POS_EMBEDDING), MP_KEY_DIM, OWN, F(dim), NULL,
     "the embedding's `dim` (required if there is no embedding before it)", "width"},
    /* linear */
    {"in_features", T(LINEAR), MP_KEY_DIM, OWN, F(in_features), NULL, "req.", ""},
    {"out_features", T(LINEAR), MP_KEY_DIM, OWN, F(out_features), NULL, "req.", ""},
    {"bias", T(LINEAR), MP_KEY_BOOL, OWN, F(bias), NULL, "`true`", "has a bias"},
    /* layernorm (the ln_ rows also on a transformer_block with "norm": "layernorm") */
    {"dim", T(LAYERNORM), MP_KEY_DIM, OWN, F(dim), NULL, "req.", "normalised width"},
    {"bias", T(LAYERNORM), MP_KEY_BOOL, OWN, F(norm.bias), NULL, "`true`; `false` with `ln_fp32` or `ln_plain`",
     "has a bias (`false`: OLMo-style, `bias=False`)"},
    {"ln_fp32", T(LAYERNORM) | TB, MP_KEY_BOOL, GEN, F(norm.ln_fp32), NULL, "`false`",
     "Cohere's LayerNorm: a Python composite in fp32, no bias (also on a `transformer_block`)"},
    {"ln_plain", T(LAYERNORM) | TB, MP_KEY_BOOL, GEN, F(norm.ln_plain), NULL, "`false`",
     "OLMo's LayerNorm: no weight, no bias, run in fp32 and cast back (also on a `transformer_block`)"},
    {"ln_1p", T(LAYERNORM) | TB, MP_KEY_BOOL, GEN, F(norm.ln_1p), NULL, "`false`",
     "Nemotron's LayerNorm1P: weight + 1, a new tensor; half under autocast (also on a `transformer_block`)"},
    /* rmsnorm */
    {"dim", T(RMSNORM), MP_KEY_DIM, OWN, F(dim), NULL, "req.", "normalised width"},
    {"rms_fp32", T(RMSNORM) | TB, MP_KEY_BOOL, GEN, F(norm.rms_fp32), NULL, "`false`",
     "the weight applied in fp32, then cast back (Gemma, OLMo2; also on a `transformer_block`)"},
    /* attention (also on transformer_block) */
    {"dim", AT, MP_KEY_DIM, OWN, F(dim), NULL, "req.", "model width (input and output)"},
    {"heads", AT, MP_KEY_DIM, OWN, F(attn.heads), NULL, "req.", "query heads"},
    {"kv_heads", AT, MP_KEY_DIM, OWN, F(attn.kv_heads), NULL, "`heads`",
     "key/value heads (GQA/MQA); must divide `heads`"},
    {"head_dim", AT, MP_KEY_DIM, OWN, F(attn.head_dim), NULL, "`dim / heads`",
     "per-head width. Without it, `heads` must divide `dim`; with it, any value (e.g. Gemma)"},
    {"causal", AT, MP_KEY_BOOL, OWN, F(attn.causal), NULL, "`true`", "causal mask"},
    {"bias", AT, MP_KEY_BOOL, OWN, NOF, NULL, "`true`", "the default for `qkv_bias` and `out_bias`"},
    {"qkv_bias", AT, MP_KEY_BOOL, OWN, F(attn.qkv_bias), NULL, "`bias`", "the q/k/v projections have biases"},
    {"out_bias", AT, MP_KEY_BOOL, OWN, F(attn.out_bias), NULL, "`bias`", "the output projection has a bias"},
    {"fused_qkv", AT, MP_KEY_BOOL, OWN, F(attn.fused_qkv), NULL, "`false`",
     "one `dim → (heads + 2·kv_heads)·head_dim` projection (GPT-2 `c_attn`, NeoX) instead of three (Llama)"},
    {"rope", AT, MP_KEY_BOOL, OWN, F(rope.on), NULL, "`false`", "rotary embedding on q and k"},
    {"rotary_dim", AT, MP_KEY_DIM, OWN, F(rope.dim), NULL, "`head_dim`",
     "partial rotary (NeoX, phi); even and ≤ `head_dim`; only with `rope`"},
    {"impl", AT, MP_KEY_IMPL, OWN, F(attn.impl), NULL, "unset: `--attention` decides (default `sdpa`)",
     "`eager` (materialises the s×s probabilities), `flash` or `sdpa`"},
    {"attn_dropout", AT, MP_KEY_PROB, OWN, F(attn.dropout), NULL, "`0`", "dropout on the attention probabilities"},
    {"qk_norm", AT, MP_KEY_ENUM, GEN, F(attn.qk_norm), qk_norm_names, "`none`",
     "RMSNorm of q and k after their projections: per head (`head`: Qwen3, Gemma3) or over the whole "
     "projection (`all`: OLMo2); `l2`: per head without a weight, on an fp32 copy cast back (Llama 4)"},
    {"qk_norm_late", AT, MP_KEY_BOOL, GEN, F(attn.qk_norm_late), NULL, "`false`",
     "with `qk_norm` and `rope`: the norms come after the rotary (HunYuan)"},
    {"clip_qkv", AT, MP_KEY_BOOL, GEN, F(attn.clip_qkv), NULL, "`false`",
     "q, k and v clamped in place after their projections (OLMo's `clip_qkv`)"},
    {"temp_tuning", AT, MP_KEY_BOOL, GEN, F(attn.temp_tuning), NULL, "`false`",
     "q times an fp32 per-position scale, cast back (Llama 4's `attn_temperature_tuning`, NoPE layers)"},
    {"softmax_fp32", AT, MP_KEY_BOOL, GEN, F(attn.softmax_fp32), NULL, "`false`",
     "eager: `softmax(..., dtype=float32)` cast back (most HF decoders); `false`: a plain softmax (GPT-2, BERT)"},
    {"attn_softcap", AT, MP_KEY_REAL, GEN, F(attn.softcap), NULL, "none",
     "tanh softcapping of the attention scores (Gemma2; eager only)"},
    {"window", AT, MP_KEY_COUNT, GEN, F(attn.window), NULL, "`0`",
     "sliding-window attention over this many positions (`0`: full); SDPA gets a mask from this length on"},
    {"eager_masks", AT, MP_KEY_COUNT, GEN, F(attn.eager_mask), NULL, "`0`",
     "eager: (b, 1, s, s) float masks the model makes once per forward for every layer (HF decoders: 1, "
     "2 with sliding-window layers)"},
    {"qkv_split", AT, MP_KEY_ENUM, GEN, F(attn.qkv_split), split_names, "`views`",
     "with `fused_qkv`: q, k, v as views of the output (GPT-2, NeoX) or Falcon's copies (`copy_mq`: "
     "multi-query, `copy_all`, `copy_expand`: k and v broadcast to every head)"},
    {"attn_mask", AT, MP_KEY_BOOL, GEN, F(attn.mask), NULL, "`false`",
     "the model builds a (b, 1, s, s) mask and hands it to every attention (Falcon)"},
    {"qk_fp32", AT, MP_KEY_BOOL, GEN, F(attn.qk_fp32), NULL, "`false`",
     "eager: q and k upcast to fp32 before QKᵀ (GPT-J)"},
    {"rope_interleave", AT, MP_KEY_BOOL, GEN, F(rope.interleave), NULL, "`false`",
     "with `rope`: interleaved pairs (GLM, Helium, ERNIE 4.5): each layer makes and saves its own cos/sin"},
    {"rope_per_sample", AT, MP_KEY_BOOL, GEN, F(rope.per_sample), NULL, "`false`",
     "with `rope`: M-RoPE (Qwen2-VL): the model's cos/sin have one row per sample"},
    {"rope_fp32", AT, MP_KEY_BOOL, GEN, F(rope.fp32), NULL, "`false`",
     "with `rope`: the model's cos/sin stay fp32 (OLMo2/3, ERNIE 4.5)"},
    {"rope_cast_back", AT, MP_KEY_BOOL, GEN, F(rope.cast_back), NULL, "`false`",
     "with `rope`: the rotated q/k (fp32 products) cast back to q's dtype (OLMo2/3, Cohere)"},
    {"rope_cat", AT, MP_KEY_BOOL, GEN, F(rope.cat), NULL, "`false`",
     "with `rope`: q/k rebuilt with `torch.cat` even at full rotary (NeoX's and phi's partial-rotary code)"},
    {"rope_tables", AT, MP_KEY_COUNT, GEN, F(rope.kinds), NULL, "`1`",
     "with `rope`: rotary tables the model makes, one per layer type (Gemma3, OLMo3)"},
    {"rope_table_rows", AT, MP_KEY_COUNT, GEN, F(rope.table_rows), NULL, "`0`",
     "with `rope`: each layer's own fp32 sinusoid buffer of this many rows (GPT-J)"},
    {"q_lora", AT, MP_KEY_COUNT, GEN, F(mla.q_lora), NULL, "`0`",
     "with `kv_lora`: q through a bottleneck of this rank (`0`: one q projection)"},
    {"kv_lora", AT, MP_KEY_COUNT, GEN, F(mla.kv_lora), NULL, "`0`",
     "multi-head latent attention (DeepSeek-V2/V3): k and v from a latent of this rank; needs `rope`, "
     "`rope_dim`, `nope_dim`, `v_dim`"},
    {"rope_dim", AT, MP_KEY_COUNT, GEN, F(mla.rope_dim), NULL, "`0`", "with `kv_lora`: rotary width of each head"},
    {"nope_dim", AT, MP_KEY_COUNT, GEN, F(mla.nope_dim), NULL, "`0`",
     "with `kv_lora`: the rest of each q/k head (heads are `nope_dim + rope_dim` wide)"},
    {"v_dim", AT, MP_KEY_COUNT, GEN, F(mla.v_dim), NULL, "`0`", "with `kv_lora`: each v head's width"},
    {"rope_complex", AT, MP_KEY_BOOL, GEN, F(mla.rope_complex), NULL, "`false`",
     "with `rope`: the rotary as an fp32 complex product cast back (Llama 4; with `kv_lora`: "
     "DeepSeek-V2's, else V3's)"},
    /* mlp (also on transformer_block) */
    {"dim", T(MLP), MP_KEY_DIM, OWN, F(dim), NULL, "req.", "model width"},
    {"ffn", T(MLP) | TB, MP_KEY_DIM, OWN, F(mlp.ffn), NULL, "req.", "hidden width"},
    {"gated", T(MLP) | TB, MP_KEY_BOOL, OWN, F(mlp.gated), NULL, "`false`",
     "SwiGLU/GeGLU: separate gate and up projections"},
    {"act", T(MLP) | TB, MP_KEY_ACT, OWN, F(mlp.act), NULL, "`gelu`; `silu` when `gated`",
     "activation, see [activation](#activation)"},
    {"bias", T(MLP) | TB, MP_KEY_BOOL, OWN, NOF, NULL, "`true`", "the default for `mlp_bias`"},
    {"mlp_bias", T(MLP) | TB, MP_KEY_BOOL, OWN, F(mlp.bias), NULL, "`bias`", "the projections have biases"},
    {"fused_gate_up", T(MLP) | TB, MP_KEY_BOOL, GEN, F(mlp.fused_gate_up), NULL, "`false`",
     "with `gated`: one gate_up projection, chunked (Phi-3)"},
    {"up_down", T(MLP) | TB, MP_KEY_BOOL, GEN, F(mlp.up_down), NULL, "`false`",
     "not gated, with its projections named `up_proj` / `down_proj` (Arcee), for LoRA targets"},
    /* activation */
    {"act", T(ACTIVATION), MP_KEY_ACT, OWN, F(mlp.act), NULL, "req.",
     "`gelu` (exact), `gelu_tanh` (fused), `relu`, `silu`, `tanh`, `sigmoid`, and HF's Python composites "
     "`gelu_new` / `gelu_fast` (same function as `gelu_tanh`, but autograd keeps 3 / 6 more input-sized "
     "tensors; GPT-2 and phi use `gelu_new`) and `relu2` (relu(x)², HF's ReLUSquaredActivation: keeps "
     "relu(x); Arcee, Nemotron) and `xielu` (HF's XIELUActivation, Apertus: two learned (1,) scalars, "
     "which the layer owns as parameters; keeps x, a bool mask, alpha_p·x, expm1(min(x, eps)) and that "
     "minus x; alpha_p·x and the output are fp32 under amp) and `quick_gelu` (x·sigmoid(1.702x), HF's "
     "QuickGELUActivation, Qwen2-VL's vision MLP: keeps x and the sigmoid). `gelu_pytorch_tanh` and `tanh_gelu` "
     "(= `gelu_tanh`) and `swish` (= `silu`) are accepted too."},
    {"inplace", T(ACTIVATION), MP_KEY_BOOL, OWN, F(inplace), NULL, "`false`",
     "`ReLU(inplace=True)`: overwrites its input"},
    /* dropout */
    {"p", T(DROPOUT), MP_KEY_PROB, OWN, F(p), NULL, "`0.5` (as `nn.Dropout`)", "drop probability in [0, 1)"},
    /* conv2d */
    {"in_ch", T(CONV2D), MP_KEY_DIM, OWN, F(conv.in_ch), NULL, "req.", "input channels"},
    {"out_ch", T(CONV2D), MP_KEY_DIM, OWN, F(conv.out_ch), NULL, "req.", "output channels"},
    {"kernel", T(CONV2D), MP_KEY_DIM, OWN, F(conv.kernel), NULL, "req.", "kernel size"},
    {"stride", T(CONV2D), MP_KEY_DIM, OWN, F(conv.stride), NULL, "`1`", ""},
    {"padding", T(CONV2D), MP_KEY_COUNT, OWN, F(conv.padding), NULL, "`0` (≥ 0)", ""},
    {"groups", T(CONV2D), MP_KEY_DIM, OWN, F(conv.groups), NULL, "`1`", "must divide `in_ch` and `out_ch`"},
    {"bias", T(CONV2D), MP_KEY_BOOL, OWN, F(bias), NULL, "`true`", "has a bias (ResNets use `false`)"},
    /* batchnorm2d */
    {"channels", T(BATCHNORM2D), MP_KEY_DIM, OWN, F(conv.in_ch), NULL, "req.", "C"},
    /* maxpool2d, avgpool2d */
    {"kernel", T(MAXPOOL2D) | T(AVGPOOL2D), MP_KEY_DIM, OWN, F(conv.kernel), NULL, "req.", ""},
    {"stride", T(MAXPOOL2D) | T(AVGPOOL2D), MP_KEY_DIM, OWN, F(conv.stride), NULL, "`kernel` (as PyTorch)", ""},
    {"padding", T(MAXPOOL2D) | T(AVGPOOL2D), MP_KEY_COUNT, OWN, F(conv.padding), NULL,
     "`0`; at most `kernel / 2`", ""},
    /* adaptive_avgpool2d */
    {"output_size", T(ADAPTIVE_AVGPOOL2D), MP_KEY_DIM, OWN, NOF, NULL, "`1`", "an integer (square) or `[h, w]`"},
    {"out_h", T(ADAPTIVE_AVGPOOL2D), MP_KEY_DIM, OWN, F(conv.out_h), NULL, "`1`",
     "the height, as a key of its own; not together with `output_size`"},
    {"out_w", T(ADAPTIVE_AVGPOOL2D), MP_KEY_DIM, OWN, F(conv.out_w), NULL, "`1`",
     "the width, as a key of its own; not together with `output_size`"},
    /* lm_head */
    {"tied", T(LM_HEAD), MP_KEY_BOOL, OWN, F(head.tied), NULL, "`false`",
     "shares the weight of the model's (first) embedding and owns no parameters. It is an error when no "
     "embedding comes before it."},
    {"vocab", T(LM_HEAD), MP_KEY_DIM, OWN, F(vocab), NULL,
     "the embedding's `vocab` (required without an embedding)", "must equal the embedding's when tied"},
    {"dim", T(LM_HEAD), MP_KEY_DIM, OWN, F(dim), NULL, "the embedding's `dim` (required without an embedding)",
     "must equal the embedding's when tied"},
    {"bias", T(LM_HEAD), MP_KEY_BOOL, OWN, F(bias), NULL, "`false`", "has a bias"},
    {"masked", T(LM_HEAD), MP_KEY_BOOL, GEN, F(head.masked), NULL, "`false`",
     "masked-LM labels, used as they are (a causal LM shifts its labels: a copy of the logits)"},
    {"mult", T(LM_HEAD), MP_KEY_REAL, GEN, F(mult), NULL, "none",
     "the logits times a Python float, a new tensor (Granite's `1 / logits_scaling`, Cohere's `logit_scale`)"},
    {"logit_softcap", T(LM_HEAD), MP_KEY_REAL, GEN, F(head.softcap), NULL, "none",
     "tanh softcapping of the logits (Gemma2)"},
    {"in_mult", T(LM_HEAD), MP_KEY_REAL, GEN, F(head.in_mult), NULL, "none",
     "the input times a Python float first (T5's `d_model**-0.5`)"},
    /* classifier */
    {"in_features", T(CLASSIFIER), MP_KEY_DIM, OWN, F(in_features), NULL, "req.", ""},
    {"classes", T(CLASSIFIER), MP_KEY_DIM, OWN, F(vocab), NULL,
     "the top-level `classes` (required when that is absent)",
     "must equal the top-level `classes` when both are given"},
    {"bias", T(CLASSIFIER), MP_KEY_BOOL, OWN, F(bias), NULL, "`true`", "has a bias"},
    {"pool", T(CLASSIFIER), MP_KEY_ENUM, OWN, F(head.pool), pool_names, "`\"none\"`",
     "`\"first\"`: a sequence (b, s, dim) is classified by its first position (ViT's class token): one label "
     "per sample"},
    /* patch_embedding */
    {"in_ch", T(PATCH_EMBEDDING), MP_KEY_DIM, OWN, F(conv.in_ch), NULL, "the input's channels", ""},
    {"dim", T(PATCH_EMBEDDING), MP_KEY_DIM, OWN, F(dim), NULL, "req.", "hidden size"},
    {"patch", T(PATCH_EMBEDDING), MP_KEY_DIM, OWN, F(conv.kernel), NULL, "req.",
     "patch side; must divide the image's height and width"},
    {"cls_token", T(PATCH_EMBEDDING), MP_KEY_BOOL, OWN, F(emb.cls_token), NULL, "`true`",
     "prepend the class token (the sequence is then patches + 1)"},
    /* custom */
    {"output_bytes", T(CUSTOM), MP_KEY_DIM, OWN, F(custom.output_bytes), NULL, "req.",
     "bytes of its output (x_{i+1})"},
    {"saved_bytes", T(CUSTOM), MP_KEY_COUNT, OWN, F(custom.saved_bytes), NULL, "`output_bytes`",
     "everything it keeps for backward when not checkpointed, **its output included** (rotor's x̄); must be "
     "≥ `output_bytes`"},
    {"params", T(CUSTOM), MP_KEY_COUNT, OWN, F(custom.params), NULL, "`0` (≥ 0)", "parameter count (elements)"},
    {"fwd_flops", T(CUSTOM), MP_KEY_COUNT, OWN, F(custom.fwd_flops), NULL, "`0` (≥ 0)", "forward FLOPs per sample"},
    {"bwd_flops", T(CUSTOM), MP_KEY_COUNT, OWN, F(custom.bwd_flops), NULL, "`2 × fwd_flops`",
     "backward FLOPs per sample"},
    /* transformer_block (besides attention's and mlp's) */
    {"norm", TB, MP_KEY_ENUM, OWN, F(norm.kind), norm_names, "`layernorm`",
     "`layernorm` or `rmsnorm` (the two norms of the layer)"},
    {"norm_bias", TB, MP_KEY_BOOL, OWN, F(norm.bias), NULL,
     "`true` for layernorm (but `ln_fp32`, `ln_plain`); `false` for rmsnorm, where `true` is an error",
     "the layernorms have biases"},
    {"p", TB, MP_KEY_PROB, OWN, F(p), NULL, "`0`",
     "residual dropout, applied to the attention and MLP outputs (GPT-2 `resid_pdrop`)"},
    {"parallel_residual", TB, MP_KEY_BOOL, OWN, F(parallel_residual), NULL, "`false`",
     "`y = x + attn(norm1(x)) + mlp(norm2(x))` (GPT-NeoX, GPT-J, phi)"},
    {"shared_norm", TB, MP_KEY_BOOL, OWN, F(norm.shared), NULL, "`false`",
     "with `parallel_residual`: a single norm feeds both branches (GPT-J, phi)"},
    {"post_norm", TB, MP_KEY_BOOL, OWN, F(norm.post), NULL, "`false`",
     "BERT order: `h = norm1(x + attn(x)); y = norm2(h + mlp(h))`; not with `parallel_residual`"},
    {"branch_norm", TB, MP_KEY_BOOL, GEN, F(norm.branch), NULL, "`false`",
     "each branch's output is normed before its residual add (Gemma2/3, OLMo2); not with `post_norm` or "
     "`parallel_residual`"},
    {"no_pre_norm", TB, MP_KEY_BOOL, GEN, F(norm.no_pre), NULL, "`false`",
     "with `branch_norm`: no norm before the branches (OLMo2)"},
    {"no_attn_out_dropout", TB, MP_KEY_BOOL, GEN, F(attn.no_out_dropout), NULL, "`false`",
     "the residual dropout `p` is on the MLP branch only (StableLM, DistilBERT)"},
    {"mult", TB, MP_KEY_REAL, GEN, F(mult), NULL, "none",
     "each residual branch times a Python float, a new tensor (Granite's `residual_multiplier`); pre-norm "
     "blocks only"},
    {"experts", TB, MP_KEY_COUNT, GEN, F(moe.experts), NULL, "`0`",
     "mixture of experts: the MLP is a router and this many experts (all in two 3-D parameters, run by "
     "grouped_mm); needs `top_k` and `expert_ffn`"},
    {"top_k", TB, MP_KEY_COUNT, GEN, F(moe.top_k), NULL, "`0`", "with `experts`: experts per token, at most `experts`"},
    {"expert_ffn", TB, MP_KEY_COUNT, GEN, F(moe.expert_ffn), NULL, "`0`", "with `experts`: one expert's hidden width"},
    {"shared_ffn", TB, MP_KEY_COUNT, GEN, F(moe.shared_ffn), NULL, "`0`",
     "with `experts`: a shared expert of this hidden width (`0`: none)"},
    {"shared_gate", TB, MP_KEY_BOOL, GEN, F(moe.shared_gate), NULL, "`false`",
     "with `shared_ffn`: `sigmoid(Linear(dim, 1))` times the shared expert (Qwen2-MoE)"},
    {"shared_first", TB, MP_KEY_BOOL, GEN, F(moe.shared_first), NULL, "`false`",
     "with `shared_ffn`: the shared expert runs before the router (Qwen2-MoE)"},
    {"norm_topk", TB, MP_KEY_BOOL, GEN, F(moe.norm_topk), NULL, "`false`",
     "with `experts`: the top-k weights renormalised in place"},
    {"route_mask", TB, MP_KEY_BOOL, GEN, F(moe.route_mask), NULL, "`false`",
     "with `experts`: group-limited routing keeps a (tokens, experts) bool mask (DeepSeek-V2)"},
    {"input_jitter", TB, MP_KEY_BOOL, GEN, F(moe.input_jitter), NULL, "`false`",
     "with `experts`: the input multiplied in place by uniform noise twice, each noise kept (PhiMoE's "
     "`input_jitter_noise`)"},
    {"router", TB, MP_KEY_ENUM, GEN, F(moe.router), router_names, "`softmax`",
     "with `experts`: `softmax` of fp32 logits (Mixtral), `softmax_cast` back to the logits' dtype "
     "(Qwen-MoE), `fp32_softmax` / `fp32_sigmoid` on fp32 copies of x and W (DeepSeek-V2 / V3), "
     "`topk_softmax` over the top k (GraniteMoE), `sparsemixer`: PhiMoE's two sampled choices "
     "(`top_k` 2), `dense_sigmoid`: Llama 4's sigmoid of the top k, every expert on every token (bmm)"},
    /* bottleneck */
    {"in_ch", T(BOTTLENECK), MP_KEY_DIM, OWN, F(conv.in_ch), NULL, "req.", "input channels"},
    {"mid_ch", T(BOTTLENECK), MP_KEY_DIM, OWN, F(conv.mid_ch), NULL, "req.", "bottleneck width"},
    {"out_ch", T(BOTTLENECK), MP_KEY_DIM, OWN, F(conv.out_ch), NULL, "`4 × mid_ch`", "output channels"},
    {"stride", T(BOTTLENECK), MP_KEY_DIM, OWN, F(conv.stride), NULL, "`1`",
     "stride of the 3×3 conv (and of the projection)"},
    {"groups", T(BOTTLENECK), MP_KEY_DIM, OWN, F(conv.groups), NULL, "`1`",
     "groups of the 3×3 conv (ResNeXt); must divide `mid_ch`"},
    {"downsample", T(BOTTLENECK), MP_KEY_BOOL, OWN, F(conv.downsample), NULL,
     "`true` when `stride ≠ 1` or `in_ch ≠ out_ch`",
     "projection shortcut. `false` is an error when the shapes need one."},
};
const size_t mp_n_keys = sizeof mp_keys / sizeof mp_keys[0];

/* The type whose section of docs/model-format.md documents the row: its first type. */
enum mp_layer_type mp_key_home(const struct mp_key *k)
{
    for (int t = 0; t < MP_LT_COUNT; t++)
        if (k->types & (1u << t))
            return (enum mp_layer_type)t;
    return MP_LT_COUNT;
}

void mp_json_layer_keys(enum mp_layer_type t, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (size_t i = 0; i < mp_n_keys; i++)
        if ((unsigned)t < MP_LT_COUNT && (mp_keys[i].types & (1u << t))) {
            int w = snprintf(out + n, cap - n, "%s%s", n ? " " : "", mp_keys[i].key);
            if (w < 0 || (size_t)w >= cap - n)
                MP_BUG("%s's keys need more than %zu bytes", mp_layer_type_str(t), cap);
            n += (size_t)w;
        }
}
