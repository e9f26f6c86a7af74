/* setup.c — what every command shares: the exits and their one-line messages, the model and
 * target every command starts from (cli_setup: the rules between the options and the model),
 * the report's context and the job of the estimator.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"

const char *cli_argv0 = "memplan";

/* ---- messages and exits ------------------------------------------------------------------ */

static int exit_for(enum mp_status st)
{
    switch (st) {
    case MP_OK: return MP_EXIT_OK;
    case MP_ERR_USAGE: return MP_EXIT_USAGE;
    case MP_ERR_IO:
    case MP_ERR_JSON:
    case MP_ERR_MODEL:
    case MP_ERR_RANGE: return MP_EXIT_INPUT;
    case MP_ERR_DEVICE:
    case MP_ERR_OOM:
    case MP_ERR_UNSUPPORTED: return MP_EXIT_DEVICE;
    case MP_ERR_INFEASIBLE: return MP_EXIT_NOFIT;
    default: return MP_EXIT_INTERNAL;
    }
}

int cli_fail(enum mp_status st, const struct mp_diag *d)
{
    mp_progress_done();
    fprintf(stderr, "memplan: error: %s\n", d->msg[0] ? d->msg : mp_status_str(st));
    return exit_for(st);
}

int cli_usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "memplan: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see 'memplan %s%s--help')\n", cmd ? cmd : "", cmd ? " " : "");
    return MP_EXIT_USAGE;
}

int cli_finish(int code)
{
    mp_progress_done();
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "memplan: error: writing output failed: %s\n", strerror(errno ? errno : EIO));
        return MP_EXIT_INTERNAL;
    }
    return code;
}

/* The end of every command, after its one cleanup: a library failure (st), else an exit
 * status whose message is already printed (rc), else the command's own status (code) once
 * stdout is written.  A size that overflows 64 bits is the model's (at this batch): a message
 * that does not name the model file (the checkpoint simulator's) is given its name. */
int cli_leave(enum mp_status st, struct mp_diag *d, int rc, int code, const char *model)
{
    size_t n = strlen(model);
    if (st == MP_ERR_RANGE && !(strncmp(d->msg, model, n) == 0 && d->msg[n] == ':')) {
        char msg[sizeof d->msg];
        snprintf(msg, sizeof msg, "%s", d->msg[0] ? d->msg : mp_status_str(st));
        mp_fail(d, st, "%s: %s", model, msg);
    }
    if (st != MP_OK)
        return cli_fail(st, d);
    if (rc)
        return rc;
    return cli_finish(code);
}

/* estimate and check: a long model is evaluated through folds (fold.h), as plan and suggest do,
 * where the whole model's replay took seconds and gigabytes for 100,000 blocks (same figures);
 * a timeline draws the whole program's events, so it still replays the whole model. */
void cli_fit_program_for_report(const struct args *a, const struct setup *s, struct mp_job *j)
{
    bool folds = s->model.n_blocks >= MP_FIT_FOLD_BLOCKS && !a->timeline;
    j->keep_program = !folds;
    j->keep_built = folds;
}

/* The program the report reads (counts, options): the fit's whole program where it built one,
 * else that of the model's fold (mp_fold_report_program), into f->prog. */
enum mp_status cli_fit_report_program(const struct mp_job *j, struct mp_fit *f, struct mp_diag *d)
{
    if (j->keep_program || f->prog.blocks)
        return MP_OK;
    struct mp_build_opts bo;
    mp_fit_build_opts(j, &bo);
    return mp_fold_report_program(j->model, &bo, &f->prog, d);
}

static char warnings[512];

void cli_warn(const char *fmt, ...)
{
    size_t l = strlen(warnings);
    va_list ap;
    va_start(ap, fmt);
    if (l + 1 < sizeof warnings) {
        int n = vsnprintf(warnings + l, sizeof warnings - l - 1, fmt, ap);
        if (n > 0) {
            l = mp_min_u64(l + (size_t)n, sizeof warnings - 2);
            warnings[l] = '\n';
            warnings[l + 1] = 0;
        }
    }
    va_end(ap);
}

int cli_flush_warnings(int exit_status)
{
    if (exit_status <= 1)
        for (const char *w = warnings; *w;) {
            size_t n = strcspn(w, "\n");
            fprintf(stderr, "memplan: warning: %.*s\n", (int)n, w);
            w += n + (w[n] == '\n');
        }
    warnings[0] = 0;
    return exit_status;
}

void cli_add_default(struct setup *s, const char *fmt, const char *v)
{
    size_t l = strlen(s->defaults);
    if (l)
        snprintf(s->defaults + l, sizeof s->defaults - l, ", ");
    l = strlen(s->defaults);
    if ((size_t)snprintf(s->defaults + l, sizeof s->defaults - l, fmt, v) >= sizeof s->defaults - l)
        MP_BUG("the defaults line outgrew its %zu bytes", sizeof s->defaults);
}

/* --train-blocks against the model, as layers.c reads it: numbers name the repeated (decoder)
 * blocks, 0 to n-1, as transformers numbers its layers (Mllama's cross-attention layers, which
 * have no block without images, keep their numbers: mp_block.num_skip), or without repeated blocks
 * every block by its index; embed and head the blocks before and after the repeated ones.  A
 * range that names only such skipped layers is refused (it would train nothing).  0, or the exit
 * status (message printed). */
static int check_train_blocks(const struct args *a, const struct mp_model *m)
{
    if (a->ft.mode != MP_FT_FREEZE)
        return 0;
    size_t n_rep = 0, first = 0, last = 0;
    uint64_t n = 0; /* the numbers the repeated blocks take, skipped layers included */
    for (size_t i = 0; i < m->n_blocks; i++)
        if (m->blocks[i].repeat_group > 0 && !mp_block_vision(&m->blocks[i])) {
            first = n_rep++ ? first : i;
            last = i;
            n += m->blocks[i].num_skip + 1;
        }
    n = n_rep ? n + m->num_skip_end : m->n_blocks;
    bool skips = n != n_rep && n_rep;
    const char *kind = !n_rep ? "blocks and no repeated ones"
                       : skips ? "decoder layers, cross-attention ones included"
                               : "repeated (decoder) blocks";
    for (size_t i = 0; i < a->ft.n_ranges; i++) {
        uint64_t lo = a->ft.range_lo[i], hi = a->ft.range_hi[i];
        char r[48];
        snprintf(r, sizeof r, lo == hi ? "%llu" : "%llu-%llu", (unsigned long long)lo, (unsigned long long)hi);
        if (hi >= n) {
            fprintf(stderr, "memplan: error: --train-blocks: %s is out of range: %s has %llu %s (numbered 0 to "
                    "%llu)\n", r, a->model, (unsigned long long)n, kind, (unsigned long long)(n - 1));
            return MP_EXIT_USAGE;
        }
        bool hit = !skips;
        for (size_t j = 0, k = 0; j < m->n_blocks && !hit; j++)
            if (m->blocks[j].repeat_group > 0 && !mp_block_vision(&m->blocks[j])) {
                k += m->blocks[j].num_skip;
                hit = k >= lo && k <= hi;
                k++;
            }
        if (!hit) {
            fprintf(stderr, "memplan: error: --train-blocks: %s names only cross-attention layers of %s, which a "
                    "step without images skips (they would train nothing)\n", r, a->model);
            return MP_EXIT_USAGE;
        }
    }
    bool no_embed = a->ft.train_embed && (!n_rep || first == 0),
         no_head = a->ft.train_head && (!n_rep || last + 1 == m->n_blocks);
    if (no_embed || no_head) {
        fprintf(stderr, "memplan: error: --train-blocks: %s: %s has no block %s its repeated (decoder) blocks%s\n",
                no_embed ? "embed" : "head", a->model, no_embed ? "before" : "after",
                n_rep ? "" : " (it has none: name its blocks by number)");
        return MP_EXIT_USAGE;
    }
    return 0;
}

/* The rules between the options and the model: 0, or the exit status (message printed). */
static int check_model_options(const struct args *a, const struct setup *s)
{
    if (a->target_seq && (!s->model.enc_dec || s->model.dec_from_input)) {
        fprintf(stderr, "memplan: error: --target-seq: %s %s\n", a->model,
                s->model.enc_dec ? "decodes its input ids shifted (T5ForQuestionAnswering): the decoder's length is "
                                   "--seq"
                                 : "is not an encoder-decoder model (t5 configs only)");
        return MP_EXIT_USAGE;
    }
    int rc = check_train_blocks(a, &s->model);
    if (rc)
        return rc;
    /* --checkpoint ...+sac: the flash-attn package's op (which TRL's and Axolotl's policies save)
     * is not modelled; Axolotl recomputes the attention of layers whose module says it slides
     * (axolotl monkeypatch/selective_checkpointing.py _layer_attention_type: layer_type or
     * is_sliding, per family), which memplan does not read: docs/checkpointing.md#sac */
    for (size_t i = 0; i < s->model.n_blocks && a->ckpt.sac != MP_SAC_NONE; i++)
        for (size_t j = 0; j < s->model.blocks[i].n_layers; j++) {
            const struct mp_layer *l = &s->model.blocks[i].layers[j];
            bool flash = (a->attention_set || !l->attn.impl_set ? (enum mp_attn_impl)a->attention : l->attn.impl) == MP_ATTN_FLASH;
            if ((l->attn.heads && flash) || (a->ckpt.sac == MP_SAC_AXOLOTL && l->attn.window)) {
                fprintf(stderr, "memplan: error: --checkpoint ...+sac%s: %s: %s\n",
                        a->ckpt.sac == MP_SAC_AXOLOTL ? ":axolotl" : "", a->model,
                        flash ? "flash-attn's op (its policy saves it) is not modelled yet: use --attention sdpa"
                              : "Axolotl recomputes the attention of sliding-window layers as each family marks "
                                "them, which memplan does not model yet");
                return MP_EXIT_USAGE;
            }
        }
    /* torchtitan's SelectiveAC saves every compute-intensive op's output (replay.c titan_keeps): the
     * ops memplan counts for it are the fused SDPA call, aten.mm and aten.addmm; eager attention's
     * and SDPA's math path's bmm, a convolution, MoE experts and a quantized base's matmul are not
     * modelled, and it checkpoints every layer (docs/checkpointing.md#sac-torchtitan); the policy
     * runs only inside the layers it wraps (repeated blocks), so a patch embedding ahead is not its */
    if (a->ckpt.sac == MP_SAC_TORCHTITAN) {
        const char *why = a->ckpt.k > 1 ? "torchtitan checkpoints every layer (layers, not layers:N)"
                          : s->model.quant.kind != MP_Q_NONE || a->ft.mode == MP_FT_QLORA
                              ? "a quantized base's matmul under its policy is not modelled"
                          : a->torch && a->torch < MP_TORCH_MEMEFF_GQA
                              ? "SDPA's math path (bmm, which its policy saves) is not modelled: drop --torch"
                              : NULL;
        for (size_t i = 0; i < s->model.n_blocks && !why; i++)
            for (size_t j = 0; s->model.blocks[i].repeat_group > 0 && j < s->model.blocks[i].n_layers && !why; j++) {
                const struct mp_layer *l = &s->model.blocks[i].layers[j];
                enum mp_attn_impl im = a->attention_set || !l->attn.impl_set ? (enum mp_attn_impl)a->attention
                                                                             : l->attn.impl;
                if (l->attn.heads && im == MP_ATTN_EAGER)
                    why = "eager attention's bmm (its policy saves them) is not modelled: use --attention sdpa";
                else if (l->moe.experts > 0)
                    why = "the experts' ops under its policy are not modelled";
                else if (l->type == MP_LT_CONV2D || l->type == MP_LT_BOTTLENECK || l->type == MP_LT_PATCH_EMBEDDING)
                    why = "a convolution (its policy saves it) is not modelled";
            }
        if (why) {
            fprintf(stderr, "memplan: error: --checkpoint ...+sac:torchtitan: %s: %s\n", a->model, why);
            return MP_EXIT_USAGE;
        }
    }
    bool moe = false;
    for (size_t i = 0; i < s->model.n_blocks && !moe; i++)
        for (size_t j = 0; j < s->model.blocks[i].n_layers && !moe; j++)
            moe = s->model.blocks[i].layers[j].moe.experts > 0;
    if (a->par.ep > 1 && !moe) {
        fprintf(stderr, "memplan: error: --ep %llu: %s has no mixture-of-experts layer\n", (unsigned long long)a->par.ep,
                a->model);
        return MP_EXIT_USAGE;
    }
    if (a->use_cache >= 0 && !s->model.kv_cache && !a->use_cache_recipe) {
        fprintf(stderr, "memplan: error: --use-cache: %s has no key/value cache (HF decoder configs only)\n",
                a->model);
        return MP_EXIT_USAGE;
    }
    if (s->model.quant.kind != MP_Q_NONE && (a->ft.mode == MP_FT_FULL || a->ft.mode == MP_FT_FREEZE)) {
        fprintf(stderr, "memplan: error: %s: quantization_config: a %s-quantized base cannot be %s fine-tuned; "
                        "train adapters on it with --finetune lora (or qlora)\n",
                a->model, mp_quant_kind_str(s->model.quant.kind), a->ft.mode == MP_FT_FULL ? "fully" : "partly");
        return MP_EXIT_INPUT;
    }
    const struct mp_quant *qz = s->model.quant.kind != MP_Q_NONE ? &s->model.quant
                                : a->ft.mode == MP_FT_QLORA ? &a->ft.quant
                                                            : NULL;
    const char *qwhy = a->par.strategy != MP_PAR_NONE ? mp_par_quant_unmodelled(a->par.strategy, qz) : NULL;
    if (qwhy) {
        fprintf(stderr, "memplan: error: %s: --finetune %s with --parallel %s: %s\n", a->model,
                mp_ft_mode_str(a->ft.mode), mp_par_strategy_str(a->par.strategy), qwhy);
        return MP_EXIT_USAGE;
    }
    const char *why = a->ft.mode == MP_FT_LORA || a->ft.mode == MP_FT_QLORA ? mp_moe_lora_unmodelled(&s->model, &a->ft)
                                                                             : NULL;
    if (why) {
        fprintf(stderr, "memplan: error: %s: --finetune %s on a mixture-of-experts model: %s; memplan does not "
                        "model adapters on expert parameters yet: name attention modules with --lora-targets (e.g. "
                        "q_proj,v_proj)\n", a->model, mp_ft_mode_str(a->ft.mode), why);
        return MP_EXIT_USAGE;
    }
    return 0;
}

/* The defaults the report's header names: those that apply to this model and command. */
static void note_defaults(const struct args *a, struct setup *s, bool need_target)
{
    char num[32];
    if (!a->seq && s->model.input == MP_INPUT_TOKENS) {
        snprintf(num, sizeof num, "%llu", (unsigned long long)s->model.seq_len);
        if (s->model.max_positions > s->model.seq_len) { /* capped: say so, and what the model allows */
            char cap[112];
            snprintf(cap, sizeof cap, "%s (memplan's default for HF configs; the model allows %llu: --seq)", num,
                     (unsigned long long)s->model.max_positions);
            cli_add_default(s, "seq %s", cap);
        } else {
            cli_add_default(s, "seq %s (model)", num);
        }
    }
    if (s->model.enc_dec && !a->target_seq) {
        snprintf(num, sizeof num, "%llu", (unsigned long long)(a->seq ? a->seq : s->model.seq_len));
        cli_add_default(s, s->model.dec_from_input ? "target seq %s (= seq: the input ids shifted)"
                                               : "target seq %s (= seq; the decoder's length)", num);
    }
    for (size_t i = 0; i < s->model.n_blocks && s->model.input == MP_INPUT_IMAGE; i++)
        for (size_t j = 0; j < s->model.blocks[i].n_layers; j++) {
            const struct mp_layer *l = &s->model.blocks[i].layers[j];
            if (l->type != MP_LT_PATCH_EMBEDDING || !l->conv.kernel)
                continue;
            snprintf(num, sizeof num, "%llu",
                     (unsigned long long)((s->model.height / l->conv.kernel) * (s->model.width / l->conv.kernel) +
                                          l->emb.cls_token));
            cli_add_default(s, "seq %s (image patches + class token; --seq does not apply)", num);
        }
    if (!a->batch_set && !need_target && a->trainer != MP_TRAINER_GRPO) { /* (GRPO's: setup_grpo) */
        snprintf(num, sizeof num, "%llu%s", (unsigned long long)a->batch,
                 a->batch > 1 ? " (the trainer's least)" : "");
        cli_add_default(s, "batch %s", num);
    }
    if (!a->precision_set && !need_target)
        cli_add_default(s, "precision %s", "amp-bf16");
    if (a->optimizer == MP_OPT_ADAMW && !(a->rec && a->rec->s[MP_RS_OPTIMIZER].set))
        cli_add_default(s, "optimizer %s", "adamw");
    int own = mp_model_attention_impl(&s->model);
    if (!a->attention_set && own >= 0 && own != MP_ATTN_SDPA) /* what it computes, not the CLI's default */
        cli_add_default(s, "attention %s (the model's own; --attention overrides it)",
                        mp_attn_impl_str((enum mp_attn_impl)own));
    else if (!a->attention_set && mp_model_has_attention(&s->model))
        cli_add_default(s, "attention %s",
                        a->torch && a->torch < MP_TORCH_MEMEFF_GQA
                            ? "sdpa (transformers' default: its math kernel keeps s x s for fp32 GQA)"
                            : "sdpa (transformers' default: no s x s matrix kept)");
    if (s->model.kv_cache && a->use_cache < 0)
        cli_add_default(s, "use_cache %s",
                        a->trainer != MP_TRAINER_SFT         ? "off (TRL's trainers pass use_cache=False)"
                        : !s->model.use_cache                ? "off (config)"
                        : a->ckpt.strategy == MP_CKPT_LAYERS ? "off (gradient checkpointing turns it off)"
                                                             : "on (config: k/v copied into a DynamicCache)");
}

/* The caching allocator's settings: --alloc-conf, else the environment torch 2.15 reads
 * (PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF: c10/cuda/CUDAAllocatorConfig.h, instance()),
 * else the defaults.  0, or the exit status (message printed). */
static int setup_alloc(const struct args *a, struct setup *s, struct mp_diag *d)
{
    static const char *const vars[] = {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"};
    mp_alloc_conf_default(&s->alloc);
    s->alloc_from[0] = 0;
    if (a->alloc_set) {
        s->alloc = a->alloc;
        snprintf(s->alloc_from, sizeof s->alloc_from, "--alloc-conf");
    } else {
        for (size_t i = 0; i < sizeof vars / sizeof vars[0] && !s->alloc_from[0]; i++) {
            const char *e = getenv(vars[i]);
            if (!e)
                continue;
            enum mp_status st = mp_alloc_conf_parse(e, vars[i], &s->alloc, d);
            if (st != MP_OK)
                return cli_fail(st, d);
            snprintf(s->alloc_from, sizeof s->alloc_from, "%s", vars[i]);
        }
    }
    s->train.alloc = &s->alloc;
    return 0;
}

static const char *env_get(const char *name)
{
    return getenv(name);
}

/* NCCL's settings from the environment NCCL reads (search/nccl.h), and with data parallelism
 * the assumption on the defaults line.  0, or the exit status (message printed). */
static int setup_nccl(struct setup *s, struct mp_diag *d)
{
    enum mp_status st = mp_nccl_env_read(&s->nccl, env_get, d);
    if (st != MP_OK)
        return cli_fail(st, d);
    s->train.nccl = &s->nccl;
    return 0;
}

static void note_nccl(struct setup *s)
{
    if (!s->train.par || mp_par_world(s->train.par) <= 1)
        return;
    struct mp_nccl_est n;
    char desc[128], b[32], c[32];
    mp_nccl_estimate(&s->gpu, s->train.par, &s->nccl, &n);
    if (n.counted && !n.profile) {
        snprintf(desc, sizeof desc, "%s (%u channels%s, NCCL_BUFFSIZE %s, NVLS %s)",
                 mp_fmt_bytes(n.bytes, b, sizeof b), n.channels,
                 s->nccl.min_ch && s->nccl.min_ch == s->nccl.max_ch ? ": NCCL_*_NCHANNELS" : " (profile)",
                 mp_fmt_bytes(s->nccl.buff[2], c, sizeof c), n.nvls_bytes ? "on" : "off");
        cli_add_default(s, "NCCL %s", desc);
    }
}

/* The target: --gpu, --vram, else (need_target: suggest) the local GPU, else the default
 * profile; --workspace and --context over it.  0, or the exit status (message printed). */
static int setup_target(const struct args *a, struct setup *s, bool need_target, struct mp_diag *d)
{
    enum mp_status st;
    if (a->gpu) {
        if ((st = mp_gpu_load(a->gpu, cli_argv0, &s->gpu, d)) != MP_OK)
            return cli_fail(st, d);
        s->have_gpu = true;
        snprintf(s->how, sizeof s->how, "--gpu %s", a->gpu);
    } else if (a->vram) {
        mp_gpu_from_vram(a->vram, &s->gpu);
        s->have_gpu = true;
        snprintf(s->how, sizeof s->how, "--vram");
    } else if (need_target) {
        struct mp_diag pd = {{0}};
        if (mp_gpu_from_device(a->device, &s->gpu, &pd) == MP_OK) {
            s->have_gpu = true;
            s->target_is_device = true;
            snprintf(s->how, sizeof s->how, "the local GPU (device %d)", a->device);
        } else if (a->device_set) {
            fprintf(stderr, "memplan: error: --device %d: no usable CUDA device (%s)\n", a->device,
                    pd.msg[0] ? pd.msg : "none found");
            return MP_EXIT_DEVICE;
        } else {
            if ((st = mp_gpu_load(MP_DEFAULT_GPU, cli_argv0, &s->gpu, d)) != MP_OK)
                return cli_fail(st, d);
            s->have_gpu = true;
            snprintf(s->how, sizeof s->how, "default profile: no GPU here and no --gpu/--vram");
        }
    }
    if (a->vllm > 0 && !s->have_gpu) {
        const struct mp_recipe_setting *rv = a->rec ? &a->rec->s[MP_RS_VLLM] : NULL;
        if (rv && rv->set && rv->src != MP_RSRC_COMMAND_LINE) /* (the recipe's use_vllm) */
            fprintf(stderr, "memplan: error: %s:%u: %s: a colocated vLLM takes %g of the GPU's memory: name the GPU "
                    "(--gpu or --vram)\n", a->rec->path, rv->line, rv->key, a->vllm);
        else
            fprintf(stderr, "memplan: error: --vllm %g takes %g of the GPU's memory: name the GPU (--gpu or --vram)\n",
                    a->vllm, a->vllm);
        return MP_EXIT_USAGE;
    }
    if (!s->have_gpu)
        mp_gpu_from_vram(0, &s->gpu);
    s->train.vllm_fraction = a->vllm;
    s->train.vllm_bytes = mp_vllm_bytes(a->vllm, s->gpu.memory_bytes);
    if (a->workspace_set)
        s->gpu.workspace_bytes = a->workspace;
    if (a->context_set)
        s->gpu.context_bytes = a->context;
    s->train.cublas_workspace_bytes = s->gpu.workspace_bytes;
    s->build.sm_count = s->gpu.sm_count;
    s->build.sm_threads = s->gpu.sm_threads;
    s->build.cc_major = s->gpu.cc_major;
    s->build.cc_minor = s->gpu.cc_minor;
    return 0;
}

/* model.safetensors.index.json beside the config (a sharded save_pretrained checkpoint, as the Hub
 * serves it): metadata.total_size is the bytes of every tensor stored (tied weights once,
 * non-persistent buffers not at all: huggingface_hub's split_torch_state_dict_into_shards sums the
 * state dict save_pretrained writes), checked against the model's parameters in the checkpoint's
 * dtype (torch_dtype).  A mismatch is a warning naming both figures: the config and the weights
 * disagree, or memplan's count does.  Skipped without a known dtype, for a quantized checkpoint
 * (its storage is not one dtype) and when the index cannot be read. */
void cli_check_checkpoint_index(const char *config, const struct mp_model *m)
{
    static const struct {
        const char *name;
        uint64_t size;
    } dtypes[] = {{"float32", 4}, {"float", 4}, {"bfloat16", 2}, {"float16", 2}, {"half", 2}, {"float64", 8}};
    uint64_t size = 0;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(m->ckpt_dtype, dtypes[i].name))
            size = dtypes[i].size;
    char index[4096];
    struct stat sb;
    const char *slash = strrchr(config, '/');
    int dir = slash ? (int)(slash - config + 1) : 0;
    if (!size || m->quant.kind != MP_Q_NONE || strcmp(m->source, "hf") ||
        (size_t)snprintf(index, sizeof index, "%.*smodel.safetensors.index.json", dir, config) >= sizeof index ||
        stat(index, &sb) != 0 || !S_ISREG(sb.st_mode))
        return;
    struct mp_diag d = {{0}};
    uint64_t total = 0;
    if (mp_checkpoint_index_total(index, &total, &d) != MP_OK) {
        cli_warn("%s; the parameter bytes are not checked", d.msg);
        return;
    }
    struct mp_build_opts bo;
    mp_build_opts_default(&bo);
    bo.batch = 1;
    bo.seq = 1;
    struct mp_program p;
    uint64_t bytes;
    if (mp_fold_report_program(m, &bo, &p, &d) != MP_OK)
        return; /* the command itself reports what fails to build */
    bool ok = mp_mul_u64(p.total_params, size, &bytes);
    mp_program_release(&p);
    if (ok && bytes != total)
        cli_warn("%s: the checkpoint holds %llu bytes of tensors (metadata.total_size) but %llu parameters in %s "
                 "are %llu bytes", index, (unsigned long long)total, (unsigned long long)(bytes / size), m->ckpt_dtype,
                 (unsigned long long)bytes);
}

/* GRPO (--trainer grpo; trl 1.16.0 grpo_config.py, grpo_trainer.py): the prompt is --seq less the
 * completion; the generation batch is --batch x steps_per_generation (its default: the
 * accumulation steps, grpo_config.py:1098-1100) and holds whole prompt groups (:1131-1135); the
 * reference, when beta > 0, runs before the policy's forward; the loss reads the completion's
 * positions only.  0 or the exit status (message printed). */
static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

static int setup_grpo(const struct args *a, struct setup *s, bool need_target)
{
    uint64_t seq = a->seq ? a->seq : s->model.seq_len, C = a->completion_len;
    if (!s->model.kv_cache) {
        fprintf(stderr, "memplan: error: %s: --trainer grpo needs a causal LM that generates (a decoder with a "
                "k/v cache)\n", a->model);
        return MP_EXIT_USAGE;
    }
    if (seq <= C) {
        fprintf(stderr, "memplan: error: --trainer grpo: --seq %llu leaves no prompt before --completion-length "
                "%llu (--seq is prompt + completion)\n", (unsigned long long)seq, (unsigned long long)C);
        return MP_EXIT_USAGE;
    }
    uint64_t window = mp_model_min_window(&s->model);
    if (window && window < seq) {
        fprintf(stderr, "memplan: error: %s: --trainer grpo: generation's sliding-window cache (window %llu < --seq "
                "%llu) is not modelled yet\n", a->model, (unsigned long long)window, (unsigned long long)seq);
        return MP_EXIT_USAGE;
    }
    uint64_t k = a->steps_per_gen ? a->steps_per_gen : a->grad_accum ? a->grad_accum : 1, world = 1, gen;
    if (a->par.strategy != MP_PAR_NONE)
        world = mp_par_world(&a->par);
    /* suggest --global-batch without --steps-per-generation: TRL's steps_per_generation is the
     * accumulation suggest picks, so generation takes the global batch whatever the micro-batch */
    bool whole = !a->steps_per_gen && a->global_batch;
    uint64_t gw = 0;
    if (whole && (!mp_mul_u64(a->global_batch, world, &gw) || gw % a->num_generations)) {
        fprintf(stderr, "memplan: error: --trainer grpo: --global-batch %llu is the generation batch (steps_per_"
                "generation defaults to the accumulation) and not a multiple of --num-generations %llu\n",
                (unsigned long long)a->global_batch, (unsigned long long)a->num_generations);
        return MP_EXIT_USAGE;
    }
    /* the smallest micro-batch whose generation batch holds whole groups: --batch's default */
    uint64_t kw = (k % a->num_generations) * (world % a->num_generations) % a->num_generations;
    s->batch_unit = whole ? 1 : a->num_generations / gcd_u64(a->num_generations, kw ? kw : a->num_generations);
    uint64_t batch = a->batch_set ? a->batch : s->batch_unit;
    if (!a->batch_set) {
        char num[96];
        snprintf(num, sizeof num, "%llu (whole groups of --num-generations %llu)", (unsigned long long)batch,
                 (unsigned long long)a->num_generations);
        if (!need_target) /* (suggest searches it) */
            cli_add_default(s, "batch %s", num);
        s->build.batch = batch;
    }
    if (!mp_mul_u64(batch, k, &gen) || gen > UINT64_MAX / world) {
        fprintf(stderr, "memplan: error: --trainer grpo: the generation batch --batch x --steps-per-generation "
                "overflows 64 bits\n");
        return MP_EXIT_USAGE;
    }
    if (!whole && (gen * world) % a->num_generations) {
        fprintf(stderr, "memplan: error: --trainer grpo: the generation batch (--batch %llu x %llu steps x %llu "
                "ranks = %llu) is not a multiple of --num-generations %llu (GRPOConfig raises)\n",
                (unsigned long long)batch, (unsigned long long)k, (unsigned long long)world,
                (unsigned long long)(gen * world), (unsigned long long)a->num_generations);
        return MP_EXIT_USAGE;
    }
    s->build.completion = C;
    s->train.ref_before_policy = true;
    /* the old log-probs' forward (grpo_trainer.py:2641-2645): generation out of step with the
     * optimizer's steps, or vLLM's importance sampling */
    uint64_t every;
    if (!mp_mul_u64(k, a->num_iterations, &every)) {
        fprintf(stderr, "memplan: error: --trainer grpo: --steps-per-generation x --num-iterations overflows 64 "
                "bits\n");
        return MP_EXIT_USAGE;
    }
    s->train.gen_every = every;
    s->train.gen_iterations = (double)a->num_iterations;
    s->train.old_vllm = (a->vllm > 0 || a->vllm_server) && a->vllm_is_corr;
    /* (suggest picks the accumulation: mp_grpo_phases again for each candidate) */
    mp_grpo_phases(&s->train, need_target && !a->grad_accum ? 0 : a->grad_accum ? a->grad_accum : 1);
    s->train.vllm_server = a->vllm_server;
    if (a->vllm > 0 || a->vllm_server)
        return 0; /* (vLLM generates: its reservation, setup_target) */
    s->train.gen_steps = k;
    s->train.gen_seqs = whole ? a->global_batch : 0;
    s->train.gen_temperature = a->temperature != 1.0; /* (generation_utils: no warper at 1.0) */
    s->train.gen_top_k = a->top_k;                    /* (utils.py:1621-1634: top_k != 0, */
    s->train.gen_top_p = a->top_p < 1.0;              /* top_p < 1, min_p not None) */
    s->train.gen_min_p = a->min_p >= 0;
    s->train.gen_rep_penalty = a->rep_penalty != 1.0; /* (utils.py:1472: none at 1.0) */
    s->train.gen_ds3_per_layer = !a->ds3_gather;
    s->train.gen_prompt = seq - C;
    s->train.gen_completion = C;
    return 0;
}

int cli_setup(struct args *a, struct setup *s, bool need_target, struct mp_diag *d)
{
    memset(s, 0, sizeof *s);
    static char model_file[4096]; /* MODEL resolved: a's model names it from here on */
    int rc0 = cli_resolve_model(a->model, model_file, sizeof model_file);
    if (rc0)
        return rc0;
    a->model = model_file;
    struct mp_model_request rq = {.head = a->head, .num_labels = a->num_labels, .images = a->images,
                                   .image_h = a->image_h, .image_w = a->image_w};
    enum mp_status st = mp_model_load_file_as(&s->model, a->model, &rq, d);
    if (st != MP_OK)
        return cli_fail(st, d); /* nothing loaded: nothing to release */
    mp_build_opts_default(&s->build);
    s->build.batch = a->batch;
    s->build.seq = a->seq;
    s->build.precision = (enum mp_precision)a->precision;
    s->build.attention = (enum mp_attn_impl)a->attention;
    s->build.attention_forced = a->attention_set;
    s->build.torch = a->torch;
    s->build.loss = (enum mp_loss)a->loss;
    s->build.liger = a->liger;
    s->build.label_fraction = a->label_fraction;
    s->build.packing = a->packing;
    s->build.padding_free = a->padding_free;
    s->build.trainer = (enum mp_trainer)a->trainer;
    s->build.ep = a->par.ep > 1 ? a->par.ep : 0;
    s->build.moe_capacity = a->moe_capacity;
    int own = mp_model_attention_impl(&s->model);
    if (!a->attention_set && own >= 0) /* every layer names its own: the report says that one */
        s->build.attention = (enum mp_attn_impl)own;
    else if (a->attention_set && own >= 0 && own != a->attention)
        cli_warn("%s: --attention %s replaces the %s attention this model runs", a->model,
                 mp_attn_impl_str((enum mp_attn_impl)a->attention), mp_attn_impl_str((enum mp_attn_impl)own));
    s->build.ft = a->ft;
    mp_par_build_opts(&s->build, &a->par, s->model.quant.kind);
    /* TRL's disable_dropout (--disable-dropout; DPOConfig's and KTOConfig's default True,
     * dpo_config.py:185, kto_config.py:156; GRPOConfig's False, grpo_config.py:453; applied in
     * dpo_trainer.py:931-935, kto_trainer.py:943-946, grpo_trainer.py:1006-1009): every nn.Dropout's
     * p set to 0, after peft wrapped the model (lora_dropout too); the attention's dropout_p is a
     * float attribute in most families: kept */
    if (a->disable_dropout > 0 || (a->disable_dropout < 0 && mp_trainer_drops_dropout((enum mp_trainer)a->trainer))) {
        s->build.ft.dropout = 0;
        for (size_t i = 0; i < s->model.n_blocks; i++)
            for (size_t j = 0; j < s->model.blocks[i].n_layers; j++) {
                s->model.blocks[i].layers[j].p = 0;
                s->model.blocks[i].layers[j].emb.dropout = 0;
            }
    }
    s->build.ft.input_grad = a->ckpt.strategy != MP_CKPT_NONE;
    s->build.hf_checkpointing = a->ckpt.strategy == MP_CKPT_LAYERS;
    s->build.target_seq = a->target_seq;
    int rc = check_model_options(a, s);
    if (rc)
        goto out;
    if (a->use_cache >= 0)
        s->model.use_cache = a->use_cache == 1;
    else if (a->trainer != MP_TRAINER_SFT) /* TRL's trainers pass use_cache=False to the training forward */
        s->model.use_cache = false;
    mp_train_opts_default(&s->train);
    s->train.optimizer = (enum mp_optimizer)a->optimizer;
    s->train.accumulate = a->grad_accum > 1;
    s->train.act_offload = a->act_offload;
    bool grpo = a->trainer == MP_TRAINER_GRPO;
    if (mp_trainer_ref_fwds((enum mp_trainer)a->trainer) && !a->precompute_ref && (!grpo || a->beta > 0))
        /* trl dpo_trainer.py:908-927, kto_trainer.py:919-938, grpo_trainer.py:983-1003 (beta > 0) */
        s->train.ref = a->ft.mode == MP_FT_LORA || a->ft.mode == MP_FT_QLORA ? MP_REF_ADAPTER : MP_REF_COPY;
    if (grpo && (rc = setup_grpo(a, s, need_target)) != 0)
        goto out;
    s->par = a->par;
    s->train.par = a->par.strategy != MP_PAR_NONE ? &s->par : NULL;
    if ((rc = setup_alloc(a, s, d)) != 0 || (rc = setup_nccl(s, d)) != 0)
        goto out;
    note_defaults(a, s, need_target);
    if (a->seq && s->model.max_positions && a->seq > s->model.max_positions)
        cli_warn("%s: --seq %llu exceeds max_position_embeddings %llu", a->model, (unsigned long long)a->seq,
                 (unsigned long long)s->model.max_positions);
    cli_check_checkpoint_index(a->model, &s->model);
    if (!strcmp(s->model.hf_class, "Llama4ForConditionalGeneration")) /* (docs/memory-facts.md#llama4) */
        cli_warn("%s: transformers 5.24's Llama4ForConditionalGeneration.forward reads its language model's "
                 "image_outputs, which that output lacks (modeling_llama4.py:1318): training raises AttributeError "
                 "after the loss; planned is the step the forward computes", a->model);
    rc = setup_target(a, s, need_target, d);
    if (!rc)
        note_nccl(s);
out: /* the one way out: on a failure the model is released */
    if (rc)
        mp_model_release(&s->model);
    return rc;
}

void cli_fill_ctx(struct mp_report_ctx *c, const char *cmd, struct setup *s, const struct mp_program *prog,
                     const struct mp_ckpt_spec *ck, struct args *a)
{
    memset(c, 0, sizeof *c);
    c->command = cmd;
    c->model = &s->model;
    c->prog = prog;
    c->build = &s->build;
    c->ft = &s->build.ft;
    c->train = &s->train;
    c->alloc_from = s->alloc_from;
    c->ckpt = ck;
    c->gpu = s->have_gpu && s->gpu.memory_bytes ? &s->gpu : NULL;
    c->target_how = s->how;
    c->json = a->json;
    c->num_generations = a->num_generations;
    c->steps_per_generation = a->steps_per_gen; /* (0: TRL's default, the accumulation) */
    c->beta = a->beta;
    c->num_iterations = a->num_iterations;
    c->disable_dropout = a->disable_dropout >= 0 ? a->disable_dropout > 0
                                                 : mp_trainer_drops_dropout((enum mp_trainer)a->trainer);
    c->temperature = a->temperature;
    c->top_p = a->top_p;
    c->top_k = a->top_k;
    c->min_p = a->min_p;
    c->rep_penalty = a->rep_penalty;
    c->vllm_is_correction = a->vllm_is_corr != 0;
    c->ds3_gather = a->ds3_gather != 0;
    c->all_layers = a->all_layers;
    c->wide = a->wide;
    c->margin_pct = 100.0 * a->margin;
    c->moe_capacity = a->moe_capacity;
    c->recipe = a->rec;
    c->head = a->head >= 0 ? mp_head_str((enum mp_head)a->head) : NULL;
    c->num_labels = a->num_labels;
    snprintf(c->defaults, sizeof c->defaults, "%s", s->defaults);
    /* SDPA's kernel on the target (its compute capability known): the first SDPA layer's */
    if (prog && prog->sdpa_backend != MP_SDPA_UNKNOWN && !prog->sdpa_math) {
        static const char *const what[] = {"", "cuDNN attention", "flash attention", "memory-efficient attention",
                                           "math"};
        size_t l = strlen(c->defaults);
        snprintf(c->defaults + l, sizeof c->defaults - l, "%sSDPA kernel %s (torch 2.15 on sm%d%d, %s, head dim %llu%s)",
                 l ? ", " : "", what[prog->sdpa_backend], s->gpu.cc_major, s->gpu.cc_minor,
                 mp_dtype_str(prog->sdpa_dtype), (unsigned long long)prog->sdpa_head_dim,
                 prog->sdpa_backend == MP_SDPA_MATH ? "; counted as a fused kernel's bytes" : "");
    }
}

struct mp_job cli_job_of(struct setup *s, struct args *a)
{
    struct mp_job j = {.model = &s->model, .build = s->build, .train = s->train, .ckpt = a->ckpt, .gpu = s->gpu,
                       .margin = a->margin, .slots = a->slots, .activation_budget = a->budget,
                       .batch_unit = s->batch_unit};
    return j;
}

/* The one stderr line of a configuration that does not fit its target (exit 1). */
void cli_say_nofit(const struct mp_fit *f)
{
    char a1[32], a2[32], a3[32]; /* units as the report prints them; --json has the exact bytes */
    char ev[4 * sizeof f->est.peak_event]; /* the event's name from the model, escaped */
    mp_progress_done();
    uint64_t by = mp_fit_shortfall(f), alloc_by = f->peak_device_bytes > f->usable_bytes
                                                       ? f->peak_device_bytes - f->usable_bytes : 0;
    if (f->fits_allocated || by > alloc_by) { /* the device level decides: the caching allocator simulated */
        fprintf(stderr, "memplan: does not fit: short by %s (reserved + context %s of %s usable)\n",
                mp_fmt_bytes(by, a1, sizeof a1), mp_fmt_bytes(f->device_bytes, a2, sizeof a2),
                mp_fmt_bytes(f->usable_bytes, a3, sizeof a3));
        return;
    }
    fprintf(stderr, "memplan: does not fit: short by %s (peak %s of %s usable) at %s\n",
            mp_fmt_bytes(by, a1, sizeof a1), mp_fmt_bytes(f->peak_device_bytes, a2, sizeof a2),
            mp_fmt_bytes(f->usable_bytes, a3, sizeof a3), mp_text_clean(f->est.peak_event, ev, sizeof ev));
}
