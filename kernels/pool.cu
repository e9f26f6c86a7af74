// pool.cu — max pooling (with int64 argmax indices, as PyTorch saves), average
// pooling (count_include_pad: the whole kernel divides) and adaptive average
// pooling.  A thread per output element; backward scatters with atomics.
#include "kcommon.cuh"

// ---- kernels ------------------------------------------------------------------------------

__device__ __forceinline__ void window(const mp_k_pool &P, uint64_t oh, uint64_t ow, uint64_t *h0, uint64_t *h1,
                                       uint64_t *w0, uint64_t *w1)
{
    if (P.kind == MP_K_ADAPTIVE) {
        *h0 = oh * P.hi / P.ho;
        *h1 = ((oh + 1) * P.hi + P.ho - 1) / P.ho;
        *w0 = ow * P.wi / P.wo;
        *w1 = ((ow + 1) * P.wi + P.wo - 1) / P.wo;
        return;
    }
    uint64_t ys = oh * P.st, xs = ow * P.st, ye = ys + P.k, xe = xs + P.k;
    *h0 = ys > P.pad ? ys - P.pad : 0;
    *w0 = xs > P.pad ? xs - P.pad : 0;
    *h1 = ye > P.pad ? (ye - P.pad < P.hi ? ye - P.pad : P.hi) : 0;
    *w1 = xe > P.pad ? (xe - P.pad < P.wi ? xe - P.pad : P.wi) : 0;
}

__global__ void pool_fwd_kernel(void *y, const void *x, int dt, int64_t *idx, mp_k_pool P)
{
    uint64_t hwo = P.ho * P.wo, hwi = P.hi * P.wi;
    GRID_STRIDE(o, P.planes * hwo)
    {
        uint64_t pl = o / hwo, oh = (o % hwo) / P.wo, ow = o % P.wo, h0, h1, w0, w1, best = 0;
        window(P, oh, ow, &h0, &h1, &w0, &w1);
        float s = 0.0f, m = -INFINITY;
        for (uint64_t ih = h0; ih < h1; ih++)
            for (uint64_t iw = w0; iw < w1; iw++) {
                float v = ldf(x, dt, pl * hwi + ih * P.wi + iw);
                s += v;
                if (v > m || (ih == h0 && iw == w0)) {
                    m = v;
                    best = ih * P.wi + iw;
                }
            }
        if (P.kind == MP_K_MAXPOOL) {
            stf(y, dt, o, m);
            idx[o] = (int64_t)best;
        } else {
            float cnt = P.kind == MP_K_AVGPOOL ? (float)(P.k * P.k) : (float)((h1 - h0) * (w1 - w0));
            stf(y, dt, o, s / cnt);
        }
    }
}

__global__ void pool_bwd_kernel(void *dx, const void *dy, int dt, const int64_t *idx, mp_k_pool P)
{
    uint64_t hwo = P.ho * P.wo, hwi = P.hi * P.wi;
    GRID_STRIDE(o, P.planes * hwo)
    {
        uint64_t pl = o / hwo;
        float g = ldf(dy, dt, o);
        if (P.kind == MP_K_MAXPOOL) {
            atomic_accf(dx, dt, pl * hwi + (uint64_t)idx[o], g);
            continue;
        }
        uint64_t oh = (o % hwo) / P.wo, ow = o % P.wo, h0, h1, w0, w1;
        window(P, oh, ow, &h0, &h1, &w0, &w1);
        float cnt = P.kind == MP_K_AVGPOOL ? (float)(P.k * P.k) : (float)((h1 - h0) * (w1 - w0));
        for (uint64_t ih = h0; ih < h1; ih++)
            for (uint64_t iw = w0; iw < w1; iw++)
                atomic_accf(dx, dt, pl * hwi + ih * P.wi + iw, g / cnt);
    }
}

// ---- launchers ----------------------------------------------------------------------------

extern "C" int mp_k_pool_fwd(void *y, const void *x, int dt, int64_t *idx, const struct mp_k_pool *P, cudaStream_t s)
{
    uint64_t n = P->planes * P->ho * P->wo;
    if (n)
        pool_fwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, x, dt, idx, *P);
    KCHECK();
}

extern "C" int mp_k_pool_bwd(void *dx, const void *dy, int dt, const int64_t *idx, const struct mp_k_pool *P,
                             cudaStream_t s)
{
    uint64_t n = P->planes * P->ho * P->wo;
    if (n && dx)
        pool_bwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(dx, dy, dt, idx, *P);
    KCHECK();
}
