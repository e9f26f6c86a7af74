/* probe_cuda_pool.c — the cuda backend: pooling (probe_cuda.h). */
#include "probe_cuda.h"

enum mp_status pool_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    uint64_t hwo = n->h_out * n->w_out;
    struct mp_k_pool P = {.planes = hwo ? c->p->tensors[n->out].elems / hwo : 0, .hi = n->h_in, .wi = n->w_in,
                          .ho = n->h_out, .wo = n->w_out, .k = n->kernel, .st = n->stride ? n->stride : 1,
                          .pad = n->padding,
                          .kind = n->prim == MP_P_MAXPOOL ? MP_K_MAXPOOL
                                  : n->prim == MP_P_AVGPOOL ? MP_K_AVGPOOL
                                                            : MP_K_ADAPTIVE};
    if (P.kind == MP_K_MAXPOOL)
        NEED(xr(c, MP_XR_POOL_INDICES));
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        KK(x->d, mp_k_pool_fwd(c->out.p, c->in[0].p, c->out.dt, xr(c, MP_XR_POOL_INDICES).p, &P, S(x)));
    } else if (c->gout.p && c->gin[0].p) {
        KK(x->d, mp_k_pool_bwd(c->gin[0].p, c->gout.p, c->gout.dt, xr(c, MP_XR_POOL_INDICES).p, &P, S(x)));
    }
    return MP_OK;
}
