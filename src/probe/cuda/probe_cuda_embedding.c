/* probe_cuda_embedding.c — the cuda backend: embedding and position tables (probe_cuda.h). */
#include "probe_cuda.h"

/* ---- embedding, positions, cast, add --------------------------------------------------------- */

enum mp_status embed_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    NEED(c->in[0]);
    if (fwd) {
        NEED(c->w);
        NEED(c->out);
        KK(x->d, mp_k_embed_fwd(c->out.p, c->out.dt, c->in[0].p, c->w.p, c->w.dt, n->rows, n->n, n->k, S(x)));
    } else if (c->gout.p && c->gw.p) {
        KK(x->d, mp_k_embed_bwd(c->gw.p, c->gw.dt, c->in[0].p, c->gout.p, c->gout.dt, n->rows, n->n, n->k, S(x)));
    }
    return MP_OK;
}

enum mp_status addpos_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->w);
        NEED(c->out);
        KK(x->d, mp_k_addpos_fwd(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, c->w.p, c->w.dt, n->rows, n->n,
                                 n->seq, n->k == 1, S(x)));
        return MP_OK;
    }
    if (!c->gout.p)
        return MP_OK;
    if (c->gin[0].p)
        KK(x->d, mp_k_convert(c->gin[0].p, c->gin[0].dt, c->gout.p, c->gout.dt, c->gout.n, 1, S(x)));
    if (c->gw.p)
        KK(x->d, mp_k_addpos_bwd(c->gw.p, c->gw.dt, c->gout.p, c->gout.dt, n->rows, n->n, n->seq, n->k == 1, S(x)));
    return MP_OK;
}
