/* probe_cuda_attention.c — the cuda backend: attention: the flash path and eager attention (probe_cuda.h). */
#include "probe_cuda.h"

#include <math.h>
#include <string.h>

static struct mp_k_attn attn_of(const struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    struct mp_k_attn A;
    memset(&A, 0, sizeof A);
    A.q = c->in[0].p;
    A.k = c->in[1].p;
    A.v = c->in[2].p;
    A.dt = c->in[0].dt;
    A.s = n->seq ? n->seq : 1;
    A.b = n->rows / A.s;
    A.a = n->heads;
    A.kv = n->kv_heads ? n->kv_heads : n->heads;
    A.d = n->head_dim;
    A.wq = c->lay->in_w[0];
    A.wk = c->lay->in_w[1];
    A.wv = c->lay->in_w[2];
    A.oq = c->lay->in_off[0];
    A.ok = c->lay->in_off[1];
    A.ov = c->lay->in_off[2];
    A.causal = n->causal;
    A.scale = 1.0f / sqrtf((float)A.d);
    A.p = (float)n->p;
    A.key = mp_dropout_key(c->x->seed, c->k, c->x->rng_step);
    return A;
}

static uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

/* ---- the flash path: cuBLAS GEMMs over blocks of query rows ----
 * Tensor cores through cuBLAS rather than a hand-written mma/WMMA flash kernel: every product
 * (QK^T, PV; dO V^T, dS K, dS^T Q, P^T dO) is a batched GEMM cuBLAS runs near peak, each one
 * checkable on its own, while a fused kernel could not be validated without a GPU here.  The
 * price is the workspace: fp32 scores and dP, P and dS in the attention dtype for a block of
 * query rows of many (sample, head) entries, at most MP_PROBE_ATTN_WS_BYTES, outside the
 * counting pool (outside_pool_bytes; flash-attention needs none).  Nothing s x s outlives the
 * node: the forward keeps the logsumexp, the backward recomputes P from it. */

/* Entries per GEMM call (ne) and query rows per block (qb) within ws bytes. */
static void fa_plan(const struct mp_k_attn *A, uint64_t ws, uint64_t *ne, uint64_t *qb)
{
    uint64_t ents = A->b * A->a, row = A->s * FA_WS_PER, q = A->s, e = ws / (q * row);
    if (!e) {
        q = mp_min_u64(A->s, 128);
        e = ws / (q * row);
    }
    if (!e) {
        q = mp_max_u64(1, ws / row);
        e = 1;
    }
    *qb = q;
    *ne = mp_min_u64(mp_min_u64(e, ents), PTR_CAP / 2);
}

/* Element offsets: q row i of head h, k/v row 0 of kv head g, o row i of head h (b, s, a, d). */
static uint64_t fa_q(const struct mp_k_attn *A, uint64_t bh, uint64_t i)
{
    return (bh / A->a * A->s + i) * A->wq + A->oq + bh % A->a * A->d;
}

static uint64_t fa_k(const struct mp_k_attn *A, uint64_t bh, uint64_t w, uint64_t off)
{
    return bh / A->a * A->s * w + off + bh % A->a / (A->a / A->kv) * A->d;
}

static uint64_t fa_o(const struct mp_k_attn *A, uint64_t bh, uint64_t i)
{
    return ((bh / A->a * A->s + i) * A->a + bh % A->a) * A->d;
}

/* S (fp32, ld jn) = scale Q_block K^T for every entry of F. */
static enum mp_status fa_scores(struct mp_exec *x, const struct mp_k_attn *A, const struct mp_k_fblock *F,
                                struct mp_view q, struct mp_view k, float *Sw)
{
    struct gemm_ptrs gp;
    PTRS(x, F->ne, &gp);
    for (uint64_t e = 0; e < F->ne; e++) {
        gp.a[e] = at(q, fa_q(A, F->e0 + e, F->i0));
        gp.b[e] = at(k, fa_k(A, F->e0 + e, A->wk, A->ok));
        gp.c[e] = Sw + e * F->qb * F->jn;
    }
    GEMM_BATCHED(x, false, true, F->qb, F->jn, A->d, A->scale, &gp, q.dt, A->wq, k.dt, A->wk, 0.0f, MP_DT_F32, F->jn);
    return MP_OK;
}

static enum mp_status flash_fwd(struct mp_node_view *c, const struct mp_k_attn *A, struct mp_view lse,
                                uint64_t s_lse)
{
    struct mp_exec *x = c->x;
    struct mp_view q = c->in[0], k = c->in[1], v = c->in[2], out = c->out;
    uint64_t ne, qb, ents = A->b * A->a;
    fa_plan(A, RUN(x)->attn_ws_bytes, &ne, &qb);
    for (uint64_t e0 = 0; e0 < ents; e0 += ne)
        for (uint64_t i0 = 0; i0 < A->s; i0 += qb) {
            uint64_t rows = mp_min_u64(qb, A->s - i0);
            struct mp_k_fblock F = {e0, mp_min_u64(ne, ents - e0), i0, rows, A->causal ? i0 + rows : A->s};
            float *Sw = RUN(x)->attn_ws;
            struct mp_view P = {Sw + F.ne * F.qb * F.jn, q.dt, F.ne * F.qb * F.jn};
            enum mp_status st = fa_scores(x, A, &F, q, k, Sw);
            if (st != MP_OK)
                return st;
            KK(x->d, mp_k_fa_softmax_fwd(A, &F, Sw, P.p, lse.p, s_lse, S(x)));
            struct gemm_ptrs gp; /* O_block = P V */
            PTRS(x, F.ne, &gp);
            for (uint64_t e = 0; e < F.ne; e++) {
                gp.a[e] = at(P, e * F.qb * F.jn);
                gp.b[e] = at(v, fa_k(A, e0 + e, A->wv, A->ov));
                gp.c[e] = at(out, fa_o(A, e0 + e, i0));
            }
            GEMM_BATCHED(x, false, false, F.qb, A->d, F.jn, 1.0f, &gp, P.dt, F.jn, v.dt, A->wv, 0.0f, out.dt,
                         A->a * A->d);
        }
    return MP_OK;
}

/* dK_g += dS^T Q (src dS, rhs q) or dV_g += Pk^T dO (src Pk, rhs dO) for the entries of F
 * whose head is member r of its kv group: no two entries of one call add into the same rows. */
static enum mp_status fa_kv_grad(struct mp_exec *x, const struct mp_k_attn *A, const struct mp_k_fblock *F,
                                 uint64_t r, struct mp_view src, struct mp_view rhs, bool rhs_q, struct mp_view dst,
                                 uint64_t w, uint64_t off)
{
    uint64_t group = A->a / A->kv, blk = F->qb * F->jn, n = 0;
    struct gemm_ptrs gp;
    PTRS(x, F->ne, &gp);
    for (uint64_t e = 0; e < F->ne; e++) {
        uint64_t bh = F->e0 + e;
        if (bh % A->a % group != r)
            continue;
        gp.a[n] = at(src, e * blk);
        gp.b[n] = at(rhs, rhs_q ? fa_q(A, bh, F->i0) : fa_o(A, bh, F->i0));
        gp.c[n++] = at(dst, fa_k(A, bh, w, off));
    }
    gp.n = n;
    GEMM_BATCHED(x, true, false, F->jn, A->d, F->qb, 1.0f, &gp, src.dt, F->jn, rhs.dt, rhs_q ? A->wq : A->a * A->d,
                 1.0f, dst.dt, w);
    return MP_OK;
}

static enum mp_status flash_bwd(struct mp_node_view *c, const struct mp_k_attn *A, struct mp_view lse,
                                uint64_t s_lse)
{
    struct mp_exec *x = c->x;
    struct mp_view q = c->in[0], k = c->in[1], v = c->in[2], go = c->gout, gq = c->gin[0], gk = c->gin[1],
                   gv = c->gin[2];
    uint64_t s_r = round_up(A->s, 128), d_r = round_up(A->d, 32), group = A->a / A->kv;
    float *dsum = tmp_part(c, true, MP_TR_FLASH_D, A->b * A->a * s_r * 4);
    float *dq_acc = tmp_part(c, true, MP_TR_FLASH_DQ, A->b * s_r * A->a * d_r * 4);
    if (!dsum || !dq_acc)
        return missing(c, "the softmax_d/dq_accum temporary");
    KK(x->d, mp_k_flash_dsum(A, c->out.p, go.p, dsum, s_r, S(x)));
    uint64_t ne, qb, ents = A->b * A->a;
    fa_plan(A, RUN(x)->attn_ws_bytes, &ne, &qb);
    struct gemm_ptrs gp;
    for (uint64_t e0 = 0; e0 < ents; e0 += ne)
        for (uint64_t i0 = 0; i0 < A->s; i0 += qb) {
            uint64_t rows = mp_min_u64(qb, A->s - i0);
            struct mp_k_fblock F = {e0, mp_min_u64(ne, ents - e0), i0, rows, A->causal ? i0 + rows : A->s};
            uint64_t blk = F.qb * F.jn, all = F.ne * blk;
            float *Sw = RUN(x)->attn_ws, *dPw = Sw + all;
            struct mp_view Pk = {dPw + all, q.dt, all}, dS = {(char *)(dPw + all) + all * esz(q.dt), q.dt, all};
            enum mp_status st = fa_scores(x, A, &F, q, k, Sw);
            if (st != MP_OK)
                return st;
            PTRS(x, F.ne, &gp); /* dP = dO_block V^T */
            for (uint64_t e = 0; e < F.ne; e++) {
                gp.a[e] = at(go, fa_o(A, e0 + e, i0));
                gp.b[e] = at(v, fa_k(A, e0 + e, A->wv, A->ov));
                gp.c[e] = dPw + e * blk;
            }
            GEMM_BATCHED(x, false, true, F.qb, F.jn, A->d, 1.0f, &gp, go.dt, A->a * A->d, v.dt, A->wv, 0.0f, MP_DT_F32,
                         F.jn);
            KK(x->d, mp_k_fa_softmax_bwd(A, &F, Sw, dPw, lse.p, s_lse, dsum, s_r, Pk.p, dS.p, S(x)));
            if (gq.p) { /* dq_accum rows of the block = dS K (each block writes its own rows) */
                PTRS(x, F.ne, &gp);
                for (uint64_t e = 0; e < F.ne; e++) {
                    uint64_t bh = e0 + e;
                    gp.a[e] = at(dS, e * blk);
                    gp.b[e] = at(k, fa_k(A, bh, A->wk, A->ok));
                    gp.c[e] = dq_acc + ((bh / A->a * s_r + i0) * A->a + bh % A->a) * d_r;
                }
                GEMM_BATCHED(x, false, false, F.qb, A->d, F.jn, 1.0f, &gp, dS.dt, F.jn, k.dt, A->wk, 0.0f, MP_DT_F32,
                             A->a * d_r);
            }
            for (uint64_t r = 0; r < group; r++) {
                if (gk.p && (st = fa_kv_grad(x, A, &F, r, dS, q, true, gk, A->wk, A->ok)) != MP_OK)
                    return st;
                if (gv.p && (st = fa_kv_grad(x, A, &F, r, Pk, go, false, gv, A->wv, A->ov)) != MP_OK)
                    return st;
            }
        }
    if (gq.p)
        KK(x->d, mp_k_flash_dq_out(A, dq_acc, s_r, d_r, gq.p, S(x)));
    return MP_OK;
}

enum mp_status flash_run(struct mp_node_view *c, bool fwd)
{
    struct mp_exec *x = c->x;
    struct mp_k_attn A = attn_of(c);
    NEED(c->in[0]);
    NEED(c->in[1]);
    NEED(c->in[2]);
    NEED(c->out);
    struct mp_view lse = xr(c, MP_XR_LSE);
    NEED(lse);
    if (!A.kv || A.a % A.kv || !A.b)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: %s: %llu heads over %llu kv heads", c->n->name,
                       (unsigned long long)A.a, (unsigned long long)A.kv);
    if (!RUN(x)->attn_ws)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: %s: no attention workspace", c->n->name);
    uint64_t s_lse = lse.n / (A.b * A.a);
    if (fwd)
        return flash_fwd(c, &A, lse, s_lse);
    return c->gout.p ? flash_bwd(c, &A, lse, s_lse) : MP_OK;
}

/* Eager: extras q_copy, k_copy, v_copy (b,a,s,d), probs (b,a,s,s), then [mask, dropped] or [cast]. */
static struct mp_view eager_pv(const struct mp_node_view *c)
{
    return has_x(c, MP_XR_PROBS_DROPPED) ? xr(c, MP_XR_PROBS_DROPPED)
           : has_x(c, MP_XR_PROBS_CAST) ? xr(c, MP_XR_PROBS_CAST)
                                        : xr(c, MP_XR_PROBS);
}

/* One op of the eager forward (layers.h mp_subop, eager.c eager_ops' order), as
 * probe_host_attention.c runs it: Q K^T (after the contiguous copies), the scaling, the mask add
 * (a copy: the softmax masks), casts, the softmax, dropout, P V, the heads transposed. */
enum mp_status eager_fwd(struct mp_node_view *c)
{
    struct mp_exec *x = c->x;
    const struct mp_node *n = c->n;
    const struct mp_subop *op = mp_view_subop(c);
    if (!op)
        return missing(c, "its forward ops");
    struct mp_k_attn A = attn_of(c);
    if (has_x(c, MP_XR_SOFTCAP_TANH))
        return mp_fail(x->d, MP_ERR_UNSUPPORTED, "probe: %s: attention logit soft-capping is not implemented "
                                                 "by the probe yet", n->name);
    struct mp_view qc = xr(c, MP_XR_Q_COPY), kc = xr(c, MP_XR_K_COPY), vc = xr(c, MP_XR_V_COPY);
    struct mp_view src = mp_view_tensor(x, MP_ST_ACT, op->src), dst = mp_view_tensor(x, MP_ST_ACT, op->dst);
    if (op->src >= 0)
        NEED(src);
    NEED(dst);
    NEED(qc);
    NEED(kc);
    NEED(vc);
    uint64_t b = A.b, s = A.s, a = A.a, d = A.d, ass = b * a * s * s, ss = s * s, sd = s * d;
    switch (op->op) {
    case MP_SOP_QK:
        NEED(c->in[0]);
        NEED(c->in[1]);
        NEED(c->in[2]);
        KK(x->d, mp_k_attn_pack(&A, qc.p, kc.p, vc.p, S(x)));
        GEMM(x, false, true, s, s, d, 1.0f, qc.p, qc.dt, d, sd, kc.p, kc.dt, d, sd, 0.0f, dst.p, dst.dt, s, ss, b * a);
        return MP_OK;
    case MP_SOP_SCALE:
        KK(x->d, mp_k_scale(dst.p, dst.dt, src.p, src.dt, ass, A.scale, 0, S(x)));
        return MP_OK;
    case MP_SOP_MASK:
    case MP_SOP_CAST:
        KK(x->d, mp_k_convert(dst.p, dst.dt, src.p, src.dt, ass, 0, S(x)));
        return MP_OK;
    case MP_SOP_SOFTMAX:
        KK(x->d, mp_k_attn_softmax(dst.p, dst.dt, src.p, src.dt, b * a * s, s, A.causal, S(x)));
        return MP_OK;
    case MP_SOP_DROPOUT: {
        struct mp_view mask = mp_view_tensor(x, MP_ST_ACT, op->dst2);
        NEED(mask);
        KK(x->d, mp_k_attn_probs_out(dst.p, dst.dt, mask.p, src.p, src.dt, ass, A.p, A.key, S(x)));
        return MP_OK;
    }
    case MP_SOP_PV:
        GEMM(x, false, false, s, d, s, 1.0f, src.p, src.dt, s, ss, vc.p, vc.dt, d, sd, 0.0f, dst.p, dst.dt, d, sd,
             b * a);
        return MP_OK;
    case MP_SOP_OUT:
        KK(x->d, mp_k_attn_unpack(dst.p, src.p, dst.dt, b, s, a, d, S(x)));
        return MP_OK;
    default:
        return mp_fail(x->d, MP_ERR_UNSUPPORTED, "probe: %s: this eager forward op is not implemented by the "
                                                 "probe", n->name);
    }
}

/* One op of the eager backward (layers.h mp_subop, in eager.c eager_ops' order): it reads
 * its source gradient (dO or the buffer before it) and writes its buffer ((b, a, s, s) or a copy's
 * (b, a, s, d), contiguous) or an input's gradient, as probe_host_attention.c does. */
enum mp_status eager_bwd(struct mp_node_view *c)
{
    struct mp_exec *x = c->x;
    const struct mp_node *n = c->n;
    const struct mp_subop *op = mp_view_subop(c);
    if (!op)
        return missing(c, "its backward ops");
    struct mp_k_attn A = attn_of(c);
    struct mp_view qc = xr(c, MP_XR_Q_COPY), kc = xr(c, MP_XR_K_COPY), vc = xr(c, MP_XR_V_COPY);
    struct mp_view pr = xr(c, MP_XR_PROBS), pv = eager_pv(c), dmask = xr(c, MP_XR_ATTN_DROP_MASK);
    struct mp_view src = op->src >= 0 ? mp_view_grad(x, op->src) : c->gout;
    struct mp_view dst = {NULL, MP_DT_U8, 0};
    if (op->dst >= 0)
        dst = mp_view_grad(x, op->dst);
    NEED(src);
    if (op->dst >= 0)
        NEED(dst);
    uint64_t b = A.b, s = A.s, a = A.a, d = A.d, ass = b * a * s * s, ss = s * s, sd = s * d;
    /* a product that goes straight into an input's gradient: its layout (width w, offset o);
     * eager.c makes it direct only when the copy has the input's size (no kv group) */
    struct mp_view gj = op->dst < 0 && op->grad >= 0 ? c->gin[op->grad] : dst;
    uint64_t wj = op->grad == 0 ? A.wq : op->grad == 1 ? A.wk : A.wv;
    uint64_t oj = op->grad == 0 ? A.oq : op->grad == 1 ? A.ok : A.ov;
    if (op->dst < 0 && op->op != MP_SOP_GATHER && op->grad > 0 && A.kv != A.a)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: %s: a grouped k/v gradient without its buffer", n->name);
    struct gemm_ptrs gp;
    if (op->op == MP_SOP_PV_DP)
        NEED(vc);
    if (op->op == MP_SOP_PV_DV)
        NEED(pv);
    if (op->op == MP_SOP_QK_DQ || op->op == MP_SOP_QK_DK) {
        NEED(qc);
        NEED(kc);
    }
    if (op->op == MP_SOP_SOFTMAX)
        NEED(pr);
    switch (op->op) {
    case MP_SOP_PV_DP: /* dP_h = dO_h V_h^T (dO is (b, s, a*d): head h at column h*d) */
        PTRS(x, b * a, &gp);
        for (uint64_t e = 0; e < b * a; e++) { /* e = bi*a + h */
            gp.a[e] = at(src, e / a * s * a * d + e % a * d);
            gp.b[e] = at(vc, e * sd);
            gp.c[e] = at(dst, e * ss);
        }
        GEMM_BATCHED(x, false, true, s, s, d, 1.0f, &gp, src.dt, a * d, vc.dt, d, 0.0f, dst.dt, s);
        return MP_OK;
    case MP_SOP_PV_DV: /* dV_h = P_h^T dO_h */
    case MP_SOP_QK_DQ: /* dQ_h = dS_h K_h */
    case MP_SOP_QK_DK: /* dK_h = dS_h^T Q_h */
        if (!gj.p)
            return MP_OK;
        PTRS(x, b * a, &gp);
        for (uint64_t e = 0; e < b * a; e++) {
            bool pvop = op->op == MP_SOP_PV_DV;
            gp.a[e] = pvop ? at(pv, e * ss) : at(src, e * ss);
            gp.b[e] = pvop ? at(src, e / a * s * a * d + e % a * d) : at(op->op == MP_SOP_QK_DQ ? kc : qc, e * sd);
            gp.c[e] = dst.p ? at(dst, e * sd) : at(gj, e / a * s * wj + oj + e % a * d);
        }
        if (op->op == MP_SOP_PV_DV)
            GEMM_BATCHED(x, true, false, s, d, s, 1.0f, &gp, pv.dt, s, src.dt, a * d, dst.p ? 0.0f : 1.0f, gj.dt,
                         dst.p ? d : wj);
        else
            GEMM_BATCHED(x, op->op == MP_SOP_QK_DK, false, s, d, s, 1.0f, &gp, src.dt, s, qc.dt, d,
                         dst.p ? 0.0f : 1.0f, gj.dt, dst.p ? d : wj);
        return MP_OK;
    case MP_SOP_GATHER:
        KK(x->d, mp_k_attn_gather(&A, op->grad, c->gin[op->grad].p, c->gin[op->grad].dt, src.p, src.dt, S(x)));
        return MP_OK;
    case MP_SOP_DROPOUT: /* dst (zeroed) += src * keep / (1 - p) */
        NEED(dmask);
        KK(x->d, mp_k_dropout_bwd(dst.p, src.p, src.dt, dmask.p, ass, A.p, S(x)));
        return MP_OK;
    case MP_SOP_CAST:
        KK(x->d, mp_k_convert(dst.p, dst.dt, src.p, src.dt, ass, 0, S(x)));
        return MP_OK;
    case MP_SOP_SOFTMAX:
        KK(x->d, mp_k_softmax_bwd(dst.p, src.p, pr.dt, pr.p, NULL, 0.0f, b * a * s, s, S(x)));
        return MP_OK;
    case MP_SOP_SCALE:
        KK(x->d, mp_k_scale(dst.p, dst.dt, src.p, src.dt, ass, A.scale, 0, S(x)));
        return MP_OK;
    default:
        return mp_fail(x->d, MP_ERR_UNSUPPORTED, "probe: %s: this eager backward op is not implemented by the "
                                                 "probe", n->name);
    }
}
