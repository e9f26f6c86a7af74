/* probe_host_custom.c — the host backend's an opaque custom block (bytes mixed
 * deterministically).
 *
 * See probe_host.h for element access and scratch; kernels/custom.cu is the cuda side.
 */
#include "probe_host.h"

#include <math.h>

static uint8_t param_byte(float v)
{
    float f = fmaxf(fminf(v * 64.0f, 1e6f), -1e6f);
    return (uint8_t)((int64_t)floorf(f) & 0xff);
}

/* An opaque block: bytes out = a cheap deterministic mix of its input bytes and
 * parameters; the saved extra repeats them; backward mixes gradient bytes back
 * (or adds small floats to a float input gradient). */
enum mp_status mp_host_custom_fwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    uint64_t R = n->rows ? n->rows : 1, ob = n->n;
    NEED(c->out);
    NEED(c->in[0]);
    const uint8_t *in = c->in[0].p;
    uint64_t ib = c->p->tensors[n->in[0]].bytes / R;
    uint8_t *out = c->out.p;
    for (uint64_t r = 0; r < R; r++)
        for (uint64_t j = 0; j < ob; j++) {
            uint8_t src = ib ? in[r * ib + j % ib] : 0, pb = c->w.p ? param_byte(ldf(c->w, j % c->w.n)) : 0;
            out[r * ob + j] = (uint8_t)(src * 167u + j * 13u + pb + 1u);
        }
    if (n->n_extra > 0) {
        NEED(xr(c, MP_XR_CUSTOM_SAVED));
        uint64_t eb = xr(c, MP_XR_CUSTOM_SAVED).n / R;
        uint8_t *e = xr(c, MP_XR_CUSTOM_SAVED).p;
        for (uint64_t r = 0; r < R; r++)
            for (uint64_t j = 0; j < eb; j++)
                e[r * eb + j] = (uint8_t)(ob ? out[r * ob + j % ob] ^ 0x5a : 0x5a);
    }
    return MP_OK;
}

enum mp_status mp_host_custom_bwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    uint64_t R = n->rows ? n->rows : 1, ob = n->n;
    if (!c->gout.p || ob == 0)
        return MP_OK;
    const uint8_t *go = c->gout.p, *e = NULL;
    uint64_t eb = 0;
    if (n->n_extra > 0) {
        NEED(xr(c, MP_XR_CUSTOM_SAVED));
        e = xr(c, MP_XR_CUSTOM_SAVED).p;
        eb = xr(c, MP_XR_CUSTOM_SAVED).n / R;
    }
    NEED(c->out); /* saved: the block keeps its output */
    if (c->gin[0].p) {
        struct mp_view gi = c->gin[0];
        uint64_t per = gi.n / R;
        for (uint64_t r = 0; r < R; r++)
            for (uint64_t i = 0; i < per; i++) {
                unsigned g = go[r * ob + i % ob] + (eb ? e[r * eb + i % eb] : 0u);
                if (gi.dt == MP_DT_U8)
                    ((uint8_t *)gi.p)[r * per + i] = (uint8_t)(((uint8_t *)gi.p)[r * per + i] + g * 3u);
                else
                    accf(gi, r * per + i, 1e-3f * ((float)(g & 0xff) - 127.5f) / 127.5f);
            }
    }
    if (c->gw.p)
        for (uint64_t j = 0; j < c->gw.n; j++) {
            double s = 0;
            for (uint64_t r = 0; r < R; r++)
                s += (double)go[r * ob + j % ob] - 127.5;
            accf(c->gw, j, (float)(1e-3 * s / (127.5 * (double)R)));
        }
    return MP_OK;
}
