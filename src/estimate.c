/* estimate.c — the step replay (alloc/free/compute events) and the estimator.
 *
 * Liveness follows autograd: a tensor lives while a later forward node still
 * reads it, while a node that saved it has not run backward, or while the
 * chain holds it (a block's output until the next block consumes it; a
 * checkpointed block input until that block's backward, as in rotor's model).
 * Gradients of activations appear when their consumer's backward runs and die
 * after their producer's backward; parameter gradients live until zero_grad.
 * The estimator's visitor sums 512-byte-rounded sizes (max_memory_allocated)
 * and feeds a model of PyTorch's caching allocator for reserved bytes.
 */
#include "estimate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *mp_phase_str(enum mp_phase ph)
{
    static const char *n[] = {"setup", "forward", "loss", "recompute", "backward", "optimizer.step", "end"};
    return (unsigned)ph <= MP_PH_END ? n[ph] : "?";
}

void mp_train_opts_default(struct mp_train_opts *o)
{
    o->optimizer = MP_OPT_ADAMW;
    o->cublas_workspace_bytes = 8519680; /* :4096:2:16:8 (memory-facts §8); 32 MiB on sm90 */
    o->accumulate = false;
}

/* ---- optimizer state ------------------------------------------------------------------ */

uint64_t mp_opt_state_bytes(const struct mp_program *p, enum mp_optimizer o, const struct mp_param *q)
{
    uint64_t s = mp_dtype_size(p->param_dtype), n = q->elems;
    switch (o) {
    case MP_OPT_SGD: return 0;
    case MP_OPT_SGD_MOMENTUM: return n * s;
    case MP_OPT_ADAM:
    case MP_OPT_ADAMW: return 2 * n * s;
    case MP_OPT_ADAFACTOR:
        /* torch.optim.Adafactor: row + column variance factors for matrices, full variance otherwise */
        return q->matrix ? (q->rows + q->cols) * s : n * s;
    case MP_OPT_ADAM8BIT:
        /* bitsandbytes: two uint8 states + one fp32 absmax per 256-element block per state;
         * tensors under min_8bit_size (4096) keep fp32 states */
        if (n < 4096)
            return 2 * n * 4;
        return 2 * n + 2 * 4 * mp_ceil_div(n, 256);
    }
    return 0;
}

uint64_t mp_opt_step_tmp_bytes(const struct mp_program *p, enum mp_optimizer o)
{
    uint64_t s = mp_dtype_size(p->param_dtype), total = 0, largest = 0;
    for (size_t i = 0; i < p->n_params; i++) {
        total += p->params[i].elems;
        largest = mp_max_u64(largest, p->params[i].elems);
    }
    switch (o) {
    case MP_OPT_ADAM:
    case MP_OPT_ADAMW: return total * s; /* _foreach_sqrt(exp_avg_sqs) over the whole group */
    case MP_OPT_ADAFACTOR: return largest * s;
    default: return 0;
    }
}

/* ---- replay ------------------------------------------------------------------------------- */

struct rp {
    const struct mp_program *p;
    const struct mp_train_opts *t;
    mp_event_fn fn;
    void *ctx;
    struct mp_diag *d;
    enum mp_status st;
    enum mp_phase phase;
    int node;
    bool *live, *glive, *pglive, *is_input;
    int *uses, *saved, *holds;
    bool *ckpt; /* per block: its input is held as a checkpoint (Fc) until its backward */
};

static void emit(struct rp *r, enum mp_ev_kind k, enum mp_store s, int id, uint64_t bytes)
{
    if (r->st != MP_OK)
        return;
    struct mp_event ev = {.kind = k, .store = s, .id = id, .node = r->node, .bytes = bytes, .phase = r->phase};
    r->st = r->fn(r->ctx, &ev);
}

static void emit_fwd(struct rp *r, int node, bool grad)
{
    if (r->st != MP_OK)
        return;
    struct mp_event ev = {.kind = MP_EV_FWD, .store = MP_ST_TMP, .id = node, .node = node, .phase = r->phase,
                          .grad_mode = grad};
    r->st = r->fn(r->ctx, &ev);
}

static void t_alloc(struct rp *r, int t)
{
    if (t < 0 || r->live[t])
        return;
    r->live[t] = true;
    emit(r, MP_EV_ALLOC, MP_ST_ACT, t, r->p->tensors[t].bytes);
}

static void t_maybe_free(struct rp *r, int t)
{
    if (t < 0 || !r->live[t] || r->is_input[t] || r->uses[t] > 0 || r->saved[t] > 0 || r->holds[t] > 0)
        return;
    r->live[t] = false;
    emit(r, MP_EV_FREE, MP_ST_ACT, t, r->p->tensors[t].bytes);
}

static void g_alloc(struct rp *r, int t)
{
    if (t < 0 || r->glive[t] || !r->p->tensors[t].needs_grad || r->is_input[t])
        return;
    r->glive[t] = true;
    emit(r, MP_EV_ALLOC, MP_ST_GRAD, t, r->p->tensors[t].bytes);
}

static void g_free(struct rp *r, int t)
{
    if (t < 0 || !r->glive[t])
        return;
    r->glive[t] = false;
    emit(r, MP_EV_FREE, MP_ST_GRAD, t, r->p->tensors[t].bytes);
}

static void tmp(struct rp *r, int node, uint64_t bytes, bool alloc)
{
    if (bytes)
        emit(r, alloc ? MP_EV_ALLOC : MP_EV_FREE, MP_ST_TMP, node, bytes);
}

static bool node_reads(const struct mp_node *n, int t, int upto)
{
    for (int j = 0; j < upto; j++)
        if (n->in[j] == t)
            return true;
    return false;
}

/* Forward of block i; kind FE records for backward, FN/FC do not. */
static void fwd_block(struct rp *r, size_t i, enum mp_sched_kind kind)
{
    const struct mp_program *p = r->p;
    const struct mp_block_prog *bp = &p->blocks[i];
    bool grad = kind == MP_SCHED_FE;
    for (size_t k = bp->node0; k < bp->node0 + bp->n_nodes; k++) {
        const struct mp_node *n = &p->nodes[k];
        for (int j = 0; j < 3; j++)
            if (n->in[j] >= 0 && !node_reads(n, n->in[j], j))
                r->uses[n->in[j]]++;
        if (n->keep >= 0)
            r->uses[n->keep]++;
    }
    for (size_t k = bp->node0; k < bp->node0 + bp->n_nodes && r->st == MP_OK; k++) {
        const struct mp_node *n = &p->nodes[k];
        r->node = (int)k;
        if (n->out != n->in[0])
            t_alloc(r, n->out);
        for (int j = 0; j < n->n_extra; j++)
            t_alloc(r, n->extra[j]);
        tmp(r, (int)k, n->fwd_tmp_bytes, true);
        emit_fwd(r, (int)k, grad);
        tmp(r, (int)k, n->fwd_tmp_bytes, false);
        if (grad)
            for (int j = 0; j < n->n_saved; j++)
                r->saved[n->saved[j]]++;
        if (k + 1 == bp->node0 + bp->n_nodes)
            r->holds[bp->output]++; /* the chain holds x_{i+1} before anything can free it */
        for (int j = 0; j < 3; j++)
            if (n->in[j] >= 0 && !node_reads(n, n->in[j], j)) {
                r->uses[n->in[j]]--;
                t_maybe_free(r, n->in[j]);
            }
        if (n->keep >= 0) {
            r->uses[n->keep]--;
            t_maybe_free(r, n->keep);
        }
        for (int j = 0; j < n->n_extra; j++)
            t_maybe_free(r, n->extra[j]);
        t_maybe_free(r, n->out);
    }
    if (bp->n_nodes == 0)
        r->holds[bp->output]++;
    r->node = -1;
    /* The chain's hold on x_i: Fc keeps it until B_i (a checkpoint); Fn and a
     * plain Fe release it (autograd keeps x_i only if a node saved it); an Fe
     * that recomputes a checkpointed block leaves it for B_i. */
    if (kind == MP_SCHED_FC) {
        r->ckpt[i] = true;
    } else if (!r->ckpt[i] && r->holds[bp->input] > 0) {
        r->holds[bp->input]--;
        t_maybe_free(r, bp->input);
    }
}

static void bwd_block(struct rp *r, size_t i)
{
    const struct mp_program *p = r->p;
    const struct mp_block_prog *bp = &p->blocks[i];
    for (size_t kk = bp->n_nodes; kk-- > 0 && r->st == MP_OK;) {
        size_t k = bp->node0 + kk;
        const struct mp_node *n = &p->nodes[k];
        r->node = (int)k;
        uint64_t incoming = 0; /* accumulation: the node's new weight gradients, added in place */
        for (int j = 0; j < 2; j++) {
            int q = n->param[j];
            if (q >= 0 && !r->pglive[q]) {
                r->pglive[q] = true;
                emit(r, MP_EV_ALLOC, MP_ST_PGRAD, q, p->params[q].elems * mp_dtype_size(p->param_dtype));
            } else if (q >= 0 && r->t->accumulate) {
                incoming += p->params[q].elems * mp_dtype_size(p->param_dtype);
            }
        }
        if (n->grad_in)
            for (int j = 0; j < 3; j++)
                g_alloc(r, n->in[j]);
        uint64_t btmp = n->bwd_tmp_bytes + incoming;
        tmp(r, (int)k, btmp, true);
        if (r->st == MP_OK) {
            struct mp_event ev = {.kind = MP_EV_BWD, .store = MP_ST_TMP, .id = (int)k, .node = (int)k,
                                  .phase = r->phase};
            r->st = r->fn(r->ctx, &ev);
        }
        tmp(r, (int)k, btmp, false);
        for (int j = 0; j < n->n_saved; j++) {
            int t = n->saved[j];
            if (r->saved[t] > 0)
                r->saved[t]--;
            t_maybe_free(r, t);
        }
        if (!node_reads(n, n->out, 3))
            g_free(r, n->out);
    }
    r->node = -1;
    g_free(r, bp->output);
    /* A hold left on x_{i+1} comes from recomputing block i (B_{i+1} already ran):
     * B_i consumes that recomputed output (rotor: B_i frees xb_{i+1}). */
    while (r->holds[bp->output] > 0 && bp->output != bp->input) {
        r->holds[bp->output]--;
        t_maybe_free(r, bp->output);
    }
    if (r->ckpt[i] && r->holds[bp->input] > 0) {
        r->ckpt[i] = false;
        r->holds[bp->input]--;
        t_maybe_free(r, bp->input);
    }
}

static void loss_op(struct rp *r)
{
    const struct mp_program *p = r->p;
    int out = p->blocks[p->n_blocks - 1].output;
    r->phase = MP_PH_LOSS;
    if (r->st == MP_OK) {
        g_alloc(r, out);
        struct mp_event ev = {.kind = MP_EV_LOSS_GRAD, .store = MP_ST_GRAD, .id = out, .node = -1,
                              .phase = r->phase};
        r->st = r->fn(r->ctx, &ev);
    }
    /* the loss frees a plain x_L (checkpointing.md §8): nothing saved holds it */
    if (r->holds[out] > 0 && r->saved[out] == 0) {
        r->holds[out]--;
        t_maybe_free(r, out);
    }
}

enum mp_status mp_replay(const struct mp_program *p, const struct mp_schedule *sched, const struct mp_train_opts *t,
                         mp_event_fn fn, void *ctx, struct mp_diag *d)
{
    struct rp r = {.p = p, .t = t, .fn = fn, .ctx = ctx, .d = d, .st = MP_OK, .node = -1};
    size_t nt = p->n_tensors ? p->n_tensors : 1;
    r.live = calloc(nt, sizeof(bool));
    r.glive = calloc(nt, sizeof(bool));
    r.is_input = calloc(nt, sizeof(bool));
    r.pglive = calloc(p->n_params ? p->n_params : 1, sizeof(bool));
    r.uses = calloc(nt, sizeof(int));
    r.saved = calloc(nt, sizeof(int));
    r.holds = calloc(nt, sizeof(int));
    r.ckpt = calloc(p->n_blocks ? p->n_blocks : 1, sizeof(bool));
    struct mp_schedule none;
    mp_schedule_init(&none);
    enum mp_status st = MP_OK;
    if (!r.live || !r.glive || !r.is_input || !r.pglive || !r.uses || !r.saved || !r.holds || !r.ckpt) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory replaying the training step");
        goto out;
    }
    if (!sched) {
        st = mp_ckpt_schedule_none(p->n_blocks, &none);
        if (st != MP_OK) {
            mp_fail(d, st, "out of memory building the schedule");
            goto out;
        }
        sched = &none;
    }

    /* setup: parameters, optimizer state, workspace, the batch */
    r.phase = MP_PH_SETUP;
    for (size_t q = 0; q < p->n_params; q++)
        emit(&r, MP_EV_ALLOC, MP_ST_PARAM, (int)q, p->params[q].elems * mp_dtype_size(p->param_dtype));
    for (size_t q = 0; q < p->n_params; q++) {
        uint64_t b = mp_opt_state_bytes(p, t->optimizer, &p->params[q]);
        if (b)
            emit(&r, MP_EV_ALLOC, MP_ST_OPT_STATE, (int)q, b);
    }
    if (t->cublas_workspace_bytes)
        emit(&r, MP_EV_ALLOC, MP_ST_WORKSPACE, 0, t->cublas_workspace_bytes);
    if (t->accumulate) /* gradients left by the previous micro-steps */
        for (size_t q = 0; q < p->n_params; q++) {
            r.pglive[q] = true;
            emit(&r, MP_EV_ALLOC, MP_ST_PGRAD, (int)q, p->params[q].elems * mp_dtype_size(p->param_dtype));
        }
    r.is_input[p->input] = true;
    r.live[p->input] = true;
    emit(&r, MP_EV_ALLOC, MP_ST_INPUT, p->input, p->tensors[p->input].bytes);
    if (p->labels >= 0) {
        r.is_input[p->labels] = true;
        r.live[p->labels] = true;
        emit(&r, MP_EV_ALLOC, MP_ST_INPUT, p->labels, p->tensors[p->labels].bytes);
    }

    bool after_loss = false;
    for (size_t k = 0; k < sched->n && r.st == MP_OK; k++) {
        const struct mp_sched_op *op = &sched->ops[k];
        if (op->kind != MP_SCHED_LOSS && op->index >= p->n_blocks)
            MP_BUG("schedule op index %u out of range", op->index);
        emit(&r, MP_EV_OP_BEGIN, MP_ST_TMP, (int)k, 0);
        switch (op->kind) {
        case MP_SCHED_FN:
        case MP_SCHED_FC:
        case MP_SCHED_FE:
            r.phase = after_loss ? MP_PH_RECOMPUTE : MP_PH_FORWARD;
            fwd_block(&r, op->index, op->kind);
            break;
        case MP_SCHED_LOSS:
            loss_op(&r);
            after_loss = true;
            break;
        case MP_SCHED_B:
            r.phase = MP_PH_BACKWARD;
            bwd_block(&r, op->index);
            break;
        }
        emit(&r, MP_EV_OP_END, MP_ST_TMP, (int)k, 0);
    }
    /* optimizer step, then zero_grad(set_to_none=True) */
    /* The step's temporaries are per-parameter tensors (foreach ops return one
     * output per input), all alive together for Adam's _foreach_sqrt; Adafactor's
     * is one tensor the size of the largest parameter (id 0). */
    r.phase = MP_PH_STEP;
    bool per_param = t->optimizer == MP_OPT_ADAM || t->optimizer == MP_OPT_ADAMW;
    uint64_t ps = mp_dtype_size(p->param_dtype);
    uint64_t otmp = mp_opt_step_tmp_bytes(p, t->optimizer);
    if (per_param)
        for (size_t q = 0; q < p->n_params; q++)
            emit(&r, MP_EV_ALLOC, MP_ST_OPT_TMP, (int)q, p->params[q].elems * ps);
    else if (otmp)
        emit(&r, MP_EV_ALLOC, MP_ST_OPT_TMP, 0, otmp);
    if (r.st == MP_OK) {
        struct mp_event ev = {.kind = MP_EV_OPT_STEP, .store = MP_ST_OPT_TMP, .node = -1, .phase = r.phase};
        r.st = fn(ctx, &ev);
    }
    if (per_param)
        for (size_t q = 0; q < p->n_params; q++)
            emit(&r, MP_EV_FREE, MP_ST_OPT_TMP, (int)q, p->params[q].elems * ps);
    else if (otmp)
        emit(&r, MP_EV_FREE, MP_ST_OPT_TMP, 0, otmp);
    r.phase = MP_PH_END;
    for (size_t q = 0; q < p->n_params; q++)
        if (r.pglive[q])
            emit(&r, MP_EV_FREE, MP_ST_PGRAD, (int)q, p->params[q].elems * mp_dtype_size(p->param_dtype));
    /* Anything still live is a bookkeeping bug; release it so visitors stay balanced. */
    for (size_t i = 0; i < p->n_tensors && r.st == MP_OK; i++) {
        if (r.glive[i])
            g_free(&r, (int)i);
        if (r.live[i] && !r.is_input[i]) {
            r.live[i] = false;
            emit(&r, MP_EV_FREE, MP_ST_ACT, (int)i, p->tensors[i].bytes);
        }
    }
    st = r.st;
out:
    mp_schedule_release(&none);
    free(r.live);
    free(r.glive);
    free(r.is_input);
    free(r.pglive);
    free(r.uses);
    free(r.saved);
    free(r.holds);
    free(r.ckpt);
    return st;
}

/* ---- caching-allocator model (memory-facts §7) --------------------------------------------- */

/* Blocks of a segment form a doubly linked list in address order, so a freed
 * block merges with free neighbours as in CUDACachingAllocator; free blocks
 * are also kept in an unordered array for the best-fit search. */
struct ablk {
    uint64_t size;
    int prev, next;  /* neighbours in the segment, -1 at the ends */
    int free_pos;    /* index in free[], -1 when allocated */
    bool small;      /* small pool (<= 1 MiB requests, 2 MiB segments) */
};

struct alloc_sim {
    struct ablk *b;
    int n, cap;
    int *dead;       /* recycled entries */
    int n_dead, cap_dead;
    int *freel;      /* free blocks */
    int n_free, cap_free;
    uint64_t reserved, peak_reserved;
    bool nomem;
};

static uint64_t seg_size(uint64_t rs)
{
    if (rs <= (1u << 20))
        return 2u << 20;               /* kSmallBuffer */
    if (rs < (10u << 20))
        return 20u << 20;              /* kLargeBuffer */
    return mp_ceil_div(rs, 2u << 20) * (2u << 20); /* kRoundLarge */
}

static bool push_int(int **arr, int *n, int *cap, int v)
{
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 256;
        int *na = realloc(*arr, (size_t)nc * sizeof *na);
        if (!na)
            return false;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = v;
    return true;
}

static int new_blk(struct alloc_sim *a)
{
    if (a->n_dead)
        return a->dead[--a->n_dead];
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 256;
        struct ablk *nb = realloc(a->b, (size_t)nc * sizeof *nb);
        if (!nb) {
            a->nomem = true;
            return -1;
        }
        a->b = nb;
        a->cap = nc;
    }
    return a->n++;
}

static void free_list_add(struct alloc_sim *a, int i)
{
    a->b[i].free_pos = a->n_free;
    if (!push_int(&a->freel, &a->n_free, &a->cap_free, i))
        a->nomem = true;
}

static void free_list_del(struct alloc_sim *a, int i)
{
    int pos = a->b[i].free_pos, last = a->freel[--a->n_free];
    a->freel[pos] = last;
    a->b[last].free_pos = pos;
    a->b[i].free_pos = -1;
}

/* Best fit among free blocks of the same pool; split when the remainder is
 * >= 512 (small pool) or > 1 MiB (large pool); else a new segment.  Returns
 * the block, or -1 if the model itself ran out of memory. */
static int asim_alloc(struct alloc_sim *a, uint64_t bytes)
{
    uint64_t rs = mp_round512(bytes);
    bool small = rs <= (1u << 20);
    int best = -1;
    for (int k = 0; k < a->n_free; k++) {
        int i = a->freel[k];
        if (a->b[i].small != small || a->b[i].size < rs)
            continue;
        if (best < 0 || a->b[i].size < a->b[best].size)
            best = i;
    }
    if (best < 0) {
        best = new_blk(a);
        if (best < 0)
            return -1;
        uint64_t ss = seg_size(rs);
        a->b[best] = (struct ablk){.size = ss, .prev = -1, .next = -1, .free_pos = -1, .small = small};
        free_list_add(a, best);
        a->reserved += ss;
        if (a->reserved > a->peak_reserved)
            a->peak_reserved = a->reserved;
    }
    uint64_t rem = a->b[best].size - rs;
    if (small ? rem >= 512 : rem > (1u << 20)) {
        int r = new_blk(a);
        if (r < 0)
            return -1;
        a->b[r] = (struct ablk){.size = rem, .prev = best, .next = a->b[best].next, .free_pos = -1, .small = small};
        if (a->b[best].next >= 0)
            a->b[a->b[best].next].prev = r;
        a->b[best].next = r;
        a->b[best].size = rs;
        free_list_add(a, r);
    }
    free_list_del(a, best);
    return a->nomem ? -1 : best;
}

static void asim_merge(struct alloc_sim *a, int i, int j) /* j follows i; both free; j is absorbed */
{
    free_list_del(a, j);
    a->b[i].size += a->b[j].size;
    a->b[i].next = a->b[j].next;
    if (a->b[j].next >= 0)
        a->b[a->b[j].next].prev = i;
    if (!push_int(&a->dead, &a->n_dead, &a->cap_dead, j))
        a->nomem = true;
}

static void asim_free(struct alloc_sim *a, int i)
{
    free_list_add(a, i);
    int nx = a->b[i].next, pv = a->b[i].prev;
    if (nx >= 0 && a->b[nx].free_pos >= 0)
        asim_merge(a, i, nx);
    if (pv >= 0 && a->b[pv].free_pos >= 0)
        asim_merge(a, pv, i);
}

static void asim_release(struct alloc_sim *a)
{
    free(a->b);
    free(a->dead);
    free(a->freel);
}

/* ---- the estimator's visitor --------------------------------------------------------------- */

struct counter {
    const struct mp_program *p;
    uint64_t cur, cur_req, peak, peak_req;
    enum mp_phase peak_phase;
    int peak_node;
    enum mp_store peak_store;
    uint64_t act_at_loss;
    bool have_loss;
    uint64_t act_cur; /* ACT + GRAD + TMP */
    struct alloc_sim as;
    size_t *blk_of;   /* allocation key -> asim block */
    size_t nkeys;
    bool warm;        /* second step: persistent storages keep their blocks */
    bool no_asim;     /* program too large for the allocator model: reserved = allocated */
};

static size_t key_of(const struct mp_program *p, const struct mp_event *ev)
{
    /* distinct slots per store kind */
    size_t nt = p->n_tensors, np = p->n_params, nn = p->n_nodes;
    switch (ev->store) {
    case MP_ST_PARAM: return (size_t)ev->id;
    case MP_ST_OPT_STATE: return np + (size_t)ev->id;
    case MP_ST_PGRAD: return 2 * np + (size_t)ev->id;
    case MP_ST_OPT_TMP: return 3 * np + (size_t)ev->id;
    case MP_ST_WORKSPACE: return 4 * np + 1;
    case MP_ST_INPUT:
    case MP_ST_ACT: return 4 * np + 2 + (size_t)ev->id;
    case MP_ST_GRAD: return 4 * np + 2 + nt + (size_t)ev->id;
    case MP_ST_TMP: return 4 * np + 2 + 2 * nt + (size_t)ev->id;
    }
    (void)nn;
    return 0;
}

static enum mp_status count_event(void *ctx, const struct mp_event *ev)
{
    struct counter *c = ctx;
    if (ev->kind == MP_EV_LOSS_GRAD && !c->have_loss) {
        c->have_loss = true;
        c->act_at_loss = c->act_cur;
    }
    if (ev->kind != MP_EV_ALLOC && ev->kind != MP_EV_FREE)
        return MP_OK;
    uint64_t r = mp_round512(ev->bytes);
    bool act = ev->store == MP_ST_ACT || ev->store == MP_ST_GRAD || ev->store == MP_ST_TMP;
    size_t key = key_of(c->p, ev);
    if (ev->kind == MP_EV_ALLOC) {
        c->cur += r;
        c->cur_req += ev->bytes;
        if (act)
            c->act_cur += r;
        if (c->cur > c->peak) {
            c->peak = c->cur;
            c->peak_phase = ev->phase;
            c->peak_node = ev->node;
            c->peak_store = ev->store;
        }
        if (c->cur_req > c->peak_req)
            c->peak_req = c->cur_req;
        if (ev->bytes && key < c->nkeys && !c->no_asim && !(c->warm && ev->phase == MP_PH_SETUP)) {
            int b = asim_alloc(&c->as, ev->bytes);
            if (b < 0)
                return MP_ERR_NOMEM;
            c->blk_of[key] = (size_t)b + 1;
        }
    } else {
        c->cur -= r;
        c->cur_req -= ev->bytes;
        if (act)
            c->act_cur -= r;
        if (ev->bytes && key < c->nkeys && c->blk_of[key]) {
            asim_free(&c->as, (int)c->blk_of[key] - 1);
            c->blk_of[key] = 0;
        }
    }
    return MP_OK;
}

void mp_estimate_release(struct mp_estimate *e)
{
    if (!e)
        return;
    free(e->blocks);
    e->blocks = NULL;
}

enum mp_status mp_estimate_run(const struct mp_program *p, const struct mp_schedule *sched,
                               const struct mp_train_opts *t, uint64_t context_bytes, struct mp_estimate *e,
                               struct mp_diag *d)
{
    memset(e, 0, sizeof *e);
    e->params = p->total_params;
    e->trainable_params = p->trainable_params;
    uint64_t ps = mp_dtype_size(p->param_dtype);
    for (size_t q = 0; q < p->n_params; q++) {
        e->weights_bytes += p->params[q].elems * ps;
        e->optimizer_bytes += mp_opt_state_bytes(p, t->optimizer, &p->params[q]);
    }
    e->grads_bytes = e->weights_bytes;
    e->input_bytes = p->tensors[p->input].bytes + (p->labels >= 0 ? p->tensors[p->labels].bytes : 0);
    e->workspace_bytes = t->cublas_workspace_bytes;
    e->optimizer_tmp_bytes = mp_opt_step_tmp_bytes(p, t->optimizer);
    e->fwd_flops = p->fwd_flops;
    e->bwd_flops = p->bwd_flops;

    /* The allocator model scans free blocks per allocation; beyond this many nodes
     * (thousands of layers) it would dominate the run, so reserved falls back to the
     * allocated peak (fit decisions never use it). */
    struct counter c = {.p = p, .peak_node = -1, .no_asim = p->n_nodes > MP_ASIM_MAX_NODES};
    c.nkeys = 4 * p->n_params + 2 + 2 * p->n_tensors + p->n_nodes + 1;
    c.blk_of = calloc(c.nkeys, sizeof *c.blk_of);
    if (!c.blk_of)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    /* Two steps: the caching allocator reaches its steady state in the second. */
    enum mp_status st = MP_OK;
    for (int step = 0; step < (c.no_asim ? 1 : 2) && st == MP_OK; step++) {
        c.have_loss = false;
        st = mp_replay(p, sched, t, count_event, &c, d);
        if (st == MP_OK && step == 0) {
            c.cur = c.cur_req = c.act_cur = 0;
            c.warm = true; /* persistent storages (setup) keep their blocks; anything else
                            * still held would be a replay bug and is released */
            for (size_t k = 0; k < c.nkeys; k++)
                if (c.blk_of[k] && k >= 3 * p->n_params && k != 4 * p->n_params + 1 &&
                    !(k >= 4 * p->n_params + 2 && ((int)(k - 4 * p->n_params - 2) == p->input ||
                                                   (int)(k - 4 * p->n_params - 2) == p->labels))) {
                    asim_free(&c.as, (int)c.blk_of[k] - 1);
                    c.blk_of[k] = 0;
                }
        }
    }
    free(c.blk_of);
    asim_release(&c.as);
    if (st != MP_OK)
        return st == MP_ERR_NOMEM ? mp_fail(d, st, "out of memory") : st;
    e->peak_allocated_bytes = c.peak;
    e->peak_requested_bytes = c.peak_req;
    e->peak_reserved_bytes = mp_max_u64(c.as.peak_reserved, c.peak);
    e->activations_bytes = c.act_at_loss;
    e->overhead_bytes = context_bytes;
    /* What the GPU must have: the allocated peak plus the context.  Reserved can be
     * higher (cached blocks of other sizes), but on a failed cudaMalloc the caching
     * allocator frees its cached blocks and retries, so the cache does not decide
     * whether a step fits; fragmentation is left to the safety margin. */
    e->peak_device_bytes = e->peak_allocated_bytes + context_bytes;
    e->peak_phase = c.peak_phase;
    e->static_bytes = e->weights_bytes + e->optimizer_bytes + e->workspace_bytes + e->input_bytes;
    if (c.peak_node >= 0)
        snprintf(e->peak_event, sizeof e->peak_event, "%s:%s", mp_phase_str(c.peak_phase),
                 p->nodes[c.peak_node].name);
    else
        snprintf(e->peak_event, sizeof e->peak_event, "%s", mp_phase_str(c.peak_phase));

    /* per block */
    e->n_blocks = p->n_blocks;
    e->blocks = calloc(p->n_blocks ? p->n_blocks : 1, sizeof *e->blocks);
    if (!e->blocks)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    struct mp_chain ch;
    st = mp_estimate_chain(p, &ch, d);
    if (st != MP_OK)
        return st;
    for (size_t i = 0; i < p->n_blocks; i++) {
        struct mp_block_est *b = &e->blocks[i];
        const struct mp_block_prog *bp = &p->blocks[i];
        b->params = bp->params;
        for (size_t q = bp->param0; q < bp->param0 + bp->n_params; q++) {
            b->weights_bytes += p->params[q].elems * ps;
            b->optimizer_bytes += mp_opt_state_bytes(p, t->optimizer, &p->params[q]);
        }
        b->grads_bytes = b->weights_bytes;
        b->activation_bytes = ch.xb[i + 1];
        b->output_bytes = p->tensors[bp->output].bytes;
        b->fwd_flops = bp->fwd_flops;
        b->bwd_flops = bp->bwd_flops;
    }
    /* recompute FLOPs: forwards the schedule runs beyond one per block */
    if (sched) {
        size_t *runs = calloc(p->n_blocks ? p->n_blocks : 1, sizeof *runs);
        if (!runs) {
            mp_chain_release(&ch);
            return mp_fail(d, MP_ERR_NOMEM, "out of memory");
        }
        for (size_t k = 0; k < sched->n; k++) {
            const struct mp_sched_op *op = &sched->ops[k];
            if (op->kind == MP_SCHED_FN || op->kind == MP_SCHED_FC || op->kind == MP_SCHED_FE) {
                if (runs[op->index]++ > 0)
                    e->recompute_flops += p->blocks[op->index].fwd_flops;
                else if (op->kind != MP_SCHED_FE)
                    e->blocks[op->index].checkpointed = true;
            }
        }
        free(runs);
    }
    mp_chain_release(&ch);
    return MP_OK;
}

/* ---- the chain for the checkpoint planner ----------------------------------------------------- */

struct chain_meter {
    uint64_t cur, peak;       /* activation bytes only (ACT, GRAD, TMP), unrounded */
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
        m->cur += ev->bytes;
        if (m->cur > m->peak)
            m->peak = m->cur;
    } else {
        m->cur -= ev->bytes;
    }
    return MP_OK;
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
    if (st != MP_OK)
        goto out;
    for (size_t i = 0; i <= L; i++)
        c->x[i] = i < L ? p->tensors[p->blocks[i].input].bytes : p->tensors[p->blocks[L - 1].output].bytes;
    c->x[0] += p->labels >= 0 ? p->tensors[p->labels].bytes : 0;
    for (size_t i = 0; i < L; i++)
        c->repeated[i] = p->model->blocks[i].repeat_group > 0;
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
        uint64_t base = m.begin[bpos] + yi;
        c->bt[i] = m.peak_in[bpos] > base ? m.peak_in[bpos] - base : 0;
    }
    c->b[L] = 0;
    {
        uint64_t base = m.begin[L] + c->x[L];
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
