/* probe_host_elementwise.c — the host backend's elementwise prims: cast, residual add, mul,
 * LoRA's scale, dropout.
 *
 * See probe_host.h for element access and scratch; kernels/elementwise.cu is the cuda side.
 */
#include "probe_host.h"

enum mp_status mp_host_cast_fwd(struct mp_node_view *c)
{
    NEED(c->out);
    FGET(x, c->in[0]);
    fstore(c->out, x, c->out.n);
    return MP_OK;
}

/* Gradient passes straight through (cast, residual add). */
enum mp_status mp_host_pass_bwd(struct mp_node_view *c)
{
    if (!c->gout.p)
        return MP_OK;
    FGET(dy, c->gout);
    for (int j = 0; j < 3; j++)
        if (c->n->in[j] >= 0 && c->gin[j].p && c->gin[j].p != c->gout.p)
            facc(c->gin[j], dy, c->gout.n);
    return MP_OK;
}

enum mp_status mp_host_add_fwd(struct mp_node_view *c)
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

enum mp_status mp_host_mul_fwd(struct mp_node_view *c)
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

enum mp_status mp_host_mul_bwd(struct mp_node_view *c)
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
static enum mp_status scale_run(struct mp_node_view *c, bool fwd)
{
    float a = (float)c->n->p;
    struct mp_view src = fwd ? c->in[0] : c->gout, dst = fwd ? c->out : c->gin[0];
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

enum mp_status mp_host_dropout_fwd(struct mp_node_view *c)
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

enum mp_status mp_host_dropout_bwd(struct mp_node_view *c)
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

enum mp_status mp_host_scale_fwd(struct mp_node_view *c) { return scale_run(c, true); }
enum mp_status mp_host_scale_bwd(struct mp_node_view *c) { return scale_run(c, false); }
