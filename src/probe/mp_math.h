/* mp_math.h — the arithmetic both probe backends share, written once: C (probe_host_*.c)
 * and CUDA (kernels/) include it.  Activations and their derivatives (from what
 * autograd saves: x, or y for ReLU/tanh/sigmoid), HF's composite-GELU intermediates,
 * the 8-bit Adam state codes and the hyper-parameters of the probe's training step.
 * Scalar functions only: no allocation, no I/O, no memplan types.
 */
#ifndef MEMPLAN_MP_MATH_H
#define MEMPLAN_MP_MATH_H

#include <math.h>
#include <stdint.h>

#include "util/sets.h"

#ifdef __CUDACC__
#define MP_HD static __host__ __device__ __forceinline__
#else
#define MP_HD static inline
#endif

/* ---- hyper-parameters of the probe's step (both backends) -------------------------------- */

#define MP_SGD_LR 0.05f
#define MP_SGD_MOMENTUM 0.9f
#define MP_ADAM_LR 1e-2f
#define MP_ADAM_BETA1 0.9f
#define MP_ADAM_BETA2 0.999f
#define MP_ADAM_EPS 1e-8f
#define MP_ADAMW_WD 0.01f
#define MP_ADAFACTOR_LR 1e-2f       /* torch.optim.Adafactor defaults */
#define MP_ADAFACTOR_BETA2_DECAY (-0.8f)
#define MP_ADAFACTOR_EPS2 1e-3f
#define MP_ADAM8_BLOCK 256          /* bitsandbytes blockwise quantization */
#define MP_ADAM8_MIN_ELEMS 4096     /* smaller tensors keep fp32 states */
#define MP_LN_EPS 1e-5f
#define MP_RMS_EPS 1e-6f
#define MP_BN_EPS 1e-5f
#define MP_ROPE_BASE 10000.0f

/* ---- activations ---------------------------------------------------------------------------
 * a is an enum mp_act (util/sets.h: MP_ACTIVATIONS); each function switches on it with no
 * default, so -Wswitch names an activation without its math; a value outside the set gives
 * NaN, never a plausible number. */
/* xIELU at its initial scalars (XIELUActivation: alpha_p 0.8, alpha_n 0.8, beta 0.5, eps -1e-6) */
#define MP_XIELU_AP 0.8f
#define MP_XIELU_AN 0.8f
#define MP_XIELU_BETA 0.5f
#define MP_XIELU_EPS (-1e-6f)

#define MP_SQRT_2_OVER_PI 0.79788456080f
#define MP_GELU_TANH_C 0.044715f

MP_HD float mp_act_f(int a, float x)
{
    switch ((enum mp_act)a) {
    case MP_ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118f));
    case MP_ACT_GELU_TANH:
    case MP_ACT_GELU_NEW:
    case MP_ACT_GELU_FAST: return 0.5f * x * (1.0f + tanhf(MP_SQRT_2_OVER_PI * (x + MP_GELU_TANH_C * x * x * x)));
    case MP_ACT_RELU: return x > 0.0f ? x : 0.0f;
    case MP_ACT_SILU: return x / (1.0f + expf(-x));
    case MP_ACT_TANH: return tanhf(x);
    case MP_ACT_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case MP_ACT_QUICK_GELU: return x / (1.0f + expf(-1.702f * x));
    case MP_ACT_RELU2: return x > 0.0f ? x * x : 0.0f;
    case MP_ACT_XIELU:
        return x > 0.0f ? MP_XIELU_AP * x * x + MP_XIELU_BETA * x
                        : (expm1f(fminf(x, MP_XIELU_EPS)) - x) * MP_XIELU_AN + MP_XIELU_BETA * x;
    }
    return NAN; /* not an activation */
}

/* dy/dx from the saved tensor s: x (GELUs, SiLU, ReLU^2) or y (ReLU, tanh, sigmoid). */
MP_HD float mp_act_df(int a, float s)
{
    switch ((enum mp_act)a) {
    case MP_ACT_GELU: return 0.5f * (1.0f + erff(s * 0.70710678118f)) + s * 0.39894228040f * expf(-0.5f * s * s);
    case MP_ACT_GELU_TANH:
    case MP_ACT_GELU_NEW:
    case MP_ACT_GELU_FAST: {
        float u = MP_SQRT_2_OVER_PI * (s + MP_GELU_TANH_C * s * s * s), t = tanhf(u);
        return 0.5f * (1.0f + t) +
               0.5f * s * (1.0f - t * t) * MP_SQRT_2_OVER_PI * (1.0f + 3.0f * MP_GELU_TANH_C * s * s);
    }
    case MP_ACT_RELU: return s > 0.0f ? 1.0f : 0.0f;
    case MP_ACT_SILU: {
        float sg = 1.0f / (1.0f + expf(-s));
        return sg * (1.0f + s * (1.0f - sg));
    }
    case MP_ACT_TANH: return 1.0f - s * s;
    case MP_ACT_SIGMOID: return s * (1.0f - s);
    case MP_ACT_QUICK_GELU: {
        float sg = 1.0f / (1.0f + expf(-1.702f * s));
        return sg * (1.0f + 1.702f * s * (1.0f - sg));
    }
    case MP_ACT_RELU2: return s > 0.0f ? 2.0f * s : 0.0f;
    case MP_ACT_XIELU:
        return s > 0.0f ? 2.0f * MP_XIELU_AP * s + MP_XIELU_BETA
                        : (s < MP_XIELU_EPS ? expf(s) - 1.0f : -1.0f) * MP_XIELU_AN + MP_XIELU_BETA;
    }
    return NAN; /* not an activation */
}

/* Intermediate j of HF's Python GELUs (and xIELU, quick_gelu), in mp_act_intermediates order.
 * gelu_new: tanh, 0.5x, 1+tanh; gelu_fast: 0.044715x, 0.7978845608x, 1+0.044715x^2, tanh, 0.5x, 1+tanh. */
MP_HD float mp_gelu_part(int a, int j, float x)
{
    if (a == MP_ACT_XIELU) { /* x > 0 (a bool), alpha_p * x, expm1(min(x, eps)), that - x */
        float e = expm1f(fminf(x, MP_XIELU_EPS));
        return j == 0 ? (x > 0.0f ? 1.0f : 0.0f) : j == 1 ? MP_XIELU_AP * x : j == 2 ? e : e - x;
    }
    if (a == MP_ACT_QUICK_GELU) /* sigmoid(1.702 x) */
        return 1.0f / (1.0f + expf(-1.702f * x));
    float t = tanhf(MP_SQRT_2_OVER_PI * x * (1.0f + MP_GELU_TANH_C * x * x));
    switch (a == MP_ACT_GELU_FAST ? j : j + 3) {
    case 0: return MP_GELU_TANH_C * x;
    case 1: return MP_SQRT_2_OVER_PI * x;
    case 2: return 1.0f + MP_GELU_TANH_C * x * x;
    case 3: return t;
    case 4: return 0.5f * x;
    default: return 1.0f + t;
    }
}

/* ---- 8-bit Adam state codes ------------------------------------------------------------------
 * Blockwise (MP_ADAM8_BLOCK elements share one fp32 absmax per state), companded rather than
 * bitsandbytes' dynamic tree map: m = sign * (c/127)^2 * absmax, v = (c/255)^4 * absmax. */
MP_HD float mp_q8_m_dec(uint8_t c, float amax)
{
    int v = (int)(int8_t)c;
    float f = (float)(v < 0 ? -v : v) / 127.0f;
    return (v < 0 ? -1.0f : 1.0f) * f * f * amax;
}

MP_HD uint8_t mp_q8_m_enc(float m, float amax)
{
    if (amax <= 0.0f)
        return 0;
    int v = (int)rintf(127.0f * sqrtf(fminf(fabsf(m) / amax, 1.0f)));
    return (uint8_t)(int8_t)(m < 0.0f ? -v : v);
}

MP_HD float mp_q8_v_dec(uint8_t c, float amax)
{
    float f = (float)c / 255.0f;
    return f * f * f * f * amax;
}

MP_HD uint8_t mp_q8_v_enc(float v, float amax)
{
    if (amax <= 0.0f)
        return 0;
    return (uint8_t)rintf(255.0f * sqrtf(sqrtf(fminf(fmaxf(v, 0.0f) / amax, 1.0f))));
}

#endif
