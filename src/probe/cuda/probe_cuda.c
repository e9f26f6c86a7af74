/* probe_cuda.c — the cuda backend: the tensor program executed on one GPU (C11,
 * CUDA runtime and cuBLAS C APIs).  probe.c's executor runs the step; this file gives
 * it storage (each ALLOC/FREE is one cudaMallocAsync/cudaFreeAsync, driver-cached like
 * PyTorch's caching allocator, through the counting pool, so the measured peak is the
 * estimator's), event timing and the prim table: GEMMs are cuBLAS (bf16/fp16 in, fp32
 * compute), the rest kernels/; cuBLAS's workspace is the replay's WORKSPACE storage.
 * Outside the pool (seen in device_used_*): context, handle, a few scalars, a bounded
 * im2col buffer.  OOM frees everything: a result.  cuBLAS and the GEMMs are in
 * probe_cuda_gemm.c, each op family's prims in probe_cuda_<family>.c (probe_cuda.h).
 */
#include "probe_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    cx->info.sm_count = (unsigned)prop.multiProcessorCount;
    cx->info.sm_threads = (unsigned)prop.maxThreadsPerMultiProcessor;
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

/* ---- the prim table ------------------------------------------------------------------------------- */

/* MEMPLAN_CUDA_SYNC=1 (a debugging aid, bench/gpu/README.md): the stream is synchronised after
 * every node's forward and backward and every parameter's optimizer step, so an asynchronous
 * fault (an illegal address) is reported at the node whose kernels made it, not at the step's end. */
static bool sync_each(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("MEMPLAN_CUDA_SYNC");
        on = v && *v && strcmp(v, "0") != 0;
    }
    return on;
}

/* What the stream's work so far left (cudaSuccess when st failed already or sync_each is off). */
static cudaError_t synced(struct mp_exec *x, enum mp_status st)
{
    return st == MP_OK && sync_each() ? cudaStreamSynchronize(S(x)) : cudaSuccess;
}

static enum mp_status node_done(struct mp_node_view *c, enum mp_status st, bool fwd)
{
    cudaError_t e = synced(c->x, st);
    if (e != cudaSuccess)
        return mp_fail(c->x->d, MP_ERR_INTERNAL, "cuda probe: node %s (%s) %s: %s: %s", c->n->name,
                       mp_prim_str(c->n->prim), fwd ? "forward" : "backward", cudaGetErrorName(e),
                       cudaGetErrorString(e));
    return st;
}

/* forward and backward of a prim whose one function takes a direction */
#define FWD_BWD(name)                                                                                         \
    static enum mp_status name##_fwd(struct mp_node_view *c) { return node_done(c, name##_run(c, true), true); } \
    static enum mp_status name##_bwd(struct mp_node_view *c) { return node_done(c, name##_run(c, false), false); }

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

static enum mp_status attn_fwd(struct mp_node_view *c)
{
    return node_done(c, c->n->eager ? eager_fwd(c) : flash_run(c, true), true);
}

static enum mp_status attn_bwd(struct mp_node_view *c)
{
    return node_done(c, c->n->eager ? eager_bwd(c) : flash_run(c, false), false);
}

static enum mp_status opt_param_synced(struct mp_exec *x, const struct mp_param_view *v)
{
    enum mp_status st = cuda_opt_param(x, v);
    cudaError_t e = synced(x, st);
    if (e != cudaSuccess)
        return mp_fail(x->d, MP_ERR_INTERNAL, "cuda probe: the %s step of %s: %s: %s",
                       mp_optimizer_str(x->t.optimizer), v->param->name, cudaGetErrorName(e), cudaGetErrorString(e));
    return st;
}

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
    .opt_param = opt_param_synced,
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
