/* probe_cuda_optim.c — the cuda backend: the optimizer step of one parameter (probe_cuda.h). */
#include "probe_cuda.h"

#include <math.h>

enum mp_status cuda_opt_param(struct mp_exec *x, const struct mp_param_view *v)
{
    const struct mp_param *pq = v->param;
    int pdt = (int)v->P.dt;
    uint64_t n = pq->elems, t = v->t;
    void *P = v->P.p, *G = v->G.p, *St = v->state;
    float bc1 = 1.0f - powf(MP_ADAM_BETA1, (float)t), bc2 = 1.0f - powf(MP_ADAM_BETA2, (float)t);
    switch (x->t.optimizer) {
    case MP_OPT_SGD: KK(x->d, mp_k_sgd(P, G, pdt, n, MP_SGD_LR, S(x))); break;
    case MP_OPT_SGD_MOMENTUM:
        KK(x->d, mp_k_sgd_momentum(P, G, St, pdt, n, MP_SGD_LR, MP_SGD_MOMENTUM, t == 1, S(x)));
        break;
    case MP_OPT_ADAM:
    case MP_OPT_ADAMW:
    case MP_OPT_ADAMW_FUSED: /* fused: no step temporary (v->tmp NULL) */
        KK(x->d, mp_k_adam(P, G, pdt, St, (char *)St + n * esz(pdt), pdt, v->tmp, n, MP_ADAM_LR, MP_ADAM_BETA1,
                           MP_ADAM_BETA2, MP_ADAM_EPS, mp_optimizer_decoupled_wd(x->t.optimizer) ? MP_ADAMW_WD : 0.0f,
                           bc1, bc2, S(x)));
        break;
    case MP_OPT_ADAFACTOR: {
        if (!v->tmp0)
            return mp_fail(x->d, MP_ERR_INTERNAL, "probe: the Adafactor step temporary is not allocated");
        float b2 = powf((float)t, MP_ADAFACTOR_BETA2_DECAY), rho = fminf(MP_ADAFACTOR_LR, 1.0f / sqrtf((float)t));
        float eps1 = pdt == MP_DT_F32 ? 1.1920929e-07f : 0.0078125f;
        KK(x->d, mp_k_adafactor(P, G, pdt, St, v->tmp0, pq->matrix ? pq->rows : 1, pq->matrix ? pq->cols : n,
                                pq->matrix, CX(x)->scalars + 4, b2, rho, eps1, MP_ADAFACTOR_EPS2, S(x)));
        break;
    }
    case MP_OPT_ADAM8BIT:
    case MP_OPT_PAGED_ADAM8BIT: /* paged: the same state (CUDA managed memory under bitsandbytes) */
        if (!mp_opt_bnb_8bit(pq))
            KK(x->d, mp_k_adam(P, G, pdt, St, (char *)St + n * 4, MP_DT_F32, NULL, n, MP_ADAM_LR, MP_ADAM_BETA1,
                               MP_ADAM_BETA2, MP_ADAM_EPS, 0.0f, bc1, bc2, S(x)));
        else
            KK(x->d, mp_k_adam8(P, G, pdt, St, n, MP_ADAM_LR, MP_ADAM_BETA1, MP_ADAM_BETA2, MP_ADAM_EPS, bc1, bc2,
                                S(x)));
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
