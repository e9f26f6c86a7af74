/* fold.c — a long run of identical blocks evaluated through four of them (fold.h). */
#include "fold.h"

#include <stdlib.h>
#include <string.h>

#include "util/util.h"

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
    free(f->unit);
    free(f->unit_len);
    free(f->step_w);
    free(f->outer);
    free(f->outer_len);
    free(f->outer_w);
    mp_schedule_release(&f->sched);
    mp_fold_init(f);
}

/* The model's units: a run of blocks that repeat with period p (mp_block.period, repeated
 * blocks) and the p blocks before it, cut into units of p blocks, [s - p, s), [s, s + p), ...
 * (whole ones: a run's last blocks short of a unit are units of their own, and a later run's
 * first unit takes its blocks from an earlier run's units, whose unit it cuts into becomes
 * blocks of their own); every other block is a unit of its own.  us[i]: the first block of
 * block i's unit, ul[i]: its length, seg[i]: the first block of the units of its run. */
static void make_units(const struct mp_model *m, uint32_t *us, uint32_t *ul, uint32_t *seg)
{
    size_t N = m->n_blocks;
    for (size_t i = 0; i < N; i++)
        us[i] = seg[i] = (uint32_t)i, ul[i] = 1;
    for (size_t s = 0; s < N;) {
        unsigned p = m->blocks[s].period;
        if (!p || m->blocks[s].repeat_group <= 0 || p > s) {
            s++;
            continue;
        }
        size_t e = s + 1;
        while (e < N && m->blocks[e].period == p && m->blocks[e].repeat_group > 0)
            e++;
        size_t a = s - p, b = a + (e - a) / p * p;
        if (a > 0 && us[a - 1] + ul[a - 1] > a) /* an earlier unit that this run's first takes blocks of */
            for (size_t i = us[a - 1]; i < a; i++)
                us[i] = seg[i] = (uint32_t)i, ul[i] = 1;
        for (size_t i = a; i < b; i++)
            us[i] = (uint32_t)(a + (i - a) / p * p), ul[i] = p, seg[i] = (uint32_t)a;
        s = e;
    }
}

/* A unit with a point of split (split[i]: block i starts a unit of an enclosing fold) inside
 * it becomes blocks of their own. */
static void split_units(const bool *split, size_t N, uint32_t *us, uint32_t *ul, uint32_t *seg)
{
    for (size_t i = 0; i < N; i += ul[i]) {
        bool inside = false;
        for (size_t k = i + 1; k < i + ul[i] && k < N; k++)
            inside |= split[k];
        if (inside)
            for (size_t k = i, e = i + ul[i]; k < e; k++)
                us[k] = seg[k] = (uint32_t)k, ul[k] = 1;
    }
}

/* A step: the ops in a row on one unit (us: each block's unit; a recompute and its backward,
 * FE B, or a unit's forwards), ops [k, k + len). */
static size_t step_len(const struct mp_schedule *s, const uint32_t *us, size_t k)
{
    size_t e = k + 1;
    while (e < s->n && s->ops[k].kind != MP_SCHED_LOSS && s->ops[e].kind != MP_SCHED_LOSS &&
           us[s->ops[e].index] == us[s->ops[k].index])
        e++;
    return e - k;
}

/* Two steps alike: the same kinds on the same blocks of their units, in the same order. */
static bool steps_alike(const struct mp_schedule *s, const uint32_t *us, size_t a, size_t la, size_t b, size_t lb)
{
    if (la != lb)
        return false;
    for (size_t i = 0; i < la; i++)
        if (s->ops[a + i].kind != s->ops[b + i].kind ||
            s->ops[a + i].index - us[s->ops[a].index] != s->ops[b + i].index - us[s->ops[b].index])
            return false;
    return true;
}

/* Marks cut[i] (i the first block of a unit, or N) where an interval that may be folded cannot
 * continue across unit i: a unit that is not one of a run's; the first `early` units of a run
 * (the first copies lower and replay differently: the model's shared tensors are made there)
 * and the next one's start; and both ends of every run of alike steps over consecutive units,
 * one way. */
static enum mp_status make_cuts(const struct mp_model *m, const struct mp_schedule *s, const uint32_t *us,
                                const uint32_t *ul, const uint32_t *seg, size_t early, bool *cut, struct mp_diag *d)
{
    size_t N = m->n_blocks;
    cut[0] = cut[N] = true;
    for (size_t i = 0; i < N; i += ul[i])
        if ((i - seg[i]) / ul[i] <= early)
            cut[i] = true;
    for (size_t k = 0; k < s->n; k++) {
        const struct mp_sched_op *op = &s->ops[k];
        if (op->kind == MP_SCHED_LOSS ? op->index != N : op->index >= N)
            return mp_fail(d, MP_ERR_INTERNAL, "fold: op %zu on block %u of %zu", k, op->index, N);
    }
    size_t lo = 0, hi = 0, pk = 0, pl = 0; /* the open run's units (their first blocks), its last step */
    int dir = 0;                           /* its direction (0: one step so far) */
    bool open = false;
    for (size_t k = 0; k < s->n;) {
        size_t len = step_len(s, us, k);
        bool loss = s->ops[k].kind == MP_SCHED_LOSS;
        size_t u = loss ? 0 : us[s->ops[k].index], pu = open ? us[s->ops[pk].index] : 0;
        int step = !open || loss || seg[u] != seg[pu] ? 0 : u == pu + ul[u] ? 1 : u + ul[u] == pu ? -1 : 0;
        bool cont = open && step != 0 && (dir == 0 || dir == step) && steps_alike(s, us, pk, pl, k, len);
        if (!cont && open) {
            cut[lo] = cut[hi + ul[hi]] = true;
            open = false;
        }
        if (!loss) {
            if (!cont) {
                lo = hi = u;
                dir = 0;
                open = true;
            } else {
                dir = step;
                lo = u < lo ? u : lo;
                hi = u > hi ? u : hi;
            }
            pk = k, pl = len;
        }
        k += len;
    }
    if (open)
        cut[lo] = cut[hi + ul[hi]] = true;
    return MP_OK;
}

/* Folds m for schedule s in units us / ul / seg (make_units), the first `early` of a run never
 * folded, with cuts besides make_cuts' (extra: [N + 1], or NULL). */
static enum mp_status fold_units(const struct mp_model *m, const struct mp_schedule *s, const uint32_t *us,
                                 const uint32_t *ul, const uint32_t *seg, size_t early, const bool *extra,
                                 struct mp_fold *f, struct mp_diag *d)
{
    mp_fold_init(f);
    size_t N = m->n_blocks;
    bool *cut = calloc(N + 1, sizeof *cut);
    enum mp_status st = MP_OK;
    if (!cut)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory folding the model");
    if ((st = make_cuts(m, s, us, ul, seg, early, cut, d)) != MP_OK)
        goto out;
    for (size_t i = 0; extra && i <= N; i++)
        cut[i] |= extra[i];
    /* the short blocks: an interval of MP_FOLD_MIN_RUN or more units keeps its first, two
     * interior and its last unit; shorter ones keep all theirs */
    size_t n = 0;
    for (size_t c = 0; c < N;) {
        size_t e = c + ul[c];
        while (e < N && !cut[e])
            e += ul[c];
        n += (e - c) / ul[c] >= MP_FOLD_MIN_RUN ? 4 * ul[c] : e - c;
        c = e;
    }
    f->n_full = N;
    f->n = n;
    f->full = m;
    f->full_of = malloc((n ? n : 1) * sizeof *f->full_of);
    f->weight = malloc((n ? n : 1) * sizeof *f->weight);
    f->unit = malloc((n ? n : 1) * sizeof *f->unit);
    f->unit_len = malloc((n ? n : 1) * sizeof *f->unit_len);
    f->short_of = malloc((N ? N : 1) * sizeof *f->short_of);
    f->model = *m;
    f->model.blocks = malloc((n ? n : 1) * sizeof *f->model.blocks);
    if (!f->full_of || !f->weight || !f->unit || !f->unit_len || !f->short_of || !f->model.blocks) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory folding the model");
        goto out;
    }
    f->model.n_blocks = f->model.cap_blocks = n;
    size_t j = 0;
    for (size_t c = 0; c < N;) {
        size_t u = ul[c], e = c + u;
        while (e < N && !cut[e])
            e += u;
        size_t units = (e - c) / u, wj = 0; /* wj: the weighted unit's first short block */
        bool fold = units >= MP_FOLD_MIN_RUN;
        for (size_t k = 0; k < units; k++) {
            bool rep = !fold || k < 2 || k == units - 1; /* a unit of its own in the short model */
            if (rep || k == 2) {
                wj = j;
                for (size_t o = 0; o < u; o++, j++) {
                    f->full_of[j] = c + k * u + o;
                    f->weight[j] = rep ? 1 : (uint64_t)(units - 3);
                    f->unit[j] = (uint32_t)wj;
                    f->unit_len[j] = (uint32_t)u;
                    f->model.blocks[j] = m->blocks[c + k * u + o];
                }
            }
            for (size_t o = 0; o < u; o++)
                f->short_of[c + k * u + o] = (uint32_t)(wj + o);
        }
        if (fold)
            f->folded += (units - 4) * u;
        c = e;
    }
    /* the short schedule: each op on its short block; a run of alike steps over a weighted
     * unit's copies is one step */
    size_t count = 0, last = SIZE_MAX, last_len = 0; /* steps merged into the last step pushed */
    f->sched.offload = s->offload;
    f->sched.sac = s->sac;
    f->sched.sac_keep = s->sac_keep;
    for (size_t k = 0; k < s->n && st == MP_OK;) {
        size_t len = step_len(s, us, k);
        const struct mp_sched_op *op = &s->ops[k];
        uint32_t sj = op->kind == MP_SCHED_LOSS ? (uint32_t)n : f->short_of[op->index];
        bool weighted = op->kind != MP_SCHED_LOSS && f->weight[sj] > 1;
        if (weighted && last != SIZE_MAX && f->sched.ops[last].kind != MP_SCHED_LOSS &&
            f->unit[f->sched.ops[last].index] == f->unit[sj] && count < f->weight[sj] && last_len == len) {
            bool alike = true;
            for (size_t i = 0; i < len; i++)
                alike &= f->sched.ops[last + i].kind == s->ops[k + i].kind &&
                         f->sched.ops[last + i].index == f->short_of[s->ops[k + i].index];
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
            st = mp_schedule_push(&f->sched, s->ops[k + i].kind,
                                  s->ops[k + i].kind == MP_SCHED_LOSS ? (uint32_t)n : f->short_of[s->ops[k + i].index]);
        k += len;
    }
    if (st == MP_OK && last != SIZE_MAX && f->sched.ops[last].kind != MP_SCHED_LOSS &&
        f->weight[f->sched.ops[last].index] != count)
        st = mp_fail(d, MP_ERR_INTERNAL, "fold: the last step's run is short");
    if (st == MP_ERR_NOMEM)
        mp_fail(d, st, "out of memory folding the model");
out:
    free(cut);
    if (st != MP_OK)
        mp_fold_release(f);
    return st;
}

enum mp_status mp_fold_make(const struct mp_model *m, const struct mp_schedule *s, struct mp_fold *f,
                            struct mp_diag *d)
{
    mp_fold_init(f);
    size_t N = m->n_blocks;
    struct mp_schedule none;
    mp_schedule_init(&none);
    uint32_t *us = malloc((N ? N : 1) * sizeof *us), *ul = malloc((N ? N : 1) * sizeof *ul),
             *seg = malloc((N ? N : 1) * sizeof *seg);
    enum mp_status st = MP_OK;
    if (!us || !ul || !seg)
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory folding the model");
    else if (!s && (st = mp_ckpt_schedule_none(N, &none)) != MP_OK)
        mp_fail(d, st, "out of memory folding the model");
    if (st == MP_OK) {
        make_units(m, us, ul, seg);
        st = fold_units(m, s ? s : &none, us, ul, seg, 3, NULL, f, d);
    }
    free(us);
    free(ul);
    free(seg);
    mp_schedule_release(&none);
    return st;
}

/* ---- folds of folds ----------------------------------------------------------------------
 * A plan that checkpoints segments of S blocks over a run that repeats with period p (sqrt's)
 * cuts every run of units at each segment's ends, so a single fold keeps a few units of every
 * segment: some 9,500 blocks of gemma-3 x100,000.  But lcm(S, p) blocks from a segment's start
 * repeat exactly, blocks and schedule alike: a fold in such super-units (f1: the model's other
 * blocks units of their own) stands the run for four of them, and a fold of its short model in
 * the run's units (f2: split where a super-unit starts or ends) folds each segment inside them. */

/* The longest stretch of segments of one length S checkpointed in a row (the first forward's
 * FC ops) inside the longest run of blocks of one period p, past its first `early` units:
 * super-units of lcm(S, p) blocks from *o, *k of them.  false: none that could fold. */
static bool find_super(const struct mp_model *m, const struct mp_schedule *s, size_t early, size_t *U, size_t *o,
                       size_t *k)
{
    size_t N = m->n_blocks, rs = 0, re = 0;
    unsigned p = 0;
    for (size_t i = 0; i < N;) {
        unsigned q = m->blocks[i].repeat_group > 0 ? m->blocks[i].period : 0; /* 0: not in a run */
        size_t e = i + 1;
        while (q && e < N && m->blocks[e].period == q && m->blocks[e].repeat_group > 0)
            e++;
        if (q && q <= i && e - i > re - rs)
            rs = i, re = e, p = q;
        i = e;
    }
    if (!p)
        return false;
    size_t lo = rs - p + (early + 1) * p, last = SIZE_MAX, gap = 0, first = 0, best_len = 0;
    *k = 0;
    for (size_t t = 0; t < s->n && s->ops[t].kind != MP_SCHED_LOSS; t++) {
        size_t c = s->ops[t].index;
        if (s->ops[t].kind != MP_SCHED_FC || c < lo || c >= re)
            continue;
        if (last == SIZE_MAX || c - last != gap) { /* a new stretch: [last, c) its first segment */
            first = last == SIZE_MAX ? c : last;
            gap = last == SIZE_MAX ? 0 : c - last;
        }
        last = c;
        if (gap && c - first > best_len) {
            size_t u = gap / mp_gcd_u64(gap, p) * p;
            best_len = c - first;
            *U = u, *o = first, *k = (c - first) / u;
        }
    }
    return *U >= 2 && *k >= MP_FOLD_MIN_RUN + 2;
}

/* f: f1's short model folded by f2, counted as the full model (f1's). */
static enum mp_status compose(struct mp_fold *f1, struct mp_fold *f2, struct mp_fold *f, struct mp_diag *d)
{
    mp_fold_init(f);
    size_t n = f2->n, N = f1->n_full;
    f->n_full = N, f->n = n, f->full = f1->full;
    f->full_of = malloc((n ? n : 1) * sizeof *f->full_of);
    f->weight = malloc((n ? n : 1) * sizeof *f->weight);
    f->outer = malloc((n ? n : 1) * sizeof *f->outer);
    f->outer_len = malloc((n ? n : 1) * sizeof *f->outer_len);
    f->outer_w = malloc((n ? n : 1) * sizeof *f->outer_w);
    f->short_of = malloc((N ? N : 1) * sizeof *f->short_of);
    if (!f->full_of || !f->weight || !f->outer || !f->outer_len || !f->outer_w || !f->short_of) {
        mp_fold_release(f);
        return mp_fail(d, MP_ERR_NOMEM, "out of memory folding the model");
    }
    for (size_t j = 0; j < n; j++) {
        size_t mid = f2->full_of[j];
        f->full_of[j] = f1->full_of[mid];
        if (!mp_mul_u64(f1->weight[mid], f2->weight[j], &f->weight[j])) {
            mp_fold_release(f);
            return MP_ERR_RANGE; /* (not folded so: the caller keeps the single fold) */
        }
        f->outer[j] = f1->unit[mid];
        f->outer_len[j] = f1->unit_len[mid];
        f->outer_w[j] = f1->weight[mid];
    }
    for (size_t i = 0; i < N; i++)
        f->short_of[i] = f2->short_of[f1->short_of[i]];
    /* each f1 block an f2 short block stands for has the weight and super-unit length of the
     * one it is made from (else the product would count them wrong) */
    for (size_t mid = 0; mid < f2->n_full; mid++) {
        size_t rep = f2->full_of[f2->short_of[mid]];
        if (f1->weight[mid] != f1->weight[rep] || f1->unit_len[mid] != f1->unit_len[rep]) {
            mp_fold_release(f);
            return MP_ERR_RANGE; /* (not folded so: the caller keeps the single fold) */
        }
    }
    /* f2's short model, units, step weights and schedule are f's */
    f->model = f2->model, f->unit = f2->unit, f->unit_len = f2->unit_len, f->step_w = f2->weight;
    f->sched = f2->sched;
    f2->model.blocks = NULL, f2->unit = f2->unit_len = NULL, f2->weight = NULL;
    mp_schedule_init(&f2->sched);
    f->folded = N - n;
    return MP_OK;
}

enum mp_status mp_fold_make_nested(const struct mp_model *m, const struct mp_schedule *s, struct mp_fold *f,
                                   struct mp_diag *d)
{
    enum mp_status st = mp_fold_make(m, s, f, d);
    size_t N = m->n_blocks, U = 0, o = 0, k = 0;
    if (st != MP_OK || !s || !find_super(m, s, 3, &U, &o, &k))
        return st;
    struct mp_fold f1, f2, fn;
    mp_fold_init(&f1);
    mp_fold_init(&f2);
    mp_fold_init(&fn);
    size_t big = N + 1;
    uint32_t *us = malloc(big * sizeof *us), *ul = malloc(big * sizeof *ul), *seg = malloc(big * sizeof *seg);
    bool *split = NULL;
    if (!us || !ul || !seg) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory folding the model");
        goto out;
    }
    for (size_t i = 0; i < N; i++)
        us[i] = seg[i] = (uint32_t)i, ul[i] = 1;
    for (size_t i = o; i < o + k * U; i++)
        us[i] = (uint32_t)(o + (i - o) / U * U), ul[i] = (uint32_t)U, seg[i] = (uint32_t)o;
    if ((st = fold_units(m, s, us, ul, seg, 0, NULL, &f1, d)) != MP_OK || f1.folded == 0)
        goto out;
    /* the run's units in f1's short model, none across a super-unit's ends */
    size_t n1 = f1.n;
    split = calloc(n1 + 1, sizeof *split);
    if (!split) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory folding the model");
        goto out;
    }
    for (size_t j = 0; j < n1; j++)
        if ((f1.unit_len[j] > 1 || f1.weight[j] > 1) && f1.unit[j] == j)
            split[j] = split[j + f1.unit_len[j]] = true;
    make_units(&f1.model, us, ul, seg);
    split_units(split, n1, us, ul, seg);
    if ((st = fold_units(&f1.model, &f1.sched, us, ul, seg, 3, split, &f2, d)) != MP_OK)
        goto out;
    st = compose(&f1, &f2, &fn, d);
    if (st == MP_OK && fn.n < f->n) {
        mp_fold_release(f);
        *f = fn;
        mp_fold_init(&fn);
    }
out:
    free(us);
    free(ul);
    free(seg);
    free(split);
    mp_fold_release(&f1);
    mp_fold_release(&f2);
    mp_fold_release(&fn);
    if (st == MP_ERR_NOMEM) {
        mp_fold_release(f);
        return st;
    }
    return MP_OK; /* (a fold of a fold that cannot be made: the one fold) */
}

/* Level 0: the units of f's schedule steps; level 1 (nested folds only): the super-units. */
static const uint32_t *lv_unit(const struct mp_fold *f, int level) { return level ? f->outer : f->unit; }
static const uint32_t *lv_len(const struct mp_fold *f, int level) { return level ? f->outer_len : f->unit_len; }

int mp_fold_levels(const struct mp_fold *f) { return f->outer ? 2 : 1; }

bool mp_fold_same_unit(const struct mp_fold *f, int level, uint32_t a, uint32_t b)
{
    const uint32_t *u = lv_unit(f, level);
    return a < f->n && b < f->n && u[a] == u[b];
}

size_t mp_fold_step_len(const struct mp_fold *f, int level, size_t k)
{
    const struct mp_schedule *s = &f->sched;
    size_t e = k + 1;
    while (e < s->n && s->ops[k].kind != MP_SCHED_LOSS && s->ops[e].kind != MP_SCHED_LOSS &&
           mp_fold_same_unit(f, level, s->ops[e].index, s->ops[k].index))
        e++;
    return e - k;
}

bool mp_fold_unit_before(const struct mp_fold *f, int level, uint32_t a, uint32_t b)
{
    const uint32_t *u = lv_unit(f, level), *ul = lv_len(f, level);
    return a < f->n && b < f->n && ul[a] == ul[b] && u[a] + ul[a] == u[b];
}

uint64_t mp_fold_step_weight(const struct mp_fold *f, int level, uint32_t j)
{
    if (j >= f->n)
        return 1;
    return level ? f->outer_w[j] : f->step_w ? f->step_w[j] : f->weight[j];
}

uint32_t mp_fold_unit_len(const struct mp_fold *f, int level, uint32_t j)
{
    return j < f->n ? lv_len(f, level)[j] : 1;
}

bool mp_fold_steps_agree(const struct mp_fold *f, int level, const uint64_t *sig)
{
    const struct mp_schedule *fs = &f->sched;
    for (size_t k = 0, len; k < fs->n; k += len) {
        const struct mp_sched_op *op = &fs->ops[k];
        len = mp_fold_step_len(f, level, k);
        if (op->kind == MP_SCHED_LOSS || mp_fold_step_weight(f, level, op->index) <= 1)
            continue;
        /* the same step on the unit before (the first interior one): just before or after */
        size_t k1 = k >= len && fs->ops[k - len].kind != MP_SCHED_LOSS &&
                            mp_fold_unit_before(f, level, fs->ops[k - len].index, op->index)
                        ? k - len
                        : k + len;
        if (k1 + len > fs->n || mp_fold_step_len(f, level, k1) != len)
            return false;
        if (k1 > 0 && fs->ops[k1 - 1].kind != MP_SCHED_LOSS && fs->ops[k1].kind != MP_SCHED_LOSS &&
            mp_fold_same_unit(f, level, fs->ops[k1 - 1].index, fs->ops[k1].index))
            return false; /* not a whole step */
        if (sig[k1] != sig[k])
            return false;
        /* op for op, the same kind a unit's length of full blocks before */
        uint32_t ul = lv_len(f, level)[op->index];
        for (size_t i = 0; i < len; i++)
            if (fs->ops[k1 + i].kind != fs->ops[k + i].kind || fs->ops[k1 + i].kind == MP_SCHED_LOSS ||
                f->full_of[fs->ops[k1 + i].index] + ul != f->full_of[fs->ops[k + i].index])
                return false;
    }
    return true;
}

void mp_fold_mark_chain(const struct mp_model *m, struct mp_chain *c)
{
    for (size_t i = 0; i < c->L && i < m->n_blocks; i++) {
        c->repeated[i] = m->blocks[i].repeat_group > 0;
        c->gc_before[i] = m->blocks[i].gc_before;
    }
}

bool mp_fold_expand_chain(const struct mp_fold *f, const struct mp_chain *sc, struct mp_chain *c,
                          enum mp_status *st)
{
    *st = MP_OK;
    size_t n = f->n, N = f->n_full;
    if (sc->L != n)
        return false;
    for (size_t j = 0; j < n; j++) { /* an interval's two interior units must agree */
        size_t u = f->unit_len[j];
        if (f->weight[j] > 1 &&
            (j < u || sc->f[j] != sc->f[j - u] || sc->b[j] != sc->b[j - u] || sc->x[j] != sc->x[j - u] ||
             sc->x[j + 1] != sc->x[j + 1 - u] || sc->xb[j + 1] != sc->xb[j + 1 - u] || sc->ft[j] != sc->ft[j - u] ||
             sc->bt[j] != sc->bt[j - u]))
            return false;
    }
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
    /* --ep: a stack of E / ep experts stands for E (the others' ep - 1 times its size) */
    uint64_t others = p->opts.ep > 1 ? p->opts.ep - 1 : 0;
    *total = p->total_params, *trainable = 0, *adapter = p->adapter_params;
    for (size_t j = 0; ok && j < f->n && j < p->n_blocks; j++) {
        const struct mp_block_prog *bp = &p->blocks[j];
        uint64_t w = f->weight[j], adapter_j = 0, other_j = 0;
        for (size_t q = bp->param0; q < bp->param0 + bp->n_params; q++) {
            adapter_j += p->params[q].adapter ? p->params[q].elems : 0;
            ok = ok && (!p->params[q].stacked || (mp_mul_u64(p->params[q].elems, others, &x) &&
                                                  mp_add_u64(other_j, x, &other_j)));
        }
        ok = ok && mp_add_u64(bp->params, other_j, &x) && mp_mul_u64(x, w - 1, &x) && mp_add_u64(*total, x, total) &&
             mp_mul_u64(adapter_j, w - 1, &x) && mp_add_u64(*adapter, x, adapter);
    }
    for (size_t q = 0; ok && q < p->n_params; q++) {
        const struct mp_param *pa = &p->params[q];
        uint64_t n = pa->elems;
        ok = (!pa->stacked || (mp_mul_u64(pa->elems, others, &x) && mp_add_u64(n, x, &n))) &&
             (!(pa->trainable || pa->idle) ||
              (mp_mul_u64(n, mp_fold_weight(f, pa->block), &x) && mp_add_u64(*trainable, x, trainable)));
    }
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
