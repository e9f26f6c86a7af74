/* probe_cuda_gemm.c — the cuda backend: cuBLAS, loaded on first use, the status checks and the GEMMs
 * (probe_cuda.h). */
#include "probe_cuda.h"

#include <dlfcn.h> /* dlopen: cuBLAS is loaded when the backend opens */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef MEMPLAN_CUDA_LIBDIR
#define MEMPLAN_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

/* ---- cuBLAS, loaded on first use ----------------------------------------------------------
 * Linking libcublas would map its ~700 MB of libraries into every memplan run
 * (about 100 ms before main) for a backend most commands never open, so the seven
 * entry points used here are resolved with dlopen when the cuda backend opens. */
struct cu_blas blas_api;

static bool blas_sym(void *lib, const char *name, void *fnptr)
{
    void *p = dlsym(lib, name);
    memcpy(fnptr, &p, sizeof p); /* object pointer to function pointer, as POSIX dlsym intends */
    return p != NULL;
}

enum mp_status blas_load(struct mp_diag *d)
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

/* ---- checks ------------------------------------------------------------------------------ */

enum mp_status cuda_fail(struct mp_diag *d, cudaError_t e, const char *call, const char *file, int line)
{
    return mp_fail(d, MP_ERR_DEVICE, "%s failed at %s:%d: %s: %s", call, file, line, cudaGetErrorName(e),
                   cudaGetErrorString(e));
}

enum mp_status blas_fail(struct mp_diag *d, cublasStatus_t e, const char *call, const char *file, int line)
{
    return mp_fail(d, MP_ERR_DEVICE, "%s failed at %s:%d: %s", call, file, line, cublasGetStatusName(e));
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
enum mp_status gemm(struct mp_exec *x, bool ta, bool tb, uint64_t M, uint64_t N, uint64_t K, float alpha,
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

/* Reserves n entries; when a step has used every slot, the stream is drained and the slots
 * start again (the copies still queued read the pinned slots). */
enum mp_status gemm_ptrs_take(struct mp_exec *x, uint64_t n, struct gemm_ptrs *g)
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
enum mp_status gemm_batched(struct mp_exec *x, bool ta, bool tb, uint64_t M, uint64_t N, uint64_t K,
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
    /* the device reads n A pointers then n B pointers; a caller that filled fewer entries than it
     * took (fa_kv_grad: one kv-group member's entries) has its B pointers further on, at a + taken */
    if (g->b == g->a + g->n) {
        CK(x->d, cudaMemcpyAsync(dab, g->a, 2 * g->n * sizeof(void *), cudaMemcpyHostToDevice, S(x)));
    } else {
        CK(x->d, cudaMemcpyAsync(dab, g->a, g->n * sizeof(void *), cudaMemcpyHostToDevice, S(x)));
        CK(x->d, cudaMemcpyAsync(dab + g->n * sizeof(void *), g->b, g->n * sizeof(void *), cudaMemcpyHostToDevice,
                                 S(x)));
    }
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
