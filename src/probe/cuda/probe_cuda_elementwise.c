/* probe_cuda_elementwise.c — the cuda backend: cast, add, scale, mul and dropout (probe_cuda.h). */
#include "probe_cuda.h"

/* Cast forward; cast and residual-add backward (the gradient passes through). */
enum mp_status pass_run(struct mp_node_view *c, bool fwd)
{
    struct mp_exec *x = c->x;
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        if (c->n->prim == MP_P_ADD) {
            NEED(c->in[1]);
            KK(x->d, mp_k_add(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, c->in[1].p, c->in[1].dt, c->out.n, S(x)));
        } else {
            KK(x->d, mp_k_convert(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, c->out.n, 0, S(x)));
        }
        return MP_OK;
    }
    if (!c->gout.p)
        return MP_OK;
    for (int j = 0; j < 3; j++)
        if (c->n->in[j] >= 0 && c->gin[j].p && c->gin[j].p != c->gout.p)
            KK(x->d, mp_k_convert(c->gin[j].p, c->gin[j].dt, c->gout.p, c->gout.dt, c->gout.n, 1, S(x)));
    return MP_OK;
}

/* LoRA's result * scaling (a Python float): y = p x; dx += p dy. */
enum mp_status scale_run(struct mp_node_view *c, bool fwd)
{
    struct mp_exec *x = c->x;
    float a = (float)c->n->p;
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        KK(x->d, mp_k_scale(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, c->out.n, a, 0, S(x)));
        return MP_OK;
    }
    if (c->gout.p && c->gin[0].p)
        KK(x->d, mp_k_scale(c->gin[0].p, c->gin[0].dt, c->gout.p, c->gout.dt, c->gout.n, a, 1, S(x)));
    return MP_OK;
}

enum mp_status mul_run(struct mp_node_view *c, bool fwd)
{
    struct mp_exec *x = c->x;
    NEED(c->in[0]);
    NEED(c->in[1]);
    if (fwd) {
        NEED(c->out);
        KK(x->d, mp_k_mul_fwd(c->out.p, c->in[0].p, c->in[1].p, c->out.dt, c->out.n, S(x)));
    } else if (c->gout.p) {
        KK(x->d, mp_k_mul_bwd(c->gin[0].p, c->gin[1].p, c->gout.p, c->in[0].p, c->in[1].p, c->gout.dt, c->gout.n,
                              S(x)));
    }
    return MP_OK;
}

enum mp_status dropout_run(struct mp_node_view *c, bool fwd)
{
    struct mp_exec *x = c->x;
    NEED(xr(c, MP_XR_DROP_MASK));
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        KK(x->d, mp_k_dropout_fwd(c->out.p, c->in[0].p, c->out.dt, xr(c, MP_XR_DROP_MASK).p, c->out.n, (float)c->n->p,
                                  mp_dropout_key(x->seed, c->k, x->rng_step), S(x)));
    } else if (c->gout.p && c->gin[0].p) {
        KK(x->d, mp_k_dropout_bwd(c->gin[0].p, c->gout.p, c->gout.dt, xr(c, MP_XR_DROP_MASK).p, c->gout.n, (float)c->n->p, S(x)));
    }
    return MP_OK;
}
