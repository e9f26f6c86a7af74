/* recipe_keys.c — the tables of recipes: one row per trainer (and version) of its defaults, the
 * key table (every memory-relevant key: the fact it sets, or why it is refused) and, per format,
 * the keys with no memory effect.
 *
 * Sources (read for each row; versions as installed or downloaded from PyPI, 2026-11):
 *   transformers==5.24.0:transformers/training_args.py (TrainingArguments)
 *   trl==1.16.0:trl/trainer/{base_config,sft_config,dpo_config,model_config}.py, trl/scripts/{sft,utils}.py
 *   axolotl==0.19.0:axolotl/utils/schemas/{config,training}.py, axolotl/utils/config/__init__.py,
 *     axolotl/core/builders/base.py, axolotl/loaders/model.py
 *   llamafactory==0.9.5:llamafactory/hparams/{model,data,finetuning}_args.py, hparams/parser.py,
 *     llamafactory/model/adapter.py
 *   torchtune==0.6.1:recipes/full_finetune_single_device.py, torchtune/training/{precision,activations}.py
 * A new version of a trainer is a new row (and its format's name in recipe.h).
 */
#include "recipe/recipe_impl.h"

/* ---- the trainers' defaults ----------------------------------------------------------------- */

const struct trainer_row mp_recipe_trainers[MP_RF_N] = {
    {MP_RF_HF, {
        [F_BATCH] = "8",       /* training_args.py:777 per_device_train_batch_size default=8 */
        [F_GA] = "1",          /* training_args.py:849 gradient_accumulation_steps default=1 */
        /* F_SEQ: TrainingArguments has no length (the collator's): memplan's default applies */
        [F_DTYPE] = "auto",    /* TrainingArguments does not load the model: from_pretrained's own
                                  default dtype="auto", the checkpoint's (modeling_utils.py:4033) */
        [F_BF16] = "false",    /* training_args.py:874 */
        [F_FP16] = "false",    /* training_args.py:880 */
        [F_GC] = "false",      /* training_args.py:1544 activation_checkpointing None -> False */
        [F_REENTRANT] = "false", /* modeling_utils.py:3158 kwargs None -> {"use_reentrant": False} */
        [F_OPTIM] = "adamw_torch_fused", /* training_args.py:806-811 (torch >= 2.8) */
        [F_PEFT] = "false",    /* the Trainer trains what the model hands it: full */
        [F_USE_CACHE] = "false", /* training_args.py:971; trainer.py:646 sets model.config.use_cache */
        [F_LOSS] = "hf",       /* the model's own loss (loss_utils.py ForCausalLMLoss) */
    }},
    {MP_RF_TRL, {
        [F_BATCH] = "8",       /* inherited from TrainingArguments */
        [F_GA] = "1",
        [F_SEQ] = "1024",      /* sft_config.py:202 max_length default=1024 */
        [F_DTYPE] = "float32", /* model_config.py:90 dtype default="float32" (scripts/sft.py:80 loads with it) */
        [F_BF16] = "!fp16",    /* base_config.py:108 bf16 = not fp16 when unset */
        [F_FP16] = "false",
        [F_GC] = "true",       /* base_config.py:62 gradient_checkpointing default=True */
        [F_REENTRANT] = "false", /* the Trainer's: modeling_utils.py:3158 */
        [F_OPTIM] = "adamw_torch_fused",
        [F_PEFT] = "false",    /* model_config.py use_peft default=False */
        [F_LOAD4] = "false",
        [F_LOAD8] = "false",
        [F_NESTED] = "false",  /* model_config.py use_bnb_nested_quant default=False */
        [F_QTYPE] = "nf4",     /* model_config.py bnb_4bit_quant_type default="nf4" */
        [F_QSTORAGE] = "uint8", /* model_config.py:168 None: BitsAndBytesConfig's uint8 */
        [F_LORA_R] = "16",     /* model_config.py lora_r default=16 */
        [F_LORA_ALPHA] = "32", /* lora_alpha default=32 */
        [F_LORA_DROPOUT] = "0.05", /* lora_dropout default=0.05 */
        [F_USE_CACHE] = "false",
        [F_PACKING] = "false", /* sft_config.py:222 packing default=False */
        [F_PACK_STRATEGY] = "bfd", /* sft_config.py:229 packing_strategy default="bfd" */
        [F_PADDING_FREE] = "false", /* sft_config.py:238 */
        [F_LOSS] = "nll",      /* sft_config.py:283 loss_type default="nll": every loss_type goes through
                                  the chunked fused LM head (sft_trainer.py:1144 add_fused_lm_head) */
    }},
    {MP_RF_AXOLOTL, {
        [F_BATCH] = "1",       /* schemas/training.py:77 micro_batch_size default=1 */
        [F_GA] = "1",          /* schemas/training.py:71 */
        [F_SEQ] = "512",       /* schemas/config.py:671 sequence_len default=512 */
        [F_BF16] = "auto",     /* schemas/config.py:561; utils/config/__init__.py:198 loads the model in it */
        [F_FP16] = "false",
        [F_GC] = "false",      /* schemas/config.py:606 */
        [F_REENTRANT] = "false", /* core/builders/base.py:617 {"use_reentrant": False} when unset */
        [F_OPTIM] = "adamw_torch_fused", /* schemas/training.py:122 */
        [F_PEFT] = "none",     /* adapter unset: full fine-tuning */
        [F_LOAD4] = "false",
        [F_LOAD8] = "false",
        [F_NESTED] = "true",   /* loaders/model.py:807 bnb_4bit_use_double_quant True */
        [F_QTYPE] = "nf4",
        [F_USE_CACHE] = "false",
        [F_LOSS] = "hf",
    }},
    {MP_RF_LLAMAFACTORY, {
        [F_BATCH] = "8",       /* TrainingArguments' */
        [F_GA] = "1",
        [F_SEQ] = "2048",      /* hparams/data_args.py:46 cutoff_len default=2048 */
        [F_BF16] = "false",
        [F_FP16] = "false",
        [F_PURE_BF16] = "false", /* hparams/finetuning_args.py:456 */
        [F_GC] = "true",       /* hparams/model_args.py:145 disable_gradient_checkpointing default=False */
        [F_REENTRANT] = "true", /* hparams/model_args.py:149 use_reentrant_gc default=True */
        [F_OPTIM] = "adamw_torch_fused",
        [F_PEFT] = "lora",     /* hparams/finetuning_args.py:464 finetuning_type default="lora" */
        [F_NESTED] = "true",   /* hparams/model_args.py:291 double_quantization default=True */
        [F_QTYPE] = "nf4",
        [F_LORA_R] = "8",      /* finetuning_args.py:77 lora_rank default=8 */
        [F_LORA_ALPHA] = "2r", /* finetuning_args.py:568 lora_alpha or lora_rank * 2 */
        [F_LORA_DROPOUT] = "0", /* finetuning_args.py:73 */
        [F_LORA_TARGETS] = "all", /* finetuning_args.py:81 lora_target default="all" */
        [F_ATTN] = "auto",     /* hparams/model_args.py:117 flash_attn default auto (transformers' choice) */
        [F_USE_CACHE] = "false",
        [F_LOSS] = "hf",
    }},
    {MP_RF_TORCHTUNE, {
        /* batch_size, gradient_accumulation_steps, optimizer, loss: the recipe reads them with no
           default (cfg.batch_size): a config without them fails in torchtune too */
        [F_DTYPE] = "fp32",    /* training/precision.py:100 None -> torch.float32 */
        [F_GC] = "false",      /* full_finetune_single_device.py:160 */
        [F_REENTRANT] = "false", /* training/activations.py:26 use_reentrant=False */
        [F_OPT_FUSED] = "false",
        [F_PEFT] = "full",
    }},
};

/* ---- the key table -------------------------------------------------------------------------- */

#define FACT(f, k, fa) {f, k, A_FACT, fa, NULL, NULL, NULL}
#define FLAG(f, k, fa, v) {f, k, A_FACT, fa, v, NULL, NULL}
#define REFUSE(f, k, w) {f, k, A_REFUSE, F_N, NULL, NULL, w}
#define REFUSE_BUT(f, k, in, w) {f, k, A_REFUSE, F_N, NULL, in, w}
#define NOT_YET "not modelled yet"
#define DP "data parallelism from a recipe is not read yet: drop the key and give --gpus N --parallel S"

#define NOMEM(f, k) {f, k, A_NOMEM, F_N, NULL, NULL, NULL}
/* trl 1.16.0 dpo_config.py: DPOTrainer's loss types, each computed from the per-sequence log-probs
 * of the one fused LM head (dpo_trainer.py:1381-1528) */
#define DPO_LOSSES "sigmoid hinge ipo exo_pair nca_pair robust bco_pair sppo_hard aot aot_unpaired apo_zero " \
                   "apo_down discopop sft sigmoid_norm"

const struct key_row mp_recipe_keys[] = {
    /* Axolotl 0.19's rl: dpo, ipo, kto, orpo (core/builders/rl.py HFRLTrainerBuilder): TRL 1.16's
     * DPOTrainer (ipo: loss_type ["ipo"]), KTOTrainer and ORPOTrainer with Axolotl's optimizer
     * and scheduler mixins; max_length = sequence_len (core/builders/base.py); the reference
     * (train.py setup_reference_model): with an adapter none (TRL disables the adapter), else a
     * second copy of the model; read with the matching --trainer, first, so that they win */
    FLAG(B_AXRL, "precompute_ref_log_probs", F_PRECOMPUTE, "true"), /* DPOStrategy (dpo, ipo) only */
    NOMEM(B_AXRL, "rl_beta"), NOMEM(B_AXRL, "trl.beta"), NOMEM(B_AXRL, "orpo_alpha"), /* -> beta */
    NOMEM(B_AXRL, "dpo_label_smoothing"), NOMEM(B_AXRL, "dpo_loss_weights"),
    NOMEM(B_AXRL, "kto_desirable_weight"), NOMEM(B_AXRL, "kto_undesirable_weight"),
    /* DPOConfig padding_free: "setting it to True warns and falls back to standard padding" */
    NOMEM(B_AXRL, "dpo_padding_free"),
    /* max_prompt_len: prompts truncated inside sequence_len, which bounds the rows planned */
    NOMEM(B_AXRL, "max_prompt_len"),
    REFUSE_BUT(B_AXRL, "dpo_loss_type", "null " DPO_LOSSES,
               "not one DPOConfig loss type (several at once are not read yet)"),
    REFUSE_BUT(B_AXRL, "dpo_use_weighting", "false False null",
               "WPO weighting (a fifth output of TRL's fused head, dpo_trainer.py:957): " NOT_YET),
    REFUSE_BUT(B_AXRL, "dpo_use_liger_kernel", "false False null", "Liger's DPO loss: " NOT_YET),
    REFUSE_BUT(B_AXRL, "rl_adapter_ref_model", "false False null",
               "a second copy of the model as the reference beside the adapter's policy (train.py "
               "setup_reference_model): " NOT_YET),
    REFUSE_BUT(B_AXRL, "trl.sync_ref_model", "false False null", "the reference synced with the policy: " NOT_YET),
    /* LLaMA-Factory 0.9.5's DPO keys (hparams/finetuning_args.py RLHFArguments), read with --trainer
     * dpo: the loss's figures act on b-sized log-probs (train/dpo/trainer.py:150-216) */
    NOMEM(B_LFDPO | B_LFKTO, "pref_beta"), NOMEM(B_LFDPO | B_LFKTO, "pref_ftx"),
    NOMEM(B_LFDPO, "dpo_label_smoothing"),
    NOMEM(B_LFDPO, "simpo_gamma"), NOMEM(B_LFDPO, "pref_bco_weight"),
    REFUSE_BUT(B_LFDPO, "pref_loss", "sigmoid hinge ipo kto_pair",
               "orpo and simpo run without a reference (use_ref_model false, finetuning_args.py:574): "
               NOT_YET " (sigmoid, hinge, ipo and kto_pair are)"),
    REFUSE_BUT(B_LFDPO, "ld_alpha", "null", "LD-DPO's front and rear masks (trainer_utils.py:615-632): " NOT_YET),
    REFUSE_BUT(B_LFDPO | B_LFKTO, "ref_model", "null", "a reference model of its own (create_ref_model): " NOT_YET),
    REFUSE_BUT(B_LFDPO | B_LFKTO, "ref_model_adapters", "null",
               "a reference model of its own (create_ref_model): " NOT_YET),
    REFUSE_BUT(B_LFDPO | B_LFKTO, "ref_model_quantization_bit", "null", "a quantized reference model: " NOT_YET),
    /* LLaMA-Factory 0.9.5's KTO keys, read with --trainer kto (stage: kto): beta, the weights and the
     * ftx term act on b-sized log-probs (train/kto/trainer.py:77-80, 239-251; trl 0.24.0
     * kto_trainer.py:1119-1194 kto_loss); CustomKTOTrainer reads none of the DPO loss's keys
     * (pref_loss, dpo_label_smoothing, simpo_gamma, pref_bco_weight, ld_alpha: get_batch_logps is
     * called without ld_alpha, :180) */
    NOMEM(B_LFKTO, "kto_chosen_weight"), NOMEM(B_LFKTO, "kto_rejected_weight"), NOMEM(B_LFKTO, "pref_loss"),
    NOMEM(B_LFKTO, "dpo_label_smoothing"), NOMEM(B_LFKTO, "simpo_gamma"), NOMEM(B_LFKTO, "pref_bco_weight"),
    NOMEM(B_LFKTO, "ld_alpha"),
    /* DPOConfig (trl 1.16.0 trainer/dpo_config.py), read with --trainer dpo: first, so that they win */
    FLAG(B_DPO, "precompute_ref_log_probs", F_PRECOMPUTE, "true"), /* :227; dpo_trainer.py:909-914 */
    /* the precompute pass runs before training (dpo_trainer.py:1013-1018), the policy alone, no grad */
    REFUSE_BUT(B_DPO, "precompute_ref_batch_size", "null",
               "a precompute pass at its own batch, before training: not modelled yet (null: the training batch)"),
    REFUSE_BUT(B_DPO, "loss_type", DPO_LOSSES " [sigmoid]",
               "not one of DPOConfig's loss types (several at once are not read yet)"),
    NOMEM(B_DPO, "loss_weights"), NOMEM(B_DPO, "beta"), NOMEM(B_DPO, "label_smoothing"),
    NOMEM(B_DPO, "f_divergence_type"), NOMEM(B_DPO, "f_alpha_divergence_coef"), NOMEM(B_DPO, "discopop_tau"),
    NOMEM(B_DPO, "ref_model_mixup_alpha"), NOMEM(B_DPO, "ref_model_sync_steps"),
    /* dpo_config.py:210-218: "setting it to True warns and falls back to standard padding" */
    NOMEM(B_DPO, "padding_free"),
    REFUSE_BUT(B_DPO, "use_weighting", "false False null",
               "WPO weighting (a fifth output of the fused head, dpo_trainer.py:957): " NOT_YET),
    REFUSE_BUT(B_DPO, "ld_alpha", "null", "LD-DPO's length masks: " NOT_YET),
    REFUSE_BUT(B_DPO, "sync_ref_model", "false False null",
               "TR-DPO's reference sync (the copy mixed with the policy): " NOT_YET),
    /* KTOConfig (trl 1.16.0 trainer/kto_config.py), read with --trainer kto */
    FLAG(B_KTO, "precompute_ref_log_probs", F_PRECOMPUTE, "true"), /* :180; kto_trainer.py:919-925 */
    REFUSE_BUT(B_KTO, "precompute_ref_batch_size", "null",
               "a precompute pass at its own batch, before training: not modelled yet (null: the training batch)"),
    /* apo_zero_unpaired computes no KL term: no KL forwards (kto_trainer.py:815, 836), --trainer kto-apo */
    REFUSE_BUT(B_KTO_APO, "loss_type", "apo_zero_unpaired", "the KL term's loss: read this file with --trainer kto"),
    REFUSE_BUT(B_KTO, "loss_type", "kto", "no KL term (no KL forwards): read this file with --trainer kto-apo"),
    NOMEM(B_KTO, "beta"), NOMEM(B_KTO, "desirable_weight"), NOMEM(B_KTO, "undesirable_weight"),
    NOMEM(B_KTO, "ref_model_mixup_alpha"), NOMEM(B_KTO, "ref_model_sync_steps"),
    REFUSE_BUT(B_KTO, "sync_ref_model", "false False null", "the reference synced with the policy: " NOT_YET),
    FACT(B_DPO | B_KTO | B_GRPO | B_ORPO, "disable_dropout", F_DROPOUT_OFF), /* --disable-dropout */
    /* ORPOConfig (trl 1.16.0 experimental/orpo/orpo_config.py), read with --trainer orpo: its loss
     * is fixed (the chosen rows' NLL and the odds ratio on the model's logits) */
    NOMEM(B_ORPO, "beta"), NOMEM(B_ORPO, "padding_value"), NOMEM(B_ORPO, "generate_during_eval"),
    NOMEM(B_ORPO, "max_completion_length"), /* truncates the completion inside max_length */
    REFUSE(B_ORPO, "loss_type", "not an ORPOConfig key (ORPO's loss is its own: the chosen rows' NLL and the "
                                "odds ratio)"),
    REFUSE(B_ORPO, "packing", "not an ORPOConfig key (ORPO pads chosen and rejected to the batch's longest)"),
    REFUSE(B_ORPO, "padding_free", "not an ORPOConfig key (ORPO pads chosen and rejected to the batch's longest)"),
    REFUSE(B_ORPO, "completion_only_loss", "not an ORPOConfig key (ORPO's NLL covers prompt and completion)"),
    REFUSE(B_ORPO, "assistant_only_loss", "not an ORPOConfig key (ORPO's NLL covers prompt and completion)"),
    REFUSE_BUT(B_ORPO, "use_liger_kernel", "false False null", "Liger's kernels on the model under ORPO: " NOT_YET),
    REFUSE_BUT(B_ORPO, "is_encoder_decoder", "false False null", "encoder-decoder ORPO: " NOT_YET),
    /* GRPOConfig (trl 1.16.0 trainer/grpo_config.py), read with --trainer grpo: it has no length of
     * its own (the prompts are the dataset's; --seq is prompt + max_completion_length) */
    REFUSE(B_GRPO, "max_length", "not a GRPOConfig key (GRPOConfig has no max_length): drop it and give --seq, "
                                 "the prompt's tokens + max_completion_length"),
    FACT(B_GRPO, "max_completion_length", F_COMPLETION),  /* :494 default 512 */
    FACT(B_GRPO, "num_generations", F_NUM_GEN),           /* :480 default 8 */
    FACT(B_GRPO, "steps_per_generation", F_STEPS_PER_GEN), /* :528; :1098-1110 */
    FACT(B_GRPO, "generation_batch_size", F_GEN_BATCH),   /* :521 */
    FACT(B_GRPO, "beta", F_BETA),                         /* :681 default 0.0 */
    FACT(B_GRPO, "use_vllm", F_USE_VLLM),                 /* :587 default False */
    FACT(B_GRPO, "vllm_mode", F_VLLM_MODE),               /* :594 default "colocate" */
    FACT(B_GRPO, "vllm_gpu_memory_utilization", F_VLLM_UTIL), /* :656 default 0.3 */
    FACT(B_GRPO, "num_iterations", F_NUM_ITER),           /* :689 default 1 */
    FACT(B_GRPO, "vllm_importance_sampling_correction", F_VLLM_IS), /* :925 default True */
    FACT(B_GRPO, "ds3_gather_for_generation", F_DS3_GATHER), /* :498 default True; --ds3-gather */
    /* trl 1.16 generation/vllm_generation.py:365-366, 750-751: sleep(level=2) after each generate
     * frees the engine's weights and KV cache (its CuMemAllocator pools); what it keeps outside
     * them through the policy's step (CUDA-graph pools, persistent buffers) is not sized here */
    REFUSE(B_GRPO, "vllm_enable_sleep_mode",
           "vLLM's sleep mode (level 2 between generations: what the engine keeps outside its weights and KV "
           "cache, its CUDA-graph pools and buffers, is not sized without a GPU): " NOT_YET),
    REFUSE_BUT(B_GRPO, "vllm_tensor_parallel_size", "1", "vLLM's tensor parallelism across the ranks: " NOT_YET),
    REFUSE(B_GRPO, "cast_lm_head_to_fp32", "an fp32 LM head (ScaleRL): " NOT_YET),
    REFUSE(B_GRPO, "use_transformers_paged", "transformers' paged generation: " NOT_YET),
    REFUSE(B_GRPO, "use_transformers_continuous_batching", "transformers' continuous batching: " NOT_YET),
    REFUSE(B_GRPO, "cache_implementation", "generate's cache_implementation (a static or offloaded cache): " NOT_YET),
    REFUSE(B_GRPO, "generation_kwargs", "generate's own arguments: " NOT_YET),
    /* the sampling warpers transformers' generate adds at each decoding step, each its own
     * tensors of sequences x vocabulary (generation/logits_process.py): TRL's defaults add none */
    FACT(B_GRPO, "temperature", F_TEMPERATURE),           /* :532 default 1.0; --temperature */
    FACT(B_GRPO, "top_p", F_TOP_P),                       /* :536 default 1.0; --top-p */
    FACT(B_GRPO, "top_k", F_TOP_K),                       /* :543 default 0; --top-k */
    FACT(B_GRPO, "min_p", F_MIN_P),                       /* :550 default None; --min-p */
    FACT(B_GRPO, "repetition_penalty", F_REP_PENALTY),    /* :573 default 1.0; --repetition-penalty */
    REFUSE(B_GRPO, "sync_ref_model", "the reference synced with the policy (TR-DPO): " NOT_YET),
    REFUSE(B_GRPO, "max_tool_calling_iterations", "tool calls (generation resumed after each tool's output): " NOT_YET),
    REFUSE_BUT(B_GRPO, "pad_to_multiple_of", "auto null",
               "prompts and completions padded to a multiple (TRL pads only on Neuron by default): " NOT_YET),
    /* GRPOConfig's loss types all read the fused head's per-token log-probs (grpo_trainer.py
     * _compute_loss): (b x C) terms, no vocabulary-sized tensor */
    NOMEM(B_GRPO, "loss_type"), NOMEM(B_GRPO, "epsilon"), NOMEM(B_GRPO, "epsilon_high"), NOMEM(B_GRPO, "delta"),
    NOMEM(B_GRPO, "importance_sampling_level"), NOMEM(B_GRPO, "scale_rewards"), NOMEM(B_GRPO, "reward_weights"),
    NOMEM(B_GRPO, "multi_objective_aggregation"), NOMEM(B_GRPO, "mask_truncated_completions"),
    NOMEM(B_GRPO, "top_entropy_quantile"), NOMEM(B_GRPO, "entropy_coef"), NOMEM(B_GRPO, "use_adaptive_entropy"),
    NOMEM(B_GRPO, "entropy_coef_min"), NOMEM(B_GRPO, "entropy_coef_max"), NOMEM(B_GRPO, "entropy_coef_delta"),
    NOMEM(B_GRPO, "entropy_target"), NOMEM(B_GRPO, "sapo_temperature_neg"), NOMEM(B_GRPO, "sapo_temperature_pos"),
    NOMEM(B_GRPO, "vespo_k_pos"), NOMEM(B_GRPO, "vespo_lambda_pos"), NOMEM(B_GRPO, "vespo_k_neg"),
    NOMEM(B_GRPO, "vespo_lambda_neg"), NOMEM(B_GRPO, "off_policy_mask_threshold"),
    NOMEM(B_GRPO, "use_bias_correction_kl"), NOMEM(B_GRPO, "vllm_importance_sampling_mode"),
    NOMEM(B_GRPO, "vllm_importance_sampling_clip_max"), NOMEM(B_GRPO, "vllm_importance_sampling_clip_min"),
    NOMEM(B_GRPO, "vllm_importance_sampling_cap"), NOMEM(B_GRPO, "ref_model_mixup_alpha"),
    NOMEM(B_GRPO, "ref_model_sync_steps"),
    /* evaluation, logging, the vLLM server's address (vllm_max_model_length bounds vLLM's own cache,
     * inside its reservation), the prompts' template; ZeRO-3's gather (data parallelism is refused) */
    NOMEM(B_GRPO, "num_generations_eval"), NOMEM(B_GRPO, "log_completions"), NOMEM(B_GRPO, "log_multimodal"),
    NOMEM(B_GRPO, "num_completions_to_print"), NOMEM(B_GRPO, "log_unique_prompts"),
    NOMEM(B_GRPO, "log_completions_hub_repo"), NOMEM(B_GRPO, "vllm_model_impl"),
    NOMEM(B_GRPO, "vllm_structured_outputs_regex"), NOMEM(B_GRPO, "vllm_server_base_url"),
    NOMEM(B_GRPO, "vllm_server_host"), NOMEM(B_GRPO, "vllm_server_port"), NOMEM(B_GRPO, "vllm_server_timeout"),
    NOMEM(B_GRPO, "vllm_group_port"), NOMEM(B_GRPO, "vllm_max_model_length"), NOMEM(B_GRPO, "chat_template_kwargs"),
    NOMEM(B_GRPO, "transformers_continuous_batching_config"),
    REFUSE(B_TRL, "precompute_ref_log_probs", "a DPOConfig / KTOConfig key: give --trainer dpo or kto"),
    /* the model */
    FACT(B_TRL | B_LF, "model_name_or_path", F_MODEL),
    FACT(B_AX, "base_model", F_MODEL),
    FACT(B_TT, "checkpointer.checkpoint_dir", F_MODEL),
    /* batch, accumulation, length */
    FACT(B_ARGS, "per_device_train_batch_size", F_BATCH),
    FACT(B_AX, "micro_batch_size", F_BATCH),
    FACT(B_TT, "batch_size", F_BATCH),
    FACT(B_ARGS | B_AX | B_TT, "gradient_accumulation_steps", F_GA),
    FACT(B_TRL, "max_length", F_SEQ),
    FACT(B_AX, "sequence_len", F_SEQ),
    FACT(B_LF, "cutoff_len", F_SEQ),
    FACT(B_TT, "tokenizer.max_seq_len", F_SEQ),
    /* precision */
    FACT(B_ARGS | B_AX, "bf16", F_BF16),
    FACT(B_ARGS | B_AX, "fp16", F_FP16),
    FACT(B_TRL, "dtype", F_DTYPE),
    FACT(B_TRL, "model_init_kwargs.dtype", F_DTYPE),
    FACT(B_TRL, "model_init_kwargs.torch_dtype", F_DTYPE),
    FACT(B_TT, "dtype", F_DTYPE),
    FACT(B_LF, "pure_bf16", F_PURE_BF16),
    FLAG(B_AX, "bfloat16", F_BF16, "true"),
    REFUSE(B_AX, "float16", "fp16 weights: " NOT_YET),
    REFUSE(B_LF, "infer_dtype", "only for inference: drop it"),
    /* checkpointing */
    FACT(B_ARGS | B_AX, "gradient_checkpointing", F_GC),
    FACT(B_ARGS, "activation_checkpointing", F_GC),
    FACT(B_TT, "enable_activation_checkpointing", F_GC),
    FLAG(B_LF, "disable_gradient_checkpointing", F_GC, "false"),
    FACT(B_LF, "use_reentrant_gc", F_REENTRANT), /* before the TrainingArguments' key: messages name it */
    FACT(B_ARGS | B_AX, "gradient_checkpointing_kwargs.use_reentrant", F_REENTRANT),
    FACT(B_ARGS, "activation_checkpointing_kwargs.use_reentrant", F_REENTRANT),
    FACT(B_ARGS, "gradient_checkpointing_kwargs.every_n_layers", F_GC_EVERY),   /* --checkpoint layers:N */
    FACT(B_ARGS, "activation_checkpointing_kwargs.every_n_layers", F_GC_EVERY),
    FACT(B_ARGS, "gradient_checkpointing_kwargs.offload", F_GC_OFFLOAD), /* --checkpoint layers+offload */
    FACT(B_ARGS, "activation_checkpointing_kwargs.offload", F_GC_OFFLOAD),
    FACT(B_TRL, "activation_offloading", F_ACT_OFFLOAD), /* --act-offload (sft_trainer.py:1190-1193) */
    /* Axolotl's (true: TRL's context; full fine-tuning only, recipe.c derive_act_offload) */
    FACT(B_AX, "activation_offloading", F_ACT_OFFLOAD),
    REFUSE_BUT(B_TT, "enable_activation_offloading", "false False",
           "torchtune's OffloadActivations (training/_activation_offloading.py: a storage saved twice is offloaded "
           "twice, no deduplication as TRL's) around its own decoder and chunked loss: " NOT_YET),
    REFUSE(B_AX, "layer_offloading", "layer offloading: " NOT_YET),
    /* selective checkpointing (docs/checkpointing.md#sac): --checkpoint layers[:N]+sac[:axolotl] */
    FACT(B_ARGS, "gradient_checkpointing_kwargs.selective", F_GC_SAC),
    FACT(B_ARGS, "activation_checkpointing_kwargs.selective", F_GC_SAC),
    FACT(B_AX, "selective_checkpointing", F_GC_SAC),
    FACT(B_AX, "selective_checkpointing.save", F_GC_SAC_SAVE),
    REFUSE(B_AX, "selective_checkpointing.offload", "the saved ops' outputs in pinned host memory: " NOT_YET),
    REFUSE(B_AX, "selective_checkpointing.save_sliding_window", "sliding-window attention saved: " NOT_YET),
    REFUSE(B_AX, "selective_checkpointing.recompute_layer_types", "the layer types recomputed: " NOT_YET),
    REFUSE(B_LF, "use_unsloth_gc", "Unsloth's offloaded checkpointing: " NOT_YET),
    /* the optimizer */
    FACT(B_ARGS, "optim", F_OPTIM),
    FACT(B_AX, "optimizer", F_OPTIM),
    FACT(B_TT, "optimizer._component_", F_OPTIM),
    FACT(B_TT, "optimizer.fused", F_OPT_FUSED),
    REFUSE(B_ARGS, "optim_args", "optimizer arguments: " NOT_YET),
    REFUSE(B_ARGS | B_AX, "optim_target_modules", "GaLore/APOLLO target modules: " NOT_YET),
    REFUSE(B_TT, "optimizer_in_bwd", "the optimizer step fused into backward: " NOT_YET),
    REFUSE(B_LF, "use_galore", "GaLore: " NOT_YET),
    REFUSE(B_LF, "use_apollo", "APOLLO: " NOT_YET),
    REFUSE(B_LF, "use_badam", "BAdam: " NOT_YET),
    REFUSE(B_LF, "use_muon", "Muon: " NOT_YET),
    REFUSE(B_LF, "use_adam_mini", "Adam-mini: " NOT_YET),
    /* adapters and quantized bases */
    FACT(B_TRL, "use_peft", F_PEFT),
    FACT(B_AX, "adapter", F_PEFT),
    FACT(B_LF, "finetuning_type", F_PEFT),
    FACT(B_TT, "model._component_", F_PEFT),
    FACT(B_TRL | B_AX, "load_in_4bit", F_LOAD4),
    FACT(B_TRL | B_AX, "load_in_8bit", F_LOAD8),
    FACT(B_LF, "quantization_bit", F_QBIT),
    FACT(B_TRL, "use_bnb_nested_quant", F_NESTED),
    FACT(B_LF, "double_quantization", F_NESTED),
    FACT(B_TRL, "bnb_4bit_quant_type", F_QTYPE),
    FACT(B_LF, "quantization_type", F_QTYPE),
    FACT(B_TRL | B_AX, "lora_r", F_LORA_R),
    FACT(B_LF, "lora_rank", F_LORA_R),
    FACT(B_TT, "model.lora_rank", F_LORA_R),
    FACT(B_TRL | B_AX | B_LF, "lora_alpha", F_LORA_ALPHA),
    FACT(B_TT, "model.lora_alpha", F_LORA_ALPHA),
    FACT(B_TRL | B_AX | B_LF, "lora_dropout", F_LORA_DROPOUT),
    FACT(B_TT, "model.lora_dropout", F_LORA_DROPOUT),
    FACT(B_TRL | B_AX, "lora_target_modules", F_LORA_TARGETS),
    FLAG(B_AX, "lora_target_linear", F_LORA_TARGETS, "all-linear"),
    FACT(B_LF, "lora_target", F_LORA_TARGETS),
    FACT(B_TT, "model.lora_attn_modules", F_LORA_TARGETS),
    FACT(B_TT, "model.apply_lora_to_mlp", F_LORA_MLP),
    REFUSE(B_TT, "model.apply_lora_to_output", "an adapter on the output projection: " NOT_YET),
    REFUSE(B_TRL, "lora_target_parameters", "adapters on parameters (experts): " NOT_YET),
    REFUSE(B_TRL | B_AX, "lora_modules_to_save", "trainable copies of modules: " NOT_YET),
    REFUSE(B_LF, "additional_target", "trainable copies of modules: " NOT_YET),
    REFUSE_BUT(B_TRL, "lora_task_type", "CAUSAL_LM", "a task type other than CAUSAL_LM: " NOT_YET),
    REFUSE(B_TRL | B_AX, "use_dora", "DoRA: " NOT_YET),
    REFUSE(B_LF, "use_dora", "DoRA: " NOT_YET),
    REFUSE(B_LF, "pissa_init", "PiSSA: " NOT_YET),
    REFUSE(B_AX, "peft_use_dora", "DoRA: " NOT_YET),
    FACT(B_TRL, "bnb_4bit_quant_storage", F_QSTORAGE), /* model_config.py default "uint8" (FSDP: a float) */
    /* attention */
    FACT(B_TRL | B_AX, "attn_implementation", F_ATTN),
    FACT(B_TRL, "model_init_kwargs.attn_implementation", F_ATTN),
    FACT(B_LF, "flash_attn", F_ATTN),
    FLAG(B_AX, "flash_attention", F_ATTN, "flash_attention_2"),
    FLAG(B_AX, "sdp_attention", F_ATTN, "sdpa"),
    FLAG(B_AX, "eager_attention", F_ATTN, "eager"),
    REFUSE(B_AX, "xformers_attention", "xformers attention: " NOT_YET),
    REFUSE(B_AX, "flex_attention", "flex attention: " NOT_YET),
    REFUSE(B_AX, "s2_attention", "shifted sparse attention: " NOT_YET),
    REFUSE(B_AX, "sage_attention", "SageAttention: " NOT_YET),
    /* use_cache, the loss, kernels */
    FACT(B_ARGS, "use_cache", F_USE_CACHE),
    FACT(B_TRL, "loss_type", F_LOSS),
    FACT(B_TT, "loss._component_", F_LOSS),
    /* (--loss liger is Liger's fused linear cross-entropy alone; the flags also swap in its
     * RMSNorm, SwiGLU and RoPE kernels, whose saved tensors are not HF's) */
    /* transformers 5.24 Trainer: use_liger_kernel applies liger_kernel_config through
     * _apply_liger_kernel_to_instance (a kernel it leaves out at its default: ir/liger.c) */
    FACT(B_ARGS, "use_liger_kernel", F_LIGER),
    FACT(B_ARGS, "liger_kernel_config.fused_linear_cross_entropy", F_LK_FLCE),
    FACT(B_ARGS, "liger_kernel_config.cross_entropy", F_LK_CE),
    FACT(B_ARGS, "liger_kernel_config.rope", F_LK_ROPE),
    FACT(B_ARGS, "liger_kernel_config.rms_norm", F_LK_RMS),
    FACT(B_ARGS, "liger_kernel_config.swiglu", F_LK_SWIGLU),
    FACT(B_ARGS, "liger_kernel_config.geglu", F_LK_GEGLU),
    FACT(B_ARGS, "liger_kernel_config.layer_norm", F_LK_LN),
    FACT(B_ARGS, "liger_kernel_config.relu_squared", F_LK_R2),
    /* LLaMA-Factory 0.9.5 model/model_utils/liger_kernel.py: every kernel at its default, the fused
     * loss off where the stage needs logits */
    REFUSE(B_LF, "enable_liger_kernel", "Liger's RMSNorm, SwiGLU and RoPE kernels (besides its fused loss): " NOT_YET),
    REFUSE_BUT(B_ARGS, "label_smoothing_factor", "0 0.0 null", "the label smoother's loss: " NOT_YET),
    /* Axolotl's Cut Cross-Entropy: the plugin and its key (recipe.c derive_loss) */
    FACT(B_AX, "plugins", F_PLUGINS),
    FACT(B_AX, "cut_cross_entropy", F_CCE),
    /* torchtune's LinearCrossEntropyLoss arguments (modules/loss/cross_entropy_loss.py:34-40) */
    REFUSE_BUT(B_TT, "loss.num_output_chunks", "8",
               "memplan plans LinearCrossEntropyLoss's default 8 chunks: other counts " NOT_YET),
    REFUSE_BUT(B_TT, "loss.mask_ignored_tokens", "true True",
               "every row through the projection (no masking before it): " NOT_YET),
    REFUSE_BUT(B_TT, "loss.tp_enabled", "false False", "tensor parallelism: " NOT_YET),
    REFUSE_BUT(B_TT, "loss.ignore_index", "-100", "an ignore index other than the datasets' -100: " NOT_YET),
    /* Axolotl 0.19's LigerPlugin (integrations/liger/args.py, plugin.py:192-228): each flag passed
     * as given (unset: None, off); liger_swiglu is liger_glu_activation's old name (args.py) */
    FACT(B_AX, "liger_fused_linear_cross_entropy", F_LK_FLCE),
    FACT(B_AX, "liger_cross_entropy", F_LK_CE),
    FACT(B_AX, "liger_rope", F_LK_ROPE),
    FACT(B_AX, "liger_rms_norm", F_LK_RMS),
    FACT(B_AX, "liger_layer_norm", F_LK_LN),
    FACT(B_AX, "liger_glu_activation", F_LK_GLU),
    FACT(B_AX, "liger_swiglu", F_LK_GLU),
    REFUSE(B_AX, "liger_rms_norm_gated", "Liger's gated RMSNorm: " NOT_YET),
    REFUSE(B_AX, "liger_use_token_scaling", "Liger's token-scaled fused linear cross-entropy: " NOT_YET),
    REFUSE(B_AX, "liger_kernel_impl", "Liger's other kernel backends (cutile, cutedsl): " NOT_YET),
    REFUSE(B_AX, "unsloth_cross_entropy_loss", "Unsloth's cross-entropy: " NOT_YET),
    REFUSE(B_AX, "chunked_cross_entropy", "chunked cross-entropy: " NOT_YET),
    REFUSE_BUT(B_ARGS | B_AX | B_LF, "neftune_noise_alpha", "null 0", "NEFTune's noise tensor: " NOT_YET),
    REFUSE(B_ARGS, "torch_compile", "torch.compile: " NOT_YET),
    REFUSE(B_ARGS, "torch_compile_backend", "torch.compile: " NOT_YET),
    REFUSE(B_ARGS, "torch_compile_mode", "torch.compile: " NOT_YET),
    REFUSE(B_TT, "compile", "torch.compile: " NOT_YET),
    REFUSE(B_ARGS, "torch_empty_cache_steps", "emptying the allocator's cache: " NOT_YET),
    REFUSE(B_ARGS | B_AX, "auto_find_batch_size", "the batch is found at run time: give it"),
    REFUSE(B_ARGS, "use_cpu", "training on the CPU: memplan plans GPU memory"),
    /* packing (recipe.c derive_packing) */
    FACT(B_TRL | B_LF, "packing", F_PACKING),
    FACT(B_AX, "sample_packing", F_PACKING),
    FACT(B_TT, "dataset.packed", F_PACKING),
    FACT(B_TRL, "packing_strategy", F_PACK_STRATEGY),
    FACT(B_TRL, "padding_free", F_PADDING_FREE),
    FACT(B_AX, "batch_flattening", F_PADDING_FREE),
    FACT(B_LF, "neat_packing", F_NEAT_PACKING),
    /* data parallelism and sharding */
    REFUSE(B_ARGS | B_AX, "fsdp", DP),
    REFUSE(B_AX, "fsdp_config", DP),
    REFUSE(B_AX, "fsdp_version", DP),
    REFUSE(B_ARGS | B_AX, "deepspeed", DP),
    REFUSE(B_ARGS, "parallelism_config", "context/tensor parallelism: " NOT_YET),
    REFUSE(B_AX, "context_parallel_size", "context parallelism: " NOT_YET),
    REFUSE(B_AX, "tensor_parallel_size", "tensor parallelism: " NOT_YET),
    REFUSE(B_AX, "sequence_parallel_degree", "sequence parallelism: " NOT_YET),
    REFUSE(B_TT, "fsdp_cpu_offload", DP),
    REFUSE(B_TT, "tensor_parallel_dim", "tensor parallelism: " NOT_YET),
    /* preference and RL training: a reference model, generations */
    FACT(B_AX, "rl", F_RL), /* Axolotl 0.19 schemas/enums.py RLType; recipe.c derive_axolotl_rl */
    REFUSE(B_TRL, "beta", "a DPO/KTO/GRPO config: give --trainer dpo, kto or grpo"),
    REFUSE(B_TRL, "num_generations", "a GRPOConfig key (generations): give --trainer grpo"),
    REFUSE(B_TRL, "max_completion_length", "a GRPOConfig key (generations): give --trainer grpo"),
    REFUSE(B_TRL, "use_vllm", "a GRPOConfig key (vLLM generates): give --trainer grpo"),
    REFUSE(B_TRL, "ref_model_init_kwargs", "a reference model: " NOT_YET),
    REFUSE(B_AX, "unfrozen_parameters", "training a subset of parameters: " NOT_YET),
    REFUSE(B_AX, "freeze_mm_modules", "freezing multimodal modules: " NOT_YET),
    /* LLaMA-Factory's other stages and methods */
    FACT(B_LF, "stage", F_LF_STAGE), /* recipe.c derive_lf_stage: sft and pt planned, the others refused */
    REFUSE(B_LF, "fp8", "FP8 training: " NOT_YET),
    REFUSE(B_AX, "fp8", "FP8 training: " NOT_YET),
    REFUSE(B_LF, "freeze_vision_tower", "a vision tower: " NOT_YET),
};
const size_t mp_recipe_n_keys = sizeof mp_recipe_keys / sizeof mp_recipe_keys[0];

/* ---- the keys with no memory effect ----------------------------------------------------------- */

/* transformers 5.24.0 TrainingArguments (a to_json_string() dump has every one): the run's length,
 * schedule, logging, saving, evaluation (memplan plans the training step), the hub, data loading
 * on the host, and the sharding settings that only apply with fsdp/deepspeed (refused above). */
#define HF_NOMEM                                                                                     \
    "output_dir overwrite_output_dir num_train_epochs max_steps learning_rate lr_scheduler_type "     \
    "lr_scheduler_kwargs warmup_steps warmup_ratio weight_decay adam_beta1 adam_beta2 adam_epsilon " \
    "average_tokens_across_devices max_grad_norm bf16_full_eval fp16_full_eval tf32 "                \
    "gradient_checkpointing_kwargs activation_checkpointing_kwargs "                                 \
    "logging_strategy logging_steps logging_first_step log_on_each_node logging_nan_inf_filter "      \
    "include_num_input_tokens_seen log_level log_level_replica disable_tqdm report_to run_name "     \
    "project trackio_space_id trackio_bucket_id trackio_static_space_id logging_dir "               \
    "eval_strategy eval_steps eval_delay per_device_eval_batch_size prediction_loss_only "          \
    "eval_on_start eval_do_concat_batches eval_use_gather_object eval_accumulation_steps "          \
    "include_for_metrics batch_eval_metrics save_only_model save_strategy save_steps "               \
    "save_on_each_node save_total_limit enable_jit_checkpoint push_to_hub hub_token "                \
    "hub_private_repo hub_model_id hub_strategy hub_always_push hub_revision "                       \
    "load_best_model_at_end metric_for_best_model greater_is_better ignore_data_skip "              \
    "restore_callback_states_from_checkpoint full_determinism seed data_seed accelerator_config "    \
    "dataloader_drop_last dataloader_num_workers dataloader_pin_memory dataloader_persistent_workers " \
    "dataloader_prefetch_factor dataloader_multiprocessing_context dataloader_in_order "             \
    "remove_unused_columns label_names train_sampling_strategy length_column_name group_by_length "  \
    "ddp_find_unused_parameters ddp_bucket_cap_mb ddp_broadcast_buffers ddp_static_graph "           \
    "ddp_backend ddp_timeout fsdp_config debug skip_memory_metrics do_train do_eval do_predict "     \
    "resume_from_checkpoint local_rank predict_with_generate generation_max_length "                \
    "generation_num_beams generation_config sortish_sampler"

const char *const mp_recipe_nomem[MP_RF_N] = {
    [MP_RF_HF] = HF_NOMEM,
    /* trl 1.16.0: SFTConfig, ModelConfig, ScriptArguments, DatasetMixtureConfig fields without an
     * effect on the step (dataset handling, tokens, revision, trust_remote_code; use_rslora only
     * changes the scaling; router_aux_loss_coef a scalar) */
    [MP_RF_TRL] = HF_NOMEM " trust_remote_code router_aux_loss_coef chat_template_path dataset_text_field "
                  "dataset_kwargs dataset_num_proc eos_token truncation_mode shuffle_dataset "
                  "pad_to_multiple_of eval_packing completion_only_loss assistant_only_loss pad_token "
                  "model_init_kwargs.trust_remote_code model_init_kwargs.revision model_init_kwargs.device_map "
                  "model_revision use_rslora dataset_name dataset_config dataset_train_split "
                  "dataset_test_split dataset_streaming ignore_bias_buffers datasets streaming "
                  "test_split_size",
    /* axolotl 0.19.0: the common keys of its examples that do not change the step */
    [MP_RF_AXOLOTL] = "base_model_config model_type tokenizer_type tokenizer_config trust_remote_code "
                      "is_llama_derived_model is_mistral_derived_model is_qwen_derived_model strict "
                      "datasets test_datasets dataset_prepared_path dataset_processes shuffle_merged_datasets "
                      "val_set_size output_dir chat_template special_tokens tokens "
                      "num_epochs max_steps learning_rate lr_scheduler lr_scheduler_kwargs cosine_min_lr_ratio "
                      "warmup_steps warmup_ratio weight_decay max_grad_norm adam_beta1 adam_beta2 adam_epsilon "
                      "train_on_inputs group_by_length tf32 logging_steps evals_per_epoch eval_steps "
                      "saves_per_epoch save_steps save_strategy save_total_limit eval_strategy "
                      "eval_batch_size eval_max_new_tokens eval_table_size eval_sample_packing "
                      "wandb_project wandb_entity wandb_watch wandb_name wandb_log_model wandb_mode "
                      "hub_model_id hub_strategy resume_from_checkpoint auto_resume_from_checkpoints "
                      "local_rank seed early_stopping_patience debug xformers_attention_ignored "
                      "pad_to_sequence_len gradient_checkpointing_kwargs lora_fan_in_fan_out "
                      "lora_model_dir save_safetensors load_best_model_at_end logging_dir "
                      "remove_unused_columns ddp_find_unused_parameters ddp_timeout ddp_bucket_cap_mb",
    /* llamafactory 0.9.5 (with TrainingArguments' keys): data, template, export, reporting */
    [MP_RF_LLAMAFACTORY] = HF_NOMEM " trust_remote_code template dataset dataset_dir eval_dataset "
                           "overwrite_cache preprocessing_num_workers dataloader_num_workers max_samples "
                           "val_size plot_loss overwrite_output_dir buffer_size mix_strategy "
                           "interleave_probs streaming tokenized_path image_max_pixels video_max_pixels "
                           "cache_dir model_revision adapter_name_or_path create_new_adapter "
                           "loraplus_lr_ratio use_rslora lora_bf16_mode ddp_timeout",
    /* torchtune 0.6.1: logging, the run's length, checkpoint files, the tokenizer and dataset (packing
     * is refused above); device is checked (cuda) */
    [MP_RF_TORCHTUNE] = "output_dir tokenizer._component_ tokenizer.path tokenizer.merges_file "
                        "tokenizer.prompt_template dataset._component_ dataset.source dataset.split "
                        "dataset.data_files dataset.column_map dataset.train_on_input dataset.new_system_prompt "
                        "seed shuffle checkpointer._component_ checkpointer.checkpoint_files "
                        "checkpointer.recipe_checkpoint checkpointer.output_dir checkpointer.model_type "
                        "checkpointer.adapter_checkpoint resume_from_checkpoint save_adapter_weights_only "
                        "epochs max_steps_per_epoch optimizer.lr optimizer.weight_decay optimizer.betas "
                        "optimizer.eps optimizer.amsgrad lr_scheduler clip_grad_norm device metric_logger "
                        "log_every_n_steps log_peak_memory_stats log_level profiler collate_fn "
                        "cudnn_deterministic_mode",
};
