/* probe_cuda_conv.c — the cuda backend: convolution as im2col + GEMM (probe_cuda.h). */
#include "probe_cuda.h"

/* ---- convolution as im2col + GEMM, pooling ------------------------------------------------------- */

static struct mp_k_conv conv_of(const struct mp_node *n)
{
    struct mp_k_conv C = {.ci = n->c_in, .hi = n->h_in, .wi = n->w_in, .co = n->c_out, .ho = n->h_out,
                          .wo = n->w_out, .k = n->kernel, .st = n->stride ? n->stride : 1, .pad = n->padding,
                          .g = n->groups ? n->groups : 1};
    return C;
}

/* Output pixels per column block: Kc * pc fp32 values fit the buffer. */
static uint64_t conv_chunk(const struct mp_exec *x, uint64_t kc, uint64_t P)
{
    uint64_t pc = RUN(x)->col_bytes / (kc ? kc * 4 : 4);
    return pc < P ? (pc ? pc : 1) : P;
}

enum mp_status conv_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    struct mp_k_conv C = conv_of(n);
    uint64_t P = C.ho * C.wo, cpg = C.ci / C.g, opg = C.co / C.g, Kc = cpg * C.k * C.k, G = C.g;
    uint64_t B = (C.ci && C.hi && C.wi) ? c->p->tensors[n->in[0]].elems / (C.ci * C.hi * C.wi) : 0;
    uint64_t pc = conv_chunk(x, Kc, P);
    char *col = RUN(x)->col;
    if (!col || RUN(x)->col_bytes < Kc * pc * 4)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: %s: no im2col buffer", n->name);
    /* Whole images fit the buffer: (sample, group) blocks side by side, one batched GEMM per
     * buffer-full (slots of `per` bytes: fp32 is the widest column type); else pixel chunks. */
    uint64_t per = Kc * P * 4, ne = pc == P ? mp_min_u64(RUN(x)->col_bytes / per, PTR_CAP / 2) : 0;
    NEED(c->in[0]);
    struct mp_view xin = c->in[0], w, go = c->gout;
    enum mp_status st = matmul_weight(c, fwd, &w);
    if (st != MP_OK)
        return st;
    struct gemm_ptrs gp;
    if (fwd) {
        NEED(c->out);
        float beta = 0.0f;
        if (n->param[1] >= 0) {
            NEED(c->b);
            KK(x->d, mp_k_bias_fill(c->out.p, c->out.dt, c->b.p, c->b.dt, B, C.co, P, S(x)));
            beta = 1.0f;
        }
        for (uint64_t e0 = 0; ne && e0 < B * G; e0 += ne) { /* Y_(b,g) (+)= W_g col_(b,g) */
            uint64_t k = mp_min_u64(ne, B * G - e0);
            PTRS(x, k, &gp);
            for (uint64_t j = 0; j < k; j++) {
                uint64_t bi = (e0 + j) / G, g = (e0 + j) % G;
                KK(x->d, mp_k_im2col(col + j * per, xin.p, xin.dt, &C, bi, g, 0, P, S(x)));
                gp.a[j] = at(w, g * opg * Kc);
                gp.b[j] = col + j * per;
                gp.c[j] = at(c->out, (bi * C.co + g * opg) * P);
            }
            GEMM_BATCHED(x, false, false, opg, P, Kc, 1.0f, &gp, w.dt, Kc, xin.dt, P, beta, c->out.dt, P);
        }
        for (uint64_t bi = 0; !ne && bi < B; bi++)
            for (uint64_t g = 0; g < G; g++)
                for (uint64_t p0 = 0; p0 < P; p0 += pc) {
                    uint64_t m = mp_min_u64(pc, P - p0);
                    KK(x->d, mp_k_im2col(col, xin.p, xin.dt, &C, bi, g, p0, m, S(x)));
                    GEMM(x, false, false, opg, m, Kc, 1.0f, at(w, g * opg * Kc), w.dt, Kc, 0, col, xin.dt, m, 0,
                         beta, at(c->out, (bi * C.co + g * opg) * P + p0), c->out.dt, P, 0, 1);
                }
        return MP_OK;
    }
    if (!go.p)
        return MP_OK;
    if (c->gw.p) { /* dW_g += dY_(b,g) col_(b,g)^T, accumulated in .grad's dtype: samples one after
                    * another (they add into the same dW_g), the groups of a sample batched */
        for (uint64_t bi = 0; ne && bi < B; bi++)
            for (uint64_t g0 = 0; g0 < G; g0 += ne) {
                uint64_t k = mp_min_u64(ne, G - g0);
                PTRS(x, k, &gp);
                for (uint64_t j = 0; j < k; j++) {
                    uint64_t g = g0 + j;
                    KK(x->d, mp_k_im2col(col + j * per, xin.p, xin.dt, &C, bi, g, 0, P, S(x)));
                    gp.a[j] = at(go, (bi * C.co + g * opg) * P);
                    gp.b[j] = col + j * per;
                    gp.c[j] = at(c->gw, g * opg * Kc);
                }
                GEMM_BATCHED(x, false, true, opg, Kc, P, 1.0f, &gp, go.dt, P, xin.dt, P, 1.0f, c->gw.dt, Kc);
            }
        for (uint64_t bi = 0; !ne && bi < B; bi++)
            for (uint64_t g = 0; g < G; g++)
                for (uint64_t p0 = 0; p0 < P; p0 += pc) {
                    uint64_t m = mp_min_u64(pc, P - p0);
                    KK(x->d, mp_k_im2col(col, xin.p, xin.dt, &C, bi, g, p0, m, S(x)));
                    GEMM(x, false, true, opg, Kc, m, 1.0f, at(go, (bi * C.co + g * opg) * P + p0), go.dt, P, 0,
                         col, xin.dt, m, 0, 1.0f, at(c->gw, g * opg * Kc), c->gw.dt, Kc, 0, 1);
                }
    }
    if (c->gin[0].p) { /* dcol_(b,g) = W_g^T dY_(b,g) (fp32), then col2im */
        for (uint64_t e0 = 0; ne && e0 < B * G; e0 += ne) {
            uint64_t k = mp_min_u64(ne, B * G - e0);
            PTRS(x, k, &gp);
            for (uint64_t j = 0; j < k; j++) {
                uint64_t bi = (e0 + j) / G, g = (e0 + j) % G;
                gp.a[j] = at(w, g * opg * Kc);
                gp.b[j] = at(go, (bi * C.co + g * opg) * P);
                gp.c[j] = col + j * per;
            }
            GEMM_BATCHED(x, true, false, Kc, P, opg, 1.0f, &gp, w.dt, Kc, go.dt, P, 0.0f, MP_DT_F32, P);
            for (uint64_t j = 0; j < k; j++)
                KK(x->d, mp_k_col2im(c->gin[0].p, c->gin[0].dt, (const float *)(col + j * per), &C, (e0 + j) / G,
                                     (e0 + j) % G, 0, P, S(x)));
        }
        for (uint64_t bi = 0; !ne && bi < B; bi++)
            for (uint64_t g = 0; g < G; g++)
                for (uint64_t p0 = 0; p0 < P; p0 += pc) {
                    uint64_t m = mp_min_u64(pc, P - p0);
                    GEMM(x, true, false, Kc, m, opg, 1.0f, at(w, g * opg * Kc), w.dt, Kc, 0,
                         at(go, (bi * C.co + g * opg) * P + p0), go.dt, P, 0, 0.0f, col, MP_DT_F32, m, 0, 1);
                    KK(x->d, mp_k_col2im(c->gin[0].p, c->gin[0].dt, (const float *)col, &C, bi, g, p0, m, S(x)));
                }
    }
    if (c->gb.p)
        KK(x->d, mp_k_bias_grad(c->gb.p, c->gb.dt, go.p, go.dt, B, C.co, P, S(x)));
    return MP_OK;
}
