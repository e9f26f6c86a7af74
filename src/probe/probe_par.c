/* probe_par.c — the probe of one data-parallel rank: the buffers' contents and every
 * collective as a local copy (probe_par.h says what "as if every rank held rank r's data"
 * means).  Layouts follow the replay (estimate/replay*.c) and the plan (parallel.c):
 *   FSDP2   shard of q = rows [r c, r c + c) of dim 0 (c = ceil(dim0 / world)), zero-padded;
 *           a group's flat all-gather output / reduce-scatter input is world chunks, chunk k
 *           the group's parameters' k-th padded shards in order; the unsharded parameters are
 *           one region of world x shard per parameter (the data first).
 *   ZeRO-3  shard of q = elements [r s, r s + s) (s = ceil(n / world)); gathered per block
 *           into one region of world x s per parameter; parameters under the persistence
 *           threshold stay whole; fp32 master and gradient partitions are the shards of every
 *           parameter in order.
 *   ZeRO-1/2 the flat parameters (in order) padded to world partitions of `part` elements;
 *           rank r's fp32 master partition, optimizer state and gradient partition.
 *   DDP     buckets filled in reverse parameter order.
 */
#include "probe_par.h"

#include <stdlib.h>
#include <string.h>

#include "estimate/estimate.h"

struct mp_par_exec {
    struct mp_par_plan plan;
    enum mp_par_strategy s;
    uint64_t rank, world;
    enum mp_dtype pdt;    /* the parameters' (compute) dtype */
    enum mp_dtype mdt;    /* the master copy's dtype */
    enum mp_dtype rdt;    /* FSDP2's reduce-scatter dtype */
    uint64_t *goff;       /* per parameter: offset in its group's unsharded region (elements) */
    uint64_t *soff;       /* per parameter: offset of its shard in the group's shard layout (FSDP2) or
                           * in the flat partitions (ZeRO-3); in the flat parameters (ZeRO-1/2) */
    uint64_t *boff;       /* DDP: offset in the buckets (reverse order) */
    uint64_t *gshard;     /* per group: its shard elements (FSDP2 chunk size) */
    bool *rs_done;        /* per group: the current reduce-scatter input has been reduced */
};

/* ---- storages in host memory ------------------------------------------------------------- */

struct hbuf {
    void *dev, *h;
    uint64_t bytes;
    bool own;
};

static enum mp_status hmap(struct mp_exec *x, void *dev, uint64_t bytes, bool read, struct hbuf *b)
{
    memset(b, 0, sizeof *b);
    b->dev = dev;
    b->bytes = bytes;
    if (!dev || !x->be->upload) {
        b->h = dev;
        return MP_OK;
    }
    b->h = malloc(bytes ? (size_t)bytes : 1);
    if (!b->h)
        return mp_fail(x->d, MP_ERR_NOMEM, "probe: out of host memory staging %llu bytes",
                       (unsigned long long)bytes);
    b->own = true;
    if (read)
        return x->be->download(x, b->h, dev, bytes);
    memset(b->h, 0, (size_t)bytes);
    return MP_OK;
}

/* Writes a staged buffer back (write) and releases it. */
static enum mp_status hput(struct mp_exec *x, struct hbuf *b, bool write)
{
    enum mp_status st = MP_OK;
    if (b->own) {
        if (write)
            st = x->be->upload(x, b->dev, b->h, b->bytes);
        free(b->h);
    }
    memset(b, 0, sizeof *b);
    return st;
}

static struct mp_view hv(const struct hbuf *b, enum mp_dtype dt, uint64_t off)
{
    struct mp_view v = {b->h ? (char *)b->h + off * mp_dtype_size(dt) : NULL, dt, 0};
    return v;
}

static void *comm_ptr(const struct mp_exec *x, size_t slot, enum mp_comm_kind k)
{
    return mp_pool_get(&x->pool, MP_ST_COMM, (int)(slot * MP_COMM_KINDS + k));
}

/* ---- layout ---------------------------------------------------------------------------------- */

static bool persist(const struct mp_par_exec *px, const struct mp_param *q)
{
    return px->s == MP_PAR_ZERO3 && mp_par_z3_persistent(&px->plan, q);
}

static bool sharded(const struct mp_par_exec *px, const struct mp_param *q)
{
    return mp_par_sharded_params(px->s) && !persist(px, q);
}

static uint64_t dim0(const struct mp_param *q) { return q->rows > 1 ? q->rows : q->cols; }

/* Index in parameter q of element j of rank k's shard; elems when it is padding. */
static uint64_t shard_src(const struct mp_par_exec *px, const struct mp_param *q, uint64_t k, uint64_t j)
{
    if (mp_par_is_fsdp(px->s)) {
        uint64_t d0 = dim0(q), w = d0 ? q->elems / d0 : 1, c = d0 ? mp_ceil_div(d0, px->world) : q->elems;
        uint64_t row = k * c + j / w;
        return d0 && row < d0 ? row * w + j % w : q->elems;
    }
    uint64_t s = mp_ceil_div(q->elems, px->world), i = k * s + j;
    return i < q->elems ? i : q->elems;
}

static int group_of(const struct mp_exec *x, size_t q)
{
    const struct mp_par_exec *px = x->par;
    return px->plan.group_of_param ? px->plan.group_of_param[q] : -1;
}

enum mp_status mp_par_exec_new(struct mp_exec *x, struct mp_diag *d)
{
    const struct mp_program *p = x->p;
    const struct mp_parallel *par = x->t.par;
    if (par->offload != MP_OFFLOAD_NONE)
        return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: --offload is estimated only (the host side of the step "
                                              "is not probed)");
    if (p->opts.ft.mode != MP_FT_FULL)
        return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: --finetune %s with --parallel is estimated only",
                       mp_ft_mode_str(p->opts.ft.mode));
    enum mp_optimizer o = x->t.optimizer;
    if (!mp_optimizer_par_probe(o))
        return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: --parallel runs %s (%s is estimated only)",
                       mp_optimizer_par_probe_names(), mp_optimizer_str(o));
    if (x->be->upload && !x->be->download)
        return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: the %s backend cannot stage the local collectives",
                       x->be->name);
    struct mp_par_exec *px = calloc(1, sizeof *px);
    if (!px)
        return mp_fail(d, MP_ERR_NOMEM, "probe: out of memory");
    x->par = px;
    enum mp_status st = mp_par_plan_make(par, p, o, &px->plan, d);
    if (st != MP_OK)
        return st;
    px->s = par->strategy;
    px->world = px->plan.world;
    px->rank = par->rank;
    if (px->rank >= px->world)
        return mp_fail(d, MP_ERR_USAGE, "probe: --rank %llu: the world has %llu ranks",
                       (unsigned long long)px->rank, (unsigned long long)px->world);
    px->pdt = p->param_dtype;
    px->mdt = px->plan.master_elem_bytes == 2 ? MP_DT_BF16 : MP_DT_F32;
    px->rdt = px->plan.reduce_elem_bytes == 2 ? MP_DT_BF16 : MP_DT_F32;
    size_t np = p->n_params ? p->n_params : 1, ng = px->plan.n_groups ? px->plan.n_groups : 1;
    px->goff = calloc(np, sizeof *px->goff);
    px->soff = calloc(np, sizeof *px->soff);
    px->boff = calloc(np, sizeof *px->boff);
    px->gshard = calloc(ng, sizeof *px->gshard);
    px->rs_done = calloc(ng, sizeof *px->rs_done);
    if (!px->goff || !px->soff || !px->boff || !px->gshard || !px->rs_done)
        return mp_fail(d, MP_ERR_NOMEM, "probe: out of memory");
    uint64_t flat = 0, rev = 0;
    for (size_t q = 0; q < p->n_params; q++) {
        const struct mp_param *pa = &p->params[q];
        if (pa->dtype != px->pdt)
            return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: %s: a parameter in another dtype than the model's",
                           pa->name);
        if (px->s == MP_PAR_ZERO3) { /* flat partitions: every parameter's shard */
            px->soff[q] = flat;
            flat += px->plan.shard_elems[q];
        } else if (px->s == MP_PAR_ZERO1 || px->s == MP_PAR_ZERO2) {
            px->soff[q] = flat;
            flat += pa->elems;
        }
        if (!sharded(px, pa))
            continue;
        int g = group_of(x, q);
        if (g < 0)
            return mp_fail(d, MP_ERR_UNSUPPORTED, "probe: %s belongs to no block", pa->name);
        if (mp_par_is_fsdp(px->s))
            px->soff[q] = px->gshard[g];
        px->gshard[g] += px->plan.shard_elems[q];
        px->goff[q] = px->gshard[g] * px->world - px->plan.shard_elems[q] * px->world;
    }
    for (size_t q = p->n_params; q-- > 0;) { /* DDP buckets: reverse order, back to back */
        px->boff[q] = rev;
        rev += p->params[q].elems;
    }
    return MP_OK;
}

void mp_par_exec_free(struct mp_par_exec *px)
{
    if (!px)
        return;
    mp_par_plan_release(&px->plan);
    free(px->goff);
    free(px->soff);
    free(px->boff);
    free(px->gshard);
    free(px->rs_done);
    free(px);
}

struct mp_view mp_par_exec_param(const struct mp_exec *x, int q)
{
    const struct mp_par_exec *px = x->par;
    if (q < 0 || !sharded(px, &x->p->params[q]))
        return mp_view_param(x, MP_ST_PARAM, q);
    struct mp_view v = {NULL, x->p->params[q].dtype, x->p->params[q].elems};
    char *u = comm_ptr(x, (size_t)group_of(x, (size_t)q), MP_COMM_UNSHARD);
    if (u)
        v.p = u + px->goff[q] * mp_dtype_size(v.dt);
    return v;
}

/* ---- the collectives, as local copies ------------------------------------------------------- */

/* Rank r's shard of q (FSDP2, ZeRO-3) from the deterministic starting values. */
static void fill_shard(const struct mp_exec *x, size_t q, struct mp_view dst)
{
    const struct mp_par_exec *px = x->par;
    const struct mp_param *pa = &x->p->params[q];
    for (uint64_t j = 0; j < px->plan.shard_elems[q]; j++) {
        uint64_t i = shard_src(px, pa, px->rank, j);
        mp_view_st(dst, j, i < pa->elems ? mp_exec_param_value(x->p, q, i, x->seed) : 0.0f);
    }
}

/* FSDP2 all-gather output / ZeRO-3 gather / copy-in of group g (kind says which). */
static enum mp_status gather(struct mp_exec *x, size_t g, enum mp_comm_kind kind, void *ptr)
{
    struct mp_par_exec *px = x->par;
    const struct mp_program *p = x->p;
    bool fsdp = mp_par_is_fsdp(px->s);
    uint64_t W = px->world, total = fsdp ? px->gshard[g] : 0;
    uint64_t out_elems = kind == MP_COMM_COPY_IN ? px->gshard[g] : px->plan.groups[g].unsharded_elems;
    struct hbuf out, src;
    enum mp_status st = hmap(x, ptr, out_elems * mp_dtype_size(px->pdt), false, &out);
    /* source: the copy-in (mixed), else the shards; the flat output for the copy-out */
    void *ag = comm_ptr(x, g, MP_COMM_AG_OUT), *ci = comm_ptr(x, g, MP_COMM_COPY_IN);
    for (size_t q = 0; q < p->n_params && st == MP_OK; q++) {
        if (!sharded(px, &p->params[q]) || (size_t)group_of(x, q) != g)
            continue;
        uint64_t sh = px->plan.shard_elems[q];
        enum mp_dtype sdt;
        uint64_t soff;
        void *sp;
        if (kind == MP_COMM_UNSHARD && fsdp) { /* copy-out of the flat all-gather output */
            sp = ag, sdt = px->pdt, soff = 0;
            st = hmap(x, sp, W * total * mp_dtype_size(sdt), true, &src);
        } else if (kind == MP_COMM_AG_OUT && ci) { /* mixed precision: the bf16 copy-in */
            sp = ci, sdt = px->pdt, soff = px->soff[q];
            st = hmap(x, sp, total * mp_dtype_size(sdt), true, &src);
        } else { /* the shard itself */
            sp = mp_pool_get(&x->pool, MP_ST_PARAM, (int)q);
            sdt = fsdp ? px->mdt : px->pdt, soff = 0;
            st = hmap(x, sp, sh * mp_dtype_size(sdt), true, &src);
        }
        if (st == MP_OK && !src.h)
            st = mp_fail(x->d, MP_ERR_INTERNAL, "probe: %s: the gather's source is not allocated", p->params[q].name);
        for (uint64_t k = 0; k < (kind == MP_COMM_COPY_IN ? 1 : W) && st == MP_OK; k++) {
            struct mp_view dv, sv;
            if (kind == MP_COMM_COPY_IN)
                dv = hv(&out, px->pdt, px->soff[q]), sv = hv(&src, sdt, soff);
            else if (kind == MP_COMM_AG_OUT)
                dv = hv(&out, px->pdt, k * total + px->soff[q]), sv = hv(&src, sdt, soff);
            else if (fsdp) /* every rank's chunk holds rank r's shard: read chunk k */
                dv = hv(&out, px->pdt, px->goff[q] + k * sh), sv = hv(&src, sdt, k * total + px->soff[q]);
            else
                dv = hv(&out, px->pdt, px->goff[q] + k * sh), sv = hv(&src, sdt, 0);
            for (uint64_t j = 0; j < sh; j++)
                mp_view_st(dv, j, mp_view_ld(sv, j));
        }
        enum mp_status s2 = hput(x, &src, false);
        st = st == MP_OK ? s2 : st;
    }
    enum mp_status s2 = hput(x, &out, st == MP_OK);
    return st == MP_OK ? s2 : st;
}

/* FSDP2 reduce-scatter of group g: the input's world chunks summed into the output. */
static enum mp_status reduce_scatter(struct mp_exec *x, size_t g)
{
    struct mp_par_exec *px = x->par;
    uint64_t total = px->gshard[g], W = px->world;
    struct hbuf in, out;
    enum mp_status st = hmap(x, comm_ptr(x, g, MP_COMM_RS_IN), W * total * mp_dtype_size(px->rdt), true, &in);
    if (st == MP_OK)
        st = hmap(x, comm_ptr(x, g, MP_COMM_RS_OUT), total * mp_dtype_size(px->rdt), true, &out);
    if (st == MP_OK) {
        struct mp_view o = hv(&out, px->rdt, 0), iv = hv(&in, px->rdt, 0);
        for (uint64_t j = 0; j < total; j++) {
            float s = mp_view_ld(o, j);
            for (uint64_t k = 0; k < W; k++)
                s += mp_view_ld(iv, k * total + j);
            mp_view_st(o, j, s);
        }
    }
    enum mp_status s2 = hput(x, &in, false), s3 = hput(x, &out, st == MP_OK);
    px->rs_done[g] = true;
    return st != MP_OK ? st : s2 != MP_OK ? s2 : s3;
}

/* FSDP2 reduce-scatter copy-in: the group's unsharded gradients into the input's chunks. */
static enum mp_status rs_copy_in(struct mp_exec *x, size_t g, void *ptr)
{
    struct mp_par_exec *px = x->par;
    const struct mp_program *p = x->p;
    uint64_t total = px->gshard[g], W = px->world;
    struct hbuf in, gr;
    enum mp_status st = hmap(x, ptr, W * total * mp_dtype_size(px->rdt), false, &in);
    for (size_t q = 0; q < p->n_params && st == MP_OK; q++) {
        const struct mp_param *pa = &p->params[q];
        if ((size_t)group_of(x, q) != g || !mp_pool_has(&x->pool, MP_ST_PGRAD, (int)q))
            continue;
        st = hmap(x, mp_pool_get(&x->pool, MP_ST_PGRAD, (int)q), pa->elems * mp_dtype_size(pa->dtype), true, &gr);
        struct mp_view gv = hv(&gr, pa->dtype, 0);
        for (uint64_t k = 0; k < W && st == MP_OK; k++) {
            struct mp_view dv = hv(&in, px->rdt, k * total + px->soff[q]);
            for (uint64_t j = 0; j < px->plan.shard_elems[q]; j++) {
                uint64_t i = shard_src(px, pa, k, j);
                mp_view_st(dv, j, i < pa->elems ? mp_view_ld(gv, i) : 0.0f);
            }
        }
        enum mp_status s2 = hput(x, &gr, false);
        st = st == MP_OK ? s2 : st;
    }
    enum mp_status s2 = hput(x, &in, st == MP_OK);
    px->rs_done[g] = false;
    if (st == MP_OK && s2 == MP_OK && comm_ptr(x, g, MP_COMM_RS_OUT))
        return reduce_scatter(x, g); /* the output exists (accumulation): reduce now */
    return st == MP_OK ? s2 : st;
}

/* Adds gradient q into a partition: ZeRO-2 grads_in_partition (flat, modulo the partition),
 * ZeRO-3 the fp32 gradient partition (modulo the shard), ZeRO-1's step gradient. */
static enum mp_status reduce_into(struct mp_exec *x, size_t q, void *dst, enum mp_dtype ddt, uint64_t dst_elems)
{
    struct mp_par_exec *px = x->par;
    const struct mp_param *pa = &x->p->params[q];
    struct hbuf gr, out;
    enum mp_status st = hmap(x, mp_pool_get(&x->pool, MP_ST_PGRAD, (int)q), pa->elems * mp_dtype_size(pa->dtype), true,
                             &gr);
    if (st == MP_OK)
        st = hmap(x, dst, dst_elems * mp_dtype_size(ddt), true, &out);
    if (st == MP_OK && gr.h && out.h) {
        struct mp_view gv = hv(&gr, pa->dtype, 0), o = hv(&out, ddt, 0);
        uint64_t s = px->plan.shard_elems[q];
        for (uint64_t i = 0; i < pa->elems; i++) {
            uint64_t j = px->s == MP_PAR_ZERO3 ? px->soff[q] + i % s : (px->soff[q] + i) % dst_elems;
            mp_view_st(o, j, mp_view_ld(o, j) + mp_view_ld(gv, i));
        }
    }
    enum mp_status s2 = hput(x, &gr, false), s3 = hput(x, &out, st == MP_OK);
    return st != MP_OK ? st : s2 != MP_OK ? s2 : s3;
}

/* The fp32 master partition's starting values: ZeRO-1/2 flat partition r, ZeRO-3 every shard. */
static enum mp_status fill_master(struct mp_exec *x, void *ptr, uint64_t elems)
{
    struct mp_par_exec *px = x->par;
    const struct mp_program *p = x->p;
    struct hbuf b;
    enum mp_status st = hmap(x, ptr, elems * 4, false, &b);
    if (st != MP_OK)
        return st;
    struct mp_view v = hv(&b, MP_DT_F32, 0);
    for (size_t q = 0; q < p->n_params; q++) {
        const struct mp_param *pa = &p->params[q];
        if (px->s == MP_PAR_ZERO3) {
            uint64_t s = px->plan.shard_elems[q];
            for (uint64_t j = 0; j < s; j++) {
                uint64_t i = px->rank * s + j;
                mp_view_st(v, px->soff[q] + j, i < pa->elems ? mp_exec_param_value(p, q, i, x->seed) : 0.0f);
            }
            continue;
        }
        uint64_t lo = px->rank * elems;
        for (uint64_t i = 0; i < pa->elems; i++) {
            uint64_t e = px->soff[q] + i;
            if (e >= lo && e < lo + elems)
                mp_view_st(v, e - lo, mp_exec_param_value(p, q, i, x->seed));
        }
    }
    return hput(x, &b, true);
}

enum mp_status mp_par_exec_alloc(struct mp_exec *x, const struct mp_event *ev, void *ptr, bool *handled)
{
    struct mp_par_exec *px = x->par;
    const struct mp_program *p = x->p;
    *handled = false;
    if (ev->store == MP_ST_PARAM && sharded(px, &p->params[ev->id])) {
        struct hbuf b;
        enum mp_dtype dt = mp_par_is_fsdp(px->s) ? px->mdt : px->pdt;
        *handled = true;
        enum mp_status st = hmap(x, ptr, ev->bytes, false, &b);
        if (st == MP_OK && b.h)
            fill_shard(x, (size_t)ev->id, hv(&b, dt, 0));
        enum mp_status s2 = hput(x, &b, st == MP_OK);
        return st == MP_OK ? s2 : st;
    }
    if (ev->store != MP_ST_COMM)
        return MP_OK;
    *handled = true;
    if (!ptr)
        return MP_OK;
    size_t slot = (size_t)ev->id / MP_COMM_KINDS;
    enum mp_comm_kind kind = (enum mp_comm_kind)(ev->id % MP_COMM_KINDS);
    switch (kind) {
    case MP_COMM_COPY_IN:
    case MP_COMM_AG_OUT:
    case MP_COMM_UNSHARD: return gather(x, slot, kind, ptr);
    case MP_COMM_RS_IN: return rs_copy_in(x, slot, ptr);
    case MP_COMM_RS_OUT: {
        enum mp_status st = x->be->zero(x, ptr, ev->bytes);
        if (st == MP_OK && comm_ptr(x, slot, MP_COMM_RS_IN) && !px->rs_done[slot])
            st = reduce_scatter(x, slot);
        return st;
    }
    case MP_COMM_PARTITION:
        if (slot == 0) /* the fp32 master partition */
            return fill_master(x, ptr, ev->bytes / 4);
        return x->be->zero(x, ptr, ev->bytes);
    case MP_COMM_STEP_GRAD: { /* ZeRO-1/2/3: the fp32 gradient partition for the step */
        if (slot == 1) /* ZeRO-3: the flattened copy in the partition's dtype (freed at once) */
            return x->be->zero(x, ptr, ev->bytes);
        enum mp_status st = x->be->zero(x, ptr, ev->bytes);
        uint64_t part = ev->bytes / 4;
        if (px->s == MP_PAR_ZERO1) { /* reduce-scatter of the full gradients */
            for (size_t q = 0; q < p->n_params && st == MP_OK; q++)
                if (mp_pool_has(&x->pool, MP_ST_PGRAD, (int)q))
                    st = reduce_into(x, q, ptr, MP_DT_F32, part);
            return st;
        }
        struct hbuf src, dst; /* ZeRO-2: grads_in_partition cast to fp32; ZeRO-3: its partition */
        if (st == MP_OK)
            st = hmap(x, comm_ptr(x, 1, MP_COMM_PARTITION), part * mp_dtype_size(px->pdt), true, &src);
        if (st == MP_OK)
            st = hmap(x, ptr, ev->bytes, false, &dst);
        if (st == MP_OK && src.h)
            for (uint64_t j = 0; j < part; j++)
                mp_view_st(hv(&dst, MP_DT_F32, 0), j, mp_view_ld(hv(&src, px->pdt, 0), j));
        enum mp_status s2 = hput(x, &src, false), s3 = hput(x, &dst, st == MP_OK);
        return st != MP_OK ? st : s2 != MP_OK ? s2 : s3;
    }
    case MP_COMM_BUCKET:
    case MP_COMM_DIVIDED: /* (--ep only, which the probe refuses) */
    case MP_COMM_KINDS: return x->be->zero(x, ptr, ev->bytes);
    }
    return MP_OK;
}

/* DDP: where parameter q's gradient sits in the buckets (NULL when the bucket is not allocated). */
static char *bucket_at(const struct mp_exec *x, size_t q)
{
    const struct mp_par_exec *px = x->par;
    uint64_t esz = mp_dtype_size(px->pdt), off = px->boff[q] * esz;
    for (size_t b = 0; b < px->plan.n_buckets; b++) {
        if (off < px->plan.bucket_bytes[b]) {
            char *bp = comm_ptr(x, b, MP_COMM_BUCKET);
            return bp ? bp + off : NULL;
        }
        off -= px->plan.bucket_bytes[b];
    }
    return NULL;
}

/* Copies n bytes between two storages through host memory. */
static enum mp_status copy_storage(struct mp_exec *x, void *dst, void *src, uint64_t n)
{
    if (!dst || !src || !n)
        return MP_OK;
    struct hbuf s, d;
    enum mp_status st = hmap(x, src, n, true, &s);
    if (st == MP_OK)
        st = hmap(x, dst, n, false, &d);
    if (st == MP_OK)
        memcpy(d.h, s.h, (size_t)n);
    enum mp_status s2 = hput(x, &s, false), s3 = hput(x, &d, st == MP_OK);
    return st != MP_OK ? st : s2 != MP_OK ? s2 : s3;
}

enum mp_status mp_par_exec_free_event(struct mp_exec *x, const struct mp_event *ev)
{
    struct mp_par_exec *px = x->par;
    if (ev->store != MP_ST_PGRAD || ev->phase == MP_PH_END)
        return MP_OK;
    size_t q = (size_t)ev->id;
    switch (px->s) {
    case MP_PAR_ZERO2: /* into grads_in_partition through the reduce bucket */
        return reduce_into(x, q, comm_ptr(x, 1, MP_COMM_PARTITION), px->pdt, px->plan.partition_elems);
    case MP_PAR_ZERO3: { /* into the gradient partition, in the model's dtype */
        uint64_t total = 0;
        for (size_t k = 0; k < x->p->n_params; k++)
            total += px->plan.shard_elems[k];
        return reduce_into(x, q, comm_ptr(x, 1, MP_COMM_PARTITION), px->pdt, total);
    }
    case MP_PAR_DDP: /* gradient_as_bucket_view: the gradient lives on in its bucket view */
        return copy_storage(x, bucket_at(x, q), mp_pool_get(&x->pool, MP_ST_PGRAD, (int)q),
                            x->p->params[q].elems * mp_dtype_size(px->pdt));
    default: return MP_OK;
    }
}

/* ---- the optimizer step of rank r ------------------------------------------------------------ */

static enum mp_status step_one(struct mp_exec *x, size_t q, struct mp_view P, struct mp_view G, enum mp_dtype dt,
                               void *state, void *tmp)
{
    struct mp_param sp = x->p->params[q]; /* the shard or partition as the optimizer sees it */
    sp.elems = P.n;
    sp.dtype = dt;
    sp.matrix = false;
    sp.rows = 1;
    sp.cols = P.n;
    struct mp_param_view v;
    memset(&v, 0, sizeof v);
    v.q = q;
    v.param = &sp;
    v.P = P;
    v.G = G;
    v.state = state;
    v.tmp = tmp;
    v.t = x->opt_steps;
    return x->be->opt_param(x, &v);
}

/* A view of n elements at element offset off of a storage (device pointers stay device). */
static struct mp_view at(void *base, enum mp_dtype dt, uint64_t off, uint64_t n)
{
    struct mp_view v = {base ? (char *)base + off * mp_dtype_size(dt) : NULL, dt, n};
    return v;
}

/* After a master update, the all-gather spreads rank r's values over every slot of q:
 * element i of q (n of them: the shard, or the whole parameter) takes src[base + i % mod]
 * (ZeRO-3; skipped past slen) or src[(base + i) % mod] (ZeRO-1/2's flat partition). */
static enum mp_status spread(struct mp_exec *x, size_t q, uint64_t n, void *src, enum mp_dtype sdt, uint64_t slen,
                             uint64_t base, uint64_t mod, bool flat)
{
    struct mp_par_exec *px = x->par;
    struct hbuf m, d;
    enum mp_status st = hmap(x, src, slen * mp_dtype_size(sdt), true, &m);
    if (st == MP_OK)
        st = hmap(x, mp_pool_get(&x->pool, MP_ST_PARAM, (int)q), n * mp_dtype_size(px->pdt), true, &d);
    if (st == MP_OK && m.h && d.h) {
        struct mp_view mv = hv(&m, sdt, 0), dv = hv(&d, px->pdt, 0);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t j = flat ? (base + i) % mod : base + i % mod;
            if (j < slen)
                mp_view_st(dv, i, mp_view_ld(mv, j));
        }
    }
    enum mp_status s2 = hput(x, &m, false), s3 = hput(x, &d, st == MP_OK);
    return st != MP_OK ? st : s2 != MP_OK ? s2 : s3;
}

enum mp_status mp_par_exec_opt(struct mp_exec *x)
{
    struct mp_par_exec *px = x->par;
    const struct mp_program *p = x->p;
    if (!x->update)
        return MP_OK;
    x->opt_steps++;
    enum mp_status st = MP_OK;
    switch (px->s) {
    case MP_PAR_DDP:
        for (size_t q = 0; q < p->n_params && st == MP_OK; q++) {
            void *g = mp_pool_get(&x->pool, MP_ST_PGRAD, (int)q), *b = bucket_at(x, q);
            uint64_t n = p->params[q].elems, bytes = n * mp_dtype_size(px->pdt);
            if (g) { /* the all-reduce: into the bucket and back (every rank's gradient is this one) */
                st = copy_storage(x, b, g, bytes);
                if (st == MP_OK)
                    st = copy_storage(x, g, b, bytes);
            } else if (p->params[q].trainable && x->t.par->ddp_grad_as_bucket_view) {
                g = b;
            }
            if (st == MP_OK && g && p->params[q].trainable)
                st = step_one(x, q, mp_view_param(x, MP_ST_PARAM, (int)q), at(g, px->pdt, 0, n), px->pdt,
                              mp_pool_get(&x->pool, MP_ST_OPT_STATE, (int)q),
                              mp_pool_get(&x->pool, MP_ST_OPT_TMP, (int)q));
        }
        return st;
    case MP_PAR_FSDP:
    case MP_PAR_FSDP_NO_RESHARD:
        for (size_t q = 0; q < p->n_params && st == MP_OK; q++) {
            void *out = comm_ptr(x, (size_t)group_of(x, q), MP_COMM_RS_OUT);
            uint64_t s = px->plan.shard_elems[q];
            if (!out || !p->params[q].trainable)
                continue;
            st = step_one(x, q, at(mp_pool_get(&x->pool, MP_ST_PARAM, (int)q), px->mdt, 0, s),
                          at(out, px->rdt, px->soff[q], s), px->mdt, mp_pool_get(&x->pool, MP_ST_OPT_STATE, (int)q),
                          mp_pool_get(&x->pool, MP_ST_OPT_TMP, (int)q));
        }
        return st;
    case MP_PAR_ZERO3: {
        /* the step reads the fp32 copy when the partition is half (replay.c), else the partition */
        void *master = comm_ptr(x, 0, MP_COMM_PARTITION), *part = comm_ptr(x, 1, MP_COMM_PARTITION);
        void *grads = px->pdt == MP_DT_F32 ? part : comm_ptr(x, 0, MP_COMM_STEP_GRAD);
        for (size_t q = 0; q < p->n_params && st == MP_OK; q++) {
            const struct mp_param *pa = &p->params[q];
            uint64_t s = px->plan.shard_elems[q], n = s;
            if (!pa->trainable || !grads)
                continue;
            struct mp_view P;
            if (master) {
                P = at(master, MP_DT_F32, px->soff[q], s);
            } else if (persist(px, pa)) { /* fp32 and whole: rank r's slice of it */
                if (px->rank * s >= pa->elems)
                    continue;
                n = mp_min_u64(s, pa->elems - px->rank * s);
                P = at(mp_pool_get(&x->pool, MP_ST_PARAM, (int)q), MP_DT_F32, px->rank * s, n);
            } else {
                P = at(mp_pool_get(&x->pool, MP_ST_PARAM, (int)q), MP_DT_F32, 0, s);
            }
            st = step_one(x, q, P, at(grads, MP_DT_F32, px->soff[q], n), MP_DT_F32,
                          mp_pool_get(&x->pool, MP_ST_OPT_STATE, (int)q), NULL);
            uint64_t whole = persist(px, pa) ? pa->elems : s;
            if (st == MP_OK && master) /* the fp32 master into the parameter's dtype */
                st = spread(x, q, whole, master, MP_DT_F32, px->soff[q] + s, px->soff[q], s, false);
            else if (st == MP_OK && persist(px, pa)) /* rank r's slice over the others */
                st = spread(x, q, whole, mp_pool_get(&x->pool, MP_ST_PARAM, (int)q), px->pdt, pa->elems,
                            px->rank * s, s, false);
        }
        uint64_t total = 0; /* zero_grad: the gradient partition starts the next step at 0 */
        for (size_t q = 0; q < p->n_params; q++)
            total += px->plan.shard_elems[q];
        return st == MP_OK && part ? x->be->zero(x, part, total * mp_dtype_size(px->pdt)) : st;
    }
    case MP_PAR_ZERO1:
    case MP_PAR_ZERO2: {
        uint64_t part = px->plan.partition_elems;
        void *master = comm_ptr(x, 0, MP_COMM_PARTITION), *grads = comm_ptr(x, 0, MP_COMM_STEP_GRAD);
        if (!master || !grads)
            return MP_OK;
        st = step_one(x, 0, at(master, MP_DT_F32, 0, part), at(grads, MP_DT_F32, 0, part), MP_DT_F32,
                      mp_pool_get(&x->pool, MP_ST_OPT_STATE, 0), NULL);
        for (size_t q = 0; q < p->n_params && st == MP_OK; q++)
            if (p->params[q].trainable)
                st = spread(x, q, p->params[q].elems, master, MP_DT_F32, part, px->soff[q], part, true);
        void *gip = comm_ptr(x, 1, MP_COMM_PARTITION); /* ZeRO-2 zero_grad: grads_in_partition to 0 */
        return st == MP_OK && gip ? x->be->zero(x, gip, part * mp_dtype_size(px->pdt)) : st;
    }
    case MP_PAR_NONE: break;
    }
    return st;
}
