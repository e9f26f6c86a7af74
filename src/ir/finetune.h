/* finetune.h — what a fine-tuning run trains: full, LoRA, QLoRA or frozen blocks.
 *
 * The spec is filled from the command line (--finetune, --lora-*, --train-blocks)
 * and read by the lowering (src/ir/): which parameters are trainable, which
 * Linears get LoRA adapters (peft LoraConfig.target_modules), and how the frozen
 * base is stored (bitsandbytes 4-bit for QLoRA, or the checkpoint's own
 * quantization_config).  Names follow the Hugging Face modules of the family
 * (c_attn for GPT-2, query_key_value for NeoX, q_proj for Llama) so targets
 * written for peft mean the same here.  Pure: no I/O.
 */
#ifndef MEMPLAN_FINETUNE_H
#define MEMPLAN_FINETUNE_H

#include "model/model.h"

/* What trains (--finetune): X(id, name). */
#define MP_FT_MODES(X)   \
    X(FULL, "full")      \
    X(LORA, "lora")      \
    X(QLORA, "qlora")    \
    X(FREEZE, "freeze")
/* Why peft's adapters are not fp32 (autocast_adapter_dtype): FSDP2's MixedPrecisionPolicy
 * (param_dtype=bf16, --precision mixed-bf16) casts every parameter (their fp32 originals are its
 * shards); DeepSpeed's bf16 mode casts every parameter of a model not made under zero.Init;
 * under ZeRO-3 TRL makes LoRA's adapters in the base's dtype; TRL's trainers cast a bitsandbytes
 * base's trainable parameters to bf16.  All but MP_AC_TRL_QUANT give the program's dtype. */
enum mp_adapter_cast { MP_AC_NONE, MP_AC_FSDP2, MP_AC_DEEPSPEED, MP_AC_ZERO3_TRL, MP_AC_TRL_QUANT };

enum mp_ft_mode {
#define MP_X(id, name) MP_FT_##id,
    MP_FT_MODES(MP_X)
#undef MP_X
};
const char *mp_ft_mode_str(enum mp_ft_mode m);
int mp_ft_mode_parse(const char *s); /* -1 if unknown */
const char *mp_ft_mode_names(const char *sep, const char *last);

#define MP_FT_TARGETS_MAX 16
#define MP_FT_RANGES_MAX 16

struct mp_finetune {
    enum mp_ft_mode mode;
    uint64_t r;                 /* LoRA rank (default 16) */
    double alpha;               /* lora_alpha (default 2r); scaling = alpha / r */
    double dropout;             /* lora_dropout: 0 = identity (x shared with the base Linear) */
    bool all_linear;            /* target_modules="all-linear" */
    size_t n_targets;           /* explicit target names; 0 with !all_linear = the family's default */
    char targets[MP_FT_TARGETS_MAX][32];
    /* freeze: trained decoder blocks [lo, hi] (inclusive), plus the embedding / head blocks */
    size_t n_ranges;
    uint64_t range_lo[MP_FT_RANGES_MAX], range_hi[MP_FT_RANGES_MAX];
    bool train_embed, train_head;
    bool input_grad;            /* enable_input_require_grads(): the embedding output requires grad
                                 * (transformers does it whenever gradient checkpointing is on) */
    bool kbit_prepare;          /* QLoRA: prepare_model_for_kbit_training casts the non-quantized
                                 * half parameters (embeddings, norms, head, biases) to fp32 */
    struct mp_quant quant;      /* base storage for QLoRA (bnb nf4, double quant) */
    enum mp_adapter_cast adapters_cast; /* who makes the adapters a dtype other than peft's fp32
                                 * (mp_par_adapters_cast; MP_AC_NONE: fp32 as peft makes them) */
};

/* full fine-tuning; LoRA r 16, alpha 32 and dropout 0 (peft's default: an identity). */
void mp_finetune_default(struct mp_finetune *f);
/* The adapters' dtype in a program whose parameters are `param_dtype` (f->adapters_cast). */
enum mp_dtype mp_finetune_adapter_dtype(const struct mp_finetune *f, enum mp_dtype param_dtype);

/* --lora-targets: "all-linear" or NAME[,NAME...].  --train-blocks: "20-31,head,embed". */
enum mp_status mp_finetune_parse_targets(struct mp_finetune *f, const char *s, struct mp_diag *d);
enum mp_status mp_finetune_parse_blocks(struct mp_finetune *f, const char *s, struct mp_diag *d);

/* peft's default target_modules for an HF model_type (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING),
 * as a comma list; NULL when peft has none (memplan JSON models: all-linear is used). */
const char *mp_finetune_default_targets(const char *hf_type);

/* True when f asks for all-linear (given, or as the fallback of a family peft has no default for)
 * on a family where peft's all-linear also adapts MoE routers and fused experts, which memplan
 * does not model: the caller refuses, asking for named targets. */
bool mp_finetune_all_linear_unmodelled(const struct mp_finetune *f, const char *hf_type);

/* The Hugging Face module name of one of memplan's Linear roles (q_proj, k_proj,
 * v_proj, qkv_proj, o_proj, gate_proj, up_proj, down_proj, fc1, fc2) in a family. */
const char *mp_finetune_hf_name(const char *hf_type, const char *role);

/* Does the Linear `role` (memplan's name) get an adapter?  head: it is the output layer
 * (lm_head / classifier), which all-linear excludes. */
bool mp_finetune_targets(const struct mp_finetune *f, const char *hf_type, const char *role, bool head);
/* Does the Linear module named `name` (its HF name, not an output layer) get an adapter? */
bool mp_finetune_targets_module(const struct mp_finetune *f, const char *hf_type, const char *name);

/* freeze mode: is block `index` trainable?  rep is its index among the repeated blocks
 * (decoder layers), -1 for blocks before them (embed) or after them (head: after = true). */
bool mp_finetune_block_trained(const struct mp_finetune *f, long rep, bool after);

/* Describes the targets in words for the report: "q_proj,v_proj (peft's default for llama)". */
void mp_finetune_describe_targets(const struct mp_finetune *f, const char *hf_type, char *buf, size_t len);

#endif
