/* probe_host_attention.c — the host backend's attention: flash/SDPA (online softmax, logsumexp
 * kept) and eager (probabilities kept).
 *
 * See probe_host.h for element access and scratch; kernels/attention.cu is the cuda side.
 */
#include "probe_host.h"

#include <math.h>

static float round_dt(enum mp_dtype dt, float f)
{
    switch (dt) {
    case MP_DT_BF16: return mp_f32_from_bf16(mp_bf16_from_f32(f));
    case MP_DT_F16: return mp_f32_from_f16(mp_f16_from_f32(f));
    default: return f;
    }
}

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
    return MP_OK;
}

static enum mp_status eager_fwd(struct mp_node_view *c)
{
    struct attn_dims A = attn_dims(c);
    const struct mp_node *n = c->n;
    NEED(c->out);
    enum mp_status sst = eager_supported(c);
    if (sst != MP_OK)
        return sst;
    for (int j = 0; j < n->n_extra; j++)
        if (!c->ex[j].p)
            return missing(c, "an eager extra");
    FGET(q, c->in[0]);
    FGET(k, c->in[1]);
    FGET(v, c->in[2]);
    struct mp_view qc = xr(c, MP_XR_Q_COPY), kc = xr(c, MP_XR_K_COPY), vc = xr(c, MP_XR_V_COPY);
    struct mp_view pr = xr(c, MP_XR_PROBS), pv = eager_pv(c), dmask = xr(c, MP_XR_ATTN_DROP_MASK);
    enum mp_dtype cdt = qc.dt;
    /* contiguous (b,a,s,d) copies; k and v repeated over the group (repeat_kv) */
    for (uint64_t bi = 0; bi < A.b; bi++)
        for (uint64_t h = 0; h < A.a; h++)
            for (uint64_t i = 0; i < A.s; i++)
                for (uint64_t e = 0; e < A.d; e++) {
                    uint64_t dst = ((bi * A.a + h) * A.s + i) * A.d + e, g = h / A.group;
                    stf(qc, dst, q[qoff(&A, bi, i, h) + e]);
                    stf(kc, dst, k[koff(&A, bi, i, g) + e]);
                    stf(vc, dst, v[voff(&A, bi, i, g) + e]);
                }
    FGET(Q, qc);
    FGET(K, kc);
    FGET(V, vc);
    FNEW(sc, A.s);
    FNEW(o, A.b * A.s * A.a * A.d);
    for (uint64_t bi = 0; bi < A.b; bi++)
        for (uint64_t h = 0; h < A.a; h++) {
            uint64_t bh = (bi * A.a + h) * A.s;
            for (uint64_t i = 0; i < A.s; i++) {
                uint64_t jn = n->causal ? i + 1 : A.s;
                float m = -INFINITY;
                for (uint64_t j = 0; j < jn; j++) {
                    sc[j] = round_dt(cdt, A.scale * dotf(Q + (bh + i) * A.d, K + (bh + j) * A.d, A.d));
                    m = fmaxf(m, sc[j]);
                }
                double l = 0;
                for (uint64_t j = 0; j < jn; j++)
                    l += exp((double)sc[j] - m);
                for (uint64_t j = 0; j < A.s; j++) {
                    uint64_t idx = (bh + i) * A.s + j;
                    float P = j < jn ? (float)(exp((double)sc[j] - m) / l) : 0.0f;
                    stf(pr, idx, P);
                    P = ldf(pr, idx);
                    if (dmask.p) {
                        float ks = keep_scale(&A, idx);
                        stf(dmask, idx, ks > 0.0f ? 1.0f : 0.0f);
                        stf(pv, idx, P * ks);
                    } else if (pv.p != pr.p) {
                        stf(pv, idx, P);
                    }
                }
                float *oi = o + ((bi * A.s + i) * A.a + h) * A.d;
                for (uint64_t j = 0; j < jn; j++) {
                    float P = ldf(pv, (bh + i) * A.s + j);
                    for (uint64_t e = 0; e < A.d; e++)
                        oi[e] += P * V[(bh + j) * A.d + e];
                }
            }
        }
    fstore(c->out, o, c->out.n);
    return MP_OK;
}

static enum mp_status eager_bwd(struct mp_node_view *c)
{
    struct attn_dims A = attn_dims(c);
    const struct mp_node *n = c->n;
    if (!c->gout.p)
        return MP_OK;
    enum mp_status sst = eager_supported(c);
    if (sst != MP_OK)
        return sst;
    for (int j = 0; j < n->n_extra; j++)
        if (!c->ex[j].p)
            return missing(c, "an eager extra");
    FGET(dO, c->gout);
    FGET(Q, xr(c, MP_XR_Q_COPY));
    FGET(K, xr(c, MP_XR_K_COPY));
    FGET(V, xr(c, MP_XR_V_COPY));
    struct mp_view pr = xr(c, MP_XR_PROBS), pv = eager_pv(c), dmask = xr(c, MP_XR_ATTN_DROP_MASK);
    FNEW(dP, A.s);
    FNEW(dq, A.b * A.s * A.a * A.d);
    FNEW(dk, A.b * A.s * A.kv * A.d);
    FNEW(dv, A.b * A.s * A.kv * A.d);
    float inv_keep = A.p > 0.0f ? 1.0f / (1.0f - A.p) : 1.0f;
    for (uint64_t bi = 0; bi < A.b; bi++)
        for (uint64_t h = 0; h < A.a; h++) {
            uint64_t bh = (bi * A.a + h) * A.s, g = h / A.group;
            for (uint64_t i = 0; i < A.s; i++) {
                const float *doi = dO + ((bi * A.s + i) * A.a + h) * A.d;
                double rowdot = 0;
                for (uint64_t j = 0; j < A.s; j++) {
                    uint64_t idx = (bh + i) * A.s + j;
                    float d = dotf(doi, V + (bh + j) * A.d, A.d);
                    if (dmask.p)
                        d *= ldf(dmask, idx) * inv_keep;
                    dP[j] = d;
                    rowdot += (double)ldf(pr, idx) * d;
                }
                float *dqi = dq + ((bi * A.s + i) * A.a + h) * A.d;
                for (uint64_t j = 0; j < A.s; j++) {
                    uint64_t idx = (bh + i) * A.s + j;
                    float P = ldf(pr, idx), Pv = ldf(pv, idx), dS = P * (dP[j] - (float)rowdot);
                    float *dkj = dk + ((bi * A.s + j) * A.kv + g) * A.d, *dvj = dv + ((bi * A.s + j) * A.kv + g) * A.d;
                    for (uint64_t e = 0; e < A.d; e++) {
                        dqi[e] += A.scale * dS * K[(bh + j) * A.d + e];
                        dkj[e] += A.scale * dS * Q[(bh + i) * A.d + e];
                        dvj[e] += Pv * doi[e];
                    }
                }
            }
        }
    attn_scatter_grads(c, &A, dq, dk, dv);
    return MP_OK;
}

enum mp_status mp_host_attn_fwd(struct mp_node_view *c) { return c->n->eager ? eager_fwd(c) : flash_fwd(c); }
enum mp_status mp_host_attn_bwd(struct mp_node_view *c) { return c->n->eager ? eager_bwd(c) : flash_bwd(c); }
