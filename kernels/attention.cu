// attention.cu — scaled dot-product attention.
//
// Flash path: one warp per query row, K/V tiles staged in shared memory, an
// online softmax in fp32; only the logsumexp is kept (no s x s matrix).  The
// backward recomputes probabilities from lse: a dq pass over keys (accumulated
// in the node's fp32 dq_accum temporary) and a dk/dv pass over queries that
// gathers every query head of a kv group (GQA), so no atomics are needed.
// Eager path helpers: contiguous q/k/v copies, softmax, dropout on the
// probabilities, the output transpose, the softmax backward; the GEMMs are
// cuBLAS calls made by probe_cuda.c.  Dropout element (bi, h, i, j) is
// ((bi*a + h)*s + i)*s + j in both paths, as in probe_host.c.
#include "kcommon.cuh"

#define FA_WARPS 4  // query (or key) rows per block
#define FA_MAXE 16  // head_dim <= 32 * FA_MAXE

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

// Loads a row of d elements spread over the lanes (element lane + 32 t).
__device__ __forceinline__ void load_row(float *r, const void *p, int dt, uint64_t base, uint64_t d, bool on)
{
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < FA_MAXE; t++) {
        uint64_t e = lane + 32 * t;
        r[t] = on && e < d ? ldf(p, dt, base + e) : 0.0f;
    }
}

// Dot product of a lane-spread row with a shared-memory row.
__device__ __forceinline__ float dot_sm(const float *r, const float *srow, uint64_t d)
{
    int lane = threadIdx.x & 31;
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < FA_MAXE; t++) {
        uint64_t e = lane + 32 * t;
        if (e < d)
            s += r[t] * srow[e];
    }
    return warp_sum(s);
}

// Stages rows [j0, j0 + tk) of k and v (kv head g) into shared memory as floats.
__device__ __forceinline__ void stage_kv(const mp_k_attn &A, float *Ks, float *Vs, uint64_t bi, uint64_t g,
                                         uint64_t j0, int tk)
{
    for (uint64_t idx = threadIdx.x; idx < (uint64_t)tk * A.d; idx += blockDim.x) {
        uint64_t jj = idx / A.d, e = idx % A.d, j = j0 + jj;
        Ks[idx] = j < A.s ? ldf(A.k, A.dt, k_at(A, bi, j, g) + e) : 0.0f;
        Vs[idx] = j < A.s ? ldf(A.v, A.dt, v_at(A, bi, j, g) + e) : 0.0f;
    }
}

// grid (b*a, ceil(s / FA_WARPS)); dynamic shared 2*tk*d floats
__global__ void flash_fwd_kernel(mp_k_attn A, void *out, float *lse, uint64_t s_lse, int tk)
{
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = sm + (uint64_t)tk * A.d;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint64_t bh = blockIdx.x, bi = bh / A.a, h = bh % A.a, g = h / (A.a / A.kv);
    uint64_t i0 = (uint64_t)blockIdx.y * FA_WARPS, i = i0 + w;
    bool active = i < A.s;
    float q[FA_MAXE], o[FA_MAXE];
    load_row(q, A.q, A.dt, q_at(A, bi, active ? i : 0, h), A.d, active);
#pragma unroll
    for (int t = 0; t < FA_MAXE; t++)
        o[t] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    uint64_t jend = A.causal ? (i0 + FA_WARPS < A.s ? i0 + FA_WARPS : A.s) : A.s;
    for (uint64_t j0 = 0; j0 < jend; j0 += tk) {
        __syncthreads();
        stage_kv(A, Ks, Vs, bi, g, j0, tk);
        __syncthreads();
        if (!active)
            continue;
        for (int jj = 0; jj < tk && j0 + jj < jend; jj++) {
            uint64_t j = j0 + jj;
            if (A.causal && j > i)
                break;
            float sc = dot_sm(q, Ks + (uint64_t)jj * A.d, A.d) * A.scale;
            float mn = fmaxf(m, sc), corr = expf(m - mn), pe = expf(sc - mn);
            float pk = pe * keep_scale(A.key, (bh * A.s + i) * A.s + j, A.p);
            l = l * corr + pe;
#pragma unroll
            for (int t = 0; t < FA_MAXE; t++) {
                uint64_t e = lane + 32 * t;
                o[t] = o[t] * corr + (e < A.d ? pk * Vs[(uint64_t)jj * A.d + e] : 0.0f);
            }
            m = mn;
        }
    }
    if (!active)
        return;
#pragma unroll
    for (int t = 0; t < FA_MAXE; t++) {
        uint64_t e = lane + 32 * t;
        if (e < A.d)
            stf(out, A.dt, o_at(A, bi, i, h) + e, o[t] / l);
    }
    if (lane == 0)
        lse[bh * s_lse + i] = m + logf(l);
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

// dq for one query row per warp; grid and shared memory as the forward.
__global__ void flash_dq_kernel(mp_k_attn A, const void *dout, const float *lse, uint64_t s_lse, const float *dsum,
                                float *dq_acc, uint64_t s_r, uint64_t d_r, void *dq, int tk)
{
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = sm + (uint64_t)tk * A.d;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint64_t bh = blockIdx.x, bi = bh / A.a, h = bh % A.a, g = h / (A.a / A.kv);
    uint64_t i0 = (uint64_t)blockIdx.y * FA_WARPS, i = i0 + w;
    bool active = i < A.s;
    uint64_t ic = active ? i : 0;
    float q[FA_MAXE], dO[FA_MAXE], acc[FA_MAXE];
    load_row(q, A.q, A.dt, q_at(A, bi, ic, h), A.d, active);
    load_row(dO, dout, A.dt, o_at(A, bi, ic, h), A.d, active);
#pragma unroll
    for (int t = 0; t < FA_MAXE; t++)
        acc[t] = 0.0f;
    float L = active ? lse[bh * s_lse + i] : 0.0f, D = active ? dsum[bh * s_r + i] : 0.0f;
    uint64_t jend = A.causal ? (i0 + FA_WARPS < A.s ? i0 + FA_WARPS : A.s) : A.s;
    for (uint64_t j0 = 0; j0 < jend; j0 += tk) {
        __syncthreads();
        stage_kv(A, Ks, Vs, bi, g, j0, tk);
        __syncthreads();
        if (!active)
            continue;
        for (int jj = 0; jj < tk && j0 + jj < jend; jj++) {
            uint64_t j = j0 + jj;
            if (A.causal && j > i)
                break;
            float P = expf(dot_sm(q, Ks + (uint64_t)jj * A.d, A.d) * A.scale - L);
            float dP = dot_sm(dO, Vs + (uint64_t)jj * A.d, A.d) * keep_scale(A.key, (bh * A.s + i) * A.s + j, A.p);
            float dS = P * (dP - D) * A.scale;
#pragma unroll
            for (int t = 0; t < FA_MAXE; t++) {
                uint64_t e = lane + 32 * t;
                if (e < A.d)
                    acc[t] += dS * Ks[(uint64_t)jj * A.d + e];
            }
        }
    }
    if (!active)
        return;
#pragma unroll
    for (int t = 0; t < FA_MAXE; t++) {
        uint64_t e = lane + 32 * t;
        if (e < A.d) {
            dq_acc[((bi * s_r + i) * A.a + h) * d_r + e] = acc[t];
            if (dq)
                accf(dq, A.dt, q_at(A, bi, i, h) + e, acc[t]);
        }
    }
}

// dk, dv for one key row per warp (kv head g), over every query head of the group.
// grid (b*kv, ceil(s / FA_WARPS)); dynamic shared 2*tq*d + 2*tq floats.
__global__ void flash_dkv_kernel(mp_k_attn A, const void *dout, const float *lse, uint64_t s_lse, const float *dsum,
                                 uint64_t s_r, void *dk, void *dv, int tq)
{
    extern __shared__ float sm[];
    float *Qs = sm, *Os = sm + (uint64_t)tq * A.d, *Ls = Os + (uint64_t)tq * A.d, *Ds = Ls + tq;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint64_t bg = blockIdx.x, bi = bg / A.kv, g = bg % A.kv, group = A.a / A.kv;
    uint64_t j0b = (uint64_t)blockIdx.y * FA_WARPS, j = j0b + w;
    bool active = j < A.s;
    uint64_t jc = active ? j : 0;
    float kr[FA_MAXE], vr[FA_MAXE], gk[FA_MAXE], gv[FA_MAXE];
#pragma unroll
    for (int t = 0; t < FA_MAXE; t++) {
        uint64_t e = lane + 32 * t;
        kr[t] = active && e < A.d ? ldf(A.k, A.dt, k_at(A, bi, jc, g) + e) : 0.0f;
        vr[t] = active && e < A.d ? ldf(A.v, A.dt, v_at(A, bi, jc, g) + e) : 0.0f;
        gk[t] = gv[t] = 0.0f;
    }
    uint64_t istart = A.causal ? j0b : 0;
    for (uint64_t r = 0; r < group; r++) {
        uint64_t h = g * group + r, bh = bi * A.a + h;
        for (uint64_t i0 = istart; i0 < A.s; i0 += tq) {
            __syncthreads();
            for (uint64_t idx = threadIdx.x; idx < (uint64_t)tq * A.d; idx += blockDim.x) {
                uint64_t ii = idx / A.d, e = idx % A.d, i = i0 + ii;
                Qs[idx] = i < A.s ? ldf(A.q, A.dt, q_at(A, bi, i, h) + e) : 0.0f;
                Os[idx] = i < A.s ? ldf(dout, A.dt, o_at(A, bi, i, h) + e) : 0.0f;
            }
            for (uint64_t ii = threadIdx.x; ii < (uint64_t)tq; ii += blockDim.x) {
                uint64_t i = i0 + ii;
                Ls[ii] = i < A.s ? lse[bh * s_lse + i] : 0.0f;
                Ds[ii] = i < A.s ? dsum[bh * s_r + i] : 0.0f;
            }
            __syncthreads();
            if (!active)
                continue;
            for (int ii = 0; ii < tq && i0 + ii < A.s; ii++) {
                uint64_t i = i0 + ii;
                if (A.causal && i < j)
                    continue;
                const float *qrow = Qs + (uint64_t)ii * A.d, *orow = Os + (uint64_t)ii * A.d;
                float P = expf(dot_sm(kr, qrow, A.d) * A.scale - Ls[ii]);
                float ks = keep_scale(A.key, (bh * A.s + i) * A.s + j, A.p);
                float dP = dot_sm(vr, orow, A.d) * ks, dS = P * (dP - Ds[ii]) * A.scale;
#pragma unroll
                for (int t = 0; t < FA_MAXE; t++) {
                    uint64_t e = lane + 32 * t;
                    if (e < A.d) {
                        gk[t] += dS * qrow[e];
                        gv[t] += P * ks * orow[e];
                    }
                }
            }
        }
    }
    if (!active)
        return;
#pragma unroll
    for (int t = 0; t < FA_MAXE; t++) {
        uint64_t e = lane + 32 * t;
        if (e < A.d) {
            if (dk)
                accf(dk, A.dt, k_at(A, bi, j, g) + e, gk[t]);
            if (dv)
                accf(dv, A.dt, v_at(A, bi, j, g) + e, gv[t]);
        }
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

static int tile_rows(uint64_t d, uint64_t cap)
{
    uint64_t t = 6144 / (d ? d : 1); // 2 * t * d floats <= 48 KiB
    if (t > cap)
        t = cap;
    return (int)(t ? t : 1);
}

static bool attn_ok(const struct mp_k_attn *A)
{
    return A->d > 0 && A->d <= 32 * FA_MAXE && A->kv > 0 && A->a % A->kv == 0 && A->b * A->a <= 0x7fffffffull &&
           CEIL_DIV(A->s, (uint64_t)FA_WARPS) <= 65535;
}

extern "C" int mp_k_flash_fwd(const struct mp_k_attn *A, void *out, float *lse, uint64_t s_lse, cudaStream_t s)
{
    if (!A->s || !A->b)
        return 0;
    if (!attn_ok(A))
        return (int)cudaErrorInvalidValue;
    int tk = tile_rows(A->d, 64);
    dim3 grid((unsigned)(A->b * A->a), (unsigned)CEIL_DIV(A->s, (uint64_t)FA_WARPS));
    flash_fwd_kernel<<<grid, 32 * FA_WARPS, 2 * (size_t)tk * A->d * sizeof(float), s>>>(*A, out, lse, s_lse, tk);
    KCHECK();
}

extern "C" int mp_k_flash_bwd(const struct mp_k_attn *A, const void *out, const void *dout, const float *lse,
                              uint64_t s_lse, float *dsum, float *dq_acc, uint64_t s_r, uint64_t d_r, void *dq,
                              void *dk, void *dv, cudaStream_t s)
{
    if (!A->s || !A->b)
        return 0;
    if (!attn_ok(A) || s_r < A->s || d_r < A->d)
        return (int)cudaErrorInvalidValue;
    int tk = tile_rows(A->d, 64);
    dim3 grid((unsigned)(A->b * A->a), (unsigned)CEIL_DIV(A->s, (uint64_t)FA_WARPS));
    flash_dsum_kernel<<<grid, 32 * FA_WARPS, 0, s>>>(*A, out, dout, dsum, s_r);
    flash_dq_kernel<<<grid, 32 * FA_WARPS, 2 * (size_t)tk * A->d * sizeof(float), s>>>(*A, dout, lse, s_lse, dsum,
                                                                                         dq_acc, s_r, d_r, dq, tk);
    if (dk || dv) {
        int tq = tile_rows(A->d + 1, 64);
        dim3 g2((unsigned)(A->b * A->kv), (unsigned)CEIL_DIV(A->s, (uint64_t)FA_WARPS));
        flash_dkv_kernel<<<g2, 32 * FA_WARPS, (2 * (size_t)tq * A->d + 2 * (size_t)tq) * sizeof(float), s>>>(
            *A, dout, lse, s_lse, dsum, s_r, dk, dv, tq);
    }
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
