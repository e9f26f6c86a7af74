/* model_json.c — reads memplan's own model format (docs/model-format.md) into
 * struct mp_model.  Each entry of "layers" is one block: an op, a composite op
 * (transformer_block, bottleneck), a named group of ops, or a repeat of blocks
 * (nested at most MP_NEST_MAX deep).  Strict: unknown layer types, wrong value
 * types and unknown keys are errors naming their JSON path (layers[2].layers[0].ffn);
 * only keys starting with "_" or "comment" are ignored.  cJSON stays in this
 * file; on error the caller releases the half-filled model.
 */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "model.h"
#include "model_read.h"

/* Ops (entries with a "type", a composite counting as one) after expanding every repeat: nested
 * repeats multiply, so a file of a few hundred bytes could ask for millions of blocks.  Where a
 * command needs the whole program (estimate with --timeline, freeze fine-tuning, probe, a fold
 * that does not hold) it takes up to some 30 KiB per transformer_block (Llama-7B's with 100,000
 * layers: 3.0 GB), so about 4 GiB at this limit, which still holds the longest repeat (100,000)
 * with room around it, as an HF config's 100,000 layers.  Checked before a repeat is expanded;
 * every block has an op, so it bounds blocks too. */
#define MP_OPS_MAX ((uint64_t)1 << 17)
#define MP_FLOPS_MAX (UINT64_C(1) << 53)     /* per-sample FLOPs: exact in a JSON double */
#define PLACE_MAX 320
#define ALLOWED_MAX 1024 /* a type's allowed keys, space-separated */

struct reader {
    struct mp_model *m;
    const char *path;
    struct mp_diag *d;
    int n_groups;         /* repeat instances expanded so far (repeat_group ids) */
    uint64_t n_ops;       /* ops read so far (at most MP_OPS_MAX) */
    bool have_emb;        /* an embedding precedes: tied lm_head and defaults */
    uint64_t emb_vocab, emb_dim;
    uint64_t classes;     /* top-level "classes", 0 when absent */
    char allowed[MP_LT_COUNT][ALLOWED_MAX]; /* each type's allowed keys (model_keys.c), made once a file
                                               ("" until then) */
};

/* How blocks made at this point are named (see the "Names" section of model-format.md). */
struct naming {
    char pre[64];  /* "R.i." contributed by named repeats */
    char idx[40];  /* ".i" contributed by unnamed repeats since the last named one */
    bool single;   /* innermost named repeat yields one block per iteration */
    int group;     /* repeat_group of blocks made here (0: not in a repeat) */
};

/* ---- messages and keys ---------------------------------------------------------- */

/* "path: place.key: problem"; key may be NULL, place may be "". */
#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
static enum mp_status
fail_at(const struct reader *rd, enum mp_status st, const char *place, const char *key, const char *fmt, ...)
{
    char what[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *k = key ? key : "";
    const char *dot = (*place && *k) ? "." : "";
    if (!*place && !*k)
        return mp_fail(rd->d, st, "%s: %s", rd->path, what);
    return mp_fail(rd->d, st, "%s: %s%s%s: %s", rd->path, place, dot, k, what);
}

/* snprintf that may cut: places and names are bounded by the nesting limit, and
 * a cut label is harmless (keeps -Wformat-truncation quiet where cutting is intended). */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void cut_printf(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, cap, fmt, ap);
    va_end(ap);
}

/* Every key of obj must be in allowed (or ignorable: json_field.c); duplicates were refused on
 * loading (model_load.c).  what names the object in the message: "a linear layer", "the input", ... */
static enum mp_status check_keys(const struct reader *rd, const cJSON *obj, const char *place, const char *allowed,
                                 const char *what)
{
    return mp_json_check_keys(obj, allowed, what, rd->path, place, rd->d);
}

/* ---- value readers ------------------------------------------------------------------ */

/* A too-large JSON number as the user wrote it: digits up to 10^18, else %g. */
static const char *num_str(double x, char *buf, size_t cap)
{
    snprintf(buf, cap, x < 1e18 ? "%.0f" : "%g", x);
    return buf;
}

static const cJSON *item(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

/* An integer in [positive ? 1 : 0, max].  Absent: an error when required, else
 * *out keeps its default.  Above max is MP_ERR_RANGE. */
static enum mp_status get_uint(const struct reader *rd, const cJSON *obj, const char *place, const char *key,
                               bool required, bool positive, uint64_t max, uint64_t *out)
{
    const char *kind = positive ? "a positive integer" : "a non-negative integer";
    const cJSON *v = item(obj, key);
    if (!v) {
        if (required)
            return fail_at(rd, MP_ERR_MODEL, place, key, "missing (expected %s)", kind);
        return MP_OK;
    }
    double lo = positive ? 1.0 : 0.0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo))
        return fail_at(rd, MP_ERR_MODEL, place, key, "expected %s", kind);
    double x = v->valuedouble;
    char num[32];
    if (x > (double)max)
        return fail_at(rd, MP_ERR_RANGE, place, key, "%s is too large (at most %llu)",
                       num_str(x, num, sizeof num), (unsigned long long)max);
    if (x != (double)(uint64_t)x)
        return fail_at(rd, MP_ERR_MODEL, place, key, "expected %s", kind);
    *out = (uint64_t)x;
    return MP_OK;
}

static enum mp_status get_dim(const struct reader *rd, const cJSON *obj, const char *place, const char *key,
                              bool required, uint64_t *out)
{
    return get_uint(rd, obj, place, key, required, true, MP_DIM_MAX, out);
}

static enum mp_status get_bool(const struct reader *rd, const cJSON *obj, const char *place, const char *key,
                               bool *out)
{
    return mp_json_bool(obj, key, out, rd->path, place, rd->d);
}

static enum mp_status get_prob(const struct reader *rd, const cJSON *obj, const char *place, const char *key,
                               double *out)
{
    return mp_json_prob(obj, key, out, rd->path, place, rd->d);
}

/* An optional non-empty string of at most cap-1 bytes copied to out; *found says if present. */
static enum mp_status get_name(const struct reader *rd, const cJSON *obj, const char *place, const char *key,
                               char *out, size_t cap, bool *found)
{
    enum mp_status st;
    const char *s = mp_json_str(obj, key, &st, rd->path, place, rd->d);
    *found = false;
    if (st != MP_OK)
        return st;
    if (!s)
        return MP_OK;
    if (!*s)
        return fail_at(rd, MP_ERR_MODEL, place, key, "expected a non-empty string");
    if (strlen(s) >= cap)
        return fail_at(rd, MP_ERR_MODEL, place, key, "longer than %zu characters", cap - 1);
    snprintf(out, cap, "%s", s);
    *found = true;
    return MP_OK;
}

#define MP_CHECK_SIZE(k, n)                                                          \
    do {                                                                             \
        if ((k)->size != (n))                                                        \
            MP_BUG("key %s: field of %zu bytes, expected %zu", (k)->key, (k)->size, (size_t)(n)); \
    } while (0)

#define TRY(expr)                          \
    do {                                   \
        enum mp_status st_ = (expr);       \
        if (st_ != MP_OK)                  \
            return st_;                    \
    } while (0)

/* ---- ops ------------------------------------------------------------------------------ */

static enum mp_status get_act(const struct reader *rd, const cJSON *obj, const char *place, bool required,
                              enum mp_act *out)
{
    enum mp_status st;
    const char *s = mp_json_str(obj, "act", &st, rd->path, place, rd->d);
    if (st != MP_OK)
        return st;
    if (!s) {
        if (required)
            return fail_at(rd, MP_ERR_MODEL, place, "act", "missing (expected %s)", mp_act_names());
        return MP_OK;
    }
    int a = mp_act_parse(s);
    if (a < 0)
        return fail_at(rd, MP_ERR_MODEL, place, "act",
                       "unknown activation \"%s\" (expected %s)", s, mp_act_names());
    *out = (enum mp_act)a;
    return MP_OK;
}

/* Attention fields shared by attention and transformer_block. */
static enum mp_status read_attention(const struct reader *rd, const cJSON *o, const char *place, struct mp_layer *l)
{
    TRY(get_dim(rd, o, place, "dim", true, &l->dim));
    TRY(get_dim(rd, o, place, "heads", true, &l->attn.heads));
    l->attn.kv_heads = l->attn.heads;
    TRY(get_dim(rd, o, place, "kv_heads", false, &l->attn.kv_heads));
    if (item(o, "head_dim")) {
        TRY(get_dim(rd, o, place, "head_dim", true, &l->attn.head_dim));
    } else {
        if (l->attn.heads > l->dim || l->dim % l->attn.heads != 0)
            return fail_at(rd, MP_ERR_MODEL, place, "heads", "%llu does not divide dim (%llu); give head_dim",
                           (unsigned long long)l->attn.heads, (unsigned long long)l->dim);
        l->attn.head_dim = l->dim / l->attn.heads;
    }
    if (l->attn.kv_heads > l->attn.heads || l->attn.heads % l->attn.kv_heads != 0)
        return fail_at(rd, MP_ERR_MODEL, place, "kv_heads", "%llu must divide heads (%llu)",
                       (unsigned long long)l->attn.kv_heads, (unsigned long long)l->attn.heads);
    uint64_t qdim, w;
    if (!mp_mul_u64(l->attn.heads, l->attn.head_dim, &qdim) || !mp_mul_u64(qdim, l->dim, &w) || w > MP_DIM_MAX)
        return fail_at(rd, MP_ERR_RANGE, place, "heads", "the projections are too large (at most %llu elements)",
                       (unsigned long long)MP_DIM_MAX);
    l->attn.causal = true;
    TRY(get_bool(rd, o, place, "causal", &l->attn.causal));
    bool bias = true;
    TRY(get_bool(rd, o, place, "bias", &bias));
    l->attn.qkv_bias = l->attn.out_bias = bias;
    TRY(get_bool(rd, o, place, "qkv_bias", &l->attn.qkv_bias));
    TRY(get_bool(rd, o, place, "out_bias", &l->attn.out_bias));
    TRY(get_bool(rd, o, place, "fused_qkv", &l->attn.fused_qkv));
    TRY(get_bool(rd, o, place, "rope", &l->rope.on));
    if (item(o, "rotary_dim")) {
        if (!l->rope.on)
            return fail_at(rd, MP_ERR_MODEL, place, "rotary_dim", "needs \"rope\": true");
        TRY(get_dim(rd, o, place, "rotary_dim", true, &l->rope.dim));
        if (l->rope.dim > l->attn.head_dim || l->rope.dim % 2 != 0)
            return fail_at(rd, MP_ERR_MODEL, place, "rotary_dim", "%llu must be even and at most head_dim (%llu)",
                           (unsigned long long)l->rope.dim, (unsigned long long)l->attn.head_dim);
    }
    enum mp_status st;
    const char *impl = mp_json_str(o, "impl", &st, rd->path, place, rd->d);
    if (st != MP_OK)
        return st;
    if (impl) {
        int a = mp_attn_impl_parse(impl);
        if (a >= 0)
            l->attn.impl = (enum mp_attn_impl)a;
        else
            return fail_at(rd, MP_ERR_MODEL, place, "impl", "unknown attention implementation \"%s\" "
                           "(expected eager, flash or sdpa)", impl);
        l->attn.impl_set = true;
    }
    return get_prob(rd, o, place, "attn_dropout", &l->attn.dropout);
}

/* MLP fields shared by mlp and transformer_block; "bias" (default true) sets mlp_bias's default. */
static enum mp_status read_mlp(const struct reader *rd, const cJSON *o, const char *place, struct mp_layer *l)
{
    if (!mp_mul_u64(l->dim, 4, &l->mlp.ffn) || l->mlp.ffn > MP_DIM_MAX)
        l->mlp.ffn = MP_DIM_MAX;
    TRY(get_dim(rd, o, place, "ffn", l->type == MP_LT_MLP, &l->mlp.ffn));
    uint64_t w;
    if (!mp_mul_u64(l->dim, l->mlp.ffn, &w) || w > MP_DIM_MAX)
        return fail_at(rd, MP_ERR_RANGE, place, "ffn", "the projections are too large (at most %llu elements)",
                       (unsigned long long)MP_DIM_MAX);
    TRY(get_bool(rd, o, place, "gated", &l->mlp.gated));
    l->mlp.act = l->mlp.gated ? MP_ACT_SILU : MP_ACT_GELU;
    TRY(get_act(rd, o, place, false, &l->mlp.act));
    bool bias = true;
    TRY(get_bool(rd, o, place, "bias", &bias));
    l->mlp.bias = bias;
    return get_bool(rd, o, place, "mlp_bias", &l->mlp.bias);
}

static enum mp_status read_transformer(const struct reader *rd, const cJSON *o, const char *place,
                                       struct mp_layer *l)
{
    TRY(read_attention(rd, o, place, l));
    TRY(read_mlp(rd, o, place, l));
    enum mp_status st;
    const char *norm = mp_json_str(o, "norm", &st, rd->path, place, rd->d);
    if (st != MP_OK)
        return st;
    l->norm.kind = MP_NORM_LAYERNORM;
    if (norm) {
        if (strcmp(norm, "layernorm") == 0)
            l->norm.kind = MP_NORM_LAYERNORM;
        else if (strcmp(norm, "rmsnorm") == 0)
            l->norm.kind = MP_NORM_RMSNORM;
        else
            return fail_at(rd, MP_ERR_MODEL, place, "norm", "unknown norm \"%s\" (expected layernorm or rmsnorm)",
                           norm);
    }
    l->norm.bias = l->norm.kind == MP_NORM_LAYERNORM && !l->norm.ln_fp32 && !l->norm.ln_plain;
    TRY(get_bool(rd, o, place, "norm_bias", &l->norm.bias));
    if (l->norm.bias && l->norm.kind == MP_NORM_RMSNORM)
        return fail_at(rd, MP_ERR_MODEL, place, "norm_bias", "rmsnorm has no bias");
    TRY(get_prob(rd, o, place, "p", &l->p));
    TRY(get_bool(rd, o, place, "parallel_residual", &l->parallel_residual));
    TRY(get_bool(rd, o, place, "shared_norm", &l->norm.shared));
    TRY(get_bool(rd, o, place, "post_norm", &l->norm.post));
    if (l->norm.shared && !l->parallel_residual)
        return fail_at(rd, MP_ERR_MODEL, place, "shared_norm", "needs \"parallel_residual\": true");
    if (l->norm.post && l->parallel_residual)
        return fail_at(rd, MP_ERR_MODEL, place, "post_norm", "cannot be combined with parallel_residual");
    return MP_OK;
}

static enum mp_status read_conv(const struct reader *rd, const cJSON *o, const char *place, struct mp_layer *l)
{
    TRY(get_dim(rd, o, place, "in_ch", true, &l->conv.in_ch));
    TRY(get_dim(rd, o, place, "out_ch", true, &l->conv.out_ch));
    TRY(get_dim(rd, o, place, "kernel", true, &l->conv.kernel));
    l->conv.stride = 1;
    l->conv.groups = 1;
    l->bias = true;
    TRY(get_dim(rd, o, place, "stride", false, &l->conv.stride));
    TRY(get_uint(rd, o, place, "padding", false, false, MP_DIM_MAX, &l->conv.padding));
    TRY(get_dim(rd, o, place, "groups", false, &l->conv.groups));
    TRY(get_bool(rd, o, place, "bias", &l->bias));
    if (l->conv.in_ch % l->conv.groups != 0 || l->conv.out_ch % l->conv.groups != 0)
        return fail_at(rd, MP_ERR_MODEL, place, "groups", "%llu must divide in_ch (%llu) and out_ch (%llu)",
                       (unsigned long long)l->conv.groups, (unsigned long long)l->conv.in_ch,
                       (unsigned long long)l->conv.out_ch);
    uint64_t w;
    if (!mp_mul3_u64(l->conv.out_ch, l->conv.in_ch / l->conv.groups, l->conv.kernel, &w) ||
        !mp_mul_u64(w, l->conv.kernel, &w) || w > MP_DIM_MAX)
        return fail_at(rd, MP_ERR_RANGE, place, "kernel", "the weight is too large (at most %llu elements)",
                       (unsigned long long)MP_DIM_MAX);
    return MP_OK;
}

/* patch_embedding (ViT): in_ch -> dim by a conv with kernel = stride = patch, a class token
 * (cls_token, default true) and learned positions; the image size fixes the sequence. */
static enum mp_status read_patch_embedding(const struct reader *rd, const cJSON *o, const char *place,
                                           struct mp_layer *l)
{
    if (rd->m->input != MP_INPUT_IMAGE)
        return fail_at(rd, MP_ERR_MODEL, place, "type", "a patch_embedding needs an image input (input.shape "
                       "[C, H, W])");
    l->conv.in_ch = rd->m->channels;
    TRY(get_dim(rd, o, place, "in_ch", false, &l->conv.in_ch));
    TRY(get_dim(rd, o, place, "dim", true, &l->dim));
    TRY(get_dim(rd, o, place, "patch", true, &l->conv.kernel));
    l->conv.stride = l->conv.kernel;
    l->emb.cls_token = true;
    TRY(get_bool(rd, o, place, "cls_token", &l->emb.cls_token));
    if (rd->m->height % l->conv.kernel || rd->m->width % l->conv.kernel)
        return fail_at(rd, MP_ERR_MODEL, place, "patch", "%llu does not divide the image's %llu x %llu",
                       (unsigned long long)l->conv.kernel, (unsigned long long)rd->m->height,
                       (unsigned long long)rd->m->width);
    uint64_t w, pos;
    if (!mp_mul3_u64(l->dim, l->conv.in_ch, l->conv.kernel, &w) || !mp_mul_u64(w, l->conv.kernel, &w) ||
        w > MP_DIM_MAX || !mp_mul_u64(rd->m->height / l->conv.kernel, rd->m->width / l->conv.kernel, &pos) ||
        !mp_mul_u64(pos + 1, l->dim, &w) || w > MP_DIM_MAX)
        return fail_at(rd, MP_ERR_RANGE, place, "patch", "the weights are too large (at most %llu elements)",
                       (unsigned long long)MP_DIM_MAX);
    return MP_OK;
}

static enum mp_status read_pool(const struct reader *rd, const cJSON *o, const char *place, struct mp_layer *l)
{
    TRY(get_dim(rd, o, place, "kernel", true, &l->conv.kernel));
    l->conv.stride = l->conv.kernel;
    TRY(get_dim(rd, o, place, "stride", false, &l->conv.stride));
    TRY(get_uint(rd, o, place, "padding", false, false, MP_DIM_MAX, &l->conv.padding));
    if (l->conv.padding > l->conv.kernel / 2)
        return fail_at(rd, MP_ERR_MODEL, place, "padding", "%llu is more than half the kernel (%llu)",
                       (unsigned long long)l->conv.padding, (unsigned long long)l->conv.kernel);
    return MP_OK;
}

static enum mp_status read_adaptive(const struct reader *rd, const cJSON *o, const char *place, struct mp_layer *l)
{
    l->conv.out_h = l->conv.out_w = 1;
    const cJSON *os = item(o, "output_size");
    if (os && (item(o, "out_h") || item(o, "out_w")))
        return fail_at(rd, MP_ERR_MODEL, place, "output_size", "give either output_size or out_h/out_w, not both");
    if (!os) {
        TRY(get_dim(rd, o, place, "out_h", false, &l->conv.out_h));
        TRY(get_dim(rd, o, place, "out_w", false, &l->conv.out_w));
        return MP_OK;
    }
    if (cJSON_IsNumber(os)) {
        TRY(get_dim(rd, o, place, "output_size", true, &l->conv.out_h));
        l->conv.out_w = l->conv.out_h;
        return MP_OK;
    }
    if (!cJSON_IsArray(os) || cJSON_GetArraySize(os) != 2)
        return fail_at(rd, MP_ERR_MODEL, place, "output_size", "expected a positive integer or [h, w]");
    uint64_t hw[2];
    for (int i = 0; i < 2; i++) {
        const cJSON *e = cJSON_GetArrayItem(os, i);
        double x = cJSON_IsNumber(e) ? e->valuedouble : -1;
        char key[24], num[32];
        snprintf(key, sizeof key, "output_size[%d]", i);
        if (!(x >= 1))
            return fail_at(rd, MP_ERR_MODEL, place, key, "expected a positive integer");
        if (x > (double)MP_DIM_MAX)
            return fail_at(rd, MP_ERR_RANGE, place, key, "%s is too large (at most %llu)",
                           num_str(x, num, sizeof num), (unsigned long long)MP_DIM_MAX);
        if (x != (double)(uint64_t)x)
            return fail_at(rd, MP_ERR_MODEL, place, key, "expected a positive integer");
        hw[i] = (uint64_t)x;
    }
    l->conv.out_h = hw[0];
    l->conv.out_w = hw[1];
    return MP_OK;
}

static enum mp_status read_bottleneck(const struct reader *rd, const cJSON *o, const char *place,
                                      struct mp_layer *l)
{
    TRY(get_dim(rd, o, place, "in_ch", true, &l->conv.in_ch));
    TRY(get_dim(rd, o, place, "mid_ch", true, &l->conv.mid_ch));
    if (!mp_mul_u64(l->conv.mid_ch, 4, &l->conv.out_ch) || l->conv.out_ch > MP_DIM_MAX)
        l->conv.out_ch = MP_DIM_MAX;
    TRY(get_dim(rd, o, place, "out_ch", false, &l->conv.out_ch));
    l->conv.stride = 1;
    l->conv.groups = 1;
    TRY(get_dim(rd, o, place, "stride", false, &l->conv.stride));
    TRY(get_dim(rd, o, place, "groups", false, &l->conv.groups));
    if (l->conv.mid_ch % l->conv.groups != 0)
        return fail_at(rd, MP_ERR_MODEL, place, "groups", "%llu must divide mid_ch (%llu)",
                       (unsigned long long)l->conv.groups, (unsigned long long)l->conv.mid_ch);
    bool needed = l->conv.stride != 1 || l->conv.in_ch != l->conv.out_ch;
    l->conv.downsample = needed;
    TRY(get_bool(rd, o, place, "downsample", &l->conv.downsample));
    if (needed && !l->conv.downsample)
        return fail_at(rd, MP_ERR_MODEL, place, "downsample",
                       "needed when stride is not 1 or in_ch (%llu) differs from out_ch (%llu)",
                       (unsigned long long)l->conv.in_ch, (unsigned long long)l->conv.out_ch);
    uint64_t w;
    if (!mp_mul3_u64(l->conv.mid_ch, l->conv.mid_ch / l->conv.groups, 9, &w) || w > MP_DIM_MAX ||
        !mp_mul_u64(l->conv.in_ch, l->conv.out_ch, &w) || w > MP_DIM_MAX)
        return fail_at(rd, MP_ERR_RANGE, place, "mid_ch", "the weights are too large (at most %llu elements)",
                       (unsigned long long)MP_DIM_MAX);
    return MP_OK;
}

static enum mp_status read_custom(const struct reader *rd, const cJSON *o, const char *place, struct mp_layer *l)
{
    TRY(get_dim(rd, o, place, "output_bytes", true, &l->custom.output_bytes));
    l->custom.saved_bytes = l->custom.output_bytes;
    TRY(get_uint(rd, o, place, "saved_bytes", false, false, MP_DIM_MAX, &l->custom.saved_bytes));
    if (l->custom.saved_bytes < l->custom.output_bytes)
        return fail_at(rd, MP_ERR_MODEL, place, "saved_bytes",
                       "%llu is less than output_bytes (%llu); saved_bytes includes the output",
                       (unsigned long long)l->custom.saved_bytes, (unsigned long long)l->custom.output_bytes);
    TRY(get_uint(rd, o, place, "params", false, false, MP_DIM_MAX, &l->custom.params));
    TRY(get_uint(rd, o, place, "fwd_flops", false, false, MP_FLOPS_MAX, &l->custom.fwd_flops));
    l->custom.bwd_flops = 2 * l->custom.fwd_flops;
    return get_uint(rd, o, place, "bwd_flops", false, false, 2 * MP_FLOPS_MAX, &l->custom.bwd_flops);
}

/* The vocab/dim of a tied or untied lm_head default to the embedding's; tied ones must match it. */
static enum mp_status read_lm_head(struct reader *rd, const cJSON *o, const char *place, struct mp_layer *l)
{
    TRY(get_bool(rd, o, place, "tied", &l->head.tied));
    if (l->head.tied && !rd->have_emb)
        return fail_at(rd, MP_ERR_MODEL, place, "tied", "the model has no embedding before this lm_head to tie to");
    l->vocab = rd->emb_vocab;
    l->dim = rd->emb_dim;
    TRY(get_dim(rd, o, place, "vocab", !rd->have_emb, &l->vocab));
    TRY(get_dim(rd, o, place, "dim", !rd->have_emb, &l->dim));
    if (l->head.tied && l->vocab != rd->emb_vocab)
        return fail_at(rd, MP_ERR_MODEL, place, "vocab", "%llu differs from the tied embedding's vocab (%llu)",
                       (unsigned long long)l->vocab, (unsigned long long)rd->emb_vocab);
    if (l->head.tied && l->dim != rd->emb_dim)
        return fail_at(rd, MP_ERR_MODEL, place, "dim", "%llu differs from the tied embedding's dim (%llu)",
                       (unsigned long long)l->dim, (unsigned long long)rd->emb_dim);
    uint64_t w;
    if (!mp_mul_u64(l->vocab, l->dim, &w) || w > MP_DIM_MAX)
        return fail_at(rd, MP_ERR_RANGE, place, "vocab", "the weight is too large (at most %llu elements)",
                       (unsigned long long)MP_DIM_MAX);
    return get_bool(rd, o, place, "bias", &l->bias);
}

static enum mp_status read_table(struct reader *rd, const cJSON *o, const char *place, struct mp_layer *l)
{
    const char *rows = l->type == MP_LT_EMBEDDING ? "vocab" : "max_positions";
    TRY(get_dim(rd, o, place, rows, true, &l->vocab));
    if (l->type == MP_LT_POS_EMBEDDING)
        l->dim = rd->emb_dim;
    TRY(get_dim(rd, o, place, "dim", l->type == MP_LT_EMBEDDING || !rd->have_emb, &l->dim));
    uint64_t w;
    if (!mp_mul_u64(l->vocab, l->dim, &w) || w > MP_DIM_MAX)
        return fail_at(rd, MP_ERR_RANGE, place, rows, "the table is too large (at most %llu elements)",
                       (unsigned long long)MP_DIM_MAX);
    if (l->type == MP_LT_POS_EMBEDDING && rd->m->input == MP_INPUT_TOKENS && l->vocab < rd->m->seq_len)
        return fail_at(rd, MP_ERR_MODEL, place, rows, "%llu is less than input.tokens (%llu)",
                       (unsigned long long)l->vocab, (unsigned long long)rd->m->seq_len);
    if (l->type == MP_LT_EMBEDDING && !rd->have_emb) {
        rd->have_emb = true;
        rd->emb_vocab = l->vocab;
        rd->emb_dim = l->dim;
    }
    return MP_OK;
}

/* The rows of l's type that are not its code's own (model_keys.c), each into its field. */
static enum mp_status read_settings(const struct reader *rd, const cJSON *o, const char *place, struct mp_layer *l)
{
    for (size_t i = 0; i < mp_n_keys; i++) {
        const struct mp_key *k = &mp_keys[i];
        if (k->own || !(k->types & (1u << l->type)) || !item(o, k->key))
            continue;
        char *f = (char *)l + k->off;
        switch (k->kind) {
        case MP_KEY_DIM:
        case MP_KEY_COUNT: {
            uint64_t v = 0;
            bool wide = k->size == sizeof(uint64_t);
            TRY(get_uint(rd, o, place, k->key, true, k->kind == MP_KEY_DIM, wide ? MP_DIM_MAX : 64, &v));
            if (wide) {
                memcpy(f, &v, sizeof v);
            } else {
                unsigned u = (unsigned)v;
                MP_CHECK_SIZE(k, sizeof u);
                memcpy(f, &u, sizeof u);
            }
            break;
        }
        case MP_KEY_BOOL:
            MP_CHECK_SIZE(k, sizeof(bool));
            TRY(get_bool(rd, o, place, k->key, (bool *)f));
            break;
        case MP_KEY_PROB:
        case MP_KEY_REAL: {
            double v = 0;
            MP_CHECK_SIZE(k, sizeof v);
            if (k->kind == MP_KEY_PROB) {
                TRY(get_prob(rd, o, place, k->key, &v));
            } else {
                const cJSON *x = item(o, k->key);
                if (!cJSON_IsNumber(x) || !(x->valuedouble > 0.0 && x->valuedouble <= 1e30))
                    return fail_at(rd, MP_ERR_MODEL, place, k->key, "expected a positive number");
                v = x->valuedouble;
            }
            memcpy(f, &v, sizeof v);
            break;
        }
        case MP_KEY_ENUM: {
            enum mp_status st;
            const char *s = mp_json_str(o, k->key, &st, rd->path, place, rd->d);
            if (st != MP_OK)
                return st;
            int v = 0;
            while (k->names[v] && strcmp(k->names[v], s) != 0)
                v++;
            if (!k->names[v]) {
                char all[160];
                mp_join(all, sizeof all, k->names, (size_t)v, ", ", " or ");
                return fail_at(rd, MP_ERR_MODEL, place, k->key, "unknown value \"%s\" (expected %s)", s, all);
            }
            MP_CHECK_SIZE(k, sizeof v);
            memcpy(f, &v, sizeof v);
            break;
        }
        case MP_KEY_ACT:
        case MP_KEY_IMPL:
            MP_BUG("key %s: kind %d is read by its type's code", k->key, (int)k->kind);
        }
    }
    return MP_OK;
}

/* A setting given (its field set: the default of every generic row is zero) without the one it
 * qualifies. */
static enum mp_status needs(const struct reader *rd, const char *place, const char *key, bool set, bool ok,
                            const char *what)
{
    if (set && !ok)
        return fail_at(rd, MP_ERR_MODEL, place, key, "needs %s", what);
    return MP_OK;
}

struct setting {
    const char *key;
    bool set;
};
#define N_OF(a) (sizeof (a) / sizeof (a)[0])

/* The rules between settings that model_keys.c's rows state ("with `rope`: ...").  A field another
 * type's row sets stays zero here (read_op clears the layer), so each rule tests fields alone. */
static enum mp_status check_settings(const struct reader *rd, const char *place, const struct mp_layer *l)
{
    const struct mp_rope *r = &l->rope;
    const struct setting rope[] = {{"rope_interleave", r->interleave}, {"rope_per_sample", r->per_sample},
                                   {"rope_fp32", r->fp32},           {"rope_cast_back", r->cast_back},
                                   {"rope_cat", r->cat},             {"rope_table_rows", r->table_rows > 0},
                                   {"rope_tables", r->kinds > 1}};
    for (size_t i = 0; i < N_OF(rope); i++)
        TRY(needs(rd, place, rope[i].key, rope[i].set, r->on, "\"rope\": true"));
    TRY(needs(rd, place, "qk_norm_late", l->attn.qk_norm_late, l->attn.qk_norm != MP_QK_NORM_NONE && r->on,
              "a qk_norm and \"rope\": true"));
    TRY(needs(rd, place, "qkv_split", l->attn.qkv_split != MP_QKV_VIEWS, l->attn.fused_qkv, "\"fused_qkv\": true"));
    const struct mp_mla *a = &l->mla;
    const struct setting mla[] = {{"q_lora", a->q_lora > 0}, {"rope_dim", a->rope_dim > 0},
                                  {"nope_dim", a->nope_dim > 0}, {"v_dim", a->v_dim > 0}};
    for (size_t i = 0; i < N_OF(mla); i++)
        TRY(needs(rd, place, mla[i].key, mla[i].set, a->kv_lora > 0, "a kv_lora"));
    TRY(needs(rd, place, "rope_complex", a->rope_complex, r->on, "\"rope\": true"));
    TRY(needs(rd, place, "rope_complex", a->rope_complex, !r->interleave && !r->cat && !r->table_rows &&
              (!r->dim || r->dim == l->attn.head_dim || a->kv_lora), "a whole-head rotary (no other rope_ key)"));
    TRY(needs(rd, place, "temp_tuning", l->attn.temp_tuning, !r->on, "a layer without \"rope\" (NoPE)"));
    if (a->kv_lora) {
        TRY(needs(rd, place, "kv_lora", true, r->on, "\"rope\": true"));
        TRY(needs(rd, place, "kv_lora", true, !l->attn.fused_qkv, "separate projections (no fused_qkv)"));
        TRY(needs(rd, place, "kv_lora", true, l->attn.kv_heads == l->attn.heads, "kv_heads equal to heads"));
        if (!a->rope_dim || a->rope_dim % 2 || !a->nope_dim || !a->v_dim)
            return fail_at(rd, MP_ERR_MODEL, place, "kv_lora",
                           "needs a positive even rope_dim, a nope_dim and a v_dim");
        uint64_t w = a->q_lora > a->kv_lora ? a->q_lora : a->kv_lora, x;
        if (!mp_mul_u64(l->attn.heads, a->nope_dim + a->rope_dim + a->v_dim, &x) || !mp_mul_u64(x, w, &x) ||
            x > MP_DIM_MAX)
            return fail_at(rd, MP_ERR_RANGE, place, "kv_lora", "the projections are too large (at most %llu elements)",
                           (unsigned long long)MP_DIM_MAX);
    }
    TRY(needs(rd, place, "fused_gate_up", l->mlp.fused_gate_up, l->mlp.gated, "\"gated\": true"));
    TRY(needs(rd, place, "up_down", l->mlp.up_down, !l->mlp.gated, "an MLP that is not gated"));
    const struct mp_norm_cfg *n = &l->norm;
    if ((n->ln_fp32 + n->ln_plain + n->ln_1p) > 1)
        return fail_at(rd, MP_ERR_MODEL, place, n->ln_1p ? "ln_1p" : "ln_plain", "at most one of ln_fp32, ln_plain "
                       "and ln_1p");
    bool ln = l->type == MP_LT_LAYERNORM || n->kind == MP_NORM_LAYERNORM;
    const struct setting lns[] = {{"ln_fp32", n->ln_fp32}, {"ln_plain", n->ln_plain}, {"ln_1p", n->ln_1p}};
    for (size_t i = 0; i < N_OF(lns); i++)
        TRY(needs(rd, place, lns[i].key, lns[i].set, ln, "\"norm\": \"layernorm\""));
    TRY(needs(rd, place, "rms_fp32", n->rms_fp32, l->type == MP_LT_RMSNORM || n->kind == MP_NORM_RMSNORM,
              "\"norm\": \"rmsnorm\""));
    if (n->bias && (n->ln_fp32 || n->ln_plain))
        return fail_at(rd, MP_ERR_MODEL, place, n->ln_fp32 ? "ln_fp32" : "ln_plain", "this layernorm has no bias");
    TRY(needs(rd, place, "branch_norm", n->branch, !n->post && !l->parallel_residual,
              "a pre-norm block (no post_norm, no parallel_residual)"));
    TRY(needs(rd, place, "no_pre_norm", n->no_pre, n->branch, "\"branch_norm\": true"));
    if (l->type == MP_LT_TRANSFORMER_BLOCK)
        TRY(needs(rd, place, "mult", l->mult != 0, !n->post && !n->branch && !l->parallel_residual,
                  "a pre-norm block (no post_norm, branch_norm or parallel_residual)"));
    const struct mp_moe *e = &l->moe;
    const struct setting moe[] = {{"top_k", e->top_k > 0},          {"expert_ffn", e->expert_ffn > 0},
                                  {"shared_ffn", e->shared_ffn > 0}, {"shared_gate", e->shared_gate},
                                  {"shared_first", e->shared_first}, {"norm_topk", e->norm_topk},
                                  {"route_mask", e->route_mask},     {"router", e->router != MP_ROUTER_SOFTMAX},
                                  {"input_jitter", e->input_jitter}};
    for (size_t i = 0; i < N_OF(moe); i++)
        TRY(needs(rd, place, moe[i].key, moe[i].set, e->experts > 0, "\"experts\""));
    if (e->experts) {
        if (!e->top_k || e->top_k > e->experts)
            return fail_at(rd, MP_ERR_MODEL, place, "top_k", "%s (expected 1 to experts, %llu)",
                           e->top_k ? "exceeds experts" : "missing", (unsigned long long)e->experts);
        if (!e->expert_ffn)
            return fail_at(rd, MP_ERR_MODEL, place, "expert_ffn", "missing (expected a positive integer)");
        if (e->router == MP_ROUTER_SPARSEMIXER && e->top_k != 2)
            return fail_at(rd, MP_ERR_MODEL, place, "top_k", "%llu with \"router\": \"sparsemixer\" (it picks 2)",
                           (unsigned long long)e->top_k);
        uint64_t w;
        if (!mp_mul_u64(e->experts, e->expert_ffn, &w) || !mp_mul_u64(w, 2 * l->dim, &w) || w > MP_DIM_MAX)
            return fail_at(rd, MP_ERR_RANGE, place, "experts", "the experts are too large (at most %llu elements)",
                           (unsigned long long)MP_DIM_MAX);
        TRY(needs(rd, place, "shared_gate", e->shared_gate, e->shared_ffn > 0, "a shared_ffn"));
        TRY(needs(rd, place, "shared_first", e->shared_first, e->shared_ffn > 0, "a shared_ffn"));
    }
    TRY(needs(rd, place, "id_view", l->emb.id_view, l->emb.id_buffer, "\"id_buffer\": true"));
    TRY(needs(rd, place, "id_buffer", l->emb.id_buffer, l->emb.id_rows > 0, "an id_rows"));
    return MP_OK;
}

static enum mp_status read_type(struct reader *rd, const cJSON *o, const char *place, struct mp_layer *l);

/* Reads one op object (its "type" known to name an op) into l; an explicit "name" goes to l->name. */
static enum mp_status read_op(struct reader *rd, const cJSON *o, const char *place, struct mp_layer *l)
{
    enum mp_status st;
    const char *ts = mp_json_str(o, "type", &st, rd->path, place, rd->d);
    if (st != MP_OK)
        return st;
    int t = ts ? mp_layer_type_parse(ts) : -1;
    if (t < 0) {
        char all[512] = "", hint[48];
        for (int i = 0; i < MP_LT_COUNT; i++) {
            strcat(all, mp_layer_type_str((enum mp_layer_type)i));
            strcat(all, " ");
        }
        mp_json_suggest(all, ts ? ts : "", hint, sizeof hint);
        if (hint[0])
            return fail_at(rd, MP_ERR_MODEL, place, "type", "unknown layer type \"%s\" (did you mean \"%s\"?)", ts,
                           hint);
        return fail_at(rd, MP_ERR_MODEL, place, "type", "unknown layer type \"%s\"", ts ? ts : "");
    }
    memset(l, 0, sizeof *l);
    l->type = (enum mp_layer_type)t;
    if (!rd->allowed[t][0]) { /* (read_op runs for every op of every repeat: the list is made once) */
        const char *own = "type name ";
        snprintf(rd->allowed[t], ALLOWED_MAX, "%s", own);
        mp_json_layer_keys(l->type, rd->allowed[t] + strlen(own), ALLOWED_MAX - strlen(own));
    }
    char what[64];
    snprintf(what, sizeof what, "a%s %s layer", strchr("aeiou", ts[0]) ? "n" : "", ts);
    TRY(check_keys(rd, o, place, rd->allowed[t], what));
    bool named;
    TRY(get_name(rd, o, place, "name", l->name, sizeof l->name, &named));
    TRY(read_settings(rd, o, place, l));
    TRY(read_type(rd, o, place, l));
    return check_settings(rd, place, l);
}

/* The type's own keys (model_keys.c's `own` rows), their defaults and checks. */
static enum mp_status read_type(struct reader *rd, const cJSON *o, const char *place, struct mp_layer *l)
{
    switch (l->type) {
    case MP_LT_EMBEDDING:
    case MP_LT_POS_EMBEDDING:
        return read_table(rd, o, place, l);
    case MP_LT_LINEAR: {
        TRY(get_dim(rd, o, place, "in_features", true, &l->in_features));
        TRY(get_dim(rd, o, place, "out_features", true, &l->out_features));
        uint64_t w;
        if (!mp_mul_u64(l->in_features, l->out_features, &w) || w > MP_DIM_MAX)
            return fail_at(rd, MP_ERR_RANGE, place, "out_features", "the weight is too large (at most %llu "
                           "elements)", (unsigned long long)MP_DIM_MAX);
        l->bias = true;
        return get_bool(rd, o, place, "bias", &l->bias);
    }
    case MP_LT_LAYERNORM:
        l->norm.kind = MP_NORM_LAYERNORM;
        l->norm.bias = !l->norm.ln_fp32 && !l->norm.ln_plain;
        TRY(get_dim(rd, o, place, "dim", true, &l->dim));
        return get_bool(rd, o, place, "bias", &l->norm.bias);
    case MP_LT_RMSNORM:
        l->norm.kind = MP_NORM_RMSNORM;
        return get_dim(rd, o, place, "dim", true, &l->dim);
    case MP_LT_ATTENTION:
        return read_attention(rd, o, place, l);
    case MP_LT_MLP:
        TRY(get_dim(rd, o, place, "dim", true, &l->dim));
        return read_mlp(rd, o, place, l);
    case MP_LT_ACTIVATION:
        TRY(get_act(rd, o, place, true, &l->mlp.act));
        return get_bool(rd, o, place, "inplace", &l->inplace);
    case MP_LT_DROPOUT:
        l->p = 0.5;
        return get_prob(rd, o, place, "p", &l->p);
    case MP_LT_RESIDUAL:
    case MP_LT_FLATTEN:
        return MP_OK;
    case MP_LT_CONV2D:
        return read_conv(rd, o, place, l);
    case MP_LT_BATCHNORM2D:
        TRY(get_dim(rd, o, place, "channels", true, &l->conv.in_ch));
        l->conv.out_ch = l->dim = l->conv.in_ch;
        return MP_OK;
    case MP_LT_MAXPOOL2D:
    case MP_LT_AVGPOOL2D:
        return read_pool(rd, o, place, l);
    case MP_LT_ADAPTIVE_AVGPOOL2D:
        return read_adaptive(rd, o, place, l);
    case MP_LT_LM_HEAD:
        return read_lm_head(rd, o, place, l);
    case MP_LT_CLASSIFIER: {
        TRY(get_dim(rd, o, place, "in_features", true, &l->in_features));
        l->vocab = rd->classes;
        TRY(get_dim(rd, o, place, "classes", rd->classes == 0, &l->vocab));
        if (rd->classes && l->vocab != rd->classes)
            return fail_at(rd, MP_ERR_MODEL, place, "classes", "%llu differs from the model's classes (%llu)",
                           (unsigned long long)l->vocab, (unsigned long long)rd->classes);
        uint64_t w;
        if (!mp_mul_u64(l->in_features, l->vocab, &w) || w > MP_DIM_MAX)
            return fail_at(rd, MP_ERR_RANGE, place, "classes", "the weight is too large (at most %llu elements)",
                           (unsigned long long)MP_DIM_MAX);
        l->dim = l->in_features;
        l->out_features = l->vocab;
        if (!rd->m->labels_vocab)
            rd->m->labels_vocab = l->vocab;
        l->bias = true;
        TRY(get_bool(rd, o, place, "bias", &l->bias));
        /* "pool": "first": a sequence classified by its first position (ViT's class token) */
        enum mp_status pst;
        const char *pool = mp_json_str(o, "pool", &pst, rd->path, place, rd->d);
        if (pst != MP_OK)
            return pst;
        if (pool && strcmp(pool, "first") != 0 && strcmp(pool, "none") != 0)
            return fail_at(rd, MP_ERR_MODEL, place, "pool", "expected \"first\" or \"none\", got \"%s\"", pool);
        l->head.pool = pool && !strcmp(pool, "first") ? MP_POOL_FIRST : MP_POOL_NONE;
        return MP_OK;
    }
    case MP_LT_CUSTOM:
        return read_custom(rd, o, place, l);
    case MP_LT_TRANSFORMER_BLOCK:
        return read_transformer(rd, o, place, l);
    case MP_LT_BOTTLENECK:
        return read_bottleneck(rd, o, place, l);
    case MP_LT_PATCH_EMBEDDING:
        return read_patch_embedding(rd, o, place, l);
    case MP_LT_COUNT:
        break;
    }
    return fail_at(rd, MP_ERR_INTERNAL, place, "type", "unhandled layer type");
}

/* ---- blocks, groups, repeats ------------------------------------------------------------ */

static void block_name(const struct naming *nm, const char *explicit_name, const char *base, char *out, size_t cap)
{
    if (!explicit_name && nm->single) {
        size_t n = strlen(nm->pre);
        cut_printf(out, cap, "%.*s%s", (int)(n ? n - 1 : 0), nm->pre, nm->idx);
    } else {
        cut_printf(out, cap, "%s%s%s", nm->pre, explicit_name ? explicit_name : base, nm->idx);
    }
}

static enum mp_status add_block(struct reader *rd, const char *place, const char *name, size_t n_layers,
                                int group, struct mp_block **out)
{
    if (n_layers > MP_OPS_MAX - rd->n_ops)
        return fail_at(rd, MP_ERR_RANGE, place, NULL, "the model has more than %llu ops here (memplan's limit on a "
                       "model's ops, repeats expanded)", (unsigned long long)MP_OPS_MAX);
    rd->n_ops += n_layers;
    struct mp_block *b = mp_model_add_block(rd->m, name, n_layers);
    if (!b)
        return fail_at(rd, MP_ERR_NOMEM, place, NULL, "out of memory");
    b->repeat_group = group;
    *out = b;
    return MP_OK;
}

static enum mp_status read_entries(struct reader *rd, const cJSON *arr, const char *place, int depth,
                                   const struct naming *nm);

/* {"block": "name", "layers": [ops]}: several ops forming one block. */
static enum mp_status read_group(struct reader *rd, const cJSON *o, const char *place, const struct naming *nm)
{
    TRY(check_keys(rd, o, place, "block layers", "a block"));
    char gname[64];
    bool named;
    TRY(get_name(rd, o, place, "block", gname, sizeof gname, &named));
    if (!named)
        return fail_at(rd, MP_ERR_MODEL, place, "block", "missing (expected the block's name)");
    const cJSON *ops = item(o, "layers");
    if (!cJSON_IsArray(ops) || cJSON_GetArraySize(ops) == 0)
        return fail_at(rd, MP_ERR_MODEL, place, "layers", "expected a non-empty array of ops");
    size_t n = (size_t)cJSON_GetArraySize(ops);
    char name[64];
    block_name(nm, gname, gname, name, sizeof name);
    struct mp_block *b;
    TRY(add_block(rd, place, name, n, nm->group, &b));
    size_t j = 0;
    for (const cJSON *e = ops->child; e; e = e->next, j++) {
        char sub[PLACE_MAX];
        cut_printf(sub, sizeof sub, "%s.layers[%zu]", place, j);
        if (!cJSON_IsObject(e))
            return fail_at(rd, MP_ERR_MODEL, sub, NULL, "expected an op object");
        if (!item(e, "type"))
            return fail_at(rd, MP_ERR_MODEL, sub, NULL, "expected an op (with \"type\"); a block's layers cannot "
                           "hold blocks or repeats");
        TRY(read_op(rd, e, sub, &b->layers[j]));
    }
    return MP_OK;
}

/* The ops that entries arr make once expanded, read leniently: anything the reader will reject
 * counts as one op (its own error comes when it is read); saturates at UINT64_MAX.  Walks the
 * JSON once and makes nothing, so a repeat's size is known before it is expanded. */
static uint64_t count_ops(const cJSON *arr, int depth)
{
    uint64_t n = 0;
    for (const cJSON *e = cJSON_IsArray(arr) ? arr->child : NULL; e; e = e->next) {
        uint64_t c = 1; /* an op */
        const cJSON *r = cJSON_IsObject(e) ? item(e, "repeat") : NULL;
        const cJSON *body = cJSON_IsObject(e) ? item(e, "layers") : NULL;
        if (r && depth < MP_NEST_MAX) {
            double x = cJSON_IsNumber(r) ? r->valuedouble : 1;
            uint64_t times = x >= 1 && x <= MP_REPEAT_MAX ? (uint64_t)x : 1;
            if (!mp_mul_u64(times, count_ops(body, depth + 1), &c))
                c = UINT64_MAX;
        } else if (!r && !item(e, "type") && cJSON_GetArraySize(body) > 0) {
            c = (uint64_t)cJSON_GetArraySize(body); /* a group of ops */
        }
        if (!mp_add_u64(n, c, &n))
            return UINT64_MAX;
    }
    return n;
}

static enum mp_status read_repeat(struct reader *rd, const cJSON *o, const char *place, int depth,
                                  const struct naming *nm)
{
    TRY(check_keys(rd, o, place, "repeat name start layers", "a repeat"));
    if (depth >= MP_NEST_MAX)
        return fail_at(rd, MP_ERR_RANGE, place, NULL, "repeats nested more than %d deep", MP_NEST_MAX);
    uint64_t n = 0, start = 0;
    TRY(get_uint(rd, o, place, "repeat", true, true, MP_REPEAT_MAX, &n));
    TRY(get_uint(rd, o, place, "start", false, false, MP_REPEAT_MAX, &start));
    char rname[48];
    bool named;
    TRY(get_name(rd, o, place, "name", rname, sizeof rname, &named));
    const cJSON *body = item(o, "layers");
    if (!cJSON_IsArray(body) || cJSON_GetArraySize(body) == 0)
        return fail_at(rd, MP_ERR_MODEL, place, "layers", "expected a non-empty array of blocks");
    const cJSON *first = body->child;
    bool single = named && !first->next && cJSON_IsObject(first) && !item(first, "repeat");
    /* its size before any of it is made: nested repeats multiply */
    uint64_t per = count_ops(body, depth + 1), all;
    if (!mp_mul_u64(n, per, &all) || all > MP_OPS_MAX - rd->n_ops)
        return fail_at(rd, MP_ERR_RANGE, place, "repeat", "%llu repeats of %llu ops take the model over %llu ops "
                       "(memplan's limit on a model's ops, repeats expanded)", (unsigned long long)n,
                       (unsigned long long)per, (unsigned long long)MP_OPS_MAX);

    char sub[PLACE_MAX];
    cut_printf(sub, sizeof sub, "%s.layers", place);
    int group = ++rd->n_groups;
    for (uint64_t i = 0; i < n; i++) {
        struct naming child = *nm;
        child.group = group;
        if (named) {
            cut_printf(child.pre, sizeof child.pre, "%s%s%s.%llu.", nm->pre, rname, nm->idx,
                       (unsigned long long)(start + i));
            child.idx[0] = '\0';
            child.single = single;
        } else {
            size_t len = strlen(child.idx);
            snprintf(child.idx + len, sizeof child.idx - len, ".%llu", (unsigned long long)(start + i));
            child.single = false;
        }
        TRY(read_entries(rd, body, sub, depth + 1, &child));
    }
    return MP_OK;
}

/* One entry of a layers array: an op or composite (one-op block), a group, or a repeat. */
static enum mp_status read_entry(struct reader *rd, const cJSON *e, const char *place, int depth,
                                 const struct naming *nm)
{
    if (!cJSON_IsObject(e))
        return fail_at(rd, MP_ERR_MODEL, place, NULL, "expected an object (an op, a block or a repeat)");
    if (item(e, "repeat"))
        return read_repeat(rd, e, place, depth, nm);
    if (item(e, "type")) {
        struct mp_layer l;
        TRY(read_op(rd, e, place, &l));
        char name[64];
        block_name(nm, l.name[0] ? l.name : NULL, mp_layer_type_str(l.type), name, sizeof name);
        l.name[0] = '\0'; /* a one-op block: the op is named by its block */
        struct mp_block *b;
        TRY(add_block(rd, place, name, 1, nm->group, &b));
        b->layers[0] = l;
        return MP_OK;
    }
    if (item(e, "block") || item(e, "layers"))
        return read_group(rd, e, place, nm);
    return fail_at(rd, MP_ERR_MODEL, place, NULL,
                   "expected an op (\"type\"), a block (\"block\" + \"layers\") or a repeat (\"repeat\" + \"layers\")");
}

static enum mp_status read_entries(struct reader *rd, const cJSON *arr, const char *place, int depth,
                                   const struct naming *nm)
{
    size_t i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        char sub[PLACE_MAX];
        cut_printf(sub, sizeof sub, "%s[%zu]", place, i);
        TRY(read_entry(rd, e, sub, depth, nm));
    }
    return MP_OK;
}

/* ---- top level -------------------------------------------------------------------------- */

static enum mp_status read_input(struct reader *rd, const cJSON *root)
{
    struct mp_model *m = rd->m;
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (!in || cJSON_IsNull(in))
        return fail_at(rd, MP_ERR_MODEL, "", "input",
                       "missing (expected {\"tokens\": S}, {\"shape\": [C, H, W]} or {\"bytes_per_sample\": N})");
    if (!cJSON_IsObject(in))
        return fail_at(rd, MP_ERR_MODEL, "", "input",
                       "expected an object: {\"tokens\": S}, {\"shape\": [C, H, W]} or {\"bytes_per_sample\": N}");
    TRY(check_keys(rd, in, "input", "tokens shape bytes_per_sample", "the input"));
    int kinds = !!item(in, "tokens") + !!item(in, "shape") + !!item(in, "bytes_per_sample");
    if (kinds != 1)
        return fail_at(rd, MP_ERR_MODEL, "", "input",
                       "expected exactly one of \"tokens\", \"shape\" and \"bytes_per_sample\"");
    if (item(in, "tokens")) {
        m->input = MP_INPUT_TOKENS;
        return get_dim(rd, in, "input", "tokens", true, &m->seq_len);
    }
    if (item(in, "bytes_per_sample")) {
        m->input = MP_INPUT_BYTES;
        return get_dim(rd, in, "input", "bytes_per_sample", true, &m->bytes_per_sample);
    }
    m->input = MP_INPUT_IMAGE;
    const cJSON *sh = item(in, "shape");
    int n = cJSON_IsArray(sh) ? cJSON_GetArraySize(sh) : 0;
    if (n < 1 || n > 3)
        return fail_at(rd, MP_ERR_MODEL, "input", "shape", "expected [C, H, W] (or [H, W] or [F]) of positive "
                       "integers");
    uint64_t dims[3] = {1, 1, 1}, elems = 1;
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(sh, i);
        double x = cJSON_IsNumber(e) ? e->valuedouble : -1;
        char key[16], num[32];
        snprintf(key, sizeof key, "shape[%d]", i);
        if (!(x >= 1))
            return fail_at(rd, MP_ERR_MODEL, "input", key, "expected a positive integer");
        if (x > (double)MP_DIM_MAX)
            return fail_at(rd, MP_ERR_RANGE, "input", key, "%s is too large (at most %llu)",
                           num_str(x, num, sizeof num), (unsigned long long)MP_DIM_MAX);
        if (x != (double)(uint64_t)x)
            return fail_at(rd, MP_ERR_MODEL, "input", key, "expected a positive integer");
        dims[3 - n + i] = (uint64_t)x;
        if (!mp_mul_u64(elems, (uint64_t)x, &elems) || elems > MP_DIM_MAX)
            return fail_at(rd, MP_ERR_RANGE, "input", "shape", "more than %llu elements per sample",
                           (unsigned long long)MP_DIM_MAX);
    }
    m->channels = dims[0];
    m->height = dims[1];
    m->width = dims[2];
    return MP_OK;
}

enum mp_status mp_model_from_memplan(struct mp_model *m, const cJSON *root, const char *path, struct mp_diag *d)
{
    struct reader rd = {.m = m, .path = path, .d = d};
    if (!m->path[0])
        snprintf(m->path, sizeof m->path, "%s", path);
    snprintf(m->source, sizeof m->source, "memplan");
    if (!cJSON_IsObject(root))
        return fail_at(&rd, MP_ERR_MODEL, "", NULL, "expected a JSON object at the top level");
    TRY(check_keys(&rd, root, "", "name input classes layers", "a memplan model"));

    bool named;
    TRY(get_name(&rd, root, "", "name", m->name, sizeof m->name, &named));
    if (!named) {
        /* Default: the file's base name without ".json". */
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        size_t n = strlen(base);
        if (n > 5 && strcmp(base + n - 5, ".json") == 0)
            n -= 5;
        snprintf(m->name, sizeof m->name, "%.*s", (int)(n < sizeof m->name ? n : sizeof m->name - 1), base);
    }
    TRY(get_dim(&rd, root, "", "classes", false, &rd.classes));
    m->labels_vocab = rd.classes;
    TRY(read_input(&rd, root));

    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    if (!layers || cJSON_IsNull(layers))
        return fail_at(&rd, MP_ERR_MODEL, "", "layers", "missing (expected an array of layers)");
    if (!cJSON_IsArray(layers))
        return fail_at(&rd, MP_ERR_MODEL, "", "layers", "expected an array of layers");
    if (cJSON_GetArraySize(layers) == 0)
        return fail_at(&rd, MP_ERR_MODEL, "", "layers", "the model has no layers");
    struct naming top = {.pre = "", .idx = "", .single = false, .group = 0};
    TRY(read_entries(&rd, layers, "layers", 0, &top));
    return mp_model_validate(m, d);
}
