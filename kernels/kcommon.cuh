// kcommon.cuh — what every kernel file shares: dtype access (the codes of enum
// mp_dtype), grid-stride loops, warp/block reductions, the dropout hash (the
// same function as src/probe/probe_impl.h, so host and device masks agree) and the
// launch check.  Device code only; no allocation, no printing.
#ifndef MEMPLAN_KCOMMON_CUH
#define MEMPLAN_KCOMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "kernels.h"
#include "probe/mp_math.h"

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

// Grid for n elements at `threads` per block; grid-stride loops cover the rest.
static inline unsigned grid_for(uint64_t n, unsigned threads)
{
    uint64_t g = CEIL_DIV(n, (uint64_t)threads);
    if (g == 0)
        g = 1;
    return (unsigned)(g > 65535ull * 32 ? 65535ull * 32 : g);
}

// Every launcher ends with this: the launch's own error (bad configuration),
// as an int for the C side.  Asynchronous faults surface at the next sync.
#define KCHECK() return (int)cudaGetLastError()

#define GRID_STRIDE(i, n) \
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < (n); i += (uint64_t)blockDim.x * gridDim.x)

// ---- dtype access -------------------------------------------------------------------------

__device__ __forceinline__ float ldf(const void *p, int dt, uint64_t i)
{
    switch (dt) {
    case MP_DT_F32: return ((const float *)p)[i];
    case MP_DT_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case MP_DT_F16: return __half2float(((const __half *)p)[i]);
    case MP_DT_I64: return (float)((const long long *)p)[i];
    default: return (float)((const unsigned char *)p)[i];
    }
}

__device__ __forceinline__ void stf(void *p, int dt, uint64_t i, float v)
{
    switch (dt) {
    case MP_DT_F32: ((float *)p)[i] = v; break;
    case MP_DT_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    case MP_DT_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case MP_DT_I64: ((long long *)p)[i] = (long long)v; break;
    default: ((unsigned char *)p)[i] = (unsigned char)v; break;
    }
}

// p[i] += v (one writer).
__device__ __forceinline__ void accf(void *p, int dt, uint64_t i, float v) { stf(p, dt, i, ldf(p, dt, i) + v); }

// 16-bit atomic add through a CAS loop on the aligned 32-bit word holding it, for
// architectures without native bf16 (sm_80) / fp16 (sm_70) atomics (T4 is sm_75).
template <typename H, typename ToF, typename FromF>
__device__ __forceinline__ void atomic_add16_cas(H *addr, float v, ToF to_f, FromF from_f)
{
    unsigned int *word = (unsigned int *)((uintptr_t)addr & ~(uintptr_t)3);
    unsigned int shift = ((uintptr_t)addr & 2) ? 16u : 0u;
    unsigned int old = *word, assumed;
    do {
        assumed = old;
        unsigned short h = (unsigned short)((assumed >> shift) & 0xffffu);
        unsigned short n = from_f(to_f(h) + v);
        unsigned int upd = (assumed & ~(0xffffu << shift)) | ((unsigned int)n << shift);
        old = atomicCAS(word, assumed, upd);
    } while (assumed != old);
}

__device__ __forceinline__ float bf16_bits_to_f(unsigned short h) { return __bfloat162float(__ushort_as_bfloat16(h)); }
__device__ __forceinline__ unsigned short f_to_bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ __forceinline__ float f16_bits_to_f(unsigned short h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ unsigned short f_to_f16_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }

// p[i] += v (many writers).  Native bf16 atomics from sm_80, fp16 from sm_70; CAS below.
__device__ __forceinline__ void atomic_accf(void *p, int dt, uint64_t i, float v)
{
    switch (dt) {
    case MP_DT_F32: atomicAdd((float *)p + i, v); break;
    case MP_DT_BF16:
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        atomicAdd((__nv_bfloat16 *)p + i, __float2bfloat16_rn(v));
#else
        atomic_add16_cas((__nv_bfloat16 *)p + i, v, bf16_bits_to_f, f_to_bf16_bits);
#endif
        break;
    case MP_DT_F16:
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
        atomicAdd((__half *)p + i, __float2half_rn(v));
#else
        atomic_add16_cas((__half *)p + i, v, f16_bits_to_f, f_to_f16_bits);
#endif
        break;
    default: break;
    }
}

__device__ __forceinline__ float round_dt(int dt, float v)
{
    if (dt == MP_DT_BF16)
        return __bfloat162float(__float2bfloat16_rn(v));
    if (dt == MP_DT_F16)
        return __half2float(__float2half_rn(v));
    return v;
}

// ---- typed access, vector loads (llm.c's Packed128) ------------------------------------------
// The fast elementwise kernels are one template on the element type: the launcher picks the
// types once (with_float_type) and every element is read without a dtype switch, KVEC at a
// time through 16-byte loads where every operand is 16-byte aligned, then a scalar tail.

template <typename T> struct kdt;
template <> struct kdt<float> {
    __device__ static float to(float v) { return v; }
    __device__ static float from(float v) { return v; }
};
template <> struct kdt<__nv_bfloat16> {
    __device__ static float to(__nv_bfloat16 v) { return __bfloat162float(v); }
    __device__ static __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
};
template <> struct kdt<__half> {
    __device__ static float to(__half v) { return __half2float(v); }
    __device__ static __half from(float v) { return __float2half_rn(v); }
};

#define KVEC 8 // elements per vector step: one 16-byte load of a 16-bit type, two of fp32

template <typename T> struct alignas(16) pack16 {
    T v[16 / sizeof(T)];
};

// W elements at p as floats: 16-byte loads when W == KVEC (p 16-byte aligned), else one element.
template <int W, typename T> __device__ __forceinline__ void vload(const T *p, float (&f)[W])
{
    if constexpr (W == 1) {
        f[0] = kdt<T>::to(*p);
    } else {
        constexpr int per = 16 / sizeof(T);
        static_assert(W % per == 0, "whole 16-byte packs");
#pragma unroll
        for (int c = 0; c < W / per; c++) {
            pack16<T> r = *reinterpret_cast<const pack16<T> *>(p + c * per);
#pragma unroll
            for (int k = 0; k < per; k++)
                f[c * per + k] = kdt<T>::to(r.v[k]);
        }
    }
}

template <int W, typename T> __device__ __forceinline__ void vstore(T *p, const float (&f)[W])
{
    if constexpr (W == 1) {
        *p = kdt<T>::from(f[0]);
    } else {
        constexpr int per = 16 / sizeof(T);
#pragma unroll
        for (int c = 0; c < W / per; c++) {
            pack16<T> r;
#pragma unroll
            for (int k = 0; k < per; k++)
                r.v[k] = kdt<T>::from(f[c * per + k]);
            *reinterpret_cast<pack16<T> *>(p + c * per) = r;
        }
    }
}

// Runs op.template run<KVEC>(i) over the vector body of n elements (when vec) and
// op.template run<1>(i) over the rest: op is a struct of typed pointers and scalars.
template <typename Op> __global__ void ew_kernel(Op op, uint64_t n, bool vec)
{
    uint64_t nv = vec ? n / KVEC : 0;
    GRID_STRIDE(v, nv) op.template run<KVEC>(v * KVEC);
    GRID_STRIDE(t, n - nv * KVEC) op.template run<1>(nv * KVEC + t);
}

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <typename Op> static int ew_launch(const Op &op, uint64_t n, bool vec, cudaStream_t s)
{
    if (n)
        ew_kernel<<<grid_for(vec ? CEIL_DIV(n, (uint64_t)KVEC) : n, 256), 256, 0, s>>>(op, n, vec);
    KCHECK();
}

// Calls fn with a null pointer of the element type of dtype code dt and returns true for
// fp32, bf16 and fp16; false (fn not called) for the others.
template <typename Fn> static bool with_float_type(int dt, Fn &&fn)
{
    switch (dt) {
    case MP_DT_F32: fn((float *)nullptr); return true;
    case MP_DT_BF16: fn((__nv_bfloat16 *)nullptr); return true;
    case MP_DT_F16: fn((__half *)nullptr); return true;
    default: return false;
    }
}

#define ELEM_T(ptr) typename std::remove_pointer<decltype(ptr)>::type

// ---- hashing (= mp_hash64 / mp_hash_unit in src/probe/probe_impl.h) ------------------------------

__device__ __forceinline__ uint64_t khash64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__device__ __forceinline__ float khash_unit(uint64_t x) { return (float)(khash64(x) >> 40) * (1.0f / 16777216.0f); }

// Dropout: kept elements scale by 1/(1-p); p <= 0 keeps everything.
__device__ __forceinline__ float keep_scale(uint64_t key, uint64_t idx, float p)
{
    if (p <= 0.0f)
        return 1.0f;
    return khash_unit(key + idx) >= p ? 1.0f / (1.0f - p) : 0.0f;
}

// ---- reductions ----------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v)
{
    __shared__ float red[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); // red[] may still be read by a previous call
    if (lane == 0)
        red[w] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.0f;
    return warp_sum(t);
}

__device__ __forceinline__ float block_max(float v)
{
    __shared__ float red[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        red[w] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : -INFINITY;
    return warp_max(t);
}

#endif
