/* probe_host_activation.c — the host backend's activations (mp_math.h), HF's GELU composites
 * keeping their intermediates.
 *
 * See probe_host.h for element access and scratch; kernels/activation.cu is the cuda side.
 */
#include "probe_host.h"

/* HF's Python GELUs (NewGELUActivation, FastGELUActivation) keep their
 * intermediates as extras (ir/lower_elementwise.c): new: tanh(u), 0.5x, 1 + tanh(u);
 * fast: 0.044715x, 0.7978845608x, 1 + 0.044715x^2, tanh, 0.5x, 1 + tanh. */

enum mp_status mp_host_act_fwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    NEED(c->out);
    FGET(x, c->in[0]);
    FNEW(y, c->out.n);
    for (uint64_t i = 0; i < c->out.n; i++)
        y[i] = mp_act_f(n->act, x[i]);
    fstore(c->out, y, c->out.n);
    /* HF's GELU composites keep their intermediates (each in its own dtype); under autocast a
     * gelu_new first keeps an fp32 copy of its input (ir/lower_elementwise.c lower_act) */
    struct mp_view xf = xr(c, MP_XR_X_FP32);
    if (xf.p)
        fstore(xf, x, xf.n);
    for (int j = 0; mp_node_extra(n, MP_XR_ACT_PART, j) >= 0; j++) {
        struct mp_view part = mp_view_tensor(c->x, MP_ST_ACT, mp_node_extra(n, MP_XR_ACT_PART, j));
        NEED(part);
        for (uint64_t i = 0; i < part.n; i++)
            stf(part, i, mp_gelu_part(n->act, j, x[i]));
    }
    return MP_OK;
}

enum mp_status mp_host_act_bwd(struct mp_node_view *c)
{
    if (!c->gout.p || !c->gin[0].p)
        return MP_OK;
    struct mp_view sv = mp_view_tensor(c->x, MP_ST_ACT, c->n->saved[0]);
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
