/* fold.c — a long run of identical blocks evaluated through four of them (fold.h). */
#include "fold.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

#include <stdint.h>

void mp_fold_init(struct mp_fold *f)
{
    memset(f, 0, sizeof *f);
    mp_schedule_init(&f->sched);
}

void mp_fold_release(struct mp_fold *f)
{
    if (!f)
        return;
    free(f->model.blocks);
    free(f->full_of);
    free(f->weight);
    free(f->short_of);
    mp_schedule_release(&f->sched);
    mp_fold_init(f);
}

/* A block step: the ops in a row on one block (a recompute and its backward, FE B), ops
 * [k, k + len).  Two steps alike: the same kinds in the same order. */
static size_t step_len(const struct mp_schedule *s, size_t k)
{
    size_t e = k + 1;
    while (e < s->n && s->ops[k].kind != MP_SCHED_LOSS && s->ops[e].kind != MP_SCHED_LOSS &&
           s->ops[e].index == s->ops[k].index)
        e++;
    return e - k;
}

static bool steps_alike(const struct mp_schedule *s, size_t a, size_t la, size_t b, size_t lb)
{
    if (la != lb)
        return false;
    for (size_t i = 0; i < la; i++)
        if (s->ops[a + i].kind != s->ops[b + i].kind)
            return false;
    return true;
}

/* Marks cut[i] where an interval that may be folded cannot continue across block i: a block
 * that is not one of a repeat, or not the same as the block before; the first three blocks of a
 * run (the first copies lower and replay differently: the model's shared tensors are made there);
 * and both ends of every run of alike block steps over consecutive blocks, one way. */
static enum mp_status make_cuts(const struct mp_model *m, const struct mp_schedule *s, bool *cut,
                                struct mp_diag *d)
{
    size_t N = m->n_blocks, rs = 0;
    cut[0] = cut[N] = true;
    for (size_t i = 0; i < N; i++) {
        if (i == 0 || m->blocks[i].repeat_group <= 0 || m->blocks[i].period != 1)
            rs = i;
        if (i - rs <= 3)
            cut[i] = true;
    }
    for (size_t k = 0; k < s->n; k++) {
        const struct mp_sched_op *op = &s->ops[k];
        if (op->kind == MP_SCHED_LOSS ? op->index != N : op->index >= N)
            return mp_fail(d, MP_ERR_INTERNAL, "fold: op %zu on block %u of %zu", k, op->index, N);
    }
    size_t lo = 0, hi = 0, pk = 0, pl = 0; /* the open run's blocks, its last step */
    int dir = 0;                           /* its direction (0: one step so far) */
    bool open = false;
    for (size_t k = 0; k < s->n;) {
        size_t len = step_len(s, k);
        uint32_t i = s->ops[k].index;
        bool loss = s->ops[k].kind == MP_SCHED_LOSS;
        int step = open ? (int)((int64_t)i - (int64_t)s->ops[pk].index) : 0;
        bool cont = open && !loss && (step == 1 || step == -1) && (dir == 0 || dir == step) &&
                    steps_alike(s, pk, pl, k, len);
        if (!cont && open) {
            cut[lo] = cut[hi + 1] = true;
            open = false;
        }
        if (!loss) {
            if (!cont) {
                lo = hi = i;
                dir = 0;
                open = true;
            } else {
                dir = step;
                lo = i < lo ? i : lo;
                hi = i > hi ? i : hi;
            }
            pk = k, pl = len;
        }
        k += len;
    }
    if (open)
        cut[lo] = cut[hi + 1] = true;
    return MP_OK;
}

enum mp_status mp_fold_make(const struct mp_model *m, const struct mp_schedule *s, struct mp_fold *f,
                            struct mp_diag *d)
{
    mp_fold_init(f);
    size_t N = m->n_blocks;
    struct mp_schedule none;
    mp_schedule_init(&none);
    bool *cut = calloc(N + 1, sizeof *cut);
    enum mp_status st = MP_OK;
    if (!cut) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory folding the model");
        goto out;
    }
    if (!s) {
        if ((st = mp_ckpt_schedule_none(N, &none)) != MP_OK) {
            mp_fail(d, st, "out of memory folding the model");
            goto out;
        }
        s = &none;
    }
    if ((st = make_cuts(m, s, cut, d)) != MP_OK)
        goto out;
    /* the short blocks: an interval of MP_FOLD_MIN_RUN or more keeps its first, two interior
     * and its last block; shorter ones keep all theirs */
    size_t n = 0;
    for (size_t c = 0; c < N;) {
        size_t e = c + 1;
        while (!cut[e])
            e++;
        n += e - c >= MP_FOLD_MIN_RUN ? 4 : e - c;
        c = e;
    }
    f->n_full = N;
    f->n = n;
    f->full = m;
    f->full_of = malloc((n ? n : 1) * sizeof *f->full_of);
    f->weight = malloc((n ? n : 1) * sizeof *f->weight);
    f->short_of = malloc((N ? N : 1) * sizeof *f->short_of);
    f->model = *m;
    f->model.blocks = malloc((n ? n : 1) * sizeof *f->model.blocks);
    if (!f->full_of || !f->weight || !f->short_of || !f->model.blocks) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory folding the model");
        goto out;
    }
    f->model.n_blocks = f->model.cap_blocks = n;
    size_t j = 0;
    for (size_t c = 0; c < N;) {
        size_t e = c + 1;
        while (!cut[e])
            e++;
        for (size_t i = c; i < e; i++) {
            bool fold = e - c >= MP_FOLD_MIN_RUN;
            bool rep = !fold || i < c + 2 || i == e - 1; /* a block of its own in the short model */
            if (rep || i == c + 2) {
                f->full_of[j] = i;
                f->weight[j] = rep ? 1 : (uint64_t)(e - c - 3);
                f->model.blocks[j] = m->blocks[i];
                j++;
            }
            f->short_of[i] = (uint32_t)(j - 1);
        }
        if (e - c >= MP_FOLD_MIN_RUN)
            f->folded += e - c - 4;
        c = e;
    }
    /* the short schedule: each op on its short block; a run of alike steps over a weighted
     * block's copies is one step */
    size_t count = 0, last = SIZE_MAX, last_len = 0; /* steps merged into the last step pushed */
    for (size_t k = 0; k < s->n && st == MP_OK;) {
        size_t len = step_len(s, k);
        const struct mp_sched_op *op = &s->ops[k];
        uint32_t sj = op->kind == MP_SCHED_LOSS ? (uint32_t)n : f->short_of[op->index];
        bool weighted = op->kind != MP_SCHED_LOSS && f->weight[sj] > 1;
        if (weighted && last != SIZE_MAX && f->sched.ops[last].index == sj && f->sched.ops[last].kind != MP_SCHED_LOSS &&
            count < f->weight[sj] && last_len == len) {
            bool alike = true;
            for (size_t i = 0; i < len; i++)
                alike &= f->sched.ops[last + i].kind == s->ops[k + i].kind;
            if (alike) {
                count++;
                k += len;
                continue;
            }
        }
        if (last != SIZE_MAX && f->sched.ops[last].kind != MP_SCHED_LOSS &&
            f->weight[f->sched.ops[last].index] != count) {
            st = mp_fail(d, MP_ERR_INTERNAL, "fold: %zu steps over the %llu copies of block %zu", count,
                         (unsigned long long)f->weight[f->sched.ops[last].index], f->full_of[f->sched.ops[last].index]);
            break;
        }
        last = f->sched.n;
        last_len = len;
        count = 1;
        for (size_t i = 0; i < len && st == MP_OK; i++)
            st = mp_schedule_push(&f->sched, s->ops[k + i].kind, sj);
        k += len;
    }
    if (st == MP_OK && last != SIZE_MAX && f->sched.ops[last].kind != MP_SCHED_LOSS &&
        f->weight[f->sched.ops[last].index] != count)
        st = mp_fail(d, MP_ERR_INTERNAL, "fold: the last step's run is short");
    if (st == MP_ERR_NOMEM)
        mp_fail(d, st, "out of memory folding the model");
out:
    free(cut);
    mp_schedule_release(&none);
    if (st != MP_OK)
        mp_fold_release(f);
    return st;
}

void mp_fold_mark_chain(const struct mp_model *m, struct mp_chain *c)
{
    for (size_t i = 0; i < c->L && i < m->n_blocks; i++)
        c->repeated[i] = m->blocks[i].repeat_group > 0;
}

bool mp_fold_expand_chain(const struct mp_fold *f, const struct mp_chain *sc, struct mp_chain *c,
                          enum mp_status *st)
{
    *st = MP_OK;
    size_t n = f->n, N = f->n_full;
    if (sc->L != n)
        return false;
    for (size_t j = 1; j < n; j++) /* an interval's two interior blocks must agree */
        if (f->weight[j] > 1 &&
            (sc->f[j] != sc->f[j - 1] || sc->b[j] != sc->b[j - 1] || sc->x[j] != sc->x[j - 1] ||
             sc->x[j + 1] != sc->x[j] || sc->xb[j + 1] != sc->xb[j] || sc->ft[j] != sc->ft[j - 1] ||
             sc->bt[j] != sc->bt[j - 1]))
            return false;
    if ((*st = mp_chain_init(c, N)) != MP_OK)
        return false;
    for (size_t i = 0; i < N; i++) {
        size_t j = f->short_of[i];
        c->f[i] = sc->f[j];
        c->b[i] = sc->b[j];
        c->x[i] = sc->x[j];
        c->xb[i + 1] = sc->xb[j + 1];
        c->ft[i] = sc->ft[j];
        c->bt[i] = sc->bt[j];
    }
    c->x[N] = sc->x[n];
    c->xb[0] = sc->xb[0];
    c->b[N] = sc->b[n];
    c->bt[N] = sc->bt[n];
    return true;
}

bool mp_fold_copied(const struct mp_fold *f, const struct mp_program *p)
{
    if (p->n_blocks != f->n)
        return false;
    for (size_t j = 0; j < f->n; j++)
        if (f->weight[j] > 1 && !p->copied[j])
            return false;
    return true;
}

uint64_t mp_fold_weight(const struct mp_fold *f, int j) { return j >= 0 && (size_t)j < f->n ? f->weight[j] : 1; }

bool mp_fold_counts(const struct mp_fold *f, const struct mp_program *p, uint64_t *total, uint64_t *trainable,
                    uint64_t *adapter)
{
    uint64_t x;
    bool ok = true;
    *total = p->total_params, *trainable = 0, *adapter = p->adapter_params;
    for (size_t j = 0; ok && j < f->n && j < p->n_blocks; j++) {
        const struct mp_block_prog *bp = &p->blocks[j];
        uint64_t w = f->weight[j], adapter_j = 0;
        for (size_t q = bp->param0; q < bp->param0 + bp->n_params; q++)
            adapter_j += p->params[q].adapter ? p->params[q].elems : 0;
        ok = mp_mul_u64(bp->params, w - 1, &x) && mp_add_u64(*total, x, total) &&
             mp_mul_u64(adapter_j, w - 1, &x) && mp_add_u64(*adapter, x, adapter);
    }
    for (size_t q = 0; ok && q < p->n_params; q++)
        ok = !p->params[q].trainable || (mp_mul_u64(p->params[q].elems, mp_fold_weight(f, p->params[q].block), &x) &&
                                         mp_add_u64(*trainable, x, trainable));
    return ok;
}

enum mp_status mp_fold_report_program(const struct mp_model *m, const struct mp_build_opts *o, struct mp_program *p,
                                      struct mp_diag *d)
{
    struct mp_fold f;
    memset(p, 0, sizeof *p);
    enum mp_status st = mp_fold_make(m, NULL, &f, d);
    if (st != MP_OK)
        return st;
    uint64_t total, trainable, adapter;
    bool holds = f.folded > 0 && (st = mp_program_build(&f.model, o, p, d)) == MP_OK && mp_fold_copied(&f, p) &&
                 mp_fold_counts(&f, p, &total, &trainable, &adapter);
    if (holds) {
        p->total_params = total, p->trainable_params = trainable, p->adapter_params = adapter;
        p->model = m;
    }
    if (!holds && st == MP_OK && p->blocks)
        mp_program_release(p);
    mp_fold_release(&f);
    if (st != MP_OK || holds)
        return st;
    return mp_program_build(m, o, p, d);
}
