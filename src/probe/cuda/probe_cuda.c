/* probe_cuda.c — the cuda backend: the tensor program executed on one GPU (C11,
 * CUDA runtime and cuBLAS C APIs).  probe.c's executor runs the step; this file gives
 * it storage (each ALLOC/FREE is one cudaMallocAsync/cudaFreeAsync, driver-cached like
 * PyTorch's caching allocator, through the counting pool, so the measured peak is the
 * estimator's), event timing and the prim table: GEMMs are cuBLAS (bf16/fp16 in, fp32
 * compute), the rest kernels/; cuBLAS's workspace is the replay's WORKSPACE storage.
 * Outside the pool (seen in device_used_*): context, handle, a few scalars, a bounded
 * im2col buffer.  OOM frees everything: a result.
 */
#include "probe/probe_impl.h"

#include <dlfcn.h> /* dlopen: cuBLAS is loaded when the backend opens */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "../../../kernels/kernels.h"

#ifndef MEMPLAN_CUDA_LIBDIR
#define MEMPLAN_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

/* ---- cuBLAS, loaded on first use ----------------------------------------------------------
 * Linking libcublas would map its ~700 MB of libraries into every memplan run
 * (about 100 ms before main) for a backend most commands never open, so the seven
 * entry points used here are resolved with dlopen when the cuda backend opens. */
static struct {
    void *lib;
    __typeof__(&cublasCreate_v2) create;
    __typeof__(&cublasDestroy_v2) destroy;
    __typeof__(&cublasSetStream_v2) set_stream;
    __typeof__(&cublasSetWorkspace_v2) set_workspace;
    __typeof__(&cublasGemmStridedBatchedEx) gemm_strided_batched_ex;
    __typeof__(&cublasGemmBatchedEx) gemm_batched_ex;
    __typeof__(&cublasGetStatusName) status_name;
} blas_api;

static bool blas_sym(void *lib, const char *name, void *fnptr)
{
    void *p = dlsym(lib, name);
    memcpy(fnptr, &p, sizeof p); /* object pointer to function pointer, as POSIX dlsym intends */
    return p != NULL;
}

static enum mp_status blas_load(struct mp_diag *d)
{
    if (blas_api.lib)
        return MP_OK;
    char name[64], path[512];
    snprintf(name, sizeof name, "libcublas.so.%d", CUBLAS_VER_MAJOR);
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(path, sizeof path, "%s/%s", MEMPLAN_CUDA_LIBDIR, name);
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!lib)
        return mp_fail(d, MP_ERR_DEVICE, "cannot load %s (cuBLAS %d): %s", name, CUBLAS_VER_MAJOR, dlerror());
    if (!blas_sym(lib, "cublasCreate_v2", &blas_api.create) || !blas_sym(lib, "cublasDestroy_v2", &blas_api.destroy) ||
        !blas_sym(lib, "cublasSetStream_v2", &blas_api.set_stream) ||
        !blas_sym(lib, "cublasSetWorkspace_v2", &blas_api.set_workspace) ||
        !blas_sym(lib, "cublasGemmStridedBatchedEx", &blas_api.gemm_strided_batched_ex) ||
        !blas_sym(lib, "cublasGemmBatchedEx", &blas_api.gemm_batched_ex) ||
        !blas_sym(lib, "cublasGetStatusName", &blas_api.status_name)) {
        dlclose(lib);
        return mp_fail(d, MP_ERR_DEVICE, "%s lacks an expected cuBLAS entry point", name);
    }
    blas_api.lib = lib;
    return MP_OK;
}

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

/* ---- checks ------------------------------------------------------------------------------ */

static enum mp_status cuda_fail(struct mp_diag *d, cudaError_t e, const char *call, const char *file, int line)
{
    return mp_fail(d, MP_ERR_DEVICE, "%s failed at %s:%d: %s: %s", call, file, line, cudaGetErrorName(e),
                   cudaGetErrorString(e));
}

static enum mp_status blas_fail(struct mp_diag *d, cublasStatus_t e, const char *call, const char *file, int line)
{
    return mp_fail(d, MP_ERR_DEVICE, "%s failed at %s:%d: %s", call, file, line, cublasGetStatusName(e));
}

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

static bool cuda_available(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

static void ctx_free(struct cu_ctx *cx)
{
    if (!cx)
        return;
    if (cx->blas)
        cublasDestroy(cx->blas);
    if (cx->scalars)
        cudaFree(cx->scalars);
    if (cx->host_loss)
        cudaFreeHost(cx->host_loss);
    if (cx->mempool)
        cudaMemPoolTrimTo(cx->pool, 0);
    if (cx->stream)
        cudaStreamDestroy(cx->stream);
    (void)cudaGetLastError();
    free(cx);
}

static enum mp_status ctx_open(struct cu_ctx *cx, int dev, struct mp_diag *d)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mp_fail(d, MP_ERR_DEVICE, "no usable CUDA device: %s", cudaGetErrorString(e));
    }
    if (dev < 0 || dev >= n)
        return mp_fail(d, MP_ERR_DEVICE, "CUDA device %d does not exist (%d present)", dev, n);
    cx->device = dev;
    CK(d, cudaSetDevice(dev));
    struct cudaDeviceProp prop;
    CK(d, cudaGetDeviceProperties(&prop, dev));
    snprintf(cx->info.name, sizeof cx->info.name, "%s", prop.name);
    cx->info.cc_major = prop.major;
    cx->info.cc_minor = prop.minor;
    CK(d, cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking));
    enum mp_status bst = blas_load(d);
    if (bst != MP_OK)
        return bst;
    BK(d, cublasCreate(&cx->blas));
    BK(d, cublasSetStream(cx->blas, cx->stream));
    BK(d, cublasSetWorkspace(cx->blas, NULL, 0)); /* only the replay's workspace storage */
    CK(d, cudaMalloc((void **)&cx->scalars, N_SCALARS * sizeof(float)));
    CK(d, cudaMallocHost((void **)&cx->host_loss, sizeof(float)));
    int pools = 0;
    if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev) == cudaSuccess && pools) {
        CK(d, cudaDeviceGetDefaultMemPool(&cx->pool, dev));
        uint64_t keep = UINT64_MAX; /* cache freed memory, as the caching allocator does */
        CK(d, cudaMemPoolSetAttribute(cx->pool, cudaMemPoolAttrReleaseThreshold, &keep));
        cx->mempool = true;
    }
    (void)cudaGetLastError();
    size_t fr = 0, tot = 0;
    CK(d, cudaMemGetInfo(&fr, &tot));
    cx->info.free_bytes = fr;
    cx->info.total_bytes = tot;
    return MP_OK;
}

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

static struct cu_ctx *CX(const struct mp_exec *x) { return x->bctx; }
static struct cu_run *RUN(const struct mp_exec *x) { return x->bx; }
static cudaStream_t S(const struct mp_exec *x) { return CX(x)->stream; }

static uint64_t esz(int dt) { return mp_dtype_size((enum mp_dtype)dt); }
static void *at(struct mp_view v, uint64_t elem) { return (char *)v.p + elem * esz(v.dt); }

/* ---- allocation ------------------------------------------------------------------------------ */

static enum mp_status cu_alloc(void *ctx, uint64_t bytes, void **out, struct mp_diag *d)
{
    struct cu_ctx *cx = ctx;
    *out = NULL;
    if (bytes > SIZE_MAX)
        return MP_ERR_OOM;
    for (int attempt = 0; attempt < 2; attempt++) {
        cudaError_t e = cx->mempool ? cudaMallocAsync(out, (size_t)bytes, cx->stream) : cudaMalloc(out, (size_t)bytes);
        if (e == cudaSuccess)
            return MP_OK;
        if (e != cudaErrorMemoryAllocation)
            return cuda_fail(d, e, "cudaMallocAsync", __FILE__, __LINE__);
        (void)cudaGetLastError(); /* clear it: an OOM is a result */
        *out = NULL;
        if (!cx->mempool || attempt)
            break;
        /* as the caching allocator does: give cached blocks back, then retry once */
        if (cudaStreamSynchronize(cx->stream) != cudaSuccess || cudaMemPoolTrimTo(cx->pool, 0) != cudaSuccess)
            break;
    }
    return MP_ERR_OOM;
}

static void cu_free(void *ctx, void *ptr)
{
    struct cu_ctx *cx = ctx;
    if (cx->mempool)
        cudaFreeAsync(ptr, cx->stream);
    else
        cudaFree(ptr);
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

static cudaDataType_t cuda_type(int dt)
{
    return dt == MP_DT_BF16 ? CUDA_R_16BF : dt == MP_DT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static bool fits_int(uint64_t v) { return v <= 0x7fffffffull; }

/* Operand types cuBLAS takes here, and dimensions within its int range. */
static enum mp_status gemm_check(struct mp_exec *x, uint64_t M, uint64_t N, uint64_t K, int adt, int bdt, int cdt,
                                 uint64_t lda, uint64_t ldb, uint64_t ldc, uint64_t batch)
{
    if (adt != bdt || adt == MP_DT_I64 || adt == MP_DT_U8 || cdt == MP_DT_I64 || cdt == MP_DT_U8)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: GEMM with operand types %d/%d -> %d", adt, bdt, cdt);
    if (!fits_int(M) || !fits_int(N) || !fits_int(K) || !fits_int(lda) || !fits_int(ldb) || !fits_int(ldc) ||
        !fits_int(batch))
        return mp_fail(x->d, MP_ERR_UNSUPPORTED, "probe: a GEMM dimension exceeds cuBLAS's int range");
    return MP_OK;
}

/* On the profiling step: an event before the GEMM (*e0 its index; the pair's end follows). */
static enum mp_status gemm_time_begin(struct mp_exec *x, size_t *e0)
{
    struct cu_run *u = RUN(x);
    if (!u->timing)
        return MP_OK;
    if (u->n_ev + 2 > u->cap_ev) {
        size_t nc = u->cap_ev ? 2 * u->cap_ev : 256;
        cudaEvent_t *ne = realloc(u->ev, nc * sizeof *ne);
        if (!ne)
            return mp_fail(x->d, MP_ERR_NOMEM, "probe: out of host memory for GEMM events");
        for (size_t i = u->cap_ev; i < nc; i++)
            ne[i] = NULL;
        u->ev = ne;
        u->cap_ev = nc;
    }
    for (size_t i = u->n_ev; i < u->n_ev + 2; i++)
        if (!u->ev[i])
            CK(x->d, cudaEventCreate(&u->ev[i]));
    *e0 = u->n_ev;
    u->n_ev += 2;
    CK(x->d, cudaEventRecord(u->ev[*e0], S(x)));
    return MP_OK;
}

static enum mp_status gemm_time_end(struct mp_exec *x, size_t e0, uint64_t M, uint64_t N, uint64_t K, uint64_t batch)
{
    struct cu_run *u = RUN(x);
    if (!u->timing)
        return MP_OK;
    CK(x->d, cudaEventRecord(u->ev[e0 + 1], S(x)));
    u->gemm_flops += 2.0 * (double)M * (double)N * (double)K * (double)batch;
    return MP_OK;
}

/* Row-major C (M x N) = alpha op(A) op(B) + beta C, batched with element strides.
 * cuBLAS is column-major: compute C^T = op(B)^T op(A)^T.  fp32 compute; bf16/fp16
 * inputs run on tensor cores.  Counts FLOPs and, on the profiling step, times the call. */
static enum mp_status gemm(struct mp_exec *x, bool ta, bool tb, uint64_t M, uint64_t N, uint64_t K, float alpha,
                           const void *A, int adt, uint64_t lda, uint64_t sA, const void *B, int bdt, uint64_t ldb,
                           uint64_t sB, float beta, void *C, int cdt, uint64_t ldc, uint64_t sC, uint64_t batch)
{
    if (!M || !N || !batch)
        return MP_OK;
    enum mp_status st = gemm_check(x, M, N, K, adt, bdt, cdt, lda, ldb, ldc, batch);
    size_t e0 = 0;
    if (st == MP_OK)
        st = gemm_time_begin(x, &e0);
    if (st != MP_OK)
        return st;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    BK(x->d, cublasGemmStridedBatchedEx(CX(x)->blas, opa, opb, (int)N, (int)M, (int)K, &alpha, B, cuda_type(bdt),
                                        (int)ldb, (long long)sB, A, cuda_type(adt), (int)lda, (long long)sA, &beta, C,
                                        cuda_type(cdt), (int)ldc, (long long)sC, (int)batch, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
    return gemm_time_end(x, e0, M, N, K, batch);
}

/* One pointer-array batched GEMM being filled: entry i multiplies a[i], b[i] into c[i]. */
struct gemm_ptrs {
    const void **a, **b;
    void **c;
    size_t off; /* the first entry's index in the run's pointer arrays */
    uint64_t n;
};

#define PTR_CAP ((size_t)1 << 15)                    /* batched-GEMM entries per step before a drain */
#define PTR_BYTES (3 * PTR_CAP * sizeof(void *)) /* 768 KiB on the device, as much pinned */

/* Reserves n entries; when a step has used every slot, the stream is drained and the slots
 * start again (the copies still queued read the pinned slots). */
static enum mp_status gemm_ptrs_take(struct mp_exec *x, uint64_t n, struct gemm_ptrs *g)
{
    struct cu_run *u = RUN(x);
    if (!u->hab || n > PTR_CAP / 2)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: %llu batched GEMM entries (at most %zu)",
                       (unsigned long long)n, PTR_CAP / 2);
    if (u->ptr_used + n > PTR_CAP) {
        CK(x->d, cudaStreamSynchronize(S(x)));
        u->ptr_used = 0;
    }
    g->off = u->ptr_used;
    g->n = n;
    g->a = u->hab + 2 * g->off;
    g->b = g->a + n;
    g->c = u->hc + g->off;
    u->ptr_used += n;
    return MP_OK;
}

/* Row-major C_i (M x N) = alpha op(A_i) op(B_i) + beta C_i for every entry of g (filled);
 * no two entries may write the same C. */
static enum mp_status gemm_batched(struct mp_exec *x, bool ta, bool tb, uint64_t M, uint64_t N, uint64_t K,
                                   float alpha, const struct gemm_ptrs *g, int adt, uint64_t lda, int bdt,
                                   uint64_t ldb, float beta, int cdt, uint64_t ldc)
{
    if (!M || !N || !g->n)
        return MP_OK;
    struct cu_run *u = RUN(x);
    enum mp_status st = gemm_check(x, M, N, K, adt, bdt, cdt, lda, ldb, ldc, g->n);
    if (st != MP_OK)
        return st;
    char *dab = (char *)u->dptr + 2 * g->off * sizeof(void *);
    char *dc = (char *)u->dptr + (2 * PTR_CAP + g->off) * sizeof(void *);
    CK(x->d, cudaMemcpyAsync(dab, g->a, 2 * g->n * sizeof(void *), cudaMemcpyHostToDevice, S(x)));
    CK(x->d, cudaMemcpyAsync(dc, g->c, g->n * sizeof(void *), cudaMemcpyHostToDevice, S(x)));
    size_t e0 = 0;
    if ((st = gemm_time_begin(x, &e0)) != MP_OK)
        return st;
    const void *const *dA = (const void *const *)dab, *const *dB = dA + g->n;
    void *const *dC = (void *const *)dc;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    BK(x->d, cublasGemmBatchedEx(CX(x)->blas, opa, opb, (int)N, (int)M, (int)K, &alpha, dB, cuda_type(bdt), (int)ldb,
                                 dA, cuda_type(adt), (int)lda, &beta, dC, cuda_type(cdt), (int)ldc, (int)g->n,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return gemm_time_end(x, e0, M, N, K, g->n);
}

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
static struct mp_view xr(const struct mp_node_view *c, enum mp_xrole r) { return mp_view_extra(c, r); }
static bool has_x(const struct mp_node_view *c, enum mp_xrole r) { return mp_node_extra(c->n, r, 0) >= 0; }

/* The part of the node's TMP storage with role r (NULL when it has none, or not that size). */
static void *tmp_part(const struct mp_node_view *c, bool bwd, enum mp_trole r, uint64_t want_bytes)
{
    uint64_t bytes;
    void *t = mp_view_tmp(c, bwd, r, &bytes);
    return t && (!want_bytes || bytes == want_bytes) ? t : NULL;
}

static enum mp_status missing(struct mp_node_view *c, const char *what)
{
    return mp_fail(c->x->d, MP_ERR_INTERNAL, "probe: %s (%s): %s is not allocated", c->n->name,
                   mp_prim_str(c->n->prim), what);
}

#define NEED(view)                        \
    do {                                  \
        if (!(view).p)                    \
            return missing(c, #view);     \
    } while (0)

/* ---- embedding, positions, cast, add --------------------------------------------------------- */

static enum mp_status embed_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    NEED(c->in[0]);
    if (fwd) {
        NEED(c->w);
        NEED(c->out);
        KK(x->d, mp_k_embed_fwd(c->out.p, c->out.dt, c->in[0].p, c->w.p, c->w.dt, n->rows, n->n, n->k, S(x)));
    } else if (c->gout.p && c->gw.p) {
        KK(x->d, mp_k_embed_bwd(c->gw.p, c->gw.dt, c->in[0].p, c->gout.p, c->gout.dt, n->rows, n->n, n->k, S(x)));
    }
    return MP_OK;
}

static enum mp_status addpos_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->w);
        NEED(c->out);
        KK(x->d, mp_k_addpos_fwd(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, c->w.p, c->w.dt, n->rows, n->n,
                                 n->seq, n->k == 1, S(x)));
        return MP_OK;
    }
    if (!c->gout.p)
        return MP_OK;
    if (c->gin[0].p)
        KK(x->d, mp_k_convert(c->gin[0].p, c->gin[0].dt, c->gout.p, c->gout.dt, c->gout.n, 1, S(x)));
    if (c->gw.p)
        KK(x->d, mp_k_addpos_bwd(c->gw.p, c->gw.dt, c->gout.p, c->gout.dt, n->rows, n->n, n->seq, n->k == 1, S(x)));
    return MP_OK;
}

/* Cast forward; cast and residual-add backward (the gradient passes through). */
static enum mp_status pass_run(struct mp_node_view *c, bool fwd)
{
    struct mp_exec *x = c->x;
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        if (c->n->prim == MP_P_ADD) {
            NEED(c->in[1]);
            KK(x->d, mp_k_add(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, c->in[1].p, c->in[1].dt, c->out.n, S(x)));
        } else {
            KK(x->d, mp_k_convert(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, c->out.n, 0, S(x)));
        }
        return MP_OK;
    }
    if (!c->gout.p)
        return MP_OK;
    for (int j = 0; j < 3; j++)
        if (c->n->in[j] >= 0 && c->gin[j].p && c->gin[j].p != c->gout.p)
            KK(x->d, mp_k_convert(c->gin[j].p, c->gin[j].dt, c->gout.p, c->gout.dt, c->gout.n, 1, S(x)));
    return MP_OK;
}

/* ---- linear ------------------------------------------------------------------------------------ */

/* A quantized base weight (bitsandbytes NF4, packed as mp_quant_pack lays it out): dequantized
 * into the node's MP_TR_DEQUANT temporary in the output dtype, in forward and again in backward,
 * as the host backend does (probe_host_linear.c). */
static enum mp_status dequant_weight(struct mp_node_view *c, bool fwd, struct mp_view *w)
{
    const struct mp_param *q = &c->p->params[c->n->param[0]];
    const struct mp_quant *qz = mp_program_base_quant(c->p);
    uint64_t off[MP_QUANT_PARTS_MAX], bs;
    NEED(c->w);
    if (!qz || mp_quant_nf4_layout(qz, q->rows, q->cols, off, &bs) != MP_OK)
        return mp_fail(c->x->d, MP_ERR_UNSUPPORTED, "probe: %s: the cuda backend executes bitsandbytes NF4 "
                       "weights only", c->n->name);
    int dt = (int)c->p->tensors[c->n->out].dtype;
    uint64_t bytes;
    void *t = mp_view_tmp(c, !fwd, MP_TR_DEQUANT, &bytes);
    if (!t || bytes < q->elems * esz(dt))
        return missing(c, "the dequantized weight");
    struct mp_k_nf4 k = {.n = q->elems, .blocksize = bs, .packed = off[0], .code = off[1], .absmax = off[2],
                         .offset = off[3], .absmax2 = off[4], .code2 = off[5], .double_quant = qz->double_quant};
    KK(c->x->d, mp_k_nf4_dequant(t, dt, c->w.p, k, S(c->x)));
    *w = (struct mp_view){t, (enum mp_dtype)dt, q->elems};
    return MP_OK;
}

/* Under autocast the GEMM uses the half copy of W (extra 0), refreshed by the forward; a
 * quantized base weight its dequantized temporary. */
static enum mp_status matmul_weight(struct mp_node_view *c, bool fwd, struct mp_view *w)
{
    if (c->n->quantized)
        return dequant_weight(c, fwd, w);
    if (has_x(c, MP_XR_WEIGHT_COPY)) {
        struct mp_view copy = xr(c, MP_XR_WEIGHT_COPY);
        NEED(copy);
        if (fwd) {
            NEED(c->w);
            KK(c->x->d, mp_k_convert(copy.p, copy.dt, c->w.p, c->w.dt, c->w.n, 0, S(c->x)));
        }
        *w = copy;
        return MP_OK;
    }
    NEED(c->w);
    *w = c->w;
    return MP_OK;
}

static enum mp_status linear_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    uint64_t M = n->rows, N = n->n, K = n->k;
    struct mp_view w;
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        enum mp_status st = matmul_weight(c, true, &w);
        if (st != MP_OK)
            return st;
        float beta = 0.0f;
        if (n->param[1] >= 0) {
            NEED(c->b);
            KK(x->d, mp_k_bias_fill(c->out.p, c->out.dt, c->b.p, c->b.dt, M, N, 1, S(x)));
            beta = 1.0f;
        }
        GEMM(x, false, true, M, N, K, 1.0f, c->in[0].p, c->in[0].dt, K, 0, w.p, w.dt, K, 0, beta, c->out.p,
             c->out.dt, N, 0, 1);
        return MP_OK;
    }
    if (!c->gout.p)
        return MP_OK;
    if (c->gin[0].p) {
        enum mp_status st = matmul_weight(c, false, &w);
        if (st != MP_OK)
            return st;
        GEMM(x, false, false, M, K, N, 1.0f, c->gout.p, c->gout.dt, N, 0, w.p, w.dt, K, 0, 1.0f, c->gin[0].p,
             c->gin[0].dt, K, 0, 1);
    }
    if (c->gw.p || mp_weight_grad_cast_later(c)) {
        NEED(c->in[0]);
        int cdt = (int)c->p->compute_dtype;
        void *half = cdt != MP_DT_F32 ? tmp_part(c, true, MP_TR_WGRAD_HALF, N * K * esz(cdt)) : NULL;
        if (half) {
            /* PyTorch: a half weight gradient, then its fp32 copy into .grad (MP_EV_WGRAD_CAST, after
             * the node, when .grad is made then) */
            GEMM(x, true, false, N, K, M, 1.0f, c->gout.p, c->gout.dt, N, 0, c->in[0].p, c->in[0].dt, K, 0, 0.0f,
                 half, cdt, K, 0, 1);
            if (c->gw.p)
                KK(x->d, mp_k_convert(c->gw.p, c->gw.dt, half, cdt, N * K, 1, S(x)));
        } else {
            GEMM(x, true, false, N, K, M, 1.0f, c->gout.p, c->gout.dt, N, 0, c->in[0].p, c->in[0].dt, K, 0, 1.0f,
                 c->gw.p, c->gw.dt, K, 0, 1);
        }
    }
    if (c->gb.p)
        KK(x->d, mp_k_bias_grad(c->gb.p, c->gb.dt, c->gout.p, c->gout.dt, M, N, 1, S(x)));
    return MP_OK;
}

/* LoRA's result * scaling (a Python float): y = p x; dx += p dy. */
static enum mp_status scale_run(struct mp_node_view *c, bool fwd)
{
    struct mp_exec *x = c->x;
    float a = (float)c->n->p;
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        KK(x->d, mp_k_scale(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, c->out.n, a, 0, S(x)));
        return MP_OK;
    }
    if (c->gout.p && c->gin[0].p)
        KK(x->d, mp_k_scale(c->gin[0].p, c->gin[0].dt, c->gout.p, c->gout.dt, c->gout.n, a, 1, S(x)));
    return MP_OK;
}

/* ---- norms ------------------------------------------------------------------------------------- */

static enum mp_status layernorm_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    NEED(c->in[0]);
    if (n->param[0] >= 0) /* none: OLMo's LayerNorm (the kernels take a NULL weight as 1) */
        NEED(c->w);
    struct mp_view st0 = n->prim == MP_P_LAYERNORM ? xr(c, MP_XR_MEAN) : xr(c, MP_XR_BN_MEAN);
    struct mp_view st1 = n->prim == MP_P_LAYERNORM ? xr(c, MP_XR_RSTD) : xr(c, MP_XR_BN_INVSTD);
    NEED(st0);
    NEED(st1);
    if (fwd) {
        NEED(c->out);
        KK(x->d, mp_k_layernorm_fwd(c->out.p, c->in[0].p, c->in[0].dt, c->w.p, c->b.p, c->w.dt, st0.p,
                                    st1.p, n->rows, n->n, MP_LN_EPS, S(x)));
    } else if (c->gout.p) {
        KK(x->d, mp_k_layernorm_bwd(c->gin[0].p, c->gw.p, c->gb.p, c->w.dt, c->gout.p, c->in[0].p, c->in[0].dt,
                                    st0.p, st1.p, c->w.p, n->rows, n->n, S(x)));
    }
    return MP_OK;
}

static enum mp_status rmsnorm_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    bool e = has_x(c, MP_XR_X_FP32);
    struct mp_view xs = e ? xr(c, MP_XR_X_FP32) : c->in[0], rs = xr(c, MP_XR_RSQRT), nm = xr(c, MP_XR_NORMED);
    NEED(c->w);
    NEED(rs);
    NEED(nm);
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        if (e)
            NEED(xs);
        KK(x->d, mp_k_rmsnorm_fwd(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, e ? xs.p : NULL, rs.p, nm.p, c->w.p,
                                  c->w.dt, n->rows, n->n, MP_RMS_EPS, S(x)));
    } else if (c->gout.p) {
        NEED(xs);
        KK(x->d, mp_k_rmsnorm_bwd(c->gin[0].p, c->gin[0].dt, c->gw.p, c->gw.dt, c->gout.p, c->gout.dt, xs.p, xs.dt,
                                  rs.p, nm.p, c->w.p, n->rows, n->n, S(x)));
    }
    return MP_OK;
}

static enum mp_status batchnorm_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    uint64_t C = n->c_in, HW = n->h_in * n->w_in, B = (C && HW) ? c->p->tensors[n->in[0]].elems / (C * HW) : 0;
    NEED(c->in[0]);
    NEED(c->w);
    NEED(c->b);
    struct mp_view st0 = n->prim == MP_P_LAYERNORM ? xr(c, MP_XR_MEAN) : xr(c, MP_XR_BN_MEAN);
    struct mp_view st1 = n->prim == MP_P_LAYERNORM ? xr(c, MP_XR_RSTD) : xr(c, MP_XR_BN_INVSTD);
    NEED(st0);
    NEED(st1);
    if (fwd) {
        NEED(c->out);
        KK(x->d, mp_k_batchnorm_fwd(c->out.p, c->in[0].p, c->in[0].dt, c->w.p, c->b.p, c->w.dt, st0.p,
                                    st1.p, B, C, HW, MP_BN_EPS, S(x)));
    } else if (c->gout.p) {
        KK(x->d, mp_k_batchnorm_bwd(c->gin[0].p, c->gw.p, c->gb.p, c->w.dt, c->gout.p, c->in[0].p, c->in[0].dt,
                                    st0.p, st1.p, c->w.p, B, C, HW, S(x)));
    }
    return MP_OK;
}

/* ---- rope, attention ------------------------------------------------------------------------------ */

static enum mp_status rope_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    uint64_t Wout = n->heads * n->head_dim, Win = c->lay->in_w[0], off = c->lay->in_off[0];
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        KK(x->d, mp_k_rope(c->out.p, c->out.dt, Wout, 0, c->in[0].p, c->in[0].dt, Win, off, n->rows, n->heads,
                           n->head_dim, n->rotary_dim, n->seq, MP_ROPE_BASE, 0, S(x)));
    } else if (c->gout.p && c->gin[0].p) {
        KK(x->d, mp_k_rope(c->gin[0].p, c->gin[0].dt, Win, off, c->gout.p, c->gout.dt, Wout, 0, n->rows, n->heads,
                           n->head_dim, n->rotary_dim, n->seq, MP_ROPE_BASE, 1, S(x)));
    }
    return MP_OK;
}

static struct mp_k_attn attn_of(const struct mp_node_view *c)
{
    const struct mp_node *n = c->n;
    struct mp_k_attn A;
    memset(&A, 0, sizeof A);
    A.q = c->in[0].p;
    A.k = c->in[1].p;
    A.v = c->in[2].p;
    A.dt = c->in[0].dt;
    A.s = n->seq ? n->seq : 1;
    A.b = n->rows / A.s;
    A.a = n->heads;
    A.kv = n->kv_heads ? n->kv_heads : n->heads;
    A.d = n->head_dim;
    A.wq = c->lay->in_w[0];
    A.wk = c->lay->in_w[1];
    A.wv = c->lay->in_w[2];
    A.oq = c->lay->in_off[0];
    A.ok = c->lay->in_off[1];
    A.ov = c->lay->in_off[2];
    A.causal = n->causal;
    A.scale = 1.0f / sqrtf((float)A.d);
    A.p = (float)n->p;
    A.key = mp_dropout_key(c->x->seed, c->k, c->x->rng_step);
    return A;
}

static uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

/* ---- the flash path: cuBLAS GEMMs over blocks of query rows ----
 * Tensor cores through cuBLAS rather than a hand-written mma/WMMA flash kernel: every product
 * (QK^T, PV; dO V^T, dS K, dS^T Q, P^T dO) is a batched GEMM cuBLAS runs near peak, each one
 * checkable on its own, while a fused kernel could not be validated without a GPU here.  The
 * price is the workspace: fp32 scores and dP, P and dS in the attention dtype for a block of
 * query rows of many (sample, head) entries, at most MP_PROBE_ATTN_WS_BYTES, outside the
 * counting pool (outside_pool_bytes; flash-attention needs none).  Nothing s x s outlives the
 * node: the forward keeps the logsumexp, the backward recomputes P from it. */

/* Workspace bytes per (entry, query row, key): S and dP fp32, P and dS at most 4 bytes. */
#define FA_WS_PER 16

/* Entries per GEMM call (ne) and query rows per block (qb) within ws bytes. */
static void fa_plan(const struct mp_k_attn *A, uint64_t ws, uint64_t *ne, uint64_t *qb)
{
    uint64_t ents = A->b * A->a, row = A->s * FA_WS_PER, q = A->s, e = ws / (q * row);
    if (!e) {
        q = mp_min_u64(A->s, 128);
        e = ws / (q * row);
    }
    if (!e) {
        q = mp_max_u64(1, ws / row);
        e = 1;
    }
    *qb = q;
    *ne = mp_min_u64(mp_min_u64(e, ents), PTR_CAP / 2);
}

/* Element offsets: q row i of head h, k/v row 0 of kv head g, o row i of head h (b, s, a, d). */
static uint64_t fa_q(const struct mp_k_attn *A, uint64_t bh, uint64_t i)
{
    return (bh / A->a * A->s + i) * A->wq + A->oq + bh % A->a * A->d;
}
static uint64_t fa_k(const struct mp_k_attn *A, uint64_t bh, uint64_t w, uint64_t off)
{
    return bh / A->a * A->s * w + off + bh % A->a / (A->a / A->kv) * A->d;
}
static uint64_t fa_o(const struct mp_k_attn *A, uint64_t bh, uint64_t i)
{
    return ((bh / A->a * A->s + i) * A->a + bh % A->a) * A->d;
}

/* S (fp32, ld jn) = scale Q_block K^T for every entry of F. */
static enum mp_status fa_scores(struct mp_exec *x, const struct mp_k_attn *A, const struct mp_k_fblock *F,
                                struct mp_view q, struct mp_view k, float *Sw)
{
    struct gemm_ptrs gp;
    PTRS(x, F->ne, &gp);
    for (uint64_t e = 0; e < F->ne; e++) {
        gp.a[e] = at(q, fa_q(A, F->e0 + e, F->i0));
        gp.b[e] = at(k, fa_k(A, F->e0 + e, A->wk, A->ok));
        gp.c[e] = Sw + e * F->qb * F->jn;
    }
    GEMM_BATCHED(x, false, true, F->qb, F->jn, A->d, A->scale, &gp, q.dt, A->wq, k.dt, A->wk, 0.0f, MP_DT_F32, F->jn);
    return MP_OK;
}

static enum mp_status flash_fwd(struct mp_node_view *c, const struct mp_k_attn *A, struct mp_view lse,
                                uint64_t s_lse)
{
    struct mp_exec *x = c->x;
    struct mp_view q = c->in[0], k = c->in[1], v = c->in[2], out = c->out;
    uint64_t ne, qb, ents = A->b * A->a;
    fa_plan(A, RUN(x)->attn_ws_bytes, &ne, &qb);
    for (uint64_t e0 = 0; e0 < ents; e0 += ne)
        for (uint64_t i0 = 0; i0 < A->s; i0 += qb) {
            uint64_t rows = mp_min_u64(qb, A->s - i0);
            struct mp_k_fblock F = {e0, mp_min_u64(ne, ents - e0), i0, rows, A->causal ? i0 + rows : A->s};
            float *Sw = RUN(x)->attn_ws;
            struct mp_view P = {Sw + F.ne * F.qb * F.jn, q.dt, F.ne * F.qb * F.jn};
            enum mp_status st = fa_scores(x, A, &F, q, k, Sw);
            if (st != MP_OK)
                return st;
            KK(x->d, mp_k_fa_softmax_fwd(A, &F, Sw, P.p, lse.p, s_lse, S(x)));
            struct gemm_ptrs gp; /* O_block = P V */
            PTRS(x, F.ne, &gp);
            for (uint64_t e = 0; e < F.ne; e++) {
                gp.a[e] = at(P, e * F.qb * F.jn);
                gp.b[e] = at(v, fa_k(A, e0 + e, A->wv, A->ov));
                gp.c[e] = at(out, fa_o(A, e0 + e, i0));
            }
            GEMM_BATCHED(x, false, false, F.qb, A->d, F.jn, 1.0f, &gp, P.dt, F.jn, v.dt, A->wv, 0.0f, out.dt,
                         A->a * A->d);
        }
    return MP_OK;
}

/* dK_g += dS^T Q (src dS, rhs q) or dV_g += Pk^T dO (src Pk, rhs dO) for the entries of F
 * whose head is member r of its kv group: no two entries of one call add into the same rows. */
static enum mp_status fa_kv_grad(struct mp_exec *x, const struct mp_k_attn *A, const struct mp_k_fblock *F,
                                 uint64_t r, struct mp_view src, struct mp_view rhs, bool rhs_q, struct mp_view dst,
                                 uint64_t w, uint64_t off)
{
    uint64_t group = A->a / A->kv, blk = F->qb * F->jn, n = 0;
    struct gemm_ptrs gp;
    PTRS(x, F->ne, &gp);
    for (uint64_t e = 0; e < F->ne; e++) {
        uint64_t bh = F->e0 + e;
        if (bh % A->a % group != r)
            continue;
        gp.a[n] = at(src, e * blk);
        gp.b[n] = at(rhs, rhs_q ? fa_q(A, bh, F->i0) : fa_o(A, bh, F->i0));
        gp.c[n++] = at(dst, fa_k(A, bh, w, off));
    }
    gp.n = n;
    GEMM_BATCHED(x, true, false, F->jn, A->d, F->qb, 1.0f, &gp, src.dt, F->jn, rhs.dt, rhs_q ? A->wq : A->a * A->d,
                 1.0f, dst.dt, w);
    return MP_OK;
}

static enum mp_status flash_bwd(struct mp_node_view *c, const struct mp_k_attn *A, struct mp_view lse,
                                uint64_t s_lse)
{
    struct mp_exec *x = c->x;
    struct mp_view q = c->in[0], k = c->in[1], v = c->in[2], go = c->gout, gq = c->gin[0], gk = c->gin[1],
                   gv = c->gin[2];
    uint64_t s_r = round_up(A->s, 128), d_r = round_up(A->d, 32), group = A->a / A->kv;
    float *dsum = tmp_part(c, true, MP_TR_FLASH_D, A->b * A->a * s_r * 4);
    float *dq_acc = tmp_part(c, true, MP_TR_FLASH_DQ, A->b * s_r * A->a * d_r * 4);
    if (!dsum || !dq_acc)
        return missing(c, "the softmax_d/dq_accum temporary");
    KK(x->d, mp_k_flash_dsum(A, c->out.p, go.p, dsum, s_r, S(x)));
    uint64_t ne, qb, ents = A->b * A->a;
    fa_plan(A, RUN(x)->attn_ws_bytes, &ne, &qb);
    struct gemm_ptrs gp;
    for (uint64_t e0 = 0; e0 < ents; e0 += ne)
        for (uint64_t i0 = 0; i0 < A->s; i0 += qb) {
            uint64_t rows = mp_min_u64(qb, A->s - i0);
            struct mp_k_fblock F = {e0, mp_min_u64(ne, ents - e0), i0, rows, A->causal ? i0 + rows : A->s};
            uint64_t blk = F.qb * F.jn, all = F.ne * blk;
            float *Sw = RUN(x)->attn_ws, *dPw = Sw + all;
            struct mp_view Pk = {dPw + all, q.dt, all}, dS = {(char *)(dPw + all) + all * esz(q.dt), q.dt, all};
            enum mp_status st = fa_scores(x, A, &F, q, k, Sw);
            if (st != MP_OK)
                return st;
            PTRS(x, F.ne, &gp); /* dP = dO_block V^T */
            for (uint64_t e = 0; e < F.ne; e++) {
                gp.a[e] = at(go, fa_o(A, e0 + e, i0));
                gp.b[e] = at(v, fa_k(A, e0 + e, A->wv, A->ov));
                gp.c[e] = dPw + e * blk;
            }
            GEMM_BATCHED(x, false, true, F.qb, F.jn, A->d, 1.0f, &gp, go.dt, A->a * A->d, v.dt, A->wv, 0.0f, MP_DT_F32,
                         F.jn);
            KK(x->d, mp_k_fa_softmax_bwd(A, &F, Sw, dPw, lse.p, s_lse, dsum, s_r, Pk.p, dS.p, S(x)));
            if (gq.p) { /* dq_accum rows of the block = dS K (each block writes its own rows) */
                PTRS(x, F.ne, &gp);
                for (uint64_t e = 0; e < F.ne; e++) {
                    uint64_t bh = e0 + e;
                    gp.a[e] = at(dS, e * blk);
                    gp.b[e] = at(k, fa_k(A, bh, A->wk, A->ok));
                    gp.c[e] = dq_acc + ((bh / A->a * s_r + i0) * A->a + bh % A->a) * d_r;
                }
                GEMM_BATCHED(x, false, false, F.qb, A->d, F.jn, 1.0f, &gp, dS.dt, F.jn, k.dt, A->wk, 0.0f, MP_DT_F32,
                             A->a * d_r);
            }
            for (uint64_t r = 0; r < group; r++) {
                if (gk.p && (st = fa_kv_grad(x, A, &F, r, dS, q, true, gk, A->wk, A->ok)) != MP_OK)
                    return st;
                if (gv.p && (st = fa_kv_grad(x, A, &F, r, Pk, go, false, gv, A->wv, A->ov)) != MP_OK)
                    return st;
            }
        }
    if (gq.p)
        KK(x->d, mp_k_flash_dq_out(A, dq_acc, s_r, d_r, gq.p, S(x)));
    return MP_OK;
}

static enum mp_status flash_run(struct mp_node_view *c, bool fwd)
{
    struct mp_exec *x = c->x;
    struct mp_k_attn A = attn_of(c);
    NEED(c->in[0]);
    NEED(c->in[1]);
    NEED(c->in[2]);
    NEED(c->out);
    struct mp_view lse = xr(c, MP_XR_LSE);
    NEED(lse);
    if (!A.kv || A.a % A.kv || !A.b)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: %s: %llu heads over %llu kv heads", c->n->name,
                       (unsigned long long)A.a, (unsigned long long)A.kv);
    if (!RUN(x)->attn_ws)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: %s: no attention workspace", c->n->name);
    uint64_t s_lse = lse.n / (A.b * A.a);
    if (fwd)
        return flash_fwd(c, &A, lse, s_lse);
    return c->gout.p ? flash_bwd(c, &A, lse, s_lse) : MP_OK;
}

/* Eager: extras q_copy, k_copy, v_copy (b,a,s,d), probs (b,a,s,s), then [mask, dropped] or [cast]. */
static struct mp_view eager_pv(const struct mp_node_view *c)
{
    return has_x(c, MP_XR_PROBS_DROPPED) ? xr(c, MP_XR_PROBS_DROPPED)
           : has_x(c, MP_XR_PROBS_CAST) ? xr(c, MP_XR_PROBS_CAST)
                                        : xr(c, MP_XR_PROBS);
}

/* One op of the eager forward (layers.h mp_subop, layers.c eager_ops' order), as
 * probe_host_attention.c runs it: Q K^T (after the contiguous copies), the scaling, the mask add
 * (a copy: the softmax masks), casts, the softmax, dropout, P V, the heads transposed. */
static enum mp_status eager_fwd(struct mp_node_view *c)
{
    struct mp_exec *x = c->x;
    const struct mp_node *n = c->n;
    const struct mp_subop *op = mp_view_subop(c);
    if (!op)
        return missing(c, "its forward ops");
    struct mp_k_attn A = attn_of(c);
    if (has_x(c, MP_XR_SOFTCAP_TANH))
        return mp_fail(x->d, MP_ERR_UNSUPPORTED, "probe: %s: attention logit soft-capping is not implemented "
                                                 "by the probe yet", n->name);
    struct mp_view qc = xr(c, MP_XR_Q_COPY), kc = xr(c, MP_XR_K_COPY), vc = xr(c, MP_XR_V_COPY);
    struct mp_view src = mp_view_tensor(x, MP_ST_ACT, op->src), dst = mp_view_tensor(x, MP_ST_ACT, op->dst);
    if (op->src >= 0)
        NEED(src);
    NEED(dst);
    NEED(qc);
    NEED(kc);
    NEED(vc);
    uint64_t b = A.b, s = A.s, a = A.a, d = A.d, ass = b * a * s * s, ss = s * s, sd = s * d;
    switch (op->op) {
    case MP_SOP_QK:
        NEED(c->in[0]);
        NEED(c->in[1]);
        NEED(c->in[2]);
        KK(x->d, mp_k_attn_pack(&A, qc.p, kc.p, vc.p, S(x)));
        GEMM(x, false, true, s, s, d, 1.0f, qc.p, qc.dt, d, sd, kc.p, kc.dt, d, sd, 0.0f, dst.p, dst.dt, s, ss, b * a);
        return MP_OK;
    case MP_SOP_SCALE:
        KK(x->d, mp_k_scale(dst.p, dst.dt, src.p, src.dt, ass, A.scale, 0, S(x)));
        return MP_OK;
    case MP_SOP_MASK:
    case MP_SOP_CAST:
        KK(x->d, mp_k_convert(dst.p, dst.dt, src.p, src.dt, ass, 0, S(x)));
        return MP_OK;
    case MP_SOP_SOFTMAX:
        KK(x->d, mp_k_attn_softmax(dst.p, dst.dt, src.p, src.dt, b * a * s, s, A.causal, S(x)));
        return MP_OK;
    case MP_SOP_DROPOUT: {
        struct mp_view mask = mp_view_tensor(x, MP_ST_ACT, op->dst2);
        NEED(mask);
        KK(x->d, mp_k_attn_probs_out(dst.p, dst.dt, mask.p, src.p, src.dt, ass, A.p, A.key, S(x)));
        return MP_OK;
    }
    case MP_SOP_PV:
        GEMM(x, false, false, s, d, s, 1.0f, src.p, src.dt, s, ss, vc.p, vc.dt, d, sd, 0.0f, dst.p, dst.dt, d, sd,
             b * a);
        return MP_OK;
    case MP_SOP_OUT:
        KK(x->d, mp_k_attn_unpack(dst.p, src.p, dst.dt, b, s, a, d, S(x)));
        return MP_OK;
    default:
        return mp_fail(x->d, MP_ERR_UNSUPPORTED, "probe: %s: this eager forward op is not implemented by the "
                                                 "probe", n->name);
    }
}

/* One op of the eager backward (layers.h mp_subop, in layers.c eager_ops' order): it reads
 * its source gradient (dO or the buffer before it) and writes its buffer ((b, a, s, s) or a copy's
 * (b, a, s, d), contiguous) or an input's gradient, as probe_host_attention.c does. */
static enum mp_status eager_bwd(struct mp_node_view *c)
{
    struct mp_exec *x = c->x;
    const struct mp_node *n = c->n;
    const struct mp_subop *op = mp_view_subop(c);
    if (!op)
        return missing(c, "its backward ops");
    struct mp_k_attn A = attn_of(c);
    struct mp_view qc = xr(c, MP_XR_Q_COPY), kc = xr(c, MP_XR_K_COPY), vc = xr(c, MP_XR_V_COPY);
    struct mp_view pr = xr(c, MP_XR_PROBS), pv = eager_pv(c), dmask = xr(c, MP_XR_ATTN_DROP_MASK);
    struct mp_view src = op->src >= 0 ? mp_view_grad(x, op->src) : c->gout;
    struct mp_view dst = {NULL, MP_DT_U8, 0};
    if (op->dst >= 0)
        dst = mp_view_grad(x, op->dst);
    NEED(src);
    if (op->dst >= 0)
        NEED(dst);
    uint64_t b = A.b, s = A.s, a = A.a, d = A.d, ass = b * a * s * s, ss = s * s, sd = s * d;
    /* a product that goes straight into an input's gradient: its layout (width w, offset o);
     * layers.c makes it direct only when the copy has the input's size (no kv group) */
    struct mp_view gj = op->dst < 0 && op->grad >= 0 ? c->gin[op->grad] : dst;
    uint64_t wj = op->grad == 0 ? A.wq : op->grad == 1 ? A.wk : A.wv;
    uint64_t oj = op->grad == 0 ? A.oq : op->grad == 1 ? A.ok : A.ov;
    if (op->dst < 0 && op->op != MP_SOP_GATHER && op->grad > 0 && A.kv != A.a)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: %s: a grouped k/v gradient without its buffer", n->name);
    struct gemm_ptrs gp;
    if (op->op == MP_SOP_PV_DP)
        NEED(vc);
    if (op->op == MP_SOP_PV_DV)
        NEED(pv);
    if (op->op == MP_SOP_QK_DQ || op->op == MP_SOP_QK_DK) {
        NEED(qc);
        NEED(kc);
    }
    if (op->op == MP_SOP_SOFTMAX)
        NEED(pr);
    switch (op->op) {
    case MP_SOP_PV_DP: /* dP_h = dO_h V_h^T (dO is (b, s, a*d): head h at column h*d) */
        PTRS(x, b * a, &gp);
        for (uint64_t e = 0; e < b * a; e++) { /* e = bi*a + h */
            gp.a[e] = at(src, e / a * s * a * d + e % a * d);
            gp.b[e] = at(vc, e * sd);
            gp.c[e] = at(dst, e * ss);
        }
        GEMM_BATCHED(x, false, true, s, s, d, 1.0f, &gp, src.dt, a * d, vc.dt, d, 0.0f, dst.dt, s);
        return MP_OK;
    case MP_SOP_PV_DV: /* dV_h = P_h^T dO_h */
    case MP_SOP_QK_DQ: /* dQ_h = dS_h K_h */
    case MP_SOP_QK_DK: /* dK_h = dS_h^T Q_h */
        if (!gj.p)
            return MP_OK;
        PTRS(x, b * a, &gp);
        for (uint64_t e = 0; e < b * a; e++) {
            bool pvop = op->op == MP_SOP_PV_DV;
            gp.a[e] = pvop ? at(pv, e * ss) : at(src, e * ss);
            gp.b[e] = pvop ? at(src, e / a * s * a * d + e % a * d) : at(op->op == MP_SOP_QK_DQ ? kc : qc, e * sd);
            gp.c[e] = dst.p ? at(dst, e * sd) : at(gj, e / a * s * wj + oj + e % a * d);
        }
        if (op->op == MP_SOP_PV_DV)
            GEMM_BATCHED(x, true, false, s, d, s, 1.0f, &gp, pv.dt, s, src.dt, a * d, dst.p ? 0.0f : 1.0f, gj.dt,
                         dst.p ? d : wj);
        else
            GEMM_BATCHED(x, op->op == MP_SOP_QK_DK, false, s, d, s, 1.0f, &gp, src.dt, s, qc.dt, d,
                         dst.p ? 0.0f : 1.0f, gj.dt, dst.p ? d : wj);
        return MP_OK;
    case MP_SOP_GATHER:
        KK(x->d, mp_k_attn_gather(&A, op->grad, c->gin[op->grad].p, c->gin[op->grad].dt, src.p, src.dt, S(x)));
        return MP_OK;
    case MP_SOP_DROPOUT: /* dst (zeroed) += src * keep / (1 - p) */
        NEED(dmask);
        KK(x->d, mp_k_dropout_bwd(dst.p, src.p, src.dt, dmask.p, ass, A.p, S(x)));
        return MP_OK;
    case MP_SOP_CAST:
        KK(x->d, mp_k_convert(dst.p, dst.dt, src.p, src.dt, ass, 0, S(x)));
        return MP_OK;
    case MP_SOP_SOFTMAX:
        KK(x->d, mp_k_softmax_bwd(dst.p, src.p, pr.dt, pr.p, NULL, 0.0f, b * a * s, s, S(x)));
        return MP_OK;
    case MP_SOP_SCALE:
        KK(x->d, mp_k_scale(dst.p, dst.dt, src.p, src.dt, ass, A.scale, 0, S(x)));
        return MP_OK;
    default:
        return mp_fail(x->d, MP_ERR_UNSUPPORTED, "probe: %s: this eager backward op is not implemented by the "
                                                 "probe", n->name);
    }
}

/* ---- activations, mul, dropout ------------------------------------------------------------------- */

static enum mp_status act_run(struct mp_node_view *c, bool fwd)
{
    struct mp_exec *x = c->x;
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        void *parts[MP_NODE_EXTRA_MAX];
        int dts[MP_NODE_EXTRA_MAX], np = 0;
        if (has_x(c, MP_XR_X_FP32)) { /* the fp32 copy of the input */
            struct mp_view xf = xr(c, MP_XR_X_FP32);
            NEED(xf);
            KK(x->d, mp_k_convert(xf.p, xf.dt, c->in[0].p, c->in[0].dt, xf.n, 0, S(x)));
        }
        for (; mp_node_extra(c->n, MP_XR_ACT_PART, np) >= 0; np++) {
            struct mp_view part = mp_view_tensor(x, MP_ST_ACT, mp_node_extra(c->n, MP_XR_ACT_PART, np));
            NEED(part);
            parts[np] = part.p;
            dts[np] = part.dt;
        }
        KK(x->d, mp_k_act_fwd(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, c->out.n, (int)c->n->act, parts, dts,
                              np, S(x)));
    } else if (c->gout.p && c->gin[0].p) {
        struct mp_view sv = mp_view_tensor(x, MP_ST_ACT, c->n->saved[0]);
        NEED(sv);
        KK(x->d, mp_k_act_bwd(c->gin[0].p, c->gin[0].dt, c->gout.p, c->gout.dt, sv.p, sv.dt, c->gout.n,
                              (int)c->n->act, c->gin[0].p == c->gout.p, S(x)));
    }
    return MP_OK;
}

static enum mp_status mul_run(struct mp_node_view *c, bool fwd)
{
    struct mp_exec *x = c->x;
    NEED(c->in[0]);
    NEED(c->in[1]);
    if (fwd) {
        NEED(c->out);
        KK(x->d, mp_k_mul_fwd(c->out.p, c->in[0].p, c->in[1].p, c->out.dt, c->out.n, S(x)));
    } else if (c->gout.p) {
        KK(x->d, mp_k_mul_bwd(c->gin[0].p, c->gin[1].p, c->gout.p, c->in[0].p, c->in[1].p, c->gout.dt, c->gout.n,
                              S(x)));
    }
    return MP_OK;
}

static enum mp_status dropout_run(struct mp_node_view *c, bool fwd)
{
    struct mp_exec *x = c->x;
    NEED(xr(c, MP_XR_DROP_MASK));
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        KK(x->d, mp_k_dropout_fwd(c->out.p, c->in[0].p, c->out.dt, xr(c, MP_XR_DROP_MASK).p, c->out.n, (float)c->n->p,
                                  mp_dropout_key(x->seed, c->k, x->rng_step), S(x)));
    } else if (c->gout.p && c->gin[0].p) {
        KK(x->d, mp_k_dropout_bwd(c->gin[0].p, c->gout.p, c->gout.dt, xr(c, MP_XR_DROP_MASK).p, c->gout.n, (float)c->n->p, S(x)));
    }
    return MP_OK;
}

/* ---- convolution as im2col + GEMM, pooling ------------------------------------------------------- */

static struct mp_k_conv conv_of(const struct mp_node *n)
{
    struct mp_k_conv C = {.ci = n->c_in, .hi = n->h_in, .wi = n->w_in, .co = n->c_out, .ho = n->h_out,
                          .wo = n->w_out, .k = n->kernel, .st = n->stride ? n->stride : 1, .pad = n->padding,
                          .g = n->groups ? n->groups : 1};
    return C;
}

/* Output pixels per column block: Kc * pc fp32 values fit the buffer. */
static uint64_t conv_chunk(const struct mp_exec *x, uint64_t kc, uint64_t P)
{
    uint64_t pc = RUN(x)->col_bytes / (kc ? kc * 4 : 4);
    return pc < P ? (pc ? pc : 1) : P;
}

static enum mp_status conv_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    struct mp_k_conv C = conv_of(n);
    uint64_t P = C.ho * C.wo, cpg = C.ci / C.g, opg = C.co / C.g, Kc = cpg * C.k * C.k, G = C.g;
    uint64_t B = (C.ci && C.hi && C.wi) ? c->p->tensors[n->in[0]].elems / (C.ci * C.hi * C.wi) : 0;
    uint64_t pc = conv_chunk(x, Kc, P);
    char *col = RUN(x)->col;
    if (!col || RUN(x)->col_bytes < Kc * pc * 4)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: %s: no im2col buffer", n->name);
    /* Whole images fit the buffer: (sample, group) blocks side by side, one batched GEMM per
     * buffer-full (slots of `per` bytes: fp32 is the widest column type); else pixel chunks. */
    uint64_t per = Kc * P * 4, ne = pc == P ? mp_min_u64(RUN(x)->col_bytes / per, PTR_CAP / 2) : 0;
    NEED(c->in[0]);
    struct mp_view xin = c->in[0], w, go = c->gout;
    enum mp_status st = matmul_weight(c, fwd, &w);
    if (st != MP_OK)
        return st;
    struct gemm_ptrs gp;
    if (fwd) {
        NEED(c->out);
        float beta = 0.0f;
        if (n->param[1] >= 0) {
            NEED(c->b);
            KK(x->d, mp_k_bias_fill(c->out.p, c->out.dt, c->b.p, c->b.dt, B, C.co, P, S(x)));
            beta = 1.0f;
        }
        for (uint64_t e0 = 0; ne && e0 < B * G; e0 += ne) { /* Y_(b,g) (+)= W_g col_(b,g) */
            uint64_t k = mp_min_u64(ne, B * G - e0);
            PTRS(x, k, &gp);
            for (uint64_t j = 0; j < k; j++) {
                uint64_t bi = (e0 + j) / G, g = (e0 + j) % G;
                KK(x->d, mp_k_im2col(col + j * per, xin.p, xin.dt, &C, bi, g, 0, P, S(x)));
                gp.a[j] = at(w, g * opg * Kc);
                gp.b[j] = col + j * per;
                gp.c[j] = at(c->out, (bi * C.co + g * opg) * P);
            }
            GEMM_BATCHED(x, false, false, opg, P, Kc, 1.0f, &gp, w.dt, Kc, xin.dt, P, beta, c->out.dt, P);
        }
        for (uint64_t bi = 0; !ne && bi < B; bi++)
            for (uint64_t g = 0; g < G; g++)
                for (uint64_t p0 = 0; p0 < P; p0 += pc) {
                    uint64_t m = mp_min_u64(pc, P - p0);
                    KK(x->d, mp_k_im2col(col, xin.p, xin.dt, &C, bi, g, p0, m, S(x)));
                    GEMM(x, false, false, opg, m, Kc, 1.0f, at(w, g * opg * Kc), w.dt, Kc, 0, col, xin.dt, m, 0,
                         beta, at(c->out, (bi * C.co + g * opg) * P + p0), c->out.dt, P, 0, 1);
                }
        return MP_OK;
    }
    if (!go.p)
        return MP_OK;
    if (c->gw.p) { /* dW_g += dY_(b,g) col_(b,g)^T, accumulated in .grad's dtype: samples one after
                    * another (they add into the same dW_g), the groups of a sample batched */
        for (uint64_t bi = 0; ne && bi < B; bi++)
            for (uint64_t g0 = 0; g0 < G; g0 += ne) {
                uint64_t k = mp_min_u64(ne, G - g0);
                PTRS(x, k, &gp);
                for (uint64_t j = 0; j < k; j++) {
                    uint64_t g = g0 + j;
                    KK(x->d, mp_k_im2col(col + j * per, xin.p, xin.dt, &C, bi, g, 0, P, S(x)));
                    gp.a[j] = at(go, (bi * C.co + g * opg) * P);
                    gp.b[j] = col + j * per;
                    gp.c[j] = at(c->gw, g * opg * Kc);
                }
                GEMM_BATCHED(x, false, true, opg, Kc, P, 1.0f, &gp, go.dt, P, xin.dt, P, 1.0f, c->gw.dt, Kc);
            }
        for (uint64_t bi = 0; !ne && bi < B; bi++)
            for (uint64_t g = 0; g < G; g++)
                for (uint64_t p0 = 0; p0 < P; p0 += pc) {
                    uint64_t m = mp_min_u64(pc, P - p0);
                    KK(x->d, mp_k_im2col(col, xin.p, xin.dt, &C, bi, g, p0, m, S(x)));
                    GEMM(x, false, true, opg, Kc, m, 1.0f, at(go, (bi * C.co + g * opg) * P + p0), go.dt, P, 0,
                         col, xin.dt, m, 0, 1.0f, at(c->gw, g * opg * Kc), c->gw.dt, Kc, 0, 1);
                }
    }
    if (c->gin[0].p) { /* dcol_(b,g) = W_g^T dY_(b,g) (fp32), then col2im */
        for (uint64_t e0 = 0; ne && e0 < B * G; e0 += ne) {
            uint64_t k = mp_min_u64(ne, B * G - e0);
            PTRS(x, k, &gp);
            for (uint64_t j = 0; j < k; j++) {
                uint64_t bi = (e0 + j) / G, g = (e0 + j) % G;
                gp.a[j] = at(w, g * opg * Kc);
                gp.b[j] = at(go, (bi * C.co + g * opg) * P);
                gp.c[j] = col + j * per;
            }
            GEMM_BATCHED(x, true, false, Kc, P, opg, 1.0f, &gp, w.dt, Kc, go.dt, P, 0.0f, MP_DT_F32, P);
            for (uint64_t j = 0; j < k; j++)
                KK(x->d, mp_k_col2im(c->gin[0].p, c->gin[0].dt, (const float *)(col + j * per), &C, (e0 + j) / G,
                                     (e0 + j) % G, 0, P, S(x)));
        }
        for (uint64_t bi = 0; !ne && bi < B; bi++)
            for (uint64_t g = 0; g < G; g++)
                for (uint64_t p0 = 0; p0 < P; p0 += pc) {
                    uint64_t m = mp_min_u64(pc, P - p0);
                    GEMM(x, true, false, Kc, m, opg, 1.0f, at(w, g * opg * Kc), w.dt, Kc, 0,
                         at(go, (bi * C.co + g * opg) * P + p0), go.dt, P, 0, 0.0f, col, MP_DT_F32, m, 0, 1);
                    KK(x->d, mp_k_col2im(c->gin[0].p, c->gin[0].dt, (const float *)col, &C, bi, g, p0, m, S(x)));
                }
    }
    if (c->gb.p)
        KK(x->d, mp_k_bias_grad(c->gb.p, c->gb.dt, go.p, go.dt, B, C.co, P, S(x)));
    return MP_OK;
}

static enum mp_status pool_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    uint64_t hwo = n->h_out * n->w_out;
    struct mp_k_pool P = {.planes = hwo ? c->p->tensors[n->out].elems / hwo : 0, .hi = n->h_in, .wi = n->w_in,
                          .ho = n->h_out, .wo = n->w_out, .k = n->kernel, .st = n->stride ? n->stride : 1,
                          .pad = n->padding,
                          .kind = n->prim == MP_P_MAXPOOL ? MP_K_MAXPOOL
                                  : n->prim == MP_P_AVGPOOL ? MP_K_AVGPOOL
                                                            : MP_K_ADAPTIVE};
    if (P.kind == MP_K_MAXPOOL)
        NEED(xr(c, MP_XR_POOL_INDICES));
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        KK(x->d, mp_k_pool_fwd(c->out.p, c->in[0].p, c->out.dt, xr(c, MP_XR_POOL_INDICES).p, &P, S(x)));
    } else if (c->gout.p && c->gin[0].p) {
        KK(x->d, mp_k_pool_bwd(c->gin[0].p, c->gout.p, c->gout.dt, xr(c, MP_XR_POOL_INDICES).p, &P, S(x)));
    }
    return MP_OK;
}

/* ---- loss, custom -------------------------------------------------------------------------------- */

static enum mp_status log_softmax_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    NEED(c->out);
    if (fwd) {
        NEED(c->in[0]);
        KK(x->d, mp_k_log_softmax_fwd(c->out.p, c->out.dt, c->in[0].p, c->in[0].dt, n->rows, n->n, S(x)));
    } else if (c->gout.p && c->gin[0].p) {
        KK(x->d, mp_k_log_softmax_bwd(c->gin[0].p, c->gin[0].dt, c->out.p, c->out.dt, c->gout.p, c->gout.dt, n->rows,
                                      n->n, S(x)));
    }
    return MP_OK;
}

static enum mp_status nll_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    NEED(c->in[1]);
    if (fwd) {
        NEED(c->in[0]);
        NEED(c->out);
        KK(x->d, mp_k_nll_fwd(c->out.p, c->in[0].p, c->in[0].dt, c->in[1].p, n->rows, n->n, S(x)));
    } else if (c->gout.p && c->gin[0].p) {
        KK(x->d, mp_k_nll_bwd(c->gin[0].p, c->gin[0].dt, c->in[1].p, c->gout.p, n->rows, n->n, S(x)));
    }
    return MP_OK;
}

static enum mp_status custom_run(struct mp_node_view *c, bool fwd)
{
    const struct mp_node *n = c->n;
    struct mp_exec *x = c->x;
    uint64_t R = n->rows ? n->rows : 1, ob = n->n, eb = has_x(c, MP_XR_CUSTOM_SAVED) ? xr(c, MP_XR_CUSTOM_SAVED).n / R : 0;
    uint64_t np = n->param[0] >= 0 ? c->w.n : 0;
    if (has_x(c, MP_XR_CUSTOM_SAVED))
        NEED(xr(c, MP_XR_CUSTOM_SAVED));
    NEED(c->out);
    if (fwd) {
        NEED(c->in[0]);
        uint64_t ib = c->p->tensors[n->in[0]].bytes / R;
        KK(x->d, mp_k_custom_fwd(c->out.p, eb ? xr(c, MP_XR_CUSTOM_SAVED).p : NULL, c->in[0].p, R, ib, ob, eb, c->w.p, c->w.dt, np,
                                 S(x)));
    } else if (c->gout.p) {
        uint64_t per = c->gin[0].p ? c->gin[0].n / R : 0;
        KK(x->d, mp_k_custom_bwd(c->gin[0].p, c->gin[0].dt, per, c->gout.p, eb ? xr(c, MP_XR_CUSTOM_SAVED).p : NULL, R, ob, eb,
                                 c->gw.p, c->gw.dt, np, S(x)));
    }
    return MP_OK;
}

/* ---- the prim table ------------------------------------------------------------------------------- */

/* forward and backward of a prim whose one function takes a direction */
#define FWD_BWD(name)                                                                        \
    static enum mp_status name##_fwd(struct mp_node_view *c) { return name##_run(c, true); } \
    static enum mp_status name##_bwd(struct mp_node_view *c) { return name##_run(c, false); }
FWD_BWD(embed)
FWD_BWD(addpos)
FWD_BWD(pass)
FWD_BWD(linear)
FWD_BWD(scale)
FWD_BWD(layernorm)
FWD_BWD(rmsnorm)
FWD_BWD(rope)
FWD_BWD(act)
FWD_BWD(mul)
FWD_BWD(dropout)
FWD_BWD(conv)
FWD_BWD(batchnorm)
FWD_BWD(pool)
FWD_BWD(log_softmax)
FWD_BWD(nll)
FWD_BWD(custom)

static enum mp_status attn_fwd(struct mp_node_view *c) { return c->n->eager ? eager_fwd(c) : flash_run(c, true); }
static enum mp_status attn_bwd(struct mp_node_view *c) { return c->n->eager ? eager_bwd(c) : flash_run(c, false); }

/* One row per prim. */
static const struct mp_prim_fns cuda_prims[MP_P_COUNT] = {
    [MP_P_EMBED] = {embed_fwd, embed_bwd},
    [MP_P_ADD_POS] = {addpos_fwd, addpos_bwd},
    [MP_P_CAST] = {pass_fwd, pass_bwd},
    [MP_P_SCALE] = {scale_fwd, scale_bwd},
    [MP_P_LINEAR] = {linear_fwd, linear_bwd},
    [MP_P_LAYERNORM] = {layernorm_fwd, layernorm_bwd},
    [MP_P_RMSNORM] = {rmsnorm_fwd, rmsnorm_bwd},
    [MP_P_ROPE] = {rope_fwd, rope_bwd},
    [MP_P_ATTN] = {attn_fwd, attn_bwd},
    [MP_P_ACT] = {act_fwd, act_bwd},
    [MP_P_MUL] = {mul_fwd, mul_bwd},
    [MP_P_DROPOUT] = {dropout_fwd, dropout_bwd},
    [MP_P_ADD] = {pass_fwd, pass_bwd},
    [MP_P_CONV2D] = {conv_fwd, conv_bwd},
    [MP_P_BATCHNORM] = {batchnorm_fwd, batchnorm_bwd},
    [MP_P_MAXPOOL] = {pool_fwd, pool_bwd},
    [MP_P_AVGPOOL] = {pool_fwd, pool_bwd},
    [MP_P_ADAPTIVE_AVGPOOL] = {pool_fwd, pool_bwd},
    [MP_P_LOG_SOFTMAX] = {log_softmax_fwd, log_softmax_bwd},
    [MP_P_NLL_LOSS] = {nll_fwd, nll_bwd},
    [MP_P_CUSTOM] = {custom_fwd, custom_bwd},
};

/* ---- loss, optimizer ----------------------------------------------------------------------------- */

/* The loss (explicit CE scalar, or the implicit loss of probe_host_loss.c) into the
 * pinned host float, read after the step's synchronisation (cuda_step_end). */
static enum mp_status cuda_loss_grad(struct mp_exec *x, struct mp_view y, struct mp_view g, bool ce)
{
    const void *src = y.p;
    if (ce) {
        if (g.p)
            KK(x->d, mp_k_fill(g.p, g.dt, 1.0f, 1, S(x)));
    } else {
        KK(x->d, mp_k_implicit_loss(CX(x)->scalars, g.p, y.p, y.dt, y.n, S(x)));
        src = CX(x)->scalars;
    }
    CK(x->d, cudaMemcpyAsync(CX(x)->host_loss, src, sizeof(float), cudaMemcpyDeviceToHost, S(x)));
    return MP_OK;
}

static enum mp_status cuda_opt_param(struct mp_exec *x, const struct mp_param_view *v)
{
    const struct mp_param *pq = v->param;
    int pdt = (int)v->P.dt;
    uint64_t n = pq->elems, t = v->t;
    void *P = v->P.p, *G = v->G.p, *St = v->state;
    float bc1 = 1.0f - powf(MP_ADAM_BETA1, (float)t), bc2 = 1.0f - powf(MP_ADAM_BETA2, (float)t);
    switch (x->t.optimizer) {
    case MP_OPT_SGD: KK(x->d, mp_k_sgd(P, G, pdt, n, MP_SGD_LR, S(x))); break;
    case MP_OPT_SGD_MOMENTUM:
        KK(x->d, mp_k_sgd_momentum(P, G, St, pdt, n, MP_SGD_LR, MP_SGD_MOMENTUM, t == 1, S(x)));
        break;
    case MP_OPT_ADAM:
    case MP_OPT_ADAMW:
        KK(x->d, mp_k_adam(P, G, pdt, St, (char *)St + n * esz(pdt), pdt, v->tmp, n, MP_ADAM_LR, MP_ADAM_BETA1,
                           MP_ADAM_BETA2, MP_ADAM_EPS, x->t.optimizer == MP_OPT_ADAMW ? MP_ADAMW_WD : 0.0f, bc1, bc2,
                           S(x)));
        break;
    case MP_OPT_ADAFACTOR: {
        if (!v->tmp0)
            return mp_fail(x->d, MP_ERR_INTERNAL, "probe: the Adafactor step temporary is not allocated");
        float b2 = powf((float)t, MP_ADAFACTOR_BETA2_DECAY), rho = fminf(MP_ADAFACTOR_LR, 1.0f / sqrtf((float)t));
        float eps1 = pdt == MP_DT_F32 ? 1.1920929e-07f : 0.0078125f;
        KK(x->d, mp_k_adafactor(P, G, pdt, St, v->tmp0, pq->matrix ? pq->rows : 1, pq->matrix ? pq->cols : n,
                                pq->matrix, CX(x)->scalars + 4, b2, rho, eps1, MP_ADAFACTOR_EPS2, S(x)));
        break;
    }
    case MP_OPT_ADAM8BIT:
        if (n < MP_ADAM8_MIN_ELEMS)
            KK(x->d, mp_k_adam(P, G, pdt, St, (char *)St + n * 4, MP_DT_F32, NULL, n, MP_ADAM_LR, MP_ADAM_BETA1,
                               MP_ADAM_BETA2, MP_ADAM_EPS, 0.0f, bc1, bc2, S(x)));
        else
            KK(x->d, mp_k_adam8(P, G, pdt, St, n, MP_ADAM_LR, MP_ADAM_BETA1, MP_ADAM_BETA2, MP_ADAM_EPS, bc1, bc2,
                                S(x)));
        break;
    }
    return MP_OK;
}

/* ---- storage ------------------------------------------------------------------------------------- */

static enum mp_status cuda_upload(struct mp_exec *x, void *dst, const void *src, uint64_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyHostToDevice, S(x));
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(S(x));
    if (e != cudaSuccess)
        return cuda_fail(x->d, e, "cudaMemcpyAsync(parameters/input)", __FILE__, __LINE__);
    return MP_OK;
}

/* A storage into host memory, after the work queued before it (the data-parallel probe's
 * local collectives stage through the host). */
static enum mp_status cuda_download(struct mp_exec *x, void *dst, const void *src, uint64_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost, S(x));
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(S(x));
    if (e != cudaSuccess)
        return cuda_fail(x->d, e, "cudaMemcpyAsync(device to host)", __FILE__, __LINE__);
    return MP_OK;
}

static enum mp_status cuda_zero(struct mp_exec *x, void *ptr, uint64_t bytes)
{
    CK(x->d, cudaMemsetAsync(ptr, 0, (size_t)bytes, S(x)));
    return MP_OK;
}

static enum mp_status cuda_cast_add(struct mp_exec *x, struct mp_view dst, struct mp_view src)
{
    KK(x->d, mp_k_convert(dst.p, dst.dt, src.p, src.dt, src.n, 1, S(x)));
    return MP_OK;
}

static enum mp_status cuda_workspace(struct mp_exec *x, void *ptr, uint64_t bytes)
{
    BK(x->d, cublasSetWorkspace(CX(x)->blas, ptr, (size_t)bytes));
    return MP_OK;
}

/* Waits for the stream; errors are cleared (after an OOM the device stays usable). */
static void cuda_sync(struct mp_exec *x)
{
    cudaStreamSynchronize(S(x));
    (void)cudaGetLastError();
}

/* Gives every cached block of the driver pool back (PyTorch: torch.cuda.empty_cache()). */
static void trim(struct cu_ctx *cx)
{
    cudaStreamSynchronize(cx->stream);
    if (cx->mempool)
        cudaMemPoolTrimTo(cx->pool, 0);
    (void)cudaGetLastError();
}

/* ---- the backend ---------------------------------------------------------------------------------- */

static enum mp_status cuda_open(void **out, const struct mp_probe_opts *o, struct mp_diag *d)
{
    struct cu_ctx *cx = calloc(1, sizeof *cx);
    if (!cx)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory opening the cuda backend");
    enum mp_status st = ctx_open(cx, o->device, d);
    if (st != MP_OK) {
        ctx_free(cx);
        return st;
    }
    *out = cx;
    return MP_OK;
}

static enum mp_status cuda_device_info(void *ctx, struct mp_device_info *out)
{
    struct cu_ctx *cx = ctx;
    size_t fr = 0, tot = 0;
    if (cudaSetDevice(cx->device) == cudaSuccess && cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
        cx->info.free_bytes = fr;
        cx->info.total_bytes = tot;
    }
    (void)cudaGetLastError();
    *out = cx->info;
    return MP_OK;
}

/* ---- the run ------------------------------------------------------------------------------------- */

static enum mp_status cuda_exec_new(struct mp_exec *x)
{
    x->bx = calloc(1, sizeof(struct cu_run));
    return x->bx ? MP_OK : mp_fail(x->d, MP_ERR_NOMEM, "probe: out of memory");
}

/* After every storage is freed: the im2col buffer, then the driver pool is trimmed so the
 * next run's device_used_before is not skewed. */
static void cuda_exec_free(struct mp_exec *x)
{
    struct cu_run *u = RUN(x);
    if (!u)
        return;
    if (u->col)
        cu_free(CX(x), u->col);
    if (u->dptr)
        cu_free(CX(x), u->dptr);
    if (u->attn_ws)
        cu_free(CX(x), u->attn_ws);
    if (u->hbase)
        cudaFreeHost(u->hbase);
    trim(CX(x));
    for (size_t i = 0; i < u->cap_ev; i++)
        if (u->ev[i])
            cudaEventDestroy(u->ev[i]);
    free(u->ev);
    if (u->t0)
        cudaEventDestroy(u->t0);
    if (u->t1)
        cudaEventDestroy(u->t1);
    (void)cudaGetLastError();
    free(u);
    x->bx = NULL;
}

/* A buffer outside the counting pool, from the same driver pool as the step's storages
 * (trimmed with them); its out-of-memory is a result that names it. */
static enum mp_status outside_alloc(struct mp_exec *x, uint64_t bytes, void **out, const char *what)
{
    enum mp_status st = cu_alloc(CX(x), bytes, out, x->d);
    if (st == MP_ERR_OOM) {
        x->pool.oom_bytes = bytes;
        x->pool.oom_capacity = false;
        snprintf(x->pool.oom_event, sizeof x->pool.oom_event, "setup:%s", what);
    }
    return st;
}

/* The im2col buffer: every (sample, group) column block of the largest conv side by side
 * (one batched GEMM), at most MP_PROBE_COL_CAP_BYTES (then fewer blocks per GEMM, or pixel
 * chunks of one block), at least one column. */
static enum mp_status col_buffer(struct mp_exec *x)
{
    struct cu_run *u = RUN(x);
    uint64_t need = 0;
    for (size_t k = 0; k < x->p->n_nodes; k++) {
        const struct mp_node *n = &x->p->nodes[k];
        if (n->prim != MP_P_CONV2D)
            continue;
        uint64_t g = n->groups ? n->groups : 1, kc = n->c_in / g * n->kernel * n->kernel, P = n->h_out * n->w_out;
        uint64_t per_sample = n->c_in * n->h_in * n->w_in, samples = per_sample ? x->p->tensors[n->in[0]].elems /
                                                                                        per_sample : 1;
        uint64_t b, all;
        if (!mp_mul3_u64(kc, P, 4, &b) || !mp_mul3_u64(b, g, samples, &all))
            all = UINT64_MAX;
        need = mp_max_u64(need, mp_min_u64(all, mp_max_u64(MP_PROBE_COL_CAP_BYTES, kc * 4)));
    }
    if (!need)
        return MP_OK;
    /* PyTorch's conv uses cuDNN workspaces the estimator does not count either */
    enum mp_status st = outside_alloc(x, need, &u->col, "im2col buffer");
    if (st != MP_OK)
        return st;
    u->col_bytes = need;
    return MP_OK;
}

/* The flash path's workspace: every (sample, head) entry's whole score block of the largest
 * flash attention (one pass of GEMMs), at most MP_PROBE_ATTN_WS_BYTES, at least one query row. */
static enum mp_status attn_buffer(struct mp_exec *x)
{
    struct cu_run *u = RUN(x);
    uint64_t need = 0;
    for (size_t k = 0; k < x->p->n_nodes; k++) {
        const struct mp_node *n = &x->p->nodes[k];
        if (n->prim != MP_P_ATTN || n->eager)
            continue;
        uint64_t s = n->seq ? n->seq : 1, rows = n->rows, all, row;
        if (!mp_mul_u64(s, FA_WS_PER, &row) || !mp_mul3_u64(rows, n->heads, row, &all))
            all = row = UINT64_MAX;
        need = mp_max_u64(need, mp_min_u64(all, mp_max_u64(MP_PROBE_ATTN_WS_BYTES, row)));
    }
    if (!need)
        return MP_OK;
    void *ws = NULL;
    enum mp_status st = outside_alloc(x, need, &ws, "attention workspace");
    if (st != MP_OK)
        return st;
    u->attn_ws = ws;
    u->attn_ws_bytes = need;
    return MP_OK;
}

static enum mp_status used_bytes(struct mp_exec *x, uint64_t *used)
{
    size_t fr = 0, tot = 0;
    CK(x->d, cudaMemGetInfo(&fr, &tot));
    *used = (uint64_t)(tot - fr);
    return MP_OK;
}

static enum mp_status cuda_run_begin(struct mp_exec *x, struct mp_probe_result *r)
{
    struct cu_run *u = RUN(x);
    CK(x->d, cudaSetDevice(CX(x)->device));
    trim(CX(x)); /* nothing cached from an earlier run counts as used */
    enum mp_status st = used_bytes(x, &r->device_used_before);
    if (st == MP_OK)
        st = col_buffer(x);
    if (st == MP_OK)
        st = attn_buffer(x);
    if (st == MP_OK && (cudaEventCreate(&u->t0) != cudaSuccess || cudaEventCreate(&u->t1) != cudaSuccess))
        st = mp_fail(x->d, MP_ERR_DEVICE, "cudaEventCreate failed at %s:%d", __FILE__, __LINE__);
    if (st == MP_OK) { /* the batched GEMMs' pointer arrays, outside the counting pool as the im2col buffer */
        void *h = NULL;
        cudaError_t e = cudaMallocHost(&h, PTR_BYTES);
        if (e != cudaSuccess)
            return cuda_fail(x->d, e, "cudaMallocHost(GEMM pointers)", __FILE__, __LINE__);
        u->hbase = h;
        u->hab = h;
        u->hc = (void **)((char *)h + 2 * PTR_CAP * sizeof(void *));
        st = outside_alloc(x, PTR_BYTES, &u->dptr, "GEMM pointer arrays");
    }
    return st;
}

/* Step 0 warms up (first allocations, cuBLAS heuristics); the measured steps are timed as a
 * whole; the profiling step after them records an event pair around each GEMM for the GEMM
 * rate, so the timed steps carry no per-GEMM events. */
static enum mp_status cuda_step_begin(struct mp_exec *x, bool profile)
{
    struct cu_run *u = RUN(x);
    u->timing = profile;
    u->n_ev = 0;
    u->ptr_used = 0; /* the last step ended synchronised: every slot is free */
    cudaError_t e = cudaEventRecord(u->t0, S(x));
    if (e != cudaSuccess)
        return cuda_fail(x->d, e, "cudaEventRecord", __FILE__, __LINE__);
    return MP_OK;
}

static enum mp_status cuda_step_end(struct mp_exec *x, double *ms)
{
    struct cu_run *u = RUN(x);
    cudaError_t e;
    if ((e = cudaEventRecord(u->t1, S(x))) != cudaSuccess || (e = cudaEventSynchronize(u->t1)) != cudaSuccess)
        return cuda_fail(x->d, e, "the training step", __FILE__, __LINE__); /* asynchronous faults land here */
    float el = 0;
    cudaEventElapsedTime(&el, u->t0, u->t1);
    for (size_t i = 0; i + 1 < u->n_ev && u->timing; i += 2) {
        float g = 0;
        if (cudaEventElapsedTime(&g, u->ev[i], u->ev[i + 1]) == cudaSuccess)
            u->gemm_ms += g;
    }
    x->loss = *CX(x)->host_loss;
    *ms = el;
    return MP_OK;
}

static enum mp_status cuda_run_end(struct mp_exec *x, struct mp_probe_result *r, enum mp_status st)
{
    struct cu_run *u = RUN(x);
    if (st == MP_OK) /* before freeing: the driver pool still holds the step */
        st = used_bytes(x, &r->device_used_after);
    if (st == MP_OK)
        r->gemm_tflops = u->gemm_ms > 0 ? u->gemm_flops / (u->gemm_ms * 1e-3) / 1e12 : 0.0;
    r->outside_pool_bytes = u->col_bytes + u->attn_ws_bytes + (u->dptr ? PTR_BYTES : 0);
    (void)cuda_device_info(CX(x), &r->dev);
    return st;
}

static void cuda_close(void *ctx) { ctx_free(ctx); }

const struct mp_probe_backend mp_probe_backend_cuda = {
    .name = "cuda",
    .available = cuda_available,
    .open = cuda_open,
    .device_info = cuda_device_info,
    .close = cuda_close,
    .prims = cuda_prims,
    .loss_grad = cuda_loss_grad,
    .opt_param = cuda_opt_param,
    .alloc = cu_alloc,
    .free = cu_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .zero = cuda_zero,
    .cast_add = cuda_cast_add,
    .workspace = cuda_workspace,
    .sync = cuda_sync,
    .exec_new = cuda_exec_new,
    .exec_free = cuda_exec_free,
    .run_begin = cuda_run_begin,
    .run_end = cuda_run_end,
    .profile_step = true,
    .step_begin = cuda_step_begin,
    .step_end = cuda_step_end,
};
