/* kernels.h — C-callable launchers of memplan's CUDA kernels (the .cu files beside it).
 *
 * Every launcher enqueues on stream s, checks the launch and returns the
 * cudaError_t as an int (0 = success); none synchronises or allocates.
 * Dtype codes are enum mp_dtype's, activation codes enum mp_act's (util/sets.h, one table).
 * Gradient outputs accumulate (+=) into buffers the caller zeroed, unless a
 * comment says otherwise; a NULL gradient output is skipped.  Row-major
 * layouts throughout; shape letters as in src/ir/build.h (b, s, a, kv, d, M, V).
 */
#ifndef MEMPLAN_KERNELS_H
#define MEMPLAN_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "util/sets.h"

#ifdef __cplusplus
extern "C" {
#endif


/* ---- elementwise.cu ---------------------------------------------------------------------- */
int mp_k_fill(void *dst, int dt, float v, uint64_t n, cudaStream_t s);
/* dst = src converted (accumulate: dst += src) */
int mp_k_convert(void *dst, int ddt, const void *src, int sdt, uint64_t n, int accumulate, cudaStream_t s);
int mp_k_add(void *y, int ydt, const void *a, int adt, const void *b, int bdt, uint64_t n, cudaStream_t s);
/* dst = a * src (accumulate: dst += a * src): LoRA's result * scaling and its backward */
int mp_k_scale(void *dst, int ddt, const void *src, int sdt, uint64_t n, float a, int accumulate, cudaStream_t s);
int mp_k_mul_fwd(void *y, const void *a, const void *b, int dt, uint64_t n, cudaStream_t s);
int mp_k_mul_bwd(void *da, void *db, const void *dy, const void *a, const void *b, int dt, uint64_t n, cudaStream_t s);
/* keep[i] = hash(key + i) >= p; y = keep ? x / (1-p) : 0 */
int mp_k_dropout_fwd(void *y, const void *x, int dt, uint8_t *mask, uint64_t n, float p, uint64_t key, cudaStream_t s);
int mp_k_dropout_bwd(void *dx, const void *dy, int dt, const uint8_t *mask, uint64_t n, float p, cudaStream_t s);
/* y[(o*c + j)*inner + i] = bias[j] (overwrites: the GEMM then adds with beta = 1) */
int mp_k_bias_fill(void *y, int ydt, const void *bias, int bdt, uint64_t outer, uint64_t c, uint64_t inner,
                   cudaStream_t s);
/* db[j] += sum over o, i of dy[(o*c + j)*inner + i] */
int mp_k_bias_grad(void *db, int bdt, const void *dy, int dt, uint64_t outer, uint64_t c, uint64_t inner,
                   cudaStream_t s);

/* ---- quant.cu ----------------------------------------------------------------------------- */
/* A bitsandbytes NF4 weight in the executor's layout (src/model/quant.h mp_quant_pack): byte offsets
 * of its parts in the blob: packed nibbles (first element in the high nibble), the 16-entry
 * fp32 code, absmax (fp32 per block, or u8 with double quant), then with double quant the fp32
 * offset, the fp32 second-level absmax per 256 blocks and the 256-entry fp32 dynamic code. */
struct mp_k_nf4 {
    uint64_t n, blocksize;
    uint64_t packed, code, absmax, offset, absmax2, code2;
    int double_quant;
};
/* w[i] (n elements, wdt) = code[nibble i] * absmax[i / blocksize] (bitsandbytes dequantize_4bit) */
int mp_k_nf4_dequant(void *w, int wdt, const uint8_t *blob, struct mp_k_nf4 q, cudaStream_t s);

/* ---- activation.cu ----------------------------------------------------------------------- */
/* parts (optional, n_parts of n elements, each in its part_dts): what HF's Python GELUs save
 * (mp_math.h mp_gelu_part); y in ydt (fp32 where CUDA autocast upcasts gelu_new) */
int mp_k_act_fwd(void *y, int ydt, const void *x, int dt, uint64_t n, int act, void *const *parts,
                 const int *part_dts, int n_parts, cudaStream_t s);
/* dx (+)= dy * act'(saved): saved is x (gelu, silu), its fp32 copy, or y (relu, tanh, sigmoid);
 * overwrite for ReLU(inplace=True), whose dx and dy are one storage */
int mp_k_act_bwd(void *dx, int dxdt, const void *dy, int dydt, const void *saved, int sdt, uint64_t n, int act,
                 int overwrite, cudaStream_t s);

/* ---- embedding.cu ------------------------------------------------------------------------ */
int mp_k_embed_fwd(void *out, int odt, const int64_t *ids, const void *w, int wdt, uint64_t rows, uint64_t dim,
                   uint64_t vocab, cudaStream_t s);
int mp_k_embed_bwd(void *dw, int wdt, const int64_t *ids, const void *dy, int dt, uint64_t rows, uint64_t dim,
                   uint64_t vocab, cudaStream_t s);
/* y = x + w[row]; row = r mod seq, or 0 for every r when row0 */
int mp_k_addpos_fwd(void *y, int ydt, const void *x, int xdt, const void *w, int wdt, uint64_t rows, uint64_t dim,
                    uint64_t seq, int row0, cudaStream_t s);
int mp_k_addpos_bwd(void *dw, int wdt, const void *dy, int dt, uint64_t rows, uint64_t dim, uint64_t seq, int row0,
                    cudaStream_t s);

/* ---- norm.cu ----------------------------------------------------------------------------- */
int mp_k_layernorm_fwd(void *y, const void *x, int dt, const void *g, const void *b, int pdt, float *mean,
                       float *rstd, uint64_t rows, uint64_t n, float eps, cudaStream_t s);
int mp_k_layernorm_bwd(void *dx, void *dg, void *db, int pdt, const void *dy, const void *x, int dt,
                       const float *mean, const float *rstd, const void *g, uint64_t rows, uint64_t n,
                       cudaStream_t s);
/* HF RMSNorm: x32 (optional) = float(x); rs = rsqrt(mean(x^2) + eps); normed = (x*rs) in xdt;
 * y = g * normed in ydt */
int mp_k_rmsnorm_fwd(void *y, int ydt, const void *x, int xdt, float *x32, float *rs, void *normed, const void *g,
                     int pdt, uint64_t rows, uint64_t n, float eps, cudaStream_t s);
int mp_k_rmsnorm_bwd(void *dx, int xdt, void *dg, int pdt, const void *dy, int ydt, const void *xs, int xsdt,
                     const float *rs, const void *normed, const void *g, uint64_t rows, uint64_t n, cudaStream_t s);
/* training batch norm over (B, C, HW): saves per-channel mean and inverse std */
int mp_k_batchnorm_fwd(void *y, const void *x, int dt, const void *g, const void *b, int pdt, float *mean,
                       float *istd, uint64_t B, uint64_t C, uint64_t HW, float eps, cudaStream_t s);
int mp_k_batchnorm_bwd(void *dx, void *dg, void *db, int pdt, const void *dy, const void *x, int dt,
                       const float *mean, const float *istd, const void *g, uint64_t B, uint64_t C, uint64_t HW,
                       cudaStream_t s);

/* ---- rope.cu ------------------------------------------------------------------------------ */
/* Rotary (HF rotate_half) on the first rd of each head; rows are (b*s), position = row mod seq.
 * Forward: dst = rope(src); backward: dst += rope^T(src).  Widths/offsets in elements. */
int mp_k_rope(void *dst, int ddt, uint64_t dw, uint64_t doff, const void *src, int sdt, uint64_t sw, uint64_t soff,
              uint64_t rows, uint64_t heads, uint64_t hd, uint64_t rd, uint64_t seq, float base, int backward,
              cudaStream_t s);

/* ---- attention.cu ------------------------------------------------------------------------- */
struct mp_k_attn {
    const void *q, *k, *v;      /* (b, s, w*) storages; head h at column o* + h*d */
    int dt;                     /* q, k, v, out and their gradients */
    uint64_t b, s, a, kv, d;
    uint64_t wq, wk, wv, oq, ok, ov;
    int causal;
    float scale, p;             /* 1/sqrt(d); attention dropout */
    uint64_t key;               /* dropout key; element (bi, h, i, j) is ((bi*a + h)*s + i)*s + j */
};
/* The flash path (probe/cuda/probe_cuda_attention.c runs its GEMMs on cuBLAS): one block of query rows
 * [i0, i0 + qb) of the ne (sample, head) entries bh = e0 .. e0 + ne - 1, keys [0, jn);
 * workspace element ((bh - e0)*qb + i - i0)*jn + j, fp32 scores S = scale q.k. */
struct mp_k_fblock {
    uint64_t e0, ne, i0, qb, jn;
};
/* P (A->dt) = exp(S - lse) * dropout keep, 0 above the causal diagonal; lse[bh*s_lse + i] */
int mp_k_fa_softmax_fwd(const struct mp_k_attn *A, const struct mp_k_fblock *F, const float *S, void *P,
                        float *lse, uint64_t s_lse, cudaStream_t s);
/* from recomputed S and dP = dO.v (fp32): Pk = P*keep, dS = P*(dP*keep - dsum)*scale (A->dt) */
int mp_k_fa_softmax_bwd(const struct mp_k_attn *A, const struct mp_k_fblock *F, const float *S, const float *dP,
                        const float *lse, uint64_t s_lse, const float *dsum, uint64_t s_r, void *Pk, void *dS,
                        cudaStream_t s);
/* dsum[(bi*a + h)*s_r + i] = dO_i . O_i (the node's fp32 softmax_d temporary) */
int mp_k_flash_dsum(const struct mp_k_attn *A, const void *out, const void *dout, float *dsum, uint64_t s_r,
                    cudaStream_t s);
/* dq (q's widths/offsets) += dq_acc [b, s_r, a, d_r] (the node's fp32 dq_accum temporary) */
int mp_k_flash_dq_out(const struct mp_k_attn *A, const float *dq_acc, uint64_t s_r, uint64_t d_r, void *dq,
                      cudaStream_t s);
/* eager: contiguous (b, a, s, d) copies, k and v repeated over the group */
int mp_k_attn_pack(const struct mp_k_attn *A, void *qc, void *kc, void *vc, cudaStream_t s);
/* eager backward: g (input j's layout: 0 q, 1 k, 2 v; gdt) += src, the gradient of its (b, a, s, d)
 * copy (sdt), the heads of a kv group summed */
int mp_k_attn_gather(const struct mp_k_attn *A, int j, void *g, int gdt, const void *src, int sdt, cudaStream_t s);
/* probs (pdt) = softmax over each row of scores (sdt, rows of length sl), causal: row r masks j > r mod sl */
int mp_k_attn_softmax(void *probs, int pdt, const void *scores, int sdt, uint64_t rows, uint64_t sl, int causal,
                      cudaStream_t s);
/* what P@V reads: mask != NULL: mask = keep, pv = probs*keep/(1-p); else pv = probs cast */
int mp_k_attn_probs_out(void *pv, int cdt, uint8_t *mask, const void *probs, int pdt, uint64_t n, float p,
                        uint64_t key, cudaStream_t s);
/* out (b, s, a*d) = o (b, a, s, d) transposed (overwrites) */
int mp_k_attn_unpack(void *out, const void *o, int dt, uint64_t b, uint64_t sl, uint64_t a, uint64_t d,
                     cudaStream_t s);
/* dp *= mask/(1-p) (mask optional, in place); ds = P * (dp - rowsum(P*dp)) (overwrites) */
int mp_k_softmax_bwd(void *ds, void *dp, int pdt, const void *probs, const uint8_t *mask, float p, uint64_t rows,
                     uint64_t sl, cudaStream_t s);

/* ---- conv.cu ------------------------------------------------------------------------------ */
struct mp_k_conv {
    uint64_t ci, hi, wi, co, ho, wo, k, st, pad, g;
};
/* col (Kc x pc) for sample bi, group grp, output pixels [p0, p0+pc); Kc = ci/g*k*k (overwrites) */
int mp_k_im2col(void *col, const void *x, int dt, const struct mp_k_conv *C, uint64_t bi, uint64_t grp, uint64_t p0,
                uint64_t pc, cudaStream_t s);
/* dx += col2im(dcol) (fp32 dcol, Kc x pc) */
int mp_k_col2im(void *dx, int dt, const float *dcol, const struct mp_k_conv *C, uint64_t bi, uint64_t grp,
                uint64_t p0, uint64_t pc, cudaStream_t s);

/* ---- pool.cu ------------------------------------------------------------------------------ */
enum { MP_K_MAXPOOL = 0, MP_K_AVGPOOL = 1, MP_K_ADAPTIVE = 2 };
struct mp_k_pool {
    uint64_t planes, hi, wi, ho, wo, k, st, pad;
    int kind;
};
int mp_k_pool_fwd(void *y, const void *x, int dt, int64_t *idx, const struct mp_k_pool *P, cudaStream_t s);
int mp_k_pool_bwd(void *dx, const void *dy, int dt, const int64_t *idx, const struct mp_k_pool *P, cudaStream_t s);

/* ---- loss.cu ------------------------------------------------------------------------------ */
/* lp = log_softmax(logits) per row of V (lp in lp_dt, overwrites) */
int mp_k_log_softmax_fwd(void *lp, int lp_dt, const void *logits, int dt, uint64_t M, uint64_t V, cudaStream_t s);
/* dz += g - exp(lp) * rowsum(g) */
int mp_k_log_softmax_bwd(void *dz, int dz_dt, const void *lp, int lp_dt, const void *g, int g_dt, uint64_t M,
                         uint64_t V, cudaStream_t s);
/* *loss = -mean lp[r, labels[r]] (overwrites) */
int mp_k_nll_fwd(float *loss, const void *lp, int lp_dt, const int64_t *labels, uint64_t M, uint64_t V, cudaStream_t s);
/* dlp[r, labels[r]] += -dloss[0] / M */
int mp_k_nll_bwd(void *dlp, int dt, const int64_t *labels, const float *dloss, uint64_t M, uint64_t V, cudaStream_t s);
/* A model without a loss layer: *loss = 0.5*mean(y^2), grad = y/n (float y); bytes: mean/255, grad = y^0x55 */
int mp_k_implicit_loss(float *loss, void *grad, const void *y, int dt, uint64_t n, cudaStream_t s);

/* ---- custom.cu ---------------------------------------------------------------------------- */
/* An opaque block: out = a byte mix of the input and parameters; saved repeats it (as probe_host_custom.c) */
int mp_k_custom_fwd(uint8_t *out, uint8_t *saved, const uint8_t *in, uint64_t rows, uint64_t ib, uint64_t ob,
                    uint64_t eb, const void *w, int wdt, uint64_t np, cudaStream_t s);
int mp_k_custom_bwd(void *gin, int gdt, uint64_t per, const uint8_t *gout, const uint8_t *saved, uint64_t rows,
                    uint64_t ob, uint64_t eb, void *gw, int wdt, uint64_t np, cudaStream_t s);

/* ---- optim.cu ----------------------------------------------------------------------------- */
int mp_k_sgd(void *p, const void *g, int dt, uint64_t n, float lr, cudaStream_t s);
int mp_k_sgd_momentum(void *p, const void *g, void *buf, int dt, uint64_t n, float lr, float mom, int first,
                      cudaStream_t s);
/* m, v in sdt; den (optional, dt): the sqrt(v)/sqrt(bc2) + eps temporary */
int mp_k_adam(void *p, const void *g, int dt, void *m, void *v, int sdt, void *den, uint64_t n, float lr, float b1,
              float b2, float eps, float wd, float bc1, float bc2, cudaStream_t s);
/* blockwise 8-bit state: [u8 m n][u8 v n][f32 absmax_m nb][f32 absmax_v nb], 256-element blocks */
int mp_k_adam8(void *p, const void *g, int dt, uint8_t *state, uint64_t n, float lr, float b1, float b2, float eps,
               float bc1, float bc2, cudaStream_t s);
/* torch.optim.Adafactor for one tensor: state [rows + cols] (matrix) or [n]; est (dt, n) the
 * temporary; scratch: 4 device floats */
int mp_k_adafactor(void *p, const void *g, int dt, void *state, void *est, uint64_t rows, uint64_t cols, int matrix,
                   float *scratch, float b2, float rho, float eps1, float eps2, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
