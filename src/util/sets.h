/* sets.h — memplan's closed sets, one X-macro table each: dtypes, precisions, optimizers
 * (with their traits as columns), attention implementations and activations.  The enums,
 * names, parsers, error lists and test loops are generated from these rows, so a set is
 * changed in one place; code that must treat each member switches on the enum with no
 * default, so -Wswitch (in -Wall) names a forgotten case.  Pure preprocessor and enums: C and
 * CUDA (kernels/, through probe/mp_math.h and kernels.h) include it.  Recipes for adding a
 * member: docs/HACKING.md.
 */
#ifndef MEMPLAN_SETS_H
#define MEMPLAN_SETS_H

/* Tensor element types: X(id, name, bytes).  The enum value is also the kernels' dtype code. */
#define MP_DTYPES(X)         \
    X(F32, "fp32", 4)        \
    X(BF16, "bf16", 2)       \
    X(F16, "fp16", 2)        \
    X(I64, "int64", 8)       \
    X(U8, "uint8", 1)

enum mp_dtype {
#define MP_X(id, name, bytes) MP_DT_##id,
    MP_DTYPES(MP_X)
#undef MP_X
};

/* Training precisions (--precision): X(id, name).  mixed-bf16 (FSDP2's MixedPrecisionPolicy,
 * ZeRO's bf16 with fp32 master weights) is BF16 with the data-parallel flag, parsed by the
 * command line.  amp-* keep fp32 weights under autocast; bf16 is bf16 weights without autocast;
 * bf16-amp is bf16 weights under bf16 autocast (HF Trainer's bf16=True on a model loaded with
 * dtype=torch.bfloat16; peft's adapters stay fp32: the usual LoRA recipe). */
#define MP_PRECISIONS(X)     \
    X(FP32, "fp32")          \
    X(AMP_BF16, "amp-bf16")  \
    X(AMP_FP16, "amp-fp16")  \
    X(BF16, "bf16")          \
    X(BF16_AMP, "bf16-amp")

enum mp_precision {
#define MP_X(id, name) MP_PREC_##id,
    MP_PRECISIONS(MP_X)
#undef MP_X
};

/* What an optimizer keeps per trainable parameter tensor (estimate/optim.c; the rules are per
 * tensor: thresholds and blocks apply to each parameter on its own):
 * NONE nothing; ONE one tensor like it (momentum); TWO two (Adam's exp_avg, exp_avg_sq);
 * FACTORED row + column factors for a matrix, one full tensor otherwise (Adafactor);
 * BNB8 bitsandbytes' Optimizer2State at 8 bits, BNB8_1 its Optimizer1State (Lion): per state a
 * uint8 tensor like the parameter and an fp32 absmax per 256-element block; fp32 states under
 * min_8bit_size (4096 elements) and, under the HF Trainer, for nn.Embedding weights; the
 * optimizer's shared 256-entry fp32 quantile maps once;
 * AO8 / AO4 torchao's AdamW8bit / AdamW4bit as HF builds them (block 256): per state codes
 * (1 byte, or 4 bits, an element), an fp32 scale per block and its own quantile map; a
 * tensor under 4096 elements or not a multiple of the block keeps states in its own dtype.
 * docs/memory-facts.md#low-bit-optimizers has the sources. */
enum mp_opt_state {
    MP_OPT_STATE_NONE,
    MP_OPT_STATE_ONE,
    MP_OPT_STATE_TWO,
    MP_OPT_STATE_FACTORED,
    MP_OPT_STATE_BNB8,
    MP_OPT_STATE_BNB8_1,
    MP_OPT_STATE_AO8,
    MP_OPT_STATE_AO4,
    MP_OPT_STATE_MUON /* torch.optim.Muon's momentum buffer on a hidden 2-D weight, AdamW's two on the rest */
};
/* The step's temporaries: NONE; ALL_GRADS one per parameter, all alive together (foreach
 * Adam: _foreach_sqrt over the group, the size of all the gradients); LARGEST fp32 tensors like
 * the largest parameter, two, four for a half one (transformers' Adafactor, estimate/optim.c);
 * LARGEST_2F32 two fp32 tensors the size of the largest parameter and two fp32 values per
 * 256-element block (torchao's compiled per-parameter step:
 * the new moments before they are quantized, and each block's absmax). */
/* MUON: torch.optim.Muon steps its parameters one at a time, each making the Nesterov update (like
 * the gradient) and its Newton-Schulz iterates in bf16 (estimate/optim.c), then the foreach AdamW
 * of the others runs: the larger of the two. */
enum mp_opt_tmp { MP_OPT_TMP_NONE, MP_OPT_TMP_ALL_GRADS, MP_OPT_TMP_LARGEST, MP_OPT_TMP_LARGEST_2F32, MP_OPT_TMP_MUON };

/* Optimizers (--optimizer): X(id, CLI name, state, step temporaries, decoupled weight decay
 * (AdamW's), HF TrainingArguments optim written by reports and snippets, the HF optim names
 * --optimizer also accepts for this row (space-separated, each in one row only), runs on the
 * probe, runs on the data-parallel probe).
 * adam is written as adamw_torch (with weight_decay 0 it is Adam).  adamw is torch's default
 * foreach implementation; adamw-fused is AdamW(fused=True), HF's default optim
 * (adamw_torch_fused): one in-place kernel per group, no temporaries
 * (docs/memory-facts.md#optimizer-state).  The paged bitsandbytes rows keep the same bytes
 * on the device (CUDA managed memory: docs/memory-facts.md#low-bit-optimizers).  The probe
 * runs bitsandbytes' 8-bit AdamW layout with its own codes (paged alike); Lion and torchao's
 * arithmetic it refuses (probe 0).  muon is torch.optim.Muon (torch 2.9+) on the hidden layers' 2-D
 * weights and torch.optim.AdamW (foreach) on the rest (embeddings, the output layer, norms, biases,
 * stacked experts), as its documentation prescribes; HF's Trainer has no optim for it (""). */
#define MP_OPTIMIZERS(X)                                                                              \
    X(SGD, "sgd", NONE, NONE, 0, "sgd", "sgd", 1, 1)                                                  \
    X(SGD_MOMENTUM, "sgd-momentum", ONE, NONE, 0, "sgd", "", 1, 1)                                    \
    X(ADAM, "adam", TWO, ALL_GRADS, 0, "adamw_torch", "", 1, 1)                                       \
    X(ADAMW, "adamw", TWO, ALL_GRADS, 1, "adamw_torch", "adamw_torch", 1, 1)                          \
    X(ADAFACTOR, "adafactor", FACTORED, LARGEST, 0, "adafactor", "adafactor", 1, 0)                   \
    X(ADAM8BIT, "adam8bit", BNB8, NONE, 0, "adamw_bnb_8bit", "adamw_bnb_8bit adamw_8bit", 1, 0)       \
    X(ADAMW_FUSED, "adamw-fused", TWO, NONE, 1, "adamw_torch_fused", "adamw_torch_fused", 1, 0)       \
    X(PAGED_ADAM8BIT, "paged-adam8bit", BNB8, NONE, 0, "paged_adamw_8bit", "paged_adamw_8bit", 1, 0)  \
    X(LION8BIT, "lion8bit", BNB8_1, NONE, 1, "lion_8bit", "lion_8bit", 0, 0)                          \
    X(PAGED_LION8BIT, "paged-lion8bit", BNB8_1, NONE, 1, "paged_lion_8bit", "paged_lion_8bit", 0, 0)  \
    X(ADAMW8BIT_AO, "adamw8bit-ao", AO8, LARGEST_2F32, 1, "adamw_torch_8bit", "adamw_torch_8bit", 0, 0)       \
    X(ADAMW4BIT_AO, "adamw4bit-ao", AO4, LARGEST_2F32, 1, "adamw_torch_4bit", "adamw_torch_4bit", 0, 0)      \
    X(MUON, "muon", MUON, MUON, 1, "", "", 0, 0)

enum mp_optimizer {
#define MP_X(id, name, state, tmp, wd, hf, aliases, probe, par_probe) MP_OPT_##id,
    MP_OPTIMIZERS(MP_X)
#undef MP_X
};

/* Attention implementations (--attention, a layer's "attention"): X(id, name). */
#define MP_ATTN_IMPLS(X)     \
    X(SDPA, "sdpa")          \
    X(FLASH, "flash")        \
    X(EAGER, "eager")

enum mp_attn_impl {
#define MP_X(id, name) MP_ATTN_##id,
    MP_ATTN_IMPLS(MP_X)
#undef MP_X
};

/* Op-level selective activation checkpointing (--checkpoint layers[:N]+sac[:NAME]): X(id, name, whose
 * policy, NULL when modelled or why not).  Under torch's non-reentrant checkpoint with a context_fn
 * from create_selective_checkpoint_contexts, the outputs of the ops a policy saves are held from a
 * checkpointed layer's forward until its recompute pops them, and those ops are not recomputed
 * (docs/checkpointing.md#sac).  "+sac" alone is TRL's policy. */
#define MP_SAC_POLICIES(X)                                                                                 \
    X(NONE, "none", "every op of a checkpointed layer recomputed", NULL)                                  \
    X(TRL, "trl", "TRL 1.16 SFTConfig gradient_checkpointing_kwargs={\"selective\": True}: SDPA saved", NULL) \
    X(AXOLOTL, "axolotl", "Axolotl selective_checkpointing: true (attention saved; not sliding layers)", NULL) \
    X(TORCHTITAN, "torchtitan", "torchtitan's SelectiveAC: SDPA and the 1st, 3rd... aten.mm saved, no early stop", \
      NULL)                                                                                                \
    X(AUTO, "auto", "memplan's planner: a layer's SDPA and matmuls kept or recomputed to fit the GPU", NULL)

enum mp_sac_policy {
#define MP_X(id, name, what, unmodelled) MP_SAC_##id,
    MP_SAC_POLICIES(MP_X)
#undef MP_X
};

/* Task heads (--head): X(id, name, transformers' class suffix).  --head replaces the class
 * architectures[0] names (model/model_hf.c mp_hf_apply_request: each family's row says which
 * heads transformers has for it). */
#define MP_HEADS(X)                                      \
    X(CAUSAL_LM, "causal-lm", "ForCausalLM")             \
    X(MLM, "mlm", "ForMaskedLM")                         \
    X(SEQ_CLS, "seq-cls", "ForSequenceClassification")  \
    X(TOKEN_CLS, "token-cls", "ForTokenClassification")  \
    X(QA, "qa", "ForQuestionAnswering")                  \
    X(BASE, "base", "Model")

enum mp_head {
#define MP_X(id, name, suffix) MP_HEAD_##id,
    MP_HEADS(MP_X)
#undef MP_X
};

/* Loss heads of a causal LM (--loss): X(id, name, how a trainer turns it on, NULL when modelled
 * or why it is not).  The bytes of each follow its library's source op by op
 * (src/ir/lower_embed_head.c lower_fused_loss, one case per row):
 *   HF          transformers' ForCausalLMLoss: the lm_head Linear, logits.float(), log_softmax,
 *               nll_loss over every position (today's path).
 *   CHUNKED_NLL TRL's SFTTrainer default: add_fused_lm_head, the rows whose label is not -100
 *               gathered, then ChunkedLogProbFunction over 4096-token x 32768-vocabulary tiles,
 *               recomputed in backward (trl 1.16.0).
 *   LIGER       Liger's fused linear cross-entropy (LigerForCausalLMLoss): the gradients of
 *               the input and the weight made in the forward, chunk by chunk (liger-kernel 0.8.5).
 *   TORCHTUNE   torchtune's LinearCrossEntropyLoss (main, not in 0.6.1): the rows whose label is
 *               not -100 gathered, 8 chunks, each keeping its fp32 log-probs for backward.
 *   CCE         Cut Cross-Entropy as Axolotl 0.19 runs it (its ml-cross-entropy fork): Triton
 *               kernels, no logits; the LSE, logit averages and valid positions kept. */
#define MP_LOSSES(X)                                                                                       \
    X(HF, "hf", "transformers ForCausalLMLoss", NULL)                                                  \
    X(CHUNKED_NLL, "chunked-nll", "TRL SFTConfig(loss_type=\"nll\"), the default", NULL)               \
    X(LIGER, "liger", "Liger fused linear CE: use_liger_kernel, liger_kernel_config", NULL)            \
    X(TORCHTUNE, "torchtune", "torchtune loss: LinearCrossEntropyLoss", NULL)                          \
    X(CCE, "cce", "axolotl cut_cross_entropy: true", NULL)

enum mp_loss {
#define MP_X(id, name, how, unmodelled) MP_LOSS_##id,
    MP_LOSSES(MP_X)
#undef MP_X
};

/* Liger's kernels, by the keywords of liger-kernel 0.8.5's apply_liger_kernel_to_* functions (the
 * keys of transformers' liger_kernel_config): X(id, name).  MP_LK_id is the kernel's bit in a set
 * of them (ir/liger.c: which a model_type takes and turns on by default). */
#define MP_LIGER_KERNELS(X)                            \
    X(FLCE, "fused_linear_cross_entropy")             \
    X(CROSS_ENTROPY, "cross_entropy")                 \
    X(ROPE, "rope")                                   \
    X(RMS_NORM, "rms_norm")                           \
    X(SWIGLU, "swiglu")                               \
    X(GEGLU, "geglu")                                 \
    X(LAYER_NORM, "layer_norm")                       \
    X(RELU_SQUARED, "relu_squared")

enum mp_liger_kernel_index {
#define MP_X(id, name) MP_LKI_##id,
    MP_LIGER_KERNELS(MP_X)
#undef MP_X
    MP_LK_N
};
enum {
#define MP_X(id, name) MP_LK_##id = 1u << MP_LKI_##id,
    MP_LIGER_KERNELS(MP_X)
#undef MP_X
};
#define MP_LK_ALL ((1u << MP_LK_N) - 1u)

/* Trainers (--trainer, a recipe's trainer): X(id, name, what one step runs, NULL when modelled or
 * why it is not, sequences an example runs through the policy, the smallest micro-batch the
 * trainer accepts, no-grad reference forwards a step (0: no reference model), no-grad forwards of
 * the policy a step, the TRL config class, its loss_type (NULL: the config's default), and whether
 * the config's disable_dropout defaults to True).  The step
 * of each follows TRL 1.16.0's source (trl/trainer/, file:line):
 *   SFT   one forward and backward of the batch (SFTTrainer; every other trainer's recipe too).
 *   DPO   DPOTrainer: the policy's forward on chosen and rejected concatenated (2 x the pairs,
 *         trainer/dpo_trainer.py:349-351), through TRL's fused LM head (:959-962), then the
 *         reference's forward under torch.no_grad (:1327-1338) while the policy's graph is held,
 *         then backward: a full frozen copy (:916-927), the adapter disabled (PEFT, :1328-1336)
 *         or nothing (precompute_ref_log_probs, :1318).
 *   KTO   KTOTrainer (trl.KTOTrainer since 1.16; loss_type "kto"): a no-grad forward of the policy
 *         on the batch's KL sequences (mismatched completions, kto_trainer.py:1337-1368, before
 *         any graph exists), the policy's forward on the batch (:1387, one sequence an example,
 *         the fused LM head :966-969), then two no-grad reference forwards, the KL sequences and
 *         the batch (:1425-1436), while the policy's graph is held, then backward; the reference
 *         as DPO's (:919-938); the KL term needs 2 or more examples a device (:844-847).
 *   KTO_APO  KTOTrainer with loss_type "apo_zero_unpaired": no KL term (calculate_KL false,
 *         kto_trainer.py:815, 836), so no KL sequences, no KL forwards and no 2-example floor
 *         (:844); the policy's forward on the batch and one reference forward (:1425-1436, whose
 *         _compute_kl_logps returns None at once, :1340).
 *   GRPO  GRPOTrainer (loss_type "dapo"): per generation batch (per_device_train_batch_size x
 *         steps_per_generation completions, grpo_trainer.py:1253-1275) it generates with
 *         transformers' generate under torch.no_grad, gradient checkpointing off and the
 *         DynamicCache on (:1861-1875; models/utils.py:135-137), or with a colocated vLLM; with
 *         beta > 0 (default 0.0, :983-990) the reference's no-grad forward over the completions
 *         in micro-batches (:2710-2735) before any graph exists; then each micro-batch's policy
 *         forward over prompt + completion through the fused LM head, labels on the completion
 *         only (:1495-1499), and backward.  The reference as DPO's (a copy, or the adapter
 *         disabled under PEFT, :2722-2733).  disable_dropout defaults to False.
 *   ORPO  ORPOTrainer (trl.experimental.orpo since 1.x): the policy's forward on chosen and rejected
 *         concatenated (2 x the pairs, orpo_trainer.py:606-668, padded to the batch's longest),
 *         the model's own LM head (full logits, no fused head), then the chosen rows' NLL and the
 *         odds ratio of both on those logits (:745-877; src/ir/lower_embed_head.c
 *         lower_orpo_loss), and backward.  No reference model.  disable_dropout defaults to True,
 *         gradient_checkpointing to True (ORPOConfig, experimental/orpo/orpo_config.py). */
#define MP_TRAINERS(X)                                                                                     \
    X(SFT, "sft", "TRL SFTTrainer / transformers Trainer: one forward and backward", NULL, 1, 1, 0, 0,     \
      "SFTConfig", NULL, 0)                                                                                   \
    X(DPO, "dpo", "TRL DPOTrainer: chosen+rejected, a reference forward", NULL, 2, 1, 1, 0, "DPOConfig",  \
      NULL, 1)                                                                                                \
    X(KTO, "kto", "TRL KTOTrainer: a KL forward, the batch, two reference forwards", NULL, 1, 2, 2, 1,    \
      "KTOConfig", NULL, 1)                                                                                   \
    X(KTO_APO, "kto-apo", "TRL KTOTrainer, loss_type apo_zero_unpaired: the batch, a reference forward",  \
      NULL, 1, 1, 1, 0, "KTOConfig", "apo_zero_unpaired", 1)                                                  \
    X(ORPO, "orpo", "TRL ORPOTrainer (trl.experimental.orpo): chosen+rejected, NLL + odds ratio", NULL, 2, 1, \
      0, 0, "ORPOConfig", NULL, 1)                                                                                  \
    X(GRPO, "grpo", "TRL GRPOTrainer: generation, a reference forward if beta > 0, the policy step", NULL, 1, 1, \
      1, 0, "GRPOConfig", NULL, 0)

enum mp_trainer {
#define MP_X(id, name, how, unmodelled, seqs, min_batch, ref_fwds, kl_fwds, config, loss_type, drop0) \
    MP_TRAINER_##id,
    MP_TRAINERS(MP_X)
#undef MP_X
};

/* The reference model of a DPO step (mp_train_opts.ref). */
enum mp_ref_mode {
    MP_REF_NONE,    /* no reference forward in the step (SFT; DPO with precompute_ref_log_probs) */
    MP_REF_COPY,    /* a full frozen copy in the policy's dtype: resident, one no-grad forward */
    MP_REF_ADAPTER, /* PEFT: the policy with its adapter disabled, one no-grad forward, no copy */
};

/* Activations, one row each: X(id, name, HF aliases, saves, HF intermediates, amp32, bwd, fwd).
 * A new activation is one row here plus its math (probe/mp_math.h mp_act_f/mp_act_df: -Wswitch
 * names a missing case); tests/test_probe_ops.c runs every row on both backends.
 *   saves          IN (the input) or OUT (the output): what backward reads.
 *   intermediates  x-sized tensors HF's Python composite also keeps (space-separated names; a
 *                  ":u8" suffix: one byte per element).
 *   amp32          what is fp32 under CUDA autocast with a half input, because the composite calls
 *                  an op on CUDA's fp32 list: "in" the saved input becomes an fp32 copy, a named
 *                  intermediate is fp32, "out" the output is fp32.
 *   bwd            x-sized tensors (output dtype) its backward holds beyond the two gradients of a
 *                  fused kernel (HF's composites chain several autograd nodes).
 *   fwd            x-sized forward transients (not saved) beside the output; under amp with fp32
 *                  parts, two of them are fp32 and the rest in x's dtype.
 * GELU_TANH is the fused kernel (F.gelu(approximate="tanh"), HF gelu_pytorch_tanh); GELU_NEW /
 * GELU_FAST are HF's composites (NewGELUActivation, FastGELUActivation), the same function.
 * RELU2 (HF ReLUSquaredActivation, relu(x)^2) saves relu(x), an x-sized tensor: modelled as IN.
 * XIELU (HF XIELUActivation's Python path, Apertus): where(x > 0, alpha_p*x*x + beta*x,
 * (expm1(min(x, eps)) - x)*alpha_n + beta*x) with two learned (1,) scalars (lower_act adds them and
 * the two scalar buffers): saves x, the bool mask, alpha_p*x (fp32 under amp: the fp32 (1,)
 * parameter promotes it), expm1's result and expm1 - x; its bwd goes with lower_act's two rules
 * (the gradient's cast back to x's dtype under amp, the mask freed first).
 * QUICK_GELU (HF QuickGELUActivation, Qwen2-VL's vision MLP): x * sigmoid(1.702 x): saves x and the
 * sigmoid's output, the 1.702 x a forward transient; its backward peaks one x-sized tensor above a
 * fused kernel's (measured, docs/memory-facts.md#hf-activations).
 * Where the intermediates, amp32, bwd and fwd values come from: docs/memory-facts.md#hf-activations. */
#define MP_ACTIVATIONS(X)                                                                        \
    X(GELU, "gelu", "", IN, "", "", 0, 0)                                                         \
    X(GELU_TANH, "gelu_tanh", "gelu_pytorch_tanh tanh_gelu", IN, "", "", 0, 0)                    \
    X(RELU, "relu", "", OUT, "", "", 0, 0)                                                        \
    X(SILU, "silu", "swish", IN, "", "", 0, 0)                                                    \
    X(TANH, "tanh", "", OUT, "", "", 0, 0)                                                        \
    X(SIGMOID, "sigmoid", "", OUT, "", "", 0, 0)                                                  \
    X(GELU_NEW, "gelu_new", "", IN, "tanh half_x one_plus_tanh", "in tanh one_plus_tanh out", 1, 2) \
    X(GELU_FAST, "gelu_fast", "", IN, "c_x k_x poly tanh half_x one_plus_tanh", "", 1, 2)         \
    X(RELU2, "relu2", "", IN, "", "", 2, 0)                                                       \
    X(XIELU, "xielu", "", IN, "mask:u8 ax expm1 expm1_minus_x", "ax out", 3, 3)                   \
    X(QUICK_GELU, "quick_gelu", "", IN, "sigmoid", "", 1, 1)

enum mp_act {
#define MP_X(id, name, aliases, saves, extras, amp32, bwd, fwd) MP_ACT_##id,
    MP_ACTIVATIONS(MP_X)
#undef MP_X
};
enum { /* the number of rows (outside enum mp_act, so switches over it stay exhaustive) */
#define MP_X(id, name, aliases, saves, extras, amp32, bwd, fwd) MP_ACT_ROW_##id,
    MP_ACTIVATIONS(MP_X)
#undef MP_X
        MP_ACT_COUNT
};

#endif
