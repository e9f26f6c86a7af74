/* report.c — text and JSON writers (schema 1) and trainer snippets.
 * Text: the answer first, then detail; tables fold identical repeated blocks.
 * JSON: one object per report with "schema": 1 and "command"; keys are the
 * contract of README's "JSON output" and memplan(1) JSON OUTPUT (add freely,
 * never rename).  No computation here beyond formatting; cJSON is used only to
 * build and print the JSON tree.
 */
#include "report.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define B(x) mp_fmt_bytes((x), (char[32]){0}, 32)

static const char *fl(double f)
{
    static char buf[4][32];
    static int k;
    k = (k + 1) % 4;
    return mp_fmt_flops(f, buf[k], 32);
}

static const char *count(uint64_t n)
{
    static char buf[4][32];
    static int k;
    k = (k + 1) % 4;
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)n);
    size_t len = strlen(tmp), j = 0;
    for (size_t i = 0; i < len; i++) {
        buf[k][j++] = tmp[i];
        if ((len - i - 1) % 3 == 0 && i + 1 < len)
            buf[k][j++] = ',';
    }
    buf[k][j] = 0;
    return buf[k];
}

static const char *short_count(uint64_t n)
{
    static char buf[4][32];
    static int k;
    k = (k + 1) % 4;
    if (n >= 1000000000ull)
        snprintf(buf[k], 32, "%.2fB", (double)n / 1e9);
    else if (n >= 1000000ull)
        snprintf(buf[k], 32, "%.2fM", (double)n / 1e6);
    else if (n >= 1000ull)
        snprintf(buf[k], 32, "%.1fK", (double)n / 1e3);
    else
        snprintf(buf[k], 32, "%llu", (unsigned long long)n);
    return buf[k];
}

/* A name from an input file (model, block, event, GPU profile) as the text report shows it:
 * control characters escaped (mp_text_clean), so it cannot drive the terminal or split a row.
 * JSON keeps the exact bytes (cJSON escapes them).  Eight at a time, like count(). */
static const char *shown(const char *s)
{
    static char buf[8][1024]; /* 4 x the longest name (a 255-byte note) + 1 */
    static int k;
    k = (k + 1) % 8;
    return mp_text_clean(s, buf[k], sizeof buf[k]);
}

static void block_type(const struct mp_block *b, char *buf, size_t len)
{
    if (b->n_layers == 1)
        snprintf(buf, len, "%s", mp_layer_type_str(b->layers[0].type));
    else
        snprintf(buf, len, "%s+%zu", mp_layer_type_str(b->layers[0].type), b->n_layers - 1);
}

/* ---- JSON helpers ------------------------------------------------------------------------ */

static void jnum(cJSON *o, const char *k, double v) { cJSON_AddNumberToObject(o, k, v); }
/* Byte counts can exceed 2^53: write them as exact integers, not doubles. */
static void ju64(cJSON *o, const char *k, uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    cJSON_AddRawToObject(o, k, buf);
}

/* The precision policy's name: mixed-bf16 is a bf16 program with an fp32 master (parallel.h). */
/* --torch's release (major * 100 + minor) as MAJOR.MINOR */
static const char *torch_str(unsigned v)
{
    static char buf[16];
    snprintf(buf, sizeof buf, "%u.%u", v / 100 % 100, v % 100);
    return buf;
}

static const char *prec_name(const struct mp_report_ctx *c, enum mp_precision p)
{
    return c->train && c->train->par && c->train->par->mixed_bf16 && p == MP_PREC_BF16 ? "mixed-bf16"
                                                                                       : mp_precision_str(p);
}

/* A candidate's precision: mixed-bf16 when its sharding engine keeps the fp32 master. */
static const char *cand_prec(const struct mp_candidate *b)
{
    return b->par.mixed_bf16 && b->precision == MP_PREC_BF16 ? "mixed-bf16" : mp_precision_str(b->precision);
}

static cJSON *json_parallel_of(const struct mp_parallel *par)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "strategy", mp_par_strategy_str(par->strategy));
    ju64(o, "gpus", par->gpus);
    ju64(o, "nodes", par->nodes);
    ju64(o, "world", mp_par_world(par));
    cJSON_AddStringToObject(o, "offload", mp_offload_str(par->offload));
    cJSON_AddStringToObject(o, "offload_device", mp_offload_dev_str(par->offload_device));
    ju64(o, "rank", par->rank); /* probe: the rank whose step ran */
    ju64(o, "ep", par->ep > 1 ? par->ep : 1);
    return o;
}

static void moe_json(cJSON *cf, const struct mp_report_ctx *c);

static const char *const recipe_src[] = {"recipe", "trainer default", "command line", "not used"};

/* config.recipe: the file, its format and trainer, each setting with its key and who won. */
static void recipe_json(cJSON *cf, const struct mp_recipe *rc)
{
    cJSON *o = cJSON_AddObjectToObject(cf, "recipe");
    cJSON_AddStringToObject(o, "format", mp_recipe_format_str(rc->format));
    cJSON_AddStringToObject(o, "trainer", rc->trainer ? rc->trainer : "");
    cJSON_AddStringToObject(o, "path", rc->path);
    cJSON_AddStringToObject(o, "format_from", rc->how);
    cJSON *set = cJSON_AddObjectToObject(o, "settings");
    for (int i = 0; i < MP_RS_N; i++) {
        const struct mp_recipe_setting *s = &rc->s[i];
        if (!s->set)
            continue;
        cJSON *e = cJSON_AddObjectToObject(set, mp_recipe_setting_option((enum mp_recipe_setting_id)i));
        cJSON_AddStringToObject(e, "value", s->value);
        cJSON_AddStringToObject(e, "key", s->key);
        ju64(e, "line", s->line);
        cJSON_AddStringToObject(e, "source", recipe_src[s->src]);
    }
    cJSON *u = cJSON_AddArrayToObject(o, "unknown_keys");
    for (const char *k = rc->unknown; *k;) {
        size_t n = strcspn(k, " ");
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(n < sizeof key ? n : sizeof key - 1), k);
        cJSON_AddItemToArray(u, cJSON_CreateString(key));
        k = strstr(k, ", ");
        k = k ? k + 2 : "";
    }
}

/* "recipe    PATH (TRAINER)" and the settings it made: from the file, the trainer's defaults, and
 * where the command line won; wrapped at 100 columns. */
static void recipe_lines(FILE *out, const struct mp_recipe *rc)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return;
    char p[4 * sizeof rc->path];
    fprintf(f, "recipe    %s (%s)\n", mp_text_clean(rc->path, p, sizeof p), rc->trainer ? rc->trainer : "?");
    static const char *const head[] = {"from the recipe: ", "trainer defaults: ", "command line over the recipe: ",
                                       "not used here: "};
    int groups = 0;
    for (int src = 0; src < 4; src++) {
        int n = 0;
        for (int i = 0; i < MP_RS_N; i++) {
            const struct mp_recipe_setting *s = &rc->s[i];
            if (!s->set || (int)s->src != src || i == MP_RS_MODEL || (i == MP_RS_LOSS && !strcmp(s->value, "hf")))
                continue;
            char v[4 * sizeof s->value];
            if (!n++)
                fprintf(f, "%s%s", groups++ ? "; " : "          ", head[src]);
            else
                fputs(", ", f);
            fprintf(f, "%s %s", mp_recipe_setting_option((enum mp_recipe_setting_id)i),
                    mp_text_clean(s->value, v, sizeof v));
        }
    }
    if (groups)
        fputc('\n', f);
    fclose(f);
    mp_report_fit_text(out, buf, len, MP_TEXT_COLUMNS);
    free(buf);
}

/* suggest --recipe: the keys of the recipe to change so that it runs the recommended plan. */
static void recipe_changes_line(FILE *out, const struct mp_recipe *rc, const struct mp_candidate *b)
{
    struct mp_recipe_change ch[MP_RECIPE_MAX_CHANGES];
    size_t n = mp_recipe_changes(rc, b->micro_batch, b->grad_accum, ch);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return;
    fputs("  in the recipe      ", f);
    for (size_t i = 0; i < n; i++) {
        char k[4 * sizeof ch[i].key], v[4 * sizeof ch[i].from], at[24] = "added";
        if (ch[i].line)
            snprintf(at, sizeof at, "line %u", ch[i].line);
        fprintf(f, "%s%s %s -> %s (%s)", i ? ", " : "", mp_text_clean(ch[i].key, k, sizeof k),
                mp_text_clean(ch[i].from, v, sizeof v), ch[i].to, at);
    }
    fputs(n ? "; --write-recipe OUT writes it\n" : "nothing to change: it runs this plan\n", f);
    fclose(f);
    mp_report_fit_text(out, buf, len, MP_TEXT_COLUMNS);
    free(buf);
}

static cJSON *json_recipe_changes(const struct mp_recipe *rc, const struct mp_candidate *b)
{
    struct mp_recipe_change ch[MP_RECIPE_MAX_CHANGES];
    size_t n = mp_recipe_changes(rc, b->micro_batch, b->grad_accum, ch);
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "setting", mp_recipe_setting_option(ch[i].id));
        cJSON_AddStringToObject(o, "key", ch[i].key);
        ju64(o, "line", ch[i].line);
        cJSON_AddStringToObject(o, "from", ch[i].from);
        cJSON_AddStringToObject(o, "to", ch[i].to);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

/* The loss head and label fraction of the report (suggest has no build: its program's). */
static enum mp_loss loss_of(const struct mp_report_ctx *c)
{
    return c->build ? c->build->loss : c->prog ? c->prog->opts.loss : MP_LOSS_HF;
}
static enum mp_trainer trainer_of(const struct mp_report_ctx *c)
{
    return c->build ? c->build->trainer : c->prog ? c->prog->opts.trainer : MP_TRAINER_SFT;
}

/* How a DPO / KTO step gets its reference log-probs (mp_train_opts.ref), as the reports say it. */
static const char *ref_desc(enum mp_ref_mode r)
{
    return r == MP_REF_COPY ? "a frozen copy" : r == MP_REF_ADAPTER ? "the adapter disabled" : "log-probs precomputed";
}
/* The reference as the trainer has it (GRPO: none at beta 0). */
static const char *ref_desc_of(const struct mp_report_ctx *c)
{
    bool grpo = c->prog && c->prog->opts.trainer == MP_TRAINER_GRPO;
    return grpo && c->train->ref == MP_REF_NONE ? "none (beta 0)" : ref_desc(c->train->ref);
}

/* The optimizer's HF optim name, or what it is where HF has none (Muon). */
static const char *optim_desc(enum mp_optimizer o)
{
    return mp_optimizer_hf(o)[0] ? mp_optimizer_hf(o) : "torch.optim.Muon, AdamW for the rest";
}

/* What a DPO/KTO micro-batch counts: pairs, examples, examples of a KL term (why: its reason). */
static const char *unit_of(enum mp_trainer t, enum mp_loss l, bool why)
{
    if (t == MP_TRAINER_GRPO)
        return "completions (whole groups of num_generations in a generation batch)";
    if (mp_trainer_seqs(t) == 2)
        return "chosen/rejected pairs";
    if (mp_trainer_min_batch(t, l) > 1)
        return why ? "examples (2 or more: the KL term)" : "examples (2 or more)";
    return "examples";
}
static double label_fraction_of(const struct mp_report_ctx *c)
{
    return c->build ? c->build->label_fraction : c->prog ? c->prog->opts.label_fraction : 1.0;
}

/* Packed rows (--packing, --padding-free): "rows", "padding-free", or NULL (batch x seq padded). */
static const char *packing_of(const struct mp_report_ctx *c)
{
    const struct mp_build_opts *o = c->prog ? &c->prog->opts : c->build;
    return !o ? NULL : o->padding_free ? "padding-free" : o->packing ? "rows" : NULL;
}

/* The tokens of a micro-batch of b rows (packed rows are full: no padding). */
static uint64_t packed_tokens(const struct mp_report_ctx *c, uint64_t b)
{
    uint64_t s = c->prog ? c->prog->opts.seq : c->build && c->build->seq ? c->build->seq : c->model->seq_len, t;
    return mp_mul_u64(b, s, &t) ? t : UINT64_MAX;
}

/* The packing line of a report (text): lead, then what the rows hold. */
static void packing_line(FILE *out, const struct mp_report_ctx *c, uint64_t b, const char *lead)
{
    uint64_t t = packed_tokens(c, b);
    if (c->prog && c->prog->opts.padding_free && b == 1)
        fprintf(out, "%s%llu tokens per micro-batch in one row (padding-free)\n", lead, (unsigned long long)t);
    else if (c->prog && c->prog->opts.padding_free)
        fprintf(out, "%s%llu tokens per micro-batch in one row (padding-free: %llu rows concatenated)\n", lead,
                (unsigned long long)t, (unsigned long long)b);
    else
        fprintf(out, "%s%llu tokens per micro-batch (%llu rows of packed documents, no padding)\n", lead,
                (unsigned long long)t, (unsigned long long)b);
}

/* config.images (--images): the images per sample, their tokens and sizes as the step runs them;
 * estimate's, plan's and check's config and suggest's alike */
static void json_images(cJSON *cf, const struct mp_report_ctx *c)
{
    if (!c->model->images)
        return;
    const struct mp_vision *v = &c->model->vision;
    cJSON *im = cJSON_AddObjectToObject(cf, "images");
    ju64(im, "per_sample", c->model->images);
    ju64(im, "tokens_each", v->tokens);
    if (v->image) /* Gemma 3, Mistral 3: the config's (Qwen's has none) */
        ju64(im, "image_size", v->image);
    if (v->asked_h) { /* --image-size as given */
        ju64(im, "asked_height", v->asked_h);
        ju64(im, "asked_width", v->asked_w);
    }
    ju64(im, "height", c->model->height); /* after the processor's resize (--image-size) */
    ju64(im, "width", c->model->width);
    if (v->kind == MP_VIS_LLAMA4) { /* Llama 4: the canvas's tiles and the global one */
        ju64(im, "tiles", v->tiles);
        ju64(im, "patches", v->tiles * (v->image / v->patch) * (v->image / v->patch));
    } else
        ju64(im, "patches", (c->model->height / v->patch) * (c->model->width / v->patch));
    ju64(im, "vision_layers", v->layers);
}

static cJSON *json_root(const struct mp_report_ctx *c)
{
    cJSON *r = cJSON_CreateObject();
    jnum(r, "schema", 1);
    cJSON_AddStringToObject(r, "command", c->command);
    cJSON_AddStringToObject(r, "version", MEMPLAN_VERSION);
    cJSON *m = cJSON_AddObjectToObject(r, "model");
    cJSON_AddStringToObject(m, "name", c->model->name);
    cJSON_AddStringToObject(m, "source", strcmp(c->model->source, "hf") == 0 ? "hf" : "memplan");
    cJSON_AddStringToObject(m, "path", c->model->path);
    if (c->model->hf_class[0])
        cJSON_AddStringToObject(m, "class", c->model->hf_class);
    if (c->prog) {
        ju64(m, "params", c->prog->total_params);
        ju64(m, "trainable_params", c->prog->trainable_params);
    }
    if (c->model->idle.params) /* a multimodal checkpoint's vision tower and projector: resident, unused */
        ju64(m, "unused_params", c->model->idle.params);
    ju64(m, "n_layers", c->model->n_blocks);
    if (c->build) {
        cJSON *cf = cJSON_AddObjectToObject(r, "config");
        ju64(cf, "batch", c->build->batch);
        ju64(cf, "seq_len", c->prog ? c->prog->opts.seq : c->build->seq ? c->build->seq : c->model->seq_len);
        if (c->model->enc_dec) /* the decoder's length (encoder-decoders) */
            ju64(cf, "target_seq_len", c->prog ? c->prog->opts.target_seq
                                       : c->build->target_seq ? c->build->target_seq
                                       : c->build->seq ? c->build->seq : c->model->seq_len);
        json_images(cf, c);
        cJSON_AddStringToObject(cf, "precision", prec_name(c, c->build->precision));
        cJSON_AddStringToObject(cf, "optimizer", mp_optimizer_str(c->train->optimizer));
        if (mp_optimizer_hf(c->train->optimizer)[0]) /* TrainingArguments optim (Muon has none) */
            cJSON_AddStringToObject(cf, "optimizer_hf", mp_optimizer_hf(c->train->optimizer));
        char sb[32];
        cJSON_AddStringToObject(cf, "checkpoint", c->ckpt ? mp_ckpt_spec_str(c->ckpt, sb, sizeof sb) : "none");
        cJSON_AddStringToObject(cf, "attention", mp_attn_impl_str(c->build->attention));
        if (c->build->torch) /* (only with --torch: the output without it is as it was) */
            cJSON_AddStringToObject(cf, "torch", torch_str(c->build->torch));
        if (c->prog &&
            c->prog->sdpa_math) /* SDPA's kernel, where it is not a fused one (ir lower_attention.c sdpa_math) */
            cJSON_AddStringToObject(cf, "sdpa_kernel", "math");
        else if (c->prog && c->prog->sdpa_backend != MP_SDPA_UNKNOWN) /* with a target: the one torch picks */
            cJSON_AddStringToObject(cf, "sdpa_kernel", mp_sdpa_backend_str((enum mp_sdpa_backend)c->prog->sdpa_backend));
        cJSON_AddStringToObject(cf, "loss", mp_loss_str(c->build->loss));
        cJSON_AddNumberToObject(cf, "label_fraction", c->build->label_fraction);
        if (packing_of(c)) { /* (only with packing: the output without it is as it was) */
            cJSON_AddStringToObject(cf, "packing", packing_of(c));
            ju64(cf, "tokens_per_micro_batch", packed_tokens(c, c->build->batch));
        }
        cJSON_AddBoolToObject(cf, "grad_accumulation", c->train->accumulate);
        if (c->build->trainer != MP_TRAINER_SFT) { /* (sft's JSON stays as it was) */
            cJSON_AddStringToObject(cf, "trainer", mp_trainer_str(c->build->trainer));
            ju64(cf, "sequences", c->build->batch * mp_trainer_seqs(c->build->trainer));
            cJSON_AddStringToObject(cf, "reference", mp_ref_mode_str(c->train->ref));
            cJSON_AddBoolToObject(cf, "disable_dropout", c->disable_dropout);
        }
        if (c->build->trainer == MP_TRAINER_GRPO) { /* GRPOConfig's generation settings, as planned */
            const struct mp_train_opts *t = c->train;
            cJSON *g = cJSON_AddObjectToObject(cf, "grpo");
            ju64(g, "completion_length", c->build->completion);
            ju64(g, "num_generations", c->num_generations);
            if (c->steps_per_generation) /* (absent: TRL's default, the accumulation steps) */
                ju64(g, "steps_per_generation", c->steps_per_generation);
            ju64(g, "num_iterations", c->num_iterations);
            cJSON_AddNumberToObject(g, "beta", c->beta);
            cJSON_AddNumberToObject(g, "temperature", c->temperature);
            cJSON_AddNumberToObject(g, "top_p", c->top_p);
            ju64(g, "top_k", c->top_k);
            if (c->min_p >= 0)
                cJSON_AddNumberToObject(g, "min_p", c->min_p);
            else
                cJSON_AddNullToObject(g, "min_p");
            cJSON_AddNumberToObject(g, "repetition_penalty", c->rep_penalty);
            cJSON_AddStringToObject(g, "vllm", t->vllm_fraction > 0 ? "colocate" : t->vllm_server ? "server" : "none");
            if (t->vllm_fraction > 0)
                cJSON_AddNumberToObject(g, "vllm_gpu_memory_utilization", t->vllm_fraction);
            if (t->vllm_fraction > 0 || t->vllm_server)
                cJSON_AddBoolToObject(g, "vllm_correction", c->vllm_is_correction);
            cJSON_AddBoolToObject(g, "old_logprobs_forward", t->old_logps);
            cJSON_AddBoolToObject(g, "ds3_gather_for_generation", c->ds3_gather);
        }
        moe_json(cf, c);
        /* transformers' use_cache in training (HF decoders; off under gradient checkpointing) */
        cJSON_AddBoolToObject(cf, "use_cache", c->model->use_cache && !c->build->hf_checkpointing);
        const struct mp_finetune *f = &c->build->ft;
        cJSON *ft = cJSON_AddObjectToObject(cf, "finetune");
        cJSON_AddStringToObject(ft, "mode", mp_ft_mode_str(f->mode));
        if (f->mode == MP_FT_LORA || f->mode == MP_FT_QLORA) {
            char tg[160];
            mp_finetune_describe_targets(f, c->model->hf_type, tg, sizeof tg);
            char *sp = strchr(tg, ' ');
            if (sp)
                *sp = 0; /* the names only */
            ju64(ft, "lora_r", f->r);
            cJSON_AddNumberToObject(ft, "lora_alpha", f->alpha);
            cJSON_AddNumberToObject(ft, "lora_dropout", f->dropout);
            cJSON_AddStringToObject(ft, "lora_targets", tg);
            if (c->prog)
                ju64(ft, "adapter_params", c->prog->adapter_params);
        }
        const struct mp_quant *q = c->model->quant.kind != MP_Q_NONE ? &c->model->quant
                                   : f->mode == MP_FT_QLORA                ? &f->quant
                                                                           : NULL;
        cJSON_AddStringToObject(ft, "base_quant", q ? mp_quant_kind_str(q->kind) : "none");
        if (q && (q->kind == MP_Q_BNB_NF4 || q->kind == MP_Q_BNB_FP4)) {
            cJSON_AddBoolToObject(ft, "double_quant", q->double_quant);
            bool sharded = c->train->par && mp_par_sharded_params(c->train->par->strategy);
            cJSON_AddStringToObject(ft, "quant_storage", mp_quant_storage_str(mp_quant_storage(q, sharded)));
        }
        if (c->train->par)
            cJSON_AddItemToObject(cf, "parallel", json_parallel_of(c->train->par));
        if (c->recipe)
            recipe_json(cf, c->recipe);
    } else { /* suggest: the recommendation holds the settings; config what it does not search */
        cJSON *cf = cJSON_AddObjectToObject(r, "config");
        if (c->recipe)
            recipe_json(cf, c->recipe);
        cJSON_AddStringToObject(cf, "loss", mp_loss_str(loss_of(c)));
        cJSON_AddNumberToObject(cf, "label_fraction", label_fraction_of(c));
        if (packing_of(c))
            cJSON_AddStringToObject(cf, "packing", packing_of(c));
        if (trainer_of(c) != MP_TRAINER_SFT) /* (sft's JSON stays as it was) */
            cJSON_AddStringToObject(cf, "trainer", mp_trainer_str(trainer_of(c)));
        json_images(cf, c);
    }
    if (c->gpu) {
        cJSON *g = cJSON_AddObjectToObject(r, "target");
        cJSON_AddStringToObject(g, "name", c->gpu->name);
        cJSON_AddStringToObject(g, "how", c->target_how ? c->target_how : "");
        ju64(g, "memory_bytes", c->gpu->memory_bytes);
        ju64(g, "capacity_bytes", mp_gpu_capacity(c->gpu));
        ju64(g, "context_bytes", c->gpu->context_bytes);
    }
    return r;
}

/* The two verdicts' fields of a fit. */
static void json_levels(cJSON *o, const struct mp_fit *f)
{
    cJSON_AddBoolToObject(o, "fits_allocated", f->fits_allocated);
    cJSON_AddBoolToObject(o, "device_simulated", f->device_simulated);
    if (!f->device_simulated)
        return;
    cJSON_AddBoolToObject(o, "fits_device", f->fits_device);
    ju64(o, "device_bytes", f->device_bytes);
    ju64(o, "allocator_limit_bytes", f->alloc_limit);
    if (f->expandable_fits)
        cJSON_AddBoolToObject(o, "expandable_segments_would_fit", true);
}

/* The ops --checkpoint ...+sac:auto keeps in each checkpointed layer, as torch counts them in a
 * layer ("sdpa", "mm:J": the layer's J-th aten.mm), each with its node's name: at most n, into
 * names[] and nodes[]; their number. */
static size_t sac_kept_ops(const struct mp_program *p, uint64_t keep, char names[][16], const char **nodes, size_t n)
{
    size_t m = 0;
    int blk = -1;
    for (size_t k = 0; p && k < p->n_nodes && m < n; k++) {
        int mm, j = mp_sac_candidate(p, k, &mm);
        if (j < 0 || (blk >= 0 && p->nodes[k].block != blk))
            continue;
        blk = p->nodes[k].block;
        if (j >= 64 || !(keep >> j & 1))
            continue;
        if (mm >= 0)
            snprintf(names[m], sizeof names[m], "mm:%d", mm);
        else
            snprintf(names[m], sizeof names[m], "sdpa");
        nodes[m++] = p->nodes[k].name;
    }
    return m;
}

/* NCCL's bytes per rank as the fit counted them (search.c: mp_fit_eval). */
static void nccl_of(const struct mp_report_ctx *c, const struct mp_estimate *e, struct mp_nccl_est *n)
{
    static const struct mp_gpu none;
    memset(n, 0, sizeof *n);
    if (e->world > 1)
        mp_nccl_estimate(c->gpu ? c->gpu : &none, c->train ? c->train->par : NULL, c->train ? c->train->nccl : NULL, n);
}

/* Whether the context's figure holds NCCL's buffers. */
static bool nccl_shown(const struct mp_report_ctx *c, const struct mp_estimate *e)
{
    struct mp_nccl_est n;
    nccl_of(c, e, &n);
    return n.bytes > 0;
}

static void json_memory(cJSON *r, const struct mp_report_ctx *c, const struct mp_estimate *e)
{
    cJSON *m = cJSON_AddObjectToObject(r, "memory");
    ju64(m, "weights_bytes", e->weights_bytes);
    ju64(m, "grads_bytes", e->grads_bytes);
    ju64(m, "optimizer_bytes", e->optimizer_bytes);
    ju64(m, "activations_bytes", e->activations_bytes);
    ju64(m, "input_bytes", e->input_bytes);
    ju64(m, "module_buffers_bytes", e->module_buffers_bytes);
    ju64(m, "workspace_bytes", e->workspace_bytes);
    ju64(m, "optimizer_tmp_bytes", e->optimizer_tmp_bytes);
    ju64(m, "peak_allocated_bytes", e->peak_allocated_bytes);
    ju64(m, "peak_requested_bytes", e->peak_requested_bytes);
    ju64(m, "peak_reserved_bytes", e->peak_reserved_bytes);
    ju64(m, "overhead_bytes", e->overhead_bytes);
    ju64(m, "peak_device_bytes", e->peak_device_bytes);
    cJSON *al = cJSON_AddObjectToObject(m, "allocator");
    char conf[200] = "";
    if (c->train && c->train->alloc)
        mp_alloc_conf_str(c->train->alloc, conf, sizeof conf);
    cJSON_AddStringToObject(al, "settings", conf);
    cJSON_AddStringToObject(al, "source", conf[0] && c->alloc_from && c->alloc_from[0] ? c->alloc_from : "default");
    cJSON_AddBoolToObject(al, "simulated", e->alloc_simulated);
    if (e->alloc_simulated) {
        ju64(al, "reserved_fragmentation_bytes", e->reserved_frag_bytes);
        ju64(al, "num_alloc_retries", e->alloc_retries);
        ju64(al, "failed_allocations", e->alloc_ooms);
        ju64(m, "device_reserved_bytes", e->peak_reserved_bytes + e->overhead_bytes);
    }
    cJSON_AddStringToObject(m, "peak_event", e->peak_event);
    cJSON_AddStringToObject(m, "peak_phase", mp_phase_str(e->peak_phase));
    bool ref = c->train && c->train->ref != MP_REF_NONE, gen = c->train && c->train->gen_steps,
         old = c->train && c->train->old_logps;
    if (ref || gen || old) { /* DPO's, KTO's and GRPO's phases (estimate.h) */
        if (ref)
            ju64(m, "ref_weights_bytes", e->ref_weights_bytes);
        cJSON *ph = cJSON_AddObjectToObject(m, "phases");
        cJSON *pp = cJSON_AddObjectToObject(ph, "policy_step");
        ju64(pp, "peak_allocated_bytes", e->policy_peak_bytes);
        if (ref) {
            cJSON *rf = cJSON_AddObjectToObject(ph, "reference_forward");
            ju64(rf, "peak_allocated_bytes", e->ref_forward_peak_bytes);
            ju64(rf, "tmp_bytes", e->ref_forward_tmp_bytes);
            cJSON_AddStringToObject(rf, "peak_event", e->ref_forward_event);
        }
        if (gen) {
            cJSON *g = cJSON_AddObjectToObject(ph, "generation");
            ju64(g, "peak_allocated_bytes", e->gen_peak_bytes);
            ju64(g, "prefill_peak_bytes", e->gen_prefill_peak_bytes);
            ju64(g, "decode_peak_bytes", e->gen_decode_peak_bytes);
            ju64(g, "kv_cache_bytes", e->gen_kv_bytes);
            ju64(g, "sequences", e->gen_batch);
            cJSON_AddStringToObject(g, "peak_event", e->gen_event);
            if (e->gen_gather) { /* (ZeRO-3 and FSDP2: what the decoding forward holds gathered) */
                cJSON_AddStringToObject(g, "gather", e->gen_gather);
                ju64(g, "gathered_bytes", e->gen_gathered_bytes);
            }
        }
        if (old) {
            cJSON *o = cJSON_AddObjectToObject(ph, "old_logprobs_forward");
            ju64(o, "peak_allocated_bytes", e->old_forward_peak_bytes);
            cJSON_AddStringToObject(o, "peak_event", e->old_forward_event);
        }
    }
    if (e->load_bytes) /* FSDP2 with a 4-bit base: the model whole on the GPU when loaded */
        ju64(m, "load_bytes", e->load_bytes);
    if (e->vllm_bytes) /* GRPO's colocated vLLM */
        ju64(m, "vllm_bytes", e->vllm_bytes);
    jnum(m, "fwd_flops", e->fwd_flops);
    jnum(m, "bwd_flops", e->bwd_flops);
    jnum(m, "recompute_flops", e->recompute_flops);
    if (e->dequant_bytes > 0) /* a quantized base */
        jnum(m, "dequant_bytes", e->dequant_bytes);
    if (e->host_pinned_bytes) { /* --checkpoint layers+offload, --act-offload */
        ju64(m, "host_pinned_bytes", e->host_pinned_bytes);
        if (e->act_offload_pcie_bytes)
            ju64(m, "act_offload_pcie_bytes", e->act_offload_pcie_bytes);
        else
            jnum(m, "ckpt_offload_pcie_bytes", 2.0 * (double)e->ckpt_offload_bytes);
    }
    if (e->sac_policy != MP_SAC_NONE) { /* --checkpoint ...+sac */
        cJSON_AddStringToObject(m, "sac_policy", mp_sac_str(e->sac_policy));
        ju64(m, "sac_layer_bytes", e->sac_layer_bytes);
        ju64(m, "sac_layers", e->sac_layers);
        if (e->sac_policy == MP_SAC_AUTO) { /* what the planner keeps */
            char names[64][16];
            const char *nodes[64];
            size_t n = sac_kept_ops(c->prog, e->sac_keep, names, nodes, 64);
            cJSON *a = cJSON_AddArrayToObject(m, "sac_keep");
            for (size_t i = 0; a && i < n; i++)
                cJSON_AddItemToArray(a, cJSON_CreateString(names[i]));
        }
    }
    if (e->world > 1 || e->host_bytes || e->buffers_bytes) { /* data parallel: per rank */
        ju64(m, "world", e->world);
        ju64(m, "buffers_bytes", e->buffers_bytes);
        ju64(m, "host_bytes", e->host_bytes);
        ju64(m, "nvme_bytes", e->nvme_bytes);
        /* NCCL's communicator memory (in overhead_bytes): the profile's figure or the model's
         * (search/nccl.h); 0 = not counted */
        struct mp_nccl_est nc;
        nccl_of(c, e, &nc);
        ju64(m, "nccl_overhead_bytes", nc.bytes);
        cJSON *nj = cJSON_AddObjectToObject(m, "nccl");
        const struct mp_nccl_env *ne = c->train ? c->train->nccl : NULL;
        cJSON_AddStringToObject(nj, "source", !nc.counted ? "none" : nc.profile ? "profile" : "model");
        cJSON_AddStringToObject(nj, "why", c->gpu ? nc.why : "no GPU profile");
        ju64(nj, "comms", nc.comms);
        ju64(nj, "channels", nc.channels);
        ju64(nj, "peers", nc.peers);
        ju64(nj, "peer_bytes", nc.peer_bytes);
        ju64(nj, "nvls_bytes", nc.nvls_bytes);
        ju64(nj, "ep_p2p_channels", nc.p2p_channels);
        ju64(nj, "ep_bytes", nc.ep_bytes);
        ju64(nj, "efsdp_bytes", nc.efsdp_bytes);
        ju64(nj, "buffsize_bytes", ne ? ne->buff[2] : MP_NCCL_SIMPLE_BYTES);
        cJSON_AddStringToObject(nj, "env", ne ? ne->set : "");
        if (e->ep > 1) { /* --ep: the experts' share of the per-rank figures */
            cJSON *x = cJSON_AddObjectToObject(m, "experts");
            ju64(x, "ep", e->ep);
            ju64(x, "efsdp", e->efsdp);
            ju64(x, "weights_bytes", e->expert_weights_bytes);
            ju64(x, "grads_bytes", e->expert_grads_bytes);
            ju64(x, "optimizer_bytes", e->expert_optimizer_bytes);
            ju64(x, "gathered_unit_bytes", e->expert_gather_bytes);
        }
        cJSON *cm = cJSON_AddObjectToObject(m, "comm_per_step");
        jnum(cm, "allgather_bytes", e->allgather_bytes);
        jnum(cm, "reducescatter_bytes", e->reducescatter_bytes);
        jnum(cm, "allreduce_bytes", e->allreduce_bytes);
        jnum(cm, "pcie_bytes", e->pcie_bytes);
        jnum(cm, "comm_s", e->comm_s);
        jnum(cm, "exposed_comm_s", e->exposed_comm_s);
        jnum(cm, "offload_s", e->offload_s);
    }
}

static void json_layers(cJSON *r, const struct mp_report_ctx *c, const struct mp_estimate *e)
{
    cJSON *a = cJSON_AddArrayToObject(r, "layers");
    for (size_t i = 0; i < e->n_blocks; i++) {
        const struct mp_block_est *b = &e->blocks[i];
        cJSON *o = cJSON_CreateObject();
        ju64(o, "index", i);
        cJSON_AddStringToObject(o, "name", c->model->blocks[i].name);
        char t[64];
        block_type(&c->model->blocks[i], t, sizeof t);
        cJSON_AddStringToObject(o, "type", t);
        ju64(o, "params", b->params);
        ju64(o, "weights_bytes", b->weights_bytes);
        ju64(o, "grads_bytes", b->grads_bytes);
        ju64(o, "optimizer_bytes", b->optimizer_bytes);
        ju64(o, "activation_bytes", b->activation_bytes);
        ju64(o, "output_bytes", b->output_bytes);
        jnum(o, "fwd_flops", b->fwd_flops);
        jnum(o, "bwd_flops", b->bwd_flops);
        cJSON_AddBoolToObject(o, "checkpointed", b->checkpointed);
        cJSON_AddItemToArray(a, o);
    }
}

static cJSON *json_plan(const struct mp_ckpt_plan *p, double base_flops)
{
    cJSON *o = cJSON_CreateObject();
    char sb[32];
    cJSON_AddStringToObject(o, "strategy", mp_ckpt_spec_str(&p->spec, sb, sizeof sb));
    cJSON *ck = cJSON_AddArrayToObject(o, "checkpoints");
    for (size_t i = 0; i < p->L; i++)
        if (p->checkpointed[i])
            cJSON_AddItemToArray(ck, cJSON_CreateNumber((double)i));
    cJSON *sg = cJSON_AddArrayToObject(o, "segments");
    for (size_t i = 0; i < p->n_segments; i++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)p->segments[i][0]));
        cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)p->segments[i][1]));
        cJSON_AddItemToArray(sg, pair);
    }
    cJSON_AddBoolToObject(o, "multilevel", p->multilevel);
    ju64(o, "activation_peak_bytes", p->peak_bytes);
    jnum(o, "recompute_flops", p->recompute_cost);
    jnum(o, "overhead_pct", base_flops > 0 ? 100.0 * p->recompute_cost / base_flops : 0);
    return o;
}

static void print_json(FILE *out, cJSON *r)
{
    char *raw = cJSON_Print(r);
    char *s = raw ? mp_utf8_fix(raw) : NULL; /* names are bytes from the model file */
    free(raw);
    if (s) {
        fputs(s, out);
        fputc('\n', out);
        free(s);
    }
    cJSON_Delete(r);
}

/* ---- text helpers ------------------------------------------------------------------------- */

/* What trains and the assumptions behind it (docs/memory-facts.md#lora,
 * docs/memory-facts.md#qlora). */
static void finetune_lines(FILE *out, const struct mp_report_ctx *c)
{
    const struct mp_finetune *f = &c->build->ft;
    const struct mp_program *p = c->prog;
    char tg[160], tp[32];
    snprintf(tp, sizeof tp, "%s", count(p->trainable_params));
    if (f->mode == MP_FT_FREEZE) {
        fprintf(out, "finetune  freeze: %s of %s params train; frozen blocks keep no .grad, no optimizer state\n", tp,
                count(p->total_params));
        return;
    }
    mp_finetune_describe_targets(f, c->model->hf_type, tg, sizeof tg);
    fprintf(out, "finetune  %s r %llu, alpha %g, dropout %g, targets %s\n", mp_ft_mode_str(f->mode),
            (unsigned long long)f->r, f->alpha, f->dropout, shown(tg));
    fprintf(out, "          %s adapter params train (%s); the frozen base has no .grad\n", count(p->adapter_params),
            f->adapters_cast == MP_AC_FSDP2       ? "cast by FSDP2's mixed-bf16 policy"
            : f->adapters_cast == MP_AC_DEEPSPEED ? "bf16: DeepSpeed's bf16 casts every parameter"
            : f->adapters_cast == MP_AC_ZERO3_TRL ? "the base's dtype, as TRL makes them under ZeRO-3"
            : f->adapters_cast == MP_AC_TRL_QUANT ? "bf16: TRL's trainer casts them on a 4/8-bit base"
                                                  : "fp32 as peft makes them");
    if (p->trainable_params > p->adapter_params) /* ir/build.c saved_module: peft's modules_to_save */
        fprintf(out, "          + %s task-head params train whole beside a frozen copy (peft's modules_to_save)\n",
                count(p->trainable_params - p->adapter_params));
    const struct mp_quant *q = c->model->quant.kind != MP_Q_NONE ? &c->model->quant
                               : f->mode == MP_FT_QLORA                ? &f->quant
                                                                       : NULL;
    if (q && (q->kind == MP_Q_BNB_NF4 || q->kind == MP_Q_BNB_FP4))
        fprintf(out, "          base %s, blocksize %llu, double quant %s (%s), dequantized per matmul;\n"
                     "          embeddings, norms, lm_head in %s\n",
                mp_quant_kind_str(q->kind), (unsigned long long)q->blocksize, q->double_quant ? "on" : "off",
                c->model->quant.kind != MP_Q_NONE ? "quantization_config" : "QLoRA recipe",
                p->param_dtype == MP_DT_F32 ? "fp32 (as prepare_model_for_kbit_training casts them)"
                                            : "bf16 (prepare_model_for_kbit_training would make them fp32)");
    else if (q)
        fprintf(out, "          base %s (quantization_config), dequantized per matmul in forward and backward\n",
                mp_quant_kind_str(q->kind));
    if (f->input_grad)
        fprintf(out, "          checkpointing: enable_input_require_grads keeps the embedding output and its grad\n");
}

/* suggest: the fine-tuning assumptions in two lines (no program at hand). */
static void finetune_assumptions(FILE *out, const struct mp_report_ctx *c)
{
    char tg[160];
    mp_finetune_describe_targets(c->ft, c->model->hf_type, tg, sizeof tg);
    fprintf(out, "finetune  r %llu, alpha %g, dropout %g, targets %s\n", (unsigned long long)c->ft->r, c->ft->alpha,
            c->ft->dropout, shown(tg));
    /* (each candidate's own: mp_par_adapters_cast) */
    fprintf(out, "          adapters fp32 as peft makes them, bf16 where DeepSpeed's or FSDP2's bf16 or TRL's\n"
                 "          trainer on a 4/8-bit base casts them; frozen base (no .grad); qlora: bnb NF4 base,\n"
                 "          double quant, blocksize 64\n");
}

/* ---- mixture of experts: the routing assumption ------------------------------------------ */

/* The first MoE layer of the model and how many there are (HF configs give every MoE layer the
 * same experts and top-k), or NULL. */
static const struct mp_layer *moe_first(const struct mp_model *m, uint64_t *n)
{
    const struct mp_layer *f = NULL;
    *n = 0;
    for (size_t i = 0; i < m->n_blocks; i++)
        for (size_t j = 0; j < m->blocks[i].n_layers; j++)
            if (m->blocks[i].layers[j].moe.experts) {
                f = f ? f : &m->blocks[i].layers[j];
                (*n)++;
            }
    return f;
}

struct moe_rows {
    uint64_t tokens, routed, uniform, busiest; /* tokens = 0: not known (suggest's many batches) */
};

/* Routed rows per MoE layer: tokens x top-k, spread over the experts (uniform: routed / E; the
 * busiest expert --moe-capacity times that, at most one row per token). */
static struct moe_rows moe_rows_of(const struct mp_report_ctx *c, const struct mp_layer *l)
{
    struct moe_rows r = {0, 0, 0, 0};
    if (!c->prog || c->model->input != MP_INPUT_TOKENS)
        return r;
    double cap = c->moe_capacity >= 1 ? c->moe_capacity : 1;
    r.tokens = c->prog->opts.batch * c->prog->opts.seq; /* both checked when the program was built */
    r.routed = r.tokens * l->moe.top_k;
    r.uniform = mp_ceil_div(r.routed, l->moe.experts);
    double b = ceil((double)r.routed * cap / (double)l->moe.experts);
    r.busiest = b >= (double)r.tokens ? r.tokens : (uint64_t)b;
    return r;
}

/* --ep's N (0: none): the program's, else the plan's (suggest). */
static uint64_t ep_of(const struct mp_report_ctx *c)
{
    if (c->prog && c->prog->opts.ep > 1)
        return c->prog->opts.ep;
    if (c->build && c->build->ep > 1)
        return c->build->ep;
    return c->train && c->train->par && c->train->par->ep > 1 ? c->train->par->ep : 0;
}

/* --ep: the rows the busiest rank's experts receive per layer, as the program lowers them. */
static uint64_t ep_received(const struct mp_report_ctx *c, const struct mp_layer *l)
{
    uint64_t ep = ep_of(c);
    return mp_moe_ep_rows(c->prog->opts.batch * c->prog->opts.seq, l->moe.top_k, l->moe.experts / ep, ep,
                          c->moe_capacity);
}

static void moe_json(cJSON *cf, const struct mp_report_ctx *c)
{
    uint64_t n;
    const struct mp_layer *l = moe_first(c->model, &n);
    if (!l)
        return;
    struct moe_rows r = moe_rows_of(c, l);
    cJSON *o = cJSON_AddObjectToObject(cf, "moe");
    ju64(o, "layers", n);
    ju64(o, "experts", l->moe.experts);
    ju64(o, "top_k", l->moe.top_k);
    jnum(o, "capacity", c->moe_capacity >= 1 ? c->moe_capacity : 1);
    cJSON_AddStringToObject(o, "routing", c->moe_capacity > 1 ? "capacity" : "uniform");
    cJSON_AddStringToObject(o, "experts_implementation", "grouped_mm");
    if (r.tokens) {
        ju64(o, "routed_rows", r.routed);
        ju64(o, "rows_per_expert", r.uniform);
        ju64(o, "busiest_expert_rows", r.busiest);
    }
    uint64_t ep = ep_of(c);
    if (ep > 1) {
        ju64(o, "ep", ep);
        ju64(o, "experts_per_rank", l->moe.experts / ep);
        if (r.tokens)
            ju64(o, "received_rows_per_rank", ep_received(c, l));
    }
    cJSON_AddBoolToObject(o, "capacity_changes_memory", ep > 1);
}

static void moe_lines(FILE *out, const struct mp_report_ctx *c)
{
    uint64_t n;
    const struct mp_layer *l = moe_first(c->model, &n);
    if (!l)
        return;
    struct moe_rows r = moe_rows_of(c, l);
    double cap = c->moe_capacity >= 1 ? c->moe_capacity : 1;
    char share[96];
    if (r.tokens && cap > 1)
        snprintf(share, sizeof share, "busiest expert %g x uniform: %s of %s routed rows", cap, count(r.busiest),
                 count(r.routed));
    else if (r.tokens)
        snprintf(share, sizeof share, "uniform routing: %s of %s routed rows per expert", count(r.uniform),
                 count(r.routed));
    else
        snprintf(share, sizeof share, "%s routing: tokens x %llu / %llu rows per expert",
                 cap > 1 ? "imbalanced" : "uniform", (unsigned long long)l->moe.top_k,
                 (unsigned long long)l->moe.experts);
    if (l->moe.router == MP_ROUTER_DENSE_SIGMOID) { /* Llama 4: no dispatch (lower_mlp.c lower_dense_moe) */
        fprintf(out, "moe       %llu MoE layers, %llu experts, top-%llu; every token runs through every expert\n"
                     "          (Llama 4's bmm over experts x tokens rows, unchosen experts scaled by 0), so\n"
                     "          --moe-capacity changes no tensor\n",
                (unsigned long long)n, (unsigned long long)l->moe.experts, (unsigned long long)l->moe.top_k);
        return;
    }
    fprintf(out, "moe       %llu MoE layers, %llu experts, top-%llu; %s\n", (unsigned long long)n,
            (unsigned long long)l->moe.experts, (unsigned long long)l->moe.top_k, share);
    uint64_t ep = ep_of(c);
    if (ep > 1) {
        fprintf(out, "          ep %llu: %llu expert%s per rank (DistributedConfig ep_size), fed by AllToAllEP's\n"
                     "          all-to-all: a rank's experts get %s rows per layer (%s; --moe-capacity\n"
                     "          raises the busiest rank's)\n",
                (unsigned long long)ep, (unsigned long long)(l->moe.experts / ep), l->moe.experts / ep > 1 ? "s" : "",
                r.tokens ? count(ep_received(c, l)) : "tokens x top-k", cap > 1 ? "the busiest rank" : "uniform routing");
        return;
    }
    fprintf(out, "          experts run as transformers' grouped_mm: every routed row in one grouped GEMM, so\n"
                 "          how tokens split over experts (--moe-capacity) changes no tensor\n");
}

static void header(FILE *out, const struct mp_report_ctx *c)
{
    fprintf(out, "model     %s (%s, %s params, %zu blocks)\n", shown(c->model->name),
            strcmp(c->model->source, "hf") == 0 ? "HF config" : "memplan JSON",
            c->prog ? count(c->prog->total_params) : "?", c->model->n_blocks);
    if (c->model->hf_class[0]) { /* the class planned: architectures[0], or what --head made of it */
        char lb[48] = "", how[64] = "";
        if (c->num_labels)
            snprintf(lb, sizeof lb, ", %llu labels", (unsigned long long)c->num_labels);
        if (c->head || c->num_labels)
            snprintf(how, sizeof how, " (%s%s%s%s)", c->head ? "--head " : "", c->head ? c->head : "",
                     c->head && c->num_labels ? ", " : "", c->num_labels ? "--num-labels" : "");
        fprintf(out, "class     %s%s%s\n", shown(c->model->hf_class), lb, how);
    }
    if (c->model->idle.params) /* a multimodal checkpoint (model.h struct mp_idle) */
        fprintf(out, "text-only %s params (%s)\n"
                     "          resident, unused: no .grad, no optimizer state, no activations\n"
                     "          (steps with --images: gemma3, mistral3, qwen2_vl, qwen2_5_vl, llama4)\n",
                count(c->model->idle.params), c->model->idle.what);
    if (c->model->images) { /* --images: the vision tower runs (model_hf_vision.c mp_hf_add_images) */
        const struct mp_vision *v = &c->model->vision;
        uint64_t h = c->model->height, w = c->model->width;
        /* the size used, and where it came from: the size asked (--image-size) or the default */
        char src[96], asked[48] = "";
        bool qwen = MP_VIS_IS_QWEN(v->kind);
        if (v->asked_h)
            snprintf(asked, sizeof asked, "--image-size %llux%llu", (unsigned long long)v->asked_h,
                     (unsigned long long)v->asked_w);
        if (qwen)
            snprintf(src, sizeof src, "%s, %s by smart_resize", v->asked_h ? asked : "the default 448x448",
                     v->asked_h && (v->asked_h != h || v->asked_w != w) ? "resized" : "kept");
        else if (v->kind == MP_VIS_PIXTRAL || v->kind == MP_VIS_LLAMA4)
            snprintf(src, sizeof src, "%s", v->asked_h ? asked : "the default: vision_config.image_size");
        else
            snprintf(src, sizeof src, "%s%svision_config.image_size", asked, v->asked_h ? ", " : "");
        if (v->kind == MP_VIS_LLAMA4) /* Llama4ImageProcessor's canvas of tiles (model_hf_vision.c) */
            fprintf(out, "images    %llu per sample (%s): %llu x %llu tiles of %llu px%s\n"
                         "          %llu tiles x %llu patches each through the vision model (%llu layers)\n"
                         "          %llu tokens each in --seq (patch tokens, tile separators)\n",
                    (unsigned long long)c->model->images, src, (unsigned long long)v->tile_rows,
                    (unsigned long long)v->tile_cols, (unsigned long long)v->image,
                    v->tiles > 1 ? " + the global tile" : "", (unsigned long long)v->tiles,
                    (unsigned long long)((v->image / v->patch) * (v->image / v->patch) + 1),
                    (unsigned long long)v->layers, (unsigned long long)v->tokens);
        else if (v->kind == MP_VIS_MLLAMA) /* every image padded to max_num_tiles tiles (model_hf_vision.c) */
            fprintf(out, "images    %llu per sample: %llu tiles of %llu px each (max_num_tiles, whatever its size)\n"
                         "          %llu tiles x %llu patches through the vision model (%llu + %llu global "
                         "layers)\n"
                         "          1 token each in --seq (<|image|>), read by the cross-attention layers\n",
                    (unsigned long long)c->model->images, (unsigned long long)v->tiles,
                    (unsigned long long)v->image, (unsigned long long)v->tiles,
                    (unsigned long long)((v->image / v->patch) * (v->image / v->patch) + 1),
                    (unsigned long long)v->layers, (unsigned long long)v->global_layers);
        else
        fprintf(out, "images    %llu per sample, %llux%llu px (%s)\n"
                     "          %llu patches each through the vision tower (%llu layers)\n"
                     "          %llu tokens each in --seq (%s)\n",
                (unsigned long long)c->model->images, (unsigned long long)h, (unsigned long long)w, src,
                (unsigned long long)((h / v->patch) * (w / v->patch)), (unsigned long long)v->layers,
                (unsigned long long)v->tokens, v->kind == MP_VIS_PIXTRAL ? "rows x (columns + 1)"
                                               : qwen ? "patches / spatial_merge_size^2" : "mm_tokens_per_image");
    }
    if (c->build) {
        char sb[32], seq[48] = "", attn[48] = ""; /* seq and attention only where they apply */
        if (c->model->input == MP_INPUT_TOKENS)
            snprintf(seq, sizeof seq, ", seq %llu",
                     (unsigned long long)(c->prog ? c->prog->opts.seq : c->build->seq));
        if (c->model->enc_dec && c->prog)
            snprintf(seq + strlen(seq), sizeof seq - strlen(seq), ", target seq %llu",
                     (unsigned long long)c->prog->opts.target_seq);
        if (mp_model_has_attention(c->model))
            snprintf(attn, sizeof attn, ", attention %s%s", mp_attn_impl_str(c->build->attention),
                     c->prog && c->prog->sdpa_math ? " (math kernel)" : "");
        fprintf(out, "config    batch %llu%s, %s, %s (%s), checkpoint %s%s%s\n", (unsigned long long)c->build->batch,
                seq, prec_name(c, c->build->precision), mp_optimizer_str(c->train->optimizer),
                optim_desc(c->train->optimizer),
                c->ckpt ? mp_ckpt_spec_str(c->ckpt, sb, sizeof sb) : "none", attn,
                c->train->accumulate ? ", accumulating gradients (.grad resident)" : "");
        const char *refd = ref_desc(c->train->ref);
        if (c->build->trainer == MP_TRAINER_KTO && c->build->loss == MP_LOSS_HF) /* (lower_lf_dpo_loss) */
            fprintf(out, "trainer   kto (LLaMA-Factory 0.9.5 CustomKTOTrainer): %llu example%s and %s KL sequence%s\n"
                    "          (no grad, after the batch's forward); reference %s, two forwards;\n"
                    "          loss: get_batch_logps on the model's fp32 logits\n",
                    (unsigned long long)c->build->batch, c->build->batch == 1 ? "" : "s",
                    c->build->batch == 1 ? "its" : "their", c->build->batch == 1 ? "" : "s", refd);
        else if (c->build->trainer == MP_TRAINER_DPO && c->build->loss == MP_LOSS_HF) /* (lower_lf_dpo_loss) */
            fprintf(out, "trainer   dpo (LLaMA-Factory 0.9.5 CustomDPOTrainer): %llu pair%s, %llu sequences "
                    "(chosen+rejected);\n          reference %s; loss: get_batch_logps on the model's fp32 logits\n",
                    (unsigned long long)c->build->batch, c->build->batch == 1 ? "" : "s",
                    (unsigned long long)(c->build->batch * 2), refd);
        else if (c->build->trainer == MP_TRAINER_DPO)
            fprintf(out, "trainer   dpo (TRL 1.16.0 DPOTrainer): %llu pair%s, %llu sequences (chosen+rejected); "
                    "reference %s\n", (unsigned long long)c->build->batch, c->build->batch == 1 ? "" : "s",
                    (unsigned long long)(c->build->batch * 2), refd);
        else if (c->build->trainer == MP_TRAINER_KTO)
            fprintf(out, "trainer   kto (TRL 1.16.0 KTOTrainer): %llu examples and their %llu KL sequences (no "
                    "grad);\n          reference %s%s\n", (unsigned long long)c->build->batch,
                    (unsigned long long)c->build->batch, refd,
                    c->train->ref != MP_REF_NONE ? ", two forwards (the KL sequences and the batch)" : "");
        else if (c->build->trainer == MP_TRAINER_GRPO) {
            const struct mp_train_opts *t = c->train;
            uint64_t C = c->build->completion;
            fprintf(out, "trainer   grpo (TRL 1.16.0 GRPOTrainer): %llu completions of %llu tokens after a %llu-token "
                    "prompt;\n          %s; reference %s%s\n", (unsigned long long)c->build->batch, (unsigned long long)C,
                    (unsigned long long)((c->prog ? c->prog->opts.seq : c->build->seq) - C),
                    t->vllm_fraction > 0 ? "generated by a colocated vLLM"
                    : t->vllm_server     ? "generated by a vLLM server (other GPUs)"
                                         : "generated by transformers' generate",
                    t->ref == MP_REF_NONE ? "none (beta 0)" : ref_desc(t->ref), t->ref == MP_REF_NONE ? "" : " (beta > 0)");
        } else if (c->build->trainer == MP_TRAINER_ORPO)
            fprintf(out, "trainer   orpo (TRL 1.16.0 ORPOTrainer): %llu pair%s, %llu sequences (chosen+rejected); "
                    "no reference\n          model; loss: the chosen rows' NLL and the odds ratio on the full "
                    "logits\n", (unsigned long long)c->build->batch, c->build->batch == 1 ? "" : "s",
                    (unsigned long long)(c->build->batch * 2));
        else if (mp_trainer_ref_fwds(c->build->trainer)) /* (kto-apo: a loss_type without the KL term) */
            fprintf(out, "trainer   %s (TRL 1.16.0 KTOTrainer, loss_type %s): %llu example%s, no KL sequences; "
                    "reference %s\n", mp_trainer_str(c->build->trainer), mp_trainer_loss_type(c->build->trainer),
                    (unsigned long long)c->build->batch, c->build->batch == 1 ? "" : "s", refd);
        if (c->build->completion) /* GRPO: the completion's positions */
            fprintf(out, "loss      %s (TRL's fused LM head, policy%s); labels on the completion only\n",
                    mp_loss_str(c->build->loss), c->train->ref != MP_REF_NONE ? " and reference" : "");
        else if (c->build->loss != MP_LOSS_HF || c->build->label_fraction < 1) /* hf's report stays as it was */
            fprintf(out, "loss      %s (%s); label fraction %.3g%s\n", mp_loss_str(c->build->loss),
                    mp_trainer_ref_fwds(c->build->trainer) ? "TRL's fused LM head, policy and reference"
                                                        : mp_loss_how(c->build->loss),
                    c->build->label_fraction,
                    c->build->loss == MP_LOSS_HF || c->build->loss == MP_LOSS_LIGER
                        ? " (memory unaffected: every row runs)" : "");
        if (packing_of(c))
            packing_line(out, c, c->build->batch, "packing   ");
    }
    if (c->build && c->prog && c->build->ft.mode != MP_FT_FULL)
        finetune_lines(out, c);
    moe_lines(out, c);
    if (c->train && c->train->par) {
        char pb[96], rk[64] = "";
        if (!strcmp(c->command, "probe")) /* one rank's step, its collectives as local copies */
            snprintf(rk, sizeof rk, "; the step of rank %llu", (unsigned long long)c->train->par->rank);
        fprintf(out, "parallel  %s; memory figures are per rank%s\n", mp_par_describe(c->train->par, pb, sizeof pb),
                rk);
        const struct mp_quant *q = c->prog ? mp_program_base_quant(c->prog) : NULL;
        if (q && mp_par_sharded_params(c->train->par->strategy)) { /* FSDP-QLoRA: where the 4-bit weights are */
            int st = mp_quant_storage(q, true);
            bool z3 = c->train->par->strategy == MP_PAR_ZERO3;
            fprintf(out, "          4-bit base: %s storage%s, %s; quant_state on every rank\n",
                    mp_quant_storage_str(st), q->storage >= 0 ? "" : z3 ? " (ZeRO-3 QLoRA's)" : " (FSDP-QLoRA's)",
                    z3 ? "partitioned" : st == MP_DT_U8 ? "not sharded (ignored_params)" : "sharded");
        }
    }
    if (c->recipe)
        recipe_lines(out, c->recipe);
    if (c->defaults[0])
        fprintf(out, "defaults  %s\n", c->defaults);
    if (c->gpu)
        fprintf(out, "target    %s (%s): %s, CUDA context %s (%s)\n", shown(c->gpu->name),
                shown(c->gpu->description), B(mp_gpu_capacity(c->gpu)), B(c->gpu->context_bytes),
                shown(c->target_how ? c->target_how : ""));
}

void mp_report_plan_blocks(FILE *out, const struct mp_ckpt_plan *p)
{
    size_t n = 0;
    for (size_t i = 0; i < p->L; i++)
        n += p->checkpointed[i];
    if (!n) {
        fputs("none", out);
        return;
    }
    /* a long plan (a long model's sqrt plan has hundreds of segments): each run of 4 or more
     * back-to-back segments of one length as its first and last with their count */
    bool shorten = p->n_segments > 16;
    for (size_t i = 0; i < p->n_segments;) {
        size_t len = p->segments[i][1] - p->segments[i][0], j = i + 1;
        while (shorten && j < p->n_segments && p->segments[j][0] == p->segments[j - 1][1] &&
               p->segments[j][1] - p->segments[j][0] == len)
            j++;
        if (j - i < 4)
            j = i + 1;
        fprintf(out, "%s[%zu,%zu)", i ? " " : "", p->segments[i][0], p->segments[i][1]);
        if (j - i >= 4)
            fprintf(out, " .. [%zu,%zu) (%zu segments of %zu block%s)", p->segments[j - 1][0],
                    p->segments[j - 1][1], j - i, len, len == 1 ? "" : "s");
        i = j;
    }
}

static bool same_row(const struct mp_block_est *a, const struct mp_block_est *b)
{
    return a->params == b->params && a->weights_bytes == b->weights_bytes && a->optimizer_bytes == b->optimizer_bytes &&
           a->activation_bytes == b->activation_bytes && a->output_bytes == b->output_bytes &&
           a->fwd_flops == b->fwd_flops && a->checkpointed == b->checkpointed;
}

/* At most 5 characters: three significant digits and a one-letter prefix of
 * base (1024 for bytes: K = KiB, ...; 1000 for FLOPs), e.g. "150M", "27.0M", "512". */
static const char *compact(double v, double base)
{
    static char buf[8][16];
    static int k;
    k = (k + 1) % 8;
    const char *pre = " KMGTPE";
    int i = 0;
    while (v >= 999.5 && i < 6) {
        v /= base;
        i++;
    }
    const char *fmt = i == 0 ? "%.0f%s" : v < 9.995 ? "%.2f%c" : v < 99.95 ? "%.1f%c" : "%.0f%c";
    if (i == 0)
        snprintf(buf[k], sizeof buf[k], fmt, v, "");
    else
        snprintf(buf[k], sizeof buf[k], fmt, v, pre[i]);
    return buf[k];
}

/* The narrow table (fits 100 columns): one compact figure per column. */
static void narrow_row(FILE *out, const char *idx, const char *name, const char *type, const struct mp_block_est *b)
{
    char nm[24], ty[24];
    snprintf(nm, sizeof nm, "%s", name);
    if (strlen(name) > 16) { /* cut at 14 bytes, not inside a UTF-8 character */
        size_t cut = 14;
        while (cut > 0 && ((unsigned char)nm[cut] & 0xC0) == 0x80)
            cut--;
        snprintf(nm + cut, sizeof nm - cut, "..");
    }
    snprintf(ty, sizeof ty, "%s", type);
    if (strlen(type) > 17)
        snprintf(ty + 15, sizeof ty - 15, "..");
    fprintf(out, "%-11s %-16s %-17s %6s %6s %6s %6s %6s %6s %s\n", idx, nm, ty, short_count(b->params),
            compact((double)b->weights_bytes, 1024), compact((double)b->optimizer_bytes, 1024),
            compact((double)b->activation_bytes, 1024), compact((double)b->output_bytes, 1024),
            compact(b->fwd_flops, 1000), b->checkpointed ? "yes" : "");
}

static void layer_table(FILE *out, const struct mp_report_ctx *c, const struct mp_estimate *e)
{
    if (c->wide)
        fprintf(out, "\n%-9s %-18s %-20s %9s %10s %10s %10s %11s %10s %12s %s\n", "blocks", "name", "type", "params",
                "weights", "grads", "optimizer", "activations", "output", "fwd", "ckpt");
    else
        fprintf(out, "\n%-11s %-16s %-17s %6s %6s %6s %6s %6s %6s %s\n", "blocks", "name", "type", "params", "weight",
                "optim", "activ", "output", "fwd", "ckpt");
    for (size_t i = 0; i < e->n_blocks;) {
        size_t j = i + 1;
        int grp = c->model->blocks[i].repeat_group;
        if (!c->all_layers && grp > 0)
            while (j < e->n_blocks && c->model->blocks[j].repeat_group == grp && same_row(&e->blocks[i], &e->blocks[j]))
                j++;
        const struct mp_block_est *b = &e->blocks[i];
        char idx[24], name[40], t[64];
        if (j - i > 1) {
            snprintf(idx, sizeof idx, "%zu-%zu", i, j - 1);
            snprintf(name, sizeof name, "%s..%s x%zu", shown(c->model->blocks[i].name),
                     shown(c->model->blocks[j - 1].name), j - i);
            if (!c->wide && strlen(name) > 16)
                snprintf(name, sizeof name, "%s x%zu", shown(c->model->blocks[i].name), j - i);
        } else {
            snprintf(idx, sizeof idx, "%zu", i);
            snprintf(name, sizeof name, "%s", shown(c->model->blocks[i].name));
        }
        block_type(&c->model->blocks[i], t, sizeof t);
        char w[32], g[32], o[32], a[32], ou[32];
        if (!c->wide) {
            narrow_row(out, idx, name, t, b);
            i = j;
            continue;
        }
        fprintf(out, "%-9s %-18s %-20s %9s %10s %10s %10s %11s %10s %12s %s\n", idx, name, t, short_count(b->params),
                mp_fmt_bytes(b->weights_bytes, w, 32), mp_fmt_bytes(b->grads_bytes, g, 32),
                mp_fmt_bytes(b->optimizer_bytes, o, 32), mp_fmt_bytes(b->activation_bytes, a, 32),
                mp_fmt_bytes(b->output_bytes, ou, 32), fl(b->fwd_flops), b->checkpointed ? "yes" : "");
        i = j;
    }
    if (!c->wide)
        fprintf(out, "(bytes with K/M/G = KiB/MiB/GiB; gradients = weights; fwd in FLOP; --wide: full table)\n");
    if (!c->all_layers)
        fprintf(out, "(identical repeated blocks folded; per-block figures; --all-layers unfolds)\n");
}

/* The allocator's settings assumed, with where they came from. */
static void alloc_settings(const struct mp_report_ctx *c, char *buf, size_t n)
{
    char conf[200] = "";
    if (c->train && c->train->alloc)
        mp_alloc_conf_str(c->train->alloc, conf, sizeof conf);
    if (!conf[0])
        snprintf(buf, n, "torch's defaults");
    else
        snprintf(buf, n, "%s (%s)", conf, c->alloc_from && c->alloc_from[0] ? c->alloc_from : "given");
}

/* The device-level verdict's line (where the allocator ran). */
static void device_line(FILE *out, const char *indent, const struct mp_fit *f)
{
    if (!f->device_simulated)
        return;
    if (f->fits_device)
        fprintf(out, "%sdevice level: %s reserved + context, fits, %s to spare%s\n", indent, B(f->device_bytes),
                B(f->usable_bytes - f->device_bytes),
                f->est.alloc_retries ? " (after the allocator frees its cache)" : "");
    else if (f->device_bytes > f->usable_bytes) /* (an OOM lifts the limit: what the step needs) */
        fprintf(out, "%sdevice level: does not fit: %s reserved + context, short by %s\n", indent,
                B(f->device_bytes), B(f->device_bytes - f->usable_bytes));
    else
        fprintf(out, "%sdevice level: does not fit\n", indent);
    if (!f->fits_device && f->est.alloc_ooms)
        fprintf(out, "%s  (an allocation fails after the allocator frees its cache: out of memory)\n", indent);
    if (f->expandable_fits)
        fprintf(out, "%sexpandable_segments:True fits (%s reserved + context): set it in\n%s"
                "PYTORCH_CUDA_ALLOC_CONF (not with vLLM's sleep mode: its CuMemAllocator refuses it)\n",
                indent, B(f->expandable_device_bytes), indent);
}

static void totals(FILE *out, const struct mp_report_ctx *c, const struct mp_estimate *e)
{
    fprintf(out, "\nmemory by category\n");
    fprintf(out, "  weights            %12s\n", B(e->weights_bytes));
    fprintf(out, "  gradients          %12s   (appear during backward, freed by zero_grad)\n", B(e->grads_bytes));
    fprintf(out, "  optimizer state    %12s   (+%s temporary during step)\n", B(e->optimizer_bytes),
            B(e->optimizer_tmp_bytes));
    fprintf(out, "  activations        %12s   (live when backward starts)\n", B(e->activations_bytes));
    fprintf(out, "  input batch        %12s\n", B(e->input_bytes));
    fprintf(out, "  cuBLAS workspace   %12s   (%d: the forward's and autograd's thread's handle)\n",
            B(e->workspace_bytes), MP_CUBLAS_HANDLES);
    if (e->load_bytes)
        fprintf(out, "  load (4-bit base)  %12s   (whole on each GPU from from_pretrained to FSDP2's sharding)\n",
                B(e->load_bytes));
    if (e->host_pinned_bytes && e->act_offload_pcie_bytes)
        fprintf(out, "  host RAM (pinned)  %12s   (offloaded activations; PCIe %s per step)\n",
                B(e->host_pinned_bytes), B(e->act_offload_pcie_bytes));
    else if (e->host_pinned_bytes)
        fprintf(out, "  host RAM (pinned)  %12s   (offloaded checkpoint inputs; PCIe %s per step)\n",
                B(e->host_pinned_bytes), B(2 * e->ckpt_offload_bytes));
    if (e->sac_policy != MP_SAC_NONE) {
        char lab[32];
        snprintf(lab, sizeof lab, "SAC kept (%s)", mp_sac_str(e->sac_policy));
        const char *kept = B(e->sac_layer_bytes);
        int kw = 31 - (int)strlen(lab); /* the columns, a longer label's number one space after it */
        if (kw <= (int)strlen(kept))
            kw = (int)strlen(kept) + 1;
        fprintf(out, "  %s%*s   per layer x %zu (saved ops' outputs, held to the recompute)\n", lab, kw, kept,
                e->sac_layers);
        if (e->sac_policy == MP_SAC_AUTO) { /* the planner's choice, wrapped at 100 columns */
            char names[64][16];
            const char *nodes[64];
            size_t n = sac_kept_ops(c->prog, e->sac_keep, names, nodes, 64);
            int col = fprintf(out, "%21skept:", "");
            for (size_t i = 0; i < n; i++) {
                int w = (int)(strlen(names[i]) + strlen(nodes[i]) + 5);
                if (col + w > 99)
                    col = fprintf(out, "\n%26s", "") - 1;
                col += fprintf(out, " %s (%s)%s", names[i], nodes[i], i + 1 < n ? "," : "");
            }
            fprintf(out, "%s\n", n ? "" : " nothing (the plan is layers')");
        }
    }
    if (e->world > 1 || e->host_bytes || e->buffers_bytes) {
        fprintf(out, "  comm buffers       %12s   (persistent: DDP buckets, DeepSpeed reduce bucket / partitions)\n",
                B(e->buffers_bytes));
        if (e->host_bytes || e->nvme_bytes)
            fprintf(out, "  host RAM (offload) %12s   per rank%s%s\n", B(e->host_bytes), e->nvme_bytes ? ", NVMe " : "",
                    e->nvme_bytes ? B(e->nvme_bytes) : "");
        fprintf(out, "  per step           all-gather %s, reduce-scatter %s, all-reduce %s, PCIe %s\n",
                B((uint64_t)e->allgather_bytes), B((uint64_t)e->reducescatter_bytes), B((uint64_t)e->allreduce_bytes),
                B((uint64_t)e->pcie_bytes));
        if (e->comm_s > 0 || e->offload_s > 0)
            fprintf(out, "  time per step      collectives %.3f s (%.3f s not hidden by compute), offload %.3f s\n",
                    e->comm_s, e->exposed_comm_s, e->offload_s);
        struct mp_nccl_est nc;
        char nd[128];
        nccl_of(c, e, &nc);
        if (e->world > 1 && nc.counted)
            fprintf(out, "  NCCL buffers       %12s   (%s)\n", B(nc.bytes),
                    mp_nccl_describe(&nc, nd, sizeof nd));
        if (e->world > 1 && nc.counted && nc.ep_peers) /* (included above) */
            fprintf(out, "    of them --ep's   %12s   (all-to-all %u peer%s x %u ch x %s, efsdp %s)\n",
                    B(nc.ep_bytes + nc.efsdp_bytes), nc.ep_peers, nc.ep_peers > 1 ? "s" : "", nc.p2p_channels,
                    B(nc.peer_bytes), B(nc.efsdp_bytes));
        else if (e->world > 1)
            fprintf(out, "  NCCL buffers       not counted (%s): they come on top\n", c->gpu ? nc.why : "no GPU profile");
    }
    char tn[16];
    if (c->train && c->train->ref == MP_REF_COPY) {
        const struct mp_parallel *pr = c->train->par;
        bool fsdp = pr && mp_par_is_fsdp(pr->strategy);
        fprintf(out, "  reference model    %12s   (%s: a frozen copy, %s)\n", B(e->ref_weights_bytes),
                mp_trainer_trl_name(trainer_of(c), tn, sizeof tn),
                !fsdp ? "resident"
                : pr->strategy == MP_PAR_FSDP ? "one FSDP2 unit, its shard; gathered to run"
                                              : "one FSDP2 unit, its shard + left gathered");
    }
    bool gen = c->train && c->train->gen_steps, old = c->train && c->train->old_logps;
    if (c->train && (c->train->ref != MP_REF_NONE || gen || old)) {
        fprintf(out, "\nphases (%s)\n", mp_trainer_trl_name(trainer_of(c), tn, sizeof tn));
        if (gen) {
            fprintf(out, "  generation         %12s   (%llu sequences, no grad; cache %s at the last token; at %s)\n",
                    B(e->gen_peak_bytes), (unsigned long long)e->gen_batch, B(e->gen_kv_bytes), shown(e->gen_event));
            if (e->gen_gather)
                fprintf(out, "                       %s gathered at a decoding step: %s\n",
                        B(e->gen_gathered_bytes), strcmp(e->gen_gather, "whole") ? "the units each forward gathers"
                                                                                  : "every parameter, whole");
        }
        if (old)
            fprintf(out, "  old log-probs      %12s   (the policy's forward, no grad, a micro-batch at a time; at "
                    "%s)\n", B(e->old_forward_peak_bytes), shown(e->old_forward_event));
        if (c->train->ref != MP_REF_NONE)
            fprintf(out, "  reference forward  %12s   (no grad, %s the policy's forward; +%s at %s)\n",
                    B(e->ref_forward_peak_bytes), c->train->ref_before_policy ? "before" : "after",
                    B(e->ref_forward_tmp_bytes), shown(e->ref_forward_event));
        if (e->kl_forward_peak_bytes) /* (LLaMA-Factory's KTO: estimate.c kl_phase) */
            fprintf(out, "  policy step        %12s   (forward, its KL forward with no grad at %s,\n"
                    "                         loss, backward, optimizer step)\n", B(e->policy_peak_bytes),
                    B(e->kl_forward_peak_bytes));
        else
            fprintf(out, "  policy step        %12s   (forward, loss, backward, optimizer step)\n",
                    B(e->policy_peak_bytes));
    }
    if (e->vllm_bytes)
        fprintf(out, "  vLLM (colocated)   %12s   (vllm_gpu_memory_utilization %g of the device, outside torch's "
                "allocator)\n", B(e->vllm_bytes), c->train->vllm_fraction);
    fprintf(out, "\npeak allocated       %12s   at %s   (compare torch.cuda.max_memory_allocated)\n",
            B(e->peak_allocated_bytes), shown(e->peak_event));
    char settings[256];
    alloc_settings(c, settings, sizeof settings);
    if (e->alloc_simulated) {
        char fr[32];
        fprintf(out, "peak reserved        %12s   (caching allocator simulated, %s; %s cached at the "
                "allocated peak)\n",
                B(e->peak_reserved_bytes), settings, mp_fmt_bytes(e->reserved_frag_bytes, fr, sizeof fr));
        if (e->alloc_ooms)
            fprintf(out, "                        an allocation fails even after the allocator frees its cache\n");
        else if (e->alloc_retries)
            fprintf(out, "                        fits only after the allocator frees its cache (num_alloc_retries "
                    "%llu)\n", (unsigned long long)e->alloc_retries);
    } else
        fprintf(out, "peak reserved        %12s   (= allocated: the allocator is not simulated for a model this "
                "long)\n", B(e->peak_reserved_bytes));
    if (nccl_shown(c, e))
        fprintf(out, "CUDA context         %12s   (with NCCL's buffers)\n", B(e->overhead_bytes));
    else
        fprintf(out, "CUDA context         %12s\n", B(e->overhead_bytes));
    fprintf(out, "peak device          %12s   (allocated + context: what the GPU must have free)\n",
            B(e->peak_device_bytes));
    uint64_t dev;
    if (e->alloc_simulated && mp_add_u64(e->peak_reserved_bytes, e->overhead_bytes, &dev))
        fprintf(out, "device (reserved)    %12s   (reserved + context: what the device holds at the peak)\n", B(dev));
    char a[32], b[32], r[32];
    fprintf(out, "step FLOPs           forward %s, backward %s, recompute %s\n", mp_fmt_flops(e->fwd_flops, a, 32),
            mp_fmt_flops(e->bwd_flops, b, 32), mp_fmt_flops(e->recompute_flops, r, 32));
    if (e->dequant_bytes > 0)
        fprintf(out, "dequantization       %s read and written   (the quantized base, every pass: memory-bound)\n",
                B((uint64_t)e->dequant_bytes));
}

/* ---- estimate ------------------------------------------------------------------------------ */

static void report_estimate(FILE *out, const struct mp_report_ctx *c, const struct mp_estimate *e,
                            const struct mp_ckpt_plan *plan)
{
    if (c->json) {
        cJSON *r = json_root(c);
        json_memory(r, c, e);
        json_layers(r, c, e);
        cJSON *tg = cJSON_GetObjectItemCaseSensitive(r, "target");
        if (c->fit && tg) {
            cJSON_AddBoolToObject(tg, "fits", c->fit->fits);
            json_levels(tg, c->fit);
            ju64(tg, "usable_bytes", c->fit->usable_bytes);
            jnum(tg, "margin_pct", c->margin_pct);
        }
        if (plan && plan->spec.strategy != MP_CKPT_NONE)
            cJSON_AddItemToObject(r, "plan", json_plan(plan, e->fwd_flops + e->bwd_flops));
        print_json(out, r);
        return;
    }
    header(out, c);
    fprintf(out, "\npeak      %s allocated at %s; %s on the device with overheads\n", B(e->peak_allocated_bytes),
            shown(e->peak_event), B(e->peak_device_bytes));
    if (c->fit && c->gpu) {
        const struct mp_fit *f = c->fit;
        if (f->fits)
            fprintf(out, "verdict   fits %s: %s of %s usable (%.1f%% margin), %s to spare\n", shown(c->gpu->name),
                    B(f->peak_device_bytes), B(f->usable_bytes), c->margin_pct,
                    B(f->usable_bytes - f->peak_device_bytes));
        else if (f->fits_allocated) /* the device level does not */
            fprintf(out, "verdict   does not fit %s: allocated %s of %s usable (%.1f%% margin) would, but\n",
                    shown(c->gpu->name), B(f->peak_device_bytes), B(f->usable_bytes), c->margin_pct);
        else
            fprintf(out, "verdict   does not fit %s: %s of %s usable (%.1f%% margin), short by %s\n",
                    shown(c->gpu->name),
                    B(f->peak_device_bytes), B(f->usable_bytes), c->margin_pct,
                    B(f->peak_device_bytes - f->usable_bytes));
        if (f->fits_allocated)
            device_line(out, "          ", f);
    }
    layer_table(out, c, e);
    totals(out, c, e);
    if (plan && plan->spec.strategy != MP_CKPT_NONE) {
        fprintf(out, "checkpointed blocks  ");
        mp_report_plan_blocks(out, plan);
        fputc('\n', out);
    }
}

/* ---- plan ------------------------------------------------------------------------------------ */

static void report_plan(FILE *out, const struct mp_report_ctx *c, const struct mp_fit *f, const struct mp_plan_cmp *cmp)
{
    const struct mp_ckpt_plan *p = &f->plan;
    double base = 0;
    for (size_t i = 0; i < f->chain.L; i++)
        base += f->chain.f[i] + f->chain.b[i];
    double pct = base > 0 ? 100.0 * p->recompute_cost / base : 0;
    if (c->json) {
        cJSON *r = json_root(c);
        cJSON *pl = json_plan(p, base);
        ju64(pl, "activation_peak_without_bytes", f->nockpt_activation_peak);
        ju64(pl, "activation_budget_bytes", f->activation_budget);
        ju64(pl, "dp_group_blocks", p->dp_group > 1 ? p->dp_group : 1);
        if (cmp && cmp->have_sqrt) {
            cJSON *s = cJSON_AddObjectToObject(pl, "sqrt");
            ju64(s, "activation_peak_bytes", cmp->sqrt_peak);
            jnum(s, "recompute_flops", cmp->sqrt_recompute);
        }
        if (cmp && cmp->have_seg) {
            cJSON *s = cJSON_AddObjectToObject(pl, "best_segments");
            ju64(s, "k", cmp->seg_k);
            ju64(s, "activation_peak_bytes", cmp->seg_peak);
            jnum(s, "recompute_flops", cmp->seg_recompute);
        }
        cJSON_AddItemToObject(r, "plan", pl);
        json_memory(r, c, &f->est);
        cJSON *tg = cJSON_GetObjectItemCaseSensitive(r, "target");
        if (c->gpu && tg) {
            cJSON_AddBoolToObject(tg, "fits", f->fits);
            json_levels(tg, f);
        }
        print_json(out, r);
        return;
    }
    header(out, c);
    char sb[32];
    fprintf(out, "\nplan      %s: checkpoint ", mp_ckpt_spec_str(&p->spec, sb, sizeof sb));
    mp_report_plan_blocks(out, p);
    fprintf(out, "%s\n", p->multilevel ? " (multi-level: some blocks recomputed more than once)" : "");
    if (f->activation_budget)
        fprintf(out, "budget    %s for activations (input, stored activations, activation gradients)\n",
                B(f->activation_budget));
    fprintf(out, "activation peak   %12s   (without checkpointing %s)\n", B(p->peak_bytes),
            B(f->nockpt_activation_peak));
    fprintf(out, "recompute         %12s   (+%.1f%% of forward+backward FLOPs)\n", fl(p->recompute_cost), pct);
    if (p->dp_group > 1)
        fprintf(out, "approximate       the DP ran on groups of up to %zu consecutive blocks (identical ones "
                     "grouped first): optimal among plans that checkpoint between groups, sizes rounded up "
                     "to the DP's slots; the plan itself is checked on every block\n",
                p->dp_group);
    if (cmp && (cmp->have_sqrt || cmp->have_seg)) {
        fprintf(out, "\n%-22s %14s %16s %10s\n", "compared with", "activation peak", "recompute", "overhead");
        fprintf(out, "%-22s %14s %16s %9.1f%%\n", "this plan", B(p->peak_bytes), fl(p->recompute_cost), pct);
        if (cmp->have_sqrt)
            fprintf(out, "%-22s %14s %16s %9.1f%%%s\n", "sqrt", B(cmp->sqrt_peak), fl(cmp->sqrt_recompute),
                    base > 0 ? 100.0 * cmp->sqrt_recompute / base : 0,
                    cmp->sqrt_peak > p->peak_bytes ? "   (needs more memory)" : "");
        if (cmp->have_seg) {
            char nm[32];
            snprintf(nm, sizeof nm, "segments:%llu", (unsigned long long)cmp->seg_k);
            fprintf(out, "%-22s %14s %16s %9.1f%%   (best %sK at this memory)\n", nm,
                    B(cmp->seg_peak), fl(cmp->seg_recompute), base > 0 ? 100.0 * cmp->seg_recompute / base : 0,
                    cmp->seg_sampled ? "sampled " : "");
        }
    }
    fprintf(out, "\nwith this plan the step peaks at %s allocated (%s on the device) at %s\n",
            B(f->est.peak_allocated_bytes), B(f->est.peak_device_bytes), shown(f->est.peak_event));
    if (c->gpu && f->fits_allocated)
        device_line(out, "", f);
    if (p->spec.strategy == MP_CKPT_SQRT || p->spec.strategy == MP_CKPT_SEGMENTS) {
        size_t segs = p->n_segments + 1;
        fprintf(out, "reproduce torch.utils.checkpoint.checkpoint_sequential(blocks, %zu, x, use_reentrant=False)\n",
                segs);
    }
}

/* plan when no plan fits: the JSON object still comes out, with "plan": null. */
static void report_plan_none(FILE *out, const struct mp_report_ctx *c, const struct mp_fit *f, const char *reason)
{
    if (!c->json)
        return;
    cJSON *r = json_root(c);
    cJSON_AddNullToObject(r, "plan");
    cJSON_AddBoolToObject(r, "fits", 0);
    cJSON_AddStringToObject(r, "reason", reason);
    ju64(r, "activation_budget_bytes", f->activation_budget);
    ju64(r, "static_bytes", f->static_bytes);
    ju64(r, "usable_bytes", f->usable_bytes);
    print_json(out, r);
}

/* ---- check --------------------------------------------------------------------------------- */

static void report_check(FILE *out, const struct mp_report_ctx *c, const struct mp_fit *f)
{
    uint64_t short_by = mp_fit_shortfall(f);
    if (c->json) {
        cJSON *r = json_root(c);
        cJSON *k = cJSON_AddObjectToObject(r, "check");
        cJSON_AddBoolToObject(k, "fits", f->fits);
        json_levels(k, f);
        ju64(k, "shortfall_bytes", short_by);
        ju64(k, "usable_bytes", f->usable_bytes);
        ju64(k, "capacity_bytes", f->capacity_bytes);
        ju64(k, "peak_device_bytes", f->peak_device_bytes);
        json_memory(r, c, &f->est);
        cJSON_AddItemToObject(r, "plan", json_plan(&f->plan, f->est.fwd_flops + f->est.bwd_flops));
        print_json(out, r);
        return;
    }
    fprintf(out, "%s: peak %s of %s usable (%s capacity, %.1f%% margin) at %s\n", f->fits ? "fits" : "does not fit",
            B(f->peak_device_bytes), B(f->usable_bytes), B(f->capacity_bytes),
            c->margin_pct,
            shown(f->est.peak_event));
    device_line(out, "  ", f);
}

/* ---- suggest ----------------------------------------------------------------------------- */

/* peft's task_type for the model's head (the classifier's pooling says which) and the
 * transformers Auto class that loads it; NULL task: a masked-LM or bare model (no task type). */
static const char *peft_task(const struct mp_model *m, const char **auto_cls)
{
    *auto_cls = "AutoModelForCausalLM";
    for (size_t i = m->n_blocks; i-- > 0;)
        for (size_t j = 0; j < m->blocks[i].n_layers; j++) {
            const struct mp_layer *l = &m->blocks[i].layers[j];
            if (l->type == MP_LT_CLASSIFIER) {
                bool tok = l->head.pool == MP_POOL_NONE, qa = l->head.pool == MP_POOL_SPAN;
                *auto_cls = m->input != MP_INPUT_TOKENS ? "AutoModelForImageClassification"
                            : tok                        ? "AutoModelForTokenClassification"
                            : qa                         ? "AutoModelForQuestionAnswering"
                                                         : "AutoModelForSequenceClassification";
                return tok ? "TOKEN_CLS" : qa ? "QUESTION_ANS" : "SEQ_CLS";
            }
            if (l->type == MP_LT_LM_HEAD && m->enc_dec) { /* T5's LM head */
                *auto_cls = "AutoModelForSeq2SeqLM";
                return "SEQ_2_SEQ_LM";
            }
            if (l->type == MP_LT_LM_HEAD && l->head.masked) {
                *auto_cls = "AutoModelForMaskedLM";
                return NULL;
            }
        }
    return "CAUSAL_LM";
}

/* A multimodal checkpoint (a vision tower memplan reads) loads as its ForConditionalGeneration
 * class: transformers 5.24 maps mistral3, qwen2_vl and qwen2_5_vl to AutoModelForImageTextToText
 * only, not AutoModelForCausalLM (models/auto/modeling_auto.py). */
static bool vlm_of(const struct mp_model *m) { return m->images || m->vision.kind != MP_VIS_NONE; }

/* --images N: the processor and the images at the size planned (TRL 1.16's vision path: a dataset
 * with an "images" column makes SFTTrainer skip its preparation and collate with
 * DataCollatorForVisionLanguageModeling, sft_trainer.py:762, 981-989, 1005-1011, which runs the
 * processor on each batch, image tokens expanded, truncated at max_length, :377-408).  Each image
 * is resized to the height x width the step runs (after the processor's resize, so the processor
 * keeps it): Qwen's smart_resize with the class's pixel bounds passed (a checkpoint's own
 * max_pixels may be smaller), Pixtral's longest edge and patch multiple, Gemma 3's image_size
 * (pan-and-scan off: its crops would be more images). */
static void images_prelude(FILE *out, const struct mp_report_ctx *c)
{
    const struct mp_model *m = c->model;
    const struct mp_vision *v = &m->vision;
    if (!m->images)
        return;
    uint64_t seq = c->prog ? c->prog->opts.seq : c->build ? c->build->seq : m->seq_len;
    if (v->kind == MP_VIS_MLLAMA) /* (every image its max_num_tiles tiles: the size changes no memory) */
        fprintf(out, "# mllama: one <|image|> token per image in the text; the processor tiles each\n"
                     "# image, whatever its size, to max_num_tiles tiles of %llux%llu px, which the\n"
                     "# cross-attention layers read\n", (unsigned long long)m->height, (unsigned long long)m->width);
    fprintf(out, "# --images %llu: planned %llu image%s per sample at %llux%llu px, %llu token%s each, within the %llu\n"
                 "# tokens of a sample (max_length). The dataset: an \"images\" column (a list of %llu PIL image%s)\n"
                 "# beside \"messages\" (an {\"type\": \"image\"} entry per image) or \"text\" (the processor's image\n"
                 "# token per image), as trl 1.16's DataCollatorForVisionLanguageModeling takes it\n",
            (unsigned long long)m->images, (unsigned long long)m->images, m->images > 1 ? "s" : "",
            (unsigned long long)m->height, (unsigned long long)m->width, (unsigned long long)v->tokens,
            v->tokens == 1 ? "" : "s", (unsigned long long)seq, (unsigned long long)m->images,
            m->images > 1 ? "s" : "");
    fprintf(out, "SEQ, IMAGE_H, IMAGE_W = %llu, %llu, %llu\n", (unsigned long long)seq, (unsigned long long)m->height,
            (unsigned long long)m->width);
    if (MP_VIS_IS_QWEN(v->kind))
        fprintf(out, "processor = AutoProcessor.from_pretrained(NAME, min_pixels=%llu, max_pixels=%llu)\n",
                MP_QWEN_MIN_PIXELS, MP_QWEN_MAX_PIXELS);
    else if (v->kind == MP_VIS_SIGLIP)
        fprintf(out, "processor = AutoProcessor.from_pretrained(NAME, do_pan_and_scan=False)\n");
    else
        fprintf(out, "processor = AutoProcessor.from_pretrained(NAME)\n");
    fprintf(out, "\n\ndef planned_size(example):\n"
                 "    \"\"\"dataset = dataset.map(planned_size): each image at the size planned\"\"\"\n"
                 "    example[\"images\"] = [im.convert(\"RGB\").resize((IMAGE_W, IMAGE_H)) for im in example[\"images\"]]\n"
                 "    return example\n\n\n");
}

/* The model load and peft/bitsandbytes objects that reproduce the plan, as one runnable Python
 * prelude (docs/memory-facts.md#lora, docs/memory-facts.md#qlora): transformers 5.24's
 * from_pretrained(dtype=) (torch_dtype= is deprecated), peft 0.21's LoraConfig.  `trainer` adds
 * the TrainingArguments import (and SFTConfig for TRL's loss head). */
static void model_prelude(FILE *out, const struct mp_report_ctx *c, const struct mp_candidate *b, const char *what,
                          bool trainer)
{
    const struct mp_finetune *f = c->ft;
    bool peft = f && (b->ft == MP_FT_LORA || b->ft == MP_FT_QLORA);
    bool bnb = peft && b->ft == MP_FT_QLORA && c->model->quant.kind == MP_Q_NONE;
    /* FSDP-QLoRA and ZeRO-3 QLoRA (peft's and bitsandbytes' guides): the model loaded in the
     * storage dtype, no prepare_model_for_kbit_training (it would upcast the other frozen weights,
     * which memplan plans as loaded: the whole model sits on each GPU until it is sharded) */
    bool fsdp_qlora = bnb && mp_par_sharded_params(b->par.strategy);
    bool kbit = peft && !fsdp_qlora && (b->ft == MP_FT_QLORA || c->model->quant.kind != MP_Q_NONE);
    const char *auto_cls, *task = peft_task(c->model, &auto_cls);
    bool image = c->model->input != MP_INPUT_TOKENS, images = c->model->images > 0;
    if (vlm_of(c->model) && !strcmp(auto_cls, "AutoModelForCausalLM"))
        auto_cls = "AutoModelForImageTextToText";
    fprintf(out, "# memplan %s: suggest --emit %s (transformers 5.24, peft 0.21)\nimport torch\n", MEMPLAN_VERSION,
            what);
    fprintf(out, "from transformers import %s%s%s\n", auto_cls, bnb ? ", BitsAndBytesConfig" : "",
            trainer ? ", TrainingArguments" : "");
    if (images)
        fprintf(out, "from transformers import AutoProcessor\n");
    if (trainer && loss_of(c) == MP_LOSS_CHUNKED_NLL)
        fprintf(out, "from trl import %s\n", mp_trainer_config(mp_trainer_ref_fwds(trainer_of(c)) ? trainer_of(c)
                                                                                                   : MP_TRAINER_SFT));
    if (trainer && trainer_of(c) == MP_TRAINER_ORPO) /* (trl 1.16: not exported by trl itself) */
        fprintf(out, "from trl.experimental.orpo import ORPOConfig\n");
    /* (SFTTrainer builds the vision collator itself; a Trainer or a loop of one's own takes TRL's) */
    if (images && !(trainer && loss_of(c) == MP_LOSS_CHUNKED_NLL))
        fprintf(out, "from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling\n");
    if (peft)
        fprintf(out, "from peft import LoraConfig, get_peft_model%s\n",
                kbit ? ", prepare_model_for_kbit_training" : "");
    fprintf(out, "\n# the model's hub id or local directory (memplan read %s)\nNAME = \"%s\"\n", shown(c->model->path),
            shown(c->model->name));
    images_prelude(out, c);
    /* weights: fp32 under amp and FSDP's mixed-bf16 (its policy casts the gathered copy); bf16 when pure
     * and under bf16-amp (peft keeps the adapters fp32: autocast_adapter_dtype) */
    const char *dt = (b->precision == MP_PREC_BF16 && (!b->par.mixed_bf16 || fsdp_qlora)) ||
                             b->precision == MP_PREC_BF16_AMP
                         ? "bfloat16" : "float32";
    char labels[48] = ""; /* --num-labels: from_pretrained's num_labels= sets the head's classes */
    if (c->num_labels)
        snprintf(labels, sizeof labels, ", num_labels=%llu", (unsigned long long)c->num_labels);
    if (bnb) {
        /* a float storage: FSDP2 shards the packed weights (FSDP-QLoRA), ZeRO-3 partitions them;
         * uint8 is the default */
        int st = mp_quant_storage(&f->quant, mp_par_sharded_params(b->par.strategy));
        char qs[64] = "";
        if (st != MP_DT_U8)
            snprintf(qs, sizeof qs, ",\n    bnb_4bit_quant_storage=torch.%s", mp_quant_storage_str(st));
        fprintf(out, "bnb_config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"%s\",\n"
                     "    bnb_4bit_use_double_quant=%s, bnb_4bit_compute_dtype=torch.%s%s)\n",
                f->quant.kind == MP_Q_BNB_FP4 ? "fp4" : "nf4", f->quant.double_quant ? "True" : "False",
                b->precision == MP_PREC_AMP_FP16 ? "float16" : "bfloat16", qs);
        fprintf(out, "model = %s.from_pretrained(NAME, quantization_config=bnb_config,\n    dtype=torch.%s%s)\n",
                auto_cls, dt, labels);
    } else if (b->par.ep > 1) {
        /* transformers 5.24 distributed/configuration_utils.py DistributedConfig: FSDP2 over the
         * world (the model's fsdp plan: each decoder layer, the embedding, [norm, lm_head] kept
         * gathered), the experts over ep_size; fsdp_mixed_precision is MixedPrecisionPolicy(bf16,
         * reduce fp32), fsdp_cpu_offload CPUOffloadPolicy() on every unit, the experts' too
         * (distributed/fsdp.py _get_fsdp_policy_kwargs) */
        uint64_t W = mp_par_world(&b->par);
        fprintf(out, "from transformers.distributed import DistributedConfig\n"
                     "# expert parallelism: launch with torchrun%s --nproc-per-node %llu; the model is sharded as it\n"
                     "# loads (FSDP2 over %llu ranks, each MoE layer's experts over %llu), so the Trainer takes it\n"
                     "# as is (no fsdp= argument)\n",
                b->par.nodes > 1 ? " --nnodes N" : "", (unsigned long long)b->par.gpus, (unsigned long long)W,
                (unsigned long long)b->par.ep);
        if (b->par.nodes > 1)
            fprintf(out, "# (N = %llu nodes)\n", (unsigned long long)b->par.nodes);
        fprintf(out, "model = %s.from_pretrained(NAME, dtype=torch.%s%s,\n"
                     "    distributed_config=DistributedConfig(fsdp_size=%llu, ep_size=%llu%s%s))\n",
                auto_cls, dt, labels, (unsigned long long)W, (unsigned long long)b->par.ep,
                b->par.mixed_bf16 ? ", fsdp_mixed_precision=True" : "",
                b->par.offload == MP_OFFLOAD_PARAMS ? ", fsdp_cpu_offload=True" : "");
    } else {
        fprintf(out, "model = %s.from_pretrained(NAME, dtype=torch.%s%s)\n", auto_cls, dt, labels);
    }
    if (!peft)
        return;
    if (kbit) /* checkpointing is switched on where the plan has it (TrainingArguments or the loop) */
        fprintf(out, "model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)\n");
    char tg[160];
    mp_finetune_describe_targets(f, c->model->hf_type, tg, sizeof tg);
    char *sp = strchr(tg, ' ');
    if (sp)
        *sp = 0;
    if (!strcmp(tg, "all-linear"))
        fprintf(out,
                "lora_config = LoraConfig(r=%llu, lora_alpha=%g, lora_dropout=%g, target_modules=\"all-linear\",\n",
                (unsigned long long)f->r, f->alpha, f->dropout);
    else {
        fprintf(out, "lora_config = LoraConfig(r=%llu, lora_alpha=%g, lora_dropout=%g, target_modules=[",
                (unsigned long long)f->r, f->alpha, f->dropout);
        for (char *t = tg, *e; t; t = e ? e + 1 : NULL) {
            e = strchr(t, ',');
            if (e)
                *e = 0;
            fprintf(out, "%s\"%s\"", t == tg ? "" : ", ", shown(t));
        }
        fprintf(out, "],\n");
    }
    if (image) /* peft has no image-classification task type: its head is kept by name (peft's
                  image_classification_peft_lora example: modules_to_save=["classifier"]) */
        fprintf(out, "    bias=\"none\", modules_to_save=[\"classifier\"])\n");
    else if (task) /* SEQ_CLS, TOKEN_CLS, QUESTION_ANS keep the head trainable (modules_to_save) */
        fprintf(out, "    bias=\"none\", task_type=\"%s\")\n", task);
    else
        fprintf(out, "    bias=\"none\")\n");
    fprintf(out, "model = get_peft_model(model, lora_config)\n");
    /* TRL's trainers cast a bitsandbytes base's trainable parameters to bf16 (planned: MP_AC_TRL_QUANT);
     * written out so that a loop of one's own plans the same (a no-op before TRL's own) */
    if (mp_trainer_casts_quant_adapters(trainer_of(c), loss_of(c), b->ft, c->model->quant.kind) &&
        mp_par_adapters_cast(&b->par, b->ft, b->precision, true) == MP_AC_TRL_QUANT)
        fprintf(out, "for p in model.parameters():  # as TRL 1.16's trainers do on a 4/8-bit base\n"
                     "    if p.requires_grad:\n        p.data = p.data.to(torch.bfloat16)\n");
}

/* How many of the plan's blocks are checkpointed. */
static size_t checkpointed_blocks(const struct mp_ckpt_plan *p)
{
    size_t n = 0;
    for (size_t i = 0; i < p->L; i++)
        n += p->checkpointed[i];
    return n;
}

/* The loss heads neither TrainingArguments nor a plain torch loop can turn on: where the trainer
 * sets them, said as a comment (the snippet still runs, with HF's loss, which memplan did not plan). */
static void loss_note(FILE *out, const struct mp_report_ctx *c)
{
    if (loss_of(c) == MP_LOSS_CCE) /* axolotl 0.19 integrations/cut_cross_entropy; the fork's transformers/patch.py */
        fprintf(out, "# --loss cce: Cut Cross-Entropy, which this file cannot set. Axolotl: plugins:\n"
                     "#   [axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin] (cut_cross_entropy: true);\n"
                     "# elsewhere, with Axolotl's fork of ml-cross-entropy installed, before get_peft_model:\n"
                     "#   from cut_cross_entropy.transformers import cce_patch; model = cce_patch(model)\n");
    else if (loss_of(c) == MP_LOSS_TORCHTUNE)
        fprintf(out, "# --loss torchtune: torchtune's LinearCrossEntropyLoss runs in torchtune's recipes only, which\n"
                     "# this file cannot set: in the torchtune config, loss:\n"
                     "#   _component_: torchtune.modules.loss.LinearCrossEntropyLoss\n");
}

/* --emit hf: one runnable Python file: the model load, peft, and TrainingArguments(...) with the
 * plan's fields (transformers 5.24: activation_checkpointing*, the gradient_checkpointing* names
 * being deprecated aliases, training_args.py:1537). */
static void snippet_hf(FILE *out, const struct mp_report_ctx *c, const struct mp_candidate *b)
{
    const struct mp_ckpt_plan *p = &b->fit.plan;
    size_t nck = checkpointed_blocks(p);
    bool fsdp = mp_par_is_fsdp(b->par.strategy), ds = mp_par_is_deepspeed(b->par.strategy);
    bool trl = loss_of(c) == MP_LOSS_CHUNKED_NLL;
    model_prelude(out, c, b, "hf", true);
    loss_note(out, c);
    fprintf(out, "# the best plan a Trainer runs: --emit hf searches checkpoint none and layers[:N] only\n");
    if (nck && b->ckpt.strategy != MP_CKPT_LAYERS)
        fprintf(out, "# memplan's plan checkpoints %zu of %zu blocks, which TrainingArguments cannot express\n",
                nck, p->L);
    enum mp_trainer tr = trainer_of(c);
    char tn[16];
    bool dpo = mp_trainer_ref_fwds(tr) > 0; /* (DPO, KTO: a reference model, a config of their own) */
    bool grpo = tr == MP_TRAINER_GRPO && c->prog;
    bool orpo = tr == MP_TRAINER_ORPO; /* (no reference; a config of its own) */
    if (grpo) /* trl 1.16 grpo_trainer.py:983-1003: the reference exists only at beta > 0 */
        fprintf(out, "# GRPO (trl 1.16): train with GRPOTrainer(model, reward_funcs=..., args=args, ...);\n"
                     "# per_device_train_batch_size counts completions; %s\n",
                c->train->ref == MP_REF_NONE ? "beta=0.0: no reference model"
                : c->train->ref == MP_REF_COPY ? "beta > 0: it loads the reference copy planned"
                                               : "beta > 0: the reference is the adapter disabled");
    else if (dpo) /* trl 1.16 dpo_trainer.py:908-927, kto_trainer.py:919-938: ref_model=None makes the reference
              * planned */
        fprintf(out, "# %s (trl 1.16): train with %sTrainer(model, ref_model=None, args=args, ...):\n"
                     "# %s;\n# per_device_train_batch_size counts %s\n",
                mp_trainer_trl_name(tr, tn, sizeof tn), tn,
                c->train->ref == MP_REF_COPY      ? "it loads the reference copy planned"
                : c->train->ref == MP_REF_ADAPTER ? "the reference is the adapter disabled"
                                                  : "the reference's log-probs are precomputed",
                unit_of(tr, loss_of(c), true));
    else if (orpo) /* trl 1.16 experimental/orpo: the model's own logits, no reference model */
        fprintf(out, "# ORPO (trl 1.16, trl.experimental.orpo): train with ORPOTrainer(model, args=args, ...);\n"
                     "# per_device_train_batch_size counts %s\n", unit_of(tr, loss_of(c), true));
    else if (trl) /* TRL 1.16's SFTConfig: its default loss_type="nll" is the chunked head planned */
        fprintf(out,
                "# the loss head planned is TRL's (trl 1.16 SFTConfig, loss_type=\"nll\"): train with SFTTrainer\n");
    bool images = c->model->images > 0; /* (--images: sft only, setup refuses the other trainers) */
    if (images && trl) /* the processor as processing_class: SFTTrainer's vision collator */
        fprintf(out, "# SFTTrainer(model, args=args, train_dataset=dataset.map(planned_size), "
                     "processing_class=processor)\n");
    else if (images) /* Trainer drops the columns its model's forward does not name: keep them */
        fprintf(out, "# Trainer(model, args=args, train_dataset=dataset.map(planned_size),\n"
                     "#     data_collator=DataCollatorForVisionLanguageModeling(processor, max_length=SEQ))\n");
    if (b->par.strategy == MP_PAR_DDP)
        fprintf(out, "# data parallel (DDP) over %llu ranks: launch with torchrun --nproc-per-node %llu "
                     "(or accelerate launch)\n",
                (unsigned long long)mp_par_world(&b->par), (unsigned long long)b->par.gpus);
    bool ep = b->par.ep > 1; /* transformers shards the model itself: no fsdp= argument */
    if (ep)
        fsdp = false;
    if (fsdp && b->precision != MP_PREC_FP32)
        /* accelerate 1.15 utils/dataclasses.py:2137: FSDP2's policy from mixed_precision */
        fprintf(out, "# FSDP2 with bf16=True/fp16=True: accelerate 1.15 gathers the parameters and reduces the\n"
                     "# gradients in that dtype; memplan planned %s (reduction in fp32), which\n"
                     "# TrainingArguments cannot set: use --emit torch for the exact MixedPrecisionPolicy\n",
                cand_prec(b));
    fprintf(out, "args = %s(\n    output_dir=\"memplan-out\",\n",
            dpo || orpo ? mp_trainer_config(tr) : trl ? "SFTConfig" : "TrainingArguments");
    if (grpo) { /* GRPOConfig: the completion, the groups, the reference, the generator */
        fprintf(out, "    max_completion_length=%llu,\n    num_generations=%llu,\n", (unsigned long long)c->prog->opts.completion,
                (unsigned long long)c->num_generations);
        /* (as planned, written out: given, else TRL's default, the accumulation steps) */
        fprintf(out, "    steps_per_generation=%llu,\n",
                (unsigned long long)(c->steps_per_generation ? c->steps_per_generation : b->grad_accum));
        fprintf(out, "    beta=%g,\n", c->beta);
        if (c->num_iterations > 1)
            fprintf(out, "    num_iterations=%llu,\n", (unsigned long long)c->num_iterations);
        if (c->temperature != 1.0)
            fprintf(out, "    temperature=%g,\n", c->temperature);
        if (c->top_p < 1.0)
            fprintf(out, "    top_p=%g,\n", c->top_p);
        if (c->top_k)
            fprintf(out, "    top_k=%llu,\n", (unsigned long long)c->top_k);
        if (c->min_p >= 0)
            fprintf(out, "    min_p=%g,\n", c->min_p);
        if (c->rep_penalty != 1.0)
            fprintf(out, "    repetition_penalty=%g,\n", c->rep_penalty);
        if (c->train->vllm_fraction > 0)
            fprintf(out, "    use_vllm=True,\n    vllm_mode=\"colocate\",\n    vllm_gpu_memory_utilization=%g,\n",
                    c->train->vllm_fraction);
        else if (c->train->vllm_server)
            fprintf(out, "    use_vllm=True,\n    vllm_mode=\"server\",\n");
        if ((c->train->vllm_fraction > 0 || c->train->vllm_server) && !c->vllm_is_correction)
            fprintf(out, "    vllm_importance_sampling_correction=False,\n");
        if (!c->ds3_gather)
            fprintf(out, "    ds3_gather_for_generation=False,\n");
    } else if ((dpo || orpo) && c->prog) /* DPOConfig's, KTOConfig's, ORPOConfig's max_length (prompt +
                                           * completion), default 1024 */
        fprintf(out, "    max_length=%llu,\n", (unsigned long long)c->prog->opts.seq);
    if (dpo && !grpo && mp_trainer_loss_type(tr))
        fprintf(out, "    loss_type=\"%s\",\n", mp_trainer_loss_type(tr));
    if (dpo && !grpo && c->train->ref == MP_REF_NONE)
        fprintf(out, "    precompute_ref_log_probs=True,\n");
    if ((dpo || orpo) && c->disable_dropout != mp_trainer_drops_dropout(tr)) /* (the config's default otherwise) */
        fprintf(out, "    disable_dropout=%s,\n", c->disable_dropout ? "True" : "False");
    if (images && trl) /* SFTConfig's max_length (default 1024) truncates in the collator, image tokens counted */
        fprintf(out, "    max_length=SEQ,\n");
    else if (images) /* (transformers 5.24 trainer.py _remove_unused_columns would drop "images" and
                      * "messages", which the collator reads) */
        fprintf(out, "    remove_unused_columns=False,\n");
    else if (trl && !dpo && !orpo && !grpo) /* SFTConfig's max_length, default 1024: truncation (or, packed,
                                             * the row) at the length planned */
        fprintf(out, "    max_length=%llu,\n", (unsigned long long)(c->prog ? c->prog->opts.seq
                                                   : c->build->seq ? c->build->seq : c->model->seq_len));
    fprintf(out, "    per_device_train_batch_size=%llu,\n", (unsigned long long)b->micro_batch);
    fprintf(out, "    gradient_accumulation_steps=%llu,\n", (unsigned long long)b->grad_accum);
    /* pure bf16: the model is loaded in bf16 and trained without autocast (bf16=False); bf16-amp:
     * loaded in bf16 and bf16=True (the Trainer autocasts: accelerate's mixed precision) */
    fprintf(out, "    bf16=%s,\n    fp16=%s,\n",
            b->precision == MP_PREC_AMP_BF16 || (b->par.mixed_bf16 && !ep) || b->precision == MP_PREC_BF16_AMP
                ? "True"
                : "False",
            b->precision == MP_PREC_AMP_FP16 ? "True" : "False");
    /* activation_checkpointing=True wraps each decoder layer and nothing else: memplan's "layers" */
    fprintf(out, "    activation_checkpointing=%s,\n", b->ckpt.strategy == MP_CKPT_LAYERS ? "True" : "False");
    if (b->ckpt.strategy == MP_CKPT_LAYERS) { /* every_n_layers, offload: trainer.py:1508-1509 */
        fprintf(out, "    activation_checkpointing_kwargs={\"use_reentrant\": False");
        if (b->ckpt.k > 1)
            fprintf(out, ", \"every_n_layers\": %llu", (unsigned long long)b->ckpt.k);
        /* TRL 1.16's selective checkpointing (trl/trainer/sft_trainer.py:1085-1096; the options'
         * rules keep it to SFTConfig and full weights): the old name mirrors the new one
         * (transformers 5.24 training_args.py:1533-1543), which is what TRL reads */
        if (b->ckpt.sac == MP_SAC_TRL)
            fprintf(out, ", \"selective\": True");
        fprintf(out, "%s},\n", b->ckpt.offload ? ", \"offload\": True" : "");
    }
    /* TRL's activation offloading: SFTConfig's flag (trl 1.16 sft_trainer.py:1190-1191 wraps each
     * compute_loss in get_act_offloading_ctx_manager(model)); TrainingArguments has none */
    if (c->train->act_offload && trl)
        fprintf(out, "    activation_offloading=True,\n");
    fprintf(out, "    optim=\"%s\",\n", mp_optimizer_hf(c->train->optimizer));
    if (fsdp) /* training_args.py:_process_fsdp_args (FSDP2; launch with accelerate launch or torchrun) */
        fprintf(out,
                "    fsdp=True,\n    fsdp_config={\"version\": 2, \"auto_wrap_policy\": \"TRANSFORMER_BASED_WRAP\",\n"
                "        \"reshard_after_forward\": %s, \"cpu_offload\": %s},\n",
                b->par.strategy == MP_PAR_FSDP ? "True" : "False",
                b->par.offload == MP_OFFLOAD_PARAMS ? "True" : "False");
    if (ds)
        fprintf(out, "    deepspeed=\"ds_config.json\",   # memplan suggest ... --emit deepspeed > ds_config.json\n");
    if (loss_of(c) == MP_LOSS_LIGER) { /* the fused linear cross-entropy only: the other kernels are not planned */
        unsigned ks = mp_liger_params(c->model->hf_type); /* the keys its apply function takes (liger.c) */
        if (!ks) /* (memplan's own JSON: llama's) */
            ks = MP_LK_FLCE | MP_LK_CROSS_ENTROPY | MP_LK_ROPE | MP_LK_RMS_NORM | MP_LK_SWIGLU;
        fprintf(out, "    use_liger_kernel=True,\n    liger_kernel_config={\"fused_linear_cross_entropy\": True");
        unsigned k = 0;
        for (unsigned bit = MP_LK_CROSS_ENTROPY; bit & MP_LK_ALL; bit <<= 1)
            if (ks & bit)
                fprintf(out, ",%s\"%s\": False", k++ % 3 ? " " : "\n        ", mp_liger_kernel_name(bit));
        fprintf(out, "},\n");
    }
    fprintf(out, ")\n");
    if (c->train->act_offload && !trl)
        fprintf(out, "# --act-offload with HF's loss: TrainingArguments cannot set it; in your own loop run each\n"
                     "# forward and backward inside trl.models.get_act_offloading_ctx_manager(model) (trl 1.16)\n");
    if (packing_of(c) && c->prog && c->prog->opts.padding_free)
        fprintf(out, "# padding-free packing (planned: %llu tokens in one row): trl.SFTConfig(packing=True,\n"
                     "# max_length=%llu) (packing_strategy \"bfd\"), or transformers' DataCollatorWithFlattening\n",
                (unsigned long long)packed_tokens(c, b->micro_batch), (unsigned long long)c->prog->opts.seq);
    else if (packing_of(c))
        fprintf(out, "# rows of packed documents (planned: %llu tokens per micro-batch): the collator passes\n"
                     "# position_ids that restart at each document and no attention_mask\n",
                (unsigned long long)packed_tokens(c, b->micro_batch));
}

/* --emit deepspeed: the DeepSpeed config (JSON) of the plan. */
static void snippet_deepspeed(FILE *out, const struct mp_report_ctx *c, const struct mp_candidate *b)
{
    const struct mp_ckpt_plan *p = &b->fit.plan;
    cJSON *r = cJSON_CreateObject();
    ju64(r, "train_micro_batch_size_per_gpu", b->micro_batch);
    ju64(r, "gradient_accumulation_steps", b->grad_accum);
    ju64(r, "train_batch_size", b->global_batch);
    if (b->precision == MP_PREC_AMP_BF16 || b->precision == MP_PREC_AMP_FP16) {
        /* amp: fp32 parameters (sharded as such) under torch.autocast, as planned (DeepSpeed 0.19
         * runtime/torch_autocast.py); "bf16"/"fp16" would make the parameters half */
        cJSON *ta = cJSON_AddObjectToObject(r, "torch_autocast");
        cJSON_AddBoolToObject(ta, "enabled", 1);
        cJSON_AddStringToObject(ta, "dtype", b->precision == MP_PREC_AMP_FP16 ? "float16" : "bfloat16");
    } else {
        /* bf16 / mixed-bf16: DeepSpeed's bf16 mode (bf16 parameters, fp32 master partition) */
        if (b->precision == MP_PREC_BF16)
            cJSON_AddBoolToObject(cJSON_AddObjectToObject(r, "bf16"), "enabled", 1);
    }
    cJSON *ac = cJSON_AddObjectToObject(r, "activation_checkpointing");
    cJSON_AddBoolToObject(ac, "partition_activations", 0);
    cJSON_AddBoolToObject(ac, "contiguous_memory_optimization", 0);
    ju64(ac, "number_checkpoints", p->n_segments);
    cJSON_AddBoolToObject(ac, "cpu_checkpointing", 0);
    if (mp_par_is_deepspeed(b->par.strategy)) {
        /* explicit sizes: what memplan's per-rank plan assumed (accelerate's "auto" rule) */
        uint64_t h = 0;
        for (size_t q = 0; c->prog && q < c->prog->n_params && !h; q++)
            if (c->prog->params[q].matrix)
                h = c->prog->params[q].cols;
        h = h ? h : 1024;
        cJSON *z = cJSON_AddObjectToObject(r, "zero_optimization");
        jnum(z, "stage", b->par.strategy == MP_PAR_ZERO1 ? 1 : b->par.strategy == MP_PAR_ZERO2 ? 2 : 3);
        cJSON_AddBoolToObject(z, "contiguous_gradients", 1);
        cJSON_AddBoolToObject(z, "overlap_comm", 1);
        ju64(z, "reduce_bucket_size", h * h);
        if (b->par.strategy == MP_PAR_ZERO3) {
            ju64(z, "stage3_prefetch_bucket_size", h * h * 9 / 10);
            ju64(z, "stage3_param_persistence_threshold", 10 * h);
            ju64(z, "stage3_max_live_parameters", 1000000000);
            /* DeepSpeed keeps a gathered parameter whose next use is within this many
             * elements (default 10^9: a model under 10^9 parameters would stay gathered from
             * its forward to its backward); one prefetch bucket keeps the engine within
             * memplan's plan (the current block and the next one gathered) */
            ju64(z, "stage3_max_reuse_distance", h * h * 9 / 10);
        } else {
            ju64(z, "allgather_bucket_size", h * h);
        }
        /* NVMe: DeepSpeed needs nvme_path (None fails at initialize); its docs' example mount,
         * to be set to the user's (README) */
        bool nvme = b->par.offload_device == MP_OFFDEV_NVME;
        if (b->par.offload != MP_OFFLOAD_NONE) {
            cJSON *oo = cJSON_AddObjectToObject(z, "offload_optimizer");
            cJSON_AddStringToObject(oo, "device", mp_offload_dev_str(b->par.offload_device));
            if (nvme)
                cJSON_AddStringToObject(oo, "nvme_path", "/local_nvme");
            cJSON_AddBoolToObject(oo, "pin_memory", 1);
        }
        if (b->par.offload == MP_OFFLOAD_PARAMS) {
            cJSON *op = cJSON_AddObjectToObject(z, "offload_param");
            cJSON_AddStringToObject(op, "device", mp_offload_dev_str(b->par.offload_device));
            if (nvme)
                cJSON_AddStringToObject(op, "nvme_path", "/local_nvme");
            cJSON_AddBoolToObject(op, "pin_memory", 1);
        }
    }
    print_json(out, r);
}

/* --emit accelerate: the accelerate config file (accelerate launch --config_file FILE). */
static void snippet_accelerate(FILE *out, const struct mp_report_ctx *c, const struct mp_candidate *b)
{
    bool ds = mp_par_is_deepspeed(b->par.strategy);
    if (mp_par_is_fsdp(b->par.strategy) && b->ft == MP_FT_QLORA && c->ft && c->model->quant.kind == MP_Q_NONE)
        fprintf(out, "# FSDP-QLoRA: the training script loads the model with BitsAndBytesConfig(...,\n"
                     "# bnb_4bit_quant_storage=torch.%s), as memplan planned (suggest ... --emit hf)\n",
                mp_quant_storage_str(mp_quant_storage(&c->ft->quant, true)));
    fprintf(out, "compute_environment: LOCAL_MACHINE\ndistributed_type: %s\n",
            ds                                 ? "DEEPSPEED"
            : mp_par_is_fsdp(b->par.strategy)  ? "FSDP"
            : b->par.strategy == MP_PAR_DDP    ? "MULTI_GPU"
                                               : "'NO'"); /* quoted: YAML 1.1 reads a bare NO as false */
    if (mp_par_is_fsdp(b->par.strategy)) {
        fprintf(out, "fsdp_config:\n  fsdp_version: 2\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                     "  fsdp_reshard_after_forward: %s\n  fsdp_offload_params: %s\n"
                     "  fsdp_activation_checkpointing: %s\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n",
                b->par.strategy == MP_PAR_FSDP ? "true" : "false",
                b->par.offload == MP_OFFLOAD_PARAMS ? "true" : "false", b->n_ckpt_blocks ? "true" : "false");
    } else if (ds) {
        fprintf(out, "deepspeed_config:\n  zero_stage: %d\n  offload_optimizer_device: %s\n"
                     "  offload_param_device: %s\n  gradient_accumulation_steps: %llu\n",
                b->par.strategy == MP_PAR_ZERO1 ? 1 : b->par.strategy == MP_PAR_ZERO2 ? 2 : 3,
                b->par.offload != MP_OFFLOAD_NONE ? mp_offload_dev_str(b->par.offload_device) : "none",
                b->par.offload == MP_OFFLOAD_PARAMS ? mp_offload_dev_str(b->par.offload_device) : "none",
                (unsigned long long)b->grad_accum);
    }
    if (mp_par_is_fsdp(b->par.strategy) && b->precision != MP_PREC_FP32)
        /* accelerate 1.15 utils/dataclasses.py:2137 */
        fprintf(out, "# under FSDP2, mixed_precision gathers the parameters and reduces the gradients in that\n"
                     "# dtype; memplan planned %s: the fp32 reduction is set only by --emit torch\n", cand_prec(b));
    fprintf(out, "mixed_precision: %s\nnum_machines: %llu\nnum_processes: %llu\nmachine_rank: 0\n",
            b->precision == MP_PREC_AMP_BF16 || b->precision == MP_PREC_BF16 || b->precision == MP_PREC_BF16_AMP
                ? "bf16"
            : b->precision == MP_PREC_AMP_FP16                               ? "fp16"
                                                                             : "no",
            (unsigned long long)(b->par.strategy ? b->par.nodes : 1),
            (unsigned long long)(b->par.strategy ? mp_par_world(&b->par) : 1));
}

/* --emit torch (and the text report): a runnable PyTorch file: the model, its wrapping and
 * checkpointing as planned, and a train() loop on an HF model (model(**batch).loss). */
/* --emit torch of --checkpoint ...+sac[:NAME] (docs/checkpointing.md#sac): the policy as a
 * context_fn `sac` for torch's checkpoint (create_selective_checkpoint_contexts).  TRL's and
 * Axolotl's: the SDPA kernels' ops saved (trl/models/selective_activation_checkpointing.py).
 * memplan's plan (auto): the kept ops as torch meets them in a layer: the SDPA op, and the
 * layer's J-th aten.mm, counted per checkpoint call (a context_fn call is one layer's region; the
 * recompute does not ask the policy: torch/utils/checkpoint.py:1686-1734). */
static void snippet_sac(FILE *out, const struct mp_report_ctx *c, const struct mp_candidate *b)
{
    if (b->ckpt.sac == MP_SAC_NONE)
        return;
    if (b->ckpt.sac == MP_SAC_TORCHTITAN) { /* pytorch/torchtitan b5bcd76c6 distributed/
                                             * activation_checkpoint.py:31-93, :236-285 */
        fprintf(out, "# selective checkpointing: torchtitan's SelectiveAC policy: the outputs of torch's\n"
                     "# compute-intensive ops kept to the recompute, except every second aten.mm of a layer;\n"
                     "# its checkpoint runs with early_stop=False (the recompute runs the whole layer)\n"
                     "from torch._functorch.partitioners import get_default_op_list\n"
                     "from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts\n"
                     "save_ops = {op.default for op in get_default_op_list().compute_intensive_ops}\n"
                     "save_ops |= {getattr(torch.ops.aten, n).default for n in (\"_scaled_dot_product_cudnn_attention\",\n"
                     "             \"_scaled_dot_product_attention_math\", \"max\", \"topk\", \"linear\",\n"
                     "             \"_scaled_dot_product_fused_attention_overrideable\") if hasattr(torch.ops.aten, n)}\n"
                     "mm_ops = {torch.ops.aten.mm.default, torch.ops.aten.linear.default}\n"
                     "def sac():  # one checkpointed layer's region: its own count of aten.mm calls\n"
                     "    count = [0]\n"
                     "    def policy(ctx, op, *args, **kwargs):\n"
                     "        if op in mm_ops and not ctx.is_recompute:\n"
                     "            count[0] += 1\n"
                     "        if op in save_ops and not (op in mm_ops and count[0] %% 2 == 0):\n"
                     "            return CheckpointPolicy.MUST_SAVE\n"
                     "        return CheckpointPolicy.PREFER_RECOMPUTE\n"
                     "    return create_selective_checkpoint_contexts(policy)\n");
        return;
    }
    char names[64][16];
    const char *nodes[64];
    size_t n = b->ckpt.sac == MP_SAC_AUTO ? sac_kept_ops(c->prog, b->fit.plan.sched.sac_keep, names, nodes, 64) : 0;
    bool sdpa = b->ckpt.sac != MP_SAC_AUTO;
    if (b->ckpt.sac == MP_SAC_AUTO)
        fprintf(out, "# selective checkpointing: memplan's plan (layers+sac:auto) keeps in each checkpointed layer:\n");
    else
        fprintf(out, "# selective checkpointing: %s policy: SDPA's kernels' outputs kept to the recompute\n",
                b->ckpt.sac == MP_SAC_TRL ? "TRL's" : "Axolotl's");
    for (size_t i = 0; i < n; i++) {
        fprintf(out, "#   %s (%s)\n", names[i], nodes[i]);
        sdpa |= !strcmp(names[i], "sdpa");
    }
    fprintf(out, "# every other op recomputed\n"
                 "import collections\n"
                 "from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts\n"
                 "sdpa_ops = {getattr(torch.ops.aten, n).default for n in (\"_scaled_dot_product_flash_attention\",\n"
                 "            \"_scaled_dot_product_efficient_attention\", \"_scaled_dot_product_cudnn_attention\",\n"
                 "            \"_scaled_dot_product_flash_attention_for_cpu\") if hasattr(torch.ops.aten, n)}\n"
                 "keep_sdpa, keep_mm = %s, ", sdpa ? "True" : "False");
    bool first = true;
    for (size_t i = 0; i < n; i++)
        if (!strncmp(names[i], "mm:", 3)) {
            fprintf(out, "%s%s", first ? "{" : ", ", names[i] + 3);
            first = false;
        }
    fprintf(out, "%s\n"
                 "def sac():  # one checkpointed layer's region: its own count of aten.mm calls\n"
                 "    count = collections.Counter()\n"
                 "    def policy(ctx, op, *args, **kwargs):\n"
                 "        if op in sdpa_ops:\n"
                 "            return CheckpointPolicy.MUST_SAVE if keep_sdpa else CheckpointPolicy.PREFER_RECOMPUTE\n"
                 "        if op is torch.ops.aten.mm.default:\n"
                 "            j = count[ctx.is_recompute]\n"
                 "            count[ctx.is_recompute] += 1\n"
                 "            if j in keep_mm:\n"
                 "                return CheckpointPolicy.MUST_SAVE\n"
                 "        return CheckpointPolicy.PREFER_RECOMPUTE\n"
                 "    return create_selective_checkpoint_contexts(policy)\n", first ? "set()" : "}");
}

static void snippet_torch(FILE *out, const struct mp_report_ctx *c, const struct mp_candidate *b)
{
    const struct mp_ckpt_plan *p = &b->fit.plan;
    bool amp = b->precision == MP_PREC_AMP_BF16 || b->precision == MP_PREC_AMP_FP16 ||
               b->precision == MP_PREC_BF16_AMP;
    const char *half = b->precision == MP_PREC_AMP_FP16 ? "float16" : "bfloat16";
    size_t nck = checkpointed_blocks(p);
    model_prelude(out, c, b, "torch", false);
    loss_note(out, c);
    fprintf(out, "micro_batch, grad_accum = %llu, %llu   # global batch %llu\n", (unsigned long long)b->micro_batch,
            (unsigned long long)b->grad_accum, (unsigned long long)b->global_batch);
    /* checkpointing first: FSDP2 and DDP wrap the checkpointed layers */
    snippet_sac(out, c, b);
    if (b->ckpt.strategy == MP_CKPT_LAYERS) /* transformers 5.24 modeling_utils.py:3119 */
        fprintf(out, "model.activation_checkpointing_enable({\"use_reentrant\": False%s%s}, every_n_layers=%llu%s)\n",
                b->ckpt.sac != MP_SAC_NONE ? ", \"context_fn\": sac" : "",
                b->ckpt.sac == MP_SAC_TORCHTITAN ? ",\n    \"early_stop\": False" : "",
                (unsigned long long)(b->ckpt.k > 1 ? b->ckpt.k : 1), b->ckpt.offload ? ", offload=True" : "");
    else if (nck) {
        fprintf(out, "# memplan's plan checkpoints these block ranges [start, end) (block 0 = the embeddings):\n"
                     "# wrap each range's modules in one torch.utils.checkpoint.checkpoint call\n"
                     "segments = [");
        for (size_t i = 0; i < p->n_segments; i++)
            fprintf(out, "%s(%zu, %zu)", i ? ", " : "", p->segments[i][0], p->segments[i][1]);
        fprintf(out, "]\n");
        if (p->multilevel)
            fprintf(out, "# (multi-level plan: nested checkpoints; run it with a rotor-style executor)\n");
    }
    if (b->precision == MP_PREC_AMP_FP16)
        fprintf(out, "scaler = torch.amp.GradScaler()\n");
    if (mp_par_is_fsdp(b->par.strategy)) {
        /* FSDP2 (launch: torchrun --nproc-per-node N); memplan planned these settings */
        fprintf(out, "from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy%s\n",
                b->par.offload == MP_OFFLOAD_PARAMS ? ", CPUOffloadPolicy" : "");
        fprintf(out, "kw = dict(reshard_after_forward=%s%s%s)\n", b->par.strategy == MP_PAR_FSDP ? "True" : "False",
                b->par.mixed_bf16 ? ",\n    mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
                                    "reduce_dtype=torch.float32)"
                                  : "",
                b->par.offload == MP_OFFLOAD_PARAMS ? ", offload_policy=CPUOffloadPolicy()" : "");
        /* accelerate >= 1.14's units (fsdp2_prepare_model), which memplan plans */
        fprintf(out,
                "# launch: torchrun --nproc-per-node %llu; accelerate's FSDP2 units: each decoder layer, the\n"
                "# input embedding, the tail [final norm, (tied: embedding,) lm_head] kept after forward,\n"
                "# then the model\n"
                "for layer in model.get_decoder().layers:\n    fully_shard(layer, **kw)\n"
                "emb, head = model.get_input_embeddings(), model.get_output_embeddings()\n"
                "tied = head is not None and head.weight is emb.weight\n"
                "base = getattr(model, model.base_model_prefix, model)\n"
                "tail = [m for m in base.children() if \"Norm\" in type(m).__name__][-1:]\n"
                "if not tied:\n    fully_shard(emb, **kw)\n"
                "tail += ([emb] if tied else []) + ([head] if head is not None else [])\n"
                "fully_shard(tail, **{**kw, \"reshard_after_forward\": False})\n"
                "fully_shard(model, **{k: v for k, v in kw.items() if k != \"reshard_after_forward\"})\n",
                (unsigned long long)b->par.gpus);
    } else if (b->par.strategy == MP_PAR_DDP) {
        fprintf(out, "# launch: torchrun --nproc-per-node %llu (torch.distributed initialized, model on its GPU)\n"
                     "model = torch.nn.parallel.DistributedDataParallel(model)\n",
                (unsigned long long)b->par.gpus);
    } else if (mp_par_is_deepspeed(b->par.strategy)) {
        fprintf(out,
                "# DeepSpeed: model, optimizer, _, _ = deepspeed.initialize(model=model, config=\"ds_config.json\")\n"
                "# (memplan suggest ... --emit deepspeed > ds_config.json); then engine.backward/step\n");
    }
    if (c->train && c->train->optimizer == MP_OPT_MUON) /* torch.optim.Muon's docstring: hidden 2-D weights only */
        fprintf(out, "\n\nclass Optimizers:\n"
                     "    \"\"\"torch.optim.Muon on the hidden layers' 2-D weights, AdamW on the rest (embeddings, the\n"
                     "    output layer, norms, biases): memplan --optimizer muon\"\"\"\n\n"
                     "    def __init__(self, model, lr=0.02, adamw_lr=3e-4):\n"
                     "        skip = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}\n"
                     "        skip |= {id(p) for p in (model.get_output_embeddings() or torch.nn.Module()).parameters()}\n"
                     "        train = [p for p in model.parameters() if p.requires_grad]\n"
                     "        hidden = [p for p in train if p.ndim == 2 and id(p) not in skip]\n"
                     "        rest = [p for p in train if p.ndim != 2 or id(p) in skip]\n"
                     "        self.all = [torch.optim.Muon(hidden, lr=lr)]\n"
                     "        if rest:\n            self.all.append(torch.optim.AdamW(rest, lr=adamw_lr))\n\n"
                     "    def step(self):\n        for o in self.all:\n            o.step()\n\n"
                     "    def zero_grad(self, set_to_none=True):\n        for o in self.all:\n"
                     "            o.zero_grad(set_to_none=set_to_none)\n\n\n"
                     "optimizer = Optimizers(model)   # then train(model, optimizer, loader)\n");
    if (c->train && c->train->act_offload) /* trl 1.16 models/activation_offloading.py */
        fprintf(out, "from trl.models import get_act_offloading_ctx_manager\n"
                     "offload = get_act_offloading_ctx_manager(model)   # TRL's activation offloading\n");
    if (c->model->images) /* the processor's batch: pixel_values and its image keys beside the tokens */
        fprintf(out, "\n\ndef train(model, optimizer, loader):\n"
                     "    \"\"\"loader: micro_batch rows of dataset.map(planned_size) collated by\n"
                     "    DataCollatorForVisionLanguageModeling(processor, max_length=SEQ): input_ids, attention_mask,\n"
                     "    labels, pixel_values and the processor's image keys\"\"\"\n");
    else
        fprintf(out, "\n\ndef train(model, optimizer, loader):\n"
                     "    \"\"\"loader: dicts of input_ids, attention_mask, labels of micro_batch rows\"\"\"\n");
    fprintf(out, "    model.train()\n"
                 "    for step, batch in enumerate(loader):\n");
    /* TRL's activation offloading around the forward, as SFTTrainer runs it (sft_trainer.py:1590-1611;
     * the pack hooks' tensors come back in backward, outside the context) */
    bool aoff = c->train && c->train->act_offload;
    const char *in = aoff ? "    " : "";
    if (aoff)
        fprintf(out, "        with offload:   # --act-offload\n");
    if (amp)
        fprintf(out, "%s        with torch.autocast(\"cuda\", dtype=torch.%s):\n"
                     "%s            loss = model(**batch).loss / grad_accum\n",
                in, half, in);
    else
        fprintf(out, "%s        loss = model(**batch).loss / grad_accum\n", in);
    if (b->precision == MP_PREC_AMP_FP16)
        fprintf(out, "        scaler.scale(loss).backward()\n");
    else
        fprintf(out, "        loss.backward()\n");
    fprintf(out, "        if (step + 1) %% grad_accum == 0:\n            %s\n"
                 "            optimizer.zero_grad(set_to_none=True)\n",
            b->precision != MP_PREC_AMP_FP16 ? "optimizer.step()"
            : c->train && c->train->optimizer == MP_OPT_MUON
                ? "for o in optimizer.all:\n                scaler.step(o)\n            scaler.update()"
                : "scaler.step(optimizer)\n            scaler.update()");
}

#define MP_X(id, name) name,
static const char *const EMITS[] = {MP_EMITS(MP_X)};
#undef MP_X
#define N_EMITS (sizeof EMITS / sizeof EMITS[0])
int mp_emit_parse(const char *s)
{
    for (size_t i = 0; i < N_EMITS; i++)
        if (!strcmp(s, EMITS[i]))
            return (int)i;
    return -1;
}
const char *mp_emit_str(enum mp_emit e) { return (size_t)e < N_EMITS ? EMITS[e] : "?"; }
const char *mp_emit_names(const char *sep, const char *last)
{
    static char buf[64];
    return mp_join(buf, sizeof buf, EMITS + 1, N_EMITS - 1, sep, last); /* not "none" */
}

static void snippet(FILE *out, const struct mp_report_ctx *c, const struct mp_candidate *b, enum mp_emit emit)
{
    switch (emit) {
    case MP_EMIT_HF: snippet_hf(out, c, b); return;
    case MP_EMIT_DEEPSPEED: snippet_deepspeed(out, c, b); return;
    case MP_EMIT_ACCELERATE: snippet_accelerate(out, c, b); return;
    case MP_EMIT_NONE:
    case MP_EMIT_TORCH: snippet_torch(out, c, b); return;
    }
}

static cJSON *json_candidate(const struct mp_candidate *b)
{
    cJSON *o = cJSON_CreateObject();
    ju64(o, "micro_batch", b->micro_batch);
    ju64(o, "grad_accum", b->grad_accum);
    ju64(o, "global_batch", b->global_batch);
    cJSON_AddStringToObject(o, "precision", cand_prec(b));
    cJSON_AddStringToObject(o, "finetune", mp_ft_mode_str(b->ft));
    if (b->par.strategy != MP_PAR_NONE) {
        cJSON *p = json_parallel_of(&b->par);
        ju64(p, "host_bytes", b->fit.est.host_bytes);
        jnum(p, "comm_s", b->fit.comm_s);
        jnum(p, "exposed_comm_s", b->fit.exposed_comm_s);
        jnum(p, "offload_s", b->fit.offload_s);
        cJSON_AddItemToObject(o, "parallel", p);
    }
    cJSON_AddBoolToObject(o, "fits", b->fits);
    cJSON_AddItemToObject(o, "plan", json_plan(&b->fit.plan, b->fit.est.fwd_flops + b->fit.est.bwd_flops));
    ju64(o, "peak_device_bytes", b->peak_device_bytes);
    ju64(o, "peak_allocated_bytes", b->fit.est.peak_allocated_bytes);
    ju64(o, "capacity_bytes", b->capacity_bytes);
    ju64(o, "usable_bytes", b->usable_bytes);
    jnum(o, "headroom_pct", round(b->headroom_pct * 100) / 100);
    jnum(o, "samples_per_s", round(b->samples_per_s * 100) / 100);
    cJSON_AddStringToObject(o, "source", b->probed ? "probe" : "estimate");
    cJSON_AddStringToObject(o, "peak_event", b->fit.est.peak_event);
    if (b->fit.device_simulated) { /* the device level decided a fitting candidate */
        cJSON_AddBoolToObject(o, "fits_device", b->fit.fits_device);
        ju64(o, "device_bytes", b->fit.device_bytes);
    }
    if (b->fit.est.host_pinned_bytes) /* --checkpoint layers+offload, --act-offload */
        ju64(o, "host_pinned_bytes", b->fit.est.host_pinned_bytes);
    cJSON_AddBoolToObject(o, "probed", b->probed);
    cJSON_AddBoolToObject(o, "probe_oom", b->probe_oom);
    if (b->probed) { /* measured with memplan's kernels: reported, never ranked against estimates */
        jnum(o, "probe_samples_per_s", round(b->probe_samples_per_s * 100) / 100);
        jnum(o, "probe_step_ms", round(b->probe_step_ms * 1000) / 1000);
        ju64(o, "probe_peak_allocated_bytes", b->probe_peak_bytes);
    }
    return o;
}

/* A candidate's parallel column: "zero3+opt-off x8", "fsdp+ep2 x16". */
static const char *cand_par_label(const struct mp_candidate *k, char *buf, size_t len)
{
    char epb[24] = "";
    if (k->par.ep > 1)
        snprintf(epb, sizeof epb, "+ep%llu", (unsigned long long)k->par.ep);
    snprintf(buf, len, "%s%s%s x%llu", mp_par_strategy_str(k->par.strategy),
             k->par.offload == MP_OFFLOAD_OPTIMIZER ? "+opt-off"
             : k->par.offload == MP_OFFLOAD_PARAMS  ? "+par-off"
                                                    : "",
             epb, (unsigned long long)mp_par_world(&k->par));
    return buf;
}

static void report_suggest(FILE *out, const struct mp_report_ctx *c, const struct mp_suggestion *s, enum mp_emit emit)
{
    const char *target = c->gpu ? c->gpu->name : "the target"; /* (fill_ctx leaves out a 0-byte target) */
    if (c->json) {
        cJSON *r = json_root(c);
        if (s->best >= 0) {
            cJSON *rc = json_candidate(&s->cand[s->best]);
            if (packing_of(c))
                ju64(rc, "tokens_per_micro_batch", packed_tokens(c, s->cand[s->best].micro_batch));
            if (c->recipe) /* the keys of the recipe to change for this plan */
                cJSON_AddItemToObject(rc, "recipe_changes", json_recipe_changes(c->recipe, &s->cand[s->best]));
            if (s->grpo_max_completion) { /* GRPO: the plan's limits (mp_grpo_limits) */
                cJSON *g = cJSON_AddObjectToObject(rc, "grpo_limits");
                ju64(g, "max_completion_length", s->grpo_max_completion);
                cJSON_AddBoolToObject(g, "at_least", s->grpo_completion_capped);
                if (s->grpo_max_vllm > 0)
                    cJSON_AddNumberToObject(g, "max_vllm_fraction", s->grpo_max_vllm);
            }
            cJSON_AddItemToObject(r, "recommendation", rc);
        } else {
            cJSON_AddNullToObject(r, "recommendation");
        }
        cJSON *a = cJSON_AddArrayToObject(r, "candidates");
        for (size_t i = 0; i < s->n; i++)
            cJSON_AddItemToArray(a, json_candidate(&s->cand[i]));
        cJSON_AddBoolToObject(r, "global_batch_met", s->global_met);
        cJSON_AddStringToObject(r, "note", s->note);
        cJSON *alt = cJSON_AddArrayToObject(r, "alternatives");
        for (size_t i = 0; i < s->n_alternatives; i++)
            cJSON_AddItemToArray(alt, cJSON_CreateString(s->alternatives[i]));
        jnum(r, "probes", s->probes);
        ju64(r, "probe_capacity_bytes", s->probe_capacity_bytes);
        cJSON_AddStringToObject(r, "probe_note", s->probe_note);
        print_json(out, r);
        return;
    }
    if (emit != MP_EMIT_NONE && s->best >= 0) {
        /* --emit deepspeed after a search over strategies: the fastest DeepSpeed candidate */
        int pick = s->best;
        if (emit == MP_EMIT_DEEPSPEED && s->cand[pick].par.strategy != MP_PAR_NONE &&
            !mp_par_is_deepspeed(s->cand[pick].par.strategy))
            for (size_t i = 0; i < s->n; i++)
                if (s->cand[i].fits && mp_par_is_deepspeed(s->cand[i].par.strategy) &&
                    (!mp_par_is_deepspeed(s->cand[pick].par.strategy) ||
                     s->cand[i].samples_per_s > s->cand[pick].samples_per_s))
                    pick = (int)i;
        snippet(out, c, &s->cand[pick], emit);
        return;
    }
    if (s->best < 0) {
        fprintf(out, "memplan: %s does not fit %s: %s\n", shown(c->model->name), shown(target),
                shown(s->note));
        for (size_t i = 0; i < s->n_alternatives; i++)
            fprintf(out, "  would fit or help: %s\n", shown(s->alternatives[i]));
        if (!s->n_alternatives)
            fprintf(out, "  no listed GPU, optimizer or precision change makes it fit on one GPU\n");
    } else {
        const struct mp_candidate *b = &s->cand[s->best];
        char sb[32];
        fprintf(out, "recommended for %s on %s\n\n", shown(c->model->name), shown(target));
        fprintf(out, "  micro-batch        %llu\n", (unsigned long long)b->micro_batch);
        if (packing_of(c))
            packing_line(out, c, b->micro_batch, "  tokens             ");
        fprintf(out, "  grad accumulation  %llu   (global batch %llu%s)\n", (unsigned long long)b->grad_accum,
                (unsigned long long)b->global_batch, s->global_met ? "" : ", requested global batch NOT met");
        if (b->ft != MP_FT_FULL)
            fprintf(out, "  finetune           %s (%s)\n", mp_ft_mode_str(b->ft),
                    b->ft == MP_FT_QLORA ? "4-bit NF4 base, dequantized per matmul: slower, smaller"
                                         : "adapters on a frozen base; --emit hf prints the peft config");
        fprintf(out, "  precision          %s\n", cand_prec(b));
        enum mp_trainer tr = trainer_of(c);
        char tn[16];
        if (mp_trainer_ref_fwds(tr))
            fprintf(out, "  trainer            %s (%s %sTrainer): micro-batch counts %s; reference %s\n",
                    mp_trainer_str(tr), mp_trainer_lf(tr, loss_of(c)) ? "LLaMA-Factory 0.9.5 Custom" : "TRL 1.16.0",
                    mp_trainer_trl_name(tr, tn, sizeof tn), unit_of(tr, loss_of(c), false), ref_desc_of(c));
        if (s->grpo_max_completion) { /* (mp_grpo_limits) */
            fprintf(out, "  GRPO limits        max_completion_length %s %llu fits this plan",
                    s->grpo_completion_capped ? "at least" : "up to", (unsigned long long)s->grpo_max_completion);
            if (s->grpo_max_vllm > 0)
                fprintf(out, "; vllm_gpu_memory_utilization up\n                     to %.2f", s->grpo_max_vllm);
            fputs(" (the prompt as planned)\n", out);
        }
        if (c->prog && c->prog->opts.completion)
            fprintf(out, "  loss head          %s (TRL's fused LM head); labels on the %llu completion tokens\n",
                    mp_loss_str(loss_of(c)), (unsigned long long)c->prog->opts.completion);
        else if (loss_of(c) != MP_LOSS_HF)
            fprintf(out, "  loss head          %s (%s); label fraction %.3g\n", mp_loss_str(loss_of(c)),
                    mp_trainer_ref_fwds(tr) ? "TRL's fused LM head, policy and reference" : mp_loss_how(loss_of(c)),
                    label_fraction_of(c));
        if (b->par.strategy != MP_PAR_NONE) {
            char pb[96];
            fprintf(out, "  parallel           %s; per step %.3f s of collectives (%.3f s not hidden by compute)",
                    mp_par_describe(&b->par, pb, sizeof pb), b->fit.comm_s, b->fit.exposed_comm_s);
            if (b->fit.offload_s > 0)
                fprintf(out, ", offload %.3f s, host RAM %s per rank", b->fit.offload_s, B(b->fit.est.host_bytes));
            fprintf(out, "\n  launch             torchrun --nnodes %llu --nproc-per-node %llu train.py%s\n",
                    (unsigned long long)b->par.nodes, (unsigned long long)b->par.gpus,
                    mp_par_is_deepspeed(b->par.strategy) ? "   (DeepSpeed config: --emit deepspeed)"
                    : b->par.ep > 1                      ? "   (DistributedConfig: --emit hf)"
                                                         : "   (accelerate config: --emit accelerate)");
        }
        if (b->n_ckpt_blocks) {
            fprintf(out, "  checkpointing      %s: blocks ", mp_ckpt_spec_str(&b->ckpt, sb, sizeof sb));
            mp_report_plan_blocks(out, &b->fit.plan);
            fprintf(out, " (+%.1f%% recompute)\n", b->recompute_pct);
        } else {
            fprintf(out, "  checkpointing      none\n");
        }
        fprintf(out, "  expected peak      %s of %s (%.1f%% headroom), peak at %s\n", B(b->peak_device_bytes),
                B(b->capacity_bytes), b->headroom_pct, shown(b->fit.est.peak_event));
        if (b->fit.device_simulated)
            fprintf(out, "  device level       %s reserved + context of %s usable (caching allocator "
                    "simulated%s)\n", B(b->fit.device_bytes), B(b->usable_bytes),
                    b->fit.est.alloc_retries ? ", after it frees its cache" : "");
        if (b->fit.est.host_pinned_bytes && b->par.strategy == MP_PAR_NONE) /* (ranks: their line above) */
            fprintf(out, "  host RAM (pinned)  %s (%s; PCIe %s per step)\n", B(b->fit.est.host_pinned_bytes),
                    b->fit.est.act_offload_pcie_bytes ? "offloaded activations" : "offloaded checkpoint inputs",
                    B(b->fit.est.act_offload_pcie_bytes ? b->fit.est.act_offload_pcie_bytes
                                                        : 2 * b->fit.est.ckpt_offload_bytes));
        fprintf(out, "  throughput         %.1f samples/s (estimate: FLOPs at 50%% of the profile's dense TFLOP/s%s)\n",
                b->samples_per_s,
                b->fit.est.dequant_bytes > 0 ? ",\n                     dequantization at its bandwidth" : "");
        for (size_t i = 0; i < s->n_alternatives; i++) /* variants that do better (search.c VARIANTS) */
            fprintf(out, "  would do better    %s\n", shown(s->alternatives[i]));
        if (b->probed)
            fprintf(out, "  probe              micro-batch %llu ran in %s (peak %s, %.1f ms/step with memplan's "
                         "kernels)\n",
                    (unsigned long long)b->micro_batch, B(s->probe_capacity_bytes), B(b->probe_peak_bytes),
                    b->probe_step_ms);
        else if (s->probe_note[0])
            fprintf(out, "  probe              %s\n", shown(s->probe_note));
        if (s->note[0])
            fprintf(out, "  note               %s\n", shown(s->note));
        if (c->recipe)
            recipe_changes_line(out, c->recipe, b);
    }
    fputc('\n', out); /* the answer, then what it was worked out for */
    header(out, c);
    bool par_col = s->n && s->cand[0].par.strategy != MP_PAR_NONE;
    bool ftcol = c->ft && c->ft->mode != MP_FT_FULL;
    if (ftcol)
        finetune_assumptions(out, c);
    /* The parallel and checkpoint columns are as wide as their longest entry ("zero3+opt-off x8",
     * "layers:8+sac:torchtitan"); a row's last word shortens when the line would pass 100 columns. */
    int ckw = 14, parw = 0;
    for (size_t i = 0; i < s->n; i++) {
        char sb[48], lb[64];
        int n = (int)strlen(mp_ckpt_spec_str(&s->cand[i].ckpt, sb, sizeof sb));
        ckw = n > ckw ? n : ckw;
        n = (int)strlen(cand_par_label(&s->cand[i], lb, sizeof lb)) + 1;
        parw = par_col && n > parw ? n : parw;
    }
    if (par_col && parw < 9)
        parw = 9;
    int used = (ftcol ? 6 : 0) + parw + 10 + 1 + ckw + 54; /* 54: " micro accum ... samples/s " */
    bool room = used + 20 <= 100, mark_room = used + 14 <= 100; /* "probe: out of memory", "<- recommended" */
    fprintf(out, "\n%s%-*s%-10s %-*s %6s %5s %10s %8s %9s %9s\n", ftcol ? "tune  " : "", parw, par_col ? "parallel" : "",
            "precision", ckw, "checkpoint", "micro", "accum", "peak", "headroom", "recompute", "samples/s");
    for (size_t i = 0; i < s->n; i++) {
        const struct mp_candidate *k = &s->cand[i];
        char sb[48], pk[32], lb[64];
        if (ftcol)
            fprintf(out, "%-5s ", mp_ft_mode_str(k->ft));
        if (par_col)
            fprintf(out, "%-*s", parw, cand_par_label(k, lb, sizeof lb));
        const char *last = !k->fits           ? (k->probe_oom ? (room ? "probe: out of memory" : "probe OOM")
                                                                  : (room ? "does not fit" : "no fit"))
                           : (int)i == s->best ? (mark_room ? "<- recommended" : "<-")
                                               : NULL;
        fprintf(out, "%-10s %-*s %6llu %5llu %10s %7.1f%% %8.1f%% %9.1f%s%s\n", cand_prec(k), ckw,
                mp_ckpt_spec_str(&k->ckpt, sb, sizeof sb), (unsigned long long)k->micro_batch,
                (unsigned long long)k->grad_accum, mp_fmt_bytes(k->peak_device_bytes, pk, 32), k->headroom_pct,
                k->recompute_pct, k->samples_per_s, last ? " " : "", last ? last : "");
    }
    if (s->best >= 0 && mp_trainer_lf(trainer_of(c), loss_of(c))) {
        /* LLaMA-Factory's step (lower_lf_dpo_loss): no TRL config runs it */
        const struct mp_candidate *k = &s->cand[s->best];
        char tn[16];
        mp_trainer_trl_name(trainer_of(c), tn, sizeof tn);
        fprintf(out, "\n# LLaMA-Factory's %s step (stage: %s): per_device_train_batch_size: %llu,\n"
                "# gradient_accumulation_steps: %llu in its YAML (suggest --write-recipe writes them)\n", tn,
                mp_trainer_str(trainer_of(c)), (unsigned long long)k->micro_batch, (unsigned long long)k->grad_accum);
    } else if (s->best >= 0) { /* (DPO: no torch loop; its DPOConfig) */
        fprintf(out, "\n");
        snippet(out, c, &s->cand[s->best],
                mp_trainer_ref_fwds(trainer_of(c)) || s->cand[s->best].par.ep > 1 ? MP_EMIT_HF : MP_EMIT_TORCH);
    }
}

/* ---- probe ------------------------------------------------------------------------------------ */

static void report_probe(FILE *out, const struct mp_report_ctx *c, const struct mp_estimate *e,
                         const struct mp_probe_result *r)
{
    if (c->json) {
        cJSON *root = json_root(c);
        json_memory(root, c, e);
        cJSON *p = cJSON_AddObjectToObject(root, "probe");
        cJSON_AddStringToObject(p, "backend", r->backend);
        cJSON_AddStringToObject(p, "device", r->dev.name);
        ju64(p, "device_total_bytes", r->dev.total_bytes);
        ju64(p, "device_free_bytes", r->dev.free_bytes);
        cJSON_AddBoolToObject(p, "fits", r->fits);
        if (!r->fits) {
            ju64(p, "oom_request_bytes", r->oom_request_bytes);
            cJSON_AddStringToObject(p, "oom_event", r->oom_event);
        }
        jnum(p, "steps", r->steps);
        cJSON *l = cJSON_AddArrayToObject(p, "losses");
        for (unsigned i = 0; i < r->steps && i < 64; i++)
            cJSON_AddItemToArray(l, cJSON_CreateNumber(r->losses[i]));
        ju64(p, "measured_peak_bytes", r->measured_peak_bytes);
        ju64(p, "device_used_bytes", r->device_used_after);
        ju64(p, "device_used_before_bytes", r->device_used_before);
        ju64(p, "outside_pool_bytes", r->outside_pool_bytes);
        jnum(p, "step_ms", r->step_ms);
        jnum(p, "samples_per_s", r->samples_per_s);
        jnum(p, "gemm_tflops", r->gemm_tflops);
        print_json(out, root);
        return;
    }
    header(out, c);
    fprintf(out, "backend   %s on %s\n", r->backend, shown(r->dev.name));
    if (r->dev.total_bytes)
        fprintf(out, "device    %s total, %s free before the probe\n", B(r->dev.total_bytes), B(r->dev.free_bytes));
    if (!r->fits) {
        fprintf(out, "\ndoes not fit: out of memory asking for %s at %s\n", B(r->oom_request_bytes),
                shown(r->oom_event));
        fprintf(out, "estimated peak allocated %s at %s\n", B(e->peak_allocated_bytes), shown(e->peak_event));
        return;
    }
    double diff = e->peak_allocated_bytes
                      ? 100.0 * ((double)r->measured_peak_bytes - (double)e->peak_allocated_bytes) /
                            (double)e->peak_allocated_bytes
                      : 0;
    fprintf(out, "\n%-22s %14s %14s %8s\n", "", "estimated", "measured", "diff");
    fprintf(out, "%-22s %14s %14s %+7.2f%%\n", "peak allocated", B(e->peak_allocated_bytes),
            B(r->measured_peak_bytes), diff);
    if (r->device_used_after)
        fprintf(out, "%-22s %14s %14s\n", "device used (after)", B(e->peak_device_bytes), B(r->device_used_after));
    fprintf(out, "\nstep time  %.2f ms (median of %u steps, warm-up excluded), %.1f samples/s\n", r->step_ms, r->steps,
            r->samples_per_s);
    if (r->gemm_tflops > 0)
        fprintf(out, "GEMMs      %.1f TFLOP/s\n", r->gemm_tflops);
    fprintf(out, "losses    ");
    for (unsigned i = 0; i < r->steps && i < 64; i++)
        fprintf(out, " %.4f", r->losses[i]);
    fputc('\n', out);
}

/* ---- fitting text to the terminal ------------------------------------------------------------ */

/* Hanging indent for the continuation of a long line: where its value starts
 * (after the label and a run of two or more spaces), else two past its indent;
 * at most half the width, so every continuation has room. */
static size_t hang(const char *l, size_t n, size_t width)
{
    size_t ls = 0;
    while (ls < n && l[ls] == ' ')
        ls++;
    for (size_t i = ls + 1; i + 1 < n; i++)
        if (l[i] == ' ' && l[i + 1] == ' ' && l[i - 1] != ' ') {
            size_t h = i;
            while (h < n && l[h] == ' ')
                h++;
            if (h <= width / 2)
                return h;
            break;
        }
    return ls + 2 <= width / 2 ? ls + 2 : width / 2;
}

void mp_report_fit_text(FILE *out, const char *text, size_t len, size_t width)
{
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
            n--;
        size_t h = n > width ? hang(p, n, width) : 0, pos = 0, col0 = 0;
        while (n - pos + col0 > width) {
            /* the last space at or before the width; a word longer than the line is cut */
            size_t lim = pos + (width - col0), brk = lim;
            while (brk > pos && p[brk] != ' ')
                brk--;
            if (brk == pos) { /* cut, but not inside a UTF-8 character */
                brk = lim;
                while (brk > pos + 1 && ((unsigned char)p[brk] & 0xC0) == 0x80)
                    brk--;
            }
            size_t e = brk;
            while (e > pos && p[e - 1] == ' ')
                e--;
            fprintf(out, "%*s%.*s\n", (int)col0, "", (int)(e - pos), p + pos);
            pos = brk;
            while (pos < n && p[pos] == ' ')
                pos++;
            col0 = h;
        }
        fprintf(out, "%*s%.*s", (int)(pos < n ? col0 : 0), "", (int)(n - pos), p + pos);
        if (nl)
            fputc('\n', out);
        p = nl ? nl + 1 : end;
    }
}

/* Text reports go through mp_report_fit_text (--wide: trailing blanks stripped, no
 * wrapping); JSON goes straight out. */
struct fitted {
    FILE *dst, *mem;
    char *buf;
    size_t len;
    size_t width;
};

static FILE *fit_begin(struct fitted *f, FILE *dst, const struct mp_report_ctx *c)
{
    memset(f, 0, sizeof *f);
    f->dst = dst;
    f->width = c->wide ? SIZE_MAX : MP_TEXT_COLUMNS;
    if (!c->json)
        f->mem = open_memstream(&f->buf, &f->len);
    return f->mem ? f->mem : dst;
}

static void fit_end(struct fitted *f)
{
    if (!f->mem)
        return;
    if (fclose(f->mem) == 0)
        mp_report_fit_text(f->dst, f->buf, f->len, f->width);
    else
        fputs("memplan: out of memory formatting the report\n", f->dst);
    free(f->buf);
}

#define FITTED(dst, c, call)                                                                                   \
    do {                                                                                                       \
        struct fitted fit_;                                                                                    \
        FILE *o_ = fit_begin(&fit_, (dst), (c));                                                               \
        call;                                                                                                  \
        fit_end(&fit_);                                                                                        \
    } while (0)

void mp_report_estimate(FILE *out, const struct mp_report_ctx *c, const struct mp_estimate *e,
                        const struct mp_ckpt_plan *plan)
{
    FITTED(out, c, report_estimate(o_, c, e, plan));
}

void mp_report_plan(FILE *out, const struct mp_report_ctx *c, const struct mp_fit *f, const struct mp_plan_cmp *cmp)
{
    FITTED(out, c, report_plan(o_, c, f, cmp));
}

void mp_report_plan_none(FILE *out, const struct mp_report_ctx *c, const struct mp_fit *f, const char *reason)
{
    FITTED(out, c, report_plan_none(o_, c, f, reason));
}

void mp_report_check(FILE *out, const struct mp_report_ctx *c, const struct mp_fit *f)
{
    FITTED(out, c, report_check(o_, c, f));
}

void mp_report_suggest(FILE *out, const struct mp_report_ctx *c, const struct mp_suggestion *s, enum mp_emit emit)
{
    FITTED(out, c, report_suggest(o_, c, s, emit));
}

void mp_report_probe(FILE *out, const struct mp_report_ctx *c, const struct mp_estimate *e,
                     const struct mp_probe_result *r)
{
    FITTED(out, c, report_probe(o_, c, e, r));
}
