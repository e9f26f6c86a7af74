/* lower_norm.c — LayerNorm and its variants, RMSNorm, Cohere's norm (build.h). */
#include "build.h"

#include <stdio.h>

/* LayerNorm (autocast: fp32).  Saves input, mean, rstd (M fp32 each). */
/* A norm's weight: a (dim) parameter named "<name>.weight". */
static int norm_weight(struct bld *B, const char *name, uint64_t dim)
{
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", name);
    return new_param(B, pn, 1, dim, false);
}

/* The layer_norm op on xin: saves xin, mean and rstd (M fp32 each); g and be are its weight and
 * bias parameters (-1: none).  The output has xin's dtype. */
static struct val layernorm_node(struct bld *B, struct val xin, uint64_t dim, int g, int be, const char *name)
{
    struct val y = like(B, name, xin, dt_of(B, xin), true);
    struct mp_node *n = new_node(B, MP_P_LAYERNORM, name);
    if (!n)
        return y;
    uint64_t M = rows_of(xin);
    n->in[0] = xin.t;
    n->out = y.t;
    n->param[0] = g;
    n->param[1] = be;
    save(n, xin.t);
    char en[80];
    snprintf(en, sizeof en, "%s.mean", name);
    extra_as(n, new_flat(B, en, MP_DT_F32, M), MP_XR_MEAN);
    snprintf(en, sizeof en, "%s.rstd", name);
    extra_as(n, new_flat(B, en, MP_DT_F32, M), MP_XR_RSTD);
    n->rows = M;
    n->n = dim;
    n->fwd_flops = 8.0 * (double)T(B, xin.t)->elems;
    n->bwd_flops = 2.0 * n->fwd_flops;
    return y;
}

static struct val lower_layernorm(struct bld *B, struct val x, uint64_t dim, bool bias, const char *name)
{
    if (!width_ok(B, x, dim, "dim", name))
        return x;
    struct val xin = x;
    if (B->amp && dt_of(B, x) != MP_DT_F32) {
        char cn[64];
        snprintf(cn, sizeof cn, "%s.cast", name);
        xin = cast_to(B, x, MP_DT_F32, cn);
    }
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", name);
    int g = new_param(B, pn, 1, dim, false);
    snprintf(pn, sizeof pn, "%s.bias", name);
    int be = bias ? new_param(B, pn, 1, dim, false) : -1;
    struct val y = layernorm_node(B, xin, dim, g, be, name);
    if (B->amp && !B->amp_f32 && !failed(B)) {
        /* bf16-amp: layer_norm is on CUDA autocast's fp32 list (autocast_mode.cpp), so the bf16
         * weight and bias are cast to fp32 too (not cached: only casts down are); the backward
         * keeps the weight's copy, the bias's is a forward transient */
        struct mp_node *n = &B->p->nodes[B->p->n_nodes - 1];
        snprintf(pn, sizeof pn, "%s.weight_fp32", name);
        extra_as(n, new_flat(B, pn, MP_DT_F32, dim), MP_XR_NORM_WEIGHT);
        if (be >= 0)
            tmp_one(B, n, false, MP_TR_OTHER, mul(B, dim, 4));
    }
    return y;
}

/* The LayerNorm variants of HF families, one rule each (lower_norm picks them):
 * OLMo (OlmoLayerNorm): no weight, no bias; x.to(fp32), F.layer_norm, .to(x's dtype): a half x's
 *   fp32 copy is what the norm saves, and its fp32 output is cast back (a forward transient).
 *   Under autocast x is the fp32 residual: no copies.
 * Nemotron (NemotronLayerNorm1P): F.layer_norm(x, weight + 1, bias), weight + 1 a new (dim)
 *   tensor the norm saves; under autocast x, weight + 1 and bias are cast to the half dtype and
 *   the norm runs there with autocast off: x's half copy is saved (not the fp32 residual), the
 *   two half (dim) copies are saved too (layer_norm's backward takes weight and bias), the fp32
 *   weight + 1 is a forward transient, and the output is half. */
static struct val lower_layernorm_variant(struct bld *B, struct val x, const struct mp_layer *l, uint64_t dim,
                                          const char *name)
{
    if (!width_ok(B, x, dim, "dim", name))
        return x;
    enum mp_dtype xdt = dt_of(B, x), hdt = B->p->compute_dtype;
    char cn[64];
    if (l->norm.ln_plain) {
        snprintf(cn, sizeof cn, "%s.float", name);
        struct val y = layernorm_node(B, xdt == MP_DT_F32 ? x : cast_to(B, x, MP_DT_F32, cn), dim, -1, -1, name);
        snprintf(cn, sizeof cn, "%s.to_%s", name, mp_dtype_str(xdt));
        return xdt == MP_DT_F32 ? y : cast_to(B, y, xdt, cn);
    }
    int g = norm_weight(B, name, dim);
    char pn[80];
    snprintf(pn, sizeof pn, "%s.bias", name);
    int be = l->norm.bias ? new_param(B, pn, 1, dim, false) : -1;
    struct val xin = x;
    if (B->amp && xdt != hdt) {
        snprintf(cn, sizeof cn, "%s.cast", name);
        xin = cast_to(B, x, hdt, cn);
    }
    struct val y = layernorm_node(B, xin, dim, g, be, name);
    if (failed(B))
        return y;
    struct mp_node *n = &B->p->nodes[B->p->n_nodes - 1];
    enum mp_dtype wdt = B->amp ? hdt : B->p->param_dtype;
    for (int i = 0; i < (B->amp && be >= 0 ? 2 : 1); i++) {
        snprintf(pn, sizeof pn, "%s.%s", name, i ? "bias_cast" : "weight_1p");
        extra_as(n, new_flat(B, pn, wdt, dim), MP_XR_NORM_WEIGHT);
    }
    if (B->amp)
        tmp_one(B, n, false, MP_TR_OTHER, mul(B, dim, mp_dtype_size(B->p->param_dtype)));
    return y;
}

/* The backward of HF's composite RMSNorm, autograd node by node (derivatives.yaml of torch 2.15;
 * traced with bench/accuracy/torch_step.py's LiveTracker under fake tensors, LlamaRMSNorm of
 * transformers 5.24, bf16 and fp32 inputs, weight trainable or frozen; N = b s h elements):
 *   MulBackward0 (weight * normed): the normed tensor's gradient (and a trainable weight's, summed
 *     to (h) by the engine); then the output gradient and the saved normed tensor die;
 *   ToCopyBackward0 (a half x only): that gradient in fp32, the half one dies;
 *   MulBackward0 (h * rsqrt): h's first gradient (fp32 N, held by the engine's input buffer until
 *     h's other gradient comes) and rsqrt's (fp32 N, summed to M by the engine, then dies);
 *   RsqrtBackward0, AddBackward0: M-sized;
 *   MeanBackward1: the gradient expanded and divided by h: fp32 N (mean_backward);
 *   PowBackward0 (pow_backward: grad * (2 * h.pow(1))): h.pow(1), 2 * it and the product, fp32 N
 *     each, the two temporaries alive until the product is made (one C++ expression);
 *   then h's two gradients are added (fp32 N), ToCopyBackward0 casts it to x's dtype (the input
 *     gradient) and the fp32 ones die.
 * Its peak is PowBackward0's product: 5 fp32 N beyond the saved h and rsqrt (measured: 20 MiB at
 * 1 x 1024 x 1024 in bf16 and fp32 alike), when the output gradient and the normed tensor are gone
 * and the input gradient is not made yet.  The replay holds at a node's one backward moment its
 * saved tensors (the normed one), its output gradient and its input gradient: the transient is
 * the peak less those three, so that the moment is torch's (bf16: 20 N - 3 x 2 N; fp32: 8 N).
 * frozen.c adjusts it where the normed tensor is not saved (a frozen weight) or x needs no
 * gradient. */
static uint64_t rmsnorm_bwd_tmp(struct bld *B, uint64_t N, enum mp_dtype xdt, enum mp_dtype ydt,
                                enum mp_dtype ndt)
{
    uint64_t held = mp_dtype_size(xdt) + mp_dtype_size(ydt) + mp_dtype_size(ndt);
    return held < 20 ? mul(B, N, 20 - held) : 0; /* (activations are at most fp32: held <= 12) */
}

/* What an HF RMS composite keeps of x: x itself when fp32, else its fp32 copy (x.float()), and
 * rsqrt (M fp32): autograd's saves of pow and of the product. */
static void rms_saves(struct bld *B, struct mp_node *n, struct val x, uint64_t M, uint64_t N, const char *name)
{
    char en[80];
    if (dt_of(B, x) == MP_DT_F32) {
        save(n, x.t);
    } else {
        snprintf(en, sizeof en, "%s.x_fp32", name);
        extra_as(n, new_flat(B, en, MP_DT_F32, N), MP_XR_X_FP32);
    }
    snprintf(en, sizeof en, "%s.rsqrt", name);
    extra_as(n, new_flat(B, en, MP_DT_F32, M), MP_XR_RSQRT);
}

/* HF RMSNorm (LlamaRMSNorm): x.float(); x * rsqrt(mean(x^2) + eps); weight * x.to(in dtype).
 * Saves the fp32 input (a copy when x is half), rsqrt (M fp32) and the normalized
 * tensor in x's dtype; the fp32 x^2 is a forward transient.  f32w (Gemma*RMSNorm,
 * Olmo2RMSNorm): (weight * normalized) in fp32, then .to(x's dtype): the normalized tensor
 * is saved in fp32 and the output has x's dtype. */
struct val lower_rmsnorm(struct bld *B, struct val x, uint64_t dim, bool f32w, const char *name)
{
    if (!width_ok(B, x, dim, "dim", name))
        return x;
    int g = norm_weight(B, name, dim);
    enum mp_dtype xdt = dt_of(B, x);
    struct val y = like(B, name, x, f32w ? xdt : promote(xdt, B->p->param_dtype), true);
    struct mp_node *n = new_node(B, MP_P_RMSNORM, name);
    if (!n)
        return y;
    uint64_t M = rows_of(x), N = val_elems(B, x); /* a view (DeepSeek's kv latent): its part */
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = g;
    n->col_sum_weight = true;
    rms_saves(B, n, x, M, N, name);
    char en[80];
    snprintf(en, sizeof en, "%s.normed", name);
    extra_as(n, new_flat(B, en, f32w ? MP_DT_F32 : xdt, N), MP_XR_NORMED);
    tmp_one(B, n, false, MP_TR_OTHER, mul(B, N, 4)); /* x^2 in fp32 (or the fp32 normalized tensor before the cast) */
    if (!f32w) /* (Gemma's and OLMo2's composite: not traced yet, docs/memory-facts.md) */
        tmp_one(B, n, true, MP_TR_OTHER, rmsnorm_bwd_tmp(B, N, xdt, dt_of(B, y), xdt));
    n->rows = M;
    n->n = dim;
    n->fwd_flops = 6.0 * (double)N;
    n->bwd_flops = 2.0 * n->fwd_flops;
    return y;
}

/* Llama 4's L2 norm of q or k per head (modeling_llama4.py:106-118 Llama4TextL2Norm, after the
 * rotary): h = x.float(); h * rsqrt(h.pow(2).mean(-1) + eps); .type_as(x); no weight.  Saved: the
 * fp32 h (x itself when fp32; pow and the product) and rsqrt (one fp32 per head and row); forward
 * transients the fp32 x^2 and, for a half x, the fp32 product before its cast. */
struct val lower_l2_norm(struct bld *B, struct val x, uint64_t dim, const char *name)
{
    if (!width_ok(B, x, dim, "dim", name))
        return x;
    B->p->probe_unsupported = "Llama 4's L2 q/k norm (no weight)";
    enum mp_dtype xdt = dt_of(B, x);
    struct val y = like(B, name, x, xdt, ng(B, x));
    struct mp_node *n = new_node(B, MP_P_RMSNORM, name);
    if (!n)
        return y;
    uint64_t M = rows_of(x), N = val_elems(B, x);
    n->in[0] = x.t;
    n->out = y.t;
    rms_saves(B, n, x, M, N, name);
    tmp_one(B, n, false, MP_TR_OTHER, mul(B, N, 4));
    /* backward: the fp32 gradient of the product (the cast back's), its two fp32 parts (through
     * rsqrt, through pow) and their sum */
    tmp_one(B, n, true, MP_TR_OTHER, mul(B, N, xdt == MP_DT_F32 ? 8 : 12));
    n->rows = M;
    n->n = dim;
    n->fwd_flops = 5.0 * (double)N;
    n->bwd_flops = 2.0 * n->fwd_flops;
    return y;
}

/* Cohere's LayerNorm (CohereLayerNorm: weight, no bias), a Python composite in fp32:
 * h = x.float(); mean; var = (h - mean).pow(2).mean() (pow saves its input, one fp32 h - mean);
 * (h - mean) * rsqrt(var + eps) (a second fp32 h - mean and the rsqrt, saved by the product);
 * weight.float() * normalized (saves the fp32 normalized tensor); .to(x's dtype).  Measured with
 * bench/accuracy/torch_step.py's trackers under fake tensors: 3 x-sized fp32 tensors saved in fp32 and
 * bf16; backward 2 of them in fp32 beyond the gradients (and a half input's fp32 gradient before
 * its cast).  The executors want a mean: memplan keeps it (M fp32 more than torch). */
static struct val lower_cohere_norm(struct bld *B, struct val x, uint64_t dim, const char *name)
{
    if (!width_ok(B, x, dim, "dim", name))
        return x;
    int g = norm_weight(B, name, dim);
    enum mp_dtype xdt = dt_of(B, x);
    struct val y = like(B, name, x, xdt, true);
    struct mp_node *n = new_node(B, MP_P_LAYERNORM, name);
    if (!n)
        return y;
    uint64_t M = rows_of(x), N = val_elems(B, x);
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = g;
    n->param[1] = -1;
    n->col_sum_weight = true;
    static const char *const parts[5] = {"mean", "rsqrt", "centered", "centered_2", "normed"};
    static const enum mp_xrole roles[5] = {MP_XR_MEAN, MP_XR_RSTD, MP_XR_X_FP32, MP_XR_X_FP32, MP_XR_NORMED};
    for (int i = 0; i < 5; i++) {
        char en[80];
        snprintf(en, sizeof en, "%s.%s", name, parts[i]);
        extra_as(n, new_flat(B, en, MP_DT_F32, i < 2 ? M : N), roles[i]);
    }
    bool half = xdt != MP_DT_F32;
    /* the executors' layernorm backward reads x, which this composite does not keep */
    B->p->probe_unsupported = "Cohere's composite LayerNorm (its backward does not keep x)";
    tmp_one(B, n, false, MP_TR_OTHER, half ? mul(B, N, 4) : 0);       /* x.float() */
    tmp_one(B, n, true, MP_TR_OTHER, add(B, mul(B, N, 8), half ? mul(B, N, 2) : 0));
    n->rows = M;
    n->n = dim;
    n->fwd_flops = 10.0 * (double)N;
    n->bwd_flops = 2.0 * n->fwd_flops;
    return y;
}

struct val lower_norm(struct bld *B, struct val x, const struct mp_layer *l, enum mp_norm kind,
                      uint64_t dim, const char *name)
{
    if (kind == MP_NORM_LAYERNORM && l->norm.ln_fp32)
        return lower_cohere_norm(B, x, dim, name);
    if (kind == MP_NORM_LAYERNORM && (l->norm.ln_plain || l->norm.ln_1p))
        return lower_layernorm_variant(B, x, l, dim, name);
    if (kind == MP_NORM_RMSNORM)
        return lower_rmsnorm(B, x, dim, l->norm.rms_fp32, name);
    return lower_layernorm(B, x, dim, l->type == MP_LT_RMSNORM ? false : l->norm.bias, name);
}
