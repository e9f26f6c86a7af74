/* layers.h — the tensor program: what one training step computes and keeps.
 *
 * mp_program_build() lowers a model, at batch b and sequence s under a
 * precision policy, into tensors (storages) and nodes (primitive ops).  Each
 * node lists the tensors it creates (out + extras) and the ones it saves for
 * backward, following what PyTorch autograd saves (docs/memory-facts.md#saved-tensors)
 * and autocast copies (docs/memory-facts.md#autocast).
 * Views are not tensors: a view node's out is its input's id.  The estimator
 * replays this program as alloc/free events; the probe executes it.  One
 * program, so estimate and measurement compare tensor by tensor.
 * All sizes are checked 64-bit; an overflow is MP_ERR_RANGE naming the layer.
 */
#ifndef MEMPLAN_LAYERS_H
#define MEMPLAN_LAYERS_H

#include "finetune.h"
#include "model/model.h"

uint64_t mp_dtype_size(enum mp_dtype t);
const char *mp_dtype_str(enum mp_dtype t);

/* The kernel torch 2.15's SDPA dispatcher picks on CUDA for a training step
 * (lower_attention.c, docs/memory-facts.md#sdpa-backend). */
enum mp_sdpa_backend { MP_SDPA_UNKNOWN, MP_SDPA_CUDNN, MP_SDPA_FLASH, MP_SDPA_EFFICIENT, MP_SDPA_MATH };
const char *mp_sdpa_backend_str(enum mp_sdpa_backend b); /* "cudnn", "flash", "efficient", "math", "" */
/* For compute capability major.minor (0: unknown), q's dtype dt, q/k and v head dims d and dv, a
 * mask passed (attn_mask) and dropout; math as lower_attention.c's sdpa_math decided. */
enum mp_sdpa_backend mp_sdpa_backend(int major, int minor, enum mp_dtype dt, uint64_t d, uint64_t dv, bool masked,
                                     bool dropout, bool math);

const char *mp_precision_str(enum mp_precision p);
int mp_precision_parse(const char *s); /* -1 if unknown */

/* The sets' names and parsers (util/sets.h's tables): *_str gives "?" for a value outside the
 * set, *_parse -1 for an unknown name; *_names the names joined by sep, last before the last
 * one (NULL: sep) — "sgd | sgd-momentum | ...", "sgd, ... or adam8bit" (util.h mp_join). */
const char *mp_optimizer_str(enum mp_optimizer o);
int mp_optimizer_parse(const char *s);
const char *mp_optimizer_names(const char *sep, const char *last);
const char *mp_precision_names(const char *sep, const char *last);
/* The optimizer's traits (its row of MP_OPTIMIZERS). */
enum mp_opt_state mp_optimizer_state(enum mp_optimizer o);
enum mp_opt_tmp mp_optimizer_tmp(enum mp_optimizer o);
const char *mp_optimizer_hf(enum mp_optimizer o);  /* the TrainingArguments optim reports write */
const char *mp_optimizer_hf_names(const char *sep, const char *last); /* the HF names parse takes */
bool mp_optimizer_probe(enum mp_optimizer o);       /* the probe runs its step */
const char *mp_optimizer_probe_names(void);         /* those, as "a, b and c" */
bool mp_optimizer_par_probe(enum mp_optimizer o); /* runs on the data-parallel probe */
bool mp_optimizer_decoupled_wd(enum mp_optimizer o); /* AdamW's weight decay (the probe's update) */
const char *mp_optimizer_par_probe_names(void);   /* those, as "a, b and c" */
/* The loss heads (MP_LOSSES): name, how a trainer turns it on, why it is not modelled (NULL: it is). */
const char *mp_loss_str(enum mp_loss l);
const char *mp_loss_how(enum mp_loss l);
const char *mp_loss_unmodelled(enum mp_loss l);
int mp_loss_parse(const char *s);
const char *mp_loss_names(const char *sep, const char *last);
/* What a recipe's Liger switch sets (set): kernels given true (on) and false (off); unset_off:
 * those left unset are off (Axolotl's plugin), else at the apply function's default
 * (transformers).  Not set: the command line's --loss liger, the fused linear cross-entropy alone
 * (what memplan's emitted liger_kernel_config asks). */
struct mp_liger {
    bool set;
    unsigned on, off;     /* MP_LK_* bits (util/sets.h) */
    bool unset_off;
    const char *where;    /* the recipe's "FILE:LINE: KEY: VALUE" that set it, for messages */
};
const char *mp_liger_kernel_name(unsigned bit);
int mp_liger_kernel_parse(const char *name); /* its bit, -1 if no kernel of that name */
unsigned mp_liger_params(const char *hf_type); /* the kernels Liger's apply function takes (0: none) */
/* NULL when --loss liger runs as planned on this model_type (Liger's fused linear cross-entropy
 * and no other kernel of it); else why not, written into buf. */
const char *mp_liger_refused(const char *hf_type, const struct mp_liger *lk, char *buf, size_t cap);
const char *mp_trainer_str(enum mp_trainer t);
const char *mp_trainer_unmodelled(enum mp_trainer t); /* NULL: modelled */
int mp_trainer_parse(const char *s);
const char *mp_trainer_names(const char *sep, const char *last);
const char *mp_ref_mode_str(enum mp_ref_mode r);
/* The trainer's traits (its row of MP_TRAINERS): the sequences one example runs through the policy
 * (DPO's chosen and rejected, 2), the smallest micro-batch it accepts (KTO's KL term, 2), the
 * no-grad forwards of its reference model a step (0: none; DPO 1; KTO 2, the KL sequences and the
 * batch) and of the policy (KTO's KL sequences, 1), and TRL's config class ("DPOConfig"). */
uint64_t mp_trainer_seqs(enum mp_trainer t);
uint64_t mp_trainer_min_batch(enum mp_trainer t, enum mp_loss l); /* (LLaMA-Factory's KTO: 1) */
unsigned mp_trainer_ref_fwds(enum mp_trainer t);
unsigned mp_trainer_kl_fwds(enum mp_trainer t);
const char *mp_trainer_config(enum mp_trainer t);
/* --trainer dpo or kto with --loss hf: LLaMA-Factory 0.9.5's own step (CustomDPOTrainer,
 * CustomKTOTrainer: the model's fp32 logits, lower_embed_head.c lower_lf_dpo_loss), not TRL's */
bool mp_trainer_lf(enum mp_trainer t, enum mp_loss l);
bool mp_trainer_drops_dropout(enum mp_trainer t); /* its config's disable_dropout defaults to True */
/* Whether trainer t's step (with loss l) casts a bitsandbytes 4/8-bit base's trainable parameters
 * to bf16 after get_peft_model (m LoRA or QLoRA; base: the checkpoint's quantization): TRL 1.16's
 * SFT (--loss chunked-nll), DPO, KTO and GRPO trainers (sft_trainer.py:905-911), not ORPO's nor
 * LLaMA-Factory's.  mp_par_adapters_cast MP_AC_TRL_QUANT. */
bool mp_trainer_casts_quant_adapters(enum mp_trainer t, enum mp_loss l, enum mp_ft_mode m, enum mp_quant_kind base);
/* "DPO", "KTO": the trainer's TRL name (its config class less "Config"), into buf. */
const char *mp_trainer_trl_name(enum mp_trainer t, char *buf, size_t cap);
/* The loss_type its config is written with ("apo_zero_unpaired"), NULL for the config's default. */
const char *mp_trainer_loss_type(enum mp_trainer t);
/* The rows of one chunk of loss l's head over `rows` label positions (vocabulary v, hidden h):
 * chunked-nll min(rows, 4096) (trl 1.16.0 kernels/chunked_logprob.py TOKEN_CHUNK_SIZE), liger
 * min(next_pow2(ceil(rows / ceil(v / h))), rows) (liger-kernel 0.8.5
 * ops/fused_linear_cross_entropy.py:103-105), hf every row; 0 for a loss not modelled. */
uint64_t mp_loss_chunk_rows(enum mp_loss l, uint64_t rows, uint64_t v, uint64_t h);
/* Why loss l cannot run in precision p (its library's dtype rules), or NULL. */
const char *mp_loss_precision_refused(enum mp_loss l, enum mp_precision p);
#define MP_TRL_VOCAB_CHUNK 32768 /* trl 1.16.0 trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE */
#define MP_TORCHTUNE_CHUNKS 8u  /* torchtune LinearCrossEntropyLoss num_output_chunks (cross_entropy_loss.py:36) */

struct mp_build_opts {
    uint64_t batch;              /* micro-batch */
    uint64_t seq;                /* sequence length (token models; the encoder's for encoder-decoders) */
    uint64_t target_seq;         /* encoder-decoder models: the decoder's length (0: = seq) */
    enum mp_precision precision;
    enum mp_attn_impl attention; /* default for attention layers that do not name one */
    bool attention_forced;       /* --attention given: overrides what the file says */
    struct mp_finetune ft;       /* what trains: full (default), LoRA, QLoRA, frozen blocks */
    bool hf_checkpointing;       /* transformers' gradient checkpointing (--checkpoint layers): it
                                    turns use_cache off */
    enum mp_loss loss;           /* the causal LM's loss head (--loss; default hf) */
    struct mp_liger liger;       /* --loss liger: the kernels the trainer's switch sets (liger.c);
                                    the command line's: the fused linear cross-entropy alone */
    double label_fraction;       /* the share of label positions that are not -100 (prompt masking;
                                    0 < f <= 1, default 1): the chunked-nll head gathers only those */
    bool packing;                /* --packing: each row holds several documents (position ids restart
                                    per document, no padding): SDPA gets transformers' block-diagonal
                                    bool mask (docs/memory-facts.md#packing) */
    bool padding_free;           /* --tokens-per-batch, TRL's padding_free: the micro-batch's rows are
                                    concatenated into one row (lowered at batch 1, seq batch x seq);
                                    implies packing */
    enum mp_trainer trainer;     /* --trainer: DPO lowers 2 x batch sequences (batch counts pairs) */
    bool no_copies;              /* lower every block: none is made by shifting a copy of the block
                                    before it (tests compare the two builds) */
    unsigned torch;              /* --torch: the PyTorch release, major * 100 + minor (211 for 2.11);
                                    0: the one memplan's facts are read from (2.15).  It decides
                                    SDPA's kernel for fp32 grouped-query attention (lower_attention.c
                                    sdpa_math) */
    int cc_major, cc_minor;      /* the target GPU's compute capability (0.0: none): SDPA's backend
                                    (mp_sdpa_backend), reported */
    unsigned sm_count, sm_threads; /* the target GPU's SMs and resident threads per SM (struct mp_gpu):
                                    they size torch's column sums' staging buffers (build.c
                                    col_sum_staging); 0: no target, not counted */
    uint64_t completion;         /* GRPO: labels on each row's last `completion` positions only (the
                                    completion; trl grpo_trainer.py:1495-1496); 0: label_fraction */
    bool gen_cache;              /* generation's prefill (GRPO): transformers' DynamicCache on, whatever
                                    use_cache and checkpointing say (generate turns both so) */
    uint64_t ep;                 /* --ep: expert-parallel ranks (0 or 1: none): each MoE layer holds
                                    experts / ep of its experts and runs them on the rows the
                                    all-to-all brings (transformers 5.24 AllToAllEP) */
    double moe_capacity;         /* --moe-capacity (>= 1): under --ep, the busiest rank receives the
                                    uniform rows with one expert's share scaled by it */
    bool adapter_off;            /* peft's disable_adapter (DPO's reference is the policy so): every
                                    adapted Linear runs its base layer alone, no LoRA branch (peft
                                    0.21.2 tuners/lora/layer.py:1079, bnb.py Linear4bit: no clone) */
    bool zero3_linear;           /* DeepSpeed ZeRO-3's memory_efficient_linear (default true): F.linear
                                    is LinearFunctionForZeroStage3, which saves its input whenever
                                    autograd records it, a frozen weight's too (frozen.c) */
};
/* The first PyTorch release known to run fp32 grouped-query attention on SDPA's memory-efficient
 * kernel (--torch below it: the math kernel, lower_attention.c sdpa_math) */
#define MP_TORCH_MEMEFF_GQA 215
/* The global-memory staging torch's CUDA reduction (aten/src/ATen/native/cuda/Reduce.cuh,
 * setReduceConfig) allocates through the caching allocator to sum an (m, n) gradient of esize-byte
 * elements over its m rows (n contiguous outputs), on a GPU of sms SMs of sm_threads resident
 * threads: 4 x n x ctas_per_output x block.x x output_vec_size bytes when the input is split over
 * several blocks per output, 0 when not; *sem its semaphores (4 x grid.x bytes).  0 without an SM
 * count.  docs/memory-facts.md#reduce-staging. */
/* --ep: the rows the busiest rank's experts receive per MoE layer (lower_mlp.c): tokens x top-k
 * under uniform routing; with capacity F > 1, one of its `local` experts gets F x its share:
 * tokens x k x (local - 1 + F) / local, at most tokens x ep x min(k, local).  Bounded operands
 * (the program's checked sizes). */
uint64_t mp_moe_ep_rows(uint64_t tokens, uint64_t k, uint64_t local, uint64_t ep, double capacity);
uint64_t mp_col_sum_staging(uint64_t m, uint64_t n, uint64_t esize, unsigned sms, unsigned sm_threads,
                            uint64_t *sem);

/* batch 1, seq 0 (= model default), amp-bf16, sdpa, loss hf, every label counted. */
void mp_build_opts_default(struct mp_build_opts *o);

/* The prims, one row each: X(id, name) and what the node reads, writes and saves.  The enum,
 * mp_prim_str and the executors' prim tables (indexed by the enum) follow the rows; a prim
 * without a per-op program fails tests/test_probe_ops.c. */
#define MP_PRIMS(X) \
    X(EMBED, "embedding") /* in[0] int64 ids (b,s) -> out (b,s,h); param[0] table */ \
    X(ADD_POS, "add_pos") /* out = in[0] + table rows: k == seq: row = position (learned positions); \
                        k == 1: row 0 for every position (BERT token types, all-zero ids); param[0] table */ \
    X(CAST, "cast") /* out = in[0] converted to out's dtype (autocast copies) */ \
    X(LINEAR, "linear") /* out (M,n) = in (M,k) W^T + bias; param[0] W (n,k), param[1] bias */ \
    X(LAYERNORM, "layernorm") /* extras: mean, rstd (M fp32); param[0] gamma, param[1] beta */ \
    X(RMSNORM, "rmsnorm") /* HF composite RMSNorm: extras rsqrt (M fp32) and the normalized x (fp32 or input dtype) */ \
    X(ROPE, "rope") /* out = rotary(in[0]) on the first rotary_dim of each head */ \
    X(ATTN, "attention") /* in[0] q, in[1] kv source; see node->attn; extras: lse (flash) or probs/mask/copies (eager) */ \
    X(ACT, "activation") /* out = act(in[0]) */ \
    X(MUL, "mul") /* out = in[0] * in[1] (gated MLP) */ \
    X(DROPOUT, "dropout") /* out = in[0] * mask / (1-p); extras: mask (u8) */ \
    X(ADD, "add") /* out = in[0] + in[1] (residual) */ \
    X(CONV2D, "conv2d") /* param[0] weight, param[1] bias */ \
    X(BATCHNORM, "batchnorm2d") /* extras: save_mean, save_invstd (C fp32) */ \
    X(MAXPOOL, "maxpool2d") /* extras: int64 indices */ \
    X(AVGPOOL, "avgpool2d") \
    X(ADAPTIVE_AVGPOOL, "adaptive_avgpool2d") \
    X(VIEW, "view") /* flatten: out == in[0] */ \
    X(LOG_SOFTMAX, "log_softmax") /* out (M,V) = log_softmax(in[0]) in in[0]'s dtype; saves out */ \
    X(NLL_LOSS, "nll_loss") /* in[0] log-probs (M,V), in[1] labels; out scalar mean loss; saves in[0] and the \
                        extras (shifted int64 labels, total_weight) */ \
    X(CUSTOM, "custom") /* opaque: out of given bytes, extras[0] the rest of what it saves */ \
    X(SCALE, "scale") /* out = in[0] * p (LoRA's scaling by a Python float: saves nothing) */ \
    X(FUSED_LOSS, "fused_loss") /* a chunked / fused LM head and its loss (--loss): in[0] hidden (b,s,h), \
                        param[0] the head's weight (ORPO's loss: in[0] the logits, no param); \
                        out the scalar loss; extras what it keeps (by role); \
                        its chunks' transients in fwd_tmp / bwd_tmp; no executor runs it (the probe \
                        refuses the program) */ \
    /* mixture of experts (transformers' grouped_mm path); no executor runs these: the probe \
     * refuses a program that has them (mp_program.probe_unsupported) */ \
    X(ROUTER, "router") /* in[0] router logits (M,E) -> out top-k weights (M,k); extras: probabilities, \
                        top-k indices, the renormalization's saved operands */ \
    X(ROWS, "rows") /* out = rows of in[0] picked by an int64 index (extras), permuted, or summed over \
                        the top-k copies of each token; backward scatters into a zero gradient */ \
    X(GROUPED_MM, "grouped_mm") /* out (S,n) = each row's expert: in (S,k) W_e^T; param[0] all experts (E*n, k) */ \
    X(MASKED_SCATTER, "masked_scatter") /* out = in[0] with in[1]'s rows at a bool mask's positions (Gemma 3's image \
                        features into the text embedding); extras: the mask (saved); backward: a new gradient \
                        for each input (masked_fill, masked_select); no executor runs it */

enum mp_prim {
#define MP_X(id, name) MP_P_##id,
    MP_PRIMS(MP_X)
#undef MP_X
        MP_P_COUNT
};
const char *mp_prim_str(enum mp_prim p);

#define MP_TENSOR_RANK_MAX 4

struct mp_tensor {
    const char *name;             /* "h.3.attn.q_proj" (in the program's name store) */
    enum mp_dtype dtype;
    uint64_t elems;
    uint64_t bytes;               /* elems * dtype size, unrounded */
    int rank;
    uint64_t shape[MP_TENSOR_RANK_MAX]; /* whole batch: (b,s,h) or (b,c,h,w) or (b,n) */
    bool needs_grad;              /* backward computes a gradient for it */
    int block;                    /* block that creates it (-1: the model input) */
};

#define MP_NODE_EXTRA_MAX 8
#define MP_NODE_TMP_MAX 3

/* What each extra tensor of a node is.  Executors find an extra by its role
 * (mp_node_extra), never by its position, the count of extras or a byte formula, so
 * a change in the lowering cannot silently change what a backend reads. */
enum mp_xrole {
    MP_XR_NONE,           /* unset: mp_program_build refuses it (MP_ERR_INTERNAL) */
    MP_XR_WEIGHT_COPY,    /* linear: the autocast half copy of W */
    MP_XR_MEAN,           /* layernorm: mean (M fp32) */
    MP_XR_RSTD,           /* layernorm: 1/std (M fp32) */
    MP_XR_X_FP32,         /* x upcast to fp32: HF RMSNorm (half x), an autocast pow's input (composite GELUs) */
    MP_XR_RSQRT,          /* HF RMSNorm: rsqrt(mean(x^2) + eps) (M fp32) */
    MP_XR_NORMED,         /* HF RMSNorm: x * rsqrt, the weight's input */
    MP_XR_ACT_PART,       /* HF composite GELUs: intermediates, in mp_act_intermediates order */
    MP_XR_DROP_MASK,      /* dropout: the u8 keep mask */
    MP_XR_COS_SIN,        /* rope: the cos/sin table (first rope of the forward) */
    MP_XR_LSE,            /* flash attention: fp32 logsumexp (b, a, s rounded) */
    MP_XR_Q_COPY,         /* eager attention: contiguous q, k, v */
    MP_XR_K_COPY,
    MP_XR_V_COPY,
    MP_XR_SOFTCAP_TANH,   /* eager attention with logit soft-capping: tanh(scores / cap) */
    MP_XR_PROBS,          /* eager attention: softmax output */
    MP_XR_ATTN_DROP_MASK, /* eager attention: dropout mask on the probabilities (u8) */
    MP_XR_PROBS_DROPPED,  /* eager attention: dropped probabilities, P@V's input */
    MP_XR_PROBS_CAST,     /* eager attention: probabilities cast to v's dtype, P@V's input */
    MP_XR_BN_MEAN,        /* batchnorm: save_mean (C fp32) */
    MP_XR_BN_INVSTD,      /* batchnorm: save_invstd (C fp32) */
    MP_XR_POOL_INDICES,   /* maxpool: int64 argmax indices */
    MP_XR_SHIFT_LABELS,   /* nll_loss: the shifted int64 labels */
    MP_XR_TOTAL_WEIGHT,   /* nll_loss: total_weight */
    MP_XR_GATHER_INDEX,   /* last-token pooling: the two int64 index vectors */
    MP_XR_POSITION_IDS,   /* learned positions: int64 position ids */
    MP_XR_CUSTOM_SAVED,   /* custom: the rest of what the block saves (opaque bytes) */
    MP_XR_ROUTER_PROBS,   /* MoE router: softmax / sigmoid of the logits (M, E) */
    MP_XR_TOPK_INDEX,     /* MoE router: top-k expert indices (M, k) int64 */
    MP_XR_TOPK_VALUES,    /* MoE router: the top-k weights before renormalization (M, k) */
    MP_XR_TOPK_SUM,       /* MoE router: their sum (M, 1), the divisor */
    MP_XR_ROUTE_MASK,     /* MoE router: group-limited routing's (M, E) bool mask */
    MP_XR_ROW_INDEX,      /* MoE dispatch/combine: an int64 row index */
    MP_XR_EXPERT_OFFSETS, /* grouped_mm: per-expert row offsets (E int32) */
    MP_XR_ATTN_MASK,      /* attention given a (b, 1, s, s) mask (Falcon): the model's mask (first
                             attention) or, under autocast, this layer's half copy SDPA saves */
    MP_XR_SPLIT_INDEX,    /* Falcon's qkv split by advanced indexing: the int64 index it saves */
    MP_XR_NORM_WEIGHT,    /* layernorm: a weight or bias it runs with that is not the parameter
                             (Nemotron's weight + 1, autocast's half copies): saved */
    MP_XR_LOSS_SAVED,     /* fused loss: what the head keeps for backward (gathered rows, labels,
                             log-sum-exp, the label mask): counted only */
    MP_XR_LOSS_GRAD,      /* fused loss (Liger): a gradient made in the forward and handed to
                             backward (the input's, the weight's) */
    MP_XR_EP_MASK,        /* expert parallelism: the experts' (R, 1) bool sentinel mask (masked_fill) */
    MP_XR_IMAGE_MASK,     /* masked_scatter: the image tokens' (b, s) bool mask (input_ids == image_token_id) */
    MP_XR_EP_LOCAL,       /* expert parallelism: the received rows' local expert ids (R int64) or unit
                           * weights (R), held by AllToAllEP's frame until the experts module returns */
    MP_XR_COUNT
};

/* What a part of a node's transient workspace (its TMP storage, one per phase) is, at a
 * byte offset inside it. */
enum mp_trole {
    MP_TR_OTHER,          /* counted only: no executor reads or writes it */
    MP_TR_WGRAD_HALF,     /* linear backward under autocast: the half dW before its fp32 copy into .grad */
    MP_TR_DEQUANT,        /* quantized linear: the dequantized weight (each direction) */
    MP_TR_FLASH_D,        /* flash backward: softmax_d (b, a, s rounded to 128) fp32 */
    MP_TR_FLASH_DQ,       /* flash backward: dq accumulator (b, s_r, a, d rounded to 32) fp32 */
    MP_TR_COL_SUM,        /* torch's CUDA column sum of a gradient over the tokens (a bias's, a composite
                             norm's weight's): its staging buffer or semaphores (mp_col_sum_staging);
                             counted only */
};
struct mp_tmp_part {
    enum mp_trole role;
    uint64_t offset, bytes;
};
#define MP_NODE_SAVED_MAX 8

/* A node that autograd runs as several ops (eager attention: Q@K^T, the scaling, the mask add,
 * the softmax and the casts around it, dropout, P@V, each a torch op and an autograd node of its
 * own) lists them, forward and backward, in torch's order (mp_program.subops).  Forward, each op
 * makes a tensor: an extra of the node, its output, or a transient (a tensor of the program that
 * only this op sequence allocates); then its input transient dies.  Backward, each op makes one
 * gradient: a buffer (a tensor only backward allocates, in the GRAD store) or the gradient of an
 * input, reading the buffer before it (or the node's output gradient); then what no later op reads
 * dies: its input buffer, the saved tensors of its autograd node (freed when that node ends), the
 * output gradient.  The replay walks them; executors run one per MP_EV_FWD / MP_EV_BWD
 * (mp_event.step). */
enum mp_subop_kind {
    /* forward */
    MP_SOP_QK,          /* scores = Q K^T per head (the contiguous q/k/v copies are made first) */
    MP_SOP_SCALE,       /* src * scale (forward and backward: MulBackward0 / DivBackward0) */
    MP_SOP_SOFTCAP_DIV, /* Gemma2's soft-capping: / cap, tanh (saved), * cap; backward in reverse */
    MP_SOP_SOFTCAP_TANH,
    MP_SOP_SOFTCAP_MUL,
    MP_SOP_MASK,        /* + the (b, 1, s, s) float mask (dtype promotion); the executors mask in
                           the softmax (causal) and copy here */
    MP_SOP_CAST,        /* src in dst's dtype (forward: softmax's fp32 upcast, probs cast to v's
                           dtype; backward: ToCopyBackward0, the engine's cast to an input's dtype) */
    MP_SOP_SOFTMAX,     /* forward: softmax of src; backward: P * (src - rowsum(P * src)), P dies */
    MP_SOP_DROPOUT,     /* forward: dst = src * keep / (1 - p), dst2 the keep mask; backward: src *
                           mask / (1 - p), the mask dies */
    MP_SOP_PV,          /* forward: out heads (b, a, s, dv) = P V */
    MP_SOP_OUT,         /* forward: the node's output (b, s, a*dv) = the heads transposed (a copy) */
    /* backward only */
    MP_SOP_PV_DV,       /* dV = P^T dO, per head (P@V's BmmBackward0, its mat2 gradient) */
    MP_SOP_PV_DP,       /* dP = dO V^T (its self gradient); P@V's operands and dO die */
    MP_SOP_QK_DQ,       /* dQ = src K (Q@K^T's BmmBackward0) */
    MP_SOP_QK_DK,       /* dK = src^T Q; Q@K^T's operands die */
    MP_SOP_GATHER,      /* in[grad]'s gradient += src, a copy's gradient in the input's layout and
                           dtype (repeat_kv's sum over the group, a cast back, a fused qkv's cat) */
};
struct mp_subop {
    enum mp_subop_kind op;
    int src;            /* what it reads: a tensor id; -1: the node's q/k/v (forward QK), its
                           output gradient (backward) */
    int dst, dst2;      /* what it makes (tensor ids, -1 none); backward dst -1: it makes or adds
                           to in[grad]'s gradient */
    int grad;           /* backward: that input (0 q, 1 k, 2 v), -1 none */
    int free_buf;       /* a transient / buffer that dies after it, -1 none */
    int release[2];     /* backward: tensors the node saved that die after it, -1 none */
    bool free_gout;     /* backward: the node's output gradient dies after it */
};
#define MP_NODE_SUBOP_MAX 16

struct mp_node {
    enum mp_prim prim;
    const char *name;             /* "h.3.attn.q_proj" (in the program's name store) */
    const struct mp_layer *layer; /* the model layer it lowers (never NULL) */
    int block;
    int in[3];                    /* tensor ids; -1 unused (attention: q, k, v; loss: logits, labels) */
    int out;                      /* tensor id (== in[0] for views and in-place ops) */
    int wcopy;                    /* autocast's half copy of param[0] (an extra), -1 none: autocast caches it
                                     until the forward's autocast region ends (after the loss) */
    int score_add[2];             /* eager attention: what is added to the scaled scores, in order (the
                                     model's mask, T5's position bias and causal mask), -1 none */
    int keep;                     /* tensor a Python local holds until this forward is done (no gradient
                                     flows through it: the half logits during the loss); -1 none */
#define MP_NODE_LOCALS_MAX 3
    int locals[MP_NODE_LOCALS_MAX]; /* tensors the Python frames of the modules this node ends hold
                                     until it has run (their forward returns): a module's argument
                                     (held by its caller's call) and locals it rebinds (peft's fp32
                                     cast of x); -1 unused.  Held like keep in a recompute (an
                                     early-stopped one holds them to its stop), not in the first
                                     forward (docs/checkpointing.md#early-stop) */
    bool kv_cached;               /* out is held by transformers' DynamicCache (use_cache) until the
                                     forward, loss included, is done */
    int n_extra;
    int extra[MP_NODE_EXTRA_MAX]; /* tensors created besides out, kept only if saved */
    enum mp_xrole extra_role[MP_NODE_EXTRA_MAX];
    int n_fwd_tmp, n_bwd_tmp;     /* the parts of fwd_tmp_bytes / bwd_tmp_bytes (they add up to them) */
    struct mp_tmp_part fwd_tmp[MP_NODE_TMP_MAX], bwd_tmp[MP_NODE_TMP_MAX];
    int n_saved;
    int saved[MP_NODE_SAVED_MAX]; /* tensors kept for backward (distinct ids) */
    int in_grad_part[3];          /* >= 0: in[j] is a view of part of its storage (a chunk) and the
                                     gradient this node makes for it is that tensor (a part), not
                                     in[j]'s whole gradient; -1: the whole gradient */
    int out_parts[2];             /* the gradient parts of out (-1 none): this node's backward first
                                     assembles out's gradient from them (SplitBackward's cat) */
    bool engine_grad[3];          /* in[j]'s gradient is made by the autograd engine after the node's
                                     backward returns (validate_outputs: the cast to in[j]'s dtype, the
                                     sum over a broadcast operand's dimensions), not by the node (set
                                     on MoE multiplies only, which no probe executor runs) */
    int param[2];                 /* parameter ids (weight, bias); -1 unused */
    bool grad_in;                 /* produces gradients for its inputs that need one */
    int fop0, n_fops;             /* its forward as several ops: mp_program.subops[fop0 ..
                                     fop0 + n_fops); n_fops 0: one op */
    int bop0, n_bops;             /* the same for its backward */
    uint64_t fwd_tmp_bytes;       /* transient workspace during forward */
    uint64_t bwd_tmp_bytes;       /* transient workspace during backward (beyond grads of inputs/params) */
    double fwd_flops, bwd_flops;
    /* dimensions the executor needs */
    uint64_t rows, n, k;          /* linear: M rows, n out, k in; norms: rows, n = width */
    uint64_t heads, kv_heads, head_dim, seq, rotary_dim;
    bool causal, eager;
    bool no_grad;                 /* not recorded by autograd (no input needs grad, no trainable
                                   * parameter): saves nothing, has no backward */
    bool fwd_grads;               /* its gradients were made in the forward and kept as its saved
                                     MP_XR_LOSS_GRAD extras (Liger): backward hands them on, so the
                                     replay releases them as it makes the gradients (no new bytes) */
    bool fwd_tmp_first;           /* its forward's transients are made and die before its output and
                                     kept tensors are made (an HF composite activation: pow(x, 3) and
                                     the polynomial, then tanh, 1 + tanh and the product reuse their
                                     blocks): the replay requests them first */
    bool col_sum_weight;          /* param[0]'s gradient is a (rows, n) product summed over the rows by
                                     the engine (a composite norm's weight * normed): torch's CUDA
                                     column sum (mp_col_sum_staging); a Linear's bias always is */
    bool ep_unit;                 /* inside the experts module's forward under --ep (dispatch, the
                                     experts, combine): FSDP2's experts unit gathers at its first
                                     such node and reshards after its last */
    bool quantized;               /* linear on a quantized weight: dequantized into a temporary
                                   * (fwd_tmp_bytes, bwd_tmp_bytes) for the matmul */
    enum mp_act act;
    double p;
    uint64_t c_in, c_out, h_in, w_in, h_out, w_out, kernel, stride, padding, groups;
};

struct mp_param {
    const char *name;    /* in the program's name store */
    uint64_t elems;
    int block;           /* block that owns it */
    bool matmul;         /* used by linear/conv: autocast makes a half copy */
    bool matrix;         /* 2-D or more (Adafactor factors it) */
    uint64_t rows, cols; /* for matrices (Adafactor: rows + cols state) */
    enum mp_dtype dtype; /* storage dtype (u8 for a quantized weight) */
    bool trainable;      /* has .grad and optimizer state (false: frozen base of LoRA / freeze) */
    bool adapter;        /* a LoRA A or B matrix */
    bool embedding;      /* an nn.Embedding weight (tokens, learned positions, token types, T5's
                          * position bias): HF's Trainer gives it 32-bit bitsandbytes states */
    bool output;         /* the output layer's weight or bias (lm_head, a classifier) */
    bool stacked;        /* a 3-D stack of experts' weights (rows: experts x out) */
    uint64_t experts;    /* stacked: the experts in it (its dim 0, the one FSDP2 shards) */
    bool idle;           /* requires grad but no op uses it (a multimodal model's vision tower in a
                          * text-only step): its .grad stays None, so no gradient and no optimizer
                          * state (torch.optim skips p.grad None); counted as trainable */
    uint64_t bytes;      /* what its storage allocates: elems x dtype, or a quantized weight's
                          * tensors each rounded to 512 (mp_quant_alloc_bytes) */
    uint64_t raw_bytes;  /* the library's tensor bytes (weights_bytes sums these) */
};
/* Gradient bytes of a parameter: 0 when frozen. */
uint64_t mp_param_grad_bytes(const struct mp_param *q);

struct mp_block_prog {
    int input;           /* tensor id of x_i */
    int output;          /* tensor id of x_{i+1} */
    size_t node0, n_nodes;
    size_t param0, n_params;
    uint64_t params;     /* parameter elements owned by the block */
    double fwd_flops, bwd_flops;
    double dequant_bytes; /* a forward's (or backward's) dequantization traffic: each quantized
                             weight read packed and written in the compute dtype (its DEQUANT
                             transient), memory-bound, once a pass */
};

struct mp_program {
    struct mp_build_opts opts;
    const struct mp_model *model;
    enum mp_dtype param_dtype;   /* fp32, or bf16 for pure bf16 */
    enum mp_dtype compute_dtype; /* matmul output dtype */
    size_t n_tensors, n_nodes, n_params, n_blocks;
    struct mp_tensor *tensors;
    struct mp_node *nodes;
    struct mp_param *params;
    struct mp_block_prog *blocks;
    int input;                   /* x_0: token ids, image or opaque input */
    int input_embed;             /* the token embedding's parameter (get_input_embeddings()), or -1 */
    int labels;                  /* int64 labels resident for the step, or -1 */
    int ids, type_ids;           /* --images: input_ids and token_type_ids (Gemma 3), image_sizes
                                    (Mistral 3) or the (3, b, s) position_ids (Qwen2-VL) (the input is
                                    pixel_values), or -1 */
    int rope_tables;             /* rotary cos/sin: the model makes them once per forward and every layer
                                    saves them (checkpointed layers too, as checkpoint inputs): held from
                                    the first forward that makes them to the backward of that block; -1 */
    int sdpa_backend;            /* enum mp_sdpa_backend torch picks for the first SDPA layer (with a
                                    target's compute capability; MP_SDPA_UNKNOWN without) */
    uint64_t sdpa_head_dim;      /* that layer's q/k head dim */
    enum mp_dtype sdpa_dtype;    /* and q's dtype */
    bool sdpa_math;              /* SDPA runs its math kernel (lower_attention.c sdpa_math: fp32
                                    grouped-query attention before torch 2.15) */
    int attn_mask;               /* the (b, 1, s, s) attention mask the model makes once per forward
                                    (Falcon), held like rope_tables; -1 */
#define MP_HELD_MAX 8
    size_t n_held;
    struct {
        int t;                   /* a tensor the model makes once per forward and hands to many blocks
                                    (T5: the encoder output, the position biases) */
        int release;             /* it lives until the loss; if this block is a checkpoint (its inputs
                                    hold it), until this block's backward; -1: until the loss */
        bool leaf;               /* a leaf that requires grad (T5's cross-attention zeros under HF
                                    checkpointing): AccumulateGrad keeps it and its .grad until the
                                    backward ends */
        int fwd_end;             /* >= 0: a local of a module's forward that returns with this block's
                                    forward (Pixtral's block mask): released then, unless `release`
                                    is a checkpoint; -1: none */
    } held[MP_HELD_MAX];
#define MP_BUFFERS_MAX 4
    size_t n_buffers;
    int buffers[MP_BUFFERS_MAX]; /* non-persistent module buffers, resident like the batch (rotary
                                    inv_freq and original_inv_freq, fp32) */
    bool explicit_loss;          /* last block computes the loss (lm_head / classifier) */
    uint64_t ref_held_bytes;     /* what the trainer's Python holds of the policy's forward through its
                                    reference forward beyond the saved tensors (LLaMA-Factory's DPO:
                                    the fp32 logits, lower_embed_head.c lower_lf_dpo_loss; its KTO:
                                    the policy's chosen and rejected logits and the reference's own
                                    batch logits through its KL forward, the same function); 0: none */
    uint64_t kl_held_bytes;      /* what the trainer holds through the policy's own no-grad forward of
                                    the KL sequences after its forward (LLaMA-Factory's KTO: the fp32
                                    logits, lower_lf_dpo_loss); 0: no such forward there (TRL's KTO
                                    runs it before the policy's) */
    const char *probe_unsupported; /* what no executor runs (MoE routing, latent attention): the probe
                                    refuses the program, naming it; NULL: everything runs */
    uint64_t total_params;
    uint64_t trainable_params;
    uint64_t adapter_params;     /* LoRA A and B elements */
    uint64_t ep_other_params;    /* --ep: the experts the other ranks of an EP group hold (counted in
                                    total_params and trainable_params, not in params[]) */
    double fwd_flops, bwd_flops;
    size_t copied_blocks;        /* blocks made by shifting a copy of the block before (no_copies off) */
    bool *copied;                /* [n_blocks] block i is one of those (fold.h: a folded interval's
                                    weighted block must be) */
    size_t n_subops;
    struct mp_subop *subops;     /* the ops of nodes that run as several (mp_node.fop0, bop0) */
    size_t cap_tensors, cap_nodes, cap_params, cap_subops; /* private */
    struct mp_name_chunk *names;                /* private: the name store (build.c) */
};

/* The tensor id of n's nth extra with role r (nth from 0), or -1. */
int mp_node_extra(const struct mp_node *n, enum mp_xrole r, int nth);
/* The part of n's forward (bwd false) or backward TMP storage with role r, or NULL. */
const struct mp_tmp_part *mp_node_tmp(const struct mp_node *n, bool bwd, enum mp_trole r);

/* Checks that m's layers chain (each layer's input is what the one before makes):
 * lowers its program at batch 1 and the model's sequence length and releases it.  Of a
 * run of identical blocks that each give back the shape they take, the copies after the
 * first two are not lowered: they chain as those did (a 100,000-block model loads in
 * the time of a few blocks).  The loader calls it after a reader; d names the layer
 * that does not fit. */
enum mp_status mp_program_check(const struct mp_model *m, struct mp_diag *d);

/* Loads a model file: memplan JSON or HF config.json, auto-detected (mp_model_read_*), then
 * mp_program_check.  On error returns MP_ERR_IO/JSON/MODEL/RANGE with d->msg =
 * "path: place: problem" and the model released (model_check.c). */
enum mp_status mp_model_load_file(struct mp_model *m, const char *path, struct mp_diag *d);
enum mp_status mp_model_load_file_as(struct mp_model *m, const char *path, const struct mp_model_request *rq,
                                     struct mp_diag *d);
enum mp_status mp_model_load_string(struct mp_model *m, const char *text, size_t len, const char *path,
                                    struct mp_diag *d);

/* Lowers m at o (seq 0 means the model's default).  On error the program is
 * released and d says which layer and why.  Release with mp_program_release. */
enum mp_status mp_program_build(const struct mp_model *m, const struct mp_build_opts *o, struct mp_program *p,
                                struct mp_diag *d);
/* The same for a p already built (or empty, or released): its memory is reused, which a
 * search that builds the same model at many batches needs on long models (no page faults
 * for arrays of a million nodes).  On error p is released. */
enum mp_status mp_program_rebuild(const struct mp_model *m, const struct mp_build_opts *o, struct mp_program *p,
                                  struct mp_diag *d);
void mp_program_release(struct mp_program *p);

/* Why LoRA/QLoRA with f's targets on m is not modelled (peft would adapt MoE expert parameters),
 * or NULL when it is (also NULL for a model without experts). */
const char *mp_moe_lora_unmodelled(const struct mp_model *m, const struct mp_finetune *f);
/* Why --precision bf16-amp is not modelled for m (NULL: it is): refused by the build, skipped by
 * suggest. */
const char *mp_bf16_amp_unmodelled(const struct mp_model *m);

/* Tensors allocated at setup and kept across steps: the input batch, labels, module buffers. */
bool mp_program_resident(const struct mp_program *p, int t);

/* The storage format of p's quantized Linear weights (params of dtype u8), or NULL. */
const struct mp_quant *mp_program_base_quant(const struct mp_program *p);

#endif
