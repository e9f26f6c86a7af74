/* probe_host_norm.c — the host backend's LayerNorm, RMSNorm (HF's, with its fp32 extras),
 * BatchNorm2d (training statistics).
 *
 * See probe_host.h for element access and scratch; kernels/norm.cu is the cuda side.
 */
#include "probe_host.h"

#include <math.h>

enum mp_status mp_host_layernorm_fwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    uint64_t M = n->rows, N = n->n;
    NEED(c->out);
    NEED(xr(c, MP_XR_MEAN));
    NEED(xr(c, MP_XR_RSTD));
    FGET(x, c->in[0]);
    float *g = NULL, *be = NULL; /* no weight (OLMo's LayerNorm): 1 */
    if (n->param[0] >= 0 && !(g = fget(c, c->w)))
        return c->w.p ? nomem(c) : missing(c, "c->w");
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
            y[r * N + j] = (xr[j] - (float)mu) * rs * (g ? g[j] : 1.0f) + (be ? be[j] : 0.0f);
    }
    fstore(c->out, y, M * N);
    return MP_OK;
}

enum mp_status mp_host_layernorm_bwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    uint64_t M = n->rows, N = n->n;
    if (!c->gout.p)
        return MP_OK;
    FGET(dy, c->gout);
    FGET(x, c->in[0]);
    float *g = NULL;
    if (n->param[0] >= 0 && !(g = fget(c, c->w)))
        return c->w.p ? nomem(c) : missing(c, "c->w");
    NEED(xr(c, MP_XR_MEAN));
    NEED(xr(c, MP_XR_RSTD));
    const float *mean = xr(c, MP_XR_MEAN).p, *rstd = xr(c, MP_XR_RSTD).p;
    FNEW(dx, M * N);
    FNEW(dg, N);
    FNEW(db, N);
    for (uint64_t r = 0; r < M; r++) {
        double a = 0, bsum = 0;
        for (uint64_t j = 0; j < N; j++) {
            float xh = (x[r * N + j] - mean[r]) * rstd[r], dxh = dy[r * N + j] * (g ? g[j] : 1.0f);
            a += dxh;
            bsum += (double)dxh * xh;
            dg[j] += dy[r * N + j] * xh;
            db[j] += dy[r * N + j];
        }
        a /= (double)N;
        bsum /= (double)N;
        for (uint64_t j = 0; j < N; j++) {
            float xh = (x[r * N + j] - mean[r]) * rstd[r], dxh = dy[r * N + j] * (g ? g[j] : 1.0f);
            dx[r * N + j] = rstd[r] * (dxh - (float)a - xh * (float)bsum);
        }
    }
    facc(c->gin[0], dx, M * N);
    facc(c->gw, dg, N);
    facc(c->gb, db, N);
    return MP_OK;
}

/* HF RMSNorm extras: x_fp32 (when the input is not fp32; else x itself), rsqrt, normed. */
static void rms_extras(struct mp_node_view *c, struct mp_view *xf, struct mp_view *rs, struct mp_view *nm)
{
    *xf = mp_node_extra(c->n, MP_XR_X_FP32, 0) >= 0 ? xr(c, MP_XR_X_FP32) : c->in[0];
    *rs = xr(c, MP_XR_RSQRT);
    *nm = xr(c, MP_XR_NORMED);
}

enum mp_status mp_host_rmsnorm_fwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    uint64_t M = n->rows, N = n->n;
    struct mp_view xf, rsv, nmv;
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

enum mp_status mp_host_rmsnorm_bwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    uint64_t M = n->rows, N = n->n;
    if (!c->gout.p)
        return MP_OK;
    struct mp_view xf, rsv, nmv;
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

enum mp_status mp_host_batchnorm_fwd(struct mp_node_view *c)
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

enum mp_status mp_host_batchnorm_bwd(struct mp_node_view *c)
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
