/* chain.c — the chain for the checkpoint planner (replay.h). */
#include "replay.h"

#include <stdlib.h>

/* ---- the chain for the checkpoint planner ----------------------------------------------------- */

struct chain_meter {
    uint64_t cur, peak;       /* activation bytes only (ACT, GRAD, TMP), unrounded */
    bool overflow;            /* they left 64 bits */
    uint64_t *begin, *end, *peak_in; /* per schedule op */
    size_t n_ops;
};

static enum mp_status chain_event(void *ctx, const struct mp_event *ev)
{
    struct chain_meter *m = ctx;
    if (ev->kind == MP_EV_OP_BEGIN && (size_t)ev->id < m->n_ops) {
        m->begin[ev->id] = m->cur;
        m->peak = m->cur;
        return MP_OK;
    }
    if (ev->kind == MP_EV_OP_END && (size_t)ev->id < m->n_ops) {
        m->end[ev->id] = m->cur;
        m->peak_in[ev->id] = m->peak;
        return MP_OK;
    }
    if (ev->kind != MP_EV_ALLOC && ev->kind != MP_EV_FREE)
        return MP_OK;
    if (ev->store != MP_ST_ACT && ev->store != MP_ST_GRAD && ev->store != MP_ST_TMP)
        return MP_OK;
    if (ev->kind == MP_EV_ALLOC) {
        if (!mp_add_u64(m->cur, ev->bytes, &m->cur)) {
            m->overflow = true;
            return MP_ERR_RANGE;
        }
        if (m->cur > m->peak)
            m->peak = m->cur;
    } else {
        m->cur -= ev->bytes;
    }
    return MP_OK;
}

void mp_estimate_chain_mark(const struct mp_program *p, struct mp_chain *c)
{
    for (size_t i = 0; i < c->L && i < p->n_blocks; i++) {
        c->repeated[i] = p->model->blocks[i].repeat_group > 0;
        c->gc_before[i] = p->model->blocks[i].gc_before;
    }
}

/* One replay of the no-checkpoint schedule (Fe_0..Fe_{L-1}, Loss, B_{L-1}..B_0)
 * with a meter that snapshots at op boundaries: xb_{i+1} = growth over Fe_i,
 * ft_i = peak inside Fe_i above its end, bt_i = peak inside B_i above (its start
 * + y_i).  Sizes are unrounded bytes; costs are FLOPs. */
enum mp_status mp_estimate_chain(const struct mp_program *p, struct mp_chain *c, struct mp_diag *d)
{
    size_t L = p->n_blocks;
    enum mp_status st = mp_chain_init(c, L);
    if (st != MP_OK)
        return mp_fail(d, st, "out of memory");
    struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
    struct mp_schedule none;
    mp_schedule_init(&none);
    struct chain_meter m = {0};
    m.n_ops = 2 * L + 1;
    m.begin = calloc(m.n_ops, sizeof *m.begin);
    m.end = calloc(m.n_ops, sizeof *m.end);
    m.peak_in = calloc(m.n_ops, sizeof *m.peak_in);
    if (!m.begin || !m.end || !m.peak_in || mp_ckpt_schedule_none(L, &none) != MP_OK) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory");
        goto out;
    }
    st = mp_replay(p, &none, &t, chain_event, &m, d);
    if (st == MP_ERR_RANGE && m.overflow)
        st = mp_fail(d, st, "%s: the step's activations need more than 16 EiB (2^64 bytes) at once; use a smaller "
                     "--batch or --seq", p->model->path);
    if (st != MP_OK)
        goto out;
    for (size_t i = 0; i <= L; i++)
        c->x[i] = i < L ? p->tensors[p->blocks[i].input].bytes : p->tensors[p->blocks[L - 1].output].bytes;
    c->x[0] += p->labels >= 0 ? p->tensors[p->labels].bytes : 0;
    c->x[0] += p->ids >= 0 ? p->tensors[p->ids].bytes : 0; /* --images */
    c->x[0] += p->type_ids >= 0 ? p->tensors[p->type_ids].bytes : 0;
    mp_estimate_chain_mark(p, c);
    c->xb[0] = c->x[0];
    for (size_t i = 0; i < L; i++) {
        c->f[i] = p->blocks[i].fwd_flops;
        c->b[i] = p->blocks[i].bwd_flops;
        /* a block can free more than it keeps (a small head that frees the last hidden state) */
        uint64_t grow = m.end[i] > m.begin[i] ? m.end[i] - m.begin[i] : 0;
        c->xb[i + 1] = mp_max_u64(grow, c->x[i + 1]);
        c->ft[i] = m.peak_in[i] > m.end[i] ? m.peak_in[i] - m.end[i] : 0;
        size_t bpos = L + 1 + (L - 1 - i);
        const struct mp_tensor *xi = &p->tensors[p->blocks[i].input];
        uint64_t yi = (i > 0 && xi->needs_grad) ? xi->bytes : 0;
        uint64_t base; /* (beyond 64 bits: nothing is above it) */
        if (!mp_add_u64(m.begin[bpos], yi, &base))
            base = UINT64_MAX;
        c->bt[i] = m.peak_in[bpos] > base ? m.peak_in[bpos] - base : 0;
    }
    c->b[L] = 0;
    {
        uint64_t base;
        if (!mp_add_u64(m.begin[L], c->x[L], &base))
            base = UINT64_MAX;
        c->bt[L] = m.peak_in[L] > base ? m.peak_in[L] - base : 0;
    }
out:
    mp_schedule_release(&none);
    free(m.begin);
    free(m.end);
    free(m.peak_in);
    if (st != MP_OK)
        mp_chain_release(c);
    return st;
}
