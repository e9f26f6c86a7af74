/* recipe_impl.h — recipe/'s own: the facts a recipe's keys set, the key table's row, the trainer
 * rows of defaults (recipe_keys.c holds the tables, recipe.c reads and derives). */
#ifndef MEMPLAN_RECIPE_IMPL_H
#define MEMPLAN_RECIPE_IMPL_H

#include "recipe/recipe.h"

/* What a recipe says, in its trainer's words, before it becomes memplan's settings. */
enum fact {
    F_MODEL,        /* the model's path or Hub id */
    F_BATCH,        /* micro-batch per device */
    F_GA,           /* gradient accumulation steps */
    F_SEQ,          /* the sequence length it pads/truncates to */
    F_DTYPE,        /* the dtype the model is loaded in */
    F_BF16,         /* bf16 autocast (Axolotl: also the load dtype; "auto" allowed) */
    F_FP16,         /* fp16 autocast */
    F_PURE_BF16,    /* LLaMA-Factory: bf16 trainable parameters (no fp32 upcast) */
    F_GC,           /* gradient checkpointing on */
    F_REENTRANT,    /* torch.utils.checkpoint use_reentrant */
    F_OPTIM,        /* the optimizer by its HF TrainingArguments name */
    F_OPT_FUSED,    /* torchtune: optimizer.fused */
    F_PEFT,         /* adapters: "lora"/"qlora"/true/false/"full" in the trainer's spelling */
    F_LOAD4,        /* bitsandbytes 4-bit base */
    F_LOAD8,        /* bitsandbytes 8-bit base */
    F_QBIT,         /* LLaMA-Factory quantization_bit */
    F_NESTED,       /* bitsandbytes double quantization */
    F_QTYPE,        /* bnb_4bit_quant_type */
    F_QSTORAGE,     /* bnb_4bit_quant_storage */
    F_LORA_R,
    F_LORA_ALPHA,
    F_LORA_DROPOUT,
    F_LORA_TARGETS, /* names (a list is joined with ','), "all-linear" / "all" */
    F_LORA_MLP,     /* torchtune apply_lora_to_mlp */
    F_ATTN,         /* attn_implementation in transformers' spelling */
    F_USE_CACHE,    /* TrainingArguments.use_cache: the Trainer sets model.config.use_cache from it */
    F_LOSS,         /* the loss: "hf" or the trainer's name of another */
    F_PLUGINS,      /* Axolotl plugins (a list joined with ',') */
    F_CCE,          /* Axolotl cut_cross_entropy (the CutCrossEntropyPlugin's key) */
    F_LIGER,        /* TrainingArguments use_liger_kernel */
    F_LK_FLCE,      /* Liger's kernels, each true or false: liger_kernel_config's keys (HF, TRL), */
    F_LK_CE,        /* Axolotl's LigerPlugin flags (liger_rope, ...) */
    F_LK_ROPE,
    F_LK_RMS,
    F_LK_SWIGLU,
    F_LK_GEGLU,
    F_LK_LN,
    F_LK_R2,
    F_LK_GLU,       /* Axolotl liger_glu_activation: the model's SwiGLU or GeGLU */
    F_GC_EVERY,     /* transformers' every_n_layers: checkpoint decoder layers 0, N, 2N, ... */
    F_GC_OFFLOAD,   /* transformers' offload: the checkpointed layers' inputs in pinned host memory */
    F_ACT_OFFLOAD,  /* TRL activation_offloading: OffloadActivations around the step (--act-offload) */
    F_GC_SAC,       /* selective checkpointing: TRL's gradient_checkpointing_kwargs.selective, Axolotl's
                       selective_checkpointing (true) */
    F_GC_SAC_SAVE,  /* Axolotl selective_checkpointing.save: the ops saved ("attention") */
    F_PACKING,      /* packing documents into rows (TRL packing, Axolotl sample_packing, LLaMA-Factory
                       packing, torchtune dataset.packed) */
    F_PACK_STRATEGY, /* TRL packing_strategy (bfd, bfd_split, wrapped) */
    F_PADDING_FREE, /* the micro-batch flattened into one row (TRL padding_free, Axolotl batch_flattening) */
    F_NEAT_PACKING, /* LLaMA-Factory neat_packing: packing without cross-document attention */
    F_PRECOMPUTE,   /* DPOConfig precompute_ref_log_probs: no reference model in the step */
    F_DROPOUT_OFF,  /* DPOConfig / KTOConfig / GRPOConfig disable_dropout */
    /* GRPOConfig (trl 1.16.0 grpo_config.py) */
    F_COMPLETION,   /* max_completion_length */
    F_NUM_GEN,      /* num_generations */
    F_STEPS_PER_GEN, /* steps_per_generation */
    F_GEN_BATCH,    /* generation_batch_size (steps_per_generation x the global batch) */
    F_BETA,         /* the KL coefficient: > 0 a reference model */
    F_USE_VLLM,     /* use_vllm */
    F_VLLM_MODE,    /* vllm_mode: colocate or server */
    F_VLLM_UTIL,    /* vllm_gpu_memory_utilization */
    F_NUM_ITER,     /* num_iterations */
    F_VLLM_IS,      /* vllm_importance_sampling_correction */
    F_DS3_GATHER,   /* ds3_gather_for_generation */
    F_TEMPERATURE,  /* generate's sampling temperature */
    F_TOP_P,        /* its warpers: top_p, top_k, min_p */
    F_TOP_K,
    F_MIN_P,
    F_REP_PENALTY,  /* repetition_penalty */
    F_RL,           /* Axolotl's rl: the preference trainer */
    F_LF_STAGE,     /* LLaMA-Factory's stage */
    F_N
};

/* What a key does. */
enum key_act {
    A_NOMEM,  /* accepted: no effect on the training step's GPU memory */
    A_FACT,   /* sets its fact (with .as: a true value sets the fact to .as, a false one nothing) */
    A_REFUSE, /* refused unless its value is inert (.inert, else null/false/0/empty) */
};

/* Formats as bits: the TrainingArguments keys are HF's, TRL's and LLaMA-Factory's. */
enum { B_HF = 1, B_TRL = 2, B_AX = 4, B_LF = 8, B_TT = 16, B_ARGS = B_HF | B_TRL | B_LF,
       B_DPO = 32, /* a TRL file read as DPOConfig (--trainer dpo): its rows come first and win */
       B_KTO = 64, /* a TRL file read as KTOConfig (--trainer kto, kto-apo): likewise */
       B_KTO_APO = 128, /* ... with --trainer kto-apo (loss_type apo_zero_unpaired): its rows come first */
       B_GRPO = 256, /* a TRL file read as GRPOConfig (--trainer grpo): likewise */
       B_ORPO = 512, /* a TRL file read as ORPOConfig (--trainer orpo): likewise */
       B_AXRL = 1024, /* an Axolotl file read with --trainer dpo, kto or orpo (its rl:): likewise */
       B_LFDPO = 2048, /* a LLaMA-Factory file read with --trainer dpo (stage: dpo): likewise */
       B_LFKTO = 4096 /* a LLaMA-Factory file read with --trainer kto (stage: kto): likewise */ };

struct key_row {
    unsigned fmts;
    const char *key;      /* dotted path of nested keys ("optimizer._component_") */
    enum key_act act;
    enum fact fact;
    const char *as;       /* A_FACT of a flag: the value a true flag stands for */
    const char *inert;    /* A_REFUSE: the values that change nothing (space-separated) */
    const char *why;      /* A_REFUSE: why, after "KEY: VALUE: " */
};

extern const struct key_row mp_recipe_keys[];
extern const size_t mp_recipe_n_keys;
/* The first key of the table that sets fact f (not as a flag) for the formats in fmt_bit (the
 * format's own name for it: "micro_batch_size"), or NULL. */
const char *mp_recipe_fact_key(unsigned fmt_bit, enum fact f);

/* Per format: the keys with no memory effect, space-separated; a word also covers the keys
 * nested under it ("datasets" covers "datasets.path"). */
extern const char *const mp_recipe_nomem[MP_RF_N];

/* A trainer and version: its defaults by fact (NULL: none), each with its source. */
struct trainer_row {
    enum mp_recipe_format format;
    const char *dflt[F_N];
};
extern const struct trainer_row mp_recipe_trainers[MP_RF_N];

#endif
