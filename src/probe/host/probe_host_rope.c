/* probe_host_rope.c — the host backend's rotary position embedding (HF rotate_half).
 *
 * See probe_host.h for element access and scratch; kernels/rope.cu is the cuda side.
 */
#include "probe_host.h"

#include <math.h>

/* HF rotate_half on the first rotary_dim of each head; positions = row mod seq. */
static enum mp_status rope_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    uint64_t H = n->heads, d = n->head_dim, rd = n->rotary_dim ? n->rotary_dim : d, half = rd / 2;
    uint64_t s = n->seq ? n->seq : 1, Win = c->lay->in_w[0], off = c->lay->in_off[0], Wout = H * d;
    struct mp_view src = fwd ? c->in[0] : c->gout, dst = fwd ? c->out : c->gin[0];
    if (!fwd && (!src.p || !dst.p))
        return MP_OK;
    NEED(src);
    NEED(dst);
    uint64_t sw = fwd ? Win : Wout, so = fwd ? off : 0, dw = fwd ? Wout : Win, dof = fwd ? 0 : off;
    for (uint64_t r = 0; r < n->rows; r++) {
        float pos = (float)(r % s);
        for (uint64_t h = 0; h < H; h++) {
            uint64_t sb = r * sw + so + h * d, db = r * dw + dof + h * d;
            for (uint64_t i = 0; i < half; i++) {
                float ang = pos * powf(MP_ROPE_BASE, -(float)(2 * i) / (float)rd);
                float co = cosf(ang), si = sinf(ang);
                float a = ldf(src, sb + i), b = ldf(src, sb + i + half);
                if (fwd) {
                    stf(dst, db + i, a * co - b * si);
                    stf(dst, db + i + half, b * co + a * si);
                } else {
                    accf(dst, db + i, a * co + b * si);
                    accf(dst, db + i + half, -a * si + b * co);
                }
            }
            for (uint64_t i = rd; i < d; i++) {
                if (fwd)
                    stf(dst, db + i, ldf(src, sb + i));
                else
                    accf(dst, db + i, ldf(src, sb + i));
            }
        }
    }
    return MP_OK;
}

enum mp_status mp_host_rope_fwd(struct mp_node_view *c) { return rope_run(c, true); }
enum mp_status mp_host_rope_bwd(struct mp_node_view *c) { return rope_run(c, false); }
