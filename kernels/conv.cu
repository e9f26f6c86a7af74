// conv.cu — im2col and col2im for convolution as GEMMs (probe/cuda/probe_cuda_conv.c calls
// cuBLAS between them).  NCHW input; a column block covers one sample, one
// group and a range of output pixels, so the column buffer stays bounded.
// Kc = (ci/g)*k*k rows; row kc = (channel, kh, kw); column = output pixel.
#include "kcommon.cuh"

// ---- kernels ------------------------------------------------------------------------------

// Input element under output pixel p, tap kc; false in the padding.
__device__ __forceinline__ bool conv_src(const mp_k_conv &C, uint64_t bi, uint64_t grp, uint64_t kc, uint64_t p,
                                         uint64_t *xi)
{
    uint64_t kk = C.k * C.k, ci = kc / kk, kh = (kc / C.k) % C.k, kw = kc % C.k;
    uint64_t oh = p / C.wo, ow = p % C.wo;
    uint64_t y = oh * C.st + kh, x = ow * C.st + kw;
    if (y < C.pad || x < C.pad || y - C.pad >= C.hi || x - C.pad >= C.wi)
        return false;
    uint64_t c = grp * (C.ci / C.g) + ci;
    *xi = ((bi * C.ci + c) * C.hi + (y - C.pad)) * C.wi + (x - C.pad);
    return true;
}

__global__ void im2col_kernel(void *col, const void *x, int dt, mp_k_conv C, uint64_t bi, uint64_t grp, uint64_t p0,
                              uint64_t pc, uint64_t kc_n)
{
    GRID_STRIDE(idx, kc_n * pc)
    {
        uint64_t kc = idx / pc, pp = idx % pc, xi;
        stf(col, dt, idx, conv_src(C, bi, grp, kc, p0 + pp, &xi) ? ldf(x, dt, xi) : 0.0f);
    }
}

__global__ void col2im_kernel(void *dx, int dt, const float *dcol, mp_k_conv C, uint64_t bi, uint64_t grp,
                              uint64_t p0, uint64_t pc, uint64_t kc_n)
{
    GRID_STRIDE(idx, kc_n * pc)
    {
        uint64_t kc = idx / pc, pp = idx % pc, xi;
        if (conv_src(C, bi, grp, kc, p0 + pp, &xi))
            atomic_accf(dx, dt, xi, dcol[idx]);
    }
}

// ---- launchers ----------------------------------------------------------------------------

extern "C" int mp_k_im2col(void *col, const void *x, int dt, const struct mp_k_conv *C, uint64_t bi, uint64_t grp,
                           uint64_t p0, uint64_t pc, cudaStream_t s)
{
    uint64_t kc = C->ci / C->g * C->k * C->k;
    if (kc * pc)
        im2col_kernel<<<grid_for(kc * pc, 256), 256, 0, s>>>(col, x, dt, *C, bi, grp, p0, pc, kc);
    KCHECK();
}

extern "C" int mp_k_col2im(void *dx, int dt, const float *dcol, const struct mp_k_conv *C, uint64_t bi, uint64_t grp,
                           uint64_t p0, uint64_t pc, cudaStream_t s)
{
    uint64_t kc = C->ci / C->g * C->k * C->k;
    if (kc * pc)
        col2im_kernel<<<grid_for(kc * pc, 256), 256, 0, s>>>(dx, dt, dcol, *C, bi, grp, p0, pc, kc);
    KCHECK();
}
