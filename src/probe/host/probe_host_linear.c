/* probe_host_linear.c — the host backend's Linear through the host GEMM: forward, dX, dW, bias;
 * quantized and autocast weights.
 *
 * See probe_host.h for element access and scratch; the cuda side is cuBLAS (probe/cuda/probe_cuda_linear.c).
 */
#include "probe_host.h"

#include "model/model.h"

#define GEMM(...)                                   \
    do {                                            \
        if (mp_host_gemm(__VA_ARGS__) != MP_OK)     \
            return nomem(c);                        \
    } while (0)

/* A quantized base weight: dequantized (bitsandbytes dequantize_4bit) into the node's
 * MP_TR_DEQUANT temporary in the output dtype, in forward and again in backward. */
static enum mp_status dequant_weight(struct mp_node_view *c, bool fwd, float **wf)
{
    const struct mp_param *q = &c->p->params[c->n->param[0]];
    const struct mp_quant *qz = mp_program_base_quant(c->p);
    NEED(c->w);
    uint64_t tb;
    void *dq = tmp_part(c, !fwd, MP_TR_DEQUANT, &tb);
    if (!dq)
        return missing(c, "the dequantized weight");
    FNEW(w, q->elems);
    if (!qz || mp_quant_unpack(qz, q->rows, q->cols, c->w.p, w) != MP_OK)
        return mp_fail(c->x->d, MP_ERR_UNSUPPORTED, "probe: %s: the host backend executes bitsandbytes NF4 "
                       "weights only", c->n->name);
    struct mp_view t = {dq, c->p->tensors[c->n->out].dtype, q->elems};
    for (uint64_t i = 0; i < q->elems; i++) /* the dequantized temporary, then read back */
        stf(t, i, w[i]);
    for (uint64_t i = 0; i < q->elems; i++)
        w[i] = ldf(t, i);
    *wf = w;
    return MP_OK;
}

/* The weight the GEMM uses: the dequantized base weight, under autocast the half copy, else
 * the parameter. */
enum mp_status mp_host_linear_weight(struct mp_node_view *c, bool fwd, float **wf)
{
    if (c->n->quantized)
        return dequant_weight(c, fwd, wf);
    struct mp_view copy = xr(c, MP_XR_WEIGHT_COPY);
    bool has_copy = mp_node_extra(c->n, MP_XR_WEIGHT_COPY, 0) >= 0;
    struct mp_view wc = has_copy ? copy : c->w;
    if (has_copy && fwd) {
        NEED(c->w);
        NEED(copy);
        if (wc.dt == MP_DT_BF16 && c->w.dt == MP_DT_F32) {
            const float *w = c->w.p;
            uint16_t *h = wc.p;
            for (uint64_t i = 0; i < wc.n; i++)
                h[i] = mp_bf16_from_f32(w[i]);
        } else {
            for (uint64_t i = 0; i < wc.n; i++)
                stf(wc, i, ldf(c->w, i));
        }
    }
    *wf = fget(c, wc);
    if (!*wf)
        return wc.p ? nomem(c) : missing(c, "weight");
    return MP_OK;
}

enum mp_status mp_host_matmul_inputs(struct mp_node_view *c, float **w, float **x, float **bias)
{
    NEED(c->out);
    enum mp_status st = mp_host_linear_weight(c, true, w);
    if (st != MP_OK)
        return st;
    if (!(*x = fget(c, c->in[0])))
        return c->in[0].p ? nomem(c) : missing(c, "input");
    *bias = NULL;
    if (c->n->param[1] >= 0 && !(*bias = fget(c, c->b)))
        return c->b.p ? nomem(c) : missing(c, "bias");
    return MP_OK;
}

enum mp_status mp_host_linear_fwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    float *w, *x, *bias;
    enum mp_status st = mp_host_matmul_inputs(c, &w, &x, &bias);
    if (st != MP_OK)
        return st;
    FNEW(y, n->rows * n->n);
    if (bias) /* y (M,N) = bias + x (M,K) W^T (N,K) */
        for (uint64_t r = 0; r < n->rows; r++)
            memcpy(y + r * n->n, bias, (size_t)n->n * sizeof *y);
    GEMM(false, true, n->rows, n->n, n->k, 1.0f, x, n->k, w, n->k, bias ? 1.0f : 0.0f, y, n->n);
    fstore(c->out, y, n->rows * n->n);
    return MP_OK;
}

/* Weight gradient dW (N,K) = dY^T X, through the half temporary under autocast
 * (PyTorch: a half grad, then its fp32 copy into .grad). */
enum mp_status mp_host_weight_grad(struct mp_node_view *c, const float *dw, uint64_t count)
{
    enum mp_dtype cdt = c->p->compute_dtype;
    uint64_t tb;
    void *half = tmp_part(c, true, MP_TR_WGRAD_HALF, &tb);
    if (!c->gw.p && !(half && mp_weight_grad_cast_later(c)))
        return MP_OK;
    if (half && cdt != MP_DT_F32) {
        if (tb != count * mp_dtype_size(cdt))
            return mp_fail(c->x->d, MP_ERR_INTERNAL, "probe: %s: half weight gradient of %llu bytes, %llu expected",
                           c->n->name, (unsigned long long)tb, (unsigned long long)(count * mp_dtype_size(cdt)));
        struct mp_view t = {half, cdt, count};
        if (!c->gw.p) { /* the replay's MP_EV_WGRAD_CAST adds it to .grad after the node */
            for (uint64_t i = 0; i < count; i++)
                stf(t, i, dw[i]);
            return MP_OK;
        }
        if (cdt == MP_DT_BF16 && c->gw.dt == MP_DT_F32) {
            uint16_t *h = t.p;
            float *g = c->gw.p;
            for (uint64_t i = 0; i < count; i++) {
                h[i] = mp_bf16_from_f32(dw[i]);
                g[i] += mp_f32_from_bf16(h[i]);
            }
            return MP_OK;
        }
        for (uint64_t i = 0; i < count; i++) {
            stf(t, i, dw[i]);
            accf(c->gw, i, ldf(t, i));
        }
        return MP_OK;
    }
    facc(c->gw, dw, count);
    return MP_OK;
}

enum mp_status mp_host_linear_bwd(struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    if (!c->gout.p)
        return MP_OK;
    uint64_t M = n->rows, N = n->n, K = n->k;
    FGET(dy, c->gout);
    if (c->gin[0].p) {
        float *w;
        enum mp_status st = mp_host_linear_weight(c, false, &w);
        if (st != MP_OK)
            return st;
        FNEW(dx, M * K);
        GEMM(false, false, M, K, N, 1.0f, dy, N, w, K, 0.0f, dx, K); /* dx (M,K) = dy (M,N) W (N,K) */
        facc(c->gin[0], dx, M * K);
    }
    if (c->gw.p || mp_weight_grad_cast_later(c)) {
        FGET(x, c->in[0]);
        FNEW(dw, N * K);
        GEMM(true, false, N, K, M, 1.0f, dy, N, x, K, 0.0f, dw, K); /* dW (N,K) = dy^T (N,M) x (M,K) */
        enum mp_status st = mp_host_weight_grad(c, dw, N * K);
        if (st != MP_OK)
            return st;
    }
    if (c->gb.p)
        for (uint64_t o = 0; o < N; o++) {
            double s = 0;
            for (uint64_t r = 0; r < M; r++)
                s += dy[r * N + o];
            accf(c->gb, o, (float)s);
        }
    return MP_OK;
}
