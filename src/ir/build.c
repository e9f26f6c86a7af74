/* build.c — the builder: the node, tensor and parameter machinery every lowering uses (build.h).
 * The closed sets' names are in names.c. */
#include "build.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mp_build_opts_default(struct mp_build_opts *o)
{
    memset(o, 0, sizeof *o);
    mp_finetune_default(&o->ft);
    o->batch = 1;
    o->precision = MP_PREC_AMP_BF16;
    o->attention = MP_ATTN_SDPA;
    o->loss = MP_LOSS_HF;
    o->label_fraction = 1.0;
}

bool failed(const struct bld *B) { return B->st != MP_OK; }

void fail_model(struct bld *B, enum mp_status st, const char *fmt, ...)
{
    if (failed(B))
        return;
    char what[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *bname = B->block >= 0 ? B->m->blocks[B->block].name : "input";
    B->st = mp_fail(B->d, st, "%s: %s%s%s: %s", B->m->path, bname, B->layer ? "." : "",
                    B->layer ? (B->layer->name[0] ? B->layer->name : mp_layer_type_str(B->layer->type)) : "", what);
}

void overflow(struct bld *B)
{
    fail_model(B, MP_ERR_RANGE, "sizes overflow 64 bits at batch %llu, sequence %llu", (unsigned long long)B->b,
               (unsigned long long)B->s);
}

bool grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t nc = *cap ? *cap * 2 : 64;
    while (nc < need)
        nc *= 2;
    void *n = realloc(*arr, nc * elem);
    if (!n)
        return false;
    memset((char *)n + *cap * elem, 0, (nc - *cap) * elem);
    *arr = n;
    *cap = nc;
    return true;
}

const char *store_name(struct bld *B, const char *prefix, const char *name)
{
    size_t lp = strlen(prefix), ln = strlen(name);
    size_t len = lp + (lp ? 1 : 0) + ln;
    if (len > MP_NAME_MAX - 1)
        len = MP_NAME_MAX - 1;
    struct mp_name_chunk *c = B->p->names;
    if (!c || c->used + len + 1 > sizeof c->text) {
        c = malloc(sizeof *c);
        if (!c) {
            B->st = mp_fail(B->d, MP_ERR_NOMEM, "%s: out of memory building the tensor program", B->m->path);
            return "";
        }
        c->next = B->p->names;
        c->used = 0;
        B->p->names = c;
    }
    char *s = c->text + c->used, *w = s, *end = s + len;
    for (const char *r = prefix; *r && w < end;)
        *w++ = *r++;
    if (lp && w < end)
        *w++ = '.';
    for (const char *r = name; *r && w < end;)
        *w++ = *r++;
    *w = '\0';
    c->used += len + 1;
    return s;
}

/* The current op's name for name: "prefix.name". */
const char *name_of(struct bld *B, const char *name) { return store_name(B, B->prefix, name); }

uint64_t mul(struct bld *B, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (!mp_mul_u64(a, b, &r)) {
        overflow(B);
        return 0;
    }
    return r;
}

uint64_t add(struct bld *B, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (!mp_add_u64(a, b, &r)) {
        overflow(B);
        return 0;
    }
    return r;
}

struct val new_val(struct bld *B, const char *name, enum mp_dtype dt, int rank, const uint64_t *shape,
                   bool needs_grad)
{
    struct val v = {.t = -1, .rank = rank};
    if (failed(B))
        return v;
    struct mp_program *p = B->p;
    if (!grow((void **)&p->tensors, &p->cap_tensors, p->n_tensors + 1, sizeof *p->tensors)) {
        B->st = mp_fail(B->d, MP_ERR_NOMEM, "%s: out of memory building the tensor program", B->m->path);
        return v;
    }
    struct mp_tensor *t = &p->tensors[p->n_tensors];
    memset(t, 0, sizeof *t); /* a rebuilt program reuses its memory */
    t->name = name_of(B, name);
    t->dtype = dt;
    t->rank = rank;
    uint64_t e = 1;
    for (int i = 0; i < rank; i++) {
        t->shape[i] = shape[i];
        v.shape[i] = shape[i];
        e = mul(B, e, shape[i]);
    }
    t->elems = e;
    t->bytes = mul(B, e, mp_dtype_size(dt));
    t->needs_grad = needs_grad;
    t->block = B->block;
    v.t = (int)p->n_tensors++;
    return v;
}

/* A flat tensor of n elements (extras: masks, stats, copies). */
int new_flat(struct bld *B, const char *name, enum mp_dtype dt, uint64_t n)
{
    uint64_t shape[1] = {n};
    return new_val(B, name, dt, 1, shape, false).t;
}

struct mp_node *new_node(struct bld *B, enum mp_prim prim, const char *name)
{
    if (failed(B))
        return NULL;
    struct mp_program *p = B->p;
    if (!grow((void **)&p->nodes, &p->cap_nodes, p->n_nodes + 1, sizeof *p->nodes)) {
        B->st = mp_fail(B->d, MP_ERR_NOMEM, "%s: out of memory building the tensor program", B->m->path);
        return NULL;
    }
    struct mp_node *n = &p->nodes[p->n_nodes++];
    memset(n, 0, sizeof *n);
    n->prim = prim;
    n->name = name_of(B, name);
    n->layer = B->layer;
    n->block = B->block;
    n->in[0] = n->in[1] = n->in[2] = -1;
    n->in_grad_part[0] = n->in_grad_part[1] = n->in_grad_part[2] = -1;
    n->out_parts[0] = n->out_parts[1] = -1;
    n->out = -1;
    n->keep = -1;
    for (int j = 0; j < MP_NODE_LOCALS_MAX; j++)
        n->locals[j] = -1;
    n->score_add[0] = n->score_add[1] = -1;
    n->wcopy = -1;
    n->param[0] = n->param[1] = -1;
    n->grad_in = true;
    return n;
}

/* The Python frame of the module whose forward the last node ends holds t until then (layers.h
 * mp_node.locals). */
void hold_to_last(struct bld *B, int t)
{
    if (failed(B) || t < 0 || !B->p->n_nodes)
        return;
    struct mp_node *n = &B->p->nodes[B->p->n_nodes - 1];
    for (int j = 0; j < 3; j++)
        if (n->in[j] == t)
            return; /* it reads t: held until then anyway */
    for (int j = 0; j < MP_NODE_LOCALS_MAX; j++) {
        if (n->locals[j] == t)
            return;
        if (n->locals[j] < 0) {
            n->locals[j] = t;
            return;
        }
    }
    B->st = mp_fail(B->d, MP_ERR_INTERNAL, "%s: %s: more than %d frame locals end at one node", B->m->path, n->name,
                    MP_NODE_LOCALS_MAX);
}

void save(struct mp_node *n, int t)
{
    if (!n || t < 0)
        return;
    for (int i = 0; i < n->n_saved; i++)
        if (n->saved[i] == t)
            return;
    if (n->n_saved < MP_NODE_SAVED_MAX)
        n->saved[n->n_saved++] = t;
    else
        MP_BUG("node %s saves too many tensors", n->name);
}

/* An extra tensor t of n (created with it, saved for backward), with its role. */
void extra_as(struct mp_node *n, int t, enum mp_xrole role)
{
    if (!n || t < 0)
        return;
    if (n->n_extra >= MP_NODE_EXTRA_MAX)
        MP_BUG("node %s has too many extras", n->name);
    n->extra_role[n->n_extra] = role;
    n->extra[n->n_extra++] = t;
    save(n, t);
}

/* Sets n's forward or backward transient workspace to its parts (role, bytes), laid end to end. */
void tmp_parts(struct bld *B, struct mp_node *n, bool bwd, int count, const enum mp_trole *roles,
               const uint64_t *bytes)
{
    if (!n)
        return;
    if (count > MP_NODE_TMP_MAX)
        MP_BUG("node %s has too many temporaries", n->name);
    struct mp_tmp_part *pt = bwd ? n->bwd_tmp : n->fwd_tmp;
    uint64_t off = 0;
    for (int i = 0; i < count; i++) {
        pt[i] = (struct mp_tmp_part){roles[i], off, bytes[i]};
        off = add(B, off, bytes[i]);
    }
    *(bwd ? &n->n_bwd_tmp : &n->n_fwd_tmp) = count;
    *(bwd ? &n->bwd_tmp_bytes : &n->fwd_tmp_bytes) = off;
}

/* One transient of one role (MP_TR_OTHER: counted only). */
void tmp_one(struct bld *B, struct mp_node *n, bool bwd, enum mp_trole role, uint64_t bytes)
{
    tmp_parts(B, n, bwd, bytes ? 1 : 0, &role, &bytes);
}

int mp_node_extra(const struct mp_node *n, enum mp_xrole r, int nth)
{
    for (int j = 0; j < n->n_extra; j++)
        if (n->extra_role[j] == r && nth-- == 0)
            return n->extra[j];
    return -1;
}

const struct mp_tmp_part *mp_node_tmp(const struct mp_node *n, bool bwd, enum mp_trole r)
{
    const struct mp_tmp_part *pt = bwd ? n->bwd_tmp : n->fwd_tmp;
    int cnt = bwd ? n->n_bwd_tmp : n->n_fwd_tmp;
    for (int i = 0; i < cnt; i++)
        if (pt[i].role == r && pt[i].bytes)
            return &pt[i];
    return NULL;
}

/* peft's task types SEQ_CLS, TOKEN_CLS and QUESTION_ANS keep the task head whole and trainable
 * (modules_to_save "classifier", "score" / "qa_outputs", matched as a name suffix, so DistilBERT's
 * pre_classifier too, and every module inside one: RoBERTa's classifier.dense): a trainable copy
 * beside the frozen original (ModulesToSaveWrapper).  memplan assumes the task type of the head
 * (HF configs; the snippet says so). */
bool saved_module(const struct bld *B)
{
    static const char *const names[] = {"classifier", "score", "qa_outputs"};
    const struct mp_layer *l = B->layer;
    enum mp_ft_mode m = B->p->opts.ft.mode;
    if (B->in_adapter || !l || !B->m->hf_type[0] || (m != MP_FT_LORA && m != MP_FT_QLORA) ||
        (l->type != MP_LT_CLASSIFIER && l->type != MP_LT_LINEAR) || B->block != (int)B->m->n_blocks - 1)
        return false;
    size_t n = strlen(l->name);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t k = strlen(names[i]);
        if ((n >= k && !strcmp(l->name + n - k, names[i])) || (!strncmp(l->name, names[i], k) && l->name[k] == '.'))
            return true;
    }
    return false;
}

int new_param(struct bld *B, const char *name, uint64_t rows, uint64_t cols, bool matmul)
{
    if (failed(B))
        return -1;
    struct mp_program *p = B->p;
    if (!grow((void **)&p->params, &p->cap_params, p->n_params + 1, sizeof *p->params)) {
        B->st = mp_fail(B->d, MP_ERR_NOMEM, "%s: out of memory building the tensor program", B->m->path);
        return -1;
    }
    struct mp_param *q = &p->params[p->n_params];
    memset(q, 0, sizeof *q); /* a rebuilt program reuses its memory */
    q->name = name_of(B, name);
    q->elems = mul(B, rows, cols);
    q->rows = rows;
    q->cols = cols;
    q->matrix = rows > 1 && cols > 1;
    q->matmul = matmul;
    q->block = B->block;
    /* peft autocast_adapter_dtype: fp32 adapters (unless an engine casts them: adapters_cast) */
    q->dtype = B->in_adapter ? mp_finetune_adapter_dtype(&p->opts.ft, p->param_dtype) : p->param_dtype;
    bool saved = saved_module(B);
    q->trainable = B->in_adapter || B->trained || saved;
    q->adapter = B->in_adapter;
    q->raw_bytes = q->bytes = mul(B, q->elems, mp_dtype_size(q->dtype));
    p->total_params = add(B, p->total_params, q->elems);
    int id = (int)p->n_params++;
    if (saved) { /* the frozen original module: held, never used */
        if (!grow((void **)&p->params, &p->cap_params, p->n_params + 1, sizeof *p->params)) {
            B->st = mp_fail(B->d, MP_ERR_NOMEM, "%s: out of memory building the tensor program", B->m->path);
            return -1;
        }
        struct mp_param *o = &p->params[p->n_params];
        char on[96];
        *o = p->params[id];
        o->trainable = false;
        snprintf(on, sizeof on, "%s.original", name);
        o->name = name_of(B, on);
        p->total_params = add(B, p->total_params, o->elems);
        p->n_params++;
    }
    return id;
}

/* Tensor t.  A step that fails makes no tensor (new_val's id -1) and the lowering runs on
 * until its caller looks at B->st, so an id may be -1 once the build has failed: reads and
 * writes through it go to a scratch tensor, never outside the array. */
struct mp_tensor *T(struct bld *B, int t)
{
    if (t >= 0 && (size_t)t < B->p->n_tensors)
        return &B->p->tensors[t];
    if (!failed(B))
        MP_BUG("tensor id %d of %zu", t, B->p->n_tensors);
    memset(&B->scratch, 0, sizeof B->scratch);
    return &B->scratch;
}

enum mp_dtype dt_of(struct bld *B, struct val v) { return T(B, v.t)->dtype; }

bool ng(struct bld *B, struct val v) { return v.t >= 0 && T(B, v.t)->needs_grad; }

uint64_t last_dim(struct val v) { return v.rank ? v.shape[v.rank - 1] : 0; }

uint64_t rows_of(struct val v)
{
    uint64_t r = 1;
    for (int i = 0; i + 1 < v.rank; i++)
        r *= v.shape[i]; /* bounded: the tensor's element count was checked */
    return r;
}

/* Elements of a value's logical shape (a view of part of a storage counts its part). */
uint64_t val_elems(struct bld *B, struct val v)
{
    uint64_t e = 1;
    for (int i = 0; i < v.rank; i++)
        e = mul(B, e, v.shape[i]);
    return e;
}

enum mp_dtype promote(enum mp_dtype a, enum mp_dtype b)
{
    if (a == MP_DT_F32 || b == MP_DT_F32)
        return MP_DT_F32;
    return a;
}

void with_prefix(struct bld *B, const char *base, const char *part, char *save_buf)
{
    char b[sizeof B->prefix];
    snprintf(b, sizeof b, "%s", base);
    strcpy(save_buf, B->prefix);
    snprintf(B->prefix, sizeof B->prefix, "%s%s%s", b, (*b && *part) ? "." : "", part);
}

void restore_prefix(struct bld *B, const char *save_buf) { strcpy(B->prefix, save_buf); }

/* A value of the same shape as v with another dtype. */
struct val like(struct bld *B, const char *name, struct val v, enum mp_dtype dt, bool needs_grad)
{
    return new_val(B, name, dt, v.rank, v.shape, needs_grad);
}

struct val with_last(struct bld *B, const char *name, struct val v, uint64_t last, enum mp_dtype dt,
                     bool needs_grad)
{
    uint64_t shape[MP_TENSOR_RANK_MAX];
    memcpy(shape, v.shape, sizeof shape);
    shape[v.rank - 1] = last;
    return new_val(B, name, dt, v.rank, shape, needs_grad);
}

/* The incoming width must equal what the layer declares. */
bool width_ok(struct bld *B, struct val x, uint64_t dim, const char *field, const char *name)
{
    if (failed(B))
        return false;
    if (last_dim(x) == dim)
        return true;
    fail_model(B, MP_ERR_MODEL, "%s%s%s %llu does not match the incoming width %llu", name, *name ? ": " : "", field,
               (unsigned long long)dim, (unsigned long long)last_dim(x));
    return false;
}

/* A matmul node (linear, conv): saves its input and, under autocast, a half copy
 * of its weight from the forward to its backward (docs/memory-facts.md#autocast).  A weight
 * already in the half dtype (bf16-amp's base) is used as it is: cached_cast's arg.to(bf16)
 * returns the tensor itself (aten/src/ATen/autocast_mode.cpp, torch 2.15), and its gradient is
 * bf16 .grad directly; peft's fp32 adapters under bf16-amp get the copy. */
struct mp_node *matmul_node(struct bld *B, enum mp_prim prim, const char *name, struct val xin, struct val y,
                            int w, int bias)
{
    struct mp_node *n = new_node(B, prim, name);
    if (!n)
        return NULL;
    n->in[0] = xin.t;
    n->out = y.t;
    n->param[0] = w;
    n->param[1] = bias;
    save(n, xin.t);
    if (B->amp && w >= 0 && B->p->params[w].dtype != B->p->compute_dtype) {
        char wn[112];
        snprintf(wn, sizeof wn, "%s.weight_copy", name);
        n->wcopy = new_flat(B, wn, B->p->compute_dtype, B->p->params[w].elems);
        extra_as(n, n->wcopy, MP_XR_WEIGHT_COPY);
        /* backward: the half weight gradient, then its fp32 copy into .grad */
        tmp_one(B, n, true, MP_TR_WGRAD_HALF, mul(B, B->p->params[w].elems, mp_dtype_size(B->p->compute_dtype)));
    }
    return n;
}

uint64_t round_up(uint64_t v, uint64_t m) { return mp_ceil_div(v, m) * m; }

/* Gives v's tensor another dtype (an op whose output dtype promotion the generic lowering does
 * not know). */
void retype(struct bld *B, struct val v, enum mp_dtype dt)
{
    struct mp_tensor *t = T(B, v.t);
    t->dtype = dt;
    t->bytes = mul(B, t->elems, mp_dtype_size(dt));
}

/* A tensor the model makes once per forward and hands to many blocks: held until the loss, or
 * until block release's backward when that block is a checkpoint (replay.c). */
void held_tensor(struct bld *B, int t, int release)
{
    if (failed(B) || t < 0)
        return;
    if (B->p->n_held >= MP_HELD_MAX) {
        fail_model(B, MP_ERR_INTERNAL, "too many model-wide tensors");
        return;
    }
    B->p->held[B->p->n_held].t = t;
    B->p->held[B->p->n_held].leaf = false;
    B->p->held[B->p->n_held].fwd_end = -1;
    B->p->held[B->p->n_held++].release = release;
}

void unsave(struct mp_node *n, int t)
{
    for (int i = 0; i < n->n_saved; i++)
        if (n->saved[i] == t) {
            n->saved[i] = n->saved[--n->n_saved];
            return;
        }
}

static uint64_t floor_pow2(uint64_t n)
{
    uint64_t p = 1;
    while (p <= n / 2)
        p *= 2;
    return p;
}

/* Reduce.cuh's configuration of a sum over the rows of a row-major (m, n) input ("vectorize along
 * output": the reduced dimension is not the fastest-striding one): n / vec outputs across a warp's
 * lanes (vec 4, 2 or 1: what divides n), 512 / vec threads at most, the rows over the block's warps
 * when each thread then sums at least min(16 x warps, 256) values, and over ctas_per_output blocks
 * when it still sums at least 256 and the grid leaves SMs idle.  An input beyond 2^31 - 1 bytes
 * runs as sums over halves of its rows, one after another (TensorIterator with_32bit_indexing). */
uint64_t mp_col_sum_staging(uint64_t m, uint64_t n, uint64_t esize, unsigned sms, unsigned sm_threads,
                            uint64_t *sem)
{
    *sem = 0;
    if (!sms || !sm_threads || !m || !n || !esize)
        return 0;
    uint64_t span;
    while (m > 1 && (!mp_mul_u64(m, n, &span) || !mp_mul_u64(span - 1, esize, &span) ||
                     span > INT32_MAX))
        m = mp_ceil_div(m, 2);
    uint64_t vec = n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1;
    uint64_t maxt = 512 / vec, dim0 = n / vec;
    uint64_t p0 = dim0 < maxt ? floor_pow2(dim0) : maxt, p1 = m < maxt ? floor_pow2(m) : maxt;
    uint64_t bw = mp_min_u64(p0, 32);
    uint64_t bh = mp_min_u64(p1, maxt / bw);
    bw = mp_min_u64(p0, maxt / bh);
    uint64_t grid = mp_ceil_div(dim0, bw);
    if (m < mp_min_u64(bh * 16, 256))
        return 0; /* each warp sums outputs of its own: no block sums another's */
    uint64_t vpt = mp_ceil_div(m, bh);
    uint64_t target = (uint64_t)sms * (sm_threads / (bw * bh));
    if (vpt < 256 || grid > target)
        return 0;
    uint64_t ctas = mp_max_u64(mp_min_u64(mp_ceil_div(target, grid), mp_ceil_div(vpt, 16)), mp_ceil_div(vpt, 256));
    if (ctas <= 1)
        return 0;
    uint64_t bytes;
    if (!mp_mul_u64(4 * n, ctas, &bytes) || !mp_mul_u64(bytes, bw * vec, &bytes))
        return 0; /* (n is a tensor's width and ctas at most 2^27: never) */
    *sem = 4 * grid;
    return bytes;
}

/* The column sums of one node's backward (after apply_requires_grad: what trains is known): a
 * trainable bias of a Linear, or a trainable weight the engine sums from a (rows, n) product,
 * adds the staging buffer and its semaphores, each its own request, to the node's backward
 * transient.  An HF RMSNorm's transient is its backward's peak (lower_norm.c rmsnorm_bwd_tmp);
 * the sum runs at MulBackward0, first, beside the output gradient, the weight's (rows, n) product
 * and normed's gradient, both in the output's dtype (and no input gradient yet): the transient is
 * the larger of the two moments.  Elsewhere the sum runs beside everything the node's backward
 * moment holds. */
void col_sum_staging(struct bld *B)
{
    struct mp_program *p = B->p;
    unsigned sms = p->opts.sm_count, thr = p->opts.sm_threads;
    for (size_t k = 0; k < p->n_nodes && sms && thr && !failed(B); k++) {
        struct mp_node *n = &p->nodes[k];
        int q = n->prim == MP_P_LINEAR ? n->param[1] : n->col_sum_weight ? n->param[0] : -1;
        if (q < 0 || !p->params[q].trainable || n->no_grad || n->out < 0)
            continue;
        const struct mp_tensor *y = &p->tensors[n->out];
        uint64_t sem, stg = mp_col_sum_staging(n->rows, n->n, mp_dtype_size(y->dtype), sms, thr, &sem);
        if (!stg)
            continue;
        enum mp_trole roles[MP_NODE_TMP_MAX];
        uint64_t bytes[MP_NODE_TMP_MAX];
        int c = n->n_bwd_tmp;
        for (int i = 0; i < c; i++) {
            roles[i] = n->bwd_tmp[i].role;
            bytes[i] = n->bwd_tmp[i].bytes;
        }
        if (n->prim == MP_P_RMSNORM && c == 1 && n->in[0] >= 0 && p->tensors[n->in[0]].needs_grad) {
            /* (x needs no gradient: frozen.c made the transient the weight's product alone) */
            uint64_t rows_n = mul(B, n->rows, n->n);
            uint64_t two = mul(B, rows_n, 2 * mp_dtype_size(y->dtype));
            uint64_t gin = mul(B, rows_n, mp_dtype_size(p->tensors[n->in[0]].dtype));
            uint64_t both = add(B, stg, sem), need = add(B, two > gin ? two - gin : 0, both);
            bytes[0] = (bytes[0] > need ? bytes[0] : need) - both;
        }
        bool room = c + 2 <= MP_NODE_TMP_MAX; /* (else the semaphores join the buffer's request) */
        roles[c] = MP_TR_COL_SUM;
        bytes[c++] = room ? stg : add(B, stg, sem);
        if (room) {
            roles[c] = MP_TR_COL_SUM;
            bytes[c++] = sem;
        }
        tmp_parts(B, n, true, c, roles, bytes);
    }
}
