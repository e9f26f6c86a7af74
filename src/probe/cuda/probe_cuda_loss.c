/* probe_cuda_loss.c — the cuda backend: log-softmax, NLL and the loss (probe_cuda.h). */
#include "probe_cuda.h"

/* ---- loss, custom -------------------------------------------------------------------------------- */

enum mp_status log_softmax_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    NEED(c->out);
    if (fwd) {
        NEED(c->in[0]);
        KK(x->d, mp_k_log_softmax_fwd(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, n->rows, n->n, S(x)));
    } else if (c->gout.p && c->gin[0].p) {
        KK(x->d, mp_k_log_softmax_bwd(c->gin[0].p, c->gin[0].dt, c->out.p, c->out.dt, c->gout.p, c->gout.dt, n->rows,
                                      n->n, S(x)));
    }
    return MP_OK;
}

enum mp_status nll_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    NEED(c->in[1]);
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        KK(x->d, mp_k_nll_fwd(c->out.p, c->in[0].p, c->in[0].dt, c->in[1].p, n->rows, n->n, S(x)));
    } else if (c->gout.p && c->gin[0].p) {
        KK(x->d, mp_k_nll_bwd(c->gin[0].p, c->gin[0].dt, c->in[1].p, c->gout.p, n->rows, n->n, S(x)));
    }
    return MP_OK;
}

/* ---- loss, optimizer ----------------------------------------------------------------------------- */

/* The loss (explicit CE scalar, or the implicit loss of probe_host_loss.c) into the
 * pinned host float, read after the step's synchronisation (cuda_step_end). */
enum mp_status cuda_loss_grad(struct mp_exec *x, struct mp_view y, struct mp_view g, bool ce)
{
    const void *src = y.p;
    if (ce) {
        if (g.p)
            KK(x->d, mp_k_fill(g.p, g.dt, 1.0f, 1, S(x)));
    } else {
        KK(x->d, mp_k_implicit_loss(CX(x)->scalars, g.p, y.p, y.dt, y.n, S(x)));
        src = CX(x)->scalars;
    }
    CK(x->d, cudaMemcpyAsync(CX(x)->host_loss, src, sizeof(float), cudaMemcpyDeviceToHost, S(x)));
    return MP_OK;
}
