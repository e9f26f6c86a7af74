// quant.cu — bitsandbytes NF4 dequantization into the node's temporary (dequantize_4bit):
// one thread per element, the block's absmax read (and, with double quant, decoded from its
// 8-bit code: code2[q] * absmax2[block / 256] + offset) per element.  Layout in kernels.h.
#include "kcommon.cuh"

// ---- kernels ------------------------------------------------------------------------------

__global__ void nf4_dequant_kernel(void *w, int wdt, const uint8_t *blob, struct mp_k_nf4 q)
{
    const uint8_t *packed = blob + q.packed;
    const float *code = (const float *)(blob + q.code);
    GRID_STRIDE(i, q.n)
    {
        uint64_t b = i / q.blocksize;
        float m;
        if (!q.double_quant) {
            m = ((const float *)(blob + q.absmax))[b];
        } else {
            const float *code2 = (const float *)(blob + q.code2);
            const float *absmax2 = (const float *)(blob + q.absmax2);
            float offset = *(const float *)(blob + q.offset);
            m = __fadd_rn(__fmul_rn(code2[blob[q.absmax + b]], absmax2[b / 256]), offset); // as the host: no FMA
        }
        uint8_t byte = packed[i / 2];
        uint8_t c = (i & 1) ? (byte & 15) : (byte >> 4);
        stf(w, wdt, i, __fmul_rn(code[c], m));
    }
}

// ---- launchers ----------------------------------------------------------------------------

extern "C" int mp_k_nf4_dequant(void *w, int wdt, const uint8_t *blob, struct mp_k_nf4 q, cudaStream_t s)
{
    if (q.blocksize == 0)
        return (int)cudaErrorInvalidValue;
    if (q.n)
        nf4_dequant_kernel<<<grid_for(q.n, 256), 256, 0, s>>>(w, wdt, blob, q);
    KCHECK();
}
