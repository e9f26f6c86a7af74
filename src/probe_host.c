/* probe_host.c — the host backend: the tensor program executed in plain C.
 *
 * A visitor of mp_replay: ALLOC/FREE go through the counting pool (one malloc per
 * storage, capacity-limited), so the measured peak is the estimator's
 * peak_allocated_bytes; FWD/BWD compute every prim; OPT_STEP updates parameters
 * in the state storages the replay allocated.  Half tensors hold 2-byte values
 * (round to nearest even); math is float, most sums double.  Float operand copies made
 * while a node runs (a GPU's registers) are outside the pool.  Letters: M rows, K inner.
 */
#include "probe_impl.h"

_Static_assert(MP_MA_GELU == (int)MP_ACT_GELU && MP_MA_GELU_TANH == (int)MP_ACT_GELU_TANH &&
                   MP_MA_RELU == (int)MP_ACT_RELU && MP_MA_SILU == (int)MP_ACT_SILU && MP_MA_TANH == (int)MP_ACT_TANH &&
                   MP_MA_SIGMOID == (int)MP_ACT_SIGMOID && MP_MA_GELU_NEW == (int)MP_ACT_GELU_NEW &&
                   MP_MA_GELU_FAST == (int)MP_ACT_GELU_FAST,
               "mp_math.h activation codes follow enum mp_act");

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h> /* mallopt */
#endif

struct mp_host_exec {
    const struct mp_program *p;
    struct mp_train_opts t;
    struct mp_pool pool;
    struct mp_node_layout *lay;
    uint64_t seed;
    uint64_t rng_step;  /* dropout stream: advances with every updating step */
    uint64_t opt_steps; /* optimizer steps taken (Adam bias correction, Adafactor schedule) */
    bool update;
    float *grads_out;
    double loss;
    double ce_loss;     /* the last cross-entropy, before rounding to its fp32 tensor */
    struct mp_diag *d;
};

/* ---- element access ---------------------------------------------------------------------- */

/* A storage seen as elements of one dtype; p == NULL when not allocated. */
struct hv {
    void *p;
    enum mp_dtype dt;
    uint64_t n;
};

static inline float ldf(struct hv v, uint64_t i)
{
    switch (v.dt) {
    case MP_DT_F32: return ((const float *)v.p)[i];
    case MP_DT_BF16: return mp_f32_from_bf16(((const uint16_t *)v.p)[i]);
    case MP_DT_F16: return mp_f32_from_f16(((const uint16_t *)v.p)[i]);
    case MP_DT_I64: return (float)((const int64_t *)v.p)[i];
    case MP_DT_U8: return (float)((const uint8_t *)v.p)[i];
    }
    return 0.0f;
}

static inline void stf(struct hv v, uint64_t i, float f)
{
    switch (v.dt) {
    case MP_DT_F32: ((float *)v.p)[i] = f; break;
    case MP_DT_BF16: ((uint16_t *)v.p)[i] = mp_bf16_from_f32(f); break;
    case MP_DT_F16: ((uint16_t *)v.p)[i] = mp_f16_from_f32(f); break;
    case MP_DT_I64: ((int64_t *)v.p)[i] = (int64_t)f; break;
    case MP_DT_U8: ((uint8_t *)v.p)[i] = (uint8_t)f; break;
    }
}

static inline void accf(struct hv v, uint64_t i, float f) { stf(v, i, ldf(v, i) + f); }

static float round_dt(enum mp_dtype dt, float f)
{
    switch (dt) {
    case MP_DT_BF16: return mp_f32_from_bf16(mp_bf16_from_f32(f));
    case MP_DT_F16: return mp_f32_from_f16(mp_f16_from_f32(f));
    default: return f;
    }
}

/* ---- one node's storages ------------------------------------------------------------------- */

#define MAX_SCRATCH 24

struct ctx {
    struct mp_host_exec *x;
    const struct mp_program *p;
    const struct mp_node *n;
    const struct mp_node_layout *lay;
    int k;
    struct hv in[3], out, ex[MP_NODE_EXTRA_MAX], w, b, gin[3], gout, gw, gb, tmp;
    void *scratch[MAX_SCRATCH];
    int n_scratch;
};

static struct hv tview(const struct ctx *c, enum mp_store s, int t)
{
    struct hv v = {NULL, MP_DT_U8, 0};
    if (t < 0)
        return v;
    v.p = mp_pool_get(&c->x->pool, s, t);
    v.dt = c->p->tensors[t].dtype;
    v.n = c->p->tensors[t].elems;
    return v;
}

static struct hv pview(const struct ctx *c, enum mp_store s, int q)
{
    struct hv v = {NULL, q >= 0 ? c->p->params[q].dtype : c->p->param_dtype, 0};
    if (q < 0)
        return v;
    v.p = mp_pool_get(&c->x->pool, s, q);
    v.n = c->p->params[q].elems;
    return v;
}

/* The node's extra with role r (layers.h mp_xrole); p == NULL when it has none. */
static struct hv xr(const struct ctx *c, enum mp_xrole r)
{
    return tview(c, MP_ST_ACT, mp_node_extra(c->n, r, 0));
}

/* The part of the node's TMP storage with role r, as floats (NULL when it has none). */
static float *tmp_part(const struct ctx *c, bool bwd, enum mp_trole r, uint64_t *bytes)
{
    const struct mp_tmp_part *t = mp_node_tmp(c->n, bwd, r);
    *bytes = t ? t->bytes : 0;
    return t && c->tmp.p ? (float *)(void *)((char *)c->tmp.p + t->offset) : NULL;
}

static void ctx_open(struct ctx *c, struct mp_host_exec *x, int k)
{
    memset(c, 0, sizeof *c);
    c->x = x;
    c->p = x->p;
    c->k = k;
    c->n = &x->p->nodes[k];
    c->lay = &x->lay[k];
    const struct mp_node *n = c->n;
    for (int j = 0; j < 3; j++) {
        c->in[j] = tview(c, MP_ST_ACT, n->in[j]);
        c->gin[j] = tview(c, MP_ST_GRAD, n->in[j]);
    }
    c->out = tview(c, MP_ST_ACT, n->out);
    c->gout = tview(c, MP_ST_GRAD, n->out);
    for (int j = 0; j < n->n_extra; j++)
        c->ex[j] = tview(c, MP_ST_ACT, n->extra[j]);
    c->w = pview(c, MP_ST_PARAM, n->param[0]);
    c->b = pview(c, MP_ST_PARAM, n->param[1]);
    c->gw = pview(c, MP_ST_PGRAD, n->param[0]);
    c->gb = pview(c, MP_ST_PGRAD, n->param[1]);
    c->tmp.p = mp_pool_get(&x->pool, MP_ST_TMP, k);
    c->tmp.dt = MP_DT_U8;
}

static void ctx_close(struct ctx *c)
{
    for (int i = 0; i < c->n_scratch; i++)
        free(c->scratch[i]);
    c->n_scratch = 0;
}

static enum mp_status nomem(struct ctx *c)
{
    return mp_fail(c->x->d, MP_ERR_NOMEM, "probe: %s: out of host memory for scratch", c->n->name);
}

static enum mp_status missing(struct ctx *c, const char *what)
{
    return mp_fail(c->x->d, MP_ERR_INTERNAL, "probe: %s (%s): %s is not allocated", c->n->name, mp_prim_str(c->n->prim),
                   what);
}

/* Zeroed float scratch of n elements, freed when the node ends; NULL on failure. */
static float *fscratch(struct ctx *c, uint64_t n)
{
    if (c->n_scratch >= MAX_SCRATCH || n > SIZE_MAX / sizeof(float))
        return NULL;
    float *f = calloc(n ? (size_t)n : 1, sizeof *f);
    if (f)
        c->scratch[c->n_scratch++] = f;
    return f;
}

/* The storage as floats: itself when fp32, else a converted scratch copy. */
static float *fget(struct ctx *c, struct hv v)
{
    if (!v.p)
        return NULL;
    if (v.dt == MP_DT_F32)
        return v.p;
    float *f = fscratch(c, v.n);
    if (!f)
        return NULL;
    if (v.dt == MP_DT_BF16) { /* the common half: one loop without a dtype switch per element */
        const uint16_t *h = v.p;
        for (uint64_t i = 0; i < v.n; i++)
            f[i] = mp_f32_from_bf16(h[i]);
    } else {
        for (uint64_t i = 0; i < v.n; i++)
            f[i] = ldf(v, i);
    }
    return f;
}

static void fstore(struct hv v, const float *src, uint64_t n)
{
    if (v.dt == MP_DT_F32) {
        if (v.p != src)
            memcpy(v.p, src, (size_t)n * sizeof(float));
        return;
    }
    if (v.dt == MP_DT_BF16) {
        uint16_t *h = v.p;
        for (uint64_t i = 0; i < n; i++)
            h[i] = mp_bf16_from_f32(src[i]);
        return;
    }
    for (uint64_t i = 0; i < n; i++)
        stf(v, i, src[i]);
}

static void facc(struct hv v, const float *src, uint64_t n)
{
    if (!v.p)
        return;
    if (v.dt == MP_DT_F32) {
        float *f = v.p;
        for (uint64_t i = 0; i < n; i++)
            f[i] += src[i];
        return;
    }
    if (v.dt == MP_DT_BF16) {
        uint16_t *h = v.p;
        for (uint64_t i = 0; i < n; i++)
            h[i] = mp_bf16_from_f32(mp_f32_from_bf16(h[i]) + src[i]);
        return;
    }
    for (uint64_t i = 0; i < n; i++)
        accf(v, i, src[i]);
}

#define FGET(var, view)                 \
    float *var = fget(c, (view));       \
    if (!var)                           \
        return (view).p ? nomem(c) : missing(c, #view)
#define FNEW(var, count)                \
    float *var = fscratch(c, (count));  \
    if (!var)                           \
        return nomem(c)
#define NEED(view)                      \
    do {                                \
        if (!(view).p)                  \
            return missing(c, #view);   \
    } while (0)

/* ---- embedding, positions, cast ------------------------------------------------------------- */

static enum mp_status embed_fwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    NEED(c->in[0]);
    NEED(c->w);
    NEED(c->out);
    const int64_t *ids = c->in[0].p;
    for (uint64_t r = 0; r < n->rows; r++) {
        if (ids[r] < 0 || (uint64_t)ids[r] >= n->k)
            return mp_fail(c->x->d, MP_ERR_INTERNAL, "probe: %s: token id %lld outside the vocabulary", n->name,
                           (long long)ids[r]);
        for (uint64_t j = 0; j < n->n; j++)
            stf(c->out, r * n->n + j, ldf(c->w, (uint64_t)ids[r] * n->n + j));
    }
    return MP_OK;
}

static enum mp_status embed_bwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    if (!c->gout.p || !c->gw.p)
        return MP_OK;
    NEED(c->in[0]);
    const int64_t *ids = c->in[0].p;
    FGET(dy, c->gout);
    for (uint64_t r = 0; r < n->rows; r++)
        for (uint64_t j = 0; j < n->n; j++)
            accf(c->gw, (uint64_t)ids[r] * n->n + j, dy[r * n->n + j]);
    return MP_OK;
}

/* The table row added to row r: its position (learned positions, k == seq), or
 * row 0 everywhere (k == 1: BERT token types with all-zero ids). */
static uint64_t pos_row(const struct mp_node *n, uint64_t r)
{
    return n->k == 1 ? 0 : r % (n->seq ? n->seq : 1);
}

static enum mp_status addpos_fwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    NEED(c->w);
    NEED(c->out);
    FGET(x, c->in[0]);
    for (uint64_t r = 0; r < n->rows; r++)
        for (uint64_t j = 0; j < n->n; j++)
            stf(c->out, r * n->n + j, x[r * n->n + j] + ldf(c->w, pos_row(n, r) * n->n + j));
    return MP_OK;
}

static enum mp_status addpos_bwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    if (!c->gout.p)
        return MP_OK;
    FGET(dy, c->gout);
    facc(c->gin[0], dy, c->gout.n);
    if (c->gw.p)
        for (uint64_t r = 0; r < n->rows; r++)
            for (uint64_t j = 0; j < n->n; j++)
                accf(c->gw, pos_row(n, r) * n->n + j, dy[r * n->n + j]);
    return MP_OK;
}

static enum mp_status cast_fwd(struct ctx *c)
{
    NEED(c->out);
    FGET(x, c->in[0]);
    fstore(c->out, x, c->out.n);
    return MP_OK;
}

/* Gradient passes straight through (cast, residual add). */
static enum mp_status pass_bwd(struct ctx *c)
{
    if (!c->gout.p)
        return MP_OK;
    FGET(dy, c->gout);
    for (int j = 0; j < 3; j++)
        if (c->n->in[j] >= 0 && c->gin[j].p && c->gin[j].p != c->gout.p)
            facc(c->gin[j], dy, c->gout.n);
    return MP_OK;
}

static enum mp_status add_fwd(struct ctx *c)
{
    NEED(c->out);
    FGET(a, c->in[0]);
    FGET(b, c->in[1]);
    FNEW(y, c->out.n);
    for (uint64_t i = 0; i < c->out.n; i++)
        y[i] = a[i] + b[i];
    fstore(c->out, y, c->out.n);
    return MP_OK;
}

/* ---- linear -------------------------------------------------------------------------------- */

#define GEMM(...)                                   \
    do {                                            \
        if (mp_host_gemm(__VA_ARGS__) != MP_OK)     \
            return nomem(c);                        \
    } while (0)

/* A quantized base weight: dequantized (bitsandbytes dequantize_4bit) into the node's
 * MP_TR_DEQUANT temporary in the output dtype, in forward and again in backward. */
static enum mp_status dequant_weight(struct ctx *c, bool fwd, float **wf)
{
    const struct mp_param *q = &c->p->params[c->n->param[0]];
    const struct mp_quant *qz = mp_program_base_quant(c->p);
    NEED(c->w);
    uint64_t tb;
    void *dq = tmp_part(c, !fwd, MP_TR_DEQUANT, &tb);
    if (!dq)
        return missing(c, "the dequantized weight");
    FNEW(w, q->elems);
    if (!qz || mp_quant_unpack(qz, q->rows, q->cols, c->w.p, w) != MP_OK)
        return mp_fail(c->x->d, MP_ERR_UNSUPPORTED, "probe: %s: the host backend executes bitsandbytes NF4 "
                       "weights only", c->n->name);
    struct hv t = {dq, c->p->tensors[c->n->out].dtype, q->elems};
    for (uint64_t i = 0; i < q->elems; i++) /* the dequantized temporary, then read back */
        stf(t, i, w[i]);
    for (uint64_t i = 0; i < q->elems; i++)
        w[i] = ldf(t, i);
    *wf = w;
    return MP_OK;
}

/* The weight the GEMM uses: the dequantized base weight, under autocast the half copy, else
 * the parameter. */
static enum mp_status linear_weight(struct ctx *c, bool fwd, float **wf)
{
    if (c->n->quantized)
        return dequant_weight(c, fwd, wf);
    struct hv copy = xr(c, MP_XR_WEIGHT_COPY);
    bool has_copy = mp_node_extra(c->n, MP_XR_WEIGHT_COPY, 0) >= 0;
    struct hv wc = has_copy ? copy : c->w;
    if (has_copy && fwd) {
        NEED(c->w);
        NEED(copy);
        if (wc.dt == MP_DT_BF16 && c->w.dt == MP_DT_F32) {
            const float *w = c->w.p;
            uint16_t *h = wc.p;
            for (uint64_t i = 0; i < wc.n; i++)
                h[i] = mp_bf16_from_f32(w[i]);
        } else {
            for (uint64_t i = 0; i < wc.n; i++)
                stf(wc, i, ldf(c->w, i));
        }
    }
    *wf = fget(c, wc);
    if (!*wf)
        return wc.p ? nomem(c) : missing(c, "weight");
    return MP_OK;
}

static enum mp_status linear_fwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    NEED(c->out);
    float *w;
    enum mp_status st = linear_weight(c, true, &w);
    if (st != MP_OK)
        return st;
    FGET(x, c->in[0]);
    float *bias = NULL;
    if (n->param[1] >= 0) {
        bias = fget(c, c->b);
        if (!bias)
            return c->b.p ? nomem(c) : missing(c, "bias");
    }
    FNEW(y, n->rows * n->n);
    if (bias) /* y (M,N) = bias + x (M,K) W^T (N,K) */
        for (uint64_t r = 0; r < n->rows; r++)
            memcpy(y + r * n->n, bias, (size_t)n->n * sizeof *y);
    GEMM(false, true, n->rows, n->n, n->k, 1.0f, x, n->k, w, n->k, bias ? 1.0f : 0.0f, y, n->n);
    fstore(c->out, y, n->rows * n->n);
    return MP_OK;
}

/* Weight gradient dW (N,K) = dY^T X, through the half temporary under autocast
 * (PyTorch: a half grad, then its fp32 copy into .grad). */
static enum mp_status weight_grad(struct ctx *c, const float *dw, uint64_t count)
{
    if (!c->gw.p)
        return MP_OK;
    enum mp_dtype cdt = c->p->compute_dtype;
    uint64_t tb;
    void *half = tmp_part(c, true, MP_TR_WGRAD_HALF, &tb);
    if (half && cdt != MP_DT_F32) {
        if (tb != count * mp_dtype_size(cdt))
            return mp_fail(c->x->d, MP_ERR_INTERNAL, "probe: %s: half weight gradient of %llu bytes, %llu expected",
                           c->n->name, (unsigned long long)tb, (unsigned long long)(count * mp_dtype_size(cdt)));
        struct hv t = {half, cdt, count};
        if (cdt == MP_DT_BF16 && c->gw.dt == MP_DT_F32) {
            uint16_t *h = t.p;
            float *g = c->gw.p;
            for (uint64_t i = 0; i < count; i++) {
                h[i] = mp_bf16_from_f32(dw[i]);
                g[i] += mp_f32_from_bf16(h[i]);
            }
            return MP_OK;
        }
        for (uint64_t i = 0; i < count; i++) {
            stf(t, i, dw[i]);
            accf(c->gw, i, ldf(t, i));
        }
        return MP_OK;
    }
    facc(c->gw, dw, count);
    return MP_OK;
}

static enum mp_status linear_bwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    if (!c->gout.p)
        return MP_OK;
    uint64_t M = n->rows, N = n->n, K = n->k;
    FGET(dy, c->gout);
    if (c->gin[0].p) {
        float *w;
        enum mp_status st = linear_weight(c, false, &w);
        if (st != MP_OK)
            return st;
        FNEW(dx, M * K);
        GEMM(false, false, M, K, N, 1.0f, dy, N, w, K, 0.0f, dx, K); /* dx (M,K) = dy (M,N) W (N,K) */
        facc(c->gin[0], dx, M * K);
    }
    if (c->gw.p) {
        FGET(x, c->in[0]);
        FNEW(dw, N * K);
        GEMM(true, false, N, K, M, 1.0f, dy, N, x, K, 0.0f, dw, K); /* dW (N,K) = dy^T (N,M) x (M,K) */
        enum mp_status st = weight_grad(c, dw, N * K);
        if (st != MP_OK)
            return st;
    }
    if (c->gb.p)
        for (uint64_t o = 0; o < N; o++) {
            double s = 0;
            for (uint64_t r = 0; r < M; r++)
                s += dy[r * N + o];
            accf(c->gb, o, (float)s);
        }
    return MP_OK;
}

/* ---- norms ---------------------------------------------------------------------------------- */

static enum mp_status layernorm_fwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    uint64_t M = n->rows, N = n->n;
    NEED(c->out);
    NEED(xr(c, MP_XR_MEAN));
    NEED(xr(c, MP_XR_RSTD));
    FGET(x, c->in[0]);
    FGET(g, c->w);
    float *be = NULL;
    if (n->param[1] >= 0 && !(be = fget(c, c->b)))
        return nomem(c);
    float *mean = xr(c, MP_XR_MEAN).p, *rstd = xr(c, MP_XR_RSTD).p;
    FNEW(y, M * N);
    for (uint64_t r = 0; r < M; r++) {
        const float *xr = x + r * N;
        double s = 0, v = 0;
        for (uint64_t j = 0; j < N; j++)
            s += xr[j];
        double mu = s / (double)N;
        for (uint64_t j = 0; j < N; j++)
            v += (xr[j] - mu) * (xr[j] - mu);
        float rs = (float)(1.0 / sqrt(v / (double)N + MP_LN_EPS));
        mean[r] = (float)mu;
        rstd[r] = rs;
        for (uint64_t j = 0; j < N; j++)
            y[r * N + j] = (xr[j] - (float)mu) * rs * g[j] + (be ? be[j] : 0.0f);
    }
    fstore(c->out, y, M * N);
    return MP_OK;
}

static enum mp_status layernorm_bwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    uint64_t M = n->rows, N = n->n;
    if (!c->gout.p)
        return MP_OK;
    FGET(dy, c->gout);
    FGET(x, c->in[0]);
    FGET(g, c->w);
    NEED(xr(c, MP_XR_MEAN));
    NEED(xr(c, MP_XR_RSTD));
    const float *mean = xr(c, MP_XR_MEAN).p, *rstd = xr(c, MP_XR_RSTD).p;
    FNEW(dx, M * N);
    FNEW(dg, N);
    FNEW(db, N);
    for (uint64_t r = 0; r < M; r++) {
        double a = 0, bsum = 0;
        for (uint64_t j = 0; j < N; j++) {
            float xh = (x[r * N + j] - mean[r]) * rstd[r], dxh = dy[r * N + j] * g[j];
            a += dxh;
            bsum += (double)dxh * xh;
            dg[j] += dy[r * N + j] * xh;
            db[j] += dy[r * N + j];
        }
        a /= (double)N;
        bsum /= (double)N;
        for (uint64_t j = 0; j < N; j++) {
            float xh = (x[r * N + j] - mean[r]) * rstd[r], dxh = dy[r * N + j] * g[j];
            dx[r * N + j] = rstd[r] * (dxh - (float)a - xh * (float)bsum);
        }
    }
    facc(c->gin[0], dx, M * N);
    facc(c->gw, dg, N);
    facc(c->gb, db, N);
    return MP_OK;
}

/* HF RMSNorm extras: x_fp32 (when the input is not fp32; else x itself), rsqrt, normed. */
static void rms_extras(struct ctx *c, struct hv *xf, struct hv *rs, struct hv *nm)
{
    *xf = mp_node_extra(c->n, MP_XR_X_FP32, 0) >= 0 ? xr(c, MP_XR_X_FP32) : c->in[0];
    *rs = xr(c, MP_XR_RSQRT);
    *nm = xr(c, MP_XR_NORMED);
}

static enum mp_status rmsnorm_fwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    uint64_t M = n->rows, N = n->n;
    struct hv xf, rsv, nmv;
    rms_extras(c, &xf, &rsv, &nmv);
    NEED(c->out);
    NEED(rsv);
    NEED(nmv);
    FGET(x, c->in[0]);
    FGET(g, c->w);
    if (mp_node_extra(n, MP_XR_X_FP32, 0) >= 0) {
        NEED(xf);
        fstore(xf, x, M * N); /* hidden_states.to(torch.float32) */
    }
    float *rs = rsv.p;
    FNEW(y, M * N);
    for (uint64_t r = 0; r < M; r++) {
        double v = 0;
        for (uint64_t j = 0; j < N; j++)
            v += (double)x[r * N + j] * x[r * N + j];
        rs[r] = (float)(1.0 / sqrt(v / (double)N + MP_RMS_EPS));
        for (uint64_t j = 0; j < N; j++) {
            stf(nmv, r * N + j, x[r * N + j] * rs[r]); /* .to(input_dtype) */
            y[r * N + j] = g[j] * ldf(nmv, r * N + j);
        }
    }
    fstore(c->out, y, M * N);
    return MP_OK;
}

static enum mp_status rmsnorm_bwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    uint64_t M = n->rows, N = n->n;
    if (!c->gout.p)
        return MP_OK;
    struct hv xf, rsv, nmv;
    rms_extras(c, &xf, &rsv, &nmv);
    FGET(dy, c->gout);
    if (c->gw.p) { /* a frozen weight keeps no normed tensor (weight * normed saves it for dg only) */
        FGET(nm, nmv);
        FNEW(dg, N);
        for (uint64_t r = 0; r < M; r++)
            for (uint64_t j = 0; j < N; j++)
                dg[j] += dy[r * N + j] * nm[r * N + j];
        facc(c->gw, dg, N);
    }
    if (!c->gin[0].p)
        return MP_OK; /* the input needs no gradient: x and rsqrt were not kept */
    NEED(rsv);
    FGET(x, xf);
    FGET(g, c->w);
    const float *rs = rsv.p;
    FNEW(dx, M * N);
    for (uint64_t r = 0; r < M; r++) {
        double s = 0;
        for (uint64_t j = 0; j < N; j++)
            s += (double)(dy[r * N + j] * g[j]) * x[r * N + j];
        float mean = (float)(s / (double)N), r3 = rs[r] * rs[r] * rs[r];
        for (uint64_t j = 0; j < N; j++)
            dx[r * N + j] = rs[r] * dy[r * N + j] * g[j] - x[r * N + j] * r3 * mean;
    }
    facc(c->gin[0], dx, M * N);
    return MP_OK;
}

/* ---- rotary embedding ------------------------------------------------------------------------ */

/* HF rotate_half on the first rotary_dim of each head; positions = row mod seq. */
static enum mp_status rope_run(struct ctx *c, bool fwd)
{
    const struct mp_node *n = c->n;
    uint64_t H = n->heads, d = n->head_dim, rd = n->rotary_dim ? n->rotary_dim : d, half = rd / 2;
    uint64_t s = n->seq ? n->seq : 1, Win = c->lay->in_w[0], off = c->lay->in_off[0], Wout = H * d;
    struct hv src = fwd ? c->in[0] : c->gout, dst = fwd ? c->out : c->gin[0];
    if (!fwd && (!src.p || !dst.p))
        return MP_OK;
    NEED(src);
    NEED(dst);
    uint64_t sw = fwd ? Win : Wout, so = fwd ? off : 0, dw = fwd ? Wout : Win, dof = fwd ? 0 : off;
    for (uint64_t r = 0; r < n->rows; r++) {
        float pos = (float)(r % s);
        for (uint64_t h = 0; h < H; h++) {
            uint64_t sb = r * sw + so + h * d, db = r * dw + dof + h * d;
            for (uint64_t i = 0; i < half; i++) {
                float ang = pos * powf(MP_ROPE_BASE, -(float)(2 * i) / (float)rd);
                float co = cosf(ang), si = sinf(ang);
                float a = ldf(src, sb + i), b = ldf(src, sb + i + half);
                if (fwd) {
                    stf(dst, db + i, a * co - b * si);
                    stf(dst, db + i + half, b * co + a * si);
                } else {
                    accf(dst, db + i, a * co + b * si);
                    accf(dst, db + i + half, -a * si + b * co);
                }
            }
            for (uint64_t i = rd; i < d; i++) {
                if (fwd)
                    stf(dst, db + i, ldf(src, sb + i));
                else
                    accf(dst, db + i, ldf(src, sb + i));
            }
        }
    }
    return MP_OK;
}

/* ---- attention --------------------------------------------------------------------------------- */

struct attn_dims {
    uint64_t b, s, a, kv, d, group;
    uint64_t wq, wk, wv, oq, ok, ov;
    float scale, p;
    uint64_t key;
};

static struct attn_dims attn_dims(const struct ctx *c)
{
    const struct mp_node *n = c->n;
    struct attn_dims A;
    A.s = n->seq ? n->seq : 1;
    A.b = n->rows / A.s;
    A.a = n->heads;
    A.kv = n->kv_heads ? n->kv_heads : n->heads;
    A.d = n->head_dim;
    A.group = A.a / A.kv;
    A.wq = c->lay->in_w[0];
    A.wk = c->lay->in_w[1];
    A.wv = c->lay->in_w[2];
    A.oq = c->lay->in_off[0];
    A.ok = c->lay->in_off[1];
    A.ov = c->lay->in_off[2];
    A.scale = 1.0f / sqrtf((float)A.d);
    A.p = (float)n->p;
    A.key = mp_dropout_key(c->x->seed, c->k, c->x->rng_step);
    return A;
}

/* Element offsets of q row (bi, i, head h), k/v rows (bi, j, kv head). */
static uint64_t qoff(const struct attn_dims *A, uint64_t bi, uint64_t i, uint64_t h)
{
    return (bi * A->s + i) * A->wq + A->oq + h * A->d;
}
static uint64_t koff(const struct attn_dims *A, uint64_t bi, uint64_t j, uint64_t g)
{
    return (bi * A->s + j) * A->wk + A->ok + g * A->d;
}
static uint64_t voff(const struct attn_dims *A, uint64_t bi, uint64_t j, uint64_t g)
{
    return (bi * A->s + j) * A->wv + A->ov + g * A->d;
}

static float keep_scale(const struct attn_dims *A, uint64_t idx)
{
    if (A->p <= 0.0f)
        return 1.0f;
    return mp_hash_unit(A->key + idx) >= A->p ? 1.0f / (1.0f - A->p) : 0.0f;
}

static float dotf(const float *a, const float *b, uint64_t n)
{
    double s = 0;
    for (uint64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return (float)s;
}

/* Flash/SDPA forward: online over keys, keeps only the logsumexp (no s x s). */
static enum mp_status flash_fwd(struct ctx *c)
{
    struct attn_dims A = attn_dims(c);
    NEED(c->out);
    NEED(xr(c, MP_XR_LSE));
    FGET(q, c->in[0]);
    FGET(k, c->in[1]);
    FGET(v, c->in[2]);
    FNEW(o, A.b * A.s * A.a * A.d);
    FNEW(sc, A.s);
    float *lse = xr(c, MP_XR_LSE).p;
    uint64_t s_lse = xr(c, MP_XR_LSE).n / (A.b * A.a);
    for (uint64_t bi = 0; bi < A.b; bi++)
        for (uint64_t h = 0; h < A.a; h++)
            for (uint64_t i = 0; i < A.s; i++) {
                uint64_t g = h / A.group, jn = c->n->causal ? i + 1 : A.s;
                const float *qi = q + qoff(&A, bi, i, h);
                float m = -INFINITY;
                for (uint64_t j = 0; j < jn; j++) {
                    sc[j] = A.scale * dotf(qi, k + koff(&A, bi, j, g), A.d);
                    m = fmaxf(m, sc[j]);
                }
                double l = 0;
                for (uint64_t j = 0; j < jn; j++)
                    l += exp((double)sc[j] - m);
                float L = m + (float)log(l);
                lse[(bi * A.a + h) * s_lse + i] = L;
                float *oi = o + ((bi * A.s + i) * A.a + h) * A.d;
                for (uint64_t j = 0; j < jn; j++) {
                    float pj = expf(sc[j] - L) * keep_scale(&A, ((bi * A.a + h) * A.s + i) * A.s + j);
                    const float *vj = v + voff(&A, bi, j, g);
                    for (uint64_t e = 0; e < A.d; e++)
                        oi[e] += pj * vj[e];
                }
            }
    fstore(c->out, o, c->out.n);
    return MP_OK;
}

/* Adds dq/dk/dv (float, (b,s,heads,d)) into the q/k/v gradient storages at their offsets. */
static void attn_scatter_grads(struct ctx *c, const struct attn_dims *A, const float *dq, const float *dk,
                               const float *dv)
{
    for (uint64_t bi = 0; bi < A->b; bi++)
        for (uint64_t i = 0; i < A->s; i++) {
            if (c->gin[0].p)
                for (uint64_t h = 0; h < A->a; h++)
                    for (uint64_t e = 0; e < A->d; e++)
                        accf(c->gin[0], qoff(A, bi, i, h) + e, dq[((bi * A->s + i) * A->a + h) * A->d + e]);
            for (uint64_t g = 0; g < A->kv; g++)
                for (uint64_t e = 0; e < A->d; e++) {
                    if (c->gin[1].p)
                        accf(c->gin[1], koff(A, bi, i, g) + e, dk[((bi * A->s + i) * A->kv + g) * A->d + e]);
                    if (c->gin[2].p)
                        accf(c->gin[2], voff(A, bi, i, g) + e, dv[((bi * A->s + i) * A->kv + g) * A->d + e]);
                }
        }
}

static uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

/* Flash backward: D = rowsum(dO * O) and dq accumulated in the node's fp32
 * temporaries (softmax_d [b,a,s_r], dq_accum [b,s_r,a,d_r]); P recomputed from lse. */
static enum mp_status flash_bwd(struct ctx *c)
{
    struct attn_dims A = attn_dims(c);
    if (!c->gout.p)
        return MP_OK;
    NEED(xr(c, MP_XR_LSE));
    FGET(q, c->in[0]);
    FGET(k, c->in[1]);
    FGET(v, c->in[2]);
    FGET(o, c->out);
    FGET(dO, c->gout);
    const float *lse = xr(c, MP_XR_LSE).p;
    uint64_t s_lse = xr(c, MP_XR_LSE).n / (A.b * A.a), s_r = round_up(A.s, 128), d_r = round_up(A.d, 32);
    uint64_t nD = A.b * A.a * s_r, nQ = A.b * s_r * A.a * d_r;
    uint64_t bD, bQ;
    float *Dv = tmp_part(c, true, MP_TR_FLASH_D, &bD), *dqa = tmp_part(c, true, MP_TR_FLASH_DQ, &bQ);
    if (Dv && dqa && bD == nD * 4 && bQ == nQ * 4) { /* flash's own workspace: the replay's TMP storage */
        memset(Dv, 0, (size_t)bD);
        memset(dqa, 0, (size_t)bQ);
    } else {
        Dv = fscratch(c, nD);
        dqa = fscratch(c, nQ);
        if (!Dv || !dqa)
            return nomem(c);
    }
    FNEW(dq, A.b * A.s * A.a * A.d);
    FNEW(dk, A.b * A.s * A.kv * A.d);
    FNEW(dv, A.b * A.s * A.kv * A.d);
    for (uint64_t bi = 0; bi < A.b; bi++)
        for (uint64_t h = 0; h < A.a; h++)
            for (uint64_t i = 0; i < A.s; i++) {
                uint64_t row = ((bi * A.s + i) * A.a + h) * A.d;
                Dv[(bi * A.a + h) * s_r + i] = dotf(dO + row, o + row, A.d);
            }
    for (uint64_t bi = 0; bi < A.b; bi++)
        for (uint64_t h = 0; h < A.a; h++)
            for (uint64_t i = 0; i < A.s; i++) {
                uint64_t g = h / A.group, jn = c->n->causal ? i + 1 : A.s, row = ((bi * A.s + i) * A.a + h) * A.d;
                const float *qi = q + qoff(&A, bi, i, h), *doi = dO + row;
                float L = lse[(bi * A.a + h) * s_lse + i], Di = Dv[(bi * A.a + h) * s_r + i];
                float *dqi = dqa + ((bi * s_r + i) * A.a + h) * d_r;
                for (uint64_t j = 0; j < jn; j++) {
                    const float *kj = k + koff(&A, bi, j, g), *vj = v + voff(&A, bi, j, g);
                    float P = expf(A.scale * dotf(qi, kj, A.d) - L);
                    float ks = keep_scale(&A, ((bi * A.a + h) * A.s + i) * A.s + j);
                    float dP = dotf(doi, vj, A.d) * ks, dS = P * (dP - Di);
                    float *dkj = dk + ((bi * A.s + j) * A.kv + g) * A.d, *dvj = dv + ((bi * A.s + j) * A.kv + g) * A.d;
                    for (uint64_t e = 0; e < A.d; e++) {
                        dqi[e] += A.scale * dS * kj[e];
                        dkj[e] += A.scale * dS * qi[e];
                        dvj[e] += P * ks * doi[e];
                    }
                }
                for (uint64_t e = 0; e < A.d; e++)
                    dq[row + e] = dqi[e];
            }
    attn_scatter_grads(c, &A, dq, dk, dv);
    return MP_OK;
}

/* Eager extras: q/k/v copies (b,a,s,d), probs (b,a,s,s) and what P@V reads: the dropped
 * probabilities (with a dropout mask), their cast to v's dtype, or probs itself. */
static struct hv eager_pv(const struct ctx *c)
{
    if (mp_node_extra(c->n, MP_XR_PROBS_DROPPED, 0) >= 0)
        return xr(c, MP_XR_PROBS_DROPPED);
    if (mp_node_extra(c->n, MP_XR_PROBS_CAST, 0) >= 0)
        return xr(c, MP_XR_PROBS_CAST);
    return xr(c, MP_XR_PROBS);
}

static enum mp_status eager_supported(struct ctx *c)
{
    if (mp_node_extra(c->n, MP_XR_SOFTCAP_TANH, 0) >= 0)
        return mp_fail(c->x->d, MP_ERR_UNSUPPORTED, "probe: %s: attention logit soft-capping is not implemented "
                                                    "by the probe yet", c->n->name);
    return MP_OK;
}

static enum mp_status eager_fwd(struct ctx *c)
{
    struct attn_dims A = attn_dims(c);
    const struct mp_node *n = c->n;
    NEED(c->out);
    enum mp_status sst = eager_supported(c);
    if (sst != MP_OK)
        return sst;
    for (int j = 0; j < n->n_extra; j++)
        if (!c->ex[j].p)
            return missing(c, "an eager extra");
    FGET(q, c->in[0]);
    FGET(k, c->in[1]);
    FGET(v, c->in[2]);
    struct hv qc = xr(c, MP_XR_Q_COPY), kc = xr(c, MP_XR_K_COPY), vc = xr(c, MP_XR_V_COPY), pr = xr(c, MP_XR_PROBS),
              pv = eager_pv(c), dmask = xr(c, MP_XR_ATTN_DROP_MASK);
    enum mp_dtype cdt = qc.dt;
    /* contiguous (b,a,s,d) copies; k and v repeated over the group (repeat_kv) */
    for (uint64_t bi = 0; bi < A.b; bi++)
        for (uint64_t h = 0; h < A.a; h++)
            for (uint64_t i = 0; i < A.s; i++)
                for (uint64_t e = 0; e < A.d; e++) {
                    uint64_t dst = ((bi * A.a + h) * A.s + i) * A.d + e, g = h / A.group;
                    stf(qc, dst, q[qoff(&A, bi, i, h) + e]);
                    stf(kc, dst, k[koff(&A, bi, i, g) + e]);
                    stf(vc, dst, v[voff(&A, bi, i, g) + e]);
                }
    FGET(Q, qc);
    FGET(K, kc);
    FGET(V, vc);
    FNEW(sc, A.s);
    FNEW(o, A.b * A.s * A.a * A.d);
    for (uint64_t bi = 0; bi < A.b; bi++)
        for (uint64_t h = 0; h < A.a; h++) {
            uint64_t bh = (bi * A.a + h) * A.s;
            for (uint64_t i = 0; i < A.s; i++) {
                uint64_t jn = n->causal ? i + 1 : A.s;
                float m = -INFINITY;
                for (uint64_t j = 0; j < jn; j++) {
                    sc[j] = round_dt(cdt, A.scale * dotf(Q + (bh + i) * A.d, K + (bh + j) * A.d, A.d));
                    m = fmaxf(m, sc[j]);
                }
                double l = 0;
                for (uint64_t j = 0; j < jn; j++)
                    l += exp((double)sc[j] - m);
                for (uint64_t j = 0; j < A.s; j++) {
                    uint64_t idx = (bh + i) * A.s + j;
                    float P = j < jn ? (float)(exp((double)sc[j] - m) / l) : 0.0f;
                    stf(pr, idx, P);
                    P = ldf(pr, idx);
                    if (dmask.p) {
                        float ks = keep_scale(&A, idx);
                        stf(dmask, idx, ks > 0.0f ? 1.0f : 0.0f);
                        stf(pv, idx, P * ks);
                    } else if (pv.p != pr.p) {
                        stf(pv, idx, P);
                    }
                }
                float *oi = o + ((bi * A.s + i) * A.a + h) * A.d;
                for (uint64_t j = 0; j < jn; j++) {
                    float P = ldf(pv, (bh + i) * A.s + j);
                    for (uint64_t e = 0; e < A.d; e++)
                        oi[e] += P * V[(bh + j) * A.d + e];
                }
            }
        }
    fstore(c->out, o, c->out.n);
    return MP_OK;
}

static enum mp_status eager_bwd(struct ctx *c)
{
    struct attn_dims A = attn_dims(c);
    const struct mp_node *n = c->n;
    if (!c->gout.p)
        return MP_OK;
    enum mp_status sst = eager_supported(c);
    if (sst != MP_OK)
        return sst;
    for (int j = 0; j < n->n_extra; j++)
        if (!c->ex[j].p)
            return missing(c, "an eager extra");
    FGET(dO, c->gout);
    FGET(Q, xr(c, MP_XR_Q_COPY));
    FGET(K, xr(c, MP_XR_K_COPY));
    FGET(V, xr(c, MP_XR_V_COPY));
    struct hv pr = xr(c, MP_XR_PROBS), pv = eager_pv(c), dmask = xr(c, MP_XR_ATTN_DROP_MASK);
    FNEW(dP, A.s);
    FNEW(dq, A.b * A.s * A.a * A.d);
    FNEW(dk, A.b * A.s * A.kv * A.d);
    FNEW(dv, A.b * A.s * A.kv * A.d);
    float inv_keep = A.p > 0.0f ? 1.0f / (1.0f - A.p) : 1.0f;
    for (uint64_t bi = 0; bi < A.b; bi++)
        for (uint64_t h = 0; h < A.a; h++) {
            uint64_t bh = (bi * A.a + h) * A.s, g = h / A.group;
            for (uint64_t i = 0; i < A.s; i++) {
                const float *doi = dO + ((bi * A.s + i) * A.a + h) * A.d;
                double rowdot = 0;
                for (uint64_t j = 0; j < A.s; j++) {
                    uint64_t idx = (bh + i) * A.s + j;
                    float d = dotf(doi, V + (bh + j) * A.d, A.d);
                    if (dmask.p)
                        d *= ldf(dmask, idx) * inv_keep;
                    dP[j] = d;
                    rowdot += (double)ldf(pr, idx) * d;
                }
                float *dqi = dq + ((bi * A.s + i) * A.a + h) * A.d;
                for (uint64_t j = 0; j < A.s; j++) {
                    uint64_t idx = (bh + i) * A.s + j;
                    float P = ldf(pr, idx), Pv = ldf(pv, idx), dS = P * (dP[j] - (float)rowdot);
                    float *dkj = dk + ((bi * A.s + j) * A.kv + g) * A.d, *dvj = dv + ((bi * A.s + j) * A.kv + g) * A.d;
                    for (uint64_t e = 0; e < A.d; e++) {
                        dqi[e] += A.scale * dS * K[(bh + j) * A.d + e];
                        dkj[e] += A.scale * dS * Q[(bh + i) * A.d + e];
                        dvj[e] += Pv * doi[e];
                    }
                }
            }
        }
    attn_scatter_grads(c, &A, dq, dk, dv);
    return MP_OK;
}

/* ---- activations, mul, dropout ------------------------------------------------------------------ */


/* d act / d x, from the saved tensor: x for gelu/silu, y for relu/tanh/sigmoid. */

/* HF's Python GELUs (NewGELUActivation, FastGELUActivation) keep their
 * intermediates as extras (layers.c): new: tanh(u), 0.5x, 1 + tanh(u);
 * fast: 0.044715x, 0.7978845608x, 1 + 0.044715x^2, tanh, 0.5x, 1 + tanh. */

static enum mp_status act_fwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    NEED(c->out);
    FGET(x, c->in[0]);
    FNEW(y, c->out.n);
    for (uint64_t i = 0; i < c->out.n; i++)
        y[i] = mp_act_f(n->act, x[i]);
    fstore(c->out, y, c->out.n);
    /* HF's GELU composites keep their intermediates (each in its own dtype); under autocast a
     * gelu_new first keeps an fp32 copy of its input (layers.c lower_act) */
    struct hv xf = xr(c, MP_XR_X_FP32);
    if (xf.p)
        fstore(xf, x, xf.n);
    for (int j = 0; mp_node_extra(n, MP_XR_ACT_PART, j) >= 0; j++) {
        struct hv part = tview(c, MP_ST_ACT, mp_node_extra(n, MP_XR_ACT_PART, j));
        NEED(part);
        for (uint64_t i = 0; i < part.n; i++)
            stf(part, i, mp_gelu_part(n->act, j, x[i]));
    }
    return MP_OK;
}

static enum mp_status act_bwd(struct ctx *c)
{
    if (!c->gout.p || !c->gin[0].p)
        return MP_OK;
    struct hv sv = tview(c, MP_ST_ACT, c->n->saved[0]);
    FGET(s, sv);
    FGET(dy, c->gout);
    FNEW(dx, c->gout.n);
    for (uint64_t i = 0; i < c->gout.n; i++)
        dx[i] = dy[i] * mp_act_df(c->n->act, s[i]);
    if (c->gin[0].p == c->gout.p)
        fstore(c->gin[0], dx, c->gout.n); /* in place (ReLU(inplace=True)): one storage */
    else
        facc(c->gin[0], dx, c->gout.n);
    return MP_OK;
}

static enum mp_status mul_fwd(struct ctx *c)
{
    NEED(c->out);
    FGET(a, c->in[0]);
    FGET(b, c->in[1]);
    FNEW(y, c->out.n);
    for (uint64_t i = 0; i < c->out.n; i++)
        y[i] = a[i] * b[i];
    fstore(c->out, y, c->out.n);
    return MP_OK;
}

static enum mp_status mul_bwd(struct ctx *c)
{
    if (!c->gout.p)
        return MP_OK;
    FGET(dy, c->gout);
    for (int j = 0; j < 2; j++) { /* each factor is kept only for the other's gradient */
        if (!c->gin[j].p)
            continue;
        FGET(other, c->in[1 - j]);
        FNEW(d, c->gout.n);
        for (uint64_t i = 0; i < c->gout.n; i++)
            d[i] = dy[i] * other[i];
        facc(c->gin[j], d, c->gout.n);
    }
    return MP_OK;
}

/* LoRA's result * scaling (a Python float): y = p x, dx = p dy. */
static enum mp_status scale_run(struct ctx *c, bool fwd)
{
    float a = (float)c->n->p;
    struct hv src = fwd ? c->in[0] : c->gout, dst = fwd ? c->out : c->gin[0];
    if (!fwd && (!src.p || !dst.p))
        return MP_OK;
    NEED(dst);
    FGET(x, src);
    FNEW(y, src.n);
    for (uint64_t i = 0; i < src.n; i++)
        y[i] = a * x[i];
    if (fwd)
        fstore(dst, y, src.n);
    else
        facc(dst, y, src.n);
    return MP_OK;
}

static enum mp_status dropout_fwd(struct ctx *c)
{
    NEED(c->out);
    NEED(xr(c, MP_XR_DROP_MASK));
    FGET(x, c->in[0]);
    uint8_t *mask = xr(c, MP_XR_DROP_MASK).p;
    float p = (float)c->n->p, sc = 1.0f / (1.0f - p);
    uint64_t key = mp_dropout_key(c->x->seed, c->k, c->x->rng_step);
    FNEW(y, c->out.n);
    for (uint64_t i = 0; i < c->out.n; i++) {
        mask[i] = mp_hash_unit(key + i) >= p;
        y[i] = mask[i] ? x[i] * sc : 0.0f;
    }
    fstore(c->out, y, c->out.n);
    return MP_OK;
}

static enum mp_status dropout_bwd(struct ctx *c)
{
    if (!c->gout.p || !c->gin[0].p)
        return MP_OK;
    NEED(xr(c, MP_XR_DROP_MASK));
    FGET(dy, c->gout);
    const uint8_t *mask = xr(c, MP_XR_DROP_MASK).p;
    float sc = 1.0f / (1.0f - (float)c->n->p);
    FNEW(dx, c->gout.n);
    for (uint64_t i = 0; i < c->gout.n; i++)
        dx[i] = mask[i] ? dy[i] * sc : 0.0f;
    facc(c->gin[0], dx, c->gout.n);
    return MP_OK;
}

/* ---- convolution, batch norm, pooling ------------------------------------------------------------ */

struct conv_dims {
    uint64_t b, ci, co, hi, wi, ho, wo, k, st, pad, g, cpg, opg;
};

static struct conv_dims conv_dims(const struct ctx *c)
{
    const struct mp_node *n = c->n;
    struct conv_dims D = {.ci = n->c_in, .co = n->c_out, .hi = n->h_in, .wi = n->w_in, .ho = n->h_out,
                          .wo = n->w_out, .k = n->kernel, .st = n->stride ? n->stride : 1, .pad = n->padding,
                          .g = n->groups ? n->groups : 1};
    uint64_t per = D.ci * D.hi * D.wi;
    D.b = per ? c->p->tensors[n->in[0]].elems / per : 0;
    D.cpg = D.ci / D.g;
    D.opg = D.co / D.g;
    return D;
}

/* Input position of output (oh, ow) and kernel tap (kh, kw); false when it falls in the padding. */
static bool conv_at(const struct conv_dims *D, uint64_t oh, uint64_t ow, uint64_t kh, uint64_t kw, uint64_t *ih,
                    uint64_t *iw)
{
    uint64_t y = oh * D->st + kh, x = ow * D->st + kw;
    if (y < D->pad || x < D->pad || y - D->pad >= D->hi || x - D->pad >= D->wi)
        return false;
    *ih = y - D->pad;
    *iw = x - D->pad;
    return true;
}

static enum mp_status conv_fwd(struct ctx *c)
{
    struct conv_dims D = conv_dims(c);
    NEED(c->out);
    float *w;
    enum mp_status st = linear_weight(c, true, &w);
    if (st != MP_OK)
        return st;
    FGET(x, c->in[0]);
    float *bias = NULL;
    if (c->n->param[1] >= 0 && !(bias = fget(c, c->b)))
        return nomem(c);
    FNEW(y, c->out.n);
    for (uint64_t bi = 0; bi < D.b; bi++)
        for (uint64_t o = 0; o < D.co; o++) {
            uint64_t g = o / D.opg;
            for (uint64_t oh = 0; oh < D.ho; oh++)
                for (uint64_t ow = 0; ow < D.wo; ow++) {
                    double s = bias ? bias[o] : 0.0;
                    for (uint64_t ci = 0; ci < D.cpg; ci++)
                        for (uint64_t kh = 0; kh < D.k; kh++)
                            for (uint64_t kw = 0; kw < D.k; kw++) {
                                uint64_t ih, iw;
                                if (conv_at(&D, oh, ow, kh, kw, &ih, &iw))
                                    s += (double)x[((bi * D.ci + g * D.cpg + ci) * D.hi + ih) * D.wi + iw] *
                                         w[((o * D.cpg + ci) * D.k + kh) * D.k + kw];
                            }
                    y[((bi * D.co + o) * D.ho + oh) * D.wo + ow] = (float)s;
                }
        }
    fstore(c->out, y, c->out.n);
    return MP_OK;
}

static enum mp_status conv_bwd(struct ctx *c)
{
    struct conv_dims D = conv_dims(c);
    if (!c->gout.p)
        return MP_OK;
    FGET(dy, c->gout);
    float *w = NULL, *x = NULL, *dx = NULL, *dw = NULL;
    if (c->gin[0].p) {
        enum mp_status st = linear_weight(c, false, &w);
        if (st != MP_OK)
            return st;
        if (!(dx = fscratch(c, c->gin[0].n)))
            return nomem(c);
    }
    if (c->gw.p) {
        if (!(x = fget(c, c->in[0])))
            return c->in[0].p ? nomem(c) : missing(c, "input");
        if (!(dw = fscratch(c, c->gw.n)))
            return nomem(c);
    }
    FNEW(db, D.co);
    for (uint64_t bi = 0; bi < D.b; bi++)
        for (uint64_t o = 0; o < D.co; o++) {
            uint64_t g = o / D.opg;
            for (uint64_t oh = 0; oh < D.ho; oh++)
                for (uint64_t ow = 0; ow < D.wo; ow++) {
                    float gy = dy[((bi * D.co + o) * D.ho + oh) * D.wo + ow];
                    db[o] += gy;
                    for (uint64_t ci = 0; ci < D.cpg; ci++)
                        for (uint64_t kh = 0; kh < D.k; kh++)
                            for (uint64_t kw = 0; kw < D.k; kw++) {
                                uint64_t ih, iw;
                                if (!conv_at(&D, oh, ow, kh, kw, &ih, &iw))
                                    continue;
                                uint64_t xi = ((bi * D.ci + g * D.cpg + ci) * D.hi + ih) * D.wi + iw;
                                uint64_t wi = ((o * D.cpg + ci) * D.k + kh) * D.k + kw;
                                if (dx)
                                    dx[xi] += gy * w[wi];
                                if (dw)
                                    dw[wi] += gy * x[xi];
                            }
                }
        }
    if (dx)
        facc(c->gin[0], dx, c->gin[0].n);
    if (dw) {
        enum mp_status st = weight_grad(c, dw, c->gw.n);
        if (st != MP_OK)
            return st;
    }
    facc(c->gb, db, D.co);
    return MP_OK;
}

static enum mp_status batchnorm_fwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    uint64_t C = n->c_in, HW = n->h_in * n->w_in, B = (C && HW) ? c->out.n / (C * HW) : 0, N = B * HW;
    NEED(c->out);
    NEED(xr(c, MP_XR_BN_MEAN));
    NEED(xr(c, MP_XR_BN_INVSTD));
    FGET(x, c->in[0]);
    FGET(g, c->w);
    FGET(be, c->b);
    float *mean = xr(c, MP_XR_BN_MEAN).p, *istd = xr(c, MP_XR_BN_INVSTD).p;
    FNEW(y, c->out.n);
    for (uint64_t ch = 0; ch < C; ch++) {
        double s = 0, v = 0;
        for (uint64_t bi = 0; bi < B; bi++)
            for (uint64_t i = 0; i < HW; i++)
                s += x[(bi * C + ch) * HW + i];
        double mu = s / (double)N;
        for (uint64_t bi = 0; bi < B; bi++)
            for (uint64_t i = 0; i < HW; i++) {
                double t = x[(bi * C + ch) * HW + i] - mu;
                v += t * t;
            }
        mean[ch] = (float)mu;
        istd[ch] = (float)(1.0 / sqrt(v / (double)N + MP_BN_EPS));
        for (uint64_t bi = 0; bi < B; bi++)
            for (uint64_t i = 0; i < HW; i++) {
                uint64_t e = (bi * C + ch) * HW + i;
                y[e] = (x[e] - mean[ch]) * istd[ch] * g[ch] + be[ch];
            }
    }
    fstore(c->out, y, c->out.n);
    return MP_OK;
}

static enum mp_status batchnorm_bwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    if (!c->gout.p)
        return MP_OK;
    uint64_t C = n->c_in, HW = n->h_in * n->w_in, B = (C && HW) ? c->gout.n / (C * HW) : 0, N = B * HW;
    NEED(xr(c, MP_XR_BN_MEAN));
    NEED(xr(c, MP_XR_BN_INVSTD));
    FGET(dy, c->gout);
    FGET(x, c->in[0]);
    FGET(g, c->w);
    const float *mean = xr(c, MP_XR_BN_MEAN).p, *istd = xr(c, MP_XR_BN_INVSTD).p;
    FNEW(dx, c->gout.n);
    FNEW(dg, C);
    FNEW(db, C);
    for (uint64_t ch = 0; ch < C; ch++) {
        double sd = 0, sdx = 0;
        for (uint64_t bi = 0; bi < B; bi++)
            for (uint64_t i = 0; i < HW; i++) {
                uint64_t e = (bi * C + ch) * HW + i;
                float xh = (x[e] - mean[ch]) * istd[ch];
                sd += dy[e];
                sdx += (double)dy[e] * xh;
            }
        dg[ch] = (float)sdx;
        db[ch] = (float)sd;
        for (uint64_t bi = 0; bi < B; bi++)
            for (uint64_t i = 0; i < HW; i++) {
                uint64_t e = (bi * C + ch) * HW + i;
                float xh = (x[e] - mean[ch]) * istd[ch];
                dx[e] = g[ch] * istd[ch] / (float)N * ((float)N * dy[e] - (float)sd - xh * (float)sdx);
            }
    }
    facc(c->gin[0], dx, c->gout.n);
    facc(c->gw, dg, C);
    facc(c->gb, db, C);
    return MP_OK;
}

/* Pooling window of output (oh, ow): rows [h0, h1), cols [w0, w1) of the input (padding excluded). */
static void pool_window(const struct mp_node *n, uint64_t oh, uint64_t ow, uint64_t *h0, uint64_t *h1, uint64_t *w0,
                        uint64_t *w1)
{
    if (n->prim == MP_P_ADAPTIVE_AVGPOOL) {
        *h0 = oh * n->h_in / n->h_out;
        *h1 = ((oh + 1) * n->h_in + n->h_out - 1) / n->h_out;
        *w0 = ow * n->w_in / n->w_out;
        *w1 = ((ow + 1) * n->w_in + n->w_out - 1) / n->w_out;
        return;
    }
    uint64_t st = n->stride ? n->stride : 1, ys = oh * st, xs = ow * st;
    *h0 = ys > n->padding ? ys - n->padding : 0;
    *w0 = xs > n->padding ? xs - n->padding : 0;
    *h1 = mp_min_u64(ys + n->kernel > n->padding ? ys + n->kernel - n->padding : 0, n->h_in);
    *w1 = mp_min_u64(xs + n->kernel > n->padding ? xs + n->kernel - n->padding : 0, n->w_in);
}

static enum mp_status pool_fwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    uint64_t HWi = n->h_in * n->w_in, HWo = n->h_out * n->w_out, planes = HWo ? c->out.n / HWo : 0;
    NEED(c->out);
    FGET(x, c->in[0]);
    FNEW(y, c->out.n);
    bool mx = n->prim == MP_P_MAXPOOL;
    if (mx)
        NEED(xr(c, MP_XR_POOL_INDICES));
    for (uint64_t pl = 0; pl < planes; pl++)
        for (uint64_t oh = 0; oh < n->h_out; oh++)
            for (uint64_t ow = 0; ow < n->w_out; ow++) {
                uint64_t h0, h1, w0, w1, best = 0;
                pool_window(n, oh, ow, &h0, &h1, &w0, &w1);
                double s = 0;
                float m = -INFINITY;
                for (uint64_t ih = h0; ih < h1; ih++)
                    for (uint64_t iw = w0; iw < w1; iw++) {
                        float v = x[pl * HWi + ih * n->w_in + iw];
                        s += v;
                        if (v > m || (ih == h0 && iw == w0)) {
                            m = v;
                            best = ih * n->w_in + iw;
                        }
                    }
                uint64_t o = pl * HWo + oh * n->w_out + ow;
                if (mx) {
                    y[o] = m;
                    ((int64_t *)xr(c, MP_XR_POOL_INDICES).p)[o] = (int64_t)best;
                } else {
                    /* avg_pool2d count_include_pad=True: the whole kernel; adaptive: the window */
                    double cnt = n->prim == MP_P_AVGPOOL ? (double)(n->kernel * n->kernel)
                                                         : (double)((h1 - h0) * (w1 - w0));
                    y[o] = (float)(s / cnt);
                }
            }
    fstore(c->out, y, c->out.n);
    return MP_OK;
}

static enum mp_status pool_bwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    if (!c->gout.p || !c->gin[0].p)
        return MP_OK;
    uint64_t HWi = n->h_in * n->w_in, HWo = n->h_out * n->w_out, planes = HWo ? c->gout.n / HWo : 0;
    FGET(dy, c->gout);
    FNEW(dx, c->gin[0].n);
    bool mx = n->prim == MP_P_MAXPOOL;
    if (mx)
        NEED(xr(c, MP_XR_POOL_INDICES));
    for (uint64_t pl = 0; pl < planes; pl++)
        for (uint64_t oh = 0; oh < n->h_out; oh++)
            for (uint64_t ow = 0; ow < n->w_out; ow++) {
                uint64_t o = pl * HWo + oh * n->w_out + ow;
                if (mx) {
                    dx[pl * HWi + (uint64_t)((const int64_t *)xr(c, MP_XR_POOL_INDICES).p)[o]] += dy[o];
                    continue;
                }
                uint64_t h0, h1, w0, w1;
                pool_window(n, oh, ow, &h0, &h1, &w0, &w1);
                float cnt = n->prim == MP_P_AVGPOOL ? (float)(n->kernel * n->kernel) : (float)((h1 - h0) * (w1 - w0));
                for (uint64_t ih = h0; ih < h1; ih++)
                    for (uint64_t iw = w0; iw < w1; iw++)
                        dx[pl * HWi + ih * n->w_in + iw] += dy[o] / cnt;
            }
    facc(c->gin[0], dx, c->gin[0].n);
    return MP_OK;
}

/* ---- loss, custom -------------------------------------------------------------------------- */

/* lp = log_softmax(z) per row, in lp's dtype. */
static enum mp_status log_softmax_fwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    uint64_t M = n->rows, V = n->n;
    NEED(c->out);
    FGET(z, c->in[0]);
    for (uint64_t r = 0; r < M; r++) {
        float m = -INFINITY;
        for (uint64_t j = 0; j < V; j++)
            m = fmaxf(m, z[r * V + j]);
        double s = 0;
        for (uint64_t j = 0; j < V; j++)
            s += exp((double)z[r * V + j] - m);
        float lse = m + (float)log(s);
        for (uint64_t j = 0; j < V; j++)
            stf(c->out, r * V + j, z[r * V + j] - lse);
    }
    return MP_OK;
}

/* dz += g - exp(lp) * rowsum(g) */
static enum mp_status log_softmax_bwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    uint64_t M = n->rows, V = n->n;
    if (!c->gout.p || !c->gin[0].p)
        return MP_OK;
    FGET(lp, c->out);
    FGET(g, c->gout);
    FNEW(dz, M * V);
    for (uint64_t r = 0; r < M; r++) {
        double s = 0;
        for (uint64_t j = 0; j < V; j++)
            s += g[r * V + j];
        for (uint64_t j = 0; j < V; j++)
            dz[r * V + j] = g[r * V + j] - expf(lp[r * V + j]) * (float)s;
    }
    facc(c->gin[0], dz, M * V);
    return MP_OK;
}

/* loss = -mean over rows of lp[r, label[r]] */
static enum mp_status nll_fwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    uint64_t M = n->rows, V = n->n;
    NEED(c->out);
    NEED(c->in[1]);
    FGET(lp, c->in[0]);
    const int64_t *lab = c->in[1].p;
    double loss = 0;
    for (uint64_t r = 0; r < M; r++) {
        if (lab[r] < 0 || (uint64_t)lab[r] >= V)
            return mp_fail(c->x->d, MP_ERR_INTERNAL, "probe: %s: label %lld outside %llu classes", n->name,
                           (long long)lab[r], (unsigned long long)V);
        loss -= lp[r * V + (uint64_t)lab[r]];
    }
    stf(c->out, 0, (float)(loss / (double)M));
    c->x->ce_loss = loss / (double)M; /* the reported loss keeps double precision */
    return MP_OK;
}

/* dlp[r, label[r]] += -g / M (the rest of the dense gradient stays zero) */
static enum mp_status nll_bwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    uint64_t M = n->rows, V = n->n;
    if (!c->gout.p || !c->gin[0].p)
        return MP_OK;
    NEED(c->in[1]);
    const int64_t *lab = c->in[1].p;
    float g = ldf(c->gout, 0) / (float)M;
    for (uint64_t r = 0; r < M; r++)
        accf(c->gin[0], r * V + (uint64_t)lab[r], -g);
    return MP_OK;
}

static uint8_t param_byte(float v)
{
    float f = fmaxf(fminf(v * 64.0f, 1e6f), -1e6f);
    return (uint8_t)((int64_t)floorf(f) & 0xff);
}

/* An opaque block: bytes out = a cheap deterministic mix of its input bytes and
 * parameters; the saved extra repeats them; backward mixes gradient bytes back
 * (or adds small floats to a float input gradient). */
static enum mp_status custom_fwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    uint64_t R = n->rows ? n->rows : 1, ob = n->n;
    NEED(c->out);
    NEED(c->in[0]);
    const uint8_t *in = c->in[0].p;
    uint64_t ib = c->p->tensors[n->in[0]].bytes / R;
    uint8_t *out = c->out.p;
    for (uint64_t r = 0; r < R; r++)
        for (uint64_t j = 0; j < ob; j++) {
            uint8_t src = ib ? in[r * ib + j % ib] : 0, pb = c->w.p ? param_byte(ldf(c->w, j % c->w.n)) : 0;
            out[r * ob + j] = (uint8_t)(src * 167u + j * 13u + pb + 1u);
        }
    if (n->n_extra > 0) {
        NEED(xr(c, MP_XR_CUSTOM_SAVED));
        uint64_t eb = xr(c, MP_XR_CUSTOM_SAVED).n / R;
        uint8_t *e = xr(c, MP_XR_CUSTOM_SAVED).p;
        for (uint64_t r = 0; r < R; r++)
            for (uint64_t j = 0; j < eb; j++)
                e[r * eb + j] = (uint8_t)(ob ? out[r * ob + j % ob] ^ 0x5a : 0x5a);
    }
    return MP_OK;
}

static enum mp_status custom_bwd(struct ctx *c)
{
    const struct mp_node *n = c->n;
    uint64_t R = n->rows ? n->rows : 1, ob = n->n;
    if (!c->gout.p || ob == 0)
        return MP_OK;
    const uint8_t *go = c->gout.p, *e = NULL;
    uint64_t eb = 0;
    if (n->n_extra > 0) {
        NEED(xr(c, MP_XR_CUSTOM_SAVED));
        e = xr(c, MP_XR_CUSTOM_SAVED).p;
        eb = xr(c, MP_XR_CUSTOM_SAVED).n / R;
    }
    NEED(c->out); /* saved: the block keeps its output */
    if (c->gin[0].p) {
        struct hv gi = c->gin[0];
        uint64_t per = gi.n / R;
        for (uint64_t r = 0; r < R; r++)
            for (uint64_t i = 0; i < per; i++) {
                unsigned g = go[r * ob + i % ob] + (eb ? e[r * eb + i % eb] : 0u);
                if (gi.dt == MP_DT_U8)
                    ((uint8_t *)gi.p)[r * per + i] = (uint8_t)(((uint8_t *)gi.p)[r * per + i] + g * 3u);
                else
                    accf(gi, r * per + i, 1e-3f * ((float)(g & 0xff) - 127.5f) / 127.5f);
            }
    }
    if (c->gw.p)
        for (uint64_t j = 0; j < c->gw.n; j++) {
            double s = 0;
            for (uint64_t r = 0; r < R; r++)
                s += (double)go[r * ob + j % ob] - 127.5;
            accf(c->gw, j, (float)(1e-3 * s / (127.5 * (double)R)));
        }
    return MP_OK;
}

/* ---- dispatch ----------------------------------------------------------------------------- */

static enum mp_status node_run(struct mp_host_exec *x, int k, bool fwd)
{
    struct ctx c;
    ctx_open(&c, x, k);
    const struct mp_node *n = c.n;
    enum mp_status st = MP_OK;
    switch (n->prim) {
    case MP_P_EMBED: st = fwd ? embed_fwd(&c) : embed_bwd(&c); break;
    case MP_P_ADD_POS: st = fwd ? addpos_fwd(&c) : addpos_bwd(&c); break;
    case MP_P_CAST: st = fwd ? cast_fwd(&c) : pass_bwd(&c); break;
    case MP_P_SCALE: st = scale_run(&c, fwd); break;
    case MP_P_LINEAR: st = fwd ? linear_fwd(&c) : linear_bwd(&c); break;
    case MP_P_LAYERNORM: st = fwd ? layernorm_fwd(&c) : layernorm_bwd(&c); break;
    case MP_P_RMSNORM: st = fwd ? rmsnorm_fwd(&c) : rmsnorm_bwd(&c); break;
    case MP_P_ROPE: st = rope_run(&c, fwd); break;
    case MP_P_ATTN:
        st = n->eager ? (fwd ? eager_fwd(&c) : eager_bwd(&c)) : (fwd ? flash_fwd(&c) : flash_bwd(&c));
        break;
    case MP_P_ACT: st = fwd ? act_fwd(&c) : act_bwd(&c); break;
    case MP_P_MUL: st = fwd ? mul_fwd(&c) : mul_bwd(&c); break;
    case MP_P_DROPOUT: st = fwd ? dropout_fwd(&c) : dropout_bwd(&c); break;
    case MP_P_ADD: st = fwd ? add_fwd(&c) : pass_bwd(&c); break;
    case MP_P_CONV2D: st = fwd ? conv_fwd(&c) : conv_bwd(&c); break;
    case MP_P_BATCHNORM: st = fwd ? batchnorm_fwd(&c) : batchnorm_bwd(&c); break;
    case MP_P_MAXPOOL:
    case MP_P_AVGPOOL:
    case MP_P_ADAPTIVE_AVGPOOL: st = fwd ? pool_fwd(&c) : pool_bwd(&c); break;
    case MP_P_VIEW: break; /* out is in[0]: nothing moves either way */
    case MP_P_LOG_SOFTMAX: st = fwd ? log_softmax_fwd(&c) : log_softmax_bwd(&c); break;
    case MP_P_NLL_LOSS: st = fwd ? nll_fwd(&c) : nll_bwd(&c); break;
    case MP_P_CUSTOM: st = fwd ? custom_fwd(&c) : custom_bwd(&c); break;
    case MP_P_ROUTER:
    case MP_P_ROWS:
    case MP_P_GROUPED_MM: /* mp_probe_run refuses these programs first */
    case MP_P_COUNT: st = mp_fail(x->d, MP_ERR_INTERNAL, "probe: %s: unknown prim", n->name); break;
    }
    ctx_close(&c);
    return st;
}

/* The last block's output: the CE scalar (explicit loss), or an implicit loss
 * 0.5 * mean(y^2) on a float output (mean byte / 255 on opaque bytes). */
static enum mp_status loss_grad(struct mp_host_exec *x)
{
    const struct mp_program *p = x->p;
    int t = p->blocks[p->n_blocks - 1].output;
    struct hv y = {mp_pool_get(&x->pool, MP_ST_ACT, t), p->tensors[t].dtype, p->tensors[t].elems};
    struct hv g = {mp_pool_get(&x->pool, MP_ST_GRAD, t), y.dt, y.n};
    if (!y.p)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: the model output %s is not allocated at the loss",
                       p->tensors[t].name);
    int ln = mp_exec_loss_node(p);
    if (ln >= 0 && p->nodes[ln].out == t) {
        x->loss = x->ce_loss;
        if (g.p)
            stf(g, 0, 1.0f);
        return MP_OK;
    }
    double s = 0;
    if (y.dt == MP_DT_U8 || y.dt == MP_DT_I64) {
        for (uint64_t i = 0; i < y.n; i++) {
            s += ldf(y, i);
            if (g.p && y.dt == MP_DT_U8)
                ((uint8_t *)g.p)[i] = (uint8_t)(((const uint8_t *)y.p)[i] ^ 0x55);
        }
        x->loss = y.n ? s / (255.0 * (double)y.n) : 0.0;
        return MP_OK;
    }
    for (uint64_t i = 0; i < y.n; i++) {
        float v = ldf(y, i);
        s += 0.5 * (double)v * v;
        if (g.p)
            stf(g, i, v / (float)y.n);
    }
    x->loss = y.n ? s / (double)y.n : 0.0;
    return MP_OK;
}

/* ---- optimizers ------------------------------------------------------------------------------ */

/* 8-bit blockwise state (bitsandbytes layout: uint8 m, uint8 v, one fp32 absmax
 * per 256-element block per state).  Codes are companded rather than bnb's
 * dynamic tree map: m = sign * (c/127)^2 * absmax, v = (c/255)^4 * absmax.
 * kernels/optim.cu implements the same codes. */

static float f32_at(const uint8_t *b, uint64_t i)
{
    float f;
    memcpy(&f, b + 4 * i, 4);
    return f;
}
static void f32_put(uint8_t *b, uint64_t i, float f) { memcpy(b + 4 * i, &f, 4); }

static void adam_update(struct hv P, struct hv G, struct hv m, struct hv v, struct hv den, uint64_t n, uint64_t t,
                        float wd)
{
    float bc1 = 1.0f - powf(MP_ADAM_BETA1, (float)t), bc2 = 1.0f - powf(MP_ADAM_BETA2, (float)t);
    if (P.dt == MP_DT_F32 && G.dt == MP_DT_F32 && m.dt == MP_DT_F32 && v.dt == MP_DT_F32 &&
        (!den.p || den.dt == MP_DT_F32)) { /* the same arithmetic without a dtype switch per element */
        float *pp = P.p, *mp = m.p, *vp = v.p, *dp = den.p, sb2 = sqrtf(bc2), step = MP_ADAM_LR / bc1;
        const float *gp = G.p;
        for (uint64_t i = 0; i < n; i++) {
            float p = pp[i], g = gp[i];
            if (wd > 0.0f)
                p *= 1.0f - MP_ADAM_LR * wd;
            mp[i] = MP_ADAM_BETA1 * mp[i] + (1.0f - MP_ADAM_BETA1) * g;
            vp[i] = MP_ADAM_BETA2 * vp[i] + (1.0f - MP_ADAM_BETA2) * g * g;
            float d = sqrtf(vp[i]) / sb2 + MP_ADAM_EPS;
            if (dp)
                dp[i] = d;
            pp[i] = p - step * mp[i] / d;
        }
        return;
    }
    for (uint64_t i = 0; i < n; i++) {
        float p = ldf(P, i), g = ldf(G, i);
        if (wd > 0.0f)
            p *= 1.0f - MP_ADAM_LR * wd;
        float mi = MP_ADAM_BETA1 * ldf(m, i) + (1.0f - MP_ADAM_BETA1) * g;
        float vi = MP_ADAM_BETA2 * ldf(v, i) + (1.0f - MP_ADAM_BETA2) * g * g;
        stf(m, i, mi);
        stf(v, i, vi);
        float d = sqrtf(ldf(v, i)) / sqrtf(bc2) + MP_ADAM_EPS; /* _foreach_sqrt into the step temporary */
        if (den.p) {
            stf(den, i, d);
            d = ldf(den, i);
        }
        stf(P, i, p - MP_ADAM_LR / bc1 * ldf(m, i) / d);
    }
}

static void adam8_update(struct hv P, struct hv G, uint8_t *S, uint64_t n, uint64_t t)
{
    uint64_t nb = (n + MP_ADAM8_BLOCK - 1) / MP_ADAM8_BLOCK;
    uint8_t *qm = S, *qv = S + n, *am = S + 2 * n, *av = S + 2 * n + 4 * nb;
    float bc1 = 1.0f - powf(MP_ADAM_BETA1, (float)t), bc2 = 1.0f - powf(MP_ADAM_BETA2, (float)t);
    float mb[MP_ADAM8_BLOCK], vb[MP_ADAM8_BLOCK];
    for (uint64_t blk = 0; blk < nb; blk++) {
        uint64_t i0 = blk * MP_ADAM8_BLOCK, cnt = mp_min_u64(MP_ADAM8_BLOCK, n - i0);
        float ma = f32_at(am, blk), va = f32_at(av, blk), nm = 0.0f, nv = 0.0f;
        for (uint64_t j = 0; j < cnt; j++) {
            float g = ldf(G, i0 + j);
            mb[j] = MP_ADAM_BETA1 * mp_q8_m_dec(qm[i0 + j], ma) + (1.0f - MP_ADAM_BETA1) * g;
            vb[j] = MP_ADAM_BETA2 * mp_q8_v_dec(qv[i0 + j], va) + (1.0f - MP_ADAM_BETA2) * g * g;
            float p = ldf(P, i0 + j);
            stf(P, i0 + j, p - MP_ADAM_LR / bc1 * mb[j] / (sqrtf(vb[j]) / sqrtf(bc2) + MP_ADAM_EPS));
            nm = fmaxf(nm, fabsf(mb[j]));
            nv = fmaxf(nv, vb[j]);
        }
        for (uint64_t j = 0; j < cnt; j++) {
            qm[i0 + j] = mp_q8_m_enc(mb[j], nm);
            qv[i0 + j] = mp_q8_v_enc(vb[j], nv);
        }
        f32_put(am, blk, nm);
        f32_put(av, blk, nv);
    }
}

/* torch.optim.Adafactor (2.5+), single tensor; var_estimate/update in the step temporary. */
static void adafactor_update(const struct mp_program *p, const struct mp_param *q, struct hv P, struct hv G,
                             struct hv S, struct hv tmp, float *scratch, uint64_t t)
{
    uint64_t n = q->elems;
    float eps1 = p->param_dtype == MP_DT_F32 ? 1.1920929e-07f : 0.0078125f;
    float b2 = powf((float)t, MP_ADAFACTOR_BETA2_DECAY), rho = fminf(MP_ADAFACTOR_LR, 1.0f / sqrtf((float)t));
    double pn = 0;
    for (uint64_t i = 0; i < n; i++)
        pn += (double)ldf(P, i) * ldf(P, i);
    float alpha = fmaxf(MP_ADAFACTOR_EPS2, (float)sqrt(pn / (double)n)) * rho;
    struct hv est = tmp.p ? tmp : (struct hv){scratch, MP_DT_F32, n};
    if (q->matrix) {
        uint64_t R = q->rows, C = q->cols;
        double rmean = 0;
        for (uint64_t r = 0; r < R; r++) {
            double s = 0;
            for (uint64_t j = 0; j < C; j++)
                s += (double)ldf(G, r * C + j) * ldf(G, r * C + j);
            float rv = ldf(S, r);
            stf(S, r, rv + b2 * ((float)(s / (double)C) - rv)); /* lerp */
            rmean += ldf(S, r);
        }
        for (uint64_t j = 0; j < C; j++) {
            double s = 0;
            for (uint64_t r = 0; r < R; r++)
                s += (double)ldf(G, r * C + j) * ldf(G, r * C + j);
            float cv = ldf(S, R + j);
            stf(S, R + j, cv + b2 * ((float)(s / (double)R) - cv));
        }
        float denom = fmaxf((float)(rmean / (double)R), eps1);
        for (uint64_t r = 0; r < R; r++)
            for (uint64_t j = 0; j < C; j++)
                stf(est, r * C + j, ldf(S, r) * ldf(S, R + j) / denom);
    } else {
        for (uint64_t i = 0; i < n; i++) {
            float g = ldf(G, i), v = ldf(S, i);
            stf(S, i, v + b2 * (g * g - v));
            stf(est, i, ldf(S, i));
        }
    }
    double un = 0;
    for (uint64_t i = 0; i < n; i++) {
        float u = ldf(G, i) / sqrtf(fmaxf(ldf(est, i), eps1 * eps1));
        stf(est, i, u);
        un += (double)ldf(est, i) * ldf(est, i);
    }
    float den = fmaxf(1.0f, (float)(sqrt(un) / sqrt((double)n)));
    for (uint64_t i = 0; i < n; i++)
        stf(P, i, ldf(P, i) - alpha / den * ldf(est, i));
}

static enum mp_status opt_step(struct mp_host_exec *x)
{
    const struct mp_program *p = x->p;
    if (x->grads_out) {
        uint64_t off = 0;
        for (size_t q = 0; q < p->n_params; q++) {
            struct hv G = {mp_pool_get(&x->pool, MP_ST_PGRAD, (int)q), p->params[q].dtype, p->params[q].elems};
            for (uint64_t i = 0; i < G.n; i++)
                x->grads_out[off + i] = G.p ? ldf(G, i) : 0.0f;
            off += G.n;
        }
    }
    if (!x->update)
        return MP_OK;
    uint64_t t = ++x->opt_steps, largest = 0;
    for (size_t q = 0; q < p->n_params; q++)
        largest = mp_max_u64(largest, p->params[q].elems);
    void *otmp = mp_pool_get(&x->pool, MP_ST_OPT_TMP, 0);
    float *scratch = NULL;
    if (x->t.optimizer == MP_OPT_ADAFACTOR && !otmp && !(scratch = calloc(largest ? largest : 1, sizeof *scratch)))
        return mp_fail(x->d, MP_ERR_NOMEM, "probe: out of host memory in the optimizer step");
    for (size_t q = 0; q < p->n_params; q++) {
        const struct mp_param *pq = &p->params[q];
        uint64_t n = pq->elems;
        enum mp_dtype pdt = pq->dtype; /* fp32 LoRA adapters on a bf16 base */
        struct hv P = {mp_pool_get(&x->pool, MP_ST_PARAM, (int)q), pdt, n};
        struct hv G = {mp_pool_get(&x->pool, MP_ST_PGRAD, (int)q), pdt, n};
        void *S = mp_pool_get(&x->pool, MP_ST_OPT_STATE, (int)q);
        if (!P.p || !G.p)
            continue; /* no gradient this step (or empty) */
        switch (x->t.optimizer) {
        case MP_OPT_SGD:
            for (uint64_t i = 0; i < n; i++)
                stf(P, i, ldf(P, i) - MP_SGD_LR * ldf(G, i));
            break;
        case MP_OPT_SGD_MOMENTUM: {
            struct hv B = {S, pdt, n};
            for (uint64_t i = 0; i < n; i++) {
                stf(B, i, t == 1 ? ldf(G, i) : MP_SGD_MOMENTUM * ldf(B, i) + ldf(G, i));
                stf(P, i, ldf(P, i) - MP_SGD_LR * ldf(B, i));
            }
            break;
        }
        case MP_OPT_ADAM:
        case MP_OPT_ADAMW: {
            /* the _foreach_sqrt output: one temporary per parameter */
            struct hv m = {S, pdt, n}, v = {(char *)S + n * mp_dtype_size(pdt), pdt, n};
            struct hv den = {mp_pool_get(&x->pool, MP_ST_OPT_TMP, (int)q), pdt, n};
            adam_update(P, G, m, v, den, n, t, x->t.optimizer == MP_OPT_ADAMW ? MP_ADAMW_WD : 0.0f);
            break;
        }
        case MP_OPT_ADAFACTOR:
            adafactor_update(p, pq, P, G, (struct hv){S, pdt, 0}, (struct hv){otmp, pdt, n}, scratch, t);
            break;
        case MP_OPT_ADAM8BIT:
            if (n < MP_ADAM8_MIN_ELEMS) {
                struct hv m = {S, MP_DT_F32, n}, v = {(char *)S + n * 4, MP_DT_F32, n}, none = {NULL, MP_DT_F32, 0};
                adam_update(P, G, m, v, none, n, t, 0.0f);
            } else {
                adam8_update(P, G, S, n, t);
            }
            break;
        }
    }
    free(scratch);
    return MP_OK;
}

/* ---- the visitor ----------------------------------------------------------------------------- */

static enum mp_status zero_or_init(struct mp_host_exec *x, const struct mp_event *ev, void *ptr)
{
    const struct mp_program *p = x->p;
    if (!ptr)
        return MP_OK;
    switch (ev->store) {
    case MP_ST_PARAM: {
        const struct mp_param *q = &p->params[ev->id];
        if (q->dtype == MP_DT_U8 && mp_program_base_quant(p)) { /* quantize_4bit of the values */
            float *w = malloc(q->elems * sizeof *w);
            if (!w)
                return mp_fail(x->d, MP_ERR_NOMEM, "probe: out of host memory quantizing %s", q->name);
            for (uint64_t i = 0; i < q->elems; i++)
                w[i] = mp_exec_param_value(p, (size_t)ev->id, i, x->seed);
            enum mp_status st = mp_quant_pack(mp_program_base_quant(p), q->rows, q->cols, w, ptr);
            free(w);
            if (st != MP_OK)
                return mp_fail(x->d, st, "probe: %s: the host backend executes bitsandbytes NF4 weights only",
                               q->name);
            break;
        }
        struct hv v = {ptr, q->dtype, q->elems};
        for (uint64_t i = 0; i < v.n; i++)
            stf(v, i, mp_exec_param_value(p, (size_t)ev->id, i, x->seed));
        break;
    }
    case MP_ST_INPUT: mp_exec_input_fill(p, ev->id, x->seed, ptr); break;
    case MP_ST_GRAD:
    case MP_ST_PGRAD:
    case MP_ST_OPT_STATE: memset(ptr, 0, (size_t)ev->bytes); break; /* zeros: gradients accumulate */
    case MP_ST_ACT:
    case MP_ST_TMP:
    case MP_ST_OPT_TMP: memset(ptr, 0xff, (size_t)ev->bytes); break; /* NaN: reading it before writing shows */
    case MP_ST_WORKSPACE:
    case MP_ST_COMM: break;
    }
    return MP_OK;
}

static enum mp_status host_event(void *ctx, const struct mp_event *ev)
{
    struct mp_host_exec *x = ctx;
    switch (ev->kind) {
    case MP_EV_ALLOC: {
        void *ptr;
        bool fresh;
        enum mp_status st = mp_pool_alloc(&x->pool, ev, &ptr, &fresh, x->d);
        if (st == MP_OK && fresh)
            st = zero_or_init(x, ev, ptr);
        return st;
    }
    case MP_EV_FREE: return mp_pool_free(&x->pool, ev, x->d);
    case MP_EV_FWD: return node_run(x, ev->id, true);
    case MP_EV_BWD: return node_run(x, ev->id, false);
    case MP_EV_LOSS_GRAD: return loss_grad(x);
    case MP_EV_OPT_STEP: return opt_step(x);
    case MP_EV_OP_BEGIN:
    case MP_EV_OP_END: return MP_OK;
    }
    return MP_OK;
}

static enum mp_status host_alloc(void *ctx, uint64_t bytes, void **out, struct mp_diag *d)
{
    (void)ctx;
    (void)d;
    if (bytes > SIZE_MAX)
        return MP_ERR_OOM;
    *out = malloc((size_t)bytes);
    return *out ? MP_OK : MP_ERR_OOM; /* host out of memory: also a "does not fit" */
}

static void host_free(void *ctx, void *ptr)
{
    (void)ctx;
    free(ptr);
}

/* ---- the executor ----------------------------------------------------------------------------- */

enum mp_status mp_host_exec_new(struct mp_host_exec **out, const struct mp_program *p, const struct mp_train_opts *t,
                                uint64_t capacity_bytes, uint64_t seed, struct mp_diag *d)
{
    *out = NULL;
    if (!p || p->n_blocks == 0)
        return mp_fail(d, MP_ERR_USAGE, "probe: the model has no blocks");
    struct mp_host_exec *x = calloc(1, sizeof *x);
    if (!x)
        return mp_fail(d, MP_ERR_NOMEM, "probe: out of memory");
    x->p = p;
    x->t = *t;
    x->seed = seed;
    struct mp_pool_ops ops = {host_alloc, host_free, NULL};
    enum mp_status st = mp_pool_init(&x->pool, p, &ops, capacity_bytes, d);
    if (st == MP_OK)
        st = mp_exec_layout(p, &x->lay, d);
    if (st != MP_OK) {
        mp_host_exec_free(x);
        return st;
    }
    *out = x;
    return MP_OK;
}

void mp_host_exec_free(struct mp_host_exec *x)
{
    if (!x)
        return;
    mp_pool_release(&x->pool);
    free(x->lay);
    free(x);
}

enum mp_status mp_host_exec_step(struct mp_host_exec *x, const struct mp_schedule *s, bool update, float *grads,
                                 double *loss, struct mp_diag *d)
{
    x->update = update;
    x->grads_out = grads;
    x->loss = NAN;
    x->d = d;
    mp_pool_step_begin(&x->pool);
    enum mp_status st = mp_replay(x->p, s, &x->t, host_event, x, d);
    if (st == MP_OK)
        st = mp_pool_step_end(&x->pool, d);
    if (st != MP_OK) {
        mp_pool_free_all(&x->pool); /* OOM or error: nothing stays allocated */
        x->opt_steps = 0;
        return st;
    }
    if (update)
        x->rng_step++;
    if (loss)
        *loss = x->loss;
    return MP_OK;
}

const struct mp_pool *mp_host_exec_pool(const struct mp_host_exec *x) { return &x->pool; }

float mp_host_exec_param_get(const struct mp_host_exec *x, size_t q, uint64_t i)
{
    struct hv v = {mp_pool_get(&x->pool, MP_ST_PARAM, (int)q), x->p->params[q].dtype, 0};
    return v.p ? ldf(v, i) : NAN;
}

void mp_host_exec_param_set(struct mp_host_exec *x, size_t q, uint64_t i, float f)
{
    struct hv v = {mp_pool_get(&x->pool, MP_ST_PARAM, (int)q), x->p->params[q].dtype, 0};
    if (v.p)
        stf(v, i, f);
}

/* ---- the backend ------------------------------------------------------------------------------ */

static enum mp_status host_open(void **ctx, const struct mp_probe_opts *o, struct mp_diag *d)
{
    (void)o;
    (void)d;
    *ctx = NULL;
#if defined(__GLIBC__) && defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD)
    /* Storages up to 32 MiB come from the heap and freed ones stay there, so every step
     * does not map, fault in and zero its activations again (a GPU's caching allocator). */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
    return MP_OK;
}

static enum mp_status host_device_info(void *ctx, struct mp_device_info *out)
{
    (void)ctx;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "host (CPU)");
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0)
        out->total_bytes = (uint64_t)pages * (uint64_t)psz;
#endif
#if defined(_SC_AVPHYS_PAGES) && defined(_SC_PAGESIZE)
    long avail = sysconf(_SC_AVPHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
    if (avail > 0 && pg > 0)
        out->free_bytes = (uint64_t)avail * (uint64_t)pg;
#endif
    return MP_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static enum mp_status host_run(void *ctx, const struct mp_probe_opts *o, const struct mp_program *p,
                               const struct mp_schedule *s, const struct mp_train_opts *t, struct mp_probe_result *r,
                               struct mp_diag *d)
{
    (void)ctx;
    struct mp_host_exec *x;
    enum mp_status st = mp_host_exec_new(&x, p, t, o->capacity_bytes, o->seed, d);
    if (st != MP_OK)
        return st;
    x->pool.trace_on = o->trace;
    double ms[64];
    unsigned steps = o->steps;
    for (unsigned k = 0; k <= steps && st == MP_OK; k++) {
        mp_progress("probe: %s step %u of %u on the host backend", k ? "measured" : "warm-up", k ? k : 1, k ? steps : 1);
        double loss, t0 = mp_now_ms();
        st = mp_host_exec_step(x, s, true, NULL, &loss, d);
        double t1 = mp_now_ms();
        if (o->progress && st == MP_OK) {
            fprintf(stderr, "memplan: host step %u/%u%s: %.0f ms, loss %.4f\n", k + 1, steps + 1,
                    k == 0 ? " (warm-up)" : "", t1 - t0, loss);
            fflush(stderr);
        }
        if (st == MP_OK && k > 0) { /* step 0 is the warm-up */
            r->losses[k - 1] = (float)loss;
            ms[k - 1] = t1 - t0;
        }
    }
    r->measured_peak_bytes = x->pool.peak;
    mp_pool_take_trace(&x->pool, r);
    if (st == MP_ERR_OOM) {
        r->fits = false;
        r->oom_request_bytes = x->pool.oom_bytes;
        r->oom_capacity = x->pool.oom_capacity;
        snprintf(r->oom_event, sizeof r->oom_event, "%s", x->pool.oom_event);
    } else if (st == MP_OK) {
        r->fits = true;
        r->steps = steps;
        qsort(ms, steps, sizeof ms[0], cmp_double);
        r->step_ms = steps % 2 ? ms[steps / 2] : 0.5 * (ms[steps / 2 - 1] + ms[steps / 2]);
        r->samples_per_s = r->step_ms > 0 ? (double)p->opts.batch * 1000.0 / r->step_ms : 0.0;
    }
    mp_host_exec_free(x);
    return st;
}

const struct mp_probe_backend mp_probe_backend_host = {
    .name = "host",
    .available = NULL,
    .open = host_open,
    .device_info = host_device_info,
    .run = host_run,
    .close = NULL,
};
