/* probe.c — the probe: the backend registry and the executor both backends run.
 *
 * Backends are registered as in ggml (ggml-backend-reg.cpp): cuda under
 * #ifdef MEMPLAN_HAVE_CUDA, host last as the floor.  "auto" takes the first
 * that is available and opens; an explicit "cuda" never falls back.  The
 * executor is mp_replay's visitor: every ALLOC/FREE goes through the counting
 * pool (probe_pool.c), every FWD/BWD hands a node view to the backend's prim,
 * LOSS_GRAD and OPT_STEP call the backend per loss and per parameter; the run
 * loop times the steps and reports progress.  No printing but the per-step
 * progress line (stderr, when asked), no exit.
 */
#include "probe_impl.h"
#include "probe_par.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* sysconf */

/* ---- registry -------------------------------------------------------------------------- */

static const struct mp_probe_backend *const registry[] = {
#ifdef MEMPLAN_HAVE_CUDA
    &mp_probe_backend_cuda,
#endif
    &mp_probe_backend_host, /* the floor: always last */
};
#define N_BACKENDS (sizeof registry / sizeof registry[0])

struct mp_probe {
    const struct mp_probe_backend *be;
    void *ctx;
    struct mp_probe_opts opts;
};

void mp_probe_opts_default(struct mp_probe_opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "auto";
    o->device = 0;
    o->capacity_bytes = 0;
    o->steps = 3;
    o->seed = 1;
}

enum mp_status mp_probe_host_admit(const struct mp_program *prog, const struct mp_train_opts *t,
                                   uint64_t capacity_bytes, bool automatic, struct mp_diag *d)
{
    const char *name = prog->model ? prog->model->name : "the model";
    uint64_t ram = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    struct mp_estimate e;
    struct mp_train_opts ht = *t;
    struct mp_diag ed;
    if (mp_estimate_run(prog, NULL, &ht, 0, &e, &ed) == MP_OK) {
        uint64_t need = e.peak_allocated_bytes;
        mp_estimate_release(&e);
        if ((!capacity_bytes || capacity_bytes > ram / 2) && need > ram / 2) {
            char b1[32], b2[32];
            return mp_fail(d, MP_ERR_DEVICE, "the host backend would need about %s of RAM for %s (this machine "
                                             "has %s); run on a GPU, use 'memplan estimate', or set --capacity",
                           mp_fmt_bytes(need, b1, sizeof b1), name, mp_fmt_bytes(ram, b2, sizeof b2));
        }
    }
    double flops = prog->fwd_flops + prog->bwd_flops;
    if (automatic && flops > 5e11) /* a CPU executor: only models that run in reasonable time */
        return mp_fail(d, MP_ERR_DEVICE, "no usable GPU, and %s is too large for the host backend (%.0f GFLOP per "
                                         "step); run on a machine with a GPU or use 'memplan estimate'",
                       name, flops / 1e9);
    return MP_OK;
}

bool mp_cuda_built(void)
{
#ifdef MEMPLAN_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

bool mp_cuda_device_available(void)
{
#ifdef MEMPLAN_HAVE_CUDA
    return mp_probe_backend_cuda.available && mp_probe_backend_cuda.available();
#else
    return false;
#endif
}

static enum mp_status open_one(const struct mp_probe_backend *be, struct mp_probe **out,
                               const struct mp_probe_opts *o, struct mp_diag *d)
{
    struct mp_probe *pr = calloc(1, sizeof *pr);
    if (!pr)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory opening the %s backend", be->name);
    pr->be = be;
    pr->opts = *o;
    enum mp_status st = be->open(&pr->ctx, o, d);
    if (st != MP_OK) {
        free(pr);
        return st;
    }
    *out = pr;
    return MP_OK;
}

enum mp_status mp_probe_open(struct mp_probe **out, const struct mp_probe_opts *o, struct mp_diag *d)
{
    struct mp_probe_opts def;
    if (!o) {
        mp_probe_opts_default(&def);
        o = &def;
    }
    *out = NULL;
    const char *name = o->backend ? o->backend : "auto";
    if (strcmp(name, "auto") == 0) {
        enum mp_status last = MP_ERR_DEVICE;
        for (size_t i = 0; i < N_BACKENDS; i++) {
            const struct mp_probe_backend *be = registry[i];
            if (be->available && !be->available())
                continue;
            last = open_one(be, out, o, d);
            if (last == MP_OK)
                return MP_OK;
        }
        return last;
    }
    for (size_t i = 0; i < N_BACKENDS; i++) /* named: no fallback; open says why it cannot */
        if (strcmp(registry[i]->name, name) == 0)
            return open_one(registry[i], out, o, d);
    if (strcmp(name, "cuda") == 0)
        return mp_fail(d, MP_ERR_UNSUPPORTED, "the cuda backend is not built in (rebuild with nvcc: make CUDA=yes)");
    return mp_fail(d, MP_ERR_USAGE, "unknown probe backend '%s' (expected auto, cuda or host)", name);
}

const char *mp_probe_backend(const struct mp_probe *p) { return p ? p->be->name : "none"; }

enum mp_status mp_probe_device_info(struct mp_probe *p, struct mp_device_info *out)
{
    memset(out, 0, sizeof *out);
    if (!p || !p->be->device_info)
        return MP_ERR_UNSUPPORTED;
    return p->be->device_info(p->ctx, out);
}

/* ---- the executor ------------------------------------------------------------------------ */

static void exec_free(struct mp_exec *x);

static enum mp_status exec_new(struct mp_exec **out, const struct mp_probe_backend *be, void *bctx,
                               const struct mp_program *p, const struct mp_train_opts *t, uint64_t capacity_bytes,
                               uint64_t seed, struct mp_diag *d)
{
    *out = NULL;
    if (!p || p->n_blocks == 0)
        return mp_fail(d, MP_ERR_USAGE, "probe: the model has no blocks");
    struct mp_exec *x = calloc(1, sizeof *x);
    if (!x)
        return mp_fail(d, MP_ERR_NOMEM, "probe: out of memory");
    x->be = be;
    x->bctx = bctx;
    x->p = p;
    x->t = *t;
    x->seed = seed;
    x->d = d;
    struct mp_pool_ops ops = {be->alloc, be->free, bctx};
    enum mp_status st = mp_pool_init(&x->pool, p, &ops, capacity_bytes, d);
    if (st == MP_OK)
        st = mp_exec_layout(p, &x->lay, d);
    if (st == MP_OK && t->par && t->par->strategy != MP_PAR_NONE)
        st = mp_par_exec_new(x, d); /* rank r of a data-parallel run */
    if (st == MP_OK && be->exec_new)
        st = be->exec_new(x);
    if (st != MP_OK) {
        exec_free(x);
        return st;
    }
    *out = x;
    return MP_OK;
}

/* Frees every storage: the workspace is taken back from the backend first, queued work
 * is waited for (after an out-of-memory the device stays usable). */
static void release_storage(struct mp_exec *x)
{
    if (x->ws_set && x->be->workspace) {
        (void)x->be->workspace(x, NULL, 0);
        x->ws_set = false;
    }
    if (x->be->sync)
        x->be->sync(x);
    mp_pool_free_all(&x->pool);
    if (x->be->sync)
        x->be->sync(x);
}

static void exec_free(struct mp_exec *x)
{
    if (!x)
        return;
    release_storage(x);
    if (x->be->exec_free)
        x->be->exec_free(x);
    mp_pool_release(&x->pool);
    mp_par_exec_free(x->par);
    free(x->lay);
    free(x);
}

/* Parameters and the input batch get their deterministic values (staged on the host
 * when the backend's storages are not host memory); gradients and optimizer state
 * start at zero. */
static enum mp_status fill_value(struct mp_exec *x, const struct mp_event *ev, void *buf)
{
    if (ev->store == MP_ST_INPUT) {
        mp_exec_input_fill(x->p, ev->id, x->seed, buf);
        return MP_OK;
    }
    return mp_exec_param_fill(x->p, (size_t)ev->id, x->seed, buf, x->d);
}

static enum mp_status init_storage(struct mp_exec *x, const struct mp_event *ev, void *ptr)
{
    const struct mp_probe_backend *be = x->be;
    if (!ptr)
        return MP_OK;
    switch (ev->store) {
    case MP_ST_PARAM:
    case MP_ST_INPUT: {
        if (!be->upload)
            return fill_value(x, ev, ptr);
        void *h = malloc(ev->bytes ? (size_t)ev->bytes : 1);
        if (!h)
            return mp_fail(x->d, MP_ERR_NOMEM, "probe: out of host memory staging %llu bytes",
                           (unsigned long long)ev->bytes);
        enum mp_status st = fill_value(x, ev, h);
        if (st == MP_OK)
            st = be->upload(x, ptr, h, ev->bytes);
        free(h);
        return st;
    }
    case MP_ST_GRAD:
    case MP_ST_PGRAD:
    case MP_ST_OPT_STATE: return be->zero(x, ptr, ev->bytes); /* zeros: gradients accumulate */
    case MP_ST_ACT:
    case MP_ST_TMP:
    case MP_ST_OPT_TMP: return be->poison ? be->poison(x, ptr, ev->bytes) : MP_OK;
    case MP_ST_WORKSPACE:
        if (!be->workspace)
            return MP_OK;
        x->ws_set = true;
        return be->workspace(x, ptr, ev->bytes);
    case MP_ST_COMM: return MP_OK;
    }
    return MP_OK;
}

static void view_open(struct mp_node_view *c, struct mp_exec *x, int k)
{
    memset(c, 0, sizeof *c);
    c->x = x;
    c->p = x->p;
    c->k = k;
    c->n = &x->p->nodes[k];
    c->lay = &x->lay[k];
    const struct mp_node *n = c->n;
    for (int j = 0; j < 3; j++) {
        c->in[j] = mp_view_tensor(x, MP_ST_ACT, n->in[j]);
        c->gin[j] = mp_view_grad(x, n->in[j]);
    }
    c->out = mp_view_tensor(x, MP_ST_ACT, n->out);
    c->gout = mp_view_grad(x, n->out);
    for (int j = 0; j < n->n_extra; j++)
        c->ex[j] = mp_view_tensor(x, MP_ST_ACT, n->extra[j]);
    c->w = x->par ? mp_par_exec_param(x, n->param[0]) : mp_view_param(x, MP_ST_PARAM, n->param[0]);
    c->b = x->par ? mp_par_exec_param(x, n->param[1]) : mp_view_param(x, MP_ST_PARAM, n->param[1]);
    c->gw = mp_view_param(x, MP_ST_PGRAD, n->param[0]);
    c->gb = mp_view_param(x, MP_ST_PGRAD, n->param[1]);
    c->tmp.p = mp_pool_get(&x->pool, MP_ST_TMP, k);
    c->tmp.dt = MP_DT_U8;
}

/* A copy of gradient view g in a storage of the backend's own (outside the pool), in *copy. */
static enum mp_status grad_copy(struct mp_exec *x, struct mp_view g, uint64_t bytes, void **copy)
{
    const struct mp_probe_backend *be = x->be;
    if (be->upload && !be->download)
        return mp_fail(x->d, MP_ERR_UNSUPPORTED, "probe: the %s backend cannot copy a gradient", be->name);
    enum mp_status st = be->alloc(x->bctx, bytes, copy, x->d);
    if (st != MP_OK)
        return st;
    if (!be->upload) {
        memcpy(*copy, g.p, (size_t)bytes);
        return MP_OK;
    }
    void *h = malloc(bytes ? (size_t)bytes : 1);
    if (!h)
        st = mp_fail(x->d, MP_ERR_NOMEM, "probe: out of host memory staging %llu bytes", (unsigned long long)bytes);
    if (st == MP_OK)
        st = be->download(x, h, g.p, bytes);
    if (st == MP_OK)
        st = be->upload(x, *copy, h, bytes);
    free(h);
    if (st != MP_OK) {
        be->free(x->bctx, *copy);
        *copy = NULL;
    }
    return st;
}

static enum mp_status node_run(struct mp_exec *x, int k, bool fwd, int step)
{
    const struct mp_node *n = &x->p->nodes[k];
    if (n->prim == MP_P_VIEW) /* out is in[0]: nothing moves either way */
        return MP_OK;
    const struct mp_prim_fns *f = (unsigned)n->prim < MP_P_COUNT ? &x->be->prims[n->prim] : NULL;
    enum mp_status (*fn)(struct mp_node_view *) = f ? (fwd ? f->fwd : f->bwd) : NULL;
    if (!fn)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: %s: %s is not run by the %s backend", n->name,
                       mp_prim_str(n->prim), x->be->name);
    struct mp_node_view c;
    view_open(&c, x, k);
    c.step = step;
    c.fwd = fwd;
    if ((n->param[0] >= 0 && !c.w.p) || (n->param[1] >= 0 && !c.b.p))
        return mp_fail(x->d, MP_ERR_UNSUPPORTED, "probe: %s: its parameters are not gathered here (a parameter "
                       "shared across sharding groups)", n->name);
    /* x + f(x) with f this one node: the add handed its gradient to both, so x's gradient is in
     * the storage of f's output's.  Autograd makes f's gradient for x a new tensor and adds it in
     * place afterwards (the replay counts that tensor in the node's TMP); the kernels add into
     * gin while they read gout, so here they read a copy of gout. */
    void *copy = NULL;
    bool shared = false;
    for (int j = 0; j < 3 && !fwd && n->prim != MP_P_ADD; j++)
        shared |= n->in[j] >= 0 && n->in[j] != n->out && c.gin[j].p && c.gin[j].p == c.gout.p;
    if (shared) {
        enum mp_status st = grad_copy(x, c.gout, x->p->tensors[n->out].bytes, &copy);
        if (st != MP_OK)
            return st;
        c.gout.p = copy;
    }
    enum mp_status st = fn(&c);
    if (x->be->node_end)
        x->be->node_end(&c);
    if (copy) /* stream-ordered on the cuda backend */
        x->be->free(x->bctx, copy);
    return st;
}

/* The last block's output: the CE scalar (explicit loss), or the implicit loss. */
static enum mp_status loss_grad(struct mp_exec *x)
{
    const struct mp_program *p = x->p;
    int t = p->blocks[p->n_blocks - 1].output;
    struct mp_view y = mp_view_tensor(x, MP_ST_ACT, t), g = mp_view_grad(x, t);
    if (!y.p)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: the model output %s is not allocated at the loss",
                       p->tensors[t].name);
    int ln = mp_exec_loss_node(p);
    return x->be->loss_grad(x, y, g, ln >= 0 && p->nodes[ln].out == t);
}

/* Autocast: the node's half weight gradient (left in its TMP) into the weight's fp32 gradient. */
static enum mp_status wgrad_cast(struct mp_exec *x, const struct mp_event *ev)
{
    const struct mp_node *n = &x->p->nodes[ev->node];
    const struct mp_tmp_part *h = mp_node_tmp(n, true, MP_TR_WGRAD_HALF);
    char *tmp = mp_pool_get(&x->pool, MP_ST_TMP, ev->node);
    struct mp_view g = mp_view_param(x, MP_ST_PGRAD, ev->id);
    if (!h || !tmp || !g.p)
        return mp_fail(x->d, MP_ERR_INTERNAL, "probe: %s: no half weight gradient to cast", n->name);
    struct mp_view src = {tmp + h->offset, x->p->compute_dtype, g.n};
    return x->be->cast_add(x, g, src);
}

static enum mp_status opt_step(struct mp_exec *x)
{
    const struct mp_program *p = x->p;
    if (x->par) /* rank r's shards or partition */
        return mp_par_exec_opt(x);
    if (x->grads_out) { /* host memory only (the host test hook) */
        uint64_t off = 0;
        for (size_t q = 0; q < p->n_params; q++) {
            struct mp_view G = mp_view_param(x, MP_ST_PGRAD, (int)q);
            G.n = p->params[q].elems;
            for (uint64_t i = 0; i < G.n; i++)
                x->grads_out[off + i] = G.p ? mp_view_ld(G, i) : 0.0f;
            off += G.n;
        }
    }
    if (!x->update)
        return MP_OK;
    struct mp_param_view v;
    memset(&v, 0, sizeof v);
    v.t = ++x->opt_steps;
    v.tmp0 = mp_pool_get(&x->pool, MP_ST_OPT_TMP, 0);
    for (size_t q = 0; q < p->n_params; q++) {
        v.q = q;
        v.param = &p->params[q];
        v.P = mp_view_param(x, MP_ST_PARAM, (int)q);
        v.G = mp_view_param(x, MP_ST_PGRAD, (int)q);
        if (!v.P.p || !v.G.p)
            continue; /* no gradient this step (or empty) */
        v.state = mp_pool_get(&x->pool, MP_ST_OPT_STATE, (int)q);
        v.tmp = mp_pool_get(&x->pool, MP_ST_OPT_TMP, (int)q);
        enum mp_status st = x->be->opt_param(x, &v);
        if (st != MP_OK)
            return st;
    }
    return MP_OK;
}

static enum mp_status exec_event(void *ctx, const struct mp_event *ev)
{
    struct mp_exec *x = ctx;
    x->grad_of = ev->grad_of;
    switch (ev->kind) {
    case MP_EV_ALLOC: {
        void *ptr;
        bool fresh;
        enum mp_status st = mp_pool_alloc(&x->pool, ev, &ptr, &fresh, x->d);
        bool done = false;
        if (st == MP_OK && fresh && x->par)
            st = mp_par_exec_alloc(x, ev, ptr, &done);
        if (st == MP_OK && fresh && !done)
            st = init_storage(x, ev, ptr);
        return st;
    }
    case MP_EV_FREE: {
        enum mp_status st = x->par ? mp_par_exec_free_event(x, ev) : MP_OK;
        return st == MP_OK ? mp_pool_free(&x->pool, ev, x->d) : st;
    }
    case MP_EV_FWD: return node_run(x, ev->id, true, ev->step);
    case MP_EV_BWD:
        if (ev->grad_out_of_place) /* counted by the replay; no layer memplan lowers makes one */
            return mp_fail(x->d, MP_ERR_UNSUPPORTED, "probe: %s: a gradient added out of place to one "
                           "another tensor shares", x->p->nodes[ev->id].name);
        return node_run(x, ev->id, false, ev->step);
    case MP_EV_LOSS_GRAD: return loss_grad(x);
    case MP_EV_WGRAD_CAST: return wgrad_cast(x, ev);
    case MP_EV_OPT_STEP: return opt_step(x);
    case MP_EV_OP_BEGIN:
    case MP_EV_OP_END: return MP_OK;
    }
    return MP_OK;
}

/* One training step (one replay); *ms its time.  On failure every storage is freed. */
static enum mp_status exec_step(struct mp_exec *x, const struct mp_schedule *s, bool update, bool profile,
                                float *grads, double *loss, double *ms, struct mp_diag *d)
{
    const struct mp_probe_backend *be = x->be;
    x->update = update;
    x->grads_out = grads;
    x->loss = NAN;
    x->d = d;
    double t0 = mp_now_ms(), el = 0;
    mp_pool_step_begin(&x->pool);
    enum mp_status st = be->step_begin ? be->step_begin(x, profile) : MP_OK;
    if (st == MP_OK)
        st = mp_replay(x->p, s, &x->t, exec_event, x, d);
    if (st == MP_OK)
        st = mp_pool_step_end(&x->pool, d);
    if (st == MP_OK && be->step_end)
        st = be->step_end(x, &el);
    else if (st == MP_OK)
        el = mp_now_ms() - t0;
    if (st != MP_OK) {
        release_storage(x); /* OOM or error: nothing stays allocated */
        x->opt_steps = 0;
        return st;
    }
    if (update)
        x->rng_step++;
    if (loss)
        *loss = x->loss;
    if (ms)
        *ms = el;
    return MP_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* 1 warm-up + o->steps measured steps (+ the backend's profiling step); the result. */
static enum mp_status exec_run(const struct mp_probe_backend *be, void *bctx, const struct mp_probe_opts *o,
                               const struct mp_program *p, const struct mp_schedule *s, const struct mp_train_opts *t,
                               struct mp_probe_result *r, struct mp_diag *d)
{
    struct mp_exec *x;
    enum mp_status st = exec_new(&x, be, bctx, p, t, o->capacity_bytes, o->seed, d);
    if (st != MP_OK)
        return st;
    x->pool.trace_on = o->trace;
    if (be->run_begin)
        st = be->run_begin(x, r);
    double ms[64];
    unsigned steps = o->steps, last = steps + (be->profile_step ? 1 : 0);
    for (unsigned k = 0; k <= last && st == MP_OK; k++) {
        bool profile = k > steps;
        if (!profile)
            mp_progress("probe: %s step %u of %u on the %s backend", k ? "measured" : "warm-up", k ? k : 1,
                        k ? steps : 1, be->name);
        double loss, el;
        st = exec_step(x, s, true, profile, NULL, &loss, &el, d);
        if (o->progress && st == MP_OK && !profile) {
            fprintf(stderr, "memplan: %s step %u/%u%s: %.0f ms, loss %.4f\n", be->name, k + 1, steps + 1,
                    k == 0 ? " (warm-up)" : "", el, loss);
            fflush(stderr);
        }
        if (st == MP_OK && k > 0 && !profile) { /* step 0 is the warm-up */
            r->losses[k - 1] = (float)loss;
            ms[k - 1] = el;
        }
    }
    r->measured_peak_bytes = x->pool.peak;
    mp_pool_take_trace(&x->pool, r);
    if (be->run_end)
        st = be->run_end(x, r, st);
    if (st == MP_ERR_OOM) {
        r->fits = false;
        r->oom_request_bytes = x->pool.oom_bytes;
        r->oom_capacity = x->pool.oom_capacity;
        snprintf(r->oom_event, sizeof r->oom_event, "%s", x->pool.oom_event);
    } else if (st == MP_OK) {
        r->fits = true;
        r->steps = steps;
        qsort(ms, steps, sizeof ms[0], cmp_double);
        r->step_ms = steps % 2 ? ms[steps / 2] : 0.5 * (ms[steps / 2 - 1] + ms[steps / 2]);
        r->samples_per_s = r->step_ms > 0 ? (double)p->opts.batch * 1000.0 / r->step_ms : 0.0;
    }
    exec_free(x);
    return st;
}

/* ---- the host executor (test hooks) -------------------------------------------------------- */

enum mp_status mp_host_exec_new(struct mp_exec **out, const struct mp_program *p, const struct mp_train_opts *t,
                                uint64_t capacity_bytes, uint64_t seed, struct mp_diag *d)
{
    return exec_new(out, &mp_probe_backend_host, NULL, p, t, capacity_bytes, seed, d);
}

void mp_host_exec_free(struct mp_exec *x) { exec_free(x); }

enum mp_status mp_host_exec_step(struct mp_exec *x, const struct mp_schedule *s, bool update, float *grads,
                                 double *loss, struct mp_diag *d)
{
    return exec_step(x, s, update, false, grads, loss, NULL, d);
}

const struct mp_pool *mp_host_exec_pool(const struct mp_exec *x) { return &x->pool; }

float mp_host_exec_param_get(const struct mp_exec *x, size_t q, uint64_t i)
{
    struct mp_view v = mp_view_param(x, MP_ST_PARAM, (int)q);
    return v.p ? mp_view_ld(v, i) : NAN;
}

void mp_host_exec_param_set(struct mp_exec *x, size_t q, uint64_t i, float f)
{
    struct mp_view v = mp_view_param(x, MP_ST_PARAM, (int)q);
    if (v.p)
        mp_view_st(v, i, f);
}

enum mp_status mp_probe_run(struct mp_probe *p, const struct mp_program *prog, const struct mp_schedule *sched,
                            const struct mp_train_opts *t, struct mp_probe_result *r, struct mp_diag *d)
{
    memset(r, 0, sizeof *r);
    if (!p || !prog || !t)
        return mp_fail(d, MP_ERR_USAGE, "probe: nothing to run");
    if (p->opts.steps == 0)
        return mp_fail(d, MP_ERR_USAGE, "probe: at least one measured step is needed");
    if (p->opts.steps > sizeof r->losses / sizeof r->losses[0])
        return mp_fail(d, MP_ERR_USAGE, "probe: at most %zu measured steps",
                       sizeof r->losses / sizeof r->losses[0]);
    if (prog->n_blocks == 0)
        return mp_fail(d, MP_ERR_USAGE, "probe: the model has no blocks");
    if (prog->probe_unsupported)
        return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: %s: the probe does not execute %s yet; use 'memplan "
                       "estimate' (its figures are the plan's)", prog->model ? prog->model->name : "the model",
                       prog->probe_unsupported);
    if (!mp_optimizer_probe(t->optimizer))
        return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: --optimizer %s is estimated only (the probe runs %s)",
                       mp_optimizer_str(t->optimizer), mp_optimizer_probe_names());
    const struct mp_quant *qz = mp_program_base_quant(prog);
    if (qz && qz->kind != MP_Q_BNB_NF4)
        return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: %s base weights are estimated only; the probe executes "
                       "bitsandbytes NF4 (QLoRA)", mp_quant_kind_str(qz->kind));
    for (size_t k = 0; k < prog->n_nodes; k++)
        if (prog->nodes[k].layer->type == MP_LT_PATCH_EMBEDDING)
            return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: %s: patch embeddings (ViT) are estimated only; the "
                           "backends do not execute them yet", prog->nodes[k].name);
    snprintf(r->backend, sizeof r->backend, "%s", p->be->name);
    if (p->be->device_info)
        (void)p->be->device_info(p->ctx, &r->dev);
    enum mp_status st = exec_run(p->be, p->ctx, &p->opts, prog, sched, t, r, d);
    if (st == MP_ERR_OOM) { /* a result: the backend has freed everything */
        r->fits = false;
        return MP_OK;
    }
    return st;
}

void mp_probe_close(struct mp_probe *p)
{
    if (!p)
        return;
    if (p->be->close)
        p->be->close(p->ctx);
    free(p);
}

void mp_probe_result_release(struct mp_probe_result *r)
{
    if (!r)
        return;
    free(r->trace);
    r->trace = NULL;
    r->n_trace = 0;
}
