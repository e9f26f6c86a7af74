/* optim.c — optimizer state and step temporaries (optim.h). */
#include "optim.h"

#include "util/util.h"

uint64_t mp_opt_state_bytes(const struct mp_program *p, enum mp_optimizer o, const struct mp_param *q)
{
    uint64_t s = mp_dtype_size(q->dtype), n = q->elems;
    (void)p;
    if (!q->trainable)
        return 0; /* frozen: no optimizer state */
    switch (mp_optimizer_state(o)) {
    case MP_OPT_STATE_NONE: return 0;
    case MP_OPT_STATE_ONE: return n * s;
    case MP_OPT_STATE_TWO: return 2 * n * s;
    case MP_OPT_STATE_FACTORED:
        /* torch.optim.Adafactor: row + column variance factors for matrices, full variance otherwise */
        return q->matrix ? (q->rows + q->cols) * s : n * s;
    case MP_OPT_STATE_BNB8:
        /* bitsandbytes: two uint8 states + one fp32 absmax per 256-element block per state;
         * tensors under min_8bit_size (4096) keep fp32 states */
        if (n < 4096)
            return 2 * n * 4;
        return 2 * n + 2 * 4 * mp_ceil_div(n, 256);
    }
    return 0;
}

uint64_t mp_opt_step_tmp_of(enum mp_optimizer o, uint64_t total_grad_bytes, uint64_t largest_grad_bytes)
{
    switch (mp_optimizer_tmp(o)) {
    case MP_OPT_TMP_ALL_GRADS: return total_grad_bytes; /* _foreach_sqrt(exp_avg_sqs) over the whole group */
    case MP_OPT_TMP_LARGEST: return largest_grad_bytes;
    case MP_OPT_TMP_NONE: return 0;
    }
    return 0;
}

uint64_t mp_opt_step_tmp_bytes(const struct mp_program *p, enum mp_optimizer o)
{
    uint64_t total = 0, largest = 0;
    for (size_t i = 0; i < p->n_params; i++) {
        total += mp_param_grad_bytes(&p->params[i]);
        largest = mp_max_u64(largest, mp_param_grad_bytes(&p->params[i]));
    }
    return mp_opt_step_tmp_of(o, total, largest);
}
