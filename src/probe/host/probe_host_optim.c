/* probe_host_optim.c — the host backend's optimizers: SGD (momentum), Adam(W), 8-bit Adam,
 * Adafactor.
 *
 * See probe_host.h for element access and scratch; kernels/optim.cu is the cuda side.
 */
#include "probe_host.h"

#include <math.h>

/* 8-bit blockwise state (bitsandbytes layout: uint8 m, uint8 v, one fp32 absmax
 * per 256-element block per state).  Codes are companded rather than bnb's
 * dynamic tree map: m = sign * (c/127)^2 * absmax, v = (c/255)^4 * absmax.
 * kernels/optim.cu implements the same codes. */

static float f32_at(const uint8_t *b, uint64_t i)
{
    float f;
    memcpy(&f, b + 4 * i, 4);
    return f;
}

static void f32_put(uint8_t *b, uint64_t i, float f) { memcpy(b + 4 * i, &f, 4); }

static void adam_update(struct mp_view P, struct mp_view G, struct mp_view m, struct mp_view v, struct mp_view den,
                        uint64_t n, uint64_t t, float wd)
{
    float bc1 = 1.0f - powf(MP_ADAM_BETA1, (float)t), bc2 = 1.0f - powf(MP_ADAM_BETA2, (float)t);
    if (P.dt == MP_DT_F32 && G.dt == MP_DT_F32 && m.dt == MP_DT_F32 && v.dt == MP_DT_F32 &&
        (!den.p || den.dt == MP_DT_F32)) { /* the same arithmetic without a dtype switch per element */
        float *pp = P.p, *mp = m.p, *vp = v.p, *dp = den.p, sb2 = sqrtf(bc2), step = MP_ADAM_LR / bc1;
        const float *gp = G.p;
        for (uint64_t i = 0; i < n; i++) {
            float p = pp[i], g = gp[i];
            if (wd > 0.0f)
                p *= 1.0f - MP_ADAM_LR * wd;
            mp[i] = MP_ADAM_BETA1 * mp[i] + (1.0f - MP_ADAM_BETA1) * g;
            vp[i] = MP_ADAM_BETA2 * vp[i] + (1.0f - MP_ADAM_BETA2) * g * g;
            float d = sqrtf(vp[i]) / sb2 + MP_ADAM_EPS;
            if (dp)
                dp[i] = d;
            pp[i] = p - step * mp[i] / d;
        }
        return;
    }
    for (uint64_t i = 0; i < n; i++) {
        float p = ldf(P, i), g = ldf(G, i);
        if (wd > 0.0f)
            p *= 1.0f - MP_ADAM_LR * wd;
        float mi = MP_ADAM_BETA1 * ldf(m, i) + (1.0f - MP_ADAM_BETA1) * g;
        float vi = MP_ADAM_BETA2 * ldf(v, i) + (1.0f - MP_ADAM_BETA2) * g * g;
        stf(m, i, mi);
        stf(v, i, vi);
        float d = sqrtf(ldf(v, i)) / sqrtf(bc2) + MP_ADAM_EPS; /* _foreach_sqrt into the step temporary */
        if (den.p) {
            stf(den, i, d);
            d = ldf(den, i);
        }
        stf(P, i, p - MP_ADAM_LR / bc1 * ldf(m, i) / d);
    }
}

static void adam8_update(struct mp_view P, struct mp_view G, uint8_t *S, uint64_t n, uint64_t t)
{
    uint64_t nb = (n + MP_ADAM8_BLOCK - 1) / MP_ADAM8_BLOCK;
    uint8_t *qm = S, *qv = S + n, *am = S + 2 * n, *av = S + 2 * n + 4 * nb;
    float bc1 = 1.0f - powf(MP_ADAM_BETA1, (float)t), bc2 = 1.0f - powf(MP_ADAM_BETA2, (float)t);
    float mb[MP_ADAM8_BLOCK], vb[MP_ADAM8_BLOCK];
    for (uint64_t blk = 0; blk < nb; blk++) {
        uint64_t i0 = blk * MP_ADAM8_BLOCK, cnt = mp_min_u64(MP_ADAM8_BLOCK, n - i0);
        float ma = f32_at(am, blk), va = f32_at(av, blk), nm = 0.0f, nv = 0.0f;
        for (uint64_t j = 0; j < cnt; j++) {
            float g = ldf(G, i0 + j);
            mb[j] = MP_ADAM_BETA1 * mp_q8_m_dec(qm[i0 + j], ma) + (1.0f - MP_ADAM_BETA1) * g;
            vb[j] = MP_ADAM_BETA2 * mp_q8_v_dec(qv[i0 + j], va) + (1.0f - MP_ADAM_BETA2) * g * g;
            float p = ldf(P, i0 + j);
            stf(P, i0 + j, p - MP_ADAM_LR / bc1 * mb[j] / (sqrtf(vb[j]) / sqrtf(bc2) + MP_ADAM_EPS));
            nm = fmaxf(nm, fabsf(mb[j]));
            nv = fmaxf(nv, vb[j]);
        }
        for (uint64_t j = 0; j < cnt; j++) {
            qm[i0 + j] = mp_q8_m_enc(mb[j], nm);
            qv[i0 + j] = mp_q8_v_enc(vb[j], nv);
        }
        f32_put(am, blk, nm);
        f32_put(av, blk, nv);
    }
}

/* torch.optim.Adafactor (2.5+), single tensor; var_estimate/update in the step temporary. */
static void adafactor_update(const struct mp_program *p, const struct mp_param *q, struct mp_view P, struct mp_view G,
                             struct mp_view S, struct mp_view tmp, float *scratch, uint64_t t)
{
    uint64_t n = q->elems;
    float eps1 = p->param_dtype == MP_DT_F32 ? 1.1920929e-07f : 0.0078125f;
    float b2 = powf((float)t, MP_ADAFACTOR_BETA2_DECAY), rho = fminf(MP_ADAFACTOR_LR, 1.0f / sqrtf((float)t));
    double pn = 0;
    for (uint64_t i = 0; i < n; i++)
        pn += (double)ldf(P, i) * ldf(P, i);
    float alpha = fmaxf(MP_ADAFACTOR_EPS2, (float)sqrt(pn / (double)n)) * rho;
    struct mp_view est = tmp.p ? tmp : (struct mp_view){scratch, MP_DT_F32, n};
    if (q->matrix) {
        uint64_t R = q->rows, C = q->cols;
        double rmean = 0;
        for (uint64_t r = 0; r < R; r++) {
            double s = 0;
            for (uint64_t j = 0; j < C; j++)
                s += (double)ldf(G, r * C + j) * ldf(G, r * C + j);
            float rv = ldf(S, r);
            stf(S, r, rv + b2 * ((float)(s / (double)C) - rv)); /* lerp */
            rmean += ldf(S, r);
        }
        for (uint64_t j = 0; j < C; j++) {
            double s = 0;
            for (uint64_t r = 0; r < R; r++)
                s += (double)ldf(G, r * C + j) * ldf(G, r * C + j);
            float cv = ldf(S, R + j);
            stf(S, R + j, cv + b2 * ((float)(s / (double)R) - cv));
        }
        float denom = fmaxf((float)(rmean / (double)R), eps1);
        for (uint64_t r = 0; r < R; r++)
            for (uint64_t j = 0; j < C; j++)
                stf(est, r * C + j, ldf(S, r) * ldf(S, R + j) / denom);
    } else {
        for (uint64_t i = 0; i < n; i++) {
            float g = ldf(G, i), v = ldf(S, i);
            stf(S, i, v + b2 * (g * g - v));
            stf(est, i, ldf(S, i));
        }
    }
    double un = 0;
    for (uint64_t i = 0; i < n; i++) {
        float u = ldf(G, i) / sqrtf(fmaxf(ldf(est, i), eps1 * eps1));
        stf(est, i, u);
        un += (double)ldf(est, i) * ldf(est, i);
    }
    float den = fmaxf(1.0f, (float)(sqrt(un) / sqrt((double)n)));
    for (uint64_t i = 0; i < n; i++)
        stf(P, i, ldf(P, i) - alpha / den * ldf(est, i));
}

enum mp_status mp_host_opt_param(struct mp_exec *x, const struct mp_param_view *v)
{
    const struct mp_param *pq = v->param;
    uint64_t n = pq->elems, t = v->t;
    enum mp_dtype pdt = pq->dtype; /* fp32 LoRA adapters on a bf16 base */
    struct mp_view P = {v->P.p, pdt, n}, G = {v->G.p, pdt, n};
    void *S = v->state;
    switch (x->t.optimizer) {
    case MP_OPT_SGD:
        for (uint64_t i = 0; i < n; i++)
            stf(P, i, ldf(P, i) - MP_SGD_LR * ldf(G, i));
        break;
    case MP_OPT_SGD_MOMENTUM: {
        struct mp_view B = {S, pdt, n};
        for (uint64_t i = 0; i < n; i++) {
            stf(B, i, t == 1 ? ldf(G, i) : MP_SGD_MOMENTUM * ldf(B, i) + ldf(G, i));
            stf(P, i, ldf(P, i) - MP_SGD_LR * ldf(B, i));
        }
        break;
    }
    case MP_OPT_ADAM:
    case MP_OPT_ADAMW:
    case MP_OPT_ADAMW_FUSED: {
        /* foreach: the _foreach_sqrt output, one temporary per parameter; fused: none (tmp NULL) */
        struct mp_view m = {S, pdt, n}, vv = {(char *)S + n * mp_dtype_size(pdt), pdt, n}, den = {v->tmp, pdt, n};
        adam_update(P, G, m, vv, den, n, t, mp_optimizer_decoupled_wd(x->t.optimizer) ? MP_ADAMW_WD : 0.0f);
        break;
    }
    case MP_OPT_ADAFACTOR: {
        float *scratch = NULL; /* var_estimate when the replay has no step temporary */
        if (!v->tmp0 && !(scratch = calloc(n ? n : 1, sizeof *scratch)))
            return mp_fail(x->d, MP_ERR_NOMEM, "probe: out of host memory in the optimizer step");
        adafactor_update(x->p, pq, P, G, (struct mp_view){S, pdt, 0}, (struct mp_view){v->tmp0, pdt, n}, scratch, t);
        free(scratch);
        break;
    }
    case MP_OPT_ADAM8BIT:
    case MP_OPT_PAGED_ADAM8BIT: /* paged: the same state (CUDA managed memory under bitsandbytes) */
        if (!mp_opt_bnb_8bit(pq)) {
            struct mp_view m = {S, MP_DT_F32, n}, vv = {(char *)S + n * 4, MP_DT_F32, n}, none = {NULL, MP_DT_F32, 0};
            adam_update(P, G, m, vv, none, n, t, 0.0f);
        } else {
            adam8_update(P, G, S, n, t);
        }
        break;
    case MP_OPT_LION8BIT:
    case MP_OPT_PAGED_LION8BIT:
    case MP_OPT_ADAMW8BIT_AO:
    case MP_OPT_ADAMW4BIT_AO:
    case MP_OPT_MUON: /* refused by mp_probe_run (the table's probe column) */
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: no %s step", mp_optimizer_str(x->t.optimizer));
    }
    return MP_OK;
}
