/* probe_impl.h — private to probe.c, the backends (probe/host/, probe/cuda/) and tests.
 *
 * probe.c owns the executor: the pool, the node view and the step loop (mp_replay's
 * visitor: storage, forward over nodes, loss, backward, optimizer, timing, progress).
 * A backend supplies only its per-prim forward/backward and storage primitives
 * through struct mp_probe_backend (as ggml_backend_i: optional members may be NULL;
 * probe.c checks).  Backends include this header and probe_pool.h; they never call
 * into probe.c, so the registry there can name them without a dependency cycle.
 */
#ifndef MEMPLAN_PROBE_IMPL_H
#define MEMPLAN_PROBE_IMPL_H

#include "probe_pool.h"

/* ---- a storage seen as elements of one dtype ------------------------------------------ */

struct mp_view {
    void *p; /* NULL when not allocated */
    enum mp_dtype dt;
    uint64_t n;
};

/* Element i of a view in host memory, as float (the host backend; test hooks). */
static inline float mp_view_ld(struct mp_view v, uint64_t i)
{
    switch (v.dt) {
    case MP_DT_F32: return ((const float *)v.p)[i];
    case MP_DT_BF16: return mp_f32_from_bf16(((const uint16_t *)v.p)[i]);
    case MP_DT_F16: return mp_f32_from_f16(((const uint16_t *)v.p)[i]);
    case MP_DT_I64: return (float)((const int64_t *)v.p)[i];
    case MP_DT_U8: return (float)((const uint8_t *)v.p)[i];
    }
    return 0.0f;
}

static inline void mp_view_st(struct mp_view v, uint64_t i, float f)
{
    switch (v.dt) {
    case MP_DT_F32: ((float *)v.p)[i] = f; break;
    case MP_DT_BF16: ((uint16_t *)v.p)[i] = mp_bf16_from_f32(f); break;
    case MP_DT_F16: ((uint16_t *)v.p)[i] = mp_f16_from_f32(f); break;
    case MP_DT_I64: ((int64_t *)v.p)[i] = (int64_t)f; break;
    case MP_DT_U8: ((uint8_t *)v.p)[i] = (uint8_t)f; break;
    }
}

/* ---- the executor (probe.c) --------------------------------------------------------------- */

struct mp_probe_backend;

struct mp_exec {
    const struct mp_probe_backend *be;
    void *bctx;           /* the backend's open context (cuda: device, stream, cuBLAS handle) */
    void *bx;             /* the backend's per-run state (exec_new), or NULL */
    const struct mp_program *p;
    struct mp_train_opts t;
    struct mp_pool pool;
    struct mp_node_layout *lay;
    uint64_t seed;
    uint64_t rng_step;    /* dropout stream: advances with every updating step */
    uint64_t opt_steps;   /* optimizer steps taken (Adam bias correction, Adafactor schedule) */
    bool update;          /* false: the step leaves parameters and state alone (finite differences) */
    bool ws_set;          /* the backend was handed the WORKSPACE storage */
    float *grads_out;     /* (host memory only) every parameter gradient before zero_grad */
    double loss;          /* the step's loss (LOSS_GRAD, or the backend's step_end) */
    double ce_loss;       /* the last cross-entropy in double (a backend's NLL forward may set it) */
    struct mp_par_exec *par; /* data parallel: rank r's shards and local collectives (probe_par.c) */
    const int *grad_of;   /* the replay's tensor -> gradient storage map (mp_event.grad_of) */
    struct mp_diag *d;
};

/* One node's storages, built by the step loop for a backend's forward or backward. */
struct mp_node_view {
    struct mp_exec *x;
    const struct mp_program *p;
    const struct mp_node *n;
    const struct mp_node_layout *lay;
    int k;
    int step;             /* a node that runs as several ops (layers.h mp_subop): which one now */
    bool fwd;             /* forward or backward */
    struct mp_view in[3], out, ex[MP_NODE_EXTRA_MAX], w, b, gin[3], gout, gw, gb, tmp;
};

/* The op an executor runs now, of a node that runs as several (NULL: the node is one op). */
static inline const struct mp_subop *mp_view_subop(const struct mp_node_view *c)
{
    int first = c->fwd ? c->n->fop0 : c->n->bop0, count = c->fwd ? c->n->n_fops : c->n->n_bops;
    return count && c->step >= 0 && c->step < count ? &c->p->subops[first + c->step] : NULL;
}

/* Tensor t of store s (ACT or GRAD) as a view; p == NULL when not allocated. */
static inline struct mp_view mp_view_tensor(const struct mp_exec *x, enum mp_store s, int t)
{
    struct mp_view v = {NULL, MP_DT_U8, 0};
    if (t < 0)
        return v;
    v.p = mp_pool_get(&x->pool, s, t);
    v.dt = x->p->tensors[t].dtype;
    v.n = x->p->tensors[t].elems;
    return v;
}

/* Tensor t's gradient as a view: the GRAD storage that holds it now (a residual add's inputs
 * share its output's); p == NULL when t has none. */
static inline struct mp_view mp_view_grad(const struct mp_exec *x, int t)
{
    struct mp_view v = mp_view_tensor(x, MP_ST_GRAD, t);
    if (t >= 0 && x->grad_of)
        v.p = x->grad_of[t] >= 0 ? mp_pool_get(&x->pool, MP_ST_GRAD, x->grad_of[t]) : NULL;
    return v;
}

/* Parameter q of store s (PARAM, PGRAD) as a view in the parameter's dtype. */
static inline struct mp_view mp_view_param(const struct mp_exec *x, enum mp_store s, int q)
{
    struct mp_view v = {NULL, q >= 0 ? x->p->params[q].dtype : x->p->param_dtype, 0};
    if (q < 0)
        return v;
    v.p = mp_pool_get(&x->pool, s, q);
    v.n = x->p->params[q].elems;
    return v;
}

/* The node's extra with role r (layers.h mp_xrole); p == NULL when it has none. */
static inline struct mp_view mp_view_extra(const struct mp_node_view *c, enum mp_xrole r)
{
    return mp_view_tensor(c->x, MP_ST_ACT, mp_node_extra(c->n, r, 0));
}

/* The part of the node's TMP storage with role r and its size; NULL when it has none. */
static inline void *mp_view_tmp(const struct mp_node_view *c, bool bwd, enum mp_trole r, uint64_t *bytes)
{
    const struct mp_tmp_part *t = mp_node_tmp(c->n, bwd, r);
    *bytes = t ? t->bytes : 0;
    return t && c->tmp.p ? (char *)c->tmp.p + t->offset : NULL;
}

/* A linear node under autocast whose weight gradient is still to be made: the node leaves its
 * half weight gradient in its TMP (MP_TR_WGRAD_HALF) and MP_EV_WGRAD_CAST adds it to the fp32
 * .grad the replay allocates after the node. */
static inline bool mp_weight_grad_cast_later(const struct mp_node_view *c)
{
    int q = c->n->param[0];
    return !c->gw.p && q >= 0 && c->n->prim == MP_P_LINEAR && c->p->params[q].trainable &&
           mp_node_tmp(c->n, true, MP_TR_WGRAD_HALF) != NULL;
}

/* One parameter at the optimizer step (parameters without a gradient are skipped). */
struct mp_param_view {
    size_t q;
    const struct mp_param *param;
    struct mp_view P, G;  /* the parameter and its gradient, in the parameter's dtype */
    void *state;          /* its optimizer state (layout per optimizer), or NULL */
    void *tmp;            /* its step temporary (Adam: the _foreach_sqrt output), or NULL */
    void *tmp0;           /* the shared step temporary (Adafactor: id 0), or NULL */
    uint64_t t;           /* the step number, from 1 */
};

/* ---- a backend ------------------------------------------------------------------------------ */

struct mp_prim_fns {
    enum mp_status (*fwd)(struct mp_node_view *c);
    enum mp_status (*bwd)(struct mp_node_view *c);
};

struct mp_probe_backend {
    const char *name;
    /* -- registry -- */
    bool (*available)(void);  /* (optional) true when the backend can open now; NULL = always */
    enum mp_status (*open)(void **ctx, const struct mp_probe_opts *o, struct mp_diag *d);
    /* (optional) NULL: mp_probe_device_info reports MP_ERR_UNSUPPORTED */
    enum mp_status (*device_info)(void *ctx, struct mp_device_info *out);
    void (*close)(void *ctx); /* (optional) */

    /* -- compute: indexed by enum mp_prim; a NULL member: the backend does not run that prim
     *    (MP_P_VIEW moves nothing and needs none) -- */
    const struct mp_prim_fns *prims;
    /* at LOSS_GRAD: the loss into x->loss (or at step_end) and the output's gradient g (may be
     * absent): ce: y is the cross-entropy scalar; else the implicit loss of probe.h */
    enum mp_status (*loss_grad)(struct mp_exec *x, struct mp_view y, struct mp_view g, bool ce);
    enum mp_status (*opt_param)(struct mp_exec *x, const struct mp_param_view *v);
    void (*node_end)(struct mp_node_view *c); /* (optional) after each node's forward or backward */

    /* -- storage: the pool's allocator; MP_ERR_OOM is a result -- */
    enum mp_status (*alloc)(void *ctx, uint64_t bytes, void **out, struct mp_diag *d);
    void (*free)(void *ctx, void *ptr);
    /* (optional) host bytes into a storage, finished on return; NULL: storages are host memory */
    enum mp_status (*upload)(struct mp_exec *x, void *dst, const void *src, uint64_t bytes);
    /* (optional, with upload) a storage's bytes into host memory, finished on return (the
     * data-parallel probe's local collectives) */
    enum mp_status (*download)(struct mp_exec *x, void *dst, const void *src, uint64_t bytes);
    enum mp_status (*zero)(struct mp_exec *x, void *ptr, uint64_t bytes);
    /* dst += src converted to dst's dtype (src.n elements): an autocast weight's half gradient
     * into its fp32 .grad (MP_EV_WGRAD_CAST) */
    enum mp_status (*cast_add)(struct mp_exec *x, struct mp_view dst, struct mp_view src);
    /* (optional) a fresh activation or temporary (host: NaN bytes, so a read before a write shows) */
    enum mp_status (*poison)(struct mp_exec *x, void *ptr, uint64_t bytes);
    /* (optional) the replay's WORKSPACE storage (cuda: cuBLAS's); (NULL, 0) takes it back */
    enum mp_status (*workspace)(struct mp_exec *x, void *ptr, uint64_t bytes);
    void (*sync)(struct mp_exec *x); /* (optional) waits for queued work; clears a sticky error */

    /* -- run and step (all optional) -- */
    enum mp_status (*exec_new)(struct mp_exec *x);  /* x->bx */
    void (*exec_free)(struct mp_exec *x);           /* after every storage is freed */
    enum mp_status (*run_begin)(struct mp_exec *x, struct mp_probe_result *r);
    /* after the steps (st: how they ended), before the storages are freed */
    enum mp_status (*run_end)(struct mp_exec *x, struct mp_probe_result *r, enum mp_status st);
    bool profile_step;    /* one more step after the measured ones, with step_begin(profile = true) */
    enum mp_status (*step_begin)(struct mp_exec *x, bool profile);
    /* the step's time in *ms (NULL members: wall time around the replay) */
    enum mp_status (*step_end)(struct mp_exec *x, double *ms);
};

extern const struct mp_probe_backend mp_probe_backend_host;
#ifdef MEMPLAN_HAVE_CUDA
extern const struct mp_probe_backend mp_probe_backend_cuda;
#endif

/* ---- the host executor's GEMM (probe_host_gemm.c) ------------------------------------------ */

/* Row-major C (M,N) = alpha op(A) op(B) + beta C; op(X) = X^T when t.  cblas_sgemm when
 * built with a CPU BLAS, else plain C (double sums).  MP_ERR_NOMEM only on the plain path. */
enum mp_status mp_host_gemm(bool ta, bool tb, uint64_t M, uint64_t N, uint64_t K, float alpha, const float *A,
                            uint64_t lda, const float *B, uint64_t ldb, float beta, float *C, uint64_t ldc);
/* True when the host GEMMs run on a CPU BLAS. */
bool mp_host_blas(void);

/* ---- the executor (test hooks) ---------------------------------------------------------- */

/* An executor of p on the host backend with its own pool (capacity 0 = unlimited). */
enum mp_status mp_host_exec_new(struct mp_exec **out, const struct mp_program *p, const struct mp_train_opts *t,
                                uint64_t capacity_bytes, uint64_t seed, struct mp_diag *d);
void mp_host_exec_free(struct mp_exec *x); /* NULL-safe; frees every storage */
/* One training step (one replay).  update=false leaves the parameters, the
 * optimizer state, the step count and the dropout stream alone (for finite
 * differences).  grads (optional, total_params floats) receives every
 * parameter gradient in parameter order just before zero_grad.  *loss: the
 * step's loss (double).  MP_ERR_OOM: every storage has been freed, the pool's
 * oom_* say what did not fit. */
enum mp_status mp_host_exec_step(struct mp_exec *x, const struct mp_schedule *s, bool update, float *grads,
                                 double *loss, struct mp_diag *d);
const struct mp_pool *mp_host_exec_pool(const struct mp_exec *x);
/* Parameter element access (parameters exist after the first step). */
float mp_host_exec_param_get(const struct mp_exec *x, size_t q, uint64_t i);
void mp_host_exec_param_set(struct mp_exec *x, size_t q, uint64_t i, float v);

#endif
