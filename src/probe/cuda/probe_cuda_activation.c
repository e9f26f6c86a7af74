/* probe_cuda_activation.c — the cuda backend: activations (probe_cuda.h). */
#include "probe_cuda.h"

/* ---- activations, mul, dropout ------------------------------------------------------------------- */

enum mp_status act_run(struct mp_node_view *c, bool fwd)
{
    struct mp_exec *x = c->x;
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        void *parts[MP_NODE_EXTRA_MAX];
        int dts[MP_NODE_EXTRA_MAX], np = 0;
        if (has_x(c, MP_XR_X_FP32)) { /* the fp32 copy of the input */
            struct mp_view xf = xr(c, MP_XR_X_FP32);
            NEED(xf);
            KK(x->d, mp_k_convert(xf.p, xf.dt, c->in[0].p, c->in[0].dt, xf.n, 0, S(x)));
        }
        for (; mp_node_extra(c->n, MP_XR_ACT_PART, np) >= 0; np++) {
            struct mp_view part = mp_view_tensor(x, MP_ST_ACT, mp_node_extra(c->n, MP_XR_ACT_PART, np));
            NEED(part);
            parts[np] = part.p;
            dts[np] = part.dt;
        }
        KK(x->d, mp_k_act_fwd(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, c->out.n, (int)c->n->act, parts, dts,
                              np, S(x)));
    } else if (c->gout.p && c->gin[0].p) {
        struct mp_view sv = mp_view_tensor(x, MP_ST_ACT, c->n->saved[0]);
        NEED(sv);
        KK(x->d, mp_k_act_bwd(c->gin[0].p, c->gin[0].dt, c->gout.p, c->gout.dt, sv.p, sv.dt, c->gout.n,
                              (int)c->n->act, c->gin[0].p == c->gout.p, S(x)));
    }
    return MP_OK;
}
