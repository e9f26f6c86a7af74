// loss.cu — cross-entropy as log_softmax (saved) then mean NLL, each with its backward, and the
// implicit loss of models without a loss layer (0.5 * mean(y^2)).  Rows of
// logits: one block each; the mean is one block, so it is deterministic.
#include "kcommon.cuh"

// ---- kernels ------------------------------------------------------------------------------

__global__ void log_softmax_kernel(void *lp, int lp_dt, const void *logits, int dt, uint64_t V)
{
    uint64_t base = (uint64_t)blockIdx.x * V;
    float m = -INFINITY;
    for (uint64_t j = threadIdx.x; j < V; j += blockDim.x)
        m = fmaxf(m, ldf(logits, dt, base + j));
    m = block_max(m);
    float s = 0.0f;
    for (uint64_t j = threadIdx.x; j < V; j += blockDim.x)
        s += expf(ldf(logits, dt, base + j) - m);
    float lse = m + logf(block_sum(s));
    for (uint64_t j = threadIdx.x; j < V; j += blockDim.x)
        stf(lp, lp_dt, base + j, ldf(logits, dt, base + j) - lse);
}

// dz += g - exp(lp) * rowsum(g); one block per row
__global__ void log_softmax_bwd_kernel(void *dz, int dz_dt, const void *lp, int lp_dt, const void *g, int g_dt,
                                       uint64_t V)
{
    uint64_t base = (uint64_t)blockIdx.x * V;
    float s = 0.0f;
    for (uint64_t j = threadIdx.x; j < V; j += blockDim.x)
        s += ldf(g, g_dt, base + j);
    s = block_sum(s);
    for (uint64_t j = threadIdx.x; j < V; j += blockDim.x)
        accf(dz, dz_dt, base + j, ldf(g, g_dt, base + j) - expf(ldf(lp, lp_dt, base + j)) * s);
}

__global__ void nll_mean_kernel(float *loss, const void *lp, int lp_dt, const int64_t *labels, uint64_t M, uint64_t V)
{
    float s = 0.0f;
    for (uint64_t r = threadIdx.x; r < M; r += blockDim.x) {
        int64_t y = labels[r];
        if (y >= 0 && (uint64_t)y < V)
            s -= ldf(lp, lp_dt, r * V + (uint64_t)y);
    }
    s = block_sum(s);
    if (threadIdx.x == 0)
        *loss = s / (float)M;
}

// dlp[r, labels[r]] += -dloss / M
__global__ void nll_bwd_kernel(void *dlp, int dt, const int64_t *labels, const float *dloss, uint64_t M, uint64_t V)
{
    float g = dloss[0] / (float)M;
    GRID_STRIDE(r, M)
    {
        int64_t y = labels[r];
        if (y >= 0 && (uint64_t)y < V)
            accf(dlp, dt, r * V + (uint64_t)y, -g);
    }
}

__global__ void implicit_loss_kernel(float *loss, const void *y, int dt, uint64_t n)
{
    float s = 0.0f;
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = ldf(y, dt, i);
        s += dt == MP_DT_U8 || dt == MP_DT_I64 ? v : 0.5f * v * v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0)
        *loss = n ? s / ((dt == MP_DT_U8 || dt == MP_DT_I64 ? 255.0f : 1.0f) * (float)n) : 0.0f;
}

__global__ void implicit_grad_kernel(void *grad, const void *y, int dt, uint64_t n)
{
    GRID_STRIDE(i, n)
    {
        if (dt == MP_DT_U8)
            ((uint8_t *)grad)[i] = (uint8_t)(((const uint8_t *)y)[i] ^ 0x55);
        else if (dt != MP_DT_I64)
            stf(grad, dt, i, ldf(y, dt, i) / (float)n);
    }
}

// ---- launchers ----------------------------------------------------------------------------

extern "C" int mp_k_log_softmax_fwd(void *lp, int lp_dt, const void *logits, int dt, uint64_t M, uint64_t V,
                                    cudaStream_t s)
{
    if (!M || !V)
        return 0;
    if (M > 0x7fffffffull)
        return (int)cudaErrorInvalidConfiguration;
    log_softmax_kernel<<<(unsigned)M, 256, 0, s>>>(lp, lp_dt, logits, dt, V);
    KCHECK();
}

extern "C" int mp_k_log_softmax_bwd(void *dz, int dz_dt, const void *lp, int lp_dt, const void *g, int g_dt,
                                    uint64_t M, uint64_t V, cudaStream_t s)
{
    if (!dz || !M || !V)
        return 0;
    if (M > 0x7fffffffull)
        return (int)cudaErrorInvalidConfiguration;
    log_softmax_bwd_kernel<<<(unsigned)M, 256, 0, s>>>(dz, dz_dt, lp, lp_dt, g, g_dt, V);
    KCHECK();
}

extern "C" int mp_k_nll_fwd(float *loss, const void *lp, int lp_dt, const int64_t *labels, uint64_t M, uint64_t V,
                            cudaStream_t s)
{
    if (!M || !V)
        return 0;
    nll_mean_kernel<<<1, 1024, 0, s>>>(loss, lp, lp_dt, labels, M, V);
    KCHECK();
}

extern "C" int mp_k_nll_bwd(void *dlp, int dt, const int64_t *labels, const float *dloss, uint64_t M, uint64_t V,
                            cudaStream_t s)
{
    if (dlp && M)
        nll_bwd_kernel<<<grid_for(M, 256), 256, 0, s>>>(dlp, dt, labels, dloss, M, V);
    KCHECK();
}

extern "C" int mp_k_implicit_loss(float *loss, void *grad, const void *y, int dt, uint64_t n, cudaStream_t s)
{
    implicit_loss_kernel<<<1, 1024, 0, s>>>(loss, y, dt, n);
    if (grad && n)
        implicit_grad_kernel<<<grid_for(n, 256), 256, 0, s>>>(grad, y, dt, n);
    KCHECK();
}
