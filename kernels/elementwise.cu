// elementwise.cu — fill, convert/accumulate, scale, add, mul, dropout, bias broadcast and
// bias gradients.  Kernels, then launchers (llm.c's layout).  Shapes in kernels.h.
// convert, add, mul and dropout on fp32/bf16/fp16 run as one template per op (the types
// chosen once by the launcher, 16-byte vector loads: kcommon.cuh ew_kernel); the generic
// kernels with a dtype switch per element remain for other type mixes (int64, bytes).
#include "kcommon.cuh"

// ---- typed kernels (ew_kernel ops: run<W>(i) handles elements [i, i + W)) --------------------

template <typename Y, typename X> struct convert_op {
    Y *dst;
    const X *src;
    int acc;
    template <int W> __device__ void run(uint64_t i) const
    {
        float a[W], y[W];
        vload<W>(src + i, a);
        if (acc) {
            vload<W>(dst + i, y);
#pragma unroll
            for (int k = 0; k < W; k++)
                a[k] += y[k];
        }
        vstore<W>(dst + i, a);
    }
};

struct plus_f {
    __device__ static float apply(float u, float v) { return u + v; }
};
struct times_f {
    __device__ static float apply(float u, float v) { return u * v; }
};

// y = a (+ or *) b, a and b of one type
template <typename Y, typename T, typename F> struct binary_op {
    Y *y;
    const T *a, *b;
    template <int W> __device__ void run(uint64_t i) const
    {
        float u[W], v[W];
        vload<W>(a + i, u);
        vload<W>(b + i, v);
#pragma unroll
        for (int k = 0; k < W; k++)
            u[k] = F::apply(u[k], v[k]);
        vstore<W>(y + i, u);
    }
};

// acc[i..i+W) += g * other[i..i+W), in acc's type
template <int W, typename T> __device__ __forceinline__ void add_product(T *acc, const float (&g)[W], const T *other)
{
    float o[W], a[W];
    vload<W>(other, o);
    vload<W>(acc, a);
#pragma unroll
    for (int k = 0; k < W; k++)
        a[k] += g[k] * o[k];
    vstore<W>(acc, a);
}

// da += dy * b, db += dy * a (either may be NULL)
template <typename T> struct mul_bwd_op {
    T *da, *db;
    const T *dy, *a, *b;
    template <int W> __device__ void run(uint64_t i) const
    {
        float g[W];
        vload<W>(dy + i, g);
        if (da)
            add_product<W>(da + i, g, b + i);
        if (db)
            add_product<W>(db + i, g, a + i);
    }
};

template <typename T> struct dropout_fwd_op {
    T *y;
    const T *x;
    uint8_t *mask;
    float p, sc;
    uint64_t key;
    template <int W> __device__ void run(uint64_t i) const
    {
        float v[W];
        vload<W>(x + i, v);
#pragma unroll
        for (int k = 0; k < W; k++) {
            uint8_t keep = khash_unit(key + i + k) >= p;
            mask[i + k] = keep;
            v[k] = keep ? v[k] * sc : 0.0f;
        }
        vstore<W>(y + i, v);
    }
};

// dx += dy / (1-p) where kept (dropped elements of dx are rewritten unchanged)
template <typename T> struct dropout_bwd_op {
    T *dx;
    const T *dy;
    const uint8_t *mask;
    float sc;
    template <int W> __device__ void run(uint64_t i) const
    {
        float g[W], acc[W];
        vload<W>(dy + i, g);
        vload<W>(dx + i, acc);
#pragma unroll
        for (int k = 0; k < W; k++)
            if (mask[i + k])
                acc[k] += g[k] * sc;
        vstore<W>(dx + i, acc);
    }
};

// ---- generic kernels (a dtype switch per element) -------------------------------------------

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
    int rc = -1;
    bool vec = aligned16(dst) && aligned16(src);
    with_float_type(ddt, [&](auto *y) {
        with_float_type(sdt, [&](auto *x) {
            using Y = ELEM_T(y);
            using X = ELEM_T(x);
            rc = ew_launch(convert_op<Y, X>{(Y *)dst, (const X *)src, accumulate}, n, vec, s);
        });
    });
    if (rc >= 0)
        return rc;
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
    int rc = -1;
    bool vec = aligned16(y) && aligned16(a) && aligned16(b);
    if (adt == bdt)
        with_float_type(ydt, [&](auto *yp) {
            with_float_type(adt, [&](auto *ap) {
                using Y = ELEM_T(yp);
                using T = ELEM_T(ap);
                rc = ew_launch(binary_op<Y, T, plus_f>{(Y *)y, (const T *)a, (const T *)b}, n, vec, s);
            });
        });
    if (rc >= 0)
        return rc;
    if (n)
        add_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, ydt, a, adt, b, bdt, n);
    KCHECK();
}

extern "C" int mp_k_mul_fwd(void *y, const void *a, const void *b, int dt, uint64_t n, cudaStream_t s)
{
    int rc = -1;
    bool vec = aligned16(y) && aligned16(a) && aligned16(b);
    with_float_type(dt, [&](auto *p) {
        using T = ELEM_T(p);
        rc = ew_launch(binary_op<T, T, times_f>{(T *)y, (const T *)a, (const T *)b}, n, vec, s);
    });
    if (rc >= 0)
        return rc;
    if (n)
        mul_fwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, a, b, dt, n);
    KCHECK();
}

extern "C" int mp_k_mul_bwd(void *da, void *db, const void *dy, const void *a, const void *b, int dt, uint64_t n,
                            cudaStream_t s)
{
    if (!da && !db)
        return 0;
    int rc = -1;
    bool vec = aligned16(da) && aligned16(db) && aligned16(dy) && aligned16(a) && aligned16(b);
    with_float_type(dt, [&](auto *p) {
        using T = ELEM_T(p);
        rc = ew_launch(mul_bwd_op<T>{(T *)da, (T *)db, (const T *)dy, (const T *)a, (const T *)b}, n, vec, s);
    });
    if (rc >= 0)
        return rc;
    if (n)
        mul_bwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(da, db, dy, a, b, dt, n);
    KCHECK();
}

extern "C" int mp_k_dropout_fwd(void *y, const void *x, int dt, uint8_t *mask, uint64_t n, float p, uint64_t key,
                                cudaStream_t s)
{
    int rc = -1;
    bool vec = aligned16(y) && aligned16(x);
    with_float_type(dt, [&](auto *ptr) {
        using T = ELEM_T(ptr);
        rc = ew_launch(dropout_fwd_op<T>{(T *)y, (const T *)x, mask, p, 1.0f / (1.0f - p), key}, n, vec, s);
    });
    if (rc >= 0)
        return rc;
    if (n)
        dropout_fwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, x, dt, mask, n, p, key);
    KCHECK();
}

extern "C" int mp_k_dropout_bwd(void *dx, const void *dy, int dt, const uint8_t *mask, uint64_t n, float p,
                                cudaStream_t s)
{
    if (!dx)
        return 0;
    int rc = -1;
    bool vec = aligned16(dx) && aligned16(dy);
    with_float_type(dt, [&](auto *ptr) {
        using T = ELEM_T(ptr);
        rc = ew_launch(dropout_bwd_op<T>{(T *)dx, (const T *)dy, mask, 1.0f / (1.0f - p)}, n, vec, s);
    });
    if (rc >= 0)
        return rc;
    if (n)
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
