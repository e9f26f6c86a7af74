/* fold_count.c — a fold's short program counted as the full model, and the full model's figures from it
 * (replay.h). */
#include "replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Mixes a word into the op's hash.  Each word's step (xor, odd multiply, xor-shift) is one-to-one
 * on the hash, so two ops whose events differ in one word always hash apart (the bytewise FNV-1a
 * it replaces took eight serial multiplies a word: a tenth of suggest's time on long folds). */
static void fold_hash(struct fold_meter *m, uint64_t v)
{
    for (int l = 0; l < m->levels; l++)
        if (m->lv[l].on) {
            uint64_t h = (m->lv[l].h ^ v) * 0x9E3779B97F4A7C15ULL;
            m->lv[l].h = h ^ (h >> 29);
        }
}

/* base + k x delta + extra, in 64 bits: false when it leaves them */
static bool fold_affine(uint64_t base, uint64_t k, int64_t delta, int64_t extra, uint64_t *out)
{
    uint64_t ad = delta < 0 ? 0 - (uint64_t)delta : (uint64_t)delta, ae = extra < 0 ? 0 - (uint64_t)extra : (uint64_t)extra;
    uint64_t m, v = base;
    if (!mp_mul_u64(k, ad, &m))
        return false;
    if (delta >= 0 ? !mp_add_u64(v, m, &v) : m > v)
        return false;
    if (delta < 0)
        v -= m;
    if (extra >= 0 ? !mp_add_u64(v, ae, &v) : ae > v)
        return false;
    if (extra < 0)
        v -= ae;
    *out = v;
    return true;
}

/* How many of its kind the event's parameter, tensor or node stands for. */
static uint64_t fold_entity_weight(const struct counter *c, const struct mp_event *ev)
{
    const struct mp_program *p = c->p;
    int b = -1;
    switch (ev->store) {
    case MP_ST_OPT_TMP:
        if (!c->fm->per_param_opt)
            return 1; /* one temporary, the size of the largest gradient */
        /* fall through */
    case MP_ST_PARAM:
    case MP_ST_OPT_STATE:
    case MP_ST_PGRAD: b = ev->id >= 0 && (size_t)ev->id < p->n_params ? p->params[ev->id].block : -1; break;
    case MP_ST_INPUT:
    case MP_ST_ACT:
    case MP_ST_GRAD: b = ev->id >= 0 && (size_t)ev->id < p->n_tensors ? p->tensors[ev->id].block : -1; break;
    case MP_ST_TMP: b = ev->id >= 0 && (size_t)ev->id < p->n_nodes ? p->nodes[ev->id].block : -1; break;
    case MP_ST_COMM: {
        /* a group's buffers (FSDP2 / ZeRO-3) stand for its copies; buckets and partitions are
         * the full model's already (mp_par_plan_make_weighted) */
        size_t g = (size_t)ev->id / MP_COMM_KINDS, k = (size_t)ev->id % MP_COMM_KINDS;
        bool per_group = k == MP_COMM_AG_OUT || k == MP_COMM_COPY_IN || k == MP_COMM_UNSHARD ||
                         k == MP_COMM_RS_IN || k == MP_COMM_RS_OUT;
        const struct mp_par_plan *pp = c->fm->pp;
        return per_group && pp && pp->group_weight && g < pp->n_groups ? pp->group_weight[g] : 1;
    }
    default: break;
    }
    return mp_fold_weight(c->fm->f, b);
}

/* A high point of the replay (cur at pk, requested bytes at pr, made by the attributed event, in
 * the copy `shift` full blocks above its short block): the innermost open weighted step above
 * `level` keeps it, relative to its start, else it is the step's peak if higher. */
static void fold_high(struct counter *c, struct fold_meter *m, int level, uint64_t pk, uint64_t pr,
                      enum mp_phase phase, int node, enum mp_store store, int id, uint64_t shift)
{
    for (int l = level; l < m->levels; l++) {
        struct fold_step *s = &m->lv[l];
        if (!s->on || s->w <= 1)
            continue;
        int64_t lc = (int64_t)(pk - s->b_cur), lr = (int64_t)(pr - s->b_req);
        if (!s->l_has || lc > s->l_max) {
            s->l_max = lc;
            s->l_phase = phase, s->l_node = node, s->l_store = store, s->l_id = id;
            s->l_shift = shift;
        }
        if (!s->l_has || lr > s->l_req)
            s->l_req = lr;
        s->l_has = true;
        return;
    }
    if (pk > c->peak) {
        c->peak = pk;
        c->peak_phase = phase, c->peak_node = node, c->peak_store = store, c->peak_id = id;
        m->peak_shift = shift;
    }
    if (pr > c->peak_req)
        c->peak_req = pr;
}

/* Opens level l's step at op k (a forward or backward on short block j). */
static void fold_open(struct counter *c, struct fold_meter *m, int l, size_t k, uint32_t j)
{
    const struct mp_fold *f = m->f;
    const struct mp_schedule *fs = &f->sched;
    struct fold_step *s = &m->lv[l];
    s->on = true;
    s->op = k;
    s->w = mp_fold_step_weight(f, l, j);
    /* a run down the units (a backward) meets the unit before, the first interior one, next */
    size_t e = k + mp_fold_step_len(f, l, k);
    s->desc = s->w > 1 && e < fs->n && fs->ops[e].kind != MP_SCHED_LOSS && mp_fold_unit_before(f, l, fs->ops[e].index, j);
    s->h = 1469598103934665603ULL;
    s->b_cur = c->cur, s->b_req = c->cur_req, s->b_act = c->act_cur;
    s->l_has = false;
}

/* Closes level l's step: its runs on the copies it stands for, one after another. */
static enum mp_status fold_close(struct counter *c, struct fold_meter *m, int l, uint32_t j)
{
    struct fold_step *s = &m->lv[l];
    s->on = false;
    m->sig[l][s->op] = s->h;
    uint64_t w = s->w;
    if (w <= 1)
        return MP_OK;
    int64_t dc = (int64_t)(c->cur - s->b_cur), dr = (int64_t)(c->cur_req - s->b_req), da = (int64_t)(c->act_cur - s->b_act);
    uint64_t pk = 0, pr = 0;
    uint64_t kc = dc > 0 ? w - 1 : 0, kr = dr > 0 ? w - 1 : 0;
    if (s->l_has && (!fold_affine(s->b_cur, kc, dc, s->l_max, &pk) || !fold_affine(s->b_req, kr, dr, s->l_req, &pr)))
        m->overflow = true;
    if (!fold_affine(s->b_cur, w, dc, 0, &c->cur) || !fold_affine(s->b_req, w, dr, 0, &c->cur_req) ||
        !fold_affine(s->b_act, w, da, 0, &c->act_cur))
        m->overflow = true;
    if (m->overflow)
        return MP_ERR_RANGE;
    if (s->l_has) { /* the copy the high point is in: its offset from the short unit's, in units */
        uint64_t rep = s->desc ? w - 1 - kc : kc, shift;
        if (!mp_mul_u64(rep, mp_fold_unit_len(m->f, l, j), &shift) || !mp_add_u64(shift, s->l_shift, &shift)) {
            m->overflow = true;
            return MP_ERR_RANGE;
        }
        fold_high(c, m, l + 1, pk, pr, s->l_phase, s->l_node, s->l_store, s->l_id, shift);
    }
    return MP_OK;
}

static enum mp_status fold_event(void *ctx, const struct mp_event *ev)
{
    struct counter *c = ctx;
    struct fold_meter *m = c->fm;
    const struct mp_fold *f = m->f;
    const struct mp_schedule *fs = &f->sched;
    if (ev->kind == MP_EV_OP_BEGIN) {
        size_t k = (size_t)ev->id;
        const struct mp_sched_op *op = &fs->ops[k];
        m->in_blocks = op->kind != MP_SCHED_LOSS;
        if (!m->in_blocks)
            return MP_OK;
        bool cont = k > 0 && fs->ops[k - 1].kind != MP_SCHED_LOSS; /* the op before was a block's */
        for (int l = m->levels - 1; l >= 0; l--) /* outer steps open first */
            if (!cont || !mp_fold_same_unit(f, l, fs->ops[k - 1].index, op->index))
                fold_open(c, m, l, k, op->index);
        return MP_OK;
    }
    if (ev->kind == MP_EV_OP_END) {
        size_t k = (size_t)ev->id;
        const struct mp_sched_op *op = &fs->ops[k];
        if (op->kind == MP_SCHED_LOSS)
            return MP_OK;
        bool cont = k + 1 < fs->n && fs->ops[k + 1].kind != MP_SCHED_LOSS; /* a block's op follows */
        for (int l = 0; l < m->levels; l++) /* inner steps close first */
            if (!cont || !mp_fold_same_unit(f, l, fs->ops[k + 1].index, op->index)) {
                if (l == 0)
                    m->in_blocks = false;
                enum mp_status st = fold_close(c, m, l, op->index);
                if (st != MP_OK)
                    return st;
            }
        return MP_OK;
    }
    if (ev->kind == MP_EV_LOSS_GRAD && !c->have_loss) {
        c->have_loss = true;
        c->act_at_loss = c->act_cur;
    }
    if (ev->kind != MP_EV_ALLOC && ev->kind != MP_EV_FREE)
        return MP_OK;
    fold_hash(m, (uint64_t)ev->kind << 8 | (uint64_t)ev->store);
    fold_hash(m, ev->bytes);
    uint64_t w = m->in_blocks ? 1 : fold_entity_weight(c, ev), r = 0, q = ev->bytes;
    if (!round512(ev->bytes, &r) || (w != 1 && (!mp_mul_u64(r, w, &r) || !mp_mul_u64(q, w, &q)))) {
        m->overflow = true;
        return MP_ERR_RANGE;
    }
    bool act = ev->store == MP_ST_ACT || ev->store == MP_ST_GRAD || ev->store == MP_ST_TMP;
    if (ev->kind == MP_EV_FREE) {
        c->cur -= r;
        c->cur_req -= q;
        if (act)
            c->act_cur -= r;
        return MP_OK;
    }
    if (!mp_add_u64(c->cur, r, &c->cur) || !mp_add_u64(c->cur_req, q, &c->cur_req) ||
        (act && !mp_add_u64(c->act_cur, r, &c->act_cur))) {
        m->overflow = true;
        return MP_ERR_RANGE;
    }
    fold_high(c, m, 0, c->cur, c->cur_req, ev->phase, ev->node, ev->store, ev->id, 0);
    return MP_OK;
}

/* ---- the full model's figures from its fold (fold.h) -------------------------------------------- */

static bool fold_mul(uint64_t a, uint64_t w, uint64_t *acc)
{
    uint64_t m;
    return mp_mul_u64(a, w, &m) && mp_add_u64(*acc, m, acc);
}

/* Can fold f's short program p stand for the full model (before its replay)?  Each weighted
 * block must be a verified copy (tensors a model hands to many blocks, T5's, are outside the
 * copies: made by an unweighted block and held as in the full replay). */
static bool fold_admits(const struct mp_fold *f, const struct mp_program *p)
{
    return mp_fold_copied(f, p);
}

/* The data-parallel plan of the full model from f's short program p (none on one GPU). */
static enum mp_status fold_par_plan(const struct mp_fold *f, const struct mp_program *p,
                                    const struct mp_train_opts *t, struct mp_par_plan *pp, bool *made,
                                    struct mp_diag *d)
{
    *made = t->par && t->par->strategy != MP_PAR_NONE;
    if (!*made)
        return MP_OK;
    enum mp_status st = mp_par_plan_make_weighted(t->par, p, t->optimizer, f->weight, pp, d);
    *made = st == MP_OK;
    return st;
}

/* The full model's static figures from f's short program p (pp: the weighted data-parallel plan,
 * or NULL on one GPU). */
static enum mp_status fold_static(const struct mp_fold *f, const struct mp_program *p, const struct mp_train_opts *t,
                                  const struct mp_par_plan *pp, struct mp_estimate *e, struct mp_diag *d)
{
    memset(e, 0, sizeof *e);
    uint64_t total_grad = 0, largest = 0, adapter, muon = 0, adamw = 0;
    enum mp_dtype ldt = MP_DT_F32;
    bool ok = mp_fold_counts(f, p, &e->params, &e->trainable_params, &adapter);
    for (size_t q = 0; q < p->n_params; q++) {
        const struct mp_param *pq = &p->params[q];
        uint64_t w = mp_fold_weight(f, pq->block), g = mp_param_grad_bytes(pq);
        ok = ok && fold_mul(pq->raw_bytes, w, &e->weights_bytes) && fold_mul(g, w, &e->grads_bytes) &&
             fold_mul(mp_opt_state_bytes(p, t->optimizer, pq), w, &e->optimizer_bytes) && fold_mul(g, w, &total_grad);
        mp_opt_largest(pq, &largest, &ldt);
        mp_opt_muon_add(pq, w, &muon, &adamw);
    }
    double passes = mp_fwd_passes(p->opts.trainer, t);
    for (size_t j = 0; j < p->n_blocks; j++) {
        e->fwd_flops += (double)f->weight[j] * p->blocks[j].fwd_flops * passes;
        e->bwd_flops += (double)f->weight[j] * p->blocks[j].bwd_flops;
        e->dequant_bytes += (double)f->weight[j] * p->blocks[j].dequant_bytes * (passes + 1.0);
    }
    if (!ok || !inputs_bytes(p, e))
        return mp_fail(d, MP_ERR_RANGE, "%s: sizes overflow 64 bits", p->model->path);
    enum mp_status wst = workspaces_into(p, t, e, d);
    if (wst != MP_OK)
        return wst;
    e->optimizer_tmp_bytes = mp_opt_step_tmp_of(t->optimizer, total_grad, largest, ldt, muon, adamw);
    e->world = 1;
    if (pp)
        par_static(pp, t, e);
    return static_total(p, e, d);
}

enum mp_status mp_estimate_static_folded(const struct mp_fold *f, const struct mp_program *p,
                                         const struct mp_train_opts *t, struct mp_estimate *e, bool *holds,
                                         struct mp_diag *d)
{
    memset(e, 0, sizeof *e);
    *holds = fold_admits(f, p) && t->ref == MP_REF_NONE && !t->gen_steps && !t->old_logps; /* (DPO's reference pass:
                                                                                                  the whole model) */
    if (!*holds)
        return MP_OK;
    struct mp_par_plan pp;
    bool made;
    enum mp_status st = fold_par_plan(f, p, t, &pp, &made, d);
    if (st == MP_OK)
        st = fold_static(f, p, t, made ? &pp : NULL, e, d);
    if (made)
        mp_par_plan_release(&pp);
    return st;
}

enum mp_status mp_estimate_run_folded(const struct mp_fold *f, const struct mp_program *p,
                                      const struct mp_schedule *full, const struct mp_train_opts *t,
                                      uint64_t context_bytes, const struct mp_chain *chain, struct mp_estimate *e,
                                      bool *holds, struct mp_diag *d)
{
    *holds = false;
    memset(e, 0, sizeof *e);
    if (!fold_admits(f, p) || t->ref != MP_REF_NONE || t->gen_steps || t->old_logps) /* (no-grad passes: the whole
                                                                                         model) */
        return MP_OK;
    uint64_t nodes = p->n_nodes;
    for (size_t j = 0; j < f->n; j++)
        if (!fold_mul(p->blocks[j].n_nodes, f->weight[j] - 1, &nodes))
            return MP_OK;
    if (!t->skip_reserved && nodes <= MP_ASIM_MAX_NODES)
        return MP_OK; /* the full model is small enough for the allocator model: replay it */
    struct mp_par_plan pp;
    bool made;
    enum mp_status st = fold_par_plan(f, p, t, &pp, &made, d);
    if (st == MP_OK)
        st = fold_static(f, p, t, made ? &pp : NULL, e, d);
    struct fold_meter m = {.f = f, .levels = mp_fold_levels(f),
                           .per_param_opt = mp_optimizer_tmp(t->optimizer) == MP_OPT_TMP_ALL_GRADS,
                           .pp = made ? &pp : NULL};
    for (int l = 0; l < m.levels && st == MP_OK; l++)
        if (!(m.sig[l] = calloc(f->sched.n ? f->sched.n : 1, sizeof *m.sig[l])))
            st = mp_fail(d, MP_ERR_NOMEM, "out of memory");
    struct counter c = {.p = p, .peak_node = -1, .no_asim = true, .fm = &m};
    if (st == MP_OK)
        st = replay_plan(p, &f->sched, t, m.pp, fold_event, &c, d);
    if (made)
        mp_par_plan_release(&pp);
    if (st == MP_ERR_RANGE && m.overflow)
        st = peak_overflow(p, t, d);
    /* the step on an interval's first interior unit and the one on its second, weighted, unit
     * must have made the same events */
    bool agree = st == MP_OK;
    for (int l = 0; l < m.levels; l++) {
        agree = agree && mp_fold_steps_agree(f, l, m.sig[l]);
        free(m.sig[l]);
    }
    if (st != MP_OK || !agree) {
        mp_estimate_release(e);
        return st;
    }
    e->peak_allocated_bytes = c.peak;
    e->peak_requested_bytes = c.peak_req;
    e->peak_reserved_bytes = c.peak;
    e->activations_bytes = c.act_at_loss;
    e->vllm_bytes = t->vllm_bytes;
    if ((st = device_peak(p, context_bytes, e, d)) != MP_OK) {
        mp_estimate_release(e);
        return st;
    }
    e->peak_phase = c.peak_phase;
    if (c.peak_node >= 0 && c.peak_store == MP_ST_COMM) { /* as mp_estimate_run_chain names it */
        const struct mp_node *n = &p->nodes[c.peak_node];
        snprintf(e->peak_event, sizeof e->peak_event, "%s:%s %s", mp_phase_str(c.peak_phase),
                 n->block >= 0 ? f->full->blocks[f->full_of[n->block] + m.peak_shift].name : n->name,
                 mp_comm_kind_str((enum mp_comm_kind)(c.peak_id % MP_COMM_KINDS)));
    } else if (c.peak_store == MP_ST_COMM) {
        snprintf(e->peak_event, sizeof e->peak_event, "%s:%s", mp_phase_str(c.peak_phase),
                 mp_comm_kind_str((enum mp_comm_kind)(c.peak_id % MP_COMM_KINDS)));
    } else if (c.peak_node >= 0) {
        /* the node's name with its short block's name replaced by the full block's */
        const struct mp_node *n = &p->nodes[c.peak_node];
        const char *bn = n->block >= 0 ? f->model.blocks[n->block].name : "";
        size_t fb = n->block >= 0 ? f->full_of[n->block] + m.peak_shift : 0, len = strlen(bn);
        if (n->block >= 0 && m.peak_shift && strncmp(n->name, bn, len) == 0)
            snprintf(e->peak_event, sizeof e->peak_event, "%s:%s%s", mp_phase_str(c.peak_phase),
                     f->full->blocks[fb].name, n->name + len);
        else
            snprintf(e->peak_event, sizeof e->peak_event, "%s:%s", mp_phase_str(c.peak_phase), n->name);
    } else {
        snprintf(e->peak_event, sizeof e->peak_event, "%s", mp_phase_str(c.peak_phase));
    }
    name_load_peak(e);
    /* recompute: forwards the full schedule runs beyond one per block */
    size_t N = f->n_full;
    bool *ran = calloc(N ? N : 1, sizeof *ran), *ckpt = calloc(N ? N : 1, sizeof *ckpt);
    if (!ran || !ckpt) {
        free(ran);
        free(ckpt);
        mp_estimate_release(e);
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    }
    for (size_t k = 0; full && k < full->n; k++) {
        const struct mp_sched_op *op = &full->ops[k];
        if (op->kind != MP_SCHED_FN && op->kind != MP_SCHED_FC && op->kind != MP_SCHED_FE)
            continue;
        if (ran[op->index]) {
            e->recompute_flops += p->blocks[f->short_of[op->index]].fwd_flops -
                                  replay_sac_recompute(p, full, f->short_of[op->index], e);
            if (k + 1 < full->n && full->ops[k + 1].kind == MP_SCHED_B && full->ops[k + 1].index == op->index)
                e->recompute_flops -= replay_stop_skips(p, full, f->short_of[op->index]); /* (fwd_block) */
            e->dequant_bytes += p->blocks[f->short_of[op->index]].dequant_bytes;
        }
        else if (op->kind != MP_SCHED_FE)
            ckpt[op->index] = true;
        ran[op->index] = true;
    }
    free(ran);
    if (chain) { /* per block: each full block has its short block's figures */
        e->n_blocks = N;
        e->blocks = calloc(N ? N : 1, sizeof *e->blocks);
        if (!e->blocks) {
            free(ckpt);
            return mp_fail(d, MP_ERR_NOMEM, "out of memory");
        }
        for (size_t j = 0; j < f->n; j++) /* each short block's figures, then copied */
            block_est(p, t, j, 0, &e->blocks[f->full_of[j]]);
        for (size_t i = 0; i < N; i++) {
            e->blocks[i] = e->blocks[f->full_of[f->short_of[i]]];
            e->blocks[i].activation_bytes = chain->xb[i + 1];
            e->blocks[i].checkpointed = ckpt[i];
        }
    }
    free(ckpt);
    *holds = true;
    return MP_OK;
}
