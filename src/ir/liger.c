/* liger.c — which of Liger's kernels a trainer's Liger switch turns on, per model_type.
 *
 * memplan plans Liger's fused linear cross-entropy alone (--loss liger, lower_embed_head.c liger);
 * its RMSNorm, RoPE, SwiGLU/GeGLU, LayerNorm, ReLU^2 and plain cross-entropy kernels are not
 * planned, so a step that turns one of them on is refused, and a model_type Liger does not patch
 * at all (its loss stays the model's own) is refused for --loss liger.
 *
 * Sources: liger-kernel 0.8.5 transformers/monkey_patch.py: MODEL_TYPE_TO_APPLY_LIGER_FN
 * (:3904-3958) and the keyword defaults of each apply_liger_kernel_to_* it names; transformers'
 * Trainer passes liger_kernel_config to _apply_liger_kernel_to_instance (:3996-4023), which keeps
 * the keys the function takes, so a kernel left out of the config runs at its default.  Axolotl
 * 0.19 integrations/liger/plugin.py (:192-228) passes every flag as given (None when unset: off),
 * except rope on the Qwen-VL model types, True when unset (docs/memory-facts.md#liger-switch). */
#include "ir/layers.h"

#include <stdio.h>
#include <string.h>

static const char *const kernel_names[MP_LK_N] = {
#define MP_X(id, name) [MP_LKI_##id] = name,
    MP_LIGER_KERNELS(MP_X)
#undef MP_X
};

#define FL MP_LK_FLCE
#define CE MP_LK_CROSS_ENTROPY
#define RO MP_LK_ROPE
#define RN MP_LK_RMS_NORM
#define SW MP_LK_SWIGLU
#define GE MP_LK_GEGLU
#define LN MP_LK_LAYER_NORM
#define R2 MP_LK_RELU_SQUARED
/* One row per model_type memplan reads that Liger patches: the kernels its apply function takes
 * (params) and those on by default (on). */
static const struct liger_row {
    const char *type, *fn;
    unsigned params, on;
    bool axolotl_rope; /* Axolotl turns rope on when liger_rope is unset */
} rows[] = {
    {"deepseek_v2", "deepseek_v2", FL | CE | RO | RN | SW, FL | RN | SW, false},
    {"deepseek_v3", "deepseek_v3", FL | CE | RO | RN | SW, FL | RN | SW, false},
    {"exaone4", "exaone4", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
    {"gemma", "gemma", FL | CE | RO | RN | GE, FL | RO | RN | GE, false},
    {"gemma2", "gemma2", FL | CE | RO | RN | GE, FL | RO | RN | GE, false},
    {"gemma3", "gemma3", FL | CE | RO | RN | GE | LN, FL | RO | RN | GE | LN, false},
    {"gemma3_text", "gemma3_text", FL | CE | RO | RN | GE, FL | RO | RN | GE, false},
    {"glm4", "glm4", FL | CE | RO | RN | SW, FL | RN | SW, false},
    {"granite", "granite", FL | CE | RO | RN | SW, CE | RO | RN | SW, false},
    {"hunyuan_v1_dense", "hunyuan_v1_dense", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
    {"llama", "llama", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
    {"llama4", "llama4", FL | CE | RO | RN | SW | LN, FL | RO | RN | SW | LN, false},
    {"llama4_text", "llama4", FL | CE | RO | RN | SW | LN, FL | RO | RN | SW | LN, false},
    {"ministral", "ministral", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
    {"mistral", "mistral", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
    {"mixtral", "mixtral", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
    {"mllama", "mllama", FL | CE | RO | RN | SW | LN, FL | RO | RN | SW | LN, false},
    {"nemotron", "nemotron", FL | CE | R2, FL | R2, false},
    {"olmo2", "olmo2", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
    {"olmo3", "olmo3", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
    {"phi3", "phi3", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
    {"qwen2", "qwen2", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
    {"qwen2_vl", "qwen2_vl", FL | CE | RO | RN | SW | LN, FL | RO | RN | SW | LN, true},
    {"qwen2_5_vl", "qwen2_5_vl", FL | CE | RO | RN | SW, FL | RO | RN | SW, true},
    {"qwen3", "qwen3", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
    {"qwen3_moe", "qwen3_moe", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
    {"smollm3", "smollm3", FL | CE | RO | RN | SW, FL | RO | RN | SW, false},
};

static const struct liger_row *row_of(const char *type)
{
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        if (!strcmp(rows[i].type, type))
            return &rows[i];
    return NULL;
}

const char *mp_liger_kernel_name(unsigned bit)
{
    for (unsigned i = 0; i < MP_LK_N; i++)
        if (bit == 1u << i)
            return kernel_names[i];
    return "?";
}

int mp_liger_kernel_parse(const char *name)
{
    for (unsigned i = 0; i < MP_LK_N; i++)
        if (!strcmp(name, kernel_names[i]))
            return (int)(1u << i);
    return -1;
}

unsigned mp_liger_params(const char *hf_type)
{
    const struct liger_row *r = row_of(hf_type);
    return r ? r->params : 0;
}

/* The kernels running: those given true, those left unset at the trainer's default. */
static unsigned running(const struct liger_row *r, const struct mp_liger *lk)
{
    unsigned unset = r->params & ~(lk->on | lk->off);
    unsigned dflt = lk->unset_off ? (r->axolotl_rope ? MP_LK_ROPE : 0u) : r->on;
    return (lk->on | (unset & dflt)) & r->params;
}

const char *mp_liger_refused(const char *hf_type, const struct mp_liger *lk, char *buf, size_t cap)
{
    if (!hf_type[0]) /* memplan's own JSON: the user's model, no family to patch */
        return NULL;
    const struct mp_liger cli = {.set = true, .on = MP_LK_FLCE, .off = MP_LK_ALL & ~MP_LK_FLCE};
    if (!lk->set)
        lk = &cli;
    const struct liger_row *r = row_of(hf_type);
    unsigned run = r ? running(r, lk) : 0, other = run & ~(unsigned)MP_LK_FLCE;
    if (r && run == MP_LK_FLCE)
        return NULL;
    size_t n = lk->where ? (size_t)snprintf(buf, cap, "(%s) ", lk->where) : 0;
    if (n >= cap)
        return buf;
    if (!r)
        snprintf(buf + n, cap - n, "Liger 0.8.5 patches no model_type '%s' (its loss stays the model's own: "
                 "give --loss hf)", hf_type);
    else if (!(run & MP_LK_FLCE))
        snprintf(buf + n, cap - n, "Liger's fused linear cross-entropy is off for model_type '%s' "
                 "(apply_liger_kernel_to_%s): set fused_linear_cross_entropy true", hf_type, r->fn);
    else {
        unsigned k = 0;
        n += (size_t)snprintf(buf + n, cap - n, "Liger's");
        for (unsigned i = 0; i < MP_LK_N && n < cap; i++)
            if (other & (1u << i))
                n += (size_t)snprintf(buf + n, cap - n, "%s %s", k++ ? "," : "", kernel_names[i]);
        if (n < cap)
            snprintf(buf + n, cap - n, " %s also on for model_type '%s' (%s%s%s), not modelled yet: set %s false",
                     k > 1 ? "kernels are" : "kernel is", hf_type, lk->unset_off ? "Axolotl's LigerPlugin" : "",
                     lk->unset_off ? "" : "apply_liger_kernel_to_", lk->unset_off ? "" : r->fn, k > 1 ? "them" : "it");
    }
    return buf;
}
