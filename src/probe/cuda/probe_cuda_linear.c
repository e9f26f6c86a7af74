/* probe_cuda_linear.c — the cuda backend: Linear, with quantized base weights (probe_cuda.h). */
#include "probe_cuda.h"

/* ---- linear ------------------------------------------------------------------------------------ */

/* A quantized base weight (bitsandbytes NF4, packed as mp_quant_pack lays it out): dequantized
 * into the node's MP_TR_DEQUANT temporary in the output dtype, in forward and again in backward,
 * as the host backend does (probe_host_linear.c). */
static enum mp_status dequant_weight(struct mp_node_view *c, bool fwd, struct mp_view *w)
{
    const struct mp_param *q = &c->p->params[c->n->param[0]];
    const struct mp_quant *qz = mp_program_base_quant(c->p);
    uint64_t off[MP_QUANT_PARTS_MAX], bs;
    NEED(c->w);
    if (!qz || mp_quant_nf4_layout(qz, q->rows, q->cols, off, &bs) != MP_OK)
        return mp_fail(c->x->d, MP_ERR_UNSUPPORTED, "probe: %s: the cuda backend executes bitsandbytes NF4 "
                       "weights only", c->n->name);
    int dt = (int)c->p->tensors[c->n->out].dtype;
    uint64_t bytes;
    void *t = mp_view_tmp(c, !fwd, MP_TR_DEQUANT, &bytes);
    if (!t || bytes < q->elems * esz(dt))
        return missing(c, "the dequantized weight");
    struct mp_k_nf4 k = {.n = q->elems, .blocksize = bs, .packed = off[0], .code = off[1], .absmax = off[2],
                         .offset = off[3], .absmax2 = off[4], .code2 = off[5], .double_quant = qz->double_quant};
    KK(c->x->d, mp_k_nf4_dequant(t, dt, c->w.p, k, S(c->x)));
    *w = (struct mp_view){t, (enum mp_dtype)dt, q->elems};
    return MP_OK;
}

/* Under autocast the GEMM uses the half copy of W (extra 0), refreshed by the forward; a
 * quantized base weight its dequantized temporary. */
enum mp_status matmul_weight(struct mp_node_view *c, bool fwd, struct mp_view *w)
{
    if (c->n->quantized)
        return dequant_weight(c, fwd, w);
    if (has_x(c, MP_XR_WEIGHT_COPY)) {
        struct mp_view copy = xr(c, MP_XR_WEIGHT_COPY);
        NEED(copy);
        if (fwd) {
            NEED(c->w);
            KK(c->x->d, mp_k_convert(copy.p, copy.dt, c->w.p, c->w.dt, c->w.n, 0, S(c->x)));
        }
        *w = copy;
        return MP_OK;
    }
    NEED(c->w);
    *w = c->w;
    return MP_OK;
}

enum mp_status linear_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    uint64_t M = n->rows, N = n->n, K = n->k;
    struct mp_view w;
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        enum mp_status st = matmul_weight(c, true, &w);
        if (st != MP_OK)
            return st;
        float beta = 0.0f;
        if (n->param[1] >= 0) {
            NEED(c->b);
            KK(x->d, mp_k_bias_fill(c->out.p, c->out.dt, c->b.p, c->b.dt, M, N, 1, S(x)));
            beta = 1.0f;
        }
        GEMM(x, false, true, M, N, K, 1.0f, c->in[0].p, c->in[0].dt, K, 0, w.p, w.dt, K, 0, beta, c->out.p,
             c->out.dt, N, 0, 1);
        return MP_OK;
    }
    if (!c->gout.p)
        return MP_OK;
    if (c->gin[0].p) {
        enum mp_status st = matmul_weight(c, false, &w);
        if (st != MP_OK)
            return st;
        GEMM(x, false, false, M, K, N, 1.0f, c->gout.p, c->gout.dt, N, 0, w.p, w.dt, K, 0, 1.0f, c->gin[0].p,
             c->gin[0].dt, K, 0, 1);
    }
    if (c->gw.p || mp_weight_grad_cast_later(c)) {
        NEED(c->in[0]);
        int cdt = (int)c->p->compute_dtype;
        void *half = cdt != MP_DT_F32 ? tmp_part(c, true, MP_TR_WGRAD_HALF, N * K * esz(cdt)) : NULL;
        if (half) {
            /* PyTorch: a half weight gradient, then its fp32 copy into .grad (MP_EV_WGRAD_CAST, after
             * the node, when .grad is made then) */
            GEMM(x, true, false, N, K, M, 1.0f, c->gout.p, c->gout.dt, N, 0, c->in[0].p, c->in[0].dt, K, 0, 0.0f,
                 half, cdt, K, 0, 1);
            if (c->gw.p)
                KK(x->d, mp_k_convert(c->gw.p, c->gw.dt, half, cdt, N * K, 1, S(x)));
        } else {
            GEMM(x, true, false, N, K, M, 1.0f, c->gout.p, c->gout.dt, N, 0, c->in[0].p, c->in[0].dt, K, 0, 1.0f,
                 c->gw.p, c->gw.dt, K, 0, 1);
        }
    }
    if (c->gb.p)
        KK(x->d, mp_k_bias_grad(c->gb.p, c->gb.dt, c->gout.p, c->gout.dt, M, N, 1, S(x)));
    return MP_OK;
}
