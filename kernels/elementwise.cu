// elementwise.cu — fill, convert/accumulate, scale, add, mul, dropout, bias broadcast and
// bias gradients.  Kernels, then launchers (llm.c's layout).  Shapes in kernels.h.
#include "kcommon.cuh"

// ---- kernels ------------------------------------------------------------------------------

__global__ void fill_kernel(void *dst, int dt, float v, uint64_t n)
{
    GRID_STRIDE(i, n) stf(dst, dt, i, v);
}

__global__ void convert_kernel(void *dst, int ddt, const void *src, int sdt, uint64_t n, int acc)
{
    GRID_STRIDE(i, n)
    {
        float v = ldf(src, sdt, i);
        stf(dst, ddt, i, acc ? ldf(dst, ddt, i) + v : v);
    }
}

__global__ void scale_kernel(void *dst, int ddt, const void *src, int sdt, uint64_t n, float a, int acc)
{
    GRID_STRIDE(i, n)
    {
        float v = a * ldf(src, sdt, i);
        stf(dst, ddt, i, acc ? ldf(dst, ddt, i) + v : v);
    }
}

__global__ void add_kernel(void *y, int ydt, const void *a, int adt, const void *b, int bdt, uint64_t n)
{
    GRID_STRIDE(i, n) stf(y, ydt, i, ldf(a, adt, i) + ldf(b, bdt, i));
}

__global__ void mul_fwd_kernel(void *y, const void *a, const void *b, int dt, uint64_t n)
{
    GRID_STRIDE(i, n) stf(y, dt, i, ldf(a, dt, i) * ldf(b, dt, i));
}

__global__ void mul_bwd_kernel(void *da, void *db, const void *dy, const void *a, const void *b, int dt, uint64_t n)
{
    GRID_STRIDE(i, n)
    {
        float g = ldf(dy, dt, i);
        if (da)
            accf(da, dt, i, g * ldf(b, dt, i));
        if (db)
            accf(db, dt, i, g * ldf(a, dt, i));
    }
}

__global__ void dropout_fwd_kernel(void *y, const void *x, int dt, uint8_t *mask, uint64_t n, float p, uint64_t key)
{
    float sc = 1.0f / (1.0f - p);
    GRID_STRIDE(i, n)
    {
        uint8_t keep = khash_unit(key + i) >= p;
        mask[i] = keep;
        stf(y, dt, i, keep ? ldf(x, dt, i) * sc : 0.0f);
    }
}

__global__ void dropout_bwd_kernel(void *dx, const void *dy, int dt, const uint8_t *mask, uint64_t n, float p)
{
    float sc = 1.0f / (1.0f - p);
    GRID_STRIDE(i, n) if (mask[i]) accf(dx, dt, i, ldf(dy, dt, i) * sc);
}

__global__ void bias_fill_kernel(void *y, int ydt, const void *bias, int bdt, uint64_t c, uint64_t inner, uint64_t n)
{
    GRID_STRIDE(i, n) stf(y, ydt, i, ldf(bias, bdt, (i / inner) % c));
}

// One block per (channel j, chunk of outer rows); partial sums added atomically.
#define BIAS_ROWS 256
__global__ void bias_grad_kernel(void *db, int bdt, const void *dy, int dt, uint64_t outer, uint64_t c,
                                 uint64_t inner)
{
    uint64_t j = blockIdx.x, o0 = (uint64_t)blockIdx.y * BIAS_ROWS, o1 = o0 + BIAS_ROWS < outer ? o0 + BIAS_ROWS : outer;
    float s = 0.0f;
    for (uint64_t o = o0; o < o1; o++)
        for (uint64_t i = threadIdx.x; i < inner; i += blockDim.x)
            s += ldf(dy, dt, (o * c + j) * inner + i);
    s = block_sum(s);
    if (threadIdx.x == 0)
        atomic_accf(db, bdt, j, s);
}

// Linear biases: inner == 1, so threads stride over columns instead.
__global__ void bias_grad_cols_kernel(void *db, int bdt, const void *dy, int dt, uint64_t outer, uint64_t c)
{
    uint64_t j = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    if (j >= c)
        return;
    uint64_t o0 = (uint64_t)blockIdx.y * BIAS_ROWS, o1 = o0 + BIAS_ROWS < outer ? o0 + BIAS_ROWS : outer;
    float s = 0.0f;
    for (uint64_t o = o0; o < o1; o++)
        s += ldf(dy, dt, o * c + j);
    atomic_accf(db, bdt, j, s);
}

// ---- launchers ----------------------------------------------------------------------------

extern "C" int mp_k_fill(void *dst, int dt, float v, uint64_t n, cudaStream_t s)
{
    if (n)
        fill_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, dt, v, n);
    KCHECK();
}

extern "C" int mp_k_convert(void *dst, int ddt, const void *src, int sdt, uint64_t n, int accumulate, cudaStream_t s)
{
    if (n)
        convert_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, ddt, src, sdt, n, accumulate);
    KCHECK();
}

extern "C" int mp_k_scale(void *dst, int ddt, const void *src, int sdt, uint64_t n, float a, int accumulate,
                          cudaStream_t s)
{
    if (n)
        scale_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, ddt, src, sdt, n, a, accumulate);
    KCHECK();
}

extern "C" int mp_k_add(void *y, int ydt, const void *a, int adt, const void *b, int bdt, uint64_t n, cudaStream_t s)
{
    if (n)
        add_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, ydt, a, adt, b, bdt, n);
    KCHECK();
}

extern "C" int mp_k_mul_fwd(void *y, const void *a, const void *b, int dt, uint64_t n, cudaStream_t s)
{
    if (n)
        mul_fwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, a, b, dt, n);
    KCHECK();
}

extern "C" int mp_k_mul_bwd(void *da, void *db, const void *dy, const void *a, const void *b, int dt, uint64_t n,
                            cudaStream_t s)
{
    if (n && (da || db))
        mul_bwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(da, db, dy, a, b, dt, n);
    KCHECK();
}

extern "C" int mp_k_dropout_fwd(void *y, const void *x, int dt, uint8_t *mask, uint64_t n, float p, uint64_t key,
                                cudaStream_t s)
{
    if (n)
        dropout_fwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, x, dt, mask, n, p, key);
    KCHECK();
}

extern "C" int mp_k_dropout_bwd(void *dx, const void *dy, int dt, const uint8_t *mask, uint64_t n, float p,
                                cudaStream_t s)
{
    if (n && dx)
        dropout_bwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(dx, dy, dt, mask, n, p);
    KCHECK();
}

extern "C" int mp_k_bias_fill(void *y, int ydt, const void *bias, int bdt, uint64_t outer, uint64_t c, uint64_t inner,
                              cudaStream_t s)
{
    uint64_t n = outer * c * inner;
    if (n)
        bias_fill_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, ydt, bias, bdt, c, inner, n);
    KCHECK();
}

extern "C" int mp_k_bias_grad(void *db, int bdt, const void *dy, int dt, uint64_t outer, uint64_t c, uint64_t inner,
                              cudaStream_t s)
{
    if (!db || !outer || !c || !inner)
        return 0;
    uint64_t chunks = CEIL_DIV(outer, (uint64_t)BIAS_ROWS);
    if (chunks > 65535)
        return (int)cudaErrorInvalidConfiguration;
    if (inner == 1) {
        dim3 grid((unsigned)CEIL_DIV(c, (uint64_t)256), (unsigned)chunks);
        bias_grad_cols_kernel<<<grid, 256, 0, s>>>(db, bdt, dy, dt, outer, c);
    } else {
        if (c > 0x7fffffffull)
            return (int)cudaErrorInvalidConfiguration;
        dim3 grid((unsigned)c, (unsigned)chunks);
        bias_grad_kernel<<<grid, 256, 0, s>>>(db, bdt, dy, dt, outer, c, inner);
    }
    KCHECK();
}
