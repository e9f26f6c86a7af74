/* probe_cuda_norm.c — the cuda backend: LayerNorm, RMSNorm and batch norm (probe_cuda.h). */
#include "probe_cuda.h"

/* ---- norms ------------------------------------------------------------------------------------- */

enum mp_status layernorm_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    NEED(c->in[0]);
    if (n->param[0] >= 0) /* none: OLMo's LayerNorm (the kernels take a NULL weight as 1) */
        NEED(c->w);
    struct mp_view st0 = n->prim == MP_P_LAYERNORM ? xr(c, MP_XR_MEAN) : xr(c, MP_XR_BN_MEAN);
    struct mp_view st1 = n->prim == MP_P_LAYERNORM ? xr(c, MP_XR_RSTD) : xr(c, MP_XR_BN_INVSTD);
    NEED(st0);
    NEED(st1);
    if (fwd) {
        NEED(c->out);
        KK(x->d, mp_k_layernorm_fwd(c->out.p, c->in[0].p, c->in[0].dt, c->w.p, c->b.p, c->w.dt, st0.p,
                                    st1.p, n->rows, n->n, MP_LN_EPS, S(x)));
    } else if (c->gout.p) {
        KK(x->d, mp_k_layernorm_bwd(c->gin[0].p, c->gw.p, c->gb.p, c->w.dt, c->gout.p, c->in[0].p, c->in[0].dt,
                                    st0.p, st1.p, c->w.p, n->rows, n->n, S(x)));
    }
    return MP_OK;
}

enum mp_status rmsnorm_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    bool e = has_x(c, MP_XR_X_FP32);
    struct mp_view xs = e ? xr(c, MP_XR_X_FP32) : c->in[0], rs = xr(c, MP_XR_RSQRT), nm = xr(c, MP_XR_NORMED);
    NEED(c->w);
    if (fwd) {
        NEED(rs);
        NEED(nm);
        NEED(c->in[0]);
        NEED(c->out);
        if (e)
            NEED(xs);
        KK(x->d, mp_k_rmsnorm_fwd(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, e ? xs.p : NULL, rs.p, nm.p, c->w.p,
                                  c->w.dt, n->rows, n->n, MP_RMS_EPS, S(x)));
    } else if (c->gout.p) {
        /* as the host backend: a frozen weight keeps no normed tensor, an input that needs no
         * gradient neither x nor rsqrt */
        if (c->gw.p)
            NEED(nm);
        if (c->gin[0].p) {
            NEED(xs);
            NEED(rs);
        }
        KK(x->d, mp_k_rmsnorm_bwd(c->gin[0].p, c->gin[0].dt, c->gw.p, c->gw.dt, c->gout.p, c->gout.dt, xs.p, xs.dt,
                                  rs.p, nm.p, c->w.p, n->rows, n->n, S(x)));
    }
    return MP_OK;
}

enum mp_status batchnorm_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    uint64_t C = n->c_in, HW = n->h_in * n->w_in, B = (C && HW) ? c->p->tensors[n->in[0]].elems / (C * HW) : 0;
    NEED(c->in[0]);
    NEED(c->w);
    NEED(c->b);
    struct mp_view st0 = n->prim == MP_P_LAYERNORM ? xr(c, MP_XR_MEAN) : xr(c, MP_XR_BN_MEAN);
    struct mp_view st1 = n->prim == MP_P_LAYERNORM ? xr(c, MP_XR_RSTD) : xr(c, MP_XR_BN_INVSTD);
    NEED(st0);
    NEED(st1);
    if (fwd) {
        NEED(c->out);
        KK(x->d, mp_k_batchnorm_fwd(c->out.p, c->in[0].p, c->in[0].dt, c->w.p, c->b.p, c->w.dt, st0.p,
                                    st1.p, B, C, HW, MP_BN_EPS, S(x)));
    } else if (c->gout.p) {
        KK(x->d, mp_k_batchnorm_bwd(c->gin[0].p, c->gw.p, c->gb.p, c->w.dt, c->gout.p, c->in[0].p, c->in[0].dt,
                                    st0.p, st1.p, c->w.p, B, C, HW, S(x)));
    }
    return MP_OK;
}
