/* probe_host_loss.c — the host backend's log-softmax, NLL and the step's loss.
 *
 * See probe_host.h for element access and scratch; kernels/loss.cu is the cuda side.
 */
#include "probe_host.h"

#include <math.h>

/* lp = log_softmax(z) per row, in lp's dtype. */
enum mp_status mp_host_log_softmax_fwd(struct mp_node_view *c)
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
enum mp_status mp_host_log_softmax_bwd(struct mp_node_view *c)
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
enum mp_status mp_host_nll_fwd(struct mp_node_view *c)
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
enum mp_status mp_host_nll_bwd(struct mp_node_view *c)
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

/* The step's loss: the CE scalar (explicit loss; its double from the NLL forward), or an
 * implicit loss 0.5 * mean(y^2) on a float output (mean byte / 255 on opaque bytes). */
enum mp_status mp_host_loss_grad(struct mp_exec *x, struct mp_view y, struct mp_view g, bool ce)
{
    if (ce) {
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
