/* probe_host_embedding.c — the host backend's token and position embeddings.
 *
 * See probe_host.h for element access and scratch; kernels/embedding.cu is the cuda side.
 */
#include "probe_host.h"

enum mp_status mp_host_embed_fwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    NEED(c->in[0]);
    NEED(c->w);
    NEED(c->out);
    const int64_t *ids = c->in[0].p;
    for (uint64_t r = 0; r < n->rows; r++) {
        if (ids[r] < 0 || (uint64_t)ids[r] >= n->k)
            return mp_fail(c->x->d, MP_ERR_INTERNAL, "probe: %s: token id %lld outside the vocabulary", n->name,
                           (long long)ids[r]);
        for (uint64_t j = 0; j < n->n; j++)
            stf(c->out, r * n->n + j, ldf(c->w, (uint64_t)ids[r] * n->n + j));
    }
    return MP_OK;
}

enum mp_status mp_host_embed_bwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    if (!c->gout.p || !c->gw.p)
        return MP_OK;
    NEED(c->in[0]);
    const int64_t *ids = c->in[0].p;
    FGET(dy, c->gout);
    for (uint64_t r = 0; r < n->rows; r++)
        for (uint64_t j = 0; j < n->n; j++)
            accf(c->gw, (uint64_t)ids[r] * n->n + j, dy[r * n->n + j]);
    return MP_OK;
}

/* The table row added to row r: its position (learned positions, k == seq), or
 * row 0 everywhere (k == 1: BERT token types with all-zero ids). */
static uint64_t pos_row(const struct mp_node *n, uint64_t r)
{
    return n->k == 1 ? 0 : r % (n->seq ? n->seq : 1);
}

enum mp_status mp_host_addpos_fwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    NEED(c->w);
    NEED(c->out);
    FGET(x, c->in[0]);
    for (uint64_t r = 0; r < n->rows; r++)
        for (uint64_t j = 0; j < n->n; j++)
            stf(c->out, r * n->n + j, x[r * n->n + j] + ldf(c->w, pos_row(n, r) * n->n + j));
    return MP_OK;
}

enum mp_status mp_host_addpos_bwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    if (!c->gout.p)
        return MP_OK;
    FGET(dy, c->gout);
    facc(c->gin[0], dy, c->gout.n);
    if (c->gw.p)
        for (uint64_t r = 0; r < n->rows; r++)
            for (uint64_t j = 0; j < n->n; j++)
                accf(c->gw, pos_row(n, r) * n->n + j, dy[r * n->n + j]);
    return MP_OK;
}
