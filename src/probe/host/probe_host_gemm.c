/* probe_host_gemm.c — the host backend's matrix products.
 *
 * One row-major GEMM for every host prim that multiplies matrices: a CPU BLAS
 * (cblas_sgemm, OpenBLAS when the build found one: MEMPLAN_HAVE_CBLAS), else
 * plain C with double accumulation.  fp32 in, fp32 out; no allocation in the
 * BLAS path (the plain path packs transposed operands into scratch).
 */
#include "probe_host.h"

#include <limits.h>
#include <stdlib.h>

#ifdef MEMPLAN_HAVE_CBLAS
#include <cblas.h>
#endif

bool mp_host_blas(void)
{
#ifdef MEMPLAN_HAVE_CBLAS
    return true;
#else
    return false;
#endif
}

/* Element (r, k) of op(X) for a row-major X with leading dimension ld. */
static inline float op_at(const float *X, bool t, uint64_t ld, uint64_t r, uint64_t k)
{
    return t ? X[k * ld + r] : X[r * ld + k];
}

/* op(X) packed as rows (rows x K, contiguous), or X itself when already so. */
static const float *pack_rows(const float *X, bool t, uint64_t ld, uint64_t rows, uint64_t K, float **own)
{
    *own = NULL;
    if (!t && ld == K)
        return X;
    uint64_t n = rows * K;
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    if (!p)
        return NULL;
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t k = 0; k < K; k++)
            p[r * K + k] = op_at(X, t, ld, r, k);
    *own = p;
    return p;
}

enum mp_status mp_host_gemm(bool ta, bool tb, uint64_t M, uint64_t N, uint64_t K, float alpha, const float *A,
                            uint64_t lda, const float *B, uint64_t ldb, float beta, float *C, uint64_t ldc)
{
    if (!M || !N)
        return MP_OK;
#ifdef MEMPLAN_HAVE_CBLAS
    if (M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                    (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
        return MP_OK;
    }
#endif
    /* C = alpha A' B'^T' with A' = op(A) (M,K) and B'^T = op(B)^T (N,K), both packed as rows */
    float *oa, *ob;
    const float *a = pack_rows(A, ta, lda, M, K, &oa);
    const float *b = pack_rows(B, !tb, ldb, N, K, &ob);
    if (!a || !b) {
        free(oa);
        free(ob);
        return MP_ERR_NOMEM;
    }
    for (uint64_t r = 0; r < M; r++)
        for (uint64_t o = 0; o < N; o++) {
            double s = 0.0;
            const float *ar = a + r * K, *bo = b + o * K;
            for (uint64_t i = 0; i < K; i++)
                s += (double)ar[i] * bo[i];
            float *cp = C + r * ldc + o;
            *cp = (float)(alpha * s + (beta != 0.0f ? (double)beta * *cp : 0.0));
        }
    free(oa);
    free(ob);
    return MP_OK;
}
