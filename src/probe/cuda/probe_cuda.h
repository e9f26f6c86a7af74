/* probe_cuda.h — private to the cuda backend: probe_cuda.c (the backend: context, storage, the
 * prim table, the run), probe_cuda_gemm.c (cuBLAS, loaded on first use, the status checks and the
 * GEMMs) and probe_cuda_<family>.c, one per op family as in kernels/ and probe/host/.
 */
#ifndef MEMPLAN_PROBE_CUDA_H
#define MEMPLAN_PROBE_CUDA_H

#include "probe/probe_impl.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "../../../kernels/kernels.h"

/* cuBLAS's entry points (probe_cuda_gemm.c, blas_load) */
struct cu_blas {
    void *lib;
    __typeof__(&cublasCreate_v2) create;
    __typeof__(&cublasDestroy_v2) destroy;
    __typeof__(&cublasSetStream_v2) set_stream;
    __typeof__(&cublasSetWorkspace_v2) set_workspace;
    __typeof__(&cublasGemmStridedBatchedEx) gemm_strided_batched_ex;
    __typeof__(&cublasGemmBatchedEx) gemm_batched_ex;
    __typeof__(&cublasGetStatusName) status_name;
};
extern struct cu_blas blas_api;

#undef cublasCreate
#undef cublasDestroy
#undef cublasSetStream
#undef cublasSetWorkspace
#define cublasCreate(h) (blas_api.create(h))
#define cublasDestroy(h) (blas_api.destroy(h))
#define cublasSetStream(h, s) (blas_api.set_stream((h), (s)))
#define cublasSetWorkspace(h, p, n) (blas_api.set_workspace((h), (p), (n)))
#define cublasGemmStridedBatchedEx (*blas_api.gemm_strided_batched_ex)
#define cublasGemmBatchedEx (*blas_api.gemm_batched_ex)
#define cublasGetStatusName(e) (blas_api.status_name ? blas_api.status_name(e) : "cuBLAS error")

#ifndef MP_PROBE_ATTN_WS_BYTES
#define MP_PROBE_ATTN_WS_BYTES ((uint64_t)64 << 20) /* flash-path workspace limit */
#endif
#ifndef MP_PROBE_COL_CAP_BYTES
#define MP_PROBE_COL_CAP_BYTES ((uint64_t)64 << 20) /* im2col buffer limit (tests may lower it) */
#endif
#define N_SCALARS 16                         /* [0] loss, [4..8) adafactor scratch */

/* Statement-safe checks (ggml's shape) that return a status instead of aborting. */
#define CK(d, call)                                                    \
    do {                                                               \
        cudaError_t e_ = (call);                                       \
        if (e_ != cudaSuccess)                                         \
            return cuda_fail((d), e_, #call, __FILE__, __LINE__);      \
    } while (0)
#define KK(d, call)                                                                 \
    do {                                                                            \
        int e_ = (call);                                                            \
        if (e_ != 0)                                                                \
            return cuda_fail((d), (cudaError_t)e_, #call, __FILE__, __LINE__);      \
    } while (0)
#define BK(d, call)                                                    \
    do {                                                               \
        cublasStatus_t b_ = (call);                                    \
        if (b_ != CUBLAS_STATUS_SUCCESS)                               \
            return blas_fail((d), b_, #call, __FILE__, __LINE__);      \
    } while (0)

/* ---- the backend context ------------------------------------------------------------------ */

struct cu_ctx {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    bool mempool;          /* cudaMallocAsync from the device's default pool */
    cudaMemPool_t pool;
    float *scalars;        /* device: N_SCALARS floats */
    float *host_loss;      /* pinned: the step's loss, copied at LOSS_GRAD */
    struct mp_device_info info;
};

/* ---- the run's state (struct mp_exec bx) ------------------------------------------------------- */

struct cu_run {
    void *col;             /* im2col / dcol buffer, col_bytes */
    uint64_t col_bytes;
    bool timing;           /* the GEMM-profiling step (after the timed ones): an event pair per GEMM */
    double gemm_flops, gemm_ms;
    cudaEvent_t *ev;       /* GEMM start/stop pairs of the current step */
    size_t n_ev, cap_ev;
    cudaEvent_t t0, t1;    /* around each step */
    /* pointer arrays of the batched GEMMs (cublasGemmBatchedEx): filled on the host (pinned),
     * copied to the device beside them; slots are not reused within a step */
    const void **hab;      /* A and B pointers: 2 * PTR_CAP */
    void **hc;             /* C pointers: PTR_CAP */
    void *hbase, *dptr;    /* pinned and device: the A/B array, then the C array (3 * PTR_CAP pointers) */
    size_t ptr_used;       /* entries taken this step */
    float *attn_ws;        /* the flash path's workspace, attn_ws_bytes (see flash_fwd) */
    uint64_t attn_ws_bytes;
};

static inline struct cu_ctx *CX(const struct mp_exec *x) { return x->bctx; }
static inline struct cu_run *RUN(const struct mp_exec *x) { return x->bx; }
static inline cudaStream_t S(const struct mp_exec *x) { return CX(x)->stream; }
static inline uint64_t esz(int dt) { return mp_dtype_size((enum mp_dtype)dt); }
static inline void *at(struct mp_view v, uint64_t elem) { return (char *)v.p + elem * esz(v.dt); }

/* One pointer-array batched GEMM being filled: entry i multiplies a[i], b[i] into c[i]. */
struct gemm_ptrs {
    const void **a, **b;
    void **c;
    size_t off; /* the first entry's index in the run's pointer arrays */
    uint64_t n;
};

#define PTR_CAP ((size_t)1 << 15)                    /* batched-GEMM entries per step before a drain */
#define PTR_BYTES (3 * PTR_CAP * sizeof(void *)) /* 768 KiB on the device, as much pinned */

#define GEMM(...)                                   \
    do {                                            \
        enum mp_status g_ = gemm(__VA_ARGS__);      \
        if (g_ != MP_OK)                            \
            return g_;                              \
    } while (0)
#define GEMM_BATCHED(...)                                   \
    do {                                                    \
        enum mp_status g_ = gemm_batched(__VA_ARGS__);      \
        if (g_ != MP_OK)                                    \
            return g_;                                      \
    } while (0)
#define PTRS(x, n, g)                                           \
    do {                                                        \
        enum mp_status g_ = gemm_ptrs_take((x), (n), (g));      \
        if (g_ != MP_OK)                                        \
            return g_;                                          \
    } while (0)

/* ---- one node --------------------------------------------------------------------------------- */

/* The node's extra with role r (layers.h mp_xrole); p == NULL when it has none. */
static inline struct mp_view xr(const struct mp_node_view *c, enum mp_xrole r) { return mp_view_extra(c, r); }
static inline bool has_x(const struct mp_node_view *c, enum mp_xrole r) { return mp_node_extra(c->n, r, 0) >= 0; }

/* The part of the node's TMP storage with role r (NULL when it has none, or not that size). */
static inline void *tmp_part(const struct mp_node_view *c, bool bwd, enum mp_trole r, uint64_t want_bytes)
{
    uint64_t bytes;
    void *t = mp_view_tmp(c, bwd, r, &bytes);
    return t && (!want_bytes || bytes == want_bytes) ? t : NULL;
}

static inline enum mp_status missing(struct mp_node_view *c, const char *what)
{
    return mp_fail(c->x->d, MP_ERR_INTERNAL, "probe: %s (%s): %s is not allocated", c->n->name,
                   mp_prim_str(c->n->prim), what);
}

#define NEED(view)                        \
    do {                                  \
        if (!(view).p)                    \
            return missing(c, #view);     \
    } while (0)

/* Workspace bytes per (entry, query row, key): S and dP fp32, P and dS at most 4 bytes. */
#define FA_WS_PER 16

/* probe_cuda_gemm.c */
enum mp_status blas_load(struct mp_diag *d);
enum mp_status cuda_fail(struct mp_diag *d, cudaError_t e, const char *call, const char *file, int line);
enum mp_status blas_fail(struct mp_diag *d, cublasStatus_t e, const char *call, const char *file, int line);
enum mp_status gemm(struct mp_exec *x, bool ta, bool tb, uint64_t M, uint64_t N, uint64_t K, float alpha,
                    const void *A, int adt, uint64_t lda, uint64_t sA, const void *B, int bdt, uint64_t ldb,
                    uint64_t sB, float beta, void *C, int cdt, uint64_t ldc, uint64_t sC, uint64_t batch);
enum mp_status gemm_ptrs_take(struct mp_exec *x, uint64_t n, struct gemm_ptrs *g);
enum mp_status gemm_batched(struct mp_exec *x, bool ta, bool tb, uint64_t M, uint64_t N, uint64_t K,
                            float alpha, const struct gemm_ptrs *g, int adt, uint64_t lda, int bdt,
                            uint64_t ldb, float beta, int cdt, uint64_t ldc);

/* probe_cuda_embedding.c */
enum mp_status embed_run(struct mp_node_view *c, bool fwd);
enum mp_status addpos_run(struct mp_node_view *c, bool fwd);

/* probe_cuda_elementwise.c */
enum mp_status pass_run(struct mp_node_view *c, bool fwd);
enum mp_status scale_run(struct mp_node_view *c, bool fwd);
enum mp_status mul_run(struct mp_node_view *c, bool fwd);
enum mp_status dropout_run(struct mp_node_view *c, bool fwd);

/* probe_cuda_linear.c */
enum mp_status matmul_weight(struct mp_node_view *c, bool fwd, struct mp_view *w);
enum mp_status linear_run(struct mp_node_view *c, bool fwd);

/* probe_cuda_norm.c */
enum mp_status layernorm_run(struct mp_node_view *c, bool fwd);
enum mp_status rmsnorm_run(struct mp_node_view *c, bool fwd);
enum mp_status batchnorm_run(struct mp_node_view *c, bool fwd);

/* probe_cuda_rope.c */
enum mp_status rope_run(struct mp_node_view *c, bool fwd);

/* probe_cuda_attention.c */
enum mp_status flash_run(struct mp_node_view *c, bool fwd);
enum mp_status eager_fwd(struct mp_node_view *c);
enum mp_status eager_bwd(struct mp_node_view *c);

/* probe_cuda_activation.c */
enum mp_status act_run(struct mp_node_view *c, bool fwd);

/* probe_cuda_conv.c */
enum mp_status conv_run(struct mp_node_view *c, bool fwd);

/* probe_cuda_pool.c */
enum mp_status pool_run(struct mp_node_view *c, bool fwd);

/* probe_cuda_loss.c */
enum mp_status log_softmax_run(struct mp_node_view *c, bool fwd);
enum mp_status nll_run(struct mp_node_view *c, bool fwd);
enum mp_status cuda_loss_grad(struct mp_exec *x, struct mp_view y, struct mp_view g, bool ce);

/* probe_cuda_custom.c */
enum mp_status custom_run(struct mp_node_view *c, bool fwd);

/* probe_cuda_optim.c */
enum mp_status cuda_opt_param(struct mp_exec *x, const struct mp_param_view *v);

#endif
