// activation.cu — GELU (erf and tanh forms), ReLU, SiLU, tanh, sigmoid: forward
// and backward from the tensor autograd saves (x or y, docs/memory-facts.md#saved-tensors).  HF's
// Python GELUs (new, fast) compute tanh-GELU and also write their intermediates.
// fp32/bf16/fp16 operands run as typed templates (kcommon.cuh ew_kernel, vector loads);
// HF's composites with their intermediates keep the generic kernel.
#include "kcommon.cuh"

// ---- kernels: the arithmetic is src/probe/mp_math.h's (mp_act_f, mp_act_df, mp_gelu_part) -------

struct gelu_parts {
    void *p[6];
    int dt[6];
    int n;
};

// new: tanh, 0.5x, 1+tanh; fast: 0.044715x, 0.7978845608x, 1+0.044715x^2, tanh, 0.5x, 1+tanh

__global__ void act_fwd_kernel(void *y, int ydt, const void *x, int dt, uint64_t n, int act, gelu_parts parts)
{
    GRID_STRIDE(i, n)
    {
        float v = ldf(x, dt, i);
        stf(y, ydt, i, mp_act_f(act, v));
        for (int j = 0; j < parts.n; j++)
            stf(parts.p[j], parts.dt[j], i, mp_gelu_part(act, j, v));
    }
}

__global__ void act_bwd_kernel(void *dx, int dxdt, const void *dy, int dydt, const void *saved, int sdt, uint64_t n,
                               int act, int overwrite)
{
    GRID_STRIDE(i, n)
    {
        float g = ldf(dy, dydt, i) * mp_act_df(act, ldf(saved, sdt, i));
        stf(dx, dxdt, i, overwrite ? g : ldf(dx, dxdt, i) + g);
    }
}

// Typed forms (ew_kernel ops) for fp32/bf16/fp16 operands without HF's intermediates.
template <typename Y, typename X> struct act_fwd_op {
    Y *y;
    const X *x;
    int act;
    template <int W> __device__ void run(uint64_t i) const
    {
        float v[W];
        vload<W>(x + i, v);
#pragma unroll
        for (int k = 0; k < W; k++)
            v[k] = mp_act_f(act, v[k]);
        vstore<W>(y + i, v);
    }
};

// dx (+)= dy * act'(saved); dx and dy of one type
template <typename T, typename S> struct act_bwd_op {
    T *dx;
    const T *dy;
    const S *saved;
    int act, overwrite;
    template <int W> __device__ void run(uint64_t i) const
    {
        float g[W], sv[W], acc[W];
        vload<W>(dy + i, g);
        vload<W>(saved + i, sv);
        if (!overwrite)
            vload<W>(dx + i, acc);
#pragma unroll
        for (int k = 0; k < W; k++) {
            float d = g[k] * mp_act_df(act, sv[k]);
            acc[k] = overwrite ? d : acc[k] + d;
        }
        vstore<W>(dx + i, acc);
    }
};

// ---- launchers ----------------------------------------------------------------------------

extern "C" int mp_k_act_fwd(void *y, int ydt, const void *x, int dt, uint64_t n, int act, void *const *parts,
                            const int *part_dts, int n_parts, cudaStream_t s)
{
    gelu_parts gp = {{0}, {0}, 0};
    if (n_parts < 0 || n_parts > 6 || (n_parts && (!parts || !part_dts)))
        return (int)cudaErrorInvalidValue;
    for (int j = 0; j < n_parts; j++) {
        gp.p[j] = parts[j];
        gp.dt[j] = part_dts[j];
    }
    gp.n = n_parts;
    int rc = -1;
    if (!n_parts)
        with_float_type(ydt, [&](auto *yp) {
            with_float_type(dt, [&](auto *xp) {
                using Y = ELEM_T(yp);
                using X = ELEM_T(xp);
                rc = ew_launch(act_fwd_op<Y, X>{(Y *)y, (const X *)x, act}, n, aligned16(y) && aligned16(x), s);
            });
        });
    if (rc >= 0)
        return rc;
    if (n)
        act_fwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, ydt, x, dt, n, act, gp);
    KCHECK();
}

extern "C" int mp_k_act_bwd(void *dx, int dxdt, const void *dy, int dydt, const void *saved, int sdt, uint64_t n,
                            int act, int overwrite, cudaStream_t s)
{
    if (!dx)
        return 0;
    int rc = -1;
    bool vec = aligned16(dx) && aligned16(dy) && aligned16(saved);
    if (dxdt == dydt)
        with_float_type(dxdt, [&](auto *tp) {
            with_float_type(sdt, [&](auto *sp) {
                using T = ELEM_T(tp);
                using S = ELEM_T(sp);
                rc = ew_launch(act_bwd_op<T, S>{(T *)dx, (const T *)dy, (const S *)saved, act, overwrite}, n, vec, s);
            });
        });
    if (rc >= 0)
        return rc;
    if (n)
        act_bwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(dx, dxdt, dy, dydt, saved, sdt, n, act, overwrite);
    KCHECK();
}
