// attention.cu — scaled dot-product attention.
//
// Flash (SDPA) path: the GEMMs are cuBLAS calls made by probe/cuda/probe_cuda_attention.c on tensor cores
// (QK^T, PV and the four backward products, bf16/fp16 in, fp32 accumulate), over blocks of
// query rows of many (sample, head) entries at once; these kernels are the softmax pieces
// between them, written into a bounded workspace (struct mp_k_fblock): the forward keeps
// only the logsumexp (no s x s tensor survives the node), the backward recomputes the
// probabilities from it, D = rowsum(dO * O) goes into the node's softmax_d temporary and
// dq accumulates in its fp32 dq_accum temporary, as flash-attention's do.
// Eager path helpers: contiguous q/k/v copies, softmax, dropout on the probabilities, the
// output transpose, the softmax backward.  Dropout element (bi, h, i, j) is
// ((bi*a + h)*s + i)*s + j in both paths, as in probe_host_attention.c.
#include "kcommon.cuh"

#define FA_WARPS 4 // query rows per block of the dsum kernel

// ---- kernels ------------------------------------------------------------------------------

__device__ __forceinline__ uint64_t q_at(const mp_k_attn &A, uint64_t bi, uint64_t i, uint64_t h)
{
    return (bi * A.s + i) * A.wq + A.oq + h * A.d;
}
__device__ __forceinline__ uint64_t k_at(const mp_k_attn &A, uint64_t bi, uint64_t j, uint64_t g)
{
    return (bi * A.s + j) * A.wk + A.ok + g * A.d;
}
__device__ __forceinline__ uint64_t v_at(const mp_k_attn &A, uint64_t bi, uint64_t j, uint64_t g)
{
    return (bi * A.s + j) * A.wv + A.ov + g * A.d;
}
__device__ __forceinline__ uint64_t o_at(const mp_k_attn &A, uint64_t bi, uint64_t i, uint64_t h)
{
    return ((bi * A.s + i) * A.a + h) * A.d;
}

// D_i = dO_i . O_i per (bh, i): one warp each.
__global__ void flash_dsum_kernel(mp_k_attn A, const void *out, const void *dout, float *dsum, uint64_t s_r)
{
    uint64_t bh = blockIdx.x, bi = bh / A.a, h = bh % A.a, i = (uint64_t)blockIdx.y * FA_WARPS + (threadIdx.x >> 5);
    if (i >= A.s)
        return;
    float s = 0.0f;
    for (uint64_t e = threadIdx.x & 31; e < A.d; e += 32)
        s += ldf(dout, A.dt, o_at(A, bi, i, h) + e) * ldf(out, A.dt, o_at(A, bi, i, h) + e);
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0)
        dsum[bh * s_r + i] = s;
}

// The flash path's workspace rows: entry e (bh = e0 + e), query row ii (i = i0 + ii), key
// j < jn; element (e*qb + ii)*jn + j.  S holds scale * q.k.

// P = exp(S - lse) * keep (0 above the causal diagonal), in the attention dtype; lse saved.
// One block per (entry, row).
__global__ void fa_softmax_fwd_kernel(mp_k_attn A, mp_k_fblock F, const float *S, void *P, float *lse, uint64_t s_lse)
{
    uint64_t r = blockIdx.x, i = F.i0 + r % F.qb, bh = F.e0 + r / F.qb, base = r * F.jn;
    uint64_t jn = A.causal && i + 1 < F.jn ? i + 1 : F.jn;
    float m = -INFINITY;
    for (uint64_t j = threadIdx.x; j < jn; j += blockDim.x)
        m = fmaxf(m, S[base + j]);
    m = block_max(m);
    float l = 0.0f;
    for (uint64_t j = threadIdx.x; j < jn; j += blockDim.x)
        l += expf(S[base + j] - m);
    l = block_sum(l);
    float L = m + logf(l);
    if (threadIdx.x == 0)
        lse[bh * s_lse + i] = L;
    for (uint64_t j = threadIdx.x; j < F.jn; j += blockDim.x)
        stf(P, A.dt, base + j, j < jn ? expf(S[base + j] - L) * keep_scale(A.key, (bh * A.s + i) * A.s + j, A.p) : 0.0f);
}

// From the recomputed scores S and dP = dO.v: Pk = P * keep (for dV) and
// dS = P * (dP * keep - D) * scale (for dQ, dK), both in the attention dtype.
__global__ void fa_softmax_bwd_kernel(mp_k_attn A, mp_k_fblock F, const float *S, const float *dP, const float *lse,
                                      uint64_t s_lse, const float *dsum, uint64_t s_r, void *Pk, void *dS)
{
    GRID_STRIDE(idx, F.ne * F.qb * F.jn)
    {
        uint64_t j = idx % F.jn, r = idx / F.jn, i = F.i0 + r % F.qb, bh = F.e0 + r / F.qb;
        float pk = 0.0f, ds = 0.0f;
        if (!A.causal || j <= i) {
            float P = expf(S[idx] - lse[bh * s_lse + i]), ks = keep_scale(A.key, (bh * A.s + i) * A.s + j, A.p);
            pk = P * ks;
            ds = P * (dP[idx] * ks - dsum[bh * s_r + i]) * A.scale;
        }
        stf(Pk, A.dt, idx, pk);
        stf(dS, A.dt, idx, ds);
    }
}

// dq (at q's offsets) += the fp32 dq_accum [b, s_r, a, d_r]
__global__ void fa_dq_out_kernel(mp_k_attn A, const float *dq_acc, uint64_t s_r, uint64_t d_r, void *dq)
{
    GRID_STRIDE(idx, A.b * A.s * A.a * A.d)
    {
        uint64_t e = idx % A.d, h = (idx / A.d) % A.a, i = (idx / (A.d * A.a)) % A.s, bi = idx / (A.d * A.a * A.s);
        accf(dq, A.dt, q_at(A, bi, i, h) + e, dq_acc[((bi * s_r + i) * A.a + h) * d_r + e]);
    }
}

__global__ void attn_pack_kernel(mp_k_attn A, void *qc, void *kc, void *vc)
{
    GRID_STRIDE(idx, A.b * A.a * A.s * A.d)
    {
        uint64_t e = idx % A.d, i = (idx / A.d) % A.s, h = (idx / (A.d * A.s)) % A.a, bi = idx / (A.d * A.s * A.a);
        uint64_t g = h / (A.a / A.kv);
        stf(qc, A.dt, idx, ldf(A.q, A.dt, q_at(A, bi, i, h) + e));
        stf(kc, A.dt, idx, ldf(A.k, A.dt, k_at(A, bi, i, g) + e));
        stf(vc, A.dt, idx, ldf(A.v, A.dt, v_at(A, bi, i, g) + e));
    }
}

// g (input j's layout: 0 q, 1 k, 2 v; gdt) += src, a copy's gradient (b, a, s, d; sdt), the
// heads of a kv group summed (repeat_kv's backward).  One thread per element of g.
__global__ void attn_gather_kernel(mp_k_attn A, int j, void *g, int gdt, const void *src, int sdt)
{
    uint64_t nh = j == 0 ? A.a : A.kv, grp = j == 0 ? 1 : A.a / A.kv;
    GRID_STRIDE(idx, A.b * nh * A.s * A.d)
    {
        uint64_t e = idx % A.d, i = (idx / A.d) % A.s, hh = (idx / (A.d * A.s)) % nh, bi = idx / (A.d * A.s * nh);
        float acc = 0.0f;
        for (uint64_t r = 0; r < grp; r++)
            acc += ldf(src, sdt, ((bi * A.a + hh * grp + r) * A.s + i) * A.d + e);
        uint64_t o = (j == 0 ? q_at(A, bi, i, hh) : j == 1 ? k_at(A, bi, i, hh) : v_at(A, bi, i, hh)) + e;
        stf(g, gdt, o, ldf(g, gdt, o) + acc);
    }
}

// One block per row r of rows (b*a*s); position i = r mod sl.
__global__ void attn_softmax_kernel(void *probs, int pdt, const void *scores, int sdt, uint64_t sl, int causal)
{
    uint64_t r = blockIdx.x, base = r * sl, jn = causal ? r % sl + 1 : sl;
    float m = -INFINITY;
    for (uint64_t j = threadIdx.x; j < jn; j += blockDim.x)
        m = fmaxf(m, ldf(scores, sdt, base + j));
    m = block_max(m);
    float s = 0.0f;
    for (uint64_t j = threadIdx.x; j < jn; j += blockDim.x)
        s += expf(ldf(scores, sdt, base + j) - m);
    s = block_sum(s);
    for (uint64_t j = threadIdx.x; j < sl; j += blockDim.x)
        stf(probs, pdt, base + j, j < jn ? expf(ldf(scores, sdt, base + j) - m) / s : 0.0f);
}

__global__ void attn_probs_out_kernel(void *pv, int cdt, uint8_t *mask, const void *probs, int pdt, uint64_t n,
                                      float p, uint64_t key)
{
    GRID_STRIDE(i, n)
    {
        float P = ldf(probs, pdt, i);
        if (mask) {
            float ks = keep_scale(key, i, p);
            mask[i] = ks > 0.0f;
            P *= ks;
        }
        stf(pv, cdt, i, P);
    }
}

__global__ void attn_unpack_kernel(void *out, const void *o, int dt, uint64_t b, uint64_t sl, uint64_t a, uint64_t d)
{
    GRID_STRIDE(idx, b * sl * a * d)
    {
        uint64_t e = idx % d, h = (idx / d) % a, i = (idx / (d * a)) % sl, bi = idx / (d * a * sl);
        stf(out, dt, idx, ldf(o, dt, ((bi * a + h) * sl + i) * d + e));
    }
}

__global__ void softmax_bwd_kernel(void *ds, void *dp, int pdt, const void *probs, const uint8_t *mask, float p,
                                   uint64_t sl)
{
    uint64_t base = (uint64_t)blockIdx.x * sl;
    float inv = 1.0f / (1.0f - p), s = 0.0f;
    for (uint64_t j = threadIdx.x; j < sl; j += blockDim.x) {
        float d = ldf(dp, pdt, base + j);
        if (mask) {
            d = mask[base + j] ? d * inv : 0.0f;
            stf(dp, pdt, base + j, d);
            d = ldf(dp, pdt, base + j);
        }
        s += ldf(probs, pdt, base + j) * d;
    }
    s = block_sum(s);
    for (uint64_t j = threadIdx.x; j < sl; j += blockDim.x) {
        float P = ldf(probs, pdt, base + j);
        stf(ds, pdt, base + j, P * (ldf(dp, pdt, base + j) - s));
    }
}

// ---- launchers ----------------------------------------------------------------------------

static bool attn_ok(const struct mp_k_attn *A)
{
    return A->d > 0 && A->kv > 0 && A->a % A->kv == 0 && A->b * A->a <= 0x7fffffffull &&
           CEIL_DIV(A->s, (uint64_t)FA_WARPS) <= 65535;
}

extern "C" int mp_k_fa_softmax_fwd(const struct mp_k_attn *A, const struct mp_k_fblock *F, const float *S, void *P,
                                   float *lse, uint64_t s_lse, cudaStream_t s)
{
    uint64_t rows = F->ne * F->qb;
    if (!rows || !F->jn)
        return 0;
    if (rows > 0x7fffffffull || F->i0 + F->qb > A->s || (A->causal && F->jn < F->i0 + F->qb))
        return (int)cudaErrorInvalidValue;
    fa_softmax_fwd_kernel<<<(unsigned)rows, 128, 0, s>>>(*A, *F, S, P, lse, s_lse);
    KCHECK();
}

extern "C" int mp_k_fa_softmax_bwd(const struct mp_k_attn *A, const struct mp_k_fblock *F, const float *S,
                                   const float *dP, const float *lse, uint64_t s_lse, const float *dsum, uint64_t s_r,
                                   void *Pk, void *dS, cudaStream_t s)
{
    uint64_t n = F->ne * F->qb * F->jn;
    if (n)
        fa_softmax_bwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(*A, *F, S, dP, lse, s_lse, dsum, s_r, Pk, dS);
    KCHECK();
}

extern "C" int mp_k_flash_dsum(const struct mp_k_attn *A, const void *out, const void *dout, float *dsum,
                               uint64_t s_r, cudaStream_t s)
{
    if (!A->s || !A->b)
        return 0;
    if (!attn_ok(A) || s_r < A->s)
        return (int)cudaErrorInvalidValue;
    dim3 grid((unsigned)(A->b * A->a), (unsigned)CEIL_DIV(A->s, (uint64_t)FA_WARPS));
    flash_dsum_kernel<<<grid, 32 * FA_WARPS, 0, s>>>(*A, out, dout, dsum, s_r);
    KCHECK();
}

extern "C" int mp_k_flash_dq_out(const struct mp_k_attn *A, const float *dq_acc, uint64_t s_r, uint64_t d_r, void *dq,
                                 cudaStream_t s)
{
    uint64_t n = A->b * A->s * A->a * A->d;
    if (n && dq)
        fa_dq_out_kernel<<<grid_for(n, 256), 256, 0, s>>>(*A, dq_acc, s_r, d_r, dq);
    KCHECK();
}

extern "C" int mp_k_attn_pack(const struct mp_k_attn *A, void *qc, void *kc, void *vc, cudaStream_t s)
{
    uint64_t n = A->b * A->a * A->s * A->d;
    if (!n)
        return 0;
    if (!A->kv || A->a % A->kv)
        return (int)cudaErrorInvalidValue;
    attn_pack_kernel<<<grid_for(n, 256), 256, 0, s>>>(*A, qc, kc, vc);
    KCHECK();
}

extern "C" int mp_k_attn_gather(const struct mp_k_attn *A, int j, void *g, int gdt, const void *src, int sdt,
                                cudaStream_t s)
{
    uint64_t n = A->b * (j == 0 ? A->a : A->kv) * A->s * A->d;
    if (!n || !g)
        return 0;
    if (!A->kv || A->a % A->kv || j < 0 || j > 2)
        return (int)cudaErrorInvalidValue;
    attn_gather_kernel<<<grid_for(n, 256), 256, 0, s>>>(*A, j, g, gdt, src, sdt);
    KCHECK();
}

extern "C" int mp_k_attn_softmax(void *probs, int pdt, const void *scores, int sdt, uint64_t rows, uint64_t sl,
                                 int causal, cudaStream_t s)
{
    if (!rows || !sl)
        return 0;
    if (rows > 0x7fffffffull)
        return (int)cudaErrorInvalidConfiguration;
    attn_softmax_kernel<<<(unsigned)rows, 128, 0, s>>>(probs, pdt, scores, sdt, sl, causal);
    KCHECK();
}

extern "C" int mp_k_attn_probs_out(void *pv, int cdt, uint8_t *mask, const void *probs, int pdt, uint64_t n, float p,
                                   uint64_t key, cudaStream_t s)
{
    if (n)
        attn_probs_out_kernel<<<grid_for(n, 256), 256, 0, s>>>(pv, cdt, mask, probs, pdt, n, p, key);
    KCHECK();
}

extern "C" int mp_k_attn_unpack(void *out, const void *o, int dt, uint64_t b, uint64_t sl, uint64_t a, uint64_t d,
                                cudaStream_t s)
{
    uint64_t n = b * sl * a * d;
    if (n)
        attn_unpack_kernel<<<grid_for(n, 256), 256, 0, s>>>(out, o, dt, b, sl, a, d);
    KCHECK();
}

extern "C" int mp_k_softmax_bwd(void *ds, void *dp, int pdt, const void *probs, const uint8_t *mask, float p,
                                uint64_t rows, uint64_t sl, cudaStream_t s)
{
    if (!rows || !sl)
        return 0;
    if (rows > 0x7fffffffull)
        return (int)cudaErrorInvalidConfiguration;
    softmax_bwd_kernel<<<(unsigned)rows, 128, 0, s>>>(ds, dp, pdt, probs, mask, p, sl);
    KCHECK();
}
