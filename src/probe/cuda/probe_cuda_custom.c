/* probe_cuda_custom.c — the cuda backend: custom layers (probe_cuda.h). */
#include "probe_cuda.h"

enum mp_status custom_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    uint64_t R = n->rows ? n->rows : 1, ob = n->n, eb = has_x(c, MP_XR_CUSTOM_SAVED) ? xr(c, MP_XR_CUSTOM_SAVED).n / R : 0;
    uint64_t np = n->param[0] >= 0 ? c->w.n : 0;
    if (has_x(c, MP_XR_CUSTOM_SAVED))
        NEED(xr(c, MP_XR_CUSTOM_SAVED));
    NEED(c->out);
    if (fwd) {
        NEED(c->in[0]);
        uint64_t ib = c->p->tensors[n->in[0]].bytes / R;
        KK(x->d, mp_k_custom_fwd(c->out.p, eb ? xr(c, MP_XR_CUSTOM_SAVED).p : NULL, c->in[0].p, R, ib, ob, eb, c->w.p, c->w.dt, np,
                                 S(x)));
    } else if (c->gout.p) {
        uint64_t per = c->gin[0].p ? c->gin[0].n / R : 0;
        KK(x->d, mp_k_custom_bwd(c->gin[0].p, c->gin[0].dt, per, c->gout.p, eb ? xr(c, MP_XR_CUSTOM_SAVED).p : NULL, R, ob, eb,
                                 c->gw.p, c->gw.dt, np, S(x)));
    }
    return MP_OK;
}
