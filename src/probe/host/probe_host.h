/* probe_host.h — private to the host backend: probe_host.c (the backend: storage,
 * the prim table) and probe_host_<family>.c, one per op family as in kernels/.
 *
 * Element access and float scratch for a node view (struct mp_node_view, probe_impl.h),
 * inline here so the family files depend on no host file but probe_host_gemm.c.  Half
 * tensors hold 2-byte values (round to nearest even); math is float, most sums double.
 * Float operand copies made while a node runs (a GPU's registers) are scratch, outside
 * the pool, freed after the node (host_node_end, probe_host.c).  Letters: M rows, K inner.
 */
#ifndef MEMPLAN_PROBE_HOST_H
#define MEMPLAN_PROBE_HOST_H

#include <stdlib.h>
#include <string.h>

#include "probe/probe_impl.h"

/* ---- element access ------------------------------------------------------------------------ */

static inline float ldf(struct mp_view v, uint64_t i) { return mp_view_ld(v, i); }
static inline void stf(struct mp_view v, uint64_t i, float f) { mp_view_st(v, i, f); }
static inline void accf(struct mp_view v, uint64_t i, float f) { stf(v, i, ldf(v, i) + f); }

/* The node's extra with role r (layers.h mp_xrole); p == NULL when it has none. */
static inline struct mp_view xr(const struct mp_node_view *c, enum mp_xrole r) { return mp_view_extra(c, r); }

/* The part of the node's TMP storage with role r, as floats (NULL when it has none). */
static inline float *tmp_part(const struct mp_node_view *c, bool bwd, enum mp_trole r, uint64_t *bytes)
{
    return (float *)mp_view_tmp(c, bwd, r, bytes);
}

/* ---- scratch: float copies that live while one node runs ------------------------------------- */

#define MP_HOST_MAX_SCRATCH 24

struct mp_host_scratch { /* the host backend's per-run state (struct mp_exec bx) */
    void *p[MP_HOST_MAX_SCRATCH];
    int n;
};

static inline enum mp_status nomem(struct mp_node_view *c)
{
    return mp_fail(c->x->d, MP_ERR_NOMEM, "probe: %s: out of host memory for scratch", c->n->name);
}

static inline enum mp_status missing(struct mp_node_view *c, const char *what)
{
    return mp_fail(c->x->d, MP_ERR_INTERNAL, "probe: %s (%s): %s is not allocated", c->n->name, mp_prim_str(c->n->prim),
                   what);
}

/* Zeroed float scratch of n elements, freed when the node ends; NULL on failure. */
static inline float *fscratch(struct mp_node_view *c, uint64_t n)
{
    struct mp_host_scratch *s = c->x->bx;
    if (s->n >= MP_HOST_MAX_SCRATCH || n > SIZE_MAX / sizeof(float))
        return NULL;
    float *f = calloc(n ? (size_t)n : 1, sizeof *f);
    if (f)
        s->p[s->n++] = f;
    return f;
}

/* The storage as floats: itself when fp32, else a converted scratch copy. */
static inline float *fget(struct mp_node_view *c, struct mp_view v)
{
    if (!v.p)
        return NULL;
    if (v.dt == MP_DT_F32)
        return v.p;
    float *f = fscratch(c, v.n);
    if (!f)
        return NULL;
    if (v.dt == MP_DT_BF16) { /* the common half: one loop without a dtype switch per element */
        const uint16_t *h = v.p;
        for (uint64_t i = 0; i < v.n; i++)
            f[i] = mp_f32_from_bf16(h[i]);
    } else {
        for (uint64_t i = 0; i < v.n; i++)
            f[i] = ldf(v, i);
    }
    return f;
}

static inline void fstore(struct mp_view v, const float *src, uint64_t n)
{
    if (v.dt == MP_DT_F32) {
        if (v.p != src)
            memcpy(v.p, src, (size_t)n * sizeof(float));
        return;
    }
    if (v.dt == MP_DT_BF16) {
        uint16_t *h = v.p;
        for (uint64_t i = 0; i < n; i++)
            h[i] = mp_bf16_from_f32(src[i]);
        return;
    }
    for (uint64_t i = 0; i < n; i++)
        stf(v, i, src[i]);
}

static inline void facc(struct mp_view v, const float *src, uint64_t n)
{
    if (!v.p)
        return;
    if (v.dt == MP_DT_F32) {
        float *f = v.p;
        for (uint64_t i = 0; i < n; i++)
            f[i] += src[i];
        return;
    }
    if (v.dt == MP_DT_BF16) {
        uint16_t *h = v.p;
        for (uint64_t i = 0; i < n; i++)
            h[i] = mp_bf16_from_f32(mp_f32_from_bf16(h[i]) + src[i]);
        return;
    }
    for (uint64_t i = 0; i < n; i++)
        accf(v, i, src[i]);
}

#define FGET(var, view)                 \
    float *var = fget(c, (view));       \
    if (!var)                           \
        return (view).p ? nomem(c) : missing(c, #view)
#define FNEW(var, count)                \
    float *var = fscratch(c, (count));  \
    if (!var)                           \
        return nomem(c)
#define NEED(view)                      \
    do {                                \
        if (!(view).p)                  \
            return missing(c, #view);   \
    } while (0)

/* ---- the GEMM (probe_host_gemm.c) ------------------------------------------------------------ */

/* Row-major C (M,N) = alpha op(A) op(B) + beta C; op(X) = X^T when t.  cblas_sgemm when
 * built with a CPU BLAS, else plain C (double sums).  MP_ERR_NOMEM only on the plain path. */
enum mp_status mp_host_gemm(bool ta, bool tb, uint64_t M, uint64_t N, uint64_t K, float alpha, const float *A,
                            uint64_t lda, const float *B, uint64_t ldb, float beta, float *C, uint64_t ldc);
/* True when the host GEMMs run on a CPU BLAS. */
bool mp_host_blas(void);

/* ---- the prims, by family (each file's forward and backward) ------------------------------- */

/* probe_host_embedding.c */
enum mp_status mp_host_embed_fwd(struct mp_node_view *c);
enum mp_status mp_host_embed_bwd(struct mp_node_view *c);
enum mp_status mp_host_addpos_fwd(struct mp_node_view *c);
enum mp_status mp_host_addpos_bwd(struct mp_node_view *c);
/* probe_host_elementwise.c: cast, add, mul, LoRA's scale, dropout */
enum mp_status mp_host_cast_fwd(struct mp_node_view *c);
enum mp_status mp_host_pass_bwd(struct mp_node_view *c); /* cast, add: the gradient passes through */
enum mp_status mp_host_add_fwd(struct mp_node_view *c);
enum mp_status mp_host_mul_fwd(struct mp_node_view *c);
enum mp_status mp_host_mul_bwd(struct mp_node_view *c);
enum mp_status mp_host_scale_fwd(struct mp_node_view *c);
enum mp_status mp_host_scale_bwd(struct mp_node_view *c);
enum mp_status mp_host_dropout_fwd(struct mp_node_view *c);
enum mp_status mp_host_dropout_bwd(struct mp_node_view *c);
/* probe_host_linear.c */
enum mp_status mp_host_linear_fwd(struct mp_node_view *c);
enum mp_status mp_host_linear_bwd(struct mp_node_view *c);
/* The weight a GEMM (or conv) uses as floats: the dequantized base weight, under
 * autocast the half copy (refreshed in forward), else the parameter. */
enum mp_status mp_host_linear_weight(struct mp_node_view *c, bool fwd, float **wf);
/* A Linear's or conv's forward operands as floats: the weight (mp_host_linear_weight), the
 * input, the bias (NULL without one). */
enum mp_status mp_host_matmul_inputs(struct mp_node_view *c, float **w, float **x, float **bias);
/* Adds the weight gradient dw (count floats) into .grad, through the half temporary
 * under autocast (PyTorch: a half grad, then its fp32 copy into .grad). */
enum mp_status mp_host_weight_grad(struct mp_node_view *c, const float *dw, uint64_t count);
/* probe_host_norm.c */
enum mp_status mp_host_layernorm_fwd(struct mp_node_view *c);
enum mp_status mp_host_layernorm_bwd(struct mp_node_view *c);
enum mp_status mp_host_rmsnorm_fwd(struct mp_node_view *c);
enum mp_status mp_host_rmsnorm_bwd(struct mp_node_view *c);
enum mp_status mp_host_batchnorm_fwd(struct mp_node_view *c);
enum mp_status mp_host_batchnorm_bwd(struct mp_node_view *c);
/* probe_host_rope.c */
enum mp_status mp_host_rope_fwd(struct mp_node_view *c);
enum mp_status mp_host_rope_bwd(struct mp_node_view *c);
/* probe_host_attention.c: flash/SDPA and eager */
enum mp_status mp_host_attn_fwd(struct mp_node_view *c);
enum mp_status mp_host_attn_bwd(struct mp_node_view *c);
/* probe_host_activation.c */
enum mp_status mp_host_act_fwd(struct mp_node_view *c);
enum mp_status mp_host_act_bwd(struct mp_node_view *c);
/* probe_host_conv.c */
enum mp_status mp_host_conv_fwd(struct mp_node_view *c);
enum mp_status mp_host_conv_bwd(struct mp_node_view *c);
/* probe_host_pool.c: max, avg, adaptive avg */
enum mp_status mp_host_pool_fwd(struct mp_node_view *c);
enum mp_status mp_host_pool_bwd(struct mp_node_view *c);
/* probe_host_loss.c: log-softmax, NLL, and the step's loss */
enum mp_status mp_host_log_softmax_fwd(struct mp_node_view *c);
enum mp_status mp_host_log_softmax_bwd(struct mp_node_view *c);
enum mp_status mp_host_nll_fwd(struct mp_node_view *c);
enum mp_status mp_host_nll_bwd(struct mp_node_view *c);
enum mp_status mp_host_loss_grad(struct mp_exec *x, struct mp_view y, struct mp_view g, bool ce);
/* probe_host_custom.c */
enum mp_status mp_host_custom_fwd(struct mp_node_view *c);
enum mp_status mp_host_custom_bwd(struct mp_node_view *c);
/* probe_host_optim.c: one parameter's update */
enum mp_status mp_host_opt_param(struct mp_exec *x, const struct mp_param_view *v);

#endif
