/* probe.c — the probe's backend registry and the pieces both executors share.
 *
 * Backends are registered as in ggml (ggml-backend-reg.cpp): cuda under
 * #ifdef MEMPLAN_HAVE_CUDA, host last as the floor.  "auto" takes the first
 * that is available and opens; an explicit "cuda" never falls back.  The
 * counting pool keeps one storage per (store, id) and counts 512-byte-rounded
 * bytes exactly as the estimator's visitor does, so the measured peak of a
 * replay equals the estimate.  No printing, no exit.
 */
#include "probe_impl.h"

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
    const struct mp_quant *qz = mp_program_base_quant(prog);
    if (qz && qz->kind != MP_Q_BNB_NF4)
        return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: %s base weights are estimated only; the probe executes "
                       "bitsandbytes NF4 (QLoRA)", mp_quant_kind_str(qz->kind));
    for (size_t k = 0; k < prog->n_nodes; k++)
        if (prog->nodes[k].layer->type == MP_LT_PATCH_EMBEDDING)
            return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: %s: patch embeddings (ViT) are estimated only; the "
                           "backends do not execute them yet", prog->nodes[k].name);
    if (prog->opts.ft.mode != MP_FT_FULL && strcmp(p->be->name, "host") != 0)
        return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: --finetune %s runs on the host backend only so far "
                       "(--backend host)", mp_ft_mode_str(prog->opts.ft.mode));
    snprintf(r->backend, sizeof r->backend, "%s", p->be->name);
    if (p->be->device_info)
        (void)p->be->device_info(p->ctx, &r->dev);
    enum mp_status st = p->be->run(p->ctx, &p->opts, prog, sched, t, r, d);
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

/* ---- the counting pool ----------------------------------------------------------------- */

bool mp_store_persistent(enum mp_store s)
{
    return s == MP_ST_PARAM || s == MP_ST_OPT_STATE || s == MP_ST_WORKSPACE || s == MP_ST_INPUT;
}

/* One slot per (store, id), laid out as the estimator's key_of: parameters,
 * their optimizer state, their gradients and their step temporaries (Adam: one
 * per parameter; Adafactor: id 0), the workspace, then tensors and node temporaries. */
#define KEY_WORKSPACE(np) (4 * (np) + 1)
#define KEY_TENSORS(np) (4 * (np) + 2)

static bool key_of(const struct mp_program *p, enum mp_store s, int id, size_t *key)
{
    size_t nt = p->n_tensors, np = p->n_params, nn = p->n_nodes, base = KEY_TENSORS(np);
    if (id < 0)
        return false;
    size_t i = (size_t)id;
    switch (s) {
    case MP_ST_PARAM: *key = i; return i < np;
    case MP_ST_OPT_STATE: *key = np + i; return i < np;
    case MP_ST_PGRAD: *key = 2 * np + i; return i < np;
    case MP_ST_OPT_TMP: *key = 3 * np + i; return i < np || i == 0;
    case MP_ST_WORKSPACE: *key = KEY_WORKSPACE(np); return true;
    case MP_ST_INPUT:
    case MP_ST_ACT: *key = base + i; return i < nt;
    case MP_ST_GRAD: *key = base + nt + i; return i < nt;
    case MP_ST_TMP: *key = base + 2 * nt + i; return i < nn;
    case MP_ST_COMM: return false; /* data-parallel buffers: not probed yet */
    }
    return false;
}

static const char *store_str(enum mp_store s)
{
    switch (s) {
    case MP_ST_PARAM: return "param";
    case MP_ST_OPT_STATE: return "optimizer state";
    case MP_ST_WORKSPACE: return "cublas workspace";
    case MP_ST_INPUT: return "input";
    case MP_ST_ACT: return "activation";
    case MP_ST_GRAD: return "grad";
    case MP_ST_PGRAD: return "param grad";
    case MP_ST_TMP: return "temporary";
    case MP_ST_OPT_TMP: return "optimizer temporary";
    case MP_ST_COMM: return "communication buffer";
    }
    return "?";
}

void mp_event_name(const struct mp_program *p, const struct mp_event *ev, char *buf, size_t len)
{
    const char *ph = mp_phase_str(ev->phase);
    if (ev->node >= 0 && (size_t)ev->node < p->n_nodes) {
        snprintf(buf, len, "%s:%s", ph, p->nodes[ev->node].name);
        return;
    }
    const char *what = "";
    switch (ev->store) {
    case MP_ST_PARAM:
    case MP_ST_OPT_STATE:
    case MP_ST_PGRAD:
        if (ev->id >= 0 && (size_t)ev->id < p->n_params)
            what = p->params[ev->id].name;
        break;
    case MP_ST_INPUT:
    case MP_ST_ACT:
    case MP_ST_GRAD:
        if (ev->id >= 0 && (size_t)ev->id < p->n_tensors)
            what = p->tensors[ev->id].name;
        break;
    default: break;
    }
    snprintf(buf, len, "%s:%s%s%s", ph, store_str(ev->store), *what ? " " : "", what);
}

enum mp_status mp_pool_init(struct mp_pool *pl, const struct mp_program *p, const struct mp_pool_ops *ops,
                            uint64_t capacity, struct mp_diag *d)
{
    memset(pl, 0, sizeof *pl);
    pl->p = p;
    pl->ops = *ops;
    pl->capacity = capacity;
    pl->n_keys = KEY_TENSORS(p->n_params) + 2 * p->n_tensors + p->n_nodes;
    pl->ptr = calloc(pl->n_keys, sizeof *pl->ptr);
    pl->bytes = calloc(pl->n_keys, sizeof *pl->bytes);
    pl->present = calloc(pl->n_keys, 1);
    if (!pl->ptr || !pl->bytes || !pl->present) {
        mp_pool_release(pl);
        return mp_fail(d, MP_ERR_NOMEM, "out of memory for the probe's storage table");
    }
    return MP_OK;
}

void mp_pool_free_all(struct mp_pool *pl)
{
    if (!pl->present)
        return;
    for (size_t k = 0; k < pl->n_keys; k++) {
        if (pl->present[k] && pl->ptr[k])
            pl->ops.free(pl->ops.ctx, pl->ptr[k]);
        pl->present[k] = 0;
        pl->ptr[k] = NULL;
        pl->bytes[k] = 0;
    }
    pl->cur = 0;
    pl->n_live = 0;
}

void mp_pool_release(struct mp_pool *pl)
{
    if (!pl)
        return;
    free(pl->trace);
    pl->trace = NULL;
    pl->n_trace = pl->cap_trace = 0;
    mp_pool_free_all(pl);
    free(pl->ptr);
    free(pl->bytes);
    free(pl->present);
    pl->ptr = NULL;
    pl->bytes = NULL;
    pl->present = NULL;
}

/* Appends cur to the trace; a failed allocation only stops the trace (it is a picture). */
static void trace_cur(struct mp_pool *pl)
{
    if (!pl->trace_on)
        return;
    if (pl->n_trace == pl->cap_trace) {
        size_t nc = pl->cap_trace ? 2 * pl->cap_trace : 1024;
        uint64_t *nt = realloc(pl->trace, nc * sizeof *nt);
        if (!nt) {
            pl->trace_on = false;
            return;
        }
        pl->trace = nt;
        pl->cap_trace = nc;
    }
    pl->trace[pl->n_trace++] = pl->cur;
}

enum mp_status mp_pool_alloc(struct mp_pool *pl, const struct mp_event *ev, void **ptr, bool *fresh,
                             struct mp_diag *d)
{
    size_t k;
    *fresh = false;
    *ptr = NULL;
    if (!key_of(pl->p, ev->store, ev->id, &k))
        return mp_fail(d, MP_ERR_INTERNAL, "probe: allocation of %s %d out of range", store_str(ev->store), ev->id);
    uint64_t r = mp_round512(ev->bytes);
    if (pl->present[k]) {
        if (!mp_store_persistent(ev->store) || pl->bytes[k] != ev->bytes) {
            char nm[96];
            mp_event_name(pl->p, ev, nm, sizeof nm);
            return mp_fail(d, MP_ERR_INTERNAL, "probe: %s allocated twice", nm);
        }
        *ptr = pl->ptr[k];
    } else {
        if (pl->capacity && (r > pl->capacity || pl->cur > pl->capacity - r)) {
            pl->oom_bytes = ev->bytes;
            pl->oom_capacity = true;
            mp_event_name(pl->p, ev, pl->oom_event, sizeof pl->oom_event);
            return MP_ERR_OOM;
        }
        if (ev->bytes) {
            enum mp_status st = pl->ops.alloc(pl->ops.ctx, ev->bytes, ptr, d);
            if (st == MP_ERR_OOM) {
                pl->oom_bytes = ev->bytes;
                pl->oom_capacity = false;
                mp_event_name(pl->p, ev, pl->oom_event, sizeof pl->oom_event);
            }
            if (st != MP_OK)
                return st;
        }
        pl->present[k] = 1;
        pl->ptr[k] = *ptr;
        pl->bytes[k] = ev->bytes;
        pl->n_live++;
        *fresh = true;
    }
    pl->cur += r;
    if (pl->cur > pl->peak)
        pl->peak = pl->cur;
    trace_cur(pl);
    return MP_OK;
}

enum mp_status mp_pool_free(struct mp_pool *pl, const struct mp_event *ev, struct mp_diag *d)
{
    size_t k;
    if (!key_of(pl->p, ev->store, ev->id, &k) || !pl->present[k]) {
        char nm[96];
        mp_event_name(pl->p, ev, nm, sizeof nm);
        return mp_fail(d, MP_ERR_INTERNAL, "probe: %s freed but not allocated", nm);
    }
    if (pl->ptr[k])
        pl->ops.free(pl->ops.ctx, pl->ptr[k]);
    pl->cur -= mp_round512(pl->bytes[k]);
    pl->present[k] = 0;
    pl->ptr[k] = NULL;
    pl->bytes[k] = 0;
    pl->n_live--;
    trace_cur(pl);
    return MP_OK;
}

void *mp_pool_get(const struct mp_pool *pl, enum mp_store s, int id)
{
    size_t k;
    if (!key_of(pl->p, s, id, &k) || !pl->present[k])
        return NULL;
    return pl->ptr[k];
}

bool mp_pool_has(const struct mp_pool *pl, enum mp_store s, int id)
{
    size_t k;
    return key_of(pl->p, s, id, &k) && pl->present[k];
}

void mp_pool_step_begin(struct mp_pool *pl)
{
    pl->cur = 0;
    pl->n_trace = 0;
}

void mp_pool_take_trace(struct mp_pool *pl, struct mp_probe_result *r)
{
    if (!pl->trace_on)
        return;
    free(r->trace);
    r->trace = pl->trace;
    r->n_trace = pl->n_trace;
    pl->trace = NULL;
    pl->n_trace = pl->cap_trace = 0;
}

void mp_probe_result_release(struct mp_probe_result *r)
{
    if (!r)
        return;
    free(r->trace);
    r->trace = NULL;
    r->n_trace = 0;
}

enum mp_status mp_pool_step_end(struct mp_pool *pl, struct mp_diag *d)
{
    const struct mp_program *p = pl->p;
    size_t np = p->n_params, base = KEY_TENSORS(np);
    uint64_t persistent = 0;
    for (size_t k = 0; k < pl->n_keys; k++) {
        if (!pl->present[k])
            continue;
        bool keep = k < 2 * np || k == KEY_WORKSPACE(np) ||
                    (k >= base && k < base + p->n_tensors && mp_program_resident(p, (int)(k - base)));
        if (!keep)
            return mp_fail(d, MP_ERR_INTERNAL, "probe: storage %zu is still allocated after the step", k);
        persistent += mp_round512(pl->bytes[k]);
    }
    if (persistent != pl->cur)
        return mp_fail(d, MP_ERR_INTERNAL, "probe: %llu bytes counted after the step, %llu allocated",
                       (unsigned long long)pl->cur, (unsigned long long)persistent);
    return MP_OK;
}

/* ---- layout ----------------------------------------------------------------------------- */

static uint64_t width(const struct mp_program *p, int t)
{
    const struct mp_tensor *x = &p->tensors[t];
    return x->rank ? x->shape[x->rank - 1] : x->elems;
}

enum mp_status mp_exec_layout(const struct mp_program *p, struct mp_node_layout **out, struct mp_diag *d)
{
    struct mp_node_layout *L = calloc(p->n_nodes ? p->n_nodes : 1, sizeof *L);
    if (!L)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory for the probe's layout");
    for (size_t k = 0; k < p->n_nodes; k++) {
        const struct mp_node *n = &p->nodes[k];
        for (int j = 0; j < 3; j++)
            if (n->in[j] >= 0)
                L[k].in_w[j] = width(p, n->in[j]);
        if (n->prim == MP_P_ATTN) {
            uint64_t kv = n->kv_heads ? n->kv_heads : n->heads, qd = n->heads * n->head_dim, kd = kv * n->head_dim;
            L[k].in_off[0] = 0;
            L[k].in_off[1] = L[k].in_w[1] == kd ? 0 : qd;
            L[k].in_off[2] = L[k].in_w[2] == kd ? 0 : qd + kd;
            if (L[k].in_w[0] < qd || L[k].in_w[1] < L[k].in_off[1] + kd || L[k].in_w[2] < L[k].in_off[2] + kd) {
                free(L);
                return mp_fail(d, MP_ERR_INTERNAL, "probe: %s: q/k/v widths do not match the heads", n->name);
            }
        }
    }
    /* a rope on a fused view: the k rope reads at column a*d of the fused storage */
    for (size_t k = 0; k < p->n_nodes; k++) {
        const struct mp_node *n = &p->nodes[k];
        if (n->prim != MP_P_ROPE || L[k].in_w[0] == n->heads * n->head_dim)
            continue;
        for (size_t a = k + 1; a < p->n_nodes; a++) {
            const struct mp_node *at = &p->nodes[a];
            if (at->prim == MP_P_ATTN && at->in[1] == n->out && at->in[0] != n->out) {
                L[k].in_off[0] = at->heads * at->head_dim;
                break;
            }
            if (at->prim == MP_P_ATTN && at->in[0] == n->out)
                break;
        }
        if (L[k].in_w[0] < L[k].in_off[0] + n->heads * n->head_dim) {
            free(L);
            return mp_fail(d, MP_ERR_INTERNAL, "probe: %s: input narrower than its heads", n->name);
        }
    }
    *out = L;
    return MP_OK;
}

/* ---- deterministic data ------------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

float mp_exec_param_value(const struct mp_program *p, size_t q, uint64_t i, uint64_t seed)
{
    const struct mp_param *w = &p->params[q];
    float u = 2.0f * mp_hash_unit(mp_hash64(seed ^ (0x51ED2701ull * (q + 1))) + i) - 1.0f; /* [-1, 1) */
    if (w->matmul || w->matrix)
        return u / sqrtf((float)(w->cols ? w->cols : 1));
    if (ends_with(w->name, ".bias"))
        return 0.0f;
    if (ends_with(w->name, ".weight"))
        return 1.0f;
    return 0.1f * u;
}

int mp_exec_loss_node(const struct mp_program *p)
{
    for (size_t k = p->n_nodes; k-- > 0;)
        if (p->nodes[k].prim == MP_P_NLL_LOSS)
            return (int)k;
    return -1;
}

/* Upper bound for the ids of tensor t: the vocabulary of the embedding that reads it. */
static uint64_t id_bound(const struct mp_program *p, int t)
{
    for (size_t k = 0; k < p->n_nodes; k++)
        if (p->nodes[k].prim == MP_P_EMBED && p->nodes[k].in[0] == t && p->nodes[k].k)
            return p->nodes[k].k;
    return 2;
}

static void store_float(enum mp_dtype dt, void *buf, uint64_t i, float v)
{
    switch (dt) {
    case MP_DT_F32: ((float *)buf)[i] = v; break;
    case MP_DT_BF16: ((uint16_t *)buf)[i] = mp_bf16_from_f32(v); break;
    case MP_DT_F16: ((uint16_t *)buf)[i] = mp_f16_from_f32(v); break;
    case MP_DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case MP_DT_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    }
}

void mp_exec_input_fill(const struct mp_program *p, int t, uint64_t seed, void *buf)
{
    const struct mp_tensor *x = &p->tensors[t];
    uint64_t key = mp_hash64(seed ^ (0xA24BAED4963EE407ull * (uint64_t)(t + 1)));
    if (x->dtype == MP_DT_I64) {
        uint64_t bound = 2;
        if (t == p->labels) {
            int ln = mp_exec_loss_node(p);
            bound = ln >= 0 && p->nodes[ln].n ? p->nodes[ln].n : 2;
        } else {
            bound = id_bound(p, t);
        }
        for (uint64_t i = 0; i < x->elems; i++)
            ((int64_t *)buf)[i] = (int64_t)(mp_hash64(key + i) % bound);
        return;
    }
    if (x->dtype == MP_DT_U8) {
        for (uint64_t i = 0; i < x->elems; i++)
            ((uint8_t *)buf)[i] = (uint8_t)(mp_hash64(key + i) >> 56);
        return;
    }
    for (uint64_t i = 0; i < x->elems; i++) { /* Box-Muller */
        float u1 = mp_hash_unit(key + 2 * i) + 1.0f / 33554432.0f, u2 = mp_hash_unit(key + 2 * i + 1);
        store_float(x->dtype, buf, i, sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2));
    }
}
