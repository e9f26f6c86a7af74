/* optim.c — optimizer state and step temporaries (optim.h). */
#include "optim.h"

#include "util/util.h"

/* bitsandbytes==0.50.2 (bitsandbytes/optim/optimizer.py): Optimizer2State.init_state (:492) and
 * Optimizer1State.init_state (:664) give a tensor of at least min_8bit_size (4096) elements a
 * uint8 state1 (and state2) like it and an fp32 absmax per 256-element block per state
 * (blocks = ceil(n / 256)); a smaller one fp32 state1 (state2).  The step counter is a Python
 * int, unorm_vec exists only with max_unorm > 0 (HF passes none).  transformers==5.24.0
 * trainer.py:1328-1338 registers every nn.Embedding's weight for 32-bit states.  The quantile
 * maps (create_dynamic_map: 256 fp32 each, :157) belong to the optimizer (name2qmap) and are
 * moved to the device with the first 8-bit tensor: qmap1 and qmap2 for Adam, qmap1 only for
 * Lion (udynamic stays on the host), counted with the program's first 8-bit tensor
 * (docs/memory-facts.md#low-bit-optimizers). */
#define BNB_MIN_8BIT 4096
#define BNB_BLOCK 256
#define QMAP8_BYTES (256 * 4)

bool mp_opt_bnb_8bit(const struct mp_param *q) { return q->trainable && q->elems >= BNB_MIN_8BIT && !q->embedding; }

static uint64_t bnb_state(const struct mp_program *p, const struct mp_param *q, uint64_t states)
{
    uint64_t n = q->elems;
    if (!mp_opt_bnb_8bit(q))
        return states * n * 4;
    uint64_t b = states * (n + 4 * mp_ceil_div(n, BNB_BLOCK));
    const struct mp_param *first = NULL;
    for (size_t i = 0; i < p->n_params && !first; i++)
        if (mp_opt_bnb_8bit(&p->params[i]))
            first = &p->params[i];
    if (q == first) /* (a data-parallel shard, a copy outside p, has none: 2 KiB a rank) */
        b += states * QMAP8_BYTES;
    return b;
}

/* torchao==0.18.0 torchao/optim/adam.py _AdamBase._new_buffer (:71): a tensor of at least 4096
 * elements that is a multiple of the block gets a quantized state, any other zeros_like(p)
 * (the parameter's dtype); HF (transformers==5.24.0 trainer_optimizer.py:469-474) passes
 * block_size 256 to both AdamW8bit and AdamW4bit.  Per state: subclass_8bit.py zeros (:104):
 * codes uint8 like p, scale fp32 (n / block), qmap fp32 (256); subclass_4bit.py zeros (:115):
 * codes uint8 n / 2, scale fp32 (n / block), qmap fp32 (16: create_dynamic_map(True, 3, 4) or
 * linspace(0, 1, 17)[1:]).  The step counter is a host tensor (torch.tensor(0.0)). */
#define AO_BLOCK 256

static uint64_t ao_state(const struct mp_param *q, uint64_t s, bool four_bit)
{
    uint64_t n = q->elems;
    if (n < 4096 || n % AO_BLOCK)
        return 2 * n * s;
    return 2 * ((four_bit ? n / 2 : n) + 4 * (n / AO_BLOCK) + 4 * (four_bit ? 16 : 256));
}

/* torch.optim.Muon (torch 2.15 torch/optim/_muon.py), on the 2-D weights of the hidden layers
 * (its docstring: "Muon is an optimizer for 2D parameters of neural network hidden layers. Other
 * parameters, such as bias, and embedding, should be optimized by a standard method such as
 * AdamW"; Muon.__init__ raises on any other rank): not an nn.Embedding table, not the output
 * layer, not a 3-D stack of experts.  Its state (_init_group :152-156) is one momentum_buffer,
 * zeros_like(p.grad).  Its step (_single_tensor_muon :338-352) goes parameter by parameter:
 * buf.lerp_ in place; update = grad.lerp(buf, momentum), a new tensor like the gradient (Nesterov,
 * the default); _zeropower_via_newtonschulz (:33-64) copies it to bf16 (m x n; transposed, a view,
 * so that X is k x K with k = min(m, n)), normalizes it in place, then 5 times makes the Gram
 * matrix X X^T (k x k), addmm(G, G, G) (k x k) and addmm(X, that, X) (k x K), each bound to the
 * same names, so while the new X is made the old X, the Gram matrix and its update are alive, and
 * at the next iteration's start the previous Gram matrix and update beside the new Gram matrix:
 * max(2 kK + 2 k^2, kK + 3 k^2) = 2 mn + 2 k^2 bf16 elements; param.mul_ and add_ in place.  With
 * the update: s mn + 4 mn + 4 k^2 bytes (s the gradient's element size), freed before the next
 * parameter (docs/memory-facts.md#optimizer-state). */
bool mp_opt_muon_param(const struct mp_param *q)
{
    return q->matrix && !q->embedding && !q->output && !q->stacked;
}

static uint64_t muon_step_bytes(const struct mp_param *q)
{
    uint64_t mn = q->elems, k = q->rows < q->cols ? q->rows : q->cols, a, b, c;
    if (!mp_mul_u64(mn, mp_dtype_size(q->dtype) + 4, &a) || !mp_mul_u64(k, k, &b) || !mp_mul_u64(b, 4, &b) ||
        !mp_add_u64(a, b, &c))
        return UINT64_MAX;
    return c;
}

void mp_opt_muon_add(const struct mp_param *q, uint64_t weight, uint64_t *muon_max, uint64_t *adamw_grad)
{
    if (!q->trainable || q->idle)
        return;
    uint64_t g;
    if (mp_opt_muon_param(q))
        *muon_max = mp_max_u64(*muon_max, muon_step_bytes(q));
    else if (!mp_mul_u64(mp_param_grad_bytes(q), weight, &g) || !mp_add_u64(*adamw_grad, g, adamw_grad))
        *adamw_grad = UINT64_MAX;
}

uint64_t mp_opt_state_bytes(const struct mp_program *p, enum mp_optimizer o, const struct mp_param *q)
{
    uint64_t s = mp_dtype_size(q->dtype), n = q->elems;
    if (!q->trainable)
        return 0; /* frozen: no optimizer state */
    switch (mp_optimizer_state(o)) {
    case MP_OPT_STATE_NONE: return 0;
    case MP_OPT_STATE_ONE: return n * s;
    case MP_OPT_STATE_TWO: return 2 * n * s;
    case MP_OPT_STATE_FACTORED: /* (adafactor_state) */
        return q->matrix ? (q->rows + q->cols) * 4 : n * 4;
    case MP_OPT_STATE_BNB8: return bnb_state(p, q, 2);
    case MP_OPT_STATE_BNB8_1: return bnb_state(p, q, 1);
    case MP_OPT_STATE_AO8: return ao_state(q, s, false);
    case MP_OPT_STATE_AO4: return ao_state(q, s, true);
    case MP_OPT_STATE_MUON: return (mp_opt_muon_param(q) ? 1 : 2) * n * s; /* (Muon's momentum; AdamW's moments) */
    }
    return 0;
}

/* Adafactor as HF's optim "adafactor" builds it: transformers.optimization.Adafactor
 * (transformers 5.24.0 optimization.py Adafactor.step; torch.optim.Adafactor is another class).
 * It upcasts a half gradient (grad.float()) and keeps its states like that fp32 gradient
 * (`.to(grad)`): a matrix's row and column factors (exp_avg_sq_row, _col), a vector's full
 * exp_avg_sq, all fp32; no first moment (beta1 None, HF's default).  Per parameter, one at a time:
 * a half parameter's fp32 copy (p.float()) and gradient's live through its update; update =
 * grad**2 + eps makes a tensor while grad**2 lives, the factored estimate (torch.mul of the
 * factors) one while that lives, p.add_(-update) one more while update lives: two fp32 tensors
 * like the parameter at once, four for a half parameter.  Measured on an H200 (the GPU kit's
 * bench/gpu/optim_step.py, GPT-2 through Trainer.create_optimizer): its 38.6M-element embedding
 * gave 310.6 MB in fp32 (2 x 154.4 MB) and 621.0 MB in bf16 (4 x), states 1.36 MB either way
 * (docs/memory-facts.md#optimizer-state). */

/* torchao's step (adam.py:142) is torch.compile(single_param_adam) per parameter; inductor's
 * code for AdamW8bit (torch 2.15, the C++ backend: TORCH_LOGS=output_code) allocates two fp32
 * tensors like the parameter (the lerped moments before quantization) and two fp32 vectors of
 * one value per 256-element block (their absmax), freed when the call returns.  The largest
 * parameter's call is the step's peak.  (Triton's code for a GPU is not read:
 * docs/memory-facts.md#low-bit-optimizers.) */
uint64_t mp_opt_step_tmp_of(enum mp_optimizer o, uint64_t total_grad_bytes, uint64_t largest_elems,
                            enum mp_dtype largest_dtype, uint64_t muon_max, uint64_t adamw_grad)
{
    uint64_t b;
    switch (mp_optimizer_tmp(o)) {
    case MP_OPT_TMP_MUON: return mp_max_u64(muon_max, adamw_grad); /* (mp_opt_muon_add) */
    case MP_OPT_TMP_ALL_GRADS: return total_grad_bytes; /* _foreach_sqrt(exp_avg_sqs) over the whole group */
    case MP_OPT_TMP_LARGEST: /* (adafactor_state): two fp32 tensors like it, four for a half one */
        return mp_mul_u64(largest_elems, largest_dtype == MP_DT_F32 ? 2 * 4 : 4 * 4, &b) ? b : UINT64_MAX;
    case MP_OPT_TMP_LARGEST_2F32: return 2 * 4 * (largest_elems + mp_ceil_div(largest_elems, AO_BLOCK));
    case MP_OPT_TMP_NONE: return 0;
    }
    return 0;
}

uint64_t mp_opt_step_tmp_bytes(const struct mp_program *p, enum mp_optimizer o)
{
    uint64_t total = 0, elems = 0, muon = 0, adamw = 0;
    enum mp_dtype dt = MP_DT_F32;
    for (size_t i = 0; i < p->n_params; i++) {
        total += mp_param_grad_bytes(&p->params[i]);
        mp_opt_largest(&p->params[i], &elems, &dt);
        mp_opt_muon_add(&p->params[i], 1, &muon, &adamw);
    }
    return mp_opt_step_tmp_of(o, total, elems, dt, muon, adamw);
}

void mp_opt_largest(const struct mp_param *q, uint64_t *elems, enum mp_dtype *dt)
{
    if (q->trainable && q->elems > *elems) {
        *elems = q->elems;
        *dt = q->dtype;
    }
}
