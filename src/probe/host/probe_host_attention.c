/* probe_host_attention.c — the host backend's attention: flash/SDPA (online softmax, logsumexp
 * kept) and eager (probabilities kept).
 *
 * See probe_host.h for element access and scratch; kernels/attention.cu is the cuda side.
 */
#include "probe_host.h"

#include <math.h>

struct attn_dims {
    uint64_t b, s, a, kv, d, group;
    uint64_t wq, wk, wv, oq, ok, ov;
    float scale, p;
    uint64_t key;
};
static struct attn_dims attn_dims(const struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    struct attn_dims A;
    A.s = n->seq ? n->seq : 1;
    A.b = n->rows / A.s;
    A.a = n->heads;
    A.kv = n->kv_heads ? n->kv_heads : n->heads;
    A.d = n->head_dim;
    A.group = A.a / A.kv;
    A.wq = c->lay->in_w[0];
    A.wk = c->lay->in_w[1];
    A.wv = c->lay->in_w[2];
    A.oq = c->lay->in_off[0];
    A.ok = c->lay->in_off[1];
    A.ov = c->lay->in_off[2];
    A.scale = 1.0f / sqrtf((float)A.d);
    A.p = (float)n->p;
    A.key = mp_dropout_key(c->x->seed, c->k, c->x->rng_step);
    return A;
}

/* Element offsets of q row (bi, i, head h), k/v rows (bi, j, kv head). */
static uint64_t qoff(const struct attn_dims *A, uint64_t bi, uint64_t i, uint64_t h)
{
    return (bi * A->s + i) * A->wq + A->oq + h * A->d;
}

static uint64_t koff(const struct attn_dims *A, uint64_t bi, uint64_t j, uint64_t g)
{
    return (bi * A->s + j) * A->wk + A->ok + g * A->d;
}

static uint64_t voff(const struct attn_dims *A, uint64_t bi, uint64_t j, uint64_t g)
{
    return (bi * A->s + j) * A->wv + A->ov + g * A->d;
}

static float keep_scale(const struct attn_dims *A, uint64_t idx)
{
    if (A->p <= 0.0f)
        return 1.0f;
    return mp_hash_unit(A->key + idx) >= A->p ? 1.0f / (1.0f - A->p) : 0.0f;
}

static float dotf(const float *a, const float *b, uint64_t n)
{
    double s = 0;
    for (uint64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return (float)s;
}

/* Flash/SDPA forward: online over keys, keeps only the logsumexp (no s x s). */
static enum mp_status flash_fwd(struct mp_node_view *c)
{
    struct attn_dims A = attn_dims(c);
    NEED(c->out);
    NEED(xr(c, MP_XR_LSE));
    FGET(q, c->in[0]);
    FGET(k, c->in[1]);
    FGET(v, c->in[2]);
    FNEW(o, A.b * A.s * A.a * A.d);
    FNEW(sc, A.s);
    float *lse = xr(c, MP_XR_LSE).p;
    uint64_t s_lse = xr(c, MP_XR_LSE).n / (A.b * A.a);
    for (uint64_t bi = 0; bi < A.b; bi++)
        for (uint64_t h = 0; h < A.a; h++)
            for (uint64_t i = 0; i < A.s; i++) {
                uint64_t g = h / A.group, jn = c->n->causal ? i + 1 : A.s;
                const float *qi = q + qoff(&A, bi, i, h);
                float m = -INFINITY;
                for (uint64_t j = 0; j < jn; j++) {
                    sc[j] = A.scale * dotf(qi, k + koff(&A, bi, j, g), A.d);
                    m = fmaxf(m, sc[j]);
                }
                double l = 0;
                for (uint64_t j = 0; j < jn; j++)
                    l += exp((double)sc[j] - m);
                float L = m + (float)log(l);
                lse[(bi * A.a + h) * s_lse + i] = L;
                float *oi = o + ((bi * A.s + i) * A.a + h) * A.d;
                for (uint64_t j = 0; j < jn; j++) {
                    float pj = expf(sc[j] - L) * keep_scale(&A, ((bi * A.a + h) * A.s + i) * A.s + j);
                    const float *vj = v + voff(&A, bi, j, g);
                    for (uint64_t e = 0; e < A.d; e++)
                        oi[e] += pj * vj[e];
                }
            }
    fstore(c->out, o, c->out.n);
    return MP_OK;
}

/* Adds dq/dk/dv (float, (b,s,heads,d)) into the q/k/v gradient storages at their offsets. */
static void attn_scatter_grads(struct mp_node_view *c, const struct attn_dims *A, const float *dq, const float *dk,
                               const float *dv)
{
    for (uint64_t bi = 0; bi < A->b; bi++)
        for (uint64_t i = 0; i < A->s; i++) {
            if (c->gin[0].p)
                for (uint64_t h = 0; h < A->a; h++)
                    for (uint64_t e = 0; e < A->d; e++)
                        accf(c->gin[0], qoff(A, bi, i, h) + e, dq[((bi * A->s + i) * A->a + h) * A->d + e]);
            for (uint64_t g = 0; g < A->kv; g++)
                for (uint64_t e = 0; e < A->d; e++) {
                    if (c->gin[1].p)
                        accf(c->gin[1], koff(A, bi, i, g) + e, dk[((bi * A->s + i) * A->kv + g) * A->d + e]);
                    if (c->gin[2].p)
                        accf(c->gin[2], voff(A, bi, i, g) + e, dv[((bi * A->s + i) * A->kv + g) * A->d + e]);
                }
        }
}

static uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

/* Flash backward: D = rowsum(dO * O) and dq accumulated in the node's fp32
 * temporaries (softmax_d [b,a,s_r], dq_accum [b,s_r,a,d_r]); P recomputed from lse. */
static enum mp_status flash_bwd(struct mp_node_view *c)
{
    struct attn_dims A = attn_dims(c);
    if (!c->gout.p)
        return MP_OK;
    NEED(xr(c, MP_XR_LSE));
    FGET(q, c->in[0]);
    FGET(k, c->in[1]);
    FGET(v, c->in[2]);
    FGET(o, c->out);
    FGET(dO, c->gout);
    const float *lse = xr(c, MP_XR_LSE).p;
    uint64_t s_lse = xr(c, MP_XR_LSE).n / (A.b * A.a), s_r = round_up(A.s, 128), d_r = round_up(A.d, 32);
    uint64_t nD = A.b * A.a * s_r, nQ = A.b * s_r * A.a * d_r;
    uint64_t bD, bQ;
    float *Dv = tmp_part(c, true, MP_TR_FLASH_D, &bD), *dqa = tmp_part(c, true, MP_TR_FLASH_DQ, &bQ);
    if (Dv && dqa && bD == nD * 4 && bQ == nQ * 4) { /* flash's own workspace: the replay's TMP storage */
        memset(Dv, 0, (size_t)bD);
        memset(dqa, 0, (size_t)bQ);
    } else {
        Dv = fscratch(c, nD);
        dqa = fscratch(c, nQ);
        if (!Dv || !dqa)
            return nomem(c);
    }
    FNEW(dq, A.b * A.s * A.a * A.d);
    FNEW(dk, A.b * A.s * A.kv * A.d);
    FNEW(dv, A.b * A.s * A.kv * A.d);
    for (uint64_t bi = 0; bi < A.b; bi++)
        for (uint64_t h = 0; h < A.a; h++)
            for (uint64_t i = 0; i < A.s; i++) {
                uint64_t row = ((bi * A.s + i) * A.a + h) * A.d;
                Dv[(bi * A.a + h) * s_r + i] = dotf(dO + row, o + row, A.d);
            }
    for (uint64_t bi = 0; bi < A.b; bi++)
        for (uint64_t h = 0; h < A.a; h++)
            for (uint64_t i = 0; i < A.s; i++) {
                uint64_t g = h / A.group, jn = c->n->causal ? i + 1 : A.s, row = ((bi * A.s + i) * A.a + h) * A.d;
                const float *qi = q + qoff(&A, bi, i, h), *doi = dO + row;
                float L = lse[(bi * A.a + h) * s_lse + i], Di = Dv[(bi * A.a + h) * s_r + i];
                float *dqi = dqa + ((bi * s_r + i) * A.a + h) * d_r;
                for (uint64_t j = 0; j < jn; j++) {
                    const float *kj = k + koff(&A, bi, j, g), *vj = v + voff(&A, bi, j, g);
                    float P = expf(A.scale * dotf(qi, kj, A.d) - L);
                    float ks = keep_scale(&A, ((bi * A.a + h) * A.s + i) * A.s + j);
                    float dP = dotf(doi, vj, A.d) * ks, dS = P * (dP - Di);
                    float *dkj = dk + ((bi * A.s + j) * A.kv + g) * A.d, *dvj = dv + ((bi * A.s + j) * A.kv + g) * A.d;
                    for (uint64_t e = 0; e < A.d; e++) {
                        dqi[e] += A.scale * dS * kj[e];
                        dkj[e] += A.scale * dS * qi[e];
                        dvj[e] += P * ks * doi[e];
                    }
                }
                for (uint64_t e = 0; e < A.d; e++)
                    dq[row + e] = dqi[e];
            }
    attn_scatter_grads(c, &A, dq, dk, dv);
    return MP_OK;
}

/* Eager extras: q/k/v copies (b,a,s,d), probs (b,a,s,s) and what P@V reads: the dropped
 * probabilities (with a dropout mask), their cast to v's dtype, or probs itself. */
static struct mp_view eager_pv(const struct mp_node_view *c)
{
    if (mp_node_extra(c->n, MP_XR_PROBS_DROPPED, 0) >= 0)
        return xr(c, MP_XR_PROBS_DROPPED);
    if (mp_node_extra(c->n, MP_XR_PROBS_CAST, 0) >= 0)
        return xr(c, MP_XR_PROBS_CAST);
    return xr(c, MP_XR_PROBS);
}

static enum mp_status eager_supported(struct mp_node_view *c)
{
    if (mp_node_extra(c->n, MP_XR_SOFTCAP_TANH, 0) >= 0)
        return mp_fail(c->x->d, MP_ERR_UNSUPPORTED, "probe: %s: attention logit soft-capping is not implemented "
                                                    "by the probe yet", c->n->name);
    if (mp_node_extra(c->n, MP_XR_Q_COPY, 0) < 0 || mp_node_extra(c->n, MP_XR_K_COPY, 0) < 0 ||
        mp_node_extra(c->n, MP_XR_V_COPY, 0) < 0)
        return mp_fail(c->x->d, MP_ERR_UNSUPPORTED, "probe: %s: eager attention on saved inputs (no copies) is not "
                                                    "implemented by the probe", c->n->name);
    return MP_OK;
}

/* The elementwise ops on (b, a, s, s) tensors, both directions: scaling, the mask add (the
 * executors mask in the softmax: a copy here), casts, dropout (forward: dst2 the keep mask;
 * backward: the saved mask). */
static enum mp_status eager_elementwise(struct mp_node_view *c, const struct attn_dims *A, const struct mp_subop *op,
                                        struct mp_view src, struct mp_view dst)
{
    struct mp_view mask = c->fwd ? mp_view_tensor(c->x, MP_ST_ACT, op->dst2) : xr(c, MP_XR_ATTN_DROP_MASK);
    if (op->op == MP_SOP_DROPOUT)
        NEED(mask);
    float inv_keep = A->p > 0.0f ? 1.0f / (1.0f - A->p) : 1.0f;
    uint64_t n = A->b * A->a * A->s * A->s;
    for (uint64_t i = 0; i < n; i++) {
        float v = ldf(src, i);
        if (op->op == MP_SOP_SCALE) {
            v *= A->scale;
        } else if (op->op == MP_SOP_DROPOUT && c->fwd) {
            float ks = keep_scale(A, i);
            stf(mask, i, ks > 0.0f ? 1.0f : 0.0f);
            v *= ks;
        } else if (op->op == MP_SOP_DROPOUT) {
            v *= ldf(mask, i) * inv_keep;
        }
        stf(dst, i, v);
    }
    return MP_OK;
}

/* One op of the eager forward (layers.h mp_subop, ir/eager.c eager_ops' order). */
static enum mp_status eager_fwd(struct mp_node_view *c)
{
    struct attn_dims A = attn_dims(c);
    const struct mp_node *n = c->n;
    const struct mp_subop *op = mp_view_subop(c);
    if (!op)
        return missing(c, "its forward ops");
    enum mp_status sst = eager_supported(c);
    if (sst != MP_OK)
        return sst;
    struct mp_view src = mp_view_tensor(c->x, MP_ST_ACT, op->src), dst = mp_view_tensor(c->x, MP_ST_ACT, op->dst);
    if (op->src >= 0)
        NEED(src);
    NEED(dst);
    struct mp_view qc = xr(c, MP_XR_Q_COPY), kc = xr(c, MP_XR_K_COPY), vc = xr(c, MP_XR_V_COPY);
    switch (op->op) {
    case MP_SOP_QK: { /* contiguous (b,a,s,d) copies (k and v repeated over the group), then Q K^T */
        NEED(qc);
        NEED(kc);
        NEED(vc);
        FGET(q, c->in[0]);
        FGET(k, c->in[1]);
        FGET(v, c->in[2]);
        for (uint64_t bi = 0; bi < A.b; bi++)
            for (uint64_t h = 0; h < A.a; h++)
                for (uint64_t i = 0; i < A.s; i++)
                    for (uint64_t e = 0; e < A.d; e++) {
                        uint64_t at = ((bi * A.a + h) * A.s + i) * A.d + e, g = h / A.group;
                        stf(qc, at, q[qoff(&A, bi, i, h) + e]);
                        stf(kc, at, k[koff(&A, bi, i, g) + e]);
                        stf(vc, at, v[voff(&A, bi, i, g) + e]);
                    }
        FGET(Q, qc);
        FGET(K, kc);
        for (uint64_t bh = 0; bh < A.b * A.a; bh++)
            for (uint64_t i = 0; i < A.s; i++)
                for (uint64_t j = 0; j < A.s; j++)
                    stf(dst, (bh * A.s + i) * A.s + j, dotf(Q + (bh * A.s + i) * A.d, K + (bh * A.s + j) * A.d, A.d));
        return MP_OK;
    }
    case MP_SOP_SOFTMAX: /* over each row's first jn keys (causal), 0 beyond */
        for (uint64_t row = 0; row < A.b * A.a * A.s; row++) {
            uint64_t jn = n->causal ? row % A.s + 1 : A.s;
            float m = -INFINITY;
            for (uint64_t j = 0; j < jn; j++)
                m = fmaxf(m, ldf(src, row * A.s + j));
            double l = 0;
            for (uint64_t j = 0; j < jn; j++)
                l += exp((double)ldf(src, row * A.s + j) - m);
            for (uint64_t j = 0; j < A.s; j++)
                stf(dst, row * A.s + j, j < jn ? (float)(exp((double)ldf(src, row * A.s + j) - m) / l) : 0.0f);
        }
        return MP_OK;
    case MP_SOP_PV: { /* heads (b, a, s, d) = P V */
        FGET(P, src);
        FGET(V, vc);
        FNEW(o, A.b * A.a * A.s * A.d);
        for (uint64_t bh = 0; bh < A.b * A.a; bh++)
            for (uint64_t i = 0; i < A.s; i++)
                for (uint64_t j = 0; j < A.s; j++) {
                    float w = P[(bh * A.s + i) * A.s + j];
                    for (uint64_t e = 0; e < A.d; e++)
                        o[(bh * A.s + i) * A.d + e] += w * V[(bh * A.s + j) * A.d + e];
                }
        fstore(dst, o, dst.n);
        return MP_OK;
    }
    case MP_SOP_OUT: /* (b, s, a*d) = the heads transposed */
        for (uint64_t bi = 0; bi < A.b; bi++)
            for (uint64_t h = 0; h < A.a; h++)
                for (uint64_t i = 0; i < A.s; i++)
                    for (uint64_t e = 0; e < A.d; e++)
                        stf(dst, ((bi * A.s + i) * A.a + h) * A.d + e, ldf(src, ((bi * A.a + h) * A.s + i) * A.d + e));
        return MP_OK;
    case MP_SOP_SCALE:
    case MP_SOP_MASK:
    case MP_SOP_CAST:
    case MP_SOP_DROPOUT: return eager_elementwise(c, &A, op, src, dst);
    default:
        return mp_fail(c->x->d, MP_ERR_UNSUPPORTED, "probe: %s: this eager forward op is not implemented by the "
                                                    "probe", n->name);
    }
}

/* Adds src (float, the copies' (b, a, s, d) layout) into input j's gradient, in the input's
 * layout: the heads of a kv group add up (repeat_kv's backward), the dtype is the gradient's. */
static void eager_scatter(struct mp_node_view *c, const struct attn_dims *A, int j, const float *src)
{
    struct mp_view g = c->gin[j];
    if (!g.p)
        return;
    for (uint64_t bi = 0; bi < A->b; bi++)
        for (uint64_t h = 0; h < A->a; h++)
            for (uint64_t i = 0; i < A->s; i++) {
                uint64_t o = j == 0 ? qoff(A, bi, i, h) : j == 1 ? koff(A, bi, i, h / A->group) : voff(A, bi, i, h / A->group);
                const float *r = src + ((bi * A->a + h) * A->s + i) * A->d;
                for (uint64_t e = 0; e < A->d; e++)
                    accf(g, o + e, r[e]);
            }
}

/* One op of the eager backward (layers.h mp_subop, in the order ir/eager.c's eager_ops gives):
 * it reads its source gradient (dO or the buffer before it) and writes its buffer or adds into
 * an input's gradient.  Buffers are (b, a, s, s) or the copies' (b, a, s, d), contiguous. */
static enum mp_status eager_bwd(struct mp_node_view *c)
{
    struct attn_dims A = attn_dims(c);
    const struct mp_subop *op = mp_view_subop(c);
    if (!c->gout.p && !op)
        return MP_OK;
    if (!op)
        return missing(c, "its backward ops");
    enum mp_status sst = eager_supported(c);
    if (sst != MP_OK)
        return sst;
    struct mp_view src = op->src >= 0 ? mp_view_grad(c->x, op->src) : c->gout;
    struct mp_view dst = op->dst >= 0 ? mp_view_grad(c->x, op->dst) : (struct mp_view){NULL, MP_DT_U8, 0};
    NEED(src);
    if (op->dst >= 0)
        NEED(dst);
    uint64_t bas = A.b * A.a * A.s, ass = bas * A.s, nd = bas * A.d;
    switch (op->op) {
    case MP_SOP_PV_DV:
    case MP_SOP_PV_DP:
    case MP_SOP_QK_DQ:
    case MP_SOP_QK_DK: {
        bool pv = op->op == MP_SOP_PV_DV || op->op == MP_SOP_PV_DP;
        FGET(G, src); /* dO (b, s, a*d) for P@V; the scores' gradient (b, a, s, s) for Q@K^T */
        FGET(X, xr(c, op->op == MP_SOP_PV_DP ? MP_XR_V_COPY : op->op == MP_SOP_QK_DQ ? MP_XR_K_COPY : MP_XR_Q_COPY));
        FNEW(r, op->op == MP_SOP_PV_DP ? ass : nd);
        struct mp_view P = eager_pv(c);
        if (op->op == MP_SOP_PV_DV)
            NEED(P);
        for (uint64_t bi = 0; bi < A.b; bi++)
            for (uint64_t h = 0; h < A.a; h++) {
                uint64_t bh = (bi * A.a + h) * A.s;
                for (uint64_t i = 0; i < A.s; i++) {
                    const float *gi = pv ? G + ((bi * A.s + i) * A.a + h) * A.d : G + (bh + i) * A.s;
                    for (uint64_t j = 0; j < A.s; j++) {
                        switch (op->op) {
                        case MP_SOP_PV_DP: /* dP[i][j] = dO_i . V_j */
                            r[(bh + i) * A.s + j] = dotf(gi, X + (bh + j) * A.d, A.d);
                            break;
                        case MP_SOP_PV_DV: { /* dV_j += P[i][j] dO_i */
                            float w = ldf(P, (bh + i) * A.s + j);
                            for (uint64_t e = 0; e < A.d; e++)
                                r[(bh + j) * A.d + e] += w * gi[e];
                            break;
                        }
                        case MP_SOP_QK_DQ: /* dQ_i += dS[i][j] K_j */
                            for (uint64_t e = 0; e < A.d; e++)
                                r[(bh + i) * A.d + e] += gi[j] * X[(bh + j) * A.d + e];
                            break;
                        default: /* dK_j += dS[i][j] Q_i */
                            for (uint64_t e = 0; e < A.d; e++)
                                r[(bh + j) * A.d + e] += gi[j] * X[(bh + i) * A.d + e];
                            break;
                        }
                    }
                }
            }
        if (dst.p)
            fstore(dst, r, dst.n);
        else
            eager_scatter(c, &A, op->grad, r);
        return MP_OK;
    }
    case MP_SOP_GATHER: {
        FGET(g, src);
        eager_scatter(c, &A, op->grad, g);
        return MP_OK;
    }
    case MP_SOP_SOFTMAX: {
        struct mp_view P = xr(c, MP_XR_PROBS);
        NEED(P);
        for (uint64_t row = 0; row < bas; row++) {
            double dot = 0;
            for (uint64_t j = 0; j < A.s; j++)
                dot += (double)ldf(P, row * A.s + j) * ldf(src, row * A.s + j);
            for (uint64_t j = 0; j < A.s; j++) {
                uint64_t idx = row * A.s + j;
                stf(dst, idx, ldf(P, idx) * (ldf(src, idx) - (float)dot));
            }
        }
        return MP_OK;
    }
    case MP_SOP_DROPOUT:
    case MP_SOP_CAST:
    case MP_SOP_SCALE: return eager_elementwise(c, &A, op, src, dst);
    default:
        return mp_fail(c->x->d, MP_ERR_UNSUPPORTED, "probe: %s: this eager backward op is not implemented by the "
                                                    "probe", c->n->name);
    }
}

enum mp_status mp_host_attn_fwd(struct mp_node_view *c) { return c->n->eager ? eager_fwd(c) : flash_fwd(c); }
enum mp_status mp_host_attn_bwd(struct mp_node_view *c) { return c->n->eager ? eager_bwd(c) : flash_bwd(c); }
