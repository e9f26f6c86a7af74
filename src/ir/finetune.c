/* finetune.c — the fine-tuning spec: parsing, peft's default targets, HF module
 * names per family, and which Linears / blocks train (see finetune.h).
 */
#include "finetune.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MP_X(id, name) name,
static const char *const FT_MODES[] = {MP_FT_MODES(MP_X)};
#undef MP_X
#define N_FT_MODES (sizeof FT_MODES / sizeof FT_MODES[0])

const char *mp_ft_mode_str(enum mp_ft_mode m) { return (unsigned)m < N_FT_MODES ? FT_MODES[m] : "?"; }

int mp_ft_mode_parse(const char *s)
{
    for (size_t i = 0; i < N_FT_MODES; i++)
        if (!strcmp(s, FT_MODES[i]))
            return (int)i;
    return -1;
}

const char *mp_ft_mode_names(const char *sep, const char *last)
{
    static char buf[64];
    return mp_join(buf, sizeof buf, FT_MODES, N_FT_MODES, sep, last);
}

void mp_finetune_default(struct mp_finetune *f)
{
    memset(f, 0, sizeof *f);
    f->mode = MP_FT_FULL;
    f->r = 16;
    f->alpha = 32;
    f->dropout = 0.0;
    f->kbit_prepare = true;
    mp_quant_init(&f->quant, MP_Q_BNB_NF4);
    f->quant.double_quant = true; /* the QLoRA recipe (bnb's own default is off) */
    f->quant.storage = -1;        /* auto: bf16 under FSDP2 (the FSDP-QLoRA recipe), else uint8 */
}

enum mp_dtype mp_finetune_adapter_dtype(const struct mp_finetune *f, enum mp_dtype param_dtype)
{
    /* trl 1.16 sft_trainer.py:908-911 (grpo, dpo, kto alike): param.data.to(torch.bfloat16) */
    return f->adapters_cast == MP_AC_NONE ? MP_DT_F32 : f->adapters_cast == MP_AC_TRL_QUANT ? MP_DT_BF16 : param_dtype;
}

/* ---- family names -------------------------------------------------------------------------- */

/* Head Linears whose module name differs from memplan's layer name (one row each). */
static const struct {
    const char *type, *role, *hf;
} HEAD_NAMES[] = {
    {"distilbert", "transform.dense", "vocab_transform"},
};

/* The family's row (model_hf.c families[]: names), or NULL. */
static const struct mp_hf_names *fam(const char *hf_type)
{
    return hf_type && *hf_type ? mp_hf_family_names(hf_type) : NULL;
}

/* Families whose all-linear peft 0.21 extends to what memplan does not lower as Linears (on
 * transformers 5.23: the routers and the fused expert tensors of MoE blocks, through peft's
 * parameter targeting; OLMoE on 5.24 too, while GraniteMoE's all-linear adapts the attention's
 * Linears alone, as memplan does: tests/test_model_hf.c); named targets are exact
 * (tests/test_finetune.c). */
static const char *const ALL_LINEAR_UNMODELLED[] = {"mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3",
                                                            "olmoe"};

bool mp_finetune_all_linear_unmodelled(const struct mp_finetune *f, const char *hf_type)
{
    if ((f->mode != MP_FT_LORA && f->mode != MP_FT_QLORA) || f->n_targets || !hf_type)
        return false;
    if (!f->all_linear && mp_finetune_default_targets(hf_type))
        return false;
    for (size_t i = 0; i < sizeof ALL_LINEAR_UNMODELLED / sizeof ALL_LINEAR_UNMODELLED[0]; i++)
        if (!strcmp(ALL_LINEAR_UNMODELLED[i], hf_type))
            return true;
    return false;
}

const char *mp_finetune_default_targets(const char *hf_type)
{
    const struct mp_hf_names *f = fam(hf_type);
    return f ? f->peft : NULL;
}

const char *mp_finetune_hf_name(const char *hf_type, const char *role)
{
    const struct mp_hf_names *f = fam(hf_type);
    if (!strcmp(hf_type, "siglip_vision_model")) /* SiglipAttention's output projection (--images) */
        return !strcmp(role, "o_proj") ? "out_proj" : role;
    if (!strcmp(hf_type, "qwen2_vl_vision")) /* VisionAttention's qkv and proj (--images) */
        return !strcmp(role, "o_proj") ? "proj" : !strcmp(role, "qkv_proj") ? "qkv" : role;
    if (!f)
        return role;
    const char *r = NULL;
    if (!strcmp(role, "qkv_proj"))
        r = f->qkv;
    else if (!strcmp(role, "o_proj"))
        r = f->o;
    else if (!strcmp(role, "fc1"))
        r = f->fc1;
    else if (!strcmp(role, "fc2"))
        r = f->fc2;
    else if (!strcmp(role, "q_proj"))
        r = f->q;
    else if (!strcmp(role, "k_proj"))
        r = f->k;
    else if (!strcmp(role, "v_proj"))
        r = f->v;
    for (size_t i = 0; !r && i < sizeof HEAD_NAMES / sizeof HEAD_NAMES[0]; i++)
        if (!strcmp(HEAD_NAMES[i].type, hf_type) && !strcmp(HEAD_NAMES[i].role, role))
            r = HEAD_NAMES[i].hf;
    return r ? r : role;
}

/* ---- parsing -------------------------------------------------------------------------------- */

enum mp_status mp_finetune_parse_targets(struct mp_finetune *f, const char *s, struct mp_diag *d)
{
    f->n_targets = 0;
    f->all_linear = false;
    if (!strcmp(s, "all-linear")) {
        f->all_linear = true;
        return MP_OK;
    }
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 0 || n >= sizeof f->targets[0])
            return mp_fail(d, MP_ERR_USAGE, "--lora-targets: expected all-linear or NAME[,NAME...], got '%s'", s);
        if (f->n_targets == MP_FT_TARGETS_MAX)
            return mp_fail(d, MP_ERR_USAGE, "--lora-targets: at most %d names", MP_FT_TARGETS_MAX);
        memcpy(f->targets[f->n_targets], p, n);
        f->targets[f->n_targets][n] = 0;
        f->n_targets++;
        p += n + (e != NULL);
        if (e && !*p)
            return mp_fail(d, MP_ERR_USAGE, "--lora-targets: expected all-linear or NAME[,NAME...], got '%s'", s);
    }
    if (!f->n_targets)
        return mp_fail(d, MP_ERR_USAGE, "--lora-targets: expected all-linear or NAME[,NAME...], got '%s'", s);
    return MP_OK;
}

static bool parse_u(const char *p, const char *end, uint64_t *out)
{
    if (p == end || end - p > 9)
        return false;
    uint64_t v = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9')
            return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return true;
}

enum mp_status mp_finetune_parse_blocks(struct mp_finetune *f, const char *s, struct mp_diag *d)
{
    f->n_ranges = 0;
    f->train_embed = f->train_head = false;
    const char *p = s;
    if (!*p)
        goto bad;
    while (*p) {
        const char *e = strchr(p, ',');
        const char *end = e ? e : p + strlen(p);
        size_t n = (size_t)(end - p);
        if (n == 4 && !strncmp(p, "head", 4)) {
            f->train_head = true;
        } else if (n == 5 && !strncmp(p, "embed", 5)) {
            f->train_embed = true;
        } else {
            const char *dash = memchr(p, '-', n);
            uint64_t lo, hi;
            if (!parse_u(p, dash ? dash : end, &lo) || !parse_u(dash ? dash + 1 : p, end, &hi) || hi < lo)
                goto bad;
            if (f->n_ranges == MP_FT_RANGES_MAX)
                return mp_fail(d, MP_ERR_USAGE, "--train-blocks: at most %d ranges", MP_FT_RANGES_MAX);
            f->range_lo[f->n_ranges] = lo;
            f->range_hi[f->n_ranges] = hi;
            f->n_ranges++;
        }
        p = end + (e != NULL);
        if (e && !*p)
            goto bad;
    }
    return MP_OK;
bad:
    return mp_fail(d, MP_ERR_USAGE, "--train-blocks: expected ranges of decoder blocks and embed/head, e.g. "
                                    "20-31,head, got '%s'", s);
}

/* ---- selection ------------------------------------------------------------------------------ */

/* peft's match of one target_modules key: the module's name is the key or ends in
 * ".key" (tuners_utils check_target_module_exists), so "dense" names BERT's
 * transform.dense and pooler.dense too. */
static bool key_matches(const char *key, size_t klen, const char *name)
{
    size_t n = strlen(name);
    if (klen == n)
        return !strncmp(key, name, n);
    return klen < n && name[n - klen - 1] == '.' && !strncmp(key, name + n - klen, klen);
}

static bool in_list(const char *list, const char *name)
{
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (key_matches(p, l, name))
            return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}

bool mp_finetune_targets(const struct mp_finetune *f, const char *hf_type, const char *role, bool head)
{
    if (f->mode != MP_FT_LORA && f->mode != MP_FT_QLORA)
        return false;
    if (head)
        return false; /* all-linear leaves the output layer out; peft never adapts it by default */
    return mp_finetune_targets_module(f, hf_type, mp_finetune_hf_name(hf_type, role));
}

bool mp_finetune_targets_module(const struct mp_finetune *f, const char *hf_type, const char *name)
{
    if (f->mode != MP_FT_LORA && f->mode != MP_FT_QLORA)
        return false;
    if (f->all_linear)
        return true;
    if (f->n_targets) {
        for (size_t i = 0; i < f->n_targets; i++)
            if (key_matches(f->targets[i], strlen(f->targets[i]), name))
                return true;
        return false;
    }
    const char *def = mp_finetune_default_targets(hf_type);
    return def ? in_list(def, name) : true; /* no peft default: all-linear */
}

bool mp_finetune_block_trained(const struct mp_finetune *f, long rep, bool after)
{
    if (f->mode != MP_FT_FREEZE)
        return f->mode == MP_FT_FULL;
    if (rep < 0)
        return after ? f->train_head : f->train_embed;
    for (size_t i = 0; i < f->n_ranges; i++)
        if ((uint64_t)rep >= f->range_lo[i] && (uint64_t)rep <= f->range_hi[i])
            return true;
    return false;
}

void mp_finetune_describe_targets(const struct mp_finetune *f, const char *hf_type, char *buf, size_t len)
{
    if (f->all_linear) {
        snprintf(buf, len, "all-linear (every Linear but the output layer)");
        return;
    }
    if (f->n_targets) {
        size_t o = 0;
        buf[0] = 0;
        for (size_t i = 0; i < f->n_targets && o < len; i++)
            o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? "," : "", f->targets[i]);
        return;
    }
    const char *def = mp_finetune_default_targets(hf_type);
    if (def)
        snprintf(buf, len, "%s (peft's default for %s)", def, hf_type);
    else if (hf_type && *hf_type)
        snprintf(buf, len, "all-linear (peft has no default for %s and needs target_modules)", hf_type);
    else
        snprintf(buf, len, "all-linear (peft has no default for this model)");
}
