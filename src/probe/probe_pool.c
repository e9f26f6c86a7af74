/* probe_pool.c — the counting pool, the executors' layout and deterministic data.
 *
 * The pool keeps one storage per (store, id) and counts 512-byte-rounded bytes
 * exactly as the estimator's visitor does, so the measured peak of a replay equals
 * the estimate.  Storage comes from the backend's alloc/free (struct mp_pool_ops).
 * Shared by every backend; knows none of them.  No printing, no exit.
 */
#include "probe_pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "estimate/estimate.h"
#include "model/model.h"

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
/* Data-parallel buffers (MP_ST_COMM, id = slot x MP_COMM_KINDS + kind) after the node
 * temporaries: a slot is a group (at most two per block: --ep's experts unit; plus the root), a DDP bucket (at
 * most one per parameter) or a DeepSpeed partition (0, 1). */
static size_t comm_keys(const struct mp_program *p) { return (p->n_params + 2 * p->n_blocks + 2) * MP_COMM_KINDS; }

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
    case MP_ST_COMM: *key = base + 2 * nt + nn + i; return i < comm_keys(p);
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
    pl->n_keys = KEY_TENSORS(p->n_params) + 2 * p->n_tensors + p->n_nodes + comm_keys(p);
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

/* The persistent stores, and the data-parallel buffers that live across steps (DDP buckets,
 * DeepSpeed partitions: allocated at every step's setup like the parameters). */
static bool event_persistent(enum mp_store s, int id)
{
    if (s == MP_ST_COMM)
        return id % MP_COMM_KINDS == MP_COMM_BUCKET || id % MP_COMM_KINDS == MP_COMM_PARTITION;
    return mp_store_persistent(s);
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
        if (!event_persistent(ev->store, ev->id) || pl->bytes[k] != ev->bytes) {
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

enum mp_status mp_pool_step_end(struct mp_pool *pl, struct mp_diag *d)
{
    const struct mp_program *p = pl->p;
    size_t np = p->n_params, base = KEY_TENSORS(np);
    uint64_t persistent = 0;
    for (size_t k = 0; k < pl->n_keys; k++) {
        if (!pl->present[k])
            continue;
        size_t cbase = base + 2 * p->n_tensors + p->n_nodes;
        bool keep = k < 2 * np || k == KEY_WORKSPACE(np) ||
                    (k >= base && k < base + p->n_tensors && mp_program_resident(p, (int)(k - base))) ||
                    (k >= cbase && event_persistent(MP_ST_COMM, (int)(k - cbase)));
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

/* Parameter q's values: u(i) uniform in [-1, 1) from (seed, q, i), divided by div (a matrix:
 * sqrt(fan-in)), or 0.1 u(i) (div 0, c 1), or the constant c (div 0, c 0 or 1: a bias 0, a
 * norm's weight 1). */
struct param_rule {
    uint64_t key;
    float div;
    int kind; /* 0 u / div, 1 0.1 u, 2 the constant c */
    float c;
};

static struct param_rule param_rule(const struct mp_program *p, size_t q, uint64_t seed)
{
    const struct mp_param *w = &p->params[q];
    struct param_rule r = {mp_hash64(seed ^ (0x51ED2701ull * (q + 1))), 1.0f, 1, 0.0f};
    if (w->matmul || w->matrix) {
        r.kind = 0;
        r.div = sqrtf((float)(w->cols ? w->cols : 1));
    } else if (ends_with(w->name, ".bias")) {
        r.kind = 2;
    } else if (ends_with(w->name, ".weight")) {
        r.kind = 2;
        r.c = 1.0f;
    }
    return r;
}

static float rule_value(const struct param_rule *r, uint64_t i)
{
    if (r->kind == 2)
        return r->c;
    float u = 2.0f * mp_hash_unit(r->key + i) - 1.0f; /* [-1, 1) */
    return r->kind == 0 ? u / r->div : 0.1f * u;
}

float mp_exec_param_value(const struct mp_program *p, size_t q, uint64_t i, uint64_t seed)
{
    struct param_rule r = param_rule(p, q, seed);
    return rule_value(&r, i);
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

/* A parameter's values into buf (dtype dt), a range at a time: the ranges on several threads
 * (a 7B model is billions of values); each element's value depends on (seed, q, i) alone. */
struct fill_job {
    struct param_rule rule;
    enum mp_dtype dt;
    void *buf;
};

static void fill_range(void *ctx, uint64_t i0, uint64_t i1)
{
    const struct fill_job *j = ctx;
    for (uint64_t i = i0; i < i1; i++)
        store_float(j->dt, j->buf, i, rule_value(&j->rule, i));
}

#define FILL_GRAIN ((uint64_t)1 << 20) /* values per range: a thread's start is worth a million */

enum mp_status mp_exec_param_fill(const struct mp_program *p, size_t q, uint64_t seed, void *buf, struct mp_diag *d)
{
    const struct mp_param *w = &p->params[q];
    struct fill_job j = {param_rule(p, q, seed), w->dtype, buf};
    if (w->dtype == MP_DT_U8 && mp_program_base_quant(p)) { /* quantize_4bit of the values */
        float *v = malloc(w->elems ? (size_t)w->elems * sizeof *v : 1);
        if (!v)
            return mp_fail(d, MP_ERR_NOMEM, "probe: out of host memory quantizing %s", w->name);
        j.dt = MP_DT_F32;
        j.buf = v;
        mp_parallel_for(w->elems, FILL_GRAIN, fill_range, &j);
        enum mp_status st = mp_quant_pack(mp_program_base_quant(p), w->rows, w->cols, v, buf);
        free(v);
        if (st != MP_OK)
            return mp_fail(d, st, "probe: %s: the probe executes bitsandbytes NF4 weights only", w->name);
        return MP_OK;
    }
    mp_parallel_for(w->elems, FILL_GRAIN, fill_range, &j);
    return MP_OK;
}
