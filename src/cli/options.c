/* options.c — the option table and its parser (in the manner of git's parse-options).
 *
 * One row per option: its names, its argument, the commands that take it, its help line, its
 * parser kind and the field of struct args it sets.  The parser, the help and the messages of a
 * bad value (not a number, out of range, not one of the choices) all come from the row; the
 * rules between options (exclusive, needs another) are in check_rules.
 */
#include <getopt.h> /* getopt_long */
#include <stddef.h> /* offsetof */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/* Largest values the integer options take: beyond them a plan means nothing. */
#define MAX_BATCH (1ull << 24)        /* micro-batch, --max-batch, --grad-accum */
#define MAX_SEQ (1ull << 24)
#define MAX_GLOBAL_BATCH (1ull << 32)

/* The CUDA context and the cuBLAS workspace: at most 1 PiB, as a GPU profile's (a size near
 * 2^64 overflowed the peak device bytes they are added to). */
#define MAX_OVERHEAD_BYTES (UINT64_C(1) << 50)

enum opt_kind {
    K_INT,      /* a whole number in [lo, hi] */
    K_SIZE,     /* a byte size (mp_parse_size): below lo is not a size, above hi (0: none) too large */
    K_PERCENT,  /* a decimal number of percent in the range dlo..dhi, stored as a fraction */
    K_PROB,     /* a probability in the range dlo..dhi */
    K_NUMBER,   /* a decimal number in the range dlo..dhi */
    K_ENUM,     /* a name through the set's parse function: a value from min */
    K_CHOICE,   /* one of the names in choices: its value */
    K_STRING,   /* the value as given (one of choices when there are any) */
    K_CALLBACK, /* cb parses the value; a message in its diag replaces the row's */
    K_FLAG,     /* no value: the field set true */
    K_HELP,     /* no value: the command's help, exit 0 */
};

struct opt_choice {
    const char *name;
    int value;
};

typedef enum mp_status (*opt_cb)(struct args *a, void *field, const char *s, struct mp_diag *d);

struct opt {
    char short_name; /* 0: none */
    const char *name;
    const char *arg;     /* the value's name in the help; NULL for K_FLAG and K_HELP */
    unsigned cmds;       /* C_* bits of the commands that take it */
    enum opt_kind kind;
    size_t off, size;    /* the field in struct args (FIELD) */
    size_t seen;         /* SEEN: a bool of struct args set when the option is given; 0: none */
    uint64_t lo, hi;     /* K_INT, K_SIZE */
    double dlo, dhi;     /* K_PERCENT, K_PROB, K_NUMBER: the range, each end included or not */
    bool lo_in, hi_in;
    int (*parse)(const char *); /* K_ENUM: -1 (or below min) if unknown */
    int min;
    const struct opt_choice *choices; /* K_CHOICE, K_STRING: ends with a NULL name */
    opt_cb cb;                        /* K_CALLBACK */
    const char *expect;  /* "--NAME: expected EXPECT, got 'VALUE'" (generated where NULL) */
    const char *help;
    /* A value from one of the closed sets (util/sets.h): its names, joined by mp_join.  The
     * help line is names(" | ") then help; "expected" is names(", ", " or ") then expect. */
    const char *(*names)(const char *sep, const char *last);
};

#define FIELD(f) .off = offsetof(struct args, f), .size = sizeof(((struct args *)0)->f)
#define SEEN(f) .seen = offsetof(struct args, f) + 1 /* + 1: 0 says none */
#define INT(l, h) .kind = K_INT, .lo = (l), .hi = (h)
#define RANGE(l, l_in, h, h_in) .dlo = (l), .lo_in = (l_in), .dhi = (h), .hi_in = (h_in)

static enum mp_status cb_precision(struct args *a, void *field, const char *s, struct mp_diag *d);
static enum mp_status cb_checkpoint(struct args *a, void *field, const char *s, struct mp_diag *d);
static enum mp_status cb_lora_targets(struct args *a, void *field, const char *s, struct mp_diag *d);
static enum mp_status cb_train_blocks(struct args *a, void *field, const char *s, struct mp_diag *d);
static enum mp_status cb_alloc_conf(struct args *a, void *field, const char *s, struct mp_diag *d);
static enum mp_status cb_torch(struct args *a, void *field, const char *s, struct mp_diag *d);
static enum mp_status cb_vllm(struct args *a, void *field, const char *s, struct mp_diag *d);
static enum mp_status cb_image_size(struct args *a, void *field, const char *s, struct mp_diag *d);

/* --precision: the table's precisions and mixed-bf16 (bf16 with fp32 master weights under
 * data parallelism, cb_precision) */
static const char *precision_names(const char *sep, const char *last)
{
    static char buf[160];
    snprintf(buf, sizeof buf, "%s%s%s", mp_precision_names(sep, sep), last ? last : sep, "mixed-bf16");
    return buf;
}
/* --optimizer: the table's names, then the Hugging Face optim names it also takes (the table's
 * aliases column) */
static const char *optimizer_names(const char *sep, const char *last)
{
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s%s%s (%s)", mp_optimizer_names(sep, sep), last ? last : sep,
             last ? "a Hugging Face optim" : "HF optim", mp_optimizer_hf_names(sep, last));
    return buf;
}
static const struct opt_choice ON_OFF[] = {{"on", 1}, {"off", 0}, {NULL, 0}};
static const struct opt_choice BACKEND[] = {{"auto", 0}, {"cuda", 0}, {"host", 0}, {NULL, 0}};

enum { C_TRAIN = C_EST | C_PLAN | C_PROBE | C_CHECK, C_TARGET = C_EST | C_PLAN | C_SUGG | C_CHECK };

static const struct opt OPTS[] = {
    {'b', "batch", "B", C_TRAIN, INT(1, MAX_BATCH), FIELD(batch), SEEN(batch_set), .expect = "a positive integer",
     .help = "micro-batch (default 1)"},
    {'s', "seq", "S", C_ALL, INT(1, MAX_SEQ), FIELD(seq), SEEN(seq_set), .expect = "a positive integer",
     .help = "sequence length (default: the model's, at most 2048 for HF configs)"},
    {0, "target-seq", "T", C_ALL, INT(1, MAX_SEQ), FIELD(target_seq), .expect = "a positive integer",
     .help = "encoder-decoders (t5): the decoder's length; --seq is the encoder's (default: = --seq)"},
    {'p', "precision", "P", C_ALL, K_CALLBACK, FIELD(precision), SEEN(precision_set), .cb = cb_precision,
     .names = precision_names, .help = " (default amp-bf16)"},
    {'o', "optimizer", "O", C_ALL, K_ENUM, FIELD(optimizer), .parse = mp_optimizer_parse,
     .names = optimizer_names, .help = " (default adamw)"},
    {'c', "checkpoint", "C", C_TRAIN | C_SUGG, K_CALLBACK, FIELD(ckpt), SEEN(ckpt_set), .cb = cb_checkpoint,
     .expect = "none, sqrt, segments:K, every:K, layers[+offload|+sac[:axolotl|:auto|:torchtitan]], layers:N[+offload|"
               "+sac[:...]], optimal or optimal-segments",
     .help = "none (default; plan: optimal; suggest: searched) | sqrt | segments:K | every:K | layers | "
             "layers:N | optimal[-segments]; +offload after layers[:N]: their inputs wait in pinned host RAM; "
             "+sac: TRL's selective checkpointing (SDPA's outputs kept, not recomputed); +sac:axolotl; "
             "+sac:auto: memplan's choice of kept ops for the target; +sac:torchtitan: torchtitan's SelectiveAC"},
    {0, "act-offload", NULL, C_EST | C_SUGG | C_CHECK, K_FLAG, FIELD(act_offload),
     .help = "TRL's activation_offloading=True (needs --checkpoint layers, --loss hf or chunked-nll): saved tensors outside "
             "the checkpointed layers, and their inputs, wait in pinned host RAM"},
    {0, "finetune", "F", C_ALL, K_ENUM, FIELD(ft.mode), .parse = mp_ft_mode_parse, .names = mp_ft_mode_names,
     .help = ": what trains (default full)"},
    {0, "lora-r", "R", C_ALL, INT(1, 65536), FIELD(ft.r), SEEN(lora_set), .help = "LoRA rank (default 16)"},
    {0, "lora-alpha", "A", C_ALL, K_NUMBER, RANGE(0, false, 1e6, false), FIELD(ft.alpha), SEEN(alpha_set),
     .help = "lora_alpha for the snippet; scaling alpha/r (default 2r)"},
    {0, "lora-dropout", "P", C_ALL, K_PROB, RANGE(0, true, 1, false), FIELD(ft.dropout), SEEN(lora_set),
     .help = "lora_dropout: > 0 keeps a mask and a copy per adapter (default 0)"},
    {0, "lora-targets", "T", C_ALL, K_CALLBACK, FIELD(ft), SEEN(lora_set), .cb = cb_lora_targets,
     .help = "all-linear | NAME,NAME,... (default: peft's for the family)"},
    {0, "quant-storage", "D", C_ALL, K_ENUM, FIELD(ft.quant.storage), SEEN(quant_storage_set),
     .parse = mp_quant_storage_parse, .names = mp_quant_storage_names,
     .help = ": qlora's bnb_4bit_quant_storage; a float dtype lets FSDP2 shard the packed weights, uint8 "
             "leaves them whole on each rank (default: bfloat16 under fsdp and zero3, else uint8)"},
    {0, "train-blocks", "LIST", C_ALL, K_CALLBACK, FIELD(ft), SEEN(blocks_set), .cb = cb_train_blocks,
     .help = "freeze: trained decoder blocks and parts, e.g. 20-31,head"},
    {0, "attention", "A", C_ALL, K_ENUM, FIELD(attention), SEEN(attention_set), .parse = mp_attn_impl_parse,
     .names = mp_attn_impl_names, .help = ": override the attention implementation (default sdpa)"},
    {0, "torch", "X.Y", C_ALL, K_CALLBACK, FIELD(torch), .cb = cb_torch,
     .expect = "a PyTorch release from 2.6 on, as MAJOR.MINOR (2.11, 2.11.0+cu130)",
     .help = "the PyTorch release (default 2.15): before 2.15 SDPA runs fp32 grouped-query attention "
             "on its math kernel (s x s kept)"},
    {0, "trainer", "T", C_EST | C_PLAN | C_SUGG | C_CHECK, K_ENUM, FIELD(trainer), .parse = mp_trainer_parse,
     .names = mp_trainer_names,
     .help = ": the step TRL runs (default sft; dpo: --batch pairs, chosen+rejected, a reference forward; "
             "kto: --batch examples, 2 or more, KL and reference forwards; kto-apo: KTO's loss_type "
             "apo_zero_unpaired, no KL term; orpo: --batch pairs, the model's own logits, no reference; grpo: "
             "--batch completions, generation first)"},
    {0, "disable-dropout", "on|off", C_EST | C_PLAN | C_SUGG | C_CHECK, K_CHOICE, FIELD(disable_dropout),
     .choices = ON_OFF, .help = "dpo, kto, kto-apo, orpo, grpo: TRL's disable_dropout, every dropout's p set to 0, "
                                "LoRA's too (default: on, grpo's off)"},
    {0, "precompute-ref", NULL, C_EST | C_PLAN | C_SUGG | C_CHECK, K_FLAG, FIELD(precompute_ref),
     .help = "dpo, kto, kto-apo: precompute_ref_log_probs=True (no reference model in the step)"},
    {0, "completion-length", "C", C_EST | C_PLAN | C_SUGG | C_CHECK, INT(1, MAX_SEQ), FIELD(completion_len),
     SEEN(completion_set), .expect = "a positive integer",
     .help = "grpo: max_completion_length, the tokens generated after each prompt; the prompt is --seq less C "
             "(default 512)"},
    {0, "num-generations", "G", C_EST | C_PLAN | C_SUGG | C_CHECK, INT(1, MAX_BATCH), FIELD(num_generations),
     SEEN(grpo_set), .expect = "a positive integer",
     .help = "grpo: completions per prompt; the generation batch must be a multiple (default 8)"},
    {0, "steps-per-generation", "K", C_EST | C_PLAN | C_SUGG | C_CHECK, INT(1, MAX_BATCH), FIELD(steps_per_gen),
     SEEN(grpo_set), .expect = "a positive integer",
     .help = "grpo: micro-batches generated at once: generation batch --batch x K (default: --grad-accum)"},
    {0, "beta", "F", C_EST | C_PLAN | C_SUGG | C_CHECK, K_NUMBER, RANGE(0, true, 1e6, false), FIELD(beta),
     SEEN(grpo_set), .help = "grpo: the KL coefficient; > 0 loads a reference model (default 0)"},
    {0, "vllm", "F|server", C_EST | C_PLAN | C_SUGG | C_CHECK, K_CALLBACK, FIELD(vllm), .cb = cb_vllm,
     SEEN(grpo_set), .expect = "a fraction above 0 and below 1, or server",
     .help = "grpo: generate with a colocated vLLM that takes F of the GPU (vllm_gpu_memory_utilization), "
             "or a vLLM server on other GPUs (default: transformers' generate)"},
    {0, "temperature", "T", C_EST | C_PLAN | C_SUGG | C_CHECK, K_NUMBER, RANGE(0, false, 1e6, false), FIELD(temperature),
     SEEN(grpo_set), .help = "grpo: generate's sampling temperature; other than 1 its scores are a vocabulary-"
                             "sized tensor of their own at each step (default 1)"},
    {0, "top-p", "P", C_EST | C_PLAN | C_SUGG | C_CHECK, K_NUMBER, RANGE(0, true, 1, true), FIELD(top_p),
     SEEN(grpo_set), .help = "grpo: nucleus sampling; below 1 each step sorts the scores, with CUDA's sort buffers "
                             "(default 1)"},
    {0, "top-k", "K", C_EST | C_PLAN | C_SUGG | C_CHECK, INT(0, UINT32_MAX), FIELD(top_k), SEEN(grpo_set),
     .expect = "a count, 0 for none", .help = "grpo: top-k sampling; above 0 a mask and masked scores at each "
                                              "step (default 0: none)"},
    {0, "min-p", "P", C_EST | C_PLAN | C_SUGG | C_CHECK, K_NUMBER, RANGE(0, true, 1, true), FIELD(min_p),
     SEEN(grpo_set), .help = "grpo: min-p sampling; probabilities, a mask and masked scores at each step "
                             "(default: none)"},
    {0, "repetition-penalty", "X", C_EST | C_PLAN | C_SUGG | C_CHECK, K_NUMBER, RANGE(0, false, 1e6, false),
     FIELD(rep_penalty), SEEN(grpo_set), .help = "grpo: generate's repetition penalty; other than 1 each step "
                                                 "pads, gathers over the ids so far and scatters the scores "
                                                 "(default 1: none)"},
    {0, "num-iterations", "N", C_EST | C_PLAN | C_SUGG | C_CHECK, INT(1, MAX_BATCH), FIELD(num_iterations),
     SEEN(grpo_set), .expect = "a positive integer",
     .help = "grpo: optimization passes over each generation batch; past the accumulation's steps the "
             "policy's old log-probs take a no-grad forward (default 1)"},
    {0, "vllm-correction", "on|off", C_EST | C_PLAN | C_SUGG | C_CHECK, K_CHOICE, FIELD(vllm_is_corr),
     SEEN(vllm_is_corr_set), .choices = ON_OFF,
     .help = "grpo --vllm: vllm_importance_sampling_correction, the policy's old log-probs by a no-grad "
             "forward (default on)"},
    {0, "ds3-gather", "on|off", C_EST | C_PLAN | C_SUGG | C_CHECK, K_CHOICE, FIELD(ds3_gather),
     SEEN(ds3_gather_set), .choices = ON_OFF,
     .help = "grpo --parallel zero3: ds3_gather_for_generation; on: every parameter gathered for generate, "
             "off: each block's fetched per forward (default on)"},
    {0, "loss", "K", C_ALL, K_ENUM, FIELD(loss), SEEN(loss_set), .parse = mp_loss_parse, .names = mp_loss_names,
     .help = ": the causal LM's loss head (default hf; cce: Axolotl's Cut Cross-Entropy, bf16 weights; "
             "torchtune: its LinearCrossEntropyLoss, no autocast; --trainer dpo|kto --loss hf: LLaMA-Factory's "
             "DPO or KTO step; docs: man memplan)"},
    {0, "label-fraction", "F", C_ALL, K_NUMBER, RANGE(0, false, 1, true), FIELD(label_fraction),
     .help = "share of label positions not -100 (prompt masking; default 1): chunked-nll and "
             "torchtune gather only those, cce keeps per-token state for them; hf and liger unaffected"},
    {0, "packing", NULL, C_TARGET, K_FLAG, FIELD(packing),
     .help = "causal LMs: each row packs several documents, no padding (SDPA: a block-diagonal mask)"},
    {0, "padding-free", NULL, C_TARGET, K_FLAG, FIELD(padding_free),
     .help = "packing, the micro-batch's rows concatenated into one row of batch x seq tokens (TRL)"},
    {0, "tokens-per-batch", "T", C_EST | C_PLAN | C_CHECK, INT(1, MAX_SEQ), FIELD(tokens_per_batch),
     .expect = "a positive integer", .help = "padding-free micro-batch of T tokens in one row (--padding-free "
                                              "--batch 1 --seq T)"},
    {0, "moe-capacity", "F", C_ALL, K_NUMBER, RANGE(1, true, 1e6, true), FIELD(moe_capacity),
     .help = "MoE routing: the busiest expert gets F x the uniform share (F >= 1; default 1, uniform)"},
    {0, "use-cache", "on|off", C_ALL, K_CHOICE, FIELD(use_cache), .choices = ON_OFF,
     .help = "HF decoders: transformers' use_cache in training (default: the config's; off under --checkpoint "
             "layers or a --trainer other than sft)"},
    {0, "head", "H", C_ALL, K_ENUM, FIELD(head), .parse = mp_head_parse, .names = mp_head_names,
     .help = ": HF configs: the task head, replacing architectures[0]'s (default: the config's)"},
    {0, "num-labels", "N", C_ALL, INT(1, 1ull << 40), FIELD(num_labels), .expect = "a positive integer",
     .help = "classes of a seq-cls or token-cls head, replacing num_labels/id2label (default: the config's)"},
    {0, "images", "N", C_ALL, INT(1, 1 << 20), FIELD(images), .expect = "a positive integer",
     .help = "Gemma 3, Mistral 3, Qwen2-VL, Qwen2.5-VL, Llama 4 and Llama 3.2 Vision configs: N images "
             "per sample through the vision tower; their tokens are part of --seq (default: text only)"},
    {0, "image-size", "HxW", C_ALL, K_CALLBACK, FIELD(image_h), .cb = cb_image_size,
     .expect = "HxW, two positive integers (pixels), e.g. 448x448",
     .help = "with --images: each image's height x width in pixels, resized as the model's processor "
             "does (Mistral 3: multiples of patch x merge up to image_size, default image_size square; "
             "Qwen2-VL, Qwen2.5-VL: smart_resize, default 448x448; Gemma 3: its image_size only; "
             "Llama 4: tiles of image_size, its processor's canvas, default one tile; Llama 3.2 Vision: "
             "refused, every image runs max_num_tiles tiles)"},
    {0, "gpu", "NAME", C_TARGET, K_STRING, FIELD(gpu),
     .help = "target GPU profile (configs/gpus/NAME.json), e.g. a100-40gb"},
    {0, "vram", "SIZE", C_PLAN | C_SUGG | C_CHECK, K_SIZE, .lo = 1, FIELD(vram),
     .expect = "a size like 24GiB, 24G or 80GB", .help = "target memory, e.g. 24GiB, 24G (GiB), 80GB (10^9)"},
    {0, "device", "N", C_PROBE | C_SUGG, INT(0, 64), FIELD(device), SEEN(device_set), .expect = "a device index",
     .help = "CUDA device index, default 0 (probe: run on it; suggest: target it)"},
    {0, "activation-budget", "SIZE", C_PLAN, K_SIZE, .lo = 1, FIELD(budget),
     .help = "activation budget for optimal plans"},
    {0, "slots", "N", C_TARGET, INT(10, 100000), FIELD(slots), .help = "memory slots of the optimal DP (default 500)"},
    {0, "margin", "PCT", C_SUGG | C_CHECK | C_PLAN, K_PERCENT, RANGE(0, true, 90, false), FIELD(margin),
     .help = "safety margin in percent of capacity (default 5)"},
    {0, "global-batch", "G", C_SUGG, INT(1, MAX_GLOBAL_BATCH), FIELD(global_batch), .expect = "a positive integer",
     .help = "global batch: micro-batch x accumulation = G exactly"},
    {0, "grad-accum", "N", C_EST | C_PLAN | C_CHECK, INT(1, MAX_BATCH), FIELD(grad_accum),
     .expect = "a positive integer",
     .help = "gradient accumulation steps: with N > 1 .grad stays resident through each micro-step (default 1)"},
    {0, "emit", "WHAT", C_SUGG, K_ENUM, FIELD(emit), .parse = mp_emit_parse, .min = MP_EMIT_NONE + 1,
     .names = mp_emit_names, .help = ": print only that snippet"},
    {0, "gpus", "N", C_ALL, INT(1, 65536), FIELD(par.gpus), SEEN(gpus_set),
     .help = "GPUs per node for data parallelism (figures are per rank)"},
    {0, "nodes", "M", C_ALL, INT(1, 65536), FIELD(par.nodes), .help = "nodes (world = N x M ranks; default 1)"},
    {0, "parallel", "S", C_ALL, K_ENUM, FIELD(par.strategy), SEEN(par_set), .parse = mp_par_strategy_parse,
     .min = MP_PAR_NONE + 1, .names = mp_par_strategy_names, .help = " (suggest: searched)"},
    {0, "ep", "N", C_EST | C_PLAN | C_CHECK | C_SUGG, INT(1, 65536), FIELD(par.ep),
     .help = "MoE expert parallelism over N ranks (transformers' DistributedConfig ep_size; needs --parallel fsdp, "
             "N dividing the world and the experts; default 1)"},
    {0, "offload", "W", C_ALL, K_ENUM, FIELD(par.offload), .parse = mp_offload_parse, .names = mp_offload_names,
     .help = ": move state to the host (ZeRO-Offload, FSDP2 CPUOffloadPolicy)"},
    {0, "ddp-bucket-view", NULL, C_ALL, K_FLAG, FIELD(par.ddp_grad_as_bucket_view),
     .help = "DDP gradient_as_bucket_view=True: .grad are views of the buckets"},
    {0, "rank", "R", C_PROBE, INT(0, 65536 * 65536ull - 1), FIELD(par.rank), .expect = "an integer from 0",
     .help = "with --parallel: the rank whose shards the step holds (default 0)"},
    {0, "offload-device", "D", C_ALL, K_ENUM, FIELD(par.offload_device), .parse = mp_offload_dev_parse,
     .names = mp_offload_dev_names, .help = " (nvme: ZeRO-Infinity, zero3 only; default cpu)"},
    {0, "max-batch", "B", C_SUGG, INT(1, MAX_BATCH), FIELD(max_batch), .expect = "a positive integer",
     .help = "largest micro-batch to consider (default 65536)"},
    {0, "steps", "N", C_PROBE, INT(1, 64), FIELD(steps), .help = "measured steps after one warm-up (default 3)"},
    {0, "backend", "B", C_PROBE | C_SUGG, K_STRING, FIELD(backend), .choices = BACKEND,
     .help = "auto | cuda | host (default auto; suggest: host probes on the CPU)"},
    {0, "capacity", "SIZE", C_PROBE | C_SUGG, K_SIZE, FIELD(capacity),
     .help = "probe memory limit (probe: host only, default none; suggest: default the target's usable less "
             "context)"},
    {0, "no-probe", NULL, C_SUGG, K_FLAG, FIELD(no_probe),
     .help = "do not confirm with probes even when a GPU is present"},
    {0, "workspace", "SIZE", C_ALL, K_SIZE, .hi = MAX_OVERHEAD_BYTES, FIELD(workspace), SEEN(workspace_set),
     .help = "one cuBLAS workspace (a training step holds two: the forward's and the backward thread's), "
             "at most 1024TiB (default 8519680 B, or the --gpu profile's where --gpu applies)"},
    {0, "context", "SIZE", C_TARGET, K_SIZE, .hi = MAX_OVERHEAD_BYTES, FIELD(context), SEEN(context_set),
     .help = "CUDA context size, at most 1024TiB (default: the GPU profile's, else 500MiB)"},
    {0, "alloc-conf", "STR", C_EST | C_PLAN | C_SUGG | C_CHECK, K_CALLBACK, FIELD(alloc), SEEN(alloc_set), .cb = cb_alloc_conf,
     .help = "the caching allocator's settings, PYTORCH_CUDA_ALLOC_CONF's syntax (default: that variable's), "
             "e.g. expandable_segments:True"},
    {0, "timeline", "FILE", C_TRAIN | C_SUGG, K_STRING, FIELD(timeline),
     .help = "also draw the step's memory over time as an SVG picture in FILE (suggest: the "
             "recommended configuration's)"},
    {0, "all-layers", NULL, C_EST, K_FLAG, FIELD(all_layers), .help = "do not fold identical repeated blocks"},
    {0, "wide", NULL, C_ALL, K_FLAG, FIELD(wide),
     .help = "text wider than 100 columns: the full block table, no wrapping"},
    {0, "json", NULL, C_ALL, K_FLAG, FIELD(json), .help = "print the report as JSON (schema 1)"},
    {0, "recipe", "FILE", C_TARGET, K_STRING, FIELD(recipe),
     .help = "a trainer's recipe (HF TrainingArguments JSON/YAML, TRL, Axolotl, LLaMA-Factory, torchtune YAML): "
             "its model and settings, with the trainer's defaults; options given here override it"},
    {0, "recipe-format", "F", C_TARGET, K_ENUM, FIELD(recipe_format), .parse = mp_recipe_format_parse,
     .names = mp_recipe_format_names, .help = ": the recipe's format (default: told by its keys)"},
    {0, "explain", NULL, C_TARGET, K_FLAG, FIELD(explain),
     .help = "with --recipe: how each key was read, and the keys memplan does not know (stderr)"},
    {0, "write-recipe", "OUT", C_SUGG, K_STRING, FIELD(write_recipe),
     .help = "with --recipe: write the recipe with the recommended micro-batch and accumulation to OUT "
             "(the rest of the file unchanged)"},
    {'h', "help", NULL, C_ALL, K_HELP, .help = "show this help"},
};
#define N_OPTS (sizeof OPTS / sizeof OPTS[0])

/* ---- the help, from the table -------------------------------------------------------------- */

/* "--name ARG", or "--name" for an option without a value. */
static const char *opt_left(const struct opt *o, char *buf, size_t len)
{
    snprintf(buf, len, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    return buf;
}

/* Usage generated from the option table: the synopsis wrapped under the command
 * name, one line per option, help text wrapped at 100 columns. */
void cli_command_help(FILE *out, const struct command *c)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        f = out;
    int ind = fprintf(f, "Usage: memplan %s ", c->name), col = ind + fprintf(f, "MODEL");
    for (size_t i = 0; i < N_OPTS; i++) {
        if (!(OPTS[i].cmds & c->bit) || OPTS[i].kind == K_HELP)
            continue;
        char left[48], item[64];
        int n = snprintf(item, sizeof item, "[%s]", opt_left(&OPTS[i], left, sizeof left));
        if (col + 1 + n > MP_TEXT_COLUMNS) {
            fprintf(f, "\n%*s", ind, "");
            col = ind;
        } else {
            fputc(' ', f);
            col++;
        }
        col += fprintf(f, "%s", item);
    }
    fprintf(f, "\n\n%s.\n\nOptions:\n", c->summary);
    for (size_t i = 0; i < N_OPTS; i++) {
        if (!(OPTS[i].cmds & c->bit))
            continue;
        char left[48];
        opt_left(&OPTS[i], left, sizeof left);
        const char *names = OPTS[i].names ? OPTS[i].names(" | ", NULL) : "";
        if (OPTS[i].short_name)
            fprintf(f, "  -%c, %-26s %s%s\n", OPTS[i].short_name, left, names, OPTS[i].help);
        else
            fprintf(f, "      %-26s %s%s\n", left, names, OPTS[i].help);
    }
    fprintf(f, "\n%sExit status: 0 success/fits, 1 does not fit, 2 usage, 3 bad input, 4 device error, 5 internal.\n"
               "See memplan(1).\n",
            c->notes);
    if (f != out) {
        fclose(f);
        mp_report_fit_text(out, buf, len, MP_TEXT_COLUMNS);
        free(buf);
    }
}

/* ---- the parsers of the kinds --------------------------------------------------------------- */

static enum mp_status cb_precision(struct args *a, void *field, const char *s, struct mp_diag *d)
{
    (void)d;
    /* mixed-bf16: the program runs in bf16 (FSDP2 param_dtype / DeepSpeed bf16), the
     * sharding engine keeps the fp32 master (parallel.h) */
    int *p = field;
    a->par.mixed_bf16 = !strcmp(s, "mixed-bf16");
    *p = a->par.mixed_bf16 ? (int)MP_PREC_BF16 : mp_precision_parse(s);
    return *p < 0 ? MP_ERR_USAGE : MP_OK;
}

/* --torch: MAJOR.MINOR, maybe .PATCH and a local part (torch.__version__: 2.11.0+cu130), stored
 * as major * 100 + minor; from 2.6, the oldest transformers 5.24 takes (dependency_versions_table.py) */
/* --vllm F|server: vllm_mode colocate at vllm_gpu_memory_utilization F, or vllm_mode server */
static enum mp_status cb_vllm(struct args *a, void *field, const char *s, struct mp_diag *d)
{
    (void)field, (void)d;
    double v = 0;
    a->vllm_server = !strcmp(s, "server");
    if (a->vllm_server) {
        a->vllm = 0;
        return MP_OK;
    }
    if (mp_parse_double(s, &v) != MP_OK || !(v > 0 && v < 1))
        return MP_ERR_USAGE;
    a->vllm = v;
    return MP_OK;
}

static enum mp_status cb_torch(struct args *a, void *field, const char *s, struct mp_diag *d)
{
    (void)a, (void)d;
    unsigned v[2] = {0, 0};
    const char *p = s;
    for (int i = 0; i < 2; i++) { /* one or two digits each */
        if (i && *p++ != '.')
            return MP_ERR_USAGE;
        int digits = 0;
        for (; *p >= '0' && *p <= '9' && digits < 3; p++, digits++)
            v[i] = v[i] * 10 + (unsigned)(*p - '0');
        if (digits == 0 || digits > 2)
            return MP_ERR_USAGE;
    }
    if ((*p && *p != '.' && *p != '+') || v[0] * 100 + v[1] < 206)
        return MP_ERR_USAGE;
    *(unsigned *)field = v[0] * 100 + v[1];
    return MP_OK;
}

/* --image-size HxW: two whole numbers of pixels, each 1 to 2^20. */
static enum mp_status cb_image_size(struct args *a, void *field, const char *s, struct mp_diag *d)
{
    (void)field, (void)d;
    uint64_t v[2] = {0, 0};
    const char *p = s;
    for (int i = 0; i < 2; i++) {
        if (i && *p != 'x' && *p != 'X')
            return MP_ERR_USAGE;
        p += i;
        int digits = 0;
        for (; *p >= '0' && *p <= '9' && digits < 8; p++, digits++)
            v[i] = v[i] * 10 + (uint64_t)(*p - '0');
        if (digits == 0 || v[i] == 0 || v[i] > (1u << 20))
            return MP_ERR_USAGE;
    }
    if (*p)
        return MP_ERR_USAGE;
    a->image_h = v[0];
    a->image_w = v[1];
    return MP_OK;
}

static enum mp_status cb_checkpoint(struct args *a, void *field, const char *s, struct mp_diag *d)
{
    (void)a;
    enum mp_status st = mp_ckpt_spec_parse(s, field);
    const struct mp_ckpt_spec *c = field;
    if (st == MP_ERR_UNSUPPORTED) /* a SAC policy memplan does not model: its row says why */
        return mp_fail(d, st, "--checkpoint %s: %s", s, mp_sac_why(c->sac));
    return st;
}

static enum mp_status cb_lora_targets(struct args *a, void *field, const char *s, struct mp_diag *d)
{
    (void)a;
    return mp_finetune_parse_targets(field, s, d);
}

static enum mp_status cb_train_blocks(struct args *a, void *field, const char *s, struct mp_diag *d)
{
    (void)a;
    return mp_finetune_parse_blocks(field, s, d);
}

static enum mp_status cb_alloc_conf(struct args *a, void *field, const char *s, struct mp_diag *d)
{
    (void)a;
    mp_alloc_conf_default(field);
    return mp_alloc_conf_parse(s, "--alloc-conf", field, d);
}

/* A whole-number field (an int, an enum or a uint64_t) of size bytes. */
static void store_int(void *field, size_t size, int64_t v)
{
    if (size == sizeof(int)) {
        int i = (int)v;
        memcpy(field, &i, sizeof i);
    } else {
        uint64_t u = (uint64_t)v;
        memcpy(field, &u, sizeof u);
    }
}

/* The choice named s, or NULL. */
static const struct opt_choice *choice_of(const struct opt_choice *c, const char *s)
{
    for (; c->name; c++)
        if (!strcmp(c->name, s))
            return c;
    return NULL;
}

/* Parses s into o's field of a.  MP_ERR_USAGE: not a value of the kind; MP_ERR_RANGE: out of
 * the row's range (or beyond 64 bits, or a double). */
static enum mp_status parse_value(const struct opt *o, struct args *a, const char *s, struct mp_diag *d)
{
    void *field = (char *)a + o->off;
    enum mp_status st = MP_OK;
    switch (o->kind) {
    case K_INT: {
        uint64_t v = 0;
        st = mp_parse_u64(s, &v);
        if (st == MP_OK && (v < o->lo || v > o->hi))
            st = MP_ERR_RANGE;
        store_int(field, o->size, (int64_t)v);
        return st;
    }
    case K_SIZE: {
        uint64_t v = 0;
        st = mp_parse_size(s, &v);
        if (st == MP_OK && v < o->lo)
            st = MP_ERR_USAGE;
        else if (st == MP_OK && o->hi && v > o->hi)
            st = MP_ERR_RANGE;
        memcpy(field, &v, sizeof v);
        return st;
    }
    case K_PERCENT:
    case K_PROB:
    case K_NUMBER: {
        double v = 0;
        if ((st = mp_parse_double(s, &v)) != MP_OK)
            return st;
        if (v < o->dlo || (v == o->dlo && !o->lo_in) || v > o->dhi || (v == o->dhi && !o->hi_in))
            return MP_ERR_RANGE;
        v /= o->kind == K_PERCENT ? 100.0 : 1.0;
        memcpy(field, &v, sizeof v);
        return MP_OK;
    }
    case K_ENUM: {
        int v = o->parse(s);
        store_int(field, o->size, v < o->min ? o->min : v);
        return v < o->min ? MP_ERR_USAGE : MP_OK;
    }
    case K_CHOICE: {
        const struct opt_choice *c = choice_of(o->choices, s);
        if (c)
            store_int(field, o->size, c->value);
        return c ? MP_OK : MP_ERR_USAGE;
    }
    case K_STRING:
        memcpy(field, &s, sizeof s);
        return o->choices && !choice_of(o->choices, s) ? MP_ERR_USAGE : MP_OK;
    case K_CALLBACK: return o->cb(a, field, s, d);
    case K_FLAG: {
        bool t = true;
        memcpy(field, &t, sizeof t);
        return MP_OK;
    }
    case K_HELP: return MP_OK;
    }
    return MP_OK;
}

/* The message of a value o refused with st, from the row.  Returns the exit status. */
static int value_error(const struct opt *o, const struct command *c, const char *s, enum mp_status st,
                       const struct mp_diag *d)
{
    char exp[1024];
    if (d->msg[0]) /* the parser said it */
        return cli_usage_error(c->name, "%s", d->msg);
    if (o->kind == K_PERCENT || o->kind == K_PROB || o->kind == K_NUMBER) {
        /* "a percentage, at least 0 and under 90", "a probability in [0, 1)", "a number from 1 to 1000000" */
        if (o->kind == K_PROB)
            snprintf(exp, sizeof exp, "a probability in %c%.15g, %.15g%c", o->lo_in ? '[' : '(', o->dlo, o->dhi,
                     o->hi_in ? ']' : ')');
        else
            snprintf(exp, sizeof exp, "%s %s %.15g %s %.15g", o->kind == K_PERCENT ? "a percentage," : "a number",
                     o->lo_in && o->hi_in ? "from" : o->lo_in ? "at least" : "above", o->dlo,
                     o->hi_in ? (o->lo_in ? "to" : "and at most") : "and under", o->dhi);
        fprintf(stderr, "memplan: error: --%s: '%s' is %s: expected %s (see 'memplan %s --help')\n", o->name, s,
                st == MP_ERR_RANGE ? "out of range" : strpbrk(s, "xX") ? "not a decimal number" : "not a number",
                exp, c->name);
        return MP_EXIT_USAGE;
    }
    if (st == MP_ERR_RANGE && o->kind == K_INT) {
        bool small = s[0] >= '0' && s[0] <= '9' && strlen(s) < 20 && strtoull(s, NULL, 10) < o->lo;
        fprintf(stderr, "memplan: error: --%s: %s is too %s: expected an integer from %llu to %llu "
                        "(see 'memplan %s --help')\n",
                o->name, s, small ? "small" : "large", (unsigned long long)o->lo, (unsigned long long)o->hi, c->name);
        return MP_EXIT_USAGE;
    }
    if (st == MP_ERR_RANGE) {
        char most[48] = "";
        if (o->kind == K_SIZE && o->hi)
            snprintf(most, sizeof most, " (at most %lluTiB)", (unsigned long long)(o->hi >> 40));
        fprintf(stderr, "memplan: error: --%s: '%s' is too large%s (see 'memplan %s --help')\n", o->name, s, most,
                c->name);
        return MP_EXIT_USAGE;
    }
    /* not a value of the kind: "expected EXPECT", the choices listed where the row has them */
    if (o->names)
        snprintf(exp, sizeof exp, "%s%s", o->names(", ", " or "), o->expect ? o->expect : "");
    else if (o->expect)
        snprintf(exp, sizeof exp, "%s", o->expect);
    else if (o->kind == K_INT)
        snprintf(exp, sizeof exp, "an integer from %llu to %llu", (unsigned long long)o->lo,
                 (unsigned long long)o->hi);
    else if (o->choices) {
        size_t n = 0, k = 0;
        while (o->choices[n].name)
            n++;
        exp[0] = 0;
        for (size_t i = 0; i < n; i++)
            k += (size_t)snprintf(exp + k, k < sizeof exp ? sizeof exp - k : 0, "%s%s",
                                  i == 0 ? "" : i + 1 == n ? " or " : ", ", o->choices[i].name);
    } else
        snprintf(exp, sizeof exp, "%s", o->kind == K_SIZE ? "a size" : "a valid value");
    char fmt[1200];
    snprintf(fmt, sizeof fmt, "--%s: expected %s, got '%%s'", o->name, exp);
    return cli_usage_error(c->name, fmt, s);
}

/* ---- parse_args -------------------------------------------------------------------------------- */

/* The defaults, before the options: those that are not 0 or NULL. */
static void args_default(const struct command *c, struct args *a)
{
    memset(a, 0, sizeof *a);
    mp_parallel_default(&a->par);
    a->batch = 1;
    a->precision = MP_PREC_AMP_BF16;
    a->optimizer = MP_OPT_ADAMW;
    a->attention = MP_ATTN_SDPA;
    a->loss = MP_LOSS_HF;
    a->label_fraction = 1.0;
    a->completion_len = 512;  /* GRPOConfig max_completion_length (trl 1.16.0 grpo_config.py) */
    a->num_generations = 8;   /* num_generations */
    a->num_iterations = 1;    /* grpo_config.py num_iterations */
    a->temperature = 1.0;     /* grpo_config.py temperature */
    a->top_p = 1.0;           /* grpo_config.py top_p, top_k, min_p (None) */
    a->min_p = -1.0;
    a->rep_penalty = 1.0;     /* grpo_config.py repetition_penalty */
    a->disable_dropout = -1;  /* the trainer's (mp_trainer_drops_dropout) */
    a->vllm_is_corr = 1;      /* grpo_config.py vllm_importance_sampling_correction */
    a->ds3_gather = 1;        /* grpo_config.py:498 ds3_gather_for_generation */
    a->use_cache = -1;
    a->head = -1;
    a->margin = 0.05;
    a->moe_capacity = 1.0;
    a->steps = 3;
    a->backend = "auto";
    a->ckpt.strategy = c->bit == C_PLAN ? MP_CKPT_OPTIMAL : MP_CKPT_NONE;
    a->recipe_format = -1;
    mp_finetune_default(&a->ft);
}

/* The rules between options, once all are read: 0 or the exit status (message printed). */
static int check_rules(const struct command *c, struct args *a)
{
    if ((a->recipe_format >= 0 || a->explain || a->write_recipe) && !a->recipe)
        return cli_usage_error(c->name, "%s", a->explain ? "--explain needs --recipe FILE"
                                              : a->write_recipe ? "--write-recipe needs --recipe FILE"
                                                                : "--recipe-format needs --recipe FILE");
    if (a->write_recipe && !a->write_recipe[0])
        return cli_usage_error(c->name, "%s", "--write-recipe: an empty file name");
    if (!strcmp(a->model, "-"))
        return cli_usage_error(c->name, "%s",
                               "MODEL '-': memplan does not read a model from stdin; pass the file's path");
    if (a->gpu && a->vram)
        return cli_usage_error(c->name, "%s", "--gpu and --vram are exclusive");
    if (a->image_h && !a->images)
        return cli_usage_error(c->name, "%s", "--image-size needs --images N");
    bool lora = a->ft.mode == MP_FT_LORA || a->ft.mode == MP_FT_QLORA;
    if ((a->lora_set || a->alpha_set) && !lora)
        return cli_usage_error(c->name, "%s", "--lora-* options need --finetune lora or qlora");
    if (a->blocks_set != (a->ft.mode == MP_FT_FREEZE))
        return cli_usage_error(c->name, "%s", a->blocks_set ? "--train-blocks needs --finetune freeze"
                                                            : "--finetune freeze needs --train-blocks, e.g. 20-31,head");
    if (!a->alpha_set)
        a->ft.alpha = 2.0 * (double)a->ft.r;
    if (c->bit == C_SUGG && a->ckpt_set && a->emit == MP_EMIT_HF && a->ckpt.strategy != MP_CKPT_NONE &&
        a->ckpt.strategy != MP_CKPT_LAYERS) {
        char spec[48];
        return cli_usage_error(c->name, "--emit hf: a Trainer runs --checkpoint none, layers or layers:N, not %s",
                               mp_ckpt_spec_str(&a->ckpt, spec, sizeof spec));
    }
    if (a->tokens_per_batch) { /* one row of T tokens: the micro-batch in tokens */
        if (a->batch_set || a->seq_set)
            return cli_usage_error(c->name, "%s", "--tokens-per-batch is the micro-batch in tokens: it excludes "
                                                  "--batch and --seq (a recipe's batch and length too)");
        a->batch = 1;
        a->batch_set = true;
        a->seq = a->tokens_per_batch;
        a->padding_free = true;
    }
    if (a->padding_free)
        a->packing = true;
    if (a->act_offload) { /* what act_offload.py measured (docs/memory-facts.md#activation-offloading) */
        if (a->ckpt.strategy != MP_CKPT_LAYERS || a->ckpt.k > 1 || a->ckpt.offload)
            return cli_usage_error(c->name, "%s", "--act-offload needs --checkpoint layers: in a layer not "
                                                  "checkpointed TRL clones each saved view that is not contiguous "
                                                  "before its copy (attention's), which memplan does not model yet");
        if (a->ckpt.sac != MP_SAC_NONE)
            return cli_usage_error(c->name, "%s", "--act-offload with layers+sac: the selective checkpoint's kept "
                                                  "outputs beside TRL's offloading are not modelled yet");
        if (a->loss != MP_LOSS_HF && a->loss != MP_LOSS_CHUNKED_NLL)
            return cli_usage_error(c->name, "--act-offload with --loss %s: which of a fused loss head's saved tensors "
                                            "TRL offloads is not modelled yet (--loss hf and chunked-nll are)",
                                   mp_loss_str((enum mp_loss)a->loss));
        if (a->trainer != MP_TRAINER_SFT)
            return cli_usage_error(c->name, "--act-offload with --trainer %s: not measured yet (--trainer sft is)",
                                   mp_trainer_str((enum mp_trainer)a->trainer));
        if (a->par.strategy != MP_PAR_NONE)
            return cli_usage_error(c->name, "%s", "--act-offload with --parallel: not modelled yet (one GPU is)");
        if (a->head >= 0 && a->head != MP_HEAD_CAUSAL_LM)
            return cli_usage_error(c->name, "%s", "--act-offload needs a causal LM head (TRL keeps only an lm_head's "
                                                  "saved tensors on the device)");
    }
    const char *unmodelled = mp_trainer_unmodelled((enum mp_trainer)a->trainer);
    if (unmodelled) {
        char msg[160];
        snprintf(msg, sizeof msg, "--trainer %s: %s (TRL 1.16.0)", mp_trainer_str((enum mp_trainer)a->trainer),
                 unmodelled);
        return cli_usage_error(c->name, "%s", msg);
    }
    /* the trainers with a reference model (DPO, KTO): their steps as TRL runs them */
    enum mp_trainer tr = (enum mp_trainer)a->trainer;
    bool pref = mp_trainer_ref_fwds(tr) > 0;
    const char *tn = mp_trainer_str(tr);
    if (pref && a->packing) /* (TRL's DPOConfig padding_free: not planned) */
        return cli_usage_error(c->name, "--trainer %s with --packing/--padding-free/--tokens-per-batch: packed "
                                        "preference examples are not modelled yet", tn);
    bool grpo = tr == MP_TRAINER_GRPO;
    if (a->precompute_ref && (!pref || grpo))
        return cli_usage_error(c->name, "%s", "--precompute-ref needs --trainer dpo, kto or kto-apo");
    if ((a->grpo_set || a->completion_set || a->vllm_is_corr_set || a->ds3_gather_set) && !grpo)
        return cli_usage_error(c->name, "%s", "--completion-length, --num-generations, --steps-per-generation, "
                                              "--beta, --vllm, --temperature, --top-p, --top-k, --min-p, --repetition-penalty, --num-iterations, "
                                              "--vllm-correction and --ds3-gather need "
                                              "--trainer grpo");
    if (grpo && a->rec && a->rec->format == MP_RF_TRL && !a->seq_set) {
        fprintf(stderr, "memplan: error: %s: GRPOConfig has no length of its own (the prompts are the dataset's): "
                "give --seq, the prompt's tokens + max_completion_length\n", a->rec->path);
        return MP_EXIT_USAGE;
    }
    if (a->disable_dropout >= 0 && tr == MP_TRAINER_SFT)
        return cli_usage_error(c->name, "%s", "--disable-dropout needs --trainer dpo, kto, kto-apo, orpo or grpo "
                                              "(SFTConfig has no disable_dropout)");
    if (tr == MP_TRAINER_ORPO) { /* trl 1.16 experimental/orpo: the model's logits, its own loss, padded pairs */
        if (a->loss != MP_LOSS_HF)
            return cli_usage_error(c->name, "--trainer orpo: --loss %s: TRL's ORPOTrainer computes its loss on the "
                                            "model's own logits (--loss hf)", mp_loss_str((enum mp_loss)a->loss));
        if (a->packing)
            return cli_usage_error(c->name, "%s", "--trainer orpo with --packing/--padding-free/--tokens-per-batch: "
                                                  "ORPOTrainer pads chosen and rejected to the batch's longest");
        if (a->emit == MP_EMIT_TORCH)
            return cli_usage_error(c->name, "%s", "--emit torch with --trainer orpo: the torch loop is an SFT step; "
                                                  "--emit hf writes the ORPOConfig");
    }
    if (grpo && a->vllm_is_corr_set && !(a->vllm > 0 || a->vllm_server))
        return cli_usage_error(c->name, "%s", "--vllm-correction needs --vllm F or --vllm server (it corrects vLLM's "
                                              "sampling)");
    if (grpo && a->num_generations < 2) /* grpo_config.py:1137-1141 raises */
        return cli_usage_error(c->name, "%s", "--trainer grpo --num-generations 1: GRPO needs 2 or more completions "
                                              "a prompt (its advantages compare them)");
    if (pref && !a->loss_set && a->loss == MP_LOSS_HF)
        a->loss = MP_LOSS_CHUNKED_NLL; /* trl dpo_trainer.py:959-962, kto_trainer.py:966-972: policy and reference */
    char why[256];
    char trl[16];
    /* --trainer dpo|kto --loss hf: LLaMA-Factory 0.9.5's CustomDPOTrainer / CustomKTOTrainer, the
     * model's logits in fp32 and its get_batch_logps (lower_embed_head.c lower_lf_dpo_loss) */
    bool lf_dpo = mp_trainer_lf(tr, (enum mp_loss)a->loss);
    char tcfg[16];
    mp_trainer_trl_name(tr, tcfg, sizeof tcfg);
    if (lf_dpo && a->emit != MP_EMIT_NONE && a->emit != MP_EMIT_DEEPSPEED && a->emit != MP_EMIT_ACCELERATE) {
        snprintf(why, sizeof why, "--emit %s with --trainer %s --loss hf: LLaMA-Factory's step has no emitter "
                 "(--emit hf writes TRL's %sConfig, whose head is fused)", mp_emit_str((enum mp_emit)a->emit), tn,
                 tcfg);
        return cli_usage_error(c->name, "%s", why);
    }
    if (lf_dpo && a->precompute_ref) {
        snprintf(why, sizeof why, "--precompute-ref with --trainer %s --loss hf: LLaMA-Factory's Custom%sTrainer "
                 "computes the reference's log-probs every step (precompute_ref_log_probs False, train/%s/"
                 "trainer.py:%s)", tn, tcfg, tn, tr == MP_TRAINER_KTO ? "68" : "70");
        return cli_usage_error(c->name, "%s", why);
    }
    if (pref && a->loss != MP_LOSS_CHUNKED_NLL && !lf_dpo) {
        snprintf(why, sizeof why, "--trainer %s: --loss %s: TRL's %sTrainer computes its log-probs through its "
                 "fused LM head (--loss chunked-nll)", tn, mp_loss_str((enum mp_loss)a->loss),
                 mp_trainer_trl_name(tr, trl, sizeof trl));
        return cli_usage_error(c->name, "%s", why);
    }
    if (pref && a->emit == MP_EMIT_TORCH) {
        snprintf(why, sizeof why, "--emit torch with --trainer %s: the torch loop is an SFT step; --emit hf writes "
                 "the %s", tn, mp_trainer_config(tr));
        return cli_usage_error(c->name, "%s", why);
    }
    /* Selective checkpointing (docs/checkpointing.md#sac; the attention a model runs: setup.c):
     * only SFTTrainer reads the
     * "selective" key (trl 1.16 trainer/sft_trainer.py:1085-1096), and with a PEFT model its
     * Trainer passes the key on to torch's checkpoint, which raises (bench/accuracy/sac_step.py
     * trl-peft); DeepSpeed's and accelerate's checkpointing have no context_fn */
    if (a->ckpt.sac != MP_SAC_NONE) {
        const char *no = NULL;
        if (a->emit == MP_EMIT_DEEPSPEED || a->emit == MP_EMIT_ACCELERATE)
            no = "its checkpointing takes no selective policy; --emit torch writes the context_fn";
        else if (a->emit == MP_EMIT_HF && a->ckpt.sac != MP_SAC_TRL)
            no = "--emit hf: a Trainer's config takes TRL's policy only (\"selective\"); --emit torch writes the "
                 "context_fn";
        else if (a->emit == MP_EMIT_HF && tr != MP_TRAINER_SFT)
            no = "--emit hf: only TRL's SFTTrainer reads gradient_checkpointing_kwargs' \"selective\"";
        else if (a->emit == MP_EMIT_HF && (a->ft.mode == MP_FT_LORA || a->ft.mode == MP_FT_QLORA))
            no = "--emit hf: TRL 1.16's SFTTrainer with a PEFT model passes \"selective\" on to torch's "
                 "checkpoint, which raises; --emit torch writes the context_fn";
        else if (a->emit == MP_EMIT_HF && a->loss != MP_LOSS_CHUNKED_NLL)
            no = "--emit hf: \"selective\" is TRL's SFTConfig key: add --loss chunked-nll (SFTTrainer's loss)";
        char spec[48];
        bool other = a->emit == MP_EMIT_DEEPSPEED || a->emit == MP_EMIT_ACCELERATE;
        if (no) {
            snprintf(why, sizeof why, "--checkpoint %s%s%s: %s", mp_ckpt_spec_str(&a->ckpt, spec, sizeof spec),
                     other ? " with --emit " : "", other ? mp_emit_str(a->emit) : "", no);
            return cli_usage_error(c->name, "%s", why);
        }
    }
    /* DDP: TRL prepares the reference with accelerate's prepare_model(evaluation_mode=True), which
     * wraps nothing (accelerator.py prepare_model): a whole frozen copy on each rank, as on one GPU
     * (trl dpo_trainer.py:984-990, kto_trainer.py, grpo_trainer.py).  ZeRO-1/2 (DPO, KTO): trl
     * models/utils.py prepare_deepspeed gives the copy a stage-0 engine (:285-287), whole on each
     * rank, cast to bf16 under DeepSpeed's bf16 as the policy is; ZeRO-3 keeps it a stage-3 engine
     * (:264-274): partitioned, fetched block by block for its forward (mp_par_z3_ref_bytes).
     * FSDP2 (DPO, KTO): the copy is one fully_shard unit (prepare_fsdp), a PEFT reference the
     * policy's own units.  GRPO (generate.c): under ZeRO-3 its parameters gathered whole for generate
     * (ds3_gather_for_generation) or fetched block by block, under FSDP2 each unit by each forward */
    /* LLaMA-Factory's DPO and KTO prepare their reference copy themselves (train/dpo/trainer.py:94-109,
     * train/kto/trainer.py:96-111): under
     * DeepSpeed TRL 0.24's prepare_deepspeed, under FSDP2 accelerate's fsdp2_prepare_model (the
     * policy's wrap policy, not one unit), under DDP prepare_model(evaluation_mode=True) as TRL */
    bool lf_sharded = a->par.strategy != MP_PAR_NONE && a->par.strategy != MP_PAR_DDP;
    if (lf_dpo && lf_sharded) {
        snprintf(why, sizeof why, "--trainer %s --loss hf with --parallel %s: LLaMA-Factory's %s under ZeRO and "
                 "FSDP2 (its own reference preparation) is not modelled yet (--parallel ddp is)", tn,
                 mp_par_strategy_str(a->par.strategy), tcfg);
        return cli_usage_error(c->name, "%s", why);
    }
    const char *gw = grpo ? mp_par_grpo_unmodelled(a->par.strategy, a->ft.mode, a->par.offload,
                                                   a->vllm > 0 || a->vllm_server) : NULL;
    if (gw) { /* (generate.c models HF generate on full or LoRA weights, on the GPU) */
        snprintf(why, sizeof why, "--trainer grpo with --parallel %s: %s is not modelled yet (ddp, zero1, zero2 are)",
                 mp_par_strategy_str(a->par.strategy), gw);
        return cli_usage_error(c->name, "%s", why);
    }
    if (pref && !mp_trainer_par_modelled(tr, (enum mp_loss)a->loss, (enum mp_par_strategy)a->par.strategy)) {
        /* (trl 1.16 models/utils.py unwrap_model_for_generation: ZeRO-3's whole parameters gathered
         * unless ds3_gather_for_generation is false; FSDP2's summon_full_params, grpo_trainer.py:1868) */
        snprintf(why, sizeof why, "--trainer %s with --parallel %s: generation from a sharded policy (TRL gathers "
                 "its whole parameters for generate) is not modelled yet (--parallel ddp is)", tn,
                 mp_par_strategy_str(a->par.strategy));
        return cli_usage_error(c->name, "%s", why);
    }
    uint64_t least = mp_trainer_min_batch(tr, (enum mp_loss)a->loss);
    if (a->batch_set && a->batch < least) { /* kto_trainer.py:844-847 raises */
        const struct mp_recipe_setting *rb = a->rec ? &a->rec->s[MP_RS_BATCH] : NULL;
        bool keyed = rb && rb->set && rb->line && rb->src != MP_RSRC_COMMAND_LINE; /* the recipe's key decided it */
        char where[1200];
        if (keyed)
            snprintf(where, sizeof where, "%s:%u: %s: %llu", a->rec->path, rb->line, rb->key,
                     (unsigned long long)a->batch);
        else
            snprintf(where, sizeof where, "--trainer %s --batch %llu", tn, (unsigned long long)a->batch);
        snprintf(why, sizeof why, "%s: TRL's KTOTrainer needs %llu or more examples a device (its KL term pairs each "
                 "example with another's completion)", where, (unsigned long long)least);
        if (keyed) {
            fprintf(stderr, "memplan: error: %s\n", why);
            return MP_EXIT_INPUT;
        }
        return cli_usage_error(c->name, "%s", why);
    }
    if (!a->batch_set && a->batch < least)
        a->batch = least;
    if ((a->max_batch && a->max_batch < least) || (a->global_batch && a->global_batch < least)) {
        snprintf(why, sizeof why, "--trainer %s with --%s %llu: TRL's KTOTrainer needs %llu or more examples a device",
                 tn, a->max_batch && a->max_batch < least ? "max-batch" : "global-batch",
                 (unsigned long long)(a->max_batch && a->max_batch < least ? a->max_batch : a->global_batch),
                 (unsigned long long)least);
        return cli_usage_error(c->name, "%s", why);
    }
    if (a->par.ep > 1 && a->par.strategy != MP_PAR_FSDP) {
        snprintf(why, sizeof why, "--ep %llu needs --parallel fsdp (transformers' expert parallelism shards the "
                 "rest with FSDP2, its layers resharded after forward)", (unsigned long long)a->par.ep);
        return cli_usage_error(c->name, "%s", why);
    }
    if (a->par.ep > 1 && a->emit != MP_EMIT_NONE && a->emit != MP_EMIT_HF) {
        snprintf(why, sizeof why, "--ep with --emit %s: transformers shards the model as it loads "
                 "(DistributedConfig): --emit hf writes that", mp_emit_str(a->emit));
        return cli_usage_error(c->name, "%s", why);
    }
    if (a->par.ep > 1 && (a->ft.mode != MP_FT_FULL || a->trainer != MP_TRAINER_SFT)) {
        snprintf(why, sizeof why, "--ep with %s%s: not modelled yet (a full fine-tune with --trainer sft is)",
                 a->ft.mode != MP_FT_FULL ? "--finetune " : "--trainer ",
                 a->ft.mode != MP_FT_FULL ? mp_ft_mode_str(a->ft.mode) : mp_trainer_str((enum mp_trainer)a->trainer));
        return cli_usage_error(c->name, "%s", why);
    }
    if (a->par.rank && a->par.strategy == MP_PAR_NONE)
        return cli_usage_error(c->name, "%s", "--rank needs --gpus N --parallel S");
    const char *head_why = mp_par_fused_head_unmodelled(a->par.strategy, a->ft.mode, (enum mp_loss)a->loss);
    if (head_why) {
        char what[48];
        if (pref)
            snprintf(what, sizeof what, "--trainer %s", tn);
        else
            snprintf(what, sizeof what, "--loss %s", mp_loss_str((enum mp_loss)a->loss));
        snprintf(why, sizeof why, "%s with --finetune %s under --parallel %s: %s: not modelled yet (%s)", what,
                 mp_ft_mode_str(a->ft.mode), mp_par_strategy_str(a->par.strategy), head_why,
                 pref ? "a full fine-tune is, and --parallel ddp"
                 : a->loss == MP_LOSS_TORCHTUNE ? "one GPU is" : "--loss hf is");
        return cli_usage_error(c->name, "%s", why);
    }
    if (a->quant_storage_set && a->ft.mode != MP_FT_QLORA)
        return cli_usage_error(c->name, "%s", "--quant-storage needs --finetune qlora (a quantized checkpoint's "
                                              "quantization_config sets its own)");
    /* FSDP2's bf16 policy casts every floating parameter: fp16/fp32 storage would be converted,
     * the packed 4-bit payload destroyed */
    if (a->quant_storage_set && a->par.mixed_bf16 && (a->ft.quant.storage == MP_DT_F16 || a->ft.quant.storage == MP_DT_F32))
        return cli_usage_error(c->name, "--quant-storage %s with --precision mixed-bf16: the bf16 policy would cast "
                               "the packed 4-bit weights (use bfloat16)", mp_quant_storage_str(a->ft.quant.storage));
    /* DeepSpeed's bf16 casts every floating parameter to bf16 (engine.py _cast_module_mixed_precision) */
    if (a->quant_storage_set && a->par.strategy == MP_PAR_ZERO3 && a->precision == MP_PREC_BF16 &&
        (a->ft.quant.storage == MP_DT_F16 || a->ft.quant.storage == MP_DT_F32))
        return cli_usage_error(c->name, "--quant-storage %s with --parallel zero3 --precision bf16: DeepSpeed's bf16 "
                               "would cast the packed 4-bit weights (use bfloat16)",
                               mp_quant_storage_str(a->ft.quant.storage));
    /* a strategy whose plan does not model a frozen base yet: refused, not ignored (suggest
     * searches only the modelled ones) */
    if (a->par.strategy != MP_PAR_NONE && !mp_par_finetune_modelled(a->par.strategy, a->ft.mode, MP_OPT_ADAMW)) {
        snprintf(why, sizeof why, "--finetune %s with --parallel %s: not modelled yet (modelled: %s)",
                 mp_ft_mode_str(a->ft.mode), mp_par_strategy_str(a->par.strategy), mp_par_finetune_names());
        return cli_usage_error(c->name, "%s", why);
    }
    /* Muon (torch.optim.Muon): Newton-Schulz on whole matrices, no HF optim */
    if (a->optimizer == MP_OPT_MUON && a->par.strategy != MP_PAR_NONE && a->par.strategy != MP_PAR_DDP)
        return cli_usage_error(c->name, "--optimizer muon with --parallel %s: not modelled (torch.optim.Muon "
                               "orthogonalizes whole matrices; modelled: ddp)", mp_par_strategy_str(a->par.strategy));
    if (a->optimizer == MP_OPT_MUON && a->emit != MP_EMIT_NONE && a->emit != MP_EMIT_TORCH)
        return cli_usage_error(c->name, "--optimizer muon with --emit %s: HF's Trainer, DeepSpeed and accelerate's "
                               "configs have no Muon (--emit torch builds it)", mp_emit_str(a->emit));
    if (c->bit == C_SUGG && a->emit == MP_EMIT_DEEPSPEED && a->precision == MP_PREC_BF16_AMP)
        return cli_usage_error(c->name, "%s", "--emit deepspeed --precision bf16-amp: DeepSpeed's bf16 keeps an fp32 "
                                              "master (mixed-bf16); bf16 weights under its torch_autocast are not "
                                              "modelled");
    /* bf16 weights under autocast, gathered, sharded or all-reduced: not modelled (FSDP2's and
     * DeepSpeed's bf16 policies are mixed-bf16; DDP's buckets follow the parameters) */
    if (a->precision == MP_PREC_BF16_AMP && (a->par.gpus * a->par.nodes > 1 || a->par.strategy != MP_PAR_NONE))
        return cli_usage_error(c->name, "%s", "--precision bf16-amp with --gpus/--nodes/--parallel: data-parallel "
                                              "bf16-amp is not modelled; use amp-bf16 or mixed-bf16");
    if (c->bit != C_SUGG || a->par_set) { /* suggest searches the strategy unless given */
        struct mp_diag pd = {{0}};
        if (mp_par_validate(&a->par, &pd) != MP_OK)
            return cli_usage_error(c->name, "%s", pd.msg);
    }
    return 0;
}

/* getopt_long's tables from the option table: a long option's val is its short name, else
 * 1000 + its row. */
static void getopt_tables(struct option *lo, char *shortopts)
{
    size_t k = 0;
    shortopts[k++] = ':'; /* ':' first: a missing value is reported as such */
    for (size_t i = 0; i < N_OPTS; i++) {
        int val = OPTS[i].short_name ? OPTS[i].short_name : 1000 + (int)i;
        lo[i] = (struct option){OPTS[i].name, OPTS[i].arg ? required_argument : no_argument, NULL, val};
        if (OPTS[i].short_name) {
            shortopts[k++] = OPTS[i].short_name;
            if (OPTS[i].arg)
                shortopts[k++] = ':';
        }
    }
    shortopts[k] = 0;
    memset(&lo[N_OPTS], 0, sizeof lo[N_OPTS]);
}

/* The row of what getopt_long returned: 1000 + the row, or a short name. */
static const struct opt *opt_of(int ch)
{
    if (ch >= 1000 && ch < 1000 + (int)N_OPTS)
        return &OPTS[ch - 1000];
    for (size_t i = 0; i < N_OPTS; i++)
        if (OPTS[i].short_name && OPTS[i].short_name == ch)
            return &OPTS[i];
    return NULL;
}

/* ---- --recipe --------------------------------------------------------------------------------- */

static const struct opt *opt_named(const char *name)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (!strcmp(OPTS[i].name, name))
            return &OPTS[i];
    return NULL;
}

/* One setting of the recipe through its option's row, as if typed: 0, or exit 3 (message printed). */
static int recipe_setting(const struct command *c, struct args *a, const bool *given, enum mp_recipe_setting_id id)
{
    struct mp_recipe_setting *s = &a->rec->s[id];
    if (!s->set || !mp_recipe_setting_wired(id))
        return 0;
    if (id == MP_RS_MODEL) {
        if (a->model)
            s->src = MP_RSRC_COMMAND_LINE;
        else
            a->model = s->value;
        return 0;
    }
    bool lora = a->ft.mode == MP_FT_LORA || a->ft.mode == MP_FT_QLORA;
    const struct opt *o = opt_named(mp_recipe_setting_option(id));
    if (!o)
        MP_BUG("recipe setting %s names no option", mp_recipe_setting_option(id));
    if (given[o - OPTS]) {
        s->src = MP_RSRC_COMMAND_LINE;
        return 0;
    }
    if (id == MP_RS_PRECISION && a->rec->dtype_auto)
        return 0; /* the checkpoint's dtype: apply_recipe settles it once the model is known */
    if (id == MP_RS_STEPS_PER_GENERATION && s->line && !strcmp(s->key, "generation_batch_size")) {
        const struct opt *bo = opt_named("batch");
        if (c->bit == C_SUGG || (bo && given[bo - OPTS])) { /* (the steps are the file's batch's) */
            fprintf(stderr, "memplan: error: %s:%u: generation_batch_size: fixes the generation batch while %s: "
                    "give steps_per_generation instead\n", a->rec->path, s->line,
                    c->bit == C_SUGG ? "suggest searches the micro-batch" : "--batch changes the micro-batch");
            return MP_EXIT_INPUT;
        }
    }
    if (id == MP_RS_ACT_OFFLOAD && !(o->cmds & c->bit)) { /* (it changes memory: never ignored) */
        fprintf(stderr, "memplan: error: %s:%u: %s: %s: %s does not plan activation offloading yet (estimate and "
                "check do)\n", a->rec->path, s->line, s->key, s->value, c->name);
        return MP_EXIT_USAGE;
    }
    if (!(o->cmds & c->bit) || (id >= MP_RS_LORA_R && id <= MP_RS_LORA_TARGETS && !lora) ||
        (id == MP_RS_CHECKPOINT && c->bit == C_PLAN)) {
        /* suggest searches the micro-batch, plan the checkpoints; no adapters: no LoRA options */
        s->src = MP_RSRC_UNUSED;
        return 0;
    }
    if (o->seen)
        *((bool *)((char *)a + o->seen - 1)) = true;
    if (id == MP_RS_USE_CACHE)
        a->use_cache_recipe = true;
    struct mp_diag d = {{0}};
    enum mp_status st = parse_value(o, a, s->value, &d);
    if (st == MP_OK)
        return 0;
    if (!d.msg[0] && o->kind == K_INT)
        snprintf(d.msg, sizeof d.msg, "expected an integer from %llu to %llu", (unsigned long long)o->lo,
                 (unsigned long long)o->hi);
    else if (!d.msg[0] && o->names)
        snprintf(d.msg, sizeof d.msg, "expected %s", o->names(", ", " or "));
    char line[24] = "";
    if (s->line)
        snprintf(line, sizeof line, ":%u", s->line);
    fprintf(stderr, "memplan: error: %s%s: %s: '%s' is not a value memplan takes for --%s%s%s\n", a->rec->path, line,
            s->key, s->value, o->name, d.msg[0] ? ": " : "", d.msg);
    return MP_EXIT_INPUT;
}

/* --explain: how the recipe's keys were read, the settings they made, the keys not known. */
static void explain_recipe(const struct mp_recipe *rec, bool ok)
{
    fprintf(stderr, "memplan: %s: %s, %s\n", rec->path, rec->trainer ? rec->trainer : "?", rec->how);
    fputs(rec->explain, stderr);
    for (int i = 0; ok && i < MP_RS_N; i++) {
        const struct mp_recipe_setting *s = &rec->s[i];
        bool dflt = s->src == MP_RSRC_DEFAULT, key = strcmp(s->key, "(default)") != 0;
        if (s->set)
            fprintf(stderr, "-> %s %s (%s%s%s)\n", mp_recipe_setting_option((enum mp_recipe_setting_id)i), s->value,
                    dflt ? "the trainer's default" : "", dflt && key ? " for " : "", key ? s->key : "");
    }
    fprintf(stderr, "memplan: %s: %zu key%s with no memory effect (accepted)\n", rec->path, rec->n_nomem,
            rec->n_nomem == 1 ? "" : "s");
    if (rec->n_unknown)
        fprintf(stderr, "memplan: %s: %zu key%s memplan does not know (accepted, not read): %s\n", rec->path,
                rec->n_unknown, rec->n_unknown == 1 ? "" : "s", rec->unknown);
}

/* --recipe FILE: read it, then each of its settings where the command line does not give it. */
static int apply_recipe(const struct command *c, struct args *a, const bool *given)
{
    static struct mp_recipe rec;
    struct mp_diag d = {{0}};
    enum mp_status st = mp_recipe_read_as(a->recipe, a->recipe_format, (enum mp_trainer)a->trainer, &rec, &d);
    a->rec = &rec;
    if (st != MP_OK) {
        if (a->explain && rec.trainer)
            explain_recipe(&rec, false);
        fprintf(stderr, "memplan: error: %s\n", d.msg);
        return st == MP_ERR_IO || st == MP_ERR_JSON || st == MP_ERR_MODEL ? MP_EXIT_INPUT : MP_EXIT_INTERNAL;
    }
    for (int id = 0; id < MP_RS_N; id++) {
        int rc = recipe_setting(c, a, given, (enum mp_recipe_setting_id)id);
        if (rc)
            return rc;
    }
    const struct mp_recipe_setting *ls = &rec.s[MP_RS_LOSS];
    if (ls->set && ls->src != MP_RSRC_COMMAND_LINE && a->loss == MP_LOSS_LIGER && rec.liger_where[0])
        a->liger = (struct mp_liger){.set = true, .on = rec.liger_on, .off = rec.liger_off,
                                     .unset_off = rec.liger_unset_off, .where = rec.liger_where};
    if (!a->model) {
        fprintf(stderr, "memplan: error: %s: the recipe names no model (%s): give MODEL\n", rec.path,
                rec.format == MP_RF_TORCHTUNE ? "checkpointer.checkpoint_dir" : "model_name_or_path");
        return MP_EXIT_USAGE;
    }
    struct mp_recipe_setting *p = &rec.s[MP_RS_PRECISION];
    if (rec.dtype_auto && p->src != MP_RSRC_COMMAND_LINE && p->src != MP_RSRC_UNUSED) {
        char file[4096];
        int rc = cli_resolve_model(a->model, file, sizeof file);
        if (rc)
            return rc;
        if ((st = mp_recipe_resolve_dtype(&rec, file, &d)) != MP_OK) {
            fprintf(stderr, "memplan: error: %s\n", d.msg);
            return MP_EXIT_INPUT;
        }
        const struct opt *o = opt_named("precision");
        if (parse_value(o, a, p->value, &d) != MP_OK)
            MP_BUG("recipe precision %s", p->value);
        a->precision_set = true;
    }
    if (a->explain)
        explain_recipe(&rec, true);
    return 0;
}

int cli_parse_args(const struct command *c, int argc, char **argv, struct args *a)
{
    args_default(c, a);
    struct option lo[N_OPTS + 1];
    char shortopts[2 * N_OPTS + 2];
    getopt_tables(lo, shortopts);
    optind = 1;
    opterr = 0;
    int ch, idx;
    bool given[N_OPTS] = {0};
    while ((ch = getopt_long(argc, argv, shortopts, lo, &idx)) != -1) {
        if (ch == '?' || ch == ':') {
            char bad[64]; /* a missing value: the option as typed (--seq, not -s) */
            if (optopt && optopt < 128 && (ch == '?' || argv[optind - 1][1] != '-'))
                snprintf(bad, sizeof bad, "-%c", optopt);
            else
                snprintf(bad, sizeof bad, "%s", argv[optind - 1]);
            return cli_usage_error(c->name, ch == ':' ? "option '%s' needs a value" : "unknown option '%s'", bad);
        }
        const struct opt *o = opt_of(ch);
        if (!o)
            return cli_usage_error(c->name, "unexpected option '%s'", argv[optind - 1]);
        if (!(o->cmds & c->bit)) {
            fprintf(stderr, "memplan: error: option '--%s' does not apply to '%s' (see 'memplan %s --help')\n",
                    o->name, c->name, c->name);
            return MP_EXIT_USAGE;
        }
        if (o->kind == K_HELP) {
            cli_command_help(stdout, c);
            return -1;
        }
        if (o->seen)
            *((bool *)((char *)a + o->seen - 1)) = true;
        given[o - OPTS] = true;
        struct mp_diag d = {{0}};
        enum mp_status st = parse_value(o, a, o->arg ? optarg : NULL, &d);
        if (st != MP_OK)
            return value_error(o, c, optarg, st, &d);
    }
    if (optind >= argc && !a->recipe)
        return cli_usage_error(c->name, "%s: missing MODEL (a memplan JSON model or an HF config.json)", c->name);
    if (optind + 1 < argc)
        return cli_usage_error(c->name, "unexpected argument '%s'", argv[optind + 1]);
    a->model = optind < argc ? argv[optind] : NULL;
    if (a->recipe) {
        int rc = apply_recipe(c, a, given);
        if (rc)
            return rc;
    }
    return check_rules(c, a);
}
