// norm.cu — LayerNorm (g NULL: no weight, OLMo), HF RMSNorm and training BatchNorm2d, forward and backward.
// Row norms: one block per row of n; parameter gradients by column with row
// chunks added atomically.  Batch norm: one block per channel over (B, HW).
#include "kcommon.cuh"

#define NORM_THREADS 256
#define COL_ROWS 256

// ---- kernels ------------------------------------------------------------------------------

__global__ void layernorm_fwd_kernel(void *y, const void *x, int dt, const void *g, const void *b, int pdt,
                                     float *mean, float *rstd, uint64_t n, float eps)
{
    uint64_t r = blockIdx.x, base = r * n;
    float s = 0.0f;
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x)
        s += ldf(x, dt, base + j);
    float mu = block_sum(s) / (float)n, v = 0.0f;
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float t = ldf(x, dt, base + j) - mu;
        v += t * t;
    }
    float rs = rsqrtf(block_sum(v) / (float)n + eps);
    if (threadIdx.x == 0) {
        mean[r] = mu;
        rstd[r] = rs;
    }
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x)
        stf(y, dt, base + j, (ldf(x, dt, base + j) - mu) * rs * (g ? ldf(g, pdt, j) : 1.0f) + (b ? ldf(b, pdt, j) : 0.0f));
}

__global__ void layernorm_dx_kernel(void *dx, const void *dy, const void *x, int dt, const float *mean,
                                    const float *rstd, const void *g, int pdt, uint64_t n)
{
    uint64_t r = blockIdx.x, base = r * n;
    float mu = mean[r], rs = rstd[r], a = 0.0f, bb = 0.0f;
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float xh = (ldf(x, dt, base + j) - mu) * rs, dxh = ldf(dy, dt, base + j) * (g ? ldf(g, pdt, j) : 1.0f);
        a += dxh;
        bb += dxh * xh;
    }
    a = block_sum(a) / (float)n;
    bb = block_sum(bb) / (float)n;
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float xh = (ldf(x, dt, base + j) - mu) * rs, dxh = ldf(dy, dt, base + j) * (g ? ldf(g, pdt, j) : 1.0f);
        accf(dx, dt, base + j, rs * (dxh - a - xh * bb));
    }
}

__global__ void layernorm_dgb_kernel(void *dg, void *db, int pdt, const void *dy, const void *x, int dt,
                                     const float *mean, const float *rstd, uint64_t rows, uint64_t n)
{
    uint64_t j = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    if (j >= n)
        return;
    uint64_t r0 = (uint64_t)blockIdx.y * COL_ROWS, r1 = r0 + COL_ROWS < rows ? r0 + COL_ROWS : rows;
    float sg = 0.0f, sb = 0.0f;
    for (uint64_t r = r0; r < r1; r++) {
        float d = ldf(dy, dt, r * n + j);
        sg += d * (ldf(x, dt, r * n + j) - mean[r]) * rstd[r];
        sb += d;
    }
    if (dg)
        atomic_accf(dg, pdt, j, sg);
    if (db)
        atomic_accf(db, pdt, j, sb);
}

__global__ void rmsnorm_fwd_kernel(void *y, int ydt, const void *x, int xdt, float *x32, float *rs, void *normed,
                                   const void *g, int pdt, uint64_t n, float eps)
{
    uint64_t r = blockIdx.x, base = r * n;
    float s = 0.0f;
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float v = ldf(x, xdt, base + j);
        s += v * v;
        if (x32)
            x32[base + j] = v;
    }
    float q = rsqrtf(block_sum(s) / (float)n + eps);
    if (threadIdx.x == 0)
        rs[r] = q;
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float nm = round_dt(xdt, ldf(x, xdt, base + j) * q);
        stf(normed, xdt, base + j, nm);
        stf(y, ydt, base + j, ldf(g, pdt, j) * nm);
    }
}

__global__ void rmsnorm_dx_kernel(void *dx, int xdt, const void *dy, int ydt, const void *xs, int xsdt,
                                  const float *rs, const void *g, int pdt, uint64_t n)
{
    uint64_t r = blockIdx.x, base = r * n;
    float q = rs[r], s = 0.0f;
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x)
        s += ldf(dy, ydt, base + j) * ldf(g, pdt, j) * ldf(xs, xsdt, base + j);
    float mean = block_sum(s) / (float)n, q3 = q * q * q;
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x)
        accf(dx, xdt, base + j, q * ldf(dy, ydt, base + j) * ldf(g, pdt, j) - ldf(xs, xsdt, base + j) * q3 * mean);
}

__global__ void rmsnorm_dg_kernel(void *dg, int pdt, const void *dy, int ydt, const void *normed, int xdt,
                                  uint64_t rows, uint64_t n)
{
    uint64_t j = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    if (j >= n)
        return;
    uint64_t r0 = (uint64_t)blockIdx.y * COL_ROWS, r1 = r0 + COL_ROWS < rows ? r0 + COL_ROWS : rows;
    float s = 0.0f;
    for (uint64_t r = r0; r < r1; r++)
        s += ldf(dy, ydt, r * n + j) * ldf(normed, xdt, r * n + j);
    atomic_accf(dg, pdt, j, s);
}

__global__ void batchnorm_fwd_kernel(void *y, const void *x, int dt, const void *g, const void *b, int pdt,
                                     float *mean, float *istd, uint64_t B, uint64_t C, uint64_t HW, float eps)
{
    uint64_t c = blockIdx.x, N = B * HW;
    float s = 0.0f;
    for (uint64_t e = threadIdx.x; e < N; e += blockDim.x)
        s += ldf(x, dt, ((e / HW) * C + c) * HW + e % HW);
    float mu = block_sum(s) / (float)N, v = 0.0f;
    for (uint64_t e = threadIdx.x; e < N; e += blockDim.x) {
        float t = ldf(x, dt, ((e / HW) * C + c) * HW + e % HW) - mu;
        v += t * t;
    }
    float is = rsqrtf(block_sum(v) / (float)N + eps), gc = ldf(g, pdt, c), bc = ldf(b, pdt, c);
    if (threadIdx.x == 0) {
        mean[c] = mu;
        istd[c] = is;
    }
    for (uint64_t e = threadIdx.x; e < N; e += blockDim.x) {
        uint64_t idx = ((e / HW) * C + c) * HW + e % HW;
        stf(y, dt, idx, (ldf(x, dt, idx) - mu) * is * gc + bc);
    }
}

__global__ void batchnorm_bwd_kernel(void *dx, void *dg, void *db, int pdt, const void *dy, const void *x, int dt,
                                     const float *mean, const float *istd, const void *g, uint64_t B, uint64_t C,
                                     uint64_t HW)
{
    uint64_t c = blockIdx.x, N = B * HW;
    float mu = mean[c], is = istd[c], sd = 0.0f, sdx = 0.0f;
    for (uint64_t e = threadIdx.x; e < N; e += blockDim.x) {
        uint64_t idx = ((e / HW) * C + c) * HW + e % HW;
        float d = ldf(dy, dt, idx);
        sd += d;
        sdx += d * (ldf(x, dt, idx) - mu) * is;
    }
    sd = block_sum(sd);
    sdx = block_sum(sdx);
    if (threadIdx.x == 0) {
        if (dg)
            accf(dg, pdt, c, sdx);
        if (db)
            accf(db, pdt, c, sd);
    }
    if (!dx)
        return;
    float k = ldf(g, pdt, c) * is / (float)N;
    for (uint64_t e = threadIdx.x; e < N; e += blockDim.x) {
        uint64_t idx = ((e / HW) * C + c) * HW + e % HW;
        float xh = (ldf(x, dt, idx) - mu) * is;
        accf(dx, dt, idx, k * ((float)N * ldf(dy, dt, idx) - sd - xh * sdx));
    }
}

// ---- launchers ----------------------------------------------------------------------------

static bool rows_ok(uint64_t rows) { return rows > 0 && rows <= 0x7fffffffull; }

extern "C" int mp_k_layernorm_fwd(void *y, const void *x, int dt, const void *g, const void *b, int pdt, float *mean,
                                  float *rstd, uint64_t rows, uint64_t n, float eps, cudaStream_t s)
{
    if (!rows_ok(rows))
        return rows ? (int)cudaErrorInvalidConfiguration : 0;
    layernorm_fwd_kernel<<<(unsigned)rows, NORM_THREADS, 0, s>>>(y, x, dt, g, b, pdt, mean, rstd, n, eps);
    KCHECK();
}

extern "C" int mp_k_layernorm_bwd(void *dx, void *dg, void *db, int pdt, const void *dy, const void *x, int dt,
                                  const float *mean, const float *rstd, const void *g, uint64_t rows, uint64_t n,
                                  cudaStream_t s)
{
    if (!rows_ok(rows))
        return rows ? (int)cudaErrorInvalidConfiguration : 0;
    if (dx)
        layernorm_dx_kernel<<<(unsigned)rows, NORM_THREADS, 0, s>>>(dx, dy, x, dt, mean, rstd, g, pdt, n);
    if (dg || db) {
        uint64_t chunks = CEIL_DIV(rows, (uint64_t)COL_ROWS);
        if (chunks > 65535)
            return (int)cudaErrorInvalidConfiguration;
        dim3 grid((unsigned)CEIL_DIV(n, (uint64_t)256), (unsigned)chunks);
        layernorm_dgb_kernel<<<grid, 256, 0, s>>>(dg, db, pdt, dy, x, dt, mean, rstd, rows, n);
    }
    KCHECK();
}

extern "C" int mp_k_rmsnorm_fwd(void *y, int ydt, const void *x, int xdt, float *x32, float *rs, void *normed,
                                const void *g, int pdt, uint64_t rows, uint64_t n, float eps, cudaStream_t s)
{
    if (!rows_ok(rows))
        return rows ? (int)cudaErrorInvalidConfiguration : 0;
    rmsnorm_fwd_kernel<<<(unsigned)rows, NORM_THREADS, 0, s>>>(y, ydt, x, xdt, x32, rs, normed, g, pdt, n, eps);
    KCHECK();
}

extern "C" int mp_k_rmsnorm_bwd(void *dx, int xdt, void *dg, int pdt, const void *dy, int ydt, const void *xs,
                                int xsdt, const float *rs, const void *normed, const void *g, uint64_t rows, uint64_t n,
                                cudaStream_t s)
{
    if (!rows_ok(rows))
        return rows ? (int)cudaErrorInvalidConfiguration : 0;
    if (dx)
        rmsnorm_dx_kernel<<<(unsigned)rows, NORM_THREADS, 0, s>>>(dx, xdt, dy, ydt, xs, xsdt, rs, g, pdt, n);
    if (dg) {
        uint64_t chunks = CEIL_DIV(rows, (uint64_t)COL_ROWS);
        if (chunks > 65535)
            return (int)cudaErrorInvalidConfiguration;
        dim3 grid((unsigned)CEIL_DIV(n, (uint64_t)256), (unsigned)chunks);
        rmsnorm_dg_kernel<<<grid, 256, 0, s>>>(dg, pdt, dy, ydt, normed, xdt, rows, n);
    }
    KCHECK();
}

extern "C" int mp_k_batchnorm_fwd(void *y, const void *x, int dt, const void *g, const void *b, int pdt, float *mean,
                                  float *istd, uint64_t B, uint64_t C, uint64_t HW, float eps, cudaStream_t s)
{
    if (!rows_ok(C) || !B || !HW)
        return 0;
    batchnorm_fwd_kernel<<<(unsigned)C, NORM_THREADS, 0, s>>>(y, x, dt, g, b, pdt, mean, istd, B, C, HW, eps);
    KCHECK();
}

extern "C" int mp_k_batchnorm_bwd(void *dx, void *dg, void *db, int pdt, const void *dy, const void *x, int dt,
                                  const float *mean, const float *istd, const void *g, uint64_t B, uint64_t C,
                                  uint64_t HW, cudaStream_t s)
{
    if (!rows_ok(C) || !B || !HW)
        return 0;
    batchnorm_bwd_kernel<<<(unsigned)C, NORM_THREADS, 0, s>>>(dx, dg, db, pdt, dy, x, dt, mean, istd, g, B, C, HW);
    KCHECK();
}
