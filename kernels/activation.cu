// activation.cu — GELU (erf and tanh forms), ReLU, SiLU, tanh, sigmoid: forward
// and backward from the tensor autograd saves (x or y, memory-facts §2).  HF's
// Python GELUs (new, fast) compute tanh-GELU and also write their intermediates.
#include "kcommon.cuh"

// ---- kernels ------------------------------------------------------------------------------

__device__ __forceinline__ float act_f(int a, float x)
{
    switch (a) {
    case MP_K_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118f));
    case MP_K_GELU_TANH:
    case MP_K_GELU_NEW:
    case MP_K_GELU_FAST: return 0.5f * x * (1.0f + tanhf(0.79788456080f * (x + 0.044715f * x * x * x)));
    case MP_K_RELU: return x > 0.0f ? x : 0.0f;
    case MP_K_SILU: return x / (1.0f + expf(-x));
    case MP_K_TANH: return tanhf(x);
    case MP_K_SIGMOID: return 1.0f / (1.0f + expf(-x));
    }
    return x;
}

__device__ __forceinline__ float act_df(int a, float s)
{
    switch (a) {
    case MP_K_GELU: return 0.5f * (1.0f + erff(s * 0.70710678118f)) + s * 0.39894228040f * expf(-0.5f * s * s);
    case MP_K_GELU_TANH:
    case MP_K_GELU_NEW:
    case MP_K_GELU_FAST: {
        float u = 0.79788456080f * (s + 0.044715f * s * s * s), t = tanhf(u);
        return 0.5f * (1.0f + t) + 0.5f * s * (1.0f - t * t) * 0.79788456080f * (1.0f + 3.0f * 0.044715f * s * s);
    }
    case MP_K_RELU: return s > 0.0f ? 1.0f : 0.0f;
    case MP_K_SILU: {
        float sg = 1.0f / (1.0f + expf(-s));
        return sg * (1.0f + s * (1.0f - sg));
    }
    case MP_K_TANH: return 1.0f - s * s;
    case MP_K_SIGMOID: return s * (1.0f - s);
    }
    return 1.0f;
}

struct gelu_parts {
    void *p[6];
    int dt[6];
    int n;
};

// new: tanh, 0.5x, 1+tanh; fast: 0.044715x, 0.7978845608x, 1+0.044715x^2, tanh, 0.5x, 1+tanh
__device__ __forceinline__ float gelu_part(int act, int j, float x)
{
    float t = tanhf(0.79788456080f * x * (1.0f + 0.044715f * x * x));
    switch (act == MP_K_GELU_FAST ? j : j + 3) {
    case 0: return 0.044715f * x;
    case 1: return 0.79788456080f * x;
    case 2: return 1.0f + 0.044715f * x * x;
    case 3: return t;
    case 4: return 0.5f * x;
    default: return 1.0f + t;
    }
}

__global__ void act_fwd_kernel(void *y, int ydt, const void *x, int dt, uint64_t n, int act, gelu_parts parts)
{
    GRID_STRIDE(i, n)
    {
        float v = ldf(x, dt, i);
        stf(y, ydt, i, act_f(act, v));
        for (int j = 0; j < parts.n; j++)
            stf(parts.p[j], parts.dt[j], i, gelu_part(act, j, v));
    }
}

__global__ void act_bwd_kernel(void *dx, int dxdt, const void *dy, int dydt, const void *saved, int sdt, uint64_t n,
                               int act, int overwrite)
{
    GRID_STRIDE(i, n)
    {
        float g = ldf(dy, dydt, i) * act_df(act, ldf(saved, sdt, i));
        stf(dx, dxdt, i, overwrite ? g : ldf(dx, dxdt, i) + g);
    }
}

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
    if (n)
        act_fwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, ydt, x, dt, n, act, gp);
    KCHECK();
}

extern "C" int mp_k_act_bwd(void *dx, int dxdt, const void *dy, int dydt, const void *saved, int sdt, uint64_t n,
                            int act, int overwrite, cudaStream_t s)
{
    if (n && dx)
        act_bwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(dx, dxdt, dy, dydt, saved, sdt, n, act, overwrite);
    KCHECK();
}
