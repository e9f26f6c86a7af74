// optim.cu — optimizer updates on the parameter, gradient and state storages the
// replay allocated: SGD, SGD with momentum, Adam/AdamW (the _foreach_sqrt
// temporary written as PyTorch writes it), blockwise 8-bit Adam and
// torch.optim.Adafactor.  Same arithmetic as probe_host_optim.c; hyper-parameters
// come from the caller (src/probe/probe_impl.h).
#include "kcommon.cuh"

#define A8_BLOCK MP_ADAM8_BLOCK

// ---- kernels ------------------------------------------------------------------------------

__global__ void sgd_kernel(void *p, const void *g, int dt, uint64_t n, float lr)
{
    GRID_STRIDE(i, n) stf(p, dt, i, ldf(p, dt, i) - lr * ldf(g, dt, i));
}

__global__ void sgd_momentum_kernel(void *p, const void *g, void *buf, int dt, uint64_t n, float lr, float mom,
                                    int first)
{
    GRID_STRIDE(i, n)
    {
        float gi = ldf(g, dt, i);
        stf(buf, dt, i, first ? gi : mom * ldf(buf, dt, i) + gi);
        stf(p, dt, i, ldf(p, dt, i) - lr * ldf(buf, dt, i));
    }
}

__global__ void adam_kernel(void *p, const void *g, int dt, void *m, void *v, int sdt, void *den, uint64_t n, float lr,
                            float b1, float b2, float eps, float wd, float bc1, float bc2)
{
    float sbc2 = sqrtf(bc2);
    GRID_STRIDE(i, n)
    {
        float pi = ldf(p, dt, i), gi = ldf(g, dt, i);
        if (wd > 0.0f)
            pi *= 1.0f - lr * wd;
        stf(m, sdt, i, b1 * ldf(m, sdt, i) + (1.0f - b1) * gi);
        stf(v, sdt, i, b2 * ldf(v, sdt, i) + (1.0f - b2) * gi * gi);
        float d = sqrtf(ldf(v, sdt, i)) / sbc2 + eps;
        if (den) {
            stf(den, dt, i, d);
            d = ldf(den, dt, i);
        }
        stf(p, dt, i, pi - lr / bc1 * ldf(m, sdt, i) / d);
    }
}

// Companded 8-bit codes: mp_q8_* in src/probe/mp_math.h (shared with probe_host_optim.c).

// One block of A8_BLOCK threads per quantization block.  The absmax arrays sit at
// byte offsets 2n and 2n + 4nb, not necessarily 4-aligned: memcpy.
__global__ void adam8_kernel(void *p, const void *g, int dt, uint8_t *st, uint64_t n, float lr, float b1, float b2,
                             float eps, float bc1, float bc2)
{
    uint64_t nb = CEIL_DIV(n, (uint64_t)A8_BLOCK), blk = blockIdx.x, i = blk * A8_BLOCK + threadIdx.x;
    uint8_t *qm = st, *qv = st + n, *am = st + 2 * n, *av = st + 2 * n + 4 * nb;
    float ma, va;
    memcpy(&ma, am + 4 * blk, 4);
    memcpy(&va, av + 4 * blk, 4);
    bool on = i < n;
    float mi = 0.0f, vi = 0.0f;
    if (on) {
        float gi = ldf(g, dt, i);
        mi = b1 * mp_q8_m_dec(qm[i], ma) + (1.0f - b1) * gi;
        vi = b2 * mp_q8_v_dec(qv[i], va) + (1.0f - b2) * gi * gi;
        stf(p, dt, i, ldf(p, dt, i) - lr / bc1 * mi / (sqrtf(vi) / sqrtf(bc2) + eps));
    }
    float nm = block_max(on ? fabsf(mi) : 0.0f), nv = block_max(on ? vi : 0.0f);
    if (on) {
        qm[i] = mp_q8_m_enc(mi, nm);
        qv[i] = mp_q8_v_enc(vi, nv);
    }
    if (threadIdx.x == 0) {
        memcpy(am + 4 * blk, &nm, 4);
        memcpy(av + 4 * blk, &nv, 4);
    }
}

__global__ void sumsq_kernel(float *out, const void *x, int dt, uint64_t n)
{
    float s = 0.0f;
    GRID_STRIDE(i, n)
    {
        float v = ldf(x, dt, i);
        s += v * v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0)
        atomicAdd(out, s);
}

// Row factors: one block per row; scratch[1] += the updated row factors (their mean later).
__global__ void af_rows_kernel(void *S, const void *g, int dt, uint64_t C, float b2, float *scratch)
{
    uint64_t r = blockIdx.x;
    float s = 0.0f;
    for (uint64_t j = threadIdx.x; j < C; j += blockDim.x) {
        float v = ldf(g, dt, r * C + j);
        s += v * v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) {
        float rv = ldf(S, dt, r);
        stf(S, dt, r, rv + b2 * (s / (float)C - rv));
        atomicAdd(scratch + 1, ldf(S, dt, r));
    }
}

__global__ void af_cols_kernel(void *S, const void *g, int dt, uint64_t R, uint64_t C, float b2)
{
    GRID_STRIDE(j, C)
    {
        float s = 0.0f;
        for (uint64_t r = 0; r < R; r++) {
            float v = ldf(g, dt, r * C + j);
            s += v * v;
        }
        float cv = ldf(S, dt, R + j);
        stf(S, dt, R + j, cv + b2 * (s / (float)R - cv));
    }
}

// est = factored (or full) variance, then the update g/sqrt(est) into the same
// temporary; scratch[2] += its squares.
__global__ void af_update_vec_kernel(void *est, void *S, const void *g, int dt, uint64_t R, uint64_t C, int matrix,
                                     float b2, float eps1, float *scratch)
{
    uint64_t n = matrix ? R * C : C;
    float denom = matrix ? fmaxf(scratch[1] / (float)R, eps1) : 1.0f, s = 0.0f;
    GRID_STRIDE(i, n)
    {
        float gi = ldf(g, dt, i), e;
        if (matrix) {
            e = ldf(S, dt, i / C) * ldf(S, dt, R + i % C) / denom;
        } else {
            float v = ldf(S, dt, i);
            stf(S, dt, i, v + b2 * (gi * gi - v));
            e = ldf(S, dt, i);
        }
        stf(est, dt, i, e);
        stf(est, dt, i, gi / sqrtf(fmaxf(ldf(est, dt, i), eps1 * eps1)));
        float u = ldf(est, dt, i);
        s += u * u;
    }
    s = block_sum(s);
    if (threadIdx.x == 0)
        atomicAdd(scratch + 2, s);
}

__global__ void af_apply_kernel(void *p, const void *est, int dt, uint64_t n, float rho, float eps2,
                                const float *scratch)
{
    float alpha = fmaxf(eps2, sqrtf(scratch[0] / (float)n)) * rho;
    float den = fmaxf(1.0f, sqrtf(scratch[2]) / sqrtf((float)n));
    GRID_STRIDE(i, n) stf(p, dt, i, ldf(p, dt, i) - alpha / den * ldf(est, dt, i));
}

// ---- launchers ----------------------------------------------------------------------------

extern "C" int mp_k_sgd(void *p, const void *g, int dt, uint64_t n, float lr, cudaStream_t s)
{
    if (n)
        sgd_kernel<<<grid_for(n, 256), 256, 0, s>>>(p, g, dt, n, lr);
    KCHECK();
}

extern "C" int mp_k_sgd_momentum(void *p, const void *g, void *buf, int dt, uint64_t n, float lr, float mom, int first,
                                 cudaStream_t s)
{
    if (n)
        sgd_momentum_kernel<<<grid_for(n, 256), 256, 0, s>>>(p, g, buf, dt, n, lr, mom, first);
    KCHECK();
}

extern "C" int mp_k_adam(void *p, const void *g, int dt, void *m, void *v, int sdt, void *den, uint64_t n, float lr,
                         float b1, float b2, float eps, float wd, float bc1, float bc2, cudaStream_t s)
{
    if (n)
        adam_kernel<<<grid_for(n, 256), 256, 0, s>>>(p, g, dt, m, v, sdt, den, n, lr, b1, b2, eps, wd, bc1, bc2);
    KCHECK();
}

extern "C" int mp_k_adam8(void *p, const void *g, int dt, uint8_t *state, uint64_t n, float lr, float b1, float b2,
                          float eps, float bc1, float bc2, cudaStream_t s)
{
    uint64_t nb = CEIL_DIV(n, (uint64_t)A8_BLOCK);
    if (!n)
        return 0;
    if (nb > 0x7fffffffull)
        return (int)cudaErrorInvalidConfiguration;
    adam8_kernel<<<(unsigned)nb, A8_BLOCK, 0, s>>>(p, g, dt, state, n, lr, b1, b2, eps, bc1, bc2);
    KCHECK();
}

extern "C" int mp_k_adafactor(void *p, const void *g, int dt, void *state, void *est, uint64_t rows, uint64_t cols,
                              int matrix, float *scratch, float b2, float rho, float eps1, float eps2, cudaStream_t s)
{
    uint64_t n = matrix ? rows * cols : cols;
    if (!n)
        return 0;
    if (matrix && rows > 0x7fffffffull)
        return (int)cudaErrorInvalidConfiguration;
    cudaError_t e = cudaMemsetAsync(scratch, 0, 4 * sizeof(float), s);
    if (e != cudaSuccess)
        return (int)e;
    sumsq_kernel<<<grid_for(n, 256), 256, 0, s>>>(scratch, p, dt, n);
    if (matrix) {
        af_rows_kernel<<<(unsigned)rows, 256, 0, s>>>(state, g, dt, cols, b2, scratch);
        af_cols_kernel<<<grid_for(cols, 256), 256, 0, s>>>(state, g, dt, rows, cols, b2);
    }
    af_update_vec_kernel<<<grid_for(n, 256), 256, 0, s>>>(est, state, g, dt, matrix ? rows : 1, matrix ? cols : n,
                                                           matrix, b2, eps1, scratch);
    af_apply_kernel<<<grid_for(n, 256), 256, 0, s>>>(p, est, dt, n, rho, eps2, scratch);
    KCHECK();
}
