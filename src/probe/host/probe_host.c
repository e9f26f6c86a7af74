/* probe_host.c — the host backend: the tensor program executed in plain C on the CPU.
 *
 * probe.c's executor runs the step; this file gives it storage (one malloc per
 * storage through the counting pool, capacity-limited, so the measured peak is the
 * estimator's peak_allocated_bytes) and the prim table.  Each prim's forward and
 * backward lives in probe_host_<family>.c, one file per op family as in kernels/;
 * element access and scratch in probe_host.h.
 */
#include "probe_host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h> /* mallopt */
#endif

/* ---- storage ---------------------------------------------------------------------------------- */

static enum mp_status host_alloc(void *ctx, uint64_t bytes, void **out, struct mp_diag *d)
{
    (void)ctx;
    (void)d;
    if (bytes > SIZE_MAX)
        return MP_ERR_OOM;
    *out = malloc((size_t)bytes);
    return *out ? MP_OK : MP_ERR_OOM; /* host out of memory: also a "does not fit" */
}

static void host_free(void *ctx, void *ptr)
{
    (void)ctx;
    free(ptr);
}

static enum mp_status host_zero(struct mp_exec *x, void *ptr, uint64_t bytes)
{
    (void)x;
    memset(ptr, 0, (size_t)bytes);
    return MP_OK;
}

static enum mp_status host_cast_add(struct mp_exec *x, struct mp_view dst, struct mp_view src)
{
    (void)x;
    for (uint64_t i = 0; i < src.n; i++)
        mp_view_st(dst, i, mp_view_ld(dst, i) + mp_view_ld(src, i));
    return MP_OK;
}

/* NaN bytes: an activation or temporary read before it is written shows in the loss. */
static enum mp_status host_poison(struct mp_exec *x, void *ptr, uint64_t bytes)
{
    (void)x;
    memset(ptr, 0xff, (size_t)bytes);
    return MP_OK;
}

/* ---- per run: the node's scratch ------------------------------------------------------------- */

static enum mp_status host_exec_new(struct mp_exec *x)
{
    x->bx = calloc(1, sizeof(struct mp_host_scratch));
    return x->bx ? MP_OK : mp_fail(x->d, MP_ERR_NOMEM, "probe: out of memory");
}

static void host_exec_free(struct mp_exec *x)
{
    free(x->bx);
    x->bx = NULL;
}

static void host_node_end(struct mp_node_view *c)
{
    struct mp_host_scratch *s = c->x->bx;
    for (int i = 0; i < s->n; i++)
        free(s->p[i]);
    s->n = 0;
}

/* ---- the backend ------------------------------------------------------------------------------ */

static enum mp_status host_open(void **ctx, const struct mp_probe_opts *o, struct mp_diag *d)
{
    (void)o;
    (void)d;
    *ctx = NULL;
#if defined(__GLIBC__) && defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD)
    /* Storages up to 32 MiB come from the heap and freed ones stay there, so every step
     * does not map, fault in and zero its activations again (a GPU's caching allocator). */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
    return MP_OK;
}

static enum mp_status host_device_info(void *ctx, struct mp_device_info *out)
{
    (void)ctx;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "host (CPU)");
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0)
        out->total_bytes = (uint64_t)pages * (uint64_t)psz;
#endif
#if defined(_SC_AVPHYS_PAGES) && defined(_SC_PAGESIZE)
    long avail = sysconf(_SC_AVPHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
    if (avail > 0 && pg > 0)
        out->free_bytes = (uint64_t)avail * (uint64_t)pg;
#endif
    return MP_OK;
}

/* One row per prim: the file of its family says how. */
static const struct mp_prim_fns host_prims[MP_P_COUNT] = {
    [MP_P_EMBED] = {mp_host_embed_fwd, mp_host_embed_bwd},
    [MP_P_ADD_POS] = {mp_host_addpos_fwd, mp_host_addpos_bwd},
    [MP_P_CAST] = {mp_host_cast_fwd, mp_host_pass_bwd},
    [MP_P_SCALE] = {mp_host_scale_fwd, mp_host_scale_bwd},
    [MP_P_LINEAR] = {mp_host_linear_fwd, mp_host_linear_bwd},
    [MP_P_LAYERNORM] = {mp_host_layernorm_fwd, mp_host_layernorm_bwd},
    [MP_P_RMSNORM] = {mp_host_rmsnorm_fwd, mp_host_rmsnorm_bwd},
    [MP_P_ROPE] = {mp_host_rope_fwd, mp_host_rope_bwd},
    [MP_P_ATTN] = {mp_host_attn_fwd, mp_host_attn_bwd},
    [MP_P_ACT] = {mp_host_act_fwd, mp_host_act_bwd},
    [MP_P_MUL] = {mp_host_mul_fwd, mp_host_mul_bwd},
    [MP_P_DROPOUT] = {mp_host_dropout_fwd, mp_host_dropout_bwd},
    [MP_P_ADD] = {mp_host_add_fwd, mp_host_pass_bwd},
    [MP_P_CONV2D] = {mp_host_conv_fwd, mp_host_conv_bwd},
    [MP_P_BATCHNORM] = {mp_host_batchnorm_fwd, mp_host_batchnorm_bwd},
    [MP_P_MAXPOOL] = {mp_host_pool_fwd, mp_host_pool_bwd},
    [MP_P_AVGPOOL] = {mp_host_pool_fwd, mp_host_pool_bwd},
    [MP_P_ADAPTIVE_AVGPOOL] = {mp_host_pool_fwd, mp_host_pool_bwd},
    [MP_P_LOG_SOFTMAX] = {mp_host_log_softmax_fwd, mp_host_log_softmax_bwd},
    [MP_P_NLL_LOSS] = {mp_host_nll_fwd, mp_host_nll_bwd},
    [MP_P_CUSTOM] = {mp_host_custom_fwd, mp_host_custom_bwd},
};

const struct mp_probe_backend mp_probe_backend_host = {
    .name = "host",
    .open = host_open,
    .device_info = host_device_info,
    .prims = host_prims,
    .loss_grad = mp_host_loss_grad,
    .opt_param = mp_host_opt_param,
    .node_end = host_node_end,
    .alloc = host_alloc,
    .free = host_free,
    .zero = host_zero,
    .cast_add = host_cast_add,
    .poison = host_poison,
    .exec_new = host_exec_new,
    .exec_free = host_exec_free,
};
