/* probe_cuda_rope.c — the cuda backend: rotary embeddings (probe_cuda.h). */
#include "probe_cuda.h"

/* ---- rope, attention ------------------------------------------------------------------------------ */

enum mp_status rope_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    uint64_t Wout = n->heads * n->head_dim, Win = c->lay->in_w[0], off = c->lay->in_off[0];
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        KK(x->d, mp_k_rope(c->out.p, c->out.dt, Wout, 0, c->in[0].p, c->in[0].dt, Win, off, n->rows, n->heads,
                           n->head_dim, n->rotary_dim, n->seq, MP_ROPE_BASE, 0, S(x)));
    } else if (c->gout.p && c->gin[0].p) {
        KK(x->d, mp_k_rope(c->gin[0].p, c->gin[0].dt, Win, off, c->gout.p, c->gout.dt, Wout, 0, n->rows, n->heads,
                           n->head_dim, n->rotary_dim, n->seq, MP_ROPE_BASE, 1, S(x)));
    }
    return MP_OK;
}
