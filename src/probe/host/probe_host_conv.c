/* probe_host_conv.c — the host backend's Conv2d (groups, stride, padding) as direct loops.
 *
 * See probe_host.h for element access and scratch; kernels/conv.cu is the cuda side.
 */
#include "probe_host.h"

struct conv_dims {
    uint64_t b, ci, co, hi, wi, ho, wo, k, st, pad, g, cpg, opg;
};
static struct conv_dims conv_dims(const struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    struct conv_dims D = {.ci = n->c_in, .co = n->c_out, .hi = n->h_in, .wi = n->w_in, .ho = n->h_out,
                          .wo = n->w_out, .k = n->kernel, .st = n->stride ? n->stride : 1, .pad = n->padding,
                          .g = n->groups ? n->groups : 1};
    uint64_t per = D.ci * D.hi * D.wi;
    D.b = per ? c->p->tensors[n->in[0]].elems / per : 0;
    D.cpg = D.ci / D.g;
    D.opg = D.co / D.g;
    return D;
}

/* Input position of output (oh, ow) and kernel tap (kh, kw); false when it falls in the padding. */
static bool conv_at(const struct conv_dims *D, uint64_t oh, uint64_t ow, uint64_t kh, uint64_t kw, uint64_t *ih,
                    uint64_t *iw)
{
    uint64_t y = oh * D->st + kh, x = ow * D->st + kw;
    if (y < D->pad || x < D->pad || y - D->pad >= D->hi || x - D->pad >= D->wi)
        return false;
    *ih = y - D->pad;
    *iw = x - D->pad;
    return true;
}

enum mp_status mp_host_conv_fwd(struct mp_node_view *c)
{
    struct conv_dims D = conv_dims(c);
    float *w, *x, *bias;
    enum mp_status st = mp_host_matmul_inputs(c, &w, &x, &bias);
    if (st != MP_OK)
        return st;
    FNEW(y, c->out.n);
    for (uint64_t bi = 0; bi < D.b; bi++)
        for (uint64_t o = 0; o < D.co; o++) {
            uint64_t g = o / D.opg;
            for (uint64_t oh = 0; oh < D.ho; oh++)
                for (uint64_t ow = 0; ow < D.wo; ow++) {
                    double s = bias ? bias[o] : 0.0;
                    for (uint64_t ci = 0; ci < D.cpg; ci++)
                        for (uint64_t kh = 0; kh < D.k; kh++)
                            for (uint64_t kw = 0; kw < D.k; kw++) {
                                uint64_t ih, iw;
                                if (conv_at(&D, oh, ow, kh, kw, &ih, &iw))
                                    s += (double)x[((bi * D.ci + g * D.cpg + ci) * D.hi + ih) * D.wi + iw] *
                                         w[((o * D.cpg + ci) * D.k + kh) * D.k + kw];
                            }
                    y[((bi * D.co + o) * D.ho + oh) * D.wo + ow] = (float)s;
                }
        }
    fstore(c->out, y, c->out.n);
    return MP_OK;
}

enum mp_status mp_host_conv_bwd(struct mp_node_view *c)
{
    struct conv_dims D = conv_dims(c);
    if (!c->gout.p)
        return MP_OK;
    FGET(dy, c->gout);
    float *w = NULL, *x = NULL, *dx = NULL, *dw = NULL;
    if (c->gin[0].p) {
        enum mp_status st = mp_host_linear_weight(c, false, &w);
        if (st != MP_OK)
            return st;
        if (!(dx = fscratch(c, c->gin[0].n)))
            return nomem(c);
    }
    if (c->gw.p) {
        if (!(x = fget(c, c->in[0])))
            return c->in[0].p ? nomem(c) : missing(c, "input");
        if (!(dw = fscratch(c, c->gw.n)))
            return nomem(c);
    }
    FNEW(db, D.co);
    for (uint64_t bi = 0; bi < D.b; bi++)
        for (uint64_t o = 0; o < D.co; o++) {
            uint64_t g = o / D.opg;
            for (uint64_t oh = 0; oh < D.ho; oh++)
                for (uint64_t ow = 0; ow < D.wo; ow++) {
                    float gy = dy[((bi * D.co + o) * D.ho + oh) * D.wo + ow];
                    db[o] += gy;
                    for (uint64_t ci = 0; ci < D.cpg; ci++)
                        for (uint64_t kh = 0; kh < D.k; kh++)
                            for (uint64_t kw = 0; kw < D.k; kw++) {
                                uint64_t ih, iw;
                                if (!conv_at(&D, oh, ow, kh, kw, &ih, &iw))
                                    continue;
                                uint64_t xi = ((bi * D.ci + g * D.cpg + ci) * D.hi + ih) * D.wi + iw;
                                uint64_t wi = ((o * D.cpg + ci) * D.k + kh) * D.k + kw;
                                if (dx)
                                    dx[xi] += gy * w[wi];
                                if (dw)
                                    dw[wi] += gy * x[xi];
                            }
                }
        }
    if (dx)
        facc(c->gin[0], dx, c->gin[0].n);
    if (dw) {
        enum mp_status st = mp_host_weight_grad(c, dw, c->gw.n);
        if (st != MP_OK)
            return st;
    }
    facc(c->gb, db, D.co);
    return MP_OK;
}
