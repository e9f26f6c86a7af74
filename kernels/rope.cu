// rope.cu — rotary position embedding (HF rotate_half) on the first rd columns
// of each head, forward and backward (the transposed rotation, accumulated).
// A thread per (row, head, column); the pair (i, i + rd/2) belongs to column i.
#include "kcommon.cuh"

// ---- kernels ------------------------------------------------------------------------------

__global__ void rope_kernel(void *dst, int ddt, uint64_t dw, uint64_t doff, const void *src, int sdt, uint64_t sw,
                            uint64_t soff, uint64_t rows, uint64_t heads, uint64_t hd, uint64_t rd, uint64_t seq,
                            float base, int backward)
{
    uint64_t half = rd / 2;
    GRID_STRIDE(e, rows * heads * hd)
    {
        uint64_t i = e % hd, h = (e / hd) % heads, r = e / (hd * heads);
        uint64_t sb = r * sw + soff + h * hd, db = r * dw + doff + h * hd;
        if (i >= rd) {
            float v = ldf(src, sdt, sb + i);
            stf(dst, ddt, db + i, backward ? ldf(dst, ddt, db + i) + v : v);
            continue;
        }
        if (i >= half)
            continue; // handled with its partner i - half
        float ang = (float)(r % seq) * powf(base, -(float)(2 * i) / (float)rd), co = cosf(ang), si = sinf(ang);
        float a = ldf(src, sdt, sb + i), b = ldf(src, sdt, sb + i + half);
        if (!backward) {
            stf(dst, ddt, db + i, a * co - b * si);
            stf(dst, ddt, db + i + half, b * co + a * si);
        } else {
            stf(dst, ddt, db + i, ldf(dst, ddt, db + i) + a * co + b * si);
            stf(dst, ddt, db + i + half, ldf(dst, ddt, db + i + half) - a * si + b * co);
        }
    }
}

// ---- launchers ----------------------------------------------------------------------------

extern "C" int mp_k_rope(void *dst, int ddt, uint64_t dw, uint64_t doff, const void *src, int sdt, uint64_t sw,
                         uint64_t soff, uint64_t rows, uint64_t heads, uint64_t hd, uint64_t rd, uint64_t seq,
                         float base, int backward, cudaStream_t s)
{
    uint64_t n = rows * heads * hd;
    if (n)
        rope_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, ddt, dw, doff, src, sdt, sw, soff, rows, heads, hd,
                                                      rd ? rd : hd, seq ? seq : 1, base, backward);
    KCHECK();
}
