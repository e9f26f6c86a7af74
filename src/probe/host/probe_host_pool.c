/* probe_host_pool.c — the host backend's max, average and adaptive average pooling.
 *
 * See probe_host.h for element access and scratch; kernels/pool.cu is the cuda side.
 */
#include "probe_host.h"

#include <math.h>

/* Pooling window of output (oh, ow): rows [h0, h1), cols [w0, w1) of the input (padding excluded). */
static void pool_window(const struct mp_node *n, uint64_t oh, uint64_t ow, uint64_t *h0, uint64_t *h1, uint64_t *w0,
                        uint64_t *w1)
{
    if (n->prim == MP_P_ADAPTIVE_AVGPOOL) {
        *h0 = oh * n->h_in / n->h_out;
        *h1 = ((oh + 1) * n->h_in + n->h_out - 1) / n->h_out;
        *w0 = ow * n->w_in / n->w_out;
        *w1 = ((ow + 1) * n->w_in + n->w_out - 1) / n->w_out;
        return;
    }
    uint64_t st = n->stride ? n->stride : 1, ys = oh * st, xs = ow * st;
    *h0 = ys > n->padding ? ys - n->padding : 0;
    *w0 = xs > n->padding ? xs - n->padding : 0;
    *h1 = mp_min_u64(ys + n->kernel > n->padding ? ys + n->kernel - n->padding : 0, n->h_in);
    *w1 = mp_min_u64(xs + n->kernel > n->padding ? xs + n->kernel - n->padding : 0, n->w_in);
}

enum mp_status mp_host_pool_fwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    uint64_t HWi = n->h_in * n->w_in, HWo = n->h_out * n->w_out, planes = HWo ? c->out.n / HWo : 0;
    NEED(c->out);
    FGET(x, c->in[0]);
    FNEW(y, c->out.n);
    bool mx = n->prim == MP_P_MAXPOOL;
    if (mx)
        NEED(xr(c, MP_XR_POOL_INDICES));
    for (uint64_t pl = 0; pl < planes; pl++)
        for (uint64_t oh = 0; oh < n->h_out; oh++)
            for (uint64_t ow = 0; ow < n->w_out; ow++) {
                uint64_t h0, h1, w0, w1, best = 0;
                pool_window(n, oh, ow, &h0, &h1, &w0, &w1);
                double s = 0;
                float m = -INFINITY;
                for (uint64_t ih = h0; ih < h1; ih++)
                    for (uint64_t iw = w0; iw < w1; iw++) {
                        float v = x[pl * HWi + ih * n->w_in + iw];
                        s += v;
                        if (v > m || (ih == h0 && iw == w0)) {
                            m = v;
                            best = ih * n->w_in + iw;
                        }
                    }
                uint64_t o = pl * HWo + oh * n->w_out + ow;
                if (mx) {
                    y[o] = m;
                    ((int64_t *)xr(c, MP_XR_POOL_INDICES).p)[o] = (int64_t)best;
                } else {
                    /* avg_pool2d count_include_pad=True: the whole kernel; adaptive: the window */
                    double cnt = n->prim == MP_P_AVGPOOL ? (double)(n->kernel * n->kernel)
                                                         : (double)((h1 - h0) * (w1 - w0));
                    y[o] = (float)(s / cnt);
                }
            }
    fstore(c->out, y, c->out.n);
    return MP_OK;
}

enum mp_status mp_host_pool_bwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    if (!c->gout.p || !c->gin[0].p)
        return MP_OK;
    uint64_t HWi = n->h_in * n->w_in, HWo = n->h_out * n->w_out, planes = HWo ? c->gout.n / HWo : 0;
    FGET(dy, c->gout);
    FNEW(dx, c->gin[0].n);
    bool mx = n->prim == MP_P_MAXPOOL;
    if (mx)
        NEED(xr(c, MP_XR_POOL_INDICES));
    for (uint64_t pl = 0; pl < planes; pl++)
        for (uint64_t oh = 0; oh < n->h_out; oh++)
            for (uint64_t ow = 0; ow < n->w_out; ow++) {
                uint64_t o = pl * HWo + oh * n->w_out + ow;
                if (mx) {
                    dx[pl * HWi + (uint64_t)((const int64_t *)xr(c, MP_XR_POOL_INDICES).p)[o]] += dy[o];
                    continue;
                }
                uint64_t h0, h1, w0, w1;
                pool_window(n, oh, ow, &h0, &h1, &w0, &w1);
                float cnt = n->prim == MP_P_AVGPOOL ? (float)(n->kernel * n->kernel) : (float)((h1 - h0) * (w1 - w0));
                for (uint64_t ih = h0; ih < h1; ih++)
                    for (uint64_t iw = w0; iw < w1; iw++)
                        dx[pl * HWi + ih * n->w_in + iw] += dy[o] / cnt;
            }
    facc(c->gin[0], dx, c->gin[0].n);
    return MP_OK;
}
